//! `GET /chat/v1/proposals` and `POST /chat/v1/proposals/{id}/approve|reject` (standalone
//! mode): a human decides, as the authenticated user, under the trust rules that apply
//! without a cluster — a decision is final, `requireDistinctApprover`, `approverGroups`
//! (from the credential's groups), and expiry.

use super::AppState;
use super::access::ApiQuery;
use super::auth::Caller;
use super::error::ApiError;
use crate::proposals::view;
use crate::store::{NewDecision, ProposalRecord, StoreError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

/// `?phase=` of the listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    phase: Option<String>,
}

/// `GET /chat/v1/proposals`: newest first, optionally by phase.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    // In cluster mode the leader expires the ActionProposals and mirrors them here.
    if state.engine.cluster.get().is_none() {
        crate::chat::proposals::expire(&state.engine)
            .await
            .map_err(ApiError::from)?;
    }
    let rows = state
        .store
        .list_proposals(q.phase.as_deref(), 500)
        .await
        .map_err(ApiError::from)?;
    // A proposal carries what the model saw in a private session: show it to its user and to
    // those who may decide it. In cluster mode that also takes the right to read
    // ActionProposals in its namespace (a SubjectAccessReview per namespace, cached), the
    // same right `kubectl kortex list` needs: a policy without approverGroups does not make
    // every signed-in user a reader of every proposal.
    let config = state.config.borrow().clone();
    let mut readable = std::collections::HashMap::<String, bool>::new();
    if let Some(cluster) = &state.cluster_auth
        && state.auth != super::auth::AuthMode::Loopback
    {
        for p in rows.iter().filter(|p| p.user != caller.user) {
            if readable.contains_key(&p.namespace) {
                continue;
            }
            // A review that fails hides that namespace's proposals from this listing (the
            // caller still sees their own) rather than failing the whole listing.
            let allowed = cluster
                .may_get_proposals(&caller.user, &caller.groups, &p.namespace)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(namespace = %p.namespace, error = %e, "cannot check who may read proposals there; not shown");
                    false
                });
            readable.insert(p.namespace.clone(), allowed);
        }
    }
    let visible = |p: &ProposalRecord| {
        if state.auth == super::auth::AuthMode::Loopback || p.user == caller.user {
            return true;
        }
        if state.cluster_auth.is_some() && readable.get(&p.namespace) != Some(&true) {
            return false;
        }
        may_decide(p, &caller, &config.catalog)
    };
    Ok(Json(
        json!({"items": rows.iter().filter(|p| visible(p)).map(view).collect::<Vec<_>>()}),
    ))
}

/// Whether the policy of `p` (as it is now) lets `caller` decide it: no `approverGroups`,
/// or the caller is in one of them.
fn may_decide(p: &ProposalRecord, caller: &Caller, catalog: &crate::catalog::Catalog) -> bool {
    let policy = p.policy.as_deref().and_then(|q| catalog.policy_named(q));
    policy.is_some_and(|policy| {
        let groups = &policy.object.spec.proposals.approver_groups;
        groups.is_empty() || caller.groups.iter().any(|g| groups.contains(g))
    })
}

