//! `kortex run`: cluster mode. The custom resources and their Secrets come from the API
//! server's watches; the leader (a `coordination.k8s.io` Lease) writes statuses and Events.

use super::{DatabaseArgs, Server, ToolArgs, parse_duration, run_server};
use crate::http::auth::AuthMode;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::operator::lease::{self, LeaseConfig};
use crate::operator::proposals::ClusterProposals;
use crate::operator::status::{self, StatusWriter};
use crate::operator::watch::{self, Observed, Scope};
use crate::store::{Store, redact_url};
use clap::Args;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch as channel;

/// `kortex run` options.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Serve only this namespace's objects (default: every namespace).
    #[arg(long, env = "KORTEX_WATCH_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,
    /// Database: PostgreSQL for more than one replica.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Address to listen on.
    #[arg(long, env = "KORTEX_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// How often providers are probed, e.g. `60s`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// How often a proposal delivered through Git is looked at (its change request at the
    /// forge, then the GitOps tool's sync), e.g. `10s` (docs/gitops.md).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub gitops_follow_interval: Duration,
    /// Kortex's own namespace: where its credential Secrets and its leader Lease live
    /// (default: `POD_NAMESPACE`, then the service account's or kubeconfig's namespace).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub kortex_namespace: Option<String>,
    /// This replica's identity in the leader Lease (default: `POD_NAME`, then the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// This pod's addresses (the downward API's `status.podIPs`, comma-separated): no tool
    /// or provider may target them. Default: the address this pod reaches the API server
    /// from.
    #[arg(long, env = "POD_IPS", value_delimiter = ',', value_name = "IP")]
    pub pod_ips: Vec<std::net::IpAddr>,
    /// How API callers authenticate: `auto` (none on a loopback address, otherwise
    /// Kubernetes tokens and chat keys), `kubernetes` (tokens and chat keys, wherever it
    /// listens) or `none` (loopback addresses only).
    #[arg(long, value_enum, default_value_t = RunAuth::Auto)]
    pub auth: RunAuth,
    /// Trust this header (e.g. `X-Forwarded-User`) for the user's name on requests from an
    /// authenticating proxy (oauth2-proxy and the like); needs `--auth-proxy-from`.
    #[arg(long, env = "KORTEX_AUTH_PROXY_HEADER", value_name = "HEADER")]
    pub auth_proxy_header: Option<String>,
    /// The header with the user's comma-separated groups.
    #[arg(long, default_value = "X-Forwarded-Groups", value_name = "HEADER")]
    pub auth_proxy_groups_header: String,
    /// Networks the proxy connects from (repeatable), e.g. `10.0.12.0/24`; identity headers
    /// from anywhere else are ignored.
    #[arg(long = "auth-proxy-from", value_name = "CIDR")]
    pub auth_proxy_from: Vec<crate::http::auth::Cidr>,
    /// A shared secret the proxy must send in `--auth-proxy-secret-header` as well (from
    /// a Secret, through the environment): recommended wherever other workloads can reach
    /// Kortex from the proxy's network.
    #[arg(
        long,
        env = "KORTEX_AUTH_PROXY_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub auth_proxy_secret: Option<String>,
    /// The header carrying the shared secret.
    #[arg(long, default_value = "X-Kortex-Proxy-Secret", value_name = "HEADER")]
    pub auth_proxy_secret_header: String,
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

/// `--auth`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAuth {
    /// None on loopback, Kubernetes tokens and chat keys elsewhere.
    Auto,
    /// Kubernetes bearer tokens (TokenReview) and chat keys.
    Kubernetes,
    /// No authentication (loopback addresses only).
    None,
}

/// The OIDC client secret from `NAME/KEY` (default key `client-secret`) of Kortex's
/// namespace: only from a Secret labelled `kortex.dev/use: "true"`, as every Secret Kortex
/// reads.
async fn oidc_client_secret(
    client: &kube::Client,
    namespace: &str,
    reference: &str,
) -> Result<crate::catalog::SecretValue, String> {
    let (name, key) = reference
        .split_once('/')
        .unwrap_or((reference, "client-secret"));
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    let secret = api.get(name).await.map_err(|e| {
        format!("--oidc-client-secret-ref: cannot read the Secret {namespace}/{name}: {e}")
    })?;
    if !crate::catalog::secrets::opted_in(&secret.metadata) {
        return Err(format!(
            "--oidc-client-secret-ref: the Secret {namespace}/{name} lacks the label {}: \"true\" that lets Kortex read it",
            crate::catalog::secrets::USE_LABEL
        ));
    }
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            format!("--oidc-client-secret-ref: the Secret {namespace}/{name} has no key {key}")
        })?;
    Ok(crate::catalog::SecretValue::new(value))
}

