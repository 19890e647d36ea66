//! Usage that cannot be dodged: a server that reports no token counts (many local servers
//! send none in streams) is charged what the text it read and wrote comes to, with the same
//! rough estimator as the context budget (about 4 characters a token), and the usage is
//! marked `estimated`.

use super::{
    ChatRequest, ChatResponse, ChatStream, LlmFuture, LlmProvider, Message, StreamEvent, Usage,
};
use futures_util::StreamExt;
use std::sync::Arc;

/// Tokens of `bytes` bytes of text.
fn estimate_text(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// A rough token estimate of a conversation (about 4 characters a token, plus per-message
/// overhead): enough to stay clear of the window without a tokenizer per vendor.
pub fn estimate_messages(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let chars = match m {
                Message::User { content } => content.len(),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    content.len()
                        + tool_calls
                            .iter()
                            .map(|c| c.name.len() + c.input.to_string().len())
                            .sum::<usize>()
                }
                Message::Tool {
                    content,
                    tool_call_id,
                    ..
                } => content.len() + tool_call_id.len(),
            };
            chars as u64 / 4 + 8
        })
        .sum()
}

/// Estimated input tokens of `request`: the conversation, the system prompt and the tool
/// definitions.
pub fn estimate_input(request: &ChatRequest) -> u64 {
    let fixed = request.system.as_deref().map_or(0, str::len)
        + request
            .tools
            .iter()
            .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
            .sum::<usize>();
    estimate_messages(&request.messages) + estimate_text(fixed)
}

/// Fills what the provider did not report: input from the request's estimate, output from
/// the bytes written, only when something was written.
fn complete_usage(mut usage: Usage, input: u64, written: usize) -> Usage {
    if usage.output_tokens == 0 && written > 0 {
        usage.output_tokens = estimate_text(written);
        usage.estimated = true;
    }
    if usage.input_tokens == 0 {
        usage.input_tokens = input;
        usage.estimated = true;
    }
    usage
}

/// Wraps every adapter (outermost), so chat, roles and the gateway all see complete usage.
pub struct Estimating {
    inner: Arc<dyn LlmProvider>,
}

impl Estimating {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmProvider>) -> Self {
        Self { inner }
    }
}

impl LlmProvider for Estimating {
    delegate_to_inner!();

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            let inner = self.inner.stream(request).await?;
            let input = estimate_input(request);
            let mut written = 0usize;
            Ok(inner
                .map(move |item| match item {
                    Ok(StreamEvent::TextDelta(t)) => {
                        written += t.len();
                        Ok(StreamEvent::TextDelta(t))
                    }
                    Ok(StreamEvent::ToolCall(c)) => {
                        written += c.name.len() + c.input.to_string().len();
                        Ok(StreamEvent::ToolCall(c))
                    }
                    Ok(StreamEvent::Done {
                        stop_reason,
                        usage,
                        model,
                    }) => Ok(StreamEvent::Done {
                        stop_reason,
                        usage: complete_usage(usage, input, written),
                        model,
                    }),
                    other => other,
                })
                .boxed())
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            let mut response = self.inner.complete(request).await?;
            let written = response.text.len()
                + response
                    .tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.input.to_string().len())
                    .sum::<usize>();
            response.usage = complete_usage(response.usage, estimate_input(request), written);
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_missing_is_estimated() {
        let request = ChatRequest {
            messages: vec![Message::User {
                content: "x".repeat(400),
            }],
            ..Default::default()
        };
        let reported = Usage {
            input_tokens: 10,
            output_tokens: 5,
            estimated: false,
        };
        assert_eq!(
            complete_usage(reported, estimate_input(&request), 80),
            reported
        );
        let none = complete_usage(Usage::default(), estimate_input(&request), 80);
        assert_eq!(
            none,
            Usage {
                input_tokens: 108,
                output_tokens: 20,
                estimated: true
            }
        );
        let input_only = Usage {
            input_tokens: 10,
            ..Default::default()
        };
        assert_eq!(
            complete_usage(input_only, estimate_input(&request), 8),
            Usage {
                input_tokens: 10,
                output_tokens: 2,
                estimated: true
            }
        );
    }
}
