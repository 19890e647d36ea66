//! Chat-path overhead (`cargo bench -p kortex --bench chat_path`): what Kortex itself adds to
//! an investigation, with the provider's and the tool's own time taken out. The real
//! `kortex` binary (release build, `kortex serve`) runs chat runs against a scripted
//! OpenAI-compatible provider that asks for an instant HTTP plugin tool (`KortexTool`)
//! `KORTEX_BENCH_ROUNDS` times (default 5) before it answers, one run at a time, each in a
//! new session, `KORTEX_BENCH_RUNS` runs (default 40, after 3 unmeasured ones). Results:
//! docs/benchmarks.md.
//!
//! Both servers stamp when each request arrives and when its answer is handed back, so:
//! - **per tool round trip**: from the provider's answer asking for the tool to Kortex's
//!   next provider request, minus the tool server's own time (Kortex reads the tool call,
//!   stores it, runs the tool through its router, stores the result and sends the history
//!   back);
//! - **run start**: from the message post to the first provider request;
//! - **run end**: from the provider's final answer to the run's end event on the session's
//!   SSE stream.
//!
//! SQLite always; PostgreSQL too when `KORTEX_TEST_POSTGRES_URL` names a server Kortex may
//! create a database on (it is dropped afterwards). `KORTEX_BENCH_ONE_SESSION=1` keeps every
//! run in one session instead (a long investigation).

mod common;

use common::{Kortex, body_json, env_or, now_us, pct, run_end, sse_field};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the provider and the tool saw: `(what, µs)`.
type Stamps = Arc<Mutex<Vec<(&'static str, u64)>>>;

fn stamp(stamps: &Stamps, what: &'static str) {
    let t = now_us();
    stamps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((what, t));
}

/// One streamed Chat Completions answer: a call of the `instant` tool, or the final text.
fn answer(tool_results: usize, rounds: usize) -> String {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let usage = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
    );
    if tool_results < rounds {
        chunk(
            json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call_{tool_results}"),
                "type": "function", "function": {"name": "instant", "arguments": "{\"q\":\"x\"}"}}]}),
            Value::Null,
        ) + &chunk(json!({}), json!("tool_calls"))
            + &usage
    } else {
        chunk(
            json!({"role": "assistant", "content": "The deployment is healthy."}),
            Value::Null,
        ) + &chunk(json!({}), json!("stop"))
            + &usage
    }
}

/// The scripted provider and the instant tool, on one server.
async fn upstream(stamps: Stamps, rounds: usize) -> String {
    let provider = stamps.clone();
    let tool = stamps;
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |body: axum::body::Bytes| {
                let stamps = provider.clone();
                async move {
                    stamp(&stamps, "provider.in");
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    // Tool results since the question (earlier runs' are history).
                    let results = v["messages"].as_array().map_or(0, |m| {
                        m.iter()
                            .rev()
                            .take_while(|m| m["role"] != "user")
                            .filter(|m| m["role"] == "tool")
                            .count()
                    });
                    let body = answer(results, rounds);
                    stamp(&stamps, "provider.out");
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from(body))
                        .unwrap_or_default()
                }
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|| async { r#"{"data":[{"id":"m"}]}"# }),
        )
        .route(
            "/instant",
            axum::routing::get(move || {
                let stamps = tool.clone();
                async move {
                    stamp(&stamps, "tool.in");
                    let body = r#"{"status":"ok","replicas":3,"ready":3}"#;
                    stamp(&stamps, "tool.out");
                    body
                }
            }),
        );
    common::serve(app).await
}

