//! Where one field of a Kubernetes object lives in a Git repository, and the one-scalar edit
//! that changes it: a plain manifest, a Kustomize overlay (its `replicas:`/`images:` entries
//! or its own files), Helm values files, or a Flux `HelmRelease`'s `spec.values`.
//!
//! Files are never re-serialised: the parser's byte spans locate the scalar and only its
//! bytes are replaced, so comments, blank lines, other documents and CRLF line ends stay as
//! they are and a reviewer sees a one-line change ([`unified_diff`] prints it as `git diff`
//! does). Whatever could make one edit reach further than the one place (an anchor shared
//! through aliases, a merge key, a base other overlays share, a path leaving the overlay) is
//! refused with a [`NotFound`] that says what was looked at and what the person can do.
//!
//! Pure: the caller hands in the files; no I/O, no kube. Imports nothing from the crate.

use std::fmt::{self, Write as _};
use std::ops::Range;

use granit_parser::{Event, Parser, ScalarStyle};

/// One file of the repository, path relative to the repository root (forward slashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Path relative to the repository root, `/`-separated, e.g. `apps/api.yaml`.
    pub path: String,
    /// The file's whole text.
    pub text: String,
}

/// The object whose field changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The object's kind, e.g. `Deployment`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`. A manifest without one matches any namespace, and `None`
    /// matches any manifest.
    pub namespace: Option<String>,
    /// For an image change: the container whose image changes (else any container running
    /// the old image, if exactly one does).
    pub container: Option<String>,
}

/// The change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Set the replica count.
    Replicas(i64),
    /// Replace a full image reference (`reg.io/team/api:v2`, or `repo@sha256:…`) by another.
    Image {
        /// The image the object runs now.
        from: String,
        /// The image it should run.
        to: String,
    },
}

/// How the source is laid out (decided by the caller from Argo CD / Flux).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Plain manifests in `dir` (directory relative to repo root; "" = root). Recursive.
    Plain {
        /// The directory, relative to the repository root.
        dir: String,
    },
    /// A Kustomize overlay whose kustomization.yaml / kustomization.yml / Kustomization is in `dir`.
    Kustomize {
        /// The overlay's directory, relative to the repository root.
        dir: String,
    },
    /// Helm values: the values files (paths relative to repo root, in the order Helm merges
    /// them: later wins), chart dir `dir`.
    HelmValues {
        /// The chart's directory; its `values.yaml` holds the chart's defaults.
        dir: String,
        /// The release's values files, relative to the repository root, lowest priority first.
        value_files: Vec<String>,
    },
    /// A Flux HelmRelease manifest named `release` somewhere under `dir`: its `spec.values`.
    HelmRelease {
        /// The directory the HelmRelease manifest is under.
        dir: String,
        /// The HelmRelease's `metadata.name`.
        release: String,
    },
}

/// A located one-scalar edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The file, relative to the repository root.
    pub path: String,
    /// 1-based line of the scalar.
    pub line: usize,
    /// The whole file before.
    pub before: String,
    /// The whole file after: `before` with only the scalar's bytes replaced.
    pub after: String,
    /// Human-readable: e.g. "spec.replicas of Deployment api in apps/api.yaml (document 2)",
    /// "replicas[name=api].count in overlays/prod/kustomization.yaml" or
    /// "values replicaCount in charts/api/values-prod.yaml".
    pub field: String,
    /// The old scalar value.
    pub old: String,
    /// The new scalar value.
    pub new: String,
}

/// Why no single place was found; the message says what was looked at and what the person
/// could do (e.g. "propose again with params.valuesPath").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

/// Finds the one scalar that carries `change` for `target` in the repository `files` laid out
/// as `layout`, and edits it. `values_path` (Helm layouts only: a dotted key such as
/// `api.replicaCount`, relative to the values or to `spec.values`) says where the value is
/// when it cannot be inferred.
pub fn locate(
    layout: &Layout,
    files: &[File],
    target: &Target,
    change: &Change,
    values_path: Option<&str>,
) -> Result<Edit, NotFound> {
    check_change(change)?;
    match layout {
        Layout::Plain { dir } => plain(files, &clean_dir(dir), target, change),
        Layout::Kustomize { dir } => kustomize(files, &clean_dir(dir), target, change),
        Layout::HelmValues { dir, value_files } => {
            helm_values(files, &clean_dir(dir), value_files, change, values_path)
        }
        Layout::HelmRelease { dir, release } => {
            helm_release(files, &clean_dir(dir), release, change, values_path)
        }
    }
}

/// Sets the scalar at `path` (mapping keys; a number indexes a sequence) in document `doc`
/// (0-based) of `text` to `new`, keeping its quoting style and every other byte. Returns the
/// new text, the scalar's 1-based line and its old value. Refuses what [`locate`] refuses:
/// a path through an alias, an anchor or a merge key, a block or multi-line scalar, an
/// implicit (empty) value, and a value that already is `new`.
pub fn set_scalar(
    text: &str,
    doc: usize,
    path: &[&str],
    new: &str,
) -> Result<(String, usize, String), NotFound> {
    let docs =
        parse_documents(text).map_err(|e| NotFound(format!("the text does not parse: {e}")))?;
    let root = docs.get(doc).ok_or_else(|| {
        NotFound(format!(
            "there is no document {} (it has {})",
            doc + 1,
            docs.len()
        ))
    })?;
    let key = path.join(".");
    let node = walk(root, path)
        .map_err(|why| NotFound(format!("{key}: {why}")))?
        .ok_or_else(|| NotFound(format!("{key} is not set")))?;
    let scalar = node
        .scalar()
        .ok_or_else(|| NotFound(format!("{key} is not a single value")))?;
    if scalar.value == new {
        return Err(NotFound(format!("{key} is already {new}")));
    }
    let after = rewrite(text, node, new).map_err(|why| NotFound(format!("{key}: {why}")))?;
    Ok((after, scalar.line, scalar.value.clone()))
}

fn check_change(change: &Change) -> Result<(), NotFound> {
    match change {
        Change::Replicas(n) if *n < 0 => {
            Err(NotFound(format!("replicas must not be negative (got {n})")))
        }
        Change::Image { from, to } if from.trim().is_empty() || to.trim().is_empty() => Err(
            NotFound("an image change needs both the old and the new image".into()),
        ),
        Change::Image { from, to } if from == to => Err(NotFound(format!(
            "the old and the new image are the same ({from}): nothing to change"
        ))),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// The light tree: mappings, sequences and scalars with their source byte ranges.

#[derive(Debug)]
struct Node {
    kind: NodeKind,
    /// `&anchor` on this node: aliases elsewhere may share it.
    anchored: bool,
}

#[derive(Debug)]
enum NodeKind {
    Scalar(Scalar),
    Map(Vec<(Node, Node)>),
    Seq(Vec<Node>),
    Alias,
}

#[derive(Debug)]
struct Scalar {
    /// The value after YAML escape processing.
    value: String,
    style: ScalarStyle,
    /// Byte range of the scalar's source text, quotes included (empty for an implicit null).
    range: Range<usize>,
    /// 1-based line where it starts.
    line: usize,
}

enum Frame {
    Map {
        anchored: bool,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
    Seq {
        anchored: bool,
        items: Vec<Node>,
    },
}

impl Frame {
    fn add(&mut self, node: Node) {
        match self {
            Frame::Map { entries, key, .. } => match key.take() {
                Some(k) => entries.push((k, node)),
                None => *key = Some(node),
            },
            Frame::Seq { items, .. } => items.push(node),
        }
    }

    fn into_node(self) -> Node {
        match self {
            Frame::Map {
                anchored, entries, ..
            } => Node {
                kind: NodeKind::Map(entries),
                anchored,
            },
            Frame::Seq { anchored, items } => Node {
                kind: NodeKind::Seq(items),
                anchored,
            },
        }
    }
}

/// Every document of `text`, in order.
fn parse_documents(text: &str) -> Result<Vec<Node>, String> {
    let mut parser = Parser::new_from_str(text);
    let mut docs = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| e.to_string())?;
        let node = match event {
            Event::Scalar(value, style, anchor, _) => {
                let range = span.byte_range().ok_or("the parser gave no byte offsets")?;
                let scalar = Scalar {
                    value: value.into_owned(),
                    style,
                    range,
                    line: span.start.line(),
                };
                Node {
                    kind: NodeKind::Scalar(scalar),
                    anchored: anchor != 0,
                }
            }
            Event::Alias(_) => Node {
                kind: NodeKind::Alias,
                anchored: false,
            },
            Event::MappingStart(_, anchor, _) => {
                stack.push(Frame::Map {
                    anchored: anchor != 0,
                    entries: Vec::new(),
                    key: None,
                });
                continue;
            }
            Event::SequenceStart(_, anchor, _) => {
                stack.push(Frame::Seq {
                    anchored: anchor != 0,
                    items: Vec::new(),
                });
                continue;
            }
            Event::MappingEnd | Event::SequenceEnd => match stack.pop() {
                Some(frame) => frame.into_node(),
                None => return Err("unbalanced collection end".into()),
            },
            _ => continue,
        };
        match stack.last_mut() {
            Some(frame) => frame.add(node),
            None => docs.push(node),
        }
    }
    Ok(docs)
}

impl Node {
    fn scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            NodeKind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    fn str(&self) -> Option<&str> {
        self.scalar().map(|s| s.value.as_str())
    }

    fn entries(&self) -> &[(Node, Node)] {
        match &self.kind {
            NodeKind::Map(entries) => entries,
            _ => &[],
        }
    }

    fn items(&self) -> &[Node] {
        match &self.kind {
            NodeKind::Seq(items) => items,
            _ => &[],
        }
    }

    fn is_map(&self) -> bool {
        matches!(self.kind, NodeKind::Map(_))
    }

    /// Lenient read (identity fields): the first value under `key`.
    fn get(&self, key: &str) -> Option<&Node> {
        self.entries()
            .iter()
            .find(|(k, _)| k.str() == Some(key))
            .map(|(_, v)| v)
    }

    fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Node::str)
    }
}

/// One step down on the way to a scalar that will be edited. Refuses what would make the
/// edit reach further than the one place: an alias, an anchored node aliases may share, a
/// merge key that may supply the key, a duplicate key.
fn step<'a>(node: &'a Node, key: &str) -> Result<Option<&'a Node>, String> {
    if node.anchored {
        return Err(format!(
            "the node holding `{key}` has an anchor (&), so aliases elsewhere share it"
        ));
    }
    match &node.kind {
        NodeKind::Alias => Err(format!("`{key}` is reached through an alias (*)")),
        NodeKind::Map(entries) => {
            let mut found = entries.iter().filter(|(k, _)| k.str() == Some(key));
            let first = found.next();
            if found.next().is_some() {
                return Err(format!("`{key}` appears twice in one mapping"));
            }
            match first {
                Some((_, value)) if matches!(value.kind, NodeKind::Alias) => Err(format!(
                    "`{key}` is an alias (*) of a value defined elsewhere"
                )),
                Some((_, value)) => Ok(Some(value)),
                None if entries.iter().any(|(k, _)| k.str() == Some("<<")) => {
                    Err(format!("a merge key (<<) may supply `{key}`"))
                }
                None => Ok(None),
            }
        }
        NodeKind::Seq(items) => Ok(key.parse::<usize>().ok().and_then(|i| items.get(i))),
        NodeKind::Scalar(_) => Ok(None),
    }
}

/// [`step`] along `path`; `Ok(None)` when a key is absent.
fn walk<'a>(root: &'a Node, path: &[&str]) -> Result<Option<&'a Node>, String> {
    let mut node = root;
    for key in path {
        match step(node, key)? {
            Some(next) => node = next,
            None => return Ok(None),
        }
    }
    Ok(Some(node))
}

/// The items of a sequence reached for editing; an anchored or aliased one is refused.
fn strict_items(node: &Node) -> Result<&[Node], String> {
    match &node.kind {
        _ if node.anchored => {
            Err("the list has an anchor (&), so aliases elsewhere share it".into())
        }
        NodeKind::Alias => Err("the list is an alias (*) of one defined elsewhere".into()),
        NodeKind::Seq(items) => Ok(items),
        _ => Err("it is not a list".into()),
    }
}

