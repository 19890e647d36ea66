//! Triggered investigations (`docs/triggers.md`): alert notifications and schedule slots
//! recorded as `trigger_events` in the transaction that accepts them, the per-group state
//! of alert groups, and the claims that let one dispatcher (of any replica) act on each.

use super::{Store, StoreError, new_id, now_ms};
use serde_json::Value;
use sqlx::Row;

/// An event to record: one alert notification (its alerts this trigger takes), or one
/// schedule slot.
#[derive(Clone, Debug, PartialEq)]
pub struct NewTriggerEvent {
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The trigger's name.
    pub trigger: String,
    /// `alert` or `schedule`.
    pub kind: &'static str,
    /// Alertmanager's `groupKey`, or `schedule:<slot>`.
    pub group_key: String,
    /// Who sent it (`schedule` for a slot).
    pub caller: String,
    /// What the dispatcher needs (the notification, filtered to the trigger's alerts).
    pub payload: Value,
}

/// A recorded event.
#[derive(Clone, Debug, PartialEq)]
pub struct TriggerEvent {
    /// Its id (also the id of the run it starts).
    pub id: String,
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The trigger's name.
    pub trigger: String,
    /// `alert` or `schedule`.
    pub kind: String,
    /// The group it belongs to.
    pub group_key: String,
    /// Who sent it.
    pub caller: String,
    /// The notification.
    pub payload: Value,
    /// `pending`, `run`, `unchanged`, `resolved` or `skipped`.
    pub state: String,
    /// Why it was skipped.
    pub reason: Option<String>,
    /// The session it went to.
    pub session_id: Option<String>,
    /// The run it started.
    pub run_id: Option<String>,
    /// When it was recorded (Unix ms).
    pub created_at: i64,
}

/// An alert group's investigation.
#[derive(Clone, Debug, PartialEq)]
pub struct TriggerGroup {
    /// The session investigating it.
    pub session_id: Option<String>,
    /// Fingerprints of the alerts that session has seen.
    pub fingerprints: Vec<String>,
    /// Whether the group still fires.
    pub firing: bool,
}

/// A triggered run that ended and whose `investigation.finished` is not written yet.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedTriggerRun {
    /// The event that started it.
    pub event: TriggerEvent,
    /// `completed`, `failed`, `cancelled`.
    pub status: String,
    /// Why it failed.
    pub reason: Option<String>,
}

/// What a finished run produced, for its `investigation.finished` notification.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunDigest {
    /// Its last answer.
    pub answer: Option<String>,
    /// Proposals its session made while it ran: `{name, namespace, action, target, phase}`.
    pub proposals: Vec<Value>,
    /// Tokens in.
    pub input_tokens: i64,
    /// Tokens out.
    pub output_tokens: i64,
    /// USD.
    pub cost_usd: f64,
}

const EVENT_COLUMNS: &str = "id, policy, trigger_name, kind, group_key, caller, payload, state, reason, session_id, run_id, created_at";

fn event_row(row: &sqlx::any::AnyRow) -> Result<TriggerEvent, StoreError> {
    let payload: String = row.try_get("payload")?;
    let payload = serde_json::from_str(&payload).map_err(|source| StoreError::Json {
        column: "trigger_events.payload",
        source,
    })?;
    Ok(from_row!(row => TriggerEvent {
        id, policy, trigger as "trigger_name", kind, group_key, caller, payload = payload, state,
        reason, session_id, run_id, created_at,
    }))
}

async fn insert_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event: &NewTriggerEvent,
    now: i64,
) -> Result<String, StoreError> {
    let id = new_id();
    sqlx::query(
        "INSERT INTO trigger_events (id, policy, trigger_name, kind, group_key, caller, payload, state, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)",
    )
    .bind(&id)
    .bind(&event.policy)
    .bind(&event.trigger)
    .bind(event.kind)
    .bind(&event.group_key)
    .bind(&event.caller)
    .bind(event.payload.to_string())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(id)
}

