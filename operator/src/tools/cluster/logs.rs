//! `get_logs`: pod logs by pod, workload or label selector, newest first, up to 100 lines (48 KiB) a page
//! with a signed cursor, filtered by time window, minimum level and text.

use super::{Cluster, ClusterTool, ToolError, q, required, seg};
use crate::llm::ToolSpec;
use crate::tools::window;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Lines a page.
const PAGE: usize = 100;
/// Bytes of log text a page holds at most (below the router's result cap).
const PAGE_BYTES: usize = 48 * 1024;
/// Pods read at most.
const MAX_PODS: usize = 10;
/// Most recent lines fetched per container.
const TAIL_LINES: i64 = 5000;
/// Bytes fetched per container at most.
const LIMIT_BYTES: i64 = 4 * 1024 * 1024;
/// Longest line shown.
const MAX_LINE: usize = 2000;

/// A log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Trace.
    Trace,
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warning.
    Warn,
    /// Error.
    Error,
    /// Fatal.
    Fatal,
}

impl Level {
    fn from_word(word: &str) -> Option<Self> {
        Some(match word.to_ascii_lowercase().as_str() {
            "trace" | "trc" | "verbose" => Level::Trace,
            "debug" | "dbg" => Level::Debug,
            "info" | "inf" | "information" | "notice" => Level::Info,
            "warn" | "warning" | "wrn" => Level::Warn,
            "error" | "err" | "critical" | "crit" | "severe" | "eror" => Level::Error,
            "fatal" | "ftl" | "panic" | "emerg" | "emergency" | "alert" | "dpanic" => Level::Fatal,
            _ => return None,
        })
    }

    /// pino / bunyan numeric levels.
    fn from_number(n: f64) -> Option<Self> {
        Some(match n as i64 {
            10 => Level::Trace,
            20 => Level::Debug,
            30 => Level::Info,
            40 => Level::Warn,
            50 => Level::Error,
            60 => Level::Fatal,
            _ => return None,
        })
    }
}

static LOGFMT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"(?i)(?:^|\s)(?:level|lvl|severity|loglevel)\s*[=:]\s*"?([a-z]+)"?"#).ok()
});
static KLOG: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^([IWEF])\d{4} \d{2}:\d{2}:\d{2}").ok());
static BRACKETED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?i)[\[(<]\s*(trace|debug|info|notice|warn|warning|error|err|critical|crit|fatal|panic|severe)\s*[\])>]").ok()
});
static BARE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?:^|[\s|:.])(TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|CRITICAL|CRIT|FATAL|PANIC|SEVERE)(?:$|[\s|:\-])").ok()
});

/// The level of a log line: JSON (`level`, `lvl`, `severity`, `log.level`, `levelname`,
/// pino's numbers), logfmt (`level=warn`), klog (`E1122 10:00:00…`), `[ERROR]`, or an
/// upper-case level word near the start.
pub fn detect_level(message: &str) -> Option<Level> {
    let trimmed = message.trim_start();
    if trimmed.starts_with('{')
        && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(trimmed)
    {
        for key in [
            "level",
            "lvl",
            "severity",
            "levelname",
            "loglevel",
            "@l",
            "log.level",
        ] {
            let value = map.get(key).or_else(|| {
                key.split_once('.')
                    .and_then(|(a, b)| map.get(a).and_then(|v| v.get(b)))
            });
            match value {
                Some(Value::String(s)) => return Level::from_word(s),
                Some(Value::Number(n)) => return n.as_f64().and_then(Level::from_number),
                _ => {}
            }
        }
        return None;
    }
    // Go's runtime panics and fatal errors.
    if trimmed.starts_with("panic: ") || trimmed.starts_with("fatal error: ") {
        return Some(Level::Fatal);
    }
    let head: String = trimmed.chars().take(160).collect();
    let captured = |re: &LazyLock<Option<Regex>>| {
        re.as_ref()
            .and_then(|r| r.captures(&head))
            .and_then(|c| c.get(1).map(|m| m.as_str().to_owned()))
    };
    if let Some(k) = captured(&KLOG) {
        return match k.as_str() {
            "I" => Some(Level::Info),
            "W" => Some(Level::Warn),
            "E" => Some(Level::Error),
            _ => Some(Level::Fatal),
        };
    }
    [&LOGFMT, &BRACKETED, &BARE]
        .into_iter()
        .find_map(|re| captured(re).and_then(|w| Level::from_word(&w)))
}

