//! `LLMProvider`: one LLM endpoint (Anthropic, OpenAI, Ollama, any OpenAI-compatible
//! server, or the Claude Code CLI) with its credentials, models and limits.

use super::{HeaderSpec, SecretKeyRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::core::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An LLM endpoint the chat server and the gateway may call.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kortex.dev",
    version = "v1alpha1",
    kind = "LLMProvider",
    plural = "llmproviders",
    singular = "llmprovider",
    namespaced,
    doc = "An LLM endpoint (Anthropic, OpenAI, Ollama or OpenAI-compatible) that Kortex may call.",
    status = "LLMProviderStatus",
    shortname = "llmp",
    category = "kortex",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Locality","type":"string","jsonPath":".spec.locality"}"#,
    printcolumn = r#"{"name":"Default Model","type":"string","jsonPath":".spec.defaultModel"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LLMProviderSpec {
    /// Wire protocol of the endpoint.
    #[serde(rename = "type")]
    pub provider_type: ProviderType,
    /// Endpoint root. Includes `/v1` for `openai` and `openai-compatible`; the host root for
    /// `anthropic` and `ollama`. Default: `https://api.anthropic.com`,
    /// `https://api.openai.com/v1` or `http://127.0.0.1:11434`; required for `openai-compatible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub base_url: Option<String>,
    /// The API key. Optional for `ollama` and for `openai-compatible` servers without auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
    /// `local` providers may serve `local-only` policies. Default: `local` for `ollama`,
    /// `cloud` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<Locality>,
    /// How tools are offered to the model. Default: `auto` for `openai-compatible` and
    /// `ollama` (open models on local servers often write calls as text), `native` for
    /// `openai` and `anthropic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_mode: Option<ToolMode>,
    /// Model used when a policy names none. Default: the first of `models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub default_model: Option<String>,
    /// Cheaper model tried first by `frugal` policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub fast_model: Option<String>,
    /// Extra PEM certificates to trust for this endpoint (internal CAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_secret_ref: Option<SecretKeyRef>,
    /// Allow link-local and metadata addresses, the Kubernetes API server and (in cluster
    /// mode) loopback as the endpoint, e.g. a model server in a sidecar. Kortex itself is
    /// never allowed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_targets: bool,
    /// Known models with their context sizes and prices. `ollama` and `openai-compatible`
    /// providers may discover more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub models: Vec<ModelSpec>,
    /// Output token limit per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_tokens: Option<u32>,
    /// Sampling temperature of calls that set none (chat runs never do; gateway clients
    /// may): e.g. `0` for repeatable answers from a local model. Default: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 2.0))]
    pub temperature: Option<f32>,
    /// Per-request timeout, e.g. `60s` (Go duration syntax). Default: `60s`; `600s` for
    /// `claude-code`, where one call is a whole Claude Code loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HeaderSpec>,
    /// `claude-code`: the Claude Code CLI to run (a name looked up on `PATH`, or a path).
    /// Default: `claude`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub command: Option<String>,
    /// `claude-code`: the Secret key holding your own Claude Code credential: the token
    /// `claude setup-token` prints, or an Anthropic API key (say which in `authKind`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_secret_ref: Option<SecretKeyRef>,
    /// `claude-code`: what `authSecretRef` holds. Default: `oauthToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_kind: Option<ClaudeCodeAuth>,
    /// `claude-code`: the most model turns one chat run's Claude Code loop may take; the
    /// policy's `maxToolDepth` bounds it too. Default: the policy's `maxToolDepth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_turns: Option<u32>,
}

/// What a `claude-code` provider's `authSecretRef` holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ClaudeCodeAuth {
    /// A long-lived token from `claude setup-token` (passed as `CLAUDE_CODE_OAUTH_TOKEN`).
    #[default]
    #[serde(rename = "oauthToken")]
    OauthToken,
    /// An Anthropic API key (passed as `ANTHROPIC_API_KEY`).
    #[serde(rename = "apiKey")]
    ApiKey,
}

/// The wire protocol a provider speaks.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProviderType {
    /// Anthropic Messages API.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// OpenAI Chat Completions API.
    #[serde(rename = "openai")]
    OpenAi,
    /// Ollama's native API.
    #[serde(rename = "ollama")]
    Ollama,
    /// Any server speaking the OpenAI API (vLLM, LiteLLM, LM Studio, ...).
    #[serde(rename = "openai-compatible")]
    OpenAiCompatible,
    /// The Claude Code CLI, run headless with your own credentials; its tools are only
    /// Kortex's, through Kortex's MCP endpoint.
    #[serde(rename = "claude-code")]
    ClaudeCode,
}

