//! `soak` (issue 16 item 4): a long mixed load through one gateway against the simulated fleet,
//! watching the gateway for leaks and for errors that nothing explains. `benches/soak.sh` runs
//! it for 30 minutes; `loadtest/tests/run_smoke.rs` for seconds.
//!
//! The target is the gateway's members (`NAME=kubeconfig:gateway.kubeconfig:member*`, one context
//! per member). For `--warmup` + `--duration`, all at once:
//!
//! - small GETs (pod default/hello) on `--connections` keep-alive connections, `--get-rate` a
//!   second in all, round robin over the members;
//! - lists of the configmaps of one `load-K` namespace, `--list-rate` a second;
//! - `--watches` watches of those namespaces' configmaps (the sim's `--churn` changes them), each
//!   resuming from the last resourceVersion it saw when its stream ends, relisting on 410, as an
//!   informer does; `--reopen-per-sec` of them are closed and opened again on purpose;
//! - exec sessions (`echo soak` over WebSocket), `--exec-rate` a second, each checked for its
//!   output and its Success status;
//! - a configuration change in `--config-dir` every `--reload-every` (a Cluster written, then
//!   changed, then removed: the gateway's routing table is rebuilt and swapped each time);
//! - every `--restart-every`, SIGUSR1 to the simulated fleet (`--sim-pid`), which takes its next
//!   member down (member1, member2, ... round robin) for its `--restart-down`, then brings it
//!   back on the same address with the same objects.
//!
//! Every `--sample-every` the driver records the gateway's (`--pid`) resident memory and open
//! file descriptors, and for the interval just ended: requests, latency percentiles by kind,
//! errors by kind, open watches and watch events. An error on a member from one second before it
//! was taken down to [`RESTART_GRACE`] after it came back is charged to that restart; any other
//! is unexplained. The verdict ([`SoakReport::failures`]) is the goals: resident memory
//! and descriptors flat after the warm-up, no unexplained error, every watch open at the end and
//! hearing events, no rejected reload.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use super::client::{HttpConn, Target};
use super::exec::{open_session, StreamKind};
use super::fanout::event_rv;
use super::procstat::ProcWatch;
use super::scenarios::{current_rv, new_hist, read_lines, with_query};
use super::storm::{admin_reloads, cluster_yaml, read_reloads, write_atomically};
use super::{RunArgs, TargetResult};

/// The namespaces the sim's `--objects` and `--churn` use.
const NAMESPACES: usize = 10;
/// The pod every simulated member has.
const GET_PATH: &str = "/api/v1/namespaces/default/pods/hello";
const EXEC_PATH: &str =
    "/api/v1/namespaces/default/pods/hello/exec?command=echo&command=soak&stdout=true&stderr=true";
/// One request, list or exec session, start to end.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a member came back errors on it are still charged to its restart (the gateway
/// marks a member down after failed dials and probes it again; clients back off).
pub const RESTART_GRACE: Duration = Duration::from_secs(15);
/// A watch open at the end that heard nothing for this long is stalled.
const STALL: Duration = Duration::from_secs(60);
/// The file the reload loop writes in `--config-dir`.
const RELOAD_FILE: &str = "loadtest-soak.yaml";
/// Resident memory and descriptor growth over the measured phase that still counts as flat (the
/// samples around restarts left out).
pub const FLAT_RSS_MIB: f64 = 16.0;
pub const FLAT_FDS: f64 = 16.0;

/// One sample of the timeline.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SoakSample {
    /// Seconds since the load started.
    pub at_s: f64,
    /// After the warm-up.
    pub measured: bool,
    pub rss_mib: Option<f64>,
    pub fds: Option<u64>,
    pub gets: u64,
    pub lists: u64,
    pub execs: u64,
    pub get_p50_ms: Option<f64>,
    pub get_p99_ms: Option<f64>,
    pub list_p50_ms: Option<f64>,
    pub list_p99_ms: Option<f64>,
    pub exec_p50_ms: Option<f64>,
    pub exec_p99_ms: Option<f64>,
    /// Errors of the interval, by kind, and how many of them a restart explains and not.
    pub errors: BTreeMap<String, u64>,
    pub errors_restart: u64,
    pub errors_other: u64,
    pub watches_open: i64,
    pub watch_events: u64,
}

/// One member restart the driver asked for.
#[derive(Debug, Clone, Serialize)]
pub struct SoakRestart {
    pub member: String,
    /// Seconds since the load started: the signal, and when the member listens again.
    pub down_s: f64,
    pub back_s: f64,
}

