//! One run: the loop of provider steps for a user's message, with its events.

use super::{Engine, event, tool_calls};
use crate::govern::attempt::Attempt;
use crate::govern::route;
use crate::llm::{self, ChatRequest, LlmError, Message, StopReason, StreamEvent, ToolCall};
use crate::store::SessionState as SS;
use crate::store::{NewDecision, NewMessage, SessionRecord};
use futures_util::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::Instrument as _;

/// Text deltas are coalesced for about this long before they are persisted and sent.
pub const COALESCE: Duration = Duration::from_millis(50);
/// The most text one coalesced `text.delta` carries: past it, the text goes out at once
/// (a fast stream meets a slow database in events of bounded size, which followers page
/// through in bounded memory).
pub const MAX_DELTA_BYTES: usize = 64 * 1024;

/// Added to the system prompt when the guide tools are offered.
const GUIDES_PROMPT: &str = "Usage guides exist for your tools: list_tool_guides lists them and get_tool_guide reads one. \
Read the guide of a tool family before you use it for the first time in a conversation.";

/// The system prompt every session starts from; a policy's `systemPrompt` is appended.
pub const BASE_PROMPT: &str = "You are Kortex, an assistant for platform and operations teams running Kubernetes. \
Investigate with the tools you are given, say which tool showed what, and never claim to have changed anything: \
you can only read, and propose actions for a human to approve.";

/// How a run ended.
enum End {
    Completed,
    /// Parked at a step boundary by a pause; a resume takes it on again.
    Paused,
    /// Parked until a person approves or rejects the plan it stated.
    AwaitingPlan,
    /// Waiting for the client to run its dynamic tools.
    RequiresAction,
    Cancelled,
    Failed {
        code: &'static str,
        message: String,
        /// The transport's own words (the error event's `detail` and the log).
        detail: Option<String>,
    },
}

/// Runs to the end and records the outcome (session status, run row, lifecycle event).
// Long because it is the run's whole lifecycle in order: claim, steps, the end recorded
// (session status, run row, lifecycle event) for each way a run ends.
pub async fn run(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    resume: bool,
    notices: Vec<String>,
    mut cancel: watch::Receiver<bool>,
) {
    if !resume {
        let _ = engine
            .emit(
                &session.id,
                run_id,
                event::RUN_LIFECYCLE,
                json!({"runId": run_id, "state": "started"}),
            )
            .await;
    }
    // Budget alerts crossed when the run was admitted.
    for message in notices {
        let _ = notice(engine, session, run_id, &message).await;
    }
    let end = match steps(engine, session, run_id, &mut cancel).await {
        Ok(end) => end,
        Err(e) => End::Failed {
            code: "internal",
            message: format!("the run could not be stored: {e}"),
            detail: None,
        },
    };
    if let End::Paused | End::AwaitingPlan = end {
        // Parked: the run row says so; the session waits for a person.
        let (state, session_state) = if let End::Paused = end {
            ("paused", SS::Paused)
        } else {
            ("awaiting_plan", SS::AwaitingPlan)
        };
        let parked = crate::store::patiently("a parked run", || async {
            if state == "awaiting_plan" {
                engine.store.park_for_plan(run_id).await?;
            }
            engine
                .store
                .transition_session(&session.id, &[SS::Running], session_state)
                .await
        })
        .await;
        if let Err(e) = parked {
            tracing::error!(session = %session.id, error = %e, "cannot record the parked run");
        }
        // A required plan is shown now that the run waits for it: it can be decided at once.
        if let End::AwaitingPlan = end
            && let Ok(Some(plan)) = engine.store.latest_plan(run_id).await
        {
            let shown = super::plan::shown(run_id, &plan.id, "required", &plan.steps);
            let _ = engine
                .emit(&session.id, run_id, super::plan::EVENT, shown)
                .await;
        }
        let _ = engine
            .emit(
                &session.id,
                run_id,
                event::RUN_LIFECYCLE,
                json!({"runId": run_id, "state": state}),
            )
            .await;
        return;
    }
    let (state, session_status, reason) = match &end {
        End::Paused | End::AwaitingPlan => ("paused", SS::Paused, None),
        End::Completed => ("completed", SS::Idle, None),
        End::RequiresAction => ("requires_action", SS::RequiresAction, None),
        End::Cancelled => (
            "cancelled",
            SS::Idle,
            Some("cancelled by the user".to_owned()),
        ),
        End::Failed {
            code,
            message,
            detail,
        } => {
            // Who, where and why; never the conversation.
            tracing::warn!(session = %session.id, run = run_id, code, reason = %message, detail = detail.as_deref().unwrap_or(""), "run failed");
            let mut data = json!({"runId": run_id, "code": code, "message": message});
            if let Some(d) = detail {
                data["detail"] = json!(d);
            }
            let _ = engine.emit(&session.id, run_id, event::ERROR, data).await;
            ("failed", SS::Failed, Some(message.clone()))
        }
    };
    // A transcript never keeps a tool call without a result: the next provider call would
    // be refused.
    if matches!(end, End::Failed { .. } | End::Cancelled) {
        let why = format!("no result: {}", reason.clone().unwrap_or_default());
        if let Err(e) = super::answer_pending(engine, &session.id, run_id, &why, true).await {
            tracing::error!(run = run_id, error = %e, "cannot answer pending tool calls");
        }
    }
    // Only the run that still owns the session ends it (another replica may have failed it
    // as stale meanwhile).
    match crate::store::patiently("the end of a run", || {
        engine.store.finish_run(run_id, state, reason.as_deref())
    })
    .await
    {
        Ok(true) => {
            if let Err(e) = crate::store::patiently("the session's status", || {
                engine
                    .store
                    .transition_session(&session.id, &[SS::Running], session_status)
            })
            .await
            {
                tracing::error!(session = %session.id, error = %e, "cannot record the session status");
            }
        }
        Ok(false) => {
            tracing::warn!(
                run = run_id,
                "the run was already ended elsewhere; leaving the session alone"
            );
            return;
        }
        Err(e) => tracing::error!(run = run_id, error = %e, "cannot record the end of a run"),
    }
    let span = tracing::Span::current();
    span.record("kortex.run.state", state);
    if let End::Failed { code, .. } = &end {
        crate::telemetry::trace::fail(&span, code);
    }
    let mut data = json!({"runId": run_id, "state": state});
    if let Some(r) = reason {
        data["reason"] = json!(r);
    }
    let _ = engine
        .emit(&session.id, run_id, event::RUN_LIFECYCLE, data)
        .await;
    // A policy with a `summarize` model titles its sessions (one-line incident summaries
    // for the dashboard and get_incident_history).
    if matches!(end, End::Completed) && session.title.is_none() {
        let config = engine.config.borrow().clone();
        if let Some(policy) = config
            .catalog
            .policy_of(session)
            .filter(|p| p.object.spec.models.summarize.is_some())
            && let Err(e) = super::roles::title(engine, session, policy).await
        {
            tracing::warn!(session = %session.id, error = %e, "cannot title the session");
        }
    }
    if matches!(end, End::Completed) {
        let config = engine.config.borrow().clone();
        if let Some(policy) = config.catalog.policy_of(session)
            && let Err(e) = super::roles::follow_ups(engine, session, run_id, policy).await
        {
            tracing::warn!(session = %session.id, error = %e, "cannot suggest follow-ups");
        }
    }
}

