//! Gateway metrics: requests by cluster, verb and code, request latency (to the response head),
//! how long long-running streams lasted, open watches, member reachability and failures by kind,
//! the fleet view's requests, open streams, upgraded streams, client connections and upstream
//! connections, encoded as OpenMetrics text for the admin listener's `/metrics` (with the
//! process's own metrics, `observe::process`).
//!
//! Shared nothing on the hot path: every shard counts into cells of its own ([`ShardMetrics`]),
//! which only that shard writes (relaxed atomics on cache lines no other core touches), and a
//! scrape sums the cells of every shard. A shard looks a request's cell up in a map of its own;
//! the shard's list of cells is locked only when a label set is seen for the first time on that
//! shard, and by the scrape. The few process-wide counters (the audit log's, h2 connections
//! calmed, a member's reachability and failures) are rare events: a member's reachability is
//! written only when it changes, failures only when a member fails. Stations with counters of
//! their own register a collector here (`spec.fairness`'s: `admit::metrics`). The cache's memory
//! ([`CACHE_MEMORY`]) is process-wide: the budget is the gateway's, so each cached hub adds its
//! events' bytes to it as they come and go (`watch::hub::memory`), a relaxed add per event of a
//! cached resource. Called by the front-ends, the exchange, `server::shard`, `upstream` and
//! `watch::hub`; encoded by `server::admin`.

// The one lock of the crate (see clippy.toml): taken by a shard only for a label set's first use,
// and by the scrape; never per request.
#![allow(clippy::disallowed_types)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use fleetgate_config_watcher::ClusterRoute;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::errors::{GatewayError, Side};

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    cluster: Arc<str>,
    verb: &'static str,
    code: u16,
}

/// Labels of the latency and stream-duration histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    cluster: Arc<str>,
    verb: &'static str,
}

/// Labels of the per-cluster gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: Arc<str>,
}

/// Labels of the member failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    cluster: Arc<str>,
    kind: &'static str,
}

/// Labels of the cache's LIST counter: where a LIST of a cached resource was answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServedLabels {
    served: &'static str,
}

/// Labels of the cache's drop counter: why a cached resource was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Labels of the fleet view's request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FleetLabels {
    verb: &'static str,
    code: u16,
}

/// Histogram buckets: the first bound doubling 17 times, then +Inf.
const BUCKETS: usize = 18;
/// Request latency: 0.5 ms to about 65 s.
const FIRST_LATENCY_US: u64 = 500;
/// How long a long-running stream lasted: 1 s to about 36 h.
const FIRST_STREAM_US: u64 = 1_000_000;

/// The upper bound (seconds) of bucket `i` of a histogram whose first bound is `first_us`.
fn bucket_bound(i: usize, first_us: u64) -> f64 {
    if i >= BUCKETS {
        return f64::INFINITY;
    }
    first_us as f64 * 1e-6 * (1u64 << i) as f64
}

/// The bucket `micros` falls in (`BUCKETS` is +Inf) of a histogram whose first bound is
/// `first_us`.
fn bucket_of(micros: u64, first_us: u64) -> usize {
    let q = micros.div_ceil(first_us);
    if q <= 1 {
        return 0;
    }
    ((64 - (q - 1).leading_zeros()) as usize).min(BUCKETS)
}

/// Microseconds, saturated.
fn micros(elapsed: Duration) -> u64 {
    elapsed.as_micros().min(u128::from(u64::MAX)) as u64
}

/// A histogram's cells on one shard, buckets doubling from `FIRST_US` microseconds.
#[derive(Default)]
struct Histogram<const FIRST_US: u64> {
    count: AtomicU64,
    sum_micros: AtomicU64,
    buckets: [AtomicU64; BUCKETS + 1],
}

impl<const FIRST_US: u64> Histogram<FIRST_US> {
    fn observe(&self, micros: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.buckets[bucket_of(micros, FIRST_US)].fetch_add(1, Ordering::Relaxed);
    }
}

/// A histogram summed over shards, for the scrape.
#[derive(Clone, Copy, Default)]
struct HistogramSum {
    count: u64,
    sum_micros: u64,
    buckets: [u64; BUCKETS + 1],
}

impl HistogramSum {
    fn add<const FIRST_US: u64>(&mut self, cells: &Histogram<FIRST_US>) {
        self.count += cells.count.load(Ordering::Relaxed);
        self.sum_micros += cells.sum_micros.load(Ordering::Relaxed);
        for (total, bucket) in self.buckets.iter_mut().zip(&cells.buckets) {
            *total += bucket.load(Ordering::Relaxed);
        }
    }

    /// The sum as a histogram whose first bound is `first_us`, to encode.
    fn bounded(&self, first_us: u64) -> HistogramOf<'_> {
        HistogramOf {
            sum: self,
            first_us,
        }
    }
}

/// A [`HistogramSum`] with its bounds, encoded as an OpenMetrics histogram.
struct HistogramOf<'a> {
    sum: &'a HistogramSum,
    first_us: u64,
}

