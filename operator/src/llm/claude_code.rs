//! `claude-code`: the Claude Code CLI, run headless with the team's own credentials.
//!
//! Every call is one `claude -p` process, stateless: the conversation so far is written to
//! its standard input (`--input-format stream-json`), its `stream-json` output is read line
//! by line. Its tools are only Kortex's: a chat run hands the call an [`McpBridge`] (this
//! replica's `/mcp`, with a credential that lives as long as the run), and the CLI is
//! given no built-in tool at all (`--tools ""`), an allow-list of `mcp__kortex`,
//! `--permission-mode dontAsk` (anything else is refused, never asked), a settings file
//! that denies the built-ins by name as well, no filesystem settings, skills, hooks or
//! other MCP servers, and an empty `HOME` of its own. Its environment is built from
//! nothing: `PATH`, proxy and CA variables, telemetry off, and the credential. It runs in a
//! process group of its own, killed whole with the `HOME` removed whenever the call ends
//! (answered, failed, timed out, or its stream dropped); what a replica killed outright
//! left, [`sweep`] clears at the next start.
//!
//! The tool calls themselves are carried out by the run that owns the credential
//! ([`crate::chat`]): audited, redacted and bound by the policy as any other call. What
//! this adapter yields is text, warnings (a built-in tool the model asked for and did not
//! get) and the end with the usage the CLI reports.

use super::{
    ChatRequest, ChatResponse, ChatStream, ErrorKind, LlmError, LlmFuture, LlmProvider, Message,
    ProviderConfig, StopReason, StreamEvent, Usage,
};
use crate::catalog::SecretValue;
use crate::crd::ClaudeCodeAuth;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The MCP server name Claude Code knows Kortex by: its tools are `mcp__kortex__<name>`.
pub const SERVER: &str = "kortex";
/// The oldest CLI with every flag Kortex passes (`--tools`, `--json-schema`,
/// `--disable-slash-commands`, `--setting-sources`).
pub const MIN_VERSION: (u32, u32, u32) = (2, 1, 0);
/// Claude Code's built-in tools, denied by name in the settings file as well (the
/// allow-list and `--tools ""` already leave them out; a future built-in is left out by
/// those too).
const BUILT_INS: &[&str] = &[
    "Agent",
    "Task",
    "Bash",
    "BashOutput",
    "KillShell",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "Glob",
    "Grep",
    "LS",
    "WebFetch",
    "WebSearch",
    "TodoWrite",
    "AskUserQuestion",
    "ExitPlanMode",
    "SlashCommand",
    "Skill",
];
/// How much of the CLI's standard error a failure quotes.
const STDERR_TAIL: usize = 2000;
/// A call's `HOME` in the temporary directory: this, then an id.
const HOME_PREFIX: &str = "kortex-claude-";
/// In a call's `HOME`: the file the replica holds locked while the call lasts, holding the
/// CLI's process group.
const LOCK: &str = "kortex.lock";
/// A `HOME` this young with no process group recorded may be one being made.
const YOUNG: Duration = Duration::from_secs(60);

/// Where a chat run's Claude Code finds Kortex's tools.
#[derive(Clone, Debug, PartialEq)]
pub struct McpBridge {
    /// This replica's `/mcp` URL.
    pub url: String,
    /// The run's own credential (valid while the run lasts).
    pub token: SecretValue,
}

/// The `claude-code` adapter.
pub struct ClaudeCode {
    config: ProviderConfig,
    command: String,
    auth: Option<(ClaudeCodeAuth, SecretValue)>,
    /// `spec.baseUrl`, passed as `ANTHROPIC_BASE_URL` (only when set).
    base_url: Option<String>,
    max_turns: Option<u32>,
}

impl ClaudeCode {
    /// From the provider's settings.
    pub fn new(
        config: ProviderConfig,
        command: String,
        auth: Option<(ClaudeCodeAuth, SecretValue)>,
        base_url: Option<String>,
        max_turns: Option<u32>,
    ) -> Self {
        Self {
            config,
            command,
            auth,
            base_url,
            max_turns,
        }
    }

    fn error(&self, kind: ErrorKind, message: impl Into<String>) -> LlmError {
        LlmError::new(kind, &self.config.name, message)
    }

