//! Which providers and models a policy's call may use, in failover order (SPEC §1.2, §3
//! Roles and Modes). A pure function of the catalog: the chat engine, the gateway and
//! `GET /api/v1/policies` all ask it.

use crate::catalog::{Catalog, ObjectKey, PolicyEntry};
use crate::crd::conditions::{self, types};
use crate::crd::{Locality, PolicyMode};
use serde::Serialize;

/// What a call is for (SPEC §3 Roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Answers the chat.
    Default,
    /// Writes session titles and incident summaries.
    Summarize,
    /// Classifies (whether a question needs tools).
    Triage,
}

impl Role {
    /// Stable lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Summarize => "summarize",
            Self::Triage => "triage",
        }
    }
}

/// One provider and model to try.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// `LLMProvider` name.
    pub provider: String,
    /// The full model.
    pub model: String,
    /// `frugal`: the provider's `fastModel`, tried first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_model: Option<String>,
    /// `local` or `cloud`.
    pub locality: &'static str,
}

/// A provider the policy names but that cannot be used now, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    /// `LLMProvider` name.
    pub provider: String,
    /// Why.
    pub reason: String,
}

/// The routes of one call, in order, and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Try these in order: the first, then each fallback on a hard failure.
    pub routes: Vec<Route>,
    /// Named providers that cannot be used now.
    pub skipped: Vec<Skipped>,
}

impl Plan {
    /// Why no provider can answer, for users (only meaningful when `routes` is empty).
    pub fn unavailable(&self, policy: &str) -> String {
        let reasons: Vec<String> = self
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.provider, s.reason))
            .collect();
        format!(
            "no provider of ChatPolicy {policy} can answer now ({})",
            reasons.join("; ")
        )
    }
}

