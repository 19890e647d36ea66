//! The scenario format (`kortex.dev/eval/v1`, `docs/evals.md`): one folder per scenario with
//! `scenario.yaml` — the question, what the answer must and must not say, the tools it must
//! call, the proposals it should or should not make, an optional rubric — and the evidence:
//! `tools/*.json` recordings (recorded mode) or `manifests/*.yaml` (live mode).

use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The format version a `scenario.yaml` declares in `apiVersion`.
pub const FORMAT: &str = "kortex.dev/eval/v1";

/// Where the evidence comes from.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Tools answer from `tools/*.json`; nothing else is reachable.
    #[default]
    Recorded,
    /// `manifests/*.yaml` are applied to a throwaway namespace of a real cluster.
    Live,
}

/// `scenario.yaml` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    api_version: String,
    kind: String,
    #[serde(default)]
    description: String,
    question: String,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    expect: ExpectFile,
    #[serde(default)]
    judge: Option<Judge>,
    #[serde(default)]
    live: LiveFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExpectFile {
    #[serde(default)]
    facts: Vec<OneOrMany>,
    #[serde(default)]
    not_claims: Vec<OneOrMany>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    proposals: Vec<ProposalExpect>,
    #[serde(default)]
    no_proposal: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LiveFile {
    /// How long to wait after applying the manifests before asking.
    #[serde(default)]
    settle_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A rubric for the LLM judge.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Judge {
    /// What a good answer contains, in words.
    pub rubric: String,
}

/// A proposal the answer should (`make: true`, the default) or should not make.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProposalExpect {
    /// Whether it must be made (`false`: it must not be).
    #[serde(default = "yes")]
    pub make: bool,
    /// `restart`, `scale`, … (any when unset).
    #[serde(default)]
    pub action: Option<String>,
    /// The target's fields that must match (any when unset).
    #[serde(default)]
    pub target: Option<TargetExpect>,
}

fn yes() -> bool {
    true
}

/// Fields of a proposal's target; unset ones match anything.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetExpect {
    /// Kind (case-insensitive).
    #[serde(default)]
    pub kind: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

impl ProposalExpect {
    /// Whether a proposal of `action` on `target` (its JSON) is this one.
    pub fn matches(&self, action: &str, target: &Value) -> bool {
        let field = |k: &str| target[k].as_str().unwrap_or_default();
        self.action.as_deref().is_none_or(|a| a == action)
            && self.target.as_ref().is_none_or(|t| {
                t.kind
                    .as_deref()
                    .is_none_or(|k| k.eq_ignore_ascii_case(field("kind")))
                    && t.name.as_deref().is_none_or(|n| n == field("name"))
                    && t.namespace
                        .as_deref()
                        .is_none_or(|n| n == field("namespace"))
            })
    }

    /// `restart Deployment shop/checkout`, for reasons.
    pub fn describe(&self) -> String {
        let t = self.target.clone().unwrap_or_default();
        let place = match (t.namespace, t.name) {
            (Some(ns), Some(n)) => format!(" {ns}/{n}"),
            (None, Some(n)) => format!(" {n}"),
            _ => String::new(),
        };
        format!(
            "{}{}{place}",
            self.action.as_deref().unwrap_or("any action"),
            t.kind.map(|k| format!(" {k}")).unwrap_or_default()
        )
    }
}

/// One way a fact may be written: a case-insensitive substring, or (`re:…`) a
/// case-insensitive regular expression.
#[derive(Clone, Debug)]
pub enum Pattern {
    /// Lower-cased text to find.
    Text(String),
    /// A compiled expression.
    Regex(regex::Regex),
}

impl Pattern {
    fn parse(s: &str) -> Result<Self, String> {
        match s.strip_prefix("re:") {
            Some(re) => regex::RegexBuilder::new(re)
                .case_insensitive(true)
                .build()
                .map(Pattern::Regex)
                .map_err(|e| format!("{s:?} is not a regular expression: {e}")),
            None if s.trim().is_empty() => Err("an empty alternative".into()),
            None => Ok(Pattern::Text(s.to_lowercase())),
        }
    }

    /// Whether `text` (already lower-cased in `lower`) contains it.
    pub fn found(&self, text: &str, lower: &str) -> bool {
        match self {
            Pattern::Text(t) => lower.contains(t.as_str()),
            Pattern::Regex(r) => r.is_match(text),
        }
    }
}

/// A fact or claim: alternatives, any one of which counts.
#[derive(Clone, Debug)]
pub struct Alternatives {
    /// As written, for reports.
    pub written: Vec<String>,
    /// Compiled.
    pub patterns: Vec<Pattern>,
}

impl Alternatives {
    /// The first alternative found in `text`.
    pub fn found_in(&self, text: &str) -> Option<&str> {
        let lower = text.to_lowercase();
        self.patterns
            .iter()
            .zip(&self.written)
            .find(|(p, _)| p.found(text, &lower))
            .map(|(_, w)| w.as_str())
    }

    /// `"a" or "b"`, for reasons.
    pub fn describe(&self) -> String {
        self.written
            .iter()
            .map(|w| format!("{w:?}"))
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// What the answer is checked against.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// Facts it must state.
    pub facts: Vec<Alternatives>,
    /// Claims it must not make.
    pub not_claims: Vec<Alternatives>,
    /// Tools it must call.
    pub tools: Vec<String>,
    /// Proposals it should or should not make.
    pub proposals: Vec<ProposalExpect>,
    /// It must propose nothing.
    pub no_proposal: bool,
}

/// A recorded tool result: what `tool` returns to calls whose arguments match `args`.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Recording {
    /// Tool name.
    pub tool: String,
    /// Argument pattern: every key must be in the call and match (strings are
    /// case-insensitive globs with `|` between alternatives, objects match recursively);
    /// the call's other arguments are ignored.
    #[serde(default)]
    pub args: serde_json::Map<String, Value>,
    /// The result (a string as it is, anything else as JSON text).
    pub result: Value,
    /// The tool failed with `result` as its message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl Recording {
    /// Whether a call with `input` is answered by this recording.
    pub fn answers(&self, tool: &str, input: &Value) -> bool {
        self.tool == tool
            && self
                .args
                .iter()
                .all(|(k, pattern)| input.get(k).is_some_and(|v| value_matches(pattern, v)))
    }

    /// The result as the tool returns it.
    pub fn text(&self) -> String {
        match &self.result {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        }
    }
}

/// `pattern` (from a recording) against an argument: strings are case-insensitive globs
/// (`*`), with alternatives separated by `|` (`Deployment|deploy*`); objects match key by
/// key; arrays element by element; everything else by equality.
fn value_matches(pattern: &Value, value: &Value) -> bool {
    match (pattern, value) {
        (Value::String(p), Value::String(v)) => {
            let v = v.to_lowercase();
            p.split('|')
                .any(|alt| crate::glob::matches(&alt.trim().to_lowercase(), &v))
        }
        (Value::String(p), v) if p == "*" => !v.is_null(),
        (Value::String(p), Value::Number(n)) => p == &n.to_string(),
        (Value::Object(p), Value::Object(v)) => p
            .iter()
            .all(|(k, pv)| v.get(k).is_some_and(|vv| value_matches(pv, vv))),
        (Value::Array(p), Value::Array(v)) => {
            p.len() == v.len() && p.iter().zip(v).all(|(a, b)| value_matches(a, b))
        }
        (p, v) => p == v,
    }
}

/// One scenario, loaded and checked.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its folder's name.
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
    /// What it is about.
    pub description: String,
    /// The question asked.
    pub question: String,
    /// Session name (default `eval-{name}`).
    pub session: String,
    /// Session namespace (default: the command's `--namespace`).
    pub namespace: Option<String>,
    /// Policy `NS/NAME` it runs under unless the command line says otherwise.
    pub policy: Option<String>,
    /// Evidence.
    pub mode: Mode,
    /// Checks.
    pub expect: Expect,
    /// The rubric, for `--judge`.
    pub judge: Option<Judge>,
    /// Recorded mode: the tool results.
    pub recordings: Vec<Recording>,
    /// Live mode: the manifests' paths.
    pub manifests: Vec<PathBuf>,
    /// Live mode: seconds to wait after applying.
    pub settle_seconds: u64,
}

