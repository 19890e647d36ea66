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
    /// Chat API key (not needed on a loopback server without credentials). Default: the
    /// token `kortex login` kept for this server.
    #[arg(long, env = "KORTEX_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

impl ServerArgs {
    /// The bearer credential to send: `--key`, else what `kortex login` kept for the server.
    pub fn credential(&self) -> Option<String> {
        self.key
            .clone()
            .or_else(|| super::login::stored_token(&self.server))
    }
}

/// `kortex chat` options.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Session name or id: yours, or one shared with you (joined); a new session of that
    /// name otherwise (policies match on it).
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
    /// Ask for the inverse of an executed proposal: a new proposal, decided as usual
    /// (`kortex serve`; in a cluster, `kubectl kortex undo`).
    Undo(UndoArgs),
}

/// Undo options.
#[derive(Args, Debug)]
pub struct UndoArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Id of the executed proposal (`kortex proposals list` shows it).
    pub id: String,
}

/// `kortex erase-user` options.
#[derive(Args, Debug)]
pub struct EraseUserArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The user to erase, exactly as Kortex knows them (a chat key's user, a Kubernetes
    /// user name, an authenticating proxy's user).
    pub name: String,
}

/// `kortex erase-user`: one line per table touched, then the pseudonym; a second erasure
/// of the same name says there was nothing left.
pub async fn erase_user(args: EraseUserArgs) -> Result<(), String> {
    let api = Api::new(&args.server);
    // The name as one path segment, percent-encoded (`system:serviceaccount:ns:sa`,
    // `alice@example.com`, a name with a space).
    let mut url = reqwest::Url::parse("http://kortex/api/v1/users/")
        .map_err(|e| format!("cannot build the request: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| "cannot build the request".to_owned())?
        .pop_if_empty()
        .push(&args.name);
    let path = url.path().to_owned();
    let report = api
        .json(api.request(reqwest::Method::DELETE, &path))
        .await?;
    print!("{}", erasure_report(&report));
    Ok(())
}

/// What `kortex erase-user` prints.
pub fn erasure_report(report: &Value) -> String {
    let pseudonym = report["user"].as_str().unwrap_or("-");
    if report["erased"] != json!(true) {
        return format!(
            "nothing named this user any more (already erased?); pseudonym {pseudonym}\n"
        );
    }
    let mut out = String::from("deleted:\n");
    let counts = |v: &Value| -> Vec<(String, u64)> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, n)| n.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n)))
            .collect()
    };
    for (table, n) in counts(&report["deleted"]) {
        out.push_str(&format!("  {table:<16} {n:>8}\n"));
    }
    if let Some(n) = report["deletedOther"].as_u64().filter(|n| *n > 0) {
        out.push_str(&format!("  {:<16} {n:>8}\n", "other"));
    }
    out.push_str(&format!("pseudonymised (now {pseudonym}):\n"));
    for (table, n) in counts(&report["pseudonymised"]) {
        out.push_str(&format!("  {table:<16} {n:>8}\n"));
    }
    out
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

pub(crate) struct Api {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Api {
    pub(crate) fn new(args: &ServerArgs) -> Self {
        Self {
            base: args.server.trim_end_matches('/').to_owned(),
            key: args.credential(),
            http: reqwest::Client::new(),
        }
    }

    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
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

