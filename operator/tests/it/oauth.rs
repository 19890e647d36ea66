//! Kortex as an OAuth resource server (`docs/mcp.md#oauth`) against the binary, with a
//! scripted OpenID provider as the authorization server: a 401 of `/mcp` or an A2A agent
//! says where the protected resource metadata is; the metadata names the issuer and the
//! scopes; an access token for Kortex (its `aud`), signed, unexpired, with the scope, is the
//! caller; a token for another audience, an expired, an unsigned or a foreign-signed one is
//! refused, and one without the scope is 403.

use crate::support::manifests::{docs, manifest_dir, policy, provider};
use crate::support::net::http_client;
use crate::support::oidc::{CLIENT_ID, Provider};
use crate::support::server::Server;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_takes_access_tokens_for_itself_and_refuses_the_rest() {
    let p = Provider::start().await;
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            provider(
                "local",
                "type: ollama, baseUrl: 'http://127.0.0.1:9/v1', defaultModel: m",
            ),
            policy(
                "ops",
                "sessions: ['*'], provider: local, a2a: {expose: true}",
            ),
        ]),
    )
    .unwrap();
    let (server, public) = resource_server(
        &m,
        dir.path(),
        crate::support::net::free_port(),
        &p.issuer,
        &["--oauth-scopes", "kortex:mcp"],
    );
    let http = http_client();
    let mcp = format!("{public}/mcp?policy=default/ops");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "oauth-test", "version": "1"}}});
    let call = |token: Option<String>| {
        let mut r = http
            .post(&mcp)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };

    // Without a token: where to find how to get one.
    let r = call(None).await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let challenge = r.headers()["www-authenticate"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    let metadata_url = format!("{public}/.well-known/oauth-protected-resource/mcp");
    assert!(
        challenge.contains(&format!("resource_metadata=\"{metadata_url}\""))
            && challenge.contains("scope=\"kortex:mcp\""),
        "{challenge}"
    );
    let meta: Value = http
        .get(&metadata_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["resource"], format!("{public}/mcp"));
    assert_eq!(meta["authorization_servers"], json!([p.issuer]));
    assert_eq!(meta["scopes_supported"], json!(["kortex:mcp"]));
    let root: Value = http
        .get(format!("{public}/.well-known/oauth-protected-resource"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(root["resource"], public.as_str());

    let now = jiff::Timestamp::now().as_second();
    let claims = |aud: &str, exp: i64, scope: &str| {
        json!({"iss": p.issuer, "aud": aud, "sub": "u-carol", "azp": "mcp-inspector",
            "email": "carol@example.com", "groups": ["oncall"], "scope": scope,
            "iat": now, "exp": exp})
    };
    // A token for Kortex's MCP endpoint: carol, as the provider names her.
    let good = p.sign(
        "k1",
        &claims(&format!("{public}/mcp"), now + 300, "kortex:mcp"),
    );
    let r = call(Some(good.clone())).await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );
    assert!(r.text().await.unwrap_or_default().contains("serverInfo"));
    // The same for the server as a whole, on an A2A agent: an authenticated JSON-RPC answer.
    let agent = format!("{public}/a2a/v1/default/ops");
    // Its card offers OAuth beside bearer keys: the issuer's client credentials flow.
    let card: Value = http
        .get(format!("{agent}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let oauth = &card["securitySchemes"]["oauth"]["oauth2SecurityScheme"];
    assert_eq!(
        oauth["flows"]["clientCredentials"]["tokenUrl"],
        format!("{}/token", p.issuer),
        "{card}"
    );
    assert!(oauth["flows"]["clientCredentials"]["scopes"]["kortex:mcp"].is_string());
    assert_eq!(
        card["securityRequirements"][1]["schemes"]["oauth"]["list"],
        json!(["kortex:mcp"])
    );
    let whole = p.sign("k1", &claims(&public, now + 300, "kortex:mcp"));
    let r: Value = http
        .post(&agent)
        .bearer_auth(&whole)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32001, "{r}");
    let r = http
        .post(&agent)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap_or_default()
            .contains(&format!(
                "{public}/.well-known/oauth-protected-resource/a2a/v1/default/ops"
            )),
        "{:?}",
        r.headers()
    );

    // Refused: another audience (no token passthrough), expired, a key the provider never
    // published, unsigned; and without the scope, forbidden.
    for (token, why) in [
        (
            p.sign(
                "k1",
                &claims("https://grafana.example.com", now + 300, "kortex:mcp"),
            ),
            "is for https://grafana.example.com",
        ),
        (
            p.sign(
                "k1",
                &claims(&format!("{public}/mcp"), now - 600, "kortex:mcp"),
            ),
            "expired",
        ),
        (
            p.sign_unpublished(
                "k9",
                &claims(&format!("{public}/mcp"), now + 300, "kortex:mcp"),
            ),
            "no key k9",
        ),
        (
            unsigned(&claims(&format!("{public}/mcp"), now + 300, "kortex:mcp")),
            "algorithm none",
        ),
    ] {
        let r = call(Some(token)).await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{why}");
        let body = r.text().await.unwrap_or_default();
        assert!(body.contains(why), "{why}: {body}");
    }
    let r = call(Some(
        p.sign("k1", &claims(&format!("{public}/mcp"), now + 300, "other")),
    ))
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(
        r.text()
            .await
            .unwrap_or_default()
            .contains("lacks the scope kortex:mcp")
    );

    // The official MCP Python SDK's OAuth client: the 401's metadata, the issuer's token
    // endpoint (client credentials, with the resource indicator), then the calls.
    if let Some(python) = crate::support::plugins::python_with_mcp() {
        let (ok, out) = tokio::task::spawn_blocking({
            let (mcp, issuer) = (mcp.clone(), p.issuer.clone());
            move || {
                sdk_lists_tools(
                    &python,
                    &mcp,
                    (CLIENT_ID, crate::support::oidc::CLIENT_SECRET),
                    &issuer,
                )
            }
        })
        .await
        .unwrap();
        assert!(ok && out.contains("get_incident_history"), "{out}");
        assert!(p.token_calls().contains(&"client_credentials".to_owned()));
    }
    assert!(!server.log().contains(&good), "tokens never logged");
    assert!(server.terminate().success());
}

/// A JWT with `alg: none` and no signature.
fn unsigned(claims: &Value) -> String {
    let b = |v: &Value| kortex::oidc::jwt::base64url_encode(v.to_string().as_bytes());
    format!(
        "{}.{}.",
        b(&json!({"alg": "none", "typ": "JWT"})),
        b(claims)
    )
}

/// One JSON-RPC request to an MCP endpoint with `token`: the answer (JSON, or the last SSE
/// event) and the session id the server gave.
async fn mcp_rpc(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    session: Option<&str>,
    body: Value,
) -> (Value, Option<String>) {
    let mut r = http
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    let r = r.send().await.unwrap();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = r.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data:"))
            .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .unwrap_or(Value::Null)
    });
    (json, sid)
}

