//! HTTP plumbing shared by the adapters: the client (the egress guard, timeouts, CA bundle,
//! proxies from the environment), error mapping, bounded reads, and the two streaming
//! framings — Server-Sent Events (Anthropic, OpenAI) and newline-delimited JSON (Ollama) —
//! as pure decoders.

use super::{ChatStream, ErrorKind, LlmError, ProviderConfig, StreamEvent};
use crate::catalog::SecretValue;
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::time::Duration;

/// Longest error body read from a provider.
const MAX_ERROR_BODY: usize = 16 * 1024;
/// Longest JSON answer read (an embeddings batch is the largest a provider sends).
pub const MAX_BODY: usize = 64 * 1024 * 1024;
/// Longest SSE or NDJSON line of a stream.
pub const MAX_LINE: usize = 4 * 1024 * 1024;
/// Most bytes one streamed answer may take.
pub const MAX_STREAM: usize = 64 * 1024 * 1024;

/// The HTTP client of one provider, behind the egress guard ([`crate::egress`]): its
/// endpoint may not be a metadata service, the API server or (in cluster mode) loopback
/// unless `allow_private` (`allowPrivateTargets`), and never Kortex itself; redirects are
/// not followed. `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` of the environment (set by whoever
/// deploys Kortex, not by an `LLMProvider`) are honoured.
pub fn client(
    config: &ProviderConfig,
    ca_bundle: Option<&SecretValue>,
    allow_private: bool,
) -> Result<reqwest::Client, LlmError> {
    let egress = crate::egress::current();
    let base = reqwest::Url::parse(&config.base_url).map_err(|e| {
        LlmError::new(
            ErrorKind::Config,
            &config.name,
            format!("spec.baseUrl {:?} is not a URL: {e}", config.base_url),
        )
    })?;
    egress
        .check_url(&base, allow_private)
        .map_err(|e| LlmError::new(ErrorKind::Config, &config.name, e))?;
    let mut builder = reqwest::Client::builder()
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = ca_bundle {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem.expose().as_bytes()).map_err(|e| {
                LlmError::new(
                    ErrorKind::Config,
                    &config.name,
                    format!("caBundleSecretRef is not a PEM bundle: {e}"),
                )
            })?;
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    egress
        .client(allow_private, builder, true)
        .map_err(|e| LlmError::new(ErrorKind::Config, &config.name, e))
}

/// The error of a provider answer over a size limit.
fn too_large(config: &ProviderConfig, what: &str, limit: usize) -> LlmError {
    LlmError::new(
        ErrorKind::Upstream,
        &config.name,
        format!("{what} exceeded {} MiB; the rest was not read", limit >> 20),
    )
}

/// Maps a transport error.
pub fn transport_error(config: &ProviderConfig, e: &reqwest::Error) -> LlmError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Connection
    };
    // reqwest's Display includes the URL but never headers, so the key cannot appear.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    LlmError::new(kind, &config.name, message)
        .redact(config.api_key.as_ref().map(SecretValue::expose))
}

