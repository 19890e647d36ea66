//! The OpenID provider as Kortex talks to it: discovery (`/.well-known/openid-configuration`,
//! cached), its key set (`jwks_uri`, cached, fetched again once for a key id it does not
//! have), the authorization request (code flow with PKCE, `state` and `nonce`), the token
//! endpoint (code and refresh grants), `userinfo` (cached), and who a verified sign-in is
//! (the configured claims, the allowed groups and domains).

use super::jwt::{self, Expect, KeySet, TokenError, Verified};
use crate::catalog::SecretValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long discovery and the key set are reused.
const CACHE: Duration = Duration::from_secs(3600);
/// The key set is fetched again for an unknown key id at most this often.
const REFETCH_EVERY: Duration = Duration::from_secs(1);
/// An unknown key id that a fetch did not find is not looked for again for this long.
const MISS_TTL: Duration = Duration::from_secs(60);
/// How long `userinfo` answers are reused.
const USERINFO_CACHE: Duration = Duration::from_secs(300);
/// What Kortex reads of any answer of the provider.
const MAX_BODY: usize = 1 << 20;

/// The relying party's settings (`--oidc-*` flags, the chart's `sso` values).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The issuer URL, exactly as the provider names itself.
    pub issuer: String,
    /// Kortex's client id.
    pub client_id: String,
    /// The client secret (a confidential client), or `None` (a public client: PKCE only).
    pub client_secret: Option<SecretValue>,
    /// Scopes asked for (`openid` is always among them).
    pub scopes: Vec<String>,
    /// The claim with the user name.
    pub username_claim: String,
    /// The claim with the groups.
    pub groups_claim: String,
    /// Prefixed to the user name Kortex uses (not in `token` mode, where the API server
    /// names the user).
    pub username_prefix: String,
    /// Prefixed to each group.
    pub groups_prefix: String,
    /// Only members of one of these groups may sign in (empty: any).
    pub allowed_groups: Vec<String>,
    /// Only users whose e-mail is in one of these domains may sign in (empty: any).
    pub allowed_domains: Vec<String>,
    /// Another audience accepted in place of the client id.
    pub audience: Option<String>,
    /// The name on the sign-in button.
    pub display_name: String,
    /// CA certificates (PEM) the provider's TLS certificate is checked against, besides the
    /// system's.
    pub ca_pem: Option<Vec<u8>>,
}

/// What discovery says (OpenID Connect Discovery 1.0 §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// `issuer`.
    pub issuer: String,
    /// `authorization_endpoint`.
    pub authorization_endpoint: String,
    /// `token_endpoint`.
    pub token_endpoint: String,
    /// `jwks_uri`.
    pub jwks_uri: String,
    /// `userinfo_endpoint`.
    pub userinfo_endpoint: Option<String>,
    /// `end_session_endpoint` (RP-initiated logout).
    pub end_session_endpoint: Option<String>,
}

/// What the token endpoint answered.
#[derive(Clone, Debug)]
pub struct Tokens {
    /// The ID token (a refresh may return none).
    pub id_token: Option<String>,
    /// The access token.
    pub access_token: Option<String>,
    /// The refresh token (a refresh may return none: keep the old one).
    pub refresh_token: Option<String>,
    /// `expires_in` of the access token, seconds.
    pub expires_in: Option<i64>,
}

/// A signed-in person as Kortex names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `sub`.
    pub subject: String,
    /// The user name (with the prefix).
    pub user: String,
    /// The groups (with the prefix).
    pub groups: Vec<String>,
}

