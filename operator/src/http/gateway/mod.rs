//! The gateway for in-cluster applications (SPEC §4): OpenAI- and Anthropic-compatible
//! endpoints that route to the providers a gateway key's ChatPolicy names — with that
//! policy's routes and failover, local-only mode, budgets, redaction and the same usage
//! accounting as chat. Applications keep using their vendor's official SDK, pointed at
//! Kortex, with a gateway key instead of a provider key.

pub mod anthropic;
pub mod openai;
pub mod responses;

use super::AppState;
use crate::catalog::{Catalog, CredentialKind, ObjectKey, PolicyEntry};
use crate::govern::attempt::Attempt;
use crate::govern::route::{self, Role, Route};
use crate::govern::{Outcome, Reservation, Scope};
use crate::llm::{self, ChatRequest, ChatStream, ErrorKind, LlmError, StopReason, StreamEvent};
use crate::store::NewDecision;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Instant;
use tracing::Instrument as _;

/// Which wire format a request came in (and its errors go out in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// OpenAI Chat Completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

/// What went wrong, rendered in the caller's wire format.
#[derive(Clone, Debug)]
pub struct GatewayError {
    /// HTTP status.
    pub status: StatusCode,
    /// What kind (maps to each vendor's error type).
    pub kind: ErrorKind,
    /// For people.
    pub message: String,
    /// Machine-readable code (OpenAI's `code`).
    pub code: &'static str,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
    /// Whether the SDK should retry (`x-should-retry`, honoured by both official SDKs).
    pub should_retry: Option<bool>,
    /// More headers (`x-ratelimit-*` of a rate limit).
    pub headers: Vec<(&'static str, String)>,
}

impl GatewayError {
    fn new(
        status: StatusCode,
        kind: ErrorKind,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            code,
            retry_after: None,
            should_retry: None,
            headers: Vec::new(),
        }
    }

