//! The `git` delivery of a proposal whose target Argo CD or Flux applies from Git
//! (`docs/gitops.md`): instead of patching the live object (which the GitOps tool would
//! revert), Kortex changes the one place in the declared repository that sets the field,
//! previews it as a unified diff against the base branch at a pinned commit, and — once a
//! human approved exactly that diff — commits it on `kortex/<proposal>`, pushes, opens the
//! pull/merge request and follows it until the GitOps tool has synced the merge and the
//! target shows the change.
//!
//! [`plan`] runs when the proposal is made (its result is pinned in `params.git`, which the
//! API server keeps immutable); [`deliver`] when it is approved; [`follow`] afterwards.

use super::executor::{Action, ExecError, Executor};
use crate::catalog::{PolicyEntry, RepositoryResolved};
use crate::gitops::forge::{ForgeClient, RequestState};
use crate::gitops::git::{Credentials, GitError, Remote, Repo, Signature};
use crate::gitops::owner::{self, ObjectRef, Owner, Source};
use crate::gitops::yaml::{self, Change, File, Layout, Target};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The key of the pinned change in a proposal's params.
pub const PARAM: &str = "git";
/// Files read from a source directory at most (the rest are not looked at).
const MAX_FILES: usize = 400;
/// A file larger than this is not read.
const MAX_FILE: usize = 1 << 20;

/// The Git change pinned in `params.git` when the proposal is made: what the preview
/// showed, to the byte.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pinned {
    /// The Application or Kustomization applying the target.
    pub owner: Option<ObjectRef>,
    /// The declared repository (its URL as declared).
    pub repository: String,
    /// The branch the change is proposed against.
    pub base_branch: String,
    /// The commit of the base branch the diff was made against.
    pub base_commit: String,
    /// The file changed.
    pub path: String,
    /// The field, in words (`spec.replicas of Deployment api in apps/api.yaml`).
    pub field: String,
    /// Its value before and after.
    pub old: String,
    /// See [`Pinned::old`].
    pub new: String,
    /// The unified diff approved.
    pub diff: String,
    /// A rollback done as `git revert` of this commit (policy `gitops.revert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<String>,
    /// The commit that introduced the value being rolled back, and its subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introduced_by: Option<Value>,
    /// What the target shows once the GitOps tool applied it (`{"replicas": 5}` or
    /// `{"container": "api", "image": "…"}`).
    pub expect: Value,
}

/// What a proposal for a target becomes.
#[derive(Debug)]
pub enum Plan {
    /// Not applied from Git (or a verb that stays live): the live executor's way.
    Live,
    /// A Git change, pinned, with its preview.
    Git(Box<Pinned>, Value),
    /// GitOps-owned, but no single change can be made: the preview carries the evidence
    /// and why; approving it changes nothing.
    Evidence(Value),
}

/// The owner of the action's target, read with Kortex's client.
pub async fn owner_of(executor: &Executor, action: &Action, policy: &PolicyEntry) -> Owner {
    let Ok(object) = executor.current(action).await else {
        return Owner {
            tool: "none",
            ..Owner::default()
        };
    };
    let argo_ns = policy
        .object
        .spec
        .gitops
        .as_ref()
        .and_then(|g| g.argo_cd_namespace.as_deref())
        .unwrap_or(owner::ARGO_NAMESPACE);
    owner::find(executor.client(), &object, argo_ns).await
}

/// What the proposal of `action` (its live pins already set) becomes under `policy`: a
/// scale or rollback of a target Argo CD or Flux applies is a Git change when the
/// repository is declared and the field found; a restart stays live (a `restartedAt`
/// annotation Git does not set is not reverted: `docs/gitops.md`).
pub async fn plan(executor: &Executor, action: &Action, policy: &PolicyEntry) -> Plan {
    if !matches!(action.verb.as_str(), "scale" | "rollback") {
        return Plan::Live;
    }
    let owner = owner_of(executor, action, policy).await;
    if !owner.is_gitops() {
        return Plan::Live;
    }
    let evidence = |why: String| Plan::Evidence(evidence_preview(&owner, &why));
    let Some(object) = owner.object.as_ref() else {
        return evidence("its GitOps owner could not be read".into());
    };
    if let Some(problem) = owner.problems.first()
        && owner.sources.is_empty()
    {
        return evidence(problem.clone());
    }
    let declared: Vec<(&Source, &RepositoryResolved)> = owner
        .sources
        .iter()
        .filter_map(|s| Some((s, crate::gitops::declared(&policy.gitops, &s.repo_url)?)))
        .collect();
    let Some((source, repository)) = declared.first().copied() else {
        let urls: Vec<&str> = owner.sources.iter().map(|s| s.repo_url.as_str()).collect();
        return evidence(format!(
            "{object} applies it from {}, which this policy does not declare in spec.gitops.repositories: Kortex writes only to declared repositories",
            if urls.is_empty() {
                "no Git source Kortex could read".to_owned()
            } else {
                urls.join(", ")
            }
        ));
    };
    if source.inline_values {
        return evidence(format!(
            "{object} sets Helm values itself (spec.source.helm values, valuesObject or parameters), which override the value files in {}: change them in the Application's own manifest",
            source.repo_url
        ));
    }
    if let Some(elsewhere) = source.values_elsewhere.first() {
        return evidence(format!(
            "its Helm values come from another repository too ({elsewhere}): Kortex changes one repository at a time, and the value there may be the one that counts"
        ));
    }
    let change = match change_of(executor, action).await {
        Ok(c) => c,
        Err(why) => return evidence(why),
    };
    match pin_change(action, policy, &owner, source, repository, &change).await {
        Ok(pinned) => {
            let preview = git_preview(&owner, &pinned);
            Plan::Git(Box::new(pinned), preview)
        }
        Err(why) => evidence(why),
    }
}

