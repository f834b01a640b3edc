//! `chaos` (issue 33 item 5): informer-style watchers through a gateway while the driver breaks
//! things on a schedule, and an exact account of every event against each member's own history.
//!
//! The scenario brings its own world, in a work directory: a simulated fleet in this process
//! (`--chaos-members`, no churn, a short `--history-window` so that a long outage ends in 410),
//! one TCP `proxy` per member, and `fleetgate serve --config DIR` as a child process
//! (`--gateway-bin`) behind one more proxy, so the watchers keep one address when the gateway
//! restarts elsewhere. The gateway's Cluster files point at the members' proxies, but for the last
//! `--pull-members` members (1 by default), which are pull-mode (`connectMode: Tunnel`): each has
//! an agent, `fleetgate agent` as a child process (same binary), that dials the gateway's tunnel
//! listener through a proxy of its own and reaches its member through the member's proxy. With
//! `--shared-watches` the gateway shares the configmaps' member watches (off by default). Then,
//! for `--duration`:
//!
//! - `--watchers` watchers, spread over `/clusters/memberK` of each member and `/fleet`, each as
//!   an informer: LIST the configmaps of the `chaos` namespace, WATCH from the list's
//!   resourceVersion with bookmarks, resume from the last resourceVersion whenever the stream
//!   ends, LIST again after a 410. The fleet view's resourceVersions are composite (each member's
//!   by cluster, docs/fleet.md): each event counts for its cluster's member, and the other
//!   members' versions in it place those members as a bookmark would. The last `--h2-share` of
//!   them (half by default, over every view) speak h2 over TLS, every LIST and WATCH a stream of
//!   one shared connection as client-go's are (`h2`), opened again when it ends; the rest speak
//!   HTTP/1.1, a connection per request. The report counts the h2 ones apart too.
//! - A writer per member, straight to the member: creates, merge patches and deletes of
//!   configmaps, `--write-rate` a second, each stamped `fleetgate.io/sent-at`. The member's own
//!   history is its event log (every change in the namespace, with its resourceVersion, read from
//!   the member in this process); every write's answer is checked against it.
//! - Faults from a seeded schedule (`--seed`, `--faults`), one at a time with quiet between:
//!   a member blackholed (its proxy holds every byte, then resets the connections the partition
//!   outlived) and a member slowed (its proxy delays every byte), its connections cut (reset),
//!   the member restarted (down, then back with its objects and history), the gateway restarted
//!   (SIGTERM, a new one started at once) and killed (SIGKILL, then started), configuration
//!   churn (a member's Cluster relabelled, an extra Cluster added and removed, then everything
//!   restored), and a pull-mode member's tunnel cut (its tunnel proxy resets it: a flap, the
//!   agent dials again) and killed (the agent SIGKILLed, then started again).
//!
//! After the run the faults are over; one last write per member marks its final resourceVersion,
//! and the driver waits (bounded by `--settle-timeout`) until every watcher has reached it, on the
//! watchers' own progress signal. Then [`check`] accounts each watcher's view of each member:
//! every change after its start exactly once, in order, or covered by a relist after a 410.
//! Violations (duplicates, gaps, reorders, unknown events, watchers that never caught up) are
//! charged to the fault they happened in or after, printed with the counts, and fail the run.
//! The members' LISTs are counted too: each member's `fleetgate_sim_requests_total` LIST
//! counter is read at every fault's start and at the end, and the LISTs from one fault to the
//! next are that fault's (printed per fault and per kind).
//!
//! Like the soak, every `--sample-every` it records the gateway's resident memory and open
//! descriptors and the write-to-delivery latency of the events of the interval; `--chart` draws
//! them. The soak's flatness rule judges them, each gateway process apart (a restart starts
//! afresh), after its first [`FLAT_WARMUP`]; a growth fails the run. Called by `run`
//! (`--scenario chaos`); needs no `--target`.

mod check;
pub(crate) mod h2;
pub(crate) mod members;
pub(crate) mod proxy;
pub(crate) mod watcher;
pub(crate) mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;

pub use check::{check, Change, Kind, Obs, Tally, Violation};
use h2::H2Shared;
use members::{Recorder, Writer};
pub use watcher::decode_composite;
use watcher::{Incident, Watcher};
use world::{build_world, member_lists, run_schedule, targets, World};

use super::client::{HttpConn, Target};
use super::fanout::body_request;
use super::procstat::ProcWatch;
use super::scenarios::new_hist;
use super::soak::{growth_failures, trend};
use super::{parse_duration, RunArgs, TargetResult};

/// The namespace every watcher and writer works in.
pub const NAMESPACE: &str = "chaos";
const COLLECTION: &str = "/api/v1/namespaces/chaos/configmaps";
/// A request (list, write) gives up after this long and is tried again.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// What happens this long after a fault ended is still charged to it.
pub const FAULT_GRACE: Duration = Duration::from_secs(10);
/// Quiet before the first fault and between two.
pub const FIRST_FAULT: Duration = Duration::from_secs(3);
/// A gateway process's samples this long after its first are its warm-up (watchers coming back,
/// member connections opened), left out of the flatness verdict.
pub const FLAT_WARMUP: Duration = Duration::from_secs(10);

