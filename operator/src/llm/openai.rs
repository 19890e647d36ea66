//! OpenAI Chat Completions (`POST {baseUrl}/chat/completions`, `Authorization: Bearer`),
//! also used for `openai-compatible` servers (vLLM, LiteLLM, llama.cpp, gateways). Streams
//! are SSE `chat.completion.chunk` deltas ending in `data: [DONE]`; tool calls arrive in
//! pieces keyed by `index` and are assembled here; usage comes in the last chunk
//! (`stream_options.include_usage`).

use super::wire::{self, Decoder, Framing, SseEvent};
use super::{
    ChatRequest, ChatResponse, ChatStream, ErrorKind, LlmError, LlmFuture, LlmProvider, Message,
    ProviderConfig, StopReason, StreamEvent, ToolCall, Usage,
};
use crate::crd::ToolMode;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// An OpenAI or OpenAI-compatible endpoint.
pub struct OpenAi {
    config: ProviderConfig,
    client: reqwest::Client,
    /// The token limit's field name: OpenAI's current models take `max_completion_tokens`
    /// (and reject `max_tokens`); compatible servers know `max_tokens`.
    max_tokens_field: &'static str,
    /// Whether to ask for usage in streams (`stream_options`); turned off for good when a
    /// compatible server rejects the field.
    stream_usage: std::sync::atomic::AtomicBool,
    /// `<baseUrl>/chat/completions`, parsed once (not on every call).
    chat_url: Option<reqwest::Url>,
    /// `Authorization: Bearer <key>`, built once and marked sensitive.
    auth: Option<reqwest::header::HeaderValue>,
}

impl OpenAi {
    /// An adapter over `client`; `compatible` for `openai-compatible` servers.
    pub fn new(config: ProviderConfig, client: reqwest::Client, compatible: bool) -> Self {
        let max_tokens_field = if compatible {
            "max_tokens"
        } else {
            "max_completion_tokens"
        };
        let chat_url = reqwest::Url::parse(&format!("{}/chat/completions", config.base_url)).ok();
        let auth = config.api_key.as_ref().and_then(|key| {
            let mut v =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
            v.set_sensitive(true);
            Some(v)
        });
        Self {
            config,
            client,
            max_tokens_field,
            stream_usage: std::sync::atomic::AtomicBool::new(true),
            chat_url,
            auth,
        }
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (&self.auth, &self.config.api_key) {
            (Some(auth), _) => r.header(reqwest::header::AUTHORIZATION, auth.clone()),
            (None, Some(key)) => r.bearer_auth(key.expose()),
            (None, None) => r,
        }
    }

    /// A POST to `<baseUrl>/chat/completions`.
    fn post_chat(&self) -> reqwest::RequestBuilder {
        let request = match &self.chat_url {
            Some(url) => self.client.post(url.clone()),
            // Not a URL: reqwest reports it when the request is sent.
            None => self
                .client
                .post(format!("{}/chat/completions", self.config.base_url)),
        };
        self.authorized(request)
    }