/// The deadline of every Kubernetes API call except watches.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CALL_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `kortex run`.
// Long because the command's steps in order (connect, start the run, follow its events, print the
// answer), one arm per event kind printed.
pub async fn run(args: RunArgs) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new());
    let kube_config = super::cluster_config(None).await?.ok_or_else(|| {
        "kortex run needs a cluster: run it in a pod (in-cluster service account) or set KUBECONFIG; without a cluster use kortex serve".to_owned()
    })?;
    let url = kube_config.cluster_url.to_string();
    let api_host = kube_config.cluster_url.host().map(str::to_owned);
    // Every API call but the watches has a deadline: one hung request must not stop the
    // leader's work while its Lease keeps renewing. Watches keep the client's long read
    // timeout (the API server ends them itself).
    let mut kube_config = kube_config;
    let watches = crate::operator::kube_client(kube_config.clone())
        .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
    kube_config.connect_timeout = Some(CALL_CONNECT_TIMEOUT);
    kube_config.read_timeout = Some(CALL_TIMEOUT);
    kube_config.write_timeout = Some(CALL_TIMEOUT);
    let client = crate::operator::kube_client(kube_config.clone())
        .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
    let own_namespace = args
        .kortex_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let identity = args.identity.clone().unwrap_or_else(hostname);
    let scope = Scope {
        namespace: args.namespace.clone(),
        own_namespace: own_namespace.clone(),
        reserved_headers: args
            .auth_proxy_header
            .iter()
            .chain([
                &args.auth_proxy_groups_header,
                &args.auth_proxy_secret_header,
            ])
            .cloned()
            .collect(),
    };
    tracing::info!(
        server = %url,
        namespace = args.namespace.as_deref().unwrap_or("(all)"),
        kortex_namespace = %own_namespace,
        identity = %identity,
        "cluster mode"
    );

    let store = Store::connect(&args.database.database_url)
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    tracing::info!(database = %redact_url(&args.database.database_url), "database ready");
    if store.backend() == crate::store::Backend::Sqlite {
        tracing::warn!("SQLite database: run exactly one replica (use PostgreSQL for more)");
    }

    let auth = match args.auth {
        RunAuth::None if !args.listen.ip().is_loopback() => {
            return Err(format!(
                "--auth none is allowed on loopback addresses only, not {}",
                args.listen
            ));
        }
        RunAuth::None => AuthMode::Loopback,
        RunAuth::Auto if args.listen.ip().is_loopback() && args.sso.oidc_issuer.is_none() => {
            AuthMode::Loopback
        }
        RunAuth::Auto | RunAuth::Kubernetes => AuthMode::Cluster,
    };
    let auth_proxy = match (&args.auth_proxy_header, args.auth_proxy_from.is_empty()) {
        (Some(_), true) => {
            return Err("--auth-proxy-header needs --auth-proxy-from: identity headers are trusted only from the proxy's own addresses".into());
        }
        (Some(header), false) => Some(Arc::new(crate::http::auth::AuthProxy {
            user_header: header.clone(),
            groups_header: args.auth_proxy_groups_header.clone(),
            from: args.auth_proxy_from.clone(),
            secret: args
                .auth_proxy_secret
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| {
                    (
                        args.auth_proxy_secret_header.clone(),
                        crate::catalog::SecretValue::new(s),
                    )
                }),
        })),
        (None, _) => None,
    };
    let sso_secret = match &args.sso.oidc_client_secret_ref {
        Some(reference) => Some(oidc_client_secret(&client, &own_namespace, reference).await?),
        None => None,
    };
    let cluster_auth = Arc::new(crate::operator::auth::ClusterAuth::new(
        client.clone(),
        kube_config,
    ));
    let (stop_tx, stop_rx) = channel::channel(false);
    let (config_tx, _) = channel::channel(Arc::new(LiveConfig::default()));
    let observed = Observed::start(&watches, &scope, &stop_rx);
    let compile = tokio::spawn(watch::compile_loop(
        client.clone(),
        scope,
        observed.clone(),
        config_tx.clone(),
        stop_rx.clone(),
    ));

    let (leader_tx, leader_rx) = channel::channel(false);
    let election = tokio::spawn(lease::run(
        client.clone(),
        LeaseConfig::new(&own_namespace, &identity),
        leader_tx,
        stop_rx.clone(),
    ));
    // Kortex itself is never a target of a tool or a provider. Installed before anything
    // can ask for the process's rules, so every client and the refresher share these.
    let egress = crate::egress::install(Arc::new(crate::egress::Egress::cluster(
        crate::egress::Own {
            ips: crate::operator::own_addresses::pod_ips(&args.pod_ips, api_host.as_deref()),
            ..Default::default()
        },
        &crate::operator::own_addresses::marker(&url, &own_namespace),
    )));
    let own_addresses = tokio::spawn(crate::operator::own_addresses::run(
        client.clone(),
        egress.clone(),
        own_namespace.clone(),
        args.tools.cluster_domain.clone(),
        stop_rx.clone(),
    ));
    let probes = crate::llm::probe::ProbeBoard::default();
    let plugins = channel::channel(Arc::new(crate::tools::PluginSet::default()));
    let proposals = ClusterProposals::new(client.clone(), Some(identity.clone()))
        .scoped(args.namespace.clone())
        .with_metrics(metrics.clone())
        .follow_every(args.gitops_follow_interval)
        .with_public_url(args.tools.public_url.clone());
    let duties = LeaderDuties {
        writer: StatusWriter::new(client.clone(), Some(identity)).with_metrics(metrics.clone()),
        proposals: proposals.clone(),
        host: None,
        observed,
        config: config_tx.subscribe(),
        probes: probes.clone(),
        plugins: plugins.1.clone(),
        leader: leader_rx.clone(),
        stop: stop_rx.clone(),
        metrics: metrics.clone(),
    };
    let auth_for_engine = cluster_auth.clone();
    let with_engine: super::EngineHook = Box::new(move |engine| {
        let _ = engine.cluster.set(proposals);
        let _ = engine.cluster_auth.set(auth_for_engine);
        vec![tokio::spawn(leader_duties(LeaderDuties {
            host: Some(engine.clone()),
            ..duties
        }))]
    });

    run_server(Server {
        config_tx,
        store,
        metrics,
        auth,
        listen: args.listen,
        probe_interval: args.probe_interval,
        cluster: Some((client, url)),
        // The leader executes ActionProposals; the server itself never does.
        execute_proposals: false,
        tools: args.tools,
        limits: args.limits,
        retention: args.retention,
        probes,
        plugins,
        stop: (stop_tx, stop_rx),
        tasks: vec![compile, election, own_addresses],
        with_engine: Some(with_engine),
        cluster_auth: Some(cluster_auth),
        auth_proxy,
        sso: (args.sso, sso_secret),
        slack: args.slack,
        a2a: args.a2a,
        egress,
        leader: Some(leader_rx),
    })
    .await
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("kortex-{}", std::process::id()))
}

