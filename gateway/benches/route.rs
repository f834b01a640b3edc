//! Criterion micro-benchmarks of route lookup (issue 7 item 3): splitting a request target into
//! cluster, kube path and query (`route::route`, all three path styles), classifying the verb,
//! and finding the cluster in a routing table of 10,000 clusters built from YAML files by
//! `load_path` and `RouteTable::build`, as `fleetgate serve --config DIR` builds it.
//! `cargo bench -p fleetgate --bench route`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetgate::request::route::{route, Route};
use fleetgate_config_watcher::request_info::RequestInfo;
use fleetgate_config_watcher::{load_path, RouteTable};

const CLUSTERS: usize = 10_000;

/// A table of `CLUSTERS` plain-HTTP clusters (no CA to parse: the lookup is what is measured).
fn table() -> RouteTable {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(
        dir.path().join("gateway.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: bench\nspec:\n  \
         listeners:\n  - address: 127.0.0.1:0\n    tls: false\n",
    )
    .expect("gateway.yaml");
    let mut clusters = String::new();
    for i in 0..CLUSTERS {
        clusters.push_str(&format!(
            "---\napiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member{i}\n  \
             labels: {{env: dev}}\nspec:\n  server: http://10.{}.{}.{}:6443\n  impersonation: false\n",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        ));
    }
    std::fs::write(dir.path().join("clusters.yaml"), clusters).expect("clusters.yaml");
    let config = load_path(dir.path()).expect("the bench configuration loads");
    RouteTable::build(&config).expect("the bench table builds")
}

fn lookup(c: &mut Criterion) {
    let table = table();
    let targets: [&[u8]; 3] = [
        b"/clusters/member4321/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
        b"/apis/cluster.karmada.io/v1alpha1/clusters/member777/proxy/api/v1/pods?watch=1&resourceVersion=10",
        b"/clusters/member9999/apis/apps/v1/namespaces/kube-system/deployments?limit=500",
    ];
    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(targets.len() as u64));
    group.bench_function("split target (3 styles)", |b| {
        b.iter(|| {
            for t in &targets {
                black_box(route(black_box(t), false));
            }
        })
    });
    group.bench_function(
        "split + request info + table lookup (10,000 clusters)",
        |b| {
            b.iter(|| {
                for t in &targets {
                    if let Route::Cluster { name, rest, query } = route(black_box(t), false) {
                        let info = RequestInfo::parse(b"GET", rest, query);
                        black_box((table.cluster(name).is_some(), info.metrics_verb()));
                    }
                }
            })
        },
    );
    group.bench_function("table lookup miss", |b| {
        b.iter(|| black_box(table.cluster(black_box("member-unknown")).is_none()))
    });
    group.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
