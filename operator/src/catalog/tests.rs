use super::*;
use crate::crd::conditions::find;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn ts(secs: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(secs).unwrap_or_default()
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    match serde_json::from_value(v) {
        Ok(o) => o,
        Err(e) => panic!("test object does not parse: {e}"),
    }
}

fn provider(name: &str, spec: serde_json::Value) -> LLMProvider {
    obj(serde_json::json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": spec
    }))
}

fn tool(name: &str, created: i64, spec: serde_json::Value) -> KortexTool {
    let mut t: KortexTool = obj(serde_json::json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "KortexTool",
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": spec
    }));
    t.metadata.creation_timestamp = Some(Time(ts(created)));
    t
}

fn policy(name: &str, spec: serde_json::Value) -> ChatPolicy {
    obj(serde_json::json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": name, "namespace": "default", "generation": 2},
        "spec": spec
    }))
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    obj(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default", "uid": "u1", "resourceVersion": "7", "labels": {"kortex.dev/use": "true"}},
        "stringData": data.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>()
    }))
}

fn cond<'a>(
    conds: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> (&'a str, &'a str, &'a str) {
    match find(conds, t) {
        Some(c) => (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        None => panic!("no {t} condition in {conds:?}"),
    }
}

fn anthropic() -> LLMProvider {
    provider(
        "anthropic",
        serde_json::json!({"type": "anthropic", "apiKeySecretRef": {"name": "llm-keys", "key": "anthropic"},
            "defaultModel": "claude-opus-4-6"}),
    )
}

/// The anthropic provider alone, without its key.
fn anthropic_only() -> ObjectSet {
    ObjectSet {
        providers: vec![anthropic()],
        ..Default::default()
    }
}

#[test]
fn provider_with_missing_secret_is_unavailable_with_the_reason() {
    let set = anthropic_only();
    let cat = compile(&set, ts(10));
    let p = &cat.providers[&ObjectKey::new("default", "anthropic")];
    assert!(!p.available);
    let status = p.object.status.clone().unwrap_or_default();
    assert_eq!(
        cond(&status.conditions, "SecretResolved"),
        (
            "False",
            "SecretNotFound",
            "secret llm-keys key anthropic: Secret llm-keys not found in namespace default"
        )
    );
    let (s, r, m) = cond(&status.conditions, "Ready");
    assert_eq!((s, r), ("False", "SecretNotResolved"));
    assert!(m.contains("secret llm-keys key anthropic"), "{m}");
    assert_eq!(status.observed_generation, Some(1));
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );
    assert!(status.secret_hash.is_some());
}

#[test]
fn provider_with_secret_is_ready_and_secret_never_in_status() {
    let set = ObjectSet {
        providers: vec![anthropic()],
        secrets: vec![secret("llm-keys", &[("anthropic", "sk-ant-supersecret")])],
        ..Default::default()
    };
    let cat = compile(&set, ts(10));
    let p = &cat.providers[&ObjectKey::new("default", "anthropic")];
    assert!(p.available);
    assert_eq!(
        p.api_key().map(SecretValue::expose),
        Some("sk-ant-supersecret")
    );
    assert_eq!(p.base_url(), Some("https://api.anthropic.com"));
    assert_eq!(p.locality(), Locality::Cloud);
    let json = serde_json::to_string(&p.object).unwrap_or_default();
    assert!(!json.contains("supersecret"), "{json}");
    assert!(!format!("{p:?}").contains("supersecret"));
    assert_eq!(
        cat.secret_values
            .iter()
            .map(SecretValue::expose)
            .collect::<Vec<_>>(),
        vec!["sk-ant-supersecret"]
    );
    let status = p.object.status.clone().unwrap_or_default();
    assert_eq!(cond(&status.conditions, "Ready").0, "True");
    assert_eq!(status.models, vec!["claude-opus-4-6".to_owned()]);
}

