//! The real `kortex` binary: serve from a manifest folder, reload on edits, shut down
//! gracefully on SIGTERM; `crds` and `migrate`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kortex");

pub(crate) struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    pub(crate) fn start(manifests: &Path, db: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_with_url(manifests, &format!("sqlite://{}", db.display()), env)
    }

    pub(crate) fn start_with_args(manifests: &Path, db: &Path, args: &[&str]) -> Self {
        Self::launch(manifests, &format!("sqlite://{}", db.display()), &[], args)
    }

    pub(crate) fn start_with_url(
        manifests: &Path,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::launch(manifests, database_url, env, &[])
    }

    fn launch(manifests: &Path, database_url: &str, env: &[(&str, &str)], args: &[&str]) -> Self {
        let mut full = vec!["serve", "--listen", "127.0.0.1:0", "--manifests"];
        let manifests = manifests.display().to_string();
        full.push(&manifests);
        full.extend(["--database-url", database_url]);
        full.extend(args);
        Self::spawn(&full, env)
    }

    /// Key mode: `kortex serve` listening off loopback (so every call needs a chat key),
    /// with `env`; and the `http://127.0.0.1:PORT` base to call it at.
    pub(crate) fn start_keyed(
        manifests: &Path,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> (Self, String) {
        let manifests = manifests.display().to_string();
        let server = Self::spawn(
            &[
                "serve",
                "--listen",
                "0.0.0.0:0",
                "--manifests",
                &manifests,
                "--database-url",
                database_url,
            ],
            env,
        );
        let base = server
            .url("")
            .replace("0.0.0.0", "127.0.0.1")
            .trim_end_matches('/')
            .to_owned();
        (server, base)
    }

    /// `kortex <args>` with `env`, once it says where it listens.
    pub(crate) fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env_remove("DATABASE_URL")
            // The samples read provider keys from these: tests never use the machine's own.
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(
                        addr.split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .to_owned(),
                    );
                }
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "server did not start; log:\n{}",
                    log.lock().map(|l| l.clone()).unwrap_or_default()
                )
            });
        Self { child, addr, log }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let resp = crate::common::http_client()
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    /// The server's resident memory (Linux), in bytes.
    pub(crate) fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// SIGKILL: the process dies at once, as in a node failure or an OOM kill.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (killing it if it hangs).
    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("server ignored SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

const PROVIDER: &str = "apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: local}
spec: {type: ollama, defaultModel: MODEL}
";

#[tokio::test]
async fn serves_reloads_on_edit_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap_or_else(|e| panic!("{e}"));
    let file = manifests.join("provider.yaml");
    std::fs::write(&file, PROVIDER.replace("MODEL", "llama3")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        manifests.join("keys.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata: {name: k}\nstringData: {a: ${KORTEX_TEST_LEAK}}\n---\napiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: cloud}\nspec: {type: openai, apiKeySecretRef: {name: k, key: a}, defaultModel: gpt-5}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
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
    std::fs::write(&file, PROVIDER.replace("MODEL", "qwen3")).unwrap_or_else(|e| panic!("{e}"));
    let edited = Instant::now();
    let mut seen = false;
    while edited.elapsed() < Duration::from_secs(10) {
        let (_, body) = server.get("/api/v1/llm/providers").await;
        if body.contains("\"defaultModel\":\"qwen3\"") {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "edit not picked up; log:\n{}", server.log());
    eprintln!("reload visible after {:?}", edited.elapsed());

    // A broken edit keeps the last good version and names file and field.
    std::fs::write(&file, "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: local}\nspec: {type: ollama, maxTokens: -1}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut problem = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let (_, body) = server.get("/api/v1/manifests").await;
        if body.contains("maxTokens") {
            problem = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(BIN)
        .args(["serve", "--manifests"])
        .arg(dir.path().join("missing"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");

    // Beyond loopback without any chat credential: refuse to start.
    std::fs::write(dir.path().join("p.yaml"), PROVIDER.replace("MODEL", "x"))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--manifests"])
        .arg(dir.path())
        .arg("--database-url")
        .arg(format!("sqlite://{}", dir.path().join("x.db").display()))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
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
        .unwrap_or_else(|e| panic!("{e}"));
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
    let out = Command::new(BIN)
        .arg("crds")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
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
