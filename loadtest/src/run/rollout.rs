//! `rollout` (issue 33 item 4's measurement): what a rolling update of a two-replica gateway
//! costs the members, in LISTs, under `--watchers` informers (2000 by default).
//!
//! The scenario brings its own world, in a work directory: a simulated fleet in this process
//! (`--chaos-members`, 3 by default, no churn, a long `--history-window`), shared watches turned
//! on for configmaps in its `gateway.yaml` (docs/watches.md), two `fleetgate serve --config DIR`
//! children (`--gateway-bin`, one worker each) on that same directory, and a [`Front`]: a TCP
//! proxy standing in for a Service, which sends each new connection to the next replica that is
//! up, round robin, skipping one that refuses. The informers are `chaos`' watchers (LIST, WATCH
//! from the list's resourceVersion with bookmarks, resume from the last resourceVersion whenever
//! the stream ends, LIST again only after a 410), one in 20 on `/fleet` and the others on
//! `/clusters/NAME` round robin, asking for client-go's watch timeouts (5 to 10 minutes), so
//! their streams end only when a replica drains. A writer per member (`--write-rate`, straight to
//! the member) keeps the configmaps of the `chaos` namespace moving meanwhile.
//!
//! Once every watcher watches and has passed a marker write on each member, and a third of
//! `--duration` has gone by under the writes, the driver reads each member's `fleetgate_sim_requests_total{verb="list",resource="configmaps"}` (its
//! `/metrics`): the baseline. Then, one replica after the other, a step: the replica leaves the
//! front (its endpoint removed) and gets SIGTERM; the driver waits for its exit, then for every
//! watcher to watch again and pass a new marker write on every member (readiness signals, no
//! sleep), starts its replacement on the same directory (its ready line) and puts it behind the
//! front. It reads the counters after each step, then lets another third of `--duration` go by.
//! A step's LISTs are split into the informers'
//! own (their relists: one per member listed) and the gateway's (the rest: a replica's first
//! watch of a shared key opens a hub, whose own list costs the member one LIST).
//!
//! At the end one last marker write per member marks where every watcher must get to, the
//! writers stop, and `chaos`' [`check`] accounts every watcher's view of every member against the
//! member's own event log: every change after its first list exactly once, in order. The run
//! fails on any violation and on any informer that listed again during the rollout. Called by
//! `run` (`--scenario rollout`); needs no `--target`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::chaos::h2::H2Shared;
use super::chaos::members::{Recorder, Writer};
use super::chaos::proxy::{relay, Mode};
use super::chaos::watcher::{Incident, View, Watcher};
use super::chaos::world::{gateway_binary, share_configmaps, start_members, targets_at, Gateway};
use super::chaos::{check, create_namespace, lock, Accounting, Change, Run};
use super::client::Target;
use super::{RunArgs, TargetResult};
use crate::sim::FleetHandle;

/// Gateway replicas behind the front.
const REPLICAS: usize = 2;
/// One watcher in this many follows `/fleet`; the others `/clusters/NAME`, round robin.
const FLEET_EVERY: usize = 20;
/// The h2 informers (`--h2-share`) share a connection this many at a time: a controller's
/// informers, whose requests client-go multiplexes on one transport's connection.
const H2_INFORMERS_PER_CONNECTION: usize = 100;
/// The watches' `timeoutSeconds`: client-go's (5 to 10 minutes), longer than the run.
const WATCH_TIMEOUT_S: std::ops::RangeInclusive<u64> = 300..=600;
/// Watchers started together; the next ones once these have listed.
const WAVE: usize = 200;

/// What the watchers went through in a stretch of the run.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
pub struct Incidents {
    /// Watch streams that ended cleanly, and that broke (the connection failed): each one
    /// followed by a watch from the last resourceVersion (a resume).
    pub ends: u64,
    pub breaks: u64,
    /// Watches that could not be opened (tried again with backoff).
    pub open_failures: u64,
    /// 410s, and the LISTs the watchers made after them.
    pub expired: u64,
    pub relists: u64,
    /// Of the members' LISTs, those the relists made (a `/fleet` relist lists every member).
    pub informer_lists: u64,
}

