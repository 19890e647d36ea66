//! Spans, their context across process boundaries (W3C `traceparent`/`tracestate`), and the
//! attribute names of the OpenTelemetry semantic conventions Kortex follows: HTTP server
//! spans (stable), and GenAI spans (v1.37: `invoke_agent`, `chat`, `embeddings`,
//! `execute_tool`) — see `docs/observability.md`.
//!
//! Every span is opened with a `*_span` helper here at the place the work happens, under
//! [`TARGET`]. When traces are off, the helpers return disabled spans (a no-op), and the
//! context helpers return nothing.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The `tracing` target of every span exported as a trace (and of nothing else).
pub const TARGET: &str = "kortex::trace";

static ENABLED: AtomicBool = AtomicBool::new(false);

pub(super) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether traces are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct Pairs<'a>(&'a mut Vec<(String, String)>);

impl Injector for Pairs<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// Makes `span` a child of the caller's trace when `headers` carry a valid `traceparent`
/// (with its `tracestate`). Call before the span is entered.
pub fn adopt_remote_parent(span: &Span, headers: &axum::http::HeaderMap) {
    if span.is_disabled() || !headers.contains_key("traceparent") {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Headers(headers));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Makes `span` continue the trace of a stored `traceparent` (a run taken up again).
pub fn continue_trace(span: &Span, traceparent: &str) {
    if span.is_disabled() {
        return;
    }
    let mut headers = axum::http::HeaderMap::new();
    if let Ok(v) = axum::http::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", v);
        adopt_remote_parent(span, &headers);
    }
}

/// `span`'s OpenTelemetry context, when traces are on and it has a valid one.
fn context_of(span: &Span) -> Option<opentelemetry::Context> {
    if !enabled() || span.is_disabled() {
        return None;
    }
    let cx = span.context();
    cx.span().span_context().is_valid().then_some(cx)
}

/// The current span's context as `traceparent` (and `tracestate`) headers, for an outgoing
/// request: providers, HTTP plugin tools, MCP servers.
pub fn inject(headers: &mut axum::http::HeaderMap) {
    if let Some(cx) = context_of(&Span::current()) {
        TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
    }
}

/// [`inject`] as name/value pairs (for clients that take headers that way).
pub fn headers() -> Vec<(String, String)> {
    pairs(&Span::current())
}

fn pairs(span: &Span) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(cx) = context_of(span) {
        TraceContextPropagator::new().inject_context(&cx, &mut Pairs(&mut out));
    }
    out
}

/// `span`'s trace id (32 hex digits), when traces are on.
pub fn trace_id(span: &Span) -> Option<String> {
    context_of(span).map(|cx| cx.span().span_context().trace_id().to_string())
}

/// The current span's trace id, when traces are on.
pub fn current_trace_id() -> Option<String> {
    trace_id(&Span::current())
}

/// The current span's trace id when the trace is sampled (exported): an exemplar's label.
pub fn sampled_trace_id() -> Option<String> {
    context_of(&Span::current())
        .filter(|cx| cx.span().span_context().is_sampled())
        .map(|cx| cx.span().span_context().trace_id().to_string())
}

/// `span`'s context as a `traceparent` value, to store and continue later.
pub fn traceparent(span: &Span) -> Option<String> {
    pairs(span)
        .into_iter()
        .find(|(k, _)| k == "traceparent")
        .map(|(_, v)| v)
}

/// The trace id of a stored `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let id = traceparent.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Marks `span` failed with `error.type` (the semantic conventions' low-cardinality class
/// of the error: `timeout`, `rate_limited`, `500`, ...).
pub fn fail(span: &Span, error_type: &str) {
    if span.is_disabled() {
        return;
    }
    span.record("error.type", error_type);
    span.record("otel.status_code", "ERROR");
}

/// The HTTP server span of one request (`{method} {route}`, server semantic conventions),
/// a child of the caller's `traceparent` when it sent one.
pub fn http_server_span(
    method: &str,
    route: &str,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "http",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = %route,
        url.path = %path,
        url.scheme = "http",
        http.response.status_code = tracing::field::Empty,
        user_agent.original = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if !span.is_disabled() {
        if let Some(agent) = headers
            .get(axum::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
        {
            span.record("user_agent.original", agent);
        }
        adopt_remote_parent(&span, headers);
    }
    span
}

/// Records the response status on an HTTP server span (5xx marks it failed).
pub fn http_status(span: &Span, status: u16) {
    if span.is_disabled() {
        return;
    }
    // Integers go in as i64: the bridge records other integers as text.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        fail(span, &status.to_string());
    }
}

/// A chat run: the GenAI `invoke_agent` span, the session as `gen_ai.conversation.id`.
pub fn run_span(parent: &Span, session_id: &str, run_id: &str, policy: Option<&str>) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "invoke_agent",
        otel.name = "invoke_agent kortex",
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = "kortex",
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.conversation.id = %session_id,
        kortex.run.id = %run_id,
        kortex.policy = policy.unwrap_or_default(),
        kortex.run.state = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// One step of a run (a provider call and the tool calls it asked for).
pub fn step_span(step: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        "step",
        otel.name = %format_args!("step {step}"),
        otel.kind = "internal",
        kortex.step = i64::from(step),
    )
}

