//! Notifications (`docs/notifications.md`): events of a policy's sessions reach the
//! webhooks its `spec.notify` names. The store writes each event in the transaction of
//! what caused it (the outbox); this room's one worker — on the leader, standalone the one
//! process — fans it out to one delivery per target and sends each, at least once, with a
//! stable delivery id, retrying with exponential backoff for up to 24 hours. Each attempt
//! is claimed in the database first, so two senders never send the same delivery. A chat
//! run never waits for it. One [`Channel`] per body format: `webhook.rs` (Kortex's JSON
//! envelope, signed) and `slack.rs` (Slack incoming webhooks).

pub mod slack;
pub mod slack_app;
pub mod webhook;

use crate::catalog::NotifyResolved;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::store::{Delivery, Store, StoreError, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the worker looks for work.
pub const TICK: Duration = Duration::from_secs(1);
/// Retries stop this long after the event.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// A receiver that takes longer to answer counts as failed (and is retried).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// What a channel renders: one delivery of one event to one target.
pub struct Outgoing<'a> {
    /// The delivery (its id is the idempotency key).
    pub delivery: &'a Delivery,
    /// The target, with its Secrets.
    pub target: &'a NotifyResolved,
    /// The dashboard's address (`--public-url`), for links.
    pub public_url: Option<&'a str>,
}

