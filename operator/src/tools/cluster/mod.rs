//! The Kubernetes tools: `get_logs`, `get_events`, `get_resource`, `list_resources`,
//! `get_recent_deploys`, `get_gitops_source`. Read-only GETs through the kube client (in-cluster config or a
//! kubeconfig), every object trimmed of noise, and `Secret` data, `stringData` and the
//! `last-applied-configuration` annotation never returned, whatever the RBAC allows.

mod cursor;
mod deploys;
mod gitops;
mod logs;
mod objects;

pub use cursor::CursorSigner;
pub use logs::{Level, detect_level};

use super::{Tool, ToolContext, ToolError, ToolFuture};
use crate::llm::ToolSpec;
use axum::http::Request;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A tool that reads the cluster as the call's identity ([`Cluster::as_caller`]); it is a
/// [`Tool`] on the cluster it was made for ([`OnCluster`]).
trait ClusterTool: Send + Sync + 'static {
    /// Default and hard timeouts.
    const TIMEOUTS: (Duration, Duration) = super::DEFAULT_TIMEOUTS;
    /// Name, description and JSON Schema of the arguments.
    fn spec(&self) -> ToolSpec;
    /// Runs with validated arguments on the cluster as the caller sees it.
    fn run(
        cluster: Arc<Cluster>,
        input: Value,
    ) -> impl Future<Output = Result<String, ToolError>> + Send + 'static;
}

/// A [`ClusterTool`] on the cluster it reads.
struct OnCluster<T>(Arc<Cluster>, T);

impl<T: ClusterTool> Tool for OnCluster<T> {
    fn spec(&self) -> ToolSpec {
        self.1.spec()
    }

    fn kubernetes(&self) -> bool {
        true
    }

    fn timeouts(&self) -> (Duration, Duration) {
        T::TIMEOUTS
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let cluster = self.0.as_caller(&ctx);
        Box::pin(async move { T::run(cluster?, input).await })
    }
}

/// The cluster the tools read.
pub struct Cluster {
    client: kube::Client,
    cursors: Arc<CursorSigner>,
    discovery: Arc<tokio::sync::Mutex<Option<Discovered>>>,
}

/// How long discovered kinds are trusted.
const DISCOVERY_TTL: Duration = Duration::from_secs(300);
/// How soon discovery is repeated after a partial failure or for a kind not found.
const DISCOVERY_RETRY: Duration = Duration::from_secs(30);
/// Longest wait for one API group's resource list.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The result of API discovery.
struct Discovered {
    at: std::time::Instant,
    ttl: Duration,
    kinds: Vec<Kind>,
    /// Groups whose resource list could not be read.
    unread: Vec<String>,
}

impl Cluster {
    /// Tools over `client`.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            cursors: Arc::new(CursorSigner::random()),
            discovery: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    /// The cluster as the call's identity sees it: the session user's own client when the
    /// policy runs tools as the user (`runToolsAsUser`), Kortex's otherwise; refused when
    /// the user has no Kubernetes identity.
    pub(in crate::tools) fn as_caller(
        self: &Arc<Self>,
        ctx: &super::ToolContext,
    ) -> Result<Arc<Self>, ToolError> {
        match &ctx.kube {
            super::KubeIdentity::Kortex => Ok(self.clone()),
            super::KubeIdentity::User(client) => Ok(Arc::new(Self {
                client: client.clone(),
                cursors: self.cursors.clone(),
                discovery: self.discovery.clone(),
            })),
            super::KubeIdentity::Missing(why) => Err(ToolError::Denied(why.clone())),
        }
    }

