//! The repository side of a GitOps change against a real Git server (`git http-backend`
//! behind basic auth on 127.0.0.1): clone, read, commit one file, push a new branch,
//! revert, find the commit that introduced a value — and the guard rails: the token never
//! in a URL or an error, no symlink or submodule followed, no redirect followed, the
//! egress guard asked before any request.

use crate::support::git_server::{Change, GitServer, clone_with_cli, git, manifests};
use kortex::catalog::SecretValue;
use kortex::egress::{Egress, Own};
use kortex::gitops::git::{Credentials, GitError, Remote, Repo, Signature};
use std::sync::Arc;

const USER: &str = "kortex";
const TOKEN: &str = "canary-token-5b1e9c";

fn standalone() -> Arc<Egress> {
    Arc::new(Egress::standalone(Own::default()))
}

fn remote(url: &str, token: &str) -> Remote {
    Remote {
        url: url.to_owned(),
        credentials: Credentials::Token {
            username: Some(USER.to_owned()),
            token: SecretValue::new(token),
        },
        allow_private: false,
    }
}

fn kortex_signature() -> Signature {
    Signature {
        name: "Kortex".into(),
        email: "kortex@ops.example.com".into(),
    }
}

fn approver() -> Signature {
    Signature {
        name: "Ana Approver".into(),
        email: "ana@example.com".into(),
    }
}

/// A server with the `deploy` repository; its first commit.
async fn deploy_server() -> (GitServer, String) {
    let server = GitServer::start(USER, TOKEN).await;
    let first = server.create("deploy", &manifests());
    (server, first)
}

