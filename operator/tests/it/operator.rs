//! `kortex run` against the fake Kubernetes API server (`support::fake_api`), which speaks
//! the real wire protocol the kube client uses and records every request, so the tests
//! assert the exact writes the operator makes.

use crate::support::chat::{assert_refused, chat_with_calls, post_json, post_message, wait_idle};
use crate::support::fake_api::{
    FakeApi, Seen, base64, condition, incidents_cluster, incidents_policy, phase, proposal_named,
    provider, secret, status_patches, write_kubeconfig_as,
};
use crate::support::net::http_client;
use crate::support::provider::{mock, offered_tools, push, push_answer, tool_calls, tool_result};
use crate::support::server::{
    kubectl_kortex, pending_restarts, start_behind_proxy, start_run, start_run_with,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

/// The whole operator loop from the binary: watches, Secrets read by name, the live
/// configuration, leader election, status written by server-side apply without no-op
/// patches, a broken object reported, a Secret edit followed within seconds, and the Lease
/// released on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_run_reconciles_the_cluster_into_the_live_server() {
    let fake = FakeApi::start().await;
    let (llm, _script) = mock().await;
    fake.apply("secrets", secret(Some("sk-cluster-123")));
    fake.apply("secrets", json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "unrelated", "namespace": "team-a"}, "data": {"x": base64("never-read")}}));
    fake.apply("llmproviders", provider(&llm));
    // A provider naming a Secret its owner did not opt in: Kortex must not read it for them.
    fake.apply(
        "llmproviders",
        json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": "sneaky", "namespace": "team-a"},
        "spec": {"type": "openai-compatible", "baseUrl": format!("{llm}/v1"), "defaultModel": "m1",
            "allowPrivateTargets": true,
            "apiKeySecretRef": {"name": "unrelated", "key": "x"}}}),
    );
    fake.apply("chatpolicies", json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "all", "namespace": "team-a"}, "spec": {"sessions": ["*"], "provider": "gpt"}}));
    // Accepted by a lenient API server, but not by Kortex: reported, not fatal.
    fake.apply(
        "kortextools",
        json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "KortexTool",
        "metadata": {"name": "broken", "namespace": "team-a"},
        "spec": {"description": "x", "http": {"url": "http://x/y", "method": "DELETE"}}}),
    );

    // Ready once every watch listed its objects; the provider is served with its key.
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    let (_, providers) = server.get("/api/v1/llm/providers").await;
    let providers: Value = serde_json::from_str(&providers).unwrap_or_default();
    let gpt = providers["items"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "gpt"))
        .cloned()
        .unwrap_or_else(|| panic!("gpt not served: {providers}"));
    assert_eq!(gpt["available"], true, "{gpt}");
    assert!(!providers.to_string().contains("sk-cluster-123"));

    // Only the referenced Secret's data was read; every other Secret only as metadata.
    let seen = fake.seen();
    let secret_reads: Vec<String> = seen
        .iter()
        .filter(|s| s.path.contains("/secrets"))
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert!(
        secret_reads.contains(&"GET /api/v1/namespaces/team-a/secrets/llm-keys".to_owned()),
        "{secret_reads:?}"
    );
    assert!(
        !secret_reads.iter().any(|r| r.ends_with("/unrelated")),
        "{secret_reads:?}"
    );
    let collections: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.path == "/api/v1/secrets" || s.path == "/api/v1/namespaces/kortex/secrets")
        .collect();
    assert!(collections.len() >= 2, "{secret_reads:?}");
    assert!(
        collections
            .iter()
            .all(|s| s.accept.contains("as=PartialObjectMetadata")),
        "Secrets are listed and watched as metadata only: {collections:?}"
    );
    assert!(
        collections
            .iter()
            .filter(|s| s.path.contains("/namespaces/kortex/"))
            .all(|s| s.query.contains("labelSelector=kortex.dev%2Fcredentials")),
        "{collections:?}"
    );

    // The leader Lease, then statuses by server-side apply, one field manager.
    fake.until("the Lease", |f| {
        f.get("leases", "kortex", "kortex-leader")
            .is_some_and(|l| l["spec"]["holderIdentity"] == "pod-a")
    })
    .await;
    fake.until("gpt's status", |f| {
        condition(&f.get("llmproviders", "team-a", "gpt"), "Ready")
            == Some(("True".into(), "Available".into()))
    })
    .await;
    let patch = status_patches(&fake, "llmproviders", "gpt")
        .into_iter()
        .next()
        .expect("no status patch");
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert!(
        patch.query.contains("fieldManager=kortex") && patch.query.contains("force=true"),
        "{}",
        patch.query
    );
    assert_eq!(patch.body["apiVersion"], "kortex.dev/v1alpha1");
    assert_eq!(patch.body["kind"], "LLMProvider");
    let gpt_status = &patch.body["status"];
    assert_eq!(gpt_status["observedGeneration"], 1);
    assert!(
        gpt_status["secretHash"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{gpt_status}"
    );
    fake.until("the policy's status", |f| {
        condition(&f.get("chatpolicies", "team-a", "all"), "Ready")
            .is_some_and(|(s, _)| s == "True")
    })
    .await;
    fake.until("sneaky's status", |f| {
        condition(&f.get("llmproviders", "team-a", "sneaky"), "SecretResolved")
            == Some(("False".into(), "SecretNotOptedIn".into()))
    })
    .await;
    assert!(
        !fake
            .seen()
            .iter()
            .any(|s| s.method == "GET" && s.path.ends_with("/secrets/unrelated")),
        "a Secret that did not opt in is never read"
    );
    fake.until("the broken tool's status", |f| {
        condition(&f.get("kortextools", "team-a", "broken"), "Ready")
            == Some(("False".into(), "InvalidManifest".into()))
    })
    .await;
    let broken = fake
        .get("kortextools", "team-a", "broken")
        .unwrap_or_default();
    assert!(
        broken["status"]["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.http.method"),
        "{broken}"
    );

    // Converged: no more status writes while nothing changes.
    let before = status_patches(&fake, "llmproviders", "gpt").len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status_patches(&fake, "llmproviders", "gpt").len(),
        before,
        "no-op patches"
    );

    // A Secret edit reaches the server within seconds: the key is gone, so is the provider.
    fake.apply("secrets", secret(None));
    fake.until("SecretResolved=False", |f| {
        condition(&f.get("llmproviders", "team-a", "gpt"), "SecretResolved")
            .is_some_and(|(s, r)| s == "False" && r == "SecretKeyNotFound")
    })
    .await;
    let (_, providers) = server.get("/api/v1/llm/providers").await;
    assert!(providers.contains("\"available\":false"), "{providers}");
    // And back.
    fake.apply("secrets", secret(Some("sk-cluster-456")));
    fake.until("SecretResolved=True", |f| {
        condition(&f.get("llmproviders", "team-a", "gpt"), "SecretResolved")
            .is_some_and(|(s, _)| s == "True")
    })
    .await;
    let events: Vec<Seen> = fake
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("/events") && s.method == "POST")
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.body["regarding"]["name"] == "gpt" && e.body["type"] == "Warning"),
        "an Event when gpt stopped being Ready: {events:?}"
    );

    // SIGTERM: the Lease is handed back so another replica takes over at once.
    assert!(server.terminate().success());
    let lease = fake
        .get("leases", "kortex", "kortex-leader")
        .unwrap_or_default();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease}");
}