impl Store {
    /// Records `events` in one transaction (all or none); their ids, in order.
    pub async fn record_trigger_events(
        &self,
        events: &[NewTriggerEvent],
    ) -> Result<Vec<String>, StoreError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let mut ids = Vec::with_capacity(events.len());
        for event in events {
            ids.push(insert_event(&mut tx, event, now).await?);
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Claims schedule slot `slot` (Unix s) of a trigger and records its event, in one
    /// transaction; `false` when another replica (or an earlier start) claimed it.
    pub async fn claim_trigger_slot(
        &self,
        event: &NewTriggerEvent,
        slot: i64,
        replica: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let claimed = sqlx::query(
            "INSERT INTO trigger_slots (policy, trigger_name, slot, replica, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (policy, trigger_name, slot) DO NOTHING",
        )
        .bind(&event.policy)
        .bind(&event.trigger)
        .bind(slot)
        .bind(replica)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if claimed {
            insert_event(&mut tx, event, now).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Events waiting for the dispatcher, oldest first: per group only the oldest, and only
    /// when no dispatcher holds a live claim on it.
    pub async fn pending_trigger_events(
        &self,
        now: i64,
        limit: i64,
    ) -> Result<Vec<TriggerEvent>, StoreError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM trigger_events e WHERE e.state = 'pending' \
             AND (e.claimed_until IS NULL OR e.claimed_until < $1) \
             AND NOT EXISTS (SELECT 1 FROM trigger_events o WHERE o.state = 'pending' AND o.policy = e.policy \
               AND o.trigger_name = e.trigger_name AND o.group_key = e.group_key \
               AND (o.created_at < e.created_at OR (o.created_at = e.created_at AND o.id < e.id))) \
             ORDER BY e.created_at, e.id LIMIT $2"
        );
        let stmt = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(limit);
        self.all(stmt, event_row).await
    }

    /// Claims a pending event until `until` (Unix ms); `false` when someone holds it.
    pub async fn claim_trigger_event(
        &self,
        id: &str,
        replica: &str,
        until: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE trigger_events SET claimed_by = $2, claimed_until = $3 \
             WHERE id = $1 AND state = 'pending' AND (claimed_until IS NULL OR claimed_until < $4)",
        )
        .bind(id)
        .bind(replica)
        .bind(until)
        .bind(now_ms())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    /// Gives a claimed event back (it waits its turn: the trigger's runs in flight).
    pub async fn release_trigger_event(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE trigger_events SET claimed_by = NULL, claimed_until = NULL WHERE id = $1 AND state = 'pending'",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Settles a pending event `replica` holds: `run` (with its session and run),
    /// `unchanged`, `resolved` or `skipped` (with the reason). `false` when it no longer
    /// holds it (its claim ran out and another dispatcher took it).
    pub async fn settle_trigger_event(
        &self,
        id: &str,
        replica: &str,
        state: &str,
        reason: Option<&str>,
        session_id: Option<&str>,
        run_id: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.settle_trigger_event_announcing(id, replica, state, reason, session_id, run_id, None)
            .await
    }

    /// [`Self::settle_trigger_event`], writing with it (in its transaction) the
    /// notification `announce`: `(policy, investigation.started data)`.
    #[allow(clippy::too_many_arguments)]
    pub async fn settle_trigger_event_announcing(
        &self,
        id: &str,
        replica: &str,
        state: &str,
        reason: Option<&str>,
        session_id: Option<&str>,
        run_id: Option<&str>,
        announce: Option<(&str, &Value)>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE trigger_events SET state = $2, reason = $3, session_id = COALESCE($4, session_id), run_id = $5, \
             done_at = $6, claimed_by = NULL, claimed_until = NULL WHERE id = $1 AND state = 'pending' AND claimed_by = $7",
        )
        .bind(id)
        .bind(state)
        .bind(reason)
        .bind(session_id)
        .bind(run_id)
        .bind(now_ms())
        .bind(replica)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done != 1 {
            return Ok(false);
        }
        if let Some((policy, data)) = announce {
            super::notify::add_event(&mut tx, "investigation.started", policy, id, data).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Records the session created for event `id` (a later try reuses it).
    pub async fn trigger_event_session(
        &self,
        id: &str,
        session_id: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE trigger_events SET session_id = $2 WHERE id = $1")
            .bind(id)
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The state of an alert group's investigation.
    pub async fn trigger_group(
        &self,
        policy: &str,
        trigger: &str,
        group_key: &str,
    ) -> Result<Option<TriggerGroup>, StoreError> {
        let row = sqlx::query(
            "SELECT session_id, fingerprints, firing FROM trigger_groups WHERE policy = $1 AND trigger_name = $2 AND group_key = $3",
        )
        .bind(policy)
        .bind(trigger)
        .bind(group_key)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| -> Result<TriggerGroup, StoreError> {
            let fingerprints: String = row.try_get("fingerprints")?;
            let firing: i64 = row.try_get("firing")?;
            Ok(TriggerGroup {
                session_id: row.try_get("session_id")?,
                fingerprints: serde_json::from_str(&fingerprints).map_err(|source| {
                    StoreError::Json {
                        column: "trigger_groups.fingerprints",
                        source,
                    }
                })?,
                firing: firing != 0,
            })
        })
        .transpose()
    }

    /// Writes an alert group's state.
    pub async fn put_trigger_group(
        &self,
        policy: &str,
        trigger: &str,
        group_key: &str,
        group: &TriggerGroup,
    ) -> Result<(), StoreError> {
        let fingerprints = serde_json::to_string(&group.fingerprints).unwrap_or_default();
        sqlx::query(
            "INSERT INTO trigger_groups (policy, trigger_name, group_key, session_id, fingerprints, firing, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (policy, trigger_name, group_key) \
             DO UPDATE SET session_id = $4, fingerprints = $5, firing = $6, updated_at = $7",
        )
        .bind(policy)
        .bind(trigger)
        .bind(group_key)
        .bind(&group.session_id)
        .bind(fingerprints)
        .bind(i64::from(group.firing))
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Runs a trigger started since `since` (Unix ms), and how many of them are in flight.
    pub async fn trigger_runs(
        &self,
        policy: &str,
        trigger: &str,
        since: i64,
    ) -> Result<(u64, u64), StoreError> {
        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM trigger_events WHERE policy = $1 AND trigger_name = $2 AND state = 'run' AND done_at >= $3) AS recent, \
               (SELECT count(*) FROM trigger_events e JOIN chat_runs r ON r.id = e.run_id \
                  WHERE e.policy = $1 AND e.trigger_name = $2 AND e.state = 'run' AND r.finished_at IS NULL) AS flying",
        )
        .bind(policy)
        .bind(trigger)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        let recent: i64 = row.try_get("recent")?;
        let flying: i64 = row.try_get("flying")?;
        Ok((
            u64::try_from(recent).unwrap_or(0),
            u64::try_from(flying).unwrap_or(0),
        ))
    }

    /// Triggered runs that ended and are not yet announced, oldest first.
    pub async fn finished_trigger_runs(
        &self,
        limit: i64,
    ) -> Result<Vec<FinishedTriggerRun>, StoreError> {
        let cols = EVENT_COLUMNS
            .split(", ")
            .map(|c| format!("e.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT {cols}, r.status AS run_status, r.reason AS run_reason FROM trigger_events e \
             JOIN chat_runs r ON r.id = e.run_id \
             WHERE e.state = 'run' AND e.finished_notified = 0 AND r.finished_at IS NOT NULL \
             ORDER BY r.finished_at LIMIT $1"
        );
        let stmt = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(limit);
        self.all(stmt, |row| {
            Ok(FinishedTriggerRun {
                event: event_row(row)?,
                status: row.try_get("run_status")?,
                reason: row.try_get("run_reason")?,
            })
        })
        .await
    }

    /// Writes `investigation.finished` for the run of event `id`, once (the event is marked
    /// in the same transaction; `false` when another dispatcher did it first).
    pub async fn announce_trigger_run(
        &self,
        id: &str,
        policy: &str,
        data: &Value,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let marked = sqlx::query(
            "UPDATE trigger_events SET finished_notified = 1 WHERE id = $1 AND finished_notified = 0",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if marked {
            super::notify::add_event(&mut tx, "investigation.finished", policy, id, data).await?;
        }
        tx.commit().await?;
        Ok(marked)
    }

    /// Writes `trigger.skipped` for a trigger unless one was written in the last hour.
    pub async fn note_trigger_skipped(
        &self,
        policy: &str,
        trigger: &str,
        data: &Value,
    ) -> Result<bool, StoreError> {
        let subject = format!("{policy}/{trigger}");
        let recent = |subject: String| {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM notify_events WHERE event_type = 'trigger.skipped' AND subject = $1 AND created_at > $2",
            )
            .bind(subject)
            .bind(now_ms() - 3_600_000)
        };
        // Read first, without the write lock: in a storm nearly every skip finds the notice
        // of the hour already written.
        if recent(subject.clone()).fetch_one(&self.pool).await? > 0 {
            return Ok(false);
        }
        let mut tx = self.begin().await?;
        if recent(subject.clone()).fetch_one(&mut *tx).await? > 0 {
            return Ok(false);
        }
        // Two replicas may both have read none (PostgreSQL reads committed): the clock
        // hour is claimed like a schedule slot (negative: never a real slot), so one writes.
        let claimed = sqlx::query(
            "INSERT INTO trigger_slots (policy, trigger_name, slot, replica, created_at) VALUES ($1, $2, $3, 'trigger.skipped', $4) \
             ON CONFLICT (policy, trigger_name, slot) DO NOTHING",
        )
        .bind(policy)
        .bind(trigger)
        .bind(-(now_ms() / 3_600_000))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !claimed {
            return Ok(false);
        }
        super::notify::add_event(&mut tx, "trigger.skipped", policy, &subject, data).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The answer, proposals and usage of run `run_id` of `session_id`.
    pub async fn run_digest(
        &self,
        session_id: &str,
        run_id: &str,
    ) -> Result<RunDigest, StoreError> {
        let Some(times) =
            sqlx::query("SELECT started_at, finished_at FROM chat_runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?
        else {
            return Ok(RunDigest::default());
        };
        let started: i64 = times.try_get("started_at")?;
        let finished: Option<i64> = times.try_get("finished_at")?;
        let until = finished.unwrap_or_else(now_ms) + 5_000;
        let answer: Option<String> = sqlx::query_scalar(
            "SELECT content FROM chat_messages WHERE session_id = $1 AND run_id = $2 AND role = 'assistant' \
             AND content <> '' ORDER BY seq DESC LIMIT 1",
        )
        .bind(session_id)
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        let proposals = sqlx::query(
            "SELECT id, name, namespace, action, target, phase FROM proposals WHERE session_id = $1 \
             AND created_at >= $2 AND created_at <= $3 ORDER BY created_at, id",
        )
        .bind(session_id)
        .bind(started)
        .bind(until)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| -> Result<Value, StoreError> {
            let target: Option<String> = row.try_get("target")?;
            Ok(serde_json::json!({
                "id": row.try_get::<String, _>("id")?,
                "name": row.try_get::<String, _>("name")?,
                "namespace": row.try_get::<String, _>("namespace")?,
                "action": row.try_get::<String, _>("action")?,
                "target": target.and_then(|t| serde_json::from_str::<Value>(&t).ok()),
                "phase": row.try_get::<String, _>("phase")?,
            }))
        })
        .collect::<Result<Vec<_>, _>>()?;
        let usage = sqlx::query(
            "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
             CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
             CAST(COALESCE(SUM(cost_usd), 0) AS DOUBLE PRECISION) AS cost_usd \
             FROM usage_events WHERE session_id = $1 AND at >= $2 AND at <= $3",
        )
        .bind(session_id)
        .bind(started)
        .bind(until)
        .fetch_one(&self.pool)
        .await?;
        Ok(RunDigest {
            answer,
            proposals,
            input_tokens: usage.try_get("input_tokens")?,
            output_tokens: usage.try_get("output_tokens")?,
            cost_usd: usage.try_get("cost_usd")?,
        })
    }

    /// The session of run `id`, if the run exists (a crash may have come between starting
    /// a trigger's run and settling its event).
    pub async fn run_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM chat_runs WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Events of a trigger (newest first), for the API and tests.
    pub async fn trigger_events(
        &self,
        policy: &str,
        trigger: &str,
        limit: i64,
    ) -> Result<Vec<TriggerEvent>, StoreError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM trigger_events WHERE policy = $1 AND trigger_name = $2 ORDER BY created_at DESC, id DESC LIMIT $3"
        );
        let stmt = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(policy)
            .bind(trigger)
            .bind(limit);
        self.all(stmt, event_row).await
    }

    /// Removes settled trigger events and groups not touched since `before` (Unix ms).
    pub async fn prune_trigger_events(&self, before: i64) -> Result<u64, StoreError> {
        let n = sqlx::query(
            "DELETE FROM trigger_events WHERE state <> 'pending' AND done_at < $1 \
             AND (state <> 'run' OR finished_notified = 1)",
        )
        .bind(before)
        .execute(&self.pool)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM trigger_groups WHERE updated_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM trigger_slots WHERE created_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(n)
    }
}
