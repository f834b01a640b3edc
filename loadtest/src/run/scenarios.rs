//! The scenarios of BENCHMARKS.md, each run against one target at a time. Every loop here is
//! bounded by a deadline and by `--max-requests`; every figure is charged to the target's process
//! (its PID), never to the driver.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;

use super::client::{HttpConn, Target};
use super::procstat::ProcWatch;
use super::{RunArgs, TargetResult};

pub(super) fn new_hist() -> Histogram<u64> {
    // 1 us .. 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// Write-to-delivery latencies of every watch of a run, in one histogram. One per watch (about
/// 150 KB of zeroed counts each) is memory the driver faults in as thousands of watches begin to
/// read: that stalled it for seconds, and the stall showed as every target's p99.
pub(super) struct Latencies(std::sync::Mutex<Histogram<u64>>);

impl Latencies {
    pub(super) fn new() -> Latencies {
        Latencies(std::sync::Mutex::new(new_hist()))
    }

    /// Records the time from `sent` (unix nanoseconds, the event's stamp) to now.
    pub(super) fn record_since(&self, sent: u128) {
        let us = unix_nanos().saturating_sub(sent) / 1000;
        if let Ok(mut hist) = self.0.lock() {
            let _ = hist.record((us as u64).max(1));
        }
    }

    /// What was recorded so far.
    pub(super) fn snapshot(&self) -> Histogram<u64> {
        self.0
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| new_hist())
    }
}

struct PhaseOutcome {
    conns: Vec<HttpConn>,
    hist: Histogram<u64>,
    requests: u64,
    errors: u64,
    bytes: u64,
}

/// Runs every connection in a request loop until `deadline` or until `budget` requests are spent.
async fn request_phase(
    target: &Target,
    conns: Vec<HttpConn>,
    request: Arc<Vec<u8>>,
    deadline: Instant,
    budget: Arc<AtomicU64>,
) -> PhaseOutcome {
    let mut tasks = Vec::with_capacity(conns.len());
    for mut conn in conns {
        let request = request.clone();
        let budget = budget.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = new_hist();
            let (mut requests, mut errors, mut bytes) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline && budget.fetch_sub(1, Ordering::Relaxed) > 0 {
                let start = Instant::now();
                let outcome = async {
                    let head = conn.send(&request).await?;
                    let n = conn.read_body(&head, |_| {}).await?;
                    if !(200..300).contains(&head.status) {
                        bail!("status {}", head.status);
                    }
                    Ok::<_, anyhow::Error>((n, head.close))
                }
                .await;
                match outcome {
                    Ok((n, close)) => {
                        requests += 1;
                        bytes += n;
                        let _ = hist.record(start.elapsed().as_micros().max(1) as u64);
                        if close {
                            match target.connect().await {
                                Ok(io) => conn = HttpConn::new(io),
                                Err(_) => return None,
                            }
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        tracing::debug!(error = %e, "request failed; reconnecting");
                        match target.connect().await {
                            Ok(io) => conn = HttpConn::new(io),
                            Err(_) => return Some((None, hist, requests, errors, bytes)),
                        }
                    }
                }
            }
            Some((Some(conn), hist, requests, errors, bytes))
        }));
    }
    let mut out = PhaseOutcome {
        conns: Vec::new(),
        hist: new_hist(),
        requests: 0,
        errors: 0,
        bytes: 0,
    };
    for t in tasks {
        match t.await {
            Ok(Some((conn, hist, r, e, b))) => {
                out.conns.extend(conn);
                let _ = out.hist.add(&hist);
                out.requests += r;
                out.errors += e;
                out.bytes += b;
            }
            _ => out.errors += 1,
        }
    }
    out
}

async fn open_conns(target: &Target, n: usize) -> anyhow::Result<Vec<HttpConn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(HttpConn::new(target.connect().await?));
    }
    Ok(conns)
}

pub(super) fn cpu_now(pw: Option<&ProcWatch>) -> anyhow::Result<Option<Duration>> {
    pw.map(|p| p.cpu()).transpose()
}

