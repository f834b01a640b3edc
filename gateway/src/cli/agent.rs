//! `fleetgate agent`: runs beside a member cluster that the gateway cannot dial (pull mode) and
//! dials out instead: one TLS connection per gateway (`--gateway`, repeatable), authenticated by
//! the agent's certificate (`fleetgate certs issue-agent`: CN = the cluster, O =
//! `fleetgate:agents`), then h2 with roles reversed: the gateway opens a stream per member
//! connection it wants, and the agent carries each to the member's apiserver (`--kube-server`,
//! else the in-cluster service account's) and back, bytes as they are, with h2's per-stream flow
//! control between the two.
//!
//! A stream is one member connection for as long as it lives: the gateway pools its streams as it
//! pools direct connections, so an idle stream keeps its member connection (no dial per request),
//! and an upgrade (exec, attach, port-forward) gets a stream and a member connection of its own.
//! A stream may instead name an in-cluster service (the gateway's direct service path): the agent
//! serves only the services listed with `--allow-service NS/NAME:PORT[=HOST:PORT]`, dialing
//! `NAME.NS.svc:PORT` (or the given address) in plain TCP; any other is refused with a 403 and
//! never dialed.
//! Each tunnel is pinged every second and dropped when a PING goes unanswered for 3 s; it is
//! dialed again with exponential backoff and jitter. Prints one line containing `ready` once a
//! tunnel to every gateway is up. Gateway replicas are listed (`--gateway`, each dialed by its
//! name) or found in DNS (`--gateway-replicas`: one tunnel per address the name resolves to,
//! re-resolved every `--resolve-seconds`). tokio, h2 and tokio-rustls on one thread; each
//! stream carried without copies (`tunnel::carry`).
//! Never logs key material or the requests it carries.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use fleetgate_config_watcher::{crypto_provider, parse_certs, parse_key, parse_server};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::member::backoff::Backoff;
use crate::tunnel::carry::{self, MemberConn};
use crate::tunnel::wire;

/// Arguments of `fleetgate agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// A gateway's tunnel listener (`https://host:port` or `host:port`); repeatable, one tunnel
    /// each (a redial resolves the name again, so it may land on another replica behind it).
    #[arg(long = "gateway", required_unless_present = "gateway_replicas")]
    pub gateways: Vec<String>,
    /// A name whose every address is one gateway replica (a headless Service's, say), as
    /// `https://host:port`: one tunnel per address, the name resolved again every
    /// `--resolve-seconds`; repeatable. The replicas' serving certificate must name `host`.
    #[arg(long = "gateway-replicas")]
    pub gateway_replicas: Vec<String>,
    /// How often `--gateway-replicas` names are resolved again (0: only at the start).
    #[arg(long, default_value_t = 30)]
    pub resolve_seconds: u64,
    /// The cluster this agent serves; its certificate must name it.
    #[arg(long)]
    pub cluster: String,
    /// The agent's certificate (PEM), from `fleetgate certs issue-agent`.
    #[arg(long)]
    pub cert: PathBuf,
    /// The agent's key (PEM).
    #[arg(long)]
    pub key: PathBuf,
    /// The CA that signed the gateways' serving certificate.
    #[arg(long)]
    pub ca: PathBuf,
    /// The member's apiserver (default: the in-cluster service, KUBERNETES_SERVICE_HOST/PORT).
    #[arg(long)]
    pub kube_server: Option<String>,
    /// The CA of the member's apiserver (default in-cluster: the service account's ca.crt).
    #[arg(long)]
    pub kube_ca: Option<PathBuf>,
    /// An in-cluster service the gateway's direct service path may reach through this agent
    /// (`/clusters/CLUSTER/services/NS/NAME:PORT/...`): `NS/NAME:PORT`, dialed as
    /// `NAME.NS.svc:PORT`, or `NS/NAME:PORT=HOST:PORT` to dial that address instead. Repeatable;
    /// no other service is reachable through the agent (the default: none).
    #[arg(long = "allow-service", value_name = "NS/NAME:PORT[=HOST:PORT]")]
    pub allow_services: Vec<String>,
}

