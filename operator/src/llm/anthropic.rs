//! Anthropic's Messages API: `POST /v1/messages` with `x-api-key` and `anthropic-version`,
//! streamed as SSE (`message_start`, `content_block_start|delta|stop`, `message_delta`,
//! `message_stop`, `ping`, `error`). Tool results travel as `tool_result` blocks in the
//! next user turn, keyed by `tool_use_id`.

use super::wire::{self, Decoder, Framing, SseEvent};
use super::{
    ChatRequest, ChatResponse, ChatStream, ErrorKind, LlmError, LlmFuture, LlmProvider, Message,
    ProviderConfig, StopReason, StreamEvent, ToolCall, Usage,
};
use crate::crd::ToolMode;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The API version header value Kortex speaks.
pub const API_VERSION: &str = "2023-06-01";

/// An Anthropic endpoint.
pub struct Anthropic {
    config: ProviderConfig,
    client: reqwest::Client,
}

impl Anthropic {
    /// An adapter over `client`.
    pub fn new(config: ProviderConfig, client: reqwest::Client) -> Self {
        Self { config, client }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .client
            .request(method, format!("{}{path}", self.config.base_url))
            .header("anthropic-version", API_VERSION);
        match &self.config.api_key {
            Some(key) => r.header("x-api-key", key.expose()),
            None => r,
        }
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Value {
        let model = if request.model.is_empty() {
            self.config.default_model.clone().unwrap_or_default()
        } else {
            request.model.clone()
        };
        let mut body = json!({
            "model": model,
            "max_tokens": request.max_tokens.unwrap_or(self.config.max_tokens),
            "messages": messages(&request.messages, &request.thinking_blocks),
        });
        if let Some(thinking) = &request.thinking {
            body["thinking"] = thinking.clone();
        }
        let format = request
            .response_format
            .as_ref()
            .and_then(super::response_format_instruction);
        let system = match (request.system.as_deref().filter(|s| !s.is_empty()), format) {
            (Some(s), Some(f)) => Some(format!("{s}\n\n{f}")),
            (Some(s), None) => Some(s.to_owned()),
            (None, f) => f,
        };
        if let Some(system) = system {
            body["system"] = json!(system);
        }
        if self.config.tool_mode != ToolMode::None && !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
        }
        if let Some(t) = request.temperature.or(self.config.temperature) {
            body["temperature"] = json!(t);
        }
        if !request.stop.is_empty() {
            body["stop_sequences"] = json!(request.stop);
        }
        if body.get("tools").is_some() {
            match &request.tool_choice {
                Some(super::ToolChoice::Auto) => body["tool_choice"] = json!({"type": "auto"}),
                Some(super::ToolChoice::Required) => body["tool_choice"] = json!({"type": "any"}),
                Some(super::ToolChoice::Tool(name)) => {
                    body["tool_choice"] = json!({"type": "tool", "name": name});
                }
                None => {}
            }
        }
        if stream {
            body["stream"] = json!(true);
        }
        body
    }
}

/// The conversation in Anthropic's shape: content blocks, strictly alternating roles, tool
/// results (and any text that follows them) merged into one user turn.
fn messages(history: &[Message], thinking: &[(usize, Vec<Value>)]) -> Vec<Value> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    let mut push = |role: &str, block: Value| match out.last_mut() {
        Some((r, blocks)) if r == role => blocks.push(block),
        _ => out.push((role.to_owned(), vec![block])),
    };
    for (i, m) in history.iter().enumerate() {
        match m {
            Message::User { content } => push("user", json!({"type": "text", "text": content})),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                // The turn's thinking blocks first, as the model wrote them.
                for (_, blocks) in thinking.iter().filter(|(at, _)| *at == i) {
                    for b in blocks {
                        push("assistant", b.clone());
                    }
                }
                if !content.trim().is_empty() {
                    push("assistant", json!({"type": "text", "text": content}));
                }
                for c in tool_calls {
                    push(
                        "assistant",
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}),
                    );
                }
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let mut block =
                    json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content});
                if *is_error {
                    block["is_error"] = json!(true);
                }
                push("user", block);
            }
        }
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

