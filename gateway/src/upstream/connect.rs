//! Dialing a member cluster: TCP connect and TLS handshake under one connect timeout, giving an
//! [`UpstreamConn`] (the stream, its read buffer, and bookkeeping for the pool).
//!
//! Runtime-specific (monoio) and never called off a shard thread. Called by `proxy` through
//! [`connect`] when the shard's pool has no idle connection for the cluster.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use fleetgate_config_watcher::ClusterRoute;
use monoio::io::IntoPollIo;
use monoio::net::tcp::stream_poll::TcpStreamPoll;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::GatewayError;
use crate::metrics::{GaugeGuard, Metrics};

/// A connection to a member: plaintext or rustls over a readiness-based monoio socket.
pub enum UpstreamIo {
    Plain(TcpStreamPoll),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStreamPoll>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An open connection to one member cluster, with the bytes read from it but not yet relayed.
pub struct UpstreamConn {
    pub io: UpstreamIo,
    /// Bytes read from the member that belong to the current (or, in error, a later) response.
    pub buf: BytesMut,
    /// The [`ClusterRoute::id`] it was opened for: a pool key, so a changed cluster spec never
    /// reuses a connection made with old credentials.
    pub cluster_id: u64,
    /// When it went back to the pool.
    pub idle_since: Instant,
    /// Whether it has carried a request before (a failure on a reused connection may be the
    /// member closing an idle connection, and is retried once on a fresh one).
    pub reused: bool,
    _open: GaugeGuard,
}

impl UpstreamConn {
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

/// Opens a connection to `cluster` (TCP and, for https, the TLS handshake) within `timeout`.
pub async fn connect(
    cluster: &ClusterRoute,
    timeout: Duration,
    metrics: &Arc<Metrics>,
) -> Result<UpstreamConn, GatewayError> {
    let target = &cluster.upstream;
    let address = format!("{}:{}", target.host, target.port);
    let attempt = async {
        let tcp = monoio::net::TcpStream::connect((target.host.as_str(), target.port)).await?;
        tcp.set_nodelay(true)?;
        let tcp = tcp.into_poll_io()?;
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
    match monoio::time::timeout(timeout, attempt).await {
        Ok(Ok(io)) => Ok(UpstreamConn {
            io,
            // Grown by the driver as it reads: a big LIST gets large reads, an idle watch a
            // small buffer.
            buf: BytesMut::new(),
            cluster_id: cluster.id,
            idle_since: Instant::now(),
            reused: false,
            _open: metrics.upstream_connected(&cluster.name),
        }),
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