/// What an LLM call span starts with.
pub struct LlmCall<'a> {
    /// `chat` or `embeddings`.
    pub operation: &'static str,
    /// The `LLMProvider`'s type (`openai`, `anthropic`, `ollama`, ...).
    pub provider_type: &'a str,
    /// The `LLMProvider`'s name.
    pub provider: &'a str,
    /// Model asked for.
    pub model: &'a str,
    /// Output token limit.
    pub max_tokens: Option<u32>,
    /// Whether the answer is streamed.
    pub streaming: bool,
    /// The endpoint's host and port (`server.address`, `server.port`).
    pub server: Option<(&'a str, u16)>,
}

/// A provider call: the GenAI client span `{operation} {model}`.
pub fn llm_span(call: &LlmCall<'_>) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "llm",
        otel.name = %format_args!("{} {}", call.operation, call.model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = call.operation,
        gen_ai.provider.name = %genai_provider(call.provider_type),
        gen_ai.request.model = %call.model,
        gen_ai.request.max_tokens = tracing::field::Empty,
        kortex.stream = call.streaming,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.input.messages = tracing::field::Empty,
        gen_ai.output.messages = tracing::field::Empty,
        gen_ai.system_instructions = tracing::field::Empty,
        kortex.provider = %call.provider,
        kortex.provider.type = %call.provider_type,
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some((host, port)) = call.server {
        span.record("server.address", host);
        span.record("server.port", i64::from(port));
    }
    if let Some(n) = call.max_tokens {
        span.record("gen_ai.request.max_tokens", i64::from(n));
    }
    span
}

/// What an LLM call ended with.
pub struct LlmEnd<'a> {
    /// Model that answered.
    pub model: &'a str,
    /// Tokens in.
    pub input_tokens: u64,
    /// Tokens out.
    pub output_tokens: u64,
    /// Why it stopped (`stop`, `tool_calls`, `length`, ...), when it did.
    pub finish_reason: Option<&'a str>,
    /// The error's kind, when it failed.
    pub error: Option<&'a str>,
}

/// Records the end of an LLM call.
pub fn llm_end(span: &Span, end: &LlmEnd<'_>) {
    if span.is_disabled() {
        return;
    }
    if !end.model.is_empty() {
        span.record("gen_ai.response.model", end.model);
    }
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", count(end.input_tokens));
    span.record("gen_ai.usage.output_tokens", count(end.output_tokens));
    if let Some(reason) = end.finish_reason {
        // A string array in the conventions: set on the OpenTelemetry span directly.
        span.set_attribute(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(opentelemetry::Array::String(vec![
                reason.to_owned().into(),
            ])),
        );
    }
    if let Some(e) = end.error {
        fail(span, e);
    }
}

/// The conventions' `gen_ai.provider.name` of a provider type.
/// A server speaking the OpenAI API is `openai` (the conventions: "set based on the
/// instrumentation's best knowledge" of the API used); its address tells which it is.
pub fn genai_provider(provider_type: &str) -> &str {
    match provider_type {
        "openai" | "openai-compatible" => "openai",
        "anthropic" | "claude-code" => "anthropic",
        "ollama" => "ollama",
        other => other,
    }
}

/// A tool call: the GenAI `execute_tool` span.
pub fn tool_span(name: &str, call_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// The leader reconciling one object's status (cluster mode): `reconcile {kind}`.
pub fn reconcile_span(kind: &'static str, namespace: &str, name: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "reconcile",
        otel.name = %format_args!("reconcile {kind}"),
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        k8s.namespace.name = %namespace,
        kortex.object.kind = kind,
        kortex.object.name = %name,
        error.type = tracing::field::Empty,
    )
}

/// An `ActionProposal` moving to `phase`.
pub fn proposal_span(namespace: &str, name: &str, phase: &'static str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "proposal",
        otel.name = %format_args!("proposal {phase}"),
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        k8s.namespace.name = %namespace,
        kortex.proposal = %name,
        kortex.proposal.phase = phase,
        error.type = tracing::field::Empty,
    )
}

/// Whether the current span is one of Kortex's traced spans (so a child joins a trace
/// instead of starting one of its own).
pub fn in_trace() -> bool {
    enabled()
        && Span::current()
            .metadata()
            .is_some_and(|m| m.target() == TARGET)
}

/// One database operation, summarized (the conventions' `db.query.summary`; never the SQL
/// text or its values), within the current trace: background work (the write-behind
/// accounting, retention, heartbeats) starts no trace of its own.
pub fn db_span(system: &'static str, summary: &'static str) -> Span {
    if !in_trace() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "db",
        otel.name = summary,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        db.system.name = system,
        db.query.summary = summary,
        error.type = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_traceparent_gives_its_trace_id() {
        assert_eq!(
            trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id_of("garbage"), None);
        assert_eq!(trace_id_of("00-xyz-00f067aa0ba902b7-01"), None);
    }

    #[test]
    fn provider_types_map_to_the_conventions_names() {
        assert_eq!(genai_provider("anthropic"), "anthropic");
        assert_eq!(genai_provider("openai-compatible"), "openai");
        assert_eq!(genai_provider("ollama"), "ollama");
    }

    #[test]
    fn off_means_no_context_and_no_headers() {
        let mut headers = axum::http::HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty());
        assert!(current_trace_id().is_none());
        assert!(self::headers().is_empty());
    }
}
