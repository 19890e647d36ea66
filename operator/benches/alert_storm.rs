//! An alert storm (`cargo bench -p kortex --bench alert_storm`): 1 000 Alertmanager
//! notifications in 100 groups within one second (`KORTEX_BENCH_ALERTS`,
//! `KORTEX_BENCH_GROUPS`) reach the real `kortex serve` (release build, SQLite), as
//! Alertmanager would send them: each notification of a group carries the group's alerts so
//! far (one more each time). The bench reports the time to answer each notification (p50,
//! p99, max), the server's memory before, right after and once the dispatcher has settled
//! every event, and that every notification was recorded
//! (`kortex_trigger_events_total{result="received"}`) and settled (run or skipped: the
//! trigger's default limits allow 20 investigations an hour). No peer receives Alertmanager
//! webhooks into investigations, so there is nothing to run side by side. Results:
//! docs/benchmarks.md#alert-storm.

mod common;

use common::{Kortex, env_or, rss_kib, timed_provider};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn notification(group: usize, alerts: usize) -> Value {
    json!({
        "version": "4", "groupKey": format!("{{}}:{{alertname=\"Storm{group}\"}}"), "truncatedAlerts": 0,
        "status": "firing", "receiver": "kortex",
        "groupLabels": {"alertname": format!("Storm{group}")},
        "commonLabels": {"alertname": format!("Storm{group}"), "severity": "critical"},
        "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093",
        "alerts": (0..alerts).map(|i| json!({
            "status": "firing",
            "labels": {"alertname": format!("Storm{group}"), "severity": "critical", "namespace": "shop", "pod": format!("web-{i}")},
            "annotations": {"summary": format!("web-{i} restarts"), "description": "Pod has restarted 5 times in the last 10 minutes."},
            "startsAt": "2026-11-27T02:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus.example/graph?g0.expr=kube_pod_container_status_restarts_total",
            "fingerprint": format!("{group:04x}{i:04x}"),
        })).collect::<Vec<_>>(),
    })
}

async fn counted(client: &reqwest::Client, kortex: &str, result: &str) -> u64 {
    let text = common::body_text(client.get(format!("{kortex}/metrics"))).await;
    text.lines()
        .filter(|l| {
            l.starts_with("kortex_trigger_events_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let alerts = env_or("KORTEX_BENCH_ALERTS", 1000) as usize;
    let groups = env_or("KORTEX_BENCH_GROUPS", 100) as usize;
    common::runtime().block_on(async move {
        let provider = timed_provider(4, Duration::from_millis(5)).await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.path().join("all.yaml"),
            format!(
                "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: up}}\n\
                 spec: {{type: openai-compatible, baseUrl: \"{provider}/v1\", defaultModel: m, locality: local}}\n---\n\
                 apiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: alerts}}\n\
                 spec:\n  sessions: [\"alert-*\"]\n  provider: up\n  triggers:\n    - name: storm\n      \
                 alerts: {{matchers: {{severity: critical}}}}\n      prompt: \"Alert {{{{ labels.alertname }}}}: find the cause.\"\n      \
                 runAs: {{user: local}}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let db = format!("sqlite://{}", dir.path().join("k.db").display());
        let kortex = Kortex::start(dir.path(), &db, &[]);
        let client = reqwest::Client::new();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_before = rss_kib(kortex.pid());
        let url = format!("{}/api/v1/alerts/alertmanager", kortex.url);
        let start = Instant::now();
        let spacing = Duration::from_secs(1) / alerts as u32;
        let mut tasks = Vec::with_capacity(alerts);
        for i in 0..alerts {
            let body = notification(i % groups, i / groups + 1).to_string();
            let (client, url) = (client.clone(), url.clone());
            tokio::time::sleep_until((start + spacing * i as u32).into()).await;
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
                t.elapsed().as_micros() as u64
            }));
        }
        let mut samples = Vec::with_capacity(alerts);
        for t in tasks {
            samples.push(t.await.unwrap_or_else(|e| panic!("{e}")));
        }
        let sent_in = start.elapsed();
        let rss_after = rss_kib(kortex.pid());
        samples.sort_unstable();
        let received = counted(&client, &kortex.url, "received").await;
        // The dispatcher settles every event: run, unchanged or skipped.
        let deadline = Instant::now() + Duration::from_secs(120);
        let (mut run, mut unchanged, mut skipped) = (0, 0, 0);
        while Instant::now() < deadline {
            run = counted(&client, &kortex.url, "run").await;
            unchanged = counted(&client, &kortex.url, "unchanged").await;
            skipped = counted(&client, &kortex.url, "skipped").await;
            if run + unchanged + skipped >= alerts as u64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let settled_in = start.elapsed();
        let rss_settled = rss_kib(kortex.pid());
        println!("| notifications | groups | sent in | answer p50 / p99 / max (ms) | recorded | run / unchanged / skipped | settled in | RSS before → after → settled (MiB) |");
        println!("|---|---|---|---|---|---|---|---|");
        let (p50, p99, max) = common::spread(&samples);
        println!(
            "| {alerts} | {groups} | {:.2} s | {p50:.1} / {p99:.1} / {max:.1} | {received} | {run} / {unchanged} / {skipped} | {:.1} s | {:.1} → {:.1} → {:.1} |",
            sent_in.as_secs_f64(),
            settled_in.as_secs_f64(),
            rss_before as f64 / 1024.0,
            rss_after as f64 / 1024.0,
            rss_settled as f64 / 1024.0,
        );
        assert_eq!(received, alerts as u64, "a notification was not recorded");
        assert_eq!(run + unchanged + skipped, alerts as u64, "a notification was not settled");
        let warnings: Vec<String> = kortex
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|l| l.contains("ERROR"))
            .cloned()
            .collect();
        assert!(warnings.is_empty(), "{warnings:#?}");
    });
}
