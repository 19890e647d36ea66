//! The phase rules of a proposal, pure: what its state, the governing policy as it is now
//! and the time call for (wait, end in a phase, or execute). The cluster's leader applies
//! them to `ActionProposal` objects, and `kortex serve` to its stored proposals.

use super::executor::{self, Action};
use crate::crd::{ActionProposal, ChatPolicySpec, ProposalPhase, Verdict};
use serde_json::json;

/// What the leader does with a proposal now.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// Nothing (waiting, or final).
    Wait,
    /// To a final phase without executing anything.
    Final(ProposalPhase, String),
    /// Execute it (after the SubjectAccessReview).
    Execute(Action),
    /// Look again at a Git change that is delivered and not yet running in the cluster
    /// (`Executing`, reason `AwaitingMerge` or `AwaitingSync`).
    Follow(Action),
}

/// How long a Git change is followed when the policy does not say (`gitops.followTimeout`).
pub const FOLLOW_TIMEOUT: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

/// Condition type marking when execution started.
pub const EXECUTING_CONDITION: &str = "Executing";
/// How long an execution may take before another leader calls it interrupted: longer than
/// any restart, scale or rollback call and than a lease hand-over.
pub const EXECUTION_GRACE: jiff::SignedDuration = jiff::SignedDuration::from_secs(120);

/// The pure phase rules: what the proposal's state, the governing policy (as it is now;
/// `None` when it is gone) and the time call for.
// Long because it is the whole phase table in one match, so every transition can be read
// (and tested, `the_phase_rules`) in one place.
pub fn next(
    p: &ActionProposal,
    policy: Option<&ChatPolicySpec>,
    now: jiff::Timestamp,
) -> Transition {
    let status = p.status.clone().unwrap_or_default();
    match status.phase {
        ProposalPhase::Pending => {}
        ProposalPhase::Executing => {
            let executing = status
                .conditions
                .iter()
                .find(|c| c.type_ == EXECUTING_CONDITION);
            if let Some(c) = executing.filter(|c| {
                c.reason == crate::crd::conditions::reasons::AWAITING_MERGE
                    || c.reason == crate::crd::conditions::reasons::AWAITING_SYNC
            }) {
                return following(p, policy, c.last_transition_time.0, now);
            }
            // The leader that started it may still be finishing (a lease hand-over takes
            // seconds): only an execution older than the grace period was interrupted.
            let since = executing.map(|c| c.last_transition_time.0);
            if since.is_some_and(|t| now < t + EXECUTION_GRACE) {
                return Transition::Wait;
            }
            return Transition::Final(
                ProposalPhase::Failed,
                "interrupted: the replica executing it stopped; check the target before proposing again".into(),
            );
        }
        _ => return Transition::Wait,
    }
    let expired = status.expires_at.as_ref().is_some_and(|t| now >= t.0);
    let Some(decision) = &p.spec.decision else {
        return if expired {
            Transition::Final(
                ProposalPhase::Expired,
                "not decided before it expired".into(),
            )
        } else {
            Transition::Wait
        };
    };
    if expired {
        return Transition::Final(
            ProposalPhase::Expired,
            format!(
                "decided by {} after it expired; the decision is void",
                decision.by
            ),
        );
    }
    let reason = decision
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    if decision.verdict == Verdict::Reject {
        return Transition::Final(
            ProposalPhase::Rejected,
            format!("rejected by {}{reason}", decision.by),
        );
    }
    let approved = format!("approved by {}{reason}", decision.by);
    let Some(policy) = policy else {
        return Transition::Final(
            ProposalPhase::Approved,
            format!("{approved}; not executed: the ChatPolicy that governed it no longer exists"),
        );
    };
    let rules = &policy.proposals;
    let refused = |why: String| {
        Transition::Final(
            ProposalPhase::Failed,
            format!("{approved}; not executed: {why}"),
        )
    };
    if rules.require_distinct_approver && decision.by == p.spec.session.user {
        return refused(format!(
            "{} proposed it in their own session and the policy requires someone else to approve",
            decision.by
        ));
    }
    // Groups are what the decider declared (the admission policy lets them name only their
    // own); a decision written without them (plain `kubectl patch`) was checked against
    // approverGroups at admission, with the API server's own view of the writer's groups.
    if !rules.approver_groups.is_empty()
        && !decision.groups.is_empty()
        && !decision
            .groups
            .iter()
            .any(|g| rules.approver_groups.contains(g))
    {
        return refused(format!(
            "{} is not in the policy's approverGroups ({})",
            decision.by,
            rules.approver_groups.join(", ")
        ));
    }
    if !rules.execute {
        return Transition::Final(
            ProposalPhase::Approved,
            format!("{approved}; the policy leaves execution to other automation (execute: false)"),
        );
    }
    if !executor::EXECUTABLE.contains(&p.spec.action.as_str()) {
        return Transition::Final(
            ProposalPhase::Approved,
            format!(
                "{approved}; Kortex does not carry out {} (left for other automation)",
                p.spec.action
            ),
        );
    }
    if !rules.allowed_actions.contains(&p.spec.action) {
        return refused(format!("the policy no longer allows {}", p.spec.action));
    }
    let Some(target) = p.spec.target.clone() else {
        return refused("the proposal has no target".into());
    };
    let namespace = target.namespace.clone().unwrap_or_default();
    if !crate::glob::any_matches(&rules.allowed_namespaces, &namespace) {
        return refused(format!(
            "the policy no longer allows actions in namespace {namespace}"
        ));
    }
    let action = Action {
        verb: p.spec.action.clone(),
        target,
        params: p.spec.params.clone().unwrap_or(json!({})),
    };
    if let Err(e) = executor::validate(&action) {
        return refused(e.to_string());
    }
    if p.spec.delivery == Some(crate::crd::Delivery::Git)
        && let Err(why) = super::git::pinned(&action.params)
    {
        return Transition::Final(
            ProposalPhase::Approved,
            format!(
                "{approved}; Kortex made no Git change: {why} (the evidence is in status.preview)"
            ),
        );
    }
    Transition::Execute(action)
}