    pub(crate) async fn json(&self, r: reqwest::RequestBuilder) -> Result<Value, String> {
        self.send(r)
            .await?
            .json()
            .await
            .map_err(|e| format!("unexpected answer: {e}"))
    }
}

/// `kortex chat`.
// Long because the interactive loop: one arm per slash command and per event kind printed.
pub async fn chat(args: ChatArgs) -> Result<(), String> {
    let api = Api::new(&args.server);
    let sessions = api
        .json(api.request(reqwest::Method::GET, "/chat/v1/sessions"))
        .await?;
    let find = |list: &Value| {
        list["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|s| s["id"] == args.session.as_str() || s["name"] == args.session.as_str())
                .cloned()
        })
    };
    let mut existing = find(&sessions);
    // A session someone shared with you (by its id or name) is joined.
    if existing.is_none() {
        let shared = api
            .json(api.request(reqwest::Method::GET, "/chat/v1/sessions?shared=true"))
            .await?;
        existing = find(&shared);
        if let Some(s) = &existing {
            eprintln!(
                "joining {}'s session ({} access)",
                s["user"].as_str().unwrap_or("someone"),
                s["access"].as_str().unwrap_or("read")
            );
        }
    }
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
        "session {} (policy {}, namespace {}). During a run: /pause, /redirect TEXT, /cancel. \
         Then: /resume, /plan approve [STEP...], /plan reject. /quit leaves.",
        args.session,
        session["policy"].as_str().unwrap_or("-"),
        session["namespace"].as_str().unwrap_or("-")
    );
    // Lines are read on their own thread, so commands can be typed while a run streams.
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The latest run (to steer) and the last event seen (to follow it again after a resume).
    let mut run: Option<String> = None;
    let mut seen = 0_i64;
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.recv().await else {
            return Ok(());
        };
        let line = line.trim().to_owned();
        let cancel = || {
            api.send(api.request(
                reqwest::Method::POST,
                &format!("/chat/v1/sessions/{id}/cancel"),
            ))
        };
        let stream = match line.as_str() {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/cancel" => {
                report(cancel().await, "cancelled");
                continue;
            }
            command if command.starts_with('/') => {
                let Some(run) = &run else {
                    eprintln!("no run to steer yet: ask something first");
                    continue;
                };
                match steer(&api, &id, run, command).await {
                    // Resumed or approved: follow the run again from where it stopped.
                    Ok(true) => {
                        api.send(api.request(
                            reqwest::Method::GET,
                            &format!("/chat/v1/sessions/{id}/events?after={seen}"),
                        ))
                        .await
                    }
                    Ok(false) => continue,
                    Err(e) => {
                        eprintln!("{e}");
                        continue;
                    }
                }
            }
            question => {
                let request = api
                    .request(
                        reqwest::Method::POST,
                        &format!("/chat/v1/sessions/{id}/messages"),
                    )
                    .header("accept", "text/event-stream")
                    .json(&json!({"content": question}));
                api.send(request).await
            }
        };
        let resp = match stream {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        if let Some(r) = resp
            .headers()
            .get("x-kortex-run-id")
            .and_then(|v| v.to_str().ok())
        {
            run = Some(r.to_owned());
        }
        // While the run streams, typed lines steer it.
        let mut rendering = tokio::spawn(render(resp));
        let followed = loop {
            tokio::select! {
                done = &mut rendering => break done.unwrap_or_default(),
                Some(typed) = lines.recv() => {
                    let typed = typed.trim();
                    match (typed, &run) {
                        ("", _) => {}
                        ("/cancel", _) => report(cancel().await, "cancelling"),
                        (l, Some(r)) if l.starts_with("/pause") || l.starts_with("/redirect") => {
                            if let Err(e) = steer(&api, &id, r, l).await {
                                eprintln!("{e}");
                            }
                        }
                        _ => eprintln!("a run is in progress: /pause, /redirect TEXT or /cancel"),
                    }
                }
            }
        };
        if let Some(r) = followed.run {
            run = Some(r);
        }
        seen = seen.max(followed.last_seq);
    }
}

/// Says how a control went.
fn report(result: Result<reqwest::Response, String>, done: &str) {
    match result {
        Ok(_) => eprintln!("{done}"),
        Err(e) => eprintln!("{e}"),
    }
}

