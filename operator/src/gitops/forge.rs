//! Change requests on a forge, over its documented REST API: GitHub pull requests, GitLab
//! merge requests, Gitea and Forgejo pull requests. Opens one for a pushed branch (or
//! finds the one already open for it) and follows its state.
//!
//! Requests go through the egress guard's client ([`Egress::client`]: refused addresses
//! dropped at resolution, redirects never followed) after [`Egress::check_url`]; a
//! redirect is an error naming where it pointed; answers are read up to 1 MiB; no error
//! text carries the token, even when the forge echoes it.
//!
//! The API root (`apiUrl`) includes the version path, as the defaults do:
//! `https://api.github.com` (github.com) or `https://<host>/api/v3` (GitHub Enterprise),
//! `https://<host>/api/v4` (GitLab), `https://<host>/api/v1` (Gitea, Forgejo).
//!
//! Imports only `crd` (the `Forge` kind), `catalog` (secret values) and `egress`.

use crate::catalog::SecretValue;
use crate::crd::Forge;
use crate::egress::Egress;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The most of an answer that is read.
const BODY_CAP: usize = 1 << 20;
/// How much of an unexpected answer an error carries.
const DETAIL_CAP: usize = 512;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a forge call failed. No text carries the token.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// Not sent: the egress guard refused the API's address.
    #[error("{0}")]
    Refused(String),
    /// The repository URL or API root cannot be used (owner and repository not found in
    /// it, not an http(s) API root).
    #[error("{0}")]
    Invalid(String),
    /// 401 or 403: the token is wrong or lacks the scope the forge needs (named).
    #[error("{0}")]
    Unauthorized(String),
    /// 404: no such repository or request (or the token cannot see it).
    #[error("{0}")]
    NotFound(String),
    /// A 3xx answer, not followed.
    #[error("{0}")]
    Redirected(String),
    /// Any other answer Kortex does not expect.
    #[error("{method} {url} answered HTTP {status}: {detail}")]
    Unexpected {
        /// The request's method.
        method: String,
        /// The request's URL (no credentials ever are in one).
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer, scrubbed of the token.
        detail: String,
    },
    /// The request could not be sent or the answer not read.
    #[error("{0}")]
    Transport(String),
}

/// An open change request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Its number (GitHub and Gitea `number`, GitLab `iid`).
    pub number: u64,
    /// Its web page.
    pub url: String,
}

/// Where a change request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// Open (GitLab `opened` or `locked`).
    Open,
    /// Merged, with the commit the forge reports (a merge or squash commit), when it does.
    Merged {
        /// The commit on the base branch.
        commit: Option<String>,
    },
    /// Closed without being merged.
    Closed,
}

/// A change request as the forge shows it: its state, the commit its branch points at and
/// the branch it goes into (what Kortex checks against what was approved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestView {
    /// Open, merged or closed.
    pub state: RequestState,
    /// The head commit of its branch (GitHub and Gitea `head.sha`, GitLab `sha`).
    pub head: Option<String>,
    /// The branch it goes into.
    pub base: Option<String>,
}

/// Which repository on the forge.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Project {
    /// GitHub and Gitea: `owner/repo`.
    OwnerRepo { owner: String, repo: String },
    /// GitLab: the full path, subgroups included.
    Path(String),
}

/// A client of one repository's change requests.
pub struct ForgeClient {
    forge: Forge,
    api: reqwest::Url,
    project: Project,
    token: Option<SecretValue>,
    allow_private: bool,
    egress: Arc<Egress>,
    http: reqwest::Client,
}

impl std::fmt::Debug for ForgeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgeClient")
            .field("forge", &self.forge)
            .field("api", &self.api.as_str())
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

