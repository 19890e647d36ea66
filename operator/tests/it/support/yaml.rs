//! Reading Kubernetes manifests in tests: YAML streams into JSON values, and the check that
//! an object is valid for its kind (read into the k8s-openapi type and written back
//! unchanged, so a misspelt or misplaced field is caught). Shared by the `config/` and the
//! Helm chart tests.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents of a YAML stream (split at `---` lines), empty ones left out.
pub fn parse(text: &str, origin: &str) -> Vec<Value> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" || line.starts_with("--- ") {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.iter()
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{origin}: {e}\n{d}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The documents of a YAML file.
pub fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&text, &path.display().to_string())
}

/// `value` read as `T` and written back.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> Value {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
    serde_json::to_value(typed).unwrap_or_default()
}

/// Panics unless `value` is a valid object of a kind Kortex's install uses (`origin` names
/// where it came from in the message).
pub fn check(value: &Value, origin: &str) {
    use k8s_openapi::api::{
        admissionregistration::v1 as adm, apps::v1 as apps, core::v1 as core,
        networking::v1 as net, policy::v1 as policy, rbac::v1 as rbac,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as ext;
    let kind = value["kind"].as_str().unwrap_or_default();
    let back = match kind {
        "Namespace" => round_trip::<core::Namespace>(value),
        "ServiceAccount" => round_trip::<core::ServiceAccount>(value),
        "Service" => round_trip::<core::Service>(value),
        "ConfigMap" => round_trip::<core::ConfigMap>(value),
        "Secret" => round_trip::<core::Secret>(value),
        "PersistentVolumeClaim" => round_trip::<core::PersistentVolumeClaim>(value),
        "Deployment" => round_trip::<apps::Deployment>(value),
        "ClusterRole" => round_trip::<rbac::ClusterRole>(value),
        "Role" => round_trip::<rbac::Role>(value),
        "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(value),
        "RoleBinding" => round_trip::<rbac::RoleBinding>(value),
        "Ingress" => round_trip::<net::Ingress>(value),
        "NetworkPolicy" => round_trip::<net::NetworkPolicy>(value),
        "PodDisruptionBudget" => round_trip::<policy::PodDisruptionBudget>(value),
        "CustomResourceDefinition" => round_trip::<ext::CustomResourceDefinition>(value),
        "ValidatingAdmissionPolicy" => round_trip::<adm::ValidatingAdmissionPolicy>(value),
        "ValidatingAdmissionPolicyBinding" => {
            round_trip::<adm::ValidatingAdmissionPolicyBinding>(value)
        }
        other => panic!("{origin}: unexpected kind {other}"),
    };
    assert_eq!(
        &back, value,
        "{origin}: {kind} has fields its type does not know"
    );
}

/// `kind/name` of an object.
pub fn key(value: &Value) -> String {
    format!(
        "{}/{}",
        value["kind"].as_str().unwrap_or_default(),
        value["metadata"]["name"].as_str().unwrap_or_default()
    )
}
