//! Slack's door (`docs/slack.md`; issue 48, in progress): `POST /slack/v1/events`, the
//! Events API request URL of the Slack app a ChatPolicy's `spec.slack` declares. Every
//! request is checked before anything reads it: its signature over the raw body with the
//! signing secret of one of the configured apps (`slack::verify`), then its workspace
//! against that app's `teamId`. `url_verification` is answered; an event is taken once by
//! whichever replica gets it first (Slack retries what it did not see acknowledged within
//! 3 seconds), and acknowledged at once. Nothing unverified is stored or acted on.
//!
//! A taken mention (or a message of a thread with a session) is answered in its thread
//! behind the acknowledgement (`slack_conv`). The proposal buttons, `/kortex` and
//! hand-over are the next parts of issue 48.

use super::AppState;
use super::error::ApiError;
use crate::catalog::SlackResolved;
use crate::slack::inbound::{Event, Inbound};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The Events API request URL.
pub const EVENTS_PATH: &str = "/slack/v1/events";

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn refused(state: &AppState, status: StatusCode, code: &'static str, message: String) -> Response {
    state.metrics.slack_request("refused");
    tracing::info!(reason = %message, "refused a request to the Slack door");
    ApiError::new(status, code, message).into_response()
}

/// `POST /slack/v1/events`.
pub async fn events(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let config = state.config.borrow().clone();
    let apps: Vec<(&crate::catalog::ObjectKey, &SlackResolved)> = config
        .catalog
        .policies
        .iter()
        .filter_map(|(key, p)| p.slack.as_ref().map(|s| (key, s)))
        .collect();
    if apps.is_empty() {
        return refused(
            &state,
            StatusCode::NOT_FOUND,
            "slack_not_configured",
            "no ChatPolicy declares a Slack app (spec.slack) whose Secrets resolved".into(),
        );
    }
    // The app whose signing secret signed this body; the refusal the apps give otherwise
    // (a stale timestamp is named as such).
    let now = jiff::Timestamp::now().as_second();
    let mut refusal = None;
    let mut signed_by = None;
    for (policy, app) in &apps {
        match crate::slack::verify(
            app.signing_secret.expose().as_bytes(),
            header(&headers, "x-slack-request-timestamp"),
            header(&headers, "x-slack-signature"),
            &body,
            now,
        ) {
            Ok(()) => {
                signed_by = Some((*policy, *app));
                break;
            }
            Err(e) => refusal = Some(e),
        }
    }
    let Some((policy, app)) = signed_by else {
        let why = refusal.map(|e| e.to_string()).unwrap_or_default();
        return refused(&state, StatusCode::UNAUTHORIZED, "slack_unverified", why);
    };
    let content_type = header(&headers, "content-type").unwrap_or_default();
    let inbound = match crate::slack::parse(content_type, &body) {
        Ok(i) => i,
        Err(e) => return refused(&state, StatusCode::BAD_REQUEST, "invalid_request", e),
    };
    match inbound {
        Inbound::UrlVerification { challenge } => {
            state.metrics.slack_request("taken");
            tracing::info!(policy = %policy, "answered Slack's url_verification");
            axum::Json(json!({ "challenge": challenge })).into_response()
        }
        Inbound::Event(e) => {
            if e.team_id != app.spec.team_id {
                return refused(
                    &state,
                    StatusCode::FORBIDDEN,
                    "slack_wrong_workspace",
                    format!(
                        "the event is from workspace {}, not {} (ChatPolicy {policy})",
                        e.team_id, app.spec.team_id
                    ),
                );
            }
            let message = match &e.event {
                Event::Mention(m) | Event::Message(m) => Some(m),
                Event::Other(_) => None,
            };
            let elsewhere = message.is_some_and(|m| {
                !app.spec.channels.is_empty() && !app.spec.channels.contains(&m.channel)
            });
            let own = message.is_some_and(|m| !m.from_a_person());
            if elsewhere || own || message.is_none() {
                state.metrics.slack_request("ignored");
                return StatusCode::OK.into_response();
            }
            match state.store.claim_slack_event(&e.event_id).await {
                Ok(true) => {
                    state.metrics.slack_request("taken");
                    tracing::info!(policy = %policy, event = %e.event_id, "took a Slack event");
                    // Acknowledged now (Slack waits 3 s); answered in the thread behind it.
                    if let (Some(door), Some(m)) = (state.slack.clone(), message.cloned()) {
                        let mention = matches!(e.event, Event::Mention(_));
                        tokio::spawn(super::slack_conv::converse(
                            state.clone(),
                            door,
                            policy.clone(),
                            app.clone(),
                            e.team_id.clone(),
                            m,
                            mention,
                        ));
                    }
                    StatusCode::OK.into_response()
                }
                Ok(false) => {
                    state.metrics.slack_request("duplicate");
                    tracing::debug!(event = %e.event_id, retry = ?header(&headers, "x-slack-retry-num"), "a Slack event already taken");
                    StatusCode::OK.into_response()
                }
                // Not acknowledged: Slack retries, and the retry is taken once.
                Err(e) => ApiError::from(e).into_response(),
            }
        }
        _ => {
            state.metrics.slack_request("ignored");
            StatusCode::OK.into_response()
        }
    }
}
