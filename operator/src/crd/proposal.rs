//! `ActionProposal`: an action a model proposed, waiting for a human decision.
//!
//! The API server enforces the trust rules encoded here: `spec` is immutable except
//! `decision`, and `decision` can be set once (CEL transition rules).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An action proposed by a model; executed only after a human approved it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kortex.dev",
    version = "v1alpha1",
    kind = "ActionProposal",
    plural = "actionproposals",
    singular = "actionproposal",
    namespaced,
    doc = "An action a model proposed; Kortex executes it only after a human approved it.",
    status = "ActionProposalStatus",
    shortname = "aprop",
    category = "kortex",
    printcolumn = r#"{"name":"Action","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.target.kind"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.target.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Decided By","type":"string","jsonPath":".spec.decision.by"}"#,
    printcolumn = r#"{"name":"Delivery","type":"string","priority":1,"jsonPath":".spec.delivery"}"#,
    printcolumn = r#"{"name":"Request","type":"string","priority":1,"jsonPath":".status.git.requestUrl"}"#,
    printcolumn = r#"{"name":"Session","type":"string","priority":1,"jsonPath":".spec.session.name"}"#,
    printcolumn = r#"{"name":"Expires","type":"date","priority":1,"jsonPath":".status.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.action == oldSelf.action && self.rationale == oldSelf.rationale && self.session == oldSelf.session && has(self.target) == has(oldSelf.target) && (!has(self.target) || self.target == oldSelf.target) && has(self.params) == has(oldSelf.params) && (!has(self.params) || self.params == oldSelf.params) && has(self.model) == has(oldSelf.model) && (!has(self.model) || self.model == oldSelf.model) && has(self.blastRadius) == has(oldSelf.blastRadius) && (!has(self.blastRadius) || self.blastRadius == oldSelf.blastRadius) && has(self.reversible) == has(oldSelf.reversible) && (!has(self.reversible) || self.reversible == oldSelf.reversible) && has(self.delivery) == has(oldSelf.delivery) && (!has(self.delivery) || self.delivery == oldSelf.delivery)",
        "message": "spec is immutable except spec.decision",
        "reason": "FieldValueForbidden"
    },
    {
        "rule": "!has(oldSelf.decision) || (has(self.decision) && self.decision == oldSelf.decision)",
        "message": "spec.decision is final once set",
        "reason": "FieldValueForbidden"
    }
]))]
pub struct ActionProposalSpec {
    /// `restart`, `scale`, `rollback`, or any other verb (recorded, never executed by Kortex).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z][a-z0-9-]*$"))]
    pub action: String,
    /// The object acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ProposalTarget>,
    /// Action parameters, e.g. `{replicas: 3}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::free_form_object")]
    pub params: Option<serde_json::Value>,
    /// Why the model proposes it.
    #[schemars(length(max = 8192))]
    pub rationale: String,
    /// What could be affected, in the model's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub blast_radius: Option<String>,
    /// Whether the action can be undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reversible: Option<bool>,
    /// The chat session that proposed it.
    pub session: ProposalSession,
    /// The model that proposed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ProposalModel>,
    /// How an approved action is carried out: `live` (Kortex changes the object; the
    /// default) or `git` (the target is applied from Git by Argo CD or Flux: Kortex opens a
    /// reviewed change in the declared repository, the one in `params.git`, and follows it
    /// until the cluster runs it; `docs/gitops.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// The human decision, written once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// How an approved proposal is carried out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// A change to the live object.
    #[default]
    Live,
    /// A reviewed change in the Git repository the GitOps tool applies.
    Git,
}

/// The object a proposal acts on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposalTarget {
    /// e.g. `apps/v1`.
    #[schemars(length(min = 1, max = 253))]
    pub api_version: String,
    /// e.g. `Deployment`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Namespace of the target; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// Name of the target.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// `Kind namespace/name` (`Kind /name` for cluster-scoped objects), as messages name it.
impl std::fmt::Display for ProposalTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.kind,
            self.namespace.as_deref().unwrap_or_default(),
            self.name
        )
    }
}

/// The session a proposal came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposalSession {
    /// Session id.
    #[schemars(length(min = 1, max = 64))]
    pub id: String,
    /// Session name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The session's user.
    #[schemars(length(min = 1, max = 253))]
    pub user: String,
}

/// The model that proposed an action.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposalModel {
    /// `LLMProvider` name.
    #[schemars(length(min = 1, max = 253))]
    pub provider: String,
    /// Model id.
    #[schemars(length(min = 1, max = 256))]
    pub model: String,
}

/// A human's verdict on a proposal.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// `Approve` or `Reject`.
    pub verdict: Verdict,
    /// Username of whoever wrote the decision (checked by an admission policy).
    #[schemars(length(min = 1, max = 253))]
    pub by: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub reason: Option<String>,
    /// The decider's groups as the API server knows them (`kubectl kortex` fills them in
    /// from a SelfSubjectReview; the admission policy checks they are the writer's own).
    /// Used for the policy's `approverGroups` and for the SubjectAccessReview before
    /// execution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub groups: Vec<String>,
}

/// Approve or reject.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Verdict {
    /// Go ahead.
    Approve,
    /// Do not.
    Reject,
}

/// Lifecycle of a proposal.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProposalPhase {
    /// Waiting for a decision.
    #[default]
    Pending,
    /// Approved; executed next, or left for other automation.
    Approved,
    /// Rejected by a human.
    Rejected,
    /// Not decided in time (or decided too late).
    Expired,
    /// Being carried out.
    Executing,
    /// Carried out.
    Succeeded,
    /// Carrying it out failed.
    Failed,
}

impl ProposalPhase {
    /// Every phase.
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::Approved,
        Self::Rejected,
        Self::Expired,
        Self::Executing,
        Self::Succeeded,
        Self::Failed,
    ];

    /// The phase spelled `s` (as stored and shown).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The spelling stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Approved => "Approved",
            Self::Rejected => "Rejected",
            Self::Expired => "Expired",
            Self::Executing => "Executing",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for ProposalPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ProposalPhase {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Observed state of an `ActionProposal`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionProposalStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the proposal is in its lifecycle.
    #[serde(default)]
    pub phase: ProposalPhase,
    /// Undecided proposals expire at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// Human-readable detail of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What the action would change (server-side dry run) and warnings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::free_form_object")]
    pub preview: Option<serde_json::Value>,
    /// What is needed to undo the executed action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::free_form_object")]
    pub undo: Option<serde_json::Value>,
    /// The Git change of a `delivery: git` proposal once it is pushed: its branch, commit
    /// and change request, followed until the cluster runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitChangeStatus>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// Where a Git change stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitChangeStatus {
    /// The repository written to.
    pub repository: String,
    /// The branch Kortex pushed (`kortex/<proposal>`).
    pub branch: String,
    /// The commit on it.
    pub commit: String,
    /// The pull/merge request's web address (absent with `forge: none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_url: Option<String>,
    /// The request's number (GitHub, Gitea) or iid (GitLab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_number: Option<u64>,
    /// `open`, `merged`, `closed` (unmerged) or `pushed` (no forge).
    pub request_state: String,
    /// The commit that brought the change into the base branch, once merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_commit: Option<String>,
    /// The revision the GitOps tool last synced, as it reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_revision: Option<String>,
}
