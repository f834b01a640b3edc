//! The `fleetgate` binary: parses the command line, sets up logging to stderr and runs a command
//! from the library. Thin on purpose.

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "fleetgate",
    version,
    about = "One endpoint for a fleet of Kubernetes clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gateway from a configuration file or directory.
    Serve(fleetgate::cli::serve::ServeArgs),
    /// Run simulated member clusters and the gateway in front of them.
    Demo(fleetgate::cli::demo::DemoArgs),
    /// The gateway's CA: create it (init) and issue client certificates (issue).
    Certs(fleetgate::cli::certs::CertsArgs),
    /// Write a kubeconfig with one context per cluster a user may reach through the gateway.
    Kubeconfig(fleetgate::cli::kubeconfig::KubeconfigArgs),
    /// Beside a pull-mode member: dial the gateways and carry their requests to the member.
    Agent(fleetgate::cli::agent::AgentArgs),
}

fn main() -> anyhow::Result<()> {
    // Colours only on a terminal: a log written to a file stays greppable (`peer=ADDR`).
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Serve(args) => fleetgate::cli::serve::run(args),
        Command::Demo(args) => fleetgate::cli::demo::run(args),
        Command::Certs(args) => fleetgate::cli::certs::run(args),
        Command::Kubeconfig(args) => fleetgate::cli::kubeconfig::run(args),
        Command::Agent(args) => fleetgate::cli::agent::run(args),
    }
}
