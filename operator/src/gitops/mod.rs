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

use crate::catalog::RepositoryResolved;

/// A repository URL reduced to what names the repository: host (lower case, without user
/// info and default port) and path (without `.git` and trailing slashes, case kept), for
/// `https://`, `http://`, `ssh://` and scp-like `git@host:path` forms alike.
pub fn repository_key(url: &str) -> String {
    let url = url.trim();
    let (host, path) = if let Some((_, rest)) = url.split_once("://") {
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = authority.rsplit('@').next().unwrap_or(authority);
        let host = host
            .strip_suffix(":443")
            .or_else(|| host.strip_suffix(":22"))
            .unwrap_or(host);
        (host.to_ascii_lowercase(), path)
    } else if let Some((authority, path)) = url.split_once(':') {
        let host = authority.rsplit('@').next().unwrap_or(authority);
        (host.to_ascii_lowercase(), path)
    } else {
        (String::new(), url)
    };
    let path = path.trim_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path);
    format!("{host}/{}", path.trim_matches('/'))
}

/// The declared repository `url` names, if the policy declares it.
pub fn declared<'a>(
    repositories: &'a [RepositoryResolved],
    url: &str,
) -> Option<&'a RepositoryResolved> {
    let key = repository_key(url);
    repositories
        .iter()
        .find(|r| repository_key(&r.spec.url) == key)
}

#[cfg(test)]
mod tests {
    use super::repository_key;

    #[test]
    fn one_repository_has_one_key() {
        let k = repository_key("https://github.com/acme/fleet");
        for same in [
            "https://GitHub.com/acme/fleet.git",
            "https://x-access-token@github.com/acme/fleet/",
            "ssh://git@github.com:22/acme/fleet.git",
            "git@github.com:acme/fleet.git",
            "https://github.com:443/acme/fleet",
        ] {
            assert_eq!(repository_key(same), k, "{same}");
        }
        assert_ne!(repository_key("https://github.com/acme/fleet2"), k);
        assert_ne!(repository_key("https://github.com/Acme/fleet"), k);
        assert_ne!(repository_key("https://gitlab.com/acme/fleet"), k);
    }
}
