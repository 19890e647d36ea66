//! `kortex run` against a real cluster: the CRDs and the shipped admission policy installed,
//! Kortex running (on this machine) as its own ServiceAccount with the shipped RBAC, a
//! wire-format provider on 127.0.0.1; the objects become Ready, a broken Secret is reported
//! and its fix followed, a chat makes a proposal, approving it in someone else's name is
//! refused by the API server, `kubectl kortex approve` approves it as the current user,
//! the decision cannot be changed afterwards, and the Deployment is restarted.
//!
//! Needs `KUBECONFIG` with cluster-admin rights (it installs a ClusterRole and an admission
//! policy, removed at the end) and Kubernetes 1.30+. The workload runs `KORTEX_E2E_IMAGE`
//! (default `busybox:1.36`).

use axum::Json;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kortex::crd::{ActionProposal, LLMProvider};
use kortex_e2e::{MANAGER, TempNamespace, client, install_crds, rejection};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A built binary of the workspace (`KORTEX_BIN_DIR`, default `target/debug`).
fn binary(name: &str) -> PathBuf {
    std::env::var_os("KORTEX_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/debug"))
        .join(name)
}

fn yaml_docs(path: &str) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo().join(path))?;
    let mut out = Vec::new();
    for doc in text.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

async fn apply(
    client: &kube::Client,
    namespace: Option<&str>,
    object: &Value,
) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let plural = match kind {
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies".to_owned(),
        "ChatPolicy" => "chatpolicies".to_owned(),
        k => format!("{}s", k.to_lowercase()),
    };
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

async fn delete(client: &kube::Client, api_version: &str, kind: &str, plural: &str, name: &str) {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// An OpenAI-compatible provider on 127.0.0.1: the first chat answer proposes restarting
/// `ticker` in `namespace`, every later one says it is done.
async fn provider(namespace: String) -> anyhow::Result<String> {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/v1/models",
            axum::routing::get(|| async { Json(json!({"object": "list", "data": [{"id": "e2e-model", "object": "model"}]})) }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |Json(body): Json<Value>| {
                let calls = calls.clone();
                let namespace = namespace.clone();
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    let has_result = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
                    let message = if n == 0 && !has_result {
                        let args = json!({"action": "restart", "rationale": "ticker is stuck",
                            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": namespace, "name": "ticker"}});
                        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "propose_action", "arguments": args.to_string()}}]})
                    } else {
                        json!({"role": "assistant", "content": "Proposed a restart of ticker."})
                    };
                    let finish = if message["tool_calls"].is_null() { "stop" } else { "tool_calls" };
                    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "model": "e2e-model",
                        "choices": [{"index": 0, "delta": message, "finish_reason": finish}]});
                    let usage = json!({"id": "c1", "object": "chat.completion.chunk", "model": "e2e-model", "choices": [],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
                    let body = format!("data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n");
                    ([("content-type", "text/event-stream")], body)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/v1"))
}

/// A kubeconfig for the cluster of `base` that authenticates with `token`.
fn kubeconfig_with_token(base: &kube::Config, token: &str, path: &Path) -> anyhow::Result<()> {
    let mut cluster = json!({"server": base.cluster_url.to_string().trim_end_matches('/')});
    if let Some(certs) = &base.root_cert {
        let pem: String = certs
            .iter()
            .map(|der| {
                let b64 = kortex::redact::base64_bytes(der);
                let lines: Vec<&str> = b64
                    .as_bytes()
                    .chunks(64)
                    .filter_map(|c| std::str::from_utf8(c).ok())
                    .collect();
                format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    lines.join("\n")
                )
            })
            .collect();
        cluster["certificate-authority-data"] = json!(kortex::redact::base64(&pem));
    }
    if base.accept_invalid_certs {
        cluster["insecure-skip-tls-verify"] = json!(true);
    }
    let config = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": "kortex", "user": {"token": token}}],
        "contexts": [{"name": "kortex", "context": {"cluster": "e2e", "user": "kortex"}}],
        "current-context": "kortex"});
    std::fs::write(path, serde_json::to_string(&config)?)?;
    Ok(())
}

struct Running {
    child: Child,
    addr: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_kortex(kubeconfig: &Path, ns: &str, db: &Path) -> anyhow::Result<Running> {
    let mut child = Command::new(binary("kortex"))
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--auth",
            "none",
            "--namespace",
            ns,
            "--kortex-namespace",
            ns,
            "--identity",
            "e2e",
        ])
        .arg("--database-url")
        .arg(format!("sqlite://{}", db.display()))
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("kortex: {line}");
            if let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(
                    addr.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
            if let Ok(mut l) = log2.lock() {
                l.push_str(&line);
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60))?;
    Ok(Running { child, addr })
}

async fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn condition(
    status: Option<&kortex::crd::LLMProviderStatus>,
    type_: &str,
) -> Option<(String, String)> {
    status
        .and_then(|s| kortex::crd::conditions::find(&s.conditions, type_))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn operator_reconciles_and_executes_an_approved_proposal() -> anyhow::Result<()> {
    let Some(admin) = client().await else {
        return Ok(());
    };
    install_crds(&admin).await?;
    let ns = TempNamespace::create(&admin, "operator").await?;
    let tag = format!("kortex-e2e-{}", std::process::id());
    let result = run(&admin, &ns.name, &tag).await;
    delete(
        &admin,
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        &tag,
    )
    .await;
    delete(
        &admin,
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        &tag,
    )
    .await;
    delete(
        &admin,
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        &tag,
    )
    .await;
    delete(
        &admin,
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "clusterroles",
        &tag,
    )
    .await;
    ns.delete().await?;
    result
}

async fn run(admin: &kube::Client, ns: &str, tag: &str) -> anyhow::Result<()> {
    let sa_user = format!("system:serviceaccount:{ns}:kortex");
    // The shipped admission policy, for Kortex's ServiceAccount in this namespace, bound to
    // this namespace only (other tests create proposals directly).
    let mut docs = yaml_docs("config/admission/policy.yaml")?;
    let mut policy = docs.remove(0);
    let mut binding = docs.remove(0);
    let variables = policy["spec"]["variables"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("variables"))?;
    variables[0]["expression"] = json!(format!("request.userInfo.username == '{sa_user}'"));
    policy["metadata"]["name"] = json!(tag);
    binding["metadata"]["name"] = json!(tag);
    binding["spec"]["policyName"] = json!(tag);
    binding["spec"]["matchResources"] =
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}});
    apply(admin, None, &policy).await?;
    apply(admin, None, &binding).await?;

    // Kortex's ServiceAccount with the shipped ClusterRole (bound cluster-wide) and Role.
    apply(admin, Some(ns), &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kortex", "namespace": ns}})).await?;
    let roles = yaml_docs("config/rbac/role.yaml")?;
    let mut cluster_role = roles[0].clone();
    cluster_role["metadata"]["name"] = json!(tag);
    apply(admin, None, &cluster_role).await?;
    apply(admin, None, &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": tag}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": tag},
        "subjects": [{"kind": "ServiceAccount", "name": "kortex", "namespace": ns}]})).await?;
    let mut lease_role = roles[1].clone();
    lease_role["metadata"]["namespace"] = json!(ns);
    apply(admin, Some(ns), &lease_role).await?;
    apply(admin, Some(ns), &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kortex-leader-election", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kortex-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": "kortex", "namespace": ns}]})).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    let token: TokenRequest = sas
        .create_subresource("token", "kortex", &PostParams::default(), &request)
        .await?;
    let token = token.status.map(|s| s.token).unwrap_or_default();
    let dir = std::env::temp_dir().join(tag);
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kortex.kubeconfig");
    kubeconfig_with_token(&kube::Config::infer().await?, &token, &kubeconfig)?;

    // The workload, the provider and the policy.
    let image = std::env::var("KORTEX_E2E_IMAGE").unwrap_or_else(|_| "busybox:1.36".into());
    apply(admin, Some(ns), &json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ticker", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ticker"}},
            "template": {"metadata": {"labels": {"app": "ticker"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": image, "command": ["sleep", "3600"]}]}}}})).await?;
    let base_url = provider(ns.to_owned()).await?;
    // `data`, not `stringData`: server-side apply does not track the keys `stringData`
    // becomes, so a later apply could never remove one (kubernetes/kubernetes#108008).
    let secret = |key: Option<&str>| match key {
        Some(k) => {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": ns}, "data": {"openai": kortex::redact::base64(k)}})
        }
        None => {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": ns}, "data": {"other": kortex::redact::base64("x")}})
        }
    };
    apply(admin, Some(ns), &secret(Some("sk-e2e-1"))).await?;
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": "local", "namespace": ns},
        "spec": {"type": "openai-compatible", "baseUrl": base_url, "defaultModel": "e2e-model",
            "apiKeySecretRef": {"name": "llm-keys", "key": "openai"}}}),
    )
    .await?;
    apply(admin, Some(ns), &json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "incidents", "namespace": ns},
        "spec": {"sessions": ["*"], "provider": "local", "runToolsAsUser": false,
            "proposals": {"allowedActions": ["restart"], "allowedNamespaces": [ns], "execute": true, "requireDistinctApprover": true}}})).await?;

    let kortex = start_kortex(&kubeconfig, ns, &dir.join("kortex.db"))?;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", kortex.addr);

    // Conditions written by the leader.
    let providers: Api<LLMProvider> = Api::namespaced(admin.clone(), ns);
    wait_for(
        "the provider to be Ready",
        Duration::from_secs(60),
        async || {
            let p = providers.get("local").await?;
            Ok(condition(p.status.as_ref(), "Ready").is_some_and(|(s, _)| s == "True"))
        },
    )
    .await?;
    // A broken Secret is reported within seconds, and its fix followed.
    apply(admin, Some(ns), &secret(None)).await?;
    wait_for(
        "SecretResolved=False",
        Duration::from_secs(30),
        async || {
            let p = providers.get("local").await?;
            Ok(condition(p.status.as_ref(), "SecretResolved")
                == Some(("False".into(), "SecretKeyNotFound".into())))
        },
    )
    .await?;
    apply(admin, Some(ns), &secret(Some("sk-e2e-2"))).await?;
    wait_for(
        "SecretResolved=True and Ready=True",
        Duration::from_secs(30),
        async || {
            let p = providers.get("local").await?;
            Ok(
                condition(p.status.as_ref(), "SecretResolved").is_some_and(|(s, _)| s == "True")
                    && condition(p.status.as_ref(), "Ready").is_some_and(|(s, _)| s == "True"),
            )
        },
    )
    .await?;

    // A chat makes a proposal.
    let session: Value = http
        .post(url("/chat/v1/sessions"))
        .json(&json!({"name": "incident-e2e", "namespace": ns}))
        .send()
        .await?
        .json()
        .await?;
    let id = session["id"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(!id.is_empty(), "no session: {session}");
    let r = http
        .post(url(&format!("/chat/v1/sessions/{id}/messages")))
        .json(&json!({"content": "ticker is stuck"}))
        .send()
        .await?;
    anyhow::ensure!(
        r.status().as_u16() == 202,
        "message refused: {}",
        r.status()
    );
    let proposals: Api<ActionProposal> = Api::namespaced(admin.clone(), ns);
    let mut name = String::new();
    wait_for("a Pending proposal", Duration::from_secs(60), async || {
        let list = proposals.list(&ListParams::default()).await?;
        if let Some(p) = list.items.iter().find(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.phase == kortex::crd::ProposalPhase::Pending)
        }) {
            name = p.metadata.name.clone().unwrap_or_default();
            return Ok(true);
        }
        Ok(false)
    })
    .await?;

    // Approving in someone else's name is refused by the API server.
    let forged = json!({"spec": {"decision": {"verdict": "Approve", "by": "someone-else"}}});
    let message = rejection(
        proposals
            .patch(&name, &PatchParams::default(), &Patch::Merge(&forged))
            .await,
    );
    anyhow::ensure!(
        message.contains("your own username"),
        "unexpected refusal: {message}"
    );

    // `kubectl kortex approve` approves as the current user, and Kortex executes it.
    // Off the test's runtime, which keeps serving the mock provider meanwhile.
    let (plugin, approve_args) = (
        binary("kubectl-kortex"),
        [
            "approve".to_owned(),
            name.clone(),
            "-n".into(),
            ns.to_owned(),
            "--reason".into(),
            "e2e".into(),
        ],
    );
    let out = tokio::task::spawn_blocking(move || Command::new(plugin).args(approve_args).output())
        .await??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success(),
        "kubectl kortex approve failed: {text}"
    );
    wait_for(
        "the proposal to succeed",
        Duration::from_secs(60),
        async || {
            let p = proposals.get(&name).await?;
            Ok(p.status
                .is_some_and(|s| s.phase == kortex::crd::ProposalPhase::Succeeded))
        },
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let ticker = deployments.get("ticker").await?;
    let annotations = ticker
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    anyhow::ensure!(
        annotations.contains_key("kubectl.kubernetes.io/restartedAt"),
        "not restarted: {annotations:?}"
    );

    // The decision is final.
    let changed = json!({"spec": {"decision": {"verdict": "Reject", "by": "someone-else"}}});
    let message = rejection(
        proposals
            .patch(&name, &PatchParams::default(), &Patch::Merge(&changed))
            .await,
    );
    anyhow::ensure!(!message.is_empty());
    // Only Kortex creates proposals.
    let mut copy = proposals.get(&name).await?;
    copy.metadata = kube::api::ObjectMeta {
        name: Some(format!("{name}-copy")),
        ..Default::default()
    };
    copy.spec.decision = None;
    copy.status = None;
    let message = rejection(proposals.create(&PostParams::default(), &copy).await);
    anyhow::ensure!(
        message.contains("only Kortex"),
        "unexpected refusal: {message}"
    );
    drop(kortex);
    Ok(())
}
