//! Run control: the one table of what a control does to a run in each state, and the
//! controls carried out — pause (the run parks at its next step boundary: no task, no
//! provider connection, no budget held), resume (on any replica), redirect (a user turn the
//! run takes in, exactly once, at its next boundary) and cancel. The database is the only
//! coordination, so a control works from any replica and survives restarts. Every
//! transition is a `run.lifecycle` event and a `run_control` audit row.

use super::{Engine, event};
use crate::store::SessionState as SS;
use crate::store::{NewDecision, SessionRecord, StoreError};
use crate::store::{RunRecord, RunState};
use serde_json::{Value, json};

/// What a person asks of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Stop at the next step boundary, keeping everything.
    Pause,
    /// Go on after a pause.
    Resume,
    /// Add a user turn at the next step boundary.
    Redirect,
    /// End it.
    Cancel,
    /// Approve the plan it waits on (perhaps edited).
    ApprovePlan,
    /// Reject the plan it waits on: the run is cancelled.
    RejectPlan,
}

/// What comes with a control.
#[derive(Clone, Copy, Debug, Default)]
pub struct Input<'a> {
    /// A redirect's message.
    pub message: Option<&'a str>,
    /// A redirect's rewind target: the model no longer sees the steps after this one.
    pub rewind_to: Option<i64>,
    /// A plan approval's edits: the step ids kept, in order (`None`: all).
    pub steps: Option<&'a [String]>,
}

impl Control {
    /// The control's name in routes and audit rows.
    pub fn name(self) -> &'static str {
        match self {
            Control::Pause => "pause",
            Control::Resume => "resume",
            Control::Redirect => "redirect",
            Control::Cancel => "cancel",
            Control::ApprovePlan => "approve the plan of",
            Control::RejectPlan => "reject the plan of",
        }
    }
}

/// What a control does to a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// `running → pausing`: the run parks at its next boundary.
    AskPause,
    /// `pausing → running`: resumed before it parked.
    WithdrawPause,
    /// `paused → running`: a replica takes the run on again.
    Unpark,
    /// A redirect is kept for the run's next boundary; the state stays.
    Queue,
    /// `running|pausing → cancelling`: its owner stops it.
    CancelLive,
    /// `paused → cancelled`.
    CancelParked,
    /// `requires_action → cancelled`: the pending client calls get error results.
    CancelWaiting,
    /// `awaiting_plan → running`, the plan approved.
    Approve,
    /// `awaiting_plan → cancelled`, the plan rejected.
    Reject,
}

/// Why a control was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The run ended.
    #[error("run {run} is {state}: a finished run takes no control")]
    Final {
        /// The run.
        run: String,
        /// `completed`, `failed` or `cancelled`.
        state: String,
    },
    /// Not from this state.
    #[error(
        "run {run} is {state}: it cannot be {action} now; {}",
        next_steps(state)
    )]
    State {
        /// The run.
        run: String,
        /// Its state.
        state: String,
        /// e.g. `resumed`.
        action: &'static str,
    },
}

/// What a run in `state` does take, for a refusal to say.
fn next_steps(state: &str) -> &'static str {
    match RunState::parse(state) {
        Some(RunState::Running) => "pause, redirect or cancel it",
        Some(RunState::Pausing | RunState::Paused) => "resume, redirect or cancel it",
        Some(RunState::AwaitingPlan) => {
            "approve or reject its plan (plan/approve, plan/reject), or cancel it"
        }
        Some(RunState::RequiresAction) => "post the client's tool results, or cancel it",
        Some(RunState::Cancelling) => "wait for it to stop",
        _ => "see its state in the session's run.lifecycle events",
    }
}

/// The transition table: what `control` does to a run in `state`.
pub fn decide(run: &str, state: RunState, control: Control) -> Result<Effect, Refusal> {
    use Control::*;
    use RunState::*;
    let effect = match (state, control) {
        (s, _) if s.is_final() => {
            return Err(Refusal::Final {
                run: run.to_owned(),
                state: state.to_string(),
            });
        }
        (Running, Pause) => Effect::AskPause,
        (Pausing, Resume) => Effect::WithdrawPause,
        (Paused, Resume) => Effect::Unpark,
        (Running | Pausing | Paused, Redirect) => Effect::Queue,
        (Running | Pausing, Cancel) => Effect::CancelLive,
        (Paused, Cancel) => Effect::CancelParked,
        (RequiresAction, Cancel) => Effect::CancelWaiting,
        (AwaitingPlan, ApprovePlan) => Effect::Approve,
        (AwaitingPlan, RejectPlan | Cancel) => Effect::Reject,
        (_, control) => {
            return Err(Refusal::State {
                run: run.to_owned(),
                state: state.to_string(),
                action: match control {
                    Pause => "paused",
                    Resume => "resumed",
                    Redirect => "redirected",
                    Cancel => "cancelled",
                    ApprovePlan | RejectPlan => "given a plan decision (it waits for none)",
                },
            });
        }
    };
    Ok(effect)
}

