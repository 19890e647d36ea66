//! `KortexTool` with `spec.mcp`: the tools of a remote MCP server (streamable HTTP), through
//! the official Rust SDK (`rmcp`).
//!
//! One task per server connects (initialize), lists its tools and exposes the included ones
//! as `<name>__<tool>`, lists again on `notifications/tools/list_changed` and every
//! [`REDISCOVER_EVERY`], and reconnects with backoff when the server goes away. Calls carry
//! the tool's timeout (dropping a call sends `notifications/cancelled`); tool errors
//! (`isError`) and JSON-RPC errors become `isError` results.

use super::plugin_host::{PluginHost, request_headers};
use super::{Tool, ToolContext, ToolError, ToolFuture};
use crate::catalog::{ObjectKey, ToolEntry};
use crate::llm::ToolSpec;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, InitializeRequestParams, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer, ServiceError, ServiceExt};
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// How often a connection is checked for a closed transport between discoveries.
const CLOSED_POLL: Duration = Duration::from_secs(5);
/// Periodic re-discovery (also a liveness check).
pub const REDISCOVER_EVERY: Duration = Duration::from_secs(300);
/// Longest wait for `initialize` and `tools/list`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Names providers accept for functions.
const MAX_NAME: usize = 64;
/// Room for the JSON-RPC envelope and JSON escaping on top of a result's cap, and the
/// smallest bound (a `tools/list` of a large server runs to hundreds of KiB).
const ENVELOPE: usize = 1 << 20;

/// The most the transport reads of one answer (a JSON body or one SSE event): four times
/// the result cap (JSON escaping, structured content beside the text) plus 1 MiB. Larger
/// answers fail as they arrive, before they are held in memory whole.
pub fn read_limit(max_result_bytes: usize) -> usize {
    max_result_bytes.saturating_mul(4).saturating_add(ENVELOPE)
}

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A discovery report of one server task.
pub struct Found {
    /// The `KortexTool`.
    pub key: ObjectKey,
    /// The connection task that sent it.
    pub generation: u64,
    /// The exposed tools.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// Tools of the server left out, and why.
    pub skipped: Vec<String>,
    /// When the last discovery succeeded.
    pub discovered_at: Option<jiff::Timestamp>,
}

impl Found {
    /// A server that could not be started.
    pub fn failed(key: ObjectKey, error: String) -> Self {
        Self {
            key,
            generation: 0,
            tools: Vec::new(),
            error: Some(error),
            skipped: Vec::new(),
            discovered_at: None,
        }
    }
}

