//! `fleetgate-loadtest run`: load scenarios against any set of targets (direct, the floor, peers,
//! fleetgate), one target after the other with the same load, measuring each target process's CPU
//! time and resident memory from its PID. Figures are per unit of work (CPU us per request, KiB
//! per watch), because wall-clock throughput on a shared 2-core machine is noise (BENCHMARKS.md).
//!
//! The driver is a tokio runtime with as many threads as `--threads` (default 1) and its own
//! HTTP/1.1 client (`client`), so it can be pinned to one core beside the upstream; the h2 and
//! WebSocket scenarios use the h2 crate and tokio-tungstenite over the same connections.
//!
//! Output: a table on stdout, `--json FILE`, `--chart FILE.svg` (`chart`), and a progress bar on
//! stderr when it is a terminal (`progress`). Never prints anything else on stdout.

pub mod cache;
pub mod chaos;
pub mod chart;
pub mod client;
mod exec;
mod fanout;
mod fleet;
mod h2load;
pub mod procstat;
mod progress;
pub mod rollout;
mod scenarios;
pub mod soak;
mod storm;

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

pub use client::{Target, TlsOptions};
use procstat::ProcWatch;

/// Command-line arguments of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// small-get, small-get-h2, big-list, watch-idle, watch-events, watch-latency, exec-stream,
    /// portforward-stream, reload-storm, fleet-list, watch-fanout, soak, chaos, rollout, cache.
    #[arg(long)]
    pub scenario: String,
    /// NAME=URL or NAME=kubeconfig:PATH[:CONTEXT]; repeat for each target, measured in order.
    /// fleet-list also takes NAME=kubeconfig:PATH:PREFIX*: every context starting with PREFIX,
    /// listed one after the other (the members direct, the baseline of the fleet view);
    /// watch-fanout and soak take the same form: the members through the target (for
    /// watch-fanout in `--members` order). Required, but by chaos, rollout and cache, which
    /// start their own.
    #[arg(long = "target")]
    pub targets: Vec<String>,
    /// NAME=PID: the process whose CPU and memory are charged to target NAME; NAME=PID,PID,...
    /// charges several, summed (a gateway and the pull-mode agent its requests ride through), and
    /// reports each one's share of the CPU.
    #[arg(long = "pid")]
    pub pids: Vec<String>,
    /// How long each target is loaded (e.g. 10s, 500ms, 1m; chaos: 60s by default; rollout: the
    /// writes' time before the rollout and after each of its steps, a third each).
    #[arg(long, default_value = "10s", default_value_if("scenario", "chaos", "60s"),
          value_parser = parse_duration)]
    pub duration: Duration,
    /// Warm-up before each measurement (connections open, caches warm).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Client connections (small-get, small-get-h2, reload-storm).
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Concurrent streams per h2 connection (small-get-h2), or concurrent exec sessions
    /// (exec-stream).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// `Name: value`, added to every request of every target (e.g. an Authorization header).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// reload-storm: the configuration directory the gateway watches (`fleetgate serve --config
    /// DIR`); the driver writes and removes `loadtest-storm-*.yaml` files in it.
    #[arg(long)]
    pub config_dir: Option<std::path::PathBuf>,
    /// reload-storm: configuration changes written per second.
    #[arg(long, default_value_t = 100.0)]
    pub changes_per_sec: f64,
    /// reload-storm: the gateway's admin URL (http://HOST:PORT), to read the reload counter.
    #[arg(long)]
    pub admin_url: Option<String>,
    /// exec-stream: bytes per stdin message.
    #[arg(long, default_value_t = 32 * 1024)]
    pub chunk_bytes: usize,
    /// watch-latency: the target every other is paired with (the member, direct); the first
    /// target when not given.
    #[arg(long)]
    pub reference: Option<String>,
    /// Open watch streams (watch-idle, watch-events, watch-fanout: 8000 in benches/all.sh), or
    /// pairs of them (watch-latency).
    #[arg(long, default_value_t = 1000)]
    pub watches: usize,
    /// watch-fanout: the members direct, as their admin (`kubeconfig:PATH:PREFIX*`, one context
    /// per member): the churn writes there and their `/metrics` is read.
    #[arg(long)]
    pub members: Option<String>,
    /// watch-fanout: writes per second on the members, all of them together.
    #[arg(long, default_value_t = 20.0)]
    pub churn: f64,
    /// watch-fanout: client watches closed and opened again per second.
    #[arg(long, default_value_t = 10.0)]
    pub reopen_per_sec: f64,
    /// watch-fanout: client watches per h2 connection (TLS with ALPN h2), each of another
    /// resource of one member, as a controller's informers share its connection (at most 10,
    /// the resources); 0: each watch its own HTTP/1.1 connection.
    #[arg(long, default_value_t = 0)]
    pub h2_watches: usize,
    /// Request path below each target's URL.
    #[arg(long, default_value = "/version")]
    pub path: String,
    /// fleet-list: objects per page the client asks for (`limit`), following continue tokens to
    /// the end of the list; 0 = each list in one response.
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// fleet-list: the simulated fleet's process, whose CPU per object is reported beside the
    /// target's.
    #[arg(long)]
    pub upstream_pid: Option<u32>,
    /// fleet-list: parse every listed object and check that each (cluster, namespace, name)
    /// comes once (costs the driver CPU).
    #[arg(long)]
    pub check_items: bool,
    /// Upper bound on requests per target (fleet-list: whole lists), so a run always ends.
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
    /// Draw the main figure of the scenario per target as an SVG bar chart here (soak: its
    /// timeline).
    #[arg(long)]
    pub chart: Option<std::path::PathBuf>,
    /// soak: small GETs a second, all connections together (`--connections` of them).
    #[arg(long, default_value_t = 200.0)]
    pub get_rate: f64,
    /// soak: lists a second.
    #[arg(long, default_value_t = 5.0)]
    pub list_rate: f64,
    /// soak: exec sessions a second.
    #[arg(long, default_value_t = 1.0)]
    pub exec_rate: f64,
    /// soak: one configuration change in `--config-dir` this often.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub reload_every: Duration,
    /// soak: SIGUSR1 to the simulated fleet (`--sim-pid`) this often, which restarts its next
    /// member.
    #[arg(long, value_parser = parse_duration)]
    pub restart_every: Option<Duration>,
    /// soak: how long a restarted member stays down (the sim's own `--restart-down`).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub restart_down: Duration,
    /// soak: the simulated fleet's process (`fleetgate-loadtest sim`).
    #[arg(long)]
    pub sim_pid: Option<u32>,
    /// soak, chaos: one sample of the gateway and of the load this often.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub sample_every: Duration,
    #[command(flatten)]
    pub chaos: chaos::ChaosArgs,
    #[command(flatten)]
    pub cache: cache::CacheArgs,
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
    /// h2 streams per connection, or exec sessions.
    pub streams: Option<usize>,
    /// reload-storm: configuration changes the driver wrote during the measured phase.
    pub changes_written: Option<u64>,
    /// reload-storm: reloads the gateway reported applying (its /metrics counter), if readable.
    pub reloads_applied: Option<u64>,
    /// reload-storm: reloads the gateway rejected during the storm.
    pub reloads_failed: Option<u64>,
    /// reload-storm: the same load without the storm, just before it.
    pub p50_no_storm_us: Option<f64>,
    pub p99_no_storm_us: Option<f64>,
    pub cpu_us_per_request_no_storm: Option<f64>,
    /// fleet-list: objects in one list, and pages (member requests for direct) it took.
    pub objects: Option<u64>,
    pub pages: Option<u64>,
    /// fleet-list: the clusters listed one after the other (1 through the gateway).
    pub members: Option<usize>,
    /// fleet-list: the client's `limit` (0: unpaged).
    pub limit: Option<usize>,
    /// fleet-list: median time to the first response head, and to the end of the list.
    pub ttfb_ms: Option<f64>,
    pub total_ms: Option<f64>,
    /// fleet-list: CPU per listed object of the target (`--pid`), of the simulated fleet
    /// (`--upstream-pid`), and of the driver itself.
    pub cpu_us_per_object: Option<f64>,
    pub upstream_cpu_us_per_object: Option<f64>,
    pub driver_cpu_us_per_object: Option<f64>,
    /// The target's highest resident memory since it started (VmHWM).
    pub rss_hwm_kib: Option<f64>,
    /// fleet-list with `--check-items`: distinct (cluster, namespace, name) in the last list,
    /// objects seen more than once, and objects per cluster.
    pub distinct_objects: Option<u64>,
    pub duplicate_objects: Option<u64>,
    pub objects_per_cluster: Option<std::collections::BTreeMap<String, u64>>,
    /// With several processes charged (`--pid NAME=PID,PID`): each one's share of their CPU
    /// time over the target's whole run (warm-up included), in the order given.
    pub cpu_share: Option<Vec<f64>>,
    /// watch-idle with several processes charged: each one's resident memory per watch, KiB.
    pub kib_per_watch_each: Option<Vec<f64>>,
    /// watch-fanout: the watches each member held for the watched resources near the end of the
    /// measured phase, and before the client watches opened.
    pub member_watches: Option<std::collections::BTreeMap<String, u64>>,
    pub member_watches_before: Option<std::collections::BTreeMap<String, u64>>,
    /// watch-fanout: client watches closed and opened again (by the driver, or ended early).
    pub reopens: Option<u64>,
    /// soak: its timeline and verdict.
    pub soak: Option<Box<soak::SoakReport>>,
    /// chaos: its accounting, faults and timeline.
    pub chaos: Option<Box<chaos::ChaosReport>>,
    /// rollout: the members' LISTs and the informers' incidents, per step, and the accounting.
    pub rollout: Option<Box<rollout::RolloutReport>>,
    /// cache: which part of the benchmark the row is, and its memory or storm figures.
    pub cache: Option<Box<cache::CacheReport>>,
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
    for report in results.iter().filter_map(|r| r.chaos.as_deref()) {
        chaos::print_report(report);
    }
    for report in results.iter().filter_map(|r| r.rollout.as_deref()) {
        rollout::print_report(report);
    }
    cache::print_report(&results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        let first = results.first();
        match (
            first.and_then(|r| Some((&r.target, r.soak.as_deref()?))),
            first.and_then(|r| r.chaos.as_deref()),
        ) {
            (Some((target, report)), _) => chart::write_soak_svg(path, target, report),
            (None, Some(report)) => chart::write_chaos_svg(path, report),
            (None, None) => chart::write_svg(path, &args.scenario, &results),
        }
        .with_context(|| format!("drawing {}", path.display()))?;
    }
    let mut missed = 0;
    for r in &results {
        if let Some(report) = &r.soak {
            for failure in &report.failures {
                eprintln!("soak goal missed ({}): {failure}", r.target);
                missed += 1;
            }
        }
    }
    if missed > 0 {
        bail!("the soak missed {missed} of its goals (above); results written");
    }
    let failed: Vec<&String> = results
        .iter()
        .filter_map(|r| r.chaos.as_deref())
        .flat_map(|c| &c.failures)
        .collect();
    if !failed.is_empty() {
        for failure in &failed {
            eprintln!("chaos: {failure}");
        }
        bail!(
            "chaos found {} failures (above); results written",
            failed.len()
        );
    }
    let failed: Vec<&String> = results
        .iter()
        .filter_map(|r| r.rollout.as_deref())
        .flat_map(|r| &r.failures)
        .collect();
    for failure in &failed {
        eprintln!("rollout: {failure}");
    }
    if !failed.is_empty() {
        bail!(
            "the rollout failed {} checks (above); results written",
            failed.len()
        );
    }
    Ok(results)
}