struct LeaderDuties {
    writer: StatusWriter,
    proposals: ClusterProposals,
    /// Where proposals are mirrored and told (the chat engine); none before it starts.
    host: Option<Arc<dyn crate::operator::proposals::ProposalHost>>,
    observed: Observed,
    config: channel::Receiver<Arc<LiveConfig>>,
    probes: crate::llm::probe::ProbeBoard,
    plugins: channel::Receiver<Arc<crate::tools::PluginSet>>,
    leader: channel::Receiver<bool>,
    stop: channel::Receiver<bool>,
    metrics: Arc<Metrics>,
}

/// What only the leader does: write statuses (and their Events) and move proposals
/// (expiry, decisions, execution). Runs on every change of the configuration, the watched
/// objects or the lead, and every 2 s (expiry, probe results, retries).
async fn leader_duties(mut d: LeaderDuties) {
    let mut changes = d.observed.changed.subscribe();
    loop {
        let leading = *d.leader.borrow_and_update();
        // The liveness probe fails if this loop stops coming round while leading.
        d.metrics
            .leader_heartbeat(leading.then(jiff::Timestamp::now));
        if leading {
            let config = d.config.borrow_and_update().clone();
            if config.version > 0 {
                let probes = d.probes.read().map(|b| b.clone()).unwrap_or_default();
                let plugins = d.plugins.borrow().clone();
                let mut seen = BTreeMap::new();
                status::observed_statuses("LLMProvider", &d.observed.providers.state(), &mut seen);
                status::observed_statuses("KortexTool", &d.observed.tools.state(), &mut seen);
                status::observed_statuses("ChatPolicy", &d.observed.policies.state(), &mut seen);
                let updates = status::plan(
                    &config.catalog,
                    &probes,
                    &plugins,
                    &config.invalid,
                    &seen,
                    jiff::Timestamp::now(),
                );
                d.writer.apply(updates).await;
                if let Some(host) = &d.host {
                    let (proposals, _) = watch::convert::<crate::crd::ActionProposal>(
                        &d.observed.proposals.state(),
                        "ActionProposal",
                    );
                    d.proposals.check_admission().await;
                    d.proposals.reconcile(host, &proposals).await;
                }
            }
        } else {
            d.writer.reset();
        }
        tokio::select! {
            _ = d.config.changed() => {}
            _ = d.leader.changed() => {}
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = d.stop.changed() => return,
        }
    }
}
