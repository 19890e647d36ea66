//! `get_gitops_source`: who applies an object from Git (Argo CD, Flux, an HPA owning its
//! replicas, or nobody), from which repository, path and revision, whether it syncs and
//! heals on its own, and whether the session's policy declares the repository (so a
//! proposal for the object becomes a reviewed Git change rather than a live patch).

use super::{Cluster, ToolError, required, sanitize, seg};
use crate::llm::ToolSpec;
use crate::tools::{Tool, ToolContext, ToolFuture};
use serde_json::{Value, json};
use std::sync::Arc;

/// The tool's name.
pub const NAME: &str = "get_gitops_source";

/// The tool, on the cluster it reads.
pub struct GetGitopsSource(pub(super) Arc<Cluster>);

impl Tool for GetGitopsSource {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description: "Who applies a Kubernetes object from Git: Argo CD (its Application) or Flux (its Kustomization, HelmRelease and GitRepository), the repository, path and revision, whether it syncs and reverts live changes on its own, the revision it last synced, an HPA owning the replicas, and whether this policy lets Kortex propose a Git change there. Call it before proposing a change to a workload: a live change to a GitOps-owned object is reverted.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "minLength": 1, "maxLength": 100, "description": "e.g. Deployment"},
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                    "apiVersion": {"type": "string", "maxLength": 253}
                },
                "required": ["kind", "name", "namespace"],
                "additionalProperties": false
            }),
        }
    }

    fn kubernetes(&self) -> bool {
        true
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let cluster = self.0.as_caller(&ctx);
        let policy = ctx.scope.policy.clone();
        Box::pin(async move { source(&*cluster?, policy.as_ref(), &input).await })
    }
}

async fn source(
    cluster: &Cluster,
    policy: Option<&crate::catalog::PolicyEntry>,
    input: &Value,
) -> Result<String, ToolError> {
    let kind = cluster
        .resolve(required(input, "kind")?, input["apiVersion"].as_str())
        .await?;
    let name = required(input, "name")?;
    let namespace = required(input, "namespace")?;
    let mut object = cluster
        .get_json(&format!("{}/{}", kind.path(Some(namespace)), seg(name)))
        .await?;
    if object.get("kind").is_none() {
        object["kind"] = json!(kind.kind);
    }
    let gitops = policy.and_then(|p| p.object.spec.gitops.as_ref());
    let argo_ns = gitops
        .and_then(|g| g.argo_cd_namespace.as_deref())
        .unwrap_or(crate::gitops::owner::ARGO_NAMESPACE);
    let owner = crate::gitops::owner::find(&cluster.client, &object, argo_ns).await;
    let declared = policy.map(|p| p.gitops.as_slice()).unwrap_or_default();
    let sources: Vec<Value> = owner
        .sources
        .iter()
        .map(|s| {
            let repo = crate::gitops::declared(declared, &s.repo_url);
            json!({
                "repoURL": s.repo_url,
                "path": s.path,
                "revision": s.revision,
                "helm": s.helm,
                "valueFiles": s.value_files,
                "helmRelease": s.helm_release,
                "declaredInPolicy": repo.is_some(),
                "forge": repo.map(|r| r.spec.forge.as_str()),
            })
        })
        .collect();
    let advice = advice(&owner, &sources);
    let mut target = json!({"kind": kind.kind, "namespace": namespace, "name": name});
    sanitize(&mut target);
    Ok(json!({
        "target": target,
        "owner": {
            "tool": owner.tool,
            "object": owner.object,
            "helmRelease": owner.helm_release,
            "automated": owner.automated,
            "selfHeal": owner.self_heal,
            "syncStatus": owner.sync_status,
            "syncedRevision": owner.synced_revision,
            "syncFailure": owner.sync_failure,
        },
        "sources": sources,
        "hpa": owner.hpa,
        "problems": owner.problems,
        "advice": advice,
    })
    .to_string())
}

/// What a proposal for the object would become, in a sentence the model can act on.
fn advice(owner: &crate::gitops::owner::Owner, sources: &[Value]) -> String {
    let hpa = owner
        .hpa
        .as_ref()
        .map(|h| {
            format!(
                " HorizontalPodAutoscaler {} owns the replicas ({}..{}): change its bounds, not the replicas.",
                h["name"].as_str().unwrap_or_default(),
                h["min"],
                h["max"]
            )
        })
        .unwrap_or_default();
    if !owner.is_gitops() {
        return format!("Not applied by Argo CD or Flux: a proposal changes the live object.{hpa}");
    }
    let tool = if owner.tool == "argocd" {
        "Argo CD"
    } else {
        "Flux"
    };
    let writable = sources.iter().any(|s| s["declaredInPolicy"] == true);
    if writable {
        format!(
            "{tool} applies it from Git: a scale or rollback proposal becomes a reviewed change (pull/merge request) in the declared repository, previewed as a diff; a restart stays a live annotation (docs/gitops.md).{hpa}"
        )
    } else {
        format!(
            "{tool} applies it from Git, from a repository this policy does not declare (spec.gitops.repositories): Kortex cannot change it there; a live change would be reverted{}. Give the person the repository, path and evidence instead.{hpa}",
            if owner.self_heal {
                " by self-heal"
            } else {
                " at the next sync"
            }
        )
    }
}
