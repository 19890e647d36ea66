//! Tool calls that a model wrote as text, recovered as tool calls.
//!
//! Small and mid-size open models on servers without a matching tool parser (llama.cpp,
//! LM Studio, vLLM without `--tool-call-parser`) pick the right tool but write the call as
//! text. [`Recognizer`] finds the formats they use, also split across stream deltas:
//!
//! - a JSON object with `name` and `arguments` (or `parameters`, `input`), bare at the start
//!   of a line or in a fenced code block, or an array of them; OpenAI's
//!   `{"type": "function", "function": {...}}` shape too;
//! - Hermes/Qwen `<tool_call>{...}</tool_call>`;
//! - Llama 3.x JSON (`parameters`) and `<|python_tag|>{...}`;
//! - Mistral `[TOOL_CALLS][{...}]` and `[TOOL_CALLS]name[ARGS]{...}`.
//!
//! Only calls that name an offered tool are recovered, with object arguments; anything else
//! stays text, as written. Text that could still become a call is held back (at most
//! [`MAX_HOLD`] bytes) so that a recovered call is never also shown as the answer.

use super::{
    ChatRequest, ChatResponse, ChatStream, LlmError, LlmFuture, LlmProvider, StopReason,
    StreamEvent, ToolCall,
};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The most text held back while it could still become a call; past it the text is shown.
pub const MAX_HOLD: usize = 64 * 1024;

const TOOL_CALL_OPEN: &str = "<tool_call>";
const TOOL_CALL_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const FENCE: &str = "```";
/// What ends a `<|python_tag|>` call besides the end of the answer.
const LLAMA_ENDS: [&str; 2] = ["<|eom_id|>", "<|eot_id|>"];
const MARKERS: [&str; 3] = [TOOL_CALL_OPEN, PYTHON_TAG, MISTRAL];

/// A call recovered from text, with the text it was written as.
#[derive(Clone, Debug, PartialEq)]
pub struct Recovered {
    /// The call.
    pub call: ToolCall,
    /// The text it came from (shown after all if the answer also has native calls).
    pub raw: String,
}

/// What one piece of text turned into.
#[derive(Default, Debug, PartialEq)]
pub struct Extracted {
    /// Text to show.
    pub text: String,
    /// Calls recovered.
    pub calls: Vec<Recovered>,
    /// Marked blocks that could not be read as a call (also kept as text).
    pub warnings: Vec<String>,
}

/// Finds tool calls written as text in a streamed answer.
pub struct Recognizer {
    names: Vec<String>,
    /// Text not yet shown.
    buffer: String,
    /// Whether everything shown since the last line break is blank (true at the start).
    line_blank: bool,
    /// Whitespace held so that an answer that is only a call shows no stray blank text.
    blank: String,
    calls: usize,
}

/// How the text at a candidate position resolves.
enum Resolution {
    /// More text is needed.
    More,
    /// The first `len` bytes are calls.
    Calls(usize, Vec<ToolCall>),
    /// The first `len` bytes are text after all (with a warning, for a marked block).
    Text(usize, Option<String>),
}

