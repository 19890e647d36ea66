//! Traces from the binary a user runs: `kortex serve` pointed at an OTLP/HTTP collector (a
//! receiver here that decodes what arrives with the `opentelemetry-proto` types). A chat run
//! with a tool call and a gateway call each arrive as one trace continuing the caller's
//! `traceparent`, with the GenAI attributes; content only under a policy that opts in, and
//! then redacted; the trace id reaches the provider, the HTTP plugin, the audit rows, the
//! session JSON and the latency histograms' exemplars. A dead collector changes nothing.

use crate::support::chat::{chat_once, get_json, open_session, session_json, wait_idle};
use crate::support::manifests::{docs, gateway_key, manifest_dir, policy, provider, secret, tool};
use crate::support::net::{eventually, header, http_client, serve};
use crate::support::plugins::{mcp_server, upstream};
use crate::support::provider::{Script, mock, push, push_answer, tool_calls};
use crate::support::server::{Server, start_run_with_env};
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

const GATEWAY_KEY: &str = "kx-traces-gw-1";
const UPSTREAM_SECRET: &str = "sk-upstream-SECRET-9313";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const GW_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const GW_CALLER_SPAN: &str = "b7ad6b7169203331";

/// One received span, flattened.
#[derive(Clone, Debug)]
struct Span {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    status: i32,
    attrs: HashMap<String, Value>,
    service: String,
}

fn any(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> Value {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => json!(s),
        Some(Any::IntValue(i)) => json!(i),
        Some(Any::BoolValue(b)) => json!(b),
        Some(Any::DoubleValue(d)) => json!(d),
        Some(Any::ArrayValue(a)) => {
            Value::Array(a.values.iter().map(|x| any(&Some(x.clone()))).collect())
        }
        _ => Value::Null,
    }
}

