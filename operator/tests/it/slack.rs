//! Slack's door against the binary (`docs/slack.md`), with a scripted Slack Web API:
//! requests signed exactly as Slack signs them (`v0` HMAC-SHA256 of `v0:timestamp:raw
//! body`) are taken; forged, stale, altered and other workspaces' requests are refused and
//! change nothing; a retried event is taken once; threads, cards, hand-overs and alert
//! threads end to end. Decisions judged by a real API server: `e2e/tests/operator/slack.rs`.

use crate::support::manifests::{docs, manifest_dir, policy, provider, secret};
use crate::support::net::http_client;
use crate::support::server::Server;
use serde_json::{Value, json};

const SIGNING: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn manifests(dir: &std::path::Path) {
    let yaml = docs(&[
        secret(
            "slack",
            &format!("bot-token: xoxb-slack-test-1, signing-secret: {SIGNING}"),
        ),
        provider(
            "local",
            "type: ollama, baseUrl: 'http://127.0.0.1:9/v1', defaultModel: m",
        ),
        policy(
            "oncall",
            "sessions: ['*'], provider: local, slack: {teamId: T0KORTEX, channels: [C0INCIDENT], \
             botTokenSecretRef: {name: slack, key: bot-token}, \
             signingSecretRef: {name: slack, key: signing-secret}}",
        ),
    ]);
    std::fs::write(dir.join("slack.yaml"), yaml).unwrap();
}

/// POSTs `body` to the door, signed at `at` with `secret` (`None`: unsigned).
async fn post(
    server: &Server,
    body: &str,
    at: i64,
    secret: Option<&str>,
    extra: &[(&str, &str)],
) -> (u16, String) {
    let mut r = http_client()
        .post(server.url("/slack/v1/events"))
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", at.to_string());
    if let Some(s) = secret {
        r = r.header(
            "x-slack-signature",
            kortex::slack::verify::sign(s.as_bytes(), at, body.as_bytes()),
        );
    }
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    let resp = r.body(body.to_owned()).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

fn mention(event_id: &str, team: &str) -> String {
    json!({"type": "event_callback", "team_id": team, "api_app_id": "A0KORTEX", "event_id": event_id,
        "event_time": 1_700_000_000,
        "event": {"type": "app_mention", "user": "U0ALICE", "text": "<@U0BOT> why is checkout failing?",
            "ts": "1700000000.000100", "channel": "C0INCIDENT", "event_ts": "1700000000.000100"}})
    .to_string()
}

/// The manifests of a Slack app: its Secret (bot token `token`, the signing secret, an LLM
/// key), the provider `gpt` at the mock `llm`, and the policy `oncall` (`sessions: ['*']`,
/// then `policy`'s fields) whose `spec.slack` has `slack`'s fields besides the team and
/// the Secrets.
fn app_yaml(llm: &str, token: &str, policy: &str, slack: &str) -> String {
    docs(&[
        secret(
            "slack",
            &format!("bot-token: {token}, signing-secret: {SIGNING}, llm: sk-slack"),
        ),
        provider(
            "gpt",
            &format!(
                "type: openai-compatible, baseUrl: '{llm}/v1', apiKeySecretRef: {{name: slack, key: llm}}, defaultModel: m, timeout: 10s"
            ),
        ),
        crate::support::manifests::policy(
            "oncall",
            &format!(
                "provider: gpt, {policy}slack: {{teamId: T0KORTEX, \
                 botTokenSecretRef: {{name: slack, key: bot-token}}, \
                 signingSecretRef: {{name: slack, key: signing-secret}}{slack}}}"
            ),
        ),
    ])
}

/// `kortex serve` on `yaml` (SQLite in the folder) with Slack's Web API at `slack`, and
/// `extra` arguments.
fn serve(
    slack: &crate::support::slack::Slack,
    yaml: &str,
    extra: &[&str],
) -> (tempfile::TempDir, Server) {
    let (dir, m) = manifest_dir();
    std::fs::write(m.join("slack.yaml"), yaml).unwrap();
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    let manifests = m.display().to_string();
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--manifests",
        &manifests,
        "--database-url",
        &db,
        "--slack-api-url",
        &slack.api,
    ];
    args.extend_from_slice(extra);
    let server = Server::spawn(&args, &[]);
    (dir, server)
}

