//! `KortexTool`: an operator-supplied plugin tool, either one HTTP endpoint or the tools
//! of a remote MCP server.

use super::{HeaderSpec, SecretKeyRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::core::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A read-only tool the model may call, backed by an HTTP endpoint or an MCP server.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kortex.dev",
    version = "v1alpha1",
    kind = "KortexTool",
    plural = "kortextools",
    singular = "kortextool",
    namespaced,
    doc = "A read-only plugin tool for models: one HTTP endpoint or the tools of a remote MCP server.",
    status = "KortexToolStatus",
    shortname = "ktool",
    category = "kortex",
    printcolumn = r#"{"name":"Tool","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"HTTP","type":"string","priority":1,"jsonPath":".spec.http.url"}"#,
    printcolumn = r#"{"name":"MCP","type":"string","priority":1,"jsonPath":".spec.mcp.url"}"#,
    printcolumn = r#"{"name":"Exposed","type":"string","jsonPath":".status.tools"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("has(self.spec.http) != has(self.spec.mcp)").message("exactly one of spec.http or spec.mcp must be set").reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
pub struct KortexToolSpec {
    /// Tool name seen by the model. Default: `metadata.name` with `-` replaced by `_`.
    /// MCP tools are exposed as `<name>__<remote tool name>`, so `__` is reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 48),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_-]*$")
    )]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!self.contains('__')",
        "message": "tool names may not contain '__' (it separates MCP server and tool names)"
    }]))]
    pub name: Option<String>,
    /// What the tool does, for the model. Required for `http` tools; MCP servers describe
    /// their own tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub description: Option<String>,
    /// Call one HTTP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpToolSpec>,
    /// JSON Schema (`type: object`) of the arguments of an `http` tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::free_form_object")]
    pub parameters: Option<serde_json::Value>,
    /// Expose the tools of a remote MCP server (streamable HTTP transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpToolSpec>,
    /// Globs over session names allowed to call this tool.
    #[serde(default = "all_sessions")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub allowed_sessions: Vec<String>,
    /// Allow link-local and metadata addresses, the Kubernetes API server and (in cluster
    /// mode) loopback as targets. Kortex itself is never allowed.
    #[serde(default)]
    pub allow_private_targets: bool,
    /// Per-call timeout (default `10s`, never more than `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Results longer than this are truncated (flagged to the model), default 65536.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16_777_216))]
    pub max_result_bytes: Option<u32>,
    /// A usage guide (Markdown, at most 16 KiB) the model reads on demand with
    /// `get_tool_guide`, and MCP clients as the resource `kortex://guides/<tool name>`: how
    /// to use the tool well, argument formats, pitfalls. Its first line that is not a
    /// heading is its summary in `list_tool_guides`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16384))]
    pub guide: Option<String>,
}

fn all_sessions() -> Vec<String> {
    vec!["*".to_owned()]
}

/// An HTTP endpoint called with the model's arguments.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpToolSpec {
    /// `GET` sends the arguments as query parameters, `POST` as a JSON body.
    #[serde(default)]
    pub method: HttpMethod,
    /// Target URL; `{param}` placeholders are replaced by percent-encoded arguments.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HeaderSpec>,
    /// How to authenticate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
}

/// HTTP method of an `http` tool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// Arguments as query parameters.
    #[default]
    Get,
    /// Arguments as a JSON body.
    Post,
}

/// A remote MCP server whose tools are exposed to the model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolSpec {
    /// Streamable-HTTP endpoint of the server, e.g. `http://mcp-grafana:8000/mcp`.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HeaderSpec>,
    /// How to authenticate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// Globs over the server's tool names to expose.
    #[serde(default = "all_sessions")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub include: Vec<String>,
    /// Globs over the server's tool names to hide (beats `include`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub exclude: Vec<String>,
}

/// Credentials sent with each tool call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.type != 'apiKey' || has(self.header)",
    "message": "auth.header is required for type apiKey"
}, {
    "rule": "!(self.type in ['oauthClientCredentials', 'oauthTokenExchange']) || has(self.clientId)",
    "message": "auth.clientId is required for the OAuth types"
}]))]
pub struct AuthSpec {
    /// `bearer`: `Authorization: Bearer <secret>`; `apiKey`: the secret in `header`;
    /// `basic`: the secret holds `user:password`; `oauthClientCredentials` (MCP tools): a
    /// token from the server's authorization server, with `clientId` and the secret;
    /// `oauthTokenExchange` (MCP tools): each call on behalf of the chat user, with their
    /// token exchanged at that server (RFC 8693), the tools listed with client credentials.
    #[serde(rename = "type")]
    pub auth_type: AuthType,
    /// Where the secret is (the client secret, for the OAuth types).
    pub secret_ref: SecretKeyRef,
    /// Header name for `apiKey`, e.g. `X-API-Key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub header: Option<String>,
    /// The OAuth types: the OAuth client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub client_id: Option<String>,
    /// The OAuth types: the scopes asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    pub scopes: Vec<String>,
    /// The OAuth types: the authorization server the credentials are of (its
    /// issuer URL); default the first the MCP server's metadata names. When set, a server
    /// that names others is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub issuer: Option<String>,
}

/// Authentication scheme of a plugin tool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AuthType {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The key in a named header.
    ApiKey,
    /// HTTP basic authentication from `user:password`.
    Basic,
    /// OAuth client credentials (MCP tools only; `docs/tools.md#oauth`).
    OauthClientCredentials,
    /// On behalf of the chat user: the user's token exchanged (RFC 8693) for one for the
    /// MCP server; the tools are listed with client credentials (MCP tools only;
    /// `docs/tools.md#oauth`).
    OauthTokenExchange,
}

impl AuthType {
    /// Whether the token comes from an OAuth authorization server (MCP tools only).
    pub fn is_oauth(self) -> bool {
        matches!(
            self,
            Self::OauthClientCredentials | Self::OauthTokenExchange
        )
    }
}

/// Observed state of a `KortexTool`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KortexToolStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `SecretResolved`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Tool names exposed to models (for `mcp`: the discovered, included ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

impl KortexToolSpec {
    /// Every Secret key this tool reads.
    pub fn secret_refs(&self) -> Vec<&SecretKeyRef> {
        let (headers, auth) = match (&self.http, &self.mcp) {
            (Some(h), _) => (&h.headers, &h.auth),
            (None, Some(m)) => (&m.headers, &m.auth),
            (None, None) => return Vec::new(),
        };
        let mut refs: Vec<&SecretKeyRef> = auth.iter().map(|a| &a.secret_ref).collect();
        refs.extend(
            headers
                .iter()
                .filter_map(|h| h.value_from.as_ref().map(|v| &v.secret_key_ref)),
        );
        refs
    }
}

impl KortexTool {
    /// The tool name the model sees (or, for MCP, the prefix of the names it sees).
    pub fn tool_name(&self) -> String {
        match &self.spec.name {
            Some(name) => name.clone(),
            None => self
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .replace(['-', '.'], "_"),
        }
    }
}
