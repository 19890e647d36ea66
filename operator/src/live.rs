//! The live configuration: the compiled catalog plus what the source said about it,
//! published through a `tokio::sync::watch` channel and swapped whole on every change, so
//! a request sees one consistent configuration from start to end.

use crate::catalog::{self, Catalog, ObjectKey, ObjectSet};
use crate::metrics::{Metrics, ObjectLabels, ReloadLabels};
use crate::source::manifest::{Identity, Origin, Problem, Severity};
use crate::source::{ManifestSource, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What the server currently runs on.
#[derive(Clone, Debug, Default)]
pub struct LiveConfig {
    /// The compiled catalog.
    pub catalog: Catalog,
    /// Problems found while loading (standalone mode).
    pub problems: Vec<Problem>,
    /// Where each object was defined (standalone mode).
    pub origins: BTreeMap<Identity, Origin>,
    /// Objects served from their last good version.
    pub stale: BTreeSet<Identity>,
    /// When this configuration was built.
    pub loaded_at: jiff::Timestamp,
    /// Increases with every reload (0: nothing loaded yet).
    pub version: u64,
    /// Objects of the cluster Kortex could not read (cluster mode).
    pub invalid: Vec<Malformed>,
}

/// A watched object (cluster mode) Kortex could not read; its status says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// `LLMProvider`, …
    pub kind: String,
    /// Where.
    pub key: ObjectKey,
    /// Field path and error.
    pub message: String,
}

impl LiveConfig {
    /// Compiles `snapshot`, carrying condition transition times over from `previous`.
    pub fn build(snapshot: Snapshot, previous: Option<&LiveConfig>, now: jiff::Timestamp) -> Self {
        let mut objects = snapshot.objects;
        if let Some(prev) = previous {
            carry_status(&mut objects, &prev.catalog);
        }
        Self {
            catalog: catalog::compile(&objects, now),
            problems: snapshot.problems,
            origins: snapshot.origins,
            stale: snapshot.stale,
            loaded_at: now,
            version: previous.map_or(1, |p| p.version + 1),
            invalid: Vec::new(),
        }
    }

    /// Problems that concern `id`.
    pub fn problems_of<'a>(&'a self, id: &'a Identity) -> impl Iterator<Item = &'a Problem> + 'a {
        self.problems
            .iter()
            .filter(move |p| p.object.as_ref() == Some(id))
    }

    /// Errors (not warnings).
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
    }
}

/// The status the previous catalog computed becomes the input's status, as in a cluster.
fn carry_status(objects: &mut ObjectSet, previous: &Catalog) {
    for p in &mut objects.providers {
        if let Some(e) = previous.providers.get(&ObjectKey::of(p)) {
            p.status = e.object.status.clone();
        }
    }
    for t in &mut objects.tools {
        if let Some(e) = previous.tools.get(&ObjectKey::of(t)) {
            t.status = e.object.status.clone();
        }
    }
    for c in &mut objects.policies {
        if let Some(e) = previous.policies.get(&ObjectKey::of(c)) {
            c.status = e.object.status.clone();
        }
    }
}

/// Loads `source` once and records the outcome (logs and metrics).
pub fn load(
    source: &mut ManifestSource,
    previous: Option<&LiveConfig>,
    metrics: &Metrics,
) -> LiveConfig {
    let now = jiff::Timestamp::now();
    let snapshot = source.load(now);
    let result = if snapshot.has_errors() {
        "error"
    } else {
        "success"
    };
    let config = LiveConfig::build(snapshot, previous, now);
    for p in &config.problems {
        match p.severity {
            Severity::Error => tracing::error!(problem = %p, "manifest problem"),
            Severity::Warning => tracing::warn!(problem = %p, "manifest warning"),
        }
    }
    let c = &config.catalog;
    tracing::info!(
        version = config.version,
        providers = c.providers.len(),
        providers_available = c.providers.values().filter(|p| p.available).count(),
        tools = c.tools.len(),
        policies = c.policies.len(),
        errors = config.errors().count(),
        "configuration loaded"
    );
    for problem in &c.credentials.problems {
        tracing::warn!(%problem, "credential Secret skipped");
    }
    metrics
        .config_reloads
        .get_or_create(&ReloadLabels { result })
        .inc();
    metrics
        .config_last_reload
        .set(now.as_millisecond() as f64 / 1000.0);
    record_objects(metrics, &config);
    config
}

