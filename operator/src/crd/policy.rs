//! `ChatPolicy`: which sessions get which provider, models, tools, budget, privacy and
//! proposal rights.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::core::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Rules for the chat sessions whose names match `sessions`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kortex.dev",
    version = "v1alpha1",
    kind = "ChatPolicy",
    plural = "chatpolicies",
    singular = "chatpolicy",
    namespaced,
    doc = "Which provider, models, tools, budget and proposal rights chat sessions get.",
    status = "ChatPolicyStatus",
    shortname = "cpol",
    category = "kortex",
    printcolumn = r#"{"name":"Sessions","type":"string","jsonPath":".spec.sessions"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","priority":1,"jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ChatPolicySpec {
    /// Globs (`*`, `?`) over session names. The most specific match governs a session.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 253)))]
    pub sessions: Vec<String>,
    /// Tie-breaker between equally specific matches: higher wins.
    #[serde(default)]
    pub priority: i32,
    /// Name of the `LLMProvider` (same namespace) that answers.
    #[schemars(length(min = 1, max = 253))]
    pub provider: String,
    /// Providers tried, in order, when `provider` fails before any output reached the user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 253)))]
    pub fallback_providers: Vec<String>,
    /// `normal`, `frugal` (fast model first) or `local-only` (only `locality: local`).
    #[serde(default)]
    pub mode: PolicyMode,
    /// Models per role; each is a model id or `provider/model`.
    #[serde(default, skip_serializing_if = "ModelRoles::is_empty")]
    pub models: ModelRoles,
    /// Provider round-trips allowed per run before the answer must be given.
    #[serde(default = "default_max_tool_depth")]
    #[schemars(range(min = 1, max = 64))]
    pub max_tool_depth: u32,
    /// Extra instructions appended to the system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub system_prompt: Option<String>,
    /// Which tools sessions may call.
    #[serde(default)]
    pub tools: ToolRules,
    /// Spending and rate limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Rate limits of the gateway calls under this policy, all its keys together
    /// (`docs/gateway.md#rate-limits`); a key's Secret may set its own as annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimits>,
    /// Redaction of what is sent to providers and stored.
    #[serde(default)]
    pub privacy: Privacy,
    /// Cluster mode: Kubernetes tools use the signed-in user's own token.
    #[serde(default = "default_true")]
    pub run_tools_as_user: bool,
    /// What models may propose, and what happens on approval.
    #[serde(default)]
    pub proposals: ProposalRules,
    /// How people may steer a running investigation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_control: Option<RunControl>,
    /// How long what sessions under this policy store is kept (unset fields: the server's
    /// `--retention-*` flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Where events of this policy's sessions are sent (`docs/notifications.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub notify: Vec<NotifyTarget>,
    /// What this policy's chat runs and gateway calls put into traces
    /// (`docs/observability.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
    /// Investigations this policy starts on its own: when an alert arrives from
    /// Alertmanager, or on a schedule (`docs/triggers.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), schema_with = "triggers_schema")]
    pub triggers: Vec<Trigger>,
    /// Git repositories Kortex may write reviewed changes to, for targets Argo CD or Flux
    /// apply from Git (`docs/gitops.md`). Only repositories declared here are written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitOps>,
    /// Slack as a way in: the workspace's Kortex app, whose requests this policy takes
    /// (`docs/slack.md`): questions in threads, proposal buttons, `/kortex`, and the
    /// events it posts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<Slack>,
    /// Other agents' way in over the Agent2Agent protocol (`docs/a2a.md`): an Agent Card
    /// and an A2A v1.0 endpoint for this policy, whose callers are authenticated and
    /// checked as any API caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<A2a>,
}

/// This policy as an A2A agent (`spec.a2a`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct A2a {
    /// Serve the policy's Agent Card and A2A endpoint (default `false`: not reachable by
    /// agents).
    #[serde(default)]
    pub expose: bool,
    /// The agent's name on its card (default `Kortex <namespace>/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// What the agent is for, on its card (default: an incident investigator of the
    /// policy's clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2000))]
    pub description: Option<String>,
}

