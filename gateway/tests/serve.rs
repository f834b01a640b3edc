//! `fleetgate serve` as an operator meets it: a configuration it cannot serve stops it at once
//! with a message that says why, and a good one gives a `ready` line with real ports.

mod support;

use std::process::Command;

fn serve(config: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["serve", "--workers", "2", "--config"])
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn a_tls_listener_without_a_client_ca_is_refused_with_a_reason() {
    let pki = support::Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gw.crt"), &pki.serving_cert_pem).unwrap();
    std::fs::write(dir.path().join("gw.key"), &pki.serving_key_pem).unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners:\n    - name: https\n      address: 127.0.0.1:0\n  tls:\n    certFile: gw.crt\n    keyFile: gw.key\n",
    )
    .unwrap();
    let out = serve(&config);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("client CA"), "{stderr}");
}

/// `fleetgate serve` of a Gateway with one plain-HTTP listener at `address` and `spec_tail`
/// appended to its spec: it must stop without a `ready` line. Its stderr, to say why.
fn refused_plain(address: &str, spec_tail: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!("apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners:\n    - name: http\n      address: {address}\n      tls: false\n{spec_tail}"),
    )
    .unwrap();
    let out = serve(&config);
    assert!(!out.status.success(), "{spec_tail}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("ready"), "{spec_tail}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_address_already_taken_is_refused_with_a_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let stderr = refused_plain(&address.to_string(), "");
    assert!(stderr.contains(&address.to_string()), "{stderr}");
}

#[test]
fn h2_and_timeout_settings_out_of_range_are_refused_naming_the_field() {
    let cases = [
        (
            "  http2:\n    maxConcurrentStreams: 0\n",
            "spec.http2.maxConcurrentStreams",
        ),
        (
            "  http2:\n    maxConcurrentStreams: 100001\n",
            "spec.http2.maxConcurrentStreams",
        ),
        (
            "  http2:\n    idleTimeoutSeconds: -1\n",
            "spec.http2.idleTimeoutSeconds",
        ),
        (
            "  limits:\n    idleTimeoutSeconds: -2\n",
            "spec.limits.idleTimeoutSeconds",
        ),
        (
            "  limits:\n    shutdownGraceSeconds: -3\n",
            "spec.limits.shutdownGraceSeconds",
        ),
        ("  fleet:\n    pageSize: 0\n", "spec.fleet.pageSize"),
        (
            "  fleet:\n    membersAtOnce: 257\n",
            "spec.fleet.membersAtOnce",
        ),
        ("  fleet:\n    createIn: Member2\n", "spec.fleet.createIn"),
        ("  fleet:\n    createIn: fleet\n", "spec.fleet.createIn"),
    ];
    for (block, field) in cases {
        let stderr = refused_plain("127.0.0.1:0", block);
        assert!(stderr.contains(field), "{block}: {stderr}");
    }
}

/// DIR/gateway.yaml: a Gateway with a plain-HTTP listener and an admin listener on free ports.
fn plain_gateway(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners:\n    - name: http\n      address: 127.0.0.1:0\n      tls: false\n  admin:\n    address: 127.0.0.1:0\n",
    )
    .unwrap();
    config
}

/// `fleetgate ARGS` with `RUST_BACKTRACE=1`, as many developer machines have it.
fn fleetgate_with_backtraces(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

/// A user error is one line on stderr (the error and its causes), with no backtrace; the log
/// lines of what ran before it (each starting with its timestamp) may precede it.
fn assert_one_line_error(out: &std::process::Output, expected: &str) {
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("20")).collect();
    assert_eq!(report.len(), 1, "{stderr}");
    assert!(report[0].starts_with("Error: "), "{stderr}");
    assert!(report[0].contains(expected), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
}

#[test]
fn user_errors_are_one_line_even_with_rust_backtrace_set() {
    let out = fleetgate_with_backtraces(&["serve", "--config", "/nonexistent"]);
    assert_one_line_error(&out, "/nonexistent");

    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().to_str().unwrap();
    let first = fleetgate_with_backtraces(&["certs", "init", "--dir", certs]);
    assert!(first.status.success());
    let again = fleetgate_with_backtraces(&["certs", "init", "--dir", certs]);
    assert_one_line_error(&again, "--force");

    // A kubeconfig the management source cannot use.
    let config = plain_gateway(dir.path());
    let kubeconfig = dir.path().join("broken.kubeconfig");
    std::fs::write(&kubeconfig, "this: [is not a kubeconfig\n").unwrap();
    let out = fleetgate_with_backtraces(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--management-kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    assert_one_line_error(&out, "broken.kubeconfig");
}

#[test]
fn serve_help_says_whose_secrets_the_secrets_namespace_holds() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let (_, flag) = help
        .split_once("--secrets-namespace")
        .unwrap_or_else(|| panic!("{help}"));
    // Its own paragraph only: up to the next flag.
    let paragraph = flag.split("\n  -").next().unwrap();
    assert!(paragraph.contains("Karmada"), "{paragraph}");
    assert!(
        paragraph.contains("spec.credentials.secretRef"),
        "fleetgate Clusters' Secrets are read there too: {paragraph}"
    );
    assert!(
        paragraph.contains("management kubeconfig's context"),
        "{paragraph}"
    );
    assert!(
        !paragraph.contains("default: karmada-cluster"),
        "{paragraph}"
    );
}

#[test]
fn json_logs_are_one_object_a_line_and_log_level_wins_over_rust_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = plain_gateway(dir.path());
    let log = dir.path().join("gateway.log");
    let (child, ready) = support::fleet::spawn_serve(
        [
            "--log-format",
            "json",
            "--log-level",
            "info",
            "--workers",
            "1",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("RUST_LOG", "trace")],
        &log,
    );
    let mut child = support::fleet::KillOnDrop(child);
    // A request, so the log has more than the start.
    let readyz = support::fleet::admin_get(ready.addr("admin"), "/readyz");
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    // SIGTERM: the drain's lines too.
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid with a valid signal touches no memory.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());

    let text = std::fs::read_to_string(&log).unwrap();
    let mut messages = Vec::new();
    for line in text.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nin:\n{text}"));
        let level = event["level"].as_str().unwrap_or_default();
        assert!(
            ["INFO", "WARN", "ERROR"].contains(&level),
            "--log-level info wins over RUST_LOG=trace: {line}"
        );
        messages.push(event["message"].as_str().unwrap_or_default().to_owned());
    }
    for expected in ["routing table built", "gateway started", "drain started"] {
        assert!(
            messages.iter().any(|m| m.contains(expected)),
            "no {expected:?} in {messages:?}"
        );
    }
}
