//! A read-only Kubernetes API server on 127.0.0.1 with canned answers in the real paths
//! and JSON shapes: a shop whose checkout pod crashes (pods, logs with timestamps, events,
//! ReplicaSets, ControllerRevisions, Secrets, discovery, continue tokens, 403 Status
//! objects). It records every request.

use crate::support::net::serve;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Lines of checkout-1/app: one every 5 s up to now, every 10th an error.
const LINES: i64 = 250;

fn ts(secs_ago: i64) -> String {
    let t = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(secs_ago);
    t.to_string()
}

fn pod(name: &str, restarts: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "checkout"}, "creationTimestamp": ts(3600),
            "managedFields": [{"manager": "kubelet"}]},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "shop/checkout:2.3"}, {"name": "proxy", "image": "envoy:1.30"}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "app", "ready": false, "restartCount": restarts,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}},
            {"name": "proxy", "ready": true, "restartCount": 0, "state": {"running": {}}}]}})
}

/// Log text of a container, oldest first, honouring sinceTime and tailLines.
fn logs(pod: &str, container: &str, query: &str) -> String {
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .map(|v| v.replace("%3A", ":"))
    };
    if param("previous").as_deref() == Some("true") {
        return format!(
            "{} panic: assignment to entry in nil map\n{} \tgoroutine 1 [running]:\n",
            ts(700),
            ts(700)
        );
    }
    let since: Option<jiff::Timestamp> = param("sinceTime").and_then(|s| s.parse().ok());
    let mut lines: Vec<String> = (0..LINES)
        .rev()
        .map(|i| {
            let message = if container == "proxy" {
                format!("[info] proxy heartbeat {i}")
            } else if i % 10 == 0 {
                format!(r#"{{"level":"error","msg":"db timeout {i} on {pod}"}}"#)
            } else {
                format!("INFO request {i} served")
            };
            (i * 5, message)
        })
        .filter(|(ago, _)| {
            since
                .is_none_or(|s| jiff::Timestamp::now() - jiff::SignedDuration::from_secs(*ago) >= s)
        })
        .map(|(ago, m)| format!("{} {m}", ts(ago)))
        .collect();
    if let Some(tail) = param("tailLines").and_then(|t| t.parse::<usize>().ok()) {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    lines.join("\n") + "\n"
}

/// Pod `chatty-1`'s `app` container: 6000 lines of about 1 KB, one a second, the newest
/// numbered 0, one of them not UTF-8; kubelet semantics: `limitBytes` counts from
/// the start of the `tailLines` selected.
fn chatty_logs(query: &str) -> Vec<u8> {
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let mut lines: Vec<Vec<u8>> = (0..6000)
        .rev()
        .map(|i| {
            let mut line = format!("{} INFO chatty line {i} ", ts(i + 1)).into_bytes();
            if i == 7 {
                line.extend_from_slice(b"latin-1 caf\xe9 ");
            }
            line.extend(std::iter::repeat_n(b'x', 1000));
            line.push(b'\n');
            line
        })
        .collect();
    if let Some(tail) = param("tailLines") {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    let mut body = lines.concat();
    if let Some(limit) = param("limitBytes") {
        body.truncate(limit);
    }
    body
}

pub fn status(code: u16, message: &str) -> (StatusCode, String) {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": if code == 403 { "Forbidden" } else { "NotFound" }, "code": code})
        .to_string(),
    )
}

fn answer(path: &str, query: &str) -> (StatusCode, String) {
    let ok = |v: Value| (StatusCode::OK, v.to_string());
    let rs = |name: &str, revision: &str, image: &str, history: Option<&str>, ago: i64| {
        let mut annotations = json!({"deployment.kubernetes.io/revision": revision});
        if let Some(h) = history {
            annotations["deployment.kubernetes.io/revision-history"] = json!(h);
        }
        if revision == "2" {
            annotations["kubernetes.io/change-cause"] = json!("release 2.3");
        }
        json!({"metadata": {"name": name, "namespace": "shop", "creationTimestamp": ts(ago), "annotations": annotations,
                "ownerReferences": [{"kind": "Deployment", "name": "checkout", "uid": "d-uid", "controller": true}]},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}},
            "status": {"replicas": if revision == "3" { 2 } else { 0 }}})
    };
    match path {
        "/api/v1/namespaces/shop/pods/checkout-1" => ok(pod("checkout-1", 4)),
        "/api/v1/namespaces/shop/pods/chatty-1" => ok(pod("chatty-1", 0)),
        "/api/v1/namespaces/shop/pods" if query.contains("labelSelector=app%3Dcheckout") => ok(
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                "items": [pod("checkout-2", 0), pod("checkout-1", 4)]}),
        ),
        p if p.starts_with("/api/v1/namespaces/shop/pods/") && p.ends_with("/log") => {
            let pod = p.split('/').nth(6).unwrap_or_default();
            let container = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("container="))
                .unwrap_or_default();
            (StatusCode::OK, logs(pod, container, query))
        }
        "/apis/apps/v1/namespaces/shop/deployments/checkout" => ok(deployment()),
        "/apis/apps/v1/namespaces/shop/deployments" => {
            ok(json!({"kind": "DeploymentList", "metadata": {}, "items": [deployment()]}))
        }
        "/apis/apps/v1/namespaces/shop/statefulsets"
        | "/apis/apps/v1/namespaces/shop/daemonsets" => ok(json!({"metadata": {}, "items": []})),
        "/apis/apps/v1/namespaces/shop/replicasets" => {
            ok(json!({"kind": "ReplicaSetList", "metadata": {}, "items": [
                rs("checkout-5d8f", "3", "shop/checkout:2.2", Some("1"), 86_400),
                rs("checkout-6c9a", "2", "shop/checkout:2.3", None, 1800),
                rs("other-1", "1", "shop/other:1", None, 100)
                    .as_object().map(|o| { let mut o = o.clone(); o["metadata"]["ownerReferences"][0]["uid"] = json!("x"); Value::Object(o) }).unwrap_or_default(),
            ]}))
        }
        "/api/v1/namespaces/shop/events" => {
            ok(json!({"kind": "EventList", "metadata": {}, "items": [
                {"type": "Normal", "reason": "Pulled", "message": "Container image pulled", "count": 3,
                 "involvedObject": {"kind": "Pod", "name": "checkout-1"}, "lastTimestamp": ts(60), "firstTimestamp": ts(900), "source": {"component": "kubelet"}},
                {"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container app", "count": 12,
                 "involvedObject": {"kind": "Pod", "name": "checkout-1"}, "lastTimestamp": ts(120), "firstTimestamp": ts(800), "source": {"component": "kubelet"}},
                {"type": "Warning", "reason": "OOMKilling", "message": "Memory cgroup out of memory", "count": 1,
                 "involvedObject": {"kind": "Pod", "name": "checkout-1"}, "eventTime": ts(7200), "reportingComponent": "kernel-monitor"}
            ]}))
        }
        "/api/v1/namespaces/shop/secrets/db" => ok(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "namespace": "shop", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"stringData\":{\"password\":\"hunter2-plain\"}}"}},
            "type": "Opaque", "data": {"password": "aHVudGVyMi1wbGFpbg=="}})),
        "/api/v1/namespaces/shop/secrets" => ok(
            json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {},
            "items": [{"metadata": {"name": "db", "namespace": "shop", "creationTimestamp": ts(50)}, "type": "Opaque",
                "data": {"password": "aHVudGVyMi1wbGFpbg=="}}]}),
        ),
        "/api/v1/namespaces/shop/configmaps" => {
            if query.contains("continue=page2") {
                ok(
                    json!({"kind": "ConfigMapList", "metadata": {}, "items": [{"metadata": {"name": "cm-b", "namespace": "shop"}}]}),
                )
            } else {
                ok(
                    json!({"kind": "ConfigMapList", "metadata": {"continue": "page2", "remainingItemCount": 1},
                    "items": [{"metadata": {"name": "cm-a", "namespace": "shop"}}]}),
                )
            }
        }
        "/api/v1/nodes" => status(
            403,
            "nodes is forbidden: User \"system:serviceaccount:kortex:kortex\" cannot list resource \"nodes\"",
        ),
        "/apis" => ok(json!({"kind": "APIGroupList", "groups": [
            {"name": "cert-manager.io", "versions": [{"groupVersion": "cert-manager.io/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "cert-manager.io/v1", "version": "v1"}}]})),
        "/api/v1" => ok(
            json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "pods", "namespaced": true, "kind": "Pod", "verbs": ["get", "list"]}]}),
        ),
        "/apis/cert-manager.io/v1" => ok(
            json!({"kind": "APIResourceList", "groupVersion": "cert-manager.io/v1", "resources": [
            {"name": "certificates", "singularName": "certificate", "namespaced": true, "kind": "Certificate",
             "shortNames": ["cert", "certs"], "verbs": ["get", "list", "watch"]},
            {"name": "certificates/status", "namespaced": true, "kind": "Certificate", "verbs": ["get"]}]}),
        ),
        "/apis/cert-manager.io/v1/namespaces/shop/certificates/web" => {
            ok(json!({"apiVersion": "cert-manager.io/v1",
            "kind": "Certificate", "metadata": {"name": "web", "namespace": "shop"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Expired"}]}}))
        }
        _ => status(
            404,
            &format!("the server could not find the requested resource ({path})"),
        ),
    }
}

fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "checkout", "namespace": "shop", "uid": "d-uid", "generation": 4,
            "annotations": {"deployment.kubernetes.io/revision": "3"}, "creationTimestamp": ts(90_000)},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "checkout"}},
            "template": {"spec": {"containers": [{"name": "app", "image": "shop/checkout:2.2"}]}}},
        "status": {"observedGeneration": 4, "replicas": 2, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "lastUpdateTime": ts(600)}]}})
}

/// The fake API server; returns its URL and the requests it saw (path?query).
pub async fn fake_api_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let record = record.clone();
        async move {
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            if let Ok(mut s) = record.lock() {
                s.push(format!("{} {path}?{query}", req.method()));
            }
            if req.method() != axum::http::Method::GET {
                return status(405, "read-only fake").into_response();
            }
            if path == "/api/v1/namespaces/shop/pods/chatty-1/log"
                && query.contains("container=app")
            {
                return (StatusCode::OK, chatty_logs(&query)).into_response();
            }
            answer(&path, &query).into_response()
        }
    });
    (serve(app).await, seen)
}
