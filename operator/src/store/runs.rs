//! Run control in the database, the only coordination between replicas: a pause asked of a
//! run (`running → pausing`), the run parking itself at its next step boundary
//! (`pausing → paused`), resuming on any replica (`paused → running`), and redirects kept
//! until the run consumes them, exactly once, into its transcript.

use super::models::{MessageRecord, NewMessage};
use super::{Store, StoreError, new_id, now_ms};
use sqlx::Row;

/// The state of a run: `chat_runs.status`, and the `state` of `run.lifecycle` events and
/// of run control's answers (the serde names are those strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Taking steps.
    Running,
    /// Asked to pause: parks at its next step boundary.
    Pausing,
    /// Parked; any replica may resume it.
    Paused,
    /// Parked until a person decides its plan.
    AwaitingPlan,
    /// Waiting for a client's tool results.
    RequiresAction,
    /// Asked to stop; its owner ends it.
    Cancelling,
    /// Ended with an answer.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended by a person (or a timeout).
    Cancelled,
}

impl RunState {
    /// Every state.
    pub const ALL: [Self; 9] = [
        Self::Running,
        Self::Pausing,
        Self::Paused,
        Self::AwaitingPlan,
        Self::RequiresAction,
        Self::Cancelling,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// As stored and sent.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Pausing => "pausing",
            Self::Paused => "paused",
            Self::AwaitingPlan => "awaiting_plan",
            Self::RequiresAction => "requires_action",
            Self::Cancelling => "cancelling",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// An ended run: it takes no control.
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored run state, or a decode error naming it.
pub(crate) fn run_state(s: &str) -> Result<RunState, StoreError> {
    RunState::parse(s).ok_or_else(|| {
        StoreError::from(sqlx::Error::Decode(
            format!("chat_runs.status {s:?} is not a run state").into(),
        ))
    })
}

/// A run as run control sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// Id.
    pub id: String,
    /// Its session.
    pub session_id: String,
    /// Its state.
    pub status: RunState,
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
            Ok(from_row!(r => RunRecord {
                id, session_id, status = run_state(&r.try_get::<String, _>("status")?)?, paused_at,
            }))
        })
        .transpose()
    }

    /// Moves a run from `from` to `to` if it is still in `from`. Returns whether it moved.
    pub async fn transition_run(
        &self,
        run_id: &str,
        from: RunState,
        to: RunState,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query("UPDATE chat_runs SET status = $1 WHERE id = $2 AND status = $3")
            .bind(to.as_str())
            .bind(run_id)
            .bind(from.as_str());
        self.changed(stmt).await
    }

    /// A run asked to pause parks at its step boundary: no task holds it any more.
    pub async fn park_run(&self, run_id: &str) -> Result<bool, StoreError> {
        self.park(
            run_id,
            "UPDATE chat_runs SET status = 'paused', paused_at = $1 WHERE id = $2 AND status = 'pausing'",
        )
        .await
    }

    /// Runs `sql`, a parking of `run_id` (`$1` the time it parks, `$2` the run).
    async fn park(&self, run_id: &str, sql: &'static str) -> Result<bool, StoreError> {
        self.changed(sqlx::query(sql).bind(now_ms()).bind(run_id))
            .await
    }

    /// A run that stated a plan parks until a person decides it.
    pub async fn park_for_plan(&self, run_id: &str) -> Result<bool, StoreError> {
        self.park(
            run_id,
            "UPDATE chat_runs SET status = 'awaiting_plan', paused_at = $1 WHERE id = $2 AND status = 'running'",
        )
        .await
    }

    /// A paused run goes on, executed by `owner`.
    pub async fn unpark_run(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
        self.take_run(run_id, RunState::Paused, owner).await
    }

    /// A run parked in `from` (`paused`, `awaiting_plan`) goes on, executed by `owner`.
    pub async fn take_run(
        &self,
        run_id: &str,
        from: RunState,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE chat_runs SET status = 'running', owner = $1, heartbeat_at = $2, paused_at = NULL \
             WHERE id = $3 AND status = $4",
        )
        .bind(owner)
        .bind(now_ms())
        .bind(run_id)
        .bind(from.as_str());
        self.changed(stmt).await
    }

    /// Runs parked (paused, or waiting on their plan) before `before` (Unix ms): `(run id,
    /// session id, policy)`.
    pub async fn paused_before(
        &self,
        before: i64,
    ) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
        let stmt = sqlx::query(
            "SELECT id, session_id, policy FROM chat_runs WHERE status IN ('paused', 'awaiting_plan') AND paused_at < $1 LIMIT 1000",
        )
        .bind(before);
        self.all(stmt, |r| {
            Ok((
                r.try_get("id")?,
                r.try_get("session_id")?,
                r.try_get("policy")?,
            ))
        })
        .await
    }

    /// Keeps a redirect for the run to consume at its next step boundary; with `rewind_to`,
    /// the steps after that one are superseded first.
    pub async fn add_redirect(
        &self,
        run_id: &str,
        session_id: &str,
        user: &str,
        message: &str,
        rewind_to: Option<i64>,
    ) -> Result<String, StoreError> {
        let id = new_id();
        sqlx::query(
            "INSERT INTO run_intents (id, run_id, session_id, kind, message, rewind_to, user_name, created_at) \
             VALUES ($1, $2, $3, 'redirect', $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(run_id)
        .bind(session_id)
        .bind(message)
        .bind(rewind_to)
        .bind(user)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// Whether the run has a redirect not yet consumed.
    pub async fn redirect_pending(&self, run_id: &str) -> Result<bool, StoreError> {
        let pending = sqlx::query(
            "SELECT 1 FROM run_intents WHERE run_id = $1 AND consumed_at IS NULL LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(pending.is_some())
    }

    /// The run's redirects not yet consumed, in the order they were made, each marked
    /// consumed and appended to the transcript as a user turn in one transaction: none is
    /// lost, none is applied twice, whichever replica runs the run.
    pub async fn consume_redirects(
        &self,
        session_id: &str,
        run_id: &str,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        // Every step boundary asks; almost always there is nothing, and a read answers that
        // without taking the write lock (SQLite) a transaction would.
        if !self.redirect_pending(run_id).await? {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let rows = sqlx::query(
            "SELECT id, message, rewind_to FROM run_intents WHERE run_id = $1 AND consumed_at IS NULL \
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
            // Rewound: everything of the run from step `n + 1` on (its assistant message and
            // what followed) stays in the transcript, marked superseded.
            if let Some(n) = row.try_get::<Option<i64>, _>("rewind_to")? {
                let cut: Option<i64> = sqlx::query(
                    "SELECT seq FROM chat_messages WHERE session_id = $1 AND run_id = $2 AND role = 'assistant' \
                     ORDER BY seq LIMIT 1 OFFSET $3",
                )
                .bind(session_id)
                .bind(run_id)
                .bind(n)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.try_get("seq"))
                .transpose()?;
                if let Some(cut) = cut {
                    sqlx::query(
                        "UPDATE chat_messages SET superseded = 1 WHERE session_id = $1 AND run_id = $2 AND seq >= $3",
                    )
                    .bind(session_id)
                    .bind(run_id)
                    .bind(cut)
                    .execute(&mut *tx)
                    .await?;
                }
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

/// A plan a model stated with `submit_plan`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRecord {
    /// Id.
    pub id: String,
    /// Its run.
    pub run_id: String,
    /// The `submit_plan` call it answers.
    pub call_id: String,
    /// `[{id, tool, purpose}]` as stated.
    pub steps: serde_json::Value,
    /// `proposed`, `approved`, `rejected` or `noted` (preview).
    pub status: String,
    /// The steps approved (after edits).
    pub approved_steps: Option<serde_json::Value>,
}

impl Store {
    /// Keeps a stated plan (`status` `proposed`, or `noted` for a preview).
    pub async fn add_plan(
        &self,
        run_id: &str,
        session_id: &str,
        call_id: &str,
        steps: &serde_json::Value,
        status: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        sqlx::query(
            "INSERT INTO run_plans (id, run_id, session_id, call_id, steps, status, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(run_id)
        .bind(session_id)
        .bind(call_id)
        .bind(steps.to_string())
        .bind(status)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// The run's latest plan.
    pub async fn latest_plan(&self, run_id: &str) -> Result<Option<PlanRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT id, run_id, call_id, steps, status, approved_steps FROM run_plans \
             WHERE run_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        let json = |text: Option<String>, column: &'static str| {
            text.map(|t| {
                serde_json::from_str(&t).map_err(|source| StoreError::Json { column, source })
            })
            .transpose()
        };
        row.map(|r| {
            Ok(from_row!(r => PlanRecord {
                id, run_id, call_id, steps = json(r.try_get("steps")?, "steps")?.unwrap_or_default(),
                status, approved_steps = json(r.try_get("approved_steps")?, "approved_steps")?,
            }))
        })
        .transpose()
    }

    /// Decides a proposed plan (`approved` with the steps kept, or `rejected`). Returns
    /// whether it was still proposed.
    pub async fn decide_plan(
        &self,
        plan_id: &str,
        status: &str,
        approved_steps: Option<&serde_json::Value>,
        by: &str,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE run_plans SET status = $1, approved_steps = $2, decided_by = $3, decided_at = $4 \
             WHERE id = $5 AND status = 'proposed'",
        )
        .bind(status)
        .bind(approved_steps.map(|v| v.to_string()))
        .bind(by)
        .bind(now_ms())
        .bind(plan_id);
        self.changed(stmt).await
    }
}

impl Store {
    /// The data of a run's latest event of type `event_type`.
    pub async fn latest_run_event(
        &self,
        session_id: &str,
        run_id: &str,
        event_type: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let row = sqlx::query(
            "SELECT data FROM run_events WHERE session_id = $1 AND run_id = $2 AND event_type = $3 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(session_id)
        .bind(run_id)
        .bind(event_type)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let text: String = r.try_get("data")?;
            serde_json::from_str(&text).map_err(|source| StoreError::Json {
                column: "data",
                source,
            })
        })
        .transpose()
    }
}

impl Store {
    /// The steps (`step.boundary` events) a run has taken so far.
    pub async fn run_steps(&self, session_id: &str, run_id: &str) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query(
            "SELECT data FROM run_events WHERE session_id = $1 AND run_id = $2 AND event_type = 'step.boundary' ORDER BY seq",
        )
        .bind(session_id)
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        let mut steps = Vec::new();
        for r in rows {
            let text: String = r.try_get("data")?;
            let data: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| StoreError::Json {
                    column: "data",
                    source,
                })?;
            if let Some(n) = data["step"].as_i64() {
                steps.push(n);
            }
        }
        Ok(steps)
    }
}
