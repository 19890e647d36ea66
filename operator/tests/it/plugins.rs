//! Plugin tools from `KortexTool` resources: HTTP tools against a local server (auth,
//! hostile parameter values, timeouts, 5xx, caps, refused targets, allowedSessions) and MCP
//! tools against a real MCP server (the Python SDK's, started by the test).

use crate::support::db::sqlite;
use crate::support::manifests::{docs, secret, tool};
use crate::support::plugins::{Seen, mcp_server, mcp_server_on, upstream};
use crate::support::tools::{tool_context, tool_policy};
use kortex::live::LiveConfig;
use kortex::llm::ToolCall;
use kortex::metrics::Metrics;
use kortex::source::ManifestSource;
use kortex::tools::plugins::{PluginHost, PluginSet};
use kortex::tools::{Outcome, Router, ToolContext};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Loads manifests written to a temporary folder.
fn config(dir: &Path, yaml: &str) -> LiveConfig {
    std::fs::write(dir.join("m.yaml"), yaml).unwrap();
    let mut src = ManifestSource::new(vec![dir.to_path_buf()], Box::new(|_| None)).unwrap();
    let now = jiff::Timestamp::now();
    LiveConfig::build(src.load(now), None, now)
}

/// The plugin manager over `config`, and a router serving its tools.
pub(crate) struct Plugins {
    pub(crate) router: Router,
    set: watch::Receiver<Arc<PluginSet>>,
    config: watch::Sender<Arc<LiveConfig>>,
    _stop: watch::Sender<bool>,
}

