//! Redaction (SPEC §1.3). Two layers:
//! - [`SecretRedactor`]: the values of every Secret Kortex has resolved, always, whatever a
//!   policy says;
//! - [`patterns`]: recognisable credentials (`privacy.redactSecrets`) and personal data
//!   (`privacy.redactPii`) of a `ChatPolicy`.
//!
//! [`Redactor`] combines them for one policy and is applied on the one path every provider
//! call takes (the whole request, just before it is sent) and wherever text from outside is
//! stored (user messages, tool results, events, audit rows). Text that is JSON is redacted
//! value by value, so tool-call arguments and JSON results stay valid JSON.

pub mod patterns;
mod stream;

pub use crate::catalog::secret_redactor::{
    MIN_SECRET_LEN, SECRET_PLACEHOLDER, SecretRedactor, base64, base64_bytes,
};
pub use stream::StreamRedactor;

use crate::crd::Privacy;
use crate::llm::{ChatRequest, Message};
use serde_json::Value;

/// The redaction one policy asks for.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    secrets: SecretRedactor,
    credentials: bool,
    pii: bool,
}

impl Redactor {
    /// Resolved Secret values only (no policy governs the text).
    pub fn secrets_only(secrets: SecretRedactor) -> Self {
        Self {
            secrets,
            credentials: false,
            pii: false,
        }
    }

    /// The redaction `policy` asks for, over `catalog`'s resolved Secret values.
    pub fn for_policy(
        catalog: &crate::catalog::Catalog,
        policy: &crate::catalog::PolicyEntry,
    ) -> Self {
        Self::new(catalog.redactor.clone(), &policy.object.spec.privacy)
    }

    /// Resolved Secret values plus what `privacy` adds.
    pub fn new(secrets: SecretRedactor, privacy: &Privacy) -> Self {
        Self {
            secrets,
            credentials: privacy.redact_secrets,
            pii: privacy.redact_pii,
        }
    }

    /// Plain `text` redacted, and how many replacements.
    pub fn text(&self, text: &str) -> (String, usize) {
        let (mut out, mut n) = if self.secrets.is_empty() {
            (None, 0)
        } else {
            let (s, n) = self.secrets.redact(text);
            ((n > 0).then_some(s), n)
        };
        if self.credentials || self.pii {
            let (next, m) =
                patterns::redact(out.as_deref().unwrap_or(text), self.credentials, self.pii);
            if let Some(next) = next {
                out = Some(next);
                n += m;
            }
        }
        (out.unwrap_or_else(|| text.to_owned()), n)
    }

    /// `text` redacted; when it is a JSON object or array, string by string (keys
    /// included), so the result is still the same JSON structure.
    pub fn content(&self, text: &str) -> (String, usize) {
        let trimmed = text.trim_start();
        if (trimmed.starts_with('{') || trimmed.starts_with('['))
            && let Ok(mut value) = serde_json::from_str::<Value>(text)
        {
            let n = self.value(&mut value);
            return if n == 0 {
                (text.to_owned(), 0)
            } else {
                (value.to_string(), n)
            };
        }
        self.text(text)
    }

    /// Redacts every string (and object key) of `value` in place; how many replacements.
    pub fn value(&self, value: &mut Value) -> usize {
        match value {
            Value::String(s) => {
                let (out, n) = self.text(s);
                if n > 0 {
                    *s = out;
                }
                n
            }
            Value::Array(items) => items.iter_mut().map(|v| self.value(v)).sum(),
            Value::Object(map) => {
                let mut n = 0;
                let entries = std::mem::take(map);
                for (key, mut v) in entries {
                    // `{"password": "..."}`: the key says what the value is.
                    if self.credentials
                        && credential_key(&key)
                        && v.as_str()
                            .is_some_and(|s| !s.is_empty() && !s.starts_with("[REDACTED"))
                    {
                        v = Value::String(patterns::placeholder("password"));
                        n += 1;
                    } else {
                        n += self.value(&mut v);
                    }
                    let (key, k) = self.text(&key);
                    map.insert(key, v);
                    n += k;
                }
                n
            }
            _ => 0,
        }
    }

