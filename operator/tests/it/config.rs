//! The install manifests in `config/`: every document is a valid object of its kind (read
//! into the Kubernetes types and written back unchanged, so a misspelt or misplaced field
//! is caught), every kustomization lists files that exist, and the RBAC grants what the
//! code calls.

use serde_json::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// `value` read as `T` and written back.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> Value {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
    serde_json::to_value(typed).unwrap_or_default()
}

fn check(value: &Value, file: &Path) {
    use k8s_openapi::api::{
        admissionregistration::v1 as adm, apps::v1 as apps, core::v1 as core, rbac::v1 as rbac,
    };
    let kind = value["kind"].as_str().unwrap_or_default();
    let back = match kind {
        "Namespace" => round_trip::<core::Namespace>(value),
        "ServiceAccount" => round_trip::<core::ServiceAccount>(value),
        "Service" => round_trip::<core::Service>(value),
        "Deployment" => round_trip::<apps::Deployment>(value),
        "ClusterRole" => round_trip::<rbac::ClusterRole>(value),
        "Role" => round_trip::<rbac::Role>(value),
        "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(value),
        "RoleBinding" => round_trip::<rbac::RoleBinding>(value),
        "ValidatingAdmissionPolicy" => round_trip::<adm::ValidatingAdmissionPolicy>(value),
        "ValidatingAdmissionPolicyBinding" => {
            round_trip::<adm::ValidatingAdmissionPolicyBinding>(value)
        }
        other => panic!("{}: unexpected kind {other}", file.display()),
    };
    assert_eq!(
        &back,
        value,
        "{}: {kind} has fields its type does not know",
        file.display()
    );
}

#[test]
fn install_manifests_are_valid_objects_and_kustomizations_complete() {
    let mut seen = 0;
    for dir in [
        "config/default",
        "config/rbac",
        "config/manager",
        "config/admission",
        "crds",
    ] {
        let dir = root().join(dir);
        let kustomization = docs(&dir.join("kustomization.yaml")).remove(0);
        for resource in kustomization["resources"].as_array().into_iter().flatten() {
            let path = dir.join(resource.as_str().unwrap_or_default());
            assert!(
                path.exists(),
                "{} lists {} which does not exist",
                dir.display(),
                path.display()
            );
            if path.is_file() && !path.to_string_lossy().ends_with(".kortex.dev.yaml") {
                for doc in docs(&path) {
                    check(&doc, &path);
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= 12, "{seen} objects");
}

/// Every API call the code makes as Kortex (verb, group, resource) is granted by the
/// ClusterRole or the leader Role.
#[test]
fn rbac_covers_what_kortex_calls() {
    let roles = docs(&root().join("config/rbac/role.yaml"));
    let granted = |verb: &str, group: &str, resource: &str| {
        roles.iter().any(|r| {
            r["rules"].as_array().into_iter().flatten().any(|rule| {
                let has = |k: &str, v: &str| {
                    rule[k]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == v || x == "*"))
                };
                has("verbs", verb) && has("apiGroups", group) && has("resources", resource)
            })
        })
    };
    let calls = [
        // watches and status
        ("list", "kortex.dev", "llmproviders"),
        ("watch", "kortex.dev", "kortextools"),
        ("watch", "kortex.dev", "chatpolicies"),
        ("watch", "kortex.dev", "actionproposals"),
        ("patch", "kortex.dev", "llmproviders/status"),
        ("patch", "kortex.dev", "kortextools/status"),
        ("patch", "kortex.dev", "chatpolicies/status"),
        ("patch", "kortex.dev", "actionproposals/status"),
        ("create", "kortex.dev", "actionproposals"),
        ("patch", "kortex.dev", "actionproposals"),
        ("list", "", "secrets"),
        ("watch", "", "secrets"),
        ("get", "", "secrets"),
        ("create", "events.k8s.io", "events"),
        ("patch", "events.k8s.io", "events"),
        ("get", "coordination.k8s.io", "leases"),
        ("create", "coordination.k8s.io", "leases"),
        ("update", "coordination.k8s.io", "leases"),
        ("create", "authentication.k8s.io", "tokenreviews"),
        ("create", "authorization.k8s.io", "subjectaccessreviews"),
        // executor
        ("get", "apps", "deployments"),
        ("patch", "apps", "deployments"),
        ("update", "apps", "deployments"),
        ("patch", "apps", "statefulsets"),
        ("patch", "apps", "daemonsets"),
        ("patch", "apps", "deployments/scale"),
        ("patch", "apps", "statefulsets/scale"),
        ("list", "apps", "replicasets"),
        ("list", "autoscaling", "horizontalpodautoscalers"),
        // tools
        ("get", "", "pods"),
        ("list", "", "pods"),
        ("get", "", "pods/log"),
        ("list", "", "events"),
        ("list", "events.k8s.io", "events"),
        ("list", "apps", "controllerrevisions"),
    ];
    for (verb, group, resource) in calls {
        assert!(
            granted(verb, group, resource),
            "{verb} {group}/{resource} is not granted"
        );
    }
    // And nothing that would let Kortex escalate.
    for (verb, group, resource) in [
        ("impersonate", "", "users"),
        ("delete", "apps", "deployments"),
        ("update", "", "secrets"),
        ("create", "", "secrets"),
        // nor more than the code uses
        ("update", "apps", "statefulsets"),
        ("update", "apps", "deployments/scale"),
        ("update", "kortex.dev", "llmproviders/status"),
        ("create", "", "events"),
    ] {
        assert!(
            !granted(verb, group, resource),
            "{verb} {group}/{resource} must not be granted"
        );
    }
}
