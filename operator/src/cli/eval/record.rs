//! `kortex eval record SESSION_ID`: a session of a Kortex server turned into a recorded
//! scenario skeleton — its first question, each tool call's arguments and result as a
//! recording, the tools it called and the proposals it made as expectations — redacted
//! again (credentials and personal data) on the way. The facts the answer must state are
//! left for a person to write: the session's last answer is quoted to pick them from.

use crate::cli::client::{Api, ServerArgs};
use clap::Args;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Tools whose calls are not evidence: Kortex's own machinery.
const NOT_RECORDED: &[&str] = &[
    "propose_action",
    "read_result_chunk",
    "list_tool_guides",
    "get_tool_guide",
    "submit_plan",
];

/// `kortex eval record` options.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// The session's id (the dashboard's URL ends with it).
    pub session: String,
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Folder the scenario folder is written in.
    #[arg(long, value_name = "DIR", default_value = "evals")]
    pub out: PathBuf,
    /// The scenario's folder name (default: the session's name).
    #[arg(long)]
    pub name: Option<String>,
}

fn clean(text: &str) -> String {
    crate::redact::patterns::redact(text, true, true)
        .0
        .unwrap_or_else(|| text.to_owned())
}

fn clean_value(v: &mut Value) {
    match v {
        Value::String(s) => *s = clean(s),
        Value::Array(items) => items.iter_mut().for_each(clean_value),
        Value::Object(map) => map.values_mut().for_each(clean_value),
        _ => {}
    }
}

/// A YAML scalar: JSON's string syntax is YAML's double-quoted one.
fn quoted(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The scenario written from a session's JSON (`GET /chat/v1/sessions/{id}`):
/// `(scenario.yaml, tools/recorded.json)`.
// Long because one pass over a session's messages writing the scenario's YAML line by line.
pub fn scenario_from(session: &Value) -> Result<(String, Value), String> {
    let messages = session["messages"].as_array().cloned().unwrap_or_default();
    let question = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .ok_or("the session has no question")?;
    let results: std::collections::HashMap<&str, &Value> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| Some((m["toolCallId"].as_str()?, m)))
        .collect();
    let mut recordings = Vec::new();
    let mut tools: Vec<String> = Vec::new();
    let mut proposals = Vec::new();
    for call in messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["toolCalls"].as_array().cloned().unwrap_or_default())
    {
        let name = call["name"].as_str().unwrap_or_default().to_owned();
        let mut input = call["input"].clone();
        clean_value(&mut input);
        if name == "propose_action" {
            proposals.push(input);
            continue;
        }
        if NOT_RECORDED.contains(&name.as_str()) {
            continue;
        }
        let Some(result) = call["id"].as_str().and_then(|id| results.get(id)) else {
            continue;
        };
        let text = clean(result["content"].as_str().unwrap_or_default());
        let value = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        let mut r = json!({"tool": name, "args": input, "result": value});
        if result["isError"] == true {
            r["isError"] = json!(true);
        }
        recordings.push(r);
        if !tools.contains(&name) {
            tools.push(name);
        }
    }
    if recordings.is_empty() {
        return Err(
            "the session called no tool with a result: there is no evidence to record".into(),
        );
    }
    let answer = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant" && m["content"].as_str().is_some_and(|c| !c.is_empty()))
        .and_then(|m| m["content"].as_str())
        .map(clean)
        .unwrap_or_default();
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Recorded by `kortex eval record` from session {} ({}).",
        session["id"].as_str().unwrap_or("?"),
        session["name"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        y,
        "# Write the facts a good answer states under expect.facts, then run it:"
    );
    let _ = writeln!(
        y,
        "#   kortex eval --scenarios <this folder> --manifests <your config>"
    );
    let _ = writeln!(y, "apiVersion: {}", super::scenario::FORMAT);
    let _ = writeln!(y, "kind: Scenario");
    let _ = writeln!(
        y,
        "description: {}",
        quoted(
            session["title"]
                .as_str()
                .unwrap_or("Recorded from a session; describe the incident and its cause.")
        )
    );
    let _ = writeln!(y, "question: {}", quoted(&clean(question)));
    let _ = writeln!(y, "expect:");
    let _ = writeln!(
        y,
        "  facts: []   # e.g. - [\"OOMKilled\", \"re:out of memory\"]"
    );
    let _ = writeln!(
        y,
        "  tools: [{}]",
        tools
            .iter()
            .map(|t| quoted(t))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if proposals.is_empty() {
        let _ = writeln!(y, "  noProposal: true");
    } else {
        let _ = writeln!(y, "  proposals:");
        for p in &proposals {
            let t = &p["target"];
            let _ = writeln!(
                y,
                "    - {{action: {}, target: {{kind: {}, name: {}, namespace: {}}}}}",
                quoted(p["action"].as_str().unwrap_or("?")),
                quoted(t["kind"].as_str().unwrap_or("?")),
                quoted(t["name"].as_str().unwrap_or("?")),
                quoted(t["namespace"].as_str().unwrap_or("?")),
            );
        }
    }
    if !answer.is_empty() {
        let _ = writeln!(y, "# The session's last answer, to pick facts from:");
        for line in answer.lines() {
            let _ = writeln!(y, "#   {line}");
        }
    }
    Ok((y, Value::Array(recordings)))
}

/// `kortex eval record`.
pub async fn run(args: RecordArgs) -> Result<(), String> {
    let api = Api::new(&args.server);
    let session = api
        .json(api.request(
            reqwest::Method::GET,
            &format!(
                "/chat/v1/sessions/{}",
                url::form_urlencoded::byte_serialize(args.session.as_bytes()).collect::<String>()
            ),
        ))
        .await?;
    let (yaml, recordings) = scenario_from(&session)?;
    let name = args
        .name
        .clone()
        .or_else(|| session["name"].as_str().map(str::to_owned))
        .unwrap_or_else(|| args.session.clone());
    let dir = args.out.join(&name);
    if dir.join("scenario.yaml").exists() {
        return Err(format!(
            "{} exists; pass --name or remove it",
            dir.join("scenario.yaml").display()
        ));
    }
    std::fs::create_dir_all(dir.join("tools")).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("scenario.yaml"), yaml)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(&recordings).unwrap_or_default();
    std::fs::write(dir.join("tools").join("recorded.json"), json + "\n")
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "wrote {} ({} recordings); add the facts the answer must state to its scenario.yaml",
        dir.display(),
        recordings.as_array().map_or(0, Vec::len)
    );
    Ok(())
}
