//! Carries out approved proposals: `restart` (rollout restart of a Deployment, StatefulSet
//! or DaemonSet), `scale` (replicas of a Deployment or StatefulSet, through the `scale`
//! subresource) and `rollback` (a Deployment back to an earlier ReplicaSet's pod template,
//! like `kubectl rollout undo`). Every action runs first as a server-side dry run — which
//! is also the preview shown when the proposal is made — and records what undoes it.

use crate::crd::ProposalTarget;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

/// Field manager of Kortex's writes to workloads.
pub const FIELD_MANAGER: &str = "kortex";
/// The annotation `kubectl rollout restart` sets.
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// Parameters Kortex adds when a proposal is made, pinning what the preview showed: the
/// target's `metadata.generation` (every verb) and, for `scale`, the replicas it had. A
/// rollback also gets the `toRevision` it chose. Before executing, the target must still
/// be as pinned; otherwise the action is not carried out.
pub const EXPECT_GENERATION: &str = "expectGeneration";
/// See [`EXPECT_GENERATION`].
pub const EXPECT_REPLICAS: &str = "expectReplicas";

/// The actions Kortex can carry out.
pub const EXECUTABLE: &[&str] = &["restart", "scale", "rollback"];

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// `restart`, `scale` or `rollback`.
    pub verb: String,
    /// The workload.
    pub target: ProposalTarget,
    /// `{"replicas": n}` for scale, `{"toRevision": n}` (optional) for rollback.
    pub params: Value,
}

/// The result of an execution.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// What was done, for `status.message`.
    pub message: String,
    /// The inverse action (`{action, target, params}`), when there is one.
    pub undo: Option<Value>,
}

/// Why an action could not be previewed, pinned or carried out. Its message is what the
/// proposal's status, the model and the log say; [`ExecError::metric_label`] is its short
/// category (for counters and Events), in one place.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Not an action Kortex carries out as asked (verb, kind, parameters): checked before
    /// anything is sent.
    #[error("{0}")]
    Invalid(String),
    /// The target changed since it was proposed: nothing was written.
    #[error("not executed: {0}")]
    Moved(String),
    /// The target is not as the action needs (no revision to roll back to, …).
    #[error("{0}")]
    Target(String),
    /// The API server refused or failed a call; `what` says which.
    #[error("{what}: {}", api_error(source))]
    Api {
        /// What was being done.
        what: String,
        /// The client's error, kept.
        #[source]
        source: kube::Error,
    },
}

impl ExecError {
    /// The short category: `invalid`, `moved`, `target`, `forbidden`, `conflict`,
    /// `not_found` or `api`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid",
            Self::Moved(_) => "moved",
            Self::Target(_) => "target",
            Self::Api {
                source: kube::Error::Api(s),
                ..
            } => match s.code {
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                _ => "api",
            },
            Self::Api { .. } => "api",
        }
    }
}

/// What an approver must be allowed themselves (a SubjectAccessReview), for Kortex to
/// carry an action out in their name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// `patch`, `update`.
    pub verb: &'static str,
    /// API group (`apps`, `argoproj.io`, …).
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource (`scale`), if any.
    pub subresource: Option<String>,
    /// Namespace of the object.
    pub namespace: Option<String>,
    /// Name of the object.
    pub name: String,
}

impl std::fmt::Display for Access {
    /// `update applications.argoproj.io argocd/shop`, as messages name it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}{}.{} {}/{}",
            self.verb,
            self.resource,
            self.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            self.group,
            self.namespace.as_deref().unwrap_or_default(),
            self.name
        )
    }
}

/// What the approver of `action` must be allowed: the workload's own verb for a live
/// change; for a Git change (`params.git.owner`), `update` on the Application or
/// Kustomization that applies it (they could change what it syncs themselves).
pub fn required_access(action: &Action) -> Result<Access, ExecError> {
    if let Some(owner) = action.params.get("git").map(|g| &g["owner"])
        && owner.is_object()
    {
        let (group, resource) = match owner["kind"].as_str() {
            Some("Application") => ("argoproj.io", "applications"),
            Some("Kustomization") => ("kustomize.toolkit.fluxcd.io", "kustomizations"),
            other => {
                return Err(ExecError::Invalid(format!(
                    "a Git change names its owner as an Application or Kustomization, not {}",
                    other.unwrap_or("nothing")
                )));
            }
        };
        return Ok(Access {
            verb: "update",
            group: group.into(),
            resource: resource.into(),
            subresource: None,
            namespace: owner["namespace"].as_str().map(str::to_owned),
            name: owner["name"].as_str().unwrap_or_default().to_owned(),
        });
    }
    let resource = plural(&action.target.kind)?;
    let (verb, subresource) = match action.verb.as_str() {
        "scale" => ("patch", Some("scale".into())),
        // A rollback replaces the object with the old template (a PUT).
        "rollback" => ("update", None),
        _ => ("patch", None),
    };
    Ok(Access {
        verb,
        group: "apps".into(),
        resource: resource.into(),
        subresource,
        namespace: action.target.namespace.clone(),
        name: action.target.name.clone(),
    })
}

