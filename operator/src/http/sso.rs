//! Single sign-on (docs/sso.md): Kortex as an OpenID Connect relying party. The dashboard's
//! "Sign in with …" button starts the authorization code flow with PKCE, `state` and
//! `nonce`; the callback verifies the ID token, names the user and groups (or, in cluster
//! mode, lets the API server name them from the ID token), and opens a session: a row every
//! replica reads, found by the digest of the id in the browser's HttpOnly, SameSite=Lax
//! cookie (or `kortex login`'s bearer token), the provider's tokens sealed with the session
//! key. Requests refresh the tokens before the ID token expires; a refresh the provider
//! refuses ends the session and says so.

use super::AppState;
use super::auth::{CSRF_COOKIE, Caller, cookie, is_loopback_host};
use super::error::ApiError;
use crate::oidc::provider::AuthorizeRequest;
use crate::oidc::seal::{digest, random_token};
use crate::oidc::{Provider, SessionKey, SsoError};
use crate::operator::auth::KubeCredential;
use crate::store::{AuthSession, now_ms};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The cookie holding a signed-in browser's session id (HttpOnly, SameSite=Lax).
pub const SESSION_COOKIE: &str = "kortex_session";
/// The cookie binding a sign-in under way to the browser that started it.
const STATE_COOKIE: &str = "kortex_sign_in";
/// The cookie carrying why the last sign-in failed to the sign-in page (five minutes).
const ERROR_COOKIE: &str = "kortex_sign_in_error";
/// What a session id presented as a bearer token (`kortex login`) starts with.
pub const BEARER_PREFIX: &str = "kortex-session-";
/// The callback's path.
pub const CALLBACK_PATH: &str = "/auth/v1/oidc/callback";
/// How long a sign-in may take at the provider.
const SIGN_IN_MS: i64 = 10 * 60 * 1000;
/// How long a `kortex login` one-time code lives.
const CLI_CODE_MS: i64 = 60 * 1000;
/// How long a session lasts at most, whatever the refreshes.
pub const SESSION_MS: i64 = 12 * 3600 * 1000;
/// Refresh this long before the ID token expires (at most; a quarter of a short token's
/// life otherwise).
const REFRESH_AHEAD_MS: i64 = 60 * 1000;

/// How the signed-in user's Kubernetes requests are made (cluster mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeMode {
    /// Standalone, or no Kubernetes identity: tools read with Kortex's rights (policies
    /// with `runToolsAsUser` refuse), decisions in the dashboard are refused.
    Off,
    /// The ID token is the user's bearer token: the API server's JWT authenticator trusts
    /// the same issuer.
    Token,
    /// Kortex's ServiceAccount impersonates the verified user and groups.
    Impersonate,
}

impl KubeMode {
    /// As `/auth/v1/me` and the status page say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Token => "token",
            Self::Impersonate => "impersonation",
        }
    }
}

/// The relying party: the provider, the session key, and where the provider sends
/// browsers back.
pub struct Sso {
    /// The provider.
    pub provider: Provider,
    /// Seals the tokens sessions keep.
    pub key: SessionKey,
    /// How Kubernetes requests are made as the user.
    pub kube: KubeMode,
    /// The callback URL registered at the provider; `None`: from the request's host.
    pub redirect_url: Option<String>,
    /// `impersonate` mode: the only groups passed on (the chart grants exactly these);
    /// empty: every group the ID token names, but never a `system:` one.
    pub impersonate_groups: Vec<String>,
    /// Kortex as an OAuth resource server (`docs/mcp.md#oauth`): its public URL (the
    /// `resource` access tokens must be for), when `--public-url` is set.
    pub resource: Option<String>,
    /// Scopes an access token must carry (`--oauth-scopes`), advertised in the resource's
    /// metadata.
    pub oauth_scopes: Vec<String>,
    /// Serialises one replica's refreshes of a session (a rotating refresh token is good
    /// for one refresh).
    refreshing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Sso {
    /// A relying party.
    pub fn new(
        provider: Provider,
        key: SessionKey,
        kube: KubeMode,
        redirect_url: Option<String>,
    ) -> Self {
        Self {
            provider,
            key,
            kube,
            redirect_url,
            impersonate_groups: Vec::new(),
            resource: None,
            oauth_scopes: Vec::new(),
            refreshing: Mutex::default(),
        }
    }

    /// Only these groups are impersonated (`--oidc-impersonate-groups`).
    pub fn impersonating_only(mut self, groups: Vec<String>) -> Self {
        self.impersonate_groups = groups;
        self
    }

    fn redirect_uri(&self, headers: &HeaderMap) -> String {
        if let Some(u) = &self.redirect_url {
            return u.clone();
        }
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("127.0.0.1");
        let scheme = if https(headers) { "https" } else { "http" };
        format!("{scheme}://{host}{CALLBACK_PATH}")
    }

    fn lock_of(&self, id_hash: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(id_hash.to_owned()).or_default().clone()
    }
}

/// What a sign-in under way keeps (sealed in its row).
#[derive(Serialize, Deserialize)]
struct Pending {
    nonce: String,
    verifier: String,
    redirect_uri: String,
    back: String,
    silent: bool,
    cli: Option<CliLogin>,
}

#[derive(Clone, Serialize, Deserialize)]
struct CliLogin {
    port: u16,
    challenge: String,
}

/// What a session keeps of the provider's tokens (sealed in its row).
#[derive(Clone, Serialize, Deserialize)]
struct Kept {
    id_token: Option<String>,
    /// When the ID token expires, Unix ms.
    id_expires: i64,
    access_token: Option<String>,
    refresh_token: Option<String>,
    /// How long the tokens were good for when issued, ms.
    lifetime: i64,
}

fn https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// Session cookies are `Secure` (and `__Host-`) except for a browser on this machine's
/// loopback over plain HTTP, where browsers would drop them.
fn secure(headers: &HeaderMap) -> bool {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    https(headers) || !is_loopback_host(host)
}

fn set_cookie(
    name: &str,
    value: &str,
    http_only: bool,
    max_age_s: i64,
    secure: bool,
) -> HeaderValue {
    let prefix = if secure { "__Host-" } else { "" };
    let mut c = format!("{prefix}{name}={value}; Path=/; SameSite=Lax; Max-Age={max_age_s}");
    if http_only {
        c.push_str("; HttpOnly");
    }
    if secure {
        c.push_str("; Secure");
    }
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Back to the sign-in page, which says `why`.
fn failed(headers: &HeaderMap, why: &str) -> Response {
    tracing::info!(reason = %why, "a sign-in failed");
    let mut r = redirect("/");
    let text: String = why.chars().take(600).collect();
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(
            ERROR_COOKIE,
            &crate::oidc::jwt::base64url_encode(text.as_bytes()),
            true,
            300,
            secure(headers),
        ),
    );
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(STATE_COOKIE, "", true, 0, secure(headers)),
    );
    r
}

