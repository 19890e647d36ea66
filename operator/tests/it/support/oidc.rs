//! A scripted OpenID provider on 127.0.0.1 for the tests of hostile tokens: discovery, a JWK
//! Set (its fetches counted), a token endpoint that checks PKCE and the client's secret and
//! answers what the test prepared for each code, and refreshes the test scripts. The signed
//! path through a real provider is `tests/browser/sso.mjs` (Glewlwyd); this one lets a test
//! hand Kortex exactly the token it wants refused.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub const CLIENT_ID: &str = "kortex";
pub const CLIENT_SECRET: &str = "kortex-secret";

/// What the token endpoint answers a refresh with.
#[derive(Clone, Debug)]
pub enum Refresh {
    /// New tokens, with an ID token of these claims (`None`: no ID token, as Glewlwyd).
    Renew(Option<Value>),
    /// `invalid_grant`.
    Refuse,
}

struct Inner {
    keys: Vec<(String, EcdsaKeyPair)>,
    codes: HashMap<String, (String, String)>,
    refresh: Refresh,
    jwks_fetches: usize,
    token_calls: Vec<String>,
    /// Every token `sign` made: what a token exchange takes as a subject token.
    issued: std::collections::HashSet<String>,
    /// The `subject_token_type` of each token exchange, in order.
    exchanged: Vec<String>,
}

/// The provider.
#[derive(Clone)]
pub struct Provider {
    pub issuer: String,
    inner: Arc<Mutex<Inner>>,
}

fn b64(bytes: &[u8]) -> String {
    kortex::oidc::jwt::base64url_encode(bytes)
}

/// The compact JWS of `claims` signed by `key` under the id `kid`.
fn jws(key: &EcdsaKeyPair, kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "ES256", "typ": "JWT", "kid": kid});
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let sig = key.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
    format!("{input}.{}", b64(sig.as_ref()))
}

fn new_key() -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap()
}

impl Provider {
    /// Starts it; its first key has the id `k1`.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        Self::serve(listener, issuer)
    }

    /// Starts it behind a TLS front (an API server's JWT authenticator takes HTTPS issuers
    /// only); with the front's certificate (PEM).
    pub async fn start_tls() -> (Self, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap().to_string();
        let (front, pem) = crate::support::tls_proxy::start(backend).await;
        (Self::serve(listener, front), pem)
    }

    fn serve(listener: tokio::net::TcpListener, issuer: String) -> Self {
        let p = Self {
            issuer,
            inner: Arc::new(Mutex::new(Inner {
                keys: vec![("k1".into(), new_key())],
                codes: HashMap::new(),
                refresh: Refresh::Renew(None),
                jwks_fetches: 0,
                token_calls: Vec::new(),
                issued: Default::default(),
                exchanged: Vec::new(),
            })),
        };
        let app = axum::Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/keys", get(jwks))
            .route("/token", post(token))
            .with_state(p.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        p
    }

    /// Claims of `email` in `groups` for a sign-in with `nonce`, valid for `seconds`.
    pub fn claims_for(&self, nonce: &str, seconds: i64, email: &str, groups: &[&str]) -> Value {
        let mut c = self.claims(nonce, seconds);
        c["sub"] = json!(format!("u-{email}"));
        c["email"] = json!(email);
        c["groups"] = json!(groups);
        c
    }

    /// Claims Kortex accepts for a sign-in with `nonce`, valid for `seconds`.
    pub fn claims(&self, nonce: &str, seconds: i64) -> Value {
        let now = jiff::Timestamp::now().as_second();
        json!({
            "iss": self.issuer, "aud": CLIENT_ID, "sub": "u-alice", "nonce": nonce,
            "iat": now, "exp": now + seconds,
            "email": "alice@example.com", "groups": ["oncall", "platform"],
        })
    }

    /// An ES256 token of `claims` signed with the key `kid` (made if new, then published).
    pub fn sign(&self, kid: &str, claims: &Value) -> String {
        let mut inner = self.inner.lock().unwrap();
        if !inner.keys.iter().any(|(k, _)| k == kid) {
            inner.keys.push((kid.to_owned(), new_key()));
        }
        let key = &inner.keys.iter().find(|(k, _)| k == kid).unwrap().1;
        let token = jws(key, kid, claims);
        inner.issued.insert(token.clone());
        token
    }

    /// A token signed with a key the provider never publishes.
    pub fn sign_unpublished(&self, kid: &str, claims: &Value) -> String {
        jws(&new_key(), kid, claims)
    }

    /// The published public key `kid` (for the "HMAC with the public key" attack).
    pub fn public_key(&self, kid: &str) -> Vec<u8> {
        let inner = self.inner.lock().unwrap();
        let key = &inner.keys.iter().find(|(k, _)| k == kid).unwrap().1;
        key.public_key().as_ref().to_vec()
    }

    /// The token endpoint will answer `code` (once, with the verifier of `challenge`) with
    /// `id_token`.
    pub fn issue(&self, code: &str, challenge: &str, id_token: &str) {
        self.inner
            .lock()
            .unwrap()
            .codes
            .insert(code.to_owned(), (challenge.to_owned(), id_token.to_owned()));
    }

    pub fn on_refresh(&self, r: Refresh) {
        self.inner.lock().unwrap().refresh = r;
    }

    pub fn jwks_fetches(&self) -> usize {
        self.inner.lock().unwrap().jwks_fetches
    }

    /// The `subject_token_type` of each token exchange, in order.
    pub fn exchanges(&self) -> Vec<String> {
        self.inner.lock().unwrap().exchanged.clone()
    }

    /// The grant types the token endpoint was called with, in order.
    pub fn token_calls(&self) -> Vec<String> {
        self.inner.lock().unwrap().token_calls.clone()
    }
}

