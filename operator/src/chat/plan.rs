//! The plan gate (ChatPolicy `runControl.planning`): before its first tool call the model
//! states a plan with `submit_plan` (`steps: [{id, tool, purpose}]`). With `preview` the
//! plan is shown and the run goes on; with `required` the run waits in `awaiting_plan` for a
//! person to approve it (perhaps with steps removed or reordered) or reject it, and after
//! approval only the tools of the approved steps run.

use crate::crd::Planning;
use crate::llm::ToolSpec;
use crate::store::PlanRecord;
use serde_json::{Value, json};

/// The tool's name.
pub const TOOL: &str = "submit_plan";
/// The event a stated plan is shown by: `{runId, planId, mode, steps}`.
pub const EVENT: &str = "plan.proposal";
/// Tools a plan need not name: they read what the plan's tools returned, or the guides.
const ALWAYS: &[&str] = &[
    TOOL,
    "read_result_chunk",
    crate::tools::guides::LIST,
    crate::tools::guides::GET,
];

/// The tool as offered when the policy plans.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.into(),
        description: "State your investigation plan before you call any other tool: the steps, each with the tool it uses and why. \
            A person may review it; once approved, only the tools of its steps can run (submit a new plan to change course)."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {"steps": {"type": "array", "minItems": 1, "maxItems": 20, "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 40},
                    "tool": {"type": "string", "minLength": 1, "maxLength": 100},
                    "purpose": {"type": "string", "minLength": 1, "maxLength": 500}
                },
                "required": ["id", "tool", "purpose"],
                "additionalProperties": false
            }}},
            "required": ["steps"],
            "additionalProperties": false
        }),
    }
}

/// `submit_plan` behind the router: offered while the session's policy plans, it records
/// the plan (if valid) and shows it; under `planning: required` it holds the run for a
/// person's decision, in preview mode the model is told to go ahead.
pub struct SubmitPlan(pub(super) std::sync::Weak<super::Engine>);

/// The policy's `runControl.planning`.
pub fn planning(policy: &crate::catalog::PolicyEntry) -> Planning {
    policy
        .object
        .spec
        .run_control
        .as_ref()
        .map(|r| r.planning)
        .unwrap_or_default()
}

impl crate::tools::Tool for SubmitPlan {
    fn spec(&self) -> ToolSpec {
        spec()
    }

    /// Part of the policy's run control: its `tools` allow/deny do not remove it.
    fn offer(&self, policy: &crate::catalog::PolicyEntry) -> crate::tools::Offer {
        match planning(policy) {
            Planning::Off => crate::tools::Offer::Never,
            _ => crate::tools::Offer::As(spec()),
        }
    }

    fn effect(&self) -> crate::tools::Effect {
        crate::tools::Effect::Waits
    }

    fn call(&self, ctx: crate::tools::ToolContext, input: Value) -> crate::tools::ToolFuture {
        use crate::tools::ToolError;
        let engine = self.0.upgrade();
        Box::pin(async move {
            let engine = engine.ok_or(ToolError::Internal("the chat engine is gone".into()))?;
            let policy = ctx.scope.policy.as_ref();
            let required = policy.map(planning) == Some(Planning::Required);
            let steps = self::steps(&input, &ctx.scope.offered)
                .map_err(|why| ToolError::Invalid(format!("invalid plan: {why}")))?;
            let status = if required { "proposed" } else { "noted" };
            let stored = engine
                .store
                .add_plan(&ctx.run_id, &ctx.session.id, &ctx.call_id, &steps, status)
                .await;
            let id =
                stored.map_err(|e| ToolError::Internal(format!("cannot keep the plan: {e}")))?;
            if required {
                // Its result is the person's decision. The plan is shown once the run is
                // parked for it (`chat/run.rs`), so whoever sees it can decide it at once.
                ctx.hold();
                return Ok(format!("Plan {id} is waiting for a person's decision."));
            }
            let preview = shown(&ctx.run_id, &id, "preview", &steps);
            engine
                .emit(&ctx.session.id, &ctx.run_id, EVENT, preview)
                .await
                .map_err(|e| ToolError::Internal(format!("cannot show the plan: {e}")))?;
            Ok(format!("Plan {id} noted and shown to the user; go ahead."))
        })
    }
}

/// The event that shows a plan: `{runId, planId, mode, steps}`.
pub fn shown(run_id: &str, plan_id: &str, mode: &str, steps: &Value) -> Value {
    json!({"runId": run_id, "planId": plan_id, "mode": mode, "steps": steps})
}

