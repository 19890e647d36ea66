//! What a sign-in keeps of the provider's tokens is sealed (AES-256-GCM) under the session
//! key before it reaches the database: the database never holds a usable token, and every
//! replica that shares the key (`--session-key-file`, a Secret in the chart) can open what
//! another sealed. A replica with another key cannot, and says so.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

/// The key sign-ins are sealed with.
pub struct SessionKey {
    key: LessSafeKey,
    id: String,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKey({})", self.id)
    }
}

/// Random bytes from the system's generator.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    // The system generator does not fail on the platforms Kortex runs on; should it, the
    // process cannot sign anybody in safely.
    SystemRandom::new()
        .fill(&mut out)
        .unwrap_or_else(|_| panic!("the system random generator failed"));
    out
}

/// A random token of 32 bytes, base64url (43 characters): states, nonces, PKCE verifiers,
/// session ids.
pub fn random_token() -> String {
    super::jwt::base64url_encode(&random_bytes::<32>())
}

/// SHA-256 of `text`, hex: how session ids and states are found in the database (the
/// database never holds one that would work).
pub fn digest(text: &str) -> String {
    crate::catalog::secrets::hex(&Sha256::digest(text.as_bytes()))
}

impl SessionKey {
    /// The key derived from a secret of at least 32 bytes (a file or a Secret's value).
    pub fn from_secret(secret: &[u8]) -> Result<Self, String> {
        let secret = secret.trim_ascii();
        if secret.len() < 32 {
            return Err(format!(
                "the session key has {} bytes; it needs at least 32 (e.g. openssl rand -base64 48)",
                secret.len()
            ));
        }
        let mut h = Sha256::new();
        h.update(b"kortex session key\0");
        h.update(secret);
        Ok(Self::from_bytes(h.finalize().into()))
    }

    /// A key of this process alone: sign-ins end when it restarts, and no other replica
    /// can open them.
    pub fn random() -> Self {
        Self::from_bytes(random_bytes::<32>())
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        let mut h = Sha256::new();
        h.update(b"kortex session key id\0");
        h.update(bytes);
        let id = crate::catalog::secrets::hex(&h.finalize()[..6]);
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &bytes)
                .unwrap_or_else(|_| unreachable!("32 bytes is an AES-256 key")),
        );
        Self { key, id }
    }

    /// A short fingerprint of the key (not secret): stored with what it sealed, so a
    /// replica with another key can say so rather than fail to open it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `plain`, bound to `context` (the row it belongs to: a sealed value moved to
    /// another row does not open).
    pub fn seal(&self, plain: &[u8], context: &str) -> String {
        let nonce_bytes = random_bytes::<NONCE_LEN>();
        let mut data = plain.to_vec();
        // Sealing in place only fails for inputs beyond AES-GCM's limit (64 GiB).
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .unwrap_or_else(|_| unreachable!("sealed values are small"));
        let mut out = nonce_bytes.to_vec();
        out.extend(data);
        super::jwt::base64url_encode(&out)
    }

    /// Opens what [`seal`](Self::seal) made with this key for `context`; `None` when it
    /// was sealed with another key, for another row, or altered.
    pub fn open(&self, sealed: &str, context: &str) -> Option<Vec<u8>> {
        let bytes = super::jwt::base64url(sealed)?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, data) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_row() {
        let a = SessionKey::from_secret(&[7u8; 40]).unwrap_or_else(|e| panic!("{e}"));
        let same = SessionKey::from_secret(&[7u8; 40]).unwrap_or_else(|e| panic!("{e}"));
        let other = SessionKey::from_secret(&[8u8; 40]).unwrap_or_else(|e| panic!("{e}"));
        let sealed = a.seal(b"refresh-token", "row-1");
        assert!(!sealed.contains("refresh"));
        assert_eq!(
            same.open(&sealed, "row-1").as_deref(),
            Some(&b"refresh-token"[..])
        );
        assert_eq!(a.id(), same.id());
        assert_ne!(a.id(), other.id());
        assert_eq!(other.open(&sealed, "row-1"), None, "another replica's key");
        assert_eq!(a.open(&sealed, "row-2"), None, "moved to another row");
        let mut altered = sealed.into_bytes();
        let last = altered.len() - 2;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            a.open(&String::from_utf8(altered).unwrap_or_default(), "row-1"),
            None
        );
        assert!(SessionKey::from_secret(b"short").is_err());
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 43);
    }
}