    /// The process for one call, in its own `HOME`.
    fn command(&self, args: &[String], home: &HomeDir) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.command);
        cmd.args(args)
            .env_clear()
            .current_dir(&home.path)
            .env("HOME", &home.path)
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so that all it started is killed with it (see `Process`).
            .process_group(0)
            .kill_on_drop(true);
        for var in [
            "PATH",
            "TMPDIR",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "NO_PROXY",
            "no_proxy",
            "NODE_EXTRA_CA_CERTS",
            "SSL_CERT_FILE",
        ] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        if let Some(url) = &self.base_url {
            cmd.env("ANTHROPIC_BASE_URL", url);
        }
        match &self.auth {
            Some((ClaudeCodeAuth::OauthToken, token)) => {
                cmd.env("CLAUDE_CODE_OAUTH_TOKEN", token.expose());
            }
            Some((ClaudeCodeAuth::ApiKey, key)) => {
                cmd.env("ANTHROPIC_API_KEY", key.expose());
            }
            None => {}
        }
        cmd
    }

    /// The arguments of one call; `mcp_config`: the file naming Kortex's `/mcp` (with the
    /// run's credential, which never goes on a command line).
    fn args(
        &self,
        request: &ChatRequest,
        mcp_config: Option<&std::path::Path>,
    ) -> Result<Vec<String>, LlmError> {
        let mut args: Vec<String> = [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--no-session-persistence",
            "--disable-slash-commands",
            "--strict-mcp-config",
            "--setting-sources",
            "",
            "--tools",
            "",
            "--permission-mode",
            "dontAsk",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let model = if request.model.is_empty() {
            self.config.default_model.clone().unwrap_or_default()
        } else {
            request.model.clone()
        };
        if !model.is_empty() {
            args.extend(["--model".to_owned(), model]);
        }
        let mut system = request.system.clone().unwrap_or_default();
        if let Some(format) = &request.response_format {
            match format["type"].as_str() {
                Some("json_schema") => {
                    let schema = &format["json_schema"]["schema"];
                    if schema["type"] != "object" {
                        return Err(self.error(
                            ErrorKind::BadRequest,
                            "claude-code takes structured output only for an object schema (\"type\": \"object\")",
                        ));
                    }
                    args.extend(["--json-schema".to_owned(), schema.to_string()]);
                }
                Some("json_object") => {
                    system
                        .push_str("\n\nReply with only a JSON object (no prose, no code fences).");
                }
                _ => {}
            }
        }
        if !system.trim().is_empty() {
            args.extend(["--system-prompt".to_owned(), system]);
        }
        let mut settings = json!({
            "permissions": {"allow": [], "deny": BUILT_INS, "defaultMode": "dontAsk"},
            "disableAllHooks": true,
            "enableAllProjectMcpServers": false,
        });
        match mcp_config {
            Some(config) => {
                args.extend([
                    "--mcp-config".to_owned(),
                    config.to_string_lossy().into_owned(),
                ]);
                args.extend(["--allowedTools".to_owned(), format!("mcp__{SERVER}")]);
                settings["permissions"]["allow"] = json!([format!("mcp__{SERVER}")]);
                let turns = self
                    .max_turns
                    .unwrap_or(u32::MAX)
                    .min(request.max_turns.unwrap_or(u32::MAX));
                if turns != u32::MAX {
                    args.extend(["--max-turns".to_owned(), turns.to_string()]);
                }
            }
            // One answer; structured output takes a turn more (its StructuredOutput call).
            None => {
                let turns = if request.response_format.is_some() {
                    "3"
                } else {
                    "1"
                };
                args.extend(["--max-turns".to_owned(), turns.to_owned()]);
            }
        }
        args.extend(["--settings".to_owned(), settings.to_string()]);
        Ok(args)
    }

    /// Runs one call: the process's events, text as it comes.
    // Long because the process's set-up (home, MCP bridge config, arguments, environment) and its event
    // stream, each step depending on the one before.
    async fn run(&self, request: &ChatRequest) -> Result<ChatStream, LlmError> {
        let home = HomeDir::new().map_err(|e| {
            self.error(
                ErrorKind::Config,
                format!("cannot make a home directory for Claude Code: {e}"),
            )
        })?;
        let mcp_config = match &request.mcp {
            Some(bridge) => {
                let config = json!({"mcpServers": {SERVER: {
                    "type": "http",
                    "url": bridge.url,
                    "headers": {"Authorization": format!("Bearer {}", bridge.token.expose())},
                }}});
                let path = home.path.join("kortex-mcp.json");
                write_private(&path, config.to_string().as_bytes()).map_err(|e| {
                    self.error(
                        ErrorKind::Config,
                        format!("cannot write the MCP configuration: {e}"),
                    )
                })?;
                Some(path)
            }
            None => None,
        };
        let args = self.args(request, mcp_config.as_deref())?;
        let mut cmd = self.command(&args, &home);
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                self.error(
                    ErrorKind::Config,
                    format!(
                        "Claude Code is not installed: no {:?} on PATH (install @anthropic-ai/claude-code, or set spec.command)",
                        self.command
                    ),
                )
            } else {
                self.error(ErrorKind::Config, format!("cannot start {}: {e}", self.command))
            }
        })?;
        // From here every way out (an error below, the stream's end or drop) kills it.
        let mut process = Process::new(child, home);
        let input = json!({"type": "user", "message": {"role": "user", "content": prompt(&request.messages)}});
        if let Some(mut stdin) = process.child.stdin.take() {
            let line = format!("{input}\n");
            stdin.write_all(line.as_bytes()).await.map_err(|e| {
                self.error(
                    ErrorKind::Connection,
                    format!("cannot write to Claude Code: {e}"),
                )
            })?;
            // Closed: one message, then the CLI ends after its result.
        }
        let stdout = process
            .child
            .stdout
            .take()
            .ok_or_else(|| self.error(ErrorKind::Config, "no stdout"))?;
        let stderr = process.child.stderr.take();
        let stderr_tail = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(stderr) = stderr {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.push_str(&line);
                    t.push('\n');
                    if t.len() > STDERR_TAIL {
                        let cut = t.len() - STDERR_TAIL;
                        let cut = (cut..t.len()).find(|i| t.is_char_boundary(*i)).unwrap_or(0);
                        t.drain(..cut);
                    }
                }
            });
        }
        let name = self.config.name.clone();
        let timeout = self.config.timeout;
        let structured = request.response_format.is_some();
        let state = Reader {
            lines: BufReader::new(stdout).lines(),
            process,
            parser: Parser::new(name, structured),
            stderr: stderr_tail,
            pending: std::collections::VecDeque::new(),
            done: false,
            deadline: tokio::time::Instant::now() + timeout,
        };
        let stream = futures_util::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(item) = st.pending.pop_front() {
                    if item.is_err() {
                        st.done = true;
                    }
                    return Some((item, st));
                }
                if st.done {
                    return None;
                }
                let line = tokio::time::timeout_at(st.deadline, st.lines.next_line()).await;
                match line {
                    Err(_) => {
                        st.done = true;
                        st.process.kill();
                        let e = LlmError::new(
                            ErrorKind::Timeout,
                            &st.parser.provider,
                            "Claude Code did not finish within the provider's timeout",
                        );
                        return Some((Err(e), st));
                    }
                    Ok(Ok(Some(line))) => {
                        let events = st.parser.line(&line);
                        st.pending.extend(events);
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        st.done = true;
                        let status = st.process.child.wait().await.ok();
                        if st.parser.finished {
                            continue;
                        }
                        let stderr = st.stderr.lock().map(|s| s.clone()).unwrap_or_default();
                        let e = st.parser.ended_early(status, &stderr);
                        return Some((Err(e), st));
                    }
                }
            }
        });
        Ok(stream.boxed())
    }
}

