//! Change requests against scripted forges on 127.0.0.1 speaking GitHub's, GitLab's and
//! Gitea's documented shapes: open, the one already open for the branch, the state as it
//! moves, a wrong token (with the scope it needs), a redirect never followed, the egress
//! guard asked first.

use crate::support::forge::{TOKEN, forge};
use kortex::catalog::SecretValue;
use kortex::crd::Forge;
use kortex::egress::{Egress, Own};
use kortex::gitops::forge::{ForgeClient, ForgeError, Request as ChangeRequest, RequestState};

use std::sync::Arc;

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
