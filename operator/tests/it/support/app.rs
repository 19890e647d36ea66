//! The HTTP API in-process (axum `oneshot`), over a real manifest folder and SQLite.

use crate::support::db::{TestDb, sqlite};
use crate::support::manifests::{chat_key, docs};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kortex::http::auth::AuthMode;
use kortex::http::{AppState, router};
use kortex::live;
use kortex::metrics::Metrics;
use kortex::source::ManifestSource;
use std::sync::Arc;
use tower::ServiceExt;

const MANIFESTS: &str = "apiVersion: v1
kind: Secret
metadata: {name: llm-keys}
stringData:
  anthropic: ${TEST_ANTHROPIC_KEY}
---
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: anthropic}
spec:
  type: anthropic
  apiKeySecretRef: {name: llm-keys, key: anthropic}
  defaultModel: claude-opus-4-6
  headers:
    - {name: X-Team, value: literal-header-value}
---
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: openai}
spec:
  type: openai
  apiKeySecretRef: {name: missing, key: openai}
  defaultModel: gpt-5
---
apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: broken}
spec:
  type: azure
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {name: default, namespace: team-a}
spec: {sessions: ['*'], provider: nope, proposals: {allowedActions: [restart], approverGroups: [sre]}}
";

pub struct Harness {
    pub app: axum::Router,
    pub db: TestDb,
    config: tokio::sync::watch::Receiver<Arc<live::LiveConfig>>,
    metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

pub async fn harness(auth: AuthMode) -> Harness {
    harness_with(auth, None).await
}

fn app_of(
    config: &tokio::sync::watch::Receiver<Arc<live::LiveConfig>>,
    metrics: &Arc<Metrics>,
    store: &kortex::store::Store,
    auth: AuthMode,
    sso: Option<Arc<kortex::http::sso::Sso>>,
) -> axum::Router {
    let engine = kortex::chat::Engine::new(
        store.clone(),
        config.clone(),
        kortex::tools::Router::new(std::sync::Arc::new(kortex::metrics::Metrics::new())),
    );
    router(AppState::from(kortex::http::AppShared {
        config: config.clone(),
        store: store.clone(),
        probes: Default::default(),
        governor: engine.governor.clone(),
        engine,
        metrics: metrics.clone(),
        auth,
        cluster_auth: None,
        auth_proxy: None,
        limits: kortex::http::limits::Limits::new(Default::default()),
        erasure_key: None,
        sso,
        slack: None,
        a2a: Default::default(),
    }))
}

impl Harness {
    /// Another replica on the same database and configuration.
    pub fn replica(
        &self,
        auth: AuthMode,
        sso: Option<Arc<kortex::http::sso::Sso>>,
    ) -> axum::Router {
        app_of(&self.config, &self.metrics, &self.db.store, auth, sso)
    }
}

/// The API in-process with single sign-on (`sso`).
pub async fn harness_with(auth: AuthMode, sso: Option<Arc<kortex::http::sso::Sso>>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let manifests = docs(&[
        chat_key("alice-key", "user: alice, key: chat-key-alice"),
        MANIFESTS.to_owned(),
        chat_key("bob-key", "user: bob, key: chat-key-bob"),
    ]);
    std::fs::write(dir.path().join("all.yaml"), manifests).unwrap();
    let env: kortex::source::EnvLookup =
        Box::new(|name| (name == "TEST_ANTHROPIC_KEY").then(|| "sk-ant-TOPSECRET-123".to_owned()));
    let mut source = ManifestSource::new(vec![dir.path().to_path_buf()], env).unwrap();
    let metrics = Arc::new(Metrics::new());
    let config = live::load(&mut source, None, &metrics);
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(config));
    std::mem::forget(_tx); // keep the channel open for the test's lifetime
    let db = sqlite().await;
    let app = app_of(&rx, &metrics, &db.store, auth, sso);
    Harness {
        app,
        db,
        config: rx,
        metrics,
        _dir: dir,
    }
}

pub async fn call(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}