/// Why signing in failed, in words a person can act on. Never carries a token.
#[derive(Debug, thiserror::Error)]
pub enum SsoError {
    /// The provider could not be reached.
    #[error("the identity provider {url} cannot be reached: {detail}")]
    Unreachable {
        /// What was asked.
        url: String,
        /// Why.
        detail: String,
    },
    /// Discovery or the key set is not usable.
    #[error("the identity provider's configuration is not usable: {0}")]
    Discovery(String),
    /// The provider answered the request with an OAuth error.
    #[error("the identity provider refused: {0}")]
    Provider(String),
    /// The ID token was refused.
    #[error("the identity provider's ID token was refused: {0}")]
    Token(#[from] TokenError),
    /// A claim Kortex needs is missing.
    #[error("{0}")]
    Claim(String),
    /// Not one of the allowed groups or domains.
    #[error("{0}")]
    NotAllowed(String),
}

struct KeyCache {
    set: Option<KeySet>,
    fetched: Option<Instant>,
    misses: HashMap<String, Instant>,
}

/// The provider, with its caches.
pub struct Provider {
    /// The settings.
    pub settings: Settings,
    http: reqwest::Client,
    meta: Mutex<Option<(Instant, Arc<Metadata>)>>,
    keys: tokio::sync::Mutex<KeyCache>,
    userinfo: Mutex<HashMap<String, (Instant, Value)>>,
}

fn oauth_error(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let error = v["error"].as_str()?;
    Some(match v["error_description"].as_str() {
        Some(d) if !d.is_empty() => format!("{error}: {d}"),
        _ => error.to_owned(),
    })
}

/// Whether an endpoint's URL may be used: HTTPS, or HTTP on a loopback address.
fn check_endpoint(what: &str, url: &str) -> Result<(), SsoError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| SsoError::Discovery(format!("{what} {url:?} is not a URL: {e}")))?;
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    if parsed.scheme() == "https" || (parsed.scheme() == "http" && loopback) {
        Ok(())
    } else {
        Err(SsoError::Discovery(format!(
            "{what} {url} is not HTTPS (plain HTTP is accepted on loopback addresses only)"
        )))
    }
}

