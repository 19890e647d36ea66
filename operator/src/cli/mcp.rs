//! `kortex mcp`: a stdio MCP server for local clients (Claude Code, Cursor, VS Code) that
//! carries every request to a Kortex server's `/mcp` door, as the user's chat key or
//! Kubernetes token. Nothing is decided here: the server applies the policy, RBAC, limits,
//! redaction and audit; this bridge only forwards, including the server's list changes.

use super::client::ServerArgs;
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ErrorCode,
    Implementation, InitializeRequestParams, InitializeResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient, RoleServer};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData as McpError, Peer, ServerHandler, ServiceError, ServiceExt};
use std::sync::{Arc, OnceLock};

/// `kortex mcp` options.
#[derive(Args, Debug)]
pub struct McpArgs {
    /// Server (its `/mcp` door is used) and chat API key.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The ChatPolicy whose tools to use, as NAMESPACE/NAME.
    #[arg(long)]
    pub policy: Option<String>,
    /// A session name, matched to a policy as chat matches it (with --policy: a name that
    /// policy covers, for tools limited by `allowedSessions`).
    #[arg(long)]
    pub session: Option<String>,
    /// Namespace of --session (default `default`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Authenticate with the bearer token of this kubeconfig's current context (cluster
    /// mode); without a file: `KUBECONFIG`, then `~/.kube/config`.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub kubeconfig: Option<String>,
}

/// The `/mcp` URL the arguments name.
pub fn url(args: &McpArgs) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("policy", &args.policy),
        ("session", &args.session),
        ("namespace", &args.namespace),
    ] {
        if let Some(v) = v {
            query.append_pair(k, v);
        }
    }
    let query = query.finish();
    let base = format!("{}/mcp", args.server.server.trim_end_matches('/'));
    if query.is_empty() {
        base
    } else {
        format!("{base}?{query}")
    }
}

/// The bearer token of a kubeconfig's current context (`path` empty: the default one).
async fn kubeconfig_token(path: &str) -> Result<String, String> {
    let kubeconfig = if path.is_empty() {
        kube::config::Kubeconfig::read()
    } else {
        kube::config::Kubeconfig::read_from(path)
    }
    .map_err(|e| format!("cannot read the kubeconfig: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("cannot use the kubeconfig's current context: {e}"))?;
    let auth = &config.auth_info;
    if let Some(token) = &auth.token {
        use secrecy::ExposeSecret;
        return Ok(token.expose_secret().to_owned());
    }
    if let Some(file) = &auth.token_file {
        return std::fs::read_to_string(file)
            .map(|t| t.trim().to_owned())
            .map_err(|e| format!("cannot read the kubeconfig's tokenFile {file}: {e}"));
    }
    Err("the kubeconfig's current user has no bearer token (it signs in with client certificates or an exec plugin); pass one with --key, e.g. --key \"$(kubectl create token NAME)\" or your OIDC ID token".to_owned())
}

/// What the server said, from the SDK's transport error: a refusal's status and the
/// server's own message, or what to do about missing credentials.
fn explain(error: &str) -> String {
    if error.contains("Auth required") {
        return "the server wants credentials (401): pass a chat key with --key or KORTEX_API_KEY, or --kubeconfig for your Kubernetes token".to_owned();
    }
    const MARK: &str = "unexpected server response: HTTP ";
    let Some(start) = error.find(MARK).map(|i| i + MARK.len()) else {
        return error.to_owned();
    };
    let rest = &error[start..];
    let (status, body) = rest.split_once(": ").unwrap_or((rest, ""));
    let body = body.rsplit_once(", when ").map_or(body, |(b, _)| b);
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.to_owned());
    format!("HTTP {status}: {message}")
}

/// Runs the bridge until the client closes standard input.
pub async fn run(args: McpArgs) -> Result<(), String> {
    let token = match (&args.kubeconfig, &args.server.key) {
        (Some(path), _) => Some(kubeconfig_token(path).await?),
        (None, _) => args.server.credential(),
    };
    let url = url(&args);
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    let http = reqwest::Client::builder()
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let downstream = Arc::new(OnceLock::new());
    let upstream = Upstream {
        downstream: downstream.clone(),
    }
    .serve(transport)
    .await
    .map_err(|e| format!("cannot connect to {url}: {}", explain(&e.to_string())))?;
    upstream
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    let server = upstream
        .peer()
        .peer_info()
        .ok_or_else(|| format!("{url} did not say who it is"))?;
    // The local client sees Kortex as it is: its capabilities, name and instructions.
    let mut info = InitializeResult::new(server.capabilities.clone());
    if let Some(implementation) = &server.server_info {
        info = info.with_server_info(implementation.clone());
    }
    if let Some(instructions) = &server.instructions {
        info = info.with_instructions(instructions.clone());
    }
    tracing::info!(%url, "bridging standard input and output to Kortex");
    let bridge = Bridge {
        upstream: upstream.peer().clone(),
        info,
        downstream,
    };
    let server = bridge
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| format!("the MCP client on standard input did not initialize: {e}"))?;
    let closed = server.waiting().await;
    let _ = upstream.cancel().await;
    closed
        .map(|_| ())
        .map_err(|e| format!("the bridge stopped: {e}"))
}