impl ForgeClient {
    /// A client for the repository cloned from `repo_url` (`https://`, `ssh://` or
    /// `user@host:path`, `.git` optional); `api_url` overrides the default API root (see
    /// the module documentation). [`Forge::None`] has no client.
    pub fn new(
        forge: Forge,
        repo_url: &str,
        api_url: Option<&str>,
        token: Option<SecretValue>,
        allow_private: bool,
        egress: &Arc<Egress>,
    ) -> Result<Option<Self>, ForgeError> {
        if forge == Forge::None {
            return Ok(None);
        }
        let (scheme, host, path) = split_repo_url(repo_url)?;
        let project = project(forge, &path, repo_url)?;
        let api = match api_url {
            Some(root) => root.trim_end_matches('/').to_owned(),
            None => default_api_root(forge, &scheme, &host),
        };
        let api = reqwest::Url::parse(&api)
            .ok()
            .filter(|u| matches!(u.scheme(), "https" | "http") && u.host().is_some())
            .ok_or_else(|| ForgeError::Invalid(format!("{api} is not an http(s) API root")))?;
        let builder = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(REQUEST_TIMEOUT);
        let http = egress
            .client(allow_private, builder, false)
            .map_err(ForgeError::Transport)?;
        Ok(Some(Self {
            forge,
            api,
            project,
            token,
            allow_private,
            egress: egress.clone(),
            http,
        }))
    }

