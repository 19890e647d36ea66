//! Rows as the rest of Kortex sees them. JSON columns are `serde_json::Value` here and
//! TEXT in the database.

use serde::Serialize;
use serde_json::Value;

/// The state of a session (`chat_sessions.status`, and `status` in the API; the serde names
/// are those strings). A session takes a new message only when `idle` or `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// No run; a message starts one.
    Idle,
    /// A run is taking steps (or being cancelled).
    Running,
    /// Its run waits for a client's tool results.
    RequiresAction,
    /// Its run is parked by a pause.
    Paused,
    /// Its run is parked until a person decides its plan.
    AwaitingPlan,
    /// Its last run failed; a message starts another.
    Failed,
}

impl SessionState {
    /// Every state.
    pub const ALL: [Self; 6] = [
        Self::Idle,
        Self::Running,
        Self::RequiresAction,
        Self::Paused,
        Self::AwaitingPlan,
        Self::Failed,
    ];

    /// As stored and sent.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
            Self::RequiresAction => "requires_action",
            Self::Paused => "paused",
            Self::AwaitingPlan => "awaiting_plan",
            Self::Failed => "failed",
        }
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for SessionState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A chat session.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// Id (UUID v7).
    pub id: String,
    /// Name chosen by the user; policies match on it.
    pub name: String,
    /// Namespace the session's policy, providers and tools resolve in.
    pub namespace: String,
    /// Owner.
    pub user: String,
    /// Governing ChatPolicy at the last run.
    pub policy: Option<String>,
    /// Its state.
    pub status: SessionState,
    /// Title written by the summarize model.
    pub title: Option<String>,
    /// Client-executed tools declared at creation.
    pub dynamic_tools: Value,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
    /// `namespace/policy/trigger` of the trigger that started it (`docs/triggers.md`): its
    /// policy governs it, whatever its name matches.
    pub trigger: Option<String>,
}

/// What creating a session needs.
#[derive(Clone, Debug)]
pub struct NewSession {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Owner.
    pub user: String,
    /// Governing policy.
    pub policy: Option<String>,
    /// Client-executed tools (a JSON array).
    pub dynamic_tools: Value,
}

/// A chat message.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageRecord {
    /// Id.
    pub id: String,
    /// Session.
    pub session_id: String,
    /// Order within the session.
    pub seq: i64,
    /// The run that produced it.
    pub run_id: Option<String>,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// Text.
    pub content: String,
    /// Tool calls of an assistant message (a JSON array).
    pub tool_calls: Option<Value>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// Whether a tool result is an error.
    pub is_error: bool,
    /// Unix ms.
    pub created_at: i64,
    /// A step a redirect rewound past: kept, but no longer sent to the model.
    pub superseded: bool,
    /// Who wrote it (user messages; a shared session has several authors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The provider (its resource name) that wrote an assistant message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model that wrote an assistant message, as the provider reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// What appending a message needs.
#[derive(Clone, Debug, Default)]
pub struct NewMessage {
    /// The run that produced it.
    pub run_id: Option<String>,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// Text.
    pub content: String,
    /// Tool calls (JSON array).
    pub tool_calls: Option<Value>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// Whether a tool result is an error.
    pub is_error: bool,
    /// Who wrote it (user messages).
    pub author: Option<String>,
    /// The provider that wrote it (assistant messages).
    pub provider: Option<String>,
    /// The model that wrote it (assistant messages).
    pub model: Option<String>,
}

/// One persisted SSE event.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    /// Session.
    pub session_id: String,
    /// Per-session sequence number (the SSE `id`).
    pub seq: i64,
    /// Run.
    pub run_id: Option<String>,
    /// SSE `event` name, e.g. `text.delta`.
    pub event_type: String,
    /// SSE `data`.
    pub data: Value,
    /// Unix ms.
    pub created_at: i64,
}

/// An audit row.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    /// Id.
    pub id: String,
    /// Unix ms.
    pub at: i64,
    /// `llm_call`, `tool_call`, `proposal`, `decision`, `failover`, ...
    pub kind: String,
    /// Namespace.
    pub namespace: Option<String>,
    /// Session.
    pub session_id: Option<String>,
    /// Run.
    pub run_id: Option<String>,
    /// Acting user.
    pub user: Option<String>,
    /// Governing policy.
    pub policy: Option<String>,
    /// What it was about (provider/model, tool name, proposal name).
    pub subject: String,
    /// `ok`, `error`, `denied`, ...
    pub outcome: String,
    /// Details (JSON object).
    pub detail: Value,
    /// The trace the row was written in (32 hex digits), when traces are on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// What recording an audit row needs.
#[derive(Clone, Debug, Default)]
pub struct NewDecision {
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: Option<String>,
    /// Session.
    pub session_id: Option<String>,
    /// Run.
    pub run_id: Option<String>,
    /// Acting user.
    pub user: Option<String>,
    /// Governing policy.
    pub policy: Option<String>,
    /// Subject.
    pub subject: String,
    /// Outcome.
    pub outcome: String,
    /// Details.
    pub detail: Value,
    /// The trace it belongs to; `None` takes the current span's (when traces are on).
    pub trace_id: Option<String>,
}

