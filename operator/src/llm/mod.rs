//! The LLM provider layer: provider-agnostic request, response and stream types, one trait,
//! and one adapter per wire protocol (`anthropic`, `openai` — also for `openai-compatible`
//! servers —, `ollama`) or local CLI (`claude_code`), built from the catalog with their keys
//! resolved; `probe` checks each provider (and whether a CLI is installed), `recover` and
//! `prompt_tools` read tool calls small models write as text, `semconv` names their spans.
//! Imports `live`, `catalog`, `store`, `egress`, `telemetry` and `crd` only.
//!
//! Every adapter speaks its vendor's documented wire format over reqwest; no vendor SDK.
//! Errors are typed and never carry the key; retries happen only while nothing has been
//! streamed; dropping a stream drops its HTTP request.

/// The part of [`LlmProvider`] a wrapping adapter (`self.inner`) leaves as it is: its
/// settings, embeddings, model list and token counting. (`capabilities` follows from the
/// settings.)
macro_rules! delegate_to_inner {
    () => {
        fn config(&self) -> &$crate::llm::ProviderConfig {
            self.inner.config()
        }

        fn embed<'a>(
            &'a self,
            model: &'a str,
            inputs: &'a [String],
        ) -> $crate::llm::LlmFuture<'a, $crate::llm::Embeddings> {
            self.inner.embed(model, inputs)
        }

        fn list_models(&self) -> $crate::llm::LlmFuture<'_, Vec<String>> {
            self.inner.list_models()
        }

        fn delegates_tools(&self) -> bool {
            self.inner.delegates_tools()
        }

        fn count_tokens<'a>(
            &'a self,
            body: &'a serde_json::Value,
            beta: Option<&'a str>,
        ) -> Option<$crate::llm::LlmFuture<'a, u64>> {
            self.inner.count_tokens(body, beta)
        }
    };
}

mod anthropic;
pub mod claude_code;
mod error;
mod ollama;
mod openai;
/// A tool call in Chat Completions shape (the gateway answers with it too).
pub(crate) use openai::OutToolCall;
pub mod probe;
mod prompt_tools;
pub mod recover;
mod retry;
pub mod semconv;
mod usage;
mod wire;

pub use error::{ErrorKind, LlmError};
pub use retry::RetryPolicy;
pub use usage::{estimate_input, estimate_messages};
pub use wire::{NdjsonDecoder, SseDecoder, SseEvent, parse_arguments};

use crate::catalog::ProviderEntry;
use crate::crd::{ModelCost, ProviderType, ToolMode};
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A boxed future, for the dyn-compatible trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a provider call gives back: a boxed future of its answer or its error.
pub type LlmFuture<'a, T> = BoxFuture<'a, Result<T, LlmError>>;

/// A stream of events of one call. It ends after `Done`, or with an error item.
pub type ChatStream = BoxStream<'static, Result<StreamEvent, LlmError>>;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// What the user said.
    User {
        /// Text.
        content: String,
    },
    /// What the model said, with the tools it called.
    Assistant {
        /// Text (may be empty when the model only called tools).
        content: String,
        /// Tool calls, in order.
        #[serde(default, rename = "toolCalls", skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    Tool {
        /// The call it answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        /// Result text (JSON or prose).
        content: String,
        /// Whether the tool failed.
        #[serde(default, rename = "isError")]
        is_error: bool,
    },
}

/// A tool call with its arguments fully assembled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id (generated when the provider gives none).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as parsed JSON (an object).
    #[serde(alias = "arguments")]
    pub input: Value,
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// JSON Schema (`type: object`) of the arguments.
    #[serde(alias = "input_schema", alias = "inputSchema")]
    pub parameters: Value,
}

/// Who is asking and why, for audit and accounting (not sent to providers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestMetadata {
    /// Session id.
    pub session: Option<String>,
    /// User.
    pub user: Option<String>,
    /// `chat`, `summarize`, `triage`, `gateway`, `cli`, ...
    pub purpose: Option<String>,
}