fn plural(kind: &str) -> Result<&'static str, ExecError> {
    match kind {
        "Deployment" => Ok("deployments"),
        "StatefulSet" => Ok("statefulsets"),
        "DaemonSet" => Ok("daemonsets"),
        other => Err(ExecError::Invalid(format!(
            "Kortex carries out actions on Deployments, StatefulSets and DaemonSets, not {other}"
        ))),
    }
}

/// Checks an action before anything is sent: a supported verb, kind and parameters.
pub fn validate(action: &Action) -> Result<(), ExecError> {
    check(action).map_err(ExecError::Invalid)
}

fn check(action: &Action) -> Result<(), String> {
    if !EXECUTABLE.contains(&action.verb.as_str()) {
        return Err(format!(
            "{} is not an action Kortex carries out (only {})",
            action.verb,
            EXECUTABLE.join(", ")
        ));
    }
    if action.target.api_version != "apps/v1" {
        return Err(format!(
            "target apiVersion must be apps/v1, not {}",
            action.target.api_version
        ));
    }
    plural(&action.target.kind).map_err(|e| e.to_string())?;
    if action.target.namespace.is_none() {
        return Err("the target needs a namespace".into());
    }
    match action.verb.as_str() {
        "scale" => {
            if action.target.kind == "DaemonSet" {
                return Err("a DaemonSet cannot be scaled".into());
            }
            match action.params.get("replicas").and_then(Value::as_i64) {
                Some(n) if (0..=10_000).contains(&n) => {}
                _ => return Err("scale needs params.replicas, an integer from 0 to 10000".into()),
            }
        }
        "rollback" => {
            if action.target.kind != "Deployment" {
                return Err("rollback is supported for Deployments only".into());
            }
            if let Some(v) = action.params.get("toRevision")
                && v.as_i64().is_none_or(|n| n <= 0)
            {
                return Err("params.toRevision must be a positive revision number".into());
            }
        }
        _ => {}
    }
    for key in [EXPECT_GENERATION, EXPECT_REPLICAS] {
        if let Some(v) = action.params.get(key)
            && v.as_i64().is_none_or(|n| n < 0)
        {
            return Err(format!("params.{key} must be a non-negative integer"));
        }
    }
    Ok(())
}

/// Why `current` (the target now) is not what the proposal pinned, if it is not: the
/// decision was about the object as the preview showed it.
pub fn moved(action: &Action, current: &Value) -> Option<String> {
    let what = action.target.to_string();
    let Some(generation) = action.params.get(EXPECT_GENERATION).and_then(Value::as_i64) else {
        return Some(format!(
            "the proposal does not pin the state of {what} it was made for (params.{EXPECT_GENERATION}: made when the target could not be read, or by an older Kortex); propose it again"
        ));
    };
    let now = current["metadata"]["generation"].as_i64().unwrap_or(0);
    if now != generation {
        return Some(format!(
            "{what} changed since the proposal was made (generation {now}, was {generation}): what was approved is not what it would do now; propose it again"
        ));
    }
    if let Some(replicas) = action.params.get(EXPECT_REPLICAS).and_then(Value::as_i64) {
        let now = current["spec"]["replicas"].as_i64().unwrap_or(1);
        if now != replicas {
            return Some(format!(
                "{what} has {now} replicas, not the {replicas} it had when the proposal was made (an autoscaler or someone else scaled it); propose it again"
            ));
        }
    }
    None
}

/// Runs actions against a cluster.
#[derive(Clone)]
pub struct Executor {
    client: kube::Client,
}

