//! Whether a policy's providers can answer now, from their last probes, and what to do
//! when none can (`docs/troubleshooting.md#no-provider-reachable`). The chat engine, the
//! start-up summary, the dashboard's banner and `kortex providers check` all say it the
//! same way: each provider, why it was skipped, and the shortest fix — never the transport
//! error, which stays in the audit row and the log.

use super::route::{Plan, Skipped};
use crate::catalog::{Catalog, ObjectKey};
use crate::crd::ProviderType;
use crate::llm::probe::{ProbeResult, reasons};
use std::collections::BTreeMap;
use std::time::Duration;

/// Where the fix is explained.
pub const DOCS: &str = "docs/troubleshooting.md#no-provider-reachable";

/// A probe younger than this is trusted (twice the probe interval, at least 10 s): a route
/// it found unreachable is not tried; an older one is, as if never probed.
pub fn fresh_within(probe_interval: Duration) -> Duration {
    (probe_interval * 2).max(Duration::from_secs(10))
}

/// Whether a probe says the provider cannot answer: no answer at all, or its credential
/// refused.
fn cannot_answer(p: &ProbeResult) -> bool {
    !p.reachable
        || matches!(
            p.reason,
            reasons::AUTH_FAILED | reasons::CLAUDE_CODE_AUTH_FAILED
        )
}

/// The transport error in a few words.
fn in_short(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    if m.contains("connection refused") {
        "connection refused"
    } else if m.contains("timed out") || m.contains("timeout") {
        "timed out"
    } else if m.contains("dns") || m.contains("failed to lookup") || m.contains("resolve") {
        "the host name does not resolve"
    } else if m.contains("certificate") || m.contains("tls") {
        "TLS failed"
    } else {
        "no answer"
    }
}

fn age(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let secs = (now.as_millisecond() - then.as_millisecond()).max(0) / 1000;
    if secs < 120 {
        format!("{secs} s ago")
    } else {
        format!("{} min ago", secs / 60)
    }
}

/// Moves the routes whose fresh probe says they cannot answer into `skipped`. Returns the
/// probes' own messages of those moved (`provider: message`), for the audit row and logs.
pub fn drop_unreachable(
    plan: &mut Plan,
    catalog: &Catalog,
    namespace: &str,
    probes: &BTreeMap<ObjectKey, ProbeResult>,
    now: jiff::Timestamp,
    fresh: Duration,
) -> Vec<String> {
    let mut details = Vec::new();
    let mut kept = Vec::new();
    for route in std::mem::take(&mut plan.routes) {
        let key = ObjectKey::new(namespace, &route.provider);
        let probe = probes.get(&key).filter(|p| {
            cannot_answer(p)
                && (now.as_millisecond() - p.checked_at.as_millisecond())
                    <= fresh.as_millis() as i64
        });
        let Some(p) = probe else {
            kept.push(route);
            continue;
        };
        let url = catalog
            .providers
            .get(&key)
            .and_then(|e| e.base_url())
            .unwrap_or("its endpoint");
        let reason = if p.reachable {
            format!("its key was refused when probed {}", age(now, p.checked_at))
        } else if p.reason == reasons::CLAUDE_CODE_UNUSABLE {
            format!(
                "the claude CLI did not run when probed {}",
                age(now, p.checked_at)
            )
        } else {
            format!(
                "unreachable: no answer from {url} when probed {} ({})",
                age(now, p.checked_at),
                in_short(&p.message)
            )
        };
        details.push(format!("{}: {}", route.provider, p.message));
        plan.skipped.push(Skipped {
            provider: route.provider,
            reason,
        });
    }
    plan.routes = kept;
    details
}

