//! `propose_action`: the model's one "write" tool. It executes nothing. In standalone mode
//! it stores a proposal that a human decides through the API under the policy's trust
//! rules; in cluster mode it also creates the `ActionProposal` object (with its dry-run
//! preview) that people approve with `kubectl kortex approve`, and the database keeps a
//! mirror for incident history.

use super::Engine;
use crate::catalog::PolicyEntry;
use crate::crd::ProposalPhase;
use crate::llm::ToolSpec;
use crate::store::{NewDecision, ProposalRecord, SessionRecord};
use serde_json::{Value, json};

/// The tool's name.
pub const TOOL: &str = "propose_action";

/// Event names.
pub mod event {
    /// `{runId, proposalId, name, action, target}`
    pub const CREATED: &str = "proposal.created";
    /// `{proposalId, phase, message?}`
    pub const UPDATED: &str = "proposal.updated";
}

/// The cluster's proposal reconciler moves proposals; the engine tells their sessions.
#[async_trait::async_trait]
impl crate::operator::proposals::ProposalHost for Engine {
    fn config(&self) -> std::sync::Arc<crate::live::LiveConfig> {
        self.config.borrow().clone()
    }

    fn store(&self) -> &crate::store::Store {
        &self.store
    }

    async fn proposal_updated(&self, session: &str, data: Value) {
        if let Err(e) = self.emit_session(session, event::UPDATED, data).await {
            tracing::warn!(session, error = %e, "cannot tell a session that its proposal moved");
        }
    }
}

/// The tool as offered to the model, when the policy allows any action.
pub fn spec(policy: &PolicyEntry) -> Option<ToolSpec> {
    let rules = &policy.object.spec.proposals;
    if rules.allowed_actions.is_empty()
        || !crate::glob::allowed(
            &policy.object.spec.tools.allow,
            &policy.object.spec.tools.deny,
            TOOL,
        )
    {
        return None;
    }
    Some(ToolSpec {
        name: TOOL.to_owned(),
        description: format!(
            "Propose an action for a human to approve; nothing is executed by this call. Allowed actions: {}. \
             Explain the evidence in rationale. Returns a proposal id; the human decision arrives later.",
            rules.allowed_actions.join(", ")
        ),
        parameters: parameters(json!({"type": "string", "enum": rules.allowed_actions})),
    })
}

/// The arguments' schema, with `action` as the policy allows it.
fn parameters(action: Value) -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": action,
            "target": {"type": "object", "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "namespace": {"type": "string"}, "name": {"type": "string"}},
                "required": ["apiVersion", "kind", "name"]},
            "params": {"type": "object", "description": "e.g. {\"replicas\": 3} for scale"},
            "rationale": {"type": "string"},
            "blastRadius": {"type": "string"},
            "reversible": {"type": "boolean"}
        },
        "required": ["action", "target", "rationale"]
    })
}

/// `propose_action` behind the router: offered as the session's policy shapes it
/// ([`spec`]), carried out by [`propose`] for the engine it belongs to.
pub struct ProposeAction(pub(super) std::sync::Weak<Engine>);

impl crate::tools::Tool for ProposeAction {
    /// What every call is validated against; the policy's own actions are checked by
    /// [`propose`], with its reasons.
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: TOOL.to_owned(),
            description:
                "Propose an action for a human to approve; nothing is executed by this call.".into(),
            parameters: parameters(json!({"type": "string"})),
        }
    }

    fn offer(&self, policy: &PolicyEntry) -> crate::tools::Offer {
        spec(policy).map_or(crate::tools::Offer::Never, crate::tools::Offer::As)
    }

    fn effect(&self) -> crate::tools::Effect {
        crate::tools::Effect::Records
    }

    /// In cluster mode it creates an object and asks the API server for a dry-run preview.
    fn timeouts(&self) -> (std::time::Duration, std::time::Duration) {
        (
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(120),
        )
    }

    fn call(&self, ctx: crate::tools::ToolContext, input: Value) -> crate::tools::ToolFuture {
        use crate::tools::ToolError;
        let engine = self.0.upgrade();
        Box::pin(async move {
            let engine = engine.ok_or(ToolError::Internal("the chat engine is gone".into()))?;
            let policy = ctx
                .scope
                .policy
                .as_ref()
                .ok_or(ToolError::Internal("the call has no policy".into()))?;
            let model = (ctx.scope.model.0.as_str(), ctx.scope.model.1.as_str());
            propose(
                &engine,
                &ctx.session,
                &ctx.run_id,
                policy,
                model,
                ctx.via,
                &input,
            )
            .await
            .map(|v| v.to_string())
            .map_err(ToolError::Invalid)
        })
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
}