/// Why a control could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Refused in this state.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// No such run in the session.
    #[error("no run {0} in this session")]
    NotFound(String),
    /// A plan edit names a step the plan did not have.
    #[error("{0}")]
    PlanEdit(String),
    /// A rewind target the run never reached.
    #[error("{0}")]
    Rewind(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A `run_control` audit row: who moved the run from `from` to `to`.
async fn audit(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    user: &str,
    (from, to): (&str, &str),
    detail: Value,
) {
    let _ = engine
        .store
        .record_decision(&NewDecision {
            kind: "run_control".into(),
            namespace: Some(session.namespace.clone()),
            session_id: Some(session.id.clone()),
            run_id: Some(run_id.to_owned()),
            user: Some(user.to_owned()),
            policy: session.policy.clone(),
            subject: run_id.to_owned(),
            outcome: to.to_owned(),
            detail: json!({"from": from, "to": to, "detail": detail}),
            trace_id: None,
        })
        .await;
}

/// Records a transition: a `run.lifecycle` event and a `run_control` audit row.
async fn record(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    user: &str,
    (from, to): (&str, &str),
    detail: Value,
) -> Result<(), StoreError> {
    let mut data = json!({"runId": run_id, "state": to, "by": user});
    if let Some(reason) = detail.get("reason") {
        data["reason"] = reason.clone();
    }
    engine
        .emit_now(&session.id, run_id, event::RUN_LIFECYCLE, data)
        .await?;
    audit(engine, session, run_id, user, (from, to), detail).await;
    Ok(())
}

/// Carries out `control` on run `run_id` of `session` for `user`; `message` is a
/// redirect's. Returns the run's state afterwards.
pub async fn apply(
    engine: &std::sync::Arc<Engine>,
    session: &SessionRecord,
    run_id: &str,
    user: &str,
    control: Control,
    input: Input<'_>,
) -> Result<Value, ControlError> {
    let run = engine
        .store
        .run_record(run_id)
        .await?
        .filter(|r| r.session_id == session.id)
        .ok_or_else(|| ControlError::NotFound(run_id.to_owned()))?;
    let effect = decide(run_id, run.status, control)?;
    let ctl = Ctl {
        engine,
        session,
        run_id,
        user,
        control,
    };
    match effect {
        Effect::AskPause => ctl.ask_pause().await,
        Effect::WithdrawPause => ctl.withdraw_pause().await,
        Effect::Unpark => ctl.unpark().await,
        Effect::Queue => ctl.queue(&run, input).await,
        Effect::CancelLive => ctl.cancel_live(&run).await,
        Effect::CancelParked => ctl.cancel_parked().await,
        Effect::CancelWaiting => ctl.cancel_waiting().await,
        Effect::Approve => ctl.approve_plan(input).await,
        Effect::Reject => ctl.reject_plan().await,
    }
}

/// One control being carried out: who asks what of which run.
#[derive(Clone, Copy)]
struct Ctl<'a> {
    engine: &'a std::sync::Arc<Engine>,
    session: &'a SessionRecord,
    run_id: &'a str,
    user: &'a str,
    control: Control,
}

