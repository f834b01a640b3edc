//! What an operator reads off the gateway, end to end: `fleetgate serve` on the simulated fleet
//! plus a member that refuses connections (`dead`), requests from kubectl (h2) and curl
//! (HTTP/1.1), a watch held open and then dropped, a fleet-wide list, then `/metrics` scraped as
//! a dashboard would, and the access log (`spec.accessLog`) read back from the gateway's log.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::fleet::{Fleet, KillOnDrop};
use support::kubectl::kubectl_command;
use support::wait::wait_for_or;

/// The simulated fleet (member1, member2) and a Cluster `dead` whose server refuses
/// connections, served with the access log and the audit log on.
fn start() -> Fleet {
    let mut fleet = Fleet::sim(2, 2);
    let dir = fleet.dir().to_path_buf();
    // A port nothing listens on: bound, then let go (loopback refuses a connect to it at once).
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let member2 = std::fs::read_to_string(dir.join("clusters/member2.yaml")).unwrap();
    let mut dead: serde_yaml::Value = serde_yaml::from_str(&member2).unwrap();
    dead["metadata"]["name"] = "dead".into();
    dead["spec"]["server"] = format!("https://{refused}").into();
    std::fs::write(
        dir.join("clusters/dead.yaml"),
        serde_yaml::to_string(&dead).unwrap(),
    )
    .unwrap();
    fleet.edit_gateway(|gateway| {
        gateway["spec"]["accessLog"] = true.into();
        gateway["spec"]["audit"] = serde_yaml::from_str("{path: audit.log}").unwrap();
    });
    fleet.serve(&["--workers", "2"], None);
    fleet
}

