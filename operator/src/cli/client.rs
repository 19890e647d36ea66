//! `kortex chat` and `kortex proposals`: terminal clients of the HTTP API.

use crate::llm::SseDecoder;
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::io::{BufRead, Write};

/// Where the server is and who we are.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Kortex server URL.
    #[arg(long, env = "KORTEX_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Chat API key (not needed on a loopback server without credentials).
    #[arg(long, env = "KORTEX_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

/// `kortex chat` options.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Session name (reused if you have one by that name; policies match on it).
    #[arg(long, default_value = "chat")]
    pub session: String,
    /// Namespace of a new session.
    #[arg(long)]
    pub namespace: Option<String>,
}

/// `kortex proposals` subcommands.
#[derive(Subcommand, Debug)]
pub enum ProposalsCommand {
    /// List proposals (newest first).
    List {
        /// Server.
        #[command(flatten)]
        server: ServerArgs,
        /// Only this phase (Pending, Approved, ...).
        #[arg(long)]
        phase: Option<String>,
    },
    /// Approve a proposal.
    Approve(DecideArgs),
    /// Reject a proposal.
    Reject(DecideArgs),
}

/// `kortex usage` options.
#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// First UTC day: `2026-11-01`, an RFC 3339 time, or a look-back such as `7d`.
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Group rows by provider, model, user, policy or day.
    #[arg(long, default_value = "day", value_parser = ["provider", "model", "user", "policy", "day"])]
    pub by: String,
}

/// Approve/reject options.
#[derive(Args, Debug)]
pub struct DecideArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Proposal id (`kortex proposals list` shows it).
    pub id: String,
    /// Why.
    #[arg(long)]
    pub reason: Option<String>,
}

struct Api {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Api {
    fn new(args: &ServerArgs) -> Self {
        Self {
            base: args.server.trim_end_matches('/').to_owned(),
            key: args.key.clone(),
            http: reqwest::Client::new(),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, String> {
        let resp = r
            .send()
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.base))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or("no details");
        let code = body["error"]["code"].as_str().unwrap_or("error");
        Err(format!("{status} {code}: {message}"))
    }

    async fn json(&self, r: reqwest::RequestBuilder) -> Result<Value, String> {
        self.send(r)
            .await?
            .json()
            .await
            .map_err(|e| format!("unexpected answer: {e}"))
    }
}

/// `kortex chat`.
pub async fn chat(args: ChatArgs) -> Result<(), String> {
    let api = Api::new(&args.server);
    let sessions = api
        .json(api.request(reqwest::Method::GET, "/chat/v1/sessions"))
        .await?;
    let existing = sessions["items"].as_array().and_then(|items| {
        items
            .iter()
            .find(|s| s["name"] == args.session.as_str())
            .cloned()
    });
    let session = match existing {
        Some(s) => s,
        None => {
            let mut body = json!({"name": args.session});
            if let Some(ns) = &args.namespace {
                body["namespace"] = json!(ns);
            }
            api.json(
                api.request(reqwest::Method::POST, "/chat/v1/sessions")
                    .json(&body),
            )
            .await?
        }
    };
    let id = session["id"].as_str().unwrap_or_default().to_owned();
    eprintln!(
        "session {} (policy {}, namespace {}). /cancel stops a run, /quit leaves.",
        args.session,
        session["policy"].as_str().unwrap_or("-"),
        session["namespace"].as_str().unwrap_or("-")
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(());
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/cancel" => {
                match api
                    .send(api.request(
                        reqwest::Method::POST,
                        &format!("/chat/v1/sessions/{id}/cancel"),
                    ))
                    .await
                {
                    Ok(_) => eprintln!("cancelled"),
                    Err(e) => eprintln!("{e}"),
                }
                continue;
            }
            _ => {}
        }
        let request = api
            .request(
                reqwest::Method::POST,
                &format!("/chat/v1/sessions/{id}/messages"),
            )
            .header("accept", "text/event-stream")
            .json(&json!({"content": line}));
        let resp = match api.send(request).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        render(resp).await;
    }
}

