//! Alert-triggered and scheduled investigations (docs/triggers.md) on the real binary: a
//! real Alertmanager (Debian's `prometheus-alertmanager`) pages Kortex; one session per
//! group, one run per group change, a resolved note without a model call, limits in a
//! storm, nothing lost across kill -9, schedules fired once per slot by two replicas.

use crate::support::browser::{passed, run_browser};
use crate::support::chat::{Sse, get_json, read_sse_within};
use crate::support::db::postgres;
use crate::support::manifests::keyed_manifests;
use crate::support::net::{eventually, http_client};
use crate::support::provider::{Reply, chat_calls, mock, openai, openai_chunk, streamed};
use crate::support::receiver::receiver;
use crate::support::server::Server;
use serde_json::{Value, json};
use std::time::Duration;

const KEY: &str = "am-key-0123456789";
const BOT_KEY: &str = "bot-key-0123456789";
const ALICE_KEY: &str = "alice-key-0123456789";

/// The model: on a question, proposes a restart; once the proposal's result is in, answers.
fn responder(body: &Value) -> Option<Reply> {
    let last = body["messages"].as_array()?.last()?;
    let d = openai();
    if last["role"] == "tool" {
        return Some(streamed(
            &d,
            (d.text_stream)(&[
                "Root cause: the checkout pods crash on a bad config key.\n\nDetails follow.",
            ]),
        ));
    }
    let propose = json!({
        "action": "restart",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"},
        "rationale": "CrashLoopBackOff since the last config change.",
        "blastRadius": "checkout pods restart one at a time",
        "reversible": true
    })
    .to_string();
    Some(streamed(
        &d,
        vec![
            openai_chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                    "function": {"name": "propose_action", "arguments": propose}}]}),
                Value::Null,
            ),
            openai_chunk(json!({}), json!("tool_calls")),
            "data: [DONE]\n\n".into(),
        ],
    ))
}

/// Manifests: the provider at `base`, a chat key for Alertmanager (`alertmanager`), the
/// run-as user (`oncall-bot`) and `alice`; the policy `incidents` with `notify` to `hook`
/// and the triggers in `triggers` (YAML lines under `triggers:`).
fn manifests(base: &str, hook: &str, triggers: &str) -> (tempfile::TempDir, String) {
    keyed_manifests(
        &[
            ("alertmanager", KEY, "alerting"),
            ("oncall-bot", BOT_KEY, ""),
            ("alice", ALICE_KEY, "sre"),
        ],
        &format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: gpt}}\n\
             spec: {{type: openai-compatible, baseUrl: \"{base}/v1\", defaultModel: m1, locality: local}}\n\
             ---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: incidents}}\n\
             spec:\n  sessions: [\"incident-*\"]\n  provider: gpt\n\
             \x20 proposals: {{allowedActions: [restart], allowedNamespaces: [shop]}}\n\
             \x20 notify:\n    - name: oncall\n      events: [proposal.pending]\n      webhook: {{url: \"{hook}\"}}\n\
             \x20 triggers:\n{triggers}"
        ),
    )
}

const CRASHLOOP_TRIGGER: &str = "    - name: crashloops\n      alerts: {matchers: {severity: \"~critical|page\", team: checkout}}\n      prompt: \"Alert {{ labels.alertname }} fires in {{ labels.namespace }}: find the root cause.\"\n      runAs: {user: oncall-bot}\n      callers: {groups: [alerting]}\n      limits: {maxRunsPerHour: 10, maxConcurrent: 3}\n      notify: [oncall]\n";

