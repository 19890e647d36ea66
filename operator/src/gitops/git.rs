//! One repository a GitOps change is written to: Debian's `git` run on a **bare** clone in
//! a private temporary directory. There is never a work tree, so no file of the repository
//! is written to disk and no symbolic link in it can be followed; files are read from and
//! written to trees and blobs (`ls-tree`, `cat-file`, a temporary index, `commit-tree`).
//!
//! Every network command is checked by the egress guard first ([`Egress::check_url`], and
//! a host name's addresses once resolved; for HTTPS the checked addresses are pinned with
//! `http.curloptResolve`, for SSH with `-o HostName` and a `HostKeyAlias`). `git` runs with
//! an emptied environment, no system or global configuration, no prompts, no credential
//! helpers, no hooks, only the remote's protocol allowed and redirects never followed. A
//! token travels only in the environment (`GIT_CONFIG_*`, an `Authorization` header),
//! never on a command line or in a URL; an SSH key only in a `0600` file of the private
//! directory, with host keys checked against the given `known_hosts` and nothing else.
//! What `git` says on stderr is scrubbed of the token before it reaches an error.
//!
//! Imports only `catalog` (secret values) and `egress`.

use crate::catalog::SecretValue;
use crate::egress::Egress;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How long a command that talks to the remote may take.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a command on the local clone may take.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(20);
/// How much of `git`'s stderr an error carries.
const DETAIL_CAP: usize = 2048;
/// How much of `git`'s stderr is read at all.
const STDERR_CAP: usize = 64 * 1024;
/// How much a listing or a diff may be.
const OUTPUT_CAP: usize = 64 << 20;
/// The user name sent with a token when none is given (GitHub's for app and fine-grained
/// tokens; GitLab and Gitea accept any name with a token).
const DEFAULT_USERNAME: &str = "x-access-token";
/// Prefix of the private directories under the temporary directory.
const DIR_PREFIX: &str = "kortex-git-";
/// The mode of a tree entry that is a directory.
const TREE_MODE: &str = "040000";

/// How Kortex authenticates to a remote.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// Anonymous (a public repository; pushing will fail).
    None,
    /// HTTPS: sent as `Authorization: Basic base64(username:token)`.
    Token {
        /// The user name (default `x-access-token`).
        username: Option<String>,
        /// The token (`Debug` hides it).
        token: SecretValue,
    },
    /// SSH: a private key and the host keys it may talk to.
    SshKey {
        /// The private key (OpenSSH or PEM; `Debug` hides it).
        private_key: SecretValue,
        /// `known_hosts` lines: the only host keys accepted.
        known_hosts: String,
    },
}

/// A repository to clone and push to.
#[derive(Clone, Debug)]
pub struct Remote {
    /// `https://…`, `http://…`, `ssh://…` or `user@host:path`; never with a password.
    pub url: String,
    /// How Kortex authenticates.
    pub credentials: Credentials,
    /// `allowPrivateTargets`: the egress guard's private rules are lifted.
    pub allow_private: bool,
}

/// An author or committer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The name (no `<`, `>` or line breaks).
    pub name: String,
    /// The e-mail address (no `<`, `>` or line breaks).
    pub email: String,
}

/// Why a Git operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// Not attempted: the egress guard refused the remote, or a path, URL, name or
    /// entry (a symbolic link, a submodule) is not one Kortex touches.
    #[error("{0}")]
    Refused(String),
    /// The repository, branch, commit or file does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The branch exists with another commit, or a revert does not apply.
    #[error("{0}")]
    Conflict(String),
    /// The remote answered with a redirect (never followed).
    #[error("{0}")]
    Moved(String),
    /// The remote refused the credentials (or asked for some).
    #[error("{0}")]
    Unauthorized(String),
    /// `git` failed; `detail` is its stderr, scrubbed of secrets and capped.
    #[error("git {what} failed: {detail}")]
    Failed {
        /// The operation.
        what: String,
        /// What `git` said.
        detail: String,
    },
    /// `git` did not finish in time (it was killed).
    #[error("{0}")]
    Timeout(String),
}

/// One entry of a tree, listed recursively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its path from the repository root.
    pub path: String,
    /// Its mode as `git` writes it: `100644`, `100755`, `120000` (a symbolic link),
    /// `160000` (a submodule), `040000` (a directory, only where asked for).
    pub mode: String,
    /// The object id.
    pub oid: String,
}

impl Entry {
    /// Whether it is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.mode == "120000"
    }

    /// Whether it is a submodule (a commit of another repository).
    pub fn is_submodule(&self) -> bool {
        self.mode == "160000"
    }

    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.mode == "100644" || self.mode == "100755"
    }
}

/// A bare clone of one branch in a private temporary directory (removed when dropped).
pub struct Repo {
    dir: PrivateDir,
    git_dir: PathBuf,
    url: String,
    target: Target,
    access: Access,
    allow_private: bool,
    egress: Arc<Egress>,
    head: String,
}

