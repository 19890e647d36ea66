//! `POST /v1/chat/completions` in OpenAI's Chat Completions format, streamed (`data:`
//! chunks, `[DONE]`) or not, with tools and `response_format`.

use super::{Flavor, GatewayError, authenticate, new_id, parse_body, routes_for};
use crate::http::AppState;
use crate::llm::{self, ChatRequest, Message, StopReason, StreamEvent, ToolCall};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Text of a message's `content`: a string, or an array of parts whose `text` parts count.
fn text_of(content: &Value, at: &str) -> Result<String, GatewayError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, part) in parts.iter().enumerate() {
                match part["type"].as_str() {
                    Some("text") => out.push_str(part["text"].as_str().unwrap_or_default()),
                    Some(other) => {
                        return Err(GatewayError::invalid(format!(
                            "{at}.content[{i}]: content parts of type {other:?} are not supported (only text)"
                        )));
                    }
                    None => {
                        return Err(GatewayError::invalid(format!(
                            "{at}.content[{i}].type is required"
                        )));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(GatewayError::invalid(format!(
            "{at}.content must be a string or an array of parts"
        ))),
    }
}

/// The provider-agnostic request of a Chat Completions body.
// Long because a wire format's match over OpenAI's message roles and content parts; each arm is one
// part of the format, with its own refusal message.
pub fn parse(body: &Value) -> Result<(String, ChatRequest, bool, bool), GatewayError> {
    let model = body["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("model is required"))?
        .to_owned();
    let raw = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("messages must be a non-empty array"))?;
    let mut system: Vec<String> = Vec::new();
    let mut messages = Vec::new();
    for (i, m) in raw.iter().enumerate() {
        let at = format!("messages[{i}]");
        match m["role"].as_str() {
            Some("system" | "developer") => system.push(text_of(&m["content"], &at)?),
            Some("user") => messages.push(Message::User {
                content: text_of(&m["content"], &at)?,
            }),
            Some("assistant") => {
                let mut tool_calls = Vec::new();
                for (j, c) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
                    let arguments = c["function"]["arguments"].as_str().unwrap_or("{}");
                    let input: Value = serde_json::from_str(if arguments.trim().is_empty() {
                        "{}"
                    } else {
                        arguments
                    })
                    .map_err(|e| {
                        GatewayError::invalid(format!(
                            "{at}.tool_calls[{j}].function.arguments is not JSON: {e}"
                        ))
                    })?;
                    tool_calls.push(ToolCall {
                        id: c["id"].as_str().unwrap_or_default().to_owned(),
                        name: c["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        input,
                    });
                }
                messages.push(Message::Assistant {
                    content: text_of(&m["content"], &at)?,
                    tool_calls,
                });
            }
            Some("tool") => messages.push(Message::Tool {
                tool_call_id: m["tool_call_id"]
                    .as_str()
                    .ok_or_else(|| GatewayError::invalid(format!("{at}.tool_call_id is required")))?
                    .to_owned(),
                content: text_of(&m["content"], &at)?,
                is_error: false,
            }),
            Some(other) => {
                return Err(GatewayError::invalid(format!(
                    "{at}.role {other:?} is not supported"
                )));
            }
            None => return Err(GatewayError::invalid(format!("{at}.role is required"))),
        }
    }
    let mut tools = Vec::new();
    for (i, t) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if t["type"] != "function" {
            return Err(GatewayError::invalid(format!(
                "tools[{i}].type must be \"function\""
            )));
        }
        tools.push(super::tool_spec(&t["function"], "parameters", || {
            format!("tools[{i}].function.name is required")
        })?);
    }
    // `tool_choice`: "none" offers no tools this time; "required" or a named function
    // forces a call (passed to providers that take it).
    let tool_choice = match &body["tool_choice"] {
        Value::String(s) if s == "none" => {
            tools.clear();
            None
        }
        Value::String(s) if s == "auto" => Some(llm::ToolChoice::Auto),
        Value::String(s) if s == "required" => Some(llm::ToolChoice::Required),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => o
            .get("function")
            .and_then(|f| f["name"].as_str())
            .map(|n| llm::ToolChoice::Tool(n.to_owned())),
        _ => None,
    };
    let max_tokens = body["max_completion_tokens"]
        .as_u64()
        .or_else(|| body["max_tokens"].as_u64())
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let stop = match &body["stop"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let response_format = match body["response_format"]["type"].as_str() {
        None | Some("text") => None,
        Some("json_object" | "json_schema") => Some(body["response_format"].clone()),
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "response_format.type {other:?} is not supported (text, json_object, json_schema)"
            )));
        }
    };
    let request = ChatRequest {
        model: model.clone(),
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages,
        tools,
        max_tokens,
        temperature: body["temperature"].as_f64().map(|t| t as f32),
        stop,
        response_format,
        tool_choice,
        ..Default::default()
    };
    let stream = body["stream"].as_bool().unwrap_or(false);
    let include_usage = body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    Ok((model, request, stream, include_usage))
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::ToolUse => "tool_calls",
        StopReason::MaxTokens => "length",
        StopReason::Error => "content_filter",
        StopReason::EndTurn | StopReason::StopSequence => "stop",
    }
}

