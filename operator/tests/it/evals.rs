//! `kortex eval` from the binary, against a scripted wire-format provider: a scenario passes
//! when the model calls the expected tools and states the facts; fails — with the reason —
//! when it misses a fact, makes a forbidden claim, calls a tool no recording answers, or
//! proposes what it must not; repeats and their interval; `--compare`; JUnit that parses;
//! `--record` then `GET /api/v1/evals`; `eval record` round-trips a real session; and the
//! starter suite in `evals/` loads and its recordings answer the calls they expect.

use crate::support::browser::{passed, run_browser, screenshots};
use crate::support::chat::{ask, get_json, open_session};
use crate::support::net::http_client;
use crate::support::provider::{Reply, json_reply, mock, openai, streamed};
use crate::support::server::Server;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_kortex");

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

fn config(dir: &Path, llm: &str) {
    write(
        &dir.join("config/llm.yaml"),
        &format!(
            r#"apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: scripted}}
spec: {{type: openai-compatible, baseUrl: "{llm}/v1", defaultModel: strong, timeout: 10s}}
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: oncall}}
spec:
  sessions: ["incident-*"]
  provider: scripted
  models: {{default: strong}}
  proposals: {{allowedActions: [restart], allowedNamespaces: ["*"]}}
"#
        ),
    );
}

/// The scenarios of the failure-reason test, each answered by the script below.
fn scenarios(dir: &Path) {
    let logs = r#"[{"tool": "get_logs", "args": {"namespace": "shop", "workload": "*checkout*"}, "result": {"lines": ["fatal: missing required config key PAYMENT_URL"]}},
 {"tool": "get_logs", "args": {"namespace": "shop"}, "result": {"lines": ["GET /cart 200 4120ms", "pool: waiting for a connection (max connections 10)"]}},
 {"tool": "get_events", "args": {"namespace": "data"}, "result": {"items": []}}]"#;
    for (name, question, expect) in [
        (
            "good",
            "Why is checkout crash-looping in shop?",
            "facts: [[PAYMENT_URL, \"payment url\"], [\"re:missing|not set\"]]\n  notClaims: [OOMKilled]\n  tools: [get_logs]\n  noProposal: true",
        ),
        (
            "misses-fact",
            "Why is cart slow in shop?",
            "facts: [[\"re:connection pool|max connections\"]]\n  notClaims: [[OOMKilled, \"out of memory\"]]\n  tools: [get_logs]",
        ),
        (
            "unrecorded",
            "Why does DNS fail in web?",
            "facts: [NetworkPolicy]\n  tools: [get_events]",
        ),
        (
            "wrong-proposal",
            "Should we restart api in shop?",
            "facts: [\"re:secret\"]\n  tools: [get_logs]\n  proposals: [{action: restart, make: false, target: {kind: Deployment, name: api}}]",
        ),
    ] {
        let d = dir.join("suite").join(name);
        write(
            &d.join("scenario.yaml"),
            &format!(
                "apiVersion: kortex.dev/eval/v1\nkind: Scenario\ndescription: test {name}\nquestion: {question:?}\nexpect:\n  {expect}\n"
            ),
        );
        write(&d.join("tools/recorded.json"), logs);
    }
}

