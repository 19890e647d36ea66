//! Helpers for the end-to-end suite, which runs against the cluster named by `KUBECONFIG`
//! and is skipped when it is unset.

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::time::{Duration, Instant};

/// Field manager of everything the suite applies.
pub const MANAGER: &str = "kortex-e2e";

/// A client for the cluster in `KUBECONFIG`, or `None` (and a note on stderr) to skip.
pub async fn client() -> Option<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!("skipping: KUBECONFIG is not set");
        return None;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Client::try_default().await {
        Ok(c) => Some(c),
        Err(e) => panic!("KUBECONFIG is set but no client could be built: {e}"),
    }
}

/// Applies Kortex's CRDs (server-side apply) and waits until each is Established.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    for crd in kortex::crd::all_crds() {
        install_crd(client, &crd).await?;
    }
    Ok(())
}

/// Applies one CustomResourceDefinition (server-side) and waits until it is Established.
pub async fn install_crd(client: &Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(crd),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let current = api.get(&name).await?;
        let established = current
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "CRD {name} not Established within 60s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A namespace for one test, deleted by [`TempNamespace::delete`].
pub struct TempNamespace {
    /// Its name.
    pub name: String,
    client: Client,
}

impl TempNamespace {
    /// Creates `kortex-e2e-<suffix>`.
    pub async fn create(client: &Client, suffix: &str) -> anyhow::Result<Self> {
        let name = format!("kortex-e2e-{suffix}-{}", std::process::id());
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self {
            name,
            client: client.clone(),
        })
    }

    /// Deletes the namespace (and everything in it).
    pub async fn delete(self) -> anyhow::Result<()> {
        Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}

/// Runs `test` on the cluster in `KUBECONFIG` (skipped when it is unset) in a new namespace
/// `kortex-e2e-<suffix>-…`, which is deleted afterwards whatever the outcome.
pub async fn in_temp_namespace(
    suffix: &str,
    test: impl AsyncFnOnce(&Client, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    let ns = TempNamespace::create(&client, suffix).await?;
    let result = test(&client, &ns.name).await;
    ns.delete().await?;
    result
}

/// Sends `request` and checks that it is answered with `status` (`what` names the request in
/// the error otherwise); the response.
pub async fn expect_status(
    request: reqwest::RequestBuilder,
    status: u16,
    what: &str,
) -> anyhow::Result<reqwest::Response> {
    let r = request.send().await?;
    anyhow::ensure!(
        r.status().as_u16() == status,
        "{what}: HTTP {}, not {status}",
        r.status()
    );
    Ok(r)
}

/// The API server's message for a rejected request, or a panic if it was accepted.
pub fn rejection<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Ok(v) => panic!("expected the API server to reject this, it accepted: {v:?}"),
        Err(kube::Error::Api(status)) => status.message.clone(),
        Err(e) => panic!("expected a validation error, got {e}"),
    }
}

/// The ServiceAccount (namespace, name) the shipped admission policy trusts as Kortex
/// (`config/admission/policy.yaml`, and the chart's default release): `kortex/kortex`, or
/// `KORTEX_E2E_SERVICE_ACCOUNT=namespace/name` for a cluster whose Kortex runs as another.
/// The suite acts as Kortex under this name, so it passes whether or not a Kortex (and its
/// cluster-wide policy) is installed.
pub fn kortex_service_account() -> (String, String) {
    let value =
        std::env::var("KORTEX_E2E_SERVICE_ACCOUNT").unwrap_or_else(|_| "kortex/kortex".into());
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => (ns.to_owned(), name.to_owned()),
        _ => panic!("KORTEX_E2E_SERVICE_ACCOUNT must be namespace/name, not {value:?}"),
    }
}

/// The username of [`kortex_service_account`].
pub fn kortex_username() -> String {
    let (ns, name) = kortex_service_account();
    format!("system:serviceaccount:{ns}:{name}")
}

/// A client of the same cluster that impersonates `user` with `groups` (the API server
/// adds `system:authenticated`): what a person or a ServiceAccount sends, as the admission
/// policy sees it. Needs impersonation rights (cluster-admin has them).
pub async fn impersonating(user: &str, groups: &[&str]) -> anyhow::Result<Client> {
    let mut config = kube::Config::infer().await?;
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
    Ok(Client::try_from(config)?)
}

/// A client acting as Kortex's ServiceAccount (see [`kortex_service_account`]).
pub async fn as_kortex() -> anyhow::Result<Client> {
    let (ns, _) = kortex_service_account();
    let user = kortex_username();
    let ns_group = format!("system:serviceaccounts:{ns}");
    impersonating(&user, &["system:serviceaccounts", &ns_group]).await
}

/// How many nodes are Ready. Tests that need running pods skip (saying so) on a control
/// plane without nodes instead of waiting for pods that cannot start.
pub async fn ready_nodes(client: &Client) -> anyhow::Result<usize> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count())
}

