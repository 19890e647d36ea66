//! The Git delivery phase (docs/gitops.md) on the real API server: Argo CD's and Flux's
//! CRDs as their projects publish them (`../shared/gitops-crds`, or
//! `KORTEX_E2E_GITOPS_CRDS`), an Application pointing at a real Git server on 127.0.0.1,
//! the ticker Deployment tracked by it; a scale proposal becomes a one-line Git change,
//! alice approves it with `kubectl kortex approve` (she may `update` the Application), the
//! pull request is opened at a scripted GitHub; the test plays the forge (merged) and Argo
//! CD (the Application's sync revision, the Deployment's replicas), and the proposal ends
//! Succeeded.

use super::forge::forge_for;
use super::git_server::{GitServer, git};
use super::{Scene, apply, kubectl_kortex, pending_proposal, repo, say, wait_for, wait_phase};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kortex::crd::{ActionProposal, Forge, ProposalPhase};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

const TOKEN: &str = "ghp_e2eGitopsCanary5Kq";

/// Installs the GitOps tools' CRDs; `false` (and why, on stderr) when they are not here.
async fn install_gitops_crds(admin: &kube::Client) -> anyhow::Result<bool> {
    let dir = std::env::var_os("KORTEX_E2E_GITOPS_CRDS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/gitops-crds"));
    if !dir.is_dir() {
        eprintln!(
            "skipping the Git delivery phase: no GitOps CRDs at {} (set KORTEX_E2E_GITOPS_CRDS)",
            dir.display()
        );
        return Ok(false);
    }
    for file in [
        "argocd-application-crd.yaml",
        "flux-gitrepository-crd.yaml",
        "flux-kustomization-crd.yaml",
        "flux-helmrelease-crd.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        kortex_e2e::install_crd(admin, &crd).await?;
    }
    Ok(true)
}

