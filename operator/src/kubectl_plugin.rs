//! `kubectl kortex`: the kubectl plugin (binary `kubectl-kortex`) for ActionProposals.
//!
//! `list` shows proposals; `approve` and `reject` write `spec.decision` with `by` (and
//! `groups`) set to the current user as the cluster knows them (a SelfSubjectReview), so
//! the admission policy, which requires `by` to be the writer's own username, accepts it;
//! `undo` asks Kortex for the inverse proposal of an executed one (it needs its own
//! approval). Everything goes through the user's own kubeconfig credentials and RBAC.

use crate::crd::{ActionProposal, ProposalPhase};
use crate::operator::proposals::UNDO_REQUEST_ANNOTATION;
use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::process::ExitCode;
use std::time::Duration;

/// Decide Kortex ActionProposals.
#[derive(Parser, Debug)]
#[command(name = "kubectl kortex", version, about, long_about = None)]
pub struct Cli {
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List proposals (newest first).
    List(ListArgs),
    /// Approve a proposal (as yourself).
    Approve(DecideArgs),
    /// Reject a proposal (as yourself).
    Reject(DecideArgs),
    /// Ask for the inverse of an executed proposal (a new proposal, approved separately).
    Undo(Target),
}

/// Where to look.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Namespace (default: the context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only this phase, e.g. Pending.
    #[arg(long)]
    pub phase: Option<String>,
}

/// A proposal.
#[derive(Args, Debug)]
pub struct Target {
    /// Its name.
    pub name: String,
    /// Its namespace (default: the context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
}

/// A decision.
#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The proposal.
    #[command(flatten)]
    pub target: Target,
    /// Why (recorded in the decision).
    #[arg(long)]
    pub reason: Option<String>,
    /// Do not wait for Kortex to act on the decision.
    #[arg(long)]
    pub no_wait: bool,
}

/// Runs the plugin.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn client(context: Option<&str>) -> Result<Client, String> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match kube::Config::from_kubeconfig(&options).await {
        Ok(c) => c,
        Err(e) if context.is_none() => {
            kube::Config::incluster().map_err(|_| format!("no usable kubeconfig: {e}"))?
        }
        Err(e) => return Err(format!("kubeconfig: {e}")),
    };
    crate::operator::kube_client(config)
        .map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}

async fn run(cli: Cli) -> Result<(), String> {
    let client = client(cli.context.as_deref()).await?;
    let default_ns = client.default_namespace().to_owned();
    match cli.command {
        Command::List(args) => {
            let api: Api<ActionProposal> = if args.all_namespaces {
                Api::all(client)
            } else {
                Api::namespaced(client, args.namespace.as_deref().unwrap_or(&default_ns))
            };
            let mut items = api
                .list(&ListParams::default())
                .await
                .map_err(|e| describe(&e, "list actionproposals"))?
                .items;
            items.sort_by_key(|p| std::cmp::Reverse(p.creation_timestamp()));
            if let Some(phase) = &args.phase {
                items.retain(|p| phase_of(p).eq_ignore_ascii_case(phase));
            }
            print!("{}", table(&items, jiff::Timestamp::now()));
            Ok(())
        }
        Command::Approve(args) => decide(client, &default_ns, args, "Approve").await,
        Command::Reject(args) => decide(client, &default_ns, args, "Reject").await,
        Command::Undo(target) => {
            let namespace = target.namespace.as_deref().unwrap_or(&default_ns);
            let api: Api<ActionProposal> = Api::namespaced(client.clone(), namespace);
            let p = api
                .get(&target.name)
                .await
                .map_err(|e| describe(&e, "get the proposal"))?;
            let status = p.status.clone().unwrap_or_default();
            if status.phase != ProposalPhase::Succeeded || status.undo.is_none() {
                return Err(format!(
                    "{} is {} and has nothing to undo (only executed scale and rollback proposals can be undone; a restart cannot)",
                    target.name,
                    status.phase.as_str()
                ));
            }
            let (user, _) = whoami(&client).await?;
            let patch = json!({"metadata": {"annotations": {UNDO_REQUEST_ANNOTATION: user}}});
            api.patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| describe(&e, "request the undo"))?;
            println!(
                "asked Kortex for the inverse of {}; it appears as a new Pending proposal to approve (kubectl kortex list -n {namespace})",
                target.name
            );
            Ok(())
        }
    }
}

/// The current user as the API server knows them.
async fn whoami(client: &Client) -> Result<(String, Vec<String>), String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| describe(&e, "find out who you are (SelfSubjectReview)"))?;
    let info = review.status.and_then(|s| s.user_info).unwrap_or_default();
    let user = info
        .username
        .filter(|u| !u.is_empty())
        .ok_or("the API server did not say who you are")?;
    Ok((user, info.groups.unwrap_or_default()))
}

