//! Secret canaries: distinct values planted in every place a credential lives — a provider
//! key, an HTTP and an MCP KortexTool's bearer tokens, a Kubernetes Secret a tool reads, a
//! chat key, a gateway key and (cluster mode) an authenticating proxy's shared secret —
//! then chats with tool calls, gateway calls and every read endpoint, and a scan of every
//! log line, API response, SSE event, provider and tool request body, MCP result, database
//! byte (the SQLite file and its WAL) and, in cluster mode, every request Kortex made to the
//! API server (status fields, Events, reviews) and every object's status, for each value,
//! raw, base64 and URL-encoded: zero hits.

use crate::support::canned_api::fake_api_server;
use crate::support::chat::{ask, read_sse, run_ended, session, session_json, state};
use crate::support::fake_api::{FakeApi, secret, write_kubeconfig};
use crate::support::manifests::{self, chat_key, docs, gateway_key, manifest_dir};
use crate::support::net::{eventually, header, http_client};
use crate::support::plugins::{mcp_server, upstream};
use crate::support::provider::{Script, json_reply, mock, openai, push, streamed, tool_calls};
use crate::support::server::{Server, start_behind_proxy};
use serde_json::json;

/// The planted values (`/` and `+` so that URL-encoding and base64 forms differ).
const PROVIDER_KEY: &str = "sk-canary/Prov+Q9x7Lm2Pz";
const TOOL_TOKEN: &str = "tok-canary/Tool+Hh5Vb3Nc";
const CHAT_KEY: &str = "kc-canary/Chat+Tt4Gg6Yy";
const GATEWAY_KEY: &str = "kgw-canary/Gw+Pp2Ll9Qq";
const MCP_TOKEN: &str = "mcp-canary/Mcp+Rr8Kk1Ww";
const PROXY_SECRET: &str = "px-canary/Proxy+Zz3Jj7Ee";
/// The value of the Secret `shop/db` in the fake API server (`cluster.rs`).
const CLUSTER_SECRET: &str = "hunter2-plain";

fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every form of every canary, with what it is.
fn forms() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (what, value) in [
        ("provider key", PROVIDER_KEY),
        ("tool token", TOOL_TOKEN),
        ("chat key", CHAT_KEY),
        ("gateway key", GATEWAY_KEY),
        ("MCP token", MCP_TOKEN),
        ("proxy secret", PROXY_SECRET),
        ("cluster Secret", CLUSTER_SECRET),
    ] {
        out.push((format!("{what} (raw)"), value.to_owned()));
        out.push((
            format!("{what} (base64)"),
            kortex::redact::base64(value)
                .trim_end_matches('=')
                .to_owned(),
        ));
        out.push((format!("{what} (URL-encoded)"), url_encoded(value)));
    }
    out
}

