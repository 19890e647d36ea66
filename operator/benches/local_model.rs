//! Time to first token added by Kortex on a local model server
//! (`cargo bench -p kortex --bench local_model`): llama.cpp's OpenAI-compatible server
//! (`llama-cpp-python`) with the small GGUF the real-model tests use, and the real `kortex`
//! binary (`kortex serve`, SQLite) in front of it. Results: docs/benchmarks.md.
//!
//! Two paths, each beside a direct call with the same upstream request, in one run:
//! - **gateway**: the same streamed `POST /v1/chat/completions` straight to the server and
//!   through Kortex's gateway; time to the first chunk with content.
//! - **chat**: a chat run (`POST /chat/v1/sessions/{id}/messages`, SSE) timed to its first
//!   `text.delta`, beside the request Kortex sends upstream for it (recorded once from a
//!   recording provider) sent straight to the server.
//!
//! The server reuses the longest prompt prefix it evaluated last, which would make the
//! second of two equal prompts much faster: every measured call is preceded by an unmeasured
//! one-token call with another prompt, so each starts equally cold (a new question). Direct
//! and via calls alternate, their order flipping every round. Everything shares the
//! machine's 2 cores.
//!
//! Needs `KORTEX_TEST_GGUF` (the model) and `KORTEX_TEST_PYTHON` (a Python with
//! `llama-cpp-python[server]`), as `scripts/test.sh` sets them up; without them it says so
//! and exits. `KORTEX_BENCH_ROUNDS=N`: rounds per path (default 40).

mod common;

use common::Kortex;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: &str = "kgw-bench-local-0123456789";
const QUESTION: &str = "Say hello in five words.";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Milliseconds from sending `body` to `url` until the stream carries `marker` (a content
/// chunk, or a chat run's first `text.delta`).
async fn first_token(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &serde_json::Value,
    marker: &str,
) -> Option<f64> {
    let started = Instant::now();
    let mut request = client
        .post(url)
        .header("accept", "text/event-stream")
        .json(body);
    if let Some(k) = key {
        request = request.bearer_auth(k);
    }
    let mut response = request.send().await.ok()?;
    let mut seen = String::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if seen.contains(marker) {
            return Some(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    None
}

/// A recording provider: keeps the first chat request it gets and answers "ok".
async fn recorder(seen: Arc<Mutex<Option<serde_json::Value>>>) -> String {
    let app = axum::Router::new()
        .route(
            "/v1/models",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"object": "list", "data": [{"id": "smollm2", "object": "model"}]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
                let seen = seen.clone();
                async move {
                    if let Ok(mut s) = seen.lock() {
                        s.get_or_insert(body);
                    }
                    let chunk = serde_json::json!({"id": "c", "object": "chat.completion.chunk", "model": "smollm2",
                        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]});
                    (
                        [("content-type", "text/event-stream")],
                        format!("data: {chunk}\n\ndata: [DONE]\n\n"),
                    )
                }
            }),
        );
    common::serve(app).await
}

/// The direct and the via-Kortex sample of round `round`, taken in the order that flips every
/// round.
async fn in_turn<D, V>(
    round: usize,
    direct: impl Fn() -> D,
    via: impl Fn() -> V,
) -> (Option<f64>, Option<f64>)
where
    D: Future<Output = Option<f64>>,
    V: Future<Output = Option<f64>>,
{
    if round.is_multiple_of(2) {
        let d = direct().await;
        (d, via().await)
    } else {
        let v = via().await;
        (direct().await, v)
    }
}

#[derive(Default)]
struct Row {
    direct: Vec<f64>,
    via: Vec<f64>,
    /// Calls that gave no first token (failed, or ended without content).
    errors: usize,
}

impl Row {
    /// Keeps one round's pair of samples, counting a missing one as an error.
    fn add(&mut self, direct: Option<f64>, via: Option<f64>) {
        for (sample, into) in [(direct, &mut self.direct), (via, &mut self.via)] {
            match sample {
                Some(ms) => into.push(ms),
                None => self.errors += 1,
            }
        }
    }

    fn print(&mut self, path: &str) {
        self.direct.sort_by(f64::total_cmp);
        self.via.sort_by(f64::total_cmp);
        let (d50, d99) = (
            percentile(&self.direct, 0.5),
            percentile(&self.direct, 0.99),
        );
        let (v50, v99) = (percentile(&self.via, 0.5), percentile(&self.via, 0.99));
        println!(
            "| {path} | {} | {d50:.1} / {d99:.1} | {v50:.1} / {v99:.1} | {:.1} / {:.1} | {} |",
            self.via.len().min(self.direct.len()),
            v50 - d50,
            v99 - d99,
            self.errors
        );
    }
}