/// A workspace's Slack app (`spec.slack`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Slack {
    /// The workspace (team) id, `T…` (or an Enterprise Grid's `E…`): requests from any
    /// other workspace are refused.
    #[schemars(length(min = 2, max = 32), regex(pattern = r"^[TE][A-Z0-9]+$"))]
    pub team_id: String,
    /// Channel ids (`C…`, `G…`) the app listens in; empty: every channel it is in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(regex(pattern = r"^[CGD][A-Z0-9]+$")))]
    pub channels: Vec<String>,
    /// A Secret key holding the app's bot token (`xoxb-…`).
    pub bot_token_secret_ref: crate::crd::SecretKeyRef,
    /// A Secret key holding the app's signing secret: every request from Slack must be
    /// signed with it.
    pub signing_secret_ref: crate::crd::SecretKeyRef,
    /// Slack users mapped to people by hand (a Slack user not listed is known by the
    /// verified e-mail of their Slack profile).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub users: Vec<SlackUser>,
    /// What the app posts on its own, and where: alert investigations (each in a thread
    /// of its own, where people then ask), proposals waiting with their buttons, and the
    /// other events of `notify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post: Option<SlackPost>,
}

/// The events a Slack app posts (`spec.slack.post`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlackPost {
    /// The channel id (`C…`, `G…`) they go to; the app must be a member of it.
    #[schemars(length(min = 2, max = 32), regex(pattern = r"^[CG][A-Z0-9]+$"))]
    pub channel: String,
    /// The events posted, named as in `notify` (e.g. `investigation.started`,
    /// `investigation.finished`, `proposal.pending`). An event of a session that has a
    /// Slack thread goes into that thread.
    #[schemars(length(min = 1, max = 16))]
    pub events: Vec<NotifyEvent>,
}

/// A Slack user and the person (their single sign-on user name) they are.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlackUser {
    /// The Slack user id, `U…` or `W…`.
    #[schemars(length(min = 2, max = 32), regex(pattern = r"^[UW][A-Z0-9]+$"))]
    pub slack_user: String,
    /// Their user name, as single sign-on names them.
    #[schemars(length(min = 1, max = 253))]
    pub user: String,
}

/// Where GitOps-owned targets are changed: declared repositories, and how far Kortex follows
/// a change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOps {
    /// The repositories an approved proposal may change (by pull/merge request).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub repositories: Vec<GitRepository>,
    /// The namespace of Argo CD's `Application` objects (default `argocd`).
    #[serde(
        default,
        rename = "argoCDNamespace",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 63))]
    pub argo_cd_namespace: Option<String>,
    /// Whether a `rollback` may be a `git revert` of the commit that introduced the bad
    /// revision (default `false`: the image line is set back, one line).
    #[serde(default)]
    pub revert: bool,
    /// How long a change is followed (request open, then the sync) before the proposal
    /// fails, e.g. `24h` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_timeout: Option<Duration>,
}

/// One repository Kortex may write to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitRepository {
    /// The clone URL as Argo CD or Flux name it (`https://…`, `ssh://…` or `git@host:path`);
    /// compared without `.git`, a trailing slash, user info or case of the host.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// The token (HTTPS) or private key (SSH) Kortex pushes and calls the forge with; the
    /// Secret needs the label `kortex.dev/use: "true"` like every Secret Kortex reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<super::SecretKeyRef>,
    /// Which API opens the change request (`none`: the branch only).
    #[serde(default)]
    pub forge: Forge,
    /// The forge's API root when it is not the default for the host (GitHub Enterprise,
    /// a self-hosted GitLab or Gitea on another address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub api_url: Option<String>,
    /// The branch changes are proposed against (default: the Application's or
    /// GitRepository's revision when it is a branch, else `main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub base_branch: Option<String>,
    /// Only files under this directory may be changed (default: the whole repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path_prefix: Option<String>,
    /// `known_hosts` lines for an SSH URL (required with one: host keys are never
    /// accepted blindly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub known_hosts: Option<String>,
    /// Reach a repository or forge on a private address (as `allowPrivateTargets` of a
    /// KortexTool).
    #[serde(default)]
    pub allow_private_targets: bool,
}

/// A forge's change-request API.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Forge {
    /// GitHub (pull requests).
    #[default]
    Github,
    /// GitLab (merge requests).
    Gitlab,
    /// Gitea or Forgejo (pull requests).
    Gitea,
    /// Push the branch only.
    None,
}

impl Forge {
    /// As written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Github => "github",
            Self::Gitlab => "gitlab",
            Self::Gitea => "gitea",
            Self::None => "none",
        }
    }
}