/// Two replicas campaign for one Lease: exactly one leads; when it stops, it hands the
/// Lease back and the other leads at once; when the API server takes the Lease away
/// (another writer), the old leader steps down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_replica_leads_and_hands_over_on_stop() {
    use kortex::operator::lease::{LeaseConfig, run};
    let fake = FakeApi::start().await;
    let config = kube::Config::new(fake.url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let settings = |identity: &str| LeaseConfig {
        duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("kortex", identity)
    };
    let (a_tx, mut a) = tokio::sync::watch::channel(false);
    let (b_tx, b) = tokio::sync::watch::channel(false);
    let (stop_a_tx, stop_a) = tokio::sync::watch::channel(false);
    let (stop_b_tx, stop_b) = tokio::sync::watch::channel(false);
    let task_a = tokio::spawn(run(client.clone(), settings("pod-a"), a_tx, stop_a));
    tokio::time::timeout(Duration::from_secs(10), a.wait_for(|l| *l))
        .await
        .expect("pod-a never led")
        .unwrap();
    let task_b = tokio::spawn(run(client.clone(), settings("pod-b"), b_tx, stop_b));
    // pod-b keeps following while pod-a renews.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(*a.borrow() && !*b.borrow());

    // pod-a stops: it releases the Lease, and pod-b leads well before it would expire.
    let stopped = tokio::time::Instant::now();
    let _ = stop_a_tx.send(true);
    let _ = task_a.await;
    assert!(!*a.borrow());
    let mut b_watch = b.clone();
    tokio::time::timeout(Duration::from_secs(10), b_watch.wait_for(|l| *l))
        .await
        .expect("pod-b never took over")
        .unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "{:?}",
        stopped.elapsed()
    );
    let lease = fake
        .get("leases", "kortex", "kortex-leader")
        .unwrap_or_default();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");

    // Someone else writes the Lease (another operator instance won a race): pod-b sees it
    // is no longer the holder and steps down.
    let mut taken = lease.clone();
    taken["spec"]["holderIdentity"] = json!("pod-z");
    fake.apply("leases", taken);
    tokio::time::timeout(Duration::from_secs(10), b_watch.wait_for(|l| !*l))
        .await
        .expect("pod-b kept leading")
        .unwrap();
    let _ = stop_b_tx.send(true);
    let _ = task_b.await;
}

