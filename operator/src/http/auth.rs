//! Who may call the API. On a loopback address without credentials, anyone on the machine
//! may, but the `Host` and `Origin` headers must be loopback too, so a web page cannot
//! drive the API through DNS rebinding. Anywhere else every `/api` and `/chat` request needs
//! `Authorization: Bearer <key>` of a chat credential Secret, or, in cluster mode, a
//! Kubernetes bearer token (OIDC or ServiceAccount) the API server accepts (TokenReview).

use super::AppState;
use super::error::ApiError;
use crate::catalog::CredentialKind;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

/// The authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// User name.
    pub user: String,
    /// Groups.
    pub groups: Vec<String>,
    /// In cluster mode, how Kubernetes requests are made as the caller (their own bearer
    /// token, or impersonation of a signed-in user): decisions and tools run as them.
    pub kube: Option<crate::operator::auth::KubeCredential>,
    /// Their own OAuth token (an access token they presented, or their single sign-on
    /// session's), which `oauthTokenExchange` tools exchange to call on their behalf.
    pub subject: Option<crate::tools::mcp_oauth::SubjectToken>,
}

/// How requests are authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Listening on loopback: no credentials; loopback `Host`/`Origin` only.
    Loopback,
    /// Bearer keys from chat credential Secrets.
    Keys,
    /// Cluster mode: chat credential keys, or Kubernetes bearer tokens (TokenReview).
    Cluster,
}

/// Identity headers of an authenticating proxy (oauth2-proxy and the like), trusted only
/// from the configured source networks.
#[derive(Clone, Debug)]
pub struct AuthProxy {
    /// Header with the user name, e.g. `X-Forwarded-User`.
    pub user_header: String,
    /// Header with comma-separated groups, e.g. `X-Forwarded-Groups`.
    pub groups_header: String,
    /// Networks the proxy connects from.
    pub from: Vec<Cidr>,
    /// A shared secret the proxy must also send (header name, value): an address alone is
    /// weak proof when other workloads share the network.
    pub secret: Option<(String, crate::catalog::SecretValue)>,
}

/// An IP network, `10.0.0.0/8` or `fd00::/8` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s.split_once('/').unwrap_or((s, ""));
        let addr: std::net::IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP network like 10.0.0.0/8"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?
        };
        Ok(Self { addr, prefix })
    }
}

impl Cidr {
    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        let (a, b, bits) = match (self.addr, ip) {
            (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => (
                u128::from(u32::from(a)) << 96,
                u128::from(u32::from(b)) << 96,
                self.prefix,
            ),
            (std::net::IpAddr::V6(a), std::net::IpAddr::V6(b)) => {
                (u128::from(a), u128::from(b), self.prefix)
            }
            _ => return false,
        };
        let mask = if bits == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(bits))
        };
        a & mask == b & mask
    }
}

