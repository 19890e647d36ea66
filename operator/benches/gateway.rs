//! Gateway overhead benchmark (`cargo bench -p kortex --bench gateway`): the added latency
//! (p50/p99) and throughput of `POST /v1/chat/completions` through the real `kortex`
//! binary against a fast local upstream, streamed and not, at several concurrencies, and
//! the server's resident memory growth under load. The same requests are sent straight to
//! the upstream for the baseline; "added" is the difference. Results: docs/benchmarks.md.
//!
//! Everything runs on this machine: the load generator and the upstream share the cores
//! with Kortex, so the numbers are an upper bound of what Kortex adds.

use axum::body::Body;
use axum::response::Response;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "kgw-bench-key-0123456789";
const SECONDS: u64 = 6;

fn upstream_reply(stream: bool) -> Response {
    if stream {
        let mut body = String::new();
        for part in ["Hello", " from", " upstream"] {
            body.push_str(&format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{part}\"}},\"finish_reason\":null}}]}}\n\n"
            ));
        }
        body.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
        body.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n");
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(body))
            .unwrap_or_default()
    } else {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from upstream"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#))
            .unwrap_or_default()
    }
}

async fn upstream() -> String {
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(|body: axum::body::Bytes| async move {
                let stream = body.windows(13).any(|w| w == b"\"stream\":true");
                upstream_reply(stream)
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|| async { r#"{"data":[{"id":"m"}]}"# }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

struct Run {
    p50_us: f64,
    p99_us: f64,
    rps: f64,
    errors: usize,
}

async fn load(url: &str, key: Option<&str>, stream: bool, concurrency: usize) -> Run {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let body = if stream {
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#
    } else {
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
    };
    let deadline = Instant::now() + Duration::from_secs(SECONDS);
    let workers = (0..concurrency).map(|_| {
        let client = client.clone();
        let url = format!("{url}/v1/chat/completions");
        let key = key.map(str::to_owned);
        async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let started = Instant::now();
                let mut r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body);
                if let Some(k) = &key {
                    r = r.bearer_auth(k);
                }
                match r.send().await {
                    Ok(resp) if resp.status().is_success() => {
                        // The whole body: a streamed answer counts until its last byte.
                        if resp.bytes().await.is_err() {
                            errors += 1;
                            continue;
                        }
                        latencies.push(started.elapsed());
                    }
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }
    });
    let results = futures_util::future::join_all(workers).await;
    let mut all: Vec<Duration> = results.iter().flat_map(|(l, _)| l.clone()).collect();
    let errors = results.iter().map(|(_, e)| e).sum();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Run {
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        rps: all.len() as f64 / SECONDS as f64,
        errors,
    }
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    runtime.block_on(async {
        let base = upstream().await;
        // `KORTEX_BENCH_UNLIMITED=1`: a policy without a budget (no reservation per call).
        let budget = if std::env::var("KORTEX_BENCH_UNLIMITED").is_ok_and(|v| v == "1") {
            ""
        } else {
            ", budget: {dailyUsdLimit: 1000000}"
        };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.path().join("bench.yaml"),
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: k}}\nstringData: {{key: sk-upstream-bench}}\n---\n\
                 apiVersion: v1\nkind: Secret\nmetadata: {{name: gw, labels: {{kortex.dev/credentials: gateway}}, annotations: {{kortex.dev/policy: apps}}}}\nstringData: {{team: bench, key: {KEY}}}\n---\n\
                 apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: up}}\nspec: {{type: openai-compatible, baseUrl: \"{base}/v1\", apiKeySecretRef: {{name: k, key: key}}, defaultModel: m, models: [{{id: m, cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 2}}}}]}}\n---\n\
                 apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: apps}}\nspec: {{sessions: [\"none\"], provider: up{budget}}}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let db = format!("sqlite://{}", dir.path().join("bench.db").display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args(["serve", "--listen", "127.0.0.1:0", "--manifests"])
            .arg(dir.path())
            .args(["--database-url", &db])
            .env("RUST_LOG", "warn,kortex::cli=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
        let mut addr = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = line.split("listening on http://").nth(1) {
                addr = a.split_whitespace().next().unwrap_or_default().to_owned();
                break;
            }
        }
        let kortex = format!("http://{addr}");
        let pid = child.id();
        // Warm up (connections, first database writes).
        load(&kortex, Some(KEY), false, 4).await;
        let rss_before = rss_kib(pid);
        let mut rss_peak = rss_before;
        println!("| mode | concurrency | direct p50 / p99 (µs) | via Kortex p50 / p99 (µs) | added p50 / p99 (µs) | Kortex req/s | errors |");
        println!("|---|---|---|---|---|---|---|");
        for stream in [false, true] {
            for concurrency in [1, 10, 50] {
                let direct = load(&base, None, stream, concurrency).await;
                let via = load(&kortex, Some(KEY), stream, concurrency).await;
                rss_peak = rss_peak.max(rss_kib(pid));
                println!(
                    "| {} | {concurrency} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {} |",
                    if stream { "streamed" } else { "not streamed" },
                    direct.p50_us,
                    direct.p99_us,
                    via.p50_us,
                    via.p99_us,
                    via.p50_us - direct.p50_us,
                    via.p99_us - direct.p99_us,
                    via.rps,
                    via.errors + direct.errors,
                );
            }
        }
        let rss_after = rss_kib(pid);
        println!(
            "\nKortex resident memory: {:.1} MiB after warm-up, {:.1} MiB peak, {:.1} MiB after the runs (growth {:.1} MiB)",
            rss_before as f64 / 1024.0,
            rss_peak as f64 / 1024.0,
            rss_after as f64 / 1024.0,
            (rss_peak.saturating_sub(rss_before)) as f64 / 1024.0
        );
        let _ = child.kill();
        let _ = child.wait();
    });
}