    /// Redacts a whole provider request in place: system prompt, every message, tool-call
    /// arguments and tool results, and what a caller can put elsewhere in it (tool
    /// descriptions and schemas, stop sequences, the response format). Returns how many
    /// replacements.
    pub fn request(&self, request: &mut ChatRequest) -> usize {
        let mut n = 0;
        if let Some(system) = &mut request.system {
            n += self.replace(system, false);
        }
        for tool in &mut request.tools {
            n += self.replace(&mut tool.description, false);
            n += self.value(&mut tool.parameters);
        }
        for stop in &mut request.stop {
            n += self.replace(stop, false);
        }
        if let Some(format) = &mut request.response_format {
            n += self.value(format);
        }
        for message in &mut request.messages {
            match message {
                Message::User { content } => n += self.replace(content, false),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    n += self.replace(content, false);
                    for call in tool_calls {
                        n += self.value(&mut call.input);
                    }
                }
                Message::Tool { content, .. } => n += self.replace(content, true),
            }
        }
        n
    }

    fn replace(&self, text: &mut String, json_aware: bool) -> usize {
        let (out, n) = if json_aware {
            self.content(text)
        } else {
            self.text(text)
        };
        if n > 0 {
            *text = out;
        }
        n
    }

    /// Whether this redactor can ever change anything.
    pub fn is_noop(&self) -> bool {
        self.secrets.is_empty() && !self.credentials && !self.pii
    }
}

