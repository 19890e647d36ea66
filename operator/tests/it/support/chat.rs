//! Talking to a running server's chat API: sessions, messages, the SSE stream of a run,
//! and what it says.

use crate::support::net::{eventually, http_client};
use crate::support::provider::{Script, push, push_answer, tool_calls};
use crate::support::server::Server;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

/// One parsed SSE event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub id: i64,
    pub event: String,
    pub data: Value,
}

/// GETs `url`; its JSON answer (`Null` when it is not JSON).
pub async fn get_json(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> Value {
    json_of(client.get(url)).await
}

/// POSTs `body` to `url`; its JSON answer (`Null` when it is not JSON).
pub async fn post_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: &Value,
) -> Value {
    json_of(client.post(url).json(body)).await
}

async fn json_of(request: reqwest::RequestBuilder) -> Value {
    request
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or_default()
}

/// GETs `url`; its body as text (empty when unreadable).
pub async fn get_text(url: impl reqwest::IntoUrl) -> String {
    http_client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap_or_default()
}

/// Reads SSE events from `resp` until `stop` says so (or 20 s pass).
pub async fn read_sse(resp: reqwest::Response, stop: impl Fn(&[Sse]) -> bool) -> Vec<Sse> {
    read_sse_within(resp, stop, Duration::from_secs(20)).await
}

/// [`read_sse`] for at most `within`.
pub async fn read_sse_within(
    resp: reqwest::Response,
    stop: impl Fn(&[Sse]) -> bool,
    within: Duration,
) -> Vec<Sse> {
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while !stop(&out) {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await;
        let Ok(Some(Ok(bytes))) = chunk else { break };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(pos) = buf.find("\n\n") {
            let block: String = buf.drain(..pos + 2).collect();
            let mut e = Sse {
                id: 0,
                event: String::new(),
                data: Value::Null,
            };
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    e.id = v.trim().parse().unwrap_or(0);
                } else if let Some(v) = line.strip_prefix("event:") {
                    e.event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    e.data = serde_json::from_str(v.trim()).unwrap_or(Value::Null);
                }
            }
            if !e.event.is_empty() {
                out.push(e);
            }
        }
    }
    out
}

pub fn run_ended(events: &[Sse]) -> bool {
    events.iter().any(|e| {
        e.event == "run.lifecycle"
            && matches!(
                e.data["state"].as_str(),
                Some("completed" | "failed" | "cancelled")
            )
    })
}

/// Session `id` as the chat API shows it (its status, messages...).
pub async fn session_json(server: &Server, id: &str) -> Value {
    get_json(
        &http_client(),
        server.url(&format!("/chat/v1/sessions/{id}")),
    )
    .await
}

/// Opens the session `name`; its id.
pub async fn session(server: &Server, name: &str) -> String {
    open_session(server, json!({"name": name})).await
}

/// Asks for a new session described by `body`; the answer, whatever it is.
pub async fn create_session(server: &Server, body: &Value) -> reqwest::Response {
    http_client()
        .post(server.url("/chat/v1/sessions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Opens a session described by `body` (its `name`, `namespace`...); its id.
pub async fn open_session(server: &Server, body: Value) -> String {
    let r = create_session(server, &body).await;
    assert_eq!(r.status().as_u16(), 201, "{body}");
    let v: Value = r.json().await.unwrap_or_default();
    v["id"].as_str().unwrap_or_default().to_owned()
}

/// Posts `content` to session `id` without waiting for the run: the response (202 and the
/// run's id, or why not).
pub async fn post_message(server: &Server, id: &str, content: &str) -> reqwest::Response {
    http_client()
        .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
        .json(&json!({"content": content}))
        .send()
        .await
        .unwrap()
}

/// Posts `content` to session `id` asking for the run's events: the response streams them.
pub async fn stream_message(server: &Server, id: &str, content: &str) -> reqwest::Response {
    http_client()
        .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
        .header("accept", "text/event-stream")
        .json(&json!({"content": content}))
        .send()
        .await
        .unwrap()
}

pub async fn ask(server: &Server, id: &str, content: &str) -> Vec<Sse> {
    let r = stream_message(server, id, content).await;
    assert_eq!(r.status().as_u16(), 202);
    read_sse(r, run_ended).await
}

/// Asserts that `r` is refused with `status` and an error message that contains `words`;
/// returns the body.
pub async fn assert_refused(r: reqwest::Response, status: u16, words: &str) -> Value {
    assert_eq!(r.status().as_u16(), status, "refused: {words}");
    let body: Value = r.json().await.unwrap_or_default();
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(words)),
        "{body}"
    );
    body
}

pub fn text(events: &[Sse]) -> String {
    events
        .iter()
        .filter(|e| e.event == "text.delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect()
}

pub fn notices(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == "notice")
        .filter_map(|e| e.data["message"].as_str().map(str::to_owned))
        .collect()
}

/// Asserts that one of the run's notices satisfies `check`.
pub fn assert_notice(events: &[Sse], check: impl Fn(&str) -> bool) {
    let all = notices(events);
    assert!(all.iter().any(|n| check(n)), "{all:?}");
}

pub fn state(events: &[Sse]) -> Value {
    events
        .iter()
        .rev()
        .find(|e| e.event == "run.lifecycle")
        .map(|e| e.data["state"].clone())
        .unwrap_or_default()
}

/// Opens a session with `session` (its `name`, `namespace`...), sends `content` and waits
/// until the run is over; the session's id.
/// A chat in which the model makes the tool `calls` and then answers `answer`: the session
/// `session` is opened, asked `question`, and waited for; returns its id.
pub async fn chat_with_calls(
    server: &Server,
    script: &Script,
    calls: &[(&str, &str, Value)],
    answer: &str,
    session: Value,
    question: &str,
) -> String {
    push(script, tool_calls(calls));
    push_answer(script, &[answer]);
    chat_once(server, session, question).await
}

pub async fn chat_once(server: &Server, session: Value, content: &str) -> String {
    let id = open_session(server, session).await;
    post_message(server, &id, content).await;
    wait_idle(
        &http_client(),
        &server.url(&format!("/chat/v1/sessions/{id}")),
    )
    .await;
    id
}

pub async fn wait_idle(client: &reqwest::Client, url: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = get_json(client, url).await;
        if s["status"] != "running" && s["messages"].as_array().is_some_and(|m| m.len() > 1) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run did not end: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The usage row of `provider` once it counts `requests` calls (books are written behind;
/// gives up after 5 s and returns what it has).
pub async fn provider_usage(server: &Server, provider: &str, requests: i64) -> Value {
    let mut row = Value::Null;
    for _ in 0..100 {
        let usage = get_json(&http_client(), server.url("/api/v1/usage?by=provider")).await;
        row = usage["items"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["key"] == provider))
            .cloned()
            .unwrap_or_default();
        if row["requests"].as_i64() >= Some(requests) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    row
}

/// The entry named `name` of an API listing (its `items`); fails the test when there is none.
pub fn listed<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["items"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// The condition of `kind` (its `type`) an API listing shows on `item`; `Null` when it has
/// none.
pub fn item_condition(item: &Value, kind: &str) -> Value {
    item["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the model ids the gateway lists to `key` satisfy `check`; returns them.
pub async fn until_listed(
    server: &Server,
    key: &str,
    check: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    eventually("the gateway's model list", || async {
        let v = http_client()
            .get(server.url("/v1/models"))
            .bearer_auth(key)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json::<Value>()
            .await
            .unwrap_or_default();
        let ids: Vec<String> = v["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if check(&ids) {
            Ok(ids)
        } else {
            Err(format!("{ids:?}"))
        }
    })
    .await
}