/// Only a path of this server: no `//host` or `/\host` a browser would take for another.
fn local_path(back: Option<&str>) -> String {
    match back {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.starts_with("/\\") => {
            p.to_owned()
        }
        _ => "/".to_owned(),
    }
}

/// `GET /auth/v1/sign-in`: how to sign in here (the dashboard's first screen), and why the
/// last sign-in of this browser failed, if it did.
pub async fn options(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let error = cookie(&headers, ERROR_COOKIE)
        .and_then(crate::oidc::jwt::base64url)
        .and_then(|b| String::from_utf8(b).ok());
    let body = json!({
        "oidc": state.sso.as_ref().map(|s| json!({
            "name": s.provider.settings.display_name,
            "loginUrl": "/auth/v1/oidc/login",
        })),
        "token": state.auth != super::auth::AuthMode::Loopback,
        "error": error,
    });
    let mut r = Json(body).into_response();
    if error.is_some() {
        r.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(ERROR_COOKIE, "", true, 0, secure(&headers)),
        );
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `GET /auth/v1/oidc/login` query.
#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    /// Where to go once signed in (a path of this server).
    #[serde(default, rename = "return")]
    back: Option<String>,
    /// `none`: a silent renewal (the provider answers at once, with no page).
    #[serde(default)]
    prompt: Option<String>,
    /// `kortex login`: its loopback port …
    #[serde(default)]
    cli_port: Option<u16>,
    /// … and the S256 challenge of its verifier.
    #[serde(default)]
    cli_challenge: Option<String>,
}

/// `GET /auth/v1/oidc/login`: sends the browser to the provider.
pub async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Response {
    let Some(sso) = state.sso.clone() else {
        return ApiError::not_found(
            "single sign-on is not configured on this server (docs/sso.md)",
        )
        .into_response();
    };
    let meta = match sso.provider.metadata().await {
        Ok(m) => m,
        Err(e) => return failed(&headers, &e.to_string()),
    };
    let cli = match (q.cli_port, q.cli_challenge) {
        (Some(port), Some(challenge)) if challenge.len() >= 43 => {
            Some(CliLogin { port, challenge })
        }
        (None, None) => None,
        _ => {
            return failed(
                &headers,
                "a kortex login needs both cli_port and a cli_challenge (S256 of a 43+ character verifier)",
            );
        }
    };
    let state_value = random_token();
    let pending = Pending {
        nonce: random_token(),
        verifier: random_token() + &random_token(),
        redirect_uri: sso.redirect_uri(&headers),
        back: local_path(q.back.as_deref()),
        silent: q.prompt.as_deref() == Some("none"),
        cli,
    };
    // A silent renewal names the sign-in it renews.
    let hint = match presented(&headers) {
        Some((id, _)) if pending.silent => kept_of(&state, &sso, id)
            .await
            .and_then(|(_, k)| k.id_token),
        _ => None,
    };
    let url = match sso.provider.authorize_url(
        &meta,
        &AuthorizeRequest {
            redirect_uri: &pending.redirect_uri,
            state: &state_value,
            nonce: &pending.nonce,
            verifier: &pending.verifier,
            prompt: pending.silent.then_some("none"),
            id_token_hint: hint.as_deref(),
        },
    ) {
        Ok(u) => u,
        Err(e) => return failed(&headers, &e.to_string()),
    };
    let hash = digest(&state_value);
    let sealed = sso
        .key
        .seal(&serde_json::to_vec(&pending).unwrap_or_default(), &hash);
    if let Err(e) = state
        .store
        .put_sign_in(&hash, &sealed, now_ms() + SIGN_IN_MS)
        .await
    {
        return ApiError::from(e).into_response();
    }
    let mut r = redirect(&url);
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(
            STATE_COOKIE,
            &state_value,
            true,
            SIGN_IN_MS / 1000,
            secure(&headers),
        ),
    );
    r
}