/// Writes a file only its owner may read.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// A call's `HOME`: a directory only its owner may enter, removed when dropped. While it
/// lives this replica holds its [`LOCK`] file locked (the kernel lets go of the lock when the
/// replica dies, however it dies): a `HOME` whose lock nobody holds is a leftover.
struct HomeDir {
    path: std::path::PathBuf,
    lock: std::fs::File,
}

impl HomeDir {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let path = std::env::temp_dir().join(format!("{HOME_PREFIX}{}", crate::store::new_id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path.join(LOCK))
            .and_then(|file| file.lock().map(|()| file));
        match lock {
            Ok(lock) => Ok(Self { path, lock }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&path);
                Err(e)
            }
        }
    }

    /// Records the CLI's process group, for [`sweep`] should this replica die.
    fn record(&self, group: i32) {
        use std::io::Write;
        let _ = (&self.lock).write_all(group.to_string().as_bytes());
    }
}

impl Drop for HomeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One call's CLI, leader of a process group of its own, and its `HOME`. Dropped — the
/// answer read, an error, a timeout, the stream dropped with its run (cancelled, or the
/// server stopping) — the whole group is killed, then the `HOME` (with the run's
/// credential in `kortex-mcp.json`) is removed.
struct Process {
    child: tokio::process::Child,
    group: Option<rustix::process::Pid>,
    /// Removed when dropped, after the child (fields drop in order).
    _home: HomeDir,
}

impl Process {
    fn new(child: tokio::process::Child, home: HomeDir) -> Self {
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(group) = group {
            home.record(group.as_raw_pid());
        }
        Self {
            child,
            group,
            _home: home,
        }
    }

