//! Pattern-based redaction (SPEC §1.3, `ChatPolicy.privacy`): recognisable credentials
//! (`redactSecrets`) and personal data (`redactPii`), each replaced by a typed placeholder
//! `[REDACTED:<kind>]`.
//!
//! Every pattern stops at `"` and `\`, and placeholders contain neither, so a replacement
//! inside JSON text never ends a string early or breaks an escape sequence. Patterns are
//! deliberately specific: `redactSecrets` is on by default and must not blank out the
//! ordinary content of logs and manifests (timestamps, names, versions).

use regex::{Captures, Regex};
use std::sync::LazyLock;

/// One kind of thing to find.
struct Pattern {
    kind: &'static str,
    regex: Option<Regex>,
    /// The capture group that is replaced (0 = the whole match).
    group: usize,
    /// Extra check on the matched text (e.g. Luhn), when the regex alone over-matches.
    check: Option<fn(&str) -> bool>,
}

fn pattern(kind: &'static str, re: &str, group: usize, check: Option<fn(&str) -> bool>) -> Pattern {
    // The expressions are constants, checked by `every_pattern_compiles`.
    let regex = Regex::new(re).ok();
    Pattern {
        kind,
        regex,
        group,
        check,
    }
}

/// Credentials (`privacy.redactSecrets`), most specific first.
static CREDENTIALS: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    vec![
        pattern(
            "jwt",
            r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}",
            0,
            None,
        ),
        pattern(
            "aws_access_key",
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",
            0,
            None,
        ),
        pattern(
            "aws_secret_key",
            r#"(?i)(aws_?secret_?access_?key|secretaccesskey)(\\?["']?[ \t]*[:=][ \t]*\\?["']?)([A-Za-z0-9/+=]{40})"#,
            3,
            None,
        ),
        pattern(
            "github_token",
            r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b",
            0,
            None,
        ),
        pattern("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0, None),
        pattern(
            "api_key",
            r"\b(?:sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_-]{20,}|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}|AIza[0-9A-Za-z_-]{35})",
            0,
            None,
        ),
        pattern(
            "bearer_token",
            r"(?i)\b(bearer)([ \t]+)([A-Za-z0-9._~+/-]{20,}=*)",
            3,
            None,
        ),
        pattern(
            "password",
            r#"\b([A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s:/@"'\\\[\]]{1,128}:)([^\s@/"'\\\[\]]{1,256})@"#,
            2,
            None,
        ),
        pattern(
            "password",
            r#"(?i)\b(password|passwd|client_secret|secret_key|x-api-key|api[_-]?key|access_?token|auth_?token|refresh_?token)(\\?["']?[ \t]*[:=][ \t]*\\?["']?)([^\s"',;&\\\[\]{}<>][^\s"',;&\\]{5,})"#,
            3,
            None,
        ),
    ]
});

/// Personal data (`privacy.redactPii`).
static PII: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    vec![
        pattern(
            "email",
            r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b",
            0,
            None,
        ),
        // Card numbers start with 3 to 6 (Amex, Visa, Mastercard, Discover...): long
        // millisecond or nanosecond timestamps that pass the Luhn check by chance do not.
        pattern("card", r"\b[3-6]\d(?:[ -]?\d){11,17}\b", 0, Some(luhn)),
        pattern(
            "phone",
            r"(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\b\d{3}[.-]\d{3}[.-]\d{4})\b",
            0,
            Some(phone_digits),
        ),
        pattern("ip", r"\b(?:\d{1,3}\.){3}\d{1,3}\b", 0, Some(ipv4)),
        pattern(
            "ip",
            r"(?i)\b(?:[0-9a-f]{1,4}:){1,7}(?:(?::[0-9a-f]{1,4}){1,7}|[0-9a-f]{1,4}|:)",
            0,
            Some(ipv6),
        ),
    ]
});

/// What a stream holds back for: a lazy DFA per pattern set that tells, from a position,
/// whether more text could still make a match there (`MatchKind::All`, so every pattern
/// and every length counts; the checks such as Luhn are not applied, so it over-holds).
/// `\b` becomes ASCII `(?-u:\b)`: a Unicode boundary in front of or after an ASCII word
/// character is always an ASCII one, so this never misses a match the Unicode patterns
/// make, and it works on any text without the lazy DFA giving up on non-ASCII bytes.
pub(crate) struct Liveness {
    dfa: regex_automata::hybrid::dfa::DFA,
}