/// The scripted model: what it does depends on the question and on how many tool results
/// the conversation already has; the `weak` model never calls a tool.
fn script(body: &Value, flaky: &AtomicUsize) -> Option<Reply> {
    let d = openai();
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let question = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    let text = |t: &str| Some(streamed(&d, (d.text_stream)(&[t])));
    let call = |name: &str, args: Value| {
        Some(streamed(
            &d,
            (d.tools_stream)(&[("call_1", name, &args.to_string())]),
        ))
    };
    if body["model"] == "weak" {
        return text("I am not sure what is wrong.");
    }
    // The judge (a whole answer, not streamed): the rubric asks for the fix.
    if body["stream"] != json!(true) && body.to_string().contains("You grade") {
        let answer = messages
            .last()
            .map(|m| m["content"].to_string())
            .unwrap_or_default();
        let verdict = if answer.contains("Set it in the ConfigMap") {
            json!({"pass": true, "reason": "names the key and the fix"})
        } else {
            json!({"pass": false, "reason": "names no fix"})
        };
        return Some(json_reply(200, &(d.text_json)(&verdict.to_string())));
    }
    match (question.as_str(), results) {
        (q, 0) if q.contains("crash-looping") => call(
            "get_logs",
            json!({"namespace": "shop", "workload": "checkout", "previous": true}),
        ),
        (q, _) if q.contains("crash-looping") => text(
            "checkout exits at start: the config key PAYMENT_URL is missing. Set it in the ConfigMap and roll out.",
        ),
        (q, 0) if q.contains("slow") => {
            call("get_logs", json!({"namespace": "shop", "workload": "cart"}))
        }
        (q, _) if q.contains("slow") => text("The cart pods were OOMKilled."),
        (q, 0) if q.contains("DNS") => call("get_events", json!({"namespace": "web"})),
        (q, _) if q.contains("DNS") => text("A NetworkPolicy blocks port 53."),
        (q, 0) if q.contains("restart") => {
            call("get_logs", json!({"namespace": "shop", "workload": "api"}))
        }
        (q, 1) if q.contains("restart") => call(
            "propose_action",
            json!({"action": "restart", "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"}, "rationale": "restart it"}),
        ),
        (q, _) if q.contains("restart") => {
            text("I proposed a restart of api; the Secret key is missing.")
        }
        (q, 0) if q.contains("before") => call(
            "get_incident_history",
            json!({"query": "checkout crash", "limit": 5}),
        ),
        (q, _) if q.contains("before") => {
            text("Nothing like it happened before; the logs point at the missing PAYMENT_URL key.")
        }
        (q, 0) if q.contains("flaky") => call(
            "get_logs",
            json!({"namespace": "shop", "workload": "checkout"}),
        ),
        (q, _) if q.contains("flaky") => {
            // Every other attempt states the fact.
            if flaky.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                text("PAYMENT_URL is missing.")
            } else {
                text("Something is wrong with checkout.")
            }
        }
        _ => text("No idea."),
    }
}

fn eval(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).arg("eval").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn result<'a>(report: &'a Value, target: usize, scenario: &str) -> &'a Value {
    report["targets"][target]["results"]
        .as_array()
        .and_then(|r| r.iter().find(|s| s["name"] == scenario))
        .unwrap_or_else(|| panic!("no {scenario} in {report:#}"))
}

