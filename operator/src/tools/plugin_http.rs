//! `KortexTool` with `spec.http`: one HTTP endpoint called with the model's arguments.
//!
//! `{param}` placeholders in the URL are percent-encoded (every byte but the unreserved
//! ones), may only appear after the host, and the expanded URL must keep the template's
//! scheme, host and port; the remaining arguments go to the query string (`GET`) or a JSON
//! body (`POST`). Non-2xx answers are `isError` results such as `upstream: 503 Service
//! Unavailable: <excerpt>`; bodies are read up to `maxResultBytes`, and a cut is flagged.

use super::{Tool, ToolContext, ToolError};
use crate::crd::HttpMethod;
use crate::llm::{BoxFuture, ToolSpec};
use reqwest::header::HeaderMap;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Longest excerpt of an error body shown to the model.
const ERROR_EXCERPT: usize = 512;

/// One placeholder-bearing URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlTemplate {
    raw: String,
    /// Placeholder names, in order.
    pub placeholders: Vec<String>,
}

impl UrlTemplate {
    /// Parses `raw`, refusing placeholders in the scheme, host or port and unbalanced braces.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let after_scheme = raw
            .find("://")
            .map(|i| i + 3)
            .ok_or_else(|| format!("{raw:?} is not an absolute http(s) URL"))?;
        let authority_end = raw[after_scheme..]
            .find(['/', '?', '#'])
            .map_or(raw.len(), |i| after_scheme + i);
        if raw[..authority_end].contains(['{', '}']) {
            return Err(
                "placeholders may not appear in the scheme, host or port of the URL".to_owned(),
            );
        }
        let mut placeholders = Vec::new();
        let mut rest = &raw[authority_end..];
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err("unbalanced '}' in the URL".to_owned());
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| "unbalanced '{' in the URL".to_owned())?;
            let name = &rest[open + 1..open + close];
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!("invalid placeholder {{{name}}} in the URL"));
            }
            placeholders.push(name.to_owned());
            rest = &rest[open + close + 1..];
        }
        // The template itself (placeholders filled) must be a valid URL.
        base(&fill(raw, &placeholders, |_| "x".to_owned()))?;
        Ok(Self {
            raw: raw.to_owned(),
            placeholders,
        })
    }

    /// The URL for `args`; placeholders take their argument, percent-encoded.
    pub fn expand(&self, args: &Map<String, Value>) -> Result<reqwest::Url, ToolError> {
        let mut values = Vec::new();
        for name in &self.placeholders {
            let value = match args.get(name) {
                None | Some(Value::Null) => {
                    return Err(ToolError::Validation(format!(
                        "{name} is required: it is part of the URL"
                    )));
                }
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(_) => {
                    return Err(ToolError::Validation(format!(
                        "{name} must be a string, number or boolean: it is part of the URL"
                    )));
                }
            };
            // Encoded separators are decoded by some servers and proxies: no value may
            // hold a `.` or `..` segment that could climb out of the template's path.
            if value
                .split(['/', '\\'])
                .any(|segment| segment == "." || segment == "..")
            {
                return Err(ToolError::Validation(format!(
                    "{name} may not contain a '.' or '..' path segment: it is part of the URL"
                )));
            }
            values.push(percent_encode(&value));
        }
        let mut values = values.into_iter();
        let expanded = fill(&self.raw, &self.placeholders, |_| {
            values.next().unwrap_or_default()
        });
        let url = reqwest::Url::parse(&expanded).map_err(|e| {
            ToolError::Validation(format!("the arguments make an invalid URL: {e}"))
        })?;
        let template = base(&fill(&self.raw, &self.placeholders, |_| "x".to_owned()))
            .map_err(ToolError::Internal)?;
        if (url.scheme(), url.host_str(), url.port_or_known_default())
            != (
                template.scheme(),
                template.host_str(),
                template.port_or_known_default(),
            )
        {
            return Err(ToolError::Validation(
                "the arguments would change the URL's scheme, host or port".to_owned(),
            ));
        }
        Ok(url)
    }
}

fn fill(raw: &str, placeholders: &[String], mut value: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    for name in placeholders {
        let token = format!("{{{name}}}");
        if let Some(i) = rest.find(&token) {
            out.push_str(&rest[..i]);
            out.push_str(&value(name));
            rest = &rest[i + token.len()..];
        }
    }
    out.push_str(rest);
    out
}

fn base(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    match parsed.scheme() {
        "http" | "https" if parsed.host().is_some() => Ok(parsed),
        _ => Err("the URL must be http:// or https:// with a host".to_owned()),
    }
}

/// Percent-encodes every byte except the unreserved characters of RFC 3986.
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

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

    fn call(
        &self,
        _ctx: ToolContext,
        input: Value,
    ) -> BoxFuture<'static, Result<String, ToolError>> {
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
        let mut url = self.url.expand(&args)?;
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

pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn hostile_values_stay_inside_their_path_segment() {
        let t = match UrlTemplate::parse("http://bridge.tools.svc:8080/issues/{key}/comments?x=1") {
            Ok(t) => t,
            Err(e) => panic!("template rejected: {e}"),
        };
        let cases = [
            ("..x/admin", "/issues/..x%2Fadmin/comments"),
            ("a?b=c", "/issues/a%3Fb%3Dc/comments"),
            ("x#frag", "/issues/x%23frag/comments"),
            ("@evil.example", "/issues/%40evil.example/comments"),
            ("a b/ü", "/issues/a%20b%2F%C3%BC/comments"),
        ];
        for (value, path) in cases {
            let url = t
                .expand(&args(json!({"key": value})))
                .map(|u| {
                    (
                        u.host_str().map(str::to_owned),
                        u.path().to_owned(),
                        u.query().map(str::to_owned),
                    )
                })
                .map_err(|e| format!("{e:?}"));
            assert_eq!(
                url,
                Ok((
                    Some("bridge.tools.svc".into()),
                    path.to_owned(),
                    Some("x=1".into())
                )),
                "{value}"
            );
        }
        for dots in [".", "..", "../admin", "a/../../admin", "a\\..\\b", "./x"] {
            assert!(
                matches!(
                    t.expand(&args(json!({"key": dots}))),
                    Err(ToolError::Validation(_))
                ),
                "{dots}"
            );
        }
        // Slashes and dots within a segment are ordinary data.
        assert!(t.expand(&args(json!({"key": "src/main.rs"}))).is_ok());
        assert!(t.expand(&args(json!({"key": "v1..2"}))).is_ok());
        assert!(matches!(
            t.expand(&args(json!({}))),
            Err(ToolError::Validation(m)) if m.contains("key is required")
        ));
    }

    #[test]
    fn placeholders_cannot_touch_scheme_host_or_port() {
        for raw in [
            "http://{host}/x",
            "http://example.com:{port}/x",
            "{scheme}://example.com/x",
            "http://user{u}@example.com/x",
            "http://example.com/{open",
            "http://example.com/close}",
            "http://example.com/{bad name}",
            "ftp://example.com/x",
        ] {
            assert!(UrlTemplate::parse(raw).is_err(), "{raw}");
        }
        let t = UrlTemplate::parse("https://example.com/a/{b}?q={c}");
        assert_eq!(
            t.map(|t| t.placeholders),
            Ok(vec!["b".to_owned(), "c".to_owned()])
        );
    }

    #[test]
    fn query_values_repeat_arrays_and_encode_objects() {
        assert_eq!(query_values(&json!(["a", 2])), vec!["a", "2"]);
        assert_eq!(query_values(&json!({"k": 1})), vec![r#"{"k":1}"#]);
        assert!(query_values(&Value::Null).is_empty());
    }
}
