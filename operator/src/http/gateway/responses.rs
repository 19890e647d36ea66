//! `POST /v1/responses` (OpenAI's Responses API, `docs/gateway.md#responses`): text and
//! item input, `instructions`, function tools and their outputs, `tool_choice`,
//! `text.format`, `max_output_tokens`, streamed semantic events; routed like
//! `/v1/chat/completions` (same adapters, policy routes and failover, budgets, redaction
//! and usage). With `store` (the default, as OpenAI's) a response is kept, scoped to the
//! key's team, for `previous_response_id`, `GET /v1/responses/{id}` and `DELETE`.

use super::{Flavor, GatewayError, KeyHolder, authenticate, new_id, parse_body};
use crate::http::AppState;
use crate::llm::{self, ChatRequest, Message, StopReason, StreamEvent, ToolCall};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// OpenAI's hosted tools, which Kortex does not run.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
];

/// What a Responses request asks for, besides the provider-agnostic request.
struct Asked {
    model: String,
    request: ChatRequest,
    /// The conversation as items (earlier turns included), kept with a stored response.
    items: Vec<Value>,
    stream: bool,
    store: bool,
    /// Echoed in the response object.
    echo: Value,
}

fn text_content(content: &Value, at: &str) -> Result<String, GatewayError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match p["type"].as_str() {
                    Some("input_text" | "output_text" | "text") => {
                        out.push_str(p["text"].as_str().unwrap_or_default())
                    }
                    Some("refusal") => out.push_str(p["refusal"].as_str().unwrap_or_default()),
                    other => {
                        return Err(GatewayError::invalid(format!(
                            "{at}.content[{i}].type {:?} is not supported (input_text, output_text)",
                            other.unwrap_or("missing")
                        )));
                    }
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(GatewayError::invalid(format!(
            "{at}.content must be a string or an array of parts"
        ))),
    }
}

/// The conversation of `items` (Responses input items), with system text apart.
fn conversation(items: &[Value]) -> Result<(Vec<String>, Vec<Message>), GatewayError> {
    let mut system = Vec::new();
    let mut messages: Vec<Message> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item["type"].as_str().unwrap_or("message");
        match kind {
            "message" => {
                let text = text_content(&item["content"], &at)?;
                match item["role"].as_str() {
                    Some("system" | "developer") => system.push(text),
                    Some("user") => messages.push(Message::User { content: text }),
                    Some("assistant") => messages.push(Message::Assistant {
                        content: text,
                        tool_calls: Vec::new(),
                    }),
                    other => {
                        return Err(GatewayError::invalid(format!(
                            "{at}.role {:?} is not supported (user, assistant, system, developer)",
                            other.unwrap_or("missing")
                        )));
                    }
                }
            }
            "function_call" => {
                let arguments = item["arguments"].as_str().unwrap_or("{}");
                let input: Value = serde_json::from_str(if arguments.trim().is_empty() {
                    "{}"
                } else {
                    arguments
                })
                .map_err(|e| GatewayError::invalid(format!("{at}.arguments is not JSON: {e}")))?;
                let call = ToolCall {
                    id: item["call_id"]
                        .as_str()
                        .ok_or_else(|| GatewayError::invalid(format!("{at}.call_id is required")))?
                        .to_owned(),
                    name: item["name"]
                        .as_str()
                        .ok_or_else(|| GatewayError::invalid(format!("{at}.name is required")))?
                        .to_owned(),
                    input,
                };
                // Calls of one turn join the assistant message before them.
                match messages.last_mut() {
                    Some(Message::Assistant { tool_calls, .. }) => tool_calls.push(call),
                    _ => messages.push(Message::Assistant {
                        content: String::new(),
                        tool_calls: vec![call],
                    }),
                }
            }
            "function_call_output" => messages.push(Message::Tool {
                tool_call_id: item["call_id"]
                    .as_str()
                    .ok_or_else(|| GatewayError::invalid(format!("{at}.call_id is required")))?
                    .to_owned(),
                content: match &item["output"] {
                    Value::String(s) => s.clone(),
                    other => text_content(other, &at)?,
                },
                is_error: false,
            }),
            // Reasoning summaries of an earlier turn: not sent on.
            "reasoning" => {}
            other => {
                return Err(GatewayError::invalid(format!(
                    "{at}.type {other:?} is not supported (message, function_call, function_call_output)"
                )));
            }
        }
    }
    Ok((system, messages))
}