    /// Kills the CLI and everything it started.
    fn kill(&mut self) {
        if let Some(group) = self.group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.child.start_kill();
    }
}

impl Drop for Process {
    /// Killed first; then the fields go in order: the child (reaped), the `HOME`.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Clears what calls of a replica killed outright (when nothing of the above could run)
/// left in the temporary directory: each `HOME` whose lock nobody holds is removed, after
/// the process group it records is killed, when that group still runs there. Called once
/// as the server starts; a `HOME` of a live replica on the same machine is left alone.
pub fn sweep() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let home = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(HOME_PREFIX))
            && entry.file_type().is_ok_and(|t| t.is_dir());
        let Some((group, _lock)) = ours.then(|| abandoned(&home)).flatten() else {
            continue;
        };
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        match std::fs::remove_dir_all(&home) {
            Ok(()) => tracing::info!(
                home = %home.display(),
                killed = group.map(|g| g.as_raw_pid()),
                "removed a Claude Code home left by a server that was killed"
            ),
            Err(e) => tracing::warn!(
                home = %home.display(),
                error = %e,
                "cannot remove a Claude Code home left by a server that was killed"
            ),
        }
    }
}

/// Whether `home` is a leftover: then the process group to kill first, if one still runs
/// there, and the lock (held until it is removed).
fn abandoned(
    home: &std::path::Path,
) -> Option<(Option<rustix::process::Pid>, Option<std::fs::File>)> {
    use std::io::Read;
    let young = || {
        std::fs::metadata(home)
            .and_then(|m| m.modified())
            .map_or(true, |t| t.elapsed().unwrap_or_default() < YOUNG)
    };
    let mut lock = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(home.join(LOCK))
    {
        Ok(lock) => lock,
        // Being made, or not Kortex's to judge (another user's).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (!young()).then_some((None, None));
        }
        Err(_) => return None,
    };
    // Held: a live replica's call.
    lock.try_lock().ok()?;
    let mut recorded = String::new();
    lock.read_to_string(&mut recorded).ok()?;
    let group = recorded
        .trim()
        .parse::<i32>()
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if group.is_none() && young() {
        return None;
    }
    Some((group.filter(|g| runs_in(*g, home)), Some(lock)))
}

/// Whether a process of `group` still works in `home` (Linux's `/proc`): the number is
/// still the call's, not another's since.
fn runs_in(group: rustix::process::Pid, home: &std::path::Path) -> bool {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return false;
    };
    processes.flatten().any(|p| {
        let dir = p.path();
        // `pid (comm) state ppid pgrp …`
        let pgrp = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().nth(2)?.parse::<i32>().ok()
            });
        pgrp == Some(group.as_raw_pid())
            && std::fs::read_link(dir.join("cwd")).is_ok_and(|cwd| cwd.starts_with(home))
    })
}

struct Reader {
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    process: Process,
    parser: Parser,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    pending: std::collections::VecDeque<Result<StreamEvent, LlmError>>,
    done: bool,
    deadline: tokio::time::Instant,
}

/// The conversation as one prompt: the CLI takes user messages only, so earlier turns
/// (answers, tool calls and their results) are written out as a transcript before the
/// latest question.
pub fn prompt(messages: &[Message]) -> String {
    if let [Message::User { content }] = messages {
        return content.clone();
    }
    let last_user = messages
        .iter()
        .rposition(|m| matches!(m, Message::User { .. }));
    let mut out = String::from(
        "The conversation so far, for context (you are the assistant; tool calls went through the kortex tools):\n",
    );
    for (i, m) in messages.iter().enumerate() {
        if Some(i) == last_user && i + 1 == messages.len() {
            continue;
        }
        match m {
            Message::User { content } => {
                out.push_str(&format!("\n[user]\n{content}\n"));
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                if !content.trim().is_empty() {
                    out.push_str(&format!("\n[assistant]\n{content}\n"));
                }
                for c in tool_calls {
                    out.push_str(&format!("\n[tool call {}] {} {}\n", c.id, c.name, c.input));
                }
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let what = if *is_error {
                    "tool error"
                } else {
                    "tool result"
                };
                out.push_str(&format!("\n[{what} {tool_call_id}]\n{content}\n"));
            }
        }
    }
    match last_user.filter(|i| i + 1 == messages.len()) {
        Some(i) => {
            if let Message::User { content } = &messages[i] {
                out.push_str(&format!("\nThe user's latest message:\n{content}"));
            }
        }
        None => out.push_str("\nContinue from here."),
    }
    out
}

