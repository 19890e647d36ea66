//! The ValidatingAdmissionPolicy shipped in `config/admission/policy.yaml`, evaluated with
//! the Kubernetes CEL libraries (kube-cel) the way the API server evaluates it: variables
//! in order, then every validation; a request is denied when any validation is false.
//! (The e2e suite checks the same rules against a real API server.)

use kube_cel::KubeCelExt;
use kube_cel::cel::{self, Context, Program, Value as CelValue};
use serde_json::{Value, json};
use std::collections::HashMap;

const KORTEX: &str = "system:serviceaccount:kortex:kortex";

struct Policy {
    variables: Vec<(String, Program)>,
    validations: Vec<(Program, String)>,
}

fn policy() -> Policy {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/admission/policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let doc = text.split("\n---\n").next().unwrap_or_default();
    let vap: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(vap["kind"], "ValidatingAdmissionPolicy");
    let compile = |e: &Value| {
        let source = e.as_str().unwrap_or_else(|| panic!("expression: {e}"));
        Program::compile(source).unwrap_or_else(|e| panic!("{source}: {e:?}"))
    };
    Policy {
        variables: vap["spec"]["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or_default().to_owned(),
                    compile(&v["expression"]),
                )
            })
            .collect(),
        validations: vap["spec"]["validations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let message = v["message"]
                    .as_str()
                    .or(v["messageExpression"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                (compile(&v["expression"]), message)
            })
            .collect(),
    }
}

/// Denial messages (empty: admitted).
fn admit(
    policy: &Policy,
    user: &str,
    groups: &[&str],
    op: &str,
    sub: &str,
    object: &Value,
    old: Option<&Value>,
) -> Vec<String> {
    let mut ctx = Context::default().with_all();
    let request = json!({"operation": op, "subResource": sub,
        "userInfo": {"username": user, "groups": groups}});
    let value = |v: &Value| cel::to_value(v).unwrap_or_else(|e| panic!("{e}"));
    ctx.add_variable_from_value("request", value(&request));
    ctx.add_variable_from_value("object", value(object));
    ctx.add_variable_from_value("oldObject", old.map_or(CelValue::Null, value));
    let mut variables: HashMap<String, CelValue> = HashMap::new();
    for (name, program) in &policy.variables {
        let v = program
            .execute(&ctx)
            .unwrap_or_else(|e| panic!("variable {name}: {e:?}"));
        variables.insert(name.clone(), v);
        ctx.add_variable_from_value("variables", CelValue::from(variables.clone()));
    }
    policy
        .validations
        .iter()
        .filter_map(|(program, message)| match program.execute(&ctx) {
            Ok(CelValue::Bool(true)) => None,
            Ok(CelValue::Bool(false)) => Some(message.clone()),
            other => Some(format!("{message} (evaluation: {other:?})")),
        })
        .collect()
}

fn proposal(phase: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal",
        "metadata": {"name": "restart-api-x", "namespace": "shop",
            "labels": {"kortex.dev/session": "s1", "kortex.dev/require-distinct-approver": "true"},
            "annotations": {"kortex.dev/proposal-id": "id1", "kortex.dev/approver-groups": "sre,admins"}},
        "spec": {"action": "restart", "rationale": "r",
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "session": {"id": "s1", "name": "incident-1", "user": "alice"}}});
    if let Some(phase) = phase {
        p["status"] = json!({"phase": phase});
    }
    p
}

fn decided(p: &Value, by: &str, groups: Option<Value>) -> Value {
    let mut d = p.clone();
    d["spec"]["decision"] = json!({"verdict": "Approve", "by": by});
    if let Some(g) = groups {
        d["spec"]["decision"]["groups"] = g;
    }
    d
}

#[test]
fn only_kortex_creates_proposals_and_writes_their_status() {
    let policy = policy();
    let p = proposal(None);
    assert!(admit(&policy, KORTEX, &[], "CREATE", "", &p, None).is_empty());
    let denied = admit(
        &policy,
        "alice",
        &["system:authenticated"],
        "CREATE",
        "",
        &p,
        None,
    );
    assert_eq!(
        denied,
        ["only Kortex's ServiceAccount creates ActionProposals"]
    );
    let pending = proposal(Some("Pending"));
    let mut forged = pending.clone();
    forged["status"]["phase"] = json!("Approved");
    assert!(
        admit(
            &policy,
            KORTEX,
            &[],
            "UPDATE",
            "status",
            &forged,
            Some(&pending)
        )
        .is_empty()
    );
    let denied = admit(
        &policy,
        "bob",
        &["sre"],
        "UPDATE",
        "status",
        &forged,
        Some(&pending),
    );
    assert_eq!(
        denied,
        ["only Kortex writes the status of an ActionProposal"]
    );
}