/// The steps of a `submit_plan` call, checked: each names a tool the session may call, ids
/// are unique. `Err` is the tool's error result for the model.
pub fn steps(input: &Value, offered: &[String]) -> Result<Value, String> {
    let steps = input["steps"]
        .as_array()
        .filter(|s| !s.is_empty() && s.len() <= 20)
        .ok_or("steps must be a list of 1 to 20 {id, tool, purpose}")?;
    let mut ids = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let field = |k: &str| {
            step[k]
                .as_str()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .ok_or(format!("steps[{i}].{k} is required"))
        };
        let (id, tool, _) = (field("id")?, field("tool")?, field("purpose")?);
        if ids.contains(&id) {
            return Err(format!("step id {id} is used twice"));
        }
        ids.push(id);
        if !offered.iter().any(|t| t == tool) || tool == TOOL {
            return Err(format!(
                "steps[{i}].tool {tool} is not a tool you may call; yours: {}",
                offered
                    .iter()
                    .filter(|t| *t != TOOL)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(Value::Array(steps.clone()))
}

/// The approved steps after a person's edits: `keep` lists step ids, in the order wanted
/// (`None`: all, as stated). `Err` names an id the plan did not have.
pub fn edit(steps: &Value, keep: Option<&[String]>) -> Result<Value, String> {
    let all = steps.as_array().cloned().unwrap_or_default();
    let Some(keep) = keep else {
        return Ok(Value::Array(all));
    };
    let mut out = Vec::new();
    for id in keep {
        let step = all
            .iter()
            .find(|s| s["id"].as_str() == Some(id.as_str()))
            .ok_or_else(|| {
                let ids: Vec<&str> = all.iter().filter_map(|s| s["id"].as_str()).collect();
                format!(
                    "step {id} is not in the plan (its steps: {})",
                    ids.join(", ")
                )
            })?;
        if !out.contains(step) {
            out.push(step.clone());
        }
    }
    if out.is_empty() {
        return Err("an approved plan keeps at least one step; reject it instead".to_owned());
    }
    Ok(Value::Array(out))
}

/// Why the plan gate refuses `tool` now (an error result naming the plan), if it does.
pub fn refuses(planning: Planning, plan: Option<&PlanRecord>, tool: &str) -> Option<String> {
    if planning == Planning::Off || ALWAYS.contains(&tool) {
        return None;
    }
    let Some(plan) = plan.filter(|p| matches!(p.status.as_str(), "approved" | "noted")) else {
        return Some(format!(
            "state your plan with {TOOL} before calling {tool} (the ChatPolicy's runControl.planning)"
        ));
    };
    if planning == Planning::Preview {
        return None;
    }
    let approved = plan.approved_steps.as_ref().unwrap_or(&plan.steps);
    let tools: Vec<&str> = approved
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["tool"].as_str())
        .collect();
    if tools.contains(&tool) {
        return None;
    }
    Some(format!(
        "{tool} is not in the approved plan {} (its tools: {}); submit a new plan with {TOOL} to use it",
        plan.id,
        tools.join(", ")
    ))
}

/// What the transcript says of a decided plan (the `submit_plan` call's result).
pub fn approved_text(by: &str, steps: &Value) -> String {
    let lines: Vec<String> = steps
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{}. {} ({})",
                s["id"].as_str().unwrap_or_default(),
                s["purpose"].as_str().unwrap_or_default(),
                s["tool"].as_str().unwrap_or_default()
            )
        })
        .collect();
    format!(
        "Plan approved by {by}. Follow these steps; only their tools can run:\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(status: &str, approved: Option<Value>) -> PlanRecord {
        PlanRecord {
            id: "p1".into(),
            run_id: "r".into(),
            call_id: "c".into(),
            steps: json!([{"id": "1", "tool": "get_logs", "purpose": "errors"},
                          {"id": "2", "tool": "get_events", "purpose": "restarts"}]),
            status: status.into(),
            approved_steps: approved,
        }
    }

    #[test]
    fn steps_name_tools_the_session_may_call_once_each() {
        let offered = vec![
            "get_logs".to_owned(),
            "get_events".to_owned(),
            TOOL.to_owned(),
        ];
        let ok = json!({"steps": [{"id": "1", "tool": "get_logs", "purpose": "p"}]});
        assert!(steps(&ok, &offered).is_ok());
        for (bad, why) in [
            (json!({"steps": []}), "1 to 20"),
            (
                json!({"steps": [{"id": "1", "tool": "rm_rf", "purpose": "p"}]}),
                "not a tool you may call",
            ),
            (
                json!({"steps": [{"id": "1", "tool": TOOL, "purpose": "p"}]}),
                "not a tool you may call",
            ),
            (
                json!({"steps": [{"id": "1", "tool": "get_logs", "purpose": "p"}, {"id": "1", "tool": "get_events", "purpose": "q"}]}),
                "used twice",
            ),
            (
                json!({"steps": [{"id": "1", "tool": "get_logs"}]}),
                "purpose is required",
            ),
        ] {
            let e = steps(&bad, &offered).err().unwrap_or_default();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn edits_keep_and_reorder_known_steps_only() {
        let p = plan("proposed", None);
        let kept = edit(&p.steps, Some(&["2".to_owned(), "1".to_owned()])).unwrap_or_default();
        assert_eq!(kept[0]["id"], "2");
        assert_eq!(kept[1]["id"], "1");
        assert_eq!(edit(&p.steps, None).ok(), Some(p.steps.clone()));
        let e = edit(&p.steps, Some(&["9".to_owned()]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("step 9 is not in the plan (its steps: 1, 2)"),
            "{e}"
        );
        assert!(edit(&p.steps, Some(&[])).is_err());
    }

    #[test]
    fn the_gate_lets_through_only_what_the_plan_allows() {
        use Planning::*;
        assert_eq!(refuses(Off, None, "get_logs"), None);
        assert!(refuses(Required, None, "get_logs").is_some_and(|m| m.contains("submit_plan")));
        assert_eq!(refuses(Required, None, "read_result_chunk"), None);
        assert!(refuses(Required, Some(&plan("proposed", None)), "get_logs").is_some());
        assert_eq!(
            refuses(Preview, Some(&plan("noted", None)), "get_metrics"),
            None
        );
        let approved = plan(
            "approved",
            Some(json!([{"id": "2", "tool": "get_events", "purpose": "p"}])),
        );
        assert_eq!(refuses(Required, Some(&approved), "get_events"), None);
        let why = refuses(Required, Some(&approved), "get_logs").unwrap_or_default();
        assert!(
            why.contains("not in the approved plan p1 (its tools: get_events)"),
            "{why}"
        );
    }
}
