//! What a proposal is and how it is carried out, in both modes: the phase rules
//! ([`next`]: from a decision and the policy as it is now to `Executing` or a final phase),
//! the pins that make what is approved what the preview showed ([`pin`], [`unpinned`]),
//! the dry-run [`preview`], carrying an approved action out within its time limit
//! ([`carry_out`], with the [`executor`] that writes restart, scale and rollback), and the
//! standalone decision path ([`approval`]). The cluster's `ActionProposal` objects are
//! `operator::proposals`; the `propose_action` tool and the sessions it tells are `chat`.
//!
//! Imports `tools`, `llm` and below; never `operator`, `chat` or anything above
//! (docs/architecture.md).

pub mod executor;
pub mod git;
mod rules;

pub use rules::{EXECUTING_CONDITION, EXECUTION_GRACE, FOLLOW_TIMEOUT, Transition, next};

use crate::catalog::PolicyEntry;
use crate::crd::{ActionProposalSpec, ProposalPhase};
use crate::store::ProposalRecord;
use executor::{Action, Executor};
use serde_json::{Value, json};

/// A proposal as the API shows it (`GET /chat/v1/proposals/{id}`), and as Slack cards are
/// built from.
pub fn view(p: &ProposalRecord) -> Value {
    let time = |ms: i64| {
        jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    json!({
        "id": p.id, "name": p.name, "namespace": p.namespace,
        "spec": {
            "action": p.action, "target": p.target, "params": p.params, "rationale": p.rationale,
            "blastRadius": p.blast_radius, "reversible": p.reversible,
            "session": {"id": p.session_id, "name": p.session_name, "user": p.user},
            "model": {"provider": p.provider, "model": p.model},
            "decision": p.decision,
            "delivery": if p.params.as_ref().is_some_and(|v| v.get("git").is_some()) { "git" } else { "live" },
        },
        "status": {"phase": p.phase, "expiresAt": time(p.expires_at), "message": p.message, "preview": p.preview, "undo": p.undo, "git": p.git},
        "policy": p.policy, "createdAt": time(p.created_at), "updatedAt": time(p.updated_at),
    })
}

/// How long the action itself (its dry run and write) may take; the checks before it and
/// the status writes after it have their own per-call deadlines.
pub const EXECUTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Pins the target's state in the (immutable) params of a proposal Kortex can carry out:
/// what is approved is what the preview showed, or nothing ([`executor::moved`]). A
/// proposal whose target cannot be read now could never be executed: it is not made, and
/// the model is told why.
///
/// Under `policy`, a scale or rollback of a target Argo CD or Flux applies from Git
/// becomes a Git change ([`git::plan`]): `spec.delivery: git`, the change pinned in
/// `params.git`, and its preview (the diff) returned — or, when no single change can be
/// made, `params.git.error` and a preview with the evidence.
pub async fn pin(
    executor: &Executor,
    policy: Option<&PolicyEntry>,
    spec: &mut ActionProposalSpec,
) -> Result<Option<Value>, String> {
    if !executor::EXECUTABLE.contains(&spec.action.as_str()) {
        return Ok(None);
    }
    let Some(target) = spec.target.clone() else {
        return Ok(None);
    };
    let mut action = Action {
        verb: spec.action.clone(),
        target,
        params: spec.params.clone().unwrap_or(json!({})),
    };
    let params = executor
        .pin(&action)
        .await
        .map_err(|e| format!("cannot propose to {} {}: {e}", action.verb, action.target))?;
    action.params = params.clone();
    spec.params = Some(params);
    let Some(policy) = policy else {
        return Ok(None);
    };
    let (pinned, preview) = match git::plan(executor, &action, policy).await {
        git::Plan::Live => return Ok(None),
        git::Plan::Git(pinned, preview) => {
            (serde_json::to_value(*pinned).unwrap_or_default(), preview)
        }
        git::Plan::Evidence(preview) => (json!({"error": preview["error"]}), preview),
    };
    if let Some(Value::Object(map)) = spec.params.as_mut() {
        map.insert(git::PARAM.into(), pinned);
    }
    spec.delivery = Some(crate::crd::Delivery::Git);
    Ok(Some(preview))
}

/// Carries out an approved action within [`EXECUTION_TIMEOUT`]: the phase it ends in
/// (`Succeeded` or `Failed`), the message for its status and what undoes it.
pub async fn carry_out(
    executor: &Executor,
    action: &Action,
) -> (ProposalPhase, String, Option<Value>) {
    match tokio::time::timeout(EXECUTION_TIMEOUT, executor.execute(action)).await {
        Ok(Ok(done)) => (ProposalPhase::Succeeded, done.message, done.undo),
        Ok(Err(e)) => {
            tracing::warn!(target = %action.target, verb = %action.verb, category = e.metric_label(), error = %e, "the action failed");
            (ProposalPhase::Failed, e.to_string(), None)
        }
        Err(_) => (
            ProposalPhase::Failed,
            format!(
                "the action did not finish within {} s, so whether it took effect is unknown: check {} before proposing it again",
                EXECUTION_TIMEOUT.as_secs(),
                action.target
            ),
            None,
        ),
    }
}

/// The dry-run preview of a proposal (or why there is none).
pub async fn preview(executor: &Executor, spec: &ActionProposalSpec) -> Value {
    if !executor::EXECUTABLE.contains(&spec.action.as_str()) {
        return json!({"note": format!("Kortex does not carry out {}; approving it records the decision for other automation", spec.action)});
    }
    let Some(target) = spec.target.clone() else {
        return json!({"error": "no target"});
    };
    let action = Action {
        verb: spec.action.clone(),
        target,
        params: spec.params.clone().unwrap_or(json!({})),
    };
    match executor.preview(&action).await {
        Ok(p) => p,
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The model's params without the pins only Kortex may set (`expectGeneration`,
/// `expectReplicas`, `git`): a pin is read from the target when the proposal is made, never
/// taken from the model.
pub fn unpinned(mut params: Value) -> Value {
    if let Some(map) = params.as_object_mut() {
        map.remove(executor::EXPECT_GENERATION);
        map.remove(executor::EXPECT_REPLICAS);
        map.remove(git::PARAM);
    }
    params
}

/// What approving a stored proposal (standalone mode) leads to.
#[derive(Clone, Debug, PartialEq)]
pub struct Approval {
    /// The phase recorded with the decision: `Executing` when Kortex carries it out here,
    /// else final (`Approved`, or `Failed` when a guard refuses it).
    pub phase: crate::crd::ProposalPhase,
    /// Its `message`.
    pub message: String,
    /// What to carry out (with `Executing`).
    pub action: Option<executor::Action>,
}

/// The rules of cluster mode ([`next`]) applied to a stored
/// proposal that `by` (in `groups`) approves under `policy` as it is now: the policy must
/// still allow the action and namespace and have `execute: true`, and Kortex must have a
/// cluster (a kubeconfig) to carry it out in (`can_execute`).
pub fn approval(
    can_execute: bool,
    p: &ProposalRecord,
    policy: &PolicyEntry,
    by: &str,
    groups: &[String],
    reason: Option<&str>,
) -> Approval {
    use crate::crd::{ActionProposal, ActionProposalSpec, ActionProposalStatus};
    let spec = ActionProposalSpec {
        action: p.action.clone(),
        target: p
            .target
            .clone()
            .and_then(|t| serde_json::from_value(t).ok()),
        params: p.params.clone(),
        rationale: p.rationale.clone(),
        blast_radius: None,
        reversible: None,
        session: crate::crd::ProposalSession {
            id: p.session_id.clone().unwrap_or_default(),
            name: p.session_name.clone(),
            user: p.user.clone(),
        },
        model: None,
        delivery: None,
        decision: Some(crate::crd::Decision {
            verdict: crate::crd::Verdict::Approve,
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
            groups: groups.to_vec(),
        }),
    };
    let mut object = ActionProposal::new(&p.name, spec);
    // Expiry was checked when the decision was taken (and is again when it is written).
    object.status = Some(ActionProposalStatus {
        phase: ProposalPhase::Pending,
        ..Default::default()
    });
    let approved = format!(
        "approved by {by}{}",
        reason.map(|r| format!(": {r}")).unwrap_or_default()
    );
    match next(&object, Some(&policy.object.spec), jiff::Timestamp::now()) {
        Transition::Execute(action) if action.params.get(git::PARAM).is_some() => Approval {
            phase: ProposalPhase::Approved,
            message: match git::pinned(&action.params) {
                Err(why) => format!(
                    "{approved}; Kortex made no Git change: {why} (the evidence is in the preview)"
                ),
                Ok(_) => format!(
                    "{approved}; not executed here: a Git change is pushed and followed by the cluster operator (kortex run); under kortex serve the approved diff is in the proposal's preview, to apply by hand"
                ),
            },
            action: None,
        },
        Transition::Execute(action) if can_execute => Approval {
            phase: ProposalPhase::Executing,
            message: format!("{approved}; executing"),
            action: Some(action),
        },
        Transition::Execute(_) => Approval {
            phase: ProposalPhase::Approved,
            message: format!(
                "{approved}; not executed: Kortex runs without a cluster here (kortex serve executes approved proposals in the cluster of --kubeconfig or KUBECONFIG)"
            ),
            action: None,
        },
        Transition::Final(phase, message) => Approval {
            phase,
            message,
            action: None,
        },
        Transition::Wait | Transition::Follow(_) => Approval {
            phase: ProposalPhase::Approved,
            message: approved,
            action: None,
        },
    }
}
