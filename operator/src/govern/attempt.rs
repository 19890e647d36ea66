//! One provider attempt's books, kept the same way by everything that calls a provider (a
//! chat run's step, its side jobs, the gateway): the worst case reserved before the call,
//! the usage settled with the call's `llm_call` audit row after it, and — when the attempt
//! gives way to the next route — the failover counted and recorded.

use super::budget::Exceeded;
use super::{Governor, Outcome, Reservation, Scope};
use crate::llm::{ChatRequest, LlmError, LlmProvider};
use crate::store::{NewDecision, StoreError};
use serde_json::{Value, json};

/// One attempt: who pays for it, which provider and model it asks, and the audit rows'
/// common fields (namespace, user, policy, session and run; `detail` fields every row of
/// it carries, such as the gateway's `source`).
pub struct Attempt<'a> {
    /// Whose budgets it draws on.
    pub scope: &'a Scope,
    /// The provider's name.
    pub provider: &'a str,
    /// The model asked for.
    pub model: &'a str,
    /// The audit rows' common part; kind, subject and outcome are filled in here.
    pub audit: NewDecision,
}

impl Attempt<'_> {
    /// The attempt's `llm_call` audit row: `detail` joins the common fields.
    pub fn llm_call(&self, outcome: &Outcome, detail: Value) -> NewDecision {
        llm_call(&self.audit, (self.provider, self.model), outcome, detail)
    }
}

/// The `llm_call` audit row of a call to `(provider, model)` that ended with `outcome`
/// (naming the model that answered): `audit`'s common fields, `detail` joined to its own.
/// For an attempt settled after its stream ends, when the [`Attempt`] is gone.
pub fn llm_call(
    audit: &NewDecision,
    (provider, model): (&str, &str),
    outcome: &Outcome,
    detail: Value,
) -> NewDecision {
    let served = if outcome.model.is_empty() {
        model
    } else {
        &outcome.model
    };
    NewDecision {
        kind: "llm_call".into(),
        subject: format!("{provider}/{served}"),
        outcome: outcome.outcome.clone(),
        detail: joined(&audit.detail, detail),
        ..audit.clone()
    }
}

/// `extra`'s fields after `common`'s.
fn joined(common: &Value, extra: Value) -> Value {
    let mut out = common.as_object().cloned().unwrap_or_default();
    if let Value::Object(extra) = extra {
        out.extend(extra);
    }
    Value::Object(out)
}

impl Governor {
    /// Reserves the worst case of `request` for `attempt` at the price its provider
    /// declares for the model; `admit` also counts the request (its first attempt, from
    /// the gateway) in the same transaction.
    pub async fn reserve_for(
        &self,
        attempt: &Attempt<'_>,
        adapter: &dyn LlmProvider,
        request: &ChatRequest,
        max_output: u32,
        admit: bool,
    ) -> Result<Result<Reservation, Exceeded>, StoreError> {
        let cost = adapter
            .models()
            .iter()
            .find(|m| m.id == attempt.model)
            .and_then(|m| m.cost);
        self.reserve_inner(
            attempt.scope,
            (attempt.provider, attempt.model),
            cost.as_ref(),
            (request, max_output),
            admit,
        )
        .await
    }

    /// Settles `attempt` with its `llm_call` audit row, in one transaction; the budget
    /// alerts it crossed.
    pub async fn settle_attempt(
        &self,
        attempt: &Attempt<'_>,
        reservation: Reservation,
        outcome: &Outcome,
        detail: Value,
    ) -> Result<Vec<String>, StoreError> {
        let decision = attempt.llm_call(outcome, detail);
        self.settle_audited(reservation, outcome, Some(&decision))
            .await
    }

    /// `attempt` failed with `error` before answering and gives way to `next` (provider,
    /// model): the failover is counted and its audit row written (`why`: the error as it
    /// may be shown, redacted).
    pub async fn fail_over(
        &self,
        attempt: &Attempt<'_>,
        next: (&str, &str),
        error: &LlmError,
        why: &str,
    ) -> Result<(), StoreError> {
        self.failover(attempt.provider, attempt.model);
        let detail = json!({"from": attempt.provider, "to": next.0, "error": why,
            "status": error.status});
        self.store
            .record_decision(&NewDecision {
                kind: "failover".into(),
                subject: format!(
                    "{}/{} -> {}/{}",
                    attempt.provider, attempt.model, next.0, next.1
                ),
                outcome: error.kind.as_str().into(),
                detail: joined(&attempt.audit.detail, detail),
                ..attempt.audit.clone()
            })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_rows_carry_its_common_fields_and_name_what_answered() {
        let scope = Scope {
            policy: "default/p".into(),
            user: "team-a".into(),
            session: None,
            source: "gateway",
            budget: None,
        };
        let attempt = Attempt {
            scope: &scope,
            provider: "claude",
            model: "m",
            audit: NewDecision {
                namespace: Some("default".into()),
                policy: Some("p".into()),
                detail: json!({"source": "gateway"}),
                ..Default::default()
            },
        };
        let asked = attempt.llm_call(
            &Outcome {
                outcome: "ok".into(),
                ..Default::default()
            },
            json!({"inputTokens": 3}),
        );
        assert_eq!(
            (asked.kind.as_str(), asked.subject.as_str()),
            ("llm_call", "claude/m")
        );
        assert_eq!(asked.detail, json!({"source": "gateway", "inputTokens": 3}));
        assert_eq!(asked.policy.as_deref(), Some("p"));
        let served = attempt.llm_call(
            &Outcome {
                model: "m-2025".into(),
                outcome: "timeout".into(),
                ..Default::default()
            },
            Value::Null,
        );
        assert_eq!(
            (served.subject.as_str(), served.outcome.as_str()),
            ("claude/m-2025", "timeout")
        );
    }
}