type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP trace receiver on 127.0.0.1.
async fn collector() -> (String, Received) {
    let spans: Received = Arc::default();
    let keep = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let keep = keep.clone();
            async move {
                let out = decode(&body);
                if let Ok(mut s) = keep.lock() {
                    s.extend(out);
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    (serve(app).await, spans)
}

/// The spans of an OTLP export request.
fn decode(body: &[u8]) -> Vec<Span> {
    let request = ExportTraceServiceRequest::decode(body).expect("not an OTLP trace export");
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| any(&a.value))
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Span {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name.clone(),
                    kind: s.kind,
                    status: s.status.as_ref().map_or(0, |st| st.code),
                    attrs: s
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), any(&a.value)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Waits until the collector holds a span of `trace` named `name`.
async fn span_named(spans: &Received, trace: &str, name: &str) -> Span {
    eventually(&format!("span {name:?} of trace {trace}"), || async {
        let all = spans.lock().map(|s| s.clone()).unwrap_or_default();
        all.iter()
            .find(|s| s.trace_id == trace && s.name == name)
            .cloned()
            .ok_or_else(|| {
                let names: Vec<String> = all
                    .iter()
                    .map(|s| format!("{} ({})", s.name, &s.trace_id[..8]))
                    .collect();
                format!("received: {names:?}")
            })
    })
    .await
}

fn of_trace(spans: &Received, trace: &str) -> Vec<Span> {
    spans
        .lock()
        .map(|s| s.iter().filter(|x| x.trace_id == trace).cloned().collect())
        .unwrap_or_default()
}

fn manifests(dir: &Path, base: &str, bridge: &str) {
    std::fs::write(
        dir.join("all.yaml"),
        docs(&[
            secret("upstream-key", &format!("key: {UPSTREAM_SECRET}")),
            gateway_key("gateway-shop", "shop", "incidents", GATEWAY_KEY),
            provider(
                "upstream",
                &format!(
                    "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, \
                     apiKeySecretRef: {{name: upstream-key, key: key}}"
                ),
            ),
            policy(
                "incidents",
                "sessions: [incident-*], provider: upstream, maxToolDepth: 4",
            ),
            policy(
                "audited",
                "sessions: [audit-*], provider: upstream, maxToolDepth: 4, \
                 privacy: {redactPii: true}, telemetry: {captureContent: true}",
            ),
            tool(
                "jira-search",
                &format!(
                    "name: jira_search, description: Search Jira issues with JQL., \
                     http: {{method: POST, url: '{bridge}/jira/search'}}, \
                     parameters: {{type: object, properties: {{jql: {{type: string}}}}, \
                     required: [jql]}}"
                ),
            ),
        ]),
    )
    .unwrap();
}

fn traceparent_of(headers: &axum::http::HeaderMap) -> String {
    header(headers, "traceparent")
}

/// A `kortex serve` on the test manifests with `env`, a scripted provider that will ask for
/// `jira_search` and then answer, and the HTTP tool's upstream.
struct Setup {
    server: Server,
    script: Arc<Script>,
    bridge_seen: Arc<Mutex<Vec<crate::support::plugins::Seen>>>,
    _dir: tempfile::TempDir,
}

async fn setup(env: &[(&str, &str)]) -> Setup {
    let (base, script) = mock().await;
    let (bridge, bridge_seen) = upstream().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base, &bridge);
    let server = Server::start(&m, &dir.path().join("k.db"), env);
    push(
        &script,
        tool_calls(&[("call_1", "jira_search", json!({"jql": "project = SHOP"}))]),
    );
    push_answer(&script, &["SHOP-12 is the cause."]);
    Setup {
        server,
        script,
        bridge_seen,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_chat_run_and_a_gateway_call_arrive_as_genai_traces() {
    let (otlp, spans) = collector().await;
    let Setup {
        server,
        script,
        bridge_seen,
        _dir,
    } = setup(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_SERVICE_NAME", "kortex-traces-test"),
    ])
    .await;
    let client = http_client();

    // A chat run with one tool call, started by a caller that sends its own traceparent.
    let id = open_session(&server, json!({"name": "incident-1"})).await;
    let posted = client
        .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
        .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .header("tracestate", "vendor=abc")
        .json(&json!({"content": "why is checkout failing?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    let session = wait_idle(&client, &server.url(&format!("/chat/v1/sessions/{id}"))).await;

    // The span tree: the request (child of the caller's span) > the run > its steps > the
    // provider calls and the tool call.
    let request = span_named(&spans, TRACE, "POST /chat/v1/sessions/{id}/messages").await;
    let run = span_named(&spans, TRACE, "invoke_agent kortex").await;
    let step1 = span_named(&spans, TRACE, "step 1").await;
    let step2 = span_named(&spans, TRACE, "step 2").await;
    let tool = span_named(&spans, TRACE, "execute_tool jira_search").await;
    let calls: Vec<Span> = {
        span_named(&spans, TRACE, "chat m1").await;
        eventually("both provider call spans", || async {
            let c: Vec<Span> = of_trace(&spans, TRACE)
                .into_iter()
                .filter(|s| s.name == "chat m1")
                .collect();
            if c.len() == 2 {
                Ok(c)
            } else {
                Err(format!("{} so far", c.len()))
            }
        })
        .await
    };
    assert_eq!(
        request.parent, CALLER_SPAN,
        "the caller's span is the parent"
    );
    assert_eq!(request.kind, 2, "SERVER");
    assert_eq!(request.service, "kortex-traces-test");
    assert_eq!(request.attrs["http.request.method"], "POST");
    assert_eq!(
        request.attrs["http.route"],
        "/chat/v1/sessions/{id}/messages"
    );
    assert_eq!(request.attrs["http.response.status_code"], 202);
    assert_eq!(run.parent, request.span_id);
    assert_eq!(run.attrs["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run.attrs["gen_ai.conversation.id"], json!(id));
    assert_eq!(run.attrs["kortex.run.state"], "completed");
    assert_ne!(run.status, 2, "a completed run's span is not an error");
    assert_eq!(step1.parent, run.span_id);
    assert_eq!(step2.parent, run.span_id);
    assert_eq!(tool.parent, step1.span_id);
    assert_eq!(tool.attrs["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool.attrs["gen_ai.tool.name"], "jira_search");
    assert_eq!(tool.attrs["gen_ai.tool.call.id"], "call_1");
    let first = calls
        .iter()
        .find(|c| c.parent == step1.span_id)
        .unwrap_or_else(|| panic!("no provider call under step 1: {calls:?}"));
    let second = calls
        .iter()
        .find(|c| c.parent == step2.span_id)
        .unwrap_or_else(|| panic!("no provider call under step 2: {calls:?}"));
    assert_eq!(first.kind, 3, "CLIENT");
    assert_eq!(first.attrs["gen_ai.operation.name"], "chat");
    assert_eq!(first.attrs["gen_ai.provider.name"], "openai");
    assert_eq!(first.attrs["kortex.provider"], "upstream");
    assert_eq!(first.attrs["server.address"], "127.0.0.1");
    assert!(first.attrs["server.port"].is_i64(), "{first:?}");
    assert_eq!(first.attrs["gen_ai.request.model"], "m1");
    assert_eq!(first.attrs["gen_ai.response.model"], "gpt-test");
    assert_eq!(first.attrs["gen_ai.usage.input_tokens"], 40);
    assert_eq!(first.attrs["gen_ai.usage.output_tokens"], 60);
    assert_eq!(
        first.attrs["gen_ai.response.finish_reasons"],
        json!(["tool_call"])
    );
    assert!(
        first.attrs["gen_ai.request.max_tokens"].is_i64(),
        "{first:?}"
    );
    assert_eq!(second.attrs["gen_ai.usage.input_tokens"], 25);
    assert_eq!(
        second.attrs["gen_ai.response.finish_reasons"],
        json!(["stop"])
    );
    // No content by default, on any span of the run.
    for s in of_trace(&spans, TRACE) {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert!(!s.attrs.contains_key(key), "{key} on {}: {s:?}", s.name);
        }
        let text = format!("{:?}", s.attrs);
        assert!(!text.contains("checkout failing"), "content leaked: {s:?}");
        assert!(!text.contains(UPSTREAM_SECRET), "secret leaked: {s:?}");
    }

    // Database calls: summarized, never their SQL text.
    let db = span_named(&spans, TRACE, "INSERT chat_messages chat_events").await;
    assert_eq!(db.kind, 3, "CLIENT");
    assert_eq!(db.attrs["db.system.name"], "sqlite");
    assert_eq!(
        db.attrs["db.query.summary"],
        "INSERT chat_messages chat_events"
    );
    for s in of_trace(&spans, TRACE) {
        let text = format!("{:?}", s.attrs);
        assert!(
            !text.contains("INSERT INTO") && !text.contains("VALUES ("),
            "SQL text on {}: {text}",
            s.name
        );
    }

    // The trace went on at the provider and at the HTTP plugin, under the right spans.
    let seen = script.seen.lock().map(|s| s.clone()).unwrap_or_default();
    let provider_parents: Vec<String> = seen
        .iter()
        .filter(|s| s.path.ends_with("/chat/completions"))
        .map(|s| traceparent_of(&s.headers))
        .collect();
    assert_eq!(
        provider_parents,
        [
            format!("00-{TRACE}-{}-01", first.span_id),
            format!("00-{TRACE}-{}-01", second.span_id)
        ]
    );
    let bridge_calls = bridge_seen.lock().map(|s| s.clone()).unwrap_or_default();
    let jira = bridge_calls
        .iter()
        .find(|s| s.target.starts_with("/jira/search"))
        .expect("the HTTP tool was not called");
    assert_eq!(
        traceparent_of(&jira.headers),
        format!("00-{TRACE}-{}-01", tool.span_id)
    );
    assert_eq!(
        jira.headers.get("tracestate").and_then(|v| v.to_str().ok()),
        Some("vendor=abc"),
        "tracestate goes on with the trace"
    );

    // The transcript and the audit log point at the trace.
    let assistant = session["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "assistant")
        .cloned()
        .unwrap_or_default();
    assert_eq!(assistant["traceId"], TRACE, "{session}");
    let audit = get_json(&client, server.url(&format!("/api/v1/audit?session={id}"))).await;
    let rows = audit["items"].as_array().cloned().unwrap_or_default();
    assert!(
        rows.iter().any(|r| r["kind"] == "llm_call"),
        "no llm_call rows: {audit}"
    );
    for r in rows
        .iter()
        .filter(|r| r["kind"] == "llm_call" || r["kind"] == "tool_call")
    {
        assert_eq!(r["traceId"], TRACE, "{r}");
    }

    // Exemplars: the tool's latency histogram carries the trace id (OpenMetrics).
    let (_, metrics) = server.get("/metrics").await;
    let exemplar = format!("# {{trace_id=\"{TRACE}\"}}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kortex_tool_duration_seconds_bucket") && l.contains(&exemplar)),
        "no exemplar in:\n{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("kortex_tool_duration"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kortex_llm_call_duration_seconds_bucket")
                && l.contains(&exemplar)),
        "no exemplar on kortex_llm_call_duration_seconds"
    );

    // A gateway call: the caller's trace, the server span, one client span per call.
    push_answer(&script, &["pong"]);
    let answer = client
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(GATEWAY_KEY)
        .header("traceparent", format!("00-{GW_TRACE}-{GW_CALLER_SPAN}-01"))
        .json(&json!({"model": "m1", "stream": true, "max_tokens": 64,
            "messages": [{"role": "user", "content": "ping"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.text().await.unwrap_or_default();
    assert!(body.contains("pong"), "{body}");
    let gw = span_named(&spans, GW_TRACE, "POST /v1/chat/completions").await;
    let call = span_named(&spans, GW_TRACE, "chat m1").await;
    assert_eq!(gw.parent, GW_CALLER_SPAN);
    assert_eq!(call.parent, gw.span_id);
    assert_eq!(call.attrs["gen_ai.request.max_tokens"], 64);
    assert_eq!(call.attrs["gen_ai.usage.output_tokens"], 15);
    assert_eq!(
        call.attrs["gen_ai.response.finish_reasons"],
        json!(["stop"])
    );
    assert!(!call.attrs.contains_key("gen_ai.input.messages"));
    let last = script
        .seen
        .lock()
        .map(|s| s.last().cloned())
        .unwrap_or_default()
        .expect("the provider saw nothing");
    assert_eq!(
        traceparent_of(&last.headers),
        format!("00-{GW_TRACE}-{}-01", call.span_id)
    );
    let gateway_row = eventually("the gateway call's audit row", || async {
        let audit: Value = client
            .get(server.url("/api/v1/audit?kind=llm_call"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        audit["items"]
            .as_array()
            .and_then(|i| {
                i.iter()
                    .find(|r| r["detail"]["source"] == "gateway")
                    .cloned()
            })
            .ok_or_else(|| format!("{audit}"))
    })
    .await;
    assert_eq!(gateway_row["traceId"], GW_TRACE, "{gateway_row}");

    // Content, under the policy that opts in: redacted first.
    push_answer(&script, &["Mail alice@example.com about it."]);
    let audit_id = chat_once(
        &server,
        json!({"name": "audit-1"}),
        &format!("key {UPSTREAM_SECRET} leaked, ask bob@example.com"),
    )
    .await;
    let captured = eventually("the captured provider call", || async {
        let all = spans.lock().map(|s| s.clone()).unwrap_or_default();
        let run = all
            .iter()
            .find(|s| {
                s.name == "invoke_agent kortex"
                    && s.attrs["gen_ai.conversation.id"] == json!(audit_id)
            })
            .ok_or_else(|| "no run span yet".to_owned())?;
        all.iter()
            .find(|s| s.trace_id == run.trace_id && s.name == "chat m1")
            .cloned()
            .ok_or_else(|| "no provider call span yet".to_owned())
    })
    .await;
    let input = captured.attrs["gen_ai.input.messages"]
        .as_str()
        .unwrap_or_else(|| panic!("no input messages: {captured:?}"))
        .to_owned();
    let input: Value = serde_json::from_str(&input).unwrap_or_else(|e| panic!("{e}: {input}"));
    let question = input
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| {
            m["parts"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default();
    assert!(question.contains("leaked, ask"), "{input}");
    assert!(
        !question.contains(UPSTREAM_SECRET),
        "the secret reached a span: {input}"
    );
    assert!(
        !question.contains("bob@example.com"),
        "PII reached a span: {input}"
    );
    let output = captured.attrs["gen_ai.output.messages"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(output.contains("\"role\":\"assistant\""), "{output}");
    assert!(output.contains("Mail "), "{output}");
    assert!(
        !output.contains("alice@example.com"),
        "PII reached a span: {output}"
    );
    assert!(captured.attrs.contains_key("gen_ai.system_instructions"));
}

#[tokio::test]
async fn a_dead_collector_changes_no_outcome() {
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        format!("http://{a}")
    };
    let Setup {
        server,
        script,
        _dir,
        ..
    } = setup(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", dead.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "500"),
    ])
    .await;
    let client = http_client();
    let id = chat_once(&server, json!({"name": "incident-2"}), "why?").await;
    let session = session_json(&server, &id).await;
    assert_eq!(session["status"], "idle", "{session}");
    let last = session["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or_default();
    assert_eq!(last["content"], "SHOP-12 is the cause.", "{session}");
    push_answer(&script, &["pong"]);
    let answer = client
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(GATEWAY_KEY)
        .json(&json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "ping"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // The spans that could not be sent are counted, and the server says why, once.
    eventually("dropped spans counted", || async {
        let (_, metrics) = server.get("/metrics").await;
        metrics
            .lines()
            .find(|l| l.starts_with("kortex_trace_spans_dropped_total{reason=\"export_failed\"}"))
            .filter(|l| !l.ends_with(" 0"))
            .map(str::to_owned)
            .ok_or_else(|| "no export_failed drops yet".to_owned())
    })
    .await;
    let log = server.log();
    assert!(log.contains("cannot export traces"), "{log}");
    assert_eq!(log.matches("cannot export traces").count(), 1, "{log}");
}

#[tokio::test]
async fn an_mcp_server_gets_the_trace_in_meta() {
    let Some(mcp) = mcp_server("mcp-token-7") else {
        return;
    };
    let (otlp, spans) = collector().await;
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    std::fs::write(
        m.join("all.yaml"),
        docs(&[
            secret("mcp", "token: mcp-token-7"),
            provider(
                "upstream",
                &format!("type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1"),
            ),
            policy(
                "incidents",
                "sessions: ['*'], provider: upstream, maxToolDepth: 4",
            ),
            tool(
                "grafana",
                &format!(
                    "mcp: {{url: '{url}', auth: {{type: bearer, secretRef: {{name: mcp, \
                     key: token}}}}, include: [trace_context]}}",
                    url = mcp.url
                ),
            ),
        ]),
    )
    .unwrap();
    let server = Server::start(
        &m,
        &dir.path().join("k.db"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let client = http_client();
    eventually("the MCP tool discovered", || async {
        let tools: Value = client
            .get(server.url("/api/v1/tools"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        tools
            .to_string()
            .contains("grafana__trace_context")
            .then_some(())
            .ok_or_else(|| format!("{tools}"))
    })
    .await;
    push(
        &script,
        tool_calls(&[("call_m", "grafana__trace_context", json!({}))]),
    );
    push_answer(&script, &["done"]);
    let id = chat_once(&server, json!({"name": "mcp-1"}), "trace?").await;
    let session = session_json(&server, &id).await;
    let result = session["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("no tool result: {session}"));
    let trace = session["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|m| m["traceId"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no traceId: {session}"));
    let tool = span_named(&spans, &trace, "execute_tool grafana__trace_context").await;
    assert_eq!(result, format!("00-{trace}-{}-01", tool.span_id));
}

/// An OTLP/gRPC trace receiver on 127.0.0.1 (HTTP/2, the generated TraceService).
async fn grpc_collector() -> (String, Received) {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    struct Sink(Received);
    #[async_trait::async_trait]
    impl TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let bytes = request.into_inner().encode_to_vec();
            let spans = decode(&bytes);
            if let Ok(mut s) = self.0.lock() {
                s.extend(spans);
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }
    let spans: Received = Arc::default();
    let service = TraceServiceServer::new(Sink(spans.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            tokio::spawn(async move {
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(stream),
                            hyper_util::service::TowerToHyperService::new(service),
                        )
                        .await;
            });
        }
    });
    (format!("http://{addr}"), spans)
}

#[tokio::test]
async fn traces_go_over_grpc_when_asked() {
    let (otlp, spans) = grpc_collector().await;
    // The gateway call takes the first scripted reply (a tool call: a stream like any).
    let Setup { server, _dir, .. } = setup(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ])
    .await;
    let answer = http_client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(GATEWAY_KEY)
        .header("traceparent", format!("00-{GW_TRACE}-{GW_CALLER_SPAN}-01"))
        .json(&json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "ping"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let gw = span_named(&spans, GW_TRACE, "POST /v1/chat/completions").await;
    let call = span_named(&spans, GW_TRACE, "chat m1").await;
    assert_eq!(gw.parent, GW_CALLER_SPAN);
    assert_eq!(call.parent, gw.span_id);
    assert_eq!(call.service, "kortex", "the default service name");
}

/// Cluster mode: the leader's status writes are spans of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_traces_the_leaders_status_writes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (otlp, spans) = collector().await;
    let fake = crate::support::fake_api::FakeApi::start().await;
    let (llm, _script) = mock().await;
    fake.apply("chatpolicies", json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "all", "namespace": "team-a"}, "spec": {"sessions": ["*"], "provider": "gpt"}}));
    let dir = tempfile::tempdir().unwrap();
    let _server = start_run_with_env(
        &fake,
        dir.path(),
        &llm,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let reconcile = eventually("a status write span", || async {
        spans
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
            .into_iter()
            .find(|s| {
                s.name == "reconcile ChatPolicy"
                    && s.attrs.get("kortex.object.name") == Some(&json!("all"))
            })
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    assert_eq!(reconcile.attrs["k8s.namespace.name"], "team-a");
    assert_eq!(reconcile.attrs["kortex.object.kind"], "ChatPolicy");
    assert_eq!(reconcile.parent, "", "a status write is a trace of its own");
}
