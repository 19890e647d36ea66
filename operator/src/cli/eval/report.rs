//! The report: per configuration and scenario — pass rate with its 95 % interval, tool
//! calls, tokens, cost, latency and why each failure failed — as a table, JSON
//! (`kortex.dev/eval-report/v1`) or JUnit XML; compared side by side with `--compare`.

use super::scenario::Scenario;
use super::score::{Attempt, wilson};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// One scenario under one configuration.
pub struct ScenarioSummary {
    name: String,
    attempts: Vec<Attempt>,
}

impl ScenarioSummary {
    fn passed(&self) -> u64 {
        self.attempts.iter().filter(|a| a.passed).count() as u64
    }

    fn n(&self) -> u64 {
        self.attempts.len() as u64
    }

    fn mean(&self, f: impl Fn(&Attempt) -> f64) -> f64 {
        if self.attempts.is_empty() {
            return 0.0;
        }
        self.attempts.iter().map(f).sum::<f64>() / self.attempts.len() as f64
    }

    /// Distinct reasons, with how many attempts gave each.
    fn reasons(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        for r in self.attempts.iter().flat_map(|a| &a.reasons) {
            match out.iter_mut().find(|(x, _)| x == r) {
                Some((_, c)) => *c += 1,
                None => out.push((r.clone(), 1)),
            }
        }
        out
    }

    fn json(&self) -> Value {
        let (lo, hi) = wilson(self.passed(), self.n());
        json!({
            "name": self.name,
            "attempts": self.n(),
            "passed": self.passed(),
            "passRate": rate(self.passed(), self.n()),
            "interval": [round(lo), round(hi)],
            "toolCalls": round(self.mean(|a| a.tools.len() as f64)),
            "inputTokens": self.attempts.iter().map(|a| a.usage.input_tokens).sum::<i64>(),
            "outputTokens": self.attempts.iter().map(|a| a.usage.output_tokens).sum::<i64>(),
            "costUsd": round6(self.attempts.iter().map(|a| a.usage.cost_usd).sum::<f64>()),
            "latencyMs": self.mean(|a| a.latency.as_millis() as f64).round(),
            "failures": self.attempts.iter().filter(|a| !a.passed).map(|a| json!({
                "attempt": a.n, "reasons": a.reasons, "tools": a.tools,
                "answer": a.answer.chars().take(2000).collect::<String>(),
            })).collect::<Vec<_>>(),
            "judged": self.attempts.iter().filter_map(|a| a.judged.as_ref()).map(|(pass, reason)| json!({"pass": pass, "reason": reason})).collect::<Vec<_>>(),
        })
    }
}

/// One configuration's results.
pub struct Summary {
    /// `NS/NAME`, `provider/model` or `manifests`.
    pub label: String,
    kind: &'static str,
    scenarios: Vec<ScenarioSummary>,
}

fn rate(passed: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        round(passed as f64 / n as f64)
    }
}

