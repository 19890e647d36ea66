//! ChatPolicy enforcement shared by every endpoint that calls a provider (SPEC §1.2, §3):
//! routes in failover order ([`route`]), budgets ([`budget`]) and the one accounting path
//! ([`Governor`]): a call is admitted, its estimated cost reserved, and its usage settled —
//! a `usage_events` row, the daily roll-up, the budget counters and the metrics, together.
//! Every caller of a provider keeps an attempt's books the same way ([`attempt`]); rate
//! limits ([`rate`]) and reachability ([`reach`]) sit beside them. Imports `llm`, `store`,
//! `catalog` and below.

pub mod attempt;
pub mod budget;
pub mod budget_lease;
pub mod rate;
pub mod reach;
pub mod route;

use crate::catalog::PolicyEntry;
use crate::crd::{Budget, ModelCost};
use crate::llm::{ChatRequest, Usage};
use crate::metrics::{BudgetLabels, LlmCallLabels, LlmLabels, Metrics, TokenLabels};
use crate::store::{
    BudgetSettle, LeaseDraw, NewDecision, Store, StoreError, UsageEvent, new_id, now_ms,
};
use budget::{Counter, Counters, Exceeded};
use budget_lease::Leases;
use std::sync::Arc;
use std::time::Duration;

/// How often expired reservations are released.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Who a call is made for, under which policy.
#[derive(Clone, Debug)]
pub struct Scope {
    /// `namespace/name` of the governing policy.
    pub policy: String,
    /// Its budget.
    pub budget: Option<Budget>,
    /// User (or gateway team).
    pub user: String,
    /// Chat session id, if any.
    pub session: Option<String>,
    /// What makes the call: `chat`, `summarize`, `triage`, `gateway`.
    pub source: &'static str,
}

impl Scope {
    /// The scope of a call by `user` (in `session`) under `policy`.
    pub fn new(
        policy: &PolicyEntry,
        user: &str,
        session: Option<&str>,
        source: &'static str,
    ) -> Self {
        Self {
            policy: policy.qualified_name(),
            budget: policy.object.spec.budget.clone(),
            user: user.to_owned(),
            session: session.map(str::to_owned),
            source,
        }
    }

    fn counters(&self, now: i64) -> Counters {
        Counters::new(
            &self.policy,
            self.budget.as_ref(),
            &self.user,
            self.session.as_deref(),
            now,
        )
    }

    fn alert_at(&self) -> Option<u8> {
        self.budget.as_ref().and_then(|b| b.alert_at_percent)
    }
}

/// Budget held for a call in flight. Settle it with [`Governor::settle`]; one dropped
/// unsettled (a cancelled request) gives its budget back.
pub struct Reservation {
    scope: Scope,
    counters: Counters,
    /// What the call drew from this replica's leases: requests, dollars, tokens.
    draws: [Option<LeaseDraw>; 3],
    leases: Arc<Leases>,
    /// `LLMProvider` name.
    pub provider: String,
    /// The model asked for.
    pub model: String,
    cost: Option<ModelCost>,
    /// The estimated input tokens: what a call that reached the provider costs at least.
    estimated_input: u64,
    settled: bool,
    store: Store,
}

impl Drop for Reservation {
    /// A reservation dropped unsettled belongs to a request that went away mid-call (the
    /// client disconnected): the provider has the prompt, so its estimated input is
    /// charged (outcome `cancelled`) and the rest given back.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let books = books(
            self,
            &Outcome {
                outcome: "cancelled".into(),
                ..Default::default()
            },
        );
        let store = self.store.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = store
                    .settle_budget(&books.actual, Some(&books.event))
                    .await
                {
                    tracing::warn!(error = %e, "cannot settle a dropped budget reservation; it expires on its own");
                }
            });
        }
    }
}