/// Claude Code's `stream-json` output, one line at a time.
struct Parser {
    provider: String,
    /// Structured output was asked for: the answer is the result's `structured_output`.
    structured: bool,
    model: String,
    /// Text streamed so far (partial messages), so whole messages are not sent twice.
    streamed: bool,
    /// A new model turn began after text: its text starts a new paragraph.
    new_turn: bool,
    finished: bool,
}

impl Parser {
    fn new(provider: String, structured: bool) -> Self {
        Self {
            provider,
            structured,
            model: String::new(),
            streamed: false,
            new_turn: false,
            finished: false,
        }
    }

    fn line(&mut self, line: &str) -> Vec<Result<StreamEvent, LlmError>> {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return Vec::new();
        };
        // Only the main conversation; a subagent's (if one ever ran) is not the answer.
        if !v["parent_tool_use_id"].is_null() {
            return Vec::new();
        }
        match v["type"].as_str() {
            // Claude Code retries a refused credential (ten times, for minutes): refused is
            // refused, at once.
            Some("system")
                if v["subtype"] == "api_retry"
                    && (matches!(v["error_status"].as_u64(), Some(401 | 403))
                        || v["error"] == "authentication_failed") =>
            {
                self.finished = true;
                let mut e = LlmError::new(
                    ErrorKind::Auth,
                    &self.provider,
                    format!(
                        "Claude Code: the credential was refused ({}); check spec.authSecretRef and authKind (renew a token with `claude setup-token`)",
                        v["error"].as_str().unwrap_or("authentication_failed")
                    ),
                );
                e.status = v["error_status"].as_u64().map(|s| s as u16);
                vec![Err(e)]
            }
            Some("system") if v["subtype"] == "init" => {
                self.model = v["model"].as_str().unwrap_or_default().to_owned();
                Vec::new()
            }
            Some("stream_event") => {
                let e = &v["event"];
                if e["type"] == "message_start" && self.streamed {
                    self.new_turn = true;
                }
                if e["type"] == "content_block_delta"
                    && e["delta"]["type"] == "text_delta"
                    && !self.structured
                    && let Some(t) = e["delta"]["text"].as_str()
                {
                    self.streamed = true;
                    let t = if std::mem::take(&mut self.new_turn) {
                        format!("\n\n{t}")
                    } else {
                        t.to_owned()
                    };
                    return vec![Ok(StreamEvent::TextDelta(t))];
                }
                Vec::new()
            }
            Some("assistant") => {
                let mut out = Vec::new();
                for block in v["message"]["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("tool_use") => {
                            let name = block["name"].as_str().unwrap_or_default();
                            if !name.starts_with(&format!("mcp__{SERVER}__")) {
                                out.push(Ok(StreamEvent::Warning(format!(
                                    "the model asked for Claude Code's own tool {name}; refused: only Kortex's tools run"
                                ))));
                            }
                        }
                        Some("text") if !self.streamed && !self.structured => {
                            if let Some(t) = block["text"].as_str() {
                                out.push(Ok(StreamEvent::TextDelta(t.to_owned())));
                            }
                        }
                        _ => {}
                    }
                }
                out
            }
            Some("result") => {
                self.finished = true;
                self.result(&v)
            }
            _ => Vec::new(),
        }
    }

    fn result(&mut self, v: &Value) -> Vec<Result<StreamEvent, LlmError>> {
        let usage = &v["usage"];
        let n = |k: &str| usage[k].as_u64().unwrap_or(0);
        let usage = Usage {
            input_tokens: n("input_tokens")
                + n("cache_creation_input_tokens")
                + n("cache_read_input_tokens"),
            output_tokens: n("output_tokens"),
            estimated: false,
        };
        let model = v["modelUsage"]
            .as_object()
            .and_then(|m| m.keys().next().cloned())
            .unwrap_or_else(|| self.model.clone());
        let subtype = v["subtype"].as_str().unwrap_or_default();
        let mut out = Vec::new();
        let stop_reason = match subtype {
            "success" if v["is_error"] != true => match v["stop_reason"].as_str() {
                Some("max_tokens") => StopReason::MaxTokens,
                Some("stop_sequence") => StopReason::StopSequence,
                _ => StopReason::EndTurn,
            },
            "error_max_turns" => {
                out.push(Ok(StreamEvent::Warning(format!(
                    "Claude Code stopped after {} turns (the provider's maxTurns or the policy's maxToolDepth)",
                    v["num_turns"].as_u64().unwrap_or(0)
                ))));
                StopReason::MaxTokens
            }
            _ => {
                out.push(Err(self.failure(v)));
                return out;
            }
        };
        if self.structured {
            match &v["structured_output"] {
                Value::Null => {
                    return vec![Err(LlmError::new(
                        ErrorKind::Protocol,
                        &self.provider,
                        format!("Claude Code gave no structured output ({subtype})"),
                    ))];
                }
                structured => out.push(Ok(StreamEvent::TextDelta(structured.to_string()))),
            }
        }
        out.push(Ok(StreamEvent::Done {
            stop_reason,
            usage,
            model,
        }));
        out
    }

    /// The error a failed result stands for.
    fn failure(&self, v: &Value) -> LlmError {
        let status = v["api_error_status"].as_u64().map(|s| s as u16);
        let said = v["result"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| {
                v["errors"].as_array().map(|e| {
                    e.iter()
                        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                        .collect::<Vec<_>>()
                        .join("; ")
                })
            })
            .unwrap_or_else(|| format!("Claude Code ended with {}", v["subtype"]));
        let lower = said.to_ascii_lowercase();
        let kind = match status {
            Some(401 | 403) => ErrorKind::Auth,
            Some(429) => ErrorKind::RateLimited,
            Some(400 | 404 | 422) => ErrorKind::BadRequest,
            Some(s) if s >= 500 => ErrorKind::Upstream,
            _ if lower.contains("api key")
                || lower.contains("/login")
                || lower.contains("oauth")
                || lower.contains("authentication") =>
            {
                ErrorKind::Auth
            }
            _ if lower.contains("rate limit") || lower.contains("usage limit") => {
                ErrorKind::RateLimited
            }
            _ => ErrorKind::Upstream,
        };
        let mut e = LlmError::new(kind, &self.provider, format!("Claude Code: {said}"));
        e.status = status;
        e
    }

    /// The error of a process that ended without a result.
    fn ended_early(&self, status: Option<std::process::ExitStatus>, stderr: &str) -> LlmError {
        let stderr = stderr.trim();
        let lower = stderr.to_ascii_lowercase();
        let kind = if lower.contains("unknown option") || lower.contains("error: option") {
            ErrorKind::Config
        } else if lower.contains("api key") || lower.contains("/login") || lower.contains("oauth") {
            ErrorKind::Auth
        } else {
            ErrorKind::Upstream
        };
        let code = status
            .and_then(|s| s.code())
            .map_or_else(|| "a signal".to_owned(), |c| format!("exit status {c}"));
        let mut message = format!("Claude Code ended ({code}) without a result");
        if kind == ErrorKind::Config {
            message.push_str(
                ": the CLI does not take Kortex's flags; upgrade @anthropic-ai/claude-code",
            );
        }
        LlmError::new(kind, &self.provider, message).with_detail(stderr.to_owned())
    }
}

