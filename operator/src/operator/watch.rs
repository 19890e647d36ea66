//! The cluster as a configuration source: watches of the four Kortex kinds, of Secret
//! *metadata* (never every Secret's data), and reads of only the Secrets the objects
//! reference (plus Kortex's own credential Secrets), compiled into the catalog with the same
//! pure function as standalone mode and published whole.
//!
//! The custom resources are watched as untyped objects and converted one by one, so one
//! object the API server accepted but Kortex cannot read is reported (log, metric and an
//! Event) instead of breaking the watch of its kind. When the API server is unreachable the
//! watches retry with backoff and the last configuration keeps serving.

use crate::catalog::{self, ObjectKey, ObjectSet};
use crate::crd::{ActionProposal, ChatPolicy, KortexTool, LLMProvider, SecretKeyRef};
use crate::live::{LiveConfig, Malformed};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long changes are gathered before one recompilation.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// Which namespaces Kortex serves.
#[derive(Clone, Debug)]
pub struct Scope {
    /// Only this namespace (`--namespace`), or every namespace.
    pub namespace: Option<String>,
    /// Kortex's own namespace: the only one whose credential Secrets are trusted.
    pub own_namespace: String,
    /// Headers no resource may send besides the usual identity headers: those of the
    /// authenticating proxy in front of Kortex.
    pub reserved_headers: Vec<String>,
}

impl Scope {
    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    fn dynamic_api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        }
    }
}

/// The watched objects, as the API server last reported them.
#[derive(Clone)]
pub struct Observed {
    /// `LLMProvider` objects.
    pub providers: Store<DynamicObject>,
    /// `KortexTool` objects.
    pub tools: Store<DynamicObject>,
    /// `ChatPolicy` objects.
    pub policies: Store<DynamicObject>,
    /// `ActionProposal` objects.
    pub proposals: Store<DynamicObject>,
    /// Metadata of the Secrets in scope.
    secrets: Store<PartialObjectMeta<Secret>>,
    /// Metadata of Kortex's credential Secrets in its own namespace.
    credentials: Store<PartialObjectMeta<Secret>>,
    /// Counts the changes of any of them (subscribe to wait for the next).
    pub changed: watch::Sender<u64>,
}

/// The `ApiResource` of a Kortex kind.
pub fn resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

impl Observed {
    /// Starts the watches; they run until `stop` flips, retrying with backoff.
    pub fn start(client: &Client, scope: &Scope, stop: &watch::Receiver<bool>) -> Self {
        let changed = watch::Sender::new(0u64);
        let dynamic = |r: ApiResource| {
            let writer = reflector::store::Writer::new(r.clone());
            let reader = writer.as_reader();
            let stream = watcher(scope.dynamic_api(client, &r), watcher::Config::default())
                .default_backoff()
                .reflect(writer);
            spawn_stream(r.kind.clone(), stream, changed.clone(), stop.clone());
            reader
        };
        let providers = dynamic(resource::<LLMProvider>());
        let tools = dynamic(resource::<KortexTool>());
        let policies = dynamic(resource::<ChatPolicy>());
        let proposals = dynamic(resource::<ActionProposal>());

        let (secrets, writer) = reflector::store::<PartialObjectMeta<Secret>>();
        // `PartialObjectMeta` lists and watches metadata only: no Secret data is read here.
        let stream = watcher(
            scope.api::<PartialObjectMeta<Secret>>(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer);
        spawn_stream("Secret".into(), stream, changed.clone(), stop.clone());

        let (credentials, writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let own: Api<PartialObjectMeta<Secret>> =
            Api::namespaced(client.clone(), &scope.own_namespace);
        let stream = watcher(
            own,
            watcher::Config::default().labels(catalog::credentials::CREDENTIALS_LABEL),
        )
        .default_backoff()
        .reflect(writer);
        spawn_stream(
            "credential Secret".into(),
            stream,
            changed.clone(),
            stop.clone(),
        );

        Self {
            providers,
            tools,
            policies,
            proposals,
            secrets,
            credentials,
            changed,
        }
    }

    /// Waits until every watch has listed its objects once.
    pub async fn wait_until_ready(&self) -> Result<(), super::error::Error> {
        let all = [
            &self.providers,
            &self.tools,
            &self.policies,
            &self.proposals,
        ];
        for store in all {
            store
                .wait_until_ready()
                .await
                .map_err(|source| super::error::Error::Watch {
                    doing: "a watch stopped before its first list",
                    source,
                })?;
        }
        for store in [&self.secrets, &self.credentials] {
            store
                .wait_until_ready()
                .await
                .map_err(|source| super::error::Error::Watch {
                    doing: "a Secret watch stopped before its first list",
                    source,
                })?;
        }
        Ok(())
    }
}

fn spawn_stream<S, T>(
    what: String,
    stream: S,
    changed: watch::Sender<u64>,
    mut stop: watch::Receiver<bool>,
) where
    S: futures_util::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        loop {
            tokio::select! {
                item = stream.next() => match item {
                    Some(Ok(_)) => {
                        if failing {
                            tracing::info!(kind = %what, "watch recovered");
                            failing = false;
                        }
                        changed.send_modify(|n| *n += 1);
                    }
                    Some(Err(e)) => {
                        // The last known objects keep serving; the watch retries with backoff.
                        if !failing {
                            tracing::warn!(kind = %what, error = %e, "watch failed; serving the last known configuration and retrying");
                        }
                        failing = true;
                    }
                    None => return,
                },
                _ = stop.changed() => return,
            }
        }
    });
}