/// A provider-agnostic chat request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Model id; empty means the provider's default model.
    pub model: String,
    /// System prompt.
    pub system: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// Output token limit; the provider's `maxTokens` when unset.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Structured output, in the Chat Completions shape (`{"type": "json_schema",
    /// "json_schema": {name, schema, strict}}` or `{"type": "json_object"}`): passed to
    /// providers that take it (OpenAI, Ollama's `format`), described in the system prompt
    /// to the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// Whether the model must call a tool: `None` lets it choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Anthropic's `thinking` setting as a Messages client sent it (passed to Anthropic
    /// providers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Value>,
    /// Thinking blocks of earlier assistant turns, by their index in `messages` (Anthropic
    /// wants them back, before the turn's tool calls, while thinking is on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking_blocks: Vec<(usize, Vec<Value>)>,
    /// Audit and accounting context.
    pub metadata: RequestMetadata,
    /// A chat run's tools for a provider that runs its own tool loop (`claude-code`):
    /// Kortex's MCP endpoint and the run's credential. Never serialized.
    #[serde(skip)]
    pub mcp: Option<claude_code::McpBridge>,
    /// The most model turns such a loop may take (the policy's `maxToolDepth`).
    #[serde(skip)]
    pub max_turns: Option<u32>,
}

/// A forced tool call (the default lets the model choose).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (said explicitly: passed on as the client sent it).
    Auto,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Tool(String),
}

/// The instruction that stands in for `response_format` where a provider has no such
/// parameter.
pub fn response_format_instruction(format: &Value) -> Option<String> {
    match format["type"].as_str() {
        Some("json_schema") => Some(format!(
            "Reply with only a JSON value (no prose, no code fences) that is valid against this JSON Schema: {}",
            format["json_schema"]["schema"]
        )),
        Some("json_object") => {
            Some("Reply with only a JSON object (no prose, no code fences).".to_owned())
        }
        _ => None,
    }
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The answer is complete.
    #[default]
    EndTurn,
    /// The model wants tool results.
    ToolUse,
    /// The output token limit was reached.
    MaxTokens,
    /// A stop sequence was produced.
    StopSequence,
    /// The provider reported an error or refusal.
    Error,
}

/// Token usage of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// The provider reported no (or only part of the) usage, and Kortex estimated the rest
    /// from the text ([`estimate_messages`]): charged to budgets all the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

/// A complete answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatResponse {
    /// Text of the answer.
    pub text: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Tokens.
    pub usage: Usage,
    /// The model that answered (as the provider reports it).
    pub model: String,
    /// Wall time of the call.
    pub latency_ms: u64,
    /// Notes for the caller (e.g. prompt-mode tool parsing is best effort).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Anthropic's thinking blocks (`thinking` with its `signature`, or
    /// `redacted_thinking`), whole, in order: the gateway passes them to its client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<Value>,
}

/// One event of a streamed call.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// More answer text.
    TextDelta(String),
    /// A tool call, arguments complete.
    ToolCall(ToolCall),
    /// The end: why, tokens, model.
    Done {
        /// Why it stopped.
        stop_reason: StopReason,
        /// Tokens.
        usage: Usage,
        /// Model reported by the provider.
        model: String,
    },
    /// A non-fatal note (e.g. prompt-mode tool parsing).
    Warning(String),
    /// An Anthropic thinking block, whole (`{"type": "thinking", "thinking", "signature"}`
    /// or `redacted_thinking`): passed through by the Messages gateway, ignored elsewhere.
    Thinking(Value),
}

/// What a provider can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Tools are passed natively (not described in the prompt).
    pub native_tools: bool,
    /// Tools can be used at all.
    pub tools: bool,
    /// Responses can be streamed.
    pub streaming: bool,
}

