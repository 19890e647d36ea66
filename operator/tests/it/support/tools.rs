//! Calling tools in-process: the policy and context a tool call runs under.

use crate::support::db::new_session;
use kortex::store::Store;

/// A ChatPolicy for namespace `default` matching every session, with `tools` rules
/// (`json!({})`: every tool allowed).
pub fn tool_policy(tools: serde_json::Value) -> kortex::catalog::PolicyEntry {
    kortex::catalog::PolicyEntry::as_is(
        serde_json::from_value(
            serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"sessions": ["*"], "provider": "x", "tools": tools}}),
        )
        .unwrap(),
    )
}

/// What a tool gets when session `name` of user `u` in namespace `default` calls it.
pub async fn tool_context(store: &Store, name: &str) -> kortex::tools::ToolContext {
    let session = store.create_session(&new_session("u", name)).await.unwrap();
    kortex::tools::ToolContext::new(store.clone(), session, "run-1", "chat")
}
