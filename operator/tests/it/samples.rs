//! The shipped samples load cleanly and cover every kind and provider type.

use kortex::source::ManifestSource;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load(path: &str) -> kortex::source::Snapshot {
    let mut src = ManifestSource::new(vec![root().join(path)], Box::new(|_| None))
        .unwrap_or_else(|e| panic!("{e}"));
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
        vec!["anthropic", "ollama", "openai", "openai-compatible"]
    );
    assert!(
        o.tools.iter().any(|t| t.spec.http.is_some())
            && o.tools.iter().any(|t| t.spec.mcp.is_some())
    );
    let catalog = kortex::catalog::compile(o, jiff::Timestamp::now());
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