/// One LLM backend.
pub trait LlmProvider: Send + Sync {
    /// The settings it was built from.
    fn config(&self) -> &ProviderConfig;
    /// The `LLMProvider` name.
    fn name(&self) -> &str {
        &self.config().name
    }
    /// What it can do.
    fn capabilities(&self) -> Capabilities {
        let mode = self.config().tool_mode;
        Capabilities {
            native_tools: matches!(mode, ToolMode::Native | ToolMode::Auto),
            tools: mode != ToolMode::None,
            streaming: true,
        }
    }
    /// The model used when a request names none: `defaultModel`, else the first of `models`.
    fn default_model(&self) -> Option<&str> {
        self.config().default_model.as_deref()
    }
    /// The catalog models (prices, context windows).
    fn models(&self) -> &[crate::crd::ModelSpec] {
        &self.config().models
    }
    /// Context window of `model` in tokens, when the catalog says.
    fn context_window(&self, model: &str) -> Option<u64> {
        self.models()
            .iter()
            .find(|m| m.id == model)
            .and_then(|m| m.context_tokens)
    }
    /// Cost of `usage` on `model` (0 when the catalog has no price for it).
    fn cost_usd(&self, model: &str, usage: Usage) -> f64 {
        cost_usd(
            self.models()
                .iter()
                .find(|m| m.id == model)
                .and_then(|m| m.cost.as_ref()),
            usage,
        )
    }
    /// Streams one call. Errors before any output come back as `Err` here (the first event
    /// is peeked), so callers can fail over; later errors are `Err` items of the stream.
    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream>;
    /// One non-streamed call.
    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse>;
    /// Whether the provider runs its own tool loop and calls Kortex's tools through the
    /// [`ChatRequest::mcp`] bridge (`claude-code`) instead of returning tool calls.
    fn delegates_tools(&self) -> bool {
        false
    }
    /// The model ids the endpoint lists (also the reachability probe).
    fn list_models(&self) -> LlmFuture<'_, Vec<String>>;
    /// The exact input tokens of a Messages-API `body` (Anthropic's
    /// `/v1/messages/count_tokens`, with `beta` as its `anthropic-beta`); `None` when the
    /// provider has no such endpoint (the gateway then estimates).
    fn count_tokens<'a>(
        &'a self,
        body: &'a serde_json::Value,
        beta: Option<&'a str>,
    ) -> Option<LlmFuture<'a, u64>> {
        let _ = (body, beta);
        None
    }
    /// Embeddings of `inputs` with `model`, where the provider offers them.
    fn embed<'a>(&'a self, model: &'a str, inputs: &'a [String]) -> LlmFuture<'a, Embeddings> {
        let _ = (model, inputs);
        Box::pin(async move {
            Err(LlmError::new(
                ErrorKind::BadRequest,
                self.name(),
                "this provider type offers no embeddings endpoint",
            ))
        })
    }
}

/// The vectors of an embeddings call, in input order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embeddings {
    /// One vector per input.
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens the provider counted.
    pub input_tokens: u64,
    /// Model reported by the provider.
    pub model: String,
}

/// Settings shared by every adapter, from the `LLMProvider` spec.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// `LLMProvider` name (used in errors).
    pub name: String,
    /// Its `spec.type` (traces name the provider by it).
    pub provider_type: ProviderType,
    /// The endpoint's host and port, for traces (`server.address`, `server.port`).
    pub server: Option<(String, u16)>,
    /// Endpoint root (conventions in SPEC §3).
    pub base_url: String,
    /// API key, if any.
    pub api_key: Option<crate::catalog::SecretValue>,
    /// Extra headers (values resolved).
    pub headers: Vec<(String, crate::catalog::SecretValue)>,
    /// Default model.
    pub default_model: Option<String>,
    /// Default output token limit.
    pub max_tokens: u32,
    /// Sampling temperature of requests that set none (`spec.temperature`).
    pub temperature: Option<f32>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// How tools are offered.
    pub tool_mode: ToolMode,
    /// Retries before any output.
    pub retry: RetryPolicy,
    /// The catalog models.
    pub models: Vec<crate::crd::ModelSpec>,
}

