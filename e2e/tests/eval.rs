//! `kortex eval` in live mode against a real cluster: the scenario's manifests are applied
//! to a throwaway namespace, the question is asked with the real Kubernetes tools (a
//! scripted OpenAI-compatible model reads the ConfigMap with `get_resource` and repeats
//! what it says), the answer is scored, the result recorded, and the namespace deleted.

use clap::Parser as _;
use k8s_openapi::api::core::v1::Namespace;
use kortex_e2e::client;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

fn chunk(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "scripted", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// The scripted model: reads ConfigMap `settings` in the namespace the question names, then
/// repeats the tool's result.
async fn chat(axum::Json(body): axum::Json<Value>) -> axum::response::Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let question = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let namespace = question
        .split_whitespace()
        .skip_while(|w| *w != "namespace")
        .nth(1)
        .unwrap_or_default()
        .trim_end_matches('?')
        .to_owned();
    let result = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .map(str::to_owned);
    let mut out = String::new();
    match result {
        None => {
            let args = json!({"kind": "ConfigMap", "name": "settings", "namespace": namespace});
            out.push_str(&chunk(json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_resource", "arguments": args.to_string()}}]}), Value::Null));
            out.push_str(&chunk(json!({}), json!("tool_calls")));
        }
        Some(r) => {
            out.push_str(&chunk(
                json!({"role": "assistant", "content": format!("The ConfigMap says: {r}")}),
                Value::Null,
            ));
            out.push_str(&chunk(json!({}), json!("stop")));
        }
    }
    out.push_str("data: [DONE]\n\n");
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(out))
        .unwrap_or_default()
}

#[tokio::test]
async fn a_live_scenario_runs_in_a_throwaway_namespace() -> anyhow::Result<()> {
    let Some(client) = client().await else {
        return Ok(());
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .route(
            "/v1/models",
            axum::routing::get(|| async { axum::Json(json!({"data": [{"id": "scripted"}]})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let llm = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = std::env::temp_dir().join(format!("kortex-e2e-eval-{}", std::process::id()));
    let scenario = dir.join("suite/configmap-colour");
    std::fs::create_dir_all(scenario.join("manifests"))?;
    std::fs::create_dir_all(dir.join("config"))?;
    std::fs::write(
        dir.join("config/llm.yaml"),
        format!(
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: scripted}}\nspec: {{type: openai-compatible, baseUrl: \"{llm}/v1\", defaultModel: scripted}}\n"
        ),
    )?;
    std::fs::write(
        scenario.join("scenario.yaml"),
        "apiVersion: kortex.dev/eval/v1\nkind: Scenario\nmode: live\nquestion: What colour does ConfigMap settings set in namespace {{namespace}}?\nexpect:\n  facts: [teal]\n  tools: [get_resource]\nlive: {settleSeconds: 1}\n",
    )?;
    std::fs::write(
        scenario.join("manifests/settings.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {colour: teal}\n",
    )?;
    let db = dir.join("evals.db");
    let cli = kortex::cli::Cli::try_parse_from([
        "kortex",
        "eval",
        "--scenarios",
        &dir.join("suite").display().to_string(),
        "--manifests",
        &dir.join("config").display().to_string(),
        "--provider",
        "scripted",
        "--record",
        "--database-url",
        &format!("sqlite://{}", db.display()),
    ])?;
    let kortex::cli::Command::Eval(args) = cli.command else {
        anyhow::bail!("not the eval command");
    };
    let met = kortex::eval::run(args).await.map_err(anyhow::Error::msg)?;
    assert!(met);
    let store = kortex::store::Store::connect(&format!("sqlite://{}", db.display())).await?;
    let runs = store.list_evals(0, None, true, 10).await?;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].passed, runs[0].attempts),
        (1, 1),
        "{:#}",
        runs[0].report
    );
    // The throwaway namespace is gone or going.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=kortex-eval"))
        .await?
    {
        assert!(
            ns.metadata.deletion_timestamp.is_some(),
            "{:?} was left behind",
            ns.metadata.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
