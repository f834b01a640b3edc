//! How long building a routing table takes (issue 5: 10,000 clusters, goal under 50 ms), printed,
//! not asserted: `cargo run --release -p fleetgate-config-watcher --example table_build [N]`.
//!
//! Every cluster is https with a CA and a token, like the simulated fleet's, so each entry costs a
//! rustls client configuration; the run also times a reload in which one cluster changed.

use std::time::Instant;

use fleetgate_config_watcher::{load_path, RouteTable};

mod common;
use common::GATEWAY;

fn main() {
    let clusters: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let ca = common::ca_pem();

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), GATEWAY).unwrap();
    let mut config = load_path(dir.path()).unwrap();
    config.clusters = (0..clusters)
        .map(|i| common::cluster(i, ca.clone(), format!("token-{i}"), "bench".to_owned()))
        .collect();

    let mut best = f64::MAX;
    for round in 0..3 {
        let start = Instant::now();
        let table = RouteTable::build_generation(&config, round + 1).unwrap();
        let elapsed = start.elapsed().as_secs_f64() * 1e3;
        assert_eq!(table.clusters().count(), clusters);
        best = best.min(elapsed);
    }
    println!("build: {clusters} clusters in {best:.1} ms (best of 3)");

    let previous = RouteTable::build_generation(&config, 8).unwrap();
    let mut changed = config.clone();
    changed.clusters[clusters / 2].token = Some("rotated".to_owned());
    let start = Instant::now();
    let equal = *previous.config() == changed;
    let table = RouteTable::rebuild(&previous, &changed, 9).unwrap();
    println!(
        "reload with one cluster changed: {:.1} ms (compare + rebuild; equal={equal}, {} clusters)",
        start.elapsed().as_secs_f64() * 1e3,
        table.clusters().count()
    );
}
