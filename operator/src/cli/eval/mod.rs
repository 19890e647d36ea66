//! `kortex eval`: investigation quality, measured (`docs/evals.md`). Each scenario's
//! question goes through the real chat engine — the same prompts, routes, router,
//! redaction and budgets as production — with tools answered from the scenario's
//! recordings (or, live, from a real cluster), and the answer is scored: facts it must
//! state, claims it must not make, tools it must call, proposals it should or should not
//! make, then an LLM judge's rubric when asked. Reports per scenario and in total, side by
//! side for `--compare`; `--record` keeps the result for `GET /api/v1/evals`.

mod live;
pub mod record;
pub mod recorded;
mod report;
pub mod scenario;
mod score;

pub use score::wilson;

use crate::catalog::ObjectSet;
use crate::chat::Engine;
use crate::cli::DatabaseArgs;
use crate::crd::ChatPolicy;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::store::{NewSession, Store};
use clap::{Args, Subcommand};
use recorded::{Book, Recorded};
use scenario::{Mode, Scenario};
use score::{Attempt, Observed};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// `kortex eval` options.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvalArgs {
    /// `record`: a session into a scenario.
    #[command(subcommand)]
    pub command: Option<EvalCommand>,
    /// A scenario folder, or a folder of them (e.g. `evals/`).
    #[arg(long, value_name = "DIR")]
    pub scenarios: Option<PathBuf>,
    /// Kortex configuration (providers, policies, Secrets): manifest file or folder,
    /// repeatable — as `kortex serve` reads it. Without it, the custom resources of
    /// `--namespace` in the cluster of `KUBECONFIG`.
    #[arg(long = "manifests", value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
    /// Namespace of the providers and policies named on the command line.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Run every scenario under this ChatPolicy (`NAME` or `NS/NAME`).
    #[arg(long, value_name = "NS/NAME", conflicts_with_all = ["provider", "compare"])]
    pub policy: Option<String>,
    /// Run every scenario with this LLMProvider, under a policy of defaults.
    #[arg(long, conflicts_with = "compare")]
    pub provider: Option<String>,
    /// With `--provider`: the model (default: the provider's default model).
    #[arg(long, requires = "provider")]
    pub model: Option<String>,
    /// Two or more configurations side by side: each a policy `NS/NAME` or a provider
    /// `NAME[/MODEL]`.
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    pub compare: Vec<String>,
    /// Attempts per scenario (the pass rate's interval narrows with more).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Attempts run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel: u32,
    /// Grade scenarios that have a rubric with this model (`PROVIDER[/MODEL]`), after
    /// their deterministic checks pass.
    #[arg(long, value_name = "PROVIDER/MODEL")]
    pub judge: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write the report as JUnit XML.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Exit non-zero when a configuration's pass rate is below this (`0.8` or `80%`).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub min_pass_rate: Option<f64>,
    /// Longest an attempt may take before it is cancelled and fails.
    #[arg(long, default_value = "300s", value_parser = crate::crd::parse_duration)]
    pub timeout: Duration,
    /// Store the result in the database (`--database-url`) for `GET /api/v1/evals`.
    #[arg(long)]
    pub record: bool,
    /// Where `--record` writes.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Live scenarios: the cluster to create their throwaway namespaces in (default:
    /// `KUBECONFIG`).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `kortex eval` subcommands.
#[derive(Subcommand, Debug)]
pub enum EvalCommand {
    /// Turn a session's tool calls and results into a recorded scenario skeleton.
    Record(record::RecordArgs),
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let (number, scale) = match s.trim().strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (s.trim(), 1.0),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("{s:?}: a rate is 0.8 or 80%"))?;
    let v = v / scale;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?}: a rate is between 0 and 1 (or 0% and 100%)"))
    }
}

/// What a configuration under test is.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    /// Each scenario under the policy its session name (or its `policy`) selects.
    Manifests,
    /// Every scenario under this policy.
    Policy { namespace: String, name: String },
    /// Every scenario with this provider (and model) under a policy of defaults.
    Provider { name: String, model: Option<String> },
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Manifests => "manifests".into(),
            Target::Policy { namespace, name } => format!("{namespace}/{name}"),
            Target::Provider { name, model } => match model {
                Some(m) => format!("{name}/{m}"),
                None => name.clone(),
            },
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Target::Manifests => "manifests",
            Target::Policy { .. } => "policy",
            Target::Provider { .. } => "provider",
        }
    }
}

