//! Run control on the real binary: the events export for postmortems.

use crate::binary::Server;
use crate::chat::{read_sse, run_ended};
use crate::common::http_client;
use crate::llm::{mock, openai, push, streamed};
use crate::policy::{ask, session};
use serde_json::{Value, json};

fn manifests(dir: &std::path::Path, llm: &str) {
    let yaml = format!(
        r#"apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: scripted}}
spec: {{type: openai-compatible, baseUrl: "{llm}/v1", defaultModel: m, timeout: 10s}}
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: ops}}
spec: {{sessions: ["*"], provider: scripted}}
"#
    );
    std::fs::write(dir.join("all.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"));
}

/// `?format=jsonl` gives the same events, with the same ids, as the SSE replay, from any
/// sequence number on; a wrong format or a lone `from_seq` is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jsonl_export_is_the_sse_replay() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    push(
        &script,
        crate::investigation::tool_calls(&[(
            "c1",
            "get_incident_history",
            json!({"query": "checkout"}),
        )]),
    );
    push(
        &script,
        streamed(
            &openai(),
            (openai().text_stream)(&["Nothing ", "like it before."]),
        ),
    );
    let id = session(&server, "incident-1").await;
    let streamed_events = ask(&server, &id, "Has checkout failed before?").await;
    assert!(run_ended(&streamed_events), "{streamed_events:?}");

    let replay = read_sse(
        http_client()
            .get(server.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        run_ended,
    )
    .await;
    let export = |query: &'static str| {
        let url = server.url(&format!("/chat/v1/sessions/{id}/events?{query}"));
        async move {
            let r = http_client()
                .get(url)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let status = r.status().as_u16();
            let kind = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (status, kind, r.text().await.unwrap_or_default())
        }
    };
    let (status, kind, body) = export("format=jsonl").await;
    assert_eq!(
        (status, kind.as_str()),
        (200, "application/jsonl"),
        "{body}"
    );
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let exported: Vec<(i64, String, Value)> = lines
        .iter()
        .map(|l| {
            (
                l["id"].as_i64().unwrap_or_default(),
                l["event"].as_str().unwrap_or_default().to_owned(),
                l["data"].clone(),
            )
        })
        .collect();
    let replayed: Vec<(i64, String, Value)> = replay
        .iter()
        .map(|e| (e.id, e.event.clone(), e.data.clone()))
        .collect();
    assert_eq!(exported, replayed);
    assert!(
        exported.iter().any(|(_, e, _)| e == "tool.end") && exported.len() >= 6,
        "{exported:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["runId"].is_string() && l["createdAt"].is_string())
    );

    // From a sequence number on.
    let (_, _, tail) = export("format=jsonl&from_seq=3").await;
    let ids: Vec<i64> = tail
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["id"].as_i64())
        .collect();
    assert_eq!(
        ids,
        replayed
            .iter()
            .map(|e| e.0)
            .filter(|s| *s >= 3)
            .collect::<Vec<_>>()
    );

    for (query, why) in [
        ("format=csv", "the events export format is jsonl"),
        ("from_seq=2", "from_seq goes with format=jsonl"),
    ] {
        let (status, _, body) = export(query).await;
        assert_eq!(status, 400, "{query}");
        assert!(body.contains(why), "{query}: {body}");
    }
}
