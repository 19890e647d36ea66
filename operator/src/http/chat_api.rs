//! `/chat/v1/sessions`: create, list, get (with messages), delete, post a message (optionally
//! streaming the run back), follow the event log with replay, cancel.

use super::AppState;
use super::access::{ApiQuery, json_body, may_use, ms_to_rfc3339, owned, reach, reachable};
use super::auth::Caller;
use super::error::ApiError;
use crate::chat::{ChatError, event};
use crate::store::SessionState as SS;
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
            ChatError::Store(e) => ApiError::from(e),
            ChatError::Budget(e) => ApiError::budget(&e),
            ChatError::TooManyRuns { .. } => {
                let mut error = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_runs",
                    e.to_string(),
                );
                error.retry_after = Some(5);
                error
            }
        }
    }
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
    // What started a triggered session (`docs/triggers.md`).
    if let Some((policy, trigger)) = s.trigger.as_deref().and_then(|t| t.rsplit_once('/')) {
        v["trigger"] = json!({"policy": policy, "name": trigger});
    }
    if let Some(messages) = messages {
        v["messages"] = messages
            .iter()
            .map(|m| {
                let mut o = json!({"id": m.id, "role": m.role, "content": m.content, "runId": m.run_id, "createdAt": ms_to_rfc3339(m.created_at)});
                if let Some(calls) = &m.tool_calls {
                    o["toolCalls"] = calls.clone();
                }
                if let Some(id) = &m.tool_call_id {
                    o["toolCallId"] = json!(id);
                    o["isError"] = json!(m.is_error);
                }
                if m.superseded {
                    o["superseded"] = json!(true);
                }
                if let Some(author) = &m.author {
                    o["author"] = json!(author);
                }
                if let Some(provider) = &m.provider {
                    o["provider"] = json!(provider);
                }
                if let Some(model) = &m.model {
                    o["model"] = json!(model);
                }
                o
            })
            .collect();
    }
    v
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
    may_use(&state, &caller, policy).await?;
    let dynamic_tools =
        validate_dynamic_tools(&body.dynamic_tools, &config.catalog, &namespace, policy)?;
    let max = state.limits.args.max_sessions_per_user;
    if state.store.count_sessions(&caller.user).await? >= max {
        state.metrics.refused("sessions_per_user");
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_sessions",
            format!(
                "{} has {max} sessions, the most one user may have (--max-sessions-per-user); delete some and retry",
                caller.user
            ),
        ));
    }
    let session = state
        .store
        .create_session(&NewSession {
            name: name.to_owned(),
            namespace,
            user: caller.user.clone(),
            policy: policy.object.metadata.name.clone(),
            dynamic_tools,
        })
        .await
        .map_err(ApiError::from)?;
    Ok((StatusCode::CREATED, Json(session_json(&session, None))).into_response())
}

/// Checks the client-executed tools of a new session: well-formed, unique, not shadowing a
/// built-in or plugin tool, and allowed by the policy (422 `tool_denied` otherwise).
fn validate_dynamic_tools(
    tools: &[Value],
    catalog: &crate::catalog::Catalog,
    namespace: &str,
    policy: &crate::catalog::PolicyEntry,
) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, raw) in tools.iter().enumerate() {
        let tool: crate::llm::ToolSpec = serde_json::from_value(raw.clone()).map_err(|e| {
            ApiError::invalid(format!(
                "dynamicTools[{i}]: {e} (expected {{name, description, parameters}})"
            ))
        })?;
        let name = tool.name.as_str();
        let well_formed = name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !name.contains("__");
        if !well_formed {
            return Err(ApiError::invalid(format!(
                "dynamicTools[{i}].name {name:?}: use letters, digits, '_' and '-', starting with a letter, at most 64, no '__'"
            )));
        }
        if tool.parameters.get("type").and_then(Value::as_str) != Some("object") {
            return Err(ApiError::invalid(format!(
                "dynamicTools[{i}].parameters must be a JSON Schema with type: object"
            )));
        }
        let plugin = catalog
            .tools
            .iter()
            .any(|(k, t)| k.namespace == namespace && t.tool_name == name);
        if crate::catalog::BUILTIN_TOOLS.contains(&name) || plugin || !names.insert(name.to_owned())
        {
            return Err(ApiError::invalid(format!(
                "dynamicTools[{i}].name {name:?} is already taken"
            )));
        }
        let rules = &policy.object.spec.tools;
        if !crate::glob::allowed(&rules.allow, &rules.deny, name) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "tool_denied",
                format!(
                    "dynamic tool {name} is denied by ChatPolicy {} (tools.allow/deny)",
                    policy.object.metadata.name.as_deref().unwrap_or_default()
                ),
            ));
        }
        out.push(json!({"name": tool.name, "description": tool.description, "parameters": tool.parameters}));
    }
    Ok(Value::Array(out))
}

