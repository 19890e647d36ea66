//! Status of `LLMProvider`, `KortexTool` and `ChatPolicy` objects, written by the leader:
//! the catalog's conditions (with `observedGeneration` and `secretHash`), the provider
//! probe's `Reachable`, the MCP tools discovered, through the status subresource with
//! server-side apply under one field manager. A patch is sent only when the status would
//! change; failed writes are retried with backoff; a change of `Ready` is also a
//! Kubernetes Event on the object.

use crate::catalog::{Catalog, ObjectKey};
use crate::crd::conditions::{self, Desired, types};
use crate::crd::{ChatPolicy, KortexTool, LLMProvider};
use crate::llm::probe::ProbeResult;
use crate::tools::PluginSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

const PROVIDER: &str = "LLMProvider";
const TOOL: &str = "KortexTool";
const POLICY: &str = "ChatPolicy";

/// How long a written status is expected to take to show up in the watch.
const SHOWN_WITHIN: Duration = Duration::from_secs(10);

/// The field manager of every status Kortex writes.
pub const FIELD_MANAGER: &str = "kortex";

/// One status to write.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusUpdate {
    /// `LLMProvider`, `KortexTool` or `ChatPolicy`.
    pub kind: &'static str,
    /// The object.
    pub key: ObjectKey,
    /// The whole status, as it should be.
    pub status: Value,
    /// When `Ready` changes: the new condition (for an Event).
    pub ready_changed: Option<Condition>,
}

/// Statuses as the API server holds them, by kind and key (`Value::Null` when unset).
pub type ObservedStatuses = BTreeMap<(&'static str, ObjectKey), Value>;

/// Reads the statuses from watched objects.
pub fn observed_statuses(
    kind: &'static str,
    objects: &[std::sync::Arc<DynamicObject>],
    out: &mut ObservedStatuses,
) {
    for o in objects {
        let key = ObjectKey::new(
            o.namespace().unwrap_or_else(|| "default".into()),
            o.name_any(),
        );
        out.insert(
            (kind, key),
            o.data.get("status").cloned().unwrap_or(Value::Null),
        );
    }
}

/// The statuses that differ from what the API server holds.
pub fn plan(
    catalog: &Catalog,
    probes: &BTreeMap<ObjectKey, ProbeResult>,
    plugins: &PluginSet,
    invalid: &[crate::live::Malformed],
    observed: &ObservedStatuses,
    now: jiff::Timestamp,
) -> Vec<StatusUpdate> {
    let mut out = Vec::new();
    // Objects Kortex cannot read still say why, where `kubectl get` shows it.
    for m in invalid {
        let kind: &'static str = match m.kind.as_str() {
            PROVIDER => PROVIDER,
            TOOL => TOOL,
            POLICY => POLICY,
            _ => continue,
        };
        let seen = observed.get(&(kind, m.key.clone()));
        let mut conditions: Vec<Condition> = seen
            .and_then(|v| v.get("conditions"))
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .unwrap_or_default();
        conditions.retain(|c| c.type_ == types::READY);
        let desired = Desired::fail(
            types::READY,
            conditions::reasons::INVALID_MANIFEST,
            format!("Kortex cannot read this object: {}", m.message),
        );
        conditions::set(&mut conditions, &desired, None, now);
        let status = serde_json::json!({"conditions": conditions});
        if seen == Some(&status) {
            continue;
        }
        out.push(StatusUpdate {
            kind,
            key: m.key.clone(),
            ready_changed: conditions.first().cloned(),
            status,
        });
    }
    for (key, entry) in &catalog.providers {
        let Some(mut status) = entry.object.status.clone() else {
            continue;
        };
        let seen: Option<crate::crd::LLMProviderStatus> = observed
            .get(&(PROVIDER, key.clone()))
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        // `Reachable` from the probe, its transition time carried over from the cluster's.
        status.conditions.retain(|c| c.type_ != types::REACHABLE);
        if let Some(probe) = probes.get(key) {
            let mut reachable: Vec<Condition> = seen
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, types::REACHABLE).cloned())
                .into_iter()
                .collect();
            let message = if probe.ok {
                format!("listed {} model(s)", probe.models.len())
            } else {
                probe.message.clone()
            };
            let desired = Desired {
                type_: types::REACHABLE,
                status: probe.ok,
                reason: probe.reason,
                message,
            };
            conditions::set(
                &mut reachable,
                &desired,
                status.observed_generation,
                probe.checked_at,
            );
            status.conditions.extend(reachable);
            if probe.ok {
                crate::catalog::set_discovered(&mut status, &entry.object.spec, &probe.models);
            }
        } else if let Some(previous) = seen
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::REACHABLE))
            .filter(|_| entry.available)
        {
            // Not probed yet in this process: keep what the cluster says.
            status.conditions.push(previous.clone());
        }
        push(&mut out, PROVIDER, key, &status, observed);
    }
    for (key, entry) in &catalog.tools {
        let Some(mut status) = entry.object.status.clone() else {
            continue;
        };
        if let Some(d) = plugins.discovery.get(key) {
            status.tools = d.tools.clone();
        }
        push(&mut out, TOOL, key, &status, observed);
    }
    for (key, entry) in &catalog.policies {
        if let Some(status) = &entry.object.status {
            push(&mut out, POLICY, key, status, observed);
        }
    }
    out
}