/// The target's CPU seconds since `cpu0` (a [`cpu_now`] reading); None without `--pid`.
pub(super) fn cpu_since(
    pw: Option<&ProcWatch>,
    cpu0: Option<Duration>,
) -> anyhow::Result<Option<f64>> {
    Ok(cpu_now(pw)?.zip(cpu0).map(|(b, a)| (b - a).as_secs_f64()))
}

/// Fails a scenario whose warm-up saw no `what` succeed: its measured phase would count nothing
/// but errors.
pub(super) fn check_warm_up(
    target: &Target,
    what: &str,
    (requests, errors): (u64, u64),
) -> anyhow::Result<()> {
    if requests == 0 {
        bail!(
            "{}: no {what} succeeded during warm-up ({errors} errors)",
            target.name
        );
    }
    Ok(())
}

/// The measured phase of a scenario: `phase`, begun with the instant it starts, and what it
/// returned, with its wall-clock seconds and the target's CPU seconds over it.
pub(super) async fn measured<T, F: std::future::Future<Output = T>>(
    pw: Option<&ProcWatch>,
    phase: impl FnOnce(Instant) -> F,
) -> anyhow::Result<(T, f64, Option<f64>)> {
    let cpu0 = cpu_now(pw)?;
    let start = Instant::now();
    let out = phase(start).await;
    let seconds = start.elapsed().as_secs_f64();
    Ok((out, seconds, cpu_since(pw, cpu0)?))
}

/// `small-get`: C keep-alive connections, each one request at a time, for `--duration`.
pub async fn small_get(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let request = Arc::new(target.get_request(&args.path, "application/json"));
    let conns = open_conns(target, args.connections).await?;
    let warm = request_phase(
        target,
        conns,
        request.clone(),
        Instant::now() + args.warmup,
        Arc::new(AtomicU64::new(args.max_requests)),
    )
    .await;
    check_warm_up(target, "request", (warm.requests, warm.errors))?;
    let (out, seconds, cpu) = measured(pw, |start| {
        request_phase(
            target,
            warm.conns,
            request,
            start + args.duration,
            Arc::new(AtomicU64::new(args.max_requests)),
        )
    })
    .await?;
    Ok(TargetResult {
        bytes: out.bytes,
        ..request_figures(
            target,
            "small-get",
            (out.requests, out.errors),
            seconds,
            cpu,
            &out.hist,
        )
    })
}

/// The figures of a scenario that counts requests (small-get, small-get-h2): the rate, the
/// target's CPU per request (`cpu`: its CPU seconds over the run) and the p50/p99 latencies.
pub(super) fn request_figures(
    target: &Target,
    scenario: &str,
    (requests, errors): (u64, u64),
    seconds: f64,
    cpu: Option<f64>,
    hist: &Histogram<u64>,
) -> TargetResult {
    TargetResult {
        target: target.name.clone(),
        scenario: scenario.into(),
        requests,
        errors,
        seconds,
        req_per_sec: Some(requests as f64 / seconds),
        cpu_us_per_request: cpu
            .filter(|_| requests > 0)
            .map(|c| c * 1e6 / requests as f64),
        p50_us: Some(hist.value_at_quantile(0.5) as f64),
        p99_us: Some(hist.value_at_quantile(0.99) as f64),
        ..Default::default()
    }
}

