//! Kortex as an A2A agent (`docs/a2a.md`): the Agent2Agent protocol v1.0, JSON-RPC binding
//! over HTTP, for each ChatPolicy with `spec.a2a.expose`.
//!
//! - The Agent Card: `GET /a2a/v1/{namespace}/{policy}/.well-known/agent-card.json`, and at
//!   the origin's `/.well-known/agent-card.json` when exactly one policy is exposed.
//! - The endpoint: `POST /a2a/v1/{namespace}/{policy}`, authenticated like any API caller
//!   (the card says how), the policy's `use` checked as in the dashboard.
//! - A task is a run of Kortex's, in a session (its `contextId`) owned by the caller: a
//!   message without `taskId` starts a run, in the context named or a new session; the
//!   states map from the run's (`working`; `input-required` while its plan waits for a
//!   decision, which the caller's next message on the task gives; `completed`, `failed`,
//!   `canceled`). Artifacts: the answer (Markdown), the evidence (the tool calls, as data),
//!   the proposals (as data, with how a person decides them: an A2A caller decides only as
//!   any approver would, through the proposals API or kubectl).
//!
//! A card is signed (a detached JWS, ES256, over its RFC 8785 canonical form as A2A §8.4
//! says) when `--a2a-signing-key-file` names a key. Push notifications POST a task's
//! stream events to the caller's URL, through the egress guard, from the replica that
//! serves the task (configs are kept in memory: their tokens are the caller's secrets). No
//! extended card.

use super::AppState;
use super::access::{may_use, ms_to_rfc3339, reachable};
use super::auth::Caller;
use crate::catalog::PolicyEntry;
use crate::chat::{ChatError, event};
use crate::store::{Access, RunState, SessionRecord};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

/// Where a card is, below an agent's URL (and at the origin).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The A2A version spoken.
pub const PROTOCOL_VERSION: &str = "1.0";
/// How long a blocking `SendMessage` waits for the run to end or to need input.
const BLOCKING_WAIT: Duration = Duration::from_secs(600);
/// How much of a tool result an evidence part carries.
const EVIDENCE_CHARS: usize = 2_000;

/// `--a2a-signing-key-file`, `--a2a-signing-key-id`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct A2aArgs {
    /// A PEM file with a P-256 private key (PKCS#8, `openssl genpkey -algorithm EC -pkeyopt
    /// ec_paramgen_curve:P-256`): Agent Cards are then signed with it (ES256).
    #[arg(long, env = "KORTEX_A2A_SIGNING_KEY_FILE")]
    pub a2a_signing_key_file: Option<std::path::PathBuf>,
    /// The key id (`kid`) the signatures name, for verifiers to find the public key.
    #[arg(long, env = "KORTEX_A2A_SIGNING_KEY_ID", default_value = "kortex-a2a")]
    pub a2a_signing_key_id: String,
}

impl A2aArgs {
    /// The door: its public address and signer.
    pub fn door(&self, public_url: Option<&str>) -> Result<Door, String> {
        let signer = match &self.a2a_signing_key_file {
            Some(path) => {
                let pem = std::fs::read_to_string(path)
                    .map_err(|e| format!("--a2a-signing-key-file {}: {e}", path.display()))?;
                Some(
                    CardSigner::from_pem(&pem, &self.a2a_signing_key_id)
                        .map_err(|e| format!("--a2a-signing-key-file {}: {e}", path.display()))?,
                )
            }
            None => None,
        };
        Ok(Door {
            public_url: public_url.map(|u| u.trim_end_matches('/').to_owned()),
            signer,
            push: PushBoard::default(),
        })
    }
}

/// What the A2A door knows besides the API's state.
#[derive(Default)]
pub struct Door {
    /// The public address (`--public-url`); else the request's `Host`.
    pub public_url: Option<String>,
    /// Signs the cards, when a key is configured.
    pub signer: Option<CardSigner>,
    /// Tasks' push notification configs.
    pub push: PushBoard,
}

/// Signs Agent Cards: ES256 over the card's canonical form (A2A v1.0 §8.4).
pub struct CardSigner {
    key: ring::signature::EcdsaKeyPair,
    kid: String,
}

impl CardSigner {
    /// From a PEM PKCS#8 P-256 private key.
    pub fn from_pem(pem: &str, kid: &str) -> Result<Self, String> {
        let body: String = pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .map(str::trim)
            .collect();
        let der = crate::oidc::jwt::base64url(&body.replace('+', "-").replace('/', "_"))
            .ok_or("not a PEM file")?;
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &der,
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| format!("not a PKCS#8 P-256 private key ({e})"))?;
        Ok(Self {
            key,
            kid: kid.to_owned(),
        })
    }

    /// `card` with its `signatures`.
    fn sign(&self, card: &Value) -> Value {
        let header = json!({"alg": "ES256", "typ": "JOSE", "kid": self.kid});
        let protected = crate::oidc::jwt::base64url_encode(header.to_string().as_bytes());
        let payload = crate::oidc::jwt::base64url_encode(canonical_card(card).as_bytes());
        let input = format!("{protected}.{payload}");
        let mut out = card.clone();
        match self
            .key
            .sign(&ring::rand::SystemRandom::new(), input.as_bytes())
        {
            Ok(sig) => {
                out["signatures"] = json!([{"protected": protected,
                    "signature": crate::oidc::jwt::base64url_encode(sig.as_ref())}]);
            }
            Err(e) => tracing::warn!(error = %e, "cannot sign an Agent Card"),
        }
        out
    }
}

/// The card as A2A signs it: without `signatures`, empty strings, arrays and objects
/// removed (recursively), in RFC 8785 canonical form.
pub fn canonical_card(card: &Value) -> String {
    let mut card = card.clone();
    if let Some(o) = card.as_object_mut() {
        o.remove("signatures");
    }
    jcs(&clean_empty(card).unwrap_or_else(|| json!({})))
}

