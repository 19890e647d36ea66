//! `kortex providers check` and `kortex ask`: for people checking their setup. Both read
//! the same manifests as `kortex serve` and call the providers through the same adapters.

use crate::catalog::{Catalog, ObjectKey, ProviderEntry};
use crate::crd::conditions::{self, types};
use crate::llm::{self, ChatRequest, ErrorKind, Message, StreamEvent, ToolSpec};
use crate::source::ManifestSource;
use clap::Args;
use futures_util::StreamExt;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Where the configuration comes from.
#[derive(Args, Debug, Clone)]
pub struct ManifestArgs {
    /// Manifest file or folder; repeatable.
    #[arg(long = "manifests", value_name = "PATH", required = true)]
    pub manifests: Vec<PathBuf>,
    /// Namespace of the providers and policies.
    #[arg(long, default_value = "default")]
    pub namespace: String,
}

/// `kortex providers check` options.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Manifests.
    #[command(flatten)]
    pub source: ManifestArgs,
}

/// `kortex ask` options.
#[derive(Args, Debug)]
pub struct AskArgs {
    /// Manifests.
    #[command(flatten)]
    pub source: ManifestArgs,
    /// Use this LLMProvider (default: the provider of the ChatPolicy matching `--session`).
    #[arg(long)]
    pub provider: Option<String>,
    /// Model id (default: the policy's default role, else the provider's default model).
    #[arg(long)]
    pub model: Option<String>,
    /// Session name used to find the ChatPolicy when no `--provider` is given.
    #[arg(long, default_value = "ask")]
    pub session: String,
    /// JSON file with an array of tools: `[{"name", "description", "parameters"}]`.
    #[arg(long, value_name = "FILE")]
    pub tool_file: Option<PathBuf>,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Output token limit.
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Use the provider's non-streaming API.
    #[arg(long)]
    pub no_stream: bool,
    /// Print the final response as one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// The prompt.
    pub prompt: String,
}

fn load(args: &ManifestArgs) -> Result<Catalog, String> {
    let objects = load_objects(&args.manifests)?;
    Ok(crate::catalog::compile(&objects, jiff::Timestamp::now()))
}

/// The objects of the manifest files and folders `paths` (with the environment for
/// `${VAR}`), each load problem printed to stderr as `error: …` or `warning: …`.
pub(crate) fn load_objects(
    paths: &[std::path::PathBuf],
) -> Result<crate::catalog::ObjectSet, String> {
    let env: crate::source::EnvLookup = Box::new(|name| std::env::var(name).ok());
    let mut source = ManifestSource::new(paths.to_vec(), env).map_err(|e| e.to_string())?;
    let snapshot = source.load(jiff::Timestamp::now());
    for p in &snapshot.problems {
        eprintln!(
            "{}: {p}",
            if p.severity == crate::source::manifest::Severity::Error {
                "error"
            } else {
                "warning"
            }
        );
    }
    Ok(snapshot.objects)
}

fn ready_message(entry: &ProviderEntry) -> String {
    entry
        .object
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_else(|| "not ready".to_owned())
}

/// One line per provider; `Ok(false)` when any is unavailable or unreachable.
pub async fn check(args: CheckArgs) -> Result<bool, String> {
    let catalog = load(&args.source)?;
    let providers: Vec<(&ObjectKey, &ProviderEntry)> = catalog
        .providers
        .iter()
        .filter(|(k, _)| k.namespace == args.source.namespace)
        .collect();
    if providers.is_empty() {
        return Err(format!(
            "no LLMProvider in namespace {} in the given manifests",
            args.source.namespace
        ));
    }
    let mut all_ok = true;
    let mut probes = std::collections::BTreeMap::new();
    for (key, entry) in providers {
        let (ok, probe) = check_provider(key, entry).await;
        all_ok &= ok;
        if let Some(probe) = probe {
            probes.insert(key.clone(), probe);
        }
    }
    // Each policy: what it would answer with now, or that nothing can, and the fix.
    for (key, policy) in catalog
        .policies
        .iter()
        .filter(|(k, _)| k.namespace == args.source.namespace)
    {
        let ns = &key.namespace;
        let mut plan =
            crate::govern::route::plan(&catalog, ns, policy, crate::govern::route::Role::Default);
        crate::govern::reach::drop_unreachable(
            &mut plan,
            &catalog,
            ns,
            &probes,
            jiff::Timestamp::now(),
            std::time::Duration::from_secs(3600),
        );
        match plan.routes.first() {
            Some(r) => println!(
                "✓ ChatPolicy {}: answers with {}/{}",
                key.name, r.provider, r.model
            ),
            None => {
                all_ok = false;
                println!(
                    "✗ ChatPolicy {}: {}",
                    key.name,
                    crate::govern::reach::no_provider_message(&catalog, ns, &key.name, &plan)
                );
            }
        }
    }
    Ok(all_ok)
}