/// A model's proposal becomes an ActionProposal with a dry-run preview; a decision written
/// by someone the cluster allows to restart the Deployment executes it once (the
/// Deployment restarted, `Succeeded`, an Event, the database mirror and the session told);
/// a decision by someone who may not do it themselves fails without touching anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_are_created_decided_and_executed_in_the_cluster() {
    let (fake, llm, script) = incidents_cluster(json!({"allowedActions": ["restart", "scale"],
            "allowedNamespaces": ["shop"], "expireAfter": "10m"}))
    .await;
    fake.allow("bob");
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    let client = http_client();

    let target =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"});
    for (call, action, params) in [
        ("p1", "restart", json!({})),
        ("p2", "scale", json!({"replicas": 5})),
    ] {
        push(
            &script,
            tool_calls(&[(
                call,
                "propose_action",
                json!({"action": action, "target": target,
            "params": params, "rationale": "pods are stuck after the config change"}),
            )]),
        );
        push_answer(&script, &["Proposed."]);
    }
    let session = post_json(
        &client,
        server.url("/chat/v1/sessions"),
        &json!({"name": "incident-9", "namespace": "team-a"}),
    )
    .await;
    let id = session["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{session}"))
        .to_owned();
    for content in ["api is stuck, restart it", "and scale it to 5"] {
        post_message(&server, &id, content).await;
        wait_idle(&client, &server.url(&format!("/chat/v1/sessions/{id}"))).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // On loopback the user has no Kubernetes identity: with runToolsAsUser (the default)
    // the Kubernetes tools are not offered at all.
    let offered = offered_tools(&script);
    assert!(
        offered.contains("propose_action") && !offered.contains("get_logs"),
        "{offered}"
    );

    // The objects, in the target's namespace, with session, model, preview and expiry.
    let restart = proposal_named(&fake, "restart-api-")
        .unwrap_or_else(|| panic!("no restart proposal:\n{}", server.log()));
    let name = restart["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(restart["metadata"]["namespace"], "shop");
    assert_eq!(
        restart["metadata"]["labels"]["kortex.dev/session"],
        id.as_str()
    );
    assert_eq!(
        restart["metadata"]["labels"]["kortex.dev/require-distinct-approver"],
        "true"
    );
    assert_eq!(restart["spec"]["session"]["user"], "local");
    assert_eq!(restart["spec"]["model"]["provider"], "gpt");
    assert_eq!(restart["status"]["phase"], "Pending");
    assert!(restart["status"]["expiresAt"].is_string(), "{restart}");
    assert_eq!(restart["status"]["preview"]["dryRun"], true, "{restart}");
    assert!(
        restart["status"]["preview"]["after"]["restartedAt"].is_string(),
        "{restart}"
    );
    // The preview was a dry run: the Deployment is untouched so far.
    let api = fake.get("deployments", "shop", "api").unwrap_or_default();
    assert!(
        api["spec"]["template"]["metadata"]["annotations"].is_null(),
        "{api}"
    );
    let scale = proposal_named(&fake, "scale-api-").expect("no scale proposal");
    let scale_name = scale["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        scale["status"]["preview"]["before"]["replicas"], 2,
        "{scale}"
    );
    assert_eq!(
        scale["status"]["preview"]["after"]["replicas"], 5,
        "{scale}"
    );

    // `kubectl kortex list` shows them; bob approves the restart with `kubectl kortex`,
    // which waits for the execution and reports it.
    let bob = write_kubeconfig_as(dir.path(), &fake.url, "bob-token", "bob");
    let (ok, out) = kubectl_kortex(&bob, &["list"]).await;
    assert!(
        ok && out.contains(&name) && out.contains("Deployment/api") && out.contains("Pending"),
        "{out}"
    );
    let (ok, out) = kubectl_kortex(&bob, &["approve", &name, "--reason", "go"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("{name}: approved by bob")) && out.contains("Succeeded"),
        "{out}"
    );
    fake.until("the restart to succeed", |f| phase(f, &name) == "Succeeded")
        .await;
    let decision = &fake
        .get("actionproposals", "shop", &name)
        .unwrap_or_default()["spec"]["decision"];
    assert_eq!(
        decision,
        &json!({"verdict": "Approve", "by": "bob", "groups": ["system:authenticated", "sre"], "reason": "go"})
    );
    // Decided is final.
    let (ok, out) = kubectl_kortex(&bob, &["reject", &name]).await;
    assert!(!ok && out.contains("already decided"), "{out}");
    let api = fake.get("deployments", "shop", "api").unwrap_or_default();
    assert!(
        api["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_string(),
        "{api}"
    );
    let seen = fake.seen();
    let reviews: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.path.ends_with("/subjectaccessreviews"))
        .collect();
    assert_eq!(reviews[0].body["spec"]["user"], "bob");
    assert_eq!(
        reviews[0].body["spec"]["groups"],
        json!(["system:authenticated", "sre"])
    );
    assert_eq!(
        reviews[0].body["spec"]["resourceAttributes"]["verb"],
        "patch"
    );
    assert_eq!(
        reviews[0].body["spec"]["resourceAttributes"]["resource"],
        "deployments"
    );
    // Executing was written conditioned on the resourceVersion read, then the result.
    let writes: Vec<&Seen> = seen
        .iter()
        .filter(|s| {
            s.method == "PATCH" && s.path.ends_with(&format!("/actionproposals/{name}/status"))
        })
        .collect();
    let executing = writes
        .iter()
        .find(|w| w.body["status"]["phase"] == "Executing")
        .unwrap_or_else(|| panic!("{writes:?}"));
    assert!(
        executing.body["metadata"]["resourceVersion"].is_string(),
        "{:?}",
        executing.body
    );
    let real_patches = seen
        .iter()
        .filter(|s| {
            s.method == "PATCH" && s.path == "/apis/apps/v1/namespaces/shop/deployments/api"
        })
        .filter(|s| !s.query.contains("dryRun"))
        .count();
    assert_eq!(real_patches, 1, "executed exactly once");
    assert!(
        seen.iter().any(|s| s.path.ends_with("/events")
            && s.body["reason"] == "Executed"
            && s.body["regarding"]["name"] == name.as_str()),
        "an Event on the proposal"
    );

    // carol may not scale it herself: refused, the Deployment keeps 2 replicas.
    let carol = write_kubeconfig_as(dir.path(), &fake.url, "carol-token", "carol");
    let (ok, out) = kubectl_kortex(&carol, &["approve", &scale_name]).await;
    assert!(!ok && out.contains("Failed"), "{out}");
    fake.until("the scale to fail", |f| phase(f, &scale_name) == "Failed")
        .await;
    let failed = fake
        .get("actionproposals", "shop", &scale_name)
        .unwrap_or_default();
    assert!(
        failed["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("carol may not patch deployments/scale"),
        "{failed}"
    );
    assert_eq!(
        fake.get("deployments", "shop", "api").unwrap_or_default()["spec"]["replicas"],
        2
    );

    // A scale bob approves is undone on request: a new proposal, approved separately.
    push(
        &script,
        tool_calls(&[(
            "p3",
            "propose_action",
            json!({"action": "scale", "target": target,
        "params": {"replicas": 3}, "rationale": "more headroom"}),
        )]),
    );
    push_answer(&script, &["Proposed."]);
    post_message(&server, &id, "give it 3 replicas").await;
    fake.until("a third proposal", |f| f.list("actionproposals").len() == 3)
        .await;
    let third = fake
        .list("actionproposals")
        .into_iter()
        .find(|p| p["spec"]["params"]["replicas"] == 3)
        .unwrap_or_default();
    let third_name = third["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    fake.until("its status", |f| phase(f, &third_name) == "Pending")
        .await;
    let (ok, out) = kubectl_kortex(&bob, &["approve", &third_name]).await;
    assert!(
        ok && out.contains("scaled Deployment shop/api from 2 to 3 replicas"),
        "{out}"
    );
    assert_eq!(
        fake.get("deployments", "shop", "api").unwrap_or_default()["spec"]["replicas"],
        3
    );
    let done = fake
        .get("actionproposals", "shop", &third_name)
        .unwrap_or_default();
    assert_eq!(
        done["status"]["undo"]["params"],
        json!({"replicas": 2}),
        "{done}"
    );
    let (ok, out) = kubectl_kortex(&bob, &["undo", &name]).await;
    assert!(
        !ok && out.contains("nothing to undo"),
        "a restart cannot be undone: {out}"
    );
    let (ok, out) = kubectl_kortex(&bob, &["undo", &third_name]).await;
    assert!(ok, "{out}");
    fake.until("the undo proposal", |f| {
        f.list("actionproposals").len() == 4
    })
    .await;
    let undo = fake
        .list("actionproposals")
        .into_iter()
        .find(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("undo-"))
        })
        .unwrap_or_default();
    assert_eq!(undo["spec"]["action"], "scale");
    // The inverse, pinned to the Deployment as it is now (3 replicas).
    assert_eq!(undo["spec"]["params"]["replicas"], 2, "{undo}");
    assert_eq!(undo["spec"]["params"]["expectReplicas"], 3, "{undo}");
    assert!(
        undo["spec"]["params"]["expectGeneration"].is_i64(),
        "{undo}"
    );
    assert!(
        undo["spec"]["decision"].is_null(),
        "needs its own approval: {undo}"
    );
    // The original is linked to its undo right after the undo is created.
    fake.until("the undo link on the original", |f| {
        f.get("actionproposals", "shop", &third_name)
            .is_some_and(|p| !p["metadata"]["annotations"]["kortex.dev/undo-proposal"].is_null())
    })
    .await;
    let original = fake
        .get("actionproposals", "shop", &third_name)
        .unwrap_or_default();
    assert_eq!(
        original["metadata"]["annotations"]["kortex.dev/undo-proposal"],
        undo["metadata"]["name"]
    );

    // Someone changes the Deployment before the undo is approved: what was approved is no
    // longer what it would do, so nothing is done.
    let undo_name = undo["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    fake.until("the undo's status", |f| phase(f, &undo_name) == "Pending")
        .await;
    let mut moved = fake.get("deployments", "shop", "api").unwrap_or_default();
    moved["spec"]["replicas"] = json!(5);
    fake.apply("deployments", moved);
    let (ok, out) = kubectl_kortex(&bob, &["approve", &undo_name]).await;
    assert!(!ok && out.contains("Failed"), "{out}");
    let failed = fake
        .get("actionproposals", "shop", &undo_name)
        .unwrap_or_default();
    assert!(
        failed["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("changed since the proposal was made"),
        "{failed}"
    );
    assert_eq!(
        fake.get("deployments", "shop", "api").unwrap_or_default()["spec"]["replicas"],
        5,
        "untouched"
    );

    // The database mirror and the session saw every change.
    let (_, listed) = server.get("/chat/v1/proposals").await;
    let listed: Value = serde_json::from_str(&listed).unwrap_or_default();
    let phases: Vec<(String, String)> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["status"]["phase"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        phases.contains(&(name.clone(), "Succeeded".into())),
        "{listed}"
    );
    assert!(
        phases.contains(&(scale_name.clone(), "Failed".into())),
        "{listed}"
    );
    let events = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    // The stream follows live after the replay: read what arrives within the timeout.
    let mut text = String::new();
    let mut body = events.bytes_stream();
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(Duration::from_millis(500), body.next()).await
    {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        text.contains("proposal.updated")
            && text.contains("Succeeded")
            && text.contains("Executing"),
        "{text}"
    );
    drop(body);
    assert!(server.terminate().success());
}

/// `--auth kubernetes`: the chat API takes Kubernetes bearer tokens (TokenReview), lets a
/// user use a ChatPolicy only with RBAC's `use` on it (SubjectAccessReview), and writes a
/// decision made through the API with the caller's own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_takes_kubernetes_tokens_and_decides_as_the_caller() {
    let (fake, llm, script) = incidents_cluster(
        json!({"allowedActions": ["restart"], "allowedNamespaces": ["shop"],
            "requireDistinctApprover": true}),
    )
    .await;
    fake.allow("alice");
    let dir = tempfile::tempdir().unwrap();
    let server = start_run_with(&fake, dir.path(), &llm, &["--auth", "kubernetes"]).await;
    let client = http_client();
    let call = |method: reqwest::Method, path: &str, token: Option<&str>, body: Value| {
        let mut req = client.request(method, server.url(path)).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let session = json!({"name": "incident-3", "namespace": "team-a"});
    let r = call(
        reqwest::Method::POST,
        "/chat/v1/sessions",
        None,
        session.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = call(
        reqwest::Method::POST,
        "/chat/v1/sessions",
        Some("forged"),
        session.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // dave has a valid token but no right to use the policy.
    let r = call(
        reqwest::Method::POST,
        "/chat/v1/sessions",
        Some("dave-token"),
        session.clone(),
    )
    .await
    .unwrap();
    assert_refused(r, 403, "may not use ChatPolicy team-a/incidents").await;
    let r = call(
        reqwest::Method::POST,
        "/chat/v1/sessions",
        Some("alice-token"),
        session,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap_or_default();
    assert_eq!(created["user"], "alice");
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    let reviews: Vec<Seen> = fake
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("/subjectaccessreviews"))
        .collect();
    let last = &reviews.last().expect("no review").body["spec"];
    assert_eq!(last["user"], "alice");
    assert_eq!(
        last["resourceAttributes"],
        json!({"namespace": "team-a", "verb": "use", "group": "kortex.dev", "resource": "chatpolicies", "name": "incidents"})
    );

    // Reports about everyone are for whom RBAC lets get /kortex/usage: dave may not.
    let r = call(
        reqwest::Method::GET,
        "/api/v1/usage",
        Some("dave-token"),
        Value::Null,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = call(
        reqwest::Method::GET,
        "/api/v1/usage",
        Some("alice-token"),
        Value::Null,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let review = fake
        .seen()
        .into_iter()
        .rfind(|s| s.path.ends_with("/subjectaccessreviews"))
        .map(|s| s.body["spec"]["nonResourceAttributes"].clone())
        .unwrap_or_default();
    assert_eq!(review, json!({"path": "/kortex/usage", "verb": "get"}));

    // alice's model reads the Deployment: with runToolsAsUser (the default), as alice.
    push(
        &script,
        tool_calls(&[(
            "r1",
            "get_resource",
            json!({"kind": "Deployment", "namespace": "shop", "name": "api"}),
        )]),
    );
    push_answer(&script, &["It has 2 replicas."]);
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/messages"),
        Some("alice-token"),
        json!({"content": "how is api?"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    fake.until("the read as alice", |f| {
        f.seen().iter().any(|s| {
            s.method == "GET"
                && s.path == "/apis/apps/v1/namespaces/shop/deployments/api"
                && s.token == "alice-token"
        })
    })
    .await;
    let offered = offered_tools(&script);
    assert!(
        offered.contains("get_logs") && offered.contains("propose_action"),
        "{offered}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    // alice shares the session to continue with dave and carol. Whoever posts is checked
    // for the right to use the policy (dave has none), and the run reads the cluster with
    // the poster's own token, not the owner's.
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/share"),
        Some("alice-token"),
        json!({"users": ["dave", "carol"], "access": "continue"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/messages"),
        Some("dave-token"),
        json!({"content": "and now?"}),
    )
    .await
    .unwrap();
    assert_refused(r, 403, "dave may not use ChatPolicy team-a/incidents").await;
    fake.allow("carol");
    push(
        &script,
        tool_calls(&[(
            "r2",
            "get_resource",
            json!({"kind": "Deployment", "namespace": "shop", "name": "api"}),
        )]),
    );
    push_answer(&script, &["Still 2 replicas."]);
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/messages"),
        Some("carol-token"),
        json!({"content": "and now?"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    fake.until("the read as carol", |f| {
        f.seen().iter().any(|s| {
            s.method == "GET"
                && s.path == "/apis/apps/v1/namespaces/shop/deployments/api"
                && s.token == "carol-token"
        })
    })
    .await;
    let review = fake
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("/subjectaccessreviews"))
        .rfind(|s| s.body["spec"]["user"] == "carol")
        .map(|s| s.body["spec"]["resourceAttributes"].clone())
        .unwrap_or_default();
    assert_eq!(
        review,
        json!({"namespace": "team-a", "verb": "use", "group": "kortex.dev", "resource": "chatpolicies", "name": "incidents"})
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(
            reqwest::Method::GET,
            &format!("/chat/v1/sessions/{id}"),
            Some("alice-token"),
            Value::Null,
        )
        .await
        .unwrap();
        let s: Value = r.json().await.unwrap_or_default();
        if s["status"] == "idle" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "carol's run did not end: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // alice's model proposes a restart.
    push(
        &script,
        tool_calls(&[(
            "p1",
            "propose_action",
            json!({"action": "restart",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
        "rationale": "stuck"}),
        )]),
    );
    push_answer(&script, &["Proposed."]);
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/sessions/{id}/messages"),
        Some("alice-token"),
        json!({"content": "restart api"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let proposal = loop {
        let r = call(
            reqwest::Method::GET,
            "/chat/v1/proposals",
            Some("alice-token"),
            Value::Null,
        )
        .await
        .unwrap();
        let list: Value = r.json().await.unwrap_or_default();
        if let Some(p) = list["items"].as_array().and_then(|a| a.first()).cloned() {
            break p;
        }
        assert!(tokio::time::Instant::now() < deadline, "no proposal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pid = proposal["id"].as_str().unwrap_or_default().to_owned();
    let name = proposal["name"].as_str().unwrap_or_default().to_owned();
    fake.until("its status", |f| phase(f, &name) == "Pending")
        .await;

    // dave, signed in but without the right to read ActionProposals in shop, is not shown
    // alice's proposal (its rationale and preview), though the policy has no approverGroups.
    let r = call(
        reqwest::Method::GET,
        "/chat/v1/proposals",
        Some("dave-token"),
        Value::Null,
    )
    .await
    .unwrap();
    let list: Value = r.json().await.unwrap_or_default();
    assert_eq!(list["items"], json!([]), "{list}");
    let review = fake
        .seen()
        .into_iter()
        .rfind(|s| s.path.ends_with("/subjectaccessreviews"))
        .map(|s| s.body["spec"].clone())
        .unwrap_or_default();
    assert_eq!(review["user"], "dave");
    assert_eq!(
        review["resourceAttributes"],
        json!({"namespace": "shop", "verb": "get", "group": "kortex.dev", "resource": "actionproposals"})
    );

    // An API key bot or anyone without a Kubernetes identity cannot decide; bob decides
    // through the API, and the decision is written with bob's own token.
    let r = call(
        reqwest::Method::POST,
        &format!("/chat/v1/proposals/{pid}/approve"),
        Some("bob-token"),
        json!({"reason": "ok"}),
    )
    .await
    .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}");
    let patch = fake
        .seen()
        .into_iter()
        .find(|s| {
            s.method == "PATCH"
                && s.path
                    == format!("/apis/kortex.dev/v1alpha1/namespaces/shop/actionproposals/{name}")
        })
        .expect("no decision patch");
    assert_eq!(patch.token, "bob-token", "written as bob, not as Kortex");
    assert_eq!(patch.body["spec"]["decision"]["by"], "bob");
    assert_eq!(patch.body["spec"]["decision"]["reason"], "ok");
    assert!(server.terminate().success());
}

/// `--auth-proxy-header`: identity headers count only from the proxy's own network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticating_proxy_is_trusted_only_from_its_network() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (llm, _script) = mock().await;
    let client = http_client();
    for (from, expected) in [("10.9.0.0/16", 401), ("127.0.0.1/32", 201)] {
        let fake = FakeApi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let server = start_behind_proxy(&fake, dir.path(), &llm, &["erin"], from, &[]).await;
        let r = client
            .post(server.url("/chat/v1/sessions"))
            .header("X-Forwarded-User", "erin")
            .header("X-Forwarded-Groups", "sre, oncall")
            .json(&json!({"name": "incident-1", "namespace": "team-a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), expected, "from {from}");
        if expected == 201 {
            let s: Value = r.json().await.unwrap_or_default();
            assert_eq!(s["user"], "erin");
            let review = fake
                .seen()
                .into_iter()
                .rfind(|s| s.path.ends_with("/subjectaccessreviews"))
                .expect("no review");
            assert_eq!(review.body["spec"]["groups"], json!(["sre", "oncall"]));
        }
        assert!(server.terminate().success());
    }
}

/// Without the admission policy that authenticates decisions (here: its binding deleted),
/// a decision cannot be trusted: the approved proposal stops at `Approved`, saying why,
/// nothing is executed (not even the SubjectAccessReview is asked), and
/// `kortex_admission_policy_enforced` is 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_admission_policy_approved_proposals_are_not_executed() {
    let fake = FakeApi::start().await;
    fake.remove(
        "validatingadmissionpolicybindings",
        None,
        "kortex-actionproposals",
    );
    let dir = tempfile::tempdir().unwrap();
    let (server, names) = pending_restarts(&fake, dir.path(), &["api"]).await;
    let name = names.concat();

    let bob = write_kubeconfig_as(dir.path(), &fake.url, "bob-token", "bob");
    let (ok, out) = kubectl_kortex(&bob, &["approve", &name, "--no-wait"]).await;
    assert!(ok, "{out}");
    fake.until("Approved", |f| phase(f, &name) == "Approved")
        .await;
    let p = fake
        .get("actionproposals", "shop", &name)
        .unwrap_or_default();
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("approved by bob; not executed: the admission policy that authenticates decisions is not enforced")
            && message.contains("kortex-actionproposals has no ValidatingAdmissionPolicyBinding"),
        "{message}"
    );
    assert_eq!(
        condition(&Some(p.clone()), "Executing"),
        Some(("False".into(), "AdmissionPolicyNotEnforced".into())),
        "{p}"
    );
    // Nothing was done, and nobody's rights were even looked up.
    let api = fake.get("deployments", "shop", "api").unwrap_or_default();
    assert!(
        api["spec"]["template"]["metadata"]["annotations"].is_null(),
        "{api}"
    );
    assert!(
        !fake
            .seen()
            .iter()
            .any(|s| s.path.ends_with("/subjectaccessreviews")),
        "no SubjectAccessReview for an untrusted decision"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("kortex_admission_policy_enforced 0"),
        "{metrics}"
    );
    assert!(
        server
            .log()
            .contains("approved proposals will not be executed"),
        "{}",
        server.log()
    );
}

/// One Kubernetes write that never answers holds up neither another proposal's execution
/// nor its status, and the pod stays live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_execution_holds_up_no_other_proposal() {
    let fake = FakeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, names) = pending_restarts(&fake, dir.path(), &["stuck", "api"]).await;
    let (stuck, api) = (names[0].clone(), names[1].clone());
    // The stuck Deployment's write never answers (a wedged webhook, say).
    fake.hang("/apis/apps/v1/namespaces/shop/deployments/stuck");
    let bob = write_kubeconfig_as(dir.path(), &fake.url, "bob-token", "bob");
    let (ok, out) = kubectl_kortex(&bob, &["approve", &stuck, "--no-wait"]).await;
    assert!(ok, "{out}");
    fake.until("the hung write", |f| {
        f.seen().iter().any(|s| {
            s.method == "PATCH"
                && s.path == "/apis/apps/v1/namespaces/shop/deployments/stuck"
                && !s.query.contains("dryRun")
        })
    })
    .await;
    let (ok, out) = kubectl_kortex(&bob, &["approve", &api, "--no-wait"]).await;
    assert!(ok, "{out}");
    // The other proposal executes and its status is written while the first hangs.
    fake.until("api Succeeded", |f| phase(f, &api) == "Succeeded")
        .await;
    let restarted = fake.get("deployments", "shop", "api").unwrap_or_default();
    assert!(
        !restarted["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_null(),
        "{restarted}"
    );
    assert_ne!(phase(&fake, &stuck), "Succeeded");
    // The leader loop keeps running: the pod is live.
    let (code, body) = server.get("/healthz").await;
    assert_eq!(code, 200, "{body}");
}

/// The admission policy cannot be read for a while (the API server fails those reads): an
/// approved proposal waits instead of ending as "not executed", and executes once the
/// policy can be checked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_check_that_fails_for_a_while_delays_an_execution_not_ends_it() {
    const POLICIES: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
    let fake = FakeApi::start().await;
    fake.fail(POLICIES, true);
    let dir = tempfile::tempdir().unwrap();
    let (server, names) = pending_restarts(&fake, dir.path(), &["api"]).await;
    let name = names.concat();
    let bob = write_kubeconfig_as(dir.path(), &fake.url, "bob-token", "bob");
    let (ok, out) = kubectl_kortex(&bob, &["approve", &name, "--no-wait"]).await;
    assert!(ok, "{out}");
    // The leader tries, and fails to check, more than once after the decision.
    fake.until("checks after the decision", |f| {
        let seen = f.seen();
        let decided = seen.iter().position(|s| {
            s.method == "PATCH" && s.path.ends_with(&format!("/actionproposals/{name}"))
        });
        decided.is_some_and(|d| {
            seen[d..]
                .iter()
                .filter(|s| s.method == "GET" && s.path == POLICIES)
                .count()
                >= 2
        })
    })
    .await;
    let p = fake
        .get("actionproposals", "shop", &name)
        .unwrap_or_default();
    assert!(
        !p["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not executed"),
        "a passing fault must not end the proposal: {p}"
    );
    fake.fail(POLICIES, false);
    fake.until("Succeeded", |f| phase(f, &name) == "Succeeded")
        .await;
    drop(server);
}

/// A proposal whose target cannot be read is not made (it could never be executed, and an
/// approver would decide it in vain): the model is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_for_a_target_that_cannot_be_read_is_not_made() {
    let fake = FakeApi::start().await;
    let (llm, script) = mock().await;
    fake.apply(
        "chatpolicies",
        incidents_policy(json!({"allowedActions": ["restart"], "allowedNamespaces": ["shop"]})),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    chat_with_calls(
        &server,
        &script,
        &[(
            "p1",
            "propose_action",
            json!({"action": "restart", "rationale": "stuck",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "ghost"}}),
        )],
        "It does not exist.",
        json!({"name": "incident-12", "namespace": "team-a"}),
        "restart ghost",
    )
    .await;
    let result = script
        .requests()
        .iter()
        .find_map(|s| tool_result(&s.body, "p1"))
        .unwrap_or_default();
    assert!(
        result.contains("cannot propose to restart Deployment shop/ghost"),
        "{result}"
    );
    assert!(fake.list("actionproposals").is_empty());
}