/// What a soak found; `failures` empty means every goal held.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SoakReport {
    pub samples: Vec<SoakSample>,
    pub restarts: Vec<SoakRestart>,
    /// Errors no restart explains, and those the restarts caused, by kind.
    pub unexplained_errors: BTreeMap<String, u64>,
    pub restart_errors: BTreeMap<String, u64>,
    pub gets: u64,
    pub lists: u64,
    pub execs: u64,
    pub watches: usize,
    pub watches_open_at_end: i64,
    /// Watches a failure broke (a stream that ended without the driver closing it, or a
    /// reopening after the driver closed one that was refused), and how many opened again.
    pub watch_breaks: u64,
    pub watch_resumes: u64,
    /// The longest a broken watch took to open again, seconds.
    pub watch_resume_max_s: f64,
    pub watch_relists: u64,
    pub watch_reopens: u64,
    pub watches_stalled: u64,
    pub watch_events: u64,
    pub reloads_written: u64,
    pub reloads_applied: Option<u64>,
    pub reloads_failed: Option<u64>,
    /// Resident memory and descriptors just after the warm-up and at the end (medians of the
    /// first and last third of the measured samples), and the growth of a least-squares line
    /// through every measured sample over the measured phase; samples whose interval overlaps a
    /// restart (from a second before it to [`RESTART_GRACE`] after) are left out.
    pub rss_start_mib: Option<f64>,
    pub rss_end_mib: Option<f64>,
    pub rss_growth_mib: Option<f64>,
    pub fds_start: Option<f64>,
    pub fds_end: Option<f64>,
    pub fds_growth: Option<f64>,
    pub failures: Vec<String>,
}

/// Figures of the interval being sampled.
#[derive(Default)]
struct Interval {
    get: Option<Histogram<u64>>,
    list: Option<Histogram<u64>>,
    exec: Option<Histogram<u64>>,
    errors: BTreeMap<String, u64>,
}

impl Interval {
    fn hist(slot: &mut Option<Histogram<u64>>) -> &mut Histogram<u64> {
        slot.get_or_insert_with(new_hist)
    }
}

/// An error, for charging it to a restart or not at the end.
struct ErrorRecord {
    at: Instant,
    member: usize,
    kind: String,
}

#[derive(Clone, Copy)]
enum Load {
    Get,
    List,
    Exec,
}

