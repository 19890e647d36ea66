//! `get_admin_info`: `GET /admin/info` (JSON) of an in-cluster Service, addressed only by
//! namespace and name (`http://<name>.<namespace>.svc.<cluster domain>:<port>/admin/info`), so
//! the model can reach nothing but a Service's admin endpoint.

use super::{Tool, ToolContext, ToolError};
use crate::llm::{BoxFuture, ToolSpec};
use serde_json::{Value, json};
use std::time::Duration;

/// Longest body read.
const MAX_BODY: usize = 256 * 1024;

/// The tool.
pub struct AdminInfo {
    client: reqwest::Client,
    cluster_domain: String,
}

impl AdminInfo {
    /// Reads Services of `cluster_domain` (e.g. `cluster.local`) with `client`, which should
    /// be the egress guard's (an `ExternalName` Service may point anywhere).
    pub fn new(client: reqwest::Client, cluster_domain: &str) -> Self {
        Self {
            client,
            cluster_domain: cluster_domain.trim_matches('.').to_owned(),
        }
    }
}

fn dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

impl Tool for AdminInfo {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_admin_info".into(),
            description: "Fetch GET /admin/info (JSON: version, build, feature flags, dependencies, whatever the service reports) from an in-cluster Service, by namespace and Service name.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                    "service": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 80}
                },
                "required": ["namespace", "service"],
                "additionalProperties": false
            }),
        }
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (Duration::from_secs(5), Duration::from_secs(30))
    }

    fn call(
        &self,
        _ctx: ToolContext,
        input: Value,
    ) -> BoxFuture<'static, Result<String, ToolError>> {
        let client = self.client.clone();
        let domain = self.cluster_domain.clone();
        Box::pin(async move {
            let namespace = input["namespace"].as_str().unwrap_or_default();
            let service = input["service"].as_str().unwrap_or_default();
            if !dns_label(namespace) || !dns_label(service) {
                return Err(ToolError::Validation(
                    "namespace and service must be DNS labels (lower-case letters, digits, '-')"
                        .into(),
                ));
            }
            let port = input["port"].as_u64().unwrap_or(80);
            let url = format!("http://{service}.{namespace}.svc.{domain}:{port}/admin/info");
            let response = client
                .get(&url)
                .header(reqwest::header::ACCEPT, "application/json")
                .send()
                .await
                .map_err(|e| {
                    ToolError::Upstream(format!("{url}: {}", super::plugin_http::error_chain(&e)))
                })?;
            let status = response.status();
            let (body, cut) = super::plugin_http::read_limited(response, MAX_BODY).await?;
            let text = String::from_utf8_lossy(&body).into_owned();
            if cut && status.is_success() {
                return Err(ToolError::Upstream(format!(
                    "{url} answered more than {} KiB; /admin/info should be a small JSON document",
                    MAX_BODY / 1024
                )));
            }
            if !status.is_success() {
                let excerpt: String = text.chars().take(300).collect();
                return Err(ToolError::Upstream(format!(
                    "upstream: {} from {url}: {}",
                    status.as_u16(),
                    excerpt.trim()
                )));
            }
            let info: Value = serde_json::from_str(&text)
                .map_err(|e| ToolError::Upstream(format!("{url} did not answer JSON: {e}")))?;
            Ok(
                json!({"service": format!("{namespace}/{service}"), "url": url, "info": info})
                    .to_string(),
            )
        })
    }
}
