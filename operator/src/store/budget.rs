//! Budget counters and reservations (SPEC §3 Budgets). The arithmetic is the database's:
//! a reservation is a conditional UPDATE, so concurrent calls on any number of replicas
//! cannot overshoot a limit together.

use super::{Store, StoreError, UsageEvent};

/// One budget a call draws on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetHold {
    /// What is counted (e.g. `usd/<namespace>/<policy>`).
    pub scope: String,
    /// Start of the fixed UTC window (Unix ms; 0 for a lifetime budget).
    pub window_start: i64,
    /// When the counter may be forgotten (Unix ms).
    pub expires_at: i64,
    /// How much to reserve (or count, when `settled`).
    pub amount: i64,
    /// Refuse when `used + reserved + amount` would exceed this.
    pub limit: Option<i64>,
    /// Count `amount` as used right away (requests), instead of reserving it.
    pub settled: bool,
}

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetRefused {
    /// Index of the hold that did not fit.
    pub index: usize,
    /// What that budget has used and reserved.
    pub used: i64,
}

/// The actual amount of one reserved hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetSettle {
    /// The hold's scope.
    pub scope: String,
    /// The hold's window.
    pub window_start: i64,
    /// The amount actually used.
    pub amount: i64,
    /// When the counter may be forgotten (it is created if no reservation made it).
    pub expires_at: i64,
}