fn alternatives(items: Vec<OneOrMany>, field: &str) -> Result<Vec<Alternatives>, String> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let written = match item {
                OneOrMany::One(s) => vec![s],
                OneOrMany::Many(v) => v,
            };
            if written.is_empty() {
                return Err(format!("expect.{field}[{i}]: no alternative"));
            }
            let patterns = written
                .iter()
                .map(|s| Pattern::parse(s).map_err(|e| format!("expect.{field}[{i}]: {e}")))
                .collect::<Result<_, _>>()?;
            Ok(Alternatives { written, patterns })
        })
        .collect()
}

fn files_with(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e))
        {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Reads the recordings of a `tools/` folder: each `.json` file an array (or one object).
pub fn read_recordings(dir: &Path) -> Result<Vec<Recording>, String> {
    let mut out = Vec::new();
    for path in files_with(dir, &["json"])? {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let items = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for (i, item) in items.into_iter().enumerate() {
            let r: Recording = serde_path_to_error::deserialize(item)
                .map_err(|e| format!("{}: recording {i}: {e}", path.display()))?;
            out.push(r);
        }
    }
    Ok(out)
}

impl Scenario {
    /// Loads the scenario in `dir` (`dir/scenario.yaml`).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let path = dir.join("scenario.yaml");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: Value = serde_saphyr::from_str(&text)
            .map_err(|e| format!("{}: not YAML: {e}", path.display()))?;
        let file: File = serde_path_to_error::deserialize(value)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let at = |e: String| format!("{}: {e}", path.display());
        if file.api_version != FORMAT {
            return Err(at(format!(
                "apiVersion {:?}: this Kortex reads {FORMAT}",
                file.api_version
            )));
        }
        if file.kind != "Scenario" {
            return Err(at(format!("kind {:?}: expected Scenario", file.kind)));
        }
        if file.question.trim().is_empty() {
            return Err(at("question is empty".into()));
        }
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("scenario")
            .to_owned();
        let expect = Expect {
            facts: alternatives(file.expect.facts, "facts").map_err(at)?,
            not_claims: alternatives(file.expect.not_claims, "notClaims").map_err(at)?,
            tools: file.expect.tools,
            proposals: file.expect.proposals,
            no_proposal: file.expect.no_proposal,
        };
        if expect.no_proposal && expect.proposals.iter().any(|p| p.make) {
            return Err(at(
                "expect.noProposal contradicts a proposal it must make".into()
            ));
        }
        if expect.facts.is_empty() && expect.tools.is_empty() && file.judge.is_none() {
            return Err(at(
                "expect names no fact, no tool and there is no judge rubric: nothing to score"
                    .into(),
            ));
        }
        let recordings = read_recordings(&dir.join("tools"))?;
        let manifests = files_with(&dir.join("manifests"), &["yaml", "yml"])?;
        match file.mode {
            Mode::Recorded if recordings.is_empty() && !expect.tools.is_empty() => {
                return Err(at(format!(
                    "recorded mode with no recording in {}/tools/*.json, yet expect.tools names {:?}",
                    dir.display(),
                    expect.tools
                )));
            }
            Mode::Live if manifests.is_empty() => {
                return Err(at(format!(
                    "live mode needs manifests in {}/manifests/*.yaml",
                    dir.display()
                )));
            }
            _ => {}
        }
        for t in &expect.tools {
            if file.mode == Mode::Recorded && !recordings.iter().any(|r| &r.tool == t) {
                return Err(at(format!(
                    "expect.tools names {t}, which has no recording: the call would be refused"
                )));
            }
        }
        Ok(Self {
            session: file.session.unwrap_or_else(|| format!("eval-{name}")),
            name,
            dir: dir.to_owned(),
            description: file.description,
            question: file.question,
            namespace: file.namespace,
            policy: file.policy,
            mode: file.mode,
            expect,
            judge: file.judge,
            recordings,
            manifests,
            settle_seconds: file.live.settle_seconds.unwrap_or(20),
        })
    }

    /// The scenario in `dir`, or every scenario in its sub-folders (by name).
    pub fn load_all(dir: &Path) -> Result<Vec<Self>, String> {
        if dir.join("scenario.yaml").is_file() {
            return Ok(vec![Self::load(dir)?]);
        }
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("scenario.yaml").is_file())
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(format!(
                "{}: no scenario.yaml in it or in its sub-folders",
                dir.display()
            ));
        }
        dirs.iter().map(|d| Self::load(d)).collect()
    }

    /// The recording that answers a call, if any.
    pub fn answer(&self, tool: &str, input: &Value) -> Option<&Recording> {
        self.recordings.iter().find(|r| r.answers(tool, input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(args: Value) -> Recording {
        Recording {
            tool: "get_logs".into(),
            args: args.as_object().cloned().unwrap_or_default(),
            result: json!("ok"),
            is_error: false,
        }
    }

    #[test]
    fn recordings_match_by_pattern_and_ignore_other_arguments() {
        let r = rec(json!({"namespace": "shop", "workload": "*checkout*"}));
        assert!(r.answers(
            "get_logs",
            &json!({"namespace": "shop", "workload": "deploy/checkout-api", "previous": true})
        ));
        assert!(!r.answers("get_logs", &json!({"namespace": "shop"})));
        assert!(!r.answers(
            "get_logs",
            &json!({"namespace": "web", "workload": "checkout"})
        ));
        assert!(!r.answers(
            "get_events",
            &json!({"namespace": "shop", "workload": "checkout"})
        ));
        assert!(rec(json!({})).answers("get_logs", &json!({"anything": 1})));
        let kinds = rec(json!({"kind": "Deployment*|deploy"}));
        for kind in ["Deployment", "deployments", "deploy", "DEPLOY"] {
            assert!(kinds.answers("get_logs", &json!({"kind": kind})), "{kind}");
        }
        assert!(!kinds.answers("get_logs", &json!({"kind": "StatefulSet"})));
        let nested = rec(json!({"selector": {"app": "web*"}, "limit": "*"}));
        assert!(nested.answers(
            "get_logs",
            &json!({"selector": {"app": "web-1", "tier": "x"}, "limit": 5})
        ));
        assert!(!nested.answers("get_logs", &json!({"selector": {"app": "web-1"}})));
    }

    #[test]
    fn facts_match_text_or_regex_case_insensitively() {
        let a = alternatives(
            vec![OneOrMany::Many(vec![
                "OOMKilled".into(),
                "re:out of memory|memory limit".into(),
            ])],
            "facts",
        )
        .unwrap_or_default();
        assert_eq!(a[0].found_in("the pods were oomkilled"), Some("OOMKilled"));
        assert_eq!(
            a[0].found_in("They hit the Memory Limit."),
            Some("re:out of memory|memory limit")
        );
        assert_eq!(a[0].found_in("a bad config key"), None);
        assert!(alternatives(vec![OneOrMany::One("re:(".into())], "facts").is_err());
    }

    #[test]
    fn proposal_expectations_match_action_and_target_fields() {
        let p = ProposalExpect {
            make: true,
            action: Some("restart".into()),
            target: Some(TargetExpect {
                kind: Some("deployment".into()),
                name: Some("checkout".into()),
                namespace: None,
            }),
        };
        let t = json!({"kind": "Deployment", "name": "checkout", "namespace": "shop"});
        assert!(p.matches("restart", &t));
        assert!(!p.matches("scale", &t));
        assert!(!p.matches(
            "restart",
            &json!({"kind": "Deployment", "name": "cart", "namespace": "shop"})
        ));
        assert_eq!(p.describe(), "restart deployment checkout");
    }
}