/// The `triggers` list: a map keyed by `name` (the API server refuses two of one name).
fn triggers_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <Vec<Trigger>>::json_schema(generator);
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("maxItems".into(), 32.into());
        obj.insert("x-kubernetes-list-type".into(), "map".into());
        obj.insert(
            "x-kubernetes-list-map-keys".into(),
            serde_json::json!(["name"]),
        );
    }
    schema
}

/// An investigation started by an alert or a schedule, under this policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.alerts) != has(self.schedule)",
    "message": "exactly one of alerts and schedule must be set"
}]))]
pub struct Trigger {
    /// Its name within the policy (sessions, metrics and notifications name it).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Alerts from Alertmanager (`POST /api/v1/alerts/alertmanager`) this trigger takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertMatch>,
    /// Or a standing check on a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// The question the investigation starts with: text with `{{ field }}` placeholders
    /// (`docs/triggers.md#prompt`): `labels.NAME`, `annotations.NAME`, `status`,
    /// `startsAt`, `generatorURL`, `alerts`, `trigger`, `slot`. Values are inserted quoted;
    /// nothing in it runs.
    #[schemars(length(min = 1, max = 8192))]
    pub prompt: String,
    /// Whose rights the investigation's tools use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<RunAs>,
    /// Standalone: who may fire it (cluster mode: the RBAC verb `trigger` on this
    /// ChatPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers: Option<Callers>,
    /// How much it may run.
    #[serde(default)]
    pub limits: TriggerLimits,
    /// Names of this policy's `notify` targets that get its `investigation.finished` and
    /// `trigger.skipped` events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub notify: Vec<String>,
}

/// Which alerts a trigger takes: every label named must match.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct AlertMatch {
    /// Label name → value: an exact value, or `~REGEX` (a full match, e.g.
    /// `~critical|page`). Empty: every alert.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 32))]
    pub matchers: BTreeMap<String, String>,
}

/// When a scheduled trigger fires.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    /// A cron expression: five fields (minute hour day-of-month month day-of-week, e.g.
    /// `0 7 * * 1-5`), six with seconds first, or `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`, `@yearly`.
    #[schemars(length(min = 1, max = 256))]
    pub cron: String,
    /// The IANA time zone the expression is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
    /// A slot missed (Kortex was down) still runs, once, when Kortex sees it within this
    /// many seconds of its time (default 60, at most a week), as a CronJob's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub starting_deadline_seconds: Option<u32>,
}

/// Whose rights a triggered investigation's tools use. Exactly one, for the mode Kortex
/// runs in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunAs {
    /// Cluster mode: a ServiceAccount in the policy's namespace. Kortex asks the
    /// TokenRequest API for a short-lived token of it, and the Kubernetes tools run with
    /// that token, never with Kortex's own rights. It needs `use` on this ChatPolicy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Standalone: a user of the chat credentials Secrets; the session is theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub user: Option<String>,
}

/// Who may fire a trigger (standalone).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Callers {
    /// User names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub users: Vec<String>,
    /// Groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub groups: Vec<String>,
}

/// How much a trigger may run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TriggerLimits {
    /// Investigations started per rolling hour; past it an alert is recorded as
    /// `skipped` (default 20).
    #[serde(default = "default_runs_per_hour")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_runs_per_hour: u32,
    /// Investigations in flight at once; past it an alert waits its turn, in order
    /// (default 3).
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1, max = 100))]
    pub max_concurrent: u32,
}

impl Default for TriggerLimits {
    fn default() -> Self {
        Self {
            max_runs_per_hour: default_runs_per_hour(),
            max_concurrent: default_max_concurrent(),
        }
    }
}

fn default_runs_per_hour() -> u32 {
    20
}

fn default_max_concurrent() -> u32 {
    3
}

/// A policy's trace settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Telemetry {
    /// Record prompts, answers, tool arguments and tool results in the spans
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
    /// `gen_ai.tool.call.result`), after the policy's redaction. Off by default: spans carry
    /// only who, what, how long and how many tokens.
    #[serde(default)]
    pub capture_content: bool,
}

impl ChatPolicySpec {
    /// Whether spans may carry the conversation (`telemetry.captureContent`).
    pub fn captures_content(&self) -> bool {
        self.telemetry.as_ref().is_some_and(|t| t.capture_content)
    }
}

