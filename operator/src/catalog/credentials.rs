//! API keys Kortex recognises: Secrets labelled `kortex.dev/credentials: chat` (chat API
//! and dashboard) or `gateway` (the `/v1` gateway, governed by the ChatPolicy named in the
//! `kortex.dev/policy` annotation). Keys are held only as SHA-256 hashes and compared in
//! constant time.

use super::ObjectKey;
use super::secrets::sha256;
use k8s_openapi::api::core::v1::Secret;
use std::collections::BTreeMap;

/// Label naming the credential kind.
pub const CREDENTIALS_LABEL: &str = "kortex.dev/credentials";
/// Annotation naming the ChatPolicy that governs gateway keys.
pub const POLICY_ANNOTATION: &str = "kortex.dev/policy";
/// Annotation of a gateway key's Secret: its requests per minute.
pub const RPM_ANNOTATION: &str = "kortex.dev/requests-per-minute";
/// Annotation of a gateway key's Secret: its tokens per minute.
pub const TPM_ANNOTATION: &str = "kortex.dev/tokens-per-minute";

/// What a key grants access to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CredentialKind {
    /// The chat API and the dashboard, as a user.
    Chat,
    /// The `/v1` gateway, as a team or application.
    Gateway,
}

/// One recognised key.
#[derive(Clone, Debug)]
pub struct Credential {
    /// Chat or gateway.
    pub kind: CredentialKind,
    /// User (chat) or team/application (gateway) name.
    pub principal: String,
    /// Groups of the principal.
    pub groups: Vec<String>,
    /// SHA-256 of the key.
    key_hash: [u8; 32],
    /// The Secret it came from.
    pub source: ObjectKey,
    /// Governing ChatPolicy name (gateway keys).
    pub policy: Option<String>,
    /// This key's own rate limits (gateway keys; annotations
    /// `kortex.dev/requests-per-minute`, `kortex.dev/tokens-per-minute`).
    pub rate_limits: crate::crd::RateLimits,
}

/// All recognised keys, plus what was wrong with credential Secrets that were skipped.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    entries: Vec<Credential>,
    /// Human-readable problems (never containing key material).
    pub problems: Vec<String>,
}

impl Credentials {
    /// Reads every labelled Secret. Two layouts are accepted: one credential per Secret
    /// (fields `user` or `team`, `key`, optional comma-separated `groups`), or one entry
    /// per principal (`<name>: <key>`).
    pub fn from_secrets(secrets: &[Secret]) -> Self {
        let mut out = Self::default();
        for s in secrets {
            let Some(kind) = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CREDENTIALS_LABEL))
            else {
                continue;
            };
            let source = ObjectKey::of(s);
            let kind = match kind.as_str() {
                "chat" => CredentialKind::Chat,
                "gateway" => CredentialKind::Gateway,
                other => {
                    out.problems.push(format!(
                        "Secret {source}: label {CREDENTIALS_LABEL}={other} is not chat or gateway; skipped"
                    ));
                    continue;
                }
            };
            let policy = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POLICY_ANNOTATION))
                .cloned();
            let mut rate_limits = crate::crd::RateLimits::default();
            let annotation = |name: &str| {
                s.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(name))
                    .map(|v| v.trim().to_owned())
            };
            let mut bad = false;
            if let Some(v) = annotation(RPM_ANNOTATION) {
                match v.parse::<u32>() {
                    Ok(n) if n > 0 => rate_limits.requests_per_minute = Some(n),
                    _ => bad = true,
                }
            }
            if let Some(v) = annotation(TPM_ANNOTATION) {
                match v.parse::<u64>() {
                    Ok(n) if n > 0 => rate_limits.tokens_per_minute = Some(n),
                    _ => bad = true,
                }
            }
            if bad {
                out.problems.push(format!(
                    "Secret {source}: {RPM_ANNOTATION} and {TPM_ANNOTATION} must be whole numbers above 0; skipped"
                ));
                continue;
            }
            if kind == CredentialKind::Gateway && policy.is_none() {
                out.problems.push(format!(
                    "Secret {source}: gateway keys need the annotation {POLICY_ANNOTATION}: <ChatPolicy name>; skipped"
                ));
                continue;
            }
            let fields = secret_fields(s);
            let mut add = |principal: &str, key: &str, groups: Vec<String>| {
                let (principal, key) = (principal.trim(), key.trim());
                if principal.is_empty() || key.is_empty() {
                    out.problems
                        .push(format!("Secret {source}: empty principal or key; skipped"));
                    return;
                }
                out.entries.push(Credential {
                    kind,
                    principal: principal.to_owned(),
                    groups,
                    key_hash: sha256(key.as_bytes()),
                    source: source.clone(),
                    policy: policy.clone(),
                    rate_limits,
                });
            };
            if let Some(key) = fields.get("key") {
                let principal_field = if kind == CredentialKind::Chat {
                    "user"
                } else {
                    "team"
                };
                let Some(principal) = fields.get(principal_field).or_else(|| fields.get("user"))
                else {
                    out.problems.push(format!(
                        "Secret {source}: field {principal_field} is missing; skipped"
                    ));
                    continue;
                };
                let groups = fields
                    .get("groups")
                    .map(|g| group_list(g))
                    .unwrap_or_default();
                add(principal, key, groups);
            } else {
                for (principal, key) in &fields {
                    add(principal, key, Vec::new());
                }
            }
        }
        out
    }

    /// The credential of `kind` whose key is `presented`, comparing every entry in
    /// constant time (no early exit that would leak which prefix matched).
    pub fn authenticate(&self, kind: CredentialKind, presented: &str) -> Option<&Credential> {
        let hash = sha256(presented.as_bytes());
        let mut found = None;
        for c in &self.entries {
            let diff = c
                .key_hash
                .iter()
                .zip(hash.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 && c.kind == kind && found.is_none() {
                found = Some(c);
            }
        }
        found
    }

    /// The chat credential of user `name`, if one of the Secrets names them.
    pub fn chat_user(&self, name: &str) -> Option<&Credential> {
        self.entries
            .iter()
            .find(|c| c.kind == CredentialKind::Chat && c.principal == name)
    }

    /// Number of keys of `kind`.
    pub fn count(&self, kind: CredentialKind) -> usize {
        self.entries.iter().filter(|c| c.kind == kind).count()
    }
}