async fn run_async(args: &RunArgs) -> anyhow::Result<Vec<TargetResult>> {
    if args.scenario == "chaos" {
        // It starts its own fleet and gateway: no target.
        let bar = progress::TargetProgress::start("fleetgate", "chaos", expected_time(args));
        let r = chaos::chaos(args).await;
        bar.finish();
        return Ok(vec![r?]);
    }
    if args.scenario == "rollout" {
        let bar = progress::TargetProgress::start("fleetgate", "rollout", expected_time(args));
        let r = rollout::rollout(args).await;
        bar.finish();
        return Ok(vec![r?]);
    }
    if args.scenario == "cache" {
        let bar = progress::TargetProgress::start("fleetgate", "cache", expected_time(args));
        let r = cache::cache(args).await;
        bar.finish();
        return r;
    }
    if args.targets.is_empty() {
        bail!("--target is required (every scenario but chaos, rollout and cache)");
    }
    let opts = TlsOptions {
        ca: args.ca.clone(),
        insecure: args.insecure,
        alpn_h2: args.scenario == "small-get-h2",
        headers: args
            .headers
            .iter()
            .map(|h| client::parse_header(h))
            .collect::<anyhow::Result<_>>()?,
    };
    let groups: Vec<(String, Vec<Target>)> = args
        .targets
        .iter()
        .map(|t| Target::parse_group(t, &opts))
        .collect::<anyhow::Result<_>>()?;
    if !matches!(
        args.scenario.as_str(),
        "fleet-list" | "watch-fanout" | "soak"
    ) {
        if let Some((name, _)) = groups.iter().find(|(_, members)| members.len() != 1) {
            bail!(
                "target {name} stands for several: only fleet-list, watch-fanout and soak take those"
            );
        }
    }
    let targets: Vec<Target> = groups
        .iter()
        .map(|(_, members)| members[0].clone())
        .collect();
    let mut pids = std::collections::HashMap::new();
    for p in &args.pids {
        let (name, pid) = p
            .split_once('=')
            .ok_or_else(|| anyhow!("--pid {p:?} is not NAME=PID"))?;
        let watch = ProcWatch::parse(pid).with_context(|| format!("--pid {p:?}"))?;
        pids.insert(name.to_owned(), watch);
    }
    let upstream = args.upstream_pid.map(ProcWatch::new).transpose()?;
    let upstream_members = match &args.members {
        Some(spec) => Target::parse_group(&format!("members={spec}"), &opts)?.1,
        None if args.scenario == "watch-fanout" => bail!("watch-fanout needs --members"),
        None => Vec::new(),
    };
    if !SCENARIOS.contains(&args.scenario.as_str()) {
        bail!(
            "unknown scenario {:?} ({})",
            args.scenario,
            SCENARIOS.join(", ")
        );
    }
    let mut results = Vec::new();
    for (target, (name, members)) in targets.iter().zip(&groups) {
        let proc_watch = pids.get(name);
        tracing::info!(target = %name, scenario = %args.scenario, "measuring");
        let bar = progress::TargetProgress::start(name, &args.scenario, expected_time(args));
        let split = proc_watch.filter(|p| p.count() > 1);
        let cpu_before = split.map(ProcWatch::cpu_each).transpose()?;
        let r = match args.scenario.as_str() {
            "small-get" => scenarios::small_get(args, target, proc_watch).await,
            "small-get-h2" => h2load::small_get_h2(args, target, proc_watch).await,
            "big-list" => scenarios::big_list(args, target, proc_watch).await,
            "watch-idle" => scenarios::watch_idle(args, target, proc_watch).await,
            "watch-events" => scenarios::watch_events(args, target, proc_watch).await,
            "watch-latency" => {
                let name = args.reference.as_deref().unwrap_or(&targets[0].name);
                let reference = targets
                    .iter()
                    .find(|t| t.name == name)
                    .ok_or_else(|| anyhow!("--reference {name:?} is not a target"))?;
                scenarios::watch_latency(args, target, reference, proc_watch).await
            }
            "exec-stream" => {
                exec::byte_stream(args, target, proc_watch, exec::StreamKind::Exec).await
            }
            "portforward-stream" => {
                exec::byte_stream(args, target, proc_watch, exec::StreamKind::PortForward).await
            }
            "reload-storm" => storm::reload_storm(args, target, proc_watch).await,
            "fleet-list" => {
                let charged = fleet::Charged {
                    target: proc_watch,
                    upstream: upstream.as_ref(),
                };
                fleet::fleet_list(args, name, members, charged).await
            }
            "watch-fanout" => {
                fanout::watch_fanout(args, name, members, &upstream_members, proc_watch).await
            }
            "soak" => soak::soak(args, name, members, proc_watch).await,
            _ => unreachable!("checked against SCENARIOS above"),
        };
        bar.finish();
        let mut r = r?;
        if let (Some(p), Some(before)) = (split, cpu_before) {
            r.cpu_share = Some(shares(&before, &p.cpu_each()?));
        }
        results.push(r);
    }
    Ok(results)
}

