//! The shipped samples load cleanly and cover every kind and provider type.

use kortex::source::ManifestSource;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load(path: &str) -> kortex::source::Snapshot {
    let mut src = ManifestSource::new(vec![root().join(path)], Box::new(|_| None)).unwrap();
    src.load(jiff::Timestamp::now())
}

#[test]
fn samples_cover_every_kind_and_provider_type() {
    let snap = load("config/samples");
    assert!(
        snap.problems.is_empty(),
        "{:#?}",
        snap.problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    let o = &snap.objects;
    // ActionProposals are created by Kortex only (the admission policy refuses anyone
    // else), so `kubectl apply -f config/samples` must not contain one.
    assert!(!o.tools.is_empty() && !o.policies.is_empty() && o.proposals.is_empty());
    let example = load("docs/examples");
    assert!(example.problems.is_empty() && example.objects.proposals.len() == 1);
    let mut types: Vec<&str> = o
        .providers
        .iter()
        .map(|p| p.spec.provider_type.as_str())
        .collect();
    types.sort_unstable();
    assert_eq!(
        types,
        vec![
            "anthropic",
            "claude-code",
            "ollama",
            "openai",
            "openai-compatible"
        ]
    );
    assert!(
        o.tools.iter().any(|t| t.spec.http.is_some())
            && o.tools.iter().any(|t| t.spec.mcp.is_some())
    );
    let catalog = kortex::catalog::compile(o, jiff::Timestamp::now());
    // One claude-code call is a whole Claude Code loop: its default timeout is ten minutes.
    let claude = catalog
        .providers
        .values()
        .find(|p| p.provider_type() == kortex::crd::ProviderType::ClaudeCode)
        .map(|p| p.timeout());
    assert_eq!(claude, Some(std::time::Duration::from_secs(600)));
    assert!(catalog.tools.values().all(|t| {
        let s = t.object.status.clone().unwrap_or_default();
        kortex::crd::conditions::find(&s.conditions, "Accepted").is_some_and(|c| c.status == "True")
    }));
}

#[test]
fn local_samples_start_without_any_key() {
    let snap = load("config/samples/local");
    assert!(snap.problems.is_empty(), "{:?}", snap.problems);
    let catalog = kortex::catalog::compile(&snap.objects, jiff::Timestamp::now());
    let available: Vec<&str> = catalog
        .providers
        .iter()
        .filter(|(_, p)| p.available)
        .map(|(k, _)| k.name.as_str())
        .collect();
    assert_eq!(
        available,
        vec!["ollama"],
        "keyless providers are unavailable, Ollama needs no key"
    );
    let anthropic = &catalog.providers[&kortex::catalog::ObjectKey::new("default", "anthropic")];
    let msg = anthropic
        .object
        .status
        .clone()
        .unwrap_or_default()
        .conditions[0]
        .message
        .clone();
    assert!(msg.contains("ANTHROPIC_API_KEY is not set"), "{msg}");
    assert!(catalog.policies.values().all(|p| p.available));
    assert!(catalog.match_policy("default", "anything").is_some());
}

/// The CRD's openAPIV3Schema of `kind`, made strict like `kubectl apply --validate=strict`:
/// where a schema lists properties and keeps no unknown fields, other fields are refused.
fn strict_schema(kind: &str) -> serde_json::Value {
    fn tighten(v: &mut serde_json::Value) {
        if let Some(map) = v.as_object_mut() {
            let preserve = map
                .get("x-kubernetes-preserve-unknown-fields")
                .is_some_and(|p| p == true);
            if map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !preserve
            {
                map.insert(
                    "additionalProperties".into(),
                    serde_json::Value::Bool(false),
                );
            }
            // `nullable` is OpenAPI's: null is allowed where it says so.
            if map.get("nullable").is_some_and(|n| n == true)
                && let Some(t) = map.get("type").cloned()
            {
                map.insert("type".into(), serde_json::json!([t, "null"]));
            }
            for child in map.values_mut() {
                tighten(child);
            }
        } else if let Some(items) = v.as_array_mut() {
            for child in items {
                tighten(child);
            }
        }
    }
    let crd = kortex::crd::all_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    let mut schema =
        serde_json::to_value(&crd.spec.versions[0].schema).unwrap_or_default()["openAPIV3Schema"]
            .clone();
    tighten(&mut schema);
    // The API server fills metadata; the samples give a name (and maybe labels).
    schema["properties"]["metadata"] = serde_json::json!({"type": "object"});
    schema["properties"]["apiVersion"] = serde_json::json!({"const": "kortex.dev/v1alpha1"});
    schema["properties"]["kind"] = serde_json::json!({"const": kind});
    schema
}

/// Every custom resource under config/samples (and docs/examples) is valid against its CRD's
/// schema, strictly (no unknown fields), as the API server would judge it at apply time.
#[test]
fn samples_validate_against_the_crd_schemas() {
    let mut seen = 0;
    let mut files = Vec::new();
    for dir in ["config/samples", "config/samples/local", "docs/examples"] {
        for entry in std::fs::read_dir(root().join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    for path in files {
        for doc in crate::support::yaml::docs(&path) {
            let kind = doc["kind"].as_str().unwrap_or_default();
            if doc["apiVersion"] != "kortex.dev/v1alpha1" {
                continue;
            }
            let schema = strict_schema(kind);
            let validator = jsonschema::validator_for(&schema).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&doc)
                .map(|e| format!("{}: {e}", e.instance_path()))
                .collect();
            assert!(errors.is_empty(), "{}: {kind}: {errors:#?}", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 12, "{seen} custom resources");
    // The strict schema does catch a misspelt field.
    let bad = serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": "x"}, "spec": {"type": "ollama", "baseURL": "http://x"}});
    let validator = jsonschema::validator_for(&strict_schema("LLMProvider")).unwrap();
    assert!(!validator.is_valid(&bad));
}