/// A run's copy of its session's transcript.
struct Transcript {
    messages: Vec<crate::store::MessageRecord>,
}

impl Transcript {
    /// Brings the copy up to date: the messages added since, or the whole transcript again
    /// when a redirect joined it (a redirect, the only thing that changes stored messages,
    /// marks the rewound ones superseded and adds a user message of this run in one
    /// transaction).
    async fn refresh(
        &mut self,
        engine: &Engine,
        session_id: &str,
        run_id: &str,
    ) -> Result<&[crate::store::MessageRecord], crate::store::StoreError> {
        let after = self.messages.last().map_or(0, |m| m.seq);
        let added = crate::store::patiently("the transcript", || {
            engine.store.messages_after(session_id, after)
        })
        .await?;
        if added
            .iter()
            .any(|m| m.role == "user" && m.run_id.as_deref() == Some(run_id))
        {
            self.messages = crate::store::patiently("the transcript", || {
                engine.store.list_messages(session_id)
            })
            .await?;
        } else {
            self.messages.extend(added);
        }
        Ok(&self.messages)
    }
}

/// The conversation as stored, in provider-agnostic form, without the steps a redirect
/// rewound past.
fn history(messages: &[crate::store::MessageRecord]) -> Vec<Message> {
    messages
        .iter()
        .filter(|m| !m.superseded)
        .map(|m| match m.role.as_str() {
            "assistant" => Message::Assistant {
                content: m.content.clone(),
                tool_calls: m
                    .tool_calls
                    .clone()
                    .and_then(|v| serde_json::from_value::<Vec<ToolCall>>(v).ok())
                    .unwrap_or_default(),
            },
            "tool" => Message::Tool {
                tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
                content: m.content.clone(),
                is_error: m.is_error,
            },
            _ => Message::User {
                content: m.content.clone(),
            },
        })
        .collect()
}

/// The marker a fast model answers with when the question needs the full model (frugal
/// mode; documented in docs/policies.md).
pub const ESCALATE_MARKER: &str = "[[kortex:escalate]]";

/// What a fast model is told in frugal mode.
const FAST_PROMPT: &str = "You are answering with a fast, economical model. If answering well needs more context or deeper reasoning than you can give, reply with exactly [[kortex:escalate]] and nothing else: a stronger model will take over.";

/// The sticky choices of one run: the route that answers (after failovers) and whether a
/// frugal run escalated to the full model.
struct Routing {
    /// The policy's name (audit rows).
    policy: String,
    /// The policy's redaction: of what goes to a provider, and of its errors and answers
    /// as they are shown and stored.
    redactor: crate::redact::Redactor,
    /// Whose budgets the calls draw on.
    scope: crate::govern::Scope,
    plan: crate::govern::route::Plan,
    current: usize,
    escalated: bool,
    adapters: std::collections::HashMap<String, std::sync::Arc<dyn llm::LlmProvider>>,
}

impl Routing {
    fn adapter(
        &mut self,
        catalog: &crate::catalog::Catalog,
        namespace: &str,
    ) -> Result<std::sync::Arc<dyn llm::LlmProvider>, LlmError> {
        let name = self.plan.routes[self.current].provider.clone();
        if let Some(a) = self.adapters.get(&name) {
            return Ok(a.clone());
        }
        let entry = catalog.provider(namespace, &name).ok_or_else(|| {
            LlmError::new(llm::ErrorKind::Config, &name, "the LLMProvider is gone")
        })?;
        let adapter = llm::build(entry)?;
        self.adapters.insert(name, adapter.clone());
        Ok(adapter)
    }
}

/// One answered provider call of a step.
struct Answer {
    step: StepOutcome,
    provider: String,
    model: String,
}

/// The run's fixed part, worked out once before its first step: the policy as it matches
/// now, whose rights the tools read with, the routes that may answer, and what the steps
/// offer.
struct Prepared<'a> {
    policy: &'a crate::catalog::PolicyEntry,
    kube: crate::tools::KubeIdentity,
    /// The OAuth token of whom the run acts for, for tools that call on their behalf.
    on_behalf: Option<crate::tools::mcp_oauth::SubjectToken>,
    routing: Routing,
    redactor: crate::redact::Redactor,
    planning: crate::crd::Planning,
    /// Client-executed tools declared by the session, as far as the policy allows them now.
    dynamic: Vec<llm::ToolSpec>,
}

impl Prepared<'_> {
    /// The system prompt: Kortex's, then (with the guide tools) how to use them, then the
    /// policy's own instructions, last.
    fn system(&self, guides: bool) -> String {
        let mut prompt = BASE_PROMPT.to_owned();
        if guides {
            prompt.push_str("\n\n");
            prompt.push_str(GUIDES_PROMPT);
        }
        match self.policy.object.spec.system_prompt.as_deref() {
            Some(extra) if !extra.trim().is_empty() => format!("{prompt}\n\n{extra}"),
            _ => prompt,
        }
    }
}

