//! The provider adapters on the wire: the scripted provider (`support::provider`) replays
//! transcripts in each vendor's documented format, and one contract suite runs against
//! every adapter (a new adapter is one more `Dialect`).

use crate::support::provider::{
    Call, Dialect, Reply, dialects, json_reply, mock, openai, pieces, push, push_get, streamed,
};
use crate::support::server::Server;

use crate::support::chat::item_condition;
use futures_util::StreamExt;
use kortex::catalog::{ObjectSet, compile};
use kortex::llm::{
    self, ChatRequest, ErrorKind, LlmProvider, Message, StopReason, StreamEvent, ToolSpec,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "sk-test-WIRE-KEY-0123456789";

/// Builds the adapter the way the server does: manifests → catalog → `llm::build`.
fn provider(d: &Dialect, base: &str, timeout: &str) -> Arc<dyn LlmProvider> {
    provider_with(d, base, timeout, "native")
}

fn provider_with(d: &Dialect, base: &str, timeout: &str, tool_mode: &str) -> Arc<dyn LlmProvider> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let objects: ObjectSet = ObjectSet {
        providers: vec![serde_json::from_value(json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": d.name, "namespace": "default"},
            "spec": {"type": d.provider_type, "baseUrl": format!("{base}{}", d.base_suffix), "defaultModel": "test-model",
                     "apiKeySecretRef": {"name": "keys", "key": "k"}, "timeout": timeout, "toolMode": tool_mode,
                     "headers": [{"name": "X-Kortex-Test", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "h"}}}]}
        }))
        .unwrap()],
        secrets: vec![serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": "default", "labels": {"kortex.dev/use": "true"}},
            "stringData": {"k": KEY, "h": "header-from-secret"}
        }))
        .unwrap()],
        ..Default::default()
    };
    let catalog = compile(&objects, jiff::Timestamp::now());
    let entry = catalog.providers.values().next().expect("no provider");
    assert!(entry.available, "{:?}", entry.object.status);
    llm::build(entry).unwrap()
}

