//! `fleetgate-loadtest run`: load scenarios against any set of targets (direct, the floor, peers,
//! fleetgate), one target after the other with the same load, measuring each target process's CPU
//! time and resident memory from its PID. Figures are per unit of work (CPU us per request, KiB
//! per watch), because wall-clock throughput on a shared 2-core machine is noise (BENCHMARKS.md).
//!
//! The driver is a tokio runtime with as many threads as `--threads` (default 1) and its own
//! HTTP/1.1 client (`client`), so it can be pinned to one core beside the upstream.

pub mod client;
pub mod procstat;
mod scenarios;

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

pub use client::{Target, TlsOptions};
use procstat::ProcWatch;

/// Command-line arguments of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// small-get, watch-idle, watch-events or big-list.
    #[arg(long)]
    pub scenario: String,
    /// NAME=URL or NAME=kubeconfig:PATH[:CONTEXT]; repeat for each target, measured in order.
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    /// NAME=PID: the process whose CPU and memory are charged to target NAME.
    #[arg(long = "pid")]
    pub pids: Vec<String>,
    /// How long each target is loaded (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Warm-up before each measurement (connections open, caches warm).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Client connections (small-get, big-list).
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Open watch streams (watch-idle, watch-events).
    #[arg(long, default_value_t = 1000)]
    pub watches: usize,
    /// Request path below each target's URL.
    #[arg(long, default_value = "/version")]
    pub path: String,
    /// Upper bound on requests per target, so a run always ends.
    #[arg(long, default_value_t = 10_000_000)]
    pub max_requests: u64,
    /// CA file for https URL targets.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// Do not verify https URL targets.
    #[arg(long)]
    pub insecure: bool,
    /// Driver threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// What one target did in one scenario. Fields that do not apply are None.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TargetResult {
    pub target: String,
    pub scenario: String,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub req_per_sec: Option<f64>,
    pub cpu_us_per_request: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub bytes: u64,
    pub mb_per_sec: Option<f64>,
    pub cpu_ms_per_mb: Option<f64>,
    pub watches: Option<usize>,
    pub rss_base_kib: Option<f64>,
    pub rss_peak_kib: Option<f64>,
    pub kib_per_watch: Option<f64>,
    pub idle_cpu_percent: Option<f64>,
    pub events: Option<u64>,
    pub cpu_us_per_event: Option<f64>,
}

/// Parses `10s`, `500ms`, `2m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs the scenario against every target and prints a table (and JSON when asked).
pub fn run(args: RunArgs) -> anyhow::Result<Vec<TargetResult>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let results = rt.block_on(run_async(&args))?;
    print_table(&results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(results)
}

async fn run_async(args: &RunArgs) -> anyhow::Result<Vec<TargetResult>> {
    let opts = TlsOptions {
        ca: args.ca.clone(),
        insecure: args.insecure,
        alpn_h2: false,
    };
    let targets: Vec<Target> = args
        .targets
        .iter()
        .map(|t| Target::parse(t, &opts))
        .collect::<anyhow::Result<_>>()?;
    let mut pids = std::collections::HashMap::new();
    for p in &args.pids {
        let (name, pid) = p
            .split_once('=')
            .ok_or_else(|| anyhow!("--pid {p:?} is not NAME=PID"))?;
        let pid: u32 = pid.parse().with_context(|| format!("--pid {p:?}"))?;
        pids.insert(name.to_owned(), ProcWatch::new(pid)?);
    }
    let mut results = Vec::new();
    for target in &targets {
        let proc_watch = pids.get(&target.name);
        tracing::info!(target = %target.name, scenario = %args.scenario, "measuring");
        let r = match args.scenario.as_str() {
            "small-get" => scenarios::small_get(args, target, proc_watch).await?,
            "big-list" => scenarios::big_list(args, target, proc_watch).await?,
            "watch-idle" => scenarios::watch_idle(args, target, proc_watch).await?,
            "watch-events" => scenarios::watch_events(args, target, proc_watch).await?,
            other => {
                bail!("unknown scenario {other:?} (small-get, big-list, watch-idle, watch-events)")
            }
        };
        results.push(r);
    }
    Ok(results)
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// Prints one row per target.
pub fn print_table(results: &[TargetResult]) {
    println!(
        "{:<12} {:>10} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
        "target",
        "requests",
        "errors",
        "req/s",
        "cpu us/req",
        "p50 us",
        "p99 us",
        "MB/s",
        "KiB/watch",
        "events",
        "cpu us/ev"
    );
    for r in results {
        println!(
            "{:<12} {:>10} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
            r.target,
            r.requests,
            r.errors,
            fmt_opt(r.req_per_sec, 0),
            fmt_opt(r.cpu_us_per_request, 1),
            fmt_opt(r.p50_us, 0),
            fmt_opt(r.p99_us, 0),
            fmt_opt(r.mb_per_sec, 1),
            fmt_opt(r.kib_per_watch, 2),
            r.events
                .map(|e| e.to_string())
                .unwrap_or_else(|| "-".into()),
            fmt_opt(r.cpu_us_per_event, 1),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1h").is_err());
    }
}