/// Matches the session's policy again (configuration may have changed) and plans its
/// routes, leaving out providers a fresh probe found unreachable; `Err` ends the run at
/// once with why.
fn prepare<'a>(
    engine: &Engine,
    session: &SessionRecord,
    catalog: &'a crate::catalog::Catalog,
) -> Result<Prepared<'a>, End> {
    let Some(policy) = catalog.policy_of(session) else {
        return Err(End::Failed {
            code: "no_matching_policy",
            message: format!(
                "no ChatPolicy in namespace {} matches session {}",
                session.namespace, session.name
            ),
            detail: None,
        });
    };
    let policy_name = policy.object.metadata.name.clone().unwrap_or_default();
    let spec = &policy.object.spec;
    // A triggered run reads with its trigger's `runAs` identity (the dispatcher remembered
    // its token), never with Kortex's own rights.
    let as_user = spec.run_tools_as_user || session.trigger.is_some();
    let kube = engine.kube_identity(&session.id, &session.user, as_user);
    let mut plan = route::plan(catalog, &session.namespace, policy, route::Role::Default);
    // A provider its fresh probe found unreachable is not tried: the run says at once what
    // to do instead of waiting for a connection that will not come.
    let dropped = match engine.probes.get() {
        Some((board, interval)) => {
            let probes = board.read().map(|b| b.clone()).unwrap_or_default();
            crate::govern::reach::drop_unreachable(
                &mut plan,
                catalog,
                &session.namespace,
                &probes,
                jiff::Timestamp::now(),
                crate::govern::reach::fresh_within(*interval),
            )
        }
        None => Vec::new(),
    };
    if plan.routes.is_empty() {
        return Err(End::Failed {
            code: if dropped.is_empty() {
                "provider_unavailable"
            } else {
                "no_provider_reachable"
            },
            message: crate::govern::reach::no_provider_message(
                catalog,
                &session.namespace,
                &policy_name,
                &plan,
            ),
            detail: (!dropped.is_empty()).then(|| dropped.join("; ")),
        });
    }
    let routing = Routing {
        policy: policy_name,
        redactor: crate::redact::Redactor::for_policy(catalog, policy),
        scope: crate::govern::Scope::new(policy, &session.user, Some(&session.id), "chat"),
        plan,
        current: 0,
        escalated: false,
        adapters: Default::default(),
    };
    let dynamic = serde_json::from_value::<Vec<llm::ToolSpec>>(session.dynamic_tools.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| crate::glob::allowed(&spec.tools.allow, &spec.tools.deny, &t.name))
        .collect();
    Ok(Prepared {
        policy,
        kube,
        on_behalf: engine.subject_of(&session.id, &session.user),
        routing,
        redactor: crate::redact::Redactor::for_policy(catalog, policy),
        planning: super::plan::planning(policy),
        dynamic,
    })
}

