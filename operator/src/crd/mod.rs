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

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
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

/// Every Kortex CRD, in a stable order (the order of `kortex crds` and of `crds/`).
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        LLMProvider::crd(),
        KortexTool::crd(),
        ChatPolicy::crd(),
        ActionProposal::crd(),
    ]
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
