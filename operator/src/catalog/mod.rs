//! The catalog: one pure function from a set of objects (the four Kortex kinds plus
//! `v1/Secret`) to the validated configuration the server runs on, with each object's
//! status (conditions, observedGeneration, ...) filled in.
//!
//! Both modes use it: standalone mode feeds it objects parsed from manifest files, cluster
//! mode feeds it the watched objects. It does no I/O, so it is tested with plain calls; the
//! two facts about the machine it needs come from below or from its caller: the egress rules
//! ([`compile_with`]) and whether a command is installed ([`check_commands_with`]). It also
//! holds the pure parsers of what it validates: alert matchers and payloads (`alert`),
//! schedules (`cron`), prompt templates (`template`), URL templates (`url_template`).
//!
//! Imports only `crd`, `store` (ids), `egress`, `glob` and `metrics`-free leaves: nothing
//! that talks to the network, the cluster or a provider (scripts/layers.py checks).

pub mod alert;
pub mod credentials;
pub mod cron;
pub mod secret_redactor;
pub mod secrets;
pub mod template;
pub mod url_template;

use crate::crd::conditions::{self, Desired, reasons, types};
use crate::crd::{
    ActionProposal, ChatPolicy, ChatPolicyStatus, KortexTool, KortexToolStatus, LLMProvider,
    LLMProviderStatus, Locality, PolicyMode, ProviderType, SecretKeyRef,
};
pub use credentials::{Credential, CredentialKind, Credentials, constant_time_eq, group_list};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
pub use secrets::{SecretIndex, SecretValue};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

/// The most a `KortexTool`'s `spec.guide` may hold.
pub const GUIDE_MAX_BYTES: usize = 16 * 1024;

/// Names of the built-in tools: no `KortexTool` may take one.
pub const BUILTIN_TOOLS: &[&str] = &[
    "get_logs",
    "get_events",
    "get_resource",
    "list_resources",
    "get_recent_deploys",
    "get_gitops_source",
    "get_metrics",
    "compare_to_baseline",
    "get_incident_history",
    "get_admin_info",
    "read_result_chunk",
    "propose_action",
    "list_tool_guides",
    "get_tool_guide",
];

/// Default and ceiling of a plugin tool's timeout.
pub const TOOL_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);
/// Hard ceiling of a plugin tool's timeout, whatever the spec says.
pub const TOOL_TIMEOUT_CEILING: std::time::Duration = std::time::Duration::from_secs(300);
/// Default result cap of a plugin tool.
pub const TOOL_MAX_RESULT_BYTES: u32 = 65_536;
/// Default output token limit of a provider.
pub const PROVIDER_MAX_TOKENS: u32 = 4096;
/// Default request timeout of a provider.
pub const PROVIDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// `claude-code`'s default `timeout`: one call is a whole Claude Code loop, tools included.
pub const CLAUDE_CODE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Namespace and name of an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace (`default` when unset).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a Kubernetes object.
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        Self::new(
            obj.meta().namespace.as_deref().unwrap_or("default"),
            obj.meta().name.as_deref().unwrap_or(""),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Everything the catalog is compiled from.
#[derive(Clone, Debug, Default)]
pub struct ObjectSet {
    /// `LLMProvider` objects.
    pub providers: Vec<LLMProvider>,
    /// `KortexTool` objects.
    pub tools: Vec<KortexTool>,
    /// `ChatPolicy` objects.
    pub policies: Vec<ChatPolicy>,
    /// `ActionProposal` objects.
    pub proposals: Vec<ActionProposal>,
    /// Secrets (referenced ones and credential Secrets).
    pub secrets: Vec<Secret>,
    /// Header names no provider or tool may send besides [`RESERVED_HEADERS`]: the
    /// identity headers of the authenticating proxy in front of Kortex (`--auth-proxy-header`).
    pub reserved_headers: Vec<String>,
}

/// Headers no `LLMProvider` or `KortexTool` may send (case-insensitive; a trailing `*` is a
/// prefix): the identities that authenticating proxies and the Kubernetes API server trust
/// (a resource could otherwise speak as someone else to whatever trusts them), and the
/// marker of Kortex's own requests.
pub const RESERVED_HEADERS: &[&str] = &[
    "x-forwarded-user",
    "x-forwarded-groups",
    "x-forwarded-email",
    "x-forwarded-preferred-username",
    "x-auth-request-user",
    "x-auth-request-groups",
    "x-auth-request-email",
    "x-auth-request-preferred-username",
    "x-remote-user",
    "x-remote-group",
    "x-remote-extra-*",
    "remote-user",
    "impersonate-*",
    crate::egress::VIA_HEADER,
];

/// Whether `name` is a reserved header (see [`RESERVED_HEADERS`]) or one of `extra`.
pub fn reserved_header(name: &str, extra: &[String]) -> bool {
    let name = name.trim().to_ascii_lowercase();
    RESERVED_HEADERS.iter().any(|r| match r.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *r,
    }) || extra.iter().any(|e| e.trim().eq_ignore_ascii_case(&name))
}

/// A provider as served: the object with its computed status, and its resolved secrets.
#[derive(Clone, Debug)]
pub struct ProviderEntry {
    /// The object, `status` filled in.
    pub object: LLMProvider,
    /// Whether chat may use it (`Ready=True`).
    pub available: bool,
    /// Resolved values of the referenced Secret keys.
    pub secrets: BTreeMap<SecretKeyRef, SecretValue>,
}

impl ProviderEntry {
    /// The spec's type.
    pub fn provider_type(&self) -> ProviderType {
        self.object.spec.provider_type
    }

    /// `baseUrl`, or the type's default.
    pub fn base_url(&self) -> Option<&str> {
        self.object
            .spec
            .base_url
            .as_deref()
            .or(self.provider_type().default_base_url())
    }

    /// `locality`, or the type's default.
    pub fn locality(&self) -> Locality {
        self.object
            .spec
            .locality
            .unwrap_or(self.provider_type().default_locality())
    }

