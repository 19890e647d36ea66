//! The limits on what one client may send or hold open (docs/reliability.md#limits), on
//! the real binary: each refuses with its own error and counts in
//! `kortex_limit_rejections_total`, and the server goes on serving everyone else.

use crate::support::chat::{
    ask, create_session, post_message, session, session_json, state, stream_message,
};
use crate::support::manifests::{docs, manifest_dir, policy, provider, tool};
use crate::support::net::{eventually, http_client};
use crate::support::plugins::upstream;
use crate::support::provider::{
    Script, json_reply, mock, openai, provider_called, push, streamed, tool_calls, tool_result,
};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// A provider at `base` and one policy for every session, with `budget` (YAML flow map).
fn manifests(dir: &Path, base: &str, budget: &str) {
    std::fs::write(
        dir.join("all.yaml"),
        docs(&[
            provider(
                "model",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, \
                     locality: local"
                ),
            ),
            policy(
                "all",
                &format!("sessions: ['*'], provider: model, budget: {budget}"),
            ),
        ]),
    )
    .unwrap();
}

/// `kortex serve` with `args` on a fresh SQLite database and the provider at `base`.
fn start(base: &str, budget: &str, args: &[&str]) -> (Server, tempfile::TempDir) {
    let (dir, m) = manifest_dir();
    manifests(&m, base, budget);
    let server = Server::start_with_args(&m, &dir.path().join("k.db"), args);
    (server, dir)
}

/// The value of `kortex_limit_rejections_total{limit="<limit>"}` (0 when absent).
async fn refused(server: &Server, limit: &str) -> u64 {
    let (_, body) = server.get("/metrics").await;
    let prefix = format!("kortex_limit_rejections_total{{limit=\"{limit}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `kortex_event_streams_open`.
async fn streams_open(server: &Server) -> f64 {
    let (_, body) = server.get("/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix("kortex_event_streams_open "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `(status, error code, Retry-After)` of a response.
async fn refusal(r: reqwest::Response) -> (u16, String, Option<String>) {
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = r.json().await.unwrap_or_default();
    (
        status,
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        retry,
    )
}

/// The `host:port` the server listens on.
fn addr(server: &Server) -> String {
    server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_and_heads_past_their_limits_are_refused() {
    let (base, _script) = mock().await;
    let (server, _dir) = start(
        &base,
        "{}",
        &[
            "--max-request-bytes",
            "65536",
            "--max-header-bytes",
            "16384",
        ],
    );
    let client = http_client();
    // Declared too large: refused from the Content-Length alone.
    let big = json!({"name": "x".repeat(100_000)}).to_string();
    let r = client
        .post(server.url("/chat/v1/sessions"))
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(
        refusal(r).await,
        (413, "request_too_large".to_owned(), None)
    );
    // Chunked, no length given: refused once the handler has read past the limit (the
    // gateway's and the chat API's readers alike).
    for path in ["/v1/chat/completions", "/chat/v1/sessions"] {
        let chunks: Vec<Result<String, std::io::Error>> = big
            .as_bytes()
            .chunks(4096)
            .map(|c| Ok(String::from_utf8_lossy(c).into_owned()))
            .collect();
        // A client of its own: the server closes a connection whose body it did not read,
        // and a pooled one could be reused before the client noticed.
        let r = http_client()
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .send()
            .await;
        // The server answers before the upload ends and closes the connection; a client
        // still sending may see the reset instead of the answer (the count below is sure).
        if let Ok(r) = r {
            assert_eq!(
                refusal(r).await,
                (413, "request_too_large".to_owned(), None),
                "{path}"
            );
        }
    }
    assert_eq!(refused(&server, "request_bytes").await, 3);
    // Under the limit the same route works.
    let id = session(&server, "small").await;
    assert!(!id.is_empty());

    // A request head of 20 KiB: 431 from the HTTP layer, before any route.
    let mut tcp = std::net::TcpStream::connect(addr(&server)).unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    tcp.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    // The server closes with part of the head unread, so the answer may be lost to a reset.
    if tcp.read_to_string(&mut answer).is_ok() || !answer.is_empty() {
        assert!(
            answer.starts_with("HTTP/1.1 431"),
            "{}",
            answer.lines().next().unwrap_or_default()
        );
    }
    assert_eq!(refused(&server, "header_bytes").await, 1);
    assert_eq!(server.get("/healthz").await.0, 200);
    assert!(server.terminate().success());
}

/// Slow-loris: clients that send their request head a byte at a time, or not at all, are
/// disconnected after `--header-timeout`, while everyone else is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_disconnected_after_the_header_timeout() {
    let (base, _script) = mock().await;
    let (server, _dir) = start(&base, "{}", &["--header-timeout", "1s"]);
    let address = addr(&server);
    let slow: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            let mut tcp = std::net::TcpStream::connect(&address).unwrap();
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
                .unwrap();
            tcp
        })
        .collect();
    // Served while they hang on.
    assert_eq!(server.get("/healthz").await.0, 200);
    // Each keeps trickling a byte every 200 ms, which buys no more time.
    let trickler = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut closed = 0;
        for mut tcp in slow {
            let _ = tcp.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 256];
            while std::time::Instant::now() < deadline {
                let _ = tcp.write_all(b"b");
                match tcp.read(&mut buf) {
                    // Closed (or answered and closed) by the server.
                    Ok(_) => {
                        closed += 1;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                        closed += 1;
                        break;
                    }
                    Err(_) => {}
                }
            }
        }
        closed
    });
    let closed = tokio::task::spawn_blocking(move || trickler.join().unwrap_or(0))
        .await
        .unwrap_or(0);
    assert_eq!(closed, 20, "every slow client was disconnected");
    eventually("the header timeouts counted", || async {
        match refused(&server, "header_timeout").await {
            20 => Ok(()),
            n => Err(format!("{n} counted")),
        }
    })
    .await;
    assert_eq!(server.get("/healthz").await.0, 200);
    assert!(server.terminate().success());
}

