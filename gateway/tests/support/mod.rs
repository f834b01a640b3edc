//! Test harness for the gateway's socket-level tests: a generated PKI, a recording raw-HTTP
//! upstream ("member") whose behaviour depends on the path (and a wait for the watches it holds),
//! the real `fleetgate serve` process with a config written for them, and clients: TLS /
//! plaintext ones that speak raw bytes (a request sent, a `GET` answered) and h2 ones (a `GET`
//! sent, answered, its body read).
//!
//! Readiness is always a signal (the `ready` line, a bound listener), never a sleep; ports are
//! always 127.0.0.1:0.

#![allow(dead_code)]
// each test binary uses a different part of the harness
// Test harnesses are not the data path (clippy.toml): their members and clients may lock.
#![allow(clippy::disallowed_types)]

pub mod cache;
pub mod client;
pub mod fleet;
pub mod front;
pub mod h2raw;
pub mod kubectl;
pub mod netns;
pub mod pull;
/// Reading kubectl's `-v=8` log for the protocol it switched to: the simulated fleet's own file,
/// compiled in here (the gateway crate does not depend on the load-test crate).
#[path = "../../../loadtest/src/sim/stream/trace.rs"]
pub mod trace;
pub mod wait;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

/// A CA, the gateway's serving certificate and client certificates it signed.
pub struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// Signs more client certificates ([`Pki::client_config_as`]).
    ca: rcgen::CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn generate() -> Pki {
        let ca = test_ca("fleetgate-test-ca");

        let serving_key = KeyPair::generate().unwrap();
        let mut serving = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        serving
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        serving
            .distinguished_name
            .push(DnType::CommonName, "fleetgate");
        let serving_cert = serving.signed_by(&serving_key, &ca).unwrap();

        let (client_cert_pem, client_key_pem) = client_cert(&ca, "alice", "devs");
        Pki {
            ca_pem: ca.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            client_cert_pem,
            client_key_pem,
            ca,
        }
    }

    /// A rustls client trusting the CA, with a client certificate the CA signed for
    /// `common_name` (the user) in `organization` (a group).
    pub fn client_config_as(
        &self,
        common_name: &str,
        organization: &str,
    ) -> Arc<rustls::ClientConfig> {
        let (cert, key) = client_cert(&self.ca, common_name, organization);
        self.config_with(Some((&cert, &key)))
    }

    /// A rustls client trusting the CA; with the client certificate when `with_cert`.
    pub fn client_config(&self, with_cert: bool) -> Arc<rustls::ClientConfig> {
        let cert = (self.client_cert_pem.as_str(), self.client_key_pem.as_str());
        self.config_with(with_cert.then_some(cert))
    }

    fn config_with(&self, cert: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
        let identity = cert.map(|(cert, key)| (cert.as_bytes(), key.as_bytes()));
        fleet::client_tls_config(self.ca_pem.as_bytes(), identity, b"http/1.1")
    }
}

/// What the upstream saw: one request head (as text) and its body.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub head: String,
    pub body: Vec<u8>,
}

/// A raw HTTP/1.1 member: records every request; the path picks the behaviour:
/// a watch (`?watch=true`) streams events sent with [`Upstream::emit`]; `/big?bytes=N` sends N bytes chunked;
/// `/slow` never answers; `/late-watch` answers after 1.5 s; `/closed` sends a close-delimited
/// body; `/drop` closes without answering; anything else echoes the request as JSON.
pub struct Upstream {
    pub address: SocketAddr,
    pub seen: Arc<Mutex<Vec<Recorded>>>,
    pub connections: Arc<AtomicUsize>,
    events: broadcast::Sender<String>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (events, _) = broadcast::channel(1024);
        let (s, c, e) = (seen.clone(), connections.clone(), events.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_upstream(stream, s.clone(), e.clone()));
            }
        });
        Upstream {
            address,
            seen,
            connections,
            events,
        }
    }

    /// Sends one watch event line to every open watch stream.
    pub fn emit(&self, line: &str) {
        let _ = self.events.send(line.to_string());
    }

    pub fn watchers(&self) -> usize {
        self.events.receiver_count()
    }

    /// Polls (every 10 ms, for at most 10 s) until exactly `n` watches are open at this member;
    /// `what` names the wait in the failure message.
    pub async fn wait_watchers(&self, n: usize, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.watchers() != n {
            assert!(
                std::time::Instant::now() < deadline,
                "not within 10 s: {what} ({} watches open at the member, {n} awaited)",
                self.watchers()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap().clone()
    }
}

async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end + 4);
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The `Content-Length` of a request or response head already lowercased, if it has one.
fn content_length(lower_head: &str) -> Option<usize> {
    let value = lower_head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?;
    Some(value.trim().parse().unwrap())
}

