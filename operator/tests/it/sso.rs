//! Single sign-on against a scripted provider (docs/sso.md): the authorization code flow
//! with PKCE, `state` and `nonce`; the session every replica with the same key reads; its
//! refresh and sign-out; and every hostile token, state and cookie refused with words a
//! person can act on. The flow through a real provider and a real browser is
//! `tests/browser/sso.mjs` (Glewlwyd).

use crate::support::app::{Harness, call, harness_with};
use crate::support::net::header;
use crate::support::oidc::{CLIENT_ID, CLIENT_SECRET, Provider, Refresh};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use kortex::http::auth::AuthMode;
use kortex::http::sso::{KubeMode, Sso};
use kortex::oidc::jwt::base64url_encode as b64;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

const CALLBACK: &str = "http://127.0.0.1:8080/auth/v1/oidc/callback";

fn sso(p: &Provider, key: &[u8], allowed_groups: &[&str]) -> Arc<Sso> {
    let settings = kortex::oidc::Settings {
        issuer: p.issuer.clone(),
        client_id: CLIENT_ID.into(),
        client_secret: Some(kortex::catalog::SecretValue::new(CLIENT_SECRET)),
        scopes: vec!["openid".into(), "email".into(), "groups".into()],
        username_claim: "email".into(),
        groups_claim: "groups".into(),
        username_prefix: String::new(),
        groups_prefix: String::new(),
        allowed_groups: allowed_groups.iter().map(|g| (*g).to_owned()).collect(),
        allowed_domains: Vec::new(),
        audience: None,
        display_name: "Scripted".into(),
        ca_pem: None,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let provider = kortex::oidc::Provider::new(
        settings,
        &Arc::new(kortex::egress::Egress::standalone(Default::default())),
    )
    .unwrap();
    Arc::new(Sso::new(
        provider,
        kortex::oidc::SessionKey::from_secret(key).unwrap(),
        KubeMode::Off,
        Some(CALLBACK.into()),
    ))
}

const KEY_A: &[u8] = b"replica key a: 0123456789abcdef0123456789";
const KEY_B: &[u8] = b"replica key b: 0123456789abcdef0123456789";

fn request(method: &str, path: &str, cookies: &[&str]) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:8080");
    if !cookies.is_empty() {
        r = r.header("cookie", cookies.join("; "));
    }
    r.body(Body::empty()).unwrap()
}

/// `name=value` of the cookie `name` a response set (not a deletion).
fn set_cookie(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
        .find(|c| c.starts_with(&format!("{name}=")) && c.len() > name.len() + 1)
}

struct Started {
    state: String,
    nonce: String,
    challenge: String,
    cookie: String,
    authorize: HashMap<String, String>,
}