/// `GET /chat/v1/sessions`
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    // `?shared=true`: the sessions others shared with the caller, each with its `access`.
    if q.get("shared").map(String::as_str) == Some("true") {
        let shared = state
            .store
            .sessions_shared_with(&caller.user, &caller.groups)
            .await
            .map_err(ApiError::from)?;
        let items: Vec<Value> = shared
            .iter()
            .map(|(s, access)| {
                let mut v = session_json(s, None);
                v["access"] = json!(access.as_str());
                v
            })
            .collect();
        return Ok(Json(json!({"items": items})));
    }
    // `?triggered=true`: sessions triggers started, under policies the caller may use.
    if q.get("triggered").map(String::as_str) == Some("true") {
        let sessions = state
            .store
            .triggered_sessions(200)
            .await
            .map_err(ApiError::from)?;
        let config = state.config.borrow().clone();
        // Whether the caller may use each policy (asked once per policy); their own
        // sessions whatever it says.
        let mut allowed: std::collections::HashMap<String, bool> = Default::default();
        let mut items = Vec::new();
        for s in &sessions {
            let Some(policy) = config.catalog.policy_of(s) else {
                continue;
            };
            let key = policy.qualified_name();
            let may = match allowed.get(&key) {
                Some(ok) => *ok,
                None => {
                    let ok = may_use(&state, &caller, policy).await.is_ok();
                    allowed.insert(key, ok);
                    ok
                }
            };
            if may || s.user == caller.user {
                items.push(session_json(s, None));
            }
        }
        return Ok(Json(json!({"items": items})));
    }
    // `?q=`: the caller's sessions whose name, title or messages contain it.
    let sessions = match q.get("q").map(|t| t.trim()).filter(|t| !t.is_empty()) {
        Some(text) if text.chars().count() > 200 => {
            return Err(ApiError::invalid("q is longer than 200 characters"));
        }
        Some(text) => state.store.search_sessions(&caller.user, text).await,
        None => state.store.list_sessions(&caller.user).await,
    }
    .map_err(ApiError::from)?;
    Ok(Json(
        json!({"items": sessions.iter().map(|s| session_json(s, None)).collect::<Vec<_>>()}),
    ))
}

/// `PATCH /chat/v1/sessions/{id}` `{title}`: renames the caller's own session (the title
/// shown in lists and searched); 404 for anyone else's.
pub async fn rename(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let title = body["title"]
        .as_str()
        .map(str::trim)
        .ok_or_else(|| ApiError::invalid("title: a string is required"))?;
    if title.is_empty() || title.chars().count() > 200 {
        return Err(ApiError::invalid("title: 1 to 200 characters"));
    }
    if title.chars().any(char::is_control) {
        return Err(ApiError::invalid("title: no control characters"));
    }
    if !state
        .store
        .rename_session(&id, &caller.user, title)
        .await
        .map_err(ApiError::from)?
    {
        return Err(ApiError::not_found(format!("session {id} not found")));
    }
    let session = owned(&state, &caller, &id).await?;
    Ok(Json(session_json(&session, None)))
}

