//! `GET /api/v1/usage?since=&by=`: usage and spend from the daily roll-ups (never a scan of
//! the usage events), grouped for tables and charts.

use super::AppState;
use super::access::{ApiQuery, admins_only};
use super::auth::Caller;
use super::error::ApiError;
use crate::store::UsageGroup;
use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

/// Query of `GET /api/v1/usage`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// First UTC day: `YYYY-MM-DD`, an RFC 3339 time, or a look-back such as `7d` or `24h`
    /// (default `7d`: today and the six days before).
    since: Option<String>,
    /// `provider`, `model`, `user`, `policy` or `day` (default `day`).
    by: Option<String>,
}

/// Parses a `by` value.
pub fn parse_group(by: &str) -> Result<UsageGroup, String> {
    Ok(match by {
        "provider" => UsageGroup::Provider,
        "model" => UsageGroup::Model,
        "user" => UsageGroup::User,
        "policy" => UsageGroup::Policy,
        "day" => UsageGroup::Day,
        other => {
            return Err(format!(
                "by={other:?} is not one of provider, model, user, policy, day"
            ));
        }
    })
}

/// The first UTC day (`YYYY-MM-DD`) of a `since` value, relative to `now`.
pub fn parse_since(since: &str, now: jiff::Timestamp) -> Result<String, String> {
    let since = since.trim();
    if let Ok(date) = since.parse::<jiff::civil::Date>() {
        return Ok(date.to_string());
    }
    if let Ok(t) = since.parse::<jiff::Timestamp>() {
        return Ok(crate::store::utc_day(t.as_millisecond()));
    }
    let look_back = crate::tools::window::duration(since).map_err(|_| {
        format!("since={since:?} is neither a date (2026-11-01), an RFC 3339 time nor a look-back such as 7d")
    })?;
    // Whole UTC days: "7d" covers today and the six days before, "1d" and "24h" today.
    let start = now.as_millisecond() - (look_back.as_millis() as i64 - 86_400_000).max(0);
    Ok(crate::store::utc_day(start))
}

/// `GET /api/v1/usage`.
pub async fn usage(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<Value>, ApiError> {
    admins_only(
        &state,
        &caller,
        "usage across users",
        "get",
        "/kortex/usage",
    )
    .await?;
    let by = q.by.as_deref().unwrap_or("day");
    let group = parse_group(by).map_err(ApiError::invalid)?;
    let since = parse_since(q.since.as_deref().unwrap_or("7d"), jiff::Timestamp::now())
        .map_err(ApiError::invalid)?;
    let rows = state
        .store
        .usage_summary(&since, group)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({
        "since": since,
        "by": by,
        "totals": crate::store::usage_total(&rows),
        "items": rows,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_dates_times_and_look_backs() {
        let now: jiff::Timestamp = "2026-11-23T07:00:00Z"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parse_since("2026-11-01", now), Ok("2026-11-01".into()));
        assert_eq!(
            parse_since("2026-11-20T23:30:00Z", now),
            Ok("2026-11-20".into())
        );
        assert_eq!(parse_since("7d", now), Ok("2026-11-17".into()));
        assert_eq!(parse_since("1d", now), Ok("2026-11-23".into()));
        assert!(parse_since("yesterday", now).is_err());
        assert!(parse_group("team").is_err());
    }
}
