//! `toolMode: prompt`, for models without native tool calling: the tools are described in
//! the system prompt, earlier calls and results are written into the conversation as text,
//! and calls are parsed from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//! markers in the answer. Best effort, so every response carries a warning saying so.

use super::{
    BoxFuture, Capabilities, ChatRequest, ChatResponse, ChatStream, LlmError, LlmProvider, Message,
    StopReason, StreamEvent, ToolCall,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The warning attached to every prompt-mode response.
pub const WARNING: &str = "toolMode prompt: tool calls are parsed from the model's text (best effort); prefer a model with native tool calling";

/// Wraps an adapter so that tools travel in the prompt.
pub struct PromptTools {
    inner: Arc<dyn LlmProvider>,
}

impl PromptTools {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmProvider>) -> Self {
        Self { inner }
    }
}

/// The request as the model sees it in prompt mode.
pub fn rewrite(request: &ChatRequest) -> ChatRequest {
    if request.tools.is_empty() {
        return request.clone();
    }
    let mut system = request.system.clone().unwrap_or_default();
    if !system.is_empty() {
        system.push_str("\n\n");
    }
    system.push_str(
        "You can call tools. To call one, write exactly one block per call:\n\
         <tool_call>{\"name\": \"TOOL_NAME\", \"arguments\": {...}}</tool_call>\n\
         and then stop: the results come back as <tool_result> blocks. Available tools:\n",
    );
    for t in &request.tools {
        system.push_str(&format!(
            "- {}: {} Arguments (JSON Schema): {}\n",
            t.name, t.description, t.parameters
        ));
    }
    let messages = request
        .messages
        .iter()
        .map(|m| match m {
            Message::Assistant { content, tool_calls } if !tool_calls.is_empty() => {
                let mut text = content.clone();
                for c in tool_calls {
                    text.push_str(&format!("\n{OPEN}{}{CLOSE}", json!({"name": c.name, "arguments": c.input})));
                }
                Message::Assistant { content: text, tool_calls: Vec::new() }
            }
            Message::Tool { tool_call_id, content, is_error } => Message::User {
                content: format!("<tool_result id=\"{tool_call_id}\" error=\"{is_error}\">\n{content}\n</tool_result>"),
            },
            other => other.clone(),
        })
        .collect();
    ChatRequest {
        system: Some(system),
        messages,
        tools: Vec::new(),
        ..request.clone()
    }
}

/// Pulls `<tool_call>` blocks out of streamed text.
#[derive(Default)]
pub struct Extractor {
    buffer: String,
    inside: bool,
    calls: usize,
}

/// What one piece of text turned into.
#[derive(Default, Debug, PartialEq)]
pub struct Extracted {
    /// Text outside any marker.
    pub text: String,
    /// Parsed calls.
    pub calls: Vec<ToolCall>,
    /// Blocks that could not be parsed (kept as text too).
    pub warnings: Vec<String>,
}

impl Extractor {
    /// Feeds text.
    pub fn push(&mut self, text: &str) -> Extracted {
        self.buffer.push_str(text);
        let mut out = Extracted::default();
        loop {
            if self.inside {
                let Some(end) = self.buffer.find(CLOSE) else {
                    break;
                };
                let body: String = self.buffer.drain(..end + CLOSE.len()).collect();
                self.inside = false;
                self.parse(&body[..end], &mut out);
            } else if let Some(start) = self.buffer.find(OPEN) {
                out.text.extend(self.buffer.drain(..start));
                self.buffer.drain(..OPEN.len());
                self.inside = true;
            } else {
                // Hold back a tail that could be the start of a marker.
                let keep = (1..OPEN.len())
                    .rev()
                    .find(|n| self.buffer.ends_with(&OPEN[..*n]))
                    .unwrap_or(0);
                let emit = self.buffer.len() - keep;
                out.text.extend(self.buffer.drain(..emit));
                break;
            }
        }
        out
    }

    /// The end of the text: an unterminated block is parsed as if closed.
    pub fn finish(&mut self) -> Extracted {
        let mut out = Extracted::default();
        let rest = std::mem::take(&mut self.buffer);
        if self.inside {
            self.inside = false;
            self.parse(&rest, &mut out);
        } else {
            out.text = rest;
        }
        out
    }

    fn parse(&mut self, body: &str, out: &mut Extracted) {
        let parsed: Option<(String, Value)> = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_owned();
                let args = v
                    .get("arguments")
                    .or_else(|| v.get("input"))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                Some((name, args))
            });
        match parsed {
            Some((name, input)) => {
                out.calls.push(ToolCall {
                    id: format!("call_{}", self.calls),
                    name,
                    input,
                });
                self.calls += 1;
            }
            None => {
                out.warnings.push(format!(
                    "could not parse a tool call block: {}",
                    body.trim().chars().take(200).collect::<String>()
                ));
                out.text.push_str(&format!("{OPEN}{body}{CLOSE}"));
            }
        }
    }
}

