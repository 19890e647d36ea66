//! Condition helpers shared by every kind: condition types and reasons as constants, and
//! `set` that keeps `lastTransitionTime` unless the status changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
pub mod types {
    /// The object can be used.
    pub const READY: &str = "Ready";
    /// A ChatPolicy's notification targets can send.
    pub const NOTIFY: &str = "Notify";
    /// A ChatPolicy's triggers are valid (`docs/triggers.md`).
    pub const TRIGGERS: &str = "Triggers";
    /// A ChatPolicy's GitOps repositories have what Kortex needs to write to them.
    pub const GIT_OPS: &str = "GitOps";
    /// ChatPolicy: its Slack app's Secrets resolved (requests can be verified).
    pub const SLACK: &str = "Slack";
    /// Every referenced Secret key was found.
    pub const SECRET_RESOLVED: &str = "SecretResolved";
    /// The object was accepted (e.g. its tool name is free).
    pub const ACCEPTED: &str = "Accepted";
    /// The endpoint answered the last probe.
    pub const REACHABLE: &str = "Reachable";
    /// Every model the provider serves has a price (a warning when False: usage and
    /// budgets count unpriced models at $0).
    pub const PRICED: &str = "Priced";
}

/// Condition reasons (CamelCase, stable: scripts match on them).
pub mod reasons {
    /// `Executing=False` on an ActionProposal: approved, but not executed because the
    /// admission policy that authenticates decisions is not enforced.
    pub const ADMISSION_POLICY_NOT_ENFORCED: &str = "AdmissionPolicyNotEnforced";
    /// Everything needed is in place.
    pub const AVAILABLE: &str = "Available";
    /// `Triggers=True`: every trigger of the ChatPolicy is valid.
    pub const TRIGGERS_READY: &str = "TriggersReady";
    /// `Triggers=False`: a trigger is invalid (the message names it and the field); the
    /// others still fire.
    pub const INVALID_TRIGGER: &str = "InvalidTrigger";
    /// All referenced Secrets resolved.
    pub const RESOLVED: &str = "Resolved";
    /// Nothing to resolve.
    pub const NO_SECRETS: &str = "NoSecretsReferenced";
    /// A referenced Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The Secret exists but lacks the key.
    pub const SECRET_KEY_NOT_FOUND: &str = "SecretKeyNotFound";
    /// A Secret value is not valid UTF-8 or is empty.
    pub const SECRET_INVALID: &str = "SecretInvalid";
    /// A Secret could not be resolved, so the object is unavailable.
    pub const SECRET_NOT_RESOLVED: &str = "SecretNotResolved";
    /// Every notification target of a ChatPolicy has its URL and Secrets.
    pub const READY_TO_SEND: &str = "ReadyToSend";
    /// `Slack=True`: requests from the workspace are verified and taken.
    pub const LISTENING: &str = "Listening";
    /// `GitOps=True`: every declared repository can be written to (its Secret resolved).
    pub const REPOSITORIES_READY: &str = "RepositoriesReady";
    /// `Executing=True` on an ActionProposal delivered through Git: the change request is
    /// open; the proposal waits for its merge and the GitOps tool's sync.
    pub const AWAITING_MERGE: &str = "AwaitingMerge";
    /// `Executing=True`: merged; waiting for the GitOps tool to apply it.
    pub const AWAITING_SYNC: &str = "AwaitingSync";
    /// A notification target keeps failing (its receiver refuses or cannot be reached).
    pub const DELIVERY_FAILING: &str = "DeliveryFailing";
    /// The name is already taken.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// A header names an identity (an authenticating proxy's, impersonation) or Kortex's
    /// own marker: Kortex will not send it for a resource.
    pub const RESERVED_HEADER: &str = "ReservedHeader";
    /// A referenced Secret is not labelled `kortex.dev/use: "true"`.
    pub const SECRET_NOT_OPTED_IN: &str = "SecretNotOptedIn";
    /// The spec is invalid in a way the schema cannot express.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The object was accepted.
    pub const ACCEPTED: &str = "Accepted";
    /// A named provider does not exist.
    pub const PROVIDER_NOT_FOUND: &str = "ProviderNotFound";
    /// A named provider exists but cannot be used.
    pub const PROVIDER_UNAVAILABLE: &str = "ProviderUnavailable";
    /// `local-only` names a cloud provider.
    pub const PROVIDER_NOT_LOCAL: &str = "ProviderNotLocal";
    /// No model could be determined.
    pub const NO_MODEL: &str = "NoModel";
    /// `claude-code`: the CLI named by `spec.command` is not on `PATH`.
    pub const CLAUDE_CODE_NOT_INSTALLED: &str = "ClaudeCodeNotInstalled";
    /// The endpoint is an address (or a name) Kortex's egress guard refuses every request
    /// to, e.g. loopback in cluster mode without `allowPrivateTargets`: nothing is contacted.
    pub const EGRESS_REFUSED: &str = "EgressRefused";
    /// The manifest could not be loaded.
    pub const INVALID_MANIFEST: &str = "InvalidManifest";
    /// Every model has `cost` in `spec.models`.
    pub const PRICED: &str = "Priced";
    /// A model in use has no price: counted at $0.
    pub const MODEL_WITHOUT_PRICE: &str = "ModelWithoutPrice";
    /// A local provider: its calls are counted at $0 unless priced.
    pub const LOCAL_PROVIDER: &str = "LocalProvider";
}