/// Event streams per user: past the limit 429 `too_many_streams` with `Retry-After`; a
/// stream that ends (its client went away) frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_and_sessions_per_user_are_limited() {
    let (base, _script) = mock().await;
    let (server, _dir) = start(
        &base,
        "{}",
        &[
            "--max-streams-per-user",
            "2",
            "--max-sessions-per-user",
            "3",
        ],
    );
    let client = http_client();
    let id = session(&server, "s-1").await;
    let events = server.url(&format!("/chat/v1/sessions/{id}/events"));
    let open = || client.get(&events).send();
    let first = open().await.unwrap();
    let second = open().await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = open().await.unwrap();
    assert_eq!(
        refusal(third).await,
        (429, "too_many_streams".to_owned(), Some("5".to_owned()))
    );
    // A streamed message is a stream too: refused before any run starts.
    let r = client
        .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
        .header("accept", "text/event-stream")
        .json(&json!({"content": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refusal(r).await.1, "too_many_streams");
    let stored = session_json(&server, &id).await;
    assert_eq!(
        stored["messages"],
        json!([]),
        "no run was started: {stored}"
    );
    assert_eq!(refused(&server, "streams_per_user").await, 2);
    drop(first);
    let again = eventually("a freed stream slot", || async {
        let r = open().await.map_err(|e| e.to_string())?;
        match r.status().as_u16() {
            200 => Ok(r),
            code => Err(format!("{code}")),
        }
    })
    .await;
    drop((second, again));

    // Sessions: the limit counts the ones not deleted.
    session(&server, "s-2").await;
    let third = session(&server, "s-3").await;
    let r = create_session(&server, &json!({"name": "s-4"})).await;
    assert_eq!(
        refusal(r).await,
        (429, "too_many_sessions".to_owned(), None)
    );
    assert_eq!(refused(&server, "sessions_per_user").await, 1);
    let r = client
        .delete(server.url(&format!("/chat/v1/sessions/{third}")))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    session(&server, "s-4").await;
    assert!(server.terminate().success());
}

/// `budget.maxConcurrentRuns`: a policy's runs in flight; one more gets 429
/// `too_many_runs` and is not stored, and once a run ends the next one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_runs_at_most_its_concurrent_runs() {
    let (base, script) = mock().await;
    let (server, _dir) = start(&base, "{maxConcurrentRuns: 1}", &[]);
    let client = http_client();
    let d = openai();
    // The first run's provider says a word and then nothing for a minute.
    let mut stalled = streamed(&d, (d.text_stream)(&["Thinking"]));
    stalled.chunks.pop();
    stalled.stall = Some(Duration::from_secs(60));
    push(&script, stalled);
    let busy = session(&server, "busy").await;
    let r = post_message(&server, &busy, "a long question").await;
    assert_eq!(r.status().as_u16(), 202);

    let other = session(&server, "other").await;
    let post = || {
        client
            .post(server.url(&format!("/chat/v1/sessions/{other}/messages")))
            .json(&json!({"content": "meanwhile"}))
            .send()
    };
    let (status, code, retry) = refusal(post().await.unwrap()).await;
    assert_eq!(
        (status, code.as_str(), retry.as_deref()),
        (429, "too_many_runs", Some("5"))
    );
    let stored = session_json(&server, &other).await;
    assert_eq!(stored["messages"], json!([]), "{stored}");
    assert_eq!(stored["status"], "idle", "{stored}");
    assert_eq!(refused(&server, "concurrent_runs").await, 1);

    // The first run ends (cancelled, once its provider call is under way: cancelled
    // earlier, its scripted reply would be left for the next run); the other session's run
    // may then start.
    provider_called(&script).await;
    let r = client
        .post(server.url(&format!("/chat/v1/sessions/{busy}/cancel")))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    eventually("the cancelled run ended", || async {
        let s = session_json(&server, &busy).await;
        match s["status"].as_str() {
            Some("running") => Err(s.to_string()),
            _ => Ok(()),
        }
    })
    .await;
    push(&script, streamed(&d, (d.text_stream)(&["Now it runs."])));
    let events = ask(&server, &other, "meanwhile").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    assert!(server.terminate().success());
}

