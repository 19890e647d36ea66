//! The one error type of the HTTP API: `{"error": {"code", "message"}}` with a stable
//! snake_case code (documented in docs/api.md).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An API error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `not_found`.
    pub code: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// Seconds for a `Retry-After` header (rate limits and budgets).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429 `budget_exceeded`, naming the budget, its limit and when it resets.
    pub fn budget(e: &crate::govern::budget::Exceeded) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "budget_exceeded",
            e.to_string(),
        );
        error.retry_after = e.retry_after(crate::store::now_ms());
        error
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 401 `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 500 `internal`; the detail is logged, not sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the server log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// A store error: 503 `database_unavailable` when the database cannot be reached (it will
/// pass), 507 `storage_full` when its disk is full, 500 `internal` otherwise.
impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        let (status, code, message) = if e.is_full() {
            tracing::error!(error = %e, "the database's disk is full");
            (
                StatusCode::INSUFFICIENT_STORAGE,
                "storage_full",
                "the database's disk is full: nothing was stored; free space (or grow the volume) and retry",
            )
        } else if e.is_unavailable() {
            tracing::warn!(error = %e, "the database is unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the database cannot be reached; retry in a moment",
            )
        } else {
            return Self::internal(e);
        };
        Self::new(status, code, message)
    }
}
