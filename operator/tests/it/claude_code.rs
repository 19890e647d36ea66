//! `type: claude-code`: the real Claude Code CLI (npm, pinned in
//! `operator/tests/claude-code`), run by `kortex serve` against a scripted Anthropic-format
//! model on 127.0.0.1 (`ANTHROPIC_BASE_URL` from `spec.baseUrl`). Its tools are only
//! Kortex's, through this replica's `/mcp`; every call is the run's own — stored, announced,
//! audited — and a built-in tool the model asks for never runs.

use crate::support::chat::{
    ask, get_json, item_condition, post_message, session, session_json, state, text,
};
use crate::support::manifests::{self, keyed_manifests, manifest_dir};
use crate::support::net::{eventually, http_client, serve};
use crate::support::provider::messages_answer;
use crate::support::server::Server;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const KEY: &str = "sk-ant-claude-code-test-key-0042";
const GATEWAY_KEY: &str = "kx-gateway-test-key-77";
/// A credential the model writes into a tool call: redacted before anything keeps it.
const PLANTED: &str = "AKIAIOSFODNN7EXAMPLE";

/// The CLI, or `None` (skipped) where the test script has not installed it.
fn claude() -> Option<String> {
    match std::env::var("KORTEX_TEST_CLAUDE")
        .ok()
        .filter(|c| Path::new(c).exists())
    {
        Some(c) => Some(c),
        None => {
            assert!(
                std::env::var("KORTEX_REQUIRE_CLAUDE").is_err(),
                "KORTEX_TEST_CLAUDE must name Claude Code's binary (scripts/test.sh installs it)"
            );
            eprintln!("skipped: no Claude Code (KORTEX_TEST_CLAUDE)");
            None
        }
    }
}

type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// Records a request to a scripted Anthropic model (its `x-api-key` and body), and refuses
/// it as Anthropic does (401 `authentication_error`) unless the key is `KEY`.
fn admit(
    seen: &Seen,
    headers: &axum::http::HeaderMap,
    body: &Value,
) -> Option<axum::response::Response> {
    use axum::response::IntoResponse;
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key.clone(), body.clone()));
    (key.as_deref() != Some(KEY)).then(|| {
        (
            axum::http::StatusCode::UNAUTHORIZED,
            axum::Json(json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})),
        )
            .into_response()
    })
}

fn sse(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn tool_use(model: &Value, id: &str, name: &str, input: Value) -> String {
    messages_answer(
        model,
        json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        json!({"type": "input_json_delta", "partial_json": input.to_string()}),
        "tool_use",
    )
}

/// The result Claude Code sent back for tool call `id`.
fn result_of(body: &Value, id: &str) -> Option<Value> {
    body["messages"]
        .as_array()?
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|c| c["type"] == "tool_result" && c["tool_use_id"] == id)
        .cloned()
}

/// The scripted model. With Kortex's tools offered: it first asks for the built-in Bash
/// (to touch `marker`), then calls Kortex's `get_incident_history`, then answers with what
/// came back. Asked for structured output, it calls `StructuredOutput`. Only `KEY` is
/// accepted.
async fn model(marker: PathBuf) -> (String, Seen) {
    use axum::response::IntoResponse;
    async fn messages(
        axum::extract::State((seen, marker)): axum::extract::State<(Seen, Arc<PathBuf>)>,
        headers: axum::http::HeaderMap,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        if let Some(refused) = admit(&seen, &headers, &body) {
            return refused;
        }
        let model = &body["model"];
        let tools: Vec<&str> = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str())
            .collect();
        let events = if tools.contains(&"StructuredOutput") {
            if result_of(&body, "toolu_so").is_some() {
                messages_answer(
                    model,
                    json!({"type": "text", "text": ""}),
                    json!({"type": "text_delta", "text": "done"}),
                    "end_turn",
                )
            } else {
                tool_use(
                    model,
                    "toolu_so",
                    "StructuredOutput",
                    json!({"severity": "high", "pods": 3}),
                )
            }
        } else if tools.contains(&"mcp__kortex__get_incident_history") {
            if result_of(&body, "toolu_bash").is_none() {
                // The loop's first answer takes a moment: time for a person to pause it.
                if body.to_string().contains("slowly") {
                    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                }
                let touch = format!("touch {}", marker.display());
                tool_use(model, "toolu_bash", "Bash", json!({"command": touch}))
            } else if let Some(r) = result_of(&body, "toolu_kortex") {
                let said = r["content"].to_string();
                messages_answer(
                    model,
                    json!({"type": "text", "text": ""}),
                    json!({"type": "text_delta", "text": format!("Kortex answered: {said}")}),
                    "end_turn",
                )
            } else {
                tool_use(
                    model,
                    "toolu_kortex",
                    "mcp__kortex__get_incident_history",
                    json!({"query": format!("checkout {PLANTED}")}),
                )
            }
        } else {
            messages_answer(
                model,
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": "OK"}),
                "end_turn",
            )
        };
        ([("content-type", "text/event-stream")], events).into_response()
    }
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(messages))
        .with_state((seen.clone(), Arc::new(marker)));
    (serve(app).await, seen)
}

