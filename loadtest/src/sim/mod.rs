//! The simulated fleet: N member clusters, each a kube-apiserver-compatible HTTPS server on its own
//! 127.0.0.1 port, plus the files (kubeconfigs, Cluster and Gateway objects, user credentials) that
//! let kubectl, kube-rs and the gateway reach them.
//!
//! A request's way through a member: `server` (TCP, TLS, HTTP/1.1 or h2) -> `api` (identity via
//! `auth`, routing) -> `objects` / `watch` / `logs` / `stream` over the member's `store`; every
//! error leaves through `status`; a service proxy request goes to its backend (`services`); a
//! member's `faults` switches make it stall its watches or forbid after a restart. `start_fleet` is the only entry point other crates use (the
//! gateway's `demo` command and the tests); it never blocks the runtime it is called on.

pub mod api;
pub mod auth;
pub mod body;
pub mod discovery;
pub mod faults;
pub mod files;
pub mod load;
pub mod logs;
pub mod member;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod pki;
pub mod protobuf;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod services;
pub mod status;
pub mod store;
pub mod stream;
pub mod table;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::sim::auth::{TokenAuthenticator, UserInfo, GATEWAY_USER};
use crate::sim::files::{FleetAddresses, FleetCredentials};
use crate::sim::member::Member;
pub use crate::sim::member::SimTuning;
use crate::sim::server::MemberServer;

/// How many nodes each member has.
const NODES_PER_MEMBER: usize = 3;

/// What fleet to start.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Where the files are written (created if missing).
    pub dir: PathBuf,
    /// Number of members (`member1`...).
    pub clusters: usize,
    /// ConfigMaps per member (`--objects K`).
    pub objects: usize,
    /// Updates per second per member (`--churn E`).
    pub churn_per_sec: f64,
    /// Address written into `gateway.yaml` and `gateway.kubeconfig`; None = a free 127.0.0.1 port.
    pub gateway_listen: Option<String>,
}

/// A running fleet. Dropping it without [`FleetHandle::shutdown`] leaves the members serving
/// until the runtime ends.
pub struct FleetHandle {
    dir: PathBuf,
    servers: Vec<MemberServer>,
    members: Vec<Arc<Member>>,
    churn_tasks: Vec<JoinHandle<()>>,
    /// The plain-HTTP listeners, once [`FleetHandle::serve_plaintext`] started them.
    plain_servers: std::sync::Mutex<Vec<MemberServer>>,
}

impl FleetHandle {
    /// The members' addresses, member1 first.
    pub fn member_addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.addr).collect()
    }

    /// The directory holding the fleet's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops member `index` (0-based): its listener and connections close. Other members go on.
    pub async fn stop_member(&self, index: usize) {
        if let Some(server) = self.servers.get(index) {
            server.stop().await;
        }
        if let Some(task) = self.churn_tasks.get(index) {
            task.abort();
        }
    }

    /// Starts member `index` again after [`FleetHandle::stop_member`], on the same address and
    /// with the same objects (its churn, if any, stays stopped).
    pub async fn restart_member(&self, index: usize) -> std::io::Result<()> {
        match self.servers.get(index) {
            Some(server) => server.restart().await,
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no member {index}"),
            )),
        }
    }

    /// Restarts member `index` as a kube-apiserver restarts in front of its etcd: the listener
    /// and every connection close, nothing answers for `down`, then it listens again on the same
    /// address with the same objects and watch history. Its churn goes on meanwhile (writes from
    /// elsewhere), so resumed watches have events to catch up on. The sim's SIGUSR1.
    pub async fn bounce_member(&self, index: usize, down: Duration) -> std::io::Result<()> {
        let server = self.servers.get(index).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("no member {index}"))
        })?;
        server.stop().await;
        tokio::time::sleep(down).await;
        server.restart().await
    }

    /// The in-memory state of member `index` (for tests and the loadtest driver).
    pub fn member(&self, index: usize) -> Option<&Arc<Member>> {
        self.members.get(index)
    }

    /// Seeds `per_member` Running load pods into every member (`sim --pods-per-member N`; see
    /// [`load::seed_pods`]), the members in parallel on blocking threads. For a fleet just
    /// started: the pods are written without watch events.
    pub async fn seed_pods(&self, per_member: usize) -> anyhow::Result<()> {
        if per_member == 0 {
            return Ok(());
        }
        let seeding: Vec<_> = self
            .members
            .iter()
            .map(|member| {
                let member = member.clone();
                tokio::task::spawn_blocking(move || load::seed_pods(&member, per_member))
            })
            .collect();
        for task in seeding {
            task.await.context("seeding pods")?;
        }
        Ok(())
    }

    /// Starts a second, plain-HTTP listener for every member on 127.0.0.1:0 (the sim's
    /// `--plaintext`), serving the same objects; returns their addresses, member1 first. For
    /// proxies whose upstream leg is plain HTTP/1.1; clients authenticate with bearer tokens.
    /// Calling it again starts no more listeners and returns the same addresses.
    pub async fn serve_plaintext(&self) -> std::io::Result<Vec<SocketAddr>> {
        let mut started = Vec::new();
        if self
            .plain_servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            for member in &self.members {
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                started.push(MemberServer::spawn_plaintext(member.clone(), listener)?);
            }
        }
        let mut plain = self.plain_servers.lock().unwrap_or_else(|e| e.into_inner());
        if plain.is_empty() {
            *plain = started;
        }
        Ok(plain.iter().map(|s| s.addr).collect())
    }

    /// Stops every member.
    pub async fn shutdown(self) {
        for task in &self.churn_tasks {
            task.abort();
        }
        for server in &self.servers {
            server.stop().await;
        }
        let plain =
            std::mem::take(&mut *self.plain_servers.lock().unwrap_or_else(|e| e.into_inner()));
        for server in &plain {
            server.stop().await;
        }
    }
}

