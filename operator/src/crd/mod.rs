//! The four Kortex custom resources (`kortex.dev/v1alpha1`) and what they share:
//! Secret references, header specs and the condition helpers.
//!
//! The Rust types are the single source of truth: the CRD YAML in `crds/` is generated
//! from them (`kortex crds`), and the same types parse manifests in standalone mode.

pub mod conditions;
mod policy;
mod proposal;
mod provider;
mod tool;

pub use policy::*;
pub use proposal::*;
pub use provider::*;
pub use tool::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every Kortex kind.
pub const GROUP: &str = "kortex.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "kortex.dev/v1alpha1";

/// A key of a `v1/Secret` in the object's own namespace.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret, in the same namespace as the referring object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's `data` or `stringData`.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// An extra HTTP header: a literal `value`, or one read from a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.value) != has(self.valueFrom)",
    "message": "exactly one of value or valueFrom must be set"
}]))]
pub struct HeaderSpec {
    /// Header name, e.g. `OpenAI-Organization`.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    )]
    pub name: String,
    /// Literal header value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub value: Option<String>,
    /// Header value taken from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<HeaderValueFrom>,
}

/// Where a header value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValueFrom {
    /// The Secret key holding the value.
    pub secret_key_ref: SecretKeyRef,
}

/// Every Kortex CRD, sorted by name (the order of `kortex crds` and of the files in `crds/`).
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        ActionProposal::crd(),
        ChatPolicy::crd(),
        KortexTool::crd(),
        LLMProvider::crd(),
    ];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                strip_unrecognized_formats(schema);
            }
        }
    }
    crds
}

/// String formats the API server validates (Kubernetes 1.30; its spelling without dashes).
const STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// Whether the API server recognizes `format` on a schema of `type_` (anything else earns
/// a `Warning: unrecognized format "uint32"` on every apply of the CRD).
fn format_recognized(type_: Option<&str>, format: &str) -> bool {
    match type_ {
        None | Some("string") => STRING_FORMATS.contains(&format.replace('-', "").as_str()),
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        Some(_) => false,
    }
}

/// Drops the formats schemars writes for Rust types (`uint8`, `uint32`, `uint64`) that the
/// API server does not know; their bounds (`minimum`, `maximum`) stay.
fn strip_unrecognized_formats(schema: &mut JSONSchemaProps) {
    if schema
        .format
        .as_deref()
        .is_some_and(|f| !format_recognized(schema.type_.as_deref(), f))
    {
        schema.format = None;
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        strip_unrecognized_formats(child);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(s)) => strip_unrecognized_formats(s),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => {
            list.iter_mut().for_each(strip_unrecognized_formats)
        }
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(s)) = schema.additional_properties.as_mut() {
        strip_unrecognized_formats(s);
    }
    for list in [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of] {
        list.iter_mut()
            .flatten()
            .for_each(strip_unrecognized_formats);
    }
}

/// The first line of every file in `crds/`.
pub const CRD_FILE_HEADER: &str = "# Generated by `kortex crds`; do not edit. Regenerate: KORTEX_UPDATE_CRDS=1 cargo test -p kortex crds_folder\n";

/// The CRDs as one multi-document YAML stream, with a header saying where it came from.
pub fn crds_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// File name in `crds/` for a CRD, e.g. `llmproviders.kortex.dev.yaml`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// Schema for free-form JSON fields (`parameters`, `params`, `preview`): any object,
/// kept as-is by the API server.
pub(crate) fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema for `metav1.Condition` lists: a map keyed by `type`, as Kubernetes declares them.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema =
        <Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>::json_schema(generator);
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-kubernetes-list-type".into(), "map".into());
        obj.insert(
            "x-kubernetes-list-map-keys".into(),
            serde_json::json!(["type"]),
        );
    }
    schema
}