impl EncodeMetric for HistogramOf<'_> {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .sum
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| (bucket_bound(i, self.first_us), *n))
            .collect();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.sum.sum_micros as f64 * 1e-6,
            self.sum.count,
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Writes one family: its descriptor (`name`, `help`, `kind`), then a metric per label set.
pub(super) fn encode_family<'l, L, M>(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, kind): (&str, &str, MetricType),
    series: impl IntoIterator<Item = (&'l L, M)>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + 'l,
    M: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// Whether a request of `verb` is timed in `fleetgate_request_duration_seconds`: a watch's and an
/// upgraded session's time says how long the client stayed, not how fast it was answered
/// (kube-apiserver's `apiserver_request_duration_seconds` leaves WATCH and CONNECT out too).
fn timed(verb: &str) -> bool {
    !matches!(verb, "watch" | "connect")
}

/// One (cluster, verb, code) of one shard: its count, latencies, and its long-running streams.
struct RequestCell {
    cluster: Arc<str>,
    verb: &'static str,
    code: u16,
    count: AtomicU64,
    latency: Histogram<FIRST_LATENCY_US>,
    /// Long-running exchanges with members of this label set open now.
    open: AtomicI64,
    /// How long the ended ones lasted.
    streams: Histogram<FIRST_STREAM_US>,
    /// The cluster's process-wide reachability, marked by every answer.
    state: Arc<ClusterState>,
}

/// Why a member could not be reached or did not answer: `fleetgate_upstream_failures_total`'s
/// `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The member (or its egress proxy) refused the connection.
    Refused,
    /// The TLS handshake failed (the member's certificate, or its protocol).
    Tls,
    /// Connecting, or the response head, took longer than allowed.
    Timeout,
    /// The member closed or reset the connection before answering.
    Reset,
    /// Anything else: a name that does not resolve, an invalid response, no agent tunnel.
    Other,
}

impl FailureKind {
    const ALL: [FailureKind; 5] = [
        FailureKind::Refused,
        FailureKind::Tls,
        FailureKind::Timeout,
        FailureKind::Reset,
        FailureKind::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Refused => "refused",
            FailureKind::Tls => "tls",
            FailureKind::Timeout => "timeout",
            FailureKind::Reset => "reset",
            FailureKind::Other => "other",
        }
    }

    /// The kind of a member failure; None for an error that is not the member's (the client's,
    /// or the gateway's own descriptor budget) and for a refusal of an open circuit breaker (the
    /// member was not asked: `fleetgate_member_circuit_*` count those).
    pub fn of(error: &GatewayError) -> Option<FailureKind> {
        if error.side() != Side::Upstream || matches!(error, GatewayError::CircuitOpen { .. }) {
            return None;
        }
        Some(match error {
            GatewayError::ConnectTimeout { .. } | GatewayError::ResponseHeadTimeout { .. } => {
                FailureKind::Timeout
            }
            GatewayError::UpstreamClosed { .. } => FailureKind::Reset,
            GatewayError::Connect { source, .. } => FailureKind::of_io(source),
            _ => FailureKind::Other,
        })
    }

    /// The kind of a failed dial (TCP, the egress proxy's CONNECT, TLS).
    fn of_io(error: &std::io::Error) -> FailureKind {
        use std::io::ErrorKind;
        // tokio-rustls hands a failed handshake back as the rustls error inside an io::Error.
        if error
            .get_ref()
            .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return FailureKind::Tls;
        }
        match error.kind() {
            ErrorKind::ConnectionRefused => FailureKind::Refused,
            ErrorKind::TimedOut => FailureKind::Timeout,
            ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof => FailureKind::Reset,
            _ => FailureKind::Other,
        }
    }
}

/// A member cluster's reachability and failures, one for the process (by cluster name), written
/// by whichever shard dialed or asked it.
#[derive(Debug)]
struct ClusterState {
    name: Arc<str>,
    /// 1: the last dial or request reached it; 0: the last one failed; -1: not asked yet.
    reachable: AtomicI64,
    failures: [AtomicU64; FailureKind::ALL.len()],
}

impl ClusterState {
    /// Marks the member reachable (or not): a store only when it changes, so the line stays
    /// shared between the cores that read it.
    fn mark(&self, reachable: bool) {
        let value = i64::from(reachable);
        if self.reachable.load(Ordering::Relaxed) != value {
            self.reachable.store(value, Ordering::Relaxed);
        }
    }

    fn failed(&self, kind: FailureKind) {
        self.failures[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.mark(false);
    }
}

/// Every member cluster's [`ClusterState`], by name: a new name is added under the lock (a
/// shard's first dial or answer of that cluster, once per route id).
#[derive(Debug, Default)]
struct ClusterStates(Mutex<Vec<Arc<ClusterState>>>);

impl ClusterStates {
    fn of(&self, name: &Arc<str>) -> Arc<ClusterState> {
        let mut states = lock(&self.0);
        if let Some(state) = states.iter().find(|s| s.name == *name) {
            return state.clone();
        }
        let state = Arc::new(ClusterState {
            name: name.clone(),
            reachable: AtomicI64::new(-1),
            failures: Default::default(),
        });
        states.push(state.clone());
        state
    }
}

impl Collector for ClusterStates {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let states: Vec<Arc<ClusterState>> = lock(&self.0).clone();
        let reachable: Vec<(ClusterLabels, i64)> = states
            .iter()
            .map(|state| {
                let labels = ClusterLabels {
                    cluster: state.name.clone(),
                };
                (labels, state.reachable.load(Ordering::Relaxed))
            })
            .filter(|(_, reachable)| *reachable >= 0)
            .collect();
        encode_family(
            &mut encoder,
            (
                "cluster_reachable",
                "Whether the gateway's last dial of or request to the member cluster reached it (1) or failed (0); absent until the gateway first asks it",
                MetricType::Gauge,
            ),
            reachable.iter().map(|(l, v)| (l, ConstGauge::new(*v))),
        )?;
        let failures: Vec<(FailureLabels, u64)> = states
            .iter()
            .flat_map(|state| {
                FailureKind::ALL.into_iter().map(|kind| {
                    let labels = FailureLabels {
                        cluster: state.name.clone(),
                        kind: kind.label(),
                    };
                    (
                        labels,
                        state.failures[kind as usize].load(Ordering::Relaxed),
                    )
                })
            })
            .collect();
        encode_family(
            &mut encoder,
            (
                "upstream_failures",
                "Dials of and requests to member clusters that failed before the member answered, by cluster and kind (refused, tls, timeout, reset, other)",
                MetricType::Counter,
            ),
            failures.iter().map(|(l, n)| (l, ConstCounter::new(*n))),
        )
    }
}