impl Plugins {
    pub(crate) fn start(config: LiveConfig) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (config_tx, config_rx) = watch::channel(Arc::new(config));
        let (set_tx, set_rx) = watch::channel(Arc::new(PluginSet::default()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let host = PluginHost::new(std::sync::Arc::new(kortex::egress::Egress::default())).unwrap();
        tokio::spawn(kortex::tools::plugins::run(
            config_rx, set_tx, host, stop_rx,
        ));
        Self {
            router: Router::new(Arc::new(Metrics::default())).with_plugins(set_rx.clone()),
            set: set_rx,
            config: config_tx,
            _stop: stop_tx,
        }
    }

    /// Waits (up to 30 s) until the plugin set satisfies `ready`.
    pub(crate) async fn wait(&mut self, what: &str, ready: impl Fn(&PluginSet) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !ready(&self.set.borrow_and_update()) {
            if tokio::time::timeout_at(deadline, self.set.changed())
                .await
                .is_err()
            {
                let set = self.set.borrow();
                panic!(
                    "timed out waiting for {what}; discovery: {:?}, problems: {:?}",
                    set.discovery, set.problems
                );
            }
        }
    }
}

async fn call(router: &Router, ctx: &ToolContext, name: &str, input: Value) -> Outcome {
    let call = ToolCall {
        id: format!("c-{name}"),
        name: name.into(),
        input,
    };
    router
        .execute(
            ctx.clone(),
            &call,
            &tool_policy(json!({})),
            std::future::pending(),
        )
        .await
}

fn http_manifests(base: &str) -> String {
    docs(&[
        secret(
            "bridge",
            "token: tok-123, key: key-456, basic: 'ops:pa55:word'",
        ),
        tool(
            "jira-get",
            &format!(
                "description: Read one Jira issue., http: {{url: '{base}/issues/{{key}}/view', \
                 headers: [{{name: Accept, value: application/json}}], auth: {{type: bearer, \
                 secretRef: {{name: bridge, key: token}}}}}}, parameters: {{type: object, \
                 properties: {{key: {{type: string}}, fields: {{type: array, \
                 items: {{type: string}}}}, limit: {{type: integer, default: 10}}}}, \
                 required: [key]}}"
            ),
        ),
        tool(
            "jira-search",
            &format!(
                "name: jira_search, description: Search Jira., http: {{method: POST, \
                 url: '{base}/search', auth: {{type: apiKey, header: X-API-Key, \
                 secretRef: {{name: bridge, key: key}}}}}}, parameters: {{type: object, \
                 properties: {{jql: {{type: string}}}}, required: [jql]}}"
            ),
        ),
        tool(
            "basic",
            &format!(
                "description: Basic auth., http: {{url: '{base}/basic', auth: {{type: basic, \
                 secretRef: {{name: bridge, key: basic}}}}}}"
            ),
        ),
        tool(
            "echo-basic",
            &format!(
                "description: Echoes the request headers., http: {{url: '{base}/echo', \
                 auth: {{type: basic, secretRef: {{name: bridge, key: basic}}}}}}"
            ),
        ),
        tool(
            "echo-bearer",
            &format!(
                "description: Echoes the request headers., http: {{url: '{base}/echo', \
                 auth: {{type: bearer, secretRef: {{name: bridge, key: token}}}}}}"
            ),
        ),
        tool(
            "flaky",
            &format!("description: Fails., http: {{url: '{base}/fail'}}"),
        ),
        tool(
            "sluggish",
            &format!("description: Slow., timeout: 1s, http: {{url: '{base}/slow'}}"),
        ),
        tool(
            "bulky",
            &format!("description: Big., maxResultBytes: 1000, http: {{url: '{base}/big'}}"),
        ),
        tool(
            "metadata",
            "description: Cloud metadata., http: {url: 'http://169.254.169.254/latest/meta-data/'}",
        ),
        tool(
            "incident-only",
            &format!(
                "description: Only for incidents., allowedSessions: [incident-*], \
                 http: {{url: '{base}/incident'}}"
            ),
        ),
        tool(
            "hostile-host",
            "description: Host from a parameter., http: {url: 'http://{host}/x'}, \
             parameters: {type: object, properties: {host: {type: string}}}",
        ),
        format!(
            r#"apiVersion: kortex.dev/v1alpha1
kind: KortexTool
metadata: {{name: other-ns, namespace: team-b}}
spec: {{description: Another namespace., http: {{url: "{base}/b"}}}}
"#
        ),
    ])
}

fn last_seen(seen: &Mutex<Vec<Seen>>) -> Option<Seen> {
    seen.lock().ok().and_then(|s| s.last().cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_plugin_tools_call_their_endpoint_safely() {
    let (base, seen) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &http_manifests(&base));
    // A placeholder in the host is refused when the resource is compiled.
    let hostile = config
        .catalog
        .tools
        .values()
        .find(|t| t.tool_name == "hostile_host")
        .expect("hostile-host not loaded");
    let accepted = hostile
        .object
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Accepted"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    assert!(
        matches!(&accepted, Some((s, r, m)) if s == "False" && r == "InvalidSpec" && m.contains("host")),
        "{accepted:?}"
    );

    // The metadata service is refused when the resource is compiled: not ready, with the
    // reason, never offered, nothing sent (issue 44: it showed Ready=True and failed
    // every call).
    let metadata = config
        .catalog
        .tools
        .values()
        .find(|t| t.tool_name == "metadata")
        .unwrap_or_else(|| panic!("metadata not loaded"));
    let ready = metadata
        .object
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    assert!(
        matches!(&ready, Some((s, r, m)) if s == "False" && r == "EgressRefused"
            && m.contains("169.254.169.254") && m.contains("allowPrivateTargets")),
        "{ready:?}"
    );
    assert!(!metadata.available);
    let redactor = config.catalog.redactor.clone();
    let mut plugins = Plugins::start(config);
    plugins
        .wait("http tools", |s| s.get("default", "jira_get").is_some())
        .await;
    let db = sqlite().await;
    let mut ctx = tool_context(&db.store, "checkout-debug").await;
    ctx.redactor = kortex::redact::Redactor::secrets_only(redactor);
    let router = &plugins.router;

    // Offered: this namespace's tools the session may use, never another namespace's.
    let offered: Vec<String> = router
        .offered(&tool_policy(json!({})), &ctx.session, &ctx.kube)
        .into_iter()
        .map(|t| t.name)
        .collect();
    for name in [
        "jira_get",
        "jira_search",
        "basic",
        "flaky",
        "get_incident_history",
    ] {
        assert!(offered.contains(&name.to_owned()), "{name} in {offered:?}");
    }
    for name in ["incident_only", "other_ns", "hostile_host"] {
        assert!(!offered.contains(&name.to_owned()), "{name} in {offered:?}");
    }

    // Hostile values stay inside their path segment; the rest goes to the query string;
    // the bearer token comes from the Secret.
    let out = call(
        router,
        &ctx,
        "jira_get",
        json!({"key": "..x/admin?x=1#frag@evil.example", "fields": ["summary", "status"]}),
    )
    .await;
    assert!(!out.is_error, "{out:?}");
    assert!(out.content.contains("OPS-1"), "{out:?}");
    let req = last_seen(&seen).expect("no request");
    assert_eq!(req.method, "GET");
    assert_eq!(
        req.target,
        "/issues/..x%2Fadmin%3Fx%3D1%23frag%40evil.example/view?fields=summary&fields=status&limit=10"
    );
    assert_eq!(req.headers["authorization"], "Bearer tok-123");
    assert_eq!(req.headers["accept"], "application/json");
    for dots in ["..", ".", "../admin", "a/../../admin"] {
        let out = call(router, &ctx, "jira_get", json!({"key": dots})).await;
        assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    }

    // POST: arguments as a JSON body, the API key in its header.
    let out = call(router, &ctx, "jira_search", json!({"jql": "project = OPS"})).await;
    assert!(!out.is_error, "{out:?}");
    let req = last_seen(&seen).expect("no request");
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("POST", "/search")
    );
    assert_eq!(req.headers["x-api-key"], "key-456");
    assert_eq!(
        serde_json::from_str::<Value>(&req.body).unwrap_or_default(),
        json!({"jql": "project = OPS"})
    );
    let out = call(router, &ctx, "jira_search", json!({})).await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    assert!(out.content.contains("jql"), "{out:?}");

