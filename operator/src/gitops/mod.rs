//! GitOps: who applies an object from Git ([`owner`]: Argo CD, Flux, an HPA owning the
//! replicas, or nobody), where one of its fields lives in the repository ([`yaml`]: the
//! exact scalar in a plain manifest, a Kustomize overlay or Helm values, edited without
//! re-serialising the file), the repository itself ([`git`]: Debian's `git`, run without a
//! work tree, credentials never on a command line) and the forge that opens the change
//! request ([`forge`]: GitHub, GitLab, Gitea/Forgejo REST).
//!
//! Below `tools` (the read-only `get_gitops_source`) and `proposals` (the `git` delivery of
//! an approved proposal); imports only `crd`, `egress`, `catalog` and below
//! (docs/architecture.md).

pub mod forge;
pub mod git;
pub mod owner;
pub mod yaml;
