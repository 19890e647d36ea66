//! Secret canaries: distinct values planted in every place a credential lives — a provider
//! key, a KortexTool bearer token, a Kubernetes Secret a tool reads, a chat key and a
//! gateway key — then a chat with tool calls, gateway calls and every read endpoint, and a
//! scan of every log line, API response, SSE event, provider request body and database
//! byte (the SQLite file and its WAL) for each value, raw, base64 and URL-encoded: zero hits.

use crate::binary::Server;
use crate::common::http_client;
use crate::investigation::tool_calls;
use crate::llm::{mock, openai, push, streamed};
use crate::policy::{ask, session, state};
use serde_json::json;

/// The planted values (`/` and `+` so that URL-encoding and base64 forms differ).
const PROVIDER_KEY: &str = "sk-canary/Prov+Q9x7Lm2Pz";
const TOOL_TOKEN: &str = "tok-canary/Tool+Hh5Vb3Nc";
const CHAT_KEY: &str = "kc-canary/Chat+Tt4Gg6Yy";
const GATEWAY_KEY: &str = "kgw-canary/Gw+Pp2Ll9Qq";
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
    let (api, _) = crate::cluster::fake_api_server().await;
    let (bridge, bridge_seen) = crate::plugins::upstream().await;
    let (base, script) = mock().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = crate::cluster::write_kubeconfig(dir.path(), &api);
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        m.join("all.yaml"),
        format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: keys}}
stringData: {{provider: "{PROVIDER_KEY}", tool: "{TOOL_TOKEN}"}}
---
apiVersion: v1
kind: Secret
metadata:
  name: chat-alice
  labels: {{kortex.dev/credentials: chat}}
stringData: {{user: alice, key: "{CHAT_KEY}"}}
---
apiVersion: v1
kind: Secret
metadata:
  name: gateway-team
  labels: {{kortex.dev/credentials: gateway}}
  annotations: {{kortex.dev/policy: incidents}}
stringData: {{team: shop, key: "{GATEWAY_KEY}"}}
---
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
"#
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let server = Server::start_with_args(
        &m,
        &dir.path().join("k.db"),
        &["--kubeconfig", &kubeconfig.display().to_string()],
    );
    let client = http_client();
    let mut responses: Vec<(String, Vec<u8>)> = Vec::new();

    // A chat whose model reads the Secret, calls the HTTP tool, and answers.
    push(
        &script,
        tool_calls(&[
            (
                "c1",
                "get_resource",
                json!({"kind": "Secret", "namespace": "shop", "name": "db"}),
            ),
            ("c2", "ticket_search", json!({"q": "checkout"})),
        ]),
    );
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

    // The gateway, whole and streamed.
    for stream in [false, true] {
        push(
            &script,
            if stream {
                streamed(&d, (d.text_stream)(&["hi"]))
            } else {
                // A client that asks for no stream gets a whole upstream answer.
                crate::llm::json_reply(200, &(d.text_json)("hi"))
            },
        );
        let r = client
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(GATEWAY_KEY)
            .json(&json!({"model": "m1", "stream": stream,
                "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
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
        .unwrap_or_else(|e| panic!("{e}"));
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
        .unwrap_or_else(|e| panic!("{e}"));
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
    let seen: Vec<(String, String)> = script
        .seen
        .lock()
        .map(|s| {
            s.iter()
                .map(|x| {
                    let auth = x
                        .headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    (auth, x.body.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
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
                    let auth = x
                        .headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
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
    let db = std::fs::read(dir.path().join("k.db")).unwrap_or_else(|e| panic!("k.db: {e}"));
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
