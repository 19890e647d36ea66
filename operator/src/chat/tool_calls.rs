//! One path from caller to tool, whichever door the call came in by — a chat run's model or
//! an MCP client: what a session may call under its policy, and one call carried out: the
//! door's plan gate, then the router, with its validation, timeouts, result cap, redaction,
//! audit row and metrics (`propose_action` and `submit_plan` are router tools too, see
//! `proposals.rs` and `plan.rs`).

use super::Engine;
use crate::catalog::PolicyEntry;
use crate::crd::Planning;
use crate::llm::{ToolCall, ToolSpec};
use crate::store::SessionRecord;
use crate::tools::{CallerScope, Effect, KubeIdentity, Outcome, ToolContext, guides::Guide};
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
    /// The OAuth token of whom the call is for, which an `oauthTokenExchange` MCP tool
    /// exchanges to call on their behalf.
    pub on_behalf: Option<&'a crate::tools::mcp_oauth::SubjectToken>,
    /// `chat` or `mcp`, for the audit row.
    pub via: &'static str,
    /// Who asked, as a proposal records it: (provider, model) of a chat run, or
    /// (`mcp`, the client's name).
    pub model: (&'a str, &'a str),
    /// The plan gate this door applies: the policy's under a chat run, `Off` over MCP (an
    /// MCP client's calls are not planned, and cannot wait for a plan's approval).
    pub planning: Planning,
    /// The names of the tools offered with the call (a plan may name only these).
    pub offered: &'a [String],
}

/// The tools a session may call under `policy` (built-ins, its namespace's plugins,
/// `propose_action` when the policy allows an action, `submit_plan` when it plans), after
/// allow/deny and `allowedSessions`. A door whose calls cannot wait for a person (`waits`
/// false: an MCP client, a provider's own tool loop) is not offered the tools that may.
/// Client-executed dynamic tools are the chat door's own.
pub fn offered(
    engine: &Engine,
    policy: &PolicyEntry,
    session: &SessionRecord,
    kube: &KubeIdentity,
    waits: bool,
) -> Vec<ToolSpec> {
    let mut tools = engine.router.offered(policy, session, kube);
    if !waits {
        tools.retain(|t| engine.router.effect(&t.name) != Effect::Waits);
    }
    tools
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

/// The plan gate, then the router.
async fn carry_out(
    engine: &Engine,
    caller: &CallScope<'_>,
    call: &ToolCall,
    guides: Arc<[Guide]>,
    on_slow: impl std::future::Future<Output = ()>,
) -> Outcome {
    let started = Instant::now();
    if let Some(why) = gate(engine, caller, &call.name).await {
        return Outcome::refused(why, "denied", started.elapsed());
    }
    let mut ctx = ToolContext::new(
        engine.store.clone(),
        caller.session.clone(),
        caller.run_id,
        caller.via,
    );
    ctx.call_id = call.id.clone();
    ctx.redactor = caller.redactor.clone();
    ctx.kube = caller.kube.clone();
    ctx.on_behalf = caller.on_behalf.cloned();
    ctx.guides = guides;
    ctx.scope = Arc::new(CallerScope {
        policy: Some(caller.policy.clone()),
        model: (caller.model.0.to_owned(), caller.model.1.to_owned()),
        offered: caller.offered.to_vec(),
    });
    engine
        .router
        .execute(ctx, call, caller.policy, on_slow)
        .await
}

/// Why the door's plan gate refuses `tool` now, if it does: nothing but the plan tool
/// (and what reads around it) before a plan, only the approved plan's tools after one
/// (`docs`: the ChatPolicy's `runControl.planning`). A door that does not plan is not
/// offered the plan tool either.
async fn gate(engine: &Engine, caller: &CallScope<'_>, tool: &str) -> Option<String> {
    if caller.planning == Planning::Off {
        return (engine.router.effect(tool) == Effect::Waits).then(|| {
            format!("tool {tool} is not offered here: this door cannot wait for a person")
        });
    }
    let plan = match engine.store.latest_plan(caller.run_id).await {
        Ok(plan) => plan,
        Err(e) => return Some(format!("the run's plan cannot be read: {e}")),
    };
    super::plan::refuses(caller.planning, plan.as_ref(), tool)
}