    /// `defaultModel`, else the first catalog model, else the first model the endpoint
    /// listed (`openai-compatible` and `ollama` without `models`).
    pub fn default_model(&self) -> Option<&str> {
        self.object
            .spec
            .default_model
            .as_deref()
            .or(self.object.spec.models.first().map(|m| m.id.as_str()))
            .or_else(|| {
                self.object
                    .status
                    .as_ref()
                    .and_then(|s| s.discovered_models.first())
                    .map(String::as_str)
            })
    }

    /// The API key, if one is configured and resolved.
    pub fn api_key(&self) -> Option<&SecretValue> {
        self.object
            .spec
            .api_key_secret_ref
            .as_ref()
            .and_then(|r| self.secrets.get(r))
    }

    /// Output token limit per call.
    pub fn max_tokens(&self) -> u32 {
        self.object.spec.max_tokens.unwrap_or(PROVIDER_MAX_TOKENS)
    }

    /// Request timeout.
    pub fn timeout(&self) -> std::time::Duration {
        positive(self.object.spec.timeout).unwrap_or(
            if self.provider_type() == ProviderType::ClaudeCode {
                CLAUDE_CODE_TIMEOUT
            } else {
                PROVIDER_TIMEOUT
            },
        )
    }
}

/// A plugin tool as served.
#[derive(Clone, Debug)]
pub struct ToolEntry {
    /// The object, `status` filled in.
    pub object: KortexTool,
    /// The name the model sees (the prefix, for MCP servers).
    pub tool_name: String,
    /// Whether sessions may use it (`Ready=True`).
    pub available: bool,
    /// Resolved values of the referenced Secret keys.
    pub secrets: BTreeMap<SecretKeyRef, SecretValue>,
}

impl ToolEntry {
    /// Per-call timeout: the spec's, within the hard ceiling.
    pub fn timeout(&self) -> std::time::Duration {
        positive(self.object.spec.timeout)
            .unwrap_or(TOOL_TIMEOUT_DEFAULT)
            .min(TOOL_TIMEOUT_CEILING)
    }

    /// Result cap in bytes.
    pub fn max_result_bytes(&self) -> u32 {
        self.object
            .spec
            .max_result_bytes
            .unwrap_or(TOOL_MAX_RESULT_BYTES)
    }
}

/// A chat policy as served.
#[derive(Clone, Debug)]
pub struct PolicyEntry {
    /// The object, `status` filled in.
    pub object: ChatPolicy,
    /// Whether sessions may run under it (`Ready=True`).
    pub available: bool,
    /// Its notification targets whose Secrets resolved.
    pub notify: Vec<NotifyResolved>,
    /// Its triggers that are valid (`docs/triggers.md`).
    pub triggers: Vec<TriggerEntry>,
    /// Its GitOps repositories that can be written to (`docs/gitops.md`).
    pub gitops: Vec<RepositoryResolved>,
    /// Its Slack app, with its Secrets read (`docs/slack.md`).
    pub slack: Option<SlackResolved>,
}

/// A policy's Slack app with its Secrets read.
#[derive(Clone, Debug)]
pub struct SlackResolved {
    /// As declared.
    pub spec: crate::crd::Slack,
    /// The bot token (never shown).
    pub bot_token: SecretValue,
    /// The signing secret (never shown).
    pub signing_secret: SecretValue,
}

/// A declared GitOps repository with its Secret read.
#[derive(Clone, Debug)]
pub struct RepositoryResolved {
    /// As declared.
    pub spec: crate::crd::GitRepository,
    /// Its token or private key (never shown).
    pub secret: Option<SecretValue>,
}

/// A valid trigger: its spec, with its matchers, schedule and prompt parsed.
#[derive(Clone, Debug)]
pub struct TriggerEntry {
    /// As declared.
    pub spec: crate::crd::Trigger,
    /// `alerts.matchers`, compiled (`None` for a schedule).
    pub matchers: Option<alert::Matchers>,
    /// `schedule`, parsed, with its time zone.
    pub schedule: Option<(cron::Cron, jiff::tz::TimeZone)>,
    /// `prompt`, parsed.
    pub prompt: template::Template,
}

/// Default `startingDeadlineSeconds` of a schedule.
pub const STARTING_DEADLINE: u32 = 60;

/// A trigger's spec checked and parsed; the error names the field.
fn compile_trigger(
    t: &crate::crd::Trigger,
    declared_targets: &[crate::crd::NotifyTarget],
) -> Result<TriggerEntry, String> {
    let matchers = match (&t.alerts, &t.schedule) {
        (Some(a), None) => {
            Some(alert::Matchers::parse(&a.matchers).map_err(|e| format!("alerts.{e}"))?)
        }
        (None, Some(_)) => None,
        _ => return Err("exactly one of alerts and schedule must be set".into()),
    };
    let schedule = t
        .schedule
        .as_ref()
        .map(|s| {
            let cron: cron::Cron = s.cron.parse().map_err(|e| format!("schedule.cron: {e}"))?;
            let tz =
                cron::time_zone(s.time_zone.as_deref()).map_err(|e| format!("schedule.{e}"))?;
            Ok::<_, String>((cron, tz))
        })
        .transpose()?;
    let prompt = t.prompt.parse().map_err(|e| format!("prompt: {e}"))?;
    let run_as = t.run_as.clone().unwrap_or_default();
    if run_as.service_account_name.is_none() && run_as.user.is_none() {
        return Err(
            "runAs: set serviceAccountName (cluster mode) or user (standalone): a triggered investigation reads with a named identity"
                .into(),
        );
    }
    if let Some(missing) = t
        .notify
        .iter()
        .find(|n| !declared_targets.iter().any(|d| &d.name == *n))
    {
        return Err(format!(
            "notify: {missing:?} is not one of this policy's notify targets"
        ));
    }
    Ok(TriggerEntry {
        spec: t.clone(),
        matchers,
        schedule,
        prompt,
    })
}