    /// Opens a change request from `head` into `base`; when one is already open for
    /// `head`, that one.
    pub async fn open(
        &self,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<Request, ForgeError> {
        let (url, payload) = match self.forge {
            Forge::Gitlab => (
                self.url(&["merge_requests"], &[]),
                json!({
                    "source_branch": head,
                    "target_branch": base,
                    "title": title,
                    "description": body,
                    "remove_source_branch": true,
                }),
            ),
            _ => (
                self.url(&["pulls"], &[]),
                json!({"title": title, "head": head, "base": base, "body": body}),
            ),
        };
        let answer = self.call(reqwest::Method::POST, url, Some(payload)).await;
        match answer {
            Ok(created) => self.request_of("POST", &created),
            Err(ForgeError::Unexpected { status, .. }) if self.exists_status(status) => {
                self.find_open(head, base, status).await
            }
            Err(e) => Err(e),
        }
    }

    /// Where change request `request` stands.
    pub async fn state(&self, request: u64) -> Result<RequestState, ForgeError> {
        Ok(self.view(request).await?.state)
    }

    /// Change request `request`: its state, head commit and base branch.
    pub async fn view(&self, request: u64) -> Result<RequestView, ForgeError> {
        let number = request.to_string();
        let url = match self.forge {
            Forge::Gitlab => self.url(&["merge_requests", &number], &[]),
            _ => self.url(&["pulls", &number], &[]),
        };
        let answer = self.call(reqwest::Method::GET, url, None).await?;
        let text = |pointer: &str| {
            answer
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let state = answer["state"].as_str().unwrap_or_default();
        let (state, head, base) = match self.forge {
            Forge::Gitlab => {
                let state = match state {
                    "merged" => RequestState::Merged {
                        commit: text("/merge_commit_sha").or_else(|| text("/squash_commit_sha")),
                    },
                    "closed" => RequestState::Closed,
                    "opened" | "locked" => RequestState::Open,
                    other => {
                        return Err(self.odd(
                            "GET",
                            &format!("merge request {request} is in state {other:?}"),
                        ));
                    }
                };
                (state, text("/sha"), text("/target_branch"))
            }
            _ => {
                let state = match (state, answer["merged"].as_bool().unwrap_or(false)) {
                    (_, true) => RequestState::Merged {
                        commit: text("/merge_commit_sha"),
                    },
                    ("closed", false) => RequestState::Closed,
                    ("open", false) => RequestState::Open,
                    (other, _) => {
                        return Err(self.odd(
                            "GET",
                            &format!("pull request {request} is in state {other:?}"),
                        ));
                    }
                };
                (state, text("/head/sha"), text("/base/ref"))
            }
        };
        Ok(RequestView { state, head, base })
    }

    /// Whether `status` is how this forge says a request for the branch already exists.
    fn exists_status(&self, status: u16) -> bool {
        match self.forge {
            Forge::Github => status == 422,
            Forge::Gitlab => status == 409,
            _ => matches!(status, 409 | 422),
        }
    }

    /// The open request from `head` (into `base` when the forge says), found by listing
    /// after the forge answered `status` to the creation. Gitea: the first 50 open ones.
    async fn find_open(&self, head: &str, base: &str, status: u16) -> Result<Request, ForgeError> {
        let url = match (&self.forge, &self.project) {
            (Forge::Gitlab, _) => self.url(
                &["merge_requests"],
                &[("source_branch", head), ("state", "opened")],
            ),
            (Forge::Github, Project::OwnerRepo { owner, .. }) => self.url(
                &["pulls"],
                &[("head", &format!("{owner}:{head}")), ("state", "open")],
            ),
            _ => self.url(&["pulls"], &[("state", "open"), ("limit", "50")]),
        };
        let listed = self.call(reqwest::Method::GET, url, None).await?;
        let (head_key, base_key) = match self.forge {
            Forge::Gitlab => ("/source_branch", "/target_branch"),
            _ => ("/head/ref", "/base/ref"),
        };
        let matching = |item: &&Value| {
            item.pointer(head_key).and_then(Value::as_str) == Some(head)
                && item.pointer(base_key).and_then(Value::as_str) == Some(base)
        };
        let items = listed.as_array().map(Vec::as_slice).unwrap_or_default();
        // Only one into the same base: another request from a branch of that name is not
        // Kortex's (the caller checks its head commit too).
        let found = items.iter().find(matching);
        match found {
            Some(item) => self.request_of("GET", item),
            None => Err(ForgeError::Unexpected {
                method: "POST".into(),
                url: self.url(&[], &[]).to_string(),
                status,
                detail: format!(
                    "the forge says a request for {head} exists, but no open one from {head} is listed"
                ),
            }),
        }
    }

    /// A created or listed request.
    fn request_of(&self, method: &str, item: &Value) -> Result<Request, ForgeError> {
        let (number_key, url_key) = match self.forge {
            Forge::Gitlab => ("iid", "web_url"),
            _ => ("number", "html_url"),
        };
        match (item[number_key].as_u64(), item[url_key].as_str()) {
            (Some(number), Some(url)) => Ok(Request {
                number,
                url: url.to_owned(),
            }),
            _ => Err(self.odd(
                method,
                &format!("an answer without {number_key} or {url_key}"),
            )),
        }
    }

    /// An answer of an unexpected shape.
    fn odd(&self, method: &str, what: &str) -> ForgeError {
        ForgeError::Unexpected {
            method: method.to_owned(),
            url: self.url(&[], &[]).to_string(),
            status: 200,
            detail: what.to_owned(),
        }
    }

    /// The repository's API URL with `tail` segments and `query` appended.
    fn url(&self, tail: &[&str], query: &[(&str, &str)]) -> reqwest::Url {
        let mut url = self.api.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
            match &self.project {
                // One segment: `/` is written `%2F`, as GitLab wants a path as an id.
                Project::Path(path) => {
                    segments.extend(["projects", path.as_str()]);
                }
                Project::OwnerRepo { owner, repo } => {
                    segments.extend(["repos", owner.as_str(), repo.as_str()]);
                }
            }
            segments.extend(tail);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// Sends one request and gives the JSON answer of a 2xx.
    async fn call(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        payload: Option<Value>,
    ) -> Result<Value, ForgeError> {
        self.egress
            .check_url(&url, self.allow_private)
            .map_err(ForgeError::Refused)?;
        let mut request = self.http.request(method.clone(), url.clone());
        request = match (self.forge, &self.token) {
            (_, None) => request,
            (Forge::Gitlab, Some(t)) => request.header("PRIVATE-TOKEN", t.expose()),
            (Forge::Gitea, Some(t)) => {
                request.header("Authorization", format!("token {}", t.expose()))
            }
            (_, Some(t)) => request.bearer_auth(t.expose()),
        };
        request = match self.forge {
            Forge::Github => request
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28"),
            _ => request.header("Accept", "application/json"),
        };
        if let Some(payload) = payload {
            request = request.json(&payload);
        }
        let response = request.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (body, cut) = crate::egress::read_capped(response, BODY_CAP)
            .await
            .map_err(|e| self.transport(&e))?;
        let fail = |status| ForgeError::Unexpected {
            method: method.to_string(),
            url: url.to_string(),
            status,
            detail: self.scrub(&String::from_utf8_lossy(&body)),
        };
        match status {
            200..=299 if cut => Err(ForgeError::Transport(format!(
                "{method} {url}: the answer is larger than {BODY_CAP} bytes"
            ))),
            200..=299 => serde_json::from_slice(&body).map_err(|_| fail(status)),
            300..=399 => Err(ForgeError::Redirected(format!(
                "{method} {url} answered HTTP {status} redirecting to {}; Kortex never follows a redirect: set apiUrl to the final address",
                self.scrub(location.as_deref().unwrap_or("(no Location)"))
            ))),
            401 | 403 => Err(ForgeError::Unauthorized(format!(
                "{method} {url} answered HTTP {status}: {}; {}",
                self.scrub(&String::from_utf8_lossy(&body[..body.len().min(200)])),
                scope_hint(self.forge)
            ))),
            404 => Err(ForgeError::NotFound(format!(
                "{method} {url} answered HTTP 404 (no such repository or request, or the token cannot see it)"
            ))),
            _ => Err(fail(status)),
        }
    }

    /// A transport error: a refusal of the guarded resolver is a refusal.
    fn transport(&self, error: &reqwest::Error) -> ForgeError {
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        let chain = self.scrub(&chain);
        match chain.find("refused: ") {
            Some(at) => ForgeError::Refused(chain[at..].to_owned()),
            None => ForgeError::Transport(chain),
        }
    }

    /// `text` without the token, capped.
    fn scrub(&self, text: &str) -> String {
        let text = match &self.token {
            Some(t) if !t.expose().is_empty() => text.replace(t.expose(), "[redacted]"),
            _ => text.to_owned(),
        };
        let mut end = text.len().min(DETAIL_CAP);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].trim().to_owned()
    }
}

/// What a token needs on each forge.
fn scope_hint(forge: Forge) -> &'static str {
    match forge {
        Forge::Github => {
            "the token needs `pull_requests: write` and `contents: write` on the repository (fine-grained) or the `repo` scope (classic)"
        }
        Forge::Gitlab => "the token needs the `api` scope (and `write_repository` to push)",
        Forge::Gitea | Forge::None => "the token needs the `write:repository` scope",
    }
}

/// Scheme, host (with the port for http(s)) and path (no `.git`, no slashes around) of a
/// clone URL.
fn split_repo_url(repo_url: &str) -> Result<(String, String, String), ForgeError> {
    let invalid = || ForgeError::Invalid(format!("cannot tell the repository from {repo_url:?}"));
    let url = if repo_url.contains("://") {
        reqwest::Url::parse(repo_url).map_err(|_| invalid())?
    } else {
        // `user@host:path`
        let (user_host, path) = repo_url.split_once(':').ok_or_else(invalid)?;
        if user_host.contains('/') {
            return Err(invalid());
        }
        reqwest::Url::parse(&format!(
            "ssh://{user_host}/{}",
            path.trim_start_matches('/')
        ))
        .map_err(|_| invalid())?
    };
    let host = url.host_str().ok_or_else(invalid)?.to_ascii_lowercase();
    let (scheme, host) = match (url.scheme(), url.port()) {
        (s @ ("https" | "http"), Some(port)) => (s.to_owned(), format!("{host}:{port}")),
        (s @ ("https" | "http"), None) => (s.to_owned(), host),
        _ => ("https".to_owned(), host),
    };
    let path = url.path().trim_matches('/');
    let path = path
        .strip_suffix(".git")
        .unwrap_or(path)
        .trim_end_matches('/');
    Ok((scheme, host, path.to_owned()))
}

/// The repository on the forge from a clone URL's path.
fn project(forge: Forge, path: &str, repo_url: &str) -> Result<Project, ForgeError> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(ForgeError::Invalid(format!(
            "cannot tell the repository from {repo_url:?}"
        )));
    }
    match (forge, parts.as_slice()) {
        (Forge::Gitlab, [_, _, ..]) => Ok(Project::Path(path.to_owned())),
        (Forge::Github | Forge::Gitea, [owner, repo]) => Ok(Project::OwnerRepo {
            owner: (*owner).to_owned(),
            repo: (*repo).to_owned(),
        }),
        _ => Err(ForgeError::Invalid(format!(
            "{repo_url:?} does not name a {} repository (owner/repository{})",
            forge.as_str(),
            if forge == Forge::Gitlab {
                ", subgroups allowed"
            } else {
                ""
            }
        ))),
    }
}