/// Input as items: a string is one user message.
fn input_items(body: &Value) -> Result<Vec<Value>, GatewayError> {
    match &body["input"] {
        Value::String(s) => Ok(vec![
            json!({"type": "message", "role": "user", "content": s}),
        ]),
        Value::Array(items) => Ok(items.clone()),
        Value::Null => Err(GatewayError::invalid("input is required")),
        _ => Err(GatewayError::invalid(
            "input must be a string or an array of items",
        )),
    }
}

fn parse(body: &Value, earlier: Vec<Value>) -> Result<Asked, GatewayError> {
    let model = body["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| GatewayError::invalid("model is required"))?
        .to_owned();
    let mut items = earlier;
    items.extend(input_items(body)?);
    let (mut system, messages) = conversation(&items)?;
    if let Some(instructions) = body["instructions"].as_str().filter(|s| !s.is_empty()) {
        system.insert(0, instructions.to_owned());
    }
    let mut tools = Vec::new();
    for (i, t) in body["tools"].as_array().into_iter().flatten().enumerate() {
        match t["type"].as_str() {
            Some("function") => tools.push(super::tool_spec(t, "parameters", || {
                format!("tools[{i}].name is required")
            })?),
            Some(hosted) if HOSTED_TOOLS.contains(&hosted) => {
                return Err(GatewayError::invalid(format!(
                    "tools[{i}]: {hosted} is one of OpenAI's hosted tools, which Kortex's gateway does not run; declare a function tool and run it in your application"
                )));
            }
            other => {
                return Err(GatewayError::invalid(format!(
                    "tools[{i}].type {:?} is not supported (function)",
                    other.unwrap_or("missing")
                )));
            }
        }
    }
    let tool_choice = match &body["tool_choice"] {
        Value::String(s) if s == "none" => {
            tools.clear();
            None
        }
        Value::String(s) if s == "auto" => Some(llm::ToolChoice::Auto),
        Value::String(s) if s == "required" => Some(llm::ToolChoice::Required),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => o
            .get("name")
            .and_then(Value::as_str)
            .map(|n| llm::ToolChoice::Tool(n.to_owned())),
        Value::Null => None,
        other => {
            return Err(GatewayError::invalid(format!(
                "tool_choice {other} is not supported (auto, none, required, {{\"type\": \"function\", \"name\": …}})"
            )));
        }
    };
    // `text.format` in the Chat Completions shape the adapters take.
    let format = &body["text"]["format"];
    let response_format = match format["type"].as_str() {
        None | Some("text") => None,
        Some("json_object") => Some(json!({"type": "json_object"})),
        Some("json_schema") => Some(json!({"type": "json_schema", "json_schema": {
            "name": format["name"].as_str().unwrap_or("response"),
            "schema": format["schema"],
            "strict": format["strict"].as_bool().unwrap_or(false),
        }})),
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "text.format.type {other:?} is not supported (text, json_object, json_schema)"
            )));
        }
    };
    let max_tokens = body["max_output_tokens"]
        .as_u64()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let request = ChatRequest {
        model: model.clone(),
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages,
        tools,
        max_tokens,
        temperature: body["temperature"].as_f64().map(|t| t as f32),
        response_format,
        tool_choice,
        ..Default::default()
    };
    let echo = json!({
        "instructions": body.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": body.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "metadata": body.get("metadata").cloned().filter(Value::is_object).unwrap_or_else(|| json!({})),
        "parallel_tool_calls": body["parallel_tool_calls"].as_bool().unwrap_or(true),
        "previous_response_id": body.get("previous_response_id").cloned().unwrap_or(Value::Null),
        "temperature": body.get("temperature").cloned().unwrap_or(Value::Null),
        "text": if format.is_object() { json!({"format": format}) } else { json!({"format": {"type": "text"}}) },
        "tool_choice": body.get("tool_choice").cloned().filter(|v| !v.is_null()).unwrap_or_else(|| json!("auto")),
        "tools": body.get("tools").cloned().filter(Value::is_array).unwrap_or_else(|| json!([])),
        "top_p": body.get("top_p").cloned().unwrap_or(Value::Null),
        "truncation": "disabled",
        "user": body.get("user").cloned().unwrap_or(Value::Null),
    });
    Ok(Asked {
        model,
        request,
        items,
        stream: body["stream"].as_bool().unwrap_or(false),
        store: body["store"].as_bool().unwrap_or(true),
        echo,
    })
}