/// The shortest fixes for the providers a plan skipped, as one sentence.
pub fn advice(catalog: &Catalog, namespace: &str, plan: &Plan) -> String {
    let mut fixes: Vec<String> = Vec::new();
    // The API keys to set, said once.
    let vars: Vec<&str> = plan
        .skipped
        .iter()
        .filter_map(|s| unset_var(&s.reason))
        .collect();
    if let Some(first) = vars.first() {
        fixes.push(format!(
            "set {} (export {first}=…) and restart Kortex",
            vars.join(" or ")
        ));
    }
    let mut push = |f: String| {
        if !fixes.contains(&f) {
            fixes.push(f);
        }
    };
    for s in &plan.skipped {
        let entry = catalog
            .providers
            .get(&ObjectKey::new(namespace, &s.provider));
        let kind = entry.map(|e| e.provider_type());
        let url = entry.and_then(|e| e.base_url()).unwrap_or("");
        if unset_var(&s.reason).is_some() {
            continue;
        } else if s.reason.contains("key was refused") {
            push(format!(
                "replace the API key of LLMProvider {} in the Secret its apiKeySecretRef names",
                s.provider
            ));
        } else if s.reason.starts_with("unreachable") {
            match kind {
                Some(ProviderType::Ollama) => {
                    let model = entry.and_then(|e| e.default_model()).unwrap_or("MODEL");
                    push(format!(
                        "start Ollama at {url} (`ollama serve`) and `ollama pull {model}`"
                    ));
                }
                Some(ProviderType::OpenAiCompatible) => push(format!(
                    "start the OpenAI-compatible server at {url}, or point spec.baseUrl of LLMProvider {} at one",
                    s.provider
                )),
                _ => push(format!(
                    "check that this machine reaches {url} (proxy, firewall, DNS)"
                )),
            }
        } else if s.reason.contains("claude CLI") {
            push(
                "install Claude Code (`npm install -g @anthropic-ai/claude-code`) and sign in"
                    .into(),
            );
        }
    }
    if fixes.is_empty() {
        fixes.push("point the policy at a provider that is available (see the Status page)".into());
    }
    format!("To get an answer: {}. See {DOCS}.", fixes.join("; or "))
}

/// The environment variable a Secret's `${VAR}` needed and did not find.
fn unset_var(reason: &str) -> Option<&str> {
    let var = reason
        .split("environment variable ")
        .nth(1)?
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()?;
    (!var.is_empty() && reason.contains("is not set")).then_some(var)
}

/// The message of a run that no provider of `policy` can answer: each provider, why it was
/// skipped, then the fix.
pub fn no_provider_message(
    catalog: &Catalog,
    namespace: &str,
    policy: &str,
    plan: &Plan,
) -> String {
    let why: Vec<String> = plan
        .skipped
        .iter()
        .map(|s| match unset_var(&s.reason) {
            Some(var) => format!("{}: no API key ({var} is not set)", s.provider),
            None => format!("{}: {}", s.provider, s.reason),
        })
        .collect();
    format!(
        "No provider of ChatPolicy {policy} can answer now — {}. {}",
        why.join("; "),
        advice(catalog, namespace, plan)
    )
}