/// `auth.type: oauthTokenExchange` (`docs/tools.md#oauth`): Kortex lists the remote MCP
/// server's tools with its client credentials, and calls them on behalf of the chat user —
/// the access token carol presented to Kortex exchanged (RFC 8693) at the authorization
/// server for one for that server, which then sees carol, not Kortex. So over Kortex's own
/// `/mcp`, and in a run an A2A task starts; a caller with a chat key has no token to
/// exchange and is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_mcp_server_is_called_on_behalf_of_the_user_by_token_exchange() {
    use crate::support::manifests::{chat_key_secret, secret, tool};
    use crate::support::provider::{chat_requests, mock, push, push_answer, tool_result};
    let p = Provider::start().await;
    let Some(remote) = crate::support::plugins::mcp_server_with(&[
        "--oauth-issuer",
        &p.issuer,
        "--oauth-scope",
        "mcp:tools",
    ]) else {
        return;
    };
    // Another MCP server, whose metadata names another authorization server.
    let other_issuer = Provider::start().await;
    let Some(other) = crate::support::plugins::mcp_server_with(&[
        "--oauth-issuer",
        &other_issuer.issuer,
        "--oauth-scope",
        "mcp:tools",
    ]) else {
        return;
    };
    let (llm, script) = mock().await;
    let (dir, m) = manifest_dir();
    let yaml = format!(
        "{}{}",
        chat_key_secret("dave", "dave-chat-key", "sre"),
        docs(&[
            secret("llm", "key: sk-obo"),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{llm}/v1', apiKeySecretRef: {{name: llm, key: key}}, defaultModel: m, timeout: 10s"
                ),
            ),
            policy("ops", "sessions: ['*'], provider: gpt, a2a: {expose: true}"),
            secret(
                "mcp-oauth",
                &format!("secret: {}", crate::support::oidc::CLIENT_SECRET),
            ),
            tool(
                "remote",
                &format!(
                    "mcp: {{url: '{}', auth: {{type: oauthTokenExchange, clientId: {CLIENT_ID}, \
                     secretRef: {{name: mcp-oauth, key: secret}}, scopes: [mcp:tools]}}, include: [whoami]}}",
                    remote.url
                ),
            ),
            tool(
                "other",
                &format!(
                    "mcp: {{url: '{}', auth: {{type: oauthTokenExchange, clientId: {CLIENT_ID}, \
                     secretRef: {{name: mcp-oauth, key: secret}}, scopes: [mcp:tools]}}, include: [whoami]}}",
                    other.url
                ),
            ),
        ])
    );
    std::fs::write(m.join("all.yaml"), yaml).unwrap();
    let (server, public) = resource_server(
        &m,
        dir.path(),
        crate::support::net::free_port(),
        &p.issuer,
        &[],
    );
    let http = http_client();
    let now = jiff::Timestamp::now().as_second();
    let carol = |aud: &str| {
        p.sign(
            "k1",
            &json!({"iss": p.issuer, "aud": aud, "sub": "u-carol", "azp": "claude-code",
                "email": "carol@example.com", "groups": ["oncall"], "iat": now, "exp": now + 300}),
        )
    };
    let mcp = format!("{public}/mcp?policy=default/ops");
    let token = carol(&format!("{public}/mcp"));
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "obo-test", "version": "1"}}});
    // The tools are listed with Kortex's client credentials, before anyone asks.
    let session = crate::support::net::eventually("both remote tools listed", || {
        let (http, mcp, token, initialize) =
            (http.clone(), mcp.clone(), token.clone(), initialize.clone());
        async move {
            let (_, sid) = mcp_rpc(&http, &mcp, &token, None, initialize).await;
            let sid = sid.ok_or("no session")?;
            let (listed, _) = mcp_rpc(
                &http,
                &mcp,
                &token,
                Some(&sid),
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            )
            .await;
            let text = listed.to_string();
            (text.contains("remote__whoami") && text.contains("other__whoami"))
                .then_some(sid)
                .ok_or_else(|| listed.to_string())
        }
    })
    .await;
    assert!(p.token_calls().contains(&"client_credentials".to_owned()));
    assert!(p.exchanges().is_empty(), "listing exchanges nothing");
    let whoami = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "remote__whoami", "arguments": {}}});
    let (called, _) = mcp_rpc(&http, &mcp, &token, Some(&session), whoami.clone()).await;
    assert_eq!(
        called["result"]["content"][0]["text"], "u-carol (client kortex)",
        "{called}"
    );
    assert_eq!(
        p.exchanges(),
        ["urn:ietf:params:oauth:token-type:access_token"]
    );

    // In a run: an A2A task with carol's token for Kortex; the model calls the tool.
    push(
        &script,
        crate::support::provider::tool_calls(&[("w1", "remote__whoami", json!({}))]),
    );
    push_answer(&script, &["Checked as you."]);
    let task: Value = http
        .post(format!("{public}/a2a/v1/default/ops"))
        .bearer_auth(carol(&public))
        .json(&json!({"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "who am I to grafana?"}]}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        task["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{task}"
    );
    let seen = chat_requests(&script)
        .iter()
        .find_map(|b| tool_result(b, "w1"))
        .unwrap_or_default();
    assert!(seen.contains("u-carol (client kortex)"), "{seen}");
    assert_eq!(p.exchanges().len(), 2, "carol's A2A token exchanged too");

    // A server whose authorization server did not issue carol's token never gets it (it
    // could replay it against Kortex): listed with client credentials there, refused on
    // carol's behalf.
    let other_call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "other__whoami", "arguments": {}}});
    let (refused, _) = mcp_rpc(&http, &mcp, &token, Some(&session), other_call).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        refused.to_string().contains("to its own issuer only"),
        "{refused}"
    );
    assert!(other_issuer.exchanges().is_empty());
    assert!(
        other_issuer
            .token_calls()
            .iter()
            .all(|g| g == "client_credentials"),
        "{:?}",
        other_issuer.token_calls()
    );

    // dave signs in with a chat key: there is no token of his to exchange.
    let (_, sid) = mcp_rpc(&http, &mcp, "dave-chat-key", None, initialize).await;
    let (refused, _) = mcp_rpc(&http, &mcp, "dave-chat-key", sid.as_deref(), whoami).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        refused.to_string().contains("on behalf of the chat user"),
        "{refused}"
    );
    assert_eq!(p.exchanges().len(), 2);
    let log = server.log();
    assert!(!log.contains(&token) && !log.contains(crate::support::oidc::CLIENT_SECRET));
    assert!(server.terminate().success());
}