/// `chaos`' own flags (flattened into `run`'s).
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// chaos: seed of the fault schedule and of the writes (the same seed, the same schedule).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// chaos, rollout: members of the simulated fleet it starts (rollout: 3 by default).
    #[arg(
        long,
        default_value_t = 2,
        default_value_if("scenario", "rollout", "3")
    )]
    pub chaos_members: usize,
    /// chaos, rollout: informer-style watchers, spread over /clusters/NAME of each member and
    /// /fleet (rollout: 2000 by default, one in 20 on /fleet).
    #[arg(
        long,
        default_value_t = 12,
        default_value_if("scenario", "rollout", "2000")
    )]
    pub watchers: usize,
    /// chaos, rollout: writes a second on each member (rollout: 2 by default).
    #[arg(
        long,
        default_value_t = 10.0,
        default_value_if("scenario", "rollout", "2")
    )]
    pub write_rate: f64,
    /// chaos: the faults injected, comma-separated (default: all of blackhole, slow, cut,
    /// member-restart, gateway-restart, gateway-kill, config-churn, and with pull-mode members
    /// tunnel-cut and tunnel-kill).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
    /// chaos: how many members (the last ones) reach the gateway in pull mode, through a
    /// `fleetgate agent` child process dialing its tunnel listener.
    #[arg(long, default_value_t = 1)]
    pub pull_members: usize,
    /// chaos, rollout: the share of the watchers (0 to 1) that speak h2 over TLS to the gateway,
    /// their LISTs and WATCHes streams of one shared connection (rollout: one per 100 of them);
    /// the rest speak HTTP/1.1, one connection per request.
    #[arg(long, default_value_t = 0.5)]
    pub h2_share: f64,
    /// chaos: the gateway shares the configmaps' member watches (`spec.sharedWatches`, scope
    /// Gateway: one member watch per member for every watcher of it, docs/watches.md) instead of
    /// giving each client watch its own.
    #[arg(long)]
    pub shared_watches: bool,
    /// chaos, rollout: past events each member keeps for resume; a watch resumed from further
    /// back gets 410 Expired (rollout: 10000 by default).
    #[arg(
        long,
        default_value_t = 30,
        default_value_if("scenario", "rollout", "10000")
    )]
    pub history_window: usize,
    /// chaos, rollout: the gateway binary (default: $FLEETGATE_BIN, else `fleetgate` beside this program,
    /// else `fleetgate` on PATH).
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// chaos, rollout: how long the end (rollout: each step) waits for every watcher to catch up
    /// with the members.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub settle_timeout: Duration,
    /// chaos, rollout: keep the fleet's files and the gateway's logs here (default: a temporary directory,
    /// removed after a clean run).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

impl ChaosArgs {
    /// How many of `total` watchers speak h2 (`--h2-share`).
    pub(crate) fn h2_watchers(&self, total: usize) -> anyhow::Result<usize> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.h2_share),
            "--h2-share {}: from 0 to 1",
            self.h2_share
        );
        Ok((total as f64 * self.h2_share).round() as usize)
    }
}

/// A fault the schedule can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    Blackhole,
    Slow,
    Cut,
    MemberRestart,
    GatewayRestart,
    GatewayKill,
    ConfigChurn,
    /// A pull-mode member's tunnel reset on its way (the agent dials again): a flap.
    TunnelCut,
    /// A pull-mode member's agent killed (SIGKILL) and started again.
    TunnelKill,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Blackhole,
        FaultKind::Slow,
        FaultKind::Cut,
        FaultKind::MemberRestart,
        FaultKind::GatewayRestart,
        FaultKind::GatewayKill,
        FaultKind::ConfigChurn,
        FaultKind::TunnelCut,
        FaultKind::TunnelKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Blackhole => "blackhole",
            FaultKind::Slow => "slow",
            FaultKind::Cut => "cut",
            FaultKind::MemberRestart => "member-restart",
            FaultKind::GatewayRestart => "gateway-restart",
            FaultKind::GatewayKill => "gateway-kill",
            FaultKind::ConfigChurn => "config-churn",
            FaultKind::TunnelCut => "tunnel-cut",
            FaultKind::TunnelKill => "tunnel-kill",
        }
    }

    pub fn parse(name: &str) -> anyhow::Result<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == name.trim())
            .ok_or_else(|| {
                anyhow!(
                    "unknown fault {name:?} ({})",
                    FaultKind::ALL.map(FaultKind::name).join(", ")
                )
            })
    }

    /// Whether it needs a pull-mode member.
    pub fn tunnel(self) -> bool {
        matches!(self, FaultKind::TunnelCut | FaultKind::TunnelKill)
    }

    /// How long it lasts (for an instant fault, the quiet kept after it), and for a slow member
    /// the delay, drawn from `rng`.
    fn draw(self, rng: &mut StdRng) -> (Duration, Duration) {
        let ms =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
        match self {
            FaultKind::Blackhole | FaultKind::Slow => (ms(rng, 2500, 5000), ms(rng, 100, 500)),
            FaultKind::MemberRestart => (ms(rng, 1000, 3000), Duration::ZERO),
            FaultKind::ConfigChurn => (ms(rng, 2000, 4000), Duration::ZERO),
            // The old gateway drains for its shutdownGraceSeconds (5 s in the sim's files).
            FaultKind::GatewayRestart => (ms(rng, 5500, 6500), Duration::ZERO),
            FaultKind::Cut | FaultKind::GatewayKill | FaultKind::TunnelCut => {
                (ms(rng, 500, 1500), Duration::ZERO)
            }
            // How long the agent stays down.
            FaultKind::TunnelKill => (ms(rng, 500, 2000), Duration::ZERO),
        }
    }
}

