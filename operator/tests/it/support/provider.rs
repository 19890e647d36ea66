//! The scripted LLM provider: a local HTTP server on 127.0.0.1 that answers each request
//! with the next queued [`Reply`] (or a [`Script::responder`]), in a vendor's documented
//! wire format ([`Dialect`]: Anthropic, OpenAI, Ollama), and records every request it saw.

use crate::support::net::{eventually, serve};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One scripted reply.
#[derive(Clone, Default)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: &'static str,
    pub chunks: Vec<String>,
    /// Sleep this long after the chunks instead of ending (a stalled server).
    pub stall: Option<Duration>,
    /// Pause between chunks (default 2 ms): a slow stream.
    pub chunk_delay: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

/// Computes the reply to a chat request from its body (when no scripted reply is queued).
pub type Responder = Box<dyn Fn(&Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
pub struct Script {
    replies: Mutex<VecDeque<Reply>>,
    pub responder: Mutex<Option<Responder>>,
    /// Replies to GET requests (model lists), kept apart so a background probe never takes
    /// a reply scripted for a chat call. Empty: an empty model list.
    get_replies: Mutex<VecDeque<Reply>>,
    pub seen: Mutex<Vec<Seen>>,
    /// When the body of the last streamed reply was dropped (the client went away).
    pub dropped_at: Mutex<Option<Instant>>,
}

impl Script {
    /// The requests it has had so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

struct DropGuard(Arc<Script>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Ok(mut d) = self.0.dropped_at.lock() {
            *d = Some(Instant::now());
        }
    }
}

async fn handle(State(script): State<Arc<Script>>, req: axum::extract::Request) -> Response {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    script
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Seen {
            path,
            headers,
            body,
        });
    let is_get = method == axum::http::Method::GET;
    let queue = if is_get {
        &script.get_replies
    } else {
        &script.replies
    };
    let queued = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    let computed = || {
        if is_get {
            return None;
        }
        let last = script.seen.lock().ok()?.last().map(|s| s.body.clone())?;
        script.responder.lock().ok()?.as_ref()?(&last)
    };
    let reply = queued.or_else(computed).unwrap_or_else(|| {
        if is_get {
            Reply {
                status: 200,
                chunks: vec![r#"{"data": [], "models": []}"#.into()],
                ..Default::default()
            }
        } else {
            Reply {
                status: 500,
                chunks: vec!["{\"error\":{\"message\":\"no scripted reply left\"}}".into()],
                ..Default::default()
            }
        }
    });
    let guard = DropGuard(script.clone());
    let chunks = reply.chunks.clone();
    let stall = reply.stall;
    let delay = reply.chunk_delay.unwrap_or(Duration::from_millis(2));
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), guard, stall),
        move |(mut it, guard, stall)| async move {
            match it.next() {
                Some(c) => {
                    tokio::time::sleep(delay).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(c)),
                        (it, guard, stall),
                    ))
                }
                None => {
                    if let Some(d) = stall {
                        tokio::time::sleep(d).await;
                    }
                    None
                }
            }
        },
    );
    let mut builder =
        Response::builder().status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK));
    builder = builder.header(
        "content-type",
        if reply.content_type.is_empty() {
            "application/json"
        } else {
            reply.content_type
        },
    );
    for (k, v) in &reply.headers {
        builder = builder.header(*k, v);
    }
    builder.body(Body::from_stream(stream)).unwrap_or_default()
}

pub async fn mock() -> (String, Arc<Script>) {
    let script = Arc::new(Script::default());
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(script.clone());
    (serve(app).await, script)
}

/// The tools offered in the first request that offered any, as JSON text (empty: none).
pub fn offered_tools(script: &Script) -> String {
    script
        .seen
        .lock()
        .ok()
        .and_then(|s| {
            s.iter()
                .find(|x| x.body.get("tools").is_some())
                .map(|x| x.body["tools"].to_string())
        })
        .unwrap_or_default()
}

/// The bodies of the chat completion requests the mock has received.
pub fn chat_requests(script: &Script) -> Vec<Value> {
    script
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| s.path.ends_with("/chat/completions"))
        .map(|s| s.body.clone())
        .collect()
}

