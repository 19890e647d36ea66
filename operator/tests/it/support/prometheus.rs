//! A local server speaking the Prometheus HTTP API.
//!
//! It answers `GET /prom/api/v1/query_range` with the real JSON shapes and values that are
//! a function of time: `linear` (minutes since [`T0`]), `spiky` (100 ± 2 before [`T0`], 400
//! from it), `flat` (42), `gappy` (every 4th minute `NaN`, else 10, with a warning), `many`
//! (25 series), `newpod` (one series in both periods, one only from [`T0`], one only before
//! it), `bad(` (a `bad_data` error, HTTP 400) and `down` (a text 503).

use crate::support::net::serve;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// 2027-01-15T08:00:00Z: where `spiky` jumps and `newpod`'s series change.
pub const T0: i64 = 1_800_000_000;

/// One request the server saw: its path and query parameters.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    params: BTreeMap<String, String>,
}

impl Seen {
    pub fn param(&self, name: &str) -> &str {
        self.params
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    }

    pub fn seconds(&self, name: &str) -> f64 {
        self.param(name)
            .parse()
            .unwrap_or_else(|e| panic!("{name}={:?}: {e}", self.param(name)))
    }
}

pub type Seens = Arc<Mutex<Vec<Seen>>>;

/// Prometheus' spelling of a sample value.
fn sample(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

/// A series' value at a time (unix seconds), or none.
type ValueAt = Box<dyn Fn(i64) -> Option<f64>>;

/// The series of `query`: labels and values.
fn series_of(query: &str) -> Vec<(Value, ValueAt)> {
    match query {
        "linear" => vec![(
            json!({"__name__": "linear", "job": "demo"}),
            Box::new(|t| Some((t - T0) as f64 / 60.0)),
        )],
        "spiky" => vec![(
            json!({"job": "shop"}),
            Box::new(|t| {
                Some(if t < T0 {
                    100.0 + ((t / 30) % 5) as f64 - 2.0
                } else {
                    400.0
                })
            }),
        )],
        "flat" => vec![(json!({"job": "flat"}), Box::new(|_| Some(42.0)))],
        "gappy" => vec![(
            json!({"job": "gappy"}),
            Box::new(|t| Some(if (t / 60) % 4 == 0 { f64::NAN } else { 10.0 })),
        )],
        "many" => (0..25)
            .map(|i| {
                let f: ValueAt = Box::new(move |_| Some(f64::from(i)));
                (json!({"pod": format!("p{i:02}")}), f)
            })
            .collect(),
        "newpod" => vec![
            (
                json!({"pod": "a"}),
                Box::new(|t| Some(5.0 + (t % 7) as f64)),
            ),
            (json!({"pod": "b"}), Box::new(|t| (t >= T0).then_some(1.0))),
            (json!({"pod": "c"}), Box::new(|t| (t < T0).then_some(1.0))),
        ],
        _ => Vec::new(),
    }
}

/// Answers one range query like Prometheus.
fn answer(seen: &Seen) -> Response {
    if !seen.path.ends_with("/api/v1/query_range") {
        return (StatusCode::NOT_FOUND, "404 page not found").into_response();
    }
    let query = seen.param("query");
    if query == "bad(" {
        let body = json!({"status": "error", "errorType": "bad_data",
            "error": "invalid parameter \"query\": 1:5: parse error: unclosed left parenthesis"});
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    if query == "down" {
        return (StatusCode::SERVICE_UNAVAILABLE, "maintenance\n").into_response();
    }
    let (start, end, step) = (
        seen.seconds("start"),
        seen.seconds("end"),
        seen.seconds("step"),
    );
    let times: Vec<i64> = (0..)
        .map(|k| start + step * f64::from(k))
        .take_while(|t| *t <= end + 1e-6)
        .map(|t| t.round() as i64)
        .collect();
    let result: Vec<Value> = series_of(query)
        .into_iter()
        .filter_map(|(metric, f)| {
            let values: Vec<Value> = times
                .iter()
                .filter_map(|&t| f(t).map(|v| json!([t as f64, sample(v)])))
                .collect();
            (!values.is_empty()).then(|| json!({"metric": metric, "values": values}))
        })
        .collect();
    let mut body = json!({"status": "success", "data": {"resultType": "matrix", "result": result}});
    if query == "gappy" {
        body["warnings"] = json!(["gappy data: some samples are NaN"]);
    }
    axum::Json(body).into_response()
}

/// A local Prometheus under the path prefix `/prom`; every request is recorded.
pub async fn server() -> (String, Seens) {
    let seen: Seens = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let record = record.clone();
        async move {
            let params =
                url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
                    .into_owned()
                    .collect();
            let s = Seen {
                path: req.uri().path().to_owned(),
                params,
            };
            if let Ok(mut all) = record.lock() {
                all.push(s.clone());
            }
            answer(&s)
        }
    });
    let url = serve(app).await;
    (format!("{url}/prom/"), seen)
}
