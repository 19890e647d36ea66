//! `/mcp`: Kortex's tools for any MCP client (Streamable HTTP, rmcp's server side).
//!
//! The door is the chat API's: the same authentication (chat keys, Kubernetes tokens,
//! loopback rules), the same policy choice (`?policy=NAMESPACE/NAME`, or `?session=NAME`
//! matched like chat), the SubjectAccessReview for `use` on it in cluster mode, and every
//! call through the one tool path chat runs use ([`crate::chat::tool_calls`]): allow/deny,
//! `allowedSessions`, schema validation, timeouts, result caps with `read_result_chunk`,
//! redaction, `runToolsAsUser`, an audit row with `via: mcp`, the tool metrics.
//!
//! Transport sessions (`Mcp-Session-Id`) belong to whoever opened them and are kept in the
//! database, so any replica carries them on; protocol revisions without sessions are
//! served statelessly.

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use crate::catalog::{Catalog, PolicyEntry};
use crate::chat::delegate::{DelegatedCall, Delegation};
use crate::chat::tool_calls;
use crate::llm::{ToolCall, ToolSpec};
use crate::store::{NewSession, SessionRecord};
use crate::tools::KubeIdentity;
use crate::tools::guides::{Guide, RESOURCE_PREFIX};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Extensions,
    Implementation, InitializeResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// The path.
pub use super::auth::MCP_PATH as PATH;
/// The session name of MCP calls when the URL names only a policy.
pub const DEFAULT_SESSION: &str = "mcp";
const SESSION_HEADER: &str = "mcp-session-id";

/// Which policy a caller's MCP connection runs under, from the URL's query.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Selection {
    /// `NAMESPACE/NAME` of a ChatPolicy.
    pub policy: Option<String>,
    /// A session name, matched to a policy as chat matches it.
    pub session: Option<String>,
    /// The namespace of `session` (default `default`).
    pub namespace: Option<String>,
}

impl Selection {
    /// From a request's query string.
    pub fn from_query(query: Option<&str>) -> Result<Self, String> {
        let query = query.unwrap_or_default();
        serde_urlencoded_like(query)
    }
}

/// Parses `policy=`, `session=` and `namespace=` (percent-decoded); anything else is an error
/// so a misspelt parameter is not silently ignored.
fn serde_urlencoded_like(query: &str) -> Result<Selection, String> {
    let mut s = Selection::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        let v = v.trim().to_owned();
        let slot = match k.as_ref() {
            "policy" => &mut s.policy,
            "session" => &mut s.session,
            "namespace" => &mut s.namespace,
            other => {
                return Err(format!(
                    "unknown query parameter {other:?}: /mcp takes policy=NAMESPACE/NAME, session=NAME and namespace=NS"
                ));
            }
        };
        if v.is_empty() || v.len() > 253 {
            return Err(format!("{k} must be 1 to 253 characters"));
        }
        *slot = Some(v);
    }
    Ok(s)
}

/// The policy, namespace and session name a selection names in `catalog`, or why none.
pub fn select<'c>(
    catalog: &'c Catalog,
    selection: &Selection,
) -> Result<(&'c PolicyEntry, String, String), String> {
    let (policy, namespace, name) = match (&selection.policy, &selection.session) {
        (Some(qualified), session) => {
            let Some((namespace, _)) = qualified.split_once('/') else {
                return Err(format!(
                    "policy={qualified}: name the ChatPolicy as NAMESPACE/NAME"
                ));
            };
            if selection
                .namespace
                .as_deref()
                .is_some_and(|ns| ns != namespace)
            {
                return Err(format!(
                    "namespace={} differs from the policy's namespace {namespace}",
                    selection.namespace.as_deref().unwrap_or_default()
                ));
            }
            let policy = catalog.policy_named(qualified).ok_or_else(|| {
                format!("no ChatPolicy {qualified}; GET /api/v1/policies lists them")
            })?;
            let name = session
                .clone()
                .unwrap_or_else(|| DEFAULT_SESSION.to_owned());
            // A session name must be one the policy covers: naming one cannot reach tools
            // (`allowedSessions`) meant for another policy's sessions.
            if session.is_some()
                && !policy
                    .object
                    .spec
                    .sessions
                    .iter()
                    .any(|g| crate::glob::matches(g, &name))
            {
                return Err(format!(
                    "ChatPolicy {qualified} does not cover session name {name:?} (its spec.sessions)"
                ));
            }
            (policy, namespace.to_owned(), name)
        }
        (None, Some(name)) => {
            let namespace = selection
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned());
            let policy = catalog.match_policy(&namespace, name).ok_or_else(|| {
                format!("no ChatPolicy in namespace {namespace} matches session name {name:?}; GET /api/v1/policies lists them")
            })?;
            (policy, namespace, name.clone())
        }
        (None, None) => {
            return Err("name a ChatPolicy (/mcp?policy=NAMESPACE/NAME) or a session (/mcp?session=NAME[&namespace=NS]) in the URL".to_owned());
        }
    };
    // A policy that cannot chat (its provider is missing, say) still governs tools: MCP
    // calls need no provider.
    Ok((policy, namespace, name))
}