/// Sets `kortex_config_errors` (documents failing to load, and cluster objects Kortex cannot
/// read) and `kortex_config_objects` from `config`.
pub fn record_objects(metrics: &Metrics, config: &LiveConfig) {
    metrics
        .config_errors
        .set((config.errors().count() + config.invalid.len()) as i64);
    let counts = [
        (
            "LLMProvider",
            config
                .catalog
                .providers
                .values()
                .map(|p| p.available)
                .collect::<Vec<_>>(),
        ),
        (
            "KortexTool",
            config.catalog.tools.values().map(|t| t.available).collect(),
        ),
        (
            "ChatPolicy",
            config
                .catalog
                .policies
                .values()
                .map(|p| p.available)
                .collect(),
        ),
    ];
    for (kind, avail) in counts {
        for (flag, label) in [(true, "true"), (false, "false")] {
            let n = avail.iter().filter(|a| **a == flag).count();
            metrics
                .config_objects
                .get_or_create(&ObjectLabels {
                    kind,
                    available: label,
                })
                .set(n as i64);
        }
    }
}

/// How often the manifest files are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long the files must stay unchanged before a reload (editors write in steps).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Watches the manifest files and publishes a new configuration after each change, until
/// `shutdown` flips. Objects whose documents broke keep their last good version.
pub async fn watch_manifests(
    mut source: ManifestSource,
    tx: watch::Sender<Arc<LiveConfig>>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    // What the current configuration was read from, not what the files are now: a file
    // written after the first load and before this task ran is a change to pick up.
    let mut seen = source.loaded().clone();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        let mut current = source.fingerprint();
        if current == seen {
            continue;
        }
        // Debounce: wait until the files stop changing.
        loop {
            tokio::time::sleep(DEBOUNCE).await;
            let next = source.fingerprint();
            if next == current {
                break;
            }
            current = next;
        }
        let previous = tx.borrow().clone();
        let metrics2 = metrics.clone();
        // File reads and parsing are blocking work; keep them off the async workers.
        let joined = tokio::task::spawn_blocking(move || {
            let config = load(&mut source, Some(&previous), &metrics2);
            (source, config)
        })
        .await;
        match joined {
            Ok((back, config)) => {
                source = back;
                seen = source.loaded().clone();
                tx.send_replace(Arc::new(config));
            }
            Err(e) => {
                tracing::error!(error = %e, "manifest reload task failed; manifests are no longer watched");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROVIDER: &str = "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: NAME}\nspec: {type: ollama, defaultModel: m}\n";

    // A file written after the first load but before the watcher's task first ran (a busy
    // machine, a slow start) was taken as already seen and never loaded.
    #[tokio::test]
    async fn a_change_made_before_the_watcher_starts_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str| {
            std::fs::write(
                dir.path().join(format!("{name}.yaml")),
                PROVIDER.replace("NAME", name),
            )
            .unwrap();
        };
        write("first");
        let mut source =
            ManifestSource::new(vec![dir.path().to_path_buf()], Box::new(|_| None)).unwrap();
        let metrics = Arc::new(Metrics::new());
        let initial = load(&mut source, None, &metrics);
        assert_eq!(initial.catalog.providers.len(), 1);
        let (tx, mut rx) = watch::channel(Arc::new(initial));
        write("second");
        let (_stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(watch_manifests(source, tx, metrics, stop_rx));
        let reloaded = tokio::time::timeout(Duration::from_secs(10), rx.changed()).await;
        task.abort();
        assert!(
            matches!(reloaded, Ok(Ok(()))),
            "the second file was never loaded"
        );
        assert_eq!(rx.borrow().catalog.providers.len(), 2);
    }
}
