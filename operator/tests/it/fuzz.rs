//! Hostile input: property-based fuzzing (proptest, stable Rust) of the parsers that take
//! outside bytes — the SSE and NDJSON decoders of provider streams, tool-call arguments,
//! manifest files, glob patterns, text tool calls, redaction, the HTTP API's request bodies,
//! MCP messages and HTTP tools' URL templates. No panic, bounded buffers, a specific error,
//! and the same answer however the bytes are split.
//!
//! Budget: `KORTEX_FUZZ_CASES` cases per property (default 256, what CI runs; set it to
//! 100000 for a long run). Failures found are kept in `proptest-regressions/` and replayed
//! first on every run; the hand-made corpus below (YAML bombs, deep nesting, huge strings)
//! runs every time.

use crate::support::app::harness;
use kortex::llm::{NdjsonDecoder, SseDecoder, recover::Recognizer};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("KORTEX_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Bytes that look like a provider stream more often than random bytes would.
fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"event: message\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b": keep-alive\n".to_vec()),
        Just(b"data: [DONE]\n\n".to_vec()),
        Just(b"{\"choices\": [{\"delta\": {\"content\": \"x\"}}]}".to_vec()),
        Just(vec![0xff, 0xfe, 0x00]),
        proptest::collection::vec(any::<u8>(), 0..32),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|p| p.concat())
}

/// Splits `bytes` at `cuts` (positions taken modulo the length).
fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| if bytes.is_empty() { 0 } else { c % bytes.len() })
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for a in at {
        out.push(bytes[start..a].to_vec());
        start = a;
    }
    out.push(bytes[start..].to_vec());
    out
}

fn sse_events(chunks: &[Vec<u8>]) -> Vec<(String, String)> {
    let mut d = SseDecoder::default();
    let mut out: Vec<(String, String)> = Vec::new();
    for c in chunks {
        out.extend(d.push(c).into_iter().map(|e| (e.event, e.data)));
    }
    out.extend(d.finish().map(|e| (e.event, e.data)));
    out
}