/// `A` of `--compare A,B`: a ChatPolicy `NS/NAME` when one exists, else a provider
/// `NAME[/MODEL]` of `--namespace`.
fn resolve(objects: &ObjectSet, namespace: &str, item: &str) -> Result<Target, String> {
    let item = item.trim();
    let policy_exists = |ns: &str, name: &str| {
        objects.policies.iter().any(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == ns
                && p.metadata.name.as_deref() == Some(name)
        })
    };
    let provider_exists = |name: &str| {
        objects.providers.iter().any(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && p.metadata.name.as_deref() == Some(name)
        })
    };
    let (a, b) = match item.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (item, None),
    };
    match b {
        Some(name) if policy_exists(a, name) => Ok(Target::Policy {
            namespace: a.to_owned(),
            name: name.to_owned(),
        }),
        None if policy_exists(namespace, a) => Ok(Target::Policy {
            namespace: namespace.to_owned(),
            name: a.to_owned(),
        }),
        _ if provider_exists(a) => Ok(Target::Provider {
            name: a.to_owned(),
            model: b.map(str::to_owned),
        }),
        _ => Err(format!(
            "{item:?} is neither a ChatPolicy (NS/NAME) nor an LLMProvider of namespace {namespace} (NAME[/MODEL]) in the given manifests"
        )),
    }
}

/// The configuration a target runs on: the manifests' objects, with the target's policy
/// governing every session.
fn configure(
    mut objects: ObjectSet,
    target: &Target,
    namespace: &str,
) -> Result<ObjectSet, String> {
    match target {
        Target::Manifests => {}
        Target::Policy {
            namespace: ns,
            name,
        } => {
            // Only this policy in its namespace, matching every session name.
            objects.policies.retain(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") != ns
                    || p.metadata.name.as_deref() == Some(name)
            });
            let Some(p) = objects.policies.iter_mut().find(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == ns
                    && p.metadata.name.as_deref() == Some(name)
            }) else {
                return Err(format!("no ChatPolicy {ns}/{name} in the given manifests"));
            };
            p.spec.sessions = vec!["*".into()];
        }
        Target::Provider { name, model } => {
            objects
                .policies
                .retain(|p| p.metadata.namespace.as_deref().unwrap_or("default") != namespace);
            let mut spec = json!({
                "sessions": ["*"],
                "provider": name,
                // Proposals are part of what is scored: any action, any namespace.
                "proposals": {"allowedActions": ["restart", "scale", "rollback"], "allowedNamespaces": ["*"]},
            });
            if let Some(m) = model {
                spec["models"] = json!({"default": m});
            }
            let policy: ChatPolicy = serde_json::from_value(json!({
                "apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
                "metadata": {"name": "eval", "namespace": namespace},
                "spec": spec,
            }))
            .map_err(|e| format!("cannot build the policy for provider {name}: {e}"))?;
            objects.policies.push(policy);
        }
    }
    Ok(objects)
}

/// One configuration's engine: its own database (a file removed at the end), its
/// configuration, and tools answered from the scenarios.
struct Lab {
    target: Target,
    engine: Arc<Engine>,
    book: Arc<Book>,
    namespace: String,
    _config: watch::Sender<Arc<LiveConfig>>,
    db: PathBuf,
}

impl Lab {
    async fn new(
        objects: ObjectSet,
        target: Target,
        namespace: &str,
        cluster: Option<&kube::Client>,
    ) -> Result<Self, String> {
        let objects = configure(objects, &target, namespace)?;
        let now = jiff::Timestamp::now();
        let config = LiveConfig {
            catalog: crate::catalog::compile(&objects, now),
            loaded_at: now,
            version: 1,
            ..Default::default()
        };
        // Providers without `models` serve what their endpoint lists, as in `kortex serve`:
        // one probe of each first.
        let board = crate::llm::probe::ProbeBoard::default();
        crate::llm::probe::probe_all(&config.catalog, &board).await;
        let (config_tx, config_rx) = watch::channel(Arc::new(config));
        crate::llm::probe::fold(&config_tx, &board);
        let db = std::env::temp_dir().join(format!("kortex-eval-{}.db", crate::store::new_id()));
        let store = Store::connect(&format!("sqlite://{}", db.display()))
            .await
            .map_err(|e| format!("cannot create the eval's database: {e}"))?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let book = Arc::new(Book::default());
        let router = router(&book, cluster)?;
        let engine = Engine::new(store, config_rx, router);
        let namespace = match &target {
            Target::Policy { namespace, .. } => namespace.clone(),
            _ => namespace.to_owned(),
        };
        Ok(Self {
            target,
            engine,
            book,
            namespace,
            _config: config_tx,
            db,
        })
    }

