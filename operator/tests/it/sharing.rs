//! Sharing a session (docs/chat.md#sharing) on the real binary, in key mode: read vs
//! continue, authors on messages, the shared list, revoking, and 404 for everyone else;
//! hand-over (docs/chat.md#hand-over) with a note, a summary and a notification.

use crate::support::chat::{read_sse, run_ended};
use crate::support::manifests::{docs, keyed_manifests, policy, provider};
use crate::support::net::{eventually, http_client};
use crate::support::provider::{Reply, json_reply, mock, openai, push, streamed};
use crate::support::receiver::receiver;
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};

const ALICE: &str = "kx-alice-0123456789abcdef";
const BOB: &str = "kx-bob-0123456789abcdef";
const CAROL: &str = "kx-carol-0123456789abcdef";
const DAVE: &str = "kx-dave-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_shared_to_read_or_to_continue_and_revoked() {
    let (base, script) = mock().await;
    let (dir, db) = keyed_manifests(
        &[
            ("alice", ALICE, ""),
            ("bob", BOB, ""),
            ("carol", CAROL, "sre"),
            ("dave", DAVE, ""),
        ],
        &docs(&[
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, \
                     locality: local"
                ),
            ),
            policy("all", "sessions: ['*'], provider: gpt"),
        ]),
    );
    let (_server, api) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    let client = http_client();
    // One API call as `key`: its status and JSON body.
    let call = |method: reqwest::Method, path: &str, key: &str, body: Option<Value>| {
        let mut r = client
            .request(method, format!("{api}{path}"))
            .bearer_auth(key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or_default())
        }
    };
    let ask = |key: &'static str, id: String| {
        let client = &client;
        let api = &api;
        async move {
            let r = client
                .post(format!("{api}/chat/v1/sessions/{id}/messages"))
                .bearer_auth(key)
                .header("accept", "text/event-stream")
                .json(&json!({"content": format!("question from {key}")}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    let d = openai();

    // Alice's investigation.
    let (status, s) = call(
        reqwest::Method::POST,
        "/chat/v1/sessions",
        ALICE,
        Some(json!({"name": "incident-9"})),
    )
    .await;
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().unwrap_or_default().to_owned();
    push(&script, streamed(&d, (d.text_stream)(&["Looking."])));
    let (status, events) = ask(ALICE, id.clone()).await;
    assert!(status == 202 && events.contains("completed"), "{events}");

    // Nobody else sees it yet; only its owner shares it.
    for key in [BOB, DAVE] {
        let (status, _) = call(
            reqwest::Method::GET,
            &format!("/chat/v1/sessions/{id}"),
            key,
            None,
        )
        .await;
        assert_eq!(status, 404);
    }
    let (status, _) = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/share"),
        BOB,
        Some(json!({"users": ["bob"], "access": "continue"})),
    )
    .await;
    assert_eq!(status, 404, "Bob cannot share Alice's session with himself");

    // Shared with Bob to read, with the group sre to continue.
    let (status, shared) = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/share"),
        ALICE,
        Some(json!({"users": ["bob"], "access": "read"})),
    )
    .await;
    assert_eq!(status, 200, "{shared}");
    let (status, shared) = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/share"),
        ALICE,
        Some(json!({"groups": ["sre"], "access": "continue"})),
    )
    .await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(
        shared["shares"].as_array().map(Vec::len),
        Some(2),
        "{shared}"
    );

    // Bob reads (messages with their author, events) but may not post.
    let (status, s) = call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}"),
        BOB,
        None,
    )
    .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["messages"][0]["author"], "alice", "{s}");
    let (status, _) = call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}/events?format=jsonl"),
        BOB,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, refused) = ask(BOB, id.clone()).await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused.contains("shared with you to read"), "{refused}");

    // Carol (group sre) continues the investigation; her message is hers.
    push(&script, streamed(&d, (d.text_stream)(&["Continuing."])));
    let (status, events) = ask(CAROL, id.clone()).await;
    assert!(
        status == 202 && events.contains("completed"),
        "{status} {events}"
    );
    let (_, s) = call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}"),
        ALICE,
        None,
    )
    .await;
    let authors: Vec<&str> = s["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["author"].as_str())
        .collect();
    assert_eq!(authors, ["alice", "carol"], "{s}");

    // `kortex chat --session ID` joins it from a terminal.
    push(
        &script,
        streamed(&d, (d.text_stream)(&["From the terminal."])),
    );
    let out = kortex_cli(
        &["chat", "--server", &api, "--key", CAROL, "--session", &id],
        "anything new?\n/quit\n",
    )
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("joining alice's session (continue access)"),
        "{stderr}"
    );
    assert!(stdout.contains("From the terminal."), "{stdout}");

    // Each sees it in their shared list, with what they may do; Alice's own list is hers.
    let (_, carol_list) = call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        CAROL,
        None,
    )
    .await;
    assert_eq!(carol_list["items"][0]["access"], "continue", "{carol_list}");
    let (_, bob_list) = call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        BOB,
        None,
    )
    .await;
    assert_eq!(bob_list["items"][0]["access"], "read", "{bob_list}");
    let (_, dave_list) = call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        DAVE,
        None,
    )
    .await;
    assert_eq!(dave_list["items"], json!([]));

    // Revoked: back to 404 for both.
    let (status, _) = call(
        reqwest::Method::DELETE,
        &format!("/chat/v1/sessions/{id}/share"),
        ALICE,
        None,
    )
    .await;
    assert_eq!(status, 204);
    for key in [BOB, CAROL] {
        let (status, _) = call(
            reqwest::Method::GET,
            &format!("/chat/v1/sessions/{id}"),
            key,
            None,
        )
        .await;
        assert_eq!(status, 404);
    }
}