fn usage_json(u: &llm::Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.input_tokens + u.output_tokens,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn call_item(id: &str, call: &ToolCall, status: &str, arguments: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call.id, "name": call.name,
        "arguments": arguments, "status": status})
}

/// The response object.
struct Shape {
    id: String,
    created: i64,
    model: String,
    echo: Value,
}

impl Shape {
    fn response(
        &self,
        status: &str,
        output: &[Value],
        usage: Option<&llm::Usage>,
        stop: Option<StopReason>,
    ) -> Value {
        let mut v = self.echo.clone();
        v["id"] = json!(self.id);
        v["object"] = json!("response");
        v["created_at"] = json!(self.created);
        v["status"] = json!(status);
        v["model"] = json!(self.model);
        v["output"] = json!(output);
        v["error"] = Value::Null;
        v["incomplete_details"] = match stop {
            Some(StopReason::MaxTokens) => json!({"reason": "max_output_tokens"}),
            _ => Value::Null,
        };
        v["usage"] = usage.map_or(Value::Null, usage_json);
        v
    }
}

fn status_of(stop: StopReason) -> &'static str {
    match stop {
        StopReason::MaxTokens => "incomplete",
        _ => "completed",
    }
}

/// Keeps a completed response (with its conversation) for chaining and retrieval.
async fn keep(
    state: &AppState,
    caller: &KeyHolder,
    items: &[Value],
    output: &[Value],
    response: &Value,
) {
    let mut conversation = items.to_vec();
    conversation.extend(output.iter().cloned());
    if let Err(e) = state
        .store
        .keep_response(
            response["id"].as_str().unwrap_or_default(),
            &caller.namespace,
            &caller.team,
            &Value::Array(conversation),
            response,
        )
        .await
    {
        tracing::warn!(error = %e, "cannot store a response (previous_response_id will not find it)");
    }
}

/// `POST /v1/responses`.
pub async fn create(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    match handle(&state, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.render(Flavor::OpenAi),
    }
}