/// Whether a line continues the previous one (stack traces).
fn is_continuation(message: &str) -> bool {
    message.starts_with([' ', '\t'])
        || message.starts_with("Caused by")
        || message.starts_with("Traceback")
        || message.starts_with("...")
}

/// One log line.
#[derive(Clone, Debug)]
struct Line {
    time: jiff::Timestamp,
    pod: String,
    container: String,
    /// Position among the lines of this container with the same time.
    ordinal: u32,
    message: String,
}

impl Line {
    fn key(&self) -> Key {
        Key {
            nanos: self.time.as_nanosecond().to_string(),
            pod: self.pod.clone(),
            container: self.container.clone(),
            ordinal: self.ordinal,
        }
    }
}

/// Where a page ended (the sort key of its last line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    nanos: String,
    pod: String,
    container: String,
    ordinal: u32,
}

/// Newest first; ties by pod, container, ordinal descending.
fn newest_first(a: &Key, b: &Key) -> Ordering {
    let nanos = |k: &Key| k.nanos.parse::<i128>().unwrap_or(0);
    nanos(b)
        .cmp(&nanos(a))
        .then_with(|| b.pod.cmp(&a.pod))
        .then_with(|| b.container.cmp(&a.container))
        .then_with(|| b.ordinal.cmp(&a.ordinal))
}

/// A cursor's content.
#[derive(Debug, Serialize, Deserialize)]
struct Position {
    start: String,
    end: String,
    after: Key,
}

/// Parses `log?timestamps=true` output of one container, oldest first, keeping lines in
/// `[start, end)` at or above `min` that contain `filter`.
fn parse_lines(
    text: &str,
    pod: &str,
    container: &str,
    range: (jiff::Timestamp, jiff::Timestamp),
    min: Option<Level>,
    filter: Option<&str>,
) -> Vec<Line> {
    let mut out = Vec::new();
    let mut previous_level = None;
    let mut last_time = None;
    let mut ordinal = 0;
    for raw in text.lines() {
        let Some((stamp, message)) = raw.split_once(' ') else {
            continue;
        };
        let Ok(time) = stamp.parse::<jiff::Timestamp>() else {
            continue;
        };
        let level = match detect_level(message) {
            Some(l) => Some(l),
            None if is_continuation(message) => previous_level,
            None => None,
        };
        previous_level = level;
        ordinal = if last_time == Some(time) {
            ordinal + 1
        } else {
            0
        };
        last_time = Some(time);
        if time < range.0 || time >= range.1 {
            continue;
        }
        if let Some(min) = min
            && level.is_none_or(|l| l < min)
        {
            continue;
        }
        if let Some(f) = filter
            && !message.to_lowercase().contains(f)
        {
            continue;
        }
        let mut message = message.to_owned();
        if message.len() > MAX_LINE {
            let mut end = MAX_LINE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("…[line cut]");
        }
        out.push(Line {
            time,
            pod: pod.to_owned(),
            container: container.to_owned(),
            ordinal,
            message,
        });
    }
    out
}

/// The tool.
pub struct GetLogs;

