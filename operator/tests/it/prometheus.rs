//! Prometheus tools against a local server speaking the Prometheus HTTP API
//! (`support::prometheus` says what each query answers).

use crate::support::db::{TestDb, sqlite};
use crate::support::prometheus::{Seen, Seens, server};
use crate::support::tools::{tool_context, tool_policy};
use kortex::llm::ToolCall;
use kortex::metrics::Metrics;
use kortex::tools::prometheus::Prometheus;
use kortex::tools::{Router, Tool, ToolContext, ToolError};
use serde_json::{Value, json};
use std::sync::Arc;

struct Setup {
    _db: TestDb,
    ctx: ToolContext,
    tools: Vec<Arc<dyn Tool>>,
    seen: Seens,
}

impl Setup {
    async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (base, seen) = server().await;
        let prometheus = Prometheus::new(&base, reqwest::Client::new()).unwrap();
        let db = sqlite().await;
        let ctx = tool_context(&db.store, "s").await;
        Self {
            _db: db,
            ctx,
            tools: prometheus.tools(),
            seen,
        }
    }

    fn tool(&self, name: &str) -> Arc<dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.spec().name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    async fn call(&self, name: &str, input: Value) -> Result<String, ToolError> {
        self.tool(name).call(self.ctx.clone(), input).await
    }

    /// Calls and parses a successful result.
    async fn ok(&self, name: &str, input: Value) -> Value {
        let out = self
            .call(name, input.clone())
            .await
            .unwrap_or_else(|e| panic!("{name} {input}: {e:?}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// The requests seen since the last call, emptied.
    fn take(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn close(a: &Value, b: f64) -> bool {
    (num(a) - b).abs() < 1e-6
}

fn ts(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>()
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .as_second()
}

#[tokio::test]
async fn get_metrics_summarises_and_down_samples() {
    let s = Setup::new().await;
    let out = s
        .ok(
            "get_metrics",
            json!({"query": "linear", "window": "2027-01-15T08:00:00Z/PT4H"}),
        )
        .await;
    let seen = s.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/prom/api/v1/query_range");
    assert_eq!(seen[0].param("query"), "linear");
    // 4 h / 120 = 120 s.
    assert_eq!(
        (
            seen[0].param("start"),
            seen[0].param("end"),
            seen[0].param("step")
        ),
        ("1800000000", "1800014400", "120")
    );
    assert_eq!(out["window"]["start"], "2027-01-15T08:00:00Z");
    assert_eq!(out["window"]["end"], "2027-01-15T12:00:00Z");
    assert_eq!(
        (out["step"].as_str(), num(&out["stepSeconds"])),
        (Some("2m"), 120.0)
    );
    assert_eq!(out["seriesTotal"], 1);
    let series = &out["series"][0];
    assert_eq!(
        series["metric"],
        json!({"__name__": "linear", "job": "demo"})
    );
    // Values 0, 2, …, 240 (121 samples).
    let stats = &series["stats"];
    assert_eq!(stats["count"], 121);
    for (key, want) in [
        ("min", 0.0),
        ("max", 240.0),
        ("mean", 120.0),
        ("p50", 120.0),
        ("p95", 228.0),
        ("p99", 237.6),
        ("last", 240.0),
    ] {
        assert!(close(&stats[key], want), "{key}: {}", stats[key]);
    }
    assert_eq!(stats["lastAt"], "2027-01-15T12:00:00Z");
    assert_eq!(
        (
            series["samplesShown"].as_u64(),
            series["samplesTotal"].as_u64()
        ),
        (Some(60), Some(121))
    );
    let samples = series["samples"].as_array().cloned().unwrap_or_default();
    assert_eq!(samples.len(), 60);
    assert_eq!(samples[0][0], "2027-01-15T08:00:00Z");
    assert!(close(&samples[0][1], 0.0));
    assert_eq!(samples[59][0], "2027-01-15T12:00:00Z");
    assert!(close(&samples[59][1], 240.0));
    assert!(out["notes"].to_string().contains("picked evenly"), "{out}");
    assert!(out.get("seriesOmitted").is_none());

    // Default window (the last hour) with an explicit step.
    let before = jiff::Timestamp::now().as_second();
    let out = s
        .ok("get_metrics", json!({"query": "flat", "step": "1m"}))
        .await;
    let seen = s.take();
    let (start, end) = (seen[0].seconds("start"), seen[0].seconds("end"));
    assert_eq!(seen[0].param("step"), "60");
    assert!((end - start - 3600.0).abs() < 1e-6, "{start} {end}");
    assert!(end >= before as f64 && end <= before as f64 + 60.0);
    assert_eq!(
        ts(out["window"]["end"].as_str().unwrap_or_default()),
        end.floor() as i64
    );
    let stats = &out["series"][0]["stats"];
    assert_eq!(stats["count"], 61);
    assert!(close(&stats["mean"], 42.0) && close(&stats["p99"], 42.0));
    // 61 samples: one more than are shown.
    assert_eq!(out["series"][0]["samplesShown"], 60);
    assert_eq!(out["series"][0]["samplesTotal"], 61);
}

#[tokio::test]
async fn get_metrics_skips_non_finite_samples_and_caps_series() {
    let s = Setup::new().await;
    // 60 samples, one a minute; every 4th (from the first) is NaN.
    let out = s
        .ok(
            "get_metrics",
            json!({"query": "gappy", "window": "2027-01-15T08:00:00Z/PT59M", "step": "60s"}),
        )
        .await;
    let series = &out["series"][0];
    assert_eq!(series["stats"]["count"], 45);
    assert_eq!(series["skippedNonFinite"], 15);
    assert!(close(&series["stats"]["mean"], 10.0) && close(&series["stats"]["min"], 10.0));
    let samples = series["samples"].as_array().cloned().unwrap_or_default();
    assert_eq!(samples.len(), 60, "not down-sampled");
    assert!(series.get("samplesShown").is_none());
    assert_eq!(samples[0][1], "NaN");
    assert!(close(&samples[1][1], 10.0));
    assert_eq!(out["warnings"], json!(["gappy data: some samples are NaN"]));
    assert!(out["notes"].to_string().contains("NaN"), "{out}");

    let out = s
        .ok(
            "get_metrics",
            json!({"query": "many", "window": "2027-01-15T08:00:00Z/PT1H"}),
        )
        .await;
    assert_eq!(
        (out["seriesTotal"].as_u64(), out["seriesOmitted"].as_u64()),
        (Some(25), Some(5))
    );
    let series = out["series"].as_array().cloned().unwrap_or_default();
    assert_eq!(series.len(), 20);
    assert_eq!(series[0]["metric"]["pod"], "p24", "highest mean first");
    assert_eq!(series[19]["metric"]["pod"], "p05");
    // 121 samples each, 600 shown over 20 series.
    assert_eq!(series[0]["samplesShown"], 30);
    assert!(
        out["notes"]
            .to_string()
            .contains("5 of 25 series are left out"),
        "{out}"
    );

    let none = s
        .ok(
            "get_metrics",
            json!({"query": "absent_metric", "window": "1h"}),
        )
        .await;
    assert_eq!(none["series"], json!([]));
    assert!(none["notes"].to_string().contains("no series"));
}

#[tokio::test]
async fn errors_are_upstream_or_validation() {
    let s = Setup::new().await;
    for tool in ["get_metrics", "compare_to_baseline"] {
        match s.call(tool, json!({"query": "bad("})).await {
            Err(ToolError::Upstream(m)) => {
                assert!(m.starts_with("prometheus: bad_data: "), "{m}");
                assert!(m.contains("parse error"), "{m}");
            }
            other => panic!("{tool}: {other:?}"),
        }
        assert_eq!(
            s.call(tool, json!({"query": "down"})).await,
            Err(ToolError::Upstream(
                "upstream: 503 Service Unavailable: maintenance".into()
            ))
        );
    }
    s.take();

    let invalid = [
        (
            "get_metrics",
            json!({"query": "up", "window": "yesterday"}),
            "invalid time window",
        ),
        (
            "get_metrics",
            json!({"query": "up", "window": "7d", "step": "1s"}),
            "11000",
        ),
        (
            "get_metrics",
            json!({"query": "up", "step": "soon"}),
            "invalid step",
        ),
        ("get_metrics", json!({"query": "  "}), "query is required"),
        (
            "compare_to_baseline",
            json!({"query": "up", "window": "-5m"}),
            "invalid time window",
        ),
        (
            "compare_to_baseline",
            json!({"query": "up", "baselineHours": 0}),
            "baselineHours",
        ),
        (
            "compare_to_baseline",
            json!({"query": "up", "baselineHours": 200}),
            "baselineHours",
        ),
        (
            "compare_to_baseline",
            json!({"query": "up", "threshold": -1}),
            "threshold",
        ),
    ];
    for (tool, input, want) in invalid {
        match s.call(tool, input.clone()).await {
            Err(ToolError::Validation(m)) => assert!(m.contains(want), "{input}: {m}"),
            other => panic!("{tool} {input}: {other:?}"),
        }
    }
    assert!(s.take().is_empty(), "invalid calls reach no server");

    let unreachable = Prometheus::new("http://127.0.0.1:1", reqwest::Client::new()).unwrap();
    let tool = unreachable.tools().remove(0);
    match tool.call(s.ctx.clone(), json!({"query": "up"})).await {
        Err(ToolError::Upstream(m)) => assert!(m.starts_with("prometheus: "), "{m}"),
        other => panic!("{other:?}"),
    }
    for bad in ["ftp://prom", "http://prom/?x=1", "prometheus"] {
        assert!(
            Prometheus::new(bad, reqwest::Client::new()).is_err(),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn compare_to_baseline_flags_the_spike_only() {
    let s = Setup::new().await;
    let out = s
        .ok(
            "compare_to_baseline",
            json!({"query": "spiky", "window": "2027-01-15T08:00:00Z/PT15M"}),
        )
        .await;
    let mut seen = s.take();
    seen.sort_by(|a, b| a.seconds("start").total_cmp(&b.seconds("start")));
    let sent: Vec<(&str, &str, &str, &str)> = seen
        .iter()
        .map(|r| {
            (
                r.param("query"),
                r.param("start"),
                r.param("end"),
                r.param("step"),
            )
        })
        .collect();
    // The 24 h right before the window, and the window, both with a 30 s step.
    assert_eq!(
        sent,
        vec![
            ("spiky", "1799913600", "1800000000", "30"),
            ("spiky", "1800000000", "1800000900", "30"),
        ]
    );
    assert_eq!(out["baseline"]["start"], "2027-01-14T08:00:00Z");
    assert_eq!(out["baseline"]["end"], "2027-01-15T08:00:00Z");
    assert_eq!(out["baseline"]["hours"], 24);
    assert_eq!(out["anomalies"], 1);
    assert!(num(&out["maxZ"]) >= 3.0, "{out}");
    let series = &out["series"][0];
    assert_eq!(series["metric"], json!({"job": "shop"}));
    assert_eq!(series["anomaly"], true);
    // Baseline: 98..=102 evenly, 2880 samples (the one at the window start is the window's).
    assert_eq!(series["baseline"]["count"], 2880);
    assert!(close(&series["baseline"]["mean"], 100.0));
    assert!(close(&series["baseline"]["stddev"], 2f64.sqrt()));
    assert_eq!(series["window"]["count"], 31);
    assert!(close(&series["window"]["mean"], 400.0));
    // (400 - 100) / √2
    assert!((num(&series["zMean"]) - 212.132).abs() < 0.01, "{series}");
    assert!(close(&out["maxZ"], num(&series["zMean"])));
    assert!(
        series["reason"]
            .to_string()
            .contains("above the baseline mean")
    );

    let calm = s
        .ok(
            "compare_to_baseline",
            json!({"query": "spiky", "window": "2027-01-15T07:00:00Z/PT15M"}),
        )
        .await;
    assert_eq!(calm["anomalies"], 0, "{calm}");
    assert!(num(&calm["maxZ"]) < 3.0);
    assert_eq!(calm["series"][0]["anomaly"], false);

    let flat = s
        .ok(
            "compare_to_baseline",
            json!({"query": "flat", "window": "2027-01-15T08:00:00Z/PT15M", "threshold": 2}),
        )
        .await;
    assert_eq!(flat["anomalies"], 0, "{flat}");
    assert_eq!(flat["maxZ"], Value::Null);
    assert_eq!(flat["threshold"], 2.0);
    let series = &flat["series"][0];
    assert_eq!(
        (series["anomaly"].as_bool(), &series["zMean"]),
        (Some(false), &Value::Null)
    );
    assert!(
        series["reason"].to_string().contains("constant"),
        "{series}"
    );
}

#[tokio::test]
async fn compare_to_baseline_defaults_and_unmatched_series() {
    let s = Setup::new().await;
    let before = jiff::Timestamp::now().as_second() as f64;
    s.ok("compare_to_baseline", json!({"query": "flat"})).await;
    let mut seen = s.take();
    seen.sort_by(|a, b| a.seconds("start").total_cmp(&b.seconds("start")));
    let (baseline, window) = (&seen[0], &seen[1]);
    assert!((window.seconds("end") - window.seconds("start") - 900.0).abs() < 1e-6);
    assert!(window.seconds("end") >= before && window.seconds("end") <= before + 60.0);
    assert_eq!(baseline.param("end"), window.param("start"));
    assert!((baseline.seconds("end") - baseline.seconds("start") - 86_400.0).abs() < 1e-6);
    assert_eq!((baseline.param("step"), window.param("step")), ("30", "30"));

    // A week: at most 10 000 baseline points, so ⌈604 800 / 10 000⌉ = 61 s.
    let out = s
        .ok(
            "compare_to_baseline",
            json!({"query": "flat", "window": "2027-01-15T08:00:00Z/PT15M", "baselineHours": 168}),
        )
        .await;
    assert!(s.take().iter().all(|r| r.param("step") == "61"));
    assert_eq!(out["stepSeconds"], 61.0);

    let out = s
        .ok(
            "compare_to_baseline",
            json!({"query": "newpod", "window": "2027-01-15T08:00:00Z/PT15M"}),
        )
        .await;
    assert_eq!(out["seriesCompared"], 1);
    assert_eq!(out["series"][0]["metric"], json!({"pod": "a"}));
    assert_eq!(out["onlyInWindow"][0]["metric"], json!({"pod": "b"}));
    assert!(close(&out["onlyInWindow"][0]["window"]["mean"], 1.0));
    assert_eq!(out["onlyInBaseline"][0]["metric"], json!({"pod": "c"}));
    assert_eq!(out["onlyInBaseline"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn the_router_enforces_the_schemas() {
    let s = Setup::new().await;
    let mut router = Router::new(Arc::new(Metrics::new()));
    for t in &s.tools {
        router.add(t.clone());
    }
    let call = |name: &str, input: Value| ToolCall {
        id: "c1".into(),
        name: name.into(),
        input,
    };
    let p = tool_policy(json!({"allow": ["*"]}));
    let extra = router
        .execute(
            s.ctx.clone(),
            &call("get_metrics", json!({"query": "flat", "range": "1h"})),
            &p,
            async {},
        )
        .await;
    assert_eq!(extra.error_kind, Some("validation"), "{}", extra.content);
    let hours = router
        .execute(
            s.ctx.clone(),
            &call(
                "compare_to_baseline",
                json!({"query": "flat", "baselineHours": 1.5}),
            ),
            &p,
            async {},
        )
        .await;
    assert_eq!(hours.error_kind, Some("validation"), "{}", hours.content);
    let ok = router
        .execute(
            s.ctx.clone(),
            &call(
                "compare_to_baseline",
                json!({"query": "spiky", "window": "2027-01-15T08:00:00Z/PT15M"}),
            ),
            &p,
            async {},
        )
        .await;
    assert!(!ok.is_error, "{}", ok.content);
    assert!(ok.content.contains("\"anomalies\":1"), "{}", ok.content);
}