    /// The request body, serialized straight from borrowed fields (no `Value` tree: this is
    /// on every gateway call's path).
    fn body<'a>(&'a self, request: &'a ChatRequest, stream: bool) -> Body<'a> {
        let model = if request.model.is_empty() {
            self.config.default_model.as_deref().unwrap_or_default()
        } else {
            request.model.as_str()
        };
        let limit = request.max_tokens.unwrap_or(self.config.max_tokens);
        let compatible = self.max_tokens_field == "max_tokens";
        let tools: Vec<OutTool<'a>> = if self.config.tool_mode != ToolMode::None {
            request
                .tools
                .iter()
                .map(|t| OutTool {
                    kind: "function",
                    function: OutFunctionSpec {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect()
        } else {
            Vec::new()
        };
        let tool_choice = if tools.is_empty() {
            None
        } else {
            request.tool_choice.as_ref().map(|c| match c {
                super::ToolChoice::Auto => OutToolChoice::Mode("auto"),
                super::ToolChoice::Required => OutToolChoice::Mode("required"),
                super::ToolChoice::Tool(name) => OutToolChoice::Function {
                    kind: "function",
                    function: OutName { name },
                },
            })
        };
        let stream_options = (stream
            && self.stream_usage.load(std::sync::atomic::Ordering::Relaxed))
        .then_some(StreamOptions {
            include_usage: true,
        });
        Body {
            model,
            messages: messages(request.system.as_deref(), &request.messages),
            max_tokens: compatible.then_some(limit),
            max_completion_tokens: (!compatible).then_some(limit),
            tools,
            temperature: request.temperature.or(self.config.temperature),
            stop: &request.stop,
            response_format: request.response_format.as_ref(),
            tool_choice,
            stream: stream.then_some(true),
            stream_options,
        }
    }
}

/// A Chat Completions request body.
#[derive(serde::Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<OutMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OutTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<OutToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(serde::Serialize)]
struct OutTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunctionSpec<'a>,
}

#[derive(serde::Serialize)]
struct OutFunctionSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum OutToolChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        function: OutName<'a>,
    },
}

#[derive(serde::Serialize)]
struct OutName<'a> {
    name: &'a str,
}

/// One message of a request.
#[derive(serde::Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    content: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

/// A tool call as Chat Completions carries it (`arguments` a JSON string).
#[derive(serde::Serialize)]
pub(crate) struct OutToolCall<'a> {
    pub(crate) id: &'a str,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: OutFunction<'a>,
}

#[derive(serde::Serialize)]
pub(crate) struct OutFunction<'a> {
    pub(crate) name: &'a str,
    pub(crate) arguments: String,
}

impl<'a> OutToolCall<'a> {
    pub(crate) fn of(c: &'a ToolCall) -> Self {
        Self {
            id: &c.id,
            kind: "function",
            function: OutFunction {
                name: &c.name,
                arguments: c.input.to_string(),
            },
        }
    }
}

/// The conversation in Chat Completions shape. Tool errors have no flag in this API, so the
/// content says so.
fn messages<'a>(system: Option<&'a str>, history: &'a [Message]) -> Vec<OutMessage<'a>> {
    let mut out = Vec::with_capacity(history.len() + 1);
    let plain = |role, content: std::borrow::Cow<'a, str>| OutMessage {
        role,
        content,
        tool_calls: Vec::new(),
        tool_call_id: None,
    };
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        out.push(plain("system", s.into()));
    }
    for m in history {
        out.push(match m {
            Message::User { content } => plain("user", content.as_str().into()),
            // Always a string: OpenAI accepts "" beside tool calls, and llama.cpp's servers
            // answer 500 to `null`.
            Message::Assistant {
                content,
                tool_calls,
            } => OutMessage {
                tool_calls: tool_calls.iter().map(OutToolCall::of).collect(),
                ..plain("assistant", content.as_str().into())
            },
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => OutMessage {
                tool_call_id: Some(tool_call_id),
                ..plain(
                    "tool",
                    if *is_error {
                        format!("Error: {content}").into()
                    } else {
                        content.as_str().into()
                    },
                )
            },
        });
    }
    out
}

fn stop_reason(s: Option<&str>) -> StopReason {
    match s {
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::Error,
        _ => StopReason::EndTurn,
    }
}

fn usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    Some(Usage {
        input_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        ..Default::default()
    })
}

fn body_error(provider: &str, error: &Value) -> LlmError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string());
    let code = error.get("code").and_then(|c| {
        c.as_u64()
            .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
    });
    match code {
        Some(status @ 400..=599) => LlmError::from_status(provider, status as u16, message, None),
        _ => LlmError::new(ErrorKind::Upstream, provider, message),
    }
}

/// The SSE state machine.
#[derive(Default)]
pub struct StreamDecoder {
    provider: String,
    model: String,
    usage: Usage,
    finish: Option<StopReason>,
    /// Tool calls by `index`: (id, name, arguments so far).
    tools: BTreeMap<u64, (String, String, String)>,
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