/// What settling `reservation` with `outcome` writes; marks it settled. A call reported
/// without usage that was not a provider failure (`ok`, `cancelled`: a stream cut short,
/// a server that sends no usage) is charged its estimated input, never nothing.
fn books(reservation: &mut Reservation, outcome: &Outcome) -> Books {
    reservation.settled = true;
    let model = if outcome.model.is_empty() {
        reservation.model.clone()
    } else {
        outcome.model.clone()
    };
    let usage = if outcome.usage == Usage::default()
        && matches!(outcome.outcome.as_str(), "ok" | "cancelled")
    {
        Usage {
            input_tokens: reservation.estimated_input,
            output_tokens: 0,
            estimated: true,
        }
    } else {
        outcome.usage
    };
    let cost_usd = crate::llm::cost_usd(reservation.cost.as_ref(), usage);
    let micros = (cost_usd * budget::MICROS).round() as i64;
    let tokens = i64::try_from(usage.input_tokens + usage.output_tokens).unwrap_or(i64::MAX);
    let c = &reservation.counters;
    let [requests, usd, session] = std::mem::take(&mut reservation.draws);
    let mut actual = Vec::with_capacity(3);
    if let Some(draw) = requests {
        // A request is one, whatever the call used.
        actual.push(c.requests.settle(1, Some(draw)));
    }
    actual.push(c.usd.settle(micros, usd));
    if let Some(t) = &c.tokens {
        actual.push(t.settle(tokens, session));
    }
    for s in actual.iter().filter(|s| s.lease.is_some()) {
        reservation.leases.settled(&s.scope, s.window_start);
    }
    let scope = &reservation.scope;
    let event = UsageEvent {
        at: now_ms(),
        source: scope.source.to_owned(),
        policy: scope.policy.clone(),
        session_id: scope.session.clone(),
        user: scope.user.clone(),
        provider: reservation.provider.clone(),
        model,
        input_tokens: usage.input_tokens as i64,
        output_tokens: usage.output_tokens as i64,
        cost_usd,
        latency_ms: outcome.latency_ms,
        outcome: outcome.outcome.clone(),
        estimated: usage.estimated,
    };
    Books {
        actual,
        event,
        scope: reservation.scope.clone(),
        counters: reservation.counters.clone(),
    }
}

/// How a call ended, for the books.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Tokens the provider reported.
    pub usage: Usage,
    /// The model that answered (empty: the one asked for).
    pub model: String,
    /// Latency in milliseconds.
    pub latency_ms: i64,
    /// `ok`, or an error kind.
    pub outcome: String,
}

/// Budgets and accounting for every provider call.
pub struct Governor {
    store: Store,
    metrics: Arc<Metrics>,
    /// This replica's budget leases.
    leases: Arc<Leases>,
    /// Books waiting for the background writer.
    queue: tokio::sync::mpsc::Sender<Deferred>,
    pending: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Deferred>>>,
    /// Calls taken from the queue and not yet written.
    writing: std::sync::atomic::AtomicUsize,
}

/// What one settled call writes.
struct Books {
    actual: Vec<BudgetSettle>,
    event: UsageEvent,
    scope: Scope,
    counters: Counters,
}

/// A call's books and audit row, waiting to be written.
struct Deferred {
    books: Books,
    decision: NewDecision,
}

/// Most calls waiting for the background writer; beyond, callers wait for room.
const QUEUE: usize = 2048;
/// Most calls written in one transaction.
const BATCH: usize = 1024;
/// How long the writer lets calls gather after the first one of a batch: one transaction
/// for every call of that time (a few pages of the database written, instead of a few per
/// call). Books reach the database this much later.
const LINGER: Duration = Duration::from_millis(50);

