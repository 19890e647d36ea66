//! One run: the loop of provider steps for a user's message, with its events.

use super::{Engine, event};
use crate::llm::{self, ChatRequest, LlmError, Message, StreamEvent, ToolCall};
use crate::store::{NewDecision, NewMessage, SessionRecord, UsageEvent};
use futures_util::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Text deltas are coalesced for about this long before they are persisted and sent.
pub const COALESCE: Duration = Duration::from_millis(50);

/// The system prompt every session starts from; a policy's `systemPrompt` is appended.
pub const BASE_PROMPT: &str = "You are Kortex, an assistant for platform and operations teams running Kubernetes. \
Investigate with the tools you are given, say which tool showed what, and never claim to have changed anything: \
you can only read, and propose actions for a human to approve.";

/// How a run ended.
enum End {
    Completed,
    /// Waiting for the client to run its dynamic tools.
    RequiresAction,
    Cancelled,
    Failed {
        code: &'static str,
        message: String,
    },
}

/// Runs to the end and records the outcome (session status, run row, lifecycle event).
pub async fn run(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    resume: bool,
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
    let end = match steps(engine, session, run_id, &mut cancel).await {
        Ok(end) => end,
        Err(e) => End::Failed {
            code: "internal",
            message: format!("the run could not be stored: {e}"),
        },
    };
    let (state, session_status, reason) = match &end {
        End::Completed => ("completed", "idle", None),
        End::RequiresAction => ("requires_action", "requires_action", None),
        End::Cancelled => (
            "cancelled",
            "idle",
            Some("cancelled by the user".to_owned()),
        ),
        End::Failed { code, message } => {
            let _ = engine
                .emit(
                    &session.id,
                    run_id,
                    event::ERROR,
                    json!({"runId": run_id, "code": code, "message": message}),
                )
                .await;
            ("failed", "failed", Some(message.clone()))
        }
    };
    // A transcript never keeps a tool call without a result: the next provider call would
    // be refused.
    if matches!(end, End::Failed { .. } | End::Cancelled) {
        let why = format!("no result: {}", reason.clone().unwrap_or_default());
        if let Err(e) = super::answer_pending(engine, &session.id, run_id, &why).await {
            tracing::error!(run = run_id, error = %e, "cannot answer pending tool calls");
        }
    }
    // Only the run that still owns the session ends it (another replica may have failed it
    // as stale meanwhile).
    match engine
        .store
        .finish_run(run_id, state, reason.as_deref())
        .await
    {
        Ok(true) => {
            if let Err(e) = engine
                .store
                .transition_session(&session.id, &["running"], session_status)
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
    let mut data = json!({"runId": run_id, "state": state});
    if let Some(r) = reason {
        data["reason"] = json!(r);
    }
    let _ = engine
        .emit(&session.id, run_id, event::RUN_LIFECYCLE, data)
        .await;
}

/// The conversation as stored, in provider-agnostic form.
fn history(messages: &[crate::store::MessageRecord]) -> Vec<Message> {
    messages
        .iter()
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

async fn steps(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Result<End, crate::store::StoreError> {
    let config = engine.config.borrow().clone();
    let catalog = &config.catalog;
    // The policy is matched again on every run: configuration may have changed.
    let Some(policy) = catalog.match_policy(&session.namespace, &session.name) else {
        return Ok(End::Failed {
            code: "no_matching_policy",
            message: format!(
                "no ChatPolicy in namespace {} matches session {}",
                session.namespace, session.name
            ),
        });
    };
    let policy_name = policy.object.metadata.name.clone().unwrap_or_default();
    let spec = &policy.object.spec;
    let kube = engine.kube_identity(&session.id, spec.run_tools_as_user);
    let (provider_name, model) =
        catalog.role_target(&session.namespace, policy, spec.models.default.as_deref());
    let Some(entry) = catalog
        .provider(&session.namespace, &provider_name)
        .filter(|e| e.available)
    else {
        return Ok(End::Failed {
            code: "provider_unavailable",
            message: format!(
                "LLMProvider {provider_name} of ChatPolicy {policy_name} is not available; see GET /api/v1/llm/providers"
            ),
        });
    };
    let adapter = match llm::build(entry) {
        Ok(a) => a,
        Err(e) => {
            return Ok(End::Failed {
                code: "provider_unavailable",
                message: e.to_string(),
            });
        }
    };
    let model = model
        .or_else(|| adapter.default_model().map(str::to_owned))
        .unwrap_or_default();
    let system = match spec.system_prompt.as_deref() {
        Some(extra) if !extra.trim().is_empty() => format!("{BASE_PROMPT}\n\n{extra}"),
        _ => BASE_PROMPT.to_owned(),
    };

    // Client-executed tools declared by the session, as far as the policy allows them now.
    let dynamic: Vec<llm::ToolSpec> =
        serde_json::from_value::<Vec<llm::ToolSpec>>(session.dynamic_tools.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| crate::glob::allowed(&spec.tools.allow, &spec.tools.deny, &t.name))
            .collect();
    // A resumed run (after dynamic tool results) continues its step count.
    let used = engine
        .store
        .list_messages(&session.id)
        .await?
        .iter()
        .filter(|m| m.role == "assistant" && m.run_id.as_deref() == Some(run_id))
        .count() as u32;
    for step in (used + 1)..=spec.max_tool_depth {
        if *cancel.borrow() {
            return Ok(End::Cancelled);
        }
        engine
            .emit(
                &session.id,
                run_id,
                event::STEP_BOUNDARY,
                json!({"runId": run_id, "step": step}),
            )
            .await?;
        let mut messages = history(&engine.store.list_messages(&session.id).await?);
        let tools: Vec<llm::ToolSpec> = engine
            .router
            .offered(policy, session, &kube)
            .into_iter()
            .chain(dynamic.iter().cloned())
            .chain(super::proposals::spec(policy))
            .collect();
        if let Some(window) = adapter.context_window(&model) {
            let fixed = (system.len()
                + tools
                    .iter()
                    .map(|t| t.parameters.to_string().len() + t.description.len())
                    .sum::<usize>()) as u64
                / 4;
            let budget = window.saturating_sub(u64::from(entry.max_tokens()) + fixed);
            let (kept, dropped) = super::context::fit(messages, budget);
            messages = kept;
            if dropped > 0 {
                let notice = format!(
                    "{dropped} older message(s) were left out to fit the model's context window"
                );
                engine
                    .emit(
                        &session.id,
                        run_id,
                        event::NOTICE,
                        json!({"runId": run_id, "message": notice}),
                    )
                    .await?;
            }
        }
        let request = ChatRequest {
            model: model.clone(),
            system: Some(system.clone()),
            messages,
            tools,
            metadata: llm::RequestMetadata {
                session: Some(session.id.clone()),
                user: Some(session.user.clone()),
                purpose: Some("chat".into()),
            },
            ..Default::default()
        };
        let started = Instant::now();
        let outcome =
            stream_step(engine, session, run_id, adapter.as_ref(), &request, cancel).await?;
        if *cancel.borrow() {
            // Keep what the model had said when the user cancelled.
            if !outcome.0.is_empty() {
                let partial = NewMessage {
                    run_id: Some(run_id.to_owned()),
                    role: "assistant".into(),
                    content: outcome.0.clone(),
                    ..Default::default()
                };
                engine.store.append_message(&session.id, &partial).await?;
            }
            return Ok(End::Cancelled);
        }
        let latency_ms = started.elapsed().as_millis() as i64;
        let (text, calls, done, error) = outcome;
        let (usage, answered_model) = done.clone().unwrap_or_default();
        let served_model = if answered_model.is_empty() {
            model.clone()
        } else {
            answered_model
        };
        engine
            .store
            .record_usage(&UsageEvent {
                at: crate::store::now_ms(),
                source: "chat".into(),
                policy: policy_name.clone(),
                session_id: Some(session.id.clone()),
                user: session.user.clone(),
                provider: provider_name.clone(),
                model: served_model.clone(),
                input_tokens: usage.input_tokens as i64,
                output_tokens: usage.output_tokens as i64,
                cost_usd: adapter.cost_usd(&served_model, usage),
                latency_ms,
                outcome: error
                    .as_ref()
                    .map_or("ok".to_owned(), |e| e.kind.as_str().to_owned()),
            })
            .await?;
        engine
            .store
            .record_decision(&NewDecision {
                kind: "llm_call".into(),
                namespace: Some(session.namespace.clone()),
                session_id: Some(session.id.clone()),
                run_id: Some(run_id.to_owned()),
                user: Some(session.user.clone()),
                policy: Some(policy_name.clone()),
                subject: format!("{provider_name}/{served_model}"),
                outcome: error.as_ref().map_or("ok".to_owned(), |e| e.kind.as_str().to_owned()),
                detail: json!({"step": step, "inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
                    "latencyMs": latency_ms, "toolCalls": calls.len()}),
            })
            .await?;
        if !text.is_empty() || !calls.is_empty() {
            engine
                .store
                .append_message(
                    &session.id,
                    &NewMessage {
                        run_id: Some(run_id.to_owned()),
                        role: "assistant".into(),
                        content: text,
                        tool_calls: (!calls.is_empty()).then(|| json!(calls)),
                        ..Default::default()
                    },
                )
                .await?;
        }
        if let Some(e) = error {
            return Ok(End::Failed {
                code: "provider_error",
                message: e.to_string(),
            });
        }
        if calls.is_empty() {
            return Ok(End::Completed);
        }
        // Dynamic tools wait for the client; propose_action runs here; every other call goes
        // through the router, all of them at once.
        let mut waiting = false;
        let mut routed = Vec::new();
        for call in &calls {
            let start =
                json!({"runId": run_id, "callId": call.id, "name": call.name, "input": call.input});
            engine
                .emit(&session.id, run_id, event::TOOL_START, start)
                .await?;
            if dynamic.iter().any(|t| t.name == call.name) {
                waiting = true;
            } else if call.name == super::proposals::TOOL
                && super::proposals::spec(policy).is_some()
            {
                let started = Instant::now();
                let model = (provider_name.as_str(), served_model.as_str());
                let outcome = match super::proposals::propose(
                    engine,
                    session,
                    run_id,
                    policy,
                    model,
                    &call.input,
                )
                .await
                {
                    Ok(v) => crate::tools::Outcome {
                        content: v.to_string(),
                        is_error: false,
                        error_kind: None,
                        truncated: false,
                        duration: started.elapsed(),
                    },
                    Err(e) => crate::tools::Outcome {
                        content: e,
                        is_error: true,
                        error_kind: Some("validation"),
                        truncated: false,
                        duration: started.elapsed(),
                    },
                };
                finish_call(engine, session, run_id, call, outcome).await?;
            } else {
                routed.push(call);
            }
        }
        let redactor = &catalog.redactor;
        let kube = &kube;
        let outcomes = futures_util::future::join_all(routed.into_iter().map(|call| async move {
            let ctx = crate::tools::ToolContext {
                store: engine.store.clone(),
                session: session.clone(),
                run_id: run_id.to_owned(),
                redactor: redactor.clone(),
                kube: kube.clone(),
            };
            let slow = async {
                let message = format!("{} is taking longer than usual…", call.name);
                let _ = engine
                    .emit(
                        &session.id,
                        run_id,
                        event::NOTICE,
                        json!({"runId": run_id, "message": message}),
                    )
                    .await;
            };
            (call, engine.router.execute(ctx, call, policy, slow).await)
        }))
        .await;
        for (call, outcome) in outcomes {
            finish_call(engine, session, run_id, call, outcome).await?;
        }
        if *cancel.borrow() {
            return Ok(End::Cancelled);
        }
        if waiting {
            return Ok(End::RequiresAction);
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
        .store
        .append_message(
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

/// Stores a tool result and announces it.
async fn finish_call(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    call: &ToolCall,
    outcome: crate::tools::Outcome,
) -> Result<(), crate::store::StoreError> {
    let message = NewMessage {
        run_id: Some(run_id.to_owned()),
        role: "tool".into(),
        content: outcome.content.clone(),
        tool_call_id: Some(call.id.clone()),
        is_error: outcome.is_error,
        ..Default::default()
    };
    engine.store.append_message(&session.id, &message).await?;
    let preview: String = outcome.content.chars().take(200).collect();
    let mut data = json!({"runId": run_id, "callId": call.id, "name": call.name, "ok": !outcome.is_error,
        "isError": outcome.is_error, "durationMs": outcome.duration.as_millis() as u64,
        "truncated": outcome.truncated, "preview": preview});
    if let Some(kind) = outcome.error_kind {
        data["errorKind"] = json!(kind);
    }
    engine
        .emit(&session.id, run_id, event::TOOL_END, data)
        .await?;
    Ok(())
}

type StepOutcome = (
    String,
    Vec<ToolCall>,
    Option<(llm::Usage, String)>,
    Option<LlmError>,
);

/// Streams one provider call, emitting coalesced text deltas; returns the text, the tool
/// calls, usage and model, and the error that ended it, if any.
async fn stream_step(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    adapter: &dyn llm::LlmProvider,
    request: &ChatRequest,
    cancel: &mut watch::Receiver<bool>,
) -> Result<StepOutcome, crate::store::StoreError> {
    let mut stream = tokio::select! {
        s = adapter.stream(request) => match s {
            Ok(s) => s,
            Err(e) => return Ok((String::new(), Vec::new(), None, Some(e))),
        },
        _ = cancel.changed() => return Ok((String::new(), Vec::new(), None, None)),
    };
    let (mut text, mut calls, mut done, mut error) = (String::new(), Vec::new(), None, None);
    let mut pending = String::new();
    let mut flush_at: Option<tokio::time::Instant> = None;
    loop {
        let next = tokio::select! {
            item = stream.next() => item,
            // Dropping the stream closes the provider request.
            _ = cancel.changed() => break,
            _ = async { if let Some(at) = flush_at { tokio::time::sleep_until(at).await } else { std::future::pending::<()>().await } } => {
                let chunk = std::mem::take(&mut pending);
                flush_at = None;
                engine.emit(&session.id, run_id, event::TEXT_DELTA, json!({"runId": run_id, "text": chunk})).await?;
                continue;
            }
        };
        match next {
            Some(Ok(StreamEvent::TextDelta(t))) => {
                text.push_str(&t);
                pending.push_str(&t);
                flush_at.get_or_insert_with(|| tokio::time::Instant::now() + COALESCE);
            }
            Some(Ok(StreamEvent::ToolCall(c))) => calls.push(c),
            Some(Ok(StreamEvent::Warning(w))) => {
                engine
                    .emit(
                        &session.id,
                        run_id,
                        event::NOTICE,
                        json!({"runId": run_id, "message": w}),
                    )
                    .await?;
            }
            Some(Ok(StreamEvent::Done { usage, model, .. })) => done = Some((usage, model)),
            Some(Err(e)) => {
                error = Some(e);
                break;
            }
            None => break,
        }
    }
    if !pending.is_empty() {
        engine
            .emit(
                &session.id,
                run_id,
                event::TEXT_DELTA,
                json!({"runId": run_id, "text": pending}),
            )
            .await?;
    }
    Ok((text, calls, done, error))
}
