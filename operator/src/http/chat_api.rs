//! `/chat/v1/sessions`: create, list, get (with messages), delete, post a message (optionally
//! streaming the run back), follow the event log with replay, cancel.

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use crate::chat::{ChatError, event};
use crate::store::{EventRecord, NewSession, SessionRecord};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{BoxStream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;

impl From<ChatError> for ApiError {
    fn from(e: ChatError) -> Self {
        match e {
            ChatError::Busy(_) => {
                ApiError::new(StatusCode::CONFLICT, "session_busy", e.to_string())
            }
            ChatError::NotFound(_) => ApiError::not_found(e.to_string()),
            ChatError::Store(e) => ApiError::internal(e),
        }
    }
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::internal(e)
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(v)| v)
        .map_err(|e| ApiError::invalid(e.body_text()))
}

/// `POST /chat/v1/sessions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateSession {
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    dynamic_tools: Vec<Value>,
}

fn session_json(s: &SessionRecord, messages: Option<Vec<crate::store::MessageRecord>>) -> Value {
    let mut v = json!({
        "id": s.id, "name": s.name, "namespace": s.namespace, "policy": s.policy, "status": s.status,
        "user": s.user, "title": s.title, "createdAt": ms_to_rfc3339(s.created_at),
        "updatedAt": ms_to_rfc3339(s.updated_at), "dynamicTools": s.dynamic_tools,
    });
    if let Some(messages) = messages {
        v["messages"] = messages
            .iter()
            .map(|m| {
                let mut o = json!({"id": m.id, "role": m.role, "content": m.content, "createdAt": ms_to_rfc3339(m.created_at)});
                if let Some(calls) = &m.tool_calls {
                    o["toolCalls"] = calls.clone();
                }
                if let Some(id) = &m.tool_call_id {
                    o["toolCallId"] = json!(id);
                    o["isError"] = json!(m.is_error);
                }
                o
            })
            .collect();
    }
    v
}

fn ms_to_rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// `POST /chat/v1/sessions`
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<CreateSession>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    let name = body.name.trim();
    if name.is_empty() || name.len() > 253 {
        return Err(ApiError::invalid("name must be 1 to 253 characters"));
    }
    if !body.dynamic_tools.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_supported",
            "dynamicTools are not supported by this server version yet",
        ));
    }
    let namespace = body
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let config = state.config.borrow().clone();
    let Some(policy) = config.catalog.match_policy(&namespace, name) else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_matching_policy",
            format!(
                "no ChatPolicy in namespace {namespace} matches session name {name:?}; GET /api/v1/policies lists them"
            ),
        ));
    };
    let session = state
        .store
        .create_session(&NewSession {
            name: name.to_owned(),
            namespace,
            user: caller.user.clone(),
            policy: policy.object.metadata.name.clone(),
            dynamic_tools: json!([]),
        })
        .await
        .map_err(store_error)?;
    Ok((StatusCode::CREATED, Json(session_json(&session, None))).into_response())
}

/// `GET /chat/v1/sessions`
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    let sessions = state
        .store
        .list_sessions(&caller.user)
        .await
        .map_err(store_error)?;
    Ok(Json(
        json!({"items": sessions.iter().map(|s| session_json(s, None)).collect::<Vec<_>>()}),
    ))
}

async fn owned(state: &AppState, caller: &Caller, id: &str) -> Result<SessionRecord, ApiError> {
    state
        .store
        .get_session(id, &caller.user)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found(format!("session {id} not found")))
}

/// `GET /chat/v1/sessions/{id}`
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let session = owned(&state, &caller, &id).await?;
    let messages = state.store.list_messages(&id).await.map_err(store_error)?;
    Ok(Json(session_json(&session, Some(messages))))
}

/// `DELETE /chat/v1/sessions/{id}`
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state
        .store
        .delete_session(&id, &caller.user)
        .await
        .map_err(store_error)?
    {
        state.engine.cancel(&id);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("session {id} not found")))
    }
}

/// `POST /chat/v1/sessions/{id}/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    content: String,
}

