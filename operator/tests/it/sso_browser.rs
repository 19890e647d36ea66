//! Single sign-on through a real OpenID provider and a real browser (docs/sso.md): Debian's
//! Glewlwyd on 127.0.0.1 behind a TLS front, started by `tests/fixtures/oidc/glewlwyd.sh`,
//! and `kortex serve` built from this tree. Chromium clicks "Sign in with Glewlwyd", logs
//! in on Glewlwyd's own page, lands signed in with the user's groups, chats, approves a
//! proposal (its policy names the group that may), stays signed in past the ID token's
//! life (refreshed; Glewlwyd issues no new ID token on refresh), and signs out at the
//! provider too. No token is minted by the test. Skipped when Glewlwyd is missing, unless
//! `KORTEX_REQUIRE_GLEWLWYD=1` (the test script installs it and sets that).

use crate::support::browser::{passed, run_browser};
use crate::support::manifests::{docs, manifest_dir, policy, provider, secret};
use crate::support::provider::{Reply, mock, openai, streamed};
use crate::support::server::Server;
use serde_json::{Value, json};

const ANSWER: &str = "The checkout pods run out of memory; I proposed a restart.";

fn responder(body: &Value) -> Option<Reply> {
    let messages = body["messages"].as_array()?;
    let d = openai();
    if body["stream"] != true {
        return Some(crate::support::provider::json_reply(
            200,
            &(d.text_json)("Checkout"),
        ));
    }
    if messages.last()?["role"] == "tool" {
        return Some(streamed(&d, (d.text_stream)(&[ANSWER])));
    }
    let propose = json!({
        "action": "restart",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"},
        "rationale": "OOMKilled since the deploy.",
        "blastRadius": "checkout pods restart one at a time",
        "reversible": true
    })
    .to_string();
    Some(streamed(
        &d,
        (d.tools_stream)(&[("call_propose", "propose_action", &propose)]),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_with_the_company_provider_chats_approves_and_signs_out() {
    let Some(script) = crate::support::oidc::glewlwyd_script() else {
        return;
    };
    let (base, mock_script) = mock().await;
    *mock_script
        .responder
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("sso.yaml"),
        docs(&[
            secret("llm-keys", "openai: sk-sso-provider-key-1234"),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', \
                     apiKeySecretRef: {{name: llm-keys, key: openai}}, defaultModel: test-model, timeout: 10s"
                ),
            ),
            policy(
                "incidents",
                "sessions: [incident-*], provider: gpt, \
                 proposals: {allowedActions: [restart], allowedNamespaces: [shop], \
                 approverGroups: [oncall], requireDistinctApprover: false}",
            ),
        ]),
    )
    .unwrap();
    // The provider's address first (Kortex fetches discovery only when someone signs in),
    // then Kortex (its callback URL is registered at the provider), then the provider.
    let glewlwyd_port = crate::support::net::free_port();
    let (front, ca) = crate::support::tls_proxy::start(format!("127.0.0.1:{glewlwyd_port}")).await;
    let issuer = format!("{front}/api/oidc");
    std::fs::write(dir.path().join("ca.pem"), &ca).unwrap();
    std::fs::write(dir.path().join("client-secret"), "kortex-secret\n").unwrap();
    std::fs::write(
        dir.path().join("session-key"),
        "a session key of at least thirty-two bytes\n",
    )
    .unwrap();
    let path = |f: &str| dir.path().join(f).display().to_string();
    let db = format!("sqlite://{}", path("k.db"));
    let manifests = m.display().to_string();
    let server = Server::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--manifests",
            &manifests,
            "--database-url",
            &db,
            "--oidc-issuer",
            &issuer,
            "--oidc-client-id",
            "kortex",
            "--oidc-client-secret-file",
            &path("client-secret"),
            "--oidc-ca-file",
            &path("ca.pem"),
            "--oidc-username-claim",
            "preferred_username",
            "--oidc-name",
            "Glewlwyd",
            "--oidc-scopes",
            "openid,profile,email,groups",
            "--session-key-file",
            &path("session-key"),
        ],
        &[],
    );
    let kortex = server.url("").trim_end_matches('/').to_owned();
    let provider_dir = dir.path().join("glewlwyd");
    let _guard = crate::support::oidc::Glewlwyd::start(
        script,
        &provider_dir,
        glewlwyd_port,
        &format!("{kortex}/auth/v1/oidc/callback"),
        &[("OIDC_ISSUER", &issuer), ("OIDC_TOKEN_SECONDS", "20")],
    );
    let env = [
        ("KORTEX_URL", kortex.as_str()),
        ("PROVIDER_URL", front.as_str()),
        ("KORTEX_ANSWER", ANSWER),
        ("TOKEN_SECONDS", "20"),
    ];
    let Some(out) = run_browser("sso.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    let log = server.log();
    for secret in ["kortex-secret", "eyJ"] {
        assert!(!log.contains(secret), "{secret} reached the log");
    }
    assert!(
        log.contains("signed in with the identity provider"),
        "{log}"
    );
    assert!(server.terminate().success());
}
