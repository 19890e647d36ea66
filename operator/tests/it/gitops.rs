//! A GitOps-owned target, end to end from the binary (`kortex run` against the fake API
//! server): a real Git server (`git http-backend` behind basic auth) holds the manifests,
//! a scripted GitHub speaks the pulls API; Argo CD's Application and the labelled
//! Deployment live in the fake cluster. A scale proposal becomes a one-line Git change,
//! previewed as a diff; approved with `kubectl kortex`, it is pushed and its pull request
//! opened; the test plays the forge (merged) and Argo CD (synced, replicas changed), and
//! the proposal ends Succeeded. A closed request fails the proposal; an Application whose
//! repository is not declared gets the evidence and no write; the token never shows.

use crate::support::chat::{post_json, post_message, wait_idle};
use crate::support::fake_api::{FakeApi, base64, incidents_policy, phase, write_kubeconfig_as};
use crate::support::forge::forge_for;
use crate::support::git_server::{GitServer, git};
use crate::support::net::http_client;
use crate::support::provider::{mock, push, push_answer, tool_calls};
use crate::support::server::{Server, kubectl_kortex, start_run_with};
use kortex::crd::Forge;
use serde_json::{Value, json};

/// The token of the Git server and the forge: a canary that must never show.
const TOKEN: &str = "ghp_gitopsCanary7Q2x9";

const DEPLOYMENT: &str = "# The shop's API (owned by the payments team)\napiVersion: v1\nkind: Service\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  ports: [{port: 80}]\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  replicas: 2 # raised for the sale\n  selector:\n    matchLabels: {app: api}\n  template:\n    metadata:\n      labels: {app: api}\n    spec:\n      containers:\n        - name: api\n          image: shop/api:4\n";

/// The Deployment as Argo CD applied it (tracked by annotation).
fn deployment(app: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop", "generation": 3,
            "annotations": {"deployment.kubernetes.io/revision": "4",
                "argocd.argoproj.io/tracking-id": format!("{app}:apps/Deployment:shop/api")}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
            "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [{"name": "api", "image": "shop/api:4"}]}}}})
}

fn application(name: &str, repo: &str, revision: &str) -> Value {
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd"},
        "spec": {"project": "default",
            "source": {"repoURL": repo, "path": "apps/api", "targetRevision": "main"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "shop"},
            "syncPolicy": {"automated": {"selfHeal": true, "prune": true}}},
        "status": {"sync": {"status": "Synced", "revision": revision}}})
}

struct Scene {
    fake: FakeApi,
    git: GitServer,
    forge: std::sync::Arc<crate::support::forge::Script>,
    script: std::sync::Arc<crate::support::provider::Script>,
    server: Server,
    base_commit: String,
    dir: tempfile::TempDir,
}

async fn scene() -> Scene {
    scene_with(&[]).await
}

/// The scene with more files in the repository.
async fn scene_with(more: &[(&str, &str)]) -> Scene {
    let git = GitServer::start("x-access-token", TOKEN).await;
    let mut files = vec![
        ("apps/api/api.yaml", DEPLOYMENT),
        ("README.md", "The shop's fleet.\n"),
    ];
    files.extend_from_slice(more);
    let base_commit = git.create("acme/fleet", &files);
    let (forge_root, forge) = forge_for(Forge::Github, "/repos/acme/fleet", TOKEN).await;
    let fake = FakeApi::start().await;
    let (llm, script) = mock().await;
    fake.apply("deployments", deployment("shop"));
    fake.apply(
        "applications",
        application("shop", &git.url("acme/fleet"), &base_commit),
    );
    let mut policy = incidents_policy(json!({"allowedActions": ["scale", "restart", "rollback"],
        "allowedNamespaces": ["shop"], "expireAfter": "10m"}));
    // On loopback the user has no Kubernetes identity: the tools read as Kortex.
    policy["spec"]["runToolsAsUser"] = json!(false);
    policy["spec"]["gitops"] = json!({"repositories": [{
        "url": git.url("acme/fleet"), "forge": "github", "apiUrl": forge_root,
        "secretRef": {"name": "fleet-git", "key": "token"}, "allowPrivateTargets": true}]});
    fake.apply("chatpolicies", policy);
    fake.apply("secrets", json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "fleet-git", "namespace": "team-a", "labels": {"kortex.dev/use": "true"}},
        "type": "Opaque", "data": {"token": base64(TOKEN)}}));
    fake.allow("bob");
    let dir = tempfile::tempdir().unwrap();
    let server = start_run_with(
        &fake,
        dir.path(),
        &llm,
        &[
            "--gitops-follow-interval",
            "300ms",
            "--public-url",
            "https://kortex.example.com",
        ],
    )
    .await;
    Scene {
        fake,
        git,
        forge,
        script,
        server,
        base_commit,
        dir,
    }
}