/// The groups of a comma-separated list (`sre, dev`), blanks left out.
pub fn group_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether `a` equals `b`, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `data` then `stringData` (which wins), as UTF-8 strings; other values are skipped.
fn secret_fields(s: &Secret) -> BTreeMap<String, String> {
    let mut fields: BTreeMap<String, String> = s
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| String::from_utf8(v.0.clone()).ok().map(|v| (k.clone(), v)))
        .collect();
    fields.extend(
        s.string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred_secret(
        name: &str,
        kind: &str,
        fields: &[(&str, &str)],
        policy: Option<&str>,
    ) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("kortex".into());
        s.metadata.labels = Some([(CREDENTIALS_LABEL.to_owned(), kind.to_owned())].into());
        if let Some(p) = policy {
            s.metadata.annotations = Some([(POLICY_ANNOTATION.to_owned(), p.to_owned())].into());
        }
        s.string_data = Some(
            fields
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        s
    }

    #[test]
    fn both_layouts_and_kinds() {
        let creds = Credentials::from_secrets(&[
            cred_secret(
                "alice",
                "chat",
                &[
                    ("user", "alice"),
                    ("key", "k-alice\n"),
                    ("groups", "sre, dev"),
                ],
                None,
            ),
            cred_secret(
                "many",
                "chat",
                &[("bob", "k-bob"), ("carol", "k-carol")],
                None,
            ),
            cred_secret(
                "shop",
                "gateway",
                &[("team", "shop"), ("key", "g-shop")],
                Some("default"),
            ),
            cred_secret("nopol", "gateway", &[("team", "x"), ("key", "g-x")], None),
            cred_secret("odd", "admin", &[("user", "x"), ("key", "y")], None),
        ]);
        let alice = creds.authenticate(CredentialKind::Chat, "k-alice");
        assert_eq!(alice.map(|c| c.principal.as_str()), Some("alice"));
        assert_eq!(
            alice.map(|c| c.groups.clone()),
            Some(vec!["sre".to_owned(), "dev".to_owned()])
        );
        assert_eq!(
            creds
                .authenticate(CredentialKind::Chat, "k-carol")
                .map(|c| c.principal.as_str()),
            Some("carol")
        );
        assert!(
            creds.authenticate(CredentialKind::Chat, "g-shop").is_none(),
            "gateway keys do not open chat"
        );
        let shop = creds.authenticate(CredentialKind::Gateway, "g-shop");
        assert_eq!(shop.and_then(|c| c.policy.as_deref()), Some("default"));
        assert!(creds.authenticate(CredentialKind::Gateway, "g-x").is_none());
        assert!(creds.authenticate(CredentialKind::Chat, "").is_none());
        assert_eq!(creds.problems.len(), 2, "{:?}", creds.problems);
        assert!(
            !format!("{creds:?}").contains("k-alice"),
            "keys are kept only as hashes"
        );
    }
}