    async fn close(self) {
        self.engine.store.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.db.display()));
        }
    }
}

/// The production tool set — Kubernetes, Prometheus, admin-info, incident history — each
/// answered from recordings (live scenarios reach the real Kubernetes tools when a cluster
/// is given). `read_result_chunk` and the guide tools stay real.
fn router(
    book: &Arc<Book>,
    cluster: Option<&kube::Client>,
) -> Result<crate::tools::Router, String> {
    // The real tools, for their specs (and, with a cluster, for live calls). Without one,
    // clients pointing nowhere: nothing is ever sent through them.
    let nowhere = "http://127.0.0.1:9";
    let client = match cluster {
        Some(c) => c.clone(),
        None => kube::Client::try_from(kube::Config::new(
            nowhere.parse().map_err(|e| format!("{e}"))?,
        ))
        .map_err(|e| format!("cannot build a Kubernetes client: {e}"))?,
    };
    let live = cluster.is_some();
    let kube = crate::tools::cluster::Cluster::new(client);
    let mut real: Vec<(Arc<dyn crate::tools::Tool>, bool)> =
        kube.tools().into_iter().map(|t| (t, live)).collect();
    real.push((
        Arc::new(crate::tools::admin_info::AdminInfo::new(
            kube,
            reqwest::Client::new(),
            "cluster.local",
        )),
        false,
    ));
    let prometheus = crate::tools::prometheus::Prometheus::new(nowhere, reqwest::Client::new())?;
    real.extend(prometheus.tools().into_iter().map(|t| (t, false)));
    let mut router = crate::tools::Router::new(Arc::new(Metrics::new()));
    if let Some(history) = router.tool("get_incident_history") {
        real.push((history, true));
    }
    for (tool, live) in real {
        router.add(Arc::new(Recorded::new(tool, live, book.clone())));
    }
    Ok(router)
}

/// Runs one attempt of `scenario` in `lab`.
async fn attempt(lab: &Lab, scenario: Arc<Scenario>, n: u32, timeout: Duration) -> Attempt {
    let started = Instant::now();
    let mut observed = Observed::default();
    let live_ns = if scenario.mode == Mode::Live {
        Some(format!("kortex-eval-{}", &crate::store::new_id()[..8]))
    } else {
        None
    };
    let question = match &live_ns {
        Some(ns) => scenario.question.replace("{{namespace}}", ns),
        None => scenario.question.clone(),
    };
    let run = async {
        if let (Some(ns), Some(cluster)) = (&live_ns, lab.cluster()) {
            live::apply(&cluster, ns, &scenario).await?;
        }
        let store = &lab.engine.store;
        let session = store
            .create_session(&NewSession {
                name: scenario.session.clone(),
                namespace: lab.namespace.clone(),
                user: "kortex-eval".into(),
                policy: None,
                dynamic_tools: json!([]),
            })
            .await
            .map_err(|e| e.to_string())?;
        {
            let config = lab.engine.config.borrow().clone();
            if config.catalog.policy_of(&session).is_none() {
                return Err(format!(
                    "no ChatPolicy in namespace {} matches session {:?}: pass --policy or --provider, or set the scenario's session",
                    session.namespace, session.name
                ));
            }
        }
        lab.book.open(&session.id, scenario.clone());
        let mut events = lab.engine.subscribe(&session.id);
        let run_id = lab
            .engine
            .start_run(&session, "kortex-eval", &question)
            .await
            .map_err(|e| e.to_string())?;
        let ended = wait(lab, &run_id, &mut events, timeout).await;
        if ended.is_err() {
            lab.engine.cancel(&session.id);
        }
        let (state, error) = ended?;
        observed.refused = lab.book.close(&session.id);
        if state != "completed" {
            observed.failure = Some(match error {
                Some(e) => format!("the run ended {state}: {e}"),
                None => format!("the run ended {state}"),
            });
        }
        for m in store
            .list_messages(&session.id)
            .await
            .map_err(|e| e.to_string())?
        {
            if m.role != "assistant" || m.run_id.as_deref() != Some(run_id.as_str()) {
                continue;
            }
            if !m.content.is_empty() {
                if !observed.answer.is_empty() {
                    observed.answer.push_str("\n\n");
                }
                observed.answer.push_str(&m.content);
            }
            for c in m
                .tool_calls
                .as_ref()
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                observed.calls.push((
                    c["name"].as_str().unwrap_or_default().to_owned(),
                    c["input"].clone(),
                ));
            }
        }
        observed.proposals = store
            .list_proposals(None, 1000)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|p| p.session_id.as_deref() == Some(session.id.as_str()))
            .map(|p| (p.action, p.target.unwrap_or(Value::Null)))
            .collect();
        observed.usage = store
            .session_usage(&session.id)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    };
    let outcome = run.await;
    if let (Some(ns), Some(cluster)) = (&live_ns, lab.cluster()) {
        live::remove(&cluster, ns).await;
    }
    if let Err(e) = outcome {
        observed.failure = Some(e);
    }
    score::attempt(&scenario, n, observed, started.elapsed())
}

