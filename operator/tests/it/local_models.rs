//! Open models on local servers (`toolMode: auto`, the default of `openai-compatible` and
//! `ollama`): a tool call the model writes as text is run as a call, in chat and through the
//! gateway, against the real binary and a wire-format upstream.

use crate::support::chat::{
    ask, assert_notice, get_json, get_text, provider_usage, session, session_json, state, text,
    until_listed,
};
use crate::support::manifests::{docs, gateway_key, manifest_dir, policy, provider};
use crate::support::net::http_client;
use crate::support::provider::{json_reply, mock, openai, push, push_get, streamed};
use crate::support::server::Server;
use serde_json::{Value, json};

const KEY: &str = "kx-local-gateway-KEY-1";

fn manifests(dir: &std::path::Path, base: &str) {
    let yaml = docs(&[
        provider(
            "llama",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: qwen, \
                 locality: local"
            ),
        ),
        policy(
            "private",
            "sessions: ['*'], provider: llama, mode: local-only, tools: {deny: [propose_action]}",
        ),
        gateway_key("gateway-local", "local", "private", KEY),
    ]);
    std::fs::write(dir.join("all.yaml"), yaml).unwrap();
}

/// `kortex serve` on [`manifests`] with the model server at `base`, and its folder.
fn start(base: &str) -> (Server, tempfile::TempDir) {
    let (dir, m) = manifest_dir();
    manifests(&m, base);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    (server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_written_as_text_runs_in_chat_and_through_the_gateway() {
    let (base, script) = mock().await;
    let (server, _dir) = start(&base);
    let d = openai();

    // The model writes the call as a fenced JSON block, split across deltas.
    let written = "I will search past incidents.\n```json\n{\"name\": \"get_incident_history\", \"arguments\": {\"query\": \"checkout\"}}\n```";
    let pieces: Vec<&str> = written
        .as_bytes()
        .chunks(9)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    push(&script, streamed(&d, (d.text_stream)(&pieces)));
    push(
        &script,
        streamed(&d, (d.text_stream)(&["No similar incident was recorded."])),
    );
    let id = session(&server, "incident-42").await;
    let events = ask(&server, &id, "has checkout failed before?").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    let shown = text(&events);
    assert!(
        !shown.contains("\"arguments\""),
        "the call is not shown: {shown}"
    );
    assert!(
        shown.contains("No similar incident was recorded."),
        "{shown}"
    );
    assert_notice(&events, |n| {
        n.contains("wrote a tool call as text") && n.contains("get_incident_history")
    });
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e.event == "tool.start")
        .map(|e| &e.data)
        .collect();
    assert!(
        started
            .iter()
            .any(|e| e.to_string().contains("get_incident_history")),
        "the tool ran: {events:?}"
    );
    // The second step carries the call natively, the assistant text as a string (never
    // null: llama.cpp answers 500 to that), and the tool's result.
    let second = script
        .requests()
        .iter()
        .filter(|s| s.path.ends_with("/chat/completions"))
        .nth(1)
        .map(|s| s.body.clone())
        .unwrap_or_default();
    let messages = second["messages"].as_array().cloned().unwrap_or_default();
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        assistant["tool_calls"][0]["function"]["name"], "get_incident_history",
        "{second}"
    );
    assert!(assistant["content"].is_string(), "{assistant}");
    assert!(
        messages.iter().any(|m| m["role"] == "tool"),
        "the result went back: {second}"
    );

    // A denied tool is not offered, so a call of it written as text stays text.
    push(
        &script,
        streamed(
            &d,
            (d.text_stream)(&[
                "{\"name\": \"propose_action\", \"arguments\": {\"action\": \"restart\"}}",
            ]),
        ),
    );
    let events = ask(&server, &id, "restart it").await;
    assert_eq!(state(&events), json!("completed"));
    assert!(text(&events).contains("propose_action"), "{events:?}");
    let stored = session_json(&server, &id).await;
    let tool_messages = stored["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or_default();
    assert_eq!(tool_messages, 1, "only the recovered call ran: {stored}");

    // Through the gateway: the client's tools go upstream, and the text call comes back
    // as a native tool call (non-streamed and streamed).
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for stream in [false, true] {
        let parts = [
            "<tool_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ];
        push(
            &script,
            if stream {
                streamed(&d, (d.text_stream)(&parts))
            } else {
                // A client that asks for no stream gets a non-streamed upstream call.
                json_reply(200, &(d.text_json)(&parts.concat()))
            },
        );
        let r = http_client()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(
                &json!({"model": "qwen", "stream": stream, "tools": tools, "tool_choice": "auto",
                "messages": [{"role": "user", "content": "weather in Paris?"}]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let body = r.text().await.unwrap_or_default();
        // Upstream: streamed only when the client streams, and an explicit "auto" kept.
        let upstream = script
            .requests()
            .iter()
            .rev()
            .find(|s| s.path.ends_with("/chat/completions"))
            .map(|s| s.body.clone())
            .unwrap_or_default();
        assert_eq!(upstream["stream"] == json!(true), stream, "{upstream}");
        assert_eq!(upstream["tool_choice"], "auto", "{upstream}");
        if stream {
            assert!(body.contains("\"tool_calls\""), "{body}");
            assert!(
                body.contains("get_weather") && body.contains("Paris"),
                "{body}"
            );
            assert!(body.contains("\"finish_reason\":\"tool_calls\""), "{body}");
            assert!(!body.contains("<tool_call>"), "{body}");
        } else {
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            assert_eq!(
                choice["message"]["tool_calls"][0]["function"]["name"],
                "get_weather"
            );
            let args: Value = serde_json::from_str(
                choice["message"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default(),
            )
            .unwrap_or_default();
            assert_eq!(args, json!({"city": "Paris"}));
        }
    }
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_a_server_lists_are_served_and_edited_models_replace_old_ones() {
    let (base, script) = mock().await;
    for _ in 0..50 {
        push_get(
            &script,
            json_reply(
                200,
                &json!({"object": "list", "data": [{"id": "qwen-local", "object": "model"}]}),
            ),
        );
    }
    let (dir, m) = manifest_dir();
    let write = |models: &str| {
        manifests(&m, &base);
        let path = m.join("all.yaml");
        let yaml = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .replace("defaultModel: qwen, ", models);
        std::fs::write(&path, yaml).unwrap();
    };
    // No models and no defaultModel: what the server lists is used.
    write("");
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let now = until_listed(&server, KEY, |l| l.iter().any(|m| m == "qwen-local")).await;
    assert_eq!(now, ["qwen-local", "llama/qwen-local"]);
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["Hello."])));
    let id = session(&server, "s-1").await;
    let events = ask(&server, &id, "hi").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    let model = script
        .requests()
        .iter()
        .rev()
        .find(|s| s.path.ends_with("/chat/completions"))
        .map(|s| s.body["model"].clone())
        .unwrap_or_default();
    assert_eq!(model, "qwen-local");

    // The catalog says gemma, then qwen: gemma goes.
    write("models: [{id: gemma}], ");
    until_listed(&server, KEY, |l| l.iter().any(|m| m == "gemma")).await;
    write("models: [{id: qwen}], ");
    let now = until_listed(&server, KEY, |l| l.iter().any(|m| m == "qwen")).await;
    assert!(!now.iter().any(|m| m.ends_with("gemma")), "{now:?}");
    let r = http_client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "gemma", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_reports_no_usage_is_charged_an_estimate_marked_as_such() {
    let (base, script) = mock().await;
    let (server, _dir) = start(&base);
    let d = openai();
    let answer = "The pod was OOM-killed: its memory limit is 128Mi and it uses 300Mi.";
    let mut reply = streamed(&d, (d.text_stream)(&[answer]));
    // llama.cpp's servers send no usage in streams.
    reply.chunks.retain(|c| !c.contains("\"usage\""));
    push(&script, reply);
    let id = session(&server, "s-usage").await;
    let events = ask(&server, &id, "why does the pod restart?").await;
    assert_eq!(state(&events), json!("completed"));
    let row = provider_usage(&server, "llama", 1).await;
    assert_eq!(row["estimatedRequests"], json!(1), "{row}");
    assert_eq!(
        row["outputTokens"],
        json!((answer.len() as u64).div_ceil(4)),
        "output estimated from the text: {row}"
    );
    assert!(row["inputTokens"].as_u64().unwrap_or_default() > 0, "{row}");
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=llm_call")).await;
    let call = audit["items"]
        .as_array()
        .and_then(|r| r.first())
        .cloned()
        .unwrap_or_default();
    assert_eq!(call["detail"]["estimated"], json!(true), "{call}");
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_answers_and_failed_runs_are_said_logged_and_exported() {
    let (base, script) = mock().await;
    let (server, _dir) = start(&base);
    let d = openai();
    // An empty answer completes, with a notice.
    push(&script, streamed(&d, (d.text_stream)(&[""])));
    let id = session(&server, "s-empty").await;
    let events = ask(&server, &id, "anything?").await;
    assert_eq!(state(&events), json!("completed"));
    assert_notice(&events, |n| n.contains("returned an empty answer"));
    // A refusal (400 is not retried) fails the run: logged without the conversation, and
    // the export says so where it happened.
    push(
        &script,
        json_reply(
            400,
            &json!({"error": {"message": "the prompt is too long", "type": "invalid_request_error"}}),
        ),
    );
    let events = ask(&server, &id, "the secret question 42").await;
    assert_eq!(state(&events), json!("failed"), "{events:?}");
    let md = get_text(server.url(&format!("/chat/v1/sessions/{id}/export?format=markdown"))).await;
    assert!(md.contains("> **Run failed**"), "{md}");
    assert!(md.contains("the prompt is too long"), "{md}");
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("run failed"))
        .unwrap_or_else(|| panic!("no log line for the failed run:\n{log}"));
    assert!(
        line.contains(&id) && line.contains("the prompt is too long"),
        "{line}"
    );
    assert!(
        !line.contains("secret question"),
        "never the content: {line}"
    );
    assert!(server.terminate().success());
}