/// A tool call of an answer; `index` in streamed chunks.
#[derive(serde::Serialize)]
struct OutCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    #[serde(flatten)]
    call: llm::OutToolCall<'a>,
}

/// Token counts in OpenAI's names.
#[derive(serde::Serialize)]
struct OutUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl OutUsage {
    fn of(u: &llm::Usage) -> Self {
        Self {
            prompt_tokens: u.input_tokens,
            completion_tokens: u.output_tokens,
            total_tokens: u.input_tokens + u.output_tokens,
        }
    }
}

/// A `chat.completion` (not streamed), serialized from borrowed fields.
#[derive(serde::Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    choices: [CompletionChoice<'a>; 1],
    usage: OutUsage,
    system_fingerprint: Option<()>,
}

#[derive(serde::Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: OutAnswer<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(serde::Serialize)]
struct OutAnswer<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutCall<'a>>,
}

/// A `chat.completion.chunk`.
#[derive(serde::Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<()>,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OutUsage>,
}

#[derive(serde::Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Default, serde::Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutCall<'a>>,
}

/// What every chunk of one streamed answer repeats.
struct Head {
    id: String,
    created: i64,
    model: String,
}

impl Head {
    /// A chunk with one choice.
    fn chunk(&self, delta: Delta<'_>, finish: Option<&'static str>) -> Bytes {
        sse(&Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
            }],
            usage: None,
        })
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    fn usage(&self, usage: &llm::Usage) -> Bytes {
        sse(&Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices: Vec::new(),
            usage: Some(OutUsage::of(usage)),
        })
    }
}

/// `data: <json>\n\n`.
fn sse(value: &impl serde::Serialize) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    // Serializing these types cannot fail (no maps with non-string keys).
    let _ = serde_json::to_writer(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle(&state, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.render(Flavor::OpenAi),
    }
}

