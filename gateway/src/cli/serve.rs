//! `fleetgate serve`: loads the configuration, builds the routing table behind its `ArcSwap`,
//! starts the gateway (`server::start_with_reload`), prints one `ready` line with the bound
//! addresses, and runs until SIGINT or SIGTERM. With `--tunnel-listen` it also accepts pull-mode
//! agents (`tunnel::listener`) before `ready`. Once the first table serves, the config-watcher's
//! file source (and, with `--management-kubeconfig`, the API source) publishes into the same
//! `SharedTable`; the shards see a new table from their next request. With both the API source
//! and `--tunnel-listen`, the API source also writes this replica's agents into the `Tunnel`
//! Clusters' status (`--replica-name`), from the tunnel registry's counts, and removes its
//! entries when `serve` ends.
//!
//! On SIGINT or SIGTERM it drains (`runtime::shutdown`): the shards stop accepting, h2 clients get
//! GOAWAY, idle HTTP/1.1 connections close, and in-flight requests may finish for
//! `limits.shutdownGraceSeconds`; then the process exits 0, cutting whatever is left (watches,
//! exec sessions). A second signal exits at once. Never touches a request.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use fleetgate_config_watcher::{
    first_table, kube_client_config, load_objects, watch_config_path, watch_kube_api, AgentReport,
    KubeSourceOptions, ReloadStatus, RouteTable, SharedTable, TablePublisher,
};
use tracing::info;

use crate::cli::signals::Signals;
use crate::server::{start_with_reload, Driver, RunningGateway, StartOptions};

/// Arguments of `fleetgate serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A Gateway/Cluster YAML file, or a directory of them.
    #[arg(long)]
    pub config: PathBuf,
    /// Shards (threads); overrides the Gateway object's `workers` (0 or absent: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The monoio driver of the shards.
    #[arg(long, value_enum, default_value_t = Driver::Auto)]
    pub driver: Driver,
    /// Follow Cluster objects in the management cluster this kubeconfig reaches (instead of the
    /// Cluster objects under --config, which then only gives the Gateway).
    #[arg(long)]
    pub management_kubeconfig: Option<PathBuf>,
    /// The kubeconfig context of the management cluster (default: its current context).
    #[arg(long)]
    pub management_context: Option<String>,
    /// Which Cluster objects to follow in the management cluster.
    #[arg(long, value_enum, default_value_t = ManagementObjects::Fleetgate)]
    pub management_objects: ManagementObjects,
    /// With --management-kubeconfig: the one namespace Secrets are read (and watched) in, for
    /// both kinds of Cluster: the Secrets of Karmada Clusters (`secretRef`,
    /// `impersonatorSecretRef`; Karmada keeps them in karmada-cluster) and of fleetgate
    /// Clusters' `spec.credentials.secretRef` (a reference without a namespace names one here).
    /// Default: the namespace of the management kubeconfig's context (`default` if it names
    /// none), where the source is pointed.
    #[arg(long, value_name = "NAMESPACE")]
    pub secrets_namespace: Option<String>,
    /// Listen for pull-mode agents (`fleetgate agent`) on this address; their tunnels carry the
    /// requests of `Tunnel` clusters. The ready line then names it `tunnel=ADDR`.
    #[arg(long, requires = "agent_ca")]
    pub tunnel_listen: Option<String>,
    /// The CA agent certificates must chain to (`fleetgate certs issue-agent` writes it); keep
    /// it apart from the client CA.
    #[arg(long, requires = "tunnel_listen")]
    pub agent_ca: Option<PathBuf>,
    /// How long a request for a `Tunnel` cluster without a connected agent waits for one
    /// (reconnecting) before its 503.
    #[arg(long, default_value_t = crate::tunnel::DEFAULT_WAIT.as_secs_f64())]
    pub tunnel_wait_seconds: f64,
    /// With --management-kubeconfig and --tunnel-listen: this replica's name in the `Tunnel`
    /// Clusters' `status.tunnels`, where each replica reports its agents (docs/pull-mode.md);
    /// unique among the replicas. Default: the pod's name (`POD_NAME`, from the downward API),
    /// else the host name.
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub replica_name: Option<String>,
}

/// The objects `serve` follows in a management cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ManagementObjects {
    /// fleetgate.io Clusters, Gateways and AccessPolicies.
    Fleetgate,
    /// Karmada cluster.karmada.io Clusters and their Secrets.
    Karmada,
    /// Both.
    Both,
}

