//! `get_metrics` and `compare_to_baseline`: PromQL range queries through the Prometheus HTTP
//! API (`GET {base}/api/v1/query_range`), summarised for a model.
//!
//! `get_metrics` returns per series the statistics of every sample (count, min, max, mean,
//! p50/p95/p99 with linear interpolation, last) and at most 60 samples picked evenly.
//! `compare_to_baseline` runs the same query over the window and over the `baselineHours`
//! before it, with the same step, and gives per series (matched by identical label sets) the
//! z-scores of the window's mean, max and min against the baseline's samples.
//!
//! Default steps: `get_metrics` uses window / 120 rounded up to whole seconds (at least
//! 1 s); `compare_to_baseline` uses the largest of window / 30 (about 30 points in the
//! window), baseline / 10 000 (Prometheus refuses more than 11 000 points per series) and
//! 1 s, each rounded up to whole seconds: 30 s for the default 15 minutes against 24 hours.
//!
//! Non-finite samples (`NaN`, `+Inf`, `-Inf`) are skipped in every statistic and counted.
//! A Prometheus error is `prometheus: <errorType>: <error>`; any other non-2xx answer is
//! `upstream: <status>: <excerpt>`.

use super::plugin_http::error_chain;
use super::{Tool, ToolContext, ToolError, ToolFuture, window};
use crate::llm::ToolSpec;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use stats::{Comparison, Summary, compare, downsample, non_finite, round3, summarize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod stats;

/// Most points per series Prometheus answers (`(end - start) / step`).
pub const MAX_POINTS: i64 = 11_000;
/// Most series in a result.
const MAX_SERIES: usize = 20;
/// Most samples shown per series.
const MAX_SAMPLES: usize = 60;
/// Most samples shown over all series (with more than 10 series each gets fewer than 60).
const SAMPLE_BUDGET: usize = 600;
/// Longest PromQL expression.
const MAX_QUERY_CHARS: usize = 4000;
/// Largest successful answer read.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Largest error answer read (a JSON error is parsed from it).
const MAX_ERROR_BYTES: usize = 64 << 10;
/// Longest excerpt of an error body shown to the model.
const ERROR_EXCERPT: usize = 512;
/// Default window of `get_metrics`.
const METRICS_WINDOW: &str = "last 1h";
/// Default window of `compare_to_baseline`.
const COMPARE_WINDOW: &str = "last 15m";
/// Default baseline length (hours).
const BASELINE_HOURS: i64 = 24;
/// Default z-score threshold.
const THRESHOLD: f64 = 3.0;

/// A Prometheus server the tools query.
pub struct Prometheus {
    /// `{base}/api/v1/query_range`.
    endpoint: reqwest::Url,
    client: reqwest::Client,
}

impl Prometheus {
    /// A Prometheus at `base_url` (`http://` or `https://`, with a host, optionally a path
    /// prefix such as `http://prom:9090/prometheus`; no query string or fragment).
    pub fn new(base_url: &str, client: reqwest::Client) -> Result<Arc<Self>, String> {
        let mut url = reqwest::Url::parse(base_url.trim())
            .map_err(|e| format!("invalid Prometheus URL {base_url:?}: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!(
                "invalid Prometheus URL {base_url:?}: it must be http:// or https:// with a host"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "invalid Prometheus URL {base_url:?}: it must not have a query string or fragment"
            ));
        }
        let path = format!("{}/api/v1/query_range", url.path().trim_end_matches('/'));
        url.set_path(&path);
        Ok(Arc::new(Self {
            endpoint: url,
            client,
        }))
    }

    /// `get_metrics` and `compare_to_baseline` over this server.
    pub fn tools(self: &Arc<Self>) -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(GetMetrics(self.clone())),
            Arc::new(CompareToBaseline(self.clone())),
        ]
    }

    /// Runs a range query; every sample of the answer, or why there is none.
    async fn query_range(
        &self,
        query: &str,
        start: Timestamp,
        end: Timestamp,
        step: SignedDuration,
    ) -> Result<Matrix, ToolError> {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut()
            .append_pair("query", query)
            .append_pair("start", &unix(start.as_millisecond()))
            .append_pair("end", &unix(end.as_millisecond()))
            .append_pair("step", &unix(millis(step)));
        let response = self
            .client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| ToolError::Upstream(format!("prometheus: {}", error_chain(&e))))?;
        let status = response.status();
        let limit = if status.is_success() {
            MAX_BODY_BYTES
        } else {
            MAX_ERROR_BYTES
        };
        let (body, cut) = read_body(response, limit).await?;
        parse_answer(status, &body, cut)
    }
}

