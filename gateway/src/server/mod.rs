//! The gateway as a running thing: binds every listener, starts the shards and the admin
//! listener, and returns once every shard accepts ([`start`]). The folder holds what a connection
//! meets before any HTTP: `listener` (SO_REUSEPORT sockets, never shared with another process),
//! `shard` (one monoio runtime per core, its accept loops), `supervise` (a shard that dies is
//! noticed and restarted) and `admin` (health and metrics). It is the composition root: it makes
//! admission's counters and the metrics registry, builds each shard's context
//! (`handle::ShardContext`, from the exchange's and the shared watches' parts) and hands a TLS
//! connection to the front-end ALPN chose. What the shards run on (drain, timeouts) is
//! `runtime`. The `serve` and `demo` commands (`cli`) and the tests call [`start`]; nothing here
//! parses HTTP.

pub mod admin;
pub mod listener;
pub mod shard;
pub mod supervise;

pub use crate::handle::ShardContext;
pub use shard::Driver;

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};

use anyhow::Context;
use fleetgate_config_watcher::{ReloadStatus, SharedTable};
use tracing::info;

use crate::observe::metrics::Metrics;
use crate::runtime::shutdown::Shutdown;
use listener::bind_reuseport;
use shard::{spawn_shard, ShardListener, SharedState};

/// How to start a gateway.
#[derive(Debug, Clone, Copy)]
pub struct StartOptions {
    /// Shards; `None` or 0 means the Gateway object's `workers`, then one per core.
    pub workers: Option<usize>,
    pub driver: Driver,
}

/// A listener as bound.
#[derive(Debug, Clone)]
pub struct BoundListener {
    pub name: String,
    pub address: SocketAddr,
    pub tls: bool,
}

/// A started gateway: its bound addresses. The shards run until the process exits.
#[derive(Debug)]
pub struct RunningGateway {
    pub listeners: Vec<BoundListener>,
    pub admin: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub workers: usize,
    /// Begin a graceful shutdown with `shutdown.begin()`; `shutdown.all_closed()` says when it is done.
    pub shutdown: Arc<Shutdown>,
    /// The audit log's writer, when the Gateway has `spec.audit` or `spec.accessLog`: flushed
    /// once the drain is over.
    pub audit: Option<crate::observe::audit::AuditLog>,
}

impl RunningGateway {
    /// `ready NAME=ADDR ... admin=ADDR`: the line `serve` prints once every shard accepts.
    pub fn ready_line(&self) -> String {
        let mut line = String::from("ready");
        for l in &self.listeners {
            line.push_str(&format!(" {}={}", l.name, l.address));
        }
        if let Some(admin) = self.admin {
            line.push_str(&format!(" admin={admin}"));
        }
        line.push_str(&format!(" workers={}", self.workers));
        line
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Binds every listener, starts the shards and the admin listener, and returns once every shard
/// accepts connections.
pub fn start(table: SharedTable, options: StartOptions) -> anyhow::Result<RunningGateway> {
    start_with_reload(table, options, None)
}

/// Like [`start`], for a table that a configuration source reloads: the admin listener reports
/// `reload` in `/metrics` and `/readyz?verbose`.
pub fn start_with_reload(
    table: SharedTable,
    options: StartOptions,
    reload: Option<Arc<ReloadStatus>>,
) -> anyhow::Result<RunningGateway> {
    crate::runtime::faults::init_from_env();
    let descriptors = crate::upstream::budget::raise_descriptor_limit();
    info!(descriptors, "open-files limit");
    let gateway = table.load().gateway().clone();
    let workers = match options.workers.filter(|w| *w > 0) {
        Some(w) => w,
        None if gateway.workers > 0 => gateway.workers,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // Admission and the circuit breakers own their counters; the registry reads them at scrape
    // time.
    let admission = Arc::new(crate::admit::Admission::default());
    let metrics = Metrics::with_collectors(vec![
        Box::new(crate::admit::metrics::FairnessCollector(admission.clone())),
        Box::new(crate::upstream::breaker::BreakerCollector),
    ]);
    let mut bound = Vec::new();
    let mut per_shard: Vec<Vec<ShardListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut specs = Vec::new();
    // One configuration for every TLS listener, rebuilt when the certificate or CA rotate.
    let status = reload.clone().unwrap_or_default();
    let mut serving = None;
    for listener in &gateway.listeners {
        let tls = if listener.tls {
            if serving.is_none() {
                serving = Some(
                    crate::tls::watch_serving(&table, status.clone())
                        .with_context(|| format!("TLS for listener {:?}", listener.name))?,
                );
            }
            serving.clone()
        } else {
            None
        };
        let sockets = bind_reuseport(&listener.address, workers).with_context(|| {
            format!(
                "binding listener {:?} on {}",
                listener.name, listener.address
            )
        })?;
        bound.push(BoundListener {
            name: listener.name.clone(),
            address: sockets[0].local_addr()?,
            tls: listener.tls,
        });
        specs.push(supervise::ListenerSpec {
            name: listener.name.clone(),
            address: sockets[0].local_addr()?,
            tls: tls.clone(),
        });
        for (shard, socket) in sockets.into_iter().enumerate() {
            per_shard[shard].push(ShardListener {
                name: listener.name.clone(),
                socket,
                tls: tls.clone(),
            });
        }
    }
    anyhow::ensure!(!bound.is_empty(), "the Gateway object has no listeners");
    let shutdown = Shutdown::new();
    let admin = match &gateway.admin {
        Some(address) => {
            let socket = std::net::TcpListener::bind(address)
                .with_context(|| format!("binding the admin listener on {address}"))?;
            let local = socket.local_addr()?;
            crate::server::admin::spawn_admin(
                socket,
                metrics.clone(),
                Some(crate::server::admin::ConfigView {
                    table: table.clone(),
                    reload,
                    shutdown: shutdown.clone(),
                }),
            )?;
            Some(local)
        }
        None => None,
    };
    // One writer serves the audit log (`spec.audit`) and the access log (`spec.accessLog`).
    let audit = match (&gateway.audit, gateway.access_log) {
        (None, false) => None,
        (audit, access_log) => Some(
            crate::observe::audit::AuditLog::start(
                audit.as_ref().map(|a| a.path.as_path()),
                access_log,
                audit
                    .as_ref()
                    .map_or(crate::observe::audit::DEFAULT_QUEUE, |a| a.queue),
                &metrics,
            )
            .context("starting the audit log")?,
        ),
    };
    let (started_tx, started_rx) = mpsc::channel();
    let shared = SharedState {
        table: table.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        audit: audit.clone(),
        sockets: crate::upstream::budget::Sockets::new(workers),
        admission,
        workers,
    };
    let mut shards = Vec::with_capacity(workers);
    for (index, listeners) in per_shard.into_iter().enumerate() {
        shards.push(spawn_shard(
            index,
            options.driver,
            listeners,
            shared.clone(),
            started_tx.clone(),
        )?);
    }
    drop(started_tx);
    for _ in 0..workers {
        started_rx
            .recv()
            .context("a shard stopped before it started")?
            .context("a shard could not start")?;
    }
    let specs: Arc<[supervise::ListenerSpec]> = specs.into();
    for (index, shard) in shards.into_iter().enumerate() {
        supervise::supervise(index, options.driver, specs.clone(), shared.clone(), shard)?;
    }
    let driver =
        clap::ValueEnum::to_possible_value(&options.driver).map(|v| v.get_name().to_owned());
    info!(workers, driver, "gateway started");
    Ok(RunningGateway {
        listeners: bound,
        admin,
        metrics,
        workers,
        shutdown,
        audit,
    })
}
