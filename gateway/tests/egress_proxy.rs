//! Clusters behind an egress proxy (`spec.proxyURL` / `spec.proxyHeader`, and the same fields of a
//! Karmada Cluster object), through a real `fleetgate serve` process and kubectl. The proxy is a
//! small HTTP CONNECT proxy written here (tokio, loopback) that records every CONNECT head it
//! sees; one instance tunnels, another refuses with 407. Checked: kubectl reaches the member
//! through the gateway and the tunnel, the proxy saw the CONNECT for the member's address with the
//! configured headers, a refusing proxy becomes a Status naming the proxy and its answer, and a
//! Karmada Cluster's proxyURL/proxyHeader are the ones used.

// The test's own proxy is not the data path (clippy.toml): it may lock.
#![allow(clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use support::fleet::Fleet;
use support::kubectl::{kubectl_command, succeeded};
use support::wait::wait_for;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

impl Fleet {
    /// kubectl through the gateway as the fleet's admin user, to cluster `cluster`.
    fn kubectl(&self, cluster: &str, args: &[&str]) -> Output {
        let server = format!("https://{}/clusters/{cluster}", self.https());
        kubectl_command(&self.path("gateway.kubeconfig"), "member1")
            .arg("--cache-dir")
            .arg(self.path("kube-cache"))
            .args(["--server", &server])
            .args(["--request-timeout", "20s"])
            .args(args)
            .output()
            .unwrap()
    }

    fn member1_file(&self) -> std::path::PathBuf {
        self.path("clusters/member1.yaml")
    }
}

/// What the CONNECT proxy does with a request.
#[derive(Clone, Copy)]
enum ProxyMode {
    Tunnel,
    Refuse,
}

/// A loopback HTTP CONNECT proxy recording the heads it received.
struct ConnectProxy {
    address: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn start(runtime: &tokio::runtime::Runtime, mode: ProxyMode) -> ConnectProxy {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let address = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve_connect(client, mode, seen.clone()));
            }
        });
        ConnectProxy { address, heads }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve_connect(
    mut client: tokio::net::TcpStream,
    mode: ProxyMode,
    heads: Arc<Mutex<Vec<String>>>,
) {
    let mut head = Vec::new();
    let end = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut buf = [0u8; 1024];
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    heads.lock().unwrap().push(text.clone());
    let target = text
        .strip_prefix("CONNECT ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    match mode {
        ProxyMode::Refuse => {
            let _ = client
                .write_all(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
                )
                .await;
        }
        ProxyMode::Tunnel => {
            let Ok(mut member) = tokio::net::TcpStream::connect(&target).await else {
                let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                return;
            };
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut client, &mut member).await;
        }
    }
}

/// Appends fields to the `spec` of a Cluster file the simulated fleet wrote (`spec` is its last
/// block).
fn add_to_spec(file: &Path, fields: &str) {
    let mut text = std::fs::read_to_string(file).unwrap();
    assert!(text.ends_with('\n'));
    text.push_str(fields);
    std::fs::write(file, text).unwrap();
}

#[test]
fn a_cluster_behind_an_http_proxy_is_reached_through_connect_with_its_headers() {
    let mut fleet = Fleet::sim(1, 2);
    let tunnel = ConnectProxy::start(&fleet.runtime, ProxyMode::Tunnel);
    let refusing = ConnectProxy::start(&fleet.runtime, ProxyMode::Refuse);
    let original = std::fs::read_to_string(fleet.member1_file()).unwrap();
    let server: serde_yaml::Value = serde_yaml::from_str(&original).unwrap();
    let member_address = server["spec"]["server"]
        .as_str()
        .unwrap()
        .trim_start_matches("https://")
        .to_owned();
    add_to_spec(
        &fleet.member1_file(),
        &format!(
            "  proxyURL: {}\n  proxyHeader:\n    X-Fleet-Test: via-proxy\n",
            tunnel.url()
        ),
    );
    fleet.serve(&["--workers", "1"], Some("info"));

    let out = fleet.kubectl("member1", &["get", "namespaces", "-o", "name"]);
    let names = succeeded(out, "get through the proxy", &fleet.log());
    assert!(names.contains("namespace/default"));
    let heads = tunnel.heads();
    assert!(!heads.is_empty(), "the gateway did not use the proxy");
    let head = &heads[0];
    assert!(
        head.starts_with(&format!("CONNECT {member_address} HTTP/1.1\r\n")),
        "{head}"
    );
    assert!(
        head.contains(&format!("\r\nHost: {member_address}\r\n")),
        "{head}"
    );
    assert!(head.contains("\r\nX-Fleet-Test: via-proxy\r\n"), "{head}");

    // The proxy refuses: kubectl gets a Status naming the proxy and its answer.
    let changed = original.clone()
        + &format!(
            "  proxyURL: {}\n  proxyHeader:\n    X-Fleet-Test: refused\n",
            refusing.url()
        );
    std::fs::write(fleet.member1_file(), changed).unwrap();
    let mut last = String::new();
    wait_for(
        "the refusing proxy to be used",
        Duration::from_secs(5),
        || {
            let out = fleet.kubectl("member1", &["get", "namespaces", "-o", "name"]);
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            !out.status.success() && last.contains("egress proxy")
        },
    );
    assert!(
        last.contains(&refusing.url()) && last.contains("407"),
        "the error names the proxy and its answer: {last}"
    );
    assert!(refusing.heads()[0].contains("X-Fleet-Test: refused"));
}

#[test]
fn a_karmada_clusters_proxy_url_and_headers_are_used() {
    let mut fleet = Fleet::sim(1, 2);
    let tunnel = ConnectProxy::start(&fleet.runtime, ProxyMode::Tunnel);
    let member: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(fleet.member1_file()).unwrap()).unwrap();
    let spec = &member["spec"];
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let token = spec["credentials"]["token"].as_str().unwrap();
    let ca = spec["caData"].as_str().unwrap();
    let server = spec["server"].as_str().unwrap();
    // As a Karmada control plane holds them: the Cluster and its Secrets.
    let karmada = format!(
        "apiVersion: cluster.karmada.io/v1alpha1
kind: Cluster
metadata:
  name: karmada1
spec:
  syncMode: Push
  apiEndpoint: {server}
  secretRef:
    namespace: karmada-cluster
    name: karmada1
  impersonatorSecretRef:
    namespace: karmada-cluster
    name: karmada1-impersonator
  proxyURL: {proxy}
  proxyHeader:
    X-Karmada-Proxy: yes-karmada
---
apiVersion: v1
kind: Secret
metadata:
  name: karmada1
  namespace: karmada-cluster
data:
  token: {token64}
  caBundle: {ca64}
---
apiVersion: v1
kind: Secret
metadata:
  name: karmada1-impersonator
  namespace: karmada-cluster
data:
  token: {token64}
",
        proxy = tunnel.url(),
        token64 = b64(token),
        ca64 = b64(ca),
    );
    std::fs::write(fleet.path("clusters/karmada1.yaml"), karmada).unwrap();
    fleet.serve(&["--workers", "1"], Some("info"));
    let out = fleet.kubectl("karmada1", &["get", "namespaces", "-o", "name"]);
    succeeded(out, "get to the Karmada cluster", &fleet.log());
    let heads = tunnel.heads();
    assert!(
        heads
            .iter()
            .any(|h| h.contains("\r\nX-Karmada-Proxy: yes-karmada\r\n")),
        "{heads:?}"
    );
}