/// One fault of the schedule, before it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// From the start of the run.
    pub at: Duration,
    pub kind: FaultKind,
    /// The member it hits (for member faults).
    pub member: usize,
    pub hold: Duration,
    pub delay: Duration,
}

/// The schedule: rounds of every kind in a seeded order, each fault after [`FIRST_FAULT`] of
/// quiet plus 2-4 s, none that would not end (with its nominal hold and a second) before
/// `duration`.
pub fn plan(seed: u64, kinds: &[FaultKind], members: usize, duration: Duration) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut at = FIRST_FAULT;
    if kinds.is_empty() || members == 0 {
        return out;
    }
    'rounds: loop {
        let mut round = kinds.to_vec();
        round.shuffle(&mut rng);
        for kind in round {
            let (hold, delay) = kind.draw(&mut rng);
            if at + hold + Duration::from_secs(1) > duration {
                break 'rounds;
            }
            out.push(Planned {
                at,
                kind,
                member: rng.random_range(0..members),
                hold,
                delay,
            });
            at += hold + Duration::from_millis(rng.random_range(2000..=4000));
        }
    }
    out
}

/// A fault as it happened.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FaultRecord {
    pub kind: &'static str,
    /// The member, or `gateway`, or `config`.
    pub target: String,
    /// Seconds since the run started.
    pub start_s: f64,
    pub end_s: f64,
    pub detail: String,
    /// The LISTs the members had served when it started.
    #[serde(skip)]
    pub lists_at_start: Option<u64>,
    /// The LISTs the members served from its start to the next fault's (or, for the last, to
    /// the end of the settle), summed over the members; None when a member did not answer.
    pub member_lists: Option<u64>,
}

/// What happened in and after the faults of one kind.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FaultTally {
    pub count: u64,
    /// Watch streams that broke (the connection failed), or ended cleanly, and watches that could
    /// not be opened.
    pub breaks: u64,
    pub ends: u64,
    pub open_failures: u64,
    pub expired: u64,
    pub relists: u64,
    pub violations: u64,
    /// LISTs the members served in and after these faults ([`FaultRecord::member_lists`]; for
    /// `none`, from the watchers' first lists to the first fault).
    pub member_lists: u64,
}

/// One sample of the timeline.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChaosSample {
    pub at_s: f64,
    pub rss_mib: Option<f64>,
    pub fds: Option<u64>,
    /// Write-to-delivery latency of the events of the interval (from the `sent-at` stamp).
    pub event_p50_ms: Option<f64>,
    pub event_p99_ms: Option<f64>,
    pub events: u64,
    pub watches_open: i64,
    /// The fault active at the sample, if any.
    pub fault: Option<String>,
    /// The gateway process sampled.
    pub gateway_pid: u32,
}

/// What a chaos run found; `failures` empty means no violation.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub members: Vec<String>,
    /// The members reached in pull mode, through an agent's tunnel.
    pub pull_members: Vec<String>,
    pub watchers: usize,
    /// The watchers that spoke h2 (`--h2-share`), and what they expected, saw and got wrong
    /// (counted in the totals too); the shared h2 connections they opened.
    pub h2_watchers: usize,
    pub h2_expected: u64,
    pub h2_seen: u64,
    pub h2_violations: u64,
    pub h2_connections: u64,
    pub writes: u64,
    pub writes_failed: u64,
    /// Changes in the members' histories.
    pub changes: u64,
    #[serde(flatten)]
    pub accounting: Accounting,
    pub relists: u64,
    pub expired: u64,
    pub breaks: u64,
    pub ends: u64,
    pub open_failures: u64,
    pub settle_s: f64,
    pub faults: Vec<FaultRecord>,
    pub per_fault: BTreeMap<String, FaultTally>,
    /// The gateway's growth of resident memory and open descriptors, by the soak's rule
    /// (`soak::trend`, bounds `FLAT_RSS_MIB` and `FLAT_FDS`) applied to each gateway process's
    /// own samples after its first [`FLAT_WARMUP`]: the largest over the processes judged (those
    /// with three samples or more).
    pub rss_growth_mib: Option<f64>,
    pub fds_growth: Option<f64>,
    pub processes_judged: usize,
    /// The first violations, each in a sentence.
    pub violations: Vec<String>,
    pub samples: Vec<ChaosSample>,
    pub failures: Vec<String>,
}