/// Converts the watched objects of one kind; the ones that do not convert are returned
/// separately with the field that failed.
pub fn convert<K: DeserializeOwned>(
    objects: &[Arc<DynamicObject>],
    kind: &str,
) -> (Vec<K>, Vec<Malformed>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for o in objects {
        let key = ObjectKey::new(
            o.namespace().unwrap_or_else(|| "default".into()),
            o.name_any(),
        );
        let value = match serde_json::to_value(o.as_ref()) {
            Ok(v) => v,
            Err(e) => {
                bad.push(Malformed {
                    kind: kind.to_owned(),
                    key,
                    message: e.to_string(),
                });
                continue;
            }
        };
        match serde_path_to_error::deserialize::<_, K>(value) {
            Ok(k) => good.push(k),
            Err(e) => bad.push(Malformed {
                kind: kind.to_owned(),
                key,
                message: format!("{}: {}", e.path(), e.inner()),
            }),
        }
    }
    (good, bad)
}

/// The Secrets the objects reference, by namespace and name.
pub fn referenced_secrets(
    providers: &[LLMProvider],
    tools: &[KortexTool],
    policies: &[ChatPolicy],
) -> BTreeSet<ObjectKey> {
    let refs = |ns: Option<&String>, refs: Vec<&SecretKeyRef>| {
        let ns = ns.cloned().unwrap_or_else(|| "default".into());
        refs.into_iter()
            .map(move |r| ObjectKey::new(ns.clone(), r.name.clone()))
            .collect::<Vec<_>>()
    };
    providers
        .iter()
        .flat_map(|p| refs(p.metadata.namespace.as_ref(), p.spec.secret_refs()))
        .chain(
            tools
                .iter()
                .flat_map(|t| refs(t.metadata.namespace.as_ref(), t.spec.secret_refs())),
        )
        .chain(
            policies
                .iter()
                .flat_map(|p| refs(p.metadata.namespace.as_ref(), p.spec.secret_refs())),
        )
        .collect()
}

/// What a compilation read, to tell whether anything that matters changed: the objects'
/// generations (status writes do not change them) and the Secrets' resource versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs(BTreeSet<(String, String, String, String)>);

impl Inputs {
    fn object(&mut self, kind: &str, o: &DynamicObject) {
        self.0.insert((
            kind.to_owned(),
            o.namespace().unwrap_or_default(),
            o.name_any(),
            format!(
                "{}:{}",
                o.metadata.uid.clone().unwrap_or_default(),
                o.metadata.generation.unwrap_or_default()
            ),
        ));
    }
}

/// Fetches Secrets by name, keeping the ones whose resourceVersion did not change.
#[derive(Default)]
pub struct SecretCache {
    by_key: BTreeMap<ObjectKey, Secret>,
}