fn reasons(r: &Value) -> Vec<String> {
    r["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["reasons"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_pass_and_fail_for_the_right_reasons() {
    let (llm, s) = mock().await;
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    *s.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(move |body: &Value| script(body, &f)));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &llm);
    scenarios(dir.path());
    let junit = dir.path().join("junit.xml");
    let db = dir.path().join("evals.db");
    let db_url = format!("sqlite://{}", db.display());
    let (code, out, err) = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        let junit = junit.clone();
        let db_url = db_url.clone();
        move || {
            eval(&[
                "--scenarios",
                &dir.join("suite").display().to_string(),
                "--manifests",
                &dir.join("config").display().to_string(),
                "--provider",
                "scripted",
                "--parallel",
                "2",
                "--json",
                "--junit",
                &junit.display().to_string(),
                "--min-pass-rate",
                "50%",
                "--record",
                "--database-url",
                &db_url,
            ])
        }
    })
    .await
    .unwrap();
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(code, 1, "1 of 4 passed, below --min-pass-rate 50%: {err}");
    // Without manifests and without a cluster: told what to pass.
    let bare = Command::new(BIN)
        .args([
            "eval",
            "--scenarios",
            &dir.path().join("suite").display().to_string(),
        ])
        .env_remove("KUBECONFIG")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(!bare.status.success());
    assert!(
        String::from_utf8_lossy(&bare.stderr)
            .contains("--manifests PATH is required without a cluster"),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    assert!(err.contains("below --min-pass-rate"), "{err}");
    let t = &report["targets"][0];
    assert_eq!(
        (
            t["label"].as_str(),
            t["attempts"].as_u64(),
            t["passed"].as_u64()
        ),
        (Some("scripted"), Some(4), Some(1)),
        "{report:#}"
    );

    let good = result(&report, 0, "good");
    assert_eq!(good["passed"], 1, "{good:#}");
    assert!(
        good["inputTokens"].as_i64() > Some(0),
        "usage is counted: {good}"
    );

    let r = reasons(result(&report, 0, "misses-fact"));
    assert!(
        r.iter()
            .any(|x| x.starts_with("did not state \"re:connection pool|max connections\"")),
        "{r:?}"
    );
    assert!(
        r.iter()
            .any(|x| x == "made a claim it must not make: \"OOMKilled\""),
        "{r:?}"
    );

    let r = reasons(result(&report, 0, "unrecorded"));
    assert_eq!(r.len(), 1, "only the refusal fails it: {r:?}");
    assert!(
        r[0].starts_with("called get_events {\"namespace\":\"web\"} — no recording answers it"),
        "{r:?}"
    );

    let r = reasons(result(&report, 0, "wrong-proposal"));
    assert_eq!(
        r,
        vec!["proposed restart Deployment api, which it must not".to_owned()]
    );

    // JUnit: parsed by Python's standard library.
    let check = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); s = r.find('testsuite'); print(r.get('tests'), r.get('failures'), s.get('name'), len(s.findall('testcase')), len(s.findall('testcase/failure')), s.find(\"testcase[@name='unrecorded']/failure\").get('message'))",
            &junit.display().to_string(),
        ])
        .output()
        .unwrap();
    let parsed = String::from_utf8_lossy(&check.stdout);
    assert!(
        parsed.starts_with("4 3 scripted 4 3 called get_events"),
        "{parsed} {}",
        String::from_utf8_lossy(&check.stderr)
    );

    // --record: the server's API lists it.
    let server = Server::start_with_url(&dir.path().join("config"), &db_url, &[]);
    let evals: Value = get_json(&http_client(), server.url("/api/v1/evals")).await;
    let items = evals["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{evals:#}");
    assert_eq!(
        (
            items[0]["label"].as_str(),
            items[0]["passed"].as_i64(),
            items[0]["attempts"].as_i64(),
            items[0]["suite"].as_str()
        ),
        (Some("scripted"), Some(1), Some(4), Some("suite"))
    );
    assert!(
        (items[0]["passRate"].as_f64().unwrap_or(-1.0) - 0.25).abs() < 1e-9,
        "{evals:#}"
    );
    // The dashboard's Evals page shows it.
    let url = server.url("");
    if let Some(out) = run_browser("evals.mjs", &[("KORTEX_URL", url.trim_end_matches('/'))]).await
    {
        passed(&out, &server);
        assert!(screenshots().join("evals-dark.png").exists());
    }
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_give_an_interval_and_compare_runs_side_by_side() {
    let (llm, s) = mock().await;
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    *s.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(move |body: &Value| script(body, &f)));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &llm);
    let d = dir.path().join("flaky");
    write(
        &d.join("scenario.yaml"),
        "apiVersion: kortex.dev/eval/v1\nkind: Scenario\nquestion: Is checkout flaky?\nsession: incident-flaky\nexpect:\n  facts: [PAYMENT_URL]\n  tools: [get_logs]\n",
    );
    write(
        &d.join("tools/logs.json"),
        r#"[{"tool": "get_logs", "args": {}, "result": "fatal: PAYMENT_URL missing"}]"#,
    );
    let scenarios = d.display().to_string();
    let manifests = dir.path().join("config").display().to_string();
    // Four attempts under the policy the session name selects: every other one passes.
    let (code, out, err) = {
        let (s, m) = (scenarios.clone(), manifests.clone());
        tokio::task::spawn_blocking(move || {
            eval(&[
                "--scenarios",
                &s,
                "--manifests",
                &m,
                "--repeat",
                "4",
                "--json",
            ])
        })
        .await
        .unwrap()
    };
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let r = result(&report, 0, "flaky");
    assert_eq!(
        (r["attempts"].as_u64(), r["passed"].as_u64()),
        (Some(4), Some(2)),
        "{r:#}"
    );
    let interval: Vec<f64> = serde_json::from_value(r["interval"].clone()).unwrap_or_default();
    assert!(
        (interval[0] - 0.15).abs() < 0.01 && (interval[1] - 0.85).abs() < 0.01,
        "Wilson 95% of 2/4: {interval:?}"
    );
    assert_eq!(report["targets"][0]["label"], "manifests");

    // The strong and the weak model side by side, as a table.
    flaky.store(0, Ordering::SeqCst);
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        eval(&[
            "--scenarios",
            &scenarios,
            "--manifests",
            &manifests,
            "--compare",
            "scripted/strong,default/oncall,scripted/weak",
            "--repeat",
            "2",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("scripted/strong")
            && header.contains("default/oncall")
            && header.contains("scripted/weak"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("flaky"))
        .unwrap_or_default();
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells[1..]
            .iter()
            .map(|c| c.split(' ').next().unwrap_or_default())
            .collect::<Vec<_>>(),
        vec!["1/2", "1/2", "0/2"],
        "{out}"
    );
    assert!(
        out.contains("scripted/weak (provider): 0/2 passed"),
        "{out}"
    );
    assert!(out.contains("✗ did not call get_logs (2×)"), "{out}");
}

