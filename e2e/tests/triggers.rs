//! Triggers' identity against a real API server (docs/triggers.md#identity): Kortex asks the
//! TokenRequest API for a short-lived token of the trigger's `runAs` ServiceAccount, and
//! the Kubernetes tools run with it — a ServiceAccount allowed pods but not `pods/log` gets
//! a permission error from the logs tool, where Kortex's own account is allowed (and only
//! finds the pod missing). Also: the `trigger` verb on a ChatPolicy is what a
//! SubjectAccessReview answers for the caller.

use kortex::llm::ToolCall;
use kortex::operator::auth::ClusterAuth;
use kortex::store::{NewSession, Store};
use kortex::tools::{KubeIdentity, ToolContext};
use kortex_e2e::{TempNamespace, any_policy, apply, client, kube_tools};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn a_run_as_service_account_reads_only_what_it_may() -> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    let ns = TempNamespace::create(&client, "trigger").await?;
    let result = run(&client, &ns.name).await;
    ns.delete().await?;
    result
}

async fn run(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "investigator", "namespace": ns}}),
    )
    .await?;
    apply(
        client,
        ns,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "pods-no-logs", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                  {"apiGroups": ["kortex.dev"], "resources": ["chatpolicies"], "verbs": ["use"]}]}),
    )
    .await?;
    apply(client, ns, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "investigator", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-no-logs"},
        "subjects": [{"kind": "ServiceAccount", "name": "investigator", "namespace": ns}]})).await?;

    let config = kube::Config::infer().await?;
    let auth = ClusterAuth::new(client.clone(), config);
    let user = format!("system:serviceaccount:{ns}:investigator");
    let groups = vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_owned(),
    ];
    // RBAC settles within moments of the binding.
    let mut allowed = false;
    for _ in 0..20 {
        allowed = auth
            .may_use_policy(&user, &groups, ns, "incidents")
            .await
            .map_err(anyhow::Error::msg)?;
        if allowed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(allowed, "{user} may use the policy");
    assert!(
        !auth
            .may_trigger_policy(&user, &groups, ns, "incidents")
            .await
            .map_err(anyhow::Error::msg)?,
        "use does not grant trigger"
    );
    let token = auth
        .service_account_token(ns, "investigator", 600)
        .await
        .map_err(anyhow::Error::msg)?;
    let as_sa = auth.client_as(token.expose()).map_err(anyhow::Error::msg)?;

    let path = std::env::temp_dir().join(format!("kortex-e2e-trigger-{}.db", std::process::id()));
    let store = Store::connect(&format!("sqlite://{}", path.display())).await?;
    store.migrate().await?;
    let session = store
        .create_session(&NewSession {
            name: "alert-e2e".into(),
            namespace: ns.into(),
            user: user.clone(),
            policy: None,
            dynamic_tools: json!([]),
        })
        .await?;
    let router = kube_tools(client);
    let policy = any_policy(ns, "incidents")?;
    let logs = |kube: KubeIdentity| {
        let ctx = ToolContext {
            store: store.clone(),
            session: session.clone(),
            run_id: "run".into(),
            redactor: Default::default(),
            kube,
            guides: Arc::from(Vec::new()),
            via: "chat",
        };
        let (router, policy) = (&router, &policy);
        let call = ToolCall {
            id: "c".into(),
            name: "get_logs".into(),
            input: json!({"namespace": ns, "pod": "checkout-0"}),
        };
        async move {
            router
                .execute(ctx, &call, policy, std::future::pending())
                .await
        }
    };
    let as_investigator = logs(KubeIdentity::User(as_sa)).await;
    assert!(as_investigator.is_error, "{}", as_investigator.content);
    assert!(
        as_investigator.content.contains("forbidden")
            || as_investigator.content.contains("permission"),
        "the ServiceAccount may not read logs: {}",
        as_investigator.content
    );
    let as_kortex = logs(KubeIdentity::Kortex).await;
    assert!(
        !as_kortex.content.contains("forbidden"),
        "Kortex's own account may read logs (the pod is simply missing): {}",
        as_kortex.content
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}
