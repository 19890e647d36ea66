//! Kortex as an A2A v1.0 agent (`docs/a2a.md`), called by the official A2A SDK (PyPI
//! `a2a-sdk`, tests/fixtures/a2a_client.py) against the binary: the card fetched and
//! parsed; a task streamed to completion with its answer, evidence and proposal artifacts;
//! a plan gate surfacing as input-required and resumed by the caller's next message; a
//! dropped stream followed again with SubscribeToTask; cancel and not-found errors as the
//! SDK types them; another caller's task not theirs; a caller without a key refused.

use crate::support::manifests::{chat_key_secret, docs, policy, provider, secret};
use crate::support::provider::{answer, mock, push, push_answer, tool_calls};
use crate::support::server::Server;
use serde_json::{Value, json};

const ALICE: &str = "a2a-alice-key-0123456789";
const BOB: &str = "a2a-bob-key-0123456789";

/// The Python with the A2A SDK, or `None` (skipped, unless `KORTEX_REQUIRE_A2A` is set, as
/// scripts/test.sh does).
fn python() -> Option<String> {
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import a2a.client"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("KORTEX_REQUIRE_A2A").is_err(),
            "{python} has no a2a-sdk (pip install -r operator/tests/fixtures/requirements-a2a.txt)"
        );
        eprintln!("skipped: {python} has no a2a-sdk");
        return None;
    }
    Some(python)
}

/// Runs the SDK client with `args`; its JSON answer.
async fn sdk(python: &str, args: &[&str]) -> Value {
    sdk_over(python, "JSONRPC", args).await
}

/// Runs the SDK client with `args` over the protocol `binding` (`JSONRPC`, `HTTP+JSON`).
async fn sdk_over(python: &str, binding: &str, args: &[&str]) -> Value {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/a2a_client.py");
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .env("A2A_BINDING", binding)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a2a_client.py {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The events of a stream of the given kind (`task`, `statusUpdate`, `artifactUpdate`).
fn of_kind<'a>(events: &'a Value, kind: &str) -> Vec<&'a Value> {
    events
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.get(kind))
        .collect()
}

