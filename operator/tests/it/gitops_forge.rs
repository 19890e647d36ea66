//! Change requests against scripted forges on 127.0.0.1 speaking GitHub's, GitLab's and
//! Gitea's documented shapes: open, the one already open for the branch, the state as it
//! moves, a wrong token (with the scope it needs), a redirect never followed, the egress
//! guard asked first.

use crate::support::net::serve;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kortex::catalog::SecretValue;
use kortex::crd::Forge;
use kortex::egress::{Egress, Own};
use kortex::gitops::forge::{ForgeClient, ForgeError, Request as ChangeRequest, RequestState};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "forge-canary-41c7";

/// One change request the scripted forge keeps.
#[derive(Clone)]
struct Pr {
    number: u64,
    head: String,
    base: String,
    /// GitHub and Gitea: `open`/`closed`; GitLab: `opened`/`merged`/`closed`.
    state: String,
    merged: bool,
    merge_commit_sha: Option<String>,
}

/// A seen request: method, path and query as sent, headers.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    uri: String,
    headers: axum::http::HeaderMap,
}

struct Script {
    forge: Forge,
    /// The repository's path prefix, as the forge writes it in URLs.
    prefix: String,
    prs: Mutex<Vec<Pr>>,
    seen: Mutex<Vec<Seen>>,
    redirect_to: Mutex<Option<String>>,
}

/// A scripted forge: its API root and its script.
async fn forge(forge: Forge) -> (String, Arc<Script>) {
    let prefix = match forge {
        Forge::Github => "/repos/acme/deploy".to_owned(),
        Forge::Gitlab => "/api/v4/projects/platform%2Fk8s%2Fdeploy".to_owned(),
        _ => "/api/v1/repos/ops/deploy".to_owned(),
    };
    let script = Arc::new(Script {
        forge,
        prefix,
        prs: Mutex::default(),
        seen: Mutex::default(),
        redirect_to: Mutex::default(),
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
                header("authorization") == format!("Bearer {TOKEN}")
                    && header("accept") == "application/vnd.github+json"
                    && header("x-github-api-version") == "2022-11-28"
            }
            Forge::Gitlab => header("private-token") == TOKEN,
            _ => header("authorization") == format!("token {TOKEN}"),
        }
    }

    fn json(&self, pr: &Pr) -> Value {
        let web = format!("https://forge.example{}/{}", self.prefix, pr.number);
        match self.forge {
            Forge::Gitlab => json!({
                "id": 9000 + pr.number, "iid": pr.number, "web_url": web, "state": pr.state,
                "source_branch": pr.head, "target_branch": pr.base,
                "merge_commit_sha": pr.merge_commit_sha, "squash_commit_sha": null,
            }),
            _ => json!({
                "id": 9000 + pr.number, "number": pr.number, "html_url": web, "state": pr.state,
                "merged": pr.merged, "merge_commit_sha": pr.merge_commit_sha,
                "head": {"ref": pr.head, "label": format!("acme:{}", pr.head)},
                "base": {"ref": pr.base},
            }),
        }
    }

    /// Sets request `number`'s state as the forge would.
    fn set(&self, number: u64, state: &str, merged: bool, sha: Option<&str>) {
        let mut prs = self.prs.lock().unwrap();
        let pr = prs.iter_mut().find(|p| p.number == number).unwrap();
        pr.state = state.to_owned();
        pr.merged = merged;
        pr.merge_commit_sha = sha.map(str::to_owned);
    }

    fn seen(&self) -> Vec<Seen> {
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

fn egress() -> Arc<Egress> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Arc::new(Egress::standalone(Own::default()))
}

/// The clone URL each forge's script serves.
fn repo_url(forge: Forge) -> &'static str {
    match forge {
        Forge::Github => "https://github.com/acme/deploy.git",
        Forge::Gitlab => "git@gitlab.example.com:platform/k8s/deploy.git",
        _ => "https://gitea.example.com/ops/deploy",
    }
}

fn client(forge: Forge, root: &str, token: &str, egress: &Arc<Egress>) -> ForgeClient {
    ForgeClient::new(
        forge,
        repo_url(forge),
        Some(root),
        Some(SecretValue::new(token)),
        false,
        egress,
    )
    .unwrap()
    .unwrap()
}