impl std::fmt::Debug for Repo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repo")
            .field("url", &self.url)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl Repo {
    /// A bare clone of `branch` of `remote` (that branch only, no tags), its tip recorded
    /// as [`Repo::head`]. The full history is fetched (no partial clone), so that no later
    /// local command ever goes back to the network for a missing object.
    pub async fn clone(
        remote: &Remote,
        branch: &str,
        egress: &Arc<Egress>,
    ) -> Result<Repo, GitError> {
        check_branch(branch)?;
        let target = Target::parse(&remote.url)?;
        let dir = PrivateDir::new()?;
        let access = Access::new(&remote.credentials, &target, &dir.path)?;
        let git_dir = dir.path.join("repo.git");
        let mut repo = Repo {
            git_dir,
            url: remote.url.clone(),
            target,
            access,
            allow_private: remote.allow_private,
            egress: egress.clone(),
            head: String::new(),
            dir,
        };
        let mut args = strings(&[
            "clone",
            "--bare",
            "--single-branch",
            "--no-tags",
            "--branch",
            branch,
            "--end-of-options",
            &remote.url,
        ]);
        args.push(repo.git_dir.clone().into_os_string());
        let mut run = Run::network("clone", args);
        run.in_repo = false;
        let out = repo.exec(run).await?;
        if !out.ok() {
            return Err(repo.network_error("clone", &out));
        }
        repo.head = repo.resolve(&format!("refs/heads/{branch}")).await?;
        Ok(repo)
    }

    /// The tip of the branch when it was cloned.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Every file under `dir` (`""` for the whole tree) of `commit`, recursively:
    /// symbolic links and submodules included, marked by their mode.
    pub async fn files(&self, commit: &str, dir: &str) -> Result<Vec<Entry>, GitError> {
        check_oid(commit)?;
        let dir = dir.trim_end_matches('/');
        let mut args = strings(&["ls-tree", "-r", "-z", "--full-tree", commit]);
        if !(dir.is_empty() || dir == ".") {
            check_path(dir)?;
            args.extend(strings(&["--", dir]));
        }
        let out = self.exec(Run::local("ls-tree", args)).await?;
        if !out.ok() {
            return Err(local_error("ls-tree", commit, &out));
        }
        Ok(parse_tree(&out.stdout)
            .into_iter()
            .map(|(entry, _)| entry)
            .collect())
    }

    /// The text of the file at `path` in `commit`. Refused: a path that is not
    /// normalised, a symbolic link at the path or at any directory above it, a submodule,
    /// a directory, more than `cap` bytes, or text that is not UTF-8.
    pub async fn read(&self, commit: &str, path: &str, cap: usize) -> Result<String, GitError> {
        check_oid(commit)?;
        check_path(path)?;
        let Some((entry, size)) = self.locate(commit, path).await? else {
            return Err(GitError::NotFound(format!(
                "{path} does not exist in {commit}"
            )));
        };
        if size.is_some_and(|s| s > cap as u64) {
            return Err(GitError::Refused(format!(
                "{path} is larger than {cap} bytes"
            )));
        }
        let mut run = Run::local("cat-file", strings(&["cat-file", "blob", &entry.oid]));
        run.cap = cap;
        let out = self.exec(run).await?;
        if out.overflow {
            return Err(GitError::Refused(format!(
                "{path} is larger than {cap} bytes"
            )));
        }
        if !out.ok() {
            return Err(local_error("cat-file", path, &out));
        }
        String::from_utf8(out.stdout)
            .map_err(|_| GitError::Refused(format!("{path} is not UTF-8 text")))
    }

    /// A temporary index holding `parent`'s tree: where a commit is put together without a
    /// work tree (removed when dropped).
    async fn index_at(&self, parent: &str) -> Result<TempFile, GitError> {
        let index = self.dir.temp("index");
        self.checked(index.run("read-tree", strings(&["read-tree", parent])))
            .await?;
        Ok(index)
    }

    /// A commit on top of `parent` whose tree is `parent`'s with `path` set to `text` (a
    /// regular file; an executable one stays executable). Refused like [`Repo::read`]; a
    /// change that changes nothing is a conflict.
    pub async fn commit_file(
        &self,
        parent: &str,
        path: &str,
        text: &str,
        message: &str,
        author: &Signature,
        committer: &Signature,
    ) -> Result<String, GitError> {
        check_oid(parent)?;
        check_path(path)?;
        check_signature(author)?;
        check_signature(committer)?;
        let mode = match self.locate(parent, path).await? {
            Some((e, _)) if e.mode == "100755" => "100755",
            _ => "100644",
        };
        let index = self.index_at(parent).await?;
        let with_index = |what, args| index.run(what, args);
        let mut hash = Run::local(
            "hash-object",
            strings(&["hash-object", "-w", "--no-filters", "--stdin"]),
        );
        hash.stdin = Some(text.as_bytes());
        let blob = self.checked(hash).await?;
        let cacheinfo = format!("{mode},{blob},{path}");
        self.checked(with_index(
            "update-index",
            strings(&["update-index", "--add", "--cacheinfo", &cacheinfo]),
        ))
        .await?;
        let tree = self
            .checked(with_index("write-tree", strings(&["write-tree"])))
            .await?;
        if tree == self.tree_of(parent).await? {
            return Err(GitError::Conflict(format!(
                "{path} already has this content in {parent}"
            )));
        }
        self.commit_tree(&tree, parent, message, author, committer)
            .await
    }

    /// A commit on top of `parent` that undoes `commit` (its diff against its first parent,
    /// reversed and applied to `parent`'s tree in a temporary index). A reversal that does
    /// not apply is a conflict.
    pub async fn revert(
        &self,
        parent: &str,
        commit: &str,
        message: &str,
        author: &Signature,
        committer: &Signature,
    ) -> Result<String, GitError> {
        check_oid(parent)?;
        check_oid(commit)?;
        check_signature(author)?;
        check_signature(committer)?;
        let commit = self.resolve(commit).await?;
        let first_parent = format!("{commit}^1");
        if self.resolve(&first_parent).await.is_err() {
            return Err(GitError::Refused(format!(
                "{commit} has no parent: there is nothing to revert it to"
            )));
        }
        let reverse = self
            .exec(Run::local(
                "diff",
                strings(&[
                    "diff",
                    "--binary",
                    "--full-index",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-color",
                    &commit,
                    &first_parent,
                    "--",
                ]),
            ))
            .await?;
        if !reverse.ok() {
            return Err(local_error("diff", &commit, &reverse));
        }
        if reverse.stdout.is_empty() {
            return Err(GitError::Conflict(format!("{commit} changes nothing")));
        }
        let index = self.index_at(parent).await?;
        let with_index = |what, args| index.run(what, args);
        let mut apply = with_index("apply", strings(&["apply", "--cached", "-"]));
        apply.stdin = Some(&reverse.stdout);
        let applied = self.exec(apply).await?;
        if !applied.ok() {
            return Err(GitError::Conflict(format!(
                "reverting {commit} does not apply to {parent}: {}",
                applied.stderr
            )));
        }
        let tree = self
            .checked(with_index("write-tree", strings(&["write-tree"])))
            .await?;
        self.commit_tree(&tree, parent, message, author, committer)
            .await
    }

    /// `git diff from to`: the unified diff between two commits.
    pub async fn diff(&self, from: &str, to: &str) -> Result<String, GitError> {
        check_oid(from)?;
        check_oid(to)?;
        let args = strings(&[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-color",
            from,
            to,
            "--",
        ]);
        let out = self.exec(Run::local("diff", args)).await?;
        if !out.ok() {
            return Err(local_error("diff", &format!("{from}..{to}"), &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The newest commit reachable from `commit` whose diff changed how often `needle`
    /// occurs in `path` (`git log -S`), as (id, subject).
    pub async fn introduced(
        &self,
        commit: &str,
        path: &str,
        needle: &str,
    ) -> Result<Option<(String, String)>, GitError> {
        check_oid(commit)?;
        check_path(path)?;
        if needle.is_empty() || needle.contains('\0') {
            return Err(GitError::Refused(
                "the text to look for is empty or has a NUL".into(),
            ));
        }
        let pickaxe = format!("-S{needle}");
        let args = strings(&[
            "log",
            "--no-color",
            "--format=%H%x00%s",
            "-1",
            &pickaxe,
            commit,
            "--",
            path,
        ]);
        let out = self.exec(Run::local("log", args)).await?;
        if !out.ok() {
            return Err(local_error("log", path, &out));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .lines()
            .next()
            .and_then(|line| line.split_once('\0'))
            .map(|(sha, subject)| (sha.to_owned(), subject.to_owned())))
    }

    /// Fetches `branch` from the remote again; its tip now.
    pub async fn fetch(&self, branch: &str) -> Result<String, GitError> {
        check_branch(branch)?;
        let refspec = format!("+refs/heads/{branch}:refs/kortex/fetched/{branch}");
        let args = strings(&[
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "--end-of-options",
            &self.url,
            &refspec,
        ]);
        let out = self.exec(Run::network("fetch", args)).await?;
        if !out.ok() {
            return Err(self.network_error("fetch", &out));
        }
        self.resolve(&format!("refs/kortex/fetched/{branch}")).await
    }

    /// Whether `a` is `b` or one of its ancestors (both must be in the clone).
    pub async fn is_ancestor(&self, a: &str, b: &str) -> Result<bool, GitError> {
        check_oid(a)?;
        check_oid(b)?;
        let args = strings(&["merge-base", "--is-ancestor", a, b]);
        let out = self.exec(Run::local("merge-base", args)).await?;
        match out.code {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(GitError::NotFound(format!(
                "cannot compare {a} and {b}: {}",
                out.stderr
            ))),
        }
    }

    /// Pushes `commit` as the new branch `branch`, never forcing: a branch that already
    /// exists with another commit is a conflict, with this commit a success (a retry).
    pub async fn push_new_branch(&self, commit: &str, branch: &str) -> Result<(), GitError> {
        check_oid(commit)?;
        check_branch(branch)?;
        let full = self.resolve(commit).await?;
        let refname = format!("refs/heads/{branch}");
        if let Some(existing) = self.remote_tip(&refname).await? {
            return same_or_conflict(&existing, &full, branch);
        }
        let spec = format!("{full}:{refname}");
        let args = strings(&[
            "push",
            "--porcelain",
            "--no-verify",
            "--end-of-options",
            &self.url,
            &spec,
        ]);
        let out = self.exec(Run::network("push", args)).await?;
        if out.ok() {
            return Ok(());
        }
        let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), out.stderr);
        if said.contains("[rejected]") || said.contains("[remote rejected]") {
            // Someone created it meanwhile (or a retry raced): what is there now decides.
            if let Some(existing) = self.remote_tip(&refname).await? {
                return same_or_conflict(&existing, &full, branch);
            }
        }
        Err(self.network_error("push", &out))
    }

    /// The commit `refname` names on the remote, if it exists.
    async fn remote_tip(&self, refname: &str) -> Result<Option<String>, GitError> {
        let args = strings(&["ls-remote", "--end-of-options", &self.url, refname]);
        let out = self.exec(Run::network("ls-remote", args)).await?;
        if !out.ok() {
            return Err(self.network_error("ls-remote", &out));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().find_map(|line| {
            let (sha, name) = line.split_once('\t')?;
            (name == refname).then(|| sha.to_owned())
        }))
    }

    /// The full id of the commit `rev` names.
    async fn resolve(&self, rev: &str) -> Result<String, GitError> {
        let peeled = format!("{rev}^{{commit}}");
        let args = strings(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &peeled,
        ]);
        let out = self.exec(Run::local("rev-parse", args)).await?;
        let sha = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.ok() || sha.is_empty() {
            return Err(GitError::NotFound(format!(
                "{rev} is not a commit of {}",
                self.url
            )));
        }
        Ok(sha)
    }

    /// The tree of `commit`.
    async fn tree_of(&self, commit: &str) -> Result<String, GitError> {
        let peeled = format!("{commit}^{{tree}}");
        let args = strings(&["rev-parse", "--verify", "--end-of-options", &peeled]);
        self.checked(Run::local("rev-parse", args)).await
    }

    /// `commit-tree`: the message on stdin, the signatures in the environment.
    async fn commit_tree(
        &self,
        tree: &str,
        parent: &str,
        message: &str,
        author: &Signature,
        committer: &Signature,
    ) -> Result<String, GitError> {
        let mut text = message.trim_end().to_owned();
        if text.is_empty() {
            return Err(GitError::Refused("a commit needs a message".into()));
        }
        text.push('\n');
        let mut run = Run::local(
            "commit-tree",
            strings(&["commit-tree", tree, "-p", parent, "-F", "-"]),
        );
        run.stdin = Some(text.as_bytes());
        for (key, value) in [
            ("GIT_AUTHOR_NAME", &author.name),
            ("GIT_AUTHOR_EMAIL", &author.email),
            ("GIT_COMMITTER_NAME", &committer.name),
            ("GIT_COMMITTER_EMAIL", &committer.email),
        ] {
            run.env.push((key, value.into()));
        }
        self.checked(run).await
    }

    /// The blob at `path` in `commit` and its size, `None` when nothing is there. Refused:
    /// a symbolic link or submodule at the path or above it, a directory at the path, a
    /// file where a directory is needed.
    async fn locate(
        &self,
        commit: &str,
        path: &str,
    ) -> Result<Option<(Entry, Option<u64>)>, GitError> {
        let listed = self.ls_tree(commit, &["-t", "-l"], path).await?;
        let parts: Vec<&str> = path.split('/').collect();
        for depth in 1..=parts.len() {
            let prefix = parts[..depth].join("/");
            let last = depth == parts.len();
            let found = match listed.iter().find(|(e, _)| e.path == prefix) {
                Some(found) => found.clone(),
                // `ls-tree` shows nothing below an entry that is not a directory: ask
                // what this one is on its own.
                None => match self.ls_tree(commit, &["-l"], &prefix).await?.pop() {
                    Some(found) => found,
                    None => return Ok(None),
                },
            };
            let (entry, _) = &found;
            if entry.is_symlink() {
                return Err(GitError::Refused(format!(
                    "{prefix} is a symbolic link in {commit}; Kortex never follows one"
                )));
            }
            if entry.is_submodule() {
                return Err(GitError::Refused(format!(
                    "{prefix} is a submodule in {commit}; Kortex changes only this repository"
                )));
            }
            match (last, entry.mode == TREE_MODE) {
                (true, true) => {
                    return Err(GitError::Refused(format!("{path} is a directory")));
                }
                (true, false) => return Ok(Some(found)),
                (false, false) => {
                    return Err(GitError::Refused(format!(
                        "{prefix} is a file in {commit}, not a directory"
                    )));
                }
                (false, true) => {}
            }
        }
        Ok(None)
    }

    /// `ls-tree <flags> -z <commit> -- <path>`, parsed.
    async fn ls_tree(
        &self,
        commit: &str,
        flags: &[&str],
        path: &str,
    ) -> Result<Vec<(Entry, Option<u64>)>, GitError> {
        let mut args = strings(&["ls-tree", "-z"]);
        args.extend(strings(flags));
        args.extend(strings(&[commit, "--", path]));
        let out = self.exec(Run::local("ls-tree", args)).await?;
        if !out.ok() {
            return Err(local_error("ls-tree", commit, &out));
        }
        Ok(parse_tree(&out.stdout))
    }

    /// Runs `run` and gives its stdout, trimmed; any failure is an error.
    async fn checked(&self, run: Run<'_>) -> Result<String, GitError> {
        let what = run.what;
        let out = self.exec(run).await?;
        if !out.ok() {
            return Err(local_error(what, "", &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The error a failed network command means, from what `git` said.
    fn network_error(&self, what: &str, out: &Output) -> GitError {
        classify(what, &self.url, out)
    }

    /// Runs `git` as `run` says, under the rules of the module's documentation.
    async fn exec(&self, run: Run<'_>) -> Result<Output, GitError> {
        let pin = match run.network {
            true => Some(self.admit().await?),
            false => None,
        };
        let cmd = self.command(&run, pin.as_ref());
        let limit = if run.network {
            NETWORK_TIMEOUT
        } else {
            LOCAL_TIMEOUT
        };
        let what = run.what;
        let mut out = spawn_and_wait(cmd, run, limit).await?;
        out.stderr = cap_text(&self.access.scrub(&out.stderr), DETAIL_CAP);
        if let Some(error) = out.spawn_error.take() {
            return Err(GitError::Failed {
                what: what.to_owned(),
                detail: format!(
                    "cannot run git ({error}): Git delivery needs the `git` command where Kortex runs (docs/gitops.md)"
                ),
            });
        }
        Ok(out)
    }

    /// The command line and environment of `run` (`pin`: a network command, admitted).
    fn command(&self, run: &Run<'_>, pin: Option<&Pin>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("git");
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .current_dir(&self.dir.path);
        for (key, value) in base_env(&self.dir.path) {
            cmd.env(key, value);
        }
        if run.in_repo {
            cmd.arg(format!("--git-dir={}", self.git_dir.display()));
        }
        cmd.args(base_config());
        if let Some(pin) = pin {
            let scheme = self.target.scheme;
            cmd.args(["-c", &format!("protocol.{scheme}.allow=always")]);
            self.access.apply(&mut cmd, pin, &self.target);
        }
        cmd.args(&run.args);
        for (key, value) in &run.env {
            cmd.env(key, value);
        }
        cmd
    }

    /// The egress guard's word on the remote: its URL, and a host name's addresses once
    /// resolved (the ones allowed are then the only ones `git` may connect to).
    async fn admit(&self) -> Result<Pin, GitError> {
        let target = &self.target;
        self.egress
            .check_url(&target.check, self.allow_private)
            .map_err(GitError::Refused)?;
        let Some(url::Host::Domain(name)) = target.check.host() else {
            return Ok(Pin::default());
        };
        let resolved = tokio::net::lookup_host((name, target.port))
            .await
            .map_err(|e| GitError::Failed {
                what: "resolve".into(),
                detail: format!("cannot resolve {name}: {e}"),
            })?;
        let mut allowed = Vec::new();
        let mut refusal = None;
        for addr in resolved {
            let probe = format!("{}://{addr}/", target.scheme);
            let verdict = reqwest::Url::parse(&probe)
                .map_err(|e| e.to_string())
                .and_then(|u| self.egress.check_url(&u, self.allow_private));
            match verdict {
                Ok(()) if !allowed.contains(&addr.ip()) => allowed.push(addr.ip()),
                Ok(()) => {}
                Err(e) => {
                    refusal.get_or_insert(e);
                }
            }
        }
        if allowed.is_empty() {
            return Err(GitError::Refused(
                refusal.unwrap_or_else(|| format!("{name} resolves to no address")),
            ));
        }
        Ok(Pin {
            host: name.to_owned(),
            addresses: allowed,
        })
    }
}

/// `existing` is the branch's commit on the remote: ours is a retry, another a conflict.
fn same_or_conflict(existing: &str, ours: &str, branch: &str) -> Result<(), GitError> {
    if existing == ours {
        Ok(())
    } else {
        Err(GitError::Conflict(format!(
            "branch {branch} already exists on the remote at {existing}, not {ours}"
        )))
    }
}

/// One invocation of `git`.
struct Run<'a> {
    what: &'static str,
    args: Vec<OsString>,
    stdin: Option<&'a [u8]>,
    env: Vec<(&'static str, OsString)>,
    network: bool,
    /// Whether it runs on the clone (`--git-dir`); not for `clone` itself.
    in_repo: bool,
    /// How much of stdout is kept.
    cap: usize,
}

impl<'a> Run<'a> {
    fn local(what: &'static str, args: Vec<OsString>) -> Self {
        Self {
            what,
            args,
            stdin: None,
            env: Vec::new(),
            network: false,
            in_repo: true,
            cap: OUTPUT_CAP,
        }
    }

    fn network(what: &'static str, args: Vec<OsString>) -> Self {
        Self {
            network: true,
            ..Self::local(what, args)
        }
    }
}

/// What `git` did.
#[derive(Default)]
struct Output {
    code: Option<i32>,
    stdout: Vec<u8>,
    /// More than the run's cap was written to stdout.
    overflow: bool,
    /// Scrubbed and capped once it reaches the caller.
    stderr: String,
    spawn_error: Option<String>,
}

impl Output {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Spawns `cmd`, feeds it `run.stdin`, reads its output and waits, within `limit`; killed
/// (with everything it started: it leads its own process group) on timeout or when the
/// caller gives up.
async fn spawn_and_wait(
    mut cmd: tokio::process::Command,
    run: Run<'_>,
    limit: Duration,
) -> Result<Output, GitError> {
    cmd.process_group(0)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(if run.stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Ok(Output {
                spawn_error: Some(e.to_string()),
                ..Output::default()
            });
        }
    };
    let mut group = Group(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw),
    );
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let input = run.stdin;
    let work = async {
        let feed = async move {
            if let (Some(mut pipe), Some(data)) = (stdin, input) {
                // A command that stops reading early says why on stderr.
                let _ = pipe.write_all(data).await;
            }
        };
        let ((), out, err) = tokio::join!(feed, drain(stdout, run.cap), drain(stderr, STDERR_CAP));
        let status = child.wait().await;
        (status, out, err)
    };
    let Ok((status, (stdout, overflow), (stderr, _))) = tokio::time::timeout(limit, work).await
    else {
        return Err(GitError::Timeout(format!(
            "git {} did not finish within {} s and was stopped",
            run.what,
            limit.as_secs()
        )));
    };
    group.0 = None;
    Ok(Output {
        code: status.ok().and_then(|s| s.code()),
        stdout,
        overflow,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        spawn_error: None,
    })
}

/// A process group killed when dropped (unless cleared: its leader was reaped).
struct Group(Option<rustix::process::Pid>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Reads `pipe` to its end, keeping the first `cap` bytes; whether there was more.
async fn drain(pipe: Option<impl AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut overflow = false;
    let Some(mut pipe) = pipe else {
        return (kept, overflow);
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                overflow |= n > room;
            }
        }
    }
    (kept, overflow)
}

/// The environment of every command: nothing inherited but `PATH`.
fn base_env(home: &Path) -> Vec<(&'static str, OsString)> {
    let mut env: Vec<(&'static str, OsString)> = vec![
        ("HOME", home.as_os_str().to_owned()),
        ("LC_ALL", "C".into()),
        ("GIT_TERMINAL_PROMPT", "0".into()),
        ("GIT_CONFIG_NOSYSTEM", "1".into()),
        ("GIT_CONFIG_GLOBAL", "/dev/null".into()),
        ("GIT_ATTR_NOSYSTEM", "1".into()),
        ("GIT_LITERAL_PATHSPECS", "1".into()),
        ("GIT_NO_LAZY_FETCH", "1".into()),
        ("GIT_NO_REPLACE_OBJECTS", "1".into()),
    ];
    // Custom CAs of the image (an internal forge's certificate).
    for var in ["SSL_CERT_FILE", "SSL_CERT_DIR"] {
        if let Some(value) = std::env::var_os(var) {
            env.push((var, value));
        }
    }
    env
}

/// The `-c` options of every command.
fn base_config() -> Vec<&'static str> {
    [
        "protocol.allow=never",
        "http.followRedirects=false",
        "core.hooksPath=/dev/null",
        "credential.helper=",
        "core.askPass=",
        "gc.auto=0",
        "maintenance.auto=false",
        "fetch.recurseSubmodules=false",
    ]
    .iter()
    .flat_map(|c| ["-c", c])
    .collect()
}

/// Addresses the egress guard allowed for a host name.
#[derive(Default)]
struct Pin {
    host: String,
    addresses: Vec<std::net::IpAddr>,
}

/// How the remote is reached, as the egress guard checks it.
#[derive(Clone, Debug)]
struct Target {
    /// `https`, `http` or `ssh`.
    scheme: &'static str,
    /// The URL the guard checks (an scp-like `user@host:path` written as `ssh://`).
    check: reqwest::Url,
    port: u16,
}

impl Target {
    fn parse(url: &str) -> Result<Self, GitError> {
        if url.is_empty() || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(GitError::Refused(
                "the repository URL is empty or has spaces or control characters".into(),
            ));
        }
        let (scheme, check) = match url.split_once("://") {
            Some((scheme, _)) => {
                let scheme = match scheme {
                    "https" => "https",
                    "http" => "http",
                    "ssh" => "ssh",
                    _ => return Err(unsupported_url()),
                };
                (
                    scheme,
                    reqwest::Url::parse(url).map_err(|_| unsupported_url())?,
                )
            }
            None => ("ssh", scp_like(url)?),
        };
        if check.password().is_some() {
            return Err(GitError::Refused(
                "the repository URL carries a password; credentials belong in the Secret the repository names"
                    .into(),
            ));
        }
        let host = check.host_str().unwrap_or_default();
        if host.is_empty() || host.starts_with('-') {
            return Err(unsupported_url());
        }
        let port = check
            .port_or_known_default()
            .unwrap_or(if scheme == "ssh" { 22 } else { 0 });
        Ok(Self {
            scheme,
            check,
            port,
        })
    }
}

fn unsupported_url() -> GitError {
    GitError::Refused(
        "the repository URL must be https://, http://, ssh:// or user@host:path".into(),
    )
}

/// `[user@]host:path` (Git's scp-like syntax) as `ssh://[user@]host/path`. Not a local
/// path (a `/` before the `:`) nor a remote helper (`transport::address`).
fn scp_like(url: &str) -> Result<reqwest::Url, GitError> {
    let split = match url.find("]:") {
        Some(i) => Some((&url[..=i], &url[i + 2..])),
        None => url.split_once(':'),
    };
    let Some((user_host, path)) = split else {
        return Err(unsupported_url());
    };
    if user_host.is_empty() || user_host.contains('/') || path.is_empty() || path.starts_with(':') {
        return Err(unsupported_url());
    }
    reqwest::Url::parse(&format!(
        "ssh://{user_host}/{}",
        path.trim_start_matches('/')
    ))
    .map_err(|_| unsupported_url())
}

/// The credentials as `git` gets them, and what is scrubbed from its stderr.
struct Access {
    /// `GIT_CONFIG_*` variables (the `Authorization` header).
    env: Vec<(&'static str, String)>,
    /// The key and `known_hosts` files (SSH).
    ssh: Option<(PathBuf, PathBuf)>,
    /// Never shown: the token, `username:token` and its base64.
    secrets: Vec<String>,
}

impl Access {
    fn new(credentials: &Credentials, target: &Target, dir: &Path) -> Result<Self, GitError> {
        let mut access = Self {
            env: Vec::new(),
            ssh: None,
            secrets: Vec::new(),
        };
        match (credentials, target.scheme) {
            (Credentials::None, _) => {}
            (Credentials::Token { username, token }, "https" | "http") => {
                let user = username.as_deref().unwrap_or(DEFAULT_USERNAME);
                let pair = format!("{user}:{}", token.expose());
                let encoded = crate::catalog::secret_redactor::base64(&pair);
                access.env = vec![
                    ("GIT_CONFIG_COUNT", "1".into()),
                    ("GIT_CONFIG_KEY_0", "http.extraHeader".into()),
                    (
                        "GIT_CONFIG_VALUE_0",
                        format!("Authorization: Basic {encoded}"),
                    ),
                ];
                access.secrets = vec![encoded, pair, token.expose().to_owned()];
            }
            (
                Credentials::SshKey {
                    private_key,
                    known_hosts,
                },
                "ssh",
            ) => {
                if known_hosts.trim().is_empty() {
                    return Err(GitError::Refused(
                        "an SSH repository needs known_hosts lines: host keys are never accepted blindly"
                            .into(),
                    ));
                }
                let mut key = private_key.expose().trim().to_owned();
                key.push('\n');
                let key_file = write_private(dir, "id_key", &key)?;
                let hosts_file = write_private(dir, "known_hosts", known_hosts)?;
                access.ssh = Some((key_file, hosts_file));
                access.secrets = vec![private_key.expose().trim().to_owned()];
            }
            (Credentials::Token { .. }, _) => {
                return Err(GitError::Refused(
                    "a token authenticates over HTTPS; an ssh URL needs a private key".into(),
                ));
            }
            (Credentials::SshKey { .. }, _) => {
                return Err(GitError::Refused(
                    "a private key authenticates over SSH; an https URL needs a token".into(),
                ));
            }
        }
        Ok(access)
    }

    /// Puts the credentials and the pinned addresses on a network command.
    fn apply(&self, cmd: &mut tokio::process::Command, pin: &Pin, target: &Target) {
        for (key, value) in &self.env {
            cmd.env(key, value);
        }
        if target.scheme == "ssh" {
            cmd.env(
                "GIT_SSH_COMMAND",
                ssh_command(self.ssh.as_ref(), pin, target.port),
            );
        } else if !pin.addresses.is_empty() {
            let addresses: Vec<String> = pin
                .addresses
                .iter()
                .map(|ip| match ip {
                    std::net::IpAddr::V4(v4) => v4.to_string(),
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                })
                .collect();
            cmd.args([
                "-c".to_owned(),
                format!(
                    "http.curloptResolve={}:{}:{}",
                    pin.host,
                    target.port,
                    addresses.join(",")
                ),
            ]);
        }
    }

    /// `text` with every secret replaced by `[redacted]`.
    fn scrub(&self, text: &str) -> String {
        self.secrets
            .iter()
            .filter(|s| !s.is_empty())
            .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "[redacted]"))
    }
}