/// A condition of `type_`: `ready` (its reason and message) when there are no `problems`,
/// else failed with `reason` and every problem.
fn ready_unless(
    type_: &'static str,
    ready: (&'static str, String),
    reason: &'static str,
    problems: &[String],
) -> Desired {
    if problems.is_empty() {
        Desired::ok(type_, ready.0, ready.1)
    } else {
        Desired::fail(type_, reason, problems.join("; "))
    }
}

/// A policy's valid triggers and its `Triggers` condition (none without triggers): `False`
/// naming each invalid trigger and why (the others still work).
fn compile_triggers(spec: &crate::crd::ChatPolicySpec) -> (Vec<TriggerEntry>, Option<Desired>) {
    if spec.triggers.is_empty() {
        return (Vec::new(), None);
    }
    let mut ok = Vec::new();
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for (i, t) in spec.triggers.iter().enumerate() {
        if !names.insert(t.name.as_str()) {
            problems.push(format!(
                "spec.triggers[{i}] ({}): the name is used twice",
                t.name
            ));
            continue;
        }
        match compile_trigger(t, &spec.notify) {
            Ok(entry) => ok.push(entry),
            Err(e) => problems.push(format!("spec.triggers[{i}] ({}): {e}", t.name)),
        }
    }
    let ready = (
        reasons::TRIGGERS_READY,
        format!("{} trigger(s) ready", ok.len()),
    );
    let condition = ready_unless(types::TRIGGERS, ready, reasons::INVALID_TRIGGER, &problems);
    (ok, Some(condition))
}

impl PolicyEntry {
    /// A policy taken as it is, available, with nothing of it resolved (no notification
    /// targets, triggers or repositories): what a tool called outside the catalog sees.
    pub fn as_is(object: ChatPolicy) -> Self {
        Self {
            object,
            available: true,
            notify: Vec::new(),
            triggers: Vec::new(),
            gitops: Vec::new(),
            slack: None,
        }
    }

    /// `namespace/name`, as budgets, runs, proposals and notifications name the policy.
    pub fn qualified_name(&self) -> String {
        let meta = &self.object.metadata;
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or_default()
        )
    }
}

/// A notification target with its Secrets read.
#[derive(Clone, Debug)]
pub struct NotifyResolved {
    /// The target as declared.
    pub target: crate::crd::NotifyTarget,
    /// The webhook URL (from the spec or its Secret; a Secret's is never shown).
    pub url: SecretValue,
    /// The signing secret, if any.
    pub signing: Option<SecretValue>,
}

/// The validated configuration the server runs on. Cheap to share: publish it behind an
/// `Arc` and swap the whole thing on every change.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// Providers by namespace/name.
    pub providers: BTreeMap<ObjectKey, ProviderEntry>,
    /// Plugin tools by namespace/name.
    pub tools: BTreeMap<ObjectKey, ToolEntry>,
    /// Policies by namespace/name.
    pub policies: BTreeMap<ObjectKey, PolicyEntry>,
    /// Proposals by namespace/name, as given.
    pub proposals: BTreeMap<ObjectKey, ActionProposal>,
    /// API keys for the chat API and the gateway.
    pub credentials: Credentials,
    /// Every resolved secret value, longest first, for redaction.
    pub secret_values: Arc<Vec<SecretValue>>,
    /// Finds those values (and their derived forms) in text.
    pub redactor: secret_redactor::SecretRedactor,
}

impl Catalog {
    /// The policy governing `session`: for a session a trigger started, its trigger's
    /// (`docs/triggers.md`); otherwise the one its name matches ([`Self::match_policy`]).
    pub fn policy_of(&self, session: &crate::store::SessionRecord) -> Option<&PolicyEntry> {
        match session.trigger.as_deref().and_then(|t| t.rsplit_once('/')) {
            Some((policy, _trigger)) => self.policy_named(policy),
            None => self.match_policy(&session.namespace, &session.name),
        }
    }

    /// The policy governing session `session` in `namespace`: the one whose `sessions` glob
    /// matches most specifically (fewest wildcards, most literal characters), then the higher
    /// `priority`, then the name. Policies that are not ready still match (the caller reports
    /// why they cannot serve), so a broken policy never silently hands a session to another.
    pub fn match_policy(&self, namespace: &str, session: &str) -> Option<&PolicyEntry> {
        self.policies
            .iter()
            .filter(|(k, _)| k.namespace == namespace)
            .filter_map(|(k, p)| {
                let best = p
                    .object
                    .spec
                    .sessions
                    .iter()
                    .filter(|g| crate::glob::matches(g, session))
                    .map(|g| crate::glob::specificity(g))
                    .max()?;
                Some((
                    (
                        best,
                        p.object.spec.priority,
                        std::cmp::Reverse(k.name.clone()),
                    ),
                    p,
                ))
            })
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, p)| p)
    }

    /// The provider and model a policy's role answers with: a role written `provider/model`
    /// pins a provider when the prefix names one of `namespace` (model ids such as
    /// `meta-llama/Llama-3` contain '/' themselves); otherwise the policy's `provider` with the
    /// role's model, or its default model when the role is unset.
    pub fn role_target(
        &self,
        namespace: &str,
        policy: &PolicyEntry,
        role: Option<&str>,
    ) -> (String, Option<String>) {
        let provider = &policy.object.spec.provider;
        match role {
            Some(m) => match m.split_once('/') {
                Some((p, model)) if self.provider(namespace, p).is_some() => {
                    (p.to_owned(), Some(model.to_owned()))
                }
                _ => (provider.clone(), Some(m.to_owned())),
            },
            None => (provider.clone(), None),
        }
    }

    /// The provider `name` in `namespace`.
    pub fn provider(&self, namespace: &str, name: &str) -> Option<&ProviderEntry> {
        self.providers.get(&ObjectKey::new(namespace, name))
    }

    /// The policy a record names as `namespace/name` (proposals keep it so), as it is now.
    pub fn policy_named(&self, qualified: &str) -> Option<&PolicyEntry> {
        let (namespace, name) = qualified.split_once('/')?;
        self.policies.get(&ObjectKey::new(namespace, name))
    }
}

fn positive(d: Option<kube::core::Duration>) -> Option<std::time::Duration> {
    d.filter(|d| !d.is_negative())
        .map(std::time::Duration::from)
        .filter(|d| !d.is_zero())
}

/// Compiles `objects` into the catalog. `now` stamps condition transitions; conditions
/// already present on an object's status keep their `lastTransitionTime` unless their
/// status changed.
pub fn compile(objects: &ObjectSet, now: jiff::Timestamp) -> Catalog {
    compile_with(objects, now, &crate::egress::current())
}

