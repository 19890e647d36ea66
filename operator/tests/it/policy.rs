//! ChatPolicy enforcement end to end: the real binary, three wire-format provider servers
//! that fail on demand, and the policies of the "Done means" — failover with a
//! visible notice, frugal answers and escalations, local-only, budgets that stop spending
//! with a message naming them, and redaction of everything sent to a provider.

use crate::support::chat::{
    ask, assert_notice, get_json, post_message, session, session_json, state, text,
};
use crate::support::manifests::{docs, manifest_dir, policy, provider, secret};
use crate::support::net::http_client;
use crate::support::provider::{
    Reply, Script, json_reply, mock, openai, openai_chunk, push, streamed,
};
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};
use std::sync::Arc;

const SECRET: &str = "sk-backup-TESTKEY-5678";

fn manifests(dir: &std::path::Path, primary: &str, backup: &str, cloud: &str) {
    let yaml = docs(&[
        secret(
            "llm-keys",
            &format!(
                "primary: sk-primary-TESTKEY-1234, backup: {SECRET}, cloud: sk-cloud-TESTKEY-9012"
            ),
        ),
        provider(
            "primary",
            &format!(
                "type: openai-compatible, baseUrl: '{primary}/v1', \
                 apiKeySecretRef: {{name: llm-keys, key: primary}}, defaultModel: full-a, \
                 fastModel: fast-a, timeout: 5s, models: [{{id: full-a, \
                 cost: {{inputUsdPerMTok: 3, outputUsdPerMTok: 15}}}}, {{id: fast-a, \
                 cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 5}}}}, {{id: cheap, \
                 cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 1}}}}]"
            ),
        ),
        provider(
            "backup",
            &format!(
                "type: openai-compatible, baseUrl: '{backup}/v1', \
                 apiKeySecretRef: {{name: llm-keys, key: backup}}, defaultModel: full-b, \
                 locality: local, timeout: 5s"
            ),
        ),
        provider(
            "cloud",
            &format!(
                "type: openai-compatible, baseUrl: '{cloud}/v1', \
                 apiKeySecretRef: {{name: llm-keys, key: cloud}}, defaultModel: full-c, \
                 timeout: 5s"
            ),
        ),
        policy(
            "failover",
            "sessions: [failover-*], provider: primary, fallbackProviders: [backup]",
        ),
        policy(
            "frugal",
            "sessions: [frugal-*], provider: primary, mode: frugal",
        ),
        policy(
            "local",
            "sessions: [local-*], provider: cloud, fallbackProviders: [backup], mode: local-only",
        ),
        policy(
            "budget",
            "sessions: [budget-*], provider: primary, models: {default: cheap}, \
             budget: {dailyUsdLimit: 0.05, alertAtPercent: 50, perUserHourlyRequests: 2}",
        ),
        policy(
            "private",
            "sessions: [private-*], provider: backup, \
             privacy: {redactSecrets: true, redactPii: true}",
        ),
    ]);
    std::fs::write(dir.join("policies.yaml"), yaml).unwrap();
}

/// A streamed OpenAI answer of `text` that stopped for `finish` with `completion` tokens.
fn answer(text: &str, finish: &str, completion: u64) -> Reply {
    let mut chunks = vec![
        openai_chunk(json!({"role": "assistant", "content": text}), Value::Null),
        openai_chunk(json!({}), json!(finish)),
    ];
    chunks.push(format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "served", "choices": [],
               "usage": {"prompt_tokens": 25, "completion_tokens": completion}})
    ));
    chunks.push("data: [DONE]\n\n".into());
    streamed(&openai(), chunks)
}

/// The chat requests (not model listings) a provider server received.
fn chats(script: &Script) -> Vec<Value> {
    script
        .requests()
        .iter()
        .filter(|s| s.body.get("messages").is_some())
        .map(|s| s.body.clone())
        .collect()
}

async fn failover(server: &Server, primary: &Arc<Script>, backup: &Arc<Script>) {
    // A hard failure before any output: every attempt at the primary answers 503.
    *primary.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_| {
        let mut r = json_reply(
            503,
            &json!({"error": {"message": "overloaded", "type": "server_error"}}),
        );
        r.headers.push(("retry-after", "0".into()));
        Some(r)
    }));
    push(backup, answer("Backup answer.", "stop", 5));
    let id = session(server, "failover-1").await;
    let events = ask(server, &id, "why is checkout slow?").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    assert_eq!(text(&events), "Backup answer.");
    assert_notice(&events, |m| {
        m.starts_with("primary/full-a failed before answering")
            && m.ends_with("failing over to backup/full-b")
    });
    assert_eq!(
        chats(primary).len(),
        3,
        "three attempts (retries) at the primary"
    );
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=failover")).await;
    let rows = audit["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{audit}");
    assert_eq!(rows[0]["subject"], "primary/full-a -> backup/full-b");
    assert_eq!(rows[0]["outcome"], "upstream");

    // After output has started, a failure ends the run: no second model's half-answer.
    *primary.responder.lock().unwrap_or_else(|e| e.into_inner()) = None;
    push(primary, streamed(&openai(), (openai().error_mid_stream)()));
    let before = chats(backup).len();
    let id = session(server, "failover-2").await;
    let events = ask(server, &id, "and now?").await;
    assert_eq!(state(&events), json!("failed"));
    assert_eq!(text(&events), "partial");
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .map(|e| e.data.clone());
    assert_eq!(
        error.map(|e| e["code"].clone()),
        Some(json!("provider_error"))
    );
    assert_eq!(
        chats(backup).len(),
        before,
        "no failover after output started"
    );
}

