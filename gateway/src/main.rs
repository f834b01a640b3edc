//! The `fleetgate` binary: parses the command line, sets up logging to stderr (`cli::logging`),
//! runs a command from the library and reports its error, if any, as one line. Thin on purpose.

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
    #[command(flatten)]
    log: fleetgate::cli::logging::LogArgs,
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
    Agent(fleetgate::agent::AgentArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    let result = match cli.command {
        Command::Serve(args) => fleetgate::cli::serve::run(args),
        Command::Demo(args) => fleetgate::cli::demo::run(args, &cli.log),
        Command::Certs(args) => fleetgate::cli::certs::run(args),
        Command::Kubeconfig(args) => fleetgate::cli::kubeconfig::run(args),
        Command::Agent(args) => fleetgate::agent::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            cli.log.report_error(&error);
            std::process::ExitCode::FAILURE
        }
    }
}