impl Ctl<'_> {
    /// A state that changed under us (the run moved on meanwhile), said as it is now.
    async fn moved_on(&self) -> Result<Value, ControlError> {
        let now = self
            .engine
            .store
            .run_record(self.run_id)
            .await?
            .map(|r| r.status);
        let changed = Refusal::State {
            run: self.run_id.to_owned(),
            state: now.map_or_else(|| "gone".to_owned(), |s| s.to_string()),
            action: "changed",
        };
        Err(ControlError::from(match now {
            Some(state) => decide(self.run_id, state, self.control)
                .err()
                .unwrap_or(changed),
            None => changed,
        }))
    }

    /// `running → pausing`: the run parks at its next step boundary.
    async fn ask_pause(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if !engine
            .store
            .transition_run(run_id, RunState::Running, RunState::Pausing)
            .await?
        {
            return self.moved_on().await;
        }
        record(
            engine,
            session,
            run_id,
            user,
            ("running", "pausing"),
            json!({}),
        )
        .await?;
        Ok(json!({"runId": run_id, "state": "pausing"}))
    }

    /// `pausing → running`: resumed before it parked.
    async fn withdraw_pause(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if !engine
            .store
            .transition_run(run_id, RunState::Pausing, RunState::Running)
            .await?
        {
            return self.moved_on().await;
        }
        record(
            engine,
            session,
            run_id,
            user,
            ("pausing", "running"),
            json!({"reason": "resumed before it paused"}),
        )
        .await?;
        Ok(json!({"runId": run_id, "state": "running"}))
    }

    /// `paused → running`: this replica takes the run on again.
    async fn unpark(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if !engine.store.unpark_run(run_id, &engine.replica).await? {
            return self.moved_on().await;
        }
        engine
            .store
            .transition_session(&session.id, &[SS::Paused], SS::Running)
            .await?;
        record(
            engine,
            session,
            run_id,
            user,
            ("paused", "running"),
            json!({"reason": "resumed"}),
        )
        .await?;
        let mut running = session.clone();
        running.status = SS::Running;
        engine.continue_run(&running, run_id);
        Ok(json!({"runId": run_id, "state": "running"}))
    }

    /// A redirect, kept for the run's next boundary (optionally rewinding to a step).
    async fn queue(&self, run: &RunRecord, input: Input<'_>) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        let text = input.message.unwrap_or_default();
        // Stored as redacted as anything a user types.
        let redactor = {
            let config = engine.config.borrow().clone();
            match config.catalog.policy_of(session) {
                Some(p) => crate::redact::Redactor::for_policy(&config.catalog, p),
                None => crate::redact::Redactor::secrets_only(config.catalog.redactor.clone()),
            }
        };
        let (text, _) = redactor.text(text);
        if let Some(n) = input.rewind_to {
            let steps = engine.store.run_steps(&session.id, run_id).await?;
            if n < 1 || !steps.contains(&n) {
                return Err(ControlError::Rewind(format!(
                    "rewindTo {n}: run {run_id} has no such step (its steps: {})",
                    steps
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let id = engine
            .store
            .add_redirect(run_id, &session.id, user, &text, input.rewind_to)
            .await?;
        record(
            engine,
            session,
            run_id,
            user,
            (run.status.as_str(), "redirecting"),
            json!({"redirectId": id, "rewindTo": input.rewind_to}),
        )
        .await?;
        Ok(json!({"runId": run_id, "state": run.status, "redirectId": id}))
    }

    /// `running|pausing → cancelling`: its owner stops it.
    async fn cancel_live(&self, run: &RunRecord) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if !(engine.cancel(&session.id) || engine.store.request_cancel(&session.id).await?) {
            return self.moved_on().await;
        }
        // Its `cancelled` event comes when the run stops.
        audit(
            engine,
            session,
            run_id,
            user,
            (run.status.as_str(), "cancelling"),
            json!({}),
        )
        .await;
        Ok(json!({"runId": run_id, "state": "cancelling"}))
    }

    /// `paused → cancelled`.
    async fn cancel_parked(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if !end_parked(engine, session, run_id, "cancelled by the user", false).await? {
            return self.moved_on().await;
        }
        audit(
            engine,
            session,
            run_id,
            user,
            ("paused", "cancelled"),
            json!({}),
        )
        .await;
        Ok(json!({"runId": run_id, "state": "cancelled"}))
    }

    /// `requires_action → cancelled`: the pending client calls get error results.
    async fn cancel_waiting(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        // Hold the session (as running, so no message or tool result slips in) while the
        // pending client calls get error results, then release it.
        if !engine
            .store
            .transition_session(&session.id, &[SS::RequiresAction], SS::Running)
            .await?
        {
            return self.moved_on().await;
        }
        let why = "cancelled by the user before the client returned a result";
        super::answer_pending(engine, &session.id, run_id, why, false).await?;
        let reason = "cancelled by the user";
        finish_cancelled(engine, session, run_id, SS::Running, reason).await?;
        record(
            engine,
            session,
            run_id,
            user,
            ("requires_action", "cancelled"),
            json!({"reason": reason}),
        )
        .await?;
        Ok(json!({"runId": run_id, "state": "cancelled"}))
    }

    /// `awaiting_plan → running`: the plan approved (possibly edited), the run goes on.
    async fn approve_plan(&self, input: Input<'_>) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        let plan = engine
            .store
            .latest_plan(run_id)
            .await?
            .filter(|p| p.status == "proposed")
            .ok_or_else(|| ControlError::NotFound(format!("{run_id}'s plan")))?;
        let steps = super::plan::edit(&plan.steps, input.steps).map_err(ControlError::PlanEdit)?;
        if !engine
            .store
            .decide_plan(&plan.id, "approved", Some(&steps), user)
            .await?
        {
            return self.moved_on().await;
        }
        // The submit_plan call's result is the decision.
        engine
            .store
            .append_message(
                &session.id,
                &crate::store::NewMessage {
                    run_id: Some(run_id.to_owned()),
                    role: "tool".into(),
                    content: super::plan::approved_text(user, &steps),
                    tool_call_id: Some(plan.call_id.clone()),
                    ..Default::default()
                },
            )
            .await?;
        if !engine
            .store
            .take_run(run_id, RunState::AwaitingPlan, &engine.replica)
            .await?
        {
            return self.moved_on().await;
        }
        engine
            .store
            .transition_session(&session.id, &[SS::AwaitingPlan], SS::Running)
            .await?;
        record(
            engine,
            session,
            run_id,
            user,
            ("awaiting_plan", "running"),
            json!({"reason": "plan approved", "planId": plan.id, "steps": steps}),
        )
        .await?;
        let mut running = session.clone();
        running.status = SS::Running;
        engine.continue_run(&running, run_id);
        Ok(json!({"runId": run_id, "state": "running", "planId": plan.id, "steps": steps}))
    }

    /// `awaiting_plan → cancelled`: the plan rejected.
    async fn reject_plan(&self) -> Result<Value, ControlError> {
        let Ctl {
            engine,
            session,
            run_id,
            user,
            ..
        } = *self;
        if let Some(plan) = engine
            .store
            .latest_plan(run_id)
            .await?
            .filter(|p| p.status == "proposed")
        {
            engine
                .store
                .decide_plan(&plan.id, "rejected", None, user)
                .await?;
        }
        let reason = format!("the plan was rejected by {user}");
        super::answer_pending(engine, &session.id, run_id, &reason, false).await?;
        if !engine
            .store
            .transition_run(run_id, RunState::AwaitingPlan, RunState::Cancelling)
            .await?
        {
            return self.moved_on().await;
        }
        finish_cancelled(engine, session, run_id, SS::AwaitingPlan, &reason).await?;
        record(
            engine,
            session,
            run_id,
            user,
            ("awaiting_plan", "cancelled"),
            json!({"reason": reason}),
        )
        .await?;
        Ok(json!({"runId": run_id, "state": "cancelled"}))
    }
}

/// Ends a parked run as `cancelled` (the session goes back to `idle`). Returns whether it
/// was still parked.
async fn end_parked(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    reason: &str,
    notice: bool,
) -> Result<bool, StoreError> {
    // Compare-and-set: of the replicas that might end it, one does.
    let from = if engine
        .store
        .transition_run(run_id, RunState::Paused, RunState::Cancelling)
        .await?
    {
        SS::Paused
    } else if engine
        .store
        .transition_run(run_id, RunState::AwaitingPlan, RunState::Cancelling)
        .await?
    {
        // The plan's call gets its result: the transcript stays valid.
        super::answer_pending(engine, &session.id, run_id, reason, false).await?;
        SS::AwaitingPlan
    } else {
        return Ok(false);
    };
    if notice {
        engine
            .emit_now(
                &session.id,
                run_id,
                event::NOTICE,
                json!({"runId": run_id, "message": reason}),
            )
            .await?;
    }
    finish_cancelled(engine, session, run_id, from, reason).await?;
    engine
        .emit_now(
            &session.id,
            run_id,
            event::RUN_LIFECYCLE,
            json!({"runId": run_id, "state": "cancelled", "reason": reason}),
        )
        .await?;
    Ok(true)
}

/// Records `run_id` as cancelled for `reason` and returns its session from `from` to idle.
async fn finish_cancelled(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    from: SS,
    reason: &str,
) -> Result<(), StoreError> {
    engine
        .store
        .finish_run(run_id, "cancelled", Some(reason))
        .await?;
    engine
        .store
        .transition_session(&session.id, &[from], SS::Idle)
        .await?;
    Ok(())
}

/// What a run does at a step boundary.
pub enum Boundary {
    /// Take the next step.
    Go,
    /// Park: a pause was asked.
    Park,
}

/// At a step boundary: parks the run if a pause was asked, and takes in the redirects made
/// since the last boundary (as user turns, exactly once).
pub async fn at_boundary(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
) -> Result<Boundary, StoreError> {
    if engine.store.run_status(run_id).await? == Some(RunState::Pausing)
        && engine.store.park_run(run_id).await?
    {
        return Ok(Boundary::Park);
    }
    let taken = crate::store::patiently("the run's redirects", || {
        engine.store.consume_redirects(&session.id, run_id)
    })
    .await?;
    if !taken.is_empty() {
        engine
            .emit(
                &session.id,
                run_id,
                event::RUN_LIFECYCLE,
                json!({"runId": run_id, "state": "running", "reason": "redirected", "messages": taken.len()}),
            )
            .await?;
    }
    Ok(Boundary::Go)
}

/// Cancels, with a notice, every run paused or waiting on its plan for longer than its
/// policy's `runControl.pausedTimeout`. Returns how many.
pub async fn expire_paused(engine: &Engine) -> Result<usize, StoreError> {
    let now = crate::store::now_ms();
    let config = engine.config.borrow().clone();
    let mut n = 0;
    for (run_id, session_id, policy) in engine.store.paused_before(now).await? {
        let timeout = policy
            .as_deref()
            .and_then(|p| config.catalog.policy_named(p))
            .and_then(|p| p.object.spec.run_control.clone())
            .unwrap_or_default()
            .paused_timeout();
        let Some(run) = engine.store.run_record(&run_id).await? else {
            continue;
        };
        if run
            .paused_at
            .is_none_or(|at| now - at < timeout.as_millis() as i64)
        {
            continue;
        }
        let Some(session) = engine.store.session_by_id(&session_id).await? else {
            continue;
        };
        let message = format!(
            "the run waited paused or on its plan for longer than {} (the policy's runControl.pausedTimeout) and is cancelled",
            humantime(timeout)
        );
        if end_parked(engine, &session, &run_id, &message, true).await? {
            n += 1;
        }
    }
    Ok(n)
}

fn humantime(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(3600) && s >= 3600 {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) && s >= 60 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_table() {
        use Control::*;
        let ok = |state: &str, c: Control| {
            let state = RunState::parse(state).unwrap_or_else(|| panic!("no state {state}"));
            decide("r", state, c)
        };
        assert_eq!(ok("running", Pause), Ok(Effect::AskPause));
        assert_eq!(ok("pausing", Resume), Ok(Effect::WithdrawPause));
        assert_eq!(ok("paused", Resume), Ok(Effect::Unpark));
        for s in ["running", "pausing", "paused"] {
            assert_eq!(ok(s, Redirect), Ok(Effect::Queue), "{s}");
        }
        assert_eq!(ok("running", Cancel), Ok(Effect::CancelLive));
        let paused = ok("paused", Pause)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            paused.ends_with("resume, redirect or cancel it"),
            "{paused}"
        );
        assert_eq!(ok("pausing", Cancel), Ok(Effect::CancelLive));
        assert_eq!(ok("paused", Cancel), Ok(Effect::CancelParked));
        assert_eq!(ok("requires_action", Cancel), Ok(Effect::CancelWaiting));
        assert_eq!(ok("awaiting_plan", ApprovePlan), Ok(Effect::Approve));
        assert_eq!(ok("awaiting_plan", RejectPlan), Ok(Effect::Reject));
        assert_eq!(ok("awaiting_plan", Cancel), Ok(Effect::Reject));
        for c in [Pause, Resume, Redirect] {
            assert!(
                matches!(ok("awaiting_plan", c), Err(Refusal::State { .. })),
                "{c:?}"
            );
        }
        for s in ["running", "paused"] {
            assert!(
                matches!(ok(s, ApprovePlan), Err(Refusal::State { .. })),
                "{s}"
            );
        }
        for s in ["completed", "failed", "cancelled"] {
            for c in [Pause, Resume, Redirect, Cancel] {
                assert!(matches!(ok(s, c), Err(Refusal::Final { .. })), "{s} {c:?}");
            }
        }
        for (s, c) in [
            ("running", Resume),
            ("pausing", Pause),
            ("paused", Pause),
            ("cancelling", Pause),
            ("cancelling", Cancel),
            ("requires_action", Pause),
            ("requires_action", Redirect),
        ] {
            let e = ok(s, c).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(&format!("is {s}")), "{s} {c:?}: {e}");
            // And what it does take.
            assert!(
                e.contains("; ") && e.len() > e.find("; ").unwrap_or(0) + 4,
                "{e}"
            );
        }
    }

    #[test]
    fn timeouts_read_as_people_write_them() {
        assert_eq!(humantime(std::time::Duration::from_secs(1800)), "30m");
        assert_eq!(humantime(std::time::Duration::from_secs(7200)), "2h");
        assert_eq!(humantime(std::time::Duration::from_secs(5)), "5s");
    }
}