/// A condition as the catalog computes it, before a transition time is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Condition type.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl Desired {
    /// A `True` condition.
    pub fn ok(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A `False` condition.
    pub fn fail(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Sets `desired` in `conditions`, replacing any condition of the same type. The previous
/// `lastTransitionTime` is kept unless the status changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: &Desired,
    generation: Option<i64>,
    now: jiff::Timestamp,
) {
    let status = status_str(desired.status);
    let existing = conditions.iter().position(|c| c.type_ == desired.type_);
    let last_transition_time = match existing.map(|i| &conditions[i]) {
        Some(old) if old.status == status => old.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: desired.type_.to_owned(),
        status: status.to_owned(),
        reason: desired.reason.to_owned(),
        message: desired.message.clone(),
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// Builds a condition list from `desired`, carrying transition times over from `previous`.
/// Conditions not in `desired` are dropped; the order is that of `desired`.
pub fn merge(
    previous: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = Vec::with_capacity(desired.len());
    for d in desired {
        let mut one: Vec<Condition> = previous
            .iter()
            .filter(|c| c.type_ == d.type_)
            .cloned()
            .collect();
        set(&mut one, d, generation, now);
        out.extend(one);
    }
    out
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the `Ready` condition is `True`.
pub fn is_ready(conditions: &[Condition]) -> bool {
    find(conditions, types::READY).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).unwrap_or_default()
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let mut conds = Vec::new();
        set(
            &mut conds,
            &Desired::fail(types::READY, reasons::SECRET_NOT_RESOLVED, "a"),
            Some(1),
            ts(100),
        );
        set(
            &mut conds,
            &Desired::fail(types::READY, reasons::PROVIDER_NOT_FOUND, "b"),
            Some(2),
            ts(200),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, Time(ts(100)));
        assert_eq!(conds[0].reason, reasons::PROVIDER_NOT_FOUND);
        assert_eq!(conds[0].message, "b");
        assert_eq!(conds[0].observed_generation, Some(2));

        set(
            &mut conds,
            &Desired::ok(types::READY, reasons::AVAILABLE, ""),
            Some(2),
            ts(300),
        );
        assert_eq!(conds[0].last_transition_time, Time(ts(300)));
        assert_eq!(conds[0].status, "True");
        assert!(is_ready(&conds));
    }

    #[test]
    fn merge_drops_stale_types_and_keeps_times() {
        let mut prev = Vec::new();
        set(
            &mut prev,
            &Desired::ok(types::ACCEPTED, reasons::ACCEPTED, ""),
            None,
            ts(1),
        );
        set(
            &mut prev,
            &Desired::ok(types::REACHABLE, reasons::AVAILABLE, ""),
            None,
            ts(1),
        );
        let merged = merge(
            &prev,
            &[
                Desired::ok(types::ACCEPTED, reasons::ACCEPTED, ""),
                Desired::fail(types::READY, reasons::NO_MODEL, "x"),
            ],
            Some(3),
            ts(50),
        );
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].last_transition_time, Time(ts(1)));
        assert_eq!(merged[1].last_transition_time, Time(ts(50)));
        assert!(find(&merged, types::REACHABLE).is_none());
    }
}