/// Carries out a steering command on `run`; `Ok(true)` when the run goes on (follow it).
async fn steer(api: &Api, session: &str, run: &str, command: &str) -> Result<bool, String> {
    let (verb, rest) = command.split_once(' ').unwrap_or((command, ""));
    let rest = rest.trim();
    let mut words = rest.split_whitespace();
    let (path, body, goes_on) = match (verb, words.next()) {
        ("/pause", None) => ("pause", json!({}), false),
        ("/resume", None) => ("resume", json!({}), true),
        ("/redirect", Some(_)) => ("redirect", json!({"message": rest}), false),
        ("/plan", Some("reject")) => ("plan/reject", json!({}), false),
        ("/plan", Some("approve")) => {
            let steps: Vec<&str> = words.collect();
            let body = if steps.is_empty() {
                json!({})
            } else {
                json!({"steps": steps})
            };
            ("plan/approve", body, true)
        }
        _ => {
            return Err("commands: /pause, /resume, /redirect TEXT, /plan approve [STEP...], /plan reject, /cancel, /quit".to_owned());
        }
    };
    let answer = api
        .json(
            api.request(
                reqwest::Method::POST,
                &format!("/chat/v1/sessions/{session}/runs/{run}/{path}"),
            )
            .json(&body),
        )
        .await?;
    eprintln!("run {}", answer["state"].as_str().unwrap_or("?"));
    Ok(goes_on)
}

/// What following a run's events showed.
#[derive(Default)]
struct Followed {
    /// The run the events were about.
    run: Option<String>,
    /// The last event's sequence number.
    last_seq: i64,
}

/// Prints a run's events: text as it streams, tool calls and results on one line each.
async fn render(resp: reqwest::Response) -> Followed {
    let mut body = resp.bytes_stream();
    let mut decoder = SseDecoder::default();
    let mut at_line_start = true;
    let mut followed = Followed::default();
    while let Some(Ok(bytes)) = body.next().await {
        for e in decoder.push(&bytes) {
            let data: Value = serde_json::from_str(&e.data).unwrap_or_default();
            if let Ok(seq) = e.id.parse::<i64>() {
                followed.last_seq = followed.last_seq.max(seq);
            }
            if let Some(run) = data["runId"].as_str() {
                followed.run = Some(run.to_owned());
            }
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
                "plan.proposal" => {
                    let steps: Vec<String> = data["steps"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|s| {
                            format!(
                                "    {}. {} ({})",
                                s["id"].as_str().unwrap_or_default(),
                                s["purpose"].as_str().unwrap_or_default(),
                                s["tool"].as_str().unwrap_or_default()
                            )
                        })
                        .collect();
                    note(format!("☰ plan ({}):\n{}", text("mode"), steps.join("\n")));
                }
                "run.lifecycle" => match text("state").as_str() {
                    "requires_action" => {
                        note("⏸ the model called a client-executed tool; this terminal cannot run it (post its result to /tool-results, or /cancel)".into());
                        return followed;
                    }
                    "paused" => {
                        note(
                            "⏸ paused: /resume, /redirect TEXT (taken in on resume) or /cancel"
                                .into(),
                        );
                        return followed;
                    }
                    "awaiting_plan" => {
                        note(
                            "⏸ waiting for the plan: /plan approve [STEP...] or /plan reject"
                                .into(),
                        );
                        return followed;
                    }
                    "pausing" => note("… pausing at the next step".into()),
                    "redirecting" => note("↪ redirect kept for the next step".into()),
                    "completed" | "failed" | "cancelled" => {
                        if !at_line_start {
                            println!();
                        }
                        return followed;
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    followed
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
        ProposalsCommand::Undo(args) => {
            let api = Api::new(&args.server);
            let p = api
                .json(api.request(
                    reqwest::Method::POST,
                    &format!("/chat/v1/proposals/{}/undo", args.id),
                ))
                .await?;
            println!(
                "{} ({}) {}: {} {}",
                p["name"].as_str().unwrap_or_default(),
                p["id"].as_str().unwrap_or_default(),
                p["status"]["phase"].as_str().unwrap_or_default(),
                p["spec"]["action"].as_str().unwrap_or_default(),
                p["spec"]["rationale"].as_str().unwrap_or_default()
            );
            Ok(())
        }
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
    let total = crate::store::usage_total(rows);
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
