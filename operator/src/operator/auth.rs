//! Kubernetes identities for the chat API in cluster mode: bearer tokens checked with a
//! TokenReview, use of a ChatPolicy authorized with a SubjectAccessReview (verb `use` on
//! `chatpolicies/<name>`), both cached briefly; and clients that act as the caller (their
//! own token), so the API server's RBAC and admission judge the human, not Kortex.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a positive answer is reused.
const CACHE_OK: Duration = Duration::from_secs(30);
/// How long a negative answer is reused (a fixed binding should work soon).
const CACHE_NO: Duration = Duration::from_secs(5);
/// Entries kept at most (oldest dropped first).
const CACHE_MAX: usize = 10_000;

/// How a caller's Kubernetes requests are made as them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeCredential {
    /// Their own bearer token (a ServiceAccount's, or an OIDC ID token the API server's
    /// authenticator trusts), kept in memory only.
    Token(crate::catalog::SecretValue),
    /// Kortex's ServiceAccount impersonates exactly this user and these groups, which a
    /// verified sign-in named (`--oidc-kubernetes impersonate`, docs/sso.md).
    Impersonate {
        /// The user name.
        user: String,
        /// The groups.
        groups: Vec<String>,
    },
}

/// A user as the API server knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeUser {
    /// Username.
    pub name: String,
    /// Groups.
    pub groups: Vec<String>,
}

/// Why no token of a ServiceAccount could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenRequestError {
    /// RBAC does not let Kortex mint it: `create` on `serviceaccounts/token` is granted only
    /// per namespace and by name (docs/triggers.md#identity).
    #[error(
        "Kortex may not mint a token of ServiceAccount {namespace}/{name}: grant it create on serviceaccounts/token for {name} in {namespace} (the chart's triggers.runAs, or config/rbac/trigger_runas.yaml; docs/triggers.md#identity)"
    )]
    Forbidden {
        /// The ServiceAccount's namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The API server did not answer, or answered with another error.
    #[error("{0}")]
    Failed(String),
}

type Cached<T> = Mutex<HashMap<[u8; 32], (Instant, T)>>;

/// TokenReview and SubjectAccessReview, cached; clients acting as a caller.
pub struct ClusterAuth {
    client: kube::Client,
    config: kube::Config,
    tokens: Cached<Option<KubeUser>>,
    access: Cached<bool>,
    /// Since when the API server has not answered a review (`None`: it answered the last).
    unreachable_since: Mutex<Option<jiff::Timestamp>>,
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

fn lookup<T: Clone>(
    cache: &Cached<T>,
    key: &[u8; 32],
    fresh: impl Fn(&T) -> Duration,
) -> Option<T> {
    let cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .get(key)
        .filter(|(at, v)| at.elapsed() < fresh(v))
        .map(|(_, v)| v.clone())
}

fn store<T>(cache: &Cached<T>, key: [u8; 32], value: T) {
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHE_MAX
        && let Some(oldest) = cache.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k)
    {
        cache.remove(&oldest);
    }
    cache.insert(key, (Instant::now(), value));
}

impl ClusterAuth {
    /// Reviews through `client` (Kortex's service account); `config` is the base for
    /// clients acting as callers (same server and CA, the caller's token).
    pub fn new(client: kube::Client, config: kube::Config) -> Self {
        Self {
            client,
            config,
            tokens: Mutex::default(),
            access: Mutex::default(),
            unreachable_since: Mutex::default(),
        }
    }

    /// Since when the API server has not answered a TokenReview or SubjectAccessReview
    /// (`None` while it answers). Requests that need one are refused meanwhile (503
    /// `auth_unavailable`); `/readyz` shows it.
    pub fn unreachable_since(&self) -> Option<jiff::Timestamp> {
        *self
            .unreachable_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Records whether a review got an answer; logs once when the API server stops
    /// answering and once when it is back, not per request.
    fn answered<T>(
        &self,
        what: &str,
        result: Result<T, kube::Error>,
    ) -> Result<T, super::error::Error> {
        let mut since = self
            .unreachable_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(v) => {
                if let Some(t) = since.take() {
                    tracing::info!(down_since = %t, "the API server answers reviews again: chat with Kubernetes identities resumes");
                }
                Ok(v)
            }
            Err(e) => {
                if since.is_none() {
                    *since = Some(jiff::Timestamp::now());
                    tracing::warn!(error = %e, "the API server does not answer {what}s: requests with a Kubernetes identity that is not cached are refused (503 auth_unavailable) until it does");
                }
                Err(super::error::Error::api(format!("{what} failed"))(e))
            }
        }
    }

