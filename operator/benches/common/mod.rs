//! What the benchmarks share: a local HTTP server, the real `kortex` binary started on a
//! manifest folder, and a process's resident memory. Each bench uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// When the benchmark started: the clock the provider's deltas are stamped with.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Microseconds since the benchmark started.
pub fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// A streaming OpenAI-compatible provider on 127.0.0.1: each call gets `deltas` text deltas
/// `gap` apart, each `t=<µs since the start>;` (clients read their latency back from it),
/// then usage and `[DONE]`.
pub async fn timed_provider(deltas: u32, gap: Duration) -> String {
    use axum::body::Body;
    use axum::response::Response;
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(move || async move {
                let frames = futures_util::stream::unfold(0u32, move |i| async move {
                    if i > deltas {
                        return None;
                    }
                    if i > 0 {
                        tokio::time::sleep(gap).await;
                    }
                    let frame = if i < deltas {
                        format!(
                            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t={};\"}},\"finish_reason\":null}}]}}\n\n",
                            now_us()
                        )
                    } else {
                        format!(
                            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{deltas}}}}}\n\ndata: [DONE]\n\n"
                        )
                    };
                    Some((Ok::<_, std::io::Error>(frame), i + 1))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(frames))
                    .unwrap_or_default()
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|| async { r#"{"data":[{"id":"m"}]}"# }),
        );
    serve(app).await
}

/// Serves `app` on a free port of 127.0.0.1; its `http://` URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// A running `kortex serve`.
pub struct Kortex {
    pub child: Child,
    /// Its `http://` URL.
    pub url: String,
    /// The rest of its log (warnings and errors: `RUST_LOG=warn`), read as it comes so that
    /// a full pipe never blocks the server.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Kortex {
    /// `kortex serve` (the release build) on `manifests` and `database_url`, with `extra`
    /// arguments, once it says where it listens.
    pub fn start(manifests: &Path, database_url: &str, extra: &[&str]) -> Self {
        Self::start_with_env(manifests, database_url, extra, &[])
    }

    /// [`Kortex::start`] with more environment variables (e.g. `OTEL_*`).
    pub fn start_with_env(
        manifests: &Path,
        database_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        // `KORTEX_BENCH_BIN`: another build to measure (e.g. the previous commit's, side by
        // side with this one).
        let bin = std::env::var("KORTEX_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kortex").to_owned());
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--manifests"])
            .arg(manifests)
            .args(["--database-url", database_url])
            .args(extra)
            // `KORTEX_BENCH_LOG`: another log filter (e.g. `warn,kortex::cli=info,sqlx=debug`
            // to see each statement; `kortex::cli=info` says where it listens).
            .env(
                "RUST_LOG",
                std::env::var("KORTEX_BENCH_LOG")
                    .unwrap_or_else(|_| "warn,kortex::cli=info".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
        let mut log = BufReader::new(stderr).lines();
        let mut addr = String::new();
        for line in log.by_ref().map_while(Result::ok) {
            if let Some(a) = line.split("listening on http://").nth(1) {
                addr = a.split_whitespace().next().unwrap_or_default().to_owned();
                break;
            }
        }
        assert!(!addr.is_empty(), "kortex never said where it listens");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in log.map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        Self {
            child,
            url: format!("http://{addr}"),
            log: lines,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(self) {}
}

/// A bench that panics does not leave its server running.
impl Drop for Kortex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A number from the environment, or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile of `sorted` microseconds, in milliseconds.
pub fn pct(sorted: &[u64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .map_or(0.0, |&v| v as f64 / 1000.0)
}

/// The benches' runtime: two workers (the machine's cores), with rustls' provider
/// installed for the clients.
pub fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The p50, p99 and largest of `sorted` microseconds, in milliseconds.
pub fn spread(sorted: &[u64]) -> (f64, f64, f64) {
    (
        pct(sorted, 0.5),
        pct(sorted, 0.99),
        sorted.last().map_or(0.0, |&v| v as f64 / 1000.0),
    )
}

/// The body `request` answers with (empty when it cannot be read); a request that cannot be
/// sent ends the bench.
pub async fn body_text(request: reqwest::RequestBuilder) -> String {
    request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .text()
        .await
        .unwrap_or_default()
}

/// [`body_text`] as JSON (`null` when it is not).
pub async fn body_json(request: reqwest::RequestBuilder) -> serde_json::Value {
    serde_json::from_str(&body_text(request).await).unwrap_or_default()
}

/// Reads the event stream `resp` to its end, handing each frame (up to its blank line) to
/// `frame` with when its chunk arrived (µs since the start): `true`, or `false` when the
/// stream broke off.
pub async fn sse_frames(resp: reqwest::Response, mut frame: impl FnMut(&str, u64)) -> bool {
    use futures_util::StreamExt;
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            return false;
        };
        let at = now_us();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let text: String = buf.drain(..end + 2).collect();
            frame(&text, at);
        }
    }
    true
}

/// The rest of `frame`'s first line that starts with `prefix` (`"event: "`, `"data: "`),
/// or `""`.
pub fn sse_field<'a>(frame: &'a str, prefix: &str) -> &'a str {
    frame
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_default()
}

/// The state a run ended in, from a `run.lifecycle` event's `data`; `None` while it starts.
pub fn run_end(data: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
    v["state"]
        .as_str()
        .filter(|state| *state != "started")
        .map(str::to_owned)
}

/// The `t=<µs>;` stamps of the text deltas in `text`: when the provider wrote each.
pub fn stamps(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.split("t=")
        .skip(1)
        .filter_map(|part| part.split(';').next()?.parse::<u64>().ok())
}

/// A new manifest folder holding `<name>.yaml`: the LLMProvider `up` (openai-compatible at
/// `base`, model `m`, local) and a ChatPolicy `all` that gives it to every session; and the
/// database to run on: `KORTEX_BENCH_DATABASE_URL`, or SQLite `<name>.db` in the folder.
pub fn upstream_manifests(base: &str, name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.path().join(format!("{name}.yaml")),
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: up}}\nspec: {{type: openai-compatible, baseUrl: \"{base}/v1\", defaultModel: m, locality: local}}\n---\n\
             apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: all}}\nspec: {{sessions: [\"*\"], provider: up}}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let db = std::env::var("KORTEX_BENCH_DATABASE_URL").unwrap_or_else(|_| {
        format!(
            "sqlite://{}",
            dir.path().join(format!("{name}.db")).display()
        )
    });
    (dir, db)
}

/// Creates a chat session named `name` on `kortex`; its id.
pub async fn create_session(client: &reqwest::Client, kortex: &str, name: &str) -> String {
    let created = body_json(
        client
            .post(format!("{kortex}/chat/v1/sessions"))
            .json(&serde_json::json!({"name": name})),
    )
    .await;
    created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {created}"))
        .to_owned()
}

/// Resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