/// The run's steps: at each boundary a pause parks it and redirects join; the step is
/// answered (with failover), the answer kept, and its tool calls carried out; until an
/// answer without calls, a wait (client tools, a plan), a cancel, or `maxToolDepth`.
// Long because one step's parts are read best in sequence (boundary, offer, answer, keep,
// carry out); each part is a function of its own.
async fn steps(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Result<End, crate::store::StoreError> {
    let config = engine.config.borrow().clone();
    let mut run = match prepare(engine, session, &config.catalog) {
        Ok(run) => run,
        Err(end) => return Ok(end),
    };
    let (policy, planning) = (run.policy, run.planning);
    let spec = &policy.object.spec;
    // The transcript, read whole once and then only what each step added (a long session's
    // transcript is hundreds of messages: re-reading it at every step cost more than
    // everything else a step writes).
    let mut transcript = Transcript {
        messages: engine.store.list_messages(&session.id).await?,
    };
    // A resumed run (after dynamic tool results) continues its step count.
    let used = transcript
        .messages
        .iter()
        .filter(|m| m.role == "assistant" && m.run_id.as_deref() == Some(run_id))
        .count() as u32;
    // `triage` decides whether the first step of a new question needs tools at all.
    let mut without_tools =
        used == 0 && !super::roles::needs_tools(engine, session, run_id, policy).await?;
    for step in (used + 1)..=spec.max_tool_depth {
        if *cancel.borrow() {
            return Ok(End::Cancelled);
        }
        // Nothing new goes to a provider or a tool once a pause is asked; redirects made
        // since the last boundary join the transcript here.
        if let super::control::Boundary::Park =
            super::control::at_boundary(engine, session, run_id).await?
        {
            return Ok(End::Paused);
        }
        engine
            .emit(
                &session.id,
                run_id,
                event::STEP_BOUNDARY,
                json!({"runId": run_id, "step": step}),
            )
            .await?;
        let history = history(transcript.refresh(engine, &session.id, run_id).await?);
        let tools: Vec<llm::ToolSpec> = if std::mem::take(&mut without_tools) {
            Vec::new()
        } else {
            tool_calls::offered(engine, policy, session, &run.kube, true)
                .into_iter()
                .chain(run.dynamic.iter().cloned())
                .collect()
        };
        let offered_names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        let guides = engine.router.guides(&tools, &session.namespace);
        let system = run.system(tools.iter().any(|t| t.name == crate::tools::guides::LIST));
        // What a provider with its own tool loop may call over /mcp: the step's tools but
        // the client's own and those that may wait for a person (it cannot wait).
        let delegable = Delegable {
            policy,
            kube: &run.kube,
            on_behalf: run.on_behalf.as_ref(),
            guides: guides.clone(),
            planning,
            max_turns: spec.max_tool_depth.saturating_sub(step - 1).max(1),
            tools: tools
                .iter()
                .filter(|t| {
                    engine.router.effect(&t.name) != crate::tools::Effect::Waits
                        && !run.dynamic.iter().any(|d| d.name == t.name)
                })
                .cloned()
                .collect(),
        };
        let step_span = crate::telemetry::trace::step_span(step);
        let answer = match answer_step(
            RunRef {
                engine,
                session,
                run_id,
            },
            step,
            &mut run.routing,
            (&system, &history, &tools),
            &delegable,
            cancel,
        )
        .instrument(step_span.clone())
        .await?
        {
            Ok(answer) => answer,
            Err(end) => return Ok(end),
        };
        let calls = match keep_answer(engine, session, run_id, step, answer, &run.redactor, cancel)
            .await?
        {
            Kept::Calls(calls) => calls,
            Kept::Interrupted => continue,
            Kept::End(end) => return Ok(end),
        };
        let step_calls = StepCalls {
            engine,
            session,
            run_id,
            scope: tool_calls::CallScope {
                session,
                run_id,
                policy,
                redactor: &run.redactor,
                kube: &run.kube,
                on_behalf: run.on_behalf.as_ref(),
                via: "chat",
                model: (calls.provider.as_str(), calls.model.as_str()),
                planning,
                offered: &offered_names,
            },
            dynamic: &run.dynamic,
            guides,
        };
        if let Some(end) = carry_out_calls(&step_calls, &calls.calls, &step_span, cancel).await? {
            return Ok(end);
        }
    }
    let message = format!(
        "Stopped after {} provider round-trips (the policy's maxToolDepth) without a final answer. Ask again to continue.",
        spec.max_tool_depth
    );
    engine
        .emit(
            &session.id,
            run_id,
            event::NOTICE,
            json!({"runId": run_id, "message": message}),
        )
        .await?;
    engine
        .append(
            &session.id,
            &NewMessage {
                run_id: Some(run_id.to_owned()),
                role: "assistant".into(),
                content: message,
                ..Default::default()
            },
        )
        .await?;
    Ok(End::Completed)
}

/// What keeping a step's answer leaves to do.
enum Kept {
    /// Carry out these calls (the answer asked for them).
    Calls(AnsweredCalls),
    /// The provider's own loop was stopped for a pause or a redirect: the next boundary.
    Interrupted,
    /// The run ends.
    End(End),
}

/// The calls of an answer, with who answered.
struct AnsweredCalls {
    calls: Vec<ToolCall>,
    provider: String,
    model: String,
}

/// Keeps a step's answer: what the model said (redacted, with who said it) is stored and
/// sent; a provider error, a cancel, or an answer without calls ends the run.
async fn keep_answer(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    step: u32,
    answer: Answer,
    redactor: &crate::redact::Redactor,
    cancel: &watch::Receiver<bool>,
) -> Result<Kept, crate::store::StoreError> {
    let Answer {
        step: outcome,
        provider: provider_name,
        model: served_model,
    } = answer;
    let StepOutcome {
        text,
        mut calls,
        error,
        interrupted,
        ..
    } = outcome;
    if *cancel.borrow() {
        // Keep what the model had said when the user cancelled.
        if !text.is_empty() {
            let partial = NewMessage {
                run_id: Some(run_id.to_owned()),
                role: "assistant".into(),
                content: redactor.text(&text).0,
                provider: Some(provider_name.clone()),
                model: Some(served_model.clone()),
                ..Default::default()
            };
            engine.append(&session.id, &partial).await?;
        }
        return Ok(Kept::End(End::Cancelled));
    }
    // Tool arguments are stored, shown and executed as redacted as everything else.
    for call in &mut calls {
        redactor.value(&mut call.input);
    }
    if !text.is_empty() || !calls.is_empty() {
        // Stored with the event saying who wrote it (one transaction).
        engine
            .append_and_emit(
                &session.id,
                &NewMessage {
                    run_id: Some(run_id.to_owned()),
                    role: "assistant".into(),
                    content: redactor.text(&text).0,
                    tool_calls: (!calls.is_empty()).then(|| json!(calls)),
                    provider: Some(provider_name.clone()),
                    model: Some(served_model.clone()),
                    ..Default::default()
                },
                event::STEP_ANSWERED,
                json!({"runId": run_id, "step": step, "provider": provider_name, "model": served_model}),
            )
            .await?;
    }
    if let Some(e) = error {
        let mut message = redactor.text(&e.to_string()).0;
        if !text.is_empty() {
            message.push_str("; the partial answer is kept");
        }
        return Ok(Kept::End(End::Failed {
            code: "provider_error",
            message,
            detail: e.detail.as_deref().map(|d| redactor.text(d).0),
        }));
    }
    if interrupted {
        return Ok(Kept::Interrupted);
    }
    if calls.is_empty() && text.trim().is_empty() {
        notice(
            engine,
            session,
            run_id,
            &format!("{provider_name} returned an empty answer (model {served_model}); ask again, and if it repeats check the model server's log or the provider's maxTokens"),
        )
        .await?;
    }
    if calls.is_empty() {
        return Ok(Kept::End(End::Completed));
    }
    Ok(Kept::Calls(AnsweredCalls {
        calls,
        provider: provider_name,
        model: served_model,
    }))
}

/// What carrying out one step's calls needs besides the calls.
struct StepCalls<'a> {
    engine: &'a Engine,
    session: &'a SessionRecord,
    run_id: &'a str,
    scope: tool_calls::CallScope<'a>,
    /// The session's client-executed tools: their calls wait for the client.
    dynamic: &'a [llm::ToolSpec],
    guides: std::sync::Arc<[crate::tools::guides::Guide]>,
}

/// Carries out a step's calls, all through the one path every door uses: client tools
/// wait for the client; a call that records something (a proposal, a plan) runs alone, in
/// order, before the step's reads, which then run at once. `Some` ends the run (or parks
/// it: a held call's result is a person's decision).
async fn carry_out_calls(
    c: &StepCalls<'_>,
    calls: &[ToolCall],
    step_span: &tracing::Span,
    cancel: &watch::Receiver<bool>,
) -> Result<Option<End>, crate::store::StoreError> {
    let (engine, session, run_id) = (c.engine, c.session, c.run_id);
    let (mut waiting, mut held) = (false, false);
    let mut reads = Vec::new();
    for call in calls {
        let start =
            json!({"runId": run_id, "callId": call.id, "name": call.name, "input": call.input});
        engine
            .emit(&session.id, run_id, event::TOOL_START, start)
            .await?;
        if c.dynamic.iter().any(|t| t.name == call.name) {
            waiting = true;
        } else if engine.router.effect(&call.name) == crate::tools::Effect::Read {
            reads.push(call);
        } else {
            let outcome = tool_calls::call(engine, &c.scope, call, c.guides.clone(), async {})
                .instrument(step_span.clone())
                .await;
            held |= finish_call(engine, session, run_id, call, outcome).await?;
        }
    }
    let (caller, guides) = (&c.scope, &c.guides);
    let outcomes = futures_util::future::join_all(reads.into_iter().map(|call| async move {
        let slow = slow_notice(engine, session, run_id, &call.name);
        (
            call,
            tool_calls::call(engine, caller, call, guides.clone(), slow).await,
        )
    }))
    .instrument(step_span.clone())
    .await;
    for (call, outcome) in outcomes {
        finish_call(engine, session, run_id, call, outcome).await?;
    }
    if *cancel.borrow() {
        return Ok(Some(End::Cancelled));
    }
    if waiting {
        return Ok(Some(End::RequiresAction));
    }
    if held {
        return Ok(Some(End::AwaitingPlan));
    }
    Ok(None)
}