/// The `ssh` command `git` runs: only the given key, only the given host keys, no prompt,
/// no configuration file, and (for a host name) the address the egress guard allowed.
fn ssh_command(files: Option<&(PathBuf, PathBuf)>, pin: &Pin, port: u16) -> String {
    let mut command = String::from(
        "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=20",
    );
    match files {
        Some((key, hosts)) => command.push_str(&format!(
            " -i {} -o IdentitiesOnly=yes -o UserKnownHostsFile={}",
            shell_quote(key),
            shell_quote(hosts)
        )),
        None => command.push_str(" -o UserKnownHostsFile=/dev/null"),
    }
    if let Some(ip) = pin.addresses.first() {
        // Connect to the checked address; look the host key up under the name (as ssh
        // would without `HostName`: `[host]:port` off port 22).
        let alias = if port == 22 {
            pin.host.clone()
        } else {
            format!("[{}]:{port}", pin.host)
        };
        command.push_str(&format!(" -o HostName={ip} -o HostKeyAlias={alias}"));
    }
    command
}

/// `path` in single quotes for the shell `git` runs `GIT_SSH_COMMAND` with.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// Writes `text` to a new `0600` file `name` in `dir`.
fn write_private(dir: &Path, name: &str, text: &str) -> Result<PathBuf, GitError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| GitError::Failed {
            what: "prepare".into(),
            detail: format!("cannot write {name}: {e}"),
        })?;
    Ok(path)
}