/// The `serve` command.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let reload = ReloadStatus::new();
    // Objects are judged one by one: an invalid Cluster is left out (and reported), an invalid
    // Gateway fails the start.
    let mut table = first_table(load_objects(&args.config), &reload)
        .with_context(|| format!("loading the configuration from {}", args.config.display()))?;
    let config = table.config().clone();
    if args.management_kubeconfig.is_some() {
        // The first table is served once the management cluster is listed, merged with the
        // files (the Gateway and any local objects); until then it has no clusters.
        let mut without_clusters = config.clone();
        without_clusters.clusters.clear();
        table = RouteTable::build(&without_clusters).context("building the routing table")?;
    }
    info!(
        clusters = table.clusters().count(),
        generation = table.generation(),
        "routing table built"
    );
    warn_without_auth(&table);
    let table: SharedTable = Arc::new(ArcSwap::from_pointee(table));
    let running = start_with_reload(
        table.clone(),
        StartOptions {
            workers: args.workers,
            driver: args.driver,
        },
        Some(reload.clone()),
    )?;
    let tunnel = start_tunnel_listener(&args, &table, &reload)?;
    let publisher = match &args.management_kubeconfig {
        None => TablePublisher::new(table.clone(), reload.clone()),
        // Both sources feed one table: the files stay watched beside the management cluster.
        Some(_) => TablePublisher::merging(table.clone(), reload.clone(), config.gateway.clone()),
    };
    let _sources = match &args.management_kubeconfig {
        None => {
            // Watching starts before `ready` is printed, and checks once after the watch is in
            // place, so no change made after the first load is missed.
            let watcher = watch_config_path(&args.config, publisher)
                .context("watching the configuration for changes")?;
            (Some(watcher), None)
        }
        Some(kubeconfig) => {
            let client = kube_client_config(kubeconfig, args.management_context.as_deref())?;
            let secrets_namespace = args
                .secrets_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace.clone());
            info!(
                namespace = %secrets_namespace,
                "reading the Secrets that Clusters reference in this namespace only"
            );
            let objects = args.management_objects;
            let source = watch_kube_api(
                client,
                KubeSourceOptions {
                    fleetgate: objects != ManagementObjects::Karmada,
                    karmada: objects != ManagementObjects::Fleetgate,
                    secrets_namespace: Some(secrets_namespace),
                    fallback_gateway: Some(config.gateway.clone()),
                },
                publisher.clone(),
                tunnel.map(|_| agent_report(&args)),
            )?;
            let files = watch_config_path(&args.config, publisher)
                .context("watching the configuration for changes")?;
            wait_for_first_table(&reload);
            (Some(files), Some(source))
        }
    };
    // The signal handlers are in place before `ready` is printed: a SIGTERM sent as soon as the
    // line is read drains the gateway instead of killing it with the default action.
    let signals = Signals::install()?;
    // SIGHUP reopens the audit log (log rotation); caught from here on, like the stop signals.
    let hangup = {
        let _entered = signals.runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?
    };
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let mut line = running.ready_line();
        if let Some(tunnel) = tunnel {
            line.push_str(&format!(" tunnel={tunnel}"));
        }
        writeln!(stdout, "{line}")?;
        stdout.flush()?;
    }
    let drained = run_until_drained(&running, &table, signals, hangup);
    if let Some(audit) = &running.audit {
        audit.flush(std::time::Duration::from_secs(2));
    }
    drained
}

/// Says once, at start, what a Gateway without `spec.auth` means: no bearer token is accepted
/// (no token file, no OIDC issuer, no PassThrough cluster), so the TLS handshake requires a client
/// certificate, and a reload that adds `spec.auth` later does not change that until a restart.
fn warn_without_auth(table: &RouteTable) {
    if !crate::tls::accepts_bearer_tokens(table) {
        tracing::warn!(
            "the Gateway has no spec.auth (no tokenFile, no oidc): only client certificates signed \
             by spec.tls.clientCA authenticate, and every anonymous request will be refused"
        );
    }
}