/// The caller an authenticating proxy vouches for, when the request comes from it.
fn proxied(proxy: &AuthProxy, req: &Request) -> Option<Caller> {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()?
        .0
        .ip();
    if !proxy.from.iter().any(|c| c.contains(peer)) {
        return None;
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if let Some((name, secret)) = &proxy.secret {
        let sent = header(name).unwrap_or_default();
        if !crate::catalog::constant_time_eq(sent.as_bytes(), secret.expose().as_bytes()) {
            return None;
        }
    }
    let user = header(&proxy.user_header)?;
    let groups = header(&proxy.groups_header)
        .map(crate::catalog::group_list)
        .unwrap_or_default();
    Some(Caller {
        user: user.to_owned(),
        groups,
        kube: None,
        subject: None,
    })
}

/// The local user in loopback mode.
pub const LOCAL_USER: &str = "local";

pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The cookie a signed-in browser presents its token or key in (HttpOnly).
pub const AUTH_COOKIE: &str = "kortex_auth";
/// The cookie holding the CSRF token (readable by the page, echoed in [`CSRF_HEADER`]).
pub const CSRF_COOKIE: &str = "kortex_csrf";
/// The header a browser's state-changing requests must carry (double-submit).
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The value of the dashboard cookie `name`: over HTTPS it is set as `__Host-<name>` (bound
/// to this host: a sibling subdomain cannot plant or overwrite it), else as `<name>`.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    raw_cookie(headers, &format!("__Host-{name}")).or_else(|| raw_cookie(headers, name))
}

fn raw_cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Loopback mode: the request must be addressed to a loopback name and, if it says where it
/// comes from, come from a loopback origin (no DNS rebinding, no cross-site requests).
pub fn check_loopback(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !is_loopback_host(host) {
        return Err(ApiError::forbidden(format!(
            "Host {host:?} is not a loopback name; this server listens on loopback and only answers requests addressed to it"
        )));
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()) {
        if origin == "null" {
            return Err(ApiError::forbidden(
                "requests from opaque origins are refused",
            ));
        }
        let authority = origin.split_once("://").map_or("", |(_, a)| a);
        if !is_loopback_host(authority) {
            return Err(ApiError::forbidden(format!(
                "cross-origin request from {origin} refused"
            )));
        }
    }
    Ok(())
}

/// Who `presented` (a chat key, or in cluster mode a Kubernetes token) belongs to.
pub async fn caller_for_token(state: &AppState, presented: &str) -> Result<Caller, ApiError> {
    let config = state.config.borrow().clone();
    if let Some(c) = config
        .catalog
        .credentials
        .authenticate(CredentialKind::Chat, presented)
    {
        return Ok(Caller {
            user: c.principal.clone(),
            groups: c.groups.clone(),
            kube: None,
            subject: None,
        });
    }
    match (&state.auth, &state.cluster_auth) {
        (AuthMode::Cluster, Some(cluster)) => match cluster.review(presented).await {
            Ok(Some(user)) => Ok(Caller {
                user: user.name,
                groups: user.groups,
                kube: Some(crate::operator::auth::KubeCredential::Token(
                    crate::catalog::SecretValue::new(presented),
                )),
                subject: None,
            }),
            Ok(None) => Err(ApiError::unauthorized(
                "invalid token: neither a chat key nor a Kubernetes token the API server accepts",
            )),
            // Logged once per outage by ClusterAuth, not per request.
            Err(e) => {
                tracing::debug!(error = %e, "cannot review a bearer token");
                Err(ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "auth_unavailable",
                    "the Kubernetes API server could not check the token; try again",
                ))
            }
        },
        _ => Err(ApiError::unauthorized("invalid API key")),
    }
}

/// Where the MCP door is (`crate::http::mcp`); a claude-code run's credential is taken there only.
pub const MCP_PATH: &str = "/mcp";

/// The run a request's bearer credential was made for: only to `/mcp`, only from this
/// machine, only while the run's provider call lasts.
pub fn run_credential(
    state: &AppState,
    req: &axum::extract::Request,
) -> Option<std::sync::Arc<crate::chat::delegate::Delegation>> {
    if req.uri().path() != MCP_PATH {
        return None;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim();
    if !bearer.starts_with("kortex-run-") {
        return None;
    }
    let local = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .is_some_and(|c| c.0.ip().is_loopback());
    if !local {
        return None;
    }
    state.engine.delegations.get(bearer)
}

/// Authenticates every `/api` and `/chat` request: an authenticating proxy's headers (from
/// its networks only), loopback checks, or a bearer token — in the `Authorization` header,
/// or, for a signed-in browser, in the HttpOnly [`AUTH_COOKIE`], in which case requests
/// that change anything must echo the [`CSRF_COOKIE`] in [`CSRF_HEADER`].
pub async fn authenticate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    match authenticated(&state, req, next).await {
        Ok(response) => response,
        // A 401 says where OAuth clients find how to get a token (when Kortex takes them).
        Err(e) => super::oauth::with_challenge(
            &state,
            &path,
            axum::response::IntoResponse::into_response(e),
        ),
    }
}