/// Prints a run's events: text as it streams, tool calls and results on one line each.
async fn render(resp: reqwest::Response) {
    let mut body = resp.bytes_stream();
    let mut decoder = SseDecoder::default();
    let mut at_line_start = true;
    while let Some(Ok(bytes)) = body.next().await {
        for e in decoder.push(&bytes) {
            let data: Value = serde_json::from_str(&e.data).unwrap_or_default();
            let text = |k: &str| data[k].as_str().unwrap_or_default().to_owned();
            let mut note = |line: String| {
                if !at_line_start {
                    println!();
                }
                println!("  {line}");
                at_line_start = true;
            };
            match e.event.as_str() {
                "text.delta" => {
                    let t = text("text");
                    print!("{t}");
                    at_line_start = t.ends_with('\n');
                    let _ = std::io::stdout().flush();
                }
                "tool.start" => note(format!("⚙ {} {}", text("name"), data["input"])),
                "tool.end" => {
                    let mark = if data["isError"] == true {
                        "✗"
                    } else {
                        "✓"
                    };
                    let preview: String = text("preview").chars().take(120).collect();
                    note(format!(
                        "{mark} {} ({} ms) {}",
                        text("name"),
                        data["durationMs"],
                        preview.replace('\n', " ")
                    ));
                }
                "notice" => note(format!("ℹ {}", text("message"))),
                "error" => note(format!("✗ {}: {}", text("code"), text("message"))),
                "proposal.created" => note(format!(
                    "⚑ proposal {} ({} {}/{}) awaits a decision: kortex proposals approve|reject {}",
                    text("name"),
                    text("action"),
                    data["target"]["kind"].as_str().unwrap_or("-"),
                    data["target"]["name"].as_str().unwrap_or("-"),
                    text("proposalId")
                )),
                "run.lifecycle" => match text("state").as_str() {
                    "requires_action" => {
                        note("⏸ the model called a client-executed tool; this terminal cannot run it (post its result to /tool-results, or /cancel)".into());
                        return;
                    }
                    "completed" | "failed" | "cancelled" => {
                        if !at_line_start {
                            println!();
                        }
                        return;
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
}

/// `kortex proposals ...`.
pub async fn proposals(command: ProposalsCommand) -> Result<(), String> {
    match command {
        ProposalsCommand::List { server, phase } => {
            let api = Api::new(&server);
            let path = match phase {
                Some(p) => format!("/chat/v1/proposals?phase={p}"),
                None => "/chat/v1/proposals".to_owned(),
            };
            let list = api.json(api.request(reqwest::Method::GET, &path)).await?;
            println!(
                "{:<38} {:<10} {:<8} {:<28} {:<12} EXPIRES",
                "ID", "PHASE", "ACTION", "TARGET", "SESSION"
            );
            for p in list["items"].as_array().into_iter().flatten() {
                let target = format!(
                    "{}/{}/{}",
                    p["spec"]["target"]["kind"].as_str().unwrap_or("-"),
                    p["namespace"].as_str().unwrap_or("-"),
                    p["spec"]["target"]["name"].as_str().unwrap_or("-")
                );
                println!(
                    "{:<38} {:<10} {:<8} {:<28} {:<12} {}",
                    p["id"].as_str().unwrap_or_default(),
                    p["status"]["phase"].as_str().unwrap_or_default(),
                    p["spec"]["action"].as_str().unwrap_or_default(),
                    target,
                    p["spec"]["session"]["name"].as_str().unwrap_or_default(),
                    p["status"]["expiresAt"].as_str().unwrap_or_default()
                );
            }
            Ok(())
        }
        ProposalsCommand::Approve(args) => decide(args, "approve").await,
        ProposalsCommand::Reject(args) => decide(args, "reject").await,
    }
}

async fn decide(args: DecideArgs, verb: &str) -> Result<(), String> {
    let api = Api::new(&args.server);
    let body = json!({"reason": args.reason});
    let p = api
        .json(
            api.request(
                reqwest::Method::POST,
                &format!("/chat/v1/proposals/{}/{verb}", args.id),
            )
            .json(&body),
        )
        .await?;
    println!(
        "{} {}: {}",
        p["name"].as_str().unwrap_or_default(),
        p["status"]["phase"].as_str().unwrap_or_default(),
        p["status"]["message"].as_str().unwrap_or_default()
    );
    Ok(())
}

/// `kortex usage`: the server's usage report as a table.
pub async fn usage(args: UsageArgs) -> Result<(), String> {
    let api = Api::new(&args.server);
    let report = api
        .json(api.request(
            reqwest::Method::GET,
            &format!(
                    "/api/v1/usage?{}",
                    url::form_urlencoded::Serializer::new(String::new())
                        .append_pair("since", &args.since)
                        .append_pair("by", &args.by)
                        .finish()
                ),
        ))
        .await?;
    let rows: Vec<crate::store::UsageRow> = serde_json::from_value(report["items"].clone())
        .map_err(|e| format!("unexpected answer: {e}"))?;
    print!("{}", usage_table(&args.by, &rows));
    eprintln!(
        "since {} (UTC days)",
        report["since"].as_str().unwrap_or_default()
    );
    Ok(())
}

/// The table `kortex usage` prints: one row per group and a total.
pub fn usage_table(by: &str, rows: &[crate::store::UsageRow]) -> String {
    let total = crate::http::usage_total(rows);
    let width = rows
        .iter()
        .map(|r| r.key.chars().count())
        .chain([by.len(), 5])
        .max()
        .unwrap_or(5);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>13}  {:>13}  {:>11}\n",
        by.to_ascii_uppercase(),
        "REQUESTS",
        "INPUT TOKENS",
        "OUTPUT TOKENS",
        "COST USD"
    );
    for r in rows.iter().chain(std::iter::once(&total)) {
        let key = if std::ptr::eq(r, &total) {
            "TOTAL"
        } else {
            r.key.as_str()
        };
        // `*`: some of these calls reported no usage, and Kortex estimated it.
        let requests = if r.estimated_requests > 0 {
            format!("{}*", r.requests)
        } else {
            r.requests.to_string()
        };
        out.push_str(&format!(
            "{key:<width$}  {requests:>9}  {:>13}  {:>13}  {:>11.4}\n",
            r.input_tokens, r.output_tokens, r.cost_usd
        ));
    }
    if total.estimated_requests > 0 {
        out.push_str(&format!(
            "* {} request(s) reported no token usage: their tokens are estimated from the text (about 4 characters a token) and charged to budgets\n",
            total.estimated_requests
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::usage_table;
    use crate::store::UsageRow;

    #[test]
    fn estimated_usage_is_marked_in_the_table() {
        let row = |key: &str, estimated_requests| UsageRow {
            key: key.into(),
            requests: 3,
            input_tokens: 100,
            output_tokens: 20,
            cost_usd: 0.0,
            estimated_requests,
        };
        let table = usage_table("provider", &[row("cloud", 0), row("llama", 2)]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].starts_with("cloud") && !lines[1].contains('*'),
            "{table}"
        );
        assert!(
            lines[2].starts_with("llama") && lines[2].contains("3*"),
            "{table}"
        );
        assert!(
            table.contains("* 2 request(s) reported no token usage"),
            "{table}"
        );
        let plain = usage_table("provider", &[row("cloud", 0)]);
        assert!(!plain.contains('*'), "{plain}");
    }
}