/// Applies `object` (server-side apply, forced) in namespace `ns` (`""`: a cluster-scoped
/// object); its kind's plural is its lower-cased kind plus `s`.
pub async fn apply(client: &Client, ns: &str, object: serde_json::Value) -> anyhow::Result<()> {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let api: Api<DynamicObject> = if ns.is_empty() {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), ns, &resource)
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// A tool router with Kortex's Kubernetes tools, reading through `client`.
pub fn kube_tools(client: &Client) -> kortex::tools::Router {
    let mut router =
        kortex::tools::Router::new(std::sync::Arc::new(kortex::metrics::Metrics::default()));
    for tool in kortex::tools::cluster::Cluster::new(client.clone()).tools() {
        router.add(tool);
    }
    router
}

/// What a tool call runs in: a new session `name` of `user` in namespace `ns`, in a SQLite
/// store in the temporary file `kortex-e2e-<tag>-<pid>.db` (its path, to remove it), acting
/// as Kortex's own identity on the cluster.
pub async fn tool_context(
    tag: &str,
    name: &str,
    ns: &str,
    user: &str,
) -> anyhow::Result<(std::path::PathBuf, kortex::tools::ToolContext)> {
    use kortex::store::{NewSession, Store};
    let path = std::env::temp_dir().join(format!("kortex-e2e-{tag}-{}.db", std::process::id()));
    let store = Store::connect(&format!("sqlite://{}", path.display())).await?;
    store.migrate().await?;
    let session = store
        .create_session(&NewSession {
            name: name.into(),
            namespace: ns.into(),
            user: user.into(),
            policy: None,
            dynamic_tools: serde_json::json!([]),
        })
        .await?;
    let ctx = kortex::tools::ToolContext::new(store, session, "run", "chat");
    Ok((path, ctx))
}

/// A ChatPolicy `namespace/name` for every session, allowing every tool, as the router
/// takes it.
pub fn any_policy(namespace: &str, name: &str) -> anyhow::Result<kortex::catalog::PolicyEntry> {
    Ok(kortex::catalog::PolicyEntry::as_is(serde_json::from_value(
        serde_json::json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"sessions": ["*"], "provider": "x"}}),
    )?))
}

/// The YAML documents of `path` (relative to the repository root), as JSON; empty ones left
/// out.
pub fn yaml_docs(path: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(path))?;
    let mut out = Vec::new();
    for doc in text.split("\n---\n") {
        let v: serde_json::Value = serde_saphyr::from_str(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// A TCP proxy on 127.0.0.1 in front of the API server that adds latency to every chunk
/// in each direction and can cut every connection (an outage): what a slow or distant API
/// server, or a network partition, looks like to a client.
pub struct DelayingProxy {
    /// Its address.
    pub addr: std::net::SocketAddr,
    latency: std::sync::Arc<std::sync::Mutex<Duration>>,
    down: tokio::sync::watch::Sender<bool>,
}

impl DelayingProxy {
    /// Starts one in front of `upstream` (`host:port`).
    pub async fn start(upstream: String) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let latency = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
        let (down, _) = tokio::sync::watch::channel(false);
        let (lat, down_rx) = (latency.clone(), down.subscribe());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *down_rx.borrow() {
                    continue; // dropped: the connection is refused
                }
                let (upstream, lat, mut cut) = (upstream.clone(), lat.clone(), down_rx.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::select! {
                        _ = pump(ri, wo, lat.clone()) => {}
                        _ = pump(ro, wi, lat) => {}
                        _ = cut.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Ok(Self {
            addr,
            latency,
            down,
        })
    }

    /// Every chunk waits `latency` before it is passed on, in each direction.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|e| e.into_inner()) = latency;
    }

    /// `true`: open connections are cut and new ones refused; `false`: back.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// A client of the cluster in `KUBECONFIG` that goes through this proxy (the server's
    /// certificate still checked against its own name).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let mut config = kube::Config::infer().await?;
        let original = config.cluster_url.clone();
        if let Some(host) = original.host()
            && host.parse::<std::net::IpAddr>().is_err()
        {
            config.tls_server_name = Some(host.to_owned());
        }
        let scheme = original.scheme_str().unwrap_or("https");
        config.cluster_url = format!("{scheme}://{}", self.addr).parse()?;
        Ok(Client::try_from(config)?)
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: std::sync::Arc<std::sync::Mutex<Duration>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = *latency.lock().unwrap_or_else(|e| e.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `host:port` of the API server in `KUBECONFIG`.
pub async fn api_server_address() -> anyhow::Result<String> {
    let config = kube::Config::infer().await?;
    let url = &config.cluster_url;
    let host = url
        .host()
        .ok_or_else(|| anyhow::anyhow!("{url} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Ok(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}
