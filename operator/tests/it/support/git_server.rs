//! A real Git server on 127.0.0.1: `git http-backend` run as CGI behind HTTP basic auth,
//! recording every request, with a mode that answers everything with a redirect; and the
//! `git` command line the tests build repositories and check results with.

use crate::support::net::serve;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the server saw.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    pub headers: HeaderMap,
}

struct Shared {
    root: PathBuf,
    /// `Basic base64(user:token)`.
    expected: String,
    user: String,
    /// Where `git-http-backend` is.
    backend: PathBuf,
    seen: Mutex<Vec<Recorded>>,
    redirect_to: Mutex<Option<String>>,
}

/// A Git smart-HTTP server with repositories under a temporary root.
pub struct GitServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    shared: Arc<Shared>,
    _root: tempfile::TempDir,
}

/// A change to a repository made by [`GitServer::change`].
pub enum Change<'a> {
    /// A regular file with this text.
    Write(&'a str, &'a str),
    /// A regular file with these bytes.
    Bytes(&'a str, &'a [u8]),
    /// A symbolic link to the target.
    Symlink(&'a str, &'a str),
    /// A submodule entry at this commit.
    Submodule(&'a str, &'a str),
}

impl GitServer {
    /// Serves repositories to `user` with `token` (HTTP basic auth).
    pub async fn start(user: &str, token: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared {
            root: root.path().to_owned(),
            expected: format!(
                "Basic {}",
                kortex::catalog::secret_redactor::base64(&format!("{user}:{token}"))
            ),
            user: user.to_owned(),
            backend: Path::new(&git(root.path(), &["--exec-path"])).join("git-http-backend"),
            seen: Mutex::default(),
            redirect_to: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let base = serve(app).await;
        Self {
            base,
            shared,
            _root: root,
        }
    }

    /// The clone URL of `repo`.
    pub fn url(&self, repo: &str) -> String {
        format!("{}/{repo}.git", self.base)
    }

    /// The bare repository of `repo` on disk.
    pub fn bare(&self, repo: &str) -> PathBuf {
        self.shared.root.join(format!("{repo}.git"))
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// From now on every request is answered `302 Found` to the same path on `to`.
    pub fn redirect_all_to(&self, to: &str) {
        *self.shared.redirect_to.lock().unwrap() = Some(to.to_owned());
    }

    /// Creates `repo` (branch `main`, pushes allowed) with one commit of `files`; its id.
    pub fn create(&self, repo: &str, files: &[(&str, &str)]) -> String {
        let bare = self.bare(repo);
        git(
            &self.shared.root,
            &["init", "-q", "--bare", "-b", "main", path(&bare)],
        );
        git(&bare, &["config", "http.receivepack", "true"]);
        let changes: Vec<Change> = files.iter().map(|(p, t)| Change::Write(p, t)).collect();
        self.change(repo, &changes, "first commit")
    }

    /// Commits `changes` on `main` of `repo` (as someone else would); the commit's id.
    pub fn change(&self, repo: &str, changes: &[Change], message: &str) -> String {
        let work = tempfile::tempdir().unwrap();
        let dir = work.path();
        git(dir, &["init", "-q", "-b", "main"]);
        let bare = self.bare(repo);
        let has_main = git_status(&bare, &["rev-parse", "--verify", "-q", "refs/heads/main"]);
        if has_main {
            git(dir, &["fetch", "-q", path(&bare), "main"]);
            git(dir, &["reset", "-q", "--hard", "FETCH_HEAD"]);
        }
        for change in changes {
            apply(dir, change);
        }
        git(dir, &["add", "-A"]);
        for change in changes {
            if let Change::Submodule(at, sha) = change {
                let info = format!("160000,{sha},{at}");
                git(dir, &["update-index", "--add", "--cacheinfo", &info]);
            }
        }
        git(dir, &["commit", "-q", "--allow-empty", "-m", message]);
        git(dir, &["push", "-q", path(&bare), "HEAD:refs/heads/main"]);
        git(dir, &["rev-parse", "HEAD"])
    }
}

fn apply(dir: &Path, change: &Change) {
    let (Change::Write(at, _)
    | Change::Bytes(at, _)
    | Change::Symlink(at, _)
    | Change::Submodule(at, _)) = change;
    let full = dir.join(at);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    match change {
        Change::Write(_, text) => std::fs::write(&full, text).unwrap(),
        Change::Bytes(_, bytes) => std::fs::write(&full, bytes).unwrap(),
        Change::Symlink(_, target) => {
            let _ = std::fs::remove_file(&full);
            std::os::unix::fs::symlink(target, &full).unwrap();
        }
        Change::Submodule(..) => {}
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The environment of the tests' own `git`: nothing of the machine's configuration.
fn isolated(cmd: &mut std::process::Command) -> &mut std::process::Command {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "Dev")
        .env("GIT_AUTHOR_EMAIL", "dev@example.com")
        .env("GIT_COMMITTER_NAME", "Dev")
        .env("GIT_COMMITTER_EMAIL", "dev@example.com")
}

/// Runs `git args` in `dir` (local operations only); its stdout, trimmed. Fails the test
/// when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = isolated(&mut std::process::Command::new("git"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether `git args` in `dir` succeeds.
pub fn git_status(dir: &Path, args: &[&str]) -> bool {
    isolated(&mut std::process::Command::new("git"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Clones `url` into `dir` with the test's own `git` (the header given on its command
/// line, as only a test may), without blocking the runtime the server runs on.
pub async fn clone_with_cli(url: &str, user: &str, token: &str, dir: &Path) {
    let header = format!(
        "http.extraHeader=Authorization: Basic {}",
        kortex::catalog::secret_redactor::base64(&format!("{user}:{token}"))
    );
    let mut cmd = std::process::Command::new("git");
    isolated(&mut cmd)
        .args(["-c", &header, "clone", "-q", "--mirror", url])
        .arg(dir);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    assert!(
        out.status.success(),
        "git clone failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A repository as a team keeps its deployment: plain manifests, a Kustomize overlay and
/// Helm values, with comments.
pub fn manifests() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "apps/api/deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  replicas: 2 # raised for the sale\n  template:\n    spec:\n      containers:\n        - name: api\n          image: registry.example.com/api:1.4.2\n",
        ),
        (
            "overlays/prod/kustomization.yaml",
            "# Production overlay\nresources:\n  - ../../apps/api\nimages:\n  - name: registry.example.com/api\n    newTag: 1.4.2 # pinned by release\nreplicas:\n  - name: api\n    count: 3\n",
        ),
        (
            "charts/api/values-prod.yaml",
            "# Values for production\nreplicaCount: 3 # keep odd\nimage:\n  repository: registry.example.com/api\n  tag: \"1.4.2\"\nresources:\n  limits:\n    memory: 512Mi # was 256Mi\n",
        ),
        ("README.md", "Deployments of the shop.\n"),
    ]
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let uri = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    shared.seen.lock().unwrap().push(Recorded {
        method: request.method().to_string(),
        uri: uri.clone(),
        headers: request.headers().clone(),
    });
    if let Some(to) = shared.redirect_to.lock().unwrap().clone() {
        return (StatusCode::FOUND, [("location", format!("{to}{uri}"))]).into_response();
    }
    let authorized = request
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == shared.expected.as_bytes());
    if !authorized {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Basic realm=\"git\"")],
            "authentication required",
        )
            .into_response();
    }
    cgi(&shared, request).await
}

/// Runs `git http-backend` for `request` and turns its CGI answer into a response.
async fn cgi(shared: &Shared, request: Request) -> Response {
    let headers = request.headers().clone();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut cmd = tokio::process::Command::new(&shared.backend);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &shared.root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &shared.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", request.uri().path())
        .env("REQUEST_METHOD", request.method().as_str())
        .env("QUERY_STRING", request.uri().query().unwrap_or_default())
        .env("REMOTE_USER", &shared.user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (var, name) in [
        ("CONTENT_TYPE", "content-type"),
        ("CONTENT_LENGTH", "content-length"),
        ("HTTP_CONTENT_ENCODING", "content-encoding"),
        ("GIT_PROTOCOL", "git-protocol"),
    ] {
        if let Some(value) = header(name) {
            cmd.env(var, value);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut body = request.into_body().into_data_stream();
    let feed = tokio::spawn(async move {
        while let Some(Ok(chunk)) = body.next().await {
            if stdin.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out)
        .await
        .unwrap();
    let _ = feed.await;
    let _ = child.wait().await;
    cgi_response(&out)
}

/// A CGI answer (`Status:` and headers, a blank line, the body) as a response.
fn cgi_response(out: &[u8]) -> Response {
    let (head, body) = match out.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => (&out[..at], &out[at + 4..]),
        None => match out.windows(2).position(|w| w == b"\n\n") {
            Some(at) => (&out[..at], &out[at + 2..]),
            None => (&out[..0], out),
        },
    };
    let mut response = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("500");
            response = response.status(code.parse::<u16>().unwrap_or(500));
        } else {
            response = response.header(name.trim(), value);
        }
    }
    response.body(Body::from(body.to_vec())).unwrap()
}
