//! Configuration changes among many objects (`cargo bench -p kortex --bench config_change`):
//! one `KortexTool` of `KORTEX_BENCH_TOOLS` (default 1 000) is edited, `KORTEX_BENCH_EDITS`
//! times (default 30), and each time the bench measures how long until the edit is served.
//! Results: docs/benchmarks.md.
//!
//! - **Standalone**: the real `kortex serve` (release build) on a folder with one manifest
//!   file per tool. The bench rewrites one file and polls `GET /api/v1/tools` every 20 ms
//!   until the tool's new description is listed. The time includes Kortex's file polling
//!   (every 250 ms) and its debounce (200 ms of quiet), both by design.
//! - **Cluster**: Kortex's own watches and compiler (`Observed::start`, `compile_loop`) in
//!   this process, against an API server on 127.0.0.1 that answers the Kubernetes list and
//!   watch calls the watches make with the same objects. The bench sends one `MODIFIED`
//!   watch event and waits for the configuration that carries it. The time includes the
//!   watch's decoding, the 150 ms debounce and the compilation; the real API server's own
//!   delivery time is not in it.

mod common;

use common::{Kortex, body_json, env_or, now_us};
use futures_util::StreamExt;
use kortex::operator::watch::{Observed, Scope, compile_loop};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn report(mode: &str, tools: usize, mut samples: Vec<u64>) {
    samples.sort_unstable();
    let (p50, p99, max) = common::spread(&samples);
    println!(
        "| {mode} | {tools} | {} | {p50:.0} / {p99:.0} / {max:.0} |",
        samples.len()
    );
}

/// The `e`th edit among `tools` tools: which tool, its name, and its new description.
fn edit(e: usize, tools: usize) -> (usize, String, String) {
    let i = (e * 37) % tools;
    (i, format!("t-{i:04}"), format!("edit {e}"))
}

fn tool_yaml(i: usize, description: &str) -> String {
    format!(
        "apiVersion: kortex.dev/v1alpha1\nkind: KortexTool\nmetadata: {{name: t-{i:04}}}\n\
         spec:\n  description: \"{description}\"\n  http: {{url: \"http://127.0.0.1:9/t/{i}\"}}\n  \
         parameters: {{type: object, properties: {{q: {{type: string}}}}}}\n"
    )
}

async fn standalone(tools: usize, edits: usize) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.path().join("base.yaml"),
        "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: up}\n\
         spec: {type: openai-compatible, baseUrl: \"http://127.0.0.1:9/v1\", defaultModel: m, locality: local}\n---\n\
         apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {name: all}\nspec: {sessions: [\"*\"], provider: up}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..tools {
        std::fs::write(
            dir.path().join(format!("tool-{i:04}.yaml")),
            tool_yaml(i, "initial"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let db = format!("sqlite://{}", dir.path().join("bench.db").display());
    let server = Kortex::start(dir.path(), &db, &[]);
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/tools", server.url);
    // What the listing says of tool `name`.
    let description = |listing: &Value, name: &str| -> Option<String> {
        listing["items"]
            .as_array()
            .or_else(|| listing.as_array())?
            .iter()
            .find(|t| t["name"] == name || t["metadata"]["name"] == name)
            .and_then(|t| {
                t["description"]
                    .as_str()
                    .or_else(|| t["spec"]["description"].as_str())
                    .map(str::to_owned)
            })
    };
    let listed =
        |client: reqwest::Client, url: String| async move { body_json(client.get(&url)).await };
    let first = listed(client.clone(), url.clone()).await;
    assert_eq!(
        description(&first, "t-0000").as_deref(),
        Some("initial"),
        "the listing does not show the tools: {}",
        &first.to_string()[..first.to_string().len().min(500)]
    );
    let mut samples = Vec::new();
    for e in 0..edits {
        let (i, name, wanted) = edit(e, tools);
        // Past the file system's timestamp granularity and the previous reload.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let written = now_us();
        std::fs::write(
            dir.path().join(format!("tool-{i:04}.yaml")),
            tool_yaml(i, &wanted),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let deadline = written + 10_000_000;
        loop {
            let listing = listed(client.clone(), url.clone()).await;
            if description(&listing, &name).as_deref() == Some(wanted.as_str()) {
                samples.push(now_us() - written);
                break;
            }
            assert!(now_us() < deadline, "edit {e} was not served within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    server.stop();
    samples
}

/// A KortexTool as the API server returns it (a spec edit bumps `generation`, as the API
/// server does).
fn tool_object(i: usize, description: &str, version: u64) -> Value {
    json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "KortexTool",
        "metadata": {"name": format!("t-{i:04}"), "namespace": "bench", "uid": format!("uid-{i}"),
            "resourceVersion": version.to_string(), "generation": version,
            "creationTimestamp": "2026-11-26T00:00:00Z"},
        "spec": {"description": description, "http": {"url": format!("http://tools.bench.svc:8080/t/{i}")},
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}})
}

/// The API server's side of the watches: lists, and watch streams (the tools' fed by the
/// bench).
struct Api {
    tools: usize,
    events: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<String>>>,
}

async fn api_server(api: Arc<Api>) -> String {
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let api = api.clone();
        async move {
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            let watching = query.split('&').any(|kv| kv == "watch=true");
            let plural = path.rsplit('/').next().unwrap_or_default().to_owned();
            if watching {
                let body = if plural == "kortextools"
                    && let Some(rx) = api.events.lock().unwrap_or_else(|e| e.into_inner()).take()
                {
                    axum::body::Body::from_stream(
                        tokio_stream_of(rx).map(Ok::<_, std::io::Error>),
                    )
                } else {
                    // Nothing ever changes: a watch that stays open.
                    axum::body::Body::from_stream(futures_util::stream::pending::<
                        Result<String, std::io::Error>,
                    >())
                };
                return axum::response::Response::builder()
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap_or_default();
            }
            let (api_version, kind, items): (&str, String, Vec<Value>) = match plural.as_str() {
                "kortextools" => (
                    "kortex.dev/v1alpha1",
                    "KortexToolList".into(),
                    (0..api.tools).map(|i| tool_object(i, "initial", 1)).collect(),
                ),
                "llmproviders" => (
                    "kortex.dev/v1alpha1",
                    "LLMProviderList".into(),
                    vec![json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
                        "metadata": {"name": "up", "namespace": "bench", "uid": "p", "resourceVersion": "1", "generation": 1},
                        "spec": {"type": "openai-compatible", "baseUrl": "http://llm.bench.svc/v1", "defaultModel": "m", "locality": "local"}})],
                ),
                "chatpolicies" => (
                    "kortex.dev/v1alpha1",
                    "ChatPolicyList".into(),
                    vec![json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
                        "metadata": {"name": "all", "namespace": "bench", "uid": "c", "resourceVersion": "1", "generation": 1},
                        "spec": {"sessions": ["*"], "provider": "up"}})],
                ),
                "actionproposals" => ("kortex.dev/v1alpha1", "ActionProposalList".into(), vec![]),
                "secrets" => ("meta.k8s.io/v1", "PartialObjectMetadataList".into(), vec![]),
                other => {
                    return axum::response::Response::builder()
                        .status(404)
                        .body(axum::body::Body::from(format!(
                            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{other} not served","reason":"NotFound","code":404}}"#
                        )))
                        .unwrap_or_default();
                }
            };
            let list = json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"resourceVersion": "1"}, "items": items});
            axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(axum::body::Body::from(list.to_string()))
                .unwrap_or_default()
        }
    });
    common::serve(app).await
}

