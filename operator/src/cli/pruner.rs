//! The pruner: a retention pass at start-up, then every `--retention-every` (15 minutes), on
//! the leader only
//! (standalone: the one process). `store/retention.rs` owns the deletes; this task decides
//! when, and with which windows: each `ChatPolicy`'s `spec.retention` over the flags.

use crate::catalog::Catalog;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::store::retention::{Governs, Pruned, Reason, Scope, Windows, millis};
use std::sync::Arc;
use tokio::sync::watch;

/// The scopes of one pass: one per policy that sets its own retention (unset fields take
/// `defaults`), then everything else on `defaults`. A policy whose retention does not parse
/// is not Ready (reason `InvalidSpec`) and is kept by the defaults meanwhile.
pub fn scopes(catalog: &Catalog, defaults: Windows) -> Vec<Scope> {
    let mut out = Vec::new();
    let mut own = Vec::new();
    for (key, policy) in &catalog.policies {
        let Some(retention) = &policy.object.spec.retention else {
            continue;
        };
        let Ok(parsed) = retention.parsed() else {
            continue;
        };
        let pick = |d: Option<std::time::Duration>, default: i64| d.map(millis).unwrap_or(default);
        let windows = Windows {
            sessions_ms: pick(parsed.sessions, defaults.sessions_ms),
            failed_runs_ms: pick(parsed.failed_runs, defaults.failed_runs_ms),
            tool_results_ms: pick(parsed.tool_results, defaults.tool_results_ms),
            usage_ms: pick(parsed.usage, defaults.usage_ms),
            audit_ms: pick(parsed.audit, defaults.audit_ms),
            max_stored_bytes_per_user: retention
                .max_stored_bytes_per_user
                .or(defaults.max_stored_bytes_per_user),
            responses_ms: defaults.responses_ms,
        };
        own.push((key.namespace.clone(), key.name.clone()));
        out.push(Scope {
            windows,
            governs: Governs::Policy {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
            },
        });
    }
    out.push(Scope {
        windows: defaults,
        governs: Governs::Rest(own),
    });
    out
}

/// Settled trigger events, alert groups and schedule slots are kept this long
/// (`docs/triggers.md`).
pub const TRIGGER_EVENTS: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// One pass: retention windows, size caps, then the sessions their users deleted (and
/// settled trigger events older than [`TRIGGER_EVENTS`]).
pub async fn pass(
    store: &Store,
    scopes: &[Scope],
) -> Result<Vec<(Reason, Pruned)>, crate::store::StoreError> {
    store
        .prune_trigger_events(crate::store::now_ms() - TRIGGER_EVENTS.as_millis() as i64)
        .await?;
    Ok(vec![
        (
            Reason::Retention,
            store.prune(crate::store::now_ms(), scopes).await?,
        ),
        (Reason::SizeCap, store.cap_sizes(scopes).await?),
        (Reason::SessionDeleted, store.purge_deleted().await?),
    ])
}

/// Prunes until `stop` flips; with `leader`, only while this replica leads (and at once
/// when it becomes the leader).
pub async fn run(
    store: Store,
    config: watch::Receiver<Arc<LiveConfig>>,
    defaults: Windows,
    every: std::time::Duration,
    metrics: Arc<Metrics>,
    mut leader: Option<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if leader.as_ref().is_none_or(|l| *l.borrow()) {
            let scopes = scopes(&config.borrow().catalog, defaults);
            let started = std::time::Instant::now();
            match pass(&store, &scopes).await {
                Ok(passes) => {
                    let took_ms = started.elapsed().as_millis() as u64;
                    for (reason, p) in passes {
                        for (kind, n) in p.counts() {
                            if n > 0 {
                                metrics.retention_deleted(kind, reason.as_str(), n);
                            }
                        }
                        if !p.is_empty() {
                            tracing::info!(reason = reason.as_str(), deleted = ?p, took_ms, "retention pass");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "retention pass failed; retrying at the next")
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
            _ = crate::operator::lease::leadership_changes(&mut leader) => {}
        }
    }
}
