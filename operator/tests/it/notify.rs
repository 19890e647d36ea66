//! Notifications (docs/notifications.md) on the real binary: a proposal's events reach the
//! policy's webhooks — Kortex's JSON envelope, signed, and Slack's format — through the
//! outbox, after retries when the receiver fails, once per delivery id.

use crate::support::chat::{ask, open_session, post_message};
use crate::support::db::postgres;
use crate::support::manifests::{docs, manifest_dir, policy, provider};
use crate::support::net::{eventually, http_client, serve};
use crate::support::provider::{Script, json_reply, mock, openai, push, push_answer, streamed};
use crate::support::receiver::{receiver, slow_receiver};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn header(h: &axum::http::HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A manifest folder `m` in a new temp dir: the LLMProvider `gpt` at `base` and the
/// ChatPolicy `incidents` for every session, with `policy` (YAML lines under its `spec:`).
fn policy_manifests(base: &str, policy: &str) -> tempfile::TempDir {
    let (dir, m) = manifest_dir();
    write_policy(&m, base, policy);
    dir
}

/// (Re)writes `m/all.yaml`: the LLMProvider `gpt` at `base` and the ChatPolicy `incidents`
/// for every session, with `policy` (YAML lines under its `spec:`).
fn write_policy(m: &std::path::Path, base: &str, policy: &str) {
    std::fs::write(
        m.join("all.yaml"),
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: gpt}}\n\
             spec: {{type: openai-compatible, baseUrl: \"{base}/v1\", defaultModel: m1, locality: local}}\n\
             ---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: incidents}}\n\
             spec:\n  sessions: [\"*\"]\n  provider: gpt\n{policy}"
        ),
    )
    .unwrap();
}