/// The change in the target's terms: replicas, or the one image a rollback changes.
async fn change_of(executor: &Executor, action: &Action) -> Result<(Change, Value), String> {
    match action.verb.as_str() {
        "scale" => {
            let n = action.params["replicas"].as_i64().unwrap_or_default();
            Ok((Change::Replicas(n), json!({"replicas": n})))
        }
        _ => {
            let images = executor
                .rollback_images(action)
                .await
                .map_err(|e| e.to_string())?;
            match images.as_slice() {
                [(container, from, to)] => Ok((
                    Change::Image {
                        from: from.clone(),
                        to: to.clone(),
                    },
                    json!({"container": container, "image": to}),
                )),
                [] => Err("the revision rolled back to runs the same images: the difference is not an image, so no one-line Git change undoes it".into()),
                many => Err(format!(
                    "the rollback changes {} images ({}): a Git change of one line cannot carry it",
                    many.len(),
                    many.iter().map(|(c, f, t)| format!("{c}: {f} → {t}")).collect::<Vec<_>>().join(", ")
                )),
            }
        }
    }
}

/// Where the source's files are laid out, from what the owner says and what is there.
fn layout_of(source: &Source, files: &[File]) -> Layout {
    let dir = source.path.clone();
    if let Some(release) = &source.helm_release {
        return Layout::HelmRelease {
            dir,
            release: release.clone(),
        };
    }
    if source.helm {
        let value_files = if source.value_files.is_empty() {
            vec![owner::clean(&format!("{dir}/values.yaml"))]
        } else {
            source.value_files.clone()
        };
        return Layout::HelmValues { dir, value_files };
    }
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let kustomize = source.kustomize
        || files.iter().any(|f| {
            f.path.strip_prefix(&prefix).is_some_and(|name| {
                matches!(
                    name,
                    "kustomization.yaml" | "kustomization.yml" | "Kustomization"
                )
            })
        });
    if kustomize {
        Layout::Kustomize { dir }
    } else {
        Layout::Plain { dir }
    }
}

/// The remote of a declared repository, with its credentials.
pub fn remote(repository: &RepositoryResolved) -> Remote {
    let url = repository.spec.url.clone();
    let ssh = url.starts_with("ssh://") || (!url.contains("://") && url.contains('@'));
    let credentials = match (&repository.secret, ssh) {
        (Some(key), true) => Credentials::SshKey {
            private_key: key.clone(),
            known_hosts: repository.spec.known_hosts.clone().unwrap_or_default(),
        },
        (Some(token), false) => Credentials::Token {
            username: None,
            token: token.clone(),
        },
        (None, _) => Credentials::None,
    };
    Remote {
        url,
        credentials,
        allow_private: repository.spec.allow_private_targets,
    }
}

/// The branch changes are proposed against: declared, else the owner's revision when it
/// names a branch, else `main`.
fn base_branch(repository: &RepositoryResolved, source: &Source) -> String {
    if let Some(b) = &repository.spec.base_branch {
        return b.clone();
    }
    match source.revision.as_deref() {
        Some(r) if names_a_branch(r) => r.to_owned(),
        _ => "main".into(),
    }
}

/// Whether a revision (`targetRevision`, a GitRepository's ref) can be a branch: not
/// empty, not `HEAD`, not a commit id, not a version tag (`v1.2`) or constraint (`~1.2`).
fn names_a_branch(r: &str) -> bool {
    let commit = r.len() >= 7 && r.chars().all(|c| c.is_ascii_hexdigit());
    let version = r.starts_with('v') && r[1..].starts_with(|c: char| c.is_ascii_digit());
    let constraint = r.contains(['*', '^', '~', '>', '<', ' ']);
    !(r.is_empty() || r == "HEAD" || commit || version || constraint)
}