async fn serve_upstream(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<Recorded>>>,
    events: broadcast::Sender<String>,
) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let lower = head.to_ascii_lowercase();
        let mut body = Vec::new();
        if let Some(len) = content_length(&lower) {
            while buf.len() < len {
                let mut chunk = vec![0u8; 65536];
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            body = buf.drain(..len).collect();
        } else if lower.contains("transfer-encoding: chunked") {
            // The gateway's own scanner finds the end (trailers included); the body is recorded
            // with its framing, as it came over the wire.
            let mut scanner = fleetgate::codec::http1::ChunkedScanner::new();
            let mut end = scanner.scan(&buf).unwrap();
            while !scanner.is_done() {
                let mut chunk = vec![0u8; 65536];
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                end += scanner.scan(&buf[end..]).unwrap();
            }
            body = buf.drain(..end).collect();
        }
        seen.lock().unwrap().push(Recorded {
            head: head.clone(),
            body: body.clone(),
        });
        let target = head.split(' ').nth(1).unwrap_or("/").to_string();
        let path = target.split('?').next().unwrap_or("/").to_string();
        let ok = if target.contains("watch=true") && !path.ends_with("/late-watch") {
            let mut rx = events.subscribe();
            let mut probe = [0u8; 16];
            if stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    event = rx.recv() => {
                        let Ok(line) = event else { let _ = stream.write_all(b"0\r\n\r\n").await; break };
                        let data = format!("{line}\n");
                        let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                        if stream.write_all(chunk.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    n = stream.read(&mut probe) => {
                        if matches!(n, Ok(0) | Err(_)) { return; }
                    }
                }
            }
            true
        } else if path.ends_with("/big") {
            let bytes: usize = target
                .split("bytes=")
                .nth(1)
                .and_then(|v| v.split('&').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if head.contains(" HTTP/1.0\r\n") {
                // An HTTP/1.0 request gets a close-delimited answer, as Go's server gives it.
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
                    .await;
                let _ = stream.write_all(&vec![b'x'; bytes]).await;
                return;
            }
            let mut ok = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await
                .is_ok();
            let piece = vec![b'x'; 64 * 1024];
            let mut left = bytes;
            while ok && left > 0 {
                let n = left.min(piece.len());
                let mut frame = format!("{n:x}\r\n").into_bytes();
                frame.extend_from_slice(&piece[..n]);
                frame.extend_from_slice(b"\r\n");
                ok = stream.write_all(&frame).await.is_ok();
                left -= n;
            }
            ok && stream.write_all(b"0\r\n\r\n").await.is_ok()
        } else if path.ends_with("/echo-upgrade") || path.ends_with("/upgrade-then-close") {
            upgraded_member(stream, buf, &head, path.ends_with("/echo-upgrade"), &seen).await;
            return;
        } else if path.ends_with("/slow") {
            tokio::time::sleep(Duration::from_secs(10)).await;
            return;
        } else if path.ends_with("/late-watch") {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
                .await
                .is_ok()
        } else if path.ends_with("/closed") {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close")
                .await;
            return;
        } else if path.ends_with("/drop") {
            return;
        } else if path.ends_with("/close-when-idle") {
            // Answers as keep-alive, then closes the idle connection, as members and load
            // balancers in front of them do.
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        } else {
            let echo = serde_json::json!({
                "head": head,
                "body": String::from_utf8_lossy(&body),
            })
            .to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5\r\nX-Upstream: yes\r\nContent-Length: {}\r\n\r\n{echo}",
                echo.len()
            );
            stream.write_all(response.as_bytes()).await.is_ok()
        };
        if !ok {
            return;
        }
    }
}

