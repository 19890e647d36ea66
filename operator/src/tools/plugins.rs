//! Plugin tools from `KortexTool` resources, kept in step with the live configuration.
//!
//! The [`PluginSet`] is a snapshot, swapped whole: HTTP tools are built straight from their
//! catalog entries; MCP tools are whatever each server's connection task last discovered.
//! Tools belong to the namespace of their `KortexTool` and are offered only to sessions of
//! that namespace whose name matches `allowedSessions`.

use super::mcp::{self, McpServer};
pub use super::plugin_host::{PluginHost, request_headers};
use super::plugin_http::{HttpTool, UrlTemplate};
use super::{Registered, Tool};
use crate::catalog::{ObjectKey, ToolEntry};
use crate::live::LiveConfig;
use crate::llm::ToolSpec;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// A `KortexTool`'s guide, shared by the tools it exposes.
#[derive(Debug)]
pub struct PluginGuide {
    /// The `KortexTool`'s tool name (the prefix, for an MCP server).
    pub name: String,
    /// The Markdown.
    pub body: Arc<str>,
}

/// One plugin tool as offered.
pub struct Plugin {
    /// The tool, its spec and compiled schema.
    pub registered: Registered,
    /// Globs over session names.
    pub allowed_sessions: Vec<String>,
    /// The `KortexTool` it comes from.
    pub source: ObjectKey,
    /// The `KortexTool`'s guide, if it has one.
    pub guide: Option<Arc<PluginGuide>>,
}

/// What an MCP server's last discovery found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Discovery {
    /// Exposed names (`<name>__<remote tool>`).
    pub tools: Vec<String>,
    /// The last connection or discovery error, if the last attempt failed.
    pub error: Option<String>,
    /// Server tools left out, and why.
    pub skipped: Vec<String>,
    /// When the last discovery succeeded.
    pub discovered_at: Option<jiff::Timestamp>,
}

/// The plugin tools of every namespace.
#[derive(Default)]
pub struct PluginSet {
    /// namespace → exposed name → tool.
    pub tools: BTreeMap<String, BTreeMap<String, Arc<Plugin>>>,
    /// MCP discovery state by `KortexTool`.
    pub discovery: BTreeMap<ObjectKey, Discovery>,
    /// Problems building HTTP tools, by `KortexTool`.
    pub problems: BTreeMap<ObjectKey, String>,
}

impl PluginSet {
    /// The tool `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Plugin>> {
        self.tools.get(namespace).and_then(|m| m.get(name))
    }
}

/// The HTTP tool of an available entry.
fn http_tool(entry: &ToolEntry, host: &PluginHost) -> Result<HttpTool, String> {
    let spec = &entry.object.spec;
    let http = spec
        .http
        .as_ref()
        .ok_or_else(|| "not an http tool".to_owned())?;
    let url = UrlTemplate::parse(&http.url).map_err(|e| format!("spec.http.url: {e}"))?;
    let (headers, basic) = request_headers(entry, &http.headers, http.auth.as_ref())?;
    let parameters = spec
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    Ok(HttpTool {
        spec: ToolSpec {
            name: entry.tool_name.clone(),
            description: spec.description.clone().unwrap_or_default(),
            parameters,
        },
        method: http.method,
        url,
        headers,
        basic,
        timeout: entry.timeout(),
        max_bytes: entry.max_result_bytes() as usize,
        client: host.client(spec.allow_private_targets),
        egress: host.egress.clone(),
        open: spec.allow_private_targets,
    })
}

fn plugin(entry: &ToolEntry, key: &ObjectKey, tool: Arc<dyn Tool>) -> Arc<Plugin> {
    let guide = entry.object.spec.guide.as_deref().map(|body| {
        Arc::new(PluginGuide {
            name: entry.tool_name.clone(),
            body: Arc::from(body),
        })
    });
    Arc::new(Plugin {
        registered: Registered::new(tool),
        allowed_sessions: entry.object.spec.allowed_sessions.clone(),
        source: key.clone(),
        guide,
    })
}

/// Keeps the plugin set in step with the configuration and the MCP servers until `stop`.
pub async fn run(
    mut config: watch::Receiver<Arc<LiveConfig>>,
    out: watch::Sender<Arc<PluginSet>>,
    host: PluginHost,
    mut stop: watch::Receiver<bool>,
) {
    let (found_tx, mut found_rx) = mpsc::channel::<mcp::Found>(16);
    let mut servers: BTreeMap<ObjectKey, McpServer> = BTreeMap::new();
    let mut found: BTreeMap<ObjectKey, mcp::Found> = BTreeMap::new();
    loop {
        let current = config.borrow_and_update().clone();
        let entries: BTreeMap<&ObjectKey, &ToolEntry> = current
            .catalog
            .tools
            .iter()
            .filter(|(_, e)| e.available)
            .collect();
        // Start, restart (spec or Secret changed) and stop MCP connections.
        servers.retain(|key, server| {
            let keep = entries.get(key).is_some_and(|e| server.serves(e, &host));
            if !keep {
                found.remove(key);
            }
            keep
        });
        for (key, entry) in &entries {
            if entry.object.spec.mcp.is_some() && !servers.contains_key(*key) {
                match McpServer::start((*key).clone(), entry, &host, found_tx.clone()) {
                    Ok(server) => {
                        servers.insert((*key).clone(), server);
                    }
                    Err(e) => {
                        found.insert((*key).clone(), mcp::Found::failed((*key).clone(), e));
                    }
                }
            }
        }
        let redactor = &current.catalog.redactor;
        out.send_replace(Arc::new(build(&entries, &host, &found, redactor)));

        tokio::select! {
            changed = config.changed() => if changed.is_err() { break },
            Some(update) = found_rx.recv() => {
                // Late reports of a stopped or restarted server are dropped.
                if servers.get(&update.key).is_some_and(|s| s.generation() == update.generation) {
                    found.insert(update.key.clone(), update);
                }
            }
            _ = stop.changed() => break,
        }
    }
}

/// The set for the current entries and discoveries.
fn build(
    entries: &BTreeMap<&ObjectKey, &ToolEntry>,
    host: &PluginHost,
    found: &BTreeMap<ObjectKey, mcp::Found>,
    redactor: &crate::redact::SecretRedactor,
) -> PluginSet {
    // Errors come from remote servers, which may echo what they were sent.
    let clean = |e: &str| redactor.redact(e).0;
    let mut set = PluginSet::default();
    for (key, entry) in entries {
        let namespace = set.tools.entry(key.namespace.clone()).or_default();
        if entry.object.spec.http.is_some() {
            match http_tool(entry, host) {
                Ok(tool) => {
                    namespace.insert(entry.tool_name.clone(), plugin(entry, key, Arc::new(tool)));
                }
                Err(e) => {
                    set.problems.insert((*key).clone(), clean(&e));
                }
            }
        } else if let Some(f) = found.get(*key) {
            let mut names = Vec::new();
            for tool in &f.tools {
                let name = tool.spec().name;
                // A discovered name may not shadow a built-in or another plugin.
                if crate::catalog::BUILTIN_TOOLS.contains(&name.as_str())
                    || namespace.contains_key(&name)
                {
                    continue;
                }
                names.push(name.clone());
                namespace.insert(name, plugin(entry, key, tool.clone()));
            }
            set.discovery.insert(
                (*key).clone(),
                Discovery {
                    tools: names,
                    error: f.error.as_deref().map(clean),
                    skipped: f.skipped.clone(),
                    discovered_at: f.discovered_at,
                },
            );
        } else {
            set.discovery.insert((*key).clone(), Discovery::default());
        }
    }
    set
}