/// One run whose answer is 32 MiB, in 8 KiB deltas, read to its end by a streaming client;
/// the server's resident memory when 30 MiB of it had been read (before the run's end
/// stores it).
async fn firehose(server: &Server, script: &Script, id: &str) -> u64 {
    use futures_util::StreamExt;
    let d = openai();
    let piece = "x".repeat(8 * 1024);
    let pieces: Vec<&str> = std::iter::repeat_n(piece.as_str(), 4096).collect();
    let mut reply = streamed(&d, (d.text_stream)(&pieces));
    reply.chunk_delay = Some(Duration::ZERO);
    push(script, reply);
    let r = stream_message(server, id, "tell me everything").await;
    let mut body = r.bytes_stream();
    let mut received = 0usize;
    let mut rss = None;
    let mut tail = String::new();
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(Duration::from_secs(120), body.next()).await
    {
        received += chunk.len();
        if received > 30 << 20 && rss.is_none() {
            rss = Some(server.rss_bytes());
        }
        tail.push_str(&String::from_utf8_lossy(&chunk));
        if tail.len() > 4096 {
            tail.drain(..tail.len() - 4096);
        }
        if tail.contains("\"completed\"") {
            break;
        }
    }
    assert!(
        tail.contains("\"completed\""),
        "the reader got the whole run: {tail}"
    );
    assert!(received > 32 << 20, "{received} bytes read");
    rss.unwrap_or_default()
}

