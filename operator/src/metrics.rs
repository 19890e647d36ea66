//! Prometheus metrics (`kortex_*`), rendered in the text exposition format at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of `kortex_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success`, or `error` when some document could not be loaded.
    pub result: &'static str,
}

/// Labels of `kortex_config_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// Kind.
    pub kind: &'static str,
    /// `true` or `false`.
    pub available: &'static str,
}

/// Labels of `kortex_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Method.
    pub method: String,
    /// Matched route template (never the raw path, to keep cardinality bounded).
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// Labels of `kortex_tool_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Tool name.
    pub tool: String,
    /// `ok` or an error kind.
    pub status: &'static str,
}

/// Label of `kortex_tool_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolNameLabel {
    /// Tool name.
    pub tool: String,
}

/// Labels of provider-call metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LlmLabels {
    /// `LLMProvider` name.
    pub provider: String,
    /// Model id.
    pub model: String,
}

/// Labels of token counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// `LLMProvider` name.
    pub provider: String,
    /// Model id.
    pub model: String,
    /// `input` or `output`.
    pub direction: &'static str,
}

/// Labels of provider-call outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LlmCallLabels {
    /// `LLMProvider` name.
    pub provider: String,
    /// `ok` or an error kind.
    pub outcome: String,
}

/// A latency histogram whose buckets carry, when traces are on, the trace id of a recent
/// observation (an OpenMetrics exemplar: a dashboard jumps from a slow bucket to its trace).
pub type Latency = HistogramWithExemplars<TraceExemplar>;

/// The exemplar label of the latency histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    /// The trace id (32 hex digits) of the observation.
    pub trace_id: String,
}

impl TraceExemplar {
    /// The current span's trace id as an exemplar, when it is sampled.
    pub fn current() -> Option<Self> {
        crate::telemetry::trace::sampled_trace_id().map(|trace_id| Self { trace_id })
    }
}

/// Labels of `kortex_http_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Method.
    pub method: String,
    /// Matched route template.
    pub route: String,
}

fn tool_histogram() -> Latency {
    Latency::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0].into_iter())
}

fn llm_histogram() -> Latency {
    Latency::new(
        [
            0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
        ]
        .into_iter(),
    )
}

fn http_histogram() -> Latency {
    Latency::new(
        [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ]
        .into_iter(),
    )
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Configuration reloads by result.
    pub config_reloads: Family<ReloadLabels, Counter>,
    /// Manifest documents currently failing to load.
    pub config_errors: Gauge,
    /// Unix time of the last reload.
    pub config_last_reload: Gauge<f64, AtomicU64>,
    /// Objects served, by kind and availability.
    pub config_objects: Family<ObjectLabels, Gauge>,
    /// HTTP requests by route and status.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Tool calls by tool and status.
    pub tool_calls: Family<ToolLabels, Counter>,
    /// Tool call durations.
    pub tool_duration: Family<ToolNameLabel, Latency>,
    /// Provider call durations (chat runs and gateway calls), by provider and model.
    pub llm_duration: Family<LlmLabels, Latency>,
    /// HTTP request durations (until the response head), by method and route.
    pub http_duration: Family<RouteLabels, Latency>,
    /// Provider calls by provider and outcome.
    pub llm_calls: Family<LlmCallLabels, Counter>,
    /// Tokens by provider, model and direction.
    pub llm_tokens: Family<TokenLabels, Counter>,
    /// Spend in USD by provider and model.
    pub llm_cost: Family<LlmLabels, Counter<f64, AtomicU64>>,
    /// Failovers to a fallback provider, by the provider that failed.
    pub llm_failovers: Family<LlmLabels, Counter>,
    /// Calls refused by a budget.
    pub budget_refusals: Family<BudgetLabels, Counter>,
    /// Whether the last probe reached each available provider (1) or not (0); set when
    /// `/metrics` is scraped.
    pub provider_reachable: Family<ProviderLabel, Gauge>,
    /// Today's (UTC) spend of each policy with a `dailyUsdLimit`; set when scraped.
    pub budget_daily_spend: Family<PolicyLabel, Gauge<f64, AtomicU64>>,
    /// The `dailyUsdLimit` of each policy that has one; set when scraped.
    pub budget_daily_limit: Family<PolicyLabel, Gauge<f64, AtomicU64>>,
    /// Status writes (and proposal transitions) the leader could not make, by kind.
    pub reconcile_errors: Family<KindLabel, Counter>,
    /// Proposals moved by the leader, by the phase they reached.
    pub proposal_transitions: Family<PhaseLabel, Counter>,
    /// Whether the admission policy that authenticates decisions is enforced where Kortex
    /// executes (1) or not (0: approved proposals are not executed); set by the leader.
    pub admission_policy_enforced: Gauge,
    /// Unix time the leader's loop last came round (0: not leading).
    pub leader_loop_last_run: Gauge<f64, AtomicU64>,
    /// Requests and connections refused by a limit (`docs/reliability.md#limits`), by limit.
    pub limit_rejections: Family<LimitLabel, Counter>,
    /// Event streams (SSE) open at this replica, over all users.
    pub event_streams_open: Gauge,
    /// Rows deleted by retention, erasure and session deletion, by kind and reason.
    pub retention_deleted_rows: Family<DeletedLabel, Counter>,
    /// Notification attempts, by result.
    pub notifications: Family<ResultLabel, Counter>,
    /// Alert and schedule events of triggers, by policy, trigger and result.
    pub trigger_events: Family<TriggerLabel, Counter>,
    /// Requests from Slack, by result (`docs/slack.md`).
    pub slack_requests: Family<ResultLabel, Counter>,
}