/// `GET /auth/v1/oidc/callback` query (RFC 6749 §4.1.2).
#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    error_description: Option<String>,
}

/// Why a callback is refused, in the words the sign-in page shows.
fn words(e: &SsoError, sso: &Sso, redirect_uri: &str) -> String {
    let text = e.to_string();
    match e {
        SsoError::Provider(p) if p.contains("redirect") => format!(
            "{text} — check that {redirect_uri} is registered as a redirect URI of the client {} at the provider",
            sso.provider.settings.client_id
        ),
        SsoError::Provider(p)
            if p.starts_with("invalid_client") || p.starts_with("unauthorized_client") =>
        {
            format!(
                "{text} — check the client id {} and its secret",
                sso.provider.settings.client_id
            )
        }
        _ => text,
    }
}

/// `GET /auth/v1/oidc/callback`: the provider sends the browser back here.
// Long because the callback's checks in the order OAuth and OIDC Core give them, each
// failure with its own words.
pub async fn callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let Some(sso) = state.sso.clone() else {
        return ApiError::not_found("single sign-on is not configured on this server")
            .into_response();
    };
    let Some(state_value) = q.state.as_deref().filter(|s| !s.is_empty()) else {
        return failed(
            &headers,
            "the provider sent the browser back without a state: start the sign-in from Kortex's sign-in page",
        );
    };
    // The state must be the one this browser was given (no sign-in planted by another site).
    let bound = cookie(&headers, STATE_COOKIE)
        .is_some_and(|c| crate::catalog::constant_time_eq(c.as_bytes(), state_value.as_bytes()));
    if !bound {
        return failed(
            &headers,
            "this sign-in was not started in this browser (or its cookie expired): start again from Kortex's sign-in page",
        );
    }
    let hash = digest(state_value);
    let pending = match state.store.take_sign_in(&hash).await {
        Ok(Some(sealed)) => sso
            .key
            .open(&sealed, &hash)
            .and_then(|b| serde_json::from_slice::<Pending>(&b).ok()),
        Ok(None) => None,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let Some(pending) = pending else {
        return failed(
            &headers,
            "this sign-in was already completed or has expired (a replayed or stale link): sign in again",
        );
    };
    let fail = |why: String| -> Response {
        if let Some(cli) = &pending.cli {
            let mut to = reqwest::Url::parse(&format!("http://127.0.0.1:{}/callback", cli.port))
                .unwrap_or_else(|_| unreachable!("a loopback URL parses"));
            to.query_pairs_mut().append_pair("error", &why);
            return redirect(to.as_str());
        }
        failed(&headers, &why)
    };
    if let Some(error) = &q.error {
        let detail = q
            .error_description
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        return fail(match error.as_str() {
            "login_required" | "interaction_required" | "consent_required" if pending.silent => {
                "your sign-in has ended at the provider: sign in again".to_owned()
            }
            "access_denied" => format!("the provider denied the sign-in{detail}"),
            _ => format!("the provider answered {error}{detail}"),
        });
    }
    let Some(code) = q.code.as_deref().filter(|c| !c.is_empty()) else {
        return fail("the provider sent the browser back without a code".into());
    };
    let tokens = match sso
        .provider
        .exchange(code, &pending.verifier, &pending.redirect_uri)
        .await
    {
        Ok(t) => t,
        Err(e) => return fail(words(&e, &sso, &pending.redirect_uri)),
    };
    let Some(id_token) = tokens.id_token.clone() else {
        return fail("the provider's token endpoint answered without an ID token: is the openid scope allowed for this client?".into());
    };
    let verified = match sso.provider.verify(&id_token, Some(&pending.nonce)).await {
        Ok(v) => v,
        Err(e) => return fail(e.to_string()),
    };
    let (user, groups) = match identify(&state, &sso, &verified, &tokens, &id_token).await {
        Ok(who) => who,
        Err(why) => return fail(why),
    };
    let now = now_ms();
    let id_expires = verified.expires * 1000;
    let lifetime = verified.claims["iat"]
        .as_i64()
        .map_or(300_000, |iat| (verified.expires - iat) * 1000)
        .max(1000);
    let kept = Kept {
        id_token: Some(id_token),
        id_expires,
        access_token: tokens.access_token.clone(),
        refresh_token: tokens.refresh_token.clone(),
        lifetime,
    };
    let session_id = random_token();
    let id_hash = digest(&session_id);
    let row = AuthSession {
        id_hash: id_hash.clone(),
        subject: verified.subject.clone(),
        user_name: user.clone(),
        groups: groups.clone(),
        sealed: sso
            .key
            .seal(&serde_json::to_vec(&kept).unwrap_or_default(), &id_hash),
        key_id: sso.key.id().to_owned(),
        token_expires: id_expires,
        expires_at: now + SESSION_MS,
        created_at: now,
        version: 1,
    };
    if let Err(e) = state.store.put_auth_session(&row).await {
        return ApiError::from(e).into_response();
    }
    tracing::info!(user = %user, "signed in with the identity provider");
    if let Some(cli) = &pending.cli {
        // The CLI gets a one-time code on its loopback port; it exchanges it (with its
        // PKCE verifier) for the session's bearer token.
        let code = random_token();
        let code_hash = digest(&format!("cli:{code}"));
        let grant = json!({"session": session_id, "challenge": cli.challenge});
        let sealed = sso.key.seal(grant.to_string().as_bytes(), &code_hash);
        if let Err(e) = state
            .store
            .put_sign_in(&code_hash, &sealed, now + CLI_CODE_MS)
            .await
        {
            return ApiError::from(e).into_response();
        }
        return redirect(&format!(
            "http://127.0.0.1:{}/callback?code={code}",
            cli.port
        ));
    }
    // A renewed sign-in replaces the browser's previous one.
    if let Some((old, true)) = presented(&headers) {
        let _ = state.store.delete_auth_session(&digest(old)).await;
    }
    let secure = secure(&headers);
    let mut r = redirect(&pending.back);
    let h = r.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, &session_id, true, SESSION_MS / 1000, secure),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(
            CSRF_COOKIE,
            &crate::store::new_id().replace('-', ""),
            false,
            SESSION_MS / 1000,
            secure,
        ),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(STATE_COOKIE, "", true, 0, secure),
    );
    r
}

