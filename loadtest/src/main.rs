//! `fleetgate-loadtest`: the simulated fleet (`sim`) and the load driver (`run`).
//!
//! Thin: parses the command line, starts the library's pieces on a tokio runtime, prints the
//! `ready` line of the command-line contract, and runs until SIGINT / SIGTERM.
//!
//! Logs to stderr, warnings only unless told otherwise: `FLEETGATE_SIM_LOG` (tracing directives,
//! e.g. `fleetgate_loadtest=debug`), else `RUST_LOG`. The first is the simulated fleet's own, so
//! `fleetgate demo` (which starts this binary and keeps the user's `RUST_LOG` for the gateway)
//! can still be asked for the fleet's debug lines. `--log-format json` writes one JSON object per
//! line, as `fleetgate --log-format json` does.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fleetgate_loadtest::sim::{self, FleetOptions, SimTuning};

// The fleet allocates per request (JSON encoding, headers); mimalloc cut its CPU per small GET
// against glibc malloc (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "fleetgate-loadtest",
    version,
    about = "Simulated Kubernetes fleet and load driver for fleetgate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// `text` (one human-readable line per event) or `json` (one JSON object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// The format of `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run N simulated member clusters (kube-apiserver-compatible) until SIGINT / SIGTERM.
    Sim(SimArgs),
    /// Run a load scenario against targets, charging each target process's CPU and memory.
    Run(Box<fleetgate_loadtest::run::RunArgs>),
}

