//! The install manifests in `config/`: every document is a valid object of its kind (read
//! into the Kubernetes types and written back unchanged, so a misspelt or misplaced field
//! is caught), every kustomization lists files that exist, and the RBAC grants what the
//! code calls.

use crate::support::yaml::{check, docs, root};
use serde_json::Value;

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
                    check(&doc, &path.display().to_string());
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= 12, "{seen} objects");
}

/// Every API call the code makes as Kortex (verb, group, resource).
pub const CALLS: &[(&str, &str, &str)] = &[
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
    // the admission guard: is the policy that authenticates decisions enforced?
    ("create", "authentication.k8s.io", "selfsubjectreviews"),
    (
        "list",
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
    ),
    (
        "list",
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
    ),
    ("get", "", "namespaces"),
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

/// What must never be granted: what would let Kortex escalate, and more than the code uses.
pub const FORBIDDEN: &[(&str, &str, &str)] = &[
    ("impersonate", "", "users"),
    ("impersonate", "", "groups"),
    ("impersonate", "", "serviceaccounts"),
    ("delete", "apps", "deployments"),
    ("update", "", "secrets"),
    ("create", "", "secrets"),
    // a token of any ServiceAccount (triggers' runAs gets it per namespace and by name:
    // config/rbac/trigger_runas.yaml)
    ("create", "", "serviceaccounts/token"),
    // nor more than the code uses
    ("update", "apps", "statefulsets"),
    ("update", "apps", "deployments/scale"),
    ("update", "kortex.dev", "llmproviders/status"),
    ("create", "", "events"),
    (
        "update",
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
    ),
    (
        "delete",
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
    ),
];

/// Whether one of `roles` (ClusterRoles or Roles) grants `verb` on `group/resource`.
pub fn granted(roles: &[Value], verb: &str, group: &str, resource: &str) -> bool {
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
}

/// `roles` grant every call in [`CALLS`] and nothing in [`FORBIDDEN`].
pub fn assert_rbac_covers_calls(roles: &[Value], origin: &str) {
    for &(verb, group, resource) in CALLS {
        assert!(
            granted(roles, verb, group, resource),
            "{origin}: {verb} {group}/{resource} is not granted"
        );
    }
    for &(verb, group, resource) in FORBIDDEN {
        assert!(
            !granted(roles, verb, group, resource),
            "{origin}: {verb} {group}/{resource} must not be granted"
        );
    }
}

/// Every API call the code makes as Kortex is granted by the ClusterRole or the leader
/// Role, and nothing that would let it escalate.
#[test]
fn rbac_covers_what_kortex_calls() {
    let roles = docs(&root().join("config/rbac/role.yaml"));
    assert_rbac_covers_calls(&roles, "config/rbac/role.yaml");
}

/// Triggers' runAs: the only grant of `create` on `serviceaccounts/token` is a Role, in one
/// namespace, for named ServiceAccounts, bound to Kortex's ServiceAccount.
#[test]
fn trigger_run_as_tokens_are_granted_per_namespace_and_by_name() {
    let objects = docs(&root().join("config/rbac/trigger_runas.yaml"));
    let role = &objects[0];
    assert_eq!(role["kind"], "Role");
    assert!(role["metadata"]["namespace"].is_string());
    let rules = role["rules"].as_array().cloned().unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        rules[0]["resources"],
        serde_json::json!(["serviceaccounts/token"])
    );
    assert_eq!(rules[0]["verbs"], serde_json::json!(["create"]));
    assert!(
        rules[0]["resourceNames"]
            .as_array()
            .is_some_and(|n| !n.is_empty()),
        "by name only: {rules:?}"
    );
    let binding = &objects[1];
    assert_eq!(binding["kind"], "RoleBinding");
    assert_eq!(
        binding["metadata"]["namespace"],
        role["metadata"]["namespace"]
    );
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0],
        serde_json::json!({"kind": "ServiceAccount", "name": "kortex", "namespace": "kortex"})
    );
}
