//! The command line: `kortex serve | run | crds | migrate | providers check | ask | chat |
//! proposals | usage | erase-user | mcp`.

pub mod client;
pub mod eval;
pub(crate) mod llm;
pub mod login;
pub mod mcp;
pub mod pruner;
mod run;

use crate::http::auth::AuthMode;
use crate::http::{self, AppState};
use crate::live;
use crate::metrics::Metrics;
use crate::source::ManifestSource;
use crate::store::{Store, redact_url};
use crate::telemetry::{self, LogFormat};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::sync::watch;

/// Kortex: an in-cluster LLM chat server for platform teams, configured by custom resources.
#[derive(Parser, Debug)]
#[command(name = "kortex", version, about, long_about = None)]
pub struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "KORTEX_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Standalone mode: serve the API from manifest files, with an embedded SQLite database
    /// by default. No cluster needed.
    Serve(ServeArgs),
    /// Cluster mode: the operator (watches the custom resources and their Secrets, writes
    /// statuses as the elected leader) and the chat server in one process.
    Run(run::RunArgs),
    /// Print every CustomResourceDefinition as YAML (what `crds/` holds).
    Crds,
    /// Apply database migrations and exit (they are also applied at start-up).
    Migrate(DatabaseArgs),
    /// Inspect LLM providers.
    #[command(subcommand)]
    Providers(ProvidersCommand),
    /// One streamed completion, for checking a provider by hand.
    Ask(llm::AskArgs),
    /// Sign in to a Kortex server with its single sign-on (the browser signs in at the
    /// company's provider); `chat`, `proposals`, `usage`, `erase-user` and `mcp` then use
    /// the token kept in ~/.config/kortex/credentials.json (0600).
    Login(login::LoginArgs),
    /// Sign out of a Kortex server and forget its token.
    Logout(login::LogoutArgs),
    /// Chat with a Kortex server from the terminal.
    Chat(client::ChatArgs),
    /// List, approve or reject proposals on a Kortex server.
    #[command(subcommand)]
    Proposals(client::ProposalsCommand),
    /// Usage and spend of a Kortex server, as a table.
    Usage(client::UsageArgs),
    /// Erase a user on a Kortex server (admins): their sessions go, their name in usage,
    /// audit and proposal rows becomes a keyed hash. Running it again changes nothing.
    EraseUser(client::EraseUserArgs),
    /// A stdio MCP server for local MCP clients, carrying their requests to a Kortex
    /// server's `/mcp` (e.g. `claude mcp add kortex -- kortex mcp --policy NS/NAME`).
    Mcp(mcp::McpArgs),
    /// Measure investigation quality: run incident scenarios through the chat engine with
    /// recorded tools, score the answers, report per scenario and configuration
    /// (docs/evals.md). `kortex eval record SESSION_ID` turns a session into a scenario.
    Eval(crate::cli::eval::EvalArgs),
}

/// `kortex providers ...`
#[derive(Subcommand, Debug)]
pub enum ProvidersCommand {
    /// Each provider: available? reachable? models, latency, and the reason when not.
    Check(llm::CheckArgs),
}

/// Database selection.
#[derive(Args, Debug)]
pub struct DatabaseArgs {
    /// `sqlite://FILE` (created if missing) or `postgres://USER:PASSWORD@HOST/DB`.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://kortex.db")]
    pub database_url: String,
}

/// `kortex serve` options.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Manifest file or folder (its `.yaml`, `.yml` and `.json` files); repeatable. Files are
    /// watched and re-loaded on change.
    #[arg(long = "manifests", value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
    /// Database.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Address to listen on. On a loopback address the API needs no credentials; anywhere
    /// else every API call needs a chat key.
    #[arg(long, env = "KORTEX_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// How often providers are probed (also at start-up and after every change), e.g. `60s`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub probe_interval: std::time::Duration,
    /// Kubeconfig whose current context the Kubernetes tools read (default: `KUBECONFIG`,
    /// then the in-cluster service account; without any, the Kubernetes tools are off).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Tool settings.
    #[command(flatten)]
    pub tools: ToolArgs,
    /// Limits on what one client may send or hold open.
    #[command(flatten)]
    pub limits: crate::http::limits::LimitArgs,
    /// How long what is stored is kept.
    #[command(flatten)]
    pub retention: crate::store::retention::RetentionArgs,
    /// Single sign-on with an OpenID provider.
    #[command(flatten)]
    pub sso: crate::http::sso::SsoArgs,
    /// Slack's Web API.
    #[command(flatten)]
    pub slack: crate::http::slack_conv::SlackArgs,
    /// The A2A agents' cards.
    #[command(flatten)]
    pub a2a: crate::http::a2a::A2aArgs,
}