/// The connection task of one `KortexTool` (stopped when dropped).
pub struct McpServer {
    generation: u64,
    fingerprint: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a connection is made from.
#[derive(Clone)]
struct Target {
    key: ObjectKey,
    prefix: String,
    url: String,
    headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    include: Vec<String>,
    exclude: Vec<String>,
    timeout: Duration,
    max_bytes: usize,
    client: reqwest::Client,
    /// OAuth client credentials: a token on every request (`tools::mcp_oauth`).
    oauth: Option<Arc<super::mcp_oauth::ClientCredentials>>,
    /// `oauthTokenExchange`: calls go on behalf of the chat user, each on a connection
    /// of its own with the user's exchanged token (the shared one only lists the tools).
    on_behalf: bool,
}

impl McpServer {
    /// Starts the connection task of an available `mcp` entry.
    pub fn start(
        key: ObjectKey,
        entry: &ToolEntry,
        host: &PluginHost,
        found: mpsc::Sender<Found>,
    ) -> Result<Self, String> {
        let spec = &entry.object.spec;
        let mcp = spec
            .mcp
            .as_ref()
            .ok_or_else(|| "not an mcp tool".to_owned())?;
        let url = reqwest::Url::parse(&mcp.url).map_err(|e| format!("spec.mcp.url: {e}"))?;
        host.egress.check_url(&url, spec.allow_private_targets)?;
        let (map, basic) = request_headers(entry, &mcp.headers, mcp.auth.as_ref())?;
        let mut headers: HashMap<_, _> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if let Some((user, password)) = basic {
            let mut value = reqwest::header::HeaderValue::from_str(&format!(
                "Basic {}",
                crate::redact::base64(&format!("{user}:{password}"))
            ))
            .map_err(|_| "the basic credentials are not a valid header value".to_owned())?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let oauth = match mcp.auth.as_ref().filter(|a| a.auth_type.is_oauth()) {
            Some(a) => {
                let secret = entry.secrets.get(&a.secret_ref).cloned().ok_or_else(|| {
                    format!(
                        "Secret {}/{} is not resolved",
                        a.secret_ref.name, a.secret_ref.key
                    )
                })?;
                Some(Arc::new(super::mcp_oauth::ClientCredentials::new(
                    host.client(spec.allow_private_targets),
                    &mcp.url,
                    a.client_id.as_deref().unwrap_or_default(),
                    secret,
                    a.scopes.clone(),
                    a.issuer.clone(),
                )))
            }
            None => None,
        };
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        let target = Target {
            key,
            prefix: entry.tool_name.clone(),
            url: mcp.url.clone(),
            headers,
            include: mcp.include.clone(),
            exclude: mcp.exclude.clone(),
            timeout: entry.timeout(),
            max_bytes: entry.max_result_bytes() as usize,
            client: host.client(spec.allow_private_targets),
            oauth,
            on_behalf: mcp
                .auth
                .as_ref()
                .is_some_and(|a| a.auth_type == crate::crd::AuthType::OauthTokenExchange),
        };
        Ok(Self {
            generation,
            fingerprint: fingerprint(entry),
            task: tokio::spawn(maintain(target, generation, found)),
        })
    }

    /// Whether this task still matches `entry` (same spec, same Secret values).
    pub fn serves(&self, entry: &ToolEntry, _host: &PluginHost) -> bool {
        self.fingerprint == fingerprint(entry)
    }

    /// Identifies the task's reports.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Changes with the spec and the resolved Secret values (kept in memory only).
fn fingerprint(entry: &ToolEntry) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&entry.object.spec)
        .unwrap_or_default()
        .hash(&mut h);
    entry.tool_name.hash(&mut h);
    for (k, v) in &entry.secrets {
        k.name.hash(&mut h);
        k.key.hash(&mut h);
        v.expose().hash(&mut h);
    }
    h.finish()
}

/// Connects, discovers, waits for changes; reconnects with backoff.
async fn maintain(target: Target, generation: u64, found: mpsc::Sender<Found>) {
    let mut backoff = Duration::from_secs(1);
    let mut last: Vec<Arc<dyn Tool>> = Vec::new();
    let mut discovered_at = None;
    loop {
        let (changed_tx, mut changed_rx) = mpsc::unbounded_channel();
        // Calls that could not reach the server ask for an immediate check.
        let check = Arc::new(Notify::new());
        let refused = Arc::new(AtomicU64::new(0));
        let error = match connect(&target, changed_tx, &refused).await {
            Err(e) => e,
            Ok(mut service) => {
                let closed = || service.is_closed() || service.peer().is_transport_closed();
                let error = 'session: loop {
                    let listed =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, service.peer().list_all_tools())
                            .await;
                    match listed {
                        Err(_) => break "tools/list timed out".to_owned(),
                        Ok(Err(e)) => break format!("tools/list failed: {}", chain(&e)),
                        Ok(Ok(tools)) => {
                            // Only a server that answers resets the backoff.
                            backoff = Duration::from_secs(1);
                            let (tools, skipped) =
                                expose(&target, service.peer(), &check, &refused, tools);
                            last = tools.clone();
                            discovered_at = Some(jiff::Timestamp::now());
                            let report = Found {
                                key: target.key.clone(),
                                generation,
                                tools,
                                error: None,
                                skipped,
                                discovered_at,
                            };
                            if found.send(report).await.is_err() {
                                return;
                            }
                        }
                    }
                    // Wait for a reason to list again, noticing a closed transport early.
                    let rediscover = tokio::time::sleep(REDISCOVER_EVERY);
                    tokio::pin!(rediscover);
                    loop {
                        tokio::select! {
                            notified = changed_rx.recv() => if notified.is_some() { break } else {
                                break 'session "the connection to the server was lost".to_owned();
                            },
                            _ = &mut rediscover => break,
                            _ = check.notified() => break,
                            _ = tokio::time::sleep(CLOSED_POLL) => {}
                        }
                        if closed() {
                            break 'session "the connection to the server was lost".to_owned();
                        }
                    }
                };
                let _ = service.close_with_timeout(Duration::from_secs(2)).await;
                error
            }
        };
        tracing::warn!(tool = %target.key, url = %target.url, error = %error, "MCP server unavailable; retrying in {}s", backoff.as_secs());
        let report = Found {
            key: target.key.clone(),
            generation,
            tools: last.clone(),
            error: Some(error),
            skipped: Vec::new(),
            discovered_at,
        };
        if found.send(report).await.is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The client side of the handshake: who we are, and list changes forwarded to the task.
struct Handler {
    changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("kortex", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }
}

async fn connect(
    target: &Target,
    changed: mpsc::UnboundedSender<()>,
    refused: &Arc<AtomicU64>,
) -> Result<RunningService<RoleClient, Handler>, String> {
    connect_as(
        target,
        changed,
        refused,
        target.oauth.clone().map(Bearer::Credentials),
    )
    .await
}

/// A connection whose requests carry `bearer`'s token.
async fn connect_as(
    target: &Target,
    changed: mpsc::UnboundedSender<()>,
    refused: &Arc<AtomicU64>,
    bearer: Option<Bearer>,
) -> Result<RunningService<RoleClient, Handler>, String> {
    let limit = read_limit(target.max_bytes);
    let config = StreamableHttpClientTransportConfig::with_uri(target.url.clone())
        .custom_headers(target.headers.clone())
        .max_json_response_size(limit)
        .max_sse_event_size(limit);
    let client = Capped {
        inner: target.client.clone(),
        refused: refused.clone(),
        oauth: bearer,
    };
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let service = tokio::time::timeout(HANDSHAKE_TIMEOUT, Handler { changed }.serve(transport))
        .await
        .map_err(|_| "initialize timed out".to_owned())?
        .map_err(|e| format!("initialize failed: {}", chain(&e)))?;
    service
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    Ok(service)
}

/// The included tools, as `<prefix>__<name>`; names providers would refuse and schemas that
/// do not compile are left out and reported.
fn expose(
    target: &Target,
    peer: &Peer<RoleClient>,
    check: &Arc<Notify>,
    refused: &Arc<AtomicU64>,
    tools: Vec<rmcp::model::Tool>,
) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
    let mut out: Vec<Arc<dyn Tool>> = Vec::new();
    let mut skipped = Vec::new();
    for tool in tools {
        let remote = tool.name.to_string();
        if !crate::glob::allowed(&target.include, &target.exclude, &remote) {
            continue;
        }
        let name = format!("{}__{remote}", target.prefix);
        if name.len() > MAX_NAME
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            skipped.push(format!(
                "{remote} (the name {name:?} is not a valid tool name)"
            ));
            continue;
        }
        let mut parameters = Value::Object((*tool.input_schema).clone());
        if parameters.get("type").is_none() {
            parameters["type"] = Value::from("object");
        }
        if jsonschema::validator_for(&parameters).is_err() {
            skipped.push(format!(
                "{remote} (its inputSchema is not a valid JSON Schema)"
            ));
            continue;
        }
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .unwrap_or("A tool of an MCP server.")
            .to_owned();
        out.push(Arc::new(McpTool {
            spec: ToolSpec {
                name,
                description,
                parameters,
            },
            remote,
            peer: peer.clone(),
            timeout: target.timeout,
            max_bytes: target.max_bytes,
            check: check.clone(),
            refused: refused.clone(),
            on_behalf: target.on_behalf.then(|| Arc::new(target.clone())),
        }));
    }
    (out, skipped)
}

