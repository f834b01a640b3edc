//! Shards: one OS thread per worker, each running its own monoio runtime (io_uring, epoll, or
//! io_uring with epoll fallback) and accepting on its own SO_REUSEPORT sockets.
//!
//! A shard owns its upstream pool and shares only the routing table (an `ArcSwap`), the
//! metrics atomics and the shutdown state (`runtime::shutdown`) with the others. When the drain begins, each
//! accept loop stops and drops its listening socket; the connections already accepted finish on
//! their own (see `runtime::shutdown`). Each shard builds its context here (`handle::ShardContext`
//! over the exchange's and the shared watches' parts), and each TLS connection goes, once `tls`
//! has run its handshake, to the front-end ALPN chose. This module and `upstream::connect` are
//! where monoio's types live; nothing here parses HTTP. Called by `server::start`.

use std::future::Future;
use std::io;
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fleetgate_config_watcher::SharedTable;
use monoio::io::IntoPollIo;
use tracing::{debug, error, warn};

use crate::auth::ClientIdentity;
use crate::exchange::ShardExchange;
use crate::handle::ShardContext;
use crate::observe::metrics::Metrics;
use crate::protocol::h1::serve_http1;
use crate::runtime::shutdown::Shutdown;
use crate::upstream::ShardPool;
use crate::watch::ShardWatches;

/// Runs the TLS handshake on an accepted socket (`tls`) and hands the stream to the front-end
/// ALPN chose: h2 when the client chose it, HTTP/1.1 otherwise (also without ALPN).
async fn serve_tls<S>(
    ctx: Rc<ShardContext>,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: S,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    // Bound field by field: a binding of the whole `Accepted` would keep its room (a second TLS
    // stream's worth, ~3 KiB) in this future for the connection's whole life, beside `stream`.
    let Some(crate::tls::Accepted {
        mut stream,
        identity,
        h2,
    }) = crate::tls::accept(acceptor, tcp, peer).await
    else {
        return;
    };
    // The h2 connection's future is boxed: it is twice the size of HTTP/1.1's, and this future
    // (every TLS connection's, for its whole life) would otherwise be as large as the larger.
    if h2 {
        Box::pin(crate::protocol::h2::serve_h2(ctx, stream, peer, identity)).await;
    } else {
        serve_http1(ctx, &mut stream, peer, &identity).await;
    }
}

/// Which monoio driver the shards run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Driver {
    /// io_uring where the kernel allows it, epoll otherwise.
    Auto,
    /// io_uring only (fails to start where it is unavailable).
    Uring,
    /// epoll only (monoio's legacy driver).
    Epoll,
}

/// One listener as a shard sees it: its socket and, for TLS listeners, the server config.
pub struct ShardListener {
    pub name: String,
    pub socket: TcpListener,
    pub tls: Option<crate::tls::reload::LiveServerConfig>,
}

/// Idle upstream connections kept per cluster per shard.
const POOL_MAX_IDLE: usize = 64;
/// How long an idle upstream connection is kept (kube-apiserver closes idle ones after 90 s).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

fn block_on_driver<F: Future<Output = ()>>(driver: Driver, future: F) -> io::Result<()> {
    use monoio::{FusionDriver, IoUringDriver, LegacyDriver, RuntimeBuilder};
    match driver {
        Driver::Auto => match RuntimeBuilder::<FusionDriver>::new().enable_timer().build() {
            Ok(mut runtime) => runtime.block_on(future),
            // io_uring is present but refused (typically the memlock limit): epoll still works.
            Err(e) => {
                warn!(error = %e, "io_uring runtime could not start; using epoll");
                RuntimeBuilder::<LegacyDriver>::new()
                    .enable_timer()
                    .build()?
                    .block_on(future)
            }
        },
        Driver::Uring => RuntimeBuilder::<IoUringDriver>::new()
            .enable_timer()
            .build()?
            .block_on(future),
        Driver::Epoll => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .block_on(future),
    }
    Ok(())
}

/// What every shard shares: the routing table, the metrics registry, the drain, the audit log,
/// the socket budget, admission's counters, and how many shards there are.
#[derive(Clone)]
pub struct SharedState {
    pub table: SharedTable,
    pub metrics: Arc<Metrics>,
    pub shutdown: Arc<Shutdown>,
    pub audit: Option<crate::observe::audit::AuditLog>,
    pub sockets: Arc<crate::upstream::budget::Sockets>,
    /// Admission's counters (`admit`), shared by every shard.
    pub admission: Arc<crate::admit::Admission>,
    pub workers: usize,
}

