//! The chat engine: sessions, runs and their event log. A message starts a run; the run
//! streams from the session's provider step by step, persisting every SSE event (with a
//! database-issued per-session sequence number) before publishing it to live followers.
//!
//! Owns: the run loop (`run`), run control (`control`), the plan gate (`plan`),
//! `propose_action` and the sessions it tells (`proposals`), the one tool-call path of every
//! door (`tool_calls`), side jobs (`roles`: titles, triage, follow-ups, handovers), calls a
//! provider delegates back over MCP (`delegate`). The engine registers its two router tools
//! (`propose_action`, `submit_plan`) when it is made. Imports `operator`, `proposals`,
//! `tools`, `govern` and below; never `trigger`, `http` or `cli`.

pub mod context;
pub mod control;
pub mod delegate;
pub mod plan;
pub mod proposals;
mod roles;
mod run;

pub use roles::handover_summary;
pub mod tool_calls;

use crate::live::LiveConfig;
use crate::store::SessionState as SS;
use crate::store::{EventRecord, SessionRecord, Store, StoreError};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, watch};
use tracing::Instrument as _;

/// SSE event names (SPEC §5).
pub mod event {
    /// `{runId, state, reason?}`
    pub const RUN_LIFECYCLE: &str = "run.lifecycle";
    /// `{runId, step}`
    pub const STEP_BOUNDARY: &str = "step.boundary";
    /// `{runId, step, provider, model}`: who wrote the step's answer (stored with it).
    pub const STEP_ANSWERED: &str = "step.answered";
    /// `{runId, text}`
    pub const TEXT_DELTA: &str = "text.delta";
    /// `{runId, callId, name, input}`
    pub const TOOL_START: &str = "tool.start";
    /// `{runId, callId, name, ok, isError, errorKind?, durationMs, truncated, preview}`
    pub const TOOL_END: &str = "tool.end";
    /// `{runId, message}`
    pub const NOTICE: &str = "notice";
    /// `{runId, code, message}`
    pub const ERROR: &str = "error";
    /// `{runId, questions}`: suggested next questions after a completed run.
    pub const FOLLOW_UPS: &str = "follow_ups";
    /// `{id, from, to, note, summary, createdAt}`: the session was handed over (no run).
    pub const HANDOVER: &str = "handover";
}

/// Why a chat request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The session is running (or waiting for tool results).
    #[error("session {0} is busy with a run; wait for it to finish or cancel it")]
    Busy(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A budget of the session's policy is used up.
    #[error("{0}")]
    Budget(crate::govern::budget::Exceeded),
    /// The session's policy has its `maxConcurrentRuns` in flight.
    #[error(
        "ChatPolicy {policy} already has {max} runs in flight (budget.maxConcurrentRuns); retry when one ends"
    )]
    TooManyRuns {
        /// `namespace/name` of the policy.
        policy: String,
        /// Its `maxConcurrentRuns`.
        max: u32,
    },
}

/// Gives every tool call of the last assistant message that has no result an error result
/// saying `why`, so the transcript stays valid for providers.
/// With `patient` (a run's own end) the writes wait out an unreachable database; a request
/// or the recovery sweep fails at once instead.
pub async fn answer_pending(
    engine: &Engine,
    session_id: &str,
    run_id: &str,
    why: &str,
    patient: bool,
) -> Result<(), StoreError> {
    let messages = if patient {
        crate::store::patiently("the transcript", || engine.store.list_messages(session_id)).await?
    } else {
        engine.store.list_messages(session_id).await?
    };
    let Some(last) = messages.iter().rposition(|m| m.role == "assistant") else {
        return Ok(());
    };
    let calls: Vec<crate::llm::ToolCall> = messages[last]
        .tool_calls
        .clone()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    for call in calls {
        if messages[last..]
            .iter()
            .any(|m| m.tool_call_id.as_deref() == Some(call.id.as_str()))
        {
            continue;
        }
        let message = crate::store::NewMessage {
            run_id: Some(run_id.to_owned()),
            role: "tool".into(),
            content: why.to_owned(),
            tool_call_id: Some(call.id.clone()),
            is_error: true,
            ..Default::default()
        };
        if patient {
            engine.append(session_id, &message).await?;
        } else {
            engine.store.append_message(session_id, &message).await?;
        }
    }
    Ok(())
}