/// Refuses a path that leaves the repository or the declared prefix.
fn check_path(path: &str, prefix: Option<&str>) -> Result<(), String> {
    if path.split('/').any(|s| s == ".." || s == ".")
        || path.starts_with('/')
        || path.contains('\\')
    {
        return Err(format!("{path} leaves the repository: refused"));
    }
    if let Some(prefix) = prefix.map(owner::clean).filter(|p| !p.is_empty())
        && !(path == prefix || path.starts_with(&format!("{prefix}/")))
    {
        return Err(format!(
            "{path} is outside the repository's declared pathPrefix {prefix}: Kortex does not change it"
        ));
    }
    Ok(())
}

/// Refuses a diff that touches anything but regular files inside the repository and the
/// declared prefix (a revert is a whole commit: it could carry a symlink, a submodule, a
/// binary or a file elsewhere).
fn check_diff(diff: &str, prefix: Option<&str>) -> Result<(), String> {
    for line in diff.lines() {
        if let Some(paths) = line.strip_prefix("diff --git ") {
            for p in paths.split(' ') {
                let path = p
                    .strip_prefix("a/")
                    .or_else(|| p.strip_prefix("b/"))
                    .unwrap_or(p);
                check_path(path, prefix)?;
            }
        } else if line.starts_with("Binary files ")
            || (line.contains(" mode ") && (line.ends_with("120000") || line.ends_with("160000")))
            || line.starts_with("rename ")
            || line.starts_with("copy ")
        {
            return Err(format!(
                "the change touches more than regular files ({line}): Kortex does not make it"
            ));
        }
    }
    Ok(())
}

/// Reads the source, finds the field, makes the change and pins it.
async fn pin_change(
    action: &Action,
    policy: &PolicyEntry,
    owner: &Owner,
    source: &Source,
    repository: &RepositoryResolved,
    change: &(Change, Value),
) -> Result<Pinned, String> {
    check_path(&source.path, None)?;
    let base = base_branch(repository, source);
    let repo = Repo::clone(&remote(repository), &base, &crate::egress::current())
        .await
        .map_err(|e| format!("cannot read {} (branch {base}): {e}", repository.spec.url))?;
    let head = repo.head().to_owned();
    let files = read_files(&repo, &head, source).await?;
    let layout = layout_of(source, &files);
    let target = Target {
        kind: action.target.kind.clone(),
        name: action.target.name.clone(),
        namespace: action.target.namespace.clone(),
        container: change.1["container"].as_str().map(str::to_owned),
    };
    let values_path = action.params["valuesPath"].as_str();
    let edit = yaml::locate(&layout, &files, &target, &change.0, values_path)
        .map_err(|e| e.to_string())?;
    check_path(&edit.path, repository.spec.path_prefix.as_deref())?;
    let introduced_by = match &change.0 {
        Change::Image { from, .. } => repo
            .introduced(&head, &edit.path, &edit.old)
            .await
            .ok()
            .flatten()
            .map(|(commit, subject)| json!({"commit": commit, "subject": subject, "image": from})),
        Change::Replicas(_) => None,
    };
    let revert_wanted =
        action.verb == "rollback" && policy.object.spec.gitops.as_ref().is_some_and(|g| g.revert);
    let revert = introduced_by
        .as_ref()
        .filter(|_| revert_wanted)
        .and_then(|i| i["commit"].as_str().map(str::to_owned));
    let diff = match &revert {
        Some(commit) => {
            let sig = kortex_signature();
            let reverted = repo
                .revert(&head, commit, "preview", &sig, &sig)
                .await
                .map_err(|e| format!("reverting {commit} does not apply cleanly: {e}"))?;
            let diff = repo
                .diff(&head, &reverted)
                .await
                .map_err(|e| e.to_string())?;
            check_diff(&diff, repository.spec.path_prefix.as_deref())
                .map_err(|why| format!("reverting {commit}: {why}"))?;
            diff
        }
        None => yaml::unified_diff(&edit.path, &edit.before, &edit.after),
    };
    Ok(Pinned {
        owner: owner.object.clone(),
        repository: repository.spec.url.clone(),
        base_branch: base,
        base_commit: head,
        path: edit.path,
        field: edit.field,
        old: edit.old,
        new: edit.new,
        diff,
        revert,
        introduced_by,
        expect: change.1.clone(),
    })
}

