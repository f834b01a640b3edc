//! Admission's metrics: `spec.fairness`'s refusals and the requests in flight per cluster, read
//! from admission's shared counters at scrape time. Admission owns its counters; `server` hands
//! this collector to the metrics registry (`observe::metrics`) when the gateway starts.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::Admission;

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
pub struct FairnessCollector(pub Arc<Admission>);

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
