//! Gateway metrics: requests by cluster, verb and code, request latency (to the response head),
//! open streams, upgraded streams, client connections and upstream connections, encoded as
//! OpenMetrics text for the admin listener's `/metrics`.
//!
//! Shared nothing on the hot path: every shard counts into cells of its own ([`ShardMetrics`]),
//! which only that shard writes (relaxed atomics on cache lines no other core touches), and a
//! scrape sums the cells of every shard. A shard looks a request's cell up in a map of its own;
//! the shard's list of cells is locked only when a label set is seen for the first time on that
//! shard, and by the scrape. The few process-wide counters (the audit log's, h2 connections
//! calmed) are rare events. `spec.fairness`'s refusals and per-cluster requests in flight are
//! read at scrape time from admission's shared counters (`admit`). Called by the front-ends, the exchange, `server::shard` and
//! `upstream`; encoded by `server::admin`.

// The one lock of the crate (see clippy.toml): taken by a shard only for a label set's first use,
// and by the scrape; never per request.
#![allow(clippy::disallowed_types)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ahash::AHashMap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    cluster: Arc<str>,
    verb: &'static str,
    code: u16,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    cluster: Arc<str>,
    verb: &'static str,
}

/// Labels of the per-cluster upstream connection gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: Arc<str>,
}

/// Latency buckets: 0.5 ms doubling to about 65 s, then +Inf.
const BUCKETS: usize = 18;
const FIRST_BUCKET_US: u64 = 500;

/// The upper bound (seconds) of bucket `i`.
fn bucket_bound(i: usize) -> f64 {
    if i >= BUCKETS {
        return f64::INFINITY;
    }
    FIRST_BUCKET_US as f64 * 1e-6 * (1u64 << i) as f64
}

/// The bucket a latency of `micros` falls in (`BUCKETS` is +Inf).
fn bucket_of(micros: u64) -> usize {
    let q = micros.div_ceil(FIRST_BUCKET_US);
    if q <= 1 {
        return 0;
    }
    ((64 - (q - 1).leading_zeros()) as usize).min(BUCKETS)
}