/// [`compile`] under the given egress rules (what this process may reach): an endpoint
/// they always refuse makes its provider or tool not ready instead of failing every call.
pub fn compile_with(
    objects: &ObjectSet,
    now: jiff::Timestamp,
    egress: &crate::egress::Egress,
) -> Catalog {
    let secrets = SecretIndex::new(&objects.secrets);
    let mut used_values: BTreeSet<Arc<str>> = BTreeSet::new();

    let providers: BTreeMap<ObjectKey, ProviderEntry> = objects
        .providers
        .iter()
        .map(|p| {
            let entry = compile_provider(p, &secrets, &objects.reserved_headers, now, egress);
            used_values.extend(entry.secrets.values().map(|v| Arc::from(v.expose())));
            (ObjectKey::of(p), entry)
        })
        .collect();

    let tools = compile_tools(
        &objects.tools,
        &secrets,
        &objects.reserved_headers,
        now,
        egress,
    );
    for t in tools.values() {
        used_values.extend(t.secrets.values().map(|v| Arc::from(v.expose())));
    }

    let policies = objects
        .policies
        .iter()
        .map(|p| {
            let entry = compile_policy(p, &providers, &secrets, now);
            for r in &entry.gitops {
                used_values.extend(r.secret.iter().map(|v| Arc::from(v.expose())));
            }
            for t in &entry.notify {
                used_values.extend(t.signing.iter().map(|v| Arc::from(v.expose())));
                if t.target.webhook.url_secret_ref.is_some() {
                    used_values.insert(Arc::from(t.url.expose()));
                }
            }
            (ObjectKey::of(p), entry)
        })
        .collect();

    let credentials = Credentials::from_secrets(&objects.secrets);
    let mut secret_values: Vec<SecretValue> =
        used_values.into_iter().map(SecretValue::new).collect();
    secret_values.sort_by_key(|v| std::cmp::Reverse(v.expose().len()));

    Catalog {
        providers,
        tools,
        policies,
        proposals: objects
            .proposals
            .iter()
            .map(|p| (ObjectKey::of(p), p.clone()))
            .collect(),
        credentials,
        redactor: secret_redactor::SecretRedactor::new(&secret_values),
        secret_values: Arc::new(secret_values),
    }
}

/// Resolves `refs`; returns the values and the `SecretResolved` condition.
fn resolve_all(
    secrets: &SecretIndex<'_>,
    namespace: &str,
    refs: &[&SecretKeyRef],
) -> (BTreeMap<SecretKeyRef, SecretValue>, Desired) {
    let mut values = BTreeMap::new();
    let mut problems = Vec::new();
    for r in refs {
        match secrets.resolve(namespace, r) {
            Ok(v) => {
                values.insert((*r).clone(), v);
            }
            Err(p) => problems.push(p),
        }
    }
    let condition = match problems.first() {
        None if refs.is_empty() => Desired::ok(
            types::SECRET_RESOLVED,
            reasons::NO_SECRETS,
            "no Secrets referenced",
        ),
        None => Desired::ok(
            types::SECRET_RESOLVED,
            reasons::RESOLVED,
            format!("{} Secret key(s) resolved", refs.len()),
        ),
        Some(first) => {
            let message = problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            Desired::fail(types::SECRET_RESOLVED, first.reason, message)
        }
    };
    (values, condition)
}

/// The models a provider's spec names: `models`, then `defaultModel` and `fastModel`.
fn declared_models(spec: &crate::crd::LLMProviderSpec) -> Vec<String> {
    let mut models: Vec<String> = spec.models.iter().map(|m| m.id.clone()).collect();
    for extra in [&spec.default_model, &spec.fast_model]
        .into_iter()
        .flatten()
    {
        if !models.contains(extra) {
            models.push(extra.clone());
        }
    }
    models
}

/// Records what a probe of the provider listed: `discoveredModels` becomes `listed` (for
/// types that discover models) and `models` the declared ones followed by those.
pub fn set_discovered(
    status: &mut LLMProviderStatus,
    spec: &crate::crd::LLMProviderSpec,
    listed: &[String],
) {
    let mut models = declared_models(spec);
    status.discovered_models = if spec.provider_type.discovers_models() {
        listed.to_vec()
    } else {
        Vec::new()
    };
    for m in &status.discovered_models {
        if !models.contains(m) {
            models.push(m.clone());
        }
    }
    status.models = models;
}

/// How the process checks that a command is installed (a `claude-code` provider's CLI): a
/// look at the machine the catalog does not make itself (it does no I/O), so whoever runs
/// it says how ([`check_commands_with`]; the `kortex` binary installs
/// [`crate::llm::probe::installed`] at start). Until then every command counts as installed.
static COMMANDS: std::sync::OnceLock<fn(&str) -> bool> = std::sync::OnceLock::new();

/// Makes `check` the process's way to tell whether a command is installed (the first call
/// wins).
pub fn check_commands_with(check: fn(&str) -> bool) {
    let _ = COMMANDS.set(check);
}

fn command_installed(command: &str) -> bool {
    COMMANDS.get().is_none_or(|check| check(command))
}

/// Why the egress guard refuses every request to `url` (a literal address, or a name it
/// always refuses), if it does. A name that merely resolves to a refused address is caught
/// per request instead: resolution can change.
fn egress_refusal(egress: &crate::egress::Egress, url: &str, open: bool) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    egress.check_url(&url, open).err()
}