/// Each process's share of the CPU time the group used between two readings.
fn shares(before: &[Duration], after: &[Duration]) -> Vec<f64> {
    let used: Vec<f64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b).as_secs_f64())
        .collect();
    let total: f64 = used.iter().sum();
    used.iter()
        .map(|u| if total > 0.0 { u / total } else { 0.0 })
        .collect()
}

/// Every scenario `--scenario` accepts.
pub const SCENARIOS: &[&str] = &[
    "small-get",
    "small-get-h2",
    "big-list",
    "watch-idle",
    "watch-events",
    "watch-latency",
    "exec-stream",
    "portforward-stream",
    "reload-storm",
    "fleet-list",
    "watch-fanout",
    "soak",
    "chaos",
    "rollout",
    "cache",
];

/// Roughly how long one target takes, for the progress bar.
fn expected_time(args: &RunArgs) -> Duration {
    match args.scenario.as_str() {
        // measured twice: without, then with the storm
        "reload-storm" => (args.warmup + args.duration) * 2,
        "chaos" => args.duration,
        // Two drains and restarts, each caught up: about a minute at 2000 informers.
        "rollout" => Duration::from_secs(60),
        // Six lists of --duration, two storms and the fills: a few minutes at 100 x 1,000 pods.
        "cache" => args.duration * 6 + Duration::from_secs(120),
        _ => args.warmup + args.duration,
    }
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// One count of a chaos row.
fn chaos_count(r: &TargetResult, count: fn(&chaos::ChaosReport) -> u64) -> String {
    r.chaos
        .as_deref()
        .map(|c| count(c).to_string())
        .unwrap_or_default()
}

/// One cell of a rollout row.
fn rollout_column(r: &TargetResult, cell: fn(&rollout::RolloutReport) -> String) -> String {
    r.rollout.as_deref().map(cell).unwrap_or_default()
}

/// A scenario-specific table column: its title and how to print it.
type Column = (&'static str, fn(&TargetResult) -> String);

/// Prints one row per target: the columns every scenario fills, then the scenario's own.
pub fn print_table(results: &[TargetResult]) {
    let scenario = results.first().map(|r| r.scenario.as_str()).unwrap_or("");
    let extra: &[Column] = match scenario {
        "big-list" | "exec-stream" | "portforward-stream" => &[
            ("MB/s", |r| fmt_opt(r.mb_per_sec, 1)),
            ("cpu ms/MB", |r| fmt_opt(r.cpu_ms_per_mb, 2)),
            ("peak RSS KiB", |r| fmt_opt(r.rss_peak_kib, 0)),
        ],
        "watch-idle" => &[
            ("watches", |r| {
                r.watches.map(|w| w.to_string()).unwrap_or_default()
            }),
            ("KiB/watch", |r| fmt_opt(r.kib_per_watch, 2)),
            ("idle cpu %", |r| fmt_opt(r.idle_cpu_percent, 2)),
        ],
        "watch-events" | "watch-latency" => &[
            ("events", |r| {
                r.events.map(|e| e.to_string()).unwrap_or_default()
            }),
            ("cpu us/ev", |r| fmt_opt(r.cpu_us_per_event, 1)),
        ],
        "watch-fanout" => &[
            ("watches", |r| {
                r.watches.map(|w| w.to_string()).unwrap_or_default()
            }),
            ("on members", |r| {
                r.member_watches
                    .as_ref()
                    .map(|m| {
                        m.values()
                            .map(|v| v.to_string())
                            .collect::<Vec<_>>()
                            .join("+")
                    })
                    .unwrap_or_default()
            }),
            ("events", |r| {
                r.events.map(|e| e.to_string()).unwrap_or_default()
            }),
            ("cpu us/ev", |r| fmt_opt(r.cpu_us_per_event, 2)),
            ("KiB/watch", |r| fmt_opt(r.kib_per_watch, 2)),
            ("reopens", |r| {
                r.reopens.map(|e| e.to_string()).unwrap_or_default()
            }),
        ],
        "fleet-list" | "cache" => &[
            ("objects", |r| fmt_opt(r.objects.map(|v| v as f64), 0)),
            ("pages", |r| fmt_opt(r.pages.map(|v| v as f64), 0)),
            ("ttfb ms", |r| fmt_opt(r.ttfb_ms, 1)),
            ("total ms", |r| fmt_opt(r.total_ms, 0)),
            ("cpu us/obj", |r| fmt_opt(r.cpu_us_per_object, 2)),
            ("sim us/obj", |r| fmt_opt(r.upstream_cpu_us_per_object, 2)),
            ("drv us/obj", |r| fmt_opt(r.driver_cpu_us_per_object, 2)),
            ("peak RSS MiB", |r| {
                fmt_opt(r.rss_hwm_kib.map(|k| k / 1024.0), 1)
            }),
        ],
        "reload-storm" => &[
            ("p99 quiet", |r| fmt_opt(r.p99_no_storm_us, 0)),
            ("us/req quiet", |r| {
                fmt_opt(r.cpu_us_per_request_no_storm, 1)
            }),
            ("changes", |r| {
                r.changes_written.map(|c| c.to_string()).unwrap_or_default()
            }),
            ("reloads", |r| {
                fmt_opt(r.reloads_applied.map(|v| v as f64), 0)
            }),
            ("rejected", |r| {
                fmt_opt(r.reloads_failed.map(|v| v as f64), 0)
            }),
        ],
        "soak" => &[
            ("restarts", |r| {
                r.soak
                    .as_ref()
                    .map(|s| s.restarts.len().to_string())
                    .unwrap_or_default()
            }),
            ("restart errs", |r| {
                r.soak
                    .as_ref()
                    .map(|s| s.restart_errors.values().sum::<u64>().to_string())
                    .unwrap_or_default()
            }),
            ("watches end", |r| {
                r.soak
                    .as_ref()
                    .map(|s| format!("{}/{}", s.watches_open_at_end, s.watches))
                    .unwrap_or_default()
            }),
            ("RSS +MiB", |r| {
                fmt_opt(r.soak.as_ref().and_then(|s| s.rss_growth_mib), 1)
            }),
            ("fds +", |r| {
                fmt_opt(r.soak.as_ref().and_then(|s| s.fds_growth), 0)
            }),
            ("goals", |r| {
                r.soak
                    .as_ref()
                    .map(|s| {
                        if s.failures.is_empty() {
                            "met"
                        } else {
                            "MISSED"
                        }
                        .to_owned()
                    })
                    .unwrap_or_default()
            }),
        ],
        "rollout" => &[
            ("LISTs", |r| rollout_column(r, |o| o.lists.to_string())),
            ("LISTs/inf", |r| {
                rollout_column(r, |o| format!("{:.4}", o.lists_per_informer))
            }),
            ("gw LISTs", |r| {
                rollout_column(r, |o| o.gateway_lists.to_string())
            }),
            ("relists", |r| {
                rollout_column(r, |o| o.incidents.relists.to_string())
            }),
            ("resumes", |r| rollout_column(r, |o| o.resumes.to_string())),
            ("410s", |r| {
                rollout_column(r, |o| o.incidents.expired.to_string())
            }),
            ("violations", |r| {
                rollout_column(r, |o| o.accounting.violations_total().to_string())
            }),
        ],
        "chaos" => &[
            ("expected", |r| chaos_count(r, |c| c.accounting.expected)),
            ("duplicates", |r| {
                chaos_count(r, |c| c.accounting.duplicates)
            }),
            ("gaps", |r| chaos_count(r, |c| c.accounting.gaps)),
            ("reorders", |r| chaos_count(r, |c| c.accounting.reorders)),
            ("relists", |r| chaos_count(r, |c| c.relists)),
            ("410s", |r| chaos_count(r, |c| c.expired)),
            ("faults", |r| chaos_count(r, |c| c.faults.len() as u64)),
        ],
        _ => &[],
    };
    let mut header = format!(
        "{:<16} {:>10} {:>7} {:>10} {:>10} {:>9} {:>9}",
        "target", "requests", "errors", "req/s", "cpu us/req", "p50 us", "p99 us"
    );
    for (name, _) in extra {
        header.push_str(&format!(" {name:>12}"));
    }
    println!("{header}");
    for r in results {
        let mut row = format!(
            "{:<16} {:>10} {:>7} {:>10} {:>10} {:>9} {:>9}",
            r.target,
            r.requests,
            r.errors,
            fmt_opt(r.req_per_sec, 0),
            fmt_opt(r.cpu_us_per_request, 1),
            fmt_opt(r.p50_us, 0),
            fmt_opt(r.p99_us, 0),
        );
        for (_, value) in extra {
            row.push_str(&format!(" {:>12}", value(r)));
        }
        println!("{row}");
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, shares};
    use std::time::Duration;

    #[test]
    fn cpu_shares_of_a_group() {
        let ms = Duration::from_millis;
        let split = shares(&[ms(100), ms(50)], &[ms(400), ms(150)]);
        assert!(
            (split[0] - 0.75).abs() < 1e-9 && (split[1] - 0.25).abs() < 1e-9,
            "{split:?}"
        );
        // Nothing used: no share, rather than NaN.
        assert_eq!(shares(&[ms(5), ms(5)], &[ms(5), ms(5)]), [0.0, 0.0]);
    }

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
