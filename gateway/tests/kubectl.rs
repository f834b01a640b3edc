//! kubectl through `fleetgate serve` against the simulated fleet, for every member: get in every
//! output format, apply, patch, delete, `get -w` seeing another client's change within 100 ms,
//! `logs -f`, and clear Status errors for an unknown and a stopped member while the others keep
//! working. Real processes throughout: the fleet runs in this test process (its own tokio
//! runtime), the gateway and kubectl are child processes.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::fleet::Fleet;
use support::kubectl::{assert_failed_with, kubectl, kubectl_command};
use support::wait::LineReader;

fn start(clusters: usize) -> Fleet {
    let mut fleet = Fleet::sim(clusters, 5);
    fleet.serve(&["--workers", "2"], None);
    fleet
}

#[test]
fn kubectl_reads_and_writes_every_member_through_the_gateway() {
    let fleet = start(2);
    for context in ["member1", "member2"] {
        // get, in every output format.
        let table = fleet.kubectl_ok(context, &["get", "pods", "-n", "default"]);
        assert!(
            table.starts_with("NAME") && table.contains("hello"),
            "{table}"
        );
        // `kubectl get POD_OR_PODS [hello] -n default -o FORMAT`.
        let get = |what: &[&str], format: &str| {
            let mut args = vec!["get"];
            args.extend_from_slice(what);
            args.extend_from_slice(&["-n", "default", "-o", format]);
            fleet.kubectl_ok(context, &args)
        };
        let wide = get(&["pods"], "wide");
        assert!(wide.contains("hello") && wide.contains("NODE"), "{wide}");
        let json: serde_json::Value =
            serde_json::from_str(&fleet.kubectl_ok(context, &["get", "pods", "-A", "-o", "json"]))
                .unwrap();
        assert!(
            json["items"].as_array().is_some_and(|i| !i.is_empty()),
            "{json}"
        );
        let yaml = get(&["pod", "hello"], "yaml");
        assert!(yaml.contains("name: hello"), "{yaml}");
        let name = fleet.kubectl_ok(context, &["get", "namespaces", "-o", "name"]);
        assert!(name.contains("namespace/default"), "{name}");
        let jsonpath = get(&["pod", "hello"], "jsonpath={.metadata.name}");
        assert_eq!(jsonpath, "hello");
        let columns = get(&["pods"], "custom-columns=N:.metadata.name,P:.status.phase");
        assert!(
            columns.contains("hello") && columns.contains("Running"),
            "{columns}"
        );
        let template = get(&["pod", "hello"], "go-template={{.kind}}");
        assert_eq!(template, "Pod");
        let version = fleet.kubectl_ok(context, &["version", "-o", "json"]);
        assert!(version.contains("serverVersion"), "{version}");

        // apply, patch (three kinds), delete.
        let manifest = fleet.path(&format!("{context}-cm.yaml"));
        std::fs::write(
            &manifest,
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: through-gw\n  namespace: default\ndata:\n  member: {context}\n"),
        )
        .unwrap();
        let applied = fleet.kubectl_ok(context, &["apply", "-f", manifest.to_str().unwrap()]);
        assert!(applied.contains("configmap/through-gw"), "{applied}");
        let data = |key: &str| get(&["cm", "through-gw"], &format!("jsonpath={{.data.{key}}}"));
        assert_eq!(data("member"), context);
        let patch = |kind: &[&str], body: &str| {
            let mut args = vec!["patch", "cm", "through-gw", "-n", "default"];
            args.extend_from_slice(kind);
            args.extend_from_slice(&["-p", body]);
            fleet.kubectl_ok(context, &args)
        };
        patch(&[], r#"{"data":{"a":"1"}}"#);
        patch(&["--type", "merge"], r#"{"data":{"b":"2"}}"#);
        patch(
            &["--type", "json"],
            r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
        );
        assert_eq!(
            (data("a"), data("b"), data("c")),
            ("1".into(), "2".into(), "3".into())
        );
        let deleted = fleet.kubectl_ok(context, &["delete", "cm", "through-gw", "-n", "default"]);
        assert!(deleted.contains("deleted"), "{deleted}");
        let gone = fleet.kubectl_output(context, &["get", "cm", "through-gw", "-n", "default"]);
        assert_failed_with(&gone, "NotFound");
    }
    // Each member holds only its own object: the requests really went to different members.
    let direct = kubectl(
        &fleet.fleet_path("kubeconfig"),
        "member1",
        &["get", "cm", "through-gw", "-n", "default"],
    );
    assert!(
        String::from_utf8_lossy(&direct.stderr).contains("NotFound"),
        "member1 holds member2's object: {}",
        String::from_utf8_lossy(&direct.stdout)
    );
}

/// Writes a ConfigMap in `default` straight to the member (the fleet's direct kubeconfig), not
/// through the gateway.
fn put_configmap(fleet: &Fleet, context: &str, name: &str, value: &str) {
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"v": value},
    });
    let mut apply = kubectl_command(&fleet.fleet_path("kubeconfig"), context)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    let out = apply.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "direct apply on {context}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl get cm -n default -w -o name` on `kubeconfig`'s `context`, its lines read as they come.