/// Open, open again (the existing one), then open → merged; and a second one closed.
async fn lifecycle(kind: Forge, merged_state: &str, closed_state: &str) {
    let (root, script) = forge(kind).await;
    let forge = client(kind, &root, TOKEN, &egress());
    let opened = forge
        .open(
            "kortex/scale-api-5",
            "main",
            "Scale api to 5",
            "Proposal scale-api-5",
        )
        .await
        .unwrap();
    assert_eq!(opened.number, 1);
    assert!(opened.url.ends_with("/1"), "{}", opened.url);
    let again = forge
        .open(
            "kortex/scale-api-5",
            "main",
            "Scale api to 5",
            "Proposal scale-api-5",
        )
        .await
        .unwrap();
    assert_eq!(
        again,
        ChangeRequest {
            number: 1,
            url: opened.url.clone()
        }
    );
    assert_eq!(script.prs.lock().unwrap().len(), 1);

    assert_eq!(forge.state(1).await.unwrap(), RequestState::Open);
    script.set(1, merged_state, true, Some("9f2c1e0d"));
    assert_eq!(
        forge.state(1).await.unwrap(),
        RequestState::Merged {
            commit: Some("9f2c1e0d".into())
        }
    );

    let second = forge
        .open("kortex/other", "main", "Other", "")
        .await
        .unwrap();
    assert_eq!(second.number, 2);
    script.set(2, closed_state, false, None);
    assert_eq!(forge.state(2).await.unwrap(), RequestState::Closed);
    assert!(matches!(
        forge.state(99).await,
        Err(ForgeError::NotFound(_))
    ));

    for seen in script.seen() {
        assert!(!seen.uri.contains(TOKEN), "{}", seen.uri);
    }
}

#[tokio::test]
async fn gitops_github_pull_requests() {
    lifecycle(Forge::Github, "closed", "closed").await;
}

#[tokio::test]
async fn gitops_gitlab_merge_requests_with_a_subgroup_path() {
    lifecycle(Forge::Gitlab, "merged", "closed").await;
    let (root, script) = forge(Forge::Gitlab).await;
    let forge = client(Forge::Gitlab, &root, TOKEN, &egress());
    forge.open("kortex/x", "main", "X", "Body").await.unwrap();
    let seen = script.seen();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(
        seen[0].uri,
        "/api/v4/projects/platform%2Fk8s%2Fdeploy/merge_requests"
    );
}

#[tokio::test]
async fn gitops_gitea_pull_requests() {
    lifecycle(Forge::Gitea, "closed", "closed").await;
}

#[tokio::test]
async fn gitops_a_wrong_token_names_the_scope_and_is_never_shown() {
    for (kind, scope) in [
        (Forge::Github, "pull_requests: write"),
        (Forge::Gitlab, "`api`"),
        (Forge::Gitea, "write:repository"),
    ] {
        let (root, _script) = forge(kind).await;
        let wrong = "wrong-forge-canary-77";
        let forge = client(kind, &root, wrong, &egress());
        for err in [
            forge.open("kortex/x", "main", "X", "").await.unwrap_err(),
            forge.state(1).await.unwrap_err(),
        ] {
            let text = format!("{err} {err:?}");
            assert!(
                matches!(err, ForgeError::Unauthorized(_)),
                "{kind:?}: {text}"
            );
            assert!(text.contains(scope), "{kind:?}: {text}");
            assert!(!text.contains(wrong), "{kind:?}: the token leaked: {text}");
        }
    }
}

#[tokio::test]
async fn gitops_a_forge_redirect_is_never_followed() {
    let (root, script) = forge(Forge::Github).await;
    let (elsewhere, target) = forge(Forge::Github).await;
    *script.redirect_to.lock().unwrap() = Some(elsewhere);
    let forge = client(Forge::Github, &root, TOKEN, &egress());
    let err = forge.open("kortex/x", "main", "X", "").await.unwrap_err();
    match &err {
        ForgeError::Redirected(m) => assert!(
            m.contains("301") && m.contains("/repos/acme/deploy/pulls"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains(TOKEN));
    assert_eq!(script.seen().len(), 1);
    assert!(target.seen().is_empty(), "the redirect was followed");
}

#[tokio::test]
async fn gitops_the_egress_guard_is_asked_before_the_forge() {
    let (root, script) = forge(Forge::Gitea).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = Arc::new(Egress::cluster(Own::default(), "marker"));
    let forge = client(Forge::Gitea, &root, TOKEN, &cluster);
    for err in [
        forge.open("kortex/x", "main", "X", "").await.unwrap_err(),
        forge.state(1).await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, ForgeError::Refused(m) if m.contains("allowPrivateTargets")),
            "{err:?}"
        );
    }
    assert!(script.seen().is_empty());

    // allowPrivateTargets lifts it.
    let open = ForgeClient::new(
        Forge::Gitea,
        repo_url(Forge::Gitea),
        Some(&root),
        Some(SecretValue::new(TOKEN)),
        true,
        &cluster,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        open.open("kortex/x", "main", "X", "").await.unwrap().number,
        1
    );
}

#[tokio::test]
async fn gitops_no_forge_means_no_client() {
    let none = ForgeClient::new(
        Forge::None,
        "https://github.com/a/b",
        None,
        None,
        false,
        &egress(),
    );
    assert!(matches!(none, Ok(None)));
    let seen_headers = {
        let (root, script) = forge(Forge::Github).await;
        client(Forge::Github, &root, TOKEN, &egress())
            .open("kortex/h", "main", "H", "")
            .await
            .unwrap();
        script.seen()[0].headers.clone()
    };
    assert!(seen_headers.get(kortex::egress::VIA_HEADER).is_some());
}
