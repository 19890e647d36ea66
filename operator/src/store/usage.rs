//! Usage and spend: one row per provider call, rolled up per day as it is recorded, and
//! the reports read from the roll-ups.

use super::models::*;
use super::repo::{ROWS_PER_INSERT, numbered, utc_day, values_clause};
use super::{Store, StoreError, new_id};
use sqlx::Row;

/// The sum of `rows`.
pub fn usage_total(rows: &[UsageRow]) -> UsageRow {
    rows.iter().fold(
        UsageRow {
            key: "total".into(),
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            estimated_requests: 0,
        },
        |mut t, r| {
            t.estimated_requests += r.estimated_requests;
            t.requests += r.requests;
            t.input_tokens += r.input_tokens;
            t.output_tokens += r.output_tokens;
            t.cost_usd += r.cost_usd;
            t
        },
    )
}

/// Usage and spend.
impl Store {
    /// Records one provider call and adds it to the day's roll-up in the same transaction,
    /// so reports read `usage_daily` and never scan the events.
    pub async fn record_usage(&self, u: &UsageEvent) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        insert_usage(&mut tx, &[u]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Spend of `policy` per UTC day and provider since `since_day` (for charts).
    pub async fn policy_spend_by_day(
        &self,
        policy: &str,
        since_day: &str,
    ) -> Result<Vec<(String, String, f64)>, StoreError> {
        let rows: Vec<(String, String, f64)> = sqlx::query_as(
            "SELECT day, provider, CAST(SUM(cost_usd) AS DOUBLE PRECISION) FROM usage_daily \
             WHERE policy = $1 AND day >= $2 GROUP BY day, provider ORDER BY day, provider",
        )
        .bind(policy)
        .bind(since_day)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Usage since `since_day` (`YYYY-MM-DD`, inclusive), grouped, largest spend first.
    pub async fn usage_summary(
        &self,
        since_day: &str,
        group: UsageGroup,
    ) -> Result<Vec<UsageRow>, StoreError> {
        self.traced("SELECT usage_daily", async move {
            let sql = match group {
                UsageGroup::Provider => USAGE_BY_PROVIDER,
                UsageGroup::Model => USAGE_BY_MODEL,
                UsageGroup::User => USAGE_BY_USER,
                UsageGroup::Policy => USAGE_BY_POLICY,
                UsageGroup::Day => USAGE_BY_DAY,
            };
            let stmt = sqlx::query(sql).bind(since_day);
            self.all(stmt, |row| {
                Ok(from_row!(row => UsageRow {
                    key as "k", requests, input_tokens, output_tokens, cost_usd, estimated_requests,
                }))
            })
            .await
        })
        .await
    }
}

/// Inserts usage events (many per statement) and adds them to their days' roll-ups,
/// summed per roll-up row first: one upsert per day, policy, provider, model and user.
pub(super) async fn insert_usage(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    events: &[&UsageEvent],
) -> Result<(), StoreError> {
    for part in events.chunks(ROWS_PER_INSERT) {
        let sql = format!(
            "INSERT INTO usage_events (id, at, day, source, policy, session_id, user_name, provider, model, \
             input_tokens, output_tokens, cost_usd, latency_ms, outcome, estimated){}",
            values_clause(numbered(tx), part.len(), 15)
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for u in part {
            q = q
                .bind(new_id())
                .bind(u.at)
                .bind(utc_day(u.at))
                .bind(u.source.clone())
                .bind(u.policy.clone())
                .bind(u.session_id.clone())
                .bind(u.user.clone())
                .bind(u.provider.clone())
                .bind(u.model.clone())
                .bind(u.input_tokens)
                .bind(u.output_tokens)
                .bind(u.cost_usd)
                .bind(u.latency_ms)
                .bind(u.outcome.clone())
                .bind(u.estimated);
        }
        q.execute(&mut **tx).await?;
    }
    // (day, policy, provider, model, user) -> (requests, input, output, cost, estimated)
    type DailyKey<'a> = (String, &'a str, &'a str, &'a str, &'a str);
    let mut daily: std::collections::BTreeMap<DailyKey<'_>, (i64, i64, i64, f64, i64)> =
        Default::default();
    for u in events {
        let row = daily
            .entry((
                utc_day(u.at),
                u.policy.as_str(),
                u.provider.as_str(),
                u.model.as_str(),
                u.user.as_str(),
            ))
            .or_default();
        row.0 += 1;
        row.1 += u.input_tokens;
        row.2 += u.output_tokens;
        row.3 += u.cost_usd;
        row.4 += i64::from(u.estimated);
    }
    for ((day, policy, provider, model, user), (requests, input, output, cost, estimated)) in daily
    {
        sqlx::query(concat!(
            "INSERT INTO usage_daily (day, policy, provider, model, user_name, requests, input_tokens, output_tokens, cost_usd, estimated_requests) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            usage_daily_add!()
        ))
        .bind(day)
        .bind(policy)
        .bind(provider)
        .bind(model)
        .bind(user)
        .bind(requests)
        .bind(input)
        .bind(output)
        .bind(cost)
        .bind(estimated)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

macro_rules! usage_by {
    ($col:literal) => {
        concat!(
            "SELECT ",
            $col,
            " AS k, CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, CAST(SUM(cost_usd) AS DOUBLE PRECISION) AS cost_usd, \
             CAST(SUM(estimated_requests) AS BIGINT) AS estimated_requests \
             FROM usage_daily WHERE day >= $1 GROUP BY ",
            $col,
            " ORDER BY cost_usd DESC, k"
        )
    };
}
const USAGE_BY_PROVIDER: &str = usage_by!("provider");
const USAGE_BY_MODEL: &str = usage_by!("model");
const USAGE_BY_USER: &str = usage_by!("user_name");
const USAGE_BY_POLICY: &str = usage_by!("policy");
const USAGE_BY_DAY: &str = usage_by!("day");