/// The model proposes scaling api to `replicas` in a new session; the proposal's name.
async fn propose_scale(s: &Scene, replicas: i64, session: &str) -> String {
    propose_scale_of(s, "api", replicas, session).await
}

/// The model proposes scaling Deployment `target` (in shop) to `replicas`.
async fn propose_scale_of(s: &Scene, target: &str, replicas: i64, session: &str) -> String {
    let args = json!({"action": "scale", "params": {"replicas": replicas},
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": target},
        "rationale": "p99 latency 4x since 10:05, CPU at its limit on both pods"});
    propose(s, args, session).await
}

/// The model calls `propose_action` with `args` in a new session; the proposal's name.
async fn propose(s: &Scene, args: Value, session: &str) -> String {
    let before: Vec<String> = s
        .fake
        .list("actionproposals")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    push(&s.script, tool_calls(&[("p1", "propose_action", args)]));
    push_answer(&s.script, &["Proposed."]);
    let client = http_client();
    let created = post_json(
        &client,
        s.server.url("/chat/v1/sessions"),
        &json!({"name": session, "namespace": "team-a"}),
    )
    .await;
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    post_message(&s.server, &id, "api is slow, scale it").await;
    wait_idle(&client, &s.server.url(&format!("/chat/v1/sessions/{id}"))).await;
    s.fake
        .list("actionproposals")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .find(|n| !before.contains(n))
        .unwrap_or_else(|| panic!("no new proposal:\n{}", s.server.log()))
}

/// The removed and added lines of a unified diff (not its `---`/`+++` file lines).
fn changed_lines(diff: &str) -> Vec<&str> {
    diff.lines()
        .filter(|l| {
            (l.starts_with('-') || l.starts_with('+'))
                && !l.starts_with("---")
                && !l.starts_with("+++")
        })
        .collect()
}

/// `kubectl kortex approve ARGS` as `kubeconfig`'s user; returns once the proposal's
/// change request is open.
async fn approve_until_open(s: &Scene, kubeconfig: &std::path::Path, args: &[&str]) {
    let name = args[1];
    let (ok, out) = kubectl_kortex(kubeconfig, args).await;
    assert!(ok, "{out}");
    s.fake
        .until("the request to be opened", |f| {
            f.get("actionproposals", "shop", name)
                .is_some_and(|p| p["status"]["git"]["requestState"] == "open")
        })
        .await;
}

