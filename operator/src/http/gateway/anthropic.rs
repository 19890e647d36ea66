//! `POST /v1/messages` in Anthropic's Messages format, streamed (`message_start` …
//! `message_stop` events) or not, with tools.

use super::{Flavor, GatewayError, authenticate, new_id, parse_body, routes_for};
use crate::http::AppState;
use crate::llm::{self, ChatRequest, Message, StopReason, StreamEvent, ToolCall};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Text of `content`: a string, or the text of its `text` blocks.
fn text_blocks(content: &Value, at: &str) -> Result<String, GatewayError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => Ok(blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")),
        Value::Null => Ok(String::new()),
        _ => Err(GatewayError::invalid(format!(
            "{at} must be a string or an array of content blocks"
        ))),
    }
}

/// The provider-agnostic request of a Messages body.
// Long because a wire format's match over Anthropic's content block types (text, image, tool_use,
// tool_result, thinking); each arm is one part of the format, with its own refusal message.
pub fn parse(body: &Value) -> Result<(String, ChatRequest, bool), GatewayError> {
    let model = body["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("model: Field required"))?
        .to_owned();
    let max_tokens = body["max_tokens"]
        .as_u64()
        .ok_or_else(|| GatewayError::invalid("max_tokens: Field required"))?;
    let raw = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("messages: at least one message is required"))?;
    let mut messages = Vec::new();
    let mut thinking_blocks = Vec::new();
    // System text given as messages (Claude Code sends its prompt so): joins `system`.
    let mut inline_system: Vec<String> = Vec::new();
    for (i, m) in raw.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = m["role"].as_str();
        if role == Some("system") {
            inline_system.push(text_blocks(&m["content"], &format!("{at}.content"))?);
            continue;
        }
        let blocks: Vec<Value> = match &m["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => {
                return Err(GatewayError::invalid(format!(
                    "{at}.content: a string or an array of blocks is required"
                )));
            }
        };
        match role {
            Some("user") => {
                // Tool results come first in a user turn, then any text.
                let mut text = Vec::new();
                for (j, b) in blocks.iter().enumerate() {
                    match b["type"].as_str() {
                        Some("text") => {
                            text.push(b["text"].as_str().unwrap_or_default().to_owned())
                        }
                        Some("tool_result") => messages.push(Message::Tool {
                            tool_call_id: b["tool_use_id"]
                                .as_str()
                                .ok_or_else(|| {
                                    GatewayError::invalid(format!(
                                        "{at}.content.{j}.tool_use_id: Field required"
                                    ))
                                })?
                                .to_owned(),
                            content: text_blocks(
                                &b["content"],
                                &format!("{at}.content.{j}.content"),
                            )?,
                            is_error: b["is_error"].as_bool().unwrap_or(false),
                        }),
                        Some(other) => {
                            return Err(GatewayError::invalid(format!(
                                "{at}.content.{j}: blocks of type {other:?} are not supported (text, tool_result)"
                            )));
                        }
                        None => {
                            return Err(GatewayError::invalid(format!(
                                "{at}.content.{j}.type: Field required"
                            )));
                        }
                    }
                }
                if !text.is_empty() {
                    messages.push(Message::User {
                        content: text.join("\n"),
                    });
                }
            }
            Some("assistant") => {
                let mut text = Vec::new();
                let mut tool_calls = Vec::new();
                let mut thought = Vec::new();
                for b in &blocks {
                    match b["type"].as_str() {
                        // Given back to Anthropic providers before the turn's tool calls.
                        Some("thinking" | "redacted_thinking") => thought.push(b.clone()),
                        Some("text") => {
                            text.push(b["text"].as_str().unwrap_or_default().to_owned())
                        }
                        Some("tool_use") => tool_calls.push(ToolCall {
                            id: b["id"].as_str().unwrap_or_default().to_owned(),
                            name: b["name"].as_str().unwrap_or_default().to_owned(),
                            input: if b["input"].is_object() {
                                b["input"].clone()
                            } else {
                                json!({})
                            },
                        }),
                        // Thinking blocks and the like are not sent back.
                        _ => {}
                    }
                }
                if !thought.is_empty() {
                    thinking_blocks.push((messages.len(), thought));
                }
                messages.push(Message::Assistant {
                    content: text.join("\n"),
                    tool_calls,
                });
            }
            _ => {
                return Err(GatewayError::invalid(format!(
                    "{at}.role: must be \"user\", \"assistant\" or \"system\""
                )));
            }
        }
    }
    let mut tools = Vec::new();
    for (i, t) in body["tools"].as_array().into_iter().flatten().enumerate() {
        tools.push(super::tool_spec(t, "input_schema", || {
            format!("tools.{i}.name: Field required")
        })?);
    }
    let tool_choice = match body["tool_choice"]["type"].as_str() {
        Some("none") => {
            tools.clear();
            None
        }
        Some("auto") => Some(llm::ToolChoice::Auto),
        Some("any") => Some(llm::ToolChoice::Required),
        Some("tool") => body["tool_choice"]["name"]
            .as_str()
            .map(|n| llm::ToolChoice::Tool(n.to_owned())),
        _ => None,
    };
    let request = ChatRequest {
        model: model.clone(),
        system: {
            let mut parts = match &body["system"] {
                Value::Null => Vec::new(),
                other => vec![text_blocks(other, "system")?],
            };
            parts.extend(inline_system);
            parts.retain(|s| !s.is_empty());
            (!parts.is_empty()).then(|| parts.join("\n\n"))
        },
        messages,
        tools,
        max_tokens: Some(u32::try_from(max_tokens).unwrap_or(u32::MAX)),
        temperature: body["temperature"].as_f64().map(|t| t as f32),
        stop: body["stop_sequences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        tool_choice,
        thinking: body.get("thinking").cloned().filter(Value::is_object),
        thinking_blocks,
        ..Default::default()
    };
    Ok((model, request, body["stream"].as_bool().unwrap_or(false)))
}

