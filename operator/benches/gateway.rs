//! Gateway overhead benchmark (`cargo bench -p kortex --bench gateway`): the added latency
//! (p50/p99), throughput and CPU time per request of `POST /v1/chat/completions` through
//! the real `kortex` binary against a fast local upstream, streamed and not, at several
//! concurrencies, and the server's resident memory growth under load. The same requests are
//! sent straight to the upstream for the baseline; "added" is the difference. Results:
//! docs/benchmarks.md.
//!
//! Three upstreams: one that answers after 15 to 25 ms (a fast model: the requests are in
//! flight together, as an application's are), one that answers after exactly 20 ms (the
//! workers fall into step and their requests arrive in bursts of the whole concurrency),
//! and one that answers at once (every worker sends back to back: the three processes
//! saturate the machine, which measures the ceiling).
//! Everything runs on this machine: the load generator and the upstream share the cores
//! with Kortex, so the numbers are an upper bound of what Kortex adds.
//!
//! `KORTEX_BENCH_UNLIMITED=1`: the gateway key's policy has no budget.
//! `KORTEX_BENCH_CONCURRENCY=1000` (or `10,50`): the concurrencies of each row.
//! `KORTEX_BENCH_BIN=/path/to/kortex`: measure another build (e.g. the previous commit's).
//! `KORTEX_BENCH_LITELLM=/path/to/litellm` (default: `target/bench-venv/bin/litellm` when it
//! exists): LiteLLM's proxy, one worker, on the same upstream, measured in the same run
//! (saturation rows at 50 concurrent) with the CPU-per-call ratio to Kortex; set but empty:
//! Kortex alone.
//! After the runs, every call served must have its usage and audit row (checked).
//! `KORTEX_BENCH_SECONDS=N`: seconds per row (default 6).
//! `KORTEX_BENCH_DATABASE_URL=postgres://...`: Kortex's database (default: a new SQLite file).
//! `KORTEX_BENCH_ONLY=m20/plain/50`: only the rows whose `model/mode/concurrency` contains
//! this (`m20`, `m20s` or `m`; `plain` or `stream`), e.g. to profile one of them
//! (`KORTEX_BENCH_ONLY=tracing`: only the tracing comparison).
//! Tracing: the same build with traces exported (to an OTLP sink in this process) and
//! without, side by side, alternately, in three rounds; `KORTEX_BENCH_TRACING=0` skips it.

mod common;

use axum::body::Body;
use axum::response::Response;
use common::{Kortex, rss_kib};
use std::time::{Duration, Instant};

const KEY: &str = "kgw-bench-key-0123456789";
/// The model name that makes the upstream wait 15 to 25 ms (uniformly) before it answers.
const SLOW_MODEL: &str = "m20";
/// The model name that makes the upstream wait exactly 20 ms: the workers fall into step,
/// and their requests arrive in bursts of the whole concurrency at once.
const LOCKSTEP_MODEL: &str = "m20s";

/// Whether the JSON `body` asks for `model`.
fn asks_for(body: &[u8], model: &str) -> bool {
    let quoted = format!("\"model\":\"{model}\"");
    body.windows(quoted.len()).any(|w| w == quoted.as_bytes())
}

/// A delay uniform in 15..25 ms (a cheap generator: only the spread matters).
fn jittered_delay() -> Duration {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    Duration::from_micros(15_000 + x % 10_000)
}

fn seconds() -> u64 {
    std::env::var("KORTEX_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

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
                if asks_for(&body, SLOW_MODEL) {
                    tokio::time::sleep(jittered_delay()).await;
                } else if asks_for(&body, LOCKSTEP_MODEL) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                upstream_reply(stream)
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|| async { r#"{"data":[{"id":"m"}]}"# }),
        );
    common::serve(app).await
}

/// User plus system CPU time of process `pid`, in microseconds.
fn cpu_us(pid: u32) -> f64 {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may contain spaces): utime is the 12th.
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .unwrap_or(0.0);
    // The kernel counts in USER_HZ, 100 on Linux.
    ticks * 10_000.0
}

struct Run {
    p50_us: f64,
    p99_us: f64,
    /// Time to the first byte of the body.
    ttfb_p50_us: f64,
    ttfb_p99_us: f64,
    rps: f64,
    errors: usize,
    requests: usize,
}