/// An Events API callback of `user`'s message `text` in `C0INCIDENT` (`mention`: an
/// `app_mention`), at `ts`, in thread `thread` (none: a message of the channel).
fn message(
    id: &str,
    user: &str,
    text: &str,
    ts: &str,
    thread: Option<&str>,
    mention: bool,
) -> String {
    let mut event = json!({"type": if mention { "app_mention" } else { "message" }, "user": user,
        "text": text, "ts": ts, "channel": "C0INCIDENT", "channel_type": "channel"});
    if let Some(t) = thread {
        event["thread_ts"] = json!(t);
    }
    json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": id, "event": event})
        .to_string()
}

/// `user`'s `/kortex text` in `C0INCIDENT`, signed with `secret`.
async fn command(server: &Server, user: &str, text: &str, secret: &str) -> reqwest::Response {
    let body = format!(
        "token=x&team_id=T0KORTEX&channel_id=C0INCIDENT&user_id={user}&command=%2Fkortex&text={}&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1&trigger_id=1.2.3",
        url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>()
    );
    let at = jiff::Timestamp::now().as_second();
    http_client()
        .post(server.url("/slack/v1/commands"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", at.to_string())
        .header(
            "x-slack-signature",
            kortex::slack::verify::sign(secret.as_bytes(), at, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn counted(server: &Server, result: &str) -> u64 {
    let (_, text) = server.get("/metrics").await;
    let line = format!("kortex_slack_requests_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_requests_signed_by_the_app_are_taken_and_a_retried_event_once() {
    let (dir, m) = manifest_dir();
    manifests(&m);
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let now = jiff::Timestamp::now().as_second();

    // Slack's url_verification, signed: the challenge is echoed.
    let challenge = json!({"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}).to_string();
    let (status, body) = post(&server, &challenge, now, Some(SIGNING), &[]).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );

    // Forged (another secret), unsigned, stale (a replay six minutes on), and altered after
    // signing: each refused, saying why, and nothing taken.
    let event = mention("Ev0FORGED", "T0KORTEX");
    let (status, body) = post(&server, &event, now, Some("not the signing secret"), &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("signature does not match"), "{body}");
    let (status, body) = post(&server, &event, now, None, &[]).await;
    assert_eq!(status, 401);
    assert!(body.contains("no X-Slack-Signature"), "{body}");
    let (status, body) = post(&server, &event, now - 360, Some(SIGNING), &[]).await;
    assert_eq!(status, 401);
    assert!(body.contains("more than 5 minutes"), "{body}");
    let signature = kortex::slack::verify::sign(SIGNING.as_bytes(), now, event.as_bytes());
    let altered = event.replace("why is checkout failing?", "approve everything");
    let resp = http_client()
        .post(server.url("/slack/v1/events"))
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", now.to_string())
        .header("x-slack-signature", signature)
        .body(altered)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(counted(&server, "refused").await, 4);
    assert_eq!(
        counted(&server, "taken").await,
        1,
        "only the url_verification"
    );

    // Another workspace's event, though signed with this app's secret: refused.
    let (status, body) = post(
        &server,
        &mention("Ev0OTHER", "T0ELSEWHERE"),
        now,
        Some(SIGNING),
        &[],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("workspace T0ELSEWHERE"), "{body}");

    // A mention, then Slack's retry of the same delivery: taken once.
    let event = mention("Ev0MENTION", "T0KORTEX");
    assert_eq!(post(&server, &event, now, Some(SIGNING), &[]).await.0, 200);
    let retry = [
        ("x-slack-retry-num", "1"),
        ("x-slack-retry-reason", "http_timeout"),
    ];
    assert_eq!(
        post(&server, &event, now, Some(SIGNING), &retry).await.0,
        200
    );
    assert_eq!(counted(&server, "taken").await, 2);
    assert_eq!(counted(&server, "duplicate").await, 1);

    // The app's own message, and a message in a channel the policy does not listen in:
    // acknowledged, not taken.
    let own = json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": "Ev0OWN",
        "event": {"type": "message", "subtype": "bot_message", "bot_id": "B0KORTEX", "channel": "C0INCIDENT", "text": "answer", "ts": "1.0"}}).to_string();
    assert_eq!(post(&server, &own, now, Some(SIGNING), &[]).await.0, 200);
    let elsewhere = mention("Ev0ELSEWHERE", "T0KORTEX").replace("C0INCIDENT", "C0RANDOM");
    assert_eq!(
        post(&server, &elsewhere, now, Some(SIGNING), &[]).await.0,
        200
    );
    assert_eq!(counted(&server, "ignored").await, 2);
    assert_eq!(counted(&server, "taken").await, 2);

    let log = server.log();
    assert!(
        !log.contains(SIGNING) && !log.contains("xoxb-slack-test-1"),
        "a secret reached the log"
    );
    assert!(server.terminate().success());
}

/// The Web API client against a scripted Slack speaking the documented shapes: the token in
/// the Authorization header only, JSON for chat and views, a form for `users.info`,
/// `ok: false` as a typed error, a 429 waited out as its `Retry-After` says.
#[tokio::test]
async fn the_web_api_client_speaks_slacks_shapes_and_waits_out_rate_limits() {
    use crate::support::slack::{Fault, Slack};
    use kortex::slack::api::{ApiError, Client};
    let slack = Slack::start().await;
    let client = Client::new(
        http_client(),
        &slack.api,
        kortex::catalog::SecretValue::new("xoxb-client-test"),
    );
    let ts = client
        .post_message(
            "C0INCIDENT",
            Some("1700000000.000001"),
            "Looking into it…",
            None,
        )
        .await
        .unwrap();
    assert!(!ts.is_empty());
    let posted = &slack.calls("chat.postMessage")[0];
    assert_eq!(posted.token, "xoxb-client-test");
    assert!(posted.query.is_empty(), "the token never goes in a URL");
    assert_eq!(posted.body["thread_ts"], "1700000000.000001");
    assert_eq!(posted.body["unfurl_links"], false);
    client
        .update("C0INCIDENT", &ts, "The answer.", Some(&json!([])))
        .await
        .unwrap();
    assert_eq!(slack.calls("chat.update")[0].body["ts"], ts.as_str());

    slack.person("U0ALICE", "alice@example.com");
    let alice = client.user("U0ALICE").await.unwrap();
    assert_eq!(alice.email.as_deref(), Some("alice@example.com"));
    assert!(!alice.not_a_person);
    assert_eq!(
        client.user("U0NOBODY").await,
        Err(ApiError::Refused {
            method: "users.info",
            error: "user_not_found".into()
        })
    );

    slack.fail(
        "chat.postEphemeral",
        vec![Fault::Error("user_not_in_channel")],
    );
    let err = client
        .post_ephemeral("C0INCIDENT", "U0BOB", None, "You are not mapped")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Slack refused chat.postEphemeral: user_not_in_channel"
    );

    // One 429 with Retry-After: 1 is waited out; the call then succeeds.
    slack.fail("chat.update", vec![Fault::RateLimited(1)]);
    let started = std::time::Instant::now();
    client
        .update("C0INCIDENT", &ts, "Later.", None)
        .await
        .unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(slack.calls("chat.update").len(), 3);
    // A Retry-After too long to wait is returned, not slept through.
    slack.fail("chat.update", vec![Fault::RateLimited(120)]);
    assert_eq!(
        client.update("C0INCIDENT", &ts, "Much later.", None).await,
        Err(ApiError::RateLimited {
            method: "chat.update",
            retry_after: 120
        })
    );
}

/// A Slack user is the person the policy's table names, else their profile's e-mail; a bot
/// or a user Slack does not know is nobody, with what to fix.
#[tokio::test]
async fn a_slack_user_is_known_by_the_table_or_their_profiles_email() {
    use crate::support::slack::Slack;
    use kortex::slack::api::Client;
    let slack = Slack::start().await;
    let client = Client::new(
        http_client(),
        &slack.api,
        kortex::catalog::SecretValue::new("xoxb-identity-test"),
    );
    let table: Vec<kortex::crd::SlackUser> = serde_json::from_value(json!([
        {"slackUser": "U0MAPPED", "user": "carol@example.com"}
    ]))
    .unwrap();
    assert_eq!(
        kortex::slack::identity::person(&table, &client, "U0MAPPED", "oidc:").await,
        Ok("carol@example.com".to_owned())
    );
    assert!(
        slack.calls("users.info").is_empty(),
        "the table wins without asking Slack"
    );
    slack.person("U0ALICE", "Alice@Example.com");
    assert_eq!(
        kortex::slack::identity::person(&table, &client, "U0ALICE", "").await,
        Ok("alice@example.com".to_owned())
    );
    // Named as single sign-on names her: its username prefix before the e-mail (the
    // table's names are taken as they are).
    assert_eq!(
        kortex::slack::identity::person(&table, &client, "U0ALICE", "oidc:").await,
        Ok("oidc:alice@example.com".to_owned())
    );
    let why = kortex::slack::identity::person(&table, &client, "U0STRANGER", "")
        .await
        .unwrap_err();
    assert!(
        why.contains("user_not_found")
            && why.contains("spec.slack.users")
            && why.contains("U0STRANGER"),
        "{why}"
    );
}

/// A thread conversation end to end through the binary: a mention starts alice's session
/// under the app's policy, the model calls a tool, the answer lands in the thread (a reply
/// updated with the answer and the tools used); a later message in the same thread continues
/// the same session; an unknown Slack user is told why nothing happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_investigated_in_its_thread_and_the_thread_continues_the_session() {
    use crate::support::provider::{mock, push, push_answer, tool_calls};
    use crate::support::slack::Slack;
    let slack = Slack::start().await;
    slack.person("U0ALICE", "alice@example.com");
    let (llm, script) = mock().await;
    let yaml = app_yaml(&llm, "xoxb-thread-test", "sessions: ['incident-*'], ", "");
    let (_dir, server) = serve(
        &slack,
        &yaml,
        &["--public-url", "https://kortex.example.com"],
    );
    push(
        &script,
        tool_calls(&[("h1", "get_incident_history", json!({"query": "checkout"}))]),
    );
    push_answer(&script, &["The checkout pods ", "run out of memory."]);
    push_answer(&script, &["Yes: since the 1.4.2 deploy."]);
    let now = jiff::Timestamp::now().as_second();
    let mention = json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": "Ev1THREAD",
        "event": {"type": "app_mention", "user": "U0ALICE", "text": "<@U0BOT> why is checkout failing?",
            "ts": "1700000000.000100", "channel": "C0INCIDENT"}}).to_string();
    assert_eq!(
        post(&server, &mention, now, Some(SIGNING), &[]).await.0,
        200
    );
    let update = slack
        .wait_for_text("chat.update", "run out of memory.")
        .await;
    let first = &slack.calls("chat.postMessage")[0];
    assert_eq!(
        first.body["thread_ts"], "1700000000.000100",
        "the reply is in the mention's thread"
    );
    assert_eq!(first.body["channel"], "C0INCIDENT");
    assert_eq!(first.token, "xoxb-thread-test");
    let blocks = update.body["blocks"].to_string();
    assert!(blocks.contains("Tools: get_incident_history"), "{blocks}");
    assert!(
        blocks.contains("https://kortex.example.com/#/chat/"),
        "{blocks}"
    );

    // A follow-up in the thread (no mention): the same session, its history sent along.
    let follow_up = json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": "Ev2THREAD",
        "event": {"type": "message", "user": "U0ALICE", "text": "since when?", "channel_type": "channel",
            "ts": "1700000050.000200", "thread_ts": "1700000000.000100", "channel": "C0INCIDENT"}}).to_string();
    assert_eq!(
        post(&server, &follow_up, now, Some(SIGNING), &[]).await.0,
        200
    );
    slack
        .wait_for_text("chat.update", "since the 1.4.2 deploy")
        .await;
    let last = script
        .requests()
        .last()
        .cloned()
        .expect("the follow-up's call");
    let history = last.body["messages"].to_string();
    assert!(
        history.contains("why is checkout failing?") && history.contains("since when?"),
        "the follow-up continues the thread's session: {history}"
    );
    assert_eq!(slack.calls("chat.postMessage").len(), 2);

    // A Slack user Kortex cannot name is told why, and nothing runs.
    let stranger = mention
        .replace("Ev1THREAD", "Ev3THREAD")
        .replace("U0ALICE", "U0STRANGER")
        .replace("1700000000.000100", "1700000099.000100");
    let asked = crate::support::provider::chat_calls(&script);
    assert_eq!(
        post(&server, &stranger, now, Some(SIGNING), &[]).await.0,
        200
    );
    slack
        .wait_for("chat.postEphemeral", |c| c.body["user"] == "U0STRANGER")
        .await;
    assert_eq!(
        crate::support::provider::chat_calls(&script),
        asked,
        "nothing ran for the stranger"
    );
    assert!(!server.log().contains("xoxb-thread-test"));
    assert!(server.terminate().success());
}