fn push<S: Serialize + serde::de::DeserializeOwned + HasConditions>(
    out: &mut Vec<StatusUpdate>,
    kind: &'static str,
    key: &ObjectKey,
    desired: &S,
    observed: &ObservedStatuses,
) {
    let Ok(desired_value) = serde_json::to_value(desired) else {
        return;
    };
    // Compare in one normal form: the cluster's status read through the same type.
    let seen: Option<S> = observed
        .get(&(kind, key.clone()))
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    let seen_value = seen.as_ref().and_then(|s| serde_json::to_value(s).ok());
    if seen_value.as_ref() == Some(&desired_value) {
        return;
    }
    let ready = |c: &[Condition]| conditions::find(c, types::READY).map(|c| c.status.clone());
    let now_ready = conditions::find(desired.conditions(), types::READY);
    let ready_changed = match (seen.as_ref().map(|s| ready(s.conditions())), now_ready) {
        (Some(Some(before)), Some(after)) if before == after.status => None,
        (_, Some(after)) => Some(after.clone()),
        _ => None,
    };
    out.push(StatusUpdate {
        kind,
        key: key.clone(),
        status: desired_value,
        ready_changed,
    });
}

/// Statuses with conditions.
pub trait HasConditions {
    /// The conditions.
    fn conditions(&self) -> &[Condition];
}

impl HasConditions for crate::crd::LLMProviderStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}
impl HasConditions for crate::crd::KortexToolStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}
impl HasConditions for crate::crd::ChatPolicyStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// The server-side apply body of a status.
pub fn apply_body(kind: &str, name: &str, status: &Value) -> Value {
    serde_json::json!({
        "apiVersion": crate::crd::API_VERSION,
        "kind": kind,
        "metadata": {"name": name},
        "status": status,
    })
}

/// Writes statuses, remembering failures to retry them with backoff (1 s doubling to
/// 5 min) and what was written, so an update is not sent again before the watch shows it
/// (for [`SHOWN_WITHIN`]; after that it is sent again: the object may have been recreated
/// or its status changed by someone else).
pub struct StatusWriter {
    client: kube::Client,
    recorder: Recorder,
    written: BTreeMap<(&'static str, ObjectKey), (Value, Instant)>,
    failures: BTreeMap<(&'static str, ObjectKey), (u32, Instant)>,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
}

impl StatusWriter {
    /// Counts failed writes in `kortex_reconcile_errors_total`.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A writer whose Events are reported as `reporter` (`kortex`, this pod).
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "kortex".into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            written: BTreeMap::new(),
            failures: BTreeMap::new(),
            metrics: None,
        }
    }

    /// Forgets what was written (after losing and regaining the lead).
    pub fn reset(&mut self) {
        self.written.clear();
        self.failures.clear();
    }

    /// Applies `updates`, skipping the ones already sent and those backing off.
    pub async fn apply(&mut self, updates: Vec<StatusUpdate>) {
        for u in updates {
            let id = (u.kind, u.key.clone());
            if self
                .written
                .get(&id)
                .is_some_and(|(v, at)| *v == u.status && at.elapsed() < SHOWN_WITHIN)
            {
                continue;
            }
            if let Some((n, at)) = self.failures.get(&id)
                && at.elapsed() < backoff(*n)
            {
                continue;
            }
            let span =
                crate::telemetry::trace::reconcile_span(u.kind, &u.key.namespace, &u.key.name);
            match self.write(&u).instrument(span.clone()).await {
                Ok(object) => {
                    self.failures.remove(&id);
                    self.written.insert(id, (u.status.clone(), Instant::now()));
                    if let Some(ready) = &u.ready_changed {
                        self.event(&object, ready).instrument(span).await;
                    }
                }
                Err(e) => {
                    crate::telemetry::trace::fail(&span, super::error::api_label(&e));
                    let n = self.failures.get(&id).map_or(0, |(n, _)| n + 1);
                    tracing::warn!(kind = u.kind, object = %u.key, error = %e, retry_in_s = backoff(n).as_secs(), "status write failed");
                    if let Some(m) = &self.metrics {
                        m.reconcile_errors
                            .get_or_create(&crate::metrics::KindLabel { kind: u.kind })
                            .inc();
                    }
                    self.failures.insert(id, (n, Instant::now()));
                }
            }
        }
    }

    async fn write(&self, u: &StatusUpdate) -> Result<DynamicObject, kube::Error> {
        let resource = match u.kind {
            PROVIDER => super::watch::resource::<LLMProvider>(),
            TOOL => super::watch::resource::<KortexTool>(),
            _ => super::watch::resource::<ChatPolicy>(),
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &u.key.namespace, &resource);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch_status(
            &u.key.name,
            &params,
            &Patch::Apply(apply_body(u.kind, &u.key.name, &u.status)),
        )
        .await
    }

