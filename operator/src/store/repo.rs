//! The repositories of sessions, messages, runs, tool results and events (one block of
//! methods per table, all on [`Store`]), and the helpers the other tables' files share.

use super::models::*;
use super::{AnyQuery, Store, StoreError, new_id, now_ms};
use serde_json::{Value, json};
use sqlx::Row;
use sqlx::any::AnyRow;

pub(super) fn json_text(v: &Value) -> String {
    v.to_string()
}

pub(super) fn opt_json_text(v: &Option<Value>) -> Option<String> {
    v.as_ref().map(json_text)
}

pub(super) fn json_col(row: &AnyRow, column: &'static str) -> Result<Value, StoreError> {
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text).map_err(|source| StoreError::Json { column, source })
}

pub(super) fn opt_json_col(
    row: &AnyRow,
    column: &'static str,
) -> Result<Option<Value>, StoreError> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| serde_json::from_str(&t).map_err(|source| StoreError::Json { column, source }))
        .transpose()
}

/// Running a statement on the pool and reading what it returns.
impl Store {
    /// Every row `q` returns, each read by `read`.
    pub(super) async fn all<T>(
        &self,
        q: AnyQuery<'_>,
        read: impl Fn(&AnyRow) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        q.fetch_all(&self.pool).await?.iter().map(read).collect()
    }

    /// The first row `q` returns, if any, read by `read`.
    pub(super) async fn first<T>(
        &self,
        q: AnyQuery<'_>,
        read: impl Fn(&AnyRow) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        q.fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(read)
            .transpose()
    }

    /// Whether `q` changed any row.
    pub(super) async fn changed(&self, q: AnyQuery<'_>) -> Result<bool, StoreError> {
        Ok(q.execute(&self.pool).await?.rows_affected() > 0)
    }
}

/// How much event data one page of [`Store::events_after`] reads before it stops: what a
/// follower that does not keep up holds (`docs/reliability.md#limits`).
pub const EVENT_PAGE_BYTES: usize = 1 << 20;

/// The UTC day (`YYYY-MM-DD`) of a Unix-ms timestamp.
pub fn utc_day(at_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(at_ms)
        .map(|t| t.to_zoned(jiff::tz::TimeZone::UTC).date().to_string())
        .unwrap_or_else(|_| "1970-01-01".to_owned())
}

macro_rules! session_select {
    () => {
        "SELECT id, name, namespace, user_name, policy, status, title, dynamic_tools, created_at, updated_at, trigger_ref FROM chat_sessions"
    };
}

fn session_row(row: &AnyRow) -> Result<SessionRecord, StoreError> {
    let status: String = row.try_get("status")?;
    let state = SessionState::parse(&status).ok_or_else(|| {
        StoreError::from(sqlx::Error::Decode(
            format!("chat_sessions.status {status:?} is not a session state").into(),
        ))
    })?;
    Ok(from_row!(row => SessionRecord {
        id, name, namespace, user as "user_name", policy, status = state, title,
        dynamic_tools = json_col(row, "dynamic_tools")?, created_at, updated_at,
        trigger as "trigger_ref",
    }))
}

