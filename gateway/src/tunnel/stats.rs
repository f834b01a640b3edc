//! Each Tunnel cluster's counters for `/metrics`: tunnels accepted, member connections (tunnel
//! streams or konnectivity connections) open and opened, bytes each way. A connection counts
//! through [`Counted`], a wrapper that adds to its cluster's counters as bytes pass; the agent's
//! side counts nothing.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Counters a cluster's connections add to; relaxed atomics, one add per read or write (a
/// tunnel connection crosses threads anyway: its frames are the tunnel thread's work).
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Tunnels accepted (an agent that reconnects counts again).
    pub connects: AtomicU64,
    /// Member connections through the cluster's tunnels open now, and opened in all.
    pub open: AtomicU64,
    pub opened: AtomicU64,
    /// Bytes read from the member and written to it.
    pub read: AtomicU64,
    pub written: AtomicU64,
}

/// A member connection through a tunnel, counted in its cluster's [`StreamStats`].
pub struct Counted<T> {
    inner: T,
    stats: Arc<StreamStats>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, stats: Arc<StreamStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        stats.opened.fetch_add(1, Ordering::Relaxed);
        Counted { inner, stats }
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        this.stats.read.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.stats.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        this.stats.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
