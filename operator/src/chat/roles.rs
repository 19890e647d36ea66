//! The small jobs of a policy's other model roles (SPEC §3 Roles): `triage` decides
//! whether a question needs tools, `summarize` writes the session's title — a one-line
//! incident summary that `get_incident_history` searches — suggests follow-up questions
//! after a completed run, and summarizes an investigation handed over to someone else. All go through the same routes,
//! redaction, budgets and accounting as the chat; a failure of either never fails the run.

use super::Engine;
use crate::catalog::PolicyEntry;
use crate::govern::attempt::Attempt;
use crate::govern::route::{self, Role};
use crate::govern::{Outcome, Scope};
use crate::llm::{self, ChatRequest, Message};
use crate::store::{NewDecision, SessionRecord, StoreError};
use serde_json::json;
use std::time::Instant;

const TRIAGE_PROMPT: &str = "Classify the user's latest message to an assistant for Kubernetes operations. Reply with one word: TOOLS if a good answer needs live data (cluster objects, logs, events, metrics, past incidents), DIRECT if it can be answered from general knowledge and the conversation alone.";

const TITLE_PROMPT: &str = "Write a title of at most 12 words for this operations conversation that summarizes the incident: the affected workload or service, the symptom, and the cause or action if known. Reply with the title only, without quotes.";

const FOLLOW_UPS_PROMPT: &str = "Suggest 3 to 5 short follow-up questions the user could ask next in this Kubernetes operations investigation, each useful on its own. Reply with one question per line and nothing else.";

const HANDOVER_PROMPT: &str = "An on-call engineer is handing this Kubernetes operations investigation over to a colleague. Write a short hand-over summary for the colleague, in plain text with these headings: Problem (what was asked and what is affected), Findings (the evidence found so far, naming the workloads, errors and metrics), Ruled out, Open (pending proposals, unanswered questions), Next steps. Only state what the conversation shows; say so where something is unknown.";

/// Longest conversation excerpt sent for a hand-over summary.
const HANDOVER_CONTEXT: usize = 16_000;

/// Longest conversation excerpt sent for a title or follow-ups.
const TITLE_CONTEXT: usize = 8_000;

/// The questions and answers of a session (no tool results), at most `limit` bytes.
fn excerpt(messages: &[crate::store::MessageRecord], limit: usize) -> String {
    let mut transcript = String::new();
    for m in messages
        .iter()
        .filter(|m| m.role != "tool" && !m.content.is_empty())
    {
        transcript.push_str(if m.role == "user" {
            "User: "
        } else {
            "Assistant: "
        });
        transcript.push_str(&m.content);
        transcript.push_str("\n\n");
    }
    if transcript.len() > limit {
        // Keep the end: the latest answer is what follow-ups build on.
        let mut cut = transcript.len() - limit;
        while !transcript.is_char_boundary(cut) {
            cut += 1;
        }
        transcript = transcript.split_off(cut);
    }
    transcript
}

/// The follow-up questions in a model's answer: one a line, list marks and quotes
/// stripped, at most 5 of at most 200 characters.
pub fn questions(answer: &str) -> Vec<String> {
    answer
        .lines()
        .map(|l| {
            l.trim()
                .trim_start_matches(|c: char| {
                    c.is_ascii_digit() || matches!(c, '-' | '*' | '.' | ')' | '•')
                })
                .trim()
                .trim_matches(|c| c == '"' || c == '\'')
                .trim()
        })
        .filter(|l| !l.is_empty() && l.chars().count() <= 200)
        .take(5)
        .map(str::to_owned)
        .collect()
}

