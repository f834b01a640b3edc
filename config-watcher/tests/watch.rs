//! The file source as an operator uses it: files added, changed, removed, broken and fixed in a
//! watched directory; a Kubernetes ConfigMap mount's symlink swap; an editor's atomic rename over a
//! single config file; a burst of writes. Every wait polls the published table with a deadline.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fleetgate_config_watcher::{
    load_path, watch_config_path, ReloadStatus, RouteTable, SharedTable, TablePublisher,
};

const GATEWAY: &str = "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  listeners:\n  - address: 127.0.0.1:0\n    tls: false\n";

fn cluster(name: &str, port: u16) -> String {
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  server: http://127.0.0.1:{port}\n  credentials:\n    token: tok-{name}\n"
    )
}

fn start(
    path: &Path,
) -> (
    SharedTable,
    Arc<ReloadStatus>,
    fleetgate_config_watcher::FileWatcher,
) {
    let config = load_path(path).unwrap();
    let table: SharedTable = Arc::new(ArcSwap::from_pointee(RouteTable::build(&config).unwrap()));
    let status = ReloadStatus::new();
    let watcher =
        watch_config_path(path, TablePublisher::new(table.clone(), status.clone())).unwrap();
    (table, status, watcher)
}

/// Polls `check` until it holds or 3 s pass; returns how long it took.
fn eventually(what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// A new directory holding `files` (name, contents), watched: the directory, the table the
/// watcher publishes, its status, and the watcher.
fn watched(
    files: &[(&str, &str)],
) -> (
    tempfile::TempDir,
    SharedTable,
    Arc<ReloadStatus>,
    fleetgate_config_watcher::FileWatcher,
) {
    let dir = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        write(dir.path(), name, contents);
    }
    let (table, status, watcher) = start(dir.path());
    (dir, table, status, watcher)
}

/// Writes `contents` to the file `name` under `dir`.
fn write(dir: &Path, name: impl AsRef<Path>, contents: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), contents).unwrap();
}

fn port_of(table: &SharedTable, name: &str) -> Option<u16> {
    table.load().cluster(name).map(|c| c.upstream.port)
}

#[test]
fn directory_changes_are_published_and_a_broken_file_keeps_the_last_good_table() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        ("a.yaml", &cluster("alpha", 1001)),
    ]);
    assert_eq!(table.load().generation(), 1);
    let alpha_id = table.load().cluster("alpha").unwrap().id;

    // Added.
    std::fs::create_dir(dir.path().join("more")).unwrap();
    write(dir.path(), "more/b.yaml", cluster("beta", 2001));
    let took = eventually("beta added", || port_of(&table, "beta") == Some(2001));
    assert!(took < Duration::from_secs(1), "beta took {took:?}");
    assert_eq!(table.load().generation(), 2);
    // The unchanged cluster keeps its id, so the data path keeps its pool.
    assert_eq!(table.load().cluster("alpha").unwrap().id, alpha_id);

    // Changed.
    write(dir.path(), "more/b.yaml", cluster("beta", 2002));
    eventually("beta changed", || port_of(&table, "beta") == Some(2002));

    // Broken: the old table keeps serving, the error names the file.
    let generation = table.load().generation();
    write(dir.path(), "more/b.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: beta\nspec:\n  server: ftp://x\n");
    eventually("the broken file reported", || status.last_error().is_some());
    let failure = status.last_error().unwrap();
    assert!(
        failure.message.contains("b.yaml")
            && failure.message.contains("Cluster beta")
            && failure.message.contains("spec.server"),
        "{failure:?}"
    );
    assert_eq!(status.failed(), 1);
    assert_eq!(table.load().generation(), generation);
    assert_eq!(port_of(&table, "beta"), Some(2002));
    let metrics = status.openmetrics_lines(generation);
    assert!(metrics.contains("fleetgate_config_reloads_total{result=\"failure\"} 1"));
    assert!(metrics.contains("fleetgate_config_last_reload_failed 1"));

    // Removed (which also fixes the broken state).
    std::fs::remove_file(dir.path().join("more/b.yaml")).unwrap();
    eventually("beta removed", || port_of(&table, "beta").is_none());
    assert!(status.last_error().is_none());
    assert_eq!(port_of(&table, "alpha"), Some(1001));
    assert_eq!(table.load().cluster("alpha").unwrap().id, alpha_id);
}