/// `big-list`: one connection reads a large response (`--path`) again and again for `--duration`
/// (at least once), while the target's resident memory is sampled for its peak.
pub async fn big_list(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let request = target.get_request(&args.path, "application/json");
    let mut conn = HttpConn::new(target.connect().await?);
    let rss = RssSampler::start(pw, Duration::from_millis(20))?;
    let cpu0 = cpu_now(pw)?;
    let start = Instant::now();
    let (mut requests, mut bytes) = (0u64, 0u64);
    while requests == 0 || (start.elapsed() < args.duration && requests < args.max_requests) {
        let head = conn.send(&request).await?;
        if head.status != 200 {
            bail!("{}: big-list answered {}", target.name, head.status);
        }
        bytes += conn.read_body(&head, |_| {}).await?;
        requests += 1;
        if head.close {
            conn = HttpConn::new(target.connect().await?);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_since(pw, cpu0)?;
    let (rss_base_kib, rss_peak_kib) = rss.stop();
    let mb = bytes as f64 / 1e6;
    Ok(TargetResult {
        target: target.name.clone(),
        scenario: "big-list".into(),
        requests,
        seconds,
        bytes,
        mb_per_sec: Some(mb / seconds),
        cpu_ms_per_mb: cpu.map(|c| c * 1e3 / mb),
        rss_base_kib,
        rss_peak_kib,
        ..Default::default()
    })
}

/// A target's resident memory, sampled for its peak while a scenario runs.
pub(super) struct RssSampler {
    base: Option<u64>,
    peak: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RssSampler {
    /// Reads the resident memory now (the base), then every `every` until [`RssSampler::stop`].
    /// Without a process, samples nothing.
    pub fn start(pw: Option<&ProcWatch>, every: Duration) -> anyhow::Result<RssSampler> {
        let base = pw.map(|p| p.rss()).transpose()?;
        let peak = Arc::new(AtomicU64::new(base.unwrap_or(0)));
        let task = pw.cloned().map(|p| {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    if let Ok(r) = p.rss() {
                        peak.fetch_max(r, Ordering::Relaxed);
                    }
                    tokio::time::sleep(every).await;
                }
            })
        });
        Ok(RssSampler { base, peak, task })
    }

    /// Stops sampling: the base and the peak, in KiB (None without a process).
    pub fn stop(self) -> (Option<f64>, Option<f64>) {
        if let Some(task) = self.task {
            task.abort();
        }
        let peak = self.peak.load(Ordering::Relaxed) as f64 / 1024.0;
        (
            self.base.map(|b| b as f64 / 1024.0),
            self.base.map(|_| peak),
        )
    }
}

/// Opens `n` watch streams on `path` (at most 256 handshakes at a time) and returns them with their
/// response heads read.
pub(super) async fn open_watches(
    target: &Target,
    path: &str,
    n: usize,
) -> anyhow::Result<Vec<(HttpConn, super::client::Head)>> {
    let request = Arc::new(target.get_request(path, "application/json"));
    let gate = Arc::new(Semaphore::new(256));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (target, request, gate) = (target.clone(), request.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let mut conn = HttpConn::new(target.connect().await?);
            let head = conn.send(&request).await?;
            if head.status != 200 {
                bail!("watch answered {}", head.status);
            }
            Ok((conn, head))
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.context("watch task")??);
    }
    Ok(out)
}

/// `watch-idle`: W open watches with nothing flowing: resident memory per watch and CPU at rest.
pub async fn watch_idle(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let base = pw.map(|p| p.rss_each()).transpose()?;
    let watches = open_watches(target, &args.path, args.watches)
        .await
        .with_context(|| format!("{}: opening {} watches", target.name, args.watches))?;
    // Let the target settle (allocator, lazily grown buffers) before reading memory.
    tokio::time::sleep(args.warmup).await;
    let held = pw.map(|p| p.rss_each()).transpose()?;
    let ((), seconds, cpu) = measured(pw, |_| tokio::time::sleep(args.duration)).await?;
    let w = watches.len();
    drop(watches);
    let kib = |v: &Vec<u64>| v.iter().sum::<u64>() as f64 / 1024.0;
    let per_watch = |b: u64, h: u64| (h as f64 - b as f64) / 1024.0 / w as f64;
    Ok(TargetResult {
        target: target.name.clone(),
        scenario: "watch-idle".into(),
        seconds,
        watches: Some(w),
        rss_base_kib: base.as_ref().map(kib),
        rss_peak_kib: held.as_ref().map(kib),
        kib_per_watch: base
            .as_ref()
            .zip(held.as_ref())
            .map(|(b, h)| per_watch(b.iter().sum(), h.iter().sum())),
        kib_per_watch_each: base
            .as_ref()
            .zip(held.as_ref())
            .filter(|(b, _)| b.len() > 1)
            .map(|(b, h)| b.iter().zip(h).map(|(b, h)| per_watch(*b, *h)).collect()),
        idle_cpu_percent: cpu.map(|c| c * 100.0 / seconds),
        ..Default::default()
    })
}