/// `claude --version`: the version it reports, or why it cannot run.
pub async fn version(command: &str) -> Result<(u32, u32, u32), String> {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(command)
            .arg("--version")
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            .env("DISABLE_AUTOUPDATER", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("{command} --version did not answer within 30s"))?
    .map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("no {command:?} on PATH: install @anthropic-ai/claude-code (the image's claude-code target has it), or set spec.command")
        } else {
            format!("cannot run {command}: {e}")
        }
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_version(&text).ok_or_else(|| {
        format!(
            "{command} --version said {:?}, not a Claude Code version",
            text.trim()
        )
    })
}

/// `2.1.197 (Claude Code)` → `(2, 1, 197)`.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().next()?;
    let mut parts = word.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

pub use super::probe::locate;

/// Credentials a probe call accepted, and when (by provider and a hash of the credential):
/// a probe that costs a model call is made again only after [`AUTH_RECHECK`].
static AUTH_CHECKED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
> = std::sync::LazyLock::new(Default::default);
/// How long an accepted credential is not probed again.
const AUTH_RECHECK: Duration = Duration::from_secs(6 * 3600);

impl ClaudeCode {
    /// A one-turn call that answers `OK` (remembered for [`AUTH_RECHECK`] once accepted).
    pub async fn check_auth(&self) -> Result<(), LlmError> {
        use sha2::Digest;
        let Some((_, credential)) = &self.auth else {
            return Err(self.error(ErrorKind::Auth, "no credential: set spec.authSecretRef"));
        };
        let key = format!(
            "{}/{:x}",
            self.config.name,
            sha2::Sha256::digest(credential.expose().as_bytes())
        );
        let fresh = AUTH_CHECKED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .is_some_and(|at| at.elapsed() < AUTH_RECHECK);
        if fresh {
            return Ok(());
        }
        let request = ChatRequest {
            system: Some("Reply with exactly: OK".to_owned()),
            messages: vec![Message::User {
                content: "OK?".to_owned(),
            }],
            max_tokens: Some(1),
            ..Default::default()
        };
        self.complete(&request).await?;
        AUTH_CHECKED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, std::time::Instant::now());
        Ok(())
    }
}