async fn authenticated(
    state: &AppState,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let state = state.clone();
    // An authenticating proxy's identity headers, from the proxy's own address only.
    if let Some(caller) = state.auth_proxy.as_deref().and_then(|p| proxied(p, &req)) {
        req.extensions_mut().insert(caller);
        return Ok(next.run(req).await);
    }
    // A claude-code run's own credential, presented by its CLI on this machine to /mcp.
    if let Some(delegation) = run_credential(&state, &req) {
        req.extensions_mut().insert(Caller {
            user: delegation.user.clone(),
            groups: Vec::new(),
            kube: None,
            subject: None,
        });
        req.extensions_mut().insert(delegation);
        return Ok(next.run(req).await);
    }
    // An OAuth access token of the single sign-on issuer, for Kortex (docs/mcp.md#oauth).
    let path = req.uri().path().to_owned();
    if let Some(caller) = super::oauth::caller(&state, req.headers(), &path).await {
        req.extensions_mut().insert(caller?);
        return Ok(next.run(req).await);
    }
    // A signed-in session (docs/sso.md): its cookie, or `kortex login`'s bearer token.
    if let Some(sso) = &state.sso
        && let Some((id, from_cookie)) = super::sso::presented(req.headers())
    {
        if from_cookie {
            check_csrf(req.method(), req.headers())?;
        }
        let id = id.to_owned();
        let caller = super::sso::caller(&state, sso, &id).await?;
        req.extensions_mut().insert(caller);
        return Ok(next.run(req).await);
    }
    let caller = match state.auth {
        AuthMode::Loopback => {
            check_loopback(req.headers())?;
            Caller {
                user: LOCAL_USER.to_owned(),
                groups: Vec::new(),
                kube: None,
                subject: None,
            }
        }
        AuthMode::Keys | AuthMode::Cluster => {
            let headers = req.headers();
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| {
                    h.strip_prefix("Bearer ")
                        .or_else(|| h.strip_prefix("bearer "))
                })
                .map(str::trim);
            let presented = match bearer {
                Some(b) => b.to_owned(),
                None => {
                    let Some(from_cookie) = cookie(headers, AUTH_COOKIE) else {
                        return Err(ApiError::unauthorized(
                            "missing Authorization: Bearer <key or Kubernetes token>; keys come from Secrets labelled kortex.dev/credentials=chat",
                        ));
                    };
                    check_csrf(req.method(), headers)?;
                    from_cookie.to_owned()
                }
            };
            caller_for_token(&state, &presented).await?
        }
    };
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

/// A cookie-authenticated request that changes state must carry the CSRF cookie's value in
/// the CSRF header (a page of another site can make the browser send the cookie, but cannot
/// read it).
fn check_csrf(
    method: &axum::http::Method,
    headers: &axum::http::HeaderMap,
) -> Result<(), ApiError> {
    use axum::http::Method;
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let expected = cookie(headers, CSRF_COOKIE);
    let given = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match (expected, given) {
        (Some(e), Some(g)) if crate::catalog::constant_time_eq(e.as_bytes(), g.as_bytes()) => {
            Ok(())
        }
        _ => Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "csrf_failed",
            "missing or wrong X-CSRF-Token header for a cookie-authenticated request; sign in again",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{Cidr, cookie, is_loopback_host};

    #[test]
    fn host_prefixed_cookies_win_over_plain_ones() {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            axum::http::HeaderValue::from_static(
                "kortex_csrf=planted; __Host-kortex_csrf=real; other=x",
            ),
        );
        assert_eq!(cookie(&h, "kortex_csrf"), Some("real"));
        assert_eq!(cookie(&h, "other"), Some("x"));
        assert_eq!(cookie(&h, "kortex_auth"), None);
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let net: Cidr = "10.1.0.0/16".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(net.contains("10.1.200.3".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(!net.contains("10.2.0.1".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(net.contains("::ffff:10.1.0.9".parse().unwrap_or_else(|e| panic!("{e}"))));
        let one: Cidr = "192.168.1.7".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(one.contains("192.168.1.7".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(!one.contains("192.168.1.8".parse().unwrap_or_else(|e| panic!("{e}"))));
        let v6: Cidr = "fd00::/8".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(v6.contains("fd12::1".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(!v6.contains("10.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err() && "proxy".parse::<Cidr>().is_err());
        let all: Cidr = "0.0.0.0/0".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(all.contains("8.8.8.8".parse().unwrap_or_else(|e| panic!("{e}"))));
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "10.0.0.1:8080",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