/// The fleet view's requests of one (verb, code) on one shard.
struct FleetCell {
    verb: &'static str,
    code: u16,
    count: AtomicU64,
}

/// What one shard counts. Written only by its shard.
#[derive(Default)]
struct ShardCells {
    open_streams: AtomicI64,
    upgraded_streams: AtomicI64,
    client_connections: AtomicI64,
    /// Shared watches open (each holds one member watch) and client watches they serve.
    shared_watches: AtomicI64,
    shared_watch_clients: AtomicI64,
    shared_watch_feeds: AtomicI64,
    /// LISTs of cached resources answered from memory, and sent to the member.
    cache_lists_memory: AtomicU64,
    cache_lists_member: AtomicU64,
    /// Every request cell of the shard, for the scrape (appended on a label set's first use).
    requests: Mutex<Vec<Arc<RequestCell>>>,
    /// The fleet view's requests (appended on a label set's first use).
    fleet: Mutex<Vec<Arc<FleetCell>>>,
    /// Open upstream connections per cluster.
    upstream: Mutex<Vec<(Arc<str>, Arc<AtomicI64>)>>,
}

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    /// The process's own metrics (`process_*`, without the `fleetgate_` prefix).
    process: Registry,
    shards: Arc<ShardList>,
    clusters: Arc<ClusterStates>,
    h2_calmed: Counter,
    /// Shards down and restarted, and task panics caught (`server::supervise`).
    pub supervision: Arc<Supervision>,
    /// Audit events written / dropped because the writer was behind (the `audit` module).
    pub audit_events: Counter,
    pub audit_events_dropped: Counter,
}

/// The cells of every shard, summed by the scrape.
#[derive(Default)]
struct ShardList(Mutex<Vec<Arc<ShardCells>>>);

impl std::fmt::Debug for ShardList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardList")
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Metrics::with_collectors(Vec::new())
    }

    /// The registry with the stations' own collectors besides (admission's, `admit::metrics`),
    /// read at scrape time like the shards' cells.
    pub fn with_collectors(collectors: Vec<Box<dyn Collector>>) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("fleetgate");
        let shards = Arc::new(ShardList::default());
        let clusters = Arc::new(ClusterStates::default());
        let h2_calmed = Counter::default();
        let audit_events = Counter::default();
        let audit_events_dropped = Counter::default();
        registry.register(
            "audit_events",
            "Audit events written to the audit log",
            audit_events.clone(),
        );
        registry.register(
            "audit_events_dropped",
            "Audit events dropped because the audit writer was behind (the queue was full)",
            audit_events_dropped.clone(),
        );
        registry.register(
            "h2_connections_calmed",
            "h2 client connections closed with GOAWAY(ENHANCE_YOUR_CALM) for sending more control frames than their budget",
            h2_calmed.clone(),
        );
        registry.register_collector(Box::new(shards.clone()));
        registry.register_collector(Box::new(clusters.clone()));
        registry.register_collector(Box::new(super::process::BuildInfo));
        registry.register_collector(Box::new(CacheMemoryCollector));
        let supervision = Arc::new(Supervision::default());
        registry.register_collector(Box::new(supervision.clone()));
        for collector in collectors {
            registry.register_collector(collector);
        }
        let mut process = Registry::default();
        process.register_collector(Box::new(super::process::ProcessCollector));
        Arc::new(Metrics {
            registry,
            process,
            shards,
            clusters,
            h2_calmed,
            supervision,
            audit_events,
            audit_events_dropped,
        })
    }

    /// The cells of a new shard (called once per shard, as it starts).
    pub fn shard(&self) -> ShardMetrics {
        let cells = Arc::new(ShardCells::default());
        lock(&self.shards.0).push(cells.clone());
        ShardMetrics {
            cells,
            clusters: self.clusters.clone(),
            handles: RefCell::new(AHashMap::new()),
            states: RefCell::new(AHashMap::new()),
            fleet: RefCell::new(AHashMap::new()),
        }
    }

    /// Requests and streams in flight now, over every shard (for the drain's log lines).
    pub fn open_streams(&self) -> i64 {
        lock(&self.shards.0)
            .iter()
            .map(|s| s.open_streams.load(Ordering::Relaxed))
            .sum()
    }

    /// Counts an h2 connection closed for exceeding its control-frame budget.
    pub fn h2_connection_calmed(&self) {
        self.h2_calmed.inc();
    }

    /// The OpenMetrics text (ends with the one `# EOF`).
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode_registry(&mut out, &self.registry);
        let _ = text::encode_registry(&mut out, &self.process);
        let _ = text::encode_eof(&mut out);
        out
    }
}

