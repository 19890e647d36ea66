//! `toolMode: prompt`, for models without native tool calling: the tools are described in
//! the system prompt, earlier calls and results are written into the conversation as text,
//! and calls are asked for as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//! and read from the answer in that and every other format [`super::recover`] knows. Best
//! effort, so every response carries a warning saying so.

use super::recover::{read_response, read_stream};
use super::{ChatRequest, ChatResponse, ChatStream, LlmFuture, LlmProvider, Message, StreamEvent};
use futures_util::StreamExt;
use serde_json::json;
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

impl LlmProvider for PromptTools {
    delegate_to_inner!();

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            if request.tools.is_empty() {
                return self.inner.stream(request).await;
            }
            let inner = self.inner.stream(&rewrite(request)).await?;
            let head =
                futures_util::stream::iter(vec![Ok(StreamEvent::Warning(WARNING.to_owned()))]);
            Ok(head.chain(read_stream(inner, request, false)).boxed())
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            if request.tools.is_empty() {
                return self.inner.complete(request).await;
            }
            let mut response = self.inner.complete(&rewrite(request)).await?;
            response.warnings.push(WARNING.to_owned());
            read_response(&mut response, request, false);
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToolCall;
    use super::*;

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