    // Basic auth: user:password split at the first colon.
    let out = call(router, &ctx, "basic", json!({})).await;
    assert!(!out.is_error, "{out:?}");
    let req = last_seen(&seen).expect("no request");
    assert_eq!(req.headers["authorization"], "Basic b3BzOnBhNTU6d29yZA==");

    // An upstream that echoes the credentials back never shows them to the model: the
    // bearer token, the basic pair's base64 and its password are replaced.
    for tool in ["echo_basic", "echo_bearer"] {
        let out = call(router, &ctx, tool, json!({})).await;
        assert!(!out.is_error, "{out:?}");
        for secret in ["tok-123", "pa55:word", "b3BzOnBhNTU6d29yZA=="] {
            assert!(!out.content.contains(secret), "{tool}: {}", out.content);
        }
        assert!(out.content.contains("[REDACTED:secret]"), "{}", out.content);
    }

    // A 503 becomes an isError result with the status and an excerpt.
    let out = call(router, &ctx, "flaky", json!({})).await;
    assert_eq!(
        (out.is_error, out.error_kind, out.content.as_str()),
        (
            true,
            Some("upstream"),
            "upstream: 503 Service Unavailable: maintenance window"
        )
    );

    // The tool's own timeout.
    let out = call(router, &ctx, "sluggish", json!({})).await;
    assert_eq!(out.error_kind, Some("timeout"), "{out:?}");

    // maxResultBytes cuts the body, and says so.
    let out = call(router, &ctx, "bulky", json!({})).await;
    assert!(!out.is_error, "{out:?}");
    assert!(out.content.starts_with(&"x".repeat(1000)), "{out:?}");
    assert!(
        out.content.contains("[truncated") && out.content.len() < 1200,
        "{}",
        out.content.len()
    );

