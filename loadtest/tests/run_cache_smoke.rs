//! A smoke run of `fleetgate-loadtest run --scenario cache` (issue 34's benchmark, docs/cache.md)
//! at a tiny scale: 5 simulated members x 200 pods, 50 informers, lists of a second. It starts
//! its own fleet (a child process) and gateways (`fleetgate`, beside this program or
//! `$FLEETGATE_BIN`), so CI runs the benchmark's harness end to end; checked through its JSON.
//! Not a performance test: no figure is compared, only what the run must show whatever the
//! machine (the lists complete, the storm's LISTs land where the cache says they do).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[test]
fn the_cache_benchmark_lists_fills_and_storms_with_the_cache_off_and_on() {
    let binary = std::env::var_os("FLEETGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_BIN_EXE_fleetgate-loadtest")).with_file_name("fleetgate")
        });
    if !binary.exists() {
        eprintln!("no fleetgate binary beside fleetgate-loadtest (set FLEETGATE_BIN): skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("cache.json");
    let work = tmp.path().join("work");
    let paths = [
        ("--gateway-bin", &binary),
        ("--work-dir", &work),
        ("--json", &json),
    ];
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"));
    command
        .args(["run", "--scenario", "cache", "--cache-members", "5"])
        .args(["--cache-pods", "200", "--informers", "50"])
        .args(["--storm-objects", "20", "--duration", "1s"]);
    for (flag, path) in paths {
        command.arg(flag).arg(path);
    }
    let out = command.output().expect("fleetgate-loadtest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON")).unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["target"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {stdout}"))
    };

    // Every list, direct and through /fleet with the cache off and on, at resourceVersion=0 and
    // consistent, has every pod: 5 members x (200 + hello).
    for name in [
        "direct-rv0",
        "direct-consistent",
        "cache-off-rv0",
        "cache-off-consistent",
        "cache-on-rv0",
        "cache-on-consistent",
    ] {
        let r = row(name);
        assert_eq!(r["objects"], 1005, "{name}: {stdout}");
        assert_eq!(r["errors"], 0, "{name}: {stdout}");
        assert!(r["total_ms"].as_f64().unwrap() > 0.0, "{name}: {stdout}");
    }
    // The memory rows know the objects and their JSON size, from the members' own lists.
    for name in ["cache-off-memory", "cache-on-memory"] {
        let m = &row(name)["cache"]["memory"];
        assert_eq!(m["objects"], 1005, "{name}: {stdout}");
        assert!(
            m["json_bytes_per_object"].as_f64().unwrap() > 500.0,
            "{stdout}"
        );
    }

    // The storm: every informer got its 410, listed again and caught up, both ways. Without the
    // cache each relist is a LIST at the member; with it the members see at most one full LIST
    // per key (member), besides the gateway's `limit=1` questions.
    let storm = |name: &str| row(name)["cache"]["storm"].clone();
    for name in ["cache-off-storm", "cache-on-storm"] {
        let s = storm(name);
        assert_eq!(s["informers"], 50, "{name}: {stdout}");
        assert_eq!(s["stalled"], 0, "{name}: {stdout}");
        assert!(s["relists"].as_u64().unwrap() >= 50, "{name}: {stdout}");
    }
    let off = storm("cache-off-storm");
    assert_eq!(off["short_lists"], 0, "{stdout}");
    assert!(off["lists"].as_u64().unwrap() >= 50, "{stdout}");
    let on = storm("cache-on-storm");
    let full = on["lists"].as_u64().unwrap() - on["short_lists"].as_u64().unwrap();
    assert!(full <= 5, "{full} full LISTs for 5 keys: {stdout}");
    assert!(stdout.contains("cache-on-storm: 50 informers"), "{stdout}");
}
