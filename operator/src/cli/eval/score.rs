//! Scoring an attempt: deterministic checks first (facts, claims, tools, proposals, calls
//! refused for want of a recording), then — only when asked, and only for scenarios with a
//! rubric that passed them — an LLM judge. And the interval a pass rate is reported with.

use super::scenario::Scenario;
use crate::catalog::ObjectSet;
use crate::llm::{ChatRequest, LlmProvider, Message};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// What an attempt did.
#[derive(Debug, Default)]
pub struct Observed {
    /// All the text the model wrote in the run.
    pub answer: String,
    /// Tool calls: name and arguments.
    pub calls: Vec<(String, Value)>,
    /// Calls no recording answered.
    pub refused: Vec<(String, Value)>,
    /// Proposals made: action and target.
    pub proposals: Vec<(String, Value)>,
    /// Provider usage.
    pub usage: crate::store::SessionUsage,
    /// Why the run did not complete (or could not start).
    pub failure: Option<String>,
}

/// One attempt, scored.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Scenario name.
    pub scenario: String,
    /// Attempt number (1-based).
    pub n: u32,
    /// Whether every check passed.
    pub passed: bool,
    /// Why not, one line each.
    pub reasons: Vec<String>,
    /// Tools called, in order.
    pub tools: Vec<String>,
    /// Provider usage.
    pub usage: crate::store::SessionUsage,
    /// Wall time.
    pub latency: Duration,
    /// The answer.
    pub answer: String,
    /// The judge's verdict and reason, when it judged.
    pub judged: Option<(bool, String)>,
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 160 {
        format!("{}…", s.chars().take(160).collect::<String>())
    } else {
        s
    }
}

/// The reasons `observed` fails `scenario` (none: it passes).
pub fn check(scenario: &Scenario, o: &Observed) -> Vec<String> {
    let e = &scenario.expect;
    let mut reasons = Vec::new();
    if let Some(f) = &o.failure {
        reasons.push(f.clone());
    }
    for fact in &e.facts {
        if fact.found_in(&o.answer).is_none() {
            reasons.push(format!("did not state {}", fact.describe()));
        }
    }
    for claim in &e.not_claims {
        if let Some(found) = claim.found_in(&o.answer) {
            reasons.push(format!("made a claim it must not make: {found:?}"));
        }
    }
    for tool in &e.tools {
        if !o.calls.iter().any(|(name, _)| name == tool) {
            reasons.push(format!("did not call {tool}"));
        }
    }
    for (tool, input) in &o.refused {
        reasons.push(format!(
            "called {tool} {} — no recording answers it (refused)",
            short(input)
        ));
    }
    for p in &e.proposals {
        let made = o.proposals.iter().any(|(a, t)| p.matches(a, t));
        match (p.make, made) {
            (true, false) => reasons.push(format!(
                "did not propose {}{}",
                p.describe(),
                if o.proposals.is_empty() {
                    String::new()
                } else {
                    format!(" (proposed {})", proposals(o))
                }
            )),
            (false, true) => reasons.push(format!("proposed {}, which it must not", p.describe())),
            _ => {}
        }
    }
    if e.no_proposal && !o.proposals.is_empty() {
        reasons.push(format!(
            "proposed {}; no proposal was expected",
            proposals(o)
        ));
    }
    reasons
}

