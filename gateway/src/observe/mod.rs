//! What the gateway tells its operators about the requests it serves: `metrics` (Prometheus
//! counters and histograms, encoded by the admin listener), `process` (the process's own
//! metrics, read from `/proc` at scrape time) and `audit` (the audit.k8s.io log and the access
//! log, written off the shards). Recording never blocks a shard.

pub mod audit;
pub mod metrics;
pub mod process;
