//! What the gateway tells its operators about the requests it serves: `metrics` (Prometheus
//! counters and histograms, encoded by the admin listener) and `audit` (the audit.k8s.io log,
//! written off the shards). Recording never blocks a shard.

pub mod audit;
pub mod metrics;