/// A claude-code provider (the CLI at `command`, the model at `base`, `key` in its Secret,
/// `timeout`) and a policy that uses it.
fn provider_yaml(command: &str, base: &str, key: &str, timeout: &str) -> String {
    manifests::docs(&[
        manifests::secret("claude", &format!("key: '{key}'")),
        manifests::provider(
            "cc",
            &format!(
                "type: claude-code, command: '{command}', baseUrl: '{base}', \
                 authSecretRef: {{name: claude, key: key}}, authKind: apiKey, \
                 defaultModel: sonnet, timeout: {timeout}"
            ),
        ),
        manifests::policy("ops", "sessions: ['*'], provider: cc"),
    ])
}

/// [`provider_yaml`] (a 120 s timeout) and a gateway key, in `dir`.
fn manifests(dir: &Path, command: &str, base: &str, key: &str) {
    std::fs::write(
        dir.join("all.yaml"),
        manifests::docs(&[
            manifests::gateway_key("gateway", "ops", "ops", GATEWAY_KEY),
            provider_yaml(command, base, key, "120s"),
        ]),
    )
    .unwrap();
}

fn start(command: &str, base: &str, key: &str) -> (Server, tempfile::TempDir) {
    let (dir, m) = manifest_dir();
    manifests(&m, command, base, key);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    (server, dir)
}

