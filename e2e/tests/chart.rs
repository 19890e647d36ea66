//! `helm install` of charts/kortex on a real cluster: Kortex comes up running and ready
//! (its readiness probe passes once every watch has listed its objects with the chart's
//! RBAC), and the dashboard and `/readyz` answer through its Service.
//!
//! Needs `KUBECONFIG` (cluster-admin: the chart installs CRDs and ClusterRoles), a cluster
//! with a Ready node (skipped otherwise, saying so), a `helm` (`KORTEX_TEST_HELM`, else the
//! one scripts/test.sh installs in `target/test-venv`, else `helm` on the PATH; skipped
//! without one) and a Kortex image the cluster can pull, `KORTEX_E2E_KORTEX_IMAGE` (default `kortex:0.1.0`, e.g.
//! `docker build -t kortex:0.1.0 . && kind load docker-image kortex:0.1.0`).
//!
//! The chart's admission policy is left out here: it is cluster-wide and trusts this
//! release's ServiceAccount, so beside the operator test (which acts as the shipped
//! `kortex/kortex`) each would refuse the other's proposals. Its rules are the shipped
//! ones (operator/tests/it/chart.rs compares them and evaluates them on every request
//! shape), and the operator test passes with them installed.

use k8s_openapi::api::apps::v1::Deployment;
use kortex_e2e::{TempNamespace, client, ready_nodes};
use kube::Api;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `helm` to run, found the way scripts/test.sh provides it: `KORTEX_TEST_HELM`, else
/// the one scripts/test.sh writes into `target/test-venv/bin`, else `helm` on the PATH.
fn find_helm() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("KORTEX_TEST_HELM").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let venv = repo().join("target/test-venv/bin/helm");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("helm"))
            .find(|p| p.is_file())
    })
}

fn helm(helm: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(helm)
        .args(args)
        .current_dir(repo())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", helm.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "helm {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// GET `path` on the Kortex Service through the API server's service proxy.
async fn through_service(
    client: &kube::Client,
    namespace: &str,
    service: &str,
    path: &str,
) -> anyhow::Result<String> {
    let uri = format!("/api/v1/namespaces/{namespace}/services/{service}:http/proxy{path}");
    let request = axum::http::Request::get(uri).body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

#[tokio::test]
async fn helm_install_gives_a_ready_kortex_with_its_dashboard() -> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    let Some(helm_bin) = find_helm() else {
        eprintln!(
            "skipping: no helm (set KORTEX_TEST_HELM, run scripts/test.sh once to install one into target/test-venv, or put helm on the PATH)"
        );
        return Ok(());
    };
    if ready_nodes(&client).await? == 0 {
        eprintln!(
            "skipping: the cluster has no Ready node, so Kortex's pod cannot run (helm install needs a cluster with nodes)"
        );
        return Ok(());
    }
    let image = std::env::var("KORTEX_E2E_KORTEX_IMAGE").unwrap_or_else(|_| "kortex:0.1.0".into());
    let (repository, tag) = image
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .unwrap_or((image.as_str(), "latest"));
    let ns = TempNamespace::create(&client, "chart").await?;
    let release = format!("kortex-{}", std::process::id());
    let installed = helm(
        &helm_bin,
        &[
            "install",
            &release,
            "charts/kortex",
            "--namespace",
            &ns.name,
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            "admissionPolicy.enabled=false",
            "--set",
            "log.level=info,kortex=debug",
        ],
    );
    let result = async {
        installed?;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let d = deployments.get(&release).await?;
            let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
            if ready >= 1 {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "Deployment {release} not ready within 240s (is {image} pullable by the cluster? set KORTEX_E2E_KORTEX_IMAGE): {:?}",
                d.status
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let ready = through_service(&client, &ns.name, &release, "/readyz").await?;
        anyhow::ensure!(!ready.is_empty(), "empty /readyz");
        let page = through_service(&client, &ns.name, &release, "/").await?;
        anyhow::ensure!(
            page.contains("<html") || page.contains("<!doctype html") || page.contains("<!DOCTYPE html"),
            "the dashboard did not answer with its page: {}",
            page.chars().take(200).collect::<String>()
        );
        let metrics = through_service(&client, &ns.name, &release, "/metrics").await?;
        anyhow::ensure!(metrics.contains("kortex_build_info"), "no metrics");
        Ok(())
    }
    .await;
    let uninstalled = helm(&helm_bin, &["uninstall", &release, "--namespace", &ns.name]);
    ns.delete().await?;
    result?;
    uninstalled?;
    Ok(())
}