/// The samples of a range query.
#[derive(Debug, Default)]
struct Matrix {
    series: Vec<Series>,
    warnings: Vec<String>,
    infos: Vec<String>,
}

/// One series of a range query.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    metric: BTreeMap<String, String>,
    /// `(unix milliseconds, value)`, in time order.
    points: Vec<(i64, f64)>,
    /// Native histogram samples (not summarised).
    histograms: usize,
}

/// The Prometheus API envelope.
#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Option<Vec<String>>,
    #[serde(default)]
    infos: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Value,
}

#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
    #[serde(default)]
    histograms: Vec<Value>,
}

/// Reads at most `limit` bytes of the body; whether there was more.
async fn read_body(
    response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), ToolError> {
    crate::egress::read_capped(response, limit)
        .await
        .map_err(|e| ToolError::Upstream(format!("prometheus: {}", error_chain(&e))))
}

/// The start of a body for an error message.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut out: String = text.chars().take(ERROR_EXCERPT).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Turns an answer into samples or an error.
fn parse_answer(status: reqwest::StatusCode, body: &[u8], cut: bool) -> Result<Matrix, ToolError> {
    let envelope = serde_json::from_slice::<Envelope>(body);
    if let Ok(e) = &envelope
        && e.status == "error"
    {
        return Err(ToolError::Upstream(format!(
            "prometheus: {}: {}",
            e.error_type.as_deref().unwrap_or("error"),
            e.error.as_deref().unwrap_or("(no message)")
        )));
    }
    if !status.is_success() {
        let status_text = format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        );
        let status_text = status_text.trim_end();
        let excerpt = excerpt(body);
        return Err(ToolError::Upstream(if excerpt.is_empty() {
            format!("upstream: {status_text}")
        } else {
            format!("upstream: {status_text}: {excerpt}")
        }));
    }
    if cut {
        return Err(ToolError::Upstream(format!(
            "prometheus: the answer is larger than {} MiB; aggregate the query (e.g. sum by (namespace) (...) or topk(10, ...)), use a shorter window or a larger step",
            MAX_BODY_BYTES >> 20
        )));
    }
    let envelope = envelope.map_err(|e| {
        ToolError::Upstream(format!(
            "prometheus: the answer is not Prometheus API JSON ({e}); is the configured URL the Prometheus base URL (where /api/v1 lives)? The answer began: {}",
            excerpt(body)
        ))
    })?;
    if envelope.status != "success" {
        return Err(ToolError::Upstream(format!(
            "prometheus: unexpected status {:?}",
            envelope.status
        )));
    }
    let data = envelope
        .data
        .ok_or_else(|| ToolError::Upstream("prometheus: the answer has no data".into()))?;
    if data.result_type != "matrix" {
        return Err(ToolError::Upstream(format!(
            "prometheus: a range query answered with resultType {:?} instead of \"matrix\"",
            data.result_type
        )));
    }
    let raw: Vec<RawSeries> = if data.result.is_null() {
        Vec::new()
    } else {
        serde_json::from_value(data.result)
            .map_err(|e| ToolError::Upstream(format!("prometheus: unexpected matrix shape: {e}")))?
    };
    let series = raw
        .into_iter()
        .map(|s| Series {
            metric: s.metric,
            points: s
                .values
                .iter()
                .map(|(t, v)| ((t * 1000.0).round() as i64, parse_value(v)))
                .collect(),
            histograms: s.histograms.len(),
        })
        .collect();
    Ok(Matrix {
        series,
        warnings: envelope.warnings.unwrap_or_default(),
        infos: envelope.infos.unwrap_or_default(),
    })
}

/// A sample value as Prometheus writes it (`"1.5"`, `"NaN"`, `"+Inf"`, `"-Inf"`); anything
/// unreadable is NaN.
fn parse_value(text: &str) -> f64 {
    text.trim().parse::<f64>().unwrap_or(f64::NAN)
}

