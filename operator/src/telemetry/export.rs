//! The OTLP trace exporter: configured by the standard OpenTelemetry environment variables,
//! off unless an endpoint is set, and never in a request's way.
//!
//! Ended spans go into a bounded queue ([`Queue`], `OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by
//! default); a thread of its own sends them in batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`,
//! every `OTEL_BSP_SCHEDULE_DELAY` ms). A full queue drops the span and a failed export drops
//! its batch — both counted in `kortex_trace_spans_dropped_total` — so an unreachable or slow
//! collector costs a request nothing but the span.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Label of `kortex_trace_spans_dropped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DropLabel {
    /// `queue_full` (the exporter fell behind) or `export_failed` (the collector refused or
    /// could not be reached).
    pub reason: &'static str,
}

static DROPPED: LazyLock<Family<DropLabel, Counter>> = LazyLock::new(Family::default);
static EXPORTED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Spans dropped, by reason (registered in every [`crate::metrics::Metrics`]).
pub fn spans_dropped() -> &'static Family<DropLabel, Counter> {
    &DROPPED
}

/// Spans the collector accepted.
pub fn spans_exported() -> &'static Counter {
    &EXPORTED
}

/// Which OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf` (the default): `POST {endpoint}/v1/traces`.
    HttpProtobuf,
    /// `grpc`: the collector's gRPC port (4317).
    Grpc,
}

/// The exporter's settings, from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The endpoint as configured (the exporter resolves the signal path itself).
    pub endpoint: String,
    /// Transport.
    pub protocol: Protocol,
    /// Spans waiting at most.
    pub max_queue: usize,
    /// Spans per export at most.
    pub max_batch: usize,
    /// How long spans wait for a batch to fill.
    pub delay: Duration,
    /// How long one export may take.
    pub export_timeout: Duration,
}

/// The environment variables the exporter reads (the OpenTelemetry SDK's names).
pub const VARIABLES: &[&str] = &[
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
];

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
    }
}