impl Lab {
    fn cluster(&self) -> Option<kube::Client> {
        live::CLUSTER.get().cloned()
    }
}

/// Waits for the run's end: `(state, error message)`.
async fn wait(
    lab: &Lab,
    run_id: &str,
    events: &mut tokio::sync::broadcast::Receiver<crate::store::EventRecord>,
    timeout: Duration,
) -> Result<(String, Option<String>), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut error = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            e = events.recv() => match e {
                Ok(e) if e.run_id.as_deref() == Some(run_id) => {
                    if e.event_type == crate::chat::event::ERROR {
                        error = Some(format!("{}: {}", e.data["code"].as_str().unwrap_or("error"), e.data["message"].as_str().unwrap_or_default()));
                    }
                    if e.event_type == crate::chat::event::RUN_LIFECYCLE {
                        let state = e.data["state"].as_str().unwrap_or_default();
                        match state {
                            "completed" | "failed" | "cancelled" => return Ok((state.to_owned(), error)),
                            "requires_action" => return Ok((state.to_owned(), Some("it waits for a client-executed tool; evals run none".into()))),
                            "awaiting_plan" => return Ok((state.to_owned(), Some("it waits for a plan approval (runControl.planning: required); evals approve none".into()))),
                            _ => {}
                        }
                    }
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return Err("the engine stopped".into()),
            },
            _ = tick.tick() => {
                // Events missed by a lagging receiver: the database has the end too.
                if let Ok(Some(status)) = lab.engine.store.run_status(run_id).await
                    && status.is_final()
                {
                    return Ok((status.to_string(), error));
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!("no answer within {} s (--timeout)", timeout.as_secs()));
            }
        }
    }
}

/// `kortex eval`: `Ok(true)` when every configuration met `--min-pass-rate`.
pub async fn run(args: EvalArgs) -> Result<bool, String> {
    if let Some(EvalCommand::Record(r)) = args.command {
        return record::run(r).await.map(|()| true);
    }
    let Some(dir) = &args.scenarios else {
        return Err(
            "--scenarios DIR is required (a scenario folder, or a folder of them such as evals/)"
                .into(),
        );
    };
    let scenarios: Vec<Arc<Scenario>> =
        Scenario::load_all(dir)?.into_iter().map(Arc::new).collect();
    let objects = if args.manifests.is_empty() {
        // Cluster mode: the custom resources of --namespace, as `kortex run` reads them.
        live::connect(args.kubeconfig.as_deref()).await.map_err(|_| {
            "--manifests PATH is required without a cluster: the providers, policies and Secrets to evaluate (as kortex serve reads them); with KUBECONFIG set, they are read from the cluster's --namespace".to_owned()
        })?;
        let client = live::CLUSTER.get().ok_or("no cluster client")?;
        live::configuration(client, &args.namespace).await?
    } else {
        crate::cli::llm::load_objects(&args.manifests)?
    };
    let targets: Vec<Target> = if !args.compare.is_empty() {
        if args.compare.len() < 2 {
            return Err("--compare needs at least two configurations: A,B".into());
        }
        args.compare
            .iter()
            .map(|c| resolve(&objects, &args.namespace, c))
            .collect::<Result<_, _>>()?
    } else if let Some(p) = &args.policy {
        let (ns, name) = p
            .split_once('/')
            .unwrap_or((args.namespace.as_str(), p.as_str()));
        vec![Target::Policy {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        }]
    } else if let Some(p) = &args.provider {
        vec![Target::Provider {
            name: p.clone(),
            model: args.model.clone(),
        }]
    } else {
        vec![Target::Manifests]
    };
    let judge = match &args.judge {
        Some(j) => Some(score::Judge::new(&objects, &args.namespace, j)?),
        None => None,
    };
    if scenarios.iter().any(|s| s.mode == Mode::Live) {
        live::connect(args.kubeconfig.as_deref()).await?;
    }
    let suite = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    let started = Instant::now();
    let mut results = Vec::new();
    for target in targets {
        let lab = Lab::new(
            objects.clone(),
            target,
            &args.namespace,
            live::CLUSTER.get(),
        )
        .await?;
        let attempts = run_all(&lab, &scenarios, &args, judge.as_ref()).await;
        results.push(report::Summary::of(
            lab.target.label(),
            lab.target.kind(),
            &scenarios,
            attempts,
        ));
        lab.close().await;
    }
    let report = report::Report {
        suite,
        repeat: args.repeat,
        duration: started.elapsed(),
        targets: results,
        judged: judge.is_some(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).unwrap_or_default()
        );
    } else {
        print!("{}", report.text());
    }
    if let Some(path) = &args.junit {
        std::fs::write(path, report.junit())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.record {
        let store = Store::connect(&args.database.database_url)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        for t in &report.targets {
            store
                .record_eval(&t.record(&report.suite))
                .await
                .map_err(|e| format!("cannot record the result: {e}"))?;
        }
        store.close().await;
        eprintln!(
            "recorded in {}",
            crate::store::redact_url(&args.database.database_url)
        );
    }
    Ok(match args.min_pass_rate {
        Some(min) => report.targets.iter().all(|t| t.pass_rate() >= min),
        None => true,
    })
}

