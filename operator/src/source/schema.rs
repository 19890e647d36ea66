//! Checks an object against the OpenAPI schema of its generated CRD — the same bounds the
//! API server enforces (lengths, patterns, ranges, item counts, enums) — so standalone mode
//! rejects exactly what a cluster would.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// One violation: the field path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// e.g. `spec.models[0].id`.
    pub field: String,
    /// e.g. `must be at most 256 characters long`.
    pub message: String,
}

/// Validates `value` against `schema` (an `openAPIV3Schema`), starting at `path`.
pub fn validate(schema: &Value, value: &Value, path: &str) -> Vec<Violation> {
    let mut walker = Walker { out: Vec::new() };
    walker.check(schema, value, path);
    walker.out
}

struct Walker {
    out: Vec<Violation>,
}

/// The compiled `pattern` of a schema. The schemas' patterns are few and fixed, and a
/// reload validates every object (1 000 tools, one compilation each, took most of a
/// reload's time), so each is compiled once per process.
fn pattern(pattern: &str) -> Option<regex::Regex> {
    static COMPILED: LazyLock<Mutex<HashMap<String, Option<regex::Regex>>>> =
        LazyLock::new(Mutex::default);
    COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(pattern.to_owned())
        .or_insert_with(|| regex::Regex::new(pattern).ok())
        .clone()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl Walker {
    fn fail(&mut self, field: &str, message: String) {
        self.out.push(Violation {
            field: field.to_owned(),
            message,
        });
    }

    fn check(&mut self, schema: &Value, value: &Value, path: &str) {
        if value.is_null() {
            return;
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
            self.fail(
                path,
                format!(
                    "Unsupported value: {value}: supported values: {}",
                    list.join(", ")
                ),
            );
            return;
        }
        match value {
            Value::Object(map) => {
                if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                    for (key, sub) in props {
                        if let Some(v) = map.get(key) {
                            self.check(sub, v, &join(path, key));
                        }
                    }
                    for required in schema
                        .get("required")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(r) = required.as_str()
                            && map.get(r).is_none_or(Value::is_null)
                        {
                            self.fail(&join(path, r), "Required value".to_owned());
                        }
                    }
                }
                if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                    for (key, v) in map {
                        self.check(sub, v, &join(path, key));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                    && items.len() as u64 > max
                {
                    self.fail(
                        path,
                        format!("Too many: {}: must have at most {max} items", items.len()),
                    );
                }
                if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                    && (items.len() as u64) < min
                {
                    self.fail(path, format!("must have at least {min} item(s)"));
                }
                if let Some(sub) = schema.get("items") {
                    for (i, v) in items.iter().enumerate() {
                        self.check(sub, v, &format!("{path}[{i}]"));
                    }
                }
            }
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                    && len > max
                {
                    self.fail(
                        path,
                        format!("Too long: may not be more than {max} characters"),
                    );
                }
                if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                    && len < min
                {
                    self.fail(
                        path,
                        format!("Invalid value: {s:?}: should be at least {min} characters long"),
                    );
                }
                if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                    && let Some(re) = self::pattern(pattern)
                    && !re.is_match(s)
                {
                    let message = format!("Invalid value: {s:?}: should match '{pattern}'");
                    self.fail(path, message);
                }
            }
            Value::Number(n) => {
                let Some(x) = n.as_f64() else { return };
                if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                    && x > max
                {
                    self.fail(
                        path,
                        format!("Invalid value: {n}: should be less than or equal to {max}"),
                    );
                }
                if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                    && x < min
                {
                    self.fail(
                        path,
                        format!("Invalid value: {n}: should be greater than or equal to {min}"),
                    );
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_bounds_with_paths() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
            "n": {"type": "integer", "minimum": 1.0},
            "list": {"type": "array", "maxItems": 1, "items": {"type": "object", "properties": {"id": {"type": "string", "minLength": 1}}}},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "map": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 2}}
        }});
        let value = json!({"name": "ABCD", "n": 0, "list": [{"id": ""}, {"id": "x"}], "mode": "c", "map": {"k": "long"}});
        let v = validate(&schema, &value, "spec");
        let fields: Vec<&str> = v.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.list",
                "spec.list[0].id",
                "spec.map.k",
                "spec.mode",
                "spec.n",
                "spec.name",
                "spec.name"
            ],
            "{v:?}"
        );
        assert!(validate(&schema, &json!({"name": "ab", "n": 2}), "spec").is_empty());
    }
}