fn request(tools: bool) -> ChatRequest {
    ChatRequest {
        system: Some("You are terse.".into()),
        messages: vec![Message::User {
            content: "why is api down?".into(),
        }],
        tools: if tools {
            vec![ToolSpec {
                name: "get_logs".into(),
                description: "Pod logs".into(),
                parameters: json!({"type": "object", "properties": {"namespace": {"type": "string"}}}),
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

async fn events(p: &dyn LlmProvider, req: &ChatRequest) -> Result<Vec<StreamEvent>, llm::LlmError> {
    let mut s = p.stream(req).await?;
    let mut out = Vec::new();
    while let Some(e) = s.next().await {
        out.push(e?);
    }
    Ok(out)
}

const CALLS: &[Call] = &[
    (
        "call_1",
        "get_logs",
        r#"{"namespace": "shop", "selector": "app=api", "previous": true}"#,
    ),
    (
        "call_2",
        "get_events",
        r#"{"namespace": "shop", "kind": "Deployment", "name": "api"}"#,
    ),
];

#[tokio::test]
async fn contract_streams_text_with_usage_and_sends_key_and_headers() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(
            &script,
            streamed(&d, (d.text_stream)(&["Hel", "lo, ", "wor", "ld"])),
        );
        let p = provider(&d, &base, "5s");
        let out = events(&*p, &request(true))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let text: String = out
            .iter()
            .filter_map(|e| {
                if let StreamEvent::TextDelta(t) = e {
                    Some(t.as_str())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(text, "Hello, world", "{}", d.name);
        match out.last() {
            Some(StreamEvent::Done {
                stop_reason, usage, ..
            }) => {
                assert_eq!(*stop_reason, StopReason::EndTurn, "{}", d.name);
                assert_eq!(
                    (usage.input_tokens, usage.output_tokens),
                    (25, 15),
                    "{}",
                    d.name
                );
            }
            other => panic!("{}: last event {other:?}", d.name),
        }
        let seen = script.requests();
        assert_eq!(seen[0].path, d.chat_path, "{}", d.name);
        assert_eq!(
            (d.key_header)(&seen[0].headers).as_deref(),
            Some(KEY),
            "{}",
            d.name
        );
        assert_eq!(
            seen[0]
                .headers
                .get("x-kortex-test")
                .and_then(|v| v.to_str().ok()),
            Some("header-from-secret")
        );
        let body = &seen[0].body;
        assert_eq!(body["model"], "test-model", "{}: default model", d.name);
        assert!(
            body.to_string().contains("get_logs"),
            "{}: tools sent",
            d.name
        );
        assert!(
            body.to_string().contains("You are terse."),
            "{}: system prompt sent",
            d.name
        );
    }
}

#[tokio::test]
async fn contract_assembles_parallel_tool_calls_from_small_deltas() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(&script, streamed(&d, (d.tools_stream)(CALLS)));
        let p = provider(&d, &base, "5s");
        let out = events(&*p, &request(true))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let calls: Vec<_> = out
            .iter()
            .filter_map(|e| {
                if let StreamEvent::ToolCall(c) = e {
                    Some(c.clone())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(calls.len(), 2, "{}: {out:?}", d.name);
        for (call, (id, name, args)) in calls.iter().zip(CALLS) {
            assert_eq!(
                (call.id.as_str(), call.name.as_str()),
                (*id, *name),
                "{}",
                d.name
            );
            assert_eq!(
                call.input,
                serde_json::from_str::<Value>(args).unwrap_or_default(),
                "{}",
                d.name
            );
        }
        assert!(
            matches!(
                out.last(),
                Some(StreamEvent::Done {
                    stop_reason: StopReason::ToolUse,
                    ..
                })
            ),
            "{}: {out:?}",
            d.name
        );
    }
}

#[tokio::test]
async fn contract_complete_without_streaming() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(&script, json_reply(200, &(d.text_json)("Hello")));
        push(&script, json_reply(200, &(d.tools_json)(CALLS)));
        let p = provider(&d, &base, "5s");
        let r = p
            .complete(&request(false))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_eq!(
            (
                r.text.as_str(),
                r.stop_reason,
                r.usage.input_tokens,
                r.usage.output_tokens
            ),
            ("Hello", StopReason::EndTurn, 25, 15),
            "{}",
            d.name
        );
        let r = p
            .complete(&request(true))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_eq!(r.stop_reason, StopReason::ToolUse, "{}", d.name);
        assert_eq!(
            r.tool_calls
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            vec!["get_logs", "get_events"],
            "{}",
            d.name
        );
        assert_eq!(r.tool_calls[0].input["previous"], true, "{}", d.name);
        let seen = script.requests();
        assert!(
            seen[0].body.get("stream").is_none_or(|s| s == false),
            "{}: {}",
            d.name,
            seen[0].body
        );
    }
}

#[tokio::test]
async fn contract_errors_are_typed_and_never_carry_the_key() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(
            &script,
            json_reply(
                401,
                &json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid key {KEY}")}}),
            ),
        );
        push(
            &script,
            json_reply(
                400,
                &json!({"error": {"message": "This model's maximum context length is 8192 tokens"}}),
            ),
        );
        let p = provider(&d, &base, "5s");
        let e = p
            .stream(&request(false))
            .await
            .err()
            .unwrap_or_else(|| panic!("{}: 401 accepted", d.name));
        assert_eq!(
            (e.kind, e.status),
            (ErrorKind::Auth, Some(401)),
            "{}",
            d.name
        );
        assert!(
            !e.to_string().contains(KEY),
            "{}: key in error: {e}",
            d.name
        );
        assert!(
            e.to_string()
                .starts_with(&format!("provider {}: auth: HTTP 401", d.name)),
            "{e}"
        );
        let e = p.complete(&request(false)).await.expect_err("accepted");
        assert_eq!(e.kind, ErrorKind::ContextTooLong, "{}: {e}", d.name);
        assert_eq!(
            script.seen.lock().map(|s| s.len()).unwrap_or(0),
            2,
            "{}: no retries for 4xx",
            d.name
        );
    }
}

#[tokio::test]
async fn contract_retries_429_with_retry_after_and_500_before_output() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(
            &script,
            Reply {
                headers: vec![("retry-after", "1".into())],
                ..json_reply(429, &json!({"error": {"message": "Rate limit reached"}}))
            },
        );
        push(
            &script,
            json_reply(500, &json!({"error": {"message": "internal"}})),
        );
        push(&script, streamed(&d, (d.text_stream)(&["ok"])));
        let p = provider(&d, &base, "5s");
        let started = Instant::now();
        let out = events(&*p, &request(false))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert!(
            started.elapsed() >= Duration::from_millis(1000),
            "{}: Retry-After honoured",
            d.name
        );
        assert!(
            matches!(out.first(), Some(StreamEvent::TextDelta(t)) if t == "ok"),
            "{}: {out:?}",
            d.name
        );
        assert_eq!(
            script.seen.lock().map(|s| s.len()).unwrap_or(0),
            3,
            "{}",
            d.name
        );

        // Three failures in a row: the last error comes back, with Retry-After.
        for _ in 0..3 {
            push(
                &script,
                Reply {
                    headers: vec![("retry-after", "0".into())],
                    ..json_reply(429, &json!({"error": {"message": "slow down"}}))
                },
            );
        }
        let e = p.stream(&request(false)).await.err().expect("accepted");
        assert_eq!(e.kind, ErrorKind::RateLimited, "{}", d.name);
        assert_eq!(e.retry_after, Some(Duration::ZERO));
    }
}

#[tokio::test]
async fn contract_mid_stream_error_and_malformed_chunk_are_stream_errors() {
    for d in dialects() {
        let (base, script) = mock().await;
        push(&script, streamed(&d, (d.error_mid_stream)()));
        push(&script, streamed(&d, (d.malformed_stream)()));
        let p = provider(&d, &base, "5s");
        let mut s = p
            .stream(&request(false))
            .await
            .unwrap_or_else(|e| panic!("{}: error before output must not happen: {e}", d.name));
        let first = s.next().await;
        assert!(
            matches!(first, Some(Ok(StreamEvent::TextDelta(ref t))) if t == "partial"),
            "{}: {first:?}",
            d.name
        );
        let second = s.next().await;
        let e = match second {
            Some(Err(e)) => e,
            other => panic!("{}: expected an error item, got {other:?}", d.name),
        };
        assert_eq!(e.kind, ErrorKind::Upstream, "{}: {e}", d.name);
        assert!(
            s.next().await.is_none(),
            "{}: stream ends after an error",
            d.name
        );
        assert_eq!(
            script.seen.lock().map(|s| s.len()).unwrap_or(0),
            1,
            "{}: no retry after output",
            d.name
        );

        let out = events(&*p, &request(false)).await;
        let e = out
            .err()
            .unwrap_or_else(|| panic!("{}: malformed chunk accepted", d.name));
        assert_eq!(e.kind, ErrorKind::Protocol, "{}: {e}", d.name);
        assert!(
            e.message.contains("malformed stream chunk"),
            "{}: {e}",
            d.name
        );
    }
}

#[tokio::test]
async fn contract_stalled_server_times_out() {
    for d in dialects() {
        let (base, script) = mock().await;
        let mut chunks = (d.text_stream)(&["slow"]);
        chunks.pop();
        // The final chunk never comes; the server keeps the connection open instead.
        for _ in 0..3 {
            push(
                &script,
                Reply {
                    stall: Some(Duration::from_secs(30)),
                    ..streamed(&d, chunks.clone())
                },
            );
        }
        let p = provider(&d, &base, "1s");
        let started = Instant::now();
        let result = events(&*p, &request(false)).await;
        let e = result
            .err()
            .unwrap_or_else(|| panic!("{}: stalled stream accepted", d.name));
        assert_eq!(e.kind, ErrorKind::Timeout, "{}: {e}", d.name);
        assert!(started.elapsed() < Duration::from_secs(10), "{}", d.name);
    }
}

#[tokio::test]
async fn contract_dropping_a_stream_closes_the_request() {
    for d in dialects() {
        let (base, script) = mock().await;
        let chunks = (d.text_stream)(&["one", "two"]);
        push(
            &script,
            Reply {
                stall: Some(Duration::from_secs(30)),
                ..streamed(&d, chunks[..chunks.len() - 2].to_vec())
            },
        );
        let p = provider(&d, &base, "30s");
        let mut s = p
            .stream(&request(false))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let _ = s.next().await;
        let dropped = Instant::now();
        drop(s);
        let deadline = Instant::now() + Duration::from_secs(5);
        let closed_at = loop {
            if let Some(t) = *script.dropped_at.lock().unwrap_or_else(|e| e.into_inner()) {
                break t;
            }
            assert!(
                Instant::now() < deadline,
                "{}: the server never saw the client go",
                d.name
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let after = closed_at.saturating_duration_since(dropped);
        eprintln!(
            "{}: request closed {after:?} after the stream was dropped",
            d.name
        );
    }
}

#[tokio::test]
async fn contract_lists_models() {
    for d in dialects() {
        let (base, script) = mock().await;
        push_get(&script, json_reply(200, &d.models_json));
        let p = provider(&d, &base, "5s");
        let models = p
            .list_models()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_eq!(models.len(), 1, "{}", d.name);
        assert!(models[0].ends_with("-test"), "{}: {models:?}", d.name);
    }
}

// --- `kortex ask` and `kortex providers check`, the real binary against the same servers ---

fn write_manifests(dir: &std::path::Path, providers: &[(&str, &str, String, bool)]) {
    let mut text = String::from(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: keys}\nstringData: {k: \"${KORTEX_ASK_TEST_KEY}\"}\n",
    );
    for (name, kind, base, with_key) in providers {
        let key = if *with_key {
            "apiKeySecretRef: {name: keys, key: k}"
        } else {
            "apiKeySecretRef: {name: nokeys, key: k}"
        };
        text.push_str(&format!(
            "---\napiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: {name}}}\nspec:\n  type: {kind}\n  baseUrl: {base}\n  defaultModel: test-model\n  timeout: 5s\n  {key}\n  models:\n    - {{id: test-model, cost: {{inputUsdPerMTok: 10, outputUsdPerMTok: 20}}}}\n"
        ));
    }
    std::fs::write(dir.join("providers.yaml"), text).unwrap();
}

async fn kortex(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args(&args)
            .env("KORTEX_ASK_TEST_KEY", KEY)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_streams_text_and_returns_tool_calls_for_every_format() {
    for d in dialects() {
        let (base, script) = mock().await;
        let dir = tempfile::tempdir().unwrap();
        write_manifests(
            dir.path(),
            &[(
                d.name,
                d.provider_type,
                format!("{base}{}", d.base_suffix),
                true,
            )],
        );
        let manifests = dir.path().display().to_string();
        let tools_dir = tempfile::tempdir().unwrap();
        let tools = tools_dir.path().join("tools.json");
        std::fs::write(&tools, r#"[{"name": "get_logs", "description": "Pod logs", "parameters": {"type": "object"}}]"#)
            .unwrap();
        let tools = tools.display().to_string();
        let base_args = |extra: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = vec![
                "ask".into(),
                "--manifests".into(),
                manifests.clone(),
                "--provider".into(),
                d.name.into(),
            ];
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };

        push(
            &script,
            streamed(&d, (d.text_stream)(&["Hel", "lo, ", "wor", "ld"])),
        );
        let out = kortex(base_args(&["why?"])).await;
        assert!(
            out.status.success(),
            "{}: {}",
            d.name,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "Hello, world\n",
            "{}",
            d.name
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains(KEY));

        push(&script, streamed(&d, (d.tools_stream)(CALLS)));
        let out = kortex(base_args(&["--tool-file", &tools, "--json", "why?"])).await;
        assert!(
            out.status.success(),
            "{}: {}",
            d.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{}: {e}: {}", d.name, String::from_utf8_lossy(&out.stdout))
        });
        assert_eq!(v["stopReason"], "tool_use", "{}: {v}", d.name);
        assert_eq!(v["toolCalls"][1]["name"], "get_events", "{}", d.name);
        assert_eq!(
            v["toolCalls"][0]["input"]["selector"], "app=api",
            "{}",
            d.name
        );
        assert_eq!(
            v["usage"],
            json!({"inputTokens": 40, "outputTokens": 60}),
            "{}",
            d.name
        );
        assert_eq!(v["text"], "Checking.", "{}", d.name);
        let cost = v["costUsd"].as_f64().unwrap_or_default();
        assert!(
            (cost - (40.0 * 10.0 + 60.0 * 20.0) / 1e6).abs() < 1e-12,
            "{}: {cost}",
            d.name
        );

        push(&script, json_reply(200, &(d.tools_json)(CALLS)));
        let out = kortex(base_args(&["--no-stream", "--json", "why?"])).await;
        assert!(
            out.status.success(),
            "{}: {}",
            d.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(
            v["toolCalls"].as_array().map(Vec::len),
            Some(2),
            "{}: {v}",
            d.name
        );
        let seen = script.requests();
        assert_eq!(seen.len(), 3, "{}", d.name);
        assert!(
            seen[1].body.to_string().contains("get_logs"),
            "{}: the tool file is sent",
            d.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_check_explains_every_provider_in_one_line() {
    let (base, script) = mock().await;
    push_get(
        &script,
        json_reply(
            200,
            &json!({"data": [{"id": "gpt-test"}, {"id": "test-model"}]}),
        ),
    );
    push_get(
        &script,
        json_reply(
            401,
            &json!({"error": {"message": "Incorrect API key provided"}}),
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    write_manifests(
        dir.path(),
        &[
            ("a-good", "openai", format!("{base}/v1"), true),
            ("b-refused", "openai", format!("{base}/v1"), true),
            ("c-nokey", "anthropic", base.clone(), false),
            ("d-down", "ollama", "http://127.0.0.1:9".into(), true),
        ],
    );
    let out = kortex(vec![
        "providers".into(),
        "check".into(),
        "--manifests".into(),
        dir.path().display().to_string(),
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0].starts_with("✓ a-good (openai, ")
            && lines[0].contains("models: gpt-test, test-model"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("✗ b-refused") && lines[1].contains("reachable but the key was refused"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("✗ c-nokey")
            && lines[2].contains("secret nokeys key k: Secret nokeys not found"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].contains("✗ d-down") && lines[3].contains("unreachable: connection"),
        "{}",
        lines[3]
    );
    assert!(!out.status.success(), "a failing provider fails the check");
    assert!(!stdout.contains(KEY));
}

#[tokio::test]
async fn prompt_tool_mode_describes_tools_in_text_and_parses_calls() {
    for d in dialects() {
        let (base, script) = mock().await;
        let text = "I will look.<tool_call>{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\"}}</tool_call>";
        let parts = pieces(text, 5);
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        push(&script, streamed(&d, (d.text_stream)(&parts)));
        let p = provider_with(&d, &base, "5s", "prompt");
        assert!(!p.capabilities().native_tools);
        let out = events(&*p, &request(true))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert!(
            matches!(out.first(), Some(StreamEvent::Warning(w)) if w.contains("best effort")),
            "{}: {out:?}",
            d.name
        );
        let text: String = out
            .iter()
            .filter_map(|e| {
                if let StreamEvent::TextDelta(t) = e {
                    Some(t.as_str())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(text, "I will look.", "{}", d.name);
        let calls: Vec<_> = out
            .iter()
            .filter_map(|e| {
                if let StreamEvent::ToolCall(c) = e {
                    Some(c)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(calls.len(), 1, "{}", d.name);
        assert_eq!(calls[0].input, json!({"namespace": "shop"}));
        assert!(
            matches!(
                out.last(),
                Some(StreamEvent::Done {
                    stop_reason: StopReason::ToolUse,
                    ..
                })
            ),
            "{}",
            d.name
        );
        let seen = script.requests();
        assert!(
            seen[0].body.get("tools").is_none(),
            "{}: no native tools in prompt mode",
            d.name
        );
        assert!(
            seen[0].body.to_string().contains("<tool_call>"),
            "{}: tools described in the prompt",
            d.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_probes_providers_into_reachable_conditions() {
    let (base, script) = mock().await;
    push_get(
        &script,
        json_reply(200, &json!({"data": [{"id": "discovered-model"}]})),
    );
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    write_manifests(
        &manifests,
        &[
            ("up", "openai-compatible", format!("{base}/v1"), true),
            ("down", "ollama", "http://127.0.0.1:9".into(), true),
        ],
    );
    let server = Server::start(
        &manifests,
        &dir.path().join("k.db"),
        &[("KORTEX_ASK_TEST_KEY", KEY)],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let list = loop {
        let (_, body) = server.get("/api/v1/llm/providers").await;
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let probed = v["items"]
            .as_array()
            .is_some_and(|items| items.iter().all(|i| !i["probe"].is_null()));
        if probed {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "providers never probed: {body}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let find = |name: &str| {
        list["items"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let reachable = |item: &Value| item_condition(item, "Reachable");
    let up = find("up");
    assert_eq!(reachable(&up)["status"], "True", "{up}");
    assert!(
        up["statusModels"]
            .as_array()
            .is_some_and(|m| m.contains(&json!("discovered-model"))),
        "{up}"
    );
    let down = find("down");
    assert_eq!(
        (
            reachable(&down)["status"].clone(),
            reachable(&down)["reason"].clone()
        ),
        (json!("False"), json!("Unreachable")),
        "{down}"
    );
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_proxy_from_the_environment_is_honoured() {
    // The mock plays the proxy: the provider's host is never resolved, every request goes
    // to 127.0.0.1 in absolute form.
    let (proxy, script) = mock().await;
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["via proxy"])));
    let dir = tempfile::tempdir().unwrap();
    write_manifests(
        dir.path(),
        &[(
            "corp",
            "openai-compatible",
            "http://llm.corp.invalid/v1".into(),
            true,
        )],
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args(["ask", "--manifests"])
            .arg(dir.path())
            .args(["--provider", "corp", "hello"])
            .env("KORTEX_ASK_TEST_KEY", KEY)
            .env("HTTP_PROXY", &proxy)
            .env("http_proxy", &proxy)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via proxy\n");
    let seen = script.requests();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].headers.get("host").and_then(|h| h.to_str().ok()),
        Some("llm.corp.invalid")
    );
}

/// A one-request-at-a-time HTTPS server with a self-signed certificate; answers every
/// request with `body`. Returns its base URL and the certificate's PEM.
async fn https_server(body: &'static str) -> (String, String) {
    let (acceptor, pem) = crate::support::tls_proxy::self_signed();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (format!("https://127.0.0.1:{}", addr.port()), pem)
}

#[tokio::test]
async fn ca_bundle_secret_makes_an_internal_tls_endpoint_trusted() {
    let (base, pem) = https_server(r#"{"data": [{"id": "internal-model"}]}"#).await;
    let catalog_with = |with_ca: bool| {
        let mut spec = json!({"type": "openai-compatible", "baseUrl": format!("{base}/v1"), "defaultModel": "m"});
        if with_ca {
            spec["caBundleSecretRef"] = json!({"name": "corp-ca", "key": "ca.crt"});
        }
        let objects = ObjectSet {
            providers: vec![serde_json::from_value(json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
                "metadata": {"name": "internal", "namespace": "default"}, "spec": spec}))
            .unwrap()],
            secrets: vec![serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "corp-ca", "namespace": "default", "labels": {"kortex.dev/use": "true"}}, "stringData": {"ca.crt": pem}}))
            .unwrap()],
            ..Default::default()
        };
        compile(&objects, jiff::Timestamp::now())
    };
    let trusted = catalog_with(true);
    let entry = trusted.providers.values().next().expect("no provider");
    let models = llm::build(entry).unwrap().list_models().await;
    assert_eq!(models.unwrap(), vec!["internal-model".to_owned()]);

    let untrusted = catalog_with(false);
    let entry = untrusted.providers.values().next().expect("no provider");
    let e = llm::build(entry).unwrap().list_models().await.err();
    let e = e.expect("a self-signed endpoint was trusted without the CA bundle");
    assert_eq!(e.kind, ErrorKind::Connection, "{e}");
    assert!(
        e.message.to_lowercase().contains("certificate"),
        "the error says why: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_without_a_configured_model_uses_the_first_discovered_one() {
    let (base, script) = mock().await;
    let d = openai();
    push_get(
        &script,
        json_reply(
            200,
            &json!({"data": [{"id": "served-model"}, {"id": "other"}]}),
        ),
    );
    push(&script, streamed(&d, (d.text_stream)(&["hi"])));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!("apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: vllm}}\nspec: {{type: openai-compatible, baseUrl: \"{base}/v1\"}}\n"),
    )
    .unwrap();
    let out = kortex(vec![
        "ask".into(),
        "--manifests".into(),
        dir.path().display().to_string(),
        "--provider".into(),
        "vllm".into(),
        "hello".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = script.requests();
    assert_eq!(seen[0].path, "/v1/models");
    assert_eq!(seen[1].body["model"], "served-model");
    assert!(
        seen[1].headers.get("authorization").is_none(),
        "no key configured, none sent"
    );
}

#[tokio::test]
async fn compatible_servers_that_reject_stream_options_get_a_second_request_without_it() {
    let (base, script) = mock().await;
    let d = openai();
    push(
        &script,
        json_reply(
            400,
            &json!({"error": {"message": "Unrecognized request argument supplied: stream_options"}}),
        ),
    );
    push(&script, streamed(&d, (d.text_stream)(&["fine"])));
    push(&script, streamed(&d, (d.text_stream)(&["again"])));
    let compatible = Dialect {
        provider_type: "openai-compatible",
        ..openai()
    };
    let p = provider(&compatible, &base, "5s");
    let out = events(&*p, &request(false)).await.unwrap();
    assert!(
        matches!(out.first(), Some(StreamEvent::TextDelta(t)) if t == "fine"),
        "{out:?}"
    );
    events(&*p, &request(false)).await.unwrap();
    let seen = script.requests();
    assert_eq!(seen.len(), 3);
    assert!(seen[0].body.get("stream_options").is_some());
    assert!(
        seen[1].body.get("stream_options").is_none()
            && seen[2].body.get("stream_options").is_none(),
        "remembered"
    );
    assert_eq!(
        seen[1].body["max_tokens"], 4096,
        "compatible servers get max_tokens"
    );
}
