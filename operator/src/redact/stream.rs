//! Redaction of text that arrives in pieces: a streamed answer is sent as it comes, yet what
//! is sent must never show what the stored copy (the whole text, redacted) hides.
//!
//! A piece is sent only up to the first position from which more text could still make a
//! match: a credential or personal-data pattern that could start there and grow (decided
//! by a lazy DFA over every pattern, [`patterns::Liveness`]), or the beginning of a resolved
//! Secret value. `password: `, `Bearer `, `-----BEGIN`, a run of digits or the first
//! characters of a key therefore wait until the text after them settles it. What is sent
//! is final, so each piece is redacted on its own.
//!
//! The hold is bounded: once more than [`MAX_HOLD`] bytes wait, they are sent redacted as
//! they stand, and are kept so that what follows is redacted together with them (a long
//! key keeps its placeholder, and the rest of it is swallowed). A run that could still be
//! part of a match after [`MAX_TRACKED`] bytes is let go: beyond that, text is redacted in
//! [`MAX_HOLD`]-byte pieces.

use super::{Redactor, patterns};
use regex_automata::hybrid::dfa::Cache;

/// How much text may wait for a possible match before it is sent anyway.
pub const MAX_HOLD: usize = 8 * 1024;
/// How long a run that could still be part of one match is followed.
pub const MAX_TRACKED: usize = 64 * 1024;

/// One stream's redaction.
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    /// Received and not final yet.
    pending: String,
    /// The redaction of `pending` already sent (only after a hold overflowed).
    sent: String,
    /// The last character before `pending` (look-behind for `\b`).
    before: String,
    credentials: Option<Cache>,
    pii: Option<Cache>,
}

impl<'a> StreamRedactor<'a> {
    pub fn new(redactor: &'a Redactor) -> Self {
        let cache = |on: bool, live: &Option<patterns::Liveness>| {
            live.as_ref().filter(|_| on).map(patterns::Liveness::cache)
        };
        Self {
            redactor,
            pending: String::new(),
            sent: String::new(),
            before: String::new(),
            credentials: cache(redactor.credentials, &patterns::CREDENTIALS_LIVE),
            pii: cache(redactor.pii, &patterns::PII_LIVE),
        }
    }

    /// Adds a piece of the text.
    pub fn push(&mut self, piece: &str) {
        self.pending.push_str(piece);
    }

    /// How many bytes wait.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether text waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// What may be sent now (possibly nothing).
    pub fn ready(&mut self) -> String {
        if self.redactor.is_noop() {
            return std::mem::take(&mut self.pending);
        }
        let cut = self.settled();
        let mut out = self.release(cut);
        if self.pending.len() > MAX_HOLD {
            let whole = self.redactor.text(&self.pending).0;
            out.push_str(continuation(&whole, &self.sent));
            if self.pending.len() > MAX_TRACKED {
                self.sent.clear();
                self.before = last_char(&self.pending);
                self.pending.clear();
            } else {
                self.sent = whole;
            }
        }
        out
    }

    /// Everything left, at the end of the text.
    pub fn finish(&mut self) -> String {
        let all = self.pending.len();
        self.release(all)
    }

    /// Sends `pending[..cut]`, which is final.
    fn release(&mut self, cut: usize) -> String {
        if cut == 0 {
            return String::new();
        }
        let rest = self.pending.split_off(cut);
        let settled = std::mem::replace(&mut self.pending, rest);
        let redacted = self.redactor.text(&settled).0;
        let out = continuation(&redacted, &self.sent).to_owned();
        self.sent.clear();
        self.before = last_char(&settled);
        out
    }

    /// How much of `pending` no further text can change the redaction of: up to the first
    /// position from which a match could still grow, and never inside a match.
    fn settled(&mut self) -> usize {
        let mut spans = Vec::new();
        self.redactor.secrets.spans(&self.pending, &mut spans);
        let text = format!("{}{}", self.before, self.pending);
        let offset = self.before.len();
        for (cache, live) in [
            (&mut self.credentials, &patterns::CREDENTIALS_LIVE),
            (&mut self.pii, &patterns::PII_LIVE),
        ] {
            if let (Some(cache), Some(live)) = (cache.as_mut(), live.as_ref()) {
                let first = spans.len();
                live.spans(cache, &text, offset, &mut spans);
                for span in &mut spans[first..] {
                    span.0 -= offset;
                    span.1 = span.1.saturating_sub(offset);
                }
            }
        }
        let mut cut = self.pending.len();
        while let Some(start) = spans
            .iter()
            .filter(|(start, end)| *start < cut && *end > cut)
            .map(|(start, _)| *start)
            .min()
        {
            cut = start;
        }
        cut
    }
}

/// What of `redacted` follows what was sent of it already (after a hold overflowed).
fn continuation<'t>(redacted: &'t str, sent: &str) -> &'t str {
    if let Some(rest) = redacted.strip_prefix(sent) {
        return rest;
    }
    // A match grew back over text already sent: continue after as many bytes.
    let mut at = sent.len().min(redacted.len());
    while !redacted.is_char_boundary(at) {
        at += 1;
    }
    &redacted[at..]
}

