//! What plugin tools call: a local HTTP upstream that records its requests, and a real MCP
//! server (the Python SDK's, `tests/fixtures/mcp_server.py`).

use crate::support::net::serve;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the upstream server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query exactly as sent.
    pub target: String,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

/// A local upstream: `/fail*` answers 503, `/slow*` waits 5 s, `/big*` returns 200 KB,
/// `/echo*` answers with the request's headers (as a careless debug endpoint would),
/// anything else `{"ok": true}`. Every request is recorded.
pub async fn upstream() -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let record = record.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20)
                .await
                .unwrap_or_default();
            let target = parts
                .uri
                .path_and_query()
                .map(ToString::to_string)
                .unwrap_or_default();
            if let Ok(mut s) = record.lock() {
                s.push(Seen {
                    method: parts.method.to_string(),
                    target: target.clone(),
                    headers: parts.headers.clone(),
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
            }
            if target.starts_with("/fail") {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "maintenance window".to_owned(),
                )
            } else if target.starts_with("/slow") {
                tokio::time::sleep(Duration::from_secs(5)).await;
                (StatusCode::OK, "late".to_owned())
            } else if target.starts_with("/echo") {
                let headers: serde_json::Map<String, Value> = parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), Value::from(v.to_str().unwrap_or_default())))
                    .collect();
                (StatusCode::OK, Value::Object(headers).to_string())
            } else if target.starts_with("/big") {
                (StatusCode::OK, "x".repeat(200_000))
            } else {
                (
                    StatusCode::OK,
                    r#"{"ok": true, "issues": ["OPS-1"]}"#.to_owned(),
                )
            }
        }
    });
    (serve(app).await, seen)
}

/// A running MCP test server (the Python SDK's); stops when dropped.
pub struct McpServer {
    child: std::process::Child,
    pub url: String,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python with the MCP SDK (server and client), or `None` (skipped) when it has none
/// and the run does not require it (`KORTEX_REQUIRE_MCP=1`, set by scripts/test.sh).
pub fn python_with_mcp() -> Option<String> {
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_mcp = std::process::Command::new(&python)
        .args(["-c", "import mcp.server.mcpserver, mcp.client"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_mcp {
        assert!(
            std::env::var("KORTEX_REQUIRE_MCP").is_err(),
            "{python} has no mcp package (pip install mcp==2.3.0)"
        );
        eprintln!("skipped: {python} has no mcp package");
        return None;
    }
    Some(python)
}

/// Starts the server, or `None` when the Python `mcp` package is missing and the test run
/// does not require it (`KORTEX_REQUIRE_MCP=1`, set by scripts/test.sh).
pub fn mcp_server(token: &str) -> Option<McpServer> {
    mcp_server_on(token, 0)
}

/// [`mcp_server`] on a given port (0: any free one).
pub fn mcp_server_on(token: &str, port: u16) -> Option<McpServer> {
    mcp_server_with(&["--port", &port.to_string(), "--token", token])
}

/// The server started with `args` (`--oauth-issuer URL`: an OAuth resource server).
pub fn mcp_server_with(args: &[&str]) -> Option<McpServer> {
    let python = python_with_mcp()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_server.py");
    let mut child = std::process::Command::new(&python)
        .arg(script)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let stdout = child.stdout.take().expect("no stdout");
    let mut line = String::new();
    let _ = BufReader::new(stdout).read_line(&mut line);
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("MCP server did not start: {line:?}"))
        .to_owned();
    Some(McpServer {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    })
}