async fn start(app: &axum::Router) -> Started {
    let (status, headers, body) = call(
        app,
        request("GET", "/auth/v1/oidc/login?return=/%23/chat", &[]),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let location = header(&headers, "location");
    let url = reqwest::Url::parse(&location).unwrap();
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    Started {
        state: q["state"].clone(),
        nonce: q["nonce"].clone(),
        challenge: q["code_challenge"].clone(),
        cookie: set_cookie(&headers, "kortex_sign_in").expect("the state cookie"),
        authorize: q,
    }
}

/// The provider sends the browser back with `code`.
async fn finish(app: &axum::Router, s: &Started, code: &str) -> axum::http::HeaderMap {
    let path = format!("/auth/v1/oidc/callback?code={code}&state={}", s.state);
    let (status, headers, _) = call(app, request("GET", &path, &[&s.cookie])).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    headers
}

/// What the sign-in page says after a failed callback.
async fn sign_in_error(app: &axum::Router, headers: &axum::http::HeaderMap) -> String {
    assert!(
        set_cookie(headers, "kortex_session").is_none(),
        "no session may be opened"
    );
    assert_eq!(header(headers, "location"), "/");
    let cookie = set_cookie(headers, "kortex_sign_in_error").expect("the error cookie");
    let (_, _, body) = call(app, request("GET", "/auth/v1/sign-in", &[&cookie])).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    v["error"].as_str().unwrap_or_default().to_owned()
}

/// Signs in with an ID token of `claims` (signed with `k1`); the session cookies.
async fn signed_in(
    app: &axum::Router,
    p: &Provider,
    claims: impl Fn(&str) -> Value,
) -> Vec<String> {
    let s = start(app).await;
    p.issue("code-ok", &s.challenge, &p.sign("k1", &claims(&s.nonce)));
    let headers = finish(app, &s, "code-ok").await;
    assert_eq!(header(&headers, "location"), "/#/chat");
    vec![
        set_cookie(&headers, "kortex_session").expect("a session cookie"),
        set_cookie(&headers, "kortex_csrf").expect("a CSRF cookie"),
    ]
}

async fn me(app: &axum::Router, cookies: &[String]) -> (StatusCode, Value) {
    let refs: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let (status, _, body) = call(app, request("GET", "/auth/v1/me", &refs)).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn setup(allowed_groups: &[&str]) -> (Provider, Harness) {
    let p = Provider::start().await;
    let h = harness_with(AuthMode::Keys, Some(sso(&p, KEY_A, allowed_groups))).await;
    (p, h)
}

#[tokio::test]
async fn signing_in_opens_a_session_that_refreshes_and_ends_when_the_provider_refuses() {
    let (p, h) = setup(&[]).await;
    let s = start(&h.app).await;
    // The authorization request: a code with PKCE (S256), state, nonce, the registered
    // callback and the scopes.
    assert_eq!(s.authorize["response_type"], "code");
    assert_eq!(s.authorize["code_challenge_method"], "S256");
    assert_eq!(s.authorize["redirect_uri"], CALLBACK);
    assert_eq!(s.authorize["client_id"], CLIENT_ID);
    assert_eq!(s.authorize["scope"], "openid email groups");
    assert!(s.state.len() >= 43 && s.nonce.len() >= 43 && s.state != s.nonce);
    // The session cookie is HttpOnly and SameSite=Lax.
    p.issue("c1", &s.challenge, &p.sign("k1", &p.claims(&s.nonce, 600)));
    let headers = finish(&h.app, &s, "c1").await;
    let raw: Vec<String> = headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let session = raw
        .iter()
        .find(|c| c.starts_with("kortex_session="))
        .unwrap();
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Lax"),
        "{session}"
    );
    let cookies = vec![
        set_cookie(&headers, "kortex_session").unwrap(),
        set_cookie(&headers, "kortex_csrf").unwrap(),
    ];
    let (status, who) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::OK, "{who}");
    assert_eq!(who["user"], "alice@example.com");
    assert_eq!(who["groups"], json!(["oncall", "platform"]));
    assert_eq!(who["sso"]["provider"], "Scripted");
    assert_eq!(who["kubernetesMode"], Value::Null);
    // The database (its file and its write-ahead log) holds no token and no session id
    // that would work.
    let path = h.db.url.trim_start_matches("sqlite://").to_owned();
    let mut bytes = std::fs::read(&path).unwrap_or_default();
    bytes.extend(std::fs::read(format!("{path}-wal")).unwrap_or_default());
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("alice@example.com"), "the row is there");
    let session_id = cookies[0].split_once('=').unwrap().1;
    for secret in ["eyJ", "rt-1", "at-1", session_id] {
        assert!(!text.contains(secret), "{secret} is in the database");
    }
    // A cookie-authenticated change without the CSRF header is refused.
    let refs: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let (status, _, body) = call(&h.app, request("POST", "/chat/v1/sessions", &refs)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("csrf_failed"));

    // An ID token about to expire is renewed with the refresh token before it does.
    let p2 = p.clone();
    let near_expiry = move |nonce: &str| {
        let mut c = p2.claims(nonce, 10);
        c["iat"] = json!(c["iat"].as_i64().unwrap() - 590);
        c
    };
    let cookies = signed_in(&h.app, &p, &near_expiry).await;
    let mut renewed = near_expiry("");
    renewed.as_object_mut().unwrap().remove("nonce");
    p.on_refresh(Refresh::Renew(Some(renewed)));
    let (status, who) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::OK, "{who}");
    assert_eq!(
        p.token_calls().last().map(String::as_str),
        Some("refresh_token")
    );
    // The provider refuses the next refresh: the session ends, and says so.
    p.on_refresh(Refresh::Refuse);
    let (status, why) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(why["error"]["code"], "signed_out");
    let message = why["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("refused to renew") && message.contains("invalid_grant"),
        "{message}"
    );
    let (status, why) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        why["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has ended")
    );
}