fn proposal(s: &Scene, name: &str) -> Value {
    s.fake
        .get("actionproposals", "shop", name)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_scale_becomes_a_reviewed_pull_request_followed_until_the_cluster_runs_it() {
    let s = scene().await;
    let name = propose_scale(&s, 5, "incident-gitops").await;

    // Proposed as a Git change: the preview is the one-line diff at the pinned commit.
    let p = proposal(&s, &name);
    assert_eq!(p["spec"]["delivery"], "git", "{p}");
    let preview = &p["status"]["preview"];
    assert_eq!(preview["delivery"], "git", "{preview}");
    assert_eq!(preview["path"], "apps/api/api.yaml");
    assert_eq!(preview["baseCommit"], s.base_commit.as_str());
    assert_eq!(preview["owner"]["kind"], "Application");
    let diff = preview["diff"].as_str().unwrap_or_default();
    let changed = changed_lines(diff);
    assert_eq!(
        changed,
        [
            "-  replicas: 2 # raised for the sale",
            "+  replicas: 5 # raised for the sale"
        ],
        "{diff}"
    );
    assert_eq!(p["spec"]["params"]["git"]["diff"], preview["diff"]);
    // Nothing was written anywhere yet.
    assert!(s.forge.prs.lock().unwrap().is_empty());
    assert_eq!(
        git(&s.git.bare("acme/fleet"), &["branch", "--list", "kortex/*"]),
        ""
    );

    // bob approves; the approver's right is `update` on the Application.
    let bob = write_kubeconfig_as(s.dir.path(), &s.fake.url, "bob-token", "bob");
    approve_until_open(&s, &bob, &["approve", &name, "--reason", "ship it"]).await;
    let reviews: Vec<Value> = s
        .fake
        .seen()
        .into_iter()
        .filter(|r| r.path.ends_with("/subjectaccessreviews"))
        .map(|r| r.body["spec"]["resourceAttributes"].clone())
        .collect();
    assert!(
        reviews.contains(
            &json!({"namespace": "argocd", "verb": "update", "group": "argoproj.io",
            "resource": "applications", "name": "shop"})
        ),
        "{reviews:?}"
    );
    let p = proposal(&s, &name);
    assert_eq!(p["status"]["phase"], "Executing", "{p}");
    let status = &p["status"]["git"];
    let branch = format!("kortex/{name}");
    assert_eq!(status["branch"], branch.as_str());
    assert_eq!(status["requestNumber"], 1);
    assert!(
        status["requestUrl"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/1"),
        "{status}"
    );
    let condition = p["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Executing"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(condition["reason"], "AwaitingMerge", "{condition}");

    // The pushed commit: on the pinned base, one file, exactly the previewed line, the
    // approver as co-author; the pull request from the branch to main.
    let bare = s.git.bare("acme/fleet");
    let commit = git(&bare, &["rev-parse", &branch]);
    assert_eq!(status["commit"], commit.as_str());
    assert_eq!(
        git(&bare, &["rev-parse", &format!("{commit}^")]),
        s.base_commit
    );
    assert_eq!(
        git(&bare, &["diff", "--name-only", &s.base_commit, &commit]),
        "apps/api/api.yaml"
    );
    let pushed = git(&bare, &["diff", &s.base_commit, &commit]);
    let ours: Vec<&str> = pushed
        .lines()
        .filter(|l| !l.starts_with("index "))
        .collect();
    let previewed: Vec<&str> = diff.lines().collect();
    assert_eq!(ours, previewed, "the pushed diff is the previewed one");
    let message = git(&bare, &["log", "-1", "--format=%an <%ae>%n%B", &commit]);
    assert!(message.starts_with("Kortex <"), "{message}");
    assert!(
        message.contains("Co-authored-by: bob <bob@users.kortex.invalid>"),
        "{message}"
    );
    assert!(message.contains("p99 latency 4x"), "{message}");
    assert!(
        message.contains("Session: incident-gitops (https://kortex.example.com/#/chat/"),
        "{message}"
    );
    let text = git(&bare, &["show", &format!("{commit}:apps/api/api.yaml")]);
    assert_eq!(
        text,
        DEPLOYMENT
            .replace("replicas: 2 #", "replicas: 5 #")
            .trim_end()
    );
    {
        let prs = s.forge.prs.lock().unwrap();
        assert_eq!(prs.len(), 1);
        assert_eq!(
            (prs[0].head.as_str(), prs[0].base.as_str()),
            (branch.as_str(), "main")
        );
    }

    // Merged at the forge (its branch at Kortex's commit): waiting for Argo CD.
    s.forge.set_head(1, &commit);
    s.forge.set(1, "closed", true, Some(&commit));
    s.fake
        .until("the proposal to wait for the sync", |f| {
            f.get("actionproposals", "shop", &name)
                .is_some_and(|p| p["status"]["git"]["requestState"] == "merged")
        })
        .await;
    assert_eq!(phase(&s.fake, &name), "Executing");
    // Argo CD syncs the merge, and the Deployment shows it: Succeeded.
    s.fake.apply(
        "applications",
        application("shop", &s.git.url("acme/fleet"), &commit),
    );
    let mut synced = deployment("shop");
    synced["spec"]["replicas"] = json!(5);
    s.fake.apply("deployments", synced);
    s.fake
        .until("the proposal to succeed", |f| {
            phase(f, &name) == "Succeeded"
        })
        .await;
    let p = proposal(&s, &name);
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("synced by Application argocd/shop"),
        "{message}"
    );
    assert!(
        message.contains("/pull") || message.contains("/1"),
        "{message}"
    );
    assert_eq!(p["status"]["git"]["mergeCommit"], commit.as_str());
    // A live scale was never sent.
    assert!(
        !s.fake.seen().iter().any(|r| r.method == "PATCH"
            && r.path.ends_with("/deployments/api/scale")
            && !r.query.contains("dryRun")),
        "no live write"
    );

    // The canary never left the Git and forge requests.
    let log = s.server.log();
    assert!(!log.contains(TOKEN), "the token is in the log");
    for r in s.fake.seen() {
        assert!(
            !r.body.to_string().contains(TOKEN),
            "{} {}",
            r.method,
            r.path
        );
    }
    assert!(!message.contains(TOKEN));
    let db = std::fs::read(s.dir.path().join("k.db")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&db).contains(TOKEN),
        "the token is in the database"
    );
    let all = git(&bare, &["log", "--all", "--format=%B"]);
    assert!(!all.contains(TOKEN), "the token is in a commit");
    for r in s.git.requests() {
        assert!(!r.uri.contains(TOKEN), "{}", r.uri);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_closed_request_fails_and_an_undeclared_repository_is_never_written() {
    let s = scene().await;
    let name = propose_scale(&s, 4, "incident-closed").await;
    let bob = write_kubeconfig_as(s.dir.path(), &s.fake.url, "bob-token", "bob");
    approve_until_open(&s, &bob, &["approve", &name]).await;
    s.forge.set(1, "closed", false, None);
    s.fake
        .until("the proposal to fail", |f| phase(f, &name) == "Failed")
        .await;
    let message = proposal(&s, &name)["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("closed without being merged"), "{message}");

    // Someone pushes to the branch after approval: what would be merged is not what was
    // approved, and the proposal says so instead of following it.
    let pushed = propose_scale(&s, 7, "incident-pushed").await;
    approve_until_open(&s, &bob, &["approve", &pushed]).await;
    let theirs = "0123456789abcdef0123456789abcdef01234567";
    s.forge.set_head(2, theirs);
    s.forge.set(2, "closed", true, Some(theirs));
    s.fake
        .until("the changed request to fail", |f| {
            phase(f, &pushed) == "Failed"
        })
        .await;
    let message = proposal(&s, &pushed)["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("changed after approval") && message.contains("0123456789ab"),
        "{message}"
    );

    // The Application now points at a repository the policy does not declare: the
    // proposal carries the evidence, and approving it writes nothing.
    s.fake.apply(
        "applications",
        application(
            "shop",
            "https://git.example.com/elsewhere/fleet.git",
            &s.base_commit,
        ),
    );
    let requests_before = s.git.requests().len();
    let other = propose_scale(&s, 6, "incident-elsewhere").await;
    let p = proposal(&s, &other);
    assert_eq!(p["spec"]["delivery"], "git", "{p}");
    let error = p["status"]["preview"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("does not declare") && error.contains("elsewhere/fleet"),
        "{error}"
    );
    let (ok, out) = kubectl_kortex(&bob, &["approve", &other]).await;
    assert!(ok, "{out}");
    s.fake
        .until("the evidence-only proposal to end", |f| {
            phase(f, &other) == "Approved"
        })
        .await;
    let message = proposal(&s, &other)["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("Kortex made no Git change"), "{message}");
    assert_eq!(
        s.git.requests().len(),
        requests_before,
        "no Git request for it"
    );
    assert_eq!(
        s.forge.prs.lock().unwrap().len(),
        2,
        "no pull request for it"
    );
}

const OVERLAY: &str = "# Production overlay of the web shop\nresources:\n  - ../../apps/web\n  - cart-release.yaml\nreplicas:\n  - name: web\n    count: 3 # one per zone\n";
const BASE: &str =
    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n";
const RELEASE: &str = "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata:\n  name: cart\n  namespace: shop\nspec:\n  interval: 5m\n  chart:\n    spec:\n      chart: cart\n  values:\n    # the cart service\n    replicaCount: 2 # sized for weekdays\n    image:\n      tag: \"3.1\"\n";

/// A Flux-applied workload: Deployment `name` in shop, labelled by `labels`, with 2 replicas.
fn flux_deployment(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "shop", "generation": 1, "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": "1"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": name, "image": format!("shop/{name}:1")}]}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_flux_owners_lead_to_the_overlay_and_the_release_values() {
    let s = scene_with(&[
        ("overlays/prod/kustomization.yaml", OVERLAY),
        ("overlays/prod/cart-release.yaml", RELEASE),
        ("apps/web/deployment.yaml", BASE),
    ])
    .await;
    let ks_labels = json!({"kustomize.toolkit.fluxcd.io/name": "apps",
        "kustomize.toolkit.fluxcd.io/namespace": "flux-system"});
    s.fake
        .apply("deployments", flux_deployment("web", ks_labels.clone()));
    s.fake.apply(
        "deployments",
        flux_deployment(
            "cart",
            json!({"helm.toolkit.fluxcd.io/name": "cart",
            "helm.toolkit.fluxcd.io/namespace": "shop"}),
        ),
    );
    s.fake.apply(
        "helmreleases",
        json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": "cart", "namespace": "shop", "labels": ks_labels},
        "spec": {"chart": {"spec": {"chart": "cart"}}}}),
    );
    s.fake.apply("kustomizations", json!({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": "apps", "namespace": "flux-system"},
        "spec": {"path": "./overlays/prod", "interval": "10m", "prune": true,
            "sourceRef": {"kind": "GitRepository", "name": "fleet"}},
        "status": {"lastAppliedRevision": format!("main@sha1:{}", s.base_commit),
            "conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded"}]}}));
    s.fake.apply(
        "gitrepositories",
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "fleet", "namespace": "flux-system"},
        "spec": {"url": s.git.url("acme/fleet"), "ref": {"branch": "main"}, "interval": "1m"}}),
    );

    let changed = |name: &str| -> (Value, Vec<String>) {
        let p = proposal(&s, name);
        let preview = p["status"]["preview"].clone();
        let lines = changed_lines(preview["diff"].as_str().unwrap_or_default())
            .into_iter()
            .map(str::to_owned)
            .collect();
        (preview, lines)
    };
    // A Kustomization: the overlay's replicas entry, not the shared base.
    let web = propose_scale_of(&s, "web", 4, "incident-web").await;
    let (preview, lines) = changed(&web);
    assert_eq!(preview["owner"]["kind"], "Kustomization", "{preview}");
    assert_eq!(
        preview["path"], "overlays/prod/kustomization.yaml",
        "{preview}"
    );
    assert_eq!(
        lines,
        [
            "-    count: 3 # one per zone",
            "+    count: 4 # one per zone"
        ],
        "{preview}"
    );
    // A HelmRelease applied by that Kustomization: its spec.values in the repository.
    let cart = propose_scale_of(&s, "cart", 5, "incident-cart").await;
    let (preview, lines) = changed(&cart);
    assert_eq!(
        preview["path"], "overlays/prod/cart-release.yaml",
        "{preview}"
    );
    assert_eq!(
        lines,
        [
            "-    replicaCount: 2 # sized for weekdays",
            "+    replicaCount: 5 # sized for weekdays"
        ],
        "{preview}"
    );
    // get_gitops_source tells the model the same: who applies it, from where, and that a
    // change can be proposed there.
    push(
        &s.script,
        tool_calls(&[(
            "g1",
            "get_gitops_source",
            json!({"kind": "Deployment", "name": "cart", "namespace": "shop"}),
        )]),
    );
    push_answer(&s.script, &["Flux applies it."]);
    let client = http_client();
    let created = post_json(
        &client,
        s.server.url("/chat/v1/sessions"),
        &json!({"name": "who-applies-cart", "namespace": "team-a"}),
    )
    .await;
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    post_message(&s.server, &id, "who deploys cart?").await;
    wait_idle(&client, &s.server.url(&format!("/chat/v1/sessions/{id}"))).await;
    let answer = s
        .script
        .requests()
        .iter()
        .find_map(|r| crate::support::provider::tool_result(&r.body, "g1"))
        .unwrap_or_else(|| panic!("no tool result:\n{}", s.server.log()));
    let found: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(found["owner"]["tool"], "flux", "{found}");
    assert_eq!(found["owner"]["object"]["kind"], "Kustomization", "{found}");
    assert_eq!(found["owner"]["helmRelease"]["name"], "cart", "{found}");
    assert_eq!(found["sources"][0]["path"], "overlays/prod", "{found}");
    assert_eq!(found["sources"][0]["declaredInPolicy"], true, "{found}");
    assert_eq!(found["sources"][0]["forge"], "github", "{found}");
    assert!(
        found["advice"]
            .as_str()
            .unwrap_or_default()
            .contains("reviewed change"),
        "{found}"
    );
    // The approver of a Flux change needs `update` on the Kustomization.
    let p = proposal(&s, &web);
    assert_eq!(p["spec"]["params"]["git"]["owner"]["kind"], "Kustomization");
    assert_eq!(
        p["spec"]["params"]["git"]["owner"]["namespace"],
        "flux-system"
    );
}

