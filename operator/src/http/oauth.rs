//! Kortex as an OAuth 2.1 resource server for its MCP door and its A2A agents
//! (`docs/mcp.md#oauth`, the MCP authorization spec): on when single sign-on is configured
//! and `--public-url` names Kortex.
//!
//! - Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource`
//!   (the server) and `/.well-known/oauth-protected-resource/mcp` (the MCP endpoint): the
//!   single sign-on issuer is the authorization server.
//! - A 401 of `/mcp` or `/a2a/…` says where that metadata is (`WWW-Authenticate: Bearer
//!   resource_metadata=…`), so a client discovers the rest.
//! - An access token is a JWT the issuer signed, for Kortex (`aud`: the server's URL or the
//!   endpoint's — a token for anyone else is refused, never passed on), unexpired, with the
//!   scopes `--oauth-scopes` names. Its subject and groups (from its claims, else the
//!   provider's `userinfo` with it) are the caller, as a signed-in user is; in the
//!   `impersonate` mode their Kubernetes rights apply by impersonation.

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use super::sso::{KubeMode, Sso};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, extract::Path};
use serde_json::{Value, json};

/// The metadata of the server as a whole.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Whether Kortex takes OAuth access tokens: single sign-on, and a public URL.
fn resource(state: &AppState) -> Option<(&Sso, &str)> {
    let sso = state.sso.as_deref()?;
    Some((sso, sso.resource.as_deref()?))
}

/// The OAuth 2.0 security scheme of an Agent Card when Kortex takes access tokens: the
/// single sign-on issuer's client credentials flow (its token endpoint, from its metadata)
/// and `--oauth-scopes`; `None` when Kortex takes none, or the issuer cannot be read now.
pub async fn card_scheme(state: &AppState) -> Option<Value> {
    let (sso, _) = resource(state)?;
    let meta = sso.provider.metadata().await.ok()?;
    let scopes: serde_json::Map<String, Value> = sso
        .oauth_scopes
        .iter()
        .map(|s| (s.clone(), Value::from("use Kortex's agents as yourself")))
        .collect();
    Some(json!({"oauth2SecurityScheme": {
        "description": "An OAuth access token for Kortex from the company's identity provider (RFC 8707 resource: this agent's URL or Kortex's): the caller's own identity, whose rights apply",
        "flows": {"clientCredentials": {"tokenUrl": meta.token_endpoint, "scopes": scopes}},
        "oauth2MetadataUrl": format!("{}/.well-known/openid-configuration", sso.provider.settings.issuer.trim_end_matches('/')),
    }}))
}

fn metadata(sso: &Sso, resource: &str) -> Value {
    let mut v = json!({
        "resource": resource,
        "authorization_servers": [sso.provider.settings.issuer],
        "bearer_methods_supported": ["header"],
        "resource_name": "Kortex",
        "resource_documentation": "https://kortex.dev/docs/mcp#oauth",
    });
    if !sso.oauth_scopes.is_empty() {
        v["scopes_supported"] = json!(sso.oauth_scopes);
    }
    v
}

/// `GET /.well-known/oauth-protected-resource` (the server).
pub async fn server_metadata(State(state): State<AppState>) -> Response {
    match resource(&state) {
        Some((sso, r)) => Json(metadata(sso, r)).into_response(),
        None => not_on(),
    }
}

/// `GET /.well-known/oauth-protected-resource/{*path}` (an endpoint of it: `mcp`,
/// `a2a/v1/…`).
pub async fn endpoint_metadata(
    State(state): State<AppState>,
    Path(path): Path<String>,
) -> Response {
    match resource(&state) {
        Some((sso, r)) => {
            Json(metadata(sso, &format!("{r}/{}", path.trim_matches('/')))).into_response()
        }
        None => not_on(),
    }
}

fn not_on() -> Response {
    ApiError::not_found(
        "Kortex takes no OAuth access tokens here: it needs single sign-on (--oidc-issuer) and --public-url",
    )
    .into_response()
}

/// The `WWW-Authenticate` challenge of a 401 for `path`, when OAuth is on.
pub fn challenge(state: &AppState, path: &str) -> Option<HeaderValue> {
    let (sso, r) = resource(state)?;
    let endpoint = if path == super::mcp::PATH || path.starts_with("/a2a/") {
        format!("{r}{METADATA_PATH}{path}")
    } else {
        format!("{r}{METADATA_PATH}")
    };
    let mut value = format!("Bearer resource_metadata=\"{endpoint}\"");
    if !sso.oauth_scopes.is_empty() {
        value.push_str(&format!(", scope=\"{}\"", sso.oauth_scopes.join(" ")));
    }
    HeaderValue::from_str(&value).ok()
}