    fn flush_tools(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        let mut out = Vec::new();
        let cut_off = self.finish == Some(StopReason::MaxTokens);
        for (index, (id, name, args)) in std::mem::take(&mut self.tools) {
            let input = match wire::parse_arguments(&self.provider, &name, &args) {
                Ok(input) => input,
                // The token limit cut the call short: drop it and say so.
                Err(_) if cut_off => {
                    out.push(StreamEvent::Warning(format!(
                        "the answer reached the token limit inside tool call {name}; the incomplete call was dropped"
                    )));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let id = if id.is_empty() {
                format!("call_{index}")
            } else {
                id
            };
            out.push(StreamEvent::ToolCall(ToolCall { id, name, input }));
        }
        Ok(out)
    }

    fn done_event(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        let mut out = self.flush_tools()?;
        self.done = true;
        // Every server we know sends a finish_reason before `[DONE]`; a stream without one
        // was cut short by the server (llama-cpp-python does it when another request
        // interrupts the answer). The text so far is kept, and the user is told.
        if self.finish.is_none() {
            out.push(StreamEvent::Warning(NO_FINISH_REASON.to_owned()));
        }
        let mut stop = self.finish.unwrap_or_default();
        if stop == StopReason::EndTurn && out.iter().any(|e| matches!(e, StreamEvent::ToolCall(_)))
        {
            stop = StopReason::ToolUse;
        }
        out.push(StreamEvent::Done {
            stop_reason: stop,
            usage: self.usage,
            model: self.model.clone(),
        });
        Ok(out)
    }
}

/// The warning for a stream that ended with `[DONE]` but no `finish_reason`.
pub const NO_FINISH_REASON: &str = "the model server ended this answer without a finish_reason, so it may be cut short (llama-cpp-python does this when another request interrupts an answer: start it with --interrupt_requests False)";

impl Decoder for StreamDecoder {
    type Item = SseEvent;

    fn feed(&mut self, event: SseEvent) -> Result<Vec<StreamEvent>, LlmError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        if data == "[DONE]" {
            return self.done_event();
        }
        let v: Value = wire::parse_json(&self.provider, data)?;
        if let Some(error) = v.get("error") {
            return Err(body_error(&self.provider, error));
        }
        if let Some(m) = v.get("model").and_then(Value::as_str) {
            self.model = m.to_owned();
        }
        if let Some(u) = usage(&v) {
            self.usage = u;
        }
        let mut out = Vec::new();
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue; // only n=1 is requested
            }
            let delta = choice.get("delta").cloned().unwrap_or_default();
            if let Some(text) = delta
                .get("content")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                out.push(StreamEvent::TextDelta(text.to_owned()));
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = match call.get("index").and_then(Value::as_u64) {
                    Some(i) => i,
                    // Some servers (Ollama's /v1, Gemini, mistral.rs) omit `index`: a chunk
                    // with a new id starts a call, anything else continues the last one.
                    None => {
                        let id = call
                            .get("id")
                            .and_then(Value::as_str)
                            .filter(|s| !s.is_empty());
                        match self.tools.last_key_value() {
                            Some((last, (last_id, _, _))) if id.is_none_or(|id| id == last_id) => {
                                *last
                            }
                            Some((last, _)) => last + 1,
                            None => 0,
                        }
                    }
                };
                let entry = self.tools.entry(index).or_default();
                if let Some(id) = call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    entry.0 = id.to_owned();
                }
                if let Some(name) = call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    entry.1 = name.to_owned();
                }
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    entry.2.push_str(args);
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(stop_reason(Some(reason)));
            }
        }
        Ok(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        // Some compatible servers end after the finish_reason without `[DONE]`.
        if !self.done && self.finish.is_some() {
            return self.done_event();
        }
        wire::ended(self.done, &self.provider, "a finish_reason or [DONE]")
    }
}

