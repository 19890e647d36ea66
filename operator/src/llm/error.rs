//! Typed provider errors. Messages name the provider and never contain its key.

use std::fmt;
use std::time::Duration;

/// What kind of failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The key was refused (401/403).
    Auth,
    /// Too many requests (429); see `retry_after`.
    RateLimited,
    /// The prompt does not fit the model's context window.
    ContextTooLong,
    /// The provider rejected the request (400/404/422).
    BadRequest,
    /// The provider failed (5xx, overloaded).
    Upstream,
    /// No answer in time.
    Timeout,
    /// The endpoint could not be reached.
    Connection,
    /// The provider's answer did not follow its wire format.
    Protocol,
    /// The provider is not configured usably.
    Config,
}

impl ErrorKind {
    /// Stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::RateLimited => "rate_limited",
            Self::ContextTooLong => "context_too_long",
            Self::BadRequest => "bad_request",
            Self::Upstream => "upstream",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::Protocol => "protocol",
            Self::Config => "config",
        }
    }
}

/// A failed provider call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlmError {
    /// What kind.
    pub kind: ErrorKind,
    /// `LLMProvider` name.
    pub provider: String,
    /// What happened (the provider's own message where it gave one, key removed).
    pub message: String,
    /// HTTP status, when there was one.
    pub status: Option<u16>,
    /// How long the provider asked us to wait.
    pub retry_after: Option<Duration>,
    /// The transport's own words, when `message` says it for a user (events' `detail`
    /// field and the log; key removed too).
    pub detail: Option<String>,
}

impl LlmError {
    /// An error of `kind` for `provider`.
    pub fn new(kind: ErrorKind, provider: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            provider: provider.to_owned(),
            message: message.into(),
            status: None,
            retry_after: None,
            detail: None,
        }
    }

    /// With the transport's own words kept beside the message.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Worth another attempt (before any output was streamed)? Only what can succeed on a
    /// retry: rate limits, server faults (not 501 Not Implemented or 505), connection
    /// failures and timeouts. A 500 is retried once (see `retry`).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::RateLimited
                | ErrorKind::Upstream
                | ErrorKind::Connection
                | ErrorKind::Timeout
        ) && !matches!(self.status, Some(501 | 505))
    }

    /// The error for an HTTP status and the provider's message.
    pub fn from_status(
        provider: &str,
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    ) -> Self {
        let lower = message.to_ascii_lowercase();
        let kind = match status {
            401 | 403 => ErrorKind::Auth,
            429 => ErrorKind::RateLimited,
            413 => ErrorKind::ContextTooLong,
            400 | 422
                if lower.contains("context length")
                    || lower.contains("context window")
                    || lower.contains("maximum context")
                    || lower.contains("too long")
                    || lower.contains("too many tokens") =>
            {
                ErrorKind::ContextTooLong
            }
            400..=499 => ErrorKind::BadRequest,
            _ => ErrorKind::Upstream,
        };
        let message = if message.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {message}")
        };
        Self {
            kind,
            provider: provider.to_owned(),
            message,
            status: Some(status),
            retry_after,
            detail: None,
        }
    }

    /// Removes `secret` from the message (providers sometimes echo part of a bad key).
    pub fn redact(mut self, secret: Option<&str>) -> Self {
        if let Some(s) = secret.filter(|s| s.len() >= 4) {
            self.message = self.message.replace(s, "***");
        }
        self
    }
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "provider {}: {}: {}",
            self.provider,
            self.kind.as_str(),
            self.message
        )?;
        if let Some(d) = self.retry_after {
            write!(f, " (retry after {}s)", d.as_secs())?;
        }
        Ok(())
    }
}

impl std::error::Error for LlmError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        let k = |s, m: &str| LlmError::from_status("p", s, m.to_owned(), None).kind;
        assert_eq!(k(401, "invalid x-api-key"), ErrorKind::Auth);
        assert_eq!(k(429, ""), ErrorKind::RateLimited);
        assert_eq!(
            k(400, "This model's maximum context length is 128000 tokens"),
            ErrorKind::ContextTooLong
        );
        assert_eq!(
            k(400, "prompt is too long: 210000 tokens > 200000 maximum"),
            ErrorKind::ContextTooLong
        );
        assert_eq!(k(400, "messages: field required"), ErrorKind::BadRequest);
        assert_eq!(k(529, "Overloaded"), ErrorKind::Upstream);
        assert!(LlmError::from_status("p", 503, String::new(), None).is_retryable());
        assert!(!LlmError::from_status("p", 401, String::new(), None).is_retryable());
    }

    #[test]
    fn display_names_provider_and_redacts() {
        let e = LlmError::from_status(
            "openai",
            401,
            "Incorrect API key provided: sk-live-123".into(),
            None,
        )
        .redact(Some("sk-live-123"));
        assert_eq!(
            e.to_string(),
            "provider openai: auth: HTTP 401: Incorrect API key provided: ***"
        );
    }
}