/// Stored proposal `id` (standalone mode), if `caller` may see it: its proposer, or someone
/// who may decide the proposals of its policy. Anyone else learns nothing of it, not even
/// that it exists (404).
async fn stored_for(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<ProposalRecord, ApiError> {
    let not_found = || ApiError::not_found(format!("proposal {id} not found"));
    let p = state
        .store
        .get_proposal(id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(not_found)?;
    let config = state.config.borrow().clone();
    if state.auth != super::auth::AuthMode::Loopback
        && p.user != caller.user
        && !may_decide(&p, caller, &config.catalog)
    {
        return Err(not_found());
    }
    Ok(p)
}

/// Body of approve/reject.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    reason: Option<String>,
}

/// `POST /chat/v1/proposals/{id}/approve`
pub async fn approve(
    state: State<AppState>,
    caller: Extension<Caller>,
    id: Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    decide(state, caller, id, body, "Approve").await
}

/// `POST /chat/v1/proposals/{id}/undo` (standalone mode): the inverse of an executed
/// proposal, as a new `Pending` proposal — 201, or 200 with the one asked for before.
pub async fn undo(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if state.engine.cluster.get().is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "in_cluster",
            "in a cluster, ask for the undo with kubectl kortex undo NAME -n NAMESPACE: the leader creates the inverse proposal",
        ));
    }
    // Who may decide the proposals of its policy (or made it) may ask.
    let p = stored_for(&state, &caller, &id).await?;
    match crate::chat::proposals::undo(&state.engine, &p, &caller.user).await {
        Ok((undo, true)) => Ok((StatusCode::CREATED, Json(view(&undo))).into_response()),
        Ok((undo, false)) => Ok(Json(view(&undo)).into_response()),
        Err(crate::chat::proposals::UndoError::Refused(why)) => {
            Err(ApiError::new(StatusCode::CONFLICT, "cannot_undo", why))
        }
        Err(crate::chat::proposals::UndoError::Store(e)) => Err(ApiError::from(e)),
    }
}

/// `POST /chat/v1/proposals/{id}/reject`
pub async fn reject(
    state: State<AppState>,
    caller: Extension<Caller>,
    id: Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    decide(state, caller, id, body, "Reject").await
}

pub(super) async fn decide(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
    verdict: &'static str,
) -> Result<Json<Value>, ApiError> {
    // The body is optional: `{}` or nothing at all, or `{"reason": "..."}`.
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice::<DecideBody>(&body)
            .map_err(|e| ApiError::invalid(format!("expected {{\"reason\": \"...\"}}: {e}")))?
            .reason
    };
    if state.engine.cluster.get().is_some() {
        return decide_in_cluster(&state, &caller, &id, verdict, reason).await;
    }
    crate::chat::proposals::expire(&state.engine)
        .await
        .map_err(ApiError::from)?;
    let p = stored_for(&state, &caller, &id).await?;
    let config = state.config.borrow().clone();
    if p.phase != crate::crd::ProposalPhase::Pending.as_str() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "proposal_final",
            format!(
                "proposal {} is {} and can no longer be decided",
                p.name, p.phase
            ),
        ));
    }
    // The rules of the policy as it is now.
    let policy = p
        .policy
        .as_deref()
        .and_then(|q| config.catalog.policy_named(q));
    let approval = if let Some(policy) = policy {
        let rules = &policy.object.spec.proposals;
        if rules.require_distinct_approver && caller.user == p.user {
            return Err(ApiError::forbidden(format!(
                "{} proposed this in their own session; the policy requires someone else to decide",
                caller.user
            )));
        }
        if !rules.approver_groups.is_empty()
            && !caller
                .groups
                .iter()
                .any(|g| rules.approver_groups.contains(g))
        {
            return Err(ApiError::forbidden(format!(
                "only members of {} may decide proposals of this policy",
                rules.approver_groups.join(", ")
            )));
        }
        crate::proposals::approval(
            state.engine.executor.get().is_some(),
            &p,
            policy,
            &caller.user,
            &caller.groups,
            reason.as_deref(),
        )
    } else {
        return Err(ApiError::forbidden(format!(
            "the ChatPolicy {} that governed this proposal no longer exists; it cannot be decided",
            p.policy.as_deref().unwrap_or("-")
        )));
    };
    let (phase, message, action) = match verdict {
        "Approve" => (approval.phase, approval.message, approval.action),
        _ => (
            crate::crd::ProposalPhase::Rejected,
            format!(
                "rejected by {}{}",
                caller.user,
                reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            None,
        ),
    };
    let decision = json!({"verdict": verdict, "by": caller.user, "reason": reason});
    let updated = match state
        .store
        .decide_proposal(&id, p.version, &decision, phase, Some(&message))
        .await
    {
        Ok(u) => u,
        Err(StoreError::Conflict(m)) => {
            return Err(ApiError::new(StatusCode::CONFLICT, "proposal_final", m));
        }
        Err(e) => return Err(ApiError::from(e)),
    };
    let outcome = if verdict == "Approve" {
        "approved"
    } else {
        "rejected"
    };
    audit(&state, &p, &caller, outcome.into(), verdict, &reason).await;
    crate::chat::proposals::tell_session(&state.engine, &p, phase, &message).await;
    // Recorded as `Executing` in the same conditional write as the decision: whichever
    // replica wins it executes, once — after the session was told, so the outcome comes
    // after `Executing` in its events.
    if let Some(action) = action {
        tokio::spawn(crate::chat::proposals::execute_approved(
            state.engine.clone(),
            updated.clone(),
            action,
        ));
    }
    Ok(Json(view(&updated)))
}