/// Events a session's live channel holds for its followers (see [`Engine::subscribe`]).
pub const LIVE_EVENTS: usize = 64;

/// How often a replica refreshes the heartbeat of the runs it executes.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);
/// A run whose heartbeat is older than this belongs to a replica that stopped.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The engine, shared by every request of the process.
pub struct Engine {
    /// The database.
    pub store: Store,
    /// The live configuration.
    pub config: watch::Receiver<Arc<LiveConfig>>,
    /// This replica's id (owner of the runs it executes).
    pub replica: String,
    /// The tools sessions may call.
    pub router: Arc<crate::tools::Router>,
    hub: Mutex<HashMap<String, broadcast::Sender<EventRecord>>>,
    cancels: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// Runs whose task is alive here: only these get heartbeats.
    live: Mutex<std::collections::HashSet<String>>,
    /// In cluster mode, proposals are `ActionProposal` objects (set once at start-up).
    pub cluster: std::sync::OnceLock<crate::operator::proposals::ClusterProposals>,
    /// Standalone with a kubeconfig: carries out approved proposals in that cluster (set
    /// once at start-up; never in cluster mode, where the leader executes).
    pub executor: std::sync::OnceLock<crate::proposals::executor::Executor>,
    /// The latest Kubernetes token of each session's user (memory only, never stored):
    /// tools run as the user with it (`runToolsAsUser`).
    tokens: Mutex<HashMap<(String, String), crate::operator::auth::KubeCredential>>,
    /// The latest OAuth token of each session's user (memory only, never stored): what
    /// `oauthTokenExchange` tools exchange to call on their behalf.
    subjects: Mutex<HashMap<(String, String), crate::tools::mcp_oauth::SubjectToken>>,
    /// Cluster mode: builds clients acting as a session's user.
    pub cluster_auth: std::sync::OnceLock<Arc<crate::operator::auth::ClusterAuth>>,
    /// Budgets and usage accounting of every provider call.
    pub governor: Arc<crate::govern::Governor>,
    /// Provider adapters, reused while the configuration does not change.
    pub adapters: crate::llm::AdapterCache,
    /// Credentials of runs whose provider calls Kortex's tools over `/mcp` (`claude-code`).
    pub delegations: Arc<delegate::Delegations>,
    /// This replica's own `/mcp` URL (loopback), set once it listens.
    pub local_mcp: std::sync::OnceLock<String>,
    /// The providers' probes and the probe interval: a route whose fresh probe found its
    /// provider unreachable is not tried (set once the prober runs).
    pub probes: std::sync::OnceLock<(crate::llm::probe::ProbeBoard, std::time::Duration)>,
}

impl Engine {
    /// An engine over `store` and `config`.
    pub fn new(
        store: Store,
        config: watch::Receiver<Arc<LiveConfig>>,
        mut router: crate::tools::Router,
    ) -> Arc<Self> {
        let governor = crate::govern::Governor::new(store.clone(), router.metrics());
        Arc::new_cyclic(|me| {
            // The two tools that record something for a session, carried out by this engine.
            router.add(Arc::new(proposals::ProposeAction(me.clone())));
            router.add(Arc::new(plan::SubmitPlan(me.clone())));
            Self::with(store, config, Arc::new(router), governor)
        })
    }