/// A member after an upgrade. It answers 101 with the first bytes of the new protocol in the
/// same write. `/echo-upgrade` then echoes every byte (the client's early bytes, sent with its
/// head, first) and, at the client's end of stream, sends `bye` and closes: proof that a client
/// half-close reaches it and its last bytes still reach the client. `/upgrade-then-close` sends
/// `last`, shuts down its write side at once, and records what the client still sends (as a
/// request with head `after-close`) until the client closes too.
async fn upgraded_member(
    mut stream: TcpStream,
    mut early: Vec<u8>,
    head: &str,
    echo: bool,
    seen: &Arc<Mutex<Vec<Recorded>>>,
) {
    let protocol = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("upgrade:")
                .then(|| l["upgrade:".len()..].trim().to_string())
        })
        .unwrap_or_default();
    let switch = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: {protocol}\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nKeep-Alive: timeout=5\r\n\r\nmember-first:"
    );
    if stream.write_all(switch.as_bytes()).await.is_err() {
        return;
    }
    if echo {
        if stream.write_all(&early).await.is_err() {
            return;
        }
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => {
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        let _ = stream.write_all(b"bye").await;
        let _ = stream.shutdown().await;
    } else {
        if stream.write_all(b"last").await.is_err() || stream.shutdown().await.is_err() {
            return;
        }
        let mut chunk = vec![0u8; 64 * 1024];
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            early.extend_from_slice(&chunk[..n]);
        }
        seen.lock().unwrap().push(Recorded {
            head: "after-close".to_string(),
            body: early,
        });
    }
}

/// A TCP listener that accepts and never speaks: a TLS upstream whose handshake never ends.
pub async fn silent_listener() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    address
}

/// A port nothing listens on.
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A running `fleetgate serve`.
pub struct Gateway {
    /// Killed when the Gateway is dropped.
    pub child: fleet::KillOnDrop,
    pub https: SocketAddr,
    pub http: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub pki: Arc<Pki>,
}

/// The clusters of a test config: `member` (the recording upstream), `stopped` (nothing
/// listening), `stalled` (TLS upstream that never answers the handshake).
pub fn write_config(dir: &Path, pki: &Pki, member: SocketAddr, stalled: SocketAddr) -> PathBuf {
    std::fs::write(dir.join("ca.crt"), &pki.ca_pem).unwrap();
    std::fs::write(dir.join("gw.crt"), &pki.serving_cert_pem).unwrap();
    std::fs::write(dir.join("gw.key"), &pki.serving_key_pem).unwrap();
    let gateway = r#"apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata:
  name: fleetgate
spec:
  workers: 2
  listeners:
    - name: https
      address: 127.0.0.1:0
      tls: true
    - name: http
      address: 127.0.0.1:0
      tls: false
  tls:
    certFile: ca-dir/gw.crt
    keyFile: ca-dir/gw.key
    clientCAFile: ca-dir/ca.crt
  admin:
    address: 127.0.0.1:0
  routing:
    ocmStyle: true
  limits:
    maxHeadBytes: 8192
    maxHeaders: 32
    connectTimeoutSeconds: 0.5
    responseHeadTimeoutSeconds: 0.5
"#
    .replace("ca-dir/", "");
    // The three clusters differ in name, server and CA (stalled's upstream speaks TLS).
    let cluster = |name: &str, server: String, ca: &str| {
        format!(
            r#"apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata:
  name: {name}
spec:
  server: {server}
{ca}  credentials:
    token: gateway-token
"#
        )
    };
    let clusters = format!(
        r#"{member}---
{stopped}---
{stalled}---
# Every test client (the plaintext listener's anonymous user included) may do anything but
# impersonate: these tests are about the proxy; identity.rs tests policies.
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata:
  name: everyone
spec:
  subjects:
    - {{kind: Group, name: system:authenticated}}
    - {{kind: Group, name: system:unauthenticated}}
  clusters: {{names: ["*"]}}
  rules:
    - verbs: [get, list, watch, create, update, patch, delete, deletecollection, exec, attach, portforward, proxy]
    # The recording member serves any path (`/big`, `/slow`...): non-resource paths need a grant
    # of their own.
    - verbs: ["*"]
      nonResourceURLs: ["*"]
---
# The fleet view merges pods from the one recording member (hostile.rs sends it forged fields).
apiVersion: fleetgate.io/v1alpha1
kind: FleetResource
metadata:
  name: pods
spec:
  resourceSelectors:
    - {{apiVersion: v1, kind: Pod}}
  clusters: {{names: [member]}}
"#,
        member = cluster("member", format!("http://{member}/prefix"), ""),
        stopped = cluster("stopped", format!("http://{}", closed_port()), ""),
        stalled = cluster(
            "stalled",
            format!("https://{stalled}"),
            "  caFile: ca.crt\n"
        ),
    );
    std::fs::write(dir.join("gateway.yaml"), gateway).unwrap();
    std::fs::write(dir.join("clusters.yaml"), clusters).unwrap();
    dir.to_path_buf()
}

