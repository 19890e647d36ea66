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
    let port = crate::support::net::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    let listen = format!("127.0.0.1:{port}");
    let manifests = m.display().to_string();
    let server = Server::spawn(
        &[
            "serve",
            "--listen",
            &listen,
            "--manifests",
            &manifests,
            "--database-url",
            &db,
            "--oidc-issuer",
            &p.issuer,
            "--oidc-client-id",
            CLIENT_ID,
            "--public-url",
            &public,
            "--oauth-scopes",
            "kortex:mcp",
        ],
        &[],
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
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client.py");
        let mut child = std::process::Command::new(python)
            .arg(script)
            .args([
                "--url",
                &mcp,
                "--oauth-client-id",
                CLIENT_ID,
                "--oauth-client-secret",
                crate::support::oidc::CLIENT_SECRET,
                "--oauth-issuer",
                &p.issuer,
                "--oauth-scope",
                "kortex:mcp",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(json!([{"op": "list_tools"}]).to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("get_incident_history"), "{stdout}");
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