/// Settings of the built-in tools.
#[derive(Args, Debug, Clone)]
pub struct ToolArgs {
    /// Prometheus base URL for `get_metrics` and `compare_to_baseline`, e.g.
    /// `http://prometheus.monitoring:9090` (without it, those tools are off).
    #[arg(long, env = "KORTEX_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// DNS domain of the cluster's Services, for `get_admin_info`.
    #[arg(long, env = "KORTEX_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The address people open the dashboard at (e.g. `https://kortex.example.com`), for
    /// links in notifications.
    #[arg(long, env = "KORTEX_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// Record alerts and claim schedule slots, but start no triggered investigation: another
    /// replica on the same database runs them (`docs/triggers.md`).
    #[arg(long, env = "KORTEX_TRIGGERS_RECEIVE_ONLY")]
    pub triggers_receive_only: bool,
}

/// A client for the cluster the Kubernetes tools read: `--kubeconfig`, else `KUBECONFIG`,
/// else the in-cluster service account; `None` without any. Also returns the API server URL.
pub async fn cluster_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<Option<(kube::Client, String)>, String> {
    let Some(config) = cluster_config(kubeconfig).await? else {
        return Ok(None);
    };
    let url = config.cluster_url.to_string();
    let client = crate::operator::kube_client(config)
        .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
    Ok(Some((client, url)))
}

/// The cluster configuration [`cluster_client`] uses.
pub async fn cluster_config(
    kubeconfig: Option<&std::path::Path>,
) -> Result<Option<kube::Config>, String> {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions::default();
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None if std::env::var_os("KUBECONFIG").is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("KUBECONFIG: {e}"))?,
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            Config::incluster().map_err(|e| format!("in-cluster configuration: {e}"))?
        }
        None => return Ok(None),
    };
    Ok(Some(config))
}

pub(crate) use crate::crd::parse_duration;

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    // One TLS crypto provider for every client the process builds (see TOOLCHAIN.md),
    // the trace exporter's too.
    let _ = rustls::crypto::ring::default_provider().install_default();
    telemetry::init(cli.log_format);
    crate::catalog::check_commands_with(crate::llm::probe::installed);
    match cli.command {
        Command::Crds => match crate::crd::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("cannot render CRDs: {e}")),
        },
        Command::Migrate(args) => block_on(async move {
            let store = Store::connect(&args.database_url)
                .await
                .map_err(|e| e.to_string())?;
            store.migrate().await.map_err(|e| e.to_string())?;
            tracing::info!(database = %redact_url(&args.database_url), "migrations applied");
            Ok(())
        }),
        Command::Serve(args) => block_on(serve(args)),
        Command::Run(args) => block_on(run::run(args)),
        Command::Providers(ProvidersCommand::Check(args)) => {
            let mut all_ok = true;
            let code = block_on(async {
                all_ok = llm::check(args).await?;
                Ok(())
            });
            if code == ExitCode::SUCCESS && !all_ok {
                ExitCode::FAILURE
            } else {
                code
            }
        }
        Command::Ask(args) => block_on(llm::ask(args)),
        Command::Login(args) => block_on(login::login(args)),
        Command::Logout(args) => block_on(login::logout(args)),
        Command::Chat(args) => block_on(client::chat(args)),
        Command::Proposals(command) => block_on(client::proposals(command)),
        Command::Usage(args) => block_on(client::usage(args)),
        Command::EraseUser(args) => block_on(client::erase_user(args)),
        Command::Mcp(args) => block_on(mcp::run(args)),
        Command::Eval(args) => {
            let mut met = true;
            let code = block_on(async {
                met = crate::cli::eval::run(args).await?;
                Ok(())
            });
            if code == ExitCode::SUCCESS && !met {
                eprintln!("error: a pass rate is below --min-pass-rate");
                ExitCode::FAILURE
            } else {
                code
            }
        }
    }
}