fn tokio_stream_of(
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> impl futures_util::Stream<Item = String> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}

async fn cluster(tools: usize, edits: usize) -> Vec<u64> {
    let (events, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let api = Arc::new(Api {
        tools,
        events: Mutex::new(Some(rx)),
    });
    let url = api_server(api).await;
    let config = kube::Config::new(url.parse().unwrap_or_else(|e| panic!("{e}")));
    let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"));
    let scope = Scope {
        namespace: Some("bench".into()),
        own_namespace: "kortex".into(),
        reserved_headers: Vec::new(),
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let observed = Observed::start(&client, &scope, &stop);
    let (tx, mut rx) = tokio::sync::watch::channel(Arc::new(kortex::live::LiveConfig::default()));
    tokio::spawn(compile_loop(client, scope, observed, tx, stop));
    let description = |config: &kortex::live::LiveConfig, name: &str| -> Option<String> {
        config
            .catalog
            .tools
            .iter()
            .find(|(k, _)| k.name == name)
            .and_then(|(_, t)| t.object.spec.description.clone())
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while rx.borrow_and_update().catalog.tools.len() < tools {
            let _ = rx.changed().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the first configuration never held {tools} tools"));
    let mut samples = Vec::new();
    for e in 0..edits {
        let (i, name, wanted) = edit(e, tools);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let event = json!({"type": "MODIFIED", "object": tool_object(i, &wanted, 2 + e as u64)});
        let sent = now_us();
        let _ = events.send(format!("{event}\n"));
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if description(&rx.borrow_and_update(), &name).as_deref() == Some(wanted.as_str()) {
                    break;
                }
                let _ = rx.changed().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("edit {e} was not compiled within 10 s"));
        samples.push(now_us() - sent);
    }
    let _ = stop_tx.send(true);
    samples
}

fn main() {
    let tools = env_or("KORTEX_BENCH_TOOLS", 1000).max(1) as usize;
    let edits = env_or("KORTEX_BENCH_EDITS", 30).max(1) as usize;
    let runtime = common::runtime();
    runtime.block_on(async move {
        now_us();
        println!("one KortexTool among {tools} edited {edits} times; milliseconds from the edit to it being served\n");
        println!("| mode | tools | edits | p50 / p99 / max |");
        println!("|---|---|---|---|");
        report("standalone (files)", tools, standalone(tools, edits).await);
        report("cluster (watch event)", tools, cluster(tools, edits).await);
    });
}