    /// Who `token` belongs to (`None`: not a valid token). Tokens are cached by digest only.
    pub async fn review(&self, token: &str) -> Result<Option<KubeUser>, super::error::Error> {
        let key = digest(&["token", token]);
        if let Some(hit) = lookup(&self.tokens, &key, |v| {
            if v.is_some() { CACHE_OK } else { CACHE_NO }
        }) {
            return Ok(hit);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = self.answered(
            "TokenReview",
            api.create(&PostParams::default(), &review).await,
        )?;
        let status = answer.status.unwrap_or_default();
        let user = status
            .authenticated
            .unwrap_or(false)
            .then_some(status.user)
            .flatten()
            .and_then(|u| {
                Some(KubeUser {
                    name: u.username.filter(|n| !n.is_empty())?,
                    groups: u.groups.unwrap_or_default(),
                })
            });
        store(&self.tokens, key, user.clone());
        Ok(user)
    }

    /// Who the API server takes `who`'s requests to be from (a SelfSubjectReview made as
    /// them): for an impersonation, the user and groups the admission policy will see in
    /// `request.userInfo` (`system:authenticated` among them). An error when the API server
    /// refuses (Kortex may not impersonate them).
    pub async fn who_is(&self, who: &KubeCredential) -> Result<KubeUser, super::error::Error> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let client = self.client_as(who)?;
        let review = Api::<SelfSubjectReview>::all(client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(super::error::Error::api("SelfSubjectReview"))?;
        let info = review.status.and_then(|s| s.user_info).unwrap_or_default();
        Ok(KubeUser {
            name: info.username.unwrap_or_default(),
            groups: info.groups.unwrap_or_default(),
        })
    }

    /// Whether `user` may `use` the ChatPolicy `namespace/name`.
    pub async fn may_use_policy(
        &self,
        user: &str,
        groups: &[String],
        namespace: &str,
        name: &str,
    ) -> Result<bool, super::error::Error> {
        self.may(user, groups, "use", "chatpolicies", namespace, Some(name))
            .await
    }

    /// Whether `user` may fire the triggers of the ChatPolicy `namespace/name` (verb
    /// `trigger` on `chatpolicies/<name>`, `docs/triggers.md#identity`).
    pub async fn may_trigger_policy(
        &self,
        user: &str,
        groups: &[String],
        namespace: &str,
        name: &str,
    ) -> Result<bool, super::error::Error> {
        self.may(
            user,
            groups,
            "trigger",
            "chatpolicies",
            namespace,
            Some(name),
        )
        .await
    }

    /// A short-lived token of the ServiceAccount `namespace/name` (TokenRequest API, valid
    /// `seconds`), for the tools of a triggered investigation that runs as it. Never stored.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        seconds: i64,
    ) -> Result<crate::catalog::SecretValue, TokenRequestError> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(seconds),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let answer: TokenRequest = api
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 403 => TokenRequestError::Forbidden {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
                e => TokenRequestError::Failed(format!(
                    "TokenRequest for ServiceAccount {namespace}/{name} failed: {e}"
                )),
            })?;
        let token = answer
            .status
            .map(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                TokenRequestError::Failed(format!(
                    "TokenRequest for ServiceAccount {namespace}/{name} returned no token"
                ))
            })?;
        Ok(crate::catalog::SecretValue::new(token))
    }

    /// Whether `user` may `get` ActionProposals in `namespace` (who may see others'
    /// proposals, with their rationale and preview, through Kortex's API).
    pub async fn may_get_proposals(
        &self,
        user: &str,
        groups: &[String],
        namespace: &str,
    ) -> Result<bool, super::error::Error> {
        self.may(user, groups, "get", "actionproposals", namespace, None)
            .await
    }

    /// Whether `user` may `verb` Kortex's `resource` (named `name`, or any) in `namespace`.
    async fn may(
        &self,
        user: &str,
        groups: &[String],
        verb: &str,
        resource: &str,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<bool, super::error::Error> {
        let access = SubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some(crate::crd::GROUP.into()),
                resource: Some(resource.to_owned()),
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        };
        let key = [verb, resource, namespace, name.unwrap_or("")];
        self.allowed(user, groups, &key, access).await
    }

    /// Whether `user` may `verb` the non-resource URL `path` (Kortex's admin rights: grant
    /// them with the ClusterRole `kortex-admin`, e.g. `nonResourceURLs: ["/kortex/audit"]`,
    /// `verbs: [get]`).
    pub async fn may_access(
        &self,
        user: &str,
        groups: &[String],
        verb: &str,
        path: &str,
    ) -> Result<bool, super::error::Error> {
        let access = SubjectAccessReviewSpec {
            non_resource_attributes: Some(
                k8s_openapi::api::authorization::v1::NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.into()),
                },
            ),
            ..Default::default()
        };
        self.allowed(user, groups, &[verb, path], access).await
    }

    /// One SubjectAccessReview of `user` (with `groups`) for the attributes in `access`,
    /// cached briefly under `what` (which must identify those attributes).
    async fn allowed(
        &self,
        user: &str,
        groups: &[String],
        what: &[&str],
        access: SubjectAccessReviewSpec,
    ) -> Result<bool, super::error::Error> {
        let mut parts = what.to_vec();
        parts.push(user);
        parts.extend(groups.iter().map(String::as_str));
        let key = digest(&parts);
        if let Some(hit) = lookup(&self.access, &key, |v| if *v { CACHE_OK } else { CACHE_NO }) {
            return Ok(hit);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                groups: Some(groups.to_vec()),
                ..access
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = self.answered(
            "SubjectAccessReview",
            api.create(&PostParams::default(), &review).await,
        )?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        store(&self.access, key, allowed);
        Ok(allowed)
    }

    /// A client that acts as the caller: with their own bearer token, or as Kortex's
    /// ServiceAccount impersonating exactly the user and groups a verified sign-in named.
    pub fn client_as(&self, who: &KubeCredential) -> Result<kube::Client, super::error::Error> {
        let mut config = self.config.clone();
        match who {
            KubeCredential::Token(token) => {
                config.auth_info = kube::config::AuthInfo {
                    token: Some(token.expose().to_owned().into()),
                    ..Default::default()
                };
            }
            KubeCredential::Impersonate { user, groups } => {
                config.auth_info.impersonate = Some(user.clone());
                config.auth_info.impersonate_groups = (!groups.is_empty()).then(|| groups.clone());
            }
        }
        super::kube_client(config).map_err(super::error::Error::api(
            "cannot build a client for the caller",
        ))
    }
}
