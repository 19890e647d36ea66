//! Parsing manifest files: multi-document YAML (or JSON) into typed objects, with every
//! problem reported by file, document, line and field path. One bad document never stops
//! the others from loading.

use super::schema;
use crate::catalog::secrets::UNSET_ENV_ANNOTATION;
use crate::crd::{API_VERSION, ActionProposal, ChatPolicy, GROUP, KortexTool, LLMProvider};
use k8s_openapi::api::core::v1::Secret;
use kube::CustomResourceExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where a document came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Origin {
    /// The file.
    pub file: PathBuf,
    /// 1-based index of the document in the file.
    pub document: usize,
    /// 1-based line where the document starts.
    pub line: usize,
}

/// The kinds Kortex reads from manifests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Kind {
    /// `kortex.dev/v1alpha1 LLMProvider`
    LLMProvider,
    /// `kortex.dev/v1alpha1 KortexTool`
    KortexTool,
    /// `kortex.dev/v1alpha1 ChatPolicy`
    ChatPolicy,
    /// `kortex.dev/v1alpha1 ActionProposal`
    ActionProposal,
    /// `v1 Secret`
    Secret,
}

impl Kind {
    fn from_kind(kind: &str) -> Option<Self> {
        Some(match kind {
            "LLMProvider" => Self::LLMProvider,
            "KortexTool" => Self::KortexTool,
            "ChatPolicy" => Self::ChatPolicy,
            "ActionProposal" => Self::ActionProposal,
            "Secret" => Self::Secret,
            _ => return None,
        })
    }

    /// The `kind` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LLMProvider => "LLMProvider",
            Self::KortexTool => "KortexTool",
            Self::ChatPolicy => "ChatPolicy",
            Self::ActionProposal => "ActionProposal",
            Self::Secret => "Secret",
        }
    }

    fn schema(self) -> Option<&'static Value> {
        static SCHEMAS: OnceLock<[Value; 4]> = OnceLock::new();
        let schemas = SCHEMAS.get_or_init(|| {
            fn of<K: CustomResourceExt>() -> Value {
                let crd = K::crd();
                crd.spec
                    .versions
                    .first()
                    .and_then(|v| v.schema.as_ref())
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .and_then(|s| serde_json::to_value(s).ok())
                    .unwrap_or(Value::Null)
            }
            [
                of::<LLMProvider>(),
                of::<KortexTool>(),
                of::<ChatPolicy>(),
                of::<ActionProposal>(),
            ]
        });
        match self {
            Self::LLMProvider => Some(&schemas[0]),
            Self::KortexTool => Some(&schemas[1]),
            Self::ChatPolicy => Some(&schemas[2]),
            Self::ActionProposal => Some(&schemas[3]),
            Self::Secret => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kind, namespace and name: what makes an object the same object across reloads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Identity {
    /// Kind.
    pub kind: Kind,
    /// Namespace (`default` when unset).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A parsed, valid object.
#[derive(Clone, Debug)]
pub enum Object {
    /// An `LLMProvider`.
    LLMProvider(Box<LLMProvider>),
    /// A `KortexTool`.
    KortexTool(Box<KortexTool>),
    /// A `ChatPolicy`.
    ChatPolicy(Box<ChatPolicy>),
    /// An `ActionProposal`.
    ActionProposal(Box<ActionProposal>),
    /// A `v1/Secret`.
    Secret(Box<Secret>),
}

impl Object {
    /// The object's metadata.
    pub fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::LLMProvider(o) => &mut o.metadata,
            Self::KortexTool(o) => &mut o.metadata,
            Self::ChatPolicy(o) => &mut o.metadata,
            Self::ActionProposal(o) => &mut o.metadata,
            Self::Secret(o) => &mut o.metadata,
        }
    }

    /// What changes bump `metadata.generation`: the spec (or a Secret's content).
    pub fn content_fingerprint(&self) -> String {
        let v = match self {
            Self::LLMProvider(o) => serde_json::to_string(&o.spec),
            Self::KortexTool(o) => serde_json::to_string(&o.spec),
            Self::ChatPolicy(o) => serde_json::to_string(&o.spec),
            Self::ActionProposal(o) => serde_json::to_string(&o.spec),
            Self::Secret(o) => serde_json::to_string(&(
                &o.data,
                &o.string_data,
                &o.metadata.labels,
                &o.metadata.annotations,
            )),
        };
        let bytes = v.unwrap_or_default();
        crate::catalog::secrets::hex(&crate::catalog::secrets::sha256(bytes.as_bytes()))
    }
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Skipped on purpose (e.g. a kind Kortex does not read); nothing is wrong.
    Warning,
    /// The document could not be loaded.
    Error,
}