/// What a request to `/mcp` may use, settled before the MCP layer sees it.
#[derive(Clone)]
pub struct Access {
    /// Who calls.
    pub caller: Caller,
    /// The URL's choice of policy.
    pub selection: Selection,
    /// The session the calls belong to.
    pub session: SessionRecord,
    /// A claude-code run's CLI: its calls go to the run.
    pub delegation: Option<Arc<Delegation>>,
}

/// The `/mcp` service: rmcp's Streamable HTTP server over [`KortexMcp`].
pub fn service(state: AppState) -> StreamableHttpService<KortexMcp, LocalSessionManager> {
    // `Host` is checked where it matters (loopback mode, by the authentication layer); in a
    // cluster it is the Service's or Ingress's name.
    let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    config.session_store = Some(Arc::new(DatabaseSessions(state.store.clone())));
    let factory_state = state.clone();
    StreamableHttpService::new(
        move || Ok(KortexMcp::new(factory_state.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// MCP sessions kept in the database: a replica that has not seen a session restores it.
struct DatabaseSessions(crate::store::Store);

#[async_trait::async_trait]
impl SessionStore for DatabaseSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match self.0.mcp_state(id).await? {
            Some(text) => Ok(Some(serde_json::from_str(&text)?)),
            None => Ok(None),
        }
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        self.0
            .put_mcp_state(id, &serde_json::to_string(state)?)
            .await?;
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        self.0.delete_mcp_session(id).await?;
        Ok(())
    }
}

/// Checks `Origin` (the MCP specification's guard against DNS rebinding), adds
/// `WWW-Authenticate` to a 401, and words errors for MCP clients. Runs outside
/// authentication.
pub async fn guard_origin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Err(e) = check_origin(&state, req.headers()) {
        return e.into_response();
    }
    let mut response = next.run(req).await;
    // Where an OAuth client finds how to get a token, when Kortex takes them
    // (`docs/mcp.md#oauth`); else the realm.
    if response.status() == StatusCode::UNAUTHORIZED {
        let challenge = super::oauth::challenge(&state, PATH)
            .unwrap_or_else(|| HeaderValue::from_static(r#"Bearer realm="kortex""#));
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// A request that says where it comes from must come from this server's own origin (or,
/// in loopback mode, a loopback one, which authentication checks). Clients that are not
/// browsers send no `Origin`.
fn check_origin(state: &AppState, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    if state.auth == super::auth::AuthMode::Loopback {
        return Ok(());
    }
    let origin = origin.to_str().unwrap_or_default();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let authority = origin.split_once("://").map_or("", |(_, a)| a);
    if !host.is_empty() && authority.eq_ignore_ascii_case(host) {
        return Ok(());
    }
    Err(ApiError::forbidden(format!(
        "MCP requests from origin {origin} are refused: only this server's own origin may call /mcp from a browser"
    )))
}

/// After authentication: settles the caller's [`Access`] (policy, `use` rights, session),
/// refuses another user's `Mcp-Session-Id`, and records who opened a new one.
pub async fn admit(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let mut req = match well_formed(req).await {
        Ok(req) => req,
        Err(refused) => return Ok(refused),
    };
    let access = match req.extensions().get::<Arc<Delegation>>().cloned() {
        // The run's own session, policy and tools; its user was admitted when it began.
        Some(delegation) => Access {
            caller: caller.clone(),
            selection: Selection {
                policy: Some(delegation.policy.clone()),
                session: Some(delegation.session_name.clone()),
                namespace: None,
            },
            session: state
                .store
                .get_session(&delegation.session_id, &delegation.user)
                .await?
                .ok_or_else(|| ApiError::not_found("the run's session is gone"))?,
            delegation: Some(delegation),
        },
        None => {
            let selection = Selection::from_query(req.uri().query()).map_err(ApiError::invalid)?;
            let config = state.config.borrow().clone();
            let (policy, namespace, name) = select(&config.catalog, &selection).map_err(|e| {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "no_matching_policy", e)
            })?;
            super::access::may_use(&state, &caller, policy).await?;
            let policy_name = policy.object.metadata.name.clone();
            let session = state
                .store
                .mcp_session(&NewSession {
                    name,
                    namespace,
                    user: caller.user.clone(),
                    policy: policy_name,
                    dynamic_tools: json!([]),
                })
                .await?;
            Access {
                caller: caller.clone(),
                selection,
                session,
                delegation: None,
            }
        }
    };
    let presented = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &presented
        && let Some(Some(owner)) = state.store.mcp_owner(id).await?
        && owner != caller.user
    {
        // As for an unknown session: the id says nothing about whose it is.
        return Err(ApiError::not_found(format!("no MCP session {id}")));
    }
    req.extensions_mut().insert(access);
    let deleting = req.method() == axum::http::Method::DELETE;
    let mut response = next.run(req).await;
    // rmcp ends a session with 202; clients (the Python SDK among them) expect 200 or 204.
    if deleting && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    if presented.is_none()
        && let Some(id) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
    {
        state.store.set_mcp_owner(id, &caller.user).await?;
    }
    Ok(response)
}

/// A JSON-RPC error answer that belongs to no request (`id: null`).
fn json_rpc_error(status: StatusCode, code: i32, message: String) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (status, axum::Json(body)).into_response()
}

/// A POSTed message must be JSON (-32700 Parse error otherwise) and a JSON-RPC 2.0 message
/// (-32600 Invalid Request otherwise), answered as the JSON-RPC specification says
/// rather than with the transport's plain-text refusal. The body is read within
/// `--max-request-bytes` (the limit layer wraps it) and handed on unchanged.
async fn well_formed(req: Request) -> Result<Request, Response> {
    if req.method() != axum::http::Method::POST {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        // Over the limit: the limit layer words it as 413 request_too_large.
        Err(_) => return Err(StatusCode::PAYLOAD_TOO_LARGE.into_response()),
    };
    let message: Value = serde_json::from_slice(&bytes).map_err(|e| {
        json_rpc_error(
            StatusCode::BAD_REQUEST,
            -32700,
            format!("Parse error: the body is not JSON: {e}"),
        )
    })?;
    if let Some(why) = not_json_rpc(&message) {
        return Err(json_rpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            format!("Invalid Request: {why}"),
        ));
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// Why `message` is not a JSON-RPC 2.0 request, notification or response, if it is not.
fn not_json_rpc(message: &Value) -> Option<&'static str> {
    let Some(object) = message.as_object() else {
        return Some("a message is one JSON-RPC object (batches are not part of MCP)");
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some("\"jsonrpc\" must be \"2.0\"");
    }
    match object.get("method") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(_) => return Some("\"method\" must be a non-empty string"),
        None if object.contains_key("result") || object.contains_key("error") => {}
        None => {
            return Some("a request needs \"method\"; a response needs \"result\" or \"error\"");
        }
    }
    match object.get("id") {
        None | Some(Value::String(_)) | Some(Value::Number(_)) => None,
        Some(Value::Null) if !object.contains_key("method") => None,
        Some(_) => Some("\"id\" must be a string or a number"),
    }
}

/// One MCP connection's handler (a transport session, or one stateless request).
pub struct KortexMcp {
    state: AppState,
    /// Follows the configuration for `tools/list_changed` (legacy sessions).
    follower: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for KortexMcp {
    fn drop(&mut self) {
        if let Some(task) = self
            .follower
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// What a caller may use now.
struct Usable {
    policy: PolicyEntry,
    session: SessionRecord,
    tools: Vec<ToolSpec>,
    guides: Arc<[Guide]>,
    kube: KubeIdentity,
    redactor: crate::redact::Redactor,
}

impl KortexMcp {
    fn new(state: AppState) -> Self {
        Self {
            state,
            follower: Mutex::new(None),
        }
    }

    /// What the request's caller may use under the live configuration.
    fn usable(&self, access: &Access) -> Result<Usable, McpError> {
        let config = self.state.config.borrow().clone();
        let (policy, _, _) = select(&config.catalog, &access.selection)
            .map_err(|e| McpError::invalid_request(e, None))?;
        let kube = self.state.engine.kube_identity_of(
            access.caller.kube.as_ref(),
            policy.object.spec.run_tools_as_user,
        );
        let tools = tool_calls::offered(&self.state.engine, policy, &access.session, &kube, false);
        let guides = self
            .state
            .engine
            .router
            .guides(&tools, &access.session.namespace);
        Ok(Usable {
            redactor: crate::redact::Redactor::for_policy(&config.catalog, policy),
            policy: policy.clone(),
            session: access.session.clone(),
            tools,
            guides,
            kube,
        })
    }

    /// A tool as MCP lists it, with what it does beyond reading.
    fn mcp_tool(&self, spec: &ToolSpec) -> Tool {
        mcp_tool(spec, self.state.engine.router.effect(&spec.name))
    }

    /// What changes the client must hear about: the tool list and the guides.
    fn fingerprint(&self, access: &Access) -> (String, String) {
        match self.usable(access) {
            Ok(u) => (
                serde_json::to_string(&u.tools).unwrap_or_default(),
                u.guides
                    .iter()
                    .map(|g| format!("{}\n{}\n", g.name, g.body))
                    .collect(),
            ),
            Err(e) => (e.message.to_string(), String::new()),
        }
    }

    /// Waits for the next change of what `access` may use (configuration or plugin tools)
    /// and says which lists changed.
    async fn next_change(
        &self,
        access: &Access,
        last: &mut (String, String),
        config: &mut tokio::sync::watch::Receiver<Arc<crate::live::LiveConfig>>,
        plugins: &mut tokio::sync::watch::Receiver<Arc<crate::tools::PluginSet>>,
    ) -> Option<(bool, bool)> {
        loop {
            tokio::select! {
                r = config.changed() => r.ok()?,
                r = plugins.changed() => r.ok()?,
            }
            let now = self.fingerprint(access);
            let changed = (now.0 != last.0, now.1 != last.1);
            *last = now;
            if changed.0 || changed.1 {
                return Some(changed);
            }
        }
    }
}

fn access(extensions: &Extensions) -> Result<Access, McpError> {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Access>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request was not admitted", None))
}

fn mcp_tool(spec: &ToolSpec, effect: crate::tools::Effect) -> Tool {
    let schema = match &spec.parameters {
        Value::Object(o) => o.clone(),
        _ => serde_json::Map::new(),
    };
    // Every tool but propose_action only reads; propose_action writes a proposal and
    // changes nothing else.
    let reads = effect == crate::tools::Effect::Read;
    let annotations = ToolAnnotations::new()
        .read_only(reads)
        .destructive(false)
        .idempotent(reads);
    let mut tool = Tool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(schema),
    );
    tool.annotations = Some(annotations);
    tool
}

fn guide_resource(g: &Guide) -> Resource {
    Resource::new(format!("{RESOURCE_PREFIX}{}", g.name), g.name.clone())
        .with_description(g.summary.clone())
        .with_mime_type("text/markdown")
        .with_size(g.body.len() as u64)
}

impl ServerHandler for KortexMcp {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .build();
        InitializeResult::new(capabilities)
            .with_server_info(Implementation::new("kortex", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Kortex's read-only investigation tools for this Kubernetes cluster, under your ChatPolicy's rules and \
                 your own rights. Usage guides: list_tool_guides and get_tool_guide, or the kortex://guides/ resources. \
                 propose_action only proposes: a human approves or rejects it (kubectl kortex approve, or the dashboard).",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let access = access(&context.extensions)?;
        if let Some(d) = &access.delegation {
            return Ok(ListToolsResult::with_all_items(
                d.tools.iter().map(|t| self.mcp_tool(t)).collect(),
            ));
        }
        let usable = self.usable(&access)?;
        Ok(ListToolsResult::with_all_items(
            usable.tools.iter().map(|t| self.mcp_tool(t)).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let access = access(&context.extensions)?;
        let call = ToolCall {
            id: format!("mcp-{}", crate::store::new_id()),
            name: request.name.to_string(),
            input: Value::Object(request.arguments.unwrap_or_default()),
        };
        if let Some(d) = &access.delegation {
            // The run carries it out, in order with everything else it does.
            let (reply, outcome) = tokio::sync::oneshot::channel();
            d.calls
                .send(DelegatedCall { call, reply })
                .await
                .map_err(|_| McpError::internal_error("the run has ended", None))?;
            let outcome = outcome
                .await
                .map_err(|_| McpError::internal_error("the run ended before the call did", None))?;
            let content = vec![ContentBlock::text(outcome.content)];
            return Ok(CallToolResponse::Complete(if outcome.is_error {
                CallToolResult::error(content)
            } else {
                CallToolResult::success(content)
            }));
        }
        let usable = self.usable(&access)?;
        let client = context
            .peer
            .peer_info()
            .map(|p| p.client_info.name.clone())
            .unwrap_or_else(|| "mcp-client".to_owned());
        let run_id = call.id.clone();
        let caller = tool_calls::CallScope {
            session: &usable.session,
            run_id: &run_id,
            policy: &usable.policy,
            redactor: &usable.redactor,
            kube: &usable.kube,
            on_behalf: access.caller.subject.as_ref(),
            via: "mcp",
            model: ("mcp", &client),
            // An MCP client's calls are not planned.
            planning: crate::crd::Planning::Off,
            offered: &[],
        };
        // Named but not offered (denied, another namespace's, or no Kubernetes identity):
        // refused as the router refuses it, with its audit row.
        let outcome =
            tool_calls::call(&self.state.engine, &caller, &call, usable.guides, async {}).await;
        let content = vec![ContentBlock::text(outcome.content)];
        let mut result = if outcome.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        let mut meta = serde_json::Map::new();
        meta.insert("kortex.dev/callId".into(), json!(call.id));
        meta.insert(
            "kortex.dev/durationMs".into(),
            json!(outcome.duration.as_millis() as u64),
        );
        meta.insert("kortex.dev/truncated".into(), json!(outcome.truncated));
        if let Some(kind) = outcome.error_kind {
            meta.insert("kortex.dev/errorKind".into(), json!(kind));
        }
        result.meta = Some(rmcp::model::MetaObject(meta));
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let usable = self.usable(&access(&context.extensions)?)?;
        Ok(ListResourcesResult::with_all_items(
            usable.guides.iter().map(guide_resource).collect(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let usable = self.usable(&access(&context.extensions)?)?;
        let found = request
            .uri
            .strip_prefix(RESOURCE_PREFIX)
            .and_then(|name| usable.guides.iter().find(|g| g.name == name));
        match found {
            Some(g) => Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
                vec![
                    ResourceContents::text(g.body.to_string(), request.uri.clone())
                        .with_mime_type("text/markdown"),
                ],
            ))),
            None => Err(McpError::resource_not_found(
                format!(
                    "no resource {}: the guides of the tools you may use are listed by resources/list",
                    request.uri
                ),
                None,
            )),
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Ok(access) = access(&context.extensions) else {
            return;
        };
        // Tell this session when what its caller may use changes.
        let follower = KortexMcp::new(self.state.clone());
        let peer = context.peer.clone();
        let task = tokio::spawn(async move {
            let mut config = follower.state.config.clone();
            let mut plugins = follower.state.engine.router.watch_plugins();
            let mut last = follower.fingerprint(&access);
            while let Some((tools, guides)) = follower
                .next_change(&access, &mut last, &mut config, &mut plugins)
                .await
            {
                let sent = if tools {
                    peer.notify_tool_list_changed().await
                } else {
                    Ok(())
                };
                let sent = match sent {
                    Ok(()) if guides => peer.notify_resource_list_changed().await,
                    other => other,
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        let previous = self
            .follower
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(task.abort_handle());
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        accepted.resources_list_changed = requested.resources_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let access = access(&context.request_context().extensions)?;
        let mut config = self.state.config.clone();
        let mut plugins = self.state.engine.router.watch_plugins();
        let mut last = self.fingerprint(&access);
        loop {
            let change = tokio::select! {
                _ = context.cancelled() => return Ok(()),
                c = self.next_change(&access, &mut last, &mut config, &mut plugins) => c,
            };
            let Some((tools, guides)) = change else {
                return Ok(());
            };
            let sink = context.sink();
            if tools && context.accepted().tools_list_changed == Some(true) {
                let _ = sink.notify_tool_list_changed().await;
            }
            if guides && context.accepted().resources_list_changed == Some(true) {
                let _ = sink.notify_resource_list_changed().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_that_are_not_json_rpc_are_named() {
        let ok = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": "a", "result": {}}),
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": 1, "message": "x"}}),
        ];
        for m in ok {
            assert_eq!(not_json_rpc(&m), None, "{m}");
        }
        let bad = [
            json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
            json!({"id": 1, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 1}),
            json!({"jsonrpc": "2.0", "id": 1, "method": 7}),
            json!({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": null, "method": "ping"}),
            json!("ping"),
        ];
        for m in bad {
            assert!(not_json_rpc(&m).is_some(), "{m}");
        }
    }

    #[test]
    fn selections_come_from_the_query_and_unknown_parameters_are_refused() {
        assert_eq!(
            Selection::from_query(Some("policy=shop%2Fops&session=incident-1")),
            Ok(Selection {
                policy: Some("shop/ops".into()),
                session: Some("incident-1".into()),
                namespace: None,
            })
        );
        assert_eq!(Selection::from_query(None), Ok(Selection::default()));
        let e = Selection::from_query(Some("polcy=a/b"))
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown query parameter \"polcy\""), "{e}");
        assert!(Selection::from_query(Some("session=")).is_err());
    }
}