/// Unix milliseconds as Prometheus reads seconds: `1700000000`, `1700000000.5`.
fn unix(ms: i64) -> String {
    let (secs, frac) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    if frac == 0 {
        secs.to_string()
    } else {
        format!("{secs}.{frac:03}").trim_end_matches('0').to_owned()
    }
}

/// A duration in whole milliseconds (saturating).
fn millis(d: SignedDuration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// RFC 3339 of unix milliseconds.
fn rfc3339(ms: i64) -> String {
    Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ms.to_string())
}

/// A duration as the model writes it (`30s`, `2m`, `1h 30m`).
fn friendly(d: SignedDuration) -> String {
    format!("{d:#}")
}

/// `d / parts` rounded up to whole seconds.
fn ceil_secs(d: SignedDuration, parts: i64) -> i64 {
    let per = i128::from(parts.max(1)) * 1000;
    i64::try_from((d.as_millis().max(0) + per - 1) / per).unwrap_or(i64::MAX)
}

/// `get_metrics`' default step: window / 120 rounded up to whole seconds, at least 1 s.
fn default_step(window: SignedDuration) -> SignedDuration {
    SignedDuration::from_secs(ceil_secs(window, 120).max(1))
}

/// `compare_to_baseline`'s step: about 30 points in the window, at most 10 000 in the
/// baseline, at least 1 s.
fn baseline_step(window: SignedDuration, baseline: SignedDuration) -> SignedDuration {
    SignedDuration::from_secs(
        ceil_secs(window, 30)
            .max(ceil_secs(baseline, 10_000))
            .max(1),
    )
}

/// Refuses steps Prometheus refuses: under 1 ms, or over [`MAX_POINTS`] points per series.
fn check_points(window: SignedDuration, step: SignedDuration) -> Result<(), String> {
    let step_ms = millis(step);
    if step_ms < 1 {
        return Err(format!(
            "step {} is too small: use at least 1ms (usually the scrape interval, e.g. '30s')",
            friendly(step)
        ));
    }
    let points = millis(window) / step_ms;
    if points > MAX_POINTS {
        let least = SignedDuration::from_secs(ceil_secs(window, MAX_POINTS));
        return Err(format!(
            "step {} over a {} window gives {points} points per series; Prometheus allows at most {MAX_POINTS}: use a step of at least {} or a shorter window",
            friendly(step),
            friendly(window),
            friendly(least)
        ));
    }
    Ok(())
}

/// A value for JSON: a number, or Prometheus' spelling of a non-finite one.
fn value_json(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("NaN")
    } else if v > 0.0 {
        json!("+Inf")
    } else {
        json!("-Inf")
    }
}

/// The PromQL expression of `input`, checked.
fn query_arg(input: &Value) -> Result<String, ToolError> {
    let query = input["query"].as_str().unwrap_or_default().trim();
    if query.is_empty() {
        return Err(ToolError::Validation(
            "query is required: a PromQL expression such as 'sum(rate(http_requests_total[5m]))'"
                .into(),
        ));
    }
    if query.chars().count() > MAX_QUERY_CHARS {
        return Err(ToolError::Validation(format!(
            "query is longer than {MAX_QUERY_CHARS} characters"
        )));
    }
    Ok(query.to_owned())
}

/// The window of `input`, checked.
fn window_arg(input: &Value, default: &str) -> Result<window::Window, ToolError> {
    let text = match &input["window"] {
        Value::Null => default,
        Value::String(s) => s,
        _ => {
            return Err(ToolError::Validation(format!(
                "window must be {}",
                window::WINDOW_HELP
            )));
        }
    };
    window::parse(text, Timestamp::now()).map_err(ToolError::Validation)
}

/// The length of a window.
fn length(w: &window::Window) -> SignedDuration {
    w.end.duration_since(w.start)
}

/// Adds Prometheus' warnings and infos to `out`.
fn annotations(out: &mut Value, warnings: Vec<String>, infos: Vec<String>) {
    if !warnings.is_empty() {
        out["warnings"] = json!(warnings);
    }
    if !infos.is_empty() {
        out["infos"] = json!(infos);
    }
}

/// Keeps the first occurrence of each string.
fn dedup(items: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// The default and hard timeouts of a Prometheus tool's call.
const TIMEOUTS: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(300));

