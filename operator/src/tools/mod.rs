//! The tool router: the tools a session may call (policy allow/deny applied before the list
//! is sent), argument validation against each tool's JSON Schema, default and hard timeouts
//! (policy overrides within the ceiling), result caps with large results kept server-side
//! for `read_result_chunk`, every failure (panics included) turned into an `isError` result
//! with an `errorKind`, one audit row and metrics per call. Every tool is a router tool:
//! the two that record something for a session (`propose_action`, `submit_plan`) are
//! registered by the chat engine and say so by their [`Effect`]. Imports `llm`, `store`,
//! `redact`, `egress` and below; never a room above (they reach tools through [`Tool`]).

pub mod admin_info;
mod chunks;
pub mod cluster;
pub mod guides;
mod history;
pub mod mcp;
pub mod mcp_oauth;
pub mod plugin_host;
pub mod plugin_http;
pub mod plugins;
pub mod prometheus;
pub mod window;

use crate::catalog::PolicyEntry;
use crate::llm::{BoxFuture, ToolCall, ToolSpec};
use crate::metrics::Metrics;
use crate::store::{NewDecision, SessionRecord, Store};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub use plugins::PluginSet;

pub use chunks::ReadResultChunk;

/// Default result cap (bytes): `--max-tool-result-bytes`.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 65_536;
/// After this long a still-running tool produces a notice.
pub const SLOW_NOTICE_AFTER: Duration = Duration::from_secs(30);

/// What a tool gets besides its arguments.
#[derive(Clone)]
pub struct ToolContext {
    /// The database.
    pub store: Store,
    /// The calling session.
    pub session: SessionRecord,
    /// The run.
    pub run_id: String,
    /// The call's id, as the model (or the MCP door) named it.
    pub call_id: String,
    /// Redacts the result: resolved Secret values, plus what the session's policy's
    /// `privacy` asks for.
    pub redactor: crate::redact::Redactor,
    /// Who the Kubernetes tools act as.
    pub kube: KubeIdentity,
    /// The guides of the tools the session may use (`list_tool_guides`, `get_tool_guide`).
    pub guides: Arc<[guides::Guide]>,
    /// Which door the call came in by (`chat` or `mcp`), for the audit row.
    pub via: &'static str,
    /// What the session runs under and who asked: what a tool that records something for
    /// the session (`propose_action`, `submit_plan`) checks and writes down.
    pub scope: Arc<CallerScope>,
    /// The chat user's own OAuth token, which an `oauthTokenExchange` MCP tool exchanges
    /// to call on their behalf (`None`: they signed in otherwise).
    pub on_behalf: Option<mcp_oauth::SubjectToken>,
    /// Set by a tool whose result is a person's decision (see [`ToolContext::hold`]).
    held: Arc<std::sync::atomic::AtomicBool>,
}

/// The part of a call's context that a read-only tool does not need: the session's policy,
/// who asked, and what else the step offered.
#[derive(Clone, Default)]
pub struct CallerScope {
    /// The session's policy (`None` only where a tool is called outside any session run,
    /// as in a tool's own tests).
    pub policy: Option<PolicyEntry>,
    /// Who asked: (provider, model) of a chat run, or (`mcp`, the client's name).
    pub model: (String, String),
    /// The names of the tools offered with this one (a plan may name only these).
    pub offered: Vec<String>,
}

impl ToolContext {
    /// A context for a call by `session` in `run_id`, through `via`.
    pub fn new(
        store: Store,
        session: SessionRecord,
        run_id: impl Into<String>,
        via: &'static str,
    ) -> Self {
        Self {
            store,
            session,
            run_id: run_id.into(),
            call_id: String::new(),
            redactor: Default::default(),
            kube: KubeIdentity::Kortex,
            guides: Arc::from(Vec::new()),
            via,
            scope: Arc::default(),
            on_behalf: None,
            held: Arc::default(),
        }
    }

