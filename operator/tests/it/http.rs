//! The HTTP API in-process (axum `oneshot`, `support::app`), over a real manifest folder
//! (`support::app::MANIFESTS`) and SQLite.

use crate::support::app::{Harness, call, harness};
use crate::support::chat::{item_condition, listed};
use crate::support::db::{proposal, sqlite};
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use kortex::http::auth::AuthMode;
use kortex::http::{AppState, router};
use kortex::live;
use kortex::metrics::Metrics;
use kortex::source::ManifestSource;
use serde_json::Value;
use std::sync::Arc;

fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap()
}

/// A request with a chat key (`Bearer {key}`), and a JSON body when given.
fn request_as(key: &str, method: &str, path: &str, body: Option<Value>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "kortex.example")
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |v| Body::from(v.to_string())))
        .unwrap()
}

/// A Pending restart proposal `id` of `user` under the policy `team-a/default`, stored.
async fn pending_proposal(
    h: &Harness,
    id: &str,
    user: &str,
    session_id: Option<String>,
    rationale: &str,
) {
    let record = kortex::store::ProposalRecord {
        id: id.into(),
        namespace: "team-a".into(),
        session_name: "incident-9".into(),
        policy: Some("team-a/default".into()),
        rationale: rationale.into(),
        reversible: None,
        ..proposal(
            session_id.as_deref(),
            user,
            &format!("restart-api-{id}"),
            "Pending",
        )
    };
    h.db.store.insert_proposal(&record).await.unwrap();
}