/// A command-line or environment interval (`30s`, `5m`, `1h30m`): not negative, at least a
/// second. The one parser of durations given to the binary (flags of `kortex serve`/`run`,
/// `kortex eval`, the HTTP limits).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d: kube::core::Duration = s
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 30s or 5m: {e}"))?;
    if d.is_negative() {
        return Err("the interval must not be negative".into());
    }
    Ok(std::time::Duration::from(d).max(std::time::Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a validation refused, or nothing when it passed.
    fn refusal<T, E: std::fmt::Display>(result: Result<T, E>) -> String {
        result.err().map(|e| e.to_string()).unwrap_or_default()
    }

    fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The CEL rules, evaluated client-side with kube's CEL interpreter against the generated
    /// schema (the e2e suite checks the same on a real API server).
    #[test]
    fn cel_rules_enforce_one_of_and_immutability() {
        use kube::core::cel::{validate_cel, validate_cel_update};
        let tool = |spec: serde_json::Value| -> KortexTool {
            parse(
                serde_json::json!({"apiVersion": API_VERSION, "kind": "KortexTool", "metadata": {"name": "t"}, "spec": spec}),
            )
        };
        let both = tool(
            serde_json::json!({"http": {"url": "http://a/x"}, "mcp": {"url": "http://m/mcp"}}),
        );
        let err = refusal(validate_cel(&both));
        assert!(
            err.contains("exactly one of spec.http or spec.mcp must be set"),
            "{err}"
        );
        assert!(validate_cel(&tool(serde_json::json!({}))).is_err());
        assert!(validate_cel(&tool(serde_json::json!({"mcp": {"url": "http://m/mcp"}}))).is_ok());
        let err = refusal(validate_cel(&tool(
            serde_json::json!({"name": "a__b", "mcp": {"url": "http://m/mcp"}}),
        )));
        assert!(err.contains("may not contain '__'"), "{err}");
        let api_key = tool(
            serde_json::json!({"http": {"url": "http://a/x", "auth": {"type": "apiKey", "secretRef": {"name": "s", "key": "k"}}}}),
        );
        assert!(validate_cel(&api_key).is_err(), "apiKey needs a header");

        let proposal = |spec: serde_json::Value| -> ActionProposal {
            parse(
                serde_json::json!({"apiVersion": API_VERSION, "kind": "ActionProposal", "metadata": {"name": "p"}, "spec": spec}),
            )
        };
        let base = serde_json::json!({"action": "scale", "rationale": "r", "params": {"replicas": 3},
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "session": {"id": "s", "name": "incident-1", "user": "alice"}});
        let old = proposal(base.clone());
        assert!(validate_cel(&old).is_ok());
        let mut changed = base.clone();
        changed["action"] = "restart".into();
        let err = refusal(validate_cel_update(&proposal(changed), &old));
        assert!(
            err.contains("spec is immutable except spec.decision"),
            "{err}"
        );
        let mut retarget = base.clone();
        retarget["target"]["name"] = "db".into();
        assert!(validate_cel_update(&proposal(retarget), &old).is_err());
        let mut rescale = base.clone();
        rescale["params"]["replicas"] = 300.into();
        assert!(
            validate_cel_update(&proposal(rescale), &old).is_err(),
            "params are immutable too"
        );
        let mut decided = base.clone();
        decided["decision"] = serde_json::json!({"verdict": "Approve", "by": "bob"});
        let decided = proposal(decided);
        assert!(
            validate_cel_update(&decided, &old).is_ok(),
            "a first decision is allowed"
        );
        let mut flipped = base.clone();
        flipped["decision"] = serde_json::json!({"verdict": "Reject", "by": "bob"});
        let err = refusal(validate_cel_update(&proposal(flipped), &decided));
        assert!(err.contains("spec.decision is final once set"), "{err}");
        assert!(
            validate_cel_update(&old, &decided).is_err(),
            "a decision cannot be removed"
        );
    }

    /// Keeps only the properties `schema` requires, recursively: the smallest object a
    /// person may write.
    fn required_only(schema: &serde_json::Value, value: &serde_json::Value) -> serde_json::Value {
        match (value, schema.get("properties")) {
            (serde_json::Value::Object(map), Some(props)) => {
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str())
                    .collect();
                map.iter()
                    .filter(|(k, _)| {
                        required.contains(&k.as_str())
                            || matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                    })
                    .map(|(k, v)| (k.clone(), required_only(&props[k.as_str()], v)))
                    .collect()
            }
            (serde_json::Value::Array(items), _) if schema.get("items").is_some() => items
                .iter()
                .map(|i| required_only(&schema["items"], i))
                .collect(),
            _ => value.clone(),
        }
    }

    /// Sets every `nullable` property to null, recursively: what the API server stores when
    /// a client writes `field: null` (kept for nullable fields, pruned for others).
    fn nulled(schema: &serde_json::Value, value: &serde_json::Value) -> serde_json::Value {
        match (value, schema.get("properties")) {
            (serde_json::Value::Object(map), Some(props)) => {
                let mut out = serde_json::Map::new();
                for (k, s) in props.as_object().into_iter().flatten() {
                    if s["nullable"] == true && !matches!(k.as_str(), "status") {
                        out.insert(k.clone(), serde_json::Value::Null);
                    } else if let Some(v) = map.get(k) {
                        out.insert(k.clone(), nulled(s, v));
                    }
                }
                for k in ["apiVersion", "kind", "metadata"] {
                    if let Some(v) = map.get(k) {
                        out.insert(k.into(), v.clone());
                    }
                }
                serde_json::Value::Object(out)
            }
            (serde_json::Value::Array(items), _) if schema.get("items").is_some() => {
                items.iter().map(|i| nulled(&schema["items"], i)).collect()
            }
            _ => value.clone(),
        }
    }

    /// Every CEL rule of every CRD evaluates to a verdict, never an error ("no such key"
    /// on an absent optional field fails the write on a real API server), on the shapes a
    /// real API server hands it: the samples as written, with only their required fields,
    /// and with every nullable field null; on create and on every update between them.
    #[test]
    fn cel_rules_evaluate_on_every_shape_an_api_server_stores() {
        use kube_cel::{ErrorKind, Validator};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
        let mut samples: Vec<serde_json::Value> = Vec::new();
        for dir in [root.clone(), root.join("local")] {
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{e}"))
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect();
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}"));
                for doc in text.split("\n---") {
                    let v: serde_json::Value =
                        serde_saphyr::from_str(doc).unwrap_or(serde_json::Value::Null);
                    if v["apiVersion"] == API_VERSION {
                        samples.push(v);
                    }
                }
            }
        }
        samples.push(serde_json::json!({"apiVersion": API_VERSION, "kind": "ActionProposal",
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {"action": "scale", "rationale": "r", "params": {"replicas": 3},
                "blastRadius": "one Deployment", "reversible": true, "model": {"provider": "p", "model": "m"},
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                "session": {"id": "s", "name": "incident-1", "user": "alice"},
                "decision": {"verdict": "Approve", "by": "bob", "groups": ["sre"], "reason": "ok"}}}));
        let validator = Validator::new();
        let mut checked = 0;
        for crd in all_crds() {
            let kind = crd.spec.names.kind.clone();
            let schema = serde_json::to_value(
                crd.spec.versions[0]
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref()),
            )
            .unwrap_or_default();
            let of_kind: Vec<_> = samples.iter().filter(|s| s["kind"] == kind).collect();
            assert!(!of_kind.is_empty(), "no sample of {kind}");
            let shapes: Vec<serde_json::Value> = of_kind
                .iter()
                .flat_map(|s| [(*s).clone(), required_only(&schema, s), nulled(&schema, s)])
                .collect();
            for object in &shapes {
                for old in std::iter::once(None).chain(shapes.iter().map(Some)) {
                    let result = validator.validate(&schema, object, old);
                    for e in result.err().into_iter().flatten() {
                        assert!(
                            e.kind == ErrorKind::ValidationFailure,
                            "{kind}: rule '{}' did not evaluate ({:?}: {}) on\n{object}\nold: {old:?}",
                            e.rule,
                            e.kind,
                            e.message
                        );
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "{checked}");
    }

    /// Every `format` in the CRDs is one the API server recognizes, so applying them prints
    /// no `Warning: unrecognized format` (seen on kube-apiserver 1.36 for `uint32`).
    #[test]
    fn crds_carry_only_formats_the_api_server_recognizes() {
        fn walk(v: &serde_json::Value, path: &str, bad: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(map) => {
                    if let Some(f) = map.get("format").and_then(|f| f.as_str())
                        && !format_recognized(map.get("type").and_then(|t| t.as_str()), f)
                    {
                        bad.push(format!("{path}: {f}"));
                    }
                    for (k, child) in map {
                        walk(child, &format!("{path}.{k}"), bad);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        walk(child, &format!("{path}[{i}]"), bad);
                    }
                }
                _ => {}
            }
        }
        let mut bad = Vec::new();
        for crd in all_crds() {
            let v = serde_json::to_value(&crd.spec).unwrap_or_default();
            walk(&v, &crd.spec.names.kind, &mut bad);
        }
        assert!(bad.is_empty(), "unrecognized formats: {bad:?}");
        assert!(!format_recognized(Some("integer"), "uint32"));
        assert!(format_recognized(Some("string"), "date-time"));
        // Bounds survive: an unsigned field keeps its minimum.
        let policy = all_crds()
            .into_iter()
            .find(|c| c.spec.names.kind == "ChatPolicy")
            .map(|c| serde_json::to_value(c.spec).unwrap_or_default())
            .unwrap_or_default();
        assert!(
            policy.to_string().contains("\"minimum\":0.0")
                || policy.to_string().contains("\"minimum\":0"),
            "minimum kept"
        );
    }

    /// `crds/` must be exactly what the types generate (CI fails on drift). With
    /// `KORTEX_UPDATE_CRDS` it rewrites `crds/` and the Helm chart's copy in
    /// `charts/kortex/crds/` (which the chart tests compare byte for byte).
    #[test]
    fn crds_folder_matches_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kortex/crds");
        let update = std::env::var_os("KORTEX_UPDATE_CRDS").is_some();
        let mut expected_files = Vec::new();
        for crd in all_crds() {
            let yaml = serde_saphyr::to_string(&crd).unwrap_or_else(|e| panic!("render: {e}"));
            let expected = format!("{CRD_FILE_HEADER}---\n{yaml}");
            let path = dir.join(crd_file_name(&crd));
            expected_files.push(crd_file_name(&crd));
            if update {
                for path in [path, chart.join(crd_file_name(&crd))] {
                    std::fs::write(&path, &expected)
                        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
                }
                continue;
            }
            let actual = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                actual == expected,
                "{} is out of date with the Rust types: run `KORTEX_UPDATE_CRDS=1 cargo test -p kortex crds_folder` and commit it",
                path.display()
            );
        }
        let mut present: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f != "kustomization.yaml")
            .collect();
        present.sort();
        assert_eq!(
            present, expected_files,
            "crds/ holds files no type generates"
        );
    }

    #[test]
    fn crds_are_structural_and_complete() {
        for crd in all_crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            assert!(name.ends_with(".kortex.dev"), "{name}");
            assert_eq!(crd.spec.scope, "Namespaced");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name} has a status subresource"
            );
            let columns = version
                .additional_printer_columns
                .as_deref()
                .unwrap_or_default();
            assert!(
                columns.iter().any(|c| c.name == "Age"),
                "{name} has an Age column"
            );
            assert!(
                !crd.spec
                    .names
                    .short_names
                    .clone()
                    .unwrap_or_default()
                    .is_empty(),
                "{name} has a short name"
            );
            // Structural schemas forbid these constructs anywhere.
            let schema = serde_json::to_string(&version.schema).unwrap_or_default();
            for forbidden in ["\"anyOf\":[{\"type\"", "\"$ref\"", "\"oneOf\":[{\"type\""] {
                assert!(
                    !schema.contains(forbidden),
                    "{name} schema contains {forbidden}"
                );
            }
        }
    }
}