const ADMIN: &str = "kx-admin-0123456789abcdef";

/// What the `summarize` model writes for a hand-over.
const SUMMARY: &str =
    "Problem: checkout is OOMKilled since 1.4.2. Next steps: approve the restart.";

/// The scripted provider of the hand-over test: the hand-over summary, titles and
/// follow-ups (non-streamed), and chat runs — a dynamic tool call when asked to open
/// the dashboard, an answer otherwise.
fn handover_responder(body: &Value) -> Option<Reply> {
    let d = openai();
    let messages = body["messages"].as_array()?;
    let system = messages.first()?["content"].as_str().unwrap_or_default();
    if system.contains("hand-over summary") {
        return Some(json_reply(200, &(d.text_json)(SUMMARY)));
    }
    if body["stream"] != true {
        return Some(json_reply(200, &(d.text_json)("Checkout pods OOMKilled")));
    }
    let last = messages.last()?;
    if last["role"] == "user"
        && last["content"]
            .as_str()
            .is_some_and(|c| c.contains("dashboard"))
    {
        return Some(streamed(
            &d,
            (d.tools_stream)(&[(
                "call_1",
                "open_url",
                r#"{"url": "https://grafana/d/checkout"}"#,
            )]),
        ));
    }
    Some(streamed(
        &d,
        (d.text_stream)(&["The checkout pods are OOMKilled."]),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_handed_over_with_a_note_a_summary_and_a_notification() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(handover_responder));
    let hook = receiver(0).await;
    let yaml = docs(&[
        provider(
            "gpt",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, locality: local"
            ),
        ),
        policy(
            "incidents",
            &format!(
                "sessions: [incident-*], provider: gpt, models: {{summarize: gpt/m1}}, \
                 notify: [{{name: oncall, events: [session.handover], \
                 webhook: {{url: '{hook}'}}}}]",
                hook = hook.url
            ),
        ),
        policy("plain", "sessions: [chat-*], provider: gpt"),
    ]);
    let (dir, db) = keyed_manifests(
        &[
            ("alice", ALICE, ""),
            ("bob", BOB, ""),
            ("carol", CAROL, ""),
            ("root", ADMIN, "kortex-admins"),
        ],
        &yaml,
    );
    let (_server, api) = Server::start_keyed(
        &dir.path().join("m"),
        &db,
        &[("KORTEX_PUBLIC_URL", "https://kortex.example.com")],
    );
    let client = http_client();
    let send = |method: reqwest::Method, path: String, key: &'static str, body: Option<Value>| {
        let mut r = client
            .request(method, format!("{api}{path}"))
            .bearer_auth(key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
            )
        }
    };
    let post = |path: String, key: &'static str, body: Value| {
        send(reqwest::Method::POST, path, key, Some(body))
    };
    let ask = |id: &str, key: &'static str, content: &str| {
        let r = client
            .post(format!("{api}/chat/v1/sessions/{id}/messages"))
            .bearer_auth(key)
            .header("accept", "text/event-stream")
            .json(&json!({"content": content}));
        async move {
            let r = r.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 202);
            read_sse(r, run_ended).await
        }
    };

    // Alice investigates at 3 a.m.
    let open_url = json!({"name": "open_url", "description": "Open a URL in the user's browser",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}});
    let (status, s) = post(
        "/chat/v1/sessions".into(),
        ALICE,
        json!({"name": "incident-7", "dynamicTools": [open_url]}),
    )
    .await;
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().unwrap_or_default().to_owned();
    let events = ask(&id, ALICE, "why is checkout failing?").await;
    assert_eq!(
        events.last().map(|e| e.data["state"].clone()),
        Some(json!("completed")),
        "{events:?}"
    );

    // Only who may continue the session hands it over; the request is checked.
    let handover = format!("/chat/v1/sessions/{id}/handover");
    let (status, _) = post(
        handover.clone(),
        CAROL,
        json!({"to": "carol", "note": "mine now"}),
    )
    .await;
    assert_eq!(status, 404, "a stranger learns nothing of the session");
    for (body, why) in [
        (json!({"to": "alice", "note": "x"}), "not to oneself"),
        (json!({"to": "bob", "note": "  "}), "a note is required"),
        (json!({"to": "", "note": "x"}), "a recipient is required"),
        (
            json!({"to": "bob", "note": "x", "extra": 1}),
            "unknown fields",
        ),
    ] {
        let (status, e) = post(handover.clone(), ALICE, body).await;
        assert_eq!(status, 400, "{why}: {e}");
    }

    // Alice hands over to Bob: he may continue; the summarize model summarized.
    let note = "Restart proposed for checkout; watch the heap after it.";
    let (status, h) = post(handover.clone(), ALICE, json!({"to": "bob", "note": note})).await;
    assert_eq!(status, 201, "{h}");
    assert_eq!(h["handover"]["from"], "alice", "{h}");
    assert_eq!(h["handover"]["to"], "bob", "{h}");
    assert_eq!(h["handover"]["note"], note, "{h}");
    assert_eq!(h["handover"]["summary"], SUMMARY, "{h}");
    assert!(
        h["shares"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["principal"] == "bob" && s["access"] == "continue"),
        "{h}"
    );
    let summarized = script
        .seen
        .lock()
        .map(|s| {
            s.iter()
                .filter(|x| {
                    x.body["messages"][0]["content"]
                        .as_str()
                        .is_some_and(|c| c.contains("hand-over summary"))
                })
                .map(|x| x.body["messages"][1]["content"].clone())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert!(
        summarized.len() == 1
            && summarized[0]
                .as_str()
                .is_some_and(|c| c.contains("OOMKilled") && c.contains(note)),
        "the summary is written from the conversation and the note: {summarized:?}"
    );

    // The on-call channel hears of it, with the link to the session.
    eventually("the hand-over notification", || async {
        match hook.got().len() {
            1 => Ok(()),
            n => Err(format!("{n} deliveries")),
        }
    })
    .await;
    let (headers, envelope) = hook.got().remove(0);
    assert_eq!(
        headers.get("x-kortex-event").and_then(|v| v.to_str().ok()),
        Some("session.handover")
    );
    let data = &envelope["data"];
    assert_eq!(
        (
            &data["from"],
            &data["to"],
            &data["note"],
            &data["summary"],
            &data["sessionId"]
        ),
        (
            &json!("alice"),
            &json!("bob"),
            &json!(note),
            &json!(SUMMARY),
            &json!(id)
        ),
        "{envelope}"
    );

    // Bob finds it in his shared list and reads the note where the session is.
    let (_, list) = send(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true".into(),
        BOB,
        None,
    )
    .await;
    assert_eq!(list["items"][0]["id"], json!(id), "{list}");
    let (status, s) = send(
        reqwest::Method::GET,
        format!("/chat/v1/sessions/{id}"),
        BOB,
        None,
    )
    .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["handovers"][0]["summary"], SUMMARY, "{s}");
    let (_, export) = send(
        reqwest::Method::GET,
        format!("/chat/v1/sessions/{id}/events?format=jsonl"),
        BOB,
        None,
    )
    .await;
    let export = export.as_str().unwrap_or_default().to_owned();
    assert!(
        export
            .lines()
            .any(|l| l.contains("\"event\":\"handover\"") && l.contains(note)),
        "{export}"
    );

    // Bob continues; the run waits for his browser to open the dashboard, and the run he
    // resumes still acts for him, not for the session's owner.
    let events = ask(&id, BOB, "open the checkout dashboard").await;
    let run = events
        .last()
        .filter(|e| e.data["state"] == "requires_action")
        .map(|e| e.data["runId"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("the run waits for the client tool: {events:?}"));
    let (status, r) = post(
        format!("/chat/v1/sessions/{id}/tool-results"),
        BOB,
        json!({"results": [{"toolCallId": "call_1", "content": "opened"}]}),
    )
    .await;
    assert_eq!(status, 202, "{r}");
    eventually("the resumed run ends", || async {
        let (_, s) = send(
            reqwest::Method::GET,
            format!("/chat/v1/sessions/{id}"),
            BOB,
            None,
        )
        .await;
        if s["status"] == "idle" {
            Ok(())
        } else {
            Err(format!("{}", s["status"]))
        }
    })
    .await;
    let (status, audit) = send(
        reqwest::Method::GET,
        format!("/api/v1/audit?session={id}&kind=llm_call"),
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, 200, "{audit}");
    let calls: Vec<&Value> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["runId"] == json!(run))
        .collect();
    assert!(
        calls.len() >= 2,
        "the run's first step and the resumed one: {audit}"
    );
    assert!(
        calls.iter().all(|c| c["user"] == "bob"),
        "every call of Bob's run is his: {calls:?}"
    );
    let summary_call = audit["items"].as_array().into_iter().flatten().find(|c| {
        c["detail"]["role"] == "summarize" && c["runId"].is_null() && c["user"] == "alice"
    });
    assert!(
        summary_call.is_some(),
        "the summary is billed to who handed over: {audit}"
    );

    // Bob may hand it on (he may continue it); a policy without a summarize model hands
    // over with the note alone.
    let (status, h) = post(
        handover.clone(),
        BOB,
        json!({"to": "carol", "note": "day shift: yours"}),
    )
    .await;
    assert_eq!(status, 201, "{h}");
    let (status, s) = post("/chat/v1/sessions".into(), ALICE, json!({"name": "chat-1"})).await;
    assert_eq!(status, 201, "{s}");
    let plain = s["id"].as_str().unwrap_or_default().to_owned();
    let (status, h) = post(
        format!("/chat/v1/sessions/{plain}/handover"),
        ALICE,
        json!({"to": "bob", "note": "nothing found yet"}),
    )
    .await;
    assert_eq!(status, 201, "{h}");
    assert_eq!(h["handover"]["summary"], Value::Null, "{h}");
    assert_eq!(h["handover"]["note"], "nothing found yet", "{h}");
}