fn stop_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::Error => "refusal",
        StopReason::EndTurn => "end_turn",
    }
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    match handle(&state, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.render(Flavor::Anthropic),
    }
}

fn event(name: &str, data: Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

async fn handle(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let caller = authenticate(state, headers)?;
    let body = parse_body(body)?;
    let (model, request, stream) = parse(&body)?;
    let started =
        super::route_and_dispatch(state, &caller, &model, request, "messages", stream).await?;
    let id = new_id("msg_");
    let redactor = caller.redactor.clone();
    if !stream {
        let r = llm::collect(started.stream, std::time::Instant::now())
            .await
            .map_err(|e| GatewayError::from_llm(&e, &redactor))?;
        let mut content: Vec<Value> = r.thinking.clone();
        if !r.text.is_empty() {
            content.push(json!({"type": "text", "text": r.text}));
        }
        for c in &r.tool_calls {
            content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}));
        }
        let served = if r.model.is_empty() {
            started.model.clone()
        } else {
            r.model.clone()
        };
        return Ok(axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": served, "content": content,
            "stop_reason": stop_reason(r.stop_reason), "stop_sequence": null,
            "usage": {"input_tokens": r.usage.input_tokens, "output_tokens": r.usage.output_tokens},
        }))
        .into_response());
    }
    // Streamed: a text block opened at the first delta, one block per tool call (its whole
    // input as one input_json_delta), then message_delta and message_stop.
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
            "model": started.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}),
    );
    let mut index: usize = 0;
    let mut text_open = false;
    let events = started.stream.flat_map(move |e| {
        let mut out: Vec<Bytes> = Vec::new();
        let close_text = |out: &mut Vec<Bytes>, index: &mut usize, text_open: &mut bool| {
            if *text_open {
                out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": *index})));
                *index += 1;
                *text_open = false;
            }
        };
        match e {
            Ok(StreamEvent::TextDelta(t)) => {
                if !text_open {
                    out.push(event("content_block_start", json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "text", "text": ""}})));
                    text_open = true;
                }
                out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": t}})));
            }
            Ok(StreamEvent::ToolCall(c)) => {
                close_text(&mut out, &mut index, &mut text_open);
                out.push(event("content_block_start", json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
                out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": c.input.to_string()}})));
                out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
                index += 1;
            }
            Ok(StreamEvent::Warning(_)) => {}
            // A thinking block, whole: its text as one thinking_delta, then its signature.
            Ok(StreamEvent::Thinking(block)) => {
                close_text(&mut out, &mut index, &mut text_open);
                let mut start = block.clone();
                if start["type"] == "thinking" {
                    start["thinking"] = json!("");
                    start["signature"] = json!("");
                }
                out.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": start})));
                if block["type"] == "thinking" {
                    out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})));
                    out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]}})));
                }
                out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
                index += 1;
            }
            Ok(StreamEvent::Done { stop_reason: r, usage, .. }) => {
                close_text(&mut out, &mut index, &mut text_open);
                out.push(event("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(r), "stop_sequence": null},
                    "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}})));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
            Err(e) => {
                let e = GatewayError::from_llm(&e, &redactor);
                out.push(event("error", json!({"type": "error", "error": {"type": "api_error", "message": e.message}})));
            }
        }
        futures_util::stream::iter(out)
    });
    let body = futures_util::stream::once(async move { start })
        .chain(events)
        .map(Ok::<_, std::convert::Infallible>);
    Ok(super::sse_response(body))
}

/// `POST /v1/messages/count_tokens`: the input tokens of a Messages request. An Anthropic
/// provider counts them itself (the request passed through, redacted, with the client's
/// `anthropic-beta`); any other is estimated from the text, and the answer says so in
/// `x-kortex-token-count: estimated`.
pub async fn count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match count(&state, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.render(Flavor::Anthropic),
    }
}

async fn count(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let caller = authenticate(state, headers)?;
    let mut body = parse_body(body)?;
    // The same body as a Messages request, without max_tokens.
    let mut as_messages = body.clone();
    if as_messages.get("max_tokens").is_none() {
        as_messages["max_tokens"] = json!(1);
    }
    let (model, request, _) = parse(&as_messages)?;
    let config = state.config.borrow().clone();
    let routes = routes_for(&config.catalog, &caller, &model)?;
    let beta = headers.get("anthropic-beta").and_then(|v| v.to_str().ok());
    for route in &routes {
        let key = crate::catalog::ObjectKey::new(&caller.namespace, &route.provider);
        let Some(adapter) = config
            .catalog
            .providers
            .get(&key)
            .and_then(|e| state.engine.adapters.get(config.version, &key, e).ok())
        else {
            continue;
        };
        body["model"] = json!(route.model);
        caller.redactor.value(&mut body);
        if let Some(counting) = adapter.count_tokens(&body, beta) {
            let tokens = counting
                .await
                .map_err(|e| GatewayError::from_llm(&e, &caller.redactor))?;
            return Ok((
                [("x-kortex-token-count", "exact")],
                axum::Json(json!({"input_tokens": tokens})),
            )
                .into_response());
        }
        break;
    }
    let estimate = llm::estimate_input(&request);
    Ok((
        [("x-kortex-token-count", "estimated")],
        axum::Json(json!({"input_tokens": estimate})),
    )
        .into_response())
}
