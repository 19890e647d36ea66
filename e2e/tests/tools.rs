//! The Kubernetes tools against a real API server: logs of a real pod paged with a cursor,
//! events, rollout history across two revisions, and Secrets that never show their values.
//! The pod runs `KORTEX_E2E_IMAGE` (default `busybox:1.36`), which the cluster must be able
//! to pull; on a cluster without a Ready node (a bare control plane) the logs part is
//! skipped, saying so, and the rest runs.

use kortex::llm::ToolCall;
use kortex::tools::Outcome;
use kortex_e2e::{any_policy, apply, in_temp_namespace, kube_tools, ready_nodes, tool_context};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test]
async fn kubernetes_tools_read_a_real_cluster() -> anyhow::Result<()> {
    in_temp_namespace("tools", run).await
}

fn deployment(ns: &str, image: &str, release: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        // The change cause on the Deployment: its controller copies it to the revision's
        // ReplicaSet, where `kubectl rollout history` (and get_recent_deploys) read it.
        "metadata": {"name": "ticker", "namespace": ns, "annotations": {"kubernetes.io/change-cause": release}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ticker"}},
            "template": {
                "metadata": {"labels": {"app": "ticker"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": image,
                    "command": ["sh", "-c", format!("i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo \"level=error msg=\\\"tick $i {release}\\\"\"; echo \"level=info msg=ok\"; done; sleep 3600")]}]}}}
    })
}

async fn run(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let image = std::env::var("KORTEX_E2E_IMAGE").unwrap_or_else(|_| "busybox:1.36".into());
    apply(client, ns, json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": ns, "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"stringData\":{\"password\":\"e2e-hunter2\"}}"}},
        "stringData": {"password": "e2e-hunter2"}})).await?;
    apply(client, ns, deployment(ns, &image, "release-1")).await?;

    let (path, ctx) = tool_context("tools", "incident-e2e", ns, "e2e").await?;
    let router = kube_tools(client);
    let policy = any_policy(ns, "p")?;
    let call = |name: &str, input: Value| {
        let ctx = ctx.clone();
        let router = &router;
        let policy = &policy;
        let call = ToolCall {
            id: "c".into(),
            name: name.into(),
            input,
        };
        async move {
            router
                .execute(ctx, &call, policy, std::future::pending())
                .await
        }
    };
    let ok = |out: Outcome| -> anyhow::Result<Value> {
        anyhow::ensure!(!out.is_error, "tool failed: {}", out.content);
        Ok(serde_json::from_str(&out.content)?)
    };

    // Secrets: key names only, whatever the RBAC.
    for (tool, input) in [
        (
            "get_resource",
            json!({"kind": "Secret", "namespace": ns, "name": "db"}),
        ),
        (
            "list_resources",
            json!({"kind": "secrets", "namespace": ns, "full": true}),
        ),
    ] {
        let out = call(tool, input).await;
        anyhow::ensure!(!out.is_error, "{tool}: {}", out.content);
        anyhow::ensure!(
            !out.content.contains("e2e-hunter2") && !out.content.contains("ZTJlLWh1bnRlcjI"),
            "{tool} leaked the Secret: {}",
            out.content
        );
    }

    // Logs of the workload's pod, once it has written all its lines: only where a pod can
    // run.
    let nodes = ready_nodes(client).await?;
    if nodes == 0 {
        eprintln!(
            "skipping get_logs: the cluster has no Ready node, so the workload's pod cannot run"
        );
    } else {
        logs(&call, ns, &image).await?;
    }

    // Events of the namespace.
    let events = ok(call("get_events", json!({"namespace": ns})).await)?;
    anyhow::ensure!(events["total"].as_u64() > Some(0), "{events}");

    // A second revision shows up in the rollout history with its change cause.
    apply(client, ns, deployment(ns, &image, "release-2")).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let history = ok(call(
            "get_recent_deploys",
            json!({"namespace": ns, "kind": "Deployment", "name": "ticker"}),
        )
        .await)?;
        let revisions = history["workloads"][0]["revisions"].clone();
        if revisions.as_array().map_or(0, Vec::len) == 2 {
            anyhow::ensure!(revisions[0]["revision"] == 2, "{history}");
            anyhow::ensure!(revisions[0]["changeCause"] == "release-2", "{history}");
            anyhow::ensure!(revisions[1]["changeCause"] == "release-1", "{history}");
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no second revision: {history}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // A cluster-scoped kind lists (or is refused by RBAC with a clear result).
    let nodes = call("list_resources", json!({"kind": "Node"})).await;
    anyhow::ensure!(
        !nodes.is_error || nodes.error_kind == Some("denied"),
        "{}",
        nodes.content
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// `get_logs` pages a real pod's log newest first, with a cursor.
async fn logs<F, Fut>(call: &F, ns: &str, image: &str) -> anyhow::Result<()>
where
    F: Fn(&str, Value) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let ok = |out: Outcome| -> anyhow::Result<Value> {
        anyhow::ensure!(!out.is_error, "tool failed: {}", out.content);
        Ok(serde_json::from_str(&out.content)?)
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let page1 = loop {
        let out = call(
            "get_logs",
            json!({"namespace": ns, "workload": "deployment/ticker", "minLevel": "error", "window": "last 30m"}),
        )
        .await;
        if !out.is_error {
            let v: Value = serde_json::from_str(&out.content)?;
            if v["lines"].as_array().map_or(0, Vec::len) == 100
                && v["olderMatchingLines"].as_u64() == Some(200)
            {
                break v;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the pod did not log 300 error lines within 180s (image {image}): {}",
            out.content
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let first = page1["lines"][0].as_str().unwrap_or_default();
    anyhow::ensure!(
        first.contains("tick 300 release-1"),
        "newest first: {first}"
    );
    let cursor = page1["nextCursor"].as_str().unwrap_or_default();
    let page2 = ok(call(
        "get_logs",
        json!({"namespace": ns, "workload": "deployment/ticker", "minLevel": "error", "window": "last 30m", "cursor": cursor}),
    )
    .await)?;
    let second = page2["lines"][0].as_str().unwrap_or_default();
    anyhow::ensure!(
        second.contains("tick 200 release-1"),
        "page two continues: {second}"
    );

    Ok(())
}