fn ndjson_lines(chunks: &[Vec<u8>]) -> Vec<String> {
    let mut d = NdjsonDecoder::default();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(d.push(c));
    }
    out.extend(d.finish());
    out
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes, however split: no panic, and the same events as in one piece.
    #[test]
    fn sse_decoding_does_not_depend_on_how_the_bytes_arrive(
        bytes in stream_bytes(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let whole = sse_events(std::slice::from_ref(&bytes));
        let pieces = sse_events(&split(&bytes, &cuts));
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn ndjson_decoding_does_not_depend_on_how_the_bytes_arrive(
        bytes in stream_bytes(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let whole = ndjson_lines(std::slice::from_ref(&bytes));
        let pieces = ndjson_lines(&split(&bytes, &cuts));
        prop_assert_eq!(whole, pieces);
    }

    /// Tool-call arguments from a provider: parsed JSON, `{}` for nothing, or a protocol error
    /// naming the tool (whether it is an object is the tool's schema check, later).
    #[test]
    fn tool_arguments_parse_or_fail_cleanly(raw in "\\PC{0,64}|\\{[\"a-z:, 0-9\\[\\]{}]{0,40}") {
        match kortex::llm::parse_arguments("p", "t", &raw) {
            Ok(v) => {
                let empty = serde_json::json!({});
                prop_assert!(!raw.trim().is_empty() || v == empty, "{}", v);
            }
            Err(e) => prop_assert!(e.message.contains("not valid JSON"), "{}", e.message),
        }
    }

    /// Manifest files of any text: loaded or refused with problems, never a panic.
    #[test]
    fn manifests_of_any_text_load_or_explain(text in "(\\PC|\\n|---\\n|: |- |\\{|\\}|\\[|\\]|&a |\\*a){0,200}") {
        let outcome = kortex::source::manifest::parse_file(std::path::Path::new("f.yaml"), &text, &|_| None);
        // Every document that failed is explained.
        prop_assert!(outcome.failed.is_empty() || !outcome.problems.is_empty());
    }

    /// Glob patterns from policies: any pattern against any text, and `*` matches all.
    #[test]
    fn globs_never_panic_and_star_matches_everything(pattern in "[a-z*?\\-\\[\\]]{0,12}", text in "\\PC{0,24}") {
        let _ = kortex::glob::matches(&pattern, &text);
        prop_assert!(kortex::glob::matches("*", &text));
        if !pattern.contains('*') && !pattern.contains('?') && !pattern.contains('[') {
            prop_assert_eq!(kortex::glob::matches(&pattern, &text), pattern == text);
        }
    }

    /// Text a model writes, split anywhere: what is not a call comes through unchanged.
    #[test]
    fn text_without_calls_comes_through_unchanged(
        text in "(\\PC|\\n|```|\\{|\\}|\\[|<tool_call>|</tool_call>|<\\|python_tag\\|>|\\[TOOL_CALLS\\]|\"name\": ){0,60}",
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut r = Recognizer::new(vec!["get_logs".to_owned()]);
        let mut shown = String::new();
        let mut calls = 0;
        let bytes = text.as_bytes();
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.sort_unstable();
        for a in at {
            if a >= start && text.is_char_boundary(a) {
                pieces.push(&text[start..a]);
                start = a;
            }
        }
        pieces.push(&text[start..]);
        for p in pieces {
            let e = r.push(p);
            shown.push_str(&e.text);
            calls += e.calls.len();
        }
        let e = r.finish();
        shown.push_str(&e.text);
        calls += e.calls.len();
        if calls == 0 {
            prop_assert_eq!(shown, text);
        }
    }

    /// Redaction of any text: no panic, and a planted secret never survives.
    #[test]
    fn redaction_never_lets_a_planted_secret_through(before in "\\PC{0,80}", after in "\\PC{0,80}") {
        let secret = kortex::catalog::SecretValue::new("canary-Zq7xW2-value");
        let redactor = kortex::redact::Redactor::new(
            kortex::redact::SecretRedactor::new([&secret]),
            &kortex::crd::Privacy { redact_secrets: true, redact_pii: true },
        );
        let (out, _) = redactor.text(&format!("{before}canary-Zq7xW2-value{after}"));
        prop_assert!(!out.contains("canary-Zq7xW2-value"), "{}", out);
    }
}

/// The hand-made corpus: inputs known to hurt parsers, every run.
#[test]
fn hostile_manifests_are_refused_not_fatal() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let bomb = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n\
        b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n\
        d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n\
        f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n\
        h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
        .to_owned();
    let huge = format!(
        "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: p}}\nspec: {{type: ollama, defaultModel: \"{}\"}}\n",
        "m".repeat(4 << 20)
    );
    let duplicate = "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nkind: ChatPolicy\nmetadata: {name: p}\nspec: {type: ollama}\n";
    for (what, text) in [
        ("deep nesting", deep.as_str()),
        ("billion laughs", bomb.as_str()),
        ("a 4 MiB string", huge.as_str()),
        ("duplicate keys", duplicate),
    ] {
        let outcome =
            kortex::source::manifest::parse_file(std::path::Path::new("f.yaml"), text, &|_| None);
        let problems = format!("{:?}", outcome.problems);
        assert!(
            !outcome.problems.is_empty() || what == "a 4 MiB string",
            "{what}: accepted without a word"
        );
        assert!(problems.len() < 64 * 1024, "{what}: a bounded message");
    }
}

/// A stream line that never ends is bounded by the decoder's caller (4 MiB, see
/// `llm/wire.rs`): the decoder reports what it holds, so the cap can be applied.
#[test]
fn an_endless_line_is_visible_to_the_cap() {
    let mut d = SseDecoder::default();
    for _ in 0..64 {
        assert!(d.push(&[b'x'; 1024]).is_empty());
    }
    assert!(d.buffered() >= 64 * 1024);
    let mut n = NdjsonDecoder::default();
    assert!(n.push(&[b'{'; 4096]).is_empty());
    assert!(n.buffered() >= 4096);
}

/// JSON values of any shape, with the strings and numbers hostile input likes.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        "\\PC{0,40}".prop_map(Value::String),
        Just(json!("../../etc/passwd")),
        Just(json!("\u{0000}\u{202e}\u{feff}")),
        Just(json!("*")),
        Just(json!("x".repeat(70_000))),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_owned()),
                    Just("namespace".to_owned()),
                    Just("content".to_owned()),
                    Just("results".to_owned()),
                    Just("toolCallId".to_owned()),
                    Just("reason".to_owned()),
                    Just("clientTools".to_owned()),
                    Just("dynamicTools".to_owned()),
                    "[a-zA-Z]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request body: JSON of any shape, or bytes that are not JSON at all.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => Just(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()),
        1 => Just(b"{\"content\": \"\xff\xfe\"}".to_vec()),
    ]
}