/// The MCP Python SDK's OAuth client through `mcp_client.py`: lists the tools of `url`
/// with a token it gets itself, with client credentials; whether it did, and its output.
fn sdk_lists_tools(python: &str, url: &str, client: (&str, &str), issuer: &str) -> (bool, String) {
    use std::io::Write;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client.py");
    let mut child = std::process::Command::new(python)
        .arg(script)
        .args([
            "--url",
            url,
            "--oauth-client-id",
            client.0,
            "--oauth-client-secret",
            client.1,
            "--oauth-issuer",
            issuer,
            "--oauth-scope",
            "kortex:mcp",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json!([{"op": "list_tools"}]).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The real provider of the single sign-on tests (Debian's Glewlwyd) as the authorization
/// server of an MCP client: the official MCP Python SDK's OAuth client finds Glewlwyd from
/// Kortex's 401, gets a token with client credentials and Kortex's `/mcp` as the resource
/// indicator (Glewlwyd makes it the `aud` of an RS256 `at+jwt`), and lists the tools.
/// Glewlwyd's client tokens name the client as their subject and no person, and its
/// userinfo answers 404 for them: the caller is `client:mcp-agent`. A Glewlwyd token asked
/// for without the resource (its `aud` is then the scope list) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glewlwyd_is_the_authorization_server_of_an_mcp_client() {
    let Some(script) = crate::support::oidc::glewlwyd_script() else {
        return;
    };
    let Some(python) = crate::support::plugins::python_with_mcp() else {
        return;
    };
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            provider(
                "local",
                "type: ollama, baseUrl: 'http://127.0.0.1:9/v1', defaultModel: m",
            ),
            policy("ops", "sessions: ['*'], provider: local"),
        ]),
    )
    .unwrap();
    // Kortex's address first: Glewlwyd allows exactly its /mcp as a resource.
    let port = crate::support::net::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let provider_dir = dir.path().join("glewlwyd");
    let glewlwyd_port = crate::support::net::free_port();
    let issuer = format!("http://127.0.0.1:{glewlwyd_port}/api/oidc");
    let _glewlwyd = crate::support::oidc::Glewlwyd::start(
        script,
        &provider_dir,
        glewlwyd_port,
        &format!("{public}/auth/v1/oidc/callback"),
        &[("OIDC_RESOURCE", &format!("{public}/mcp"))],
    );
    std::fs::write(dir.path().join("client-secret"), "kortex-secret\n").unwrap();
    let secret_file = dir.path().join("client-secret").display().to_string();
    let (server, _) = resource_server(
        &m,
        dir.path(),
        port,
        &issuer,
        &[
            "--oidc-client-secret-file",
            &secret_file,
            "--oidc-username-claim",
            "preferred_username",
            "--oauth-scopes",
            "kortex:mcp",
        ],
    );
    let mcp = format!("{public}/mcp?policy=default/ops");
    // Seen twice under load: the SDK's pooled connection is dropped under it ("Server
    // disconnected without sending a response") between the 401 and the retried request;
    // a new client tries again, at most three times (not yet traced: Glewlwyd's server or
    // Kortex's; the next session looks).
    let mut tries = 0;
    let (ok, out) = loop {
        tries += 1;
        let (ok, out) = tokio::task::spawn_blocking({
            let (python, mcp, issuer) = (python.clone(), mcp.clone(), issuer.clone());
            move || sdk_lists_tools(&python, &mcp, ("mcp-agent", "mcp-agent-secret"), &issuer)
        })
        .await
        .unwrap();
        if ok || tries == 3 || !out.contains("Server disconnected without sending a response") {
            break (ok, out);
        }
    };
    assert!(
        ok && out.contains("get_incident_history"),
        "{out}\n{}",
        server.log()
    );

    // A Glewlwyd token without the resource indicator is not for Kortex.
    let http = http_client();
    let token: Value = http
        .post(format!("{issuer}/token"))
        .basic_auth("mcp-agent", Some("mcp-agent-secret"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("grant_type=client_credentials&scope=kortex%3Amcp")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = http
        .post(&mcp)
        .bearer_auth(token["access_token"].as_str().unwrap_or_default())
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "oauth-test", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let why = r.text().await.unwrap_or_default();
    assert!(why.contains("is for"), "{why}");
    // And wrong client credentials get no token at all.
    let (ok, out) = tokio::task::spawn_blocking({
        let (python, mcp, issuer) = (python.clone(), mcp.clone(), issuer.clone());
        move || sdk_lists_tools(&python, &mcp, ("mcp-agent", "not-the-secret"), &issuer)
    })
    .await
    .unwrap();
    assert!(!ok, "{out}");

    // Claude Code, configured as docs/mcp.md says (a pre-registered client, a fixed
    // callback port), finds that Kortex takes OAuth: its sign-in is then a person's, in the
    // browser.
    if let Ok(claude) = std::env::var("KORTEX_TEST_CLAUDE") {
        let home = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new(&claude)
                .args(args)
                .env("HOME", home.path())
                .env_remove("ANTHROPIC_API_KEY")
                .output()
                .unwrap();
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let added = run(&[
            "mcp",
            "add",
            "--scope",
            "user",
            "--transport",
            "http",
            "kortex",
            &mcp,
            "--client-id",
            "kortex-claude-code",
            "--callback-port",
            "33418",
        ]);
        assert!(added.contains("Added HTTP MCP server kortex"), "{added}");
        let listed = run(&["mcp", "list"]);
        assert!(listed.contains("Needs authentication"), "{listed}");
    }
    let log = server.log();
    assert!(!log.contains("mcp-agent-secret") && !log.contains("kortex-secret"));
    assert!(server.terminate().success());
}

/// `kortex serve` on the manifests `m` (database in `dir`) as an OAuth resource server:
/// single sign-on with `issuer` and its client `kortex`, listening on `port`, which is its
/// `--public-url`; with `extra` flags. The server and that URL.
fn resource_server(
    m: &std::path::Path,
    dir: &std::path::Path,
    port: u16,
    issuer: &str,
    extra: &[&str],
) -> (Server, String) {
    let public = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--oidc-issuer",
        issuer,
        "--oidc-client-id",
        CLIENT_ID,
        "--public-url",
        &public,
    ];
    args.extend(extra);
    let server = Server::start_at(m, &dir.join("k.db"), &listen, &args);
    (server, public)
}