/// Clients that open the event stream and never read it hold no more than a bounded
/// window each (a page of replay and the socket buffers), not what they did not read. The
/// same 32 MiB answer goes by three times (in three sessions), read in full by another
/// client; the third time, four clients that never read follow that session from its
/// start. The server's memory is compared at the same point of the second and third runs
/// (30 MiB read, before the run's end stores its answer; the first run brings the allocator
/// to its working size). Were undelivered events kept per client, the third run would hold
/// four times 30 MiB more; it must hold less than half of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_stream_costs_bounded_memory() {
    const STUCK: u64 = 4;
    let (base, script) = mock().await;
    let (server, _dir) = start(&base, "{}", &[]);
    // Separate sessions: a second run in one would send its 32 MiB history upstream.
    let id = session(&server, "firehose-1").await;
    firehose(&server, &script, &id).await;
    let id = session(&server, "firehose-2").await;
    let baseline = firehose(&server, &script, &id).await;
    let id = session(&server, "firehose-3").await;
    let stuck: Vec<std::net::TcpStream> = (0..STUCK)
        .map(|_| {
            let mut s =
                std::net::TcpStream::connect(addr(&server)).unwrap();
            write!(
                s,
                "GET /chat/v1/sessions/{id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    eventually("the stuck clients' streams are open", || async {
        let open = streams_open(&server).await;
        if open >= STUCK as f64 {
            Ok(())
        } else {
            Err(format!("{open} streams open"))
        }
    })
    .await;
    let with_stuck = firehose(&server, &script, &id).await;
    let grown = with_stuck.saturating_sub(baseline);
    eprintln!(
        "RSS at 30 MiB into the run: {} MiB; with {STUCK} clients not reading: {} MiB",
        baseline >> 20,
        with_stuck >> 20
    );
    assert!(
        grown < STUCK * (30 << 20) / 2,
        "the server held {} MiB more while {STUCK} clients did not read 30 MiB each",
        grown >> 20
    );
    // The stuck clients are still being served, not dropped: they are behind, not gone.
    assert!(streams_open(&server).await >= STUCK as f64);
    drop(stuck);
    assert_eq!(server.get("/healthz").await.0, 200);
    assert!(server.terminate().success());
}

/// `--max-tool-result-bytes`: a tool result over the cap reaches the model as an index to
/// read in chunks (the whole result is stored), and counts in the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_results_over_the_cap_reach_the_model_as_an_index() {
    let (base, script) = mock().await;
    let (bridge, _) = upstream().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base, "{}");
    std::fs::write(
        m.join("tool.yaml"),
        docs(&[tool(
            "big",
            &format!(
                "name: big_report, description: A long report., \
                 http: {{method: GET, url: '{bridge}/big'}}, maxResultBytes: 100000"
            ),
        )]),
    )
    .unwrap();
    let server = Server::start_with_args(
        &m,
        &dir.path().join("k.db"),
        &["--max-tool-result-bytes", "4096"],
    );
    push(&script, tool_calls(&[("c1", "big_report", json!({}))]));
    // Then the model reads the first chunk of the kept result, and answers.
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|body| {
        if let Some(chunk) = tool_result(body, "c2") {
            let chunk: Value = serde_json::from_str(&chunk).unwrap_or_default();
            let read = chunk["content"].as_str().map_or(0, str::len);
            let d = openai();
            return Some(streamed(
                &d,
                (d.text_stream)(&[&format!("Read {read} bytes.")]),
            ));
        }
        let index: Value = serde_json::from_str(&tool_result(body, "c1")?).ok()?;
        Some(tool_calls(&[(
            "c2",
            "read_result_chunk",
            json!({"resultId": index["resultId"], "chunk": 0}),
        )]))
    }));
    let id = session(&server, "big").await;
    assert_eq!(
        state(&ask(&server, &id, "report?").await),
        json!("completed")
    );
    let stored = session_json(&server, &id).await;
    let result = stored["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["toolCallId"] == "c1"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        result.len() < 4096,
        "{} bytes reached the model",
        result.len()
    );
    let index: Value = serde_json::from_str(&result).unwrap_or_default();
    assert_eq!(index["truncated"], true, "{result}");
    assert!(
        index["totalBytes"].as_u64().unwrap_or_default() >= 100_000,
        "{result}"
    );
    assert!(index["resultId"].is_string(), "{result}");
    // The chunk (32 KiB) is not capped again into another index.
    let answer = stored["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(answer, "Read 32768 bytes.", "{stored}");
    assert_eq!(refused(&server, "tool_result_bytes").await, 1);
    assert!(server.terminate().success());
}