#[test]
fn provider_spec_problems_are_named() {
    let set = ObjectSet {
        providers: vec![
            provider("vllm", serde_json::json!({"type": "openai-compatible"})),
            provider(
                "openai",
                serde_json::json!({"type": "openai", "defaultModel": "gpt-5"}),
            ),
            provider(
                "nomodel",
                serde_json::json!({"type": "anthropic", "apiKeySecretRef": {"name": "k", "key": "a"}}),
            ),
            provider("ollama", serde_json::json!({"type": "ollama"})),
        ],
        secrets: vec![secret("k", &[("a", "x")])],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let ready = |n: &str| {
        let s = cat.providers[&ObjectKey::new("default", n)]
            .object
            .status
            .clone()
            .unwrap_or_default();
        let (st, r, m) = cond(&s.conditions, "Ready");
        (st.to_owned(), r.to_owned(), m.to_owned())
    };
    assert_eq!(ready("vllm").1, "InvalidSpec");
    assert!(
        ready("vllm")
            .2
            .contains("spec.baseUrl is required for type openai-compatible")
    );
    assert!(
        ready("openai")
            .2
            .contains("spec.apiKeySecretRef is required for type openai")
    );
    assert_eq!(ready("nomodel").1, "NoModel");
    let o = &cat.providers[&ObjectKey::new("default", "ollama")];
    assert!(o.available, "ollama needs no key and discovers models");
    assert_eq!(o.locality(), Locality::Local);
}

/// When the anthropic provider's Ready condition last changed.
fn ready_since(catalog: &Catalog) -> Option<Time> {
    let status = catalog.providers[&ObjectKey::new("default", "anthropic")]
        .object
        .status
        .clone()
        .unwrap_or_default();
    find(&status.conditions, "Ready").map(|c| c.last_transition_time.clone())
}

#[test]
fn transition_times_survive_recompiles() {
    let set = anthropic_only();
    let first = compile(&set, ts(10));
    // Feed the computed status back, as the cluster (or the manifest source) does.
    let set2 = ObjectSet {
        providers: vec![
            first.providers[&ObjectKey::new("default", "anthropic")]
                .object
                .clone(),
        ],
        ..Default::default()
    };
    let second = compile(&set2, ts(20));
    assert_eq!(ready_since(&second), Some(Time(ts(10))));
    // The key appears: Ready flips, so its time moves.
    let set3 = ObjectSet {
        providers: set2.providers.clone(),
        secrets: vec![secret("llm-keys", &[("anthropic", "k")])],
        ..Default::default()
    };
    let third = compile(&set3, ts(30));
    assert_eq!(ready_since(&third), Some(Time(ts(30))));
}

#[test]
fn tool_name_conflicts_older_keeps_the_name() {
    let http = |url: &str| serde_json::json!({"name": "jira_search", "description": "d", "http": {"url": url}});
    let set = ObjectSet {
        tools: vec![
            tool("newer", 200, http("http://b.example/x")),
            tool("older", 100, http("http://a.example/x")),
            tool(
                "logs",
                50,
                serde_json::json!({"name": "get_logs", "description": "d", "http": {"url": "http://c/x"}}),
            ),
            tool(
                "both",
                10,
                serde_json::json!({"description": "d", "http": {"url": "http://c/x"}, "mcp": {"url": "http://m/mcp"}}),
            ),
            tool(
                "grafana-mcp",
                10,
                serde_json::json!({"mcp": {"url": "http://m/mcp"}}),
            ),
            tool(
                "keyed",
                10,
                serde_json::json!({"mcp": {"url": "http://m/mcp",
                    "auth": {"type": "apiKey", "secretRef": {"name": "s", "key": "k"}},
                    "headers": [{"name": "X-A"}]}}),
            ),
        ],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let status = |n: &str| {
        cat.tools[&ObjectKey::new("default", n)]
            .object
            .status
            .clone()
            .unwrap_or_default()
    };
    assert_eq!(cond(&status("older").conditions, "Accepted").0, "True");
    assert_eq!(status("older").tools, vec!["jira_search".to_owned()]);
    let newer = status("newer");
    let (s, r, m) = cond(&newer.conditions, "Accepted");
    assert_eq!((s, r), ("False", "NameConflict"));
    assert_eq!(
        m,
        "tool name jira_search is already used by KortexTool default/older"
    );
    assert_eq!(cond(&status("newer").conditions, "Ready").1, "NameConflict");
    assert!(status("newer").tools.is_empty());
    assert_eq!(
        cond(&status("logs").conditions, "Accepted").2,
        "tool name get_logs is a built-in tool"
    );
    assert_eq!(
        cond(&status("both").conditions, "Accepted").1,
        "InvalidSpec"
    );
    let keyed = status("keyed");
    let (_, r, m) = cond(&keyed.conditions, "Accepted");
    assert_eq!(r, "InvalidSpec");
    assert!(
        m.contains("spec.mcp.headers[0]: exactly one of value or valueFrom must be set"),
        "{m}"
    );
    assert!(
        m.contains("spec.mcp.auth.header is required for type apiKey"),
        "{m}"
    );
    let mcp = &cat.tools[&ObjectKey::new("default", "grafana-mcp")];
    assert_eq!(
        mcp.tool_name, "grafana_mcp",
        "default name is metadata.name with - → _"
    );
    assert!(mcp.available);
}

#[test]
fn tool_timeout_has_a_hard_ceiling() {
    let set = ObjectSet {
        tools: vec![
            tool(
                "slow",
                1,
                serde_json::json!({"description": "d", "http": {"url": "http://a/x"}, "timeout": "1h"}),
            ),
            tool(
                "plain",
                1,
                serde_json::json!({"description": "d", "http": {"url": "http://a/x"}}),
            ),
        ],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    assert_eq!(
        cat.tools[&ObjectKey::new("default", "slow")].timeout(),
        TOOL_TIMEOUT_CEILING
    );
    assert_eq!(
        cat.tools[&ObjectKey::new("default", "plain")].timeout(),
        TOOL_TIMEOUT_DEFAULT
    );
}

#[test]
fn policy_conditions_name_the_provider_problem() {
    let ollama = provider("ollama", serde_json::json!({"type": "ollama"}));
    let set = ObjectSet {
        providers: vec![anthropic(), ollama],
        policies: vec![
            policy(
                "missing",
                serde_json::json!({"sessions": ["*"], "provider": "nope"}),
            ),
            policy(
                "fallback",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic", "fallbackProviders": ["ollama"]}),
            ),
            policy(
                "down",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic"}),
            ),
            policy(
                "local",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic", "mode": "local-only"}),
            ),
            policy(
                "pinned",
                serde_json::json!({"sessions": ["*"], "provider": "ollama",
                "models": {"default": "meta-llama/Llama-3", "summarize": "ollama/qwen3"}}),
            ),
        ],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let ready = |n: &str| {
        let p = &cat.policies[&ObjectKey::new("default", n)];
        let s = p.object.status.clone().unwrap_or_default();
        let (st, r, m) = cond(&s.conditions, "Ready");
        (p.available, st.to_owned(), r.to_owned(), m.to_owned())
    };
    let (ok, _, r, m) = ready("missing");
    assert!(!ok);
    assert_eq!(
        (r.as_str(), m.as_str()),
        (
            "ProviderNotFound",
            "LLMProvider nope not found in namespace default"
        )
    );
    let (ok, _, _, m) = ready("fallback");
    assert!(ok, "a usable fallback keeps the policy ready");
    assert!(m.contains("unavailable: anthropic"), "{m}");
    let (ok, _, r, m) = ready("down");
    assert!(!ok);
    assert_eq!(r, "ProviderUnavailable");
    assert!(m.contains("secret llm-keys key anthropic"), "{m}");
    assert_eq!(ready("local").2, "ProviderNotLocal");
    assert!(
        ready("pinned").0,
        "a model id containing '/' is not a provider pin"
    );
    let fallback = &cat.policies[&ObjectKey::new("default", "fallback")];
    assert_eq!(
        cat.role_target("default", fallback, Some("ollama/qwen3")),
        ("ollama".into(), Some("qwen3".into()))
    );
    assert_eq!(
        cat.role_target("default", fallback, Some("meta-llama/Llama-3")),
        ("anthropic".into(), Some("meta-llama/Llama-3".into()))
    );
    assert_eq!(
        cat.role_target("default", fallback, None),
        ("anthropic".into(), None)
    );
    assert_eq!(
        cat.policies[&ObjectKey::new("default", "down")]
            .object
            .status
            .clone()
            .unwrap_or_default()
            .observed_generation,
        Some(2)
    );
}

#[test]
fn policy_matching_is_most_specific_then_priority_then_name() {
    let p = |name: &str, sessions: &[&str], priority: i32| {
        policy(
            name,
            serde_json::json!({"sessions": sessions, "provider": "x", "priority": priority}),
        )
    };
    let mut other_ns = p("elsewhere", &["incident-42"], 100);
    other_ns.metadata.namespace = Some("other".into());
    let set = ObjectSet {
        policies: vec![
            p("catch-all", &["*"], 0),
            p("incidents", &["incident-*"], 0),
            p("incidents-hi", &["incident-*"], 5),
            p("exact", &["incident-42", "zzz"], -10),
            p("short", &["inc*"], 50),
            p("b-tie", &["tie-*"], 0),
            p("a-tie", &["tie-*"], 0),
            other_ns,
        ],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let m = |s: &str| {
        cat.match_policy("default", s)
            .and_then(|p| p.object.metadata.name.clone())
    };
    assert_eq!(m("incident-42").as_deref(), Some("exact"));
    assert_eq!(m("incident-7").as_deref(), Some("incidents-hi"));
    assert_eq!(m("incxyz").as_deref(), Some("short"));
    assert_eq!(m("random").as_deref(), Some("catch-all"));
    assert_eq!(m("tie-1").as_deref(), Some("a-tie"));
    assert!(cat.match_policy("nowhere", "incident-42").is_none());
    assert_eq!(
        cat.match_policy("other", "incident-42")
            .and_then(|p| p.object.metadata.name.clone())
            .as_deref(),
        Some("elsewhere")
    );
}

#[test]
fn invalid_triggers_are_named_in_the_triggers_condition_and_the_rest_still_fire() {
    let trigger = |extra: serde_json::Value| {
        let mut t = serde_json::json!({"name": "t", "prompt": "Look at {{ labels.alertname }}",
            "runAs": {"user": "bot"}, "alerts": {"matchers": {"severity": "critical"}}});
        if let (Some(t), Some(extra)) = (t.as_object_mut(), extra.as_object()) {
            t.extend(extra.clone());
        }
        t
    };
    let set = ObjectSet {
        providers: vec![anthropic()],
        policies: vec![
            policy(
                "bad",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic",
                "notify": [{"name": "oncall", "events": ["run.failed"], "webhook": {"url": "https://hooks.example/x"}}],
                "triggers": [
                    trigger(serde_json::json!({"name": "good", "notify": ["oncall"]})),
                    trigger(serde_json::json!({"name": "regex", "alerts": {"matchers": {"severity": "~("}}})),
                    trigger(serde_json::json!({"name": "cron", "alerts": null, "schedule": {"cron": "0 25 * * *"}})),
                    trigger(serde_json::json!({"name": "zone", "alerts": null, "schedule": {"cron": "@daily", "timeZone": "Mars/Olympus"}})),
                    trigger(serde_json::json!({"name": "prompt", "prompt": "{{ env.HOME }}"})),
                    trigger(serde_json::json!({"name": "who", "runAs": {}})),
                    trigger(serde_json::json!({"name": "hook", "notify": ["pager"]})),
                    trigger(serde_json::json!({"name": "both", "schedule": {"cron": "@daily"}})),
                ]}),
            ),
            policy(
                "good",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic",
                "triggers": [trigger(serde_json::json!({"name": "morning", "alerts": null,
                    "schedule": {"cron": "0 7 * * 1-5", "timeZone": "Europe/Berlin"}}))]}),
            ),
            policy(
                "none",
                serde_json::json!({"sessions": ["*"], "provider": "anthropic"}),
            ),
        ],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let p = &cat.policies[&ObjectKey::new("default", "bad")];
    let s = p.object.status.clone().unwrap_or_default();
    let (st, reason, message) = cond(&s.conditions, "Triggers");
    assert_eq!((st, reason), ("False", "InvalidTrigger"));
    for expected in [
        "spec.triggers[1] (regex): alerts.matchers.severity",
        "spec.triggers[2] (cron): schedule.cron: hours: 25 is outside 0-23",
        "spec.triggers[3] (zone): schedule.timeZone \"Mars/Olympus\"",
        "spec.triggers[4] (prompt): prompt: unknown placeholder {{ env.HOME }}",
        "spec.triggers[5] (who): runAs:",
        "spec.triggers[6] (hook): notify: \"pager\" is not one of this policy's notify targets",
        "spec.triggers[7] (both): exactly one of alerts and schedule",
    ] {
        assert!(message.contains(expected), "{expected:?} not in {message}");
    }
    assert!(!message.contains("(good)"), "{message}");
    assert_eq!(
        p.triggers
            .iter()
            .map(|t| t.spec.name.as_str())
            .collect::<Vec<_>>(),
        ["good"]
    );
    let none = &cat.policies[&ObjectKey::new("default", "none")];
    assert_eq!(
        cond(
            &p.object.status.clone().unwrap_or_default().conditions,
            "Ready"
        ),
        cond(
            &none.object.status.clone().unwrap_or_default().conditions,
            "Ready"
        ),
        "an invalid trigger does not change the policy's readiness"
    );
    let good = &cat.policies[&ObjectKey::new("default", "good")];
    let s = good.object.status.clone().unwrap_or_default();
    assert_eq!(cond(&s.conditions, "Triggers").1, "TriggersReady");
    assert!(good.triggers[0].schedule.is_some());
    let s = none.object.status.clone().unwrap_or_default();
    assert!(s.conditions.iter().all(|c| c.type_ != "Triggers"));
}

/// Issue 44: a provider whose baseUrl the egress guard always refuses (loopback in cluster
/// mode, link-local anywhere) showed Ready=True and failed every chat; it is not ready, with
/// its own reason, and a policy left with no provider is not ready either.
#[test]
fn a_provider_or_tool_the_egress_guard_always_refuses_is_not_ready() {
    let cluster = crate::egress::Egress::cluster(crate::egress::Own::default(), "m");
    let standalone = crate::egress::Egress::standalone(crate::egress::Own::default());
    let local = |url: &str, open: bool| {
        provider(
            "local",
            serde_json::json!({"type": "openai-compatible", "baseUrl": url,
                "defaultModel": "m", "allowPrivateTargets": open}),
        )
    };
    let set = |p: LLMProvider| ObjectSet {
        providers: vec![p],
        tools: vec![tool(
            "lookup",
            1,
            serde_json::json!({"description": "d", "http": {"url": "http://[fe80::1]:8080/lookup"}}),
        )],
        policies: vec![policy(
            "default",
            serde_json::json!({"sessions": ["*"], "provider": "local"}),
        )],
        ..Default::default()
    };
    let ready = |cat: &Catalog| {
        let p = &cat.providers[&ObjectKey::new("default", "local")];
        let status = p.object.status.clone().unwrap_or_default();
        let (s, r, m) = cond(&status.conditions, "Ready");
        let policy = &cat.policies[&ObjectKey::new("default", "default")];
        let pstatus = policy.object.status.clone().unwrap_or_default();
        let (ps, pr, _) = cond(&pstatus.conditions, "Ready");
        (
            p.available,
            format!("{s} {r}"),
            m.to_owned(),
            format!("{ps} {pr}"),
        )
    };

    let (available, ready_, message, policy_ready) = ready(&compile_with(
        &set(local("http://127.0.0.1:9/v1", false)),
        ts(10),
        &cluster,
    ));
    assert!(!available);
    assert_eq!(ready_, "False EgressRefused");
    assert!(
        message.contains("127.0.0.1") && message.contains("allowPrivateTargets"),
        "{message}"
    );
    assert_eq!(policy_ready, "False ProviderUnavailable");
    // Allowed explicitly, or a local model server under kortex serve: ready.
    let (available, ready_, _, policy_ready) = ready(&compile_with(
        &set(local("http://127.0.0.1:9/v1", true)),
        ts(10),
        &cluster,
    ));
    assert!(available, "{ready_}");
    assert_eq!(policy_ready, "True Available");
    let (available, ..) = ready(&compile_with(
        &set(local("http://127.0.0.1:11434/v1", false)),
        ts(10),
        &standalone,
    ));
    assert!(available);
    // Link-local is refused in both modes.
    let (available, ready_, ..) = ready(&compile_with(
        &set(local("http://[fe80::1]:8000/v1", false)),
        ts(10),
        &standalone,
    ));
    assert!(!available);
    assert_eq!(ready_, "False EgressRefused");
    // A tool too.
    let cat = compile_with(
        &set(local("http://127.0.0.1:9/v1", true)),
        ts(10),
        &standalone,
    );
    let t = &cat.tools[&ObjectKey::new("default", "lookup")];
    assert!(!t.available);
    let status = t.object.status.clone().unwrap_or_default();
    let (s, r, m) = cond(&status.conditions, "Ready");
    assert_eq!((s, r), ("False", "EgressRefused"), "{m}");
    assert!(m.starts_with("spec.http.url refused: [fe80::1]"), "{m}");
}

/// GitOps repositories: only one Kortex can write to safely is kept; the condition names
/// each of the others, and a token never travels in a URL or over plain http.
#[test]
fn gitops_repositories_are_kept_only_when_they_can_be_written_safely() {
    let repo = |url: &str, extra: serde_json::Value| {
        let mut r = serde_json::json!({"url": url, "secretRef": {"name": "git", "key": "token"}});
        if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
            r.extend(extra.clone());
        }
        r
    };
    let set = ObjectSet {
        providers: vec![anthropic()],
        policies: vec![policy(
            "fleet",
            serde_json::json!({"sessions": ["*"], "provider": "anthropic", "gitops": {"repositories": [
                repo("https://github.com/acme/fleet", serde_json::json!({})),
                repo("https://ghp_leaked@github.com/acme/leaky", serde_json::json!({})),
                repo("http://git.internal/acme/plain", serde_json::json!({})),
                repo("http://10.0.0.7/acme/lab", serde_json::json!({"allowPrivateTargets": true})),
                repo("git@github.com:acme/ssh.git", serde_json::json!({})),
                repo("https://github.com/acme/nosecret", serde_json::json!({"secretRef": {"name": "absent", "key": "token"}})),
            ]}}),
        )],
        secrets: vec![secret("git", &[("token", "ghp_token_value_1")])],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let p = &cat.policies[&ObjectKey::new("default", "fleet")];
    let kept: Vec<&str> = p.gitops.iter().map(|r| r.spec.url.as_str()).collect();
    assert_eq!(
        kept,
        ["https://github.com/acme/fleet", "http://10.0.0.7/acme/lab"]
    );
    assert_eq!(
        p.gitops[0].secret.as_ref().map(|s| s.expose()),
        Some("ghp_token_value_1")
    );
    let s = p.object.status.clone().unwrap_or_default();
    let (st, _, message) = cond(&s.conditions, "GitOps");
    assert_eq!(st, "False");
    for expected in [
        "leaky: the URL carries user info",
        "plain: a token is sent over https only",
        "ssh.git: an SSH URL needs knownHosts",
        "nosecret",
    ] {
        assert!(message.contains(expected), "{expected:?} not in {message}");
    }
    assert!(!message.contains("ghp_"), "{message}");
    // The token is redacted like every resolved Secret value.
    assert!(
        cat.secret_values
            .iter()
            .any(|v| v.expose() == "ghp_token_value_1")
    );
}

/// `spec.slack`: with both Secrets the app is kept and `Slack=True`; a Secret missing makes
/// `Slack=False` naming it, and no app is kept (no request can be verified).
#[test]
fn a_slack_app_is_kept_only_with_its_token_and_signing_secret() {
    let slack = |signing: &str| {
        serde_json::json!({"sessions": ["*"], "provider": "anthropic", "slack": {
            "teamId": "T0123ABCD", "channels": ["C0INCIDENT"],
            "botTokenSecretRef": {"name": "slack", "key": "bot-token"},
            "signingSecretRef": {"name": "slack", "key": signing},
            "users": [{"slackUser": "U0ALICE", "user": "alice@example.com"}]}})
    };
    let set = ObjectSet {
        providers: vec![anthropic()],
        policies: vec![
            policy("oncall", slack("signing-secret")),
            policy("broken", slack("absent")),
        ],
        secrets: vec![secret(
            "slack",
            &[
                ("bot-token", "xoxb-test-1"),
                ("signing-secret", "8f742231b10e8888"),
            ],
        )],
        ..Default::default()
    };
    let cat = compile(&set, ts(1));
    let ok = &cat.policies[&ObjectKey::new("default", "oncall")];
    let app = ok.slack.as_ref().unwrap_or_else(|| panic!("no app"));
    assert_eq!(app.spec.team_id, "T0123ABCD");
    assert_eq!(app.bot_token.expose(), "xoxb-test-1");
    assert_eq!(app.signing_secret.expose(), "8f742231b10e8888");
    let s = ok.object.status.clone().unwrap_or_default();
    let (st, reason, message) = cond(&s.conditions, "Slack");
    assert_eq!((st, reason), ("True", "Listening"));
    assert!(
        message.contains("T0123ABCD") && message.contains("C0INCIDENT"),
        "{message}"
    );
    let broken = &cat.policies[&ObjectKey::new("default", "broken")];
    assert!(broken.slack.is_none());
    let s = broken.object.status.clone().unwrap_or_default();
    let (st, reason, message) = cond(&s.conditions, "Slack");
    assert_eq!((st, reason), ("False", "SecretKeyNotFound"));
    assert!(
        message.contains("spec.slack") && message.contains("absent"),
        "{message}"
    );
    assert!(!message.contains("xoxb"), "{message}");
}