impl Incidents {
    fn resumes(&self) -> u64 {
        self.ends + self.breaks
    }
}

/// One step of the rollout: one replica replaced.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RolloutStep {
    /// Which replica (1 or 2).
    pub replica: usize,
    /// Connections the front held open to it when it got SIGTERM (its watches, mostly).
    pub moved: i64,
    /// From SIGTERM to its exit.
    pub drain_s: f64,
    /// From SIGTERM to every watcher watching again past a marker write on every member.
    pub caught_up_s: f64,
    /// From SIGTERM to its replacement's ready line.
    pub replaced_s: f64,
    /// The members' LISTs and WATCHes of configmaps during the step, all members together.
    pub lists: u64,
    pub member_watches: u64,
    /// `lists` less the informers' own: the gateway's (a new hub's list).
    pub gateway_lists: u64,
    #[serde(flatten)]
    pub incidents: Incidents,
}

/// What a rollout run found; `failures` empty means the rollout cost no informer a LIST and
/// no watcher an event.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RolloutReport {
    pub members: Vec<String>,
    pub watchers: usize,
    /// Of them, on `/fleet`.
    pub fleet_watchers: usize,
    /// Of them, speaking h2 (`--h2-share`), and the connections they shared.
    pub h2_watchers: usize,
    pub h2_connections: usize,
    pub writes: u64,
    pub writes_failed: u64,
    /// The members' LISTs of configmaps before the rollout (the watchers' first lists and the
    /// hubs' own).
    pub lists_before: u64,
    /// During the whole rollout (every step), per informer, and the gateway's share.
    pub lists: u64,
    pub lists_per_informer: f64,
    pub gateway_lists: u64,
    pub member_watches: u64,
    pub resumes: u64,
    #[serde(flatten)]
    pub incidents: Incidents,
    pub steps: Vec<RolloutStep>,
    /// Changes in the members' histories, and the accounting of `chaos`' check.
    pub changes: u64,
    #[serde(flatten)]
    pub accounting: Accounting,
    pub settle_s: f64,
    /// The first violations, each in a sentence.
    pub violations: Vec<String>,
    pub failures: Vec<String>,
}

/// A stand-in for a Service in front of the replicas: each new connection goes to the next
/// replica that is up, round robin; one that refuses is skipped. Bytes pass untouched (TLS
/// included) through `chaos`' relay.
struct Front {
    addr: SocketAddr,
    backends: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    /// Connections open now, per replica.
    open: Arc<Vec<AtomicI64>>,
    task: JoinHandle<()>,
    // The relay's switches, never moved: a load balancer neither holds nor cuts.
    _mode: watch::Sender<Mode>,
    _cuts: watch::Sender<u64>,
}

impl Front {
    async fn start(replicas: usize) -> std::io::Result<Front> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::Forward);
        let (cuts, cuts_rx) = watch::channel(0u64);
        let backends = Arc::new(Mutex::new(vec![None; replicas]));
        let open = Arc::new((0..replicas).map(|_| AtomicI64::new(0)).collect::<Vec<_>>());
        let task = tokio::spawn(front_loop(
            listener,
            backends.clone(),
            open.clone(),
            mode_rx,
            cuts_rx,
        ));
        Ok(Front {
            addr,
            backends,
            open,
            task,
            _mode: mode,
            _cuts: cuts,
        })
    }

    /// Puts a replica behind the front (Some) or takes it out (None); open connections stay.
    fn set(&self, replica: usize, backend: Option<SocketAddr>) {
        lock(&self.backends)[replica] = backend;
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn front_loop(
    listener: TcpListener,
    backends: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    open: Arc<Vec<AtomicI64>>,
    mode: watch::Receiver<Mode>,
    cuts: watch::Receiver<u64>,
) {
    let mut next = 0usize;
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        // The replicas up, starting from the next one in turn.
        let order: Vec<(usize, SocketAddr)> = {
            let b = lock(&backends);
            (0..b.len())
                .map(|k| (next + k) % b.len())
                .filter_map(|i| Some((i, b[i]?)))
                .collect()
        };
        next = next.wrapping_add(1);
        let (mode, cuts, open) = (mode.clone(), cuts.clone(), open.clone());
        tokio::spawn(async move {
            for (i, to) in order {
                let Ok(outbound) = TcpStream::connect(to).await else {
                    continue;
                };
                let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                open[i].fetch_add(1, Ordering::Relaxed);
                relay(inbound, outbound, mode, cuts).await;
                open[i].fetch_sub(1, Ordering::Relaxed);
                return;
            }
            // No replica up: the client sees its connection reset.
            let _ = inbound.set_zero_linger();
        });
    }
}

