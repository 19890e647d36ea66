//! Ollama's native API: `POST /api/chat` streamed as newline-delimited JSON, tool calls with
//! arguments as JSON objects, `done_reason`, `prompt_eval_count`/`eval_count`; models from
//! `GET /api/tags`.

use super::wire::{self, Decoder, Framing};
use super::{
    ChatRequest, ChatResponse, ChatStream, ErrorKind, LlmError, LlmFuture, LlmProvider, Message,
    ProviderConfig, StopReason, StreamEvent, ToolCall, Usage,
};
use crate::crd::ToolMode;
use serde_json::{Value, json};

/// An Ollama server.
pub struct Ollama {
    config: ProviderConfig,
    client: reqwest::Client,
}

impl Ollama {
    /// An adapter over `client`.
    pub fn new(config: ProviderConfig, client: reqwest::Client) -> Self {
        Self { config, client }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .client
            .request(method, format!("{}{path}", self.config.base_url));
        match &self.config.api_key {
            Some(key) => r.bearer_auth(key.expose()),
            None => r,
        }
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Value {
        let model = if request.model.is_empty() {
            self.config.default_model.clone().unwrap_or_default()
        } else {
            request.model.clone()
        };
        let mut options =
            json!({"num_predict": request.max_tokens.unwrap_or(self.config.max_tokens)});
        if let Some(t) = request.temperature.or(self.config.temperature) {
            options["temperature"] = json!(t);
        }
        if !request.stop.is_empty() {
            options["stop"] = json!(request.stop);
        }
        let mut body = json!({
            "model": model,
            "messages": messages(request.system.as_deref(), &request.messages),
            "stream": stream,
            "options": options,
        });
        // Ollama's `format` takes a JSON Schema, or "json".
        match request
            .response_format
            .as_ref()
            .map(|f| (f["type"].as_str(), f))
        {
            Some((Some("json_schema"), f)) => body["format"] = f["json_schema"]["schema"].clone(),
            Some((Some("json_object"), _)) => body["format"] = json!("json"),
            _ => {}
        }
        if self.config.tool_mode != ToolMode::None && !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
        }
        body
    }
}

fn messages(system: Option<&str>, history: &[Message]) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        out.push(json!({"role": "system", "content": s}));
    }
    // Ollama matches tool results to calls by name, so remember which call had which name.
    let mut names = std::collections::HashMap::new();
    for m in history {
        out.push(match m {
            Message::User { content } => json!({"role": "user", "content": content}),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut v = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    for c in tool_calls {
                        names.insert(c.id.clone(), c.name.clone());
                    }
                    v["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| json!({"function": {"name": c.name, "arguments": c.input}}))
                        .collect();
                }
                v
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let content = if *is_error {
                    format!("Error: {content}")
                } else {
                    content.clone()
                };
                let mut v = json!({"role": "tool", "content": content});
                if let Some(name) = names.get(tool_call_id) {
                    v["tool_name"] = json!(name);
                }
                v
            }
        });
    }
    out
}

fn tool_calls(message: &Value, first_index: usize) -> Vec<ToolCall> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let input = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| json!({"_raw": s}))
                }
                Some(v) => v.clone(),
                None => json!({}),
            };
            ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{}", first_index + i), str::to_owned),
                name: c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input,
            }
        })
        .collect()
}