#[test]
fn a_configmap_mount_symlink_swap_is_a_change() {
    // How the kubelet updates a mounted ConfigMap: the files are symlinks through `..data`,
    // which is re-pointed at a new timestamped directory by an atomic rename.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let v1 = root.join("..2026_11_22_v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("gateway.yaml"), GATEWAY).unwrap();
    std::fs::write(v1.join("clusters.yaml"), cluster("alpha", 1001)).unwrap();
    std::os::unix::fs::symlink("..2026_11_22_v1", root.join("..data")).unwrap();
    for f in ["gateway.yaml", "clusters.yaml"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), root.join(f)).unwrap();
    }
    let (table, _status, _watcher) = start(root);
    assert_eq!(port_of(&table, "alpha"), Some(1001));

    let v2 = root.join("..2026_11_22_v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("gateway.yaml"), GATEWAY).unwrap();
    std::fs::write(
        v2.join("clusters.yaml"),
        format!("{}---\n{}", cluster("alpha", 1002), cluster("gamma", 3001)),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_11_22_v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(&v1).unwrap();
    eventually("the swapped ConfigMap served", || {
        port_of(&table, "alpha") == Some(1002) && port_of(&table, "gamma") == Some(3001)
    });
}

#[test]
fn a_single_file_replaced_by_rename_is_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleetgate.yaml");
    std::fs::write(&file, format!("{GATEWAY}---\n{}", cluster("alpha", 1001))).unwrap();
    // An unrelated file beside it must not matter.
    write(dir.path(), "notes.txt", "x");
    let (table, status, _watcher) = start(&file);

    let tmp = dir.path().join(".fleetgate.yaml.swp");
    std::fs::write(&tmp, format!("{GATEWAY}---\n{}", cluster("alpha", 1002))).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    eventually("the renamed file served", || {
        port_of(&table, "alpha") == Some(1002)
    });
    assert_eq!(status.published(), 1);
}

#[test]
fn a_burst_of_writes_is_debounced_into_few_reloads() {
    let (dir, table, status, _watcher) = watched(&[("gateway.yaml", GATEWAY)]);
    for i in 0..50u16 {
        write(
            dir.path(),
            format!("c{}.yaml", i % 5),
            cluster(&format!("c{}", i % 5), 4000 + i),
        );
    }
    eventually("the last write served", || {
        (45..50).all(|i| port_of(&table, &format!("c{}", i % 5)) == Some(4000 + i))
    });
    assert!(
        status.published() <= 5,
        "{} tables published for one burst",
        status.published()
    );
    assert!(status.last_error().is_none());
}

#[test]
fn a_rebuild_reuses_the_routes_of_unchanged_clusters_and_shares_tls_configs() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gateway.yaml", GATEWAY);
    let mut config = load_path(dir.path()).unwrap();
    let template = {
        write(dir.path(), "c.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  server: https://127.0.0.1:1\n  insecureSkipTLSVerify: true\n  credentials:\n    token: t\n");
        load_path(dir.path()).unwrap().clusters.remove(0)
    };
    for name in ["a", "b", "c"] {
        let mut c = template.clone();
        c.name = name.to_owned();
        config.clusters.push(c);
    }
    let first = RouteTable::build(&config).unwrap();
    let tls = |t: &RouteTable, n: &str| t.cluster(n).unwrap().tls_client.clone().unwrap();
    // One TLS configuration for three clusters with the same trust and credentials.
    assert!(Arc::ptr_eq(&tls(&first, "a"), &tls(&first, "c")));

    config.clusters[1].token = Some("rotated".to_owned());
    let second = RouteTable::rebuild(&first, &config, 2).unwrap();
    assert!(Arc::ptr_eq(
        first.cluster("a").unwrap(),
        second.cluster("a").unwrap()
    ));
    assert!(!Arc::ptr_eq(
        first.cluster("b").unwrap(),
        second.cluster("b").unwrap()
    ));
    assert_ne!(
        first.cluster("b").unwrap().id,
        second.cluster("b").unwrap().id
    );
    assert_eq!(
        second.cluster("b").unwrap().authorization.as_deref(),
        Some("Bearer rotated")
    );
    assert_eq!(second.generation(), 2);
}

