//! A second gateway on a taken address fails at start with "address already in use" (issue 11,
//! item 6): SO_REUSEPORT is shared among one gateway's shards, never with another process.

mod support;

use std::process::{Command, Stdio};

use support::{setup_with_config, write_config, Pki};

fn serve_fails_on(config: &std::path::Path) -> String {
    let output = Command::new(support::fleet::fleetgate_binary())
        .args(["serve", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success(), "the second gateway started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_listener_or_admin_port_another_process_holds() {
    let (_upstream, first) = setup_with_config("epoll", |t| t).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate();
    let config = write_config(dir.path(), &pki, first.http, first.http);
    let gateway_yaml = dir.path().join("gateway.yaml");
    let text = std::fs::read_to_string(&gateway_yaml).unwrap();
    // The first gateway's TLS listener (SO_REUSEPORT sockets, like ours).
    let taken = first.https.to_string();
    let edited = text.replacen("address: 127.0.0.1:0", &format!("address: {taken}"), 1);
    std::fs::write(&gateway_yaml, &edited).unwrap();
    let stderr = tokio::task::block_in_place(|| serve_fails_on(&config));
    assert!(stderr.contains("address already in use"), "{stderr}");
    assert!(stderr.contains(&taken), "{stderr}");
    // The first gateway's admin port.
    let admin = first.admin.to_string();
    let edited = text.replace(
        "admin:\n    address: 127.0.0.1:0",
        &format!("admin:\n    address: {admin}"),
    );
    assert_ne!(edited, text);
    std::fs::write(&gateway_yaml, &edited).unwrap();
    let stderr = tokio::task::block_in_place(|| serve_fails_on(&config));
    assert!(
        stderr.to_lowercase().contains("address already in use"),
        "{stderr}"
    );
    assert!(stderr.contains(&admin), "{stderr}");
    // The first gateway still answers on both.
    let health = support::fleet::raw_get(first.http, "gw", "/healthz", "");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}