/// Whether an object key names a credential (`password`, `api_key`, `clientSecret`, ...).
fn credential_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    matches!(
        k.as_str(),
        "password"
            | "passwd"
            | "secret"
            | "clientsecret"
            | "secretkey"
            | "secretaccesskey"
            | "apikey"
            | "xapikey"
            | "accesstoken"
            | "authtoken"
            | "refreshtoken"
            | "token"
            | "bearertoken"
            | "privatekey"
            | "authorization"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::SecretValue;
    use crate::llm::ToolCall;
    use serde_json::json;

    const SECRETS: [&str; 4] = [
        "sk-live-0123456789",
        "hunter2-db-password",
        "p@ss\"word\\with/odd",
        "ops:correct-horse-battery",
    ];

    fn redactor(credentials: bool, pii: bool) -> Redactor {
        let values: Vec<SecretValue> = SECRETS.iter().map(|v| SecretValue::new(*v)).collect();
        Redactor::new(
            SecretRedactor::new(&values),
            &Privacy {
                redact_secrets: credentials,
                redact_pii: pii,
            },
        )
    }

    /// A small deterministic generator (xorshift), so failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    const FILLER: [&str; 14] = [
        " ",
        "\n",
        "\"",
        "\\",
        "{",
        "}",
        ":",
        ",",
        "é",
        "token=",
        "Bearer ",
        "user@",
        "10.0.",
        "pod api-7f9c ",
    ];

    /// Text mixing secrets (raw, base64, JSON-escaped), credentials, PII and JSON syntax.
    fn random_text(rng: &mut Rng) -> String {
        let mut out = String::new();
        for _ in 0..(rng.next() % 24) {
            match rng.next() % 5 {
                0 => out.push_str(rng.pick(&SECRETS)),
                1 => out.push_str(&base64(rng.pick(&SECRETS))),
                2 => out.push_str(rng.pick(&[
                    "AKIAIOSFODNN7EXAMPLE",
                    "jane@example.com",
                    "4111 1111 1111 1111",
                    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJl",
                ])),
                _ => out.push_str(rng.pick(&FILLER)),
            }
        }
        out
    }

    fn random_value(rng: &mut Rng, depth: u32) -> Value {
        match rng.next() % if depth > 2 { 3 } else { 5 } {
            0 => json!(rng.next() % 1000),
            1 | 2 => json!(random_text(rng)),
            3 => Value::Array(
                (0..rng.next() % 4)
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.next() % 4)
                    .map(|_| (random_text(rng), random_value(rng, depth + 1)))
                    .collect(),
            ),
        }
    }

    fn leaks(body: &str) -> Vec<&'static str> {
        SECRETS
            .iter()
            .copied()
            .filter(|s| {
                let escaped = Value::from(*s).to_string();
                body.contains(s)
                    || body.contains(&escaped[1..escaped.len() - 1])
                    || body.contains(&base64(s))
            })
            .collect()
    }

    /// Property: across randomized requests, no configured Secret value survives in the
    /// serialized request body, and every JSON result and argument stays valid JSON.
    #[test]
    fn no_secret_survives_in_any_request_and_json_stays_valid() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for (i, privacy) in [(false, false), (true, false), (true, true)]
            .iter()
            .cycle()
            .take(600)
            .enumerate()
        {
            let r = redactor(privacy.0, privacy.1);
            let arguments = random_value(&mut rng, 0);
            let result = random_value(&mut rng, 0).to_string();
            let mut request = ChatRequest {
                system: Some(random_text(&mut rng)),
                messages: vec![
                    Message::User {
                        content: random_text(&mut rng),
                    },
                    Message::Assistant {
                        content: random_text(&mut rng),
                        tool_calls: vec![ToolCall {
                            id: "c1".into(),
                            name: "get_logs".into(),
                            input: arguments,
                        }],
                    },
                    Message::Tool {
                        tool_call_id: "c1".into(),
                        content: result,
                        is_error: false,
                    },
                    Message::Tool {
                        tool_call_id: "c2".into(),
                        content: random_text(&mut rng),
                        is_error: false,
                    },
                ],
                // Parts a gateway caller fills in too.
                tools: vec![crate::llm::ToolSpec {
                    name: "lookup".into(),
                    description: random_text(&mut rng),
                    parameters: random_value(&mut rng, 0),
                }],
                stop: vec![random_text(&mut rng)],
                response_format: Some(serde_json::json!({"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": random_value(&mut rng, 0)}})),
                ..Default::default()
            };
            r.request(&mut request);
            let body = serde_json::to_string(&request).unwrap_or_default();
            assert!(
                leaks(&body).is_empty(),
                "case {i}: {:?} leaked in {body}",
                leaks(&body)
            );
            // The tool result was JSON and still is.
            if let Message::Tool { content, .. } = &request.messages[2] {
                assert!(
                    serde_json::from_str::<Value>(content).is_ok(),
                    "case {i}: result is no longer JSON: {content}"
                );
            }
        }
    }

    #[test]
    fn json_text_keeps_its_structure_and_plain_text_is_redacted_inline() {
        let r = redactor(true, true);
        let (out, n) = r.content(
            r#"{"env": [{"name": "DB", "value": "hunter2-db-password"}], "mail": "a@b.io"}"#,
        );
        assert_eq!(n, 2);
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap_or_default(),
            json!({"env": [{"name": "DB", "value": "[REDACTED:secret]"}], "mail": "[REDACTED:email]"})
        );
        // A value under a credential key is one, whatever it looks like.
        let (out, n) = r.content(r#"{"config": {"password": "s3cr3t-value", "api-key": "k1", "secretName": "db-creds", "replicas": 3}}"#);
        assert_eq!(n, 2);
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap_or_default(),
            json!({"config": {"password": "[REDACTED:password]", "api-key": "[REDACTED:password]", "secretName": "db-creds", "replicas": 3}})
        );
        // Unchanged JSON keeps its exact text.
        let (same, n) = r.content("{ \"a\" : 1 }");
        assert_eq!((same.as_str(), n), ("{ \"a\" : 1 }", 0));
        assert_eq!(
            r.text("key sk-live-0123456789 sent to jane@example.com").0,
            "key [REDACTED:secret] sent to [REDACTED:email]"
        );
        // Without privacy settings only resolved Secret values go.
        let plain = redactor(false, false);
        assert_eq!(
            plain.text("sk-live-0123456789 jane@example.com").0,
            "[REDACTED:secret] jane@example.com"
        );
    }
}
