//! `get_events`, `get_resource`, `list_resources`.

use super::{Cluster, ClusterTool, ToolError, age, q, required, sanitize, seg};
use crate::llm::ToolSpec;
use crate::tools::window;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// `get_events`.
pub struct GetEvents;

impl ClusterTool for GetEvents {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_events".into(),
            description: "Kubernetes Events of a namespace, or of one object in it (give kind and name, e.g. Pod checkout-7d9f-x2x, Deployment checkout), Warnings first, then the most recent. Events show scheduling failures, image pull errors, OOM kills, failed probes, evictions and scaling.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                    "kind": {"type": "string", "minLength": 1, "maxLength": 63, "description": "Kind of the object, e.g. Pod."},
                    "name": {"type": "string", "minLength": 1, "maxLength": 253, "description": "Name of the object."},
                    "window": {"type": "string", "maxLength": 100, "description": format!("Only events last seen in this window (default: all retained events). {}", window::WINDOW_HELP)},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}
                },
                "required": ["namespace"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(cluster: Arc<Cluster>, input: Value) -> Result<String, ToolError> {
        let namespace = required(&input, "namespace")?;
        let mut fields = Vec::new();
        if let Some(name) = input["name"].as_str() {
            fields.push(format!("involvedObject.name={name}"));
        }
        if let Some(kind) = input["kind"].as_str() {
            // `deploy`, `certs`, `Certificate`: events name the kind as written in the
            // object; a kind the cluster does not serve is matched as given.
            let kind = match cluster.resolve(kind, None).await {
                Ok(k) => k.kind,
                Err(_) => kind.to_owned(),
            };
            fields.push(format!("involvedObject.kind={kind}"));
        }
        let mut path = format!("/api/v1/namespaces/{}/events", seg(namespace));
        if !fields.is_empty() {
            path.push_str(&format!("?fieldSelector={}", q(&fields.join(","))));
        }
        let list = cluster.get_json(&path).await?;
        let window = match input["window"].as_str() {
            Some(w) => {
                Some(window::parse(w, jiff::Timestamp::now()).map_err(ToolError::Validation)?)
            }
            None => None,
        };
        let mut events: Vec<Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(event_view)
            .filter(|e| {
                window.is_none_or(|w| {
                    e["lastSeen"]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .is_some_and(|t| t >= w.start && t < w.end)
                })
            })
            .collect();
        // Timestamps are compared as times: RFC 3339 strings with and without fractions
        // do not sort as text.
        let seen = |e: &Value| {
            e["lastSeen"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        };
        events.sort_by(|a, b| {
            let warning = |e: &Value| e["type"] == "Warning";
            warning(b)
                .cmp(&warning(a))
                .then_with(|| seen(b).cmp(&seen(a)))
        });
        let total = events.len();
        let warnings = events.iter().filter(|e| e["type"] == "Warning").count();
        let limit = input["limit"].as_u64().unwrap_or(50) as usize;
        events.truncate(limit);
        let mut out = json!({
            "namespace": namespace,
            "total": total,
            "warnings": warnings,
            "shown": events.len(),
            "events": events,
        });
        if total == 0 {
            out["note"] = json!("no events (Kubernetes keeps events for about an hour by default)");
        }
        Ok(out.to_string())
    }
}

/// The fields of an Event (core/v1) worth showing.
fn event_view(e: &Value) -> Value {
    let last = e["lastTimestamp"]
        .as_str()
        .or_else(|| e["series"]["lastObservedTime"].as_str())
        .or_else(|| e["eventTime"].as_str())
        .or_else(|| e["metadata"]["creationTimestamp"].as_str());
    let first = e["firstTimestamp"]
        .as_str()
        .or_else(|| e["eventTime"].as_str());
    let count = e["count"]
        .as_i64()
        .or_else(|| e["series"]["count"].as_i64())
        .unwrap_or(1);
    let source = e["source"]["component"]
        .as_str()
        .or_else(|| e["reportingComponent"].as_str())
        .filter(|s| !s.is_empty());
    json!({
        "type": e["type"],
        "reason": e["reason"],
        "object": format!("{}/{}", e["involvedObject"]["kind"].as_str().unwrap_or_default(), e["involvedObject"]["name"].as_str().unwrap_or_default()),
        "message": e["message"],
        "count": count,
        "firstSeen": first,
        "lastSeen": last,
        "source": source,
    })
}

/// `get_resource`.
pub struct GetResource;

impl ClusterTool for GetResource {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_resource".into(),
            description: "Read one Kubernetes object (any kind you may read: Pod, Deployment, Service, ConfigMap, Node, HorizontalPodAutoscaler, custom resources with apiVersion…), without managedFields. Secret values are never shown (only their key names).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "minLength": 1, "maxLength": 100, "description": "Kind, plural or short name: Deployment, deployments, deploy."},
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63, "description": "Required for namespaced kinds."},
                    "apiVersion": {"type": "string", "maxLength": 253, "description": "Needed only to pick among kinds of the same name, e.g. cert-manager.io/v1."}
                },
                "required": ["kind", "name"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(cluster: Arc<Cluster>, input: Value) -> Result<String, ToolError> {
        let kind = cluster
            .resolve(required(&input, "kind")?, input["apiVersion"].as_str())
            .await?;
        let name = required(&input, "name")?;
        let namespace = input["namespace"].as_str();
        if kind.namespaced && namespace.is_none() {
            return Err(ToolError::Validation(format!(
                "{} is namespaced: give namespace",
                kind.kind
            )));
        }
        let mut object = cluster
            .get_json(&format!("{}/{}", kind.path(namespace), seg(name)))
            .await?;
        if object.get("kind").is_none() {
            object["kind"] = json!(kind.kind);
        }
        sanitize(&mut object);
        Ok(object.to_string())
    }
}

