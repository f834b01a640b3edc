//! `watch-fanout` (issue 15 item 7): many client watches of a few collections, as a fleet of
//! controllers makes them, through one target (a gateway or a peer proxy), with churn.
//!
//! `--watches` client watches are spread evenly over 10 resources (the [`RESOURCES`] the
//! simulated member serves) on every member the target stands for (`NAME=kubeconfig:PATH:PREFIX*`,
//! one context per member, in the same order as `--members`). Each watch is cluster-wide, started
//! at the collection's current resourceVersion. Then, for the warm-up and the measured phase:
//!
//! - the driver writes to the members direct (`--members`) at `--churn` writes per second in all,
//!   round robin over (member, resource): mostly merge patches of one object per collection,
//!   every fourth a create of a new one (pods excepted: a pod's creation also writes Events
//!   without a stamp), each stamped with `fleetgate.io/sent-at` when it is sent;
//! - `--reopen-per-sec` client watches a second close and open again from the last
//!   resourceVersion they saw, as an informer resumes.
//!
//! Reported: the watches the members hold for those resources (each member's `/metrics`, read
//! near the end of the measured phase), the stamped events delivered in the measured phase, the
//! target's CPU per delivered event, the write-to-delivery latency p50/p99 of the events written
//! after the stream that got them opened, and the target's resident memory growth per client
//! watch (after opening them and the warm-up, against before). Bounded by `--warmup` +
//! `--duration`; the opening of the watches is bounded by their count.
//!
//! Each watch is its own HTTP/1.1 connection, or with `--h2-watches N` a stream of an h2
//! connection that carries N watches of one member, each of another resource (as a controller's
//! informers share its connection): watch w of a member goes on connection w / N, of resource
//! w mod 10.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::Notify;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::client::{Head, HttpConn, Target};
use super::h2load::{build_request, connect_h2};
use super::procstat::ProcWatch;
use super::scenarios::{
    cpu_now, cpu_since, current_rv, open_watches, read_events, split_lines, stamped, unix_nanos,
    with_query, Latencies,
};
use super::{RunArgs, TargetResult};

/// The 10 watched resources: API prefix and plural. All served by the simulated member.
pub const RESOURCES: [(&str, &str); 10] = [
    ("/api/v1", "configmaps"),
    ("/api/v1", "secrets"),
    ("/api/v1", "services"),
    ("/api/v1", "serviceaccounts"),
    ("/api/v1", "events"),
    ("/api/v1", "pods"),
    ("/apis/apps/v1", "deployments"),
    ("/apis/apps/v1", "replicasets"),
    ("/apis/apps/v1", "statefulsets"),
    ("/apis/apps/v1", "daemonsets"),
];

/// The namespace the churn writes in.
const NAMESPACE: &str = "default";
/// The object of each collection the churn patches.
const PATCHED: &str = "fanout-0";
/// Failed reopens a watch tolerates before it gives up for the run.
const MAX_REOPEN_FAILURES: u32 = 10;

/// A new object of `plural` named `name`, stamped with `stamp` (unix nanoseconds).
fn object(plural: &str, name: &str, stamp: u128) -> Value {
    let meta = json!({"name": name, "namespace": NAMESPACE,
        "annotations": {"fleetgate.io/sent-at": stamp.to_string()}});
    let pod_spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
    let workload = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
    });
    let (api, kind, rest) = match plural {
        "configmaps" => ("v1", "ConfigMap", json!({"data": {"k": "v"}})),
        "secrets" => ("v1", "Secret", json!({"type": "Opaque"})),
        "services" => ("v1", "Service", json!({"spec": {"ports": [{"port": 80}]}})),
        "serviceaccounts" => ("v1", "ServiceAccount", json!({})),
        "events" => (
            "v1",
            "Event",
            json!({"involvedObject": {"kind": "ConfigMap", "namespace": NAMESPACE, "name": PATCHED},
                   "reason": "Fanout", "message": "watch-fanout churn", "type": "Normal"}),
        ),
        "pods" => ("v1", "Pod", json!({ "spec": pod_spec })),
        "deployments" => ("apps/v1", "Deployment", json!({ "spec": workload })),
        "replicasets" => ("apps/v1", "ReplicaSet", json!({ "spec": workload })),
        "statefulsets" => {
            let mut spec = workload.clone();
            spec["serviceName"] = json!(name);
            ("apps/v1", "StatefulSet", json!({ "spec": spec }))
        }
        _ => ("apps/v1", "DaemonSet", json!({ "spec": workload })),
    };
    let mut o = rest;
    o["apiVersion"] = json!(api);
    o["kind"] = json!(kind);
    o["metadata"] = meta;
    o
}