impl Fleet {
    /// `kubectl --context CONTEXT ARGS` through the gateway, with a HOME of its own (no
    /// discovery cache from elsewhere); its exit status.
    fn kubectl_status(&self, context: &str, args: &[&str]) -> std::process::ExitStatus {
        kubectl_command(&self.gateway_kubeconfig(), context)
            .env("HOME", self.path("home"))
            .args(["--request-timeout", "20s"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
    }

    /// An HTTP/1.1 GET of `path` with curl as `admin` (its certificate, or `token` as a bearer
    /// token); the status code.
    fn curl(&self, path: &str, token: Option<&str>) -> u16 {
        let mut command = Command::new("curl");
        command
            .args(["-sS", "--http1.1", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg("--cacert")
            .arg(self.fleet_path("pki/gateway-ca.crt"));
        match token {
            Some(token) => command.args(["-H", &format!("Authorization: Bearer {token}")]),
            None => command
                .arg("--cert")
                .arg(self.fleet_path("users/admin.crt"))
                .arg("--key")
                .arg(self.fleet_path("users/admin.key")),
        };
        let out = command
            .arg(format!("https://{}{path}", self.https()))
            .output()
            .unwrap();
        assert!(out.status.success(), "curl {path}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Waits (bounded) until `series` reads `value` on `/metrics`.
    fn metric_becomes(&self, series: &str, value: i64) {
        wait_for_or(
            &format!("{series} to be {value}"),
            Duration::from_secs(20),
            || self.metric(series) == Some(value),
            || self.admin_get("/metrics"),
        );
    }
}

#[test]
fn an_operator_sees_watches_reachability_failures_fleet_requests_and_the_process() {
    let fleet = start();
    // Ordinary requests: timed in request_duration_seconds.
    assert!(fleet
        .kubectl_status("member1", &["get", "pods", "-n", "default"])
        .success());
    // A watch, held open by kubectl until the test ends it.
    let watch = kubectl_command(&fleet.gateway_kubeconfig(), "member1")
        .env("HOME", fleet.path("home"))
        .args(["get", "pods", "-n", "default", "--watch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watch = KillOnDrop(watch);
    fleet.metric_becomes("fleetgate_open_watches{cluster=\"member1\"}", 1);
    drop(watch);
    fleet.metric_becomes("fleetgate_open_watches{cluster=\"member1\"}", 0);
    fleet.metric_becomes(
        "fleetgate_stream_duration_seconds_count{cluster=\"member1\",verb=\"watch\"}",
        1,
    );
    // A member that refuses connections: a 503 naming it.
    let dead = format!("https://{}/clusters/dead", fleet.https());
    assert!(!fleet
        .kubectl_status("member1", &["--server", &dead, "get", "pods"])
        .success());
    // The fleet view: one list over h2 (kubectl), one over HTTP/1.1 (curl); `dead` is left out
    // of both with a Warning.
    assert!(fleet
        .kubectl_status("fleet", &["get", "pods", "-A"])
        .success());
    assert_eq!(fleet.curl("/fleet/api/v1/pods", None), 200);

    let metrics = fleet.admin_get("/metrics");
    let value = |series: &str| fleet.metric(series);
    assert!(
        !metrics.contains(
            "fleetgate_request_duration_seconds_count{cluster=\"member1\",verb=\"watch\"}"
        ),
        "a watch is no request latency:\n{metrics}"
    );
    for series in [
        "fleetgate_request_duration_seconds_count{cluster=\"member1\",verb=\"list\"}",
        "fleetgate_upstream_failures_total{cluster=\"dead\",kind=\"refused\"}",
    ] {
        let counted = value(series).is_some_and(|n| n >= 1);
        assert!(counted, "{series} at least 1:\n{metrics}");
    }
    for (series, expected) in [
        (
            "fleetgate_requests_total{cluster=\"member1\",verb=\"watch\",code=\"200\"}",
            1,
        ),
        ("fleetgate_cluster_reachable{cluster=\"dead\"}", 0),
        ("fleetgate_cluster_reachable{cluster=\"member1\"}", 1),
        (
            "fleetgate_upstream_failures_total{cluster=\"member1\",kind=\"refused\"}",
            0,
        ),
        // Each fleet list once, as the client asked for it (its member requests are counted
        // under the members).
        (
            "fleetgate_fleet_requests_total{verb=\"list\",code=\"200\"}",
            2,
        ),
    ] {
        assert_eq!(value(series), Some(expected), "{series}:\n{metrics}");
    }
    for series in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "fleetgate_build_info{version=\"",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(series)),
            "{series} missing:\n{metrics}"
        );
    }
    assert_eq!(metrics.matches("# EOF").count(), 1);
}

#[test]
fn the_access_log_has_one_line_per_request_with_its_audit_id_and_no_credential() {
    let fleet = start();
    let token = std::fs::read_to_string(fleet.fleet_path("users/admin.token")).unwrap();
    let token = token.trim();
    let path = "/clusters/member1/api/v1/namespaces/default/pods";
    assert_eq!(fleet.curl(&format!("{path}?limit=1"), Some(token)), 200);
    let wanted = format!("path=\"{path}\"");
    let mut line = String::new();
    wait_for_or(
        "the access-log line",
        Duration::from_secs(10),
        || {
            let log = fleet.log();
            match log
                .lines()
                .find(|l| l.contains("fleetgate::access") && l.contains(&wanted))
            {
                Some(found) => {
                    line = found.to_string();
                    true
                }
                None => false,
            }
        },
        || fleet.log(),
    );
    for field in [
        "user=\"admin\"",
        "verb=\"list\"",
        "method=GET",
        "cluster=\"member1\"",
        "code=200",
        "duration_ms=",
        "source=127.0.0.1",
    ] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    // The audit event of the same request carries the same auditID.
    let audit_id = line
        .split_once("audit_id=")
        .map(|(_, rest)| rest.split_whitespace().next().unwrap())
        .expect("an audit_id field");
    let audit = std::fs::read_to_string(fleet.fleet_path("audit.log")).unwrap_or_default();
    wait_for_or(
        "the audit event of the same request",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(fleet.fleet_path("audit.log"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(&format!("\"auditID\":\"{audit_id}\"")) && l.contains(path))
        },
        || audit.clone(),
    );
    // Neither the client's token nor the member's credential is ever written.
    let member_token = fleet.cluster_field("member1", "token");
    let log = fleet.log();
    assert!(!log.contains(token), "the client's token is in the log");
    assert!(
        !log.contains(&member_token),
        "the member's token is in the log"
    );
}