/// Shared by every task of the soak.
struct Soak {
    start: Instant,
    deadline: Instant,
    interval: Mutex<Interval>,
    errors: Mutex<Vec<ErrorRecord>>,
    totals: [AtomicU64; 3],
    watches_open: AtomicI64,
    watch_events: AtomicU64,
    watch_breaks: AtomicU64,
    watch_resumes: AtomicU64,
    watch_resume_max_us: AtomicU64,
    watch_relists: AtomicU64,
    watch_reopens: AtomicU64,
    watches_stalled: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Soak {
    fn error(&self, member: usize, kind: String) {
        tracing::debug!(member, %kind, "soak error");
        *lock(&self.interval).errors.entry(kind.clone()).or_default() += 1;
        lock(&self.errors).push(ErrorRecord {
            at: Instant::now(),
            member,
            kind,
        });
    }

    fn done(&self, load: Load, took: Duration) {
        let us = took.as_micros().max(1) as u64;
        let mut interval = lock(&self.interval);
        let slot = match load {
            Load::Get => &mut interval.get,
            Load::List => &mut interval.list,
            Load::Exec => &mut interval.exec,
        };
        let _ = Interval::hist(slot).record(us);
        self.totals[load as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn seconds(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }
}

/// What a request failed with, as an error kind.
fn kind(load: &str, error: &anyhow::Error) -> String {
    let text = error.to_string();
    if let Some(status) = text.strip_prefix("status ") {
        format!("{load}: {status}")
    } else if text.contains("timed out") || text.contains("deadline") {
        format!("{load}: timeout")
    } else if text == "connect" || text.contains("refused") {
        format!("{load}: connect")
    } else {
        format!("{load}: connection lost")
    }
}

/// GET or list `path` on `conn` (opened if None), reading the whole body; Err with `status N`
/// for anything but 200.
async fn fetch(target: &Target, conn: &mut Option<HttpConn>, path: &str) -> anyhow::Result<()> {
    let request = target.get_request(path, "application/json");
    let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
        if conn.is_none() {
            *conn = Some(HttpConn::new(target.connect().await.context("connect")?));
        }
        let c = conn.as_mut().expect("just opened");
        let head = c.send(&request).await?;
        c.read_body(&head, |_| {}).await?;
        if head.close {
            *conn = None;
        }
        if head.status != 200 {
            bail!("status {}", head.status);
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|_| Err(anyhow!("timed out")));
    if outcome.is_err() {
        *conn = None;
    }
    outcome
}

/// A ticker of `per_sec` ticks a second that never bursts to catch up.
fn ticker(per_sec: f64) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(1.0 / per_sec.max(0.01));
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// GETs (or lists) at `per_sec` until the deadline; `paths` gives the member and path of the
/// n-th request.
async fn request_loop(
    soak: Arc<Soak>,
    members: Vec<Target>,
    load: Load,
    per_sec: f64,
    paths: impl Fn(u64) -> (usize, String),
) {
    let label = match load {
        Load::Get => "get",
        Load::List => "list",
        Load::Exec => "exec",
    };
    let mut conns: Vec<Option<HttpConn>> = members.iter().map(|_| None).collect();
    let mut tick = ticker(per_sec);
    let mut n = 0u64;
    while Instant::now() < soak.deadline {
        tick.tick().await;
        let (member, path) = paths(n);
        n += 1;
        let started = Instant::now();
        match fetch(&members[member], &mut conns[member], &path).await {
            Ok(()) => soak.done(load, started.elapsed()),
            Err(error) => soak.error(member, kind(label, &error)),
        }
    }
}

/// One exec session: `echo soak`, its output and its Success status.
async fn exec_once(target: &Target) -> anyhow::Result<()> {
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let ws = open_session(target, EXEC_PATH, StreamKind::Exec)
            .await
            .context("connect")?;
        let (_tx, mut rx) = ws.split();
        let (mut stdout, mut status) = (Vec::new(), Vec::new());
        while let Some(message) = rx.next().await {
            match message.map_err(|e| anyhow!("read: {e}"))? {
                Message::Binary(data) => match data.split_first() {
                    Some((1, rest)) => stdout.extend_from_slice(rest),
                    Some((3, rest)) => status.extend_from_slice(rest),
                    _ => {}
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
        if stdout != b"soak\n" {
            bail!("status bad output {:?}", String::from_utf8_lossy(&stdout));
        }
        if !String::from_utf8_lossy(&status).contains("\"Success\"") {
            bail!("status no Success status");
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|_| Err(anyhow!("timed out")))
}

async fn exec_loop(soak: Arc<Soak>, members: Vec<Target>, per_sec: f64) {
    let mut tick = ticker(per_sec);
    let mut n = 0usize;
    while Instant::now() < soak.deadline {
        tick.tick().await;
        let member = n % members.len();
        n += 1;
        let started = Instant::now();
        match exec_once(&members[member]).await {
            Ok(()) => soak.done(Load::Exec, started.elapsed()),
            Err(error) => soak.error(member, kind("exec", &error)),
        }
    }
}

/// One watch stream: what ended it.
enum StreamEnd {
    /// The driver closed it on purpose.
    Cycled,
    Deadline,
    /// The stream ended (or the connection broke) without the driver.
    Broken,
    /// A 410 Gone: relist, then watch again.
    Gone,
}

/// Reads one open watch until it ends; counts events and follows the resourceVersion.
async fn read_watch(
    soak: &Soak,
    mut conn: HttpConn,
    head: super::client::Head,
    rv: &mut u64,
    last_event: &mut Instant,
    cycle: &Notify,
) -> StreamEnd {
    let mut gone = false;
    let read = read_lines(&mut conn, &head, |arrived, line| {
        if line.windows(14).any(|w| w == b"\"type\":\"ERROR\"") {
            gone |= line.windows(10).any(|w| w == b"\"code\":410");
        } else {
            if let Some(r) = event_rv(line) {
                *rv = (*rv).max(r);
            }
            *last_event = arrived;
            soak.watch_events.fetch_add(1, Ordering::Relaxed);
        }
    });
    tokio::select! {
        _ = read => {}
        _ = cycle.notified() => return StreamEnd::Cycled,
        _ = tokio::time::sleep_until(soak.deadline.into()) => return StreamEnd::Deadline,
    }
    if gone {
        StreamEnd::Gone
    } else {
        StreamEnd::Broken
    }
}

/// Opens a watch of `collection` from `rv`: Ok(None) on 410 (relist).
async fn open_watch(
    target: &Target,
    collection: &str,
    rv: u64,
) -> anyhow::Result<Option<(HttpConn, super::client::Head)>> {
    let path = with_query(collection, &format!("watch=1&resourceVersion={rv}"));
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut conn = HttpConn::new(target.connect().await.context("connect")?);
        let head = conn
            .send(&target.get_request(&path, "application/json"))
            .await?;
        match head.status {
            200 => Ok(Some((conn, head))),
            410 => Ok(None),
            status => bail!("status {status}"),
        }
    })
    .await
    .unwrap_or_else(|_| Err(anyhow!("timed out")))
}

/// One client watch, as an informer keeps it: resumes from its resourceVersion whenever the
/// stream ends, relists on 410, backs off while the member is away.
async fn client_watch(
    soak: Arc<Soak>,
    target: Target,
    member: usize,
    collection: String,
    mut rv: u64,
    cycle: Arc<Notify>,
    opening: Arc<Semaphore>,
) {
    let mut broken_since: Option<Instant> = None;
    let mut last_event = Instant::now();
    let mut backoff = Duration::from_millis(250);
    let mut first = true;
    while Instant::now() < soak.deadline {
        let opened = {
            // The first opening of every watch is paced; resumes are not held back by others.
            let _permit = if first {
                opening.acquire().await.ok()
            } else {
                None
            };
            open_watch(&target, &collection, rv).await
        };
        let (conn, head) = match opened {
            Ok(Some(open)) => open,
            Ok(None) => {
                soak.watch_relists.fetch_add(1, Ordering::Relaxed);
                match current_rv(&target, &collection).await {
                    Ok(latest) => rv = latest.parse().unwrap_or(rv),
                    Err(error) => soak.error(member, kind("watch relist", &error)),
                }
                continue;
            }
            Err(error) => {
                soak.error(member, kind("watch open", &error));
                // A watch the driver closed on purpose (or relisted) just before a member went
                // away is broken by its reopening being refused, as much as one whose stream
                // the restart ended: it must resume too.
                if !first && broken_since.is_none() {
                    soak.watch_breaks.fetch_add(1, Ordering::Relaxed);
                    broken_since = Some(Instant::now());
                }
                let left = soak.deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(backoff.min(left)).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        first = false;
        backoff = Duration::from_millis(250);
        if let Some(since) = broken_since.take() {
            soak.watch_resumes.fetch_add(1, Ordering::Relaxed);
            soak.watch_resume_max_us
                .fetch_max(since.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        soak.watches_open.fetch_add(1, Ordering::Relaxed);
        let end = read_watch(&soak, conn, head, &mut rv, &mut last_event, &cycle).await;
        match end {
            StreamEnd::Deadline => {
                // Still open at the end: counted open; stalled if it heard nothing for long.
                if last_event.elapsed() > STALL {
                    soak.watches_stalled.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            StreamEnd::Cycled => {
                soak.watch_reopens.fetch_add(1, Ordering::Relaxed);
            }
            StreamEnd::Gone => {
                soak.watch_relists.fetch_add(1, Ordering::Relaxed);
                match current_rv(&target, &collection).await {
                    Ok(latest) => rv = latest.parse().unwrap_or(rv),
                    Err(error) => soak.error(member, kind("watch relist", &error)),
                }
            }
            StreamEnd::Broken => {
                soak.watch_breaks.fetch_add(1, Ordering::Relaxed);
                soak.error(member, "watch: ended".into());
                broken_since = Some(Instant::now());
            }
        }
        soak.watches_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes, changes and removes a Cluster in the gateway's configuration directory, one step every
/// `every`, until the deadline. Returns the changes written.
async fn reload_loop(soak: Arc<Soak>, dir: PathBuf, every: Duration) -> u64 {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut written = 0u64;
    let mut generation = 0u64;
    while Instant::now() + every <= soak.deadline {
        tick.tick().await;
        generation += 1;
        let outcome = if generation.is_multiple_of(3) {
            std::fs::remove_file(dir.join(RELOAD_FILE))
        } else {
            write_atomically(
                &dir,
                RELOAD_FILE,
                &cluster_yaml("loadtest-soak", generation),
            )
        };
        match outcome {
            Ok(()) => written += 1,
            Err(error) => tracing::warn!(%error, dir = %dir.display(), "soak reload write failed"),
        }
    }
    let _ = std::fs::remove_file(dir.join(RELOAD_FILE));
    written
}

/// Asks the simulated fleet to restart its next member every `every`; returns the restarts.
async fn restart_loop(
    soak: Arc<Soak>,
    sim_pid: u32,
    names: Vec<String>,
    every: Duration,
    down: Duration,
) -> anyhow::Result<Vec<SoakRestart>> {
    let mut restarts = Vec::new();
    let mut next = soak.start + every;
    // A restart must be over one period before the end, so every watch it breaks has had time to
    // resume when the verdict is taken.
    while next + down + every <= soak.deadline {
        tokio::time::sleep_until(next.into()).await;
        let signalled = tokio::process::Command::new("kill")
            .args(["-USR1", &sim_pid.to_string()])
            .status()
            .await
            .context("running kill")?;
        if !signalled.success() {
            bail!("kill -USR1 {sim_pid} (the simulated fleet) failed: {signalled}");
        }
        let now = Instant::now();
        let member = names[restarts.len() % names.len()].clone();
        tracing::info!(%member, "member restart asked");
        restarts.push(SoakRestart {
            member,
            down_s: soak.seconds(now),
            back_s: soak.seconds(now + down),
        });
        next += every;
    }
    Ok(restarts)
}

fn ms(h: &Option<Histogram<u64>>, q: f64) -> Option<f64> {
    h.as_ref()
        .filter(|h| !h.is_empty())
        .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
}

/// Samples the gateway and swaps the interval's figures out every `every` until the deadline.
async fn sample_loop(
    soak: Arc<Soak>,
    pw: Option<ProcWatch>,
    every: Duration,
    warmup: Duration,
) -> Vec<SoakSample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval_at((soak.start + every).into(), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events_before = 0;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let interval = std::mem::take(&mut *lock(&soak.interval));
        let events = soak.watch_events.load(Ordering::Relaxed);
        samples.push(SoakSample {
            at_s: soak.seconds(now),
            measured: now >= soak.start + warmup,
            rss_mib: pw
                .as_ref()
                .and_then(|p| p.rss().ok())
                .map(|b| b as f64 / (1024.0 * 1024.0)),
            fds: pw.as_ref().and_then(|p| p.open_fds().ok()),
            gets: interval.get.as_ref().map_or(0, |h| h.len()),
            lists: interval.list.as_ref().map_or(0, |h| h.len()),
            execs: interval.exec.as_ref().map_or(0, |h| h.len()),
            get_p50_ms: ms(&interval.get, 0.5),
            get_p99_ms: ms(&interval.get, 0.99),
            list_p50_ms: ms(&interval.list, 0.5),
            list_p99_ms: ms(&interval.list, 0.99),
            exec_p50_ms: ms(&interval.exec, 0.5),
            exec_p99_ms: ms(&interval.exec, 0.99),
            errors: interval.errors,
            errors_restart: 0,
            errors_other: 0,
            watches_open: soak.watches_open.load(Ordering::Relaxed),
            watch_events: events - events_before,
        });
        events_before = events;
        if now + every > soak.deadline {
            return samples;
        }
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// Median of the first and the last third of `points` (x, y), and the growth over the x span of
/// the least-squares line through all of them.
pub fn trend(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let third = points.len() / 3;
    let first = median(points[..third].iter().map(|p| p.1).collect())?;
    let last = median(points[points.len() - third..].iter().map(|p| p.1).collect())?;
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let span = points[points.len() - 1].0 - points[0].0;
    Some((first, last, slope * span))
}

/// Splits the errors into those a restart explains and the rest (by kind), and counts both in the
/// sample whose interval each fell in.
fn charge(
    errors: &[ErrorRecord],
    restarts: &[SoakRestart],
    names: &[String],
    start: Instant,
    samples: &mut [SoakSample],
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let (mut unexplained, mut explained) = (BTreeMap::new(), BTreeMap::new());
    for e in errors {
        let at = e.at.saturating_duration_since(start).as_secs_f64();
        let by_restart = restarts.iter().any(|r| {
            names.get(e.member) == Some(&r.member)
                && at >= r.down_s - 1.0
                && at <= r.back_s + RESTART_GRACE.as_secs_f64()
        });
        let sample = samples.iter_mut().find(|s| s.at_s >= at);
        let into = if by_restart {
            if let Some(s) = sample {
                s.errors_restart += 1;
            }
            &mut explained
        } else {
            if let Some(s) = sample {
                s.errors_other += 1;
            }
            &mut unexplained
        };
        *into.entry(e.kind.clone()).or_insert(0) += 1;
    }
    (unexplained, explained)
}

/// `soak`: see the module documentation.
pub async fn soak(
    args: &RunArgs,
    name: &str,
    members: &[Target],
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    anyhow::ensure!(!members.is_empty(), "{name}: no members to load");
    let names: Vec<String> = members
        .iter()
        .map(|m| {
            m.path_prefix
                .rsplit('/')
                .next()
                .unwrap_or(&m.name)
                .to_owned()
        })
        .collect();
    let restart = match (args.restart_every, args.sim_pid) {
        (Some(every), Some(pid)) => Some((every, pid)),
        (None, _) => None,
        (Some(_), None) => bail!("--restart-every needs --sim-pid (the simulated fleet's)"),
    };
    let (admin, reloads_before) = admin_reloads(args).await?;

    // Where every watch starts: each (member, namespace) collection's current resourceVersion.
    let mut collections = Vec::new();
    for (m, target) in members.iter().enumerate() {
        for k in 0..NAMESPACES {
            let collection = format!("/api/v1/namespaces/load-{k}/configmaps");
            let rv = current_rv(target, &collection)
                .await
                .with_context(|| format!("{}: listing {collection}", target.name))?;
            collections.push((m, collection, rv.parse::<u64>().unwrap_or(0)));
        }
    }

    let start = Instant::now();
    let soak = Arc::new(Soak {
        start,
        deadline: start + args.warmup + args.duration,
        interval: Mutex::new(Interval::default()),
        errors: Mutex::new(Vec::new()),
        totals: Default::default(),
        watches_open: AtomicI64::new(0),
        watch_events: AtomicU64::new(0),
        watch_breaks: AtomicU64::new(0),
        watch_resumes: AtomicU64::new(0),
        watch_resume_max_us: AtomicU64::new(0),
        watch_relists: AtomicU64::new(0),
        watch_reopens: AtomicU64::new(0),
        watches_stalled: AtomicU64::new(0),
    });
    let mut tasks = Vec::new();

    // Watches first: they open paced, 64 at a time, while the rest of the load starts.
    let opening = Arc::new(Semaphore::new(64));
    let mut cycles = Vec::with_capacity(args.watches);
    for i in 0..args.watches {
        let (m, collection, rv) = collections[i % collections.len()].clone();
        let cycle = Arc::new(Notify::new());
        cycles.push(cycle.clone());
        tasks.push(tokio::spawn(client_watch(
            soak.clone(),
            members[m].clone(),
            m,
            collection,
            rv,
            cycle,
            opening.clone(),
        )));
    }
    if args.reopen_per_sec > 0.0 && !cycles.is_empty() {
        let soak = soak.clone();
        let per_sec = args.reopen_per_sec;
        tasks.push(tokio::spawn(async move {
            let mut tick = ticker(per_sec);
            let mut i = 0usize;
            while Instant::now() < soak.deadline {
                tick.tick().await;
                cycles[i % cycles.len()].notify_one();
                i += 1;
            }
        }));
    }
    let connections = args.connections.max(1);
    for c in 0..connections {
        let count = members.len();
        tasks.push(tokio::spawn(request_loop(
            soak.clone(),
            members.to_vec(),
            Load::Get,
            args.get_rate / connections as f64,
            move |n| ((c + n as usize) % count, GET_PATH.to_owned()),
        )));
    }
    {
        let count = members.len();
        tasks.push(tokio::spawn(request_loop(
            soak.clone(),
            members.to_vec(),
            Load::List,
            args.list_rate,
            move |n| {
                let n = n as usize;
                (
                    n % count,
                    format!(
                        "/api/v1/namespaces/load-{}/configmaps",
                        (n / count) % NAMESPACES
                    ),
                )
            },
        )));
    }
    if args.exec_rate > 0.0 {
        tasks.push(tokio::spawn(exec_loop(
            soak.clone(),
            members.to_vec(),
            args.exec_rate,
        )));
    }
    let reloads = args
        .config_dir
        .clone()
        .map(|dir| tokio::spawn(reload_loop(soak.clone(), dir, args.reload_every)));
    let restarts = restart.map(|(every, pid)| {
        tokio::spawn(restart_loop(
            soak.clone(),
            pid,
            names.clone(),
            every,
            args.restart_down,
        ))
    });
    let samples = tokio::spawn(sample_loop(
        soak.clone(),
        pw.cloned(),
        args.sample_every,
        args.warmup,
    ));

    let mut samples = samples.await.context("sampler")?;
    for t in tasks {
        t.await.context("soak task")?;
    }
    let reloads_written = match reloads {
        Some(t) => t.await.context("reload task")?,
        None => 0,
    };
    let restarts = match restarts {
        Some(t) => t.await.context("restart task")??,
        None => Vec::new(),
    };
    let (reloads_applied, reloads_failed) = match (&admin, reloads_before) {
        (Some(a), Some((s0, f0))) => {
            let (s, f) = read_reloads(a).await?;
            (Some(s - s0), Some(f - f0))
        }
        _ => (None, None),
    };

    let (unexplained_errors, restart_errors) =
        charge(&lock(&soak.errors), &restarts, &names, start, &mut samples);
    // The trends leave out the samples whose interval overlaps a restart: a member away drops
    // its connections (descriptors dip) and the dip is not the trend.
    let every = args.sample_every.as_secs_f64();
    let grace = RESTART_GRACE.as_secs_f64();
    let measured: Vec<&SoakSample> = samples
        .iter()
        .filter(|s| s.measured)
        .filter(|s| {
            !restarts
                .iter()
                .any(|r| s.at_s >= r.down_s - 1.0 && s.at_s - every <= r.back_s + grace)
        })
        .collect();
    let rss = trend(
        &measured
            .iter()
            .filter_map(|s| Some((s.at_s, s.rss_mib?)))
            .collect::<Vec<_>>(),
    );
    let fds = trend(
        &measured
            .iter()
            .filter_map(|s| Some((s.at_s, s.fds? as f64)))
            .collect::<Vec<_>>(),
    );
    let total = |l: Load| soak.totals[l as usize].load(Ordering::Relaxed);
    let mut report = SoakReport {
        samples,
        restarts,
        unexplained_errors,
        restart_errors,
        gets: total(Load::Get),
        lists: total(Load::List),
        execs: total(Load::Exec),
        watches: args.watches,
        watches_open_at_end: soak.watches_open.load(Ordering::Relaxed),
        watch_breaks: soak.watch_breaks.load(Ordering::Relaxed),
        watch_resumes: soak.watch_resumes.load(Ordering::Relaxed),
        watch_resume_max_s: soak.watch_resume_max_us.load(Ordering::Relaxed) as f64 / 1e6,
        watch_relists: soak.watch_relists.load(Ordering::Relaxed),
        watch_reopens: soak.watch_reopens.load(Ordering::Relaxed),
        watches_stalled: soak.watches_stalled.load(Ordering::Relaxed),
        watch_events: soak.watch_events.load(Ordering::Relaxed),
        reloads_written,
        reloads_applied,
        reloads_failed,
        rss_start_mib: rss.map(|t| t.0),
        rss_end_mib: rss.map(|t| t.1),
        rss_growth_mib: rss.map(|t| t.2),
        fds_start: fds.map(|t| t.0),
        fds_end: fds.map(|t| t.1),
        fds_growth: fds.map(|t| t.2),
        failures: Vec::new(),
    };
    report.failures = failures(&report);
    let errors: u64 = report.unexplained_errors.values().sum();
    let seconds = start.elapsed().as_secs_f64();
    Ok(TargetResult {
        target: name.to_owned(),
        scenario: "soak".into(),
        requests: report.gets + report.lists + report.execs,
        errors,
        seconds,
        req_per_sec: Some((report.gets + report.lists + report.execs) as f64 / seconds),
        watches: Some(args.watches),
        events: Some(report.watch_events),
        soak: Some(Box::new(report)),
        ..Default::default()
    })
}

/// The flatness rule, shared with `chaos`: resident memory and open descriptors grown (by
/// [`trend`]) past [`FLAT_RSS_MIB`] and [`FLAT_FDS`] after the warm-up, each said in a sentence.
pub fn growth_failures(rss_growth_mib: Option<f64>, fds_growth: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(g) = rss_growth_mib.filter(|g| *g > FLAT_RSS_MIB) {
        out.push(format!(
            "resident memory grew {g:.1} MiB after the warm-up (flat: at most {FLAT_RSS_MIB})"
        ));
    }
    if let Some(g) = fds_growth.filter(|g| *g > FLAT_FDS) {
        out.push(format!(
            "open descriptors grew by {g:.0} after the warm-up (flat: at most {FLAT_FDS})"
        ));
    }
    out
}

/// The goals a soak missed, each said in a sentence.
pub fn failures(r: &SoakReport) -> Vec<String> {
    let mut out = growth_failures(r.rss_growth_mib, r.fds_growth);
    let unexplained: u64 = r.unexplained_errors.values().sum();
    if unexplained > 0 {
        out.push(format!(
            "{unexplained} errors no restart explains: {:?}",
            r.unexplained_errors
        ));
    }
    if r.watches_open_at_end != r.watches as i64 {
        out.push(format!(
            "{} of {} watches open at the end",
            r.watches_open_at_end, r.watches
        ));
    }
    if r.watches_stalled > 0 {
        out.push(format!(
            "{} watches open at the end heard nothing for {} s",
            r.watches_stalled,
            STALL.as_secs()
        ));
    }
    if r.watch_resumes < r.watch_breaks {
        out.push(format!(
            "{} watch streams broke, {} resumed",
            r.watch_breaks, r.watch_resumes
        ));
    }
    if let Some(f) = r.reloads_failed.filter(|f| *f > 0) {
        out.push(format!("{f} configuration reloads rejected"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_kind() {
        let refused =
            anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                .context("connect");
        assert_eq!(kind("get", &refused), "get: connect");
        assert_eq!(kind("get", &anyhow!("status 503")), "get: 503");
        assert_eq!(kind("exec", &anyhow!("timed out")), "exec: timeout");
        assert_eq!(
            kind("watch", &anyhow!("connection reset by peer")),
            "watch: connection lost"
        );
    }

    #[test]
    fn a_steady_line_is_flat_and_a_leak_shows() {
        let flat: Vec<(f64, f64)> = (0..30)
            .map(|i| (i as f64, 100.0 + (i % 3) as f64))
            .collect();
        let (first, last, growth) = trend(&flat).unwrap();
        assert!((first - 101.0).abs() <= 1.0 && (last - 101.0).abs() <= 1.0);
        assert!(growth.abs() < 1.0, "{growth}");
        let leak: Vec<(f64, f64)> = (0..30).map(|i| (i as f64, 100.0 + i as f64)).collect();
        let (_, _, growth) = trend(&leak).unwrap();
        assert!((growth - 29.0).abs() < 1e-6, "{growth}");
        assert_eq!(trend(&leak[..2]), None);
    }

    #[test]
    fn errors_on_a_restarted_member_near_its_restart_are_charged_to_it() {
        let start = Instant::now();
        let at = |s: f64| start + Duration::from_secs_f64(s);
        let names = vec!["member1".to_owned(), "member2".to_owned()];
        let restarts = vec![SoakRestart {
            member: "member2".into(),
            down_s: 10.0,
            back_s: 15.0,
        }];
        let errors = vec![
            // member2 while down, and just after: the restart.
            ErrorRecord {
                at: at(11.0),
                member: 1,
                kind: "get: 503".into(),
            },
            ErrorRecord {
                at: at(25.0),
                member: 1,
                kind: "watch: ended".into(),
            },
            // member1 at the same time, and member2 long after: unexplained.
            ErrorRecord {
                at: at(11.0),
                member: 0,
                kind: "get: 503".into(),
            },
            ErrorRecord {
                at: at(60.0),
                member: 1,
                kind: "get: 503".into(),
            },
        ];
        let mut samples: Vec<SoakSample> = [20.0, 40.0, 70.0]
            .iter()
            .map(|&at_s| SoakSample {
                at_s,
                ..Default::default()
            })
            .collect();
        let (unexplained, explained) = charge(&errors, &restarts, &names, start, &mut samples);
        assert_eq!(unexplained.get("get: 503"), Some(&2));
        assert_eq!(explained.get("get: 503"), Some(&1));
        assert_eq!(explained.get("watch: ended"), Some(&1));
        let per_sample: Vec<(u64, u64)> = samples
            .iter()
            .map(|s| (s.errors_restart, s.errors_other))
            .collect();
        assert_eq!(per_sample, [(1, 1), (1, 0), (0, 1)]);
    }

    #[test]
    fn a_clean_report_has_no_failures_and_each_miss_is_named() {
        let mut r = SoakReport {
            watches: 10,
            watches_open_at_end: 10,
            rss_growth_mib: Some(2.0),
            fds_growth: Some(1.0),
            reloads_failed: Some(0),
            ..Default::default()
        };
        assert!(failures(&r).is_empty(), "{:?}", failures(&r));
        r.rss_growth_mib = Some(40.0);
        r.watches_open_at_end = 9;
        r.unexplained_errors.insert("list: 500".into(), 1);
        let f = failures(&r);
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(f[0].contains("resident memory grew 40.0 MiB"), "{f:?}");
    }
}