impl Executor {
    /// An executor acting as `client` (Kortex's service account).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The client it acts as.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The target as it is now, as JSON.
    pub async fn current(&self, action: &Action) -> Result<Value, ExecError> {
        validate(action)?;
        let api = self.api(action)?;
        let current = read(&api, action).await?;
        Ok(serde_json::to_value(&current).unwrap_or_default())
    }

    /// The images a rollback would change: `(container, image now, image after)` for each
    /// container whose image differs between the current template and the revision chosen
    /// (`params.toRevision`, or the newest one before the current).
    pub async fn rollback_images(
        &self,
        action: &Action,
    ) -> Result<Vec<(String, String, String)>, ExecError> {
        validate(action)?;
        let api = self.api(action)?;
        let current = read(&api, action).await?;
        let (_, template) = self.rollback_target(action, &current).await?;
        let now = serde_json::to_value(&current).unwrap_or_default();
        let by_name = |t: &Value| -> Vec<(String, String)> {
            t["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    Some((
                        c["name"].as_str()?.to_owned(),
                        c["image"].as_str()?.to_owned(),
                    ))
                })
                .collect()
        };
        let before = by_name(&now["spec"]["template"]);
        let after = by_name(&template);
        Ok(before
            .into_iter()
            .filter_map(|(name, from)| {
                let to = after.iter().find(|(n, _)| *n == name)?.1.clone();
                (to != from).then_some((name, from, to))
            })
            .collect())
    }

    fn api(&self, action: &Action) -> Result<Api<DynamicObject>, ExecError> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", &action.target.kind),
            plural(&action.target.kind)?,
        );
        let namespace = action.target.namespace.as_deref().unwrap_or("default");
        Ok(Api::namespaced_with(
            self.client.clone(),
            namespace,
            &resource,
        ))
    }

    /// What the action would change (a server-side dry run), with warnings about other
    /// controllers that own what would change.
    pub async fn preview(&self, action: &Action) -> Result<Value, ExecError> {
        validate(action)?;
        let api = self.api(action)?;
        let current = read(&api, action).await?;
        let after = self.apply(&api, &current, action, true).await?;
        let mut warnings = gitops_warnings(&current, &action.verb);
        if action.verb == "scale" {
            warnings.extend(self.hpa_warnings(action).await);
        }
        Ok(json!({
            "dryRun": true,
            "before": summary(action, &current),
            "after": summary(action, &after),
            "warnings": warnings,
        }))
    }

    /// The action's parameters with the target's state pinned ([`EXPECT_GENERATION`],
    /// [`EXPECT_REPLICAS`], and the `toRevision` a rollback would choose now), for the
    /// proposal and its preview.
    pub async fn pin(&self, action: &Action) -> Result<Value, ExecError> {
        validate(action)?;
        let api = self.api(action)?;
        let current = read(&api, action).await?;
        let value = serde_json::to_value(&current).unwrap_or_default();
        let mut params = match &action.params {
            Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        params.insert(
            EXPECT_GENERATION.into(),
            json!(value["metadata"]["generation"].as_i64().unwrap_or(0)),
        );
        match action.verb.as_str() {
            "scale" => {
                params.insert(
                    EXPECT_REPLICAS.into(),
                    json!(value["spec"]["replicas"].as_i64().unwrap_or(1)),
                );
            }
            "rollback" => {
                let (revision, _) = self.rollback_target(action, &current).await?;
                params.insert("toRevision".into(), json!(revision));
            }
            _ => {}
        }
        Ok(Value::Object(params))
    }

    /// Carries the action out: a dry run first, then the real change. Returns what was done
    /// and how to undo it. The target must still be as the proposal pinned it.
    pub async fn execute(&self, action: &Action) -> Result<Executed, ExecError> {
        validate(action)?;
        let api = self.api(action)?;
        let current = read(&api, action).await?;
        if let Some(why) = moved(action, &serde_json::to_value(&current).unwrap_or_default()) {
            return Err(ExecError::Moved(why));
        }
        self.apply(&api, &current, action, true).await?;
        let after = self.apply(&api, &current, action, false).await?;
        let target = json!(action.target);
        let current_value = serde_json::to_value(&current).unwrap_or_default();
        let what = action.target.to_string();
        Ok(match action.verb.as_str() {
            "restart" => Executed {
                message: format!(
                    "restarted {what} (pod template annotated {RESTARTED_AT}={})",
                    after["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT]
                        .as_str()
                        .unwrap_or_default()
                ),
                undo: None,
            },
            "scale" => {
                let before = current_value["spec"]["replicas"].as_i64().unwrap_or(1);
                let now = action.params["replicas"].as_i64().unwrap_or_default();
                Executed {
                    message: format!("scaled {what} from {before} to {now} replicas"),
                    undo: Some(
                        json!({"action": "scale", "target": target, "params": {"replicas": before}}),
                    ),
                }
            }
            _ => {
                let from = revision(&current_value).unwrap_or_default();
                Executed {
                    message: format!(
                        "rolled {what} back from revision {from} (images now {})",
                        images(&after["spec"]["template"]).join(", ")
                    ),
                    undo: (from > 0).then(|| {
                        json!({"action": "rollback", "target": target, "params": {"toRevision": from}})
                    }),
                }
            }
        })
    }

    /// Sends the change (`dry_run`: only validated and computed by the API server).
    async fn apply(
        &self,
        api: &Api<DynamicObject>,
        current: &DynamicObject,
        action: &Action,
        dry_run: bool,
    ) -> Result<Value, ExecError> {
        let name = &action.target.name;
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            dry_run,
            ..Default::default()
        };
        let result = match action.verb.as_str() {
            "restart" => {
                let now = jiff::Timestamp::now().to_string();
                let patch = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}});
                api.patch(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(|o| serde_json::to_value(o).unwrap_or_default())
            }
            "scale" => {
                let patch = json!({"spec": {"replicas": action.params["replicas"]}});
                api.patch_scale(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(|s| json!({"spec": {"replicas": s.spec.and_then(|s| s.replicas)}}))
            }
            _ => {
                let template = self.rollback_template(action, current).await?;
                let mut updated = current.clone();
                updated.data["spec"]["template"] = template;
                let post = PostParams {
                    dry_run,
                    field_manager: Some(FIELD_MANAGER.into()),
                };
                // A replace carries the resourceVersion read: a concurrent change fails it.
                api.replace(name, &post, &updated)
                    .await
                    .map(|o| serde_json::to_value(o).unwrap_or_default())
            }
        };
        result.map_err(|source| ExecError::Api {
            what: format!(
                "{}{} of {} {name} failed",
                action.verb,
                if dry_run { " (dry run)" } else { "" },
                action.target.kind,
            ),
            source,
        })
    }

    /// The pod template of the revision to go back to.
    async fn rollback_template(
        &self,
        action: &Action,
        deployment: &DynamicObject,
    ) -> Result<Value, ExecError> {
        Ok(self.rollback_target(action, deployment).await?.1)
    }

    /// The revision to go back to and its pod template: `toRevision`, or the newest one
    /// before the current revision.
    async fn rollback_target(
        &self,
        action: &Action,
        deployment: &DynamicObject,
    ) -> Result<(i64, Value), ExecError> {
        let namespace = action.target.namespace.as_deref().unwrap_or("default");
        let current = revision(&serde_json::to_value(deployment).unwrap_or_default()).unwrap_or(0);
        let uid = deployment.metadata.uid.clone().unwrap_or_default();
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "ReplicaSet"),
            "replicasets",
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource);
        let list = api
            .list(&Default::default())
            .await
            .map_err(|source| ExecError::Api {
                what: format!("cannot list ReplicaSets in {namespace}"),
                source,
            })?;
        let mut owned: Vec<(i64, Value)> = list
            .items
            .into_iter()
            .filter(|rs| {
                rs.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| o.iter().any(|r| r.uid == uid))
            })
            .filter_map(|rs| {
                let v = serde_json::to_value(&rs).ok()?;
                Some((revision(&v)?, v))
            })
            .collect();
        owned.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
        let wanted = action.params.get("toRevision").and_then(Value::as_i64);
        let chosen = match wanted {
            Some(r) => owned.iter().find(|(rev, _)| *rev == r),
            None => owned.iter().find(|(rev, _)| *rev < current),
        }
        .ok_or_else(|| {
            ExecError::Target(match wanted {
                Some(r) => format!(
                    "revision {r} of Deployment {} no longer exists",
                    action.target.name
                ),
                None => format!(
                    "Deployment {} has no earlier revision to roll back to",
                    action.target.name
                ),
            })
        })?;
        if chosen.0 == current {
            return Err(ExecError::Target(format!(
                "revision {current} is already the current one"
            )));
        }
        let mut template = chosen.1["spec"]["template"].clone();
        if let Some(labels) = template["metadata"]["labels"].as_object_mut() {
            labels.remove("pod-template-hash");
        }
        Ok((chosen.0, template))
    }

    async fn hpa_warnings(&self, action: &Action) -> Vec<String> {
        let namespace = action.target.namespace.as_deref().unwrap_or("default");
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("autoscaling", "v2", "HorizontalPodAutoscaler"),
            "horizontalpodautoscalers",
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource);
        let Ok(list) = api.list(&Default::default()).await else {
            return Vec::new();
        };
        list.items
            .iter()
            .filter(|h| {
                let r = &h.data["spec"]["scaleTargetRef"];
                r["kind"] == action.target.kind.as_str() && r["name"] == action.target.name.as_str()
            })
            .map(|h| {
                format!(
                    "HorizontalPodAutoscaler {} owns the replica count ({}..{}); it will override a manual scale",
                    h.metadata.name.as_deref().unwrap_or_default(),
                    h.data["spec"]["minReplicas"].as_i64().unwrap_or(1),
                    h.data["spec"]["maxReplicas"]
                )
            })
            .collect()
    }
}

