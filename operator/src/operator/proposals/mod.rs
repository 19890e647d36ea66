//! `ActionProposal` objects in cluster mode: the cluster's object handling only. What both
//! modes share — the phase rules, pins, previews, carrying an action out — is the
//! [`crate::proposals`] room below.
//!
//! The replica whose model proposed an action creates the object (in the target's
//! namespace) and writes its initial status: `Pending`, `expiresAt` and the dry-run
//! `preview`. From then on the leader alone moves it: `Expired` when undecided past
//! `expiresAt` (a decision seen after it is void), `Rejected`, `Approved` (not executed:
//! `execute: false`, or a verb Kortex does not carry out), or — for an allowed action and
//! namespace, checked again now, and an approver a SubjectAccessReview shows may do it
//! themselves — `Executing` (a status write conditioned on the resourceVersion read, so a
//! lease hand-over can never execute twice), then `Succeeded` or `Failed` with the result
//! and what undoes it. Every change is mirrored to the database (incident history) and
//! sent to the proposing session as `proposal.updated`; Events record decisions and
//! executions on the object.

pub use crate::proposals::{
    EXECUTING_CONDITION, EXECUTION_GRACE, EXECUTION_TIMEOUT, Transition, carry_out, next, pin,
    preview,
};

mod git;

use super::admission_guard::AdmissionGuard;
use super::error::Error;
use crate::crd::{ActionProposal, ActionProposalSpec, ProposalPhase, ProposalTarget};
use crate::proposals::executor::{self, Action, Executor};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use tracing::Instrument as _;

/// What the reconciler needs of the server it runs in: the live configuration, the
/// database, and a way to tell a proposal's session that it moved. The chat engine
/// implements it; this room owns it, so `operator` never imports `chat`.
#[async_trait::async_trait]
pub trait ProposalHost: Send + Sync {
    /// The configuration now.
    fn config(&self) -> Arc<crate::live::LiveConfig>;
    /// The database the proposals are mirrored to.
    fn store(&self) -> &crate::store::Store;
    /// Tells `session` that its proposal moved (`proposal.updated`, `data` as documented
    /// there); best effort.
    async fn proposal_updated(&self, session: &str, data: Value);
}

/// Annotation: the database id of the proposal's mirror.
pub const ID_ANNOTATION: &str = "kortex.dev/proposal-id";
/// Label: the proposing session's id.
pub const SESSION_LABEL: &str = "kortex.dev/session";
/// Label (`"true"`): the proposer may not decide (checked by the admission policy).
pub const DISTINCT_LABEL: &str = "kortex.dev/require-distinct-approver";
/// Annotation: comma-separated groups allowed to decide (checked by the admission policy).
pub const GROUPS_ANNOTATION: &str = "kortex.dev/approver-groups";
/// Annotation a human sets (with `kubectl kortex undo`) to ask for the inverse proposal.
pub const UNDO_REQUEST_ANNOTATION: &str = "kortex.dev/undo-requested-by";
/// Annotation Kortex sets on a proposal whose undo proposal it created.
pub const UNDO_PROPOSAL_ANNOTATION: &str = "kortex.dev/undo-proposal";
/// Field manager of proposal statuses.
const FIELD_MANAGER: &str = "kortex";

/// Proposals in a cluster: creation (any replica) and the lifecycle (the leader).
#[derive(Clone)]
pub struct ClusterProposals {
    client: kube::Client,
    executor: Executor,
    recorder: Arc<Recorder>,
    /// What this process already did, by object uid: the watch may still show the object
    /// as it was before our own write, and a second pass must not act twice.
    handled: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// The only namespace watched (`kortex run --namespace`), if any.
    scope: Option<String>,
    /// Transitions and failed status writes are counted here.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Whether the API server authenticates decisions (the admission policy).
    guard: AdmissionGuard,
    /// The last result of [`ClusterProposals::check_admission`]: 1, 0, or -1 before any.
    admission_state: Arc<std::sync::atomic::AtomicI8>,
    /// Executions running at once.
    executions: Arc<tokio::sync::Semaphore>,
    /// When each delivered Git change was last looked at, and whether a look is running,
    /// by uid.
    follows: git::Follows,
    /// How often a delivered Git change is looked at.
    follow_every: std::time::Duration,
    /// The dashboard's address (`--public-url`), for the session link in a Git change.
    public_url: Option<String>,
}