impl LlmProvider for ClaudeCode {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities {
            native_tools: true,
            tools: true,
            streaming: true,
        }
    }

    fn delegates_tools(&self) -> bool {
        true
    }

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            if !request.tools.is_empty() && request.mcp.is_none() {
                return Err(self.error(
                    ErrorKind::BadRequest,
                    "claude-code runs tools only through Kortex's MCP endpoint, in a chat run; it cannot be offered tools over the gateway",
                ));
            }
            let mut stream = self.run(request).await?;
            // Errors before any output come back here, so a policy may fail over.
            match stream.next().await {
                Some(Err(e)) => Err(e),
                Some(Ok(first)) => Ok(futures_util::stream::iter([Ok(first)])
                    .chain(stream)
                    .boxed()),
                None => Ok(stream),
            }
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let stream = self.stream(request).await?;
            super::collect(stream, started).await
        })
    }

    /// The probe: the CLI runs and is recent enough, and a credential is configured. (A
    /// model call, which costs, is `kortex providers check`'s.)
    fn list_models(&self) -> LlmFuture<'_, Vec<String>> {
        Box::pin(async move {
            let v = version(&self.command)
                .await
                .map_err(|e| self.error(ErrorKind::Config, e))?;
            if v < MIN_VERSION {
                return Err(self.error(
                    ErrorKind::Config,
                    format!(
                        "Claude Code {}.{}.{} is older than {}.{}.{}, the first that takes Kortex's flags; upgrade @anthropic-ai/claude-code",
                        v.0, v.1, v.2, MIN_VERSION.0, MIN_VERSION.1, MIN_VERSION.2
                    ),
                ));
            }
            self.check_auth().await?;
            Ok(self
                .config
                .default_model
                .iter()
                .chain(self.config.models.iter().map(|m| &m.id))
                .cloned()
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[Value], structured: bool) -> Vec<Result<StreamEvent, LlmError>> {
        let mut p = Parser::new("cc".into(), structured);
        lines.iter().flat_map(|l| p.line(&l.to_string())).collect()
    }

    #[test]
    fn text_streams_once_and_the_result_settles_usage() {
        let events = parse(
            &[
                json!({"type": "system", "subtype": "init", "model": "claude-sonnet-5", "tools": []}),
                json!({"type": "stream_event", "parent_tool_use_id": null, "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hel"}}}),
                json!({"type": "stream_event", "parent_tool_use_id": null, "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "lo"}}}),
                json!({"type": "assistant", "parent_tool_use_id": null, "message": {"content": [{"type": "text", "text": "Hello"}, {"type": "tool_use", "name": "Bash", "input": {}}]}}),
                json!({"type": "result", "subtype": "success", "is_error": false, "stop_reason": "end_turn", "result": "Hello",
                    "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 7}, "modelUsage": {"claude-sonnet-5": {}}}),
            ],
            false,
        );
        let events: Vec<StreamEvent> = events.into_iter().filter_map(Result::ok).collect();
        assert_eq!(
            events,
            vec![
                StreamEvent::TextDelta("Hel".into()),
                StreamEvent::TextDelta("lo".into()),
                StreamEvent::Warning("the model asked for Claude Code's own tool Bash; refused: only Kortex's tools run".into()),
                StreamEvent::Done {
                    stop_reason: StopReason::EndTurn,
                    usage: Usage { input_tokens: 15, output_tokens: 7, estimated: false },
                    model: "claude-sonnet-5".into()
                }
            ]
        );
    }

    #[test]
    fn each_turn_of_the_loop_starts_a_paragraph() {
        let delta = |t: &str| json!({"type": "stream_event", "parent_tool_use_id": null, "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": t}}});
        let start = json!({"type": "stream_event", "parent_tool_use_id": null, "event": {"type": "message_start"}});
        let text: String = parse(
            &[start.clone(), delta("Checking."), start, delta("Found it.")],
            false,
        )
        .into_iter()
        .filter_map(|e| match e {
            Ok(StreamEvent::TextDelta(t)) => Some(t),
            _ => None,
        })
        .collect();
        assert_eq!(text, "Checking.\n\nFound it.");
    }

    #[test]
    fn failed_results_become_typed_errors() {
        let kind = |v: Value| {
            parse(&[v], false)
                .into_iter()
                .find_map(Result::err)
                .map(|e| (e.kind, e.message))
        };
        let (k, m) = kind(json!({"type": "result", "subtype": "success", "is_error": true, "api_error_status": 401,
            "result": "Invalid API key · Please run /login"}))
        .unwrap_or((ErrorKind::Protocol, String::new()));
        assert_eq!(k, ErrorKind::Auth);
        assert!(m.contains("Invalid API key"), "{m}");
        assert_eq!(
            kind(json!({"type": "result", "subtype": "success", "is_error": true, "api_error_status": 429, "result": "slow down"})).map(|e| e.0),
            Some(ErrorKind::RateLimited)
        );
        assert_eq!(
            kind(json!({"type": "result", "subtype": "error_during_execution", "is_error": true, "errors": ["boom"]})).map(|e| e.0),
            Some(ErrorKind::Upstream)
        );
        // Out of turns is an answer that stopped early, not a failure.
        assert!(
            kind(
                json!({"type": "result", "subtype": "error_max_turns", "num_turns": 3, "usage": {}})
            )
            .is_none()
        );
    }

    #[test]
    fn a_refused_credential_fails_at_once() {
        let events = parse(
            &[
                json!({"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 401, "error": "authentication_failed"}),
            ],
            false,
        );
        let e = events.into_iter().find_map(Result::err);
        assert_eq!(e.as_ref().map(|e| e.kind), Some(ErrorKind::Auth), "{e:?}");
        // Rate limits and overloads are the CLI's to retry.
        assert!(parse(&[json!({"type": "system", "subtype": "api_retry", "error_status": 529, "error": "overloaded"})], false).is_empty());
    }

    #[test]
    fn structured_output_is_the_answer() {
        let events = parse(
            &[
                json!({"type": "result", "subtype": "success", "is_error": false, "result": "", "structured_output": {"a": 1}, "usage": {}}),
            ],
            true,
        );
        assert_eq!(
            events.first().cloned().and_then(Result::ok),
            Some(StreamEvent::TextDelta("{\"a\":1}".into()))
        );
    }

    #[test]
    fn earlier_turns_are_written_out_before_the_question() {
        let p = prompt(&[
            Message::User {
                content: "why is api down?".into(),
            },
            Message::Assistant {
                content: "Looking.".into(),
                tool_calls: vec![super::super::ToolCall {
                    id: "c1".into(),
                    name: "get_logs".into(),
                    input: json!({"pod": "api"}),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "OOMKilled".into(),
                is_error: false,
            },
            Message::Assistant {
                content: "It ran out of memory.".into(),
                tool_calls: vec![],
            },
            Message::User {
                content: "since when?".into(),
            },
        ]);
        assert!(p.contains("[user]\nwhy is api down?"), "{p}");
        assert!(
            p.contains("[tool call c1] get_logs {\"pod\":\"api\"}"),
            "{p}"
        );
        assert!(p.contains("[tool result c1]\nOOMKilled"), "{p}");
        assert!(
            p.ends_with("The user's latest message:\nsince when?"),
            "{p}"
        );
        assert_eq!(
            prompt(&[Message::User {
                content: "hi".into()
            }]),
            "hi"
        );
    }

    #[test]
    fn a_home_is_left_over_only_when_no_replica_holds_it() {
        use std::os::unix::process::CommandExt;
        let home = HomeDir::new().unwrap_or_else(|e| panic!("{e}"));
        assert!(abandoned(&home.path).is_none(), "its replica holds it");
        // The replica gone (its lock let go), its CLI's group still running there.
        let mut cli = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(&home.path)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let group = i32::try_from(cli.id()).unwrap_or_else(|e| panic!("{e}"));
        home.record(group);
        home.lock.unlock().unwrap_or_else(|e| panic!("{e}"));
        let (found, lock) = abandoned(&home.path).unwrap_or_else(|| panic!("not a leftover"));
        assert_eq!(found.map(|g| g.as_raw_pid()), Some(group));
        // Held by the sweep meanwhile.
        assert!(abandoned(&home.path).is_none());
        drop(lock);
        let _ = cli.kill();
        let _ = cli.wait();
        // The group gone, its number may be another's: nothing to kill.
        let (found, _) = abandoned(&home.path).unwrap_or_else(|| panic!("not a leftover"));
        assert_eq!(found, None);
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("2.1.197 (Claude Code)\n"), Some((2, 1, 197)));
        assert_eq!(parse_version("hello"), None);
    }
}
