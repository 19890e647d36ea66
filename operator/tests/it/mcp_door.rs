//! Kortex as an MCP server (`/mcp` and `kortex mcp`), driven by the official MCP Python
//! SDK's client against the real binary: the tools of the caller's policy, errors as tool
//! results, chunked results, list changes, guides, proposals, audit, redaction; refusals
//! without credentials, from a wrong origin, of another user's session and of malformed
//! messages; Kortex's own MCP client against another Kortex.

use crate::support::fake_api::incidents_cluster;
use crate::support::manifests::{chat_key, docs, manifest_dir, policy, provider, secret, tool};
use crate::support::net::{eventually, http_client, serve};
use crate::support::plugins::python_with_mcp as python;
use crate::support::plugins::{McpServer, mcp_server};
use crate::support::provider::messages_answer;
use crate::support::server::{Server, start_run_with};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MCP_TOKEN: &str = "mcp-upstream-token-5f1c9a";

/// What one run of the SDK client printed, and how it ended.
struct Run {
    lines: Vec<Value>,
    status: i32,
    stderr: String,
}

impl Run {
    /// The result of the `n`th step (0-based; the `connected` line is not a step).
    fn step(&self, n: usize) -> &Value {
        self.lines
            .get(n + 1)
            .unwrap_or_else(|| panic!("no step {n}; lines: {:#?}\n{}", self.lines, self.stderr))
    }

    fn connected(&self) -> &Value {
        self.lines
            .first()
            .unwrap_or_else(|| panic!("not connected (exit {}): {}", self.status, self.stderr))
    }
}

