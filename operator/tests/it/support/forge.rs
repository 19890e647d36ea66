//! Scripted forges on 127.0.0.1 speaking GitHub's (pulls), GitLab's (merge_requests) and
//! Gitea's (pulls) documented REST shapes, with a token check: what the change-request
//! tests and the whole Git delivery test talk to.

use crate::support::net::serve;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kortex::crd::Forge;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// The token the scripted forges accept unless told otherwise.
pub const TOKEN: &str = "forge-canary-41c7";

/// One change request the scripted forge keeps.
#[derive(Clone)]
pub struct Pr {
    pub number: u64,
    pub head: String,
    pub base: String,
    /// GitHub and Gitea: `open`/`closed`; GitLab: `opened`/`merged`/`closed`.
    pub state: String,
    pub merged: bool,
    pub merge_commit_sha: Option<String>,
    /// The head commit of its branch, as the forge would report it (unset: not shown).
    pub head_sha: Option<String>,
}

/// A seen request: method, path and query as sent, headers.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: axum::http::HeaderMap,
}

pub struct Script {
    pub forge: Forge,
    /// The repository's path prefix, as the forge writes it in URLs.
    pub prefix: String,
    pub prs: Mutex<Vec<Pr>>,
    pub seen: Mutex<Vec<Seen>>,
    pub redirect_to: Mutex<Option<String>>,
    /// The token it accepts.
    pub token: String,
}

/// A scripted forge for the tests' repositories (acme/deploy, platform/k8s/deploy,
/// ops/deploy), accepting [`TOKEN`]: its API root and its script.
pub async fn forge(forge: Forge) -> (String, Arc<Script>) {
    let prefix = match forge {
        Forge::Github => "/repos/acme/deploy".to_owned(),
        Forge::Gitlab => "/api/v4/projects/platform%2Fk8s%2Fdeploy".to_owned(),
        _ => "/api/v1/repos/ops/deploy".to_owned(),
    };
    forge_for(forge, &prefix, TOKEN).await
}

/// A scripted forge serving the repository at API path `prefix` (e.g.
/// `/repos/acme/fleet`), accepting `token`.
pub async fn forge_for(forge: Forge, prefix: &str, token: &str) -> (String, Arc<Script>) {
    let script = Arc::new(Script {
        forge,
        prefix: prefix.to_owned(),
        prs: Mutex::default(),
        seen: Mutex::default(),
        redirect_to: Mutex::default(),
        token: token.to_owned(),
    });
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(script.clone());
    let base = serve(app).await;
    let root = match forge {
        Forge::Github => base,
        Forge::Gitlab => format!("{base}/api/v4"),
        _ => format!("{base}/api/v1"),
    };
    (root, script)
}

impl Script {
    fn authorized(&self, headers: &axum::http::HeaderMap) -> bool {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        match self.forge {
            Forge::Github => {
                header("authorization") == format!("Bearer {}", self.token)
                    && header("accept") == "application/vnd.github+json"
                    && header("x-github-api-version") == "2022-11-28"
            }
            Forge::Gitlab => header("private-token") == self.token,
            _ => header("authorization") == format!("token {}", self.token),
        }
    }

    fn json(&self, pr: &Pr) -> Value {
        let web = format!("https://forge.example{}/{}", self.prefix, pr.number);
        match self.forge {
            Forge::Gitlab => json!({
                "id": 9000 + pr.number, "iid": pr.number, "web_url": web, "state": pr.state,
                "source_branch": pr.head, "target_branch": pr.base,
                "merge_commit_sha": pr.merge_commit_sha, "squash_commit_sha": null, "sha": pr.head_sha,
            }),
            _ => json!({
                "id": 9000 + pr.number, "number": pr.number, "html_url": web, "state": pr.state,
                "merged": pr.merged, "merge_commit_sha": pr.merge_commit_sha,
                "head": {"ref": pr.head, "label": format!("acme:{}", pr.head), "sha": pr.head_sha},
                "base": {"ref": pr.base},
            }),
        }
    }