impl SecretCache {
    /// The Secrets of `wanted` that exist (per `meta`), read afresh when their
    /// resourceVersion changed; the others are forgotten.
    async fn refresh(
        &mut self,
        client: &Client,
        wanted: &BTreeMap<ObjectKey, Arc<PartialObjectMeta<Secret>>>,
    ) -> Vec<Secret> {
        self.by_key.retain(|k, _| wanted.contains_key(k));
        for (key, meta) in wanted {
            let fresh = self.by_key.get(key).is_some_and(|s| {
                s.metadata.resource_version == meta.metadata.resource_version
                    && s.metadata.uid == meta.metadata.uid
            });
            if fresh {
                continue;
            }
            let api: Api<Secret> = Api::namespaced(client.clone(), &key.namespace);
            match api.get_opt(&key.name).await {
                Ok(Some(secret)) => {
                    self.by_key.insert(key.clone(), secret);
                }
                Ok(None) => {
                    self.by_key.remove(key);
                }
                Err(e) => {
                    // Keep the last value read, if any: a failed read is not a deletion.
                    tracing::warn!(secret = %key, error = %e, "cannot read a referenced Secret");
                }
            }
        }
        self.by_key.values().cloned().collect()
    }
}

/// Waits for the first list of every watch, then compiles the watched objects whenever
/// they change (debounced) and publishes the result, until `stop` flips. Objects that
/// cannot be read are logged and listed in the configuration (`invalid`).
pub async fn compile_loop(
    client: Client,
    scope: Scope,
    observed: Observed,
    tx: watch::Sender<Arc<LiveConfig>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut changes = observed.changed.subscribe();
    tokio::select! {
        ready = observed.wait_until_ready() => if let Err(e) = ready {
            tracing::error!(error = %e, "the cluster watches stopped");
            return;
        },
        _ = stop.changed() => return,
    }
    tracing::info!("every watch listed its objects; compiling the configuration");
    let mut cache = SecretCache::default();
    let mut last_inputs: Option<Inputs> = None;
    let mut last_malformed: Vec<Malformed> = Vec::new();
    loop {
        let mut inputs = Inputs::default();
        let (providers, mut bad) = typed::<LLMProvider>(&observed.providers, &mut inputs);
        let (tools, b) = typed::<KortexTool>(&observed.tools, &mut inputs);
        bad.extend(b);
        let (policies, b) = typed::<ChatPolicy>(&observed.policies, &mut inputs);
        bad.extend(b);
        let (proposals, b) = typed::<ActionProposal>(&observed.proposals, &mut inputs);
        bad.extend(b);
        if bad != last_malformed {
            for m in bad.iter().filter(|m| !last_malformed.contains(m)) {
                tracing::error!(kind = %m.kind, object = %m.key, error = %m.message, "cannot read this object; it is left out of the configuration");
            }
            last_malformed = bad.clone();
        }

        // Referenced Secrets that exist, and Kortex's own credential Secrets.
        let mut wanted: BTreeMap<ObjectKey, Arc<PartialObjectMeta<Secret>>> = BTreeMap::new();
        let metas: BTreeMap<ObjectKey, Arc<PartialObjectMeta<Secret>>> = observed
            .secrets
            .state()
            .into_iter()
            .map(|m| (ObjectKey::of(m.as_ref()), m))
            .collect();
        // A referenced Secret is read only when its owner opted it in: otherwise the
        // catalog sees its metadata alone and says so (`SecretNotOptedIn`).
        let mut not_opted_in: BTreeMap<ObjectKey, Arc<PartialObjectMeta<Secret>>> = BTreeMap::new();
        for key in referenced_secrets(&providers, &tools, &policies) {
            if let Some(meta) = metas.get(&key) {
                if catalog::secrets::opted_in(&meta.metadata) {
                    wanted.insert(key, meta.clone());
                } else {
                    not_opted_in.insert(key, meta.clone());
                }
            }
        }
        for meta in observed.credentials.state() {
            let key = ObjectKey::of(meta.as_ref());
            not_opted_in.remove(&key);
            wanted.insert(key, meta);
        }
        for (key, meta) in wanted.iter().chain(&not_opted_in) {
            inputs.0.insert((
                "Secret".into(),
                key.namespace.clone(),
                key.name.clone(),
                format!(
                    "{}:{}",
                    meta.metadata.uid.clone().unwrap_or_default(),
                    meta.metadata.resource_version.clone().unwrap_or_default()
                ),
            ));
        }

        if last_inputs.as_ref() != Some(&inputs) {
            let mut secrets = cache.refresh(&client, &wanted).await;
            secrets.extend(not_opted_in.values().map(|meta| Secret {
                metadata: meta.metadata.clone(),
                ..Default::default()
            }));
            // Only Kortex's own namespace may issue credentials.
            for s in &mut secrets {
                if s.metadata.namespace.as_deref() != Some(scope.own_namespace.as_str())
                    && let Some(labels) = s.metadata.labels.as_mut()
                {
                    labels.remove(catalog::credentials::CREDENTIALS_LABEL);
                }
            }
            let objects = ObjectSet {
                providers,
                tools,
                policies,
                proposals,
                secrets,
                reserved_headers: scope.reserved_headers.clone(),
            };
            let previous = tx.borrow().clone();
            let mut config = build(&objects, previous.version + 1);
            config.invalid = bad;
            tracing::info!(
                version = config.version,
                providers = config.catalog.providers.len(),
                tools = config.catalog.tools.len(),
                policies = config.catalog.policies.len(),
                "configuration compiled from the cluster"
            );
            tx.send_replace(Arc::new(config));
            last_inputs = Some(inputs);
        }

        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
        // Gather the burst of events one change brings (an apply of many objects).
        tokio::time::sleep(DEBOUNCE).await;
    }
}

