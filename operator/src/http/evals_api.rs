//! `GET /api/v1/evals?since=&label=&reports=`: the results `kortex eval --record` stored —
//! pass rate over time per policy or model, for the dashboard's Evals page. Answers quoted
//! in reports may carry cluster data: like usage, for admins (`kortex-admins`, or RBAC
//! `get` on `/kortex/evals`).

use super::AppState;
use super::access::{ApiQuery, admins_only};
use super::auth::Caller;
use super::error::ApiError;
use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

/// Query of `GET /api/v1/evals`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalsQuery {
    /// First day: `YYYY-MM-DD`, an RFC 3339 time or a look-back such as `90d` (default
    /// `90d`).
    since: Option<String>,
    /// Only this configuration (`NS/NAME` or `provider/model`).
    label: Option<String>,
    /// `true`: each item carries its whole report (per scenario, with failure reasons).
    reports: Option<bool>,
}

/// `GET /api/v1/evals`.
pub async fn evals(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<EvalsQuery>,
) -> Result<Json<Value>, ApiError> {
    admins_only(&state, &caller, "eval results", "get", "/kortex/evals").await?;
    let day =
        super::usage_api::parse_since(q.since.as_deref().unwrap_or("90d"), jiff::Timestamp::now())
            .map_err(ApiError::invalid)?;
    let since_ms = format!("{day}T00:00:00Z")
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(0);
    let reports = q.reports.unwrap_or(false);
    let runs = state
        .store
        .list_evals(since_ms, q.label.as_deref(), reports, 5000)
        .await
        .map_err(ApiError::from)?;
    let items: Vec<Value> = runs
        .iter()
        .map(|r| {
            let (lo, hi) = crate::store::wilson(r.passed.max(0) as u64, r.attempts.max(0) as u64);
            let rate = if r.attempts > 0 { r.passed as f64 / r.attempts as f64 } else { 0.0 };
            let mut v = json!({
                "id": r.id, "at": super::access::ms_to_rfc3339(r.at), "label": r.label, "kind": r.kind,
                "suite": r.suite, "scenarios": r.scenarios, "attempts": r.attempts, "passed": r.passed,
                "passRate": rate, "interval": [lo, hi],
                "inputTokens": r.input_tokens, "outputTokens": r.output_tokens, "costUsd": r.cost_usd,
            });
            if reports {
                v["report"] = r.report.clone();
            }
            v
        })
        .collect();
    Ok(Json(json!({"since": day, "items": items})))
}