/// A shard thread as started: its handle, its gauges (zeroed when it dies) and a second handle
/// on each of its listening sockets.
pub struct StartedShard {
    pub thread: JoinHandle<()>,
    pub gauges: crate::observe::metrics::ShardGauges,
    /// Duplicates of the shard's listening sockets: when the shard dies, shutting them down takes
    /// them out of the SO_REUSEPORT group even if the dead runtime leaked the originals (an
    /// io_uring accept in flight keeps a socket alive past its close), so the kernel stops
    /// queueing connections that nobody will accept.
    pub listening: Vec<TcpListener>,
}

/// Starts shard `index` on its own thread. `started` receives `Ok` once it accepts on every
/// listener, or the error that stopped it.
pub fn spawn_shard(
    index: usize,
    driver: Driver,
    listeners: Vec<ShardListener>,
    shared: SharedState,
    started: mpsc::Sender<io::Result<()>>,
) -> io::Result<StartedShard> {
    let SharedState {
        table,
        metrics,
        shutdown,
        audit,
        sockets,
        admission,
        workers,
    } = shared;
    let shard_metrics = metrics.shard();
    let gauges = shard_metrics.gauges();
    let listening = listeners
        .iter()
        .map(|l| l.socket.try_clone())
        .collect::<io::Result<Vec<_>>>()?;
    let thread = std::thread::Builder::new()
        .name(format!("fleetgate-shard-{index}"))
        .spawn(move || {
            let report = started.clone();
            let result = block_on_driver(driver, async move {
                let exchange = Rc::new_cyclic(|me| ShardExchange {
                    shard: index,
                    table: crate::runtime::snapshot::ShardTable::new(table),
                    pool: ShardPool::new(POOL_MAX_IDLE, POOL_IDLE_TIMEOUT),
                    shard_metrics,
                    drain: Default::default(),
                    sockets,
                    client_holds: crate::upstream::budget::ClientHolds::default(),
                    workers,
                    me: me.clone(),
                });
                let watches = Rc::new_cyclic(|me| ShardWatches {
                    exchange: Rc::clone(&exchange),
                    shared_watches: Default::default(),
                    watch_reviews: Default::default(),
                    me: me.clone(),
                });
                let ctx = Rc::new(ShardContext {
                    exchange,
                    watches,
                    metrics,
                    admission,
                    shutdown,
                    audit,
                });
                // Pull-mode agents the tunnel thread hands to this shard (`tunnel::handoff`).
                monoio::spawn(crate::tunnel::handoff::receive(
                    crate::tunnel::handoff::register(index),
                ));
                // Feeds of shared watches other shards ask of this one (`watch::across`).
                monoio::spawn(crate::watch::across::receive(
                    Rc::clone(&ctx.watches),
                    crate::watch::across::register(index),
                ));
                let drain_watch = ctx.clone();
                monoio::spawn(async move {
                    drain_watch.shutdown.drain_started().await;
                    drain_watch.exchange.drain.begin();
                });
                for listener in listeners {
                    let opened = listener.socket.try_clone().and_then(|stop| {
                        monoio::net::TcpListener::from_std(listener.socket).map(|s| (s, stop))
                    });
                    match opened {
                        Ok((socket, stop)) => {
                            monoio::spawn(accept_loop(
                                ctx.clone(),
                                listener.name,
                                socket,
                                stop,
                                listener.tls,
                            ));
                        }
                        Err(e) => {
                            let _ = started.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = started.send(Ok(()));
                std::future::pending::<()>().await;
            });
            if let Err(e) = result {
                error!(shard = index, error = %e, "shard runtime failed to start");
                let _ = report.send(Err(e));
            }
        })?;
    Ok(StartedShard {
        thread,
        gauges,
        listening,
    })
}

async fn accept_loop(
    ctx: Rc<ShardContext>,
    name: String,
    listener: monoio::net::TcpListener,
    stop: TcpListener,
    tls: Option<crate::tls::reload::LiveServerConfig>,
) {
    // Pinned once: the wait for the drain lives as long as the loop, not one accept.
    let mut drain_started = std::pin::pin!(ctx.exchange.drain.started());
    loop {
        let accepted = match crate::runtime::race(listener.accept(), drain_started.as_mut()).await {
            crate::runtime::First::Left(accepted) => accepted,
            crate::runtime::First::Right(()) => {
                debug!(shard = ctx.exchange.shard, listener = %name, "draining: no longer accepting");
                // The supervisor holds a duplicate of this socket, so dropping ours would leave it
                // listening with nobody accepting. Shutting it down takes it out of the
                // SO_REUSEPORT group for every holder: new connections are refused.
                let _ = socket2::SockRef::from(&stop).shutdown(std::net::Shutdown::Both);
                return;
            }
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: keep accepting after a pause.
                error!(shard = ctx.exchange.shard, listener = %name, error = %e, "accept failed");
                crate::runtime::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // `spec.fairness.perAddressConnections`: an address over it has its new connection
        // closed now, before a TLS handshake is spent on it.
        let counted = {
            let table = ctx.exchange.table.load();
            ctx.admission.connect(&table.gateway().fairness, peer.ip())
        };
        let Some(counted) = counted else {
            debug!(shard = ctx.exchange.shard, listener = %name, "connection refused: its address has perAddressConnections open");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let tcp = match tcp.into_poll_io() {
            Ok(tcp) => tcp,
            Err(e) => {
                debug!(error = %e, "socket could not be turned into a readiness stream");
                continue;
            }
        };
        let ctx = ctx.clone();
        // Each connection is a task of its own whose panic closes that connection only
        // (`runtime::spawn`). The accept loop itself is a bare task: if it panicked the shard
        // would stop accepting, so it takes the thread down and the supervisor restarts it.
        match &tls {
            Some(live) => {
                // The configuration of this moment: a rotation after it leaves this connection be.
                let acceptor = tokio_rustls::TlsAcceptor::from(live.load_full());
                crate::runtime::spawn(async move {
                    let _counted = counted;
                    let _connected = ctx.exchange.shard_metrics.client_connected();
                    let _socket = ctx.exchange.sockets.hold(ctx.exchange.shard);
                    let _open = ctx.shutdown.connection_opened();
                    serve_tls(ctx.clone(), acceptor, tcp, peer).await;
                });
            }
            None => {
                crate::runtime::spawn(async move {
                    let _counted = counted;
                    let _connected = ctx.exchange.shard_metrics.client_connected();
                    let _socket = ctx.exchange.sockets.hold(ctx.exchange.shard);
                    let _open = ctx.shutdown.connection_opened();
                    let mut tcp = tcp;
                    let anonymous = ClientIdentity::anonymous();
                    serve_http1(ctx.clone(), &mut tcp, peer, &anonymous).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use monoio::net::tcp::stream_poll::TcpStreamPoll;

    use crate::handle::ShardContext;

    /// The size of the future an async fn of four arguments returns.
    fn future_size4<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every TLS client connection is a task holding this future for its whole life (an idle
    /// watch: hours), so its size is memory per watch (docs/benchmarks.md, watch-idle-tls). A
    /// binding of the whole handshake result kept a second TLS stream's room in it beside the
    /// stream in use: 9,976 bytes a connection task in a release build, against 6,744 before.
    #[test]
    fn connection_tasks_keep_no_room_they_do_not_use() {
        let tls = future_size4(
            super::serve_tls::<TcpStreamPoll>
                as fn(Rc<ShardContext>, tokio_rustls::TlsAcceptor, TcpStreamPoll, _) -> _,
        );
        let stream = std::mem::size_of::<tokio_rustls::server::TlsStream<TcpStreamPoll>>();
        let http1 = future_size4(
            crate::protocol::h1::serve_http1::<tokio_rustls::server::TlsStream<TcpStreamPoll>>
                as fn(Rc<ShardContext>, &'static mut _, _, &'static _) -> _,
        );
        eprintln!("serve_tls future: {tls} bytes; TLS stream {stream}; serve_http1's {http1}");
        // The stream, the identity and HTTP/1.1's future, with room for their alignment: not a
        // second stream.
        assert!(
            tls < http1 + 2 * stream,
            "{tls} bytes: {stream} a TLS stream, {http1} HTTP/1.1"
        );
        // HTTP/1.1's future is every plain watch's task for the watch's life. A shared watch's
        // follower is boxed where it starts (6,840 -> 5,952 bytes in a test build); the member's
        // answer is held once, by the pipeline, and the pipeline's handoff of a shared watch is
        // boxed (5,952 -> 4,584).
        assert!(http1 <= 4800, "serve_http1's future: {http1} bytes");
    }
}