// Long because one Responses request in order: earlier response, parse, route, then the stored and
// streamed shapes of OpenAI's Responses events.
async fn handle(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let caller = authenticate(state, headers)?;
    let body = parse_body(body)?;
    let earlier = match body["previous_response_id"].as_str() {
        Some(id) => state
            .store
            .kept_response(id, &caller.namespace, &caller.team)
            .await
            .map_err(|e| GatewayError::store(&e))?
            .map(|(conversation, _)| conversation.as_array().cloned().unwrap_or_default())
            .ok_or_else(|| not_found(id))?,
        None => Vec::new(),
    };
    let asked = parse(&body, earlier)?;
    let started = super::route_and_dispatch(
        state,
        &caller,
        &asked.model,
        asked.request,
        "responses",
        asked.stream,
    )
    .await?;
    let shape = Shape {
        id: new_id("resp_"),
        created: jiff::Timestamp::now().as_second(),
        model: started.model.clone(),
        echo: asked.echo,
    };
    let redactor = caller.redactor.clone();
    if !asked.stream {
        let response = llm::collect(started.stream, std::time::Instant::now())
            .await
            .map_err(|e| GatewayError::from_llm(&e, &redactor))?;
        let mut output = Vec::new();
        if !response.text.is_empty() || response.tool_calls.is_empty() {
            output.push(message_item(&new_id("msg_"), &response.text, "completed"));
        }
        for c in &response.tool_calls {
            output.push(call_item(
                &new_id("fc_"),
                c,
                "completed",
                &c.input.to_string(),
            ));
        }
        let shape = Shape {
            model: if response.model.is_empty() {
                shape.model
            } else {
                response.model.clone()
            },
            ..shape
        };
        let body = shape.response(
            status_of(response.stop_reason),
            &output,
            Some(&response.usage),
            Some(response.stop_reason),
        );
        if asked.store {
            keep(state, &caller, &asked.items, &output, &body).await;
        }
        return Ok(axum::Json(body).into_response());
    }
    // Streamed: the documented semantic events, numbered.
    let stream_state = Arc::new(Mutex::new(Streaming {
        seq: 0,
        output: Vec::new(),
        text: None,
    }));
    let shape = Arc::new(shape);
    let head = {
        let mut s = stream_state.lock().unwrap_or_else(|e| e.into_inner());
        let created = shape.response("in_progress", &[], None, None);
        let mut out = s.event("response.created", json!({"response": created}));
        out.extend_from_slice(&s.event("response.in_progress", json!({"response": created})));
        Bytes::from(out)
    };
    let store = asked.store;
    let items = Arc::new(asked.items);
    let state = state.clone();
    let caller = Arc::new(caller);
    let events = started.stream.then(move |event| {
        let (st, shape, items, state, caller, redactor) = (
            stream_state.clone(),
            shape.clone(),
            items.clone(),
            state.clone(),
            caller.clone(),
            redactor.clone(),
        );
        async move {
            let (bytes, finished) = {
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    Ok(StreamEvent::TextDelta(t)) => (s.text_delta(&t), None),
                    Ok(StreamEvent::ToolCall(c)) => (s.tool_call(&c), None),
                    Ok(StreamEvent::Warning(_) | StreamEvent::Thinking(_)) => (Vec::new(), None),
                    Ok(StreamEvent::Done {
                        stop_reason, usage, ..
                    }) => {
                        let mut out = s.close_text();
                        let body = shape.response(
                            status_of(stop_reason),
                            &s.output,
                            Some(&usage),
                            Some(stop_reason),
                        );
                        let name = if stop_reason == StopReason::MaxTokens {
                            "response.incomplete"
                        } else {
                            "response.completed"
                        };
                        out.extend_from_slice(&s.event(name, json!({"response": body})));
                        (out, Some((s.output.clone(), body)))
                    }
                    Err(e) => {
                        let e = GatewayError::from_llm(&e, &redactor);
                        (
                            s.event(
                                "error",
                                json!({"code": e.code, "message": e.message, "param": null}),
                            ),
                            None,
                        )
                    }
                }
            };
            if let (true, Some((output, body))) = (store, finished) {
                keep(&state, &caller, &items, &output, &body).await;
            }
            Bytes::from(bytes)
        }
    });
    let body = futures_util::stream::once(async move { head })
        .chain(events)
        .map(Ok::<_, std::convert::Infallible>);
    Ok(super::sse_response(body))
}

/// The streamed events' state: their numbers, the items so far, the open text item.
struct Streaming {
    seq: u64,
    output: Vec<Value>,
    /// The message item being written: its id and text.
    text: Option<(String, String)>,
}

impl Streaming {
    fn event(&mut self, name: &str, mut data: Value) -> Vec<u8> {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        format!("event: {name}\ndata: {data}\n\n").into_bytes()
    }