impl Provider {
    /// A provider reached through `egress`'s client (Kortex itself refused; the provider
    /// may be private: its address is the administrator's choice, not a resource's).
    pub fn new(settings: Settings, egress: &Arc<crate::egress::Egress>) -> Result<Self, String> {
        check_endpoint("the issuer", &settings.issuer).map_err(|e| e.to_string())?;
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(20));
        if let Some(pem) = &settings.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("the OIDC CA file is not PEM certificates: {e}"))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = egress.client(true, builder, true)?;
        Ok(Self {
            settings,
            http,
            meta: Mutex::default(),
            keys: tokio::sync::Mutex::new(KeyCache {
                set: None,
                fetched: None,
                misses: HashMap::new(),
            }),
            userinfo: Mutex::default(),
        })
    }

    async fn get_json(&self, url: &str, bearer: Option<&str>) -> Result<Value, SsoError> {
        let mut request = self.http.get(url).header("accept", "application/json");
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| SsoError::Unreachable {
            url: url.to_owned(),
            detail: crate::egress::error_chain(&e),
        })?;
        let status = response.status();
        let (body, _) = crate::egress::read_capped(response, MAX_BODY)
            .await
            .map_err(|e| SsoError::Unreachable {
                url: url.to_owned(),
                detail: e.to_string(),
            })?;
        if !status.is_success() {
            return Err(SsoError::Discovery(format!(
                "{url} answered HTTP {}{}",
                status.as_u16(),
                oauth_error(&body)
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| SsoError::Discovery(format!("{url} did not answer JSON: {e}")))
    }

    /// The discovery document (cached for an hour; the last good one is kept while the
    /// provider cannot be reached).
    pub async fn metadata(&self) -> Result<Arc<Metadata>, SsoError> {
        let cached = self.meta.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((at, m)) = &cached
            && at.elapsed() < CACHE
        {
            return Ok(m.clone());
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.settings.issuer.trim_end_matches('/')
        );
        let doc = match self.get_json(&url, None).await {
            Ok(doc) => doc,
            Err(e) => return cached.map(|(_, m)| m).ok_or(e),
        };
        let text = |name: &str| doc[name].as_str().map(str::to_owned);
        let required = |name: &str| {
            text(name).ok_or_else(|| SsoError::Discovery(format!("{url} has no {name}")))
        };
        let issuer = required("issuer")?;
        // OpenID Connect Discovery §4.3: the document must name exactly the issuer asked.
        if issuer != self.settings.issuer {
            return Err(SsoError::Discovery(format!(
                "{url} names the issuer {issuer:?}, not {:?}: set the issuer URL exactly as the provider names itself",
                self.settings.issuer
            )));
        }
        let m = Metadata {
            issuer,
            authorization_endpoint: required("authorization_endpoint")?,
            token_endpoint: required("token_endpoint")?,
            jwks_uri: required("jwks_uri")?,
            userinfo_endpoint: text("userinfo_endpoint"),
            end_session_endpoint: text("end_session_endpoint"),
        };
        for (what, u) in [
            ("authorization_endpoint", Some(&m.authorization_endpoint)),
            ("token_endpoint", Some(&m.token_endpoint)),
            ("jwks_uri", Some(&m.jwks_uri)),
            ("userinfo_endpoint", m.userinfo_endpoint.as_ref()),
            ("end_session_endpoint", m.end_session_endpoint.as_ref()),
        ] {
            if let Some(u) = u {
                check_endpoint(what, u)?;
            }
        }
        let m = Arc::new(m);
        *self.meta.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), m.clone()));
        Ok(m)
    }

    async fn fetch_keys(&self, cache: &mut KeyCache) -> Result<(), SsoError> {
        let meta = self.metadata().await?;
        let doc = self.get_json(&meta.jwks_uri, None).await?;
        let set = KeySet::parse(&doc)
            .map_err(|e| SsoError::Discovery(format!("{}: {e}", meta.jwks_uri)))?;
        cache.set = Some(set);
        cache.fetched = Some(Instant::now());
        Ok(())
    }

    /// Verifies an ID token: against the cached key set, and for a key id it does not
    /// have, against the set fetched again — once (a rotated key), and not again for the
    /// same unknown id for a minute (a hostile token cannot make Kortex hammer the provider).
    pub async fn verify(&self, token: &str, nonce: Option<&str>) -> Result<Verified, SsoError> {
        let now = jiff::Timestamp::now().as_second();
        let expect = Expect {
            issuer: &self.settings.issuer,
            client_id: &self.settings.client_id,
            audience: self.settings.audience.as_deref(),
            nonce,
            now,
        };
        self.with_keys(|set| jwt::verify(token, set, &expect)).await
    }

    /// Verifies an OAuth access token for one of `resources` (Kortex as a resource server:
    /// `jwt::verify_access`), with the provider's keys.
    pub async fn verify_access(
        &self,
        token: &str,
        resources: &[&str],
    ) -> Result<Verified, SsoError> {
        let now = jiff::Timestamp::now().as_second();
        self.with_keys(|set| jwt::verify_access(token, set, &self.settings.issuer, resources, now))
            .await
    }

    /// `check` with the key set, fetched when stale; a key not in it is fetched again once
    /// (a rotation), at most every [`REFETCH_EVERY`], and not again for [`MISS_TTL`].
    async fn with_keys(
        &self,
        check: impl Fn(&jwt::KeySet) -> Result<Verified, TokenError>,
    ) -> Result<Verified, SsoError> {
        let mut cache = self.keys.lock().await;
        let stale = cache.fetched.is_none_or(|at| at.elapsed() >= CACHE);
        if cache.set.is_none() || stale {
            self.fetch_keys(&mut cache).await?;
        }
        let set = cache.set.clone().unwrap_or_default();
        match check(&set) {
            Err(TokenError::UnknownKey(kid)) => {
                let missed = cache
                    .misses
                    .get(&kid)
                    .is_some_and(|at| at.elapsed() < MISS_TTL);
                let recent = cache.fetched.is_some_and(|at| at.elapsed() < REFETCH_EVERY);
                if missed || recent {
                    return Err(TokenError::UnknownKey(kid).into());
                }
                self.fetch_keys(&mut cache).await?;
                let set = cache.set.clone().unwrap_or_default();
                let result = check(&set);
                if let Err(TokenError::UnknownKey(_)) = &result {
                    cache.misses.retain(|_, at| at.elapsed() < MISS_TTL);
                    cache.misses.insert(kid, Instant::now());
                }
                Ok(result?)
            }
            other => Ok(other?),
        }
    }

    /// The authorization request's URL.
    pub fn authorize_url(
        &self,
        meta: &Metadata,
        request: &AuthorizeRequest<'_>,
    ) -> Result<String, SsoError> {
        let mut url = reqwest::Url::parse(&meta.authorization_endpoint)
            .map_err(|e| SsoError::Discovery(format!("authorization_endpoint: {e}")))?;
        let mut scopes = vec!["openid".to_owned()];
        scopes.extend(
            self.settings
                .scopes
                .iter()
                .filter(|s| *s != "openid")
                .cloned(),
        );
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &self.settings.client_id)
                .append_pair("redirect_uri", request.redirect_uri)
                .append_pair("scope", &scopes.join(" "))
                .append_pair("state", request.state)
                .append_pair("nonce", request.nonce)
                .append_pair("code_challenge", &pkce_challenge(request.verifier))
                .append_pair("code_challenge_method", "S256");
            if let Some(prompt) = request.prompt {
                q.append_pair("prompt", prompt);
            }
            if let Some(hint) = request.id_token_hint {
                q.append_pair("id_token_hint", hint);
            }
        }
        Ok(url.to_string())
    }

    async fn token_request(&self, form: &[(&str, &str)]) -> Result<Tokens, SsoError> {
        let meta = self.metadata().await?;
        let mut request = self
            .http
            .post(&meta.token_endpoint)
            .header("accept", "application/json");
        let mut form: Vec<(&str, &str)> = form.to_vec();
        match &self.settings.client_secret {
            // RFC 6749 §2.3.1: client_secret_basic, id and secret form-encoded first.
            Some(secret) => {
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                let basic = crate::catalog::secret_redactor::base64_bytes(
                    format!("{}:{}", enc(&self.settings.client_id), enc(secret.expose()))
                        .as_bytes(),
                );
                request = request.header("authorization", format!("Basic {basic}"));
            }
            None => form.push(("client_id", &self.settings.client_id)),
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let response = request
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| SsoError::Unreachable {
                url: meta.token_endpoint.clone(),
                detail: crate::egress::error_chain(&e),
            })?;
        let status = response.status();
        let (body, _) = crate::egress::read_capped(response, MAX_BODY)
            .await
            .map_err(|e| SsoError::Unreachable {
                url: meta.token_endpoint.clone(),
                detail: e.to_string(),
            })?;
        if !status.is_success() {
            return Err(SsoError::Provider(oauth_error(&body).unwrap_or_else(
                || format!("the token endpoint answered HTTP {}", status.as_u16()),
            )));
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            SsoError::Provider(format!("the token endpoint did not answer JSON: {e}"))
        })?;
        let text = |name: &str| {
            v[name]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(Tokens {
            id_token: text("id_token"),
            access_token: text("access_token"),
            refresh_token: text("refresh_token"),
            expires_in: v["expires_in"]
                .as_i64()
                .or_else(|| v["expires_in"].as_str().and_then(|s| s.parse().ok())),
        })
    }

    /// Exchanges the authorization code (with the PKCE verifier).
    pub async fn exchange(
        &self,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
    ) -> Result<Tokens, SsoError> {
        self.token_request(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ])
        .await
    }

    /// Renews the tokens with the refresh token.
    pub async fn refresh(&self, refresh_token: &str) -> Result<Tokens, SsoError> {
        self.token_request(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
        ])
        .await
    }

    /// `userinfo` for the holder of `access_token` (cached per subject for five minutes).
    pub async fn userinfo(&self, subject: &str, access_token: &str) -> Result<Value, SsoError> {
        if let Some((at, v)) = self
            .userinfo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(subject)
            && at.elapsed() < USERINFO_CACHE
        {
            return Ok(v.clone());
        }
        let meta = self.metadata().await?;
        let Some(endpoint) = &meta.userinfo_endpoint else {
            return Ok(Value::Null);
        };
        let v = self.get_json(endpoint, Some(access_token)).await?;
        // OpenID Connect Core §5.3.2: userinfo's `sub` must be the ID token's.
        if v["sub"].as_str() != Some(subject) {
            return Err(SsoError::Claim(
                "the provider's userinfo answer is for another subject than the ID token".into(),
            ));
        }
        let mut cache = self.userinfo.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (at, _)| at.elapsed() < USERINFO_CACHE);
        cache.insert(subject.to_owned(), (Instant::now(), v.clone()));
        Ok(v)
    }

    /// Who the claims (of the ID token, then `userinfo` for what it lacks) name, and
    /// whether they may sign in.
    pub fn identity(&self, claims: &Value, userinfo: &Value) -> Result<Identity, SsoError> {
        let s = &self.settings;
        let claim = |name: &str| {
            let v = &claims[name];
            if v.is_null() { &userinfo[name] } else { v }
        };
        let subject = claims["sub"].as_str().unwrap_or_default().to_owned();
        let user = match claim(&s.username_claim) {
            Value::String(u) if !u.is_empty() => u.clone(),
            Value::Null => {
                return Err(SsoError::Claim(format!(
                    "neither the ID token nor userinfo has the claim {:?} that names the user: set the user name claim (--oidc-username-claim) to one the provider sends, or ask for the scope that adds it",
                    s.username_claim
                )));
            }
            other => {
                return Err(SsoError::Claim(format!(
                    "the claim {:?} is {other}, not a user name",
                    s.username_claim
                )));
            }
        };
        // As the API server's authenticator does: an e-mail the provider says it did not
        // verify names nobody.
        if s.username_claim == "email" && claim("email_verified") == &Value::Bool(false) {
            return Err(SsoError::NotAllowed(format!(
                "the provider says the e-mail {user} is not verified"
            )));
        }
        let groups: Vec<String> = match claim(&s.groups_claim) {
            Value::Array(items) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Value::String(one) => vec![one.clone()],
            _ => Vec::new(),
        };
        if !s.allowed_groups.is_empty() && !groups.iter().any(|g| s.allowed_groups.contains(g)) {
            return Err(SsoError::NotAllowed(format!(
                "{user} is in none of the groups allowed to sign in ({}); the provider sent {}",
                s.allowed_groups.join(", "),
                if groups.is_empty() {
                    format!("no {:?} claim", s.groups_claim)
                } else {
                    format!("the groups {}", groups.join(", "))
                }
            )));
        }
        if !s.allowed_domains.is_empty() {
            let email = claim("email").as_str().unwrap_or_default();
            let domain = email.rsplit_once('@').map(|(_, d)| d.to_ascii_lowercase());
            let allowed = domain
                .as_deref()
                .is_some_and(|d| s.allowed_domains.iter().any(|a| a.eq_ignore_ascii_case(d)));
            if !allowed {
                return Err(SsoError::NotAllowed(format!(
                    "{user}'s e-mail is not in a domain allowed to sign in ({})",
                    s.allowed_domains.join(", ")
                )));
            }
        }
        Ok(Identity {
            subject,
            user: format!("{}{user}", s.username_prefix),
            groups: groups
                .into_iter()
                .map(|g| format!("{}{g}", s.groups_prefix))
                .collect(),
        })
    }
}

