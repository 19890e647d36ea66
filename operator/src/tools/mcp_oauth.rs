//! OAuth for the remote MCP servers Kortex calls (`KortexTool.spec.mcp.auth.type:
//! oauthClientCredentials`, `docs/tools.md#oauth`), as the MCP authorization spec has a
//! client do it: the server's Protected Resource Metadata (RFC 9728) names its
//! authorization server, whose metadata (RFC 8414, else OpenID discovery) gives the token
//! endpoint; a token is asked for with the client credentials and the server's URL as the
//! resource indicator (RFC 8707), kept until shortly before it expires, and sent as
//! `Authorization: Bearer` on every request. Every request goes through the tool's egress
//! guard; the secret and the tokens are never logged.
//!
//! `oauthTokenExchange` calls on behalf of the chat user: the same client exchanges the
//! user's own token (the access token they presented to Kortex, or their single sign-on
//! session's) at the same token endpoint for one for the server (RFC 8693, with the
//! resource indicator), kept per user until shortly before it expires. The tools are
//! listed with the client's own credentials. A user's token goes only to the authorization
//! server that issued it: an MCP server whose metadata names another gets no call on
//! anyone's behalf (it could replay the token against Kortex).

use crate::catalog::SecretValue;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A token is renewed this long before it expires.
const EARLY: Duration = Duration::from_secs(30);
/// A token answered without `expires_in` is kept this long.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// One MCP server's client credentials and the token they got.
pub struct ClientCredentials {
    http: reqwest::Client,
    /// The server's URL: the resource tokens are asked for.
    resource: String,
    client_id: String,
    secret: SecretValue,
    scopes: Vec<String>,
    /// The authorization server the credentials are of (else the first the server names).
    issuer: Option<String>,
    state: tokio::sync::Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    /// The authorization server's issuer and token endpoint, once discovered.
    endpoint: Option<(String, String)>,
    token: Option<(SecretValue, Instant)>,
    /// Exchanged tokens, by the digest of the subject token they were exchanged for.
    exchanged: std::collections::HashMap<String, (SecretValue, Instant)>,
}

/// At most this many exchanged tokens are kept per server (the oldest expiring go first).
const MAX_EXCHANGED: usize = 256;

/// The chat user's own OAuth token: what `oauthTokenExchange` exchanges (RFC 8693).
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectToken {
    /// The token.
    pub token: SecretValue,
    /// What it is.
    pub kind: SubjectKind,
    /// Who issued it (the single sign-on issuer): the only authorization server it is
    /// sent to.
    pub issuer: String,
}

/// The kind of a subject token, as RFC 8693 names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubjectKind {
    /// An OAuth access token (`urn:ietf:params:oauth:token-type:access_token`).
    AccessToken,
    /// An OpenID Connect ID token (`urn:ietf:params:oauth:token-type:id_token`).
    IdToken,
}

impl SubjectKind {
    fn urn(self) -> &'static str {
        match self {
            Self::AccessToken => "urn:ietf:params:oauth:token-type:access_token",
            Self::IdToken => "urn:ietf:params:oauth:token-type:id_token",
        }
    }
}

impl std::fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SubjectToken({:?})", self.kind)
    }
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ClientCredentials({} for {})",
            self.client_id, self.resource
        )
    }
}

impl ClientCredentials {
    /// Credentials for the MCP server at `server_url` (its query dropped: the resource).
    pub fn new(
        http: reqwest::Client,
        server_url: &str,
        client_id: &str,
        secret: SecretValue,
        scopes: Vec<String>,
        issuer: Option<String>,
    ) -> Self {
        let resource = server_url.split(['?', '#']).next().unwrap_or(server_url);
        Self {
            http,
            resource: resource.to_owned(),
            client_id: client_id.to_owned(),
            secret,
            scopes,
            issuer,
            state: tokio::sync::Mutex::default(),
        }
    }

    /// A token for the server: the one kept, or a new one from the authorization server.
    pub async fn token(&self) -> Result<SecretValue, String> {
        let mut cached = self.state.lock().await;
        if let Some((t, until)) = &cached.token
            && Instant::now() < *until
        {
            return Ok(t.clone());
        }
        let (_, endpoint) = self.endpoint(&mut cached).await?;
        let (token, until) = self
            .request(
                &endpoint,
                vec![("grant_type", "client_credentials")],
                "the client credentials",
            )
            .await?;
        cached.token = Some((token.clone(), until));
        Ok(token)
    }