async fn read(api: &Api<DynamicObject>, action: &Action) -> Result<DynamicObject, ExecError> {
    let name = &action.target.name;
    api.get(name).await.map_err(|source| ExecError::Api {
        what: format!("cannot read {} {name}", action.target.kind),
        source,
    })
}

/// Warnings when Argo CD or Flux manage the object: they revert a manual change — except a
/// restart's `restartedAt` annotation, which Git does not set (docs/gitops.md).
pub fn gitops_warnings(object: &DynamicObject, verb: &str) -> Vec<String> {
    let restart = verb == "restart";
    let labels = object.metadata.labels.clone().unwrap_or_default();
    let annotations = object.metadata.annotations.clone().unwrap_or_default();
    let managers: Vec<String> = object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    let mut out = Vec::new();
    let argo = labels.get("argocd.argoproj.io/instance").or(labels
        .get("app.kubernetes.io/instance")
        .filter(|_| annotations.contains_key("argocd.argoproj.io/tracking-id")));
    if argo.is_some()
        || annotations.contains_key("argocd.argoproj.io/tracking-id")
        || managers.iter().any(|m| m.starts_with("argocd"))
    {
        let app = argo
            .map(|a| format!(" (application {a})"))
            .unwrap_or_default();
        out.push(if restart {
            format!(
                "managed by Argo CD{app}: a restart sets only the pod template's {RESTARTED_AT} annotation, which Git does not set, so self-heal keeps it (as Argo CD's own restart action does); if your manifests set that annotation, it is reverted"
            )
        } else {
            format!(
                "managed by Argo CD{app}: with self-heal on, it reverts manual changes; change Git instead or pause sync"
            )
        });
    }
    let flux = labels
        .get("kustomize.toolkit.fluxcd.io/name")
        .or(labels.get("helm.toolkit.fluxcd.io/name"));
    if flux.is_some()
        || managers
            .iter()
            .any(|m| m == "kustomize-controller" || m == "helm-controller")
    {
        let owner = flux.map(|f| format!(" ({f})")).unwrap_or_default();
        out.push(if restart {
            format!(
                "managed by Flux{owner}: a restart sets only the pod template's {RESTARTED_AT} annotation, a field Flux's server-side apply leaves to its manager (kortex); if your manifests set that annotation, it is reverted"
            )
        } else {
            format!(
                "managed by Flux{owner}: it reverts manual changes at its next reconciliation; change Git instead or suspend it"
            )
        });
    }
    out
}

