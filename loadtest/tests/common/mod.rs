//! Shared harness of the loadtest crate's integration tests (used by the sim API tests, the
//! streaming tests and the lead's gateway tests): starts a simulated fleet in-process on a
//! background tokio runtime in a temporary directory, runs `/usr/bin/kubectl` against it with a
//! private cache directory, builds kube-rs clients and raw HTTPS requests for a member, and waits
//! for conditions with a deadline instead of sleeping.
//!
//! Every helper is bounded in time; nothing binds a fixed port.

#![allow(dead_code)] // each test binary uses a different subset of the harness

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fleetgate_loadtest::sim::{self, FleetHandle, FleetOptions, SimTuning};

/// The kubectl every test runs.
pub const KUBECTL: &str = "/usr/bin/kubectl";

/// A fleet running on its own runtime thread, with its files in a temporary directory.
pub struct TestFleet {
    /// Kept alive for as long as the fleet runs; removed on drop.
    pub tempdir: tempfile::TempDir,
    pub runtime: tokio::runtime::Runtime,
    handle: Option<FleetHandle>,
}

impl TestFleet {
    /// Starts `clusters` members with no load objects and no churn.
    pub fn start(clusters: usize) -> Self {
        Self::start_with(clusters, 0, 0.0, SimTuning::default())
    }

    /// Starts a fleet with the given knobs.
    pub fn start_with(
        clusters: usize,
        objects: usize,
        churn_per_sec: f64,
        tuning: SimTuning,
    ) -> Self {
        let tempdir = tempfile::tempdir().expect("tempdir");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let opts = FleetOptions {
            dir: tempdir.path().join("fleet"),
            clusters,
            objects,
            churn_per_sec,
            gateway_listen: None,
        };
        let handle = runtime
            .block_on(sim::start_fleet_with_tuning(opts, tuning))
            .expect("start the simulated fleet");
        Self {
            tempdir,
            runtime,
            handle: Some(handle),
        }
    }

    pub fn handle(&self) -> &FleetHandle {
        self.handle.as_ref().expect("fleet running")
    }

    /// `DIR` of the fleet (kubeconfig, clusters/, users/, pki/ ...).
    pub fn dir(&self) -> PathBuf {
        self.handle().dir().to_path_buf()
    }

    /// `DIR/kubeconfig` (contexts member1..., as admin).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir().join("kubeconfig")
    }

    /// `https://127.0.0.1:PORT` of member `index` (0-based).
    pub fn member_url(&self, index: usize) -> String {
        format!("https://{}", self.handle().member_addrs()[index])
    }

    /// The token of a test user (`admin`, `alice`, `bob`, `carol`).
    pub fn token(&self, user: &str) -> String {
        std::fs::read_to_string(self.dir().join(format!("users/{user}.token")))
            .expect("user token")
            .trim()
            .to_string()
    }

    /// PEM of the fleet CA (members' serving certificates).
    pub fn fleet_ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir().join("pki/fleet-ca.crt")).expect("fleet CA")
    }

    /// Runs kubectl with `DIR/kubeconfig` and a private cache directory.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.kubeconfig(), &self.cache_dir(), args, &[])
    }

    /// Runs kubectl with extra environment variables.
    pub fn kubectl_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        kubectl_with(&self.kubeconfig(), &self.cache_dir(), args, env)
    }

    /// The first member as a raw client meets it: its address, the fleet CA (PEM) that signed
    /// its serving certificate, and the `admin` user's bearer token.
    pub fn first_member(&self) -> (std::net::SocketAddr, String, String) {
        let addr = self.handle().member_addrs()[0];
        (addr, self.fleet_ca_pem(), self.token("admin"))
    }

    /// `kubectl apply -f -` of `yaml`: its stdout (panics with stderr when it fails).
    pub fn apply(&self, yaml: &str) -> String {
        ok_stdout(&kubectl_stdin(self, &["apply", "-f", "-"], yaml))
    }

    /// Waits (up to 10 s) until each CustomResourceDefinition named is Established.
    pub fn wait_established(&self, crds: &[&str]) {
        let crds: Vec<String> = crds.iter().map(|name| format!("crd/{name}")).collect();
        let mut args = vec!["wait", "--for", "condition=established", "--timeout=10s"];
        args.extend(crds.iter().map(String::as_str));
        ok_stdout(&self.kubectl(&args));
    }

    /// `kubectl --kubeconfig DIR/kubeconfig --cache-dir CACHE`, to add arguments and stdio to.
    pub fn kubectl_command(&self) -> Command {
        kubectl_command(&self.kubeconfig(), &self.cache_dir())
    }

    /// Starts kubectl without waiting (for `get -w`, `logs -f`, `port-forward`).
    pub fn kubectl_spawn(&self, args: &[&str]) -> std::process::Child {
        self.kubectl_command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl")
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.tempdir.path().join("kube-cache")
    }
}