// ---------------------------------------------------------------------------------------
// Rewriting one scalar.

/// `text` with the scalar `node` set to `new` in the scalar's own style, or why not.
fn rewrite(text: &str, node: &Node, new: &str) -> Result<String, String> {
    if node.anchored {
        return Err("it has an anchor (&), so aliases elsewhere share it".into());
    }
    let scalar = match &node.kind {
        NodeKind::Scalar(s) => s,
        NodeKind::Alias => return Err("it is an alias (*) of a value defined elsewhere".into()),
        _ => return Err("it is not a single value".into()),
    };
    if matches!(scalar.style, ScalarStyle::Literal | ScalarStyle::Folded) {
        return Err("it is a block scalar (| or >); change it by hand".into());
    }
    let source = text
        .get(scalar.range.clone())
        .ok_or("its position is outside the file")?;
    if source.is_empty() {
        return Err("it has no value written (an implicit null); add it by hand".into());
    }
    if source.contains('\n') {
        return Err("it spans several lines; change it by hand".into());
    }
    let head = text
        .get(..scalar.range.start)
        .ok_or("its position is outside the file")?;
    let tail = text
        .get(scalar.range.end..)
        .ok_or("its position is outside the file")?;
    Ok(format!("{head}{}{tail}", render_scalar(scalar, new)))
}

/// `new` written in `old`'s style: plain stays plain unless that would change what it means,
/// single- and double-quoted stay quoted.
fn render_scalar(old: &Scalar, new: &str) -> String {
    match old.style {
        ScalarStyle::SingleQuoted if !new.chars().any(char::is_control) => {
            format!("'{}'", new.replace('\'', "''"))
        }
        ScalarStyle::Plain if plain_keeps_meaning(new, &old.value) => new.to_owned(),
        _ => double_quoted(new),
    }
}

/// Whether `new`, written plain where `old` was plain, still reads as the string (or number)
/// meant: not empty, no indicator first, no `: ` or ` #`, not a YAML 1.1/1.2 reserved word, and
/// a number only where the old one was a number too and only in its canonical spelling (a
/// tag `1.10` would read as 1.1).
fn plain_keeps_meaning(new: &str, old: &str) -> bool {
    const INDICATORS: &str = "-?:,[]{}#&*!|>'\"%@`";
    let Some(first) = new.chars().next() else {
        return false;
    };
    if INDICATORS.contains(first) || new.trim() != new {
        return false;
    }
    if new.contains(": ") || new.contains(" #") || new.ends_with(':') {
        return false;
    }
    if new.chars().any(|c| c.is_control() || ",[]{}".contains(c)) || is_reserved_word(new) {
        return false;
    }
    match (looks_numeric(new), looks_numeric(old)) {
        (false, _) => true,
        (true, true) => canonical_number(new),
        (true, false) => false,
    }
}

fn is_reserved_word(s: &str) -> bool {
    const WORDS: [&str; 12] = [
        "~", "null", "true", "false", "yes", "no", "on", "off", "y", "n", "=", "<<",
    ];
    WORDS.contains(&s.to_ascii_lowercase().as_str())
}

/// Whether a plain scalar `s` would be read as a number (YAML 1.2 core or 1.1: underscores,
/// 0x/0o/0b, sexagesimal, .inf/.nan) or a date.
fn looks_numeric(s: &str) -> bool {
    let body = s
        .strip_prefix(['+', '-'])
        .unwrap_or(s)
        .to_ascii_lowercase()
        .replace('_', "");
    if body.is_empty() {
        return false;
    }
    if body == ".inf" || body == ".nan" {
        return true;
    }
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = body.strip_prefix(prefix) {
            return !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
        }
    }
    if body.contains(':') {
        return body
            .split(':')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit() || c == '.'));
    }
    let date = body
        .get(..4)
        .is_some_and(|y| y.chars().all(|c| c.is_ascii_digit()))
        && body.get(4..5) == Some("-");
    date || (body.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && body.parse::<f64>().is_ok())
}

/// Whether `s` is a number written the way it reads back (`5`, `1.9`; not `05`, `1.10`).
fn canonical_number(s: &str) -> bool {
    if let Ok(i) = s.parse::<i64>() {
        return i.to_string() == s;
    }
    s.parse::<f64>()
        .is_ok_and(|f| f.is_finite() && f.to_string() == s)
}

fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------
// Shared pieces of the search.

/// Why a place was not found. `Absent`: nothing here, another source may hold the value (a
/// Kustomize overlay then looks in its files, then names its bases). `Blocked`: found but not
/// editable as asked, or ambiguous: final.
#[derive(Debug)]
enum Miss {
    Absent(String),
    Blocked(String),
}

impl Miss {
    fn message(self) -> String {
        match self {
            Miss::Absent(m) | Miss::Blocked(m) => m,
        }
    }
}

/// A parsed repository file.
struct Parsed<'a> {
    file: &'a File,
    docs: Vec<Node>,
}

/// One document of a parsed file.
struct Doc<'a> {
    file: &'a File,
    root: &'a Node,
    index: usize,
    count: usize,
}

impl Doc<'_> {
    fn describe(&self) -> String {
        if self.count > 1 {
            format!("{} (document {})", self.file.path, self.index + 1)
        } else {
            self.file.path.clone()
        }
    }
}

fn clean_dir(dir: &str) -> String {
    let dir = dir.trim_start_matches("./").trim_end_matches('/');
    if dir == "." {
        String::new()
    } else {
        dir.to_owned()
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    dir.is_empty()
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn shown_dir(dir: &str) -> String {
    if dir.is_empty() {
        "the repository root".into()
    } else {
        format!("{dir}/")
    }
}

fn is_yaml(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".yaml") || name.ends_with(".yml") || name == "Kustomization"
}

/// Parses `files`; the ones that do not parse come back as "path (error)" notes.
fn parse_files<'a>(files: impl IntoIterator<Item = &'a File>) -> (Vec<Parsed<'a>>, Vec<String>) {
    let mut parsed = Vec::new();
    let mut broken = Vec::new();
    for file in files {
        match parse_documents(&file.text) {
            Ok(docs) => parsed.push(Parsed { file, docs }),
            Err(e) => broken.push(format!("{} ({e})", file.path)),
        }
    }
    (parsed, broken)
}

fn yaml_under<'a>(files: &'a [File], dir: &'a str) -> impl Iterator<Item = &'a File> {
    files
        .iter()
        .filter(move |f| is_under(&f.path, dir) && is_yaml(&f.path))
}

/// "a, b and 3 more" for messages.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 8;
    if names.is_empty() {
        return "none".into();
    }
    let mut out = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        let _ = write!(out, " and {} more", names.len() - SHOWN);
    }
    out
}

fn with_broken(message: String, broken: &[String]) -> String {
    if broken.is_empty() {
        message
    } else {
        format!(
            "{message} (skipped, as they do not parse: {})",
            list(broken)
        )
    }
}

fn describe_target(target: &Target) -> String {
    match &target.namespace {
        Some(ns) => format!("{} {ns}/{}", target.kind, target.name),
        None => format!("{} {}", target.kind, target.name),
    }
}

fn is_target(root: &Node, target: &Target) -> bool {
    let Some(metadata) = root.get("metadata") else {
        return false;
    };
    let namespace_fits = match (metadata.get_str("namespace"), &target.namespace) {
        (Some(ns), Some(want)) => ns == want,
        _ => true,
    };
    root.get_str("kind") == Some(target.kind.as_str())
        && metadata.get_str("name") == Some(target.name.as_str())
        && namespace_fits
}

fn already(field: &str, value: &str) -> String {
    format!(
        "{field} is already {value} in Git: the cluster differs from Git — the GitOps tool has \
         not synced yet, or something else changed the live object"
    )
}

/// The edit of the scalar `node` of `file` to `new`, described as `field`.
fn edit(file: &File, node: &Node, new: &str, field: String) -> Result<Edit, Miss> {
    let old = node
        .str()
        .ok_or_else(|| Miss::Blocked(format!("{field} is not a single value")))?;
    if old == new {
        return Err(Miss::Blocked(already(&field, new)));
    }
    let after = rewrite(&file.text, node, new)
        .map_err(|why| Miss::Blocked(format!("{field} cannot be edited in place: {why}")))?;
    let line = node.scalar().map_or(0, |s| s.line);
    Ok(Edit {
        path: file.path.clone(),
        line,
        before: file.text.clone(),
        after,
        field,
        old: old.to_owned(),
        new: new.to_owned(),
    })
}

// ---------------------------------------------------------------------------------------
// Plain manifests.

fn plain(files: &[File], dir: &str, target: &Target, change: &Change) -> Result<Edit, NotFound> {
    let (parsed, broken) = parse_files(yaml_under(files, dir));
    manifest_edit(&parsed, target, change).map_err(|miss| {
        let message = match miss {
            Miss::Absent(_) if parsed.is_empty() => format!(
                "there are no YAML files under {} to look for {} in",
                shown_dir(dir),
                describe_target(target)
            ),
            other => other.message(),
        };
        NotFound(with_broken(message, &broken))
    })
}

/// The target's manifest among `parsed` and the edit of its field.
fn manifest_edit(parsed: &[Parsed], target: &Target, change: &Change) -> Result<Edit, Miss> {
    let docs: Vec<Doc> = parsed
        .iter()
        .flat_map(|p| {
            p.docs.iter().enumerate().map(|(index, root)| Doc {
                file: p.file,
                root,
                index,
                count: p.docs.len(),
            })
        })
        .filter(|doc| is_target(doc.root, target))
        .collect();
    let doc = match docs.as_slice() {
        [] => {
            let looked: Vec<String> = parsed.iter().map(|p| p.file.path.clone()).collect();
            return Err(Miss::Absent(format!(
                "no manifest of {} (kind, metadata.name, metadata.namespace) in {}",
                describe_target(target),
                list(&looked)
            )));
        }
        [doc] => doc,
        many => {
            let places: Vec<String> = many.iter().map(Doc::describe).collect();
            return Err(Miss::Blocked(format!(
                "{} is defined {} times: {}; Kortex cannot tell which one is applied",
                describe_target(target),
                many.len(),
                list(&places)
            )));
        }
    };
    match change {
        Change::Replicas(n) => manifest_replicas(doc, target, *n),
        Change::Image { from, to } => manifest_image(doc, target, from, to),
    }
}

fn manifest_replicas(doc: &Doc, target: &Target, n: i64) -> Result<Edit, Miss> {
    let field = format!(
        "spec.replicas of {} {} in {}",
        target.kind,
        target.name,
        doc.describe()
    );
    match walk(doc.root, &["spec", "replicas"]) {
        Err(why) => Err(Miss::Blocked(format!("{field}: {why}"))),
        Ok(None) => Err(Miss::Absent(format!(
            "{} {} in {} has no spec.replicas: Kubernetes defaults it to 1; add `replicas:` \
             by hand (Kortex changes one existing line, never adds one)",
            target.kind,
            target.name,
            doc.describe()
        ))),
        Ok(Some(node)) => edit(doc.file, node, &n.to_string(), field),
    }
}

/// Where a kind keeps its pod template's spec.
fn pod_spec_path(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &["spec"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        _ => &["spec", "template", "spec"],
    }
}

/// A container image scalar seen in a manifest.
struct ImageSpot<'a> {
    container: String,
    field: String,
    node: &'a Node,
    value: String,
}

/// Every (init)container image of the manifest (of `target.container` when set); what could
/// not be read for editing comes back as notes.
fn container_images<'a>(doc: &Doc<'a>, target: &Target) -> (Vec<ImageSpot<'a>>, Vec<String>) {
    let pod = pod_spec_path(&target.kind);
    let mut spots = Vec::new();
    let mut notes = Vec::new();
    for list_key in ["containers", "initContainers"] {
        let path: Vec<&str> = pod.iter().copied().chain([list_key]).collect();
        let items = match walk(doc.root, &path).and_then(|seq| seq.map(strict_items).transpose()) {
            Ok(Some(items)) => items,
            Ok(None) => continue,
            Err(why) => {
                notes.push(format!("{}: {why}", path.join(".")));
                continue;
            }
        };
        for item in items {
            let name = item.get_str("name").unwrap_or("(unnamed)").to_owned();
            if target.container.as_deref().is_some_and(|want| want != name) {
                continue;
            }
            let field = format!("{}[name={name}].image", path.join("."));
            match step(item, "image") {
                Ok(Some(node)) => {
                    let value = node.str().unwrap_or_default().to_owned();
                    spots.push(ImageSpot {
                        container: name,
                        field,
                        node,
                        value,
                    });
                }
                Ok(None) => {}
                Err(why) => notes.push(format!("{field}: {why}")),
            }
        }
    }
    (spots, notes)
}