/// The world of a rollout.
struct World {
    run: Arc<Run>,
    fleet: FleetHandle,
    front: Front,
    replicas: Vec<Option<Gateway>>,
    bin: PathBuf,
    dir: PathBuf,
}

impl World {
    fn log(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("gateway-{}.log", replica + 1))
    }

    /// Starts replica `i` (or its replacement) and puts it behind the front.
    async fn start_replica(&mut self, i: usize) -> anyhow::Result<()> {
        let gateway = Gateway::start(&self.bin, &self.dir, &self.log(i), false).await?;
        self.front.set(i, Some(gateway.https));
        self.replicas[i] = Some(gateway);
        Ok(())
    }
}

/// Each member's LISTs and WATCHes of configmaps so far, from its `/metrics`.
async fn member_requests(direct: &[Target]) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for member in direct {
        let (status, text) = member.metrics_text().await?;
        anyhow::ensure!(status == 200, "{}: /metrics answered {status}", member.name);
        let count = |verb: &str| {
            let series =
                format!("fleetgate_sim_requests_total{{verb=\"{verb}\",resource=\"configmaps\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.push((count("list"), count("watch")));
    }
    Ok(out)
}

/// The LISTs and WATCHes all members served between two readings.
fn grown(before: &[(u64, u64)], after: &[(u64, u64)]) -> (u64, u64) {
    before.iter().zip(after).fold((0, 0), |(l, w), (b, a)| {
        (l + a.0.saturating_sub(b.0), w + a.1.saturating_sub(b.1))
    })
}

/// Waits, woken by the watchers' progress, until `done` holds or `timeout` passed; whether it
/// held.
async fn wait_until(run: &Run, timeout: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let moved = run.progress.notified();
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), moved).await;
    }
}

/// The (watcher, member, position) pairs short of `marks`.
fn behind(watchers: &[Arc<Watcher>], marks: &[u64]) -> Vec<(String, usize, u64)> {
    watchers
        .iter()
        .flat_map(|w| {
            w.members(marks.len())
                .into_iter()
                .map(|m| (m, w.positions[m].load(Ordering::Relaxed)))
                .filter(|&(m, at)| at < marks[m])
                .map(|(m, at)| (w.name.clone(), m, at))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A marker write asked of a member's writer: its resourceVersion comes back.
type MarkRequest = oneshot::Sender<anyhow::Result<u64>>;

/// The writer of one member (straight to it) at `rate` a second, until every [`Markers`] is
/// gone; between two writes it makes the marker writes asked. Returns the writer, with its
/// counts.
async fn write_loop(
    mut writer: Writer,
    rate: f64,
    mut asks: mpsc::Receiver<MarkRequest>,
) -> Writer {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(error) = writer.write(false).await {
                    tracing::debug!(%error, "rollout: write failed");
                }
            }
            ask = asks.recv() => {
                let Some(reply) = ask else { return writer };
                let mut mark = Err(anyhow!("no marker write in 20 tries"));
                for _ in 0..20 {
                    // A delete answers no resourceVersion: write again.
                    match writer.write(false).await {
                        Ok(Some(rv)) => {
                            mark = Ok(rv);
                            break;
                        }
                        Ok(None) => {}
                        Err(error) => mark = Err(error),
                    }
                }
                let _ = reply.send(mark);
            }
        }
    }
}

