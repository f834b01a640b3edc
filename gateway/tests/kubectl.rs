//! kubectl through `fleetgate serve` against the simulated fleet, for every member: get in every
//! output format, apply, patch, delete, `get -w` seeing another client's change within 100 ms,
//! `logs -f`, and clear Status errors for an unknown and a stopped member while the others keep
//! working. Real processes throughout: the fleet runs in this test process (its own tokio
//! runtime), the gateway and kubectl are child processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fleetgate_loadtest::sim::store::Mutation;
use fleetgate_loadtest::sim::{start_fleet, FleetHandle, FleetOptions};

struct Fleet {
    runtime: tokio::runtime::Runtime,
    handle: Option<FleetHandle>,
    gateway: Child,
    dir: tempfile::TempDir,
    https: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
        if let Some(handle) = self.handle.take() {
            self.runtime.block_on(handle.shutdown());
        }
    }
}

fn start(clusters: usize) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime
        .block_on(start_fleet(FleetOptions {
            dir: dir.path().to_path_buf(),
            clusters,
            objects: 5,
            churn_per_sec: 0.0,
            gateway_listen: None,
        }))
        .unwrap();
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["serve", "--workers", "2", "--config"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(gateway.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("ready"),
        "gateway did not start: {line:?} {}",
        std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default()
    );
    let https = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("https="))
        .unwrap()
        .to_string();
    Fleet {
        runtime,
        handle: Some(handle),
        gateway,
        dir,
        https,
    }
}

impl Fleet {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("gateway.kubeconfig")
    }

    fn kubectl(&self, context: &str, args: &[&str]) -> Output {
        kubectl_with(&self.kubeconfig(), context, args)
    }

    fn ok(&self, context: &str, args: &[&str]) -> String {
        let out = self.kubectl(context, args);
        assert!(
            out.status.success(),
            "kubectl --context {context} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default();
        log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    }

    fn member(&self, index: usize) -> &fleetgate_loadtest::sim::member::Member {
        self.handle.as_ref().unwrap().member(index).unwrap()
    }
}

fn kubectl_with(kubeconfig: &Path, context: &str, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", context, "--request-timeout", "20s"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn kubectl_reads_and_writes_every_member_through_the_gateway() {
    let fleet = start(2);
    for context in ["member1", "member2"] {
        // get, in every output format.
        let table = fleet.ok(context, &["get", "pods", "-n", "default"]);
        assert!(
            table.starts_with("NAME") && table.contains("hello"),
            "{table}"
        );
        let wide = fleet.ok(context, &["get", "pods", "-n", "default", "-o", "wide"]);
        assert!(wide.contains("hello") && wide.contains("NODE"), "{wide}");
        let json: serde_json::Value =
            serde_json::from_str(&fleet.ok(context, &["get", "pods", "-A", "-o", "json"])).unwrap();
        assert!(
            json["items"].as_array().is_some_and(|i| !i.is_empty()),
            "{json}"
        );
        let yaml = fleet.ok(
            context,
            &["get", "pod", "hello", "-n", "default", "-o", "yaml"],
        );
        assert!(yaml.contains("name: hello"), "{yaml}");
        let name = fleet.ok(context, &["get", "namespaces", "-o", "name"]);
        assert!(name.contains("namespace/default"), "{name}");
        let jsonpath = fleet.ok(
            context,
            &[
                "get",
                "pod",
                "hello",
                "-n",
                "default",
                "-o",
                "jsonpath={.metadata.name}",
            ],
        );
        assert_eq!(jsonpath, "hello");
        let columns = fleet.ok(
            context,
            &[
                "get",
                "pods",
                "-n",
                "default",
                "-o",
                "custom-columns=N:.metadata.name,P:.status.phase",
            ],
        );
        assert!(
            columns.contains("hello") && columns.contains("Running"),
            "{columns}"
        );
        let template = fleet.ok(
            context,
            &[
                "get",
                "pod",
                "hello",
                "-n",
                "default",
                "-o",
                "go-template={{.kind}}",
            ],
        );
        assert_eq!(template, "Pod");
        let version = fleet.ok(context, &["version", "-o", "json"]);
        assert!(version.contains("serverVersion"), "{version}");

        // apply, patch (three kinds), delete.
        let manifest = fleet.dir.path().join(format!("{context}-cm.yaml"));
        std::fs::write(
            &manifest,
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: through-gw\n  namespace: default\ndata:\n  member: {context}\n"),
        )
        .unwrap();
        let applied = fleet.ok(context, &["apply", "-f", manifest.to_str().unwrap()]);
        assert!(applied.contains("configmap/through-gw"), "{applied}");
        let data = |key: &str| {
            fleet.ok(
                context,
                &[
                    "get",
                    "cm",
                    "through-gw",
                    "-n",
                    "default",
                    "-o",
                    &format!("jsonpath={{.data.{key}}}"),
                ],
            )
        };
        assert_eq!(data("member"), context);
        fleet.ok(
            context,
            &[
                "patch",
                "cm",
                "through-gw",
                "-n",
                "default",
                "-p",
                r#"{"data":{"a":"1"}}"#,
            ],
        );
        fleet.ok(
            context,
            &[
                "patch",
                "cm",
                "through-gw",
                "-n",
                "default",
                "--type",
                "merge",
                "-p",
                r#"{"data":{"b":"2"}}"#,
            ],
        );
        fleet.ok(
            context,
            &[
                "patch",
                "cm",
                "through-gw",
                "-n",
                "default",
                "--type",
                "json",
                "-p",
                r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
            ],
        );
        assert_eq!(
            (data("a"), data("b"), data("c")),
            ("1".into(), "2".into(), "3".into())
        );
        let deleted = fleet.ok(context, &["delete", "cm", "through-gw", "-n", "default"]);
        assert!(deleted.contains("deleted"), "{deleted}");
        let gone = fleet.kubectl(context, &["get", "cm", "through-gw", "-n", "default"]);
        assert!(!gone.status.success());
        assert!(
            String::from_utf8_lossy(&gone.stderr).contains("NotFound"),
            "{}",
            String::from_utf8_lossy(&gone.stderr)
        );
    }
    // Each member holds only its own object: the requests really went to different members.
    assert!(fleet
        .member(0)
        .store
        .get("configmaps", "default", "through-gw")
        .is_none());
}