/// Who a verified sign-in is: from the claims (and `userinfo` for what the ID token lacks),
/// or in `token` mode as the API server names the ID token's holder.
async fn identify(
    state: &AppState,
    sso: &Sso,
    verified: &crate::oidc::jwt::Verified,
    tokens: &crate::oidc::Tokens,
    id_token: &str,
) -> Result<(String, Vec<String>), String> {
    let settings = &sso.provider.settings;
    let lacks = |claim: &str| verified.claims[claim].is_null();
    let userinfo = match &tokens.access_token {
        Some(access) if lacks(&settings.username_claim) || lacks(&settings.groups_claim) => sso
            .provider
            .userinfo(&verified.subject, access)
            .await
            .map_err(|e| e.to_string())?,
        _ => serde_json::Value::Null,
    };
    let identity = sso
        .provider
        .identity(&verified.claims, &userinfo)
        .map_err(|e| e.to_string())?;
    if sso.kube != KubeMode::Token || state.cluster_auth.is_none() {
        // Kortex names the user itself: never one of the API server's own users or groups
        // (a provider's `system:masters` group would pass every SubjectAccessReview).
        if identity.user.starts_with("system:") {
            return Err(format!(
                "{} names a user of the Kubernetes API server itself, which a sign-in may not (set --oidc-username-prefix)",
                identity.user
            ));
        }
        let groups = kube_groups(sso, &identity.groups);
        if sso.kube == KubeMode::Impersonate
            && let Some(cluster) = &state.cluster_auth
        {
            // The API server adds groups of its own to an impersonated user
            // (`system:authenticated`); the decisions Kortex writes as them must list every
            // group the admission policy sees. Asking also proves the grant works.
            let who = KubeCredential::Impersonate {
                user: identity.user.clone(),
                groups,
            };
            return match cluster.who_is(&who).await {
                Ok(seen) => Ok((seen.name, seen.groups)),
                Err(e) => Err(format!(
                    "Kortex may not impersonate {} in the cluster ({e}): grant its ServiceAccount impersonation of users and of these groups (config/rbac/sso_impersonate.yaml, the chart's sso.impersonation.groups; docs/sso.md#impersonation)",
                    identity.user
                )),
            };
        }
        return Ok((identity.user, groups));
    }
    let Some(cluster) = &state.cluster_auth else {
        return Ok((identity.user, identity.groups));
    };
    match cluster.review(id_token).await {
        Ok(Some(user)) => Ok((user.name, user.groups)),
        Ok(None) => Err(format!(
            "the Kubernetes API server does not accept ID tokens of {}: configure its JWT authenticator for this issuer and the audience {} (docs/sso.md#the-api-server-trusts-the-issuer), or run Kortex with --oidc-kubernetes impersonate",
            settings.issuer, settings.client_id
        )),
        Err(e) => Err(format!(
            "the Kubernetes API server could not check your ID token ({e}); try again"
        )),
    }
}

/// `POST /auth/v1/oidc/token` body: `kortex login`'s one-time code and PKCE verifier.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliExchange {
    code: String,
    verifier: String,
}