/// Label of `kortex_trigger_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    /// `namespace/name` of the ChatPolicy (empty for `unmatched`).
    pub policy: String,
    /// The trigger's name (empty for `unmatched`).
    pub trigger: String,
    /// `received`, `unmatched`, `run`, `unchanged`, `resolved` or `skipped`.
    pub result: &'static str,
}

/// A leader loop that has not come round for this long fails the liveness probe.
pub const LEADER_STALL: std::time::Duration = std::time::Duration::from_secs(120);

/// Label of per-provider gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// `namespace/name` of the `LLMProvider`.
    pub provider: String,
}

/// Label of per-policy gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    /// `namespace/name` of the `ChatPolicy`.
    pub policy: String,
}

/// Label of `kortex_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// Kind of the object whose status could not be written (`reconcile_errors`).
    pub kind: &'static str,
}

/// Label of `kortex_notifications_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `delivered`, `retried`, `failed` (given up) or `dropped` (target removed).
    pub result: &'static str,
}

/// Label of `kortex_retention_deleted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeletedLabel {
    /// Kind of the rows deleted (`sessions`, `events`, `usage_events`, ...).
    pub kind: &'static str,
    /// Why: `retention`, `size_cap`, `session_deleted` or `erasure`.
    pub reason: &'static str,
}

/// Label of `kortex_proposal_transitions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The phase a proposal moved to.
    pub phase: &'static str,
}

/// Label of `kortex_limit_rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `request_bytes`, `header_bytes`, `header_timeout`, `streams_per_user`,
    /// `sessions_per_user` or `concurrent_runs`.
    pub limit: &'static str,
}

impl Metrics {
    /// Counts one refusal by `limit`.
    pub fn refused(&self, limit: &'static str) {
        self.limit_rejections
            .get_or_create(&LimitLabel { limit })
            .inc();
    }

    /// Counts `n` events of a trigger with `result`.
    pub fn trigger_event(&self, policy: &str, trigger: &str, result: &'static str, n: u64) {
        self.trigger_events
            .get_or_create(&TriggerLabel {
                policy: policy.to_owned(),
                trigger: trigger.to_owned(),
                result,
            })
            .inc_by(n);
    }