/// A lock the scrape and a shard's first use of a label set share: never held across a request.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Collector for ShardList {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let shards: Vec<Arc<ShardCells>> = lock(&self.0).clone();
        let mut requests: AHashMap<RequestLabels, u64> = AHashMap::new();
        let mut latency: AHashMap<LatencyLabels, HistogramSum> = AHashMap::new();
        let mut streams: AHashMap<LatencyLabels, HistogramSum> = AHashMap::new();
        let mut watches: AHashMap<ClusterLabels, i64> = AHashMap::new();
        let mut fleet: AHashMap<FleetLabels, u64> = AHashMap::new();
        let mut upstream: AHashMap<ClusterLabels, i64> = AHashMap::new();
        let (mut open, mut upgraded, mut clients) = (0, 0, 0);
        let (mut shared, mut shared_clients, mut shared_feeds) = (0, 0, 0);
        let (mut from_memory, mut from_member) = (0, 0);
        for shard in &shards {
            from_memory += shard.cache_lists_memory.load(Ordering::Relaxed);
            from_member += shard.cache_lists_member.load(Ordering::Relaxed);
            shared += shard.shared_watches.load(Ordering::Relaxed);
            shared_clients += shard.shared_watch_clients.load(Ordering::Relaxed);
            shared_feeds += shard.shared_watch_feeds.load(Ordering::Relaxed);
            open += shard.open_streams.load(Ordering::Relaxed);
            upgraded += shard.upgraded_streams.load(Ordering::Relaxed);
            clients += shard.client_connections.load(Ordering::Relaxed);
            for cell in lock(&shard.requests).iter() {
                *requests
                    .entry(RequestLabels {
                        cluster: cell.cluster.clone(),
                        verb: cell.verb,
                        code: cell.code,
                    })
                    .or_default() += cell.count.load(Ordering::Relaxed);
                let labels = LatencyLabels {
                    cluster: cell.cluster.clone(),
                    verb: cell.verb,
                };
                if timed(cell.verb) && cell.latency.count.load(Ordering::Relaxed) > 0 {
                    latency
                        .entry(labels.clone())
                        .or_default()
                        .add(&cell.latency);
                }
                if cell.verb == "watch" {
                    *watches
                        .entry(ClusterLabels {
                            cluster: cell.cluster.clone(),
                        })
                        .or_default() += cell.open.load(Ordering::Relaxed);
                }
                if cell.streams.count.load(Ordering::Relaxed) > 0 {
                    streams.entry(labels).or_default().add(&cell.streams);
                }
            }
            for cell in lock(&shard.fleet).iter() {
                *fleet
                    .entry(FleetLabels {
                        verb: cell.verb,
                        code: cell.code,
                    })
                    .or_default() += cell.count.load(Ordering::Relaxed);
            }
            for (cluster, open) in lock(&shard.upstream).iter() {
                *upstream
                    .entry(ClusterLabels {
                        cluster: cluster.clone(),
                    })
                    .or_default() += open.load(Ordering::Relaxed);
            }
        }
        encode_family(
            &mut encoder,
            (
                "requests",
                "Requests answered for one member cluster (the fleet view's requests of each member included), by cluster, Kubernetes verb and HTTP code",
                MetricType::Counter,
            ),
            requests.iter().map(|(l, n)| (l, ConstCounter::new(*n))),
        )?;
        encode_family(
            &mut encoder,
            (
                "request_duration_seconds",
                "Time from the request head to the response head, by member cluster and verb; long-running requests (watch, follow, exec, attach, port-forward, proxy upgrades) are in fleetgate_stream_duration_seconds instead",
                MetricType::Histogram,
            ),
            latency.iter().map(|(l, sum)| (l, sum.bounded(FIRST_LATENCY_US))),
        )?;
        encode_family(
            &mut encoder,
            (
                "stream_duration_seconds",
                "How long long-running exchanges with members (watch, follow, exec, attach, port-forward) lasted, from the request head to the stream's end, by member cluster and verb",
                MetricType::Histogram,
            ),
            streams.iter().map(|(l, sum)| (l, sum.bounded(FIRST_STREAM_US))),
        )?;
        encode_family(
            &mut encoder,
            (
                "open_watches",
                "Watches open on each member cluster now: one per proxied client watch, one per shared watch (however many clients it serves), one per member of a fleet-view watch",
                MetricType::Gauge,
            ),
            watches.iter().map(|(l, n)| (l, ConstGauge::new(*n))),
        )?;
        encode_family(
            &mut encoder,
            (
                "fleet_requests",
                "Requests answered by the fleet view (/fleet, karmada-search's proxying path) as one request each, by verb and HTTP code",
                MetricType::Counter,
            ),
            fleet.iter().map(|(l, n)| (l, ConstCounter::new(*n))),
        )?;
        encode_family(
            &mut encoder,
            (
                "cache_lists",
                "LISTs of resources in spec.cache, by where they were answered: memory, or the member (docs/cache.md)",
                MetricType::Counter,
            ),
            [
                (&ServedLabels { served: "memory" }, ConstCounter::new(from_memory)),
                (&ServedLabels { served: "member" }, ConstCounter::new(from_member)),
            ],
        )?;
        for (name, help, value) in [
            (
                "open_streams",
                "Requests being proxied now (watches and logs -f included)",
                open,
            ),
            (
                "upgraded_streams",
                "Upgraded connections (exec, attach, port-forward over SPDY or WebSocket) being spliced now",
                upgraded,
            ),
            ("client_connections", "Client connections open now", clients),
            (
                "shared_watches",
                "Shared watches open now, each one member watch (docs/watches.md)",
                shared,
            ),
            (
                "shared_watch_clients",
                "Client watches served by shared watches now",
                shared_clients,
            ),
            (
                "shared_watch_feeds",
                "Shared watches on one shard fed by another's member watch now (spec.sharedWatches.scope: Gateway)",
                shared_feeds,
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        encode_family(
            &mut encoder,
            (
                "upstream_connections",
                "Connections to member clusters open now (in use or pooled)",
                MetricType::Gauge,
            ),
            upstream.iter().map(|(l, n)| (l, ConstGauge::new(*n))),
        )
    }
}

