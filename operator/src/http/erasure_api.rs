//! `DELETE /api/v1/users/{name}`: erasure of a user (`docs/storage.md#erasure`). For admins
//! only: the group `kortex-admins`, or in cluster mode whoever RBAC lets `delete` the
//! non-resource URL `/kortex/erase` (ClusterRole `kortex-admin`); loopback: the local user.

use super::AppState;
use super::access::admins_only;
use super::auth::Caller;
use super::error::ApiError;
use crate::store::StoreError;
use crate::store::erasure;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Value, json};
use std::time::Duration;

/// How long an erasure waits for the user's running runs to stop.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// `DELETE /api/v1/users/{name}` → `{user, erased, deleted, deletedOther, pseudonymised}`
/// (`user` is the pseudonym; `erased: false` when nothing named them, as on a second call).
pub async fn erase(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admins_only(&state, &caller, "erasing a user", "delete", "/kortex/erase").await?;
    if name.trim().is_empty() || name.len() > 512 {
        return Err(ApiError::invalid(
            "the user name must be 1 to 512 characters",
        ));
    }
    let writing = state
        .store
        .writing_sessions_of(&name)
        .await
        .map_err(ApiError::from)?;
    if !state
        .engine
        .stop_runs(&writing, STOP_WITHIN)
        .await
        .map_err(ApiError::from)?
    {
        return Err(runs_still_ending());
    }
    let key = state
        .erasure_key
        .as_deref()
        .map(<[u8]>::to_vec)
        .unwrap_or_else(erasure::random_key);
    let erased = match state.store.erase_user(&name, &key, &caller.user).await {
        Ok(e) => e,
        // A run started meanwhile.
        Err(StoreError::Conflict(_)) => return Err(runs_still_ending()),
        Err(e) => return Err(e.into()),
    };
    for (kind, n) in erased.deleted.counts() {
        if n > 0 {
            state.metrics.retention_deleted(kind, "erasure", n);
        }
    }
    tracing::info!(by = %caller.user, pseudonym = %erased.pseudonym, erased = !erased.is_empty(), "user erased");
    Ok(Json(json!({
        "user": erased.pseudonym,
        "erased": !erased.is_empty(),
        "deleted": erased.deleted,
        "deletedOther": erased.deleted_other,
        "pseudonymised": erased.pseudonymised,
    })))
}

fn runs_still_ending() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "runs_still_ending",
        "a run of this user is still ending; nothing was erased yet — retry in a moment",
    )
}
