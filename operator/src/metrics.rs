//! Prometheus metrics (`kortex_*`), rendered in the text exposition format at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of `kortex_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success`, or `error` when some document could not be loaded.
    pub result: &'static str,
}

/// Labels of `kortex_config_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// Kind.
    pub kind: &'static str,
    /// `true` or `false`.
    pub available: &'static str,
}

/// Labels of `kortex_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Method.
    pub method: String,
    /// Matched route template (never the raw path, to keep cardinality bounded).
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Configuration reloads by result.
    pub config_reloads: Family<ReloadLabels, Counter>,
    /// Manifest documents currently failing to load.
    pub config_errors: Gauge,
    /// Unix time of the last reload.
    pub config_last_reload: Gauge<f64, AtomicU64>,
    /// Objects served, by kind and availability.
    pub config_objects: Family<ObjectLabels, Gauge>,
    /// HTTP requests by route and status.
    pub http_requests: Family<HttpLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kortex");
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let config_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration loads and reloads, by result",
            config_reloads.clone(),
        );
        let config_errors = Gauge::default();
        registry.register(
            "config_errors",
            "Manifest documents currently failing to load",
            config_errors.clone(),
        );
        let config_last_reload = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "config_last_reload_timestamp_seconds",
            "Unix time of the last configuration load",
            config_last_reload.clone(),
        );
        let config_objects = Family::<ObjectLabels, Gauge>::default();
        registry.register(
            "config_objects",
            "Objects served, by kind and availability",
            config_objects.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests, by route and status",
            http_requests.clone(),
        );
        Self {
            registry,
            config_reloads,
            config_errors,
            config_last_reload,
            config_objects,
            http_requests,
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