/// The memory of the cache (`spec.cache`, docs/cache.md#memory) for the whole gateway: what the
/// hubs of cached resources hold now, and how many were dropped, by reason. Written by
/// `watch::hub::memory` (relaxed atomics every shard adds to: a hub's events come and go on its
/// own shard, and the budget is the gateway's), read by the scrape.
#[derive(Debug, Default)]
pub struct CacheMemory {
    /// Bytes held: the objects' JSON, their index and the hubs' maps, as allocated.
    pub bytes: AtomicU64,
    /// Objects held (each cached once per hub that lists it).
    pub objects: AtomicU64,
    /// Hubs dropped because the cache passed `memoryBudget`.
    pub dropped_for_budget: AtomicU64,
    /// Hubs dropped because their resource passed its `maxObjects`.
    pub dropped_for_max_objects: AtomicU64,
}

impl CacheMemory {
    pub const fn new() -> CacheMemory {
        CacheMemory {
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            dropped_for_budget: AtomicU64::new(0),
            dropped_for_max_objects: AtomicU64::new(0),
        }
    }
}

/// The gateway's cache memory (`fleetgate_cache_bytes`, `fleetgate_cache_objects`,
/// `fleetgate_cache_evictions_total`).
pub static CACHE_MEMORY: CacheMemory = CacheMemory::new();

/// Encodes [`CACHE_MEMORY`].
#[derive(Debug)]
struct CacheMemoryCollector;

impl Collector for CacheMemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cache = &CACHE_MEMORY;
        let mut gauge = |name, help, value: &AtomicU64| {
            let value = i64::try_from(value.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)
        };
        gauge(
            "cache_bytes",
            "Bytes the cache (spec.cache) holds now: the cached objects' JSON, their index and the maps holding them, as allocated (docs/cache.md#memory)",
            &cache.bytes,
        )?;
        gauge(
            "cache_objects",
            "Objects the cache (spec.cache) holds now",
            &cache.objects,
        )?;
        encode_family(
            &mut encoder,
            (
                "cache_evictions",
                "Cached resources dropped from the cache (their LISTs go to the member): budget, the cache passed memoryBudget; max_objects, the resource passed its maxObjects",
                MetricType::Counter,
            ),
            [
                (
                    &ReasonLabels { reason: "budget" },
                    ConstCounter::new(cache.dropped_for_budget.load(Ordering::Relaxed)),
                ),
                (
                    &ReasonLabels {
                        reason: "max_objects",
                    },
                    ConstCounter::new(cache.dropped_for_max_objects.load(Ordering::Relaxed)),
                ),
            ],
        )
    }
}

/// Panics caught in a shard's tasks since the process started (`fleetgate_task_panics_total`;
/// counted by `runtime::isolated`).
pub static TASK_PANICS: AtomicU64 = AtomicU64::new(0);

/// What the shard supervisor saw: shards down now and restarts so far, and the task panics the
/// shards caught (`runtime::isolated`).
#[derive(Debug, Default)]
pub struct Supervision {
    restarts: AtomicU64,
    down: Mutex<Vec<usize>>,
}

impl Supervision {
    /// Shard `index` died: down until [`Supervision::shard_restarted`].
    pub fn shard_died(&self, index: usize) {
        let mut down = lock(&self.down);
        if !down.contains(&index) {
            down.push(index);
        }
    }