    /// Says that the call's result is a person's decision: no result is written now, and
    /// the run waits for them (a plan under `planning: required`). Only a tool whose
    /// [`Tool::effect`] is [`Effect::Waits`] may hold its run.
    pub fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What a call does beyond reading, which decides when and through which doors it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// It only reads (every built-in and plugin tool): the step's reads run at once.
    Read,
    /// It records something for the session and changes nothing else (`propose_action`):
    /// it runs alone, before the step's reads; an MCP client sees it as not read-only.
    Records,
    /// It may leave the run waiting for a person (`submit_plan`): it runs alone, before
    /// the step's reads, and only where a run can wait (never over MCP, nor in a
    /// provider's own tool loop).
    Waits,
}

/// How a tool is offered under a policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Offer {
    /// As its spec, if the policy's `tools` allow/deny lets it through (the default).
    ByRules,
    /// Not offered under this policy.
    Never,
    /// Offered, as this spec: the policy shapes it (the actions it may propose) or makes
    /// it part of its run control (the plan gate), and has applied its rules already.
    As(ToolSpec),
}

/// Who the Kubernetes tools act as for a call.
#[derive(Clone, Default)]
pub enum KubeIdentity {
    /// Kortex's own client (standalone mode, or a policy with `runToolsAsUser: false`).
    #[default]
    Kortex,
    /// The session user's own client: their RBAC applies (`runToolsAsUser`).
    User(kube::Client),
    /// The policy runs tools as the user, who has no Kubernetes identity (why).
    Missing(String),
}

/// How a tool failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments are wrong (the model can correct itself).
    Validation(String),
    /// The arguments are wrong by the tool's own rules, which its message explains whole
    /// (shown as it is; `errorKind` `validation`).
    Invalid(String),
    /// The source the tool reads failed.
    Upstream(String),
    /// Not allowed.
    Denied(String),
    /// No result within the timeout.
    Timeout(String),
    /// A bug.
    Internal(String),
}

/// The default and hard timeouts of a tool that names none.
pub const DEFAULT_TIMEOUTS: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(60));

/// What a tool call gives back: a boxed future of its result or its error.
pub type ToolFuture = BoxFuture<'static, Result<String, ToolError>>;

/// A tool: read-only, but for the two that record something for the session (see
/// [`Effect`]).
pub trait Tool: Send + Sync {
    /// Name, description and JSON Schema of the arguments.
    fn spec(&self) -> ToolSpec;
    /// Whether it reads the Kubernetes API (and so acts as the session's identity).
    fn kubernetes(&self) -> bool {
        false
    }
    /// How it is offered under `policy`.
    fn offer(&self, _policy: &PolicyEntry) -> Offer {
        Offer::ByRules
    }
    /// What it does beyond reading.
    fn effect(&self) -> Effect {
        Effect::Read
    }
    /// Default and hard timeouts.
    fn timeouts(&self) -> (Duration, Duration) {
        DEFAULT_TIMEOUTS
    }
    /// Runs with validated arguments.
    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture;
}

/// The outcome of one call, as the model and the event stream see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The result (or the error message) for the model.
    pub content: String,
    /// Whether it failed.
    pub is_error: bool,
    /// `validation`, `timeout`, `upstream`, `denied` or `internal`.
    pub error_kind: Option<&'static str>,
    /// Whether the result was over the cap (and kept for `read_result_chunk`).
    pub truncated: bool,
    /// Wall time.
    pub duration: Duration,
    /// The result is a person's decision, still to come: nothing is written for the call
    /// now, and the run waits ([`ToolContext::hold`]).
    pub held: bool,
}

impl Outcome {
    /// A refusal before the call reached any tool (`kind` is its `errorKind`).
    pub fn refused(content: String, kind: &'static str, duration: Duration) -> Self {
        Self {
            content,
            is_error: true,
            error_kind: Some(kind),
            truncated: false,
            duration,
            held: false,
        }
    }
}

/// The tools of a process: the built-in ones, fixed at start, and the plugin tools of the
/// live configuration.
pub struct Router {
    tools: BTreeMap<String, Registered>,
    plugins: watch::Receiver<Arc<PluginSet>>,
    metrics: Arc<Metrics>,
    /// The largest result the model gets whole; larger ones are stored and indexed.
    result_cap: usize,
}

/// A tool with what is derived from it once: its spec and its compiled argument schema.
pub struct Registered {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    kubernetes: bool,
    validator: Result<jsonschema::Validator, String>,
}

