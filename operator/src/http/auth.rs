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
    /// In cluster mode, the caller's own Kubernetes bearer token (kept in memory only):
    /// decisions and tools run as them with it.
    pub token: Option<crate::catalog::SecretValue>,
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

/// The local user in loopback mode.
pub const LOCAL_USER: &str = "local";

fn is_loopback_host(host: &str) -> bool {
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

/// Middleware: authenticates the request and stores the [`Caller`] in its extensions.
pub async fn authenticate(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let caller = match state.auth {
        AuthMode::Loopback => {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default();
            if !is_loopback_host(host) {
                return Err(ApiError::forbidden(format!(
                    "Host {host:?} is not a loopback name; this server listens on loopback and only answers requests addressed to it"
                )));
            }
            if let Some(origin) = req
                .headers()
                .get(header::ORIGIN)
                .and_then(|h| h.to_str().ok())
            {
                let authority = origin.split_once("://").map_or("", |(_, a)| a);
                if origin != "null" && !is_loopback_host(authority) {
                    return Err(ApiError::forbidden(format!(
                        "cross-origin request from {origin} refused"
                    )));
                }
                if origin == "null" {
                    return Err(ApiError::forbidden(
                        "requests from opaque origins are refused",
                    ));
                }
            }
            Caller {
                user: LOCAL_USER.to_owned(),
                groups: Vec::new(),
                token: None,
            }
        }
        AuthMode::Keys | AuthMode::Cluster => {
            let presented = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| {
                    h.strip_prefix("Bearer ")
                        .or_else(|| h.strip_prefix("bearer "))
                })
                .map(str::trim);
            let Some(presented) = presented else {
                return Err(ApiError::unauthorized(
                    "missing Authorization: Bearer <key or Kubernetes token>; keys come from Secrets labelled kortex.dev/credentials=chat",
                ));
            };
            let config = state.config.borrow().clone();
            match config
                .catalog
                .credentials
                .authenticate(CredentialKind::Chat, presented)
            {
                Some(c) => Caller {
                    user: c.principal.clone(),
                    groups: c.groups.clone(),
                    token: None,
                },
                None => match (&state.auth, &state.cluster_auth) {
                    (AuthMode::Cluster, Some(cluster)) => match cluster.review(presented).await {
                        Ok(Some(user)) => Caller {
                            user: user.name,
                            groups: user.groups,
                            token: Some(crate::catalog::SecretValue::new(presented)),
                        },
                        Ok(None) => {
                            return Err(ApiError::unauthorized(
                                "invalid token: neither a chat key nor a Kubernetes token the API server accepts",
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot review a bearer token");
                            return Err(ApiError::new(
                                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                "auth_unavailable",
                                "the Kubernetes API server could not check the token; try again",
                            ));
                        }
                    },
                    _ => return Err(ApiError::unauthorized("invalid API key")),
                },
            }
        }
    };
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

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
