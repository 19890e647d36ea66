//! The chat API end to end: the real binary, a wire-format provider server, SQLite and
//! PostgreSQL.

use crate::support::chat::{
    Sse, ask, create_session, get_json, post_json, post_message, read_sse, run_ended, session_json,
};
use crate::support::db::postgres;
use crate::support::manifests::{docs, manifest_dir, policy, provider, secret};
use crate::support::net::http_client;
use crate::support::provider::{Reply, Script, json_reply, mock, openai, push, streamed};
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};
use std::time::Duration;

fn manifests(dir: &std::path::Path, base: &str) {
    std::fs::write(
        dir.join("chat.yaml"),
        docs(&[
            secret("llm-keys", "openai: sk-test-9f8e7d6c5b"),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', \
                     apiKeySecretRef: {{name: llm-keys, key: openai}}, defaultModel: test-model, \
                     timeout: 5s"
                ),
            ),
            policy(
                "incidents",
                "sessions: [incident-*], provider: gpt, maxToolDepth: 3, systemPrompt: Be brief., \
                 tools: {deny: [forbidden_*]}, proposals: {allowedActions: [restart, scale], \
                 allowedNamespaces: [shop-*], requireDistinctApprover: false}",
            ),
            policy(
                "hasty",
                "sessions: [expire-*], provider: gpt, proposals: {allowedActions: [restart], \
                 allowedNamespaces: ['*'], expireAfter: 1s}",
            ),
        ]),
    )
    .unwrap();
}

