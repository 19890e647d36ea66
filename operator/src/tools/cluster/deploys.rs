//! `get_recent_deploys`: rollout history of Deployments (their ReplicaSets), StatefulSets and
//! DaemonSets (their ControllerRevisions): revisions, images, change causes, times and
//! rollbacks.

use super::{Cluster, ClusterTool, Kind, ToolError, age, required, seg};
use crate::llm::ToolSpec;
use serde_json::{Value, json};
use std::sync::Arc;

/// Workloads shown at most.
const MAX_WORKLOADS: usize = 20;

/// The tool.
pub struct GetRecentDeploys;

impl ClusterTool for GetRecentDeploys {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_recent_deploys".into(),
            description: "Rollout history of Deployments, StatefulSets and DaemonSets in a namespace (or of one, by kind and name): revisions newest first with their images, change causes and creation times, which revision is current, rollbacks, and whether a rollout is still progressing or stalled. Use it to correlate a problem's start with a deploy.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                    "kind": {"type": "string", "enum": ["Deployment", "StatefulSet", "DaemonSet"]},
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5, "description": "Revisions per workload."}
                },
                "required": ["namespace"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(cluster: Arc<Cluster>, input: Value) -> Result<String, ToolError> {
        recent_deploys(&cluster, &input).await
    }
}

async fn recent_deploys(cluster: &Cluster, input: &Value) -> Result<String, ToolError> {
    let namespace = required(input, "namespace")?;
    let limit = input["limit"].as_u64().unwrap_or(5).clamp(1, 20) as usize;
    let kinds: Vec<&str> = match input["kind"].as_str() {
        Some(k) => vec![k],
        None => vec!["Deployment", "StatefulSet", "DaemonSet"],
    };
    let name = input["name"].as_str();
    let mut workloads = Vec::new();
    for kind_name in &kinds {
        let kind = Kind::builtin(kind_name, None)
            .ok_or_else(|| ToolError::Validation(format!("unknown kind {kind_name}")))?;
        let path = kind.path(Some(namespace));
        match name {
            Some(n) => match cluster.get_json(&format!("{path}/{}", seg(n))).await {
                Ok(o) => workloads.push((kind.kind.clone(), o)),
                Err(ToolError::Upstream(m)) if m.starts_with("not found") && kinds.len() > 1 => {}
                Err(e) => return Err(e),
            },
            None => {
                let list = cluster.get_json(&path).await?;
                for o in list["items"].as_array().into_iter().flatten() {
                    workloads.push((kind.kind.clone(), o.clone()));
                }
            }
        }
    }
    if workloads.is_empty() {
        return Err(ToolError::Upstream(match name {
            Some(n) => format!("no Deployment, StatefulSet or DaemonSet named {n} in {namespace}"),
            None => format!("no Deployments, StatefulSets or DaemonSets in {namespace}"),
        }));
    }
    let needs = |k: &str| workloads.iter().any(|(kind, _)| kind == k);
    let replica_sets = if needs("Deployment") {
        cluster
            .get_json(&format!(
                "/apis/apps/v1/namespaces/{}/replicasets",
                seg(namespace)
            ))
            .await?
    } else {
        Value::Null
    };
    let revisions = if needs("StatefulSet") || needs("DaemonSet") {
        cluster
            .get_json(&format!(
                "/apis/apps/v1/namespaces/{}/controllerrevisions",
                seg(namespace)
            ))
            .await?
    } else {
        Value::Null
    };
    let mut views: Vec<Value> = workloads
        .iter()
        .map(|(kind, o)| match kind.as_str() {
            "Deployment" => deployment_history(o, &replica_sets, limit),
            _ => controller_history(kind, o, &revisions, limit),
        })
        .collect();
    // The most recently changed workloads first.
    views.sort_by(|a, b| b["lastChange"].as_str().cmp(&a["lastChange"].as_str()));
    let total = views.len();
    views.truncate(MAX_WORKLOADS);
    let mut out = json!({"namespace": namespace, "workloads": views});
    if total > MAX_WORKLOADS {
        out["note"] = json!(format!(
            "{total} workloads; the {MAX_WORKLOADS} most recently changed are shown"
        ));
    }
    Ok(out.to_string())
}

fn owned_by<'a>(list: &'a Value, owner: &Value) -> impl Iterator<Item = &'a Value> {
    let uid = owner["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |item| {
            item["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["uid"].as_str() == Some(uid.as_str()) && !uid.is_empty())
        })
}

fn images(pod_spec: &Value) -> Vec<String> {
    pod_spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(format!(
                "{}={}",
                c["name"].as_str()?,
                c["image"].as_str().unwrap_or_default()
            ))
        })
        .collect()
}

fn annotation<'a>(o: &'a Value, key: &str) -> Option<&'a str> {
    o["metadata"]["annotations"][key].as_str()
}