    pub fn shard_restarted(&self, index: usize) {
        lock(&self.down).retain(|i| *i != index);
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The shards down now, in index order.
    pub fn down(&self) -> Vec<usize> {
        let mut down = lock(&self.down).clone();
        down.sort_unstable();
        down
    }
}

impl Collector for Supervision {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            "shards_down",
            "Shards whose thread died and that are not running again yet",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(lock(&self.down).len() as i64).encode(family)?;
        for (name, help, value) in [
            (
                "shard_restarts",
                "Shards restarted after their thread died",
                self.restarts.load(Ordering::Relaxed),
            ),
            (
                "task_panics",
                "Panics caught in a connection's or stream's task (that connection or stream was closed; the shard went on)",
                TASK_PANICS.load(Ordering::Relaxed),
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        Ok(())
    }
}

/// One shard's gauges, zeroed by the supervisor once the shard's thread is gone (whatever its
/// guards did not give back as it died, nothing ever will).
pub struct ShardGauges(Arc<ShardCells>);

impl ShardGauges {
    pub fn zero(&self) {
        self.0.open_streams.store(0, Ordering::Relaxed);
        self.0.upgraded_streams.store(0, Ordering::Relaxed);
        self.0.client_connections.store(0, Ordering::Relaxed);
        self.0.shared_watches.store(0, Ordering::Relaxed);
        self.0.shared_watch_clients.store(0, Ordering::Relaxed);
        self.0.shared_watch_feeds.store(0, Ordering::Relaxed);
        for (_, open) in lock(&self.0.upstream).iter() {
            open.store(0, Ordering::Relaxed);
        }
        for cell in lock(&self.0.requests).iter() {
            cell.open.store(0, Ordering::Relaxed);
        }
    }
}

/// One shard's metrics: its cells, and its own map from a request's labels to its cell, so
/// recording a request is one lookup in an unshared map and a few uncontended atomic adds.
pub struct ShardMetrics {
    cells: Arc<ShardCells>,
    /// Every cluster's reachability and failures (process-wide).
    clusters: Arc<ClusterStates>,
    handles: RefCell<AHashMap<HandleKey, Arc<RequestCell>>>,
    /// This shard's handles on [`ClusterState`]s, by cluster route id.
    states: RefCell<AHashMap<u64, Arc<ClusterState>>>,
    fleet: RefCell<AHashMap<(&'static str, u16), Arc<FleetCell>>>,
}

/// (cluster route id, verb, code): no shared reference count is touched to look one up.
type HandleKey = (u64, &'static str, u16);

impl ShardMetrics {
    /// Counts an answered request and, unless it is a watch or an upgrade ([`timed`]), its time
    /// to the response head.
    pub fn record(
        &self,
        (cluster_id, cluster): (u64, &Arc<str>),
        verb: &'static str,
        code: u16,
        elapsed: Duration,
    ) {
        self.with_cell((cluster_id, cluster), verb, code, |cell| {
            cell.count.fetch_add(1, Ordering::Relaxed);
            if timed(verb) {
                cell.latency.observe(micros(elapsed));
            }
        });
    }

    /// Counts a member's answer (its response head) to a request started at `started`, and marks
    /// the member reachable. An ordinary request is timed; a long-running one (a watch, a
    /// followed log, an upgrade's 101) is counted open until the returned timer drops, at the
    /// stream's end, when its length is observed in `fleetgate_stream_duration_seconds`.
    pub fn member_answered(
        &self,
        cluster: &ClusterRoute,
        verb: &'static str,
        code: u16,
        started: Instant,
        long_running: bool,
    ) -> Option<StreamTimer> {
        self.with_cell((cluster.id, &cluster.name), verb, code, |cell| {
            cell.state.mark(true);
            cell.count.fetch_add(1, Ordering::Relaxed);
            if !long_running {
                cell.latency.observe(micros(started.elapsed()));
                return None;
            }
            cell.open.fetch_add(1, Ordering::Relaxed);
            Some(StreamTimer {
                cell: cell.clone(),
                started,
            })
        })
    }

    /// Records a dial's outcome: the member reachable, or a failure of its kind. Returns the
    /// outcome as it came.
    pub fn dialed<T>(
        &self,
        cluster: &ClusterRoute,
        outcome: Result<T, GatewayError>,
    ) -> Result<T, GatewayError> {
        match &outcome {
            Ok(_) => self.with_state(cluster, |state| state.mark(true)),
            Err(error) => self.member_failed(cluster, error),
        }
        outcome
    }

    /// Counts a member's failure (when `error` is the member's: [`FailureKind::of`]) and marks
    /// it unreachable.
    pub fn member_failed(&self, cluster: &ClusterRoute, error: &GatewayError) {
        if let Some(kind) = FailureKind::of(error) {
            self.with_state(cluster, |state| state.failed(kind));
        }
    }

    /// Counts a request of the fleet view by its verb and the code its client got; None (it
    /// was cut before any response head) is not counted.
    pub fn fleet_answered(&self, verb: &'static str, code: Option<u16>) {
        let Some(code) = code else { return };
        let mut fleet = self.fleet.borrow_mut();
        let cell = fleet.entry((verb, code)).or_insert_with(|| {
            let cell = Arc::new(FleetCell {
                verb,
                code,
                count: AtomicU64::new(0),
            });
            lock(&self.cells.fleet).push(cell.clone());
            cell
        });
        cell.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `f` on the shard's cell of (cluster, verb, code), made on its first use.
    fn with_cell<R>(
        &self,
        (cluster_id, cluster): (u64, &Arc<str>),
        verb: &'static str,
        code: u16,
        f: impl FnOnce(&Arc<RequestCell>) -> R,
    ) -> R {
        let mut handles = self.handles.borrow_mut();
        let cell = handles.entry((cluster_id, verb, code)).or_insert_with(|| {
            let cell = Arc::new(RequestCell {
                cluster: cluster.clone(),
                verb,
                code,
                count: AtomicU64::new(0),
                latency: Histogram::default(),
                open: AtomicI64::new(0),
                streams: Histogram::default(),
                state: self.state((cluster_id, cluster)),
            });
            lock(&self.cells.requests).push(cell.clone());
            cell
        });
        f(cell)
    }

    /// Runs `f` on `cluster`'s process-wide state.
    fn with_state(&self, cluster: &ClusterRoute, f: impl FnOnce(&ClusterState)) {
        f(&self.state((cluster.id, &cluster.name)));
    }

    /// The cluster's process-wide state, through this shard's handle on it.
    fn state(&self, (cluster_id, cluster): (u64, &Arc<str>)) -> Arc<ClusterState> {
        self.states
            .borrow_mut()
            .entry(cluster_id)
            .or_insert_with(|| self.clusters.of(cluster))
            .clone()
    }

    /// This shard's gauges, for the supervisor.
    pub fn gauges(&self) -> ShardGauges {
        ShardGauges(self.cells.clone())
    }

    /// Marks a proxied stream open until the returned guard drops.
    pub fn stream_opened(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.open_streams)
    }

    /// Marks an upgraded (spliced) stream open until the returned guard drops.
    pub fn upgraded_stream_opened(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.upgraded_streams)
    }

    /// Marks a client connection open until the returned guard drops.
    pub fn client_connected(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.client_connections)
    }

    /// Counts a shared watch (its member watch) open until the guard is dropped.
    pub fn shared_watch_opened(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.shared_watches)
    }

    /// Counts a client watch on a shared watch until the guard is dropped.
    pub fn shared_watch_client(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.shared_watch_clients)
    }