/// How many chat completion requests the mock has received.
pub fn chat_calls(script: &Script) -> usize {
    chat_requests(script).len()
}

/// Waits until the mock has received a chat completion request (a run's provider call is
/// under way).
pub async fn provider_called(script: &Script) {
    eventually("a provider call", || async {
        let calls = chat_calls(script);
        if calls >= 1 {
            Ok(())
        } else {
            Err("no chat completion request yet".to_owned())
        }
    })
    .await;
}

pub fn push(script: &Script, reply: Reply) {
    script
        .replies
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(reply);
}

/// An OpenAI-dialect answer streaming the text `pieces`.
pub fn answer(pieces: &[&str]) -> Reply {
    let d = openai();
    streamed(&d, (d.text_stream)(pieces))
}

/// Scripts the next reply: an OpenAI-dialect answer streaming the text `pieces`.
pub fn push_answer(script: &Script, pieces: &[&str]) {
    push(script, answer(pieces));
}

/// Scripts the reply to the next GET (a model list).
pub fn push_get(script: &Script, reply: Reply) {
    script
        .get_replies
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(reply);
}

pub fn streamed(d: &Dialect, chunks: Vec<String>) -> Reply {
    Reply {
        status: 200,
        content_type: d.stream_type,
        chunks,
        ..Default::default()
    }
}

pub fn json_reply(status: u16, v: &Value) -> Reply {
    Reply {
        status,
        content_type: "application/json",
        chunks: vec![v.to_string()],
        ..Default::default()
    }
}

/// `(id, name, arguments JSON)` of scripted tool calls.
pub type Call<'a> = (&'a str, &'a str, &'a str);

/// A vendor's wire format, for the contract suite.
pub struct Dialect {
    pub name: &'static str,
    pub provider_type: &'static str,
    pub base_suffix: &'static str,
    pub chat_path: &'static str,
    pub stream_type: &'static str,
    pub text_stream: fn(&[&str]) -> Vec<String>,
    pub tools_stream: fn(&[Call]) -> Vec<String>,
    pub error_mid_stream: fn() -> Vec<String>,
    pub malformed_stream: fn() -> Vec<String>,
    pub text_json: fn(&str) -> Value,
    pub tools_json: fn(&[Call]) -> Value,
    pub key_header: fn(&HeaderMap) -> Option<String>,
    pub models_json: Value,
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The first events of an Anthropic stream: `message_start` with `message`, then a text
/// block (index 0) opened with `text`.
fn anthropic_opening(message: Value, text: &str) -> Vec<String> {
    vec![
        sse(
            Some("message_start"),
            &json!({"type": "message_start", "message": message}),
        ),
        sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ),
    ]
}

/// Splits `s` into pieces of `n` characters (tool arguments across many small deltas).
pub fn pieces(s: &str, n: usize) -> Vec<String> {
    s.chars()
        .collect::<Vec<_>>()
        .chunks(n)
        .map(|c| c.iter().collect())
        .collect()
}

