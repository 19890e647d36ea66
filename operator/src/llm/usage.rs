//! Usage that cannot be dodged: a server that reports no token counts (many local servers
//! send none in streams) is charged what the text it read and wrote comes to, with the same
//! rough estimator as the context budget (about 4 characters a token), and the usage is
//! marked `estimated`.

use super::{
    BoxFuture, ChatRequest, ChatResponse, ChatStream, LlmError, LlmProvider, Message, StreamEvent,
    Usage,
};
use futures_util::StreamExt;
use std::sync::Arc;

/// Tokens of `chars` characters of text.
pub fn estimate_text(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
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

/// Fills what the provider did not report: input from the request, output from what was
/// written (`chars`), only when something was written or read.
fn complete_usage(mut usage: Usage, request: &ChatRequest, chars: usize) -> Usage {
    if usage.output_tokens == 0 && chars > 0 {
        usage.output_tokens = estimate_text(chars);
        usage.estimated = true;
    }
    if usage.input_tokens == 0 {
        usage.input_tokens = estimate_input(request);
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
    fn config(&self) -> &super::ProviderConfig {
        self.inner.config()
    }

    fn capabilities(&self) -> super::Capabilities {
        self.inner.capabilities()
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<super::Embeddings, LlmError>> {
        self.inner.embed(model, inputs)
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>> {
        Box::pin(async move {
            let inner = self.inner.stream(request).await?;
            let request = request.clone();
            let mut chars = 0usize;
            Ok(inner
                .map(move |item| match item {
                    Ok(StreamEvent::TextDelta(t)) => {
                        chars += t.chars().count();
                        Ok(StreamEvent::TextDelta(t))
                    }
                    Ok(StreamEvent::ToolCall(c)) => {
                        chars += c.name.len() + c.input.to_string().len();
                        Ok(StreamEvent::ToolCall(c))
                    }
                    Ok(StreamEvent::Done {
                        stop_reason,
                        usage,
                        model,
                    }) => Ok(StreamEvent::Done {
                        stop_reason,
                        usage: complete_usage(usage, &request, chars),
                        model,
                    }),
                    other => other,
                })
                .boxed())
        })
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let mut response = self.inner.complete(request).await?;
            let chars = response.text.chars().count()
                + response
                    .tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.input.to_string().len())
                    .sum::<usize>();
            response.usage = complete_usage(response.usage, request, chars);
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
        assert_eq!(complete_usage(reported, &request, 80), reported);
        let none = complete_usage(Usage::default(), &request, 80);
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
            complete_usage(input_only, &request, 8),
            Usage {
                input_tokens: 10,
                output_tokens: 2,
                estimated: true
            }
        );
    }
}