fn proposals(o: &Observed) -> String {
    o.proposals
        .iter()
        .map(|(a, t)| {
            format!(
                "{a} {} {}/{}",
                t["kind"].as_str().unwrap_or("?"),
                t["namespace"].as_str().unwrap_or("?"),
                t["name"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Scores an attempt.
pub fn attempt(scenario: &Scenario, n: u32, observed: Observed, latency: Duration) -> Attempt {
    let reasons = check(scenario, &observed);
    Attempt {
        scenario: scenario.name.clone(),
        n,
        passed: reasons.is_empty(),
        reasons,
        tools: observed.calls.iter().map(|(n, _)| n.clone()).collect(),
        usage: observed.usage,
        latency,
        answer: observed.answer,
        judged: None,
    }
}

pub use crate::store::wilson;

const JUDGE_PROMPT: &str = "You grade the answer of an on-call assistant that investigated a Kubernetes incident. You get the question, the grading rubric, the tools it called and its answer. Judge only against the rubric. Reply with one JSON object and nothing else: {\"pass\": true or false, \"reason\": \"one sentence\"}.";

/// The LLM judge of `--judge PROVIDER[/MODEL]`.
pub struct Judge {
    adapter: Arc<dyn LlmProvider>,
    model: String,
    label: String,
}

impl Judge {
    /// The judge named `spec` (a provider of `namespace` in the manifests).
    pub fn new(objects: &ObjectSet, namespace: &str, spec: &str) -> Result<Self, String> {
        let (provider, model) = match spec.split_once('/') {
            Some((p, m)) => (p, Some(m.to_owned())),
            None => (spec, None),
        };
        let catalog = crate::catalog::compile(objects, jiff::Timestamp::now());
        let entry = catalog.provider(namespace, provider).ok_or_else(|| {
            format!("--judge {spec}: no LLMProvider {provider} in namespace {namespace}")
        })?;
        if !entry.available {
            return Err(format!(
                "--judge {spec}: LLMProvider {provider} is unavailable"
            ));
        }
        let adapter = crate::llm::build(entry).map_err(|e| format!("--judge {spec}: {e}"))?;
        let model = model
            .or_else(|| adapter.default_model().map(str::to_owned))
            .ok_or_else(|| format!("--judge {spec}: name the model (PROVIDER/MODEL)"))?;
        Ok(Self {
            adapter,
            label: format!("{provider}/{model}"),
            model,
        })
    }

    /// Grades an attempt that passed its checks, when its scenario has a rubric.
    pub async fn grade(&self, scenario: &Scenario, a: &mut Attempt) {
        let Some(rubric) = scenario.judge.as_ref().map(|j| j.rubric.as_str()) else {
            return;
        };
        if !a.passed {
            return;
        }
        let prompt = format!(
            "Question:\n{}\n\nRubric:\n{rubric}\n\nTools called: {}\n\nAnswer:\n{}",
            scenario.question,
            if a.tools.is_empty() {
                "none".to_owned()
            } else {
                a.tools.join(", ")
            },
            a.answer
        );
        let request = ChatRequest {
            model: self.model.clone(),
            system: Some(JUDGE_PROMPT.into()),
            messages: vec![Message::User { content: prompt }],
            max_tokens: Some(300),
            metadata: crate::llm::RequestMetadata {
                purpose: Some("eval-judge".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let verdict = match self.adapter.complete(&request).await {
            Ok(r) => verdict(&r.text),
            Err(e) => Err(format!("the judge {} failed: {e}", self.label)),
        };
        match verdict {
            Ok((pass, reason)) => {
                if !pass {
                    a.passed = false;
                    a.reasons.push(format!("judge {}: {reason}", self.label));
                }
                a.judged = Some((pass, reason));
            }
            Err(e) => {
                a.passed = false;
                a.reasons.push(e);
            }
        }
    }
}

/// The judge's `{"pass": …, "reason": …}`, found in its text.
fn verdict(text: &str) -> Result<(bool, String), String> {
    let start = text.find('{');
    let end = text.rfind('}');
    if let (Some(s), Some(e)) = (start, end)
        && s < e
        && let Ok(v) = serde_json::from_str::<Value>(&text[s..=e])
        && let Some(pass) = v["pass"].as_bool()
    {
        return Ok((pass, v["reason"].as_str().unwrap_or_default().to_owned()));
    }
    Err(format!(
        "the judge's reply is not a verdict ({{\"pass\": …, \"reason\": …}}): {:?}",
        text.chars().take(200).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wilson_interval_brackets_the_rate_and_narrows_with_attempts() {
        let (lo, hi) = wilson(5, 10);
        assert!(
            (lo - 0.2366).abs() < 1e-3 && (hi - 0.7634).abs() < 1e-3,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(50, 100);
        assert!(lo > 0.40 && hi < 0.60);
        assert_eq!(wilson(0, 0), (0.0, 1.0));
        let (lo, hi) = wilson(3, 3);
        assert!(lo > 0.43 && lo < 0.44 && (hi - 1.0).abs() < 1e-9, "{lo}");
    }

    #[test]
    fn a_verdict_is_read_from_the_judges_text() {
        assert_eq!(
            verdict("Sure. {\"pass\": false, \"reason\": \"no cause named\"}"),
            Ok((false, "no cause named".into()))
        );
        assert!(verdict("looks good").is_err());
    }
}