    /// Sets request `number`'s state as the forge would.
    pub fn set(&self, number: u64, state: &str, merged: bool, sha: Option<&str>) {
        let mut prs = self.prs.lock().unwrap();
        let pr = prs.iter_mut().find(|p| p.number == number).unwrap();
        pr.state = state.to_owned();
        pr.merged = merged;
        pr.merge_commit_sha = sha.map(str::to_owned);
    }

    /// Says request `number`'s branch is at `sha` (someone pushed to it, or the forge
    /// reports what Kortex pushed).
    pub fn set_head(&self, number: u64, sha: &str) {
        let mut prs = self.prs.lock().unwrap();
        let pr = prs.iter_mut().find(|p| p.number == number).unwrap();
        pr.head_sha = Some(sha.to_owned());
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(State(script): State<Arc<Script>>, request: Request) -> Response {
    let uri = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let method = request.method().to_string();
    let headers = request.headers().clone();
    script.seen.lock().unwrap().push(Seen {
        method: method.clone(),
        uri: uri.clone(),
        headers: headers.clone(),
    });
    if let Some(to) = script.redirect_to.lock().unwrap().clone() {
        return (
            StatusCode::MOVED_PERMANENTLY,
            [("location", format!("{to}{uri}"))],
        )
            .into_response();
    }
    if !script.authorized(&headers) {
        // Echoes what it was sent, as some forges do in their error pages.
        let sent = format!("{headers:?}");
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": format!("Bad credentials: {sent}")})),
        )
            .into_response();
    }
    let body = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    route(&script, &method, &uri, &body)
}

fn route(script: &Script, method: &str, uri: &str, body: &Value) -> Response {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let Some(rest) = path.strip_prefix(&script.prefix) else {
        return (StatusCode::NOT_FOUND, "{\"message\":\"Not Found\"}").into_response();
    };
    let collection = if script.forge == Forge::Gitlab {
        "/merge_requests"
    } else {
        "/pulls"
    };
    let mut prs = script.prs.lock().unwrap();
    match (method, rest.strip_prefix(collection)) {
        ("POST", Some("")) => {
            let (head, base) = match script.forge {
                Forge::Gitlab => (&body["source_branch"], &body["target_branch"]),
                _ => (&body["head"], &body["base"]),
            };
            let (head, base) = (
                head.as_str().unwrap_or_default(),
                base.as_str().unwrap_or_default(),
            );
            let open = if script.forge == Forge::Gitlab {
                "opened"
            } else {
                "open"
            };
            if prs.iter().any(|p| p.head == head && p.state == open) {
                let (status, message) = match script.forge {
                    Forge::Github => (
                        422,
                        format!("A pull request already exists for acme:{head}."),
                    ),
                    Forge::Gitlab => (
                        409,
                        "Another open merge request already exists for this source branch"
                            .to_owned(),
                    ),
                    _ => (
                        409,
                        "pull request already exists for these targets".to_owned(),
                    ),
                };
                return (
                    StatusCode::from_u16(status).unwrap(),
                    axum::Json(json!({"message": message})),
                )
                    .into_response();
            }
            let pr = Pr {
                number: prs.len() as u64 + 1,
                head: head.to_owned(),
                base: base.to_owned(),
                state: open.to_owned(),
                merged: false,
                merge_commit_sha: None,
                head_sha: None,
            };
            prs.push(pr.clone());
            (StatusCode::CREATED, axum::Json(script.json(&pr))).into_response()
        }
        ("GET", Some("")) => {
            let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
            let wanted = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
            let listed: Vec<Value> = prs
                .iter()
                .filter(|p| wanted("state").is_none_or(|s| s == p.state))
                .filter(|p| wanted("head").is_none_or(|h| h == format!("acme:{}", p.head)))
                .filter(|p| wanted("source_branch").is_none_or(|h| h == p.head))
                .map(|p| script.json(p))
                .collect();
            axum::Json(Value::Array(listed)).into_response()
        }
        ("GET", Some(number)) => {
            let number: u64 = number.trim_start_matches('/').parse().unwrap_or(0);
            match prs.iter().find(|p| p.number == number) {
                Some(pr) => axum::Json(script.json(pr)).into_response(),
                None => (StatusCode::NOT_FOUND, "{\"message\":\"Not Found\"}").into_response(),
            }
        }
        _ => (StatusCode::METHOD_NOT_ALLOWED, "").into_response(),
    }
}