fn manifest_image(doc: &Doc, target: &Target, from: &str, to: &str) -> Result<Edit, Miss> {
    let (spots, notes) = container_images(doc, target);
    let owner = format!("{} {} in {}", target.kind, target.name, doc.describe());
    let hits: Vec<&ImageSpot> = spots.iter().filter(|s| s.value == from).collect();
    match hits.as_slice() {
        [hit] => edit(doc.file, hit.node, to, format!("{} of {owner}", hit.field)),
        [] => {
            if let Some(done) = spots.iter().find(|s| s.value == to) {
                return Err(Miss::Blocked(already(
                    &format!("{} of {owner}", done.field),
                    to,
                )));
            }
            let which = match &target.container {
                Some(c) => format!("container {c} of {owner} does not run"),
                None => format!("no container of {owner} runs"),
            };
            let seen: Vec<String> = spots
                .iter()
                .map(|s| format!("{} runs {}", s.container, s.value))
                .collect();
            let mut message = format!("{which} {from} in Git (seen: {})", list(&seen));
            if !notes.is_empty() {
                let _ = write!(message, "; not read: {}", list(&notes));
            }
            Err(Miss::Absent(message))
        }
        many => {
            let names: Vec<String> = many.iter().map(|s| s.container.clone()).collect();
            Err(Miss::Blocked(format!(
                "containers {} of {owner} all run {from}; propose again with params.container \
                 naming the one to change",
                list(&names)
            )))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Images.

/// An image reference split into repository, tag and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageRef {
    repo: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    /// `host:5000/a/b:tag@sha256:…` → (`host:5000/a/b`, `tag`, `sha256:…`): a colon is a tag
    /// separator only after the last slash.
    fn parse(image: &str) -> ImageRef {
        let (name, digest) = match image.split_once('@') {
            Some((name, digest)) => (name, Some(digest.to_owned())),
            None => (image, None),
        };
        let last_part = name.rfind('/').map_or(0, |i| i + 1);
        match name.rfind(':').filter(|&i| i >= last_part) {
            Some(i) => ImageRef {
                repo: name.get(..i).unwrap_or(name).to_owned(),
                tag: name.get(i + 1..).map(str::to_owned),
                digest,
            },
            None => ImageRef {
                repo: name.to_owned(),
                tag: None,
                digest,
            },
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// The one part of an image reference a change alters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Repo,
    Tag,
    Digest,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Repo => "repository",
            Part::Tag => "tag",
            Part::Digest => "digest",
        }
    }

    fn of(self, image: &ImageRef) -> Option<&str> {
        match self {
            Part::Repo => Some(&image.repo),
            Part::Tag => image.tag.as_deref(),
            Part::Digest => image.digest.as_deref(),
        }
    }
}

/// Which single part `from → to` changes, or why it is not a one-part change.
fn changed_part(from: &ImageRef, to: &ImageRef) -> Result<Part, String> {
    let repo = from.repo != to.repo;
    let tag = from.tag != to.tag;
    let digest = from.digest != to.digest;
    match (repo, tag, digest) {
        (true, false, false) => Ok(Part::Repo),
        (false, true, false) if from.tag.is_some() && to.tag.is_some() => Ok(Part::Tag),
        (false, false, true) if from.digest.is_some() && to.digest.is_some() => Ok(Part::Digest),
        _ => Err(format!(
            "{from} → {to} changes more than one of repository, tag and digest (or adds or \
             removes one), and a one-line change can carry only one"
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Kustomize.

const KUSTOMIZATION_NAMES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

fn kustomize(
    files: &[File],
    dir: &str,
    target: &Target,
    change: &Change,
) -> Result<Edit, NotFound> {
    let kfile = KUSTOMIZATION_NAMES
        .iter()
        .find_map(|name| files.iter().find(|f| f.path == join(dir, name)))
        .ok_or_else(|| {
            NotFound(format!(
                "there is no kustomization.yaml, kustomization.yml or Kustomization in {}",
                shown_dir(dir)
            ))
        })?;
    let docs = parse_documents(&kfile.text)
        .map_err(|e| NotFound(format!("{} does not parse: {e}", kfile.path)))?;
    let root = docs
        .first()
        .ok_or_else(|| NotFound(format!("{} is empty", kfile.path)))?;
    let entry = match change {
        Change::Replicas(n) => kustomize_replicas(kfile, root, target, *n),
        Change::Image { from, to } => {
            kustomize_image(kfile, root, &ImageRef::parse(from), &ImageRef::parse(to))
        }
    };
    let entry_note = match entry {
        Ok(edit) => return Ok(edit),
        Err(Miss::Blocked(m)) => return Err(NotFound(m)),
        Err(Miss::Absent(m)) => m,
    };
    let sources = overlay_sources(files, dir, root);
    let (parsed, broken) = parse_files(sources.files.iter().copied());
    match manifest_edit(&parsed, target, change) {
        Ok(edit) => Ok(edit),
        Err(Miss::Blocked(m)) => Err(NotFound(m)),
        Err(Miss::Absent(files_note)) => {
            let message =
                from_base_message(kfile, target, change, &sources, &entry_note, &files_note);
            Err(NotFound(with_broken(message, &broken)))
        }
    }
}

fn kustomize_replicas(kfile: &File, root: &Node, target: &Target, n: i64) -> Result<Edit, Miss> {
    let blocked = |why: String| Miss::Blocked(format!("replicas in {}: {why}", kfile.path));
    let items = match walk(root, &["replicas"]) {
        Ok(Some(seq)) => strict_items(seq).map_err(blocked)?,
        Ok(None) => {
            return Err(Miss::Absent(format!(
                "{} has no `replicas:` list",
                kfile.path
            )));
        }
        Err(why) => return Err(blocked(why)),
    };
    let hits: Vec<&Node> = items
        .iter()
        .filter(|e| e.get_str("name") == Some(target.name.as_str()))
        .collect();
    let field = format!("replicas[name={}].count in {}", target.name, kfile.path);
    match hits.as_slice() {
        [] => Err(Miss::Absent(format!(
            "{} has no `replicas:` entry named {}",
            kfile.path, target.name
        ))),
        [entry] => match step(entry, "count") {
            Ok(Some(count)) => edit(kfile, count, &n.to_string(), field),
            Ok(None) => Err(Miss::Blocked(format!(
                "{field} is not set; add `count: {n}` by hand"
            ))),
            Err(why) => Err(Miss::Blocked(format!("{field}: {why}"))),
        },
        _ => Err(Miss::Blocked(format!(
            "{} has several `replicas:` entries named {}",
            kfile.path, target.name
        ))),
    }
}

/// The image an `images:` entry produces (`newName` or `name`, `newTag`, `digest`).
fn entry_image(entry: &Node) -> Option<ImageRef> {
    let repo = entry.get_str("newName").or_else(|| entry.get_str("name"))?;
    Some(ImageRef {
        repo: repo.to_owned(),
        tag: entry.get_str("newTag").map(str::to_owned),
        digest: entry.get_str("digest").map(str::to_owned),
    })
}

fn kustomize_image(
    kfile: &File,
    root: &Node,
    from: &ImageRef,
    to: &ImageRef,
) -> Result<Edit, Miss> {
    let blocked = |why: String| Miss::Blocked(format!("images in {}: {why}", kfile.path));
    let items = match walk(root, &["images"]) {
        Ok(Some(seq)) => strict_items(seq).map_err(blocked)?,
        Ok(None) => {
            return Err(Miss::Absent(format!(
                "{} has no `images:` list",
                kfile.path
            )));
        }
        Err(why) => return Err(blocked(why)),
    };
    let produced: Vec<(&Node, ImageRef)> = items
        .iter()
        .filter_map(|e| entry_image(e).map(|image| (e, image)))
        .collect();
    let hits: Vec<&(&Node, ImageRef)> = produced
        .iter()
        .filter(|(_, image)| image.repo == from.repo)
        .collect();
    match hits.as_slice() {
        [(entry, current)] => kustomize_image_entry(kfile, entry, current, from, to),
        [] => match produced.iter().find(|(_, image)| image == to) {
            Some((entry, _)) => {
                let name = entry.get_str("name").unwrap_or_default();
                Err(Miss::Blocked(already(
                    &format!("images[name={name}] in {}", kfile.path),
                    &to.to_string(),
                )))
            }
            None => Err(Miss::Absent(format!(
                "{} has no `images:` entry for {}",
                kfile.path, from.repo
            ))),
        },
        _ => Err(Miss::Blocked(format!(
            "{} has several `images:` entries for {}",
            kfile.path, from.repo
        ))),
    }
}

/// The edit of the one scalar of a matching `images:` entry that turns `from` into `to`.
fn kustomize_image_entry(
    kfile: &File,
    entry: &Node,
    current: &ImageRef,
    from: &ImageRef,
    to: &ImageRef,
) -> Result<Edit, Miss> {
    let name = entry.get_str("name").unwrap_or_default();
    let label = format!("images[name={name}] in {}", kfile.path);
    let sets_suffix = current.tag.is_some() || current.digest.is_some();
    if sets_suffix && (current.tag != from.tag || current.digest != from.digest) {
        return Err(Miss::Blocked(if current == to {
            already(&label, &to.to_string())
        } else {
            format!(
                "{label} makes the image {current}, but the cluster runs {from}: the cluster \
                 differs from Git — the GitOps tool has not synced yet, or something else changed it"
            )
        }));
    }
    let part = changed_part(from, to).map_err(|why| Miss::Blocked(format!("{label}: {why}")))?;
    if !sets_suffix && part != Part::Repo {
        return Err(Miss::Blocked(format!(
            "{label} sets no newTag or digest, so the {} comes from the base; add `newTag:` to \
             the entry by hand",
            part.name()
        )));
    }
    let key = match part {
        Part::Repo => "newName",
        Part::Tag => "newTag",
        Part::Digest => "digest",
    };
    let value = part.of(to).unwrap_or_default();
    match step(entry, key) {
        Ok(Some(node)) => edit(
            kfile,
            node,
            value,
            format!("images[name={name}].{key} in {}", kfile.path),
        ),
        Ok(None) => Err(Miss::Blocked(format!(
            "{label} has no `{key}:`; changing the {} would add a line: add `{key}: {value}` by hand",
            part.name()
        ))),
        Err(why) => Err(Miss::Blocked(format!("{label}: {why}"))),
    }
}

/// What a kustomization points at: its own manifest and patch files (inside the overlay),
/// the bases it builds on, and the entries refused.
struct OverlaySources<'a> {
    files: Vec<&'a File>,
    bases: Vec<String>,
    refused: Vec<String>,
}

/// Resolves `rel` (a kustomization entry) against the overlay `dir`: refuses URLs (remote
/// bases), absolute paths and paths leaving the overlay.
fn resolve_in(dir: &str, rel: &str) -> Result<String, String> {
    let remote = rel.contains("://")
        || rel.starts_with("git@")
        || rel.starts_with("github.com/")
        || rel.contains("?ref=");
    if remote {
        return Err("a remote base, not read".into());
    }
    if rel.starts_with('/') || rel.contains('\\') || rel.get(1..2) == Some(":") {
        return Err("an absolute path, not read".into());
    }
    let mut parts: Vec<&str> = Vec::new();
    for segment in rel.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err("outside the overlay, not read".into());
                }
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return Err("the overlay directory itself".into());
    }
    Ok(join(dir, &parts.join("/")))
}

/// The path entries of a kustomization: (list key, entry, whether it may be a base).
fn kustomization_entries(root: &Node) -> Vec<(&'static str, &str, bool)> {
    let mut out = Vec::new();
    for key in ["resources", "bases", "components"] {
        for item in root.get(key).map(Node::items).unwrap_or_default() {
            out.extend(item.str().map(|rel| (key, rel, true)));
        }
    }
    for item in root
        .get("patchesStrategicMerge")
        .map(Node::items)
        .unwrap_or_default()
    {
        // An entry holding YAML is an inline patch, not a path.
        out.extend(
            item.str()
                .filter(|s| !s.contains('\n'))
                .map(|rel| ("patchesStrategicMerge", rel, false)),
        );
    }
    for item in root.get("patches").map(Node::items).unwrap_or_default() {
        out.extend(item.get_str("path").map(|rel| ("patches", rel, false)));
    }
    out
}

fn overlay_sources<'a>(files: &'a [File], dir: &str, root: &Node) -> OverlaySources<'a> {
    let mut sources = OverlaySources {
        files: Vec::new(),
        bases: Vec::new(),
        refused: Vec::new(),
    };
    for (key, rel, may_be_base) in kustomization_entries(root) {
        match resolve_in(dir, rel) {
            Err(why) if may_be_base => sources.bases.push(format!("{rel} ({why})")),
            Err(why) => sources.refused.push(format!("{key} {rel}: {why}")),
            Ok(path) => {
                if let Some(file) = files.iter().find(|f| f.path == path) {
                    if is_yaml(&file.path) && !sources.files.iter().any(|f| f.path == file.path) {
                        sources.files.push(file);
                    }
                } else if may_be_base && files.iter().any(|f| is_under(&f.path, &path)) {
                    sources.bases.push(rel.to_owned());
                } else {
                    sources
                        .refused
                        .push(format!("{key} {rel}: not in the repository"));
                }
            }
        }
    }
    sources
}

fn from_base_message(
    kfile: &File,
    target: &Target,
    change: &Change,
    sources: &OverlaySources,
    entry_note: &str,
    files_note: &str,
) -> String {
    let (what, suggestion) = match change {
        Change::Replicas(n) => (
            "the replica count",
            format!("`replicas: [{{name: {}, count: {n}}}]`", target.name),
        ),
        Change::Image { from, to } => {
            let (from, to) = (ImageRef::parse(from), ImageRef::parse(to));
            let set = match (&to.tag, &to.digest) {
                (_, Some(digest)) => format!("digest: \"{digest}\""),
                (Some(tag), None) => format!("newTag: \"{tag}\""),
                (None, None) => String::new(),
            };
            let new_name = if from.repo == to.repo {
                String::new()
            } else {
                format!("newName: {}, ", to.repo)
            };
            (
                "the image",
                format!("`images: [{{name: {}, {new_name}{set}}}]`", from.repo),
            )
        }
    };
    let own = if sources.files.is_empty() {
        "it lists no manifest or patch files of its own".to_owned()
    } else {
        format!("its own files do not set it ({files_note})")
    };
    let origin = if sources.bases.is_empty() {
        "the overlay lists no base it could come from".to_owned()
    } else {
        format!(
            "it comes from {}, which other overlays may share, so Kortex does not edit it",
            list(&sources.bases)
        )
    };
    let mut message = format!(
        "{what} of {} is not set by the overlay: {entry_note}, and {own}; {origin}. Add \
         {suggestion} to {} by hand: that entry is the change",
        describe_target(target),
        kfile.path
    );
    if !sources.refused.is_empty() {
        let _ = write!(message, ". Not read: {}", list(&sources.refused));
    }
    message
}

// ---------------------------------------------------------------------------------------
// Helm values (values files, or a HelmRelease's spec.values).

/// One layer of Helm values, lowest priority first.
struct Layer<'a> {
    file: &'a File,
    root: &'a Node,
    /// False for the chart's own values.yaml when the release has values files of its own:
    /// every release of the chart shares it.
    editable: bool,
    /// The HelmRelease whose spec.values this is.
    release: Option<&'a str>,
}

