//! Live scenarios: the scenario's `manifests/*.yaml` are applied (server-side apply, field
//! manager `kortex-eval`) to a throwaway namespace of the cluster in `KUBECONFIG`, the
//! question is asked with the real Kubernetes tools (`{{namespace}}` in it is that
//! namespace), and the namespace is deleted afterwards, whatever happened.

use super::scenario::Scenario;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Scope, pinned_kind};
use std::sync::OnceLock;

/// The cluster of this process's live scenarios (set once by [`connect`]).
pub static CLUSTER: OnceLock<kube::Client> = OnceLock::new();

/// Connects to the cluster of `--kubeconfig`, else `KUBECONFIG`, else the in-cluster
/// service account.
pub async fn connect(kubeconfig: Option<&std::path::Path>) -> Result<(), String> {
    let Some((client, url)) = crate::cli::cluster_client(kubeconfig).await? else {
        return Err(
            "live scenarios need a cluster: set KUBECONFIG or pass --kubeconfig (or run only recorded scenarios)"
                .into(),
        );
    };
    eprintln!("cluster: {url}");
    let _ = CLUSTER.set(client);
    Ok(())
}

/// Creates namespace `ns` and applies the scenario's manifests into it, then waits the
/// scenario's `live.settleSeconds`.
pub async fn apply(client: &kube::Client, ns: &str, scenario: &Scenario) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let object: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": ns, "labels": {"app.kubernetes.io/managed-by": "kortex-eval", "kortex.dev/eval-scenario": label(&scenario.name)}}
    }))
    .map_err(|e| e.to_string())?;
    namespaces
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("cannot create namespace {ns}: {e}"))?;
    let params = PatchParams::apply("kortex-eval").force();
    for path in &scenario.manifests {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (line, doc) in crate::source::manifest::split_documents(&text) {
            let at = format!("{}:{line}", path.display());
            let mut obj: DynamicObject = serde_saphyr::from_str(&doc)
                .map_err(|e| format!("{at}: not a Kubernetes object: {e}"))?;
            let types = obj
                .types
                .clone()
                .ok_or_else(|| format!("{at}: apiVersion and kind are required"))?;
            let gvk =
                kube::api::GroupVersionKind::try_from(&types).map_err(|e| format!("{at}: {e}"))?;
            let (resource, caps) = pinned_kind(client, &gvk)
                .await
                .map_err(|e| format!("{at}: the cluster does not serve {}: {e}", types.kind))?;
            let name = obj
                .metadata
                .name
                .clone()
                .ok_or_else(|| format!("{at}: metadata.name is required"))?;
            let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
                obj.metadata.namespace = Some(ns.to_owned());
                Api::namespaced_with(client.clone(), ns, &resource)
            } else {
                return Err(format!(
                    "{at}: {} is cluster-scoped; a live scenario may only create namespaced objects",
                    types.kind
                ));
            };
            api.patch(&name, &params, &Patch::Apply(&obj))
                .await
                .map_err(|e| format!("{at}: cannot apply {} {name}: {e}", types.kind))?;
        }
    }
    tokio::time::sleep(std::time::Duration::from_secs(scenario.settle_seconds)).await;
    Ok(())
}

/// Deletes namespace `ns` (in the background on the server).
pub async fn remove(client: &kube::Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = namespaces.delete(ns, &DeleteParams::background()).await {
        eprintln!("warning: cannot delete namespace {ns}: {e}");
    }
}

/// A scenario name as a label value (63 characters of `[a-z0-9-]`).
fn label(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    s.trim_matches('-').to_owned()
}

/// The configuration of namespace `ns` as the cluster holds it: its LLMProviders,
/// ChatPolicies and KortexTools, and the Secrets they reference that opted in to being read
/// by Kortex (`docs/operator.md`) — what `kortex run` would compile there.
pub async fn configuration(
    client: &kube::Client,
    ns: &str,
) -> Result<crate::catalog::ObjectSet, String> {
    use crate::crd::{ChatPolicy, KortexTool, LLMProvider};
    use k8s_openapi::api::core::v1::Secret;
    let list = |what: &str, e: kube::Error| format!("cannot list {what} in namespace {ns}: {e}");
    let providers = Api::<LLMProvider>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| list("LLMProviders", e))?
        .items;
    let policies = Api::<ChatPolicy>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| list("ChatPolicies", e))?
        .items;
    let tools = Api::<KortexTool>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| list("KortexTools", e))?
        .items;
    let secrets_api = Api::<Secret>::namespaced(client.clone(), ns);
    let mut secrets = Vec::new();
    for key in crate::operator::watch::referenced_secrets(&providers, &tools, &policies) {
        match secrets_api.get_opt(&key.name).await {
            Ok(Some(s)) if crate::catalog::secrets::opted_in(&s.metadata) => secrets.push(s),
            Ok(Some(s)) => secrets.push(Secret {
                metadata: s.metadata,
                ..Default::default()
            }),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot read Secret {ns}/{}: {e}", key.name)),
        }
    }
    eprintln!(
        "configuration of namespace {ns} read from the cluster: {} providers, {} policies",
        providers.len(),
        policies.len()
    );
    Ok(crate::catalog::ObjectSet {
        providers,
        tools,
        policies,
        secrets,
        ..Default::default()
    })
}