/// Reads `child`'s stdout lines on a thread, each stamped with when it arrived.
fn stamped_lines(child: &mut Child) -> mpsc::Receiver<(Instant, String)> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for_line(
    lines: &mpsc::Receiver<(Instant, String)>,
    needle: &str,
    within: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match lines.recv_timeout(left) {
            Ok((at, line)) if line.contains(needle) => return Some(at),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

fn put_configmap(fleet: &Fleet, member: usize, name: &str, value: &str) {
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "data": {"v": value},
    });
    fleet
        .member(member)
        .store
        .mutate::<()>("configmaps", "default", name, |_| Ok(Mutation::Put(object)))
        .unwrap();
}

#[test]
fn kubectl_watch_and_logs_follow_stream_through_the_gateway() {
    let fleet = start(2);
    for (index, context) in ["member1", "member2"].into_iter().enumerate() {
        let mut watch = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(fleet.kubeconfig())
            .args([
                "--context",
                context,
                "get",
                "cm",
                "-n",
                "default",
                "-w",
                "-o",
                "name",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = stamped_lines(&mut watch);
        // The watch is live once a change made after it started shows up.
        let mut live = false;
        for attempt in 0..50 {
            put_configmap(&fleet, index, "warmup", &attempt.to_string());
            if wait_for_line(&lines, "configmap/warmup", Duration::from_millis(200)).is_some() {
                live = true;
                break;
            }
        }
        assert!(
            live,
            "{context}: the watch never showed a change\n{}",
            fleet.log()
        );
        // Drain the echoes of earlier warm-up writes, then measure one change.
        while lines.recv_timeout(Duration::from_millis(300)).is_ok() {}
        let changed = Instant::now();
        put_configmap(&fleet, index, "measured", "1");
        let seen = wait_for_line(&lines, "configmap/measured", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{context}: change never seen"));
        let latency = seen.duration_since(changed);
        assert!(
            latency < Duration::from_millis(100),
            "{context}: watch event took {latency:?}"
        );
        let _ = watch.kill();
        let _ = watch.wait();

        // logs -f: lines keep coming while the stream is open.
        let mut logs = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(fleet.kubeconfig())
            .args([
                "--context",
                context,
                "logs",
                "-f",
                "--tail",
                "1",
                "hello",
                "-n",
                "default",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = stamped_lines(&mut logs);
        let mut stamps = Vec::new();
        while stamps.len() < 4 {
            match lines.recv_timeout(Duration::from_secs(5)) {
                Ok((at, _)) => stamps.push(at),
                Err(_) => panic!("{context}: logs -f stalled after {} lines", stamps.len()),
            }
        }
        // Lines arrive spread out as the member writes them (every 200 ms), not in one burst.
        let spread = stamps[3].duration_since(stamps[0]);
        assert!(
            spread >= Duration::from_millis(450),
            "{context}: lines came in a burst: {spread:?}"
        );
        let _ = logs.kill();
        let _ = logs.wait();
    }
}

#[test]
fn unknown_and_stopped_members_give_clear_errors_while_others_keep_working() {
    let fleet = start(2);
    let unknown = fleet.kubectl(
        "member1",
        &[
            "--server",
            &format!("https://{}", fleet.https),
            "get",
            "--raw",
            "/clusters/nope/api/v1/namespaces",
        ],
    );
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success());
    assert!(
        stderr.contains("NotFound") && stderr.contains("cluster \"nope\" not found"),
        "{stderr}"
    );

    fleet
        .runtime
        .block_on(fleet.handle.as_ref().unwrap().stop_member(1));
    let stopped = fleet.kubectl("member2", &["get", "ns"]);
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(!stopped.status.success());
    assert!(stderr.contains("ServiceUnavailable"), "{stderr}");
    let stopped = fleet.kubectl(
        "member2",
        &[
            "--server",
            &format!("https://{}", fleet.https),
            "get",
            "--raw",
            "/clusters/member2/api/v1/namespaces",
        ],
    );
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(!stopped.status.success());
    assert!(
        stderr.contains("ServiceUnavailable")
            && stderr.contains("cluster \"member2\" is unavailable"),
        "{stderr}"
    );
    let ok = fleet.ok("member1", &["get", "ns", "-o", "name"]);
    assert!(ok.contains("namespace/default"));
    // The member sees the gateway's user, impersonated from the client certificate.
    let whoami = fleet.ok(
        "member1",
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username} {.status.userInfo.groups}",
        ],
    );
    assert!(
        whoami.starts_with("admin ") && whoami.contains("system:masters"),
        "{whoami}"
    );
}