fn manifests(dir: &std::path::Path, base: &str, rounds: usize) {
    std::fs::write(
        dir.join("chat.yaml"),
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: up}}\n\
             spec: {{type: openai-compatible, baseUrl: \"{base}/v1\", defaultModel: m, locality: local}}\n---\n\
             apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: all}}\n\
             spec: {{sessions: [\"*\"], provider: up, maxToolDepth: {}}}\n---\n\
             apiVersion: kortex.dev/v1alpha1\nkind: KortexTool\nmetadata: {{name: instant}}\n\
             spec: {{description: Reads a deployment's health., http: {{url: \"{base}/instant\"}},\n  \
             parameters: {{type: object, properties: {{q: {{type: string}}}}}}}}\n",
            rounds + 2
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The figures of one database: µs samples of each kind.
#[derive(Default)]
struct Figures {
    round_trip: Vec<u64>,
    start: Vec<u64>,
    end: Vec<u64>,
    tool: Vec<u64>,
}

/// A new session and its event stream: each run's end state, stamped as it arrives.
async fn open_session(
    client: &reqwest::Client,
    kortex: &str,
    name: &str,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<(String, u64)>) {
    let id = common::create_session(client, kortex, name).await;
    let (ends, ended) = tokio::sync::mpsc::unbounded_channel::<(String, u64)>();
    let events = client
        .get(format!("{kortex}/chat/v1/sessions/{id}/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(common::sse_frames(events, move |frame, at| {
        if frame.lines().any(|l| l == "event: run.lifecycle")
            && let Some(state) = run_end(sse_field(frame, "data: "))
        {
            let _ = ends.send((state, at));
        }
    }));
    (id, ended)
}

/// Runs the chat runs against a fresh `kortex serve` on `database_url`.
async fn measure(database_url: &str, runs: usize, rounds: usize) -> Figures {
    let stamps: Stamps = Arc::default();
    let base = upstream(stamps.clone(), rounds).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    manifests(dir.path(), &base, rounds);
    let url = if database_url.is_empty() {
        format!("sqlite://{}", dir.path().join("chat.db").display())
    } else {
        database_url.to_owned()
    };
    let server = Kortex::start(
        dir.path(),
        &url,
        &[
            "--max-streams-per-user",
            "1000",
            "--max-sessions-per-user",
            "1000",
        ],
    );
    let kortex = server.url.clone();
    let client = reqwest::Client::new();
    let mut figures = Figures::default();
    // `KORTEX_BENCH_ONE_SESSION=1`: every run in one session, as a long investigation (the
    // transcript grows by 11 messages a run).
    let one_session = std::env::var("KORTEX_BENCH_ONE_SESSION").is_ok_and(|v| v == "1");
    let mut shared = None;
    for run in 0..runs + 3 {
        // Each question in a session of its own, as an investigation starts.
        let (id, mut ended) = match shared.take() {
            Some(open) => open,
            None => {
                let open = open_session(&client, &kortex, &format!("bench-{run}")).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                open
            }
        };
        stamps.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let posted = now_us();
        let resp = client
            .post(format!("{kortex}/chat/v1/sessions/{id}/messages"))
            .json(&json!({"content": format!("Is checkout healthy? ({run})")}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            resp.status().is_success(),
            "post: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
        let (state, at) = tokio::time::timeout(Duration::from_secs(60), ended.recv())
            .await
            .unwrap_or_else(|_| panic!("run {run} did not end within 60 s"))
            .unwrap_or_else(|| panic!("the event stream closed"));
        assert_eq!(state, "completed", "run {run} ended {state}");
        if one_session {
            shared = Some((id.clone(), ended));
        }
        if run < 3 {
            continue;
        }
        let seen = stamps.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let of = |what: &str| -> Vec<u64> {
            seen.iter()
                .filter(|(w, _)| *w == what)
                .map(|(_, t)| *t)
                .collect()
        };
        let (p_in, p_out, t_in, t_out) = (
            of("provider.in"),
            of("provider.out"),
            of("tool.in"),
            of("tool.out"),
        );
        if p_in.len() != rounds + 1 {
            let session = body_json(client.get(format!("{kortex}/chat/v1/sessions/{id}"))).await;
            let log = server
                .log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .join("\n");
            panic!(
                "run {run}: {} provider calls, {} tool calls, not {}; the session: {session:#}\nkortex: {log}",
                p_in.len(),
                t_in.len(),
                rounds + 1
            );
        }
        assert_eq!(t_in.len(), rounds, "tool calls in run {run}");
        figures.start.push(p_in[0].saturating_sub(posted));
        figures.end.push(at.saturating_sub(p_out[rounds]));
        for k in 0..rounds {
            let tool = t_out[k].saturating_sub(t_in[k]);
            figures.tool.push(tool);
            figures
                .round_trip
                .push(p_in[k + 1].saturating_sub(p_out[k]).saturating_sub(tool));
        }
    }
    let log = server.log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    server.stop();
    if let Ok(path) = std::env::var("KORTEX_BENCH_LOG_FILE") {
        let _ = std::fs::write(path, log.join("\n"));
    }
    for line in log.iter().filter(|l| l.contains("ERROR")) {
        eprintln!("kortex: {line}");
    }
    figures
}

fn report(name: &str, mut f: Figures) {
    for v in [&mut f.round_trip, &mut f.start, &mut f.end, &mut f.tool] {
        v.sort_unstable();
    }
    println!(
        "| {name} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.3} |",
        f.round_trip.len(),
        pct(&f.round_trip, 0.5),
        pct(&f.round_trip, 0.99),
        pct(&f.start, 0.5),
        pct(&f.start, 0.99),
        pct(&f.end, 0.5),
        pct(&f.end, 0.99),
        pct(&f.tool, 0.5),
    );
}

async fn postgres_database(admin: &str) -> (String, String) {
    sqlx::any::install_default_drivers();
    let name = format!("kortex_bench_chat_{}", std::process::id());
    let pool = sqlx::AnyPool::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("connect KORTEX_TEST_POSTGRES_URL: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}"
    )))
    .execute(&pool)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    pool.close().await;
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    (format!("{base}/{name}"), name)
}

async fn drop_database(admin: &str, name: &str) {
    if let Ok(pool) = sqlx::AnyPool::connect(admin).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&pool)
        .await;
        pool.close().await;
    }
}

fn main() {
    let runs = env_or("KORTEX_BENCH_RUNS", 40) as usize;
    let rounds = env_or("KORTEX_BENCH_ROUNDS", 5).max(1) as usize;
    let runtime = common::runtime();
    runtime.block_on(async move {
        now_us();
        println!(
            "{runs} runs of {rounds} tool round trips each, one run at a time; milliseconds\n"
        );
        println!(
            "| database | round trips | per tool round trip p50 / p99 | run start p50 / p99 | run end p50 / p99 | tool's own time p50 |"
        );
        println!("|---|---|---|---|---|---|");
        report("SQLite", measure("", runs, rounds).await);
        match std::env::var("KORTEX_TEST_POSTGRES_URL") {
            Ok(admin) if !admin.is_empty() => {
                let (url, name) = postgres_database(&admin).await;
                let figures = measure(&url, runs, rounds).await;
                drop_database(&admin, &name).await;
                report("PostgreSQL", figures);
            }
            _ => println!("(PostgreSQL skipped: KORTEX_TEST_POSTGRES_URL is not set)"),
        }
    });
}
