//! What goes wrong in cluster mode, typed: the API server's (or the connection's) error
//! kept as the source, as controller-rs keeps it, and named for metrics and traces in one
//! place ([`Error::metric_label`], [`api_label`]).

use crate::proposals::executor::ExecError;
use std::time::Duration;

/// A cluster-mode failure. Its message is what the log, a refused request or a tool
/// result says; [`Error::metric_label`] is its short, bounded name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed: `doing` says which; `hint`, what to grant or check.
    #[error("{doing}: {}{}", describe(source), hint.map(|h| format!("; {h}")).unwrap_or_default())]
    Api {
        /// What Kortex was doing.
        doing: String,
        /// The client's error, kept.
        #[source]
        source: kube::Error,
        /// What the operator can do about it, if Kortex knows.
        hint: Option<&'static str>,
    },
    /// The API server did not answer in time.
    #[error("{doing}: no answer within {} ms", within.as_millis())]
    NoAnswer {
        /// What Kortex was doing.
        doing: &'static str,
        /// How long it waited.
        within: Duration,
    },
    /// A watch stopped before its first list (the process is shutting down).
    #[error("{doing}: {source}")]
    Watch {
        /// Which watches.
        doing: &'static str,
        /// The reflector's error.
        #[source]
        source: kube::runtime::reflector::store::WriterDropped,
    },
    /// The API server answered, but not with what Kortex can use (the message says why).
    #[error("{0}")]
    Unusable(String),
    /// A write whose outcome could not be learned (the message says what is known).
    #[error("{0}")]
    Unsettled(String),
    /// What was asked cannot be done as asked (the message says why).
    #[error("{0}")]
    Refused(String),
    /// The action could not be checked or carried out ([`ExecError`] says how).
    #[error(transparent)]
    Action(#[from] ExecError),
}

impl Error {
    /// An [`Error::Api`] while `doing`, for `map_err`.
    pub fn api(doing: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let doing = doing.into();
        move |source| Self::Api {
            doing,
            source,
            hint: None,
        }
    }

    /// An [`Error::Api`] while `doing`, with what to do about it.
    pub fn api_hinted(
        doing: impl Into<String>,
        hint: &'static str,
    ) -> impl FnOnce(kube::Error) -> Self {
        let doing = doing.into();
        move |source| Self::Api {
            doing,
            source,
            hint: Some(hint),
        }
    }

    /// The short name of the failure for metrics and traces (`error.type`): the API
    /// status class of a refused call, or what kind of failure it was.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Api { source, .. } => api_label(source),
            Self::NoAnswer { .. } => "timeout",
            Self::Watch { .. } => "watch",
            Self::Unusable(_) => "unusable",
            Self::Refused(_) => "refused",
            Self::Unsettled(_) => "unknown",
            Self::Action(e) => e.metric_label(),
        }
    }
}

/// The `error.type` of a failed API call: the status code, or the error's class.
pub fn api_label(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 409 => "409",
        kube::Error::Api(s) if s.code == 403 => "403",
        kube::Error::Api(s) if s.code == 404 => "404",
        kube::Error::Api(s) if s.code == 422 => "422",
        kube::Error::Api(s) if s.code >= 500 => "5xx",
        kube::Error::Api(_) => "4xx",
        _ => "transport",
    }
}

/// A kube error in words: the API server's message and code, or the chain of causes of a
/// transport failure.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => crate::tools::plugin_http::error_chain(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn an_api_error_reads_as_what_failed_why_and_what_to_do_and_is_labelled_by_its_class() {
        let e = Error::api_hinted("cannot list ValidatingAdmissionPolicies", "grant list")(
            refused(403, "no"),
        );
        assert_eq!(
            e.to_string(),
            "cannot list ValidatingAdmissionPolicies: no (403); grant list"
        );
        assert_eq!(e.metric_label(), "403");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the kube error is kept"
        );
        let e = Error::api("TokenReview failed")(refused(503, "busy"));
        assert_eq!(e.to_string(), "TokenReview failed: busy (503)");
        assert_eq!(e.metric_label(), "5xx");
        let e = Error::NoAnswer {
            doing: "reading the Lease",
            within: Duration::from_millis(1500),
        };
        assert_eq!(e.to_string(), "reading the Lease: no answer within 1500 ms");
        assert_eq!(e.metric_label(), "timeout");
    }
}