/// One provider's line of `check`: whether it is usable, and what its probe found (none
/// when it was not asked: unavailable, not buildable, or an error that says nothing of
/// its reachability).
async fn check_provider(
    key: &ObjectKey,
    entry: &ProviderEntry,
) -> (bool, Option<llm::probe::ProbeResult>) {
    let probed = |reachable: bool, reason: &'static str, message: String| llm::probe::ProbeResult {
        reachable,
        ok: reason == llm::probe::reasons::REACHABLE,
        reason,
        message,
        models: Vec::new(),
        latency_ms: 0,
        checked_at: jiff::Timestamp::now(),
    };
    let kind = entry.provider_type().as_str();
    let url = entry.base_url().unwrap_or("-");
    if !entry.available {
        println!(
            "✗ {} ({kind}, {url}): unavailable: {}",
            key.name,
            ready_message(entry)
        );
        return (false, None);
    }
    let adapter = match llm::build(entry) {
        Ok(a) => a,
        Err(e) => {
            println!("✗ {} ({kind}, {url}): {e}", key.name);
            return (false, None);
        }
    };
    let started = Instant::now();
    match adapter.list_models().await {
        Ok(models) => {
            let ms = started.elapsed().as_millis();
            let shown: Vec<&str> = models.iter().take(8).map(String::as_str).collect();
            let more = if models.len() > 8 {
                format!(", … ({} in all)", models.len())
            } else {
                String::new()
            };
            let default = entry.default_model().unwrap_or("-");
            let warn = if entry
                .default_model()
                .is_some_and(|m| !models.is_empty() && !models.iter().any(|x| x == m))
            {
                format!("; default model {default} is not listed by the endpoint")
            } else {
                String::new()
            };
            println!(
                "✓ {} ({kind}, {url}): reachable in {ms} ms, models: {}{more}{warn}",
                key.name,
                shown.join(", ")
            );
            let probe = probed(true, llm::probe::reasons::REACHABLE, String::new());
            (true, Some(probe))
        }
        Err(e) if e.kind == ErrorKind::Auth => {
            println!(
                "✗ {} ({kind}, {url}): reachable but the key was refused: {}",
                key.name, e.message
            );
            let probe = probed(true, llm::probe::reasons::AUTH_FAILED, e.message);
            (false, Some(probe))
        }
        Err(e) => {
            println!(
                "✗ {} ({kind}, {url}): unreachable: {}: {}",
                key.name,
                e.kind.as_str(),
                e.message
            );
            let probe = matches!(e.kind, ErrorKind::Connection | ErrorKind::Timeout)
                .then(|| probed(false, llm::probe::reasons::UNREACHABLE, e.message));
            (false, probe)
        }
    }
}

/// The provider and model `ask` uses.
fn choose<'a>(
    catalog: &'a Catalog,
    args: &AskArgs,
) -> Result<(&'a ProviderEntry, Option<String>), String> {
    let ns = &args.source.namespace;
    if let Some(name) = &args.provider {
        let entry = catalog.provider(ns, name).ok_or_else(|| {
            format!("no LLMProvider {name} in namespace {ns} in the given manifests")
        })?;
        return Ok((entry, args.model.clone()));
    }
    let policy = catalog.match_policy(ns, &args.session).ok_or_else(|| {
        format!("no ChatPolicy in namespace {ns} matches session {:?}; pass --provider NAME to pick one", args.session)
    })?;
    let spec = &policy.object.spec;
    let (provider, model) = catalog.role_target(ns, policy, spec.models.default.as_deref());
    let entry = catalog.provider(ns, &provider).ok_or_else(|| {
        format!(
            "ChatPolicy {} names LLMProvider {provider}, which is not in namespace {ns}",
            policy.object.metadata.name.as_deref().unwrap_or("")
        )
    })?;
    Ok((entry, args.model.clone().or(model)))
}