/// A `0700` directory under the temporary directory, removed with what it holds when
/// dropped: the clone's `HOME`, the clone itself, key files and temporary indexes.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn new() -> Result<Self, GitError> {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("{DIR_PREFIX}{}", uuid::Uuid::now_v7().simple()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| GitError::Failed {
                what: "prepare".into(),
                detail: format!("cannot create a private directory: {e}"),
            })?;
        Ok(Self { path })
    }

    /// A fresh path in the directory (the file is removed when the guard is dropped).
    fn temp(&self, name: &str) -> TempFile {
        TempFile {
            path: self
                .path
                .join(format!("{name}-{}", uuid::Uuid::now_v7().simple())),
        }
    }
}

impl TempFile {
    /// A local git command that works on this file as its index.
    fn run<'a>(&self, what: &'static str, args: Vec<OsString>) -> Run<'a> {
        let mut run = Run::local(what, args);
        run.env
            .push(("GIT_INDEX_FILE", self.path.clone().into_os_string()));
        run
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A file removed when dropped.
struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The error a failed network command means, from what `git` said (`LC_ALL=C`).
fn classify(what: &str, url: &str, out: &Output) -> GitError {
    let said = &out.stderr;
    let lower = said.to_ascii_lowercase();
    let status = http_status(&lower);
    if let Some(code @ 300..=399) = status {
        return GitError::Moved(format!(
            "{url} answered {what} with a redirect (HTTP {code}); Kortex never follows one: set the repository's final URL"
        ));
    }
    if matches!(status, Some(401 | 403))
        || lower.contains("authentication failed")
        || lower.contains("could not read username")
        || lower.contains("could not read password")
        || lower.contains("permission denied (publickey")
        || lower.contains("host key verification failed")
    {
        return GitError::Unauthorized(format!(
            "{url} refused the credentials for {what} (the token or key needs read and write access to the repository): {said}"
        ));
    }
    if status == Some(404)
        || lower.contains("not found in upstream")
        || lower.contains("couldn't find remote ref")
        || (lower.contains("repository") && lower.contains("not found"))
    {
        return GitError::NotFound(format!("git {what} of {url}: {said}"));
    }
    GitError::Failed {
        what: what.to_owned(),
        detail: said.clone(),
    }
}