fn last_char(text: &str) -> String {
    text.chars().last().map(String::from).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::SecretValue;
    use crate::crd::Privacy;
    use crate::redact::SecretRedactor;

    const SECRET: &str = "Zq8-secret-value-77";

    fn redactor() -> Redactor {
        let secrets = SecretRedactor::new(&[SecretValue::new(SECRET)]);
        let privacy = Privacy {
            redact_secrets: true,
            redact_pii: true,
        };
        Redactor::new(secrets, &privacy)
    }

    /// Each example, the secret it holds, and the placeholder it must become.
    fn examples() -> Vec<(String, &'static str, &'static str)> {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAx7Q\nk3Rm+/Zq==\n-----END RSA PRIVATE KEY-----";
        vec![
            (
                "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJlLXZhbHVl ok".into(),
                "c2lnbmF0dXJl",
                "[REDACTED:jwt]",
            ),
            (
                "key AKIAIOSFODNN7EXAMPLE used".into(),
                "IOSFODNN7",
                "[REDACTED:aws_access_key]",
            ),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY done".into(),
                "K7MDENG",
                "[REDACTED:aws_secret_key]",
            ),
            (
                "use ghp_0123456789abcdefghijABCDEFGHIJ012345 now".into(),
                "abcdefghijABCDEF",
                "[REDACTED:github_token]",
            ),
            (
                "slack xoxb-1234567890-abcdefghij here".into(),
                "1234567890-abc",
                "[REDACTED:slack_token]",
            ),
            (
                "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx set".into(),
                "klmnopqrstu",
                "[REDACTED:api_key]",
            ),
            (
                "Authorization: Bearer abcdef0123456789xyz0123 sent".into(),
                "0123456789xyz",
                "[REDACTED:bearer_token]",
            ),
            (
                "dsn postgres://shop:hunter2pw@db.shop:5432/orders ok".into(),
                "hunter2pw",
                "[REDACTED:password]",
            ),
            (
                "the password: correct-horse-battery is set".into(),
                "correct-horse",
                "[REDACTED:password]",
            ),
            (
                format!("key:\n{pem}\nthat is all."),
                "MIIEpAIBAAKCAQEAx7Q",
                "[REDACTED:private_key]",
            ),
            (
                "mail jane.doe+ops@example.co.uk now".into(),
                "jane.doe",
                "[REDACTED:email]",
            ),
            (
                "card 4111 1111 1111 1111 charged".into(),
                "1111 1111 1111",
                "[REDACTED:card]",
            ),
            (
                "call +49 30 1234 5678 today".into(),
                "1234 5678",
                "[REDACTED:phone]",
            ),
            (
                "from 10.1.2.3 to 2001:db8::8a2e:370:7334 ok".into(),
                "8a2e:370",
                "[REDACTED:ip]",
            ),
            (
                format!("the value is {SECRET} indeed"),
                "secret-value",
                "[REDACTED:secret]",
            ),
        ]
    }

    /// Sends `pieces` one by one as a stream does, asking what may go after each.
    fn stream(r: &Redactor, pieces: &[&str]) -> String {
        let mut s = StreamRedactor::new(r);
        let mut out = String::new();
        for piece in pieces {
            s.push(piece);
            out.push_str(&s.ready());
        }
        out + &s.finish()
    }

    fn boundaries(text: &str) -> impl Iterator<Item = usize> + '_ {
        (0..=text.len()).filter(|i| text.is_char_boundary(*i))
    }

    #[test]
    fn a_secret_split_anywhere_never_reaches_the_stream() {
        let r = redactor();
        for (text, secret, placeholder) in examples() {
            let whole = r.text(&text).0;
            assert!(
                !whole.contains(secret) && whole.contains(placeholder),
                "{text} → {whole}"
            );
            for i in boundaries(&text) {
                let sent = stream(&r, &[&text[..i], &text[i..]]);
                assert!(
                    !sent.contains(secret) && sent.contains(placeholder),
                    "split at {i}: {sent:?}"
                );
                assert_eq!(sent, whole, "split at {i}");
            }
        }
    }

    #[test]
    fn a_secret_sent_character_by_character_never_reaches_the_stream() {
        let r = redactor();
        for (text, secret, _) in examples() {
            let pieces: Vec<&str> = boundaries(&text)
                .collect::<Vec<_>>()
                .windows(2)
                .map(|w| &text[w[0]..w[1]])
                .collect();
            let sent = stream(&r, &pieces);
            assert!(!sent.contains(secret), "{sent:?}");
            assert_eq!(sent, r.text(&text).0);
        }
    }

    #[test]
    fn ordinary_text_is_sent_as_it_comes() {
        let r = redactor();
        let mut s = StreamRedactor::new(&r);
        s.push("The pod api-7f9c restarted 3 times; ");
        assert_eq!(s.ready(), "The pod api-7f9c restarted 3 times; ");
        s.push("roll back to revision 12. Über-Grüße, ");
        assert_eq!(s.ready(), "roll back to revision 12. Über-Grüße, ");
        // A keyword waits for what follows it, and is sent once that settles it.
        s.push("the password: ");
        assert_eq!(s.ready(), "the ");
        s.push("is unknown. ");
        assert_eq!(s.ready(), "password: is unknown. ");
        assert!(s.is_empty());
    }

    #[test]
    fn a_hold_is_bounded_and_a_long_key_keeps_its_placeholder() {
        let r = redactor();
        let mut s = StreamRedactor::new(&r);
        s.push("start password: ");
        let mut out = s.ready();
        for _ in 0..(MAX_HOLD / 64 + 4) {
            s.push(&"k".repeat(64));
            out.push_str(&s.ready());
        }
        assert_eq!(out, "start password: [REDACTED:password]");
        s.push(" and the rest.");
        out.push_str(&s.ready());
        out.push_str(&s.finish());
        assert_eq!(out, "start password: [REDACTED:password] and the rest.");
    }

    #[test]
    fn without_redaction_everything_goes_at_once() {
        let r = Redactor::default();
        let mut s = StreamRedactor::new(&r);
        s.push("password: ");
        assert_eq!(s.ready(), "password: ");
    }
}