/// A Prometheus tool's parameters: `query` (its description showing `example`), `window`
/// (`window` says its default) and the tool's own `extra` properties.
fn parameters(example: &str, window: &str, extra: Value) -> Value {
    let mut properties = json!({
        "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
            "description": format!("PromQL expression, e.g. '{example}'.")},
        "window": {"type": "string", "maxLength": 100,
            "description": format!("{window}: {}.", window::WINDOW_HELP)},
    });
    if let (Some(properties), Value::Object(extra)) = (properties.as_object_mut(), extra) {
        properties.extend(extra);
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": ["query"],
        "additionalProperties": false
    })
}

/// `get_metrics`.
struct GetMetrics(Arc<Prometheus>);

impl Tool for GetMetrics {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_metrics".into(),
            description: concat!(
                "Run a PromQL range query against Prometheus and get, per series, its labels, statistics over every sample (count, min, max, mean, p50, p95, p99, last) and up to 60 samples picked evenly over the window. ",
                "Use it to see how a metric behaved over time, e.g. request rate, error rate, latency, CPU, memory or restarts. ",
                "Write aggregated queries, since at most 20 series are shown (those with the highest mean): ",
                "error rate `sum(rate(http_requests_total{namespace=\"shop\",code=~\"5..\"}[5m]))`, ",
                "per-pod CPU `sum by (pod) (rate(container_cpu_usage_seconds_total{namespace=\"shop\",container!=\"\"}[5m]))`, ",
                "memory `max by (pod) (container_memory_working_set_bytes{namespace=\"shop\",container!=\"\"})`, ",
                "p99 latency `histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace=\"shop\"}[5m])))`, ",
                "restarts `sum by (pod) (increase(kube_pod_container_status_restarts_total{namespace=\"shop\"}[15m]))`. ",
                "Use rate()/increase() over counters (names ending in _total), never their raw values. ",
                "NaN/Inf samples are shown as strings and left out of the statistics (their count is given). ",
                "To ask whether the current values are unusual, use compare_to_baseline."
            )
            .into(),
            parameters: parameters(
                "sum by (pod) (rate(container_cpu_usage_seconds_total{namespace=\"shop\"}[5m]))",
                "The time range (default 'last 1h')",
                json!({
                    "step": {"type": "string", "maxLength": 40,
                        "description": "Resolution, e.g. '15s', '1m', '5m' (default: the window / 120, rounded up to whole seconds). At most 11000 points per series: a 7d window needs a step of at least 55s."}
                }),
            ),
        }
    }

    fn timeouts(&self) -> (Duration, Duration) {
        TIMEOUTS
    }

    fn call(&self, _ctx: ToolContext, input: Value) -> ToolFuture {
        Box::pin(get_metrics(self.0.clone(), input))
    }
}

/// `get_metrics` with `input`.
async fn get_metrics(prometheus: Arc<Prometheus>, input: Value) -> Result<String, ToolError> {
    let query = query_arg(&input)?;
    let window = window_arg(&input, METRICS_WINDOW)?;
    let length = length(&window);
    let step = match &input["step"] {
        Value::Null => default_step(length),
        Value::String(s) => window::duration(s).map_err(|e| {
            ToolError::Validation(format!("invalid step: {e}; use e.g. '30s', '1m' or '5m'"))
        })?,
        _ => {
            return Err(ToolError::Validation(
                "step must be a string such as '30s', '1m' or '5m'".into(),
            ));
        }
    };
    check_points(length, step).map_err(ToolError::Validation)?;
    let matrix = prometheus
        .query_range(&query, window.start, window.end, step)
        .await?;
    Ok(metrics_result(&query, &window, step, matrix).to_string())
}