/// Cluster mode: the decision is written to the ActionProposal with the caller's own
/// Kubernetes token (forwarded, as the Kubernetes Dashboard does), so the API server's
/// RBAC and the admission policy judge that person, never Kortex's ServiceAccount.
async fn decide_in_cluster(
    state: &AppState,
    caller: &Caller,
    id: &str,
    verdict: &str,
    reason: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let p = state
        .store
        .get_proposal(id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found(format!("proposal {id} not found")))?;
    // The proposal is not named here: without a Kubernetes identity nothing says the caller
    // may read it (the API server judges that, with their token).
    let (Some(who), Some(cluster)) = (&caller.kube, &state.cluster_auth) else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "kubernetes_identity_required",
            format!(
                "deciding needs a Kubernetes identity: sign in with a Kubernetes token, or run kubectl kortex {} NAME -n NAMESPACE (kubectl kortex list shows them)",
                verdict.to_ascii_lowercase()
            ),
        ));
    };
    let client = cluster.client_as(who).map_err(ApiError::internal)?;
    let api: kube::Api<crate::crd::ActionProposal> = kube::Api::namespaced(client, &p.namespace);
    let mut decision = json!({"verdict": verdict, "by": caller.user});
    if !caller.groups.is_empty() {
        decision["groups"] = json!(caller.groups);
    }
    if let Some(r) = &reason {
        decision["reason"] = json!(r);
    }
    let patch = json!({"spec": {"decision": decision}});
    match api
        .patch(
            &p.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Err(ApiError::forbidden(format!(
                "the cluster refused {}'s decision: {}",
                caller.user, s.message
            )));
        }
        Err(kube::Error::Api(s)) if matches!(s.code, 400 | 409 | 422) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "proposal_final",
                s.message.clone(),
            ));
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(ApiError::not_found(format!(
                "ActionProposal {}/{} no longer exists",
                p.namespace, p.name
            )));
        }
        Err(e) => return Err(ApiError::internal(e)),
    }
    let outcome = format!("{}-written", verdict.to_ascii_lowercase());
    audit(state, &p, caller, outcome, verdict, &reason).await;
    let mut out = view(&p);
    out["message"] =
        json!("decision written to the ActionProposal; Kortex acts on it within seconds");
    Ok(Json(out))
}

/// The `decision` audit row of a decision made through the API.
async fn audit(
    state: &AppState,
    p: &crate::store::ProposalRecord,
    caller: &Caller,
    outcome: String,
    verdict: &str,
    reason: &Option<String>,
) {
    let _ = state
        .store
        .record_decision(&NewDecision {
            kind: "decision".into(),
            namespace: Some(p.namespace.clone()),
            session_id: p.session_id.clone(),
            user: Some(caller.user.clone()),
            policy: p.policy.clone(),
            subject: p.name.clone(),
            outcome,
            detail: json!({"proposalId": p.id, "verdict": verdict, "reason": reason}),
            ..Default::default()
        })
        .await;
}