/// The routes of a `role` call under `policy` (in `namespace`): the role's pinned provider
/// (`provider/model`) or the policy's `provider`, then `fallbackProviders`, each once;
/// providers that are missing, unavailable, without a model or (for `local-only`) not
/// local are skipped with a reason. No provider the policy does not name is ever included.
pub fn plan(catalog: &Catalog, namespace: &str, policy: &PolicyEntry, role: Role) -> Plan {
    let spec = &policy.object.spec;
    let role_model = match role {
        Role::Default => spec.models.default.as_deref(),
        Role::Summarize => spec.models.summarize.as_deref(),
        Role::Triage => spec.models.triage.as_deref(),
    };
    // A role written provider/model pins that provider (when it is one of this namespace;
    // a model id may itself contain '/').
    let (pinned, role_model) = match role_model.and_then(|m| m.split_once('/')) {
        Some((p, m)) if catalog.provider(namespace, p).is_some() => (Some(p), Some(m)),
        _ => (None, role_model),
    };
    let mut order: Vec<&str> = Vec::new();
    for name in pinned
        .into_iter()
        .chain(std::iter::once(spec.provider.as_str()))
        .chain(spec.fallback_providers.iter().map(String::as_str))
    {
        if !order.contains(&name) {
            order.push(name);
        }
    }
    let mut plan = Plan::default();
    for (i, name) in order.into_iter().enumerate() {
        let skip = |reason: String| Skipped {
            provider: name.to_owned(),
            reason,
        };
        let Some(entry) = catalog.providers.get(&ObjectKey::new(namespace, name)) else {
            plan.skipped.push(skip(format!(
                "LLMProvider not found in namespace {namespace}"
            )));
            continue;
        };
        let locality = entry.locality();
        if spec.mode == PolicyMode::LocalOnly && locality != Locality::Local {
            plan.skipped.push(skip(
                "locality cloud; the policy's mode is local-only".into(),
            ));
            continue;
        }
        if !entry.available {
            let why = entry
                .object
                .status
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, types::READY))
                .map(|c| c.message.clone())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "not ready".into());
            let why = if why.starts_with("unavailable") {
                why
            } else {
                format!("unavailable: {why}")
            };
            plan.skipped.push(skip(why));
            continue;
        }
        let fast = entry.object.spec.fast_model.clone();
        // The role's model belongs to the first provider (the pinned one, else the policy's
        // `provider`); a fallback answers with its own models.
        let model = match (i, role_model, role) {
            (0, Some(m), _) => Some(m.to_owned()),
            // Summaries and triage are small jobs: the fast model when there is one.
            (_, _, Role::Summarize | Role::Triage) => fast
                .clone()
                .or_else(|| entry.default_model().map(str::to_owned)),
            _ => entry.default_model().map(str::to_owned),
        };
        let Some(model) = model else {
            plan.skipped.push(skip(
                "no model: set spec.defaultModel or spec.models on the LLMProvider".into(),
            ));
            continue;
        };
        let fast_model = match (spec.mode, role) {
            (PolicyMode::Frugal, Role::Default) => fast.filter(|f| *f != model),
            _ => None,
        };
        plan.routes.push(Route {
            provider: name.to_owned(),
            model,
            fast_model,
            locality: match locality {
                Locality::Local => "local",
                Locality::Cloud => "cloud",
            },
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ObjectSet, compile};
    use serde_json::json;

    fn catalog(policy: serde_json::Value) -> Catalog {
        let provider = |name: &str, spec: serde_json::Value| {
            serde_json::from_value(json!({
                "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
                "metadata": {"name": name, "namespace": "ops"}, "spec": spec
            }))
            .unwrap()
        };
        let set = ObjectSet {
            providers: vec![
                provider(
                    "claude",
                    json!({"type": "anthropic", "defaultModel": "opus", "fastModel": "haiku",
                           "apiKeySecretRef": {"name": "keys", "key": "a"}}),
                ),
                provider(
                    "gpt",
                    json!({"type": "openai", "defaultModel": "gpt-5", "fastModel": "gpt-5-mini",
                           "apiKeySecretRef": {"name": "keys", "key": "missing"}}),
                ),
                provider("llama", json!({"type": "ollama", "defaultModel": "qwen3", "fastModel": "qwen3:4b"})),
                provider("vllm", json!({"type": "openai-compatible", "baseUrl": "http://vllm:8000/v1", "locality": "local"})),
            ],
            policies: vec![
                serde_json::from_value(json!({
                    "apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
                    "metadata": {"name": "p", "namespace": "ops"}, "spec": policy
                }))
                .unwrap(),
            ],
            secrets: vec![
                serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "keys", "namespace": "ops", "labels": {"kortex.dev/use": "true"}}, "stringData": {"a": "sk-a-123456"}
                }))
                .unwrap(),
            ],
            ..Default::default()
        };
        compile(&set, jiff::Timestamp::UNIX_EPOCH)
    }

    type Row = (String, String, Option<String>);

    fn plan_of(policy: serde_json::Value, role: Role) -> (Vec<Row>, Vec<String>) {
        let cat = catalog(policy);
        let p = &cat.policies[&ObjectKey::new("ops", "p")];
        let plan = plan(&cat, "ops", p, role);
        (
            plan.routes
                .into_iter()
                .map(|r| (r.provider, r.model, r.fast_model))
                .collect(),
            plan.skipped
                .into_iter()
                .map(|s| format!("{}: {}", s.provider, s.reason))
                .collect(),
        )
    }

    fn r(p: &str, m: &str, fast: Option<&str>) -> Row {
        (p.into(), m.into(), fast.map(Into::into))
    }

    #[test]
    fn normal_mode_uses_the_role_model_then_fallbacks_with_their_own_defaults() {
        let (routes, skipped) = plan_of(
            json!({"sessions": ["*"], "provider": "claude", "fallbackProviders": ["gpt", "llama", "claude"],
                   "models": {"default": "sonnet"}}),
            Role::Default,
        );
        assert_eq!(
            routes,
            vec![r("claude", "sonnet", None), r("llama", "qwen3", None)]
        );
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].starts_with("gpt: unavailable"), "{skipped:?}");
    }

    #[test]
    fn frugal_mode_tries_each_providers_fast_model_first() {
        let (routes, _) = plan_of(
            json!({"sessions": ["*"], "provider": "claude", "fallbackProviders": ["llama", "vllm"], "mode": "frugal"}),
            Role::Default,
        );
        assert_eq!(
            routes,
            vec![
                r("claude", "opus", Some("haiku")),
                r("llama", "qwen3", Some("qwen3:4b"))
            ]
        );
    }

    #[test]
    fn local_only_never_routes_to_a_cloud_provider() {
        let (routes, skipped) = plan_of(
            json!({"sessions": ["*"], "provider": "claude", "fallbackProviders": ["llama"], "mode": "local-only"}),
            Role::Default,
        );
        assert_eq!(routes, vec![r("llama", "qwen3", None)]);
        assert_eq!(
            skipped,
            vec!["claude: locality cloud; the policy's mode is local-only"]
        );
    }

    #[test]
    fn roles_pin_providers_and_small_jobs_take_the_fast_model() {
        let (routes, _) = plan_of(
            json!({"sessions": ["*"], "provider": "claude", "fallbackProviders": ["llama"],
                   "models": {"summarize": "llama/qwen3:1b"}}),
            Role::Summarize,
        );
        assert_eq!(
            routes,
            vec![r("llama", "qwen3:1b", None), r("claude", "haiku", None)]
        );
        let (routes, _) = plan_of(
            json!({"sessions": ["*"], "provider": "claude"}),
            Role::Triage,
        );
        assert_eq!(routes, vec![r("claude", "haiku", None)]);
        let (routes, skipped) = plan_of(
            json!({"sessions": ["*"], "provider": "vllm"}),
            Role::Default,
        );
        assert!(routes.is_empty());
        assert_eq!(
            skipped,
            vec!["vllm: no model: set spec.defaultModel or spec.models on the LLMProvider"]
        );
    }
}