impl ClusterTool for GetLogs {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "get_logs".into(),
            description: format!(
                "Read container logs of pods in a namespace, newest first, up to {PAGE} lines a page. Without `container`, every container is read, plus init containers that are sidecars, running or failed. Choose the pods by exactly one of `pod`, `workload` (like 'deployment/checkout', 'statefulset/db', 'daemonset/agent', 'job/migrate') or `selector` (a label selector like 'app=checkout,tier!=canary'). Use `previous: true` for the last crashed container of a restarting pod. Narrow with `window`, `minLevel` (recognised in JSON, logfmt, klog and common text formats; lines without a level are left out when it is set, except stack-trace lines following a matching line) and `filter` (case-insensitive text). When `nextCursor` is returned, call again with the same arguments plus `cursor` for older lines."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                    "pod": {"type": "string", "minLength": 1, "maxLength": 253},
                    "workload": {"type": "string", "pattern": "^(?i)(deployment|deploy|statefulset|sts|daemonset|ds|replicaset|rs|job)/[a-z0-9.-]+$"},
                    "selector": {"type": "string", "minLength": 1, "maxLength": 1024},
                    "container": {"type": "string", "minLength": 1, "maxLength": 253},
                    "previous": {"type": "boolean", "default": false, "description": "Logs of the previous (crashed) instance of the container."},
                    "window": {"type": "string", "maxLength": 100, "description": format!("Default 'last 1h'. {}", window::WINDOW_HELP)},
                    "minLevel": {"type": "string", "enum": ["trace", "debug", "info", "warn", "error", "fatal"]},
                    "filter": {"type": "string", "minLength": 1, "maxLength": 200},
                    "cursor": {"type": "string", "maxLength": 4096, "description": "nextCursor of the previous page."}
                },
                "required": ["namespace"],
                "additionalProperties": false
            }),
        }
    }

    const TIMEOUTS: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(300));

    async fn run(cluster: Arc<Cluster>, input: Value) -> Result<String, ToolError> {
        get_logs(&cluster, &input).await
    }
}

