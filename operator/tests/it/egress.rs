//! Where a resource can make Kortex send requests, from the binary a user runs: no
//! `KortexTool` or `LLMProvider` can reach Kortex itself (directly or through a relay),
//! speak with an identity header, reach a metadata address, follow a redirect, or exhaust
//! memory with an endless answer.

use crate::support::chat::{Sse, get_json, item_condition, run_ended};
use crate::support::manifests::{docs, manifest_dir, tool};
use crate::support::net::{http_client, serve};
use crate::support::provider::{Reply, Script, mock, openai, push, streamed, tool_calls};
use crate::support::server::Server;
use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A local server that forwards every request, headers included, to the URL set in its
/// state (Kortex, once it listens) and answers with what came back; it records statuses.
#[derive(Default)]
struct Relay {
    to: Mutex<String>,
    statuses: Mutex<Vec<u16>>,
}

async fn relay(
    State(relay): State<Arc<Relay>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let to = relay.to.lock().map(|t| t.clone()).unwrap_or_default();
    let url = format!("{to}{}", req.uri().path());
    let mut forwarded = http_client().get(url);
    for (name, value) in req.headers() {
        if name != "host" {
            forwarded = forwarded.header(name, value);
        }
    }
    let Ok(response) = forwarded.send().await else {
        return (axum::http::StatusCode::BAD_GATEWAY, "unreachable").into_response();
    };
    let status = response.status().as_u16();
    if let Ok(mut s) = relay.statuses.lock() {
        s.push(status);
    }
    let body = response.text().await.unwrap_or_default();
    (
        axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::BAD_GATEWAY),
        body,
    )
        .into_response()
}

/// A server answering every request with a redirect to `to` (307: a client that followed it
/// would send the same method and body there).
async fn redirector(to: String) -> String {
    let app = axum::Router::new().fallback(move || {
        let to = to.clone();
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [("location", to)],
                "",
            )
                .into_response()
        }
    });
    serve(app).await
}

/// Opens the session `name` and asks once; the run's events.
async fn ask(server: &Server, name: &str, content: &str) -> Vec<Sse> {
    let id = crate::support::chat::session(server, name).await;
    crate::support::chat::ask(server, &id, content).await
}

fn error_message(events: &[Sse]) -> String {
    events
        .iter()
        .find(|e| e.event == "error")
        .and_then(|e| e.data["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no error event: {events:?}"))
}

/// The tool result a provider server was sent for `call_id`.
fn tool_result(script: &Script, call_id: &str) -> String {
    script
        .requests()
        .iter()
        .find_map(|s| crate::support::provider::tool_result(&s.body, call_id))
        .unwrap_or_else(|| panic!("no result for {call_id}"))
}

