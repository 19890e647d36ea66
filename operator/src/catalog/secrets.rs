//! Secret values: lookup by reference, the redacting wrapper that keeps them out of logs
//! and JSON, and `secretHash` (of uid + resourceVersion, never of values).

use crate::crd::SecretKeyRef;
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Annotation the manifest source puts on a Secret whose `${VAR}` placeholders name unset
/// environment variables: `key=VAR,key2=VAR2`. Lets the catalog say why a key is missing.
pub const UNSET_ENV_ANNOTATION: &str = "kortex.dev/unset-env";

/// The label a Secret carries (value `"true"`) to let Kortex read it for an `LLMProvider` or
/// `KortexTool`: a resource may only name Secrets their owner opted in, so nobody can have
/// Kortex read and send a Secret they could not read themselves.
pub const USE_LABEL: &str = "kortex.dev/use";

/// Whether a Secret (its metadata) opted in to use by Kortex ([`USE_LABEL`]).
pub fn opted_in(metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(USE_LABEL))
        .is_some_and(|v| v == "true")
}

/// A resolved secret value. `Debug` and `Display` never show it, and it is not `Serialize`,
/// so it cannot reach a log line or an API response by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Arc<str>);

impl SecretValue {
    /// Wraps a value.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that sends it (a request header, a TLS config).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// Why a Secret key could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretProblem {
    /// A reason from [`crate::crd::conditions::reasons`].
    pub reason: &'static str,
    /// Names the Secret and key, never a value.
    pub message: String,
}

/// Secrets by namespace and name.
#[derive(Default)]
pub struct SecretIndex<'a> {
    by_key: BTreeMap<(&'a str, &'a str), &'a Secret>,
}

impl<'a> SecretIndex<'a> {
    /// Indexes `secrets` (objects without a name are ignored).
    pub fn new(secrets: &'a [Secret]) -> Self {
        let mut by_key = BTreeMap::new();
        for s in secrets {
            if let Some(name) = s.metadata.name.as_deref() {
                by_key.insert(
                    (s.metadata.namespace.as_deref().unwrap_or("default"), name),
                    s,
                );
            }
        }
        Self { by_key }
    }

    /// The Secret `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&'a Secret> {
        self.by_key.get(&(namespace, name)).copied()
    }

    /// The value of `r` in `namespace`: `stringData` wins over `data`, as in Kubernetes.
    /// Surrounding whitespace is trimmed (a key written with `echo` ends in a newline).
    pub fn resolve(&self, namespace: &str, r: &SecretKeyRef) -> Result<SecretValue, SecretProblem> {
        let Some(secret) = self.get(namespace, &r.name) else {
            return Err(SecretProblem {
                reason: crate::crd::conditions::reasons::SECRET_NOT_FOUND,
                message: format!(
                    "secret {} key {}: Secret {} not found in namespace {namespace}",
                    r.name, r.key, r.name
                ),
            });
        };
        if !opted_in(&secret.metadata) {
            return Err(SecretProblem {
                reason: crate::crd::conditions::reasons::SECRET_NOT_OPTED_IN,
                message: format!(
                    "secret {} key {}: Secret {} is not labelled {USE_LABEL}: \"true\"; Kortex reads only Secrets their owner opted in (kubectl label secret {} {USE_LABEL}=true -n {namespace})",
                    r.name, r.key, r.name, r.name
                ),
            });
        }
        let raw: Option<Vec<u8>> = secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .map(|s| s.as_bytes().to_vec())
            .or_else(|| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&r.key))
                    .map(|b| b.0.clone())
            });
        let Some(raw) = raw else {
            let unset_env = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(UNSET_ENV_ANNOTATION))
                .and_then(|v| {
                    v.split(',')
                        .find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == r.key))
                })
                .map(|(_, var)| format!(" (environment variable {var} is not set)"))
                .unwrap_or_default();
            return Err(SecretProblem {
                reason: crate::crd::conditions::reasons::SECRET_KEY_NOT_FOUND,
                message: format!(
                    "secret {} key {}: key not found in Secret {}{unset_env}",
                    r.name, r.key, r.name
                ),
            });
        };
        match String::from_utf8(raw) {
            Ok(s) if !s.trim().is_empty() => Ok(SecretValue::new(s.trim())),
            Ok(_) => Err(SecretProblem {
                reason: crate::crd::conditions::reasons::SECRET_INVALID,
                message: format!("secret {} key {}: value is empty", r.name, r.key),
            }),
            Err(_) => Err(SecretProblem {
                reason: crate::crd::conditions::reasons::SECRET_INVALID,
                message: format!("secret {} key {}: value is not valid UTF-8", r.name, r.key),
            }),
        }
    }

    /// `sha256:<hex>` over the uid and resourceVersion of each referenced Secret (or a
    /// marker when it is missing), so a rotated Secret changes the hash and rolls the
    /// provider, while the hash reveals nothing about the values.
    pub fn hash_of(&self, namespace: &str, refs: &[&SecretKeyRef]) -> Option<String> {
        if refs.is_empty() {
            return None;
        }
        let mut names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut hasher = Sha256::new();
        for name in names {
            let line = match self.get(namespace, name) {
                Some(s) => format!(
                    "{namespace}/{name}:{}:{}\n",
                    s.metadata.uid.as_deref().unwrap_or(""),
                    s.metadata.resource_version.as_deref().unwrap_or("")
                ),
                None => format!("{namespace}/{name}:missing\n"),
            };
            hasher.update(line.as_bytes());
        }
        Some(format!("sha256:{}", hex(&hasher.finalize())))
    }
}