/// A page query over the audit log, newest first.
#[derive(Clone, Debug, Default)]
pub struct DecisionQuery {
    /// Only rows at or after this Unix ms.
    pub since: Option<i64>,
    /// Only this session.
    pub session_id: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Continue after this `(at, id)` (from the previous page's last row).
    pub before: Option<(i64, String)>,
    /// Page size.
    pub limit: i64,
}

/// One provider call's usage.
#[derive(Clone, Debug, Default)]
pub struct UsageEvent {
    /// Unix ms.
    pub at: i64,
    /// `chat` or `gateway`.
    pub source: String,
    /// Governing policy.
    pub policy: String,
    /// Session.
    pub session_id: Option<String>,
    /// User or gateway team.
    pub user: String,
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Input tokens.
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Cost in USD.
    pub cost_usd: f64,
    /// Latency.
    pub latency_ms: i64,
    /// `ok` or an error kind.
    pub outcome: String,
    /// The provider reported no usage: Kortex estimated it from the text.
    pub estimated: bool,
}

/// How to group usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageGroup {
    /// By provider.
    Provider,
    /// By model.
    Model,
    /// By user or team.
    User,
    /// By policy.
    Policy,
    /// By UTC day.
    Day,
}

/// One group of usage.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    /// Group value (provider, model, user, policy or `YYYY-MM-DD`).
    pub key: String,
    /// Calls.
    pub requests: i64,
    /// Input tokens.
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// USD.
    pub cost_usd: f64,
    /// Calls whose usage Kortex estimated (the provider reported none).
    #[serde(default)]
    pub estimated_requests: i64,
}

/// A stored proposal.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProposalRecord {
    /// Database id.
    pub id: String,
    /// Object name (`restart-api-x7k2p`).
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Proposing session.
    pub session_id: Option<String>,
    /// Its name.
    pub session_name: String,
    /// Its user.
    pub user: String,
    /// Governing policy.
    pub policy: Option<String>,
    /// Verb.
    pub action: String,
    /// Target object (JSON).
    pub target: Option<Value>,
    /// Parameters (JSON).
    pub params: Option<Value>,
    /// Why.
    pub rationale: String,
    /// What could be affected.
    pub blast_radius: Option<String>,
    /// Whether it can be undone.
    pub reversible: Option<bool>,
    /// Proposing provider.
    pub provider: Option<String>,
    /// Proposing model.
    pub model: Option<String>,
    /// Phase (stored and sent as its name, e.g. `Pending`).
    pub phase: crate::crd::ProposalPhase,
    /// The decision (JSON `{verdict, by, reason}`).
    pub decision: Option<Value>,
    /// Phase detail.
    pub message: Option<String>,
    /// Dry-run preview (JSON).
    pub preview: Option<Value>,
    /// Undo information (JSON).
    pub undo: Option<Value>,
    /// A Git change's branch, commit, request and state (JSON, `status.git` of the
    /// object), once delivered.
    #[serde(default)]
    pub git: Option<Value>,
    /// Unix ms.
    pub expires_at: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
    /// Optimistic-concurrency version, bumped by every update.
    pub version: i64,
}

/// A search of past incidents: every word must match (case-insensitive).
#[derive(Clone, Debug, Default)]
pub struct IncidentQuery {
    /// Up to [`IncidentQuery::MAX_WORDS`] words; more are ignored.
    pub words: Vec<String>,
    /// Only proposals of this namespace (the namespace of the object they act on).
    pub namespace: Option<String>,
    /// Only sessions of this namespace, and proposals raised by them (or by no session).
    pub session_namespace: Option<String>,
    /// Only sessions of this user (sessions are private to their user).
    pub user: Option<String>,
    /// Only proposals whose target mentions this (kind, name or namespace).
    pub target: Option<String>,
    /// Unix ms, inclusive.
    pub since: i64,
    /// Unix ms, exclusive.
    pub until: i64,
    /// Left out (the asking session).
    pub exclude_session: Option<String>,
    /// Most rows of each kind.
    pub limit: i64,
}

impl IncidentQuery {
    /// Words matched; the rest of a longer query is ignored.
    pub const MAX_WORDS: usize = 4;
}

/// A past session that matched.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IncidentSession {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Owner.
    pub user: String,
    /// Title, when one was written.
    pub title: Option<String>,
    /// The first question asked.
    pub question: Option<String>,
    /// The last answer given.
    pub last_answer: Option<String>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

/// What a transcript read back shows of a session's runs ([`crate::store::Store::run_notes`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunNotes {
    /// Trace id by run, for runs made while traces were on.
    pub traces: std::collections::HashMap<String, String>,
    /// Failed runs and why, oldest first.
    pub failed: Vec<(String, String)>,
}
