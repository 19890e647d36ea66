//! Provider health: each available provider's models endpoint is called at start-up, after
//! every configuration change and then periodically. The result feeds the `Reachable`
//! condition and the discovered model list shown by `/api/v1/llm/providers` (and, in
//! cluster mode, the provider's status).

use super::ErrorKind;
use crate::catalog::{Catalog, ObjectKey, ProviderEntry};
use crate::live::LiveConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Reasons of the `Reachable` condition.
pub mod reasons {
    /// The endpoint answered.
    pub const REACHABLE: &str = "Reachable";
    /// The endpoint answered but refused the key: reachable, misconfigured.
    pub const AUTH_FAILED: &str = "AuthFailed";
    /// No answer (connection refused, DNS, TLS, timeout).
    pub const UNREACHABLE: &str = "Unreachable";
    /// The endpoint answered with an error.
    pub const PROBE_FAILED: &str = "ProbeFailed";
    /// `claude-code`: Claude Code refused the credential in `authSecretRef`.
    pub const CLAUDE_CODE_AUTH_FAILED: &str = "ClaudeCodeAuthFailed";
    /// `claude-code`: the CLI does not run, or is too old for Kortex's flags.
    pub const CLAUDE_CODE_UNUSABLE: &str = "ClaudeCodeUnusable";
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeResult {
    /// Whether the endpoint answered at all (an auth failure counts as reachable).
    pub reachable: bool,
    /// Whether the answer was a success.
    pub ok: bool,
    /// A reason from [`reasons`].
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
    /// Models the endpoint listed.
    pub models: Vec<String>,
    /// Round-trip time.
    pub latency_ms: u64,
    /// When.
    pub checked_at: jiff::Timestamp,
}

impl ProbeResult {
    /// The `Reachable` condition.
    pub fn condition(&self, generation: Option<i64>) -> Condition {
        Condition {
            type_: crate::crd::conditions::types::REACHABLE.to_owned(),
            status: if self.ok { "True" } else { "False" }.to_owned(),
            reason: self.reason.to_owned(),
            message: self.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(self.checked_at),
        }
    }
}

/// Where `command` is: itself when it names a path, else the first match on `PATH`.
pub fn locate(command: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(command);
    if command.contains('/') {
        return path.is_file().then(|| path.to_owned());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(command))
            .find(|candidate| candidate.is_file())
    })
}

/// Whether `command` can be run (it is a file, or on `PATH`): the check the catalog makes
/// for a `claude-code` provider's CLI, installed with [`crate::catalog::check_commands_with`].
pub fn installed(command: &str) -> bool {
    locate(command).is_some()
}

/// Latest probe per provider, shared between the prober and the API.
pub type ProbeBoard = Arc<RwLock<BTreeMap<ObjectKey, ProbeResult>>>;

/// Probes one provider (which must be available).
pub async fn probe(entry: &ProviderEntry) -> ProbeResult {
    let started = Instant::now();
    let outcome = match super::build(entry) {
        Ok(adapter) => adapter.list_models().await,
        Err(e) => Err(e),
    };
    let latency_ms = started.elapsed().as_millis() as u64;
    let claude_code = entry.provider_type() == crate::crd::ProviderType::ClaudeCode;
    let (reachable, ok, reason, message, models) = match outcome {
        Ok(models) => (
            true,
            true,
            reasons::REACHABLE,
            format!("listed {} model(s) in {latency_ms} ms", models.len()),
            models,
        ),
        Err(e) if e.kind == ErrorKind::Auth && claude_code => (
            true,
            false,
            reasons::CLAUDE_CODE_AUTH_FAILED,
            format!(
                "Claude Code refused the credential in spec.authSecretRef (renew it with `claude setup-token`): {}",
                e.message
            ),
            Vec::new(),
        ),
        Err(e) if e.kind == ErrorKind::Config && claude_code => (
            false,
            false,
            reasons::CLAUDE_CODE_UNUSABLE,
            e.message,
            Vec::new(),
        ),
        Err(e) if e.kind == ErrorKind::Auth => (
            true,
            false,
            reasons::AUTH_FAILED,
            format!("reachable, but the key was refused: {}", e.message),
            Vec::new(),
        ),
        Err(e) if matches!(e.kind, ErrorKind::Connection | ErrorKind::Timeout) => {
            (false, false, reasons::UNREACHABLE, e.message, Vec::new())
        }
        Err(e) => (
            true,
            false,
            reasons::PROBE_FAILED,
            format!("{}: {}", e.kind.as_str(), e.message),
            Vec::new(),
        ),
    };
    ProbeResult {
        reachable,
        ok,
        reason,
        message,
        models,
        latency_ms,
        checked_at: jiff::Timestamp::now(),
    }
}