/// The provider's entry in `/api/v1/llm/providers`.
async fn provider(server: &Server) -> Value {
    let all = get_json(&http_client(), server.url("/api/v1/llm/providers")).await;
    all["items"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "cc").cloned())
        .unwrap_or_else(|| panic!("no provider cc: {all}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_run_investigates_with_claude_code_through_kortex_tools_only() {
    let Some(claude) = claude() else { return };
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("bash-ran");
    let (base, seen) = model(marker.clone()).await;
    let (server, dir) = start(&claude, &base, KEY);
    // The probe ran the CLI and made its one-token call with the key.
    let p = eventually("the provider is probed", || async {
        let p = provider(&server).await;
        match item_condition(&p, "Reachable")["status"].as_str() {
            Some("True") => Ok(p),
            _ => Err(p.to_string()),
        }
    })
    .await;
    assert_eq!(item_condition(&p, "Ready")["status"], "True", "{p}");
    assert_eq!(p["authKind"], "apiKey", "{p}");
    assert_eq!(
        p["authSecretRef"],
        json!({"name": "claude", "key": "key"}),
        "{p}"
    );

    let id = session(&server, "checkout-incident").await;
    let events = ask(&server, &id, "Has checkout failed before?").await;
    assert_eq!(
        state(&events),
        json!("completed"),
        "{events:?}\n{}",
        server.log()
    );
    // The model's answer streamed, carrying what Kortex's tool returned.
    let answer = text(&events);
    assert!(answer.contains("Kortex answered"), "{answer}");
    // Kortex's tool ran as the run's own call: announced, stored, audited.
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e.event == "tool.start")
        .map(|e| &e.data)
        .collect();
    assert_eq!(started.len(), 1, "{events:?}");
    assert_eq!(started[0]["name"], "get_incident_history");
    let query = started[0]["input"]["query"].as_str().unwrap_or_default();
    assert!(
        query.starts_with("checkout") && !query.contains(PLANTED),
        "{query}"
    );
    let ended = events
        .iter()
        .find(|e| e.event == "tool.end")
        .map(|e| e.data.clone())
        .unwrap_or_default();
    assert_eq!(ended["ok"], true, "{ended}");
    let stored = session_json(&server, &id).await;
    let messages = stored["messages"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{stored}"
    );
    assert_eq!(
        messages[1]["toolCalls"][0]["name"], "get_incident_history",
        "{stored}"
    );
    assert_eq!(
        messages[2]["toolCallId"], messages[1]["toolCalls"][0]["id"],
        "{stored}"
    );
    assert!(!stored.to_string().contains(PLANTED), "{stored}");
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=tool_call")).await;
    assert!(
        audit["items"].as_array().is_some_and(|rows| rows
            .iter()
            .any(|r| r["subject"] == "get_incident_history"
                && r["sessionId"] == id.as_str()
                && r["outcome"] == "ok")),
        "{audit}"
    );
    // The model was offered Kortex's tools only, and its Bash call never ran.
    let bodies: Vec<(Option<String>, Value)> =
        seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let chat: Vec<&Value> = bodies
        .iter()
        .map(|(_, b)| b)
        .filter(|b| b["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .collect();
    assert!(chat.len() >= 3, "{} chat calls", chat.len());
    for body in &chat {
        for t in body["tools"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or_default();
            assert!(name.starts_with("mcp__kortex__"), "offered {name}");
        }
    }
    assert!(!marker.exists(), "Claude Code ran Bash");
    let refused = chat
        .iter()
        .find_map(|b| result_of(b, "toolu_bash"))
        .unwrap_or_default();
    assert_eq!(refused["is_error"], true, "{refused}");
    // The key reached the model and nothing else of Kortex's: not the log, not the database.
    assert!(bodies.iter().all(|(k, _)| k.as_deref() == Some(KEY)));
    assert!(!server.log().contains(KEY));
    let db = std::fs::read(dir.path().join("k.db")).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&db).contains(KEY));
    // Usage was settled from what the CLI reported (120 input tokens a call).
    let calls = get_json(&http_client(), server.url("/api/v1/audit?kind=llm_call")).await;
    let row = calls["items"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["sessionId"] == id.as_str()).cloned())
        .unwrap_or_default();
    assert!(
        row["detail"]["inputTokens"].as_u64().unwrap_or(0) >= 360,
        "{row}"
    );
    assert_eq!(row["detail"]["estimated"], false, "{row}");
    assert_eq!(row["detail"]["toolCalls"], 1, "{row}");
    assert!(server.terminate().success());
}