/// Appends a message to a session's transcript inside `tx` (the next sequence number).
pub(super) async fn insert_message(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    session_id: &str,
    new: &NewMessage,
) -> Result<MessageRecord, StoreError> {
    let next: i64 = sqlx::query(
        "SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM chat_messages WHERE session_id = $1",
    )
    .bind(session_id)
    .fetch_one(&mut **tx)
    .await?
    .try_get("next")?;
    let record = MessageRecord {
        id: new_id(),
        session_id: session_id.to_owned(),
        seq: next,
        run_id: new.run_id.clone(),
        role: new.role.clone(),
        content: new.content.clone(),
        tool_calls: new.tool_calls.clone(),
        tool_call_id: new.tool_call_id.clone(),
        is_error: new.is_error,
        created_at: now_ms(),
        superseded: false,
        author: new.author.clone(),
        provider: new.provider.clone(),
        model: new.model.clone(),
    };
    sqlx::query(
            "INSERT INTO chat_messages (id, session_id, seq, run_id, role, content, tool_calls, tool_call_id, is_error, created_at, author, provider, model) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(&record.id)
        .bind(&record.session_id)
        .bind(record.seq)
        .bind(&record.run_id)
        .bind(&record.role)
        .bind(&record.content)
        .bind(opt_json_text(&record.tool_calls))
        .bind(&record.tool_call_id)
        .bind(i64::from(record.is_error))
        .bind(record.created_at)
        .bind(&record.author)
        .bind(&record.provider)
        .bind(&record.model)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE chat_sessions SET updated_at = $1 WHERE id = $2")
        .bind(record.created_at)
        .bind(session_id)
        .execute(&mut **tx)
        .await?;
    Ok(record)
}

/// Sessions.
impl Store {
    /// Creates a session in status `idle`.
    pub async fn create_session(&self, new: &NewSession) -> Result<SessionRecord, StoreError> {
        self.create_session_for(new, None).await
    }

    /// Creates a session in status `idle`; with `trigger` (`namespace/policy/trigger`) one
    /// that trigger started, governed by that trigger's policy whatever its name matches.
    pub async fn create_session_for(
        &self,
        new: &NewSession,
        trigger: Option<&str>,
    ) -> Result<SessionRecord, StoreError> {
        self.traced("INSERT chat_sessions", async move {
            let record = SessionRecord {
                id: new_id(),
                name: new.name.clone(),
                namespace: new.namespace.clone(),
                user: new.user.clone(),
                policy: new.policy.clone(),
                status: SessionState::Idle,
                title: None,
                dynamic_tools: new.dynamic_tools.clone(),
                created_at: now_ms(),
                updated_at: now_ms(),
                trigger: trigger.map(str::to_owned),
            };
            sqlx::query(
                "INSERT INTO chat_sessions (id, name, namespace, user_name, policy, status, dynamic_tools, created_at, updated_at, trigger_ref) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&record.id)
            .bind(&record.name)
            .bind(&record.namespace)
            .bind(&record.user)
            .bind(&record.policy)
            .bind(record.status.as_str())
            .bind(json_text(&record.dynamic_tools))
            .bind(record.created_at)
            .bind(record.updated_at)
            .bind(&record.trigger)
            .execute(&self.pool)
            .await?;
            Ok(record)
        })
        .await
    }

    /// The session `id` if it belongs to `user` and was not deleted.
    pub async fn get_session(
        &self,
        id: &str,
        user: &str,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let sql = concat!(
            session_select!(),
            " WHERE id = $1 AND user_name = $2 AND deleted_at IS NULL"
        );
        let stmt = sqlx::query(sql).bind(id).bind(user);
        self.first(stmt, session_row).await
    }

    /// Session `id`, whoever owns it (for the server's own sweeps).
    pub async fn session_by_id(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let sql = concat!(session_select!(), " WHERE id = $1 AND deleted_at IS NULL");
        let stmt = sqlx::query(sql).bind(id);
        self.first(stmt, session_row).await
    }

    /// `user`'s sessions, most recently updated first.
    pub async fn list_sessions(&self, user: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let stmt = sqlx::query(concat!(
            session_select!(),
            " WHERE user_name = $1 AND deleted_at IS NULL AND origin = 'chat' ORDER BY updated_at DESC, id DESC"
        ))
        .bind(user);
        self.all(stmt, session_row).await
    }

    /// Sessions triggers started, most recent first, at most `limit`.
    pub async fn triggered_sessions(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        let stmt = sqlx::query(concat!(
            session_select!(),
            " WHERE trigger_ref IS NOT NULL AND deleted_at IS NULL ORDER BY updated_at DESC, id DESC LIMIT $1"
        ))
        .bind(limit);
        self.all(stmt, session_row).await
    }

    /// `user`'s sessions whose name, title or any message contains `text` (any case),
    /// most recent first, at most 200.
    pub async fn search_sessions(
        &self,
        user: &str,
        text: &str,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let escaped = text
            .to_lowercase()
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        let pattern = format!("%{escaped}%");
        self.traced("SELECT chat_sessions chat_messages", async move {
            let stmt = sqlx::query(concat!(
                session_select!(),
                " WHERE user_name = $1 AND deleted_at IS NULL AND origin = 'chat' AND (",
                "lower(name) LIKE $2 ESCAPE '\\' OR lower(coalesce(title, '')) LIKE $2 ESCAPE '\\' ",
                "OR EXISTS (SELECT 1 FROM chat_messages m WHERE m.session_id = chat_sessions.id ",
                "AND lower(m.content) LIKE $2 ESCAPE '\\')) ",
                "ORDER BY updated_at DESC, id DESC LIMIT 200"
            ))
            .bind(user)
            .bind(pattern);
            self.all(stmt, session_row).await
        })
        .await
    }

    /// Renames session `id` of `user` (its title); false when it is not theirs.
    pub async fn rename_session(
        &self,
        id: &str,
        user: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE chat_sessions SET title = $3 WHERE id = $1 AND user_name = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(user)
        .bind(title);
        self.changed(stmt).await
    }

    /// Sets the title of session `id` unless it has one. Returns whether it was set.
    pub async fn set_title(&self, id: &str, title: &str) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE chat_sessions SET title = $2 WHERE id = $1 AND title IS NULL")
                .bind(id)
                .bind(title)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Moves session `id` to `status` only if it is currently in `from` (a compare-and-set,
    /// so two replicas cannot both start a run). Returns whether it moved.
    pub async fn transition_session(
        &self,
        id: &str,
        from: &[SessionState],
        status: SessionState,
    ) -> Result<bool, StoreError> {
        self.traced("UPDATE chat_sessions", async move {
            let mut moved = false;
            for f in from {
                let done = sqlx::query(
                    "UPDATE chat_sessions SET status = $1, updated_at = $2 WHERE id = $3 AND status = $4 AND deleted_at IS NULL",
                )
                .bind(status.as_str())
                .bind(now_ms())
                .bind(id)
                .bind(f.as_str())
                .execute(&self.pool)
                .await?;
                if done.rows_affected() > 0 {
                    moved = true;
                    break;
                }
            }
            Ok(moved)
        })
        .await
    }

    /// Hides session `id` of `user` (`None`: of whoever owns it, for an admin) at once;
    /// retention's `purge_deleted` removes it for good. Returns whether it existed.
    pub async fn delete_session(&self, id: &str, user: Option<&str>) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE chat_sessions SET deleted_at = $1 WHERE id = $2 AND ($3 IS NULL OR user_name = $3) AND deleted_at IS NULL",
        )
        .bind(now_ms())
        .bind(id)
        .bind(user);
        self.changed(stmt).await
    }

    /// Whether a run of session `id` is still writing (running, pausing, cancelling).
    pub async fn writing(&self, id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) AS n FROM chat_runs WHERE session_id = $1 AND status IN ('running', 'pausing', 'cancelling')",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }
}

fn message_row(row: &AnyRow) -> Result<MessageRecord, StoreError> {
    Ok(from_row!(row => MessageRecord {
        id, session_id, seq, run_id, role, content, tool_calls = opt_json_col(row, "tool_calls")?,
        tool_call_id, is_error = row.try_get::<i64, _>("is_error")? != 0, created_at,
        superseded = row.try_get::<i64, _>("superseded")? != 0, author, provider, model,
    }))
}

/// Messages.
impl Store {
    /// Appends a message at the end of the session.
    pub async fn append_message(
        &self,
        session_id: &str,
        new: &NewMessage,
    ) -> Result<MessageRecord, StoreError> {
        self.traced("INSERT chat_messages", async move {
            let mut tx = self.begin().await?;
            let record = insert_message(&mut tx, session_id, new).await?;
            tx.commit().await?;
            Ok(record)
        })
        .await
    }

    /// Every message of a session, in order.
    pub async fn list_messages(&self, session_id: &str) -> Result<Vec<MessageRecord>, StoreError> {
        self.messages_after(session_id, 0).await
    }

    /// The messages of a session after sequence number `after`, in order.
    pub async fn messages_after(
        &self,
        session_id: &str,
        after: i64,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        self.traced("SELECT chat_messages", async move {
            let stmt = sqlx::query(
                "SELECT id, session_id, seq, run_id, role, content, tool_calls, tool_call_id, is_error, created_at, superseded, author, provider, model \
                 FROM chat_messages WHERE session_id = $1 AND seq > $2 ORDER BY seq",
            )
            .bind(session_id)
            .bind(after);
            self.all(stmt, message_row).await
        })
        .await
    }
}

/// Runs.
impl Store {
    /// Records a run owned by `owner` (a replica id), started now, under `policy`
    /// (`namespace/name` and its `maxConcurrentRuns`). Returns `false`, recording nothing,
    /// when that policy already has its maximum of runs in flight.
    pub async fn create_run(
        &self,
        run_id: &str,
        session_id: &str,
        owner: &str,
        actor: &str,
        policy: Option<(&str, Option<u32>)>,
    ) -> Result<bool, StoreError> {
        self.traced("INSERT chat_runs", async move {
            let now = now_ms();
            // One statement: the count and the insert cannot be split by another start on the
            // same database (SQLite); on PostgreSQL two replicas starting at the same instant
            // may each see the other's run not yet committed, so the limit can be passed by
            // the replicas that race.
            let (policy, max) = match policy {
                Some((name, max)) => (Some(name), max.map_or(i64::MAX, i64::from)),
                None => (None, i64::MAX),
            };
            let stmt = sqlx::query(
                "INSERT INTO chat_runs (id, session_id, status, owner, heartbeat_at, started_at, policy, actor) \
                 SELECT $1, $2, 'running', $3, $4, $4, $5, $7 \
                 WHERE (SELECT count(*) FROM chat_runs WHERE policy = $5 AND status IN ('running', 'cancelling', 'pausing')) < $6",
            )
            .bind(run_id)
            .bind(session_id)
            .bind(owner)
            .bind(now)
            .bind(policy)
            .bind(max)
            .bind(actor);
            self.changed(stmt).await
        })
        .await
    }

    /// Whom run `run_id` acts for — the user who posted its message (in a shared session,
    /// not always the owner; `None` for runs from before this was recorded) — and the trace
    /// context (`traceparent`) it started in.
    pub async fn run_origin(
        &self,
        run_id: &str,
    ) -> Result<(Option<String>, Option<String>), StoreError> {
        let row = sqlx::query("SELECT actor, traceparent FROM chat_runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => (r.try_get("actor")?, r.try_get("traceparent")?),
            None => (None, None),
        })
    }

    /// Records the trace context a run started in (kept when it is taken up again).
    pub async fn set_run_traceparent(
        &self,
        run_id: &str,
        traceparent: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE chat_runs SET traceparent = $1 WHERE id = $2 AND traceparent IS NULL")
            .bind(traceparent)
            .bind(run_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// What a transcript read back shows of a session's runs, in one read: each run's
    /// trace id (when traces were on), and the runs that failed with why (what their
    /// `error` event said), oldest first.
    pub async fn run_notes(&self, session_id: &str) -> Result<RunNotes, StoreError> {
        let rows = sqlx::query(
            "SELECT id, status, reason, traceparent FROM chat_runs WHERE session_id = $1 \
             AND (traceparent IS NOT NULL OR status = 'failed') ORDER BY started_at",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        let mut notes = RunNotes::default();
        for r in rows {
            let id: String = r.try_get("id")?;
            if let Some(parent) = r.try_get::<Option<String>, _>("traceparent")?
                && let Some(trace) = crate::telemetry::trace::trace_id_of(&parent)
            {
                notes.traces.insert(id.clone(), trace.to_owned());
            }
            if r.try_get::<String, _>("status")? == "failed" {
                let reason: Option<String> = r.try_get("reason")?;
                notes.failed.push((id, reason.unwrap_or_default()));
            }
        }
        Ok(notes)
    }

    /// Runs of `policy` (`namespace/name`) in flight, on every replica.
    pub async fn runs_in_flight(&self, policy: &str) -> Result<u64, StoreError> {
        self.count_by(
            "SELECT count(*) FROM chat_runs WHERE policy = $1 AND status IN ('running', 'cancelling', 'pausing')",
            policy,
        )
        .await
    }

    /// The `count(*)` of `sql`, its one parameter bound to `arg`.
    async fn count_by(&self, sql: &'static str, arg: &str) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(sql)
            .bind(arg)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Sessions of `user` that are not deleted.
    pub async fn count_sessions(&self, user: &str) -> Result<u64, StoreError> {
        self.count_by(
            "SELECT count(*) FROM chat_sessions WHERE user_name = $1 AND deleted_at IS NULL AND origin = 'chat'",
            user,
        )
        .await
    }

    /// Refreshes the heartbeat of the runs `owner` executes whose task is alive (`live`);
    /// a run whose task died stops beating and is recovered.
    pub async fn heartbeat_runs(&self, owner: &str, live: &[String]) -> Result<u64, StoreError> {
        let mut n = 0;
        for id in live {
            let done = sqlx::query(
                "UPDATE chat_runs SET heartbeat_at = $1 WHERE id = $2 AND owner = $3 AND status IN ('running', 'cancelling', 'pausing')",
            )
            .bind(now_ms())
            .bind(id)
            .bind(owner)
            .execute(&self.pool)
            .await?;
            n += done.rows_affected();
        }
        Ok(n)
    }

    /// Running runs whose heartbeat is older than `before` (Unix ms): `(run id, session id)`.
    pub async fn stale_runs(&self, before: i64) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, session_id FROM chat_runs WHERE status IN ('running', 'cancelling', 'pausing') AND heartbeat_at < $1",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("session_id")?)))
            .collect()
    }

    /// Marks a run `failed` if it is still running with a heartbeat older than `before`:
    /// a compare-and-set, so only one replica cleans up, and never a run that is alive.
    pub async fn fail_stale_run(
        &self,
        run_id: &str,
        before: i64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE chat_runs SET status = 'failed', reason = $1, finished_at = $2 WHERE id = $3 AND status IN ('running', 'cancelling', 'pausing') AND heartbeat_at < $4",
        )
        .bind(reason)
        .bind(now_ms())
        .bind(run_id)
        .bind(before);
        self.changed(stmt).await
    }

    /// Asks the running run of a session to stop, wherever it runs (its owner polls).
    pub async fn request_cancel(&self, session_id: &str) -> Result<bool, StoreError> {
        let stmt = sqlx::query("UPDATE chat_runs SET status = 'cancelling' WHERE session_id = $1 AND status IN ('running', 'pausing')")
            .bind(session_id);
        self.changed(stmt).await
    }

    /// The session's runs that did not complete, in order: `(run id, status, reason,
    /// finished at)` (for exports).
    pub async fn unfinished_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(String, String, Option<String>, Option<i64>)>, StoreError> {
        let stmt = sqlx::query(
            "SELECT id, status, reason, finished_at FROM chat_runs \
             WHERE session_id = $1 AND status IN ('failed', 'cancelled') ORDER BY started_at",
        )
        .bind(session_id);
        self.all(stmt, |r| {
            Ok((
                r.try_get("id")?,
                r.try_get("status")?,
                r.try_get("reason")?,
                r.try_get("finished_at")?,
            ))
        })
        .await
    }

    /// The status of a run.
    pub async fn run_status(&self, run_id: &str) -> Result<Option<super::RunState>, StoreError> {
        let row = sqlx::query("SELECT status FROM chat_runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| super::runs::run_state(&r.try_get::<String, _>("status")?))
            .transpose()
    }

    /// The session's run in progress (running, waiting for tool results or cancelling) and
    /// the sequence number just before its first event, if there is one.
    pub async fn active_run(&self, session_id: &str) -> Result<Option<(String, i64)>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as(
            "SELECT id FROM chat_runs WHERE session_id = $1 \
             AND status IN ('running', 'requires_action', 'cancelling', 'pausing', 'paused', 'awaiting_plan') ORDER BY started_at DESC LIMIT 1",
        )
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some((run_id,)) = row else {
            return Ok(None);
        };
        let first: Option<(i64,)> = sqlx::query_as(
            "SELECT seq FROM run_events WHERE session_id = $1 AND run_id = $2 ORDER BY seq LIMIT 1",
        )
        .bind(session_id)
        .bind(&run_id)
        .fetch_optional(&self.pool)
        .await?;
        let after = match first {
            Some((seq,)) => seq - 1,
            None => self.last_event_seq(session_id).await?,
        };
        Ok(Some((run_id, after)))
    }

    /// Puts a run that waited for tool results back to `running`, owned by `owner`.
    pub async fn reopen_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE chat_runs SET status = 'running', owner = $1, heartbeat_at = $2, finished_at = NULL WHERE id = $3")
            .bind(owner)
            .bind(now_ms())
            .bind(run_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks a run finished with `status` (`completed`, `failed`, `cancelled`,
    /// `requires_action`) and an optional reason.
    pub async fn finish_run(
        &self,
        run_id: &str,
        status: &str,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.traced("UPDATE chat_runs chat_sessions", async move {
            // Only a run still in progress ends; one already failed by another replica stays so.
            let mut tx = self.begin().await?;
            let done = sqlx::query(
                "UPDATE chat_runs SET status = $1, reason = $2, finished_at = $3, heartbeat_at = $3 \
                 WHERE id = $4 AND status IN ('running', 'cancelling', 'requires_action', 'pausing', 'paused')",
            )
            .bind(status)
            .bind(reason)
            .bind(now_ms())
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
            let ended = done.rows_affected() > 0;
            // A failed run of a policy is an event its notification targets may want.
            if ended && status == "failed" {
                let row = sqlx::query(
                    "SELECT r.policy, r.session_id, s.name, s.namespace, COALESCE(r.actor, s.user_name) AS user_name FROM chat_runs r \
                     JOIN chat_sessions s ON s.id = r.session_id WHERE r.id = $1",
                )
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await?;
                if let Some(row) = row
                    && let Some(policy) = row.try_get::<Option<String>, _>("policy")?
                {
                    let data = json!({
                        "runId": run_id,
                        "sessionId": row.try_get::<String, _>("session_id")?,
                        "sessionName": row.try_get::<String, _>("name")?,
                        "namespace": row.try_get::<String, _>("namespace")?,
                        "user": row.try_get::<String, _>("user_name")?,
                        "reason": reason,
                    });
                    super::notify::add_event(&mut tx, "run.failed", &policy, run_id, &data).await?;
                }
            }
            tx.commit().await?;
            Ok(ended)
        })
        .await
    }
}

/// Large tool results.
impl Store {
    /// Keeps a whole tool result; returns its id.
    pub async fn put_tool_result(
        &self,
        session_id: &str,
        call_id: &str,
        tool: &str,
        content: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        sqlx::query("INSERT INTO tool_results (id, session_id, call_id, tool, content, created_at) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(&id)
            .bind(session_id)
            .bind(call_id)
            .bind(tool)
            .bind(content)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(id)
    }

    /// A kept tool result of `session_id`.
    pub async fn get_tool_result(
        &self,
        session_id: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT content FROM tool_results WHERE id = $1 AND session_id = $2")
            .bind(id)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.try_get("content"))
            .transpose()
            .map_err(StoreError::from)
    }
}

/// Run events (the SSE log).
impl Store {
    /// Persists an event with the session's next sequence number. The number comes from the
    /// database (an atomic increment on the session row), so any replica may append.
    pub async fn append_event(
        &self,
        session_id: &str,
        run_id: Option<&str>,
        event_type: &str,
        data: &Value,
    ) -> Result<EventRecord, StoreError> {
        self.traced("INSERT chat_events", async move {
            let mut tx = self.begin().await?;
            let record = insert_event(&mut tx, session_id, run_id, event_type, data).await?;
            tx.commit().await?;
            Ok(record)
        })
        .await
    }

    /// Appends a message of a run and the event announcing it, in one transaction.
    pub async fn append_message_and_event(
        &self,
        session_id: &str,
        message: &NewMessage,
        event_type: &str,
        data: &Value,
    ) -> Result<(MessageRecord, EventRecord), StoreError> {
        self.traced("INSERT chat_messages chat_events", async move {
            let mut tx = self.begin().await?;
            let record = insert_message(&mut tx, session_id, message).await?;
            let event = insert_event(
                &mut tx,
                session_id,
                message.run_id.as_deref(),
                event_type,
                data,
            )
            .await?;
            tx.commit().await?;
            Ok((record, event))
        })
        .await
    }

    /// The sequence number of the session's newest event (0 before the first).
    pub async fn last_event_seq(&self, session_id: &str) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT last_event_seq FROM chat_sessions WHERE id = $1")
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .map(|r| r.try_get("last_event_seq"))
            .transpose()?
            .unwrap_or(0))
    }

    /// Events with `seq > after`, oldest first: at most `limit`, and no more once
    /// [`EVENT_PAGE_BYTES`] of event data are read (at least one event). Rows are read one
    /// at a time, so a follower's page is bounded however large the events are.
    pub async fn events_after(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.traced("SELECT chat_events", async move {
            use futures_util::TryStreamExt;
            let mut rows = sqlx::query(
                "SELECT session_id, seq, run_id, event_type, data, created_at FROM run_events \
                 WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            )
            .bind(session_id)
            .bind(after)
            .bind(limit)
            .fetch(&self.pool);
            let mut page = Vec::new();
            let mut bytes = 0;
            while let Some(row) = rows.try_next().await? {
                let data: String = row.try_get("data")?;
                bytes += data.len();
                page.push(EventRecord {
                    session_id: row.try_get("session_id")?,
                    seq: row.try_get("seq")?,
                    run_id: row.try_get("run_id")?,
                    event_type: row.try_get("event_type")?,
                    data: serde_json::from_str(&data).map_err(|source| StoreError::Json {
                        column: "data",
                        source,
                    })?,
                    created_at: row.try_get("created_at")?,
                });
                if bytes >= EVENT_PAGE_BYTES {
                    break;
                }
            }
            Ok(page)
        })
        .await
    }
}

/// Persists an event with the session's next sequence number. The number comes from the
/// database (an atomic increment on the session row), so any replica may append.
async fn insert_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    session_id: &str,
    run_id: Option<&str>,
    event_type: &str,
    data: &Value,
) -> Result<EventRecord, StoreError> {
    let seq: Option<i64> = sqlx::query(
        "UPDATE chat_sessions SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING last_event_seq",
    )
    .bind(session_id)
    .fetch_optional(&mut **tx)
    .await?
    .map(|r| r.try_get("last_event_seq"))
    .transpose()?;
    let Some(seq) = seq else {
        return Err(StoreError::Conflict(format!(
            "session {session_id} does not exist"
        )));
    };
    let record = EventRecord {
        session_id: session_id.to_owned(),
        seq,
        run_id: run_id.map(str::to_owned),
        event_type: event_type.to_owned(),
        data: data.clone(),
        created_at: now_ms(),
    };
    sqlx::query(
        "INSERT INTO run_events (session_id, seq, run_id, event_type, data, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&record.session_id)
    .bind(record.seq)
    .bind(&record.run_id)
    .bind(&record.event_type)
    .bind(json_text(&record.data))
    .bind(record.created_at)
    .execute(&mut **tx)
    .await?;
    Ok(record)
}

/// Rows per multi-row `INSERT`. SQLite looks a named parameter (`$n`) up in a list, so a
/// statement with n of them costs O(n²) to bind (8 % of the gateway's CPU in a profile at
/// 8 rows); on SQLite the rows are therefore bound to anonymous `?` parameters, in order,
/// which cost nothing to look up, and a statement can carry more of them.
pub(super) const ROWS_PER_INSERT: usize = 32;

/// `VALUES (...), ...` for `rows` rows of `cols` columns: `$1, $2, ...` on PostgreSQL
/// (`numbered`), `?` on SQLite (bound in order). Built once per shape and kept.
pub(super) fn values_clause(numbered: bool, rows: usize, cols: usize) -> std::sync::Arc<str> {
    use std::fmt::Write;
    /// `(numbered, rows, cols)` and its clause.
    type Built = Vec<((bool, usize, usize), std::sync::Arc<str>)>;
    static BUILT: std::sync::Mutex<Built> = std::sync::Mutex::new(Vec::new());
    let key = (numbered, rows, cols);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, sql)) = built.iter().find(|(k, _)| *k == key) {
        return sql.clone();
    }
    let mut out = String::from(" VALUES ");
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for c in 0..cols {
            if c > 0 {
                out.push_str(", ");
            }
            if numbered {
                let _ = write!(out, "${}", r * cols + c + 1);
            } else {
                out.push('?');
            }
        }
        out.push(')');
    }
    let sql: std::sync::Arc<str> = out.into();
    built.push((key, sql.clone()));
    sql
}

/// Whether `tx` speaks PostgreSQL (numbered parameters) rather than SQLite.
pub(super) fn numbered(tx: &sqlx::Transaction<'_, sqlx::Any>) -> bool {
    tx.backend_name().eq_ignore_ascii_case("postgresql")
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_days() {
        assert_eq!(super::utc_day(0), "1970-01-01");
        assert_eq!(super::utc_day(1_779_494_400_000 - 1), "2026-05-22");
    }
}
