//! `kortex serve --kubeconfig`: a proposal approved in the API is carried out in that
//! cluster under the same rules as in cluster mode — pinned and previewed when the model
//! makes it, executed once after the approval, refused when the target moved since, left
//! alone under `execute: false` — and the session, the audit log and the listing say so.

use crate::support::chat::{Sse, assert_refused, chat_once, chat_with_calls, get_json, read_sse};
use crate::support::fake_api::{FakeApi, deployment, write_kubeconfig};
use crate::support::manifests::{docs, manifest_dir, policy, provider};
use crate::support::net::http_client;
use crate::support::provider::{mock, push, push_answer, tool_calls, tool_result};
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};
use std::time::Duration;

async fn proposal(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    let list: Value = get_json(client, server.url("/chat/v1/proposals")).await;
    list["items"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == id).cloned())
        .unwrap_or_else(|| panic!("no proposal {id}: {list}"))
}

/// Waits until proposal `id` reaches a final phase; returns it.
async fn settled(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = proposal(client, server, id).await;
        if !matches!(p["status"]["phase"].as_str(), Some("Pending" | "Executing")) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never settled: {p}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The id of the proposal the model made in session `session`.
async fn made_in(client: &reqwest::Client, server: &Server, session: &str) -> String {
    let list: Value = get_json(client, server.url("/chat/v1/proposals")).await;
    list["items"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["spec"]["session"]["id"] == session))
        .and_then(|p| p["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no proposal of {session}: {list}\n{}", server.log()))
}

