//! `get_incident_history`: past sessions and proposals (with their outcomes) that match a
//! free-text query, from the database.

use super::{Tool, ToolContext, ToolError, ToolFuture, window};
use crate::llm::ToolSpec;
use crate::store::IncidentQuery;
use serde_json::{Value, json};
use std::time::Duration;

/// Default look-back.
const DEFAULT_WINDOW: &str = "last 90d";
/// Longest excerpt of a question, answer or rationale.
const EXCERPT: usize = 600;

/// The tool.
pub struct IncidentHistory;

impl Tool for IncidentHistory {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_incident_history".into(),
            description: "Search your own past chat sessions (in this namespace) and the action proposals raised by any session of this namespace (with their decisions and outcomes) for incidents similar to the current one. Every word of `query` must match (case-insensitive) a session's name, title, a question or an answer, or a proposal's action, target, rationale or outcome. Use it early to learn how a similar problem was handled before.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 200,
                        "description": "Words to look for, e.g. 'checkout OOMKilled'. At most 4 words are used."},
                    "namespace": {"type": "string", "maxLength": 253, "description": "Only proposals acting on objects of this namespace."},
                    "target": {"type": "string", "maxLength": 253, "description": "Only proposals whose target mentions this, e.g. a Deployment name."},
                    "window": {"type": "string", "maxLength": 100, "description": format!("How far back to look (default 'last 90d'): {}.", window::WINDOW_HELP)},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10, "description": "Most sessions and most proposals returned."}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        }
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (Duration::from_secs(5), Duration::from_secs(30))
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        Box::pin(async move {
            let text = |k: &str| input[k].as_str().map(str::to_owned);
            let window = window::parse(
                input["window"].as_str().unwrap_or(DEFAULT_WINDOW),
                jiff::Timestamp::now(),
            )
            .map_err(ToolError::Validation)?;
            let words: Vec<String> = text("query")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            if words.is_empty() {
                return Err(ToolError::Validation("query has no words".into()));
            }
            let ignored = words.len().saturating_sub(IncidentQuery::MAX_WORDS);
            let query = IncidentQuery {
                words,
                namespace: text("namespace").filter(|s| !s.is_empty()),
                // Sessions are private to their user, and a policy's sessions never see
                // another namespace's (whose provider or privacy rules may differ).
                session_namespace: Some(ctx.session.namespace.clone()),
                user: Some(ctx.session.user.clone()),
                target: text("target").filter(|s| !s.is_empty()),
                since: window.start.as_millisecond(),
                until: window.end.as_millisecond(),
                exclude_session: Some(ctx.session.id.clone()),
                limit: input["limit"].as_i64().unwrap_or(10),
            };
            let (sessions, proposals) = ctx
                .store
                .search_incidents(&query)
                .await
                .map_err(|e| ToolError::Upstream(format!("the database failed: {e}")))?;
            let sessions: Vec<Value> = sessions
                .into_iter()
                .map(|s| {
                    json!({
                        "session": s.name,
                        "namespace": s.namespace,
                        "user": s.user,
                        "title": s.title,
                        "question": s.question.as_deref().map(excerpt),
                        "lastAnswer": s.last_answer.as_deref().map(excerpt),
                        "startedAt": time(s.created_at),
                        "lastActivityAt": time(s.updated_at),
                    })
                })
                .collect();
            let proposals: Vec<Value> = proposals
                .into_iter()
                .map(|p| {
                    json!({
                        "proposal": p.name,
                        "namespace": p.namespace,
                        "session": p.session_name,
                        "action": p.action,
                        "target": p.target,
                        "params": p.params,
                        "rationale": excerpt(&p.rationale),
                        "phase": p.phase,
                        "decision": p.decision,
                        "outcome": p.message,
                        "createdAt": time(p.created_at),
                    })
                })
                .collect();
            let mut out = json!({
                "window": {"start": window.start.to_string(), "end": window.end.to_string()},
                "sessions": sessions,
                "proposals": proposals,
            });
            if ignored > 0 {
                out["note"] = json!(format!(
                    "only the first {} words of the query were used",
                    IncidentQuery::MAX_WORDS
                ));
            }
            Ok(out.to_string())
        })
    }
}

fn excerpt(text: &str) -> String {
    if text.len() <= EXCERPT {
        return text.to_owned();
    }
    let mut end = EXCERPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn time(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