/// A delivered Git change: followed until the policy's `followTimeout` since it was
/// approved, then failed.
fn following(
    p: &ActionProposal,
    policy: Option<&ChatPolicySpec>,
    since: jiff::Timestamp,
    now: jiff::Timestamp,
) -> Transition {
    let Some(target) = p.spec.target.clone() else {
        return Transition::Final(ProposalPhase::Failed, "the proposal has no target".into());
    };
    let timeout = policy
        .and_then(|s| s.gitops.as_ref())
        .and_then(|g| g.follow_timeout)
        .and_then(|d| jiff::SignedDuration::try_from(std::time::Duration::from(d)).ok())
        .unwrap_or(FOLLOW_TIMEOUT);
    if now >= since + timeout {
        let request = p
            .status
            .as_ref()
            .and_then(|s| s.git.as_ref())
            .and_then(|g| g.request_url.clone().or_else(|| Some(g.branch.clone())))
            .unwrap_or_default();
        return Transition::Final(
            ProposalPhase::Failed,
            format!(
                "not running in the cluster {} after approval (the policy's gitops.followTimeout): {request} is no longer followed; check it and the GitOps tool by hand",
                kube::core::Duration::from(timeout.unsigned_abs())
            ),
        );
    }
    Transition::Follow(Action {
        verb: p.spec.action.clone(),
        target,
        params: p.spec.params.clone().unwrap_or(json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn proposal(decision: Option<Value>, phase: &str, expires_in: i64) -> ActionProposal {
        let now = jiff::Timestamp::now();
        serde_json::from_value(json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal",
            "metadata": {"name": "restart-api-x", "namespace": "shop"},
            "spec": {"action": "restart", "rationale": "OOM",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                "session": {"id": "s1", "name": "incident-1", "user": "alice"},
                "decision": decision},
            "status": {"phase": phase, "expiresAt": (now + jiff::SignedDuration::from_secs(expires_in)).to_string()}
        }))
        .unwrap()
    }

    fn policy(extra: Value) -> ChatPolicySpec {
        let mut spec = json!({"sessions": ["*"], "provider": "p",
            "proposals": {"allowedActions": ["restart", "scale", "annotate"], "allowedNamespaces": ["shop"]}});
        if let (Some(p), Some(e)) = (spec["proposals"].as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        serde_json::from_value(spec).unwrap()
    }

    fn final_phase(t: &Transition) -> Option<(ProposalPhase, String)> {
        match t {
            Transition::Final(p, m) => Some((*p, m.clone())),
            _ => None,
        }
    }

    #[test]
    // Long because it walks the phase table row by row.
    fn the_phase_rules() {
        let now = jiff::Timestamp::now();
        let bob = json!({"verdict": "Approve", "by": "bob", "groups": ["sre"]});
        let p = policy(json!({}));
        // Undecided: waits, then expires.
        assert_eq!(
            next(&proposal(None, "Pending", 60), Some(&p), now),
            Transition::Wait
        );
        assert_eq!(
            final_phase(&next(&proposal(None, "Pending", -1), Some(&p), now)).map(|f| f.0),
            Some(ProposalPhase::Expired)
        );
        // A decision seen after expiry is void.
        let late = final_phase(&next(
            &proposal(Some(bob.clone()), "Pending", -1),
            Some(&p),
            now,
        ))
        .unwrap_or_default();
        assert_eq!(late.0, ProposalPhase::Expired);
        assert!(late.1.contains("void"), "{}", late.1);
        // Rejected, with the reason.
        let no = json!({"verdict": "Reject", "by": "bob", "reason": "not now"});
        assert_eq!(
            final_phase(&next(&proposal(Some(no), "Pending", 60), Some(&p), now)),
            Some((ProposalPhase::Rejected, "rejected by bob: not now".into()))
        );
        // Approved by someone else: executed.
        assert!(
            matches!(next(&proposal(Some(bob.clone()), "Pending", 60), Some(&p), now), Transition::Execute(a) if a.verb == "restart")
        );
        // The proposer may not approve their own.
        let own = json!({"verdict": "Approve", "by": "alice"});
        let f = final_phase(&next(
            &proposal(Some(own.clone()), "Pending", 60),
            Some(&p),
            now,
        ))
        .unwrap_or_default();
        assert_eq!(f.0, ProposalPhase::Failed);
        assert!(matches!(
            next(
                &proposal(Some(own), "Pending", 60),
                Some(&policy(json!({"requireDistinctApprover": false}))),
                now
            ),
            Transition::Execute(_)
        ));
        // approverGroups.
        let p_groups = policy(json!({"approverGroups": ["oncall"]}));
        assert_eq!(
            final_phase(&next(
                &proposal(Some(bob.clone()), "Pending", 60),
                Some(&p_groups),
                now
            ))
            .map(|f| f.0),
            Some(ProposalPhase::Failed)
        );
        // execute: false stops at Approved; so does a verb Kortex does not carry out.
        assert_eq!(
            final_phase(&next(
                &proposal(Some(bob.clone()), "Pending", 60),
                Some(&policy(json!({"execute": false}))),
                now
            ))
            .map(|f| f.0),
            Some(ProposalPhase::Approved)
        );
        let mut annotate = proposal(Some(bob.clone()), "Pending", 60);
        annotate.spec.action = "annotate".into();
        assert_eq!(
            final_phase(&next(&annotate, Some(&p), now)).map(|f| f.0),
            Some(ProposalPhase::Approved)
        );
        // The policy changed since: re-checked now.
        let narrowed = policy(json!({"allowedNamespaces": ["other"]}));
        let f = final_phase(&next(
            &proposal(Some(bob.clone()), "Pending", 60),
            Some(&narrowed),
            now,
        ))
        .unwrap_or_default();
        assert!(
            f.0 == ProposalPhase::Failed && f.1.contains("namespace shop"),
            "{f:?}"
        );
        // The policy is gone: approved, never executed.
        assert_eq!(
            final_phase(&next(
                &proposal(Some(bob.clone()), "Pending", 60),
                None,
                now
            ))
            .map(|f| f.0),
            Some(ProposalPhase::Approved)
        );
        // Final phases stay; an Executing one found by a new leader is never run again.
        assert_eq!(
            next(&proposal(Some(bob.clone()), "Succeeded", 60), Some(&p), now),
            Transition::Wait
        );
        assert_eq!(
            final_phase(&next(
                &proposal(Some(bob.clone()), "Executing", 60),
                Some(&p),
                now
            ))
            .map(|f| f.0),
            Some(ProposalPhase::Failed)
        );
        // ... unless it started moments ago: its leader may still be finishing it.
        let mut fresh = proposal(Some(bob), "Executing", 60);
        if let Some(status) = fresh.status.as_mut() {
            status
                .conditions
                .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: EXECUTING_CONDITION.into(),
                    status: "True".into(),
                    reason: "Approved".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
                });
        }
        assert_eq!(next(&fresh, Some(&p), now), Transition::Wait);
    }
}