/// The YAML files of the source (and, for Helm, its value files), at `commit`.
async fn read_files(repo: &Repo, commit: &str, source: &Source) -> Result<Vec<File>, String> {
    let entries = repo
        .files(commit, &source.path)
        .await
        .map_err(|e| format!("cannot list {}: {e}", display_dir(&source.path)))?;
    let mut wanted: Vec<String> = entries
        .iter()
        .filter(|e| e.mode != "120000" && e.mode != "160000")
        .map(|e| e.path.clone())
        .filter(|p| {
            p.ends_with(".yaml")
                || p.ends_with(".yml")
                || p.ends_with("/Kustomization")
                || p == "Kustomization"
        })
        .take(MAX_FILES)
        .collect();
    for f in &source.value_files {
        if !wanted.contains(f) {
            check_path(f, None)?;
            wanted.push(f.clone());
        }
    }
    let mut files = Vec::new();
    for path in wanted {
        match repo.read(commit, &path, MAX_FILE).await {
            Ok(text) => files.push(File { path, text }),
            // A value file that is not there, a symlink, a file too large: not a place
            // Kortex changes; the locator says what it found without it.
            Err(e) => tracing::debug!(%path, error = %e, "a file of the source was not read"),
        }
    }
    Ok(files)
}

fn display_dir(dir: &str) -> String {
    if dir.is_empty() {
        "the repository root".into()
    } else {
        dir.to_owned()
    }
}

/// The author and committer of Kortex's commits.
fn kortex_signature() -> Signature {
    Signature {
        name: "Kortex".into(),
        email: "kortex@users.noreply.kortex.dev".into(),
    }
}

/// The preview of a Git change: the diff, where it goes and who applies it.
fn git_preview(owner: &Owner, pinned: &Pinned) -> Value {
    let mut warnings = Vec::new();
    if let Some(hpa) = &owner.hpa
        && pinned.expect.get("replicas").is_some()
    {
        warnings.push(format!(
            "HorizontalPodAutoscaler {} owns the replicas ({}..{}): the Git value is overridden at once",
            hpa["name"].as_str().unwrap_or_default(),
            hpa["min"],
            hpa["max"]
        ));
    }
    if !owner.automated {
        warnings
            .push("the owner does not sync on its own: once merged, someone must sync it".into());
    }
    json!({
        "delivery": "git",
        "owner": owner.object,
        "tool": owner.tool,
        "repository": pinned.repository,
        "baseBranch": pinned.base_branch,
        "baseCommit": pinned.base_commit,
        "path": pinned.path,
        "field": pinned.field,
        "before": pinned.old,
        "after": pinned.new,
        "diff": pinned.diff,
        "revert": pinned.revert,
        "introducedBy": pinned.introduced_by,
        "warnings": warnings,
    })
}

/// The preview of a GitOps-owned target Kortex cannot change in Git: the owner and why.
fn evidence_preview(owner: &Owner, why: &str) -> Value {
    json!({
        "delivery": "git",
        "owner": owner.object,
        "tool": owner.tool,
        "sources": owner.sources,
        "syncStatus": owner.sync_status,
        "syncedRevision": owner.synced_revision,
        "error": format!("no Git change: {why}"),
        "warnings": [format!("{} applies this object from Git: a live change would be reverted{}", if owner.tool == "argocd" { "Argo CD" } else { "Flux" }, if owner.self_heal { " by self-heal" } else { " at its next sync" })],
    })
}

/// The pinned change of a proposal's params, if it has one (an evidence-only proposal
/// has `params.git.error`).
pub fn pinned(params: &Value) -> Result<Option<Pinned>, String> {
    let Some(git) = params.get(PARAM) else {
        return Ok(None);
    };
    if let Some(why) = git["error"].as_str() {
        return Err(why.to_owned());
    }
    serde_json::from_value(git.clone())
        .map(Some)
        .map_err(|e| format!("params.git is not a change Kortex made: {e}"))
}

/// Why a Git delivery failed; its message goes to the proposal's status.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    /// The base branch or file changed since the proposal (nothing was pushed).
    #[error("not executed: {0}")]
    Moved(String),
    /// The change could not be made or pushed, or the request not opened.
    #[error("{0}")]
    Failed(String),
}

/// What was pushed and opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// `kortex/<proposal>`.
    pub branch: String,
    /// The commit on it.
    pub commit: String,
    /// The request's number and web address (none with `forge: none`).
    pub request: Option<(u64, String)>,
}

/// Who approved, and what the commit message says about the proposal.
pub struct Approval<'a> {
    /// The proposal's name (the branch is named after it).
    pub proposal: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// The approver's user name.
    pub approver: &'a str,
    /// The action in words (`scale Deployment shop/api to 5 replicas`).
    pub summary: String,
    /// The model's rationale (the evidence).
    pub rationale: &'a str,
    /// The session it came from.
    pub session: &'a str,
}

