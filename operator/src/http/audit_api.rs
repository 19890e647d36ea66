//! `GET /api/v1/audit`: the `decisions` audit rows, newest first, paged with an opaque
//! cursor; `GET /chat/v1/sessions/{id}/export`: a session's transcript as Markdown or JSON.

use super::AppState;
use super::access::{ApiQuery, admins_only};
use super::auth::Caller;
use super::error::ApiError;
use crate::store::DecisionQuery;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

/// Query of `GET /api/v1/audit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// RFC 3339 time or Unix milliseconds.
    since: Option<String>,
    /// Session id.
    session: Option<String>,
    /// `llm_call`, `tool_call`, `proposal`, ...
    kind: Option<String>,
    /// Page size (default 100, at most 1000).
    limit: Option<i64>,
    /// `nextCursor` of the previous page.
    cursor: Option<String>,
}

fn parse_since(s: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    s.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .map_err(|_| {
            ApiError::invalid(format!(
                "since={s:?} is neither an RFC 3339 time nor Unix milliseconds"
            ))
        })
}

/// `GET /api/v1/audit`. Rows are about every user's sessions, so in key mode only members
/// of the group `kortex-admins` may read them; in loopback mode the local user may.
pub async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    admins_only(&state, &caller, "the audit log", "get", "/kortex/audit").await?;
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => {
            let (at, id) = c
                .split_once('.')
                .and_then(|(at, id)| at.parse::<i64>().ok().map(|at| (at, id.to_owned())))
                .ok_or_else(|| ApiError::invalid("cursor is not one this server issued"))?;
            Some((at, id))
        }
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let rows = state
        .store
        .list_decisions(&DecisionQuery {
            since: q.since.as_deref().map(parse_since).transpose()?,
            session_id: q.session,
            kind: q.kind,
            before,
            limit,
        })
        .await
        .map_err(ApiError::from)?;
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| format!("{}.{}", r.at, r.id)))
        .flatten();
    let items: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
            v["at"] = json!(
                jiff::Timestamp::from_millisecond(r.at)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            );
            v
        })
        .collect();
    Ok(Json(json!({"items": items, "nextCursor": next})))
}

/// `GET /chat/v1/sessions/{id}/export`: Markdown with `Accept: text/markdown` (or
/// `?format=markdown`), JSON otherwise.
pub async fn export(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let session =
        super::access::reachable(&state, &caller, &id, crate::store::Access::Read).await?;
    let messages = state
        .store
        .list_messages(&id)
        .await
        .map_err(ApiError::from)?;
    let wants_markdown = q.get("format").map(String::as_str) == Some("markdown")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/markdown"));
    let time = |ms: i64| {
        jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let unfinished = state
        .store
        .unfinished_runs(&id)
        .await
        .map_err(ApiError::from)?;
    if !wants_markdown {
        let runs: Vec<Value> = unfinished
            .iter()
            .map(|(run, status, reason, at)| {
                json!({"runId": run, "state": status, "reason": reason, "finishedAt": at})
            })
            .collect();
        return Ok(
            Json(json!({"session": session, "messages": messages, "unfinishedRuns": runs}))
                .into_response(),
        );
    }
    // The last message of a run that failed or was cancelled is where it broke off.
    let last_of_run: std::collections::HashMap<&str, usize> = messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.run_id.as_deref().map(|r| (r, i)))
        .collect();
    let ends: std::collections::HashMap<usize, (&str, &str)> = unfinished
        .iter()
        .filter_map(|(run, status, reason, _)| {
            last_of_run
                .get(run.as_str())
                .map(|i| (*i, (status.as_str(), reason.as_deref().unwrap_or(""))))
        })
        .collect();
    let mut md = format!(
        "# {}\n\n- Session: `{}` (namespace `{}`, policy `{}`)\n- User: {}\n- Created: {}\n\n",
        session.title.as_deref().unwrap_or(&session.name),
        session.id,
        session.namespace,
        session.policy.as_deref().unwrap_or("-"),
        session.user,
        time(session.created_at)
    );
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "user" => md.push_str(&format!(
                "## {} — {}\n\n{}\n\n",
                session.user,
                time(m.created_at),
                m.content
            )),
            "assistant" => {
                md.push_str(&format!("## Kortex — {}\n\n", time(m.created_at)));
                if !m.content.is_empty() {
                    md.push_str(&format!("{}\n\n", m.content));
                }
                for call in m
                    .tool_calls
                    .as_ref()
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    md.push_str(&format!(
                        "- Tool call `{}` `{}`\n",
                        call["name"].as_str().unwrap_or_default(),
                        call["input"]
                    ));
                }
                md.push('\n');
            }
            _ => {
                let status = if m.is_error { "error" } else { "result" };
                md.push_str(&format!(
                    "<details><summary>Tool {status} ({})</summary>\n\n```\n{}\n```\n</details>\n\n",
                    m.tool_call_id.as_deref().unwrap_or_default(),
                    m.content.replace("```", "'''")
                ));
            }
        }
        if let Some((status, reason)) = ends.get(&i) {
            let what = if *status == "cancelled" {
                "Run cancelled"
            } else {
                "Run failed"
            };
            let cut = if m.role == "assistant" {
                " — the answer above is cut off"
            } else {
                ""
            };
            md.push_str(&format!("> **{what}**{cut}: {reason}\n\n"));
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/markdown; charset=utf-8")], md).into_response())
}