/// `POST /auth/v1/oidc/token`: `kortex login` exchanges its one-time code for the session's
/// bearer token.
pub async fn cli_token(
    State(state): State<AppState>,
    body: Result<Json<CliExchange>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let body = super::access::json_body(body)?;
    let Some(sso) = state.sso.clone() else {
        return Err(ApiError::not_found(
            "single sign-on is not configured on this server",
        ));
    };
    let code_hash = digest(&format!("cli:{}", body.code));
    let grant = state
        .store
        .take_sign_in(&code_hash)
        .await?
        .and_then(|sealed| sso.key.open(&sealed, &code_hash))
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .ok_or_else(|| {
            ApiError::unauthorized(
                "the code was used already or has expired: run kortex login again",
            )
        })?;
    let challenge = grant["challenge"].as_str().unwrap_or_default();
    if !crate::catalog::constant_time_eq(
        crate::oidc::provider::pkce_challenge(&body.verifier).as_bytes(),
        challenge.as_bytes(),
    ) {
        return Err(ApiError::unauthorized(
            "the verifier does not match this code's challenge",
        ));
    }
    let session = grant["session"].as_str().unwrap_or_default();
    let row = state
        .store
        .auth_session(&digest(session))
        .await?
        .ok_or_else(|| ApiError::unauthorized("the sign-in has ended: run kortex login again"))?;
    let mut r = Json(json!({
        "token": format!("{BEARER_PREFIX}{session}"),
        "user": row.user_name,
        "groups": row.groups,
        "expiresAt": jiff::Timestamp::from_millisecond(row.expires_at).ok().map(|t| t.to_string()),
    }))
    .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// 401 `reauthenticate`: the dashboard signs in again with `prompt=none`.
fn reauthenticate(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "reauthenticate", message)
}

fn signed_out(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "signed_out", message)
}

/// The session id a request presents: `kortex login`'s bearer token, or the cookie (`true`:
/// from the cookie, so requests that change state must carry the CSRF header).
pub fn presented(headers: &HeaderMap) -> Option<(&str, bool)> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim);
    match bearer {
        Some(b) => b.strip_prefix(BEARER_PREFIX).map(|id| (id, false)),
        None => cookie(headers, SESSION_COOKIE).map(|id| (id, true)),
    }
}

/// The caller of session `id`, its tokens refreshed first when the ID token is about to
/// expire.
// Long because a refresh's outcomes, each said to the person: renewed, renewed without a
// new ID token, refused (signed out), provider unreachable (still good or not).
pub async fn caller(state: &AppState, sso: &Sso, id: &str) -> Result<Caller, ApiError> {
    let id_hash = digest(id);
    let name = &sso.provider.settings.display_name;
    let mut locked = None;
    loop {
        let Some(mut row) = state.store.auth_session(&id_hash).await? else {
            return Err(signed_out(
                "your sign-in has ended (signed out, expired, or erased): sign in again",
            ));
        };
        let Some(kept) = (row.key_id == sso.key.id())
            .then(|| sso.key.open(&row.sealed, &id_hash))
            .flatten()
            .and_then(|b| serde_json::from_slice::<Kept>(&b).ok())
        else {
            return Err(signed_out(
                "this sign-in was made on a Kortex replica with another session key, which this one cannot read: every replica needs the same session key (--session-key-file, the chart's sso.sessionKey; docs/sso.md). Sign in again.",
            ));
        };
        let now = now_ms();
        let ahead = REFRESH_AHEAD_MS.min(kept.lifetime / 4);
        if row.token_expires - ahead > now {
            return as_caller(sso, &row, &kept);
        }
        let Some(refresh_token) = kept.refresh_token.clone() else {
            if row.token_expires > now {
                return as_caller(sso, &row, &kept);
            }
            // No refresh token (Google without offline access, Dex without the
            // offline_access scope): renew at the provider, silently while its own session
            // lasts (the dashboard follows); the new sign-in replaces this one.
            return Err(reauthenticate(format!(
                "your sign-in with {name} expired and the provider gave no refresh token to renew it: sign in again (the dashboard does it silently while your session at the provider lasts)"
            )));
        };
        // One refresh at a time per session on this replica; read the row again once the
        // lock is held (whoever held it may have refreshed).
        if locked.is_none() {
            let lock = sso.lock_of(&id_hash);
            locked = Some(lock.lock_owned().await);
            continue;
        }
        match sso.provider.refresh(&refresh_token).await {
            Ok(tokens) => {
                let mut next = kept.clone();
                if let Some(rt) = tokens.refresh_token.clone() {
                    next.refresh_token = Some(rt);
                }
                if let Some(at) = tokens.access_token.clone() {
                    next.access_token = Some(at);
                }
                let access_expires = tokens.expires_in.map(|s| now + s * 1000);
                match tokens.id_token.as_deref() {
                    Some(id_token) => {
                        let verified = sso.provider.verify(id_token, None).await.map_err(|e| {
                            signed_out(format!(
                                "your sign-in with {name} could not be renewed: {e}"
                            ))
                        })?;
                        if verified.subject != row.subject {
                            state.store.delete_auth_session(&id_hash).await?;
                            return Err(signed_out(
                                "the provider renewed the sign-in for another subject: sign in again",
                            ));
                        }
                        let (user, groups) = identify(state, sso, &verified, &tokens, id_token)
                            .await
                            .map_err(signed_out)?;
                        if user != row.user_name {
                            state.store.delete_auth_session(&id_hash).await?;
                            return Err(signed_out(
                                "the provider renewed the sign-in for another user: sign in again",
                            ));
                        }
                        row.groups = groups;
                        next.id_token = Some(id_token.to_owned());
                        next.id_expires = verified.expires * 1000;
                        row.token_expires = next.id_expires;
                    }
                    // Some providers (Glewlwyd) issue no new ID token on refresh: the
                    // access token's life extends the session; the old ID token is not
                    // passed on once it expired (see `as_caller`).
                    None => {
                        row.token_expires = access_expires.unwrap_or(now + kept.lifetime);
                    }
                }
                row.sealed = sso
                    .key
                    .seal(&serde_json::to_vec(&next).unwrap_or_default(), &id_hash);
                if state.store.refresh_auth_session(&row).await? {
                    tracing::debug!(user = %row.user_name, "renewed a sign-in");
                    row.version += 1;
                    return as_caller(sso, &row, &next);
                }
                // Another replica refreshed meanwhile: take its outcome.
            }
            Err(SsoError::Provider(why)) => {
                // Refused: unless another replica renewed it meanwhile, the sign-in is over.
                let again = state.store.auth_session(&id_hash).await?;
                if again.as_ref().is_some_and(|a| a.version != row.version) {
                    continue;
                }
                state.store.delete_auth_session(&id_hash).await?;
                tracing::info!(user = %row.user_name, reason = %why, "a sign-in ended: the provider refused to renew it");
                return Err(signed_out(format!(
                    "your sign-in with {name} has ended: the provider refused to renew it ({why}). Sign in again."
                )));
            }
            Err(e) => {
                if row.token_expires > now {
                    return as_caller(sso, &row, &kept);
                }
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "auth_unavailable",
                    format!(
                        "your sign-in needs renewing and {name} cannot be reached now ({e}); try again"
                    ),
                ));
            }
        }
    }
}