fn stop_reason(s: Option<&str>) -> StopReason {
    match s {
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") | Some("model_context_window_exceeded") => StopReason::MaxTokens,
        Some("stop_sequence") => StopReason::StopSequence,
        Some("refusal") => StopReason::Error,
        _ => StopReason::EndTurn,
    }
}

/// Maps an in-body `error` object (`{"type": "overloaded_error", "message": ...}`).
fn body_error(provider: &str, error: &Value) -> LlmError {
    let kind = match error
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
    {
        "authentication_error" | "permission_error" => ErrorKind::Auth,
        "rate_limit_error" => ErrorKind::RateLimited,
        "request_too_large" => ErrorKind::ContextTooLong,
        "invalid_request_error" | "not_found_error" => ErrorKind::BadRequest,
        _ => ErrorKind::Upstream,
    };
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("error event without message");
    let kind_name = error.get("type").and_then(Value::as_str).unwrap_or("error");
    LlmError::new(kind, provider, format!("{kind_name}: {message}"))
}

/// Anthropic's token counts, kept apart: deltas may repeat some fields (cumulatively) and
/// omit others, and compatible servers send `input_tokens: 0` in `message_delta`.
#[derive(Clone, Copy, Debug, Default)]
struct TokenCounts {
    input: u64,
    cache_creation: u64,
    cache_read: u64,
    output: u64,
}

impl TokenCounts {
    /// Takes every count present and non-zero in `v`.
    fn update(&mut self, v: &Value) {
        let field = |k: &str| v.get(k).and_then(Value::as_u64).filter(|n| *n > 0);
        if let Some(n) = field("input_tokens") {
            self.input = n;
        }
        if let Some(n) = field("cache_creation_input_tokens") {
            self.cache_creation = n;
        }
        if let Some(n) = field("cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = field("output_tokens") {
            self.output = n;
        }
    }

    /// Cached prompt tokens are prompt tokens too.
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input + self.cache_creation + self.cache_read,
            output_tokens: self.output,
            ..Default::default()
        }
    }
}

/// The SSE state machine.
#[derive(Default)]
pub struct StreamDecoder {
    provider: String,
    model: String,
    tokens: TokenCounts,
    stop: Option<StopReason>,
    /// Open tool_use blocks by index: (id, name, partial JSON).
    open_tools: BTreeMap<u64, (String, String, String)>,
    /// Open thinking (or redacted_thinking) blocks by index, as they grow.
    open_thinking: BTreeMap<u64, Value>,
    /// A tool call whose arguments did not parse: fine if the answer was cut off at the
    /// token limit (then dropped with a warning), a protocol error otherwise.
    truncated: Option<LlmError>,
    done: bool,
}

impl StreamDecoder {
    /// A decoder for `provider`.
    pub fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            ..Default::default()
        }
    }
}

impl Decoder for StreamDecoder {
    type Item = SseEvent;