// Long because the tool's arguments, the pod/container choice, the read and the filtering are one
// pipeline whose every step depends on the last; split pieces would pass a dozen values.
async fn get_logs(cluster: &Cluster, input: &Value) -> Result<String, ToolError> {
    let namespace = required(input, "namespace")?;
    let str_arg = |k: &str| input[k].as_str().filter(|s| !s.is_empty());
    let chosen = ["pod", "workload", "selector"]
        .iter()
        .filter(|k| str_arg(k).is_some())
        .count();
    if chosen != 1 {
        return Err(ToolError::Validation(
            "give exactly one of pod, workload or selector".into(),
        ));
    }
    let previous = input["previous"].as_bool().unwrap_or(false);
    let min = match str_arg("minLevel") {
        Some(l) => Some(
            Level::from_word(l)
                .ok_or_else(|| ToolError::Validation(format!("unknown minLevel {l}")))?,
        ),
        None => None,
    };
    let filter = str_arg("filter").map(str::to_lowercase);
    let (range, after) = match str_arg("cursor") {
        Some(c) => {
            let p: Position = cluster.cursors.open("get_logs", input, c)?;
            let parse = |s: &str| {
                s.parse::<jiff::Timestamp>()
                    .map_err(|_| ToolError::Validation("invalid cursor".into()))
            };
            ((parse(&p.start)?, parse(&p.end)?), Some(p.after))
        }
        None => {
            let w = window::parse(
                str_arg("window").unwrap_or("last 1h"),
                jiff::Timestamp::now(),
            )
            .map_err(ToolError::Validation)?;
            ((w.start, w.end), None)
        }
    };

    let mut notes = Vec::new();
    let pods = pods(cluster, namespace, input, &mut notes).await?;
    if pods.is_empty() {
        return Err(ToolError::Upstream(format!(
            "no pods match in namespace {namespace}"
        )));
    }
    let mut targets = Vec::new();
    for pod in &pods {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let containers: Vec<String> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        let init: Vec<String> = pod["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        match str_arg("container") {
            Some(c) if containers.iter().chain(init.iter()).any(|x| x == c) => {
                targets.push((name, c.to_owned()));
            }
            Some(c) => {
                if pods.len() == 1 {
                    return Err(ToolError::Validation(format!(
                        "pod {name} has no container {c}; its containers: {}",
                        containers
                            .iter()
                            .chain(init.iter())
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                notes.push(format!("pod {name} has no container {c}"));
            }
            None => {
                // Init containers too when they matter: sidecars, and any that did not
                // finish cleanly (a pod stuck in Init:CrashLoopBackOff has no other logs).
                let relevant_init = init.into_iter().filter(|c| init_matters(pod, c));
                targets.extend(
                    containers
                        .into_iter()
                        .chain(relevant_init)
                        .map(|c| (name.clone(), c)),
                );
            }
        }
    }

    let since = &range.0.to_string();
    let fetches = targets.iter().map(|(pod, container)| async move {
        let read = read_container(cluster, namespace, pod, container, since, previous).await;
        (pod, container, read)
    });
    let fetched = futures_util::future::join_all(fetches).await;
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for (pod, container, result) in fetched {
        match result {
            Ok((text, note)) => {
                notes.extend(note);
                lines.extend(parse_lines(
                    &text,
                    pod,
                    container,
                    range,
                    min,
                    filter.as_deref(),
                ));
            }
            Err(e) => failures.push(format!("{pod}/{container}: {}", tool_error_text(&e))),
        }
    }
    if lines.is_empty() && !failures.is_empty() && failures.len() == targets.len() {
        return Err(ToolError::Upstream(failures.join("; ")));
    }
    notes.extend(failures);
    lines.sort_by(|a, b| newest_first(&a.key(), &b.key()));
    if let Some(after) = &after {
        lines.retain(|l| newest_first(&l.key(), after) == Ordering::Greater);
    }
    // 100 lines a page, fewer when they are long: a page stays readable in one result.
    let mut remaining = lines.len().saturating_sub(PAGE);
    lines.truncate(PAGE);
    let mut bytes = 0;
    let fit = lines
        .iter()
        .position(|l| {
            bytes += l.message.len() + l.pod.len() + l.container.len() + 40;
            bytes > PAGE_BYTES
        })
        .unwrap_or(lines.len())
        .max(1);
    remaining += lines.len().saturating_sub(fit);
    lines.truncate(fit);
    let next_cursor = (remaining > 0).then(|| lines.last()).flatten().map(|last| {
        cluster.cursors.sign(
            "get_logs",
            input,
            &Position {
                start: range.0.to_string(),
                end: range.1.to_string(),
                after: last.key(),
            },
        )
    });
    let rendered: Vec<String> = lines
        .iter()
        .map(|l| format!("{} {}/{} {}", l.time, l.pod, l.container, l.message))
        .collect();
    let pod_names: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    let mut out = json!({
        "namespace": namespace,
        "pods": pod_names,
        "window": {"start": range.0.to_string(), "end": range.1.to_string()},
        "previous": previous,
        "lines": rendered,
        "olderMatchingLines": remaining,
        "nextCursor": next_cursor,
    });
    if rendered.is_empty() {
        out["note"] = json!("no log lines match in this window");
    }
    if !notes.is_empty() {
        out["notes"] = json!(notes);
    }
    Ok(out.to_string())
}

/// The newest lines of one container since `since` (at most [`TAIL_LINES`] and
/// [`LIMIT_BYTES`]), with a note when older lines of the window were left out.
///
/// The kubelet applies `limitBytes` from the start of the `tailLines` it selected, so a
/// cut would drop the newest lines, the ones that matter. When the answer is cut, the
/// partial last line is dropped and the read is repeated with as many lines as fit.
async fn read_container(
    cluster: &Cluster,
    namespace: &str,
    pod: &str,
    container: &str,
    since: &str,
    previous: bool,
) -> Result<(String, Option<String>), ToolError> {
    let mut tail = TAIL_LINES;
    let mut attempt = 0;
    loop {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/log?container={}&timestamps=true&sinceTime={}&tailLines={tail}&limitBytes={LIMIT_BYTES}{}",
            seg(namespace),
            seg(pod),
            q(container),
            q(since),
            if previous { "&previous=true" } else { "" }
        );
        let mut text = cluster.get_text(&path).await?;
        if (text.len() as i64) < LIMIT_BYTES {
            let note = (text.lines().count() as i64 >= tail).then(|| {
                format!(
                    "{pod}/{container}: only its {tail} most recent lines in the window were read; narrow the window to see older ones"
                )
            });
            return Ok((text, note));
        }
        // Cut by limitBytes: keep the complete lines only.
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        text.truncate(complete);
        let fitted = text.lines().count() as i64;
        if attempt == 2 || fitted == 0 {
            return Ok((
                text,
                Some(format!(
                    "{pod}/{container}: its lines are too long to read the newest {tail} within {} MiB; the newest lines may be missing",
                    LIMIT_BYTES >> 20
                )),
            ));
        }
        // The newest `fitted` lines take about as many bytes as the oldest did; leave room.
        tail = (fitted * 9 / 10).max(1);
        attempt += 1;
    }
}

/// Whether init container `name` of `pod` is worth reading without being asked for: a
/// sidecar (`restartPolicy: Always`), or one that is running, waiting or failed.
fn init_matters(pod: &Value, name: &str) -> bool {
    let sidecar = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == name && c["restartPolicy"] == "Always");
    let status = pod["status"]["initContainerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name);
    let Some(status) = status else {
        return sidecar;
    };
    let state = &status["state"];
    let failed = state["terminated"]["exitCode"]
        .as_i64()
        .is_some_and(|c| c != 0);
    // Waiting after a crash (CrashLoopBackOff): the last run's logs are there.
    let crashed = state["waiting"].is_object() && status["lastState"]["terminated"].is_object();
    sidecar || state["running"].is_object() || failed || crashed
}

fn tool_error_text(e: &ToolError) -> String {
    match e {
        ToolError::Validation(m)
        | ToolError::Invalid(m)
        | ToolError::Upstream(m)
        | ToolError::Denied(m)
        | ToolError::Timeout(m)
        | ToolError::Internal(m) => m.clone(),
    }
}

/// The pods chosen by `pod`, `workload` or `selector`: at most [`MAX_PODS`], the most
/// restarted and newest first.
async fn pods(
    cluster: &Cluster,
    namespace: &str,
    input: &Value,
    notes: &mut Vec<String>,
) -> Result<Vec<Value>, ToolError> {
    let base = format!("/api/v1/namespaces/{}/pods", seg(namespace));
    if let Some(pod) = input["pod"].as_str() {
        return Ok(vec![
            cluster.get_json(&format!("{base}/{}", seg(pod))).await?,
        ]);
    }
    let selector = match input["workload"].as_str() {
        Some(w) => {
            let (kind, name) = w
                .split_once('/')
                .ok_or_else(|| ToolError::Validation("workload must be kind/name".into()))?;
            let kind = super::Kind::builtin(kind, None)
                .ok_or_else(|| ToolError::Validation(format!("unknown workload kind {kind}")))?;
            let object = cluster
                .get_json(&format!("{}/{}", kind.path(Some(namespace)), seg(name)))
                .await?;
            selector_of(&object["spec"]["selector"])
                .ok_or_else(|| ToolError::Upstream(format!("{w} has no label selector")))?
        }
        None => input["selector"].as_str().unwrap_or_default().to_owned(),
    };
    let list = cluster
        .get_json(&format!("{base}?labelSelector={}", q(&selector)))
        .await?;
    let mut pods: Vec<Value> = list["items"].as_array().cloned().unwrap_or_default();
    let restarts = |p: &Value| -> i64 {
        p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["restartCount"].as_i64())
            .sum()
    };
    pods.sort_by(|a, b| {
        restarts(b).cmp(&restarts(a)).then_with(|| {
            b["metadata"]["creationTimestamp"]
                .as_str()
                .cmp(&a["metadata"]["creationTimestamp"].as_str())
        })
    });
    if pods.len() > MAX_PODS {
        notes.push(format!(
            "{} pods match; logs of the {MAX_PODS} most restarted and newest were read",
            pods.len()
        ));
        pods.truncate(MAX_PODS);
    }
    Ok(pods)
}

/// A `LabelSelector` object as a selector string.
pub(super) fn selector_of(selector: &Value) -> Option<String> {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for e in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        });
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_recognised_in_common_formats() {
        let cases = [
            (r#"{"level":"error","msg":"db down"}"#, Some(Level::Error)),
            (
                r#"{"severity":"WARNING","message":"slow"}"#,
                Some(Level::Warn),
            ),
            (r#"{"level":50,"msg":"pino error"}"#, Some(Level::Error)),
            (
                r#"{"log":{"level":"debug"},"message":"ecs"}"#,
                Some(Level::Debug),
            ),
            (
                r#"{"levelname":"CRITICAL","msg":"python"}"#,
                Some(Level::Error),
            ),
            (
                "time=2026-11-22T10:00:00Z level=warn msg=\"disk 91%\"",
                Some(Level::Warn),
            ),
            (
                "E1122 10:00:00.123456       1 controller.go:42] sync failed",
                Some(Level::Error),
            ),
            (
                "I1122 10:00:00.123456       1 main.go:10] started",
                Some(Level::Info),
            ),
            (
                "2026-11-22 10:00:00,123 [ERROR] payment failed",
                Some(Level::Error),
            ),
            (
                "2026-11-22 10:00:00.123  WARN 1 --- [main] o.s.Foo : pool exhausted",
                Some(Level::Warn),
            ),
            (
                "[2026-11-22 10:00:00] production.INFO: done",
                Some(Level::Info),
            ),
            ("GET /healthz 200 no error here", None),
            (
                "panic: runtime error: index out of range",
                Some(Level::Fatal),
            ),
            ("FATAL: password authentication failed", Some(Level::Fatal)),
        ];
        for (line, level) in cases {
            assert_eq!(detect_level(line), level, "{line}");
        }
    }

    #[test]
    fn lines_are_windowed_filtered_and_stack_traces_kept_with_their_error() {
        let text = "2026-11-22T10:00:00.000000001Z INFO starting\n\
                    2026-11-22T10:00:01Z ERROR request failed: Timeout\n\
                    2026-11-22T10:00:01Z \tat com.shop.Db.query(Db.java:42)\n\
                    2026-11-22T10:00:02Z WARN retrying after timeout\n\
                    2026-11-22T11:00:00Z ERROR outside the window\n\
                    not a log line\n";
        let range = (
            "2026-11-22T10:00:00Z".parse().unwrap_or_default(),
            "2026-11-22T11:00:00Z".parse().unwrap_or_default(),
        );
        let errors = parse_lines(text, "web-1", "app", range, Some(Level::Error), None);
        assert_eq!(
            errors
                .iter()
                .map(|l| l.message.as_str())
                .collect::<Vec<_>>(),
            [
                "ERROR request failed: Timeout",
                "\tat com.shop.Db.query(Db.java:42)"
            ]
        );
        assert_eq!((errors[0].ordinal, errors[1].ordinal), (0, 1));
        let timeouts = parse_lines(text, "web-1", "app", range, None, Some("timeout"));
        assert_eq!(timeouts.len(), 2);
        assert_eq!(
            parse_lines(text, "web-1", "app", range, None, None).len(),
            4
        );
    }

    #[test]
    fn init_containers_are_read_when_they_matter() {
        let pod = json!({
            "spec": {"initContainers": [
                {"name": "migrate"}, {"name": "done"}, {"name": "mesh", "restartPolicy": "Always"},
                {"name": "later"}, {"name": "running"}, {"name": "failed"}]},
            "status": {"initContainerStatuses": [
                {"name": "migrate", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1}}},
                {"name": "done", "state": {"terminated": {"exitCode": 0}}},
                {"name": "mesh", "state": {"running": {}}},
                {"name": "later", "state": {"waiting": {"reason": "PodInitializing"}}},
                {"name": "running", "state": {"running": {}}},
                {"name": "failed", "state": {"terminated": {"exitCode": 2}}}]}
        });
        let chosen: Vec<&str> = ["migrate", "done", "mesh", "later", "running", "failed"]
            .into_iter()
            .filter(|c| init_matters(&pod, c))
            .collect();
        assert_eq!(chosen, ["migrate", "mesh", "running", "failed"]);
    }

    #[test]
    fn selectors_are_rendered_like_kubectl() {
        let s = json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"}]});
        assert_eq!(
            selector_of(&s).as_deref(),
            Some("app=web,tier in (a,b),!canary")
        );
    }
}
