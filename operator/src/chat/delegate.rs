//! Runs whose provider keeps its own tool loop (`claude-code`): the provider's process calls
//! Kortex's tools through this replica's `/mcp` with a credential made for the run, and each
//! call is handed to the run that made the credential, which carries it out as any other
//! call of the run — stored in order in the transcript, announced (`tool.start`,
//! `tool.end`), executed through [`super::tool_calls`] with the run's policy, identity and
//! redaction, and audited. The credential is random, kept in memory only, and gone when
//! the provider call ends.

use crate::llm::{ToolCall, ToolSpec};
use crate::tools::Outcome;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// One call the provider's process made, waiting for the run to carry it out.
pub struct DelegatedCall {
    /// The call (the run gives it its own id).
    pub call: ToolCall,
    /// Where the outcome goes.
    pub reply: oneshot::Sender<Outcome>,
}

/// What a run's credential grants.
pub struct Delegation {
    /// The chat session.
    pub session_id: String,
    /// The run.
    pub run_id: String,
    /// The session's user (the MCP caller it stands for).
    pub user: String,
    /// `NAMESPACE/NAME` of the run's policy.
    pub policy: String,
    /// The session's name (to select the policy as the run did).
    pub session_name: String,
    /// The tools the run offers at this step.
    pub tools: Vec<ToolSpec>,
    /// To the run.
    pub calls: mpsc::Sender<DelegatedCall>,
}

/// The credentials of the runs in flight at this replica.
#[derive(Default)]
pub struct Delegations {
    by_token: std::sync::Mutex<std::collections::HashMap<String, Arc<Delegation>>>,
}

/// A credential; dropping it revokes it.
pub struct Grant {
    delegations: Arc<Delegations>,
    token: String,
}

impl Grant {
    /// The bearer token.
    pub fn token(&self) -> crate::catalog::SecretValue {
        crate::catalog::SecretValue::new(self.token.as_str())
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.delegations
            .by_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.token);
    }
}

impl Delegations {
    /// A new credential for `delegation`.
    pub fn grant(self: &Arc<Self>, delegation: Delegation) -> Grant {
        let token = format!(
            "kortex-run-{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.by_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), Arc::new(delegation));
        Grant {
            delegations: self.clone(),
            token,
        }
    }

    /// What `token` grants, while its run's provider call lasts.
    pub fn get(&self, token: &str) -> Option<Arc<Delegation>> {
        self.by_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_lasts_as_long_as_its_grant() {
        let d = Arc::new(Delegations::default());
        let (tx, _rx) = mpsc::channel(1);
        let grant = d.grant(Delegation {
            session_id: "s".into(),
            run_id: "r".into(),
            user: "alice".into(),
            policy: "default/ops".into(),
            session_name: "ops".into(),
            tools: vec![],
            calls: tx,
        });
        let token = grant.token();
        assert!(token.expose().len() > 64);
        assert_eq!(
            d.get(token.expose()).map(|g| g.user.clone()),
            Some("alice".into())
        );
        assert!(d.get("kortex-run-guess").is_none());
        drop(grant);
        assert!(d.get(token.expose()).is_none());
    }
}
