//! The HTTP server, every door: health, readiness and metrics; the configuration, chat,
//! runs, sharing, proposals, audit, usage, evals, erasure and alerts APIs; the dashboard;
//! the `/v1` gateway; and the `/mcp` door. `auth` says who is calling (one [`auth::Caller`]
//! for every door), `access` what they may do with sessions and reports (handlers share
//! these and never import one another), `limits` bounds requests, `error` is the one error
//! answer. The top floor but `cli`: imports any room below.

pub mod a2a;
mod access;
mod alerts_api;
mod audit_api;
mod dashboard;
mod erasure_api;
mod evals_api;
pub mod gateway;
mod oauth;
mod usage_api;

pub use crate::store::usage_total;
pub mod auth;
mod chat_api;
mod config_api;
pub mod error;
pub mod limits;
pub mod mcp;
mod proposals_api;
mod runs_api;
mod share_api;
mod slack_api;
pub mod slack_conv;
pub mod sso;

use crate::live::LiveConfig;
use crate::metrics::{HttpLabels, Metrics};
use crate::store::Store;
use auth::AuthMode;
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use error::ApiError;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument as _;

/// What every handler can reach: one shared [`AppShared`], so the clones that extractors and
/// middleware make on every request are one reference count, not one per field.
#[derive(Clone)]
pub struct AppState(Arc<AppShared>);

impl std::ops::Deref for AppState {
    type Target = AppShared;

    fn deref(&self) -> &AppShared {
        &self.0
    }
}

impl From<AppShared> for AppState {
    fn from(shared: AppShared) -> Self {
        Self(Arc::new(shared))
    }
}

/// The parts of [`AppState`].
pub struct AppShared {
    /// The live configuration.
    pub config: watch::Receiver<Arc<LiveConfig>>,
    /// The database.
    pub store: Store,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// How callers authenticate.
    pub auth: AuthMode,
    /// Latest provider probes.
    pub probes: crate::llm::probe::ProbeBoard,
    /// The chat engine.
    pub engine: Arc<crate::chat::Engine>,
    /// Budgets, rate limits and the accounting of every provider call: the one the chat
    /// engine's runs use, shared with the gateway.
    pub governor: Arc<crate::govern::Governor>,
    /// Cluster mode: token and policy reviews, clients acting as callers.
    pub cluster_auth: Option<Arc<crate::operator::auth::ClusterAuth>>,
    /// Identity headers of an authenticating proxy (`--auth-proxy-header`).
    pub auth_proxy: Option<Arc<auth::AuthProxy>>,
    /// Limits on what one client may send or hold open.
    pub limits: Arc<limits::Limits>,
    /// The key of erasure pseudonyms (`--erasure-key`); `None`: a random one per erasure.
    pub erasure_key: Option<Arc<[u8]>>,
    /// Single sign-on with an OpenID provider (`--oidc-issuer`).
    pub sso: Option<Arc<sso::Sso>>,
    /// Slack's Web API, for answering in threads (`None`: events are taken, not answered).
    pub slack: Option<Arc<slack_conv::SlackDoor>>,
    /// The A2A agents' public address and card signer.
    pub a2a: a2a::Door,
}