    fn with(
        store: Store,
        config: watch::Receiver<Arc<LiveConfig>>,
        router: Arc<crate::tools::Router>,
        governor: Arc<crate::govern::Governor>,
    ) -> Self {
        Self {
            governor,
            adapters: crate::llm::AdapterCache::default(),
            store,
            config,
            router,
            replica: crate::store::new_id(),
            hub: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
            live: Mutex::new(std::collections::HashSet::new()),
            cluster: std::sync::OnceLock::new(),
            executor: std::sync::OnceLock::new(),
            tokens: Mutex::new(HashMap::new()),
            subjects: Mutex::new(HashMap::new()),
            cluster_auth: std::sync::OnceLock::new(),
            delegations: Arc::default(),
            local_mcp: std::sync::OnceLock::new(),
            probes: std::sync::OnceLock::new(),
        }
    }

    /// Remembers the token `user` last presented posting in `session_id` (memory only).
    /// Kept per user: in a shared session, a run acts with the token of whom it acts for,
    /// never with that of someone else who posted meanwhile.
    pub fn remember_token(
        &self,
        session_id: &str,
        user: &str,
        token: crate::operator::auth::KubeCredential,
    ) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.insert((session_id.to_owned(), user.to_owned()), token);
    }

    /// Remembers the OAuth token `user` last presented posting in `session_id` (memory
    /// only); `None` (they came in otherwise) forgets the one before.
    pub fn remember_subject(
        &self,
        session_id: &str,
        user: &str,
        subject: Option<crate::tools::mcp_oauth::SubjectToken>,
    ) {
        let mut subjects = self.subjects.lock().unwrap_or_else(|e| e.into_inner());
        let key = (session_id.to_owned(), user.to_owned());
        match subject {
            Some(s) => subjects.insert(key, s),
            None => subjects.remove(&key),
        };
    }

    /// The OAuth token `user` last presented in `session_id`, if any.
    pub fn subject_of(
        &self,
        session_id: &str,
        user: &str,
    ) -> Option<crate::tools::mcp_oauth::SubjectToken> {
        let subjects = self.subjects.lock().unwrap_or_else(|e| e.into_inner());
        subjects
            .get(&(session_id.to_owned(), user.to_owned()))
            .cloned()
    }

    /// Who the Kubernetes tools act as in a run of `session_id` acting for `user` under a
    /// policy with `runToolsAsUser` = `as_user`.
    pub fn kube_identity(
        &self,
        session_id: &str,
        user: &str,
        as_user: bool,
    ) -> crate::tools::KubeIdentity {
        self.kube_identity_of(self.token_of(session_id, user).as_ref(), as_user)
    }

    /// Who the Kubernetes tools act as for a caller who presented `token` (their Kubernetes
    /// bearer token, if any) under a policy with `runToolsAsUser` = `as_user`.
    pub fn kube_identity_of(
        &self,
        token: Option<&crate::operator::auth::KubeCredential>,
        as_user: bool,
    ) -> crate::tools::KubeIdentity {
        use crate::tools::KubeIdentity;
        let Some(auth) = self.cluster_auth.get() else {
            return KubeIdentity::Kortex;
        };
        if !as_user {
            return KubeIdentity::Kortex;
        }
        match token {
            Some(token) => match auth.client_as(token) {
                Ok(client) => KubeIdentity::User(client),
                Err(e) => KubeIdentity::Missing(e.to_string()),
            },
            None => KubeIdentity::Missing(
                "the ChatPolicy runs Kubernetes tools as the signed-in user (runToolsAsUser), and this session's user has no Kubernetes identity here (signed in with an API key, or on loopback); with runToolsAsUser: false Kortex reads with its own rights".into(),
            ),
        }
    }

    /// The token `user` last presented in `session_id`, if any.
    pub fn token_of(
        &self,
        session_id: &str,
        user: &str,
    ) -> Option<crate::operator::auth::KubeCredential> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens
            .get(&(session_id.to_owned(), user.to_owned()))
            .cloned()
    }

    /// Live events of a session (subscribe before replaying from the database, then drop
    /// duplicates by sequence number).
    ///
    /// A channel holds [`LIVE_EVENTS`] events, preallocated: a follower that falls further
    /// behind catches up from the database. Channels nobody follows any more are dropped
    /// here, so the hub holds only the sessions being watched (it kept every session ever
    /// followed, at 1 024 slots each: 180 KiB per session, found by the soak benchmark).
    pub fn subscribe(&self, session_id: &str) -> broadcast::Receiver<EventRecord> {
        let mut hub = self.hub.lock().unwrap_or_else(|e| e.into_inner());
        hub.retain(|_, tx| tx.receiver_count() > 0);
        hub.entry(session_id.to_owned())
            .or_insert_with(|| broadcast::channel(LIVE_EVENTS).0)
            .subscribe()
    }

    /// Appends a message of a run to its session's transcript, waiting for the database
    /// while it is unreachable ([`crate::store::patiently`]).
    pub async fn append(
        &self,
        session_id: &str,
        message: &crate::store::NewMessage,
    ) -> Result<crate::store::MessageRecord, StoreError> {
        crate::store::patiently("a message", || {
            self.store.append_message(session_id, message)
        })
        .await
    }

    /// Appends a message of a run with the event announcing it (one transaction), then
    /// publishes the event; waits for the database while it is unreachable.
    pub async fn append_and_emit(
        &self,
        session_id: &str,
        message: &crate::store::NewMessage,
        event_type: &str,
        data: Value,
    ) -> Result<crate::store::MessageRecord, StoreError> {
        let (record, event) = crate::store::patiently("a message", || {
            self.store
                .append_message_and_event(session_id, message, event_type, &data)
        })
        .await?;
        self.deliver(session_id, event);
        Ok(record)
    }

    /// Hands a persisted event to the followers of this replica.
    fn deliver(&self, session_id: &str, record: EventRecord) {
        let sender = self
            .hub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_id)
            .cloned();
        if let Some(sender) = sender {
            let _ = sender.send(record);
        }
    }

    /// Persists an event of a run, then publishes it to live followers. While the database
    /// is unreachable the run waits for it ([`crate::store::patiently`]).
    pub async fn emit(
        &self,
        session_id: &str,
        run_id: &str,
        event_type: &str,
        data: Value,
    ) -> Result<EventRecord, StoreError> {
        self.publish(session_id, Some(run_id), event_type, data, true)
            .await
    }

    /// [`Self::emit`] for a request or a sweep: fails at once when the database is
    /// unreachable (someone is waiting for the answer, or the sweep comes round again).
    pub async fn emit_now(
        &self,
        session_id: &str,
        run_id: &str,
        event_type: &str,
        data: Value,
    ) -> Result<EventRecord, StoreError> {
        self.publish(session_id, Some(run_id), event_type, data, false)
            .await
    }

    /// Persists and publishes an event that belongs to no run (e.g. a proposal decision),
    /// failing at once when the database is unreachable (a request is waiting).
    pub async fn emit_session(
        &self,
        session_id: &str,
        event_type: &str,
        data: Value,
    ) -> Result<EventRecord, StoreError> {
        self.publish(session_id, None, event_type, data, false)
            .await
    }

    /// Persists an event (the database issues its sequence number), then hands it to the
    /// followers of this replica.
    async fn publish(
        &self,
        session_id: &str,
        run_id: Option<&str>,
        event_type: &str,
        data: Value,
        patient: bool,
    ) -> Result<EventRecord, StoreError> {
        let append = || {
            self.store
                .append_event(session_id, run_id, event_type, &data)
        };
        let record = if patient {
            crate::store::patiently("a run's event", append).await?
        } else {
            append().await?
        };
        self.deliver(session_id, record.clone());
        Ok(record)
    }

    /// Stores `actor`'s message and starts a run in the background that acts for them
    /// (budgets, audit, their own token): in a shared session, not always its owner.
    /// Refused while the session has a run (compare-and-set on its status, so two replicas
    /// cannot both start).
    pub async fn start_run(
        self: &Arc<Self>,
        session: &SessionRecord,
        actor: &str,
        content: &str,
    ) -> Result<String, ChatError> {
        self.start_run_with_id(session, actor, content, crate::store::new_id())
            .await
    }

    /// [`Self::start_run`] with the run's id chosen by the caller: a trigger's event id, so
    /// that the run an event started is found again after a crash and never started twice.
    // Long because a run's start is one ordered claim: the session, the policy's runs in
    // flight, its budgets, then the question stored and the run recorded, each undone if
    // a later one refuses.
    pub async fn start_run_with_id(
        self: &Arc<Self>,
        session: &SessionRecord,
        actor: &str,
        content: &str,
        run_id: String,
    ) -> Result<String, ChatError> {
        if !self
            .store
            .transition_session(&session.id, &[SS::Idle, SS::Failed], SS::Running)
            .await?
        {
            return Err(ChatError::Busy(session.id.clone()));
        }
        // A run is a request: it counts against the policy's budgets, and a spent budget
        // refuses it before anything is stored.
        let (scope, redactor) = {
            let config = self.config.borrow().clone();
            let catalog = &config.catalog;
            match catalog.policy_of(session) {
                Some(p) => (
                    Some(crate::govern::Scope::new(
                        p,
                        actor,
                        Some(&session.id),
                        "chat",
                    )),
                    crate::redact::Redactor::for_policy(catalog, p),
                ),
                None => (
                    None,
                    crate::redact::Redactor::secrets_only(catalog.redactor.clone()),
                ),
            }
        };
        // A policy's runs in flight: checked before the run counts against any budget, and
        // again, atomically, when it is recorded.
        let limit = scope.as_ref().map(|s| {
            let max = s.budget.as_ref().and_then(|b| b.max_concurrent_runs);
            (s.policy.as_str(), max)
        });
        let too_many = |policy: &str, max: u32| {
            self.governor.metrics().refused("concurrent_runs");
            ChatError::TooManyRuns {
                policy: policy.to_owned(),
                max,
            }
        };
        if let Some((policy, Some(max))) = limit {
            let refused = match self.store.runs_in_flight(policy).await {
                Ok(n) if n >= u64::from(max) => Some(too_many(policy, max)),
                Ok(_) => None,
                Err(e) => Some(e.into()),
            };
            if let Some(e) = refused {
                let _ = self
                    .store
                    .transition_session(&session.id, &[SS::Running], session.status)
                    .await;
                return Err(e);
            }
        }
        let mut notices = Vec::new();
        if let Some(scope) = &scope {
            let admitted = match self.governor.admit(scope).await {
                Ok(Ok(alerts)) => Ok(alerts),
                Ok(Err(exceeded)) => Err(ChatError::Budget(exceeded)),
                Err(e) => Err(e.into()),
            };
            match admitted {
                Ok(alerts) => notices = alerts,
                Err(e) => {
                    let _ = self
                        .store
                        .transition_session(&session.id, &[SS::Running], session.status)
                        .await;
                    return Err(e);
                }
            }
        }
        // What the user typed is stored (and sent) redacted, like any text from outside.
        let (content, _) = redactor.text(content);
        let message = crate::store::NewMessage {
            run_id: Some(run_id.clone()),
            role: "user".into(),
            content,
            author: Some(actor.to_owned()),
            ..Default::default()
        };
        let give_back = || async {
            let _ = self
                .store
                .transition_session(&session.id, &[SS::Running], session.status)
                .await;
        };
        // Not recorded (too many runs, or a run of this id exists: a trigger's event started
        // elsewhere): nothing of ours to end.
        let created = match self
            .store
            .create_run(&run_id, &session.id, &self.replica, actor, limit)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => {
                let (policy, max) = limit.unwrap_or_default();
                Err(too_many(policy, max.unwrap_or_default()))
            }
            Err(e) => Err(ChatError::from(e)),
        };
        if let Err(e) = created {
            give_back().await;
            return Err(e);
        }
        if let Err(e) = self.store.append_message(&session.id, &message).await {
            // Give the session back rather than leave it running with no run behind it, and
            // end the run (best effort: the sweep ends it otherwise).
            let _ = self
                .store
                .finish_run(
                    &run_id,
                    "failed",
                    Some("not started: the message could not be stored"),
                )
                .await;
            give_back().await;
            return Err(e.into());
        }
        self.spawn(session, &run_id, false, notices);
        Ok(run_id)
    }

    /// Continues a run that waited for dynamic tool results (already stored; the session
    /// already moved back to `running`).
    pub async fn resume_run(
        self: &Arc<Self>,
        session: &SessionRecord,
        run_id: &str,
    ) -> Result<(), ChatError> {
        self.store.reopen_run(run_id, &self.replica).await?;
        self.spawn(session, run_id, true, Vec::new());
        Ok(())
    }

    /// Takes on a parked run again (already marked `running`, owned by this replica).
    pub fn continue_run(self: &Arc<Self>, session: &SessionRecord, run_id: &str) {
        self.spawn(session, run_id, true, Vec::new());
    }

    fn spawn(
        self: &Arc<Self>,
        session: &SessionRecord,
        run_id: &str,
        resume: bool,
        notices: Vec<String>,
    ) {
        let (cancel_tx, cancel_rx) = watch::channel(false);
        self.cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.id.clone(), cancel_tx.clone());
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run_id.to_owned());
        // Cancels requested at another replica arrive through the database.
        let watcher = {
            let store = self.store.clone();
            let id = run_id.to_owned();
            let tx = cancel_tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    if let Ok(Some(crate::store::RunState::Cancelling)) =
                        store.run_status(&id).await
                    {
                        let _ = tx.send(true);
                        return;
                    }
                }
            })
        };
        let engine = self.clone();
        let mut session = session.clone();
        let id = run_id.to_owned();
        // The request that started (or took up) the run: its trace's parent.
        let origin = tracing::Span::current();
        tokio::spawn(async move {
            // Within a run, the session's `user` is whom the run acts for: recorded when it
            // started, so a resumed or taken-over run still acts for who posted.
            let mut traceparent = None;
            match engine.store.run_origin(&id).await {
                Ok((actor, parent)) => {
                    if let Some(actor) = actor {
                        session.user = actor;
                    }
                    traceparent = parent;
                }
                Err(e) => {
                    tracing::warn!(run = %id, error = %e, "cannot read whom a run acts for; it acts for the session's owner")
                }
            }
            let span = crate::telemetry::trace::run_span(
                &origin,
                &session.id,
                &id,
                session.policy.as_deref(),
            );
            match traceparent {
                // Taken up again (after a pause, a client's tool results, a restart): the
                // same trace goes on.
                Some(parent) => crate::telemetry::trace::continue_trace(&span, &parent),
                None => {
                    if let Some(parent) = crate::telemetry::trace::traceparent(&span)
                        && let Err(e) = engine.store.set_run_traceparent(&id, &parent).await
                    {
                        tracing::warn!(run = %id, error = %e, "cannot record the run's trace");
                    }
                }
            }
            run::run(&engine, &session, &id, resume, notices, cancel_rx)
                .instrument(span)
                .await;
            watcher.abort();
            engine
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            // A resumed run of the same session may have registered its own handle already.
            let mut cancels = engine.cancels.lock().unwrap_or_else(|e| e.into_inner());
            if cancels
                .get(&session.id)
                .is_some_and(|tx| tx.same_channel(&cancel_tx))
            {
                cancels.remove(&session.id);
            }
        });
    }

    /// Fails every run whose owner stopped beating before `stale_before` (Unix ms): the run
    /// and its session become `failed`, tool calls left without a result get error results,
    /// and the session's stream says why. Returns how many runs were recovered.
    pub async fn recover(&self, stale_before: i64) -> Result<usize, StoreError> {
        let reason =
            "the server running this run stopped (crash, restart or lost replica); ask again";
        let mut recovered = 0;
        for (run_id, session_id) in self.store.stale_runs(stale_before).await? {
            if !self
                .store
                .fail_stale_run(&run_id, stale_before, reason)
                .await?
            {
                continue;
            }
            recovered += 1;
            answer_pending(
                self,
                &session_id,
                &run_id,
                &format!("no result: {reason}"),
                false,
            )
            .await?;
            self.store
                .transition_session(&session_id, &[SS::Running], SS::Failed)
                .await?;
            let error =
                serde_json::json!({"runId": run_id, "code": "run_interrupted", "message": reason});
            self.emit_now(&session_id, &run_id, event::ERROR, error)
                .await?;
            let lifecycle =
                serde_json::json!({"runId": run_id, "state": "failed", "reason": reason});
            self.emit_now(&session_id, &run_id, event::RUN_LIFECYCLE, lifecycle)
                .await?;
            tracing::warn!(run = %run_id, session = %session_id, "recovered a run whose owner stopped");
        }
        Ok(recovered)
    }

    /// A sole replica (SQLite) at start-up, before it serves: every run found running and
    /// every budget reservation belong to a process that ended without finishing them (a
    /// crash, `kill -9`), so the runs end `failed` and the reservations are released now
    /// rather than when they would have gone stale.
    pub async fn recover_sole_replica(&self) {
        if let Err(e) = self.recover(crate::store::now_ms() + 1).await {
            tracing::warn!(error = %e, "recovering interrupted runs failed");
        }
        // In pages of up to 1 000, until none is left.
        let mut released = 0;
        loop {
            match self.store.release_reservations(i64::MAX).await {
                Ok(0) => break,
                Ok(n) => released += n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot release budget reservations");
                    break;
                }
            }
        }
        if released > 0 {
            tracing::warn!(
                released,
                "released the budget reservations of a server that stopped without settling them"
            );
        }
    }

    /// Keeps this replica's runs alive (heartbeat every `HEARTBEAT`) and recovers runs of
    /// replicas that stopped beating for `STALE_AFTER`, until `shutdown` flips.
    pub async fn maintain(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(HEARTBEAT) => {}
                _ = shutdown.changed() => return,
            }
            let live: Vec<String> = self
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            if let Err(e) = self.store.heartbeat_runs(&self.replica, &live).await {
                tracing::warn!(error = %e, "run heartbeat failed");
            }
            let stale_before = crate::store::now_ms() - STALE_AFTER.as_millis() as i64;
            if let Err(e) = self.recover(stale_before).await {
                tracing::warn!(error = %e, "recovering interrupted runs failed");
            }
            if let Err(e) = control::expire_paused(&self).await {
                tracing::warn!(error = %e, "expiring paused runs failed");
            }
        }
    }

    /// Stops the runs writing to `sessions` — on this replica at once, elsewhere through
    /// the database (their owners poll) — and waits up to `within` for them to end.
    /// Whether none is writing any more.
    pub async fn stop_runs(
        &self,
        sessions: &[String],
        within: std::time::Duration,
    ) -> Result<bool, crate::store::StoreError> {
        for id in sessions {
            if !self.cancel(id) {
                self.store.request_cancel(id).await?;
            }
        }
        let deadline = tokio::time::Instant::now() + within;
        for id in sessions {
            while self.store.writing(id).await? {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(false);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        Ok(true)
    }

    /// Asks the session's running run to stop. Returns whether a run was running here.
    pub fn cancel(&self, session_id: &str) -> bool {
        match self
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_id)
        {
            Some(tx) => tx.send(true).is_ok(),
            None => false,
        }
    }
}