impl ProviderType {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::Ollama => "ollama",
            Self::OpenAiCompatible => "openai-compatible",
            Self::ClaudeCode => "claude-code",
        }
    }

    /// `baseUrl` when the spec sets none. `openai-compatible` has no sensible default.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::Anthropic => Some("https://api.anthropic.com"),
            Self::OpenAi => Some("https://api.openai.com/v1"),
            Self::Ollama => Some("http://127.0.0.1:11434"),
            Self::OpenAiCompatible => None,
            // Claude Code's own endpoint, unless `baseUrl` names another.
            Self::ClaudeCode => Some("https://api.anthropic.com"),
        }
    }

    /// Whether calls need an API key.
    pub fn requires_api_key(self) -> bool {
        matches!(self, Self::Anthropic | Self::OpenAi)
    }

    /// Whether the provider can list its own models.
    pub fn discovers_models(self) -> bool {
        matches!(self, Self::Ollama | Self::OpenAiCompatible)
    }

    /// `locality` when the spec sets none.
    pub fn default_locality(self) -> Locality {
        match self {
            Self::Ollama => Locality::Local,
            _ => Locality::Cloud,
        }
    }
}

/// Where a provider runs, for `local-only` policies.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Locality {
    /// Hosted by a third party: prompts leave the organisation.
    Cloud,
    /// Runs inside the organisation's own network.
    Local,
}

/// How tools are offered to the model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// Native tool calling, and calls the model wrote as text in a known open-model format
    /// (JSON with `name`/`arguments`, `<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`) are
    /// recovered as calls.
    Auto,
    /// The provider's native tool calling.
    Native,
    /// Tools described in the prompt and parsed from the answer (models without tool calling).
    Prompt,
    /// No tools: chat only.
    None,
}

/// One model of a provider's catalog.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Model id as the provider's API knows it.
    #[schemars(length(min = 1, max = 256))]
    pub id: String,
    /// Human-friendly name for the dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub display_name: Option<String>,
    /// Context window in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_tokens: Option<u64>,
    /// Rough capability class, used to pick models for roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<ModelTier>,
    /// Price per million tokens; a model without one is counted at 0 USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<ModelCost>,
}

/// Capability class of a model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelTier {
    /// Cheap and quick.
    Fast,
    /// The middle ground.
    Balanced,
    /// Most capable, slowest.
    Deep,
}

/// Prices in US dollars per million tokens.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCost {
    /// USD per million input tokens.
    #[schemars(range(min = 0.0))]
    pub input_usd_per_m_tok: f64,
    /// USD per million output tokens.
    #[schemars(range(min = 0.0))]
    pub output_usd_per_m_tok: f64,
}

/// Observed state of an `LLMProvider`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LLMProviderStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `SecretResolved`, `Ready`, `Reachable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Catalog and discovered model ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// The model ids the endpoint listed at the last successful probe (`openai-compatible`
    /// and `ollama`); replaced by every probe, so a model removed from the server goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovered_models: Vec<String>,
    /// `sha256:` of the referenced Secrets' uid and resourceVersion (never of their values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_hash: Option<String>,
}

impl LLMProviderSpec {
    /// The tool mode in force: `spec.toolMode`, else `auto` for `openai-compatible` and
    /// `ollama`, `native` for the others.
    pub fn tool_mode(&self) -> ToolMode {
        self.tool_mode.unwrap_or(match self.provider_type {
            ProviderType::OpenAiCompatible | ProviderType::Ollama => ToolMode::Auto,
            ProviderType::OpenAi | ProviderType::Anthropic | ProviderType::ClaudeCode => {
                ToolMode::Native
            }
        })
    }

    /// Every Secret key this provider reads, for resolution and for watching.
    pub fn secret_refs(&self) -> Vec<&SecretKeyRef> {
        let mut refs: Vec<&SecretKeyRef> = self.api_key_secret_ref.iter().collect();
        refs.extend(self.auth_secret_ref.iter());
        refs.extend(self.ca_bundle_secret_ref.iter());
        refs.extend(
            self.headers
                .iter()
                .filter_map(|h| h.value_from.as_ref().map(|v| &v.secret_key_ref)),
        );
        refs
    }
}