/// What this replica reports of its agents in the `Tunnel` Clusters' status: the tunnel
/// registry's counts, signalled on every tunnel added or removed.
fn agent_report(args: &ServeArgs) -> AgentReport {
    let replica = args.replica_name.clone().unwrap_or_else(host_name);
    info!(replica = %replica, "reporting this replica's pull-mode agents in the Tunnel Clusters' status");
    let registry = crate::tunnel::registry();
    let report = AgentReport::new(replica, |cluster: &str| registry.count(cluster));
    let changed = report.changed.clone();
    registry.on_change(Box::new(move || changed.notify_one()));
    report
}

/// The host name (a pod's is its name), or `fleetgate` when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "fleetgate".to_owned())
}

/// The tunnel listener, when `--tunnel-listen` asks for one: its bound address.
fn start_tunnel_listener(
    args: &ServeArgs,
    table: &SharedTable,
    reload: &Arc<ReloadStatus>,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let wait = std::time::Duration::try_from_secs_f64(args.tunnel_wait_seconds)
        .context("--tunnel-wait-seconds must be a number of seconds")?;
    crate::tunnel::registry().set_wait(wait);
    let (Some(address), Some(agent_ca)) = (&args.tunnel_listen, &args.agent_ca) else {
        return Ok(None);
    };
    let config = crate::tunnel::listener::watch_agent_ca(table, agent_ca, reload.clone())?;
    let bound = crate::tunnel::listener::start(address, config, table.clone())?;
    Ok(Some(bound))
}

/// Waits (at most 30 s) until the management cluster's objects are listed and published, so that
/// `ready` means the clusters are served; after that the gateway reports ready anyway, serving
/// what it has, and the reload status says why.
fn wait_for_first_table(reload: &ReloadStatus) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Counted outcomes only: the first table's rejected objects (recorded, not counted) are
    // not the management cluster's.
    while reload.published() == 0 && reload.failed() == 0 {
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                "the management cluster's objects are not listed yet; serving without them"
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Blocks until SIGINT or SIGTERM, then drains the gateway: returns once every client connection
/// has closed or the grace period is over. A second signal during the drain exits the process at
/// once (status 128 + the signal number, as a shell reports a signal). Until then, each SIGHUP
/// reopens the audit log.
fn run_until_drained(
    running: &RunningGateway,
    table: &SharedTable,
    signals: Signals,
    mut hangup: tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    let Signals {
        runtime,
        mut interrupt,
        mut terminate,
    } = signals;
    runtime.block_on(async {
        let first = loop {
            tokio::select! {
                _ = interrupt.recv() => break "SIGINT",
                _ = terminate.recv() => break "SIGTERM",
                _ = hangup.recv() => reopen_audit_log(running),
            }
        };
        let grace = table.load().gateway().limits.shutdown_grace;
        info!(
            signal = first,
            connections = running.shutdown.open_connections(),
            streams = running.metrics.open_streams(),
            grace_seconds = grace.as_secs_f64(),
            "drain started: no longer accepting, GOAWAY to h2 clients, idle connections closed"
        );
        let started = std::time::Instant::now();
        running.shutdown.begin();
        tokio::select! {
            _ = running.shutdown.all_closed() => {
                info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "drain finished: every connection closed"
                );
            }
            _ = tokio::time::sleep(grace) => {
                tracing::warn!(
                    connections = running.shutdown.open_connections(),
                    streams = running.metrics.open_streams(),
                    grace_seconds = grace.as_secs_f64(),
                    "drain finished: grace period over, cutting the remaining connections"
                );
            }
            _ = interrupt.recv() => exit_on_second_signal("SIGINT", libc::SIGINT, running),
            _ = terminate.recv() => exit_on_second_signal("SIGTERM", libc::SIGTERM, running),
        }
        Ok::<_, anyhow::Error>(())
    })
}

/// SIGHUP: the audit log (when there is one) is reopened at its configured path.
fn reopen_audit_log(running: &RunningGateway) {
    match &running.audit {
        // Blocks this (signal) thread briefly, never a shard.
        Some(audit) => {
            if !audit.reopen(std::time::Duration::from_secs(2)) {
                tracing::warn!("SIGHUP: the audit writer did not reopen the log in time");
            }
        }
        None => info!("SIGHUP: no audit log to reopen"),
    }
}

fn exit_on_second_signal(name: &str, number: i32, running: &RunningGateway) -> ! {
    tracing::warn!(
        signal = name,
        connections = running.shutdown.open_connections(),
        streams = running.metrics.open_streams(),
        "second signal during the drain: exiting at once"
    );
    std::process::exit(128 + number)
}
