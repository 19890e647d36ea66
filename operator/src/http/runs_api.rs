//! `/chat/v1/sessions/{id}/runs/{runId}/…`: pause, resume, redirect and cancel a run, from
//! any replica ([`crate::chat::control`] owns the state machine; these are its doors).

use super::AppState;
use super::access::{json_body, reachable};
use super::auth::Caller;
use super::error::ApiError;
use crate::chat::control::{self, Control, ControlError, Input, Refusal};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Refused(r @ Refusal::Final { .. }) => {
                ApiError::new(StatusCode::CONFLICT, "run_final", r.to_string())
            }
            ControlError::Refused(r @ Refusal::State { .. }) => {
                ApiError::new(StatusCode::CONFLICT, "run_state", r.to_string())
            }
            ControlError::NotFound(_) => ApiError::not_found(e.to_string()),
            ControlError::Rewind(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "rewind_invalid", e.to_string())
            }
            ControlError::PlanEdit(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "plan_edit_invalid", e.to_string())
            }
            ControlError::Store(e) => ApiError::from(e),
        }
    }
}

async fn control(
    state: &AppState,
    caller: &Caller,
    (id, run): (&str, &str),
    control: Control,
    input: Input<'_>,
) -> Result<Response, ApiError> {
    let session = reachable(state, caller, id, crate::store::Access::Continue).await?;
    let out = control::apply(&state.engine, &session, run, &caller.user, control, input).await?;
    Ok((StatusCode::ACCEPTED, Json(out)).into_response())
}

/// A control handler that takes no body: the run's path in, the control applied.
macro_rules! bodiless {
    ($(#[$doc:meta])* $name:ident => $control:expr) => {
        $(#[$doc])*
        pub async fn $name(
            State(state): State<AppState>,
            Extension(caller): Extension<Caller>,
            Path((id, run)): Path<(String, String)>,
        ) -> Result<Response, ApiError> {
            control(&state, &caller, (&id, &run), $control, Input::default()).await
        }
    };
}

bodiless! {
    /// `POST …/runs/{runId}/pause`: the run stops at its next step boundary.
    pause => Control::Pause
}

bodiless! {
    /// `POST …/runs/{runId}/resume`.
    resume => Control::Resume
}

/// `POST …/runs/{runId}/redirect` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Redirect {
    message: String,
    rewind_to: Option<i64>,
}

/// `POST …/runs/{runId}/redirect` `{message, rewindTo?}`: kept before the answer, taken in by
/// the run as a user turn at its next step boundary, exactly once; `rewindTo: N` (a step of
/// the run's `step.boundary` events) first drops the later steps from what the model sees.
pub async fn redirect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
    body: Result<Json<Redirect>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    if body.message.trim().is_empty() || body.message.len() > 32_768 {
        return Err(ApiError::invalid(
            "message must be 1 to 32768 bytes: what the model should do instead",
        ));
    }
    control(
        &state,
        &caller,
        (&id, &run),
        Control::Redirect,
        Input {
            message: Some(&body.message),
            rewind_to: body.rewind_to,
            steps: None,
        },
    )
    .await
}

bodiless! {
    /// `POST …/runs/{runId}/cancel` (the session's `/cancel` does the same for its run).
    cancel => Control::Cancel
}

/// `POST …/runs/{runId}/plan/approve` body: optionally the step ids kept, in order.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    steps: Option<Vec<String>>,
}

/// `POST …/runs/{runId}/plan/approve` `{steps?}`: the run goes on with the plan (edited:
/// steps removed or reordered); only its steps' tools run.
pub async fn approve_plan(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
    body: Option<Json<Approve>>,
) -> Result<Response, ApiError> {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let input = Input {
        steps: body.steps.as_deref(),
        ..Input::default()
    };
    control(&state, &caller, (&id, &run), Control::ApprovePlan, input).await
}

bodiless! {
    /// `POST …/runs/{runId}/plan/reject`: the run is cancelled.
    reject_plan => Control::RejectPlan
}

/// `GET …/runs/{runId}/follow-ups`: the questions suggested after the run completed
/// (`{runId, questions}`; `questions` is empty when none were, e.g. without a `summarize`
/// model).
pub async fn follow_ups(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let session = reachable(&state, &caller, &id, crate::store::Access::Read).await?;
    state
        .store
        .run_record(&run)
        .await
        .map_err(ApiError::from)?
        .filter(|r| r.session_id == session.id)
        .ok_or_else(|| ApiError::from(ControlError::NotFound(run.clone())))?;
    let found = state
        .store
        .latest_run_event(&id, &run, crate::chat::event::FOLLOW_UPS)
        .await
        .map_err(ApiError::from)?;
    let questions = found
        .map(|d| d["questions"].clone())
        .unwrap_or_else(|| serde_json::json!([]));
    Ok(Json(serde_json::json!({"runId": run, "questions": questions})).into_response())
}