/// A non-streamed response body.
pub fn parse_response(provider: &str, v: &Value) -> Result<ChatResponse, LlmError> {
    if let Some(error) = v.get("error") {
        return Err(body_error(provider, error));
    }
    let Some(choice) = v.pointer("/choices/0") else {
        return Err(LlmError::new(
            ErrorKind::Protocol,
            provider,
            "response has no choices",
        ));
    };
    let message = choice.get("message").cloned().unwrap_or_default();
    let mut response = ChatResponse {
        text: message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        stop_reason: stop_reason(choice.get("finish_reason").and_then(Value::as_str)),
        usage: usage(v).unwrap_or_default(),
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..Default::default()
    };
    for (i, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let raw = call.pointer("/function/arguments");
        let input = match raw {
            Some(Value::String(s)) => wire::parse_arguments(provider, &name, s)?,
            Some(v @ Value::Object(_)) => v.clone(),
            _ => json!({}),
        };
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .map_or_else(|| format!("call_{i}"), str::to_owned);
        response.tool_calls.push(ToolCall { id, name, input });
    }
    if !response.tool_calls.is_empty() && response.stop_reason == StopReason::EndTurn {
        response.stop_reason = StopReason::ToolUse;
    }
    Ok(response)
}

impl LlmProvider for OpenAi {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            let send = || {
                wire::send(
                    &self.config,
                    self.post_chat().json(&self.body(request, true)),
                )
            };
            super::retry::stream_with_retry(self.config.retry, || async {
                let response = match send().await {
                    // Some compatible servers reject `stream_options`: ask once more without
                    // it (usage then comes only if the server sends it anyway).
                    Err(e)
                        if matches!(e.kind, ErrorKind::BadRequest)
                            && e.message.contains("stream_options")
                            && self.stream_usage.swap(false, std::sync::atomic::Ordering::Relaxed) =>
                    {
                        tracing::info!(provider = %self.config.name, "endpoint rejects stream_options; streaming without usage reports");
                        send().await?
                    }
                    other => other?,
                };
                Ok(wire::decode(&self.config, response, Framing::Sse, wire::sse, StreamDecoder::new(&self.config.name)))
            })
            .await
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            let body = self.body(request, false);
            wire::complete_json(
                &self.config,
                || self.post_chat().json(&body),
                parse_response,
            )
            .await
        })
    }

    fn list_models(&self) -> LlmFuture<'_, Vec<String>> {
        let request = self.authorized(self.client.get(format!("{}/models", self.config.base_url)));
        Box::pin(wire::list_models(&self.config, request, "data", "id"))
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> LlmFuture<'a, super::Embeddings> {
        Box::pin(async move {
            let body = json!({"model": model, "input": inputs, "encoding_format": "float"});
            let response = super::retry::call_with_retry(self.config.retry, || {
                let request = self
                    .authorized(
                        self.client
                            .post(format!("{}/embeddings", self.config.base_url)),
                    )
                    .json(&body);
                wire::send(&self.config, request)
            })
            .await?;
            let v: Value = wire::json_body(&self.config, response).await?;
            let mut rows: Vec<(u64, Vec<f32>)> = v["data"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    (
                        d["index"].as_u64().unwrap_or(0),
                        wire::vector(&d["embedding"]),
                    )
                })
                .collect();
            rows.sort_by_key(|(i, _)| *i);
            if rows.len() != inputs.len() {
                return Err(LlmError::new(
                    super::ErrorKind::Protocol,
                    &self.config.name,
                    format!("{} embeddings for {} inputs", rows.len(), inputs.len()),
                ));
            }
            Ok(super::Embeddings {
                vectors: rows.into_iter().map(|(_, v)| v).collect(),
                input_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                model: v["model"].as_str().unwrap_or(model).to_owned(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: Value) -> SseEvent {
        SseEvent {
            id: String::new(),
            event: String::new(),
            data: v.to_string(),
        }
    }

    #[test]
    fn a_done_without_a_finish_reason_keeps_the_text_and_warns() {
        let mut d = StreamDecoder::new("local");
        let mut out = Vec::new();
        for e in [
            data(
                json!({"model": "m", "choices": [{"index": 0, "delta": {"content": "The pod is OOMKi"}, "finish_reason": null}]}),
            ),
            SseEvent {
                id: String::new(),
                event: String::new(),
                data: "[DONE]".into(),
            },
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(out[0], StreamEvent::TextDelta("The pod is OOMKi".into()));
        assert_eq!(out[1], StreamEvent::Warning(NO_FINISH_REASON.into()));
        assert!(
            matches!(
                &out[2],
                StreamEvent::Done {
                    stop_reason: StopReason::EndTurn,
                    ..
                }
            ),
            "{out:?}"
        );
    }

    #[test]
    fn parallel_tool_calls_assemble_by_index() {
        let mut d = StreamDecoder::new("openai");
        let mut out = Vec::new();
        let chunk = |delta: Value, finish: Value| {
            data(
                json!({"model": "gpt-x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
            )
        };
        for e in [
            chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_logs", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_events", "arguments": "{\"ns\""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pod\":"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"api\"}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": ":\"shop\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            data(
                json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 20}}),
            ),
            SseEvent {
                id: String::new(),
                event: String::new(),
                data: "[DONE]".into(),
            },
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(
            out,
            vec![
                StreamEvent::ToolCall(ToolCall {
                    id: "call_a".into(),
                    name: "get_logs".into(),
                    input: json!({"pod": "api"})
                }),
                StreamEvent::ToolCall(ToolCall {
                    id: "call_b".into(),
                    name: "get_events".into(),
                    input: json!({"ns": "shop"})
                }),
                StreamEvent::Done {
                    stop_reason: StopReason::ToolUse,
                    usage: Usage {
                        input_tokens: 50,
                        output_tokens: 20,
                        ..Default::default()
                    },
                    model: "gpt-x".into()
                },
            ]
        );
    }

    #[test]
    fn tool_errors_are_marked_in_content() {
        let history = [Message::Tool {
            tool_call_id: "c".into(),
            content: "denied".into(),
            is_error: true,
        }];
        let m = serde_json::to_value(messages(Some("sys"), &history)).unwrap_or_default();
        assert_eq!(m[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(
            m[1],
            json!({"role": "tool", "tool_call_id": "c", "content": "Error: denied"})
        );
    }

    #[test]
    fn tool_calls_without_index_and_truncation_at_the_limit() {
        let chunk = |delta: Value, finish: Value| {
            data(
                json!({"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
            )
        };
        // Ollama's /v1 style: no `index`, one complete call per chunk.
        let mut d = StreamDecoder::new("ollama-v1");
        let mut out = Vec::new();
        for e in [
            chunk(
                json!({"tool_calls": [{"id": "a", "function": {"name": "x", "arguments": "{\"n\":"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"function": {"arguments": "1}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"id": "b", "function": {"name": "y", "arguments": "{}"}}]}),
                json!("tool_calls"),
            ),
            SseEvent {
                id: String::new(),
                event: String::new(),
                data: "[DONE]".into(),
            },
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        let calls: Vec<_> = out
            .iter()
            .filter_map(|e| {
                if let StreamEvent::ToolCall(c) = e {
                    Some((c.id.clone(), c.input.clone()))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            calls,
            vec![
                ("a".to_owned(), json!({"n": 1})),
                ("b".to_owned(), json!({}))
            ]
        );

        // Cut off by the token limit inside the arguments: dropped with a warning.
        let mut d = StreamDecoder::new("openai");
        let mut out = Vec::new();
        for e in [
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "x", "arguments": "{\"a\": \"tru"}}]}),
                json!("length"),
            ),
            SseEvent {
                id: String::new(),
                event: String::new(),
                data: "[DONE]".into(),
            },
        ] {
            out.extend(d.feed(e).unwrap_or_else(|e| panic!("{e}")));
        }
        assert!(
            matches!(&out[0], StreamEvent::Warning(w) if w.contains("token limit")),
            "{out:?}"
        );
        assert!(matches!(
            out.last(),
            Some(StreamEvent::Done {
                stop_reason: StopReason::MaxTokens,
                ..
            })
        ));
    }
}
