//! Run control on the real binary with a scripted provider: pause, resume, redirect and
//! cancel a run (from the API, persisted, surviving a restart, expiring), and the events
//! export for postmortems.

use crate::support::chat::{
    Sse, ask, get_json, get_text, post_message, read_sse, run_ended, session, session_json,
};
use crate::support::db::postgres;
use crate::support::manifests::{docs, policy, provider};
use crate::support::net::{eventually, header, http_client};
use crate::support::provider::{
    Reply, Script, answer, chat_requests, json_reply, mock, openai, provider_called, push,
    push_answer, tool_calls, tool_result,
};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::time::Duration;

fn manifests(dir: &std::path::Path, llm: &str) {
    let yaml = docs(&[
        provider(
            "scripted",
            &format!("type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m, timeout: 10s"),
        ),
        policy("ops", "sessions: ['*'], provider: scripted"),
        policy(
            "hasty",
            "sessions: [hasty-*], provider: scripted, runControl: {pausedTimeout: 1s}",
        ),
        policy(
            "planned",
            "sessions: [planned-*], provider: scripted, runControl: {planning: required}, \
             proposals: {allowedActions: [restart], allowedNamespaces: ['*']}",
        ),
        policy(
            "previewed",
            "sessions: [preview-*], provider: scripted, runControl: {planning: preview}",
        ),
        policy(
            "hastyplan",
            "sessions: [hastyplan-*], provider: scripted, \
             runControl: {planning: required, pausedTimeout: 1s}",
        ),
        policy(
            "summarized",
            "sessions: [summed-*], provider: scripted, models: {summarize: small}",
        ),
    ]);
    std::fs::write(dir.join("all.yaml"), yaml).unwrap();
}

/// `?format=jsonl` gives the same events, with the same ids, as the SSE replay, from any
/// sequence number on; a wrong format or a lone `from_seq` is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jsonl_export_is_the_sse_replay() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    push(
        &script,
        tool_calls(&[("c1", "get_incident_history", json!({"query": "checkout"}))]),
    );
    push_answer(&script, &["Nothing ", "like it before."]);
    let id = session(&server, "incident-1").await;
    let streamed_events = ask(&server, &id, "Has checkout failed before?").await;
    assert!(run_ended(&streamed_events), "{streamed_events:?}");

    let replay = read_sse(
        http_client()
            .get(server.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
            .send()
            .await
            .unwrap(),
        run_ended,
    )
    .await;
    let export = |query: &'static str| {
        let url = server.url(&format!("/chat/v1/sessions/{id}/events?{query}"));
        async move {
            let r = http_client().get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let kind = header(r.headers(), "content-type");
            (status, kind, r.text().await.unwrap_or_default())
        }
    };
    let (status, kind, body) = export("format=jsonl").await;
    assert_eq!(
        (status, kind.as_str()),
        (200, "application/jsonl"),
        "{body}"
    );
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let exported: Vec<(i64, String, Value)> = lines
        .iter()
        .map(|l| {
            (
                l["id"].as_i64().unwrap_or_default(),
                l["event"].as_str().unwrap_or_default().to_owned(),
                l["data"].clone(),
            )
        })
        .collect();
    let replayed: Vec<(i64, String, Value)> = replay
        .iter()
        .map(|e| (e.id, e.event.clone(), e.data.clone()))
        .collect();
    assert_eq!(exported, replayed);
    assert!(
        exported.iter().any(|(_, e, _)| e == "tool.end") && exported.len() >= 6,
        "{exported:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["runId"].is_string() && l["createdAt"].is_string())
    );

    // From a sequence number on.
    let (_, _, tail) = export("format=jsonl&from_seq=3").await;
    let ids: Vec<i64> = tail
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["id"].as_i64())
        .collect();
    assert_eq!(
        ids,
        replayed
            .iter()
            .map(|e| e.0)
            .filter(|s| *s >= 3)
            .collect::<Vec<_>>()
    );

    for (query, why) in [
        ("format=csv", "the events export format is jsonl"),
        ("from_seq=2", "from_seq goes with format=jsonl"),
    ] {
        let (status, _, body) = export(query).await;
        assert_eq!(status, 400, "{query}");
        assert!(body.contains(why), "{query}: {body}");
    }
}

