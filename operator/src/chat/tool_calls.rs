//! One path from caller to tool, whichever door the call came in by — a chat run's model or
//! an MCP client: what a session may call under its policy, and one call carried out
//! (`propose_action` stores a proposal; every other tool goes through the router, with its
//! validation, timeouts, result cap, redaction, audit row and metrics).

use super::Engine;
use crate::catalog::PolicyEntry;
use crate::llm::{ToolCall, ToolSpec};
use crate::store::SessionRecord;
use crate::tools::{KubeIdentity, Outcome, ToolContext, guides::Guide};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument as _;

/// The scope of a tool call: in which session and run, under which policy, as whom (not
/// to be confused with the API's caller, [`crate::http::auth::Caller`], a person).
pub struct CallScope<'a> {
    /// The session the call belongs to.
    pub session: &'a SessionRecord,
    /// The run (chat), or an id of the call's own (MCP).
    pub run_id: &'a str,
    /// The session's policy.
    pub policy: &'a PolicyEntry,
    /// Redacts what the tool returns.
    pub redactor: &'a crate::redact::Redactor,
    /// Who the Kubernetes tools act as.
    pub kube: &'a KubeIdentity,
    /// `chat` or `mcp`, for the audit row.
    pub via: &'static str,
    /// Who asked, as a proposal records it: (provider, model) of a chat run, or
    /// (`mcp`, the client's name).
    pub model: (&'a str, &'a str),
}

/// The tools a session may call under `policy` (built-ins, its namespace's plugins,
/// `propose_action` when the policy allows an action), after allow/deny and
/// `allowedSessions`. Client-executed dynamic tools are the chat door's own.
pub fn offered(
    engine: &Engine,
    policy: &PolicyEntry,
    session: &SessionRecord,
    kube: &KubeIdentity,
) -> Vec<ToolSpec> {
    engine
        .router
        .offered(policy, session, kube)
        .into_iter()
        .chain(super::proposals::spec(policy))
        .collect()
}

/// Carries out one call, in its `execute_tool` span. Never fails: every problem is an error
/// result.
pub async fn call(
    engine: &Engine,
    caller: &CallScope<'_>,
    call: &ToolCall,
    guides: Arc<[Guide]>,
    on_slow: impl std::future::Future<Output = ()>,
) -> Outcome {
    let span = crate::telemetry::trace::tool_span(&call.name, &call.id);
    let capture = !span.is_disabled() && caller.policy.object.spec.captures_content();
    if capture {
        let mut arguments = call.input.clone();
        caller.redactor.value(&mut arguments);
        span.record("gen_ai.tool.call.arguments", arguments.to_string());
    }
    let outcome = carry_out(engine, caller, call, guides, on_slow)
        .instrument(span.clone())
        .await;
    if let Some(kind) = outcome.error_kind.filter(|_| outcome.is_error) {
        crate::telemetry::trace::fail(&span, kind);
    }
    if capture {
        // Results are redacted before they leave the router.
        span.record("gen_ai.tool.call.result", outcome.content.as_str());
    }
    outcome
}

async fn carry_out(
    engine: &Engine,
    caller: &CallScope<'_>,
    call: &ToolCall,
    guides: Arc<[Guide]>,
    on_slow: impl std::future::Future<Output = ()>,
) -> Outcome {
    if call.name == super::proposals::TOOL && super::proposals::spec(caller.policy).is_some() {
        let started = Instant::now();
        let proposed = super::proposals::propose(
            engine,
            caller.session,
            caller.run_id,
            caller.policy,
            caller.model,
            caller.via,
            &call.input,
        )
        .await;
        let (content, is_error, error_kind) = match proposed {
            Ok(v) => (v.to_string(), false, None),
            Err(e) => (e, true, Some("validation")),
        };
        return Outcome {
            content: caller.redactor.content(&content).0,
            is_error,
            error_kind,
            truncated: false,
            duration: started.elapsed(),
        };
    }
    let ctx = ToolContext {
        store: engine.store.clone(),
        session: caller.session.clone(),
        run_id: caller.run_id.to_owned(),
        redactor: caller.redactor.clone(),
        kube: caller.kube.clone(),
        guides,
        via: caller.via,
    };
    engine
        .router
        .execute(ctx, call, caller.policy, on_slow)
        .await
}