/// The reqwest client of one connection, noting each answer the transport refused for its
/// size so that a call failed by it can say why (rmcp reports only "transport closed").
#[derive(Clone)]
struct Capped {
    inner: reqwest::Client,
    refused: Arc<AtomicU64>,
    /// The OAuth token that replaces any other on each request.
    oauth: Option<Bearer>,
}

/// Where a connection's OAuth token comes from.
#[derive(Clone)]
enum Bearer {
    /// The client's own credentials (renewed as they expire).
    Credentials(Arc<super::mcp_oauth::ClientCredentials>),
    /// A chat user's exchanged token, for the one call it is made for.
    Exchanged(crate::catalog::SecretValue),
}

mod capped {
    use super::{Bearer, Capped};
    use futures_util::StreamExt;
    use reqwest::header::{HeaderName, HeaderValue};
    use rmcp::model::ClientJsonRpcMessage;
    use rmcp::transport::common::client_side_sse::BoxedSseResponse;
    use rmcp::transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    };
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    type Result<T> = std::result::Result<T, StreamableHttpError<reqwest::Error>>;

    impl Capped {
        fn note(&self) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }

        /// The bearer token of a request: the OAuth token when the server takes those.
        async fn auth(&self, given: Option<String>) -> Result<Option<String>> {
            match &self.oauth {
                Some(Bearer::Credentials(o)) => o
                    .token()
                    .await
                    .map(|t| Some(t.expose().to_owned()))
                    .map_err(|e| {
                        StreamableHttpError::Io(std::io::Error::other(format!("OAuth: {e}")))
                    }),
                Some(Bearer::Exchanged(t)) => Ok(Some(t.expose().to_owned())),
                None => Ok(given),
            }
        }

        /// A refused token is not sent again: the next request asks for a new one.
        async fn refused_token<T>(&self, result: Result<T>) -> Result<T> {
            if let (Some(Bearer::Credentials(o)), Err(StreamableHttpError::AuthRequired(_))) =
                (&self.oauth, &result)
            {
                o.forget().await;
            }
            result
        }

        fn too_large(error: &SseError) -> bool {
            matches!(error, SseError::Body(e) if e.to_string().starts_with("SSE event exceeded the maximum size"))
        }
    }

    impl StreamableHttpClient for Capped {
        type Error = reqwest::Error;

        async fn post_message(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<StreamableHttpPostResponse> {
            let auth_header = self.auth(auth_header).await?;
            let sent = self
                .inner
                .post_message(uri, message, session_id, auth_header, custom_headers)
                .await;
            self.refused_token(sent).await
        }

        async fn post_message_with_response_limits(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
            limits: StreamableHttpResponseLimits,
        ) -> Result<StreamableHttpPostResponse> {
            let auth_header = self.auth(auth_header).await?;
            let response = self
                .inner
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await;
            let response = self.refused_token(response).await;
            match response {
                Err(e @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                    self.note();
                    Err(e)
                }
                Ok(StreamableHttpPostResponse::Sse(stream, id)) => {
                    let me = self.clone();
                    let stream = stream.inspect(move |item| {
                        if let Err(e) = item
                            && Self::too_large(e)
                        {
                            me.note();
                        }
                    });
                    Ok(StreamableHttpPostResponse::Sse(stream.boxed(), id))
                }
                other => other,
            }
        }

        async fn delete_session(
            &self,
            uri: Arc<str>,
            session_id: Arc<str>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<()> {
            let auth_header = self.auth(auth_header).await?;
            self.inner
                .delete_session(uri, session_id, auth_header, custom_headers)
                .await
        }

        async fn get_stream(
            &self,
            uri: Arc<str>,
            session_id: Option<Arc<str>>,
            last_event_id: Option<String>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<BoxedSseResponse> {
            let auth_header = self.auth(auth_header).await?;
            self.inner
                .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
                .await
        }

        async fn get_stream_with_max_sse_event_size(
            &self,
            uri: Arc<str>,
            session_id: Option<Arc<str>>,
            last_event_id: Option<String>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
            max_sse_event_size: usize,
        ) -> Result<BoxedSseResponse> {
            let auth_header = self.auth(auth_header).await?;
            self.inner
                .get_stream_with_max_sse_event_size(
                    uri,
                    session_id,
                    last_event_id,
                    auth_header,
                    custom_headers,
                    max_sse_event_size,
                )
                .await
        }
    }
}

/// One remote tool.
struct McpTool {
    spec: ToolSpec,
    remote: String,
    peer: Peer<RoleClient>,
    timeout: Duration,
    max_bytes: usize,
    check: Arc<Notify>,
    /// Answers the transport refused for their size (see [`Capped`]).
    refused: Arc<AtomicU64>,
    /// `oauthTokenExchange`: each call connects anew with the chat user's exchanged token.
    on_behalf: Option<Arc<Target>>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (self.timeout, crate::catalog::TOOL_TIMEOUT_CEILING)
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let peer = self.peer.clone();
        let check = self.check.clone();
        let mut params = CallToolRequestParams::new(self.remote.clone())
            .with_arguments(input.as_object().cloned().unwrap_or_default());
        // The call's trace goes on at the server: W3C Trace Context in `_meta` (MCP SEP-414).
        let trace = crate::telemetry::trace::headers();
        if !trace.is_empty() {
            let mut meta = rmcp::model::RequestMetaObject::default();
            for (name, value) in trace {
                match name.as_str() {
                    "traceparent" => meta.set_traceparent(value),
                    "tracestate" => meta.set_tracestate(value),
                    _ => {}
                }
            }
            params.meta = Some(meta);
        }
        let max_bytes = self.max_bytes;
        let refused = self.refused.clone();
        let remote = self.remote.clone();
        let on_behalf = self.on_behalf.clone();
        Box::pin(async move {
            let before = refused.load(Ordering::Relaxed);
            let result = match on_behalf {
                Some(target) => {
                    call_on_behalf(&target, ctx.on_behalf.as_ref(), &refused, params).await?
                }
                None => peer.call_tool(params).await,
            };
            match result {
                Ok(result) => {
                    let failed = result.is_error.unwrap_or(false);
                    let text = render(&result, max_bytes);
                    if failed {
                        Err(ToolError::Upstream(if text.is_empty() {
                            "the MCP tool failed without a message".to_owned()
                        } else {
                            text
                        }))
                    } else {
                        Ok(text)
                    }
                }
                Err(ServiceError::McpError(e)) => Err(ToolError::Upstream(format!(
                    "MCP error {}: {}",
                    e.code.0, e.message
                ))),
                Err(ServiceError::TransportSend(_) | ServiceError::TransportClosed)
                    if refused.load(Ordering::Relaxed) != before =>
                {
                    Err(ToolError::Upstream(format!(
                        "the MCP server's answer to {remote} is larger than {} bytes, the most Kortex reads of one answer (4 × maxResultBytes + 1 MiB); ask for less, or raise the KortexTool's maxResultBytes",
                        read_limit(max_bytes)
                    )))
                }
                Err(e @ (ServiceError::TransportSend(_) | ServiceError::TransportClosed)) => {
                    // One failed request is not a dead session: the connection task lists
                    // the tools at once, and reconnects only if that fails too.
                    check.notify_one();
                    Err(ToolError::Upstream(format!(
                        "the MCP server is unreachable: {}",
                        chain(&e)
                    )))
                }
                Err(e) => Err(ToolError::Upstream(format!(
                    "MCP call failed: {}",
                    chain(&e)
                ))),
            }
        })
    }
}

/// A call on its own connection, with `subject`'s token exchanged for one for the server.
async fn call_on_behalf(
    target: &Target,
    subject: Option<&super::mcp_oauth::SubjectToken>,
    refused: &Arc<AtomicU64>,
    params: CallToolRequestParams,
) -> Result<std::result::Result<CallToolResult, ServiceError>, ToolError> {
    let subject = subject.ok_or_else(|| {
        ToolError::Denied(format!(
            "{} calls its MCP server on behalf of the chat user (auth.type oauthTokenExchange), and this user signed in without an OAuth token Kortex could exchange (an API key, a Kubernetes token, Slack, a trigger, or loopback): sign in with single sign-on, or call Kortex with an OAuth access token",
            target.key
        ))
    })?;
    let credentials = target
        .oauth
        .as_ref()
        .ok_or_else(|| ToolError::Internal("no OAuth client for the exchange".into()))?;
    let token = credentials
        .exchange(subject)
        .await
        .map_err(|e| ToolError::Upstream(format!("OAuth: {e}")))?;
    let (changed, _ignored) = mpsc::unbounded_channel();
    let mut service = connect_as(target, changed, refused, Some(Bearer::Exchanged(token)))
        .await
        .map_err(|e| {
            ToolError::Upstream(format!(
                "the MCP server refused the chat user's connection: {e}"
            ))
        })?;
    let result = service.peer().call_tool(params).await;
    let _ = service.close_with_timeout(Duration::from_secs(2)).await;
    Ok(result)
}

/// The result for the model: text blocks as they are, other blocks described, structured
/// content when there is no text; cut at `max_bytes` with a flag.
pub fn render(result: &CallToolResult, max_bytes: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(t) => parts.push(t.text.clone()),
            ContentBlock::Image(i) => parts.push(format!(
                "[image {} of {} base64 bytes, not shown]",
                i.mime_type,
                i.data.len()
            )),
            ContentBlock::Resource(r) => parts.push(match &r.resource {
                rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
                rmcp::model::ResourceContents::BlobResourceContents { uri, .. } => {
                    format!("[binary resource {uri}, not shown]")
                }
                _ => "[resource not shown]".to_owned(),
            }),
            ContentBlock::ResourceLink(l) => parts.push(format!("[resource {}]", l.uri)),
            _ => parts.push("[content not shown]".to_owned()),
        }
    }
    let mut text = parts.join("\n");
    if text.trim().is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!(
            "\n[truncated: the result is longer than maxResultBytes ({max_bytes} bytes)]"
        ));
    }
    text
}

/// An error with its sources (reqwest hides the cause in them).
fn chain(e: &dyn std::error::Error) -> String {
    super::plugin_http::error_chain(e)
}