async fn decide(
    client: Client,
    default_ns: &str,
    args: DecideArgs,
    verdict: &str,
) -> Result<(), String> {
    let namespace = args.target.namespace.as_deref().unwrap_or(default_ns);
    let name = &args.target.name;
    let api: Api<ActionProposal> = Api::namespaced(client.clone(), namespace);
    let p = api
        .get(name)
        .await
        .map_err(|e| describe(&e, "get the proposal"))?;
    if let Some(d) = &p.spec.decision {
        return Err(format!(
            "{name} was already decided: {:?} by {}",
            d.verdict, d.by
        ));
    }
    let phase = phase_of(&p);
    if phase != "Pending" {
        return Err(format!("{name} is {phase} and can no longer be decided"));
    }
    let (user, groups) = whoami(&client).await?;
    let mut decision = json!({"verdict": verdict, "by": user});
    if !groups.is_empty() {
        decision["groups"] = json!(groups);
    }
    if let Some(r) = &args.reason {
        decision["reason"] = json!(r);
    }
    let patch = json!({"spec": {"decision": decision}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            describe(
                &e,
                &format!("{} the proposal", verdict.to_ascii_lowercase()),
            )
        })?;
    println!(
        "{name}: {} by {user}",
        if verdict == "Approve" {
            "approved"
        } else {
            "rejected"
        }
    );
    if args.no_wait {
        return Ok(());
    }
    // Show what Kortex made of it (execution takes a few seconds).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        if let Ok(p) = api.get(name).await {
            let phase = phase_of(&p);
            let message = p
                .status
                .as_ref()
                .and_then(|s| s.message.clone())
                .unwrap_or_default();
            let seen = format!("{phase}: {message}");
            if seen != last && phase != "Pending" {
                println!("{name}: {seen}");
                last = seen;
            }
            // A Git change is followed for as long as its review takes: once its request
            // is open, `kubectl kortex list` shows where it stands.
            if phase == "Executing" && p.status.as_ref().is_some_and(|s| s.git.is_some()) {
                return Ok(());
            }
            if !matches!(phase.as_str(), "Pending" | "Executing") {
                return if phase == "Failed" {
                    Err(format!("{name} failed"))
                } else {
                    Ok(())
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{name}: Kortex has not acted on the decision yet; check with kubectl kortex list -n {namespace}"
    );
    Ok(())
}

/// `live`, or `git` with the change request (or branch) and its state.
fn delivery(p: &ActionProposal) -> String {
    if p.spec.delivery != Some(crate::crd::Delivery::Git) {
        return "live".into();
    }
    match p.status.as_ref().and_then(|s| s.git.as_ref()) {
        Some(g) => format!(
            "git {} ({})",
            g.request_url.as_deref().unwrap_or(&g.branch),
            g.request_state
        ),
        None => "git (not pushed)".into(),
    }
}

fn phase_of(p: &ActionProposal) -> String {
    p.status
        .as_ref()
        .map_or("Pending", |s| s.phase.as_str())
        .to_owned()
}

/// The `list` table.
pub fn table(items: &[ActionProposal], now: jiff::Timestamp) -> String {
    let mut rows = vec![[
        "NAMESPACE".to_owned(),
        "NAME".to_owned(),
        "ACTION".to_owned(),
        "TARGET".to_owned(),
        "PHASE".to_owned(),
        "PROPOSED FOR".to_owned(),
        "DECIDED BY".to_owned(),
        "EXPIRES".to_owned(),
        "DELIVERY".to_owned(),
    ]];
    for p in items {
        let target = p
            .spec
            .target
            .as_ref()
            .map(|t| format!("{}/{}", t.kind, t.name))
            .unwrap_or_else(|| "-".into());
        let expires = p
            .status
            .as_ref()
            .and_then(|s| s.expires_at.as_ref())
            .filter(|_| phase_of(p) == "Pending")
            .map(|t| {
                let left = t.0.duration_since(now).as_secs();
                if left <= 0 {
                    "expired".to_owned()
                } else {
                    format!("in {}m{:02}s", left / 60, left % 60)
                }
            })
            .unwrap_or_else(|| "-".into());
        rows.push([
            p.namespace().unwrap_or_default(),
            p.name_any(),
            p.spec.action.clone(),
            target,
            phase_of(p),
            p.spec.session.user.clone(),
            p.spec
                .decision
                .as_ref()
                .map_or("-".into(), |d| d.by.clone()),
            expires,
            delivery(p),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    if items.is_empty() {
        return "No proposals found.\n".into();
    }
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

fn describe(e: &kube::Error, what: &str) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "you may not {what}: {} (approvers need the kortex-approver ClusterRole bound in that namespace)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 => format!("cannot {what}: {}", s.message),
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            format!("the cluster refused to {what}: {}", s.message)
        }
        kube::Error::Api(s) if s.code == 409 => {
            format!(
                "cannot {what}: it changed meanwhile ({}); look again",
                s.message
            )
        }
        other => format!("cannot {what}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_table_aligns_and_counts_down() {
        let now = jiff::Timestamp::now();
        let p: ActionProposal = serde_json::from_value(json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal",
            "metadata": {"name": "restart-api-x7k2p", "namespace": "shop"},
            "spec": {"action": "restart", "rationale": "r",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                "session": {"id": "s", "name": "incident-1", "user": "alice"}},
            "status": {"phase": "Pending", "expiresAt": (now + jiff::SignedDuration::from_secs(125)).to_string()}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let t = table(&[p], now);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with("NAMESPACE   NAME"), "{t}");
        assert!(
            lines[1].contains("restart-api-x7k2p") && lines[1].contains("Deployment/api"),
            "{t}"
        );
        assert!(
            lines[1].contains("alice")
                && lines[1].contains("in 2m05s")
                && lines[1].ends_with("live"),
            "{t}"
        );
        assert_eq!(table(&[], now), "No proposals found.\n");
        let git: ActionProposal = serde_json::from_value(json!({
            "apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal",
            "metadata": {"name": "scale-api-x7k2p", "namespace": "shop"},
            "spec": {"action": "scale", "rationale": "r", "delivery": "git",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
                "session": {"id": "s", "name": "incident-1", "user": "alice"}},
            "status": {"phase": "Executing", "git": {"repository": "https://git.example/fleet",
                "branch": "kortex/scale-api-x7k2p", "commit": "abc", "requestUrl": "https://git.example/fleet/pull/7",
                "requestNumber": 7, "requestState": "open"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let t = table(&[git], now);
        assert!(
            t.lines()
                .nth(1)
                .is_some_and(|l| l.ends_with("git https://git.example/fleet/pull/7 (open)")),
            "{t}"
        );
    }
}
