//! Dialing a member cluster: TCP connect and TLS handshake under one connect timeout, giving an
//! [`UpstreamConn`] (the stream, its read buffer, and bookkeeping for the pool).
//!
//! A cluster with an egress proxy (`spec.proxyURL`, Karmada's `proxyURL`) is reached through an
//! HTTP CONNECT tunnel: TCP to the proxy, the CONNECT request the table prepared (with the
//! `proxyHeader` fields), a 2xx answer, then TLS to the member inside the tunnel; any other answer
//! fails the connect with an error naming the proxy and its answer.
//!
//! A `Tunnel` cluster is never dialed: its connection is a stream of an agent's tunnel, or a
//! konnectivity agent's connection with the gateway's TLS inside (`crate::tunnel::open` gives
//! either, as a `TunnelIo`), pooled and reused like any other. The edge runs one way: `upstream`
//! imports `tunnel`, never the reverse.
//!
//! Every connect to a member passes its circuit breaker first (`breaker`): an open one refuses
//! it at once with a 503, and each outcome is recorded there.
//!
//! Runtime-specific (monoio) and never called off a shard thread. Called by the exchange through
//! [`connect`] when the shard's pool has no idle connection for the cluster: for a dialed member,
//! in a dial task of the pool's line (`dials`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use fleetgate_config_watcher::{
    CircuitBreakerSettings, ClusterRoute, ConnectMode, EgressProxy, RouteRetirement,
};
use monoio::io::IntoPollIo;
use monoio::net::tcp::stream_poll::TcpStreamPoll;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::errors::GatewayError;
use crate::observe::metrics::{ShardMetrics, UpstreamGuard};
use crate::runtime::clock;
use crate::tunnel::wire::ServiceRef;
use crate::tunnel::{Counted, KonnectivityConn, TunnelIo, TunnelStream};

/// A connection to a member: plaintext or rustls over a readiness-based monoio socket, a stream
/// of a pull-mode member's tunnel (`crate::tunnel`), which its agent carries to the member, or
/// rustls over a konnectivity agent's connection (which carries TCP only).
pub enum UpstreamIo {
    Plain(TcpStreamPoll),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStreamPoll>>),
    Tunnel(Box<Counted<TunnelStream>>),
    Konnectivity(Box<Counted<tokio_rustls::client::TlsStream<KonnectivityConn>>>),
}

/// `$call` on the stream `$io` holds, whichever it is (each is `Unpin`, so `Pin::new` takes it).
macro_rules! on_stream {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            UpstreamIo::Plain($s) => $call,
            UpstreamIo::Tls($s) => $call,
            UpstreamIo::Tunnel($s) => $call,
            UpstreamIo::Konnectivity($s) => $call,
        }
    };
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_stream!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    /// Forwarded, so a piece written as a chain (a chunk's size line, data and CRLF) reaches a
    /// TLS member as one record and a tunnel as one DATA frame, not one per piece.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_stream!(self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        on_stream!(self, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

/// An open connection to one member cluster, with the bytes read from it but not yet relayed.
pub struct UpstreamConn {
    pub io: UpstreamIo,
    /// Bytes read from the member that belong to the current (or, in error, a later) response.
    pub buf: BytesMut,
    /// What it reaches (the cluster route it was opened for, and the service for a stream to
    /// one): the pool's key, so a changed cluster spec never reuses a connection made with old
    /// credentials, and a stream to a service serves only that service.
    pub pool_key: super::PoolKey,
    /// The route's retirement flag: the pool closes the connection once the route it was made
    /// for has left the serving table.
    pub retirement: Arc<RouteRetirement>,
    /// When it went back to the pool.
    pub idle_since: Instant,
    /// Whether it has carried a request before (a failure on a reused connection may be the
    /// member closing an idle connection, and is retried once on a fresh one).
    pub reused: bool,
    /// Its file descriptor, counted against the process's budget (`upstream::budget`).
    pub socket: Option<crate::upstream::budget::SocketHeld>,
    _open: UpstreamGuard,
}

impl UpstreamConn {
    fn new(
        io: UpstreamIo,
        cluster: &ClusterRoute,
        pool_key: super::PoolKey,
        metrics: &ShardMetrics,
    ) -> UpstreamConn {
        UpstreamConn {
            io,
            // Grown by the driver as it reads: a big LIST gets large reads, an idle watch a
            // small buffer.
            buf: BytesMut::new(),
            pool_key,
            retirement: cluster.retirement.clone(),
            idle_since: clock::now(),
            reused: false,
            socket: None,
            _open: metrics.upstream_connected(&cluster.name),
        }
    }

    /// Whether the member closed this idle connection (or sent something unasked): one
    /// non-blocking read attempt. A pooled connection that fails this is dropped instead of
    /// carrying a request the member will never answer, which matters for requests that cannot
    /// be replayed (a POST whose body was already sent).
    pub fn closed_while_idle(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut buf = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Ready means end of stream, an error, or bytes nobody asked for: unusable either way.
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut buf)
            .is_ready()
    }
}

#[cfg(test)]
impl UpstreamConn {
    /// A connection over `io` to `cluster`'s member, as [`connect`] gives one (for in-process
    /// tests of the pool and the exchange).
    pub(crate) fn for_test(
        io: UpstreamIo,
        cluster: &ClusterRoute,
        metrics: &ShardMetrics,
    ) -> UpstreamConn {
        UpstreamConn::new(io, cluster, super::PoolKey::new(cluster, None), metrics)
    }
}