/// A first step that takes a while (a slow tool-call stream), then a final answer.
fn script_two_steps(script: &Script, answer: &str) {
    let mut slow = tool_calls(&[("c1", "get_incident_history", json!({"query": "checkout"}))]);
    slow.chunk_delay = Some(Duration::from_millis(250));
    push(script, slow);
    push_answer(script, &[answer]);
}

/// Starts a run without following it; its id.
async fn start(server: &Server, id: &str, content: &str) -> String {
    let r = post_message(server, id, content).await;
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.unwrap_or_default();
    v["runId"].as_str().unwrap_or_default().to_owned()
}

async fn control(server: &Server, id: &str, run: &str, what: &str, body: Value) -> (u16, Value) {
    let r = http_client()
        .post(server.url(&format!("/chat/v1/sessions/{id}/runs/{run}/{what}")))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// The session's events so far and until `stop`.
async fn events_until(server: &Server, id: &str, stop: impl Fn(&[Sse]) -> bool) -> Vec<Sse> {
    read_sse(
        http_client()
            .get(server.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
            .send()
            .await
            .unwrap(),
        stop,
    )
    .await
}

fn states(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == "run.lifecycle")
        .filter_map(|e| e.data["state"].as_str().map(str::to_owned))
        .collect()
}

fn has_state(state: &'static str) -> impl Fn(&[Sse]) -> bool {
    move |events| states(events).iter().any(|s| s == state)
}

async fn session_status(server: &Server, id: &str) -> String {
    let v = session_json(server, id).await;
    v["status"].as_str().unwrap_or_default().to_owned()
}

/// A pause asked mid-step lets the step finish and is recorded, then nothing more goes to
/// the provider until the run is resumed; it then completes. Controls a state does not
/// allow are 409 `run_state`, on a finished run 409 `run_final`; every transition is an
/// event and an audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_sends_nothing_until_it_is_resumed() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    script_two_steps(&script, "The database was slow.");
    let id = session(&server, "incident-1").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    provider_called(&script).await;
    let (status, body) = control(&server, &id, &run, "pause", json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("pausing")),
        "{body}"
    );
    // Asked twice: refused, naming the state.
    let (status, body) = control(&server, &id, &run, "pause", json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "run_state");

    let events = events_until(&server, &id, has_state("paused")).await;
    assert_eq!(
        states(&events),
        ["started", "pausing", "paused"],
        "{events:?}"
    );
    // The step in flight finished: its tool ran and was recorded.
    assert!(events.iter().any(|e| e.event == "tool.end"), "{events:?}");
    assert_eq!(session_status(&server, &id).await, "paused");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        chat_requests(&script).len(),
        1,
        "nothing is sent while paused"
    );
    // A new message waits for the paused run.
    let r = post_message(&server, &id, "hello?").await;
    assert_eq!(r.status().as_u16(), 409);

    let (status, body) = control(&server, &id, &run, "resume", json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("running")),
        "{body}"
    );
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events),
        ["started", "pausing", "paused", "running", "completed"],
        "{events:?}"
    );
    assert_eq!(chat_requests(&script).len(), 2);
    assert_eq!(session_status(&server, &id).await, "idle");

    for what in ["pause", "resume", "cancel"] {
        let (status, body) = control(&server, &id, &run, what, json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (409, Some("run_final")),
            "{what}: {body}"
        );
    }
    let (status, _) = control(&server, &id, "no-such-run", "pause", json!({})).await;
    assert_eq!(status, 404);
    let audit = get_json(&http_client(), server.url("/api/v1/audit?kind=run_control")).await;
    let moves: Vec<(String, String)> = audit["items"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .rev()
                .map(|r| {
                    (
                        r["detail"]["from"].as_str().unwrap_or_default().to_owned(),
                        r["detail"]["to"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        moves,
        [
            ("running".into(), "pausing".into()),
            ("paused".into(), "running".into())
        ],
        "{audit}"
    );
}

/// Two quick redirects during a step are both taken in, in order, exactly once, at the
/// next boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_join_the_run_once_each_in_order() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    script_two_steps(&script, "Looked at the database and the cache.");
    let id = session(&server, "incident-2").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    provider_called(&script).await;
    for text in ["stop, look at the database instead", "and the cache"] {
        let (status, body) =
            control(&server, &id, &run, "redirect", json!({"message": text})).await;
        assert_eq!(status, 202, "{body}");
        assert!(body["redirectId"].is_string(), "{body}");
    }
    let (status, body) = control(&server, &id, &run, "redirect", json!({"message": " "})).await;
    assert_eq!(status, 400, "{body}");
    let events = events_until(&server, &id, run_ended).await;
    assert!(
        states(&events).contains(&"completed".to_owned()),
        "{events:?}"
    );
    let requests = chat_requests(&script);
    assert_eq!(requests.len(), 2);
    let users: Vec<String> = requests[1]["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        users,
        [
            "Why is checkout slow?",
            "stop, look at the database instead",
            "and the cache"
        ],
        "{:#}",
        requests[1]
    );
    // After the tool result, so the transcript stays valid for providers.
    let roles: Vec<&str> = requests[1]["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["role"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "user", "user"]
    );
}

/// A paused run is in the database only: a restarted server resumes it, and a run paused
/// past its policy's `runControl.pausedTimeout` is cancelled with a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_survives_a_restart_and_expires() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let db = dir.path().join("k.db");
    let server = Server::start(dir.path(), &db, &[]);
    script_two_steps(&script, "Done after the restart.");
    let id = session(&server, "incident-3").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    provider_called(&script).await;
    control(&server, &id, &run, "pause", json!({})).await;
    events_until(&server, &id, has_state("paused")).await;
    server.kill9();
    let server = Server::start(dir.path(), &db, &[]);
    assert_eq!(session_status(&server, &id).await, "paused");
    let (status, body) = control(&server, &id, &run, "resume", json!({})).await;
    assert_eq!(status, 202, "{body}");
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("completed"),
        "{events:?}"
    );

    // hasty-* sessions wait at most 1 s paused.
    script_two_steps(&script, "never sent");
    let id = session(&server, "hasty-1").await;
    let run = start(&server, &id, "Why?").await;
    eventually("the second run's provider call", || async {
        if chat_requests(&script).len() >= 3 {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    control(&server, &id, &run, "pause", json!({})).await;
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("cancelled"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.event == "notice"
            && e.data["message"]
                .as_str()
                .is_some_and(|m| m.contains("runControl.pausedTimeout"))),
        "{events:?}"
    );
    assert_eq!(session_status(&server, &id).await, "idle");
    assert_eq!(
        chat_requests(&script).len(),
        3,
        "nothing sent after the pause"
    );
}

/// Two replicas on one PostgreSQL database: a run executing at A is paused and redirected
/// through B, resumed through B (which then executes it), and completes with the redirect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_one_replica_is_paused_redirected_and_resumed_at_another_on_postgres() {
    let Some(db) = postgres().await else {
        return;
    };
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let a = Server::start_with_url(dir.path(), &db.url, &[]);
    let b = Server::start_with_url(dir.path(), &db.url, &[]);
    script_two_steps(&script, "Checked the database.");
    let id = session(&a, "incident-4").await;
    let run = start(&a, &id, "Why is checkout slow?").await;
    provider_called(&script).await;
    let (status, body) = control(&b, &id, &run, "pause", json!({})).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = control(
        &b,
        &id,
        &run,
        "redirect",
        json!({"message": "look at the database"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    events_until(&b, &id, has_state("paused")).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        chat_requests(&script).len(),
        1,
        "A sent nothing after the pause"
    );
    // How long after the step in flight ended the run at A parked (reported, not judged:
    // the stored events' times, from the export).
    let export = get_text(b.url(&format!("/chat/v1/sessions/{id}/events?format=jsonl"))).await;
    let at = |event: &str, state: Option<&str>| {
        export
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["event"] == event && state.is_none_or(|s| l["data"]["state"] == s))
            .filter_map(|l| {
                l["createdAt"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            })
            .next_back()
    };
    if let (Some(end), Some(parked)) = (at("tool.end", None), at("run.lifecycle", Some("paused"))) {
        println!(
            "pause asked at B: the run at A parked {} ms after its step ended",
            parked.as_millisecond() - end.as_millisecond()
        );
    }
    let (status, body) = control(&b, &id, &run, "resume", json!({})).await;
    assert_eq!(status, 202, "{body}");
    let events = events_until(&a, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("completed"),
        "{events:?}"
    );
    let requests = chat_requests(&script);
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1]["messages"]
            .to_string()
            .contains("look at the database"),
        "{:#}",
        requests[1]
    );
}

fn calls(list: &[(&str, &str, Value)]) -> Reply {
    tool_calls(list)
}

/// The tool result a provider request carries for `call`.
fn result_of(requests: &[Value], call: &str) -> String {
    requests
        .iter()
        .rev()
        .find_map(|r| tool_result(r, call))
        .unwrap_or_default()
}

/// `planning: required`: no tool before a plan; the run waits for the plan; an edit naming
/// an unknown step is 400; the approved (edited) plan is what the model may do; a rejected
/// plan cancels the run. `preview`: the plan is shown and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_plan_is_approved_edited_enforced_or_rejected() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let plan = json!({"steps": [
        {"id": "1", "tool": "get_incident_history", "purpose": "how it went before"},
        {"id": "2", "tool": "propose_action", "purpose": "restart it"}]});
    push(
        &script,
        calls(&[("a1", "get_incident_history", json!({"query": "checkout"}))]),
    );
    push(&script, calls(&[("p1", "submit_plan", plan.clone())]));
    let id = session(&server, "planned-1").await;
    let run = start(&server, &id, "Fix checkout").await;
    let events = events_until(&server, &id, has_state("awaiting_plan")).await;
    let proposal = events
        .iter()
        .find(|e| e.event == "plan.proposal")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(proposal.data["mode"], "required");
    assert_eq!(proposal.data["steps"], plan["steps"]);
    assert_eq!(session_status(&server, &id).await, "awaiting_plan");
    // The call made before any plan was refused, naming the gate.
    let early = result_of(&chat_requests(&script), "a1");
    assert!(
        early.contains("state your plan with submit_plan"),
        "{early}"
    );

    let (status, body) = control(&server, &id, &run, "plan/approve", json!({"steps": ["9"]})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("plan_edit_invalid")),
        "{body}"
    );
    let (status, body) = control(&server, &id, &run, "pause", json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("run_state")),
        "{body}"
    );
    push(
        &script,
        calls(&[
            (
                "c1",
                "propose_action",
                json!({"action": "restart", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"}, "rationale": "stuck"}),
            ),
            ("c2", "get_incident_history", json!({"query": "checkout"})),
        ]),
    );
    push_answer(&script, &["Checked the history only."]);
    let (status, body) = control(&server, &id, &run, "plan/approve", json!({"steps": ["1"]})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["steps"].as_array().map(Vec::len), Some(1), "{body}");
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("completed"),
        "{events:?}"
    );
    let requests = chat_requests(&script);
    assert!(
        result_of(&requests, "p1").starts_with("Plan approved by local"),
        "{requests:?}"
    );
    let refused = result_of(&requests, "c1");
    assert!(
        refused.contains("propose_action is not in the approved plan"),
        "{refused}"
    );
    assert!(
        result_of(&requests, "c2").contains("sessions"),
        "the planned tool ran"
    );
    let proposals = get_json(&http_client(), server.url("/chat/v1/proposals")).await;
    assert_eq!(
        proposals["items"].as_array().map(Vec::len),
        Some(0),
        "{proposals}"
    );

    // Rejected: the run is cancelled and the transcript says why.
    push(&script, calls(&[("p2", "submit_plan", plan.clone())]));
    let id = session(&server, "planned-2").await;
    let run = start(&server, &id, "Fix checkout").await;
    events_until(&server, &id, has_state("awaiting_plan")).await;
    let (status, body) = control(&server, &id, &run, "plan/reject", json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("cancelled")),
        "{body}"
    );
    assert_eq!(session_status(&server, &id).await, "idle");
    let stored = session_json(&server, &id).await;
    assert!(
        stored
            .to_string()
            .contains("the plan was rejected by local"),
        "{stored}"
    );
    let (status, _) = control(&server, &id, &run, "plan/approve", json!({})).await;
    assert_eq!(status, 409);

    // Preview: shown, and the run goes on at once.
    push(
        &script,
        calls(&[
            (
                "v1",
                "submit_plan",
                json!({"steps": [{"id": "1", "tool": "get_incident_history", "purpose": "past"}]}),
            ),
            ("v2", "get_incident_history", json!({"query": "checkout"})),
        ]),
    );
    push_answer(&script, &["Previewed."]);
    let id = session(&server, "preview-1").await;
    start(&server, &id, "Fix checkout").await;
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("completed"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.event == "plan.proposal" && e.data["mode"] == "preview")
    );
    let requests = chat_requests(&script);
    assert!(result_of(&requests, "v1").contains("noted"));
    assert!(result_of(&requests, "v2").contains("sessions"));

    // Nobody decides: after the policy's pausedTimeout the run is cancelled with a notice.
    push(
        &script,
        calls(&[(
            "p9",
            "submit_plan",
            json!({"steps": [{"id": "1", "tool": "get_incident_history", "purpose": "past"}]}),
        )]),
    );
    let id = session(&server, "hastyplan-1").await;
    start(&server, &id, "Fix checkout").await;
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("cancelled"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.event == "notice"
            && e.data["message"]
                .as_str()
                .is_some_and(|m| m.contains("runControl.pausedTimeout"))),
        "{events:?}"
    );
    assert_eq!(session_status(&server, &id).await, "idle");
    let stored = session_json(&server, &id).await;
    assert!(
        stored.to_string().contains("waited paused or on its plan"),
        "the plan's call has its result: {stored}"
    );
}

