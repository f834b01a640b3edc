//! Memory per cluster entry of the routing table (issue 5), counted by a global allocator that
//! tracks live heap bytes, not guessed from RSS:
//! `cargo run --release -p fleetgate-config-watcher --example table-memory [N...]`.
//!
//! For each fleet size it builds the resolved configuration (what a source hands the publisher)
//! and then the [`RouteTable`] from it, and prints the live bytes each adds per cluster, in two
//! fleets: one whose clusters share a CA (one rustls client configuration for all, as the table
//! build shares it) and one where every cluster has its own CA (a client configuration each).
//! The table keeps a copy of its configuration (to diff the next reload against), so its bytes
//! include that copy; "route" is the table's bytes minus that copy.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use fleetgate_config_watcher::{load_path, Config, RouteTable};

mod common;
use common::GATEWAY;

/// The system allocator, counting live bytes and allocations.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// A counting global allocator needs `unsafe impl GlobalAlloc`.
// SAFETY: every call is forwarded to `System` with the same arguments; the counters are atomics
// and never affect what is returned.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> (isize, usize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        ALLOCATIONS.load(Ordering::Relaxed),
    )
}

fn measure(base: &Config, clusters: usize, fleet: &str, cas: &[Vec<u8>]) {
    let (bytes0, allocs0) = live();
    let mut config = base.clone();
    config.clusters = (0..clusters)
        .map(|i| {
            common::cluster(
                i,
                cas[i % cas.len()].clone(),
                format!("{:048x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
                format!("/etc/fleetgate/clusters/member{i}.yaml"),
            )
        })
        .collect();
    let (bytes1, _) = live();
    let table = RouteTable::build(&config).unwrap();
    let (bytes2, allocs2) = live();
    assert_eq!(table.clusters().count(), clusters);
    let n = clusters as f64;
    let config_per = (bytes1 - bytes0) as f64 / n;
    let table_per = (bytes2 - bytes1) as f64 / n;
    println!(
        "{fleet:<16} {clusters:>6} clusters: configuration {config_per:>7.0} B/cluster, \
         table {table_per:>7.0} B/cluster (route {:>6.0} B + its configuration copy), \
         {:.1} allocations/cluster in all",
        table_per - config_per,
        (allocs2 - allocs0) as f64 / n,
    );
    drop(table);
    drop(config);
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        sizes
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), GATEWAY).unwrap();
    let base = load_path(dir.path()).unwrap();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let shared = vec![common::ca_pem()];
    let own: Vec<Vec<u8>> = (0..largest).map(|_| common::ca_pem()).collect();
    for &clusters in &sizes {
        measure(&base, clusters, "one shared CA", &shared);
        measure(&base, clusters, "a CA each", &own);
    }
}