impl Gateway {
    /// Starts `fleetgate serve` on `config` with the given driver and waits for its `ready` line.
    pub fn start(config: &Path, driver: &str, dir: tempfile::TempDir, pki: Arc<Pki>) -> Gateway {
        Gateway::start_with(config, driver, dir, pki, |_| {})
    }

    /// Like [`Gateway::start`], with the `fleetgate serve` command adjusted by `configure`.
    pub fn start_with(
        config: &Path,
        driver: &str,
        dir: tempfile::TempDir,
        pki: Arc<Pki>,
        configure: impl FnOnce(&mut std::process::Command),
    ) -> Gateway {
        let (child, ready) = fleet::spawn_serve_with(
            [
                "--config".as_ref(),
                config.as_os_str(),
                "--driver".as_ref(),
                driver.as_ref(),
            ],
            &[("RUST_LOG", "fleetgate=debug")],
            &dir.path().join("gateway.log"),
            configure,
        );
        let field = |name: &str| ready.addr(name);
        Gateway {
            child: fleet::KillOnDrop(child),
            https: field("https"),
            http: field("http"),
            admin: field("admin"),
            dir,
            pki,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// Resident memory of the gateway process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// A TLS connection with alice's client certificate.
    pub async fn tls(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.https).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        tokio_rustls::TlsConnector::from(self.pki.client_config(true))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap()
    }

    /// A TLS connection with alice's client certificate that negotiated ALPN `h2`.
    pub async fn tls_h2(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut config = (*self.pki.client_config(true)).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = TcpStream::connect(self.https).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        tls
    }

    /// A plaintext connection to the benchmark listener.
    pub async fn plain(&self) -> TcpStream {
        TcpStream::connect(self.http).await.unwrap()
    }

    /// A TLS connection (alice) that has sent `request` (raw bytes); reading the answer is the
    /// caller's.
    pub async fn tls_sent(&self, request: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        sent(self.tls().await, request).await
    }

    /// A TLS connection (alice) that has sent `GET {path}` (keep-alive, no body); reading the
    /// answer (a watch's head and events, say) is the caller's.
    pub async fn tls_get(&self, path: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
        self.tls_sent(&get_request(path)).await
    }

    /// [`Gateway::tls_get`] on the plaintext listener.
    pub async fn plain_get(&self, path: &str) -> TcpStream {
        sent(self.plain().await, &get_request(path)).await
    }

    /// `GET {path}` with `Connection: close` on a new TLS connection (alice): the response.
    pub async fn https_get(&self, path: &str) -> Response {
        exchange(self.tls().await, &get_closing_request(path))
            .await
            .unwrap_or_else(|| panic!("no response to GET {path}"))
    }

    /// `GET {path}` with `Connection: close` on a new plaintext connection: the response.
    pub async fn http_get(&self, path: &str) -> Response {
        exchange(self.plain().await, &get_closing_request(path))
            .await
            .unwrap_or_else(|| panic!("no response to GET {path}"))
    }
}

/// `stream` once it has sent `request`.
async fn sent<S: AsyncWrite + Unpin>(mut stream: S, request: &[u8]) -> S {
    stream.write_all(request).await.unwrap();
    stream
}

/// `GET {path}` to the gateway (`Host: gw`), keep-alive, no body.
fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n").into_bytes()
}