/// The `get_metrics` result.
fn metrics_result(query: &str, w: &window::Window, step: SignedDuration, matrix: Matrix) -> Value {
    let mut notes: Vec<String> = Vec::new();
    let mut series: Vec<(Option<Summary>, Series)> = matrix
        .series
        .into_iter()
        .map(|s| {
            let values: Vec<f64> = s.points.iter().map(|p| p.1).collect();
            (summarize(&values), s)
        })
        .collect();
    // Highest mean first; series without finite samples last.
    series.sort_by(|(a, sa), (b, sb)| match (a, b) {
        (Some(a), Some(b)) => b
            .mean
            .total_cmp(&a.mean)
            .then_with(|| sa.metric.cmp(&sb.metric)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => sa.metric.cmp(&sb.metric),
    });
    let total = series.len();
    series.truncate(MAX_SERIES);
    let per_series = if series.len() <= SAMPLE_BUDGET / MAX_SAMPLES {
        MAX_SAMPLES
    } else {
        SAMPLE_BUDGET / series.len()
    };
    let mut downsampled = false;
    let mut any_skipped = false;
    let shown: Vec<Value> = series
        .iter()
        .map(|(summary, s)| {
            let mut out = Map::new();
            out.insert("metric".into(), json!(s.metric));
            let values: Vec<f64> = s.points.iter().map(|p| p.1).collect();
            let last = s.points.iter().rev().find(|p| p.1.is_finite());
            out.insert(
                "stats".into(),
                match (summary, last) {
                    (Some(x), Some(&(at, last))) => json!({
                        "count": x.count,
                        "min": x.min,
                        "max": x.max,
                        "mean": x.mean,
                        "p50": x.p50,
                        "p95": x.p95,
                        "p99": x.p99,
                        "last": last,
                        "lastAt": rfc3339(at),
                    }),
                    _ => Value::Null,
                },
            );
            let skipped = non_finite(&values);
            if skipped > 0 {
                any_skipped = true;
                out.insert("skippedNonFinite".into(), json!(skipped));
            }
            if s.histograms > 0 {
                out.insert("histogramSamples".into(), json!(s.histograms));
            }
            let picked = downsample(s.points.len(), per_series);
            if picked.len() < s.points.len() {
                downsampled = true;
                out.insert("samplesShown".into(), json!(picked.len()));
                out.insert("samplesTotal".into(), json!(s.points.len()));
            }
            let samples: Vec<Value> = picked
                .iter()
                .filter_map(|&i| s.points.get(i))
                .map(|&(t, v)| json!([rfc3339(t), value_json(v)]))
                .collect();
            out.insert("samples".into(), Value::Array(samples));
            Value::Object(out)
        })
        .collect();
    if total == 0 {
        notes.push("the query returned no series in this window: check the metric name and the label values (e.g. query 'count by (__name__) ({namespace=\"shop\"})' to list metric names)".into());
    }
    if total > shown.len() {
        notes.push(format!(
            "{} of {total} series are left out (the {} with the highest mean are shown); aggregate, e.g. sum by (pod) (...), or use topk(10, ...)",
            total - shown.len(),
            shown.len()
        ));
    }
    if downsampled {
        notes.push(format!(
            "samples are picked evenly (at most {per_series} a series, first and last included); the stats use every sample"
        ));
    }
    if series.iter().any(|(_, s)| s.histograms > 0) {
        notes.push("native histogram samples are not summarised; use histogram_quantile() or histogram_sum()/histogram_count() to get numbers".into());
    }
    if any_skipped {
        notes.push("NaN/Inf samples are left out of the stats (see skippedNonFinite); NaN often comes from 0/0, e.g. a ratio when there was no traffic".into());
    }
    let mut out = json!({
        "query": query,
        "window": {"start": w.start.to_string(), "end": w.end.to_string()},
        "step": friendly(step),
        "stepSeconds": millis(step) as f64 / 1000.0,
        "seriesTotal": total,
        "series": shown,
    });
    if total > series.len() {
        out["seriesOmitted"] = json!(total - series.len());
    }
    annotations(&mut out, matrix.warnings, matrix.infos);
    if !notes.is_empty() {
        out["notes"] = json!(notes);
    }
    out
}

/// `compare_to_baseline`.
struct CompareToBaseline(Arc<Prometheus>);

impl Tool for CompareToBaseline {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "compare_to_baseline".into(),
            description: concat!(
                "Check whether a metric is unusual now: runs a PromQL range query over the window (default the last 15 minutes) and over the baselineHours before it (default 24), with the same step, ",
                "and gives per series (matched by identical labels) the baseline mean and standard deviation, the window mean, min and max, ",
                "and z-scores (how many baseline standard deviations the window mean, max and min are from the baseline mean). ",
                "A series is an anomaly when its largest |z| is at least threshold (default 3), or when the baseline was constant and the window differs. ",
                "Series are sorted by |z|, at most 20; maxZ is the largest |z| of all series, anomalies how many are anomalous. ",
                "Series only in the window (e.g. new pods, a new error code) or only in the baseline (gone) are listed separately. ",
                "Use a query that gives one or a few series, e.g. `sum(rate(http_requests_total{namespace=\"shop\",code=~\"5..\"}[5m]))`, ",
                "`sum by (pod) (rate(container_cpu_usage_seconds_total{namespace=\"shop\",container!=\"\"}[5m]))`, ",
                "`histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace=\"shop\"}[5m])))`. ",
                "A max-based z is sensitive to single noisy samples; a large zMean is the stronger signal. ",
                "Daily patterns make a 24 h baseline wide; compare with baselineHours 168 for weekly ones."
            )
            .into(),
            parameters: parameters(
                "sum(rate(http_requests_total{namespace=\"shop\",code=~\"5..\"}[5m]))",
                "The period to check (default 'last 15m')",
                json!({
                    "baselineHours": {"type": "integer", "minimum": 1, "maximum": 168, "default": BASELINE_HOURS,
                        "description": "Length of the baseline, which ends where the window starts."},
                    "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000, "default": THRESHOLD,
                        "description": "The |z| from which a series is an anomaly."}
                }),
            ),
        }
    }

    fn timeouts(&self) -> (Duration, Duration) {
        TIMEOUTS
    }

    fn call(&self, _ctx: ToolContext, input: Value) -> ToolFuture {
        Box::pin(compare_to_baseline(self.0.clone(), input))
    }
}

