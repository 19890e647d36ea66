//! ID tokens verified per OpenID Connect Core 1.0 §3.1.3.7, pure: the signature with a key
//! of the provider's JWK Set (RS256/384/512, PS256/384/512, ES256, ES384 — never `none`,
//! never an HMAC, so a public key can never be used as a shared secret), then `iss`, `aud`
//! (and `azp` when there are several audiences), `exp`, `iat` and `nbf` with a small skew,
//! and the `nonce` of the sign-in that asked for it.
//!
//! Fetching and caching the key set (and fetching it again, once, for an unknown `kid`) is
//! the caller's: [`verify`] says [`TokenError::UnknownKey`] for that case.

use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// How far the clocks of Kortex and the provider may disagree, in seconds.
pub const SKEW: i64 = 60;

/// A public key of the provider's JWK Set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jwk {
    /// Its `kid`, if it has one.
    pub kid: Option<String>,
    /// The algorithm it is restricted to (`alg`), if any.
    pub alg: Option<String>,
    key: Key,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point (`0x04 || x || y`) on `crv`.
    Ec {
        crv: String,
        point: Vec<u8>,
    },
}

/// The provider's keys (`jwks_uri`), the signing ones Kortex can use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    /// The keys.
    pub keys: Vec<Jwk>,
}

impl KeySet {
    /// Reads a JWK Set document: RSA and EC (P-256, P-384) keys meant for signatures;
    /// others (encryption keys, other curves, symmetric keys) are left out.
    pub fn parse(document: &Value) -> Result<Self, String> {
        let keys = document["keys"]
            .as_array()
            .ok_or("the JWK Set has no keys array")?;
        let mut out = Vec::new();
        for k in keys {
            if k["use"].as_str().is_some_and(|u| u != "sig") {
                continue;
            }
            let field = |name: &str| k[name].as_str().and_then(base64url);
            let key = match k["kty"].as_str() {
                Some("RSA") => match (field("n"), field("e")) {
                    (Some(n), Some(e)) => Key::Rsa { n, e },
                    _ => continue,
                },
                Some("EC") => match (k["crv"].as_str(), field("x"), field("y")) {
                    (Some(crv @ ("P-256" | "P-384")), Some(x), Some(y)) => {
                        let mut point = vec![4u8];
                        point.extend(x);
                        point.extend(y);
                        Key::Ec {
                            crv: crv.to_owned(),
                            point,
                        }
                    }
                    _ => continue,
                },
                _ => continue,
            };
            out.push(Jwk {
                kid: k["kid"].as_str().map(str::to_owned),
                alg: k["alg"].as_str().map(str::to_owned),
                key,
            });
        }
        Ok(Self { keys: out })
    }
}

/// What the token must say.
#[derive(Clone, Debug)]
pub struct Expect<'a> {
    /// The issuer, exactly as discovery gave it.
    pub issuer: &'a str,
    /// Kortex's client id: it must be an audience (and the `azp` when there are several).
    pub client_id: &'a str,
    /// Another audience that is accepted in place of the client id (an `audience` setting).
    pub audience: Option<&'a str>,
    /// The nonce of the sign-in that asked for this token (`None` only for a token that is
    /// not the answer to a sign-in, such as one a refresh returned).
    pub nonce: Option<&'a str>,
    /// Now, in Unix seconds.
    pub now: i64,
}

/// A verified token's claims.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// `sub`.
    pub subject: String,
    /// `exp`, Unix seconds.
    pub expires: i64,
    /// Every claim, as sent.
    pub claims: Value,
}

/// Why a token is refused. The messages name what was wrong, never the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a JWS compact serialisation with JSON header and claims.
    #[error("not a signed JWT: {0}")]
    Malformed(String),
    /// `none`, an HMAC or an algorithm Kortex does not verify.
    #[error(
        "the token's algorithm {0} is not accepted (RS256/384/512, PS256/384/512, ES256, ES384)"
    )]
    Algorithm(String),
    /// No key of the set has the token's `kid` (fetch the set again, once).
    #[error("no key {0} in the provider's key set")]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// Another issuer.
    #[error("the token was issued by {found}, not {expected}")]
    Issuer {
        /// Expected.
        expected: String,
        /// Found.
        found: String,
    },
    /// Not for Kortex.
    #[error("the token is for {0}, not this client")]
    Audience(String),
    /// Expired (beyond the skew).
    #[error("the token expired {0} s ago")]
    Expired(i64),
    /// Issued in the future or not valid yet (beyond the skew: a clock is wrong).
    #[error(
        "the token is not valid for another {0} s: check the clocks of Kortex and the provider"
    )]
    NotYet(i64),
    /// Not the answer to this sign-in.
    #[error("the token's nonce does not match this sign-in")]
    Nonce,
}