impl Drop for TestFleet {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.runtime.block_on(handle.shutdown());
        }
    }
}

/// A kube-rs client from the kubeconfig at `path` (its current context).
pub async fn kube_client(path: &Path) -> kube::Client {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// `kubectl --kubeconfig KUBECONFIG --cache-dir CACHE_DIR`, to add arguments and stdio to.
pub fn kubectl_command(kubeconfig: &Path, cache_dir: &Path) -> Command {
    let mut cmd = Command::new(KUBECTL);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache_dir);
    cmd
}

/// Runs kubectl with the given kubeconfig and cache directory.
pub fn kubectl_with(
    kubeconfig: &Path,
    cache_dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    kubectl_command(kubeconfig, cache_dir)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl")
}

/// Runs kubectl feeding `stdin`.
pub fn kubectl_stdin(fleet: &TestFleet, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = fleet
        .kubectl_command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("kubectl output")
}

/// stdout of a successful kubectl run (panics with stderr otherwise).
pub fn ok_stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "kubectl failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that kubectl's stderr says `expected` (and shows all of it when it does not).
#[track_caller]
pub fn assert_stderr_has(output: &Output, expected: &str) {
    let err = stderr(output);
    assert!(err.contains(expected), "stderr lacks {expected:?}:\n{err}");
}

/// Polls `condition` every 20 ms until it returns Some or `deadline` passes (then panics with
/// `what`).
pub fn wait_for<T>(what: &str, deadline: Duration, mut condition: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = condition() {
            return value;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads lines from a child's stdout on a thread, so a test can wait for a line with a deadline.
pub struct LineReader {
    rx: std::sync::mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl LineReader {
    pub fn new(stdout: impl std::io::Read + Send + 'static) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until a line satisfying `pred` arrives (returns it) or the deadline passes (panics).
    pub fn wait_line(
        &mut self,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "timed out waiting for {what}; lines so far: {:#?}",
                    self.seen
                ),
            }
        }
    }
}

/// A raw HTTPS client (reqwest-free) for checks kubectl cannot make: a hyper client over
/// rustls trusting the fleet CA, authenticating with a bearer token.
pub mod raw {
    use std::sync::Arc;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use rustls_pki_types::ServerName;

    /// A connection to one member over HTTP/1.1 (or h2 with `h2: true`).
    pub async fn connect(
        addr: std::net::SocketAddr,
        ca_pem: &str,
        h2: bool,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        let der = pem_to_der(ca_pem);
        roots.add(der.into()).expect("CA");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = if h2 {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        connector
            .connect(
                ServerName::try_from("127.0.0.1").expect("name").to_owned(),
                tcp,
            )
            .await
            .expect("TLS")
    }

    fn pem_to_der(pem: &str) -> Vec<u8> {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .expect("PEM base64")
    }

    /// Sends one HTTP/1.1 request and returns the response with its body collected.
    pub async fn request(
        addr: std::net::SocketAddr,
        ca_pem: &str,
        req: http::Request<Full<Bytes>>,
    ) -> (http::response::Parts, Bytes) {
        let tls = connect(addr, ca_pem, false).await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.expect("send");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        (parts, body)
    }

    /// Sends one request and returns the head and the streaming body.
    pub async fn request_streaming(
        addr: std::net::SocketAddr,
        ca_pem: &str,
        req: http::Request<Full<Bytes>>,
    ) -> http::Response<hyper::body::Incoming> {
        let tls = connect(addr, ca_pem, false).await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        sender.send_request(req).await.expect("send")
    }

    /// A GET with a bearer token.
    pub fn get(path: &str, token: &str) -> http::Request<Full<Bytes>> {
        with_body("GET", path, token, None, Bytes::new())
    }

    /// A GET of the absolute `url` with a bearer token, for an h2 connection (the authority
    /// comes from the URL; no Host header).
    pub fn h2_get(url: String, token: &str) -> http::Request<Full<Bytes>> {
        http::Request::get(url)
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .expect("request")
    }

    /// A `method` request for `path` with a bearer token and `body`, of `content_type` if given.
    pub fn with_body(
        method: &str,
        path: &str,
        token: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> http::Request<Full<Bytes>> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"));
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        builder.body(Full::new(body.into())).expect("request")
    }

    /// A POST of a JSON `body` with a bearer token.
    pub fn post_json(
        path: &str,
        token: &str,
        body: impl Into<Bytes>,
    ) -> http::Request<Full<Bytes>> {
        with_body("POST", path, token, Some("application/json"), body)
    }
}