/// Marker writes on every member, through its writer.
struct Markers {
    asks: Vec<mpsc::Sender<MarkRequest>>,
    recorders: Vec<Arc<Recorder>>,
}

impl Markers {
    /// One write on every member that its event log shows: each member's resourceVersion
    /// every watcher must get to.
    async fn mark(&self) -> anyhow::Result<Vec<u64>> {
        let mut marks = Vec::new();
        for (m, ask) in self.asks.iter().enumerate() {
            let (reply, rv) = oneshot::channel();
            ask.send(reply)
                .await
                .map_err(|_| anyhow!("member {}: its writer is gone", m + 1))?;
            let rv = rv
                .await
                .map_err(|_| anyhow!("member {}: its writer is gone", m + 1))?
                .with_context(|| format!("member {}: the marker write", m + 1))?;
            anyhow::ensure!(
                self.recorders[m].reach(rv).await,
                "member {}: its event log never reached {rv}",
                m + 1
            );
            marks.push(rv);
        }
        Ok(marks)
    }

    /// Marks every member, then waits until every watcher watches and is past the marks.
    /// Returns the marks and the pairs still behind when `timeout` passed.
    async fn settle(
        &self,
        run: &Run,
        watchers: &[Arc<Watcher>],
        timeout: Duration,
    ) -> anyhow::Result<(Vec<u64>, Vec<(String, usize, u64)>)> {
        let marks = self.mark().await?;
        let all = watchers.len() as i64;
        wait_until(run, timeout, || {
            run.watches_open.load(Ordering::Relaxed) >= all && behind(watchers, &marks).is_empty()
        })
        .await;
        let late = behind(watchers, &marks);
        Ok((marks, late))
    }
}

/// The watchers' incidents between `from_ms` and `to_ms` of the run.
fn incidents(watchers: &[Arc<Watcher>], members: usize, from_ms: u64, to_ms: u64) -> Incidents {
    let mut out = Incidents::default();
    for w in watchers {
        let lists_per_relist = w.members(members).len() as u64;
        for &(at, what) in &lock(&w.log).incidents {
            if at < from_ms || at > to_ms {
                continue;
            }
            match what {
                Incident::End => out.ends += 1,
                Incident::Break => out.breaks += 1,
                Incident::OpenFailed => out.open_failures += 1,
                Incident::Expired => out.expired += 1,
                Incident::Relist => {
                    out.relists += 1;
                    out.informer_lists += lists_per_relist;
                }
            }
        }
    }
    out
}

/// `rollout`: see the module documentation.
pub async fn rollout(args: &RunArgs) -> anyhow::Result<TargetResult> {
    let c = &args.chaos;
    let started = Instant::now();
    let temporary = c.work_dir.is_none();
    let dir = c.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("fleetgate-rollout-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (fleet, members) = start_members(c, &dir).await?;
    let mut run = Run::new(members);
    run.watch_timeout_s = WATCH_TIMEOUT_S;
    let mut world = World {
        run: Arc::new(run),
        fleet,
        front: Front::start(REPLICAS).await?,
        replicas: (0..REPLICAS).map(|_| None).collect(),
        bin: gateway_binary(c),
        dir: dir.clone(),
    };
    let outcome = match share_configmaps(&dir, "Shard") {
        Ok(()) => drive(args, &mut world).await,
        Err(e) => Err(e),
    };
    let World {
        fleet, replicas, ..
    } = world;
    for gateway in replicas.into_iter().flatten() {
        gateway.stop(false).await;
    }
    fleet.shutdown().await;
    if temporary && outcome.as_ref().is_ok_and(|r| r.failures.is_empty()) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "rollout: the fleet's files and the gateways' logs are in {}",
            dir.display()
        );
    }
    let report = outcome?;
    Ok(TargetResult {
        target: "fleetgate".into(),
        scenario: "rollout".into(),
        requests: report.writes,
        errors: report.accounting.violations_total(),
        seconds: started.elapsed().as_secs_f64(),
        watches: Some(report.watchers),
        events: Some(report.accounting.seen),
        rollout: Some(Box::new(report)),
        ..Default::default()
    })
}

