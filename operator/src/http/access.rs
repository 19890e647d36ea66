//! Who may do what with the API's sessions and reports: the checks every handler shares
//! (ownership and sharing of a session, `use` of a ChatPolicy, the admin reports), and the
//! small helpers of their answers (JSON bodies, timestamps). Handlers import these from
//! here, never from one another. Imports only what `http` may (docs/architecture.md).

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use crate::store::SessionRecord;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;

/// A JSON request body, or the API's own 400/413 for it.
pub(crate) fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(v)| v).map_err(|e| {
        // Over `--max-request-bytes`: kept 413, which `limits::limit_body` words and counts.
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                e.body_text(),
            )
        } else {
            ApiError::invalid(e.body_text())
        }
    })
}

/// A query string, or the API's 400 for it.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(q) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        Ok(Self(q))
    }
}

/// Unix milliseconds as RFC 3339 (empty when out of range).
/// A session name the policy's `sessions` globs match, for a session a door starts (Slack's
/// threads, agents' tasks): the first glob with its first `*` as `id` (the others empty)
/// and `?` as `x`.
pub(crate) fn session_name_for(policy: &crate::catalog::PolicyEntry, id: &str) -> String {
    let glob = policy
        .object
        .spec
        .sessions
        .first()
        .map_or("*", String::as_str);
    let mut out = String::new();
    let mut used = false;
    for c in glob.chars() {
        match c {
            '*' if !used => {
                out.push_str(id);
                used = true;
            }
            '*' => {}
            '?' => out.push('x'),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn ms_to_rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// In cluster mode, the caller must be allowed the verb `use` on the policy
/// (`chatpolicies/<name>`), so naming a session cannot grant a policy's budget, tools or
/// execution rights to someone not allowed them.
pub(crate) async fn may_use(
    state: &AppState,
    caller: &Caller,
    policy: &crate::catalog::PolicyEntry,
) -> Result<(), ApiError> {
    let (Some(cluster), crate::http::auth::AuthMode::Cluster) = (&state.cluster_auth, state.auth)
    else {
        return Ok(());
    };
    let namespace = policy
        .object
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    let name = policy.object.metadata.name.as_deref().unwrap_or_default();
    match cluster
        .may_use_policy(&caller.user, &caller.groups, namespace, name)
        .await
    {
        Ok(true) => Ok(()),
        Ok(false) => Err(ApiError::forbidden(format!(
            "{} may not use ChatPolicy {namespace}/{name}: RBAC must allow the verb use on chatpolicies/{name} (e.g. a RoleBinding to the kortex-user ClusterRole)",
            caller.user
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the use of a ChatPolicy");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "auth_unavailable",
                "the Kubernetes API server could not check your access to the ChatPolicy; try again",
            ))
        }
    }
}

/// Session `id` if the caller owns it; anyone else gets 404, as for a session that does
/// not exist.
pub(crate) async fn owned(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SessionRecord, ApiError> {
    state
        .store
        .get_session(id, &caller.user)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found(format!("session {id} not found")))
}

/// Session `id` if the caller owns it, or it is shared with them for at least `need`
/// (`docs/chat.md#sharing`). Shared to read but asked to take part: 403; not shared: 404.
pub(crate) async fn reachable(
    state: &AppState,
    caller: &Caller,
    id: &str,
    need: crate::store::Access,
) -> Result<SessionRecord, ApiError> {
    reach(state, caller, id, need).await.map(|(s, _)| s)
}

/// [`reachable`], with what a share gives the caller (`None`: they own it).
pub(crate) async fn reach(
    state: &AppState,
    caller: &Caller,
    id: &str,
    need: crate::store::Access,
) -> Result<(SessionRecord, Option<crate::store::Access>), ApiError> {
    if let Some(s) = state
        .store
        .get_session(id, &caller.user)
        .await
        .map_err(ApiError::from)?
    {
        return Ok((s, None));
    }
    match state
        .store
        .shared_access(id, &caller.user, &caller.groups)
        .await
        .map_err(ApiError::from)?
    {
        Some((s, access)) if access >= need => Ok((s, Some(access))),
        Some(_) => Err(ApiError::forbidden(format!(
            "session {id} is shared with you to read; its owner can share it with access: continue"
        ))),
        None => {
            // A session a trigger started belongs to its policy's users: whoever may use
            // the policy takes part (`docs/triggers.md#results`).
            let not_found = || ApiError::not_found(format!("session {id} not found"));
            let session = state
                .store
                .session_by_id(id)
                .await
                .map_err(ApiError::from)?
                .filter(|s| s.trigger.is_some())
                .ok_or_else(not_found)?;
            let config = state.config.borrow().clone();
            let policy = config.catalog.policy_of(&session).ok_or_else(not_found)?;
            may_use(state, caller, policy)
                .await
                .map_err(|_| not_found())?;
            Ok((session, Some(crate::store::Access::Continue)))
        }
    }
}

/// Group whose members may read the audit log and usage reports in key mode.
pub const ADMIN_GROUP: &str = "kortex-admins";

/// What concerns every user — reports (`get` `/kortex/audit`, `/kortex/usage`), erasure
/// (`delete` `/kortex/erase`), other users' sessions (`delete` `/kortex/sessions`) — is for
/// members of [`ADMIN_GROUP`]; in cluster mode also for whoever RBAC lets `verb` that
/// non-resource URL (the `kortex-admin` ClusterRole); in loopback mode for the local user.
pub async fn admins_only(
    state: &AppState,
    caller: &Caller,
    what: &str,
    verb: &str,
    path: &str,
) -> Result<(), ApiError> {
    use super::auth::AuthMode;
    if state.auth == AuthMode::Loopback || caller.groups.iter().any(|g| g == ADMIN_GROUP) {
        return Ok(());
    }
    if let (AuthMode::Cluster, Some(cluster)) = (state.auth, &state.cluster_auth) {
        match cluster
            .may_access(&caller.user, &caller.groups, verb, path)
            .await
        {
            Ok(true) => return Ok(()),
            Ok(false) => {
                return Err(ApiError::forbidden(format!(
                    "{what} is for the group {ADMIN_GROUP} or users RBAC allows to {verb} {path} (ClusterRole kortex-admin)"
                )));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot review access to a report");
                return Err(ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "auth_unavailable",
                    "the Kubernetes API server could not check your access; try again",
                ));
            }
        }
    }
    // Behind an authenticating proxy in key mode too: the group decides.
    Err(ApiError::forbidden(format!(
        "{what} is for members of the group {ADMIN_GROUP}"
    )))
}