/// A notification target: which events go where, in which format.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyTarget {
    /// Name of the target within the policy (deliveries and metrics name it).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The events sent there.
    #[schemars(length(min = 1, max = 16))]
    pub events: Vec<NotifyEvent>,
    /// The webhook receiving them.
    pub webhook: Webhook,
    /// `slack` (a Slack incoming webhook's JSON) or `json` (Kortex's envelope, default).
    #[serde(default)]
    pub format: NotifyFormat,
    /// A Secret key whose value signs each `json` delivery: `X-Kortex-Signature:
    /// sha256=<hex HMAC-SHA256 of the body>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<crate::crd::SecretKeyRef>,
    /// At most one delivery to this target per this long (e.g. `1m`); the others wait
    /// their turn, in order. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval: Option<Duration>,
}

/// The URL of a webhook: written here, or read from a Secret (Slack's webhook URLs are
/// credentials). Exactly one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    /// The URL (`https://...`; `http://` only to a loopback address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: Option<String>,
    /// A Secret key holding the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret_ref: Option<crate::crd::SecretKeyRef>,
    /// As for a KortexTool: allow link-local and metadata addresses, the API server and
    /// (cluster mode) loopback, and send through `HTTPS_PROXY` when set. Kortex itself is
    /// never allowed.
    #[serde(default)]
    pub allow_private_targets: bool,
}

/// What can be notified.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum NotifyEvent {
    /// A proposal waits for a decision.
    #[serde(rename = "proposal.pending")]
    ProposalPending,
    /// A proposal was approved or rejected.
    #[serde(rename = "proposal.decided")]
    ProposalDecided,
    /// An approved proposal was carried out.
    #[serde(rename = "proposal.executed")]
    ProposalExecuted,
    /// Carrying out an approved proposal failed.
    #[serde(rename = "proposal.failed")]
    ProposalFailed,
    /// A proposal expired undecided.
    #[serde(rename = "proposal.expired")]
    ProposalExpired,
    /// A budget passed its `alertAtPercent`.
    #[serde(rename = "budget.alert")]
    BudgetAlert,
    /// A budget is used up: requests are refused until it resets.
    #[serde(rename = "budget.exhausted")]
    BudgetExhausted,
    /// A chat run failed.
    #[serde(rename = "run.failed")]
    RunFailed,
    /// A provider the policy uses became unavailable (not ready, or not answering).
    #[serde(rename = "provider.unavailable")]
    ProviderUnavailable,
    /// A session was handed over to someone (`docs/chat.md#hand-over`).
    #[serde(rename = "session.handover")]
    SessionHandover,
    /// A triggered investigation's run started (`docs/triggers.md`).
    #[serde(rename = "investigation.started")]
    InvestigationStarted,
    /// A triggered investigation ended (`docs/triggers.md`).
    #[serde(rename = "investigation.finished")]
    InvestigationFinished,
    /// A trigger recorded alerts it did not run (its limits, a budget); at most one an
    /// hour per trigger.
    #[serde(rename = "trigger.skipped")]
    TriggerSkipped,
}

impl NotifyEvent {
    /// As written in manifests and envelopes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProposalPending => "proposal.pending",
            Self::ProposalDecided => "proposal.decided",
            Self::ProposalExecuted => "proposal.executed",
            Self::ProposalFailed => "proposal.failed",
            Self::ProposalExpired => "proposal.expired",
            Self::BudgetAlert => "budget.alert",
            Self::BudgetExhausted => "budget.exhausted",
            Self::RunFailed => "run.failed",
            Self::ProviderUnavailable => "provider.unavailable",
            Self::SessionHandover => "session.handover",
            Self::InvestigationStarted => "investigation.started",
            Self::InvestigationFinished => "investigation.finished",
            Self::TriggerSkipped => "trigger.skipped",
        }
    }

    /// The event a proposal's move to `phase` is (none for `Executing`).
    pub fn of_proposal_phase(phase: super::ProposalPhase) -> Option<Self> {
        use super::ProposalPhase as P;
        match phase {
            P::Pending => Some(Self::ProposalPending),
            P::Approved | P::Rejected => Some(Self::ProposalDecided),
            P::Succeeded => Some(Self::ProposalExecuted),
            P::Failed => Some(Self::ProposalFailed),
            P::Expired => Some(Self::ProposalExpired),
            P::Executing => None,
        }
    }
}