#[test]
fn a_decision_is_written_by_its_author_while_pending() {
    let policy = policy();
    let pending = proposal(Some("Pending"));
    // bob, in sre, approves as himself: admitted.
    let ok = decided(&pending, "bob", Some(json!(["sre"])));
    assert_eq!(
        admit(
            &policy,
            "bob",
            &["sre", "system:authenticated"],
            "UPDATE",
            "",
            &ok,
            Some(&pending)
        ),
        Vec::<String>::new()
    );
    // In someone else's name.
    let denied = admit(
        &policy,
        "mallory",
        &["sre"],
        "UPDATE",
        "",
        &ok,
        Some(&pending),
    );
    assert!(
        denied
            .iter()
            .any(|m| m.contains("decision.by must be your own username")),
        "{denied:?}"
    );
    // Claiming a group one is not in.
    let claims = decided(&pending, "bob", Some(json!(["admins"])));
    let denied = admit(
        &policy,
        "bob",
        &["sre"],
        "UPDATE",
        "",
        &claims,
        Some(&pending),
    );
    assert_eq!(
        denied,
        ["spec.decision.groups may only name groups you belong to"]
    );
    // The proposer approving their own proposal.
    let own = decided(&pending, "alice", None);
    let denied = admit(
        &policy,
        "alice",
        &["sre"],
        "UPDATE",
        "",
        &own,
        Some(&pending),
    );
    assert_eq!(
        denied,
        ["the policy requires someone other than the proposer to decide"]
    );
    // Not in approverGroups.
    let outsider = decided(&pending, "carol", None);
    let denied = admit(
        &policy,
        "carol",
        &["dev"],
        "UPDATE",
        "",
        &outsider,
        Some(&pending),
    );
    assert!(
        denied.iter().any(|m| m.contains("approver-groups")),
        "{denied:?}"
    );
    // Too late: no longer Pending.
    let expired = proposal(Some("Expired"));
    let late = decided(&expired, "bob", None);
    let denied = admit(
        &policy,
        "bob",
        &["sre"],
        "UPDATE",
        "",
        &late,
        Some(&expired),
    );
    assert_eq!(
        denied,
        ["a decision can be written only while the proposal is Pending"]
    );
}

#[test]
fn people_change_nothing_else_but_an_undo_request_as_themselves() {
    let policy = policy();
    let done = proposal(Some("Succeeded"));
    let mut undo = done.clone();
    undo["metadata"]["annotations"]["kortex.dev/undo-requested-by"] = json!("bob");
    assert_eq!(
        admit(&policy, "bob", &["sre"], "UPDATE", "", &undo, Some(&done)),
        Vec::<String>::new()
    );
    let denied = admit(&policy, "carol", &["sre"], "UPDATE", "", &undo, Some(&done));
    assert!(
        denied
            .iter()
            .any(|m| m.contains("undo-requested-by must be your own username")),
        "{denied:?}"
    );
    let mut relabelled = done.clone();
    relabelled["metadata"]["labels"]["kortex.dev/require-distinct-approver"] = json!("false");
    assert_eq!(
        admit(
            &policy,
            "alice",
            &["sre"],
            "UPDATE",
            "",
            &relabelled,
            Some(&done)
        ),
        ["only Kortex changes the labels of an ActionProposal"]
    );
    let mut unannotated = done.clone();
    unannotated["metadata"]["annotations"]["kortex.dev/approver-groups"] = json!("dev");
    let denied = admit(
        &policy,
        "alice",
        &["sre"],
        "UPDATE",
        "",
        &unannotated,
        Some(&done),
    );
    assert_eq!(
        denied,
        ["people may only add the kortex.dev/undo-requested-by annotation to an ActionProposal"]
    );
    // Kortex itself links the undo proposal.
    let mut linked = done.clone();
    linked["metadata"]["annotations"]["kortex.dev/undo-proposal"] = json!("undo-x");
    assert!(admit(&policy, KORTEX, &[], "UPDATE", "", &linked, Some(&done)).is_empty());
}
