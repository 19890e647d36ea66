//! The Kubernetes tools against a read-only API server with canned answers in the real
//! paths and JSON shapes (`support::canned_api`), through the tool router, and through
//! `kortex serve --kubeconfig` in a chat.

use crate::support::canned_api::{fake_api_server, status};
use crate::support::chat::{open_session, post_message, session_json};
use crate::support::db::{TestDb, sqlite};
use crate::support::fake_api::write_kubeconfig;
use crate::support::manifests::{docs, manifest_dir, policy, provider};
use crate::support::net::{header, serve};
use crate::support::provider::{mock, offered_tools, openai, push, streamed};
use crate::support::server::Server;
use crate::support::tools::{tool_context, tool_policy};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use kortex::llm::ToolCall;
use kortex::metrics::Metrics;
use kortex::tools::{Outcome, Router, ToolContext};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Harness {
    router: Router,
    ctx: ToolContext,
    seen: Arc<Mutex<Vec<String>>>,
    _db: TestDb,
}

impl Harness {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, seen) = fake_api_server().await;
        let config = kube::Config::new(url.parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let mut router = Router::new(Arc::new(Metrics::default()));
        for tool in kortex::tools::cluster::Cluster::new(client).tools() {
            router.add(tool);
        }
        let db = sqlite().await;
        let ctx = tool_context(&db.store, "s").await;
        Self {
            router,
            ctx,
            seen,
            _db: db,
        }
    }

    async fn call(&self, name: &str, input: Value) -> Outcome {
        let call = ToolCall {
            id: format!("c-{name}"),
            name: name.into(),
            input,
        };
        self.router
            .execute(
                self.ctx.clone(),
                &call,
                &tool_policy(json!({})),
                std::future::pending(),
            )
            .await
    }

    async fn json(&self, name: &str, input: Value) -> Value {
        let out = self.call(name, input).await;
        assert!(!out.is_error, "{name}: {out:?}");
        serde_json::from_str(&out.content).unwrap_or_else(|e| panic!("{e}: {}", out.content))
    }

    fn requests(&self, containing: &str) -> Vec<String> {
        self.seen
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|r| r.contains(containing))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_log_lines_never_cost_the_newest_ones() {
    let h = Harness::start().await;
    let args =
        json!({"namespace": "shop", "pod": "chatty-1", "container": "app", "window": "last 2h"});
    let page = h.json("get_logs", args.clone()).await;
    let lines = strings(&page["lines"]);
    // The newest line is there, although 5000 lines of 1 KB exceed the 4 MiB read limit;
    // a page of such lines holds fewer than 100, and the cursor continues.
    assert!(lines.len() > 10 && lines.len() < 100, "{}", lines.len());
    for (i, line) in lines.iter().enumerate() {
        assert!(line.contains(&format!("chatty line {i} ")), "{line}");
    }
    let mut next = args;
    next["cursor"] = page["nextCursor"].clone();
    let page2 = h.json("get_logs", next).await;
    let first = strings(&page2["lines"])
        .first()
        .cloned()
        .unwrap_or_default();
    assert!(
        first.contains(&format!("chatty line {} ", lines.len())),
        "{first}"
    );
    // Bytes that are not UTF-8 do not fail the read.
    assert!(lines[7].contains("latin-1 caf\u{fffd} "), "{}", lines[7]);
    // The read was repeated with fewer lines, and the model is told older ones were left out.
    let sent = h.requests("chatty-1/log?");
    assert_eq!(sent.len(), 4, "two reads a page: {sent:?}");
    assert!(
        sent[0].contains("tailLines=5000") && !sent[1].contains("tailLines=5000"),
        "{sent:?}"
    );
    let notes = strings(&page["notes"]);
    assert!(notes.iter().any(|n| n.contains("most recent")), "{notes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_page_newest_first_with_a_cursor_bound_to_the_query() {
    let h = Harness::start().await;
    let args = json!({"namespace": "shop", "workload": "deployment/checkout", "container": "app", "window": "last 30m"});
    let page1 = h.json("get_logs", args.clone()).await;
    // The workload's selector found both pods, the restarting one first.
    assert_eq!(strings(&page1["pods"]), ["checkout-1", "checkout-2"]);
    let lines = strings(&page1["lines"]);
    assert_eq!(lines.len(), 100);
    // Newest first across pods.
    let times: Vec<jiff::Timestamp> = lines
        .iter()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(times.len(), 100);
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{lines:?}");
    let sent = h.requests("/log?");
    assert!(
        sent.iter().all(|r| r.contains("timestamps=true")
            && r.contains("sinceTime=")
            && r.contains("container=app")),
        "{sent:?}"
    );
    let cursor = page1["nextCursor"].as_str().unwrap_or_default().to_owned();
    assert!(!cursor.is_empty(), "{page1}");

    // Page two continues exactly where page one stopped.
    let mut next = args.clone();
    next["cursor"] = json!(cursor);
    let page2 = h.json("get_logs", next).await;
    let lines2 = strings(&page2["lines"]);
    assert_eq!(lines2.len(), 100);
    assert!(lines2.iter().all(|l| !lines.contains(l)), "no line twice");
    let last1: jiff::Timestamp = lines[99]
        .split(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let first2: jiff::Timestamp = lines2[0]
        .split(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    assert!(first2 <= last1);

    // The cursor cannot be moved to another query or edited.
    let mut other = args.clone();
    other["namespace"] = json!("payments");
    other["cursor"] = json!(cursor);
    let out = h.call("get_logs", other).await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    let mut forged = args.clone();
    forged["cursor"] = json!(format!("00{cursor}"));
    assert_eq!(
        h.call("get_logs", forged).await.error_kind,
        Some("validation")
    );

    // minLevel and filter.
    let errors = h
        .json("get_logs", json!({"namespace": "shop", "pod": "checkout-1", "container": "app", "minLevel": "error", "window": "last 30m"}))
        .await;
    let error_lines = strings(&errors["lines"]);
    assert!(
        !error_lines.is_empty() && error_lines.iter().all(|l| l.contains("db timeout")),
        "{error_lines:?}"
    );
    let filtered = h
        .json("get_logs", json!({"namespace": "shop", "pod": "checkout-1", "filter": "REQUEST 12", "window": "last 30m"}))
        .await;
    let filtered = strings(&filtered["lines"]);
    assert!(
        !filtered.is_empty() && filtered.iter().all(|l| l.contains("request 12")),
        "{filtered:?}"
    );

    // previous: the crashed container's last words.
    let crashed = h
        .json(
            "get_logs",
            json!({"namespace": "shop", "pod": "checkout-1", "container": "app", "previous": true}),
        )
        .await;
    assert!(
        strings(&crashed["lines"])
            .iter()
            .any(|l| l.contains("panic: assignment to entry in nil map"))
    );
    assert!(h.requests("previous=true").len() == 1);

    // Bad arguments name the problem.
    for (bad, needle) in [
        (
            json!({"namespace": "shop"}),
            "exactly one of pod, workload or selector",
        ),
        (
            json!({"namespace": "shop", "pod": "checkout-1", "container": "nope"}),
            "its containers: app, proxy",
        ),
        (
            json!({"namespace": "shop", "pod": "checkout-1", "window": "since tuesday"}),
            "ISO 8601",
        ),
    ] {
        let out = h.call("get_logs", bad).await;
        assert_eq!(out.error_kind, Some("validation"), "{out:?}");
        assert!(out.content.contains(needle), "{}", out.content);
    }
    let out = h
        .call("get_logs", json!({"namespace": "shop", "pod": "ghost"}))
        .await;
    assert_eq!(out.error_kind, Some("upstream"));
    assert!(out.content.contains("not found"), "{}", out.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resources_and_rollout_history() {
    let h = Harness::start().await;
    let events = h
        .json(
            "get_events",
            json!({"namespace": "shop", "kind": "pod", "name": "checkout-1"}),
        )
        .await;
    let sent = h.requests("/events");
    assert!(
        sent.iter().any(|r| r.contains(
            "fieldSelector=involvedObject.name%3Dcheckout-1%2CinvolvedObject.kind%3DPod"
        )),
        "{sent:?}"
    );
    let reasons: Vec<&str> = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(
        reasons,
        ["BackOff", "OOMKilling", "Pulled"],
        "warnings first, newest first"
    );
    assert_eq!(events["warnings"], 2);
    assert_eq!(events["events"][0]["count"], 12);
    let recent = h
        .json(
            "get_events",
            json!({"namespace": "shop", "window": "last 30m"}),
        )
        .await;
    assert_eq!(recent["total"], 2, "{recent}");
    // A custom kind's short name selects the events of its Kind.
    h.json(
        "get_events",
        json!({"namespace": "shop", "kind": "certs", "name": "web"}),
    )
    .await;
    let sent = h.requests("/events");
    assert!(
        sent.iter().any(|r| r.contains(
            "fieldSelector=involvedObject.name%3Dweb%2CinvolvedObject.kind%3DCertificate"
        )),
        "{sent:?}"
    );

    // A Secret never shows its values, whatever the RBAC lets Kortex read.
    for (tool, input) in [
        (
            "get_resource",
            json!({"kind": "Secret", "namespace": "shop", "name": "db"}),
        ),
        (
            "list_resources",
            json!({"kind": "secrets", "namespace": "shop"}),
        ),
        (
            "list_resources",
            json!({"kind": "secrets", "namespace": "shop", "full": true}),
        ),
    ] {
        let out = h.call(tool, input).await;
        assert!(!out.is_error, "{out:?}");
        for leak in ["aHVudGVyMi1wbGFpbg", "hunter2", "last-applied"] {
            assert!(
                !out.content.contains(leak),
                "{tool} leaked {leak}: {}",
                out.content
            );
        }
        assert!(
            out.content.contains("password"),
            "key names stay: {}",
            out.content
        );
    }

    // Pods summarised; managedFields gone from whole objects.
    let pods = h
        .json(
            "list_resources",
            json!({"kind": "po", "namespace": "shop", "labelSelector": "app=checkout"}),
        )
        .await;
    let first = &pods["items"][1];
    assert_eq!(first["name"], "checkout-1");
    assert_eq!(first["restarts"], 4);
    assert_eq!(first["ready"], "1/2");
    assert!(
        first["lastTermination"].to_string().contains("OOMKilled"),
        "{first}"
    );
    let pod = h
        .json(
            "get_resource",
            json!({"kind": "Pod", "namespace": "shop", "name": "checkout-1"}),
        )
        .await;
    assert!(pod["metadata"].get("managedFields").is_none());
    assert_eq!(pod["spec"]["nodeName"], "node-a");

    // Continue tokens travel inside a signed cursor.
    let page1 = h
        .json(
            "list_resources",
            json!({"kind": "ConfigMap", "namespace": "shop", "limit": 1}),
        )
        .await;
    assert_eq!(page1["items"][0]["name"], "cm-a");
    let cursor = page1["nextCursor"].as_str().unwrap_or_default();
    assert!(
        !cursor.contains("page2"),
        "the API server's token is not exposed raw"
    );
    let page2 = h
        .json(
            "list_resources",
            json!({"kind": "ConfigMap", "namespace": "shop", "limit": 1, "cursor": cursor}),
        )
        .await;
    assert_eq!(page2["items"][0]["name"], "cm-b");
    assert_eq!(page2["nextCursor"], Value::Null);

    // Custom resources through discovery; RBAC refusals are denied results.
    let cert = h
        .json(
            "get_resource",
            json!({"kind": "certificate", "namespace": "shop", "name": "web"}),
        )
        .await;
    assert_eq!(cert["status"]["conditions"][0]["reason"], "Expired");
    let out = h.call("list_resources", json!({"kind": "Node"})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    assert!(out.content.contains("forbidden"), "{}", out.content);
    let out = h
        .call(
            "get_resource",
            json!({"kind": "Widget", "name": "w", "namespace": "shop"}),
        )
        .await;
    assert_eq!(out.error_kind, Some("validation"));
    let out = h
        .call(
            "get_resource",
            json!({"kind": "Deployment", "name": "checkout"}),
        )
        .await;
    assert!(out.content.contains("give namespace"), "{}", out.content);

    // Rollout history: revisions newest first, the change cause, the rollback.
    let history = h
        .json("get_recent_deploys", json!({"namespace": "shop"}))
        .await;
    let checkout = &history["workloads"][0];
    assert_eq!(checkout["name"], "checkout");
    assert_eq!(checkout["currentRevision"], 3);
    assert_eq!(
        checkout["rollout"],
        "progressing: 1 of 2 updated replicas available"
    );
    let revisions = checkout["revisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        revisions.len(),
        2,
        "only the Deployment's own ReplicaSets: {checkout}"
    );
    assert_eq!(revisions[0]["revision"], 3);
    assert_eq!(revisions[0]["current"], true);
    assert_eq!(strings(&revisions[0]["images"]), ["app=shop/checkout:2.2"]);
    assert!(
        revisions[0]["rollback"]
            .as_str()
            .unwrap_or_default()
            .contains("revision(s) 1")
    );
    assert_eq!(revisions[1]["changeCause"], "release 2.3");
}

/// `kortex serve --kubeconfig` offers the Kubernetes tools, and a model paging through a
/// crashing pod's logs gets them in the chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_kubeconfig_lets_the_model_read_the_cluster() {
    let (api, _) = fake_api_server().await;
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    let kubeconfig = write_kubeconfig(dir.path(), &api);
    std::fs::write(
        m.join("k.yaml"),
        docs(&[
            provider(
                "openai",
                &format!("type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1"),
            ),
            policy("all", "sessions: ['*'], provider: openai"),
        ]),
    )
    .unwrap();
    let server = Server::start_on_cluster(&m, dir.path(), &kubeconfig);
    let d = openai();
    push(
        &script,
        streamed(
            &d,
            (d.tools_stream)(&[(
                "t1",
                "get_logs",
                r#"{"namespace": "shop", "pod": "checkout-1", "container": "app", "minLevel": "error"}"#,
            )]),
        ),
    );
    push(
        &script,
        streamed(&d, (d.text_stream)(&["The database times out."])),
    );
    let id = open_session(&server, json!({"name": "incident-logs"})).await;
    let r = post_message(&server, &id, "why is checkout crashing?").await;
    assert_eq!(r.status().as_u16(), 202);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let tool_message = loop {
        let s = session_json(&server, &id).await;
        let messages = s["messages"].as_array().cloned().unwrap_or_default();
        if messages
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"] == "The database times out.")
        {
            break messages.into_iter().find(|m| m["role"] == "tool");
        }
        assert!(tokio::time::Instant::now() < deadline, "no answer: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let content = tool_message
        .map(|m| m["content"].to_string())
        .unwrap_or_default();
    assert!(content.contains("db timeout"), "{content}");
    // The model was offered the Kubernetes tools.
    let offered = offered_tools(&script);
    for tool in [
        "get_logs",
        "get_events",
        "get_resource",
        "list_resources",
        "get_recent_deploys",
        "get_admin_info",
    ] {
        assert!(offered.contains(tool), "{tool} offered: {offered}");
    }
    assert!(server.terminate().success());
}

/// A kube client of `url` that authenticates with `token` (none: Kortex's own).
fn kube_client(url: &str, token: Option<&str>) -> kube::Client {
    let mut config = kube::Config::new(url.parse().unwrap());
    if let Some(token) = token {
        config.headers.push((
            axum::http::header::AUTHORIZATION,
            axum::http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        ));
    }
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_info_reads_only_a_services_admin_endpoint_the_caller_may_see() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let reads: Arc<Mutex<usize>> = Arc::default();
    let counted = reads.clone();
    let app = axum::Router::new()
        .route(
            "/admin/info",
            axum::routing::get(move || {
                if let Ok(mut n) = counted.lock() {
                    *n += 1;
                }
                async {
                    axum::Json(
                        json!({"version": "2.3.0", "build": "abc123", "features": {"newCheckout": true}}),
                    )
                }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page") });
    let url = serve(app).await;
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{url}"));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // The API server: Kortex (no token) and alice may read Services in shop, bob may not.
    let api = axum::Router::new().fallback(move |req: Request<Body>| async move {
        let token = header(req.headers(), "authorization");
        if token == "Bearer bob-token" {
            return status(403, "services is forbidden: User \"bob\" cannot get resource \"services\" in API group \"\" in the namespace \"shop\"").into_response();
        }
        let service = |ports: &[u16]| {
            let ports: Vec<Value> = ports.iter().map(|p| json!({"port": p})).collect();
            json!({"apiVersion": "v1", "kind": "Service", "spec": {"type": "ClusterIP", "ports": ports}})
        };
        match req.uri().path() {
            "/api/v1/namespaces/shop/services/checkout" => axum::Json(service(&[port])).into_response(),
            "/api/v1/namespaces/shop/services/multi" => axum::Json(service(&[8080, 9090])).into_response(),
            "/api/v1/namespaces/shop/services/down" => axum::Json(service(&[9])).into_response(),
            "/api/v1/namespaces/shop/services/outside" => axum::Json(json!({"apiVersion": "v1", "kind": "Service",
                "spec": {"type": "ExternalName", "externalName": "checkout.shop.svc.cluster.local"}})).into_response(),
            _ => status(404, "services \"ghost\" not found").into_response(),
        }
    });
    let api = serve(api).await;
    // The Service's DNS name resolves to the local server, as cluster DNS would.
    let client = reqwest::Client::builder()
        .resolve("checkout.shop.svc.cluster.local", addr)
        .resolve(
            "down.shop.svc.cluster.local",
            std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        )
        .build()
        .unwrap();
    let mut router = Router::new(Arc::new(Metrics::default()));
    router.add(Arc::new(kortex::tools::admin_info::AdminInfo::new(
        kortex::tools::cluster::Cluster::new(kube_client(&api, None)),
        client,
        "cluster.local",
    )));
    let db = sqlite().await;
    let kortex_ctx = tool_context(&db.store, "s").await;
    let as_user = |token: &str| {
        let mut ctx = kortex_ctx.clone();
        ctx.kube = kortex::tools::KubeIdentity::User(kube_client(&api, Some(token)));
        ctx
    };
    let call = |ctx: ToolContext, input: Value| {
        let router = &router;
        async move {
            router
                .execute(
                    ctx,
                    &ToolCall {
                        id: "a".into(),
                        name: "get_admin_info".into(),
                        input,
                    },
                    &tool_policy(json!({})),
                    std::future::pending(),
                )
                .await
        }
    };
    let reads_so_far = || reads.lock().map(|n| *n).unwrap_or_default();
    // The Service's only port is the default.
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "checkout"}),
    )
    .await;
    assert!(!out.is_error, "{out:?}");
    let v: Value = serde_json::from_str(&out.content).unwrap_or_default();
    assert_eq!(v["info"]["version"], "2.3.0");
    assert_eq!(
        v["url"],
        format!("http://checkout.shop.svc.cluster.local:{port}/admin/info")
    );
    assert_eq!(reads_so_far(), 1);
    // Only DNS labels: no way to point it at another host or path.
    for bad in [
        json!({"namespace": "shop", "service": "evil.example.com/x"}),
        json!({"namespace": "shop#", "service": "checkout"}),
        json!({"namespace": "shop", "service": "checkout", "path": "/debug"}),
    ] {
        let out = call(kortex_ctx.clone(), bad).await;
        assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    }
    // Only a port the Service declares; no default among several ports but 80.
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "checkout", "port": 22}),
    )
    .await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    assert!(out.content.contains(&format!("[{port}]")), "{out:?}");
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "multi"}),
    )
    .await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    assert!(out.content.contains("8080, 9090"), "{out:?}");
    // A name that is not a Service is refused before any connection.
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "ghost"}),
    )
    .await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    assert!(out.content.contains("no Service shop/ghost"), "{out:?}");
    // An ExternalName Service points outside the cluster: refused.
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "outside"}),
    )
    .await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    // A Service with nothing listening is an upstream error, not a crash.
    let out = call(
        kortex_ctx.clone(),
        json!({"namespace": "shop", "service": "down"}),
    )
    .await;
    assert_eq!(out.error_kind, Some("upstream"), "{out:?}");
    assert_eq!(reads_so_far(), 1);

    // With runToolsAsUser the Service is read as the user: alice may, bob may not, and
    // bob's call never reaches the admin endpoint.
    let out = call(
        as_user("alice-token"),
        json!({"namespace": "shop", "service": "checkout"}),
    )
    .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(reads_so_far(), 2);
    let out = call(
        as_user("bob-token"),
        json!({"namespace": "shop", "service": "checkout"}),
    )
    .await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    assert!(out.content.contains("cannot get resource"), "{out:?}");
    let mut missing = kortex_ctx.clone();
    missing.kube = kortex::tools::KubeIdentity::Missing("signed in with an API key".into());
    let out = call(missing, json!({"namespace": "shop", "service": "checkout"})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    assert_eq!(reads_so_far(), 2, "refused calls never reach the Service");
}
