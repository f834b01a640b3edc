//! `fleetgate demo`: the simulated fleet and the gateway in one command. Placeholder until the
//! lead puts the real command here (the lead owns this file).

/// Arguments of `fleetgate demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to write the fleet's files and `kubeconfig`.
    #[arg(long)]
    pub dir: std::path::PathBuf,
    /// How many member clusters to simulate.
    #[arg(long, default_value_t = 3)]
    pub clusters: usize,
    /// The gateway's listen address.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: String,
}

/// Runs the demo.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let _ = args;
    println!("not yet");
    Ok(())
}