    /// Counts a LIST of a cached resource, answered from memory or sent to the member.
    pub fn cache_list(&self, from_memory: bool) {
        let cell = if from_memory {
            &self.cells.cache_lists_memory
        } else {
            &self.cells.cache_lists_member
        };
        cell.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a shared watch fed by another shard's until the guard is dropped.
    pub fn shared_watch_fed(&self) -> GaugeGuard {
        GaugeGuard::new(&self.cells, |c| &c.shared_watch_feeds)
    }

    /// Marks an upstream connection to `cluster` open until the returned guard drops.
    pub fn upstream_connected(&self, cluster: &Arc<str>) -> UpstreamGuard {
        let mut upstream = lock(&self.cells.upstream);
        let gauge = match upstream.iter().find(|(name, _)| name == cluster) {
            Some((_, gauge)) => gauge.clone(),
            None => {
                let gauge = Arc::new(AtomicI64::new(0));
                upstream.push((cluster.clone(), gauge.clone()));
                gauge
            }
        };
        gauge.fetch_add(1, Ordering::Relaxed);
        UpstreamGuard(gauge)
    }
}

/// A long-running exchange with a member, open until dropped (at the stream's end), when its
/// length is observed. Written only by the shard that made it.
pub struct StreamTimer {
    cell: Arc<RequestCell>,
    started: Instant,
}

impl Drop for StreamTimer {
    fn drop(&mut self) {
        self.cell.open.fetch_sub(1, Ordering::Relaxed);
        self.cell.streams.observe(micros(self.started.elapsed()));
    }
}

/// Decrements a shard gauge when dropped.
pub struct GaugeGuard {
    cells: Arc<ShardCells>,
    gauge: fn(&ShardCells) -> &AtomicI64,
}

impl GaugeGuard {
    fn new(cells: &Arc<ShardCells>, gauge: fn(&ShardCells) -> &AtomicI64) -> Self {
        gauge(cells).fetch_add(1, Ordering::Relaxed);
        GaugeGuard {
            cells: cells.clone(),
            gauge,
        }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        (self.gauge)(&self.cells).fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open upstream connection, counted until dropped.
pub struct UpstreamGuard(Arc<AtomicI64>);

impl Drop for UpstreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_the_bucket_prometheus_would_put_them_in() {
        for (micros, bucket) in [
            (0, 0),
            (500, 0),
            (501, 1),
            (1000, 1),
            (1001, 2),
            (2000, 2),
            (2001, 3),
            (65_536_000, 17),
            (65_536_001, 18),
            (u64::MAX, 18),
        ] {
            assert_eq!(bucket_of(micros, FIRST_LATENCY_US), bucket, "{micros} us");
            let seconds = micros as f64 * 1e-6;
            assert!(
                seconds <= bucket_bound(bucket, FIRST_LATENCY_US),
                "{micros} us above its bucket"
            );
            if bucket > 0 {
                assert!(
                    seconds > bucket_bound(bucket - 1, FIRST_LATENCY_US),
                    "{micros} us below its bucket"
                );
            }
        }
    }

    #[test]
    fn shards_count_apart_and_the_scrape_sums_them() {
        let metrics = Metrics::new();
        let cluster: Arc<str> = Arc::from("member1");
        let (one, two) = (metrics.shard(), metrics.shard());
        one.record((7, &cluster), "list", 200, Duration::from_millis(3));
        two.record((7, &cluster), "list", 200, Duration::from_millis(1));
        two.record((7, &cluster), "get", 404, Duration::from_micros(200));
        let stream = one.stream_opened();
        let other = two.stream_opened();
        let upstream = two.upstream_connected(&cluster);
        let text = metrics.encode();
        for expected in [
            "fleetgate_requests_total{cluster=\"member1\",verb=\"list\",code=\"200\"} 2",
            "fleetgate_requests_total{cluster=\"member1\",verb=\"get\",code=\"404\"} 1",
            "fleetgate_request_duration_seconds_count{cluster=\"member1\",verb=\"list\"} 2",
            "fleetgate_request_duration_seconds_bucket{le=\"0.001\",cluster=\"member1\",verb=\"list\"} 1",
            "fleetgate_request_duration_seconds_bucket{le=\"0.004\",cluster=\"member1\",verb=\"list\"} 2",
            "fleetgate_open_streams 2",
            "fleetgate_upstream_connections{cluster=\"member1\"} 1",
        ] {
            assert!(text.contains(expected), "{expected:?} missing:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(metrics.open_streams(), 2);
        drop((stream, other, upstream));
        let text = metrics.encode();
        assert!(text.contains("fleetgate_open_streams 0"), "{text}");
        assert!(text.contains("fleetgate_upstream_connections{cluster=\"member1\"} 0"));
    }

    /// The route of a cluster `name` whose server is `server`, as the table builds it.
    fn route(name: &str, server: &str) -> Arc<ClusterRoute> {
        let table = crate::testing::test_table(&format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}}}\n\
             spec: {{server: \"{server}\"}}\n"
        ));
        table.cluster(name).unwrap().clone()
    }

    /// The value of `series` (`name{labels}`) in `text`, as written.
    fn value<'t>(text: &'t str, series: &str) -> Option<&'t str> {
        let prefix = format!("{series} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
    }

