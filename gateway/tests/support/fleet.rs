//! The simulated fleet (a `fleetgate-loadtest sim` child, as `fleetgate demo` runs it: the gateway
//! crate never links the simulated fleet) with a real `fleetgate serve` child in front of it:
//! starting both, parsing the `ready` lines, killing the gateway on drop before the members stop,
//! and the small clients tests use on it (the admin listener, the fleet's `admin` TLS identity,
//! the rustls client configuration the harness's own TLS clients are built with).
//!
//! It never sleeps for readiness (the `ready` line is the signal) and binds only 127.0.0.1:0.
//! Used by the kubectl, kubectl_streams, reload, drain, identity, egress_proxy, one_pass and
//! audit test binaries, and by the tunnel binaries; [`spawn_serve`] and [`client_tls_config`]
//! also by [`super::Gateway`] and [`super::Pki`].

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first stdout line of `fleetgate serve`: `ready https=ADDR admin=ADDR ...`.
#[derive(Debug, Clone)]
pub struct ReadyLine(pub String);

impl ReadyLine {
    /// The value of `name=...`, if the line has it.
    pub fn field(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}=");
        self.0
            .split_whitespace()
            .find_map(|f| f.strip_prefix(prefix.as_str()))
    }

    /// The address of listener `name` (`https`, `http`, `admin`, or a named one).
    pub fn addr(&self, name: &str) -> SocketAddr {
        self.field(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.0))
            .parse()
            .unwrap()
    }
}

/// Starts `fleetgate serve ARGS` with stderr in `log` and waits for its `ready` line. A child
/// that prints anything else is killed and the test fails with its log.
pub fn spawn_serve<I, S>(args: I, env: &[(&str, &str)], log: &Path) -> (Child, ReadyLine)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    spawn_serve_with(args, env, log, |_| {})
}

/// Like [`spawn_serve`], with the command adjusted by `configure` before it starts (say, a
/// lower limit on open files).
pub fn spawn_serve_with<I, S>(
    args: I,
    env: &[(&str, &str)],
    log: &Path,
    configure: impl FnOnce(&mut Command),
) -> (Child, ReadyLine)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let stderr = std::fs::File::create(log).unwrap();
    let mut command = Command::new(fleetgate_binary());
    command.arg("serve").args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    configure(&mut command);
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    // Only the first line: the rest of stdout is never written (logs go to stderr).
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if !line.contains("ready") {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "gateway did not start: {line:?}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    (child, ReadyLine(line))
}

/// A child process killed (and reaped) when dropped, so a failed assertion never leaves a
/// gateway or a fleet running. Derefs to the [`Child`] (its pid, `try_wait`, its pipes).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// The `fleetgate` binary under test: `FLEETGATE_UNDER_TEST` when set (to run today's tests
/// against another build, say the commit before a fix, to see them fail there), else the one
/// cargo built for these tests.
pub fn fleetgate_binary() -> PathBuf {
    std::env::var_os("FLEETGATE_UNDER_TEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fleetgate")))
}

/// The `fleetgate-loadtest` binary: `FLEETGATE_LOADTEST`, else the one cargo built beside
/// `fleetgate` (`cargo test --workspace` builds every binary of the workspace).
pub fn loadtest_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("FLEETGATE_LOADTEST") {
        return PathBuf::from(path);
    }
    let beside = Path::new(env!("CARGO_BIN_EXE_fleetgate")).with_file_name("fleetgate-loadtest");
    assert!(
        beside.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (or build it with `cargo build -p fleetgate-loadtest`)",
        beside.display()
    );
    beside
}