/// POSTs a Slack interaction (`payload=` form) signed with the app's secret.
async fn interact(server: &Server, payload: &Value) -> (u16, String) {
    let body = format!(
        "payload={}",
        url::form_urlencoded::byte_serialize(payload.to_string().as_bytes()).collect::<String>()
    );
    let at = jiff::Timestamp::now().as_second();
    let resp = http_client()
        .post(server.url("/slack/v1/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", at.to_string())
        .header(
            "x-slack-signature",
            kortex::slack::verify::sign(SIGNING.as_bytes(), at, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

fn click(user: &str, action: &str, proposal: &str, card_ts: &str) -> Value {
    json!({"type": "block_actions", "team": {"id": "T0KORTEX"}, "user": {"id": user, "team_id": "T0KORTEX"},
        "container": {"type": "message", "message_ts": card_ts, "channel_id": "C0INCIDENT"},
        "channel": {"id": "C0INCIDENT"}, "trigger_id": "1.2.3",
        "message": {"ts": card_ts, "thread_ts": "1700000000.000100"},
        "response_url": "https://hooks.slack.com/actions/x",
        "actions": [{"action_id": action, "block_id": "kortex_decide", "value": proposal, "type": "button"}]})
}

/// A proposal made in a thread is posted as a card; a click decides as the person who
/// clicked: the proposer is refused (four-eyes), a stranger decides nothing, Reject opens
/// its reason dialog, and Approve by another person approves — the card says by whom.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_decides_as_the_person_who_clicked_under_the_policys_rules() {
    use crate::support::provider::{mock, push, push_answer, tool_calls};
    use crate::support::slack::Slack;
    let slack = Slack::start().await;
    slack.person("U0ALICE", "alice@example.com");
    slack.person("U0BOB", "bob@example.com");
    let (llm, script) = mock().await;
    let yaml = app_yaml(
        &llm,
        "xoxb-click-test",
        "sessions: ['*'], proposals: {allowedActions: [restart], allowedNamespaces: [shop], \
         requireDistinctApprover: true}, ",
        "",
    );
    let (_dir, server) = serve(&slack, &yaml, &[]);
    push(
        &script,
        tool_calls(&[(
            "p1",
            "propose_action",
            json!({"action": "restart", "rationale": "stuck",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"}}),
        )]),
    );
    push_answer(&script, &["I proposed a restart of checkout."]);
    let now = jiff::Timestamp::now().as_second();
    let mention = json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": "Ev1CARD",
        "event": {"type": "app_mention", "user": "U0ALICE", "text": "<@U0BOT> checkout is stuck",
            "ts": "1700000000.000100", "channel": "C0INCIDENT"}})
    .to_string();
    assert_eq!(
        post(&server, &mention, now, Some(SIGNING), &[]).await.0,
        200
    );
    let card = slack
        .wait_for("chat.postMessage", |c| {
            c.body["blocks"].to_string().contains("kortex_approve")
        })
        .await;
    assert_eq!(card.body["thread_ts"], "1700000000.000100");
    let blocks = card.body["blocks"].to_string();
    assert!(blocks.contains("Deployment shop/checkout"), "{blocks}");
    let proposal = card.body["blocks"]
        .as_array()
        .and_then(|b| b.last())
        .map(|a| {
            a["elements"][0]["value"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default();
    let card_ts = "1700000100.000100";
    let told = |user: &'static str, needle: &'static str| {
        slack.wait_for("chat.postEphemeral", move |c| {
            c.body["user"] == user && c.body["text"].as_str().is_some_and(|t| t.contains(needle))
        })
    };

    let press = |user: &'static str, action: &'static str| {
        let payload = click(user, action, &proposal, card_ts);
        let server = &server;
        async move { assert_eq!(interact(server, &payload).await.0, 200, "{user} {action}") }
    };

    // The proposer clicks Approve: four-eyes refuses, nothing is decided.
    press("U0ALICE", "kortex_approve").await;
    told("U0ALICE", "requires someone else").await;
    // A Slack user Kortex cannot name decides nothing.
    press("U0STRANGER", "kortex_approve").await;
    told("U0STRANGER", "Nothing was decided").await;
    // Reject opens its reason dialog (with the proposal in it).
    press("U0BOB", "kortex_reject").await;
    let dialog = slack.calls("views.open");
    assert_eq!(dialog.len(), 1);
    assert_eq!(dialog[0].body["trigger_id"], "1.2.3");
    let meta = dialog[0].body["view"]["private_metadata"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (id, card) = kortex::slack::blocks::dialog_metadata(&meta);
    assert_eq!(id, proposal);
    assert_eq!(
        card.ts.as_deref(),
        Some(card_ts),
        "the dialog knows its card"
    );
    // Submitted without a reason: Slack is told to show the field's error; nothing decided.
    let submit = json!({"type": "view_submission", "team": {"id": "T0KORTEX"}, "user": {"id": "U0BOB"},
        "view": {"callback_id": kortex::slack::blocks::REJECT_DIALOG, "private_metadata": meta,
            "state": {"values": {"reason": {"text": {"type": "plain_text_input", "value": " "}}}}}});
    let (status, body) = interact(&server, &submit).await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(body["response_action"], "errors", "{body}");
    assert!(body["errors"]["reason"].is_string(), "{body}");
    // A forged click is refused before anything is read.
    let forged = http_client()
        .post(server.url("/slack/v1/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", now.to_string())
        .header("x-slack-signature", "v0=00")
        .body("payload=%7B%7D")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    // bob approves: decided as bob; the card says so.
    press("U0BOB", "kortex_approve").await;
    let updated = slack
        .wait_for("chat.update", |c| c.body["ts"] == card_ts)
        .await;
    let text = updated.body["text"].as_str().unwrap_or_default();
    assert!(text.contains("approved by bob@example.com"), "{text}");
    assert!(server.terminate().success());
}

/// `/kortex <question>`: the question is posted in the channel and investigated in its
/// thread; `/kortex` alone explains itself; a forged command is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slash_command_asks_in_the_channel_and_answers_in_the_thread() {
    use crate::support::provider::{mock, push_answer};
    use crate::support::slack::Slack;
    let slack = Slack::start().await;
    slack.person("U0ALICE", "alice@example.com");
    let (llm, script) = mock().await;
    let yaml = app_yaml(&llm, "xoxb-command-test", "sessions: ['*'], ", "");
    let (_dir, server) = serve(&slack, &yaml, &[]);
    push_answer(&script, &["Checkout is fine now."]);
    let command =
        |text: &'static str, secret: &'static str| command(&server, "U0ALICE", text, secret);
    let help = command("", SIGNING).await;
    assert_eq!(help.status().as_u16(), 200);
    let help: Value = help.json().await.unwrap();
    assert_eq!(help["response_type"], "ephemeral");
    assert!(
        help["text"]
            .as_str()
            .unwrap_or_default()
            .contains("/kortex why")
    );
    assert_eq!(
        command("is checkout ok?", "forged").await.status().as_u16(),
        401
    );
    assert_eq!(
        command("is checkout ok?", SIGNING).await.status().as_u16(),
        200
    );
    let update = slack
        .wait_for_text("chat.update", "Checkout is fine now.")
        .await;
    let posted = slack.calls("chat.postMessage");
    let asked = &posted[0];
    assert!(
        asked.body["text"]
            .as_str()
            .unwrap_or_default()
            .contains("<@U0ALICE> asked Kortex: is checkout ok?")
    );
    assert!(
        asked.body.get("thread_ts").is_none(),
        "the question is in the channel"
    );
    let reply = &posted[1];
    assert!(
        reply.body["thread_ts"].is_string(),
        "the answer is in the question's thread"
    );
    assert_eq!(
        update.body["ts"],
        reply.body["thread_ts"]
            .as_str()
            .map(|_| update.body["ts"].clone())
            .unwrap_or_default()
    );
    assert!(server.terminate().success());
}

/// Hand-over from Slack: alice's thread is hers; carol may not continue it; alice hands it
/// over in the thread (`@Kortex handover @bob note`) and bob is told there and continues
/// the same session; bob hands it on with `/kortex handover @carol` from the channel, and
/// carol continues it. The model saw one conversation throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_is_handed_over_in_slack_and_the_next_person_continues_it() {
    use crate::support::provider::{mock, push_answer};
    use crate::support::slack::Slack;
    let slack = Slack::start().await;
    for (user, email) in [
        ("U0ALICE", "alice@example.com"),
        ("U0BOB", "bob@example.com"),
        ("U0CAROL", "carol@example.com"),
    ] {
        slack.person(user, email);
    }
    let (llm, script) = mock().await;
    let yaml = app_yaml(&llm, "xoxb-handover-test", "sessions: ['*'], ", "");
    let (_dir, server) = serve(&slack, &yaml, &[]);
    push_answer(&script, &["The queue is backed up."]);
    push_answer(&script, &["Scale the consumers."]);
    push_answer(&script, &["It drained at 03:10."]);
    let thread = "1700000000.000100";
    let now = jiff::Timestamp::now().as_second();
    let send = |id: &str, user: &str, text: &str, ts: &str, mention: bool| {
        let body = message(id, user, text, ts, Some(thread), mention);
        let server = &server;
        async move { post(server, &body, now, Some(SIGNING), &[]).await.0 }
    };
    let first = message(
        "Ev1HAND",
        "U0ALICE",
        "<@U0BOT> why are orders slow?",
        thread,
        None,
        true,
    );
    assert_eq!(post(&server, &first, now, Some(SIGNING), &[]).await.0, 200);
    slack.wait_for_text("chat.update", "backed up").await;

    // carol is not in it: told why, and nothing runs.
    let asked = crate::support::provider::chat_calls(&script);
    assert_eq!(
        send(
            "Ev2HAND",
            "U0CAROL",
            "<@U0BOT> any news?",
            "1700000001.000100",
            true
        )
        .await,
        200
    );
    let refused = slack
        .wait_for("chat.postEphemeral", |c| c.body["user"] == "U0CAROL")
        .await;
    let why = refused.body["text"].as_str().unwrap_or_default();
    assert!(
        why.contains("alice@example.com's") && why.contains("handover"),
        "{why}"
    );
    assert_eq!(crate::support::provider::chat_calls(&script), asked);

    // alice hands over in the thread; bob is told there, by mention, with the note.
    assert_eq!(
        send(
            "Ev3HAND",
            "U0ALICE",
            "<@U0BOT> handover <@U0BOB> the consumers lag since 02:00",
            "1700000002.000100",
            true
        )
        .await,
        200
    );
    let told = slack.wait_for_text("chat.postMessage", "<@U0BOB>").await;
    assert_eq!(told.body["thread_ts"], thread);
    let text = told.body["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("alice@example.com handed this investigation over to you"),
        "{text}"
    );
    assert!(text.contains("the consumers lag since 02:00"), "{text}");
    // bob continues the same session (a message in the thread, no mention needed).
    assert_eq!(
        send(
            "Ev4HAND",
            "U0BOB",
            "what should we do?",
            "1700000003.000100",
            false
        )
        .await,
        200
    );
    slack
        .wait_for_text("chat.update", "Scale the consumers.")
        .await;
    let history = script
        .requests()
        .last()
        .map(|r| r.body["messages"].to_string())
        .unwrap_or_default();
    assert!(
        history.contains("why are orders slow?"),
        "the same session: {history}"
    );

    // bob hands it on from the channel; a forged command hands nothing over.
    assert_eq!(
        command(
            &server,
            "U0BOB",
            "handover <@U0CAROL|carol> over to you",
            "forged"
        )
        .await
        .status()
        .as_u16(),
        401
    );
    let ack = command(
        &server,
        "U0BOB",
        "handover <@U0CAROL|carol> over to you",
        SIGNING,
    )
    .await;
    assert_eq!(ack.status().as_u16(), 200);
    let told = slack.wait_for_text("chat.postMessage", "<@U0CAROL>").await;
    assert_eq!(
        told.body["thread_ts"], thread,
        "said in the investigation's thread"
    );
    assert!(
        told.body["text"]
            .as_str()
            .unwrap_or_default()
            .contains("bob@example.com handed")
    );
    assert_eq!(
        send(
            "Ev5HAND",
            "U0CAROL",
            "<@U0BOT> when did it drain?",
            "1700000004.000100",
            true
        )
        .await,
        200
    );
    slack.wait_for_text("chat.update", "drained at 03:10").await;
    // A hand-over to someone Kortex cannot name hands nothing over.
    let ack = command(&server, "U0CAROL", "handover <@U0NOBODY> yours", SIGNING).await;
    assert_eq!(ack.status().as_u16(), 200);
    let refused = slack
        .wait_for("chat.postEphemeral", |c| {
            c.body["user"] == "U0CAROL"
                && c.body["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("Nothing was handed over"))
        })
        .await;
    assert!(
        refused.body["text"]
            .as_str()
            .unwrap_or_default()
            .contains("U0NOBODY")
    );
    assert!(server.terminate().success());
}

/// The page in Slack: an alert starts an investigation, which the app posts in its
/// channel (`spec.slack.post`); the verdict and the proposal's card land in that message's
/// thread; bob asks there and continues the investigation itself; his click approves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_is_investigated_in_its_own_thread_where_people_ask_and_approve() {
    use crate::support::manifests::chat_key_secret;
    use crate::support::provider::{mock, push, push_answer, tool_calls};
    use crate::support::slack::Slack;
    let slack = Slack::start().await;
    slack.person("U0BOB", "bob@example.com");
    let (llm, script) = mock().await;
    let keys = format!(
        "{}{}",
        chat_key_secret("alertmanager", "am-key-0123456789", "alerting"),
        chat_key_secret("oncall-bot", "bot-key-0123456789", "")
    );
    let yaml = format!(
        "{keys}{}",
        app_yaml(
            &llm,
            "xoxb-alert-test",
            "sessions: ['*'], proposals: {allowedActions: [restart], allowedNamespaces: [shop]}, \
             triggers: [{name: crashloops, alerts: {matchers: {severity: critical}}, \
             prompt: 'Alert {{ labels.alertname }} fires in {{ labels.namespace }}.', \
             runAs: {user: oncall-bot}, callers: {groups: [alerting]}}], ",
            ", post: {channel: C0ALERTS, events: [investigation.started, investigation.finished]}",
        )
    );
    let (_dir, server) = serve(
        &slack,
        &yaml,
        &["--public-url", "https://kortex.example.com"],
    );
    push(
        &script,
        tool_calls(&[(
            "p1",
            "propose_action",
            json!({"action": "restart", "rationale": "the pods are out of memory",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"}}),
        )]),
    );
    push_answer(
        &script,
        &["Root cause: checkout runs out of memory.\n\nI proposed a restart."],
    );
    push_answer(&script, &["Yes: the limit is 256Mi."]);
    let alert = json!({
        "version": "4", "groupKey": "{}:{alertname=\"KubePodCrashLooping\"}", "truncatedAlerts": 0,
        "status": "firing", "receiver": "kortex", "groupLabels": {"alertname": "KubePodCrashLooping"},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093",
        "alerts": [{"status": "firing",
            "labels": {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "shop", "pod": "checkout-1"},
            "annotations": {"summary": "checkout-1 restarts"},
            "startsAt": "2026-11-27T02:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph", "fingerprint": "fp-checkout-1"}]
    });
    let fired = http_client()
        .post(server.url("/api/v1/alerts/alertmanager"))
        .bearer_auth("am-key-0123456789")
        .json(&alert)
        .send()
        .await
        .unwrap();
    assert_eq!(fired.status().as_u16(), 200);

    // The alert's message, in the app's channel.
    let page = slack
        .wait_for_text("chat.postMessage", "KubePodCrashLooping")
        .await;
    assert_eq!(page.body["channel"], "C0ALERTS");
    assert!(page.body.get("thread_ts").is_none(), "a message of its own");
    assert_eq!(page.token, "xoxb-alert-test");
    let blocks = page.body["blocks"].to_string();
    assert!(
        blocks.contains("checkout-1 restarts") && blocks.contains("shop"),
        "{blocks}"
    );
    let thread = page.ts.clone().unwrap_or_default();
    // The verdict, then the proposal's card, in its thread.
    let verdict = slack
        .wait_for("chat.postMessage", |c| {
            c.body["blocks"]
                .to_string()
                .contains("Root cause: checkout runs out of memory.")
        })
        .await;
    assert_eq!(verdict.body["thread_ts"], thread.as_str());
    assert_eq!(verdict.body["channel"], "C0ALERTS");
    let card = slack
        .wait_for("chat.postMessage", |c| {
            c.body["blocks"].to_string().contains("kortex_approve")
        })
        .await;
    assert_eq!(card.body["thread_ts"], thread.as_str());

    // bob asks in the alert's thread: the investigation itself continues, as his run.
    let now = jiff::Timestamp::now().as_second();
    let ask = json!({"type": "event_callback", "team_id": "T0KORTEX", "event_id": "Ev1ALERT",
        "event": {"type": "app_mention", "user": "U0BOB", "text": "<@U0BOT> is it the memory limit?",
            "ts": "1800000000.000100", "thread_ts": thread, "channel": "C0ALERTS"}})
    .to_string();
    assert_eq!(post(&server, &ask, now, Some(SIGNING), &[]).await.0, 200);
    slack
        .wait_for_text("chat.update", "the limit is 256Mi")
        .await;
    let history = script
        .requests()
        .last()
        .map(|r| r.body["messages"].to_string())
        .unwrap_or_default();
    assert!(
        history.contains("checkout-1 restarts")
            && history.contains("Root cause: checkout runs out of memory."),
        "the investigation's own conversation: {history}"
    );
    // bob approves from the card: decided as him.
    let proposal = card.body["blocks"]
        .as_array()
        .and_then(|b| b.last())
        .and_then(|a| a["elements"][0]["value"].as_str())
        .unwrap_or_default()
        .to_owned();
    let mut clicked = click(
        "U0BOB",
        "kortex_approve",
        &proposal,
        card.ts.as_deref().unwrap_or_default(),
    );
    clicked["channel"]["id"] = json!("C0ALERTS");
    clicked["container"]["channel_id"] = json!("C0ALERTS");
    assert_eq!(interact(&server, &clicked).await.0, 200);
    let updated = slack
        .wait_for("chat.update", |c| {
            c.body["ts"] == card.ts.as_deref().unwrap_or_default()
        })
        .await;
    let text = updated.body["text"].as_str().unwrap_or_default();
    assert!(text.contains("approved by bob@example.com"), "{text}");
    assert!(server.terminate().success());
}