fn events(extracted: Extracted) -> Vec<Result<StreamEvent, LlmError>> {
    let mut out = Vec::new();
    if !extracted.text.is_empty() {
        out.push(Ok(StreamEvent::TextDelta(extracted.text)));
    }
    out.extend(
        extracted
            .calls
            .into_iter()
            .map(|c| Ok(StreamEvent::ToolCall(c))),
    );
    out.extend(
        extracted
            .warnings
            .into_iter()
            .map(|w| Ok(StreamEvent::Warning(w))),
    );
    out
}

impl LlmProvider for PromptTools {
    fn config(&self) -> &super::ProviderConfig {
        self.inner.config()
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<super::Embeddings, LlmError>> {
        self.inner.embed(model, inputs)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_tools: false,
            tools: true,
            streaming: true,
        }
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>> {
        Box::pin(async move {
            if request.tools.is_empty() {
                return self.inner.stream(request).await;
            }
            let rewritten = rewrite(request);
            let inner = self.inner.stream(&rewritten).await?;
            let mut extractor = Extractor::default();
            let mut saw_call = false;
            let head =
                futures_util::stream::iter(vec![Ok(StreamEvent::Warning(WARNING.to_owned()))]);
            let body = inner.flat_map(move |item| {
                let out = match item {
                    Ok(StreamEvent::TextDelta(t)) => events(extractor.push(&t)),
                    Ok(StreamEvent::Done {
                        mut stop_reason,
                        usage,
                        model,
                    }) => {
                        let mut out = events(extractor.finish());
                        saw_call |= out
                            .iter()
                            .any(|e| matches!(e, Ok(StreamEvent::ToolCall(_))));
                        if saw_call && stop_reason == StopReason::EndTurn {
                            stop_reason = StopReason::ToolUse;
                        }
                        out.push(Ok(StreamEvent::Done {
                            stop_reason,
                            usage,
                            model,
                        }));
                        out
                    }
                    other => vec![other],
                };
                saw_call |= out
                    .iter()
                    .any(|e| matches!(e, Ok(StreamEvent::ToolCall(_))));
                futures_util::stream::iter(out)
            });
            Ok(head.chain(body).boxed())
        })
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            if request.tools.is_empty() {
                return self.inner.complete(request).await;
            }
            let mut response = self.inner.complete(&rewrite(request)).await?;
            let mut extractor = Extractor::default();
            let mut first = extractor.push(&response.text);
            let rest = extractor.finish();
            first.text.push_str(&rest.text);
            first.calls.extend(rest.calls);
            first.warnings.extend(rest.warnings);
            response.text = first.text;
            response.tool_calls = first.calls;
            response.warnings.push(WARNING.to_owned());
            response.warnings.extend(first.warnings);
            if !response.tool_calls.is_empty() && response.stop_reason == StopReason::EndTurn {
                response.stop_reason = StopReason::ToolUse;
            }
            Ok(response)
        })
    }

    fn list_models(&self) -> BoxFuture<'_, Result<Vec<String>, LlmError>> {
        self.inner.list_models()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_calls_split_across_deltas() {
        let mut x = Extractor::default();
        let mut all = Extracted::default();
        for piece in [
            "Let me check.<tool",
            "_call>{\"name\": \"get_logs\", \"argu",
            "ments\": {\"ns\": \"shop\"}}</tool_c",
            "all> done",
            " <tool_call>not json</tool_call>",
        ] {
            let e = x.push(piece);
            all.text.push_str(&e.text);
            all.calls.extend(e.calls);
            all.warnings.extend(e.warnings);
        }
        let e = x.finish();
        all.text.push_str(&e.text);
        assert_eq!(
            all.calls,
            vec![ToolCall {
                id: "call_0".into(),
                name: "get_logs".into(),
                input: json!({"ns": "shop"})
            }]
        );
        assert_eq!(
            all.text,
            "Let me check. done <tool_call>not json</tool_call>"
        );
        assert_eq!(all.warnings.len(), 1);
    }

    #[test]
    fn unterminated_block_at_the_end_still_counts() {
        let mut x = Extractor::default();
        let e = x.push("<tool_call>{\"name\": \"get_events\", \"arguments\": {}}");
        assert!(e.calls.is_empty() && e.text.is_empty());
        assert_eq!(x.finish().calls.len(), 1);
    }

    #[test]
    fn history_becomes_text() {
        let r = rewrite(&ChatRequest {
            messages: vec![
                Message::Assistant {
                    content: "".into(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "get_logs".into(),
                        input: json!({"a": 1}),
                    }],
                },
                Message::Tool {
                    tool_call_id: "c1".into(),
                    content: "oom".into(),
                    is_error: false,
                },
            ],
            tools: vec![super::super::ToolSpec {
                name: "get_logs".into(),
                description: "Logs.".into(),
                parameters: json!({"type": "object"}),
            }],
            ..Default::default()
        });
        assert!(r.tools.is_empty());
        assert!(r.system.unwrap_or_default().contains("- get_logs: Logs."));
        assert!(
            matches!(&r.messages[0], Message::Assistant { content, tool_calls } if tool_calls.is_empty() && content.contains("<tool_call>{\"arguments\":{\"a\":1},\"name\":\"get_logs\"}</tool_call>"))
        );
        assert!(
            matches!(&r.messages[1], Message::User { content } if content.contains("<tool_result id=\"c1\""))
        );
    }
}