/// The services this agent serves (`--allow-service`), each with the address it dials.
#[derive(Debug, Default)]
struct AllowedServices {
    /// `NS/NAME:PORT` (as [`wire::ServiceRef`] prints it) -> `HOST:PORT`.
    by_service: std::collections::HashMap<String, String>,
}

impl AllowedServices {
    fn from_args(specs: &[String]) -> anyhow::Result<AllowedServices> {
        let mut allowed = AllowedServices::default();
        for spec in specs {
            let (service, address) = match spec.split_once('=') {
                Some((service, address)) => (service, Some(address)),
                None => (spec.as_str(), None),
            };
            let service = wire::ServiceRef::parse(service)
                .map_err(|e| anyhow!("--allow-service {spec:?}: {e}"))?;
            let address = match address {
                Some(address) => {
                    let (host, port) = address.rsplit_once(':').ok_or_else(|| {
                        anyhow!("--allow-service {spec:?}: the address is HOST:PORT")
                    })?;
                    if host.is_empty() || wire::parse_port(port).is_none() {
                        bail!("--allow-service {spec:?}: the address is HOST:PORT");
                    }
                    address.to_owned()
                }
                None => service.in_cluster_address(),
            };
            allowed.by_service.insert(service.to_string(), address);
        }
        Ok(allowed)
    }

    /// The address `service` is dialed at, if it is allowed.
    fn address(&self, service: &wire::ServiceRef<'_>) -> Option<&str> {
        self.by_service
            .get(&service.to_string())
            .map(String::as_str)
    }
}

/// Where the in-cluster service account keeps the apiserver's CA.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Dialing a gateway or the member: TCP and TLS.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect backoff: first delay, ceiling, and how long a tunnel must have lived for the next
/// failure to start from the first delay again.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// The member's apiserver as the agent dials it.
struct Member {
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// The services streams may name instead of the apiserver.
    services: AllowedServices,
}

impl Member {
    fn from_args(args: &AgentArgs) -> anyhow::Result<Member> {
        let (server, ca) = match &args.kube_server {
            Some(server) => (server.clone(), args.kube_ca.clone()),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .context("no --kube-server, and not in a cluster (KUBERNETES_SERVICE_HOST)")?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or("443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                (
                    format!("https://{host}:{port}"),
                    Some(args.kube_ca.clone().unwrap_or(IN_CLUSTER_CA.into())),
                )
            }
        };
        let target = parse_server(&server).map_err(|e| anyhow!("--kube-server: {e}"))?;
        if !target.path_prefix.is_empty() {
            bail!("--kube-server {server:?}: a path prefix is not supported");
        }
        let tls = if target.tls {
            let ca = ca.context("--kube-server is https: give its CA with --kube-ca")?;
            let roots = roots(&ca)?;
            let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(target.host.clone())
                .map_err(|e| anyhow!("--kube-server host {:?}: {e}", target.host))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        Ok(Member {
            host: target.host,
            port: target.port,
            tls,
            services: AllowedServices::from_args(&args.allow_services)?,
        })
    }

    /// A new connection to the member, within [`DIAL_TIMEOUT`].
    async fn dial(&self) -> anyhow::Result<MemberConn> {
        let attempt = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, anyhow::Error>(match &self.tls {
                None => MemberConn::Plain(tcp),
                Some((connector, name)) => {
                    MemberConn::Tls(Box::new(connector.connect(name.clone(), tcp).await?))
                }
            })
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt)
            .await
            .map_err(|_| anyhow!("connecting to {}:{} timed out", self.host, self.port))?
            .with_context(|| format!("connecting to {}:{}", self.host, self.port))
    }

    /// A new plain TCP connection to an allowed service, within [`DIAL_TIMEOUT`].
    async fn dial_service(&self, address: &str) -> anyhow::Result<MemberConn> {
        let attempt = async {
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(MemberConn::Plain(tcp))
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt)
            .await
            .map_err(|_| anyhow!("connecting to {address} timed out"))?
            .with_context(|| format!("connecting to {address}"))
    }
}