/// One authorization request.
#[derive(Clone, Copy, Debug)]
pub struct AuthorizeRequest<'a> {
    /// Where the provider sends the browser back.
    pub redirect_uri: &'a str,
    /// `state`.
    pub state: &'a str,
    /// `nonce`.
    pub nonce: &'a str,
    /// The PKCE verifier (its S256 challenge is sent).
    pub verifier: &'a str,
    /// `prompt` (`none` for a silent renewal).
    pub prompt: Option<&'a str>,
    /// The ID token of the sign-in being renewed (some providers, Glewlwyd among them,
    /// answer `prompt=none` only with it).
    pub id_token_hint: Option<&'a str>,
}

/// The S256 challenge of a PKCE verifier (RFC 7636 §4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    use sha2::{Digest, Sha256};
    jwt::base64url_encode(&Sha256::digest(verifier.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> Settings {
        Settings {
            issuer: "https://id.example.com".into(),
            client_id: "kortex".into(),
            client_secret: None,
            scopes: vec!["openid".into(), "email".into()],
            username_claim: "email".into(),
            groups_claim: "groups".into(),
            username_prefix: String::new(),
            groups_prefix: "oidc:".into(),
            allowed_groups: vec!["oncall".into()],
            allowed_domains: vec!["example.com".into()],
            audience: None,
            display_name: "Example".into(),
            ca_pem: None,
        }
    }

    fn provider(s: Settings) -> Provider {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Provider::new(s, &Arc::new(crate::egress::Egress::default()))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn pkce_challenge_is_rfc_7636s_example() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn the_claims_name_the_user_and_groups_and_say_who_may_sign_in() {
        let p = provider(settings());
        let claims =
            json!({"sub": "u1", "email": "alice@example.com", "groups": ["oncall", "platform"]});
        let id = p
            .identity(&claims, &Value::Null)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id.user, "alice@example.com");
        assert_eq!(id.groups, vec!["oidc:oncall", "oidc:platform"]);
        // Groups only in userinfo are taken from there.
        let id = p
            .identity(
                &json!({"sub": "u1", "email": "alice@example.com"}),
                &json!({"sub": "u1", "groups": ["oncall"]}),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id.groups, vec!["oidc:oncall"]);
        let e = p
            .identity(
                &json!({"sub": "u2", "email": "bob@example.com", "groups": ["viewers"]}),
                &Value::Null,
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("none of the groups allowed") && e.contains("viewers"),
            "{e}"
        );
        let e = p
            .identity(
                &json!({"sub": "u3", "email": "eve@evil.com", "groups": ["oncall"]}),
                &Value::Null,
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("not in a domain allowed"), "{e}");
        let e = p
            .identity(&json!({"sub": "u4", "groups": ["oncall"]}), &Value::Null)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("has the claim \"email\""), "{e}");
        let e = p
            .identity(
                &json!({"sub": "u5", "email": "mallory@example.com", "email_verified": false, "groups": ["oncall"]}),
                &Value::Null,
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("not verified"), "{e}");
    }

    #[test]
    fn the_authorization_request_asks_for_a_code_with_pkce_state_and_nonce() {
        let p = provider(settings());
        let meta = Metadata {
            issuer: "https://id.example.com".into(),
            authorization_endpoint: "https://id.example.com/auth?x=1".into(),
            token_endpoint: "https://id.example.com/token".into(),
            jwks_uri: "https://id.example.com/keys".into(),
            userinfo_endpoint: None,
            end_session_endpoint: None,
        };
        let url = p
            .authorize_url(
                &meta,
                &AuthorizeRequest {
                    redirect_uri: "https://kortex.example.com/auth/v1/oidc/callback",
                    state: "S",
                    nonce: "N",
                    verifier: "V",
                    prompt: Some("none"),
                    id_token_hint: None,
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let parsed = reqwest::Url::parse(&url).unwrap_or_else(|e| panic!("{e}"));
        let q: HashMap<_, _> = parsed.query_pairs().into_owned().collect();
        assert_eq!(q["x"], "1");
        assert_eq!(q["response_type"], "code");
        assert_eq!(q["scope"], "openid email");
        assert_eq!(q["state"], "S");
        assert_eq!(q["nonce"], "N");
        assert_eq!(q["code_challenge"], pkce_challenge("V"));
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["prompt"], "none");
        assert!(check_endpoint("x", "http://id.example.com/").is_err());
        assert!(check_endpoint("x", "http://127.0.0.1:5556/").is_ok());
    }
}