/// After a completed run, 3–5 suggested next questions from the policy's `summarize`
/// model: a `follow_ups` event `{runId, questions}`. Only when the policy sets that role.
pub async fn follow_ups(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    policy: &PolicyEntry,
) -> Result<(), StoreError> {
    if policy.object.spec.models.summarize.is_none() {
        return Ok(());
    }
    let messages = engine.store.list_messages(&session.id).await?;
    let Some(answer) = side_call(
        engine,
        session,
        Some(run_id),
        policy,
        Role::Summarize,
        Ask {
            system: FOLLOW_UPS_PROMPT,
            content: excerpt(&messages, TITLE_CONTEXT),
            max_tokens: 200,
        },
    )
    .await?
    else {
        return Ok(());
    };
    let questions = questions(&answer);
    if questions.is_empty() {
        return Ok(());
    }
    engine
        .emit(
            &session.id,
            run_id,
            super::event::FOLLOW_UPS,
            json!({"runId": run_id, "questions": questions}),
        )
        .await?;
    Ok(())
}

/// A summary of the investigation so far for the person it is handed over to, by the
/// policy's `summarize` model (`docs/chat.md#hand-over`), acting for `session.user` (who
/// hands over). `None` when the policy has no `summarize` model or no route answered.
pub async fn handover_summary(
    engine: &Engine,
    session: &SessionRecord,
    policy: &PolicyEntry,
    note: &str,
) -> Result<Option<String>, StoreError> {
    if policy.object.spec.models.summarize.is_none() {
        return Ok(None);
    }
    let messages = engine.store.list_messages(&session.id).await?;
    let mut content = excerpt(&messages, HANDOVER_CONTEXT);
    if content.is_empty() {
        return Ok(None);
    }
    content.push_str(&format!(
        "The engineer handing over ({}) wrote: {note}",
        session.user
    ));
    let answer = side_call(
        engine,
        session,
        None,
        policy,
        Role::Summarize,
        Ask {
            system: HANDOVER_PROMPT,
            content,
            max_tokens: 700,
        },
    )
    .await?;
    Ok(answer
        .map(|a| a.trim().to_owned())
        .filter(|a| !a.is_empty()))
}

/// Whether the first step of a new question should be offered tools: asks the policy's
/// `triage` model when it has one; yes when it has none or triage fails.
pub async fn needs_tools(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    policy: &PolicyEntry,
) -> Result<bool, StoreError> {
    if policy.object.spec.models.triage.is_none() {
        return Ok(true);
    }
    let messages = engine.store.list_messages(&session.id).await?;
    let Some(question) = messages.iter().rev().find(|m| m.role == "user") else {
        return Ok(true);
    };
    let answer = side_call(
        engine,
        session,
        Some(run_id),
        policy,
        Role::Triage,
        Ask {
            system: TRIAGE_PROMPT,
            content: question.content.clone(),
            max_tokens: 8,
        },
    )
    .await?;
    Ok(!answer.is_some_and(|a| a.to_ascii_uppercase().contains("DIRECT")))
}

/// Gives session `session` a title from its conversation, unless it has one.
pub async fn title(
    engine: &Engine,
    session: &SessionRecord,
    policy: &PolicyEntry,
) -> Result<(), StoreError> {
    if session.title.is_some() {
        return Ok(());
    }
    let messages = engine.store.list_messages(&session.id).await?;
    // The start of the conversation says what the incident is.
    let mut transcript = excerpt(&messages, usize::MAX);
    if transcript.len() > TITLE_CONTEXT {
        let mut cut = TITLE_CONTEXT;
        while !transcript.is_char_boundary(cut) {
            cut -= 1;
        }
        transcript.truncate(cut);
    }
    let Some(answer) = side_call(
        engine,
        session,
        None,
        policy,
        Role::Summarize,
        Ask {
            system: TITLE_PROMPT,
            content: transcript,
            max_tokens: 48,
        },
    )
    .await?
    else {
        return Ok(());
    };
    let title: String = answer
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .trim_matches(|c| c == '"' || c == '\'' || c == '#' || c == '*')
        .trim()
        .chars()
        .take(120)
        .collect();
    if !title.is_empty() {
        engine.store.set_title(&session.id, &title).await?;
    }
    Ok(())
}