/// A Cluster whose credentials name a Secret that does not exist.
fn cluster_without_its_secret(name: &str) -> String {
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  server: http://127.0.0.1:9\n  credentials:\n    secretRef:\n      name: missing\n"
    )
}

/// The rejected objects as `(kind name, kept)`.
fn rejected(status: &ReloadStatus) -> Vec<(String, bool)> {
    status
        .rejected_objects()
        .into_iter()
        .map(|r| (format!("{} {}", r.object.kind, r.object.name), r.kept))
        .collect()
}

#[test]
fn a_bad_cluster_does_not_block_a_good_one_added_beside_it() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        ("a.yaml", &cluster("alpha", 1001)),
    ]);

    // One team's Cluster names a Secret nobody created; another team's Cluster is fine.
    write(dir.path(), "bad.yaml", cluster_without_its_secret("bad"));
    write(dir.path(), "good.yaml", cluster("gamma", 3001));
    eventually("the good cluster served", || {
        port_of(&table, "gamma") == Some(3001)
    });
    assert!(table.load().cluster("bad").is_none());
    assert_eq!(port_of(&table, "alpha"), Some(1001));
    eventually("the bad cluster reported", || {
        rejected(&status) == [("Cluster bad".to_owned(), false)]
    });
    let failure = status.last_error().unwrap().message;
    assert!(
        failure.contains("bad.yaml")
            && failure.contains("Cluster bad")
            && failure.contains("Secret default/missing not found")
            && failure.contains("not served"),
        "{failure}"
    );
    let metrics = status.openmetrics_lines(table.load().generation());
    assert!(
        metrics.contains("fleetgate_config_rejected_objects 1\n")
            && metrics.contains("fleetgate_config_object_rejected{kind=\"Cluster\",name=\"bad\",")
            && metrics.contains("fleetgate_config_last_reload_failed 1"),
        "{metrics}"
    );

    // The Secret created: the Cluster is served and nothing is rejected any more.
    write(
        dir.path(),
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: missing\nstringData:\n  token: t\n",
    );
    eventually("the fixed cluster served", || {
        port_of(&table, "bad") == Some(9)
    });
    eventually("the rejection cleared", || status.last_error().is_none());
    assert!(status.rejected_objects().is_empty());
}

#[test]
fn an_object_that_turns_invalid_keeps_its_last_good_version_while_others_change() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        ("a.yaml", &cluster("alpha", 1001)),
        ("b.yaml", &cluster("beta", 2001)),
    ]);
    let alpha_id = table.load().cluster("alpha").unwrap().id;

    write(
        dir.path(),
        "a.yaml",
        cluster("alpha", 1001).replace("http://", "ftp://"),
    );
    write(dir.path(), "b.yaml", cluster("beta", 2002));
    eventually("beta changed", || port_of(&table, "beta") == Some(2002));
    // alpha's last good version serves on, the same route (its pool and streams kept).
    assert_eq!(table.load().cluster("alpha").unwrap().id, alpha_id);
    eventually("alpha reported", || {
        rejected(&status) == [("Cluster alpha".to_owned(), true)]
    });
    let failure = status.last_error().unwrap().message;
    assert!(
        failure.contains("a.yaml")
            && failure.contains("spec.server")
            && failure.contains("its last good version keeps serving"),
        "{failure}"
    );

    // A Gateway that turns invalid keeps its last good version too; clusters go on changing.
    write(
        dir.path(),
        "gateway.yaml",
        GATEWAY.replace(
            "  listeners:\n  - address: 127.0.0.1:0\n    tls: false\n",
            "  listeners: []\n",
        ),
    );
    write(dir.path(), "c.yaml", cluster("gamma", 3001));
    eventually("gamma added", || port_of(&table, "gamma") == Some(3001));
    assert_eq!(table.load().gateway().listeners.len(), 1);
    eventually("the Gateway reported", || {
        rejected(&status).contains(&("Gateway gw".to_owned(), true))
    });
    assert!(
        status
            .last_error()
            .unwrap()
            .message
            .contains("at least one listener is required"),
        "{:?}",
        status.last_error()
    );
}