/// A `metadata.generateName`-like suffix.
fn suffix() -> String {
    let id = crate::store::new_id().replace('-', "");
    id.chars()
        .rev()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(5)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// Runs a `propose_action` call: validates it against the policy, stores the proposal and
/// announces it. `Err` is the tool's error result for the model.
// Long because it is one validation after another, each with the reason the model is told,
// then the record (and, in a cluster, the object) written in order.
pub async fn propose(
    engine: &Engine,
    session: &SessionRecord,
    run_id: &str,
    policy: &PolicyEntry,
    model: (&str, &str),
    via: &str,
    input: &Value,
) -> Result<Value, String> {
    let rules = &policy.object.spec.proposals;
    let action = str_field(input, "action").ok_or("action is required")?;
    if !rules.allowed_actions.iter().any(|a| a == action) {
        return Err(format!(
            "action {action} is not allowed by the policy; allowed: {}",
            rules.allowed_actions.join(", ")
        ));
    }
    let rationale = str_field(input, "rationale")
        .ok_or("rationale is required: say what evidence supports it")?;
    let target = input
        .get("target")
        .filter(|t| t.is_object())
        .ok_or("target {apiVersion, kind, namespace, name} is required")?;
    for field in ["apiVersion", "kind", "name"] {
        if str_field(target, field).is_none() {
            return Err(format!("target.{field} is required"));
        }
    }
    let namespace = str_field(target, "namespace")
        .unwrap_or(&session.namespace)
        .to_owned();
    if !crate::glob::any_matches(&rules.allowed_namespaces, &namespace) {
        return Err(format!(
            "namespace {namespace} is not in the policy's allowedNamespaces"
        ));
    }
    if let Some(why) = engine.cluster.get().and_then(|c| c.refuses(&namespace)) {
        return Err(why);
    }
    if let Some(params) = input
        .get("params")
        .filter(|p| !p.is_null() && !p.is_object())
    {
        return Err(format!("params must be an object, got {params}"));
    }
    let target_name = str_field(target, "name").unwrap_or_default();
    let base: String = format!("{action}-{target_name}")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(50)
        .collect();
    let now = crate::store::now_ms();
    let expire = std::time::Duration::from(rules.expire_after).as_millis() as i64;
    let policy_ns = policy
        .object
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let stored_target = {
        let mut t = target.clone();
        t["namespace"] = json!(namespace);
        t
    };
    let record = ProposalRecord {
        id: crate::store::new_id(),
        name: format!("{}-{}", base.to_ascii_lowercase(), suffix()),
        namespace,
        session_id: Some(session.id.clone()),
        session_name: session.name.clone(),
        user: session.user.clone(),
        policy: Some(format!(
            "{policy_ns}/{}",
            policy.object.metadata.name.as_deref().unwrap_or_default()
        )),
        action: action.to_owned(),
        // With the namespace it defaulted to: what is decided and executed names it.
        target: Some(stored_target),
        params: input
            .get("params")
            .filter(|p| p.is_object())
            .cloned()
            .map(crate::proposals::unpinned),
        rationale: rationale.to_owned(),
        blast_radius: str_field(input, "blastRadius").map(str::to_owned),
        reversible: input.get("reversible").and_then(Value::as_bool),
        provider: Some(model.0.to_owned()),
        model: Some(model.1.to_owned()),
        phase: ProposalPhase::Pending,
        decision: None,
        message: None,
        preview: None,
        undo: None,
        git: None,
        expires_at: now + expire,
        created_at: now,
        updated_at: now,
        version: 1,
    };
    let mut record = record;
    let executor = engine.executor.get();
    if engine.cluster.get().is_some() || executor.is_some() {
        let target: crate::crd::ProposalTarget = serde_json::from_value(json!({
            "apiVersion": str_field(target, "apiVersion"),
            "kind": str_field(target, "kind"),
            "namespace": record.namespace,
            "name": target_name,
        }))
        .map_err(|e| format!("invalid target: {e}"))?;
        let spec = crate::crd::ActionProposalSpec {
            action: action.to_owned(),
            target: Some(target),
            params: record.params.clone(),
            rationale: rationale.to_owned(),
            blast_radius: record.blast_radius.clone(),
            reversible: record.reversible,
            session: crate::crd::ProposalSession {
                id: session.id.clone(),
                name: session.name.clone(),
                user: session.user.clone(),
            },
            model: Some(crate::crd::ProposalModel {
                provider: model.0.to_owned(),
                model: model.1.to_owned(),
            }),
            delivery: None,
            decision: None,
        };
        match (engine.cluster.get(), executor) {
            (Some(cluster), _) => {
                let expires_at = jiff::Timestamp::from_millisecond(record.expires_at)
                    .map_err(|e| format!("invalid expiry: {e}"))?;
                let base = base.to_ascii_lowercase();
                let (name, preview, params) = cluster
                    .create(
                        &record.id,
                        base.trim_end_matches('-'),
                        &record.namespace,
                        spec,
                        policy,
                        expires_at,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                record.name = name;
                record.preview = Some(preview);
                // With the target's state pinned by the operator.
                record.params = params;
            }
            // Standalone with a kubeconfig: the same pin and dry-run preview, kept in the
            // database (approved, it is executed there: `execute_approved`).
            (None, Some(executor)) => {
                let mut spec = spec;
                let planned = crate::proposals::pin(executor, Some(policy), &mut spec).await?;
                record.preview = Some(match planned {
                    Some(p) => p,
                    None => crate::proposals::preview(executor, &spec).await,
                });
                record.params = spec.params;
            }
            (None, None) => {}
        }
    }
    engine
        .store
        .insert_proposal(&record)
        .await
        .map_err(|e| format!("could not store the proposal: {e}"))?;
    let _ = engine
        .store
        .record_decision(&NewDecision {
            kind: "proposal".into(),
            namespace: Some(record.namespace.clone()),
            session_id: Some(session.id.clone()),
            run_id: Some(run_id.to_owned()),
            user: Some(session.user.clone()),
            policy: record.policy.clone(),
            subject: record.name.clone(),
            outcome: "created".into(),
            detail: json!({"proposalId": record.id, "action": record.action, "target": record.target, "via": via}),
            trace_id: None,
        })
        .await;
    let _ = engine
        .emit(
            &session.id,
            run_id,
            event::CREATED,
            json!({"runId": run_id, "proposalId": record.id, "name": record.name, "action": record.action, "target": record.target}),
        )
        .await;
    let mut out = json!({"proposalId": record.id, "name": record.name, "namespace": record.namespace,
        "awaitsConfirmation": true,
        "message": "Proposed, not executed: nothing changes unless a person approves it before it expires (the dashboard, kortex proposals approve, or kubectl kortex approve in a cluster).",
        "expiresAt": jiff::Timestamp::from_millisecond(record.expires_at).map(|t| t.to_string()).unwrap_or_default()});
    out["approveWith"] = if engine.cluster.get().is_some() {
        json!(format!(
            "kubectl kortex approve {} -n {}",
            record.name, record.namespace
        ))
    } else {
        json!(format!("kortex proposals approve {}", record.id))
    };
    if let Some(preview) = &record.preview {
        out["preview"] = preview.clone();
    }
    Ok(out)
}

/// Carries out an approved proposal (standalone mode, recorded as `Executing` by the
/// decision), within the same time limit as the cluster's leader, and records the outcome
/// and what undoes it. Started once: a proposal left `Executing` by a stopped process is
/// failed by [`expire`], never run again.
pub async fn execute_approved(
    engine: std::sync::Arc<Engine>,
    p: ProposalRecord,
    action: crate::proposals::executor::Action,
) {
    let Some(executor) = engine.executor.get() else {
        return;
    };
    let (phase, message, undo) = crate::proposals::carry_out(executor, &action).await;
    tracing::info!(proposal = %p.name, phase = phase.as_str(), %message, "proposal executed");
    // Carried out: the result is written, retried here, never by executing again.
    let mut recorded = false;
    for attempt in 0..5u32 {
        match engine
            .store
            .update_proposal_phase(&p.id, p.version, phase, Some(&message), None, undo.as_ref())
            .await
        {
            Ok(_) => {
                recorded = true;
                break;
            }
            // Someone else ended it (the interrupted-execution sweep): theirs stands.
            Err(crate::store::StoreError::Conflict(m)) => {
                tracing::error!(proposal = %p.name, %phase, %message, conflict = %m, "the result of an executed proposal could not be recorded");
                break;
            }
            Err(e) if attempt == 4 => {
                tracing::error!(proposal = %p.name, %phase, %message, error = %e, "the result of an executed proposal could not be recorded");
            }
            Err(e) => {
                tracing::warn!(proposal = %p.name, error = %e, attempt, "cannot record the result of an executed proposal; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1 << attempt)).await;
            }
        }
    }
    if !recorded {
        return;
    }
    audit_execution(&engine, &p, phase, &message, undo.as_ref()).await;
    tell_session(&engine, &p, phase, &message).await;
}

/// The audit row of an execution's outcome (`phase`: `Succeeded` or `Failed`), in the
/// name of whoever approved it.
async fn audit_execution(
    engine: &Engine,
    p: &ProposalRecord,
    phase: ProposalPhase,
    message: &str,
    undo: Option<&Value>,
) {
    let _ = engine
        .store
        .record_decision(&NewDecision {
            kind: "execution".into(),
            namespace: Some(p.namespace.clone()),
            session_id: p.session_id.clone(),
            user: p
                .decision
                .as_ref()
                .and_then(|d| d["by"].as_str())
                .map(str::to_owned),
            policy: p.policy.clone(),
            subject: p.name.clone(),
            outcome: phase.as_str().to_ascii_lowercase(),
            detail: json!({"proposalId": p.id, "action": p.action, "target": p.target, "message": message, "undo": undo}),
            ..Default::default()
        })
        .await;
}

/// Tells the proposing session (if any) that `p` is now in `phase` (`proposal.updated`).
pub async fn tell_session(
    engine: &Engine,
    p: &ProposalRecord,
    phase: ProposalPhase,
    message: &str,
) {
    if let Some(session) = &p.session_id {
        let _ = engine
            .emit_session(
                session,
                event::UPDATED,
                json!({"proposalId": p.id, "name": p.name, "phase": phase, "message": message}),
            )
            .await;
    }
}

/// Why an undo was not proposed.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    /// The proposal cannot be undone, and why (for the caller).
    #[error("{0}")]
    Refused(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Asks for the inverse of an executed proposal (standalone mode; in a cluster,
/// `kubectl kortex undo` asks the leader): a new `Pending` proposal named `undo-NAME`,
/// pinned and previewed like any other, that people decide as usual. One per proposal:
/// asking again returns the first (`false`: not created now).
// Long because each refusal (not executed, no inverse, asked already) says why in its own
// words before the inverse is pinned, previewed and stored like any proposal.
pub async fn undo(
    engine: &Engine,
    p: &ProposalRecord,
    requester: &str,
) -> Result<(ProposalRecord, bool), UndoError> {
    if p.phase != ProposalPhase::Succeeded.as_str() {
        return Err(UndoError::Refused(format!(
            "{} is {}: only an executed proposal can be undone",
            p.name, p.phase
        )));
    }
    let Some(inverse) = &p.undo else {
        return Err(UndoError::Refused(format!(
            "{} has nothing to undo: Kortex records no inverse of {}",
            p.name, p.action
        )));
    };
    let name = format!("undo-{}", p.name);
    if let Some(first) = engine
        .store
        .get_proposal_by_name(&p.namespace, &name)
        .await?
    {
        return Ok((first, false));
    }
    let config = engine.config.borrow().clone();
    let policy = p
        .policy
        .as_deref()
        .and_then(|q| config.catalog.policy_named(q))
        .ok_or_else(|| {
            UndoError::Refused(format!(
                "the ChatPolicy {} that governed {} no longer exists",
                p.policy.as_deref().unwrap_or("-"),
                p.name
            ))
        })?;
    let mut spec = crate::crd::ActionProposalSpec {
        action: inverse["action"].as_str().unwrap_or_default().to_owned(),
        target: serde_json::from_value(inverse["target"].clone()).ok(),
        params: inverse.get("params").cloned(),
        rationale: format!(
            "Undo of {} ({}), requested by {requester}.",
            p.name, p.action
        ),
        blast_radius: p.blast_radius.clone(),
        reversible: Some(true),
        session: crate::crd::ProposalSession {
            id: p.session_id.clone().unwrap_or_default(),
            name: p.session_name.clone(),
            user: requester.to_owned(),
        },
        model: None,
        delivery: None,
        decision: None,
    };
    let mut preview = None;
    if let Some(executor) = engine.executor.get() {
        let planned = crate::proposals::pin(executor, Some(policy), &mut spec)
            .await
            .map_err(UndoError::Refused)?;
        preview = Some(match planned {
            Some(p) => p,
            None => crate::proposals::preview(executor, &spec).await,
        });
    }
    let now = crate::store::now_ms();
    let expire =
        std::time::Duration::from(policy.object.spec.proposals.expire_after).as_millis() as i64;
    let record = ProposalRecord {
        id: crate::store::new_id(),
        name,
        namespace: p.namespace.clone(),
        session_id: p.session_id.clone(),
        session_name: p.session_name.clone(),
        user: requester.to_owned(),
        policy: p.policy.clone(),
        action: spec.action.clone(),
        target: inverse.get("target").cloned(),
        params: spec.params.clone(),
        rationale: spec.rationale.clone(),
        blast_radius: spec.blast_radius.clone(),
        reversible: Some(true),
        provider: None,
        model: None,
        phase: ProposalPhase::Pending,
        decision: None,
        message: None,
        preview,
        undo: None,
        git: None,
        expires_at: now + expire,
        created_at: now,
        updated_at: now,
        version: 1,
    };
    if let Err(e) = engine.store.insert_proposal(&record).await {
        // Asked twice at once: the other request stored it first.
        return match engine
            .store
            .get_proposal_by_name(&p.namespace, &record.name)
            .await?
        {
            Some(first) => Ok((first, false)),
            None => Err(e.into()),
        };
    }
    let _ = engine
        .store
        .record_decision(&NewDecision {
            kind: "proposal".into(),
            namespace: Some(record.namespace.clone()),
            session_id: record.session_id.clone(),
            user: Some(requester.to_owned()),
            policy: record.policy.clone(),
            subject: record.name.clone(),
            outcome: "created".into(),
            detail: json!({"proposalId": record.id, "action": record.action, "target": record.target, "via": "undo", "undoes": p.id}),
            ..Default::default()
        })
        .await;
    if let Some(session) = &record.session_id {
        let _ = engine
            .emit_session(
                session,
                event::CREATED,
                json!({"proposalId": record.id, "name": record.name, "action": record.action, "target": record.target}),
            )
            .await;
    }
    Ok((record, true))
}

/// Marks every undecided proposal past its `expiresAt` as `Expired`, and every execution
/// that outlived its time limit (its process stopped) as `Failed`, and tells their sessions.
pub async fn expire(engine: &Engine) -> Result<usize, crate::store::StoreError> {
    let now = crate::store::now_ms();
    let mut n = 0;
    let expired = engine.store.expired_pending_proposals(now, 1000).await?;
    // An execution runs within EXECUTION_TIMEOUT; one still `Executing` well after that was
    // stopped with its process.
    let interrupted_before = now
        - (crate::proposals::EXECUTION_TIMEOUT.as_millis() as i64
            + crate::proposals::EXECUTION_GRACE.as_millis() as i64);
    let interrupted = engine
        .store
        .executing_since_before(interrupted_before, 1000)
        .await?;
    let endings = expired
        .into_iter()
        .map(|p| (p, ProposalPhase::Expired, "not decided before it expired"))
        .chain(interrupted.into_iter().map(|p| {
            (
                p,
                ProposalPhase::Failed,
                "interrupted: Kortex stopped while executing it, so whether it took effect is unknown; check the target before proposing it again",
            )
        }));
    for (p, phase, message) in endings {
        let interrupted = p.phase == ProposalPhase::Executing;
        if engine
            .store
            .update_proposal_phase(&p.id, p.version, phase, Some(message), None, None)
            .await
            .is_ok()
        {
            n += 1;
            if interrupted {
                audit_execution(engine, &p, phase, message, None).await;
            }
            tell_session(engine, &p, phase, message).await;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A pin is Kortex's own reading of the target: one the model wrote could let a later
    // execution skip the check that the target is still as approved.
    #[test]
    fn the_models_pins_are_dropped() {
        assert_eq!(
            crate::proposals::unpinned(
                json!({"replicas": 4, "expectGeneration": 99, "expectReplicas": 1})
            ),
            json!({"replicas": 4})
        );
        assert_eq!(
            crate::proposals::unpinned(json!({"toRevision": 3})),
            json!({"toRevision": 3})
        );
    }
}