fn roots(path: &std::path::Path) -> anyhow::Result<rustls::RootCertStore> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in parse_certs(&pem).map_err(|e| anyhow!("{}: {e}", path.display()))? {
        roots
            .add(cert)
            .with_context(|| format!("{}", path.display()))?;
    }
    Ok(roots)
}

/// One gateway to keep a tunnel to.
struct Gateway {
    url: String,
    host: String,
    port: u16,
    name: ServerName<'static>,
}

fn parse_gateway(url: &str) -> anyhow::Result<Gateway> {
    let with_scheme = if url.contains("://") {
        url.to_owned()
    } else {
        format!("https://{url}")
    };
    let target = parse_server(&with_scheme).map_err(|e| anyhow!("--gateway: {e}"))?;
    if !target.tls {
        bail!("--gateway {url:?}: tunnels are TLS only (https)");
    }
    let name = ServerName::try_from(target.host.clone())
        .map_err(|e| anyhow!("--gateway host {:?}: {e}", target.host))?;
    Ok(Gateway {
        url: url.to_owned(),
        host: target.host,
        port: target.port,
        name,
    })
}

/// The cluster an agent certificate names (its CN), checked against `--cluster` before any dial:
/// the gateway refuses a mismatch anyway, and saying so here is clearer.
fn check_certificate(cert_pem: &[u8], cluster: &str) -> anyhow::Result<()> {
    let certs = parse_certs(cert_pem).map_err(|e| anyhow!("--cert: {e}"))?;
    let first = certs.first().context("--cert holds no certificate")?;
    let (_, parsed) = x509_parser::parse_x509_certificate(first)
        .map_err(|_| anyhow!("--cert does not parse as X.509"))?;
    let subject = parsed.subject();
    let names: Vec<&str> = subject
        .iter_common_name()
        .filter_map(|n| n.as_str().ok())
        .collect();
    let agent = subject
        .iter_organization()
        .any(|o| o.as_str() == Ok(wire::AGENT_ORGANIZATION));
    if names != [cluster] || !agent {
        bail!(
            "--cert is not an agent certificate for cluster {cluster:?} (CN {names:?}, \
             O={} {}): issue one with `fleetgate certs issue-agent --cluster {cluster}`",
            wire::AGENT_ORGANIZATION,
            if agent { "present" } else { "missing" }
        );
    }
    Ok(())
}