/// Shared by every task of the run (of `chaos`, and of `rollout`, which reuses its watchers).
pub(crate) struct Run {
    start: Instant,
    pub(crate) members: Vec<String>,
    latency: Mutex<Histogram<u64>>,
    events: AtomicU64,
    pub(crate) watches_open: AtomicI64,
    /// Woken whenever a watcher moves.
    pub(crate) progress: Notify,
    pub(crate) listed: AtomicUsize,
    gateway_pid: AtomicU32,
    fault_now: Mutex<Option<String>>,
    /// The `timeoutSeconds` each watch asks for, drawn from this range (chaos: 5 to 15 s).
    pub(crate) watch_timeout_s: std::ops::RangeInclusive<u64>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Run {
    /// A run starting now, over `members`.
    pub(crate) fn new(members: Vec<String>) -> Run {
        Run {
            start: Instant::now(),
            members,
            latency: Mutex::new(new_hist()),
            events: AtomicU64::new(0),
            watches_open: AtomicI64::new(0),
            progress: Notify::new(),
            listed: AtomicUsize::new(0),
            gateway_pid: AtomicU32::new(0),
            fault_now: Mutex::new(None),
            watch_timeout_s: 5..=15,
        }
    }

    /// Milliseconds since the run started.
    pub(crate) fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn member_index(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m == name)
    }
}

/// Samples the gateway and the events every `every` until `stop`.
async fn sample_loop(run: Arc<Run>, every: Duration, stop: Arc<Notify>) -> Vec<ChaosSample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval_at((run.start + every).into(), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events_before = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.notified() => return samples,
        }
        let hist = std::mem::replace(&mut *lock(&run.latency), new_hist());
        let quantile =
            |q: f64| (!hist.is_empty()).then(|| hist.value_at_quantile(q) as f64 / 1000.0);
        let pw = ProcWatch::new(run.gateway_pid.load(Ordering::Relaxed)).ok();
        let events = run.events.load(Ordering::Relaxed);
        samples.push(ChaosSample {
            at_s: run.start.elapsed().as_secs_f64(),
            rss_mib: pw
                .as_ref()
                .and_then(|p| p.rss().ok())
                .map(|b| b as f64 / (1024.0 * 1024.0)),
            fds: pw.as_ref().and_then(|p| p.open_fds().ok()),
            event_p50_ms: quantile(0.5),
            event_p99_ms: quantile(0.99),
            events: events - events_before,
            watches_open: run.watches_open.load(Ordering::Relaxed),
            fault: lock(&run.fault_now).clone(),
            gateway_pid: run.gateway_pid.load(Ordering::Relaxed),
        });
        events_before = events;
    }
}

/// The fault `at_ms` is charged to: the last one that started by then and ended at most
/// [`FAULT_GRACE`] before.
fn charged(faults: &[FaultRecord], at_ms: u64) -> Option<&'static str> {
    let at = at_ms as f64 / 1000.0;
    faults
        .iter()
        .rev()
        .find(|f| f.start_s <= at && at <= f.end_s + FAULT_GRACE.as_secs_f64())
        .map(|f| f.kind)
}

/// Fills each fault's [`FaultRecord::member_lists`] from the counters read at its start and at
/// the next one's (`at_end` after the last); returns the LISTs before the first fault (from
/// `at_start`, read after the watchers' first lists).
fn count_lists(
    faults: &mut [FaultRecord],
    at_start: Option<u64>,
    at_end: Option<u64>,
) -> Option<u64> {
    let next: Vec<Option<u64>> = faults
        .iter()
        .skip(1)
        .map(|f| f.lists_at_start)
        .chain([at_end])
        .collect();
    for (f, until) in faults.iter_mut().zip(next) {
        f.member_lists = until
            .zip(f.lists_at_start)
            .and_then(|(u, s)| u.checked_sub(s));
    }
    let first = faults.first().map_or(at_end, |f| f.lists_at_start);
    first?.checked_sub(at_start?)
}

/// The soak's flatness rule for the gateway's resident memory and descriptors, applied to each
/// gateway process apart (a restarted gateway starts afresh): the growth (`soak::trend`) of its
/// samples after its first [`FLAT_WARMUP`]; the largest over the processes with three such
/// samples or more, and how many those were.
fn flatness(samples: &[ChaosSample]) -> (Option<f64>, Option<f64>, usize) {
    let mut processes: Vec<Vec<&ChaosSample>> = Vec::new();
    for s in samples {
        match processes.last_mut() {
            Some(p) if p[0].gateway_pid == s.gateway_pid => p.push(s),
            _ => processes.push(vec![s]),
        }
    }
    let (mut rss, mut fds, mut judged) = (None::<f64>, None::<f64>, 0);
    for p in &processes {
        let warm = p[0].at_s + FLAT_WARMUP.as_secs_f64();
        let after: Vec<&&ChaosSample> = p.iter().filter(|s| s.at_s >= warm).collect();
        let growth = |f: fn(&ChaosSample) -> Option<f64>| {
            trend(
                &after
                    .iter()
                    .filter_map(|s| Some((s.at_s, f(s)?)))
                    .collect::<Vec<_>>(),
            )
            .map(|t| t.2)
        };
        let r = growth(|s| s.rss_mib);
        let d = growth(|s| s.fds.map(|n| n as f64));
        if r.is_some() || d.is_some() {
            judged += 1;
        }
        rss = r.map_or(rss, |g| Some(rss.map_or(g, |m| m.max(g))));
        fds = d.map_or(fds, |g| Some(fds.map_or(g, |m| m.max(g))));
    }
    (rss, fds, judged)
}