impl Store {
    /// Reserves every hold under reservation `id`, all or none; the reservations expire at
    /// `hold_until` (Unix ms) unless settled before.
    pub async fn reserve_budget(
        &self,
        id: &str,
        holds: &[BudgetHold],
        hold_until: i64,
    ) -> Result<Result<(), BudgetRefused>, StoreError> {
        if holds.is_empty() {
            return Ok(Ok(()));
        }
        let mut tx = self.pool.begin().await?;
        for (index, hold) in holds.iter().enumerate() {
            sqlx::query(
                "INSERT INTO budget_counters (scope, window_start, used, reserved, alerted, expires_at) \
                 VALUES ($1, $2, 0, 0, 0, $3) ON CONFLICT (scope, window_start) DO NOTHING",
            )
            .bind(&hold.scope)
            .bind(hold.window_start)
            .bind(hold.expires_at)
            .execute(&mut *tx)
            .await?;
            let column = if hold.settled { "used" } else { "reserved" };
            let done = match hold.limit {
                Some(limit) => {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE budget_counters SET {column} = {column} + $3 \
                         WHERE scope = $1 AND window_start = $2 AND used + reserved + $3 <= $4"
                    )))
                    .bind(&hold.scope)
                    .bind(hold.window_start)
                    .bind(hold.amount)
                    .bind(limit)
                    .execute(&mut *tx)
                    .await?
                }
                None => {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE budget_counters SET {column} = {column} + $3 \
                         WHERE scope = $1 AND window_start = $2"
                    )))
                    .bind(&hold.scope)
                    .bind(hold.window_start)
                    .bind(hold.amount)
                    .execute(&mut *tx)
                    .await?
                }
            };
            if done.rows_affected() == 0 {
                tx.rollback().await?;
                let (used, reserved) = self.budget_used(&hold.scope, hold.window_start).await?;
                return Ok(Err(BudgetRefused {
                    index,
                    used: used + reserved,
                }));
            }
            if !hold.settled {
                sqlx::query(
                    "INSERT INTO budget_reservations (id, scope, window_start, amount, expires_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(id)
                .bind(&hold.scope)
                .bind(hold.window_start)
                .bind(hold.amount)
                .bind(hold_until)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(Ok(()))
    }

    /// Settles reservation `id`: each hold's reservation is released and its actual amount
    /// counted as used; `usage` (the call's usage event and daily roll-up) is written in
    /// the same transaction, so spend and usage never disagree.
    pub async fn settle_budget(
        &self,
        id: &str,
        actual: &[BudgetSettle],
        usage: Option<&UsageEvent>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        settle_holds(&mut tx, id, actual).await?;
        if let Some(u) = usage {
            super::repo::insert_usage(&mut tx, u).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Settles many calls in one transaction (write-behind accounting): for each, its
    /// reservation, usage event and audit row, as [`Store::settle_budget`] and
    /// `record_decision` would one by one.
    pub async fn settle_batch(
        &self,
        items: &[(String, Vec<BudgetSettle>, UsageEvent, super::NewDecision)],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (id, actual, usage, decision) in items {
            settle_holds(&mut tx, id, actual).await?;
            super::repo::insert_usage(&mut tx, usage).await?;
            super::repo::insert_decision(&mut tx, decision).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks the alert of a counter as sent once its use reaches `threshold`; true for the
    /// one caller (across replicas) that gets to send it.
    pub async fn budget_alert(
        &self,
        scope: &str,
        window_start: i64,
        threshold: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE budget_counters SET alerted = 1 \
             WHERE scope = $1 AND window_start = $2 AND alerted = 0 AND used >= $3",
        )
        .bind(scope)
        .bind(window_start)
        .bind(threshold)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// What a counter has used and has reserved (zeros when it does not exist).
    pub async fn budget_used(
        &self,
        scope: &str,
        window_start: i64,
    ) -> Result<(i64, i64), StoreError> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT used, reserved FROM budget_counters WHERE scope = $1 AND window_start = $2",
        )
        .bind(scope)
        .bind(window_start)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.unwrap_or((0, 0)))
    }

    /// Releases reservations that expired before `now` (their replica died mid-call) and
    /// forgets counters whose window is long over. Returns how many reservations went.
    pub async fn sweep_budgets(&self, now: i64) -> Result<u64, StoreError> {
        let expired: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT id, scope, window_start FROM budget_reservations WHERE expires_at < $1 LIMIT 1000",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        let mut released = 0;
        for (id, scope, window_start) in expired {
            let mut tx = self.pool.begin().await?;
            let amount: Option<i64> = sqlx::query_scalar(
                "DELETE FROM budget_reservations WHERE id = $1 AND scope = $2 AND window_start = $3 \
                 RETURNING amount",
            )
            .bind(&id)
            .bind(&scope)
            .bind(window_start)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(amount) = amount {
                sqlx::query(
                    "UPDATE budget_counters SET reserved = reserved - $3 \
                     WHERE scope = $1 AND window_start = $2",
                )
                .bind(&scope)
                .bind(window_start)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
                released += 1;
            }
            tx.commit().await?;
        }
        sqlx::query("DELETE FROM budget_counters WHERE expires_at < $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(released)
    }
}

/// Releases the reservations of `id` on each hold and counts the actual amounts as used.
async fn settle_holds(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
    actual: &[BudgetSettle],
) -> Result<(), StoreError> {
    for s in actual {
        // A call under no limit reserved nothing, so its counter may not exist yet.
        sqlx::query(
            "INSERT INTO budget_counters (scope, window_start, used, reserved, alerted, expires_at) \
             VALUES ($1, $2, 0, 0, 0, $3) ON CONFLICT (scope, window_start) DO NOTHING",
        )
        .bind(&s.scope)
        .bind(s.window_start)
        .bind(s.expires_at)
        .execute(&mut **tx)
        .await?;
        let released: Option<i64> = sqlx::query_scalar(
            "DELETE FROM budget_reservations WHERE id = $1 AND scope = $2 AND window_start = $3 \
             RETURNING amount",
        )
        .bind(id)
        .bind(&s.scope)
        .bind(s.window_start)
        .fetch_optional(&mut **tx)
        .await?;
        // A reservation already released as expired is not released twice.
        sqlx::query(
            "UPDATE budget_counters SET reserved = reserved - $3, used = used + $4 \
             WHERE scope = $1 AND window_start = $2",
        )
        .bind(&s.scope)
        .bind(s.window_start)
        .bind(released.unwrap_or(0))
        .bind(s.amount)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
