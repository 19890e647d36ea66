//! Triggers' identity against a real API server (docs/triggers.md#identity): Kortex asks the
//! TokenRequest API for a short-lived token of the trigger's `runAs` ServiceAccount, and
//! the Kubernetes tools run with it — a ServiceAccount allowed pods but not `pods/log` gets
//! a permission error from the logs tool, where Kortex's own account is allowed (and only
//! finds the pod missing). Also: the `trigger` verb on a ChatPolicy is what a
//! SubjectAccessReview answers for the caller. And Kortex's own ServiceAccount, with the
//! shipped RBAC, mints tokens only of the runAs ServiceAccounts granted to it by name in
//! their namespace (config/rbac/trigger_runas.yaml), never of kube-system's controllers.

use kortex::llm::ToolCall;
use kortex::operator::auth::{ClusterAuth, TokenRequestError};
use kortex::tools::KubeIdentity;
use kortex_e2e::{
    TempNamespace, any_policy, apply, client, impersonating, in_temp_namespace, kube_tools,
    tool_context, yaml_docs,
};
use serde_json::json;

#[tokio::test]
async fn a_run_as_service_account_reads_only_what_it_may() -> anyhow::Result<()> {
    in_temp_namespace("trigger", run).await
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

    // The pod exists (Pending without nodes is enough): the ServiceAccount may read it but
    // not its logs, so the logs tool's refusal is RBAC's, not a missing pod.
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "checkout-0", "namespace": ns},
        // Its ServiceAccount is the one this test made (a fresh namespace's `default` may
        // not exist yet, and the API server refuses a pod whose account is missing).
        "spec": {"serviceAccountName": "investigator", "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}),
    )
    .await?;
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
    let as_sa = auth
        .client_as(&kortex::operator::auth::KubeCredential::Token(
            token.clone(),
        ))
        .map_err(anyhow::Error::msg)?;

    let (path, base) = tool_context("trigger", "alert-e2e", ns, &user).await?;
    let router = kube_tools(client);
    let policy = any_policy(ns, "incidents")?;
    let logs = |kube: KubeIdentity| {
        let mut ctx = base.clone();
        ctx.kube = kube;
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

async fn delete_cluster(client: &kube::Client, kind: &str, name: &str) {
    use kube::api::{DeleteParams, DynamicObject};
    use kube::core::{ApiResource, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client.clone(), &resource);
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// Issue 44 item 1: with config/rbac/role.yaml bound cluster-wide and
/// config/rbac/trigger_runas.yaml in one namespace, Kortex mints a token of the runAs
/// ServiceAccount named there, and of nobody else: not another ServiceAccount of that
/// namespace, not the same name elsewhere, not kube-system's controllers.
#[tokio::test]
async fn kortex_mints_tokens_only_of_the_run_as_service_accounts_granted_to_it()
-> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    let granted = TempNamespace::create(&client, "runas").await?;
    let other = TempNamespace::create(&client, "elsewhere").await?;
    let tag = format!("kortex-e2e-runas-{}", std::process::id());
    let result = run_as_grants(&client, &granted.name, &other.name, &tag).await;
    delete_cluster(&client, "ClusterRoleBinding", &tag).await;
    delete_cluster(&client, "ClusterRole", &tag).await;
    granted.delete().await?;
    other.delete().await?;
    result
}

async fn run_as_grants(
    client: &kube::Client,
    ns: &str,
    elsewhere: &str,
    tag: &str,
) -> anyhow::Result<()> {
    for (namespace, name) in [
        (ns, "kortex"),
        (ns, "kortex-investigator"),
        (ns, "builder"),
        (elsewhere, "kortex-investigator"),
    ] {
        apply(
            client,
            namespace,
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}}),
        )
        .await?;
    }
    // Kortex's ClusterRole as shipped, bound cluster-wide to a ServiceAccount `kortex` here.
    let subject = json!([{"kind": "ServiceAccount", "name": "kortex", "namespace": ns}]);
    let mut role = yaml_docs("config/rbac/role.yaml")?.remove(0);
    role["metadata"]["name"] = json!(tag);
    apply(client, "", role).await?;
    apply(
        client,
        "",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": tag},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": tag},
        "subjects": subject}),
    )
    .await?;
    // The runAs grant as shipped, in this namespace.
    let mut runas = yaml_docs("config/rbac/trigger_runas.yaml")?;
    for doc in &mut runas {
        doc["metadata"]["namespace"] = json!(ns);
    }
    runas[1]["subjects"] = subject;
    for doc in runas {
        apply(client, ns, doc).await?;
    }

    let kortex = impersonating(
        &format!("system:serviceaccount:{ns}:kortex"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{ns}"),
        ],
    )
    .await?;
    let auth = ClusterAuth::new(kortex, kube::Config::infer().await?);
    // RBAC settles within moments of the binding.
    let mut minted = Err(TokenRequestError::Failed("not tried".into()));
    for _ in 0..20 {
        minted = auth
            .service_account_token(ns, "kortex-investigator", 600)
            .await;
        if minted.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(
        minted.is_ok(),
        "the granted runAs ServiceAccount: {minted:?}"
    );
    for (namespace, name) in [
        (ns, "builder"),
        (elsewhere, "kortex-investigator"),
        ("kube-system", "generic-garbage-collector"),
        ("kube-system", "clusterrole-aggregation-controller"),
        ("kube-system", "default"),
        ("default", "default"),
    ] {
        match auth.service_account_token(namespace, name, 600).await {
            Err(e @ TokenRequestError::Forbidden { .. }) => {
                assert!(e.to_string().contains("serviceaccounts/token"), "{e}");
            }
            other => {
                panic!("Kortex minted or tried to mint a token of {namespace}/{name}: {other:?}")
            }
        }
    }
    Ok(())
}