impl Layer<'_> {
    fn field(&self, key: &str) -> String {
        match self.release {
            Some(release) => format!(
                "spec.values.{key} of HelmRelease {release} in {}",
                self.file.path
            ),
            None => format!("values {key} in {}", self.file.path),
        }
    }
}

/// The Helm values in play: the chart's values.yaml, then the release's values files.
fn helm_values(
    files: &[File],
    dir: &str,
    value_files: &[String],
    change: &Change,
    values_path: Option<&str>,
) -> Result<Edit, NotFound> {
    let chart_values = join(dir, "values.yaml");
    let mut wanted: Vec<(&str, bool)> = Vec::new();
    if !value_files.contains(&chart_values) {
        wanted.push((&chart_values, value_files.is_empty()));
    }
    wanted.extend(value_files.iter().map(|path| (path.as_str(), true)));
    let mut notes = Vec::new();
    let mut parsed: Vec<(Parsed, bool)> = Vec::new();
    for (path, editable) in wanted {
        let Some(file) = files.iter().find(|f| f.path == path) else {
            if editable {
                notes.push(format!("{path} is not in the repository"));
            }
            continue;
        };
        match parse_documents(&file.text) {
            Ok(docs) => parsed.push((Parsed { file, docs }, editable)),
            Err(e) => notes.push(format!("{path} does not parse ({e})")),
        }
    }
    let layers: Vec<Layer> = parsed
        .iter()
        .filter_map(|(p, editable)| {
            let root = p.docs.first().filter(|root| root.is_map())?;
            Some(Layer {
                file: p.file,
                root,
                editable: *editable,
                release: None,
            })
        })
        .collect();
    if layers.is_empty() {
        return Err(NotFound(format!(
            "no values file to look in ({})",
            list(&notes)
        )));
    }
    values_edit(&layers, change, values_path).map_err(|miss| {
        let message = miss.message();
        NotFound(if notes.is_empty() {
            message
        } else {
            format!("{message} (also: {})", list(&notes))
        })
    })
}

fn helm_release(
    files: &[File],
    dir: &str,
    release: &str,
    change: &Change,
    values_path: Option<&str>,
) -> Result<Edit, NotFound> {
    let (parsed, broken) = parse_files(yaml_under(files, dir));
    let releases: Vec<Doc> = parsed
        .iter()
        .flat_map(|p| {
            p.docs.iter().enumerate().map(|(index, root)| Doc {
                file: p.file,
                root,
                index,
                count: p.docs.len(),
            })
        })
        .filter(|doc| {
            doc.root.get_str("kind") == Some("HelmRelease")
                && doc.root.get("metadata").and_then(|m| m.get_str("name")) == Some(release)
        })
        .collect();
    let doc = match releases.as_slice() {
        [doc] => doc,
        [] => {
            let message = format!(
                "no HelmRelease {release} in the YAML files under {}",
                shown_dir(dir)
            );
            return Err(NotFound(with_broken(message, &broken)));
        }
        many => {
            let places: Vec<String> = many.iter().map(Doc::describe).collect();
            return Err(NotFound(format!(
                "HelmRelease {release} is defined several times: {}",
                list(&places)
            )));
        }
    };
    let values = match walk(doc.root, &["spec", "values"]) {
        Ok(Some(values)) if values.is_map() => values,
        Ok(_) => {
            let from = if doc
                .root
                .get("spec")
                .and_then(|s| s.get("valuesFrom"))
                .is_some()
            {
                "its valuesFrom sources or the chart's defaults"
            } else {
                "the chart's defaults"
            };
            return Err(NotFound(format!(
                "HelmRelease {release} in {} has no spec.values mapping: its values come from {from}; add spec.values by hand",
                doc.describe()
            )));
        }
        Err(why) => {
            return Err(NotFound(format!(
                "spec.values of HelmRelease {release} in {}: {why}",
                doc.describe()
            )));
        }
    };
    let layer = Layer {
        file: doc.file,
        root: values,
        editable: true,
        release: Some(release),
    };
    values_edit(&[layer], change, values_path).map_err(|miss| NotFound(miss.message()))
}

fn values_edit(layers: &[Layer], change: &Change, values_path: Option<&str>) -> Result<Edit, Miss> {
    match (values_path, change) {
        (Some(path), _) => {
            let segments: Vec<&str> = path.split('.').collect();
            if segments.iter().any(|s| s.trim().is_empty()) {
                return Err(Miss::Blocked(format!(
                    "valuesPath {path:?} is not a dotted key path such as api.replicaCount"
                )));
            }
            explicit_value(layers, &segments, change)
        }
        (None, Change::Replicas(n)) => {
            pick(layers, infer_replicas(layers, *n), "the replica count")
        }
        (None, Change::Image { from, to }) => {
            pick(layers, infer_image(layers, from, to), "the image")
        }
    }
}

/// The last layer that defines `path`, with the node there (Helm merges values in order:
/// later wins).
fn effective<'l, 'a>(
    layers: &'l [Layer<'a>],
    path: &[&str],
) -> Result<Option<(&'l Layer<'a>, &'a Node)>, String> {
    for layer in layers.iter().rev() {
        if let Some(node) = walk(layer.root, path)? {
            return Ok(Some((layer, node)));
        }
    }
    Ok(None)
}

fn effective_str<'a>(layers: &[Layer<'a>], path: &[&str]) -> Result<Option<&'a str>, String> {
    Ok(effective(layers, path)?.and_then(|(_, node)| node.str()))
}

/// A value that could carry the change.
struct Candidate<'l, 'a> {
    key: String,
    layer: &'l Layer<'a>,
    node: &'a Node,
    new: String,
}

/// Candidates found, and notes on what was looked at.
type Found<'l, 'a> = (Vec<Candidate<'l, 'a>>, Vec<String>);

fn layer_edit(layers: &[Layer], candidate: &Candidate) -> Result<Edit, Miss> {
    let field = candidate.layer.field(&candidate.key);
    if candidate.node.str() == Some(candidate.new.as_str()) {
        return Err(Miss::Blocked(already(&field, &candidate.new)));
    }
    if !candidate.layer.editable {
        let last = layers
            .iter()
            .rev()
            .find(|l| l.editable)
            .map_or("the release's values file", |l| l.file.path.as_str());
        return Err(Miss::Blocked(format!(
            "{field} is set only in the chart's default values, which every release of the chart \
             shares; set {} in {last} by hand, or propose again with params.valuesPath",
            candidate.key
        )));
    }
    edit(candidate.layer.file, candidate.node, &candidate.new, field)
}

/// The one candidate, or a message listing them.
fn pick(layers: &[Layer], found: Result<Found, String>, what: &str) -> Result<Edit, Miss> {
    let (candidates, notes) = found.map_err(Miss::Blocked)?;
    let files: Vec<String> = layers.iter().map(|l| l.file.path.clone()).collect();
    match candidates.as_slice() {
        [one] => layer_edit(layers, one),
        [] => {
            let mut message = format!("no value in {} holds {what}", list(&files));
            if !notes.is_empty() {
                let _ = write!(message, " (looked at: {})", list(&notes));
            }
            message.push_str("; propose again with params.valuesPath naming the key");
            Err(Miss::Absent(message))
        }
        many => {
            let keys: Vec<String> = many
                .iter()
                .map(|c| format!("{} ({})", c.key, c.layer.file.path))
                .collect();
            Err(Miss::Blocked(format!(
                "several values could hold {what}: {}; propose again with params.valuesPath naming one",
                list(&keys)
            )))
        }
    }
}

/// Keys whose value is a mapping in some layer (`api:` in `api.replicaCount`), first seen first.
fn nested_keys<'a>(layers: &[Layer<'a>]) -> Vec<&'a str> {
    let mut keys: Vec<&str> = Vec::new();
    for layer in layers {
        for (key, value) in layer.root.entries() {
            if let Some(key) = key.str().filter(|k| value.is_map() && !keys.contains(k)) {
                keys.push(key);
            }
        }
    }
    keys
}