/// `compare_to_baseline` with `input`.
async fn compare_to_baseline(
    prometheus: Arc<Prometheus>,
    input: Value,
) -> Result<String, ToolError> {
    let query = query_arg(&input)?;
    let window = window_arg(&input, COMPARE_WINDOW)?;
    let hours = match &input["baselineHours"] {
        Value::Null => BASELINE_HOURS,
        v => match v.as_i64() {
            Some(h) if (1..=168).contains(&h) => h,
            _ => {
                return Err(ToolError::Validation(format!(
                    "baselineHours must be an integer from 1 to 168, not {v}"
                )));
            }
        },
    };
    let threshold = match &input["threshold"] {
        Value::Null => THRESHOLD,
        v => match v.as_f64() {
            Some(t) if t > 0.0 && t <= 1000.0 => t,
            _ => {
                return Err(ToolError::Validation(format!(
                    "threshold must be a number above 0 (at most 1000), not {v}"
                )));
            }
        },
    };
    let length = length(&window);
    let baseline_length = SignedDuration::from_hours(hours);
    let baseline_start = window.start.checked_sub(baseline_length).map_err(|e| {
        ToolError::Validation(format!("the baseline would start before year -9999: {e}"))
    })?;
    let step = baseline_step(length, baseline_length);
    check_points(length, step).map_err(ToolError::Validation)?;
    check_points(baseline_length, step).map_err(ToolError::Validation)?;
    let (current, before) = tokio::try_join!(
        prometheus.query_range(&query, window.start, window.end, step),
        prometheus.query_range(&query, baseline_start, window.start, step),
    )?;
    let baseline = window::Window {
        start: baseline_start,
        end: window.start,
    };
    let asked = Asked {
        query: &query,
        window: &window,
        baseline: &baseline,
        hours,
        step,
        threshold,
    };
    Ok(compare_result(&asked, current, before).to_string())
}

/// Baseline statistics for JSON.
fn baseline_json(s: &Option<Summary>) -> Value {
    match s {
        Some(s) => json!({
            "count": s.count, "mean": s.mean, "stddev": s.stddev,
            "min": s.min, "max": s.max, "p50": s.p50, "p99": s.p99,
        }),
        None => Value::Null,
    }
}

/// Window statistics for JSON.
fn window_json(s: &Option<Summary>) -> Value {
    match s {
        Some(s) => json!({"count": s.count, "mean": s.mean, "min": s.min, "max": s.max}),
        None => Value::Null,
    }
}

/// What a `compare_to_baseline` call asked: the query, its window and baseline, and the
/// |z| from which a series is an anomaly.
#[derive(Clone, Copy)]
struct Asked<'a> {
    query: &'a str,
    window: &'a window::Window,
    baseline: &'a window::Window,
    hours: i64,
    step: SignedDuration,
    threshold: f64,
}