/// A PEM private key as far as [`private_keys`] takes one: the BEGIN line, key material,
/// and the END line that completes it.
const PEM_LIVE: &str = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:-{0,4}[A-Za-z0-9+/=:,\\\s])*(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?";

pub(crate) static CREDENTIALS_LIVE: LazyLock<Option<Liveness>> = LazyLock::new(|| {
    Liveness::new(
        CREDENTIALS
            .iter()
            .filter_map(|p| p.regex.as_ref().map(|r| ascii_boundaries(r.as_str())))
            .chain([PEM_LIVE.to_owned()]),
    )
});

pub(crate) static PII_LIVE: LazyLock<Option<Liveness>> = LazyLock::new(|| {
    Liveness::new(
        PII.iter()
            .filter_map(|p| p.regex.as_ref().map(|r| ascii_boundaries(r.as_str()))),
    )
});

/// `\b` outside classes as `(?-u:\b)`.
fn ascii_boundaries(re: &str) -> String {
    let mut out = String::with_capacity(re.len() + 16);
    let mut chars = re.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('b') => out.push_str("(?-u:\\b)"),
            Some(next) => {
                out.push(c);
                out.push(next);
            }
            None => out.push(c),
        }
    }
    out
}

impl Liveness {
    fn new(patterns: impl Iterator<Item = String>) -> Option<Self> {
        use regex_automata::hybrid::dfa::DFA;
        let patterns: Vec<String> = patterns.collect();
        let dfa = DFA::builder()
            .configure(DFA::config().match_kind(regex_automata::MatchKind::All))
            .build_many(&patterns)
            .ok()?;
        Some(Self { dfa })
    }

    pub(crate) fn cache(&self) -> regex_automata::hybrid::dfa::Cache {
        self.dfa.create_cache()
    }

    /// Every stretch of `text` from `from` on (`from` a character boundary; `text[..from]`
    /// is look-behind only, for `\b`) that a match might cover: `(start, end)` for the
    /// longest match starting there that the text so far makes, and `(start, usize::MAX)`
    /// where more text could still make or extend one (the last stretch listed).
    pub(crate) fn spans(
        &self,
        cache: &mut regex_automata::hybrid::dfa::Cache,
        text: &str,
        from: usize,
        out: &mut Vec<(usize, usize)>,
    ) {
        use regex_automata::{Anchored, Input};
        let bytes = text.as_bytes();
        for start in (from..bytes.len()).filter(|i| text.is_char_boundary(*i)) {
            let input = Input::new(bytes)
                .span(start..bytes.len())
                .anchored(Anchored::Yes);
            // Any failure of the lazy DFA counts as "could match": it holds, never leaks.
            let Ok(mut state) = self.dfa.start_state_forward(cache, &input) else {
                out.push((start, usize::MAX));
                return;
            };
            let mut end = None;
            let mut at = start;
            let alive = loop {
                let Some(b) = bytes.get(at) else {
                    break true;
                };
                match self.dfa.next_state(cache, state, *b) {
                    Ok(next) if next.is_quit() => break true,
                    Ok(next) => {
                        // Matches are reported one byte late: this one ends at `at`.
                        if next.is_match() {
                            end = Some(at);
                        }
                        if next.is_dead() {
                            break false;
                        }
                        state = next;
                    }
                    Err(_) => {
                        cache.reset(&self.dfa);
                        break true;
                    }
                }
                at += 1;
            };
            if alive {
                // Nothing from here on can be sent yet: no need to look further.
                out.push((start, usize::MAX));
                return;
            } else if let Some(end) = end.filter(|e| *e > start) {
                out.push((start, end));
            }
        }
    }
}