/// The `agent` command: runs until SIGINT or SIGTERM.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let cert_pem =
        std::fs::read(&args.cert).with_context(|| format!("reading {}", args.cert.display()))?;
    check_certificate(&cert_pem, &args.cluster)?;
    let key_pem =
        std::fs::read(&args.key).with_context(|| format!("reading {}", args.key.display()))?;
    let certs = parse_certs(&cert_pem).map_err(|e| anyhow!("--cert: {e}"))?;
    let key = parse_key(&key_pem).map_err(|e| anyhow!("--key: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(&args.ca)?)
        .with_client_auth_cert(certs, key)
        .context("the agent's certificate and key")?;
    config.alpn_protocols = vec![wire::ALPN.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let listed = args.gateways.iter().map(|url| (url, false));
    let found = args.gateway_replicas.iter().map(|url| (url, true));
    let gateways = listed
        .chain(found)
        .map(|(url, replicas)| Ok((Arc::new(parse_gateway(url)?), replicas)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let member = Arc::new(Member::from_args(&args)?);
    let resolve_every =
        (args.resolve_seconds > 0).then(|| Duration::from_secs(args.resolve_seconds));
    // One thread: a tunnel's h2 connection and its streams' tasks wake each other on every
    // frame; on one thread that is a queue push, across threads a futex and a context switch.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let (events, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
        let tunnels = Tunnels {
            cluster: args.cluster.clone(),
            connector,
            member,
            events: events.clone(),
        };
        // Each gateway's addresses to keep a tunnel to: a listed one is its own (dialed by
        // name); a replicas name's come from DNS.
        let mut wanted: Vec<Option<BTreeSet<Target>>> = vec![None; gateways.len()];
        for (index, (gateway, replicas)) in gateways.into_iter().enumerate() {
            if replicas {
                tokio::spawn(keep_replicas(gateway, index, resolve_every, tunnels.clone()));
            } else {
                wanted[index] = Some(BTreeSet::from([Target::Name]));
                tunnels.spawn(gateway, index, Target::Name, Arc::default());
            }
        }
        let mut up: HashSet<(usize, Target)> = HashSet::new();
        let mut announced = false;
        loop {
            tokio::select! {
                Some(event) = events_rx.recv() => {
                    match event {
                        Event::Up(index, target) => { up.insert((index, target)); }
                        Event::Resolved(index, targets) => wanted[index] = Some(targets),
                    }
                    let all_up = wanted.iter().enumerate().all(|(index, targets)| {
                        targets.as_ref().is_some_and(|t| t.iter().all(|t| up.contains(&(index, *t))))
                    });
                    if !announced && all_up {
                        announced = true;
                        let total: usize = wanted.iter().flatten().map(BTreeSet::len).sum();
                        println!(
                            "ready: cluster {} tunnelled to {total} gateway(s)",
                            args.cluster
                        );
                        use std::io::Write as _;
                        std::io::stdout().flush()?;
                    }
                }
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
            }
        }
        info!("stopping: tunnels closed");
        Ok(())
    })
}

/// Where one tunnel dials: the gateway's name (resolved at each dial) or one of its replicas'
/// addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Target {
    Name,
    Address(SocketAddr),
}

/// What the tunnels tell the `run` loop, for its `ready` line.
enum Event {
    /// Gateway `.0`'s tunnel to `.1` is up.
    Up(usize, Target),
    /// Gateway `.0`'s replicas are now these addresses.
    Resolved(usize, BTreeSet<Target>),
}

/// What every tunnel of this agent shares; spawns them.
#[derive(Clone)]
struct Tunnels {
    cluster: String,
    connector: tokio_rustls::TlsConnector,
    member: Arc<Member>,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
}

impl Tunnels {
    /// Keeps a tunnel to `target` of gateway `index` until `retired` is set (then it is not
    /// dialed again once it ends; its open streams finish).
    fn spawn(&self, gateway: Arc<Gateway>, index: usize, target: Target, retired: Arc<AtomicBool>) {
        let tunnel = KeptTunnel {
            gateway,
            target,
            retired,
            cluster: self.cluster.clone(),
            connector: self.connector.clone(),
            member: self.member.clone(),
            index,
            events: self.events.clone(),
        };
        tokio::spawn(tunnel.keep());
    }
}

/// The replicas of one `--gateway-replicas` name: a tunnel kept to each address it resolves to.
#[derive(Default)]
struct Replicas {
    kept: BTreeMap<SocketAddr, Arc<AtomicBool>>,
}

impl Replicas {
    /// Brings the kept addresses to `resolved`: retires the ones gone from it (their tunnels
    /// are not dialed again) and returns the new ones, to be started with their flags.
    fn update(&mut self, resolved: &BTreeSet<SocketAddr>) -> Vec<(SocketAddr, Arc<AtomicBool>)> {
        self.kept.retain(|address, retired| {
            let keep = resolved.contains(address);
            if !keep {
                retired.store(true, Ordering::Relaxed);
            }
            keep
        });
        let mut started = Vec::new();
        for address in resolved {
            if !self.kept.contains_key(address) {
                let retired = Arc::new(AtomicBool::new(false));
                self.kept.insert(*address, retired.clone());
                started.push((*address, retired));
            }
        }
        started
    }
}

/// Resolves `gateway`'s name every `every` (once if `None`) and keeps a tunnel to each address.
/// A failed resolution keeps the tunnels it has and is tried again with backoff.
async fn keep_replicas(
    gateway: Arc<Gateway>,
    index: usize,
    every: Option<Duration>,
    tunnels: Tunnels,
) {
    let mut replicas = Replicas::default();
    let mut backoff = reconnect_backoff();
    loop {
        let resolved = tokio::time::timeout(
            DIAL_TIMEOUT,
            tokio::net::lookup_host((gateway.host.as_str(), gateway.port)),
        )
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("timed out")));
        let addresses: BTreeSet<SocketAddr> = match resolved {
            Ok(addresses) => addresses.collect(),
            Err(error) => {
                warn!(gateway = %gateway.url, %error, "resolving the gateway replicas failed");
                tokio::time::sleep(backoff.failed(Duration::ZERO)).await;
                continue;
            }
        };
        backoff.reset();
        if !replicas.kept.keys().eq(addresses.iter()) {
            let replicas_list = addresses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>();
            info!(gateway = %gateway.url, replicas = %replicas_list.join(", "), "gateway replicas resolved");
        }
        let started = replicas.update(&addresses);
        for (address, retired) in started {
            tunnels.spawn(gateway.clone(), index, Target::Address(address), retired);
        }
        let targets = addresses.into_iter().map(Target::Address).collect();
        let _ = tunnels.events.send(Event::Resolved(index, targets));
        match every {
            Some(every) => tokio::time::sleep(every).await,
            None => return,
        }
    }
}