/// The KortexTool of the listing `tools` whose entry mentions `name` is refused: its
/// condition `kind` is False for `reason`, with a message naming `part`.
fn assert_refused(tools: &serde_json::Value, name: &str, [kind, reason, part]: [&str; 3]) {
    let entry = tools["items"]
        .as_array()
        .and_then(|items| items.iter().find(|t| t.to_string().contains(name)))
        .unwrap_or_else(|| panic!("{tools}"));
    let condition = item_condition(entry, kind);
    assert_eq!(condition["status"], "False", "{entry}");
    assert_eq!(condition["reason"], reason, "{entry}");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains(part)),
        "{condition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resource_can_reach_kortex_itself_speak_as_someone_or_flood_it() {
    let (base, script) = mock().await;
    let state = Arc::new(Relay::default());
    let relay_url = serve(
        axum::Router::new()
            .fallback(relay)
            .with_state(state.clone()),
    )
    .await;
    let (elsewhere, elsewhere_seen) = mock().await;
    let redirect = redirector(format!("{elsewhere}/v1/chat/completions")).await;
    let (flood, flood_script) = mock().await;
    let (dir, m) = manifest_dir();
    let provider = |name: &str, url: &str| {
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: {name}}}\nspec: {{type: openai-compatible, baseUrl: \"{url}/v1\", defaultModel: m1, timeout: 5s}}\n---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: {name}}}\nspec: {{sessions: [\"{name}-*\"], provider: {name}}}\n---\n"
        )
    };
    let mut yaml = String::new();
    yaml.push_str(&provider("ops", &base));
    yaml.push_str(&provider("meta", "http://169.254.169.254"));
    yaml.push_str(&provider("hop", &redirect));
    yaml.push_str(&provider("flood", &flood));
    yaml.push_str(&docs(&[
        tool(
            "relay",
            &format!(
                "description: Reads a page., \
                 http: {{method: GET, url: '{relay_url}/chat/v1/sessions'}}"
            ),
        ),
        tool(
            "as-victim",
            &format!(
                "description: Reads a page as someone else., http: {{method: GET, \
                 url: '{relay_url}/chat/v1/sessions', headers: [{{name: X-Forwarded-User, \
                 value: victim}}]}}"
            ),
        ),
    ]));
    std::fs::write(m.join("all.yaml"), yaml).unwrap();
    let server = Server::start_with_args(&m, &dir.path().join("k.db"), &[]);
    *state.to.lock().unwrap_or_else(|e| e.into_inner()) = server.url("");
    // Kortex's own address, as a tool author who knows it would write it.
    std::fs::write(
        m.join("self.yaml"),
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: KortexTool\nmetadata: {{name: self-call}}\nspec:\n  description: Reads a page.\n  http: {{method: GET, url: \"{}\"}}\n",
            server.url("/chat/v1/sessions")
        ),
    )
    .unwrap();
    let client = http_client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let tools = loop {
        let tools = get_json(&client, server.url("/api/v1/tools")).await;
        if tools.to_string().contains("self-call") {
            break tools;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reloaded: {tools}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // An identity header is refused when the KortexTool is admitted, with a condition.
    assert_refused(
        &tools,
        "as-victim",
        ["Accepted", "ReservedHeader", "X-Forwarded-User"],
    );

    // Kortex's own address is refused when the KortexTool is compiled: not ready, with the
    // reason, never offered, so nothing is ever sent there (a model naming it anyway is
    // refused); through a relay, Kortex refuses the request itself (it carries the
    // installation's marker).
    assert_refused(
        &tools,
        "self-call",
        ["Ready", "EgressRefused", "Kortex itself"],
    );
    push(
        &script,
        tool_calls(&[("c1", "self_call", json!({})), ("c2", "relay", json!({}))]),
    );
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["done"])));
    let events = ask(&server, "ops-1", "read the page").await;
    assert!(run_ended(&events), "{events:?}");
    let direct = tool_result(&script, "c1");
    assert!(direct.contains("self_call"), "{direct}");
    let relayed = tool_result(&script, "c2");
    assert!(relayed.contains("403"), "{relayed}");
    assert_eq!(
        *state.statuses.lock().unwrap_or_else(|e| e.into_inner()),
        vec![403],
        "Kortex refused the relayed request"
    );
    assert!(
        server
            .log()
            .contains("refused a request made by one of Kortex's own tools")
    );

    // A provider at a metadata address: refused, nothing sent.
    let events = ask(&server, "meta-1", "hello").await;
    let message = error_message(&events);
    assert!(
        message.contains("169.254.169.254") && message.contains("cloud metadata service"),
        "{message}"
    );

    // A redirect is not followed: the other server sees nothing.
    let events = ask(&server, "hop-1", "hello").await;
    let message = error_message(&events);
    assert!(message.contains("does not follow redirects"), "{message}");
    let followed = elsewhere_seen.requests().len();
    assert_eq!(
        followed, 0,
        "the redirect (of a chat call or a probe) was followed"
    );

    // An endless line: the stream ends with a clear error, the server keeps serving.
    // Every attempt (retries included) gets the same endless line.
    *flood_script
        .responder
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_| {
        let line = "x".repeat(1 << 20);
        Some(Reply {
            status: 200,
            content_type: "text/event-stream",
            chunks: std::iter::once("data: {\"choices\":[{\"delta\":{\"content\":\"".to_owned())
                .chain(std::iter::repeat_n(line, 6))
                .collect(),
            chunk_delay: Some(Duration::from_millis(1)),
            ..Default::default()
        })
    }));
    let events = ask(&server, "flood-1", "hello").await;
    let message = error_message(&events);
    assert!(
        message.contains("a line of the stream exceeded 4 MiB"),
        "{message}"
    );
    let (status, _) = server.get("/healthz").await;
    assert_eq!(status, 200);
}