// Long because an LLMProvider's validation: one check per field of the kind and per provider type,
// each with its own condition reason.
fn compile_provider(
    p: &LLMProvider,
    secrets: &SecretIndex<'_>,
    objects_reserved: &[String],
    now: jiff::Timestamp,
    egress: &crate::egress::Egress,
) -> ProviderEntry {
    let ns = p.namespace().unwrap_or_else(|| "default".into());
    let spec = &p.spec;
    let refs = spec.secret_refs();
    let (values, secret_cond) = resolve_all(secrets, &ns, &refs);

    let mut spec_problems = Vec::new();
    if spec.provider_type.requires_api_key() && spec.api_key_secret_ref.is_none() {
        spec_problems.push(format!(
            "spec.apiKeySecretRef is required for type {}",
            spec.provider_type.as_str()
        ));
    }
    let claude_code = spec.provider_type == ProviderType::ClaudeCode;
    if claude_code && spec.auth_secret_ref.is_none() && spec.api_key_secret_ref.is_none() {
        spec_problems.push("spec.authSecretRef is required for type claude-code: the token `claude setup-token` prints (authKind: oauthToken), or an Anthropic API key (authKind: apiKey)".to_owned());
    }
    if !claude_code
        && (spec.command.is_some()
            || spec.auth_secret_ref.is_some()
            || spec.auth_kind.is_some()
            || spec.max_turns.is_some())
    {
        spec_problems.push(format!(
            "spec.command, authSecretRef, authKind and maxTurns are for type claude-code, not {}",
            spec.provider_type.as_str()
        ));
    }
    let command = spec.command.as_deref().unwrap_or("claude");
    let installed = !claude_code || command_installed(command);
    if spec.base_url.is_none() && spec.provider_type.default_base_url().is_none() {
        spec_problems.push(format!(
            "spec.baseUrl is required for type {}",
            spec.provider_type.as_str()
        ));
    }
    if spec.timeout.is_some_and(|t| t.is_negative()) {
        spec_problems.push("spec.timeout must not be negative".to_owned());
    }
    let mut seen = BTreeSet::new();
    for m in &spec.models {
        if !seen.insert(m.id.as_str()) {
            spec_problems.push(format!("spec.models: model id {} is listed twice", m.id));
        }
    }
    spec_problems.extend(header_problems(&spec.headers, "spec.headers"));
    let reserved = reserved_problems(
        spec.headers.iter().map(|h| h.name.as_str()),
        "spec.headers",
        objects_reserved,
    );

    let has_model = spec.default_model.is_some() || !spec.models.is_empty();
    // claude-code runs a local CLI: its baseUrl is the CLI's business, not Kortex's client's.
    let refused = spec
        .base_url
        .as_deref()
        .or(spec.provider_type.default_base_url())
        .filter(|_| !claude_code)
        .and_then(|url| egress_refusal(egress, url, spec.allow_private_targets));
    let ready = if !reserved.is_empty() {
        Desired::fail(types::READY, reasons::RESERVED_HEADER, reserved.join("; "))
    } else if !spec_problems.is_empty() {
        Desired::fail(
            types::READY,
            reasons::INVALID_SPEC,
            spec_problems.join("; "),
        )
    } else if !secret_cond.status {
        Desired::fail(
            types::READY,
            reasons::SECRET_NOT_RESOLVED,
            format!("unavailable: {}", secret_cond.message),
        )
    } else if !installed {
        Desired::fail(
            types::READY,
            reasons::CLAUDE_CODE_NOT_INSTALLED,
            format!(
                "no {command:?} on PATH: install @anthropic-ai/claude-code (the image's claude-code target has it) or set spec.command; no other provider stands in unless a policy lists it in fallbackProviders"
            ),
        )
    } else if let Some(refused) = refused {
        Desired::fail(
            types::READY,
            reasons::EGRESS_REFUSED,
            format!("spec.baseUrl {refused}; nothing is contacted"),
        )
    } else if !has_model && !spec.provider_type.discovers_models() {
        Desired::fail(
            types::READY,
            reasons::NO_MODEL,
            "set spec.defaultModel or list spec.models",
        )
    } else {
        let model = spec
            .default_model
            .as_deref()
            .or(spec.models.first().map(|m| m.id.as_str()));
        let message = match model {
            Some(m) => format!(
                "{} provider available, default model {m}",
                spec.provider_type.as_str()
            ),
            None => format!(
                "{} provider available, models discovered from the endpoint",
                spec.provider_type.as_str()
            ),
        };
        Desired::ok(types::READY, reasons::AVAILABLE, message)
    };
    let available = ready.status;

    let models = declared_models(spec);
    // Usage and budgets count a model without a price at $0: say so on cloud providers.
    let unpriced: Vec<&str> = models
        .iter()
        .filter(|id| !spec.models.iter().any(|m| &m.id == *id && m.cost.is_some()))
        .map(String::as_str)
        .collect();
    let local = spec
        .locality
        .unwrap_or(spec.provider_type.default_locality())
        == Locality::Local;
    let priced = if unpriced.is_empty() {
        Desired::ok(types::PRICED, reasons::PRICED, "every model has a price")
    } else if local {
        Desired::ok(
            types::PRICED,
            reasons::LOCAL_PROVIDER,
            format!(
                "local provider: {} counted at $0 in usage and budgets",
                unpriced.join(", ")
            ),
        )
    } else {
        Desired::fail(
            types::PRICED,
            reasons::MODEL_WITHOUT_PRICE,
            format!(
                "no price for {}: counted at $0 in usage and budgets; set spec.models[].cost",
                unpriced.join(", ")
            ),
        )
    };
    let previous = p.status.as_ref();
    // What the probe last discovered is kept (never a model the spec no longer lists).
    let mut status = LLMProviderStatus::default();
    set_discovered(
        &mut status,
        spec,
        previous
            .map(|s| s.discovered_models.as_slice())
            .unwrap_or_default(),
    );
    let generation = p.metadata.generation;
    let previous_conditions = previous
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    // `Reachable` comes from the provider probe, not from here: keep it as it is.
    let mut conditions = conditions::merge(
        previous_conditions,
        &[secret_cond, ready, priced],
        generation,
        now,
    );
    conditions.extend(conditions::find(previous_conditions, types::REACHABLE).cloned());

    let mut object = p.clone();
    object.status = Some(LLMProviderStatus {
        observed_generation: generation,
        conditions,
        secret_hash: secrets.hash_of(&ns, &refs),
        ..status
    });
    ProviderEntry {
        object,
        available,
        secrets: values,
    }
}