/// `POST /chat/v1/sessions/{id}/messages`: 202 `{runId}`, or the run's events as SSE when
/// the client sends `Accept: text/event-stream`.
pub async fn post_message(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<PostMessage>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    if body.content.trim().is_empty() {
        return Err(ApiError::invalid("content must not be empty"));
    }
    let session = owned(&state, &caller, &id).await?;
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // Subscribe before the run starts, so no event is missed.
    let live = state.engine.subscribe(&id);
    let after = last_seq(&state, &id).await?;
    let run_id = state.engine.start_run(&session, &body.content).await?;
    if !wants_stream {
        return Ok((StatusCode::ACCEPTED, Json(json!({"runId": run_id}))).into_response());
    }
    let stream = follow(state.clone(), id, after, live, Some(run_id.clone()));
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    *response.status_mut() = StatusCode::ACCEPTED;
    if let Ok(v) = run_id.parse() {
        response.headers_mut().insert("x-kortex-run-id", v);
    }
    Ok(response)
}

async fn last_seq(state: &AppState, id: &str) -> Result<i64, ApiError> {
    // The newest stored event; events are few per session compared with the cost of a scan.
    let mut after = 0;
    loop {
        let page = state
            .store
            .events_after(id, after, 1000)
            .await
            .map_err(store_error)?;
        match page.last() {
            Some(last) if page.len() == 1000 => after = last.seq,
            Some(last) => return Ok(last.seq),
            None => return Ok(after),
        }
    }
}

/// `?after=SEQ` of the events endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterQuery {
    after: Option<i64>,
}

/// `GET /chat/v1/sessions/{id}/events`: replays from `Last-Event-ID` or `?after=`, then
/// follows live.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<AfterQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    owned(&state, &caller, &id).await?;
    let header_after = match headers
        .get("last-event-id")
        .map(|v| v.to_str().map(str::parse::<i64>))
    {
        None => None,
        Some(Ok(Ok(n))) => Some(n),
        Some(_) => {
            return Err(ApiError::invalid(
                "Last-Event-ID must be an event sequence number",
            ));
        }
    };
    let after = header_after.or(q.after).unwrap_or(0).max(0);
    let live = state.engine.subscribe(&id);
    let stream = follow(state, id, after, live, None);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn sse_event(e: &EventRecord) -> Event {
    Event::default()
        .id(e.seq.to_string())
        .event(e.event_type.clone())
        .data(e.data.to_string())
}

fn ends(e: &EventRecord, run: &str) -> bool {
    e.event_type == event::RUN_LIFECYCLE
        && e.run_id.as_deref() == Some(run)
        && matches!(
            e.data["state"].as_str(),
            Some("completed" | "failed" | "cancelled" | "requires_action")
        )
}

/// Replay from the database after `after`, then live events, dropping duplicates by
/// sequence number; the database is polled too, so events appended by another replica
/// arrive. With `until_run`, the stream ends after that run's final lifecycle event.
fn follow(
    state: AppState,
    session: String,
    after: i64,
    live: tokio::sync::broadcast::Receiver<EventRecord>,
    until_run: Option<String>,
) -> BoxStream<'static, Result<Event, Infallible>> {
    struct St {
        state: AppState,
        session: String,
        last: i64,
        live: tokio::sync::broadcast::Receiver<EventRecord>,
        queue: std::collections::VecDeque<EventRecord>,
        until_run: Option<String>,
        done: bool,
    }
    let st = St {
        state,
        session,
        last: after,
        live,
        queue: Default::default(),
        until_run,
        done: false,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            if let Some(e) = st.queue.pop_front() {
                if e.seq <= st.last {
                    continue;
                }
                st.last = e.seq;
                if st.until_run.as_deref().is_some_and(|r| ends(&e, r)) {
                    st.done = true;
                }
                return Some((Ok(sse_event(&e)), st));
            }
            // Catch up from the database (replay, gaps after a lag, other replicas).
            match st.state.store.events_after(&st.session, st.last, 500).await {
                Ok(page) if !page.is_empty() => {
                    st.queue.extend(page);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = %st.session, error = %e, "event replay failed; retrying");
                }
            }
            tokio::select! {
                received = st.live.recv() => match received {
                    Ok(e) => st.queue.push_back(e),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    })
    .boxed()
}

/// `POST /chat/v1/sessions/{id}/cancel`
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let session = owned(&state, &caller, &id).await?;
    if session.status != "running" || !state.engine.cancel(&id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!(
                "session {id} has no run to cancel on this server (status {})",
                session.status
            ),
        ));
    }
    Ok((StatusCode::ACCEPTED, Json(json!({"cancelled": true}))).into_response())
}