fn clean_empty(v: Value) -> Option<Value> {
    match v {
        Value::Object(o) => {
            let kept: serde_json::Map<String, Value> = o
                .into_iter()
                .filter_map(|(k, v)| clean_empty(v).map(|v| (k, v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(a) => {
            let kept: Vec<Value> = a.into_iter().filter_map(clean_empty).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::String(s) if s.is_empty() => None,
        other => Some(other),
    }
}

/// RFC 8785 (JCS): members sorted by their names' UTF-16 code units, no whitespace,
/// strings escaped as ECMAScript does (as serde_json does), integers as they are.
fn jcs(v: &Value) -> String {
    match v {
        Value::Object(o) => {
            let mut members: Vec<(&String, &Value)> = o.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            let inner: Vec<String> = members
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), jcs(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(jcs).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// A push notification config of a task (kept in this replica's memory: its token and
/// credentials are the caller's secrets, never stored or shown).
struct PushConfig {
    id: String,
    url: String,
    token: Option<crate::catalog::SecretValue>,
    /// `(scheme, credentials)` for `Authorization`.
    auth: Option<(String, crate::catalog::SecretValue)>,
}

impl PushConfig {
    /// As the API shows it: without the token or the credentials.
    fn json(&self, task: &str) -> Value {
        let mut v = json!({"id": self.id, "taskId": task, "url": self.url});
        if let Some((scheme, _)) = &self.auth {
            v["authentication"] = json!({"scheme": scheme});
        }
        v
    }
}

/// The push notification configs of the tasks this replica follows, and which tasks have
/// a sender running.
#[derive(Default)]
pub struct PushBoard {
    configs: std::sync::Mutex<std::collections::HashMap<String, Vec<PushConfig>>>,
    sending: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl PushBoard {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut std::collections::HashMap<String, Vec<PushConfig>>) -> T,
    ) -> T {
        f(&mut self.configs.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A `TaskPushNotificationConfig` from a request; checked: an `http(s)` URL the egress
/// guard lets Kortex reach.
fn push_config(v: &Value) -> Result<PushConfig, RpcError> {
    let url = v["url"]
        .as_str()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| RpcError::invalid_params("a push notification config has a url"))?;
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| RpcError::invalid_params(format!("push url {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(RpcError::invalid_params("a push url is http or https"));
    }
    crate::egress::current()
        .check_url(&parsed, false)
        .map_err(|why| {
            RpcError::invalid_params(format!(
                "Kortex may not send to {}: {why}",
                parsed.host_str().unwrap_or_default()
            ))
        })?;
    let secret = |s: &str| crate::catalog::SecretValue::new(s);
    let auth = match (
        v["authentication"]["scheme"]
            .as_str()
            .filter(|s| !s.is_empty()),
        v["authentication"]["credentials"]
            .as_str()
            .filter(|s| !s.is_empty()),
    ) {
        (Some(scheme), Some(creds)) => Some((scheme.to_owned(), secret(creds))),
        (Some(_), None) => {
            return Err(RpcError::invalid_params(
                "authentication names a scheme without credentials",
            ));
        }
        _ => None,
    };
    Ok(PushConfig {
        id: v["id"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map_or_else(crate::store::new_id, str::to_owned),
        url: url.to_owned(),
        token: v["token"].as_str().filter(|s| !s.is_empty()).map(secret),
        auth,
    })
}

/// Sends task `run`'s events (the stream's, as `StreamResponse`s) to its push configs,
/// until it stops; one sender per task on this replica.
fn ensure_sender(state: &AppState, session: &SessionRecord, run: &str) {
    let board = &state.a2a.push;
    let has = board.with(|c| c.get(run).is_some_and(|v| !v.is_empty()));
    let new = has
        && board
            .sending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run.to_owned());
    if !new {
        return;
    }
    let (state, session, run) = (state.clone(), session.clone(), run.to_owned());
    tokio::spawn(async move {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(64);
        let pumping = {
            let (state, session, run) = (state.clone(), session.clone(), run.clone());
            tokio::spawn(async move {
                if let Err(e) = pump(&state, &session, &run, &Binding::Rest, &tx).await {
                    tracing::info!(task = %run, error = %e.message, "a task's push notifications stopped");
                }
            })
        };
        let client = crate::egress::current().plugin_client(false);
        // Each item is a bare StreamResponse, as pushed.
        while let Some(event) = rx.recv().await {
            let event = &event;
            let targets: Vec<(String, Option<String>, Option<String>)> = state.a2a.push.with(|c| {
                c.get(&run)
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        (
                            p.url.clone(),
                            p.token.as_ref().map(|t| t.expose().to_owned()),
                            p.auth.as_ref().map(|(s, c)| format!("{s} {}", c.expose())),
                        )
                    })
                    .collect()
            });
            for (url, token, auth) in targets {
                let Ok(client) = &client else { break };
                deliver(client, &run, &url, token.as_deref(), auth.as_deref(), event).await;
            }
        }
        let _ = pumping.await;
        state
            .a2a
            .push
            .sending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&run);
    });
}

/// One push notification: POSTed as JSON, tried three times (1 s, then 2 s apart).
async fn deliver(
    client: &reqwest::Client,
    task: &str,
    url: &str,
    token: Option<&str>,
    auth: Option<&str>,
    event: &Value,
) {
    for attempt in 0..3u32 {
        let mut request = client
            .post(url)
            .timeout(Duration::from_secs(10))
            .header(header::CONTENT_TYPE, "application/a2a+json")
            .body(event.to_string());
        if let Some(t) = token {
            request = request.header("x-a2a-notification-token", t);
        }
        if let Some(a) = auth {
            request = request.header(header::AUTHORIZATION, a);
        }
        match request.send().await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                tracing::info!(task, status = %r.status(), attempt, "a push notification was refused")
            }
            Err(e) => {
                tracing::info!(task, error = %e.without_url(), attempt, "a push notification could not be sent")
            }
        }
        tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
    }
}

/// A JSON-RPC error of A2A's (or JSON-RPC's own).
#[derive(Debug)]
struct RpcError {
    code: i64,
    reason: &'static str,
    message: String,
    /// The HTTP status it goes with (200 for every protocol error; 403 for a caller who
    /// may not use the policy).
    status: StatusCode,
}

impl RpcError {
    fn new(code: i64, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            status: StatusCode::OK,
        }
    }
    fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(-32602, "INVALID_PARAMS", message)
    }
    fn task_not_found(id: &str) -> Self {
        Self::new(-32001, "TASK_NOT_FOUND", format!("task {id} not found"))
    }
    fn unsupported(message: impl Into<String>) -> Self {
        Self::new(-32004, "UNSUPPORTED_OPERATION", message)
    }
    fn internal(message: impl Into<String>) -> Self {
        Self::new(-32603, "INTERNAL_ERROR", message)
    }
}

impl From<crate::store::StoreError> for RpcError {
    fn from(e: crate::store::StoreError) -> Self {
        tracing::warn!(error = %e, "an A2A request could not be served");
        Self::internal("the database could not be read; try again")
    }
}

fn rpc_result(id: &Value, result: Value) -> Response {
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

fn rpc_error_body(id: &Value, e: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message,
        "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": e.reason,
            "domain": "a2a-protocol.org"}]}})
}

fn rpc_error(id: &Value, e: &RpcError) -> Response {
    (e.status, Json(rpc_error_body(id, e))).into_response()
}

/// How a request came in, which decides how its answers are written: a JSON-RPC request
/// (its id) or the HTTP+JSON (REST) binding.
#[derive(Clone)]
enum Binding {
    Rpc(Value),
    Rest,
}

impl Binding {
    /// A result: the JSON-RPC response, or the object itself.
    fn ok(&self, result: Value) -> Response {
        match self {
            Self::Rpc(id) => rpc_result(id, result),
            Self::Rest => Json(result).into_response(),
        }
    }