fn main() {
    let (Ok(gguf), Ok(python)) = (
        std::env::var("KORTEX_TEST_GGUF"),
        std::env::var("KORTEX_TEST_PYTHON"),
    ) else {
        println!(
            "local_model bench: set KORTEX_TEST_GGUF and KORTEX_TEST_PYTHON (scripts/test.sh prepares both)"
        );
        return;
    };
    let rounds: usize = std::env::var("KORTEX_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let runtime = common::runtime();
    runtime.block_on(async move {
        let client = reqwest::Client::new();
        let port = free_port();
        let mut llama = Command::new(&python)
            .args(["-m", "llama_cpp.server", "--model", &gguf, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--model_alias", "smollm2"])
            // Kortex's probes must not cut answers short (docs/providers.md#local-models).
            .args(["--interrupt_requests", "False"])
            .args(["--n_ctx", "4096", "--seed", "0", "--n_threads", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{python}: {e}"));
        let llama_url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !client
            .get(format!("{llama_url}/v1/models"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "llama.cpp's server did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let recorded: Arc<Mutex<Option<serde_json::Value>>> = Arc::default();
        let rec_url = recorder(recorded.clone()).await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let provider = |name: &str, base: &str| {
            format!(
                "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: {name}}}\n\
                 spec: {{type: openai-compatible, baseUrl: \"{base}/v1\", locality: local, defaultModel: smollm2, temperature: 0, maxTokens: 8}}\n---\n"
            )
        };
        std::fs::write(
            dir.path().join("bench.yaml"),
            format!(
                "{}{}apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: chat}}\nspec: {{sessions: [\"chat-*\"], provider: llama, mode: local-only}}\n---\n\
                 apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: capture}}\nspec: {{sessions: [\"capture-*\"], provider: rec, mode: local-only}}\n---\n\
                 apiVersion: v1\nkind: Secret\nmetadata: {{name: gw, labels: {{kortex.dev/credentials: gateway}}, annotations: {{kortex.dev/policy: chat}}}}\nstringData: {{team: bench, key: {KEY}}}\n",
                provider("llama", &llama_url),
                provider("rec", &rec_url),
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let kortex = Kortex::start(
            dir.path(),
            &format!("sqlite://{}", dir.path().join("bench.db").display()),
            &[],
        );
        let base = kortex.url.clone();
        // The request Kortex sends upstream for a chat run.
        let id = common::create_session(&client, &base, "capture-1").await;
        let ask = serde_json::json!({"content": QUESTION});
        first_token(
            &client,
            &format!("{base}/chat/v1/sessions/{id}/messages"),
            None,
            &ask,
            "\"state\":\"completed\"",
        )
        .await;
        let mut chat_body = recorded
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .unwrap_or_else(|| panic!("no chat request recorded"));
        chat_body["stream"] = serde_json::json!(true);
        let gateway_body = serde_json::json!({"model": "smollm2", "stream": true, "max_tokens": 8,
            "temperature": 0, "messages": [{"role": "user", "content": QUESTION}]});
        let content = "\"content\":";
        let mut gateway = Row::default();
        let mut chat = Row::default();
        for round in 0..rounds + 3 {
            let keep = round >= 3; // three warm-up rounds
            let direct_url = format!("{llama_url}/v1/chat/completions");
            let via_url = format!("{base}/v1/chat/completions");
            let reset_body = serde_json::json!({"model": "smollm2", "max_tokens": 1,
                "messages": [{"role": "user", "content": format!("Count to {round}.")}]});
            let reset = || async {
                let _ = client.post(&direct_url).json(&reset_body).send().await;
            };
            let direct = || async {
                reset().await;
                first_token(&client, &direct_url, None, &gateway_body, content).await
            };
            let via = || async {
                reset().await;
                first_token(&client, &via_url, Some(KEY), &gateway_body, content).await
            };
            let (d, v) = in_turn(round, direct, via).await;
            if keep {
                gateway.add(d, v);
            }
            let id = common::create_session(&client, &base, &format!("chat-{round}")).await;
            let messages = format!("{base}/chat/v1/sessions/{id}/messages");
            let chat_direct = || async {
                reset().await;
                first_token(&client, &direct_url, None, &chat_body, content).await
            };
            let chat_via = || async {
                reset().await;
                first_token(&client, &messages, None, &ask, "event: text.delta").await
            };
            let (direct, via) = in_turn(round, chat_direct, chat_via).await;
            if keep {
                chat.add(direct, via);
            }
        }
        println!("Time to first token, ms (llama-cpp-python 0.3.36, SmolLM2-135M-Instruct Q4_1, 2 cores):\n");
        println!("| path | rounds | direct p50 / p99 | via Kortex p50 / p99 | added p50 / p99 | errors |");
        println!("|---|---|---|---|---|---|");
        gateway.print("gateway, streamed");
        chat.print("chat run (first text.delta)");
        kortex.stop();
        let _ = llama.kill();
        let _ = llama.wait();
    });
}