/// Through the gateway (structured output) and when things are wrong: a refused key, a
/// missing binary — each says what it is, and nothing stands in silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_answers_structured_output_and_fails_loudly() {
    let Some(claude) = claude() else { return };
    let work = tempfile::tempdir().unwrap();
    let (base, _seen) = model(work.path().join("unused")).await;

    // Structured output, through `kortex ask`'s path: the adapter alone.
    let (server, _dir) = start(&claude, &base, KEY);
    let r = http_client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(GATEWAY_KEY)
        .json(&json!({"model": "cc/sonnet", "messages": [{"role": "user", "content": "classify"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema":
                {"type": "object", "properties": {"severity": {"type": "string"}, "pods": {"type": "integer"}}, "required": ["severity"]}}}}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    let content: Value = serde_json::from_str(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default(),
    )
    .unwrap_or_default();
    assert_eq!(content, json!({"severity": "high", "pods": 3}), "{body}");
    // A schema that is not an object is refused before anything runs.
    let r = http_client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(GATEWAY_KEY)
        .json(&json!({"model": "cc/sonnet", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "array"}}}}))
        .send()
        .await
        .unwrap();
    let refused = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert!(
        refused >= 400 && body.contains("object schema"),
        "{refused} {body}"
    );
    assert!(server.terminate().success());

    // The command line: `providers check` runs the CLI and a one-token call; `ask` answers.
    let m = tempfile::tempdir().unwrap();
    manifests(m.path(), &claude, &base, KEY);
    let kortex = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args(args)
            .args(["--manifests", &m.path().to_string_lossy()])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, said) = kortex(&["providers", "check"]);
    assert!(ok && said.contains("✓ cc (claude-code"), "{said}");
    let (ok, said) = kortex(&["ask", "--provider", "cc", "Say OK"]);
    assert!(ok && said.contains("OK"), "{said}");
    manifests(m.path(), &claude, &base, "sk-ant-wrong");
    let (ok, said) = kortex(&["providers", "check"]);
    assert!(!ok && said.contains("refused"), "{said}");

    // A key Claude Code's endpoint refuses: Reachable=False, ClaudeCodeAuthFailed.
    let (server, _dir) = start(&claude, &base, "sk-ant-wrong");
    let p = eventually("the refused key is reported", || async {
        let p = provider(&server).await;
        match item_condition(&p, "Reachable")["reason"].as_str() {
            Some("ClaudeCodeAuthFailed") => Ok(p),
            _ => Err(p.to_string()),
        }
    })
    .await;
    assert_eq!(item_condition(&p, "Reachable")["status"], "False", "{p}");
    // Refused is not ready: no chat is routed to it, and nothing stands in.
    let p = eventually("the provider is not ready", || async {
        let p = provider(&server).await;
        match item_condition(&p, "Ready")["reason"].as_str() {
            Some("ClaudeCodeAuthFailed") => Ok(p),
            _ => Err(p.to_string()),
        }
    })
    .await;
    assert_eq!(item_condition(&p, "Ready")["status"], "False", "{p}");
    assert_eq!(p["available"], false, "{p}");
    let id = session(&server, "bad-key").await;
    let events = ask(&server, &id, "hello?").await;
    assert_eq!(state(&events), json!("failed"), "{events:?}");
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .map(|e| e.data.clone())
        .unwrap_or_default();
    assert_eq!(error["code"], "provider_unavailable", "{error}");
    assert!(error["message"].to_string().contains("cc"), "{error}");
    assert!(server.terminate().success());

    // No binary: Ready=False, ClaudeCodeNotInstalled; the run fails, nothing falls back.
    let (server, _dir) = start("/nonexistent/claude", &base, KEY);
    let p = provider(&server).await;
    let ready = item_condition(&p, "Ready");
    assert_eq!(ready["status"], "False", "{p}");
    assert_eq!(ready["reason"], "ClaudeCodeNotInstalled", "{p}");
    let id = session(&server, "no-binary").await;
    let events = ask(&server, &id, "hello?").await;
    assert_eq!(state(&events), json!("failed"), "{events:?}");
    assert!(server.terminate().success());
}

