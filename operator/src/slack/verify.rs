//! Slack's request signing (docs.slack.dev, "Verifying requests from Slack"): the
//! `X-Slack-Signature` header is `v0=` and the hex HMAC-SHA256, keyed with the app's
//! signing secret, of `v0:{X-Slack-Request-Timestamp}:{raw body}`. The raw body is checked
//! before anything parses it, the comparison is constant-time (`ring::hmac::verify`), and a
//! timestamp more than five minutes from now is refused (a replay).

use ring::hmac;

/// How far a request's timestamp may be from now, in seconds.
pub const WINDOW: i64 = 300;

/// Why a request is not Slack's. The messages name no secret and no signature.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// No `X-Slack-Request-Timestamp` or `X-Slack-Signature`, or not in their format.
    #[error("not a signed Slack request: {0}")]
    Unsigned(&'static str),
    /// The timestamp is too old or in the future (a replay, or a wrong clock).
    #[error(
        "the request's timestamp is {0} s away from now (more than 5 minutes): a replay, or a clock to fix"
    )]
    Stale(i64),
    /// The signature is not the body's under this app's signing secret.
    #[error("the request's signature does not match its body under the app's signing secret")]
    Signature,
}

/// Checks that `body` was sent by Slack at `timestamp` with `signature`, under `secret`,
/// at `now` (Unix seconds).
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Refusal> {
    let timestamp = timestamp.ok_or(Refusal::Unsigned("no X-Slack-Request-Timestamp header"))?;
    let signature = signature.ok_or(Refusal::Unsigned("no X-Slack-Signature header"))?;
    let at: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| Refusal::Unsigned("X-Slack-Request-Timestamp is not a number"))?;
    let away = now.saturating_sub(at).saturating_abs();
    if away > WINDOW {
        return Err(Refusal::Stale(away));
    }
    let hex = signature
        .trim()
        .strip_prefix("v0=")
        .ok_or(Refusal::Unsigned("X-Slack-Signature is not a v0 signature"))?;
    let tag = crate::catalog::secrets::unhex(hex)
        .ok_or(Refusal::Unsigned("X-Slack-Signature is not hex"))?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut message = format!("v0:{}:", timestamp.trim()).into_bytes();
    message.extend_from_slice(body);
    hmac::verify(&key, &message, &tag).map_err(|_| Refusal::Signature)
}

/// `v0=` and the hex signature of `body` at `timestamp` under `secret`: what Slack sends (a
/// test's scripted Slack signs with it).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut message = format!("v0:{timestamp}:").into_bytes();
    message.extend_from_slice(body);
    let tag = hmac::sign(&key, &message);
    format!("v0={}", crate::catalog::secrets::hex(tag.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Slack's documented example ("Verifying requests from Slack").
    const SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
    const AT: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn slacks_documented_example_verifies_and_every_alteration_is_refused() {
        let now = 1_531_420_618 + 10;
        assert_eq!(
            verify(SECRET, Some(AT), Some(SIGNATURE), BODY.as_bytes(), now),
            Ok(())
        );
        assert_eq!(sign(SECRET, 1_531_420_618, BODY.as_bytes()), SIGNATURE);
        // The body altered by one character, another secret, another timestamp.
        let altered = BODY.replace("text=", "text=x");
        assert_eq!(
            verify(SECRET, Some(AT), Some(SIGNATURE), altered.as_bytes(), now),
            Err(Refusal::Signature)
        );
        assert_eq!(
            verify(
                b"another secret",
                Some(AT),
                Some(SIGNATURE),
                BODY.as_bytes(),
                now
            ),
            Err(Refusal::Signature)
        );
        assert_eq!(
            verify(
                SECRET,
                Some("1531420619"),
                Some(SIGNATURE),
                BODY.as_bytes(),
                now
            ),
            Err(Refusal::Signature)
        );
        // Stale (a replay six minutes later) and from the future.
        assert_eq!(
            verify(
                SECRET,
                Some(AT),
                Some(SIGNATURE),
                BODY.as_bytes(),
                1_531_420_618 + 360
            ),
            Err(Refusal::Stale(360))
        );
        assert_eq!(
            verify(
                SECRET,
                Some(AT),
                Some(SIGNATURE),
                BODY.as_bytes(),
                1_531_420_618 - 301
            ),
            Err(Refusal::Stale(301))
        );
        // Unsigned or malformed.
        for (ts, sig) in [
            (None, Some(SIGNATURE)),
            (Some(AT), None),
            (Some("soon"), Some(SIGNATURE)),
            (Some(AT), Some("v1=00")),
            (Some(AT), Some("v0=zz")),
            (Some(AT), Some("v0=abc")),
        ] {
            assert!(
                matches!(
                    verify(SECRET, ts, sig, BODY.as_bytes(), now),
                    Err(Refusal::Unsigned(_))
                ),
                "{ts:?} {sig:?}"
            );
        }
        // A truncated signature does not verify (no prefix match).
        assert_eq!(
            verify(
                SECRET,
                Some(AT),
                Some(&SIGNATURE[..21]),
                BODY.as_bytes(),
                now
            ),
            Err(Refusal::Signature)
        );
    }
}