impl Governor {
    /// A governor over `store`.
    /// The metrics the governor counts in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn new(store: Store, metrics: Arc<Metrics>) -> Arc<Self> {
        let (queue, pending) = tokio::sync::mpsc::channel(QUEUE);
        Arc::new(Self {
            store,
            metrics,
            leases: Arc::new(Leases::new()),
            queue,
            pending: std::sync::Mutex::new(Some(pending)),
            writing: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn refused(&self, e: Exceeded) -> Exceeded {
        self.metrics
            .budget_refusals
            .get_or_create(&BudgetLabels {
                policy: e.policy.clone(),
                budget: e.kind.field(),
            })
            .inc();
        e
    }

    /// A refusal: counted, and — once per budget window — a `budget.exhausted` event for
    /// the policy's notification targets.
    async fn exhausted(&self, counter: &Counter, e: Exceeded) -> Result<Exceeded, StoreError> {
        let data = serde_json::json!({
            "policy": e.policy,
            "budget": e.kind.field(),
            "limit": e.kind.show(e.limit),
            "used": e.kind.show(e.used),
            "resetsAt": e.resets_at.and_then(|at| jiff::Timestamp::from_millisecond(at).ok()).map(|t| t.to_string()),
            "message": format!(
                "ChatPolicy {} has used up its {} ({} of {}); requests are refused until it resets",
                e.policy,
                e.kind.field(),
                e.kind.show(e.used),
                e.kind.show(e.limit)
            ),
        });
        self.store
            .budget_exhausted(&counter.scope, counter.window_start, &e.policy, &data)
            .await?;
        Ok(self.refused(e))
    }

    /// Admits one request (a chat run or a gateway call): counts it against
    /// `perUserHourlyRequests`, and refuses up front when the policy's daily spend or the
    /// session's tokens are already used up. Returns the alerts crossed.
    pub async fn admit(&self, scope: &Scope) -> Result<Result<Vec<String>, Exceeded>, StoreError> {
        let now = now_ms();
        let c = scope.counters(now);
        for counter in std::iter::once(&c.usd).chain(c.tokens.as_ref()) {
            if let Some(limit) = counter.limit {
                let (used, reserved) = self
                    .store
                    .budget_used(&counter.scope, counter.window_start)
                    .await?;
                // Calls in flight may still settle below their reservations: only what is
                // spent refuses a request up front.
                if used >= limit {
                    return Ok(Err(self
                        .exhausted(counter, counter.exceeded(&scope.policy, used + reserved))
                        .await?));
                }
            }
        }
        let holds: Vec<_> = std::iter::once(&c.requests)
            .filter(|r| r.limit.is_some())
            .map(|r| r.hold(1, true))
            .collect();
        if let Err(refused) = self.store.reserve_budget(&new_id(), &holds, now).await? {
            return Ok(Err(self
                .exhausted(
                    &c.requests,
                    c.requests.exceeded(&scope.policy, refused.used),
                )
                .await?));
        }
        let mut alerts = Vec::new();
        self.alert(scope, &c.requests, &mut alerts).await?;
        Ok(Ok(alerts))
    }

    /// Reserves the worst-case cost of `request` on `provider`/`model` (estimated input
    /// plus the whole output allowance `max_output`): dollars against `dailyUsdLimit`,
    /// tokens against `perSessionTokenCap`. Concurrent calls cannot overshoot together.
    pub async fn reserve(
        &self,
        scope: &Scope,
        provider: &str,
        model: &str,
        cost: Option<&ModelCost>,
        request: &ChatRequest,
        max_output: u32,
    ) -> Result<Result<Reservation, Exceeded>, StoreError> {
        self.reserve_inner(scope, (provider, model), cost, (request, max_output), false)
            .await
    }

    /// [`Governor::reserve`] that also counts the call as a request (a gateway call) in
    /// the same transaction: one database round trip before the provider is called.
    pub async fn admit_and_reserve(
        &self,
        scope: &Scope,
        provider: &str,
        model: &str,
        cost: Option<&ModelCost>,
        request: &ChatRequest,
        max_output: u32,
    ) -> Result<Result<Reservation, Exceeded>, StoreError> {
        self.reserve_inner(scope, (provider, model), cost, (request, max_output), true)
            .await
    }

    /// Reserves for `(provider, model)` the worst case of `(request, max_output)`, and
    /// `count_request` also counts the request.
    async fn reserve_inner(
        &self,
        scope: &Scope,
        (provider, model): (&str, &str),
        cost: Option<&ModelCost>,
        (request, max_output): (&ChatRequest, u32),
        count_request: bool,
    ) -> Result<Result<Reservation, Exceeded>, StoreError> {
        let now = now_ms();
        let counters = scope.counters(now);
        let input = crate::llm::estimate_input(request);
        let micros = budget::estimate_micros(cost, input, u64::from(max_output));
        let tokens = i64::try_from(input + u64::from(max_output)).unwrap_or(i64::MAX);
        // Only budgets with a limit are drawn on: a budget without one has nothing to
        // refuse and is counted when the call settles.
        let asked: [(Option<&Counter>, i64); 3] = [
            (count_request.then_some(&counters.requests), 1),
            (Some(&counters.usd), micros),
            (counters.tokens.as_ref(), tokens),
        ];
        let mut wants = Vec::new();
        let mut slots = Vec::new();
        for (slot, (counter, amount)) in asked.iter().enumerate() {
            if let Some(want) = counter.and_then(|c| c.want(*amount)) {
                wants.push(want);
                slots.push(slot);
            }
        }
        let drawn = match self.leases.draw(&self.store, &wants, now).await? {
            Ok(drawn) => drawn,
            Err(no_room) => {
                let counter = asked[slots[no_room.index]].0.unwrap_or(&counters.usd);
                return Ok(Err(self
                    .exhausted(counter, counter.exceeded(&scope.policy, no_room.used))
                    .await?));
            }
        };
        let mut draws: [Option<LeaseDraw>; 3] = Default::default();
        for (slot, draw) in slots.into_iter().zip(drawn) {
            draws[slot] = Some(draw);
        }
        Ok(Ok(Reservation {
            scope: scope.clone(),
            counters,
            draws,
            leases: self.leases.clone(),
            provider: provider.to_owned(),
            model: model.to_owned(),
            cost: cost.copied(),
            estimated_input: input,
            settled: false,
            store: self.store.clone(),
        }))
    }

    /// The books of settling `reservation`, with the metrics counted.
    fn books(&self, reservation: &mut Reservation, outcome: &Outcome) -> Books {
        let books = books(reservation, outcome);
        let (e, m) = (&books.event, &self.metrics);
        m.llm_calls
            .get_or_create(&LlmCallLabels {
                provider: e.provider.clone(),
                outcome: e.outcome.clone(),
            })
            .inc();
        for (direction, n) in [("input", e.input_tokens), ("output", e.output_tokens)] {
            m.llm_tokens
                .get_or_create(&TokenLabels {
                    provider: e.provider.clone(),
                    model: e.model.clone(),
                    direction,
                })
                .inc_by(u64::try_from(n).unwrap_or(0));
        }
        let labels = LlmLabels {
            provider: e.provider.clone(),
            model: e.model.clone(),
        };
        m.llm_cost.get_or_create(&labels).inc_by(e.cost_usd);
        // Settled in the call's own trace (a run's or a gateway request's): the exemplar.
        m.llm_duration.get_or_create(&labels).observe(
            outcome.latency_ms.max(0) as f64 / 1000.0,
            crate::metrics::TraceExemplar::current(),
            None,
        );
        books
    }

    /// Settles `reservation` with what the call actually used: the usage event and daily
    /// roll-up, the budget counters and the metrics. Returns the budget alerts this call
    /// crossed (`alertAtPercent`), each reported once per window across replicas.
    pub async fn settle(
        &self,
        reservation: Reservation,
        outcome: &Outcome,
    ) -> Result<Vec<String>, StoreError> {
        self.settle_audited(reservation, outcome, None).await
    }

    /// [`Governor::settle`] with the call's audit row written in the same transaction.
    pub async fn settle_audited(
        &self,
        mut reservation: Reservation,
        outcome: &Outcome,
        decision: Option<&NewDecision>,
    ) -> Result<Vec<String>, StoreError> {
        let books = self.books(&mut reservation, outcome);
        self.store
            .settle_audited(&books.actual, Some(&books.event), decision)
            .await?;
        let mut alerts = Vec::new();
        self.alerts_of(&books.scope, &books.counters, &mut alerts)
            .await?;
        Ok(alerts)
    }

    /// Settles like [`Governor::settle`], written behind: the call's books and its audit
    /// row join the next batch of the background writer (one transaction for many calls,
    /// off the request path). When the queue is full the caller waits for room (so memory
    /// stays bounded and load slows down instead); if the writer is gone (shutting down)
    /// the caller writes them itself. Nothing is dropped. Alerts go to the log (a gateway
    /// call has no session to tell).
    pub async fn settle_later(
        &self,
        mut reservation: Reservation,
        outcome: &Outcome,
        mut decision: NewDecision,
    ) {
        let books = self.books(&mut reservation, outcome);
        // Written by another task: the trace id is taken here, in the call's trace.
        if decision.trace_id.is_none() {
            decision.trace_id = crate::telemetry::trace::current_trace_id();
        }
        let item = Deferred { books, decision };
        let running = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none();
        if !running {
            // No background writer (yet): write now.
            self.write_batch(vec![item]).await;
            return;
        }
        if let Err(closed) = self.queue.send(item).await {
            self.write_batch(vec![closed.0]).await;
        }
    }

    async fn write_batch(&self, batch: Vec<Deferred>) {
        let rows: Vec<_> = batch
            .iter()
            .map(|d| (d.books.actual.as_slice(), &d.books.event, &d.decision))
            .collect();
        if let Err(e) = self.store.settle_batch(&rows).await {
            // One bad row must not lose the others: write them one by one.
            tracing::warn!(error = %e, calls = rows.len(), "a batch of usage rows failed; writing them one by one");
            for row in &rows {
                if let Err(e) = self.store.settle_batch(std::slice::from_ref(row)).await {
                    // Its lease still expires, so the budget recovers.
                    tracing::error!(error = %e, policy = %row.1.policy, "cannot write the usage of a gateway call");
                }
            }
        }
        // Alerts are checked once per counter of the batch, not per call.
        let mut seen: std::collections::HashSet<(String, i64)> = Default::default();
        for d in &batch {
            let c = &d.books.counters;
            let fresh = std::iter::once(&c.usd)
                .chain(c.tokens.as_ref())
                .any(|c| seen.insert((c.scope.clone(), c.window_start)));
            if !fresh {
                continue;
            }
            let mut alerts = Vec::new();
            match self
                .alerts_of(&d.books.scope, &d.books.counters, &mut alerts)
                .await
            {
                Ok(()) => {
                    for a in alerts {
                        tracing::warn!(policy = %d.books.scope.policy, "{a}");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot check budget alerts"),
            }
        }
    }

    async fn alerts_of(
        &self,
        scope: &Scope,
        counters: &Counters,
        alerts: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        self.alert(scope, &counters.usd, alerts).await?;
        if let Some(t) = &counters.tokens {
            self.alert(scope, t, alerts).await?;
        }
        Ok(())
    }

    /// Counts a failover away from `provider`.
    pub fn failover(&self, provider: &str, model: &str) {
        self.metrics
            .llm_failovers
            .get_or_create(&LlmLabels {
                provider: provider.to_owned(),
                model: model.to_owned(),
            })
            .inc();
    }

    async fn alert(
        &self,
        scope: &Scope,
        counter: &Counter,
        alerts: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let (Some(pct), Some(limit)) = (scope.alert_at(), counter.limit) else {
            return Ok(());
        };
        let threshold = (limit as f64 * f64::from(pct) / 100.0).ceil() as i64;
        let event = serde_json::json!({
            "policy": scope.policy,
            "budget": counter.kind.field(),
            "alertAtPercent": pct,
            "threshold": counter.kind.show(threshold),
            "limit": counter.kind.show(limit),
            "message": format!(
                "ChatPolicy {} has used over {pct}% of its {} ({})",
                scope.policy,
                counter.kind.field(),
                counter.kind.show(limit)
            ),
        });
        if self
            .store
            .budget_alert(
                &counter.scope,
                counter.window_start,
                threshold,
                Some((&scope.policy, &event)),
            )
            .await?
        {
            let (used, _) = self
                .store
                .budget_used(&counter.scope, counter.window_start)
                .await?;
            alerts.push(format!(
                "ChatPolicy {} has used over {pct}% of its {} ({} of {})",
                scope.policy,
                counter.kind.field(),
                counter.kind.show(used),
                counter.kind.show(limit)
            ));
        }
        Ok(())
    }

    /// The policy's spend today (USD), as counted for its budget.
    pub async fn spent_today(&self, policy: &str) -> Result<f64, StoreError> {
        let (used, _) = self
            .store
            .budget_used(&budget::usd_scope(policy), budget::day_start(now_ms()))
            .await?;
        Ok(used as f64 / budget::MICROS)
    }

    /// The background duties until `stop` turns true: writes deferred books in batches
    /// (then the rest at stop) and releases expired reservations every [`SWEEP_EVERY`].
    pub async fn sweep(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let writer = pending.map(|mut rx| {
            let me = self.clone();
            tokio::spawn(async move {
                use std::sync::atomic::Ordering;
                while let Some(first) = rx.recv().await {
                    me.writing.fetch_add(1, Ordering::SeqCst);
                    let mut batch = vec![first];
                    // Calls that arrive meanwhile go together (unless the queue fills up).
                    let until = tokio::time::Instant::now() + LINGER;
                    while rx.len() < QUEUE / 2 && tokio::time::Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    while batch.len() < BATCH {
                        match rx.try_recv() {
                            Ok(item) => {
                                me.writing.fetch_add(1, Ordering::SeqCst);
                                batch.push(item);
                            }
                            Err(_) => break,
                        }
                    }
                    let n = batch.len();
                    me.write_batch(batch).await;
                    me.writing.fetch_sub(n, Ordering::SeqCst);
                }
            })
        });
        loop {
            self.leases.maintain(&self.store, now_ms(), false).await;
            match self.store.sweep_budgets(now_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    released = n,
                    "released budget reservations of calls that never finished"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot sweep budget reservations"),
            }
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        // Whatever is queued is written before the process ends.
        if let Some(writer) = writer {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while (self.queue.capacity() < QUEUE
                || self.writing.load(std::sync::atomic::Ordering::SeqCst) > 0)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            writer.abort();
        }
        // What this replica leased and did not use goes back to the other replicas.
        self.release_leases().await;
    }

    /// Gives back every unused budget lease (at shutdown; settled calls keep their books).
    pub async fn release_leases(&self) {
        self.leases.maintain(&self.store, now_ms(), true).await;
    }
}