/// Body format of a notification.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum NotifyFormat {
    /// `{id, type, time, data}`, optionally signed.
    #[default]
    Json,
    /// Slack incoming-webhook JSON (`text` and `blocks`).
    Slack,
}

impl ChatPolicySpec {
    /// The Secret keys this policy names (its notification targets', GitOps repositories'
    /// and Slack app's).
    pub fn secret_refs(&self) -> Vec<&crate::crd::SecretKeyRef> {
        self.notify
            .iter()
            .flat_map(|t| {
                t.webhook
                    .url_secret_ref
                    .iter()
                    .chain(t.signing_secret_ref.iter())
            })
            .chain(
                self.gitops
                    .iter()
                    .flat_map(|g| g.repositories.iter())
                    .filter_map(|r| r.secret_ref.as_ref()),
            )
            .chain(
                self.slack
                    .iter()
                    .flat_map(|s| [&s.bot_token_secret_ref, &s.signing_secret_ref]),
            )
            .collect()
    }
}

/// Retention of what a policy's sessions store: windows such as `90d`, `12h`, `30m`, or `0`
/// (kept forever).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// A session idle this long goes, with all it holds (default `90d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,5}[dhms])$"))]
    pub sessions: Option<String>,
    /// Events of a failed or cancelled run are kept this long (default `30d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,5}[dhms])$"))]
    pub failed_runs: Option<String>,
    /// Stored large tool results are kept this long (default `7d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,5}[dhms])$"))]
    pub tool_results: Option<String>,
    /// Per-call usage rows are kept this long; daily roll-ups stay (default `400d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,5}[dhms])$"))]
    pub usage: Option<String>,
    /// Audit rows are kept this long, at least `30d` (default `400d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,5}[dhms])$"))]
    pub audit: Option<String>,
    /// What one user may keep stored under this policy (messages, run events, tool
    /// results); past it their oldest sessions go first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_stored_bytes_per_user: Option<u64>,
}

/// Audit rows are kept at least this long.
pub const AUDIT_MIN: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// A retention window: `90d`, `12h`, `30m`, `45s` or `0` (forever).
pub fn parse_window(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a window like 90d, 12h or 30m (0: forever)"))?;
    let secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(format!("{s:?}: the unit is d, h, m or s (e.g. 90d)")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

/// A policy's retention windows, parsed (`None`: the server's flag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionWindows {
    /// `sessions`.
    pub sessions: Option<std::time::Duration>,
    /// `failedRuns`.
    pub failed_runs: Option<std::time::Duration>,
    /// `toolResults`.
    pub tool_results: Option<std::time::Duration>,
    /// `usage`.
    pub usage: Option<std::time::Duration>,
    /// `audit`.
    pub audit: Option<std::time::Duration>,
}

impl Retention {
    /// The windows set here, parsed; the first bad one is an error naming its field.
    pub fn parsed(&self) -> Result<RetentionWindows, String> {
        let one = |field: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(parse_window)
                .transpose()
                .map_err(|e| format!("spec.retention.{field}: {e}"))
        };
        Ok(RetentionWindows {
            sessions: one("sessions", &self.sessions)?,
            failed_runs: one("failedRuns", &self.failed_runs)?,
            tool_results: one("toolResults", &self.tool_results)?,
            usage: one("usage", &self.usage)?,
            audit: one("audit", &self.audit)?,
        })
    }
}

/// Run control: pause, resume, redirect.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunControl {
    /// A run paused, or waiting on its plan, is cancelled (with a notice) after this long.
    /// Default `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_timeout: Option<Duration>,
    /// Whether the model states a plan (`submit_plan`) before its first tool call: `off`
    /// (default), `preview` (shown, the run goes on) or `required` (the run waits for a
    /// person to approve, edit or reject it, and then calls only the plan's tools).
    #[serde(default)]
    pub planning: Planning,
}

/// Plan gate of a policy's chat runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum Planning {
    /// No plan.
    #[default]
    Off,
    /// The plan is shown and the run goes on.
    Preview,
    /// The run waits for the plan's approval.
    Required,
}

/// How long a paused run waits by default.
pub const PAUSED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

impl RunControl {
    /// How long a paused run waits before it is cancelled.
    pub fn paused_timeout(&self) -> std::time::Duration {
        self.paused_timeout
            .filter(|d| !d.is_negative())
            .map(std::time::Duration::from)
            .unwrap_or(PAUSED_TIMEOUT)
    }
}