/// Probes every available provider of `catalog` concurrently and replaces the board.
pub async fn probe_all(catalog: &Catalog, board: &ProbeBoard) {
    let targets: Vec<(ObjectKey, &ProviderEntry)> = catalog
        .providers
        .iter()
        .filter(|(_, e)| e.available)
        .map(|(k, e)| (k.clone(), e))
        .collect();
    let results =
        futures_util::future::join_all(targets.into_iter().map(|(key, entry)| async move {
            let result = probe(entry).await;
            (key, result)
        }))
        .await;
    for (key, result) in &results {
        if !result.ok {
            tracing::warn!(provider = %key, reason = result.reason, message = %result.message, "provider probe failed");
        }
    }
    if let Ok(mut b) = board.write() {
        *b = results.into_iter().collect();
    }
}

/// Writes the models each probe listed into the live catalog (`discoveredModels`), so that
/// a provider without `models` serves what its endpoint lists, and a model the endpoint no
/// longer lists goes. Whether anything changed.
pub fn fold(config: &watch::Sender<Arc<LiveConfig>>, board: &ProbeBoard) -> bool {
    let Ok(board) = board.read().map(|b| b.clone()) else {
        return false;
    };
    config.send_if_modified(|live| {
        let stale: Vec<ObjectKey> = live
            .catalog
            .providers
            .iter()
            .filter(|(key, entry)| {
                entry.object.spec.provider_type.discovers_models()
                    && board.get(*key).is_some_and(|p| {
                        p.ok && entry.object.status.as_ref().map(|s| &s.discovered_models)
                            != Some(&p.models)
                    })
            })
            .map(|(key, _)| key.clone())
            .collect();
        // A claude-code credential the probe saw refused: the provider is not ready (it
        // cannot answer anything), until its Secret or spec changes and it is compiled anew.
        let refused: Vec<ObjectKey> = live
            .catalog
            .providers
            .iter()
            .filter(|(key, entry)| {
                entry.available
                    && entry.provider_type() == crate::crd::ProviderType::ClaudeCode
                    && board
                        .get(*key)
                        .is_some_and(|p| p.reason == reasons::CLAUDE_CODE_AUTH_FAILED)
            })
            .map(|(key, _)| key.clone())
            .collect();
        if stale.is_empty() && refused.is_empty() {
            return false;
        }
        let mut next = LiveConfig::clone(live);
        for key in refused {
            if let (Some(entry), Some(probe)) =
                (next.catalog.providers.get_mut(&key), board.get(&key))
            {
                entry.available = false;
                let generation = entry.object.metadata.generation;
                let status = entry.object.status.get_or_insert_default();
                crate::crd::conditions::set(
                    &mut status.conditions,
                    &crate::crd::conditions::Desired::fail(
                        crate::crd::conditions::types::READY,
                        reasons::CLAUDE_CODE_AUTH_FAILED,
                        probe.message.clone(),
                    ),
                    generation,
                    probe.checked_at,
                );
            }
        }
        for key in stale {
            if let (Some(entry), Some(probe)) =
                (next.catalog.providers.get_mut(&key), board.get(&key))
            {
                let status = entry.object.status.get_or_insert_default();
                crate::catalog::set_discovered(status, &entry.object.spec, &probe.models);
            }
        }
        *live = Arc::new(next);
        true
    })
}

/// Probes at start-up, after every configuration change, and every `interval`, until
/// `shutdown` flips; what the probes list is folded into the live catalog.
pub async fn run(
    config_tx: watch::Sender<Arc<LiveConfig>>,
    board: ProbeBoard,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut config = config_tx.subscribe();
    loop {
        let current = config.borrow_and_update().clone();
        probe_all(&current.catalog, &board).await;
        // A change that arrived during the round (a reload, a new provider) is probed next;
        // only our own fold needs no new probe.
        let external = config.has_changed().unwrap_or(false);
        if fold(&config_tx, &board) && !external {
            config.borrow_and_update();
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            changed = config.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}
