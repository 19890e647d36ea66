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

/// The actual amount of one hold of a call.
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
    /// The lease the call drew its reservation from (none under no limit).
    pub lease: Option<LeaseDraw>,
}

/// What a call drew from a replica's budget lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseDraw {
    /// The lease (its row in `budget_reservations`).
    pub id: String,
    /// The amount drawn (the call's worst case), released from the lease when it settles.
    pub drawn: i64,
}

/// One counter a replica leases budget on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseKey {
    /// The lease's id (its row in `budget_reservations`).
    pub id: String,
    /// The counter's scope.
    pub scope: String,
    /// The counter's window.
    pub window_start: i64,
}

/// How much a lease may take: at least `need`, plus up to `chunk` more while it leaves
/// most of what is free to other replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseAsk {
    /// What the call waiting for it needs.
    pub need: i64,
    /// The extra a lease takes when there is room (so most calls need no round trip).
    pub chunk: i64,
    /// The counter's limit.
    pub limit: i64,
    /// When the counter may be forgotten.
    pub counter_expires_at: i64,
    /// When the lease lapses unless renewed (a dead replica's lease is swept then).
    pub lease_expires_at: i64,
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
        self.traced("UPDATE budgets", async move {
            if holds.is_empty() {
                return Ok(Ok(()));
            }
            let mut tx = self.begin().await?;
            for (index, hold) in holds.iter().enumerate() {
                ensure_counter(&mut tx, &hold.scope, hold.window_start, hold.expires_at).await?;
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
        })
        .await
    }

    /// Settles one call: each hold's draw is released from its lease and its actual amount
    /// counted as used; `usage` (the call's usage event and daily roll-up) is written in
    /// the same transaction, so spend and usage never disagree.
    pub async fn settle_budget(
        &self,
        actual: &[BudgetSettle],
        usage: Option<&UsageEvent>,
    ) -> Result<(), StoreError> {
        self.settle_audited(actual, usage, None).await
    }

    /// [`Store::settle_budget`] with the call's audit row in the same transaction (one
    /// commit instead of two on a chat step's path).
    pub async fn settle_audited(
        &self,
        actual: &[BudgetSettle],
        usage: Option<&UsageEvent>,
        decision: Option<&super::NewDecision>,
    ) -> Result<(), StoreError> {
        self.traced("INSERT usage_events decisions", async move {
            let mut tx = self.begin().await?;
            settle_holds(&mut tx, actual.iter()).await?;
            if let Some(u) = usage {
                super::usage::insert_usage(&mut tx, &[u]).await?;
            }
            if let Some(d) = decision {
                super::audit::insert_decision(&mut tx, d).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Settles many calls in one transaction (write-behind accounting): their holds
    /// (summed per counter and lease: one update each, however many calls), usage events
    /// with their daily roll-ups, and audit rows.
    pub async fn settle_batch(
        &self,
        items: &[(&[BudgetSettle], &UsageEvent, &super::NewDecision)],
    ) -> Result<(), StoreError> {
        self.traced("INSERT usage_events decisions", async move {
            let mut tx = self.begin().await?;
            settle_holds(&mut tx, items.iter().flat_map(|(a, _, _)| a.iter())).await?;
            let usage: Vec<&UsageEvent> = items.iter().map(|(_, u, _)| *u).collect();
            super::usage::insert_usage(&mut tx, &usage).await?;
            let decisions: Vec<&super::NewDecision> = items.iter().map(|(_, _, d)| *d).collect();
            super::audit::insert_decisions(&mut tx, &decisions).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Extends lease `key` by what `ask` allows, in one transaction: `need` plus up to
    /// `chunk` (at most a quarter of what is still free), reserved on the counter by a
    /// conditional update, so replicas together never lease more than the limit. Returns
    /// the amount added, or what the counter has used and reserved when `need` does not fit.
    pub async fn extend_lease(
        &self,
        key: &LeaseKey,
        ask: LeaseAsk,
    ) -> Result<Result<i64, (i64, i64)>, StoreError> {
        let mut tx = self.begin().await?;
        ensure_counter(
            &mut tx,
            &key.scope,
            key.window_start,
            ask.counter_expires_at,
        )
        .await?;
        let (used, reserved) = counter_in(&mut *tx, &key.scope, key.window_start).await?;
        let free = ask.limit - used - reserved - ask.need;
        if free < 0 {
            tx.rollback().await?;
            return Ok(Err((used, reserved)));
        }
        // What was read may have changed since (another replica): the update is
        // conditional, and falls back to `need` alone before giving up.
        let mut granted = None;
        for amount in [ask.need + ask.chunk.min(free / 4), ask.need] {
            let done = sqlx::query(
                "UPDATE budget_counters SET reserved = reserved + $3 \
                 WHERE scope = $1 AND window_start = $2 AND used + reserved + $3 <= $4",
            )
            .bind(&key.scope)
            .bind(key.window_start)
            .bind(amount)
            .bind(ask.limit)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() > 0 {
                granted = Some(amount);
                break;
            }
        }
        let Some(amount) = granted else {
            let now = counter_in(&mut *tx, &key.scope, key.window_start).await?;
            tx.rollback().await?;
            return Ok(Err(now));
        };
        sqlx::query(
            "INSERT INTO budget_reservations (id, scope, window_start, amount, expires_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id, scope, window_start) DO UPDATE SET \
             amount = budget_reservations.amount + excluded.amount, expires_at = excluded.expires_at",
        )
        .bind(&key.id)
        .bind(&key.scope)
        .bind(key.window_start)
        .bind(amount)
        .bind(ask.lease_expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(amount))
    }

    /// Keeps lease `key` until `expires_at`; false when it is gone (swept as expired).
    pub async fn renew_lease(&self, key: &LeaseKey, expires_at: i64) -> Result<bool, StoreError> {
        let stmt = sqlx::query(
            "UPDATE budget_reservations SET expires_at = $4 \
             WHERE id = $1 AND scope = $2 AND window_start = $3",
        )
        .bind(&key.id)
        .bind(&key.scope)
        .bind(key.window_start)
        .bind(expires_at);
        self.changed(stmt).await
    }

    /// Gives `unused` of lease `key` back to its counter; the lease row goes when nothing
    /// is left in it (calls still drawing on it settle against it first).
    pub async fn release_lease(&self, key: &LeaseKey, unused: i64) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let left: Option<i64> = sqlx::query_scalar(
            "UPDATE budget_reservations SET amount = amount - $4 \
             WHERE id = $1 AND scope = $2 AND window_start = $3 AND amount >= $4 RETURNING amount",
        )
        .bind(&key.id)
        .bind(&key.scope)
        .bind(key.window_start)
        .bind(unused)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(left) = left {
            sqlx::query(
                "UPDATE budget_counters SET reserved = reserved - $3 \
                 WHERE scope = $1 AND window_start = $2",
            )
            .bind(&key.scope)
            .bind(key.window_start)
            .bind(unused)
            .execute(&mut *tx)
            .await?;
            if left == 0 {
                sqlx::query(
                    "DELETE FROM budget_reservations WHERE id = $1 AND scope = $2 AND window_start = $3",
                )
                .bind(&key.id)
                .bind(&key.scope)
                .bind(key.window_start)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// How many leases (of any replica) a counter has.
    pub async fn leases_of(&self, scope: &str, window_start: i64) -> Result<i64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM budget_reservations WHERE scope = $1 AND window_start = $2 \
             AND id LIKE 'lease/%'",
        )
        .bind(scope)
        .bind(window_start)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }

    /// Marks the alert of a counter as sent once its use reaches `threshold`; true for the
    /// one caller (across replicas) that gets to send it. With `event` (`(policy, data)`),
    /// writes its `budget.alert` notification in the same transaction.
    pub async fn budget_alert(
        &self,
        scope: &str,
        window_start: i64,
        threshold: i64,
        event: Option<(&str, &serde_json::Value)>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE budget_counters SET alerted = alerted + 1 \
             WHERE scope = $1 AND window_start = $2 AND alerted = 0 AND used >= $3",
        )
        .bind(scope)
        .bind(window_start)
        .bind(threshold)
        .execute(&mut *tx)
        .await?;
        let alerted = done.rows_affected() > 0;
        // `budget.alert` for the policy's notification targets, with the same transaction.
        if alerted && let Some((policy, data)) = event {
            super::notify::add_event(&mut tx, "budget.alert", policy, scope, data).await?;
        }
        tx.commit().await?;
        Ok(alerted)
    }

    /// Writes the `budget.exhausted` event of a counter once per window (the first refusal;
    /// `alerted` keeps it, as 2 added to the alert's 1).
    pub async fn budget_exhausted(
        &self,
        scope: &str,
        window_start: i64,
        policy: &str,
        data: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE budget_counters SET alerted = alerted + 2 \
             WHERE scope = $1 AND window_start = $2 AND alerted < 2",
        )
        .bind(scope)
        .bind(window_start)
        .execute(&mut *tx)
        .await?;
        let first = done.rows_affected() > 0;
        if first {
            super::notify::add_event(&mut tx, "budget.exhausted", policy, scope, data).await?;
        }
        tx.commit().await?;
        Ok(first)
    }

    /// What a counter has used and has reserved (zeros when it does not exist).
    pub async fn budget_used(
        &self,
        scope: &str,
        window_start: i64,
    ) -> Result<(i64, i64), StoreError> {
        counter_in(&self.pool, scope, window_start).await
    }

    /// Releases reservations that expired before `now` (their replica died mid-call) and
    /// forgets counters whose window is long over. Returns how many reservations went.
    pub async fn sweep_budgets(&self, now: i64) -> Result<u64, StoreError> {
        let released = self.release_reservations(now).await?;
        sqlx::query("DELETE FROM budget_counters WHERE expires_at < $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(released)
    }

    /// Releases the reservations (calls in flight and leases) that expire before `before`;
    /// with `i64::MAX` every one, which a sole replica does at start-up: whatever is reserved
    /// then belongs to a process that is gone. Returns how many went.
    pub async fn release_reservations(&self, before: i64) -> Result<u64, StoreError> {
        let expired: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT id, scope, window_start FROM budget_reservations WHERE expires_at < $1 LIMIT 1000",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        let mut released = 0;
        for (id, scope, window_start) in expired {
            let mut tx = self.begin().await?;
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
        Ok(released)
    }
}

/// Creates the counter row if it is not there yet.
async fn ensure_counter(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    scope: &str,
    window_start: i64,
    expires_at: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO budget_counters (scope, window_start, used, reserved, alerted, expires_at) \
         VALUES ($1, $2, 0, 0, 0, $3) ON CONFLICT (scope, window_start) DO NOTHING",
    )
    .bind(scope)
    .bind(window_start)
    .bind(expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What a counter has used and reserved, read through `db` (the pool or a transaction).
async fn counter_in<'e>(
    db: impl sqlx::Executor<'e, Database = sqlx::Any>,
    scope: &str,
    window_start: i64,
) -> Result<(i64, i64), StoreError> {
    let row: Option<(i64, i64)> = sqlx::query_as(
        "SELECT used, reserved FROM budget_counters WHERE scope = $1 AND window_start = $2",
    )
    .bind(scope)
    .bind(window_start)
    .fetch_optional(db)
    .await?;
    Ok(row.unwrap_or((0, 0)))
}

/// Settles holds: their draws are released from their leases and their actual amounts
/// counted as used, summed per counter and lease first (in a stable order, so two
/// replicas' batches lock rows in the same order and cannot deadlock).
async fn settle_holds<'a>(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    actual: impl Iterator<Item = &'a BudgetSettle>,
) -> Result<(), StoreError> {
    // (scope, window) -> (expires_at, used, lease id -> drawn)
    type Sums<'a> = std::collections::BTreeMap<
        (&'a str, i64),
        (i64, i64, std::collections::BTreeMap<&'a str, i64>),
    >;
    let mut sums: Sums<'a> = Default::default();
    for s in actual {
        let entry = sums.entry((s.scope.as_str(), s.window_start)).or_insert((
            s.expires_at,
            0,
            Default::default(),
        ));
        entry.1 += s.amount;
        if let Some(lease) = &s.lease {
            *entry.2.entry(lease.id.as_str()).or_insert(0) += lease.drawn;
        }
    }
    for ((scope, window_start), (expires_at, used, draws)) in sums {
        // A call under no limit reserved nothing, so its counter may not exist yet.
        ensure_counter(tx, scope, window_start, expires_at).await?;
        let mut released = 0;
        for (lease, drawn) in draws {
            // A lease already swept as expired had its whole amount released then.
            let left: Option<i64> = sqlx::query_scalar(
                "UPDATE budget_reservations SET amount = amount - $4 \
                 WHERE id = $1 AND scope = $2 AND window_start = $3 RETURNING amount",
            )
            .bind(lease)
            .bind(scope)
            .bind(window_start)
            .bind(drawn)
            .fetch_optional(&mut **tx)
            .await?;
            if left.is_some() {
                released += drawn;
            }
        }
        sqlx::query(
            "UPDATE budget_counters SET reserved = reserved - $3, used = used + $4 \
             WHERE scope = $1 AND window_start = $2",
        )
        .bind(scope)
        .bind(window_start)
        .bind(released)
        .bind(used)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