impl Recognizer {
    /// Recognizes calls of the tools named `names`.
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self {
            names: names.into_iter().collect(),
            buffer: String::new(),
            line_blank: true,
            blank: String::new(),
            calls: 0,
        }
    }

    /// Feeds a piece of the answer.
    pub fn push(&mut self, text: &str) -> Extracted {
        self.buffer.push_str(text);
        let mut out = Extracted::default();
        self.run(false, &mut out);
        out
    }

    /// The end of the answer: what is held is resolved or shown.
    pub fn finish(&mut self) -> Extracted {
        let mut out = Extracted::default();
        self.run(true, &mut out);
        let rest = std::mem::take(&mut self.buffer);
        self.show(&rest, &mut out);
        // Blank text around recovered calls is not an answer.
        if self.calls == 0 {
            out.text.push_str(&std::mem::take(&mut self.blank));
        }
        out
    }

    fn run(&mut self, end: bool, out: &mut Extracted) {
        loop {
            let (start, hold) = self.candidate();
            let Some(start) = start else {
                let shown: String = self.buffer.drain(..hold).collect();
                self.show(&shown, out);
                return;
            };
            let before: String = self.buffer.drain(..start).collect();
            self.show(&before, out);
            match self.resolve(end) {
                Resolution::More if self.buffer.len() > MAX_HOLD || end => {
                    // Not a call after all (or too long to be one): shown as written. The
                    // first character is shown alone so the scan moves past this start.
                    let first = self.buffer.chars().next().map_or(0, char::len_utf8);
                    let shown: String = self.buffer.drain(..first).collect();
                    self.show(&shown, out);
                    if self.buffer.len() > MAX_HOLD {
                        let all = std::mem::take(&mut self.buffer);
                        self.show(&all, out);
                    }
                }
                Resolution::More => return,
                Resolution::Calls(len, calls) => {
                    let raw: String = self.buffer.drain(..len).collect();
                    for (i, mut call) in calls.into_iter().enumerate() {
                        call.id = format!("call_text_{}", self.calls);
                        self.calls += 1;
                        out.calls.push(Recovered {
                            call,
                            // The raw text goes with the first of the calls it held.
                            raw: if i == 0 { raw.clone() } else { String::new() },
                        });
                    }
                    // A call is a block of its own: what follows starts a line.
                    self.line_blank = true;
                }
                Resolution::Text(len, warning) => {
                    let shown: String = self.buffer.drain(..len).collect();
                    self.show(&shown, out);
                    out.warnings.extend(warning);
                }
            }
        }
    }

    /// Shows `text`, holding trailing whitespace until more text follows.
    fn show(&mut self, text: &str, out: &mut Extracted) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.blank.push_str(text);
        } else {
            out.text.push_str(&std::mem::take(&mut self.blank));
            out.text.push_str(body);
            self.blank.push_str(&text[body.len()..]);
        }
        if let Some(i) = text.rfind('\n') {
            self.line_blank = text[i + 1..].chars().all(|c| c == ' ' || c == '\t');
        } else {
            self.line_blank &= text.chars().all(|c| c == ' ' || c == '\t');
        }
    }

    /// The first position where a call could start, and otherwise how much can be shown
    /// (all but a tail that could still become a marker or a fence).
    fn candidate(&self) -> (Option<usize>, usize) {
        let b = &self.buffer;
        let mut blank = self.line_blank;
        for (i, c) in b.char_indices() {
            let rest = &b[i..];
            if MARKERS.iter().any(|m| rest.starts_with(m)) {
                return (Some(i), i);
            }
            // A tail that may still grow into a marker or a fence.
            if MARKERS
                .iter()
                .any(|m| m.len() > rest.len() && m.starts_with(rest))
                || (blank && FENCE.len() > rest.len() && FENCE.starts_with(rest))
            {
                return (None, i);
            }
            if blank && (c == '{' || c == '[' || rest.starts_with(FENCE)) {
                return (Some(i), i);
            }
            match c {
                '\n' => blank = true,
                ' ' | '\t' => {}
                _ => blank = false,
            }
        }
        (None, b.len())
    }

    /// Resolves the candidate at the start of the buffer.
    // Long because one branch per tool-call dialect a model may write as text (<tool_call>, python_tag,
    // [TOOL_CALLS], fenced JSON), tried in order at the buffer's start.
    fn resolve(&self, end: bool) -> Resolution {
        let b = self.buffer.as_str();
        if let Some(body) = b.strip_prefix(TOOL_CALL_OPEN) {
            let (inner, len) = match body.find(TOOL_CALL_CLOSE) {
                Some(i) => (&body[..i], TOOL_CALL_OPEN.len() + i + TOOL_CALL_CLOSE.len()),
                None if end => (body, b.len()),
                None => return Resolution::More,
            };
            return self.marked(inner, len);
        }
        if let Some(body) = b.strip_prefix(PYTHON_TAG) {
            let stop = LLAMA_ENDS
                .iter()
                .filter_map(|e| body.find(e).map(|i| (i, e.len())))
                .min();
            let (inner, len) = match stop {
                Some((i, n)) => (&body[..i], PYTHON_TAG.len() + i + n),
                None if end => (body, b.len()),
                None => return Resolution::More,
            };
            return self.marked(inner, len);
        }
        if let Some(body) = b.strip_prefix(MISTRAL) {
            let lead = body.len() - body.trim_start().len();
            let trimmed = &body[lead..];
            if trimmed.starts_with('[') || trimmed.starts_with('{') {
                return match json_end(trimmed) {
                    Some(n) => self.marked(&trimmed[..n], MISTRAL.len() + lead + n),
                    None if end => self.marked(trimmed, b.len()),
                    None => Resolution::More,
                };
            }
            // `[TOOL_CALLS]name[ARGS]{...}`
            let Some(args_at) = body.find(MISTRAL_ARGS) else {
                return if end || body.len() > 256 {
                    self.marked(body, b.len().min(MISTRAL.len() + body.len()))
                } else {
                    Resolution::More
                };
            };
            let name = body[..args_at].trim();
            let args = &body[args_at + MISTRAL_ARGS.len()..];
            let lead = args.len() - args.trim_start().len();
            let Some(n) = json_end(&args[lead..]) else {
                return if end {
                    self.marked(body, b.len())
                } else {
                    Resolution::More
                };
            };
            let len = MISTRAL.len() + args_at + MISTRAL_ARGS.len() + lead + n;
            let parsed = serde_json::from_str::<Value>(&args[lead..lead + n]).ok();
            let value = parsed.map(|a| {
                let mut o = Map::new();
                o.insert("name".into(), Value::from(name));
                o.insert("arguments".into(), a);
                Value::Object(o)
            });
            return match value.and_then(|v| self.calls_in(&[v])) {
                Some(calls) => Resolution::Calls(len, calls),
                None => Resolution::Text(
                    len,
                    Some(format!(
                        "could not read a [TOOL_CALLS] block as a call of an offered tool, so it is shown as text (the server's tool-call parser, or toolMode: prompt, may help): {}",
                        excerpt(&b[..len])
                    )),
                ),
            };
        }
        if let Some(body) = b.strip_prefix(FENCE) {
            // ```json\n{...}\n```  (any info string; the block must hold only the call)
            let Some(newline) = body.find('\n') else {
                return if end {
                    Resolution::Text(b.len(), None)
                } else {
                    Resolution::More
                };
            };
            let info = body[..newline].trim();
            if info.contains(' ') || info.len() > 32 {
                return Resolution::Text(FENCE.len() + newline + 1, None);
            }
            let content = &body[newline + 1..];
            let (inner, len) = match find_closing_fence(content) {
                Some((i, n)) => (&content[..i], FENCE.len() + newline + 1 + i + n),
                None if end => (content, b.len()),
                None => {
                    // A block that cannot hold a call need not be held to its end.
                    let t = content.trim_start();
                    if !t.is_empty() && !t.starts_with('{') && !t.starts_with('[') {
                        return Resolution::Text(FENCE.len() + newline + 1, None);
                    }
                    return Resolution::More;
                }
            };
            return match values(inner).and_then(|v| self.calls_in(&v)) {
                Some(calls) => Resolution::Calls(len, calls),
                None => Resolution::Text(len, None),
            };
        }
        // A bare JSON value at the start of a line.
        match json_end(b) {
            Some(n) => {
                // Several calls may follow one another (`{...}; {...}` or one per line).
                let mut len = n;
                let mut found = vec![&b[..n]];
                loop {
                    let rest = &b[len..];
                    let skipped = rest.len()
                        - rest
                            .trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',')
                            .len();
                    let next = &rest[skipped..];
                    if !next.starts_with('{') {
                        if next.is_empty() && !end {
                            // Another call may still come.
                            return Resolution::More;
                        }
                        break;
                    }
                    match json_end(next) {
                        Some(m) => {
                            found.push(&next[..m]);
                            len += skipped + m;
                        }
                        None if end => break,
                        None => return Resolution::More,
                    }
                }
                let parsed: Option<Vec<Value>> = found
                    .iter()
                    .map(|s| serde_json::from_str::<Value>(s).ok())
                    .collect();
                match parsed.and_then(|v| self.calls_in(&v)) {
                    Some(calls) => Resolution::Calls(len, calls),
                    None => Resolution::Text(n, None),
                }
            }
            None if b.len() > 1 && !could_be_json(b) => Resolution::Text(1, None),
            None => Resolution::More,
        }
    }

    /// The calls of a marked block, or its text with a warning.
    fn marked(&self, inner: &str, len: usize) -> Resolution {
        match values(inner).and_then(|v| self.calls_in(&v)) {
            Some(calls) => Resolution::Calls(len, calls),
            None => Resolution::Text(
                len,
                Some(format!(
                    "could not read a tool call block as a call of an offered tool, so it is shown as text (the server's tool-call parser, or toolMode: prompt, may help): {}",
                    excerpt(inner)
                )),
            ),
        }
    }

    /// The calls `values` hold when every one of them is a call of an offered tool.
    fn calls_in(&self, values: &[Value]) -> Option<Vec<ToolCall>> {
        let mut flat = Vec::new();
        for v in values {
            match v {
                Value::Array(items) if !items.is_empty() => flat.extend(items.iter()),
                other => flat.push(other),
            }
        }
        let mut calls = Vec::new();
        for v in flat {
            let (name, input) = call_of(v)?;
            let name = name.strip_prefix("functions.").unwrap_or(name);
            if !self.names.iter().any(|n| n == name) {
                return None;
            }
            calls.push(ToolCall {
                id: String::new(),
                name: name.to_owned(),
                input,
            });
        }
        (!calls.is_empty()).then_some(calls)
    }
}