#[tokio::test]
async fn a_provider_that_gives_no_new_id_token_on_refresh_keeps_the_session() {
    let (p, h) = setup(&[]).await;
    let cookies = signed_in(&h.app, &p, |nonce| {
        let mut c = p.claims(nonce, 10);
        c["iat"] = json!(c["iat"].as_i64().unwrap() - 590);
        c
    })
    .await;
    p.on_refresh(Refresh::Renew(None));
    let (status, who) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::OK, "{who}");
    assert_eq!(who["user"], "alice@example.com");
    // Renewed by the access token's life (600 s): no second refresh on the next request.
    let (status, _) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::OK);
    let refreshes = p
        .token_calls()
        .iter()
        .filter(|g| *g == "refresh_token")
        .count();
    assert_eq!(refreshes, 1);
}

#[tokio::test]
async fn signing_out_ends_the_session_everywhere_and_at_the_provider() {
    let (p, h) = setup(&[]).await;
    let cookies = signed_in(&h.app, &p, |n| p.claims(n, 600)).await;
    let csrf = cookies[1].split_once('=').unwrap().1.to_owned();
    let refs: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let mut req = request("POST", "/auth/v1/logout", &refs);
    req.headers_mut()
        .insert("x-csrf-token", csrf.parse().unwrap());
    let (status, headers, body) = call(&h.app, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let end: Value = serde_json::from_str(&body).unwrap();
    let url = reqwest::Url::parse(end["endSessionUrl"].as_str().unwrap()).unwrap();
    assert!(url.as_str().starts_with(&format!("{}/logout", p.issuer)));
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert!(q["id_token_hint"].starts_with("eyJ"));
    assert_eq!(q["post_logout_redirect_uri"], "http://127.0.0.1:8080/");
    assert!(
        headers
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("kortex_session=;")),
        "the cookie is cleared"
    );
    // The row is gone: the old cookie is refused on any replica.
    let (status, _) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_session_is_read_by_every_replica_with_the_same_key_and_refused_with_another() {
    let (p, h) = setup(&[]).await;
    let cookies = signed_in(&h.app, &p, |n| p.claims(n, 600)).await;
    let same = h.replica(AuthMode::Keys, Some(sso(&p, KEY_A, &[])));
    let (status, who) = me(&same, &cookies).await;
    assert_eq!(status, StatusCode::OK, "{who}");
    assert_eq!(who["user"], "alice@example.com");
    let other = h.replica(AuthMode::Keys, Some(sso(&p, KEY_B, &[])));
    let (status, why) = me(&other, &cookies).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let message = why["error"]["message"].as_str().unwrap();
    assert!(message.contains("another session key"), "{message}");
    // A forged cookie is nobody.
    let (status, _) = me(&h.app, &["kortex_session=forged".to_owned()]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

fn unsigned(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

#[tokio::test]
async fn hostile_id_tokens_are_refused_with_what_was_wrong() {
    let (p, h) = setup(&[]).await;
    // Each case: the ID token the provider hands over, and what the sign-in page says.
    type Make = Box<dyn Fn(&Provider, &str) -> String>;
    // Claims Kortex would accept, changed by `f`, signed with the published key.
    fn altered(f: impl Fn(&mut Value) + 'static) -> Make {
        Box::new(move |p, n| {
            let mut c = p.claims(n, 600);
            f(&mut c);
            p.sign("k1", &c)
        })
    }
    let now = jiff::Timestamp::now().as_second();
    let cases: Vec<(&str, Make, &str)> = vec![
        (
            "wrong issuer",
            altered(|c| c["iss"] = json!("https://evil.example.com")),
            "issued by https://evil.example.com",
        ),
        (
            "wrong audience",
            altered(|c| c["aud"] = json!("another-client")),
            "is for another-client",
        ),
        (
            "expired",
            altered(move |c| {
                c["iat"] = json!(now - 7200);
                c["exp"] = json!(now - 3600);
            }),
            "expired",
        ),
        (
            "issued in the future",
            altered(move |c| {
                c["iat"] = json!(now + 600);
                c["exp"] = json!(now + 1200);
            }),
            "check the clocks",
        ),
        (
            "missing nonce",
            altered(|c| {
                c.as_object_mut().unwrap().remove("nonce");
            }),
            "nonce does not match",
        ),
        (
            "alg none",
            Box::new(|p, n| {
                format!(
                    "{}.",
                    unsigned(&json!({"alg": "none", "typ": "JWT"}), &p.claims(n, 600))
                )
            }),
            "algorithm none is not accepted",
        ),
        (
            "HS256 with the public key",
            Box::new(|p, n| {
                let input = unsigned(
                    &json!({"alg": "HS256", "typ": "JWT", "kid": "k1"}),
                    &p.claims(n, 600),
                );
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &p.public_key("k1"));
                let tag = ring::hmac::sign(&key, input.as_bytes());
                format!("{input}.{}", b64(tag.as_ref()))
            }),
            "algorithm HS256 is not accepted",
        ),
        (
            "another sign-in's nonce",
            Box::new(|p, _| p.sign("k1", &p.claims("someone-elses-nonce", 600))),
            "nonce does not match",
        ),
        (
            "a forged signature",
            Box::new(|p, n| {
                let good = p.sign("k1", &p.claims(n, 600));
                let (input, _) = good.rsplit_once('.').unwrap();
                let other = p.sign("k1", &p.claims("x", 600));
                format!("{input}.{}", other.rsplit_once('.').unwrap().1)
            }),
            "signature does not verify",
        ),
    ];
    for (i, (what, make, says)) in cases.iter().enumerate() {
        let s = start(&h.app).await;
        let code = format!("code-{i}");
        p.issue(&code, &s.challenge, &make(&p, &s.nonce));
        let headers = finish(&h.app, &s, &code).await;
        let error = sign_in_error(&h.app, &headers).await;
        assert!(error.contains(says), "{what}: the page says {error:?}");
        assert!(!error.contains("eyJ"), "{what}: a token in the message");
    }
}

#[tokio::test]
async fn an_unknown_key_fetches_the_key_set_once_then_is_refused_and_a_rotated_key_is_found() {
    let (p, h) = setup(&[]).await;
    signed_in(&h.app, &p, |n| p.claims(n, 600)).await;
    let fetched = p.jwks_fetches();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for attempt in 0..2 {
        let s = start(&h.app).await;
        let code = format!("unknown-{attempt}");
        p.issue(
            &code,
            &s.challenge,
            &p.sign_unpublished("k9", &p.claims(&s.nonce, 600)),
        );
        let headers = finish(&h.app, &s, &code).await;
        let error = sign_in_error(&h.app, &headers).await;
        assert!(error.contains("no key k9"), "{error}");
    }
    assert_eq!(
        p.jwks_fetches(),
        fetched + 1,
        "one re-fetch for k9, not one per attempt"
    );
    // The provider rotates to a new key: found with one more fetch.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let s = start(&h.app).await;
    p.issue(
        "rotated",
        &s.challenge,
        &p.sign("k2", &p.claims(&s.nonce, 600)),
    );
    let headers = finish(&h.app, &s, "rotated").await;
    assert!(
        set_cookie(&headers, "kortex_session").is_some(),
        "signed in with the rotated key"
    );
    assert_eq!(p.jwks_fetches(), fetched + 2);
}

#[tokio::test]
async fn replayed_and_foreign_states_are_refused() {
    let (p, h) = setup(&[]).await;
    let s = start(&h.app).await;
    p.issue(
        "once",
        &s.challenge,
        &p.sign("k1", &p.claims(&s.nonce, 600)),
    );
    let headers = finish(&h.app, &s, "once").await;
    assert!(set_cookie(&headers, "kortex_session").is_some());
    // The same state again (a replayed callback URL with its cookie).
    p.issue(
        "once",
        &s.challenge,
        &p.sign("k1", &p.claims(&s.nonce, 600)),
    );
    let headers = finish(&h.app, &s, "once").await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(
        error.contains("already completed or has expired"),
        "{error}"
    );
    // A state this browser was not given (a sign-in planted by another site).
    let s = start(&h.app).await;
    let path = format!("/auth/v1/oidc/callback?code=x&state={}", s.state);
    let (_, headers, _) = call(&h.app, request("GET", &path, &["kortex_sign_in=another"])).await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(error.contains("not started in this browser"), "{error}");
    // The provider's own refusal is named.
    let s = start(&h.app).await;
    let path = format!(
        "/auth/v1/oidc/callback?error=access_denied&error_description=user+cancelled&state={}",
        s.state
    );
    let (_, headers, _) = call(&h.app, request("GET", &path, &[&s.cookie])).await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(
        error.contains("denied the sign-in: user cancelled"),
        "{error}"
    );
    // A wrong PKCE verifier: the provider refuses the code (its code is bound to the
    // challenge Kortex sent).
    let s = start(&h.app).await;
    p.issue(
        "pkce",
        "another-challenge",
        &p.sign("k1", &p.claims(&s.nonce, 600)),
    );
    let headers = finish(&h.app, &s, "pkce").await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(error.contains("invalid_grant"), "{error}");
}

#[tokio::test]
async fn a_group_not_allowed_and_an_unreachable_issuer_are_named_on_the_sign_in_page() {
    let (p, h) = setup(&["admins"]).await;
    let s = start(&h.app).await;
    let bob = p.claims_for(&s.nonce, 600, "bob@example.com", &["viewers"]);
    p.issue("c", &s.challenge, &p.sign("k1", &bob));
    let headers = finish(&h.app, &s, "c").await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(
        error.contains("bob@example.com is in none of the groups allowed to sign in (admins)")
            && error.contains("viewers"),
        "{error}"
    );
    // The issuer cannot be reached: the button leads back to the page, which says so.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut gone = p.clone();
    gone.issuer = dead.clone();
    let h2 = harness_with(AuthMode::Keys, Some(sso(&gone, KEY_A, &[]))).await;
    let (status, headers, _) = call(&h2.app, request("GET", "/auth/v1/oidc/login", &[])).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let error = sign_in_error(&h2.app, &headers).await;
    assert!(
        error.contains(&format!(
            "{dead}/.well-known/openid-configuration cannot be reached"
        )),
        "{error}"
    );
    // The page offers the provider's button.
    let (_, _, body) = call(&h.app, request("GET", "/auth/v1/sign-in", &[])).await;
    let options: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(options["oidc"]["name"], "Scripted");
    assert_eq!(options["error"], Value::Null);
}

/// A browser's sign-in against `kortex run` over HTTP (no redirects followed): the
/// provider hands over `id_token(nonce)`; the cookies to send.
async fn sign_in_over_http(
    server: &crate::support::server::Server,
    p: &Provider,
    id_token: impl Fn(&str) -> String,
) -> (String, String) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client
        .get(server.url("/auth/v1/oidc/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303, "{}", server.log());
    let location = reqwest::Url::parse(&header(r.headers(), "location")).unwrap();
    let q: HashMap<String, String> = location.query_pairs().into_owned().collect();
    let cookie = set_cookie(r.headers(), "kortex_sign_in").unwrap();
    p.issue("cluster-code", &q["code_challenge"], &id_token(&q["nonce"]));
    let r = client
        .get(server.url(&format!(
            "/auth/v1/oidc/callback?code=cluster-code&state={}",
            q["state"]
        )))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let session = set_cookie(r.headers(), "kortex_session")
        .unwrap_or_else(|| panic!("not signed in: {:?}\n{}", r.headers(), server.log()));
    let csrf = set_cookie(r.headers(), "kortex_csrf").unwrap();
    (
        format!("{session}; {csrf}"),
        csrf.split_once('=').unwrap().1.to_owned(),
    )
}

/// Cluster mode: with `--oidc-kubernetes token` the signed-in user's ID token is their
/// bearer token — the API server names them (TokenReview), the tools read and the
/// dashboard's decision is written with it; with `impersonate`, Kortex's own client
/// impersonates exactly the user and groups the verified ID token named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_mode_the_signed_in_user_reads_and_decides_as_themselves() {
    use crate::support::fake_api::{incidents_cluster, phase};
    use crate::support::provider::{push, push_answer, tool_calls};
    use crate::support::server::start_run_with;
    let _ = rustls::crypto::ring::default_provider().install_default();
    for mode in ["token", "impersonate"] {
        // Behind TLS, as providers are: Kortex trusts its certificate through
        // --oidc-ca-file.
        let (p, ca) = Provider::start_tls().await;
        let (fake, llm, script) = incidents_cluster(json!({"allowedActions": ["restart"],
            "allowedNamespaces": ["shop"], "requireDistinctApprover": false}))
        .await;
        let (user, groups) = if mode == "token" {
            (
                "oidc:alice@example.com",
                json!(["system:authenticated", "oidc:oncall", "oidc:platform"]),
            )
        } else {
            // As the API server sees the impersonated alice.
            (
                "alice@example.com",
                json!(["oncall", "platform", "system:authenticated"]),
            )
        };
        fake.allow(user);
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("client-secret");
        std::fs::write(&secret, CLIENT_SECRET).unwrap();
        let secret = secret.display().to_string();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca).unwrap();
        let ca_file = ca_file.display().to_string();
        let server = start_run_with(
            &fake,
            dir.path(),
            &llm,
            &[
                "--oidc-issuer",
                &p.issuer,
                "--oidc-client-id",
                CLIENT_ID,
                "--oidc-client-secret-file",
                &secret,
                "--oidc-kubernetes",
                mode,
                "--oidc-ca-file",
                &ca_file,
            ],
        )
        .await;
        let id_token = std::sync::Mutex::new(String::new());
        let (cookies, csrf) = sign_in_over_http(&server, &p, |nonce| {
            let mut claims = p.claims(nonce, 600);
            if mode == "impersonate" {
                // A group of the API server's own is never taken (impersonated, or passed
                // to a SubjectAccessReview), whatever the provider says.
                claims["groups"] = json!(["oncall", "platform", "system:masters"]);
            }
            let t = p.sign("k1", &claims);
            *id_token.lock().unwrap() = t.clone();
            t
        })
        .await;
        let id_token = id_token.into_inner().unwrap();
        let client = reqwest::Client::new();
        let call = |method: reqwest::Method, path: &str, body: Value| {
            client
                .request(method, server.url(path))
                .header("cookie", &cookies)
                .header("x-csrf-token", &csrf)
                .json(&body)
                .send()
        };
        let me: Value = call(reqwest::Method::GET, "/auth/v1/me", Value::Null)
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(me["user"], user, "{mode}: {me}");
        assert_eq!(me["groups"], groups, "{mode}");
        let shown = if mode == "token" {
            "token"
        } else {
            "impersonation"
        };
        assert_eq!(me["kubernetesMode"], shown, "{mode}");
        assert_eq!(me["sso"]["kubernetes"], shown, "{mode}");

        let r = call(
            reqwest::Method::POST,
            "/chat/v1/sessions",
            json!({"name": "incident-sso", "namespace": "team-a"}),
        )
        .await
        .unwrap();
        assert_eq!(
            r.status().as_u16(),
            201,
            "{mode}: {}",
            r.text().await.unwrap_or_default()
        );
        let created: Value = r.json().await.unwrap_or_default();
        let id = created["id"].as_str().unwrap_or_default().to_owned();
        // The model reads the Deployment (runToolsAsUser is the default), then proposes.
        push(
            &script,
            tool_calls(&[(
                "r1",
                "get_resource",
                json!({"kind": "Deployment", "namespace": "shop", "name": "api"}),
            )]),
        );
        push(
            &script,
            tool_calls(&[(
                "p1",
                "propose_action",
                json!({"action": "restart",
                    "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                    "rationale": "stuck"}),
            )]),
        );
        push_answer(&script, &["Proposed."]);
        let r = call(
            reqwest::Method::POST,
            &format!("/chat/v1/sessions/{id}/messages"),
            json!({"content": "restart api"}),
        )
        .await
        .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{mode}");
        let as_user = |s: &crate::support::fake_api::Seen| match mode {
            "token" => s.token == id_token && s.impersonate.is_none(),
            _ => {
                s.token != id_token
                    && s.impersonate
                        == Some((
                            user.to_owned(),
                            vec!["oncall".to_owned(), "platform".to_owned()],
                        ))
            }
        };
        fake.until("the read as alice", |f| {
            f.seen().iter().any(|s| {
                s.method == "GET"
                    && s.path == "/apis/apps/v1/namespaces/shop/deployments/api"
                    && as_user(s)
            })
        })
        .await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let proposal = loop {
            let list: Value = call(reqwest::Method::GET, "/chat/v1/proposals", Value::Null)
                .await
                .unwrap()
                .json()
                .await
                .unwrap_or_default();
            if let Some(p) = list["items"].as_array().and_then(|a| a.first()).cloned() {
                break p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mode}: no proposal\n{}",
                server.log()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        let name = proposal["name"].as_str().unwrap_or_default().to_owned();
        fake.until("its status", |f| phase(f, &name) == "Pending")
            .await;
        let r = call(
            reqwest::Method::POST,
            &format!(
                "/chat/v1/proposals/{}/approve",
                proposal["id"].as_str().unwrap_or_default()
            ),
            json!({"reason": "signed in"}),
        )
        .await
        .unwrap();
        assert_eq!(
            r.status().as_u16(),
            200,
            "{mode}: {}",
            r.text().await.unwrap_or_default()
        );
        let patch = fake
            .seen()
            .into_iter()
            .find(|s| {
                s.method == "PATCH"
                    && s.path
                        == format!(
                            "/apis/kortex.dev/v1alpha1/namespaces/shop/actionproposals/{name}"
                        )
            })
            .expect("no decision patch");
        assert!(
            as_user(&patch),
            "{mode}: the decision was not written as alice: {patch:?}"
        );
        assert_eq!(patch.body["spec"]["decision"]["by"], user);
        // Every group the API server sees, which the admission policy requires.
        assert_eq!(patch.body["spec"]["decision"]["groups"], groups, "{mode}");
        assert!(
            !server.log().contains(&id_token),
            "the ID token reached the log"
        );
        assert!(server.terminate().success());
    }
}

/// `kortex login`: the browser signs in through the server, the CLI gets a one-time code on
/// its loopback port and exchanges it (with its PKCE verifier) for the session's token, kept
/// 0600; `kortex proposals list` then uses it; `kortex logout` ends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_login_keeps_a_token_that_the_cli_uses_until_logout() {
    use crate::support::server::{BIN, Server};
    use tokio::io::AsyncBufReadExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = Provider::start().await;
    let (dir, m) = crate::support::manifests::manifest_dir();
    let secret = dir.path().join("client-secret");
    std::fs::write(&secret, CLIENT_SECRET).unwrap();
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    let server = Server::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--manifests",
            &m.display().to_string(),
            "--database-url",
            &db,
            "--oidc-issuer",
            &p.issuer,
            "--oidc-client-id",
            CLIENT_ID,
            "--oidc-client-secret-file",
            &secret.display().to_string(),
        ],
        &[],
    );
    let base = server.url("").trim_end_matches('/').to_owned();
    let config = dir.path().join("home/credentials.json");
    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(BIN);
        c.args(args)
            .env("KORTEX_CONFIG", &config)
            .env_remove("KORTEX_API_KEY")
            .env_remove("KORTEX_SERVER");
        c
    };
    // Signed out, the CLI is refused.
    let out = cli(&["proposals", "list", "--server", &base])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );

    let mut login =
        tokio::process::Command::from(cli(&["login", "--server", &base, "--no-browser"]));
    let mut child = login
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next_line().await.unwrap().expect("the sign-in URL");
        if let Some(u) = line.trim().strip_prefix(&format!("{base}/")) {
            break format!("{base}/{u}");
        }
    };
    // The browser's part: the server, the provider, the server, the CLI's loopback port.
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = browser.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303, "{}", server.log());
    let cookie = set_cookie(r.headers(), "kortex_sign_in").unwrap();
    let location = reqwest::Url::parse(&header(r.headers(), "location")).unwrap();
    let q: HashMap<String, String> = location.query_pairs().into_owned().collect();
    p.issue(
        "cli-code",
        &q["code_challenge"],
        &p.sign("k1", &p.claims(&q["nonce"], 600)),
    );
    let r = browser
        .get(format!(
            "{base}/auth/v1/oidc/callback?code=cli-code&state={}",
            q["state"]
        ))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let back = header(r.headers(), "location");
    assert!(
        back.starts_with("http://127.0.0.1:") && back.contains("/callback?code="),
        "{back}"
    );
    assert!(
        set_cookie(r.headers(), "kortex_session").is_none(),
        "the CLI's session is not the browser's"
    );
    let page = browser
        .get(&back)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Signed in to Kortex"), "{page}");
    let status = child.wait().await.unwrap();
    let mut said = String::new();
    while let Ok(Some(l)) = lines.next_line().await {
        said.push_str(&l);
    }
    assert!(status.success(), "kortex login failed: {said}");
    assert!(
        said.contains("as alice@example.com (oncall, platform)"),
        "{said}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is the user's alone");
    let kept = std::fs::read_to_string(&config).unwrap();
    assert!(
        kept.contains("kortex-session-") && !kept.contains("eyJ"),
        "{kept}"
    );
    // The code was for one exchange.
    let code = back.split("code=").nth(1).unwrap();
    let again = reqwest::Client::new()
        .post(format!("{base}/auth/v1/oidc/token"))
        .json(&json!({"code": code, "verifier": "x".repeat(43)}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 401);

    let out = cli(&["proposals", "list", "--server", &base])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = cli(&["logout", "--server", &base]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !std::fs::read_to_string(&config)
            .unwrap()
            .contains("kortex-session-")
    );
    let out = cli(&["proposals", "list", "--server", &base])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(server.terminate().success());
}