/// Adds the challenge to a 401.
pub fn with_challenge(state: &AppState, path: &str, mut response: Response) -> Response {
    if response.status() == StatusCode::UNAUTHORIZED
        && let Some(v) = challenge(state, path)
    {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// The caller an OAuth access token in `headers` names: `None` when there is none (no
/// bearer JWT of the single sign-on issuer that is not an ID token of Kortex's own client),
/// else the verified caller or why not.
pub async fn caller(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
) -> Option<Result<Caller, ApiError>> {
    let (sso, r) = resource(state)?;
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })?
        .trim();
    let claims = unverified_claims(token)?;
    let settings = &sso.provider.settings;
    if claims["iss"].as_str() != Some(settings.issuer.as_str()) {
        return None;
    }
    // An ID token of Kortex's own client goes the way it always went (the API server's
    // JWT authenticator, in the token mode).
    let for_client = match &claims["aud"] {
        Value::String(a) => *a == settings.client_id,
        Value::Array(a) => a
            .iter()
            .any(|a| a.as_str() == Some(settings.client_id.as_str())),
        _ => false,
    };
    if for_client {
        return None;
    }
    Some(verified(sso, r, token, path).await)
}

async fn verified(sso: &Sso, resource: &str, token: &str, path: &str) -> Result<Caller, ApiError> {
    let endpoint = format!("{resource}{path}");
    let resources = [resource, endpoint.as_str()];
    let refused = |why: String| {
        tracing::info!(reason = %why, "an OAuth access token was refused");
        ApiError::unauthorized(format!("the access token is refused: {why}"))
    };
    let verified = sso
        .provider
        .verify_access(token, &resources)
        .await
        .map_err(|e| refused(e.to_string()))?;
    let granted: Vec<&str> = verified.claims["scope"]
        .as_str()
        .map(|s| s.split_whitespace().collect())
        .or_else(|| {
            verified.claims["scp"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
        })
        .unwrap_or_default();
    if let Some(missing) = sso
        .oauth_scopes
        .iter()
        .find(|s| !granted.contains(&s.as_str()))
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!("the access token lacks the scope {missing}"),
        ));
    }
    // Who: the token's claims, else the provider's userinfo (an access token may carry
    // only a subject).
    let settings = &sso.provider.settings;
    // A client's own token (client credentials: its subject is the client, as Glewlwyd and
    // Okta issue them) names no person, and userinfo knows none: the caller is the client,
    // `client:<id>`, under the same allowed groups and domains.
    let own_client = ["client_id", "azp"]
        .iter()
        .filter_map(|c| verified.claims[*c].as_str())
        .find(|c| verified.claims["sub"].as_str() == Some(*c))
        .filter(|_| verified.claims[&settings.username_claim].is_null())
        .map(str::to_owned);
    let mut claims = verified.claims.clone();
    if let Some(client) = &own_client {
        claims[&settings.username_claim] = Value::from(format!("client:{client}"));
    }
    let needs_userinfo = own_client.is_none()
        && (claims[&settings.username_claim].is_null() || claims[&settings.groups_claim].is_null());
    let userinfo = if needs_userinfo {
        sso.provider
            .userinfo(&verified.subject, token)
            .await
            .map_err(|e| refused(format!("who it is for could not be asked ({e})")))?
    } else {
        Value::Null
    };
    let identity = sso
        .provider
        .identity(&claims, &userinfo)
        .map_err(|e| refused(e.to_string()))?;
    if identity.user.starts_with("system:") {
        return Err(refused(format!(
            "{} names a user of the Kubernetes API server itself",
            identity.user
        )));
    }
    let kube = match sso.kube {
        KubeMode::Impersonate => Some(crate::operator::auth::KubeCredential::Impersonate {
            user: identity.user.clone(),
            groups: super::sso::kube_groups(sso, &identity.groups),
        }),
        // The token is Kortex's, not the API server's: Kortex does not pass it on.
        KubeMode::Token | KubeMode::Off => None,
    };
    Ok(Caller {
        user: identity.user,
        groups: identity.groups,
        kube,
        subject: Some(crate::tools::mcp_oauth::SubjectToken {
            token: crate::catalog::SecretValue::new(token),
            kind: crate::tools::mcp_oauth::SubjectKind::AccessToken,
            issuer: settings.issuer.clone(),
        }),
    })
}

/// The claims of a JWT, not verified (to see whose it is); `None` for anything else.
fn unverified_claims(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_, Some(claims), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    serde_json::from_slice(&crate::oidc::jwt::base64url(claims)?).ok()
}