async fn discovery(State(p): State<Provider>) -> axum::Json<Value> {
    axum::Json(json!({
        "issuer": p.issuer,
        "authorization_endpoint": format!("{}/authorize", p.issuer),
        "token_endpoint": format!("{}/token", p.issuer),
        "jwks_uri": format!("{}/keys", p.issuer),
        "end_session_endpoint": format!("{}/logout", p.issuer),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials",
            "urn:ietf:params:oauth:grant-type:token-exchange"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    }))
}

async fn jwks(State(p): State<Provider>) -> axum::Json<Value> {
    let mut inner = p.inner.lock().unwrap();
    inner.jwks_fetches += 1;
    let keys: Vec<Value> = inner
        .keys
        .iter()
        .map(|(kid, key)| {
            let point = key.public_key().as_ref();
            json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                   "x": b64(&point[1..33]), "y": b64(&point[33..65])})
        })
        .collect();
    axum::Json(json!({ "keys": keys }))
}

fn oauth_error(error: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": error, "error_description": format!("scripted {error}")})),
    )
        .into_response()
}

async fn token(State(p): State<Provider>, headers: HeaderMap, body: String) -> Response {
    let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    let basic = format!(
        "Basic {}",
        kortex::catalog::secret_redactor::base64_bytes(
            format!("{CLIENT_ID}:{CLIENT_SECRET}").as_bytes()
        )
    );
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(basic.as_str()) {
        return oauth_error("invalid_client");
    }
    let grant = form.get("grant_type").cloned().unwrap_or_default();
    let mut inner = p.inner.lock().unwrap();
    inner.token_calls.push(grant.clone());
    match grant.as_str() {
        "authorization_code" => {
            let code = form.get("code").cloned().unwrap_or_default();
            let Some((challenge, id_token)) = inner.codes.remove(&code) else {
                return oauth_error("invalid_grant");
            };
            let verifier = form.get("code_verifier").cloned().unwrap_or_default();
            if kortex::oidc::provider::pkce_challenge(&verifier) != challenge {
                return oauth_error("invalid_grant");
            }
            axum::Json(json!({
                "access_token": "at-1", "token_type": "Bearer", "expires_in": 600,
                "refresh_token": "rt-1", "id_token": id_token,
            }))
            .into_response()
        }
        "refresh_token" => match inner.refresh.clone() {
            Refresh::Refuse => oauth_error("invalid_grant"),
            Refresh::Renew(claims) => {
                drop(inner);
                let mut body = json!({"access_token": "at-2", "token_type": "Bearer", "expires_in": 600, "refresh_token": "rt-2"});
                if let Some(c) = claims {
                    body["id_token"] = json!(p.sign("k1", &c));
                }
                axum::Json(body).into_response()
            }
        },
        // An access token for the resource the client names (RFC 8707): what an MCP
        // client that holds client credentials gets (the MCP authorization spec).
        "client_credentials" => {
            drop(inner);
            let Some(resource) = form.get("resource").filter(|r| !r.is_empty()) else {
                return oauth_error("invalid_target");
            };
            let now = jiff::Timestamp::now().as_second();
            let claims = json!({"iss": p.issuer, "aud": resource, "sub": format!("client-{CLIENT_ID}"),
                "azp": CLIENT_ID, "client_id": CLIENT_ID, "email": "robot@clients.example.com",
                "groups": ["robots"], "scope": form.get("scope").cloned().unwrap_or_default(),
                "iat": now, "exp": now + 600});
            axum::Json(
                json!({"access_token": p.sign("k1", &claims), "token_type": "Bearer",
                "expires_in": 600, "scope": form.get("scope").cloned().unwrap_or_default()}),
            )
            .into_response()
        }
        // On behalf of a user (RFC 8693): a token this provider signed, still good, becomes
        // one for the resource named, for the same subject, with the client as the actor.
        "urn:ietf:params:oauth:grant-type:token-exchange" => {
            let subject = form.get("subject_token").cloned().unwrap_or_default();
            if !inner.issued.contains(&subject) {
                return oauth_error("invalid_grant");
            }
            inner
                .exchanged
                .push(form.get("subject_token_type").cloned().unwrap_or_default());
            drop(inner);
            let Some(resource) = form.get("resource").filter(|r| !r.is_empty()) else {
                return oauth_error("invalid_target");
            };
            let claims: Value = subject
                .split('.')
                .nth(1)
                .and_then(kortex::oidc::jwt::base64url)
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            let now = jiff::Timestamp::now().as_second();
            if claims["exp"].as_i64().unwrap_or(0) <= now {
                return oauth_error("invalid_grant");
            }
            let exchanged = json!({"iss": p.issuer, "aud": resource, "sub": claims["sub"],
                "email": claims["email"], "groups": claims["groups"], "client_id": CLIENT_ID,
                "act": {"sub": CLIENT_ID}, "scope": form.get("scope").cloned().unwrap_or_default(),
                "iat": now, "exp": now + 600});
            axum::Json(
                json!({"access_token": p.sign("k1", &exchanged), "token_type": "Bearer",
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "expires_in": 600}),
            )
            .into_response()
        }
        _ => oauth_error("unsupported_grant_type"),
    }
}