async fn frugal(server: &Server, primary: &Arc<Script>) {
    // The fast model stops at its token limit: escalated to the full model, and only the
    // full answer reaches the user.
    let start = chats(primary).len();
    push(primary, answer("The fast answer was cut", "length", 5));
    push(primary, answer("Full answer.", "stop", 9));
    let id = session(server, "frugal-1").await;
    let events = ask(server, &id, "explain the outage").await;
    assert_eq!(state(&events), json!("completed"));
    assert_eq!(text(&events), "Full answer.");
    assert_notice(&events, |m| {
        m == "the fast model primary/fast-a stopped at its output token limit; full-a answers instead"
    });
    let sent = chats(primary);
    let models: Vec<&str> = sent[start..]
        .iter()
        .filter_map(|b| b["model"].as_str())
        .collect();
    assert_eq!(models, ["fast-a", "full-a"]);
    let fast_system = sent[start]["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(fast_system.contains("[[kortex:escalate]]"), "{fast_system}");

    // A good fast answer stands.
    push(primary, answer("Quick answer.", "stop", 3));
    let id = session(server, "frugal-2").await;
    let events = ask(server, &id, "what is a pod?").await;
    assert_eq!(text(&events), "Quick answer.");
    assert_eq!(
        chats(primary).last().map(|b| b["model"].clone()),
        Some(json!("fast-a"))
    );

    // The fast model asks for more through the documented marker.
    push(primary, answer("[[kortex:escalate]]", "stop", 3));
    push(primary, answer("Deep answer.", "stop", 9));
    let id = session(server, "frugal-3").await;
    let events = ask(server, &id, "plan a zero-downtime migration").await;
    assert_eq!(text(&events), "Deep answer.");
    assert_notice(&events, |m| m.contains("asked for more context"));
    // A fast model with a smaller context window hands the request over too.
    push(
        primary,
        json_reply(
            400,
            &json!({"error": {"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request_error"}}),
        ),
    );
    push(primary, answer("Long answer.", "stop", 9));
    let id = session(server, "frugal-4").await;
    let events = ask(server, &id, "read these logs").await;
    assert_eq!(text(&events), "Long answer.");
    assert_notice(&events, |m| m.contains("fast-a could not take the request"));
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=escalation")).await;
    assert_eq!(audit["items"].as_array().map(Vec::len), Some(3), "{audit}");
}

async fn local_only(server: &Server, backup: &Arc<Script>, cloud: &Arc<Script>) {
    push(backup, answer("Local answer.", "stop", 4));
    let id = session(server, "local-1").await;
    let events = ask(server, &id, "summarize the incident").await;
    assert_eq!(text(&events), "Local answer.");
    assert!(
        chats(cloud).is_empty(),
        "a local-only policy never calls a cloud provider"
    );
    let policies = get_json(&http_client(), server.url("/api/v1/policies")).await;
    let local = policies["items"]
        .as_array()
        .and_then(|items| items.iter().find(|p| p["name"] == "local"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(local["routes"][0]["provider"], "backup", "{local}");
    assert_eq!(
        local["skipped"][0]["reason"],
        "locality cloud; the policy's mode is local-only"
    );
}

async fn budget(server: &Server, primary: &Arc<Script>) {
    // $0.048 of $0.05 on the first answer: the 50 % alert comes with it.
    push(primary, answer("Spent.", "stop", 48_000));
    let id = session(server, "budget-1").await;
    let events = ask(server, &id, "first").await;
    assert_eq!(text(&events), "Spent.");
    assert_notice(&events, |m| {
        m == "ChatPolicy default/budget has used over 50% of its dailyUsdLimit ($0.05 of $0.05)"
    });
    // The next call's reservation does not fit: refused before anything is sent.
    let calls = chats(primary).len();
    let events = ask(server, &id, "second").await;
    assert_eq!(state(&events), json!("failed"));
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .map(|e| e.data.clone())
        .unwrap_or_default();
    assert_eq!(error["code"], "budget_exceeded");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "budget dailyUsdLimit of ChatPolicy default/budget is exhausted: limit $0.05"
        ) && message.contains("resets at"),
        "{message}"
    );
    assert_eq!(chats(primary).len(), calls, "nothing was sent");
    // A third request in the hour: 429 naming the budget, with Retry-After.
    let r = post_message(server, &id, "third").await;
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((1..=3600).contains(&retry), "{retry}");
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "budget_exceeded");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("perUserHourlyRequests") && m.contains("limit 2 requests")),
        "{body}"
    );
    // Spend is visible per policy and in the usage report.
    let policies = get_json(&http_client(), server.url("/api/v1/policies")).await;
    let p = policies["items"]
        .as_array()
        .and_then(|items| items.iter().find(|p| p["name"] == "budget"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(p["spend"]["dailyUsdLimit"], json!(0.05), "{p}");
    assert!(
        (p["spend"]["todayUsd"].as_f64().unwrap_or(0.0) - 0.048025).abs() < 1e-9,
        "{p}"
    );
    let usage = get_json(&http_client(), server.url("/api/v1/usage?by=policy")).await;
    let row = usage["items"]
        .as_array()
        .and_then(|items| items.iter().find(|r| r["key"] == "default/budget"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["outputTokens"], json!(48_000), "{usage}");
    // The same as a table from the CLI.
    let url = server.url("");
    let out = kortex_cli(
        &["usage", "--server", &url, "--by", "policy", "--since", "1d"],
        "",
    )
    .await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("POLICY") && lines[0].contains("COST USD"),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("default/budget") && l.contains("48000")),
        "{table}"
    );
    assert!(
        lines.last().is_some_and(|l| l.starts_with("TOTAL")),
        "{table}"
    );
}