    /// 429 with the `x-ratelimit-*` headers OpenAI's and Anthropic's SDKs read.
    pub(super) fn rate_limited(l: &crate::govern::rate::Limited) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::RateLimited,
            "rate_limit_exceeded",
            l.to_string(),
        );
        e.retry_after = Some(l.reset_secs);
        e.should_retry = Some(true);
        let [limit, remaining, reset] = l.unit.headers();
        e.headers = vec![
            (limit, l.per_minute.to_string()),
            (remaining, "0".into()),
            (reset, format!("{}s", l.reset_secs)),
        ];
        e
    }

    /// 400: a malformed request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorKind::BadRequest,
            "invalid_request",
            message,
        )
    }

    fn unauthorized(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Auth,
            "invalid_api_key",
            message,
        );
        e.should_retry = Some(false);
        e
    }

    pub(super) fn budget(e: &crate::govern::budget::Exceeded) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::RateLimited,
            "budget_exceeded",
            e.to_string(),
        );
        error.retry_after = e.retry_after(crate::store::now_ms());
        // A spent day or session does not come back within an SDK's retries.
        error.should_retry = Some(error.retry_after.is_some_and(|s| s <= 60));
        error
    }

    /// A database failure: 503 `database_unavailable` (retry in a moment) while it cannot be
    /// reached, 507 `storage_full` when its disk is full, else 500 — as the chat API says.
    pub(super) fn store(e: &crate::store::StoreError) -> Self {
        if e.is_full() {
            tracing::error!(error = %e, "the database's disk is full");
            let mut out = Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                ErrorKind::Upstream,
                "storage_full",
                "the database's disk is full: nothing was stored; free space (or grow the volume) and retry",
            );
            out.should_retry = Some(false);
            return out;
        }
        if e.is_unavailable() {
            tracing::warn!(error = %e, "the database is unavailable");
            let mut out = Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Upstream,
                "database_unavailable",
                "Kortex's database cannot be reached; retry in a moment",
            );
            out.retry_after = Some(5);
            out.should_retry = Some(true);
            return out;
        }
        Self::internal(e)
    }

    pub(super) fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "gateway internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Upstream,
            "internal",
            "internal error; see the Kortex log",
        )
    }

    /// A provider's failure, as the gateway reports it.
    pub fn from_llm(e: &LlmError, redactor: &crate::redact::Redactor) -> Self {
        let status = match e.kind {
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::BadRequest | ErrorKind::ContextTooLong => StatusCode::BAD_REQUEST,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Auth | ErrorKind::Config => StatusCode::BAD_GATEWAY,
            _ => StatusCode::BAD_GATEWAY,
        };
        let mut out = Self::new(
            status,
            e.kind,
            e.kind.as_str(),
            redactor.text(&e.to_string()).0,
        );
        out.retry_after = e.retry_after.map(|d| d.as_secs().max(1));
        out
    }

    /// The error response in `flavor`'s format.
    pub fn render(&self, flavor: Flavor) -> Response {
        let body = match flavor {
            Flavor::OpenAi => {
                let kind = match self.kind {
                    ErrorKind::Auth if self.status == StatusCode::UNAUTHORIZED => {
                        "invalid_request_error"
                    }
                    ErrorKind::RateLimited if self.code == "budget_exceeded" => {
                        "insufficient_quota"
                    }
                    ErrorKind::RateLimited => "rate_limit_error",
                    ErrorKind::BadRequest | ErrorKind::ContextTooLong => "invalid_request_error",
                    _ if self.status == StatusCode::NOT_FOUND => "invalid_request_error",
                    _ => "api_error",
                };
                json!({"error": {"message": self.message, "type": kind, "param": null, "code": self.code}})
            }
            Flavor::Anthropic => {
                json!({"type": "error", "error": {"type": anthropic_error_type(self), "message": self.message}})
            }
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let h = response.headers_mut();
        if let Some(secs) = self.retry_after {
            h.insert(header::RETRY_AFTER, secs.into());
        }
        for (name, value) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(value) {
                h.insert(*name, v);
            }
        }
        if let Some(retry) = self.should_retry {
            h.insert(
                "x-should-retry",
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        response
    }
}

fn anthropic_error_type(e: &GatewayError) -> &'static str {
    match (e.status.as_u16(), e.kind) {
        (401, _) => "authentication_error",
        (403, _) => "permission_error",
        (404, _) => "not_found_error",
        (429, _) => "rate_limit_error",
        (400, _) => "invalid_request_error",
        (_, ErrorKind::Timeout) => "timeout_error",
        (529, _) | (503, _) => "overloaded_error",
        _ => "api_error",
    }
}

/// A gateway key's holder (a team or application, not a person: the chat API's caller is
/// [`crate::http::auth::Caller`]) and the policy that governs it.
pub struct KeyHolder {
    /// Team or application (the key's `team`).
    pub team: String,
    /// Namespace of the key's policy (and of its providers).
    pub namespace: String,
    /// The governing policy.
    pub policy: PolicyEntry,
    /// For budgets and accounting.
    pub scope: Scope,
    /// The policy's redaction (of what goes upstream and of errors shown).
    pub redactor: crate::redact::Redactor,
    /// Rate limits: the policy's and the key's.
    pub limits: Vec<crate::govern::rate::Limit>,
}