/// The HTTP status `git` (curl) reported, from `returned error: 404` or `HTTP 401`.
fn http_status(lower: &str) -> Option<u16> {
    ["returned error: ", "http "].iter().find_map(|marker| {
        let at = lower.find(marker)? + marker.len();
        lower.get(at..at + 3)?.parse().ok()
    })
}

/// A failed local command: the object or path was not found, or `git` failed.
fn local_error(what: &str, subject: &str, out: &Output) -> GitError {
    let lower = out.stderr.to_ascii_lowercase();
    if lower.contains("not a valid object name")
        || lower.contains("not a tree object")
        || lower.contains("bad revision")
        || lower.contains("unknown revision")
        || lower.contains("invalid object name")
    {
        return GitError::NotFound(format!("{subject}: {}", out.stderr));
    }
    GitError::Failed {
        what: what.to_owned(),
        detail: out.stderr.clone(),
    }
}

/// Parses `ls-tree -z` output (with or without `-l`): entries and sizes.
fn parse_tree(bytes: &[u8]) -> Vec<(Entry, Option<u64>)> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|record| {
            let record = std::str::from_utf8(record).ok()?;
            let (meta, path) = record.split_once('\t')?;
            let mut fields = meta.split_whitespace();
            let mode = fields.next()?.to_owned();
            let _kind = fields.next()?;
            let oid = fields.next()?.to_owned();
            let size = fields.next().and_then(|s| s.parse().ok());
            Some((
                Entry {
                    path: path.to_owned(),
                    mode,
                    oid,
                },
                size,
            ))
        })
        .collect()
}