/// The claims of `token` once its signature verifies with one of `keys` (an accepted
/// algorithm, the key its `kid` names).
fn signed_claims(token: &str, keys: &KeySet) -> Result<Value, TokenError> {
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "three dot-separated parts expected".into(),
        ));
    };
    let json = |part: &str, what: &str| -> Result<Value, TokenError> {
        let bytes = base64url(part)
            .ok_or_else(|| TokenError::Malformed(format!("{what} is not base64url")))?;
        serde_json::from_slice(&bytes)
            .map_err(|_| TokenError::Malformed(format!("{what} is not JSON")))
    };
    let header = json(h, "the header")?;
    let alg = header["alg"].as_str().unwrap_or("none").to_owned();
    let (verifier, family) = algorithm(&alg)?;
    let kid = header["kid"].as_str();
    let candidates: Vec<&Jwk> = keys
        .keys
        .iter()
        .filter(|k| kid.is_none_or(|kid| k.kid.as_deref() == Some(kid)))
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == alg))
        .filter(|k| {
            matches!(
                (&k.key, family),
                (Key::Rsa { .. }, Family::Rsa) | (Key::Ec { .. }, Family::Ec(_))
            )
        })
        .collect();
    if candidates.is_empty() {
        return Err(TokenError::UnknownKey(kid.unwrap_or("(no kid)").to_owned()));
    }
    let signature = base64url(s)
        .ok_or_else(|| TokenError::Malformed("the signature is not base64url".into()))?;
    let message = &token.as_bytes()[..h.len() + 1 + c.len()];
    let verified = candidates.iter().any(|k| match (&k.key, family) {
        (Key::Rsa { n, e }, Family::Rsa) => RsaPublicKeyComponents { n, e }
            .verify(verifier.rsa(), message, &signature)
            .is_ok(),
        (Key::Ec { crv, point }, Family::Ec(want)) if crv == want => {
            UnparsedPublicKey::new(verifier.ecdsa(), point)
                .verify(message, &signature)
                .is_ok()
        }
        _ => false,
    });
    if !verified {
        return Err(TokenError::Signature);
    }
    json(c, "the claims")
}

/// Verifies `token` with `keys` against `expect`; its claims when every check passes.
pub fn verify(token: &str, keys: &KeySet, expect: &Expect<'_>) -> Result<Verified, TokenError> {
    let claims = signed_claims(token, keys)?;
    check_claims(&claims, expect)?;
    Ok(Verified {
        subject: claims["sub"].as_str().unwrap_or_default().to_owned(),
        expires: claims["exp"].as_i64().unwrap_or_default(),
        claims,
    })
}