/// Finds the `fleetgate.io/sent-at` annotation (unix nanoseconds) in one watch event.
pub fn sent_at_nanos(event: &[u8]) -> Option<u128> {
    const KEY: &[u8] = b"\"fleetgate.io/sent-at\":\"";
    let at = event.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = &event[at..];
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

pub(super) fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The collection's current resourceVersion (a `limit=1` LIST), so watches started there replay
/// no old events.
pub(super) async fn current_rv(target: &Target, path: &str) -> anyhow::Result<String> {
    let mut conn = HttpConn::new(target.connect().await?);
    let head = conn
        .send(&target.get_request(&with_query(path, "limit=1"), "application/json"))
        .await?;
    let mut body = Vec::new();
    conn.read_body(&head, |d| body.extend_from_slice(d)).await?;
    let list: serde_json::Value =
        serde_json::from_slice(&body).context("list response is not JSON")?;
    Ok(list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_owned())
}

pub(super) fn with_query(path: &str, query: &str) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}{query}")
}

/// Reads one watch stream until `deadline`, handing every complete event line that carries a
/// send stamp to `on_event` with the time its read arrived (one clock read per read, not per
/// line) and the line itself.
pub(super) async fn read_events(
    mut conn: HttpConn,
    head: super::client::Head,
    deadline: Instant,
    mut on_event: impl FnMut(u128, Instant, &[u8]),
) {
    let read = read_lines(&mut conn, &head, stamped(&mut on_event));
    let _ = tokio::time::timeout_at(deadline.into(), read).await;
}

/// A line handler that hands `on_event` the lines that carry a send stamp, with the stamp.
pub(super) fn stamped(
    on_event: &mut impl FnMut(u128, Instant, &[u8]),
) -> impl FnMut(Instant, &[u8]) + '_ {
    move |arrived, line| {
        if let Some(sent) = sent_at_nanos(line) {
            on_event(sent, arrived, line);
        }
    }
}

/// Reads a watch body to its end, handing each complete line (with its `\n`) to `on_line` with
/// the time its read arrived (one clock read per read, not per line).
pub(super) async fn read_lines(
    conn: &mut HttpConn,
    head: &super::client::Head,
    mut on_line: impl FnMut(Instant, &[u8]),
) -> anyhow::Result<u64> {
    let mut line = Vec::with_capacity(4096);
    conn.read_body(head, |data| {
        split_lines(&mut line, data, Instant::now(), &mut on_line)
    })
    .await
}

/// Hands each line that `data` completes (with its `\n`) to `on_line`, keeping the rest of the
/// last in `line` for the next read.
pub(super) fn split_lines(
    line: &mut Vec<u8>,
    data: &[u8],
    arrived: Instant,
    on_line: &mut impl FnMut(Instant, &[u8]),
) {
    for piece in data.split_inclusive(|b| *b == b'\n') {
        line.extend_from_slice(piece);
        if line.ends_with(b"\n") {
            on_line(arrived, line);
            line.clear();
        }
    }
}

/// `watch-events`: W watches on `--path` (a collection the upstream churns with sent-at stamped
/// updates), started at the collection's current resourceVersion; the delivery latency of every
/// event and the target's CPU per delivered event.
pub async fn watch_events(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let rv = current_rv(target, &args.path).await?;
    let watch_path = with_query(&args.path, &format!("watch=1&resourceVersion={rv}"));
    let watches = open_watches(target, &watch_path, args.watches).await?;

    let events = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + args.warmup + args.duration;
    let measure_from = Instant::now() + args.warmup;
    let latency = Arc::new(Latencies::new());
    let mut tasks = Vec::new();
    for (conn, head) in watches {
        let (events, latency) = (events.clone(), latency.clone());
        tasks.push(tokio::spawn(async move {
            read_events(conn, head, deadline, |sent, arrived, _| {
                if arrived >= measure_from {
                    latency.record_since(sent);
                    events.fetch_add(1, Ordering::Relaxed);
                }
            })
            .await;
        }));
    }
    tokio::time::sleep_until((Instant::now() + args.warmup).into()).await;
    let cpu0 = cpu_now(pw)?;
    let ev0 = events.load(Ordering::Relaxed);
    let start = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    let seconds = start.elapsed().as_secs_f64();
    let hist = latency.snapshot();
    let cpu = cpu_since(pw, cpu0)?;
    let n = events.load(Ordering::Relaxed) - ev0;
    Ok(TargetResult {
        target: target.name.clone(),
        scenario: "watch-events".into(),
        seconds,
        watches: Some(args.watches),
        events: Some(n),
        p50_us: (n > 0).then(|| hist.value_at_quantile(0.5) as f64),
        p99_us: (n > 0).then(|| hist.value_at_quantile(0.99) as f64),
        cpu_us_per_event: cpu.filter(|_| n > 0).map(|c| c * 1e6 / n as f64),
        ..Default::default()
    })
}