fn round(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn round6(v: f64) -> f64 {
    (v * 1_000_000.0).round() / 1_000_000.0
}

impl Summary {
    /// Groups `attempts` by scenario, in the scenarios' order.
    pub fn of(
        label: String,
        kind: &'static str,
        scenarios: &[Arc<Scenario>],
        attempts: Vec<Attempt>,
    ) -> Self {
        let scenarios = scenarios
            .iter()
            .map(|s| ScenarioSummary {
                name: s.name.clone(),
                attempts: attempts
                    .iter()
                    .filter(|a| a.scenario == s.name)
                    .cloned()
                    .collect(),
            })
            .collect();
        Self {
            label,
            kind,
            scenarios,
        }
    }

    fn passed(&self) -> u64 {
        self.scenarios.iter().map(ScenarioSummary::passed).sum()
    }

    fn n(&self) -> u64 {
        self.scenarios.iter().map(ScenarioSummary::n).sum()
    }

    /// Passed attempts over all attempts.
    pub fn pass_rate(&self) -> f64 {
        if self.n() == 0 {
            0.0
        } else {
            self.passed() as f64 / self.n() as f64
        }
    }

    fn all(&self) -> impl Iterator<Item = &Attempt> {
        self.scenarios.iter().flat_map(|s| &s.attempts)
    }

    fn tokens(&self) -> (i64, i64) {
        self.all().fold((0, 0), |(i, o), a| {
            (i + a.usage.input_tokens, o + a.usage.output_tokens)
        })
    }

    fn cost(&self) -> f64 {
        self.all().map(|a| a.usage.cost_usd).sum()
    }

    fn latency_ms(&self) -> (f64, f64) {
        let mut ms: Vec<f64> = self.all().map(|a| a.latency.as_millis() as f64).collect();
        if ms.is_empty() {
            return (0.0, 0.0);
        }
        ms.sort_by(f64::total_cmp);
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        let p90 = ms[((ms.len() as f64 * 0.9).ceil() as usize).clamp(1, ms.len()) - 1];
        (mean.round(), p90)
    }

    /// The configuration's report (`report` of `GET /api/v1/evals`).
    pub fn json(&self) -> Value {
        let (lo, hi) = wilson(self.passed(), self.n());
        let (input, output) = self.tokens();
        let (mean, p90) = self.latency_ms();
        let calls = self.all().map(|a| a.tools.len()).sum::<usize>();
        json!({
            "label": self.label,
            "kind": self.kind,
            "scenarios": self.scenarios.len(),
            "attempts": self.n(),
            "passed": self.passed(),
            "passRate": rate(self.passed(), self.n()),
            "interval": [round(lo), round(hi)],
            "toolCalls": calls,
            "inputTokens": input,
            "outputTokens": output,
            "costUsd": round6(self.cost()),
            "latencyMs": {"mean": mean, "p90": p90},
            "results": self.scenarios.iter().map(ScenarioSummary::json).collect::<Vec<_>>(),
        })
    }

    /// The row `--record` stores.
    pub fn record(&self, suite: &str) -> crate::store::EvalRun {
        let (input_tokens, output_tokens) = self.tokens();
        crate::store::EvalRun {
            id: String::new(),
            at: 0,
            label: self.label.clone(),
            kind: self.kind.to_owned(),
            suite: suite.to_owned(),
            scenarios: self.scenarios.len() as i64,
            attempts: self.n() as i64,
            passed: self.passed() as i64,
            input_tokens,
            output_tokens,
            cost_usd: self.cost(),
            report: self.json(),
        }
    }
}

/// The whole report.
pub struct Report {
    /// The scenarios folder's name.
    pub suite: String,
    /// `--repeat`.
    pub repeat: u32,
    /// Wall time of the eval.
    pub duration: Duration,
    /// One per configuration.
    pub targets: Vec<Summary>,
    /// Whether a judge graded rubrics.
    pub judged: bool,
}

fn pct(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn cell(s: &ScenarioSummary) -> String {
    let (lo, hi) = wilson(s.passed(), s.n());
    if s.n() == 1 {
        if s.passed() == 1 {
            "pass".into()
        } else {
            "FAIL".into()
        }
    } else {
        format!("{}/{} ({}–{})", s.passed(), s.n(), pct(lo), pct(hi))
    }
}

impl Report {
    /// `kortex.dev/eval-report/v1`.
    pub fn json(&self) -> Value {
        json!({
            "format": "kortex.dev/eval-report/v1",
            "suite": self.suite,
            "repeat": self.repeat,
            "durationMs": self.duration.as_millis() as u64,
            "judged": self.judged,
            "targets": self.targets.iter().map(Summary::json).collect::<Vec<_>>(),
        })
    }

    /// Tables for a terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let width = self
            .targets
            .first()
            .map(|t| t.scenarios.iter().map(|s| s.name.len()).max().unwrap_or(8))
            .unwrap_or(8)
            .max(8);
        if self.targets.len() > 1 {
            let _ = write!(out, "{:width$}", "scenario");
            for t in &self.targets {
                let _ = write!(out, "  {:>22}", t.label);
            }
            out.push('\n');
            let names: Vec<&str> = self.targets[0]
                .scenarios
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            for (i, name) in names.iter().enumerate() {
                let _ = write!(out, "{name:width$}");
                for t in &self.targets {
                    let _ = write!(
                        out,
                        "  {:>22}",
                        t.scenarios.get(i).map(cell).unwrap_or_default()
                    );
                }
                out.push('\n');
            }
            out.push('\n');
        }
        for t in &self.targets {
            let (lo, hi) = wilson(t.passed(), t.n());
            let (input, output) = t.tokens();
            let (mean, p90) = t.latency_ms();
            let _ = writeln!(
                out,
                "{} ({}): {}/{} passed, {} (95% interval {}–{}); {} tool calls; {input} in / {output} out tokens; ${:.4}; latency mean {:.1} s, p90 {:.1} s",
                t.label,
                t.kind,
                t.passed(),
                t.n(),
                pct(t.pass_rate()),
                pct(lo),
                pct(hi),
                t.all().map(|a| a.tools.len()).sum::<usize>(),
                t.cost(),
                mean / 1000.0,
                p90 / 1000.0,
            );
            let _ = writeln!(
                out,
                "  {:width$}  {:>16}  {:>5}  {:>8}  {:>8}  {:>7}",
                "scenario", "passed", "tools", "tokens", "cost", "latency"
            );
            for s in &t.scenarios {
                let tokens: i64 = s
                    .attempts
                    .iter()
                    .map(|a| a.usage.input_tokens + a.usage.output_tokens)
                    .sum::<i64>()
                    / (s.n().max(1) as i64);
                let _ = writeln!(
                    out,
                    "  {:width$}  {:>16}  {:>5.1}  {:>8}  {:>8}  {:>6.1}s",
                    s.name,
                    cell(s),
                    s.mean(|a| a.tools.len() as f64),
                    tokens,
                    format!("${:.4}", s.mean(|a| a.usage.cost_usd)),
                    s.mean(|a| a.latency.as_secs_f64()),
                );
                for (reason, count) in s.reasons() {
                    let times = if s.n() > 1 {
                        format!(" ({count}×)")
                    } else {
                        String::new()
                    };
                    let _ = writeln!(out, "      ✗ {reason}{times}");
                }
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{} scenarios × {} in {:.1} s{}",
            self.targets.first().map_or(0, |t| t.scenarios.len()),
            self.repeat,
            self.duration.as_secs_f64(),
            if self.judged { "; rubrics judged" } else { "" }
        );
        out
    }

    /// JUnit XML: a suite per configuration, a case per attempt.
    pub fn junit(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let tests: u64 = self.targets.iter().map(Summary::n).sum();
        let failures: u64 = self.targets.iter().map(|t| t.n() - t.passed()).sum();
        let _ = writeln!(
            out,
            "<testsuites name=\"kortex eval {}\" tests=\"{tests}\" failures=\"{failures}\" time=\"{:.3}\">",
            xml(&self.suite),
            self.duration.as_secs_f64()
        );
        for t in &self.targets {
            let time: f64 = t.all().map(|a| a.latency.as_secs_f64()).sum();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" time=\"{time:.3}\">",
                xml(&t.label),
                t.n(),
                t.n() - t.passed()
            );
            for a in t.all() {
                let name = if self.repeat > 1 {
                    format!("{} #{}", a.scenario, a.n)
                } else {
                    a.scenario.clone()
                };
                let _ = write!(
                    out,
                    "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                    xml(&format!("{}.{}", self.suite, t.label)),
                    xml(&name),
                    a.latency.as_secs_f64()
                );
                if a.passed {
                    out.push_str("/>\n");
                } else {
                    let _ = writeln!(
                        out,
                        ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                        xml(a.reasons.first().map_or("failed", String::as_str)),
                        xml(&a.reasons.join("\n"))
                    );
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

/// Escapes text for XML attributes and content (control characters XML 1.0 forbids are
/// dropped).
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}