/// Carries an approved Git change out: the base branch must still hold the pinned commit
/// and the file as it was; the commit (parent: the pinned base) must make exactly the
/// approved diff; then it is pushed to `kortex/<proposal>` and the request opened.
pub async fn deliver(
    pinned: &Pinned,
    repository: &RepositoryResolved,
    approval: &Approval<'_>,
) -> Result<Delivered, DeliverError> {
    let failed = |what: &str, e: GitError| DeliverError::Failed(format!("{what}: {e}"));
    let prefix = repository.spec.path_prefix.as_deref();
    // The policy as it is now: a prefix narrowed since the proposal applies.
    check_path(&pinned.path, prefix).map_err(DeliverError::Failed)?;
    // A forge that cannot be reached as declared fails the delivery before anything is
    // pushed.
    let forge = forge_of(repository)?;
    let repo = Repo::clone(
        &remote(repository),
        &pinned.base_branch,
        &crate::egress::current(),
    )
    .await
    .map_err(|e| failed(&format!("cannot read {}", pinned.repository), e))?;
    let head = repo.head().to_owned();
    if head != pinned.base_commit {
        let kept = repo
            .is_ancestor(&pinned.base_commit, &head)
            .await
            .unwrap_or(false);
        if !kept {
            return Err(DeliverError::Moved(format!(
                "branch {} no longer contains commit {} the change was previewed against (it was rewritten); propose it again",
                pinned.base_branch,
                short(&pinned.base_commit)
            )));
        }
        let then = repo.read(&pinned.base_commit, &pinned.path, MAX_FILE).await;
        let now = repo.read(&head, &pinned.path, MAX_FILE).await;
        if then.as_ref().ok() != now.as_ref().ok() || now.is_err() {
            return Err(DeliverError::Moved(format!(
                "{} changed on {} since the proposal was made (commit {} → {}): what was approved is not what it would do now; propose it again",
                pinned.path,
                pinned.base_branch,
                short(&pinned.base_commit),
                short(&head)
            )));
        }
    }
    let message = commit_message(pinned, approval);
    let author = kortex_signature();
    let commit = match &pinned.revert {
        Some(reverted) => repo
            .revert(&pinned.base_commit, reverted, &message, &author, &author)
            .await
            .map_err(|e| failed("cannot make the revert commit", e))?,
        None => {
            let text = repo
                .read(&pinned.base_commit, &pinned.path, MAX_FILE)
                .await
                .map_err(|e| failed(&format!("cannot read {}", pinned.path), e))?;
            let after = apply_diff_line(&text, pinned)?;
            repo.commit_file(
                &pinned.base_commit,
                &pinned.path,
                &after,
                &message,
                &author,
                &author,
            )
            .await
            .map_err(|e| failed("cannot make the commit", e))?
        }
    };
    let made = repo
        .diff(&pinned.base_commit, &commit)
        .await
        .map_err(|e| failed("cannot read back the commit", e))?;
    if comparable(&made) != comparable(&pinned.diff) {
        return Err(DeliverError::Failed(
            "the commit would differ from the approved diff: nothing was pushed".into(),
        ));
    }
    check_diff(&made, prefix).map_err(DeliverError::Failed)?;
    let branch = format!("kortex/{}", approval.proposal);
    repo.push_new_branch(&commit, &branch)
        .await
        .map_err(|e| failed(&format!("cannot push {branch}"), e))?;
    let request = match forge {
        Some(forge) => {
            let title = format!("kortex: {}", approval.summary);
            let r = forge
                .open(
                    &branch,
                    &pinned.base_branch,
                    &title,
                    &request_body(pinned, approval),
                )
                .await
                .map_err(|e| {
                    DeliverError::Failed(format!(
                        "pushed {branch}, but the request could not be opened: {e}"
                    ))
                })?;
            // An open request found for the branch must carry Kortex's commit.
            let view = forge.view(r.number).await.map_err(|e| {
                DeliverError::Failed(format!("opened {}, but cannot read it back: {e}", r.url))
            })?;
            if view.head.as_deref().is_some_and(|h| h != commit) {
                return Err(DeliverError::Failed(format!(
                    "the request {} for {branch} carries commit {}, not Kortex's {}: not followed",
                    r.url,
                    view.head.as_deref().map(short).unwrap_or_default(),
                    short(&commit)
                )));
            }
            Some((r.number, r.url))
        }
        None => None,
    };
    Ok(Delivered {
        branch,
        commit,
        request,
    })
}

/// The file with the approved line changed: the one `-` line of the approved diff, at the
/// line its hunk names, replaced by its `+` line (checked against the approved diff again
/// once committed).
fn apply_diff_line(text: &str, pinned: &Pinned) -> Result<String, DeliverError> {
    let not_one = || DeliverError::Failed("the approved diff is not a one-line change".into());
    let mut lines = pinned.diff.lines().skip_while(|l| !l.starts_with("@@ -"));
    let header = lines.next().ok_or_else(not_one)?;
    let start: usize = header
        .trim_start_matches("@@ -")
        .split([',', ' '])
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(not_one)?;
    let (mut at, mut old, mut new) = (start, None, None);
    for l in lines {
        match l.as_bytes().first() {
            Some(b'-') if old.is_none() => old = Some(&l[1..]),
            Some(b'+') if new.is_none() => new = Some(&l[1..]),
            Some(b'-' | b'+' | b'@') => return Err(not_one()),
            _ if old.is_none() => at += 1,
            _ => {}
        }
    }
    let (Some(old), Some(new)) = (old, new) else {
        return Err(not_one());
    };
    let mut out = String::with_capacity(text.len() + 16);
    let mut changed = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let body = line.trim_end_matches(['\n', '\r']);
        if i + 1 == at && body == old {
            out.push_str(new);
            out.push_str(&line[body.len()..]);
            changed = true;
        } else {
            out.push_str(line);
        }
    }
    if changed {
        Ok(out)
    } else {
        Err(DeliverError::Moved(format!(
            "line {at} of {} is not the approved one any more; propose it again",
            pinned.path
        )))
    }
}