/// An adapter and the configuration version it was built from.
type CachedAdapter = (u64, Arc<dyn LlmProvider>);

/// Adapters built once per configuration version and provider, so the gateway's hot path
/// reuses their HTTP clients (connection pools, TLS configuration) instead of building them
/// for every request.
#[derive(Default)]
pub struct AdapterCache {
    entries: std::sync::Mutex<std::collections::HashMap<crate::catalog::ObjectKey, CachedAdapter>>,
}

impl AdapterCache {
    /// The adapter of `entry` as of configuration `version`.
    pub fn get(
        &self,
        version: u64,
        key: &crate::catalog::ObjectKey,
        entry: &ProviderEntry,
    ) -> Result<Arc<dyn LlmProvider>, LlmError> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, adapter)) = entries.get(key)
            && *v == version
        {
            return Ok(adapter.clone());
        }
        let adapter = build(entry)?;
        entries.retain(|_, (v, _)| *v == version);
        entries.insert(key.clone(), (version, adapter.clone()));
        Ok(adapter)
    }
}

/// Builds the adapter for a catalog entry (which must be available: its Secrets resolved).
pub fn build(entry: &ProviderEntry) -> Result<Arc<dyn LlmProvider>, LlmError> {
    let name = entry.object.metadata.name.clone().unwrap_or_default();
    let spec = &entry.object.spec;
    let config_error = |message: String| LlmError::new(ErrorKind::Config, &name, message);
    if !entry.available {
        return Err(config_error(
            "the provider is unavailable (see its conditions)".into(),
        ));
    }
    let base_url = entry
        .base_url()
        .ok_or_else(|| config_error("spec.baseUrl is required".into()))?;
    let mut headers = Vec::new();
    for h in &spec.headers {
        let value = match (&h.value, &h.value_from) {
            (Some(v), _) => crate::catalog::SecretValue::new(v.as_str()),
            (None, Some(from)) => entry
                .secrets
                .get(&from.secret_key_ref)
                .cloned()
                .ok_or_else(|| config_error(format!("header {} has no resolved value", h.name)))?,
            (None, None) => continue,
        };
        headers.push((h.name.clone(), value));
    }
    let ca_bundle = spec
        .ca_bundle_secret_ref
        .as_ref()
        .and_then(|r| entry.secrets.get(r));
    let config = ProviderConfig {
        name: name.clone(),
        provider_type: spec.provider_type,
        server: reqwest::Url::parse(base_url.trim_end_matches('/'))
            .ok()
            .and_then(|u| Some((u.host_str()?.to_owned(), u.port_or_known_default()?))),
        base_url: base_url.trim_end_matches('/').to_owned(),
        api_key: entry.api_key().cloned(),
        headers,
        default_model: entry.default_model().map(str::to_owned),
        max_tokens: entry.max_tokens(),
        temperature: spec.temperature,
        timeout: entry.timeout(),
        tool_mode: spec.tool_mode(),
        retry: RetryPolicy::default(),
        models: spec.models.clone(),
    };
    let client =
        |config: &ProviderConfig| wire::client(config, ca_bundle, spec.allow_private_targets);
    let adapter: Arc<dyn LlmProvider> = match spec.provider_type {
        ProviderType::Anthropic => {
            let client = client(&config)?;
            Arc::new(anthropic::Anthropic::new(config, client))
        }
        ProviderType::OpenAi => {
            let client = client(&config)?;
            Arc::new(openai::OpenAi::new(config, client, false))
        }
        ProviderType::OpenAiCompatible => {
            let client = client(&config)?;
            Arc::new(openai::OpenAi::new(config, client, true))
        }
        ProviderType::Ollama => {
            let client = client(&config)?;
            Arc::new(ollama::Ollama::new(config, client))
        }
        ProviderType::ClaudeCode => {
            // Your own credential: a `claude setup-token` token or an API key.
            let auth = match (&spec.auth_secret_ref, &spec.api_key_secret_ref) {
                (Some(r), _) => entry
                    .secrets
                    .get(r)
                    .map(|v| (spec.auth_kind.unwrap_or_default(), v.clone())),
                (None, Some(r)) => entry
                    .secrets
                    .get(r)
                    .map(|v| (crate::crd::ClaudeCodeAuth::ApiKey, v.clone())),
                (None, None) => None,
            };
            Arc::new(claude_code::ClaudeCode::new(
                config,
                spec.command.clone().unwrap_or_else(|| "claude".to_owned()),
                auth,
                spec.base_url.clone(),
                spec.max_turns,
            ))
        }
    };
    let adapter: Arc<dyn LlmProvider> = match spec.tool_mode() {
        ToolMode::Prompt => Arc::new(prompt_tools::PromptTools::new(adapter)),
        ToolMode::Auto => Arc::new(recover::Recovering::new(adapter)),
        ToolMode::Native | ToolMode::None => adapter,
    };
    Ok(Arc::new(usage::Estimating::new(adapter)))
}

