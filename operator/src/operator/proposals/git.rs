//! The leader's part of a `delivery: git` proposal: once approved (and the approver's
//! `update` on the owning Application or Kustomization reviewed), the change is pushed and
//! its request opened ([`crate::proposals::git::deliver`]); then it is followed every
//! [`FOLLOW_EVERY`] until the GitOps tool has synced the merge and the target shows it
//! (`Succeeded`), the request is closed unmerged, changed after approval or its sync fails
//! (`Failed`), or the policy's `gitops.followTimeout` passes.
//!
//! One look at a time per proposal ([`Look`]); every write after the first is made over
//! the object as it was read, so a slow look never overwrites a newer phase.

use super::{ClusterProposals, Ending, ProposalHost, set_executing};
use crate::crd::conditions::reasons;
use crate::crd::{ActionProposal, GitChangeStatus, ProposalPhase};
use crate::proposals::executor::Action;
use crate::proposals::git::{self, Approval, Followed};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

/// How often a delivered change is looked at (the forge's API and the owner's status).
pub const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How long pushing and opening the request may take: with the retries of its status
/// write, within the execution grace (after which another leader calls it interrupted).
const DELIVERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(80);

/// When each delivered change was last looked at, and whether a look is running, by uid.
pub type Follows =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, bool)>>>;

/// A look at a delivered change, running: the next may begin once it is dropped.
pub struct Look {
    pub(super) follows: Follows,
    pub(super) uid: String,
}

impl Drop for Look {
    fn drop(&mut self) {
        let mut follows = self.follows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = follows.get_mut(&self.uid) {
            entry.1 = false;
        }
    }
}

/// A step of a delivered change: `status.git`, the `Executing` reason and the message.
#[derive(Clone, Copy)]
struct Step<'a> {
    git: &'a GitChangeStatus,
    reason: &'a str,
    message: &'a str,
    /// The first step (just delivered): written whatever the object's version (this
    /// process wrote `Executing` itself), and told to the session.
    first: bool,
}

