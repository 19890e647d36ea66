//! Cluster mode (`kortex run`): the operator side of Kortex. The custom resources and the
//! Secrets they reference are watched and compiled into the live configuration the chat
//! server runs on (`watch`); statuses and Events are written by the leader (`status`), which
//! holds the Lease (`lease`); `ActionProposal` objects are created, moved and executed
//! (`proposals`, with the shared rules and executor of [`crate::proposals`]) only while the
//! admission policy that authenticates decisions is enforced (`admission_guard`); callers
//! are reviewed with TokenReview and SubjectAccessReview (`auth`); the egress guard learns
//! Kortex's own addresses (`own_addresses`).
//!
//! Imports `proposals`, `tools`, `llm` and below; never `chat`, `http` or `cli` (the chat
//! engine reaches the reconciler through [`proposals::ProposalHost`]).

pub mod admission_guard;
pub mod auth;
pub mod error;
pub mod lease;
pub mod own_addresses;
pub mod proposals;
pub mod status;
pub mod watch;

/// The API server refuses Event notes over 1 KiB: `text` cut to fit, on a character
/// boundary.
pub fn event_note(text: &str) -> String {
    const MAX: usize = 1024;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut cut = MAX - '…'.len_utf8();
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// A Kubernetes client for `config` that retries 429, 503 and 504 briefly (3 tries, 0.5 s
/// doubling to 5 s, as kube's `RetryPolicy::default`) instead of kube's default of 15 tries
/// backing off towards minutes: an overloaded or unreachable API server is then an error
/// within seconds (a tool's answer to the model, a status write retried later) rather than a
/// call that hangs until its deadline. Watches and the Lease retry on their own schedules.
pub fn kube_client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    // Retrying needs a service it can clone: the buffer's handle (its worker only hands
    // requests on; their responses are awaited concurrently).
    let layers = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(
            kube::client::retry::RetryPolicy::default(),
        ))
        .layer(tower::buffer::BufferLayer::new(1024));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layers)
        .build())
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_notes_fit_in_a_kibibyte() {
        let long = "é".repeat(900);
        let note = super::event_note(&long);
        assert!(note.len() <= 1024 && note.ends_with('…'), "{}", note.len());
        assert_eq!(super::event_note("short"), "short");
    }
}