/// Starts `fleetgate-loadtest sim` writing its files to `dir`, its gateway to bind a free port,
/// and waits for its `ready` line (the sim's readiness signal).
fn spawn_sim(
    mut launcher: Command,
    dir: &Path,
    log: &Path,
    clusters: usize,
    objects: usize,
    extra: &[&str],
) -> KillOnDrop {
    let log = std::fs::File::create(log).unwrap();
    let mut child = KillOnDrop(
        launcher
            .arg("sim")
            .arg("--dir")
            .arg(dir)
            .args(["--clusters", &clusters.to_string()])
            .args(["--objects", &objects.to_string()])
            .args(["--gateway-listen", UNBOUND_GATEWAY])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("ready"));
    assert!(
        ready.is_some(),
        "the simulated fleet exited before it was ready"
    );
    // Keep draining stdout so the sim never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

/// A `fleetgate serve` child (killed when dropped) and its `ready` line.
pub struct ServeProcess {
    pub child: KillOnDrop,
    pub ready: ReadyLine,
}

/// The simulated fleet in a temporary directory, and the gateway once [`Fleet::serve`] ran.
pub struct Fleet {
    /// Declared first so it is dropped (killed) before the members it talks to stop.
    pub gateway: Option<ServeProcess>,
    /// The simulated members (`fleetgate-loadtest sim`), killed after the gateway.
    pub sim: Option<KillOnDrop>,
    /// A runtime for the tests' own async helpers (proxies, raw clients).
    pub runtime: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
    /// Where the fleet wrote its files (the directory itself, or a subdirectory of it).
    pub fleet_dir: PathBuf,
    /// `gateway.kubeconfig` as the fleet wrote it, its server `https://127.0.0.1:0/...`: every
    /// start of the gateway writes it anew with the address the listener got.
    kubeconfig_template: String,
}

/// The gateway address the fleet's Gateway and `gateway.kubeconfig` are written with: the
/// gateway binds a free port when it starts, so no port is picked ahead and lost to a race.
const UNBOUND_GATEWAY: &str = "127.0.0.1:0";

impl Drop for Fleet {
    fn drop(&mut self) {
        drop(self.gateway.take());
        drop(self.sim.take());
    }
}

impl Fleet {
    /// The value of `key` in the simulated fleet's `clusters/CLUSTER.yaml` (its `server`, its
    /// `token`), trimmed.
    pub fn cluster_field(&self, cluster: &str, key: &str) -> String {
        let path = self.fleet_path(&format!("clusters/{cluster}.yaml"));
        let yaml = std::fs::read_to_string(&path).unwrap();
        let value = yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {key} in {}", path.display()));
        value.trim().to_owned()
    }

    /// The fleet's kubeconfig through the gateway: a context per member, and `fleet`.
    pub fn gateway_kubeconfig(&self) -> PathBuf {
        self.path("gateway.kubeconfig")
    }

    /// kubectl through the gateway with `context`; its output, whatever the exit code.
    pub fn kubectl_output(&self, context: &str, args: &[&str]) -> std::process::Output {
        super::kubectl::kubectl(&self.gateway_kubeconfig(), context, args)
    }

    /// The stdout of a kubectl run through the gateway that must succeed (the failure message
    /// has the gateway log's tail).
    pub fn kubectl_ok(&self, context: &str, args: &[&str]) -> String {
        let out = self.kubectl_output(context, args);
        super::kubectl::succeeded(
            out,
            &format!("--context {context} {args:?}"),
            &self.log_tail(20),
        )
    }

    /// The stdout of a kubectl run straight to `member` as its admin, which must succeed.
    pub fn direct_ok(&self, member: &str, args: &[&str]) -> String {
        let out = super::kubectl::kubectl(&self.fleet_path("kubeconfig"), member, args);
        super::kubectl::succeeded(out, &format!("{member} {args:?}"), "")
    }

    /// `clusters` simulated members with `objects` objects each; the fleet's files (Gateway,
    /// Clusters, policies, PKI, kubeconfigs) are written to the temporary directory itself.
    pub fn sim(clusters: usize, objects: usize) -> Fleet {
        Fleet::sim_in("", clusters, objects)
    }

    /// Like [`Fleet::sim`], with the fleet's files in `subdir` of the temporary directory
    /// (tests that write their own gateway configuration beside it).
    pub fn sim_in(subdir: &str, clusters: usize, objects: usize) -> Fleet {
        Fleet::sim_with(subdir, clusters, objects, &[])
    }

    /// Like [`Fleet::sim_in`], with more arguments for `fleetgate-loadtest sim` (say, a short
    /// `--history-window`).
    pub fn sim_with(subdir: &str, clusters: usize, objects: usize, extra: &[&str]) -> Fleet {
        Fleet::sim_launched(
            Command::new(loadtest_binary()),
            clusters,
            objects,
            subdir,
            extra,
        )
    }

    /// Like [`Fleet::sim_with`], with `launcher` as the `fleetgate-loadtest` command (say, the
    /// binary run inside a network namespace: its members then listen on that namespace's
    /// loopback only).
    pub fn sim_launched(
        launcher: Command,
        clusters: usize,
        objects: usize,
        subdir: &str,
        extra: &[&str],
    ) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let fleet_dir = dir.path().join(subdir);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sim = spawn_sim(
            launcher,
            &fleet_dir,
            &dir.path().join("sim.log"),
            clusters,
            objects,
            extra,
        );
        let kubeconfig_template =
            std::fs::read_to_string(fleet_dir.join("gateway.kubeconfig")).unwrap();
        Fleet {
            gateway: None,
            sim: Some(sim),
            runtime,
            dir,
            fleet_dir,
            kubeconfig_template,
        }
    }

    /// Starts `fleetgate serve --config DIR ARGS` on the fleet's directory (`RUST_LOG` set
    /// when given) and waits for its `ready` line; a gateway already running is killed first.
    pub fn serve(&mut self, args: &[&str], rust_log: Option<&str>) {
        let config = self.fleet_dir.clone();
        self.serve_config(&config, args, rust_log);
    }

    /// `serve --config CONFIG --workers 1 --management-kubeconfig ... --management-context
    /// member1` and `extra`: the fleet's member1 is the management cluster.
    pub fn serve_with_management(&mut self, config: &Path, extra: &[&str], rust_log: Option<&str>) {
        let kubeconfig = self.fleet_path("kubeconfig");
        let mut args = vec![
            "--workers",
            "1",
            "--management-kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--management-context",
            "member1",
        ];
        args.extend_from_slice(extra);
        self.serve_config(config, &args, rust_log);
    }

    /// Like [`Fleet::serve`] with `--config config` (a file or another directory).
    pub fn serve_config(&mut self, config: &Path, args: &[&str], rust_log: Option<&str>) {
        drop(self.gateway.take());
        let mut all: Vec<&OsStr> = vec![OsStr::new("--config"), config.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        let env: Vec<(&str, &str)> = rust_log.map(|l| ("RUST_LOG", l)).into_iter().collect();
        let (child, ready) = spawn_serve(all, &env, &self.path("gateway.log"));
        // The fleet's kubeconfig points at the listener as bound (as `fleetgate demo` does).
        if let Some(https) = ready.field("https") {
            let kubeconfig = self.kubeconfig_template.replace(
                &format!("https://{UNBOUND_GATEWAY}/"),
                &format!("https://{https}/"),
            );
            std::fs::write(self.fleet_dir.join("gateway.kubeconfig"), kubeconfig).unwrap();
        }
        self.gateway = Some(ServeProcess {
            child: KillOnDrop(child),
            ready,
        });
    }

    /// A path under the temporary directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The fleet's directory (its Gateway, clusters/, pki/, users/, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.fleet_dir
    }

    /// Puts `fleet: {FIELDS}` (the fleet view's settings, say `createIn: member2`) first in the
    /// spec of the fleet's `gateway.yaml`, the rest of the file as it was.
    pub fn set_fleet_spec(&self, fields: &str) {
        let gateway = self.fleet_path("gateway.yaml");
        let yaml = std::fs::read_to_string(&gateway).unwrap();
        assert!(yaml.contains("\nspec:\n"), "{yaml}");
        let with = yaml.replace("\nspec:\n", &format!("\nspec:\n  fleet: {{{fields}}}\n"));
        std::fs::write(&gateway, with).unwrap();
    }

    /// Rewrites the fleet's `gateway.yaml` with `edit` (read, parsed, edited, written back).
    pub fn edit_gateway(&self, edit: impl FnOnce(&mut serde_yaml::Value)) {
        edit_yaml(&self.fleet_path("gateway.yaml"), edit);
    }

    /// A path under the fleet's directory.
    pub fn fleet_path(&self, rel: &str) -> PathBuf {
        self.fleet_dir.join(rel)
    }

    pub fn ready(&self) -> &ReadyLine {
        &self
            .gateway
            .as_ref()
            .expect("the gateway is not running")
            .ready
    }

    /// The gateway's TLS listener.
    pub fn https(&self) -> SocketAddr {
        self.ready().addr("https")
    }

    /// The gateway's admin listener.
    pub fn admin(&self) -> SocketAddr {
        self.ready().addr("admin")
    }

    /// The whole gateway log (its stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("gateway.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the gateway log, oldest first (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// How many exec / attach / port-forward sessions of `namespace/pod` the simulated member of
    /// `context` has open now (its `/metrics`, read straight from the member as `admin`).
    pub fn member_stream_sessions(&self, context: &str, namespace: &str, pod: &str) -> usize {
        let out = super::kubectl::kubectl(
            &self.fleet_path("kubeconfig"),
            context,
            &["get", "--raw", "/metrics"],
        );
        assert!(
            out.status.success(),
            "member /metrics: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let series =
            format!("fleetgate_sim_stream_sessions{{namespace=\"{namespace}\",pod=\"{pod}\"}} ");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map_or(0, |count| count.trim().parse().unwrap())
    }

    /// A GET of `path` on the gateway's HTTPS listener as the fleet's `admin`
    /// (`Connection: close`); the whole response, head included.
    pub fn https_get(&self, path: &str) -> String {
        super::pull::admin_get_at(self.dir(), self.https(), path)
    }

    /// A GET of `path` on the admin listener; the whole response, head included.
    pub fn admin_get(&self, path: &str) -> String {
        admin_get(self.admin(), path)
    }

    /// Polls `path` on the admin listener every 10 ms until its response contains `needle`;
    /// the response. Fails the test after `within` with `what` and the last response.
    pub fn admin_until(&self, path: &str, needle: &str, within: Duration, what: &str) -> String {
        let start = Instant::now();
        loop {
            let text = self.admin_get(path);
            if text.contains(needle) {
                return text;
            }
            assert!(start.elapsed() < within, "{what}: {text}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A series of the gateway's `/metrics` (`name{labels}`), `None` when absent.
    pub fn metric(&self, series: &str) -> Option<i64> {
        let metrics = self.admin_get("/metrics");
        let prefix = format!("{series} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
    }

    /// An HTTP/1.1 TLS client of the gateway on `tcp` as the fleet's `admin` (its reads time
    /// out after 30 s).
    pub fn admin_https(
        &self,
        tcp: std::net::TcpStream,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        admin_https(&self.fleet_dir, tcp)
    }

    /// [`Fleet::admin_https`] on a new connection to the gateway's TLS listener.
    pub fn admin_connection(
        &self,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        self.admin_https(std::net::TcpStream::connect(self.https()).unwrap())
    }

    /// A TLS client of the gateway as the fleet's `admin` user (allowed everything by the
    /// fleet's policies), trusting the gateway CA, offering `alpn`.
    pub fn admin_tls_config(&self, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
        admin_tls_config(&self.fleet_dir, alpn)
    }
}

/// A Cluster file's text with its bearer token replaced by one the member refuses (a spec
/// change of that cluster alone).
pub fn with_refused_token(cluster_yaml: &str) -> String {
    let token_line = cluster_yaml
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .expect("a Cluster with spec.credentials.token");
    let indent = &token_line[..token_line.len() - token_line.trim_start().len()];
    cluster_yaml.replace(token_line, &format!("{indent}token: not-a-valid-token"))
}

/// A GET of `path` on an admin listener (`Connection: close`); the whole response.
pub fn admin_get(admin: SocketAddr, path: &str) -> String {
    raw_get(admin, "admin", path, "")
}

/// Rewrites the YAML file at `path` with `edit` (read, parsed, edited, written back).
pub fn edit_yaml(path: &Path, edit: impl FnOnce(&mut serde_yaml::Value)) {
    let mut value: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_yaml::to_string(&value).unwrap()).unwrap();
}

/// A plaintext HTTP/1.1 GET of `path` with `Connection: close` and `headers` (whole lines,
/// each ending in `\r\n`); the whole response as the gateway wrote it, head included.
pub fn raw_get(address: SocketAddr, host: &str, path: &str, headers: &str) -> String {
    let stream = std::net::TcpStream::connect(address).expect("listener");
    get_closing(stream, host, path, headers)
}

/// [`raw_get`] over a connection already made (a TLS one, say): the whole response.
pub fn get_closing(mut stream: impl Read + Write, host: &str, path: &str, headers: &str) -> String {
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The `admin` user of a fleet directory's gateway CA, trusting that CA, offering `alpn`.
pub fn admin_tls_config(fleet_dir: &Path, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    tls_config_as(fleet_dir, "users/admin.crt", "users/admin.key", alpn)
}

/// A TLS client with the certificate and key files `cert` and `key` of a fleet directory,
/// trusting the gateway CA, offering `alpn`.
pub fn tls_config_as(
    fleet_dir: &Path,
    cert: &str,
    key: &str,
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    let read = |p: &str| std::fs::read(fleet_dir.join(p)).unwrap();
    client_tls_config(
        &read("pki/gateway-ca.crt"),
        Some((&read(cert), &read(key))),
        alpn,
    )
}

/// A rustls client (the gateway's crypto provider, its default protocol versions) trusting the
/// CA certificates in `ca_pem`, presenting `identity` (certificate and key, PEM) when given,
/// offering `alpn`.
pub fn client_tls_config(
    ca_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in fleetgate_config_watcher::parse_certs(ca_pem).unwrap() {
        roots.add(c).unwrap();
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(fleetgate_config_watcher::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                fleetgate_config_watcher::parse_certs(cert).unwrap(),
                fleetgate_config_watcher::parse_key(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// An HTTP/1.1 TLS client of a gateway on `tcp` (its reads time out after 30 s), as the
/// `admin` of the fleet in `fleet_dir`.
pub fn admin_https(
    fleet_dir: &Path,
    tcp: std::net::TcpStream,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let conn = rustls::ClientConnection::new(
        admin_tls_config(fleet_dir, b"http/1.1"),
        "127.0.0.1".try_into().unwrap(),
    )
    .unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// `fleetgate_sim_open_watches{resource=...}` (the watches a simulated member holds) from kubectl's
/// answer to `get --raw /metrics`, which must have succeeded; 0 when the series is absent.
pub fn sim_open_watches(metrics: &std::process::Output, resource: &str) -> usize {
    assert!(
        metrics.status.success(),
        "{}",
        String::from_utf8_lossy(&metrics.stderr)
    );
    let series = format!("fleetgate_sim_open_watches{{resource=\"{resource}\"}} ");
    String::from_utf8_lossy(&metrics.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}
