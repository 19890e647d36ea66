//! The audit log (`decisions`): who did what, when and with what outcome.

use super::models::*;
use super::repo::{ROWS_PER_INSERT, json_col, json_text, numbered, values_clause};
use super::{Store, StoreError, new_id, now_ms};
use serde_json::Value;
use sqlx::Row;

/// The audit log.
impl Store {
    /// Records one audit row.
    pub async fn record_decision(&self, new: &NewDecision) -> Result<DecisionRecord, StoreError> {
        self.traced("INSERT decisions", async move {
            let mut conn = self.pool.acquire().await?;
            insert_decision(&mut conn, new).await
        })
        .await
    }

    /// A page of audit rows, newest first. Pass the last row's `(at, id)` as `before` for
    /// the next page.
    pub async fn list_decisions(
        &self,
        q: &DecisionQuery,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        self.traced("SELECT decisions", async move {
            let (before_at, before_id) = q.before.clone().unwrap_or((i64::MAX, String::new()));
            let rows = sqlx::query(
                "SELECT id, at, kind, namespace, session_id, run_id, user_name, policy, subject, outcome, detail, trace_id FROM decisions \
                 WHERE at >= $1 AND ($2 = '' OR session_id = $2) AND ($3 = '' OR kind = $3) \
                   AND (at < $4 OR (at = $4 AND ($5 = '' OR id < $5))) \
                 ORDER BY at DESC, id DESC LIMIT $6",
            )
            .bind(q.since.unwrap_or(0))
            .bind(q.session_id.clone().unwrap_or_default())
            .bind(q.kind.clone().unwrap_or_default())
            .bind(before_at)
            .bind(before_id)
            .bind(q.limit.clamp(1, 1000))
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|row| {
                    Ok(DecisionRecord {
                        id: row.try_get("id")?,
                        at: row.try_get("at")?,
                        kind: row.try_get("kind")?,
                        namespace: row.try_get("namespace")?,
                        session_id: row.try_get("session_id")?,
                        run_id: row.try_get("run_id")?,
                        user: row.try_get("user_name")?,
                        policy: row.try_get("policy")?,
                        subject: row.try_get("subject")?,
                        outcome: row.try_get("outcome")?,
                        detail: json_col(row, "detail")?,
                        trace_id: row.try_get("trace_id")?,
                    })
                })
                .collect()
        })
        .await
    }
}

/// Inserts an audit row.
pub(super) async fn insert_decision(
    conn: &mut sqlx::AnyConnection,
    new: &NewDecision,
) -> Result<DecisionRecord, StoreError> {
    let record = DecisionRecord {
        id: new_id(),
        at: now_ms(),
        kind: new.kind.clone(),
        namespace: new.namespace.clone(),
        session_id: new.session_id.clone(),
        run_id: new.run_id.clone(),
        user: new.user.clone(),
        policy: new.policy.clone(),
        subject: new.subject.clone(),
        outcome: new.outcome.clone(),
        detail: if new.detail.is_null() {
            Value::Object(Default::default())
        } else {
            new.detail.clone()
        },
        trace_id: new
            .trace_id
            .clone()
            .or_else(crate::telemetry::trace::current_trace_id),
    };
    sqlx::query(
        "INSERT INTO decisions (id, at, kind, namespace, session_id, run_id, user_name, policy, subject, outcome, detail, trace_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&record.id)
    .bind(record.at)
    .bind(&record.kind)
    .bind(&record.namespace)
    .bind(&record.session_id)
    .bind(&record.run_id)
    .bind(&record.user)
    .bind(&record.policy)
    .bind(&record.subject)
    .bind(&record.outcome)
    .bind(json_text(&record.detail))
    .bind(&record.trace_id)
    .execute(&mut *conn)
    .await?;
    Ok(record)
}

/// Inserts audit rows, many per statement.
pub(super) async fn insert_decisions(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    news: &[&NewDecision],
) -> Result<(), StoreError> {
    for part in news.chunks(ROWS_PER_INSERT) {
        let sql = format!(
            "INSERT INTO decisions (id, at, kind, namespace, session_id, run_id, user_name, policy, subject, outcome, detail, trace_id){}",
            values_clause(numbered(tx), part.len(), 12)
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for new in part {
            let detail = if new.detail.is_null() {
                Value::Object(Default::default())
            } else {
                new.detail.clone()
            };
            q = q
                .bind(new_id())
                .bind(now_ms())
                .bind(new.kind.clone())
                .bind(new.namespace.clone())
                .bind(new.session_id.clone())
                .bind(new.run_id.clone())
                .bind(new.user.clone())
                .bind(new.policy.clone())
                .bind(new.subject.clone())
                .bind(new.outcome.clone())
                .bind(json_text(&detail))
                .bind(
                    new.trace_id
                        .clone()
                        .or_else(crate::telemetry::trace::current_trace_id),
                );
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}
