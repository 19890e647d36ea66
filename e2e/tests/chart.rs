//! `helm install` of charts/kortex on a real cluster: Kortex comes up running and ready
//! (its readiness probe passes once every watch has listed its objects with the chart's
//! RBAC), and the dashboard and `/readyz` answer through its Service.
//!
//! Needs `KUBECONFIG` (cluster-admin: the chart installs CRDs and ClusterRoles), a `helm`
//! (`KORTEX_TEST_HELM`, else `helm` on the PATH; scripts/test.sh provides one) and a Kortex
//! image the cluster can pull, `KORTEX_E2E_KORTEX_IMAGE` (default `kortex:0.1.0`, e.g.
//! `docker build -t kortex:0.1.0 . && kind load docker-image kortex:0.1.0`).
//!
//! The chart's admission policy is left out here: the operator test installs the same rules
//! for its own ServiceAccount, and two policies each trusting only their own Kortex would
//! refuse each other's proposals. The policy's rules are tested offline
//! (operator/tests/it/admission.rs, and the chart test renders and validates it).

use k8s_openapi::api::apps::v1::Deployment;
use kortex_e2e::{TempNamespace, client};
use kube::Api;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn helm(args: &[&str]) -> anyhow::Result<String> {
    let helm = std::env::var("KORTEX_TEST_HELM").unwrap_or_else(|_| "helm".into());
    let out = Command::new(&helm)
        .args(args)
        .current_dir(repo())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {helm}: {e}"))?;
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
    let image = std::env::var("KORTEX_E2E_KORTEX_IMAGE").unwrap_or_else(|_| "kortex:0.1.0".into());
    let (repository, tag) = image
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .unwrap_or((image.as_str(), "latest"));
    let ns = TempNamespace::create(&client, "chart").await?;
    let release = format!("kortex-{}", std::process::id());
    let installed = helm(&[
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
    ]);
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
    let uninstalled = helm(&["uninstall", &release, "--namespace", &ns.name]);
    ns.delete().await?;
    result?;
    uninstalled?;
    Ok(())
}
