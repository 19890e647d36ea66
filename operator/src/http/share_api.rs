//! Sharing and hand-over (`docs/chat.md#sharing`, `#hand-over`): the owner shares a
//! session to read or to continue and revokes it; whoever may continue it hands it over to
//! the next person with a note, a summary by the policy's `summarize` model, and a
//! `session.handover` notification.

use super::AppState;
use super::access::{json_body, owned, reachable};
use super::auth::Caller;
use super::error::ApiError;
use crate::store::Access;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// `POST /chat/v1/sessions/{id}/share` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareBody {
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    access: Option<Access>,
}

fn principals_valid(body: &ShareBody) -> Result<(), ApiError> {
    if body.users.len() + body.groups.len() > 64 {
        return Err(ApiError::invalid("at most 64 users and groups at a time"));
    }
    if body
        .users
        .iter()
        .chain(&body.groups)
        .any(|p| p.trim().is_empty() || p.len() > 256)
    {
        return Err(ApiError::invalid(
            "users and groups are names of 1 to 256 characters",
        ));
    }
    Ok(())
}

/// `POST /chat/v1/sessions/{id}/share {users?, groups?, access: read | continue}` (the
/// owner only) → `{shares}`.
pub async fn share(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<ShareBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(body)?;
    let session = owned(&state, &caller, &id).await?;
    principals_valid(&body)?;
    if body.users.is_empty() && body.groups.is_empty() {
        return Err(ApiError::invalid("name at least one of users or groups"));
    }
    let access = body
        .access
        .ok_or_else(|| ApiError::invalid("access is read or continue"))?;
    let shares = state
        .store
        .share_session(&session.id, &body.users, &body.groups, access, &caller.user)
        .await
        .map_err(ApiError::from)?;
    audit(
        &state,
        &session,
        &caller,
        access.as_str(),
        json!({"users": body.users, "groups": body.groups}),
    )
    .await?;
    Ok(Json(json!({"shares": shares})))
}

/// Records a share or hand-over of `session` by `caller` (`kind: share`).
async fn audit(
    state: &AppState,
    session: &crate::store::SessionRecord,
    caller: &Caller,
    outcome: &str,
    detail: Value,
) -> Result<(), ApiError> {
    state
        .store
        .record_decision(&crate::store::NewDecision {
            kind: "share".into(),
            namespace: Some(session.namespace.clone()),
            session_id: Some(session.id.clone()),
            user: Some(caller.user.clone()),
            policy: session.policy.clone(),
            subject: format!("session {}", session.id),
            outcome: outcome.into(),
            detail,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(ApiError::from)
}

/// `GET /chat/v1/sessions/{id}/share` → `{shares}` (the owner only).
pub async fn shares(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let session = owned(&state, &caller, &id).await?;
    let shares = state
        .store
        .shares(&session.id)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({"shares": shares})))
}

/// `DELETE /chat/v1/sessions/{id}/share` with `{users?, groups?}` (none: every share) —
/// the owner only.
pub async fn unshare(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Option<Json<ShareBody>>,
) -> Result<StatusCode, ApiError> {
    let session = owned(&state, &caller, &id).await?;
    let (users, groups) = match &body {
        Some(Json(b)) => {
            principals_valid(b)?;
            (b.users.clone(), b.groups.clone())
        }
        None => (Vec::new(), Vec::new()),
    };
    state
        .store
        .unshare_session(&session.id, &users, &groups)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /chat/v1/sessions/{id}/handover` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverBody {
    to: String,
    #[serde(default)]
    note: String,
}

/// Longest hand-over note, in characters.
const MAX_NOTE: usize = 4_000;

/// How long a hand-over waits for the `summarize` model before going on with the note alone.
const SUMMARY_WAIT: Duration = Duration::from_secs(90);

/// `POST /chat/v1/sessions/{id}/handover {to, note}` by the owner or anyone who may continue
/// the session → 201 `{handover, shares}`: `to` may continue it, the note (with a summary by
/// the policy's `summarize` model when it has one) is kept and shown in the session, and the
/// policy's `notify` targets get `session.handover`.
pub async fn handover(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<HandoverBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    let (handover, shares) = hand_over(&state, &caller, &id, &body.to, &body.note).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"handover": handover, "shares": shares})),
    )
        .into_response())
}

/// Hands session `id` over from `caller` to `to` with `note` (from the API or Slack): the
/// hand-over as the API shows it, and the session's shares after it.
pub(crate) async fn hand_over(
    state: &AppState,
    caller: &Caller,
    id: &str,
    to: &str,
    note: &str,
) -> Result<(Value, Value), ApiError> {
    let owner = reachable(state, caller, id, Access::Continue).await?;
    let to = to.trim();
    if to.is_empty() || to.len() > 256 {
        return Err(ApiError::invalid(
            "to is the user taking over, 1 to 256 characters",
        ));
    }
    if to == caller.user {
        return Err(ApiError::invalid(
            "to names someone else: you cannot hand a session over to yourself",
        ));
    }
    if note.trim().is_empty() || note.chars().count() > MAX_NOTE {
        return Err(ApiError::invalid(format!(
            "note is what the next person should know, 1 to {MAX_NOTE} characters"
        )));
    }
    let config = state.config.borrow().clone();
    let policy = config.catalog.policy_of(&owner);
    // The note is stored, notified and shown as redacted as anything a user types.
    let redactor = match policy {
        Some(p) => crate::redact::Redactor::for_policy(&config.catalog, p),
        None => crate::redact::Redactor::secrets_only(config.catalog.redactor.clone()),
    };
    let (note, _) = redactor.text(note.trim());
    // The summary is written for (and billed to) whoever hands over: the session as their
    // run would see it.
    let mut session = owner.clone();
    session.user = caller.user.clone();
    let summary = match policy {
        Some(p) => {
            match tokio::time::timeout(
                SUMMARY_WAIT,
                crate::chat::handover_summary(&state.engine, &session, p, &note),
            )
            .await
            {
                Ok(Ok(summary)) => summary,
                Ok(Err(e)) => return Err(ApiError::from(e)),
                Err(_) => {
                    tracing::warn!(session = %id, "the summarize model did not answer in time; handing over with the note alone");
                    None
                }
            }
        }
        None => None,
    };
    let policy_key = policy.map(crate::catalog::PolicyEntry::qualified_name);
    let handover = state
        .store
        .hand_over(
            &owner,
            &caller.user,
            to,
            &note,
            summary.as_deref(),
            policy_key.as_deref(),
        )
        .await
        .map_err(ApiError::from)?;
    audit(
        state,
        &owner,
        caller,
        "handover",
        json!({"to": to, "summary": summary.is_some()}),
    )
    .await?;
    let handover = handover_json(&handover);
    // Whoever follows the session sees it at once.
    state
        .engine
        .emit_session(id, crate::chat::event::HANDOVER, handover.clone())
        .await
        .map_err(ApiError::from)?;
    let shares = state.store.shares(id).await.map_err(ApiError::from)?;
    Ok((handover, json!(shares)))
}

/// A hand-over as the API shows it (`createdAt` in RFC 3339, like messages).
pub(crate) fn handover_json(h: &crate::store::Handover) -> Value {
    json!({"id": h.id, "from": h.from, "to": h.to, "note": h.note, "summary": h.summary,
        "createdAt": super::access::ms_to_rfc3339(h.created_at)})
}
