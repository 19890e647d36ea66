//! The real binaries: `kortex serve` / `kortex run` started on a free port (and killed when
//! dropped), and `kubectl-kortex`.

use crate::support::chat::chat_with_calls;
use crate::support::fake_api::{
    FakeApi, deployment, incidents_policy, phase, proposal_named, provider, secret,
    write_kubeconfig,
};
use crate::support::net::http_client;
use crate::support::provider::mock;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_kortex");

pub struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(manifests: &Path, db: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_with_url(manifests, &format!("sqlite://{}", db.display()), env)
    }

    pub fn start_with_args(manifests: &Path, db: &Path, args: &[&str]) -> Self {
        Self::launch(manifests, &format!("sqlite://{}", db.display()), &[], args)
    }

    /// `kortex serve` on `manifests` with its database `k.db` in `dir`, reading the cluster of
    /// `kubeconfig` (a fake API server's).
    pub fn start_on_cluster(manifests: &Path, dir: &Path, kubeconfig: &Path) -> Self {
        let kubeconfig = kubeconfig.display().to_string();
        Self::start_with_args(manifests, &dir.join("k.db"), &["--kubeconfig", &kubeconfig])
    }

    pub fn start_with_url(manifests: &Path, database_url: &str, env: &[(&str, &str)]) -> Self {
        Self::launch(manifests, database_url, env, &[])
    }

    /// `kortex serve` on `manifests` with the database `db`, listening on `listen` (a fixed
    /// address, for a `--public-url` known in advance), with `args`.
    pub fn start_at(manifests: &Path, db: &Path, listen: &str, args: &[&str]) -> Self {
        Self::launch_at(
            manifests,
            &format!("sqlite://{}", db.display()),
            listen,
            &[],
            args,
        )
    }

    fn launch(manifests: &Path, database_url: &str, env: &[(&str, &str)], args: &[&str]) -> Self {
        Self::launch_at(manifests, database_url, "127.0.0.1:0", env, args)
    }

    fn launch_at(
        manifests: &Path,
        database_url: &str,
        listen: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let mut full = vec!["serve", "--listen", listen, "--manifests"];
        let manifests = manifests.display().to_string();
        full.push(&manifests);
        full.extend(["--database-url", database_url]);
        full.extend(args);
        Self::spawn(&full, env)
    }

    /// Key mode: `kortex serve` listening off loopback (so every call needs a chat key),
    /// with `env`; and the `http://127.0.0.1:PORT` base to call it at.
    pub fn start_keyed(
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
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
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
        let stderr = child.stderr.take().expect("no stderr");
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

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let resp = http_client()
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    /// The server's resident memory (Linux), in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// SIGKILL: the process dies at once, as in a node failure or an OOM kill.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (killing it if it hangs).
    pub fn terminate(mut self) -> std::process::ExitStatus {
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

/// Starts `kortex run` on `fake` with a provider answering from `llm`; returns once ready.
pub async fn start_run(fake: &FakeApi, dir: &std::path::Path, llm: &str) -> Server {
    start_run_with(fake, dir, llm, &[]).await
}

pub async fn start_run_with(
    fake: &FakeApi,
    dir: &std::path::Path,
    llm: &str,
    extra: &[&str],
) -> Server {
    start_run_with_env(fake, dir, llm, extra, &[]).await
}

/// `kortex run` on `fake` in Kubernetes auth behind an authenticating proxy: the user in
/// `X-Forwarded-User` is believed from `from` (with `extra` flags besides); `fake` holds the
/// ChatPolicy `all` (every session in team-a, provider `gpt`) and allows each of `users`.
pub async fn start_behind_proxy(
    fake: &FakeApi,
    dir: &Path,
    llm: &str,
    users: &[&str],
    from: &str,
    extra: &[&str],
) -> Server {
    fake.apply(
        "chatpolicies",
        json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "all", "namespace": "team-a"},
            "spec": {"sessions": ["*"], "provider": "gpt"}}),
    );
    for user in users {
        fake.allow(user);
    }
    let mut args = vec![
        "--auth",
        "kubernetes",
        "--auth-proxy-header",
        "X-Forwarded-User",
        "--auth-proxy-from",
        from,
    ];
    args.extend(extra);
    start_run_with(fake, dir, llm, &args).await
}