    /// A token for the server on behalf of `subject`'s holder: the one kept for them, or
    /// theirs exchanged at the authorization server (RFC 8693).
    pub async fn exchange(&self, subject: &SubjectToken) -> Result<SecretValue, String> {
        let key = crate::oidc::seal::digest(subject.token.expose());
        let mut cached = self.state.lock().await;
        let now = Instant::now();
        if let Some((t, until)) = cached.exchanged.get(&key)
            && now < *until
        {
            return Ok(t.clone());
        }
        let (issuer, endpoint) = self.endpoint(&mut cached).await?;
        if issuer.trim_end_matches('/') != subject.issuer.trim_end_matches('/') {
            return Err(format!(
                "the MCP server's authorization server is {issuer}, not {}, which issued the chat user's token: Kortex sends a user's token to its own issuer only (set auth.issuer to it, or use oauthClientCredentials)",
                subject.issuer
            ));
        }
        let (token, until) = self
            .request(
                &endpoint,
                vec![
                    (
                        "grant_type",
                        "urn:ietf:params:oauth:grant-type:token-exchange",
                    ),
                    ("subject_token", subject.token.expose()),
                    ("subject_token_type", subject.kind.urn()),
                    (
                        "requested_token_type",
                        "urn:ietf:params:oauth:token-type:access_token",
                    ),
                ],
                "to exchange the chat user's token",
            )
            .await?;
        cached.exchanged.retain(|_, (_, u)| now < *u);
        if cached.exchanged.len() >= MAX_EXCHANGED
            && let Some(first) = cached
                .exchanged
                .iter()
                .min_by_key(|(_, (_, u))| *u)
                .map(|(k, _)| k.clone())
        {
            cached.exchanged.remove(&first);
        }
        cached.exchanged.insert(key, (token.clone(), until));
        Ok(token)
    }

    /// The authorization server's issuer and token endpoint, discovered once.
    async fn endpoint(&self, cached: &mut Cached) -> Result<(String, String), String> {
        if let Some(e) = &cached.endpoint {
            return Ok(e.clone());
        }
        let e = self.discover().await?;
        cached.endpoint = Some(e.clone());
        Ok(e)
    }

    /// A token request with `form`, the resource and the scopes, authenticated as the
    /// client: the token and until when to keep it, or why not (`what` names what a
    /// refusal refused).
    async fn request(
        &self,
        endpoint: &str,
        mut form: Vec<(&str, &str)>,
        what: &str,
    ) -> Result<(SecretValue, Instant), String> {
        let scope = self.scopes.join(" ");
        form.push(("resource", self.resource.as_str()));
        if !scope.is_empty() {
            form.push(("scope", scope.as_str()));
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let response = self
            .http
            .post(endpoint)
            .basic_auth(&self.client_id, Some(self.secret.expose()))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "the authorization server could not be reached: {}",
                    e.without_url()
                )
            })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or_default();
        if !status.is_success() {
            return Err(format!(
                "the authorization server refused {what} ({status}): {} {}",
                body["error"].as_str().unwrap_or_default(),
                body["error_description"].as_str().unwrap_or_default()
            ));
        }
        let token = body["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or("the authorization server answered no access_token")?;
        let lifetime = body["expires_in"]
            .as_u64()
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let until = Instant::now() + lifetime.saturating_sub(EARLY).max(Duration::from_secs(1));
        Ok((SecretValue::new(token), until))
    }

    /// Forgets the token (the server refused it): the next request asks for a new one.
    pub async fn forget(&self) {
        self.state.lock().await.token = None;
    }

    /// The issuer and token endpoint: the server's metadata, then its authorization
    /// server's.
    async fn discover(&self) -> Result<(String, String), String> {
        let url = reqwest::Url::parse(&self.resource).map_err(|e| e.to_string())?;
        let origin = url.origin().ascii_serialization();
        let path = url.path().trim_end_matches('/');
        let mut servers: Vec<String> = Vec::new();
        for candidate in [
            format!("{origin}/.well-known/oauth-protected-resource{path}"),
            format!("{origin}/.well-known/oauth-protected-resource"),
        ] {
            if let Some(meta) = self.get_json(&candidate).await {
                servers = meta["authorization_servers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect();
                break;
            }
        }
        let issuer = match &self.issuer {
            Some(i) if servers.is_empty() || servers.contains(i) => i.clone(),
            Some(i) => {
                return Err(format!(
                    "the MCP server names the authorization servers {servers:?}, not {i} (auth.issuer)"
                ));
            }
            None => servers.first().cloned().ok_or(
                "the MCP server publishes no protected resource metadata naming its authorization server: set auth.issuer",
            )?,
        };
        let iurl = reqwest::Url::parse(&issuer).map_err(|e| format!("issuer {issuer}: {e}"))?;
        let iorigin = iurl.origin().ascii_serialization();
        let ipath = iurl.path().trim_end_matches('/');
        for candidate in [
            format!("{iorigin}/.well-known/oauth-authorization-server{ipath}"),
            format!("{iorigin}/.well-known/openid-configuration{ipath}"),
            format!(
                "{}/.well-known/openid-configuration",
                issuer.trim_end_matches('/')
            ),
        ] {
            if let Some(meta) = self.get_json(&candidate).await {
                if meta["issuer"].as_str() != Some(issuer.as_str()) {
                    return Err(format!(
                        "the authorization server's metadata names the issuer {}, not {issuer}",
                        meta["issuer"]
                    ));
                }
                return meta["token_endpoint"]
                    .as_str()
                    .map(|e| (issuer.clone(), e.to_owned()))
                    .ok_or_else(|| format!("{issuer} publishes no token_endpoint"));
            }
        }
        Err(format!(
            "{issuer} publishes no authorization server metadata"
        ))
    }

    async fn get_json(&self, url: &str) -> Option<Value> {
        let r = self.http.get(url).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.json().await.ok()
    }
}