    fn text_delta(&mut self, t: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let index = self.output.len();
        if self.text.is_none() {
            let id = new_id("msg_");
            out.extend(self.event("response.output_item.added", json!({"output_index": index,
                "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}})));
            out.extend(self.event("response.content_part.added", json!({"item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
            self.text = Some((id, String::new()));
        }
        let id = self
            .text
            .as_ref()
            .map(|(id, _)| id.clone())
            .unwrap_or_default();
        if let Some((_, text)) = self.text.as_mut() {
            text.push_str(t);
        }
        out.extend(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index,
            "content_index": 0, "delta": t, "logprobs": []}),
        ));
        out
    }

    fn close_text(&mut self) -> Vec<u8> {
        let Some((id, text)) = self.text.take() else {
            return Vec::new();
        };
        let index = self.output.len();
        let mut out = self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index,
            "content_index": 0, "text": text, "logprobs": []}),
        );
        out.extend(self.event("response.content_part.done", json!({"item_id": id, "output_index": index,
            "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}})));
        let item = message_item(&id, &text, "completed");
        out.extend(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
        out
    }

    fn tool_call(&mut self, c: &ToolCall) -> Vec<u8> {
        let mut out = self.close_text();
        let index = self.output.len();
        let id = new_id("fc_");
        let arguments = c.input.to_string();
        out.extend(self.event(
            "response.output_item.added",
            json!({"output_index": index,
            "item": call_item(&id, c, "in_progress", "")}),
        ));
        out.extend(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id,
            "output_index": index, "delta": arguments}),
        ));
        out.extend(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id,
            "output_index": index, "arguments": arguments}),
        ));
        let item = call_item(&id, c, "completed", &arguments);
        out.extend(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
        out
    }
}

fn not_found(id: &str) -> GatewayError {
    GatewayError::new(
        StatusCode::NOT_FOUND,
        llm::ErrorKind::BadRequest,
        "not_found",
        format!(
            "no stored response {id} for this key's team (store: false, deleted, past retention, or another team's)"
        ),
    )
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let found = async {
        let caller = authenticate(&state, &headers)?;
        state
            .store
            .kept_response(&id, &caller.namespace, &caller.team)
            .await
            .map_err(|e| GatewayError::store(&e))?
            .map(|(_, response)| axum::Json(response).into_response())
            .ok_or_else(|| not_found(&id))
    };
    found.await.unwrap_or_else(|e| e.render(Flavor::OpenAi))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let done = async {
        let caller = authenticate(&state, &headers)?;
        if state
            .store
            .forget_response(&id, &caller.namespace, &caller.team)
            .await
            .map_err(|e| GatewayError::store(&e))?
        {
            Ok(
                axum::Json(json!({"id": id, "object": "response", "deleted": true}))
                    .into_response(),
            )
        } else {
            Err(not_found(&id))
        }
    };
    done.await.unwrap_or_else(|e| e.render(Flavor::OpenAi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_a_conversation_with_calls_joined_to_their_turn() {
        let body = json!({"model": "m", "instructions": "Be brief.", "input": [
            {"role": "user", "content": "weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": ""},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": "noon"},
        ], "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
           "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
           "max_output_tokens": 50});
        let a = parse(&body, Vec::new()).unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(a.request.system.as_deref(), Some("Be brief."));
        assert_eq!(a.request.messages.len(), 4, "{:?}", a.request.messages);
        assert!(
            matches!(&a.request.messages[1], Message::Assistant { tool_calls, .. } if tool_calls.len() == 2)
        );
        assert_eq!(a.request.max_tokens, Some(50));
        assert_eq!(
            a.request
                .response_format
                .as_ref()
                .map(|f| f["json_schema"]["strict"].clone()),
            Some(json!(true))
        );
        assert!(a.store, "store is on by default, as OpenAI's");
    }

    #[test]
    fn hosted_tools_and_unknown_items_are_refused_by_name() {
        let refused = |body: Value| {
            parse(&body, Vec::new())
                .err()
                .map(|e| e.message)
                .unwrap_or_default()
        };
        let e = refused(
            json!({"model": "m", "input": "hi", "tools": [{"type": "web_search_preview"}]}),
        );
        assert!(
            e.contains("web_search_preview is one of OpenAI's hosted tools"),
            "{e}"
        );
        let e = refused(json!({"model": "m", "input": [{"type": "input_image"}]}));
        assert!(
            e.starts_with("input[0].type \"input_image\" is not supported"),
            "{e}"
        );
    }
}