/// A pause asked while Claude Code's loop runs stops the loop at its next call to Kortex
/// (the call is not made); resumed, the run starts the CLI again on the transcript so far,
/// and the investigation completes with Kortex's tool called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_loop_is_paused_at_its_next_call_and_resumed() {
    let Some(claude) = claude() else { return };
    let work = tempfile::tempdir().unwrap();
    let (base, seen) = model(work.path().join("bash-ran")).await;
    let (server, _dir) = start(&claude, &base, KEY);
    let id = session(&server, "paused").await;
    let asked = |seen: &Seen| {
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, b)| b.to_string().contains("slowly"))
            .count()
    };
    let client = http_client();
    let r = post_message(&server, &id, "Has checkout failed before? Take it slowly.").await;
    assert_eq!(r.status().as_u16(), 202);
    let run = r.json::<Value>().await.unwrap_or_default()["runId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let control = |what: &'static str| {
        let url = server.url(&format!("/chat/v1/sessions/{id}/runs/{run}/{what}"));
        let client = client.clone();
        async move {
            let r = client.post(url).json(&json!({})).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    // Paused while the CLI's loop waits for its first answer (not before it started).
    eventually("Claude Code asks the model", || async {
        if asked(&seen) > 0 {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    let (status, body) = control("pause").await;
    assert!(status < 300, "{status} {body}");
    let status_of = || async { session_json(&server, &id).await };
    eventually("the run parks", || async {
        let s = status_of().await;
        if s["status"] == "paused" {
            Ok(())
        } else {
            Err(s["status"].to_string())
        }
    })
    .await;
    let stored = status_of().await;
    assert!(
        !stored["messages"]
            .to_string()
            .contains("get_incident_history"),
        "the call was made before the pause: {stored}"
    );
    let (status, body) = control("resume").await;
    assert!(status < 300, "{status} {body}");
    let done = eventually("the run completes", || async {
        let s = status_of().await;
        if s["status"] == "idle" {
            Ok(s)
        } else {
            Err(s["status"].to_string())
        }
    })
    .await;
    let messages = done["messages"].as_array().cloned().unwrap_or_default();
    let calls = messages
        .iter()
        .filter(|m| m["toolCalls"].to_string().contains("get_incident_history"))
        .count();
    assert_eq!(calls, 1, "{done}");
    assert!(
        messages
            .last()
            .and_then(|m| m["content"].as_str())
            .is_some_and(|c| c.contains("Kortex answered")),
        "{done}"
    );
    assert!(server.terminate().success());
}

/// The scripted Anthropic model behind the gateway: Claude Code's first turn gets a Bash
/// call (touch `marker`), the next its answer; token counting answers 77.
async fn upstream(marker: PathBuf) -> (String, Seen) {
    use axum::response::IntoResponse;
    async fn messages(
        axum::extract::State((seen, marker)): axum::extract::State<(Seen, Arc<PathBuf>)>,
        headers: axum::http::HeaderMap,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        if let Some(refused) = admit(&seen, &headers, &body) {
            return refused;
        }
        let model = &body["model"];
        let asked_for_bash = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == "Bash");
        let thinking = body.get("thinking").is_some_and(Value::is_object);
        // With thinking on, the turn that called the tool must come back with its thinking
        // block first, signature intact (as Anthropic's API insists).
        if thinking && result_of(&body, "toolu_gw").is_some() {
            let given_back = body["messages"].as_array().into_iter().flatten().any(|m| {
                m["role"] == "assistant"
                    && m["content"][0]["type"] == "thinking"
                    && m["content"][0]["signature"] == "sig-kortex-42"
                    && m["content"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|b| b["id"] == "toolu_gw"))
            });
            if !given_back {
                return (
                    axum::http::StatusCode::BAD_REQUEST,
                    axum::Json(json!({"type": "error", "error": {"type": "invalid_request_error", "message": "messages: the assistant turn with tool_use must start with its thinking block"}})),
                )
                    .into_response();
            }
        }
        let events = if asked_for_bash && result_of(&body, "toolu_gw").is_none() {
            let call = tool_use(
                model,
                "toolu_gw",
                "Bash",
                json!({"command": format!("touch {}", marker.display()), "description": "create the marker"}),
            );
            if thinking {
                // A thinking block at index 0, the call at index 1.
                let think = [
                    sse("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})),
                    sse("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "A touch will do."}})),
                    sse("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig-kortex-42"}})),
                    sse("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                ]
                .concat();
                let call = call.replace("\"index\":0", "\"index\":1");
                let at = call.find("event: content_block_start").unwrap_or(0);
                format!("{}{think}{}", &call[..at], &call[at..])
            } else {
                call
            }
        } else {
            messages_answer(
                model,
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": "The marker file is created."}),
                "end_turn",
            )
        };
        ([("content-type", "text/event-stream")], events).into_response()
    }
    async fn count(
        axum::extract::State((seen, _)): axum::extract::State<(Seen, Arc<PathBuf>)>,
        headers: axum::http::HeaderMap,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::Json<Value> {
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key, json!({"count_tokens": body})));
        axum::Json(json!({"input_tokens": 77}))
    }
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(messages))
        .route("/v1/messages/count_tokens", axum::routing::post(count))
        .with_state((seen.clone(), Arc::new(marker)));
    (serve(app).await, seen)
}

/// Claude Code pointed at Kortex's gateway (`ANTHROPIC_BASE_URL`, a gateway key): a `-p`
/// run whose model calls a tool completes, the upstream sees Kortex's key only, the usage
/// is the key's team's; and token counting passes through to the Anthropic provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_works_through_the_gateway_and_is_accounted_to_the_team() {
    let Some(claude) = claude() else { return };
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("made-through-the-gateway");
    let (base, seen) = upstream(marker.clone()).await;
    let m = work.path().join("m");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(
        m.join("all.yaml"),
        manifests::docs(&[
            manifests::secret("anthropic", &format!("key: '{KEY}'")),
            manifests::gateway_key("gateway", "platform", "coding", GATEWAY_KEY),
            manifests::provider(
                "anthropic",
                &format!(
                    "type: anthropic, baseUrl: '{base}', \
                     apiKeySecretRef: {{name: anthropic, key: key}}, defaultModel: claude-test, \
                     models: [{{id: claude-test, cost: {{inputUsdPerMTok: 3, \
                     outputUsdPerMTok: 15}}}}]"
                ),
            ),
            manifests::policy("coding", "sessions: [gateway-coding], provider: anthropic"),
        ]),
    )
    .unwrap();
    let server = Server::start(&m, &work.path().join("k.db"), &[]);
    let url = server.url("");
    let home = work.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let cwd = work.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(claude)
            .args([
                "-p",
                "Create the marker file with touch.",
                "--model",
                "claude-test",
            ])
            .args([
                "--allowedTools",
                "Bash",
                "--output-format",
                "json",
                "--no-session-persistence",
            ])
            .current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("ANTHROPIC_BASE_URL", url.trim_end_matches('/'))
            .env("ANTHROPIC_API_KEY", GATEWAY_KEY)
            .env("ANTHROPIC_SMALL_FAST_MODEL", "claude-test")
            .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "claude-test")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "claude failed\n{stdout}\n{stderr}\n--- kortex\n{}",
        server.log()
    );
    assert!(marker.exists(), "the Bash tool ran: {stdout}");
    let result: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        result["result"], "The marker file is created.",
        "{result:#}"
    );
    // Upstream: Kortex's key only, never the gateway key.
    let calls = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(calls.len() >= 2, "{calls:?}");
    // Claude Code asked for thinking: the setting reached the provider, and the thinking
    // block came back with the tool result (the upstream refuses the turn otherwise).
    assert!(
        calls.iter().any(|(_, b)| b["thinking"].is_object()),
        "thinking was passed on"
    );
    assert!(
        calls.iter().all(|(k, _)| k.as_deref() == Some(KEY)),
        "{calls:?}"
    );
    // Accounted to the team (a streamed call's books are settled as its stream ends).
    eventually("the team's usage", || async {
        let usage: Value = get_json(&http_client(), server.url("/api/v1/usage?by=user")).await;
        let requests = usage["items"]
            .as_array()
            .and_then(|r| {
                r.iter()
                    .find(|r| r["key"].as_str().is_some_and(|k| k.contains("platform")))
            })
            .and_then(|r| r["requests"].as_i64());
        if requests >= Some(2) {
            Ok(())
        } else {
            Err(usage.to_string())
        }
    })
    .await;

    // Token counting through the gateway: Anthropic's own count.
    let r = http_client()
        .post(server.url("/v1/messages/count_tokens?beta=true"))
        .header("x-api-key", GATEWAY_KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "token-counting-2024-11-01")
        .json(&json!({"model": "claude-test", "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()
            .get("x-kortex-token-count")
            .and_then(|v| v.to_str().ok()),
        Some("exact")
    );
    let counted: Value = r.json().await.unwrap_or_default();
    assert_eq!(counted, json!({"input_tokens": 77}));
    let calls = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (key, body) = calls.last().cloned().unwrap_or_default();
    assert_eq!(key.as_deref(), Some(KEY));
    assert_eq!(body["count_tokens"]["model"], "claude-test");
    assert!(server.terminate().success());
}

/// The scripted model of the tests below. With Kortex's tools offered, its first answer is
/// a call of Kortex's `get_incident_history` with no text before it, the next one says what
/// came back; a question that says "Hold on" gets no answer (the CLI waits in its loop).
async fn opener() -> (String, Seen) {
    use axum::response::IntoResponse;
    async fn messages(
        axum::extract::State(seen): axum::extract::State<Seen>,
        headers: axum::http::HeaderMap,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        if let Some(refused) = admit(&seen, &headers, &body) {
            return refused;
        }
        let model = &body["model"];
        let kortex = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == "mcp__kortex__get_incident_history");
        if kortex && body["messages"].to_string().contains("Hold on") {
            tokio::time::sleep(std::time::Duration::from_secs(300)).await;
        }
        let events = match result_of(&body, "toolu_first") {
            _ if !kortex => messages_answer(
                model,
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": "OK"}),
                "end_turn",
            ),
            Some(r) => messages_answer(
                model,
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": format!("Kortex answered: {}", r["content"])}),
                "end_turn",
            ),
            None => tool_use(
                model,
                "toolu_first",
                "mcp__kortex__get_incident_history",
                json!({"query": "checkout"}),
            ),
        };
        ([("content-type", "text/event-stream")], events).into_response()
    }
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(messages))
        .with_state(seen.clone());
    (serve(app).await, seen)
}

