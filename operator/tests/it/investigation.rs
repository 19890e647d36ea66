//! The whole investigation from the binary a user runs: `kortex serve --kubeconfig
//! --prometheus-url` with an HTTP and an MCP plugin tool; a model (scripted over the OpenAI
//! wire format) pages through a crashing pod's logs with the cursor it was given, reads the
//! events and rollout history, compares a metric with its baseline, finds a similar past
//! incident, calls a Jira-like HTTP tool and an MCP server's tool — and never sees a Secret.

use crate::support::canned_api::fake_api_server;
use crate::support::chat::{chat_once, get_json, open_session, post_message, wait_idle};
use crate::support::fake_api::write_kubeconfig;
use crate::support::manifests::{docs, manifest_dir, policy, provider, secret, tool};
use crate::support::net::http_client;
use crate::support::plugins::{mcp_server, upstream};
use crate::support::provider::{
    mock, openai, push, push_answer, streamed, tool_calls, tool_result,
};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::time::Duration;

/// The bearer token of the Jira bridge: must never reach the model.
const BRIDGE_TOKEN: &str = "bridge-SECRET-7f3a9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_investigates_a_crashing_pod_end_to_end() {
    let Some(mcp) = mcp_server("mcp-token-1") else {
        return;
    };
    let (api, _) = fake_api_server().await;
    let (prometheus, _) = crate::support::prometheus::server().await;
    let (bridge, bridge_seen) = upstream().await;
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    let kubeconfig = write_kubeconfig(dir.path(), &api);
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            provider(
                "openai",
                &format!("type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1"),
            ),
            policy(
                "incidents",
                "sessions: [incident-*], provider: openai, maxToolDepth: 6",
            ),
            secret(
                "tools",
                &format!("bridge: {BRIDGE_TOKEN}, mcp: mcp-token-1"),
            ),
            tool(
                "jira-search",
                &format!(
                    "name: jira_search, description: Search Jira issues with JQL., \
                     http: {{method: POST, url: '{bridge}/jira/search', auth: {{type: bearer, \
                     secretRef: {{name: tools, key: bridge}}}}}}, parameters: {{type: object, \
                     properties: {{jql: {{type: string}}}}, required: [jql]}}"
                ),
            ),
            tool(
                "grafana",
                &format!(
                    "mcp: {{url: '{url}', auth: {{type: bearer, secretRef: {{name: tools, \
                     key: mcp}}}}, include: [echo, add]}}",
                    url = mcp.url
                ),
            ),
        ]),
    )
    .unwrap();
    let server = Server::start_with_args(
        &m,
        &dir.path().join("k.db"),
        &[
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--prometheus-url",
            &prometheus,
        ],
    );
    let client = http_client();

    // The MCP server's tools are discovered and listed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tools = get_json(&client, server.url("/api/v1/tools")).await;
        let grafana = tools["items"]
            .as_array()
            .and_then(|i| i.iter().find(|t| t["name"] == "grafana").cloned())
            .unwrap_or_default();
        if grafana["discovery"]["reachable"] == true {
            let mut names: Vec<String> = grafana["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect();
            names.sort();
            assert_eq!(names, ["grafana__add", "grafana__echo"], "{grafana}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no discovery: {tools}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A past incident, answered earlier.
    push_answer(
        &script,
        &["Pods were OOMKilled after 2.3; rolled back checkout."],
    );
    chat_once(
        &server,
        json!({"name": "incident-march"}),
        "checkout pods are OOMKilled",
    )
    .await;

    // Step 1: the first page of logs and the incident history.
    push(
        &script,
        tool_calls(&[
            (
                "t-logs1",
                "get_logs",
                json!({"namespace": "shop", "pod": "checkout-1", "container": "app", "window": "last 30m"}),
            ),
            (
                "t-history",
                "get_incident_history",
                json!({"query": "checkout oomkilled"}),
            ),
        ]),
    );
    // Step 2 uses the cursor it was given; step 3 answers.
    if let Ok(mut responder) = script.responder.lock() {
        *responder = Some(Box::new(|body: &Value| {
            if tool_result(body, "t-echo").is_some() {
                let d = openai();
                return Some(streamed(
                    &d,
                    (d.text_stream)(&["Release 2.3 leaks memory; roll back."]),
                ));
            }
            let page1: Value = serde_json::from_str(&tool_result(body, "t-logs1")?).ok()?;
            let cursor = page1["nextCursor"].as_str()?.to_owned();
            Some(tool_calls(&[
                (
                    "t-logs2",
                    "get_logs",
                    json!({"namespace": "shop", "pod": "checkout-1", "container": "app", "window": "last 30m", "cursor": cursor}),
                ),
                (
                    "t-events",
                    "get_events",
                    json!({"namespace": "shop", "kind": "Pod", "name": "checkout-1"}),
                ),
                (
                    "t-deploys",
                    "get_recent_deploys",
                    json!({"namespace": "shop", "name": "checkout"}),
                ),
                (
                    "t-metrics",
                    "compare_to_baseline",
                    json!({"query": "spiky", "window": "2027-01-15T08:00:00Z/PT15M"}),
                ),
                (
                    "t-jira",
                    "jira_search",
                    json!({"jql": "project = SHOP AND text ~ OOMKilled"}),
                ),
                (
                    "t-echo",
                    "grafana__echo",
                    json!({"text": "dashboards: checkout memory"}),
                ),
                (
                    "t-secret",
                    "get_resource",
                    json!({"kind": "Secret", "namespace": "shop", "name": "db"}),
                ),
            ]))
        }));
    }
    let id = open_session(&server, json!({"name": "incident-checkout"})).await;
    post_message(&server, &id, "checkout keeps crashing, why?").await;
    let s = wait_idle(&client, &server.url(&format!("/chat/v1/sessions/{id}"))).await;
    let messages = s["messages"].as_array().cloned().unwrap_or_default();
    let result = |call: &str| -> Value {
        let m = messages
            .iter()
            .find(|m| m["role"] == "tool" && m["toolCallId"] == call)
            .unwrap_or_else(|| panic!("no result for {call}: {s}"));
        assert_ne!(m["isError"], true, "{call}: {m}");
        let content = m["content"].as_str().unwrap_or_default();
        serde_json::from_str(content).unwrap_or_else(|_| json!(content))
    };
    assert_eq!(
        messages.last().map(|m| m["content"].clone()),
        Some(json!("Release 2.3 leaks memory; roll back.")),
        "{s}"
    );

    // Paging: page two is older than page one, without overlap.
    let page1 = result("t-logs1");
    let page2 = result("t-logs2");
    let lines = |p: &Value| -> Vec<String> {
        p["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect()
    };
    let (l1, l2) = (lines(&page1), lines(&page2));
    assert_eq!((l1.len(), l2.len()), (100, 100));
    assert!(l1.last() > l2.first(), "older lines on page two");
    assert!(l2.iter().all(|l| !l1.contains(l)));

    assert_eq!(result("t-events")["events"][0]["reason"], "BackOff");
    let deploys = result("t-deploys");
    assert!(
        deploys["workloads"][0]["revisions"][0]["rollback"]
            .as_str()
            .is_some_and(|r| r.contains("rollback")),
        "{deploys}"
    );
    let metrics = result("t-metrics");
    assert_eq!(metrics["anomalies"], 1, "{metrics}");
    let history = result("t-history");
    assert_eq!(
        history["sessions"][0]["session"], "incident-march",
        "{history}"
    );
    assert!(result("t-jira").to_string().contains("OPS-1"));
    let sent = bridge_seen
        .lock()
        .map(|s| s.last().cloned())
        .ok()
        .flatten()
        .expect("the bridge saw no request");
    assert_eq!(
        sent.headers["authorization"],
        format!("Bearer {BRIDGE_TOKEN}")
    );
    assert_eq!(result("t-echo"), json!("dashboards: checkout memory"));
    let secret = result("t-secret");
    assert!(
        secret.get("data").is_none() && secret["dataKeys"]["password"].is_string(),
        "{secret}"
    );

    // Nothing secret ever reached the model: not the tool credentials, not the Secret.
    let to_model = script
        .seen
        .lock()
        .map(|s| {
            s.iter()
                .map(|x| x.body.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    for leak in [
        BRIDGE_TOKEN,
        "mcp-token-1",
        "aHVudGVyMi1wbGFpbg",
        "hunter2-plain",
    ] {
        assert!(!to_model.contains(leak), "{leak} reached the model");
    }
    assert!(server.terminate().success());
    drop(mcp);
}