pub async fn delivered_through_git(scene: &Scene<'_>) -> anyhow::Result<()> {
    let (admin, ns) = (scene.admin, scene.ns);
    if !install_gitops_crds(admin).await? {
        return Ok(());
    }
    let manifest = format!(
        "# ticker, applied by Argo CD\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: ticker\n  namespace: {ns}\nspec:\n  replicas: 1 # one is enough off season\n  selector:\n    matchLabels: {{app: ticker}}\n"
    );
    let server = GitServer::start("x-access-token", TOKEN).await;
    let base = server.create("acme/fleet", &[("apps/ticker/deployment.yaml", &manifest)]);
    let (forge_root, forge) = forge_for(Forge::Github, "/repos/acme/fleet", TOKEN).await;

    // The token's Secret, the policy's repository (Applications live in the test's
    // namespace), the Application, and ticker tracked by it as Argo CD tracks it.
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "fleet-git", "namespace": ns, "labels": {"kortex.dev/use": "true"}},
        "data": {"token": kortex::redact::base64(TOKEN)}}),
    )
    .await?;
    let policies: Api<kortex::crd::ChatPolicy> = Api::namespaced(admin.clone(), ns);
    let patch = json!({"spec": {
        "proposals": {"allowedActions": ["restart", "rollback", "scale"]},
        "gitops": {"argoCDNamespace": ns, "repositories": [{"url": server.url("acme/fleet"),
            "forge": "github", "apiUrl": forge_root, "allowPrivateTargets": true,
            "secretRef": {"name": "fleet-git", "key": "token"}}]}}});
    policies
        .patch("incidents", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let application = |revision: &str| {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "ticker-app", "namespace": ns},
            "spec": {"project": "default",
                "source": {"repoURL": server.url("acme/fleet"), "path": "apps/ticker", "targetRevision": "main"},
                "destination": {"server": "https://kubernetes.default.svc", "namespace": ns},
                "syncPolicy": {"automated": {"selfHeal": true}}},
            "status": {"sync": {"status": "Synced", "revision": revision}}})
    };
    apply(admin, Some(ns), &application(&base)).await?;
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        ),
    );
    let tracked = json!({"metadata": {"annotations": {
        "argocd.argoproj.io/tracking-id": format!("ticker-app:apps/Deployment:{ns}/ticker")}}});
    deployments
        .patch("ticker", &PatchParams::default(), &Patch::Merge(&tracked))
        .await?;
    // alice (in sre) may update the Application: an approver of a Git change must be.
    apply(admin, Some(ns), &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "gitops-apps", "namespace": ns},
        "rules": [{"apiGroups": ["argoproj.io"], "resources": ["applications"], "verbs": ["get", "update"]}]})).await?;
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "gitops-apps", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gitops-apps"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "sre"}]}),
    )
    .await?;
    // The policy's new repository is read before the proposal is made.
    wait_for(
        "the GitOps condition",
        Duration::from_secs(30),
        async || {
            let p = policies.get("incidents").await?;
            Ok(p.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "GitOps" && c.status == "True")
            }))
        },
    )
    .await?;

    // get_gitops_source, as Kortex reads the real objects: the Application, its source and
    // sync state, and that the policy declares the repository.
    let incidents = kortex::catalog::PolicyEntry::as_is(policies.get("incidents").await?);
    let (db, mut ctx) = kortex_e2e::tool_context("gitops", "incident-e2e-who", ns, "e2e").await?;
    ctx.scope = std::sync::Arc::new(kortex::tools::CallerScope {
        policy: Some(incidents.clone()),
        ..Default::default()
    });
    let call = kortex::llm::ToolCall {
        id: "g".into(),
        name: "get_gitops_source".into(),
        input: json!({"kind": "Deployment", "name": "ticker", "namespace": ns}),
    };
    let out = kortex_e2e::kube_tools(admin)
        .execute(ctx, &call, &incidents, std::future::pending())
        .await;
    let _ = std::fs::remove_file(db);
    anyhow::ensure!(!out.is_error, "get_gitops_source failed: {}", out.content);
    let found: serde_json::Value = serde_json::from_str(&out.content)?;
    anyhow::ensure!(
        found["owner"]["object"]["name"] == "ticker-app"
            && found["owner"]["selfHeal"] == true
            && found["owner"]["syncedRevision"] == base.as_str()
            && found["sources"][0]["path"] == "apps/ticker",
        "unexpected owner: {found}"
    );

    // The proposal: a Git change, previewed as the one-line diff.
    let proposals: Api<ActionProposal> = Api::namespaced(admin.clone(), ns);
    say(
        scene.http,
        scene.base,
        scene.reporter,
        ns,
        "incident-e2e-gitops",
        "please scale ticker",
    )
    .await?;
    let name = pending_proposal(&proposals).await?;
    let p = proposals.get(&name).await?;
    anyhow::ensure!(
        p.spec.delivery == Some(kortex::crd::Delivery::Git),
        "not a Git change: {:?}",
        p.status
    );
    let preview = p
        .status
        .as_ref()
        .and_then(|s| s.preview.clone())
        .unwrap_or_default();
    let diff = preview["diff"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(
        diff.contains("\n-  replicas: 1 # one is enough off season\n+  replicas: 3 # one is enough off season\n"),
        "unexpected preview: {preview}"
    );

    // alice approves; the request is opened and the proposal waits for its merge.
    let out = kubectl_kortex(
        Some(scene.alice),
        &["approve", &name, "-n", ns, "--reason", "e2e"],
    )
    .await?;
    anyhow::ensure!(out.contains("approved by alice"), "{out}");
    let mut commit = String::new();
    wait_for("the pull request", Duration::from_secs(60), async || {
        let p = proposals.get(&name).await?;
        let git = p.status.and_then(|s| s.git);
        if let Some(g) = git.filter(|g| g.request_state == "open") {
            commit = g.commit;
            return Ok(true);
        }
        Ok(false)
    })
    .await?;
    let list = kubectl_kortex(Some(scene.alice), &["list", "-n", ns]).await?;
    anyhow::ensure!(list.contains("(open)"), "{list}");
    let pushed = git(&server.bare("acme/fleet"), &["diff", &base, &commit]);
    anyhow::ensure!(
        pushed
            .lines()
            .filter(|l| !l.starts_with("index "))
            .collect::<Vec<_>>()
            == diff.lines().collect::<Vec<_>>(),
        "the pushed change is not the previewed one:\n{pushed}"
    );

    // The forge merges it; Argo CD syncs the merge and scales ticker: Succeeded.
    forge.set(1, "closed", true, Some(&commit));
    apply(admin, Some(ns), &application(&commit)).await?;
    let scaled = json!({"spec": {"replicas": 3}});
    deployments
        .patch("ticker", &PatchParams::default(), &Patch::Merge(&scaled))
        .await?;
    wait_phase(&proposals, &name, ProposalPhase::Succeeded).await?;
    let p = proposals.get(&name).await?;
    let status = p.status.unwrap_or_default();
    anyhow::ensure!(
        status.git.as_ref().and_then(|g| g.merge_commit.as_deref()) == Some(commit.as_str()),
        "{status:?}"
    );
    let message = status.message.unwrap_or_default();
    anyhow::ensure!(!message.contains(TOKEN), "{message}");
    Ok(())
}