/// Where a listing continues.
#[derive(Serialize, Deserialize)]
struct Continue {
    token: String,
}

/// `list_resources`.
pub struct ListResources;

impl ClusterTool for ListResources {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_resources".into(),
            description: "List Kubernetes objects of one kind (in a namespace, or in all namespaces when namespace is left out), optionally by label or field selector. Each item is summarised (status, readiness, restarts, replicas, images, conditions); set full: true for whole objects (without managedFields; Secret values are never shown). Pass nextCursor back as cursor for the next page.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "minLength": 1, "maxLength": 100},
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                    "apiVersion": {"type": "string", "maxLength": 253},
                    "labelSelector": {"type": "string", "maxLength": 1024, "description": "e.g. app=checkout,tier!=canary"},
                    "fieldSelector": {"type": "string", "maxLength": 1024, "description": "e.g. status.phase!=Running"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                    "full": {"type": "boolean", "default": false},
                    "cursor": {"type": "string", "maxLength": 8192}
                },
                "required": ["kind"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(cluster: Arc<Cluster>, input: Value) -> Result<String, ToolError> {
        let kind = cluster
            .resolve(required(&input, "kind")?, input["apiVersion"].as_str())
            .await?;
        let limit = input["limit"].as_u64().unwrap_or(50).clamp(1, 500);
        let mut params = vec![format!("limit={limit}")];
        for (arg, param) in [
            ("labelSelector", "labelSelector"),
            ("fieldSelector", "fieldSelector"),
        ] {
            if let Some(v) = input[arg].as_str().filter(|s| !s.is_empty()) {
                params.push(format!("{param}={}", q(v)));
            }
        }
        if let Some(c) = input["cursor"].as_str() {
            let position: Continue = cluster.cursors.open("list_resources", &input, c)?;
            params.push(format!("continue={}", q(&position.token)));
        }
        let namespace = input["namespace"].as_str();
        let path = format!("{}?{}", kind.path(namespace), params.join("&"));
        let mut list = cluster.get_json(&path).await?;
        list["kind"] = json!(format!("{}List", kind.kind));
        sanitize(&mut list);
        let full = input["full"].as_bool().unwrap_or(false);
        let items: Vec<Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                if full {
                    item.clone()
                } else {
                    summary(&kind.kind, item)
                }
            })
            .collect();
        let next = list["metadata"]["continue"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(|token| {
                cluster.cursors.sign(
                    "list_resources",
                    &input,
                    &Continue {
                        token: token.to_owned(),
                    },
                )
            });
        let remaining = list["metadata"]["remainingItemCount"].as_i64();
        Ok(json!({
            "kind": kind.kind,
            "apiVersion": kind.api_version(),
            "namespace": namespace,
            "count": items.len(),
            "items": items,
            "remainingItemCount": remaining,
            "nextCursor": next,
        })
        .to_string())
    }
}