    // Long because a wire format's match over Anthropic's SSE event kinds; each arm is one event.
    fn feed(&mut self, event: SseEvent) -> Result<Vec<StreamEvent>, LlmError> {
        if event.data.is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = wire::parse_json(&self.provider, &event.data)?;
        let kind = if event.event.is_empty() {
            v.get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        } else {
            event.event.clone()
        };
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut out = Vec::new();
        match kind.as_str() {
            "message_start" => {
                let m = v.get("message").cloned().unwrap_or_default();
                self.model = m
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                if let Some(u) = m.get("usage") {
                    self.tokens.update(u);
                }
            }
            "content_block_start" => {
                let block = v.get("content_block").cloned().unwrap_or_default();
                match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => {
                        let id = block
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        let name = block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        self.open_tools.insert(index, (id, name, String::new()));
                    }
                    Some("text") => {
                        if let Some(t) = block
                            .get("text")
                            .and_then(Value::as_str)
                            .filter(|t| !t.is_empty())
                        {
                            out.push(StreamEvent::TextDelta(t.to_owned()));
                        }
                    }
                    Some("thinking" | "redacted_thinking") => {
                        self.open_thinking.insert(index, block);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = v.get("delta").cloned().unwrap_or_default();
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        if let Some(t) = delta.get("text").and_then(Value::as_str) {
                            out.push(StreamEvent::TextDelta(t.to_owned()));
                        }
                    }
                    Some("input_json_delta") => {
                        let part = delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        match self.open_tools.get_mut(&index) {
                            Some((_, _, json)) => json.push_str(part),
                            None => {
                                return Err(LlmError::new(
                                    ErrorKind::Protocol,
                                    &self.provider,
                                    format!(
                                        "input_json_delta for block {index}, which is not an open tool_use block"
                                    ),
                                ));
                            }
                        }
                    }
                    Some(kind @ ("thinking_delta" | "signature_delta")) => {
                        let (field, key) = if kind == "thinking_delta" {
                            ("thinking", "thinking")
                        } else {
                            ("signature", "signature")
                        };
                        if let Some(block) = self.open_thinking.get_mut(&index) {
                            let mut text = block[key].as_str().unwrap_or_default().to_owned();
                            text.push_str(
                                delta.get(field).and_then(Value::as_str).unwrap_or_default(),
                            );
                            block[key] = json!(text);
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(block) = self.open_thinking.remove(&index) {
                    out.push(StreamEvent::Thinking(block));
                }
                if let Some((id, name, json)) = self.open_tools.remove(&index) {
                    match wire::parse_arguments(&self.provider, &name, &json) {
                        Ok(input) => out.push(StreamEvent::ToolCall(ToolCall { id, name, input })),
                        Err(e) => self.truncated = Some(e),
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(stop_reason(Some(reason)));
                }
                if let Some(u) = v.get("usage") {
                    self.tokens.update(u);
                }
            }
            "message_stop" => {
                let stop_reason = self.stop.unwrap_or_default();
                if let Some(e) = self.truncated.take() {
                    if stop_reason != StopReason::MaxTokens {
                        return Err(e);
                    }
                    out.push(StreamEvent::Warning(
                        "the answer reached the token limit inside a tool call; the incomplete call was dropped".into(),
                    ));
                }
                self.done = true;
                out.push(StreamEvent::Done {
                    stop_reason,
                    usage: self.tokens.usage(),
                    model: self.model.clone(),
                });
            }
            "error" => return Err(body_error(&self.provider, v.get("error").unwrap_or(&v))),
            _ => {} // ping and future event types
        }
        Ok(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        wire::ended(self.done, &self.provider, "message_stop")
    }
}

/// A non-streamed response body.
pub fn parse_response(provider: &str, v: &Value) -> Result<ChatResponse, LlmError> {
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(body_error(provider, v.get("error").unwrap_or(v)));
    }
    let Some(content) = v.get("content").and_then(Value::as_array) else {
        return Err(LlmError::new(
            ErrorKind::Protocol,
            provider,
            "response has no content array",
        ));
    };
    let mut response = ChatResponse {
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        stop_reason: stop_reason(v.get("stop_reason").and_then(Value::as_str)),
        ..Default::default()
    };
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("thinking" | "redacted_thinking") => response.thinking.push(block.clone()),
            Some("text") => response.text.push_str(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            Some("tool_use") => response.tool_calls.push(ToolCall {
                id: block
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                name: block
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input: block.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            _ => {}
        }
    }
    if let Some(u) = v.get("usage") {
        let mut tokens = TokenCounts::default();
        tokens.update(u);
        response.usage = tokens.usage();
    }
    Ok(response)
}

impl LlmProvider for Anthropic {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            let body = self.body(request, true);
            let post = || {
                self.request(reqwest::Method::POST, "/v1/messages")
                    .json(&body)
            };
            wire::stream_call(&self.config, post, Framing::Sse, wire::sse, || {
                StreamDecoder::new(&self.config.name)
            })
            .await
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            let body = self.body(request, false);
            wire::complete_json(
                &self.config,
                || {
                    self.request(reqwest::Method::POST, "/v1/messages")
                        .json(&body)
                },
                parse_response,
            )
            .await
        })
    }

    fn list_models(&self) -> LlmFuture<'_, Vec<String>> {
        let request = self.request(reqwest::Method::GET, "/v1/models?limit=1000");
        Box::pin(wire::list_models(&self.config, request, "data", "id"))
    }

