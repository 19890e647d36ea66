//! A `KortexTool`'s `spec.http.url`: `{param}` placeholders, allowed only after the host,
//! filled with percent-encoded arguments, and never able to change the scheme, host or
//! port. The catalog parses it to validate the resource; the HTTP tool expands it.

use serde_json::{Map, Value};

/// One placeholder-bearing URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlTemplate {
    raw: String,
    /// Placeholder names, in order.
    pub placeholders: Vec<String>,
}

impl UrlTemplate {
    /// Parses `raw`, refusing placeholders in the scheme, host or port and unbalanced braces.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let after_scheme = raw
            .find("://")
            .map(|i| i + 3)
            .ok_or_else(|| format!("{raw:?} is not an absolute http(s) URL"))?;
        let authority_end = raw[after_scheme..]
            .find(['/', '?', '#'])
            .map_or(raw.len(), |i| after_scheme + i);
        if raw[..authority_end].contains(['{', '}']) {
            return Err(
                "placeholders may not appear in the scheme, host or port of the URL".to_owned(),
            );
        }
        let mut placeholders = Vec::new();
        let mut rest = &raw[authority_end..];
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err("unbalanced '}' in the URL".to_owned());
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| "unbalanced '{' in the URL".to_owned())?;
            let name = &rest[open + 1..open + close];
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!("invalid placeholder {{{name}}} in the URL"));
            }
            placeholders.push(name.to_owned());
            rest = &rest[open + close + 1..];
        }
        // The template itself (placeholders filled) must be a valid URL.
        base(&fill(raw, &placeholders, |_| "x".to_owned()))?;
        Ok(Self {
            raw: raw.to_owned(),
            placeholders,
        })
    }

    /// The URL for `args`; placeholders take their argument, percent-encoded. An error
    /// says what is wrong with the arguments.
    pub fn expand(&self, args: &Map<String, Value>) -> Result<reqwest::Url, String> {
        let mut values = Vec::new();
        for name in &self.placeholders {
            let value = match args.get(name) {
                None | Some(Value::Null) => {
                    return Err(format!("{name} is required: it is part of the URL"));
                }
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(_) => {
                    return Err(format!(
                        "{name} must be a string, number or boolean: it is part of the URL"
                    ));
                }
            };
            // Encoded separators are decoded by some servers and proxies: no value may
            // hold a `.` or `..` segment that could climb out of the template's path.
            if value
                .split(['/', '\\'])
                .any(|segment| segment == "." || segment == "..")
            {
                return Err(format!(
                    "{name} may not contain a '.' or '..' path segment: it is part of the URL"
                ));
            }
            values.push(percent_encode(&value));
        }
        let mut values = values.into_iter();
        let expanded = fill(&self.raw, &self.placeholders, |_| {
            values.next().unwrap_or_default()
        });
        let url = reqwest::Url::parse(&expanded)
            .map_err(|e| format!("the arguments make an invalid URL: {e}"))?;
        let template = base(&fill(&self.raw, &self.placeholders, |_| "x".to_owned()))?;
        if (url.scheme(), url.host_str(), url.port_or_known_default())
            != (
                template.scheme(),
                template.host_str(),
                template.port_or_known_default(),
            )
        {
            return Err("the arguments would change the URL's scheme, host or port".to_owned());
        }
        Ok(url)
    }
}

fn fill(raw: &str, placeholders: &[String], mut value: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    for name in placeholders {
        let token = format!("{{{name}}}");
        if let Some(i) = rest.find(&token) {
            out.push_str(&rest[..i]);
            out.push_str(&value(name));
            rest = &rest[i + token.len()..];
        }
    }
    out.push_str(rest);
    out
}

fn base(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    match parsed.scheme() {
        "http" | "https" if parsed.host().is_some() => Ok(parsed),
        _ => Err("the URL must be http:// or https:// with a host".to_owned()),
    }
}

/// Percent-encodes every byte except the unreserved characters of RFC 3986.
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn hostile_values_stay_inside_their_path_segment() {
        let t = match UrlTemplate::parse("http://bridge.tools.svc:8080/issues/{key}/comments?x=1") {
            Ok(t) => t,
            Err(e) => panic!("template rejected: {e}"),
        };
        let cases = [
            ("..x/admin", "/issues/..x%2Fadmin/comments"),
            ("a?b=c", "/issues/a%3Fb%3Dc/comments"),
            ("x#frag", "/issues/x%23frag/comments"),
            ("@evil.example", "/issues/%40evil.example/comments"),
            ("a b/ü", "/issues/a%20b%2F%C3%BC/comments"),
        ];
        for (value, path) in cases {
            let url = t
                .expand(&args(json!({"key": value})))
                .map(|u| {
                    (
                        u.host_str().map(str::to_owned),
                        u.path().to_owned(),
                        u.query().map(str::to_owned),
                    )
                })
                .map_err(|e| format!("{e:?}"));
            assert_eq!(
                url,
                Ok((
                    Some("bridge.tools.svc".into()),
                    path.to_owned(),
                    Some("x=1".into())
                )),
                "{value}"
            );
        }
        for dots in [".", "..", "../admin", "a/../../admin", "a\\..\\b", "./x"] {
            assert!(t.expand(&args(json!({"key": dots}))).is_err(), "{dots}");
        }
        // Slashes and dots within a segment are ordinary data.
        assert!(t.expand(&args(json!({"key": "src/main.rs"}))).is_ok());
        assert!(t.expand(&args(json!({"key": "v1..2"}))).is_ok());
        assert!(matches!(
            t.expand(&args(json!({}))),
            Err(m) if m.contains("key is required")
        ));
    }

    #[test]
    fn placeholders_cannot_touch_scheme_host_or_port() {
        for raw in [
            "http://{host}/x",
            "http://example.com:{port}/x",
            "{scheme}://example.com/x",
            "http://user{u}@example.com/x",
            "http://example.com/{open",
            "http://example.com/close}",
            "http://example.com/{bad name}",
            "ftp://example.com/x",
        ] {
            assert!(UrlTemplate::parse(raw).is_err(), "{raw}");
        }
        let t = UrlTemplate::parse("https://example.com/a/{b}?q={c}");
        assert_eq!(
            t.map(|t| t.placeholders),
            Ok(vec!["b".to_owned(), "c".to_owned()])
        );
    }
}
