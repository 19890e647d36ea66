//! `propose_action` and `submit_plan` are router tools: offered as the session's policy
//! shapes them, carried out through the one path every door uses (the router's validation,
//! audit row and metrics), and kept from the doors that cannot wait for a person.

use crate::support::db::{audit_query, new_session, sqlite};
use kortex::chat::tool_calls::{self, CallScope};
use kortex::crd::Planning;
use kortex::llm::ToolCall;
use kortex::tools::{Effect, KubeIdentity, Router};
use serde_json::{Value, json};
use std::sync::Arc;

/// A policy for namespace `default` with these `spec` fields besides sessions and provider.
fn policy(extra: Value) -> kortex::catalog::PolicyEntry {
    let mut spec = json!({"sessions": ["*"], "provider": "x"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    kortex::catalog::PolicyEntry::as_is(
        serde_json::from_value(json!({"apiVersion": "kortex.dev/v1alpha1",
            "kind": "ChatPolicy", "metadata": {"name": "p", "namespace": "default"},
            "spec": spec}))
        .unwrap(),
    )
}

/// The names offered, but the guide tools (offered wherever there is a guide to read).
fn names(tools: &[kortex::llm::ToolSpec]) -> Vec<&str> {
    tools
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !kortex::tools::guides::is_guide_tool(n))
        .collect()
}

#[tokio::test]
async fn proposals_and_plans_are_router_tools_offered_by_policy_and_door() {
    let db = sqlite().await;
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(kortex::live::LiveConfig::default()));
    let engine = kortex::chat::Engine::new(
        db.store.clone(),
        rx,
        Router::new(Arc::new(kortex::metrics::Metrics::new())),
    );
    let session = db
        .store
        .create_session(&new_session("u", "incident-1"))
        .await
        .unwrap();
    let kube = KubeIdentity::Kortex;
    let router = &engine.router;
    assert_eq!(router.effect("propose_action"), Effect::Records);
    assert_eq!(router.effect("submit_plan"), Effect::Waits);
    assert_eq!(router.effect("get_incident_history"), Effect::Read);

    // Neither is offered by a policy that allows no action and does not plan.
    let plain = policy(json!({}));
    let offered = tool_calls::offered(&engine, &plain, &session, &kube, true);
    assert!(!names(&offered).contains(&"propose_action"), "{offered:?}");
    assert!(!names(&offered).contains(&"submit_plan"), "{offered:?}");

    // The plan tool belongs to the run control: an allow list that does not name it keeps
    // it; the proposal tool follows allow/deny, and lists the policy's actions.
    let planned = policy(json!({
        "tools": {"allow": ["get_incident_history", "propose_action"]},
        "runControl": {"planning": "required"},
        "proposals": {"allowedActions": ["restart"], "allowedNamespaces": ["*"]}}));
    let offered = tool_calls::offered(&engine, &planned, &session, &kube, true);
    assert_eq!(
        names(&offered),
        ["get_incident_history", "propose_action", "submit_plan"],
        "{offered:?}"
    );
    let propose = offered.iter().find(|t| t.name == "propose_action").unwrap();
    assert_eq!(
        propose.parameters["properties"]["action"]["enum"],
        json!(["restart"])
    );
    // A door that cannot wait (MCP, a provider's own loop) is not offered the plan tool.
    let over_mcp = tool_calls::offered(&engine, &planned, &session, &kube, false);
    assert_eq!(names(&over_mcp), ["get_incident_history", "propose_action"]);

    let call = |id: &str, name: &str, input: Value| ToolCall {
        id: id.into(),
        name: name.into(),
        input,
    };
    let redactor = kortex::redact::Redactor::default();
    let scope = |planning| CallScope {
        session: &session,
        run_id: "run-1",
        policy: &planned,
        redactor: &redactor,
        kube: &kube,
        on_behalf: None,
        via: "mcp",
        model: ("mcp", "client"),
        planning,
        offered: &[],
    };
    let guides: Arc<[kortex::tools::guides::Guide]> = Arc::from(Vec::new());
    // One MCP call of `name` (no planning), carried out as every door's is.
    let run = async |id: &str, name: &str, input: Value| {
        tool_calls::call(
            &engine,
            &scope(Planning::Off),
            &call(id, name, input),
            guides.clone(),
            async {},
        )
        .await
    };

    // Named over MCP anyway, the plan tool is refused.
    let refused = run("m1", "submit_plan", json!({"steps": []})).await;
    assert_eq!(refused.error_kind, Some("denied"), "{refused:?}");
    assert!(
        refused.content.contains("cannot wait for a person"),
        "{refused:?}"
    );

    // A proposal outside the policy's actions is refused with the policy's reason; a good
    // one is stored; each call leaves one audit row, as every router tool's does.
    let target = json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"});
    let bad = run(
        "m2",
        "propose_action",
        json!({"action": "delete", "target": target, "rationale": "r"}),
    )
    .await;
    assert_eq!(bad.error_kind, Some("validation"), "{bad:?}");
    assert!(
        bad.content
            .starts_with("action delete is not allowed by the policy; allowed: restart"),
        "{bad:?}"
    );
    let good = run(
        "m3",
        "propose_action",
        json!({"action": "restart", "target": target, "rationale": "stuck since 09:00"}),
    )
    .await;
    assert!(!good.is_error, "{good:?}");
    let proposals = db.store.list_proposals(None, 10).await.unwrap();
    assert_eq!(proposals.len(), 1);
    assert_eq!(proposals[0].action, "restart");
    let rows = db
        .store
        .list_decisions(&audit_query(Some("tool_call"), 10))
        .await
        .unwrap();
    let audited: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.subject.as_str(), r.outcome.as_str()))
        .collect();
    assert_eq!(
        audited,
        [("propose_action", "ok"), ("propose_action", "validation")],
        "{rows:?}"
    );
}