/// `tests/fixtures/oidc/glewlwyd.sh` when Debian's Glewlwyd is installed; `None` (the test
/// is skipped) otherwise, unless `KORTEX_REQUIRE_GLEWLWYD=1` (the test script sets it).
pub fn glewlwyd_script() -> Option<&'static str> {
    let required = std::env::var("KORTEX_REQUIRE_GLEWLWYD").is_ok_and(|v| v == "1");
    if std::path::Path::new("/usr/bin/glewlwyd").exists() {
        return Some(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/oidc/glewlwyd.sh"
        ));
    }
    assert!(
        !required,
        "KORTEX_REQUIRE_GLEWLWYD=1 but /usr/bin/glewlwyd is missing"
    );
    eprintln!("skipping: Glewlwyd is not installed (scripts/test.sh installs it)");
    None
}

/// A running Glewlwyd of the fixture (stopped when dropped).
pub struct Glewlwyd {
    script: &'static str,
    dir: std::path::PathBuf,
}

impl Glewlwyd {
    /// Starts it on `port` with its state in `dir`, Kortex's client registered with
    /// `redirect_uri`, and `env` for the fixture (`OIDC_ISSUER`, `OIDC_RESOURCE`, …);
    /// panics with its log if it does not start.
    pub fn start(
        script: &'static str,
        dir: &std::path::Path,
        port: u16,
        redirect_uri: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let started = std::process::Command::new("bash")
            .arg(script)
            .arg("start")
            .arg(dir)
            .arg(port.to_string())
            .arg(redirect_uri)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let running = Self {
            script,
            dir: dir.to_owned(),
        };
        assert!(
            started.status.success(),
            "glewlwyd did not start:\n{}\n{}\n{}",
            String::from_utf8_lossy(&started.stdout),
            String::from_utf8_lossy(&started.stderr),
            std::fs::read_to_string(dir.join("glewlwyd.log")).unwrap_or_default()
        );
        running
    }
}

impl Drop for Glewlwyd {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}