/// Which API a load calls.
#[derive(Clone, Copy)]
enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/responses`, keeping each response (`store`) or not.
    Responses { store: bool },
}

async fn load(url: &str, key: Option<&str>, model: &str, stream: bool, concurrency: usize) -> Run {
    load_api(url, key, model, stream, concurrency, Api::Chat).await
}

async fn load_api(
    url: &str,
    key: Option<&str>,
    model: &str,
    stream: bool,
    concurrency: usize,
    api: Api,
) -> Run {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let (path, body) = match api {
        Api::Chat => (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]{}}}"#,
                if stream { r#","stream":true"# } else { "" }
            ),
        ),
        Api::Responses { store } => (
            "/v1/responses",
            format!(
                r#"{{"model":"{model}","input":"hi","store":{store}{}}}"#,
                if stream { r#","stream":true"# } else { "" }
            ),
        ),
    };
    let seconds = seconds();
    // The first second warms connections up and is not counted.
    let start = Instant::now();
    let counted_from = start + Duration::from_secs(1);
    let deadline = counted_from + Duration::from_secs(seconds);
    let workers = (0..concurrency).map(|_| {
        let client = client.clone();
        let url = format!("{url}{path}");
        let key = key.map(str::to_owned);
        let body = body.clone();
        async move {
            let mut latencies = Vec::new();
            let mut firsts = Vec::new();
            let mut errors = 0;
            let mut done = 0usize;
            while Instant::now() < deadline {
                let started = Instant::now();
                let mut r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                if let Some(k) = &key {
                    r = r.bearer_auth(k);
                }
                match r.send().await {
                    Ok(mut resp) if resp.status().is_success() => {
                        // The first byte of the body (time to first byte), then the whole
                        // body: a streamed answer counts until its last byte.
                        let mut first = None;
                        let read = loop {
                            match resp.chunk().await {
                                Ok(Some(_)) => {
                                    first.get_or_insert_with(|| started.elapsed());
                                }
                                Ok(None) => break true,
                                Err(_) => break false,
                            }
                        };
                        if !read {
                            errors += 1;
                            continue;
                        }
                        done += 1;
                        if started >= counted_from {
                            latencies.push(started.elapsed());
                            firsts.push(first.unwrap_or_else(|| started.elapsed()));
                        }
                    }
                    _ => errors += 1,
                }
            }
            (latencies, firsts, errors, done)
        }
    });
    let results = futures_util::future::join_all(workers).await;
    let mut all: Vec<Duration> = results.iter().flat_map(|r| r.0.clone()).collect();
    let mut firsts: Vec<Duration> = results.iter().flat_map(|r| r.1.clone()).collect();
    let errors = results.iter().map(|r| r.2).sum();
    let requests = results.iter().map(|r| r.3).sum();
    all.sort();
    firsts.sort();
    let pct = |v: &[Duration], p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Run {
        p50_us: pct(&all, 0.50),
        p99_us: pct(&all, 0.99),
        ttfb_p50_us: pct(&firsts, 0.50),
        ttfb_p99_us: pct(&firsts, 0.99),
        rps: all.len() as f64 / seconds as f64,
        errors,
        requests,
    }
}

fn main() {
    let runtime = common::runtime();
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
                 apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: up}}\nspec: {{type: openai-compatible, baseUrl: \"{base}/v1\", apiKeySecretRef: {{name: k, key: key}}, defaultModel: m, models: [{{id: m, cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 2}}}}, {{id: {SLOW_MODEL}, cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 2}}}}, {{id: {LOCKSTEP_MODEL}, cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 2}}}}]}}\n---\n\
                 apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: apps}}\nspec: {{sessions: [\"none\"], provider: up{budget}}}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let db = std::env::var("KORTEX_BENCH_DATABASE_URL")
            .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("bench.db").display()));
        let server = Kortex::start(dir.path(), &db, &[]);
        let kortex = server.url.clone();
        let pid = server.pid();
        // Warm up (connections, first database writes).
        let mut served = load(&kortex, Some(KEY), "m", false, 4).await.requests;
        let mut saturated: Saturated = Vec::new();
        // `KORTEX_BENCH_CONCURRENCY=1000`: other concurrencies than 1, 10 and 50.
        let concurrencies: Vec<usize> = std::env::var("KORTEX_BENCH_CONCURRENCY")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 10, 50]);
        let rss_before = rss_kib(pid);
        let mut rss_peak = rss_before;
        for (model, title) in [
            (SLOW_MODEL, "Upstream answering after 15 to 25 ms"),
            (LOCKSTEP_MODEL, "Upstream answering after exactly 20 ms (requests in bursts)"),
            ("m", "Upstream answering at once (saturation)"),
        ] {
            println!("\n{title}:\n");
            println!("| mode | concurrency | direct p50 / p99 (µs) | via Kortex p50 / p99 (µs) | added p50 / p99 (µs) | added to first byte p50 / p99 (µs) | Kortex req/s | Kortex CPU µs/req | errors |");
            println!("|---|---|---|---|---|---|---|---|---|");
            for stream in [false, true] {
                for &concurrency in &concurrencies {
                    let row = format!(
                        "{model}/{}/{concurrency}",
                        if stream { "stream" } else { "plain" }
                    );
                    if std::env::var("KORTEX_BENCH_ONLY").is_ok_and(|only| !row.contains(&only)) {
                        continue;
                    }
                    let direct = load(&base, None, model, stream, concurrency).await;
                    let cpu_before = cpu_us(pid);
                    let via = load(&kortex, Some(KEY), model, stream, concurrency).await;
                    let cpu = cpu_us(pid) - cpu_before;
                    served += via.requests;
                    if model == "m" && concurrency == 50 {
                        saturated.push((stream, via.rps, cpu / via.requests.max(1) as f64));
                    }
                    rss_peak = rss_peak.max(rss_kib(pid));
                    println!(
                        "| {} | {concurrency} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {:.0} | {} |",
                        if stream { "streamed" } else { "not streamed" },
                        direct.p50_us,
                        direct.p99_us,
                        via.p50_us,
                        via.p99_us,
                        via.p50_us - direct.p50_us,
                        via.p99_us - direct.p99_us,
                        via.ttfb_p50_us - direct.ttfb_p50_us,
                        via.ttfb_p99_us - direct.ttfb_p99_us,
                        via.rps,
                        cpu / via.requests.max(1) as f64,
                        via.errors + direct.errors,
                    );
                }
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
        books(&db, served).await;
        responses_vs_chat(&server).await;
        if std::env::var("KORTEX_BENCH_TRACING").map_or(true, |v| v != "0") {
            tracing_overhead(dir.path(), &base, &server).await;
        }
        server.stop();
        if let Some(litellm) = litellm_bin() {
            side_by_side(&litellm, &base, &saturated).await;
        }
    });
}

/// LiteLLM's `litellm` command, if it is installed for the comparison.
fn litellm_bin() -> Option<String> {
    // Set but empty: Kortex alone.
    if let Ok(bin) = std::env::var("KORTEX_BENCH_LITELLM") {
        return (!bin.is_empty()).then_some(bin);
    }
    let default = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/bench-venv/bin/litellm"
    );
    std::path::Path::new(default)
        .exists()
        .then(|| default.to_owned())
}

/// User plus system CPU time of `pid` and its children (uvicorn workers), in microseconds.
fn tree_cpu_us(pid: u32) -> f64 {
    let mut total = cpu_us(pid);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let parent = std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                });
            if parent == Some(pid) {
                total += cpu_us(child);
            }
        }
    }
    total
}

/// Kortex's saturation rows at 50 concurrent: `(streamed, req/s, CPU µs per call)`.
type Saturated = Vec<(bool, f64, f64)>;

/// Starts LiteLLM's proxy (one worker, a master key, no database: its documented production
/// settings that apply without one) on the same upstream, loads it as Kortex was loaded at
/// saturation, and prints both side by side with the ratio of CPU per call.
async fn side_by_side(litellm: &str, upstream: &str, kortex: &Saturated) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n      api_base: {upstream}/v1\n      api_key: sk-upstream-bench\n\
             litellm_settings:\n  set_verbose: false\n  json_logs: true\n  drop_params: true\n\
             general_settings:\n  master_key: sk-litellm-bench\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut child = std::process::Command::new(litellm)
        .args(["--config"])
        .arg(&config)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--num_workers",
            "1",
        ])
        .env("LITELLM_LOG", "ERROR")
        .env("LITELLM_TELEMETRY", "False")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {litellm}: {e}"));
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let up = client
            .get(format!("{url}/health/liveliness"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if up {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("LiteLLM's proxy did not start within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Warm up.
    load(&url, Some("sk-litellm-bench"), "m", false, 4).await;
    println!("\nSide by side, upstream answering at once, 50 concurrent (same run):\n");
    println!(
        "| mode | Kortex req/s | Kortex CPU µs/req | LiteLLM req/s | LiteLLM CPU µs/req | LiteLLM CPU / Kortex CPU per call | LiteLLM errors |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (stream, rps, cpu) in kortex {
        let before = tree_cpu_us(child.id());
        let run = load(&url, Some("sk-litellm-bench"), "m", *stream, 50).await;
        let used = tree_cpu_us(child.id()) - before;
        let per_call = used / run.requests.max(1) as f64;
        println!(
            "| {} | {rps:.0} | {cpu:.0} | {:.0} | {per_call:.0} | {:.0}x | {} |",
            if *stream { "streamed" } else { "not streamed" },
            run.rps,
            per_call / cpu.max(1.0),
            run.errors,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits (up to 30 s) until every call Kortex served has its usage row and its audit row —
/// nothing accepted is lost in a burst — and says so; panics otherwise.
async fn books(database_url: &str, served: usize) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{e}")) as usize
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let usage = count("SELECT count(*) FROM usage_events WHERE source = 'gateway'").await;
        let audit = count("SELECT count(*) FROM decisions WHERE kind = 'llm_call'").await;
        if usage >= served && audit >= served {
            println!(
                "Books: {served} calls served, {usage} usage rows and {audit} audit rows written."
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "books incomplete 30 s after the load: {served} calls served, {usage} usage rows, {audit} audit rows"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An OTLP/HTTP sink: takes every export, counts the requests.
async fn otlp_sink() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let exports = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = exports.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |_body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    (common::serve(app).await, exports)
}

/// Tracing on against off: a second server exporting every span (sampler always on) to a
/// sink, measured alternately with `off` at 50 concurrent calls, three rounds.
async fn tracing_overhead(manifests: &std::path::Path, base: &str, off: &Kortex) {
    let (sink, exports) = otlp_sink().await;
    let db = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let on = Kortex::start_with_env(
        manifests,
        &format!("sqlite://{}", db.path().join("traced.db").display()),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.as_str()),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ],
    );
    let _ = load(&on.url, Some(KEY), "m", false, 4).await;
    println!(
        "\nTracing exported (every span, to an OTLP sink) against off, 50 concurrent, 3 alternating rounds:\n"
    );
    println!(
        "| mode | off: CPU µs/req, added p50 / p99 (µs), req/s | on: CPU µs/req, added p50 / p99 (µs), req/s | CPU on/off |"
    );
    println!("|---|---|---|---|");
    for (model, stream, name) in [
        ("m", false, "at once, not streamed"),
        ("m", true, "at once, streamed"),
        (SLOW_MODEL, false, "15-25 ms, not streamed"),
    ] {
        let mut sums = [[0.0f64; 4]; 2];
        for _ in 0..3 {
            let direct = load(base, None, model, stream, 50).await;
            for (i, server) in [off, &on].into_iter().enumerate() {
                let before = cpu_us(server.pid());
                let via = load(&server.url, Some(KEY), model, stream, 50).await;
                let cpu = (cpu_us(server.pid()) - before) / via.requests.max(1) as f64;
                sums[i][0] += cpu / 3.0;
                sums[i][1] += (via.p50_us - direct.p50_us) / 3.0;
                sums[i][2] += (via.p99_us - direct.p99_us) / 3.0;
                sums[i][3] += via.rps / 3.0;
            }
        }
        let [a, b] = sums;
        println!(
            "| {name} | {:.0}, {:.0} / {:.0}, {:.0} | {:.0}, {:.0} / {:.0}, {:.0} | {:.2}x |",
            a[0],
            a[1],
            a[2],
            a[3],
            b[0],
            b[1],
            b[2],
            b[3],
            b[0] / a[0].max(1e-9)
        );
    }
    println!(
        "\n{} OTLP exports received from the traced server.",
        exports.load(std::sync::atomic::Ordering::Relaxed)
    );
    on.stop();
}

/// The Responses API beside Chat Completions through Kortex, at saturation (50 concurrent,
/// the upstream answering at once): req/s and CPU per call, and the ratio.
async fn responses_vs_chat(server: &Kortex) {
    if std::env::var("KORTEX_BENCH_ONLY")
        .is_ok_and(|only| !"responses".contains(&only) && !only.contains("responses"))
    {
        return;
    }
    println!("\nResponses API beside Chat Completions (upstream at once, 50 concurrent):\n");
    println!(
        "| mode | API | Kortex req/s | Kortex CPU µs/req | CPU / Chat Completions' | errors |"
    );
    println!("|---|---|---|---|---|---|");
    let pid = server.pid();
    let _ = load_api(
        &server.url,
        Some(KEY),
        "m",
        false,
        4,
        Api::Responses { store: false },
    )
    .await;
    for stream in [false, true] {
        let mut chat_cpu = 0.0;
        for (name, api) in [
            ("chat.completions", Api::Chat),
            ("responses, store: false", Api::Responses { store: false }),
            ("responses, store: true", Api::Responses { store: true }),
        ] {
            let before = cpu_us(pid);
            let run = load_api(&server.url, Some(KEY), "m", stream, 50, api).await;
            let cpu = (cpu_us(pid) - before) / run.requests.max(1) as f64;
            if matches!(api, Api::Chat) {
                chat_cpu = cpu;
            }
            println!(
                "| {} | {name} | {:.0} | {cpu:.0} | {:.2}x | {} |",
                if stream { "streamed" } else { "not streamed" },
                run.rps,
                cpu / chat_cpu.max(1.0),
                run.errors
            );
        }
    }
}
