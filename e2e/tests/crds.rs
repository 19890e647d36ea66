//! The generated CRDs on a real API server: they install, accept the samples, and enforce
//! the CEL rules (one-of http/mcp, immutable proposals, decisions set once). Proposals are
//! written as Kortex's ServiceAccount, as in a real install, so the test passes with or
//! without Kortex's admission policy on the cluster.

use kortex::crd::{ActionProposal, KortexTool, LLMProvider};
use kortex_e2e::{
    apply, as_kortex, in_temp_namespace, install_crds, kortex_service_account, rejection,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn crds_install_and_enforce_their_rules() -> anyhow::Result<()> {
    in_temp_namespace("crds", run).await
}

async fn run(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    install_crds(client).await?;
    let providers: Api<LLMProvider> = Api::namespaced(client.clone(), ns);
    let provider: LLMProvider = serde_json::from_value(json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider", "metadata": {"name": "anthropic"},
        "spec": {"type": "anthropic", "apiKeySecretRef": {"name": "llm-keys", "key": "anthropic"}, "defaultModel": "claude-opus-4-6"}
    }))?;
    let created = providers.create(&PostParams::default(), &provider).await?;
    assert_eq!(
        created.spec.tool_mode(),
        kortex::crd::ToolMode::Native,
        "anthropic defaults to native tools"
    );

    let tools: Api<KortexTool> = Api::namespaced(client.clone(), ns);
    let both: KortexTool = serde_json::from_value(json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "KortexTool", "metadata": {"name": "both"},
        "spec": {"description": "d", "http": {"url": "http://a/x"}, "mcp": {"url": "http://m/mcp"}}
    }))?;
    let message = rejection(tools.create(&PostParams::default(), &both).await);
    assert!(
        message.contains("exactly one of spec.http or spec.mcp must be set"),
        "{message}"
    );

    // Proposals are written as Kortex's ServiceAccount (granted here), so the rules below
    // are the CRD's own whether or not Kortex's admission policy is installed.
    grant_kortex_proposals(client, ns).await?;
    let kortex = as_kortex().await?;
    let proposals: Api<ActionProposal> = Api::namespaced(kortex, ns);
    let proposal: ActionProposal = serde_json::from_value(json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal", "metadata": {"name": "restart-api"},
        "spec": {"action": "restart", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns, "name": "api"},
                 "params": {"replicas": 3}, "rationale": "r", "session": {"id": "s", "name": "incident-1", "user": "alice"}}
    }))?;
    proposals.create(&PostParams::default(), &proposal).await?;
    let merge = |v: serde_json::Value| Patch::Merge(v);
    let message = rejection(
        proposals
            .patch(
                "restart-api",
                &PatchParams::default(),
                &merge(json!({"spec": {"action": "scale"}})),
            )
            .await,
    );
    assert!(
        message.contains("spec is immutable except spec.decision"),
        "{message}"
    );
    let message = rejection(
        proposals
            .patch(
                "restart-api",
                &PatchParams::default(),
                &merge(json!({"spec": {"params": {"replicas": 300}}})),
            )
            .await,
    );
    assert!(
        message.contains("spec is immutable except spec.decision"),
        "params too: {message}"
    );
    // A decision only while Pending (the admission policy's rule, when installed).
    proposals
        .patch_status(
            "restart-api",
            &PatchParams::default(),
            &merge(json!({"status": {"phase": "Pending"}})),
        )
        .await?;
    proposals
        .patch(
            "restart-api",
            &PatchParams::default(),
            &merge(json!({"spec": {"decision": {"verdict": "Approve", "by": "bob"}}})),
        )
        .await?;
    let message = rejection(
        proposals
            .patch(
                "restart-api",
                &PatchParams::default(),
                &merge(json!({"spec": {"decision": {"verdict": "Reject", "by": "bob"}}})),
            )
            .await,
    );
    assert!(
        message.contains("spec.decision is final once set"),
        "{message}"
    );
    Ok(())
}

/// Lets Kortex's ServiceAccount write proposals in `ns` (what its ClusterRole grants), for
/// a cluster where Kortex is not installed; removed with the namespace.
async fn grant_kortex_proposals(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let (sa_ns, sa_name) = kortex_service_account();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "kortex-proposals", "namespace": ns},
        "rules": [
            {"apiGroups": ["kortex.dev"], "resources": ["actionproposals"], "verbs": ["get", "list", "watch", "create", "patch"]},
            {"apiGroups": ["kortex.dev"], "resources": ["actionproposals/status"], "verbs": ["patch"]}]
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kortex-proposals", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kortex-proposals"},
        "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}]
    });
    for object in [role, binding] {
        apply(client, ns, object).await?;
    }
    Ok(())
}