// Long because one Chat Completions request in order: parse, route, then the non-streamed body or the
// stream's chunk shapes, each a piece of OpenAI's wire format.
async fn handle(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let caller = authenticate(state, headers)?;
    let body = parse_body(body)?;
    let (model, request, stream, include_usage) = parse(&body)?;
    let started =
        super::route_and_dispatch(state, &caller, &model, request, "chat.completions", stream)
            .await?;
    let id = new_id("chatcmpl-");
    let created = jiff::Timestamp::now().as_second();
    let redactor = caller.redactor.clone();
    if !stream {
        let response = llm::collect(started.stream, std::time::Instant::now())
            .await
            .map_err(|e| GatewayError::from_llm(&e, &redactor))?;
        let served = if response.model.is_empty() {
            started.model.clone()
        } else {
            response.model.clone()
        };
        let body = Completion {
            id: &id,
            object: "chat.completion",
            created,
            model: &served,
            choices: [CompletionChoice {
                index: 0,
                message: OutAnswer {
                    role: "assistant",
                    content: (!response.text.is_empty() || response.tool_calls.is_empty())
                        .then_some(response.text.as_str()),
                    refusal: None,
                    tool_calls: response
                        .tool_calls
                        .iter()
                        .map(|c| OutCall {
                            index: None,
                            call: llm::OutToolCall::of(c),
                        })
                        .collect(),
                },
                logprobs: None,
                finish_reason: finish_reason(response.stop_reason),
            }],
            usage: OutUsage::of(&response.usage),
            system_fingerprint: None,
        };
        let mut out = Vec::with_capacity(512);
        // Serializing these types cannot fail (no maps with non-string keys).
        let _ = serde_json::to_writer(&mut out, &body);
        return Ok((
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            out,
        )
            .into_response());
    }
    // Streamed: one chunk per text delta and per tool call, then the finish reason, the
    // usage when asked for, and [DONE].
    let head = Head {
        id,
        created,
        model: started.model.clone(),
    };
    let first = head.chunk(
        Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Default::default()
        },
        None,
    );
    let mut tool_index = 0usize;
    let events = started.stream.flat_map(move |event| {
        let out: Vec<Bytes> = match event {
            Ok(StreamEvent::TextDelta(t)) => vec![head.chunk(
                Delta {
                    content: Some(&t),
                    ..Default::default()
                },
                None,
            )],
            Ok(StreamEvent::ToolCall(c)) => {
                let index = tool_index;
                tool_index += 1;
                vec![head.chunk(
                    Delta {
                        tool_calls: vec![OutCall {
                            index: Some(index),
                            call: llm::OutToolCall::of(&c),
                        }],
                        ..Default::default()
                    },
                    None,
                )]
            }
            Ok(StreamEvent::Warning(_) | StreamEvent::Thinking(_)) => Vec::new(),
            Ok(StreamEvent::Done {
                stop_reason, usage, ..
            }) => {
                let mut out = vec![head.chunk(Delta::default(), Some(finish_reason(stop_reason)))];
                if include_usage {
                    out.push(head.usage(&usage));
                }
                out
            }
            Err(e) => {
                let e = GatewayError::from_llm(&e, &redactor);
                vec![Bytes::from(format!(
                    "data: {}\n\n",
                    json!({"error": {"message": e.message, "type": "api_error", "param": null, "code": e.code}})
                ))]
            }
        };
        futures_util::stream::iter(out)
    });
    let body = futures_util::stream::once(async move { first })
        .chain(events)
        .chain(futures_util::stream::once(async {
            Bytes::from_static(b"data: [DONE]\n\n")
        }))
        .map(Ok::<_, std::convert::Infallible>);
    Ok(super::sse_response(body))
}

/// `POST /v1/embeddings`: OpenAI's format, `encoding_format` float or base64 (what the
/// official SDK asks for by default). Only the provider serving the requested model
/// answers: vectors of another model would not be comparable, so there is no failover.
pub async fn embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle_embeddings(&state, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.render(Flavor::OpenAi),
    }
}