#[test]
fn a_file_that_does_not_parse_keeps_its_objects_and_other_files_go_on() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        (
            "a.yaml",
            &format!("{}---\n{}", cluster("alpha", 1001), cluster("alpha2", 1002)),
        ),
    ]);

    // a.yaml half written (or mistyped): neither of its clusters can be told apart any more.
    write(
        dir.path(),
        "a.yaml",
        format!("{}---\nkind: [broken\n", cluster("alpha", 1005)),
    );
    write(dir.path(), "b.yaml", cluster("beta", 2001));
    eventually("beta added", || port_of(&table, "beta") == Some(2001));
    assert_eq!(port_of(&table, "alpha"), Some(1001));
    assert_eq!(port_of(&table, "alpha2"), Some(1002));
    eventually("a.yaml reported", || status.last_error().is_some());
    let failure = status.last_error().unwrap().message;
    assert!(
        failure.contains("a.yaml: document ")
            && failure.contains("the objects it held keep their last good versions"),
        "{failure}"
    );

    // Fixed: its objects as now written.
    write(dir.path(), "a.yaml", cluster("alpha", 1005));
    eventually("a.yaml served", || {
        port_of(&table, "alpha") == Some(1005) && port_of(&table, "alpha2").is_none()
    });
    eventually("the error cleared", || status.last_error().is_none());
}

#[test]
fn a_cluster_defined_twice_keeps_the_copy_that_serves() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        ("a.yaml", &cluster("alpha", 1001)),
    ]);

    // Another team takes the name in a file of its own, and adds a cluster of its own.
    write(
        dir.path(),
        "z.yaml",
        format!("{}---\n{}", cluster("alpha", 9001), cluster("zeta", 9002)),
    );
    eventually("zeta added", || port_of(&table, "zeta") == Some(9002));
    assert_eq!(port_of(&table, "alpha"), Some(1001));
    eventually("the second alpha reported", || {
        status.rejected_objects().len() == 1
    });
    let r = &status.rejected_objects()[0];
    assert!(
        r.object.origin.ends_with("z.yaml")
            && !r.kept
            && r.message.contains("Cluster alpha is defined twice")
            && r.message.contains("a.yaml"),
        "{r:?}"
    );
}

#[test]
fn two_gateways_keep_the_last_good_one_and_a_secret_defined_twice_is_neither_copy() {
    let (dir, table, status, _watcher) = watched(&[
        ("gateway.yaml", GATEWAY),
        ("a.yaml", &cluster("alpha", 1001)),
    ]);

    // A second Gateway: which one is meant cannot be guessed, so neither replaces the serving
    // one; the Cluster written with it is served.
    write(
        dir.path(),
        "gateway2.yaml",
        GATEWAY.replace("name: gw", "name: gw2").replace(
            "tls: false",
            "tls: false\n  - address: 127.0.0.1:0\n    tls: false",
        ),
    );
    write(dir.path(), "b.yaml", cluster("beta", 2001));
    eventually("beta added", || port_of(&table, "beta") == Some(2001));
    assert_eq!(table.load().gateway().name, "gw");
    assert_eq!(table.load().gateway().listeners.len(), 1);
    eventually("both Gateways reported", || {
        let mut r = rejected(&status);
        r.sort();
        r == [
            ("Gateway gw".to_owned(), true),
            ("Gateway gw2".to_owned(), false),
        ]
    });
    assert!(
        status
            .last_error()
            .unwrap()
            .message
            .contains("2 Gateway objects"),
        "{:?}",
        status.last_error()
    );
    std::fs::remove_file(dir.path().join("gateway2.yaml")).unwrap();
    eventually("the second Gateway gone", || status.last_error().is_none());

    // One Secret name in two files: neither copy is used, so the Cluster naming it is not served.
    let secret =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: missing\nstringData:\n  token: t\n";
    write(dir.path(), "s1.yaml", secret);
    write(dir.path(), "s2.yaml", secret);
    write(dir.path(), "g.yaml", cluster_without_its_secret("gamma"));
    eventually("the Secrets and gamma reported", || {
        let mut r = rejected(&status);
        r.sort();
        r == [
            ("Cluster gamma".to_owned(), false),
            ("Secret missing".to_owned(), false),
            ("Secret missing".to_owned(), false),
        ]
    });
    assert!(table.load().cluster("gamma").is_none());
    assert_eq!(port_of(&table, "beta"), Some(2001));
}