async fn scenario(server: &Server, script: &std::sync::Arc<Script>) {
    let client = http_client();
    let d = openai();

    // No policy matches: 422.
    let r = create_session(server, &json!({"name": "random"})).await;
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "no_matching_policy");

    let r = create_session(server, &json!({"name": "incident-42"})).await;
    assert_eq!(r.status().as_u16(), 201);
    let session: Value = r.json().await.unwrap_or_default();
    assert_eq!(
        (session["policy"].clone(), session["status"].clone()),
        (json!("incidents"), json!("idle"))
    );
    let id = session["id"].as_str().unwrap_or_default().to_owned();

    // A message, with the run streamed back on the same response.
    push(
        script,
        streamed(
            &d,
            (d.text_stream)(&["The api ", "pods are ", "OOMKilled."]),
        ),
    );
    let events = ask(server, &id, "why is api down?").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"run.lifecycle"), "{kinds:?}");
    assert!(kinds.contains(&"step.boundary"), "{kinds:?}");
    // Who wrote the answer: the provider resource and the model it reported.
    let answered = events
        .iter()
        .find(|e| e.event == "step.answered")
        .unwrap_or_else(|| panic!("no step.answered: {kinds:?}"));
    assert_eq!(
        (
            &answered.data["provider"],
            &answered.data["model"],
            &answered.data["step"]
        ),
        (&json!("gpt"), &json!("gpt-test"), &json!(1))
    );
    let text: String = events
        .iter()
        .filter(|e| e.event == "text.delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert_eq!(text, "The api pods are OOMKilled.");
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("completed"))
    );
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "sequence numbers are consecutive: {ids:?}"
    );
    let seen = script.requests();
    // The last chat request (the provider probe's model listings have no body).
    let sent = &seen
        .iter()
        .rev()
        .find(|s| s.body.get("messages").is_some())
        .expect("no provider call")
        .body;
    assert!(
        sent["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .ends_with("Be brief."),
        "policy prompt: {sent}"
    );
    assert_eq!(
        sent["messages"][1],
        json!({"role": "user", "content": "why is api down?"})
    );

    // The transcript.
    let s: Value = session_json(server, &id).await;
    assert_eq!(s["status"], "idle");
    let roles: Vec<&str> = s["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["role"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(roles, vec!["user", "assistant"]);
    assert_eq!(s["messages"][1]["content"], "The api pods are OOMKilled.");
    assert_eq!(
        (&s["messages"][1]["provider"], &s["messages"][1]["model"]),
        (&json!("gpt"), &json!("gpt-test"))
    );
    assert_eq!(
        s["messages"][0].get("provider"),
        None,
        "a question has no model"
    );

    // The audit log has the provider call; the transcript exports.
    let audit: Value = get_json(
        &client,
        server.url(&format!("/api/v1/audit?session={id}&kind=llm_call")),
    )
    .await;
    assert_eq!(audit["items"].as_array().map(Vec::len), Some(1), "{audit}");
    assert_eq!(audit["items"][0]["subject"], "gpt/gpt-test");
    assert_eq!(audit["items"][0]["outcome"], "ok");
    let r = client
        .get(server.url("/api/v1/audit?cursor=bogus"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let md = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/export")))
        .header("accept", "text/markdown")
        .send()
        .await
        .unwrap();
    assert!(
        md.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/markdown")
    );
    let md = md.text().await.unwrap_or_default();
    assert!(
        md.starts_with("# incident-42")
            && md.contains("why is api down?")
            && md.contains("The api pods are OOMKilled."),
        "{md}"
    );
    let exported: Value = get_json(
        &client,
        server.url(&format!("/chat/v1/sessions/{id}/export")),
    )
    .await;
    assert_eq!(exported["messages"].as_array().map(Vec::len), Some(2));

    // Replay after a disconnect: Last-Event-ID resumes right after it.
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events")))
        .header("last-event-id", ids[1].to_string())
        .send()
        .await
        .unwrap();
    let total = ids.len();
    let replay = read_sse(r, |got| got.len() >= total - 2).await;
    assert_eq!(
        replay.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids[2..].to_vec()
    );
    let r = client
        .get(server.url(&format!(
            "/chat/v1/sessions/{id}/events?after={}",
            ids[total - 2]
        )))
        .send()
        .await
        .unwrap();
    let tail = read_sse(r, |got| !got.is_empty()).await;
    assert_eq!(tail.first().map(|e| e.id), Some(ids[total - 1]));

    // Busy while running, then cancel.
    push(
        script,
        Reply {
            stall: Some(Duration::from_secs(30)),
            ..streamed(&d, (d.text_stream)(&["slow"])[..2].to_vec())
        },
    );
    let r = post_message(server, &id, "again").await;
    assert_eq!(r.status().as_u16(), 202);
    let run: Value = r.json().await.unwrap_or_default();
    let calls_before = seen.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while script.seen.lock().map(|s| s.len()).unwrap_or(0) <= calls_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never called the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = post_message(server, &id, "more").await;
    assert_eq!(r.status().as_u16(), 409);
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "session_busy");
    let r = client
        .post(server.url(&format!("/chat/v1/sessions/{id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let r = client
        .get(server.url(&format!(
            "/chat/v1/sessions/{id}/events?after={}",
            ids[total - 1]
        )))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, run_ended).await;
    let last = events.last().cloned().expect("no events");
    assert_eq!(
        (last.data["runId"].clone(), last.data["state"].clone()),
        (run["runId"].clone(), json!("cancelled"))
    );

    // A provider failure fails the run with the reason, and the session takes new messages.
    push(
        script,
        json_reply(
            401,
            &json!({"error": {"message": "Incorrect API key provided"}}),
        ),
    );
    let events = ask(server, &id, "and now?").await;
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .cloned()
        .unwrap_or_else(|| panic!("no error event: {events:?}"));
    assert_eq!(error.data["code"], "provider_error");
    assert!(
        error.data["message"]
            .as_str()
            .unwrap_or_default()
            .contains("provider gpt: auth: HTTP 401"),
        "{:?}",
        error.data
    );
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("failed"))
    );
    let s: Value = session_json(server, &id).await;
    assert_eq!(s["status"], "failed");
    push(script, streamed(&d, (d.text_stream)(&["back"])));
    let r = post_message(server, &id, "retry").await;
    assert_eq!(
        r.status().as_u16(),
        202,
        "a failed session accepts new messages"
    );

    // Sessions are private; deletion hides them.
    let list: Value = get_json(&client, server.url("/chat/v1/sessions")).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client
        .delete(server.url(&format!("/chat/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

/// A session with a client-executed tool: the run pauses in `requires_action`, results are
/// validated (400 / 409, first POST wins), the run resumes; cancel works while waiting.
async fn dynamic_tools(server: &Server, script: &std::sync::Arc<Script>) {
    let client = http_client();
    let d = openai();
    let post = |path: String, body: Value| {
        let c = client.clone();
        async move { c.post(path).json(&body).send().await.unwrap() }
    };
    let open_url = json!({"name": "open_url", "description": "Open a URL in the user's browser",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}});
    let r = post(server.url("/chat/v1/sessions"), json!({"name": "incident-dyn", "dynamicTools": [{"name": "forbidden_x", "description": "", "parameters": {"type": "object"}}]})).await;
    assert_eq!(r.status().as_u16(), 422);
    assert_eq!(
        r.json::<Value>().await.unwrap_or_default()["error"]["code"],
        "tool_denied"
    );
    let r = post(server.url("/chat/v1/sessions"), json!({"name": "incident-dyn", "dynamicTools": [{"name": "get_logs", "parameters": {"type": "object"}}]})).await;
    assert_eq!(r.status().as_u16(), 400, "built-in names are taken");
    let r = post(
        server.url("/chat/v1/sessions"),
        json!({"name": "incident-dyn", "dynamicTools": [open_url]}),
    )
    .await;
    assert_eq!(r.status().as_u16(), 201);
    let session: Value = r.json().await.unwrap_or_default();
    assert_eq!(session["dynamicTools"][0]["name"], "open_url");
    let id = session["id"].as_str().unwrap_or_default().to_owned();

    push(
        script,
        streamed(
            &d,
            (d.tools_stream)(&[
                ("call_1", "open_url", r#"{"url": "https://grafana/d/api"}"#),
                ("call_2", "get_logs", "{}"),
            ]),
        ),
    );
    let events = ask(server, &id, "show me the dashboard").await;
    let last = events.last().cloned().expect("no events");
    assert_eq!(last.data["state"], "requires_action", "{events:?}");
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e.event == "tool.start")
        .filter_map(|e| e.data["name"].as_str())
        .collect();
    assert_eq!(starts, vec!["open_url", "get_logs"]);
    let ended: Vec<&Sse> = events.iter().filter(|e| e.event == "tool.end").collect();
    assert_eq!(ended.len(), 1, "only the non-dynamic call ends now");
    assert_eq!(
        (
            ended[0].data["name"].clone(),
            ended[0].data["isError"].clone()
        ),
        (json!("get_logs"), json!(true))
    );
    let s: Value = session_json(server, &id).await;
    assert_eq!(s["status"], "requires_action");
    // Chat requests only: the provider probe's model listings may come in between.
    let chats = |s: &[crate::support::provider::Seen]| -> Vec<crate::support::provider::Seen> {
        s.iter()
            .filter(|x| x.body.get("messages").is_some())
            .cloned()
            .collect()
    };
    let provider_calls = script.seen.lock().map(|s| chats(&s).len()).unwrap_or(0);
    let offered = script
        .seen
        .lock()
        .ok()
        .and_then(|s| chats(&s).last().map(|x| x.body["tools"].clone()))
        .unwrap_or_default();
    assert!(
        offered
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "open_url")),
        "dynamic tools are offered: {offered}"
    );

    let results = |pairs: &[(&str, &str)]| json!({"results": pairs.iter().map(|(id, c)| json!({"toolCallId": id, "content": c})).collect::<Vec<_>>()});
    let r = post(
        server.url(&format!("/chat/v1/sessions/{id}/tool-results")),
        results(&[]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 400);
    let r = post(
        server.url(&format!("/chat/v1/sessions/{id}/tool-results")),
        results(&[("call_1", "ok"), ("call_9", "?")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.json::<Value>().await.unwrap_or_default()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("call_9")
    );
    push(
        script,
        streamed(&d, (d.text_stream)(&["Opened ", "the dashboard."])),
    );
    let after = events.last().map(|e| e.id).unwrap_or(0);
    let r = post(
        server.url(&format!("/chat/v1/sessions/{id}/tool-results")),
        results(&[("call_1", "opened in tab 3 as sk-test-9f8e7d6c5b")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 202);
    let r = post(
        server.url(&format!("/chat/v1/sessions/{id}/tool-results")),
        results(&[("call_1", "again")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 409, "first POST wins");
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events?after={after}")))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, run_ended).await;
    let text: String = events
        .iter()
        .filter(|e| e.event == "text.delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert_eq!(text, "Opened the dashboard.");
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("completed"))
    );
    let seen = chats(&script.seen.lock().unwrap_or_else(|e| e.into_inner()));
    assert_eq!(seen.len(), provider_calls + 1);
    let sent = seen[provider_calls].body["messages"].to_string();
    assert!(
        sent.contains("opened in tab 3") && sent.contains("call_1"),
        "the result goes back to the model: {sent}"
    );
    // A resolved Secret value in a client's result is replaced before the model sees it.
    assert!(
        !sent.contains("sk-test-9f8e7d6c5b") && sent.contains("[REDACTED:secret]"),
        "{sent}"
    );

    // Cancel while waiting: the pending call gets an error result, the session is idle.
    push(
        script,
        streamed(
            &d,
            (d.tools_stream)(&[("call_5", "open_url", r#"{"url": "https://x"}"#)]),
        ),
    );
    let events = ask(server, &id, "open it again").await;
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("requires_action"))
    );
    let r = post(
        server.url(&format!("/chat/v1/sessions/{id}/cancel")),
        json!(null),
    )
    .await;
    assert_eq!(r.status().as_u16(), 202);
    let s: Value = session_json(server, &id).await;
    assert_eq!(s["status"], "idle");
    let last = s["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or_default();
    assert_eq!(
        (last["toolCallId"].clone(), last["isError"].clone()),
        (json!("call_5"), json!(true))
    );
}

/// `propose_action`: validated against the policy, stored, announced; decided once through
/// the API; undecided proposals expire.
async fn proposals(server: &Server, script: &std::sync::Arc<Script>) {
    let client = http_client();
    let d = openai();
    let session = |name: &'static str| {
        let c = client.clone();
        let url = server.url("/chat/v1/sessions");
        async move {
            let v: Value = c
                .post(url)
                .json(&json!({"name": name}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap_or_default();
            v["id"].as_str().unwrap_or_default().to_owned()
        }
    };
    let id = session("incident-prop").await;
    let target = r#""target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "NS", "name": "api"}"#;
    let call = |ns: &str| {
        format!(
            r#"{{"action": "restart", {}, "rationale": "pods stuck since the config change", "reversible": true}}"#,
            target.replace("NS", ns)
        )
    };
    let bad = call("kube-system");
    let good = call("shop-prod");
    push(
        script,
        streamed(&d, (d.tools_stream)(&[("p1", "propose_action", &bad)])),
    );
    push(
        script,
        streamed(&d, (d.tools_stream)(&[("p2", "propose_action", &good)])),
    );
    push(
        script,
        streamed(&d, (d.text_stream)(&["I proposed a restart."])),
    );
    let events = ask(server, &id, "fix the api").await;
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("completed")),
        "{events:?}"
    );
    let ends: Vec<&Sse> = events.iter().filter(|e| e.event == "tool.end").collect();
    assert_eq!(ends.len(), 2);
    assert_eq!(
        (
            ends[0].data["isError"].clone(),
            ends[0].data["errorKind"].clone()
        ),
        (json!(true), json!("validation"))
    );
    assert!(
        ends[0].data["preview"]
            .as_str()
            .unwrap_or_default()
            .contains("allowedNamespaces"),
        "{:?}",
        ends[0].data
    );
    assert_eq!(ends[1].data["isError"], false);
    let created = events
        .iter()
        .find(|e| e.event == "proposal.created")
        .cloned()
        .unwrap_or_else(|| panic!("no proposal.created: {events:?}"));
    assert_eq!(created.data["action"], "restart");
    let proposal_id = created.data["proposalId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let offered = script
        .seen
        .lock()
        .ok()
        .and_then(|s| s.iter().rev().nth(2).map(|x| x.body["tools"].to_string()))
        .unwrap_or_default();
    assert!(
        offered.contains("propose_action") && offered.contains("\"restart\""),
        "{offered}"
    );

    let list: Value = get_json(&client, server.url("/chat/v1/proposals?phase=Pending")).await;
    let item = list["items"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == proposal_id.as_str()).cloned())
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(
        (
            item["namespace"].clone(),
            item["spec"]["target"]["name"].clone()
        ),
        (json!("shop-prod"), json!("api"))
    );
    assert!(
        item["name"]
            .as_str()
            .unwrap_or_default()
            .starts_with("restart-api-")
    );

    let last_seq = events.last().map(|e| e.id).unwrap_or(0);
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{proposal_id}/approve")))
        .json(&json!({"reason": "go ahead"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let decided: Value = r.json().await.unwrap_or_default();
    assert_eq!(decided["status"]["phase"], "Approved");
    assert_eq!(
        decided["spec"]["decision"],
        json!({"verdict": "Approve", "by": "local", "reason": "go ahead"})
    );
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{proposal_id}/reject")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409, "a decision is final");
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events?after={last_seq}")))
        .send()
        .await
        .unwrap();
    let updates = read_sse(r, |got| got.iter().any(|e| e.event == "proposal.updated")).await;
    assert_eq!(
        updates.last().map(|e| e.data["phase"].clone()),
        Some(json!("Approved"))
    );
    let audit: Value = get_json(&client, server.url("/api/v1/audit?kind=decision")).await;
    assert_eq!(audit["items"][0]["user"], "local");

    // A policy with a 1 s expiry: undecided, the proposal expires and says so.
    let id = session("expire-1").await;
    push(
        script,
        streamed(
            &d,
            (d.tools_stream)(&[("p3", "propose_action", &call("shop"))]),
        ),
    );
    push(
        script,
        streamed(&d, (d.text_stream)(&["Waiting for approval."])),
    );
    let events = ask(server, &id, "restart it").await;
    let pid = events
        .iter()
        .find(|e| e.event == "proposal.created")
        .map(|e| e.data["proposalId"].clone())
        .unwrap_or_else(|| panic!("{events:?}"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = client
        .post(server.url(&format!(
            "/chat/v1/proposals/{}/approve",
            pid.as_str().unwrap_or_default()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        409,
        "expired proposals cannot be approved"
    );
    let list: Value = get_json(&client, server.url("/chat/v1/proposals?phase=Expired")).await;
    assert!(
        list["items"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p["id"] == pid)),
        "{list}"
    );
}

/// A model that never stops calling tools is stopped at `maxToolDepth` (3 here), with a
/// notice and a message that say so; a read of a kept result works inside a run.
async fn depth_limit(server: &Server, script: &std::sync::Arc<Script>) {
    let client = http_client();
    let d = openai();
    let session: Value = post_json(
        &client,
        server.url("/chat/v1/sessions"),
        &json!({"name": "incident-loop"}),
    )
    .await;
    let id = session["id"].as_str().unwrap_or_default().to_owned();
    for i in 0..3 {
        let call_id = format!("loop_{i}");
        push(
            script,
            streamed(
                &d,
                (d.tools_stream)(&[(
                    call_id.as_str(),
                    "read_result_chunk",
                    r#"{"resultId": "nope", "chunk": 0}"#,
                )]),
            ),
        );
    }
    let events = ask(server, &id, "dig").await;
    assert_eq!(
        events.iter().filter(|e| e.event == "step.boundary").count(),
        3,
        "{events:?}"
    );
    let ends: Vec<&Sse> = events.iter().filter(|e| e.event == "tool.end").collect();
    assert_eq!(ends.len(), 3);
    assert_eq!(
        ends[0].data["errorKind"], "validation",
        "{:?}",
        ends[0].data
    );
    let notice = events
        .iter()
        .find(|e| e.event == "notice")
        .map(|e| e.data["message"].clone())
        .unwrap_or_default();
    assert!(
        notice.as_str().unwrap_or_default().contains("maxToolDepth"),
        "{notice}"
    );
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("completed"))
    );
    let s: Value = session_json(server, &id).await;
    let last = s["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or_default();
    assert_eq!(last["role"], "assistant");
    assert!(
        last["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Stopped after 3"),
        "never a silently cut answer: {last}"
    );
    let offered = script
        .seen
        .lock()
        .ok()
        .and_then(|s| s.last().map(|x| x.body["tools"].to_string()))
        .unwrap_or_default();
    assert!(
        offered.contains("read_result_chunk"),
        "router tools are offered to the model: {offered}"
    );
}

/// `kortex chat` and `kortex proposals` against the server.
async fn terminal_clients(server: &Server, script: &std::sync::Arc<Script>) {
    let d = openai();
    push(
        script,
        streamed(
            &d,
            (d.tools_stream)(&[("t1", "get_logs", r#"{"namespace": "shop"}"#)]),
        ),
    );
    push(
        script,
        streamed(&d, (d.text_stream)(&["Logs are ", "unavailable here."])),
    );
    let url = server.url("");
    let out = kortex_cli(
        &["chat", "--server", &url, "--session", "incident-cli"],
        "what do the logs say?\n/quit\n",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("⚙ get_logs {\"namespace\":\"shop\"}"),
        "{stdout}"
    );
    assert!(stdout.contains("✗ get_logs"), "{stdout}");
    assert!(stdout.contains("Logs are unavailable here."), "{stdout}");

    let url = server.url("");
    let out = kortex_cli(
        &["proposals", "list", "--server", &url, "--phase", "Approved"],
        "",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Approved") && stdout.contains("restart"),
        "{stdout}"
    );
}

/// Every scenario in turn against one server, which then must stop cleanly.
async fn all_scenarios(server: Server, script: &std::sync::Arc<Script>) {
    scenario(&server, script).await;
    dynamic_tools(&server, script).await;
    proposals(&server, script).await;
    terminal_clients(&server, script).await;
    depth_limit(&server, script).await;
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_session_streams_replays_cancels_and_fails_cleanly_on_sqlite() {
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    all_scenarios(server, &script).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_session_streams_replays_cancels_and_fails_cleanly_on_postgres() {
    let Some(db) = postgres().await else { return };
    let (base, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &base);
    let server = Server::start_with_url(dir.path(), &db.url, &[]);
    all_scenarios(server, &script).await;
}

/// Two replicas on one PostgreSQL database: a run started on A is followed and cancelled
/// through B; the partial answer is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_follows_and_cancels_a_run_on_postgres() {
    let Some(db) = postgres().await else { return };
    let (base, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &base);
    let a = Server::start_with_url(dir.path(), &db.url, &[]);
    let b = Server::start_with_url(dir.path(), &db.url, &[]);
    let client = http_client();
    let d = openai();
    let session: Value = post_json(
        &client,
        a.url("/chat/v1/sessions"),
        &json!({"name": "incident-xr"}),
    )
    .await;
    let id = session["id"].as_str().unwrap_or_default().to_owned();
    let mut chunks = (d.text_stream)(&["Partial answer"]);
    chunks.truncate(2);
    push(
        &script,
        Reply {
            stall: Some(Duration::from_secs(30)),
            ..streamed(&d, chunks)
        },
    );
    let r = post_message(&a, &id, "go").await;
    assert_eq!(r.status().as_u16(), 202);
    // B follows the stream A writes.
    let follow = client
        .get(b.url(&format!("/chat/v1/sessions/{id}/events")))
        .send()
        .await
        .unwrap();
    let started = read_sse(follow, |got| got.iter().any(|e| e.event == "text.delta")).await;
    assert!(
        started.iter().any(|e| e.event == "text.delta"),
        "{started:?}"
    );
    // B cancels A's run.
    let r = client
        .post(b.url(&format!("/chat/v1/sessions/{id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let after = started.last().map(|e| e.id).unwrap_or(0);
    let r = client
        .get(b.url(&format!("/chat/v1/sessions/{id}/events?after={after}")))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, run_ended).await;
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("cancelled")),
        "{events:?}"
    );
    let s: Value = session_json(&b, &id).await;
    assert_eq!(s["status"], "idle");
    assert_eq!(
        s["messages"][1]["content"], "Partial answer",
        "the partial answer is kept: {s}"
    );
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}
