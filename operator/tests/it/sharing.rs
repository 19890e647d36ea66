//! Sharing a session (docs/chat.md#sharing) on the real binary, in key mode: read vs
//! continue, authors on messages, the shared list, revoking, and 404 for everyone else.

use crate::binary::Server;
use crate::common::http_client;
use crate::llm::{mock, openai, push, streamed};
use serde_json::{Value, json};

const ALICE: &str = "kx-alice-0123456789abcdef";
const BOB: &str = "kx-bob-0123456789abcdef";
const CAROL: &str = "kx-carol-0123456789abcdef";
const DAVE: &str = "kx-dave-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_shared_to_read_or_to_continue_and_revoked() {
    let (base, script) = mock().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap_or_else(|e| panic!("{e}"));
    let mut yaml = String::new();
    for (user, key, groups) in [
        ("alice", ALICE, ""),
        ("bob", BOB, ""),
        ("carol", CAROL, "sre"),
        ("dave", DAVE, ""),
    ] {
        yaml.push_str(&crate::common::chat_key_secret(user, key, groups));
    }
    yaml.push_str(&format!(
        "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: gpt}}\nspec: {{type: openai-compatible, baseUrl: \"{base}/v1\", defaultModel: m1, locality: local}}\n---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: all}}\nspec: {{sessions: [\"*\"], provider: gpt}}\n"
    ));
    std::fs::write(m.join("all.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"));
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    let (_server, api) = Server::start_keyed(&m, &db, &[]);
    let client = http_client();
    let call = |method: reqwest::Method, path: &str, key: &str| {
        client
            .request(method, format!("{api}{path}"))
            .bearer_auth(key)
    };
    let send = |r: reqwest::RequestBuilder| async move {
        let r = r.send().await.unwrap_or_else(|e| panic!("{e}"));
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or_default())
    };
    let ask = |key: &'static str, id: String| {
        let call = &call;
        async move {
            let r = call(
                reqwest::Method::POST,
                &format!("/chat/v1/sessions/{id}/messages"),
                key,
            )
            .header("accept", "text/event-stream")
            .json(&json!({"content": format!("question from {key}")}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    let d = openai();

    // Alice's investigation.
    let (status, s) = send(
        call(reqwest::Method::POST, "/chat/v1/sessions", ALICE)
            .json(&json!({"name": "incident-9"})),
    )
    .await;
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().unwrap_or_default().to_owned();
    push(&script, streamed(&d, (d.text_stream)(&["Looking."])));
    let (status, events) = ask(ALICE, id.clone()).await;
    assert!(status == 202 && events.contains("completed"), "{events}");

    // Nobody else sees it yet; only its owner shares it.
    for key in [BOB, DAVE] {
        let (status, _) = send(call(
            reqwest::Method::GET,
            &format!("/chat/v1/sessions/{id}"),
            key,
        ))
        .await;
        assert_eq!(status, 404);
    }
    let (status, _) = send(
        call(
            reqwest::Method::POST,
            &format!("/chat/v1/sessions/{id}/share"),
            BOB,
        )
        .json(&json!({"users": ["bob"], "access": "continue"})),
    )
    .await;
    assert_eq!(status, 404, "Bob cannot share Alice's session with himself");

    // Shared with Bob to read, with the group sre to continue.
    let (status, shared) = send(
        call(
            reqwest::Method::POST,
            &format!("/chat/v1/sessions/{id}/share"),
            ALICE,
        )
        .json(&json!({"users": ["bob"], "access": "read"})),
    )
    .await;
    assert_eq!(status, 200, "{shared}");
    let (status, shared) = send(
        call(
            reqwest::Method::POST,
            &format!("/chat/v1/sessions/{id}/share"),
            ALICE,
        )
        .json(&json!({"groups": ["sre"], "access": "continue"})),
    )
    .await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(
        shared["shares"].as_array().map(Vec::len),
        Some(2),
        "{shared}"
    );

    // Bob reads (messages with their author, events) but may not post.
    let (status, s) = send(call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}"),
        BOB,
    ))
    .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["messages"][0]["author"], "alice", "{s}");
    let (status, _) = send(call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}/events?format=jsonl"),
        BOB,
    ))
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
    let (_, s) = send(call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{id}"),
        ALICE,
    ))
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
    let (url, session) = (api.clone(), id.clone());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args([
                "chat",
                "--server",
                &url,
                "--key",
                CAROL,
                "--session",
                &session,
            ])
            .env_remove("KORTEX_API_KEY")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"anything new?\n/quit\n");
        }
        child.wait_with_output().unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
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
    let (_, carol_list) = send(call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        CAROL,
    ))
    .await;
    assert_eq!(carol_list["items"][0]["access"], "continue", "{carol_list}");
    let (_, bob_list) = send(call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        BOB,
    ))
    .await;
    assert_eq!(bob_list["items"][0]["access"], "read", "{bob_list}");
    let (_, dave_list) = send(call(
        reqwest::Method::GET,
        "/chat/v1/sessions?shared=true",
        DAVE,
    ))
    .await;
    assert_eq!(dave_list["items"], json!([]));

    // Revoked: back to 404 for both.
    let r = call(
        reqwest::Method::DELETE,
        &format!("/chat/v1/sessions/{id}/share"),
        ALICE,
    )
    .send()
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 204);
    for key in [BOB, CAROL] {
        let (status, _) = send(call(
            reqwest::Method::GET,
            &format!("/chat/v1/sessions/{id}"),
            key,
        ))
        .await;
        assert_eq!(status, 404);
    }
}
