//! `KortexTool` with `spec.http`: one HTTP endpoint called with the model's arguments.
//!
//! `{param}` placeholders in the URL ([`UrlTemplate`]) are percent-encoded (every byte
//! but the unreserved ones), may only appear after the host, and the expanded URL must
//! keep the template's scheme, host and port; the remaining arguments go to the query
//! string (`GET`) or a JSON body (`POST`). Non-2xx answers are `isError` results such as
//! `upstream: 503 Service Unavailable: <excerpt>`; bodies are read up to
//! `maxResultBytes`, and a cut is flagged.

use super::{Tool, ToolContext, ToolError, ToolFuture};
pub use crate::catalog::url_template::{UrlTemplate, percent_encode};
use crate::crd::HttpMethod;
use crate::llm::ToolSpec;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Longest excerpt of an error body shown to the model.
const ERROR_EXCERPT: usize = 512;

/// A ready-to-call HTTP tool.
pub struct HttpTool {
    /// What the model sees.
    pub spec: ToolSpec,
    /// `GET` or `POST`.
    pub method: HttpMethod,
    /// The URL.
    pub url: UrlTemplate,
    /// Headers, auth included (values marked sensitive).
    pub headers: HeaderMap,
    /// Basic credentials.
    pub basic: Option<(String, String)>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Longest body read.
    pub max_bytes: usize,
    /// The client (guarded unless `allowPrivateTargets`).
    pub client: reqwest::Client,
    /// The egress rules (literal addresses are checked here, names by the client).
    pub egress: Arc<crate::egress::Egress>,
    /// `allowPrivateTargets`.
    pub open: bool,
}

impl Tool for HttpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn timeouts(&self) -> (Duration, Duration) {
        (self.timeout, crate::catalog::TOOL_TIMEOUT_CEILING)
    }

    fn call(&self, _ctx: ToolContext, input: Value) -> ToolFuture {
        let prepared = self.prepare(input);
        let max_bytes = self.max_bytes;
        Box::pin(async move {
            let request = prepared?;
            let response = request.send().await.map_err(transport_error)?;
            read_response(response, max_bytes).await
        })
    }
}

impl HttpTool {
    fn prepare(&self, input: Value) -> Result<reqwest::RequestBuilder, ToolError> {
        let mut args = match input {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(ToolError::Validation("arguments must be an object".into())),
        };
        apply_defaults(&self.spec.parameters, &mut args);
        let mut url = self.url.expand(&args).map_err(ToolError::Validation)?;
        self.egress
            .check_url(&url, self.open)
            .map_err(ToolError::Denied)?;
        for name in &self.url.placeholders {
            args.remove(name);
        }
        let mut request = match self.method {
            HttpMethod::Get => {
                if !args.is_empty() {
                    let mut pairs = url.query_pairs_mut();
                    for (key, value) in &args {
                        for v in query_values(value) {
                            pairs.append_pair(key, &v);
                        }
                    }
                }
                self.client.get(url)
            }
            HttpMethod::Post => self.client.post(url).json(&Value::Object(args)),
        };
        request = request.headers(self.headers.clone()).timeout(self.timeout);
        // The call's trace goes on at the tool (W3C Trace Context).
        for (name, value) in crate::telemetry::trace::headers() {
            request = request.header(name, value);
        }
        if let Some((user, password)) = &self.basic {
            request = request.basic_auth(user, Some(password));
        }
        Ok(request)
    }
}

/// Query values of one argument: arrays repeat the key, objects are sent as JSON.
fn query_values(value: &Value) -> Vec<String> {
    match value {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(query_values).collect(),
        Value::Object(_) => vec![value.to_string()],
        other => vec![other.to_string()],
    }
}

/// Fills in the `default` of top-level properties the model left out.
pub fn apply_defaults(schema: &Value, args: &mut Map<String, Value>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            if let Some(default) = prop.get("default")
                && !args.contains_key(name)
            {
                args.insert(name.clone(), default.clone());
            }
        }
    }
}

/// A 2xx body (up to `max_bytes`, a cut flagged), or an `upstream: <status>` error.
async fn read_response(response: reqwest::Response, max_bytes: usize) -> Result<String, ToolError> {
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let limit = if status.is_success() {
        max_bytes
    } else {
        ERROR_EXCERPT
    };
    let (body, cut) = read_limited(response, limit).await?;
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        let excerpt = text.trim();
        let status_text = format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        );
        let status_text = status_text.trim_end();
        return Err(ToolError::Upstream(match (excerpt.is_empty(), cut) {
            (true, _) => format!("upstream: {status_text}"),
            (false, false) => format!("upstream: {status_text}: {excerpt}"),
            (false, true) => format!("upstream: {status_text}: {excerpt}…"),
        }));
    }
    let binary = std::str::from_utf8(&body).is_err()
        && !cut
        && !(content_type.starts_with("text/") || content_type.contains("json"));
    if binary {
        return Ok(format!(
            "[binary response: {} bytes of {content_type:?}, not shown]",
            body.len()
        ));
    }
    let mut out = text.into_owned();
    if cut {
        out.push_str(&format!(
            "\n[truncated: the response is longer than maxResultBytes ({max_bytes} bytes); the rest was not read]"
        ));
    }
    Ok(out)
}

/// Reads at most `limit` bytes of the body; whether there was more.
pub(crate) async fn read_limited(
    response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), ToolError> {
    let (mut body, cut) = crate::egress::read_capped(response, limit)
        .await
        .map_err(transport_error)?;
    if cut {
        // Do not cut inside a UTF-8 sequence.
        while !body.is_empty() && std::str::from_utf8(&body).is_err() {
            match std::str::from_utf8(&body) {
                Err(e) if e.error_len().is_none() => body.truncate(e.valid_up_to()),
                _ => break,
            }
        }
    }
    Ok((body, cut))
}

/// An error with its sources, e.g. `error sending request: refused: … allowPrivateTargets`.
/// A failed exchange: the tool's own timeout is a `timeout`, anything else `upstream`.
fn transport_error(e: reqwest::Error) -> ToolError {
    if e.is_timeout() {
        ToolError::Timeout("upstream: no complete answer within the tool's timeout".into())
    } else {
        ToolError::Upstream(format!("upstream: {}", error_chain(&e)))
    }
}

pub use crate::egress::error_chain;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn query_values_repeat_arrays_and_encode_objects() {
        assert_eq!(query_values(&json!(["a", 2])), vec!["a", "2"]);
        assert_eq!(query_values(&json!({"k": 1})), vec![r#"{"k":1}"#]);
        assert!(query_values(&Value::Null).is_empty());
    }
}