/// A tunnel to one gateway (or one of its replicas), kept up until it is retired.
struct KeptTunnel {
    gateway: Arc<Gateway>,
    target: Target,
    retired: Arc<AtomicBool>,
    cluster: String,
    connector: tokio_rustls::TlsConnector,
    member: Arc<Member>,
    index: usize,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
}

impl KeptTunnel {
    /// Dials, serves, and dials again after a failure, with backoff and jitter, until retired.
    async fn keep(self) {
        let mut backoff = reconnect_backoff();
        loop {
            let started = Instant::now();
            let outcome = self.serve_once().await;
            let delay = backoff.failed(started.elapsed());
            let target = self.describe();
            match outcome {
                Ok(reason) => {
                    info!(gateway = %target, reason = %reason, retry_in_ms = delay.as_millis() as u64, "tunnel down")
                }
                Err(error) => {
                    warn!(gateway = %target, error = %format!("{error:#}"), retry_in_ms = delay.as_millis() as u64, "tunnel failed")
                }
            }
            tokio::time::sleep(delay).await;
            if self.retired.load(Ordering::Relaxed) {
                info!(gateway = %target, "the replica is no longer resolved: not dialed again");
                return;
            }
        }
    }

    /// The gateway's URL, and the replica's address if the tunnel is to one.
    fn describe(&self) -> String {
        match self.target {
            Target::Name => self.gateway.url.clone(),
            Target::Address(address) => format!("{} ({address})", self.gateway.url),
        }
    }

    /// One tunnel's life: dial, hello, h2 (as the server), streams carried, pings; returns why
    /// it ended.
    async fn serve_once(&self) -> anyhow::Result<String> {
        let gateway = &self.gateway;
        let dial = async {
            let tcp = match self.target {
                Target::Name => TcpStream::connect((gateway.host.as_str(), gateway.port)).await?,
                Target::Address(address) => TcpStream::connect(address).await?,
            };
            tcp.set_nodelay(true)?;
            let mut tls = self.connector.connect(gateway.name.clone(), tcp).await?;
            tls.write_all(wire::hello(&self.cluster).as_bytes()).await?;
            tls.flush().await?;
            let answer = read_line(&mut tls).await?;
            Ok::<_, std::io::Error>((tls, answer))
        };
        let (tls, answer) = tokio::time::timeout(wire::HANDSHAKE_TIMEOUT, dial)
            .await
            .map_err(|_| anyhow!("no TLS handshake and hello answer within the timeout"))?
            .context("dialing the gateway")?;
        if answer != wire::HELLO_OK.trim_end() {
            let reason = answer.strip_prefix(wire::HELLO_REFUSED).unwrap_or(&answer);
            bail!(
                "the gateway refused the tunnel: {}",
                wire::printable(reason)
            );
        }
        let mut connection = h2::server::Builder::new()
            .initial_window_size(wire::STREAM_WINDOW)
            .initial_connection_window_size(wire::CONNECTION_WINDOW)
            .max_frame_size(wire::MAX_FRAME)
            .max_concurrent_streams(u32::MAX)
            .handshake::<_, Bytes>(crate::tunnel::coalesce::Coalesce::new(tls))
            .await
            .context("the h2 handshake")?;
        let mut pings = connection.ping_pong().context("h2 gave no ping handle")?;
        info!(gateway = %self.describe(), cluster = %self.cluster, "tunnel up");
        let _ = self.events.send(Event::Up(self.index, self.target));
        let heartbeat = crate::tunnel::heartbeat::until_unanswered(&mut pings, tokio::time::sleep);
        tokio::pin!(heartbeat);
        loop {
            tokio::select! {
                stream = connection.accept() => match stream {
                    Some(Ok((request, respond))) => {
                        tokio::spawn(serve_stream(self.member.clone(), request, respond));
                    }
                    Some(Err(error)) => return Err(anyhow!(error).context("the tunnel failed")),
                    None => return Ok("the gateway closed the tunnel".into()),
                },
                reason = &mut heartbeat => return Ok(reason),
            }
        }
    }
}