/// Neither the token nor its basic-auth form is in `text`.
fn assert_no_token(text: &str) {
    let basic = kortex::catalog::secret_redactor::base64(&format!("{USER}:{TOKEN}"));
    assert!(!text.contains(TOKEN), "the token leaked: {text}");
    assert!(!text.contains(&basic), "the token's header leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_clone_lists_and_reads_with_the_token_only_in_a_header() {
    let (server, first) = deploy_server().await;
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(repo.head(), first);

    let all = repo.files(&first, "").await.unwrap();
    let mut paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "README.md",
            "apps/api/deployment.yaml",
            "charts/api/values-prod.yaml",
            "overlays/prod/kustomization.yaml"
        ]
    );
    assert!(all.iter().all(|e| e.mode == "100644" && e.oid.len() == 40));
    let overlays = repo.files(&first, "overlays").await.unwrap();
    assert_eq!(overlays.len(), 1);
    assert_eq!(overlays[0].path, "overlays/prod/kustomization.yaml");

    let values = repo
        .read(&first, "charts/api/values-prod.yaml", 4096)
        .await
        .unwrap();
    assert_eq!(values, manifests()[2].1);

    let seen = server.requests();
    assert!(!seen.is_empty());
    let basic = format!(
        "Basic {}",
        kortex::catalog::secret_redactor::base64(&format!("{USER}:{TOKEN}"))
    );
    for request in &seen {
        assert_no_token(&request.uri);
        assert_eq!(
            request.headers.get("authorization").map(|v| v.as_bytes()),
            Some(basic.as_bytes()),
            "{} {} came without the header",
            request.method,
            request.uri
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_wrong_token_is_unauthorized_and_never_shown() {
    let (server, _) = deploy_server().await;
    let wrong = "wrong-canary-88d1";
    let err = Repo::clone(&remote(&server.url("deploy"), wrong), "main", &standalone())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::Unauthorized(_)), "{err:?}");
    let text = format!("{err} {err:?}");
    let basic = kortex::catalog::secret_redactor::base64(&format!("{USER}:{wrong}"));
    assert!(!text.contains(wrong) && !text.contains(&basic), "{text}");
    for request in server.requests() {
        assert!(!request.uri.contains(wrong), "{}", request.uri);
    }

    // A missing branch and a missing repository are told apart from a refusal.
    let err = Repo::clone(&remote(&server.url("deploy"), TOKEN), "nope", &standalone())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::NotFound(_)), "{err:?}");
    let err = Repo::clone(
        &remote(&server.url("missing"), TOKEN),
        "main",
        &standalone(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, GitError::NotFound(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_paths_symlinks_and_submodules_are_refused() {
    let (server, first) = deploy_server().await;
    let tricky = server.change(
        "deploy",
        &[
            Change::Symlink("link", "/etc/passwd"),
            Change::Symlink("prod", "overlays/prod"),
            Change::Submodule("vendor/lib", &first),
            Change::Bytes("bin/blob.yaml", &[0xff, 0xfe, 0x00, 0x41]),
        ],
        "tricky entries",
    );
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(repo.head(), tricky);
    let all = repo.files(&tricky, "").await.unwrap();
    let mode = |p: &str| all.iter().find(|e| e.path == p).map(|e| e.mode.clone());
    assert_eq!(mode("link").as_deref(), Some("120000"));
    assert_eq!(mode("prod").as_deref(), Some("120000"));
    assert_eq!(mode("vendor/lib").as_deref(), Some("160000"));
    assert!(all.iter().any(|e| e.path == "link" && e.is_symlink()));

    for (path, why) in [
        ("overlays/../charts/api/values-prod.yaml", "normalised"),
        ("/etc/passwd", "normalised"),
        ("./README.md", "normalised"),
        ("overlays\\prod", "normalised"),
        ("link", "symbolic link"),
        ("prod/kustomization.yaml", "symbolic link"),
        ("vendor/lib", "submodule"),
        ("vendor/lib/go.mod", "submodule"),
        ("overlays/prod", "directory"),
        ("README.md/x", "not a directory"),
        ("bin/blob.yaml", "UTF-8"),
    ] {
        match repo.read(&tricky, path, 4096).await {
            Err(GitError::Refused(m)) => assert!(m.contains(why), "{path}: {m}"),
            other => panic!("{path}: {other:?}"),
        }
    }
    match repo.read(&tricky, "charts/api/values-prod.yaml", 20).await {
        Err(GitError::Refused(m)) => assert!(m.contains("larger than 20 bytes"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        repo.read(&tricky, "charts/api/missing.yaml", 4096).await,
        Err(GitError::NotFound(_))
    ));

    // Writing through a link or into a submodule is refused the same way.
    for path in [
        "link",
        "prod/kustomization.yaml",
        "vendor/lib/x.yaml",
        "../x.yaml",
    ] {
        let err = repo
            .commit_file(
                &tricky,
                path,
                "x: 1\n",
                "m",
                &kortex_signature(),
                &kortex_signature(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, GitError::Refused(_)), "{path}: {err:?}");
    }
}

const VALUES: &str = "charts/api/values-prod.yaml";
const BRANCH: &str = "kortex/restart-api-7";

/// A clone of `deploy` with one commit on `first` raising `replicaCount` in the Helm
/// values, pushed as [`BRANCH`]; the clone, the commit and the file before and after.
async fn pushed_change(server: &GitServer, first: &str) -> (Repo, String, String, String) {
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    let before = repo.read(first, VALUES, 4096).await.unwrap();
    let after = before.replace("replicaCount: 3 # keep odd", "replicaCount: 5 # keep odd");
    let message = "Scale api to 5 replicas\n\nProposal restart-api-7.\n\nCo-authored-by: Ana Approver <ana@example.com>\n";
    let commit = repo
        .commit_file(
            first,
            VALUES,
            &after,
            message,
            &approver(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    repo.push_new_branch(&commit, BRANCH).await.unwrap();
    (repo, commit, before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_one_file_committed_and_pushed_as_a_new_branch() {
    let (server, first) = deploy_server().await;
    let (repo, commit, _, after) = pushed_change(&server, &first).await;

    // What is on the server, seen with the git command line.
    let check = tempfile::tempdir().unwrap();
    let mirror = check.path().join("mirror.git");
    clone_with_cli(&server.url("deploy"), USER, TOKEN, &mirror).await;
    let branch = format!("refs/heads/{BRANCH}");
    let branch = branch.as_str();
    assert_eq!(git(&mirror, &["rev-parse", branch]), commit);
    assert_eq!(git(&mirror, &["rev-parse", &format!("{branch}^")]), first);
    assert_eq!(git(&mirror, &["rev-parse", "refs/heads/main"]), first);
    let stat = git(&mirror, &["show", "--format=", "--numstat", branch]);
    assert_eq!(
        stat,
        format!("1\t1\t{VALUES}"),
        "exactly one file, one line"
    );
    let diff = git(&mirror, &["diff", "-U0", &first, &commit]);
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect();
    assert_eq!(
        changed,
        ["-replicaCount: 3 # keep odd", "+replicaCount: 5 # keep odd"]
    );
    let who = git(
        &mirror,
        &["log", "-1", "--format=%an <%ae>|%cn <%ce>|%s", branch],
    );
    assert_eq!(
        who,
        "Ana Approver <ana@example.com>|Kortex <kortex@ops.example.com>|Scale api to 5 replicas"
    );
    let trailer = "--format=%(trailers:key=Co-authored-by,valueonly)";
    assert_eq!(
        git(&mirror, &["log", "-1", trailer, branch]),
        "Ana Approver <ana@example.com>"
    );
    let file = git(&mirror, &["show", &format!("{commit}:{VALUES}")]);
    assert_eq!(file, after.trim_end());

    // Kortex's diff says the same.
    let own = repo.diff(&first, &commit).await.unwrap();
    assert!(
        own.contains("-replicaCount: 3 # keep odd\n+replicaCount: 5 # keep odd"),
        "{own}"
    );
    for request in server.requests() {
        assert_no_token(&request.uri);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_pushed_branch_is_never_overwritten() {
    let (server, first) = deploy_server().await;
    let (repo, commit, before, _) = pushed_change(&server, &first).await;

    // A retry of the same push succeeds; another commit for the branch is a conflict.
    repo.push_new_branch(&commit, BRANCH).await.unwrap();
    let other = repo
        .commit_file(
            &first,
            VALUES,
            &before.replace("512Mi", "768Mi"),
            "Other",
            &kortex_signature(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    let err = repo.push_new_branch(&other, BRANCH).await.unwrap_err();
    assert!(matches!(err, GitError::Conflict(_)), "{err:?}");
    // Not even a fast-forward: a descendant of the branch's commit is refused too.
    let descendant = repo
        .commit_file(
            &commit,
            VALUES,
            &before.replace("512Mi", "1Gi"),
            "Descendant",
            &kortex_signature(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    let err = repo.push_new_branch(&descendant, BRANCH).await.unwrap_err();
    assert!(matches!(err, GitError::Conflict(_)), "{err:?}");
    let on_server = git(
        &server.bare("deploy"),
        &["rev-parse", &format!("refs/heads/{BRANCH}")],
    );
    assert_eq!(on_server, commit);

    // Writing what is already there changes nothing, and is said so.
    let err = repo
        .commit_file(
            &first,
            VALUES,
            &before,
            "Nothing",
            &kortex_signature(),
            &kortex_signature(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::Conflict(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_new_file_and_an_executable_keep_their_modes() {
    let (server, _) = deploy_server().await;
    let script = server.change(
        "deploy",
        &[Change::Write("hack/run.sh", "echo 1\n")],
        "script",
    );
    // Make it executable on the server's side (a commit of someone else).
    let work = tempfile::tempdir().unwrap();
    git(
        work.path(),
        &["clone", "-q", server.bare("deploy").to_str().unwrap(), "w"],
    );
    let w = work.path().join("w");
    git(&w, &["update-index", "--chmod=+x", "hack/run.sh"]);
    git(&w, &["commit", "-q", "-m", "executable"]);
    git(&w, &["push", "-q", "origin", "HEAD:main"]);
    let exec = git(&w, &["rev-parse", "HEAD"]);
    assert_ne!(exec, script);

    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    let commit = repo
        .commit_file(
            &exec,
            "hack/run.sh",
            "echo 2\n",
            "two",
            &kortex_signature(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    let files = repo.files(&commit, "hack").await.unwrap();
    assert_eq!(files[0].mode, "100755");
    let added = repo
        .commit_file(
            &exec,
            "overlays/staging/patch.yaml",
            "a: 1\n",
            "new",
            &kortex_signature(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    assert_eq!(
        repo.read(&added, "overlays/staging/patch.yaml", 100)
            .await
            .unwrap(),
        "a: 1\n"
    );
    let files = repo.files(&added, "overlays/staging").await.unwrap();
    assert_eq!(files[0].mode, "100644");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_revert_undoes_a_commit_or_says_it_conflicts() {
    let (server, _) = deploy_server().await;
    let path = "overlays/prod/kustomization.yaml";
    let original = manifests()[1].1;
    let bump = server.change(
        "deploy",
        &[Change::Write(
            path,
            &original.replace("newTag: 1.4.2", "newTag: 1.5.0"),
        )],
        "Bump api to 1.5.0",
    );
    let unrelated = server.change(
        "deploy",
        &[Change::Write("README.md", "Deployments.\n")],
        "Docs",
    );
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(repo.head(), unrelated);
    let revert = repo
        .revert(
            &unrelated,
            &bump,
            "Revert \"Bump api to 1.5.0\"",
            &approver(),
            &kortex_signature(),
        )
        .await
        .unwrap();
    assert_eq!(repo.read(&revert, path, 4096).await.unwrap(), original);
    assert_eq!(
        repo.read(&revert, "README.md", 4096).await.unwrap(),
        "Deployments.\n"
    );
    assert!(repo.is_ancestor(&unrelated, &revert).await.unwrap());
    let diff = repo.diff(&unrelated, &revert).await.unwrap();
    assert!(
        diff.contains(
            "-    newTag: 1.5.0 # pinned by release\n+    newTag: 1.4.2 # pinned by release"
        ),
        "{diff}"
    );

    // The same line changed again since: the reversal does not apply.
    let again = server.change(
        "deploy",
        &[Change::Write(
            path,
            &original.replace("newTag: 1.4.2", "newTag: 1.6.0"),
        )],
        "Bump api to 1.6.0",
    );
    let tip = repo.fetch("main").await.unwrap();
    assert_eq!(tip, again);
    let err = repo
        .revert(&tip, &bump, "Revert", &approver(), &kortex_signature())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::Conflict(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_introduced_finds_the_commit_that_set_an_image_tag() {
    let (server, _) = deploy_server().await;
    let path = "apps/api/deployment.yaml";
    let original = manifests()[0].1;
    let bump = server.change(
        "deploy",
        &[Change::Write(
            path,
            &original.replace("api:1.4.2", "api:1.5.0"),
        )],
        "Bump api to 1.5.0",
    );
    let later = server.change(
        "deploy",
        &[Change::Write(
            path,
            &original
                .replace("api:1.4.2", "api:1.5.0")
                .replace("replicas: 2", "replicas: 4"),
        )],
        "Scale api",
    );
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(
        repo.introduced(&later, path, "registry.example.com/api:1.5.0")
            .await
            .unwrap(),
        Some((bump, "Bump api to 1.5.0".to_owned()))
    );
    assert_eq!(
        repo.introduced(&later, path, "api:9.9.9").await.unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_fetch_follows_the_branch() {
    let (server, first) = deploy_server().await;
    let repo = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(repo.fetch("main").await.unwrap(), first);
    let next = server.change("deploy", &[Change::Write("README.md", "Next.\n")], "Next");
    assert_eq!(repo.fetch("main").await.unwrap(), next);
    assert!(repo.is_ancestor(&first, &next).await.unwrap());
    assert!(!repo.is_ancestor(&next, &first).await.unwrap());
    assert_eq!(repo.head(), first);
    assert!(matches!(
        repo.fetch("gone").await,
        Err(GitError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_redirect_is_never_followed() {
    let (server, _) = deploy_server().await;
    let elsewhere = GitServer::start(USER, TOKEN).await;
    elsewhere.create("deploy", &manifests());
    server.redirect_all_to(&elsewhere.base);
    let err = Repo::clone(&remote(&server.url("deploy"), TOKEN), "main", &standalone())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::Moved(_)), "{err:?}");
    assert_no_token(&err.to_string());
    assert!(!server.requests().is_empty());
    assert!(
        elsewhere.requests().is_empty(),
        "the redirect was followed: {:?}",
        elsewhere.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_the_egress_guard_decides_before_any_request() {
    let (server, first) = deploy_server().await;
    // Cluster mode: loopback is Kortex's own pod.
    let cluster = Arc::new(Egress::cluster(Own::default(), "marker"));
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    for url in [
        server.url("deploy"),
        format!("http://localhost:{port}/deploy.git"),
    ] {
        let err = Repo::clone(&remote(&url, TOKEN), "main", &cluster)
            .await
            .unwrap_err();
        match &err {
            GitError::Refused(m) => assert!(m.contains("allowPrivateTargets"), "{m}"),
            other => panic!("{url}: {other:?}"),
        }
    }
    assert!(server.requests().is_empty(), "{:?}", server.requests());

    // allowPrivateTargets lifts the rule: the same clone works.
    let mut open = remote(&server.url("deploy"), TOKEN);
    open.allow_private = true;
    let repo = Repo::clone(&open, "main", &cluster).await.unwrap();
    assert_eq!(repo.head(), first);

    // Kortex's own port is refused whatever the repository says.
    let own = Arc::new(Egress::standalone(Own::default()));
    own.add_own_port(port.parse().unwrap());
    let before = server.requests().len();
    let err = Repo::clone(&open, "main", &own).await.unwrap_err();
    assert!(
        matches!(&err, GitError::Refused(m) if m.contains("Kortex itself")),
        "{err:?}"
    );
    assert_eq!(server.requests().len(), before);

    // A name is resolved and checked by Kortex, then pinned for git (standalone: allowed).
    let by_name = format!("http://localhost:{port}/deploy.git");
    let repo = Repo::clone(&remote(&by_name, TOKEN), "main", &standalone())
        .await
        .unwrap();
    assert_eq!(repo.head(), first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_credentials_never_ride_in_the_url() {
    let (server, _) = deploy_server().await;
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    let url = format!("http://{USER}:{TOKEN}@127.0.0.1:{port}/deploy.git");
    let err = Repo::clone(&remote(&url, TOKEN), "main", &standalone())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::Refused(_)), "{err:?}");
    assert_no_token(&format!("{err} {err:?}"));
    assert!(server.requests().is_empty());

    let remote = remote(&server.url("deploy"), TOKEN);
    assert_no_token(&format!("{remote:?}"));
}