/// What a side job asks: its instructions, the one user message, and its output limit.
struct Ask<'a> {
    system: &'a str,
    content: String,
    max_tokens: u32,
}

/// One non-streamed call for `role` under `policy`, through the routes in failover order;
/// `None` when no route answered (the reasons are in the audit log).
async fn side_call(
    engine: &Engine,
    session: &SessionRecord,
    run_id: Option<&str>,
    policy: &PolicyEntry,
    role: Role,
    ask: Ask<'_>,
) -> Result<Option<String>, StoreError> {
    let config = engine.config.borrow().clone();
    let catalog = &config.catalog;
    let plan = route::plan(catalog, &session.namespace, policy, role);
    let source = match role {
        Role::Triage => "triage",
        _ => "summarize",
    };
    let scope = Scope::new(policy, &session.user, Some(&session.id), source);
    let redactor = crate::redact::Redactor::for_policy(catalog, policy);
    let audit = NewDecision {
        namespace: Some(session.namespace.clone()),
        session_id: Some(session.id.clone()),
        run_id: run_id.map(str::to_owned),
        user: Some(session.user.clone()),
        policy: policy.object.metadata.name.clone(),
        detail: json!({"role": role}),
        ..Default::default()
    };
    for (i, route) in plan.routes.iter().enumerate() {
        let Some(adapter) = catalog
            .provider(&session.namespace, &route.provider)
            .and_then(|entry| llm::build(entry).ok())
        else {
            continue;
        };
        let mut request = ChatRequest {
            model: route.model.clone(),
            system: Some(ask.system.to_owned()),
            messages: vec![Message::User {
                content: ask.content.clone(),
            }],
            max_tokens: Some(ask.max_tokens),
            metadata: llm::RequestMetadata {
                session: Some(session.id.clone()),
                user: Some(session.user.clone()),
                purpose: Some(role.as_str().into()),
            },
            ..Default::default()
        };
        let redactions = redactor.request(&mut request);
        let attempt = Attempt {
            scope: &scope,
            provider: &route.provider,
            model: &route.model,
            audit: audit.clone(),
        };
        let Ok(reservation) = engine
            .governor
            .reserve_for(&attempt, adapter.as_ref(), &request, ask.max_tokens, false)
            .await?
        else {
            // A spent budget: the job is skipped (the chat itself reports the budget).
            return Ok(None);
        };
        let started = Instant::now();
        let result = adapter.complete(&request).await;
        let latency_ms = started.elapsed().as_millis() as i64;
        let (usage, model, outcome) = match &result {
            Ok(r) => (r.usage, r.model.clone(), "ok".to_owned()),
            Err(e) => (
                llm::Usage::default(),
                String::new(),
                e.kind.as_str().to_owned(),
            ),
        };
        let outcome = Outcome {
            usage,
            model,
            latency_ms,
            outcome,
        };
        let detail = json!({"inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens, "latencyMs": latency_ms,
            "redactions": redactions, "estimated": usage.estimated});
        engine
            .governor
            .settle_attempt(&attempt, reservation, &outcome, detail)
            .await?;
        match result {
            Ok(r) => return Ok(Some(redactor.text(&r.text).0)),
            Err(e) if e.is_retryable() => {
                if let Some(next) = plan.routes.get(i + 1) {
                    let why = redactor.text(&e.message).0;
                    engine
                        .governor
                        .fail_over(&attempt, (&next.provider, &next.model), &e, &why)
                        .await?;
                }
            }
            Err(_) => return Ok(None),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::questions;

    #[test]
    fn follow_up_questions_are_read_one_a_line() {
        let answer = "1. What changed in the last deploy?\n- \"Are other services slow?\"\n\n* Is the database healthy?\nWhy now?\nA?\nB?\n";
        assert_eq!(
            questions(answer),
            [
                "What changed in the last deploy?",
                "Are other services slow?",
                "Is the database healthy?",
                "Why now?",
                "A?"
            ]
        );
        assert!(questions("\n  \n").is_empty());
    }
}