async fn notice(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    message: &str,
) -> Result<(), crate::store::StoreError> {
    engine
        .emit(
            &session.id,
            run_id,
            event::NOTICE,
            json!({"runId": run_id, "message": message}),
        )
        .await
        .map(|_| ())
}

/// The run a helper works for: its engine, session and id.
#[derive(Clone, Copy)]
struct RunRef<'a> {
    engine: &'a Engine,
    session: &'a SessionRecord,
    run_id: &'a str,
}

/// Why a fast model's answer goes to the full model instead, if it does: it could not take
/// the request, stopped at its output token limit, or asked for more (the marker).
fn escalation(out: &StepOutcome) -> Option<&'static str> {
    let refused = out.error.as_ref().is_some_and(|e| {
        matches!(
            e.kind,
            llm::ErrorKind::ContextTooLong | llm::ErrorKind::BadRequest
        )
    });
    if refused {
        Some("could not take the request")
    } else if out.error.is_some() {
        None
    } else if out.stop_reason == StopReason::MaxTokens {
        Some("stopped at its output token limit")
    } else if out.text.contains(ESCALATE_MARKER) {
        Some("asked for more context")
    } else {
        None
    }
}

/// The request of one attempt: the history fitted to the model's context window (a
/// notice, once per step, says how much was left out), the fast model's instructions when
/// it answers first, and everything redacted. Returns it with the number of redactions.
async fn attempt_request(
    RunRef {
        engine,
        session,
        run_id,
    }: RunRef<'_>,
    adapter: &dyn llm::LlmProvider,
    model: &str,
    fast: bool,
    (system, history, tools): (&str, &[Message], &[llm::ToolSpec]),
    redactor: &crate::redact::Redactor,
    fit_noticed: &mut bool,
) -> Result<(ChatRequest, usize), crate::store::StoreError> {
    let max_tokens = adapter.config().max_tokens;
    let mut messages = history.to_vec();
    if let Some(window) = adapter.context_window(model) {
        let fixed = (system.len()
            + tools
                .iter()
                .map(|t| t.parameters.to_string().len() + t.description.len())
                .sum::<usize>()) as u64
            / 4;
        let budget = window.saturating_sub(u64::from(max_tokens) + fixed);
        let (kept, dropped) = super::context::fit(messages, budget);
        messages = kept;
        if dropped > 0 && !*fit_noticed {
            *fit_noticed = true;
            let text = format!(
                "{dropped} older message(s) were left out to fit the model's context window"
            );
            notice(engine, session, run_id, &text).await?;
        }
    }
    let mut request = ChatRequest {
        model: model.to_owned(),
        system: Some(if fast {
            format!("{system}\n\n{FAST_PROMPT}")
        } else {
            system.to_owned()
        }),
        messages,
        tools: tools.to_vec(),
        metadata: llm::RequestMetadata {
            session: Some(session.id.clone()),
            user: Some(session.user.clone()),
            purpose: Some("chat".into()),
        },
        ..Default::default()
    };
    // Nothing leaves for a provider unredacted (SPEC §1.3).
    let redactions = redactor.request(&mut request);
    Ok((request, redactions))
}