impl Registered {
    /// Derives the spec and compiles the schema.
    pub fn new(tool: Arc<dyn Tool>) -> Self {
        let spec = tool.spec();
        let validator = jsonschema::validator_for(&spec.parameters).map_err(|e| e.to_string());
        Self {
            kubernetes: tool.kubernetes(),
            tool,
            spec,
            validator,
        }
    }

    /// What the model sees.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }
}

impl Router {
    /// The metrics the router counts into.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The built-in tools available everywhere, and no plugins.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let (_, plugins) = watch::channel(Arc::new(PluginSet::default()));
        let mut router = Self {
            tools: BTreeMap::new(),
            plugins,
            metrics,
            result_cap: DEFAULT_MAX_RESULT_BYTES,
        };
        router.add(Arc::new(ReadResultChunk));
        router.add(Arc::new(history::IncidentHistory));
        router.add(Arc::new(guides::ListToolGuides));
        router.add(Arc::new(guides::GetToolGuide));
        router
    }

    /// Results over `bytes` reach the model as an index to read in chunks
    /// (`--max-tool-result-bytes`).
    pub fn set_result_cap(&mut self, bytes: usize) {
        self.result_cap = bytes;
    }

    /// The largest result the model gets whole.
    pub fn result_cap(&self) -> usize {
        self.result_cap
    }

    /// Serves the plugin tools published on `plugins`.
    pub fn with_plugins(mut self, plugins: watch::Receiver<Arc<PluginSet>>) -> Self {
        self.plugins = plugins;
        self
    }

    /// Adds a built-in tool.
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        let registered = Registered::new(tool);
        self.tools.insert(registered.spec.name.clone(), registered);
    }

    /// The built-in tool named `name`.
    pub fn tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).map(|t| t.tool.clone())
    }

    /// The current plugin tools.
    pub fn plugins(&self) -> Arc<PluginSet> {
        self.plugins.borrow().clone()
    }

    /// Follows the plugin tools (a change may change what a session may use).
    pub fn watch_plugins(&self) -> watch::Receiver<Arc<PluginSet>> {
        self.plugins.clone()
    }

    /// The guides of `offered`, the tools a session of `namespace` may use.
    pub fn guides(&self, offered: &[ToolSpec], namespace: &str) -> Arc<[guides::Guide]> {
        guides::usable(offered, &self.plugins(), namespace).into()
    }

    /// The built-in tools' specs.
    pub fn builtin(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|t| &t.spec)
    }

    /// The tools `session` may call under `policy`: built-ins and the plugins of its
    /// namespace whose `allowedSessions` match its name, filtered by the policy.
    pub fn offered(
        &self,
        policy: &PolicyEntry,
        session: &SessionRecord,
        kube: &KubeIdentity,
    ) -> Vec<ToolSpec> {
        let rules = &policy.object.spec.tools;
        let plugins = self.plugins();
        let own = plugins
            .tools
            .get(&session.namespace)
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|p| crate::glob::any_matches(&p.allowed_sessions, &session.name))
            .map(|p| &p.registered.spec);
        // Without a Kubernetes identity to act as, the Kubernetes tools are not offered.
        let kube_ok = !matches!(kube, KubeIdentity::Missing(_));
        let mut offered: Vec<ToolSpec> = self
            .tools
            .values()
            .filter(|t| kube_ok || !t.kubernetes)
            .filter_map(|t| match t.tool.offer(policy) {
                Offer::ByRules => permitted(rules, &t.spec.name).then(|| t.spec.clone()),
                Offer::Never => None,
                // Shaped by the policy, which has applied its rules already.
                Offer::As(spec) => Some(spec),
            })
            .chain(own.filter(|s| permitted(rules, &s.name)).cloned())
            .collect();
        // The guide tools only when there is a guide to read.
        if guides::usable(&offered, &plugins, &session.namespace).is_empty() {
            offered.retain(|s| !guides::is_guide_tool(&s.name));
        }
        offered
    }

    /// Whether `name` is a built-in tool the policy offers as it shapes it ([`Offer::As`]):
    /// its own rules, not the policy's allow/deny, decide.
    fn shaped(&self, policy: &PolicyEntry, name: &str) -> bool {
        self.tools
            .get(name)
            .is_some_and(|t| matches!(t.tool.offer(policy), Offer::As(_)))
    }

    /// What calling `name` does beyond reading ([`Effect::Read`] for an unknown name).
    pub fn effect(&self, name: &str) -> Effect {
        self.tools
            .get(name)
            .map(|t| t.tool.effect())
            .unwrap_or(Effect::Read)
    }

    /// Runs one call under the policy. Never fails: every problem is an error result.
    /// `on_slow` is called once if the call takes longer than [`SLOW_NOTICE_AFTER`].
    // Long because one call's whole path under the policy (lookup, rules, approval, limits, timeouts,
    // redaction, audit); each step can end the call with its own error result.
    pub async fn execute(
        &self,
        ctx: ToolContext,
        call: &ToolCall,
        policy: &PolicyEntry,
        on_slow: impl std::future::Future<Output = ()>,
    ) -> Outcome {
        let started = Instant::now();
        let rules = &policy.object.spec.tools;
        let plugins = self.plugins();
        let plugin = plugins.get(&ctx.session.namespace, &call.name);
        let registered = self.tools.get(&call.name).or(plugin.map(|p| &p.registered));
        let result = match registered {
            None => Err(ToolError::Denied(format!("unknown tool {}", call.name))),
            Some(_)
                if plugin.is_some_and(|p| {
                    !crate::glob::any_matches(&p.allowed_sessions, &ctx.session.name)
                }) =>
            {
                Err(ToolError::Denied(format!(
                    "tool {} is not available to session {} (the KortexTool's allowedSessions)",
                    call.name, ctx.session.name
                )))
            }
            Some(registered) if registered.tool.offer(policy) == Offer::Never => {
                Err(ToolError::Denied(format!(
                    "tool {} is not offered under the session's policy",
                    call.name
                )))
            }
            Some(_) if !self.shaped(policy, &call.name) && !permitted(rules, &call.name) => {
                Err(ToolError::Denied(format!(
                    "tool {} is not allowed by the session's policy",
                    call.name
                )))
            }
            Some(registered) => match validate(&registered.validator, &call.input) {
                Err(e) => Err(e),
                Ok(()) => {
                    let (default, hard) = registered.tool.timeouts();
                    let timeout = rules
                        .timeouts
                        .get(&call.name)
                        .map(|d| std::time::Duration::from(*d))
                        .unwrap_or(default)
                        .min(hard);
                    run(
                        registered.tool.clone(),
                        ctx.clone(),
                        call.input.clone(),
                        timeout,
                        on_slow,
                    )
                    .await
                }
            },
        };
        let duration = started.elapsed();
        let held = result.is_ok() && ctx.held.load(std::sync::atomic::Ordering::SeqCst);
        let (content, is_error, error_kind) = match result {
            Ok(content) => (content, false, None),
            Err(ToolError::Validation(m)) => {
                (format!("invalid arguments: {m}"), true, Some("validation"))
            }
            Err(ToolError::Invalid(m)) => (m, true, Some("validation")),
            Err(ToolError::Upstream(m)) => (m, true, Some("upstream")),
            Err(ToolError::Denied(m)) => (m, true, Some("denied")),
            Err(ToolError::Timeout(m)) => (m, true, Some("timeout")),
            Err(ToolError::Internal(m)) => (m, true, Some("internal")),
        };
        let (content, redactions) = ctx.redactor.content(&content);
        // A chunk of a kept result is the way to read it: never capped again (it is at most
        // `chunks::CHUNK_BYTES`), whatever `--max-tool-result-bytes` says.
        let limit = if call.name == chunks::TOOL_NAME {
            usize::MAX
        } else {
            self.result_cap
        };
        let (content, truncated) = match cap(
            &ctx.store,
            &ctx.session.id,
            &call.id,
            &call.name,
            content,
            limit,
        )
        .await
        {
            Ok((content, true)) => {
                self.metrics.refused("tool_result_bytes");
                (content, true)
            }
            Ok(v) => v,
            Err(e) => (format!("the result could not be stored: {e}"), false),
        };
        let status = error_kind.unwrap_or("ok");
        self.metrics
            .tool_calls
            .get_or_create(&crate::metrics::ToolLabels {
                tool: call.name.clone(),
                status,
            })
            .inc();
        self.metrics
            .tool_duration
            .get_or_create(&crate::metrics::ToolNameLabel {
                tool: call.name.clone(),
            })
            .observe(
                duration.as_secs_f64(),
                crate::metrics::TraceExemplar::current(),
                None,
            );
        let _ = ctx
            .store
            .record_decision(&NewDecision {
                kind: "tool_call".into(),
                namespace: Some(ctx.session.namespace.clone()),
                session_id: Some(ctx.session.id.clone()),
                run_id: Some(ctx.run_id.clone()),
                user: Some(ctx.session.user.clone()),
                policy: policy.object.metadata.name.clone(),
                subject: call.name.clone(),
                outcome: status.to_owned(),
                detail: json!({"callId": call.id, "via": ctx.via, "durationMs": duration.as_millis() as u64, "truncated": truncated, "redactions": redactions}),
                trace_id: None,
            })
            .await;
        Outcome {
            content,
            is_error,
            error_kind,
            truncated,
            duration,
            held,
        }
    }
}