pub fn anthropic() -> Dialect {
    Dialect {
        name: "anthropic",
        provider_type: "anthropic",
        base_suffix: "",
        chat_path: "/v1/messages",
        stream_type: "text/event-stream",
        text_stream: |parts| {
            let mut out = vec![
                sse(
                    Some("message_start"),
                    &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
                ),
                sse(
                    Some("content_block_start"),
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                sse(Some("ping"), &json!({"type": "ping"})),
            ];
            for p in parts {
                out.push(sse(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})));
            }
            out.push(sse(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            ));
            out.push(sse(Some("message_delta"), &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 15}})));
            out.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
            out
        },
        tools_stream: |calls| {
            let mut out = anthropic_opening(
                json!({"id": "msg_2", "model": "claude-test", "content": [], "usage": {"input_tokens": 40, "output_tokens": 1}}),
                "Checking.",
            );
            out.push(sse(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            ));
            for (i, (id, name, args)) in calls.iter().enumerate() {
                let idx = i + 1;
                out.push(sse(Some("content_block_start"), &json!({"type": "content_block_start", "index": idx, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
                for p in pieces(args, 3) {
                    out.push(sse(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": idx, "delta": {"type": "input_json_delta", "partial_json": p}})));
                }
                out.push(sse(
                    Some("content_block_stop"),
                    &json!({"type": "content_block_stop", "index": idx}),
                ));
            }
            out.push(sse(Some("message_delta"), &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 60}})));
            out.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
            out
        },
        error_mid_stream: || {
            let mut out = anthropic_opening(
                json!({"model": "claude-test", "usage": {"input_tokens": 1, "output_tokens": 1}}),
                "partial",
            );
            out.push(sse(
                Some("error"),
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ));
            out
        },
        malformed_stream: || {
            vec![
                sse(Some("message_start"), &json!({"type": "message_start", "message": {"model": "claude-test", "usage": {"input_tokens": 1}}})),
                "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\n\n".into(),
            ]
        },
        text_json: |text| json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": {"input_tokens": 25, "output_tokens": 15}}),
        tools_json: |calls| {
            let mut content = vec![json!({"type": "text", "text": "Checking."})];
            for (id, name, args) in calls {
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": serde_json::from_str::<Value>(args).unwrap_or_default()}));
            }
            json!({"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-test", "content": content, "stop_reason": "tool_use", "usage": {"input_tokens": 40, "output_tokens": 60}})
        },
        key_header: |h| {
            h.get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        },
        models_json: json!({"data": [{"id": "claude-test", "type": "model"}], "has_more": false}),
    }
}

pub fn openai_chunk(delta: Value, finish: Value) -> String {
    sse(
        None,
        &json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-test", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
    )
}

pub fn openai() -> Dialect {
    Dialect {
        name: "openai",
        provider_type: "openai",
        base_suffix: "/v1",
        chat_path: "/v1/chat/completions",
        stream_type: "text/event-stream",
        text_stream: |parts| {
            let mut out = vec![openai_chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )];
            for p in parts {
                out.push(openai_chunk(json!({"content": p}), Value::Null));
            }
            out.push(openai_chunk(json!({}), json!("stop")));
            out.push(sse(None, &json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-test", "choices": [], "usage": {"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40}})));
            out.push("data: [DONE]\n\n".into());
            out
        },
        tools_stream: |calls| {
            let mut out = vec![openai_chunk(
                json!({"role": "assistant", "content": "Checking."}),
                Value::Null,
            )];
            for (i, (id, name, _)) in calls.iter().enumerate() {
                out.push(openai_chunk(json!({"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), Value::Null));
            }
            // Interleave the argument pieces of parallel calls.
            let split: Vec<Vec<String>> = calls.iter().map(|(_, _, a)| pieces(a, 3)).collect();
            let longest = split.iter().map(Vec::len).max().unwrap_or(0);
            for step in 0..longest {
                for (i, parts) in split.iter().enumerate() {
                    if let Some(p) = parts.get(step) {
                        out.push(openai_chunk(
                            json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                            Value::Null,
                        ));
                    }
                }
            }
            out.push(openai_chunk(json!({}), json!("tool_calls")));
            out.push(sse(None, &json!({"id": "chatcmpl-1", "model": "gpt-test", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 60}})));
            out.push("data: [DONE]\n\n".into());
            out
        },
        error_mid_stream: || {
            vec![
                openai_chunk(
                    json!({"role": "assistant", "content": "partial"}),
                    Value::Null,
                ),
                sse(
                    None,
                    &json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error", "code": 500}}),
                ),
            ]
        },
        malformed_stream: || {
            vec![
                openai_chunk(json!({"content": "ok"}), Value::Null),
                "data: {\"choices\": [{\"delta\": \n\n".into(),
            ]
        },
        text_json: |text| json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 25, "completion_tokens": 15}}),
        tools_json: |calls| {
            let tool_calls: Vec<Value> = calls.iter().map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})).collect();
            json!({"id": "chatcmpl-2", "object": "chat.completion", "model": "gpt-test", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Checking.", "tool_calls": tool_calls}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 40, "completion_tokens": 60}})
        },
        key_header: |h| {
            h.get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        },
        models_json: json!({"object": "list", "data": [{"id": "gpt-test", "object": "model"}]}),
    }
}