/// `GET /chat/v1/sessions/{id}`
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (session, access) = reach(&state, &caller, &id, crate::store::Access::Read).await?;
    // Where a client that renders `messages` picks up the event stream: after the last
    // event, or — while a run is in progress — just before that run's first event (its
    // assistant messages are then rebuilt from the events, without duplicates).
    // The sequence number first: a run that starts after it is either the active run
    // read next, or entirely after `eventSeq`; either way its events are replayed.
    let seq = state
        .store
        .last_event_seq(&id)
        .await
        .map_err(ApiError::from)?;
    let active = state.store.active_run(&id).await.map_err(ApiError::from)?;
    let messages = state
        .store
        .list_messages(&id)
        .await
        .map_err(ApiError::from)?;
    let handovers = state.store.handovers(&id).await.map_err(ApiError::from)?;
    // Each run's trace, when traces were on (a postmortem jumps from a message to it), and
    // the runs that failed with why (a transcript read later still says what went wrong).
    let runs = state.store.run_notes(&id).await.map_err(ApiError::from)?;
    let mut v = session_json(&session, Some(messages));
    if !runs.traces.is_empty()
        && let Some(items) = v["messages"].as_array_mut()
    {
        for m in items {
            if let Some(trace) = m["runId"].as_str().and_then(|r| runs.traces.get(r)) {
                m["traceId"] = json!(trace);
            }
        }
    }
    v["failedRuns"] = runs
        .failed
        .iter()
        .map(|(run, reason)| json!({"id": run, "reason": reason}))
        .collect();
    v["eventSeq"] = json!(seq);
    v["handovers"] = handovers
        .iter()
        .map(super::share_api::handover_json)
        .collect();
    // What the caller may do: `owner`, or what the session is shared with them for.
    v["access"] = json!(access.map_or("owner", crate::store::Access::as_str));
    if let Some((run, after)) = active {
        v["activeRun"] = json!({"id": run, "afterSeq": after});
    }
    Ok(Json(v))
}

