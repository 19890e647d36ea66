//! Eval results (`kortex eval --record`, `docs/evals.md#history`) and what an eval reads
//! back about its own sessions (their provider usage); and the responses the gateway's
//! `/v1/responses` keeps.

use super::{AnyQuery, Store, StoreError, new_id, now_ms};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;

/// The 95 % Wilson score interval of `passed` out of `n`.
pub fn wilson(passed: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = 1.959_963_984_540_054_f64;
    let n = n as f64;
    let p = passed as f64 / n;
    let denom = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denom;
    let half = z * ((p * (1.0 - p) / n) + z * z / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The recorded result of one configuration in one eval.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalRun {
    /// Id.
    pub id: String,
    /// Unix ms.
    pub at: i64,
    /// What ran: a policy `NS/NAME`, or `provider/model`.
    pub label: String,
    /// `policy`, `provider` or `manifests`.
    pub kind: String,
    /// The scenarios folder's name.
    pub suite: String,
    /// Scenarios run.
    pub scenarios: i64,
    /// Attempts (scenarios × repeats).
    pub attempts: i64,
    /// Attempts that passed.
    pub passed: i64,
    /// Tokens sent.
    pub input_tokens: i64,
    /// Tokens received.
    pub output_tokens: i64,
    /// Spend.
    pub cost_usd: f64,
    /// The configuration's whole report (`docs/evals.md#the-report`).
    pub report: Value,
}

/// A session's provider calls, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionUsage {
    /// Provider calls.
    pub calls: i64,
    /// Tokens sent.
    pub input_tokens: i64,
    /// Tokens received.
    pub output_tokens: i64,
    /// Spend.
    pub cost_usd: f64,
}

impl Store {
    /// Stores an eval result (a new id and time are given to it).
    pub async fn record_eval(&self, run: &EvalRun) -> Result<EvalRun, StoreError> {
        let mut stored = run.clone();
        stored.id = new_id();
        stored.at = now_ms();
        sqlx::query(
            "INSERT INTO eval_runs (id, at, label, kind, suite, scenarios, attempts, passed, input_tokens, output_tokens, cost_usd, report) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&stored.id)
        .bind(stored.at)
        .bind(&stored.label)
        .bind(&stored.kind)
        .bind(&stored.suite)
        .bind(stored.scenarios)
        .bind(stored.attempts)
        .bind(stored.passed)
        .bind(stored.input_tokens)
        .bind(stored.output_tokens)
        .bind(stored.cost_usd)
        .bind(stored.report.to_string())
        .execute(&self.pool)
        .await?;
        Ok(stored)
    }

    /// Eval results since `since_ms`, oldest first; only `label`'s when given. With
    /// `reports: false` the whole reports are left out (`report` is null).
    pub async fn list_evals(
        &self,
        since_ms: i64,
        label: Option<&str>,
        reports: bool,
        limit: i64,
    ) -> Result<Vec<EvalRun>, StoreError> {
        let stmt = sqlx::query(
            "SELECT id, at, label, kind, suite, scenarios, attempts, passed, input_tokens, output_tokens, \
             CAST(cost_usd AS DOUBLE PRECISION) AS cost_usd, CASE WHEN $3 = 1 THEN report ELSE 'null' END AS report \
             FROM eval_runs WHERE at >= $1 AND ($2 = '' OR label = $2) ORDER BY at, id LIMIT $4",
        )
        .bind(since_ms)
        .bind(label.unwrap_or(""))
        .bind(i64::from(reports))
        .bind(limit.clamp(1, 10_000));
        self.all(stmt, |row| {
                let report: String = row.try_get("report")?;
                Ok(from_row!(row => EvalRun {
                    id, at, label, kind, suite, scenarios, attempts, passed, input_tokens,
                    output_tokens, cost_usd, report = serde_json::from_str(&report).unwrap_or(Value::Null),
                }))
            }).await
    }

    /// The provider calls of a session, summed.
    pub async fn session_usage(&self, session_id: &str) -> Result<SessionUsage, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS calls, CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
             CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
             CAST(COALESCE(SUM(cost_usd), 0) AS DOUBLE PRECISION) AS cost_usd \
             FROM usage_events WHERE session_id = $1",
        )
        .bind(session_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(from_row!(row => SessionUsage { calls, input_tokens, output_tokens, cost_usd }))
    }
}

/// Responses kept by the gateway's `/v1/responses` (`docs/gateway.md#responses`).
impl Store {
    /// Keeps a response and its conversation, for the key's `namespace` and `team`.
    pub async fn keep_response(
        &self,
        id: &str,
        namespace: &str,
        team: &str,
        conversation: &Value,
        response: &Value,
    ) -> Result<(), StoreError> {
        self.traced("INSERT gateway_responses", async move {
            sqlx::query(
                "INSERT INTO gateway_responses (id, namespace, team, created_at, conversation, response) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id)
            .bind(namespace)
            .bind(team)
            .bind(now_ms())
            .bind(conversation.to_string())
            .bind(response.to_string())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    /// A kept response of that `namespace` and `team`: its conversation and the response.
    pub async fn kept_response(
        &self,
        id: &str,
        namespace: &str,
        team: &str,
    ) -> Result<Option<(Value, Value)>, StoreError> {
        self.traced("SELECT gateway_responses", async move {
            let row = kept("SELECT conversation, response", (id, namespace, team))
                .fetch_optional(&self.pool)
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let conversation: String = row.try_get("conversation")?;
            let response: String = row.try_get("response")?;
            Ok(Some((
                serde_json::from_str(&conversation).unwrap_or(Value::Null),
                serde_json::from_str(&response).unwrap_or(Value::Null),
            )))
        })
        .await
    }

    /// Deletes a kept response of that `namespace` and `team`; whether there was one.
    pub async fn forget_response(
        &self,
        id: &str,
        namespace: &str,
        team: &str,
    ) -> Result<bool, StoreError> {
        let done = kept("DELETE", (id, namespace, team))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes the kept responses created before `before_ms`; how many.
    pub async fn prune_responses(&self, before_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM gateway_responses WHERE created_at < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

/// `verb` (`SELECT columns`, `DELETE`) on the kept response `(id, namespace, team)`.
fn kept<'q>(verb: &str, (id, namespace, team): (&'q str, &'q str, &'q str)) -> AnyQuery<'q> {
    let sql =
        format!("{verb} FROM gateway_responses WHERE id = $1 AND namespace = $2 AND team = $3");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(namespace)
        .bind(team)
}