// Long because a KortexTool's validation: one check per field of the kind (http, mcp, auth, headers,
// names), each with its own condition reason.
fn compile_tools(
    tools: &[KortexTool],
    secrets: &SecretIndex<'_>,
    objects_reserved: &[String],
    now: jiff::Timestamp,
    egress: &crate::egress::Egress,
) -> BTreeMap<ObjectKey, ToolEntry> {
    // The older resource keeps a contested name: order by creation, then namespace/name.
    let mut ordered: Vec<&KortexTool> = tools.iter().collect();
    ordered.sort_by(|a, b| {
        let ca = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let cb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ca.cmp(&cb)
            .then_with(|| ObjectKey::of(*a).cmp(&ObjectKey::of(*b)))
    });
    let mut taken: BTreeMap<(String, String), ObjectKey> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for t in ordered {
        let key = ObjectKey::of(t);
        let name = t.tool_name();
        let spec = &t.spec;

        let mut spec_problems = Vec::new();
        match (&spec.http, &spec.mcp) {
            (Some(_), Some(_)) | (None, None) => {
                spec_problems.push("exactly one of spec.http or spec.mcp must be set".to_owned());
            }
            (Some(_), None) if spec.description.is_none() => {
                spec_problems.push("spec.description is required for http tools".to_owned());
            }
            _ => {}
        }
        if name.is_empty() || name.contains("__") || !valid_tool_name(&name) {
            spec_problems.push(format!(
                "tool name {name:?} is invalid: use letters, digits, '_' and '-', starting with a letter, without '__'"
            ));
        }
        if let Some(http) = &spec.http {
            match url_template::UrlTemplate::parse(&http.url) {
                Err(e) => spec_problems.push(format!("spec.http.url: {e}")),
                Ok(template) => {
                    let properties = spec
                        .parameters
                        .as_ref()
                        .and_then(|p| p.get("properties"))
                        .and_then(|p| p.as_object());
                    for name in &template.placeholders {
                        if !properties.is_some_and(|p| p.contains_key(name)) {
                            spec_problems.push(format!(
                                "spec.http.url: placeholder {{{name}}} is not a property of spec.parameters"
                            ));
                        }
                    }
                }
            }
        }
        if let Some(params) = &spec.parameters {
            if let Err(e) = jsonschema::validator_for(params) {
                spec_problems.push(format!("spec.parameters is not a valid JSON Schema: {e}"));
            }
            match params.get("type").and_then(|v| v.as_str()) {
                Some("object") => {}
                _ => spec_problems
                    .push("spec.parameters must be a JSON Schema with type: object".to_owned()),
            }
        }
        if spec.timeout.is_some_and(|d| d.is_negative()) {
            spec_problems.push("spec.timeout must not be negative".to_owned());
        }
        // The schema bounds characters; the guide's budget is bytes.
        if let Some(guide) = &spec.guide
            && guide.len() > GUIDE_MAX_BYTES
        {
            spec_problems.push(format!(
                "spec.guide is {} bytes; a guide may hold at most {GUIDE_MAX_BYTES} bytes (16 KiB)",
                guide.len()
            ));
        }
        let backend = match (&spec.http, &spec.mcp) {
            (Some(h), _) => Some(("spec.http", &h.headers, &h.auth)),
            (None, Some(m)) => Some(("spec.mcp", &m.headers, &m.auth)),
            (None, None) => None,
        };
        let mut reserved = Vec::new();
        if let Some((path, headers, auth)) = backend {
            spec_problems.extend(header_problems(headers, &format!("{path}.headers")));
            reserved = reserved_problems(
                headers
                    .iter()
                    .map(|h| h.name.as_str())
                    .chain(auth.as_ref().and_then(|a| a.header.as_deref())),
                &format!("{path}.headers"),
                objects_reserved,
            );
            if let Some(a) = auth
                && a.auth_type == crate::crd::AuthType::ApiKey
                && a.header.is_none()
            {
                spec_problems.push(format!("{path}.auth.header is required for type apiKey"));
            }
            if let Some(a) = auth
                && a.auth_type.is_oauth()
            {
                let kind = serde_json::to_value(a.auth_type)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                if path == "spec.http" {
                    spec_problems.push(format!(
                        "spec.http.auth.type {kind} is for MCP tools (spec.mcp)"
                    ));
                }
                if a.client_id.is_none() {
                    spec_problems.push(format!("{path}.auth.clientId is required for type {kind}"));
                }
            }
        }

        let accepted = if !reserved.is_empty() {
            Desired::fail(
                types::ACCEPTED,
                reasons::RESERVED_HEADER,
                reserved.join("; "),
            )
        } else if !spec_problems.is_empty() {
            Desired::fail(
                types::ACCEPTED,
                reasons::INVALID_SPEC,
                spec_problems.join("; "),
            )
        } else if BUILTIN_TOOLS.contains(&name.as_str()) {
            Desired::fail(
                types::ACCEPTED,
                reasons::NAME_CONFLICT,
                format!("tool name {name} is a built-in tool"),
            )
        } else if let Some(owner) = taken.get(&(key.namespace.clone(), name.clone())) {
            Desired::fail(
                types::ACCEPTED,
                reasons::NAME_CONFLICT,
                format!("tool name {name} is already used by KortexTool {owner}"),
            )
        } else {
            taken.insert((key.namespace.clone(), name.clone()), key.clone());
            Desired::ok(
                types::ACCEPTED,
                reasons::ACCEPTED,
                format!("tool name {name}"),
            )
        };

        let refs = spec.secret_refs();
        let (values, secret_cond) = resolve_all(secrets, &key.namespace, &refs);
        let endpoint = match (&spec.http, &spec.mcp) {
            (Some(h), _) => Some(("spec.http.url", h.url.as_str())),
            (None, Some(m)) => Some(("spec.mcp.url", m.url.as_str())),
            (None, None) => None,
        };
        let refused = endpoint.and_then(|(path, url)| {
            egress_refusal(egress, url, spec.allow_private_targets).map(|r| format!("{path} {r}"))
        });
        let ready = if !accepted.status {
            Desired::fail(types::READY, accepted.reason, accepted.message.clone())
        } else if !secret_cond.status {
            Desired::fail(
                types::READY,
                reasons::SECRET_NOT_RESOLVED,
                format!("unavailable: {}", secret_cond.message),
            )
        } else if let Some(refused) = refused {
            Desired::fail(
                types::READY,
                reasons::EGRESS_REFUSED,
                format!("{refused}; nothing is contacted"),
            )
        } else {
            Desired::ok(types::READY, reasons::AVAILABLE, "tool available")
        };
        let available = ready.status;
        let previous = t.status.as_ref();
        let exposed = if !accepted.status {
            Vec::new()
        } else if spec.http.is_some() {
            vec![name.clone()]
        } else {
            // MCP tools are discovered by connecting to the server; keep what was found.
            previous.map(|s| s.tools.clone()).unwrap_or_default()
        };
        let generation = t.metadata.generation;
        let conditions = conditions::merge(
            previous
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
            &[accepted, secret_cond, ready],
            generation,
            now,
        );
        let mut object = t.clone();
        object.status = Some(KortexToolStatus {
            observed_generation: generation,
            conditions,
            tools: exposed,
        });
        out.insert(
            key,
            ToolEntry {
                object,
                tool_name: name,
                available,
                secrets: values,
            },
        );
    }
    out
}