/// `DELETE /chat/v1/sessions/{id}`: by its owner, or by an admin (the group
/// `kortex-admins`, or in cluster mode RBAC `delete` on the non-resource URL
/// `/kortex/sessions`). Hidden at once; a run still writing is cancelled, then everything
/// the session holds is removed for good (by the next retention pass if the run takes
/// longer to end).
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let store = &state.store;
    if !store
        .delete_session(&id, Some(&caller.user))
        .await
        .map_err(ApiError::from)?
    {
        // Someone else's: only an admin may, and a stranger learns nothing of it.
        let Some(other) = store.session_by_id(&id).await.map_err(ApiError::from)? else {
            return Err(ApiError::not_found(format!("session {id} not found")));
        };
        if super::access::admins_only(
            &state,
            &caller,
            "deleting another user's session",
            "delete",
            "/kortex/sessions",
        )
        .await
        .is_err()
        {
            return Err(ApiError::not_found(format!("session {id} not found")));
        }
        if !store
            .delete_session(&id, None)
            .await
            .map_err(ApiError::from)?
        {
            return Err(ApiError::not_found(format!("session {id} not found")));
        }
        store
            .record_decision(&crate::store::NewDecision {
                kind: "deletion".into(),
                namespace: Some(other.namespace.clone()),
                session_id: Some(id.clone()),
                user: Some(caller.user.clone()),
                policy: other.policy.clone(),
                subject: format!("session {id}"),
                outcome: "session_deleted".into(),
                detail: json!({"owner": other.user, "by": "admin"}),
                ..Default::default()
            })
            .await
            .map_err(ApiError::from)?;
    }
    let engine = state.engine.clone();
    let metrics = state.metrics.clone();
    tokio::spawn(async move {
        let ended = engine
            .stop_runs(std::slice::from_ref(&id), Duration::from_secs(60))
            .await;
        if !matches!(ended, Ok(true)) {
            return;
        }
        match engine.store.purge_deleted().await {
            Ok(p) => {
                for (kind, n) in p.counts() {
                    if n > 0 {
                        metrics.retention_deleted(kind, "session_deleted", n);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "cannot remove a deleted session yet; retention will")
            }
        }
    });
    Ok(StatusCode::NO_CONTENT)
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
    let session = reachable(&state, &caller, &id, crate::store::Access::Continue).await?;
    // The policy is matched again on each run, and so is the right to use it.
    let config = state.config.borrow().clone();
    if let Some(policy) = config.catalog.policy_of(&session) {
        may_use(&state, &caller, policy).await?;
    }
    if let Some(token) = &caller.kube {
        state
            .engine
            .remember_token(&session.id, &caller.user, token.clone());
    }
    state
        .engine
        .remember_subject(&session.id, &caller.user, caller.subject.clone());
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // A stream slot is taken before the run starts: a run is not started for a stream
    // that would be refused.
    let slot = if wants_stream {
        Some(state.limits.open_stream(&caller.user, &state.metrics)?)
    } else {
        None
    };
    // Subscribe before the run starts, so no event is missed.
    let live = state.engine.subscribe(&id);
    let after = state
        .store
        .last_event_seq(&id)
        .await
        .map_err(ApiError::from)?;
    // Whoever posts is whom the run acts for (budgets, audit, the message's author, their
    // own token for Kubernetes tools): in a shared session, not always its owner.
    let run_id = state
        .engine
        .start_run(&session, &caller.user, &body.content)
        .await?;
    if !wants_stream {
        return Ok((StatusCode::ACCEPTED, Json(json!({"runId": run_id}))).into_response());
    }
    let stream = follow(state.clone(), id, after, live, Some(run_id.clone()), slot);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    *response.status_mut() = StatusCode::ACCEPTED;
    if let Ok(v) = run_id.parse() {
        response.headers_mut().insert("x-kortex-run-id", v);
    }
    Ok(response)
}

/// `?after=SEQ` of the events endpoint; `?format=jsonl` (with `from_seq=N`, the first
/// sequence number wanted) exports instead of following.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterQuery {
    after: Option<i64>,
    from_seq: Option<i64>,
    format: Option<String>,
}

/// Events a JSONL export reads from the database at a time.
const EXPORT_PAGE: i64 = 1000;