fn ndjson(v: &Value) -> String {
    format!("{v}\n")
}

pub fn ollama() -> Dialect {
    Dialect {
        name: "ollama",
        provider_type: "ollama",
        base_suffix: "",
        chat_path: "/api/chat",
        stream_type: "application/x-ndjson",
        text_stream: |parts| {
            let mut out: Vec<String> = parts
                .iter()
                .map(|p| ndjson(&json!({"model": "qwen-test", "created_at": "2026-11-22T08:00:00Z", "message": {"role": "assistant", "content": p}, "done": false})))
                .collect();
            out.push(ndjson(&json!({"model": "qwen-test", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop", "prompt_eval_count": 25, "eval_count": 15})));
            out
        },
        tools_stream: |calls| {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "function": {"name": name, "arguments": serde_json::from_str::<Value>(args).unwrap_or_default()}}))
                .collect();
            let line = ndjson(
                &json!({"model": "qwen-test", "message": {"role": "assistant", "content": "", "tool_calls": tool_calls}, "done": false}),
            );
            let mut out = vec![ndjson(
                &json!({"model": "qwen-test", "message": {"role": "assistant", "content": "Checking."}, "done": false}),
            )];
            // The line itself arrives in small pieces.
            out.extend(pieces(&line, 7));
            out.push(ndjson(&json!({"model": "qwen-test", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop", "prompt_eval_count": 40, "eval_count": 60})));
            out
        },
        error_mid_stream: || {
            vec![
                ndjson(
                    &json!({"model": "qwen-test", "message": {"role": "assistant", "content": "partial"}, "done": false}),
                ),
                ndjson(&json!({"error": "model runner has unexpectedly stopped"})),
            ]
        },
        malformed_stream: || {
            vec![
                ndjson(&json!({"model": "qwen-test", "message": {"content": "ok"}, "done": false})),
                "{\"message\": {\"content\": \n".into(),
            ]
        },
        text_json: |text| json!({"model": "qwen-test", "message": {"role": "assistant", "content": text}, "done": true, "done_reason": "stop", "prompt_eval_count": 25, "eval_count": 15}),
        tools_json: |calls| {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "function": {"name": name, "arguments": serde_json::from_str::<Value>(args).unwrap_or_default()}}))
                .collect();
            json!({"model": "qwen-test", "message": {"role": "assistant", "content": "Checking.", "tool_calls": tool_calls}, "done": true, "done_reason": "stop", "prompt_eval_count": 40, "eval_count": 60})
        },
        key_header: |h| {
            h.get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        },
        models_json: json!({"models": [{"name": "qwen-test", "model": "qwen-test"}]}),
    }
}

pub fn dialects() -> Vec<Dialect> {
    vec![anthropic(), openai(), ollama()]
}

pub fn tool_calls(calls: &[(&str, &str, Value)]) -> Reply {
    let d = openai();
    let args: Vec<String> = calls.iter().map(|(_, _, a)| a.to_string()).collect();
    let refs: Vec<(&str, &str, &str)> = calls
        .iter()
        .zip(&args)
        .map(|((id, name, _), a)| (*id, *name, a.as_str()))
        .collect();
    streamed(&d, (d.tools_stream)(&refs))
}

/// The content of the tool result for `call_id` in a chat request body.
pub fn tool_result(body: &Value, call_id: &str) -> Option<String> {
    body["messages"]
        .as_array()?
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .and_then(|m| m["content"].as_str().map(str::to_owned))
}

/// One streamed Messages API answer (as Claude Code asks for it): a tool call, or text.
pub fn messages_answer(model: &Value, block: Value, delta: Value, stop: &str) -> String {
    [
        sse(
            Some("message_start"),
            &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 120, "output_tokens": 1}}}),
        ),
        sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": 0, "content_block": block}),
        ),
        sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        sse(
            Some("message_delta"),
            &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 30}}),
        ),
        sse(Some("message_stop"), &json!({"type": "message_stop"})),
    ]
    .concat()
}