fn infer_replicas<'l, 'a>(layers: &'l [Layer<'a>], n: i64) -> Result<Found<'l, 'a>, String> {
    let mut paths: Vec<Vec<&str>> = vec![vec!["replicaCount"], vec!["replicas"]];
    for key in nested_keys(layers) {
        paths.push(vec![key, "replicaCount"]);
        paths.push(vec![key, "replicas"]);
    }
    let mut candidates = Vec::new();
    for path in &paths {
        let Some((layer, node)) = effective(layers, path)? else {
            continue;
        };
        if node.str().is_some_and(|v| v.trim().parse::<i64>().is_ok()) {
            candidates.push(Candidate {
                key: path.join("."),
                layer,
                node,
                new: n.to_string(),
            });
        }
    }
    let looked = vec!["replicaCount, replicas and <key>.replicaCount, <key>.replicas".to_owned()];
    Ok((candidates, looked))
}

fn infer_image<'l, 'a>(
    layers: &'l [Layer<'a>],
    from: &str,
    to: &str,
) -> Result<Found<'l, 'a>, String> {
    let mut prefixes: Vec<Vec<&str>> = vec![vec!["image"]];
    prefixes.extend(
        nested_keys(layers)
            .into_iter()
            .map(|key| vec![key, "image"]),
    );
    let mut candidates = Vec::new();
    let mut notes = Vec::new();
    for prefix in &prefixes {
        let Some((layer, node)) = effective(layers, prefix)? else {
            continue;
        };
        let key = prefix.join(".");
        if let Some(value) = node.str() {
            if value == from || value == to {
                candidates.push(Candidate {
                    key,
                    layer,
                    node,
                    new: to.to_owned(),
                });
            } else {
                notes.push(format!("{key} = {value}"));
            }
            continue;
        }
        match image_map_candidate(layers, prefix, &ImageRef::parse(from), &ImageRef::parse(to))? {
            Ok(candidate) => candidates.push(candidate),
            Err(note) => notes.push(note),
        }
    }
    Ok((candidates, notes))
}

/// An image given as a mapping at `prefix` (`repository`, `tag`, optional `registry` and
/// `digest`; each key from the last layer defining it): the candidate scalar, or a note on
/// why it is not one.
fn image_map_candidate<'l, 'a>(
    layers: &'l [Layer<'a>],
    prefix: &[&str],
    from: &ImageRef,
    to: &ImageRef,
) -> Result<Result<Candidate<'l, 'a>, String>, String> {
    let key_of = |k: &'static str| -> Vec<&str> { prefix.iter().copied().chain([k]).collect() };
    let name = prefix.join(".");
    let non_empty = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(str::to_owned);
    let Some(repository) = effective_str(layers, &key_of("repository"))? else {
        return Ok(Err(format!("{name} has no repository")));
    };
    let registry = non_empty(effective_str(layers, &key_of("registry"))?);
    let current = ImageRef {
        repo: registry
            .as_ref()
            .map_or_else(|| repository.to_owned(), |r| format!("{r}/{repository}")),
        tag: non_empty(effective_str(layers, &key_of("tag"))?),
        digest: non_empty(effective_str(layers, &key_of("digest"))?),
    };
    let part = match changed_part(from, to) {
        Ok(part) => part,
        Err(why) => return Ok(Err(format!("{name} is {current}: {why}"))),
    };
    let holds = |image: &ImageRef| match part {
        Part::Repo => {
            current.repo == image.repo && current.tag == from.tag && current.digest == from.digest
        }
        Part::Tag => {
            current.repo == from.repo && current.tag == image.tag && current.digest == from.digest
        }
        Part::Digest => {
            current.repo == from.repo && current.tag == from.tag && current.digest == image.digest
        }
    };
    if !holds(from) && !holds(to) {
        return Ok(Err(format!("{name} is {current}")));
    }
    let (key, new) = match (part, &registry) {
        (Part::Repo, None) => ("repository", to.repo.clone()),
        (Part::Repo, Some(r)) => match to.repo.strip_prefix(&format!("{r}/")) {
            Some(rest) => ("repository", rest.to_owned()),
            None => return Ok(Err(format!("{name}: {to} is on another registry than {r}"))),
        },
        (Part::Tag, _) => ("tag", to.tag.clone().unwrap_or_default()),
        (Part::Digest, _) => ("digest", to.digest.clone().unwrap_or_default()),
    };
    let path = key_of(key);
    let Some((layer, node)) = effective(layers, &path)? else {
        return Ok(Err(format!("{name} has no {key}")));
    };
    Ok(Ok(Candidate {
        key: path.join("."),
        layer,
        node,
        new,
    }))
}

/// The scalar at `path` (explicit params.valuesPath).
fn explicit_value(layers: &[Layer], path: &[&str], change: &Change) -> Result<Edit, Miss> {
    let key = path.join(".");
    let files: Vec<String> = layers.iter().map(|l| l.file.path.clone()).collect();
    let (layer, node) = effective(layers, path)
        .map_err(|why| Miss::Blocked(format!("{key}: {why}")))?
        .ok_or_else(|| {
            Miss::Absent(format!(
                "no values file defines {key} (looked in {})",
                list(&files)
            ))
        })?;
    let new = match change {
        Change::Replicas(n) => n.to_string(),
        Change::Image { from, to } if node.is_map() => {
            let (from, to) = (ImageRef::parse(from), ImageRef::parse(to));
            return match image_map_candidate(layers, path, &from, &to).map_err(Miss::Blocked)? {
                Ok(candidate) => layer_edit(layers, &candidate),
                Err(note) => Err(Miss::Blocked(format!(
                    "{}: {note}, which is not {from}",
                    layer.field(&key)
                ))),
            };
        }
        Change::Image { from, to } => image_scalar_target(node.str().unwrap_or_default(), from, to)
            .map_err(|why| Miss::Blocked(format!("{}: {why}", layer.field(&key))))?,
    };
    layer_edit(
        layers,
        &Candidate {
            key,
            layer,
            node,
            new,
        },
    )
}