/// The key from `Authorization: Bearer` or `x-api-key` (both SDKs' conventions).
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .or_else(|| headers.get("x-api-key").and_then(|h| h.to_str().ok()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// Authenticates a gateway key (held hashed, compared in constant time, never logged).
pub fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<KeyHolder, GatewayError> {
    let key = presented_key(headers).ok_or_else(|| {
        GatewayError::unauthorized(
            "missing API key: send a Kortex gateway key as Authorization: Bearer <key> or x-api-key",
        )
    })?;
    let config = state.config.borrow().clone();
    let credential = config
        .catalog
        .credentials
        .authenticate(CredentialKind::Gateway, key)
        .ok_or_else(|| GatewayError::unauthorized("invalid API key: not a Kortex gateway key"))?;
    let namespace = credential.source.namespace.clone();
    let policy_name = credential.policy.clone().unwrap_or_default();
    let policy = config
        .catalog
        .policies
        .get(&ObjectKey::new(&namespace, &policy_name))
        .cloned()
        .ok_or_else(|| {
            GatewayError::new(
                StatusCode::FORBIDDEN,
                ErrorKind::Auth,
                "policy_not_found",
                format!(
                    "the ChatPolicy {namespace}/{policy_name} named by this key's Secret (annotation kortex.dev/policy) does not exist"
                ),
            )
        })?;
    let scope = Scope::new(&policy, &credential.principal, None, "gateway");
    let redactor = crate::redact::Redactor::for_policy(&config.catalog, &policy);
    let limits = crate::govern::rate::limits_of(
        &namespace,
        &policy_name,
        policy.object.spec.rate_limits.as_ref(),
        &format!("{}/{}", credential.source, credential.principal),
        &credential.rate_limits,
    );
    Ok(KeyHolder {
        redactor,
        limits,
        team: credential.principal.clone(),
        namespace,
        policy,
        scope,
    })
}

/// Whether `provider` is known to serve `model` (as [`provider_models`] lists them, without
/// building the list: this is on every call's path).
fn serves(catalog: &Catalog, namespace: &str, provider: &str, model: &str) -> bool {
    let Some(entry) = catalog.provider(namespace, provider) else {
        return false;
    };
    let spec = &entry.object.spec;
    spec.models.iter().any(|m| m.id == model)
        || spec.default_model.as_deref() == Some(model)
        || spec.fast_model.as_deref() == Some(model)
        || entry
            .object
            .status
            .as_ref()
            .is_some_and(|s| s.models.iter().any(|m| m == model))
}

/// Every model id a provider is known to serve: its catalog, default and fast models, and
/// what it listed (`status.models`).
fn provider_models(catalog: &Catalog, namespace: &str, provider: &str) -> Vec<String> {
    let Some(entry) = catalog.provider(namespace, provider) else {
        return Vec::new();
    };
    let spec = &entry.object.spec;
    let mut out: Vec<String> = Vec::new();
    let listed = entry
        .object
        .status
        .as_ref()
        .map(|s| s.models.clone())
        .unwrap_or_default();
    for id in spec
        .models
        .iter()
        .map(|m| m.id.clone())
        .chain(spec.default_model.clone())
        .chain(spec.fast_model.clone())
        .chain(listed)
    {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// The models a caller may ask for: `(id, provider)`, bare ids first (the first provider
/// that serves an id answers for it), then every `provider/model`.
pub fn available_models(catalog: &Catalog, caller: &KeyHolder) -> Vec<(String, String)> {
    let plan = route::plan(catalog, &caller.namespace, &caller.policy, Role::Default);
    let mut bare: Vec<(String, String)> = Vec::new();
    let mut pinned = Vec::new();
    for r in &plan.routes {
        for id in provider_models(catalog, &caller.namespace, &r.provider) {
            if !bare.iter().any(|(b, _)| *b == id) {
                bare.push((id.clone(), r.provider.clone()));
            }
            pinned.push((format!("{}/{id}", r.provider), r.provider.clone()));
        }
    }
    bare.extend(pinned);
    bare
}

/// The routes for a request of `model`: the provider serving it first (with that model),
/// then the policy's other providers with their own default models (failover). `Err` has
/// the ids the caller may use.
pub fn routes_for(
    catalog: &Catalog,
    caller: &KeyHolder,
    model: &str,
) -> Result<Vec<Route>, GatewayError> {
    let plan = route::plan(catalog, &caller.namespace, &caller.policy, Role::Default);
    let known = |p: &str, m: &str| serves(catalog, &caller.namespace, p, m);
    let first = match model.split_once('/') {
        Some((p, m)) if plan.routes.iter().any(|r| r.provider == p) && known(p, m) => plan
            .routes
            .iter()
            .find(|r| r.provider == p)
            .map(|r| (r.clone(), m.to_owned())),
        _ => plan
            .routes
            .iter()
            .find(|r| known(&r.provider, model))
            .map(|r| (r.clone(), model.to_owned())),
    };
    let Some((first, chosen)) = first else {
        let ids: Vec<String> = available_models(catalog, caller)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut e = GatewayError::new(
            StatusCode::NOT_FOUND,
            ErrorKind::BadRequest,
            "model_not_found",
            if plan.routes.is_empty() {
                plan.unavailable(&caller.scope.policy)
            } else {
                format!(
                    "the model {model:?} does not exist or is not served to this key; available: {}",
                    ids.join(", ")
                )
            },
        );
        e.should_retry = Some(false);
        return Err(e);
    };
    // A model without a price would be counted at $0: under a spending limit it is not
    // served (the limit could not hold).
    let limited = caller
        .policy
        .object
        .spec
        .budget
        .as_ref()
        .is_some_and(|b| b.daily_usd_limit.is_some());
    let priced = catalog
        .provider(&caller.namespace, &first.provider)
        .is_some_and(|e| {
            e.object
                .spec
                .models
                .iter()
                .any(|m| m.id == chosen && m.cost.is_some())
        });
    if limited && !priced {
        let mut e = GatewayError::new(
            StatusCode::FORBIDDEN,
            ErrorKind::BadRequest,
            "model_without_price",
            format!(
                "the model {chosen} of LLMProvider {} has no price (spec.models[].cost), and ChatPolicy {} has a dailyUsdLimit: it cannot be accounted for",
                first.provider, caller.scope.policy
            ),
        );
        e.should_retry = Some(false);
        return Err(e);
    }
    let mut routes = vec![Route {
        model: chosen,
        fast_model: None,
        ..first.clone()
    }];
    routes.extend(
        plan.routes
            .into_iter()
            .filter(|r| r.provider != first.provider)
            .map(|r| Route {
                fast_model: None,
                ..r
            }),
    );
    Ok(routes)
}

/// A provider call under way.
pub struct Started {
    /// Its events.
    pub stream: ChatStream,
    /// `LLMProvider` name.
    pub provider: String,
    /// The model asked for.
    pub model: String,
}

/// Sends `request` for `model` through the routes of the caller's policy that serve it
/// ([`routes_for`], then [`dispatch`]): what every generating endpoint does.
pub async fn route_and_dispatch(
    state: &AppState,
    caller: &KeyHolder,
    model: &str,
    request: ChatRequest,
    endpoint: &'static str,
    streamed: bool,
) -> Result<Started, GatewayError> {
    let routes = {
        let config = state.config.borrow().clone();
        routes_for(&config.catalog, caller, model)?
    };
    dispatch(state, caller, routes, request, endpoint, streamed).await
}

/// Sends `request` through `routes` (failing over on a hard failure before any output),
/// after admitting the request against the budgets; every attempt is redacted, reserved,
/// settled and audited. The stream settles the successful attempt when it ends.
///
/// A client that asked for no stream gets a non-streamed upstream call (`streamed: false`):
/// servers that send no usage in streams report it in whole answers.
// Long because one attempt's steps (adapter, request, books, call, failover) share its
// state; the books are `govern::attempt`'s, the stream's settling is `Meter`'s.
pub async fn dispatch(
    state: &AppState,
    caller: &KeyHolder,
    routes: Vec<Route>,
    request: ChatRequest,
    endpoint: &'static str,
    streamed: bool,
) -> Result<Started, GatewayError> {
    let governor = &state.governor;
    let config = state.config.borrow().clone();
    let catalog = &config.catalog;
    let redactor = &caller.redactor;
    // Rate limits first: a refused call reserves nothing and reaches no provider.
    if !caller.limits.is_empty() {
        match governor
            .rate_limit(&caller.limits, llm::estimate_input(&request))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(limited)) => return Err(GatewayError::rate_limited(&limited)),
            Err(e) => return Err(GatewayError::store(&e)),
        }
    }
    let audit = NewDecision {
        namespace: Some(caller.namespace.clone()),
        user: Some(caller.team.clone()),
        policy: Some(
            caller
                .policy
                .object
                .metadata
                .name
                .clone()
                .unwrap_or_default(),
        ),
        detail: json!({"source": "gateway", "endpoint": endpoint}),
        ..Default::default()
    };
    let mut last: Option<GatewayError> = None;
    // The request is counted once, with the first reservation that is made.
    let mut admitted = false;
    for (i, route) in routes.iter().enumerate() {
        let key = ObjectKey::new(&caller.namespace, &route.provider);
        let Some(adapter) = catalog
            .providers
            .get(&key)
            .and_then(|e| state.engine.adapters.get(config.version, &key, e).ok())
        else {
            continue;
        };
        let mut req = request.clone();
        req.model = route.model.clone();
        req.metadata = llm::RequestMetadata {
            session: None,
            user: Some(caller.team.clone()),
            purpose: Some("gateway".into()),
        };
        let redactions = redactor.request(&mut req);
        let max_output = req.max_tokens.unwrap_or(adapter.config().max_tokens);
        let attempt = Attempt {
            scope: &caller.scope,
            provider: &route.provider,
            model: &route.model,
            audit: audit.clone(),
        };
        // The first attempt is the request (counted with its reservation, in one
        // transaction); failovers are not new requests.
        let reservation = match governor
            .reserve_for(&attempt, adapter.as_ref(), &req, max_output, !admitted)
            .await
        {
            Ok(Ok(r)) => {
                admitted = true;
                r
            }
            Ok(Err(exceeded)) => return Err(GatewayError::budget(&exceeded)),
            Err(e) => return Err(GatewayError::store(&e)),
        };
        let started = Instant::now();
        let capture = caller.policy.object.spec.captures_content();
        let span = llm::semconv::span(adapter.as_ref(), &req, streamed, capture);
        let called = if streamed {
            adapter.stream(&req).instrument(span.clone()).await
        } else {
            adapter
                .complete(&req)
                .instrument(span.clone())
                .await
                .map(llm::response_stream)
        };
        let e = match called {
            Ok(stream) => {
                let meter = Meter {
                    limits: caller.limits.clone(),
                    state: state.clone(),
                    audit: attempt.audit,
                    provider: route.provider.clone(),
                    model: route.model.clone(),
                    redactions,
                    started,
                    captured: (capture && !span.is_disabled())
                        .then(|| (redactor.clone(), String::new(), Vec::new())),
                    span,
                };
                return Ok(Started {
                    stream: metered(stream, reservation, meter),
                    provider: route.provider.clone(),
                    model: route.model.clone(),
                });
            }
            Err(e) => e,
        };
        llm::semconv::end(
            &span,
            "",
            llm::Usage::default(),
            None,
            Some(e.kind.as_str()),
            None,
        );
        drop(span);
        let outcome = Outcome {
            latency_ms: started.elapsed().as_millis() as i64,
            outcome: e.kind.as_str().into(),
            ..Default::default()
        };
        let why = redactor.text(&e.message).0;
        let detail = json!({"redactions": redactions, "error": why});
        let _ = governor
            .settle_attempt(&attempt, reservation, &outcome, detail)
            .await;
        match routes.get(i + 1) {
            Some(next) if e.is_retryable() => {
                let _ = governor
                    .fail_over(&attempt, (&next.provider, &next.model), &e, &why)
                    .await;
                last = Some(GatewayError::from_llm(&e, redactor));
            }
            _ => return Err(GatewayError::from_llm(&e, redactor)),
        }
    }
    Err(last.unwrap_or_else(|| {
        GatewayError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Upstream,
            "provider_unavailable",
            "no provider of this key's policy can answer now; see GET /v1/providers/health",
        )
    }))
}

/// What the accounting of a successful attempt needs when its stream ends.
struct Meter {
    /// The call's rate limits: its output tokens count on them when it settles.
    limits: Vec<crate::govern::rate::Limit>,
    state: AppState,
    /// The audit row's common fields (the attempt's).
    audit: NewDecision,
    provider: String,
    model: String,
    redactions: usize,
    started: Instant,
    /// The call's span, ended with the stream.
    span: tracing::Span,
    /// The answer so far, for a policy that captures content in its traces.
    captured: Option<(crate::redact::Redactor, String, Vec<llm::ToolCall>)>,
}

impl Meter {
    /// Notes what the stream said, for the span.
    fn observe(&mut self, item: &Option<Result<StreamEvent, llm::LlmError>>) {
        let Some((_, text, calls)) = &mut self.captured else {
            return;
        };
        match item {
            Some(Ok(StreamEvent::TextDelta(t))) => text.push_str(t),
            Some(Ok(StreamEvent::ToolCall(c))) => calls.push(c.clone()),
            _ => {}
        }
    }

    /// Ends the call's span.
    fn end_span(
        &self,
        usage: llm::Usage,
        model: &str,
        stop: Option<StopReason>,
        error: Option<&str>,
    ) {
        let captured = self.captured.as_ref().map(|(redactor, text, calls)| {
            let mut calls = calls.clone();
            for c in &mut calls {
                redactor.value(&mut c.input);
            }
            (redactor.text(text).0, calls)
        });
        llm::semconv::end(
            &self.span,
            if model.is_empty() { &self.model } else { model },
            usage,
            stop,
            error,
            captured.as_ref().map(|(t, c)| (t.as_str(), c.as_slice())),
        );
    }

    /// Settles the attempt behind (the books and its audit row join the background
    /// writer's queue).
    async fn settle(
        &self,
        reservation: Reservation,
        usage: llm::Usage,
        model: &str,
        outcome: &str,
    ) {
        let latency_ms = self.started.elapsed().as_millis() as i64;
        let governor = &self.state.governor;
        governor
            .rate_count_output(&self.limits, usage.output_tokens)
            .await;
        let served = if model.is_empty() { &self.model } else { model };
        let outcome = Outcome {
            usage,
            model: served.to_owned(),
            latency_ms,
            outcome: outcome.to_owned(),
        };
        let detail = json!({"inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens, "latencyMs": latency_ms,
            "redactions": self.redactions, "estimated": usage.estimated});
        let decision = crate::govern::attempt::llm_call(
            &self.audit,
            (&self.provider, &self.model),
            &outcome,
            detail,
        );
        governor.settle_later(reservation, &outcome, decision).await;
    }
}

/// `stream`, settling `reservation` from the reported usage when it ends (or fails). A
/// stream dropped early (the client went away) gives its reservation back.
fn metered(stream: ChatStream, reservation: Reservation, meter: Meter) -> ChatStream {
    futures_util::stream::unfold(
        (stream, Some(reservation), meter),
        |(mut stream, mut reservation, mut meter)| async move {
            let item = stream.next().await;
            meter.observe(&item);
            // The books join the background writer's queue (waiting only when it is full).
            let outcome = match &item {
                Some(Ok(StreamEvent::Done {
                    usage,
                    model,
                    stop_reason,
                })) => Some((*usage, model.clone(), "ok", Some(*stop_reason))),
                Some(Err(e)) => {
                    // The client gets the error in words; the transport's own, here.
                    tracing::warn!(provider = %meter.provider, error = %e, detail = e.detail.as_deref().unwrap_or(""), "gateway call failed mid-answer");
                    Some((llm::Usage::default(), String::new(), e.kind.as_str(), None))
                }
                None => Some((llm::Usage::default(), String::new(), "ok", None)),
                _ => None,
            };
            if let Some((usage, model, outcome, stop)) = outcome
                && let Some(r) = reservation.take()
            {
                let error = (outcome != "ok").then_some(outcome);
                meter.end_span(usage, &model, stop, error);
                // Settled in the call's trace: its audit row and exemplar carry the id.
                let span = meter.span.clone();
                meter.settle(r, usage, &model, outcome).instrument(span).await;
            }
            item.map(|i| (i, (stream, reservation, meter)))
        },
    )
    .boxed()
}

/// `GET /v1/models`: the models this key may use, in OpenAI's list format, or Anthropic's
/// when the request carries `anthropic-version`.
pub async fn models(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: HeaderMap,
) -> Response {
    let flavor = if headers.contains_key("anthropic-version") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    };
    let caller = match authenticate(&state, &headers) {
        Ok(c) => c,
        Err(e) => return e.render(flavor),
    };
    let config = state.config.borrow().clone();
    let models = available_models(&config.catalog, &caller);
    let body = match flavor {
        Flavor::OpenAi => {
            json!({"object": "list", "data": models.iter().map(|(id, provider)| json!({
            "id": id, "object": "model", "created": 0, "owned_by": provider})).collect::<Vec<_>>()})
        }
        Flavor::Anthropic => json!({
            "data": models.iter().map(|(id, _)| json!({"type": "model", "id": id, "display_name": id,
                "created_at": "1970-01-01T00:00:00Z"})).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": models.first().map(|m| m.0.clone()),
            "last_id": models.last().map(|m| m.0.clone()),
        }),
    };
    axum::Json(body).into_response()
}