fn last_state(events: &Value) -> String {
    of_kind(events, "statusUpdate")
        .last()
        .and_then(|s| s["status"]["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The final artifact `id` of a stream (the last update of it).
fn artifact<'a>(events: &'a Value, id: &str) -> Option<&'a Value> {
    of_kind(events, "artifactUpdate")
        .into_iter()
        .rfind(|u| u["artifact"]["artifactId"] == id)
        .map(|u| &u["artifact"])
}

/// A new P-256 key: its PKCS#8 PEM, and its public JWK (JSON).
fn signing_key() -> (String, String) {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let b64 = kortex::redact::base64_bytes(pkcs8.as_ref());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    let point = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "test-key",
        "x": kortex::oidc::jwt::base64url_encode(&point[1..33]),
        "y": kortex::oidc::jwt::base64url_encode(&point[33..65])});
    (pem, jwk.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_agent_investigates_through_the_a2a_sdk() {
    let Some(py) = python() else { return };
    let (llm, script) = mock().await;
    let (dir, m) = crate::support::manifests::manifest_dir();
    let yaml = format!(
        "{}{}{}",
        chat_key_secret("alice", ALICE, "sre"),
        chat_key_secret("bob", BOB, "sre"),
        docs(&[
            secret("llm", "key: sk-a2a"),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{llm}/v1', apiKeySecretRef: {{name: llm, key: key}}, defaultModel: m, timeout: 10s"
                ),
            ),
            policy(
                "oncall",
                "sessions: ['*'], provider: gpt, proposals: {allowedActions: [restart], allowedNamespaces: [shop]}, \
                 a2a: {expose: true, name: Checkout investigator}",
            ),
            policy(
                "planned",
                "sessions: ['plan-*'], provider: gpt, runControl: {planning: required}, a2a: {expose: true}",
            ),
        ])
    );
    std::fs::write(m.join("all.yaml"), yaml).unwrap();
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    // Cards signed with a P-256 key; its public half as a JWK, for the SDK's verifier.
    let (pem, jwk) = signing_key();
    let key_file = dir.path().join("a2a-key.pem");
    std::fs::write(&key_file, pem).unwrap();
    let key_file = key_file.display().to_string();
    // Off loopback: every call needs a key.
    let (server, base) = Server::start_keyed(
        &m,
        &db,
        &[
            ("KORTEX_A2A_SIGNING_KEY_FILE", key_file.as_str()),
            ("KORTEX_A2A_SIGNING_KEY_ID", "test-key"),
        ],
    );
    let agent = format!("{base}/a2a/v1/default/oncall");
    let planned = format!("{base}/a2a/v1/default/planned");

    // The card, as the SDK fetches, parses and verifies it (its JWS signature, ES256).
    let card = sdk(&py, &["card", &agent, &jwk]).await;
    assert!(card["error"].is_null(), "{card}");
    // Another key's signature does not verify.
    let (_, other) = signing_key();
    let refused = sdk(&py, &["card", &agent, &other]).await;
    assert_eq!(refused["error"], "InvalidSignaturesError", "{refused}");
    assert_eq!(card["name"], "Checkout investigator");
    assert_eq!(card["capabilities"]["streaming"], true);
    let interface = &card["supportedInterfaces"][0];
    assert_eq!(interface["protocolBinding"], "JSONRPC");
    assert_eq!(
        card["supportedInterfaces"][1]["protocolBinding"],
        "HTTP+JSON"
    );
    assert_eq!(interface["protocolVersion"], "1.0");
    assert_eq!(interface["url"], agent.as_str());
    assert!(card["securitySchemes"]["bearer"].is_object(), "{card}");
    // Two agents here: the origin's card says where each is.
    let origin = crate::support::net::http_client()
        .get(format!("{base}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(origin.status().as_u16(), 404);
    let body = origin.text().await.unwrap_or_default();
    assert!(
        body.contains("/a2a/v1/default/planned/.well-known/agent-card.json"),
        "{body}"
    );

    // A task streamed to completion: a tool call, a proposal, the answer.
    push(
        &script,
        tool_calls(&[("h1", "get_incident_history", json!({"query": "checkout"}))]),
    );
    push(
        &script,
        tool_calls(&[(
            "p1",
            "propose_action",
            json!({"action": "restart", "rationale": "stuck on a bad config",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "checkout"}}),
        )]),
    );
    push_answer(
        &script,
        &[
            "Root cause: ",
            "a bad config key.",
            " I proposed a restart.",
        ],
    );
    let streamed = sdk(&py, &["stream", &agent, ALICE, "why is checkout failing?"]).await;
    let events = &streamed["events"];
    let first = &events[0]["task"];
    assert!(
        first.is_object(),
        "the stream starts with the task: {events}"
    );
    let (task, context) = (
        first["id"].as_str().unwrap_or_default().to_owned(),
        first["contextId"].as_str().unwrap_or_default().to_owned(),
    );
    assert_eq!(last_state(events), "TASK_STATE_COMPLETED", "{events}");
    let answer_text = artifact(events, "answer").map(|a| a["parts"][0]["text"].clone());
    assert_eq!(
        answer_text,
        Some(json!("Root cause: a bad config key. I proposed a restart.")),
        "{events}"
    );
    let evidence = of_kind(events, "artifactUpdate")
        .into_iter()
        .filter(|u| u["artifact"]["artifactId"] == "evidence")
        .flat_map(|u| {
            u["artifact"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|p| p["data"]["tool"].clone())
        .collect::<Vec<_>>();
    assert_eq!(
        evidence,
        vec![json!("get_incident_history"), json!("propose_action")]
    );
    let proposal =
        &artifact(events, "proposals").expect("a proposals artifact")["parts"][0]["data"];
    assert_eq!(proposal["action"], "restart");
    assert!(
        proposal["decide"]["kubectl"]
            .as_str()
            .is_some_and(|k| k.starts_with("kubectl kortex approve restart-checkout")),
        "{proposal}"
    );

    // GetTask: the same task, its history and artifacts.
    let got = sdk(&py, &["get", &agent, ALICE, &task]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(got["contextId"], context.as_str());
    assert_eq!(
        got["history"][0]["parts"][0]["text"],
        "why is checkout failing?"
    );
    let ids: Vec<&str> = got["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["artifactId"].as_str())
        .collect();
    assert_eq!(ids, ["answer", "evidence", "proposals"]);
    // Not bob's: not found for him. An ended task is not cancelable; no task is not found.
    assert_eq!(
        sdk(&py, &["get", &agent, BOB, &task]).await["error"],
        "TaskNotFoundError"
    );
    assert_eq!(
        sdk(&py, &["cancel", &agent, ALICE, &task]).await["error"],
        "TaskNotCancelableError"
    );
    assert_eq!(
        sdk(&py, &["get", &agent, ALICE, "nope"]).await["error"],
        "TaskNotFoundError"
    );
    // The same over the HTTP+JSON (REST) binding: a task streamed to completion, read
    // back, and the same refusals with the SDK's own errors.
    push_answer(&script, &["Over REST: ", "the config again."]);
    let rest = sdk_over(&py, "HTTP+JSON", &["stream", &agent, ALICE, "and now?"]).await;
    let rest_events = &rest["events"];
    assert_eq!(last_state(rest_events), "TASK_STATE_COMPLETED", "{rest}");
    assert_eq!(
        artifact(rest_events, "answer").map(|a| a["parts"][0]["text"].clone()),
        Some(json!("Over REST: the config again."))
    );
    let rest_task = rest_events[0]["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let got = sdk_over(&py, "HTTP+JSON", &["get", &agent, ALICE, &rest_task]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(got["history"][0]["parts"][0]["text"], "and now?");
    for (who, task, call, error) in [
        (BOB, rest_task.as_str(), "get", "TaskNotFoundError"),
        (ALICE, "nope", "get", "TaskNotFoundError"),
        (
            ALICE,
            rest_task.as_str(),
            "cancel",
            "TaskNotCancelableError",
        ),
    ] {
        let r = sdk_over(&py, "HTTP+JSON", &[call, &agent, who, task]).await;
        assert_eq!(r["error"], error, "{call} {task}: {r}");
    }

    // The binding's own shapes, on the wire: a google.rpc.Status with the reason.
    let r = crate::support::net::http_client()
        .get(format!("{agent}/tasks/nope"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let status: Value = r.json().await.unwrap_or_default();
    assert_eq!(status["error"]["status"], "NOT_FOUND", "{status}");
    assert_eq!(status["error"]["details"][0]["reason"], "TASK_NOT_FOUND");

    // A caller without a valid key is refused by the HTTP layer.
    let refused = sdk(&py, &["stream", &agent, "wrong-key-0000000000", "hello"]).await;
    assert!(refused["error"].is_string(), "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("401"),
        "{refused}"
    );

    // The plan gate: input-required, resumed by the caller's next message on the task.
    let plan = json!({"steps": [{"id": "1", "tool": "get_incident_history", "purpose": "how it went before"}]});
    push(&script, tool_calls(&[("s1", "submit_plan", plan)]));
    let waiting = sdk(&py, &["stream", &planned, ALICE, "check the queue"]).await;
    assert_eq!(
        last_state(&waiting["events"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{waiting}"
    );
    let status = of_kind(&waiting["events"], "statusUpdate")
        .last()
        .map(|s| s["status"].clone())
        .unwrap_or_default();
    assert!(
        status["message"]["parts"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("get_incident_history"),
        "{status}"
    );
    let gate = waiting["events"][0]["task"].clone();
    push(
        &script,
        tool_calls(&[("h2", "get_incident_history", json!({"query": "queue"}))]),
    );
    push_answer(&script, &["The queue drained at 03:10."]);
    let resumed = sdk(
        &py,
        &[
            "stream",
            &planned,
            ALICE,
            "approve",
            gate["id"].as_str().unwrap_or_default(),
            gate["contextId"].as_str().unwrap_or_default(),
        ],
    )
    .await;
    assert_eq!(
        resumed["events"][0]["task"]["id"], gate["id"],
        "the same task goes on"
    );
    assert_eq!(
        last_state(&resumed["events"]),
        "TASK_STATE_COMPLETED",
        "{resumed}"
    );

    // A dropped stream is followed again: the task first, then on to the end.
    let mut slow = answer(&[
        "one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight.",
    ]);
    slow.chunk_delay = Some(std::time::Duration::from_millis(250));
    push(&script, slow);
    let again = sdk(
        &py,
        &["drop-and-resubscribe", &agent, ALICE, "count slowly"],
    )
    .await;
    let events = &again["events"];
    assert_eq!(
        events[0]["task"]["id"], again["first"]["task"]["id"],
        "{again}"
    );
    assert_eq!(last_state(events), "TASK_STATE_COMPLETED", "{again}");
    assert_eq!(
        artifact(events, "answer").map(|a| a["parts"][0]["text"].clone()),
        Some(json!("one two three four five six seven eight."))
    );

    // Push notifications: the task answers at once, its events reach the receiver with
    // the token and credentials set; listing the configs shows neither.
    let hook = crate::support::receiver::receiver(0).await;
    push_answer(&script, &["Pushed: all good."]);
    let pushed = sdk(
        &py,
        &["push", &agent, ALICE, "is checkout ok now?", &hook.url],
    )
    .await;
    let task = pushed["events"][0]["task"].clone();
    assert!(task["id"].is_string(), "{pushed}");
    let listed = pushed["configs"]["configs"][0].clone();
    assert_eq!(listed["url"], hook.url.as_str(), "{pushed}");
    assert!(
        listed.get("token").is_none() && listed["authentication"].get("credentials").is_none(),
        "{listed}"
    );
    let done = crate::support::net::eventually("the completed task pushed", || {
        let got = hook.got();
        async move {
            got.into_iter()
                .find(|(_, b)| b["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
                .ok_or_else(|| "not yet".to_owned())
        }
    })
    .await;
    assert_eq!(done.1["statusUpdate"]["taskId"], task["id"]);
    assert_eq!(done.0["x-a2a-notification-token"], "push-token-42");
    assert_eq!(done.0["authorization"], "Bearer receiver-secret");
    let pushed_answer = hook.got().into_iter().rev().find_map(|(_, b)| {
        (b["artifactUpdate"]["artifact"]["artifactId"] == "answer")
            .then(|| b["artifactUpdate"]["artifact"]["parts"][0]["text"].clone())
    });
    assert_eq!(pushed_answer, Some(json!("Pushed: all good.")));
    assert!(
        !server.log().contains("receiver-secret"),
        "push credentials never logged"
    );
    assert!(!server.log().contains(ALICE), "keys never logged");
    assert!(server.terminate().success());
}

/// In cluster mode an agent's caller is judged as any API caller: a Kubernetes token the
/// API server reviews, and RBAC `use` on the policy (a SubjectAccessReview). dave, whose
/// token is valid but who may not use the policy, is refused (403) and nothing runs;
/// alice, who may, gets her task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_caller_without_use_on_the_policy_is_refused() {
    use crate::support::fake_api::incidents_cluster;
    let (fake, llm, script) = incidents_cluster(json!({})).await;
    let mut policy = fake
        .get("chatpolicies", "team-a", "incidents")
        .expect("the incidents policy");
    policy["spec"]["a2a"] = json!({"expose": true});
    fake.apply("chatpolicies", policy);
    fake.allow("alice");
    let dir = tempfile::tempdir().unwrap();
    let server =
        crate::support::server::start_run_with(&fake, dir.path(), &llm, &["--auth", "kubernetes"])
            .await;
    let agent = server.url("/a2a/v1/team-a/incidents");
    let http = crate::support::net::http_client();
    crate::support::net::eventually("the agent's card", || {
        let url = format!("{agent}/.well-known/agent-card.json");
        let http = http.clone();
        async move {
            let r = http.get(url).send().await.map_err(|e| e.to_string())?;
            (r.status().as_u16() == 200)
                .then_some(())
                .ok_or_else(|| r.status().to_string())
        }
    })
    .await;
    let send = |token: &'static str| {
        http.post(&agent)
            .bearer_auth(token)
            .json(&json!({"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "why is api slow?"}]},
                "configuration": {"returnImmediately": true}}}))
            .send()
    };
    let r = send("dave-token").await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("dave may not use ChatPolicy team-a/incidents"),
        "{body}"
    );
    assert_eq!(
        crate::support::provider::chat_calls(&script),
        0,
        "nothing ran for dave"
    );
    push_answer(&script, &["It is the database."]);
    let r = send("alice-token").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert!(body["result"]["task"]["id"].is_string(), "{body}");
}

/// Client-executed tools over A2A: a session the chat API started with a tool of the
/// caller's own (`dynamicTools`) is continued as an A2A task (its `contextId`); when the
/// model calls that tool the task is `input-required` with the calls as a data part, and
/// the caller's next message on the task, a data part `toolResults`, resumes the run to
/// its answer. Results that answer no pending call are refused, and the task still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_the_callers_own_tools_resumes_with_their_results() {
    let (llm, script) = mock().await;
    let (dir, m) = crate::support::manifests::manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            secret("llm", "key: sk-a2a"),
            provider(
                "gpt",
                &format!(
                    "type: openai-compatible, baseUrl: '{llm}/v1', apiKeySecretRef: {{name: llm, key: key}}, defaultModel: m, timeout: 10s"
                ),
            ),
            policy("oncall", "sessions: ['*'], provider: gpt, a2a: {expose: true}"),
        ]),
    )
    .unwrap();
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let http = crate::support::net::http_client();
    let session: Value = http
        .post(server.url("/chat/v1/sessions"))
        .json(
            &json!({"name": "incident-ui", "dynamicTools": [{"name": "open_dashboard",
            "description": "Open a dashboard in the user's browser and read its panels",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let context = session["id"].as_str().unwrap_or_default().to_owned();
    let agent = server.url("/a2a/v1/default/oncall");
    let rpc = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": "1", "method": method, "params": params});
        let (http, agent) = (http.clone(), agent.clone());
        async move {
            http.post(agent)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    push(
        &script,
        tool_calls(&[("d1", "open_dashboard", json!({"name": "checkout"}))]),
    );
    let sent = rpc(
        "SendMessage",
        json!({"message": {"messageId": "m1", "role": "ROLE_USER", "contextId": context,
            "parts": [{"text": "what does the checkout dashboard say?"}]}}),
    )
    .await;
    let task = &sent["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{sent}"
    );
    assert_eq!(task["contextId"], context.as_str());
    let calls = task["status"]["message"]["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|p| p["data"].get("toolCalls"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(calls[0]["toolCallId"], "d1", "{sent}");
    assert_eq!(calls[0]["name"], "open_dashboard");
    assert_eq!(calls[0]["input"]["name"], "checkout");
    let task_id = task["id"].as_str().unwrap_or_default().to_owned();

    // An answer to no pending call: refused, the task still waits.
    let wrong = rpc(
        "SendMessage",
        json!({"message": {"messageId": "m2", "role": "ROLE_USER", "taskId": task_id, "contextId": context,
            "parts": [{"data": {"toolResults": [{"toolCallId": "nope", "content": "x"}]}}]}}),
    )
    .await;
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("missing: [\"d1\"]"),
        "{wrong}"
    );
    push_answer(
        &script,
        &["Checkout's error rate is 12%: the payment call fails."],
    );
    let done = rpc(
        "SendMessage",
        json!({"message": {"messageId": "m3", "role": "ROLE_USER", "taskId": task_id, "contextId": context,
            "parts": [{"data": {"toolResults": [{"toolCallId": "d1", "content": "error rate 12%, payment 502s"}]}}]}}),
    )
    .await;
    assert!(done["error"].is_null(), "{done}");
    let finished = crate::support::net::eventually("the task completes", || {
        let rpc = &rpc;
        let task_id = task_id.clone();
        async move {
            let got = rpc("GetTask", json!({"id": task_id})).await;
            (got["result"]["status"]["state"] == "TASK_STATE_COMPLETED")
                .then_some(got.clone())
                .ok_or_else(|| got.to_string())
        }
    })
    .await;
    assert!(
        finished.to_string().contains("payment call fails"),
        "{finished}"
    );
    let seen = crate::support::provider::chat_requests(&script)
        .iter()
        .find_map(|b| crate::support::provider::tool_result(b, "d1"))
        .unwrap_or_default();
    assert_eq!(seen, "error rate 12%, payment 502s");
    assert!(server.terminate().success());
}
