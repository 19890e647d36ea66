//! What Kortex tells the people who run it: logs, and traces (metrics are in
//! [`crate::metrics`]).
//!
//! - Logs: human-readable lines by default, JSON lines (`--log-format json`) for clusters.
//!   The level comes from `RUST_LOG` (default `info`, with the MCP SDK's per-message lines
//!   at `warn`: they would log every MCP session's handshake and notifications; the kube
//!   client's per-request errors are off unless `RUST_LOG` names `kube_client`).
//! - Traces: OpenTelemetry spans, exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set ([`export`]); off otherwise, and then the
//!   spans are not even created. Spans are opened where the work is, with the helpers of
//!   [`trace`] (names and attributes of the OpenTelemetry GenAI and HTTP semantic
//!   conventions), under the one target [`trace::TARGET`] that only the exporter listens to:
//!   log lines do not carry them.

pub mod export;
pub mod trace;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// For people at a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The kube client's request tracing: it logs every failed API call at ERROR ("failed with
/// error client error (Connect)"), without saying what the call was for. Kortex logs each
/// condition itself, once, with what it was doing, where it handles it (a watch serving
/// the last known configuration, the Lease, a status write that will be retried), so these
/// lines are off unless `RUST_LOG` names the kube client.
const KUBE_CLIENT_REQUESTS: &str = "kube_client::client::builder";

/// The filter of log lines: `RUST_LOG`, never the trace spans, and not the kube client's
/// per-request errors unless asked for.
fn log_filter() -> EnvFilter {
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let mut off = vec![trace::TARGET];
    if !asked.contains("kube_client") {
        off.push(KUBE_CLIENT_REQUESTS);
    }
    off.into_iter().fold(filter, |filter, target| {
        match format!("{target}=off").parse() {
            Ok(directive) => filter.add_directive(directive),
            Err(_) => filter,
        }
    })
}

/// Installs the global subscriber (logs go to stderr) and, when the environment configures
/// an OTLP endpoint, the trace exporter. Safe to call more than once (the first call wins).
/// A trace configuration that cannot work (a malformed endpoint or sampler) is logged, and
/// the process runs without traces rather than not at all.
pub fn init(format: LogFormat) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let logs = match format {
        LogFormat::Text => logs.with_filter(log_filter()).boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_filter(log_filter())
            .boxed(),
    };
    // `Ok(None)`: off; `Ok(Some(endpoint))`: exporting there; `Err`: why not.
    let mut outcome: Result<Option<String>, String> = Ok(None);
    let traces = match export::Settings::from_env() {
        Ok(Some(settings)) => match export::start(&settings) {
            Ok(tracer) => {
                outcome = Ok(Some(settings.endpoint_label()));
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_tracked_inactivity(false)
                        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                            meta.is_span() && meta.target() == trace::TARGET
                        })),
                )
            }
            Err(e) => {
                outcome = Err(e);
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            outcome = Err(e);
            None
        }
    };
    let on = traces.is_some();
    if tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .is_ok()
    {
        trace::set_enabled(on);
        match outcome {
            Err(e) => {
                tracing::error!(error = %e, "traces are off: the OpenTelemetry settings cannot work")
            }
            Ok(Some(endpoint)) => tracing::info!(%endpoint, "exporting traces over OTLP"),
            Ok(None) => {}
        }
    }
}

/// Sends the spans still queued (at most `timeout`); call before the process exits.
pub fn shutdown(timeout: std::time::Duration) {
    export::flush(timeout);
}