/// Verifies an OAuth access token presented to Kortex as a resource server (RFC 9068, the
/// MCP authorization spec): signed by one of `keys`, issued by `issuer`, for one of
/// `resources` (its `aud`: a token for anyone else is refused, never passed on), not
/// expired, with a subject. Unlike an ID token, its `azp` is the client that obtained it.
pub fn verify_access(
    token: &str,
    keys: &KeySet,
    issuer: &str,
    resources: &[&str],
    now: i64,
) -> Result<Verified, TokenError> {
    let claims = signed_claims(token, keys)?;
    let found = claims["iss"].as_str().unwrap_or_default();
    if found != issuer {
        return Err(TokenError::Issuer {
            expected: issuer.to_owned(),
            found: found.to_owned(),
        });
    }
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(a) => vec![a.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences.iter().any(|a| resources.contains(a)) {
        return Err(TokenError::Audience(audiences.join(", ")));
    }
    check_times(&claims, now)?;
    Ok(Verified {
        subject: claims["sub"].as_str().unwrap_or_default().to_owned(),
        expires: claims["exp"].as_i64().unwrap_or_default(),
        claims,
    })
}

/// `sub`, `exp`, `iat` and `nbf`, with [`SKEW`].
fn check_times(claims: &Value, now: i64) -> Result<(), TokenError> {
    if claims["sub"].as_str().is_none_or(str::is_empty) {
        return Err(TokenError::Malformed("the claims have no sub".into()));
    }
    let exp = claims["exp"]
        .as_i64()
        .ok_or_else(|| TokenError::Malformed("the claims have no exp".into()))?;
    if now > exp + SKEW {
        return Err(TokenError::Expired(now - exp));
    }
    for key in ["iat", "nbf"] {
        if let Some(t) = claims[key].as_i64()
            && t > now + SKEW
        {
            return Err(TokenError::NotYet(t - now));
        }
    }
    Ok(())
}

/// The claims' checks, after the signature (OIDC Core §3.1.3.7 steps 2–11).
fn check_claims(claims: &Value, expect: &Expect<'_>) -> Result<(), TokenError> {
    let found = claims["iss"].as_str().unwrap_or_default();
    if found != expect.issuer {
        return Err(TokenError::Issuer {
            expected: expect.issuer.to_owned(),
            found: found.to_owned(),
        });
    }
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(a) => vec![a.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let ours = |a: &&str| *a == expect.client_id || Some(*a) == expect.audience;
    if !audiences.iter().any(ours) {
        return Err(TokenError::Audience(audiences.join(", ")));
    }
    // Several audiences: the party it was issued to must be Kortex.
    if let Some(azp) = claims["azp"]
        .as_str()
        .or((audiences.len() > 1).then_some(""))
        && azp != expect.client_id
    {
        return Err(TokenError::Audience(format!(
            "{} (azp {azp:?})",
            audiences.join(", ")
        )));
    }
    check_times(claims, expect.now)?;
    if claims["iat"].as_i64().is_none() {
        return Err(TokenError::Malformed("the claims have no iat".into()));
    }
    if let Some(nonce) = expect.nonce
        && claims["nonce"].as_str() != Some(nonce)
    {
        return Err(TokenError::Nonce);
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Family {
    Rsa,
    Ec(&'static str),
}

#[derive(Clone, Copy)]
enum Verifier {
    Rsa(&'static signature::RsaParameters),
    Ecdsa(&'static signature::EcdsaVerificationAlgorithm),
}

impl Verifier {
    fn rsa(self) -> &'static signature::RsaParameters {
        match self {
            Self::Rsa(p) => p,
            Self::Ecdsa(_) => &signature::RSA_PKCS1_2048_8192_SHA256,
        }
    }

    fn ecdsa(self) -> &'static signature::EcdsaVerificationAlgorithm {
        match self {
            Self::Ecdsa(a) => a,
            Self::Rsa(_) => &signature::ECDSA_P256_SHA256_FIXED,
        }
    }
}

/// The verifier of `alg`, or why it is refused.
fn algorithm(alg: &str) -> Result<(Verifier, Family), TokenError> {
    use signature as s;
    Ok(match alg {
        "RS256" => (Verifier::Rsa(&s::RSA_PKCS1_2048_8192_SHA256), Family::Rsa),
        "RS384" => (Verifier::Rsa(&s::RSA_PKCS1_2048_8192_SHA384), Family::Rsa),
        "RS512" => (Verifier::Rsa(&s::RSA_PKCS1_2048_8192_SHA512), Family::Rsa),
        "PS256" => (Verifier::Rsa(&s::RSA_PSS_2048_8192_SHA256), Family::Rsa),
        "PS384" => (Verifier::Rsa(&s::RSA_PSS_2048_8192_SHA384), Family::Rsa),
        "PS512" => (Verifier::Rsa(&s::RSA_PSS_2048_8192_SHA512), Family::Rsa),
        "ES256" => (
            Verifier::Ecdsa(&s::ECDSA_P256_SHA256_FIXED),
            Family::Ec("P-256"),
        ),
        "ES384" => (
            Verifier::Ecdsa(&s::ECDSA_P384_SHA384_FIXED),
            Family::Ec("P-384"),
        ),
        other => return Err(TokenError::Algorithm(other.to_owned())),
    })
}

/// Encodes base64url without padding (RFC 7515 §2).
pub fn base64url_encode(bytes: &[u8]) -> String {
    crate::catalog::secret_redactor::base64_bytes(bytes)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// Decodes base64url without padding (RFC 7515 §2); `None` for anything else.
pub fn base64url(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be zero padding of the last character.
    (buffer == 0 && bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        crate::catalog::secret_redactor::base64_bytes(bytes)
            .trim_end_matches('=')
            .replace('+', "-")
            .replace('/', "_")
    }

    /// A P-256 key pair, its JWK Set (kid `k1`), and a signer of claims with a header.
    fn provider() -> (EcdsaKeyPair, KeySet) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap_or_else(|e| panic!("{e}"));
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap_or_else(|e| panic!("{e}"));
        let point = pair.public_key().as_ref();
        let (x, y) = point[1..].split_at(32);
        let set = KeySet::parse(&json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "x": b64(x), "y": b64(y)},
            {"kty": "oct", "kid": "hmac", "k": b64(b"shared")},
        ]}))
        .unwrap_or_else(|e| panic!("{e}"));
        (pair, set)
    }

    fn sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let message = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = pair
            .sign(&SystemRandom::new(), message.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        format!("{message}.{}", b64(sig.as_ref()))
    }

    const NOW: i64 = 1_800_000_000;

    fn claims() -> Value {
        json!({"iss": "https://idp.example", "aud": "kortex", "sub": "u1", "exp": NOW + 300,
            "iat": NOW - 10, "nonce": "n-1", "email": "alice@example.com", "groups": ["sre", "dev"]})
    }

    fn expect() -> Expect<'static> {
        Expect {
            issuer: "https://idp.example",
            client_id: "kortex",
            audience: None,
            nonce: Some("n-1"),
            now: NOW,
        }
    }

    #[test]
    fn a_token_from_the_provider_for_this_sign_in_is_accepted() {
        let (pair, set) = provider();
        let token = sign(&pair, &json!({"alg": "ES256", "kid": "k1"}), &claims());
        let v = verify(&token, &set, &expect()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.subject, "u1");
        assert_eq!(v.claims["groups"], json!(["sre", "dev"]));
        assert_eq!(
            set.keys.len(),
            1,
            "the symmetric key is not a signing key Kortex uses"
        );
    }

    #[test]
    fn hostile_tokens_are_refused_with_the_reason() {
        let (pair, set) = provider();
        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = claims();
            f(&mut c);
            sign(&pair, &json!({"alg": "ES256", "kid": "k1"}), &c)
        };
        let cases: Vec<(String, TokenError)> = vec![
            (
                with(&|c| c["iss"] = json!("https://evil.example")),
                TokenError::Issuer {
                    expected: "https://idp.example".into(),
                    found: "https://evil.example".into(),
                },
            ),
            (
                with(&|c| c["aud"] = json!("someone-else")),
                TokenError::Audience("someone-else".into()),
            ),
            (
                with(&|c| c["exp"] = json!(NOW - 120)),
                TokenError::Expired(120),
            ),
            (
                with(&|c| c["iat"] = json!(NOW + 600)),
                TokenError::NotYet(600),
            ),
            (with(&|c| c["nonce"] = json!("n-2")), TokenError::Nonce),
            (
                with(&|c| {
                    c.as_object_mut().map(|m| m.remove("nonce"));
                }),
                TokenError::Nonce,
            ),
            (
                with(&|c| {
                    c["aud"] = json!(["kortex", "other"]);
                    c["azp"] = json!("other");
                }),
                TokenError::Audience("kortex, other (azp \"other\")".into()),
            ),
        ];
        for (token, want) in cases {
            assert_eq!(verify(&token, &set, &expect()), Err(want));
        }
        // Within the skew: accepted.
        assert!(verify(&with(&|c| c["exp"] = json!(NOW - 30)), &set, &expect()).is_ok());
        assert!(
            verify(
                &with(&|c| c["aud"] = json!(["kortex", "other"])),
                &set,
                &expect()
            )
            .is_err(),
            "several audiences need azp"
        );
        assert!(
            verify(
                &with(&|c| {
                    c["aud"] = json!(["kortex", "other"]);
                    c["azp"] = json!("kortex");
                }),
                &set,
                &expect()
            )
            .is_ok()
        );
    }

    #[test]
    fn forged_signatures_and_algorithms_are_refused() {
        let (pair, set) = provider();
        let good = sign(&pair, &json!({"alg": "ES256", "kid": "k1"}), &claims());
        // alg none: no signature at all.
        let (h, c) = (
            b64(br#"{"alg":"none"}"#),
            b64(claims().to_string().as_bytes()),
        );
        assert_eq!(
            verify(&format!("{h}.{c}."), &set, &expect()),
            Err(TokenError::Algorithm("none".into()))
        );
        // HS256 "signed" with the public key as the secret.
        let h = b64(br#"{"alg":"HS256","kid":"k1"}"#);
        assert_eq!(
            verify(&format!("{h}.{c}.AAAA"), &set, &expect()),
            Err(TokenError::Algorithm("HS256".into()))
        );
        // Claims changed after signing.
        let mut parts: Vec<&str> = good.split('.').collect();
        let mut changed = claims();
        changed["sub"] = json!("admin");
        let forged = b64(changed.to_string().as_bytes());
        parts[1] = &forged;
        assert_eq!(
            verify(&parts.join("."), &set, &expect()),
            Err(TokenError::Signature)
        );
        // Another provider's key, and a kid the set does not have.
        let (other, _) = provider();
        assert_eq!(
            verify(
                &sign(&other, &json!({"alg": "ES256", "kid": "k1"}), &claims()),
                &set,
                &expect()
            ),
            Err(TokenError::Signature)
        );
        assert_eq!(
            verify(
                &sign(&pair, &json!({"alg": "ES256", "kid": "k9"}), &claims()),
                &set,
                &expect()
            ),
            Err(TokenError::UnknownKey("k9".into()))
        );
        // An RSA algorithm where the set has only an EC key.
        assert_eq!(
            verify(
                &sign(&pair, &json!({"alg": "RS256", "kid": "k1"}), &claims()),
                &set,
                &expect()
            ),
            Err(TokenError::UnknownKey("k1".into()))
        );
        assert!(matches!(
            verify("a.b", &set, &expect()),
            Err(TokenError::Malformed(_))
        ));
    }

    /// RS256, what most providers sign with: a 2048-bit key from `openssl` (skipped, saying
    /// so, where there is none).
    #[test]
    fn an_rs256_token_verifies_with_its_modulus_and_exponent() {
        use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
        let Ok(out) = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-outform",
                "DER",
            ])
            .output()
        else {
            eprintln!("skipped: no openssl to make an RSA key");
            return;
        };
        // OpenSSL 3 writes a PKCS#1 RSAPrivateKey here; others may write PKCS#8.
        let Ok(pair) =
            RsaKeyPair::from_der(&out.stdout).or_else(|_| RsaKeyPair::from_pkcs8(&out.stdout))
        else {
            eprintln!("skipped: openssl gave no RSA key ring reads");
            return;
        };
        // The public key is DER `SEQUENCE { INTEGER n, INTEGER e }`.
        let der = pair.public().as_ref().to_vec();
        let read = |at: &mut usize| -> Vec<u8> {
            let tag_len = |at: &mut usize| {
                *at += 1;
                let first = der[*at] as usize;
                *at += 1;
                if first < 0x80 {
                    return first;
                }
                let mut len = 0;
                for _ in 0..(first & 0x7f) {
                    len = (len << 8) | der[*at] as usize;
                    *at += 1;
                }
                len
            };
            let len = tag_len(at);
            let value = der[*at..*at + len].to_vec();
            *at += len;
            let skip = value.iter().take_while(|b| **b == 0).count();
            value[skip..].to_vec()
        };
        let mut at = 0;
        at += 1;
        let first = der[at] as usize;
        at += 1 + if first < 0x80 { 0 } else { first & 0x7f };
        let n = read(&mut at);
        let e = read(&mut at);
        let set = KeySet::parse(&json!({"keys": [{"kty": "RSA", "kid": "r1", "alg": "RS256", "n": b64(&n), "e": b64(&e)}]}))
            .unwrap_or_else(|e| panic!("{e}"));
        let message = format!(
            "{}.{}",
            b64(br#"{"alg":"RS256","kid":"r1"}"#),
            b64(claims().to_string().as_bytes())
        );
        let mut sig = vec![0; pair.public().modulus_len()];
        pair.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            message.as_bytes(),
            &mut sig,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let token = format!("{message}.{}", b64(&sig));
        assert_eq!(
            verify(&token, &set, &expect()).map(|v| v.subject),
            Ok("u1".into())
        );
        // The same key declared for another algorithm is not used for this one.
        let pinned = KeySet::parse(&json!({"keys": [{"kty": "RSA", "kid": "r1", "alg": "PS256", "n": b64(&n), "e": b64(&e)}]}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            verify(&token, &pinned, &expect()),
            Err(TokenError::UnknownKey("r1".into()))
        );
    }

    #[test]
    fn base64url_is_strict() {
        assert_eq!(base64url("aGVsbG8"), Some(b"hello".to_vec()));
        assert_eq!(base64url("-_8"), Some(vec![0xfb, 0xff]));
        assert_eq!(base64url("a+b"), None);
        assert_eq!(base64url("aGVsbG9"), None, "non-zero leftover bits");
    }
}
