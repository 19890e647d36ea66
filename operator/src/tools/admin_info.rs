//! `get_admin_info`: `GET /admin/info` (JSON) of an in-cluster Service, addressed only by
//! namespace and name (`http://<name>.<namespace>.svc.<cluster domain>:<port>/admin/info`), so
//! the model can reach nothing but a Service's admin endpoint.
//!
//! The Service is read first through the Kubernetes API as the call's identity (the session
//! user with `runToolsAsUser`, Kortex otherwise): a caller who may not `get` the Service
//! cannot read its admin endpoint through Kortex either, a name that is not a Service is
//! refused before any connection, `ExternalName` Services (which point outside the cluster)
//! are refused, and the port must be one the Service declares.

use super::cluster::Cluster;
use super::{Tool, ToolContext, ToolError, ToolFuture};
use crate::llm::ToolSpec;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// Longest body read.
const MAX_BODY: usize = 256 * 1024;

/// The tool.
pub struct AdminInfo {
    cluster: Arc<Cluster>,
    client: reqwest::Client,
    cluster_domain: String,
}

impl AdminInfo {
    /// Reads the Services of `cluster` (as the call's identity), then their admin endpoints
    /// under `cluster_domain` (e.g. `cluster.local`) with `client`, which should be the egress
    /// guard's.
    pub fn new(cluster: Arc<Cluster>, client: reqwest::Client, cluster_domain: &str) -> Self {
        Self {
            cluster,
            client,
            cluster_domain: cluster_domain.trim_matches('.').to_owned(),
        }
    }
}

/// The port to read: the one asked for, which the Service must declare; without one, the
/// Service's only port, else its port 80.
fn choose_port(service: &Value, asked: Option<u64>, name: &str) -> Result<u64, ToolError> {
    let ports: Vec<u64> = service["spec"]["ports"]
        .as_array()
        .map(|ports| ports.iter().filter_map(|p| p["port"].as_u64()).collect())
        .unwrap_or_default();
    let listed = || {
        ports
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match asked {
        Some(port) if ports.contains(&port) => Ok(port),
        Some(port) => Err(ToolError::Validation(format!(
            "Service {name} has no port {port}; its ports: [{}]",
            listed()
        ))),
        None if ports.len() == 1 => Ok(ports[0]),
        None if ports.contains(&80) => Ok(80),
        None => Err(ToolError::Validation(format!(
            "Service {name} has several ports and none is 80: give `port`, one of [{}]",
            listed()
        ))),
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
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "One of the Service's ports (default: its only port, else 80)."}
                },
                "required": ["namespace", "service"],
                "additionalProperties": false
            }),
        }
    }

    fn kubernetes(&self) -> bool {
        true
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (Duration::from_secs(5), Duration::from_secs(30))
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let client = self.client.clone();
        let domain = self.cluster_domain.clone();
        let cluster = self.cluster.as_caller(&ctx);
        Box::pin(async move {
            let namespace = input["namespace"].as_str().unwrap_or_default();
            let service = input["service"].as_str().unwrap_or_default();
            if !dns_label(namespace) || !dns_label(service) {
                return Err(ToolError::Validation(
                    "namespace and service must be DNS labels (lower-case letters, digits, '-')"
                        .into(),
                ));
            }
            let name = format!("{namespace}/{service}");
            let object = cluster?
                .get_json(&format!(
                    "/api/v1/namespaces/{namespace}/services/{service}"
                ))
                .await
                .map_err(|e| match e {
                    ToolError::Upstream(m) if m.starts_with("not found") => {
                        ToolError::Validation(format!("there is no Service {name}: {m}"))
                    }
                    other => other,
                })?;
            if object["spec"]["type"] == "ExternalName" {
                return Err(ToolError::Denied(format!(
                    "Service {name} is an ExternalName Service (it points at {}, outside the cluster); get_admin_info reads only in-cluster Services",
                    object["spec"]["externalName"]
                        .as_str()
                        .unwrap_or("another host")
                )));
            }
            let port = choose_port(&object, input["port"].as_u64(), &name)?;
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
            Ok(json!({"service": name, "url": url, "info": info}).to_string())
        })
    }
}