/// Something wrong with a manifest document.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// Warning or error.
    pub severity: Severity,
    /// Where.
    pub origin: Origin,
    /// Line of the problem itself, when known (1-based, in the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// The object, when the document got far enough to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Identity>,
    /// Field path, e.g. `spec.type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: document {}",
            self.origin.file.display(),
            self.line.unwrap_or(self.origin.line),
            self.origin.document
        )?;
        if let Some(o) = &self.object {
            write!(f, " ({o})")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A document that could not be loaded, with as much identity as could be read.
#[derive(Clone, Debug)]
pub struct Failed {
    /// Where.
    pub origin: Origin,
    /// The object it meant to define, if known.
    pub identity: Option<Identity>,
}

/// Everything read from one file.
#[derive(Debug, Default)]
pub struct FileOutcome {
    /// Valid objects.
    pub objects: Vec<(Origin, Identity, Object)>,
    /// Documents that failed.
    pub failed: Vec<Failed>,
    /// Errors and warnings.
    pub problems: Vec<Problem>,
}

impl FileOutcome {
    /// A document not taken: its problem, and its origin among the failed.
    fn refuse(&mut self, origin: &Origin, problem: Problem) {
        self.problems.push(problem);
        self.failed.push(Failed {
            origin: origin.clone(),
            identity: None,
        });
    }
}

/// Splits a YAML stream into documents: `(1-based start line, text)`. A document separator
/// is a `---` line (optionally followed by content) at column 0; `...` ends a document.
pub fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let is_sep = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if is_sep || line == "..." {
            docs.push((start, std::mem::take(&mut current)));
            start = i + 2;
            if is_sep && line.len() > 3 {
                // `--- value` carries content on the separator line.
                current.push_str(&line[4..]);
                current.push('\n');
                start = i + 1;
            }
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    docs.push((start, current));
    docs.into_iter()
        .filter(|(_, d)| !d.trim().is_empty())
        .collect()
}

/// Parses one file's text. `env` resolves `${VAR}` in Secrets' `stringData`.
pub fn parse_file(file: &Path, text: &str, env: &dyn Fn(&str) -> Option<String>) -> FileOutcome {
    let mut out = FileOutcome::default();
    for (index, (line, doc)) in split_documents(text).into_iter().enumerate() {
        let origin = Origin {
            file: file.to_path_buf(),
            document: index + 1,
            line,
        };
        let value: Value = match serde_saphyr::from_str::<Value>(&doc) {
            Ok(v) => v,
            Err(e) => {
                let at = e.location().map(|l| line + l.line() as usize - 1);
                out.problems.push(Problem {
                    severity: Severity::Error,
                    origin: origin.clone(),
                    line: at,
                    object: None,
                    field: None,
                    message: format!("invalid YAML: {}", yaml_message(&e)),
                });
                out.failed.push(Failed {
                    origin,
                    identity: None,
                });
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        // `kind: List` (as `kubectl get -o yaml` writes) holds objects in `items`.
        if value.get("kind").and_then(Value::as_str) == Some("List")
            && let Some(items) = value.get("items").and_then(Value::as_array)
        {
            for item in items {
                parse_value(&origin, item.clone(), env, &mut out);
            }
            continue;
        }
        parse_value(&origin, value, env, &mut out);
    }
    out
}

fn yaml_message(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    // Drop saphyr's own "line X column Y: " (relative to the document); we report file lines.
    match text
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((_, message)) => message.lines().next().unwrap_or(message).to_owned(),
        None => text.lines().next().unwrap_or(text).to_owned(),
    }
}

/// The string at `pointer` in `value`, or `default` where there is none.
fn text_at(value: &Value, pointer: &str, default: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_owned()
}

// Long because a match over the kinds Kortex reads, with the checks every document goes through
// (mapping, apiVersion, name, namespace) before it.
fn parse_value(
    origin: &Origin,
    value: Value,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut FileOutcome,
) {
    let problem = |field: Option<String>, object: Option<Identity>, message: String| Problem {
        severity: Severity::Error,
        origin: origin.clone(),
        line: None,
        object,
        field,
        message,
    };
    if !value.is_object() {
        out.refuse(
            origin,
            problem(
                None,
                None,
                "document is not a mapping (expected a Kubernetes object)".into(),
            ),
        );
        return;
    }
    let api_version = text_at(&value, "/apiVersion", "");
    let kind_name = text_at(&value, "/kind", "");
    if api_version.is_empty() || kind_name.is_empty() {
        let field = if api_version.is_empty() {
            "apiVersion"
        } else {
            "kind"
        };
        out.refuse(
            origin,
            problem(Some(field.into()), None, "Required value".into()),
        );
        return;
    }
    let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
    let kind = match (api_version.as_str(), Kind::from_kind(&kind_name)) {
        ("v1", Some(Kind::Secret)) => Kind::Secret,
        (API_VERSION, Some(k)) if k != Kind::Secret => k,
        _ if group == GROUP => {
            out.refuse(origin, problem(
                Some("apiVersion".into()),
                None,
                format!("{api_version} {kind_name} is not served by this Kortex (it serves {API_VERSION} LLMProvider, KortexTool, ChatPolicy and ActionProposal)"),
            ));
            return;
        }
        _ => {
            out.problems.push(Problem {
                severity: Severity::Warning,
                ..problem(
                    None,
                    None,
                    format!("skipped {api_version} {kind_name}: not a kind Kortex reads"),
                )
            });
            return;
        }
    };
    let name = text_at(&value, "/metadata/name", "");
    let namespace = text_at(&value, "/metadata/namespace", "default");
    if name.is_empty() {
        out.refuse(
            origin,
            problem(
                Some("metadata.name".into()),
                None,
                format!("Required value: a {kind} needs a name"),
            ),
        );
        return;
    }
    let identity = Identity {
        kind,
        namespace: namespace.clone(),
        name: name.clone(),
    };
    let mut errors: Vec<(Option<String>, String)> = Vec::new();
    for (field, value) in [("metadata.name", &name), ("metadata.namespace", &namespace)] {
        if let Err(message) = check_dns_name(value, if field == "metadata.name" { 253 } else { 63 })
        {
            errors.push((Some(field.into()), message));
        }
    }

    let object =
        match kind {
            Kind::LLMProvider => typed::<LLMProvider>(&value, kind, &mut errors)
                .map(|o| Object::LLMProvider(Box::new(o))),
            Kind::KortexTool => typed::<KortexTool>(&value, kind, &mut errors)
                .map(|o| Object::KortexTool(Box::new(o))),
            Kind::ChatPolicy => typed::<ChatPolicy>(&value, kind, &mut errors)
                .map(|o| Object::ChatPolicy(Box::new(o))),
            Kind::ActionProposal => typed::<ActionProposal>(&value, kind, &mut errors)
                .map(|o| Object::ActionProposal(Box::new(o))),
            Kind::Secret => typed::<Secret>(&value, kind, &mut errors).map(|mut s| {
                substitute_env(&mut s, env);
                Object::Secret(Box::new(s))
            }),
        };
    match object {
        Some(mut object) if errors.is_empty() => {
            object.meta_mut().namespace = Some(namespace);
            out.objects.push((origin.clone(), identity, object));
        }
        _ => {
            for (field, message) in errors {
                out.problems
                    .push(problem(field, Some(identity.clone()), message));
            }
            out.failed.push(Failed {
                origin: origin.clone(),
                identity: Some(identity),
            });
        }
    }
}

/// Deserializes with field paths, then checks for unknown fields and the CRD schema's
/// bounds. Errors are pushed to `errors`; the object is returned only when it parsed.
fn typed<T: DeserializeOwned + serde::Serialize>(
    value: &Value,
    kind: Kind,
    errors: &mut Vec<(Option<String>, String)>,
) -> Option<T> {
    let parsed: T = match serde_path_to_error::deserialize(value) {
        Ok(v) => v,
        Err(e) => {
            let path = e.path().to_string();
            // serde quotes offending values ("invalid type: integer `1234`"); inside a
            // Secret's data that would put a secret into logs and API responses.
            let message = if kind == Kind::Secret
                && (path.starts_with("data") || path.starts_with("stringData"))
            {
                "invalid value (not shown, it is Secret data): stringData values must be strings, data values base64 strings"
                    .to_owned()
            } else {
                e.into_inner().to_string()
            };
            let field = (path != ".").then_some(path);
            errors.push((field, message));
            return None;
        }
    };
    let normalized = match serde_json::to_value(&parsed) {
        Ok(v) => v,
        Err(e) => {
            errors.push((None, format!("cannot normalize object: {e}")));
            return None;
        }
    };
    let mut unknown = Vec::new();
    unknown_fields(value, &normalized, "", &mut unknown);
    for field in unknown {
        errors.push((
            Some(field),
            "unknown field (not in the schema; check its spelling)".into(),
        ));
    }
    if let Some(schema) = kind.schema() {
        for v in schema::validate(schema, &normalized, "") {
            errors.push((Some(v.field), v.message));
        }
    }
    Some(parsed)
}

/// Fields present in `input` that the typed object dropped. Empty values are ignored (the
/// types omit empty lists and unset options when serializing); `status` is not read from
/// manifests, and free-form fields are kept whole by their types, so they never show here.
fn unknown_fields(input: &Value, normalized: &Value, path: &str, out: &mut Vec<String>) {
    match (input, normalized) {
        (Value::Object(inp), Value::Object(norm)) => {
            for (k, v) in inp {
                if path.is_empty() && k == "status" {
                    continue;
                }
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match norm.get(k) {
                    Some(n) => unknown_fields(v, n, &child, out),
                    None if is_empty(v) => {}
                    None => out.push(child),
                }
            }
        }
        (Value::Array(inp), Value::Array(norm)) => {
            for (i, (v, n)) in inp.iter().zip(norm).enumerate() {
                unknown_fields(v, n, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// RFC 1123 names, as Kubernetes requires for object names and namespaces.
fn check_dns_name(name: &str, max: usize) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && (max != 63 || !name.contains('.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {name:?}: must be a lowercase RFC 1123 name (letters, digits, '-'{}), at most {max} characters",
            if max == 63 { "" } else { ", '.'" }
        ))
    }
}

/// Replaces `${VAR}` in `stringData` values with the environment's value (`$${VAR}` is a
/// literal `${VAR}`). A key whose variable is unset is removed, and the annotation
/// [`UNSET_ENV_ANNOTATION`] records which, so the catalog can say why it is missing.
fn substitute_env(secret: &mut Secret, env: &dyn Fn(&str) -> Option<String>) {
    let Some(data) = secret.string_data.as_mut() else {
        return;
    };
    let mut unset: Vec<String> = Vec::new();
    data.retain(|key, value| match expand(value, env) {
        Ok(expanded) => {
            *value = expanded;
            true
        }
        Err(var) => {
            unset.push(format!("{key}={var}"));
            false
        }
    });
    if !unset.is_empty() {
        secret
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(UNSET_ENV_ANNOTATION.to_owned(), unset.join(","));
    }
}

/// Expands `${VAR}`; returns the first unset variable's name on failure.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = escaped;
            continue;
        }
        let var = after
            .strip_prefix("${")
            .and_then(|s| s.find('}').map(|end| (&s[..end], &s[end + 1..])));
        match var {
            Some((name, tail))
                if !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !name.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                match env(name).filter(|v| !v.is_empty()) {
                    Some(v) => out.push_str(&v),
                    None => return Err(name.to_owned()),
                }
                rest = tail;
            }
            _ => {
                out.push('$');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