/// Whether a policy's `tools` rules let a session call `name`. The guide tools read only
/// Kortex's guides of tools the session may use anyway, so an allow list need not name
/// them; `deny` still removes them.
fn permitted(rules: &crate::crd::ToolRules, name: &str) -> bool {
    if guides::is_guide_tool(name) {
        !crate::glob::any_matches(&rules.deny, name)
    } else {
        crate::glob::allowed(&rules.allow, &rules.deny, name)
    }
}

/// Validates `input` against a tool's compiled JSON Schema; the message names every failing path.
fn validate(
    validator: &Result<jsonschema::Validator, String>,
    input: &Value,
) -> Result<(), ToolError> {
    let validator = validator
        .as_ref()
        .map_err(|e| ToolError::Internal(format!("the tool's own schema is invalid: {e}")))?;
    let errors: Vec<String> = validator
        .iter_errors(input)
        .map(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ToolError::Validation(errors.join("; ")))
    }
}

/// Runs the tool on its own task (so a panic becomes an error result), within `timeout`,
/// calling `on_slow` once after [`SLOW_NOTICE_AFTER`].
async fn run(
    tool: Arc<dyn Tool>,
    ctx: ToolContext,
    input: Value,
    timeout: Duration,
    on_slow: impl std::future::Future<Output = ()>,
) -> Result<String, ToolError> {
    // The tool's own task stays in the call's span (its requests carry the trace).
    let mut task = tokio::spawn(tracing::Instrument::instrument(
        tool.call(ctx, input),
        tracing::Span::current(),
    ));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline, on_slow);
    let slow = tokio::time::sleep(SLOW_NOTICE_AFTER);
    tokio::pin!(slow);
    let mut noticed = false;
    loop {
        tokio::select! {
            joined = &mut task => {
                return match joined {
                    Ok(r) => r,
                    Err(e) if e.is_panic() => Err(ToolError::Internal("internal error".into())),
                    Err(e) => Err(ToolError::Internal(format!("internal error: {e}"))),
                };
            }
            _ = &mut deadline => {
                task.abort();
                return Err(ToolError::Timeout(format!("no result within {}s (the tool's timeout)", timeout.as_secs_f64())));
            }
            _ = &mut slow, if !noticed => {
                noticed = true;
                (&mut on_slow).await;
            }
        }
    }
}

/// Results over `max` bytes are kept whole; the model gets an index to read them in chunks.
pub async fn cap(
    store: &Store,
    session_id: &str,
    call_id: &str,
    tool: &str,
    content: String,
    max: usize,
) -> Result<(String, bool), crate::store::StoreError> {
    if content.len() <= max {
        return Ok((content, false));
    }
    let id = store
        .put_tool_result(session_id, call_id, tool, &content)
        .await?;
    let chunks = chunks::count(&content, chunks::CHUNK_BYTES);
    // The index itself stays well under the cap.
    let preview: String = content.chars().take((max / 4).min(2000)).collect();
    let index = json!({
        "truncated": true,
        "resultId": id,
        "totalBytes": content.len(),
        "chunks": chunks,
        "chunkBytes": chunks::CHUNK_BYTES,
        "preview": preview,
        "hint": format!("The full result is too large to show at once. Call read_result_chunk with resultId {id} and chunk 0..{}.", chunks.saturating_sub(1)),
    });
    Ok((index.to_string(), true))
}