/// Every HTTP API endpoint that takes a body, fed any body with and without a JSON content
/// type: the answer is a 2xx or a specific 4xx with a JSON error code — never a 5xx, a
/// panic or a hang — and the server keeps serving.
#[test]
fn api_bodies_of_any_shape_get_an_answer_not_a_fault() {
    use axum::body::Body;
    use axum::http::{Request, header};
    use kortex::http::auth::AuthMode;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let h = rt.block_on(harness(AuthMode::Loopback));
    let post = |path: &str, content_type: &str, body: Vec<u8>| {
        Request::post(path)
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .unwrap()
    };
    let (status, _, created) = rt.block_on(crate::support::app::call(
        &h.app,
        post(
            "/chat/v1/sessions",
            "application/json",
            br#"{"name": "fuzz", "namespace": "team-a"}"#.to_vec(),
        ),
    ));
    assert_eq!(status.as_u16(), 201, "{created}");
    let id = serde_json::from_str::<serde_json::Value>(&created).unwrap_or_default()["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let paths = [
        "/chat/v1/sessions".to_owned(),
        format!("/chat/v1/sessions/{id}/messages"),
        format!("/chat/v1/sessions/{id}/tool-results"),
        format!("/chat/v1/sessions/{id}/cancel"),
        "/chat/v1/proposals/p-1/approve".to_owned(),
        "/chat/v1/proposals/p-1/reject".to_owned(),
        "/auth/v1/login".to_owned(),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let strategy = (
        0..paths.len(),
        body(),
        prop_oneof![Just("application/json"), Just("text/plain"), Just("")],
    );
    runner
        .run(&strategy, |(path, body, content_type)| {
            let path = &paths[path];
            let (status, _, text) = rt.block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    crate::support::app::call(&h.app, post(path, content_type, body)),
                )
                .await
                .unwrap_or_else(|_| panic!("{path}: no answer within 10 s"))
            });
            prop_assert!(status.as_u16() < 500, "{path}: {status} {text}");
            if status.is_client_error() {
                let error: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                prop_assert!(
                    error["error"]["code"].is_string(),
                    "{path}: {status} without a JSON error: {text}"
                );
            }
            Ok(())
        })
        .unwrap();
    let (status, _, _) = rt.block_on(crate::support::app::call(
        &h.app,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    ));
    assert_eq!(status.as_u16(), 200);
}

proptest! {
    #![proptest_config(config())]

    /// HTTP tool URL templates: any template parses or is refused with a reason; any
    /// argument values expand to a URL on the template's own scheme, host and port with no
    /// `.`/`..` segment from the values, or are refused as invalid.
    #[test]
    fn url_templates_keep_their_host_whatever_the_arguments(
        raw in prop_oneof![
            "https?://[a-z.]{1,12}(:[0-9]{1,5})?(/[a-z{}_]{0,10}){0,4}(\\?[a-z=&{}]{0,12})?",
            "\\PC{0,40}",
        ],
        values in prop::collection::vec(
            prop_oneof![
                "\\PC{0,24}",
                Just("..".to_owned()),
                Just("a/../../b".to_owned()),
                Just("@evil.example".to_owned()),
                Just("//evil.example/x".to_owned()),
                Just("%2e%2e".to_owned()),
                Just("?x=1#y".to_owned()),
                Just("\\..\\x".to_owned()),
            ],
            0..4,
        ),
    ) {
        use kortex::catalog::url_template::UrlTemplate;
        let Ok(template) = UrlTemplate::parse(&raw) else { return Ok(()) };
        let args: serde_json::Map<String, serde_json::Value> = template
            .placeholders
            .iter()
            .zip(values.iter().cycle())
            .map(|(name, v)| (name.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let base = reqwest::Url::parse(&raw.replace(['{', '}'], "")).ok();
        match template.expand(&args) {
            Ok(url) => {
                if let Some(base) = base {
                    prop_assert_eq!(
                        (url.scheme(), url.host_str(), url.port_or_known_default()),
                        (base.scheme(), base.host_str(), base.port_or_known_default()),
                        "{} with {:?}", raw, args
                    );
                }
                prop_assert!(
                    !url.path().split('/').any(|s| s == ".." || s == "%2e%2e"),
                    "{} climbed: {}", raw, url
                );
            }
            Err(e) => prop_assert!(!e.is_empty(), "an empty error for {} with {:?}", raw, args),
        }
    }

    /// MCP messages from a server: any JSON either is a JSON-RPC message rmcp reads or is
    /// refused by it, without a panic; a tool result of any content renders within
    /// `maxResultBytes` plus the truncation note.
    #[test]
    fn mcp_messages_parse_or_fail_and_results_render_within_bounds(
        value in json_value(),
        texts in prop::collection::vec("\\PC{0,200}", 0..5),
        max in 1usize..512,
    ) {
        let _ = serde_json::from_value::<rmcp::model::ServerJsonRpcMessage>(value.clone());
        let message = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": value});
        let _ = serde_json::from_value::<rmcp::model::ServerJsonRpcMessage>(message);
        let content: Vec<serde_json::Value> = texts
            .iter()
            .map(|t| serde_json::json!({"type": "text", "text": t}))
            .collect();
        let result: rmcp::model::CallToolResult = serde_json::from_value(
            serde_json::json!({"content": content, "structuredContent": value}),
        )
        .unwrap();
        let rendered = kortex::tools::mcp::render(&result, max);
        let note = format!(
            "\n[truncated: the result is longer than maxResultBytes ({max} bytes)]"
        );
        prop_assert!(rendered.len() <= max + note.len(), "{} > {}", rendered.len(), max);
    }
}
