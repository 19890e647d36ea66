//! The tool router with real databases: validation, policy, timeouts, panics, slow notices,
//! large results read back in chunks, audit rows and metrics.

use crate::support::db::{all_dbs, audit_query, sqlite};
use crate::support::tools::{tool_context, tool_policy};
use kortex::catalog::PolicyEntry;
use kortex::llm::{BoxFuture, ToolCall, ToolSpec};
use kortex::metrics::Metrics;
use kortex::tools::{Router, Tool, ToolContext, ToolError};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// A test tool whose behaviour is chosen by its `mode` argument.
struct Probe;

impl Tool for Probe {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "probe".into(),
            description: "test tool".into(),
            parameters: json!({"type": "object", "properties": {
                "mode": {"type": "string", "enum": ["ok", "big", "panic", "slow", "fail"]},
                "n": {"type": "integer", "minimum": 1}}, "required": ["mode"]}),
        }
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (Duration::from_secs(60), Duration::from_secs(120))
    }

    fn call(
        &self,
        _ctx: ToolContext,
        input: Value,
    ) -> BoxFuture<'static, Result<String, ToolError>> {
        Box::pin(async move {
            match input["mode"].as_str() {
                Some("big") => Ok("0123456789".repeat(10_000)),
                Some("panic") => panic!("tool bug"),
                Some("slow") => {
                    tokio::time::sleep(Duration::from_secs(45)).await;
                    Ok("finally".into())
                }
                Some("fail") => Err(ToolError::Upstream("prometheus answered 503".into())),
                _ => Ok("fine".into()),
            }
        })
    }
}

fn call(id: &str, name: &str, input: Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        input,
    }
}

#[tokio::test]
async fn router_turns_every_failure_into_an_error_result() {
    for db in all_dbs().await {
        let metrics = Arc::new(Metrics::new());
        let mut router = Router::new(metrics.clone());
        router.add(Arc::new(Probe));
        let ctx = tool_context(&db.store, "s").await;
        let open = tool_policy(json!({"allow": ["*"], "timeouts": {"probe": "300ms"}}));
        let run = |c: ToolCall, p: PolicyEntry| {
            let router = &router;
            let ctx = ctx.clone();
            async move { router.execute(ctx, &c, &p, async {}).await }
        };

        let ok = run(call("1", "probe", json!({"mode": "ok"})), open.clone()).await;
        assert_eq!(
            (ok.content.as_str(), ok.is_error, ok.error_kind),
            ("fine", false, None)
        );

        let bad = run(
            call("2", "probe", json!({"mode": "nope", "n": 0})),
            open.clone(),
        )
        .await;
        assert_eq!(bad.error_kind, Some("validation"));
        assert!(
            bad.content.contains("/mode") && bad.content.contains("/n"),
            "names each failing path: {}",
            bad.content
        );

        let denied = run(
            call("3", "probe", json!({"mode": "ok"})),
            tool_policy(json!({"allow": ["*"], "deny": ["pro*"]})),
        )
        .await;
        assert_eq!(denied.error_kind, Some("denied"));
        let unknown = run(call("4", "rm_rf", json!({})), open.clone()).await;
        assert_eq!(unknown.error_kind, Some("denied"));

        // With the tool's own timeout: capturing a panic's backtrace on a loaded machine can
        // take longer than the 300 ms the slow case needs.
        let panicked = run(
            call("5", "probe", json!({"mode": "panic"})),
            tool_policy(json!({"allow": ["*"]})),
        )
        .await;
        assert_eq!(
            (panicked.content.as_str(), panicked.error_kind),
            ("internal error", Some("internal"))
        );

        let upstream = run(call("6", "probe", json!({"mode": "fail"})), open.clone()).await;
        assert_eq!(
            (upstream.content.as_str(), upstream.error_kind),
            ("prometheus answered 503", Some("upstream"))
        );

        let slow = run(call("7", "probe", json!({"mode": "slow"})), open.clone()).await;
        assert_eq!(
            slow.error_kind,
            Some("timeout"),
            "the policy's 300ms applies: {}",
            slow.content
        );

        // A large result is kept; the model gets an index and reads it back in chunks.
        let big = run(call("8", "probe", json!({"mode": "big"})), open.clone()).await;
        assert!(big.truncated && !big.is_error);
        let index: Value = serde_json::from_str(&big.content).unwrap_or_default();
        assert_eq!(
            (index["totalBytes"].clone(), index["chunks"].clone()),
            (json!(100_000), json!(4))
        );
        let mut whole = String::new();
        for chunk in 0..4 {
            let part = run(
                call(
                    "9",
                    "read_result_chunk",
                    json!({"resultId": index["resultId"], "chunk": chunk}),
                ),
                open.clone(),
            )
            .await;
            assert!(!part.is_error, "{}", part.content);
            let v: Value = serde_json::from_str(&part.content).unwrap_or_default();
            whole.push_str(v["content"].as_str().unwrap_or_default());
        }
        assert_eq!(whole, "0123456789".repeat(10_000));
        let past = run(
            call(
                "10",
                "read_result_chunk",
                json!({"resultId": index["resultId"], "chunk": 4}),
            ),
            open.clone(),
        )
        .await;
        assert_eq!(past.error_kind, Some("validation"));
        assert!(past.content.contains("4 chunks"), "{}", past.content);

        let audit = db
            .store
            .list_decisions(&audit_query(Some("tool_call"), 100))
            .await
            .unwrap();
        assert_eq!(audit.len(), 13, "one audit row per call on {}", db.url);
        let text = metrics.render();
        assert!(
            text.contains(r#"kortex_tool_calls_total{tool="probe",status="timeout"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("kortex_tool_duration_seconds_count{tool=\"probe\"}"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_slow_tool_produces_one_notice_after_thirty_seconds() {
    let db = sqlite().await;
    let mut router = Router::new(Arc::new(Metrics::new()));
    router.add(Arc::new(Probe));
    let ctx = tool_context(&db.store, "s").await;
    // Virtual time from here on: the 45 s tool and the 30 s notice take no real time.
    tokio::time::pause();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = tokio::time::Instant::now();
    let outcome = router
        .execute(
            ctx,
            &call("1", "probe", json!({"mode": "slow"})),
            &tool_policy(json!({})),
            async move {
                let _ = tx.send(tokio::time::Instant::now());
            },
        )
        .await;
    assert_eq!(outcome.content, "finally");
    let noticed = rx.recv().await.expect("no notice");
    assert_eq!(noticed.duration_since(started).as_secs(), 30);
    assert!(rx.try_recv().is_err(), "only one notice");
}