/// The groups of a user Kortex names itself: those the ID token named, never a `system:`
/// group (the API server's own, `system:masters` among them), and in `impersonate` mode with
/// `--oidc-impersonate-groups` only those listed (the ones the chart lets Kortex
/// impersonate).
pub(super) fn kube_groups(sso: &Sso, groups: &[String]) -> Vec<String> {
    let listed = sso.kube == KubeMode::Impersonate && !sso.impersonate_groups.is_empty();
    groups
        .iter()
        .filter(|g| !g.starts_with("system:"))
        .filter(|g| !listed || sso.impersonate_groups.contains(g))
        .cloned()
        .collect()
}

fn as_caller(sso: &Sso, row: &AuthSession, kept: &Kept) -> Result<Caller, ApiError> {
    let kube = match sso.kube {
        KubeMode::Off => None,
        // The session holds the groups as the API server sees them; the ones it adds itself
        // (`system:…`) are not impersonated (they are not Kortex's to ask for).
        KubeMode::Impersonate => Some(KubeCredential::Impersonate {
            user: row.user_name.clone(),
            groups: row
                .groups
                .iter()
                .filter(|g| !g.starts_with("system:"))
                .cloned()
                .collect(),
        }),
        KubeMode::Token => {
            // An expired ID token would be refused by the API server: renew the sign-in at
            // the provider, silently when it still has a session (the dashboard follows).
            let token = kept
                .id_token
                .as_ref()
                .filter(|_| kept.id_expires > now_ms())
                .ok_or_else(|| {
                    reauthenticate(
                        "your ID token expired and the provider gives no new one on refresh: sign in again (the dashboard does it silently while your session at the provider lasts)",
                    )
                })?;
            Some(KubeCredential::Token(crate::catalog::SecretValue::new(
                token.as_str(),
            )))
        }
    };
    // What `oauthTokenExchange` tools exchange: the access token, else a live ID token.
    use crate::tools::mcp_oauth::{SubjectKind, SubjectToken};
    let subject = match (&kept.access_token, &kept.id_token) {
        (Some(t), _) => Some((t, SubjectKind::AccessToken)),
        (None, Some(t)) if kept.id_expires > now_ms() => Some((t, SubjectKind::IdToken)),
        _ => None,
    }
    .map(|(t, kind)| SubjectToken {
        token: crate::catalog::SecretValue::new(t.as_str()),
        kind,
        issuer: sso.provider.settings.issuer.clone(),
    });
    Ok(Caller {
        user: row.user_name.clone(),
        groups: row.groups.clone(),
        kube,
        subject,
    })
}

/// Session `id`'s row and what it keeps, when it exists and this replica can open it.
async fn kept_of(state: &AppState, sso: &Sso, id: &str) -> Option<(AuthSession, Kept)> {
    let id_hash = digest(id);
    let row = state.store.auth_session(&id_hash).await.ok().flatten()?;
    let kept = sso
        .key
        .open(&row.sealed, &id_hash)
        .and_then(|b| serde_json::from_slice::<Kept>(&b).ok())?;
    Some((row, kept))
}