/// `GET {path}` to the gateway (`Host: gw`) with `Connection: close`, no body.
fn get_closing_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").into_bytes()
}

/// An h2 connection to the gateway with the client certificate (alice); its driver runs as a
/// tokio task. As Go's transport does: a connection window far larger than a stream's, so one
/// stream the application does not read cannot use up the whole connection's window.
pub async fn h2_client(gw: &Gateway) -> h2::client::SendRequest<bytes::Bytes> {
    let tls = gw.tls_h2().await;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(64 * 1024)
        .initial_connection_window_size(64 * 1024 * 1024)
        .handshake::<_, bytes::Bytes>(tls)
        .await
        .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// An h2 request head for the gateway (`https://gw{path}`), no body.
pub fn h2_request(method: &str, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .uri(format!("https://gw{path}"))
        .body(())
        .unwrap()
}

/// Sends `GET {path}` (no body) on `client` once it is ready; the response to come.
pub async fn h2_send_get(
    client: &h2::client::SendRequest<bytes::Bytes>,
    path: &str,
) -> h2::client::ResponseFuture {
    let mut sender = client.clone().ready().await.expect("h2 connection ready");
    sender
        .send_request(h2_request("GET", path), true)
        .unwrap()
        .0
}

/// `GET {path}` on `client`: the response head (waited for at most 30 s); its body is the
/// caller's to read or to hold unread.
pub async fn h2_get(
    client: &h2::client::SendRequest<bytes::Bytes>,
    path: &str,
) -> http::Response<h2::RecvStream> {
    let response = h2_send_get(client, path).await;
    tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .unwrap_or_else(|_| panic!("no h2 response to GET {path} within 30 s"))
        .unwrap_or_else(|e| panic!("h2 GET {path}: {e}"))
}

/// An h2 response's status and its whole body (read as [`read_h2_body`] does).
pub async fn h2_answer(response: http::Response<h2::RecvStream>) -> (u16, Vec<u8>) {
    let code = response.status().as_u16();
    (code, read_h2_body(response.into_body()).await)
}

/// Reads a whole h2 response body, releasing flow-control capacity as it goes.
pub async fn read_h2_body(mut body: h2::RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.expect("body data");
        let _ = body.flow_control().release_capacity(data.len());
        out.extend_from_slice(&data);
    }
    out
}

/// Starts an upstream and a gateway in front of it (driver `epoll` or `uring`).
pub async fn setup(driver: &str) -> (Upstream, Gateway) {
    setup_with_connect_timeout(driver, "0.5").await
}

/// Like [`setup`], with `connectTimeoutSeconds` set to `seconds` (tests that dial hundreds of
/// member connections at once on a debug build need more than the default 0.5 s).
pub async fn setup_with_connect_timeout(driver: &str, seconds: &str) -> (Upstream, Gateway) {
    setup_with_config(driver, |text| {
        text.replace(
            "connectTimeoutSeconds: 0.5",
            &format!("connectTimeoutSeconds: {seconds}"),
        )
    })
    .await
}

/// Like [`setup`], with the Gateway object's text (see [`write_config`]) passed through `edit`
/// before the gateway starts.
pub async fn setup_with_config(
    driver: &str,
    edit: impl FnOnce(String) -> String,
) -> (Upstream, Gateway) {
    setup_with(driver, edit, |_| {}).await
}

/// Like [`setup_with_config`], with the `fleetgate serve` command adjusted by `configure`.
pub async fn setup_with(
    driver: &str,
    edit: impl FnOnce(String) -> String,
    configure: impl FnOnce(&mut std::process::Command),
) -> (Upstream, Gateway) {
    setup_files(driver, edit, |text| text, configure).await
}

/// A self-signed CA named `common_name`, to sign serving and client certificates with.
pub fn test_ca(common_name: &str) -> rcgen::CertifiedIssuer<'static, KeyPair> {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap()
}