/// Sends `request` and waits for the response head within the timeout. Non-2xx statuses
/// become typed errors with the provider's own message.
pub async fn send(
    config: &ProviderConfig,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::Response, LlmError> {
    let mut request = request;
    for (name, value) in &config.headers {
        request = request.header(name.as_str(), value.expose());
    }
    // The call's trace goes on at the provider (W3C Trace Context).
    for (name, value) in crate::telemetry::trace::headers() {
        request = request.header(name, value);
    }
    let response = match tokio::time::timeout(config.timeout, request.send()).await {
        Err(_) => {
            return Err(LlmError::new(
                ErrorKind::Timeout,
                &config.name,
                format!("no response within {}s", config.timeout.as_secs_f64()),
            ));
        }
        Ok(Err(e)) => return Err(transport_error(config, &e)),
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    if status.is_redirection() {
        // Redirects are not followed: one could lead anywhere, past the egress guard.
        let to = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("elsewhere");
        let to = reqwest::Url::parse(to)
            .map(|u| format!("{}://{}", u.scheme(), u.host_str().unwrap_or_default()))
            .unwrap_or_else(|_| "another address".to_owned());
        return Err(LlmError::new(
            ErrorKind::Config,
            &config.name,
            format!(
                "the endpoint answered {status} and redirects to {to}; Kortex does not follow redirects: set spec.baseUrl to the final address"
            ),
        ));
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let body = read_limited(response, config.timeout).await;
    let message = error_message(&body);
    Err(
        LlmError::from_status(&config.name, status.as_u16(), message, retry_after)
            .redact(config.api_key.as_ref().map(SecretValue::expose)),
    )
}

async fn read_limited(response: reqwest::Response, timeout: Duration) -> String {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ERROR_BODY {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    body.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&body).into_owned()
}

/// The human message of a provider error body: `error.message` (OpenAI, Anthropic),
/// `error` as a string (Ollama), `message`, or the raw text.
pub fn error_message(body: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return body.trim().chars().take(500).collect();
    };
    v.pointer("/error/message")
        .or_else(|| v.get("error").filter(|e| e.is_string()))
        .or_else(|| v.get("message"))
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| body.trim().chars().take(500).collect())
}

/// Reads a JSON response body within the timeout.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    config: &ProviderConfig,
    response: reqwest::Response,
) -> Result<T, LlmError> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY as u64)
    {
        return Err(too_large(config, "the response body", MAX_BODY));
    }
    let bytes = match tokio::time::timeout(
        config.timeout,
        crate::egress::read_capped(response, MAX_BODY),
    )
    .await
    {
        Err(_) => {
            return Err(LlmError::new(
                ErrorKind::Timeout,
                &config.name,
                "response body not received in time",
            ));
        }
        Ok(Err(e)) => return Err(transport_error(config, &e)),
        Ok(Ok((_, true))) => return Err(too_large(config, "the response body", MAX_BODY)),
        Ok(Ok((bytes, false))) => bytes,
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        LlmError::new(
            ErrorKind::Protocol,
            &config.name,
            format!("unexpected response body: {e}"),
        )
    })
}

/// A non-streamed call: `request` is built afresh for each attempt, the JSON body is
/// parsed by `parse`, retries follow the provider's policy, and the latency is stamped.
pub async fn complete_json(
    config: &ProviderConfig,
    request: impl Fn() -> reqwest::RequestBuilder,
    parse: fn(&str, &serde_json::Value) -> Result<super::ChatResponse, LlmError>,
) -> Result<super::ChatResponse, LlmError> {
    let started = std::time::Instant::now();
    let mut response = super::retry::call_with_retry(config.retry, || async {
        let response = send(config, request()).await?;
        let v: serde_json::Value = json_body(config, response).await?;
        parse(&config.name, &v)
    })
    .await?;
    response.latency_ms = started.elapsed().as_millis() as u64;
    Ok(response)
}

/// A streamed call: `request` is built afresh for each attempt, its body decoded by a new
/// `decoder`, with the retry rules of [`super::retry::stream_with_retry`].
pub async fn stream_call<D: Decoder>(
    config: &ProviderConfig,
    request: impl Fn() -> reqwest::RequestBuilder,
    framing: Framing,
    convert: fn(Frame) -> D::Item,
    decoder: impl Fn() -> D,
) -> Result<ChatStream, LlmError> {
    super::retry::stream_with_retry(config.retry, || async {
        let response = send(config, request()).await?;
        Ok(decode(config, response, framing, convert, decoder()))
    })
    .await
}

/// Calls a models endpoint and returns the ids it lists (see [`model_ids`]).
pub async fn list_models(
    config: &ProviderConfig,
    request: reqwest::RequestBuilder,
    list: &str,
    field: &str,
) -> Result<Vec<String>, LlmError> {
    let response = send(config, request).await?;
    let v: serde_json::Value = json_body(config, response).await?;
    Ok(model_ids(&v, list, field))
}