fn fail(message: String) -> ExitCode {
    tracing::error!("{message}");
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

fn block_on(fut: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(fut);
    drop(runtime);
    // The spans of the last requests, before the process goes.
    telemetry::shutdown(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(message),
    }
}

/// `kortex serve`.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new());

    if args.manifests.is_empty() {
        tracing::warn!("no --manifests given: serving no providers, tools or policies");
    }
    let env: crate::source::EnvLookup = Box::new(|name| std::env::var(name).ok());
    let mut source = ManifestSource::new(args.manifests.clone(), env).map_err(|e| e.to_string())?;
    let initial = live::load(&mut source, None, &metrics);
    let (config_tx, config_rx) = watch::channel(Arc::new(initial));

    let store = Store::connect(&args.database.database_url)
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    tracing::info!(database = %redact_url(&args.database.database_url), "database ready");

    let sso = args.sso.oidc_issuer.is_some();
    let auth = if args.listen.ip().is_loopback() && !sso {
        AuthMode::Loopback
    } else if sso {
        // Signed-in users (and chat keys, for bots), wherever it listens.
        AuthMode::Keys
    } else {
        let keys = config_rx
            .borrow()
            .catalog
            .credentials
            .count(crate::catalog::CredentialKind::Chat);
        if keys == 0 {
            return Err(format!(
                "refusing to listen on {} without credentials: add a Secret labelled kortex.dev/credentials=chat to the manifests (see docs/standalone.md), or listen on a loopback address",
                args.listen
            ));
        }
        AuthMode::Keys
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let cluster = cluster_client(args.kubeconfig.as_deref()).await?;
    let watcher = (!args.manifests.is_empty()).then(|| {
        tokio::spawn(live::watch_manifests(
            source,
            config_tx.clone(),
            metrics.clone(),
            stop_rx.clone(),
        ))
    });
    run_server(Server {
        config_tx,
        store,
        metrics,
        auth,
        listen: args.listen,
        probe_interval: args.probe_interval,
        cluster,
        // A kubeconfig (the flag or KUBECONFIG) is the user's choice of a cluster to act on;
        // the in-cluster service account of a pod `kortex serve` happens to run in is not.
        execute_proposals: args.kubeconfig.is_some() || std::env::var_os("KUBECONFIG").is_some(),
        tools: args.tools,
        limits: args.limits,
        retention: args.retention,
        probes: crate::llm::probe::ProbeBoard::default(),
        plugins: watch::channel(Arc::new(crate::tools::PluginSet::default())),
        stop: (stop_tx, stop_rx),
        tasks: watcher.into_iter().collect(),
        with_engine: None,
        cluster_auth: None,
        auth_proxy: None,
        sso: (args.sso, None),
        slack: args.slack,
        a2a: args.a2a,
        egress: Arc::new(crate::egress::Egress::standalone(
            crate::egress::Own::default(),
        )),
        leader: None,
    })
    .await
}

/// What `kortex serve` and `kortex run` share: the tools, the chat server and its
/// background work.
struct Server {
    config_tx: watch::Sender<Arc<live::LiveConfig>>,
    store: Store,
    metrics: Arc<Metrics>,
    auth: AuthMode,
    listen: SocketAddr,
    probe_interval: std::time::Duration,
    cluster: Option<(kube::Client, String)>,
    /// Standalone: approved proposals are executed in `cluster` (only when a kubeconfig
    /// named it: a pod's own service account is for reading).
    execute_proposals: bool,
    tools: ToolArgs,
    limits: crate::http::limits::LimitArgs,
    retention: crate::store::retention::RetentionArgs,
    probes: crate::llm::probe::ProbeBoard,
    plugins: (
        watch::Sender<Arc<crate::tools::PluginSet>>,
        watch::Receiver<Arc<crate::tools::PluginSet>>,
    ),
    stop: (watch::Sender<bool>, watch::Receiver<bool>),
    /// Mode-specific background tasks, awaited after `stop` flips.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Cluster mode: prepares the engine and starts the tasks that need it.
    with_engine: Option<EngineHook>,
    /// Cluster mode: Kubernetes identities for the API.
    cluster_auth: Option<Arc<crate::operator::auth::ClusterAuth>>,
    /// An authenticating proxy's identity headers.
    auth_proxy: Option<Arc<crate::http::auth::AuthProxy>>,
    /// Single sign-on settings, with the client secret cluster mode read from a Secret.
    sso: (
        crate::http::sso::SsoArgs,
        Option<crate::catalog::SecretValue>,
    ),
    /// Slack's Web API.
    slack: crate::http::slack_conv::SlackArgs,
    /// The A2A agents' cards.
    a2a: crate::http::a2a::A2aArgs,
    /// Where tools and providers may send requests.
    egress: Arc<crate::egress::Egress>,
    /// Cluster mode: whether this replica leads (only the leader prunes).
    leader: Option<watch::Receiver<bool>>,
}

/// Cluster mode's hook on the engine.
type EngineHook =
    Box<dyn FnOnce(&Arc<crate::chat::Engine>) -> Vec<tokio::task::JoinHandle<()>> + Send>;

/// Serves until SIGTERM or Ctrl-C, then stops every task and closes the database.
// Long because start-up in order: store, sources, catalog, metrics, background tasks, HTTP; each
// step's result feeds the next.
async fn run_server(server: Server) -> Result<(), String> {
    let Server {
        config_tx,
        store,
        metrics,
        auth,
        listen,
        probe_interval,
        cluster,
        execute_proposals,
        tools,
        limits,
        retention,
        probes,
        plugins: (plugins_tx, plugins_rx),
        stop: (stop_tx, stop_rx),
        mut tasks,
        with_engine,
        cluster_auth,
        auth_proxy,
        sso: (sso_args, sso_secret),
        slack,
        a2a,
        egress,
        leader,
    } = server;
    crate::llm::claude_code::sweep();
    let config_rx = config_tx.subscribe();
    let egress = crate::egress::install(egress);
    let mut router = crate::tools::Router::new(metrics.clone());
    router.set_result_cap(limits.max_tool_result_bytes);
    let cluster_client = cluster
        .as_ref()
        .map(|(client, url)| (client.clone(), url.clone()));
    match cluster {
        Some((client, url)) => {
            if let Ok(u) = url.parse::<reqwest::Url>()
                && let (Some(host), Some(port)) = (u.host_str(), u.port_or_known_default())
            {
                egress.add_api_server(host, port);
            }
            let kube = crate::tools::cluster::Cluster::new(client);
            for tool in kube.tools() {
                router.add(tool);
            }
            // Service names may resolve anywhere (ExternalName): the egress guard applies.
            let guarded = egress.plugin_client(false)?;
            router.add(Arc::new(crate::tools::admin_info::AdminInfo::new(
                kube,
                guarded,
                &tools.cluster_domain,
            )));
            tracing::info!(server = %url, "Kubernetes tools read the cluster at {url}");
        }
        None => tracing::info!(
            "no cluster (no --kubeconfig, KUBECONFIG or in-cluster service account): Kubernetes tools are off"
        ),
    }
    if let Some(url) = &tools.prometheus_url {
        let client = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the Prometheus client: {e}"))?;
        let prometheus = crate::tools::prometheus::Prometheus::new(url, client)
            .map_err(|e| format!("--prometheus-url: {e}"))?;
        for tool in prometheus.tools() {
            router.add(tool);
        }
        tracing::info!(url = %url, "Prometheus tools read {url}");
    }
    let plugin_host = crate::tools::plugins::PluginHost::new(egress.clone())?;
    let plugins = tokio::spawn(crate::tools::plugins::run(
        config_rx.clone(),
        plugins_tx,
        plugin_host,
        stop_rx.clone(),
    ));
    let router = router.with_plugins(plugins_rx);
    let engine = crate::chat::Engine::new(store.clone(), config_rx.clone(), router);
    let sso = sso_args
        .build(
            &egress,
            tools.public_url.as_deref(),
            sso_secret,
            cluster_auth.is_some(),
        )?
        .map(Arc::new);
    if let Some(s) = &sso {
        tracing::info!(issuer = %s.provider.settings.issuer, kubernetes = s.kube.as_str(), "single sign-on with {}", s.provider.settings.issuer);
    }
    // A Slack profile's e-mail names the person as a sign-in does.
    let user_prefix = sso
        .as_ref()
        .map(|s| s.provider.settings.username_prefix.clone())
        .unwrap_or_default();
    let slack_door = Arc::new(slack.door(&egress, tools.public_url.as_deref(), &user_prefix)?);
    let slack_web = (slack_door.api.clone(), slack_door.http.clone());
    let state = AppState::from(crate::http::AppShared {
        config: config_rx.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        auth,
        probes: probes.clone(),
        governor: engine.governor.clone(),
        engine,
        cluster_auth,
        auth_proxy,
        limits: crate::http::limits::Limits::new(limits.clone()),
        erasure_key: retention
            .erasure_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .map(|k| Arc::from(k.as_bytes())),
        sso,
        slack: Some(slack_door.clone()),
        a2a: a2a.door(tools.public_url.as_deref())?,
    });

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(address = %local, "listening on http://{local}");
    // The port really bound (`:0` picks one): no tool or provider may call it.
    egress.add_own_port(local.port());
    // Where a claude-code run's CLI, on this machine, reaches this replica's tools.
    let loopback = if local.ip().is_unspecified() {
        match local {
            std::net::SocketAddr::V4(_) => std::net::IpAddr::from([127, 0, 0, 1]),
            std::net::SocketAddr::V6(_) => std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        }
    } else {
        local.ip()
    };
    let _ = state.engine.local_mcp.set(format!(
        "http://{}{}",
        std::net::SocketAddr::new(loopback, local.port()),
        http::mcp::PATH
    ));

    // Standalone: proposals live in the database and expire there. Cluster mode: the
    // leader moves the ActionProposal objects and mirrors them.
    let expirer = match with_engine {
        Some(hook) => {
            tasks.extend(hook(&state.engine));
            None
        }
        None => {
            // With a kubeconfig, approved proposals are carried out in that cluster, with
            // its rights, after the same checks as in cluster mode.
            if let Some((client, url)) = cluster_client.filter(|_| execute_proposals) {
                let _ = state
                    .engine
                    .executor
                    .set(crate::proposals::executor::Executor::new(client));
                tracing::info!(server = %url, "approved proposals are executed in the cluster at {url} (policies with proposals.execute: true)");
            }
            Some(tokio::spawn(expire_proposals(
                state.engine.clone(),
                stop_rx.clone(),
            )))
        }
    };
    if store.backend() == crate::store::Backend::Sqlite {
        state.engine.recover_sole_replica().await;
    }
    let maintainer = tokio::spawn(state.engine.clone().maintain(stop_rx.clone()));
    let sweeper = tokio::spawn(state.governor.clone().sweep(stop_rx.clone()));
    let notifier = tokio::spawn(
        crate::notify::Notifier::new(
            store.clone(),
            config_tx.clone(),
            (egress.plugin_client(false)?, egress.plugin_client(true)?),
            metrics.clone(),
            tools.public_url.clone(),
            probes.clone(),
        )
        .with_slack(slack_web.0, slack_web.1)
        .run(leader.clone(), stop_rx.clone()),
    );
    // Alerts and schedules start investigations (`docs/triggers.md`): every replica
    // dispatches; claims in the database keep each event and slot to one.
    let dispatcher = tokio::spawn(
        crate::trigger::Dispatcher::new(
            state.engine.clone(),
            metrics.clone(),
            !tools.triggers_receive_only,
        )
        .run(stop_rx.clone()),
    );
    let pruner = tokio::spawn(pruner::run(
        store.clone(),
        config_rx.clone(),
        retention.windows(),
        retention.retention_every,
        metrics.clone(),
        leader,
        stop_rx.clone(),
    ));
    // Runs skip providers whose fresh probe found them unreachable; the log says at start
    // which provider each policy answers with, or what to do when none can.
    let _ = state.engine.probes.set((probes.clone(), probe_interval));
    tokio::spawn(crate::govern::reach::announce(
        config_rx.clone(),
        probes.clone(),
    ));
    let prober = tokio::spawn(crate::llm::probe::run(
        config_tx.clone(),
        probes,
        probe_interval,
        stop_rx,
    ));

    let result = http::serve(
        listener,
        http::router(state),
        &limits,
        metrics.clone(),
        shutdown_signal(),
    )
    .await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let _ = prober.await;
    let _ = plugins.await;
    if let Some(e) = expirer {
        let _ = e.await;
    }
    let _ = maintainer.await;
    let _ = sweeper.await;
    let _ = pruner.await;
    let _ = notifier.await;
    let _ = dispatcher.await;
    drop(config_tx);
    store.close().await;
    result.map_err(|e| format!("server error: {e}"))
}

/// Expires undecided proposals every few seconds until `shutdown` flips.
async fn expire_proposals(engine: Arc<crate::chat::Engine>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if let Err(e) = crate::chat::proposals::expire(&engine).await {
            tracing::warn!(error = %e, "proposal expiry failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Resolves on SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("received Ctrl-C"),
        _ = term => tracing::info!("received SIGTERM"),
    }
}