/// The provider's next answer is a 400: the chat run fails (`run.failed`).
fn fail_next_call(script: &Script) {
    push(
        script,
        json_reply(
            400,
            &json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_reaches_its_webhooks_signed_and_after_retries() {
    let (base, script) = mock().await;
    let json_hook = receiver(2).await;
    let slack_hook = receiver(0).await;
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            format!(
                r#"apiVersion: v1
kind: Secret
metadata: {{name: hooks, labels: {{kortex.dev/use: "true"}}}}
stringData: {{slack: "{slack}", signing: s3cr3t-signing-key}}
"#,
                slack = slack_hook.url
            ),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, \
                     locality: local"
                ),
            ),
            policy(
                "incidents",
                &format!(
                    "sessions: ['*'], provider: gpt, proposals: {{allowedActions: [restart], \
                     allowedNamespaces: [shop-*], requireDistinctApprover: false}}, \
                     notify: [{{name: oncall-json, events: [proposal.pending, proposal.decided], \
                     webhook: {{url: '{json}'}}, signingSecretRef: {{name: hooks, \
                     key: signing}}}}, {{name: oncall-slack, events: [proposal.pending], \
                     webhook: {{urlSecretRef: {{name: hooks, key: slack}}}}, format: slack}}]",
                    json = json_hook.url
                ),
            ),
        ]),
    )
    .unwrap();
    let server = Server::start_with_args(
        &m,
        &dir.path().join("k.db"),
        &["--public-url", "https://kortex.example.com"],
    );
    let (_, policies) = server.get("/api/v1/policies").await;
    assert!(policies.contains("ReadyToSend"), "{policies}");

    // The model proposes a restart.
    let client = http_client();
    let d = openai();
    let call = r#"{"action": "restart", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop-prod", "name": "api"}, "rationale": "pods stuck since the config change", "reversible": true}"#;
    push(
        &script,
        streamed(&d, (d.tools_stream)(&[("p1", "propose_action", call)])),
    );
    push(
        &script,
        streamed(&d, (d.text_stream)(&["I proposed a restart."])),
    );
    let id = open_session(&server, json!({"name": "incident-1"})).await;
    let events = ask(&server, &id, "fix the api").await;
    let proposal = events
        .iter()
        .find(|e| e.event == "proposal.created")
        .map(|e| e.data["proposalId"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("no proposal: {events:?}"));

    // Slack gets it at once; the JSON receiver after refusing twice (retried with backoff).
    eventually("both webhooks got proposal.pending", || async {
        match (slack_hook.got().len(), json_hook.got().len()) {
            (1, 1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(json_hook.refused.load(Ordering::SeqCst), 2);
    let (h, body) = json_hook.got().remove(0);
    assert_eq!(body["type"], "proposal.pending", "{body}");
    assert_eq!(body["data"]["id"], proposal.as_str(), "{body}");
    assert_eq!(body["data"]["action"], "restart");
    assert_eq!(body["policy"], "default/incidents");
    let delivery = header(&h, "x-kortex-delivery");
    assert_eq!(
        delivery,
        format!("{}.oncall-json", body["id"].as_str().unwrap_or("?"))
    );
    assert_eq!(
        header(&h, "x-kortex-signature"),
        kortex::notify::webhook::signature("s3cr3t-signing-key", json_hook.raw(0).as_bytes())
    );
    let (h, slack) = slack_hook.got().remove(0);
    assert!(header(&h, "x-kortex-signature").is_empty());
    let blocks = slack["blocks"].to_string();
    assert!(
        slack["text"]
            .as_str()
            .unwrap_or_default()
            .contains("waits for a decision"),
        "{slack}"
    );
    assert!(
        blocks.contains("kubectl kortex approve restart-api-") && blocks.contains("-n shop-prod"),
        "{blocks}"
    );
    assert!(
        blocks.contains("Deployment shop-prod/api") && blocks.contains("pods stuck"),
        "{blocks}"
    );
    assert!(
        blocks.contains(&format!(
            "https://kortex.example.com/#/proposals/{proposal}"
        )),
        "{blocks}"
    );

    // Approving it: the JSON target (subscribed to proposal.decided) hears; Slack does not.
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{proposal}/approve")))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    eventually("proposal.decided delivered", || async {
        match json_hook.got().len() {
            2 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let (_, decided) = json_hook.got().remove(1);
    assert_eq!(decided["type"], "proposal.decided", "{decided}");
    assert_eq!(decided["data"]["phase"], "Approved");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        slack_hook.got().len(),
        1,
        "slack is not subscribed to proposal.decided"
    );
    assert_eq!(json_hook.got().len(), 2, "each delivery once");

    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("kortex_notifications_total{result=\"retried\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kortex_notifications_total{result=\"delivered\"} 3"),
        "{metrics}"
    );
    // The Slack URL is a credential: never in the log.
    assert!(!server.log().contains(&slack_hook.url), "{}", server.log());
}

/// A receiver that keeps failing: the policy says so (`Notify=False`, `DeliveryFailing`,
/// naming the target and its last error), the retries are counted, and a failed chat run
/// (`run.failed`) is what was being sent. A chat run never waits for the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_keeps_failing_turns_the_policys_notify_condition_false() {
    let (base, script) = mock().await;
    let hook = receiver(usize::MAX).await;
    let dir = policy_manifests(
        &base,
        &format!(
            "  notify:\n    - name: pager\n      events: [run.failed]\n      webhook: {{url: \"{}\"}}\n",
            hook.url
        ),
    );
    let server = Server::start_with_args(&dir.path().join("m"), &dir.path().join("k.db"), &[]);
    fail_next_call(&script);
    let id = crate::support::chat::session(&server, "incident-2").await;
    let events = crate::support::chat::ask(&server, &id, "what broke?").await;
    assert_eq!(crate::support::chat::state(&events), json!("failed"));
    eventually("Notify=False", || async {
        let (_, policies) = server.get("/api/v1/policies").await;
        if policies.contains("DeliveryFailing") && policies.contains("pager: ") {
            Ok(policies)
        } else {
            Err(policies)
        }
    })
    .await;
    assert!(hook.refused.load(Ordering::SeqCst) >= 3);
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("kortex_notifications_total{result=\"retried\"}"),
        "{metrics}"
    );
    // The chat server goes on serving meanwhile.
    push_answer(&script, &["Fine."]);
    let events = crate::support::chat::ask(&server, &id, "and now?").await;
    assert_eq!(crate::support::chat::state(&events), json!("completed"));
}

/// Two `kortex serve` replicas on one PostgreSQL database both run the worker: every
/// delivery is still sent once (each attempt is claimed first). The receiver takes 1.5 s
/// to answer, so each worker comes round while the other is sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_delivery_once() {
    let Some(db) = postgres().await else {
        return;
    };
    let hook = slow_receiver(0, std::time::Duration::from_millis(1500)).await;
    let dir = policy_manifests(
        "http://127.0.0.1:9",
        &format!(
            "  notify:\n    - name: oncall\n      events: [proposal.pending]\n      webhook: {{url: \"{}\"}}\n",
            hook.url
        ),
    );
    let m = dir.path().join("m");
    let a = Server::start_with_url(&m, &db.url, &[]);
    let b = Server::start_with_url(&m, &db.url, &[]);
    for i in 0..4 {
        let mut p =
            crate::support::db::proposal(None, "alice", &format!("restart-api-{i}"), "Pending");
        p.policy = Some("default/incidents".into());
        db.store.insert_proposal(&p).await.unwrap();
    }
    eventually("four deliveries", || async {
        match hook.got().len() {
            n if n >= 4 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    // Both workers have had time to go round several times.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let ids: std::collections::BTreeSet<String> = hook
        .got()
        .iter()
        .map(|(h, _)| header(h, "x-kortex-delivery"))
        .collect();
    assert_eq!((hook.got().len(), ids.len()), (4, 4));
    drop((a, b));
}

/// A receiver that holds its answer does not hold up chat: a run completes while the
/// delivery of the previous run's failure is still waiting for the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_does_not_slow_chat_down() {
    let (base, script) = mock().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waiting = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let (g, w, a) = (gate.clone(), waiting.clone(), answered.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let (g, w, a) = (g.clone(), w.clone(), a.clone());
            async move {
                w.fetch_add(1, Ordering::SeqCst);
                let _permit = g.acquire().await;
                a.fetch_add(1, Ordering::SeqCst);
                axum::http::StatusCode::OK
            }
        }),
    );
    let url = format!("{}/hook", serve(app).await);
    let dir = policy_manifests(
        &base,
        &format!(
            "  notify: [{{name: pager, events: [run.failed], webhook: {{url: \"{url}\"}}}}]\n"
        ),
    );
    let server = Server::start_with_args(&dir.path().join("m"), &dir.path().join("k.db"), &[]);
    fail_next_call(&script);
    let id = crate::support::chat::session(&server, "incident-3").await;
    let events = crate::support::chat::ask(&server, &id, "what broke?").await;
    assert_eq!(crate::support::chat::state(&events), json!("failed"));
    eventually("the receiver holds the delivery", || async {
        match waiting.load(Ordering::SeqCst) {
            0 => Err("not yet".to_owned()),
            _ => Ok(()),
        }
    })
    .await;
    push_answer(&script, &["Fine."]);
    let events = crate::support::chat::ask(&server, &id, "and now?").await;
    assert_eq!(crate::support::chat::state(&events), json!("completed"));
    // The run finished while the delivery was still in flight (a run that waited for it
    // would have hung above until the test timed out).
    assert_eq!(
        answered.load(Ordering::SeqCst),
        0,
        "the receiver was still holding it"
    );
    gate.add_permits(100);
}