/// `chaos`: see the module documentation.
pub async fn chaos(args: &RunArgs) -> anyhow::Result<TargetResult> {
    let c = &args.chaos;
    let pulls = c.pull_members.min(c.chaos_members.max(1));
    let kinds: Vec<FaultKind> = if c.faults.is_empty() {
        FaultKind::ALL
            .into_iter()
            .filter(|k| pulls > 0 || !k.tunnel())
            .collect()
    } else {
        c.faults
            .iter()
            .filter(|f| !f.trim().is_empty() && f.trim() != "none")
            .map(|f| FaultKind::parse(f))
            .collect::<anyhow::Result<_>>()?
    };
    if let Some(k) = kinds.iter().find(|k| k.tunnel() && pulls == 0) {
        bail!(
            "--faults {}: needs a pull-mode member (--pull-members)",
            k.name()
        );
    }
    let (dir, temporary) = match &c.work_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("fleetgate-chaos-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let world = build_world(args, &dir).await?;
    let outcome = drive(args, &world, &kinds).await;
    if let Some(g) = world.gateway.lock().await.take() {
        g.stop(false).await;
    }
    world.stop_agents().await;
    let World { fleet, .. } = world;
    fleet.shutdown().await;
    let clean = outcome.as_ref().is_ok_and(|r| r.failures.is_empty());
    if temporary && clean {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "chaos: the fleet's files and the gateway's log are in {}",
            dir.display()
        );
    }
    let report = outcome?;
    Ok(TargetResult {
        target: "fleetgate".into(),
        scenario: "chaos".into(),
        requests: report.writes,
        errors: report.accounting.violations_total(),
        seconds: args.duration.as_secs_f64(),
        watches: Some(report.watchers),
        events: Some(report.accounting.seen),
        chaos: Some(Box::new(report)),
        ..Default::default()
    })
}

/// The accounting of every watcher's view of every member against the member's history, as
/// [`check`] tallies it; `chaos` and `rollout` report it alike.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Accounting {
    pub expected: u64,
    pub seen: u64,
    /// Changes a relist after a 410 covered.
    pub covered: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub reorders: u64,
    pub unknown: u64,
    /// (watcher, member) pairs that had not caught up when the settle timed out.
    pub stalled: u64,
}

impl Accounting {
    /// One watcher's view of one member, its violations counted by kind.
    pub fn add(&mut self, tally: &check::Tally) {
        self.expected += tally.expected;
        self.seen += tally.seen;
        self.covered += tally.covered;
        for found in &tally.found {
            match found.violation {
                Violation::Duplicate => self.duplicates += 1,
                Violation::Reorder => self.reorders += 1,
                Violation::Unknown => self.unknown += 1,
                Violation::Gap => self.gaps += 1,
            }
        }
    }

    pub fn violations_total(&self) -> u64 {
        self.duplicates + self.gaps + self.reorders + self.unknown + self.stalled
    }

    /// What fails a run: any violation, or no event seen.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.violations_total() > 0 {
            failures.push(format!(
                "{} accounting violations: {} duplicates, {} gaps, {} reorders, {} unknown events, {} watchers never caught up",
                self.violations_total(),
                self.duplicates,
                self.gaps,
                self.reorders,
                self.unknown,
                self.stalled
            ));
        }
        if self.seen == 0 {
            failures.push("no watcher saw any event".into());
        }
        failures
    }
}

/// Creates the [`NAMESPACE`] on a member (straight); one already there is fine.
pub(crate) async fn create_namespace(target: &Target) -> anyhow::Result<()> {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let request = body_request(
        target,
        "POST",
        "/api/v1/namespaces",
        "application/json",
        &serde_json::to_vec(&ns)?,
    );
    let mut conn = HttpConn::new(target.connect().await?);
    let head = conn.send(&request).await?;
    conn.read_body(&head, |_| {}).await?;
    anyhow::ensure!(
        matches!(head.status, 200 | 201 | 409),
        "{}: creating the namespace answered {}",
        target.name,
        head.status
    );
    Ok(())
}

