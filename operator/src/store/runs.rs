//! Run control in the database, the only coordination between replicas: a pause asked of a
//! run (`running → pausing`), the run parking itself at its next step boundary
//! (`pausing → paused`), resuming on any replica (`paused → running`), and redirects kept
//! until the run consumes them, exactly once, into its transcript.

use super::models::{MessageRecord, NewMessage};
use super::{Store, StoreError, new_id, now_ms};
use sqlx::Row;

/// A run as run control sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// Id.
    pub id: String,
    /// Its session.
    pub session_id: String,
    /// `running`, `pausing`, `paused`, `cancelling`, `requires_action`, `completed`,
    /// `failed` or `cancelled`.
    pub status: String,
    /// When it parked, if it is paused.
    pub paused_at: Option<i64>,
}

impl Store {
    /// A run.
    pub async fn run_record(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let row =
            sqlx::query("SELECT id, session_id, status, paused_at FROM chat_runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| {
            Ok(RunRecord {
                id: r.try_get("id")?,
                session_id: r.try_get("session_id")?,
                status: r.try_get("status")?,
                paused_at: r.try_get("paused_at")?,
            })
        })
        .transpose()
    }

    /// Moves a run from `from` to `to` if it is still in `from`. Returns whether it moved.
    pub async fn transition_run(
        &self,
        run_id: &str,
        from: &str,
        to: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE chat_runs SET status = $1 WHERE id = $2 AND status = $3")
            .bind(to)
            .bind(run_id)
            .bind(from)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// A run asked to pause parks at its step boundary: no task holds it any more.
    pub async fn park_run(&self, run_id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE chat_runs SET status = 'paused', paused_at = $1 WHERE id = $2 AND status = 'pausing'",
        )
        .bind(now_ms())
        .bind(run_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// A parked run goes on, executed by `owner`.
    pub async fn unpark_run(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE chat_runs SET status = 'running', owner = $1, heartbeat_at = $2, paused_at = NULL \
             WHERE id = $3 AND status = 'paused'",
        )
        .bind(owner)
        .bind(now_ms())
        .bind(run_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Runs parked before `before` (Unix ms): `(run id, session id, policy)`.
    pub async fn paused_before(
        &self,
        before: i64,
    ) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, session_id, policy FROM chat_runs WHERE status = 'paused' AND paused_at < $1 LIMIT 1000",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("id")?,
                    r.try_get("session_id")?,
                    r.try_get("policy")?,
                ))
            })
            .collect()
    }

    /// Keeps a redirect for the run to consume at its next step boundary.
    pub async fn add_redirect(
        &self,
        run_id: &str,
        session_id: &str,
        user: &str,
        message: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        sqlx::query(
            "INSERT INTO run_intents (id, run_id, session_id, kind, message, user_name, created_at) \
             VALUES ($1, $2, $3, 'redirect', $4, $5, $6)",
        )
        .bind(&id)
        .bind(run_id)
        .bind(session_id)
        .bind(message)
        .bind(user)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// The run's redirects not yet consumed, in the order they were made, each marked
    /// consumed and appended to the transcript as a user turn in one transaction: none is
    /// lost, none is applied twice, whichever replica runs the run.
    pub async fn consume_redirects(
        &self,
        session_id: &str,
        run_id: &str,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(
            "SELECT id, message FROM run_intents WHERE run_id = $1 AND consumed_at IS NULL \
             ORDER BY created_at, id",
        )
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = Vec::new();
        for row in rows {
            let id: String = row.try_get("id")?;
            let message: String = row.try_get("message")?;
            let taken = sqlx::query(
                "UPDATE run_intents SET consumed_at = $1 WHERE id = $2 AND consumed_at IS NULL",
            )
            .bind(now_ms())
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            if taken.rows_affected() == 0 {
                continue;
            }
            let new = NewMessage {
                run_id: Some(run_id.to_owned()),
                role: "user".into(),
                content: message,
                ..Default::default()
            };
            out.push(super::repo::insert_message(&mut tx, session_id, &new).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}