/// Starts every member on 127.0.0.1:0, writes the files, returns once all listen. Must be called
/// inside a tokio runtime (multi-thread or current-thread).
pub async fn start_fleet(opts: FleetOptions) -> anyhow::Result<FleetHandle> {
    start_fleet_with_tuning(opts, SimTuning::default()).await
}

/// [`start_fleet`] with non-default knobs (log interval, history window, bookmark interval).
pub async fn start_fleet_with_tuning(
    opts: FleetOptions,
    tuning: SimTuning,
) -> anyhow::Result<FleetHandle> {
    anyhow::ensure!(opts.clusters >= 1, "a fleet needs at least one cluster");
    // Key generation is CPU work; keep it off the runtime's worker.
    let creds = tokio::task::spawn_blocking(FleetCredentials::generate)
        .await
        .context("generating the fleet PKI")??;
    let tls = server::tls_config(&creds.fleet_ca, &creds.member_serving)?;

    let mut listeners = Vec::new();
    for _ in 0..opts.clusters {
        listeners.push(
            TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding a member listener")?,
        );
    }
    let member_addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let gateway = match &opts.gateway_listen {
        Some(addr) => addr.clone(),
        None => free_port().await?,
    };
    // The admin listener binds port 0 when the gateway starts (its `ready` line names the
    // address): nothing needs it in advance, and a port picked here could be taken by then.
    let gateway_admin = "127.0.0.1:0".to_string();
    let dir = opts.dir.clone();
    {
        let dir = dir.clone();
        let member_addrs = member_addrs.clone();
        let gateway = gateway.clone();
        let creds_ref = &creds;
        // Small files; writing them inline keeps the credentials borrowed instead of cloned.
        files::write_fleet_files(
            &dir,
            creds_ref,
            &FleetAddresses {
                members: &member_addrs,
                gateway: &gateway,
                gateway_admin: &gateway_admin,
            },
        )
        .with_context(|| format!("writing the fleet files into {}", dir.display()))?;
    }

    let mut tokens = TokenAuthenticator::default();
    for user in &creds.users {
        tokens.insert(user.token.clone(), user.user_info());
    }
    tokens.insert(
        creds.gateway_token.clone(),
        UserInfo::new(GATEWAY_USER, "fleetgate-gateway-uid", &[]),
    );

    let mut servers = Vec::new();
    let mut members = Vec::new();
    let mut churn_tasks = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let name = format!("member{}", i + 1);
        let nodes = (1..=NODES_PER_MEMBER)
            .map(|n| format!("{name}-node-{n}"))
            .collect();
        let member = Arc::new(Member::new(
            name,
            tokens.clone(),
            tuning.clone(),
            nodes,
            member_addrs[i].to_string(),
            creds.fleet_ca.cert_pem.clone(),
        ));
        load::seed(&member, opts.objects);
        services::seed(&member);
        servers.push(MemberServer::spawn(member.clone(), listener, tls.clone())?);
        churn_tasks.push(tokio::spawn(load::churn(
            member.clone(),
            opts.objects,
            opts.churn_per_sec,
        )));
        members.push(member);
    }
    tracing::info!(clusters = opts.clusters, dir = %dir.display(), "simulated fleet listening");
    Ok(FleetHandle {
        dir,
        servers,
        members,
        churn_tasks,
        plain_servers: std::sync::Mutex::new(Vec::new()),
    })
}

/// A free 127.0.0.1 port (bound, read, released).
async fn free_port() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.to_string())
}