/// `?format=jsonl`: every stored event of the session from `from_seq` on, one JSON object a
/// line (`{"id", "event", "data", "runId", "createdAt"}`, the ids SSE gives), then the end:
/// for postmortems and tests. Streamed page by page, never held whole.
fn jsonl_export(state: AppState, session: String, from_seq: i64) -> Response {
    let pages = futures_util::stream::unfold(Some(from_seq - 1), move |after| {
        let state = state.clone();
        let session = session.clone();
        async move {
            let after = after?;
            match state.store.events_after(&session, after, EXPORT_PAGE).await {
                Ok(events) if events.is_empty() => None,
                Ok(events) => {
                    let next = (events.len() as i64 == EXPORT_PAGE)
                        .then(|| events.last().map(|e| e.seq))
                        .flatten();
                    let mut text = String::new();
                    for e in &events {
                        let line = json!({"id": e.seq, "event": e.event_type, "data": e.data,
                            "runId": e.run_id, "createdAt": ms_to_rfc3339(e.created_at)});
                        text.push_str(&line.to_string());
                        text.push('\n');
                    }
                    Some((Ok::<_, std::io::Error>(text), next))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a JSONL export stopped early");
                    Some((Err(std::io::Error::other(e.to_string())), None))
                }
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/jsonl")],
        axum::body::Body::from_stream(pages),
    )
        .into_response()
}

/// `GET /chat/v1/sessions/{id}/events`: replays from `Last-Event-ID` or `?after=`, then
/// follows live.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<AfterQuery>,
) -> Result<Response, ApiError> {
    reachable(&state, &caller, &id, crate::store::Access::Read).await?;
    match q.format.as_deref() {
        Some("jsonl") => {
            return Ok(jsonl_export(state, id, q.from_seq.unwrap_or(1).max(1)));
        }
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "format={other}: the events export format is jsonl (without format, events stream as SSE)"
            )));
        }
        None if q.from_seq.is_some() => {
            return Err(ApiError::invalid(
                "from_seq goes with format=jsonl; an SSE stream replays with ?after=SEQ or Last-Event-ID",
            ));
        }
        None => {}
    }
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
    let slot = state.limits.open_stream(&caller.user, &state.metrics)?;
    let live = state.engine.subscribe(&id);
    let stream = follow(state, id, after, live, None, slot);
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
            Some(
                "completed"
                    | "failed"
                    | "cancelled"
                    | "requires_action"
                    | "paused"
                    | "awaiting_plan"
            )
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
    slot: impl Into<Option<super::limits::StreamSlot>>,
) -> BoxStream<'static, Result<Event, Infallible>> {
    struct St {
        /// Freed when the stream ends or its client goes away.
        _slot: Option<super::limits::StreamSlot>,
        state: AppState,
        session: String,
        last: i64,
        live: tokio::sync::broadcast::Receiver<EventRecord>,
        queue: std::collections::VecDeque<EventRecord>,
        until_run: Option<String>,
        done: bool,
        /// Whether the database may hold events not seen yet: at the start, after a gap
        /// or a lag, and every 500 ms without live events (another replica's). Events that
        /// arrive live and in order need no read.
        catch_up: bool,
    }
    let st = St {
        _slot: slot.into(),
        state,
        session,
        last: after,
        live,
        queue: Default::default(),
        until_run,
        done: false,
        catch_up: true,
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
            if st.catch_up {
                match st.state.store.events_after(&st.session, st.last, 500).await {
                    Ok(page) if !page.is_empty() => {
                        st.queue.extend(page);
                        continue;
                    }
                    Ok(_) => st.catch_up = false,
                    Err(e) => {
                        tracing::warn!(session = %st.session, error = %e, "event replay failed; retrying");
                    }
                }
            }
            tokio::select! {
                received = st.live.recv() => match received {
                    // In order: take it. After a gap (an event another replica wrote), let
                    // the database catch-up above fetch everything in order.
                    Ok(e) if e.seq == st.last + 1 => st.queue.push_back(e),
                    Ok(e) if e.seq > st.last + 1 => st.catch_up = true,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => st.catch_up = true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        st.catch_up = true;
                    }
                },
                _ = tokio::time::sleep(Duration::from_millis(500)) => st.catch_up = true,
            }
        }
    })
    .boxed()
}

/// The dynamic tool calls of the last assistant message that have no result yet, and the
/// run they belong to.
pub(super) fn pending_calls(
    messages: &[crate::store::MessageRecord],
) -> (Vec<crate::llm::ToolCall>, Option<String>) {
    let Some(last) = messages.iter().rposition(|m| m.role == "assistant") else {
        return (Vec::new(), None);
    };
    let calls: Vec<crate::llm::ToolCall> = messages[last]
        .tool_calls
        .clone()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let answered: std::collections::BTreeSet<&str> = messages[last..]
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    let pending = calls
        .into_iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .collect();
    (pending, messages[last].run_id.clone())
}

/// `POST /chat/v1/sessions/{id}/tool-results` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolResults {
    results: Vec<ToolResult>,
}

/// One result of a client-executed tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolResult {
    /// The call it answers.
    pub tool_call_id: String,
    /// What the tool gave (text, or any JSON).
    pub content: Value,
    /// Whether the tool failed.
    #[serde(default)]
    pub is_error: bool,
}

fn not_waiting(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_requires_action",
        format!("session {id} is not waiting for tool results"),
    )
}