/// The `error.message` of a JSON error body ("" when there is none).
fn error_message(body: &str) -> String {
    json(body)["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test]
async fn providers_list_conditions_and_never_secrets() {
    let h = harness(AuthMode::Loopback).await;
    let (status, _, body) = call(&h.app, get("/api/v1/llm/providers")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains("TOPSECRET"), "secret value leaked: {body}");
    assert!(
        !body.contains("literal-header-value"),
        "header values are not listed: {body}"
    );
    let list = json(&body);
    let anthropic = listed(&list, "anthropic");
    assert_eq!(anthropic["available"], true);
    assert_eq!(anthropic["apiKeySecretRef"]["key"], "anthropic");
    assert_eq!(anthropic["source"]["document"], 3);
    let openai = listed(&list, "openai");
    assert_eq!(openai["available"], false);
    let ready = item_condition(openai, "SecretResolved");
    assert_eq!(ready["reason"], "SecretNotFound");
    assert_eq!(
        ready["message"],
        "secret missing key openai: Secret missing not found in namespace default"
    );
    // The broken document is listed, unavailable, with file, document and field.
    let broken = listed(&list, "broken");
    assert_eq!(broken["available"], false);
    let message = broken["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("all.yaml:")
            && message.contains("document 5")
            && message.contains("spec.type: unknown variant `azure`"),
        "{message}"
    );

    let (_, _, body) = call(&h.app, get("/api/v1/llm/providers?namespace=team-a")).await;
    assert_eq!(json(&body)["items"], serde_json::json!([]));
}

#[tokio::test]
async fn policies_tools_and_manifest_problems() {
    let h = harness(AuthMode::Loopback).await;
    let (status, _, body) = call(&h.app, get("/api/v1/policies")).await;
    assert_eq!(status, StatusCode::OK);
    let policy = listed(&json(&body), "default").clone();
    assert_eq!(policy["namespace"], "team-a");
    assert_eq!(policy["conditions"][0]["reason"], "ProviderNotFound");
    assert_eq!(
        policy["conditions"][0]["message"],
        "LLMProvider nope not found in namespace team-a"
    );
    let (_, _, body) = call(&h.app, get("/api/v1/tools")).await;
    assert_eq!(json(&body)["items"], serde_json::json!([]));
    let (_, _, body) = call(&h.app, get("/api/v1/manifests")).await;
    let m = json(&body);
    assert_eq!(m["errors"], 1);
    assert_eq!(m["items"][0]["field"], "spec.type");
    assert_eq!(m["items"][0]["severity"], "error");
}

#[tokio::test]
async fn health_readiness_metrics_and_json_errors() {
    let h = harness(AuthMode::Loopback).await;
    let (status, _, body) = call(&h.app, get("/healthz")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let (status, _, body) = call(&h.app, get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["checks"]["database"], "ok");
    let _ = call(&h.app, get("/api/v1/tools")).await;
    let (status, headers, body) = call(&h.app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap_or_default()
            .starts_with("application/openmetrics-text")
    );
    for needle in [
        "kortex_build_info{version=\"",
        "kortex_config_reloads_total{result=\"error\"} 1",
        "kortex_config_errors 1",
        "kortex_config_objects{kind=\"LLMProvider\",available=\"true\"} 1",
        "kortex_http_requests_total{method=\"GET\",route=\"/api/v1/tools\",status=\"200\"} 1",
    ] {
        assert!(body.contains(needle), "missing {needle} in\n{body}");
    }
    let (status, _, body) = call(&h.app, get("/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&body)["error"]["code"], "not_found");
    let post = Request::post("/api/v1/tools")
        .header(header::HOST, "localhost")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&h.app, post).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json(&body)["error"]["code"], "method_not_allowed");
    let (status, _, body) = call(&h.app, get("/api/v1/policies?namspace=x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"]["code"], "invalid_request");
    assert!(error_message(&body).contains("namspace"), "{body}");
}

#[tokio::test]
async fn loopback_mode_refuses_foreign_host_and_origin() {
    let h = harness(AuthMode::Loopback).await;
    let req = |host: &str, origin: Option<&str>| {
        let mut b = Request::get("/api/v1/policies").header(header::HOST, host);
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).unwrap()
    };
    let (status, _, body) = call(&h.app, req("attacker.example:8080", None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "DNS rebinding: {body}");
    assert_eq!(json(&body)["error"]["code"], "forbidden");
    let (status, _, _) = call(
        &h.app,
        req("127.0.0.1:8080", Some("https://attacker.example")),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = call(&h.app, req("localhost:8080", Some("http://localhost:8080"))).await;
    assert_eq!(status, StatusCode::OK);
    // Probes are not behind the check.
    let (status, _, _) = call(
        &h.app,
        Request::get("/healthz")
            .header(header::HOST, "10.0.0.7:8080")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn key_mode_needs_a_chat_key() {
    let h = harness(AuthMode::Keys).await;
    let with_key = |key: Option<&str>| {
        let mut b = Request::get("/api/v1/llm/providers").header(header::HOST, "kortex.example");
        if let Some(k) = key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        b.body(Body::empty()).unwrap()
    };
    let (status, headers, body) = call(&h.app, with_key(None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    assert_eq!(json(&body)["error"]["code"], "unauthorized");
    let (status, _, _) = call(&h.app, with_key(Some("wrong"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(&h.app, with_key(Some("chat-key-alice"))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn key_mode_shows_proposals_only_to_their_user_and_possible_deciders() {
    let h = harness(AuthMode::Keys).await;
    for (id, user) in [("p-alice", "alice"), ("p-bob", "bob")] {
        pending_proposal(&h, id, user, None, "logs from a private session").await;
    }
    let authed = |method: &str, path: &str| request_as("chat-key-alice", method, path, None);
    let (status, _, body) = call(&h.app, authed("GET", "/chat/v1/proposals")).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<String> = json(&body)["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        ids,
        vec!["p-alice".to_owned()],
        "bob's proposal is not alice's to see: she is not in the approver group"
    );
    // Not hers to see, so not hers to decide: 404, as if it did not exist.
    let (status, _, body) = call(&h.app, authed("POST", "/chat/v1/proposals/p-bob/approve")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Her own proposal, which someone else must decide: she knows it exists, so the
    // refusal says why.
    let (status, _, body) =
        call(&h.app, authed("POST", "/chat/v1/proposals/p-alice/approve")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(error_message(&body).contains("someone else"), "{body}");
}

/// `/metrics` reports the state the alerts watch, read at scrape time: provider
/// reachability from the last probes, today's spend against each `dailyUsdLimit`, and the
/// objects served.
#[tokio::test]
async fn metrics_report_reachability_and_budgets_at_scrape_time() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        "apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: ollama}
spec: {type: ollama, baseUrl: 'http://127.0.0.1:9'}
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {name: capped}
spec: {sessions: ['*'], provider: ollama, budget: {dailyUsdLimit: 25}}
",
    )
    .unwrap();
    let mut source =
        ManifestSource::new(vec![dir.path().to_path_buf()], Box::new(|_| None)).unwrap();
    let metrics = Arc::new(Metrics::new());
    let config = live::load(&mut source, None, &metrics);
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(config));
    let db = sqlite().await;
    let probes = kortex::llm::probe::ProbeBoard::default();
    if let Ok(mut board) = probes.write() {
        board.insert(
            kortex::catalog::ObjectKey::new("default", "ollama"),
            kortex::llm::probe::ProbeResult {
                reachable: false,
                ok: false,
                reason: "Unreachable",
                message: "connection refused".into(),
                models: vec![],
                latency_ms: 0,
                checked_at: jiff::Timestamp::now(),
            },
        );
    }
    let engine = kortex::chat::Engine::new(
        db.store.clone(),
        rx.clone(),
        kortex::tools::Router::new(Arc::new(Metrics::new())),
    );
    let app = router(AppState::from(kortex::http::AppShared {
        config: rx.clone(),
        store: db.store.clone(),
        probes,
        governor: engine.governor.clone(),
        engine,
        metrics,
        auth: AuthMode::Loopback,
        cluster_auth: None,
        auth_proxy: None,
        limits: kortex::http::limits::Limits::new(Default::default()),
        erasure_key: None,
        sso: None,
        slack: None,
        a2a: Default::default(),
    }));
    let (status, _, body) = call(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        "kortex_provider_reachable{provider=\"default/ollama\"} 0",
        "kortex_budget_daily_limit_usd{policy=\"default/capped\"} 25",
        "kortex_budget_daily_spend_usd{policy=\"default/capped\"} 0",
        "kortex_config_objects{kind=\"ChatPolicy\",available=\"true\"} 1",
        "kortex_config_errors 0",
    ] {
        assert!(
            body.lines().any(|l| l.starts_with(line)),
            "{line} missing:\n{body}"
        );
    }
}

/// Tenancy: whatever bob asks about alice's session, run or proposal, the answer is 404 —
/// never 403 (which would confirm it exists) and never her data.
#[tokio::test]
async fn another_users_sessions_runs_and_proposals_are_404() {
    let h = harness(AuthMode::Keys).await;
    let alice = "chat-key-alice";
    let bob = "chat-key-bob";
    let (status, _, body) = call(
        &h.app,
        request_as(
            alice,
            "POST",
            "/chat/v1/sessions",
            Some(serde_json::json!({"name": "incident-9", "namespace": "team-a"})),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = json(&body)["id"].as_str().unwrap_or_default().to_owned();
    // A run (it fails at once: the policy's provider does not exist) leaves events.
    let (status, _, body) = call(
        &h.app,
        request_as(
            alice,
            "POST",
            &format!("/chat/v1/sessions/{id}/messages"),
            Some(serde_json::json!({"content": "alice's private question"})),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    pending_proposal(
        &h,
        "p-7",
        "alice",
        Some(id.clone()),
        "alice's private rationale",
    )
    .await;
    let session = format!("/chat/v1/sessions/{id}");
    let matrix: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", session.clone(), None),
        ("GET", format!("{session}/events"), None),
        ("GET", format!("{session}/export"), None),
        ("GET", format!("{session}/export?format=markdown"), None),
        (
            "POST",
            format!("{session}/messages"),
            Some(serde_json::json!({"content": "hi"})),
        ),
        ("POST", format!("{session}/cancel"), None),
        (
            "POST",
            format!("{session}/tool-results"),
            Some(serde_json::json!({"results": [{"toolCallId": "c1", "content": "x"}]})),
        ),
        ("DELETE", session.clone(), None),
        (
            "POST",
            "/chat/v1/proposals/p-7/approve".into(),
            Some(serde_json::json!({})),
        ),
        (
            "POST",
            "/chat/v1/proposals/p-7/reject".into(),
            Some(serde_json::json!({"reason": "no"})),
        ),
    ];
    for (method, path, body) in &matrix {
        let (status, _, text) = call(&h.app, request_as(bob, method, path, body.clone())).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "bob {method} {path}: {text}");
        assert!(
            !text.contains("alice") && !text.contains("private") && !text.contains("incident-9"),
            "bob {method} {path} sees alice's data: {text}"
        );
    }
    // Lists leave her things out.
    for path in ["/chat/v1/sessions", "/chat/v1/proposals"] {
        let (status, _, text) = call(&h.app, request_as(bob, "GET", path, None)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            !text.contains(&id) && !text.contains("p-7"),
            "{path}: {text}"
        );
    }
    // And all of it is still alice's.
    let (status, _, text) = call(&h.app, request_as(alice, "GET", &session, None)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("alice's private question"), "{text}");
}