/// The bytes of hex `text` (either case); `None` for anything else.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, string_data: &[(&str, &str)], data: &[(&str, &[u8])]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("default".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.resource_version = Some("1".into());
        s.metadata.labels = Some([(USE_LABEL.to_owned(), "true".to_owned())].into());
        if !string_data.is_empty() {
            s.string_data = Some(
                string_data
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            );
        }
        if !data.is_empty() {
            s.data = Some(
                data.iter()
                    .map(|(k, v)| ((*k).into(), ByteString(v.to_vec())))
                    .collect(),
            );
        }
        s
    }

    fn r(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn resolves_string_data_over_data_and_trims() {
        let secrets = vec![secret(
            "k",
            &[("a", "from-string\n")],
            &[("a", b"from-data"), ("b", b"bytes ")],
        )];
        let idx = SecretIndex::new(&secrets);
        assert_eq!(
            idx.resolve("default", &r("k", "a"))
                .map(|v| v.expose().to_owned()),
            Ok("from-string".into())
        );
        assert_eq!(
            idx.resolve("default", &r("k", "b"))
                .map(|v| v.expose().to_owned()),
            Ok("bytes".into())
        );
    }

    #[test]
    fn problems_name_secret_and_key_but_never_values() {
        let mut s = secret(
            "llm-keys",
            &[("openai", "sk-live")],
            &[("bin", &[0xff, 0xfe])],
        );
        s.metadata.annotations = Some(
            [(
                UNSET_ENV_ANNOTATION.to_owned(),
                "anthropic=ANTHROPIC_API_KEY".to_owned(),
            )]
            .into(),
        );
        let secrets = vec![s];
        let idx = SecretIndex::new(&secrets);
        let missing = idx.resolve("default", &r("other", "x")).err();
        assert_eq!(missing.as_ref().map(|p| p.reason), Some("SecretNotFound"));
        assert_eq!(
            missing.map(|p| p.message).unwrap_or_default(),
            "secret other key x: Secret other not found in namespace default"
        );
        let no_key = idx
            .resolve("default", &r("llm-keys", "anthropic"))
            .err()
            .map(|p| p.message)
            .unwrap_or_default();
        assert!(
            no_key.contains("environment variable ANTHROPIC_API_KEY is not set"),
            "{no_key}"
        );
        let bad = idx
            .resolve("default", &r("llm-keys", "bin"))
            .err()
            .map(|p| p.reason);
        assert_eq!(bad, Some("SecretInvalid"));
        assert!(
            idx.resolve("other-ns", &r("llm-keys", "openai")).is_err(),
            "namespaces are separate"
        );
        assert_eq!(
            format!("{:?}", SecretValue::new("sk-live")),
            "SecretValue(<redacted>)"
        );
    }

    #[test]
    fn hash_follows_resource_version_not_values() {
        let a = vec![secret("k", &[("a", "one")], &[])];
        let mut b = a.clone();
        b[0].string_data = Some([("a".to_owned(), "two".to_owned())].into());
        let refs = [&r("k", "a")];
        let ha = SecretIndex::new(&a).hash_of("default", &refs);
        assert_eq!(
            ha,
            SecretIndex::new(&b).hash_of("default", &refs),
            "values do not enter the hash"
        );
        b[0].metadata.resource_version = Some("2".into());
        assert_ne!(ha, SecretIndex::new(&b).hash_of("default", &refs));
        assert!(ha.unwrap_or_default().starts_with("sha256:"));
        assert_eq!(SecretIndex::new(&a).hash_of("default", &[]), None);
    }
}
