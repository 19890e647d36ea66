//! `POST /api/v1/alerts/alertmanager`: Alertmanager's webhook receiver
//! (`docs/triggers.md#alertmanager`). Authenticated as the API (Alertmanager's
//! `http_config.authorization` sends the bearer token); the notification is matched against
//! the triggers its caller may fire and recorded before 200 is answered, so Alertmanager
//! retries only what was not recorded (a 5xx).

use super::AppState;
use super::auth::{AuthMode, Caller};
use super::error::ApiError;
use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

/// Largest notification accepted.
pub const MAX_BYTES: usize = 1 << 20;

/// `POST /api/v1/alerts/alertmanager`
pub async fn alertmanager(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if body.len() > MAX_BYTES {
        state.metrics.refused("request_bytes");
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the notification is {} bytes; at most {MAX_BYTES} are accepted (lower max_alerts in Alertmanager's webhook_config)",
                body.len()
            ),
        ));
    }
    let notification = crate::trigger::alert::parse(&body).map_err(ApiError::invalid)?;
    let firer = crate::trigger::Firer {
        user: &caller.user,
        groups: &caller.groups,
        open: state.auth == AuthMode::Loopback,
        kube: caller.kube.is_some(),
    };
    let receipt = crate::trigger::receive(&state.engine, &state.metrics, &firer, &notification)
        .await
        .map_err(|e| match e {
            crate::trigger::ReceiveError::Forbidden(m) => ApiError::forbidden(m),
            crate::trigger::ReceiveError::Unavailable(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "auth_unavailable", m)
            }
            crate::trigger::ReceiveError::Store(e) => ApiError::from(e),
        })?;
    Ok(Json(json!({
        "alerts": receipt.alerts,
        "matched": receipt.matched,
        "unmatched": receipt.unmatched,
        "events": receipt.events.iter().map(|(trigger, id)| json!({"trigger": trigger, "id": id})).collect::<Vec<_>>(),
    })))
}