fn default_max_tool_depth() -> u32 {
    8
}

fn default_true() -> bool {
    true
}

/// How the policy uses its providers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyMode {
    /// `provider` with the role's model, failing over to `fallbackProviders`.
    #[default]
    Normal,
    /// Each provider's `fastModel` first, the full model when that falls short.
    Frugal,
    /// Only providers with `locality: local`.
    LocalOnly,
}

impl PolicyMode {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Frugal => "frugal",
            Self::LocalOnly => "local-only",
        }
    }
}

/// Model per role: a model id, or `provider/model` to pin a provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRoles {
    /// Answers the chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub default: Option<String>,
    /// Classifies, e.g. whether a question needs tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub triage: Option<String>,
    /// Writes session titles and incident summaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub summarize: Option<String>,
}

impl ModelRoles {
    /// True when no role is set.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.triage.is_none() && self.summarize.is_none()
    }

    /// `(role, value)` for every role that is set.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("default", &self.default),
            ("triage", &self.triage),
            ("summarize", &self.summarize),
        ]
        .into_iter()
        .filter_map(|(role, v)| v.as_deref().map(|v| (role, v)))
    }
}

/// Tool allow and deny lists; deny beats allow.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolRules {
    /// Globs over tool names sessions may call.
    #[serde(default = "allow_all")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 253)))]
    pub allow: Vec<String>,
    /// Globs over tool names sessions may not call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 253)))]
    pub deny: Vec<String>,
    /// Per-tool timeouts, within each tool's hard ceiling.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timeouts: BTreeMap<String, Duration>,
}

impl Default for ToolRules {
    fn default() -> Self {
        Self {
            allow: allow_all(),
            deny: Vec::new(),
            timeouts: BTreeMap::new(),
        }
    }
}

fn allow_all() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Requests and tokens per minute (a window per clock minute, shared by every replica).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimits {
    /// Calls per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute: each call's estimated input when it starts, its output when it
    /// ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<u64>,
}

/// Spending and rate limits; every limit is optional.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// USD per UTC day for all sessions and gateway keys of this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub daily_usd_limit: Option<f64>,
    /// Runs and gateway calls per user per UTC hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub per_user_hourly_requests: Option<u32>,
    /// Tokens (input + output) per session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub per_session_token_cap: Option<u64>,
    /// Runs of this policy's sessions in flight at once, over all replicas; another gets
    /// 429 `too_many_runs` until one ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_runs: Option<u32>,
    /// A notice is sent when this share of a limit is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub alert_at_percent: Option<u8>,
}

/// Redaction settings. Values of resolved Secrets are always redacted, whatever is set here.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Privacy {
    /// Also detect other credentials by pattern (tokens, keys, passwords).
    #[serde(default = "default_true")]
    pub redact_secrets: bool,
    /// Detect personal data (e-mail addresses, phone numbers, ...).
    #[serde(default)]
    pub redact_pii: bool,
}

impl Default for Privacy {
    fn default() -> Self {
        Self {
            redact_secrets: true,
            redact_pii: false,
        }
    }
}

/// What models may propose, and what Kortex does once a human approved.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposalRules {
    /// An undecided proposal expires after this long.
    #[serde(default = "default_expire_after")]
    pub expire_after: Duration,
    /// Verbs models may propose; Kortex executes only `restart`, `scale` and `rollback`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 63)))]
    pub allowed_actions: Vec<String>,
    /// Globs over target namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub allowed_namespaces: Vec<String>,
    /// `false`: approved proposals stop at `Approved` for other automation.
    #[serde(default = "default_true")]
    pub execute: bool,
    /// The proposing session's user may not decide.
    #[serde(default = "default_true")]
    pub require_distinct_approver: bool,
    /// If set, only members of these groups may decide.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub approver_groups: Vec<String>,
}

fn default_expire_after() -> Duration {
    Duration::from(std::time::Duration::from_secs(600))
}

impl Default for ProposalRules {
    fn default() -> Self {
        Self {
            expire_after: default_expire_after(),
            allowed_actions: Vec::new(),
            allowed_namespaces: Vec::new(),
            execute: true,
            require_distinct_approver: true,
            approver_groups: Vec::new(),
        }
    }
}

/// Observed state of a `ChatPolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatPolicyStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, with e.g. reason `ProviderNotFound`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
}