async fn redaction(server: &Server, backup: &Arc<Script>) {
    push(backup, answer("Noted.", "stop", 2));
    let id = session(server, "private-1").await;
    let events = ask(
        server,
        &id,
        &format!("my key is {SECRET}, mail jane.doe@example.com, pod at 10.2.3.4"),
    )
    .await;
    assert_eq!(state(&events), json!("completed"));
    let sent = chats(backup)
        .last()
        .cloned()
        .unwrap_or_default()
        .to_string();
    for leaked in [SECRET, "jane.doe@example.com", "10.2.3.4"] {
        assert!(
            !sent.contains(leaked),
            "{leaked} reached the provider: {sent}"
        );
    }
    for placeholder in ["[REDACTED:secret]", "[REDACTED:email]", "[REDACTED:ip]"] {
        assert!(sent.contains(placeholder), "{placeholder} missing: {sent}");
    }
    // Stored redacted too.
    let stored = session_json(server, &id).await;
    let question = stored["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        question,
        "my key is [REDACTED:secret], mail [REDACTED:email], pod at [REDACTED:ip]"
    );
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=llm_call")).await;
    let call = audit["items"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["policy"] == "private"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        call["detail"]["redactions"],
        json!(0),
        "the stored question was already redacted"
    );

    // An answer whose credentials and personal data arrive split across slow deltas (each
    // flushed before the next): what is streamed hides what the stored copy hides.
    let d = openai();
    let pieces = [
        "Found it. The password: ",
        "hunter2-s3cr",
        "et-77 and the header Bearer ",
        "abcdef0123456789",
        "xyz0123 and ",
        "the key sk-backup-TEST",
        "KEY-5678; mail jane.",
        "doe@example.com; card 4111 1111 ",
        "1111 1111; -----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN",
        "BgkqhkiG9w0\n-----END PRIVATE KEY----- done.",
    ];
    let mut reply = streamed(&d, (d.text_stream)(&pieces));
    reply.chunk_delay = Some(std::time::Duration::from_millis(120));
    push(backup, reply);
    let events = ask(server, &id, "what is in the config?").await;
    assert_eq!(state(&events), json!("completed"));
    let deltas = events.iter().filter(|e| e.event == "text.delta").count();
    assert!(deltas > 3, "the answer was streamed in pieces: {deltas}");
    let streamed_text = text(&events);
    let stored = session_json(server, &id).await;
    let answer = stored["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "assistant"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    for leaked in [
        "hunter2",
        "s3cret",
        "et-77",
        "0123456789xyz",
        "xyz0123",
        "KEY-5678",
        "jane.doe",
        "1111 1111",
        "MIIEvQ",
        "BgkqhkiG9w0",
    ] {
        assert!(!answer.contains(leaked), "{leaked} stored: {answer}");
        assert!(
            !streamed_text.contains(leaked),
            "{leaked} streamed: {streamed_text}"
        );
    }
    assert_eq!(streamed_text, answer, "what is streamed is what is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_fail_over_economize_stay_local_keep_budgets_and_redact() {
    let (primary_url, primary) = mock().await;
    let (backup_url, backup) = mock().await;
    let (cloud_url, cloud) = mock().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &primary_url, &backup_url, &cloud_url);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    failover(&server, &primary, &backup).await;
    frugal(&server, &primary).await;
    local_only(&server, &backup, &cloud).await;
    budget(&server, &primary).await;
    redaction(&server, &backup).await;
    let log = server.log();
    for secret in [SECRET, "sk-primary-TESTKEY-1234", "jane.doe@example.com"] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
    assert!(server.terminate().success());
}