/// Ends the session a sign-out presents; where to end it at the provider too
/// (RP-initiated logout), when the provider offers it.
pub async fn sign_out(state: &AppState, headers: &HeaderMap) -> Option<String> {
    let sso = state.sso.as_ref()?;
    let (id, _) = presented(headers)?;
    let found = kept_of(state, sso, id).await;
    let _ = state.store.delete_auth_session(&digest(id)).await;
    let kept = found.map(|(row, kept)| {
        tracing::info!(user = %row.user_name, "signed out");
        kept
    });
    let meta = sso.provider.metadata().await.ok()?;
    let end = meta.end_session_endpoint.as_deref()?;
    let mut url = reqwest::Url::parse(end).ok()?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("client_id", &sso.provider.settings.client_id);
        // Some providers (Glewlwyd) send the browser back only with a state.
        q.append_pair("state", &random_token());
        if let Some(t) = kept.and_then(|k| k.id_token) {
            q.append_pair("id_token_hint", &t);
        }
        if let Some(back) = sso
            .redirect_url
            .clone()
            .unwrap_or_else(|| sso.redirect_uri(headers))
            .strip_suffix(CALLBACK_PATH)
        {
            q.append_pair("post_logout_redirect_uri", &format!("{back}/"));
        }
    }
    Some(url.to_string())
}

/// The cookies a sign-out clears.
pub fn clear_cookies(headers: &HeaderMap, response: &mut Response) {
    let secure = secure(headers);
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, "", true, 0, secure),
    );
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn only_paths_of_this_server_are_returned_to() {
        assert_eq!(local_path(Some("/#/chat/abc")), "/#/chat/abc");
        assert_eq!(local_path(Some("//evil.example.com/")), "/");
        assert_eq!(local_path(Some("/\\evil.example.com")), "/");
        assert_eq!(local_path(Some("https://evil.example.com/")), "/");
        assert_eq!(local_path(None), "/");
    }
}

/// Single sign-on settings (`kortex serve` and `kortex run`; docs/sso.md).
#[derive(clap::Args, Debug, Clone)]
pub struct SsoArgs {
    /// The OpenID provider's issuer URL (e.g. `https://dex.example.com`): turns on "Sign in
    /// with …" in the dashboard and `kortex login`.
    #[arg(long, env = "KORTEX_OIDC_ISSUER", value_name = "URL")]
    pub oidc_issuer: Option<String>,
    /// Kortex's client id at the provider.
    #[arg(long, env = "KORTEX_OIDC_CLIENT_ID", value_name = "ID")]
    pub oidc_client_id: Option<String>,
    /// A file holding the client secret (without one: a public client, PKCE only).
    #[arg(long, env = "KORTEX_OIDC_CLIENT_SECRET_FILE", value_name = "FILE")]
    pub oidc_client_secret_file: Option<std::path::PathBuf>,
    /// Cluster mode: the client secret from a Secret of Kortex's namespace, `NAME/KEY`; the
    /// Secret must carry the label `kortex.dev/use: "true"`.
    #[arg(long, env = "KORTEX_OIDC_CLIENT_SECRET_REF", value_name = "NAME/KEY")]
    pub oidc_client_secret_ref: Option<String>,
    /// Scopes to ask for, comma-separated (`openid` is always asked for).
    #[arg(
        long,
        env = "KORTEX_OIDC_SCOPES",
        value_delimiter = ',',
        default_value = "openid,profile,email"
    )]
    pub oidc_scopes: Vec<String>,
    /// The claim with the user name.
    #[arg(long, env = "KORTEX_OIDC_USERNAME_CLAIM", default_value = "email")]
    pub oidc_username_claim: String,
    /// The claim with the groups.
    #[arg(long, env = "KORTEX_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// Prefixed to user names (e.g. `oidc:`, as the API server's authenticator does).
    #[arg(long, env = "KORTEX_OIDC_USERNAME_PREFIX", default_value = "")]
    pub oidc_username_prefix: String,
    /// Prefixed to group names.
    #[arg(long, env = "KORTEX_OIDC_GROUPS_PREFIX", default_value = "")]
    pub oidc_groups_prefix: String,
    /// Only members of one of these groups may sign in (comma-separated; default: anyone
    /// the provider signs in).
    #[arg(long, env = "KORTEX_OIDC_ALLOWED_GROUPS", value_delimiter = ',')]
    pub oidc_allowed_groups: Vec<String>,
    /// Only e-mail addresses of these domains may sign in (comma-separated).
    #[arg(long, env = "KORTEX_OIDC_ALLOWED_DOMAINS", value_delimiter = ',')]
    pub oidc_allowed_domains: Vec<String>,
    /// An audience accepted in ID tokens besides the client id.
    #[arg(long, env = "KORTEX_OIDC_AUDIENCE")]
    pub oidc_audience: Option<String>,
    /// The name on the sign-in button (default: the issuer's host).
    #[arg(long, env = "KORTEX_OIDC_NAME")]
    pub oidc_name: Option<String>,
    /// CA certificates (PEM) for the provider's TLS, besides the system's.
    #[arg(long, env = "KORTEX_OIDC_CA_FILE", value_name = "FILE")]
    pub oidc_ca_file: Option<std::path::PathBuf>,
    /// The callback URL registered at the provider (default: `--public-url` or the
    /// request's host, then `/auth/v1/oidc/callback`).
    #[arg(long, env = "KORTEX_OIDC_REDIRECT_URL", value_name = "URL")]
    pub oidc_redirect_url: Option<String>,
    /// Cluster mode: how the signed-in user's Kubernetes requests are made — `token` (the
    /// ID token as their bearer token: the API server trusts the issuer), `impersonate`
    /// (Kortex impersonates the verified user and groups), or `off`.
    #[arg(long, env = "KORTEX_OIDC_KUBERNETES", value_enum, default_value_t = KubeMode::Token)]
    pub oidc_kubernetes: KubeMode,
    /// `impersonate` mode: the only groups Kortex impersonates (comma-separated; the chart
    /// grants impersonation of exactly these). Default: every group the ID token names,
    /// never a `system:` one.
    #[arg(long, env = "KORTEX_OIDC_IMPERSONATE_GROUPS", value_delimiter = ',')]
    pub oidc_impersonate_groups: Vec<String>,
    /// A file holding the key (32 bytes or more) sign-ins are sealed with: the same for
    /// every replica (default: a random key of this process; sign-ins end on restart).
    #[arg(long, env = "KORTEX_SESSION_KEY_FILE", value_name = "FILE")]
    pub session_key_file: Option<std::path::PathBuf>,
    /// Scopes an OAuth access token presented to `/mcp` or an A2A agent must carry
    /// (comma-separated; advertised in the protected resource metadata). Never `openid`
    /// (MCP clients send no nonce, which some providers then refuse).
    #[arg(long, env = "KORTEX_OAUTH_SCOPES", value_delimiter = ',')]
    pub oauth_scopes: Vec<String>,
}