/// Owned arguments.
fn strings(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `text` cut to at most `cap` bytes (on a character boundary), marked when cut.
fn cap_text(text: &str, cap: usize) -> String {
    let text = text.trim();
    if text.len() <= cap {
        return text.to_owned();
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… (cut)", &text[..end])
}

/// A commit id (abbreviated or full, hexadecimal): nothing a command could read as an
/// option or a revision expression.
fn check_oid(oid: &str) -> Result<(), GitError> {
    if (4..=64).contains(&oid.len()) && oid.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(GitError::Refused(format!(
            "{:?} is not a commit id",
            cap_text(oid, 80)
        )))
    }
}

/// A branch name as `git check-ref-format --branch` accepts it, and not an option.
fn check_branch(branch: &str) -> Result<(), GitError> {
    let bad = branch.is_empty()
        || branch.len() > 255
        || branch.starts_with('-')
        || branch.starts_with('/')
        || branch.ends_with('/')
        || branch.ends_with('.')
        || branch.ends_with(".lock")
        || branch == "@"
        || branch.contains("..")
        || branch.contains("//")
        || branch.contains("@{")
        || branch
            .chars()
            .any(|c| c.is_control() || " ~^:?*[\\".contains(c))
        || branch.split('/').any(|part| part.starts_with('.'));
    if bad {
        return Err(GitError::Refused(format!(
            "{:?} is not a branch name",
            cap_text(branch, 80)
        )));
    }
    Ok(())
}

/// A normalised path in the repository: relative, no `.` or `..` segment, no empty one,
/// no backslash, no control character (NUL included), no `.git`.
pub fn check_path(path: &str) -> Result<(), GitError> {
    let bad = path.is_empty()
        || path.len() > 4096
        || path.contains('\\')
        || path.chars().any(|c| c.is_control())
        || path
            .split('/')
            .any(|part| matches!(part, "" | "." | "..") || part.eq_ignore_ascii_case(".git"));
    if bad {
        return Err(GitError::Refused(format!(
            "{:?} is not a normalised path in the repository",
            cap_text(path, 200)
        )));
    }
    Ok(())
}

/// A signature `git` takes as it is.
fn check_signature(signature: &Signature) -> Result<(), GitError> {
    let bad =
        |s: &str| s.trim().is_empty() || s.chars().any(|c| c.is_control() || c == '<' || c == '>');
    if bad(&signature.name) || bad(&signature.email) {
        return Err(GitError::Refused(format!(
            "{:?} <{:?}> is not a usable author or committer",
            signature.name, signature.email
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Credentials {
        Credentials::Token {
            username: None,
            token: SecretValue::new("canary-7f3a"),
        }
    }

    #[test]
    fn urls_git_would_treat_as_something_else_are_refused() {
        for url in [
            "ext::sh -c touch% /tmp/pwned",
            "fd::17",
            "file:///srv/repo.git",
            "/srv/repo.git",
            "./repo:x",
            "https://user:secret@example.com/a/b.git",
            "ssh://-oProxyCommand=x/a",
            "git+ssh://example.com/a",
            "https://example.com/a b",
            "",
        ] {
            let err = Target::parse(url).err().map(|e| e.to_string());
            assert!(err.is_some(), "{url} was accepted");
            assert!(!err.unwrap_or_default().contains("secret"), "{url}");
        }
    }

    #[test]
    fn scp_like_urls_are_checked_as_ssh() {
        let t = Target::parse("git@github.com:acme/deploy.git").unwrap();
        assert_eq!(t.scheme, "ssh");
        assert_eq!(t.check.as_str(), "ssh://git@github.com/acme/deploy.git");
        assert_eq!(t.port, 22);
        let t = Target::parse("git@[::1]:acme/deploy.git").unwrap();
        assert_eq!(t.check.host_str(), Some("[::1]"));
        let t = Target::parse("ssh://git@example.com:2222/acme/deploy.git").unwrap();
        assert_eq!(t.port, 2222);
        let t = Target::parse("https://example.com/acme/deploy.git").unwrap();
        assert_eq!((t.scheme, t.port), ("https", 443));
    }

    #[test]
    fn the_token_travels_only_in_the_environment_and_is_scrubbed() {
        let target = Target::parse("https://example.com/a/b.git").unwrap();
        let access = Access::new(&token(), &target, Path::new("/nonexistent")).unwrap();
        let header = access
            .env
            .iter()
            .find(|(k, _)| *k == "GIT_CONFIG_VALUE_0")
            .map(|(_, v)| v.clone())
            .unwrap();
        assert_eq!(
            header,
            format!(
                "Authorization: Basic {}",
                crate::catalog::secret_redactor::base64("x-access-token:canary-7f3a")
            )
        );
        let said = format!("fatal: canary-7f3a {header} x-access-token:canary-7f3a");
        let scrubbed = access.scrub(&said);
        assert!(!scrubbed.contains("canary-7f3a"), "{scrubbed}");
        assert!(!scrubbed.contains(&header[22..]), "{scrubbed}");
        assert!(!format!("{:?}", token()).contains("canary"));
    }

    #[test]
    fn credentials_must_match_the_scheme() {
        let ssh = Target::parse("git@example.com:a/b.git").unwrap();
        assert!(matches!(
            Access::new(&token(), &ssh, Path::new("/nonexistent")),
            Err(GitError::Refused(_))
        ));
        let key = Credentials::SshKey {
            private_key: SecretValue::new("KEY"),
            known_hosts: " ".into(),
        };
        assert!(matches!(
            Access::new(&key, &ssh, Path::new("/nonexistent")),
            Err(GitError::Refused(m)) if m.contains("known_hosts")
        ));
        let https = Target::parse("https://example.com/a/b.git").unwrap();
        assert!(Access::new(&key, &https, Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn ssh_uses_only_the_given_key_and_host_keys() {
        let dir = PrivateDir::new().unwrap();
        let ssh = Target::parse("ssh://git@git.example.com:2222/a/b.git").unwrap();
        let key = Credentials::SshKey {
            private_key: SecretValue::new(
                "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n",
            ),
            known_hosts: "[git.example.com]:2222 ssh-ed25519 AAAA".into(),
        };
        let access = Access::new(&key, &ssh, &dir.path).unwrap();
        let (key_file, hosts_file) = access.ssh.clone().unwrap();
        use std::os::unix::fs::PermissionsExt;
        for file in [&key_file, &hosts_file] {
            let mode = std::fs::metadata(file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        }
        let pin = Pin {
            host: "git.example.com".into(),
            addresses: vec!["192.0.2.7".parse().unwrap()],
        };
        let command = ssh_command(access.ssh.as_ref(), &pin, ssh.port);
        for part in [
            "-o IdentitiesOnly=yes",
            "-o StrictHostKeyChecking=yes",
            "-o BatchMode=yes",
            "-F /dev/null",
            &format!("-i '{}'", key_file.display()),
            &format!("-o UserKnownHostsFile='{}'", hosts_file.display()),
            "-o HostName=192.0.2.7 -o HostKeyAlias=[git.example.com]:2222",
        ] {
            assert!(command.contains(part), "{part} missing from {command}");
        }
        assert!(!command.contains("abc"));
    }

    #[test]
    fn paths_branches_and_ids_are_validated() {
        for bad in [
            "a/../b",
            "../b",
            "/etc/passwd",
            "a/./b",
            "a//b",
            "a\\b",
            "a\0b",
            ".git/config",
            "a/",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        for good in [
            "a",
            "overlays/prod/kustomization.yaml",
            ".gitattributes",
            "a/.b",
        ] {
            assert!(check_path(good).is_ok(), "{good:?}");
        }
        for bad in [
            "", "-f", "a..b", "a b", "a~1", "x.lock", "a/.b", "@", "a@{1}", "a:b",
        ] {
            assert!(check_branch(bad).is_err(), "{bad:?}");
        }
        for good in ["main", "kortex/restart-api-7", "release-1.2"] {
            assert!(check_branch(good).is_ok(), "{good:?}");
        }
        assert!(check_oid("HEAD").is_err());
        assert!(check_oid("--output=/tmp/x").is_err());
        assert!(check_oid("0123abcd").is_ok());
    }

    #[test]
    fn stderr_is_classified() {
        let out = |stderr: &str| Output {
            code: Some(128),
            stderr: stderr.into(),
            ..Output::default()
        };
        let url = "http://127.0.0.1:1/r.git";
        assert!(matches!(
            classify(
                "clone",
                url,
                &out("fatal: unable to access 'x': The requested URL returned error: 302")
            ),
            GitError::Moved(_)
        ));
        assert!(matches!(
            classify(
                "clone",
                url,
                &out("fatal: could not read Username for 'x': terminal prompts disabled")
            ),
            GitError::Unauthorized(_)
        ));
        assert!(matches!(
            classify(
                "clone",
                url,
                &out(
                    "warning: Could not find remote branch nope to clone.\nfatal: Remote branch nope not found in upstream origin"
                )
            ),
            GitError::NotFound(_)
        ));
        assert!(matches!(
            classify("clone", url, &out("fatal: something else")),
            GitError::Failed { .. }
        ));
    }

    #[test]
    fn details_are_capped_on_a_character_boundary() {
        let long = "é".repeat(3000);
        let capped = cap_text(&long, DETAIL_CAP);
        assert!(capped.len() <= DETAIL_CAP + "… (cut)".len());
        assert!(capped.ends_with("(cut)"));
    }

    #[tokio::test]
    async fn a_command_that_outlasts_its_time_is_killed_with_what_it_started() {
        let dir = PrivateDir::new().unwrap();
        let pid_file = dir.path.join("pid");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(format!(
            "sleep 30 & echo $! > '{}'; wait",
            pid_file.display()
        ));
        let started = std::time::Instant::now();
        let run = Run::local("sleep", Vec::new());
        let result = spawn_and_wait(cmd, run, Duration::from_millis(500)).await;
        assert!(matches!(result, Err(GitError::Timeout(_))));
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            // Gone, or a zombie waiting for a reaper: not running either way.
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            let running = state
                .rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z') && !rest.is_empty());
            if !running {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child's child still runs: {state}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[test]
    fn a_network_command_carries_the_token_only_in_its_environment() {
        let dir = PrivateDir::new().unwrap();
        let target = Target::parse("https://git.example.com/acme/deploy.git").unwrap();
        let repo = Repo {
            git_dir: dir.path.join("repo.git"),
            url: "https://git.example.com/acme/deploy.git".into(),
            access: Access::new(&token(), &target, &dir.path).unwrap(),
            target,
            allow_private: false,
            egress: Arc::new(Egress::default()),
            head: String::new(),
            dir,
        };
        let pin = Pin {
            host: "git.example.com".into(),
            addresses: vec!["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()],
        };
        let run = Run::network("fetch", strings(&["fetch", "--end-of-options", &repo.url]));
        let cmd = repo.command(&run, Some(&pin));
        let cmd = cmd.as_std();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(
            !line.contains("canary-7f3a") && !line.contains("Authorization"),
            "{line}"
        );
        for part in [
            "-c protocol.allow=never",
            "-c protocol.https.allow=always",
            "-c http.followRedirects=false",
            "-c core.hooksPath=/dev/null",
            "-c credential.helper= ",
            "-c http.curloptResolve=git.example.com:443:192.0.2.7,[2001:db8::7]",
        ] {
            assert!(line.contains(part), "{part} missing from {line}");
        }
        assert!(!line.contains("protocol.ssh"), "{line}");
        let envs: std::collections::BTreeMap<String, Option<String>> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let env = |k: &str| envs.get(k).cloned().flatten().unwrap_or_default();
        assert_eq!(env("GIT_CONFIG_COUNT"), "1");
        assert_eq!(env("GIT_CONFIG_KEY_0"), "http.extraHeader");
        assert!(env("GIT_CONFIG_VALUE_0").starts_with("Authorization: Basic "));
        assert_eq!(env("GIT_TERMINAL_PROMPT"), "0");
        assert_eq!(env("GIT_CONFIG_NOSYSTEM"), "1");
        assert_eq!(env("GIT_CONFIG_GLOBAL"), "/dev/null");
        assert_eq!(env("HOME"), repo.dir.path.display().to_string());
        assert!(!envs.contains_key("GIT_ASKPASS") && !envs.contains_key("SSH_ASKPASS"));
        // Nothing inherited: the environment is cleared first.
        assert!(cmd.get_envs().count() < 20);

        // A local command gets no credentials and no protocol.
        let local = repo.command(&Run::local("diff", strings(&["diff"])), None);
        let envs: Vec<String> = local
            .as_std()
            .get_envs()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert!(
            !envs.iter().any(|k| k.starts_with("GIT_CONFIG_COUNT")),
            "{envs:?}"
        );
        let line: Vec<String> = local
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(!line.join(" ").contains("allow=always"));
    }

    /// Compiles only if every operation can run in a spawned task.
    #[allow(dead_code)]
    fn operations_are_send(repo: &Repo, remote: &Remote, egress: &Arc<Egress>, s: &Signature) {
        fn send<T: Send>(_: T) {}
        send(Repo::clone(remote, "main", egress));
        send(repo.files("abcd", ""));
        send(repo.read("abcd", "a", 1));
        send(repo.commit_file("abcd", "a", "t", "m", s, s));
        send(repo.revert("abcd", "abcd", "m", s, s));
        send(repo.diff("abcd", "abcd"));
        send(repo.introduced("abcd", "a", "n"));
        send(repo.fetch("main"));
        send(repo.is_ancestor("abcd", "abcd"));
        send(repo.push_new_branch("abcd", "b"));
    }

    #[test]
    fn ls_tree_records_are_parsed() {
        let raw = b"100644 blob aaaa       12\tdir/a file\x00120000 blob bbbb\tlink\x00160000 commit cccc       -\tsub\0";
        let parsed = parse_tree(raw);
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].0.path, "dir/a file");
        assert_eq!(parsed[0].1, Some(12));
        assert!(parsed[1].0.is_symlink());
        assert!(parsed[2].0.is_submodule());
        assert_eq!(parsed[2].1, None);
    }
}