/// One (cluster, verb, code) of one shard: its count and latencies.
struct RequestCell {
    cluster: Arc<str>,
    verb: &'static str,
    code: u16,
    count: AtomicU64,
    sum_micros: AtomicU64,
    buckets: [AtomicU64; BUCKETS + 1],
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
    /// Every request cell of the shard, for the scrape (appended on a label set's first use).
    requests: Mutex<Vec<Arc<RequestCell>>>,
    /// Open upstream connections per cluster.
    upstream: Mutex<Vec<(Arc<str>, Arc<AtomicI64>)>>,
}

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    shards: Arc<ShardList>,
    h2_calmed: Counter,
    /// Shards down and restarted, and task panics caught (`server::supervise`).
    pub supervision: Arc<Supervision>,
    /// Audit events written / dropped because the writer was behind (the `audit` module).
    pub audit_events: Counter,
    pub audit_events_dropped: Counter,
    /// Admission's counters (`admit`): process-wide like this registry, made with it so the
    /// scrape reads them; the shards reach them through their context's metrics.
    pub admission: Arc<crate::admit::Admission>,
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
        let mut registry = Registry::with_prefix("fleetgate");
        let shards = Arc::new(ShardList::default());
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
        let supervision = Arc::new(Supervision::default());
        registry.register_collector(Box::new(supervision.clone()));
        let admission = Arc::new(crate::admit::Admission::default());
        registry.register_collector(Box::new(FairnessCollector(admission.clone())));
        Arc::new(Metrics {
            registry,
            shards,
            h2_calmed,
            supervision,
            audit_events,
            audit_events_dropped,
            admission,
        })
    }

    /// The cells of a new shard (called once per shard, as it starts).
    pub fn shard(&self) -> ShardMetrics {
        let cells = Arc::new(ShardCells::default());
        lock(&self.shards.0).push(cells.clone());
        ShardMetrics {
            cells,
            handles: RefCell::new(AHashMap::new()),
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

    /// The OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
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
        let mut latency: AHashMap<LatencyLabels, (u64, u64, [u64; BUCKETS + 1])> = AHashMap::new();
        let mut upstream: AHashMap<ClusterLabels, i64> = AHashMap::new();
        let (mut open, mut upgraded, mut clients) = (0, 0, 0);
        let (mut shared, mut shared_clients, mut shared_feeds) = (0, 0, 0);
        for shard in &shards {
            shared += shard.shared_watches.load(Ordering::Relaxed);
            shared_clients += shard.shared_watch_clients.load(Ordering::Relaxed);
            shared_feeds += shard.shared_watch_feeds.load(Ordering::Relaxed);
            open += shard.open_streams.load(Ordering::Relaxed);
            upgraded += shard.upgraded_streams.load(Ordering::Relaxed);
            clients += shard.client_connections.load(Ordering::Relaxed);
            for cell in lock(&shard.requests).iter() {
                let count = cell.count.load(Ordering::Relaxed);
                *requests
                    .entry(RequestLabels {
                        cluster: cell.cluster.clone(),
                        verb: cell.verb,
                        code: cell.code,
                    })
                    .or_default() += count;
                let entry = latency
                    .entry(LatencyLabels {
                        cluster: cell.cluster.clone(),
                        verb: cell.verb,
                    })
                    .or_insert((0, 0, [0; BUCKETS + 1]));
                entry.0 += count;
                entry.1 += cell.sum_micros.load(Ordering::Relaxed);
                for (total, bucket) in entry.2.iter_mut().zip(&cell.buckets) {
                    *total += bucket.load(Ordering::Relaxed);
                }
            }
            for (cluster, open) in lock(&shard.upstream).iter() {
                *upstream
                    .entry(ClusterLabels {
                        cluster: cluster.clone(),
                    })
                    .or_default() += open.load(Ordering::Relaxed);
            }
        }
        let mut family = encoder.encode_descriptor(
            "requests",
            "Requests answered, by member cluster, Kubernetes verb and HTTP code",
            None,
            MetricType::Counter,
        )?;
        for (labels, count) in &requests {
            ConstCounter::new(*count).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "request_duration_seconds",
            "Time from the request head to the response head, by member cluster and verb",
            None,
            MetricType::Histogram,
        )?;
        for (labels, (count, sum_micros, buckets)) in &latency {
            let buckets: Vec<(f64, u64)> = buckets
                .iter()
                .enumerate()
                .map(|(i, n)| (bucket_bound(i), *n))
                .collect();
            family
                .encode_family(labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    *sum_micros as f64 * 1e-6,
                    *count,
                    &buckets,
                    None,
                )?;
        }
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
        let mut family = encoder.encode_descriptor(
            "upstream_connections",
            "Connections to member clusters open now (in use or pooled)",
            None,
            MetricType::Gauge,
        )?;
        for (labels, open) in &upstream {
            ConstGauge::new(*open).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// Labels of the fairness refusal counter: which limit of which scope refused what kind of
/// request. No user label: users are as many as tokens, and a series per user would let them
/// grow the scrape without bound (the audit log names who got each 429).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    scope: &'static str,
    limit: &'static str,
    kind: &'static str,
}

/// Labels of the per-cluster in-flight gauge (clusters are bounded by the configuration).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InFlightLabels {
    cluster: Arc<str>,
    kind: &'static str,
}

/// `spec.fairness`'s refusals and the requests in flight per cluster, read from admission's
/// shared counters at scrape time.
#[derive(Debug)]
struct FairnessCollector(Arc<crate::admit::Admission>);

impl Collector for FairnessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "fairness_rejections",
            "Requests (and connections) refused by spec.fairness, by scope (user, cluster, address), limit and kind (short or long-running)",
            None,
            MetricType::Counter,
        )?;
        for (limit, kind, count) in self.0.refusals() {
            let (scope, limit) = limit.labels();
            let labels = RefusalLabels { scope, limit, kind };
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "fairness_in_flight",
            "Requests in flight per member cluster while spec.fairness is on, by kind (short or long-running)",
            None,
            MetricType::Gauge,
        )?;
        for (cluster, short, long) in self.0.in_flight() {
            for (kind, n) in [("short", short), ("long", long)] {
                let labels = InFlightLabels {
                    cluster: cluster.clone(),
                    kind,
                };
                ConstGauge::new(i64::from(n)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
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
    }
}

/// One shard's metrics: its cells, and its own map from a request's labels to its cell, so
/// recording a request is one lookup in an unshared map and a few uncontended atomic adds.
pub struct ShardMetrics {
    cells: Arc<ShardCells>,
    handles: RefCell<AHashMap<HandleKey, Arc<RequestCell>>>,
}

/// (cluster route id, verb, code): no shared reference count is touched to look one up.
type HandleKey = (u64, &'static str, u16);

impl ShardMetrics {
    /// Counts an answered request and its time to the response head.
    pub fn record(
        &self,
        (cluster_id, cluster): (u64, &Arc<str>),
        verb: &'static str,
        code: u16,
        elapsed: Duration,
    ) {
        let mut handles = self.handles.borrow_mut();
        let cell = handles.entry((cluster_id, verb, code)).or_insert_with(|| {
            let cell = Arc::new(RequestCell {
                cluster: cluster.clone(),
                verb,
                code,
                count: AtomicU64::new(0),
                sum_micros: AtomicU64::new(0),
                buckets: Default::default(),
            });
            lock(&self.cells.requests).push(cell.clone());
            cell
        });
        let micros = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        cell.count.fetch_add(1, Ordering::Relaxed);
        cell.sum_micros.fetch_add(micros, Ordering::Relaxed);
        cell.buckets[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
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
            assert_eq!(bucket_of(micros), bucket, "{micros} us");
            let seconds = micros as f64 * 1e-6;
            assert!(
                seconds <= bucket_bound(bucket),
                "{micros} us above its bucket"
            );
            if bucket > 0 {
                assert!(
                    seconds > bucket_bound(bucket - 1),
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
}