/// A rendered request: its JSON body and extra headers.
pub struct Rendered {
    /// The body (sent as `application/json`).
    pub body: Vec<u8>,
    /// Headers besides `Content-Type`.
    pub headers: Vec<(&'static str, String)>,
}

/// A body format.
pub trait Channel: Send + Sync {
    /// The request for `out`.
    fn render(&self, out: &Outgoing<'_>) -> Rendered;
}

/// The channel of `format`.
pub fn channel(format: crate::crd::NotifyFormat) -> &'static dyn Channel {
    match format {
        crate::crd::NotifyFormat::Json => &webhook::Json,
        crate::crd::NotifyFormat::Slack => &slack::Slack,
    }
}

/// When to try a delivery again after `attempts` failures: 1 s, doubling, at most 10 min.
pub fn backoff(attempts: i64) -> Duration {
    let secs = 1u64 << attempts.clamp(0, 10);
    Duration::from_secs(secs.min(600))
}

/// The notification worker.
pub struct Notifier {
    /// Where events and deliveries are.
    pub store: Store,
    /// The targets, as configured now; the worker sets their policies' `Notify`
    /// condition while a target keeps failing.
    pub config: watch::Sender<Arc<LiveConfig>>,
    /// The egress-guarded clients, as for HTTP plugin tools: the strict one, and the one
    /// of `allowPrivateTargets` (which also uses `HTTPS_PROXY`).
    pub clients: (reqwest::Client, reqwest::Client),
    /// `kortex_notifications_total`.
    pub metrics: Arc<Metrics>,
    /// The dashboard's address, for links.
    pub public_url: Option<String>,
    /// Consecutive failures and the last error, by `(policy, target)`.
    pub failing: std::sync::Mutex<std::collections::BTreeMap<(String, String), (u32, String)>>,
    /// The providers' probes.
    pub probes: crate::llm::probe::ProbeBoard,
    /// When each `(policy, target)` was last sent to (for `minInterval`).
    pub last_sent: std::sync::Mutex<std::collections::BTreeMap<(String, String), i64>>,
    /// Whether each provider was usable at the last tick (`provider.unavailable` is a
    /// change of it, never a first sight).
    pub usable: std::sync::Mutex<std::collections::BTreeMap<crate::catalog::ObjectKey, bool>>,
    /// Slack's Web API and the client calling it, for the events policies' Slack apps
    /// post themselves (`spec.slack.post`); none: they are not posted.
    pub slack: Option<(String, reqwest::Client)>,
}

/// Where a delivery goes.
#[derive(Clone, Copy)]
enum To<'a> {
    /// A `notify` target's webhook.
    Hook(&'a NotifyResolved),
    /// The policy's Slack app (`spec.slack.post`).
    App(&'a crate::catalog::SlackResolved),
}

/// Consecutive failed attempts after which a target's policy says `Notify=False`.
pub const FAILING_AFTER: u32 = 3;

impl Notifier {
    /// A worker for `store`, sending what `config`'s policies declare.
    pub fn new(
        store: Store,
        config: watch::Sender<Arc<LiveConfig>>,
        clients: (reqwest::Client, reqwest::Client),
        metrics: Arc<Metrics>,
        public_url: Option<String>,
        probes: crate::llm::probe::ProbeBoard,
    ) -> Self {
        Self {
            store,
            config,
            clients,
            metrics,
            public_url,
            failing: Default::default(),
            last_sent: Default::default(),
            probes,
            usable: Default::default(),
            slack: None,
        }
    }

    /// Posts the events of policies' Slack apps through Slack's Web API at `api` with
    /// `http`.
    pub fn with_slack(mut self, api: String, http: reqwest::Client) -> Self {
        self.slack = Some((api, http));
        self
    }

    /// Writes `provider.unavailable` for each policy of a provider that was usable at the
    /// last tick and is not now: not ready, or its last probe failed.
    async fn watch_providers(&self, config: &LiveConfig) -> Result<(), StoreError> {
        let mut gone = Vec::new();
        {
            // Read in place: the board is not copied every tick.
            let board = self.probes.read().unwrap_or_else(|e| e.into_inner());
            let mut usable = self.usable.lock().unwrap_or_else(|e| e.into_inner());
            for (key, entry) in &config.catalog.providers {
                let probe = board.get(key);
                let now = entry.available && probe.is_none_or(|p| p.ok);
                if usable.insert(key.clone(), now) == Some(true) && !now {
                    let message = match probe {
                        Some(p) if !p.ok => p.message.clone(),
                        _ => entry
                            .object
                            .status
                            .as_ref()
                            .and_then(|s| {
                                crate::crd::conditions::find(
                                    &s.conditions,
                                    crate::crd::conditions::types::READY,
                                )
                            })
                            .map(|c| c.message.clone())
                            .unwrap_or_default(),
                    };
                    gone.push((key.clone(), message));
                }
            }
        }
        for (key, message) in gone {
            for (pkey, policy) in &config.catalog.policies {
                let spec = &policy.object.spec;
                let uses = pkey.namespace == key.namespace
                    && (spec.provider == key.name || spec.fallback_providers.contains(&key.name));
                if !uses {
                    continue;
                }
                let data = serde_json::json!({
                    "provider": format!("{}/{}", key.namespace, key.name),
                    "message": message,
                });
                self.store
                    .notify_event(
                        "provider.unavailable",
                        &format!("{}/{}", pkey.namespace, pkey.name),
                        &format!("{}/{}", key.namespace, key.name),
                        &data,
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Records an attempt's outcome for the `Notify` condition.
    fn note(&self, delivery: &Delivery, error: Option<&str>) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let key = (delivery.event.policy.clone(), delivery.target.clone());
        match error {
            None => {
                failing.remove(&key);
            }
            Some(e) => {
                let entry = failing.entry(key).or_insert((0, String::new()));
                entry.0 += 1;
                entry.1 = e.to_owned();
            }
        }
    }

    /// Sets each policy's `Notify` condition from what its targets' deliveries did:
    /// `False` (`DeliveryFailing`, naming the target and its last error) once a target
    /// failed [`FAILING_AFTER`] times in a row, `True` again once it delivers. A condition
    /// about the targets' configuration (a Secret missing) is left as it is.
    fn publish(&self) {
        use crate::crd::conditions::{self, Desired, reasons, types};
        let failing = self
            .failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let desired = |key: &crate::catalog::ObjectKey, count: usize| -> Desired {
            let policy = format!("{}/{}", key.namespace, key.name);
            let bad: Vec<String> = failing
                .iter()
                .filter(|((p, _), (n, _))| *p == policy && *n >= FAILING_AFTER)
                .map(|((_, t), (n, e))| format!("{t}: {n} attempts failed, last: {e}"))
                .collect();
            if bad.is_empty() {
                Desired::ok(
                    types::NOTIFY,
                    reasons::READY_TO_SEND,
                    format!("{count} target(s) ready to send"),
                )
            } else {
                Desired::fail(types::NOTIFY, reasons::DELIVERY_FAILING, bad.join("; "))
            }
        };
        let changes: Vec<(crate::catalog::ObjectKey, Desired)> = {
            let live = self.config.borrow();
            live.catalog
                .policies
                .iter()
                .filter_map(|(key, entry)| {
                    let current = conditions::find(
                        entry
                            .object
                            .status
                            .as_ref()
                            .map(|s| s.conditions.as_slice())?,
                        types::NOTIFY,
                    )?;
                    if current.reason != reasons::READY_TO_SEND
                        && current.reason != reasons::DELIVERY_FAILING
                    {
                        return None;
                    }
                    let want = desired(key, entry.notify.len());
                    let same = (current.status == "True") == want.status
                        && current.reason == want.reason
                        && current.message == want.message;
                    (!same).then(|| (key.clone(), want))
                })
                .collect()
        };
        if changes.is_empty() {
            return;
        }
        let now = jiff::Timestamp::now();
        self.config.send_modify(|live| {
            let live = Arc::make_mut(live);
            for (key, want) in &changes {
                if let Some(entry) = live.catalog.policies.get_mut(key)
                    && let Some(status) = entry.object.status.as_mut()
                {
                    let generation = entry.object.metadata.generation;
                    conditions::set(&mut status.conditions, want, generation, now);
                }
            }
        });
    }

    /// Works until `stop` flips; with `leader`, only while this replica leads.
    pub async fn run(
        self,
        mut leader: Option<watch::Receiver<bool>>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            if leader.as_ref().is_none_or(|l| *l.borrow())
                && let Err(e) = self.tick().await
            {
                tracing::warn!(error = %e, "notifications: cannot read or update the outbox");
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = stop.changed() => return,
                _ = crate::operator::lease::leadership_changes(&mut leader) => {}
            }
        }
    }

    /// Fans new events out and sends what is due.
    pub async fn tick(&self) -> Result<(), StoreError> {
        let config = self.config.borrow().clone();
        let result = self.work(&config).await;
        self.publish();
        result
    }

    async fn work(&self, config: &LiveConfig) -> Result<(), StoreError> {
        self.watch_providers(config).await?;
        for event in self.store.unfanned_events(100).await? {
            // A trigger's events also go to the targets the trigger names
            // (`docs/triggers.md#results`).
            let named: Vec<&str> = match event.event_type.as_str() {
                "investigation.finished" | "trigger.skipped" => event.data["notify"]
                    .as_array()
                    .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            let policy = config.catalog.policy_named(&event.policy);
            let mut targets: Vec<String> = policy
                .map(|p| {
                    p.notify
                        .iter()
                        .filter(|t| {
                            named.contains(&t.target.name.as_str())
                                || t.target
                                    .events
                                    .iter()
                                    .any(|e| e.as_str() == event.event_type)
                        })
                        .map(|t| t.target.name.clone())
                        .collect()
                })
                .unwrap_or_default();
            // The policy's Slack app, when it posts this event (`docs/slack.md#posting`).
            if self.slack.is_some()
                && policy
                    .and_then(|p| p.slack.as_ref())
                    .is_some_and(|app| slack_app::posts(app, &event.event_type))
            {
                targets.push(slack_app::TARGET.to_owned());
            }
            self.store
                .fan_out(&event.id, &event.policy, &targets)
                .await?;
        }
        for delivery in self.store.due_deliveries(now_ms(), 50).await? {
            let policy = config.catalog.policy_named(&delivery.event.policy);
            let to = if delivery.target == slack_app::TARGET {
                policy
                    .and_then(|p| p.slack.as_ref())
                    .filter(|app| {
                        self.slack.is_some() && slack_app::posts(app, &delivery.event.event_type)
                    })
                    .map(To::App)
            } else {
                policy
                    .and_then(|p| p.notify.iter().find(|t| t.target.name == delivery.target))
                    .map(To::Hook)
            };
            let Some(to) = to else {
                self.store
                    .delivery_attempted(
                        &delivery.id,
                        Err(("the target is no longer declared by its ChatPolicy", None)),
                    )
                    .await?;
                self.metrics.notification("dropped");
                continue;
            };
            let key = (delivery.event.policy.clone(), delivery.target.clone());
            if let To::Hook(target) = to
                && let Some(min) = target
                    .target
                    .min_interval
                    .filter(|d| !d.is_negative())
                    .map(Duration::from)
                && let Some(last) = self
                    .last_sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                && now_ms() < last + min.as_millis() as i64
            {
                continue;
            }
            // Another sender (a replica of `kortex serve` on the same PostgreSQL) may have
            // taken it.
            let claim_until = now_ms() + (SEND_TIMEOUT.as_millis() as i64) * 3;
            if !self.store.claim_delivery(&delivery, claim_until).await? {
                continue;
            }
            let sent = match to {
                To::Hook(target) => self.send(&delivery, target).await,
                To::App(app) => self.post_to_slack(&delivery, app).await,
            };
            match sent {
                Ok(()) => {
                    self.note(&delivery, None);
                    self.last_sent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key, now_ms());
                    self.store.delivery_attempted(&delivery.id, Ok(())).await?;
                    self.metrics.notification("delivered");
                }
                Err(error) => {
                    self.note(&delivery, Some(&error));
                    let retry_at = now_ms() + backoff(delivery.attempts).as_millis() as i64;
                    let give_up = retry_at > delivery.created_at + GIVE_UP_AFTER.as_millis() as i64;
                    tracing::warn!(
                        policy = %delivery.event.policy,
                        target = %delivery.target,
                        delivery = %delivery.id,
                        attempts = delivery.attempts + 1,
                        error = %error,
                        "notification not delivered{}",
                        if give_up { "; giving up" } else { "; retrying" }
                    );
                    self.store
                        .delivery_attempted(
                            &delivery.id,
                            Err((&error, (!give_up).then_some(retry_at))),
                        )
                        .await?;
                    self.metrics
                        .notification(if give_up { "failed" } else { "retried" });
                }
            }
        }
        Ok(())
    }

    /// One attempt through a policy's Slack app (its bot token; the error never holds it).
    async fn post_to_slack(
        &self,
        delivery: &Delivery,
        app: &crate::catalog::SlackResolved,
    ) -> Result<(), String> {
        let Some((api, http)) = &self.slack else {
            return Err("this server does not post to Slack".into());
        };
        let client = crate::slack::api::Client::new(http.clone(), api, app.bot_token.clone());
        tokio::time::timeout(
            SEND_TIMEOUT * 3,
            slack_app::send(
                &self.store,
                &client,
                app,
                delivery,
                self.public_url.as_deref(),
            ),
        )
        .await
        .unwrap_or_else(|_| Err("Slack did not answer in time".into()))
    }

    /// One attempt; the error never names the URL (a Slack webhook's URL is a credential).
    async fn send(&self, delivery: &Delivery, target: &NotifyResolved) -> Result<(), String> {
        let rendered = channel(target.target.format).render(&Outgoing {
            delivery,
            target,
            public_url: self.public_url.as_deref(),
        });
        let client = if target.target.webhook.allow_private_targets {
            &self.clients.1
        } else {
            &self.clients.0
        };
        let mut request = client
            .post(target.url.expose())
            .timeout(SEND_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(rendered.body);
        for (name, value) in rendered.headers {
            request = request.header(name, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {status}"))
        }
    }
}

/// A link to the session `delivery` is about (hand-overs, failed runs) in the dashboard,
/// when the dashboard's address is known.
pub fn session_link(public_url: Option<&str>, delivery: &Delivery) -> Option<String> {
    let id = delivery.event.data["sessionId"].as_str()?;
    public_url.map(|base| format!("{}/#/chat/{id}", base.trim_end_matches('/')))
}

/// A link to `delivery`'s proposal in the dashboard, when the dashboard's address is known.
pub fn proposal_link(public_url: Option<&str>, delivery: &Delivery) -> Option<String> {
    public_url.map(|base| {
        format!(
            "{}/#/proposals/{}",
            base.trim_end_matches('/'),
            delivery.event.subject
        )
    })
}
