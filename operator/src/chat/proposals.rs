//! `propose_action`: the model's one "write" tool. It executes nothing. In standalone mode
//! it stores a proposal that a human decides through the API under the policy's trust
//! rules; in cluster mode it also creates the `ActionProposal` object (with its dry-run
//! preview) that people approve with `kubectl kortex approve`, and the database keeps a
//! mirror for incident history.

use super::Engine;
use crate::catalog::PolicyEntry;
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
        parameters: json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": rules.allowed_actions},
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
        }),
    })
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
        target: Some(target.clone()),
        params: input.get("params").filter(|p| p.is_object()).cloned(),
        rationale: rationale.to_owned(),
        blast_radius: str_field(input, "blastRadius").map(str::to_owned),
        reversible: input.get("reversible").and_then(Value::as_bool),
        provider: Some(model.0.to_owned()),
        model: Some(model.1.to_owned()),
        phase: "Pending".into(),
        decision: None,
        message: None,
        preview: None,
        undo: None,
        expires_at: now + expire,
        created_at: now,
        updated_at: now,
        version: 1,
    };
    let mut record = record;
    if let Some(cluster) = engine.cluster.get() {
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
            decision: None,
        };
        let expires_at = jiff::Timestamp::from_millisecond(record.expires_at)
            .map_err(|e| format!("invalid expiry: {e}"))?;
        let base = base.to_ascii_lowercase();
        let (name, preview, params) = cluster
            .create(
                &record.id,
                base.trim_end_matches('-'),
                &record.namespace,
                spec,
                &policy.object.spec,
                expires_at,
            )
            .await?;
        record.name = name;
        record.preview = Some(preview);
        // With the target's state pinned by the operator.
        record.params = params;
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
    if engine.cluster.get().is_some() {
        out["approveWith"] = json!(format!(
            "kubectl kortex approve {} -n {}",
            record.name, record.namespace
        ));
        out["preview"] = record.preview.clone().unwrap_or(Value::Null);
    }
    Ok(out)
}

/// Marks every undecided proposal past its `expiresAt` as `Expired` and tells its session.
pub async fn expire(engine: &Engine) -> Result<usize, crate::store::StoreError> {
    let now = crate::store::now_ms();
    let mut n = 0;
    for p in engine.store.expired_pending_proposals(now, 1000).await? {
        let message = "not decided before it expired";
        if engine
            .store
            .update_proposal_phase(&p.id, p.version, "Expired", Some(message), None, None)
            .await
            .is_ok()
        {
            n += 1;
            if let Some(session) = &p.session_id {
                let _ = engine
                    .emit_session(
                        session,
                        event::UPDATED,
                        json!({"proposalId": p.id, "phase": "Expired", "message": message}),
                    )
                    .await;
            }
        }
    }
    Ok(n)
}