    async fn event(&self, object: &DynamicObject, ready: &Condition) {
        let ok = ready.status == "True";
        let event = Event {
            type_: if ok {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: ready.reason.clone(),
            note: Some(crate::operator::event_note(&ready.message)),
            action: if ok { "Ready" } else { "NotReady" }.into(),
            secondary: None,
        };
        let reference = object.object_ref(&object.types.as_ref().map_or_else(
            || kube::api::ApiResource::erase::<LLMProvider>(&()),
            |t| {
                kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                    crate::crd::GROUP,
                    crate::crd::VERSION,
                    &t.kind,
                ))
            },
        ));
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(error = %e, "cannot publish an Event");
        }
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.min(8)).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ObjectSet;

    fn catalog() -> Catalog {
        let provider: LLMProvider = serde_json::from_value(serde_json::json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "local", "namespace": "ops", "generation": 2},
            "spec": {"type": "ollama", "defaultModel": "llama3"}}))
        .unwrap();
        let policy: ChatPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "all", "namespace": "ops"},
            "spec": {"sessions": ["*"], "provider": "local"}}))
        .unwrap();
        crate::catalog::compile(
            &ObjectSet {
                providers: vec![provider],
                policies: vec![policy],
                ..Default::default()
            },
            jiff::Timestamp::now(),
        )
    }

    fn probe(ok: bool, at: jiff::Timestamp) -> ProbeResult {
        ProbeResult {
            reachable: ok,
            ok,
            reason: if ok { "Reachable" } else { "Unreachable" },
            message: if ok {
                "listed 2 model(s) in 12 ms".into()
            } else {
                "connection refused".into()
            },
            models: if ok {
                vec!["llama3".into(), "qwen3".into()]
            } else {
                Vec::new()
            },
            latency_ms: 12,
            checked_at: at,
        }
    }

    #[test]
    fn statuses_are_written_once_and_not_again_when_the_cluster_has_them() {
        let catalog = catalog();
        let key = ObjectKey::new("ops", "local");
        let t0 = jiff::Timestamp::now();
        let probes = BTreeMap::from([(key.clone(), probe(true, t0))]);
        let none = ObservedStatuses::new();
        let updates = plan(&catalog, &probes, &PluginSet::default(), &[], &none, t0);
        assert_eq!(updates.len(), 2, "{updates:?}");
        let provider = &updates[0];
        assert_eq!((provider.kind, &provider.key), ("LLMProvider", &key));
        assert_eq!(provider.status["observedGeneration"], 2);
        assert_eq!(
            provider.status["models"],
            serde_json::json!(["llama3", "qwen3"])
        );
        let reachable = provider.status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Reachable"))
            .cloned()
            .unwrap_or_default();
        // No latency in the message: it would change the status on every probe.
        assert_eq!(reachable["message"], "listed 2 model(s)");
        assert!(provider.ready_changed.is_some(), "first Ready is an Event");

        // The cluster now holds exactly that: nothing to write, even after a later probe.
        let mut seen = ObservedStatuses::new();
        for u in &updates {
            seen.insert((u.kind, u.key.clone()), u.status.clone());
        }
        let later = BTreeMap::from([(
            key.clone(),
            probe(true, t0 + jiff::SignedDuration::from_secs(60)),
        )]);
        assert!(plan(&catalog, &later, &PluginSet::default(), &[], &seen, t0).is_empty());

        // The provider becomes unreachable: one update, Reachable flips, Ready stays.
        let down = BTreeMap::from([(
            key.clone(),
            probe(false, t0 + jiff::SignedDuration::from_secs(120)),
        )]);
        let updates = plan(&catalog, &down, &PluginSet::default(), &[], &seen, t0);
        assert_eq!(updates.len(), 1);
        assert!(updates[0].ready_changed.is_none());
        assert!(updates[0].status.to_string().contains("connection refused"));
    }

    #[test]
    fn unreadable_objects_get_a_ready_false_condition_once() {
        let invalid = vec![crate::live::Malformed {
            kind: "KortexTool".into(),
            key: ObjectKey::new("ops", "broken"),
            message: "spec.http.method: unknown variant `DELETE`".into(),
        }];
        let now = jiff::Timestamp::now();
        let updates = plan(
            &Catalog::default(),
            &BTreeMap::new(),
            &PluginSet::default(),
            &invalid,
            &ObservedStatuses::new(),
            now,
        );
        assert_eq!(updates.len(), 1);
        let c = &updates[0].status["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("Ready"), Some("False"), Some("InvalidManifest"))
        );
        let seen = ObservedStatuses::from([(
            ("KortexTool", ObjectKey::new("ops", "broken")),
            updates[0].status.clone(),
        )]);
        assert!(
            plan(
                &Catalog::default(),
                &BTreeMap::new(),
                &PluginSet::default(),
                &invalid,
                &seen,
                now
            )
            .is_empty()
        );
    }
}