/// Whether the digits of `text` pass the Luhn check (payment card numbers).
pub fn luhn(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 1 {
                let d = d * 2;
                if d > 9 { d - 9 } else { d }
            } else {
                *d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

fn phone_digits(text: &str) -> bool {
    (8..=15).contains(&text.chars().filter(char::is_ascii_digit).count())
}

fn ipv4(text: &str) -> bool {
    text.parse::<std::net::Ipv4Addr>().is_ok()
}

fn ipv6(text: &str) -> bool {
    // Enough digits that `std::fmt` or a clock time is never taken for an address.
    text.parse::<std::net::Ipv6Addr>().is_ok()
        && text.chars().filter(char::is_ascii_hexdigit).count() >= 4
        && text.matches(':').count() >= 2
}

/// The placeholder for `kind`.
pub fn placeholder(kind: &str) -> String {
    format!("[REDACTED:{kind}]")
}

/// Replaces private key blocks (PEM), with or without their END line (a truncated log
/// still hides the key material that is there).
fn private_keys(text: &str, count: &mut usize) -> Option<String> {
    static BEGIN: LazyLock<Option<Regex>> =
        LazyLock::new(|| Regex::new(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----").ok());
    static END: LazyLock<Option<Regex>> =
        LazyLock::new(|| Regex::new(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----").ok());
    let (begin, end) = (BEGIN.as_ref()?, END.as_ref()?);
    begin.find(text)?;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(m) = begin.find(rest) {
        out.push_str(&rest[..m.start()]);
        let after = &rest[m.end()..];
        let stop = match end.find(after) {
            // Only key material (base64, PEM headers, whitespace and escaped newlines) may
            // lie between the lines; otherwise the END line belongs to something else.
            Some(e) if after[..e.start()].chars().all(pem_body_char) => e.end(),
            _ => {
                let mut n = after
                    .find(|c: char| !pem_body_char(c))
                    .unwrap_or(after.len());
                // Never keep half of an escape: give back an odd trailing backslash.
                let slashes = after[..n].chars().rev().take_while(|c| *c == '\\').count();
                if slashes % 2 == 1 {
                    n -= 1;
                }
                n
            }
        };
        out.push_str(&placeholder("private_key"));
        *count += 1;
        rest = &after[stop..];
    }
    out.push_str(rest);
    Some(out)
}

fn pem_body_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '+' | '/' | '=' | ':' | ',' | '-' | '\\')
        || c.is_whitespace()
}

fn apply(patterns: &[Pattern], text: &str, count: &mut usize) -> Option<String> {
    let mut current: Option<String> = None;
    for p in patterns {
        let input = current.as_deref().unwrap_or(text);
        let Some(regex) = p.regex.as_ref().filter(|r| r.is_match(input)) else {
            continue;
        };
        let mut n = 0;
        let replaced = regex.replace_all(input, |caps: &Captures<'_>| {
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let Some(target) = caps.get(p.group) else {
                return whole.to_owned();
            };
            if p.check.is_some_and(|check| !check(target.as_str())) {
                return whole.to_owned();
            }
            n += 1;
            let (start, end) = (caps.get(0).map_or(0, |m| m.start()), target.start());
            let whole_start = start;
            let mut out = String::with_capacity(whole.len());
            out.push_str(&whole[..end - whole_start]);
            out.push_str(&placeholder(p.kind));
            out.push_str(&whole[target.end() - whole_start..]);
            out
        });
        if n > 0 {
            *count += n;
            current = Some(replaced.into_owned());
        }
    }
    current
}

/// `text` with the credentials and/or personal data found replaced, and how many; `None`
/// for the text when nothing was found.
pub fn redact(text: &str, credentials: bool, pii: bool) -> (Option<String>, usize) {
    let mut count = 0;
    let mut current: Option<String> = None;
    if credentials {
        current = private_keys(text, &mut count);
        if let Some(next) = apply(&CREDENTIALS, current.as_deref().unwrap_or(text), &mut count) {
            current = Some(next);
        }
    }
    if pii && let Some(next) = apply(&PII, current.as_deref().unwrap_or(text), &mut count) {
        current = Some(next);
    }
    (current, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(text: &str) -> String {
        redact(text, true, false)
            .0
            .unwrap_or_else(|| text.to_owned())
    }

    fn pii(text: &str) -> String {
        redact(text, false, true)
            .0
            .unwrap_or_else(|| text.to_owned())
    }

    #[test]
    fn every_pattern_compiles() {
        for p in CREDENTIALS.iter().chain(PII.iter()) {
            assert!(p.regex.is_some(), "{} does not compile", p.kind);
        }
    }

    #[test]
    fn credentials_get_typed_placeholders() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJlLXZhbHVl";
        assert_eq!(
            creds(&format!("token {jwt} end")),
            "token [REDACTED:jwt] end"
        );
        assert_eq!(
            creds("Authorization: Bearer abcdef0123456789xyz0123"),
            "Authorization: Bearer [REDACTED:bearer_token]"
        );
        assert_eq!(
            creds("key AKIAIOSFODNN7EXAMPLE used"),
            "key [REDACTED:aws_access_key] used"
        );
        assert_eq!(
            creds("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            "aws_secret_access_key = [REDACTED:aws_secret_key]"
        );
        assert_eq!(
            creds("ghp_0123456789abcdefghijABCDEFGHIJ012345 and xoxb-1234567890-abcdef"),
            "[REDACTED:github_token] and [REDACTED:slack_token]"
        );
        assert_eq!(
            creds("X-API-Key: 9f8e7d6c5b4a39281706"),
            "X-API-Key: [REDACTED:password]"
        );
        assert_eq!(
            creds("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx"),
            "OPENAI_API_KEY=[REDACTED:api_key]"
        );
        assert_eq!(
            creds("dsn postgres://shop:hunter2pw@db.shop:5432/orders ok"),
            "dsn postgres://shop:[REDACTED:password]@db.shop:5432/orders ok"
        );
        assert_eq!(
            creds(r#"{"password": "correct-horse", "user": "ops"}"#),
            r#"{"password": "[REDACTED:password]", "user": "ops"}"#
        );
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nabc+/=\n-----END RSA PRIVATE KEY-----\nafter";
        assert_eq!(creds(pem), "[REDACTED:private_key]\nafter");
        // Cut off before its END line: the material that is there is hidden, and an escape
        // sequence of the surrounding JSON is never split.
        assert_eq!(
            creds("x -----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n\"}"),
            "x [REDACTED:private_key]\"}"
        );
        assert_eq!(
            creds("x -----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\\"}"),
            "x [REDACTED:private_key]\\\"}"
        );
    }

    #[test]
    fn ordinary_operations_text_is_left_alone() {
        for text in [
            "2026-11-23T07:13:32Z pod api-7f9c started in 1.25s, version 1.2.3",
            "automountServiceAccountToken: true",
            "secretKeyRef: {name: llm-keys, key: anthropic}",
            "token: true",
            "std::fmt::Display at 10:30:45",
            "image: registry.example.com/shop/api:v1.4.2@sha256:0123abcd",
            "password: [REDACTED:secret]",
            "Bearer authentication is disabled for this listener",
            "PWD=/home/app",
        ] {
            assert_eq!(redact(text, true, false), (None, 0), "{text}");
        }
        for text in [
            "2026-11-23 10:30:45.123 took 1234 ms",
            "std::fmt::Display",
            "replicas 3/3, revision 12",
            "version 1.2.3",
            "ts=1795418012500 and 1795418012500123456",
        ] {
            assert_eq!(redact(text, false, true), (None, 0), "{text}");
        }
    }

    #[test]
    fn personal_data_gets_typed_placeholders() {
        assert_eq!(
            pii("mail jane.doe+ops@example.co.uk now"),
            "mail [REDACTED:email] now"
        );
        assert_eq!(pii("card 4111 1111 1111 1111."), "card [REDACTED:card].");
        assert_eq!(
            pii("not a card 4111 1111 1111 1112"),
            "not a card 4111 1111 1111 1112"
        );
        assert_eq!(pii("call +49 30 1234 5678"), "call [REDACTED:phone]");
        assert_eq!(pii("call (415) 555-0132"), "call [REDACTED:phone]");
        assert_eq!(
            pii("from 10.1.2.3 to 2001:db8::8a2e:370:7334"),
            "from [REDACTED:ip] to [REDACTED:ip]"
        );
        assert_eq!(pii("999.1.2.3"), "999.1.2.3");
    }

    #[test]
    fn luhn_checks_card_numbers() {
        assert!(luhn("4111111111111111"));
        assert!(luhn("5500-0000-0000-0004"));
        assert!(!luhn("4111111111111112"));
        assert!(!luhn("1234"));
    }
}