    fn count_tokens<'a>(
        &'a self,
        body: &'a serde_json::Value,
        beta: Option<&'a str>,
    ) -> Option<LlmFuture<'a, u64>> {
        Some(Box::pin(async move {
            let mut request = self
                .request(reqwest::Method::POST, "/v1/messages/count_tokens")
                .json(body);
            if let Some(beta) = beta {
                request = request.header("anthropic-beta", beta);
            }
            let response = wire::send(&self.config, request).await?;
            let v: serde_json::Value = wire::json_body(&self.config, response).await?;
            v["input_tokens"].as_u64().ok_or_else(|| {
                LlmError::new(
                    ErrorKind::Upstream,
                    &self.config.name,
                    format!("count_tokens answered without input_tokens: {v}"),
                )
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_merge_into_one_user_turn() {
        let history = vec![
            Message::User {
                content: "why?".into(),
            },
            Message::Assistant {
                content: "checking".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "t1".into(),
                        name: "get_logs".into(),
                        input: json!({"ns": "shop"}),
                    },
                    ToolCall {
                        id: "t2".into(),
                        name: "get_events".into(),
                        input: json!({}),
                    },
                ],
            },
            Message::Tool {
                tool_call_id: "t1".into(),
                content: "oom".into(),
                is_error: false,
            },
            Message::Tool {
                tool_call_id: "t2".into(),
                content: "forbidden".into(),
                is_error: true,
            },
        ];
        let m = messages(&history, &[]);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1]["content"][1],
            json!({"type": "tool_use", "id": "t1", "name": "get_logs", "input": {"ns": "shop"}})
        );
        assert_eq!(m[2]["role"], "user");
        assert_eq!(
            m[2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "t1", "content": "oom"})
        );
        assert_eq!(m[2]["content"][1]["is_error"], true);
    }

    #[test]
    fn decoder_assembles_tool_input_and_usage() {
        let mut d = StreamDecoder::new("anthropic");
        let ev = |event: &str, data: Value| SseEvent {
            id: String::new(),
            event: event.into(),
            data: data.to_string(),
        };
        let mut out = Vec::new();
        for e in [
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            ),
            ev(
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_logs", "input": {}}}),
            ),
            ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"name"}}),
            ),
            ev("ping", json!({"type": "ping"})),
            ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "input_json_delta", "partial_json": "space\": \"shop\"}"}}),
            ),
            ev("content_block_stop", json!({"index": 0})),
            ev(
                "message_delta",
                json!({"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}}),
            ),
            ev("message_stop", json!({})),
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(
            out,
            vec![
                StreamEvent::ToolCall(ToolCall {
                    id: "toolu_1".into(),
                    name: "get_logs".into(),
                    input: json!({"namespace": "shop"})
                }),
                StreamEvent::Done {
                    stop_reason: StopReason::ToolUse,
                    usage: Usage {
                        input_tokens: 12,
                        output_tokens: 30,
                        ..Default::default()
                    },
                    model: "claude-x".into()
                },
            ]
        );
        assert!(d.is_done());
    }

    fn ev(event: &str, data: Value) -> SseEvent {
        SseEvent {
            id: String::new(),
            event: event.into(),
            data: data.to_string(),
        }
    }

    #[test]
    fn zero_input_tokens_in_a_delta_do_not_erase_the_count_and_cache_counts_add_up() {
        let mut d = StreamDecoder::new("anthropic");
        let mut out = Vec::new();
        for e in [
            ev(
                "message_start",
                json!({"message": {"model": "c", "usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1}}}),
            ),
            ev(
                "message_delta",
                json!({"delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 0, "output_tokens": 7}}),
            ),
            ev("message_stop", json!({})),
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert!(
            matches!(
                out.last(),
                Some(StreamEvent::Done {
                    usage: Usage {
                        input_tokens: 100,
                        output_tokens: 7,
                        ..
                    },
                    ..
                })
            ),
            "{out:?}"
        );
    }

    #[test]
    fn a_tool_call_cut_by_max_tokens_is_dropped_with_a_warning_otherwise_an_error() {
        let run = |stop: &str| {
            let mut d = StreamDecoder::new("anthropic");
            let mut out = Vec::new();
            for e in [
                ev(
                    "message_start",
                    json!({"message": {"model": "c", "usage": {"input_tokens": 1}}}),
                ),
                ev(
                    "content_block_start",
                    json!({"index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "x", "input": {}}}),
                ),
                ev(
                    "content_block_delta",
                    json!({"index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": \"tr"}}),
                ),
                ev("content_block_stop", json!({"index": 0})),
                ev(
                    "message_delta",
                    json!({"delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
                ),
                ev("message_stop", json!({})),
            ] {
                out.extend(d.feed(e)?);
            }
            Ok::<_, LlmError>(out)
        };
        let out = run("max_tokens").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(&out[0], StreamEvent::Warning(_)), "{out:?}");
        assert!(matches!(
            out.last(),
            Some(StreamEvent::Done {
                stop_reason: StopReason::MaxTokens,
                ..
            })
        ));
        assert_eq!(
            run("tool_use").err().map(|e| e.kind),
            Some(ErrorKind::Protocol)
        );
    }

    #[test]
    fn whitespace_only_assistant_text_is_not_sent() {
        let m = messages(
            &[Message::Assistant {
                content: "\n\n".into(),
                tool_calls: vec![ToolCall {
                    id: "t".into(),
                    name: "x".into(),
                    input: json!({}),
                }],
            }],
            &[],
        );
        assert_eq!(m[0]["content"].as_array().map(Vec::len), Some(1));
        assert_eq!(m[0]["content"][0]["type"], "tool_use");
    }
}

#[cfg(test)]
mod thinking_tests {
    use super::*;

    #[test]
    fn thinking_blocks_are_decoded_whole_and_given_back_before_the_calls() {
        let ev = |event: &str, data: Value| SseEvent {
            event: event.into(),
            data: data.to_string(),
            ..Default::default()
        };
        let mut d = StreamDecoder::new("p");
        let mut out = Vec::new();
        for e in [
            ev(
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            ),
            ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "thinking_delta", "thinking": "Check "}}),
            ),
            ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "thinking_delta", "thinking": "the logs."}}),
            ),
            ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "signature_delta", "signature": "sig-1"}}),
            ),
            ev("content_block_stop", json!({"index": 0})),
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(
            out,
            vec![StreamEvent::Thinking(
                json!({"type": "thinking", "thinking": "Check the logs.", "signature": "sig-1"})
            )]
        );
        let history = [
            Message::User {
                content: "why?".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "t1".into(),
                    name: "get_logs".into(),
                    input: json!({}),
                }],
            },
        ];
        let block =
            json!({"type": "thinking", "thinking": "Check the logs.", "signature": "sig-1"});
        let m = messages(&history, &[(1, vec![block.clone()])]);
        assert_eq!(m[1]["content"][0], block);
        assert_eq!(m[1]["content"][1]["type"], "tool_use");
    }
}