fn tool_names(step: &Value) -> Vec<String> {
    step["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {step}"))
        .iter()
        .map(|t| {
            t.as_str()
                .or(t["name"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Runs `tests/fixtures/mcp_client.py` with `target` (`--url …` or `--stdio …`) and
/// `steps`; `on_line` sees each printed line as it comes (to change things mid-run).
fn client(python: &str, target: &[&str], steps: &Value, mut on_line: impl FnMut(&Value)) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client.py");
    let mut child = Command::new(python)
        .arg(script)
        .args(target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let mut stdin = child.stdin.take().expect("no stdin");
    stdin.write_all(steps.to_string().as_bytes()).unwrap();
    drop(stdin);
    let stdout = child.stdout.take().expect("no stdout");
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        on_line(&v);
        lines.push(v);
    }
    let out = child.wait_with_output().unwrap();
    Run {
        lines,
        status: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn manifests(mcp_url: &str, deny: &str) -> String {
    let keys = docs(&[
        chat_key(
            "chat-alice",
            &format!(r#"user: alice, key: "{ALICE}", groups: kortex-admins"#),
        ),
        chat_key("chat-bob", &format!(r#"user: bob, key: "{BOB}""#)),
        secret("mcp", &format!(r#"token: "{MCP_TOKEN}""#)),
    ]);
    format!(
        r#"{keys}---
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: none}}
spec: {{type: openai-compatible, baseUrl: "http://127.0.0.1:9/v1", models: [{{id: m}}]}}
---
apiVersion: kortex.dev/v1alpha1
kind: KortexTool
metadata: {{name: grafana}}
spec:
  mcp:
    url: {mcp_url}
    auth: {{type: bearer, secretRef: {{name: mcp, key: token}}}}
    exclude: [slow, secret_header, add_tool, late, trace_context]
  guide: |
    # Grafana

    How to read dashboards with the grafana tools: echo first, then add.
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: ops}}
spec:
  sessions: ["*"]
  provider: none
  tools: {{deny: [{deny}]}}
  proposals: {{allowedActions: [scale], allowedNamespaces: ["*"]}}
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: incidents}}
spec:
  sessions: ["incident-*"]
  provider: none
  tools: {{allow: [get_incident_history]}}
"#
    )
}

struct Setup {
    server: Server,
    base: String,
    dir: tempfile::TempDir,
    _upstream: McpServer,
}

impl Setup {
    fn manifest(&self) -> PathBuf {
        self.dir.path().join("m/all.yaml")
    }
}

/// Kortex listening off loopback (so callers need keys), with an MCP plugin server.
async fn setup() -> Option<(Setup, String)> {
    let python = python()?;
    let upstream = mcp_server(MCP_TOKEN)?;
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        manifests(&upstream.url, "grafana__fail"),
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    let (server, base) = Server::start_keyed(&m, &db, &[]);
    // The MCP plugin's tools are discovered in the background.
    eventually("grafana's tools discovered", || async {
        let tools = http_client()
            .get(format!("{base}/api/v1/tools"))
            .bearer_auth(ALICE)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        if tools.contains("grafana__echo") {
            Ok(())
        } else {
            Err(tools)
        }
    })
    .await;
    Some((
        Setup {
            server,
            base,
            dir,
            _upstream: upstream,
        },
        python,
    ))
}

/// `GET base+path` with alice's key, as JSON.
async fn get_as_alice(base: &str, path: &str) -> Value {
    http_client()
        .get(format!("{base}{path}"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_investigates_with_its_policys_tools_rights_and_audit() {
    let Some((s, python)) = setup().await else {
        return;
    };
    let url = format!("{}/mcp?policy=default/ops", s.base);
    let steps = json!([
        {"op": "list_tools"},
        {"op": "call_tool", "name": "grafana__echo", "arguments": {"text": format!("the token is {MCP_TOKEN}")}},
        {"op": "call_tool", "name": "grafana__fail", "arguments": {}},
        {"op": "call_tool", "name": "grafana__add", "arguments": {"a": "one", "b": 2}},
        {"op": "call_tool", "name": "grafana__big", "arguments": {"size": 100000}},
        {"op": "call_tool", "name": "list_tool_guides", "arguments": {}},
        {"op": "call_tool", "name": "get_tool_guide", "arguments": {"name": "grafana"}},
        {"op": "list_resources"},
        {"op": "read_resource", "uri": "kortex://guides/kortex.large-results"},
        {"op": "read_resource", "uri": "kortex://guides/kortex.logs"},
        {"op": "call_tool", "name": "propose_action", "arguments": {
            "action": "scale", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "params": {"replicas": 3}, "rationale": "p99 latency doubled with CPU at the limit"}},
        {"op": "wait_tools_changed", "timeout": 30}
    ]);
    let manifest = s.manifest();
    let upstream_url = s._upstream.url.clone();
    let run = client(
        &python,
        &["--url", &url, "--token", ALICE],
        &steps,
        |line| {
            // Once the proposal is made, the platform team denies one more tool.
            if line["op"] == "call_tool" && line["text"].to_string().contains("awaitsConfirmation")
            {
                std::fs::write(
                    &manifest,
                    manifests(&upstream_url, "grafana__fail, grafana__add"),
                )
                .unwrap();
            }
        },
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(run.connected()["serverName"], "kortex");

    // The policy's tools: built-ins, the plugin's, propose_action; not the denied one.
    let tools = tool_names(run.step(0));
    for t in [
        "grafana__echo",
        "grafana__add",
        "grafana__big",
        "get_incident_history",
        "read_result_chunk",
        "list_tool_guides",
        "get_tool_guide",
        "propose_action",
    ] {
        assert!(tools.contains(&t.to_owned()), "{t} missing from {tools:?}");
    }
    assert!(!tools.contains(&"grafana__fail".to_owned()), "{tools:?}");

    // A resolved Secret's value never comes back, whatever the tool echoes.
    let echo = run.step(1);
    assert_eq!(echo["isError"], false, "{echo}");
    let text = echo["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("the token is "), "{echo}");
    assert!(
        !text.contains(MCP_TOKEN),
        "the Secret value came back: {echo}"
    );

    // Refused when named anyway, as a tool error with its kind.
    let denied = run.step(2);
    assert_eq!(denied["isError"], true, "{denied}");
    assert_eq!(denied["meta"]["kortex.dev/errorKind"], "denied", "{denied}");
    assert!(
        denied["text"]
            .as_str()
            .unwrap_or_default()
            .contains("not allowed by the session's policy"),
        "{denied}"
    );
    let invalid = run.step(3);
    assert_eq!(invalid["isError"], true, "{invalid}");
    assert_eq!(
        invalid["meta"]["kortex.dev/errorKind"], "validation",
        "{invalid}"
    );

    // A result over the cap comes back as an index to read in chunks.
    let big = run.step(4);
    assert_eq!(big["meta"]["kortex.dev/truncated"], true, "{big}");
    let index: Value = serde_json::from_str(big["text"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {big}"));
    let result_id = index["resultId"]
        .as_str()
        .unwrap_or_else(|| panic!("{index}"))
        .to_owned();
    assert!(index["chunks"].as_u64().unwrap_or(0) >= 3, "{index}");

    // Guides: those of the tools this caller may use, read back as a tool and a resource.
    let listed: Value =
        serde_json::from_str(run.step(5)["text"].as_str().unwrap_or_default()).unwrap();
    let guides: Vec<&str> = listed["guides"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in [
        "grafana",
        "kortex.large-results",
        "kortex.incident-history",
        "kortex.proposals",
    ] {
        assert!(guides.contains(&g), "{g} not in {guides:?}");
    }
    // No Kubernetes tools without a cluster, so no guide for them.
    assert!(!guides.contains(&"kortex.logs"), "{guides:?}");
    let grafana = listed["guides"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == "grafana"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        grafana["summary"],
        "How to read dashboards with the grafana tools: echo first, then add."
    );
    assert!(
        run.step(6)["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("# Grafana"),
        "{}",
        run.step(6)
    );
    let resources = run.step(7)["resources"].to_string();
    assert!(resources.contains("kortex://guides/grafana"), "{resources}");
    assert!(
        run.step(8)["text"]
            .as_str()
            .unwrap_or_default()
            .contains("read_result_chunk"),
        "{}",
        run.step(8)
    );
    assert_eq!(run.step(9)["error"]["code"], -32002, "{}", run.step(9));

    // A proposal, made as over chat: pending a human decision.
    let proposal = run.step(10);
    assert_eq!(proposal["isError"], false, "{proposal}");
    let made: Value = serde_json::from_str(proposal["text"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {proposal}"));
    assert_eq!(made["awaitsConfirmation"], true, "{made}");
    assert!(
        made["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Proposed, not executed")),
        "{made}"
    );

    // The manifest edit reached the client as tools/list_changed.
    let changed = run.step(11);
    assert_eq!(changed["changed"], true, "{changed}");
    let now = tool_names(changed);
    assert!(!now.contains(&"grafana__add".to_owned()), "{now:?}");
    assert!(now.contains(&"grafana__echo".to_owned()), "{now:?}");

    // The kept result is read back over MCP, in a later connection of the same caller.
    let chunk = client(
        &python,
        &["--url", &url, "--token", ALICE],
        &json!([{"op": "call_tool", "name": "read_result_chunk", "arguments": {"resultId": result_id, "chunk": 1}}]),
        |_| {},
    );
    let read = chunk.step(0);
    assert_eq!(read["isError"], false, "{read}");
    let part: Value = serde_json::from_str(read["text"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {read}"));
    assert!(
        part["content"]
            .as_str()
            .is_some_and(|c| c.len() > 1000 && c.chars().all(|c| c == 'x')),
        "{part}"
    );
    // Another user cannot read it.
    let theirs = client(
        &python,
        &["--url", &url, "--token", BOB],
        &json!([{"op": "call_tool", "name": "read_result_chunk", "arguments": {"resultId": result_id, "chunk": 1}}]),
        |_| {},
    );
    assert_eq!(theirs.step(0)["isError"], true, "{}", theirs.step(0));

    // Every call has its audit row, marked as coming over MCP.
    let audit = get_as_alice(&s.base, "/api/v1/audit?kind=tool_call&limit=100").await;
    let rows = audit["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{audit}"));
    let row = |tool: &str| {
        rows.iter()
            .find(|r| r["subject"] == tool && r["user"] == "alice")
            .unwrap_or_else(|| panic!("no audit row for {tool}: {audit}"))
    };
    assert_eq!(row("grafana__echo")["outcome"], "ok");
    assert_eq!(row("grafana__echo")["detail"]["via"], "mcp");
    assert_eq!(row("grafana__echo")["policy"], "ops");
    assert_eq!(row("grafana__fail")["outcome"], "denied");
    assert!(
        !audit.to_string().contains(MCP_TOKEN),
        "the audit log holds the Secret value"
    );
    // The proposal is pending for a human, like one made in chat.
    let proposals = get_as_alice(&s.base, "/chat/v1/proposals").await;
    assert!(
        proposals.to_string().contains("\"Pending\"") && proposals.to_string().contains("scale"),
        "{proposals}"
    );
    // MCP sessions stay out of the user's chat session list.
    let sessions = get_as_alice(&s.base, "/chat/v1/sessions").await;
    assert_eq!(
        sessions["items"].as_array().map(Vec::len),
        Some(0),
        "{sessions}"
    );
    assert!(
        !s.server.log().contains(MCP_TOKEN),
        "the log holds the Secret value"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_door_refuses_strangers_wrong_origins_other_users_sessions_and_bad_messages() {
    let Some((s, python)) = setup().await else {
        return;
    };
    let url = format!("{}/mcp?policy=default/ops", s.base);
    let http = http_client();
    let post = |body: Value| {
        http.post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&body)
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});

    // No credentials: 401 with a challenge, and the SDK's client cannot connect.
    let r = post(initialize.clone()).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some(r#"Bearer realm="kortex""#)
    );
    let stranger = client(
        &python,
        &["--url", &url],
        &json!([{"op": "list_tools"}]),
        |_| {},
    );
    assert_eq!(stranger.status, 2, "{}", stranger.stderr);
    assert!(stranger.stderr.contains("HTTP 401"), "{}", stranger.stderr);

    // A browser page of another site: refused whatever credentials it carries.
    let r = post(initialize.clone())
        .bearer_auth(ALICE)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // This server's own origin is fine.
    let host = s.base.trim_start_matches("http://").to_owned();
    let r = post(initialize.clone())
        .bearer_auth(ALICE)
        .header("origin", format!("http://{host}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("no session id")
        .to_owned();

    // Alice's session is hers: Bob presenting its id gets what an unknown id gets.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let r = post(list.clone())
        .bearer_auth(BOB)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = post(list)
        .bearer_auth(ALICE)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.text().await.unwrap_or_default().contains("grafana__echo"),
        "alice's own session lists her tools"
    );

    // Malformed messages get the JSON-RPC error codes, and the server keeps serving.
    for (body, code) in [
        ("{not json".to_owned(), -32700),
        (json!({"jsonrpc": "2.0", "id": 1}).to_string(), -32600),
        (
            json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]).to_string(),
            -32600,
        ),
        (
            json!({"jsonrpc": "1.0", "id": 1, "method": "ping"}).to_string(),
            -32600,
        ),
    ] {
        let r = http
            .post(&url)
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let answer: Value = r.json().await.unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        assert_eq!(answer["jsonrpc"], "2.0");
    }
    let r = post(json!({"jsonrpc": "2.0", "id": 9, "method": "no/such/method"}))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap_or_default();
    assert!(text.contains("-32601"), "{text}");

    // A URL that names no policy, or one the caller's session name does not fit.
    for (query, why) in [
        ("", "name a ChatPolicy"),
        ("?policy=default/nope", "no ChatPolicy default/nope"),
        (
            "?policy=default/incidents&session=chat",
            "does not cover session name",
        ),
        (
            "?session=nothing-matches&namespace=elsewhere",
            "no ChatPolicy in namespace elsewhere",
        ),
        ("?polcy=default/ops", "unknown query parameter"),
    ] {
        let r = http
            .post(format!("{}/mcp{query}", s.base))
            .bearer_auth(ALICE)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert!((400..500).contains(&status), "{query}: {status}");
        assert!(text.contains(why), "{query}: {text}");
    }
    // A session name picks the policy as chat does: incident-* sessions get its one tool.
    let incident = client(
        &python,
        &[
            "--url",
            &format!("{}/mcp?session=incident-7", s.base),
            "--token",
            BOB,
            "--mode",
            "auto",
        ],
        &json!([{"op": "list_tools"}, {"op": "call_tool", "name": "get_incident_history", "arguments": {"query": "oom"}}]),
        |_| {},
    );
    assert_eq!(incident.status, 0, "{}", incident.stderr);
    // The current revision of the protocol: no handshake, no session.
    assert_eq!(incident.connected()["protocolVersion"], "2026-07-28");
    assert_eq!(
        tool_names(incident.step(0)),
        ["get_incident_history", "get_tool_guide", "list_tool_guides"].map(String::from),
        "allow: [get_incident_history] plus the guides of what remains"
    );
    assert_eq!(incident.step(1)["isError"], false, "{}", incident.step(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_mcp_bridges_a_stdio_client_to_the_server() {
    let Some((s, python)) = setup().await else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_kortex");
    let manifest = s.manifest();
    let upstream_url = s._upstream.url.clone();
    let run = client(
        &python,
        &[
            "--stdio",
            bin,
            "mcp",
            "--server",
            &s.base,
            "--policy",
            "default/ops",
            "--key",
            ALICE,
        ],
        &json!([
            {"op": "list_tools"},
            {"op": "call_tool", "name": "grafana__add", "arguments": {"a": 2, "b": 3}},
            {"op": "call_tool", "name": "grafana__fail", "arguments": {}},
            {"op": "list_resources"},
            {"op": "wait_tools_changed", "timeout": 30}
        ]),
        |line| {
            if line["op"] == "list_resources" {
                std::fs::write(
                    &manifest,
                    manifests(&upstream_url, "grafana__fail, grafana__echo"),
                )
                .unwrap();
            }
        },
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(tool_names(run.step(0)).contains(&"grafana__echo".to_owned()));
    assert_eq!(run.step(1)["text"], "5", "{}", run.step(1));
    assert_eq!(run.step(2)["isError"], true, "{}", run.step(2));
    assert_eq!(run.step(2)["meta"]["kortex.dev/errorKind"], "denied");
    assert!(
        run.step(3)["resources"]
            .to_string()
            .contains("kortex://guides/grafana")
    );
    // The server's list change travels through the bridge.
    assert_eq!(run.step(4)["changed"], true, "{}", run.step(4));
    assert!(!tool_names(run.step(4)).contains(&"grafana__echo".to_owned()));

    // Without a key the bridge says why it cannot start.
    let out = Command::new(bin)
        .args(["mcp", "--server", &s.base, "--policy", "default/ops"])
        .env_remove("KORTEX_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot connect to")
            && stderr.contains("the server wants credentials (401): pass a chat key with --key"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_uses_another_kortex_as_an_mcp_server() {
    let Some(python) = python() else {
        return;
    };
    // The Kortex whose tools are shared (loopback: no credentials).
    let dir_a = tempfile::tempdir().unwrap();
    std::fs::write(
        dir_a.path().join("a.yaml"),
        docs(&[
            provider(
                "none",
                "type: openai-compatible, baseUrl: 'http://127.0.0.1:9/v1', models: [{id: m}]",
            ),
            policy(
                "shared",
                "sessions: ['*'], provider: none, \
                 tools: {allow: [get_incident_history, read_result_chunk]}",
            ),
        ]),
    )
    .unwrap();
    let a = Server::start(dir_a.path(), &dir_a.path().join("a.db"), &[]);
    // The Kortex that uses them as a KortexTool.
    let dir_b = tempfile::tempdir().unwrap();
    std::fs::write(
        dir_b.path().join("b.yaml"),
        docs(&[
            provider(
                "none",
                "type: openai-compatible, baseUrl: 'http://127.0.0.1:9/v1', models: [{id: m}]",
            ),
            tool(
                "upstream",
                &format!(
                    "mcp: {{url: '{url}'}}",
                    url = a.url("/mcp?policy=default/shared")
                ),
            ),
            policy("ops", "sessions: ['*'], provider: none"),
        ]),
    )
    .unwrap();
    let b = Server::start(dir_b.path(), &dir_b.path().join("b.db"), &[]);
    let tools = eventually("B discovers A's tools", || async {
        let (_, body) = b.get("/api/v1/tools").await;
        if body.contains("upstream__get_incident_history") {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;
    assert!(
        !tools.contains("upstream__get_logs") && tools.contains("upstream__read_result_chunk"),
        "A offers only what its policy allows: {tools}"
    );
    // An MCP client of B calls A's tool through B.
    let run = client(
        &python,
        &["--url", &b.url("/mcp?policy=default/ops")],
        &json!([{"op": "call_tool", "name": "upstream__get_incident_history", "arguments": {"query": "checkout"}}]),
        |_| {},
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    let answer = run.step(0);
    assert_eq!(answer["isError"], false, "{answer}");
    assert!(answer["text"].to_string().contains("sessions"), "{answer}");
    // A audited the call, as coming over MCP.
    let (_, audit) = a.get("/api/v1/audit?kind=tool_call").await;
    let audit: Value = serde_json::from_str(&audit).unwrap_or_else(|e| panic!("{e}: {audit}"));
    assert!(
        audit["items"].as_array().is_some_and(|rows| rows
            .iter()
            .any(|r| r["subject"] == "get_incident_history" && r["detail"]["via"] == "mcp")),
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_guides_are_bounded_by_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str, guide: &str| {
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: KortexTool\nmetadata: {{name: {name}}}\nspec:\n  description: d\n  http: {{url: \"http://127.0.0.1:9/x\"}}\n  guide: {}\n---\n",
            serde_json::to_string(guide).unwrap_or_default()
        )
    };
    let yaml = [
        tool("fits", &format!("# Fits\n\n{}", "a".repeat(16_000))),
        tool("too-long", &"b".repeat(16_385)),
        // Under the schema's 16384 characters, but 32 000 bytes.
        tool("too-heavy", &"é".repeat(16_000)),
    ]
    .concat();
    std::fs::write(dir.path().join("t.yaml"), yaml).unwrap();
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let (_, problems) = server.get("/api/v1/manifests").await;
    assert!(
        problems.contains("spec.guide") && problems.contains("too-long"),
        "{problems}"
    );
    let (_, tools) = server.get("/api/v1/tools").await;
    let tools: Value = serde_json::from_str(&tools).unwrap_or_else(|e| panic!("{e}: {tools}"));
    let entry = |name: &str| {
        tools
            .as_object()
            .into_iter()
            .flat_map(|o| o.values())
            .filter_map(Value::as_array)
            .flatten()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {tools}"))
    };
    assert_eq!(entry("fits")["available"], true, "{}", entry("fits"));
    assert_eq!(
        entry("fits")["guide"],
        json!({"name": "fits", "summary": "a".repeat(200 - 1) + "…", "bytes": 16_008})
    );
    let long = entry("too-long");
    assert_eq!(long["available"], false);
    assert!(
        long.to_string()
            .contains("spec.guide: Too long: may not be more than 16384 characters"),
        "{long}"
    );
    let heavy = entry("too-heavy");
    assert_eq!(heavy["available"], false);
    assert!(
        heavy.to_string().contains("spec.guide is 32000 bytes"),
        "{heavy}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_goes_on_at_another_replica() {
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("p.yaml"),
        docs(&[
            provider(
                "none",
                "type: openai-compatible, baseUrl: 'http://127.0.0.1:9/v1', models: [{id: m}]",
            ),
            policy("ops", "sessions: ['*'], provider: none"),
        ]),
    )
    .unwrap();
    let db = dir.path().join("k.db");
    let http = http_client();
    let post = |url: String, session: Option<&str>, body: Value| {
        let mut r = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(id) = session {
            r = r
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-11-25");
        }
        r.send()
    };
    let first = Server::start(&m, &db, &[]);
    let r = post(
        first.url("/mcp?policy=default/ops"),
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let session = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("no session id")
        .to_owned();
    let r = post(
        first.url("/mcp?policy=default/ops"),
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success());
    // The replica that knew the session is gone; another one, on the same database,
    // carries it on without a new handshake.
    first.kill9();
    let second = Server::start(&m, &db, &[]);
    let r = post(
        second.url("/mcp?policy=default/ops"),
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "get_incident_history", "arguments": {"query": "checkout"}}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap_or_default();
    assert!(
        text.contains("sessions") && text.contains("\"id\":2"),
        "{text}"
    );
    assert!(!text.contains("isError\":true"), "{text}");
    // An id no replica ever issued is unknown everywhere.
    let r = post(
        second.url("/mcp?policy=default/ops"),
        Some("f0f0f0f0-0000-4000-8000-000000000000"),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
}

/// Cluster mode: Kubernetes tokens (TokenReview), `use` on the policy (SubjectAccessReview),
/// Kubernetes tools read with the caller's own token, and a proposal that is an
/// `ActionProposal` object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_mcp_callers_act_with_their_own_rights() {
    let Some(python) = python() else {
        return;
    };
    let (fake, llm, _script) =
        incidents_cluster(json!({"allowedActions": ["restart"], "allowedNamespaces": ["shop"]}))
            .await;
    fake.allow("alice");
    let dir = tempfile::tempdir().unwrap();
    let server = start_run_with(&fake, dir.path(), &llm, &["--auth", "kubernetes"]).await;
    let url = server.url("/mcp?policy=team-a/incidents");

    // bob's token is valid, but RBAC does not let him use the policy.
    let bob = client(
        &python,
        &["--url", &url, "--token", "bob-token"],
        &json!([{"op": "list_tools"}]),
        |_| {},
    );
    assert_eq!(bob.status, 2, "{}", bob.stderr);
    assert!(bob.stderr.contains("HTTP 403"), "{}", bob.stderr);

    let alice = client(
        &python,
        &["--url", &url, "--token", "alice-token"],
        &json!([
            {"op": "list_tools"},
            {"op": "call_tool", "name": "get_resource", "arguments": {"kind": "Deployment", "namespace": "shop", "name": "api"}},
            {"op": "call_tool", "name": "propose_action", "arguments": {
                "action": "restart", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                "rationale": "stuck rollout"}}
        ]),
        |_| {},
    );
    assert_eq!(alice.status, 0, "{}", alice.stderr);
    let tools = tool_names(alice.step(0));
    for t in [
        "get_resource",
        "get_logs",
        "get_events",
        "propose_action",
        "list_tool_guides",
    ] {
        assert!(tools.contains(&t.to_owned()), "{t} missing: {tools:?}");
    }
    let read = alice.step(1);
    assert_eq!(read["isError"], false, "{read}");
    assert!(read["text"].to_string().contains("replicas"), "{read}");
    // The Deployment was read with alice's own token (runToolsAsUser).
    assert!(
        fake.seen().iter().any(|s| s.method == "GET"
            && s.path == "/apis/apps/v1/namespaces/shop/deployments/api"
            && s.token == "alice-token"),
        "not read as alice"
    );
    let review = fake
        .seen()
        .into_iter()
        .rfind(|s| s.path.ends_with("/subjectaccessreviews") && s.body["spec"]["user"] == "alice")
        .map(|s| s.body["spec"]["resourceAttributes"].clone())
        .unwrap_or_default();
    assert_eq!(
        review,
        json!({"namespace": "team-a", "verb": "use", "group": "kortex.dev", "resource": "chatpolicies", "name": "incidents"})
    );
    // The proposal is an ActionProposal waiting for a human, recorded as made over MCP.
    let proposal = alice.step(2);
    assert_eq!(proposal["isError"], false, "{proposal}");
    assert!(
        proposal["text"]
            .to_string()
            .contains("kubectl kortex approve"),
        "{proposal}"
    );
    let objects = fake.list("actionproposals");
    let made = objects
        .iter()
        .find(|o| o["spec"]["session"]["user"] == "alice")
        .unwrap_or_else(|| panic!("no ActionProposal: {objects:?}"));
    assert_eq!(made["spec"]["model"]["provider"], "mcp", "{made}");
    assert_eq!(made["spec"]["action"], "restart");
    assert!(server.terminate().success());
}

/// A stand-in for Anthropic's Messages API (streamed, as Claude Code asks for it): it calls
/// the `get_incident_history` tool it is offered once, then answers with what came back.
async fn tool_calling_model() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::response::IntoResponse;
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<Value>>>;
    async fn messages(
        axum::extract::State(seen): axum::extract::State<Seen>,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(body.clone());
        let tool = body["tools"].as_array().and_then(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str())
                .find(|n| n.ends_with("__get_incident_history"))
                .map(str::to_owned)
        });
        // The tool's result, once Claude Code has sent it back.
        let result = body["messages"].as_array().and_then(|m| {
            m.iter()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .find(|c| c["type"] == "tool_result")
                .map(|c| c["content"].to_string())
        });
        let (block, delta, stop) = match (&tool, &result) {
            (Some(name), None) => (
                json!({"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}),
                json!({"type": "input_json_delta", "partial_json": "{\"query\": \"checkout\"}"}),
                "tool_use",
            ),
            (_, result) => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": format!("Kortex answered: {}", result.as_deref().unwrap_or("nothing"))}),
                "end_turn",
            ),
        };
        let events = messages_answer(&body["model"], block, delta, stop);
        ([("content-type", "text/event-stream")], events).into_response()
    }
    let seen: Seen = std::sync::Arc::default();
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(messages))
        .with_state(seen.clone());
    (serve(app).await, seen)
}

/// Claude Code, the MCP client engineers use, investigates through Kortex: it lists the
/// policy's tools, calls one, and Kortex audits the call as the key's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_investigates_through_kortex() {
    let Some(claude) = std::env::var("KORTEX_TEST_CLAUDE")
        .ok()
        .filter(|c| Path::new(c).exists())
    else {
        assert!(
            std::env::var("KORTEX_REQUIRE_CLAUDE").is_err(),
            "KORTEX_TEST_CLAUDE must name Claude Code's binary (scripts/test.sh installs it)"
        );
        eprintln!("skipped: no Claude Code (KORTEX_TEST_CLAUDE)");
        return;
    };
    let Some((s, _python)) = setup().await else {
        return;
    };
    let (model, seen) = tool_calling_model().await;
    let home = tempfile::tempdir().unwrap();
    let config = json!({"mcpServers": {"kortex": {"type": "http",
        "url": format!("{}/mcp?policy=default/ops", s.base),
        "headers": {"Authorization": format!("Bearer {ALICE}")}}}});
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&claude)
            .args(["-p", "Has checkout failed before?", "--strict-mcp-config"])
            .args(["--mcp-config", &config.to_string()])
            .args(["--allowedTools", "mcp__kortex__get_incident_history"])
            .env("HOME", home.path())
            .env("ANTHROPIC_BASE_URL", &model)
            .env("ANTHROPIC_API_KEY", "sk-ant-test-not-a-key")
            .env("DISABLE_TELEMETRY", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdin(Stdio::null())
            .output()
    })
    .await
    .unwrap()
    .expect("claude");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Claude Code was offered the policy's tools under its mcp__kortex__ prefix, not the
    // denied one.
    let offered: Vec<String> = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .first()
        .and_then(|b| b["tools"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with("mcp__kortex__"))
        .collect();
    for t in [
        "get_incident_history",
        "grafana__echo",
        "propose_action",
        "list_tool_guides",
    ] {
        assert!(
            offered.contains(&format!("mcp__kortex__{t}")),
            "{t} not offered: {offered:?}"
        );
    }
    assert!(
        !offered.contains(&"mcp__kortex__grafana__fail".to_owned()),
        "{offered:?}"
    );
    // Kortex's answer went back to the model, and the model's answer to the user.
    assert!(
        stdout.contains("Kortex answered") && stdout.contains("sessions"),
        "{stdout}\n{stderr}"
    );
    let audit = get_as_alice(&s.base, "/api/v1/audit?kind=tool_call").await;
    assert!(
        audit["items"]
            .as_array()
            .is_some_and(
                |rows| rows.iter().any(|r| r["subject"] == "get_incident_history"
                    && r["user"] == "alice"
                    && r["detail"]["via"] == "mcp"
                    && r["outcome"] == "ok")
            ),
        "{audit}"
    );
}