impl SsoArgs {
    /// The relying party these settings describe (`None`: no `--oidc-issuer`).
    /// `client_secret`: the secret resolved from `--oidc-client-secret-ref` (cluster mode).
    pub fn build(
        &self,
        egress: &Arc<crate::egress::Egress>,
        public_url: Option<&str>,
        client_secret: Option<crate::catalog::SecretValue>,
        cluster: bool,
    ) -> Result<Option<Sso>, String> {
        let Some(issuer) = self.oidc_issuer.clone().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        if self.oauth_scopes.iter().any(|s| s == "openid") {
            return Err(
                "--oauth-scopes must not name openid: MCP clients ask for the scopes without a nonce, which providers refuse with openid (name a scope of your own, e.g. kortex:mcp)".into(),
            );
        }
        let client_id = self
            .oidc_client_id
            .clone()
            .filter(|s| !s.is_empty())
            .ok_or("--oidc-issuer needs --oidc-client-id")?;
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        };
        let client_secret = match (&self.oidc_client_secret_file, client_secret) {
            (_, Some(s)) => Some(s),
            (Some(path), None) => {
                let bytes = read("--oidc-client-secret-file", path)?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| "the OIDC client secret file is not UTF-8 text".to_owned())?;
                Some(crate::catalog::SecretValue::new(text.trim()))
            }
            (None, None) => None,
        };
        let key = match &self.session_key_file {
            Some(path) => SessionKey::from_secret(&read("--session-key-file", path)?)
                .map_err(|e| format!("--session-key-file: {e}"))?,
            None => {
                tracing::warn!(
                    "no --session-key-file: sign-ins are sealed with a key of this process; they end when it restarts, and other replicas cannot read them"
                );
                SessionKey::random()
            }
        };
        let display_name = self.oidc_name.clone().unwrap_or_else(|| {
            reqwest::Url::parse(&issuer)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_else(|| issuer.clone())
        });
        let settings = crate::oidc::Settings {
            issuer,
            client_id,
            client_secret,
            scopes: self.oidc_scopes.clone(),
            username_claim: self.oidc_username_claim.clone(),
            groups_claim: self.oidc_groups_claim.clone(),
            username_prefix: self.oidc_username_prefix.clone(),
            groups_prefix: self.oidc_groups_prefix.clone(),
            allowed_groups: self.oidc_allowed_groups.clone(),
            allowed_domains: self.oidc_allowed_domains.clone(),
            audience: self.oidc_audience.clone(),
            display_name,
            ca_pem: self
                .oidc_ca_file
                .as_deref()
                .map(|p| read("--oidc-ca-file", p))
                .transpose()?,
        };
        let provider = Provider::new(settings, egress)?;
        let redirect_url = self
            .oidc_redirect_url
            .clone()
            .or_else(|| public_url.map(|u| format!("{}{CALLBACK_PATH}", u.trim_end_matches('/'))));
        let kube = if cluster {
            self.oidc_kubernetes
        } else {
            KubeMode::Off
        };
        Ok(Some(Sso {
            resource: public_url.map(|u| u.trim_end_matches('/').to_owned()),
            oauth_scopes: self.oauth_scopes.clone(),
            ..Sso::new(provider, key, kube, redirect_url)
                .impersonating_only(self.oidc_impersonate_groups.clone())
        }))
    }
}
