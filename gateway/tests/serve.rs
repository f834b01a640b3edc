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

#[test]
fn an_address_already_taken_is_refused_with_a_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!("apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners:\n    - name: http\n      address: {address}\n      tls: false\n"),
    )
    .unwrap();
    let out = serve(&config);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
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
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gateway.yaml");
        std::fs::write(
            &config,
            format!("apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners:\n    - name: http\n      address: 127.0.0.1:0\n      tls: false\n{block}"),
        )
        .unwrap();
        let out = serve(&config);
        assert!(!out.status.success(), "{block}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("ready"),
            "{block}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(field), "{block}: {stderr}");
    }
}
