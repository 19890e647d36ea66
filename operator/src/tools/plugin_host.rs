//! What every plugin tool shares, HTTP or MCP: the egress rules, the two HTTP clients
//! (guarded, and open for `allowPrivateTargets`), and the request headers built from a
//! `KortexTool`'s resolved Secrets. Below both kinds of plugin, so neither needs the other.

use crate::catalog::ToolEntry;
use crate::crd::{AuthSpec, AuthType, HeaderSpec};
use crate::egress::Egress;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use std::sync::Arc;

/// Shared means of plugin tools: the egress rules and the two HTTP clients.
#[derive(Clone)]
pub struct PluginHost {
    /// What may not be reached.
    pub egress: Arc<Egress>,
    guarded: reqwest::Client,
    open: reqwest::Client,
}

impl PluginHost {
    /// Builds the clients.
    pub fn new(egress: Arc<Egress>) -> Result<Self, String> {
        Ok(Self {
            guarded: egress.plugin_client(false)?,
            open: egress.plugin_client(true)?,
            egress,
        })
    }

    /// The client for a tool.
    pub fn client(&self, allow_private: bool) -> reqwest::Client {
        if allow_private {
            self.open.clone()
        } else {
            self.guarded.clone()
        }
    }
}

/// Request headers of a plugin (auth included, secret values marked sensitive) and the
/// basic-auth pair, from the entry's resolved Secrets.
pub fn request_headers(
    entry: &ToolEntry,
    headers: &[HeaderSpec],
    auth: Option<&AuthSpec>,
) -> Result<(HeaderMap, Option<(String, String)>), String> {
    let secret = |r: &crate::crd::SecretKeyRef| {
        entry
            .secrets
            .get(r)
            .map(|v| v.expose().to_owned())
            .ok_or_else(|| format!("Secret {}/{} is not resolved", r.name, r.key))
    };
    let mut map = HeaderMap::new();
    let mut insert = |name: &str, value: &str, sensitive: bool| -> Result<(), String> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {name:?}"))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not a valid header value"))?;
        value.set_sensitive(sensitive);
        map.insert(name, value);
        Ok(())
    };
    for h in headers {
        match (&h.value, &h.value_from) {
            (Some(v), _) => insert(&h.name, v, false)?,
            (None, Some(from)) => insert(&h.name, &secret(&from.secret_key_ref)?, true)?,
            (None, None) => {}
        }
    }
    let mut basic = None;
    if let Some(a) = auth {
        let value = secret(&a.secret_ref)?;
        match a.auth_type {
            AuthType::Bearer => insert("authorization", &format!("Bearer {value}"), true)?,
            AuthType::ApiKey => insert(a.header.as_deref().unwrap_or("x-api-key"), &value, true)?,
            AuthType::Basic => {
                let (user, password) = value.split_once(':').ok_or_else(|| {
                    format!(
                        "Secret {}/{} must hold user:password for basic auth",
                        a.secret_ref.name, a.secret_ref.key
                    )
                })?;
                basic = Some((user.to_owned(), password.to_owned()));
            }
            // A token per request, from the MCP connection (`tools::mcp_oauth`).
            AuthType::OauthClientCredentials | AuthType::OauthTokenExchange => {}
        }
    }
    Ok((map, basic))
}