// Long because the embeddings path in order: parse and check the request, pick the one provider, call it,
// encode the vectors (float or base64) and meter; no failover, so no step is shared with chat.
async fn handle_embeddings(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let caller = authenticate(state, headers)?;
    let body = parse_body(body)?;
    let model = body["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("model is required"))?
        .to_owned();
    let inputs: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => {
            return Err(GatewayError::invalid(
                "input must be a string or a non-empty array of strings (token arrays are not supported)",
            ));
        }
    };
    let base64 = match body["encoding_format"].as_str() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "encoding_format {other:?} is not supported (float, base64)"
            )));
        }
    };
    let (config, route) = {
        let config = state.config.borrow().clone();
        let routes = routes_for(&config.catalog, &caller, &model)?;
        let route = routes
            .into_iter()
            .next()
            .ok_or_else(|| GatewayError::invalid("no route"))?;
        (config, route)
    };
    let governor = state.governor.clone();
    let catalog = &config.catalog;
    let redactor = &caller.redactor;
    let adapter = catalog
        .provider(&caller.namespace, &route.provider)
        .ok_or_else(|| GatewayError::invalid("the provider is gone"))
        .and_then(|e| llm::build(e).map_err(|e| GatewayError::from_llm(&e, redactor)))?;
    // What is embedded is redacted like anything else sent to a provider.
    let mut redactions = 0;
    let inputs: Vec<String> = inputs
        .iter()
        .map(|t| {
            let (out, n) = redactor.text(t);
            redactions += n;
            out
        })
        .collect();
    let estimate = ChatRequest {
        messages: inputs
            .iter()
            .map(|t| Message::User { content: t.clone() })
            .collect(),
        ..Default::default()
    };
    let attempt = crate::govern::attempt::Attempt {
        scope: &caller.scope,
        provider: &route.provider,
        model: &route.model,
        audit: crate::store::NewDecision {
            namespace: Some(caller.namespace.clone()),
            user: Some(caller.team.clone()),
            policy: caller.policy.object.metadata.name.clone(),
            detail: json!({"source": "gateway", "endpoint": "embeddings"}),
            ..Default::default()
        },
    };
    let reservation = match governor
        .reserve_for(&attempt, adapter.as_ref(), &estimate, 0, true)
        .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(GatewayError::budget(&e)),
        Err(e) => return Err(GatewayError::store(&e)),
    };
    let started = std::time::Instant::now();
    let span = crate::telemetry::trace::llm_span(&crate::telemetry::trace::LlmCall {
        operation: "embeddings",
        provider_type: adapter.config().provider_type.as_str(),
        provider: adapter.name(),
        model: &route.model,
        max_tokens: None,
        streaming: false,
        server: adapter
            .config()
            .server
            .as_ref()
            .map(|(h, p)| (h.as_str(), *p)),
    });
    let result =
        tracing::Instrument::instrument(adapter.embed(&route.model, &inputs), span.clone()).await;
    llm::semconv::end(
        &span,
        result
            .as_ref()
            .map(|e| e.model.as_str())
            .unwrap_or_default(),
        result
            .as_ref()
            .map(|e| llm::Usage {
                input_tokens: e.input_tokens,
                ..Default::default()
            })
            .unwrap_or_default(),
        None,
        result.as_ref().err().map(|e| e.kind.as_str()),
        None,
    );
    drop(span);
    let (usage, served, outcome) = match &result {
        Ok(e) => (
            llm::Usage {
                input_tokens: e.input_tokens,
                output_tokens: 0,
                ..Default::default()
            },
            e.model.clone(),
            "ok",
        ),
        Err(e) => (llm::Usage::default(), String::new(), e.kind.as_str()),
    };
    let latency_ms = started.elapsed().as_millis() as i64;
    // The books and the call's audit row, in one transaction.
    let outcome = crate::govern::Outcome {
        usage,
        model: served.clone(),
        latency_ms,
        outcome: outcome.into(),
    };
    let detail = json!({"inputs": inputs.len(), "inputTokens": usage.input_tokens,
        "latencyMs": latency_ms, "redactions": redactions});
    let _ = governor
        .settle_attempt(&attempt, reservation, &outcome, detail)
        .await;
    let embeddings = result.map_err(|e| GatewayError::from_llm(&e, redactor))?;
    let data: Vec<Value> = embeddings
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(crate::redact::base64_bytes(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list", "data": data,
        "model": if served.is_empty() { route.model } else { served },
        "usage": {"prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens},
    }))
    .into_response())
}
