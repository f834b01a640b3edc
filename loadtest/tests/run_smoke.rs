//! A smoke run of the load driver (`fleetgate-loadtest run`) against a simulated member: every
//! scenario for about a second with a tiny load, checked through its JSON output, so the harness
//! that produces the benchmark figures never rots. Not a performance test: no figure is compared.

mod common;

use std::process::Command;

use common::TestFleet;

fn run(fleet: &TestFleet, args: &[&str]) -> serde_json::Value {
    let target = format!(
        "member1=kubeconfig:{}:member1",
        fleet.kubeconfig().display()
    );
    run_against(fleet, &target, args)
}

/// Runs one scenario against `target` (named `member1`) and returns its JSON result row.
fn run_against(fleet: &TestFleet, target: &str, args: &[&str]) -> serde_json::Value {
    let json = fleet.tempdir.path().join(format!("{}.json", args[1]));
    // The fleet runs inside this test process, so this process is the one charged.
    let pid = format!("member1={}", std::process::id());
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
        .arg("run")
        .args(args)
        .args([
            "--target",
            target,
            "--pid",
            &pid,
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("fleetgate-loadtest runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.lines().any(|l| l.starts_with("member1")),
        "a result row:\n{table}"
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    results[0].clone()
}

#[test]
fn every_scenario_runs_and_reports_its_figures() {
    let fleet = TestFleet::start_with(1, 20, 40.0, Default::default());

    let r = run(
        &fleet,
        &[
            "--scenario",
            "small-get",
            "--connections",
            "2",
            "--path",
            "/api/v1/namespaces/load-0/configmaps/load-cm-0",
        ],
    );
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["cpu_us_per_request"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap(),
        "{r}"
    );

    let r = run(
        &fleet,
        &["--scenario", "big-list", "--path", "/api/v1/configmaps"],
    );
    assert!(
        r["bytes"].as_u64().unwrap() > 20 * 1000,
        "20 objects of ~1 KiB: {r}"
    );
    assert!(r["cpu_ms_per_mb"].as_f64().is_some(), "{r}");

    let r = run(
        &fleet,
        &[
            "--scenario",
            "watch-idle",
            "--watches",
            "20",
            "--path",
            "/api/v1/namespaces/kube-public/configmaps?watch=1",
        ],
    );
    assert_eq!(r["watches"], 20, "{r}");
    assert!(r["kib_per_watch"].as_f64().is_some(), "{r}");

    // The churn (40 updates/s) stamps each update; every watch sees them with a latency.
    let r = run(
        &fleet,
        &[
            "--scenario",
            "watch-events",
            "--watches",
            "3",
            "--path",
            "/api/v1/configmaps",
        ],
    );
    assert!(r["events"].as_u64().unwrap() > 0, "{r}");
    let p50 = r["p50_us"].as_f64().unwrap();
    assert!(
        p50 > 0.0 && p50 < 1_000_000.0,
        "event latency on loopback is under a second: {r}"
    );

    // Bad input is a clear error, not a hang.
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
        .args([
            "run",
            "--scenario",
            "nope",
            "--target",
            "x=http://127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn h2_exec_portforward_storm_and_header_scenarios_run_and_report_their_figures() {
    let fleet = TestFleet::start_with(1, 20, 0.0, Default::default());
    let small = "/api/v1/namespaces/load-0/configmaps/load-cm-0";

    // TLS + h2: every request on the h2 connections (the sim answers h2 when ALPN picks it).
    let r = run(
        &fleet,
        &[
            "--scenario",
            "small-get-h2",
            "--connections",
            "2",
            "--streams",
            "3",
            "--path",
            small,
        ],
    );
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["streams"], 3, "{r}");
    assert!(r["cpu_us_per_request"].as_f64().unwrap() > 0.0, "{r}");

    // exec of `cat` over WebSocket: what goes in on stdin comes back on stdout.
    let chart = fleet.tempdir.path().join("exec.svg");
    let r = run(
        &fleet,
        &[
            "--scenario",
            "exec-stream",
            "--streams",
            "2",
            "--chunk-bytes",
            "4096",
            "--chart",
            chart.to_str().unwrap(),
        ],
    );
    assert!(r["bytes"].as_u64().unwrap() > 4096, "echoed bytes: {r}");
    assert!(r["mb_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["cpu_ms_per_mb"].as_f64().unwrap() > 0.0, "{r}");
    let svg = std::fs::read_to_string(&chart).expect("the chart is written");
    assert!(svg.starts_with("<svg") && svg.contains("member1"), "{svg}");

    // port-forward to the pod's echoing port: the same bytes back on the port's data channel.
    let r = run(
        &fleet,
        &[
            "--scenario",
            "portforward-stream",
            "--streams",
            "2",
            "--chunk-bytes",
            "4096",
        ],
    );
    assert_eq!(r["scenario"], "portforward-stream", "{r}");
    assert!(r["bytes"].as_u64().unwrap() > 4096, "echoed bytes: {r}");
    assert!(r["cpu_ms_per_mb"].as_f64().unwrap() > 0.0, "{r}");

    // The plain-HTTP listener (`sim --plaintext`) with the bearer token sent by --header: served.
    let plain = fleet
        .runtime
        .block_on(fleet.handle().serve_plaintext())
        .expect("plain listeners");
    let plain_target = format!("member1=http://{}", plain[0]);
    let bearer = format!("Authorization: Bearer {}", fleet.token("admin"));
    let r = run_against(
        &fleet,
        &plain_target,
        &[
            "--scenario",
            "small-get",
            "--connections",
            "2",
            "--path",
            small,
            "--header",
            &bearer,
        ],
    );
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    // Without the header the same target refuses: the header is what authenticated.
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
        .args(["run", "--scenario", "small-get", "--connections", "1"])
        .args(["--target", &plain_target, "--path", small])
        .args([
            "--duration",
            "300ms",
            "--warmup",
            "200ms",
            "--max-requests",
            "50",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "anonymous GETs fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // reload-storm against a config directory: the storm writes its changes, the load goes on
    // without a failure, and the directory is left as it was found.
    let config_dir = fleet.tempdir.path().join("storm-config");
    std::fs::create_dir(&config_dir).unwrap();
    std::fs::write(config_dir.join("keep.yaml"), "# not the driver's\n").unwrap();
    let r = run(
        &fleet,
        &[
            "--scenario",
            "reload-storm",
            "--connections",
            "2",
            "--path",
            small,
            "--config-dir",
            config_dir.to_str().unwrap(),
            "--changes-per-sec",
            "50",
        ],
    );
    assert_eq!(r["errors"], 0, "{r}");
    assert!(
        r["changes_written"].as_u64().unwrap() >= 20,
        "about 50 in 1 s: {r}"
    );
    assert!(r["p99_no_storm_us"].as_f64().is_some(), "{r}");
    let left: Vec<_> = std::fs::read_dir(&config_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, vec!["keep.yaml".to_string()], "storm files removed");
}