/// The run itself, in a world built.
async fn drive(args: &RunArgs, world: &World, kinds: &[FaultKind]) -> anyhow::Result<ChaosReport> {
    let c = &args.chaos;
    let run = world.run.clone();
    let count = run.members.len();
    let (direct, views) = targets(world)?;
    for target in &direct {
        create_namespace(target).await?;
    }
    let recorders: Vec<Arc<Recorder>> = (0..count)
        .map(|m| Recorder::start(&world.fleet, m, run.clone()))
        .collect::<anyhow::Result<_>>()?;

    // Watchers first, each listed before anything is written. The last `--h2-share` of them
    // (consecutive, so over every view) speak h2 on one shared connection.
    let total = c.watchers.max(1);
    let h2_count = c.h2_watchers(total)?;
    let shared = Arc::new(H2Shared::new(&views[0].1));
    let watchers: Vec<Arc<Watcher>> = (0..total)
        .map(|i| {
            let (view, target) = views[i % views.len()].clone();
            let h2 = (i >= total - h2_count).then(|| shared.clone());
            let name = format!(
                "{}#{}{}",
                target.name,
                i / views.len(),
                if h2.is_some() { "/h2" } else { "" }
            );
            Arc::new(Watcher::new(name, view, target, count, h2))
        })
        .collect();
    let tasks: Vec<_> = watchers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            tokio::spawn(
                w.clone()
                    .follow(run.clone(), c.seed.wrapping_add(1000 + i as u64)),
            )
        })
        .collect();
    let listed = async {
        while run.listed.load(Ordering::Relaxed) < watchers.len() {
            let moved = run.progress.notified();
            if run.listed.load(Ordering::Relaxed) >= watchers.len() {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), moved).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), listed)
        .await
        .map_err(|_| {
            anyhow!("the watchers could not list through the gateway in 60 s (see gateway.log)")
        })?;

    // The run: writers, faults and samples, all timed from here.
    let lists_at_start = member_lists(&direct).await;
    let start = Instant::now();
    let run_start_offset = start.duration_since(run.start);
    let deadline = start + args.duration;
    let schedule: Vec<Planned> = plan(c.seed, kinds, count, args.duration)
        .into_iter()
        .map(|p| Planned {
            at: p.at + run_start_offset,
            ..p
        })
        .collect();
    let stop_samples = Arc::new(Notify::new());
    let sampler = tokio::spawn(sample_loop(
        run.clone(),
        args.sample_every,
        stop_samples.clone(),
    ));
    let writers: Vec<_> = direct
        .iter()
        .enumerate()
        .map(|(m, target)| {
            let mut writer = Writer::new(
                target.clone(),
                c.seed.wrapping_mul(31).wrapping_add(m as u64),
            );
            let rate = c.write_rate.max(0.1);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while Instant::now() < deadline {
                    tick.tick().await;
                    if let Err(error) = writer.write(false).await {
                        tracing::debug!(%error, "chaos: write failed");
                    }
                }
                writer
            })
        })
        .collect();
    let mut faults = run_schedule(world, schedule, &direct).await;
    let mut writers_done = Vec::new();
    for w in writers {
        writers_done.push(w.await.context("writer task")?);
    }

    // The end: every member's last write marks where every watcher must get to.
    let mut finals = Vec::new();
    for (m, writer) in writers_done.iter_mut().enumerate() {
        let mut last = None;
        for _ in 0..20 {
            match writer.write(true).await {
                Ok(Some(rv)) => {
                    last = Some(rv);
                    break;
                }
                Ok(None) => {
                    writer.write(false).await.ok();
                }
                Err(error) => {
                    tracing::warn!(%error, member = m, "chaos: the last write failed; again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        let rv =
            last.ok_or_else(|| anyhow!("{}: the last write never succeeded", run.members[m]))?;
        anyhow::ensure!(
            recorders[m].reach(rv).await,
            "{}: its event log never reached {rv}",
            run.members[m]
        );
        finals.push(rv);
    }
    let settle_started = Instant::now();
    let settle_until = settle_started + c.settle_timeout;
    let lagging = |watchers: &[Arc<Watcher>]| -> Vec<(String, String, u64, u64)> {
        watchers
            .iter()
            .flat_map(|w| {
                w.members(count)
                    .into_iter()
                    .filter(|&m| w.positions[m].load(Ordering::Relaxed) < finals[m])
                    .map(|m| {
                        (
                            w.name.clone(),
                            run.members[m].clone(),
                            w.positions[m].load(Ordering::Relaxed),
                            finals[m],
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let stalled = loop {
        let moved = run.progress.notified();
        let behind = lagging(&watchers);
        if behind.is_empty() || Instant::now() >= settle_until {
            break behind;
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), moved).await;
    };
    let settle_s = settle_started.elapsed().as_secs_f64();
    let lists_at_end = member_lists(&direct).await;
    let lists_none = count_lists(&mut faults, lists_at_start, lists_at_end);
    for t in &tasks {
        t.abort();
    }
    stop_samples.notify_one();
    let samples = sampler.await.context("sampler")?;

    // The accounting.
    let histories: Vec<Vec<Change>> = recorders.iter().map(|r| lock(&r.changes).clone()).collect();
    let mut report = ChaosReport {
        seed: c.seed,
        members: run.members.clone(),
        pull_members: world.pulled_names(),
        watchers: watchers.len(),
        h2_watchers: h2_count,
        h2_connections: shared.opened.load(Ordering::Relaxed),
        writes: writers_done.iter().map(|w| w.writes).sum(),
        writes_failed: writers_done.iter().map(|w| w.failed).sum(),
        changes: histories.iter().map(|h| h.len() as u64).sum(),
        accounting: Accounting {
            stalled: stalled.len() as u64,
            ..Default::default()
        },
        settle_s,
        samples,
        ..Default::default()
    };
    for kind in kinds {
        report.per_fault.entry(kind.name().to_owned()).or_default();
    }
    report
        .per_fault
        .entry("none".into())
        .or_default()
        .member_lists = lists_none.unwrap_or(0);
    for f in &faults {
        let t = report.per_fault.entry(f.kind.to_owned()).or_default();
        t.count += 1;
        t.member_lists += f.member_lists.unwrap_or(0);
    }
    let bucket = |at_ms: u64| charged(&faults, at_ms).unwrap_or("none").to_owned();
    for w in &watchers {
        let log = lock(&w.log);
        for &(at_ms, incident) in &log.incidents {
            let key = bucket(at_ms);
            let t = report.per_fault.entry(key).or_default();
            match incident {
                Incident::Break => (t.breaks += 1, report.breaks += 1),
                Incident::End => (t.ends += 1, report.ends += 1),
                Incident::OpenFailed => (t.open_failures += 1, report.open_failures += 1),
                Incident::Expired => (t.expired += 1, report.expired += 1),
                Incident::Relist => (t.relists += 1, report.relists += 1),
            };
        }
        for m in w.members(count) {
            let Some(origin) = log.origin[m] else {
                continue;
            };
            let tally = check(origin, &log.obs[m], &histories[m], finals[m]);
            report.accounting.add(&tally);
            if w.h2.is_some() {
                report.h2_expected += tally.expected;
                report.h2_seen += tally.seen;
                report.h2_violations += tally.found.len() as u64;
            }
            for found in tally.found {
                let key = bucket(found.at_ms);
                report.per_fault.entry(key.clone()).or_default().violations += 1;
                if report.violations.len() < 100 {
                    report.violations.push(format!(
                        "{} {} on {} at {:.1} s (fault: {key}): {}",
                        w.name,
                        found.violation.name(),
                        run.members[m],
                        found.at_ms as f64 / 1000.0,
                        found.detail
                    ));
                }
            }
        }
    }
    for (watcher, member, at, final_rv) in &stalled {
        if watcher.ends_with("/h2") {
            report.h2_violations += 1;
        }
        report.violations.push(format!(
            "{watcher} stalled on {member}: at {at}, the member at {final_rv}, after {settle_s:.0} s of settling"
        ));
    }
    report.faults = faults;
    let (rss, fds, judged) = flatness(&report.samples);
    (
        report.rss_growth_mib,
        report.fds_growth,
        report.processes_judged,
    ) = (rss, fds, judged);

    // Harness faults: the history must agree with every answer, and be whole.
    let mut failures = Vec::new();
    for (m, (writer, history)) in writers_done.iter().zip(&histories).enumerate() {
        let disagree = writer
            .answers
            .iter()
            .filter(|a| {
                !history
                    .iter()
                    .any(|c| c.rv == a.rv && c.kind == a.kind && c.name == a.name)
            })
            .count();
        if disagree > 0 {
            failures.push(format!(
                "{}: {disagree} write answers are not in its event log",
                run.members[m]
            ));
        }
        let lagged = recorders[m].lagged.load(Ordering::Relaxed);
        if lagged > 0 {
            failures.push(format!(
                "{}: the event log recorder missed {lagged} events",
                run.members[m]
            ));
        }
    }
    failures.extend(report.accounting.failures());
    failures.extend(growth_failures(report.rss_growth_mib, report.fds_growth));
    report.failures = failures;
    Ok(report)
}

/// Prints the accounting after the table: the counts, per fault, and the first violations.
pub fn print_report(r: &ChaosReport) {
    let a = &r.accounting;
    println!(
        "chaos: seed {}, {} members ({} in pull mode: {}), {} watchers ({} over h2), {} writes ({} failed), {} changes",
        r.seed,
        r.members.len(),
        r.pull_members.len(),
        r.pull_members.join(", "),
        r.watchers,
        r.h2_watchers,
        r.writes,
        r.writes_failed,
        r.changes
    );
    println!(
        "events: expected {}, seen {}, covered by relists {}; violations: duplicates {}, gaps {}, reorders {}, unknown {}, stalled {}; relists {}, 410s {}, streams broken {}, ended {}, opens failed {}; settled in {:.1} s",
        a.expected,
        a.seen,
        a.covered,
        a.duplicates,
        a.gaps,
        a.reorders,
        a.unknown,
        a.stalled,
        r.relists,
        r.expired,
        r.breaks,
        r.ends,
        r.open_failures,
        r.settle_s
    );
    println!(
        "h2 watchers: expected {}, seen {}, violations {}, on {} connections in turn",
        r.h2_expected, r.h2_seen, r.h2_violations, r.h2_connections
    );
    let growth =
        |g: Option<f64>, unit: &str| g.map_or("not judged".into(), |g| format!("{g:.1}{unit}"));
    println!(
        "gateway: resident memory grew at most {}, open descriptors at most {}, over {} processes judged (flat: at most {} MiB and {} descriptors after each one's first {} s)",
        growth(r.rss_growth_mib, " MiB"),
        growth(r.fds_growth, ""),
        r.processes_judged,
        super::soak::FLAT_RSS_MIB,
        super::soak::FLAT_FDS,
        FLAT_WARMUP.as_secs()
    );
    println!(
        "{:<16} {:>6} {:>7} {:>6} {:>7} {:>6} {:>8} {:>10} {:>12}",
        "fault",
        "count",
        "breaks",
        "ends",
        "opens",
        "410s",
        "relists",
        "violations",
        "member LISTs"
    );
    for (kind, t) in &r.per_fault {
        println!(
            "{:<16} {:>6} {:>7} {:>6} {:>7} {:>6} {:>8} {:>10} {:>12}",
            kind,
            t.count,
            t.breaks,
            t.ends,
            t.open_failures,
            t.expired,
            t.relists,
            t.violations,
            t.member_lists
        );
    }
    for f in &r.faults {
        let lists = f.member_lists.map_or("?".into(), |n| n.to_string());
        println!(
            "  {:>6.1}-{:<6.1} {:<16} {:<18} {:>4} LISTs  {}",
            f.start_s, f.end_s, f.kind, f.target, lists, f.detail
        );
    }
    for v in r.violations.iter().take(20) {
        println!("violation: {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    #[test]
    fn the_schedule_is_the_seeds_and_fits_the_run() {
        let minute = Duration::from_secs(60);
        let a = plan(7, &FaultKind::ALL, 2, minute);
        assert_eq!(
            a,
            plan(7, &FaultKind::ALL, 2, minute),
            "same seed, same schedule"
        );
        assert_ne!(a, plan(8, &FaultKind::ALL, 2, minute));
        // In a minute, every kind at least once, in time order, each over before the end.
        for seed in 0..50 {
            let s = plan(seed, &FaultKind::ALL, 2, minute);
            for kind in FaultKind::ALL {
                assert!(
                    s.iter().any(|p| p.kind == kind),
                    "seed {seed}: {kind:?} missing"
                );
            }
            assert!(s.windows(2).all(|w| w[0].at + w[0].hold < w[1].at), "{s:?}");
            assert!(s.iter().all(|p| p.at + p.hold < minute && p.member < 2));
            assert!(s[0].at >= FIRST_FAULT);
        }
        assert!(plan(1, &[], 2, minute).is_empty());
        assert!(plan(1, &FaultKind::ALL, 2, Duration::from_secs(2)).is_empty());
        let only = plan(3, &[FaultKind::Cut], 2, minute);
        assert!(only.len() > 5 && only.iter().all(|p| p.kind == FaultKind::Cut));
    }

    #[test]
    fn fault_names_round_trip_and_unknown_ones_are_refused() {
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::parse(kind.name()).unwrap(), kind);
        }
        assert!(FaultKind::parse("tunnel-flap").is_err());
    }

    #[test]
    fn incidents_are_charged_to_the_fault_they_follow() {
        let fault = |kind, start_s, end_s| FaultRecord {
            kind,
            start_s,
            end_s,
            ..Default::default()
        };
        let faults = [fault("blackhole", 3.0, 6.0), fault("cut", 20.0, 20.0)];
        assert_eq!(charged(&faults, 1_000), None);
        assert_eq!(charged(&faults, 4_000), Some("blackhole"));
        assert_eq!(charged(&faults, 15_000), Some("blackhole"));
        assert_eq!(charged(&faults, 17_000), None);
        assert_eq!(charged(&faults, 21_000), Some("cut"));
    }

    #[test]
    fn member_lists_are_counted_from_each_fault_to_the_next() {
        let at = |lists: Option<u64>| FaultRecord {
            lists_at_start: lists,
            ..Default::default()
        };
        let mut faults = [at(Some(10)), at(Some(14)), at(None), at(Some(30))];
        let before = count_lists(&mut faults, Some(4), Some(31));
        assert_eq!(before, Some(6));
        let counted: Vec<_> = faults.iter().map(|f| f.member_lists).collect();
        assert_eq!(counted, [Some(4), None, None, Some(1)]);
        assert_eq!(count_lists(&mut [], Some(4), Some(9)), Some(5));
    }

    #[test]
    fn each_gateway_process_is_judged_flat_or_not_after_its_warm_up() {
        let sample = |at_s: f64, pid: u32, rss: f64, fds: u64| ChaosSample {
            at_s,
            gateway_pid: pid,
            rss_mib: Some(rss),
            fds: Some(fds),
            ..Default::default()
        };
        // Process 1 grows during its warm-up only, then is flat; process 2 leaks 2 MiB and one
        // descriptor a second after its warm-up; process 3 lives too short to be judged.
        let mut samples: Vec<ChaosSample> = (0..30u64)
            .map(|t| sample(t as f64, 1, 50.0 + (t.min(8) as f64) * 5.0, 40))
            .collect();
        samples.extend((30..60u64).map(|t| {
            let leak = (t - 30).saturating_sub(10) as f64;
            sample(t as f64, 2, 60.0 + 2.0 * leak, 40 + leak as u64)
        }));
        samples.extend((60..65u64).map(|t| sample(t as f64, 3, 500.0, 900)));
        let (rss, fds, judged) = flatness(&samples);
        assert_eq!(judged, 2);
        assert!((rss.unwrap() - 38.0).abs() < 1e-6, "{rss:?}");
        assert!((fds.unwrap() - 19.0).abs() < 1e-6, "{fds:?}");
        assert_eq!(growth_failures(rss, fds).len(), 2);
        let (rss, fds, _) = flatness(&samples[..30]);
        assert!(growth_failures(rss, fds).is_empty(), "{rss:?} {fds:?}");
    }

    #[test]
    fn composite_versions_decode_and_others_do_not() {
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"member1":"12","member2":"40"}"#);
        let versions = decode_composite(&token).unwrap();
        assert_eq!(versions["member1"], "12");
        assert_eq!(versions["member2"], "40");
        assert_eq!(decode_composite("12"), None);
        assert_eq!(decode_composite("!!"), None);
    }
}