/// The model ids of a models endpoint's answer: `list` is the array's key, `field` each
/// item's id field.
pub fn model_ids(v: &serde_json::Value, list: &str, field: &str) -> Vec<String> {
    v.get(list)
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|m| {
                    m.get(field)
                        .and_then(serde_json::Value::as_str)
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// `id:` (empty when absent).
    pub id: String,
    /// `event:` (empty when absent).
    pub event: String,
    /// `data:` lines joined with `\n`.
    pub data: String,
}

/// Incremental SSE parser (WHATWG rules: `\n`, `\r\n` or `\r` line ends; `:` comments;
/// multi-line `data`).
#[derive(Default)]
pub struct SseDecoder {
    buffer: String,
    pending: Vec<u8>,
    event: SseEvent,
    has_data: bool,
}

impl SseDecoder {
    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        // Decode everything but a code point split at the end (kept for the next chunk);
        // invalid bytes become U+FFFD, the same however the bytes arrive.
        let mut valid = 0;
        loop {
            match std::str::from_utf8(&self.pending[valid..]) {
                Ok(s) => {
                    valid += s.len();
                    break;
                }
                Err(e) => match e.error_len() {
                    None => {
                        valid += e.valid_up_to();
                        break;
                    }
                    Some(n) => valid += e.valid_up_to() + n,
                },
            }
        }
        let chunk: Vec<u8> = self.pending.drain(..valid).collect();
        self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        let mut out = Vec::new();
        while let Some(pos) = self.buffer.find(['\n', '\r']) {
            let line: String = self.buffer[..pos].to_owned();
            let mut skip = 1;
            if self.buffer[pos..].starts_with("\r\n") {
                skip = 2;
            } else if self.buffer[pos..].starts_with('\r') && pos + 1 == self.buffer.len() {
                // A lone `\r` at the end may be the first half of `\r\n`: wait for more.
                break;
            }
            self.buffer.drain(..pos + skip);
            self.line(&line, &mut out);
        }
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data || !self.event.event.is_empty() {
                out.push(std::mem::take(&mut self.event));
            }
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event.event = value.to_owned(),
            "id" => self.event.id = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }

    /// How many bytes wait for the end of their line or event.
    pub fn buffered(&self) -> usize {
        self.buffer.len() + self.pending.len() + self.event.data.len()
    }

    /// Whatever event was left without its blank line at the end of the stream.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let pending = std::mem::take(&mut self.pending);
        self.buffer.push_str(&String::from_utf8_lossy(&pending));
        let rest = std::mem::take(&mut self.buffer);
        let mut out = Vec::new();
        if !rest.is_empty() {
            self.line(&rest, &mut out);
        }
        self.line("", &mut out);
        out.pop()
    }
}

/// Incremental newline-delimited JSON splitter.
#[derive(Default)]
pub struct NdjsonDecoder {
    buffer: Vec<u8>,
}

impl NdjsonDecoder {
    /// Feeds bytes; returns complete non-empty lines.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line).trim().to_owned();
            if !text.is_empty() {
                out.push(text);
            }
        }
        out
    }

    /// How many bytes wait for the end of their line.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// A last line without a newline.
    pub fn finish(&mut self) -> Option<String> {
        let text = String::from_utf8_lossy(&std::mem::take(&mut self.buffer))
            .trim()
            .to_owned();
        (!text.is_empty()).then_some(text)
    }
}

/// Turns framed items (SSE events or NDJSON lines) into [`StreamEvent`]s.
pub trait Decoder: Send + 'static {
    /// The framing's item.
    type Item: Send + 'static;
    /// Handles one item.
    fn feed(&mut self, item: Self::Item) -> Result<Vec<StreamEvent>, LlmError>;
    /// Whether the protocol's final event was seen.
    fn is_done(&self) -> bool;
    /// The end of the body: an error when the protocol's final event never came.
    fn finish(&mut self) -> Result<Vec<StreamEvent>, LlmError>;
}

/// A decoder's `finish`: nothing more when the protocol's final event (`before`) was seen,
/// else the protocol error of a stream that ended before it.
pub fn ended(done: bool, provider: &str, before: &str) -> Result<Vec<StreamEvent>, LlmError> {
    if done {
        return Ok(Vec::new());
    }
    Err(LlmError::new(
        ErrorKind::Protocol,
        provider,
        format!("stream ended before {before}"),
    ))
}