    /// Counts one request from Slack with `result`: `taken`, `duplicate` (a retried event
    /// already taken), `ignored` (not for Kortex: another channel, the app's own message),
    /// or `refused` (not signed by a configured app, stale, another workspace, malformed).
    pub fn slack_request(&self, result: &'static str) {
        self.slack_requests
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one notification attempt's `result`.
    pub fn notification(&self, result: &'static str) {
        self.notifications
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts `n` rows of `kind` deleted for `reason` (`retention`, `size_cap`,
    /// `session_deleted`, `erasure`).
    pub fn retention_deleted(&self, kind: &'static str, reason: &'static str, n: u64) {
        self.retention_deleted_rows
            .get_or_create(&DeletedLabel { kind, reason })
            .inc_by(n);
    }
}

/// Labels of budget refusals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    /// `namespace/name` of the policy.
    pub policy: String,
    /// `dailyUsdLimit`, `perUserHourlyRequests` or `perSessionTokenCap`.
    pub budget: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    // Long because the metric registry: one registration per metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kortex");
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let config_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration loads and reloads, by result",
            config_reloads.clone(),
        );
        let config_errors = Gauge::default();
        registry.register(
            "config_errors",
            "Manifest documents currently failing to load",
            config_errors.clone(),
        );
        let config_last_reload = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "config_last_reload_timestamp_seconds",
            "Unix time of the last configuration load",
            config_last_reload.clone(),
        );
        let config_objects = Family::<ObjectLabels, Gauge>::default();
        registry.register(
            "config_objects",
            "Objects served, by kind and availability",
            config_objects.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests, by route and status",
            http_requests.clone(),
        );
        let tool_calls = Family::<ToolLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls, by tool and status",
            tool_calls.clone(),
        );
        let tool_duration = Family::<ToolNameLabel, Latency>::new_with_constructor(
            tool_histogram as fn() -> Latency,
        );
        registry.register(
            "tool_duration_seconds",
            "Tool call durations",
            tool_duration.clone(),
        );
        let llm_duration =
            Family::<LlmLabels, Latency>::new_with_constructor(llm_histogram as fn() -> Latency);
        registry.register(
            "llm_call_duration_seconds",
            "Provider call durations (to the end of the answer), by provider and model",
            llm_duration.clone(),
        );
        let http_duration =
            Family::<RouteLabels, Latency>::new_with_constructor(http_histogram as fn() -> Latency);
        registry.register(
            "http_request_duration_seconds",
            "HTTP request durations (to the response head), by method and route",
            http_duration.clone(),
        );
        let llm_calls = Family::<LlmCallLabels, Counter>::default();
        registry.register(
            "llm_calls",
            "Provider calls, by provider and outcome",
            llm_calls.clone(),
        );
        let llm_tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "llm_tokens",
            "Tokens reported by providers, by provider, model and direction",
            llm_tokens.clone(),
        );
        let llm_cost = Family::<LlmLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "llm_cost_usd",
            "Spend in USD at the catalog prices, by provider and model",
            llm_cost.clone(),
        );
        let llm_failovers = Family::<LlmLabels, Counter>::default();
        registry.register(
            "llm_failovers",
            "Failovers away from a provider after a hard failure",
            llm_failovers.clone(),
        );
        let budget_refusals = Family::<BudgetLabels, Counter>::default();
        registry.register(
            "budget_refusals",
            "Calls and requests refused by a ChatPolicy budget",
            budget_refusals.clone(),
        );
        let provider_reachable = Family::<ProviderLabel, Gauge>::default();
        registry.register(
            "provider_reachable",
            "Whether the last probe reached the provider (1) or not (0), by provider",
            provider_reachable.clone(),
        );
        let budget_daily_spend = Family::<PolicyLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "budget_daily_spend_usd",
            "Spend today (UTC) of each ChatPolicy that has a dailyUsdLimit",
            budget_daily_spend.clone(),
        );
        let budget_daily_limit = Family::<PolicyLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "budget_daily_limit_usd",
            "The dailyUsdLimit of each ChatPolicy that has one",
            budget_daily_limit.clone(),
        );
        let reconcile_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Status writes and proposal transitions that failed (retried with backoff), by kind",
            reconcile_errors.clone(),
        );
        let proposal_transitions = Family::<PhaseLabel, Counter>::default();
        registry.register(
            "proposal_transitions",
            "ActionProposals moved by the leader, by the phase they reached",
            proposal_transitions.clone(),
        );
        let limit_rejections = Family::<LimitLabel, Counter>::default();
        registry.register(
            "limit_rejections",
            "Requests and connections refused by a limit, by limit",
            limit_rejections.clone(),
        );
        let retention_deleted_rows = Family::<DeletedLabel, Counter>::default();
        registry.register(
            "retention_deleted",
            "Rows deleted, by kind (sessions, messages, events, runs, tool_results, mcp_sessions, usage_events, decisions, notifications) and reason (retention, size_cap, session_deleted, erasure)",
            retention_deleted_rows.clone(),
        );
        let notifications = Family::<ResultLabel, Counter>::default();
        registry.register(
            "notifications",
            "Notification delivery attempts, by result (delivered, retried, failed: given up after 24 h, dropped: target removed)",
            notifications.clone(),
        );
        let trigger_events = Family::<TriggerLabel, Counter>::default();
        registry.register(
            "trigger_events",
            "Alert and schedule events of triggers, by policy, trigger and result (received; unmatched: alerts no trigger took; run; unchanged: nothing new in the group; resolved; skipped: limits or budget)",
            trigger_events.clone(),
        );
        let slack_requests = Family::<ResultLabel, Counter>::default();
        registry.register(
            "slack_requests",
            "Requests from Slack, by result (taken; duplicate: a retried event already taken; ignored: another channel or the app's own message; refused: unsigned, stale, another workspace or malformed)",
            slack_requests.clone(),
        );
        let event_streams_open = Gauge::default();
        registry.register(
            "event_streams_open",
            "Event streams (SSE) open at this replica",
            event_streams_open.clone(),
        );
        let admission_policy_enforced = Gauge::default();
        registry.register(
            "admission_policy_enforced",
            "Whether the admission policy that authenticates proposal decisions is enforced (1) or not (0: approved proposals are not executed)",
            admission_policy_enforced.clone(),
        );
        let leader_loop_last_run = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "leader_loop_last_run_timestamp_seconds",
            "When the leader's loop (statuses, proposals, executions) last came round; 0 when not leading",
            leader_loop_last_run.clone(),
        );
        registry.register(
            "trace_spans_dropped",
            "Trace spans dropped, by reason (queue_full: the exporter fell behind; export_failed: the collector refused them or could not be reached)",
            crate::telemetry::export::spans_dropped().clone(),
        );
        registry.register(
            "trace_spans_exported",
            "Trace spans the OTLP collector accepted",
            crate::telemetry::export::spans_exported().clone(),
        );
        Self {
            registry,
            retention_deleted_rows,
            notifications,
            trigger_events,
            slack_requests,
            event_streams_open,
            admission_policy_enforced,
            limit_rejections,
            leader_loop_last_run,
            provider_reachable,
            budget_daily_spend,
            budget_daily_limit,
            reconcile_errors,
            proposal_transitions,
            llm_calls,
            llm_tokens,
            llm_cost,
            llm_failovers,
            budget_refusals,
            config_reloads,
            config_errors,
            config_last_reload,
            config_objects,
            http_requests,
            tool_calls,
            tool_duration,
            llm_duration,
            http_duration,
        }
    }

    /// Records that the leader's loop came round at `at` (`None`: not leading).
    pub fn leader_heartbeat(&self, at: Option<jiff::Timestamp>) {
        self.leader_loop_last_run
            .set(at.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0));
    }

    /// Why the process should be restarted, if it should: the leader's loop stalled (a
    /// hung call or a deadlock) while the Lease, renewed elsewhere, keeps others out.
    pub fn stalled(&self, now: jiff::Timestamp, limit: std::time::Duration) -> Option<String> {
        let last = self.leader_loop_last_run.get();
        let age = now.as_millisecond() as f64 / 1000.0 - last;
        (last > 0.0 && age > limit.as_secs_f64())
            .then(|| format!("the leader's loop has not come round for {age:.0}s"))
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_leader_loop_fails_liveness() {
        let m = Metrics::new();
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let later = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        assert_eq!(m.stalled(later(999), LEADER_STALL), None, "not leading");
        m.leader_heartbeat(Some(t0));
        assert_eq!(m.stalled(later(60), LEADER_STALL), None);
        assert_eq!(
            m.stalled(later(121), LEADER_STALL).as_deref(),
            Some("the leader's loop has not come round for 121s")
        );
        m.leader_heartbeat(Some(later(121)));
        assert_eq!(m.stalled(later(122), LEADER_STALL), None);
        m.leader_heartbeat(None);
        assert_eq!(m.stalled(later(999), LEADER_STALL), None, "lost the lead");
        assert!(
            m.render()
                .contains("kortex_leader_loop_last_run_timestamp_seconds")
        );
    }
}