/// The Claude Code homes (`kortex-claude-*`) in `tmp`.
fn homes(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kortex-claude-"))
        })
        .collect()
}

/// The live processes (not zombies) working in `dir`: a call's CLI and anything it started.
fn processes_in(dir: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// A turn that opens with a call of Kortex's tool, no text before it (as models often do),
/// completes: the run serves the call while the provider's stream is still opening. (A
/// short provider timeout: were the call left waiting, the run would fail within it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_that_opens_with_a_kortex_tool_call_completes() {
    let Some(claude) = claude() else { return };
    let (base, _seen) = opener().await;
    let tmp = tempfile::tempdir().unwrap();
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        provider_yaml(&claude, &base, KEY, "15s"),
    )
    .unwrap();
    let tmpdir = tmp.path().to_string_lossy().into_owned();
    let server = Server::start(&m, &dir.path().join("k.db"), &[("TMPDIR", &tmpdir)]);
    let id = session(&server, "opens-with-a-call").await;
    let started = std::time::Instant::now();
    let events = ask(&server, &id, "Has checkout failed before?").await;
    assert_eq!(
        state(&events),
        json!("completed"),
        "{events:?}\n{}",
        server.log()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let answer = text(&events);
    assert!(answer.contains("Kortex answered"), "{answer}");
    let called: Vec<&Value> = events
        .iter()
        .filter(|e| e.event == "tool.start")
        .map(|e| &e.data)
        .collect();
    assert_eq!(called.len(), 1, "{events:?}");
    assert_eq!(called[0]["name"], "get_incident_history");
    let ended = events
        .iter()
        .find(|e| e.event == "tool.end")
        .map(|e| e.data.clone())
        .unwrap_or_default();
    assert_eq!(ended["ok"], true, "{ended}");
    // Nothing of the call is left: its HOME goes with it (removed as the call's process is
    // reaped, which may finish just after the run's last event).
    eventually("the call's HOME is removed", || async {
        let left = homes(tmp.path());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    assert!(server.terminate().success());
}

const ALICE: &str = "kx-alice-claude-code-0123456789";

/// A run in Claude Code's loop (waiting for the model): its HOME, the processes working in
/// it, and the run's credential from the `kortex-mcp.json` there.
struct Held {
    home: PathBuf,
    processes: Vec<u32>,
    bearer: String,
    session: String,
    run: String,
}

impl Held {
    /// Starts a run at `api` (as Alice) and waits until its CLI waits for the model.
    async fn start(api: &str, tmp: &Path, seen: &Seen) -> Self {
        let asked = || {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(_, b)| b["messages"].to_string().contains("Hold on"))
                .count()
        };
        let before = asked();
        let client = http_client();
        let r = client
            .post(format!("{api}/chat/v1/sessions"))
            .bearer_auth(ALICE)
            .json(&json!({"name": format!("held-{before}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let session = r.json::<Value>().await.unwrap_or_default()["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let r = client
            .post(format!("{api}/chat/v1/sessions/{session}/messages"))
            .bearer_auth(ALICE)
            .json(&json!({"content": "Hold on: has checkout failed before?"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let run = r.json::<Value>().await.unwrap_or_default()["runId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        eventually("Claude Code waits for the model", || async {
            let homes = homes(tmp);
            let [home] = homes.as_slice() else {
                return Err(format!("homes: {homes:?}"));
            };
            let processes = processes_in(home);
            let config = std::fs::read_to_string(home.join("kortex-mcp.json")).unwrap_or_default();
            let config: Value = serde_json::from_str(&config).unwrap_or_default();
            let bearer = config["mcpServers"]["kortex"]["headers"]["Authorization"]
                .as_str()
                .and_then(|a| a.strip_prefix("Bearer "))
                .unwrap_or_default()
                .to_owned();
            if asked() > before && !processes.is_empty() && !bearer.is_empty() {
                Ok(Self {
                    home: home.clone(),
                    processes,
                    bearer,
                    session: session.clone(),
                    run: run.clone(),
                })
            } else {
                Err(format!("processes {processes:?}, config {config}"))
            }
        })
        .await
    }

    /// Waits until no process of the call is left and its HOME is gone.
    async fn gone(&self, what: &str) {
        eventually(what, || async {
            let left: Vec<u32> = self
                .processes
                .iter()
                .copied()
                .filter(|p| alive(*p))
                .collect();
            if left.is_empty() && !self.home.exists() {
                Ok(())
            } else {
                Err(format!(
                    "processes {left:?} alive, HOME {} exists: {}",
                    self.home.display(),
                    self.home.exists()
                ))
            }
        })
        .await;
    }
}

/// The status `/mcp` answers an `initialize` with `bearer`.
async fn mcp_status(api: &str, bearer: &str) -> u16 {
    http_client()
        .post(format!("{api}/mcp"))
        .bearer_auth(bearer)
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "probe", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// However a claude-code run ends, nothing of it is left: cancelled, its CLI's processes
/// and HOME (with the `kortex-mcp.json` holding the run's credential) are gone and the
/// credential is refused; `kortex serve` stopped (SIGTERM), the same; killed (SIGKILL),
/// when nothing in it could run, the next start clears what it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_run_leaves_no_process_home_or_credential_behind() {
    let Some(claude) = claude() else { return };
    let (base, seen) = opener().await;
    let tmp = tempfile::tempdir().unwrap();
    let tmpdir = tmp.path().to_string_lossy().into_owned();
    let env = [("TMPDIR", tmpdir.as_str())];
    let (dir, db) = keyed_manifests(
        &[("alice", ALICE, "")],
        &provider_yaml(&claude, &base, KEY, "120s"),
    );
    let m = dir.path().join("m");

    // Cancelled.
    let (server, api) = Server::start_keyed(&m, &db, &env);
    let held = Held::start(&api, tmp.path(), &seen).await;
    assert_eq!(
        mcp_status(&api, &held.bearer).await,
        200,
        "{}",
        server.log()
    );
    let r = http_client()
        .post(format!(
            "{api}/chat/v1/sessions/{}/runs/{}/cancel",
            held.session, held.run
        ))
        .bearer_auth(ALICE)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    held.gone("the cancelled run's CLI and HOME are gone").await;
    assert_eq!(mcp_status(&api, &held.bearer).await, 401);

    // The server stopped.
    let held = Held::start(&api, tmp.path(), &seen).await;
    assert!(server.terminate().success());
    held.gone("the stopped server's CLI and HOME are gone")
        .await;

    // The server killed: the next start clears what it left.
    let (server, api) = Server::start_keyed(&m, &db, &env);
    let held = Held::start(&api, tmp.path(), &seen).await;
    server.kill9();
    let (server, api) = Server::start_keyed(&m, &db, &env);
    held.gone("the killed server's CLI and HOME are gone").await;
    assert_eq!(mcp_status(&api, &held.bearer).await, 401);
    assert!(server.terminate().success());
}
