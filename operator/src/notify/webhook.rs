//! `format: json`: Kortex's envelope `{id, type, time, data}`, with `X-Kortex-Delivery`
//! (the idempotency key: the same for every retry), `X-Kortex-Event`, and — with a
//! `signingSecretRef` — `X-Kortex-Signature: sha256=<hex HMAC-SHA256 of the body>`.

use super::{Channel, Outgoing, Rendered};
use serde_json::json;

/// The JSON envelope.
pub struct Json;

impl Channel for Json {
    fn render(&self, out: &Outgoing<'_>) -> Rendered {
        let event = &out.delivery.event;
        let time = jiff::Timestamp::from_millisecond(event.created_at)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut body = json!({
            "id": event.id,
            "type": event.event_type,
            "time": time,
            "policy": event.policy,
            "data": event.data,
        });
        // The session an event is about, in the dashboard (when its address is known).
        if let Some(link) = super::session_link(out.public_url, out.delivery) {
            body["link"] = json!(link);
        }
        let body = body.to_string().into_bytes();
        let mut headers = vec![
            ("X-Kortex-Delivery", out.delivery.id.clone()),
            ("X-Kortex-Event", event.event_type.clone()),
        ];
        if let Some(secret) = &out.target.signing {
            headers.push(("X-Kortex-Signature", signature(secret.expose(), &body)));
        }
        Rendered { body, headers }
    }
}

/// `sha256=<hex HMAC-SHA256(secret, body)>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_is_the_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