    /// An error: the JSON-RPC error (HTTP 200, or 403), or a `google.rpc.Status` with the
    /// HTTP status the specification maps its reason to.
    fn err(&self, e: &RpcError) -> Response {
        match self {
            Self::Rpc(id) => rpc_error(id, e),
            Self::Rest => (rest_status(e), Json(self.error_body(e))).into_response(),
        }
    }

    /// One item of a stream.
    fn frame(&self, result: Value) -> Value {
        match self {
            Self::Rpc(id) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Self::Rest => result,
        }
    }

    /// An error's body, also as a stream's `error` event.
    fn error_body(&self, e: &RpcError) -> Value {
        match self {
            Self::Rpc(id) => rpc_error_body(id, e),
            Self::Rest => {
                let status = rest_status(e);
                json!({"error": {"code": status.as_u16(), "status": rest_status_name(status),
                    "message": e.message, "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": e.reason, "domain": "a2a-protocol.org"}]}})
            }
        }
    }
}

/// The HTTP status of an error in the HTTP+JSON binding (the specification's mapping).
fn rest_status(e: &RpcError) -> StatusCode {
    if e.status != StatusCode::OK {
        return e.status;
    }
    match e.reason {
        "TASK_NOT_FOUND" | "METHOD_NOT_FOUND" => StatusCode::NOT_FOUND,
        "INTERNAL_ERROR" | "INVALID_AGENT_RESPONSE" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn rest_status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        500 => "INTERNAL",
        _ => "INVALID_ARGUMENT",
    }
}

/// The exposed policy `namespace/name`, if it is.
fn exposed(state: &AppState, namespace: &str, name: &str) -> Option<PolicyEntry> {
    let config = state.config.borrow().clone();
    config
        .catalog
        .policies
        .iter()
        .find(|(k, p)| {
            k.namespace == namespace
                && k.name == name
                && p.object.spec.a2a.as_ref().is_some_and(|a| a.expose)
        })
        .map(|(_, p)| p.clone())
}

/// This server's address as the caller reached it (`--public-url` when set).
fn origin(state: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.a2a.public_url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

/// The agent's endpoint: `/a2a/v1/{namespace}/{policy}`.
fn endpoint(origin: &str, namespace: &str, name: &str) -> String {
    format!("{origin}/a2a/v1/{namespace}/{name}")
}

/// The Agent Card of `policy`, served at `url`.
fn card(policy: &PolicyEntry, url: &str) -> Value {
    let meta = &policy.object.metadata;
    let (ns, name) = (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    );
    let a2a = policy.object.spec.a2a.clone().unwrap_or_default();
    let skill = |id: &str, name: &str, description: &str, tags: &[&str], example: &str| json!({"id": id, "name": name, "description": description, "tags": tags, "examples": [example]});
    json!({
        "name": a2a.name.unwrap_or_else(|| format!("Kortex {ns}/{name}")),
        "description": a2a.description.unwrap_or_else(|| "Investigates Kubernetes incidents with read-only tools (logs, events, resources, rollout history, metrics, past incidents) under the caller's own rights, and proposes fixes that a person approves.".into()),
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
        ],
        "provider": {"organization": "Kortex", "url": "https://kortex.dev"},
        "documentationUrl": "https://kortex.dev/docs/a2a",
        "capabilities": {"streaming": true, "pushNotifications": true, "extendedAgentCard": false},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer",
            "description": "A Kortex chat key, or in cluster mode a Kubernetes bearer token: the caller's own identity, whose rights apply"}}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/markdown", "application/json"],
        "skills": [
            skill("investigate", "Investigate an incident", "Finds the cause of a failing workload or alert from logs, events, resources, rollouts and metrics, and says which tool showed what.", &["kubernetes", "incident", "root-cause"], "Why is checkout failing in namespace shop?"),
            skill("explain", "Explain a resource", "Reads a Kubernetes object and its recent history and explains its state.", &["kubernetes", "explain"], "Explain the state of Deployment shop/checkout."),
            skill("propose-fix", "Propose a fix", "Proposes a restart, scale or rollback as an ActionProposal that a person approves; never acts by itself.", &["kubernetes", "remediation", "approval"], "Propose a fix for the crash-looping checkout pods."),
        ],
    })
}

/// `GET /a2a/v1/{namespace}/{policy}/.well-known/agent-card.json`.
pub async fn policy_card(
    State(state): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    match exposed(&state, &namespace, &name) {
        Some(p) => {
            card_response(
                &state,
                &card(&p, &endpoint(&origin(&state, &headers), &namespace, &name)),
            )
            .await
        }
        None => super::error::ApiError::not_found(format!(
            "no ChatPolicy {namespace}/{name} is exposed to agents (spec.a2a.expose)"
        ))
        .into_response(),
    }
}