/// All routes.
// Long because the route table: one line per route.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/v1/llm/providers", get(config_api::providers))
        .route("/api/v1/tools", get(config_api::tools))
        .route("/api/v1/policies", get(config_api::policies))
        .route("/api/v1/manifests", get(config_api::manifests))
        .route(
            "/chat/v1/sessions",
            get(chat_api::list).post(chat_api::create),
        )
        .route(
            "/chat/v1/sessions/{id}",
            get(chat_api::get)
                .delete(chat_api::delete)
                .patch(chat_api::rename),
        )
        .route(
            "/chat/v1/sessions/{id}/messages",
            axum::routing::post(chat_api::post_message),
        )
        .route("/chat/v1/sessions/{id}/events", get(chat_api::events))
        .route("/chat/v1/route", get(dashboard::route_any))
        .route("/chat/v1/sessions/{id}/route", get(chat_api::route_now))
        .route(
            "/chat/v1/sessions/{id}/cancel",
            axum::routing::post(chat_api::cancel),
        )
        .route("/chat/v1/sessions/{id}/export", get(audit_api::export))
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/pause",
            axum::routing::post(runs_api::pause),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/resume",
            axum::routing::post(runs_api::resume),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/redirect",
            axum::routing::post(runs_api::redirect),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/cancel",
            axum::routing::post(runs_api::cancel),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/follow-ups",
            get(runs_api::follow_ups),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/plan/approve",
            axum::routing::post(runs_api::approve_plan),
        )
        .route(
            "/chat/v1/sessions/{id}/runs/{run}/plan/reject",
            axum::routing::post(runs_api::reject_plan),
        )
        .route(
            "/chat/v1/sessions/{id}/share",
            get(share_api::shares)
                .post(share_api::share)
                .delete(share_api::unshare),
        )
        .route(
            "/chat/v1/sessions/{id}/handover",
            axum::routing::post(share_api::handover),
        )
        .route(
            "/chat/v1/sessions/{id}/tool-results",
            axum::routing::post(chat_api::tool_results),
        )
        .route("/api/v1/audit", get(audit_api::audit))
        .route("/api/v1/usage", get(usage_api::usage))
        .route("/api/v1/evals", get(evals_api::evals))
        .route(
            "/api/v1/alerts/alertmanager",
            axum::routing::post(alerts_api::alertmanager),
        )
        .route(
            "/api/v1/users/{name}",
            axum::routing::delete(erasure_api::erase),
        )
        .route("/auth/v1/me", get(dashboard::me))
        .route("/chat/v1/proposals", get(proposals_api::list))
        .route(
            "/a2a/v1/{namespace}/{policy}",
            axum::routing::post(a2a::rpc),
        )
        // The HTTP+JSON binding of the same agent (`docs/a2a.md`).
        .route(
            "/a2a/v1/{namespace}/{policy}/{*rest}",
            get(a2a::rest).post(a2a::rest).delete(a2a::rest),
        )
        .route(
            "/chat/v1/proposals/{id}/approve",
            axum::routing::post(proposals_api::approve),
        )
        .route(
            "/chat/v1/proposals/{id}/reject",
            axum::routing::post(proposals_api::reject),
        )
        .route(
            "/chat/v1/proposals/{id}/undo",
            axum::routing::post(proposals_api::undo),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    // The MCP door: authenticated as the API, then admitted under a policy.
    let mcp = Router::new()
        .route_service(mcp::PATH, mcp::service(state.clone()))
        .route_layer(middleware::from_fn_with_state(state.clone(), mcp::admit))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            mcp::guard_origin,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::assets))
        .route("/auth/v1/login", axum::routing::post(dashboard::login))
        .route("/auth/v1/logout", axum::routing::post(dashboard::logout))
        .route("/auth/v1/sign-in", get(sso::options))
        .route("/auth/v1/oidc/login", get(sso::login))
        .route(sso::CALLBACK_PATH, get(sso::callback))
        .route("/auth/v1/oidc/token", axum::routing::post(sso::cli_token))
        // How OAuth clients get a token for Kortex (`docs/mcp.md#oauth`).
        .route(oauth::METADATA_PATH, get(oauth::server_metadata))
        .route(
            "/.well-known/oauth-protected-resource/{*path}",
            get(oauth::endpoint_metadata),
        )
        // Agent Cards are public: they say how to authenticate (`docs/a2a.md`).
        .route(a2a::CARD_PATH, get(a2a::origin_card))
        .route(
            "/a2a/v1/{namespace}/{policy}/.well-known/agent-card.json",
            get(a2a::policy_card),
        )
        // Slack signs its own requests: verified there, not by `auth::authenticate`.
        .route(
            slack_api::EVENTS_PATH,
            axum::routing::post(slack_api::events),
        )
        .route(
            slack_api::INTERACTIONS_PATH,
            axum::routing::post(slack_api::interactions),
        )
        .route(
            slack_api::COMMANDS_PATH,
            axum::routing::post(slack_api::commands),
        )
        // The gateway authenticates its own keys and answers in each vendor's format.
        .route(
            "/v1/chat/completions",
            axum::routing::post(gateway::openai::chat_completions),
        )
        .route(
            "/v1/messages",
            axum::routing::post(gateway::anthropic::messages),
        )
        .route(
            "/v1/messages/count_tokens",
            axum::routing::post(gateway::anthropic::count_tokens),
        )
        .route(
            "/v1/embeddings",
            axum::routing::post(gateway::openai::embeddings),
        )
        .route("/v1/models", get(gateway::models))
        .route(
            "/v1/responses",
            axum::routing::post(gateway::responses::create),
        )
        .route(
            "/v1/responses/{id}",
            get(gateway::responses::get).delete(gateway::responses::delete),
        )
        .route("/v1/providers/health", get(gateway::health))
        .merge(api)
        .merge(mcp)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(refuse_own_requests))
        // The body is read (within its limit) before any handler: theirs is off.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limits::limit_body,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// Liveness: fails when the leader's loop stalled, so the kubelet restarts the pod and
