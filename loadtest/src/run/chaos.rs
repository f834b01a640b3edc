//! `chaos` (issue 33 item 5): informer-style watchers through a gateway while the driver breaks
//! things on a schedule, and an exact account of every event against each member's own history.
//!
//! The scenario brings its own world, in a work directory: a simulated fleet in this process
//! (`--chaos-members`, no churn, a short `--history-window` so that a long outage ends in 410),
//! one TCP `proxy` per member that the gateway's Cluster files point at, and `fleetgate serve
//! --config DIR` as a child process (`--gateway-bin`) behind one more proxy, so the watchers keep
//! one address when the gateway restarts elsewhere. Then, for `--duration`:
//!
//! - `--watchers` watchers, spread over `/clusters/memberK` of each member and `/fleet`, each as
//!   an informer: LIST the configmaps of the `chaos` namespace, WATCH from the list's
//!   resourceVersion with bookmarks, resume from the last resourceVersion whenever the stream
//!   ends, LIST again after a 410. The fleet view's resourceVersions are composite (each member's
//!   by cluster, docs/fleet.md): each event counts for its cluster's member, and the other
//!   members' versions in it place those members as a bookmark would.
//! - A writer per member, straight to the member: creates, merge patches and deletes of
//!   configmaps, `--write-rate` a second, each stamped `fleetgate.io/sent-at`. The member's own
//!   history is its event log (every change in the namespace, with its resourceVersion, read from
//!   the member in this process); every write's answer is checked against it.
//! - Faults from a seeded schedule (`--seed`, `--faults`), one at a time with quiet between:
//!   a member blackholed (its proxy holds every byte, then resets the connections the partition
//!   outlived) and a member slowed (its proxy delays every byte), its connections cut (reset),
//!   the member restarted (down, then back with its objects and history), the gateway restarted
//!   (SIGTERM, a new one started at once) and killed (SIGKILL, then started), and configuration
//!   churn (a member's Cluster relabelled, an extra Cluster added and removed, then everything
//!   restored). A pull-mode tunnel kill is not among them.
//!
//! After the run the faults are over; one last write per member marks its final resourceVersion,
//! and the driver waits (bounded by `--settle-timeout`) until every watcher has reached it, on the
//! watchers' own progress signal. Then [`check`] accounts each watcher's view of each member:
//! every change after its start exactly once, in order, or covered by a relist after a 410.
//! Violations (duplicates, gaps, reorders, unknown events, watchers that never caught up) are
//! charged to the fault they happened in or after, printed with the counts, and fail the run.
//!
//! Like the soak, every `--sample-every` it records the gateway's resident memory and open
//! descriptors and the write-to-delivery latency of the events of the interval; `--chart` draws
//! them. Called by `run` (`--scenario chaos`); needs no `--target`.

mod check;
pub(crate) mod members;
pub(crate) mod proxy;
pub(crate) mod watcher;
pub(crate) mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;

pub use check::{check, Change, Kind, Obs, Tally, Violation};
use members::{Recorder, Writer};
pub use watcher::decode_composite;
use watcher::{Incident, Watcher};
use world::{build_world, run_schedule, targets, World};

use super::client::{HttpConn, Target};
use super::fanout::body_request;
use super::procstat::ProcWatch;
use super::scenarios::new_hist;
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
    /// member-restart, gateway-restart, gateway-kill, config-churn).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
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
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Blackhole,
        FaultKind::Slow,
        FaultKind::Cut,
        FaultKind::MemberRestart,
        FaultKind::GatewayRestart,
        FaultKind::GatewayKill,
        FaultKind::ConfigChurn,
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
            FaultKind::Cut | FaultKind::GatewayKill => (ms(rng, 500, 1500), Duration::ZERO),
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
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: &'static str,
    /// The member, or `gateway`, or `config`.
    pub target: String,
    /// Seconds since the run started.
    pub start_s: f64,
    pub end_s: f64,
    pub detail: String,
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
}

/// What a chaos run found; `failures` empty means no violation.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub members: Vec<String>,
    pub watchers: usize,
    pub writes: u64,
    pub writes_failed: u64,
    /// Changes in the members' histories.
    pub changes: u64,
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
    pub relists: u64,
    pub expired: u64,
    pub breaks: u64,
    pub ends: u64,
    pub open_failures: u64,
    pub settle_s: f64,
    pub faults: Vec<FaultRecord>,
    pub per_fault: BTreeMap<String, FaultTally>,
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

/// `chaos`: see the module documentation.
pub async fn chaos(args: &RunArgs) -> anyhow::Result<TargetResult> {
    let c = &args.chaos;
    let kinds: Vec<FaultKind> = if c.faults.is_empty() {
        FaultKind::ALL.to_vec()
    } else {
        c.faults
            .iter()
            .filter(|f| !f.trim().is_empty() && f.trim() != "none")
            .map(|f| FaultKind::parse(f))
            .collect::<anyhow::Result<_>>()?
    };
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
        errors: report.violations_total(),
        seconds: args.duration.as_secs_f64(),
        watches: Some(report.watchers),
        events: Some(report.seen),
        chaos: Some(Box::new(report)),
        ..Default::default()
    })
}