/// Gets one step answered: the current route's provider (its fast model first in frugal
/// mode), failing over to the next route on a hard failure before any output reached the
/// user, and escalating a fast answer to the full model when it stopped at its token limit
/// or asked for more. Every attempt is reserved against the budgets, redacted, settled and
/// audited. `Err` ends the run (a budget refused the call).
// Long because one attempt's parts share its route, adapter, request and reservation; the
// parts with a job of their own are functions (attempt_request, delegate, stream_step,
// end_span, escalate, failover).
async fn answer_step(
    run: RunRef<'_>,
    step: u32,
    routing: &mut Routing,
    (system, history, tools): (&str, &[Message], &[llm::ToolSpec]),
    delegable: &Delegable<'_>,
    cancel: &mut watch::Receiver<bool>,
) -> Result<Result<Answer, End>, crate::store::StoreError> {
    let RunRef {
        engine,
        session,
        run_id,
    } = run;
    let redactor = &routing.redactor.clone();
    let config = engine.config.borrow().clone();
    let catalog = &config.catalog;
    let policy = routing.policy.clone();
    let mut fit_noticed = false;
    loop {
        let route = routing.plan.routes[routing.current].clone();
        let adapter = match routing.adapter(catalog, &session.namespace) {
            Ok(a) => a,
            Err(e) => {
                let model = route
                    .fast_model
                    .clone()
                    .filter(|_| !routing.escalated)
                    .unwrap_or_else(|| route.model.clone());
                if failover(engine, session, run_id, routing, &route, &model, &e).await? {
                    continue;
                }
                return Ok(Err(End::Failed {
                    code: "provider_unavailable",
                    message: e.to_string(),
                    detail: None,
                }));
            }
        };
        // A provider with its own tool loop answers whole: no fast first try to escalate.
        let delegating = adapter.delegates_tools() && !delegable.tools.is_empty();
        let fast = route
            .fast_model
            .clone()
            .filter(|_| !routing.escalated && !adapter.delegates_tools());
        let model = fast.clone().unwrap_or_else(|| route.model.clone());
        if delegating && delegable.planning != crate::crd::Planning::Off {
            return Ok(Err(End::Failed {
                code: "unsupported",
                message: format!(
                    "ChatPolicy {policy} sets runControl.planning, which {} ({}) cannot follow: Claude Code keeps its own tool loop; set planning: off for it, or route the policy to another provider",
                    route.provider,
                    adapter.config().name
                ),
                detail: None,
            }));
        }
        let max_tokens = adapter.config().max_tokens;
        let (mut request, redactions) = attempt_request(
            run,
            adapter.as_ref(),
            &model,
            fast.is_some(),
            (system, history, tools),
            redactor,
            &mut fit_noticed,
        )
        .await?;
        let attempt = Attempt {
            scope: &routing.scope,
            provider: &route.provider,
            model: &model,
            audit: NewDecision {
                policy: Some(policy.clone()),
                ..session_decision(session, run_id)
            },
        };
        let reservation = match engine
            .governor
            .reserve_for(&attempt, adapter.as_ref(), &request, max_tokens, false)
            .await?
        {
            Ok(r) => r,
            Err(exceeded) => {
                return Ok(Err(End::Failed {
                    code: "budget_exceeded",
                    message: exceeded.to_string(),
                    detail: None,
                }));
            }
        };
        let delegated = delegating.then(|| delegate(run, &policy, delegable, &mut request));
        let caller = tool_calls::CallScope {
            session,
            run_id,
            policy: delegable.policy,
            redactor,
            kube: delegable.kube,
            on_behalf: delegable.on_behalf,
            via: "chat",
            model: (route.provider.as_str(), model.as_str()),
            // A provider with its own loop is refused under a plan gate (above).
            planning: crate::crd::Planning::Off,
            offered: &[],
        };
        let delegated = delegated.map(|(rx, grant)| Delegated {
            rx,
            _grant: grant,
            caller: &caller,
            guides: delegable.guides.clone(),
        });
        let started = Instant::now();
        let live = fast.is_none();
        let capture = delegable.policy.object.spec.captures_content();
        let call_span = llm::semconv::span(adapter.as_ref(), &request, true, capture);
        let out = stream_step(
            run,
            adapter.as_ref(),
            &request,
            cancel,
            live,
            redactor,
            delegated,
        )
        .instrument(call_span.clone())
        .await?;
        let latency_ms = started.elapsed().as_millis() as i64;
        end_span(&call_span, &out, capture.then_some(redactor));
        let served = if out.model.is_empty() {
            model.clone()
        } else {
            out.model.clone()
        };
        // The call's books and its audit row, in one transaction.
        let outcome = crate::govern::Outcome {
            usage: out.usage,
            model: served.clone(),
            latency_ms,
            outcome: out
                .error
                .as_ref()
                .map_or("ok", |e| e.kind.as_str())
                .to_owned(),
        };
        let detail = json!({"step": step, "inputTokens": out.usage.input_tokens,
            "outputTokens": out.usage.output_tokens, "latencyMs": latency_ms,
            "toolCalls": out.calls.len() + out.delegated_calls, "redactions": redactions,
            "stopReason": out.stop_reason, "fastModel": fast.is_some(),
            "estimated": out.usage.estimated});
        let alerts = engine
            .governor
            .settle_attempt(&attempt, reservation, &outcome, detail)
            .await?;
        for alert in alerts {
            notice(engine, session, run_id, &alert).await?;
        }
        if *cancel.borrow() {
            return Ok(Ok(Answer {
                step: out,
                provider: route.provider,
                model: served,
            }));
        }
        if let Some(e) = &out.error
            && !out.output_started
            && e.is_retryable()
            && failover(engine, session, run_id, routing, &route, &model, e).await?
        {
            continue;
        }
        if fast.is_some() {
            // A fast model that cannot take the request (a smaller context window, an
            // unsupported parameter) hands it to the full model too.
            if let Some(why) = escalation(&out) {
                routing.escalated = true;
                escalate(run, (&policy, step), &route, &model, why).await?;
                continue;
            }
            // The fast answer stands: the user sees it now.
            if out.error.is_none() {
                send_text(engine, session, run_id, redactor.text(&out.text).0).await?;
            }
        }
        return Ok(Ok(Answer {
            step: out,
            provider: route.provider,
            model: served,
        }));
    }
}

/// The run's own credential for the provider's calls to /mcp, with `request` set to use
/// it: it goes into `stream_step` and is revoked as that returns (the call ended, failed,
/// or was cancelled).
fn delegate(
    run: RunRef<'_>,
    policy: &str,
    delegable: &Delegable<'_>,
    request: &mut ChatRequest,
) -> (
    tokio::sync::mpsc::Receiver<super::delegate::DelegatedCall>,
    super::delegate::Grant,
) {
    let RunRef {
        engine,
        session,
        run_id,
    } = run;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let grant = engine.delegations.grant(super::delegate::Delegation {
        session_id: session.id.clone(),
        run_id: run_id.to_owned(),
        user: session.user.clone(),
        policy: format!("{}/{policy}", session.namespace),
        session_name: session.name.clone(),
        tools: delegable.tools.clone(),
        calls: tx,
    });
    request.mcp = engine
        .local_mcp
        .get()
        .map(|url| llm::claude_code::McpBridge {
            url: url.clone(),
            token: grant.token(),
        });
    request.max_turns = Some(delegable.max_turns);
    request.tools = delegable.tools.clone();
    (rx, grant)
}

/// Ends a provider call's span with what it answered (redacted, when the policy captures
/// content: `capture` is its redactor).
fn end_span(span: &tracing::Span, out: &StepOutcome, capture: Option<&crate::redact::Redactor>) {
    let answered: Option<(String, Vec<ToolCall>)> =
        capture.filter(|_| !span.is_disabled()).map(|redactor| {
            let mut calls = out.calls.clone();
            for c in &mut calls {
                redactor.value(&mut c.input);
            }
            (redactor.text(&out.text).0, calls)
        });
    llm::semconv::end(
        span,
        &out.model,
        out.usage,
        out.error.is_none().then_some(out.stop_reason),
        out.error.as_ref().map(|e| e.kind.as_str()),
        answered.as_ref().map(|(t, c)| (t.as_str(), c.as_slice())),
    );
}

/// Tells the user and the audit log that the fast model `model` hands step `step` to the
/// route's full model, and why.
async fn escalate(
    run: RunRef<'_>,
    (policy, step): (&str, u32),
    route: &route::Route,
    model: &str,
    why: &str,
) -> Result<(), crate::store::StoreError> {
    let RunRef {
        engine,
        session,
        run_id,
    } = run;
    let text = format!(
        "the fast model {}/{model} {why}; {} answers instead",
        route.provider, route.model
    );
    notice(engine, session, run_id, &text).await?;
    engine
        .store
        .record_decision(&NewDecision {
            kind: "escalation".into(),
            policy: Some(policy.to_owned()),
            subject: format!(
                "{}/{model} -> {}/{}",
                route.provider, route.provider, route.model
            ),
            outcome: "escalated".into(),
            detail: json!({"step": step, "reason": why}),
            ..session_decision(session, run_id)
        })
        .await?;
    Ok(())
}

