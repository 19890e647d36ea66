//! The dashboard (SPEC §4 Browsers): static assets embedded in the binary, served at `/`,
//! and the browser sign-in. A browser signs in once with a token or key
//! (`POST /auth/v1/login`); the credential then travels in an HttpOnly, SameSite=Strict
//! cookie — EventSource cannot send headers — and every request that changes state must
//! echo the CSRF cookie in `X-CSRF-Token` (double-submit, so any replica can check it
//! without shared state). On a loopback server without credentials there is nothing to
//! sign in to; behind an authenticating proxy its headers identify the user.

use super::AppState;
use super::auth::{
    AUTH_COOKIE, AuthMode, CSRF_COOKIE, Caller, LOCAL_USER, caller_for_token, check_loopback,
};
use super::error::ApiError;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;

const INDEX: &str = include_str!("../../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../../assets/dashboard/app.js");
const APP_CSS: &str = include_str!("../../assets/dashboard/app.css");
const ICON: &str = include_str!("../../assets/dashboard/icon.svg");

/// How long a browser stays signed in.
const SIGN_IN_SECONDS: u64 = 12 * 3600;

/// Only this origin's scripts, styles, images and connections: the dashboard makes no
/// request to any other host.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /`: the dashboard page.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /assets/{file}`.
pub async fn assets(Path(file): Path<String>) -> Result<Response, ApiError> {
    Ok(match file.as_str() {
        "app.js" => asset("text/javascript; charset=utf-8", APP_JS),
        "app.css" => asset("text/css; charset=utf-8", APP_CSS),
        "icon.svg" => asset("image/svg+xml", ICON),
        _ => return Err(ApiError::not_found(format!("no asset {file}"))),
    })
}

/// `POST /auth/v1/login` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    /// A chat API key, or in cluster mode a Kubernetes bearer token.
    #[serde(default)]
    token: Option<String>,
}

fn mode(state: &AppState) -> &'static str {
    match state.auth {
        AuthMode::Loopback => "loopback",
        AuthMode::Keys => "keys",
        AuthMode::Cluster => "kubernetes",
    }
}

fn me_json(state: &AppState, caller: &Caller) -> serde_json::Value {
    use crate::operator::auth::KubeCredential;
    json!({
        "user": caller.user,
        "groups": caller.groups,
        "mode": mode(state),
        "proxy": state.auth_proxy.is_some(),
        "kubernetesIdentity": caller.kube.is_some(),
        // How the API server learns who the caller is: their own `token`, Kortex's
        // `impersonation` of a signed-in user, or null (none: Kortex's own rights).
        "kubernetesMode": caller.kube.as_ref().map(|k| match k {
            KubeCredential::Token(_) => "token",
            KubeCredential::Impersonate { .. } => "impersonation",
        }),
        // Single sign-on, when configured: the provider and the Kubernetes mode its
        // sign-ins get.
        "sso": state.sso.as_ref().map(|s| json!({
            "provider": s.provider.settings.display_name,
            "issuer": s.provider.settings.issuer,
            "kubernetes": s.kube.as_str(),
        })),
        // Proposals are ActionProposal objects (cluster mode: `kubectl kortex approve`),
        // else rows of this server's database (`kortex proposals approve`).
        "actionProposals": state.engine.cluster.get().is_some(),
    })
}