/// A client that sends `key` as its bearer token.
fn keyed(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {key}").parse().unwrap();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    let _ = http_client();
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// The triggered sessions `key`'s user sees.
async fn sessions(base: &str, key: &str) -> Vec<Value> {
    let v = get_json(
        &keyed(key),
        format!("{base}/chat/v1/sessions?triggered=true"),
    )
    .await;
    v["items"].as_array().cloned().unwrap_or_default()
}

async fn session(base: &str, key: &str, id: &str) -> Value {
    get_json(&keyed(key), format!("{base}/chat/v1/sessions/{id}")).await
}

/// The value of a `kortex_trigger_events_total` series (0 when absent).
async fn counted(server: &Server, result: &str) -> u64 {
    let (_, text) = server.get("/metrics").await;
    text.lines()
        .filter(|l| {
            l.starts_with("kortex_trigger_events_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A real Alertmanager on 127.0.0.1 sending its webhook to `kortex` with `key`.
struct Alertmanager {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn alertmanager_binary() -> Option<String> {
    let path = std::env::var("KORTEX_TEST_ALERTMANAGER")
        .unwrap_or_else(|_| "/usr/bin/prometheus-alertmanager".into());
    if std::path::Path::new(&path).exists() {
        return Some(path);
    }
    assert!(
        std::env::var("KORTEX_REQUIRE_ALERTMANAGER").is_err(),
        "KORTEX_REQUIRE_ALERTMANAGER is set but {path} does not exist (apt-get install prometheus-alertmanager)"
    );
    eprintln!("skipping: no Alertmanager at {path}");
    None
}

async fn start_alertmanager(binary: &str, kortex: &str, key: &str) -> Alertmanager {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &config,
        format!(
            "route:\n  receiver: kortex\n  group_by: [alertname]\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 3s\n\
             receivers:\n  - name: kortex\n    webhook_configs:\n      - url: {kortex}/api/v1/alerts/alertmanager\n        send_resolved: true\n\
             \x20       http_config:\n          authorization: {{credentials: {key}}}\n"
        ),
    )
    .unwrap();
    let port = crate::support::net::free_port();
    let child = std::process::Command::new(binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .arg("--log.level=warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
    let url = format!("http://127.0.0.1:{port}");
    let am = Alertmanager {
        child,
        url: url.clone(),
        _dir: dir,
    };
    eventually("Alertmanager ready", || async {
        match http_client().get(format!("{url}/-/ready")).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(r.status().to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    am
}

/// Posts alerts to Alertmanager's own API (`ends`: resolve them now).
async fn fire(am: &Alertmanager, pods: &[&str], ends: bool) {
    let now = jiff::Timestamp::now();
    let alerts: Vec<Value> = pods
        .iter()
        .map(|pod| {
            let mut a = json!({
                "labels": {"alertname": "KubePodCrashLooping", "severity": "critical", "team": "checkout", "namespace": "shop", "pod": pod},
                "annotations": {"summary": format!("{pod} restarts")},
                "startsAt": (now - jiff::SignedDuration::from_mins(5)).to_string(),
                "generatorURL": "http://prometheus.example/graph",
            });
            if ends {
                a["endsAt"] = json!((now - jiff::SignedDuration::from_secs(1)).to_string());
            }
            a
        })
        .collect();
    let r = http_client()
        .post(format!("{}/api/v2/alerts", am.url))
        .json(&alerts)
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "Alertmanager refused the alerts: {}",
        r.status()
    );
}

/// The one triggered session, once its runs so far are `runs` and the last has ended.
async fn settled(base: &str, runs: usize) -> Value {
    eventually(
        &format!("the triggered session with {runs} finished run(s)"),
        || async {
            let list = sessions(base, ALICE_KEY).await;
            let [one] = list.as_slice() else {
                return Err(format!("{} sessions", list.len()));
            };
            let s = session(base, ALICE_KEY, one["id"].as_str().unwrap_or_default()).await;
            let users = s["messages"]
                .as_array()
                .map(|m| m.iter().filter(|m| m["role"] == "user").count())
                .unwrap_or(0);
            if users == runs && s["status"] == "idle" {
                Ok(s)
            } else {
                Err(format!("{users} questions, status {}", s["status"]))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_alertmanager_pages_kortex_and_the_verdict_reaches_the_channel() {
    let Some(binary) = alertmanager_binary() else {
        return;
    };
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let hook = receiver(0).await;
    let (dir, db) = manifests(&base, &hook.url, CRASHLOOP_TRIGGER);
    let (server, kortex) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    let am = start_alertmanager(&binary, &kortex, KEY).await;

    // A group fires: one session, the model's run, one investigation.finished.
    fire(&am, &["web-1"], false).await;
    let s = settled(&kortex, 1).await;
    assert_eq!(s["user"], "oncall-bot", "the run acts as runAs.user");
    assert_eq!(
        s["trigger"],
        json!({"policy": "default/incidents", "name": "crashloops"})
    );
    let question = s["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(
        question
            .starts_with("Alert \"KubePodCrashLooping\" fires in \"shop\": find the root cause."),
        "{question}"
    );
    assert!(question.contains(kortex::trigger::UNTRUSTED), "{question}");
    assert!(question.contains("web-1 restarts"), "{question}");
    let finished = eventually("investigation.finished delivered", || async {
        hook.events("investigation.finished")
            .into_iter()
            .next()
            .ok_or_else(|| {
                format!(
                    "{:?}",
                    hook.got()
                        .iter()
                        .map(|(_, b)| b["type"].clone())
                        .collect::<Vec<_>>()
                )
            })
    })
    .await;
    let data = &finished["data"];
    assert_eq!(data["sessionId"], s["id"]);
    assert_eq!(data["status"], "completed");
    assert_eq!(
        data["answer"],
        "Root cause: the checkout pods crash on a bad config key."
    );
    assert_eq!(data["proposals"][0]["action"], "restart");
    assert_eq!(
        data["proposals"][0]["phase"], "Pending",
        "never approved by a trigger"
    );
    assert!(data["inputTokens"].as_i64().unwrap_or(0) > 0, "{data}");
    let calls = chat_calls(&script);
    assert_eq!(calls, 2, "the question, then the answer after the proposal");

    // Alertmanager re-notifies the unchanged group (repeat_interval 3 s): no new run.
    eventually("a repeated notification", || async {
        match counted(&server, "unchanged").await {
            0 => Err("none yet".to_owned()),
            _ => Ok(()),
        }
    })
    .await;
    assert_eq!(chat_calls(&script), calls);

    // A new alert joins the group: one more run in the same session.
    fire(&am, &["web-1", "web-2"], false).await;
    let s2 = settled(&kortex, 2).await;
    assert_eq!(s2["id"], s["id"]);
    let joined = s2["messages"]
        .as_array()
        .and_then(|m| m.iter().filter(|m| m["role"] == "user").nth(1).cloned())
        .unwrap_or_default();
    let joined = joined["content"].as_str().unwrap_or_default();
    assert!(
        joined.starts_with("1 new alert(s) joined this group"),
        "{joined}"
    );
    assert!(
        joined.contains("web-2") && !joined.contains("\"web-1\""),
        "{joined}"
    );
    let calls = chat_calls(&script);
    assert_eq!(calls, 4);

    // Everything resolves: a note, and no model call.
    fire(&am, &["web-1", "web-2"], true).await;
    let resolved = |evs: &[Sse]| {
        evs.iter().any(|e| {
            e.event == "notice"
                && e.data["message"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("Resolved: every alert of this group has resolved")
        })
    };
    let stream = http_client()
        .get(format!(
            "{kortex}/chat/v1/sessions/{}/events",
            s["id"].as_str().unwrap_or_default()
        ))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    let events = read_sse_within(stream, resolved, Duration::from_secs(30)).await;
    assert!(resolved(&events), "no resolved note");
    assert_eq!(
        chat_calls(&script),
        calls,
        "a resolution costs no model call"
    );
    assert_eq!(sessions(&kortex, ALICE_KEY).await.len(), 1);
    drop(am);
    drop(server);
}

/// A webhook payload of one alert in group `group`.
fn payload(group: &str, pod: &str) -> Value {
    json!({
        "version": "4", "groupKey": group, "truncatedAlerts": 0, "status": "firing",
        "receiver": "kortex", "groupLabels": {"alertname": "KubePodCrashLooping"},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "KubePodCrashLooping", "severity": "critical", "team": "checkout", "namespace": "shop", "pod": pod},
            "annotations": {"summary": format!("{pod} restarts")},
            "startsAt": "2026-11-27T02:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph", "fingerprint": format!("fp-{pod}")
        }]
    })
}

async fn post(base: &str, key: Option<&str>, body: Vec<u8>) -> (u16, Value) {
    let mut r = http_client()
        .post(format!("{base}/api/v1/alerts/alertmanager"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        r = r.bearer_auth(key);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_runs_within_the_limits_and_nothing_is_lost() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_: &Value| {
        let d = openai();
        Some(streamed(
            &d,
            (d.text_stream)(&["Checked: the pod restarts on a bad config key."]),
        ))
    }));
    let hook = receiver(0).await;
    let (dir, db) = manifests(&base, &hook.url, CRASHLOOP_TRIGGER);
    let (server, kortex) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    // 30 groups at once.
    let posts = (0..30).map(|i| {
        let kortex = kortex.clone();
        async move {
            post(
                &kortex,
                Some(KEY),
                payload(&format!("group-{i}"), &format!("pod-{i}"))
                    .to_string()
                    .into_bytes(),
            )
            .await
        }
    });
    for (status, receipt) in futures_util::future::join_all(posts).await {
        assert_eq!(status, 200, "{receipt}");
        assert_eq!(receipt["matched"], 1);
    }
    eventually("every alert settled", || async {
        let (run, skipped) = (
            counted(&server, "run").await,
            counted(&server, "skipped").await,
        );
        if run + skipped == 30 {
            Ok(())
        } else {
            Err(format!("{run} run, {skipped} skipped"))
        }
    })
    .await;
    assert_eq!(counted(&server, "run").await, 10, "limits.maxRunsPerHour");
    assert_eq!(counted(&server, "skipped").await, 20);
    assert_eq!(counted(&server, "received").await, 30);
    eventually("ten investigations ended", || async {
        let n = sessions(&kortex, ALICE_KEY)
            .await
            .iter()
            .filter(|s| s["status"] == "idle")
            .count();
        if n == 10 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    assert_eq!(chat_calls(&script), 10);
    // One trigger.skipped notice for the storm (at most one an hour).
    let skipped = eventually("trigger.skipped delivered", || async {
        let got: Vec<Value> = hook.events("trigger.skipped");
        if got.is_empty() {
            Err("none".to_owned())
        } else {
            Ok(got)
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = hook.events("trigger.skipped").len();
    assert_eq!(again, 1);
    assert!(
        skipped[0]["data"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("limits.maxRunsPerHour 10"),
        "{}",
        skipped[0]
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_payloads_and_callers_get_their_codes() {
    let (base, _script) = mock().await;
    let (dir, db) = manifests(&base, "http://127.0.0.1:9/hook", CRASHLOOP_TRIGGER);
    let (server, kortex) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    let good = payload("g", "p").to_string().into_bytes();
    let (status, body) = post(&kortex, None, good.clone()).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = post(&kortex, Some("wrong-key-000000000"), good.clone()).await;
    assert_eq!(status, 401, "{body}");
    // alice may not fire the trigger (callers: the group alerting).
    let (status, body) = post(&kortex, Some(ALICE_KEY), good.clone()).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("default/incidents/crashloops"),
        "{body}"
    );
    let mut bad = payload("g", "p");
    bad["alerts"][0]["labels"] = json!(["not", "a", "map"]);
    let (status, body) = post(&kortex, Some(KEY), bad.to_string().into_bytes()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("alerts[0].labels:"),
        "{body}"
    );
    let mut bad = payload("g", "p");
    bad["version"] = json!("3");
    let (status, body) = post(&kortex, Some(KEY), bad.to_string().into_bytes()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("version:"),
        "{body}"
    );
    let (status, _) = post(&kortex, Some(KEY), b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    let mut big = payload("g", "p");
    big["alerts"][0]["annotations"]["description"] = json!("x".repeat(1 << 20));
    let (status, body) = post(&kortex, Some(KEY), big.to_string().into_bytes()).await;
    assert_eq!(status, 413, "{body}");
    // An alert no trigger takes: acknowledged and counted.
    let mut other = payload("g2", "p");
    other["alerts"][0]["labels"]["team"] = json!("payments");
    let (status, body) = post(&kortex, Some(KEY), other.to_string().into_bytes()).await;
    assert_eq!(
        (status, body["unmatched"].clone()),
        (200, json!(1)),
        "{body}"
    );
    assert_eq!(counted(&server, "unmatched").await, 1);
    // The server still serves.
    let (status, body) = post(&kortex, Some(KEY), good).await;
    assert_eq!(status, 200, "{body}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_alert_runs_once_after_a_crash() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_: &Value| {
        let d = openai();
        Some(streamed(&d, (d.text_stream)(&["Checked."])))
    }));
    let (dir, db) = manifests(&base, "http://127.0.0.1:9/hook", CRASHLOOP_TRIGGER);
    let m = dir.path().join("m");
    // This replica only records: the 200 comes, no run starts; then it dies.
    let (first, kortex) = Server::start_keyed(&m, &db, &[("KORTEX_TRIGGERS_RECEIVE_ONLY", "true")]);
    // Alert text is untrusted: a credential in it is redacted before it is stored or sent.
    let mut alert = payload("crash-group", "web-1");
    alert["alerts"][0]["annotations"]["description"] =
        json!("deploy with key AKIAIOSFODNN7EXAMPLE failed");
    let (status, body) = post(&kortex, Some(KEY), alert.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.kill9();
    assert_eq!(chat_calls(&script), 0);
    let (second, kortex) = Server::start_keyed(&m, &db, &[]);
    eventually("the run after the restart", || async {
        let list = sessions(&kortex, ALICE_KEY).await;
        match list.as_slice() {
            [one] if one["status"] == "idle" && chat_calls(&script) == 1 => Ok(()),
            other => Err(format!(
                "{} sessions, {} calls",
                other.len(),
                chat_calls(&script)
            )),
        }
    })
    .await;
    let store = kortex::store::Store::connect(&db).await.unwrap();
    let stored = store
        .trigger_events("default/incidents", "crashloops", 10)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].state, "run");
    assert!(
        !stored[0]
            .payload
            .to_string()
            .contains("AKIAIOSFODNN7EXAMPLE"),
        "{}",
        stored[0].payload
    );
    let list = sessions(&kortex, ALICE_KEY).await;
    let s = session(
        &kortex,
        ALICE_KEY,
        list[0]["id"].as_str().unwrap_or_default(),
    )
    .await;
    let question = s["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(
        question.contains("deploy with key") && !question.contains("AKIAIOSFODNN7EXAMPLE"),
        "{question}"
    );
    let sent: String = script
        .requests()
        .iter()
        .map(|s| s.body.to_string())
        .collect();
    assert!(!sent.contains("AKIAIOSFODNN7EXAMPLE"));
    store.close().await;
    // Restarted again: still exactly once.
    second.kill9();
    let (third, kortex) = Server::start_keyed(&m, &db, &[]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(chat_calls(&script), 1);
    assert_eq!(sessions(&kortex, ALICE_KEY).await.len(), 1);
    drop(third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_fire_each_schedule_slot_once() {
    let Some(db) = postgres().await else {
        return;
    };
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_: &Value| {
        let d = openai();
        Some(streamed(&d, (d.text_stream)(&["All healthy."])))
    }));
    let (dir, _) = manifests(
        &base,
        "http://127.0.0.1:9/hook",
        "    - name: health\n      schedule: {cron: \"*/2 * * * * *\", timeZone: Europe/Berlin}\n      prompt: \"Morning health report for {{ slot }}.\"\n      runAs: {user: oncall-bot}\n      limits: {maxRunsPerHour: 1000, maxConcurrent: 10}\n",
    );
    let m = dir.path().join("m");
    let (a, _) = Server::start_keyed(&m, &db.url, &[]);
    let (b, kortex) = Server::start_keyed(&m, &db.url, &[]);
    tokio::time::sleep(Duration::from_secs(9)).await;
    drop((a, b));
    let events = db
        .store
        .trigger_events("default/incidents", "health", 100)
        .await
        .unwrap();
    let slots: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e.group_key.as_str()).collect();
    assert!(events.len() >= 3, "{} slots in 9 s", events.len());
    assert_eq!(slots.len(), events.len(), "a slot fired twice: {events:?}");
    let runs = events.iter().filter(|e| e.state == "run").count();
    assert!(runs >= 3, "{events:?}");
    // Each slot's run called the model once (the last may not have got to it before the
    // replicas stopped): never twice.
    let calls = chat_calls(&script);
    assert!(
        calls <= runs && calls + 2 >= runs,
        "{calls} model calls for {runs} runs"
    );
    let first = events
        .last()
        .map(|e| e.payload["slot"].clone())
        .unwrap_or_default();
    assert!(
        first
            .as_str()
            .unwrap_or_default()
            .contains("[Europe/Berlin]"),
        "{first}"
    );
    let _ = kortex;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_and_marks_triggered_sessions() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(responder));
    let (dir, db) = manifests(&base, "http://127.0.0.1:9/hook", CRASHLOOP_TRIGGER);
    let (server, kortex) = Server::start_keyed(&dir.path().join("m"), &db, &[]);
    let (status, body) = post(
        &kortex,
        Some(KEY),
        payload("g-browser", "web-1").to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    settled(&kortex, 1).await;
    let env = [("KORTEX_URL", kortex.as_str()), ("KORTEX_KEY", ALICE_KEY)];
    let Some(out) = run_browser("triggers.mjs", &env).await else {
        return;
    };
    passed(&out, &server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_missed_while_down_runs_once_within_its_deadline() {
    let (base, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_: &Value| {
        let d = openai();
        Some(streamed(&d, (d.text_stream)(&["All healthy."])))
    }));
    // A daily slot 40 s ago: Kortex was not running then.
    let slot = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(40);
    let utc = slot.to_zoned(jiff::tz::TimeZone::UTC);
    let cron = format!("{} {} {} * * *", utc.second(), utc.minute(), utc.hour());
    let (dir, db) = manifests(
        &base,
        "http://127.0.0.1:9/hook",
        &format!(
            "    - name: within\n      schedule: {{cron: \"{cron}\", startingDeadlineSeconds: 300}}\n      prompt: \"Report for {{{{ slot }}}}.\"\n      runAs: {{user: oncall-bot}}\n\
             \x20   - name: too-old\n      schedule: {{cron: \"{cron}\", startingDeadlineSeconds: 10}}\n      prompt: \"Report for {{{{ slot }}}}.\"\n      runAs: {{user: oncall-bot}}\n"
        ),
    );
    let m = dir.path().join("m");
    let (first, kortex) = Server::start_keyed(&m, &db, &[]);
    let s = settled(&kortex, 1).await;
    assert_eq!(s["trigger"]["name"], "within");
    let question = s["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(question.starts_with("Report for \""), "{question}");
    // Restarted: the slot was claimed; it does not run again.
    first.terminate();
    let (second, kortex) = Server::start_keyed(&m, &db, &[]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sessions(&kortex, ALICE_KEY).await.len(), 1);
    assert_eq!(chat_calls(&script), 1);
    drop(second);
}