impl Settings {
    /// The settings, or `None` when traces are off: no `OTEL_EXPORTER_OTLP_ENDPOINT` nor
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`. `Err` names the variable that cannot work.
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_lookup()
    }

    fn from_lookup() -> Result<Option<Self>, String> {
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other:?}: Kortex exports traces over OTLP only (otlp or none)"
                ));
            }
        }
        let Some(endpoint) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
        else {
            return Ok(None);
        };
        let parsed = url::Url::parse(endpoint.trim())
            .map_err(|e| format!("the OTLP endpoint {endpoint:?} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "the OTLP endpoint {endpoint:?} must be an http:// or https:// URL"
            ));
        }
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
            .map(str::trim)
        {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other:?}: use http/protobuf (the default) or grpc"
                ));
            }
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048usize)?.max(1);
        let max_batch = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512usize)?.clamp(1, max_queue);
        let delay = Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000u64)?.max(1));
        let export_timeout =
            Duration::from_millis(number("OTEL_BSP_EXPORT_TIMEOUT", 30_000u64)?.max(1));
        Ok(Some(Self {
            endpoint: endpoint.trim().to_owned(),
            protocol,
            max_queue,
            max_batch,
            delay,
            export_timeout,
        }))
    }

    /// The endpoint for a log line: scheme, host and port (never credentials in a URL).
    pub fn endpoint_label(&self) -> String {
        match url::Url::parse(&self.endpoint) {
            Ok(u) => format!(
                "{}://{}{}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.port().map(|p| format!(":{p}")).unwrap_or_default()
            ),
            Err(_) => String::new(),
        }
    }
}

/// The service's resource: `service.name` (`OTEL_SERVICE_NAME`, else `kortex`),
/// `service.version`, and `OTEL_RESOURCE_ATTRIBUTES`.
fn resource() -> Resource {
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !named {
        builder = builder.with_service_name("kortex");
    }
    builder.build()
}

/// The queue between the spans and the exporter thread: ended spans are pushed under a
/// short lock and the thread is woken only when a batch is full (or to flush), never per
/// span (a wake-up per span cost more than the span).
#[derive(Debug)]
struct Shared {
    spans: Mutex<Vec<SpanData>>,
    /// Set when a batch is full, a flush is asked, or the process ends.
    wake: tokio::sync::Notify,
    /// Flushes asked for, each answered when what was queued before it is sent.
    flushes: Mutex<Vec<std::sync::mpsc::SyncSender<()>>>,
    max_queue: usize,
    max_batch: usize,
}

/// The processor: ended, sampled spans into the bounded queue, without waiting.
#[derive(Debug)]
struct Queue(std::sync::Arc<Shared>);

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let shared = &self.0;
        let queued = {
            let mut spans = shared.spans.lock().unwrap_or_else(|e| e.into_inner());
            if spans.len() >= shared.max_queue {
                None
            } else {
                spans.push(span);
                Some(spans.len())
            }
        };
        match queued {
            None => {
                DROPPED
                    .get_or_create(&DropLabel {
                        reason: "queue_full",
                    })
                    .inc();
            }
            Some(n) if n == shared.max_batch => shared.wake.notify_one(),
            Some(_) => {}
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// The queue, for [`flush`].
static SHARED: OnceLock<std::sync::Arc<Shared>> = OnceLock::new();
/// The provider, kept for the life of the process.
static PROVIDER: Mutex<Option<SdkTracerProvider>> = Mutex::new(None);

/// Starts the exporter thread and returns the tracer spans are recorded with.
pub fn start(settings: &Settings) -> Result<opentelemetry_sdk::trace::Tracer, String> {
    let shared = std::sync::Arc::new(Shared {
        spans: Mutex::new(Vec::with_capacity(settings.max_batch)),
        wake: tokio::sync::Notify::new(),
        flushes: Mutex::new(Vec::new()),
        max_queue: settings.max_queue,
        max_batch: settings.max_batch,
    });
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let resource = resource();
    let thread_settings = settings.clone();
    let thread_resource = resource.clone();
    let thread_shared = shared.clone();
    std::thread::Builder::new()
        .name("kortex-otlp".into())
        .spawn(move || exporter_thread(thread_settings, thread_resource, thread_shared, ready_tx))
        .map_err(|e| format!("cannot start the trace exporter's thread: {e}"))?;
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err("the trace exporter did not start".into()),
    }
    let _ = SHARED.set(shared.clone());
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_span_processor(Queue(shared))
        .build();
    let tracer = provider.tracer("kortex");
    *PROVIDER.lock().unwrap_or_else(|e| e.into_inner()) = Some(provider);
    Ok(tracer)
}

fn build_exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::WithExportConfig as _;
    let built = match settings.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(settings.export_timeout)
            .build(),
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_timeout(settings.export_timeout)
            .build(),
    };
    built.map_err(|e| format!("cannot build the OTLP exporter: {e}"))
}

fn exporter_thread(
    settings: Settings,
    resource: Resource,
    shared: std::sync::Arc<Shared>,
    ready: std::sync::mpsc::SyncSender<Result<(), String>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!(
                "cannot start the trace exporter's runtime: {e}"
            )));
            return;
        }
    };
    runtime.block_on(async move {
        let mut exporter = match build_exporter(&settings) {
            Ok(e) => e,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        exporter.set_resource(&resource);
        let _ = ready.send(Ok(()));
        let mut failures = Failures::default();
        loop {
            // A full batch or a flush wakes the thread early; otherwise spans wait at most
            // the schedule delay.
            let _ = tokio::time::timeout(settings.delay, shared.wake.notified()).await;
            let flushes: Vec<_> =
                std::mem::take(&mut *shared.flushes.lock().unwrap_or_else(|e| e.into_inner()));
            loop {
                let batch: Vec<SpanData> = {
                    let mut spans = shared.spans.lock().unwrap_or_else(|e| e.into_inner());
                    let n = spans.len().min(settings.max_batch);
                    spans.drain(..n).collect()
                };
                if batch.is_empty() {
                    break;
                }
                let full = batch.len() == settings.max_batch;
                send(&exporter, batch, &settings, &mut failures).await;
                if !full {
                    break;
                }
            }
            for ack in flushes {
                let _ = ack.send(());
            }
        }
    });
}

/// Export failures, logged at most once a minute.
#[derive(Default)]
struct Failures {
    logged: Option<Instant>,
    since: u64,
}

async fn send(
    exporter: &opentelemetry_otlp::SpanExporter,
    spans: Vec<SpanData>,
    settings: &Settings,
    failures: &mut Failures,
) {
    let n = spans.len() as u64;
    let result = tokio::time::timeout(settings.export_timeout, exporter.export(spans)).await;
    let error = match result {
        Ok(Ok(())) => {
            EXPORTED.inc_by(n);
            if failures.since > 0 {
                tracing::info!(
                    dropped = failures.since,
                    "the trace collector is reachable again"
                );
                *failures = Failures::default();
            }
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "no answer within {}s",
            settings.export_timeout.as_secs_f64()
        ),
    };
    DROPPED
        .get_or_create(&DropLabel {
            reason: "export_failed",
        })
        .inc_by(n);
    failures.since += n;
    if failures
        .logged
        .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
    {
        failures.logged = Some(Instant::now());
        tracing::warn!(endpoint = %settings.endpoint_label(), error = %error, dropped = failures.since, "cannot export traces; spans are dropped until the collector answers");
    }
}

/// Sends what is queued and waits for it (at most `timeout`). Call outside the async
/// runtime, before the process exits.
pub fn flush(timeout: Duration) {
    let Some(shared) = SHARED.get() else {
        return;
    };
    let (ack_tx, ack_rx) = std::sync::mpsc::sync_channel(1);
    shared
        .flushes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(ack_tx);
    shared.wake.notify_one();
    let _ = ack_rx.recv_timeout(timeout);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_counted_not_waited_for() {
        let shared = std::sync::Arc::new(Shared {
            spans: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            flushes: Mutex::new(Vec::new()),
            max_queue: 1,
            max_batch: 1,
        });
        let queue = Queue(shared.clone());
        let before = DROPPED
            .get_or_create(&DropLabel {
                reason: "queue_full",
            })
            .get();
        let span = || SpanData {
            span_context: opentelemetry::trace::SpanContext::new(
                opentelemetry::trace::TraceId::from_bytes([1; 16]),
                opentelemetry::trace::SpanId::from_bytes([2; 8]),
                opentelemetry::trace::TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "s".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: Default::default(),
        };
        // The first fits; the next two find the queue full and return at once.
        for _ in 0..3 {
            queue.on_end(span());
        }
        let after = DROPPED
            .get_or_create(&DropLabel {
                reason: "queue_full",
            })
            .get();
        assert_eq!(after - before, 2);
        assert_eq!(shared.spans.lock().map(|s| s.len()).unwrap_or(0), 1);
    }
}