/// What an image scalar at an explicit path becomes: the whole reference, or the one part of
/// it the scalar holds (a tag, a repository, a digest).
fn image_scalar_target(old: &str, from: &str, to: &str) -> Result<String, String> {
    if old == from || old == to {
        return Ok(to.to_owned());
    }
    let (from, to) = (ImageRef::parse(from), ImageRef::parse(to));
    let part = changed_part(&from, &to)?;
    match (part.of(&from), part.of(&to)) {
        (Some(was), Some(new)) if old == was || old == new => Ok(new.to_owned()),
        _ => Err(format!(
            "it is {old:?}, which is neither {from} nor its {}",
            part.name()
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Unified diff, as `git diff` prints it.

const CONTEXT: usize = 3;

/// A run of changed lines: `old_len` lines from `old_at` replaced by `new_len` from `new_at`.
#[derive(Debug, Clone, Copy)]
struct Atom {
    old_at: usize,
    old_len: usize,
    new_at: usize,
    new_len: usize,
}

/// git-style unified diff of one file (`diff --git a/p b/p`, `--- a/p`, `+++ b/p`, hunks with
/// 3 lines of context and git's function-name hunk headers, `\ No newline at end of file`
/// when needed; paths quoted as git's core.quotePath does). Byte-identical to `git diff`
/// without its `index` line (that needs blob ids and the file mode) for a change of one block
/// of lines, such as an [`Edit`]; for several blocks the hunks are the same unless git's
/// slider heuristics move an ambiguous insertion or deletion. Empty when nothing changed.
pub fn unified_diff(path: &str, before: &str, after: &str) -> String {
    if before == after {
        return String::new();
    }
    let old: Vec<&str> = before.split_inclusive('\n').collect();
    let new: Vec<&str> = after.split_inclusive('\n').collect();
    let atoms = diff_atoms(&old, &new);
    let (a, b) = (quote_path("a/", path), quote_path("b/", path));
    let tab = if path.contains(' ') { "\t" } else { "" };
    let mut out = format!("diff --git {a} {b}\n--- {a}{tab}\n+++ {b}{tab}\n");
    let mut start = 0;
    while start < atoms.len() {
        let mut end = start + 1;
        while let (Some(prev), Some(next)) = (atoms.get(end - 1), atoms.get(end)) {
            if next.old_at - (prev.old_at + prev.old_len) > 2 * CONTEXT {
                break;
            }
            end += 1;
        }
        emit_hunk(
            &mut out,
            &old,
            &new,
            atoms.get(start..end).unwrap_or_default(),
        );
        start = end;
    }
    out
}

/// The changed runs: common head and tail trimmed (as xdiff does), the middle by LCS.
fn diff_atoms(old: &[&str], new: &[&str]) -> Vec<Atom> {
    let head = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let (old_rest, new_rest) = (
        old.get(head..).unwrap_or_default(),
        new.get(head..).unwrap_or_default(),
    );
    let tail = old_rest
        .iter()
        .rev()
        .zip(new_rest.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let a = old_rest.get(..old_rest.len() - tail).unwrap_or_default();
    let b = new_rest.get(..new_rest.len() - tail).unwrap_or_default();
    lcs_atoms(a, b)
        .into_iter()
        .map(|atom| Atom {
            old_at: atom.old_at + head,
            new_at: atom.new_at + head,
            ..atom
        })
        .collect()
}

/// Changed runs between `a` and `b` by a longest common subsequence (deletions first); one
/// replacement of everything when the table would be too large.
fn lcs_atoms(a: &[&str], b: &[&str]) -> Vec<Atom> {
    const MAX_CELLS: usize = 4_000_000;
    let (n, m) = (a.len(), b.len());
    if n == 0 && m == 0 {
        return Vec::new();
    }
    if (n + 1).saturating_mul(m + 1) > MAX_CELLS {
        return vec![Atom {
            old_at: 0,
            old_len: n,
            new_at: 0,
            new_len: m,
        }];
    }
    let width = m + 1;
    let mut table = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[i * width + j] = if a[i] == b[j] {
                table[(i + 1) * width + j + 1] + 1
            } else {
                table[(i + 1) * width + j].max(table[i * width + j + 1])
            };
        }
    }
    let mut atoms: Vec<Atom> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
            continue;
        }
        let delete = j == m || (i < n && table[(i + 1) * width + j] >= table[i * width + j + 1]);
        let extends = atoms
            .last()
            .is_some_and(|l| l.old_at + l.old_len == i && l.new_at + l.new_len == j);
        if !extends {
            atoms.push(Atom {
                old_at: i,
                old_len: 0,
                new_at: j,
                new_len: 0,
            });
        }
        let Some(atom) = atoms.last_mut() else { break };
        if delete {
            atom.old_len += 1;
            i += 1;
        } else {
            atom.new_len += 1;
            j += 1;
        }
    }
    atoms
}

fn emit_hunk(out: &mut String, old: &[&str], new: &[&str], atoms: &[Atom]) {
    let (Some(first), Some(last)) = (atoms.first(), atoms.last()) else {
        return;
    };
    let old_start = first.old_at.saturating_sub(CONTEXT);
    let new_start = first.new_at.saturating_sub(CONTEXT);
    let after_ctx = CONTEXT
        .min(old.len() - (last.old_at + last.old_len))
        .min(new.len() - (last.new_at + last.new_len));
    let old_end = last.old_at + last.old_len + after_ctx;
    let new_end = last.new_at + last.new_len + after_ctx;
    let _ = writeln!(
        out,
        "@@ -{} +{} @@{}",
        hunk_range(old_start, old_end - old_start),
        hunk_range(new_start, new_end - new_start),
        function_line(old, old_start)
    );
    let mut at = old_start;
    for atom in atoms {
        for line in old.get(at..atom.old_at).unwrap_or_default() {
            emit_line(out, ' ', line);
        }
        for line in old
            .get(atom.old_at..atom.old_at + atom.old_len)
            .unwrap_or_default()
        {
            emit_line(out, '-', line);
        }
        for line in new
            .get(atom.new_at..atom.new_at + atom.new_len)
            .unwrap_or_default()
        {
            emit_line(out, '+', line);
        }
        at = atom.old_at + atom.old_len;
    }
    for line in old.get(at..old_end).unwrap_or_default() {
        emit_line(out, ' ', line);
    }
}

/// `start,count` as xdiff writes it: 1-based, `,count` left out when 1, and the line before
/// when the range is empty.
fn hunk_range(start: usize, count: usize) -> String {
    match count {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{count}", start + 1),
    }
}

/// git's default function line for a hunk starting at `start`: the nearest line above that
/// begins with a letter, `_` or `$`, cut to 80 bytes, trailing white space dropped.
fn function_line(old: &[&str], start: usize) -> String {
    let found = old
        .get(..start)
        .unwrap_or_default()
        .iter()
        .rev()
        .find(|line| {
            line.as_bytes()
                .first()
                .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_' || c == b'$')
        });
    let Some(line) = found else {
        return String::new();
    };
    let bytes = line.as_bytes();
    let mut cut = bytes.get(..80).unwrap_or(bytes);
    while let [rest @ .., b' ' | b'\t' | b'\n' | b'\r'] = cut {
        cut = rest;
    }
    if cut.is_empty() {
        String::new()
    } else {
        format!(" {}", String::from_utf8_lossy(cut))
    }
}

fn emit_line(out: &mut String, prefix: char, line: &str) {
    out.push(prefix);
    out.push_str(line);
    if !line.ends_with('\n') {
        out.push_str("\n\\ No newline at end of file\n");
    }
}

/// `prefix` + `path`, C-quoted when git's core.quotePath would quote it.
fn quote_path(prefix: &str, path: &str) -> String {
    let full = format!("{prefix}{path}");
    if full
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        return full;
    }
    let mut out = String::from("\"");
    for byte in full.bytes() {
        match byte {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b if !(0x20..0x7f).contains(&b) => {
                let _ = write!(out, "\\{b:03o}");
            }
            b => out.push(char::from(b)),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> File {
        File {
            path: path.into(),
            text: text.into(),
        }
    }

    fn deployment(name: &str) -> Target {
        Target {
            kind: "Deployment".into(),
            name: name.into(),
            namespace: Some("shop".into()),
            container: None,
        }
    }

    fn image(from: &str, to: &str) -> Change {
        Change::Image {
            from: from.into(),
            to: to.into(),
        }
    }

    fn plain_layout(dir: &str) -> Layout {
        Layout::Plain { dir: dir.into() }
    }

    fn kustomize_layout(dir: &str) -> Layout {
        Layout::Kustomize { dir: dir.into() }
    }

    fn helm(dir: &str, value_files: &[&str]) -> Layout {
        Layout::HelmValues {
            dir: dir.into(),
            value_files: value_files.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The `-` and `+` lines of the edit's diff, after checking it is exactly one pair and
    /// that every other byte of the file is unchanged.
    fn one_line_change(edit: &Edit) -> (String, String) {
        let diff = unified_diff(&edit.path, &edit.before, &edit.after);
        let body: Vec<&str> = diff
            .split('\n')
            .skip(3)
            .filter(|l| !l.starts_with("@@"))
            .collect();
        let minus: Vec<&str> = body
            .iter()
            .filter(|l| l.starts_with('-'))
            .copied()
            .collect();
        let plus: Vec<&str> = body
            .iter()
            .filter(|l| l.starts_with('+'))
            .copied()
            .collect();
        assert_eq!((minus.len(), plus.len()), (1, 1), "diff:\n{diff}");
        let (before, after): (Vec<&str>, Vec<&str>) = (
            edit.before.split('\n').collect(),
            edit.after.split('\n').collect(),
        );
        assert_eq!(before.len(), after.len());
        let differing: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != after[i])
            .collect();
        assert_eq!(
            differing,
            vec![edit.line - 1],
            "only the scalar's line changes"
        );
        (minus[0][1..].to_owned(), plus[0][1..].to_owned())
    }

    const MULTI_DOC: &str = "\
# The api: service first, then the workload.
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: shop
spec:
  ports:
    - port: 80   # http

---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
  namespace: shop
spec:
  replicas: 2  # min for PDB
  template:
    spec:
      containers:
        - name: api
          image: reg.io/team/api:v2
        - name: proxy
          image: 'reg.io/team/proxy:1.4'
      initContainers:
        - name: migrate
          image: reg.io/team/migrate:v7
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: api
data:
  replicas: \"2\"
";

    #[test]
    fn plain_edits_document_two_and_keeps_everything_else() {
        let files = [file("apps/api.yaml", MULTI_DOC)];
        let edit = locate(
            &plain_layout("apps"),
            &files,
            &deployment("api"),
            &Change::Replicas(5),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "apps/api.yaml");
        assert_eq!(edit.line, 18);
        assert_eq!((edit.old.as_str(), edit.new.as_str()), ("2", "5"));
        assert_eq!(
            edit.field,
            "spec.replicas of Deployment api in apps/api.yaml (document 2)"
        );
        assert_eq!(
            edit.after,
            MULTI_DOC.replace("replicas: 2  # min", "replicas: 5  # min")
        );
        let (minus, plus) = one_line_change(&edit);
        assert_eq!(minus, "  replicas: 2  # min for PDB");
        assert_eq!(plus, "  replicas: 5  # min for PDB");
    }

    #[test]
    fn plain_image_of_one_of_two_containers() {
        let files = [file("apps/api.yaml", MULTI_DOC)];
        let change = image("reg.io/team/api:v2", "reg.io/team/api:v1");
        let edit = locate(&plain_layout(""), &files, &deployment("api"), &change, None).unwrap();
        assert_eq!(edit.line, 23);
        assert_eq!(
            edit.field,
            "spec.template.spec.containers[name=api].image of Deployment api in apps/api.yaml (document 2)"
        );
        assert_eq!(
            one_line_change(&edit).1,
            "          image: reg.io/team/api:v1"
        );

        let quoted = image("reg.io/team/proxy:1.4", "reg.io/team/proxy:1.3");
        let edit = locate(&plain_layout(""), &files, &deployment("api"), &quoted, None).unwrap();
        assert_eq!(
            one_line_change(&edit).1,
            "          image: 'reg.io/team/proxy:1.3'"
        );

        let init = image("reg.io/team/migrate:v7", "reg.io/team/migrate:v6");
        let edit = locate(&plain_layout(""), &files, &deployment("api"), &init, None).unwrap();
        assert!(
            edit.field
                .starts_with("spec.template.spec.initContainers[name=migrate].image")
        );

        let mut other = deployment("api");
        other.container = Some("proxy".into());
        let err = locate(&plain_layout(""), &files, &other, &change, None).unwrap_err();
        assert!(
            err.0.contains("container proxy") && err.0.contains("proxy runs reg.io/team/proxy:1.4"),
            "{err}"
        );
    }

    #[test]
    fn plain_same_image_in_two_containers_needs_the_container() {
        let text = "kind: Deployment\nmetadata:\n  name: api\nspec:\n  template:\n    spec:\n      containers:\n\
                    \x20       - name: a\n          image: reg/x:v2\n        - name: b\n          image: reg/x:v2\n";
        let files = [file("d.yaml", text)];
        let change = image("reg/x:v2", "reg/x:v1");
        let err = locate(&plain_layout(""), &files, &deployment("api"), &change, None).unwrap_err();
        assert!(
            err.0.contains("params.container") && err.0.contains("a, b"),
            "{err}"
        );
        let mut target = deployment("api");
        target.container = Some("b".into());
        let edit = locate(&plain_layout(""), &files, &target, &change, None).unwrap();
        assert_eq!(edit.line, 11);
    }

    #[test]
    fn plain_never_inserts_a_missing_replicas() {
        let files = [file(
            "d.yaml",
            "kind: Deployment\nmetadata:\n  name: api\nspec:\n  template: {}\n",
        )];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(3),
            None,
        )
        .unwrap_err();
        assert!(
            err.0.contains("no spec.replicas") && err.0.contains("defaults it to 1"),
            "{err}"
        );
    }

    #[test]
    fn plain_looks_only_under_dir_at_yaml_and_names_duplicates() {
        let doc = "kind: Deployment\nmetadata:\n  name: api\nspec:\n  replicas: 1\n";
        let files = [
            file("apps/api.yml", doc),
            file("apps-old/api.yaml", doc),
            file("apps/README.md", doc),
            file("other/api.yaml", doc),
        ];
        let edit = locate(
            &plain_layout("apps/"),
            &files,
            &deployment("api"),
            &Change::Replicas(2),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "apps/api.yml");
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(2),
            None,
        )
        .unwrap_err();
        assert!(
            err.0.contains("3 times") && err.0.contains("other/api.yaml"),
            "{err}"
        );
    }

    #[test]
    fn plain_matches_kind_name_and_namespace() {
        let files = [
            file(
                "a.yaml",
                "kind: Deployment\nmetadata:\n  name: api\n  namespace: staging\nspec:\n  replicas: 1\n",
            ),
            file(
                "b.yaml",
                "kind: StatefulSet\nmetadata:\n  name: api\nspec:\n  replicas: 1\n",
            ),
            file(
                "c.yaml",
                "kind: Deployment\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  replicas: 1\n",
            ),
        ];
        let edit = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(2),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "c.yaml");
    }

    #[test]
    fn plain_mentions_files_that_do_not_parse() {
        let files = [
            file("apps/bad.yaml", "kind: [unclosed\n"),
            file("apps/ok.yaml", "kind: Service\n"),
        ];
        let err = locate(
            &plain_layout("apps"),
            &files,
            &deployment("api"),
            &Change::Replicas(2),
            None,
        )
        .unwrap_err();
        assert!(
            err.0.contains("do not parse") && err.0.contains("apps/bad.yaml"),
            "{err}"
        );
        assert!(
            err.0.contains("no manifest of Deployment shop/api"),
            "{err}"
        );
    }

    #[test]
    fn already_equal_is_not_an_edit() {
        let files = [file("apps/api.yaml", MULTI_DOC)];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(2),
            None,
        )
        .unwrap_err();
        assert!(
            err.0.contains("already 2 in Git") && err.0.contains("has not synced"),
            "{err}"
        );
        let change = image("reg.io/team/api:v1", "reg.io/team/api:v2");
        let err = locate(&plain_layout(""), &files, &deployment("api"), &change, None).unwrap_err();
        assert!(err.0.contains("already reg.io/team/api:v2 in Git"), "{err}");
        let same = image("reg/a:v1", "reg/a:v1");
        assert!(locate(&plain_layout(""), &files, &deployment("api"), &same, None).is_err());
        assert!(
            locate(
                &plain_layout(""),
                &files,
                &deployment("api"),
                &Change::Replicas(-1),
                None
            )
            .is_err()
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys_are_refused() {
        let anchored = "kind: Deployment\nmetadata:\n  name: api\nspec:\n  replicas: &n 2\n  template:\n    metadata:\n      labels: {count: *n}\n";
        let files = [file("a.yaml", anchored)];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(3),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("anchor"), "{err}");

        let alias =
            "defaults: &d\n  replicas: 2\nkind: Deployment\nmetadata:\n  name: api\nspec: *d\n";
        let files = [file("a.yaml", alias)];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(3),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("alias"), "{err}");

        let merge = "x: &d\n  replicas: 2\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  <<: *d\n  selector: {}\n";
        let files = [file("a.yaml", merge)];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(3),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("merge key"), "{err}");

        let shared_list = "c: &c\n  - name: api\n    image: r/a:v2\nkind: Deployment\nmetadata:\n  name: api\n\
                           spec:\n  template:\n    spec:\n      containers: *c\n";
        let files = [file("a.yaml", shared_list)];
        let err = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &image("r/a:v2", "r/a:v1"),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("alias"), "{err}");
    }

    #[test]
    fn crlf_and_non_ascii_text_keep_their_bytes() {
        let text = "# café — ünïcode before the value\r\nkind: Deployment\r\nmetadata:\r\n  name: api # é\r\n\
                    spec:\r\n  replicas: 3\r\n  note: \"日本\"\r\n";
        let files = [file("a.yaml", text)];
        let edit = locate(
            &plain_layout(""),
            &files,
            &deployment("api"),
            &Change::Replicas(4),
            None,
        )
        .unwrap();
        assert_eq!(edit.after, text.replace("replicas: 3", "replicas: 4"));
        assert_eq!(edit.line, 6);
        let (minus, plus) = one_line_change(&edit);
        assert_eq!(
            (minus.as_str(), plus.as_str()),
            ("  replicas: 3\r", "  replicas: 4\r")
        );
    }

    #[test]
    fn quoted_styles_are_kept() {
        let text = "a: 'it''s'\nb: \"x\\\"y\"\nc: plain\nd: \"3\"\ne: '3'\nf: 3\ng: {h: 1, i: [2, \"3\"]}\n";
        let set = |path: &[&str], new: &str| set_scalar(text, 0, path, new).unwrap();
        assert!(set(&["a"], "don't").0.contains("a: 'don''t'\n"));
        assert!(set(&["b"], "q\"\\").0.contains("b: \"q\\\"\\\\\"\n"));
        assert!(set(&["c"], "other").0.contains("c: other\n"));
        assert!(set(&["d"], "5").0.contains("d: \"5\"\n"));
        assert!(set(&["e"], "5").0.contains("e: '5'\n"));
        assert!(set(&["f"], "5").0.contains("f: 5\n"));
        assert!(set(&["g", "h"], "7").0.contains("g: {h: 7, i: [2, \"3\"]}"));
        let (after, line, old) = set(&["g", "i", "1"], "4");
        assert!(after.contains("i: [2, \"4\"]"));
        assert_eq!((line, old.as_str()), (7, "3"));
    }

    #[test]
    fn plain_scalars_are_quoted_when_plain_would_mean_something_else() {
        let text = "s: v1\nn: 1.9\ni: 3\n";
        let set = |path: &str, new: &str| set_scalar(text, 0, &[path], new).unwrap().0;
        assert!(set("s", "1.10").contains("s: \"1.10\"\n"));
        assert!(set("s", "42").contains("s: \"42\"\n"));
        assert!(set("s", "true").contains("s: \"true\"\n"));
        assert!(set("s", "on").contains("s: \"on\"\n"));
        assert!(set("s", "a: b").contains("s: \"a: b\"\n"));
        assert!(set("s", "a #b").contains("s: \"a #b\"\n"));
        assert!(set("s", "*x").contains("s: \"*x\"\n"));
        assert!(set("s", " x").contains("s: \" x\"\n"));
        assert!(set("s", "").contains("s: \"\"\n"));
        assert!(set("s", "2024-01-02").contains("s: \"2024-01-02\"\n"));
        assert!(set("s", "v1.10").contains("s: v1.10\n"));
        assert!(set("n", "2.1").contains("n: 2.1\n"));
        assert!(set("n", "1.10").contains("n: \"1.10\"\n"));
        assert!(set("i", "12").contains("i: 12\n"));
        assert!(set("i", "012").contains("i: \"012\"\n"));
    }

    #[test]
    fn block_multi_line_and_empty_scalars_are_refused() {
        let text = "a: |\n  x\nb: >\n  y\nc: one\n  two\nd:\n";
        for key in ["a", "b", "c", "d"] {
            let err = set_scalar(text, 0, &[key], "z").unwrap_err();
            assert!(err.0.contains("by hand"), "{key}: {err}");
        }
        assert!(set_scalar(text, 1, &["a"], "z").is_err());
        assert!(
            set_scalar("a: 1\n", 0, &["a"], "1")
                .unwrap_err()
                .0
                .contains("already")
        );
    }

    #[test]
    fn image_references_split_with_registry_ports_and_digests() {
        let parse = ImageRef::parse;
        assert_eq!(
            parse("host:5000/a/b:v1"),
            ImageRef {
                repo: "host:5000/a/b".into(),
                tag: Some("v1".into()),
                digest: None
            }
        );
        assert_eq!(
            parse("host:5000/a/b"),
            ImageRef {
                repo: "host:5000/a/b".into(),
                tag: None,
                digest: None
            }
        );
        assert_eq!(
            parse("a/b:v1@sha256:abc"),
            ImageRef {
                repo: "a/b".into(),
                tag: Some("v1".into()),
                digest: Some("sha256:abc".into())
            }
        );
        assert_eq!(parse("nginx@sha256:abc").repo, "nginx");
        for s in ["host:5000/a/b:v1", "a/b:v1@sha256:abc", "nginx"] {
            assert_eq!(parse(s).to_string(), s);
        }
        assert_eq!(changed_part(&parse("a:v1"), &parse("a:v2")), Ok(Part::Tag));
        assert_eq!(changed_part(&parse("a:v1"), &parse("b:v1")), Ok(Part::Repo));
        assert_eq!(
            changed_part(&parse("a@sha256:1"), &parse("a@sha256:2")),
            Ok(Part::Digest)
        );
        assert!(changed_part(&parse("a:v1"), &parse("b:v2")).is_err());
        assert!(changed_part(&parse("a:v1"), &parse("a@sha256:2")).is_err());
    }

    #[test]
    fn kustomization_paths_stay_inside_the_overlay() {
        assert_eq!(
            resolve_in("ov/prod", "./patch.yaml"),
            Ok("ov/prod/patch.yaml".into())
        );
        assert_eq!(
            resolve_in("ov/prod", "sub/../patch.yaml"),
            Ok("ov/prod/patch.yaml".into())
        );
        assert_eq!(resolve_in("", "a/b.yaml"), Ok("a/b.yaml".into()));
        for bad in [
            "../base",
            "a/../../b.yaml",
            "/etc/passwd",
            "C:\\x",
            "https://github.com/o/r//base?ref=v1",
            "github.com/o/r/base",
            ".",
        ] {
            assert!(resolve_in("ov/prod", bad).is_err(), "{bad}");
        }
    }

    const BASE_DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  replicas: 1\n\
                                   \x20 template:\n    spec:\n      containers:\n        - name: api\n          image: reg.io/team/api:v1\n";

    #[test]
    fn kustomize_replicas_entry() {
        let kustomization = "resources:\n  - ../../base\nreplicas:\n  - name: worker\n    count: 1\n  - name: api\n    count: 3 # peak\n";
        let files = [
            file("overlays/prod/kustomization.yaml", kustomization),
            file("base/kustomization.yaml", "resources: [deployment.yaml]\n"),
            file("base/deployment.yaml", BASE_DEPLOYMENT),
        ];
        let edit = locate(
            &kustomize_layout("overlays/prod"),
            &files,
            &deployment("api"),
            &Change::Replicas(6),
            None,
        )
        .unwrap();
        assert_eq!(
            edit.field,
            "replicas[name=api].count in overlays/prod/kustomization.yaml"
        );
        assert_eq!(one_line_change(&edit).1, "    count: 6 # peak");
    }

    #[test]
    fn kustomize_images_new_tag_new_name_and_digest() {
        let kustomization = "resources: [../../base]\nimages:\n  - name: reg.io/team/api\n    newTag: \"v2\"\n\
                             \x20 - name: proxy\n    newName: host:5000/mirror/proxy\n    newTag: \"1.4\"\n\
                             \x20 - name: db\n    digest: sha256:aaa\n";
        let files = [file("ov/kustomization.yml", kustomization)];
        let layout = kustomize_layout("ov");
        let target = deployment("api");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v2", "reg.io/team/api:v1"),
            None,
        )
        .unwrap();
        assert_eq!(
            edit.field,
            "images[name=reg.io/team/api].newTag in ov/kustomization.yml"
        );
        assert_eq!(one_line_change(&edit).1, "    newTag: \"v1\"");

        let mirrored = image("host:5000/mirror/proxy:1.4", "host:5000/mirror/proxy:1.3");
        let edit = locate(&layout, &files, &target, &mirrored, None).unwrap();
        assert_eq!(one_line_change(&edit).1, "    newTag: \"1.3\"");
        let renamed = image("host:5000/mirror/proxy:1.4", "host:5000/other/proxy:1.4");
        let edit = locate(&layout, &files, &target, &renamed, None).unwrap();
        assert_eq!(
            one_line_change(&edit).1,
            "    newName: host:5000/other/proxy"
        );

        let digest = locate(
            &layout,
            &files,
            &target,
            &image("db@sha256:aaa", "db@sha256:bbb"),
            None,
        )
        .unwrap();
        assert_eq!(one_line_change(&digest).1, "    digest: sha256:bbb");

        let both = image("reg.io/team/api:v2", "reg.io/other/api:v1");
        let err = locate(&layout, &files, &target, &both, None).unwrap_err();
        assert!(err.0.contains("more than one"), "{err}");
        let no_new_name = image("reg.io/team/api:v2", "reg.io/other/api:v2");
        let err = locate(&layout, &files, &target, &no_new_name, None).unwrap_err();
        assert!(err.0.contains("no `newName:`"), "{err}");
        let drifted = image("reg.io/team/api:v3", "reg.io/team/api:v1");
        let err = locate(&layout, &files, &target, &drifted, None).unwrap_err();
        assert!(err.0.contains("cluster runs reg.io/team/api:v3"), "{err}");
    }

    #[test]
    fn kustomize_patch_file_in_the_overlay() {
        let kustomization = "resources:\n  - ../../base\npatches:\n  - path: replicas.yaml\n  - patch: |-\n      - op: add\n";
        let patch =
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  replicas: 3\n";
        let files = [
            file("overlays/prod/kustomization.yaml", kustomization),
            file("overlays/prod/replicas.yaml", patch),
            file("overlays/staging/replicas.yaml", patch),
            file("base/deployment.yaml", BASE_DEPLOYMENT),
        ];
        let edit = locate(
            &kustomize_layout("overlays/prod"),
            &files,
            &deployment("api"),
            &Change::Replicas(4),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "overlays/prod/replicas.yaml");
        assert_eq!(
            edit.field,
            "spec.replicas of Deployment api in overlays/prod/replicas.yaml"
        );

        let strategic = "resources: [deploy.yaml]\npatchesStrategicMerge:\n  - image.yaml\n";
        let image_patch = "kind: Deployment\nmetadata:\n  name: api\nspec:\n  template:\n    spec:\n      containers:\n\
                           \x20       - name: api\n          image: reg/api:v2\n";
        let files = [
            file("ov/kustomization.yaml", strategic),
            file("ov/image.yaml", image_patch),
            file("ov/deploy.yaml", "kind: Service\nmetadata:\n  name: api\n"),
        ];
        let edit = locate(
            &kustomize_layout("ov"),
            &files,
            &deployment("api"),
            &image("reg/api:v2", "reg/api:v1"),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "ov/image.yaml");
    }

    #[test]
    fn kustomize_base_outside_the_overlay_is_named_not_edited() {
        let files = [
            file(
                "overlays/prod/kustomization.yaml",
                "resources:\n  - ../../base\n  - https://github.com/o/r//x?ref=v1\n",
            ),
            file("base/kustomization.yaml", "resources: [deployment.yaml]\n"),
            file("base/deployment.yaml", BASE_DEPLOYMENT),
        ];
        let err = locate(
            &kustomize_layout("overlays/prod"),
            &files,
            &deployment("api"),
            &Change::Replicas(4),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("../../base"), "{err}");
        assert!(err.0.contains("other overlays may share"), "{err}");
        assert!(
            err.0.contains("`replicas: [{name: api, count: 4}]`"),
            "{err}"
        );
        assert!(err.0.contains("remote base"), "{err}");

        let change = image("reg.io/team/api:v1", "reg.io/team/api:v0");
        let err = locate(
            &kustomize_layout("overlays/prod"),
            &files,
            &deployment("api"),
            &change,
            None,
        )
        .unwrap_err();
        assert!(
            err.0
                .contains("`images: [{name: reg.io/team/api, newTag: \"v0\"}]`"),
            "{err}"
        );
    }

    #[test]
    fn kustomize_refuses_dot_dot_paths_even_to_files() {
        let files = [
            file(
                "overlays/prod/kustomization.yaml",
                "resources:\n  - ../shared/deploy.yaml\npatches:\n  - path: ../../secret/patch.yaml\n",
            ),
            file("overlays/shared/deploy.yaml", BASE_DEPLOYMENT),
            file("secret/patch.yaml", BASE_DEPLOYMENT),
        ];
        let err = locate(
            &kustomize_layout("overlays/prod"),
            &files,
            &deployment("api"),
            &Change::Replicas(4),
            None,
        )
        .unwrap_err();
        assert!(
            err.0
                .contains("../shared/deploy.yaml (outside the overlay, not read)"),
            "{err}"
        );
        assert!(
            err.0
                .contains("patches ../../secret/patch.yaml: outside the overlay"),
            "{err}"
        );
        let err = locate(
            &kustomize_layout("nowhere"),
            &files,
            &deployment("api"),
            &Change::Replicas(4),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("no kustomization.yaml"), "{err}");
    }

    #[test]
    fn helm_infers_the_replica_count() {
        let files = [
            file(
                "charts/api/values.yaml",
                "replicaCount: 1\nimage:\n  repository: reg/api\n  tag: v1\n",
            ),
            file("charts/api/values-prod.yaml", "# prod\nreplicaCount: 3\n"),
        ];
        let layout = helm(
            "charts/api",
            &["charts/api/values.yaml", "charts/api/values-prod.yaml"],
        );
        let edit = locate(
            &layout,
            &files,
            &deployment("api"),
            &Change::Replicas(5),
            None,
        )
        .unwrap();
        assert_eq!(
            edit.field,
            "values replicaCount in charts/api/values-prod.yaml"
        );
        assert_eq!(one_line_change(&edit).1, "replicaCount: 5");

        let only_defaults = helm("charts/api", &[]);
        let edit = locate(
            &only_defaults,
            &files,
            &deployment("api"),
            &Change::Replicas(5),
            None,
        )
        .unwrap();
        assert_eq!(edit.path, "charts/api/values.yaml");
    }

    #[test]
    fn helm_ambiguous_or_absent_asks_for_values_path() {
        let files = [file(
            "c/values.yaml",
            "api:\n  replicaCount: 2\nworker:\n  replicas: 1\n",
        )];
        let err = locate(
            &helm("c", &[]),
            &files,
            &deployment("api"),
            &Change::Replicas(5),
            None,
        )
        .unwrap_err();
        assert!(
            err.0.contains("api.replicaCount") && err.0.contains("worker.replicas"),
            "{err}"
        );
        assert!(err.0.contains("params.valuesPath"), "{err}");
        let files = [file("c/values.yaml", "service:\n  port: 80\n")];
        let err = locate(
            &helm("c", &[]),
            &files,
            &deployment("api"),
            &Change::Replicas(5),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("params.valuesPath"), "{err}");
    }

    #[test]
    fn helm_values_path_takes_the_last_file_defining_it() {
        let files = [
            file("c/values.yaml", "api:\n  replicaCount: 1\n"),
            file("env/common.yaml", "api:\n  replicaCount: 2\n  other: x\n"),
            file("env/prod.yaml", "api:\n  replicaCount: 4\n"),
            file("env/late.yaml", "worker:\n  replicaCount: 9\n"),
        ];
        let layout = helm("c", &["env/common.yaml", "env/prod.yaml", "env/late.yaml"]);
        let target = deployment("api");
        let edit = locate(
            &layout,
            &files,
            &target,
            &Change::Replicas(5),
            Some("api.replicaCount"),
        )
        .unwrap();
        assert_eq!(
            (edit.path.as_str(), edit.old.as_str()),
            ("env/prod.yaml", "4")
        );
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("x", "y"),
            Some("api.other"),
        )
        .unwrap();
        assert_eq!(edit.path, "env/common.yaml");

        let defaults_only = helm("c", &["env/late.yaml"]);
        let err = locate(
            &defaults_only,
            &files,
            &target,
            &Change::Replicas(5),
            Some("api.replicaCount"),
        )
        .unwrap_err();
        assert!(
            err.0.contains("chart's default values") && err.0.contains("env/late.yaml"),
            "{err}"
        );
        let err = locate(
            &layout,
            &files,
            &target,
            &Change::Replicas(5),
            Some("api.nope"),
        )
        .unwrap_err();
        assert!(err.0.contains("no values file defines api.nope"), "{err}");
        assert!(
            locate(
                &layout,
                &files,
                &target,
                &Change::Replicas(5),
                Some("api..x")
            )
            .is_err()
        );
    }

    #[test]
    fn helm_images_as_mapping_or_string() {
        let files = [file(
            "c/values.yaml",
            "image:\n  registry: reg.io\n  repository: team/api\n  tag: \"v2\" # pinned\nsidecar:\n  image: reg.io/team/proxy:1.4\n",
        )];
        let layout = helm("c", &[]);
        let target = deployment("api");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v2", "reg.io/team/api:v1"),
            None,
        )
        .unwrap();
        assert_eq!(edit.field, "values image.tag in c/values.yaml");
        assert_eq!(one_line_change(&edit).1, "  tag: \"v1\" # pinned");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/proxy:1.4", "reg.io/team/proxy:1.3"),
            None,
        )
        .unwrap();
        assert_eq!(edit.field, "values sidecar.image in c/values.yaml");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v2", "reg.io/fork/api:v2"),
            None,
        )
        .unwrap();
        assert_eq!(one_line_change(&edit).1, "  repository: fork/api");
        let err = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v9", "reg.io/team/api:v1"),
            None,
        )
        .unwrap_err();
        assert!(err.0.contains("image is reg.io/team/api:v2"), "{err}");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v2", "reg.io/team/api:v1"),
            Some("image.tag"),
        )
        .unwrap();
        assert_eq!(edit.new, "v1");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg.io/team/api:v2", "reg.io/team/api:v1"),
            Some("image"),
        )
        .unwrap();
        assert_eq!(edit.field, "values image.tag in c/values.yaml");
    }

    #[test]
    fn helm_release_spec_values() {
        let release = "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata:\n  name: api\n\
                       spec:\n  chart:\n    spec:\n      chart: api\n  values:\n    replicaCount: 2\n    image:\n      repository: reg/api\n      tag: v2\n";
        let files = [
            file(
                "clusters/prod/api.yaml",
                &format!("kind: Namespace\nmetadata:\n  name: shop\n---\n{release}"),
            ),
            file("clusters/staging/api.yaml", release),
        ];
        let layout = Layout::HelmRelease {
            dir: "clusters/prod".into(),
            release: "api".into(),
        };
        let target = deployment("api");
        let edit = locate(&layout, &files, &target, &Change::Replicas(3), None).unwrap();
        assert_eq!(
            edit.field,
            "spec.values.replicaCount of HelmRelease api in clusters/prod/api.yaml"
        );
        assert_eq!(one_line_change(&edit).1, "    replicaCount: 3");
        let edit = locate(
            &layout,
            &files,
            &target,
            &image("reg/api:v2", "reg/api:v1"),
            Some("image.tag"),
        )
        .unwrap();
        assert_eq!(one_line_change(&edit).1, "      tag: v1");
        let everywhere = Layout::HelmRelease {
            dir: String::new(),
            release: "api".into(),
        };
        assert!(
            locate(&everywhere, &files, &target, &Change::Replicas(3), None)
                .unwrap_err()
                .0
                .contains("several times")
        );
        let missing = Layout::HelmRelease {
            dir: "clusters/prod".into(),
            release: "web".into(),
        };
        assert!(
            locate(&missing, &files, &target, &Change::Replicas(3), None)
                .unwrap_err()
                .0
                .contains("no HelmRelease web")
        );
    }

    // -----------------------------------------------------------------------------------
    // unified_diff

    #[test]
    fn unified_diff_format() {
        let before = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let after = "a\nb\nc\nd\nE\nf\ng\nh\n";
        let expected = "diff --git a/x.yaml b/x.yaml\n--- a/x.yaml\n+++ b/x.yaml\n@@ -2,7 +2,7 @@ a\n b\n c\n d\n-e\n+E\n f\n g\n h\n";
        assert_eq!(unified_diff("x.yaml", before, after), expected);
        assert_eq!(unified_diff("x.yaml", before, before), "");
        let tail = unified_diff("x", "a\nb", "a\nc");
        assert!(tail.ends_with("@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"), "{tail}");
        assert!(unified_diff("x", "", "a\n").contains("@@ -0,0 +1 @@\n+a\n"));
        assert!(
            unified_diff("my dir/x", "a\n", "b\n").contains("--- a/my dir/x\t\n+++ b/my dir/x\t\n")
        );
        assert!(
            unified_diff("café", "a\n", "b\n")
                .starts_with("diff --git \"a/caf\\303\\251\" \"b/caf\\303\\251\"\n")
        );
    }

    /// What `git diff` prints for the change, without its `index` line; None without git.
    fn git_diff(path: &str, before: &str, after: &str) -> Option<String> {
        use std::process::Command;
        Command::new("git")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let output = Command::new("git")
                .args([
                    "-c",
                    "core.autocrlf=false",
                    "-c",
                    "core.quotepath=true",
                    "-c",
                    "diff.noprefix=false",
                ])
                .args(args)
                .current_dir(dir.path())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("HOME", dir.path())
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap()
        };
        git(&["init", "-q"]);
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, before).unwrap();
        git(&["add", "--", path]);
        std::fs::write(&full, after).unwrap();
        let out = git(&["diff", "--no-color", "--no-ext-diff", "--", path]);
        Some(
            out.split_inclusive('\n')
                .filter(|l| !l.starts_with("index "))
                .collect(),
        )
    }

    /// Changes near the start and the end, with and without a final newline, hunks merged and
    /// apart, insertions, deletions, duplicate lines, long function lines, CRLF, quoted paths.
    fn diff_cases() -> Vec<(&'static str, String, String)> {
        let yaml: String = (1..=40)
            .map(|i| match i % 10 {
                1 => format!("section{i}:\n"),
                5 => format!("  # comment {i}\n"),
                _ => format!("  key{i}: value{i}\n"),
            })
            .collect();
        let long_head = format!(
            "{}   \n  a: 1\n  b: 2\n  c: 3\n  d: 4\n  e: 5\n",
            "k".repeat(90)
        );
        vec![
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value2\n", "VALUE2\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value40\n", "value40b\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value17\n", "v17\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value13\n", "a\n", 1)
                    .replacen("value33\n", "b\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value13\n", "a\n", 1)
                    .replacen("value20\n", "b\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value13\n", "a\n", 1)
                    .replacen("value19\n", "b\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("value12\n", "a\n", 1)
                    .replacen("value20\n", "b\n", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen("key23: value23\n", "", 1),
            ),
            (
                "x.yaml",
                yaml.clone(),
                yaml.replacen(
                    "key23: value23\n",
                    "key23: value23\n  new: line\n  more: lines\n",
                    1,
                ),
            ),
            (
                "x.yaml",
                yaml.trim_end().to_owned(),
                yaml.trim_end().replacen("value40", "value4x", 1),
            ),
            ("x.yaml", yaml.trim_end().to_owned(), yaml.clone()),
            ("x.yaml", yaml.clone(), yaml.trim_end().to_owned()),
            ("x.yaml", "a\nb".into(), "a\nb\nc".into()),
            ("x.yaml", String::new(), "a\nb\n".into()),
            ("x.yaml", "a\nb\n".into(), String::new()),
            ("x.yaml", "x\nx\nx\n".into(), "y\nx\nx\n".into()),
            ("x.yaml", "x\nx\nx\n".into(), "x\ny\nx\n".into()),
            (
                "x.yaml",
                long_head.clone(),
                long_head.replacen("e: 5", "e: 6", 1),
            ),
            (
                "x.yaml",
                "a: 1\r\nb: 2\r\n".into(),
                "a: 1\r\nb: 3\r\n".into(),
            ),
            ("dir with space/x.yaml", "a\n".into(), "b\n".into()),
            ("café/ü.yaml", "a\n".into(), "b\n".into()),
        ]
    }

    #[test]
    fn unified_diff_is_what_git_diff_prints() {
        let mut cases = diff_cases();
        let files = [file("apps/api.yaml", MULTI_DOC)];
        for change in [
            Change::Replicas(7),
            image("reg.io/team/migrate:v7", "reg.io/team/migrate:v8"),
        ] {
            let edit =
                locate(&plain_layout(""), &files, &deployment("api"), &change, None).unwrap();
            cases.push(("apps/api.yaml", edit.before, edit.after));
        }
        for (path, before, after) in &cases {
            let Some(expected) = git_diff(path, before, after) else {
                eprintln!("git is not installed: skipping the comparison");
                return;
            };
            assert_eq!(
                unified_diff(path, before, after),
                expected,
                "{path}: {before:?} -> {after:?}"
            );
        }
    }
}