/// `GET /v1/providers/health`: the providers of this key's policy, in failover order, with
/// availability and the last probe.
pub async fn health(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: HeaderMap,
) -> Response {
    let caller = match authenticate(&state, &headers) {
        Ok(c) => c,
        Err(e) => return e.render(Flavor::OpenAi),
    };
    let config = state.config.borrow().clone();
    let plan = route::plan(
        &config.catalog,
        &caller.namespace,
        &caller.policy,
        Role::Default,
    );
    let probes = state.probes.read().map(|b| b.clone()).unwrap_or_default();
    let mut providers: Vec<Value> = Vec::new();
    let mut reachable_count = 0;
    for r in &plan.routes {
        let probe = probes.get(&ObjectKey::new(&caller.namespace, &r.provider));
        let reachable = probe.map(|p| p.reachable);
        if reachable != Some(false) {
            reachable_count += 1;
        }
        providers.push(
            json!({"name": r.provider, "model": r.model, "locality": r.locality,
            "available": true, "reachable": reachable,
            "latencyMs": probe.map(|p| p.latency_ms), "message": probe.map(|p| p.message.clone())}),
        );
    }
    for s in &plan.skipped {
        providers.push(
            json!({"name": s.provider, "available": false, "reachable": null, "message": s.reason}),
        );
    }
    let status = match (plan.routes.len(), reachable_count) {
        (0, _) | (_, 0) => "down",
        (n, r) if r < n || !plan.skipped.is_empty() => "degraded",
        _ => "ok",
    };
    let code = if status == "down" {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (
        code,
        axum::Json(
            json!({"status": status, "policy": caller.scope.policy, "providers": providers}),
        ),
    )
        .into_response()
}

/// A function tool of a request, in any of the three formats: its `name` (else the error
/// `missing` says), `description`, and JSON Schema under `schema` (an empty object schema
/// when there is none).
pub(crate) fn tool_spec(
    t: &Value,
    schema: &str,
    missing: impl FnOnce() -> String,
) -> Result<llm::ToolSpec, GatewayError> {
    Ok(llm::ToolSpec {
        name: t["name"]
            .as_str()
            .ok_or_else(|| GatewayError::invalid(missing()))?
            .to_owned(),
        description: t["description"].as_str().unwrap_or_default().to_owned(),
        parameters: if t[schema].is_object() {
            t[schema].clone()
        } else {
            json!({"type": "object", "properties": {}})
        },
    })
}

/// Parses a JSON request body, or the error in `flavor`'s format.
pub fn parse_body(body: &[u8]) -> Result<Value, GatewayError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(GatewayError::invalid(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// A `text/event-stream` response of `body`. Events that are ready together (an upstream
/// read often carries several) go out in one write: fewer writes and fewer wake-ups of the
/// client, and nothing waits for an event that is not there yet.
pub fn sse_response(
    body: impl futures_util::Stream<Item = Result<axum::body::Bytes, std::convert::Infallible>>
    + Send
    + 'static,
) -> Response {
    let body = body.ready_chunks(64).map(|events| {
        let mut out = bytes::BytesMut::new();
        for event in events.into_iter().flatten() {
            out.extend_from_slice(&event);
        }
        Ok::<_, std::convert::Infallible>(out.freeze())
    });
    let mut response = axum::body::Body::from_stream(body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A fresh id with `prefix` (`chatcmpl-`, `msg_`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}