/// One line per policy, once the first probes are in (at most 30 s after start): which
/// provider and model it answers with now, or — a warning — that none can, and the fix.
pub async fn announce(
    config: tokio::sync::watch::Receiver<std::sync::Arc<crate::live::LiveConfig>>,
    board: crate::llm::probe::ProbeBoard,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let catalog = config.borrow().catalog.clone();
        let probed = board.read().map(|b| b.clone()).unwrap_or_default();
        let waiting = catalog
            .providers
            .iter()
            .any(|(k, e)| e.available && !probed.contains_key(k));
        if !waiting || tokio::time::Instant::now() >= deadline {
            for line in summary(&catalog, &probed, jiff::Timestamp::now()) {
                match line {
                    Ok(l) => tracing::info!("{l}"),
                    Err(l) => tracing::warn!("{l}"),
                }
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The start-up lines: `Ok` for a policy that can answer, `Err` for one that cannot.
pub fn summary(
    catalog: &Catalog,
    probes: &BTreeMap<ObjectKey, ProbeResult>,
    now: jiff::Timestamp,
) -> Vec<Result<String, String>> {
    let mut out = Vec::new();
    for (key, policy) in &catalog.policies {
        let mut plan =
            super::route::plan(catalog, &key.namespace, policy, super::route::Role::Default);
        drop_unreachable(
            &mut plan,
            catalog,
            &key.namespace,
            probes,
            now,
            Duration::from_secs(3600),
        );
        let name = format!("{}/{}", key.namespace, key.name);
        match plan.routes.first() {
            Some(r) => {
                let then: Vec<&str> = plan.routes[1..]
                    .iter()
                    .map(|r| r.provider.as_str())
                    .collect();
                out.push(Ok(format!(
                    "ChatPolicy {name} answers with {}/{}{}",
                    r.provider,
                    r.model,
                    if then.is_empty() {
                        String::new()
                    } else {
                        format!(" (then {})", then.join(", "))
                    }
                )));
            }
            None => out.push(Err(no_provider_message(
                catalog,
                &key.namespace,
                &name,
                &plan,
            ))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ObjectSet, compile};
    use serde_json::json;

    /// The newcomer's machine: no keys, Ollama not running.
    fn newcomer() -> (Catalog, BTreeMap<ObjectKey, ProbeResult>, jiff::Timestamp) {
        let object = |kind: &str, name: &str, spec: serde_json::Value| json!({"apiVersion": "kortex.dev/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": "default"}, "spec": spec});
        let set = ObjectSet {
            providers: vec![
                serde_json::from_value(object("LLMProvider", "ollama", json!({"type": "ollama", "baseUrl": "http://127.0.0.1:11434", "defaultModel": "qwen3:4b"}))).unwrap(),
                serde_json::from_value(object("LLMProvider", "local", json!({"type": "openai-compatible", "baseUrl": "http://127.0.0.1:8000/v1", "defaultModel": "m"}))).unwrap(),
            ],
            policies: vec![serde_json::from_value(object("ChatPolicy", "default", json!({"sessions": ["*"], "provider": "ollama", "fallbackProviders": ["local"]}))).unwrap()],
            ..Default::default()
        };
        let now = jiff::Timestamp::now();
        let probe = |reachable: bool, age_s: i64| {
            ProbeResult {
            reachable,
            ok: reachable,
            reason: if reachable { reasons::REACHABLE } else { reasons::UNREACHABLE },
            message: "connection: error sending request for url (http://127.0.0.1:11434/api/tags): client error (Connect): tcp connect error: Connection refused (os error 111)".into(),
            models: Vec::new(),
            latency_ms: 1,
            checked_at: now.checked_sub(jiff::SignedDuration::from_secs(age_s)).unwrap_or(now),
        }
        };
        let probes = BTreeMap::from([
            (ObjectKey::new("default", "ollama"), probe(false, 5)),
            (ObjectKey::new("default", "local"), probe(false, 500)),
        ]);
        (compile(&set, now), probes, now)
    }

    #[test]
    fn a_fresh_unreachable_probe_drops_the_route_and_a_stale_one_keeps_it() {
        let (catalog, probes, now) = newcomer();
        let policy = catalog
            .match_policy("default", "s")
            .unwrap_or_else(|| panic!("no policy"));
        let mut plan = super::super::route::plan(
            &catalog,
            "default",
            policy,
            super::super::route::Role::Default,
        );
        let dropped = drop_unreachable(
            &mut plan,
            &catalog,
            "default",
            &probes,
            now,
            fresh_within(Duration::from_secs(60)),
        );
        assert_eq!(
            plan.routes
                .iter()
                .map(|r| r.provider.as_str())
                .collect::<Vec<_>>(),
            vec!["local"],
            "the 500 s old probe is stale"
        );
        assert_eq!(dropped.len(), 1);
        assert!(
            dropped[0].contains("os error 111"),
            "the transport error is kept for the log"
        );
        assert_eq!(
            plan.skipped[0].reason,
            "unreachable: no answer from http://127.0.0.1:11434 when probed 5 s ago (connection refused)"
        );
        drop_unreachable(
            &mut plan,
            &catalog,
            "default",
            &probes,
            now,
            Duration::from_secs(3600),
        );
        assert!(plan.routes.is_empty());
        let message = no_provider_message(&catalog, "default", "default", &plan);
        assert!(
            message.starts_with(
                "No provider of ChatPolicy default can answer now — ollama: unreachable"
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "start Ollama at http://127.0.0.1:11434 (`ollama serve`) and `ollama pull qwen3:4b`"
            ),
            "{message}"
        );
        assert!(
            message.contains("start the OpenAI-compatible server at http://127.0.0.1:8000/v1"),
            "{message}"
        );
        assert!(message.ends_with(&format!("See {DOCS}.")), "{message}");
        assert!(
            !message.contains("os error"),
            "no transport detail in the headline: {message}"
        );
    }

    #[test]
    fn unset_keys_are_named_once() {
        let plan = Plan {
            routes: Vec::new(),
            skipped: vec![
                Skipped { provider: "anthropic".into(), reason: "unavailable: secret llm-keys key anthropic: key not found in Secret llm-keys (environment variable ANTHROPIC_API_KEY is not set)".into() },
                Skipped { provider: "openai".into(), reason: "unavailable: secret llm-keys key openai: key not found in Secret llm-keys (environment variable OPENAI_API_KEY is not set)".into() },
            ],
        };
        let (catalog, _, _) = newcomer();
        let message = no_provider_message(&catalog, "default", "default", &plan);
        assert!(message.contains("anthropic: no API key (ANTHROPIC_API_KEY is not set); openai: no API key (OPENAI_API_KEY is not set)"), "{message}");
        assert!(message.contains("To get an answer: set ANTHROPIC_API_KEY or OPENAI_API_KEY (export ANTHROPIC_API_KEY=…) and restart Kortex."), "{message}");
    }
}