/// `POST /chat/v1/sessions/{id}/tool-results`: 202 and the run resumes; 409 unless the
/// session is `requires_action` (the first POST wins); 400 when ids are missing or extra.
pub async fn tool_results(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<ToolResults>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    let session = reachable(&state, &caller, &id, crate::store::Access::Continue).await?;
    let run_id = give_tool_results(&state, &session, &body.results).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"runId": run_id}))).into_response())
}

/// Gives `results` to the run of `session` that waits for them, and resumes it: its id.
/// 409 unless the session is `requires_action` (the first to give wins); 400 when ids are
/// missing or extra. The chat API's and an A2A task's way to answer client-executed tools.
// Long because of the checks (state, ids missing or extra, sizes) and the resume, each with
// its own HTTP error.
pub(super) async fn give_tool_results(
    state: &AppState,
    session: &crate::store::SessionRecord,
    results: &[ToolResult],
) -> Result<String, ApiError> {
    let id = session.id.clone();
    if session.status != crate::store::SessionState::RequiresAction {
        return Err(not_waiting(&id));
    }
    let messages = state
        .store
        .list_messages(&id)
        .await
        .map_err(ApiError::from)?;
    let (pending, run_id) = pending_calls(&messages);
    let expected: std::collections::BTreeSet<&str> =
        pending.iter().map(|c| c.id.as_str()).collect();
    let given: std::collections::BTreeSet<&str> =
        results.iter().map(|r| r.tool_call_id.as_str()).collect();
    if given.len() != results.len() {
        return Err(ApiError::invalid("a toolCallId appears twice"));
    }
    if expected != given {
        let missing: Vec<&str> = expected.difference(&given).copied().collect();
        let extra: Vec<&str> = given.difference(&expected).copied().collect();
        return Err(ApiError::invalid(format!(
            "results must answer exactly the pending calls; missing: {missing:?}, unknown: {extra:?}"
        )));
    }
    let Some(run_id) = run_id else {
        return Err(not_waiting(&id));
    };
    // First POST wins: only one request moves the session back to running.
    if !state
        .store
        .transition_session(&id, &[SS::RequiresAction], SS::Running)
        .await
        .map_err(ApiError::from)?
    {
        return Err(not_waiting(&id));
    }
    // The calls checked above must still be the ones waiting (a cancel and a new run could
    // have come in between the check and the status change).
    let now_pending = pending_calls(
        &state
            .store
            .list_messages(&id)
            .await
            .map_err(ApiError::from)?,
    );
    if now_pending.1.as_deref() != Some(run_id.as_str())
        || now_pending
            .0
            .iter()
            .map(|c| c.id.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            != expected
    {
        state
            .store
            .transition_session(&id, &[SS::Running], SS::RequiresAction)
            .await
            .map_err(ApiError::from)?;
        return Err(not_waiting(&id));
    }
    let redactor = {
        let config = state.config.borrow();
        let catalog = &config.catalog;
        match catalog.policy_of(session) {
            Some(policy) => crate::redact::Redactor::for_policy(catalog, policy),
            None => crate::redact::Redactor::secrets_only(catalog.redactor.clone()),
        }
    };
    for r in results {
        let content = match &r.content {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        // Resolved Secret values (and what the policy's privacy settings name) never reach
        // the provider or the database (SPEC §1.3).
        let (content, _) = redactor.content(&content);
        let name = pending
            .iter()
            .find(|c| c.id == r.tool_call_id)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        // Client results obey the same cap as any tool's.
        let (content, truncated) = crate::tools::cap(
            &state.store,
            &id,
            &r.tool_call_id,
            &name,
            content,
            state.engine.router.result_cap(),
        )
        .await
        .map_err(ApiError::from)?;
        if truncated {
            state.metrics.refused("tool_result_bytes");
        }
        let message = crate::store::NewMessage {
            run_id: Some(run_id.clone()),
            role: "tool".into(),
            content: content.clone(),
            tool_call_id: Some(r.tool_call_id.clone()),
            is_error: r.is_error,
            ..Default::default()
        };
        state
            .store
            .append_message(&id, &message)
            .await
            .map_err(ApiError::from)?;
        let preview: String = content.chars().take(200).collect();
        let data = json!({"runId": run_id, "callId": r.tool_call_id, "name": name, "ok": !r.is_error,
            "isError": r.is_error, "durationMs": 0, "truncated": truncated, "preview": preview});
        state
            .engine
            .emit_now(&id, &run_id, event::TOOL_END, data)
            .await
            .map_err(ApiError::from)?;
    }
    state.engine.resume_run(session, &run_id).await?;
    Ok(run_id)
}

/// `POST /chat/v1/sessions/{id}/cancel`: stops a running run, or ends one waiting for
/// dynamic tool results (its pending calls get error results).
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let session = reachable(&state, &caller, &id, crate::store::Access::Continue).await?;
    // A run waiting for client results, paused, or waiting on its plan is ended where it is
    // parked (run control's table says how).
    if matches!(
        session.status.as_str(),
        "requires_action" | "paused" | "awaiting_plan"
    ) && let Some((run, _)) = state.store.active_run(&id).await.map_err(ApiError::from)?
    {
        crate::chat::control::apply(
            &state.engine,
            &session,
            &run,
            &caller.user,
            crate::chat::control::Control::Cancel,
            crate::chat::control::Input::default(),
        )
        .await?;
        return Ok((StatusCode::ACCEPTED, Json(json!({"cancelled": true}))).into_response());
    }
    // On this replica: stop it now; elsewhere: ask through the database (its owner polls).
    let asked = session.status == crate::store::SessionState::Running
        && (state.engine.cancel(&id)
            || state
                .store
                .request_cancel(&id)
                .await
                .map_err(ApiError::from)?);
    if !asked {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!(
                "session {id} has no run to cancel (status {})",
                session.status
            ),
        ));
    }
    Ok((StatusCode::ACCEPTED, Json(json!({"cancelled": true}))).into_response())
}

