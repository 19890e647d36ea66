//! The generated CRDs on a real API server: they install, accept the samples, and enforce
//! the CEL rules (one-of http/mcp, immutable proposals, decisions set once).

use kortex::crd::{ActionProposal, KortexTool, LLMProvider};
use kortex_e2e::{TempNamespace, client, install_crds, rejection};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn crds_install_and_enforce_their_rules() -> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    install_crds(&client).await?;
    let ns = TempNamespace::create(&client, "crds").await?;
    let result = run(&client, &ns.name).await;
    ns.delete().await?;
    result
}

async fn run(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let providers: Api<LLMProvider> = Api::namespaced(client.clone(), ns);
    let provider: LLMProvider = serde_json::from_value(json!({
        "apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider", "metadata": {"name": "anthropic"},
        "spec": {"type": "anthropic", "apiKeySecretRef": {"name": "llm-keys", "key": "anthropic"}, "defaultModel": "claude-opus-4-6"}
    }))?;
    let created = providers.create(&PostParams::default(), &provider).await?;
    assert_eq!(
        created.spec.tool_mode,
        kortex::crd::ToolMode::Native,
        "schema default applied"
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

    let proposals: Api<ActionProposal> = Api::namespaced(client.clone(), ns);
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
