//! What one client may send or hold open: request size, a slow request head, event streams
//! and sessions per user. Each limit is a flag of `kortex serve` and `kortex run`, answers
//! with a specific error (413, 431 or 429) and counts in `kortex_limit_rejections_total`.
//! The per-policy limit on concurrent runs is `ChatPolicy.spec.budget.maxConcurrentRuns`.

use super::AppState;
use super::error::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// hyper's smallest read buffer, which is also the smallest header limit it accepts.
const MIN_HEADER_BYTES: usize = 8192;

/// The limits' flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest request body accepted, in bytes; larger ones get 413 `request_too_large`.
    #[arg(long, env = "KORTEX_MAX_REQUEST_BYTES", default_value_t = 8 << 20, value_name = "BYTES")]
    pub max_request_bytes: usize,
    /// Largest request head (request line and headers), in bytes, at least 8192; larger
    /// ones get 431.
    #[arg(long, env = "KORTEX_MAX_HEADER_BYTES", default_value_t = 64 << 10, value_name = "BYTES",
          value_parser = parse_header_bytes)]
    pub max_header_bytes: usize,
    /// How long a client may take to send a request head, and how long a keep-alive
    /// connection may stay idle; a slower one is disconnected. The default stays above the
    /// 60 s idle timeout of common load balancers and ingress controllers, which reuse idle
    /// connections (a backend closing them first causes occasional 502s).
    #[arg(long, env = "KORTEX_HEADER_TIMEOUT", default_value = "75s", value_parser = crate::crd::parse_duration)]
    pub header_timeout: Duration,
    /// Event streams one user may hold open at once on each replica; more get 429
    /// `too_many_streams`.
    #[arg(
        long,
        env = "KORTEX_MAX_STREAMS_PER_USER",
        default_value_t = 16,
        value_name = "N"
    )]
    pub max_streams_per_user: usize,
    /// Sessions one user may have (deleted ones do not count); more get 429
    /// `too_many_sessions`.
    #[arg(
        long,
        env = "KORTEX_MAX_SESSIONS_PER_USER",
        default_value_t = 1000,
        value_name = "N"
    )]
    pub max_sessions_per_user: u64,
    /// The largest tool result (built-in, plugin or client-executed) the model gets whole,
    /// in bytes, at least 1024; a larger one is stored and the model gets an index to read
    /// it in chunks (`read_result_chunk`).
    #[arg(long, env = "KORTEX_MAX_TOOL_RESULT_BYTES", default_value_t = crate::tools::DEFAULT_MAX_RESULT_BYTES,
          value_name = "BYTES", value_parser = parse_result_bytes)]
    pub max_tool_result_bytes: usize,
}

impl Default for LimitArgs {
    fn default() -> Self {
        Self {
            max_request_bytes: 8 << 20,
            max_header_bytes: 64 << 10,
            header_timeout: Duration::from_secs(75),
            max_streams_per_user: 16,
            max_sessions_per_user: 1000,
            max_tool_result_bytes: crate::tools::DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

fn parse_result_bytes(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of bytes: {e}"))?;
    if n < 1024 {
        return Err(format!(
            "{n} is too small: a tool result cap is at least 1024 bytes"
        ));
    }
    Ok(n)
}

fn parse_header_bytes(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of bytes: {e}"))?;
    if n < MIN_HEADER_BYTES {
        return Err(format!("must be at least {MIN_HEADER_BYTES} bytes"));
    }
    Ok(n)
}

/// The limits in force, and the event streams each user holds open.
#[derive(Debug, Default)]
pub struct Limits {
    /// The configured values.
    pub args: LimitArgs,
    streams: Mutex<HashMap<String, usize>>,
}

impl Limits {
    /// Limits with `args`.
    pub fn new(args: LimitArgs) -> Arc<Self> {
        Arc::new(Self {
            args,
            streams: Mutex::default(),
        })
    }

    /// Takes one of `user`'s event-stream slots, held until the returned guard is dropped
    /// (when the stream ends or its client goes away); 429 `too_many_streams` when all are
    /// taken.
    pub fn open_stream(
        self: &Arc<Self>,
        user: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Result<StreamSlot, ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let open = streams.entry(user.to_owned()).or_default();
        if *open >= self.args.max_streams_per_user {
            metrics.refused("streams_per_user");
            let mut error = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "{user} already has {open} event streams open (the limit is {}); close one, e.g. another browser tab, and retry",
                    self.args.max_streams_per_user
                ),
            );
            error.retry_after = Some(5);
            return Err(error);
        }
        *open += 1;
        metrics.event_streams_open.inc();
        Ok(StreamSlot {
            limits: self.clone(),
            user: user.to_owned(),
            open: metrics.event_streams_open.clone(),
        })
    }

    /// Event streams `user` holds open on this replica.
    pub fn open_streams(&self, user: &str) -> usize {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.get(user).copied().unwrap_or(0)
    }
}

/// One open event stream; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    limits: Arc<Limits>,
    user: String,
    /// `kortex_event_streams_open`.
    open: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open.dec();
        let mut streams = self
            .limits
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(open) = streams.get_mut(&self.user) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.user);
            }
        }
    }
}

/// 413 `request_too_large`.
fn too_large(state: &AppState, max: usize) -> Response {
    state.metrics.refused("request_bytes");
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        format!("the request body is larger than {max} bytes (--max-request-bytes)"),
    )
    .into_response()
}

/// Bounds the request body at `--max-request-bytes`: one that declares more in its
/// `Content-Length` is refused at once; otherwise the body is handed on wrapped in a limit,
/// and read only when a handler reads it (after authentication, for the API), so nothing
/// is buffered for a request that is refused anyway. A handler that reads past the limit
/// gets an error its extractor answers with 413, which is said here as
/// `request_too_large` and counted.
pub async fn limit_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let max = state.limits.args.max_request_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(&state, max);
    }
    let (parts, body) = req.into_parts();
    let limited = Body::new(http_body_util::Limited::new(body, max));
    let response = next.run(Request::from_parts(parts, limited)).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(&state, max);
    }
    response
}

/// Serves `app` on `listener` with the limits on request heads, until `shutdown`
/// resolves; then open requests get [`super::DRAIN`] to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: &LimitArgs,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pass, and keep serving.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small streamed writes (SSE) must not wait for delayed ACKs (Nagle).
        let _ = tcp.set_nodelay(true);
        // The peer address is what `--auth-proxy-from` is checked against.
        let served = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = served.clone();
        let service = app
            .clone()
            .map_request(move |req: Request<hyper::body::Incoming>| {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
                let mut req = req.map(Body::new);
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            });
        let connection = builder.serve_connection(
            TokioIo::new(tcp),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let connection = graceful.watch(connection);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                if e.is_parse_too_large() {
                    metrics.refused("header_bytes");
                } else if e.is_timeout() && !served.load(std::sync::atomic::Ordering::Relaxed) {
                    // hyper's timer also closes a keep-alive connection left idle that long:
                    // only a connection that never completed a request head is refused.
                    metrics.refused("header_timeout");
                }
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Event streams never finish on their own: open requests get DRAIN to complete, then
    // the process goes on stopping (clients reconnect with Last-Event-ID).
    if tokio::time::timeout(super::DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            "open connections (event streams) closed after {}s",
            super::DRAIN.as_secs()
        );
    }
    Ok(())
}