impl ChaosReport {
    pub fn violations_total(&self) -> u64 {
        self.duplicates + self.gaps + self.reorders + self.unknown + self.stalled
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

    // Watchers first, each listed before anything is written.
    let watchers: Vec<Arc<Watcher>> = (0..c.watchers.max(1))
        .map(|i| {
            let (view, target) = views[i % views.len()].clone();
            let name = format!("{}#{}", target.name, i / views.len());
            Arc::new(Watcher::new(name, view, target, count))
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
    let faults = run_schedule(world, schedule).await;
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
        watchers: watchers.len(),
        writes: writers_done.iter().map(|w| w.writes).sum(),
        writes_failed: writers_done.iter().map(|w| w.failed).sum(),
        changes: histories.iter().map(|h| h.len() as u64).sum(),
        stalled: stalled.len() as u64,
        settle_s,
        samples,
        ..Default::default()
    };
    for kind in kinds {
        report.per_fault.entry(kind.name().to_owned()).or_default();
    }
    report.per_fault.entry("none".into()).or_default();
    for f in &faults {
        report.per_fault.entry(f.kind.to_owned()).or_default().count += 1;
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
            report.expected += tally.expected;
            report.seen += tally.seen;
            report.covered += tally.covered;
            for found in tally.found {
                match found.violation {
                    Violation::Duplicate => report.duplicates += 1,
                    Violation::Reorder => report.reorders += 1,
                    Violation::Unknown => report.unknown += 1,
                    Violation::Gap => report.gaps += 1,
                }
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
        report.violations.push(format!(
            "{watcher} stalled on {member}: at {at}, the member at {final_rv}, after {settle_s:.0} s of settling"
        ));
    }
    report.faults = faults;

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
    if report.violations_total() > 0 {
        failures.push(format!(
            "{} accounting violations: {} duplicates, {} gaps, {} reorders, {} unknown events, {} watchers never caught up",
            report.violations_total(),
            report.duplicates,
            report.gaps,
            report.reorders,
            report.unknown,
            report.stalled
        ));
    }
    if report.seen == 0 {
        failures.push("no watcher saw any event".into());
    }
    report.failures = failures;
    Ok(report)
}

/// Prints the accounting after the table: the counts, per fault, and the first violations.
pub fn print_report(r: &ChaosReport) {
    println!(
        "chaos: seed {}, {} members, {} watchers, {} writes ({} failed), {} changes",
        r.seed,
        r.members.len(),
        r.watchers,
        r.writes,
        r.writes_failed,
        r.changes
    );
    println!(
        "events: expected {}, seen {}, covered by relists {}; violations: duplicates {}, gaps {}, reorders {}, unknown {}, stalled {}; relists {}, 410s {}, streams broken {}, ended {}, opens failed {}; settled in {:.1} s",
        r.expected,
        r.seen,
        r.covered,
        r.duplicates,
        r.gaps,
        r.reorders,
        r.unknown,
        r.stalled,
        r.relists,
        r.expired,
        r.breaks,
        r.ends,
        r.open_failures,
        r.settle_s
    );
    println!(
        "{:<16} {:>6} {:>7} {:>6} {:>7} {:>6} {:>8} {:>10}",
        "fault", "count", "breaks", "ends", "opens", "410s", "relists", "violations"
    );
    for (kind, t) in &r.per_fault {
        println!(
            "{:<16} {:>6} {:>7} {:>6} {:>7} {:>6} {:>8} {:>10}",
            kind, t.count, t.breaks, t.ends, t.open_failures, t.expired, t.relists, t.violations
        );
    }
    for f in &r.faults {
        println!(
            "  {:>6.1}-{:<6.1} {:<16} {:<18} {}",
            f.start_s, f.end_s, f.kind, f.target, f.detail
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
        assert!(FaultKind::parse("tunnel-kill").is_err());
    }

    #[test]
    fn incidents_are_charged_to_the_fault_they_follow() {
        let fault = |kind, start_s, end_s| FaultRecord {
            kind,
            target: String::new(),
            start_s,
            end_s,
            detail: String::new(),
        };
        let faults = [fault("blackhole", 3.0, 6.0), fault("cut", 20.0, 20.0)];
        assert_eq!(charged(&faults, 1_000), None);
        assert_eq!(charged(&faults, 4_000), Some("blackhole"));
        assert_eq!(charged(&faults, 15_000), Some("blackhole"));
        assert_eq!(charged(&faults, 17_000), None);
        assert_eq!(charged(&faults, 21_000), Some("cut"));
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
