//! A provider call in the words of the OpenTelemetry GenAI semantic conventions (v1.37):
//! the call's span ([`span`]) and, for a policy that opts in to content capture, its
//! messages as the conventions' JSON (`gen_ai.system_instructions`, `gen_ai.input.messages`,
//! `gen_ai.output.messages`). The request given here is already redacted.

use super::{ChatRequest, LlmProvider, Message, StopReason, ToolCall, Usage};
use crate::telemetry::trace::{self, LlmCall, LlmEnd};
use serde_json::{Value, json};
use tracing::Span;

/// The conventions' finish reason of a stop reason.
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndTurn => "stop",
        StopReason::ToolUse => "tool_call",
        StopReason::MaxTokens => "length",
        StopReason::StopSequence => "stop",
        StopReason::Error => "error",
    }
}

/// The `chat` span of a call to `adapter` for `request` (already redacted), with its content
/// when `capture`.
pub fn span(
    adapter: &dyn LlmProvider,
    request: &ChatRequest,
    streaming: bool,
    capture: bool,
) -> Span {
    let model = if request.model.is_empty() {
        adapter.default_model().unwrap_or_default()
    } else {
        request.model.as_str()
    };
    let span = trace::llm_span(&LlmCall {
        operation: "chat",
        provider_type: adapter.config().provider_type.as_str(),
        provider: adapter.name(),
        model,
        max_tokens: Some(request.max_tokens.unwrap_or(adapter.config().max_tokens)),
        streaming,
        server: adapter
            .config()
            .server
            .as_ref()
            .map(|(h, p)| (h.as_str(), *p)),
    });
    if capture && !span.is_disabled() {
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            span.record(
                "gen_ai.system_instructions",
                json!([{"type": "text", "content": system}]).to_string(),
            );
        }
        span.record(
            "gen_ai.input.messages",
            input_messages(&request.messages).to_string(),
        );
    }
    span
}

/// Records how a call ended (and its answer, when `capture`).
pub fn end(
    span: &Span,
    model: &str,
    usage: Usage,
    stop: Option<StopReason>,
    error: Option<&str>,
    capture: Option<(&str, &[ToolCall])>,
) {
    if span.is_disabled() {
        return;
    }
    let reason = stop.map(finish_reason);
    trace::llm_end(
        span,
        &LlmEnd {
            model,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            finish_reason: reason,
            error,
        },
    );
    if let Some((text, calls)) = capture {
        span.record(
            "gen_ai.output.messages",
            json!([{"role": "assistant", "parts": parts(text, calls),
                "finish_reason": reason.unwrap_or("stop")}])
            .to_string(),
        );
    }
}

fn parts(text: &str, calls: &[ToolCall]) -> Vec<Value> {
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(json!({"type": "text", "content": text}));
    }
    for c in calls {
        parts.push(json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.input}));
    }
    parts
}

/// The conversation as `gen_ai.input.messages`.
pub fn input_messages(messages: &[Message]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| match m {
                Message::User { content } => {
                    json!({"role": "user", "parts": [{"type": "text", "content": content}]})
                }
                Message::Assistant {
                    content,
                    tool_calls,
                } => json!({"role": "assistant", "parts": parts(content, tool_calls)}),
                Message::Tool {
                    tool_call_id,
                    content,
                    ..
                } => json!({"role": "tool", "parts": [{"type": "tool_call_response",
                    "id": tool_call_id, "response": content}]}),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_take_the_conventions_shape() {
        let v = input_messages(&[
            Message::User {
                content: "why?".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "get_events".into(),
                    input: json!({"namespace": "shop"}),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "BackOff".into(),
                is_error: false,
            },
        ]);
        assert_eq!(
            v[0],
            json!({"role": "user", "parts": [{"type": "text", "content": "why?"}]})
        );
        assert_eq!(
            v[1]["parts"][0],
            json!({"type": "tool_call", "id": "c1", "name": "get_events", "arguments": {"namespace": "shop"}})
        );
        assert_eq!(v[2]["parts"][0]["type"], "tool_call_response");
        assert_eq!(finish_reason(StopReason::ToolUse), "tool_call");
        assert_eq!(finish_reason(StopReason::MaxTokens), "length");
    }
}