/// Which framing a body uses.
#[derive(Clone, Copy)]
pub enum Framing {
    /// Server-Sent Events.
    Sse,
    /// Newline-delimited JSON.
    Ndjson,
}

/// The framed items of a streaming response body, each read within the idle timeout.
fn frames<T: Send + 'static>(
    config: &ProviderConfig,
    response: reqwest::Response,
    framing: Framing,
    convert: fn(Frame) -> T,
) -> futures_util::stream::BoxStream<'static, Result<T, LlmError>> {
    struct State {
        body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
        sse: SseDecoder,
        nd: NdjsonDecoder,
        queue: VecDeque<Frame>,
        ended: bool,
        config: ProviderConfig,
        framing: Framing,
        /// Bytes read so far.
        total: usize,
        /// When the answer began.
        started: std::time::Instant,
        /// The error that ends the stream once the complete items before it are out.
        error: Option<LlmError>,
    }
    let state = State {
        body: response.bytes_stream().boxed(),
        sse: SseDecoder::default(),
        nd: NdjsonDecoder::default(),
        queue: VecDeque::new(),
        ended: false,
        config: config.clone(),
        framing,
        total: 0,
        started: std::time::Instant::now(),
        error: None,
    };
    futures_util::stream::unfold(state, move |mut st| async move {
        loop {
            if let Some(frame) = st.queue.pop_front() {
                return Some((Ok(convert(frame)), st));
            }
            if let Some(e) = st.error.take() {
                return Some((Err(e), st));
            }
            if st.ended {
                return None;
            }
            match tokio::time::timeout(st.config.timeout, st.body.next()).await {
                Err(_) => {
                    st.ended = true;
                    let secs = st.config.timeout.as_secs_f64();
                    let e = LlmError::new(
                        ErrorKind::Timeout,
                        &st.config.name,
                        format!("stream stalled: no data for {secs}s"),
                    );
                    return Some((Err(e), st));
                }
                Ok(Some(Err(e))) => {
                    st.ended = true;
                    // Mid-answer: said in words a user acts on; reqwest's chain is detail.
                    let raw = transport_error(&st.config, &e);
                    let secs = st.started.elapsed().as_secs_f64();
                    let e = LlmError::new(
                        raw.kind,
                        &st.config.name,
                        format!("closed the connection {secs:.1} s into the answer"),
                    )
                    .with_detail(raw.message);
                    return Some((Err(e), st));
                }
                Ok(Some(Ok(bytes))) => {
                    st.total += bytes.len();
                    let line = match st.framing {
                        Framing::Sse => {
                            st.queue
                                .extend(st.sse.push(&bytes).into_iter().map(Frame::Sse));
                            st.sse.buffered()
                        }
                        Framing::Ndjson => {
                            st.queue
                                .extend(st.nd.push(&bytes).into_iter().map(Frame::Line));
                            st.nd.buffered()
                        }
                    };
                    // An endless answer or line ends the stream instead of the memory.
                    let over = if st.total > MAX_STREAM {
                        Some(too_large(&st.config, "the streamed answer", MAX_STREAM))
                    } else if line > MAX_LINE {
                        Some(too_large(&st.config, "a line of the stream", MAX_LINE))
                    } else {
                        None
                    };
                    // What was complete before the limit still goes out, then the error.
                    if let Some(e) = over {
                        st.ended = true;
                        st.error = Some(e);
                    }
                }
                Ok(None) => {
                    st.ended = true;
                    match st.framing {
                        Framing::Sse => st.queue.extend(st.sse.finish().map(Frame::Sse)),
                        Framing::Ndjson => st.queue.extend(st.nd.finish().map(Frame::Line)),
                    }
                }
            }
        }
    })
    .boxed()
}

/// A framed item.
pub enum Frame {
    /// An SSE event.
    Sse(SseEvent),
    /// An NDJSON line.
    Line(String),
}