#[derive(Args, Debug)]
struct SimArgs {
    /// Directory for the kubeconfigs, Cluster / Gateway objects, user credentials and PKI.
    #[arg(long)]
    dir: PathBuf,
    /// Number of member clusters.
    #[arg(long, default_value_t = 2)]
    clusters: usize,
    /// ConfigMaps (~1 KiB each) per member, spread over namespaces load-0..load-9.
    #[arg(long, default_value_t = 0)]
    objects: usize,
    /// Running pods (~870 bytes of JSON each) per member besides `hello`, spread over namespaces
    /// load-0..load-9: the objects of the fleet-list benchmark.
    #[arg(long, default_value_t = 0)]
    pods_per_member: usize,
    /// Updates per second per member, each stamped with the fleetgate.io/sent-at annotation.
    #[arg(long = "churn", default_value_t = 0.0)]
    churn_per_sec: f64,
    /// Address to write into gateway.yaml / gateway.kubeconfig (default: a free 127.0.0.1 port).
    #[arg(long)]
    gateway_listen: Option<String>,
    /// Interval between lines of `kubectl logs -f`, in milliseconds.
    #[arg(long, default_value_t = 200)]
    log_interval_ms: u64,
    /// Watch events each member keeps for resume; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 10_000)]
    history_window: usize,
    /// Ends every watch after this many seconds, as kube-apiserver ends each watch after its
    /// request timeout (0: only at the client's timeoutSeconds).
    #[arg(long, default_value_t = 0)]
    watch_timeout_seconds: u64,
    /// Answers every LIST this many milliseconds late (tests of clients that wait on one).
    #[arg(long, default_value_t = 0)]
    list_delay_ms: u64,
    /// Also serve every member in plain HTTP on a second 127.0.0.1 port (for proxies whose
    /// upstream leg is plain HTTP/1.1, as the benchmark peers'); printed as a `plaintext:` line
    /// before `ready` and written to DIR/plaintext-members (one `NAME=http://ADDR` a line).
    #[arg(long)]
    plaintext: bool,
    /// A Service every member has (`NS/NAME:PORT`), and with `=HOST:PORT` the backend its
    /// apiserver proxy (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/...`) forwards to;
    /// without one, that proxy answers 503 (no endpoints). Repeatable.
    #[arg(long = "service", value_name = "NS/NAME:PORT[=HOST:PORT]")]
    services: Vec<sim::services::SimService>,
    /// On SIGUSR1 the next member (member1, member2, ... round robin) goes down for this long,
    /// then listens again with the same objects (the soak's member restarts).
    #[arg(long, default_value = "5s", value_parser = fleetgate_loadtest::run::parse_duration)]
    restart_down: Duration,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Sim(args) => run_sim(args),
        Command::Run(args) => fleetgate_loadtest::run::run(*args).map(|_| ()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // One line, the causes joined (`{:#}`): anyhow's `{:?}` adds a backtrace when
        // RUST_BACKTRACE is set, which is for bugs, not for a port in use or a bad flag.
        Err(error) => {
            eprintln!("Error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The log subscriber: `FLEETGATE_SIM_LOG`, else `RUST_LOG`, else warnings; colours only on a
/// terminal, so a log written to a file stays greppable (`peer=ADDR`).
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = ["FLEETGATE_SIM_LOG", EnvFilter::DEFAULT_ENV]
        .into_iter()
        .find_map(|var| EnvFilter::try_from_env(var).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let tuning = SimTuning {
            log_interval: Duration::from_millis(args.log_interval_ms.max(1)),
            history_window: args.history_window.max(1),
            services: args.services,
            watch_timeout: (args.watch_timeout_seconds > 0)
                .then(|| Duration::from_secs(args.watch_timeout_seconds)),
            list_delay: Duration::from_millis(args.list_delay_ms),
            ..SimTuning::default()
        };
        let fleet = sim::start_fleet_with_tuning(
            FleetOptions {
                dir: args.dir,
                clusters: args.clusters,
                objects: args.objects,
                churn_per_sec: args.churn_per_sec,
                gateway_listen: args.gateway_listen,
            },
            tuning,
        )
        .await?;
        fleet.seed_pods(args.pods_per_member).await?;
        let addrs: Vec<String> = fleet.member_addrs().iter().map(|a| a.to_string()).collect();
        let mut stdout = std::io::stdout();
        if args.plaintext {
            let plain: Vec<String> = fleet
                .serve_plaintext()
                .await?
                .iter()
                .enumerate()
                .map(|(i, a)| format!("member{}=http://{a}", i + 1))
                .collect();
            std::fs::write(
                fleet.dir().join("plaintext-members"),
                plain.iter().map(|l| format!("{l}\n")).collect::<String>(),
            )?;
            writeln!(stdout, "plaintext: {}", plain.join(" "))?;
        }
        writeln!(
            stdout,
            "ready: {} members listening ({}); kubeconfig {}",
            addrs.len(),
            addrs.join(", "),
            fleet.dir().join("kubeconfig").display()
        )?;
        stdout.flush()?;
        let fleet = std::sync::Arc::new(fleet);
        let restarts = tokio::spawn(restart_on_sigusr1(fleet.clone(), args.restart_down));
        wait_for_termination().await;
        restarts.abort();
        let _ = restarts.await;
        match std::sync::Arc::try_unwrap(fleet) {
            Ok(fleet) => fleet.shutdown().await,
            Err(_) => tracing::warn!("a member restart still holds the fleet; not stopped cleanly"),
        }
        anyhow::Ok(())
    })
}

/// Restarts the next member (round robin) on every SIGUSR1, one restart at a time; signals that
/// arrive during a restart are taken after it.
async fn restart_on_sigusr1(fleet: std::sync::Arc<sim::FleetHandle>, down: Duration) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
            return;
        };
        let count = fleet.member_addrs().len();
        let mut next = 0usize;
        while usr1.recv().await.is_some() {
            let index = next % count;
            next += 1;
            tracing::warn!(
                member = index + 1,
                down_seconds = down.as_secs_f64(),
                "SIGUSR1: restarting member"
            );
            if let Err(error) = fleet.bounce_member(index, down).await {
                tracing::error!(member = index + 1, %error, "member restart failed");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (fleet, down);
}

async fn wait_for_termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
