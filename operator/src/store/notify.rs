//! The notification outbox (`docs/notifications.md`): events written in the transaction
//! of what caused them, fanned out to one delivery per target, each sent until delivered,
//! or given up on after its last retry.

use super::{Store, StoreError, new_id, now_ms};
use serde_json::Value;
use sqlx::Row;

/// An event waiting to be fanned out.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifyEventRecord {
    /// Its id (the envelope's `id`).
    pub id: String,
    /// `proposal.pending`, ...
    pub event_type: String,
    /// `namespace/name` of the policy whose targets get it.
    pub policy: String,
    /// What it is about (a proposal id).
    pub subject: String,
    /// The envelope's `data`.
    pub data: Value,
    /// When it happened (Unix ms).
    pub created_at: i64,
}

/// A delivery due to be sent, with its event.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// `<event id>.<target>`: the `X-Kortex-Delivery` idempotency key.
    pub id: String,
    /// The target's name in the policy.
    pub target: String,
    /// Attempts so far.
    pub attempts: i64,
    /// When it was due (its claim checks this).
    pub next_at: i64,
    /// When it was created (Unix ms; retries stop 24 h later).
    pub created_at: i64,
    /// The event.
    pub event: NotifyEventRecord,
}

/// Writes an event in `tx` (the transaction of what caused it).
pub(super) async fn add_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event_type: &str,
    policy: &str,
    subject: &str,
    data: &Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO notify_events (id, event_type, policy, subject, data, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(new_id())
    .bind(event_type)
    .bind(policy)
    .bind(subject)
    .bind(data.to_string())
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn event_row(row: &sqlx::any::AnyRow, prefix: &str) -> Result<NotifyEventRecord, StoreError> {
    let col = |c: &str| format!("{prefix}{c}");
    let data: String = row.try_get(col("data").as_str())?;
    Ok(NotifyEventRecord {
        id: row.try_get(col("id").as_str())?,
        event_type: row.try_get(col("event_type").as_str())?,
        policy: row.try_get(col("policy").as_str())?,
        subject: row.try_get(col("subject").as_str())?,
        data: serde_json::from_str(&data).map_err(|source| StoreError::Json {
            column: "notify_events.data",
            source,
        })?,
        created_at: row.try_get(col("created_at").as_str())?,
    })
}

impl Store {
    /// Writes an event that no database change causes (a provider turning unavailable).
    pub async fn notify_event(
        &self,
        event_type: &str,
        policy: &str,
        subject: &str,
        data: &Value,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        add_event(&mut tx, event_type, policy, subject, data).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Events not yet fanned out, oldest first.
    pub async fn unfanned_events(&self, limit: i64) -> Result<Vec<NotifyEventRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, event_type, policy, subject, data, created_at FROM notify_events \
             WHERE fanned_at IS NULL ORDER BY created_at, id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| event_row(r, "")).collect()
    }

    /// One delivery of `event` per target in `targets`, due now; the event is fanned out.
    /// Idempotent: a target already given the event is not given it twice.
    pub async fn fan_out(
        &self,
        event: &str,
        policy: &str,
        targets: &[String],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        for target in targets {
            sqlx::query(
                "INSERT INTO notify_deliveries (id, event_id, policy, target, next_at, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (id) DO NOTHING",
            )
            .bind(format!("{event}.{target}"))
            .bind(event)
            .bind(policy)
            .bind(target)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE notify_events SET fanned_at = $1 WHERE id = $2")
            .bind(now)
            .bind(event)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deliveries due at `now`, oldest first.
    pub async fn due_deliveries(&self, now: i64, limit: i64) -> Result<Vec<Delivery>, StoreError> {
        let stmt = sqlx::query(
            "SELECT d.id, d.target, d.attempts, d.next_at, d.created_at, e.id AS e_id, e.event_type AS e_event_type, \
             e.policy AS e_policy, e.subject AS e_subject, e.data AS e_data, e.created_at AS e_created_at \
             FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id \
             WHERE d.delivered_at IS NULL AND d.failed_at IS NULL AND d.next_at <= $1 \
             ORDER BY d.next_at, d.id LIMIT $2",
        )
        .bind(now)
        .bind(limit);
        self.all(stmt, |r| {
            Ok(from_row!(r => Delivery {
                id, target, attempts, next_at, created_at, event = event_row(r, "e_")?,
            }))
        })
        .await
    }

    /// Claims `delivery` for one attempt until `until` (Unix ms): true for the one sender
    /// (of any replica) that gets it. A sender that dies mid-attempt leaves it to be sent
    /// again once the claim runs out (at least once).
    pub async fn claim_delivery(
        &self,
        delivery: &Delivery,
        until: i64,
    ) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE notify_deliveries SET next_at = $1 \
             WHERE id = $2 AND next_at = $3 AND delivered_at IS NULL AND failed_at IS NULL",
        )
        .bind(until)
        .bind(&delivery.id)
        .bind(delivery.next_at);
        self.changed(stmt).await
    }

    /// Records a delivery's attempt: delivered, to retry at `retry_at`, or given up on
    /// (`retry_at: None` with an error).
    pub async fn delivery_attempted(
        &self,
        id: &str,
        outcome: Result<(), (&str, Option<i64>)>,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let q = match outcome {
            Ok(()) => sqlx::query(
                "UPDATE notify_deliveries SET attempts = attempts + 1, delivered_at = $1, last_error = NULL WHERE id = $2",
            )
            .bind(now)
            .bind(id),
            Err((error, Some(retry_at))) => sqlx::query(
                "UPDATE notify_deliveries SET attempts = attempts + 1, next_at = $1, last_error = $2 WHERE id = $3",
            )
            .bind(retry_at)
            .bind(error.to_owned())
            .bind(id),
            Err((error, None)) => sqlx::query(
                "UPDATE notify_deliveries SET attempts = attempts + 1, failed_at = $1, last_error = $2 WHERE id = $3",
            )
            .bind(now)
            .bind(error.to_owned())
            .bind(id),
        };
        q.execute(&self.pool).await?;
        Ok(())
    }
}