/// What the scripted provider was sent: `(path, Authorization header, body)`.
fn provider_requests(script: &Script) -> Vec<(String, String, String)> {
    script
        .seen
        .lock()
        .map(|s| {
            s.iter()
                .map(|x| {
                    let auth = header(&x.headers, "authorization");
                    (x.path.clone(), auth, x.body.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn scan(place: &str, text: &[u8], hits: &mut Vec<String>) {
    let text = String::from_utf8_lossy(text);
    for (what, form) in forms() {
        if text.contains(&form) {
            hits.push(format!("{what} in {place}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_planted_secret_appears_anywhere() {
    let (api, _) = fake_api_server().await;
    let (bridge, bridge_seen) = upstream().await;
    let (base, script) = mock().await;
    // The real MCP server (Python SDK), when installed (required in CI).
    let mcp = mcp_server(MCP_TOKEN);
    let mcp_tool = mcp.as_ref().map_or_else(String::new, |m| {
        format!(
            r#"---
apiVersion: kortex.dev/v1alpha1
kind: KortexTool
metadata: {{name: grafana}}
spec:
  mcp:
    url: {}
    auth: {{type: bearer, secretRef: {{name: keys, key: mcp}}}}
    include: [echo]
"#,
            m.url
        )
    });
    let (dir, m) = manifest_dir();
    let kubeconfig = write_kubeconfig(dir.path(), &api);
    let keys = docs(&[
        manifests::secret(
            "keys",
            &format!(r#"provider: "{PROVIDER_KEY}", tool: "{TOOL_TOKEN}", mcp: "{MCP_TOKEN}""#),
        ),
        chat_key("chat-alice", &format!(r#"user: alice, key: "{CHAT_KEY}""#)),
        gateway_key(
            "gateway-team",
            "shop",
            "incidents",
            &format!(r#""{GATEWAY_KEY}""#),
        ),
    ]);
    std::fs::write(
        m.join("all.yaml"),
        format!(
            r#"{keys}---
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: model}}
spec:
  type: openai-compatible
  baseUrl: "{base}/v1"
  apiKeySecretRef: {{name: keys, key: provider}}
  defaultModel: m1
  models: [{{id: m1, cost: {{inputUsdPerMTok: 1, outputUsdPerMTok: 2}}}}]
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: incidents}}
spec: {{sessions: ["*"], provider: model, runToolsAsUser: false, maxToolDepth: 4}}
---
apiVersion: kortex.dev/v1alpha1
kind: KortexTool
metadata: {{name: bridge}}
spec:
  name: ticket_search
  description: Search tickets.
  http:
    method: POST
    url: {bridge}/tickets
    auth: {{type: bearer, secretRef: {{name: keys, key: tool}}}}
  parameters: {{type: object, properties: {{q: {{type: string}}}}, required: [q]}}
{mcp_tool}"#
        ),
    )
    .unwrap();
    let server = Server::start_on_cluster(&m, dir.path(), &kubeconfig);
    let client = http_client();
    let mut responses: Vec<(String, Vec<u8>)> = Vec::new();
    let mut calls = vec![
        (
            "c1",
            "get_resource",
            json!({"kind": "Secret", "namespace": "shop", "name": "db"}),
        ),
        ("c2", "ticket_search", json!({"q": "checkout"})),
    ];
    if mcp.is_some() {
        eventually("the MCP tool discovered", || async {
            let (_, tools) = server.get("/api/v1/tools").await;
            if tools.contains("grafana__echo") {
                Ok(())
            } else {
                Err(tools)
            }
        })
        .await;
        calls.push(("c3", "grafana__echo", json!({"text": "mcp result here"})));
    }

    // A chat whose model reads the Secret, calls the HTTP and MCP tools, and answers.
    push(&script, tool_calls(&calls));
    let d = openai();
    push(
        &script,
        streamed(
            &d,
            (d.text_stream)(&["The database password is stored in shop/db."]),
        ),
    );
    let id = session(&server, "incident-1").await;
    let events = ask(&server, &id, "where is the db password?").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    assert!(
        bridge_seen.lock().map(|s| s.len()).unwrap_or_default() >= 1,
        "the HTTP tool was called"
    );
    for e in &events {
        responses.push((format!("SSE {}", e.event), e.data.to_string().into_bytes()));
    }
    if mcp.is_some() {
        let transcript = session_json(&server, &id).await;
        let result = transcript["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["toolCallId"] == "c3"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            result["content"], "mcp result here",
            "the MCP tool answered: {transcript}"
        );
        responses.push(("the MCP result".into(), result.to_string().into_bytes()));
    }

    // The gateway, whole and streamed.
    for stream in [false, true] {
        push(
            &script,
            if stream {
                streamed(&d, (d.text_stream)(&["hi"]))
            } else {
                // A client that asks for no stream gets a whole upstream answer.
                json_reply(200, &(d.text_json)("hi"))
            },
        );
        let r = client
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(GATEWAY_KEY)
            .json(&json!({"model": "m1", "stream": stream,
                "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "gateway (stream {stream})");
        let body = r.bytes().await.unwrap_or_default();
        responses.push((format!("gateway (stream {stream})"), body.to_vec()));
    }

    // Every read endpoint.
    for path in [
        "/api/v1/llm/providers",
        "/api/v1/tools",
        "/api/v1/policies",
        "/api/v1/manifests",
        "/chat/v1/sessions",
        &format!("/chat/v1/sessions/{id}"),
        &format!("/chat/v1/sessions/{id}/export"),
        &format!("/chat/v1/sessions/{id}/export?format=markdown"),
        "/chat/v1/proposals",
        "/api/v1/audit",
        "/api/v1/usage",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        let (code, body) = server.get(path).await;
        assert_eq!(code, 200, "GET {path}: {body}");
        responses.push((format!("GET {path}"), body.into_bytes()));
    }
    let r = client
        .get(server.url("/v1/models"))
        .bearer_auth(GATEWAY_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "GET /v1/models");
    let models = r.bytes().await.unwrap_or_default();
    responses.push(("GET /v1/models".into(), models.to_vec()));
    // The event log, replayed.
    let mut replay = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events")))
        .header("accept", "text/event-stream")
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    let mut replayed = Vec::new();
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, replay.chunk()).await {
        replayed.extend_from_slice(&chunk);
        if String::from_utf8_lossy(&replayed).contains("\"state\":\"completed\"") {
            break;
        }
    }
    assert!(
        String::from_utf8_lossy(&replayed).contains("tool.end"),
        "the replay carries the run's events"
    );
    responses.push(("the event replay".into(), replayed));

    let mut hits = Vec::new();
    for (place, body) in &responses {
        assert!(!body.is_empty(), "{place} answered nothing");
        scan(place, body, &mut hits);
    }
    // What reached the provider: its own key, in the header only; every body scanned.
    let seen: Vec<(String, String)> = provider_requests(&script)
        .into_iter()
        .map(|(_, auth, body)| (auth, body))
        .collect();
    let chats = seen
        .iter()
        .filter(|(_, b)| b.contains("\"messages\""))
        .count();
    assert!(chats >= 4, "two chat steps and two gateway calls: {seen:?}");
    for (auth, body) in &seen {
        assert_eq!(auth, &format!("Bearer {PROVIDER_KEY}"));
        scan("a provider request body", body.as_bytes(), &mut hits);
    }
    // The tool's upstream gets its own token in a header, and nothing else planted.
    let tool_calls: Vec<(String, String)> = bridge_seen
        .lock()
        .map(|s| {
            s.iter()
                .map(|x| {
                    let auth = header(&x.headers, "authorization");
                    (auth, x.body.clone())
                })
                .collect()
        })
        .unwrap_or_default();
    for (auth, body) in &tool_calls {
        assert_eq!(auth, &format!("Bearer {TOOL_TOKEN}"));
        scan("a tool request body", body.as_bytes(), &mut hits);
    }
    let log = server.log();
    assert!(server.terminate().success());
    scan("the log", log.as_bytes(), &mut hits);
    let db = std::fs::read(dir.path().join("k.db")).expect("k.db");
    scan("the database file", &db, &mut hits);
    // The WAL and its index exist only until the last connection checkpoints them.
    for file in ["k.db-wal", "k.db-shm"] {
        if let Ok(bytes) = std::fs::read(dir.path().join(file)) {
            scan(&format!("the database file {file}"), &bytes, &mut hits);
        }
    }
    assert!(
        hits.is_empty(),
        "planted secrets found:\n{}",
        hits.join("\n")
    );
    // The scan itself finds what it looks for.
    let mut probe = Vec::new();
    scan(
        "a probe",
        kortex::redact::base64(TOOL_TOKEN).as_bytes(),
        &mut probe,
    );
    scan("a probe", url_encoded(CHAT_KEY).as_bytes(), &mut probe);
    assert_eq!(probe.len(), 2, "{probe:?}");
}

/// Cluster mode (`kortex run` against the fake API server): the provider's key in a
/// Kubernetes Secret, a chat key in a credentials Secret and the authenticating proxy's
/// shared secret; chats through the proxy and with the chat key; then every request Kortex
/// made to the API server (status patches, Events, reviews, proposals), every object's
/// status, every response, provider request body, log line and database byte is scanned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_planted_secret_appears_anywhere_in_cluster_mode() {
    let fake = FakeApi::start().await;
    let (llm, script) = mock().await;
    fake.apply("secrets", secret(Some(PROVIDER_KEY)));
    fake.apply(
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "chat-alice", "namespace": "kortex",
                "labels": {"kortex.dev/credentials": "chat"}},
            "type": "Opaque",
            "data": {"user": kortex::redact::base64("alice"), "key": kortex::redact::base64(CHAT_KEY)}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start_behind_proxy(
        &fake,
        dir.path(),
        &llm,
        &["erin", "alice"],
        "127.0.0.1/32",
        &["--auth-proxy-secret", PROXY_SECRET],
    )
    .await;
    let client = http_client();
    let d = openai();
    let mut responses: Vec<(String, Vec<u8>)> = Vec::new();
    let as_erin = |r: reqwest::RequestBuilder| {
        r.header("X-Forwarded-User", "erin")
            .header("X-Kortex-Proxy-Secret", PROXY_SECRET)
    };
    let as_alice = |r: reqwest::RequestBuilder| r.bearer_auth(CHAT_KEY);
    for (who, sign) in [("erin", &as_erin as &dyn Fn(_) -> _), ("alice", &as_alice)] {
        let r = sign(client.post(server.url("/chat/v1/sessions")))
            .json(&json!({"name": format!("incident-{who}"), "namespace": "team-a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{who}");
        let created: serde_json::Value = r.json().await.unwrap_or_default();
        let id = created["id"].as_str().unwrap_or_default().to_owned();
        push(&script, streamed(&d, (d.text_stream)(&["All quiet."])));
        let r = sign(client.post(server.url(&format!("/chat/v1/sessions/{id}/messages"))))
            .header("accept", "text/event-stream")
            .json(&json!({"content": "status?"}))
            .send()
            .await
            .unwrap();
        let events = read_sse(r, run_ended).await;
        assert_eq!(state(&events), json!("completed"), "{who}: {events:?}");
        for e in &events {
            responses.push((
                format!("SSE {} ({who})", e.event),
                e.data.to_string().into_bytes(),
            ));
        }
        for path in [
            "/chat/v1/sessions".to_owned(),
            format!("/chat/v1/sessions/{id}"),
            format!("/chat/v1/sessions/{id}/export"),
            "/api/v1/llm/providers".to_owned(),
            "/api/v1/policies".to_owned(),
            "/auth/v1/me".to_owned(),
        ] {
            let r = sign(client.get(server.url(&path))).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200, "GET {path} ({who})");
            responses.push((
                format!("GET {path} ({who})"),
                r.bytes().await.unwrap_or_default().to_vec(),
            ));
        }
    }
    // The statuses are written (the provider's key hashed into secretHash, never itself).
    fake.until("the provider's status", |f| {
        crate::support::fake_api::condition(&f.get("llmproviders", "team-a", "gpt"), "Ready")
            .is_some()
    })
    .await;
    let (_, metrics) = server.get("/metrics").await;
    responses.push(("GET /metrics".into(), metrics.into_bytes()));

    let mut hits = Vec::new();
    for (place, body) in &responses {
        scan(place, body, &mut hits);
    }
    for seen in fake.seen() {
        // The reads of the Secrets themselves answer with their data, as the API server's do;
        // what Kortex sends is what is scanned.
        scan(
            &format!(
                "a request to the API server ({} {})",
                seen.method, seen.path
            ),
            seen.body.to_string().as_bytes(),
            &mut hits,
        );
    }
    for plural in [
        "llmproviders",
        "kortextools",
        "chatpolicies",
        "actionproposals",
        "events",
        "leases",
    ] {
        for object in fake.list(plural) {
            scan(
                &format!("the status of a {plural} object"),
                object["status"].to_string().as_bytes(),
                &mut hits,
            );
        }
    }
    let provider_bodies: Vec<(String, String)> = provider_requests(&script)
        .into_iter()
        .filter(|(path, _, _)| path.ends_with("/chat/completions"))
        .map(|(_, auth, body)| (auth, body))
        .collect();
    assert_eq!(provider_bodies.len(), 2, "two chats");
    for (auth, body) in &provider_bodies {
        assert_eq!(auth, &format!("Bearer {PROVIDER_KEY}"));
        scan("a provider request body", body.as_bytes(), &mut hits);
    }
    let log = server.log();
    assert!(server.terminate().success());
    scan("the log", log.as_bytes(), &mut hits);
    for file in ["k.db", "k.db-wal", "k.db-shm"] {
        if let Ok(bytes) = std::fs::read(dir.path().join(file)) {
            scan(&format!("the database file {file}"), &bytes, &mut hits);
        }
    }
    assert!(
        hits.is_empty(),
        "planted secrets found:\n{}",
        hits.join("\n")
    );
}