    #[test]
    fn a_watch_is_counted_open_and_timed_as_a_stream_not_as_a_latency() {
        let metrics = Metrics::new();
        let shard = metrics.shard();
        let member = route("member1", "http://127.0.0.1:1");
        let started = Instant::now() - Duration::from_secs(10);
        let ordinary = shard.member_answered(&member, "list", 200, Instant::now(), false);
        assert!(ordinary.is_none());
        let watch = shard.member_answered(&member, "watch", 200, started, true);
        let follow = shard.member_answered(&member, "get", 200, started, true);
        let text = metrics.encode();
        assert_eq!(
            value(&text, "fleetgate_open_watches{cluster=\"member1\"}"),
            Some("1")
        );
        assert_eq!(
            value(
                &text,
                "fleetgate_requests_total{cluster=\"member1\",verb=\"watch\",code=\"200\"}"
            ),
            Some("1")
        );
        // Neither the watch nor the followed log is a latency.
        assert!(
            !text.contains("request_duration_seconds_count{cluster=\"member1\",verb=\"watch\"}")
        );
        assert!(!text.contains("request_duration_seconds_count{cluster=\"member1\",verb=\"get\"}"));
        assert_eq!(
            value(
                &text,
                "fleetgate_request_duration_seconds_count{cluster=\"member1\",verb=\"list\"}"
            ),
            Some("1")
        );
        drop((watch, follow));
        let text = metrics.encode();
        assert_eq!(
            value(&text, "fleetgate_open_watches{cluster=\"member1\"}"),
            Some("0")
        );
        // Ten seconds: above the 8 s bound, within 16 s.
        for (series, count) in [
            ("fleetgate_stream_duration_seconds_bucket{le=\"8.0\",cluster=\"member1\",verb=\"watch\"}", "0"),
            ("fleetgate_stream_duration_seconds_bucket{le=\"16.0\",cluster=\"member1\",verb=\"watch\"}", "1"),
            ("fleetgate_stream_duration_seconds_count{cluster=\"member1\",verb=\"get\"}", "1"),
        ] {
            assert_eq!(value(&text, series), Some(count), "{series}:\n{text}");
        }
        // A shared watch counted at its end (`record`) is no latency either.
        shard.record(
            (member.id, &member.name),
            "watch",
            200,
            Duration::from_secs(12),
        );
        let text = metrics.encode();
        assert!(
            !text.contains("request_duration_seconds_count{cluster=\"member1\",verb=\"watch\"}")
        );
    }

    #[test]
    fn a_refused_dial_marks_the_member_unreachable_by_kind_until_it_answers() {
        let metrics = Metrics::new();
        let (one, two) = (metrics.shard(), metrics.shard());
        let member = route("member2", "http://127.0.0.1:1");
        let refused = GatewayError::Connect {
            cluster: "member2".into(),
            address: "127.0.0.1:1".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert!(one.dialed::<()>(&member, Err(refused)).is_err());
        let timeout = GatewayError::ResponseHeadTimeout {
            cluster: "member2".into(),
            seconds: 60,
        };
        two.member_failed(&member, &timeout);
        // The client's own error is no member failure.
        two.member_failed(&member, &GatewayError::TooManyMemberConnections);
        let text = metrics.encode();
        for (series, expected) in [
            ("fleetgate_cluster_reachable{cluster=\"member2\"}", "0"),
            (
                "fleetgate_upstream_failures_total{cluster=\"member2\",kind=\"refused\"}",
                "1",
            ),
            (
                "fleetgate_upstream_failures_total{cluster=\"member2\",kind=\"timeout\"}",
                "1",
            ),
            (
                "fleetgate_upstream_failures_total{cluster=\"member2\",kind=\"tls\"}",
                "0",
            ),
        ] {
            assert_eq!(value(&text, series), Some(expected), "{series}:\n{text}");
        }
        // Another shard's answer from the member: reachable again, for the whole process.
        two.member_answered(&member, "get", 200, Instant::now(), false);
        let text = metrics.encode();
        assert_eq!(
            value(&text, "fleetgate_cluster_reachable{cluster=\"member2\"}"),
            Some("1")
        );
    }

    #[test]
    fn failures_are_told_apart_by_kind() {
        let connect = |source: std::io::Error| GatewayError::Connect {
            cluster: "m".into(),
            address: "a".into(),
            source,
        };
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        for (error, kind) in [
            (connect(tls), Some(FailureKind::Tls)),
            (
                connect(std::io::ErrorKind::ConnectionReset.into()),
                Some(FailureKind::Reset),
            ),
            (
                connect(std::io::ErrorKind::NotFound.into()),
                Some(FailureKind::Other),
            ),
            (
                GatewayError::UpstreamClosed {
                    cluster: "m".into(),
                    source: None,
                },
                Some(FailureKind::Reset),
            ),
            (
                GatewayError::ConnectTimeout {
                    cluster: "m".into(),
                    address: "a".into(),
                },
                Some(FailureKind::Timeout),
            ),
            (
                GatewayError::OutOfDescriptors {
                    cluster: "m".into(),
                },
                None,
            ),
        ] {
            assert_eq!(FailureKind::of(&error), kind, "{error:?}");
        }
    }

    #[test]
    fn fleet_requests_are_counted_as_one_each_and_the_process_is_described() {
        let metrics = Metrics::new();
        let shard = metrics.shard();
        shard.fleet_answered("list", Some(200));
        shard.fleet_answered("list", Some(200));
        shard.fleet_answered("get", Some(404));
        shard.fleet_answered("watch", None);
        let text = metrics.encode();
        assert_eq!(
            value(
                &text,
                "fleetgate_fleet_requests_total{verb=\"list\",code=\"200\"}"
            ),
            Some("2")
        );
        assert!(!text.contains("fleet_requests_total{verb=\"watch\""));
        assert_eq!(
            value(
                &text,
                &format!(
                    "fleetgate_build_info{{version=\"{}\"}}",
                    env!("CARGO_PKG_VERSION")
                )
            ),
            Some("1")
        );
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
            let value: f64 = line[name.len() + 1..].parse().unwrap();
            assert!(value > 0.0 || name == "process_cpu_seconds_total", "{line}");
        }
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.ends_with("# EOF\n"));
    }
}