/// another replica takes the Lease.
async fn healthz(State(state): State<AppState>) -> Response {
    match state
        .metrics
        .stalled(jiff::Timestamp::now(), crate::metrics::LEADER_STALL)
    {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        None => "ok".into_response(),
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    let database = state.store.ping().await;
    let config = state.config.borrow().clone();
    // Version 0: the first configuration (in cluster mode, the first list of every watch)
    // has not been compiled yet.
    let loaded = config.version > 0;
    // Shown, not counted against readiness: an API server outage is every replica's at
    // once, and taking them all out of the Service would turn the clear 503
    // `auth_unavailable` (and chat keys, the gateway, cached identities, which still work)
    // into connection errors (docs/reliability.md).
    let kubernetes_api = state
        .cluster_auth
        .as_ref()
        .map(|auth| match auth.unreachable_since() {
            None => serde_json::json!("ok"),
            Some(t) => serde_json::json!({"unreachableSince": t.to_string()}),
        });
    let body = serde_json::json!({
        "ready": database && loaded,
        "checks": {
            "kubernetesApi": kubernetes_api,
            "database": if database { "ok" } else { "unreachable" },
            "manifests": {
                "loaded": loaded,
                "version": config.version,
                "loadedAt": config.loaded_at.to_string(),
                "errors": config.errors().count(),
            },
        }
    });
    let status = if database && loaded {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    refresh_gauges(&state).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The gauges that describe the current state rather than count events, set at scrape
/// time: configuration objects and errors, provider reachability from the last probes, and
/// today's spend against each policy's `dailyUsdLimit` (from the database, so every replica
/// reports the same).
async fn refresh_gauges(state: &AppState) {
    use crate::metrics::{PolicyLabel, ProviderLabel};
    let config = state.config.borrow().clone();
    if config.version > 0 {
        crate::live::record_objects(&state.metrics, &config);
    }
    let m = &state.metrics;
    m.provider_reachable.clear();
    if let Ok(board) = state.probes.read() {
        for (key, result) in board.iter() {
            m.provider_reachable
                .get_or_create(&ProviderLabel {
                    provider: key.to_string(),
                })
                .set(i64::from(result.reachable));
        }
    }
    m.budget_daily_spend.clear();
    m.budget_daily_limit.clear();
    for (key, entry) in &config.catalog.policies {
        let Some(limit) = entry
            .object
            .spec
            .budget
            .as_ref()
            .and_then(|b| b.daily_usd_limit)
        else {
            continue;
        };
        let policy = key.to_string();
        match state.governor.spent_today(&policy).await {
            Ok(spent) => {
                let label = PolicyLabel { policy };
                m.budget_daily_spend.get_or_create(&label).set(spent);
                m.budget_daily_limit.get_or_create(&label).set(limit);
            }
            Err(e) => {
                tracing::warn!(policy = %policy, error = %e, "cannot read today's spend for /metrics")
            }
        }
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Refuses what Kortex's own tools and providers send (they carry this installation's
/// marker, see [`crate::egress`]): whatever route leads back here, a `KortexTool` or an
/// `LLMProvider` cannot make Kortex call itself, let alone as someone else.
async fn refuse_own_requests(req: Request, next: Next) -> Response {
    let egress = crate::egress::current();
    let ours = req
        .headers()
        .get_all(crate::egress::VIA_HEADER)
        .iter()
        .any(|v| v.as_bytes() == egress.marker().as_bytes());
    if ours {
        tracing::warn!(path = %req.uri().path(), "refused a request made by one of Kortex's own tools or providers");
        return ApiError::forbidden(
            "this request was made by a Kortex tool or provider: Kortex does not serve its own tools and providers",
        )
        .into_response();
    }
    next.run(req).await
}

/// Counts each request by route and status, times it, and (when traces are on) opens its
/// HTTP server span — a child of the caller's `traceparent` — around everything it does.
/// Probes, scrapes and the dashboard's files are counted, not traced.
async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let started = std::time::Instant::now();
    let traced = crate::telemetry::trace::enabled()
        && !matches!(
            route.as_str(),
            "/healthz" | "/readyz" | "/metrics" | "/assets/{file}"
        );
    let span = if traced {
        crate::telemetry::trace::http_server_span(&method, &route, req.uri().path(), req.headers())
    } else {
        tracing::Span::none()
    };
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    crate::telemetry::trace::http_status(&span, status);
    let exemplar = span
        .in_scope(crate::telemetry::trace::sampled_trace_id)
        .map(|trace_id| crate::metrics::TraceExemplar { trace_id });
    state
        .metrics
        .http_duration
        .get_or_create(&crate::metrics::RouteLabels {
            method: method.clone(),
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64(), exemplar, None);
    state
        .metrics
        .http_requests
        .get_or_create(&HttpLabels {
            method,
            route,
            status,
        })
        .inc();
    response
}

pub use limits::serve;

/// How long open requests may finish after a shutdown signal.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);
