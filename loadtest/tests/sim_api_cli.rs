//! The `fleetgate-loadtest sim` command-line contract: it writes the files, prints a line
//! containing `ready` once every member listens, serves kubectl, and stops on SIGTERM. Also the
//! churn knob: updates stamped with `fleetgate.io/sent-at`.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{kubectl_with, LineReader, TestFleet};
use fleetgate_loadtest::sim::SimTuning;

#[test]
fn sim_command_prints_ready_and_serves_until_sigterm() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("fleet");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleetgate-loadtest"))
        .args(["sim", "--dir"])
        .arg(&dir)
        .args(["--clusters", "2", "--objects", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fleetgate-loadtest sim");
    let mut lines = LineReader::new(child.stdout.take().expect("stdout"));
    lines.wait_line("the ready line", Duration::from_secs(30), |l| {
        l.contains("ready")
    });

    let cache = tmp.path().join("cache");
    let out = kubectl_with(
        &dir.join("kubeconfig"),
        &cache,
        &[
            "--context",
            "member2",
            "get",
            "cm",
            "-n",
            "load-3",
            "-o",
            "name",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        3,
        "20 objects over 10 namespaces, plus kube-root-ca.crt"
    );
    for file in [
        "gateway.yaml",
        "gateway.kubeconfig",
        "clusters/member2.yaml",
        "users/tokens.csv",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }

    // SIGTERM: the process exits cleanly, and its members stop listening.
    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let started = std::time::Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "sim did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit}");
}

#[test]
fn churn_stamps_updates_with_their_send_time() {
    let fleet = TestFleet::start_with(1, 10, 50.0, SimTuning::default());
    let mut watch = fleet.kubectl_spawn(&[
        "get",
        "cm",
        "-A",
        "-l",
        "fleetgate.io/load=true",
        "--watch-only",
        "-o",
        "jsonpath={.metadata.annotations.fleetgate\\.io/sent-at}{\"\\n\"}",
    ]);
    let mut lines = LineReader::new(watch.stdout.take().expect("stdout"));
    let mut stamps = Vec::new();
    while stamps.len() < 20 {
        let line = lines.wait_line("a churn update", Duration::from_secs(20), |l| {
            !l.trim().is_empty()
        });
        stamps.push(
            line.trim()
                .parse::<u128>()
                .expect("sent-at is unix nanoseconds"),
        );
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    for stamp in &stamps {
        assert!(
            *stamp <= now && now - stamp < 60_000_000_000,
            "stamp {stamp} vs now {now}"
        );
    }
    // 50 updates per second: 20 updates take well under the deadline and are spread in time.
    assert!(stamps.last() > stamps.first());
}