fn watch_configmaps(
    kubeconfig: &std::path::Path,
    context: &str,
) -> (std::process::Child, LineReader) {
    let mut watch = kubectl_command(kubeconfig, context)
        .args(["get", "cm", "-n", "default", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = LineReader::new(watch.stdout.take().unwrap());
    (watch, lines)
}

#[test]
fn kubectl_watch_and_logs_follow_stream_through_the_gateway() {
    let fleet = start(2);
    for context in ["member1", "member2"] {
        // The same watch through the gateway and straight to the member: what the gateway adds
        // is the difference between the two arrivals of one change.
        let (mut watch, mut lines) = watch_configmaps(&fleet.gateway_kubeconfig(), context);
        let (mut direct, mut direct_lines) =
            watch_configmaps(&fleet.fleet_path("kubeconfig"), context);
        // Both watches are live once a change made after they started shows up on both.
        let mut live = false;
        for attempt in 0..50 {
            put_configmap(&fleet, context, "warmup", &attempt.to_string());
            let through = lines.wait_for_text("configmap/warmup", Duration::from_millis(300));
            let straight =
                direct_lines.wait_for_text("configmap/warmup", Duration::from_millis(300));
            if through.is_some() && straight.is_some() {
                live = true;
                break;
            }
        }
        assert!(
            live,
            "{context}: the watch never showed a change\n{}",
            fleet.log_tail(20)
        );
        // Drain the echoes of earlier warm-up writes, then measure one change.
        for reader in [&mut lines, &mut direct_lines] {
            while reader
                .next_matching(Duration::from_millis(300), |_| true)
                .is_some()
            {}
        }
        put_configmap(&fleet, context, "measured", "1");
        let seen = lines
            .wait_for_text("configmap/measured", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{context}: change never seen through the gateway"));
        let seen_direct = direct_lines
            .wait_for_text("configmap/measured", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{context}: change never seen on the member"));
        let added = seen.saturating_duration_since(seen_direct);
        assert!(
            added < Duration::from_millis(100),
            "{context}: the gateway delayed the watch event by {added:?}"
        );
        for child in [&mut watch, &mut direct] {
            let _ = child.kill();
            let _ = child.wait();
        }

        // logs -f: lines keep coming while the stream is open.
        let mut logs = kubectl_command(&fleet.gateway_kubeconfig(), context)
            .args(["logs", "-f", "--tail", "1", "hello", "-n", "default"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = LineReader::new(logs.stdout.take().unwrap());
        let mut stamps = Vec::new();
        while stamps.len() < 4 {
            match lines.next_matching(Duration::from_secs(5), |_| true) {
                Some((at, _)) => stamps.push(at),
                None => panic!("{context}: logs -f stalled after {} lines", stamps.len()),
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
fn unknown_and_unreachable_members_give_clear_errors_while_others_keep_working() {
    let mut fleet = Fleet::sim(2, 5);
    // member2's server is an address nothing listens on (bound, then released).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cluster = fleet.fleet_path("clusters/member2.yaml");
    let yaml = std::fs::read_to_string(&cluster).unwrap();
    let server = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("member2.yaml has a server")
        .trim_matches('"')
        .to_string();
    std::fs::write(
        &cluster,
        yaml.replace(&server, &format!("https://{closed}")),
    )
    .unwrap();
    fleet.serve(&["--workers", "2"], None);
    // `kubectl get --raw PATH` with `context`'s credentials, sent to the gateway's root.
    let raw = |context: &str, path: &str| {
        let server = format!("https://{}", fleet.https());
        fleet.kubectl_output(context, &["--server", &server, "get", "--raw", path])
    };
    let unknown = raw("member1", "/clusters/nope/api/v1/namespaces");
    assert_failed_with(&unknown, "NotFound");
    assert_failed_with(&unknown, "cluster \"nope\" not found");

    let stopped = fleet.kubectl_output("member2", &["get", "ns"]);
    assert_failed_with(&stopped, "ServiceUnavailable");
    let stopped = raw("member2", "/clusters/member2/api/v1/namespaces");
    assert_failed_with(&stopped, "ServiceUnavailable");
    assert_failed_with(&stopped, "cluster \"member2\" is unavailable");
    let ok = fleet.kubectl_ok("member1", &["get", "ns", "-o", "name"]);
    assert!(ok.contains("namespace/default"));
    // The member sees the gateway's user, impersonated from the client certificate.
    let whoami = fleet.kubectl_ok(
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