/// The connection to Kortex: passes its list changes on to the local client.
struct Upstream {
    downstream: Arc<OnceLock<Peer<RoleServer>>>,
}

impl ClientHandler for Upstream {
    fn get_info(&self) -> ClientConfig {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("kortex-mcp", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(peer) = self.downstream.get() {
            let _ = peer.notify_tool_list_changed().await;
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(peer) = self.downstream.get() {
            let _ = peer.notify_resource_list_changed().await;
        }
    }
}

/// The local client's server: every request goes to Kortex.
struct Bridge {
    upstream: Peer<RoleClient>,
    info: InitializeResult,
    downstream: Arc<OnceLock<Peer<RoleServer>>>,
}

/// Kortex's JSON-RPC errors pass through as they are; a transport failure says so.
fn forwarded(e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(e) => e,
        other => McpError::new(
            ErrorCode::INTERNAL_ERROR,
            format!("the Kortex server could not be reached: {other}"),
            None,
        ),
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> InitializeResult {
        self.info.clone()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let _ = self.downstream.set(context.peer.clone());
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.upstream.list_tools(request).await.map_err(forwarded)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.upstream
            .call_tool_once(request)
            .await
            .map_err(forwarded)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.upstream
            .list_resources(request)
            .await
            .map_err(forwarded)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.upstream
            .read_resource_once(request)
            .await
            .map_err(forwarded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(policy: Option<&str>, session: Option<&str>) -> McpArgs {
        McpArgs {
            server: ServerArgs {
                server: "http://127.0.0.1:8080/".into(),
                key: None,
            },
            policy: policy.map(Into::into),
            session: session.map(Into::into),
            namespace: None,
            kubeconfig: None,
        }
    }

    #[test]
    fn refusals_are_said_in_the_servers_words() {
        assert_eq!(
            explain(
                "Send message error Transport [x] error: unexpected server response: HTTP 422 Unprocessable Entity: {\"error\":{\"code\":\"no_matching_policy\",\"message\":\"no ChatPolicy default/nope\"}}, when send initialize request"
            ),
            "HTTP 422 Unprocessable Entity: no ChatPolicy default/nope"
        );
        assert!(
            explain("Transport error: Auth required, when send initialize request")
                .contains("--key")
        );
        assert_eq!(explain("connection refused"), "connection refused");
    }

    #[test]
    fn the_url_names_the_door_and_the_policy() {
        assert_eq!(
            url(&args(Some("shop/ops"), None)),
            "http://127.0.0.1:8080/mcp?policy=shop%2Fops"
        );
        assert_eq!(
            url(&args(None, Some("incident 7"))),
            "http://127.0.0.1:8080/mcp?session=incident+7"
        );
        assert_eq!(url(&args(None, None)), "http://127.0.0.1:8080/mcp");
    }
}