    /// The six tools.
    pub fn tools(self: &Arc<Self>) -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(OnCluster(self.clone(), logs::GetLogs)),
            Arc::new(OnCluster(self.clone(), objects::GetEvents)),
            Arc::new(OnCluster(self.clone(), objects::GetResource)),
            Arc::new(OnCluster(self.clone(), objects::ListResources)),
            Arc::new(OnCluster(self.clone(), deploys::GetRecentDeploys)),
            Arc::new(gitops::GetGitopsSource(self.clone())),
        ]
    }

    /// `GET path` as JSON.
    pub(in crate::tools) async fn get_json(&self, path: &str) -> Result<Value, ToolError> {
        let request = Request::get(path)
            .body(Vec::new())
            .map_err(|e| ToolError::Validation(format!("invalid request path: {e}")))?;
        self.client
            .request::<Value>(request)
            .await
            .map_err(api_error)
    }

    /// `GET path` as text (logs). Bytes that are not UTF-8 (binary output, another
    /// encoding) become U+FFFD instead of failing the whole read.
    async fn get_text(&self, path: &str) -> Result<String, ToolError> {
        let request = Request::get(path)
            .body(kube::client::Body::empty())
            .map_err(|e| ToolError::Validation(format!("invalid request path: {e}")))?;
        let response = self.client.send(request).await.map_err(api_error)?;
        let code = response.status();
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .map_err(api_error)?;
        if code.is_client_error() || code.is_server_error() {
            let status = serde_json::from_slice::<kube::core::Status>(&body).unwrap_or_else(|_| {
                let text: String = String::from_utf8_lossy(&body)
                    .trim()
                    .chars()
                    .take(300)
                    .collect();
                kube::core::Status::failure(&text, "").with_code(code.as_u16())
            });
            return Err(api_error(kube::Error::Api(status.boxed())));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Resolves a kind as the model wrote it (`Deployment`, `deployments`, `deploy`,
    /// `Certificate` with `apiVersion: cert-manager.io/v1`): built-in kinds without a round
    /// trip, others through API discovery, cached for five minutes (30 s when a group could
    /// not be read); a kind not found in a cache older than 30 s is looked up afresh, so a
    /// CRD installed a minute ago is found.
    async fn resolve(&self, kind: &str, api_version: Option<&str>) -> Result<Kind, ToolError> {
        if let Some(k) = Kind::builtin(kind, api_version) {
            return Ok(k);
        }
        let mut cache = self.discovery.lock().await;
        for attempt in 0..2 {
            let refresh = match cache.as_ref() {
                None => true,
                Some(c) if attempt == 0 => c.at.elapsed() >= c.ttl,
                Some(c) => c.at.elapsed() >= DISCOVERY_RETRY,
            };
            if refresh {
                *cache = Some(self.discover().await?);
            } else if attempt == 1 {
                break;
            }
            if let Some(found) = cache
                .as_ref()
                .and_then(|c| c.kinds.iter().find(|k| k.matches(kind, api_version)))
            {
                return Ok(found.clone());
            }
        }
        let unread = cache.as_ref().map(|c| c.unread.clone()).unwrap_or_default();
        Err(ToolError::Validation(format!(
            "unknown kind {kind:?}{}: the API server does not serve it{}",
            api_version.map(|v| format!(" in {v}")).unwrap_or_default(),
            if unread.is_empty() {
                String::new()
            } else {
                format!(
                    " (these API groups could not be read: {})",
                    unread.join(", ")
                )
            }
        )))
    }

    /// Every resource the API server serves with `get` (preferred versions), the groups
    /// read eight at a time, each within [`DISCOVERY_TIMEOUT`].
    async fn discover(&self) -> Result<Discovered, ToolError> {
        use futures_util::StreamExt;
        let mut versions = vec![("".to_owned(), "v1".to_owned())];
        let groups = self.get_json("/apis").await?;
        for g in groups["groups"].as_array().into_iter().flatten() {
            if let (Some(name), Some(v)) = (
                g["name"].as_str(),
                g["preferredVersion"]["version"].as_str(),
            ) {
                versions.push((name.to_owned(), v.to_owned()));
            }
        }
        let lists: Vec<(String, String, Option<Value>)> =
            futures_util::stream::iter(versions.into_iter().map(|(group, version)| async move {
                let path = if group.is_empty() {
                    "/api/v1".to_owned()
                } else {
                    format!("/apis/{group}/{version}")
                };
                let list = tokio::time::timeout(DISCOVERY_TIMEOUT, self.get_json(&path))
                    .await
                    .ok()
                    .and_then(Result::ok);
                (group, version, list)
            }))
            .buffer_unordered(8)
            .collect()
            .await;
        let mut out = Vec::new();
        let mut unread = Vec::new();
        for (group, version, list) in lists {
            let Some(list) = list else {
                unread.push(if group.is_empty() {
                    "core/v1".to_owned()
                } else {
                    format!("{group}/{version}")
                });
                continue;
            };
            for r in list["resources"].as_array().into_iter().flatten() {
                let name = r["name"].as_str().unwrap_or_default();
                let verbs = r["verbs"].as_array().cloned().unwrap_or_default();
                if name.contains('/') || !verbs.iter().any(|v| v == "get") {
                    continue;
                }
                out.push(Kind {
                    group: group.clone(),
                    version: version.clone(),
                    kind: r["kind"].as_str().unwrap_or_default().to_owned(),
                    plural: name.to_owned(),
                    namespaced: r["namespaced"].as_bool().unwrap_or(true),
                    short_names: r["shortNames"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect(),
                });
            }
        }
        // Stable order, so a kind served by two groups always resolves the same way.
        out.sort_by(|a, b| (&a.group, &a.plural).cmp(&(&b.group, &b.plural)));
        unread.sort();
        Ok(Discovered {
            at: std::time::Instant::now(),
            ttl: if unread.is_empty() {
                DISCOVERY_TTL
            } else {
                DISCOVERY_RETRY
            },
            kinds: out,
            unread,
        })
    }
}

/// Maps a kube error to what the model sees: who refused what, or what was not found.
fn api_error(e: kube::Error) -> ToolError {
    match e {
        kube::Error::Api(status) => match status.code {
            401 | 403 => ToolError::Denied(format!("forbidden: {}", status.message)),
            404 => ToolError::Upstream(format!("not found: {}", status.message)),
            400 | 422 => ToolError::Validation(status.message),
            code => ToolError::Upstream(format!(
                "the API server answered {code}: {}",
                status.message
            )),
        },
        kube::Error::Auth(e) => ToolError::Denied(format!(
            "Kortex's credentials for the API server failed: {}",
            super::plugin_http::error_chain(&e)
        )),
        kube::Error::SerdeError(e) => {
            ToolError::Upstream(format!("the API server's answer could not be read: {e}"))
        }
        e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => ToolError::Upstream(format!(
            "the API server is unreachable: {}",
            super::plugin_http::error_chain(&e)
        )),
        other => ToolError::Upstream(format!(
            "the request to the API server failed: {}",
            super::plugin_http::error_chain(&other)
        )),
    }
}

/// A resource type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kind {
    /// API group (`""` for the core group).
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Plural resource name, e.g. `deployments`.
    pub plural: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names, e.g. `deploy`.
    pub short_names: Vec<String>,
}

/// A built-in kind: (group, version, kind, plural, namespaced, short names).
type BuiltinKind = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
);

/// Kinds resolved without discovery.
const BUILTIN_KINDS: &[BuiltinKind] = &[
    ("", "v1", "Pod", "pods", true, &["po"]),
    ("", "v1", "Service", "services", true, &["svc"]),
    ("", "v1", "ConfigMap", "configmaps", true, &["cm"]),
    ("", "v1", "Secret", "secrets", true, &[]),
    ("", "v1", "Event", "events", true, &["ev"]),
    ("", "v1", "Namespace", "namespaces", false, &["ns"]),
    ("", "v1", "Node", "nodes", false, &["no"]),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
        &["pvc"],
    ),
    (
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        false,
        &["pv"],
    ),
    ("", "v1", "ServiceAccount", "serviceaccounts", true, &["sa"]),
    ("", "v1", "Endpoints", "endpoints", true, &["ep"]),
    (
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        true,
        &["quota"],
    ),
    ("", "v1", "LimitRange", "limitranges", true, &["limits"]),
    ("apps", "v1", "Deployment", "deployments", true, &["deploy"]),
    ("apps", "v1", "StatefulSet", "statefulsets", true, &["sts"]),
    ("apps", "v1", "DaemonSet", "daemonsets", true, &["ds"]),
    ("apps", "v1", "ReplicaSet", "replicasets", true, &["rs"]),
    (
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        true,
        &[],
    ),
    ("batch", "v1", "Job", "jobs", true, &[]),
    ("batch", "v1", "CronJob", "cronjobs", true, &["cj"]),
    (
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
        &["hpa"],
    ),
    (
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        true,
        &["ing"],
    ),
    (
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
        &["netpol"],
    ),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
        &["pdb"],
    ),
    (
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        true,
        &[],
    ),
    ("events.k8s.io", "v1", "Event", "events", true, &[]),
];