/// [`start_run_with`] with more environment variables.
pub async fn start_run_with_env(
    fake: &FakeApi,
    dir: &std::path::Path,
    llm: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Server {
    fake.apply("llmproviders", provider(llm));
    // A test that planted its own key keeps it.
    if fake.get("secrets", "team-a", "llm-keys").is_none() {
        fake.apply("secrets", secret(Some("sk-cluster-123")));
    }
    let kubeconfig = write_kubeconfig(dir, &fake.url).display().to_string();
    let db = format!("sqlite://{}", dir.join("k.db").display());
    let mut args = vec![
        "run",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &db,
        "--kortex-namespace",
        "kortex",
        "--probe-interval",
        "3600s",
    ];
    if !extra.contains(&"--identity") {
        args.extend(["--identity", "pod-a"]);
    }
    args.extend(extra);
    let mut vars = vec![("KUBECONFIG", kubeconfig.as_str())];
    vars.extend(env.iter().copied());
    let server = Server::spawn(&args, &vars);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = server.get("/readyz").await;
        if code == 200 {
            return server;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {body}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kortex <args>` (a command of the command line) run to its end on a blocking thread, so
/// the test's fakes keep serving, with `input` written to its stdin; its output. Like
/// [`Server::spawn`], it never sees the machine's own keys or server.
pub fn kortex_cli(
    args: &[&str],
    input: &str,
) -> impl Future<Output = std::process::Output> + use<> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let input = input.to_owned();
    let run = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(BIN)
            .args(&args)
            .env_remove("KORTEX_API_KEY")
            .env_remove("KORTEX_SERVER")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(input.as_bytes());
        }
        child.wait_with_output().unwrap()
    });
    async { run.await.unwrap() }
}

/// Runs `kubectl-kortex` with `kubeconfig`; whether it succeeded, and its output.
pub async fn kubectl_kortex(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
    let (kubeconfig, args): (std::path::PathBuf, Vec<String>) = (
        kubeconfig.to_path_buf(),
        args.iter().map(|a| (*a).to_owned()).collect(),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kortex"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
    })
    .await
    .unwrap()
    .expect("kubectl-kortex");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Deployments `targets` in shop, the ChatPolicy `incidents` (restart in shop), bob allowed
/// to restart, `kortex run` started, and a chat whose model proposes restarting each
/// target: returns the server and the names of the Pending proposals, in `targets` order.
pub async fn pending_restarts(
    fake: &FakeApi,
    dir: &std::path::Path,
    targets: &[&str],
) -> (Server, Vec<String>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (llm, script) = mock().await;
    for name in targets {
        let mut d = deployment();
        d["metadata"]["name"] = json!(name);
        fake.apply("deployments", d);
    }
    fake.apply(
        "chatpolicies",
        incidents_policy(json!({"allowedActions": ["restart"], "allowedNamespaces": ["shop"]})),
    );
    fake.allow("bob");
    let server = start_run(fake, dir, &llm).await;
    let calls: Vec<(String, Value)> = targets
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (format!("p{i}"), json!({"action": "restart", "rationale": "stuck",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": name}}))
        })
        .collect();
    let calls: Vec<(&str, &str, Value)> = calls
        .iter()
        .map(|(id, input)| (id.as_str(), "propose_action", input.clone()))
        .collect();
    chat_with_calls(
        &server,
        &script,
        &calls,
        "Proposed.",
        json!({"name": "incident-10", "namespace": "team-a"}),
        "restart them",
    )
    .await;
    let name_of = |f: &FakeApi, target: &str| {
        proposal_named(f, &format!("restart-{target}-"))
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
    };
    fake.until("the proposals pending", |f| {
        targets
            .iter()
            .all(|t| name_of(f, t).is_some_and(|n| phase(f, &n) == "Pending"))
    })
    .await;
    let names = targets.iter().filter_map(|t| name_of(fake, t)).collect();
    (server, names)
}
