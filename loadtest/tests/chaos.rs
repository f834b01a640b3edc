//! `fleetgate-loadtest run --scenario chaos` for 60 s (issue 33 item 5): informer-style watchers
//! through a real gateway (`fleetgate serve`, the binary beside this crate's, or
//! `FLEETGATE_BIN`) while the driver injects every fault of its schedule; every event of every
//! member must be accounted for, with no violation. The checker's own power to catch duplicates,
//! gaps and reorders is shown by its unit tests (`run::chaos::check`).

use std::process::Command;

/// The gateway binary: `FLEETGATE_BIN`, or the one cargo builds beside this crate's binary.
fn gateway_binary() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("FLEETGATE_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
                .with_file_name("fleetgate")
        });
    path.exists().then_some(path)
}

#[test]
fn a_minute_of_faults_costs_the_watchers_no_event() {
    let Some(binary) = gateway_binary() else {
        eprintln!("no fleetgate binary beside fleetgate-loadtest (set FLEETGATE_BIN): skipped");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("chaos.json");
    let chart = tmp.path().join("chaos.svg");
    let work = tmp.path().join("work");
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
        .args([
            "run",
            "--scenario",
            "chaos",
            "--duration",
            "60s",
            "--seed",
            "1",
        ])
        .args(["--sample-every", "1s", "--gateway-bin"])
        .arg(&binary)
        .arg("--work-dir")
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("fleetgate-loadtest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(work.join("gateway.log")).unwrap_or_default();
    let tail: String = log
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\ngateway log (last lines):\n{tail}"
    );
    let rows: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON")).unwrap();
    let r = &rows[0]["chaos"];
    for count in ["duplicates", "gaps", "reorders", "unknown", "stalled"] {
        assert_eq!(r[count], 0, "{count}: {stdout}");
    }
    assert_eq!(r["failures"], serde_json::json!([]), "{stdout}");
    // Writes were made on both members, every watcher saw its share, and what had to arrive did.
    assert!(r["writes"].as_u64().unwrap() > 500, "{stdout}");
    let (expected, seen) = (r["expected"].as_u64().unwrap(), r["seen"].as_u64().unwrap());
    assert!(expected > 1000 && seen >= expected, "{stdout}");
    // Every kind of fault happened at least once.
    let kinds: Vec<&str> = r["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "blackhole",
        "slow",
        "cut",
        "member-restart",
        "gateway-restart",
        "gateway-kill",
        "config-churn",
    ] {
        assert!(kinds.contains(&kind), "{kind} never injected: {stdout}");
    }
    assert!(
        r["faults"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| !f["detail"].as_str().unwrap().starts_with("failed")),
        "{stdout}"
    );
    // The gateway restarts broke streams, and the watchers came back.
    assert!(
        r["breaks"].as_u64().unwrap() + r["ends"].as_u64().unwrap() > 0,
        "{stdout}"
    );
    // The timeline: the gateway's memory and descriptors sampled every second.
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.len() >= 50, "{stdout}");
    assert!(
        samples
            .iter()
            .filter(|s| s["rss_mib"].as_f64().is_some_and(|m| m > 1.0))
            .count()
            >= 50,
        "{stdout}"
    );
    assert!(stdout.contains("events: expected"), "{stdout}");
    let svg = std::fs::read_to_string(&chart).expect("the chart");
    assert!(svg.contains("event latency"), "{svg}");
}