/// A compact view of an object: identity, age and what its kind's status says.
// Long because a match over workload kinds, each arm the status fields that kind says.
fn summary(kind: &str, o: &Value) -> Value {
    let meta = &o["metadata"];
    let mut s = json!({
        "name": meta["name"],
        "age": meta["creationTimestamp"].as_str().and_then(age),
    });
    if let Some(ns) = meta["namespace"].as_str() {
        s["namespace"] = json!(ns);
    }
    let status = &o["status"];
    let spec = &o["spec"];
    let images = |template: &Value| -> Vec<String> {
        template["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["image"].as_str().map(str::to_owned))
            .collect()
    };
    match kind {
        "Pod" => {
            let statuses = status["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            let waiting: Vec<String> = statuses
                .iter()
                .filter_map(|c| {
                    let reason = c["state"]["waiting"]["reason"]
                        .as_str()
                        .or_else(|| c["state"]["terminated"]["reason"].as_str())?;
                    Some(format!(
                        "{}: {reason}",
                        c["name"].as_str().unwrap_or_default()
                    ))
                })
                .collect();
            let last_termination: Vec<String> = statuses
                .iter()
                .filter_map(|c| {
                    let t = &c["lastState"]["terminated"];
                    let reason = t["reason"].as_str()?;
                    Some(format!(
                        "{}: {reason} (exit {})",
                        c["name"].as_str().unwrap_or_default(),
                        t["exitCode"]
                    ))
                })
                .collect();
            s["phase"] = status["phase"].clone();
            s["ready"] = json!(format!("{ready}/{}", statuses.len()));
            s["restarts"] = json!(restarts);
            s["node"] = spec["nodeName"].clone();
            if !waiting.is_empty() {
                s["containers"] = json!(waiting);
            }
            if !last_termination.is_empty() {
                s["lastTermination"] = json!(last_termination);
            }
        }
        "Deployment" | "StatefulSet" | "ReplicaSet" => {
            s["replicas"] = json!({
                "desired": spec["replicas"],
                "ready": status["readyReplicas"].as_i64().unwrap_or(0),
                "updated": status["updatedReplicas"].as_i64().unwrap_or(0),
                "available": status["availableReplicas"].as_i64().unwrap_or(0),
            });
            s["images"] = json!(images(&spec["template"]));
        }
        "DaemonSet" => {
            s["pods"] = json!({
                "desired": status["desiredNumberScheduled"],
                "ready": status["numberReady"],
                "updated": status["updatedNumberScheduled"],
                "unavailable": status["numberUnavailable"].as_i64().unwrap_or(0),
            });
            s["images"] = json!(images(&spec["template"]));
        }
        "Job" => {
            s["active"] = json!(status["active"].as_i64().unwrap_or(0));
            s["succeeded"] = json!(status["succeeded"].as_i64().unwrap_or(0));
            s["failed"] = json!(status["failed"].as_i64().unwrap_or(0));
        }
        "CronJob" => {
            s["schedule"] = spec["schedule"].clone();
            s["suspend"] = json!(spec["suspend"].as_bool().unwrap_or(false));
            s["lastScheduleTime"] = status["lastScheduleTime"].clone();
        }
        "Service" => {
            s["type"] = spec["type"].clone();
            s["clusterIP"] = spec["clusterIP"].clone();
            s["ports"] = json!(
                spec["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                    .collect::<Vec<_>>()
            );
        }
        "Node" => {
            s["version"] = status["nodeInfo"]["kubeletVersion"].clone();
            s["unschedulable"] = json!(spec["unschedulable"].as_bool().unwrap_or(false));
        }
        "Secret" => {
            s["type"] = o["type"].clone();
            s["keys"] = json!(
                o["dataKeys"]
                    .as_object()
                    .map(|m| m.keys().cloned().collect::<Vec<_>>())
                    .unwrap_or_default()
            );
        }
        _ => {}
    }
    let conditions: Vec<String> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let t = c["type"].as_str()?;
            let st = c["status"].as_str().unwrap_or_default();
            Some(match c["reason"].as_str() {
                Some(r) if !r.is_empty() => format!("{t}={st} ({r})"),
                _ => format!("{t}={st}"),
            })
        })
        .collect();
    if !conditions.is_empty() {
        s["conditions"] = json!(conditions);
    }
    s
}