/// Moves `routing` to its next route after `error` on `route`, recording the failover (a
/// `notice`, and the governor's count and audit row); false when there is no next route.
async fn failover(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    routing: &mut Routing,
    route: &route::Route,
    model: &str,
    error: &LlmError,
) -> Result<bool, crate::store::StoreError> {
    let Some(next) = routing.plan.routes.get(routing.current + 1).cloned() else {
        return Ok(false);
    };
    routing.current += 1;
    let next_model = next
        .fast_model
        .clone()
        .filter(|_| !routing.escalated)
        .unwrap_or_else(|| next.model.clone());
    let why = routing.redactor.text(&error.message).0;
    let text = format!(
        "{}/{model} failed before answering ({why}); failing over to {}/{next_model}",
        route.provider, next.provider
    );
    notice(engine, session, run_id, &text).await?;
    let scope = &routing.scope;
    let attempt = Attempt {
        scope,
        provider: &route.provider,
        model,
        audit: NewDecision {
            policy: Some(routing.policy.clone()),
            ..session_decision(session, run_id)
        },
    };
    engine
        .governor
        .fail_over(&attempt, (&next.provider, &next_model), error, &why)
        .await?;
    Ok(true)
}

/// An audit row about `session`'s run `run_id` (kind, policy, subject, outcome and detail
/// to fill in).
fn session_decision(session: &SessionRecord, run_id: &str) -> NewDecision {
    NewDecision {
        namespace: Some(session.namespace.clone()),
        session_id: Some(session.id.clone()),
        run_id: Some(run_id.to_owned()),
        user: Some(session.user.clone()),
        ..Default::default()
    }
}

/// Stores a tool result and announces it.
async fn finish_call(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    call: &ToolCall,
    outcome: crate::tools::Outcome,
) -> Result<bool, crate::store::StoreError> {
    if outcome.held {
        // Its result is a person's decision, written when they make it.
        return Ok(true);
    }
    let message = NewMessage {
        run_id: Some(run_id.to_owned()),
        role: "tool".into(),
        content: outcome.content.clone(),
        tool_call_id: Some(call.id.clone()),
        is_error: outcome.is_error,
        ..Default::default()
    };
    let preview: String = outcome.content.chars().take(200).collect();
    let mut data = json!({"runId": run_id, "callId": call.id, "name": call.name, "ok": !outcome.is_error,
        "isError": outcome.is_error, "durationMs": outcome.duration.as_millis() as u64,
        "truncated": outcome.truncated, "preview": preview});
    if let Some(kind) = outcome.error_kind {
        data["errorKind"] = json!(kind);
    }
    engine
        .append_and_emit(&session.id, &message, event::TOOL_END, data)
        .await?;
    Ok(false)
}

/// What one provider call produced.
#[derive(Default)]
struct StepOutcome {
    /// The whole answer text (after the provider's own calls, if it made any).
    text: String,
    /// Calls the provider made over /mcp during the call (its own tool loop).
    delegated_calls: usize,
    /// The provider's own loop was stopped for a pause or a redirect: the run goes on to
    /// its next step boundary.
    interrupted: bool,
    /// Tool calls, arguments complete.
    calls: Vec<ToolCall>,
    /// Tokens reported.
    usage: llm::Usage,
    /// Model reported.
    model: String,
    /// Why it stopped.
    stop_reason: StopReason,
    /// Whether any of it reached the user (a delta was sent or a tool call received):
    /// after that, a failure ends the run instead of failing over.
    output_started: bool,
    /// The error that ended it, if any.
    error: Option<LlmError>,
}

/// Streams one provider call. `live`: text deltas are redacted, coalesced and sent as they
/// come; otherwise (a frugal fast answer that may yet be escalated) nothing is sent.
async fn stream_step(
    run: RunRef<'_>,
    adapter: &dyn llm::LlmProvider,
    request: &ChatRequest,
    cancel: &mut watch::Receiver<bool>,
    live: bool,
    redactor: &crate::redact::Redactor,
    mut delegated: Option<Delegated<'_>>,
) -> Result<StepOutcome, crate::store::StoreError> {
    let RunRef {
        engine,
        session,
        run_id,
    } = run;
    let mut out = StepOutcome::default();
    // With a provider's own tool loop: how much of `out.text` is stored already (before
    // the calls it made).
    let mut stored = 0;
    // The stream opens with its first event, and a provider's own tool loop may call
    // Kortex's tools before any (a turn that opens with a tool call): those calls are served
    // meanwhile, or the provider would wait for them and the run for the provider.
    let mut opening = std::pin::pin!(adapter.stream(request));
    let mut stream = loop {
        tokio::select! {
            s = &mut opening => match s {
                Ok(s) => break s,
                Err(e) => {
                    out.error = Some(e);
                    return Ok(out);
                }
            },
            Some(asked) = next_delegated(&mut delegated) => {
                if let Some(d) = &delegated
                    && !serve_delegated(engine, session, run_id, d, asked, &mut out, &mut stored).await?
                {
                    return Ok(out);
                }
            }
            _ = cancel.changed() => return Ok(out),
        }
    };
    // What is sent never shows what the stored copy redacts: text waits while a
    // credential or personal data could still be forming at its end.
    let mut pending = crate::redact::StreamRedactor::new(redactor);
    let mut flush_at: Option<tokio::time::Instant> = None;
    // The first text goes out at once (time to first token); later text is coalesced.
    let mut first = true;
    loop {
        let next = tokio::select! {
            item = stream.next() => item,
            Some(asked) = next_delegated(&mut delegated) => {
                if let Some(d) = &delegated {
                    // What the model said before the call is final: out before the call.
                    flush_at = None;
                    send_text(engine, session, run_id, pending.finish()).await?;
                    if !serve_delegated(engine, session, run_id, d, asked, &mut out, &mut stored).await? {
                        break;
                    }
                }
                continue;
            }
            // Dropping the stream closes the provider request.
            _ = cancel.changed() => break,
            _ = async { if let Some(at) = flush_at { tokio::time::sleep_until(at).await } else { std::future::pending::<()>().await } } => {
                flush_at = None;
                send_text(engine, session, run_id, pending.ready()).await?;
                if !pending.is_empty() {
                    flush_at = Some(tokio::time::Instant::now() + COALESCE);
                }
                continue;
            }
        };
        match next {
            Some(Ok(StreamEvent::TextDelta(t))) => {
                out.text.push_str(&t);
                if live {
                    out.output_started = true;
                    pending.push(&t);
                    let delay = if first { Duration::ZERO } else { COALESCE };
                    first = false;
                    flush_at.get_or_insert_with(|| tokio::time::Instant::now() + delay);
                    if pending.len() >= MAX_DELTA_BYTES {
                        send_text(engine, session, run_id, pending.ready()).await?;
                    }
                }
            }
            Some(Ok(StreamEvent::ToolCall(c))) => {
                out.output_started |= live;
                out.calls.push(c);
            }
            Some(Ok(StreamEvent::Warning(w))) => {
                notice(engine, session, run_id, &w).await?;
            }
            // Chat runs send no `thinking` setting: nothing to keep.
            Some(Ok(StreamEvent::Thinking(_))) => {}
            Some(Ok(StreamEvent::Done {
                usage,
                model,
                stop_reason,
            })) => {
                out.usage = usage;
                out.model = model;
                out.stop_reason = stop_reason;
            }
            Some(Err(e)) => {
                out.error = Some(e);
                break;
            }
            None => break,
        }
    }
    send_text(engine, session, run_id, pending.finish()).await?;
    // What came before the provider's own calls is stored with them; the rest is the
    // answer.
    if stored > 0 {
        out.text = out.text.split_off(stored);
    }
    Ok(out)
}