fn forge_of(repository: &RepositoryResolved) -> Result<Option<ForgeClient>, DeliverError> {
    ForgeClient::new(
        repository.spec.forge,
        &repository.spec.url,
        repository.spec.api_url.as_deref(),
        repository.secret.clone(),
        repository.spec.allow_private_targets,
        &crate::egress::current(),
    )
    .map_err(|e| DeliverError::Failed(format!("cannot reach the forge: {e}")))
}

/// `Co-authored-by` needs an address: a user name that is one is used as it is, any other
/// gets a reserved, undeliverable domain.
fn co_author(user: &str) -> String {
    let name: String = user
        .chars()
        .filter(|c| !matches!(c, '<' | '>') && !c.is_control())
        .collect();
    if name.contains('@') {
        format!("{name} <{name}>")
    } else {
        format!(
            "{name} <{}@users.kortex.invalid>",
            name.replace([' ', ':'], "-")
        )
    }
}

fn commit_message(pinned: &Pinned, a: &Approval<'_>) -> String {
    let rationale: String = a.rationale.chars().take(2000).collect();
    // A name cannot add a line (a trailer) of its own.
    let approver: String = a.approver.chars().filter(|c| !c.is_control()).collect();
    format!(
        "kortex: {}\n\n{}: {} → {}\n\nEvidence (the model's rationale):\n{rationale}\n\nProposal: ActionProposal {}/{}\nSession: {}\nApproved-by: {}\n\nCo-authored-by: {}\n",
        a.summary,
        pinned.field,
        pinned.old,
        pinned.new,
        a.namespace,
        a.proposal,
        a.session,
        approver,
        co_author(&approver)
    )
}

fn request_body(pinned: &Pinned, a: &Approval<'_>) -> String {
    let rationale: String = a.rationale.chars().take(4000).collect();
    format!(
        "Opened by Kortex for an approved proposal.\n\n- **Change:** {} (`{}` → `{}`)\n- **Proposal:** `ActionProposal {}/{}` (approved by {})\n- **Session:** {}\n{}\n### Evidence\n\n{rationale}\n",
        pinned.field,
        pinned.old,
        pinned.new,
        a.namespace,
        a.proposal,
        a.approver,
        a.session,
        pinned
            .introduced_by
            .as_ref()
            .map(|i| format!(
                "- **Introduced by:** {} {}\n",
                i["commit"].as_str().map(short).unwrap_or_default(),
                i["subject"].as_str().unwrap_or_default()
            ))
            .unwrap_or_default()
    )
}