/// How many approved proposals are executed at once.
const EXECUTIONS: usize = 8;

impl ClusterProposals {
    /// Counts transitions (`kortex_proposal_transitions_total`) and failed status writes
    /// (`kortex_reconcile_errors_total`).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Limits proposals to the one namespace Kortex watches (`--namespace`).
    pub fn scoped(mut self, namespace: Option<String>) -> Self {
        self.scope = namespace;
        self
    }

    /// Why a proposal in `namespace` could not be handled, if it could not: a watch limited
    /// to another namespace would never see it (it would stay Pending forever).
    pub fn refuses(&self, namespace: &str) -> Option<String> {
        match &self.scope {
            Some(scope) if scope != namespace => Some(format!(
                "Kortex serves only namespace {scope} (kortex run --namespace): a proposal for namespace {namespace} could not be decided or executed"
            )),
            _ => None,
        }
    }

    /// Proposals acting as `client` (Kortex's service account).
    pub fn new(client: kube::Client, identity: Option<String>) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "kortex".into(),
            instance: identity,
        };
        Self {
            executor: Executor::new(client.clone()),
            recorder: Arc::new(Recorder::new(client.clone(), reporter)),
            guard: AdmissionGuard::new(client.clone()),
            admission_state: Arc::new(std::sync::atomic::AtomicI8::new(-1)),
            executions: Arc::new(tokio::sync::Semaphore::new(EXECUTIONS)),
            follows: Arc::default(),
            follow_every: git::FOLLOW_EVERY,
            public_url: None,
            client,
            handled: Arc::default(),
            scope: None,
            metrics: None,
        }
    }

    /// Checks (at most every 30 s) that the admission policy is enforced where Kortex
    /// executes (its `--namespace`, or every namespace) and sets
    /// `kortex_admission_policy_enforced`; logs once each time that changes.
    pub async fn check_admission(&self) {
        // Not knowing counts as not enforced here (the metric and alert say so); executions
        // ask again themselves.
        let why = self
            .guard
            .unenforced(self.scope.as_deref())
            .await
            .unwrap_or_else(|e| Some(e.to_string()));
        let enforced = i8::from(why.is_none());
        if let Some(m) = &self.metrics {
            m.admission_policy_enforced.set(i64::from(enforced));
        }
        let before = self
            .admission_state
            .swap(enforced, std::sync::atomic::Ordering::Relaxed);
        if before != enforced {
            match &why {
                Some(why) => tracing::error!(%why, "approved proposals will not be executed"),
                None => tracing::info!(
                    "the admission policy is enforced: approved proposals are executed"
                ),
            }
        }
    }

    /// Creates the object, with the target's state pinned in its params, its dry-run
    /// preview and initial status. Returns its name, the preview and the params as created
    /// (the database record keeps those, so the leader's comparison holds).
    pub async fn create(
        &self,
        id: &str,
        base_name: &str,
        namespace: &str,
        mut spec: ActionProposalSpec,
        entry: &crate::catalog::PolicyEntry,
        expires_at: jiff::Timestamp,
    ) -> Result<(String, Value, Option<Value>), Error> {
        let policy = &entry.object.spec;
        let planned = pin(&self.executor, Some(entry), &mut spec)
            .await
            .map_err(Error::Refused)?;
        let mut object = ActionProposal::new("", spec);
        object.metadata.name = None;
        object.metadata.generate_name = Some(format!("{base_name}-"));
        object.metadata.namespace = Some(namespace.to_owned());
        let mut labels = std::collections::BTreeMap::from([(
            SESSION_LABEL.to_owned(),
            object.spec.session.id.clone(),
        )]);
        if policy.proposals.require_distinct_approver {
            labels.insert(DISTINCT_LABEL.to_owned(), "true".to_owned());
        }
        let mut annotations =
            std::collections::BTreeMap::from([(ID_ANNOTATION.to_owned(), id.to_owned())]);
        if !policy.proposals.approver_groups.is_empty() {
            annotations.insert(
                GROUPS_ANNOTATION.to_owned(),
                policy.proposals.approver_groups.join(","),
            );
        }
        object.metadata.labels = Some(labels);
        object.metadata.annotations = Some(annotations);
        let api: Api<ActionProposal> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let created = api
            .create(&params, &object)
            .await
            .map_err(Error::api(format!(
                "could not create the ActionProposal in {namespace}"
            )))?;
        let name = created.name_any();
        let preview = match planned {
            Some(p) => p,
            None => preview(&self.executor, &created.spec).await,
        };
        let status = json!({
            "phase": "Pending",
            "expiresAt": expires_at.to_string(),
            "message": "waiting for a decision",
            "preview": preview,
            "observedGeneration": created.metadata.generation,
        });
        if let Err(e) = self.write_status(&api, &name, None, &status).await {
            // The leader fills in a missing status; the proposal is not lost.
            tracing::warn!(proposal = %name, error = %e, "cannot write the initial proposal status");
        }
        Ok((name, preview, created.spec.params.clone()))
    }

    /// Writes the whole status by server-side apply; with `resource_version`, only if the
    /// object is still at that version (409 otherwise).
    async fn write_status(
        &self,
        api: &Api<ActionProposal>,
        name: &str,
        resource_version: Option<&str>,
        status: &Value,
    ) -> Result<(), kube::Error> {
        let mut body = json!({
            "apiVersion": crate::crd::API_VERSION,
            "kind": "ActionProposal",
            "metadata": {"name": name},
            "status": status,
        });
        if let Some(rv) = resource_version {
            body["metadata"]["resourceVersion"] = json!(rv);
        }
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(|_| ())
    }

    /// Marks `what` of the object done; `false` if it already was.
    fn first_time(&self, p: &ActionProposal, what: &str) -> bool {
        let key = format!("{}/{what}", p.metadata.uid.as_deref().unwrap_or_default());
        self.handled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key)
    }

    /// A look at a delivered Git change when one is due ([`git::FOLLOW_EVERY`] since the
    /// last began, and none running for it: the look ends when what is returned drops).
    fn follow_due(&self, p: &ActionProposal) -> Option<git::Look> {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let mut due = self.follows.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match due.get(&uid) {
            Some((_, true)) => None,
            Some((last, false)) if now.duration_since(*last) < self.follow_every => None,
            _ => {
                due.insert(uid.clone(), (now, true));
                Some(git::Look {
                    follows: self.follows.clone(),
                    uid,
                })
            }
        }
    }

    /// Links sessions in the dashboard at `url` (`--public-url`) in Git changes' messages.
    pub fn with_public_url(mut self, url: Option<String>) -> Self {
        self.public_url = url;
        self
    }

    /// Looks at delivered Git changes every `every` (default [`git::FOLLOW_EVERY`]).
    pub fn follow_every(mut self, every: std::time::Duration) -> Self {
        self.follow_every = every;
        self
    }

    fn forget(&self, p: &ActionProposal, what: &str) {
        let key = format!("{}/{what}", p.metadata.uid.as_deref().unwrap_or_default());
        self.handled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }

    /// One pass of the leader over every proposal.
    // Long because it is the leader's pass in order: mirror, expire, decide, execute, each a
    // short branch on the pure rules' answer (`proposals::rules::next`).
    pub async fn reconcile(&self, shared: &Arc<dyn ProposalHost>, proposals: &[ActionProposal]) {
        let host = shared.as_ref();
        let config = host.config();
        let now = jiff::Timestamp::now();
        // Forget what was done to objects that are gone.
        {
            let live: std::collections::HashSet<&str> = proposals
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref())
                .collect();
            self.handled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k| k.split_once('/').is_some_and(|(uid, _)| live.contains(uid)));
            self.follows
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|uid, _| live.contains(uid.as_str()));
        }
        for p in proposals {
            // Final proposals need nothing, unless someone asked for an undo.
            let phase = p.status.as_ref().map(|s| s.phase);
            let undo_asked = p.annotations().contains_key(UNDO_REQUEST_ANNOTATION)
                && !p.annotations().contains_key(UNDO_PROPOSAL_ANNOTATION);
            let open = matches!(
                phase,
                None | Some(ProposalPhase::Pending) | Some(ProposalPhase::Executing)
            );
            let undo_due = undo_asked && phase == Some(ProposalPhase::Succeeded);
            if !(open || undo_due) {
                continue;
            }
            let record = match p.annotations().get(ID_ANNOTATION) {
                Some(id) => host.store().get_proposal(id).await.ok().flatten(),
                None => None,
            };
            let policy = policy_of(&config, record.as_ref()).map(|e| &e.object.spec);
            let mut p = p.clone();
            // A proposal whose creator died before writing its status gets one.
            if p.status
                .as_ref()
                .and_then(|s| s.expires_at.as_ref())
                .is_none()
                && p.status
                    .as_ref()
                    .is_none_or(|s| s.phase == ProposalPhase::Pending)
            {
                let created = p.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
                // The creator writes it (with the preview) right after creating the object.
                if now < created + jiff::SignedDuration::from_secs(30) {
                    continue;
                }
                let expire = policy.map_or(std::time::Duration::from_secs(600), |s| {
                    s.proposals.expire_after.into()
                });
                let expires_at =
                    created + jiff::SignedDuration::try_from(expire).unwrap_or_default();
                let status = json!({"phase": "Pending", "expiresAt": expires_at.to_string(), "message": "waiting for a decision"});
                let api: Api<ActionProposal> =
                    Api::namespaced(self.client.clone(), &p.namespace().unwrap_or_default());
                if let Err(e) = self.write_status(&api, &p.name_any(), None, &status).await {
                    tracing::warn!(proposal = %p.name_any(), error = %e, "cannot write a proposal status");
                    continue;
                }
                p.status = serde_json::from_value(status).ok();
            }
            match next(&p, policy, now) {
                Transition::Wait => {}
                Transition::Follow(action) => {
                    if let Some(look) = self.follow_due(&p) {
                        let (this, host, p) = (self.clone(), shared.clone(), p.clone());
                        let record = record.clone();
                        tokio::spawn(async move {
                            this.follow_git(host.as_ref(), &p, record.as_ref(), &action)
                                .await;
                            drop(look);
                        });
                    }
                }
                Transition::Final(phase, message) => {
                    // An execution's end (interrupted, a Git change no longer followed) is
                    // not its decision, which this process may have acted on already.
                    let what = match p.status.as_ref().map(|s| s.phase) {
                        Some(ProposalPhase::Executing) => "end",
                        _ => "decide",
                    };
                    if self.first_time(&p, what)
                        && !self
                            .finish(host, &p, record.as_ref(), phase, &message, None)
                            .await
                    {
                        self.forget(&p, what);
                    }
                }
                Transition::Execute(action) => {
                    // What is executed is what was proposed: the parameters recorded when
                    // the model made the proposal (an API-server rule cannot compare
                    // free-form objects reliably, so the leader checks too).
                    let recorded = record.as_ref().map(|r| normalized(r.params.as_ref()));
                    if recorded.is_some_and(|r| r != normalized(p.spec.params.as_ref())) {
                        let message =
                            "not executed: spec.params differ from what the model proposed";
                        if self.first_time(&p, "decide")
                            && !self
                                .finish(
                                    host,
                                    &p,
                                    record.as_ref(),
                                    ProposalPhase::Failed,
                                    message,
                                    None,
                                )
                                .await
                        {
                            self.forget(&p, "decide");
                        }
                        continue;
                    }
                    // Each execution runs on its own (at most EXECUTIONS at once, the action
                    // within EXECUTION_TIMEOUT): a slow or hung one holds up neither the
                    // others nor status writes.
                    if self.first_time(&p, "decide") {
                        let (this, host, p) = (self.clone(), shared.clone(), p.clone());
                        let record = record.clone();
                        tokio::spawn(async move {
                            let Ok(_permit) = this.executions.clone().acquire_owned().await else {
                                return;
                            };
                            if !this
                                .execute(host.as_ref(), &p, record.as_ref(), action)
                                .await
                            {
                                this.forget(&p, "decide");
                            }
                        });
                    }
                }
            }
            if p.status
                .as_ref()
                .is_some_and(|s| s.phase == ProposalPhase::Succeeded)
            {
                self.undo_if_requested(host, &p, record.as_ref()).await;
            }
        }
    }

    async fn execute(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        action: Action,
    ) -> bool {
        let decision = p.spec.decision.clone();
        let by = decision.as_ref().map(|d| d.by.clone()).unwrap_or_default();
        // `decision.by` and `groups` are the decider's only if the API server checked them.
        match self.guard.unenforced(p.namespace().as_deref()).await {
            Ok(None) => {}
            Ok(Some(why)) => {
                return self.approved_not_executed(host, p, record, &by, &why).await;
            }
            // A passing fault must not end the proposal: it is tried again.
            Err(e) => {
                tracing::warn!(proposal = %p.name_any(), error = %e, "not executing yet; retrying");
                return false;
            }
        }
        // Kortex's rights are never lent: the approver must be allowed the action.
        match self.approver_may(&action, decision.as_ref()).await {
            Ok(true) => {}
            Ok(false) => {
                let access = executor::required_access(&action)
                    .map(|a| a.to_string())
                    .unwrap_or_else(|e| e.to_string());
                let message = format!(
                    "approved by {by}; not executed: {by} may not {access} themselves (SubjectAccessReview), and Kortex does not lend its rights"
                );
                return self
                    .finish(host, p, record, ProposalPhase::Failed, &message, None)
                    .await;
            }
            Err(e) => {
                tracing::warn!(proposal = %p.name_any(), error = %e, "SubjectAccessReview failed; will retry");
                return false;
            }
        }
        let namespace = p.namespace().unwrap_or_default();
        let name = p.name_any();
        let api: Api<ActionProposal> = Api::namespaced(self.client.clone(), &namespace);
        let mut status =
            serde_json::to_value(p.status.clone().unwrap_or_default()).unwrap_or_default();
        status["phase"] = json!("Executing");
        status["message"] = json!(format!("approved by {by}; executing"));
        set_executing(
            &mut status,
            json!({"status": "True", "reason": "Approved", "message": format!("approved by {by}")}),
        );
        // Conditioned on the version read: of two leaders, only one gets here.
        match self
            .write_status(&api, &name, p.metadata.resource_version.as_deref(), &status)
            .await
        {
            Ok(()) => {}
            // Changed since it was read: look again with the fresh object.
            Err(kube::Error::Api(s)) if s.code == 409 => return false,
            Err(e) => {
                tracing::warn!(proposal = %name, error = %e, "cannot move the proposal to Executing; will retry");
                return false;
            }
        }
        self.mirror(
            host,
            p,
            record,
            ProposalPhase::Executing,
            &format!("approved by {by}; executing"),
            None,
        )
        .await;
        if p.spec.delivery == Some(crate::crd::Delivery::Git) {
            self.deliver_git(host, p, record, &action, &by).await;
            return true;
        }
        // Once `Executing` is written the action is never started again; a hung one fails.
        let (phase, message, undo) = carry_out(&self.executor, &action).await;
        // Carried out: the result is written, retried here, never by executing again.
        self.finish_retried(host, p, record, phase, &message, undo)
            .await;
        true
    }

    /// Stops an approved proposal at `Approved`: its decision cannot be trusted because the
    /// admission policy is not enforced. The `Executing` condition (False) says why.
    async fn approved_not_executed(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        by: &str,
        why: &str,
    ) -> bool {
        let message = format!(
            "approved by {by}; not executed: {why}. This proposal stays Approved: once the policy is enforced, ask for the action again"
        );
        let mut status =
            serde_json::to_value(p.status.clone().unwrap_or_default()).unwrap_or_default();
        set_executing(
            &mut status,
            json!({"status": "False", "reason": crate::crd::conditions::reasons::ADMISSION_POLICY_NOT_ENFORCED,
                "message": crate::operator::event_note(why), "observedGeneration": p.metadata.generation}),
        );
        // Written with the phase, message and Event as for any decision.
        let mut p = p.clone();
        p.status = serde_json::from_value(status).ok();
        self.finish(host, &p, record, ProposalPhase::Approved, &message, None)
            .await
    }

    /// Whether the decider may carry out the action themselves.
    async fn approver_may(
        &self,
        action: &Action,
        decision: Option<&crate::crd::Decision>,
    ) -> Result<bool, Error> {
        let Some(decision) = decision else {
            return Ok(false);
        };
        let access = executor::required_access(action)?;
        // Every signed-in user is in system:authenticated, whatever the decision lists.
        let mut groups = decision.groups.clone();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(decision.by.clone()),
                groups: Some(groups),
                resource_attributes: Some(ResourceAttributes {
                    namespace: access.namespace,
                    verb: Some(access.verb.into()),
                    group: Some(access.group),
                    resource: Some(access.resource),
                    subresource: access.subresource,
                    name: Some(access.name),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let result = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(Error::api(
                "cannot review the approver's rights (SubjectAccessReview)",
            ))?;
        Ok(result.status.is_some_and(|s| s.allowed))
    }

    /// Writes a final (or `Executing`) phase, mirrors it and records an Event, in the
    /// transition's span.
    async fn finish(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        phase: ProposalPhase,
        message: &str,
        undo: Option<Value>,
    ) -> bool {
        let ending = Ending {
            phase,
            message,
            undo,
            unchanged: false,
        };
        self.end(host, p, record, ending).await
    }

    /// [`ClusterProposals::finish`] with its [`Ending`] (which may ask that the object be
    /// as `p` shows it: a 409 then drops the write).
    async fn end(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        ending: Ending<'_>,
    ) -> bool {
        let span = crate::telemetry::trace::proposal_span(
            &p.namespace().unwrap_or_default(),
            &p.name_any(),
            ending.phase.as_str(),
        );
        let done = self
            .transition(host, p, record, ending)
            .instrument(span.clone())
            .await;
        if !done {
            crate::telemetry::trace::fail(&span, "status_write");
        }
        done
    }

    async fn transition(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        ending: Ending<'_>,
    ) -> bool {
        let Ending {
            phase,
            message,
            undo,
            unchanged,
        } = ending;
        let version = p.metadata.resource_version.as_deref().filter(|_| unchanged);
        let namespace = p.namespace().unwrap_or_default();
        let name = p.name_any();
        let api: Api<ActionProposal> = Api::namespaced(self.client.clone(), &namespace);
        let mut status =
            serde_json::to_value(p.status.clone().unwrap_or_default()).unwrap_or_default();
        status["phase"] = json!(phase.as_str());
        status["message"] = json!(message);
        status["observedGeneration"] = json!(p.metadata.generation);
        if let Some(u) = &undo {
            status["undo"] = u.clone();
        }
        if let Err(e) = self.write_status(&api, &name, version, &status).await {
            tracing::warn!(proposal = %name, error = %e, "cannot write the proposal status; will retry");
            if let Some(m) = &self.metrics {
                m.reconcile_errors
                    .get_or_create(&crate::metrics::KindLabel {
                        kind: "ActionProposal",
                    })
                    .inc();
            }
            return false;
        }
        tracing::info!(proposal = %name, namespace = %namespace, phase = phase.as_str(), %message, "proposal updated");
        if let Some(m) = &self.metrics {
            m.proposal_transitions
                .get_or_create(&crate::metrics::PhaseLabel {
                    phase: phase.as_str(),
                })
                .inc();
        }
        self.mirror(host, p, record, phase, message, undo.as_ref())
            .await;
        let warning = matches!(phase, ProposalPhase::Failed | ProposalPhase::Expired);
        let (reason, action) = match phase {
            ProposalPhase::Succeeded => ("Executed", "Execute"),
            ProposalPhase::Failed => ("ExecutionFailed", "Execute"),
            ProposalPhase::Expired => ("Expired", "Expire"),
            ProposalPhase::Rejected => ("Rejected", "Decide"),
            _ => ("Approved", "Decide"),
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(crate::operator::event_note(message)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &p.object_ref(&())).await {
            tracing::warn!(error = %e, "cannot publish an Event");
        }
        true
    }

    /// The database mirror and the session's `proposal.updated` event.
    async fn mirror(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
        phase: ProposalPhase,
        message: &str,
        undo: Option<&Value>,
    ) {
        let Some(record) = record else {
            return;
        };
        let decision = p
            .spec
            .decision
            .as_ref()
            .and_then(|d| serde_json::to_value(d).ok());
        let git = p
            .status
            .as_ref()
            .and_then(|s| s.git.as_ref())
            .and_then(|g| serde_json::to_value(g).ok());
        if let Err(e) = host
            .store()
            .mirror_proposal(
                &record.id,
                phase,
                decision.as_ref(),
                Some(message),
                undo,
                git.as_ref(),
            )
            .await
        {
            tracing::warn!(proposal = %p.name_any(), error = %e, "cannot mirror the proposal to the database");
        }
        if let Some(session) = &record.session_id {
            host.proposal_updated(
                session,
                json!({"proposalId": record.id, "name": p.name_any(), "phase": phase.as_str(), "message": message}),
            )
            .await;
        }
    }

    /// Creates the inverse proposal when someone asked for it (`kubectl kortex undo`).
    async fn undo_if_requested(
        &self,
        host: &dyn ProposalHost,
        p: &ActionProposal,
        record: Option<&crate::store::ProposalRecord>,
    ) {
        let annotations = p.annotations();
        let Some(requester) = annotations.get(UNDO_REQUEST_ANNOTATION) else {
            return;
        };
        if annotations.contains_key(UNDO_PROPOSAL_ANNOTATION) || !self.first_time(p, "undo") {
            return;
        }
        let Some(undo) = p.status.as_ref().and_then(|s| s.undo.clone()) else {
            return;
        };
        let Ok(target) = serde_json::from_value::<ProposalTarget>(undo["target"].clone()) else {
            return;
        };
        let config = host.config();
        let policy = policy_of(&config, record);
        let Some(policy) = policy else {
            return;
        };
        let spec = ActionProposalSpec {
            action: undo["action"].as_str().unwrap_or_default().to_owned(),
            target: Some(target),
            params: undo.get("params").cloned(),
            rationale: format!(
                "Undo of {} ({}), requested by {requester}.",
                p.name_any(),
                p.spec.action
            ),
            blast_radius: p.spec.blast_radius.clone(),
            reversible: Some(true),
            session: p.spec.session.clone(),
            model: None,
            delivery: None,
            decision: None,
        };
        let now = jiff::Timestamp::now();
        let expire: std::time::Duration = policy.object.spec.proposals.expire_after.into();
        let expires_at = now + jiff::SignedDuration::try_from(expire).unwrap_or_default();
        let id = crate::store::new_id();
        let namespace = p.namespace().unwrap_or_default();
        match self
            .create(
                &id,
                &format!("undo-{}", p.name_any())
                    .chars()
                    .take(50)
                    .collect::<String>(),
                &namespace,
                spec.clone(),
                policy,
                expires_at,
            )
            .await
        {
            Ok((name, preview, params)) => {
                if let Some(r) = record {
                    let copy = crate::store::ProposalRecord {
                        id,
                        name: name.clone(),
                        action: spec.action.clone(),
                        target: serde_json::to_value(&spec.target).ok(),
                        params,
                        rationale: spec.rationale.clone(),
                        user: requester.clone(),
                        phase: ProposalPhase::Pending,
                        decision: None,
                        message: None,
                        preview: Some(preview),
                        undo: None,
                        provider: None,
                        model: None,
                        expires_at: expires_at.as_millisecond(),
                        created_at: now.as_millisecond(),
                        updated_at: now.as_millisecond(),
                        version: 1,
                        ..r.clone()
                    };
                    let _ = host.store().insert_proposal(&copy).await;
                }
                let api: Api<ActionProposal> = Api::namespaced(self.client.clone(), &namespace);
                let patch = json!({"metadata": {"annotations": {UNDO_PROPOSAL_ANNOTATION: name}}});
                if let Err(e) = api
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    tracing::warn!(error = %e, "cannot record the undo proposal");
                }
                tracing::info!(proposal = %p.name_any(), undo = %name, "undo proposal created");
            }
            Err(e) => {
                tracing::warn!(proposal = %p.name_any(), error = %e, "cannot create the undo proposal; will retry");
                self.forget(p, "undo");
            }
        }
    }
}

/// How a proposal ends: its phase, message and undo, and whether only the object as read
/// may be changed (`unchanged`: the write carries its resourceVersion).
struct Ending<'a> {
    phase: ProposalPhase,
    message: &'a str,
    undo: Option<Value>,
    unchanged: bool,
}

/// Replaces the `Executing` condition of a status (as JSON) with `condition` (its status,
/// reason, message, ...), stamped now.
fn set_executing(status: &mut Value, mut condition: Value) {
    condition["type"] = json!(EXECUTING_CONDITION);
    condition["lastTransitionTime"] = json!(jiff::Timestamp::now().to_string());
    let mut conditions: Vec<Value> = status["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != EXECUTING_CONDITION)
        .collect();
    conditions.push(condition);
    status["conditions"] = json!(conditions);
}

/// Parameters as compared: absent, `null` and `{}` are the same.
fn normalized(params: Option<&serde_json::Value>) -> serde_json::Value {
    match params {
        None | Some(serde_json::Value::Null) => json!({}),
        Some(v) => v.clone(),
    }
}

/// The ChatPolicy that governed a proposal (as recorded in its database mirror), as the
/// live configuration has it now.
fn policy_of<'a>(
    config: &'a crate::live::LiveConfig,
    record: Option<&crate::store::ProposalRecord>,
) -> Option<&'a crate::catalog::PolicyEntry> {
    config.catalog.policy_named(record?.policy.as_deref()?)
}