/// The notice that goes with recovered calls.
pub fn notice(calls: &[Recovered]) -> String {
    let names: Vec<&str> = calls.iter().map(|c| c.call.name.as_str()).collect();
    format!(
        "the model wrote {} as text; Kortex read {} as {} (toolMode: auto)",
        if names.len() == 1 {
            "a tool call"
        } else {
            "tool calls"
        },
        if names.len() == 1 { "it" } else { "them" },
        names.join(", ")
    )
}

/// `toolMode: auto`: tools go natively, and an answer with no native call whose text is a
/// call of an offered tool (see [`Recognizer`]) is answered as that call.
pub struct Recovering {
    inner: Arc<dyn LlmProvider>,
}

impl Recovering {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmProvider>) -> Self {
        Self { inner }
    }
}

fn offered(request: &ChatRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

/// Reads the calls of `request`'s tools written as text out of a stream: the calls come
/// at its end (before `Done`, which then says `tool_use`), announced by a notice when
/// `notice`. Text that looked like a call stays text when the answer also has native
/// calls; held text is shown when the stream breaks.
pub(super) fn read_stream(inner: ChatStream, request: &ChatRequest, notice: bool) -> ChatStream {
    let mut recognizer = Recognizer::new(offered(request));
    let mut recovered: Vec<Recovered> = Vec::new();
    let mut native = false;
    inner
        .flat_map(move |item| {
            let mut out: Vec<Result<StreamEvent, LlmError>> = Vec::new();
            let mut take = |e: Extracted, out: &mut Vec<Result<StreamEvent, LlmError>>| {
                if !e.text.is_empty() {
                    out.push(Ok(StreamEvent::TextDelta(e.text)));
                }
                recovered.extend(e.calls);
                out.extend(e.warnings.into_iter().map(|w| Ok(StreamEvent::Warning(w))));
            };
            match item {
                Ok(StreamEvent::TextDelta(t)) => take(recognizer.push(&t), &mut out),
                Ok(StreamEvent::ToolCall(c)) => {
                    native = true;
                    out.push(Ok(StreamEvent::ToolCall(c)));
                }
                Ok(StreamEvent::Done {
                    mut stop_reason,
                    usage,
                    model,
                }) => {
                    take(recognizer.finish(), &mut out);
                    let calls = std::mem::take(&mut recovered);
                    if native {
                        // The model called natively: text that looked like a call is
                        // just text.
                        let raw: String = calls.iter().map(|c| c.raw.as_str()).collect();
                        if !raw.is_empty() {
                            out.push(Ok(StreamEvent::TextDelta(raw)));
                        }
                    } else if !calls.is_empty() {
                        if notice {
                            out.push(Ok(StreamEvent::Warning(self::notice(&calls))));
                        }
                        out.extend(calls.into_iter().map(|c| Ok(StreamEvent::ToolCall(c.call))));
                        stop_reason = calling(stop_reason);
                    }
                    out.push(Ok(StreamEvent::Done {
                        stop_reason,
                        usage,
                        model,
                    }));
                }
                Err(e) => {
                    // The answer breaks off: what was held is shown as written.
                    let rest = recognizer.finish();
                    let mut text = rest.text;
                    for c in std::mem::take(&mut recovered).iter().chain(&rest.calls) {
                        text.push_str(&c.raw);
                    }
                    if !text.is_empty() {
                        out.push(Ok(StreamEvent::TextDelta(text)));
                    }
                    out.push(Err(e));
                }
                other => out.push(other),
            }
            futures_util::stream::iter(out)
        })
        .boxed()
}

/// [`read_stream`] for a whole answer that has no native calls.
pub(super) fn read_response(response: &mut ChatResponse, request: &ChatRequest, notice: bool) {
    if !response.tool_calls.is_empty() {
        return;
    }
    let mut recognizer = Recognizer::new(offered(request));
    let mut all = recognizer.push(&response.text);
    let rest = recognizer.finish();
    all.text.push_str(&rest.text);
    all.calls.extend(rest.calls);
    response
        .warnings
        .extend(all.warnings.into_iter().chain(rest.warnings));
    if all.calls.is_empty() {
        return;
    }
    response.text = all.text;
    if notice {
        response.warnings.push(self::notice(&all.calls));
    }
    response.tool_calls = all.calls.into_iter().map(|c| c.call).collect();
    response.stop_reason = calling(response.stop_reason);
}

/// The stop reason of an answer that turned out to call tools.
fn calling(stop_reason: StopReason) -> StopReason {
    match stop_reason {
        StopReason::EndTurn | StopReason::StopSequence => StopReason::ToolUse,
        other => other,
    }
}

impl LlmProvider for Recovering {
    delegate_to_inner!();

    fn stream<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatStream> {
        Box::pin(async move {
            let inner = self.inner.stream(request).await?;
            if request.tools.is_empty() {
                return Ok(inner);
            }
            Ok(read_stream(inner, request, true))
        })
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> LlmFuture<'a, ChatResponse> {
        Box::pin(async move {
            let mut response = self.inner.complete(request).await?;
            if !request.tools.is_empty() {
                read_response(&mut response, request, true);
            }
            Ok(response)
        })
    }
}

/// `name` and object arguments of one call value.
fn call_of(v: &Value) -> Option<(&str, Value)> {
    let o = v.as_object()?;
    if let Some(f) = o.get("function").filter(|f| f.is_object()) {
        return call_of(f);
    }
    let name = o.get("name")?.as_str()?;
    let args = ["arguments", "parameters", "input", "args"]
        .iter()
        .find_map(|k| o.get(*k));
    let input = match args {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok()?,
        Some(other) => other.clone(),
    };
    input.is_object().then_some((name, input))
}

/// The JSON values of a block: one value, or several separated by blanks, `;` or `,`.
fn values(text: &str) -> Option<Vec<Value>> {
    let text = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Some(vec![v]);
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let n = json_end(rest)?;
        out.push(serde_json::from_str::<Value>(&rest[..n]).ok()?);
        rest = rest[n..].trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
    }
    (!out.is_empty()).then_some(out)
}