/// The next call the provider's process made over /mcp (never, without a delegation).
async fn next_delegated(
    delegated: &mut Option<Delegated<'_>>,
) -> Option<super::delegate::DelegatedCall> {
    match delegated {
        Some(d) => d.rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Serves one call the provider's process made over /mcp, after the text streamed before
/// it (`out.text[stored..]`, already sent), which is stored with the call. A pause or a
/// redirect asked meanwhile stops the provider's loop instead (the call is not made):
/// `false`, the step ends, and the run's next step parks or takes the redirect in.
async fn serve_delegated(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    d: &Delegated<'_>,
    asked: super::delegate::DelegatedCall,
    out: &mut StepOutcome,
    stored: &mut usize,
) -> Result<bool, crate::store::StoreError> {
    if engine.store.run_status(run_id).await? == Some(crate::store::RunState::Pausing)
        || engine.store.redirect_pending(run_id).await?
    {
        let _ = asked.reply.send(crate::tools::Outcome::refused(
            "not made: the user paused or redirected the run".to_owned(),
            "cancelled",
            Duration::ZERO,
        ));
        out.interrupted = true;
        return Ok(false);
    }
    out.output_started = true;
    let before = d.caller.redactor.text(&out.text[*stored..]).0;
    *stored = out.text.len();
    let outcome = delegated_call(engine, session, run_id, d, before, asked.call).await?;
    out.delegated_calls += 1;
    let _ = asked.reply.send(outcome);
    Ok(true)
}

/// The notice a tool call that is taking long sends (once, after thirty seconds).
async fn slow_notice(engine: &Engine, session: &SessionRecord, run_id: &str, tool: &str) {
    let message = format!("{tool} is taking longer than usual…");
    let _ = engine
        .emit(
            &session.id,
            run_id,
            event::NOTICE,
            json!({"runId": run_id, "message": message}),
        )
        .await;
}

/// Sends streamed text (nothing when there is none).
async fn send_text(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    text: String,
) -> Result<(), crate::store::StoreError> {
    if !text.is_empty() {
        engine
            .emit(
                &session.id,
                run_id,
                event::TEXT_DELTA,
                json!({"runId": run_id, "text": text}),
            )
            .await?;
    }
    Ok(())
}

/// The run's side of a provider's own tool loop: its tools, and who calls them.
struct Delegable<'a> {
    policy: &'a crate::catalog::PolicyEntry,
    kube: &'a crate::tools::KubeIdentity,
    on_behalf: Option<&'a crate::tools::mcp_oauth::SubjectToken>,
    guides: std::sync::Arc<[crate::tools::guides::Guide]>,
    planning: crate::crd::Planning,
    /// Turns left of the policy's `maxToolDepth`.
    max_turns: u32,
    /// What it may call over /mcp.
    tools: Vec<llm::ToolSpec>,
}

/// The calls a provider's process makes during one provider call.
struct Delegated<'a> {
    rx: tokio::sync::mpsc::Receiver<super::delegate::DelegatedCall>,
    /// The run's credential for them: revoked when the provider call ends.
    _grant: super::delegate::Grant,
    caller: &'a tool_calls::CallScope<'a>,
    guides: std::sync::Arc<[crate::tools::guides::Guide]>,
}

/// Carries out one call a provider's process made over /mcp, as a call of this run: the
/// text before it and the call are stored, `tool.start`, the call through the one tool
/// path, its result stored, `tool.end`.
async fn delegated_call(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    delegated: &Delegated<'_>,
    before: String,
    mut call: ToolCall,
) -> Result<crate::tools::Outcome, crate::store::StoreError> {
    delegated.caller.redactor.value(&mut call.input);
    engine
        .append(
            &session.id,
            &NewMessage {
                run_id: Some(run_id.to_owned()),
                role: "assistant".into(),
                content: before,
                tool_calls: Some(json!([call])),
                ..Default::default()
            },
        )
        .await?;
    let start = json!({"runId": run_id, "callId": call.id, "name": call.name, "input": call.input});
    engine
        .emit(&session.id, run_id, event::TOOL_START, start)
        .await?;
    let outcome = tool_calls::call(
        engine,
        delegated.caller,
        &call,
        delegated.guides.clone(),
        slow_notice(engine, session, run_id, &call.name),
    )
    .await;
    finish_call(engine, session, run_id, &call, outcome.clone()).await?;
    Ok(outcome)
}