/// The run itself, in a world built.
async fn drive(args: &RunArgs, world: &mut World) -> anyhow::Result<RolloutReport> {
    let c = &args.chaos;
    let run = world.run.clone();
    let count = run.members.len();
    for i in 0..REPLICAS {
        world.start_replica(i).await?;
    }
    let (direct, views) = targets_at(&world.dir, &run.members, world.front.addr)?;
    for target in &direct {
        create_namespace(target).await?;
    }
    let recorders: Vec<Arc<Recorder>> = (0..count)
        .map(|m| Recorder::start(&world.fleet, m, run.clone()))
        .collect::<anyhow::Result<_>>()?;
    // The informers, in waves: each wave listed before the next starts. The last `--h2-share`
    // of them speak h2, a connection per H2_INFORMERS_PER_CONNECTION of them.
    let total = c.watchers.max(1);
    let h2_count = c.h2_watchers(total)?;
    let connections: Vec<Arc<H2Shared>> = (0..h2_count.div_ceil(H2_INFORMERS_PER_CONNECTION))
        .map(|_| Arc::new(H2Shared::new(&views[0].1)))
        .collect();
    let mut on_member = 0;
    let watchers: Vec<Arc<Watcher>> = (0..total)
        .map(|i| {
            let (view, target) = if i % FLEET_EVERY == FLEET_EVERY - 1 {
                views[count].clone()
            } else {
                on_member += 1;
                views[(on_member - 1) % count].clone()
            };
            let h2 = i
                .checked_sub(total - h2_count)
                .map(|k| connections[k / H2_INFORMERS_PER_CONNECTION].clone());
            let suffix = if h2.is_some() { "/h2" } else { "" };
            let name = format!("{}#{i}{suffix}", target.name);
            Arc::new(Watcher::new(name, view, target, count, h2))
        })
        .collect();
    let mut tasks = Vec::new();
    for wave in watchers.chunks(WAVE) {
        for w in wave {
            let seed = c.seed.wrapping_add(1000 + tasks.len() as u64);
            tasks.push(tokio::spawn(w.clone().follow(run.clone(), seed)));
        }
        let spawned = tasks.len();
        let listed = wait_until(&run, c.settle_timeout, || {
            run.listed.load(Ordering::Relaxed) >= spawned
        })
        .await;
        anyhow::ensure!(
            listed,
            "only {} of {spawned} watchers could list through the gateways in {:?} (see gateway-*.log)",
            run.listed.load(Ordering::Relaxed),
            c.settle_timeout
        );
    }

    // A writer per member, straight to it, until the end.
    let mut asks = Vec::new();
    let writers: Vec<JoinHandle<Writer>> = direct
        .iter()
        .enumerate()
        .map(|(m, target)| {
            let writer = Writer::new(target.clone(), c.seed.wrapping_mul(31) + m as u64);
            let (ask, asked) = mpsc::channel(1);
            asks.push(ask);
            tokio::spawn(write_loop(writer, c.write_rate, asked))
        })
        .collect();
    let markers = Markers {
        asks,
        recorders: recorders.clone(),
    };

    let mut report = RolloutReport {
        members: run.members.clone(),
        watchers: watchers.len(),
        fleet_watchers: watchers.iter().filter(|w| w.view == View::Fleet).count(),
        h2_watchers: h2_count,
        h2_connections: connections.len(),
        ..Default::default()
    };
    let mut failures = Vec::new();
    let (_, late) = markers.settle(&run, &watchers, c.settle_timeout).await?;
    anyhow::ensure!(
        late.is_empty(),
        "{} watchers never caught up before the rollout (the first: {:?})",
        late.len(),
        late.first()
    );
    // The load runs for `--duration` in all: a third before the rollout, after each step.
    let hold = args.duration / (REPLICAS as u32 + 1);
    tokio::time::sleep(hold).await;
    let baseline = member_requests(&direct).await?;
    report.lists_before = baseline.iter().map(|&(l, _)| l).sum();
    let rollout_from = run.ms();

    // The rollout: one replica after the other.
    let mut before = baseline.clone();
    for i in 0..REPLICAS {
        let from = run.ms();
        let sigterm = Instant::now();
        let moved = world.front.open[i].load(Ordering::Relaxed);
        world.front.set(i, None);
        if let Some(gateway) = world.replicas[i].take() {
            gateway.stop(true).await;
        }
        let drain_s = sigterm.elapsed().as_secs_f64();
        let (_, late) = markers.settle(&run, &watchers, c.settle_timeout).await?;
        if !late.is_empty() {
            failures.push(format!(
                "replica {}: {} watchers had not caught up {:?} after its SIGTERM",
                i + 1,
                late.len(),
                c.settle_timeout
            ));
        }
        let caught_up_s = sigterm.elapsed().as_secs_f64();
        world.start_replica(i).await?;
        let replaced_s = sigterm.elapsed().as_secs_f64();
        let after = member_requests(&direct).await?;
        let (lists, member_watches) = grown(&before, &after);
        let incidents = incidents(&watchers, count, from, run.ms());
        report.steps.push(RolloutStep {
            replica: i + 1,
            moved,
            drain_s,
            caught_up_s,
            replaced_s,
            lists,
            member_watches,
            gateway_lists: lists.saturating_sub(incidents.informer_lists),
            incidents,
        });
        before = after;
        tokio::time::sleep(hold).await;
    }
    let (lists, member_watches) = grown(&baseline, &before);
    report.lists = lists;
    report.lists_per_informer = lists as f64 / watchers.len() as f64;
    report.member_watches = member_watches;
    report.incidents = incidents(&watchers, count, rollout_from, run.ms());
    report.gateway_lists = lists.saturating_sub(report.incidents.informer_lists);
    report.resumes = report.incidents.resumes();

    // The end: a last marker on every member, every watcher past it; the writers stop.
    let settle_started = Instant::now();
    let (finals, stalled) = markers.settle(&run, &watchers, c.settle_timeout).await?;
    report.settle_s = settle_started.elapsed().as_secs_f64();
    report.accounting.stalled = stalled.len() as u64;
    for t in &tasks {
        t.abort();
    }
    drop(markers);
    for w in writers {
        let writer = w.await.context("writer task")?;
        report.writes += writer.writes;
        report.writes_failed += writer.failed;
    }

    // The accounting, against each member's own history.
    let histories: Vec<Vec<Change>> = recorders.iter().map(|r| lock(&r.changes).clone()).collect();
    report.changes = histories.iter().map(|h| h.len() as u64).sum();
    for w in &watchers {
        let log = lock(&w.log);
        for m in w.members(count) {
            let Some(origin) = log.origin[m] else {
                continue;
            };
            let tally = check(origin, &log.obs[m], &histories[m], finals[m]);
            report.accounting.add(&tally);
            for found in tally.found {
                if report.violations.len() < 100 {
                    report.violations.push(format!(
                        "{} {} on {} at {:.1} s: {}",
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
    for (watcher, m, at) in stalled.iter().take(20) {
        report.violations.push(format!(
            "{watcher} stalled on {}: at {at}, the member at {}",
            run.members[*m], finals[*m]
        ));
    }

    for (m, r) in recorders.iter().enumerate() {
        let lagged = r.lagged.load(Ordering::Relaxed);
        if lagged > 0 {
            failures.push(format!(
                "{}: the event log recorder missed {lagged} events",
                run.members[m]
            ));
        }
    }
    if report.incidents.breaks > 0 {
        failures.push(format!(
            "{} watch streams broke during the rollout (a drained replica ends each cleanly)",
            report.incidents.breaks
        ));
    }
    if report.incidents.relists > 0 {
        failures.push(format!(
            "the informers listed again {} times during the rollout ({} 410s)",
            report.incidents.relists, report.incidents.expired
        ));
    }
    failures.extend(report.accounting.failures());
    report.failures = failures;
    Ok(report)
}

/// Prints the rollout after the table: the totals, then a line per step.
pub fn print_report(r: &RolloutReport) {
    println!(
        "rollout: {} members, {} informers ({} on /fleet, {} over h2 on {} connections), {} writes ({} failed), {} changes",
        r.members.len(),
        r.watchers,
        r.fleet_watchers,
        r.h2_watchers,
        r.h2_connections,
        r.writes,
        r.writes_failed,
        r.changes
    );
    println!(
        "member LISTs: {} before the rollout, {} during it ({:.4} per informer; the informers' {}, the gateway's {}); member WATCHes during it {}",
        r.lists_before,
        r.lists,
        r.lists_per_informer,
        r.incidents.informer_lists,
        r.gateway_lists,
        r.member_watches
    );
    println!(
        "informers: resumes {} (ended {}, broken {}), opens failed {}, 410s {}, relists {}; events expected {}, seen {}, duplicates {}, gaps {}, reorders {}, unknown {}, stalled {}; settled in {:.1} s",
        r.resumes,
        r.incidents.ends,
        r.incidents.breaks,
        r.incidents.open_failures,
        r.incidents.expired,
        r.incidents.relists,
        r.accounting.expected,
        r.accounting.seen,
        r.accounting.duplicates,
        r.accounting.gaps,
        r.accounting.reorders,
        r.accounting.unknown,
        r.accounting.stalled,
        r.settle_s
    );
    println!(
        "{:<8} {:>6} {:>8} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8}",
        "replica",
        "moved",
        "drain s",
        "caught s",
        "replaced s",
        "LISTs",
        "gw LISTs",
        "WATCHes",
        "resumes",
        "410s",
        "relists"
    );
    for s in &r.steps {
        println!(
            "{:<8} {:>6} {:>8.2} {:>10.2} {:>10.2} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8}",
            s.replica,
            s.moved,
            s.drain_s,
            s.caught_up_s,
            s.replaced_s,
            s.lists,
            s.gateway_lists,
            s.member_watches,
            s.incidents.resumes(),
            s.incidents.expired,
            s.incidents.relists
        );
    }
    for v in r.violations.iter().take(20) {
        println!("violation: {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1:0 that answers every connection with `name` and closes it.
    async fn named(name: &'static [u8]) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s.write_all(name).await;
            }
        });
        (addr, task)
    }

    async fn who(front: &Front) -> Vec<u8> {
        let mut conn = TcpStream::connect(front.addr).await.unwrap();
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got).await;
        got
    }

    #[tokio::test]
    async fn the_front_spreads_connections_over_the_replicas_up_and_skips_one_that_refuses() {
        let front = Front::start(2).await.unwrap();
        let (a, _a) = named(b"a").await;
        let (b, b_task) = named(b"b").await;
        front.set(0, Some(a));
        front.set(1, Some(b));
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(who(&front).await);
        }
        seen.sort();
        assert_eq!(seen, [b"a", b"a", b"b", b"b"], "round robin over both");

        // Taken out: every connection to the other.
        front.set(0, None);
        for _ in 0..3 {
            assert_eq!(who(&front).await, b"b");
        }
        // Behind the front but refusing (its listener closed): skipped.
        front.set(0, Some(a));
        b_task.abort();
        let _ = b_task.await;
        for _ in 0..3 {
            assert_eq!(who(&front).await, b"a");
        }
        // None up: the connection ends at once.
        front.set(0, None);
        assert_eq!(who(&front).await, b"");
    }

    #[test]
    fn the_members_requests_grow_by_the_sum_of_each_members_growth() {
        assert_eq!(grown(&[(10, 5), (3, 1)], &[(12, 9), (3, 2)]), (2, 5));
        assert_eq!(grown(&[], &[]), (0, 0));
    }
}