fn stop_reason(reason: Option<&str>, had_tools: bool) -> StopReason {
    match reason {
        Some("length") => StopReason::MaxTokens,
        _ if had_tools => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

fn usage(v: &Value) -> Usage {
    Usage {
        input_tokens: v
            .get("prompt_eval_count")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        output_tokens: v.get("eval_count").and_then(Value::as_u64).unwrap_or(0),
        ..Default::default()
    }
}

/// The NDJSON state machine.
#[derive(Default)]
pub struct StreamDecoder {
    provider: String,
    calls: usize,
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
    type Item = String;

    fn feed(&mut self, line: String) -> Result<Vec<StreamEvent>, LlmError> {
        let v: Value = wire::parse_json(&self.provider, &line)?;
        if let Some(error) = v.get("error") {
            let message = error
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string());
            return Err(LlmError::new(ErrorKind::Upstream, &self.provider, message));
        }
        let mut out = Vec::new();
        let message = v.get("message").cloned().unwrap_or_default();
        if let Some(text) = message
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            out.push(StreamEvent::TextDelta(text.to_owned()));
        }
        for call in tool_calls(&message, self.calls) {
            self.calls += 1;
            out.push(StreamEvent::ToolCall(call));
        }
        if v.get("done").and_then(Value::as_bool) == Some(true) {
            self.done = true;
            out.push(StreamEvent::Done {
                stop_reason: stop_reason(
                    v.get("done_reason").and_then(Value::as_str),
                    self.calls > 0,
                ),
                usage: usage(&v),
                model: v
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        Ok(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        wire::ended(self.done, &self.provider, "\"done\": true")
    }
}

/// A non-streamed response body.
pub fn parse_response(provider: &str, v: &Value) -> Result<ChatResponse, LlmError> {
    if let Some(error) = v.get("error") {
        let message = error
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| error.to_string());
        return Err(LlmError::new(ErrorKind::Upstream, provider, message));
    }
    let Some(message) = v.get("message") else {
        return Err(LlmError::new(
            ErrorKind::Protocol,
            provider,
            "response has no message",
        ));
    };
    let calls = tool_calls(message, 0);
    Ok(ChatResponse {
        text: message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        stop_reason: stop_reason(
            v.get("done_reason").and_then(Value::as_str),
            !calls.is_empty(),
        ),
        tool_calls: calls,
        usage: usage(v),
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..Default::default()
    })
}

impl LlmProvider for Ollama {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            let body = self.body(request, true);
            let post = || self.request(reqwest::Method::POST, "/api/chat").json(&body);
            wire::stream_call(&self.config, post, Framing::Ndjson, wire::line, || {
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
                || self.request(reqwest::Method::POST, "/api/chat").json(&body),
                parse_response,
            )
            .await
        })
    }

    fn list_models(&self) -> LlmFuture<'_, Vec<String>> {
        let request = self.request(reqwest::Method::GET, "/api/tags");
        Box::pin(wire::list_models(&self.config, request, "models", "name"))
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> LlmFuture<'a, super::Embeddings> {
        Box::pin(async move {
            let body = json!({"model": model, "input": inputs});
            let response = super::retry::call_with_retry(self.config.retry, || {
                wire::send(
                    &self.config,
                    self.request(reqwest::Method::POST, "/api/embed")
                        .json(&body),
                )
            })
            .await?;
            let v: Value = wire::json_body(&self.config, response).await?;
            let vectors: Vec<Vec<f32>> = v["embeddings"]
                .as_array()
                .into_iter()
                .flatten()
                .map(wire::vector)
                .collect();
            if vectors.len() != inputs.len() {
                return Err(LlmError::new(
                    super::ErrorKind::Protocol,
                    &self.config.name,
                    format!("{} embeddings for {} inputs", vectors.len(), inputs.len()),
                ));
            }
            Ok(super::Embeddings {
                vectors,
                input_tokens: v["prompt_eval_count"].as_u64().unwrap_or(0),
                model: v["model"].as_str().unwrap_or(model).to_owned(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_stream_with_tool_call_and_counts() {
        let mut d = StreamDecoder::new("ollama");
        let mut out = Vec::new();
        for line in [
            json!({"model": "qwen3", "message": {"role": "assistant", "content": "Let me look."}, "done": false}),
            json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_logs", "arguments": {"namespace": "shop"}}}]}, "done": false}),
            json!({"model": "qwen3", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop", "prompt_eval_count": 26, "eval_count": 9}),
        ] {
            out.extend(d.feed(line.to_string()).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(
            out,
            vec![
                StreamEvent::TextDelta("Let me look.".into()),
                StreamEvent::ToolCall(ToolCall {
                    id: "call_0".into(),
                    name: "get_logs".into(),
                    input: json!({"namespace": "shop"})
                }),
                StreamEvent::Done {
                    stop_reason: StopReason::ToolUse,
                    usage: Usage {
                        input_tokens: 26,
                        output_tokens: 9,
                        ..Default::default()
                    },
                    model: "qwen3".into()
                },
            ]
        );
    }
}