/// A client certificate `ca` signed for `common_name` in `organization`: PEM, and its key's.
pub fn client_cert(
    ca: &rcgen::CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    organization: &str,
) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, organization);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Like [`setup`], with the test clients' resource grant (every verb) replaced by `rules` (YAML
/// rule items at the rules list's indentation); the non-resource grant stays.
pub async fn setup_with_rules(driver: &str, rules: &str) -> (Upstream, Gateway) {
    let grant = |text: String| {
        let every_verb = "    - verbs: [get, list, watch, create, update, patch, delete, deletecollection, exec, attach, portforward, proxy]\n";
        assert!(text.contains(every_verb));
        text.replace(every_verb, rules)
    };
    setup_files(driver, |text| text, grant, |_| {}).await
}

/// The recording member, and the gateway on [`write_config`]'s files, the Gateway object's text
/// passed through `edit_gateway` and the clusters' and policy's through `edit_clusters`.
async fn setup_files(
    driver: &str,
    edit_gateway: impl FnOnce(String) -> String,
    edit_clusters: impl FnOnce(String) -> String,
    configure: impl FnOnce(&mut std::process::Command),
) -> (Upstream, Gateway) {
    let upstream = Upstream::start().await;
    let stalled = silent_listener().await;
    let pki = Arc::new(Pki::generate());
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &pki, upstream.address, stalled);
    edit_file(&dir.path().join("gateway.yaml"), edit_gateway);
    edit_file(&dir.path().join("clusters.yaml"), edit_clusters);
    let gateway =
        tokio::task::block_in_place(|| Gateway::start_with(&config, driver, dir, pki, configure));
    (upstream, gateway)
}

/// Rewrites the text of the file at `path` with `edit`.
fn edit_file(path: &Path, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, edit(text)).unwrap();
}

/// The drivers every socket-level test runs under.
pub const DRIVERS: [&str; 2] = ["epoll", "uring"];

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub code: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        let prefix = format!("{}:", name.to_ascii_lowercase());
        self.head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with(&prefix)
                .then(|| l[prefix.len()..].trim().to_string())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads one response (Content-Length, chunked with the framing removed, or until close).
/// `None` if the connection closed before a head.
pub async fn read_response<S: AsyncRead + Unpin>(
    stream: &mut S,
    carry: &mut Vec<u8>,
) -> Option<Response> {
    loop {
        if let Some(end) = carry.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&carry[..end + 4]).into_owned();
            carry.drain(..end + 4);
            let code: u16 = head.split(' ').nth(1)?.parse().ok()?;
            if (100..200).contains(&code) {
                continue;
            }
            let lower = head.to_ascii_lowercase();
            let mut body = Vec::new();
            if let Some(len) = content_length(&lower) {
                while carry.len() < len {
                    if !fill(stream, carry).await {
                        break;
                    }
                }
                body = carry.drain(..len.min(carry.len())).collect();
            } else if lower.contains("transfer-encoding: chunked") {
                loop {
                    let line_end = loop {
                        if let Some(p) = carry.windows(2).position(|w| w == b"\r\n") {
                            break p;
                        }
                        if !fill(stream, carry).await {
                            return Some(Response { code, head, body });
                        }
                    };
                    let size_text = String::from_utf8_lossy(&carry[..line_end]).into_owned();
                    let size =
                        usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                            .unwrap();
                    while carry.len() < line_end + 2 + size + 2 {
                        if !fill(stream, carry).await {
                            return Some(Response { code, head, body });
                        }
                    }
                    body.extend_from_slice(&carry[line_end + 2..line_end + 2 + size]);
                    carry.drain(..line_end + 2 + size + 2);
                    if size == 0 {
                        break;
                    }
                }
            } else if !(code == 204 || code == 304) {
                while fill(stream, carry).await {}
                body = std::mem::take(carry);
            }
            return Some(Response { code, head, body });
        }
        if !fill(stream, carry).await {
            return None;
        }
    }
}

async fn fill<S: AsyncRead + Unpin>(stream: &mut S, carry: &mut Vec<u8>) -> bool {
    let mut chunk = vec![0u8; 64 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            carry.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// Sends `request` on a fresh connection and reads one response.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
) -> Option<Response> {
    stream.write_all(request).await.ok()?;
    stream.flush().await.ok()?;
    let mut carry = Vec::new();
    read_response(&mut stream, &mut carry).await
}