/// `kortex ask`.
// Long because the command's steps in order: load, pick the provider and model, build the request,
// print the stream's events as they come.
pub async fn ask(args: AskArgs) -> Result<(), String> {
    let catalog = load(&args.source)?;
    let (entry, model) = choose(&catalog, &args)?;
    let name = entry.object.metadata.name.clone().unwrap_or_default();
    if !entry.available {
        return Err(format!(
            "LLMProvider {name} is unavailable: {}",
            ready_message(entry)
        ));
    }
    let tools: Vec<ToolSpec> = match &args.tool_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{}: expected a JSON array of {{name, description, parameters}}: {e}",
                    path.display()
                )
            })?
        }
        None => Vec::new(),
    };
    let adapter = llm::build(entry).map_err(|e| e.to_string())?;
    let model = match model.or_else(|| adapter.default_model().map(str::to_owned)) {
        Some(m) => m,
        // ollama and openai-compatible servers may have no catalog: take what they list.
        None => adapter
            .list_models()
            .await
            .map_err(|e| format!("no model configured and the model list failed: {e}"))?
            .into_iter()
            .next()
            .ok_or_else(|| {
                format!("LLMProvider {name} has no model: set spec.defaultModel or pass --model")
            })?,
    };
    let request = ChatRequest {
        model: model.clone(),
        system: args.system.clone(),
        messages: vec![Message::User {
            content: args.prompt.clone(),
        }],
        tools,
        max_tokens: args.max_tokens,
        metadata: llm::RequestMetadata {
            purpose: Some("cli".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let started = Instant::now();
    let response = if args.no_stream {
        let r = adapter
            .complete(&request)
            .await
            .map_err(|e| e.to_string())?;
        if !args.json {
            print!("{}", r.text);
        }
        r
    } else {
        let stream = adapter.stream(&request).await.map_err(|e| e.to_string())?;
        let printing = !args.json;
        let stream = stream
            .inspect(move |event| {
                if printing && let Ok(StreamEvent::TextDelta(t)) = event {
                    print!("{t}");
                    let _ = std::io::stdout().flush();
                }
            })
            .boxed();
        llm::collect(stream, started)
            .await
            .map_err(|e| e.to_string())?
    };
    let model_id = if response.model.is_empty() {
        request.model.clone()
    } else {
        response.model.clone()
    };
    // Price by the model the provider reports, else by the one requested (endpoints often
    // answer with a longer, dated id).
    let cost = if adapter
        .models()
        .iter()
        .any(|m| m.id == model_id && m.cost.is_some())
    {
        adapter.cost_usd(&model_id, response.usage)
    } else {
        adapter.cost_usd(&request.model, response.usage)
    };
    if args.json {
        let mut v = serde_json::to_value(&response).map_err(|e| e.to_string())?;
        v["provider"] = serde_json::json!(name);
        v["costUsd"] = serde_json::json!(cost);
        println!("{v}");
    } else {
        println!();
        for c in &response.tool_calls {
            println!("→ tool call {} {} {}", c.id, c.name, c.input);
        }
        // The stop reason as the docs and the API spell it (`end_turn`).
        let stop = serde_json::to_value(response.stop_reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        eprintln!(
            "[{name} {model_id}: {stop}, {} in / {} out tokens{}, ${cost:.6}, {} ms]",
            response.usage.input_tokens,
            response.usage.output_tokens,
            if response.usage.estimated {
                " (estimated)"
            } else {
                ""
            },
            started.elapsed().as_millis()
        );
    }
    for w in &response.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}