/// A session of a real server becomes a scenario (its tool calls and results recorded,
/// redacted), which then passes with the same scripted model once a fact is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_record_turns_a_session_into_a_scenario_that_passes() {
    let (llm, s) = mock().await;
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    *s.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(move |body: &Value| script(body, &f)));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &llm);
    let server = Server::start(&dir.path().join("config"), &dir.path().join("k.db"), &[]);
    let id = open_session(&server, json!({"name": "incident-checkout"})).await;
    // A question with an API-key-looking string in it: recorded redacted.
    let events = ask(&server, &id, "Has checkout crashed like this before? Our token is sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c").await;
    assert!(
        events.iter().any(|e| e.event == "tool.end"),
        "the session called a tool"
    );

    let out_dir = dir.path().join("recorded");
    let (server_url, out) = (server.url(""), out_dir.display().to_string());
    let recorded = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "eval",
                "record",
                &id,
                "--server",
                server_url.trim_end_matches('/'),
                "--out",
                &out,
                "--name",
                "checkout-before",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let scenario_dir = out_dir.join("checkout-before");
    let yaml = std::fs::read_to_string(scenario_dir.join("scenario.yaml")).unwrap_or_default();
    assert!(yaml.contains("tools: [\"get_incident_history\"]"), "{yaml}");
    assert!(yaml.contains("noProposal: true"), "{yaml}");
    assert!(
        !yaml.contains("sk-live-4f9a8b7c"),
        "the question is redacted: {yaml}"
    );
    let recordings: Value = serde_json::from_str(
        &std::fs::read_to_string(scenario_dir.join("tools/recorded.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    assert_eq!(
        recordings[0]["tool"], "get_incident_history",
        "{recordings:#}"
    );
    assert_eq!(
        recordings[0]["args"],
        json!({"query": "checkout crash", "limit": 5})
    );
    assert!(server.terminate().success());

    // With the fact a person writes, it passes.
    std::fs::write(
        scenario_dir.join("scenario.yaml"),
        yaml.replace("facts: []", "facts: [PAYMENT_URL]"),
    )
    .unwrap();
    let (scenarios, manifests) = (
        scenario_dir.display().to_string(),
        dir.path().join("config").display().to_string(),
    );
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        eval(&[
            "--scenarios",
            &scenarios,
            "--manifests",
            &manifests,
            "--provider",
            "scripted",
            "--json",
            "--min-pass-rate",
            "1",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(
        result(&report, 0, "checkout-before")["passed"],
        1,
        "{report:#}"
    );
}

/// A concrete argument from a recording's pattern: the first alternative, without `*`.
fn concrete(pattern: &Value) -> Value {
    match pattern {
        Value::String(s) => json!(s.split('|').next().unwrap_or_default().replace('*', "")),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), concrete(v))).collect())
        }
        v => v.clone(),
    }
}