    // A model naming the metadata tool anyway is refused, and nothing is sent.
    let before = seen.lock().map(|s| s.len()).unwrap_or(0);
    let out = call(router, &ctx, "metadata", json!({})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    assert_eq!(seen.lock().map(|s| s.len()).unwrap_or(0), before);

    // allowedSessions: refused for this session even when the model names it; offered to
    // and callable by an incident session. Another namespace's tool is unknown here.
    let out = call(router, &ctx, "incident_only", json!({})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");
    assert!(out.content.contains("allowedSessions"), "{out:?}");
    let incident = tool_context(&db.store, "incident-42").await;
    assert!(
        router
            .offered(&tool_policy(json!({})), &incident.session, &incident.kube)
            .iter()
            .any(|t| t.name == "incident_only")
    );
    let out = call(router, &incident, "incident_only", json!({})).await;
    assert!(!out.is_error, "{out:?}");
    let out = call(router, &ctx, "other_ns", json!({})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");

    // A configuration change replaces the tools: jira-get's token rotates.
    let rotated = http_manifests(&base).replace("tok-123", "tok-789");
    let new_config = self::config(dir.path(), &rotated);
    let before = plugins.router.plugins();
    plugins.config.send_replace(Arc::new(new_config));
    plugins
        .wait("the rebuilt set", |s| !std::ptr::eq(s, &*before))
        .await;
    let out = call(&plugins.router, &ctx, "jira_get", json!({"key": "OPS-1"})).await;
    assert!(!out.is_error, "{out:?}");
    let req = last_seen(&seen).expect("no request");
    assert_eq!(req.headers["authorization"], "Bearer tok-789");
}

fn mcp_manifests(url: &str, token: &str) -> String {
    docs(&[
        secret("mcp", &format!("token: {token}, wrong: nope")),
        tool(
            "grafana",
            &format!(
                "mcp: {{url: '{url}', auth: {{type: bearer, secretRef: {{name: mcp, \
                 key: token}}}}, exclude: [slow, secret_header, big, trace_context]}}, \
                 timeout: 20s"
            ),
        ),
        tool(
            "locked-out",
            &format!(
                "mcp: {{url: '{url}', auth: {{type: bearer, secretRef: {{name: mcp, \
                 key: wrong}}}}}}"
            ),
        ),
        tool("gone", "mcp: {url: 'http://127.0.0.1:9/mcp'}"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_plugin_tools_are_discovered_called_and_rediscovered() {
    let Some(server) = mcp_server("s3cret-token") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut plugins = Plugins::start(config(
        dir.path(),
        &mcp_manifests(&server.url, "s3cret-token"),
    ));
    plugins
        .wait("discovery", |s| s.get("default", "grafana__echo").is_some())
        .await;
    let grafana = plugins.router.plugins();
    let key = kortex::catalog::ObjectKey::new("default", "grafana");
    let discovery = grafana.discovery.get(&key).cloned().unwrap_or_default();
    let mut names = discovery.tools.clone();
    names.sort();
    assert_eq!(
        names,
        [
            "grafana__add",
            "grafana__add_tool",
            "grafana__echo",
            "grafana__fail"
        ],
        "include/exclude applied: {discovery:?}"
    );
    assert_eq!(discovery.error, None);

    let db = sqlite().await;
    let ctx = tool_context(&db.store, "incident-7").await;
    let router = &plugins.router;
    let out = call(
        router,
        &ctx,
        "grafana__echo",
        json!({"text": "héllo wörld"}),
    )
    .await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "héllo wörld"));
    let out = call(router, &ctx, "grafana__add", json!({"a": 2, "b": 40})).await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "42"));
    // The server's schema is enforced before the call.
    let out = call(router, &ctx, "grafana__add", json!({"a": "two"})).await;
    assert_eq!(out.error_kind, Some("validation"), "{out:?}");
    // An MCP error result is an isError result for the model.
    let out = call(router, &ctx, "grafana__fail", json!({})).await;
    assert_eq!(
        (out.is_error, out.error_kind, out.content.as_str()),
        (true, Some("upstream"), "boom: upstream unavailable")
    );
    // Excluded tools are not callable.
    let out = call(router, &ctx, "grafana__slow", json!({"seconds": 0.1})).await;
    assert_eq!(out.error_kind, Some("denied"), "{out:?}");

    // The server adds a tool and says so: it is discovered without a restart.
    let out = call(router, &ctx, "grafana__add_tool", json!({})).await;
    assert!(!out.is_error, "{out:?}");
    plugins
        .wait("re-discovery", |s| {
            s.get("default", "grafana__late").is_some()
        })
        .await;
    let out = call(&plugins.router, &ctx, "grafana__late", json!({})).await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "late tool"));

    // A wrong token and an unreachable server are reported, not fatal.
    plugins
        .wait("failures", |s| {
            ["locked-out", "gone"].iter().all(|n| {
                s.discovery
                    .get(&kortex::catalog::ObjectKey::new("default", *n))
                    .is_some_and(|d| d.error.is_some())
            })
        })
        .await;
    let set = plugins.router.plugins();
    let locked = &set.discovery[&kortex::catalog::ObjectKey::new("default", "locked-out")];
    let error = locked.error.clone().unwrap_or_default();
    assert!(
        error.contains("401") || error.to_lowercase().contains("auth"),
        "{error}"
    );
    assert!(!error.contains("nope"), "the secret never appears: {error}");
    assert!(locked.tools.is_empty());

    // The server goes away: a call fails as upstream, and discovery says so at once
    // (the failed call triggers a check) rather than at the next periodic listing.
    let port: u16 = server
        .url
        .trim_end_matches("/mcp")
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {}", server.url));
    drop(server);
    let out = call(&plugins.router, &ctx, "grafana__echo", json!({"text": "x"})).await;
    assert_eq!(out.error_kind, Some("upstream"), "{out:?}");
    let lost = |s: &PluginSet| s.discovery.get(&key).is_some_and(|d| d.error.is_some());
    plugins.wait("the lost server reported", lost).await;
    // It comes back on the same address: the tools work again after a reconnect.
    let _server = mcp_server_on("s3cret-token", port).expect("no server");
    plugins.wait("the reconnect", |s| !lost(s)).await;
    let out = call(
        &plugins.router,
        &ctx,
        "grafana__echo",
        json!({"text": "back"}),
    )
    .await;
    assert_eq!(
        (out.is_error, out.content.as_str()),
        (false, "back"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_are_read_within_a_bound_and_a_huge_one_fails_alone() {
    let Some(server) = mcp_server("t0ken") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifests = docs(&[
        secret("mcp", "token: t0ken"),
        tool(
            "files",
            &format!(
                "mcp: {{url: '{url}', auth: {{type: bearer, secretRef: {{name: mcp, \
                 key: token}}}}, include: [big, echo]}}, maxResultBytes: 1000",
                url = server.url
            ),
        ),
    ]);
    let mut plugins = Plugins::start(config(dir.path(), &manifests));
    plugins
        .wait("discovery", |s| s.get("default", "files__big").is_some())
        .await;
    let db = sqlite().await;
    let ctx = tool_context(&db.store, "s").await;
    // Over maxResultBytes but within the read bound: cut, and the model is told.
    let out = call(&plugins.router, &ctx, "files__big", json!({"size": 3000})).await;
    assert!(!out.is_error, "{out:?}");
    assert!(out.content.starts_with(&"x".repeat(1000)), "{out:?}");
    assert!(out.content.contains("[truncated"), "{out:?}");
    // Over the read bound (4 × maxResultBytes + 1 MiB): refused as it arrives, with the
    // reason, instead of held whole.
    let limit = kortex::tools::mcp::read_limit(1000);
    let out = call(
        &plugins.router,
        &ctx,
        "files__big",
        json!({"size": limit + 1000}),
    )
    .await;
    assert_eq!(out.error_kind, Some("upstream"), "{out:?}");
    assert!(
        out.content.contains(&limit.to_string()),
        "the error names the bound: {out:?}"
    );
    // The connection survives: the next call works.
    let out = call(
        &plugins.router,
        &ctx,
        "files__echo",
        json!({"text": "still here"}),
    )
    .await;
    assert_eq!(
        (out.is_error, out.content.as_str()),
        (false, "still here"),
        "{out:?}"
    );
}

/// An MCP server that takes only OAuth (the Python SDK's resource server: its metadata, a
/// 401 with `resource_metadata`, JWT access tokens of its issuer for itself): a KortexTool
/// with client credentials discovers its authorization server, gets a token for the
/// server (the resource indicator) and calls its tools; wrong credentials are reported on
/// the tool, not fatal, and the secret never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth_only_mcp_server_is_reached_with_client_credentials() {
    use crate::support::oidc::{CLIENT_ID, CLIENT_SECRET, Provider};
    let p = Provider::start().await;
    let Some(server) = crate::support::plugins::mcp_server_with(&[
        "--oauth-issuer",
        &p.issuer,
        "--oauth-scope",
        "mcp:tools",
    ]) else {
        return;
    };
    let url = &server.url;
    let issuer = &p.issuer;
    let dir = tempfile::tempdir().unwrap();
    let yaml = docs(&[
        secret(
            "mcp-oauth",
            &format!("secret: {CLIENT_SECRET}, wrong: nope"),
        ),
        tool(
            "grafana",
            &format!(
                "mcp: {{url: '{url}', auth: {{type: oauthClientCredentials, clientId: {CLIENT_ID}, \
                 secretRef: {{name: mcp-oauth, key: secret}}, scopes: [mcp:tools], issuer: '{issuer}'}}, \
                 include: [echo]}}"
            ),
        ),
        tool(
            "refused",
            &format!(
                "mcp: {{url: '{url}', auth: {{type: oauthClientCredentials, clientId: {CLIENT_ID}, \
                 secretRef: {{name: mcp-oauth, key: wrong}}, scopes: [mcp:tools]}}}}"
            ),
        ),
    ]);
    let mut plugins = Plugins::start(config(dir.path(), &yaml));
    plugins
        .wait("discovery through OAuth", |s| {
            s.get("default", "grafana__echo").is_some()
        })
        .await;
    let db = sqlite().await;
    let ctx = tool_context(&db.store, "incident-8").await;
    let out = call(
        &plugins.router,
        &ctx,
        "grafana__echo",
        json!({"text": "with a token"}),
    )
    .await;
    assert_eq!(
        (out.is_error, out.content.as_str()),
        (false, "with a token")
    );
    assert!(
        p.token_calls().iter().any(|g| g == "client_credentials"),
        "a token came from the authorization server"
    );
    // Wrong client credentials: the authorization server refuses, and the tool says so.
    plugins
        .wait("the refused credentials reported", |s| {
            s.discovery
                .get(&kortex::catalog::ObjectKey::new("default", "refused"))
                .is_some_and(|d| {
                    d.error
                        .as_deref()
                        .is_some_and(|e| e.contains("invalid_client"))
                })
        })
        .await;
    let set = plugins.router.plugins();
    let error = set
        .discovery
        .get(&kortex::catalog::ObjectKey::new("default", "refused"))
        .and_then(|d| d.error.clone())
        .unwrap_or_default();
    assert!(
        !error.contains(CLIENT_SECRET) && !error.contains("nope"),
        "{error}"
    );
}