/// Headers a resource may not send (see [`RESERVED_HEADERS`]).
fn reserved_problems<'a>(
    names: impl Iterator<Item = &'a str>,
    path: &str,
    extra: &[String],
) -> Vec<String> {
    names
        .filter(|n| reserved_header(n, extra))
        .map(|n| {
            format!(
                "{path}: header {n} is reserved (it carries an identity that proxies or the API server trust, or marks Kortex's own requests); Kortex never sends it for a resource"
            )
        })
        .collect()
}

/// The one-of rule of header specs (also a CEL rule of the CRD).
fn header_problems(headers: &[crate::crd::HeaderSpec], path: &str) -> Vec<String> {
    headers
        .iter()
        .enumerate()
        .filter(|(_, h)| h.value.is_some() == h.value_from.is_some())
        .map(|(i, _)| format!("{path}[{i}]: exactly one of value or valueFrom must be set"))
        .collect()
}

fn valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= 48
}

// Long because a ChatPolicy's validation: one check per field of the kind, each with its own
// condition reason.
fn compile_policy(
    p: &ChatPolicy,
    providers: &BTreeMap<ObjectKey, ProviderEntry>,
    secrets: &SecretIndex<'_>,
    now: jiff::Timestamp,
) -> PolicyEntry {
    let ns = p.namespace().unwrap_or_else(|| "default".into());
    let spec = &p.spec;
    let mut missing = Vec::new();
    let mut not_local = Vec::new();
    let mut unavailable = Vec::new();
    let mut usable = Vec::new();

    let mut named: Vec<&str> = vec![spec.provider.as_str()];
    named.extend(spec.fallback_providers.iter().map(String::as_str));
    for (_, model) in spec.models.iter() {
        // `provider/model` pins a provider; a model id may itself contain '/', so only a
        // prefix naming a provider of this namespace counts as a pin.
        if let Some((provider, _)) = model.split_once('/')
            && providers.contains_key(&ObjectKey::new(&ns, provider))
        {
            named.push(provider);
        }
    }
    let mut seen = BTreeSet::new();
    for name in named {
        if !seen.insert(name) {
            continue;
        }
        match providers.get(&ObjectKey::new(&ns, name)) {
            None => missing.push(name.to_owned()),
            Some(entry)
                if spec.mode == PolicyMode::LocalOnly && entry.locality() != Locality::Local =>
            {
                not_local.push(name.to_owned())
            }
            Some(entry) if !entry.available => {
                let why = entry
                    .object
                    .status
                    .as_ref()
                    .and_then(|s| conditions::find(&s.conditions, types::READY))
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                unavailable.push(format!("{name} ({why})"));
            }
            Some(_) => usable.push(name.to_owned()),
        }
    }

    let skipped_cloud = || {
        format!(
            "mode local-only skips cloud LLMProvider {}",
            not_local.join(", ")
        )
    };
    let retention = spec
        .retention
        .as_ref()
        .map(crate::crd::Retention::parsed)
        .transpose();
    let ready = if let Err(e) = &retention {
        Desired::fail(types::READY, reasons::INVALID_SPEC, e.clone())
    } else if !missing.is_empty() {
        Desired::fail(
            types::READY,
            reasons::PROVIDER_NOT_FOUND,
            format!(
                "LLMProvider {} not found in namespace {ns}",
                missing.join(", ")
            ),
        )
    } else if usable.is_empty() && unavailable.is_empty() {
        Desired::fail(
            types::READY,
            reasons::PROVIDER_NOT_LOCAL,
            format!(
                "mode local-only, but LLMProvider {} has locality cloud",
                not_local.join(", ")
            ),
        )
    } else if usable.is_empty() {
        let mut message = format!("no usable provider: {}", unavailable.join("; "));
        if !not_local.is_empty() {
            message = format!("{message}; {}", skipped_cloud());
        }
        Desired::fail(types::READY, reasons::PROVIDER_UNAVAILABLE, message)
    } else {
        let mut message = format!("providers {} available", usable.join(", "));
        if !unavailable.is_empty() {
            message = format!("{message}; unavailable: {}", unavailable.join("; "));
        }
        if !not_local.is_empty() {
            message = format!("{message}; {}", skipped_cloud());
        }
        if let Ok(Some(windows)) = &retention
            && let Some(audit) = windows.audit
            && !audit.is_zero()
            && audit < crate::crd::AUDIT_MIN
        {
            message = format!("{message}; retention.audit is raised to the minimum 30d");
        }
        Desired::ok(types::READY, reasons::AVAILABLE, message)
    };
    let available = ready.status;
    let (notify, notify_condition) = compile_notify(spec, &ns, secrets);
    let (triggers, triggers_condition) = compile_triggers(spec);
    let (gitops, gitops_condition) = compile_gitops(spec, &ns, secrets);
    let (slack, slack_condition) = compile_slack(spec, &ns, secrets);
    let generation = p.metadata.generation;
    let mut desired = vec![ready];
    desired.extend(notify_condition);
    desired.extend(triggers_condition);
    desired.extend(gitops_condition);
    desired.extend(slack_condition);
    let conditions = conditions::merge(
        p.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default(),
        &desired,
        generation,
        now,
    );
    let mut object = p.clone();
    object.status = Some(ChatPolicyStatus {
        observed_generation: generation,
        conditions,
    });
    PolicyEntry {
        object,
        available,
        notify,
        triggers,
        gitops,
        slack,
    }
}