impl Kind {
    fn builtin(name: &str, api_version: Option<&str>) -> Option<Self> {
        BUILTIN_KINDS
            .iter()
            .map(|(group, version, kind, plural, namespaced, short)| Kind {
                group: (*group).to_owned(),
                version: (*version).to_owned(),
                kind: (*kind).to_owned(),
                plural: (*plural).to_owned(),
                namespaced: *namespaced,
                short_names: short.iter().map(|s| (*s).to_owned()).collect(),
            })
            .find(|k| k.matches(name, api_version))
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn matches(&self, name: &str, api_version: Option<&str>) -> bool {
        let name = name.to_ascii_lowercase();
        let named = self.kind.to_ascii_lowercase() == name
            || self.plural == name
            || self.short_names.contains(&name)
            || format!("{}.{}", self.plural, self.group) == name;
        let versioned = match api_version {
            None => true,
            Some(v) if v.contains('/') => v == self.api_version(),
            Some(v) => v == self.group || v == self.version,
        };
        named && versioned
    }

    /// The collection path, in `namespace` when the kind is namespaced.
    fn path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{}/{}", seg(ns), self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }
}

/// A path segment from a model-supplied name (percent-encoded, so it stays one segment).
fn seg(value: &str) -> String {
    super::plugin_http::percent_encode(value)
}

/// A query string value.
fn q(value: &str) -> String {
    super::plugin_http::percent_encode(value)
}

/// Strips what the model must never see or does not need: `managedFields`, the
/// last-applied annotation, and a Secret's values (the key names stay, with their sizes).
pub fn sanitize(object: &mut Value) {
    if object.get("items").is_some_and(Value::is_array) {
        let list_kind = object_kind_of_list(object);
        if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
            for item in items.iter_mut() {
                if item.get("kind").is_none()
                    && let Some(kind) = &list_kind
                {
                    item["kind"] = Value::from(kind.clone());
                }
                sanitize(item);
            }
        }
        return;
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    if object.get("kind").and_then(Value::as_str) == Some("Secret")
        && let Some(map) = object.as_object_mut()
    {
        let mut keys = serde_json::Map::new();
        for field in ["data", "stringData"] {
            if let Some(Value::Object(values)) = map.remove(field) {
                for (k, v) in values {
                    let size = v.as_str().map_or(0, |s| {
                        if field == "data" {
                            (s.len() / 4 * 3)
                                .saturating_sub(s.bytes().filter(|b| *b == b'=').count())
                        } else {
                            s.len()
                        }
                    });
                    keys.insert(k, Value::from(format!("(hidden, about {size} bytes)")));
                }
            }
        }
        if !keys.is_empty() {
            map.insert("dataKeys".into(), Value::Object(keys));
        }
    }
}

/// `SecretList` → `Secret`.
fn object_kind_of_list(list: &Value) -> Option<String> {
    list.get("kind")
        .and_then(Value::as_str)
        .and_then(|k| k.strip_suffix("List"))
        .map(str::to_owned)
}

/// The `required` string argument `key`.
fn required<'a>(input: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    input[key]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ToolError::Validation(format!("{key} is required")))
}