/// `budget.exhausted` once per window, however many requests it refuses; `budget.alert`
/// when the threshold is crossed; `provider.unavailable` when a provider the policy uses
/// stops answering (its probe fails after its spec changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_and_providers_notify_once_per_change() {
    let (base, script) = mock().await;
    let hook = receiver(0).await;
    let policy = format!(
        "  budget: {{perUserHourlyRequests: 2, alertAtPercent: 50}}\n  notify:\n    - name: pager\n      events: [budget.alert, budget.exhausted, provider.unavailable]\n      webhook: {{url: \"{}\"}}\n",
        hook.url
    );
    let dir = policy_manifests(&base, &policy);
    let m = dir.path().join("m");
    let write = |provider_url: &str| write_policy(&m, provider_url, &policy);
    let server = Server::start_with_args(&m, &dir.path().join("k.db"), &["--probe-interval", "1s"]);
    let id = crate::support::chat::session(&server, "incident-4").await;
    let d = openai();
    for _ in 0..2 {
        push(&script, streamed(&d, (d.text_stream)(&["ok"])));
        let events = crate::support::chat::ask(&server, &id, "status?").await;
        assert_eq!(crate::support::chat::state(&events), json!("completed"));
    }
    // Refused three times: one event.
    for _ in 0..3 {
        let r = post_message(&server, &id, "status?").await;
        assert_eq!(r.status().as_u16(), 429);
    }
    let types = || {
        hook.got()
            .iter()
            .map(|(_, b)| b["type"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    eventually("budget.alert and budget.exhausted", || async {
        let t = types();
        if t.contains(&"budget.exhausted".to_owned()) && t.contains(&"budget.alert".to_owned()) {
            Ok(())
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await;
    let exhausted: Vec<Value> = hook.events("budget.exhausted");
    assert_eq!(exhausted.len(), 1, "{exhausted:?}");
    assert_eq!(exhausted[0]["data"]["budget"], "perUserHourlyRequests");
    // The provider stops answering.
    write("http://127.0.0.1:9");
    eventually("provider.unavailable", || async {
        let t = types();
        if t.contains(&"provider.unavailable".to_owned()) {
            Ok(())
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await;
    let down: Vec<Value> = hook.events("provider.unavailable");
    assert_eq!(down[0]["data"]["provider"], "default/gpt", "{down:?}");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        hook.events("provider.unavailable").len(),
        1,
        "one event per change, not per failed probe"
    );
}

/// `minInterval`: at most one delivery per interval to a target; the next waits its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_interval_spaces_deliveries_to_a_target() {
    let (base, script) = mock().await;
    let hook = receiver(0).await;
    let dir = policy_manifests(
        &base,
        &format!(
            "  notify: [{{name: pager, events: [run.failed], webhook: {{url: \"{}\"}}, minInterval: 1h}}]\n",
            hook.url
        ),
    );
    let server = Server::start_with_args(&dir.path().join("m"), &dir.path().join("k.db"), &[]);
    let id = crate::support::chat::session(&server, "incident-5").await;
    for _ in 0..2 {
        fail_next_call(&script);
        let events = crate::support::chat::ask(&server, &id, "what broke?").await;
        assert_eq!(crate::support::chat::state(&events), json!("failed"));
    }
    eventually("the first delivery", || async {
        match hook.got().len() {
            0 => Err("none yet".to_owned()),
            n => Ok(n),
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(hook.got().len(), 1, "the second waits for the interval");
}
