//! One tunnel stream as a byte pipe: an h2 stream's DATA both ways behind tokio's `AsyncRead` /
//! `AsyncWrite`, so the exchange treats a stream to a pull-mode member as it treats a TCP or TLS
//! connection to a direct one (the member's HTTP/1.1 request head and body go in, its response
//! comes out, an upgrade is spliced). The agent's side is `super::carry`.
//!
//! Flow control is per stream: received bytes are given back to the sender's window only once the
//! reader took them, so a reader that stops (a watch whose client stopped reading) stops its
//! sender at one window ([`super::wire::STREAM_WINDOW`]) while the other streams of the tunnel go
//! on. Shutting the write side down ends the stream (END_STREAM), a half-close the peer passes
//! on; dropping it unfinished resets the stream. Runtime-agnostic (the `h2` crate's handles are
//! polled from a shard's monoio runtime); never blocks.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most one write hands to h2 at once (it copies the bytes into a frame buffer).
const MAX_WRITE: usize = 64 * 1024;

/// An h2 stream carrying bytes both ways.
pub struct TunnelStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// Received bytes the reader has not taken yet (their window is not released yet).
    unread: Bytes,
    /// Whether END_STREAM was sent.
    finished: bool,
}

impl TunnelStream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        TunnelStream {
            send,
            recv,
            unread: Bytes::new(),
            finished: false,
        }
    }
}

/// An h2 failure as the I/O error a byte pipe reports.
pub(super) fn broken(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::ErrorKind::BrokenPipe.into());
    }
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.unread.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                Some(Ok(data)) => this.unread = data,
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread.split_to(n));
        // Only now may the sender send more: the window follows the reader.
        let _ = this.recv.flow_control().release_capacity(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.finished {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let want = buf.len().min(MAX_WRITE);
        this.send.reserve_capacity(want);
        loop {
            let granted = this.send.capacity();
            if granted > 0 {
                let n = granted.min(want);
                this.send
                    .send_data(Bytes::copy_from_slice(&buf[..n]), false)
                    .map_err(broken)?;
                return Poll::Ready(Ok(n));
            }
            match ready!(this.send.poll_capacity(cx)) {
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                Some(Ok(_)) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes frames as they are queued.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.finished {
            this.finished = true;
            this.send.send_data(Bytes::new(), true).map_err(broken)?;
        }
        Poll::Ready(Ok(()))
    }
}