/// A policy's Slack app with its Secrets read, and its `Slack` condition (none without
/// `spec.slack`): `False` naming the Secret that did not resolve.
fn compile_slack(
    spec: &crate::crd::ChatPolicySpec,
    namespace: &str,
    secrets: &SecretIndex<'_>,
) -> (Option<SlackResolved>, Option<Desired>) {
    let Some(slack) = &spec.slack else {
        return (None, None);
    };
    let token = secrets.resolve(namespace, &slack.bot_token_secret_ref);
    let signing = secrets.resolve(namespace, &slack.signing_secret_ref);
    match (token, signing) {
        (Ok(bot_token), Ok(signing_secret)) => {
            let channels = if slack.channels.is_empty() {
                "every channel the app is in".to_owned()
            } else {
                format!("channels {}", slack.channels.join(", "))
            };
            (
                Some(SlackResolved {
                    spec: slack.clone(),
                    bot_token,
                    signing_secret,
                }),
                Some(Desired::ok(
                    types::SLACK,
                    reasons::LISTENING,
                    format!(
                        "requests of workspace {} are verified and taken ({channels})",
                        slack.team_id
                    ),
                )),
            )
        }
        (Err(p), _) | (_, Err(p)) => (
            None,
            Some(Desired::fail(
                types::SLACK,
                p.reason,
                format!("spec.slack: {}", p.message),
            )),
        ),
    }
}

/// `url` without the user info of its authority (`https://TOKEN@host/x` → `https://host/x`).
fn without_user(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// A policy's GitOps repositories with their Secrets read, and its `GitOps` condition
/// (none without repositories): `False` naming each repository that cannot be written to
/// (a Secret not resolved, a URL with credentials in it, an SSH URL without `knownHosts`).
fn compile_gitops(
    spec: &crate::crd::ChatPolicySpec,
    namespace: &str,
    secrets: &SecretIndex<'_>,
) -> (Vec<RepositoryResolved>, Option<Desired>) {
    let repositories = spec
        .gitops
        .as_ref()
        .map(|g| g.repositories.as_slice())
        .unwrap_or_default();
    if repositories.is_empty() {
        return (Vec::new(), None);
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut reason = reasons::INVALID_SPEC;
    for r in repositories {
        let ssh = r.url.starts_with("ssh://") || (!r.url.contains("://") && r.url.contains('@'));
        let parsed = url::Url::parse(&r.url).ok().filter(|_| !ssh);
        let shape = if parsed
            .as_ref()
            .is_some_and(|u| !u.username().is_empty() || u.password().is_some())
        {
            Err("the URL carries user info (a token?): put the token in secretRef".to_owned())
        } else if ssh && r.known_hosts.as_deref().is_none_or(|k| k.trim().is_empty()) {
            Err("an SSH URL needs knownHosts (host keys are never accepted blindly)".to_owned())
        } else if !ssh && !r.url.starts_with("https://") && !r.url.starts_with("http://") {
            Err("the URL must be https://, http://, ssh:// or git@host:path".to_owned())
        } else if r.url.starts_with("http://") && r.secret_ref.is_some() && !r.allow_private_targets
        {
            Err("a token is sent over https only (http:// is for a Git server on a private network: allowPrivateTargets)".to_owned())
        } else {
            Ok(())
        };
        let secret = r
            .secret_ref
            .as_ref()
            .map(|s| secrets.resolve(namespace, s))
            .transpose()
            .map_err(|p| {
                reason = p.reason;
                p.message
            });
        match (shape, secret) {
            (Ok(()), Ok(secret)) => out.push(RepositoryResolved {
                spec: r.clone(),
                secret,
            }),
            // Shown without user info: what is refused may be a token.
            (Err(e), _) | (_, Err(e)) => problems.push(format!("{}: {e}", without_user(&r.url))),
        }
    }
    let ready = (
        reasons::REPOSITORIES_READY,
        format!(
            "{} repositor{} ready",
            out.len(),
            if out.len() == 1 { "y" } else { "ies" }
        ),
    );
    let condition = ready_unless(types::GIT_OPS, ready, reason, &problems);
    (out, Some(condition))
}

/// A policy's notification targets with their Secrets read, and its `Notify` condition
/// (none without targets): `False` naming each target that cannot send (a Secret not
/// resolved, a URL missing or given twice).
fn compile_notify(
    spec: &crate::crd::ChatPolicySpec,
    namespace: &str,
    secrets: &SecretIndex<'_>,
) -> (Vec<NotifyResolved>, Option<Desired>) {
    if spec.notify.is_empty() {
        return (Vec::new(), None);
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut reason = reasons::INVALID_SPEC;
    for t in &spec.notify {
        let url = match (&t.webhook.url, &t.webhook.url_secret_ref) {
            (Some(url), None) => Ok(SecretValue::new(url.as_str())),
            (None, Some(r)) => secrets.resolve(namespace, r).map_err(|p| {
                reason = p.reason;
                p.message
            }),
            _ => Err("exactly one of webhook.url and webhook.urlSecretRef must be set".into()),
        };
        let signing = t
            .signing_secret_ref
            .as_ref()
            .map(|r| secrets.resolve(namespace, r))
            .transpose()
            .map_err(|p| {
                reason = p.reason;
                p.message
            });
        match (url, signing) {
            (Ok(url), Ok(signing)) => out.push(NotifyResolved {
                target: t.clone(),
                url,
                signing,
            }),
            (Err(e), _) | (_, Err(e)) => problems.push(format!("{}: {e}", t.name)),
        }
    }
    let ready = (
        reasons::READY_TO_SEND,
        format!("{} target(s) ready to send", out.len()),
    );
    let condition = ready_unless(types::NOTIFY, ready, reason, &problems);
    (out, Some(condition))
}

#[cfg(test)]
mod tests;