/// `GET /.well-known/agent-card.json`: the card of the one exposed policy; with several,
/// a 404 naming where each card is.
pub async fn origin_card(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let config = state.config.borrow().clone();
    let all: Vec<(&crate::catalog::ObjectKey, &PolicyEntry)> = config
        .catalog
        .policies
        .iter()
        .filter(|(_, p)| p.object.spec.a2a.as_ref().is_some_and(|a| a.expose))
        .collect();
    let origin = origin(&state, &headers);
    match all.as_slice() {
        [(k, p)] => {
            card_response(&state, &card(p, &endpoint(&origin, &k.namespace, &k.name))).await
        }
        [] => super::error::ApiError::not_found(
            "no ChatPolicy is exposed to agents (spec.a2a.expose)",
        )
        .into_response(),
        many => super::error::ApiError::not_found(format!(
            "several agents are served here; each card is at its own URL: {}",
            many.iter()
                .map(|(k, _)| format!("{}{CARD_PATH}", endpoint(&origin, &k.namespace, &k.name)))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into_response(),
    }
}

/// The card as served: with Kortex's OAuth scheme when it takes access tokens, signed
/// when it has a key.
async fn card_response(state: &AppState, card: &Value) -> Response {
    let mut card = card.clone();
    if let Some(scheme) = super::oauth::card_scheme(state).await {
        card["securitySchemes"]["oauth"] = scheme;
        if let Some(requirements) = card["securityRequirements"].as_array_mut() {
            let scopes = state
                .sso
                .as_deref()
                .map(|s| s.oauth_scopes.clone())
                .unwrap_or_default();
            requirements.push(json!({"schemes": {"oauth": {"list": scopes}}}));
        }
    }
    let card = match &state.a2a.signer {
        Some(signer) => signer.sign(&card),
        None => card,
    };
    ([(header::CACHE_CONTROL, "max-age=300")], Json(card)).into_response()
}

/// The A2A task state of a run's.
fn task_state(s: RunState) -> &'static str {
    match s {
        RunState::Running | RunState::Pausing | RunState::Paused | RunState::Cancelling => {
            "TASK_STATE_WORKING"
        }
        RunState::AwaitingPlan | RunState::RequiresAction => "TASK_STATE_INPUT_REQUIRED",
        RunState::Completed => "TASK_STATE_COMPLETED",
        RunState::Failed => "TASK_STATE_FAILED",
        RunState::Cancelled => "TASK_STATE_CANCELED",
    }
}

/// Whether a stream ends at this run state (terminal, or waiting for the caller).
fn stops(s: RunState) -> bool {
    matches!(
        s,
        RunState::Completed
            | RunState::Failed
            | RunState::Cancelled
            | RunState::AwaitingPlan
            | RunState::RequiresAction
    )
}

fn terminal(s: RunState) -> bool {
    matches!(
        s,
        RunState::Completed | RunState::Failed | RunState::Cancelled
    )
}

fn agent_message(task: &str, context: &str, id: &str, parts: Vec<Value>) -> Value {
    json!({"messageId": id, "role": "ROLE_AGENT", "parts": parts, "taskId": task, "contextId": context})
}

/// The task of run `run` of `session` as A2A shows it, with at most `history` messages
/// (`None`: all).
async fn task_json(
    state: &AppState,
    session: &SessionRecord,
    run: &crate::store::RunRecord,
    history: Option<usize>,
) -> Result<Value, RpcError> {
    let messages = state.store.list_messages(&session.id).await?;
    let status = status_json(state, session, run, &messages).await?;
    let mut task = json!({"id": run.id, "contextId": session.id, "status": status,
        "artifacts": artifacts(state, session, &run.id, &messages).await?});
    let mut past: Vec<Value> = messages
        .iter()
        .filter(|m| !m.superseded && (m.role == "user" || (m.role == "assistant" && !m.content.trim().is_empty())))
        .map(|m| {
            let mut v = json!({"messageId": m.id, "role": if m.role == "user" { "ROLE_USER" } else { "ROLE_AGENT" },
                "parts": [{"text": m.content}], "contextId": session.id});
            if let Some(r) = &m.run_id {
                v["taskId"] = json!(r);
            }
            v
        })
        .collect();
    if let Some(n) = history {
        let skip = past.len().saturating_sub(n);
        past.drain(..skip);
    }
    if !past.is_empty() {
        task["history"] = Value::Array(past);
    }
    Ok(task)
}

/// The run's status: its state, and what the caller needs to know at a stop (the plan to
/// decide, the failure).
async fn status_json(
    state: &AppState,
    session: &SessionRecord,
    run: &crate::store::RunRecord,
    messages: &[crate::store::MessageRecord],
) -> Result<Value, RpcError> {
    let mut status = json!({"state": task_state(run.status),
        "timestamp": ms_to_rfc3339(crate::store::now_ms())});
    let say = |text: String, data: Option<Value>| {
        let mut parts = vec![json!({"text": text})];
        if let Some(d) = data {
            parts.push(json!({"data": d, "mediaType": "application/json"}));
        }
        agent_message(&run.id, &session.id, &format!("{}-status", run.id), parts)
    };
    match run.status {
        RunState::AwaitingPlan => {
            let plan = state
                .store
                .latest_run_event(&session.id, &run.id, crate::chat::plan::EVENT)
                .await?
                .unwrap_or_default();
            let steps: Vec<String> = plan["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    format!(
                        "- {} `{}`: {}",
                        s["id"].as_str().unwrap_or_default(),
                        s["tool"].as_str().unwrap_or_default(),
                        s["purpose"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            status["message"] = say(
                format!(
                    "The investigation waits for its plan to be approved:\n{}\nReply on this task with `approve` (or a data part {{\"plan\": \"approve\", \"steps\": [ids]}}) to carry it out, or `reject` to stop.",
                    steps.join("\n")
                ),
                Some(json!({"plan": plan})),
            );
        }
        RunState::RequiresAction => {
            let (pending, _) = super::chat_api::pending_calls(messages);
            let calls: Vec<Value> = pending
                .iter()
                .map(|c| json!({"toolCallId": c.id, "name": c.name, "input": c.input}))
                .collect();
            let names: Vec<&str> = pending.iter().map(|c| c.name.as_str()).collect();
            status["message"] = say(
                format!(
                    "The investigation waits for the results of your own tools ({}): reply on this task with a data part {{\"toolResults\": [{{\"toolCallId\", \"content\", \"isError\"?}}]}} answering each call, or cancel the task.",
                    names.join(", ")
                ),
                Some(json!({"toolCalls": calls})),
            );
        }
        RunState::Failed => {
            let why = state
                .store
                .latest_run_event(&session.id, &run.id, event::ERROR)
                .await?
                .and_then(|e| e["message"].as_str().map(str::to_owned))
                .or_else(|| {
                    messages
                        .iter()
                        .rev()
                        .find(|m| {
                            m.run_id.as_deref() == Some(run.id.as_str()) && m.role == "assistant"
                        })
                        .map(|m| m.content.clone())
                })
                .unwrap_or_else(|| "the run failed".into());
            status["message"] = say(why, None);
        }
        _ => {}
    }
    Ok(status)
}

/// The run's artifacts: its answer, its evidence, its proposals.
async fn artifacts(
    state: &AppState,
    session: &SessionRecord,
    run: &str,
    messages: &[crate::store::MessageRecord],
) -> Result<Value, RpcError> {
    let mut out = Vec::new();
    let of_run = || {
        messages
            .iter()
            .filter(|m| m.run_id.as_deref() == Some(run) && !m.superseded)
    };
    if let Some(answer) = messages.iter().rev().find(|m| {
        m.run_id.as_deref() == Some(run)
            && !m.superseded
            && m.role == "assistant"
            && !m.content.trim().is_empty()
    }) {
        out.push(answer_artifact(&answer.content));
    }
    let evidence: Vec<Value> = of_run()
        .filter(|m| m.role == "assistant")
        .filter_map(|m| m.tool_calls.as_ref().and_then(Value::as_array))
        .flatten()
        .map(|call| {
            let id = call["id"].as_str().unwrap_or_default();
            let result =
                of_run().find(|m| m.role == "tool" && m.tool_call_id.as_deref() == Some(id));
            evidence_part(
                call["function"]["name"]
                    .as_str()
                    .or(call["name"].as_str())
                    .unwrap_or_default(),
                id,
                &call["function"]["arguments"],
                result.map(|r| (r.content.as_str(), r.is_error)),
            )
        })
        .collect();
    if !evidence.is_empty() {
        out.push(json!({"artifactId": "evidence", "name": "evidence",
            "description": "The tool calls the investigation made, with their results", "parts": evidence}));
    }
    let proposals = state.store.run_digest(&session.id, run).await?.proposals;
    if !proposals.is_empty() {
        out.push(proposals_artifact(&proposals));
    }
    Ok(Value::Array(out))
}

fn answer_artifact(text: &str) -> Value {
    json!({"artifactId": "answer", "name": "answer", "description": "The investigation's answer",
        "parts": [{"text": text, "mediaType": "text/markdown"}]})
}

fn evidence_part(tool: &str, call: &str, arguments: &Value, result: Option<(&str, bool)>) -> Value {
    let arguments = match arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
        other => other.clone(),
    };
    let mut data = json!({"tool": tool, "callId": call, "arguments": arguments});
    if let Some((content, is_error)) = result {
        let clipped: String = content.chars().take(EVIDENCE_CHARS).collect();
        data["result"] = json!(clipped);
        data["truncated"] = json!(clipped.len() < content.len());
        data["isError"] = json!(is_error);
    }
    json!({"data": data, "mediaType": "application/json"})
}

fn proposals_artifact(proposals: &[Value]) -> Value {
    let parts: Vec<Value> = proposals
        .iter()
        .map(|p| {
            let (name, ns, id) = (
                p["name"].as_str().unwrap_or_default(),
                p["namespace"].as_str().unwrap_or_default(),
                p["id"].as_str().unwrap_or_default(),
            );
            let mut data = p.clone();
            data["decide"] = json!({
                "how": "A person decides it, under the policy's rules (an A2A caller decides only if it is an approver, like anyone else)",
                "kubectl": format!("kubectl kortex approve {name} -n {ns}"),
                "api": format!("POST /chat/v1/proposals/{id}/approve"),
            });
            json!({"data": data, "mediaType": "application/json"})
        })
        .collect();
    json!({"artifactId": "proposals", "name": "proposals",
        "description": "Actions the investigation proposed; nothing is done until a person approves", "parts": parts})
}

/// `POST /a2a/v1/{namespace}/{policy}`: a JSON-RPC 2.0 request of A2A v1.0.
pub async fn rpc(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return rpc_error(
                &Value::Null,
                &RpcError::new(-32700, "PARSE_ERROR", format!("not JSON: {e}")),
            );
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = request["method"].as_str().map(str::to_owned) else {
        return rpc_error(
            &id,
            &RpcError::new(
                -32600,
                "INVALID_REQUEST",
                "a JSON-RPC 2.0 request names its method",
            ),
        );
    };
    // A2A-Version: 1.0 (a missing header means 0.3, which this server does not speak, but
    // plain JSON-RPC clients that send none are served as 1.0).
    if let Some(v) = headers.get("a2a-version").and_then(|v| v.to_str().ok())
        && v.trim() != PROTOCOL_VERSION
        && !v.trim().starts_with("1.0.")
    {
        return rpc_error(
            &id,
            &RpcError::new(
                -32009,
                "VERSION_NOT_SUPPORTED",
                format!("A2A version {v} is not supported: this agent speaks {PROTOCOL_VERSION}"),
            ),
        );
    }
    let Some(policy) = exposed(&state, &namespace, &name) else {
        return rpc_error(
            &id,
            &RpcError::new(
                -32601,
                "METHOD_NOT_FOUND",
                format!("no ChatPolicy {namespace}/{name} is exposed to agents (spec.a2a.expose)"),
            ),
        );
    };
    let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    let agent = Agent {
        state: &state,
        caller: &caller,
        policy: &policy,
    };
    let binding = Binding::Rpc(id.clone());
    let served = match method.as_str() {
        "SendMessage" => agent.send(&params, &binding, false).await,
        "SendStreamingMessage" => agent.send(&params, &binding, true).await,
        "GetTask" => agent.get(&params).await.map(|t| rpc_result(&id, t)),
        "CancelTask" => agent.cancel(&params).await.map(|t| rpc_result(&id, t)),
        "SubscribeToTask" => agent.subscribe(&params, &binding).await,
        "CreateTaskPushNotificationConfig" => {
            agent.push_create(&params).await.map(|c| rpc_result(&id, c))
        }
        "GetTaskPushNotificationConfig" => {
            agent.push_get(&params).await.map(|c| rpc_result(&id, c))
        }
        "ListTaskPushNotificationConfigs" => {
            agent.push_list(&params).await.map(|c| rpc_result(&id, c))
        }
        "DeleteTaskPushNotificationConfig" => agent
            .push_delete(&params)
            .await
            .map(|()| rpc_result(&id, Value::Null)),
        "GetExtendedAgentCard" => Err(RpcError::unsupported(
            "this agent has no extended card (capabilities.extendedAgentCard: false)",
        )),
        other => Err(RpcError::new(
            -32601,
            "METHOD_NOT_FOUND",
            format!(
                "{other} is not an A2A v1.0 method (SendMessage, SendStreamingMessage, GetTask, CancelTask, SubscribeToTask, …)"
            ),
        )),
    };
    served.unwrap_or_else(|e| rpc_error(&id, &e))
}

/// The HTTP+JSON (REST) binding under the agent's URL: `POST message:send`,
/// `POST message:stream`, `GET tasks/{id}`, `POST tasks/{id}:cancel`,
/// `POST tasks/{id}:subscribe`, and `tasks/{id}/pushNotificationConfigs[/{configId}]`
/// (`POST`, `GET`, `DELETE`): the JSON-RPC methods' bodies and results, unwrapped; errors
/// as a `google.rpc.Status` with the reason in an `ErrorInfo` and the specification's
/// HTTP status.
pub async fn rest(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((namespace, name, rest)): Path<(String, String, String)>,
    method: axum::http::Method,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let binding = Binding::Rest;
    let Some(policy) = exposed(&state, &namespace, &name) else {
        return binding.err(&RpcError::new(
            -32601,
            "METHOD_NOT_FOUND",
            format!("no ChatPolicy {namespace}/{name} is exposed to agents (spec.a2a.expose)"),
        ));
    };
    let mut params: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return binding.err(&RpcError::new(
                    -32700,
                    "INVALID_REQUEST",
                    format!("the body is not JSON: {e}"),
                ));
            }
        }
    };
    let agent = Agent {
        state: &state,
        caller: &caller,
        policy: &policy,
    };
    let path = rest;
    let segments: Vec<&str> = path.split('/').collect();
    let task_and_verb = |s: &str| -> (String, Option<String>) {
        match s.split_once(':') {
            Some((t, v)) => (t.to_owned(), Some(v.to_owned())),
            None => (s.to_owned(), None),
        }
    };
    use axum::http::Method as M;
    let served = match (method, segments.as_slice()) {
        (M::POST, ["message:send"]) => agent.send(&params, &binding, false).await,
        (M::POST, ["message:stream"]) => agent.send(&params, &binding, true).await,
        (m, ["tasks", task, rest @ ..]) => {
            let (task, verb) = task_and_verb(task);
            params["id"] = Value::from(task.clone());
            match (m, verb.as_deref(), rest) {
                (M::GET, None, []) => {
                    if let Some(n) = query
                        .get("historyLength")
                        .and_then(|n| n.parse::<u64>().ok())
                    {
                        params["historyLength"] = Value::from(n);
                    }
                    agent.get(&params).await.map(|t| binding.ok(t))
                }
                (M::POST, Some("cancel"), []) => agent.cancel(&params).await.map(|t| binding.ok(t)),
                (M::POST, Some("subscribe"), []) => agent.subscribe(&params, &binding).await,
                (m, None, ["pushNotificationConfigs", config @ ..]) => {
                    params["taskId"] = Value::from(task);
                    match (m, config) {
                        (M::POST, []) => agent.push_create(&params).await.map(|c| binding.ok(c)),
                        (M::GET, []) => agent.push_list(&params).await.map(|c| binding.ok(c)),
                        (M::GET, [id]) => {
                            params["id"] = Value::from(*id);
                            agent.push_get(&params).await.map(|c| binding.ok(c))
                        }
                        (M::DELETE, [id]) => {
                            params["id"] = Value::from(*id);
                            agent
                                .push_delete(&params)
                                .await
                                .map(|()| binding.ok(json!({})))
                        }
                        _ => Err(not_a_route(&path)),
                    }
                }
                _ => Err(not_a_route(&path)),
            }
        }
        _ => Err(not_a_route(&path)),
    };
    served.unwrap_or_else(|e| binding.err(&e))
}