/// A diff as compared: git's `index <blob>..<blob>` line (which the preview leaves out)
/// dropped, trailing space ignored.
fn comparable(diff: &str) -> String {
    diff.lines()
        .filter(|l| !l.starts_with("index "))
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_owned()
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// How a request changed after approval is reported (and recognised).
const CHANGED: &str = "the request was changed after approval";

/// Where a followed change stands now.
#[derive(Clone, Debug, PartialEq)]
pub enum Followed {
    /// Still waiting: the new `status.git` and the condition reason
    /// (`AwaitingMerge`, `AwaitingSync`) with its message.
    Waiting(crate::crd::GitChangeStatus, &'static str, String),
    /// The cluster runs the change.
    Succeeded(crate::crd::GitChangeStatus, String),
    /// It will not happen (closed unmerged, the sync failed).
    Failed(crate::crd::GitChangeStatus, String),
}

/// Looks once at a delivered change: the request's state, then whether the owner synced a
/// revision holding the merge and the target shows the change.
pub async fn follow(
    executor: &Executor,
    action: &Action,
    policy: &PolicyEntry,
    pinned: &Pinned,
    status: &crate::crd::GitChangeStatus,
) -> Result<Followed, String> {
    let mut status = status.clone();
    let repository =
        crate::gitops::declared(&policy.gitops, &pinned.repository).ok_or_else(|| {
            format!(
                "{} is no longer declared in the policy's spec.gitops.repositories",
                pinned.repository
            )
        })?;
    if status.request_state == "open" || status.request_state == "pushed" {
        let state = match merged(repository, pinned, &status).await {
            Ok(state) => state,
            Err(why) if why.starts_with(CHANGED) => {
                status.request_state = "changed".into();
                return Ok(Followed::Failed(
                    status,
                    format!("{why}: Kortex does not follow a change nobody approved here"),
                ));
            }
            Err(why) => return Err(why),
        };
        match state {
            RequestState::Open => {
                let what = status
                    .request_url
                    .clone()
                    .unwrap_or_else(|| format!("branch {}", status.branch));
                return Ok(Followed::Waiting(
                    status,
                    crate::crd::conditions::reasons::AWAITING_MERGE,
                    format!("waiting for {what} to be merged"),
                ));
            }
            RequestState::Closed => {
                status.request_state = "closed".into();
                let what = status
                    .request_url
                    .clone()
                    .unwrap_or_else(|| status.branch.clone());
                return Ok(Followed::Failed(
                    status,
                    format!("{what} was closed without being merged: nothing changed"),
                ));
            }
            RequestState::Merged { commit } => {
                status.request_state = "merged".into();
                status.merge_commit = commit.or_else(|| Some(status.commit.clone()));
            }
        }
    }
    // The owner that was approved (`update` on it was reviewed), not whatever the target's
    // labels say now.
    let owner = match &pinned.owner {
        Some(o) => owner::read(executor.client(), o).await?,
        None => owner_of(executor, action, policy).await,
    };
    status.synced_revision = owner.synced_revision.clone();
    let merge = status
        .merge_commit
        .clone()
        .unwrap_or_else(|| status.commit.clone());
    // Only a failed sync of a revision holding the change fails it (an older failure, or
    // one of a source fetch, is not this change's).
    if let (Some(failure), Some(failed)) = (&owner.sync_failure, owner.failed_revision.as_deref()) {
        let failed = owner::commit_of(failed);
        if failed == merge
            || failed == status.commit
            || contains(repository, pinned, failed, &merge).await
        {
            return Ok(Followed::Failed(
                status,
                format!(
                    "merged, but the sync of {} failed: {failure}",
                    short(failed)
                ),
            ));
        }
    }
    let synced = match owner.synced_commit() {
        Some(s) if s == merge || s == status.commit => true,
        Some(s) => contains(repository, pinned, s, &merge).await,
        None => false,
    };
    let object = executor.current(action).await.map_err(|e| e.to_string())?;
    let shows = shows_change(&object, &pinned.expect);
    let owner_name = owner
        .object
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    if synced && shows {
        let message = format!(
            "merged ({}) and synced by {owner_name}; {} now shows {}",
            short(&merge),
            action.target,
            describe_expect(&pinned.expect)
        );
        return Ok(Followed::Succeeded(status, message));
    }
    let message = if synced {
        format!(
            "{owner_name} synced {}; waiting for {} to show {}",
            short(&merge),
            action.target,
            describe_expect(&pinned.expect)
        )
    } else {
        format!(
            "merged ({}); waiting for {owner_name} to sync it (synced now: {})",
            short(&merge),
            owner.synced_revision.as_deref().unwrap_or("nothing yet")
        )
    };
    Ok(Followed::Waiting(
        status,
        crate::crd::conditions::reasons::AWAITING_SYNC,
        message,
    ))
}

/// The request's state: the forge's answer, or (no forge) whether the base branch holds
/// the pushed commit.
async fn merged(
    repository: &RepositoryResolved,
    pinned: &Pinned,
    status: &crate::crd::GitChangeStatus,
) -> Result<RequestState, String> {
    match (
        forge_of(repository).map_err(|e| e.to_string())?,
        status.request_number,
    ) {
        (Some(forge), Some(n)) => {
            let view = forge
                .view(n)
                .await
                .map_err(|e| format!("cannot read the request's state: {e}"))?;
            // What is merged must be what was approved: the branch as Kortex pushed it,
            // into the base it was previewed against.
            let changed = view.head.as_deref().is_some_and(|h| h != status.commit)
                || view
                    .base
                    .as_deref()
                    .is_some_and(|b| b != pinned.base_branch);
            if changed && view.state != RequestState::Closed {
                return Err(format!(
                    "{CHANGED}: its branch is at {}, into {} (approved: {} into {})",
                    view.head.as_deref().map(short).unwrap_or("?"),
                    view.base.as_deref().unwrap_or("?"),
                    short(&status.commit),
                    pinned.base_branch
                ));
            }
            Ok(view.state)
        }
        _ => {
            let repo = Repo::clone(
                &remote(repository),
                &pinned.base_branch,
                &crate::egress::current(),
            )
            .await
            .map_err(|e| format!("cannot read {}: {e}", pinned.repository))?;
            let head = repo.head().to_owned();
            Ok(
                if repo
                    .is_ancestor(&status.commit, &head)
                    .await
                    .unwrap_or(false)
                {
                    RequestState::Merged { commit: Some(head) }
                } else {
                    RequestState::Open
                },
            )
        }
    }
}

/// Whether `synced` (a commit the owner applied) contains `merge`.
async fn contains(
    repository: &RepositoryResolved,
    pinned: &Pinned,
    synced: &str,
    merge: &str,
) -> bool {
    let Ok(repo) = Repo::clone(
        &remote(repository),
        &pinned.base_branch,
        &crate::egress::current(),
    )
    .await
    else {
        return false;
    };
    repo.is_ancestor(merge, synced).await.unwrap_or(false)
}

/// Whether the live object shows what the change sets.
pub fn shows_change(object: &Value, expect: &Value) -> bool {
    if let Some(n) = expect.get("replicas") {
        return object["spec"]["replicas"] == *n;
    }
    let (Some(container), Some(image)) = (expect["container"].as_str(), expect["image"].as_str())
    else {
        return false;
    };
    object["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == container && c["image"] == image)
}

fn describe_expect(expect: &Value) -> String {
    match expect.get("replicas") {
        Some(n) => format!("{n} replicas"),
        None => format!(
            "image {} in container {}",
            expect["image"].as_str().unwrap_or_default(),
            expect["container"].as_str().unwrap_or_default()
        ),
    }
}

/// The summary of an action for titles and messages.
pub fn summary(action: &Action) -> String {
    match action.verb.as_str() {
        "scale" => format!(
            "scale {} to {} replicas",
            action.target, action.params["replicas"]
        ),
        verb => format!("{verb} {}", action.target),
    }
}

impl From<DeliverError> for ExecError {
    fn from(e: DeliverError) -> Self {
        match e {
            DeliverError::Moved(m) => ExecError::Moved(m),
            DeliverError::Failed(m) => ExecError::Target(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned_with(diff: &str) -> Pinned {
        Pinned {
            path: "apps/api.yaml".into(),
            diff: diff.into(),
            ..Pinned::default()
        }
    }

    #[test]
    fn the_approved_line_is_the_one_changed() {
        let text = "a: 1\nspec:\n  replicas: 2 # keep\nb: 3\n";
        let diff = "diff --git a/apps/api.yaml b/apps/api.yaml\n--- a/apps/api.yaml\n+++ b/apps/api.yaml\n@@ -2,3 +2,3 @@\n spec:\n-  replicas: 2 # keep\n+  replicas: 5 # keep\n b: 3\n";
        let after = apply_diff_line(text, &pinned_with(diff)).unwrap();
        assert_eq!(after, "a: 1\nspec:\n  replicas: 5 # keep\nb: 3\n");
        let twice = "x:\nspec:\n  replicas: 2 # keep\ny:\n  replicas: 2 # keep\n";
        let after = apply_diff_line(twice, &pinned_with(diff)).unwrap();
        assert_eq!(
            after,
            "x:\nspec:\n  replicas: 5 # keep\ny:\n  replicas: 2 # keep\n"
        );
        let moved = "a: 1\nspec:\n  replicas: 3 # keep\nb: 3\n";
        assert!(apply_diff_line(moved, &pinned_with(diff)).is_err());
    }

    #[test]
    fn paths_stay_in_the_repository_and_prefix() {
        assert!(check_path("apps/api.yaml", None).is_ok());
        assert!(check_path("apps/../../etc/passwd", None).is_err());
        assert!(check_path("/etc/passwd", None).is_err());
        assert!(check_path("apps/api.yaml", Some("clusters/prod")).is_err());
        assert!(check_path("clusters/prod/api.yaml", Some("./clusters/prod/")).is_ok());
        assert!(check_path("clusters/production/api.yaml", Some("clusters/prod")).is_err());
    }

    #[test]
    fn only_branch_like_revisions_are_bases() {
        for r in ["main", "release/2.x", "prod"] {
            assert!(names_a_branch(r), "{r}");
        }
        for r in ["", "HEAD", "3f1c2ab", "v1.4.2", "~1.2", "1.x *"] {
            assert!(!names_a_branch(r), "{r}");
        }
    }

    #[test]
    fn co_authors_have_an_address() {
        assert_eq!(
            co_author("alice@example.com"),
            "alice@example.com <alice@example.com>"
        );
        assert_eq!(
            co_author("system:serviceaccount:ops:bot"),
            "system:serviceaccount:ops:bot <system-serviceaccount-ops-bot@users.kortex.invalid>"
        );
    }

    #[test]
    fn the_target_shows_the_change() {
        let o = json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "api", "image": "r/api:1"}]}}}});
        assert!(shows_change(&o, &json!({"replicas": 5})));
        assert!(!shows_change(&o, &json!({"replicas": 4})));
        assert!(shows_change(
            &o,
            &json!({"container": "api", "image": "r/api:1"})
        ));
        assert!(!shows_change(
            &o,
            &json!({"container": "api", "image": "r/api:2"})
        ));
    }
}