/// The parts of a workload an action changes.
fn summary(action: &Action, object: &impl serde::Serialize) -> Value {
    let o = serde_json::to_value(object).unwrap_or_default();
    match action.verb.as_str() {
        "restart" => {
            json!({"restartedAt": o["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT]})
        }
        "scale" => json!({"replicas": o["spec"]["replicas"]}),
        _ => json!({"revision": revision(&o), "images": images(&o["spec"]["template"])}),
    }
}

fn revision(o: &Value) -> Option<i64> {
    o["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
}

fn images(template: &Value) -> Vec<String> {
    template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["image"].as_str().map(str::to_owned))
        .collect()
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => crate::tools::plugin_http::error_chain(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(verb: &str, kind: &str, params: Value) -> Action {
        Action {
            verb: verb.into(),
            target: ProposalTarget {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                namespace: Some("shop".into()),
                name: "api".into(),
            },
            params,
        }
    }

    #[test]
    fn actions_are_checked_before_anything_is_sent() {
        assert!(validate(&action("restart", "Deployment", json!({}))).is_ok());
        assert!(validate(&action("scale", "StatefulSet", json!({"replicas": 3}))).is_ok());
        assert!(validate(&action("rollback", "Deployment", json!({}))).is_ok());
        for (a, why) in [
            (action("delete", "Deployment", json!({})), "not an action"),
            (action("restart", "CronJob", json!({})), "not CronJob"),
            (action("scale", "Deployment", json!({})), "params.replicas"),
            (
                action("scale", "Deployment", json!({"replicas": -1})),
                "params.replicas",
            ),
            (
                action("scale", "DaemonSet", json!({"replicas": 2})),
                "cannot be scaled",
            ),
            (
                action("rollback", "StatefulSet", json!({})),
                "Deployments only",
            ),
            (
                action("rollback", "Deployment", json!({"toRevision": "x"})),
                "toRevision",
            ),
        ] {
            let e = validate(&a)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(why), "{a:?}: {e}");
        }
        assert_eq!(
            required_access(&action("scale", "Deployment", json!({"replicas": 1})))
                .ok()
                .map(|a| a.to_string()),
            Some("patch deployments/scale.apps shop/api".into())
        );
        assert_eq!(
            required_access(&action("rollback", "Deployment", json!({})))
                .ok()
                .map(|a| a.verb),
            Some("update")
        );
        let git = json!({"replicas": 5, "git": {"owner": {"kind": "Application", "namespace": "argocd", "name": "shop"}}});
        assert_eq!(
            required_access(&action("scale", "Deployment", git))
                .ok()
                .map(|a| a.to_string()),
            Some("update applications.argoproj.io argocd/shop".into())
        );
        let kind = required_access(&action("restart", "CronJob", json!({})));
        assert!(
            matches!(&kind, Err(e) if e.metric_label() == "invalid"),
            "{kind:?}"
        );
    }

    /// What was approved is what is done: the target's generation (and, for scale, its
    /// replicas) must still be what the proposal pinned.
    #[test]
    fn a_target_that_moved_since_the_proposal_is_not_acted_on() {
        let deployment = |generation: i64, replicas: i64| json!({"metadata": {"generation": generation}, "spec": {"replicas": replicas}});
        let restart = action("restart", "Deployment", json!({EXPECT_GENERATION: 4}));
        assert_eq!(moved(&restart, &deployment(4, 2)), None);
        let why = moved(&restart, &deployment(5, 2)).unwrap_or_default();
        assert!(
            why.contains("changed since the proposal was made (generation 5, was 4)"),
            "{why}"
        );
        let scale = action(
            "scale",
            "Deployment",
            json!({"replicas": 5, EXPECT_GENERATION: 4, EXPECT_REPLICAS: 2}),
        );
        assert_eq!(moved(&scale, &deployment(4, 2)), None);
        // Replicas are compared on their own too.
        let why = moved(&scale, &deployment(4, 3)).unwrap_or_default();
        assert!(why.contains("has 3 replicas, not the 2"), "{why}");
        // Unpinned (the target could not be read when it was made): never executed.
        let why = moved(
            &action("restart", "Deployment", json!({})),
            &deployment(1, 1),
        )
        .unwrap_or_default();
        assert!(why.contains("does not pin"), "{why}");
        assert!(
            validate(&action(
                "restart",
                "Deployment",
                json!({EXPECT_GENERATION: -1})
            ))
            .is_err()
        );
    }

    #[test]
    fn gitops_owners_are_warned_about() {
        let o: DynamicObject = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "api", "labels": {"kustomize.toolkit.fluxcd.io/name": "apps"},
                "annotations": {"argocd.argoproj.io/tracking-id": "shop:apps/Deployment:shop/api"}}}))
        .unwrap();
        let w = gitops_warnings(&o, "scale");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("Argo CD") && w[1].contains("Flux (apps)"),
            "{w:?}"
        );
        let plain: DynamicObject = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "api", "managedFields": [{"manager": "kubectl-client-side-apply"}]}}))
        .unwrap();
        assert!(gitops_warnings(&plain, "scale").is_empty());
        let restart = gitops_warnings(&o, "restart");
        assert!(
            restart
                .iter()
                .all(|w| w.contains("restartedAt") && !w.contains("change Git instead")),
            "{restart:?}"
        );
    }
}
