//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) driven by
//! `playwright-core` (`operator/tests/browser/dashboard.mjs`) against the real binary and a
//! wire-format provider server. Skipped when Chromium or the npm package is missing,
//! unless `KORTEX_REQUIRE_BROWSER=1` (the test script sets it after installing them).

use crate::support::browser::{passed, run_browser, screenshots};
use crate::support::chat::chat_with_calls;
use crate::support::fake_api::incidents_cluster;
use crate::support::manifests::{
    chat_key, docs, keyed_manifests, manifest_dir, policy, provider, secret,
};
use crate::support::provider::{
    Reply, json_reply, mock, openai, openai_chunk, streamed, tool_result,
};
use crate::support::server::{Server, start_run};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const KEY: &str = "kx-dashboard-test-key-7f3a9c";
const ANSWER: &str = "The checkout pods restart because they run out of memory after the 1.4.2 deploy. I proposed a restart of deployment checkout; confirm it if the evidence convinces you.";

/// The provider's part of the scenario: tool calls for a question, then a slow answer
/// once the tool results are in (slow enough to reload the page in the middle of it).
fn responder(body: &Value) -> Option<Reply> {
    let messages = body["messages"].as_array()?;
    let last = messages.last()?;
    let d = openai();
    if last["role"] == "tool" {
        let mut chunks = vec![openai_chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        for word in ANSWER.split_inclusive(' ') {
            chunks.push(openai_chunk(json!({"content": word}), Value::Null));
        }
        chunks.push(openai_chunk(json!({}), json!("stop")));
        chunks.push("data: [DONE]\n\n".into());
        let mut reply = streamed(&d, chunks);
        reply.chunk_delay = Some(Duration::from_millis(120));
        return Some(reply);
    }
    let propose = json!({
        "action": "restart",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"},
        "rationale": "OOMKilled 14 times since the 1.4.2 deploy; a restart clears the leaked cache.",
        "blastRadius": "checkout pods restart one at a time",
        "reversible": true
    })
    .to_string();
    Some(streamed(
        &d,
        (d.tools_stream)(&[
            (
                "call_history",
                "get_incident_history",
                r#"{"query": "checkout OOMKilled"}"#,
            ),
            ("call_propose", "propose_action", &propose),
        ]),
    ))
}

fn manifests(dir: &Path, base: &str) {
    let yaml = docs(&[
        secret("llm-keys", "openai: sk-dashboard-provider-key-1234"),
        chat_key(
            "alice-key",
            &format!("user: alice, key: {KEY}, groups: sre"),
        ),
        provider(
            "gpt",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', \
                 apiKeySecretRef: {{name: llm-keys, key: openai}}, defaultModel: test-model, \
                 timeout: 10s, \
                 models: [{{id: test-model, cost: {{inputUsdPerMTok: 3, outputUsdPerMTok: 15}}}}]"
            ),
        ),
        policy(
            "incidents",
            "sessions: [incident-*], provider: gpt, budget: {dailyUsdLimit: 20}, \
             proposals: {allowedActions: [restart], allowedNamespaces: [shop], \
             requireDistinctApprover: false}",
        ),
    ]);
    std::fs::write(dir.join("dashboard.yaml"), yaml).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_signs_in_chats_streams_survives_a_reload_and_approves() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let (dir, m) = manifest_dir();
    manifests(&m, &base);
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    // Not on loopback, so the browser has to sign in with a chat key.
    let (server, url) = Server::start_keyed(&m, &db, &[]);
    let env = [
        ("KORTEX_URL", url.as_str()),
        ("KORTEX_KEY", KEY),
        ("KORTEX_ANSWER", ANSWER),
    ];
    let Some(out) = run_browser("dashboard.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    let shots = screenshots();
    for shot in [
        "chat.png",
        "proposals.png",
        "status.png",
        "phone.png",
        "signin-light.png",
        "signin-dark.png",
    ] {
        assert!(shots.join(shot).exists(), "{shot} was not saved");
    }
    assert!(!server.log().contains(KEY), "the chat key reached the log");
    assert!(server.terminate().success());
}

/// What the scripted model answers in the run-control browser test: a slow tool call first,
/// the answer once a redirect is in; for planned sessions a plan, then its tool, then an
/// answer; follow-up questions when asked for them.
fn steering_responder(body: &Value) -> Option<Reply> {
    let d = openai();
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    if system.contains("follow-up questions") {
        return Some(json_reply(
            200,
            &(d.text_json)(
                "Is the database healthy?\nWhat changed today?\nAre other services slow?",
            ),
        ));
    }
    if body["stream"] != true {
        return Some(json_reply(200, &(d.text_json)("Checkout incident")));
    }
    let messages = body["messages"].as_array()?;
    let has_tool_result = |id: &str| messages.iter().any(|m| m["tool_call_id"] == id);
    let text = |t: &str| streamed(&d, (d.text_stream)(&[t]));
    let planned = body["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "submit_plan"));
    if planned {
        if !has_tool_result("p1") {
            let plan = r#"{"steps": [{"id": "1", "tool": "get_incident_history", "purpose": "past incidents"}, {"id": "2", "tool": "get_incident_history", "purpose": "similar alerts"}]}"#;
            return Some(streamed(
                &d,
                (d.tools_stream)(&[("p1", "submit_plan", plan)]),
            ));
        }
        if !has_tool_result("h1") {
            return Some(streamed(
                &d,
                (d.tools_stream)(&[("h1", "get_incident_history", r#"{"query": "checkout"}"#)]),
            ));
        }
        let last = messages.last()?;
        if last["role"] == "user" {
            return Some(text("The database is fine."));
        }
        return Some(text("Planned and done."));
    }
    if messages
        .iter()
        .any(|m| m["content"] == "look at the database instead")
    {
        return Some(text("The database, as you said."));
    }
    let mut slow = streamed(
        &d,
        (d.tools_stream)(&[("s1", "get_incident_history", r#"{"query": "checkout"}"#)]),
    );
    slow.chunk_delay = Some(Duration::from_millis(400));
    Some(slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_pauses_redirects_resumes_and_approves_plans() {
    let (llm, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(steering_responder));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        docs(&[
            provider(
                "scripted",
                &format!(
                    "type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m, timeout: 20s"
                ),
            ),
            policy("ops", "sessions: [incident-*], provider: scripted"),
            policy(
                "planned",
                "sessions: [planned-*], provider: scripted, runControl: {planning: required}, \
                 models: {summarize: small}",
            ),
        ]),
    )
    .unwrap();
    // On loopback: no sign-in.
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let url = server.url("");
    let env = [("KORTEX_URL", url.trim_end_matches('/'))];
    let Some(out) = run_browser("run_control.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    // The plan the person edited is what the model was told.
    let told = script
        .requests()
        .iter()
        .find_map(|s| tool_result(&s.body, "p1"))
        .unwrap_or_default();
    assert!(
        told.contains("2. similar alerts") && !told.contains("1. past incidents"),
        "{told}"
    );
}

/// What the hand-over summary says in the sharing browser test.
const SUMMARY: &str =
    "Problem: the database connection pool is exhausted. Next steps: resize the pool.";

/// The scripted model of the sharing browser test: answers, titles, and the hand-over summary.
fn sharing_responder(body: &Value) -> Option<Reply> {
    let d = openai();
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    if body["stream"] != true {
        let text = if system.contains("hand-over summary") {
            SUMMARY
        } else {
            "Database incident"
        };
        return Some(json_reply(200, &(d.text_json)(text)));
    }
    let last = body["messages"].as_array()?.last()?["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let answer = if last.contains("resize") {
        "Yes, within the memory limit."
    } else {
        "The connection pool is exhausted."
    };
    Some(streamed(&d, (d.text_stream)(&[answer])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shares_hands_over_and_shows_who_asked() {
    const KEYS: [(&str, &str); 3] = [
        ("alice", "kx-alice-browser-0123456789"),
        ("bob", "kx-bob-browser-0123456789"),
        ("carol", "kx-carol-browser-0123456789"),
    ];
    let (llm, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(sharing_responder));
    let yaml = docs(&[
        provider(
            "scripted",
            &format!("type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m, timeout: 20s"),
        ),
        policy(
            "ops",
            "sessions: [incident-*], provider: scripted, models: {summarize: scripted/m}",
        ),
    ]);
    let users: Vec<(&str, &str, &str)> = KEYS.iter().map(|(u, k)| (*u, *k, "")).collect();
    let (dir, db) = keyed_manifests(&users, &yaml);
    // Not on loopback: each person signs in with their own key.
    let (server, url) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    let keys = serde_json::to_string(
        &KEYS
            .iter()
            .copied()
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
    .unwrap_or_default();
    let env = [
        ("KORTEX_URL", url.as_str()),
        ("KORTEX_KEYS", keys.as_str()),
        ("KORTEX_SUMMARY", SUMMARY),
    ];
    let Some(out) = run_browser("sharing.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    for shot in ["share-dialog.png", "handover.png", "shared-read-only.png"] {
        assert!(screenshots().join(shot).exists(), "{shot} was not saved");
    }
}

/// What the scripted model answers in the Markdown browser test: a heading, a list, a table,
/// a YAML block, links (one with a `javascript:` URL) and HTML that must stay text, streamed
/// in small pieces so that the table and the code block arrive split.
/// The session title the summarize role writes in the Markdown test.
const INCIDENT_SUMMARY: &str = "checkout pods OOMKilled 14 times: memory limit too low";

const MARKDOWN_ANSWER: &str = "### Findings\n\n- `checkout-7d9` was `OOMKilled` 14 times\n- the **memory limit** is too low\n\n| Pod | Restarts | Reason |\n|---|---:|---|\n| checkout-7d9 | 14 | OOMKilled |\n| checkout-5f2 | 3 | OOMKilled |\n\nRaise it:\n\n```yaml\nresources:\n  limits:\n    memory: 512Mi\n```\n\nSee [the runbook](https://runbooks.example.com/checkout) or [click me](javascript:alert(1)).\n\n<script>alert(\"x\")</script> and <img src=x onerror=alert(1)>\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_markdown_answers_safely() {
    let (llm, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|body: &Value| {
        let d = openai();
        // The summarize role's calls (not streamed): the session's title — the incident
        // summary shown in the list — and follow-up questions.
        if body["stream"] != json!(true) {
            let asked = body["messages"].to_string();
            let text = if asked.contains("Write a title") {
                INCIDENT_SUMMARY
            } else {
                "Which deploy lowered the limit?\nAre other pods near their limit?"
            };
            return Some(json_reply(200, &(d.text_json)(text)));
        }
        let mut chunks = vec![openai_chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        // A long answer, a line every 50 ms (the scroll-position check).
        if body["messages"].to_string().contains("slowly") {
            for i in 1..=60 {
                chunks.push(openai_chunk(
                    json!({"content": format!("- line {i} of the slow answer\n")}),
                    Value::Null,
                ));
            }
            chunks.push(openai_chunk(json!({}), json!("stop")));
            chunks.push("data: [DONE]\n\n".into());
            return Some(Reply {
                chunk_delay: Some(Duration::from_millis(50)),
                ..streamed(&d, chunks)
            });
        }
        let text: Vec<char> = MARKDOWN_ANSWER.chars().collect();
        for piece in text.chunks(7) {
            chunks.push(openai_chunk(
                json!({"content": piece.iter().collect::<String>()}),
                Value::Null,
            ));
        }
        chunks.push(openai_chunk(json!({}), json!("stop")));
        chunks.push("data: [DONE]\n\n".into());
        Some(streamed(&d, chunks))
    }));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        docs(&[
            provider(
                "scripted",
                &format!("type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m"),
            ),
            policy(
                "ops",
                "sessions: [incident-*], provider: scripted, models: {summarize: m}",
            ),
        ]),
    )
    .unwrap();
    // On loopback: no sign-in.
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let url = server.url("");
    let env = [
        ("KORTEX_URL", url.trim_end_matches('/')),
        ("KORTEX_SUMMARY", INCIDENT_SUMMARY),
    ];
    let Some(out) = run_browser("markdown.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    assert!(screenshots().join("markdown.png").exists());
    // Every screen, light and dark, through axe-core.
    let Some(out) = run_browser("a11y.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
    for screen in ["chat", "proposals", "status", "usage"] {
        for scheme in ["light", "dark"] {
            let shot = format!("{screen}-{scheme}.png");
            assert!(screenshots().join(&shot).exists(), "{shot} was not saved");
        }
    }
}

/// Cluster mode: a scale proposal's card shows the dry run as a diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_proposals_dry_run_as_a_diff() {
    let (fake, llm, script) =
        incidents_cluster(json!({"allowedActions": ["scale"], "allowedNamespaces": ["shop"]}))
            .await;
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    let target =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"});
    chat_with_calls(
        &server,
        &script,
        &[(
            "p1",
            "propose_action",
            json!({"action": "scale", "target": target, "params": {"replicas": 5},
                "rationale": "the queue is backing up"}),
        )],
        "Proposed.",
        json!({"name": "incident-diff", "namespace": "team-a"}),
        "scale api to 5",
    )
    .await;
    let url = server.url("");
    let env = [("KORTEX_URL", url.trim_end_matches('/'))];
    let Some(out) = run_browser("proposal_diff.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
}

/// The scripted model of the layout browser test: a long answer (with a shell line wider
/// than a phone) when asked for lines; otherwise a look at the history and a restart
/// proposal, then, a moment after the card, a short answer.
fn layout_responder(body: &Value) -> Option<Reply> {
    let d = openai();
    let messages = body["messages"].as_array()?;
    let last = messages.last()?;
    if last["role"] == "tool" {
        let mut reply = streamed(
            &d,
            (d.text_stream)(&["Proposed a restart ", "of checkout."]),
        );
        reply.chunk_delay = Some(Duration::from_millis(300));
        return Some(reply);
    }
    if last["content"]
        .as_str()
        .unwrap_or_default()
        .contains("lines")
    {
        let mut text = String::from("What the history says:\n\n");
        for i in 1..=40 {
            text.push_str(&format!("- line {i}: checkout-7d9 was OOMKilled\n"));
        }
        text.push_str("\n```sh\nkubectl -n shop logs deployment/checkout --since=1h --all-containers --prefix --timestamps | grep -i oomkilled\n```\n");
        return Some(streamed(&d, (d.text_stream)(&[&text])));
    }
    // Call ids unique in the session: one pair per question.
    let n = messages.iter().filter(|m| m["role"] == "user").count();
    let propose = json!({
        "action": "restart",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"},
        "rationale": "OOMKilled 14 times since the 1.4.2 deploy; a restart clears the leaked cache until the fix ships.",
        "blastRadius": "checkout pods restart one at a time",
        "reversible": true
    })
    .to_string();
    let (history, proposal) = (format!("call_history_{n}"), format!("call_propose_{n}"));
    Some(streamed(
        &d,
        (d.tools_stream)(&[
            (
                &history,
                "get_incident_history",
                r#"{"query": "checkout OOMKilled"}"#,
            ),
            (&proposal, "propose_action", &propose),
        ]),
    ))
}

/// At 1366×860 and 390 px: live proposal cards scroll into view, nothing spills out of a
/// proposal card, and no page scrolls sideways on a phone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_keeps_live_cards_in_view_and_fits_a_phone() {
    let (llm, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(layout_responder));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        docs(&[
            provider(
                "scripted",
                &format!(
                    "type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m, timeout: 20s"
                ),
            ),
            policy(
                "incidents",
                "sessions: [incident-*], provider: scripted, \
                 proposals: {allowedActions: [restart], allowedNamespaces: [shop], \
                 requireDistinctApprover: false}",
            ),
        ]),
    )
    .unwrap();
    // On loopback: no sign-in.
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);
    let url = server.url("");
    let env = [("KORTEX_URL", url.trim_end_matches('/'))];
    let Some(out) = run_browser("layout.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
}
