//! The real `kortex` binary: serve from a manifest folder, reload on edits, shut down
//! gracefully on SIGTERM; `crds` and `migrate`.

use crate::support::server::{BIN, Server};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PROVIDER: &str = "apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: local}
spec: {type: ollama, defaultModel: MODEL}
";

/// `path`'s body once it contains `needle`, polled every 50 ms for up to 10 s.
async fn poll_for(server: &Server, path: &str, needle: &str) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let (_, body) = server.get(path).await;
        if body.contains(needle) {
            return Some(body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn serves_reloads_on_edit_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let file = manifests.join("provider.yaml");
    std::fs::write(&file, PROVIDER.replace("MODEL", "llama3")).unwrap();
    std::fs::write(
        manifests.join("keys.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata: {name: k}\nstringData: {a: ${KORTEX_TEST_LEAK}}\n---\napiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: cloud}\nspec: {type: openai, apiKeySecretRef: {name: k, key: a}, defaultModel: gpt-5}\n",
    )
    .unwrap();
    let server = Server::start(
        &manifests,
        &dir.path().join("k.db"),
        &[("KORTEX_TEST_LEAK", "sk-LEAKCHECK-42")],
    );

    let (status, body) = server.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (_, body) = server.get("/api/v1/llm/providers").await;
    assert!(body.contains("\"defaultModel\":\"llama3\""), "{body}");
    assert!(!body.contains("LEAKCHECK"), "{body}");

    // Edit the manifest: the API follows (the watcher polls every 250 ms).
    std::fs::write(&file, PROVIDER.replace("MODEL", "qwen3")).unwrap();
    let edited = Instant::now();
    let seen = poll_for(
        &server,
        "/api/v1/llm/providers",
        "\"defaultModel\":\"qwen3\"",
    )
    .await;
    assert!(seen.is_some(), "edit not picked up; log:\n{}", server.log());
    eprintln!("reload visible after {:?}", edited.elapsed());

    // A broken edit keeps the last good version and names file and field.
    std::fs::write(&file, "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: local}\nspec: {type: ollama, maxTokens: -1}\n")
        .unwrap();
    let problem = poll_for(&server, "/api/v1/manifests", "maxTokens")
        .await
        .unwrap_or_default();
    assert!(
        problem.contains("provider.yaml:1: document 1 (LLMProvider default/local): spec.maxTokens"),
        "{problem}"
    );
    let (_, body) = server.get("/api/v1/llm/providers").await;
    assert!(
        body.contains("\"defaultModel\":\"qwen3\"") && body.contains("\"stale\":true"),
        "{body}"
    );

    let log = server.log();
    let status = server.terminate();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        !log.contains("LEAKCHECK"),
        "secret value in the log:\n{log}"
    );
}

#[tokio::test]
async fn json_logs_and_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--manifests"])
        .arg(dir.path().join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");

    // Beyond loopback without any chat credential: refuse to start.
    std::fs::write(dir.path().join("p.yaml"), PROVIDER.replace("MODEL", "x")).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--manifests"])
        .arg(dir.path())
        .arg("--database-url")
        .arg(format!("sqlite://{}", dir.path().join("x.db").display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without credentials"),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["--log-format", "json", "migrate", "--database-url"])
        .arg(format!("sqlite://{}", dir.path().join("m.db").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("migrations applied"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["level"], "INFO");
    assert!(dir.path().join("m.db").exists());
}

#[test]
fn crds_command_prints_the_crds_folder() {
    let out = Command::new(BIN).arg("crds").output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".kortex.dev.yaml"))
        .collect();
    names.sort();
    let files: String = names
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .map(|t| {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        })
        .collect();
    assert_eq!(printed, files);
    for kind in ["LLMProvider", "KortexTool", "ChatPolicy", "ActionProposal"] {
        assert!(printed.contains(&format!("kind: {kind}")), "{kind}");
    }
}