/// The bytes of a request with a JSON body.
pub(super) fn body_request(
    target: &Target,
    method: &str,
    path: &str,
    ctype: &str,
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fleetgate-loadtest/0.1\r\n\
         Accept: application/json\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n",
        target.path_prefix,
        target.authority,
        body.len()
    );
    for (name, value) in &target.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// One connection to a member for the churn's writes, reconnected when the member closes it.
struct Writer {
    target: Target,
    conn: Option<HttpConn>,
}

impl Writer {
    /// Sends one request and reads its answer: the status.
    async fn send(&mut self, request: &[u8]) -> anyhow::Result<u16> {
        if self.conn.is_none() {
            self.conn = Some(HttpConn::new(self.target.connect().await?));
        }
        let conn = self.conn.as_mut().expect("connected above");
        let outcome = async {
            let head = conn.send(request).await?;
            conn.read_body(&head, |_| {}).await?;
            Ok::<_, anyhow::Error>(head)
        }
        .await;
        match outcome {
            Ok(head) => {
                if head.close {
                    self.conn = None;
                }
                Ok(head.status)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    /// Creates `name` in `plural` (with `existing_ok`, a 409 is fine: it is there from an
    /// earlier target).
    async fn create(&mut self, res: usize, name: &str, existing_ok: bool) -> anyhow::Result<()> {
        let (prefix, plural) = RESOURCES[res];
        let body = serde_json::to_vec(&object(plural, name, unix_nanos()))?;
        let path = format!("{prefix}/namespaces/{NAMESPACE}/{plural}");
        let req = body_request(&self.target, "POST", &path, "application/json", &body);
        match self.send(&req).await? {
            200..=299 => Ok(()),
            409 if existing_ok => Ok(()),
            s => bail!(
                "{}: creating {plural}/{name} answered {s}",
                self.target.name
            ),
        }
    }

    /// Stamps the patched object of `plural` with the time now.
    async fn patch(&mut self, res: usize) -> anyhow::Result<()> {
        let (prefix, plural) = RESOURCES[res];
        let body = serde_json::to_vec(
            &json!({"metadata": {"annotations": {"fleetgate.io/sent-at": unix_nanos().to_string()}}}),
        )?;
        let path = format!("{prefix}/namespaces/{NAMESPACE}/{plural}/{PATCHED}");
        let req = body_request(
            &self.target,
            "PATCH",
            &path,
            "application/merge-patch+json",
            &body,
        );
        match self.send(&req).await? {
            200..=299 => Ok(()),
            s => bail!(
                "{}: patching {plural}/{PATCHED} answered {s}",
                self.target.name
            ),
        }
    }
}

/// The watches a member holds now for each of [`RESOURCES`], summed (its `/metrics`).
async fn member_watches(member: &Target) -> anyhow::Result<u64> {
    let (status, text) = member.metrics_text().await?;
    if status != 200 {
        bail!("{}: /metrics answered {}", member.name, status);
    }
    Ok(sum_open_watches(&text))
}

/// The sum of `fleetgate_sim_open_watches{resource="R"}` over the resources of [`RESOURCES`].
fn sum_open_watches(text: &str) -> u64 {
    RESOURCES
        .iter()
        .filter_map(|(_, plural)| {
            let series = format!("fleetgate_sim_open_watches{{resource=\"{plural}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The object's resourceVersion in one watch event line: the first one after the first
/// `"metadata":{` (the object's own; nested objects come after it or carry none).
pub(super) fn event_rv(line: &[u8]) -> Option<u64> {
    const META: &[u8] = b"\"metadata\":{";
    const KEY: &[u8] = b"\"resourceVersion\":\"";
    let m = line.windows(META.len()).position(|w| w == META)?;
    let rest = &line[m..];
    let at = rest.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = &rest[at..];
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// One watched collection on one member, through the target.
#[derive(Clone)]
struct Key {
    through: Target,
    collection: String,
    rv: String,
}

/// How a client watch reaches its target.
#[derive(Clone)]
enum Via {
    /// Each watch its own HTTP/1.1 connection.
    H1,
    /// A stream of an h2 connection that other watches share.
    H2(h2::client::SendRequest<Bytes>),
}

/// One open watch stream, its response head read.
enum Stream {
    H1(HttpConn, Head),
    H2(h2::RecvStream),
}

impl Via {
    /// Opens a watch of `key`'s collection from resourceVersion `rv`.
    async fn open(&self, key: &Key, rv: &str) -> anyhow::Result<Stream> {
        let path = with_query(&key.collection, &format!("watch=1&resourceVersion={rv}"));
        match self {
            Via::H1 => {
                let (conn, head) = open_watches(&key.through, &path, 1)
                    .await?
                    .pop()
                    .context("no watch opened")?;
                Ok(Stream::H1(conn, head))
            }
            Via::H2(send) => {
                let request = build_request(&key.through, &path)?;
                let mut send = send.clone().ready().await?;
                let (response, _) = send.send_request(request, true)?;
                let response = response.await?;
                if response.status() != 200 {
                    bail!("watch answered {}", response.status());
                }
                Ok(Stream::H2(response.into_body()))
            }
        }
    }
}

impl Stream {
    /// Reads the stream until `deadline`, as [`read_events`] does.
    async fn read(self, deadline: Instant, mut on_event: impl FnMut(u128, Instant, &[u8])) {
        match self {
            Stream::H1(conn, head) => read_events(conn, head, deadline, on_event).await,
            Stream::H2(mut body) => {
                let read = async {
                    let mut line = Vec::with_capacity(4096);
                    let mut on_line = stamped(&mut on_event);
                    while let Some(Ok(data)) = body.data().await {
                        let _ = body.flow_control().release_capacity(data.len());
                        split_lines(&mut line, &data, Instant::now(), &mut on_line);
                    }
                };
                let _ = tokio::time::timeout_at(deadline.into(), read).await;
            }
        }
    }
}

/// Opens `watches` client watches over h2, `per_conn` on each connection (see the module's
/// documentation); the watches, and the tasks that drive their connections.
async fn open_h2(
    keys: &[Key],
    members: usize,
    watches: usize,
    per_conn: usize,
) -> anyhow::Result<(Vec<(Key, Via, Stream)>, Vec<JoinHandle<()>>)> {
    if per_conn == 0 || per_conn > RESOURCES.len() {
        bail!(
            "--h2-watches {per_conn}: from 1 to {} (one watch per resource on a connection)",
            RESOURCES.len()
        );
    }
    let gate = Arc::new(Semaphore::new(256));
    let mut tasks = Vec::new();
    for m in 0..members {
        let per_member = watches / members + usize::from(m < watches % members);
        for first in (0..per_member).step_by(per_conn) {
            let mine: Vec<Key> = (first..(first + per_conn).min(per_member))
                .map(|w| keys[m * RESOURCES.len() + w % RESOURCES.len()].clone())
                .collect();
            let gate = gate.clone();
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await?;
                let conn = connect_h2(&mine[0].through.offering_h2()).await?;
                let via = Via::H2(conn.send.clone());
                let mut out = Vec::with_capacity(mine.len());
                for key in mine {
                    let stream = via.open(&key, &key.rv).await?;
                    out.push((key, via.clone(), stream));
                }
                Ok::<_, anyhow::Error>((out, conn.driver))
            }));
        }
    }
    let (mut opened, mut drivers) = (Vec::with_capacity(watches), Vec::new());
    for t in tasks {
        let (watches, driver) = t.await.context("h2 watch task")??;
        opened.extend(watches);
        drivers.push(driver);
    }
    Ok((opened, drivers))
}

/// What one client watch saw.
struct WatchOutcome {
    reopens: u64,
    failures: u64,
}

/// Shared by every client watch of one run.
struct Shared {
    events: AtomicU64,
    deadline: Instant,
    measure_from: Instant,
    /// Write-to-delivery latencies of every client watch.
    latency: Latencies,
}

/// Reads one client watch until the deadline, opening it again from the last resourceVersion it
/// saw when `cycle` says so or when the stream ends early.
async fn client_watch(
    key: Key,
    via: Via,
    first: Stream,
    cycle: Arc<Notify>,
    shared: Arc<Shared>,
) -> WatchOutcome {
    let mut out = WatchOutcome {
        reopens: 0,
        failures: 0,
    };
    let mut rv: u64 = key.rv.parse().unwrap_or(0);
    let mut stream = first;
    let mut failed = 0;
    loop {
        let opened_at = unix_nanos();
        let rv_seen = &mut rv;
        tokio::select! {
            _ = stream.read(shared.deadline, |sent, arrived, line| {
                if let Some(r) = event_rv(line) {
                    *rv_seen = (*rv_seen).max(r);
                }
                if arrived >= shared.measure_from {
                    shared.events.fetch_add(1, Ordering::Relaxed);
                    // Events written before this stream opened (resumed after a reopen) waited
                    // for the client, not for the target: no latency for them.
                    if sent >= opened_at {
                        shared.latency.record_since(sent);
                    }
                }
            }) => {}
            _ = cycle.notified() => {}
        }
        loop {
            if Instant::now() >= shared.deadline {
                return out;
            }
            match via.open(&key, &rv.to_string()).await {
                Ok(opened) => {
                    stream = opened;
                    out.reopens += 1;
                    break;
                }
                Err(_) => {
                    out.failures += 1;
                    failed += 1;
                    if failed >= MAX_REOPEN_FAILURES {
                        return out;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The churn: `per_second` writes in all on the members, round robin over (member, resource),
/// until `deadline`. Returns the writes done and failed.
async fn churn(members: Vec<Target>, per_second: f64, deadline: Instant) -> (u64, u64) {
    let mut writers: Vec<Writer> = members
        .into_iter()
        .map(|target| Writer { target, conn: None })
        .collect();
    if per_second <= 0.0 || writers.is_empty() {
        return (0, 0);
    }
    let keys = writers.len() * RESOURCES.len();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut done, mut failed) = (0u64, 0u64);
    let mut n = 0u64;
    // Created names are new in each run (several targets write to the same members).
    let run = unix_nanos() / 1_000_000 % 1_000_000_000;
    while Instant::now() < deadline {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * per_second) as u64;
        while n < due && Instant::now() < deadline {
            let key = (n as usize) % keys;
            let (member, res) = (key % writers.len(), key / writers.len());
            let writer = &mut writers[member];
            // Every fourth round over the keys creates instead of patching.
            let create = (n / keys as u64) % 4 == 3 && RESOURCES[res].1 != "pods";
            let outcome = if create {
                writer
                    .create(res, &format!("fanout-{run}-{n}"), false)
                    .await
            } else {
                writer.patch(res).await
            };
            match outcome {
                Ok(()) => done += 1,
                Err(e) => {
                    failed += 1;
                    tracing::debug!(error = %e, "churn write failed");
                }
            }
            n += 1;
        }
    }
    (done, failed)
}

/// `watch-fanout` against one target standing for `through` (one per member, in the order of
/// `members`, the members direct).
pub async fn watch_fanout(
    args: &RunArgs,
    name: &str,
    through: &[Target],
    members: &[Target],
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    if through.len() != members.len() {
        bail!(
            "{name} stands for {} members, --members for {}: they must be the same, in order",
            through.len(),
            members.len()
        );
    }
    // The object each collection's churn patches, on every member (there already after the
    // first target).
    for member in members {
        let mut writer = Writer {
            target: member.clone(),
            conn: None,
        };
        for res in 0..RESOURCES.len() {
            writer.create(res, PATCHED, true).await?;
        }
    }
    let before: Vec<u64> = futures_util::future::try_join_all(members.iter().map(member_watches))
        .await
        .context("reading the members' /metrics (--members must be their admin)")?;

    // Every collection's current resourceVersion, through the target.
    let mut keys = Vec::new();
    for t in through {
        for (prefix, plural) in RESOURCES {
            let collection = format!("{prefix}/{plural}");
            let rv = current_rv(t, &collection)
                .await
                .with_context(|| format!("{}: listing {collection}", t.name))?;
            keys.push(Key {
                through: t.clone(),
                collection,
                rv,
            });
        }
    }
    let rss_base = pw.map(|p| p.rss()).transpose()?;
    let mut opened = Vec::with_capacity(args.watches);
    let mut drivers = Vec::new();
    if args.h2_watches > 0 {
        (opened, drivers) = open_h2(&keys, through.len(), args.watches, args.h2_watches)
            .await
            .with_context(|| format!("{name}: opening {} watches over h2", args.watches))?;
    } else {
        for (i, key) in keys.iter().enumerate() {
            let n = args.watches / keys.len() + usize::from(i < args.watches % keys.len());
            let path = with_query(
                &key.collection,
                &format!("watch=1&resourceVersion={}", key.rv),
            );
            for (conn, head) in open_watches(&key.through, &path, n)
                .await
                .with_context(|| format!("{name}: opening {n} watches of {}", key.collection))?
            {
                opened.push((key.clone(), Via::H1, Stream::H1(conn, head)));
            }
        }
    }
    let watches = opened.len();

    let start = Instant::now();
    let shared = Arc::new(Shared {
        events: AtomicU64::new(0),
        deadline: start + args.warmup + args.duration,
        measure_from: start + args.warmup,
        latency: Latencies::new(),
    });
    let churn_task = tokio::spawn(churn(members.to_vec(), args.churn, shared.deadline));
    let mut cycles = Vec::with_capacity(watches);
    let mut tasks = Vec::with_capacity(watches);
    for (key, via, first) in opened {
        let cycle = Arc::new(Notify::new());
        cycles.push(cycle.clone());
        tasks.push(tokio::spawn(client_watch(
            key,
            via,
            first,
            cycle,
            shared.clone(),
        )));
    }
    // Closes `--reopen-per-sec` random watches a second (each opens again at once).
    let reopen_per_sec = args.reopen_per_sec;
    let cycler = tokio::spawn(async move {
        if reopen_per_sec <= 0.0 || cycles.is_empty() {
            return;
        }
        let started = Instant::now();
        let mut sent = 0u64;
        let mut ticker = tokio::time::interval(Duration::from_millis(50));
        loop {
            ticker.tick().await;
            let due = (started.elapsed().as_secs_f64() * reopen_per_sec) as u64;
            while sent < due {
                let i = rand::rng().random_range(0..cycles.len());
                cycles[i].notify_one();
                sent += 1;
            }
        }
    });

    tokio::time::sleep_until(shared.measure_from.into()).await;
    let rss_held = pw.map(|p| p.rss()).transpose()?;
    let cpu0 = cpu_now(pw)?;
    let ev0 = shared.events.load(Ordering::Relaxed);
    let measured = Instant::now();
    // The members' watches near the end of the measured phase, while every client watch is open.
    let tail = (args.duration / 10).min(Duration::from_secs(1));
    tokio::time::sleep_until((shared.deadline - tail).into()).await;
    let during: Vec<u64> = futures_util::future::try_join_all(members.iter().map(member_watches))
        .await
        .context("reading the members' /metrics")?;
    let (mut reopens, mut failures) = (0u64, 0u64);
    for t in tasks {
        if let Ok(w) = t.await {
            reopens += w.reopens;
            failures += w.failures;
        }
    }
    let seconds = measured.elapsed().as_secs_f64();
    let hist = shared.latency.snapshot();
    let cpu = cpu_since(pw, cpu0)?;
    cycler.abort();
    for driver in drivers {
        driver.abort();
    }
    let (writes, write_failures) = churn_task.await.unwrap_or((0, 0));
    let n = shared.events.load(Ordering::Relaxed) - ev0;
    let per_member = |counts: &[u64]| -> BTreeMap<String, u64> {
        members
            .iter()
            .map(|m| m.name.clone())
            .zip(counts.iter().copied())
            .collect()
    };
    Ok(TargetResult {
        target: name.to_owned(),
        scenario: "watch-fanout".into(),
        // The churn's writes, and the writes and reopens that failed.
        requests: writes,
        errors: write_failures + failures,
        seconds,
        watches: Some(watches),
        events: Some(n),
        p50_us: (!hist.is_empty()).then(|| hist.value_at_quantile(0.5) as f64),
        p99_us: (!hist.is_empty()).then(|| hist.value_at_quantile(0.99) as f64),
        cpu_us_per_event: cpu.filter(|_| n > 0).map(|c| c * 1e6 / n as f64),
        rss_base_kib: rss_base.map(|b| b as f64 / 1024.0),
        rss_peak_kib: rss_held.map(|h| h as f64 / 1024.0),
        kib_per_watch: rss_base
            .zip(rss_held)
            .filter(|_| watches > 0)
            .map(|(b, h)| (h as f64 - b as f64) / 1024.0 / watches as f64),
        member_watches: Some(per_member(&during)),
        member_watches_before: Some(per_member(&before)),
        reopens: Some(reopens),
        streams: (args.h2_watches > 0).then_some(args.h2_watches),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::{event_rv, object, sum_open_watches, RESOURCES};

    #[test]
    fn reads_the_objects_resource_version() {
        let line = br#"{"type":"MODIFIED","object":{"apiVersion":"v1","involvedObject":{"resourceVersion":"3"},"kind":"Event","metadata":{"annotations":{"fleetgate.io/sent-at":"17"},"name":"x","resourceVersion":"1234"}}}"#;
        assert_eq!(event_rv(line), Some(1234));
        assert_eq!(event_rv(br#"{"type":"BOOKMARK"}"#), None);
    }

    #[test]
    fn sums_the_watched_resources_only() {
        let text = "# TYPE fleetgate_sim_open_watches gauge\n\
                    fleetgate_sim_open_watches{resource=\"configmaps\"} 2\n\
                    fleetgate_sim_open_watches{resource=\"nodes\"} 7\n\
                    fleetgate_sim_open_watches{resource=\"deployments\"} 1\n";
        assert_eq!(sum_open_watches(text), 3);
    }

    #[test]
    fn every_resource_has_a_stamped_object() {
        for (_, plural) in RESOURCES {
            let o = object(plural, "n", 42);
            assert_eq!(o["metadata"]["annotations"]["fleetgate.io/sent-at"], "42");
            assert!(o["kind"].is_string(), "{plural}");
        }
    }
}