/// Every starter scenario can be passed: a scripted investigator that calls each expected
/// tool (with arguments its recordings answer), makes the expected proposals and states the
/// scenario's own description and rubric passes all 21 — so the recordings answer the calls
/// they are meant for, and the facts and forbidden claims agree with the scenario's story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_starter_scenario_can_be_passed() {
    use kortex::eval::scenario::Scenario;
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evals");
    let scenarios: Vec<Scenario> = Scenario::load_all(&suite).unwrap();
    let (llm, s) = mock().await;
    *s.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(move |body: &Value| {
        let d = openai();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let question = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let scenario = scenarios.iter().find(|s| s.question == question)?;
        let steps = messages.iter().filter(|m| m["role"] == "assistant").count();
        let proposals: Vec<(String, Value)> = scenario
            .expect
            .proposals
            .iter()
            .filter(|p| p.make)
            .map(|p| {
                let t = p.target.clone().unwrap_or_default();
                let target = json!({"apiVersion": "apps/v1", "kind": t.kind.unwrap_or_else(|| "Deployment".into()),
                    "namespace": t.namespace.or_else(|| scenario.namespace.clone()).unwrap_or_default(), "name": t.name.unwrap_or_default()});
                ("propose_action".to_owned(), json!({"action": p.action.clone().unwrap_or_else(|| "restart".into()), "target": target, "rationale": "the mitigation"}))
            })
            .collect();
        let calls: Vec<(String, Value)> = match steps {
            0 => scenario
                .expect
                .tools
                .iter()
                .map(|t| {
                    let r = scenario
                        .recordings
                        .iter()
                        .find(|r| &r.tool == t)
                        .unwrap_or_else(|| panic!("{t}"));
                    (t.clone(), concrete(&Value::Object(r.args.clone())))
                })
                .collect(),
            1 => proposals,
            _ => Vec::new(),
        };
        if calls.is_empty() {
            let text = format!(
                "{}\n\n{}",
                scenario.description,
                scenario
                    .judge
                    .as_ref()
                    .map(|j| j.rubric.as_str())
                    .unwrap_or_default()
            );
            return Some(streamed(&d, (d.text_stream)(&[&text])));
        }
        let ids: Vec<String> = (0..calls.len())
            .map(|i| format!("call_{steps}_{i}"))
            .collect();
        let args: Vec<String> = calls.iter().map(|(_, a)| a.to_string()).collect();
        let scripted: Vec<(&str, &str, &str)> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (ids[i].as_str(), name.as_str(), args[i].as_str()))
            .collect();
        Some(streamed(&d, (d.tools_stream)(&scripted)))
    }));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &llm);
    let (suite, manifests) = (
        suite.display().to_string(),
        dir.path().join("config").display().to_string(),
    );
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        eval(&[
            "--scenarios",
            &suite,
            "--manifests",
            &manifests,
            "--provider",
            "scripted",
            "--parallel",
            "4",
            "--json",
            "--min-pass-rate",
            "100%",
        ])
    })
    .await
    .unwrap();
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let failed: Vec<String> = report["targets"][0]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["passed"] == 0)
        .map(|r| format!("{}: {}", r["name"], r["failures"][0]["reasons"]))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(code, 0, "{err}");
    assert!(report["targets"][0]["attempts"].as_u64() >= Some(20));
}

/// `--judge`: the rubric is graded only after the deterministic checks pass, and a failing
/// verdict fails the scenario with the judge's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_grades_the_rubric_once_the_checks_pass() {
    let (llm, s) = mock().await;
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    *s.responder.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(move |body: &Value| script(body, &f)));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &llm);
    let logs = r#"[{"tool": "get_logs", "args": {}, "result": "fatal: missing required config key PAYMENT_URL"}]"#;
    for (name, question) in [
        ("fixed", "Why is checkout crash-looping in shop?"),
        ("no-fix", "Is checkout flaky?"),
    ] {
        let d = dir.path().join("suite").join(name);
        write(
            &d.join("scenario.yaml"),
            &format!(
                "apiVersion: kortex.dev/eval/v1\nkind: Scenario\nquestion: {question:?}\nexpect:\n  facts: [PAYMENT_URL]\n  tools: [get_logs]\njudge:\n  rubric: Names the missing key and how to fix it.\n"
            ),
        );
        write(&d.join("tools/logs.json"), logs);
    }
    let (suite, manifests) = (
        dir.path().join("suite").display().to_string(),
        dir.path().join("config").display().to_string(),
    );
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        eval(&[
            "--scenarios",
            &suite,
            "--manifests",
            &manifests,
            "--provider",
            "scripted",
            "--judge",
            "scripted/strong",
            "--json",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["judged"], true);
    let fixed = result(&report, 0, "fixed");
    assert_eq!(fixed["passed"], 1, "{fixed:#}");
    assert_eq!(fixed["judged"][0]["pass"], true, "{fixed:#}");
    // The flaky script states the fact every other time; the first time it does, without a fix.
    let r = reasons(result(&report, 0, "no-fix"));
    assert_eq!(
        r,
        vec!["judge scripted/strong: names no fix".to_owned()],
        "{report:#}"
    );
}
