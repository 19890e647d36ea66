//! The reference docs that must follow the code: docs/crds.md is generated from the CRD
//! schemas (`KORTEX_UPDATE_DOCS=1 cargo test -p kortex --test it docs::` rewrites it),
//! docs/metrics.md describes every metric Kortex registers, and docs/troubleshooting.md
//! every condition reason it sets.

use super::chart::registered_metrics;
use crate::support::yaml::root;
use serde_json::Value;
use std::fmt::Write;

fn type_of(schema: &Value) -> String {
    match schema["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&schema["items"])),
        Some("object") if schema["additionalProperties"].is_object() => {
            format!("map[string]{}", type_of(&schema["additionalProperties"]))
        }
        Some(t) => t.to_owned(),
        None if schema["x-kubernetes-preserve-unknown-fields"] == true => "any".to_owned(),
        None if schema["x-kubernetes-int-or-string"] == true => "int or string".to_owned(),
        None => "object".to_owned(),
    }
}

fn constraints(schema: &Value, required: bool) -> String {
    let mut out = Vec::new();
    if required {
        out.push("**required**".to_owned());
    }
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| {
                format!(
                    "`{}`",
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                )
            })
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if !schema["default"].is_null() {
        out.push(format!("default `{}`", schema["default"]));
    }
    for (key, label) in [
        ("minimum", "min"),
        ("maximum", "max"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ] {
        if let Some(n) = schema[key].as_f64() {
            out.push(format!("{label} {n}"));
        }
    }
    if let Some(p) = schema["pattern"].as_str() {
        out.push(format!("pattern `{}`", p.replace('|', "\\|")));
    }
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(m) = rule["message"].as_str() {
            out.push(format!("rule: {m}"));
        }
    }
    out.join("; ")
}

fn fields(schema: &Value, path: &str, out: &mut String, depth: usize) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, child) in props {
        let here = format!("{path}.{name}");
        // Conditions are the standard metav1.Condition: one row, not its fields.
        let description = child["description"]
            .as_str()
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        let _ = writeln!(
            out,
            "| `{here}` | {} | {} | {description} |",
            type_of(child),
            constraints(child, required.contains(&name.as_str()))
        );
        if name == "conditions" || depth > 8 {
            continue;
        }
        let inner = if child["type"] == "array" {
            &child["items"]
        } else {
            child
        };
        let suffix = if child["type"] == "array" { "[]" } else { "" };
        fields(inner, &format!("{here}{suffix}"), out, depth + 1);
    }
}

/// The CRD reference as Markdown, from the schemas `kortex crds` prints.
fn crd_reference() -> String {
    let mut out = String::from(
        "# Custom resource reference\n\n\
         Generated from the CRD schemas (`kortex crds`, the files in `crds/`) by\n\
         `KORTEX_UPDATE_DOCS=1 cargo test -p kortex --test it docs::`; do not edit by hand.\n\
         Group `kortex.dev`, version `v1alpha1`, all namespaced. SPEC-level meaning and\n\
         examples: docs/policies.md, docs/providers.md, docs/tools.md, docs/operator.md;\n\
         samples in `config/samples/`.\n",
    );
    for crd in kortex::crd::all_crds() {
        let names = &crd.spec.names;
        let version = &crd.spec.versions[0];
        let schema =
            serde_json::to_value(&version.schema).unwrap_or_default()["openAPIV3Schema"].clone();
        let short = names.short_names.clone().unwrap_or_default().join(", ");
        let _ = write!(
            out,
            "\n## {}\n\n`kubectl get {}` (short name `{short}`). {}\n\n",
            names.kind,
            names.plural,
            schema["description"].as_str().unwrap_or_default()
        );
        for rule in schema["properties"]["spec"]["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(m) = rule["message"].as_str() {
                let _ = writeln!(out, "- Rule on `spec`: {m}");
            }
        }
        let _ = writeln!(
            out,
            "\n| field | type | validation | description |\n|---|---|---|---|"
        );
        for part in ["spec", "status"] {
            let child = &schema["properties"][part];
            let required = schema["required"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == part));
            let _ = writeln!(
                out,
                "| `{part}` | object | {} | {} |",
                constraints(child, required),
                child["description"].as_str().unwrap_or_default()
            );
            fields(child, part, &mut out, 0);
        }
        let columns: Vec<String> = version
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|c| format!("`{}`", c.name))
            .collect();
        let _ = writeln!(out, "\nPrinter columns: {}.", columns.join(", "));
    }
    out
}

#[test]
fn crd_reference_is_generated_from_the_schemas() {
    let path = root().join("docs/crds.md");
    let expected = crd_reference();
    if std::env::var_os("KORTEX_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/crds.md is out of date with the CRDs: run `KORTEX_UPDATE_DOCS=1 cargo test -p kortex --test it docs::` and commit it"
    );
}

#[test]
fn metrics_reference_describes_every_metric() {
    let doc = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap_or_default();
    let metrics = registered_metrics();
    assert!(metrics.len() >= 15, "{metrics:?}");
    for m in metrics {
        assert!(
            doc.contains(&format!("`{m}")),
            "docs/metrics.md does not describe {m}"
        );
    }
}

#[test]
fn troubleshooting_covers_every_condition_reason() {
    let doc = std::fs::read_to_string(root().join("docs/troubleshooting.md")).unwrap_or_default();
    let mut reasons = Vec::new();
    let re = regex::Regex::new(r#"pub const [A-Z_]+: &str = "([A-Za-z]+)";"#).unwrap();
    for (file, module) in [
        ("operator/src/crd/conditions.rs", "pub mod reasons"),
        ("operator/src/llm/probe.rs", "pub mod reasons"),
    ] {
        let source = std::fs::read_to_string(root().join(file)).unwrap_or_default();
        let start = source
            .find(module)
            .unwrap_or_else(|| panic!("{file}: no {module}"));
        let body = &source[start..];
        let end = body.find("\n}\n").unwrap_or(body.len());
        reasons.extend(re.captures_iter(&body[..end]).map(|c| c[1].to_owned()));
    }
    assert!(reasons.len() >= 20, "{reasons:?}");
    for reason in reasons {
        assert!(
            doc.contains(&format!("`{reason}`")),
            "docs/troubleshooting.md does not explain reason {reason}"
        );
    }
}