/// The gateway's answer line (without `\n`), read a byte at a time so that no h2 byte after it
/// is consumed; at most [`wire::MAX_HELLO`] bytes.
async fn read_line<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<String> {
    let mut line = Vec::new();
    loop {
        let byte = stream.read_u8().await?;
        if byte == b'\n' || line.len() >= wire::MAX_HELLO {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte);
    }
}

/// `BACKOFF_FIRST * 2^(failures-1)`, at most `BACKOFF_MAX`, times a random factor in [0.5, 1):
/// agents that lost their gateway together do not all come back in the same instant.
fn reconnect_backoff() -> Backoff {
    Backoff::new(BACKOFF_FIRST, BACKOFF_MAX, 0.5, STABLE_AFTER)
}

/// Carries one stream: a connection to the target its path names (the member's apiserver, or an
/// allowed service), or the reason there is none (answered with [`wire::ERROR_HEADER`]: 403 for
/// a service not allowed, which is never dialed; 400 for a target it cannot read; 502 when the
/// dial failed), then bytes both ways until both sides are done or either fails.
async fn serve_stream(
    member: Arc<Member>,
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let refuse = |respond: &mut h2::server::SendResponse<Bytes>, code, reason: &str| {
        let reason = wire::printable(reason);
        debug!(code = %code, reason = %reason, "stream refused");
        let mut answer = http::Response::new(());
        *answer.status_mut() = code;
        if let Ok(value) = http::HeaderValue::from_str(&reason) {
            answer.headers_mut().insert(wire::ERROR_HEADER, value);
        }
        let _ = respond.send_response(answer, true);
    };
    let target = wire::parse_stream_path(request.uri().path());
    let dialed = match target {
        Ok(wire::StreamTarget::Member) => member.dial().await,
        Ok(wire::StreamTarget::Service(service)) => match member.services.address(&service) {
            Some(address) => member.dial_service(address).await,
            None => {
                let reason =
                    format!("service {service} is not allowed by this agent (--allow-service)");
                return refuse(&mut respond, http::StatusCode::FORBIDDEN, &reason);
            }
        },
        Err(reason) => return refuse(&mut respond, http::StatusCode::BAD_REQUEST, reason),
    };
    let conn = match dialed {
        Ok(conn) => conn,
        Err(error) => {
            let reason = format!("{error:#}");
            return refuse(&mut respond, http::StatusCode::BAD_GATEWAY, &reason);
        }
    };
    match target {
        Ok(wire::StreamTarget::Service(service)) => {
            debug!(service = %service, "service connection opened for a stream")
        }
        _ => debug!("member connection opened for a stream"),
    }
    let send = match respond.send_response(http::Response::new(()), false) {
        Ok(send) => send,
        Err(_) => return,
    };
    if let Err(error) = carry::carry(conn, send, request.into_body()).await {
        debug!(%error, "stream ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_with_jitter_below_the_step() {
        let mut backoff = reconnect_backoff();
        for failures in 1..40 {
            let step = BACKOFF_FIRST
                .saturating_mul(1 << (failures - 1).min(16))
                .min(BACKOFF_MAX);
            let delay = backoff.failed(Duration::ZERO);
            assert!(delay >= step / 2 && delay < step, "{failures}: {delay:?}");
        }
        assert!(reconnect_backoff().failed(Duration::ZERO) < Duration::from_millis(100));
        assert!(backoff.failed(Duration::ZERO) >= BACKOFF_MAX / 2);
    }

    #[test]
    fn replicas_follow_the_resolved_addresses() {
        let a: SocketAddr = "10.0.0.1:8132".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:8132".parse().unwrap();
        let c: SocketAddr = "[fd00::3]:8132".parse().unwrap();
        let mut replicas = Replicas::default();
        let first = replicas.update(&BTreeSet::from([a, b]));
        assert_eq!(first.iter().map(|(x, _)| *x).collect::<Vec<_>>(), [a, b]);
        // The same answer again starts nothing and retires nothing.
        assert!(replicas.update(&BTreeSet::from([b, a])).is_empty());
        assert!(first
            .iter()
            .all(|(_, retired)| !retired.load(Ordering::Relaxed)));
        // b left, c came: c starts, b's tunnel is retired, a's is kept.
        let second = replicas.update(&BTreeSet::from([a, c]));
        assert_eq!(second.iter().map(|(x, _)| *x).collect::<Vec<_>>(), [c]);
        assert!(!first[0].1.load(Ordering::Relaxed));
        assert!(first[1].1.load(Ordering::Relaxed));
        // b back: a new tunnel (the retired one ends on its own).
        let third = replicas.update(&BTreeSet::from([a, b, c]));
        assert_eq!(third.iter().map(|(x, _)| *x).collect::<Vec<_>>(), [b]);
        assert!(!third[0].1.load(Ordering::Relaxed));
    }

    #[test]
    fn the_certificate_must_name_the_cluster_and_be_an_agents() {
        let dir = tempfile::tempdir().unwrap();
        let args = crate::cli::certs::IssueAgentArgs {
            dir: dir.path().to_path_buf(),
            cluster: "edge-1".into(),
            ttl: Duration::from_secs(3600),
            out_dir: None,
            force: false,
        };
        crate::cli::certs::issue_agent(&args).unwrap();
        let pem = std::fs::read(dir.path().join("agent-edge-1.crt")).unwrap();
        check_certificate(&pem, "edge-1").unwrap();
        let wrong = check_certificate(&pem, "edge-2").unwrap_err().to_string();
        assert!(wrong.contains("edge-2"), "{wrong}");
        // A user certificate (no O=fleetgate:agents) naming the cluster is not an agent's.
        let ca = crate::cli::certs::load_issuer(
            &dir.path().join(crate::cli::certs::AGENT_CA_CERT),
            &dir.path().join(crate::cli::certs::AGENT_CA_KEY),
        )
        .unwrap();
        let user =
            crate::cli::certs::issue_client(&ca, "edge-1", &[], Duration::from_secs(60)).unwrap();
        assert!(check_certificate(user.cert_pem.as_bytes(), "edge-1").is_err());
        assert!(parse_gateway("http://gw:1").is_err());
    }

    #[test]
    fn allowed_services_are_parsed_strictly() {
        let specs = [
            "team-a/echo:8080".to_owned(),
            "b/web:80=127.0.0.1:9".to_owned(),
        ];
        let allowed = AllowedServices::from_args(&specs).unwrap();
        let echo = wire::ServiceRef::parse("team-a/echo:8080").unwrap();
        assert_eq!(allowed.address(&echo), Some("echo.team-a.svc:8080"));
        let web = wire::ServiceRef::parse("b/web:80").unwrap();
        assert_eq!(allowed.address(&web), Some("127.0.0.1:9"));
        let other = wire::ServiceRef::parse("b/web:81").unwrap();
        assert_eq!(allowed.address(&other), None);
        for bad in [
            "b/web",
            "b/web:80=",
            "b/web:80=host",
            "b/web:80=:1",
            "b/web:80=h:0",
            "B/web:80",
        ] {
            assert!(
                AllowedServices::from_args(&[bad.to_owned()]).is_err(),
                "{bad} accepted"
            );
        }
        assert_eq!(parse_gateway("gw.example:8132").unwrap().port, 8132);
    }
}