/// `GET /chat/v1/sessions/{id}/route`: whether the session's policy has a provider that can
/// answer now (from the last probes), in failover order with the skipped ones and why; when
/// none can, `message` says what to do (the same words as the run's
/// `no_provider_reachable` error). The dashboard's banner polls it.
pub async fn route_now(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    use crate::govern::{reach as r, route};
    let (session, _) = reach(&state, &caller, &id, crate::store::Access::Read).await?;
    let config = state.config.borrow().clone();
    let catalog = &config.catalog;
    let Some(policy) = catalog.policy_of(&session) else {
        return Ok(Json(json!({
            "policy": null, "reachable": false, "routes": [], "skipped": [],
            "message": format!("No ChatPolicy in namespace {} matches session {}.", session.namespace, session.name),
        })));
    };
    let name = format!(
        "{}/{}",
        session.namespace,
        policy.object.metadata.name.as_deref().unwrap_or_default()
    );
    let mut plan = route::plan(catalog, &session.namespace, policy, route::Role::Default);
    if let Some((board, interval)) = state.engine.probes.get() {
        let probes = board.read().map(|b| b.clone()).unwrap_or_default();
        r::drop_unreachable(
            &mut plan,
            catalog,
            &session.namespace,
            &probes,
            jiff::Timestamp::now(),
            r::fresh_within(*interval),
        );
    }
    let reachable = !plan.routes.is_empty();
    let mut v = json!({"policy": name, "reachable": reachable, "routes": plan.routes, "skipped": plan.skipped});
    if !reachable {
        v["message"] = json!(r::no_provider_message(
            catalog,
            &session.namespace,
            policy.object.metadata.name.as_deref().unwrap_or_default(),
            &plan
        ));
    }
    Ok(Json(v))
}