/// `watch-latency`: the latency a target adds to one watch event, measured on paired streams.
/// W pairs of watches start at the same resourceVersion, one through the target and one on the
/// reference (the member, direct); every event's arrival on the two streams of a pair is
/// compared, so the member's own fan-out delay, the same on both, drops out. Run with the
/// reference as the target too, it measures the method's floor (two direct streams read by the
/// same driver thread).
pub async fn watch_latency(
    args: &RunArgs,
    target: &Target,
    reference: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let rv = current_rv(reference, &args.path).await?;
    let watch_path = with_query(&args.path, &format!("watch=1&resourceVersion={rv}"));
    // Opened pair by pair, so a member that writes to its watchers in the order they came
    // favours neither side of a pair over the other pairs' streams.
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..args.watches {
        through.extend(open_watches(target, &watch_path, 1).await?);
        direct.extend(open_watches(reference, &watch_path, 1).await?);
    }

    let deadline = Instant::now() + args.warmup + args.duration;
    let measure_from = Instant::now() + args.warmup;
    let arrivals = |watches: Vec<(HttpConn, super::client::Head)>| {
        watches
            .into_iter()
            .map(|(conn, head)| {
                tokio::spawn(async move {
                    let mut seen = std::collections::HashMap::new();
                    read_events(conn, head, deadline, |sent, arrived, _| {
                        if arrived >= measure_from {
                            seen.insert(sent, arrived);
                        }
                    })
                    .await;
                    seen
                })
            })
            .collect::<Vec<_>>()
    };
    let (through, direct) = (arrivals(through), arrivals(direct));
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = cpu_now(pw)?;
    let start = Instant::now();
    let mut added = Vec::new();
    let mut missed = 0u64;
    for (t, d) in through.into_iter().zip(direct) {
        let (t, d) = (t.await?, d.await?);
        for (sent, at) in &t {
            match d.get(sent) {
                Some(direct_at) => added.push(signed_micros(*at, *direct_at)),
                None => missed += 1,
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_since(pw, cpu0)?;
    added.sort_by(f64::total_cmp);
    let n = added.len() as u64;
    Ok(TargetResult {
        target: target.name.clone(),
        scenario: "watch-latency".into(),
        seconds,
        watches: Some(args.watches),
        events: Some(n),
        // Events seen on one stream of a pair only (the measure's edges).
        errors: missed,
        p50_us: quantile(&added, 0.5),
        p99_us: quantile(&added, 0.99),
        cpu_us_per_event: cpu.filter(|_| n > 0).map(|c| c * 1e6 / n as f64),
        ..Default::default()
    })
}

/// `at - reference` in microseconds, negative when the target's stream was read first.
fn signed_micros(at: Instant, reference: Instant) -> f64 {
    if at >= reference {
        (at - reference).as_secs_f64() * 1e6
    } else {
        -((reference - at).as_secs_f64() * 1e6)
    }
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::{quantile, sent_at_nanos};

    #[test]
    fn nearest_rank_quantiles() {
        let v = [-3.0, 1.0, 2.0, 4.0, 100.0];
        assert_eq!(quantile(&v, 0.5), Some(2.0));
        assert_eq!(quantile(&v, 0.99), Some(100.0));
        assert_eq!(quantile(&v, 0.0), Some(-3.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn finds_the_send_stamp() {
        let ev = br#"{"type":"MODIFIED","object":{"metadata":{"annotations":{"fleetgate.io/sent-at":"1790000000123456789"}}}}"#;
        assert_eq!(sent_at_nanos(ev), Some(1_790_000_000_123_456_789));
        assert_eq!(sent_at_nanos(br#"{"type":"BOOKMARK"}"#), None);
    }
}