/// After a completed run, a policy with a `summarize` model suggests next questions (a
/// `follow_ups` event and `GET …/follow-ups`); a policy without one makes no such call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_come_from_the_summarize_model_only() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        Some(if system.contains("follow-up questions") {
            json_reply(
                200,
                &(openai().text_json)(
                    "1. What changed in the last deploy?\n2. Is the database healthy?\n3. Are other services slow?",
                ),
            )
        } else if body["stream"] == true {
            answer(&["It was the database."])
        } else {
            json_reply(200, &(openai().text_json)("Checkout slow: database"))
        })
    }));
    let follow_up_calls = || {
        chat_requests(&script)
            .iter()
            .filter(|b| {
                b["messages"][0]["content"]
                    .to_string()
                    .contains("follow-up questions")
            })
            .count()
    };

    let id = session(&server, "summed-1").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    let events = events_until(&server, &id, |e| e.iter().any(|e| e.event == "follow_ups")).await;
    let suggested = events
        .iter()
        .find(|e| e.event == "follow_ups")
        .unwrap_or_else(|| panic!("{events:?}"));
    let expected = json!([
        "What changed in the last deploy?",
        "Is the database healthy?",
        "Are other services slow?"
    ]);
    assert_eq!(suggested.data["questions"], expected);
    assert_eq!(suggested.data["runId"], run.as_str());
    let got = get_json(
        &http_client(),
        server.url(&format!("/chat/v1/sessions/{id}/runs/{run}/follow-ups")),
    )
    .await;
    assert_eq!(got["questions"], expected);
    // The summarize model was asked, as the policy's role says.
    assert!(chat_requests(&script).iter().any(|b| {
        b["model"] == "small"
            && b["messages"][0]["content"]
                .to_string()
                .contains("follow-up")
    }));
    assert_eq!(follow_up_calls(), 1);

    // Without a summarize role: no call, no event, an empty list.
    let id = session(&server, "incident-9").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    let events = events_until(&server, &id, run_ended).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!events.iter().any(|e| e.event == "follow_ups"));
    assert_eq!(follow_up_calls(), 1);
    let got = get_json(
        &http_client(),
        server.url(&format!("/chat/v1/sessions/{id}/runs/{run}/follow-ups")),
    )
    .await;
    assert_eq!(got["questions"], json!([]));
}