/// Opens a connection to `cluster` (TCP and, for https, the TLS handshake) within `timeout`;
/// with `service`, a stream to that service through a pull-mode cluster's agent (never for a
/// cluster reached directly). A connect to the member goes through its circuit breaker
/// (`breaker`, with the Gateway's `circuit` settings): refused at once while it is open, and its
/// outcome recorded.
pub async fn connect(
    cluster: &ClusterRoute,
    service: Option<&ServiceRef<'_>>,
    timeout: Duration,
    circuit: &CircuitBreakerSettings,
    metrics: &ShardMetrics,
) -> Result<UpstreamConn, GatewayError> {
    if service.is_some() {
        // A service behind a pull-mode member's agent is another endpoint than the member.
        return dial(cluster, service, timeout, metrics).await;
    }
    let breaker = super::breaker::breakers().of(cluster);
    breaker.admit(Instant::now(), circuit)?;
    let outcome = dial(cluster, None, timeout, metrics).await;
    breaker.record(&outcome, Instant::now(), circuit);
    outcome
}

/// [`connect`] without the breaker.
async fn dial(
    cluster: &ClusterRoute,
    service: Option<&ServiceRef<'_>>,
    timeout: Duration,
    metrics: &ShardMetrics,
) -> Result<UpstreamConn, GatewayError> {
    let key = super::PoolKey::new(cluster, service);
    if cluster.mode == ConnectMode::Tunnel {
        // Pull mode: a stream of one of the cluster's agents' tunnels, never a dial.
        let io = match crate::tunnel::open(cluster, service, timeout).await? {
            TunnelIo::Stream(stream) => UpstreamIo::Tunnel(stream),
            TunnelIo::Konnectivity(tls) => UpstreamIo::Konnectivity(tls),
        };
        return Ok(UpstreamConn::new(io, cluster, key, metrics));
    }
    if let Some(service) = service {
        // `request::decide` refuses the service path of a direct cluster; never dial one.
        return Err(GatewayError::ServicePathNotTunnelled {
            cluster: cluster.name.to_string(),
            service: service.to_string(),
            proxy_path: String::new(),
        });
    }
    let target = &cluster.upstream;
    let address = dial_address(cluster);
    let attempt = async {
        let tcp = match &cluster.egress_proxy {
            None => {
                let address = super::resolve::resolve(&target.host, target.port).await?;
                let tcp = monoio::net::TcpStream::connect(address).await?;
                tcp.set_nodelay(true)?;
                tcp.into_poll_io()?
            }
            Some(proxy) => {
                let address = super::resolve::resolve(&proxy.host, proxy.port).await?;
                let tcp = monoio::net::TcpStream::connect(address).await?;
                tcp.set_nodelay(true)?;
                let mut tcp = tcp.into_poll_io()?;
                open_tunnel(&mut tcp, proxy).await?;
                tcp
            }
        };
        if !target.tls {
            return Ok(UpstreamIo::Plain(tcp));
        }
        let config = cluster.tls_client.clone().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no TLS client configuration")
        })?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(cluster.server_name.clone(), tcp)
            .await?;
        Ok::<_, io::Error>(UpstreamIo::Tls(Box::new(tls)))
    };
    match crate::runtime::timeout(timeout, attempt).await {
        Ok(Ok(io)) => Ok(UpstreamConn::new(io, cluster, key, metrics)),
        Ok(Err(source)) => Err(GatewayError::Connect {
            cluster: cluster.name.to_string(),
            address,
            source,
        }),
        Err(_) => Err(GatewayError::ConnectTimeout {
            cluster: cluster.name.to_string(),
            address,
        }),
    }
}

/// Where a dial to `cluster` goes, as errors name it: `host:port`, and the egress proxy if any.
pub fn dial_address(cluster: &ClusterRoute) -> String {
    let target = &cluster.upstream;
    match &cluster.egress_proxy {
        None => format!("{}:{}", target.host, target.port),
        Some(proxy) => format!(
            "{}:{} through the egress proxy {}",
            target.host, target.port, proxy.url
        ),
    }
}

/// The longest CONNECT answer head accepted from an egress proxy.
const MAX_PROXY_HEAD: usize = 16 * 1024;

/// Asks `proxy` for a tunnel (the prepared CONNECT request) and reads its answer head. A 2xx
/// leaves `stream` as a byte pipe to the member; anything else is an error naming the answer.
async fn open_tunnel(stream: &mut TcpStreamPoll, proxy: &EgressProxy) -> io::Result<()> {
    stream.write_all(&proxy.connect_request).await?;
    stream.flush().await?;
    let mut head = Vec::with_capacity(512);
    let end = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if head.len() > MAX_PROXY_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the egress proxy's answer to CONNECT is longer than {MAX_PROXY_HEAD} bytes"
                ),
            ));
        }
        head.reserve(512);
        if stream.read_buf(&mut head).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the egress proxy closed the connection before answering CONNECT",
            ));
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(&head[..end]) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the egress proxy's answer to CONNECT is not an HTTP response",
            ))
        }
    }
    let code = response.code.unwrap_or(0);
    if !(200..300).contains(&code) {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "the egress proxy answered {code} {} to CONNECT",
                response.reason.unwrap_or_default()
            ),
        ));
    }
    if end < head.len() {
        // Bytes past a 2xx head would be the member's, before the gateway's TLS hello: no proxy
        // does that, and passing them on would mean trusting them.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the egress proxy sent bytes after its answer to CONNECT",
        ));
    }
    Ok(())
}
