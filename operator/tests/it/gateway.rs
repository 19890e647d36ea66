//! The gateway with the vendors' official Python SDKs (`openai`, `anthropic`) against the
//! real binary and a wire-format upstream (tests/fixtures/gateway_sdk.py): completions,
//! streaming, tool calls, JSON-schema output, models, an unknown model, a bad key and an
//! exhausted budget — then usage per team and what reached the upstream.

use crate::support::chat::get_json;
use crate::support::db::postgres;
use crate::support::manifests::{docs, gateway_key, manifest_dir, policy, provider, secret};
use crate::support::net::http_client;
use crate::support::provider::{Reply, json_reply, mock, openai, streamed};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const KEY: &str = "kgw-shop-0f9e8d7c6b5a4321";
const BROKE_KEY: &str = "kgw-broke-1a2b3c4d5e6f7788";

fn responder(body: &Value) -> Option<Reply> {
    let d = openai();
    if let Some(inputs) = body["input"].as_array() {
        let data: Vec<Value> = (0..inputs.len())
            .map(|i| json!({"object": "embedding", "index": i, "embedding": [0.5, -0.25, 0.125]}))
            .collect();
        return Some(json_reply(
            200,
            &json!({"object": "list", "data": data, "model": "embed-small", "usage": {"prompt_tokens": 4, "total_tokens": 4}}),
        ));
    }
    let last = body["messages"].as_array()?.last()?.clone();
    // A client that asked for no stream gets a non-streamed upstream call.
    let whole = body["stream"] != json!(true);
    let text = |parts: &[&str]| {
        if whole {
            json_reply(200, &(d.text_json)(&parts.concat()))
        } else {
            streamed(&d, (d.text_stream)(parts))
        }
    };
    if body["tools"].as_array().is_some_and(|t| !t.is_empty()) && last["role"] == "user" {
        let call = [("call_w1", "get_weather", r#"{"city": "Paris"}"#)];
        return Some(if whole {
            json_reply(200, &(d.tools_json)(&call))
        } else {
            streamed(&d, (d.tools_stream)(&call))
        });
    }
    if body.get("response_format").is_some() {
        return Some(text(&[r#"{"city": "Paris", "#, r#""temp_c": 21}"#]));
    }
    Some(text(&["Hello ", "from ", "upstream"]))
}

fn manifests(dir: &Path, base: &str) {
    let yaml = docs(&[
        secret("upstream-key", "key: sk-upstream-SECRET-42"),
        gateway_key("gateway-shop", "shop", "apps", KEY),
        gateway_key("gateway-broke", "broke-team", "broke", BROKE_KEY),
        provider(
            "upstream",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', \
                 apiKeySecretRef: {{name: upstream-key, key: key}}, defaultModel: gpt-test, \
                 timeout: 10s, models: [{{id: gpt-test, cost: {{inputUsdPerMTok: 2, \
                 outputUsdPerMTok: 8}}}}, {{id: embed-small, cost: {{inputUsdPerMTok: 0.02, \
                 outputUsdPerMTok: 0}}}}]"
            ),
        ),
        policy(
            "apps",
            "sessions: [gateway-apps], provider: upstream, budget: {dailyUsdLimit: 5}",
        ),
        policy(
            "broke",
            "sessions: [gateway-broke], provider: upstream, budget: {dailyUsdLimit: 0}",
        ),
    ]);
    std::fs::write(dir.join("gateway.yaml"), yaml).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_work_unchanged_against_the_gateway() {
    let required = std::env::var("KORTEX_REQUIRE_SDK").is_ok_and(|v| v == "1");
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_sdks = std::process::Command::new(&python)
        .args(["-c", "import openai, anthropic"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdks {
        assert!(
            !required,
            "KORTEX_REQUIRE_SDK=1 but {python} cannot import openai and anthropic"
        );
        eprintln!(
            "skipping: the openai and anthropic SDKs are not installed (scripts/test.sh installs them)"
        );
        return;
    }
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let (dir, m) = manifest_dir();
    manifests(&m, &base);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let url = server.url("");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gateway_sdk.py");
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(fixture)
            .env("KORTEX_URL", url)
            .env("KORTEX_KEY", KEY)
            .env("KORTEX_BROKE_KEY", BROKE_KEY)
            .output()
    });
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the SDK script did not finish in 120 s")
        .unwrap()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK checks failed\n--- stdout\n{stdout}\n--- stderr\n{}\n--- server log\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    println!("{stdout}");

    // What reached the upstream: Kortex's own key, the schema passed through, no gateway key.
    let seen = script.requests();
    let chats: Vec<_> = seen
        .iter()
        .filter(|s| s.body.get("messages").is_some())
        .collect();
    assert!(chats.iter().all(|s| {
        s.headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some("Bearer sk-upstream-SECRET-42")
    }));
    assert!(
        chats
            .iter()
            .any(|s| s.body["response_format"]["json_schema"]["name"] == "weather"),
        "response_format was passed through"
    );
    // A Responses call chained by previous_response_id sent the whole conversation: the
    // question, the model's call and the client's output for it.
    assert!(
        chats.iter().any(|s| {
            let m = &s.body["messages"];
            m.to_string().contains("What is the weather in Paris?")
                && m.as_array().is_some_and(|m| {
                    m.iter().any(|x| {
                        x["role"] == "assistant"
                            && x["tool_calls"][0]["function"]["name"] == "get_weather"
                    }) && m
                        .iter()
                        .any(|x| x["role"] == "tool" && x["content"] == "21C and sunny")
                })
        }),
        "the chained conversation reached the provider"
    );
    // Forced tool calls reach the provider in its own terms.
    assert!(chats.iter().any(|s| s.body["tool_choice"] == "required"));
    assert!(chats.iter().any(|s| {
        s.body["tool_choice"] == json!({"type": "function", "function": {"name": "get_weather"}})
    }));
    let all = format!(
        "{:?}",
        seen.iter()
            .map(|s| (&s.headers, &s.body))
            .collect::<Vec<_>>()
    );
    assert!(!all.contains(KEY), "the gateway key never goes upstream");
    // Usage per team (written behind, within a moment), and the refused team spent nothing.
    let embeddings = seen
        .iter()
        .filter(|s| s.body.get("input").is_some())
        .count();
    assert_eq!(embeddings, 1);
    let mut usage = Value::Null;
    let mut shop = Value::Null;
    for _ in 0..50 {
        usage = get_json(&http_client(), server.url("/api/v1/usage?by=user")).await;
        shop = usage["items"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["key"] == "shop"))
            .cloned()
            .unwrap_or_default();
        if shop["requests"] == json!(chats.len() + embeddings) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(shop["requests"], json!(chats.len() + embeddings), "{usage}");
    assert!(shop["costUsd"].as_f64().unwrap_or(0.0) > 0.0, "{usage}");
    assert!(
        !usage["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["key"] == "broke-team"),
        "{usage}"
    );
    let log = server.log();
    assert!(
        !log.contains(KEY) && !log.contains("sk-upstream-SECRET-42"),
        "keys reached the log"
    );
    assert!(server.terminate().success());
}

/// Rate limits: a key's `kortex.dev/requests-per-minute` answers the call past it with 429
/// and the `x-ratelimit-*-requests` headers and `retry-after`; a call bigger than its
/// `tokens-per-minute` gets the `-tokens` ones; and two replicas on one PostgreSQL share
/// their policy's `rateLimits.requestsPerMinute`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_answer_429_with_the_headers_sdks_read_and_replicas_share_them() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let write = |dir: &Path| {
        std::fs::write(
            dir.join("gateway.yaml"),
            docs(&[
    secret("upstream-key", "key: sk-upstream-SECRET-42"),
    format!(r#"apiVersion: v1
kind: Secret
metadata:
  name: gateway-slow
  labels: {{kortex.dev/credentials: gateway}}
  annotations: {{kortex.dev/policy: apps, kortex.dev/requests-per-minute: "3", kortex.dev/tokens-per-minute: "400"}}
stringData: {{team: slow, key: {KEY}}}
"#),
    gateway_key("gateway-shared", "shared", "shared", BROKE_KEY),
    provider("upstream", &format!("type: openai-compatible, baseUrl: '{base}/v1', \
                                   apiKeySecretRef: {{name: upstream-key, key: key}}, \
                                   defaultModel: gpt-test, timeout: 10s")),
    policy("apps", "sessions: [gateway-apps], provider: upstream"),
    policy("shared", "sessions: [gateway-shared], provider: upstream, \
                      rateLimits: {requestsPerMinute: 4}"),
]),
        )
        .unwrap();
    };
    // Within one clock minute: the windows are per minute.
    let second = jiff::Timestamp::now().as_second().rem_euclid(60);
    if second > 40 {
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(61 - second).unwrap_or(20),
        ))
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let client = http_client();
    let call = |url: String, key: &'static str, text: String| {
        let client = client.clone();
        async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(
                    &json!({"model": "gpt-test", "messages": [{"role": "user", "content": text}]}),
                )
                .send()
                .await
                .unwrap()
        }
    };
    let url = server.url("/v1/chat/completions");
    // Too many tokens for one minute: refused before any request is counted.
    let big = call(url.clone(), KEY, "word ".repeat(2000)).await;
    assert_eq!(big.status().as_u16(), 429);
    assert_eq!(big.headers()["x-ratelimit-limit-tokens"], "400");
    assert_eq!(big.headers()["x-ratelimit-remaining-tokens"], "0");
    let body: Value = big.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("400 tokens per minute")),
        "{body}"
    );
    for i in 0..3 {
        let r = call(url.clone(), KEY, "hi".into()).await;
        assert_eq!(r.status().as_u16(), 200, "call {i}");
    }
    let r = call(url.clone(), KEY, "hi".into()).await;
    assert_eq!(r.status().as_u16(), 429);
    let h = r.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "3");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    let reset: u64 = h["x-ratelimit-reset-requests"]
        .to_str()
        .unwrap_or_default()
        .trim_end_matches('s')
        .parse()
        .unwrap_or(0);
    let retry: u64 = h["retry-after"]
        .to_str()
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    assert!((1..=60).contains(&reset) && reset == retry, "{h:?}");
    assert_eq!(h["x-should-retry"], "true");
    assert!(server.terminate().success());

    // Two replicas, one PostgreSQL, one policy limit of 4 per minute.
    let Some(db) = postgres().await else {
        return;
    };
    let second = jiff::Timestamp::now().as_second().rem_euclid(60);
    if second > 40 {
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(61 - second).unwrap_or(20),
        ))
        .await;
    }
    let a = Server::start_with_url(dir.path(), &db.url, &[]);
    let b = Server::start_with_url(dir.path(), &db.url, &[]);
    let mut statuses = Vec::new();
    for i in 0..6 {
        let server = if i % 2 == 0 { &a } else { &b };
        let r = call(server.url("/v1/chat/completions"), BROKE_KEY, "hi".into()).await;
        statuses.push(r.status().as_u16());
        if r.status().as_u16() == 429 {
            assert_eq!(r.headers()["x-ratelimit-limit-requests"], "4");
        }
    }
    assert_eq!(
        statuses,
        vec![200, 200, 200, 200, 429, 429],
        "the replicas share one limit"
    );
    assert!(a.terminate().success() && b.terminate().success());
}