/// The rollout's state as `kubectl rollout status` reports it: `complete`, `progressing: …`
/// with what is still waiting, `stalled (ProgressDeadlineExceeded)`, or `unknown` for the
/// `OnDelete` update strategy (nothing rolls out until pods are deleted).
fn rollout_state(kind: &str, o: &Value) -> String {
    let status = &o["status"];
    let int = |v: &Value| v.as_i64().unwrap_or(0);
    let generation = int(&o["metadata"]["generation"]);
    let observed = int(&status["observedGeneration"]);
    let strategy = o["spec"]["updateStrategy"]["type"].as_str();
    if kind != "Deployment" && strategy == Some("OnDelete") {
        return "unknown (updateStrategy OnDelete: pods are replaced only when deleted)".into();
    }
    if generation > observed || (kind == "StatefulSet" && observed == 0) {
        return "progressing: the controller has not yet observed the latest spec".into();
    }
    match kind {
        "Deployment" => {
            let stalled = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Progressing" && c["reason"] == "ProgressDeadlineExceeded");
            if stalled {
                return "stalled (ProgressDeadlineExceeded)".into();
            }
            let updated = int(&status["updatedReplicas"]);
            let available = int(&status["availableReplicas"]);
            match o["spec"]["replicas"].as_i64() {
                Some(desired) if updated < desired => {
                    format!("progressing: {updated} of {desired} new replicas updated")
                }
                _ if int(&status["replicas"]) > updated => format!(
                    "progressing: {} old replicas pending termination",
                    int(&status["replicas"]) - updated
                ),
                _ if available < updated => {
                    format!("progressing: {available} of {updated} updated replicas available")
                }
                _ => "complete".into(),
            }
        }
        "StatefulSet" => {
            let desired = o["spec"]["replicas"].as_i64().unwrap_or(1);
            let ready = int(&status["readyReplicas"]);
            let updated = int(&status["updatedReplicas"]);
            let partition = int(&o["spec"]["updateStrategy"]["rollingUpdate"]["partition"]);
            if ready < desired {
                format!("progressing: {ready} of {desired} pods ready")
            } else if partition > 0 {
                if updated < desired - partition {
                    format!(
                        "progressing: partitioned roll out, {updated} of {} new pods updated",
                        desired - partition
                    )
                } else {
                    format!("complete: partitioned roll out, {updated} new pods updated")
                }
            } else if status["updateRevision"] != status["currentRevision"] {
                format!(
                    "progressing: {updated} pods at revision {}",
                    status["updateRevision"].as_str().unwrap_or("?")
                )
            } else {
                "complete".into()
            }
        }
        _ => {
            let desired = int(&status["desiredNumberScheduled"]);
            let updated = int(&status["updatedNumberScheduled"]);
            let available = int(&status["numberAvailable"]);
            if updated < desired {
                format!("progressing: {updated} of {desired} updated pods scheduled")
            } else if available < desired {
                format!("progressing: {available} of {desired} updated pods available")
            } else {
                "complete".into()
            }
        }
    }
}

fn deployment_history(d: &Value, replica_sets: &Value, limit: usize) -> Value {
    let current = annotation(d, "deployment.kubernetes.io/revision").unwrap_or_default();
    let mut revisions: Vec<(i64, Value)> = owned_by(replica_sets, d)
        .map(|rs| {
            let revision = annotation(rs, "deployment.kubernetes.io/revision")
                .and_then(|r| r.parse::<i64>().ok())
                .unwrap_or(0);
            let created = rs["metadata"]["creationTimestamp"].as_str();
            let mut v = json!({
                "revision": revision,
                "replicaSet": rs["metadata"]["name"],
                "images": images(&rs["spec"]["template"]["spec"]),
                "changeCause": annotation(rs, "kubernetes.io/change-cause"),
                "createdAt": created,
                "age": created.and_then(age),
                "replicas": rs["status"]["replicas"].as_i64().unwrap_or(0),
                "current": revision.to_string() == current,
            });
            if let Some(history) = annotation(rs, "deployment.kubernetes.io/revision-history") {
                v["rollback"] = json!(format!(
                    "revision {revision} re-used the pod template of revision(s) {history}: a rollback"
                ));
            }
            (revision, v)
        })
        .collect();
    revisions.sort_by_key(|r| std::cmp::Reverse(r.0));
    let last_change = last_change(d, revisions.first().map(|(_, v)| v));
    revisions.truncate(limit);
    json!({
        "kind": "Deployment",
        "name": d["metadata"]["name"],
        "currentRevision": current.parse::<i64>().ok(),
        "rollout": rollout_state("Deployment", d),
        "replicas": {"desired": d["spec"]["replicas"], "ready": d["status"]["readyReplicas"].as_i64().unwrap_or(0),
            "updated": d["status"]["updatedReplicas"].as_i64().unwrap_or(0)},
        "paused": d["spec"]["paused"].as_bool().unwrap_or(false),
        "lastChange": last_change,
        "revisions": revisions.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    })
}