/// The `compare_to_baseline` result: `current` (the window) against `before` (the baseline).
// Long because the result's JSON is built in one pass: per-series statistics, the z scores,
// the anomalies ranked and the notes on what was left out, all over the same series maps.
fn compare_result(asked: &Asked<'_>, current: Matrix, before: Matrix) -> Value {
    let window_start = asked.window.start.as_millisecond();
    let values = |points: &[(i64, f64)], keep: &dyn Fn(i64) -> bool| -> Vec<f64> {
        points.iter().filter(|p| keep(p.0)).map(|p| p.1).collect()
    };
    let mut now: BTreeMap<BTreeMap<String, String>, Vec<f64>> = BTreeMap::new();
    for s in current.series {
        now.entry(s.metric)
            .or_default()
            .extend(values(&s.points, &|t| t >= window_start));
    }
    let mut then: BTreeMap<BTreeMap<String, String>, Vec<f64>> = BTreeMap::new();
    for s in before.series {
        let v = values(&s.points, &|t| t < window_start);
        if !v.is_empty() {
            then.entry(s.metric).or_default().extend(v);
        }
    }
    let mut compared: Vec<(BTreeMap<String, String>, Comparison, usize, usize)> = Vec::new();
    let mut only_window: Vec<Value> = Vec::new();
    let mut only_baseline: Vec<Value> = Vec::new();
    for (metric, w_values) in &now {
        match then.get(metric) {
            Some(b_values) => compared.push((
                metric.clone(),
                compare(b_values, w_values, asked.threshold),
                non_finite(b_values),
                non_finite(w_values),
            )),
            None => only_window.push(json!({
                "metric": metric,
                "window": window_json(&summarize(w_values)),
            })),
        }
    }
    for (metric, b_values) in &then {
        if !now.contains_key(metric) {
            only_baseline.push(json!({
                "metric": metric,
                "baseline": baseline_json(&summarize(b_values)),
            }));
        }
    }
    compared.sort_by(|a, b| {
        b.1.rank()
            .total_cmp(&a.1.rank())
            .then_with(|| a.0.cmp(&b.0))
    });
    let anomalies = compared.iter().filter(|c| c.1.anomaly).count();
    let max_z = compared
        .iter()
        .filter_map(|c| c.1.z())
        .map(f64::abs)
        .max_by(f64::total_cmp);
    let total = compared.len();
    let series: Vec<Value> = compared
        .iter()
        .take(MAX_SERIES)
        .map(|(metric, c, b_skipped, w_skipped)| {
            let mut out = json!({
                "metric": metric,
                "baseline": baseline_json(&c.baseline),
                "window": window_json(&c.window),
                "zMean": c.z_mean.map(round3),
                "zMax": c.z_max.map(round3),
                "zMin": c.z_min.map(round3),
                "anomaly": c.anomaly,
            });
            if let Some(r) = &c.reason {
                out["reason"] = json!(r);
            }
            if b_skipped + w_skipped > 0 {
                out["skippedNonFinite"] = json!({"baseline": b_skipped, "window": w_skipped});
            }
            out
        })
        .collect();
    let mut notes: Vec<String> = Vec::new();
    if now.is_empty() && then.is_empty() {
        notes.push("the query returned no series in the window or the baseline: check the metric name and the label values".into());
    }
    if total > series.len() {
        notes.push(format!(
            "{} of {total} compared series are left out (the {} with the largest |z| are shown); anomalies and maxZ count all of them",
            total - series.len(),
            series.len()
        ));
    }
    let mut out = json!({
        "query": asked.query,
        "window": {"start": asked.window.start.to_string(), "end": asked.window.end.to_string()},
        "baseline": {"start": asked.baseline.start.to_string(), "end": asked.baseline.end.to_string(), "hours": asked.hours},
        "step": friendly(asked.step),
        "stepSeconds": millis(asked.step) as f64 / 1000.0,
        "threshold": asked.threshold,
        "maxZ": max_z.map(round3),
        "anomalies": anomalies,
        "seriesCompared": total,
        "series": series,
    });
    if total > MAX_SERIES {
        out["seriesOmitted"] = json!(total - MAX_SERIES);
    }
    for (key, list, what) in [
        (
            "onlyInWindow",
            only_window,
            "series only in the window (new since the baseline, e.g. new pods or a new error code)",
        ),
        (
            "onlyInBaseline",
            only_baseline,
            "series only in the baseline (gone in the window)",
        ),
    ] {
        if list.is_empty() {
            continue;
        }
        if list.len() > MAX_SERIES {
            notes.push(format!(
                "{} of {} {what} are left out",
                list.len() - MAX_SERIES,
                list.len()
            ));
        }
        out[key] = Value::Array(list.into_iter().take(MAX_SERIES).collect());
    }
    let warnings = dedup(
        current
            .warnings
            .into_iter()
            .chain(before.warnings)
            .collect(),
    );
    let infos = dedup(current.infos.into_iter().chain(before.infos).collect());
    annotations(&mut out, warnings, infos);
    if !notes.is_empty() {
        out["notes"] = json!(notes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_values_as_prometheus_writes_them() {
        assert_eq!(parse_value("1.5"), 1.5);
        assert_eq!(parse_value("+Inf"), f64::INFINITY);
        assert_eq!(parse_value("-Inf"), f64::NEG_INFINITY);
        assert!(parse_value("NaN").is_nan());
        assert!(parse_value("garbage").is_nan());
        assert_eq!(parse_value("1e3"), 1000.0);
        assert_eq!(value_json(f64::NAN), json!("NaN"));
        assert_eq!(value_json(f64::NEG_INFINITY), json!("-Inf"));
        assert_eq!(value_json(2.5), json!(2.5));
    }

    #[test]
    fn steps() {
        let d = SignedDuration::from_secs;
        assert_eq!(default_step(d(3600)), d(30));
        assert_eq!(default_step(d(3601)), d(31));
        assert_eq!(default_step(d(60)), d(1));
        assert_eq!(default_step(SignedDuration::from_millis(10)), d(1));
        assert_eq!(baseline_step(d(900), d(24 * 3600)), d(30));
        assert_eq!(baseline_step(d(900), d(168 * 3600)), d(61));
        assert_eq!(baseline_step(d(3600), d(3600)), d(120));
        assert!(check_points(d(7 * 86400), d(55)).is_ok());
        let err = check_points(d(7 * 86400), d(1)).err().unwrap_or_default();
        assert!(err.contains("11000") && err.contains("55s"), "{err}");
        assert!(check_points(d(60), SignedDuration::from_micros(10)).is_err());
        assert_eq!(unix(1_700_000_000_000), "1700000000");
        assert_eq!(unix(1_700_000_000_500), "1700000000.5");
        assert_eq!(unix(1_700_000_000_025), "1700000000.025");
        assert_eq!(friendly(d(30)), "30s");
    }

    #[test]
    fn answers() {
        let ok = reqwest::StatusCode::OK;
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"pod":"a"},"values":[[1700000000,"1"],[1700000030.5,"NaN"]]}]},
            "warnings":["w1"],"infos":["i1"]}"#;
        let m = parse_answer(ok, body, false).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(m.series.len(), 1);
        assert_eq!(m.series[0].points[0], (1_700_000_000_000, 1.0));
        assert_eq!(m.series[0].points[1].0, 1_700_000_030_500);
        assert_eq!(
            (m.warnings, m.infos),
            (vec!["w1".into()], vec!["i1".into()])
        );
        let bad = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
        assert_eq!(
            parse_answer(reqwest::StatusCode::BAD_REQUEST, bad, false).err(),
            Some(ToolError::Upstream(
                "prometheus: bad_data: parse error at char 5".into()
            ))
        );
        assert_eq!(
            parse_answer(reqwest::StatusCode::SERVICE_UNAVAILABLE, b"down\n", false).err(),
            Some(ToolError::Upstream(
                "upstream: 503 Service Unavailable: down".into()
            ))
        );
        let html = parse_answer(ok, b"<html>login</html>", false).err();
        assert!(matches!(html, Some(ToolError::Upstream(m)) if m.contains("/api/v1")));
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(parse_answer(ok, vector, false).is_err());
        assert!(parse_answer(ok, body, true).is_err());
    }

    #[test]
    fn base_urls() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let p = Prometheus::new("http://prom:9090/prometheus/", client.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.endpoint.as_str(),
            "http://prom:9090/prometheus/api/v1/query_range"
        );
        let p = Prometheus::new("https://prom.example", client.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.endpoint.as_str(),
            "https://prom.example/api/v1/query_range"
        );
        for bad in ["ftp://prom", "prom:9090", "http://prom/?x=1", "not a url"] {
            assert!(Prometheus::new(bad, client.clone()).is_err(), "{bad}");
        }
    }
}