/// Every attempt of every scenario in `lab`, `--parallel` at a time, in a stable order.
async fn run_all(
    lab: &Lab,
    scenarios: &[Arc<Scenario>],
    args: &EvalArgs,
    judge: Option<&score::Judge>,
) -> Vec<Attempt> {
    use futures_util::StreamExt;
    let work: Vec<(Arc<Scenario>, u32)> = scenarios
        .iter()
        .flat_map(|s| (1..=args.repeat).map(move |n| (s.clone(), n)))
        .collect();
    let total = work.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let mut attempts: Vec<Attempt> = futures_util::stream::iter(work)
        .map(|(s, n)| {
            let done = &done;
            async move {
                let mut a = attempt(lab, s.clone(), n, args.timeout).await;
                if let Some(judge) = judge {
                    judge.grade(&s, &mut a).await;
                }
                let i = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                eprintln!(
                    "[{}] {i}/{total} {} #{n}: {}",
                    lab.target.label(),
                    s.name,
                    if a.passed { "pass" } else { "FAIL" }
                );
                a
            }
        })
        .buffer_unordered(args.parallel as usize)
        .collect()
        .await;
    attempts.sort_by(|a, b| (a.scenario.as_str(), a.n).cmp(&(b.scenario.as_str(), b.n)));
    attempts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The starter suite in `evals/` loads, names facts, and records only the real tools'
    /// real argument names (a misspelt argument would never match a call).
    #[tokio::test]
    async fn the_starter_suite_loads_and_records_real_arguments_only() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../evals");
        let scenarios = Scenario::load_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(scenarios.len() >= 20, "{} scenarios", scenarios.len());
        let book = Arc::new(Book::default());
        let router = router(&book, None).unwrap_or_else(|e| panic!("{e}"));
        let specs: HashMap<&str, &crate::llm::ToolSpec> =
            router.builtin().map(|s| (s.name.as_str(), s)).collect();
        for s in &scenarios {
            assert_eq!(s.mode, Mode::Recorded, "{}", s.name);
            assert!(!s.expect.facts.is_empty(), "{}: no fact to state", s.name);
            assert!(!s.expect.tools.is_empty(), "{}: no tool to call", s.name);
            for t in &s.expect.tools {
                assert!(specs.contains_key(t.as_str()), "{}: {t} is no tool", s.name);
            }
            for r in &s.recordings {
                let spec = specs
                    .get(r.tool.as_str())
                    .unwrap_or_else(|| panic!("{}: {} is no tool", s.name, r.tool));
                let properties = spec.parameters["properties"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                for k in r.args.keys() {
                    assert!(
                        properties.contains_key(k),
                        "{}: {} has no argument {k} (it has {:?})",
                        s.name,
                        r.tool,
                        properties.keys().collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    #[test]
    fn rates_are_fractions_or_percentages() {
        assert_eq!(parse_rate("0.8"), Ok(0.8));
        assert_eq!(parse_rate("80%"), Ok(0.8));
        assert!(parse_rate("1.5").is_err());
        assert!(parse_rate("much").is_err());
    }
}