fn controller_history(kind: &str, o: &Value, list: &Value, limit: usize) -> Value {
    let current = o["status"]["currentRevision"].as_str();
    let update = o["status"]["updateRevision"].as_str();
    let mut revisions: Vec<(i64, Value)> = owned_by(list, o)
        .map(|cr| {
            let revision = cr["revision"].as_i64().unwrap_or(0);
            let name = cr["metadata"]["name"].as_str();
            let created = cr["metadata"]["creationTimestamp"].as_str();
            (
                revision,
                json!({
                    "revision": revision,
                    "controllerRevision": name,
                    "images": images(&cr["data"]["spec"]["template"]["spec"]),
                    "changeCause": annotation(cr, "kubernetes.io/change-cause"),
                    "createdAt": created,
                    "age": created.and_then(age),
                    "current": name.is_some() && (name == current || (current.is_none() && name == update)),
                    "updateTarget": name.is_some() && name == update && update != current,
                }),
            )
        })
        .collect();
    revisions.sort_by_key(|r| std::cmp::Reverse(r.0));
    if kind == "DaemonSet"
        && let Some((_, newest)) = revisions.first_mut()
    {
        // DaemonSets do not name their current revision: the newest one is it.
        newest["current"] = json!(true);
    }
    let last_change = last_change(o, revisions.first().map(|(_, v)| v));
    revisions.truncate(limit);
    json!({
        "kind": kind,
        "name": o["metadata"]["name"],
        "rollout": rollout_state(kind, o),
        "lastChange": last_change,
        "revisions": revisions.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    })
}

/// When the workload last changed: its newest revision, or the latest condition update.
fn last_change(o: &Value, newest: Option<&Value>) -> Option<String> {
    let revision = newest.and_then(|v| v["createdAt"].as_str());
    let condition = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["lastUpdateTime"].as_str())
        .max();
    revision.max(condition).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::rollout_state;
    use serde_json::json;

    #[test]
    fn deployments_follow_kubectl_rollout_status() {
        let d = |status: serde_json::Value| json!({"metadata": {"generation": 3}, "spec": {"replicas": 3}, "status": status});
        let cases = [
            (
                json!({"observedGeneration": 2}),
                "progressing: the controller has not yet observed the latest spec",
            ),
            (
                json!({"observedGeneration": 3, "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]}),
                "stalled (ProgressDeadlineExceeded)",
            ),
            (
                json!({"observedGeneration": 3, "updatedReplicas": 1, "replicas": 4, "availableReplicas": 3}),
                "progressing: 1 of 3 new replicas updated",
            ),
            (
                json!({"observedGeneration": 3, "updatedReplicas": 3, "replicas": 4, "availableReplicas": 3}),
                "progressing: 1 old replicas pending termination",
            ),
            (
                json!({"observedGeneration": 3, "updatedReplicas": 3, "replicas": 3, "availableReplicas": 2}),
                "progressing: 2 of 3 updated replicas available",
            ),
            (
                json!({"observedGeneration": 3, "updatedReplicas": 3, "replicas": 3, "availableReplicas": 3}),
                "complete",
            ),
        ];
        for (status, want) in cases {
            assert_eq!(
                rollout_state("Deployment", &d(status.clone())),
                want,
                "{status}"
            );
        }
    }

    #[test]
    fn statefulsets_and_daemonsets_follow_kubectl_rollout_status() {
        let sts = |spec: serde_json::Value, status: serde_json::Value| json!({"metadata": {"generation": 2}, "spec": spec, "status": status});
        let rolling = json!({"replicas": 3});
        let done = json!({"observedGeneration": 2, "readyReplicas": 3, "updatedReplicas": 3,
            "currentRevision": "web-2", "updateRevision": "web-2"});
        assert_eq!(
            rollout_state("StatefulSet", &sts(rolling.clone(), done)),
            "complete"
        );
        let rolling_out = json!({"observedGeneration": 2, "readyReplicas": 3, "updatedReplicas": 1,
            "currentRevision": "web-1", "updateRevision": "web-2"});
        assert_eq!(
            rollout_state("StatefulSet", &sts(rolling.clone(), rolling_out)),
            "progressing: 1 pods at revision web-2"
        );
        let not_ready = json!({"observedGeneration": 2, "readyReplicas": 1});
        assert_eq!(
            rollout_state("StatefulSet", &sts(rolling, not_ready)),
            "progressing: 1 of 3 pods ready"
        );
        let partitioned = json!({"replicas": 3, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
        let one_updated = json!({"observedGeneration": 2, "readyReplicas": 3, "updatedReplicas": 1,
            "currentRevision": "web-1", "updateRevision": "web-2"});
        assert_eq!(
            rollout_state("StatefulSet", &sts(partitioned, one_updated)),
            "complete: partitioned roll out, 1 new pods updated"
        );
        let on_delete = json!({"updateStrategy": {"type": "OnDelete"}});
        assert!(rollout_state("DaemonSet", &sts(on_delete, json!({}))).starts_with("unknown"));
        for (available, want) in [
            (3, "progressing: 3 of 4 updated pods available"),
            (4, "complete"),
        ] {
            let status = json!({"observedGeneration": 2, "desiredNumberScheduled": 4,
                "updatedNumberScheduled": 4, "numberAvailable": available});
            assert_eq!(rollout_state("DaemonSet", &sts(json!({}), status)), want);
        }
    }
}