/// RFC 3339 age like `3h12m` of a timestamp, relative to now.
fn age(timestamp: &str) -> Option<String> {
    let t: jiff::Timestamp = timestamp.parse().ok()?;
    let secs = jiff::Timestamp::now().duration_since(t).as_secs().max(0);
    Some(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_lose_their_values_and_objects_their_noise() {
        let mut list = json!({"kind": "SecretList", "items": [{
            "metadata": {"name": "db", "managedFields": [{"manager": "kubectl"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"stringData\":{\"password\":\"hunter2\"}}", "team": "shop"}},
            "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "admin"}, "type": "Opaque"}]});
        sanitize(&mut list);
        let text = list.to_string();
        for leak in [
            "aHVudGVyMg",
            "hunter2",
            "admin",
            "managedFields",
            "last-applied",
        ] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
        assert_eq!(list["items"][0]["metadata"]["annotations"]["team"], "shop");
        assert_eq!(
            list["items"][0]["dataKeys"]["password"],
            "(hidden, about 7 bytes)"
        );
        assert_eq!(list["items"][0]["type"], "Opaque");
    }

    #[test]
    fn kinds_resolve_by_name_plural_short_name_and_version() {
        let deploy = Kind::builtin("deploy", None);
        assert_eq!(
            deploy.as_ref().map(|k| k.plural.as_str()),
            Some("deployments")
        );
        assert_eq!(
            deploy.map(|k| k.path(Some("shop"))),
            Some("/apis/apps/v1/namespaces/shop/deployments".to_owned())
        );
        assert_eq!(
            Kind::builtin("Node", None).map(|k| k.path(Some("shop"))),
            Some("/api/v1/nodes".to_owned())
        );
        assert_eq!(
            Kind::builtin("Event", Some("events.k8s.io/v1")).map(|k| k.group),
            Some("events.k8s.io".to_owned())
        );
        assert!(Kind::builtin("Certificate", None).is_none());
    }
}