fn typed<K: DeserializeOwned + Resource<DynamicType = ()>>(
    store: &Store<DynamicObject>,
    inputs: &mut Inputs,
) -> (Vec<K>, Vec<Malformed>) {
    let kind = K::kind(&()).to_string();
    let objects = store.state();
    for o in &objects {
        inputs.object(&kind, o);
    }
    convert::<K>(&objects, &kind)
}

/// The live configuration of a cluster's objects. Statuses come from the cluster, so
/// condition transition times carry over from what the API server holds.
pub fn build(objects: &ObjectSet, version: u64) -> LiveConfig {
    let now = jiff::Timestamp::now();
    LiveConfig {
        catalog: catalog::compile(objects, now),
        loaded_at: now,
        version,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(value: serde_json::Value) -> Arc<DynamicObject> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn one_unreadable_object_does_not_hide_the_others() {
        let objects = vec![
            dynamic(
                serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
                "metadata": {"name": "good", "namespace": "a"}, "spec": {"type": "ollama"}}),
            ),
            dynamic(
                serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
                "metadata": {"name": "bad", "namespace": "a"}, "spec": {"type": "bard"}}),
            ),
        ];
        let (good, bad) = convert::<LLMProvider>(&objects, "LLMProvider");
        assert_eq!(good.len(), 1);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].key, ObjectKey::new("a", "bad"));
        assert!(
            bad[0].message.starts_with("spec.type"),
            "{}",
            bad[0].message
        );
    }

    #[test]
    fn referenced_secrets_are_named_in_their_objects_namespace() {
        let provider: LLMProvider = serde_json::from_value(serde_json::json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "p", "namespace": "a"},
            "spec": {"type": "openai", "apiKeySecretRef": {"name": "keys", "key": "openai"},
                "headers": [{"name": "X-Org", "valueFrom": {"secretKeyRef": {"name": "org", "key": "id"}}}]}}))
        .unwrap();
        let tool: KortexTool = serde_json::from_value(serde_json::json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "KortexTool",
            "metadata": {"name": "t", "namespace": "b"},
            "spec": {"description": "d", "http": {"url": "http://x/y", "auth": {"type": "bearer", "secretRef": {"name": "keys", "key": "t"}}}}}))
        .unwrap();
        let refs = referenced_secrets(&[provider], &[tool], &[]);
        assert_eq!(
            refs.into_iter().collect::<Vec<_>>(),
            [
                ObjectKey::new("a", "keys"),
                ObjectKey::new("a", "org"),
                ObjectKey::new("b", "keys")
            ]
        );
    }
}
