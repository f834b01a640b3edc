//! Gateway metrics: requests by cluster, verb and code, request latency (to the response head),
//! open streams, client connections and upstream connections, encoded as OpenMetrics text for the
//! admin listener's `/metrics`.
//!
//! One registry is shared by every shard: each value is an atomic, and a label set's entry is
//! created once and then only read (prometheus-client's family map takes a read lock), so shards
//! do not contend on the hot path. Recording never allocates after a label set's first use (the
//! cluster name is the route's `Arc<str>`). Called by `proxy`, `shard` and `upstream`; encoded by
//! `admin`.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub cluster: Arc<str>,
    pub verb: &'static str,
    pub code: u16,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub cluster: Arc<str>,
    pub verb: &'static str,
}

/// Labels of the per-cluster upstream connection gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: Arc<str>,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 65 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Every metric the data path records.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    open_streams: Gauge,
    upgraded_streams: Gauge,
    client_connections: Gauge,
    upstream_connections: Family<ClusterLabels, Gauge>,
    h2_calmed: Counter,
    /// Audit events written / dropped because the writer was behind (the `audit` module).
    pub audit_events: Counter,
    pub audit_events_dropped: Counter,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("fleetgate");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let open_streams = Gauge::default();
        let upgraded_streams = Gauge::default();
        let client_connections = Gauge::default();
        let upstream_connections = Family::<ClusterLabels, Gauge>::default();
        let h2_calmed = Counter::default();
        registry.register(
            "h2_connections_calmed",
            "h2 client connections closed with GOAWAY(ENHANCE_YOUR_CALM) for sending more control frames than their budget",
            h2_calmed.clone(),
        );
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
            "requests",
            "Requests answered, by member cluster, Kubernetes verb and HTTP code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from the request head to the response head, by member cluster and verb",
            latency.clone(),
        );
        registry.register(
            "open_streams",
            "Requests being proxied now (watches and logs -f included)",
            open_streams.clone(),
        );
        registry.register(
            "upgraded_streams",
            "Upgraded connections (exec, attach, port-forward over SPDY or WebSocket) being spliced now",
            upgraded_streams.clone(),
        );
        registry.register(
            "client_connections",
            "Client connections open now",
            client_connections.clone(),
        );
        registry.register(
            "upstream_connections",
            "Connections to member clusters open now (in use or pooled)",
            upstream_connections.clone(),
        );
        Arc::new(Metrics {
            registry,
            requests,
            latency,
            open_streams,
            upgraded_streams,
            client_connections,
            upstream_connections,
            h2_calmed,
            audit_events,
            audit_events_dropped,
        })
    }

    /// Counts an answered request and its time to the response head.
    pub fn record_request(
        &self,
        cluster: &Arc<str>,
        verb: &'static str,
        code: u16,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                cluster: cluster.clone(),
                verb,
                code,
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                cluster: cluster.clone(),
                verb,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Marks a proxied stream open until the returned guard drops.
    pub fn stream_opened(&self) -> GaugeGuard {
        GaugeGuard::new(self.open_streams.clone())
    }

    /// Marks an upgraded (spliced) stream open until the returned guard drops.
    pub fn upgraded_stream_opened(&self) -> GaugeGuard {
        GaugeGuard::new(self.upgraded_streams.clone())
    }

    /// Requests and streams in flight now (for the drain's log lines).
    pub fn open_streams(&self) -> i64 {
        self.open_streams.get()
    }

    /// Marks a client connection open until the returned guard drops.
    pub fn client_connected(&self) -> GaugeGuard {
        GaugeGuard::new(self.client_connections.clone())
    }

    /// Marks an upstream connection to `cluster` open until the returned guard drops.
    pub fn upstream_connected(&self, cluster: &Arc<str>) -> GaugeGuard {
        let gauge = self
            .upstream_connections
            .get_or_create(&ClusterLabels {
                cluster: cluster.clone(),
            })
            .clone();
        GaugeGuard::new(gauge)
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

/// A shard's own handles to the request metrics, so that recording a request is one lookup in an
/// unshared map and two atomic updates, instead of two lookups in the shared families (which hash
/// the labels and take their read lock). The handles share their values with the registry.
#[derive(Default)]
pub struct ShardMetrics {
    handles: RefCell<AHashMap<HandleKey, (Counter, Histogram)>>,
}

/// (cluster route id, verb, code): no shared reference count is touched to look one up.
type HandleKey = (u64, &'static str, u16);

impl ShardMetrics {
    /// Counts an answered request and its time to the response head.
    pub fn record(
        &self,
        metrics: &Metrics,
        (cluster_id, cluster): (u64, &Arc<str>),
        verb: &'static str,
        code: u16,
        elapsed: Duration,
    ) {
        let mut handles = self.handles.borrow_mut();
        let key = (cluster_id, verb, code);
        let (counter, histogram) = handles.entry(key).or_insert_with(|| {
            let counter = metrics
                .requests
                .get_or_create(&RequestLabels {
                    cluster: cluster.clone(),
                    verb,
                    code,
                })
                .clone();
            let histogram = metrics
                .latency
                .get_or_create(&LatencyLabels {
                    cluster: cluster.clone(),
                    verb,
                })
                .clone();
            (counter, histogram)
        });
        counter.inc();
        histogram.observe(elapsed.as_secs_f64());
    }
}

/// Decrements its gauge when dropped.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_requests_and_gauges() {
        let metrics = Metrics::new();
        let cluster: Arc<str> = Arc::from("member1");
        metrics.record_request(&cluster, "list", 200, Duration::from_millis(3));
        let guard = metrics.stream_opened();
        let text = metrics.encode();
        assert!(text.contains(
            "fleetgate_requests_total{cluster=\"member1\",verb=\"list\",code=\"200\"} 1"
        ));
        assert!(text.contains("fleetgate_open_streams 1"));
        assert!(text.contains("fleetgate_request_duration_seconds_bucket"));
        assert!(text.ends_with("# EOF\n"));
        drop(guard);
        assert!(metrics.encode().contains("fleetgate_open_streams 0"));
        let shard = ShardMetrics::default();
        shard.record(
            &metrics,
            (7, &cluster),
            "list",
            200,
            Duration::from_millis(1),
        );
        shard.record(
            &metrics,
            (7, &cluster),
            "list",
            200,
            Duration::from_millis(1),
        );
        assert!(metrics.encode().contains(
            "fleetgate_requests_total{cluster=\"member1\",verb=\"list\",code=\"200\"} 3"
        ));
    }
}
