//! The audit log (`decisions`): who did what, when and with what outcome.

use super::models::*;
use super::repo::{ROWS_PER_INSERT, json_col, json_text, numbered, values_clause};
use super::{AnyQuery, Store, StoreError, new_id, now_ms};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

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
            let stmt = sqlx::query(
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
            .bind(q.limit.clamp(1, 1000));
            self.all(stmt, decision_row).await
        })
        .await
    }
}

fn decision_row(row: &AnyRow) -> Result<DecisionRecord, StoreError> {
    Ok(from_row!(row => DecisionRecord {
        id, at, kind, namespace, session_id, run_id, user as "user_name", policy, subject, outcome,
        detail = json_col(row, "detail")?, trace_id,
    }))
}

/// The columns of an audit row, in the order [`bind_decision`] binds them.
const DECISION_COLUMNS: &str = "decisions (id, at, kind, namespace, session_id, run_id, user_name, policy, subject, outcome, detail, trace_id)";

/// The row `new` becomes: a new id, now, an empty object for no detail, and the current
/// trace when it names none.
fn decision_record(new: &NewDecision) -> DecisionRecord {
    DecisionRecord {
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
    }
}

/// Binds the values of one audit row.
fn bind_decision<'q>(q: AnyQuery<'q>, r: &DecisionRecord) -> AnyQuery<'q> {
    q.bind(r.id.clone())
        .bind(r.at)
        .bind(r.kind.clone())
        .bind(r.namespace.clone())
        .bind(r.session_id.clone())
        .bind(r.run_id.clone())
        .bind(r.user.clone())
        .bind(r.policy.clone())
        .bind(r.subject.clone())
        .bind(r.outcome.clone())
        .bind(json_text(&r.detail))
        .bind(r.trace_id.clone())
}

/// Inserts an audit row.
pub(super) async fn insert_decision(
    conn: &mut sqlx::AnyConnection,
    new: &NewDecision,
) -> Result<DecisionRecord, StoreError> {
    let record = decision_record(new);
    let sql = format!(
        "INSERT INTO {DECISION_COLUMNS}{}",
        values_clause(true, 1, 12)
    );
    bind_decision(sqlx::query(sqlx::AssertSqlSafe(sql)), &record)
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
            "INSERT INTO {DECISION_COLUMNS}{}",
            values_clause(numbered(tx), part.len(), 12)
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for new in part {
            q = bind_decision(q, &decision_record(new));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}