impl ClusterProposals {
    /// Pushes the approved change and opens its request; the proposal stays `Executing`
    /// (`AwaitingMerge`) with `status.git`, or fails with the reason.
    pub(super) async fn deliver_git(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        action: &Action,
        by: &str,
    ) {
        let config = host.config();
        let outcome = async {
            let policy = super::policy_of(&config, record)
                .ok_or("the ChatPolicy that governed it no longer exists")?;
            let pinned = git::pinned(&action.params)?.ok_or("params.git is missing")?;
            let repository = crate::gitops::declared(&policy.gitops, &pinned.repository)
                .ok_or_else(|| {
                    format!(
                        "{} is no longer declared in the policy's spec.gitops.repositories",
                        pinned.repository
                    )
                })?;
            let session = &p.spec.session;
            let session = match &self.public_url {
                Some(base) => format!(
                    "{} ({}/#/chat/{})",
                    session.name,
                    base.trim_end_matches('/'),
                    session.id
                ),
                None => session.name.clone(),
            };
            let approval = Approval {
                proposal: &p.name_any(),
                namespace: &p.namespace().unwrap_or_default(),
                approver: by,
                summary: git::summary(action),
                rationale: &p.spec.rationale,
                session: &session,
            };
            let delivered = tokio::time::timeout(
                DELIVERY_TIMEOUT,
                git::deliver(&pinned, repository, &approval),
            )
            .await
            .map_err(|_| {
                format!(
                    "the Git change did not finish within {} s; check branch kortex/{} before proposing again",
                    DELIVERY_TIMEOUT.as_secs(),
                    p.name_any()
                )
            })?
            .map_err(|e| e.to_string())?;
            Ok::<_, String>((pinned, delivered))
        }
        .await;
        let (pinned, delivered) = match outcome {
            Ok(d) => d,
            Err(message) => {
                tracing::warn!(proposal = %p.name_any(), %message, "the Git change was not delivered");
                self.finish_retried(host, p, record, ProposalPhase::Failed, &message, None)
                    .await;
                return;
            }
        };
        let status = GitChangeStatus {
            repository: pinned.repository.clone(),
            branch: delivered.branch.clone(),
            commit: delivered.commit.clone(),
            request_url: delivered.request.as_ref().map(|r| r.1.clone()),
            request_number: delivered.request.as_ref().map(|r| r.0),
            request_state: if delivered.request.is_some() {
                "open".into()
            } else {
                "pushed".into()
            },
            merge_commit: None,
            synced_revision: None,
        };
        let message = match &delivered.request {
            Some((_, url)) => format!(
                "approved by {by}; opened {url} (branch {}); waiting for it to be merged",
                delivered.branch
            ),
            None => format!(
                "approved by {by}; pushed branch {} to {} (no forge); waiting for it to reach {}",
                delivered.branch, pinned.repository, pinned.base_branch
            ),
        };
        tracing::info!(proposal = %p.name_any(), branch = %delivered.branch, commit = %delivered.commit, "Git change delivered");
        let step = Step {
            git: &status,
            reason: reasons::AWAITING_MERGE,
            message: &message,
            first: true,
        };
        for attempt in 0..5u32 {
            if self.write_git(host, p, record, step).await {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1 << attempt)).await;
        }
        tracing::error!(proposal = %p.name_any(), branch = %delivered.branch, "the delivered Git change could not be recorded in the proposal's status");
    }

    /// Looks once at a delivered change (at most every [`FOLLOW_EVERY`] per proposal, one
    /// look at a time).
    pub(super) async fn follow_git(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        action: &Action,
    ) {
        let config = host.config();
        let Some(policy) = super::policy_of(&config, record) else {
            let message = "the ChatPolicy that governed it no longer exists: its Git change is no longer followed";
            let ending = Ending {
                phase: ProposalPhase::Failed,
                message,
                undo: None,
                unchanged: true,
            };
            self.end(host, p, record, ending).await;
            return;
        };
        let Some(status) = p.status.as_ref().and_then(|s| s.git.clone()) else {
            return;
        };
        let Ok(Some(pinned)) = git::pinned(&action.params) else {
            return;
        };
        let link = status
            .request_url
            .clone()
            .unwrap_or_else(|| format!("branch {}", status.branch));
        let (now, phase, message, undo) = match git::follow(
            &self.executor,
            action,
            policy,
            &pinned,
            &status,
        )
        .await
        {
            Ok(Followed::Waiting(now, reason, message)) => {
                let changed = Some(&now) != p.status.as_ref().and_then(|s| s.git.as_ref())
                    || p.status.as_ref().and_then(|s| s.message.as_deref())
                        != Some(message.as_str());
                if changed {
                    let step = Step {
                        git: &now,
                        reason,
                        message: &message,
                        first: false,
                    };
                    self.write_git(host, p, record, step).await;
                }
                return;
            }
            Ok(Followed::Succeeded(now, message)) => {
                let undo = undo_of(action, &pinned);
                (now, ProposalPhase::Succeeded, message, undo)
            }
            Ok(Followed::Failed(now, message)) => (now, ProposalPhase::Failed, message, None),
            // A forge or API server that does not answer now is asked again next time.
            Err(e) => {
                tracing::warn!(proposal = %p.name_any(), error = %e, "cannot follow the Git change now");
                return;
            }
        };
        // The end and `status.git` in one write, over the object as read (if it changed
        // meanwhile, the next look decides again).
        let message = format!("{message} ({link})");
        let mut p = p.clone();
        if let Some(s) = p.status.as_mut() {
            s.git = Some(now);
        }
        let ending = Ending {
            phase,
            message: &message,
            undo,
            unchanged: true,
        };
        self.end(host, &p, record, ending).await;
    }

    /// Writes `status.git` with the phase still `Executing` and the condition's reason;
    /// mirrors the message (and, on the first step, tells the session). A later step is
    /// written only over the object as read: another write since (a leader ending it)
    /// stands, and the next look starts from it.
    async fn write_git(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        step: Step<'_>,
    ) -> bool {
        let namespace = p.namespace().unwrap_or_default();
        let api: Api<ActionProposal> = Api::namespaced(self.client.clone(), &namespace);
        let mut status =
            serde_json::to_value(p.status.clone().unwrap_or_default()).unwrap_or_default();
        status["phase"] = json!(ProposalPhase::Executing.as_str());
        status["message"] = json!(step.message);
        status["git"] = json!(step.git);
        let since = status["conditions"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == crate::proposals::EXECUTING_CONDITION)
            })
            .filter(|c| {
                c["reason"] == reasons::AWAITING_MERGE || c["reason"] == reasons::AWAITING_SYNC
            })
            .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned));
        set_executing(
            &mut status,
            json!({"status": "True", "reason": step.reason, "message": crate::operator::event_note(step.message)}),
        );
        // The follow-up's clock runs from delivery, whatever the reason says since.
        if let Some(since) = since
            && let Some(c) = status["conditions"].as_array_mut().and_then(|c| {
                c.iter_mut()
                    .find(|c| c["type"] == crate::proposals::EXECUTING_CONDITION)
            })
        {
            c["lastTransitionTime"] = json!(since);
        }
        let version = p
            .metadata
            .resource_version
            .as_deref()
            .filter(|_| !step.first);
        match self
            .write_status(&api, &p.name_any(), version, &status)
            .await
        {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 409 && !step.first => return true,
            Err(e) => {
                tracing::warn!(proposal = %p.name_any(), error = %e, "cannot write the Git change's status; will retry");
                return false;
            }
        }
        if step.first || p.status.as_ref().and_then(|s| s.message.as_deref()) != Some(step.message)
        {
            let mut p = p.clone();
            let s = p.status.get_or_insert_with(Default::default);
            s.git = Some(step.git.clone());
            self.mirror(
                host,
                &p,
                record,
                ProposalPhase::Executing,
                step.message,
                None,
            )
            .await;
        }
        true
    }

    /// [`ClusterProposals::finish`], tried again a few times (the outcome of an execution
    /// is known: it must be written, never redone).
    pub(super) async fn finish_retried(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        phase: ProposalPhase,
        message: &str,
        undo: Option<Value>,
    ) {
        for attempt in 0..5u32 {
            if self
                .finish(host, p, record, phase, message, undo.clone())
                .await
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1 << attempt)).await;
        }
        tracing::error!(proposal = %p.name_any(), phase = phase.as_str(), %message, "the result of an executed proposal could not be recorded in its status");
    }
}

/// The inverse of a Git scale: a proposal back to the replicas Git had (itself delivered
/// through Git when proposed). A rollback's inverse is reverting the merged commit, which
/// the person does in the forge.
fn undo_of(action: &Action, pinned: &git::Pinned) -> Option<Value> {
    let before: i64 = pinned.old.trim_matches(['"', '\'']).parse().ok()?;
    (action.verb == "scale").then(
        || json!({"action": "scale", "target": action.target, "params": {"replicas": before}}),
    )
}