/// Retention on the binary: the events of a failed run outlive `--retention-failed-runs`
/// only until the next pass (one runs at start-up), which says what it deleted in the audit
/// log and the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_a_failed_runs_events_at_the_next_pass() {
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base, "{}");
    let db = dir.path().join("k.db");
    let server = Server::start_with_args(&m, &db, &[]);
    push(
        &script,
        json_reply(
            400,
            &json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
        ),
    );
    let id = session(&server, "doomed").await;
    assert_eq!(state(&ask(&server, &id, "hello").await), json!("failed"));
    let (_, events) = server
        .get(&format!("/chat/v1/sessions/{id}/events?format=jsonl"))
        .await;
    assert!(events.lines().count() >= 2, "{events}");
    assert!(server.terminate().success());

    std::thread::sleep(Duration::from_millis(1500));
    let server = Server::start_with_args(&m, &db, &["--retention-failed-runs", "1s"]);
    eventually("the start-up pass ran", || async {
        let (_, metrics) = server.get("/metrics").await;
        match metrics.lines().find(|l| {
            l.starts_with("kortex_retention_deleted_total{kind=\"events\",reason=\"retention\"}")
        }) {
            Some(_) => Ok(()),
            None => Err("no retention yet".to_owned()),
        }
    })
    .await;
    let (_, events) = server
        .get(&format!("/chat/v1/sessions/{id}/events?format=jsonl"))
        .await;
    assert_eq!(events.trim(), "", "the failed run's events are gone");
    // The session and its messages stay (only the sessions window removes those).
    let (status, _) = server.get(&format!("/chat/v1/sessions/{id}")).await;
    assert_eq!(status, 200);
    let (_, audit) = server.get("/api/v1/audit?kind=deletion").await;
    let audit: Value = serde_json::from_str(&audit).unwrap_or_default();
    assert_eq!(audit["items"][0]["outcome"], "retention", "{audit}");
    assert!(
        audit["items"][0]["detail"]["deleted"]["events"]
            .as_u64()
            .unwrap_or(0)
            >= 2,
        "{audit}"
    );
    assert!(server.terminate().success());
}

/// `DELETE /chat/v1/sessions/{id}` hides the session at once and then removes it for good:
/// its messages and events are gone from the database, and the audit log says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_session_is_removed_for_good() {
    let (base, script) = mock().await;
    let (server, dir) = start(&base, "{}", &[]);
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["Noted."])));
    let id = session(&server, "to-delete").await;
    assert_eq!(
        state(&ask(&server, &id, "remember me").await),
        json!("completed")
    );
    let r = http_client()
        .delete(server.url(&format!("/chat/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(server.get(&format!("/chat/v1/sessions/{id}")).await.0, 404);
    let audit = eventually("the deletion is recorded", || async {
        let (_, audit) = server.get("/api/v1/audit?kind=deletion").await;
        let audit: Value = serde_json::from_str(&audit).unwrap_or_default();
        match audit["items"][0]["outcome"].as_str() {
            Some("session_deleted") => Ok(audit),
            _ => Err(audit.to_string()),
        }
    })
    .await;
    let deleted = &audit["items"][0]["detail"]["deleted"];
    assert_eq!(deleted["sessions"], 1, "{audit}");
    assert!(deleted["messages"].as_u64().unwrap_or(0) >= 2, "{audit}");
    assert!(deleted["events"].as_u64().unwrap_or(0) >= 2, "{audit}");
    assert!(server.terminate().success());
    let store =
        kortex::store::Store::connect(&format!("sqlite://{}", dir.path().join("k.db").display()))
            .await
            .unwrap();
    assert!(
        store
            .list_messages(&id)
            .await
            .unwrap_or_default()
            .is_empty()
    );
    assert!(
        store
            .events_after(&id, 0, 100)
            .await
            .unwrap_or_default()
            .is_empty()
    );
}