/// Whether the browser reached us over HTTPS (directly or through a TLS-terminating
/// proxy): only then are cookies marked `Secure` (a browser drops Secure cookies set over
/// plain HTTP on anything but localhost).
fn secure(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(name: &str, value: &str, http_only: bool, max_age: u64, secure: bool) -> HeaderValue {
    // Over HTTPS the `__Host-` prefix makes browsers refuse the cookie from anywhere but
    // this host (no Domain attribute, Path=/, Secure).
    let prefix = if secure { "__Host-" } else { "" };
    let mut c = format!("{prefix}{name}={value}; Path=/; SameSite=Strict; Max-Age={max_age}");
    if http_only {
        c.push_str("; HttpOnly");
    }
    if secure {
        c.push_str("; Secure");
    }
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `POST /auth/v1/login`: checks the token or key like any bearer credential and, when it
/// is good, keeps it in the browser's HttpOnly cookie. Returns who signed in and the CSRF
/// token to send with requests that change anything.
pub async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<Login>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let body = super::access::json_body(body)?;
    if state.auth == AuthMode::Loopback {
        check_loopback(&headers)?;
        let caller = Caller {
            user: LOCAL_USER.to_owned(),
            groups: Vec::new(),
            kube: None,
            subject: None,
        };
        return Ok(Json(me_json(&state, &caller)).into_response());
    }
    let token = body
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "token is required: a chat API key, or in cluster mode a Kubernetes token (kubectl create token ...)",
            )
        })?;
    // Cookie values cannot hold every byte; keys and Kubernetes tokens never need them.
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',' && b != b'"' && b != b'\\')
    {
        return Err(ApiError::unauthorized("invalid token"));
    }
    let caller = caller_for_token(&state, token).await?;
    let csrf = crate::store::new_id().replace('-', "");
    let secure = secure(&headers);
    let mut response = Json({
        let mut v = me_json(&state, &caller);
        v["csrfToken"] = json!(csrf);
        v
    })
    .into_response();
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(AUTH_COOKIE, token, true, SIGN_IN_SECONDS, secure),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(CSRF_COOKIE, &csrf, false, SIGN_IN_SECONDS, secure),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `POST /auth/v1/logout`: forgets the browser's credential; a single sign-on session ends
/// on every replica, and the answer says where to end it at the provider too
/// (`endSessionUrl`, when the provider offers RP-initiated logout).
pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let end_session = super::sso::sign_out(&state, &headers).await;
    let secure = secure(&headers);
    let mut response = match end_session {
        Some(url) => Json(json!({"endSessionUrl": url})).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    };
    super::sso::clear_cookies(&headers, &mut response);
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(AUTH_COOKIE, "", true, 0, secure),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(CSRF_COOKIE, "", false, 0, secure),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /auth/v1/me`: who the caller is (401 when a browser has not signed in).
pub async fn me(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Json<serde_json::Value> {
    Json(me_json(&state, &caller))
}

/// `GET /chat/v1/route`: whether any ChatPolicy can answer now (from the last probes) and,
/// when none can, each policy's reason and fix — the dashboard's first screen says so before
/// a session exists (a session's own banner uses `/chat/v1/sessions/{id}/route`). In a
/// cluster the reasons name policies and providers of every namespace, which a caller may not
/// be allowed to see: there only whether any can answer, and where to look.
pub async fn route_any(State(state): State<AppState>) -> Json<serde_json::Value> {
    let config = state.config.borrow().clone();
    let probes = state
        .engine
        .probes
        .get()
        .and_then(|(board, _)| board.read().ok().map(|b| b.clone()))
        .unwrap_or_default();
    let lines = crate::govern::reach::summary(&config.catalog, &probes, jiff::Timestamp::now());
    let reachable = lines.iter().any(Result::is_ok);
    let messages: Vec<String> = if state.auth == AuthMode::Cluster {
        if reachable {
            Vec::new()
        } else {
            vec!["No provider can answer now: the LLMProviders' Ready and Reachable conditions say why (kubectl get llmproviders -A).".into()]
        }
    } else if config.catalog.policies.is_empty() {
        vec!["No ChatPolicy is loaded: a session needs one to be answered.".into()]
    } else if reachable {
        Vec::new()
    } else {
        lines.into_iter().filter_map(Result::err).collect()
    };
    Json(json!({"reachable": reachable, "messages": messages}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole embedded dashboard stays small (issue 25: under 300 KB uncompressed) and
    /// names no outside origin to load from.
    #[test]
    fn the_dashboard_is_small_and_self_contained() {
        let total = INDEX.len() + APP_JS.len() + APP_CSS.len() + ICON.len();
        assert!(total < 300_000, "the dashboard is {total} bytes");
        for (name, text) in [("index.html", INDEX), ("app.css", APP_CSS)] {
            assert!(
                !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"),
                "{name} refers to another origin"
            );
        }
        assert!(!APP_JS.contains("import("), "app.js loads no module");
        assert!(!APP_JS.contains("innerHTML"), "app.js never parses HTML");
    }
}