/// A whole answer as the events a stream of it would carry.
pub fn response_stream(response: ChatResponse) -> ChatStream {
    use futures_util::StreamExt;
    let mut events = Vec::new();
    events.extend(
        response
            .warnings
            .into_iter()
            .map(|w| Ok(StreamEvent::Warning(w))),
    );
    events.extend(
        response
            .thinking
            .into_iter()
            .map(|b| Ok(StreamEvent::Thinking(b))),
    );
    if !response.text.is_empty() {
        events.push(Ok(StreamEvent::TextDelta(response.text)));
    }
    events.extend(
        response
            .tool_calls
            .into_iter()
            .map(|c| Ok(StreamEvent::ToolCall(c))),
    );
    events.push(Ok(StreamEvent::Done {
        stop_reason: response.stop_reason,
        usage: response.usage,
        model: response.model,
    }));
    futures_util::stream::iter(events).boxed()
}

/// Cost in USD of `usage` at `cost` (0 when the model has no price).
pub fn cost_usd(cost: Option<&ModelCost>, usage: Usage) -> f64 {
    cost.map_or(0.0, |c| {
        (usage.input_tokens as f64 * c.input_usd_per_m_tok
            + usage.output_tokens as f64 * c.output_usd_per_m_tok)
            / 1e6
    })
}

/// Collects a stream into one response (what `complete` returns for streamed calls).
pub async fn collect(
    mut stream: ChatStream,
    started: std::time::Instant,
) -> Result<ChatResponse, LlmError> {
    use futures_util::StreamExt;
    let mut response = ChatResponse::default();
    while let Some(event) = stream.next().await {
        match event? {
            StreamEvent::TextDelta(t) => response.text.push_str(&t),
            StreamEvent::ToolCall(c) => response.tool_calls.push(c),
            StreamEvent::Warning(w) => response.warnings.push(w),
            StreamEvent::Thinking(b) => response.thinking.push(b),
            StreamEvent::Done {
                stop_reason,
                usage,
                model,
            } => {
                response.stop_reason = stop_reason;
                response.usage = usage;
                response.model = model;
            }
        }
    }
    response.latency_ms = started.elapsed().as_millis() as u64;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_usage_times_price() {
        let price = ModelCost {
            input_usd_per_m_tok: 15.0,
            output_usd_per_m_tok: 75.0,
        };
        let usage = Usage {
            input_tokens: 2_000,
            output_tokens: 1_000,
            ..Default::default()
        };
        assert!((cost_usd(Some(&price), usage) - 0.105).abs() < 1e-12);
        assert_eq!(cost_usd(None, usage), 0.0);
    }

    #[test]
    fn messages_serialize_with_roles() {
        let m = Message::Tool {
            tool_call_id: "c1".into(),
            content: "x".into(),
            is_error: true,
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap_or_default(),
            serde_json::json!({"role": "tool", "toolCallId": "c1", "content": "x", "isError": true})
        );
    }
}