fn writes(fake: &FakeApi, path_end: &str) -> usize {
    fake.seen()
        .iter()
        .filter(|s| {
            s.method == "PATCH" && s.path.ends_with(path_end) && !s.query.contains("dryRun")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_kubeconfig_executes_approved_proposals_there() {
    let fake = FakeApi::start().await;
    for name in ["api", "web", "batch"] {
        let mut d = deployment();
        d["metadata"]["name"] = json!(name);
        fake.apply("deployments", d);
    }
    let (llm, script) = mock().await;
    let (dir, m) = manifest_dir();
    let kubeconfig = write_kubeconfig(dir.path(), &fake.url);
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            provider(
                "gpt",
                &format!("type: openai-compatible, baseUrl: '{llm}/v1', defaultModel: m1"),
            ),
            policy(
                "ops",
                "sessions: [ops-*], provider: gpt, proposals: {allowedActions: [restart, scale], \
                 allowedNamespaces: [shop], requireDistinctApprover: false}",
            ),
            policy(
                "hands-off",
                "sessions: [manual-*], provider: gpt, proposals: {allowedActions: [restart], \
                 allowedNamespaces: [shop], execute: false, requireDistinctApprover: false}",
            ),
            format!(
                r#"# The team's own namespace: its sessions' proposals default to it.
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: gpt, namespace: shop}}
spec: {{type: openai-compatible, baseUrl: "{llm}/v1", defaultModel: m1}}
"#
            ),
            r#"apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {name: shop-ops, namespace: shop}
spec:
  sessions: ["shop-*"]
  provider: gpt
  proposals: {allowedActions: [scale], allowedNamespaces: [shop], requireDistinctApprover: false}
"#
            .to_owned(),
        ]),
    )
    .unwrap();
    let server = Server::start_on_cluster(&m, dir.path(), &kubeconfig);
    let client = http_client();
    let propose = |id: &str, action: &str, target: &str, params: Value| {
        push(
            &script,
            tool_calls(&[(
                id,
                "propose_action",
                json!({"action": action, "rationale": "stuck", "params": params,
                    "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": target}}),
            )]),
        );
        push_answer(&script, &["Proposed."]);
    };

    // A restart: pinned and previewed by a dry run when made; approved, it is executed
    // once, and the session, the listing and the audit log say so.
    propose("p1", "restart", "api", json!({}));
    let session = chat_once(&server, json!({"name": "ops-1"}), "restart api").await;
    let id = made_in(&client, &server, &session).await;
    let made = proposal(&client, &server, &id).await;
    assert!(
        server
            .log()
            .contains("approved proposals are executed in the cluster at"),
        "{}",
        server.log()
    );
    assert_eq!(made["status"]["phase"], "Pending", "{made}");
    assert_eq!(made["status"]["preview"]["dryRun"], true, "{made}");
    assert!(
        made["status"]["preview"]["after"]["restartedAt"].is_string(),
        "{made}"
    );
    assert_eq!(made["spec"]["params"]["expectGeneration"], 1, "{made}");
    // The model sees the dry run, and the line that decides it here.
    let told = script
        .seen
        .lock()
        .map(|seen| {
            seen.iter()
                .find_map(|r| tool_result(&r.body, "p1"))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let told: Value = serde_json::from_str(&told).unwrap_or_else(|e| panic!("{e}: {told}"));
    assert_eq!(told["preview"]["dryRun"], true, "{told}");
    assert_eq!(
        told["approveWith"],
        format!("kortex proposals approve {id}"),
        "{told}"
    );
    assert_eq!(
        writes(&fake, "/deployments/api"),
        0,
        "nothing written before approval"
    );
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{id}/approve")))
        .json(&json!({"reason": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let decided: Value = r.json().await.unwrap_or_default();
    assert_eq!(decided["status"]["phase"], "Executing", "{decided}");
    let done = settled(&client, &server, &id).await;
    assert_eq!(done["status"]["phase"], "Succeeded", "{done}");
    assert_eq!(writes(&fake, "/deployments/api"), 1, "executed once");
    let api = fake
        .get("deployments", "shop", "api")
        .expect("no deployment");
    assert!(
        api["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_string(),
        "{api}"
    );
    let told = |e: &Sse| e.event == "proposal.updated" && e.data["phase"] == "Succeeded";
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{session}/events?after=0")))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, |got| got.iter().any(told)).await;
    assert!(events.iter().any(told), "the session is told: {events:?}");
    let audit: Value = get_json(&client, server.url("/api/v1/audit?kind=execution")).await;
    assert_eq!(audit["items"][0]["outcome"], "succeeded", "{audit}");
    assert_eq!(audit["items"][0]["user"], "local", "{audit}");

    // A restart has no inverse: nothing to undo.
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{id}/undo")))
        .send()
        .await
        .unwrap();
    assert_refused(r, 409, "nothing to undo").await;

    // A scale executes and records its inverse; `kortex proposals undo` turns it into a new
    // proposal (once), which, approved, scales back.
    // The target's namespace left to the session's, and a pin the model made up: the
    // proposal names the namespace, and Kortex reads the pin from the target itself.
    let session = chat_with_calls(
        &server,
        &script,
        &[(
            "p4",
            "propose_action",
            json!({"action": "scale", "rationale": "load", "params": {"replicas": 4, "expectGeneration": 99},
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"}}),
        )],
        "Proposed.",
        json!({"name": "shop-1", "namespace": "shop"}),
        "scale api",
    )
    .await;
    let id = made_in(&client, &server, &session).await;
    let made = proposal(&client, &server, &id).await;
    assert_eq!(made["spec"]["target"]["namespace"], "shop", "{made}");
    let generation = fake
        .get("deployments", "shop", "api")
        .map(|d| d["metadata"]["generation"].clone())
        .unwrap_or_default();
    assert_eq!(
        made["spec"]["params"]["expectGeneration"], generation,
        "{made}"
    );
    client
        .post(server.url(&format!("/chat/v1/proposals/{id}/approve")))
        .send()
        .await
        .unwrap();
    let done = settled(&client, &server, &id).await;
    assert_eq!(done["status"]["phase"], "Succeeded", "{done}");
    assert_eq!(done["status"]["undo"]["params"]["replicas"], 2, "{done}");
    let replicas = |f: &FakeApi| {
        f.get("deployments", "shop", "api")
            .map(|d| d["spec"]["replicas"].clone())
            .unwrap_or_default()
    };
    assert_eq!(replicas(&fake), 4);
    let url = server.url("");
    let out = kortex_cli(&["proposals", "undo", &id, "--server", &url], "").await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && stdout.contains("undo-") && stdout.contains("Pending"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{id}/undo")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "asking again returns the first");
    let undo: Value = r.json().await.unwrap_or_default();
    assert_eq!(undo["status"]["phase"], "Pending", "{undo}");
    assert_eq!(undo["spec"]["action"], "scale", "{undo}");
    assert_eq!(undo["status"]["preview"]["after"]["replicas"], 2, "{undo}");
    let undo_id = undo["id"].as_str().unwrap_or_default().to_owned();
    let listed: Value = get_json(&client, server.url("/chat/v1/proposals")).await;
    let undos = listed["items"]
        .as_array()
        .map(|a| a.iter().filter(|p| p["id"] == undo_id.as_str()).count())
        .unwrap_or_default();
    assert_eq!(undos, 1, "{listed}");
    client
        .post(server.url(&format!("/chat/v1/proposals/{undo_id}/approve")))
        .send()
        .await
        .unwrap();
    let done = settled(&client, &server, &undo_id).await;
    assert_eq!(done["status"]["phase"], "Succeeded", "{done}");
    assert_eq!(replicas(&fake), 2);

    // A scale approved after someone else changed the Deployment: what was approved is not
    // what it would do now, so nothing is written.
    propose("p2", "scale", "web", json!({"replicas": 5}));
    let session = chat_once(&server, json!({"name": "ops-2"}), "scale web").await;
    let id = made_in(&client, &server, &session).await;
    assert_eq!(
        proposal(&client, &server, &id).await["spec"]["params"]["expectReplicas"],
        2
    );
    let mut web = fake
        .get("deployments", "shop", "web")
        .expect("no deployment");
    web["spec"]["template"]["spec"]["containers"][0]["image"] = json!("shop/api:5");
    fake.apply("deployments", web);
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{id}/approve")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let done = settled(&client, &server, &id).await;
    assert_eq!(done["status"]["phase"], "Failed", "{done}");
    assert!(
        done["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("changed since the proposal was made")),
        "{done}"
    );
    assert_eq!(writes(&fake, "/deployments/web/scale"), 0);

    // `execute: false`: approved and left for other automation.
    propose("p3", "restart", "batch", json!({}));
    let session = chat_once(&server, json!({"name": "manual-1"}), "restart batch").await;
    let id = made_in(&client, &server, &session).await;
    let r = client
        .post(server.url(&format!("/chat/v1/proposals/{id}/approve")))
        .send()
        .await
        .unwrap();
    let decided: Value = r.json().await.unwrap_or_default();
    assert_eq!(decided["status"]["phase"], "Approved", "{decided}");
    assert!(
        decided["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("execute: false")),
        "{decided}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(writes(&fake, "/deployments/batch"), 0);
}