/// Token mode with a provider that renews no ID token (Glewlwyd): once the ID token has
/// expired the API answers `reauthenticate`, and the silent sign-in the dashboard then
/// starts names the old ID token (`id_token_hint`, which Glewlwyd requires) and replaces
/// the old session.
#[tokio::test]
async fn an_id_token_the_provider_does_not_renew_leads_to_a_silent_sign_in() {
    let p = Provider::start().await;
    let mut sso = sso(&p, KEY_A, &[]);
    Arc::get_mut(&mut sso).unwrap().kube = KubeMode::Token;
    let h = harness_with(AuthMode::Keys, Some(sso)).await;
    let first = std::sync::Mutex::new(String::new());
    let cookies = signed_in(&h.app, &p, |nonce| {
        let mut c = p.claims(nonce, 2);
        c["iat"] = json!(c["iat"].as_i64().unwrap() - 598);
        c
    })
    .await;
    p.on_refresh(Refresh::Renew(None));
    let (status, who) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::OK, "{who}");
    assert_eq!(who["kubernetesMode"], "token");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (status, why) = me(&h.app, &cookies).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(why["error"]["code"], "reauthenticate", "{why}");
    // The dashboard's silent sign-in.
    let refs: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let (status, headers, _) = call(
        &h.app,
        request(
            "GET",
            "/auth/v1/oidc/login?prompt=none&return=/%23/status",
            &refs,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let url = reqwest::Url::parse(&header(&headers, "location")).unwrap();
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert_eq!(q["prompt"], "none");
    assert!(q["id_token_hint"].starts_with("eyJ"), "{q:?}");
    *first.lock().unwrap() = q["id_token_hint"].clone();
    let state_cookie = set_cookie(&headers, "kortex_sign_in").unwrap();
    p.issue(
        "silent",
        &q["code_challenge"],
        &p.sign("k1", &p.claims(&q["nonce"], 600)),
    );
    let path = format!("/auth/v1/oidc/callback?code=silent&state={}", q["state"]);
    let mut with = refs.clone();
    with.push(&state_cookie);
    let (_, headers, _) = call(&h.app, request("GET", &path, &with)).await;
    assert_eq!(header(&headers, "location"), "/#/status");
    let renewed = vec![
        set_cookie(&headers, "kortex_session").unwrap(),
        set_cookie(&headers, "kortex_csrf").unwrap(),
    ];
    assert_eq!(me(&h.app, &renewed).await.0, StatusCode::OK);
    assert_eq!(
        me(&h.app, &cookies).await.0,
        StatusCode::UNAUTHORIZED,
        "the old session was replaced"
    );
    // A silent sign-in the provider cannot answer without a page says the sign-in ended.
    let s = start(&h.app).await;
    let path = format!(
        "/auth/v1/oidc/callback?error=login_required&state={}",
        s.state
    );
    let (_, headers, _) = call(&h.app, request("GET", &path, &[&s.cookie])).await;
    let error = sign_in_error(&h.app, &headers).await;
    assert!(error.contains("login_required"), "{error}");
}

/// `--oidc-client-secret-ref`: the client secret comes from a Secret of Kortex's namespace
/// only when it carries `kortex.dev/use: "true"`; without the label Kortex does not start and
/// says why; with it, the provider's token endpoint gets the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_secret_is_read_only_from_an_opted_in_secret() {
    use crate::support::fake_api::{base64, incidents_cluster, write_kubeconfig};
    use crate::support::server::{BIN, start_run_with};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = Provider::start().await;
    let (fake, llm, _script) = incidents_cluster(json!({})).await;
    let secret = |labelled: bool| {
        let mut s = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kortex-oidc", "namespace": "kortex"},
            "data": {"client-secret": base64(CLIENT_SECRET)}});
        if labelled {
            s["metadata"]["labels"] = json!({"kortex.dev/use": "true"});
        }
        s
    };
    fake.apply("secrets", secret(false));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &fake.url);
    let db = format!("sqlite://{}", dir.path().join("refused.db").display());
    let issuer = p.issuer.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &db,
                "--kortex-namespace",
                "kortex",
                "--identity",
                "pod-a",
                "--oidc-issuer",
                &issuer,
                "--oidc-client-id",
                CLIENT_ID,
                "--oidc-client-secret-ref",
                "kortex-oidc",
            ])
            .env("KUBECONFIG", kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the Secret kortex/kortex-oidc lacks the label kortex.dev/use"),
        "{said}"
    );
    assert!(!said.contains(CLIENT_SECRET));

    fake.apply("secrets", secret(true));
    let server = start_run_with(
        &fake,
        dir.path(),
        &llm,
        &[
            "--oidc-issuer",
            &p.issuer,
            "--oidc-client-id",
            CLIENT_ID,
            "--oidc-client-secret-ref",
            "kortex-oidc",
            "--oidc-kubernetes",
            "off",
        ],
    )
    .await;
    // The scripted token endpoint refuses any other client secret (invalid_client).
    sign_in_over_http(&server, &p, |nonce| p.sign("k1", &p.claims(nonce, 600))).await;
    assert!(!server.log().contains(CLIENT_SECRET));
    assert!(server.terminate().success());
}