/// A ReplicaSet of Deployment api (uid `owner`) at `revision` running `image`.
fn replica_set(owner: &str, revision: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("api-{revision}"), "namespace": "shop",
            "annotations": {"deployment.kubernetes.io/revision": revision.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "uid": owner, "controller": true}]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "api"}},
            "template": {"metadata": {"labels": {"app": "api", "pod-template-hash": format!("h{revision}")}},
                "spec": {"containers": [{"name": "api", "image": image}]}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_a_rollback_sets_the_image_line_back_and_names_the_commit_that_brought_it() {
    let s = scene_with(&[]).await;
    // Git's history: api 3, then the deploy of api 4 (what the cluster runs now).
    let three = DEPLOYMENT.replace("shop/api:4", "shop/api:3");
    s.git.change(
        "acme/fleet",
        &[crate::support::git_server::Change::Write(
            "apps/api/api.yaml",
            &three,
        )],
        "api 3",
    );
    let four = DEPLOYMENT.replace("payments team", "checkout team");
    let bad = s.git.change(
        "acme/fleet",
        &[crate::support::git_server::Change::Write(
            "apps/api/api.yaml",
            &four,
        )],
        "deploy api 4 (new checkout flow)",
    );
    let uid = s.fake.get("deployments", "shop", "api").unwrap_or_default()["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    s.fake
        .apply("replicasets", replica_set(&uid, 3, "shop/api:3"));
    s.fake
        .apply("replicasets", replica_set(&uid, 4, "shop/api:4"));
    let name = propose(
        &s,
        json!({"action": "rollback",
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "rationale": "5xx rose to 12% two minutes after api 4 rolled out"}),
        "incident-rollback",
    )
    .await;
    let p = proposal(&s, &name);
    let preview = &p["status"]["preview"];
    assert_eq!(preview["delivery"], "git", "{p}");
    let lines = changed_lines(preview["diff"].as_str().unwrap_or_default());
    assert_eq!(
        lines,
        [
            "-          image: shop/api:4",
            "+          image: shop/api:3"
        ],
        "{preview}"
    );
    assert_eq!(preview["introducedBy"]["commit"], bad.as_str(), "{preview}");
    assert_eq!(
        preview["introducedBy"]["subject"],
        "deploy api 4 (new checkout flow)"
    );
    assert_eq!(p["spec"]["params"]["toRevision"], 3);
    assert_eq!(
        p["spec"]["params"]["git"]["expect"],
        json!({"container": "api", "image": "shop/api:3"})
    );
    assert!(preview["revert"].is_null(), "{preview}");

    // With `gitops.revert`, the change is the revert of that commit: both its lines.
    let mut policy = s
        .fake
        .get("chatpolicies", "team-a", "incidents")
        .unwrap_or_default();
    policy["spec"]["gitops"]["revert"] = json!(true);
    s.fake.apply("chatpolicies", policy);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let name = propose(
        &s,
        json!({"action": "rollback",
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "rationale": "5xx rose to 12% two minutes after api 4 rolled out"}),
        "incident-revert",
    )
    .await;
    let preview = proposal(&s, &name)["status"]["preview"].clone();
    assert_eq!(preview["revert"], bad.as_str(), "{preview}");
    let mut lines = changed_lines(preview["diff"].as_str().unwrap_or_default());
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "+          image: shop/api:3",
            "+# The shop's API (owned by the payments team)",
            "-          image: shop/api:4",
            "-# The shop's API (owned by the checkout team)",
        ],
        "{preview}"
    );
}

/// The dashboard's card of a Git change, in a real browser: owner, file, the one-line diff
/// and, once pushed, the request's link and state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_the_dashboard_card_shows_the_diff_and_the_request() {
    let s = scene().await;
    let name = propose_scale(&s, 5, "incident-card").await;
    let bob = write_kubeconfig_as(s.dir.path(), &s.fake.url, "bob-token", "bob");
    approve_until_open(&s, &bob, &["approve", &name]).await;
    let request = proposal(&s, &name)["status"]["git"]["requestUrl"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let url = s.server.url("");
    let env = [
        ("KORTEX_URL", url.trim_end_matches('/')),
        ("KORTEX_REQUEST_URL", request.as_str()),
    ];
    let Some(out) = crate::support::browser::run_browser("gitops_card.mjs", &env).await else {
        return;
    };
    crate::support::browser::passed(&out, &s.server);
}
