//! Redaction of resolved Secret values (SPEC §1.3): whatever a policy says, the value of
//! every Secret Kortex has resolved is replaced by a placeholder before text from outside
//! (a tool result, an upstream error) reaches a provider, the database or the API.
//!
//! Besides the values themselves, the forms in which a credential commonly comes back are
//! covered: the standard base64 of each value (HTTP basic credentials, Secrets echoed
//! encoded), the value as escaped inside a JSON string, and, for `user:password` values, the password alone. Values shorter than
//! [`MIN_SECRET_LEN`] characters are not searched for: replacing every `a` or `42` in a
//! log would destroy the evidence without protecting anything worth a Secret.

use super::SecretValue;
use aho_corasick::{AhoCorasick, MatchKind};

/// The placeholder a resolved Secret value is replaced with.
pub const SECRET_PLACEHOLDER: &str = "[REDACTED:secret]";
/// Shorter values are not redacted.
pub const MIN_SECRET_LEN: usize = 4;

/// Finds every form of the resolved Secret values in a text, in one pass.
#[derive(Clone, Default)]
pub struct SecretRedactor {
    matcher: Option<AhoCorasick>,
    /// What the matcher finds, for [`SecretRedactor::partial_at_end`].
    forms: std::sync::Arc<[String]>,
}

impl std::fmt::Debug for SecretRedactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretRedactor(<redacted>)")
    }
}

impl SecretRedactor {
    /// A redactor for `values` and their derived forms.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a SecretValue>) -> Self {
        let mut patterns: Vec<String> = Vec::new();
        for value in values {
            let value = value.expose();
            if value.chars().count() < MIN_SECRET_LEN {
                continue;
            }
            patterns.push(value.to_owned());
            patterns.push(base64(value));
            // As it appears inside a JSON string (quotes, backslashes, control characters).
            let escaped = serde_json::Value::from(value).to_string();
            patterns.push(escaped[1..escaped.len() - 1].to_owned());
            if let Some((_, password)) = value.split_once(':') {
                patterns.push(password.to_owned());
            }
        }
        patterns.retain(|p| p.chars().count() >= MIN_SECRET_LEN);
        patterns.sort();
        patterns.dedup();
        if patterns.is_empty() {
            return Self::default();
        }
        // Leftmost-longest: a value and its own prefix both match, the longer one wins.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok();
        Self {
            matcher,
            forms: patterns.into(),
        }
    }

    /// Every stretch of `text` a form covers, as `(start, end)`, and `(start, usize::MAX)`
    /// for a tail that more text could make into one (a proper prefix of a form).
    pub(crate) fn spans(&self, text: &str, out: &mut Vec<(usize, usize)>) {
        let Some(matcher) = &self.matcher else {
            return;
        };
        out.extend(matcher.find_iter(text).map(|m| (m.start(), m.end())));
        let longest = self.forms.iter().map(String::len).max().unwrap_or(0);
        let from = text.len().saturating_sub(longest);
        let tail = (from..text.len())
            .filter(|i| text.is_char_boundary(*i))
            .find(|i| {
                let tail = &text.as_bytes()[*i..];
                self.forms
                    .iter()
                    .any(|f| f.len() > tail.len() && f.as_bytes().starts_with(tail))
            });
        out.extend(tail.map(|i| (i, usize::MAX)));
    }

    /// `text` with every occurrence replaced, and how many there were.
    pub fn redact(&self, text: &str) -> (String, usize) {
        let Some(matcher) = &self.matcher else {
            return (text.to_owned(), 0);
        };
        let mut count = 0;
        let mut out = String::with_capacity(text.len());
        matcher.replace_all_with(text, &mut out, |_, _, dst| {
            count += 1;
            dst.push_str(SECRET_PLACEHOLDER);
            true
        });
        (out, count)
    }

    /// Whether there is anything to find.
    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }
}

/// Standard base64 with padding (RFC 4648 §4) of a text.
pub fn base64(text: &str) -> String {
    base64_bytes(text.as_bytes())
}

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64_bytes(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(values: &[&str]) -> SecretRedactor {
        let values: Vec<SecretValue> = values.iter().map(|v| SecretValue::new(*v)).collect();
        SecretRedactor::new(&values)
    }

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("user:pa55", "dXNlcjpwYTU1"),
        ] {
            assert_eq!(base64(plain), encoded);
        }
    }

    #[test]
    fn values_and_their_derived_forms_are_replaced() {
        let r = redactor(&["sk-live-123456", "ops:pa55word"]);
        let (out, n) = r.redact(
            "key sk-live-123456, header Basic b3BzOnBhNTV3b3Jk, password pa55word, \
             encoded c2stbGl2ZS0xMjM0NTY=",
        );
        assert_eq!(
            out,
            "key [REDACTED:secret], header Basic [REDACTED:secret], password [REDACTED:secret], \
             encoded [REDACTED:secret]"
        );
        assert_eq!(n, 4);
    }

    #[test]
    fn the_longest_value_wins_and_short_values_are_left_alone() {
        let r = redactor(&["abcd", "abcdefgh", "xy"]);
        assert_eq!(
            r.redact("abcdefgh abcd xy").0,
            "[REDACTED:secret] [REDACTED:secret] xy"
        );
        assert!(redactor(&["ab"]).is_empty());
        assert_eq!(redactor(&[]).redact("plain"), ("plain".to_owned(), 0));
    }

    #[test]
    fn json_stays_valid() {
        let r = redactor(&["s3cr\"et"]);
        let text = serde_json::json!({"token": "s3cr\"et", "n": 1}).to_string();
        let (out, n) = r.redact(&text);
        assert_eq!(n, 1);
        let parsed: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        assert_eq!(parsed["token"], SECRET_PLACEHOLDER);
    }
}
