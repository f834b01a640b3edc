//! Pull mode, the agent's side: the `fleetgate agent` program, which runs beside a member cluster
//! that the gateway cannot dial and dials out instead: one TLS connection per gateway
//! (`--gateway`, repeatable), authenticated by the agent's certificate (`fleetgate certs
//! issue-agent`: CN = the cluster, O = `fleetgate:agents`), then h2 with roles reversed: the
//! gateway opens a stream per member connection it wants, and the agent carries each to the
//! member's apiserver (`--kube-server`, else the in-cluster service account's) and back, bytes as
//! they are, with h2's per-stream flow control between the two.
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
//! re-resolved every `--resolve-seconds`). tokio, h2 and tokio-rustls on one thread.
//! Never logs key material or the requests it carries.
//!
//! This module is the program: its flags ([`AgentArgs`], which `cli` exposes as the `agent`
//! command), [`run`], dialing the gateway replicas (the tunnels kept to each, redialed with
//! backoff, and the replicas a name resolves to), and each stream served (`serve_stream`: its
//! target read, refused or dialed, then carried). The rest, by what it does:
//! - `session`: one tunnel's life: dial, hello, h2, heartbeat, streams accepted;
//! - `member`: the member dial: the apiserver, or a service `--allow-service` lists;
//! - `carry`: a stream's bytes to and from its member connection, without copies.
//!
//! The wire format it speaks is `crate::tunnel::wire`, the very module the gateway's side
//! (`crate::tunnel`) speaks it with; nothing else of the gateway is used here.

mod carry;
mod member;
mod session;

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
use tracing::{debug, info, warn};

use crate::member::backoff::Backoff;
use crate::tunnel::wire;
use member::Member;

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

/// Dialing a gateway or the member: TCP and TLS.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect backoff: first delay, ceiling, and how long a tunnel must have lived for the next
/// failure to start from the first delay again.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const STABLE_AFTER: Duration = Duration::from_secs(10);

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
    let subject = wire::AgentSubject::parse(first)
        .ok_or_else(|| anyhow!("--cert does not parse as X.509"))?;
    let (names, agent) = (&subject.common_names, subject.is_agent);
    if names != &[cluster] || !agent {
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
        debug!(code = %code, reason = %wire::printable(reason), "stream refused");
        let _ = respond.send_response(wire::refusal(code, reason), true);
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
        assert_eq!(parse_gateway("gw.example:8132").unwrap().port, 8132);
    }
}