/// The length of the JSON object or array at the start of `s`, once it is complete
/// (brackets balanced outside strings); `None` while it is not.
fn json_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ if i == 0 => return None,
            _ => {}
        }
    }
    None
}

/// Whether `s` (starting with `{` or `[`) may still be the start of a JSON call: a call
/// begins `{"` or `[{` (blanks allowed); `{ this is prose` does not.
fn could_be_json(s: &str) -> bool {
    let mut chars = s.chars();
    let first = chars.next();
    let next = chars.find(|c| !c.is_whitespace());
    match (first, next) {
        (Some('{'), Some(c)) => c == '"' || c == '}',
        (Some('['), Some(c)) => c == '{' || c == ']',
        _ => true,
    }
}

/// The closing fence of a block's content: its position and length (with the line break).
fn find_closing_fence(content: &str) -> Option<(usize, usize)> {
    let mut at = 0;
    for line in content.split_inclusive('\n') {
        if line.trim() == FENCE {
            return Some((at, line.len()));
        }
        at += line.len();
    }
    None
}

fn excerpt(s: &str) -> String {
    s.trim().chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names() -> Vec<String> {
        vec!["get_logs".into(), "get_incident_history".into()]
    }

    /// Feeds `pieces` and returns (shown text, calls as (name, input), warnings).
    fn feed(pieces: &[&str]) -> (String, Calls, usize) {
        let mut r = Recognizer::new(names());
        let mut all = Extracted::default();
        for p in pieces {
            let e = r.push(p);
            all.text.push_str(&e.text);
            all.calls.extend(e.calls);
            all.warnings.extend(e.warnings);
        }
        let e = r.finish();
        all.text.push_str(&e.text);
        all.calls.extend(e.calls);
        all.warnings.extend(e.warnings);
        let calls = all
            .calls
            .into_iter()
            .map(|c| (c.call.name, c.call.input))
            .collect();
        (all.text, calls, all.warnings.len())
    }

    /// Calls as (name, input).
    type Calls = Vec<(String, Value)>;

    fn one(name: &str, input: Value) -> Calls {
        vec![(name.to_owned(), input)]
    }

    /// Every format a model was seen to write, and what must come of it.
    fn cases() -> Vec<(&'static str, &'static str, Calls)> {
        let logs = || one("get_logs", json!({"namespace": "shop", "pod": "api-1"}));
        vec![
            (
                "fenced json",
                "```json\n{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}\n```",
                logs(),
            ),
            (
                "bare json",
                "{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}",
                logs(),
            ),
            (
                "llama parameters",
                "{\"name\": \"get_logs\", \"parameters\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}",
                logs(),
            ),
            (
                "python tag",
                "<|python_tag|>{\"name\": \"get_logs\", \"parameters\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}<|eom_id|>",
                logs(),
            ),
            (
                "hermes",
                "<tool_call>\n{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}\n</tool_call>",
                logs(),
            ),
            (
                "mistral array",
                "[TOOL_CALLS] [{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}]",
                logs(),
            ),
            (
                "mistral args",
                "[TOOL_CALLS]get_logs[ARGS]{\"namespace\": \"shop\", \"pod\": \"api-1\"}",
                logs(),
            ),
            (
                "openai shape, string arguments",
                "{\"type\": \"function\", \"function\": {\"name\": \"get_logs\", \"arguments\": \"{\\\"namespace\\\": \\\"shop\\\", \\\"pod\\\": \\\"api-1\\\"}\"}}",
                logs(),
            ),
            (
                "two calls",
                "<tool_call>{\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}</tool_call>\n<tool_call>{\"name\": \"get_incident_history\", \"arguments\": {}}</tool_call>",
                vec![
                    (
                        "get_logs".into(),
                        json!({"namespace": "shop", "pod": "api-1"}),
                    ),
                    ("get_incident_history".into(), json!({})),
                ],
            ),
            (
                "an array of calls",
                "[{\"name\": \"get_incident_history\", \"arguments\": {\"query\": \"oom\"}}, {\"name\": \"get_logs\", \"arguments\": {\"namespace\": \"shop\", \"pod\": \"api-1\"}}]",
                vec![
                    ("get_incident_history".into(), json!({"query": "oom"})),
                    (
                        "get_logs".into(),
                        json!({"namespace": "shop", "pod": "api-1"}),
                    ),
                ],
            ),
        ]
    }

    #[test]
    fn every_format_is_a_call_split_at_every_byte() {
        for (what, text, expected) in cases() {
            let (shown, calls, _) = feed(&[text]);
            assert_eq!(calls, expected, "{what}: whole");
            assert_eq!(shown, "", "{what}: nothing shown");
            let with_prose = format!("Let me check the logs.\n{text}\n");
            let bounds: Vec<usize> = (0..=with_prose.len())
                .filter(|i| with_prose.is_char_boundary(*i))
                .collect();
            for &cut in &bounds {
                let (shown, calls, _) = feed(&[&with_prose[..cut], &with_prose[cut..]]);
                assert_eq!(calls, expected, "{what}: cut at {cut}");
                assert_eq!(shown, "Let me check the logs.", "{what}: cut at {cut}");
            }
            // One character at a time.
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &with_prose[w[0]..w[1]]).collect();
            let (shown, calls, _) = feed(&pieces);
            assert_eq!(calls, expected, "{what}: char by char");
            assert_eq!(shown, "Let me check the logs.", "{what}: char by char");
        }
    }

    #[test]
    fn what_is_not_a_call_of_an_offered_tool_stays_text_as_written() {
        for text in [
            // A tool that is not offered (or a denied one).
            "{\"name\": \"delete_cluster\", \"arguments\": {}}",
            "```json\n{\"name\": \"delete_cluster\", \"arguments\": {}}\n```",
            // JSON that is data, not a call.
            "```json\n{\"replicas\": 3}\n```",
            "{\"status\": \"ok\", \"restarts\": 4}",
            "[1, 2, 3]",
            // Arguments that are not an object.
            "{\"name\": \"get_logs\", \"arguments\": 7}",
            // Prose and code.
            "The pod is {not} healthy: see [the docs] and `kubectl get pods`.",
            "```yaml\nreplicas: 3\n```\nDone.",
            "```\n{\"name\": \"get_logs\"\n```",
            "Use { and } carefully.\n{ braces at a line start }",
            "Unicode ✓ survives: “quotes” and 日本語.",
        ] {
            let bounds: Vec<usize> = (0..=text.len())
                .filter(|i| text.is_char_boundary(*i))
                .collect();
            for &cut in &bounds {
                let (shown, calls, _) = feed(&[&text[..cut], &text[cut..]]);
                assert!(calls.is_empty(), "{text:?} cut at {cut}: {calls:?}");
                assert_eq!(shown, text, "{text:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn an_unreadable_marked_block_is_shown_with_a_warning() {
        let (shown, calls, warnings) = feed(&["<tool_call>not json</tool_call> done"]);
        assert!(calls.is_empty());
        assert_eq!(shown, "<tool_call>not json</tool_call> done");
        assert_eq!(warnings, 1);
    }

    #[test]
    fn an_unterminated_call_at_the_end_still_counts() {
        let (_, calls, _) = feed(&["<tool_call>{\"name\": \"get_logs\", \"arguments\": {}}"]);
        assert_eq!(calls, one("get_logs", json!({})));
        let (_, calls, _) = feed(&["```json\n{\"name\": \"get_logs\", \"arguments\": {}}\n"]);
        assert_eq!(calls, one("get_logs", json!({})));
    }

    #[tokio::test]
    async fn held_text_is_shown_when_the_stream_breaks_in_either_mode() {
        use futures_util::StreamExt;
        let request = ChatRequest {
            tools: vec![super::super::ToolSpec {
                name: "get_logs".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            }],
            ..Default::default()
        };
        for notice in [true, false] {
            let inner = futures_util::stream::iter(vec![
                Ok(StreamEvent::TextDelta(
                    "Checking:\n{\"name\": \"get_l".into(),
                )),
                Err(LlmError::new(
                    super::super::ErrorKind::Connection,
                    "p",
                    "closed",
                )),
            ])
            .boxed();
            let out: Vec<_> = read_stream(inner, &request, notice).collect().await;
            let text: String = out
                .iter()
                .filter_map(|e| match e {
                    Ok(StreamEvent::TextDelta(t)) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(text, "Checking:\n{\"name\": \"get_l", "notice {notice}");
            assert!(matches!(out.last(), Some(Err(_))), "{out:?}");
        }
    }

    #[test]
    fn the_hold_is_bounded() {
        let long = format!("{{\"name\": \"{}", "x".repeat(MAX_HOLD + 10));
        let mut r = Recognizer::new(names());
        let e = r.push(&long);
        assert_eq!(e.text.len(), long.len(), "shown once past the bound");
        assert!(r.buffer.is_empty());
    }
}