fn not_a_route(path: &str) -> RpcError {
    RpcError::new(
        -32601,
        "METHOD_NOT_FOUND",
        format!(
            "{path} is not an A2A v1.0 HTTP+JSON route (message:send, message:stream, tasks/ID, tasks/ID:cancel, tasks/ID:subscribe, tasks/ID/pushNotificationConfigs)"
        ),
    )
}

/// One request's agent: the policy, and who calls.
struct Agent<'a> {
    state: &'a AppState,
    caller: &'a Caller,
    policy: &'a PolicyEntry,
}

impl Agent<'_> {
    fn key(&self) -> (&str, &str) {
        let meta = &self.policy.object.metadata;
        (
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    /// The caller may use the policy (in a cluster, RBAC `use`), or 403.
    async fn may_use(&self) -> Result<(), RpcError> {
        may_use(self.state, self.caller, self.policy)
            .await
            .map_err(|e| RpcError {
                code: -32600,
                reason: "PERMISSION_DENIED",
                message: e.message,
                status: StatusCode::FORBIDDEN,
            })
    }

    /// Task `id` (a run) of a session the caller may reach (`need`) under this agent's
    /// policy; anyone else's is not found.
    async fn task(
        &self,
        id: &str,
        need: Access,
    ) -> Result<(SessionRecord, crate::store::RunRecord), RpcError> {
        let run = self
            .state
            .store
            .run_record(id)
            .await?
            .ok_or_else(|| RpcError::task_not_found(id))?;
        let session = reachable(self.state, self.caller, &run.session_id, need)
            .await
            .map_err(|_| RpcError::task_not_found(id))?;
        let (ns, name) = self.key();
        if session.namespace != ns || session.policy.as_deref() != Some(name) {
            return Err(RpcError::task_not_found(id));
        }
        Ok((session, run))
    }

    /// `GetTask {id, historyLength?}`.
    async fn get(&self, params: &Value) -> Result<Value, RpcError> {
        let id = params["id"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("id names the task"))?;
        let (session, run) = self.task(id, Access::Read).await?;
        let history = params["historyLength"].as_u64().map(|n| n as usize);
        task_json(self.state, &session, &run, history).await
    }

    /// `CancelTask {id}`: the run is cancelled (as with the chat API's run control).
    async fn cancel(&self, params: &Value) -> Result<Value, RpcError> {
        let id = params["id"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("id names the task"))?;
        let (session, run) = self.task(id, Access::Continue).await?;
        if terminal(run.status) {
            return Err(RpcError::new(
                -32002,
                "TASK_NOT_CANCELABLE",
                format!("task {id} has ended ({})", task_state(run.status)),
            ));
        }
        crate::chat::control::apply(
            &self.state.engine,
            &session,
            id,
            &self.caller.user,
            crate::chat::control::Control::Cancel,
            crate::chat::control::Input::default(),
        )
        .await
        .map_err(|e| RpcError::new(-32002, "TASK_NOT_CANCELABLE", e.to_string()))?;
        // The run's owner ends it at its next step: wait a little for it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.state.store.run_record(id).await?;
            if let Some(r) = now
                && (terminal(r.status) || tokio::time::Instant::now() >= deadline)
            {
                return task_json(self.state, &session, &r, Some(0)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `SendMessage` / `SendStreamingMessage`: a new task (a run), or the caller's answer
    /// to a task waiting for input.
    async fn send(
        &self,
        params: &Value,
        binding: &Binding,
        stream: bool,
    ) -> Result<Response, RpcError> {
        let message = &params["message"];
        if !message.is_object() {
            return Err(RpcError::invalid_params("message is required"));
        }
        if !matches!(message["role"].as_str(), Some("ROLE_USER" | "user")) {
            return Err(RpcError::invalid_params("message.role is ROLE_USER"));
        }
        let parts = message["parts"].as_array().cloned().unwrap_or_default();
        let text: String = parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let data: Vec<&Value> = parts.iter().filter_map(|p| p.get("data")).collect();
        if text.trim().is_empty() && data.is_empty() {
            return Err(RpcError::new(
                -32005,
                "CONTENT_TYPE_NOT_SUPPORTED",
                "a message to this agent has a text part (or, answering a plan, a data part)",
            ));
        }
        self.may_use().await?;
        let context = message["contextId"].as_str().filter(|c| !c.is_empty());
        let (session, run_id) = match message["taskId"].as_str().filter(|t| !t.is_empty()) {
            Some(task) => {
                let (session, run) = self.task(task, Access::Continue).await?;
                if context.is_some_and(|c| c != session.id) {
                    return Err(RpcError::invalid_params(format!(
                        "task {task} is of context {}, not {}",
                        session.id,
                        context.unwrap_or_default()
                    )));
                }
                self.answer(&session, &run, &text, &data).await?;
                (session, run.id)
            }
            None => {
                let session = self.session(context).await?;
                if let Some(kube) = &self.caller.kube {
                    self.state
                        .engine
                        .remember_token(&session.id, &self.caller.user, kube.clone());
                }
                self.state.engine.remember_subject(
                    &session.id,
                    &self.caller.user,
                    self.caller.subject.clone(),
                );
                let run = match self
                    .state
                    .engine
                    .start_run(&session, &self.caller.user, &text)
                    .await
                {
                    Ok(run) => run,
                    Err(ChatError::Busy(_)) => {
                        return Err(RpcError::unsupported(format!(
                            "context {} has a task working: follow it with SubscribeToTask, or start a new context",
                            session.id
                        )));
                    }
                    Err(e) => return Err(RpcError::internal(e.to_string())),
                };
                (session, run)
            }
        };
        let push = &params["configuration"]["taskPushNotificationConfig"];
        if push.is_object() {
            let config = push_config(push)?;
            self.state.a2a.push.with(|c| {
                let list = c.entry(run_id.clone()).or_default();
                list.retain(|p| p.id != config.id);
                list.push(config);
            });
        }
        // A task with push configs (new, or resumed after input) is sent as it goes.
        ensure_sender(self.state, &session, &run_id);
        let returns_at_once = params["configuration"]["returnImmediately"]
            .as_bool()
            .unwrap_or(false);
        let history = params["configuration"]["historyLength"]
            .as_u64()
            .map(|n| n as usize);
        if stream {
            return Ok(self.follow(session, run_id, binding.clone()));
        }
        if !returns_at_once {
            let deadline = tokio::time::Instant::now() + BLOCKING_WAIT;
            while tokio::time::Instant::now() < deadline {
                match self.state.store.run_record(&run_id).await? {
                    Some(r) if stops(r.status) => break,
                    _ => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        }
        let run = self
            .state
            .store
            .run_record(&run_id)
            .await?
            .ok_or_else(|| RpcError::task_not_found(&run_id))?;
        let task = task_json(self.state, &session, &run, history).await?;
        Ok(binding.ok(json!({"task": task})))
    }

    /// The session a new task runs in: the context named (one of the caller's under this
    /// policy), or a new one.
    async fn session(&self, context: Option<&str>) -> Result<SessionRecord, RpcError> {
        let (ns, name) = self.key();
        if let Some(c) = context {
            let session = reachable(self.state, self.caller, c, Access::Continue)
                .await
                .map_err(|_| {
                    RpcError::invalid_params(format!(
                        "context {c} is none of yours under this agent"
                    ))
                })?;
            if session.namespace != ns || session.policy.as_deref() != Some(name) {
                return Err(RpcError::invalid_params(format!(
                    "context {c} is none of yours under this agent"
                )));
            }
            return Ok(session);
        }
        let id = crate::store::new_id();
        let short: String = id.chars().rev().take(8).collect();
        let session_name = super::access::session_name_for(self.policy, &format!("a2a-{short}"));
        let config = self.state.config.borrow().clone();
        let governs = config
            .catalog
            .match_policy(ns, &session_name)
            .is_some_and(|p| p.object.metadata.name.as_deref() == Some(name));
        if !governs {
            return Err(RpcError::internal(format!(
                "ChatPolicy {ns}/{name} does not govern the session {session_name} an agent's task would start (a more specific policy does): give agents' sessions their own sessions glob"
            )));
        }
        let new = crate::store::NewSession {
            name: session_name,
            namespace: ns.to_owned(),
            user: self.caller.user.clone(),
            policy: Some(name.to_owned()),
            dynamic_tools: Value::Array(Vec::new()),
        };
        Ok(self.state.store.create_session(&new).await?)
    }

    /// The caller's answer to task `run`, which waits for input: its plan approved (text
    /// `approve`, or a data part `{"plan": "approve", "steps"?}`) or rejected.
    async fn answer(
        &self,
        session: &SessionRecord,
        run: &crate::store::RunRecord,
        text: &str,
        data: &[&Value],
    ) -> Result<(), RpcError> {
        match run.status {
            s if terminal(s) => Err(RpcError::unsupported(format!(
                "task {} has ended ({}): send a message without taskId (in its context) for a new one",
                run.id,
                task_state(s)
            ))),
            RunState::AwaitingPlan => {
                let said = data
                    .iter()
                    .find_map(|d| d["plan"].as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| text.trim().to_ascii_lowercase());
                let steps: Option<Vec<String>> = data.iter().find_map(|d| {
                    d["steps"].as_array().map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_owned))
                            .collect()
                    })
                });
                let control = if said.starts_with("approve") || said == "yes" {
                    crate::chat::control::Control::ApprovePlan
                } else if said.starts_with("reject") || said == "no" {
                    crate::chat::control::Control::RejectPlan
                } else {
                    return Err(RpcError::invalid_params(
                        "the task waits for its plan: answer approve or reject",
                    ));
                };
                crate::chat::control::apply(
                    &self.state.engine,
                    session,
                    &run.id,
                    &self.caller.user,
                    control,
                    crate::chat::control::Input {
                        steps: steps.as_deref(),
                        ..Default::default()
                    },
                )
                .await
                .map(drop)
                .map_err(|e| RpcError::invalid_params(e.to_string()))
            }
            RunState::RequiresAction => {
                let results = data
                    .iter()
                    .find_map(|d| d.get("toolResults"))
                    .ok_or_else(|| {
                        RpcError::invalid_params(
                            "the task waits for the results of your own tools: reply with a data part {\"toolResults\": [{\"toolCallId\", \"content\", \"isError\"?}]}",
                        )
                    })?;
                let results: Vec<super::chat_api::ToolResult> =
                    serde_json::from_value(results.clone())
                        .map_err(|e| RpcError::invalid_params(format!("toolResults: {e}")))?;
                super::chat_api::give_tool_results(self.state, session, &results)
                    .await
                    .map(drop)
                    .map_err(|e| RpcError::invalid_params(e.message))
            }
            _ => Err(RpcError::unsupported(format!(
                "task {} is working: follow it with SubscribeToTask",
                run.id
            ))),
        }
    }

    /// `CreateTaskPushNotificationConfig`: the task's events are POSTed to `url` from now
    /// on (with `X-A2A-Notification-Token` and `Authorization` as configured).
    async fn push_create(&self, params: &Value) -> Result<Value, RpcError> {
        let task = params["taskId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("taskId names the task"))?;
        let (session, _) = self.task(task, Access::Continue).await?;
        let config = push_config(params)?;
        let shown = config.json(task);
        self.state.a2a.push.with(|c| {
            let list = c.entry(task.to_owned()).or_default();
            list.retain(|p| p.id != config.id);
            list.push(config);
        });
        ensure_sender(self.state, &session, task);
        Ok(shown)
    }

    async fn push_get(&self, params: &Value) -> Result<Value, RpcError> {
        let (task, id) = (
            params["taskId"].as_str().unwrap_or_default(),
            params["id"].as_str().unwrap_or_default(),
        );
        self.task(task, Access::Read).await?;
        self.state
            .a2a
            .push
            .with(|c| {
                c.get(task)
                    .and_then(|l| l.iter().find(|p| p.id == id))
                    .map(|p| p.json(task))
            })
            .ok_or_else(|| {
                RpcError::new(
                    -32001,
                    "TASK_NOT_FOUND",
                    format!("task {task} has no push notification config {id}"),
                )
            })
    }

    async fn push_list(&self, params: &Value) -> Result<Value, RpcError> {
        let task = params["taskId"].as_str().unwrap_or_default();
        self.task(task, Access::Read).await?;
        let configs: Vec<Value> = self.state.a2a.push.with(|c| {
            c.get(task)
                .into_iter()
                .flatten()
                .map(|p| p.json(task))
                .collect()
        });
        Ok(json!({"configs": configs}))
    }

    async fn push_delete(&self, params: &Value) -> Result<(), RpcError> {
        let (task, id) = (
            params["taskId"].as_str().unwrap_or_default(),
            params["id"].as_str().unwrap_or_default(),
        );
        self.task(task, Access::Continue).await?;
        self.state.a2a.push.with(|c| {
            if let Some(l) = c.get_mut(task) {
                l.retain(|p| p.id != id);
            }
        });
        Ok(())
    }

    /// `SubscribeToTask {id}`: the task, then its events until it stops.
    async fn subscribe(&self, params: &Value, binding: &Binding) -> Result<Response, RpcError> {
        let id = params["id"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("id names the task"))?;
        let (session, run) = self.task(id, Access::Read).await?;
        if terminal(run.status) {
            return Err(RpcError::unsupported(format!(
                "task {id} has ended ({}): GetTask reads it",
                task_state(run.status)
            )));
        }
        Ok(self.follow(session, run.id, binding.clone()))
    }

    /// The SSE stream of task `run`: the task first, then its progress (the answer as it
    /// is written, each tool call as evidence), then its final artifacts and state; closed
    /// when it ends or waits for the caller.
    fn follow(&self, session: SessionRecord, run: String, binding: Binding) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Value>(64);
        let state = self.state.clone();
        tokio::spawn(async move {
            if let Err(e) = pump(&state, &session, &run, &binding, &tx).await {
                let _ = tx.send(json!({"error": binding.error_body(&e)})).await;
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let v = rx.recv().await?;
            let event = match v.get("error") {
                Some(e) => Event::default().event("error").data(e.to_string()),
                None => Event::default().data(v.to_string()),
            };
            Some((Ok::<_, Infallible>(event), rx))
        });
        Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response()
    }
}

/// Sends task `run`'s stream into `tx`, each item a response of `binding`.
async fn pump(
    state: &AppState,
    session: &SessionRecord,
    run: &str,
    binding: &Binding,
    tx: &tokio::sync::mpsc::Sender<Value>,
) -> Result<(), RpcError> {
    let send = |result: Value| {
        let tx = tx.clone();
        let body = binding.frame(result);
        async move { tx.send(body).await.is_ok() }
    };
    let mut live = state.engine.subscribe(&session.id);
    let record = state
        .store
        .run_record(run)
        .await?
        .ok_or_else(|| RpcError::task_not_found(run))?;
    // Events from here on; what came before is in the task.
    let mut last = state.store.last_event_seq(&session.id).await?;
    let task = task_json(state, session, &record, Some(0)).await?;
    if !send(json!({"task": task})).await {
        return Ok(());
    }
    let (task_id, context) = (run.to_owned(), session.id.clone());
    let mut chunks = 0usize;
    let mut ended = stops(record.status);
    while !ended {
        let page = state.store.events_after(&session.id, last, 500).await?;
        if page.is_empty() {
            // Woken by the next event here, or after a while for another replica's.
            let _ = tokio::time::timeout(Duration::from_millis(500), live.recv()).await;
            if tx.is_closed() {
                return Ok(());
            }
            continue;
        }
        for e in page {
            last = e.seq;
            if e.run_id.as_deref() != Some(run) {
                continue;
            }
            let out = match e.event_type.as_str() {
                event::TEXT_DELTA => {
                    let text = e.data["text"].as_str().unwrap_or_default();
                    if text.is_empty() {
                        None
                    } else {
                        chunks += 1;
                        Some(
                            json!({"artifactUpdate": {"taskId": task_id, "contextId": context,
                            "artifact": {"artifactId": "answer", "name": "answer", "parts": [{"text": text, "mediaType": "text/markdown"}]},
                            "append": chunks > 1, "lastChunk": false}}),
                        )
                    }
                }
                event::TOOL_END => Some(
                    json!({"artifactUpdate": {"taskId": task_id, "contextId": context,
                    "artifact": {"artifactId": "evidence", "name": "evidence", "parts": [evidence_part(
                        e.data["name"].as_str().unwrap_or_default(),
                        e.data["callId"].as_str().unwrap_or_default(),
                        &Value::Null,
                        Some((e.data["preview"].as_str().unwrap_or_default(), e.data["isError"].as_bool().unwrap_or(false))),
                    )]},
                    "append": true, "lastChunk": false}}),
                ),
                event::RUN_LIFECYCLE => {
                    let s = e.data["state"].as_str().and_then(RunState::parse);
                    match s {
                        Some(s) if stops(s) => {
                            ended = true;
                            None
                        }
                        Some(RunState::Running) => Some(
                            json!({"statusUpdate": {"taskId": task_id, "contextId": context,
                            "status": {"state": "TASK_STATE_WORKING", "timestamp": ms_to_rfc3339(e.created_at)}}}),
                        ),
                        _ => None,
                    }
                }
                _ => None,
            };
            if let Some(out) = out
                && !send(out).await
            {
                return Ok(());
            }
            if ended {
                break;
            }
        }
    }
    // The final word: the whole answer and the proposals (from the store, whatever was
    // missed live), then the state the run stopped in.
    let record = state
        .store
        .run_record(run)
        .await?
        .ok_or_else(|| RpcError::task_not_found(run))?;
    let messages = state.store.list_messages(&session.id).await?;
    let artifacts = artifacts(state, session, run, &messages).await?;
    for a in artifacts.as_array().into_iter().flatten() {
        if a["artifactId"] == "evidence" {
            continue;
        }
        let update = json!({"artifactUpdate": {"taskId": task_id, "contextId": context,
            "artifact": a, "append": false, "lastChunk": true}});
        if !send(update).await {
            return Ok(());
        }
    }
    let status = status_json(state, session, &record, &messages).await?;
    send(json!({"statusUpdate": {"taskId": task_id, "contextId": context, "status": status}}))
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_card_is_canonicalized_as_rfc_8785_and_the_sdk_say() {
        // Empty values go (as the A2A SDK's verifier drops them), members are sorted, no
        // whitespace, non-ASCII left as it is.
        let card = json!({"name": "K\u{e9}", "skills": [], "b": {"list": []}, "a": 1,
            "c": [{"z": "", "y": true}], "signatures": [{"protected": "x"}], "d": "line\nnext"});
        assert_eq!(
            super::canonical_card(&card),
            "{\"a\":1,\"c\":[{\"y\":true}],\"d\":\"line\\nnext\",\"name\":\"K\u{e9}\"}"
        );
    }
}