/// `kortex chat` driven through its standard input, its output collected.
struct Terminal {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    fn start(base: &str, session: &str) -> Self {
        use std::io::Read;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kortex"))
            .args([
                "chat",
                "--server",
                base.trim_end_matches('/'),
                "--session",
                session,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        for pipe in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut pipe = pipe;
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    out.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let stdin = child.stdin.take().expect("stdin");
        Self { child, stdin, out }
    }

    fn say(&mut self, line: &str) {
        use std::io::Write;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| self.stdin.flush())
            .unwrap();
    }

    async fn shown(&self, what: &str) {
        eventually(what, || async {
            let text = self.out.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if text.contains(what) {
                Ok(())
            } else {
                Err(text)
            }
        })
        .await;
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kortex chat` steers a run as it streams: `/pause`, then `/redirect` (kept for the
/// resume) and `/resume`, which follows the run to its end; and approves a plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_client_pauses_redirects_resumes_and_approves_plans() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    script_two_steps(&script, "The database it was.");
    let base = server.url("");
    let mut chat = Terminal::start(&base, "incident-cli");
    chat.say("Why is checkout slow?");
    provider_called(&script).await;
    chat.say("/pause");
    chat.shown("paused: /resume").await;
    chat.say("/redirect look at the database");
    chat.shown("run paused").await;
    chat.say("/resume");
    chat.shown("The database it was.").await;
    let requests = chat_requests(&script);
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1]["messages"]
            .to_string()
            .contains("look at the database")
    );
    chat.say("/quit");

    // A plan, approved from the terminal with an edit.
    push(
        &script,
        calls(&[(
            "p1",
            "submit_plan",
            json!({"steps": [
            {"id": "1", "tool": "get_incident_history", "purpose": "past"},
            {"id": "2", "tool": "get_incident_history", "purpose": "again"}]}),
        )]),
    );
    push_answer(&script, &["Planned and done."]);
    let mut chat = Terminal::start(&base, "planned-cli");
    chat.say("Fix checkout");
    chat.shown("waiting for the plan").await;
    chat.shown("1. past (get_incident_history)").await;
    chat.say("/plan approve 2");
    chat.shown("Planned and done.").await;
    let approved = result_of(&chat_requests(&script), "p1");
    assert!(
        approved.contains("2. again") && !approved.contains("1. past"),
        "{approved}"
    );
    chat.say("/quit");
}

/// A redirect with `rewindTo: N` drops the steps after N from what the model sees next;
/// the transcript keeps them, marked superseded. A step the run never took is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_supersedes_the_later_steps() {
    let (llm, script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &llm);
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    push(
        &script,
        calls(&[("c1", "get_incident_history", json!({"query": "checkout"}))]),
    );
    let mut slow = calls(&[("c2", "get_incident_history", json!({"query": "cache"}))]);
    slow.chunk_delay = Some(Duration::from_millis(250));
    push(&script, slow);
    push_answer(&script, &["The database, as you said."]);
    let id = session(&server, "incident-5").await;
    let run = start(&server, &id, "Why is checkout slow?").await;
    eventually("the second step's provider call", || async {
        if chat_requests(&script).len() >= 2 {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    let (status, body) = control(
        &server,
        &id,
        &run,
        "redirect",
        json!({"message": "forget the cache, look at the database", "rewindTo": 9}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("rewind_invalid")),
        "{body}"
    );
    let (status, body) = control(
        &server,
        &id,
        &run,
        "redirect",
        json!({"message": "forget the cache, look at the database", "rewindTo": 1}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let events = events_until(&server, &id, run_ended).await;
    assert_eq!(
        states(&events).last().map(String::as_str),
        Some("completed"),
        "{events:?}"
    );
    let requests = chat_requests(&script);
    assert_eq!(requests.len(), 3);
    let seen = requests[2]["messages"].to_string();
    assert!(
        seen.contains("c1") && !seen.contains("c2"),
        "step 2 is gone: {seen}"
    );
    assert!(seen.contains("forget the cache"), "{seen}");
    let stored = session_json(&server, &id).await;
    let superseded: Vec<&Value> = stored["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["superseded"] == true).collect())
        .unwrap_or_default();
    assert_eq!(
        superseded.len(),
        2,
        "step 2's call and result are kept, struck: {stored}"
    );
    assert!(superseded.iter().any(|m| m["toolCallId"] == "c2"));
}