/// The forge's API root on `host` when `apiUrl` is not set.
fn default_api_root(forge: Forge, scheme: &str, host: &str) -> String {
    match forge {
        Forge::Github if host == "github.com" => "https://api.github.com".to_owned(),
        Forge::Github => format!("{scheme}://{host}/api/v3"),
        Forge::Gitlab => format!("{scheme}://{host}/api/v4"),
        Forge::Gitea | Forge::None => format!("{scheme}://{host}/api/v1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(forge: Forge, repo: &str, api: Option<&str>) -> ForgeClient {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let egress = Arc::new(Egress::standalone(crate::egress::Own::default()));
        ForgeClient::new(forge, repo, api, None, false, &egress)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn repositories_and_api_roots_come_from_the_clone_url() {
        let c = client(Forge::Github, "https://github.com/acme/deploy.git", None);
        assert_eq!(
            c.url(&["pulls"], &[]).as_str(),
            "https://api.github.com/repos/acme/deploy/pulls"
        );
        let c = client(Forge::Github, "git@github.com:acme/deploy.git", None);
        assert_eq!(
            c.url(&["pulls", "7"], &[]).as_str(),
            "https://api.github.com/repos/acme/deploy/pulls/7"
        );
        let c = client(Forge::Github, "https://ghe.example.com/acme/deploy/", None);
        assert_eq!(
            c.url(&[], &[]).as_str(),
            "https://ghe.example.com/api/v3/repos/acme/deploy"
        );
        let c = client(
            Forge::Gitlab,
            "ssh://git@gitlab.example.com:2222/platform/k8s/apps.git",
            None,
        );
        assert_eq!(
            c.url(&["merge_requests"], &[]).as_str(),
            "https://gitlab.example.com/api/v4/projects/platform%2Fk8s%2Fapps/merge_requests"
        );
        let c = client(Forge::Gitea, "http://gitea.local:3000/ops/deploy", None);
        assert_eq!(
            c.url(&["pulls"], &[]).as_str(),
            "http://gitea.local:3000/api/v1/repos/ops/deploy/pulls"
        );
        let c = client(
            Forge::Gitea,
            "https://x/ops/deploy",
            Some("https://code.example/api/v1/"),
        );
        assert_eq!(
            c.url(&["pulls"], &[]).as_str(),
            "https://code.example/api/v1/repos/ops/deploy/pulls"
        );
    }

    #[test]
    fn unusable_urls_and_no_forge() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let egress = Arc::new(Egress::default());
        assert!(matches!(
            ForgeClient::new(
                Forge::None,
                "https://github.com/a/b",
                None,
                None,
                false,
                &egress
            ),
            Ok(None)
        ));
        for (forge, url) in [
            (Forge::Github, "https://github.com/a"),
            (Forge::Github, "https://github.com/a/b/c"),
            (Forge::Gitlab, "https://gitlab.com/a"),
            (Forge::Gitea, "https://x/a/../b"),
            (Forge::Github, "not a url"),
        ] {
            assert!(
                matches!(
                    ForgeClient::new(forge, url, None, None, false, &egress),
                    Err(ForgeError::Invalid(_))
                ),
                "{url}"
            );
        }
        assert!(matches!(
            ForgeClient::new(
                Forge::Github,
                "https://github.com/a/b",
                Some("ftp://x"),
                None,
                false,
                &egress
            ),
            Err(ForgeError::Invalid(_))
        ));
    }

    /// Compiles only if both calls can run in a spawned task.
    #[allow(dead_code)]
    fn calls_are_send(client: &ForgeClient) {
        fn send<T: Send>(_: T) {}
        send(client.open("h", "b", "t", "b"));
        send(client.state(1));
    }

    #[test]
    fn scope_hints_name_the_scopes() {
        assert!(scope_hint(Forge::Github).contains("pull_requests: write"));
        assert!(scope_hint(Forge::Github).contains("`repo`"));
        assert!(scope_hint(Forge::Gitlab).contains("`api`"));
        assert!(scope_hint(Forge::Gitea).contains("write:repository"));
    }
}