/// Drives `decoder` over the body of `response`: the provider-agnostic event stream.
pub fn decode<D: Decoder>(
    config: &ProviderConfig,
    response: reqwest::Response,
    framing: Framing,
    convert: fn(Frame) -> D::Item,
    decoder: D,
) -> ChatStream {
    struct State<D: Decoder> {
        frames: futures_util::stream::BoxStream<'static, Result<D::Item, LlmError>>,
        decoder: D,
        queue: VecDeque<StreamEvent>,
        finished: bool,
    }
    let state = State {
        frames: frames(config, response, framing, convert),
        decoder,
        queue: VecDeque::new(),
        finished: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.finished {
                return None;
            }
            let next = if st.decoder.is_done() {
                None
            } else {
                st.frames.next().await
            };
            let result = match next {
                Some(Ok(item)) => st.decoder.feed(item),
                Some(Err(e)) => Err(e),
                None => {
                    st.finished = true;
                    st.decoder.finish()
                }
            };
            match result {
                Ok(events) => st.queue.extend(events),
                Err(e) => {
                    st.finished = true;
                    return Some((Err(e), st));
                }
            }
        }
    })
    .boxed()
}

/// `Frame` → SSE event (for SSE decoders).
pub fn sse(frame: Frame) -> SseEvent {
    match frame {
        Frame::Sse(e) => e,
        Frame::Line(l) => SseEvent {
            data: l,
            ..Default::default()
        },
    }
}

/// `Frame` → line (for NDJSON decoders).
pub fn line(frame: Frame) -> String {
    match frame {
        Frame::Line(l) => l,
        Frame::Sse(e) => e.data,
    }
}

/// Parses a JSON frame, or names the provider and the broken chunk.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    provider: &str,
    data: &str,
) -> Result<T, LlmError> {
    serde_json::from_str(data).map_err(|e| {
        let shown: String = data.chars().take(200).collect();
        LlmError::new(
            ErrorKind::Protocol,
            provider,
            format!("malformed stream chunk ({e}): {shown}"),
        )
    })
}

/// Parses tool-call arguments assembled from deltas (empty means `{}`).
pub fn parse_arguments(
    provider: &str,
    tool: &str,
    raw: &str,
) -> Result<serde_json::Value, LlmError> {
    if raw.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_str(raw).map_err(|e| {
        LlmError::new(
            ErrorKind::Protocol,
            provider,
            format!("arguments of tool call {tool} are not valid JSON: {e}"),
        )
    })
}

/// A JSON array of numbers as an embedding vector.
pub fn vector(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_f64)
        .map(|x| x as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_handles_split_chunks_crlf_comments_and_multiline_data() {
        let mut d = SseDecoder::default();
        let mut out = d.push(b"event: message_start\r\ndata: {\"a\":");
        assert!(out.is_empty());
        out.extend(d.push(b"1}\r\n\r\n: ping comment\n\ndata: line1\ndata: line2\n\ndata: caf"));
        out.extend(d.push(&[0xc3]));
        out.extend(d.push(&[0xa9, b'\n', b'\n']));
        assert_eq!(
            out,
            vec![
                SseEvent {
                    id: String::new(),
                    event: "message_start".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    id: String::new(),
                    event: String::new(),
                    data: "line1\nline2".into()
                },
                SseEvent {
                    id: String::new(),
                    event: String::new(),
                    data: "café".into()
                },
            ]
        );
        d.push(b"data: [DONE]");
        assert_eq!(
            d.finish(),
            Some(SseEvent {
                id: String::new(),
                event: String::new(),
                data: "[DONE]".into()
            })
        );
    }

    #[test]
    fn ndjson_splits_lines() {
        let mut d = NdjsonDecoder::default();
        assert_eq!(d.push(b"{\"a\":1}\n{\"b\""), vec!["{\"a\":1}".to_owned()]);
        assert_eq!(d.push(b":2}\n\n"), vec!["{\"b\":2}".to_owned()]);
        d.push(b"{\"c\":3}");
        assert_eq!(d.finish(), Some("{\"c\":3}".to_owned()));
    }

    #[test]
    fn error_messages_from_each_vendor() {
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#
            ),
            "invalid x-api-key"
        );
        assert_eq!(
            error_message(r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#),
            "Rate limit reached"
        );
        assert_eq!(
            error_message(r#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(
            error_message("upstream connect error"),
            "upstream connect error"
        );
    }
}
