//! One tunnel stream as a byte pipe: an h2 stream's DATA both ways behind tokio's `AsyncRead` /
//! `AsyncWrite`, so the exchange treats a stream to a pull-mode member as it treats a TCP or TLS
//! connection to a direct one (the member's HTTP/1.1 request head and body go in, its response
//! comes out, an upgrade is spliced). The agent's side is `agent/carry.rs`.
//!
//! Flow control is per stream: received bytes are given back to the sender's window only once the
//! reader took them, so a reader that stops (a watch whose client stopped reading) stops its
//! sender at one window ([`super::wire::STREAM_WINDOW`]) while the other streams of the tunnel go
//! on. Shutting the write side down ends the stream (END_STREAM), a half-close the peer passes
//! on; dropping it unfinished resets the stream. Runtime-agnostic (the `h2` crate's handles are
//! polled from a shard's monoio runtime); never blocks.
//!
//! [`Unread`], the rest of a received chunk handed out as the reader asks, is shared with the
//! konnectivity connection (`konnectivity::conn`), the other byte pipe fed chunk by chunk.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::wire::broken;

/// The most one write hands to h2 at once (it copies the bytes into a frame buffer).
const MAX_WRITE: usize = 64 * 1024;

/// An h2 stream carrying bytes both ways.
pub struct TunnelStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// Received bytes the reader has not taken yet (their window is not released yet).
    unread: Unread,
    /// Whether END_STREAM was sent.
    finished: bool,
}

impl TunnelStream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        TunnelStream {
            send,
            recv,
            unread: Unread::default(),
            finished: false,
        }
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let TunnelStream { recv, unread, .. } = self.get_mut();
        let n = ready!(unread.poll_read(buf, || {
            Poll::Ready(ready!(recv.poll_data(cx)).transpose().map_err(broken))
        }))?;
        // Only now may the sender send more: the window follows the reader.
        let _ = recv.flow_control().release_capacity(n);
        Poll::Ready(Ok(()))
    }
}

/// What a byte pipe over a channel of chunks (a tunnel stream, a konnectivity connection) has
/// received and its reader not taken yet: the rest of the last chunk.
#[derive(Default)]
pub(super) struct Unread(Bytes);

impl Unread {
    /// Hands `buf` as much of the held chunk as fits, taking the next chunk from `next` first
    /// when none is held (`None` from it: the end of the stream); how many bytes it handed.
    pub(super) fn poll_read(
        &mut self,
        buf: &mut ReadBuf<'_>,
        mut next: impl FnMut() -> Poll<io::Result<Option<Bytes>>>,
    ) -> Poll<io::Result<usize>> {
        while self.0.is_empty() {
            match ready!(next())? {
                Some(chunk) => self.0 = chunk,
                None => return Poll::Ready(Ok(0)),
            }
        }
        let n = self.0.len().min(buf.remaining());
        buf.put_slice(&self.0.split_to(n));
        Poll::Ready(Ok(n))
    }
}

impl TunnelStream {
    /// Queues up to `len` bytes (at most [`MAX_WRITE`], as much as the stream's window allows),
    /// made by `take(n)`, as one DATA frame; how many it took.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        take: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        if self.finished {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let want = len.min(MAX_WRITE);
        self.send.reserve_capacity(want);
        let granted = loop {
            match self.send.capacity() {
                0 => match ready!(self.send.poll_capacity(cx)) {
                    None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                    Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                    Some(Ok(_)) => {}
                },
                granted => break granted,
            }
        };
        let n = granted.min(want);
        self.send.send_data(take(n), false).map_err(broken)?;
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_send(cx, buf.len(), |n| Bytes::copy_from_slice(&buf[..n]))
    }

    /// The pieces as one DATA frame: copied into one buffer, as a single piece is.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        self.get_mut().poll_send(cx, len, |n| {
            let mut out = BytesMut::with_capacity(n);
            for b in bufs {
                let room = n - out.len();
                out.extend_from_slice(&b[..b.len().min(room)]);
                if out.len() == n {
                    break;
                }
            }
            out.freeze()
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A gateway-side stream (h2 client, as the gateway is on a tunnel) and the agent's end of it.
    async fn pair() -> (TunnelStream, RecvStream) {
        let (gateway, agent) = tokio::io::duplex(256 * 1024);
        let (mut open, connection) = h2::client::handshake(gateway).await.unwrap();
        tokio::spawn(connection);
        let accepting = tokio::spawn(async move {
            let mut server = h2::server::handshake(agent).await.unwrap();
            let (request, mut respond) = server.accept().await.unwrap().unwrap();
            let response = http::Response::new(());
            respond.send_response(response, false).unwrap();
            tokio::spawn(async move { while server.accept().await.is_some() {} });
            request.into_body()
        });
        open = open.ready().await.unwrap();
        let (response, send) = open.send_request(http::Request::new(()), false).unwrap();
        let recv = accepting.await.unwrap();
        let recv_back = response.await.unwrap().into_body();
        (TunnelStream::new(send, recv_back), recv)
    }

    #[tokio::test]
    async fn a_chain_of_pieces_goes_out_as_one_data_frame() {
        let (mut stream, mut agent) = pair().await;
        assert!(stream.is_write_vectored());
        // A chunk as the HTTP/1.1 codec writes it: size line, data, CRLF.
        let mut chunk = bytes::Buf::chain(
            bytes::Buf::chain(&b"5\r\n"[..], &b"hello"[..]),
            &b"\r\n"[..],
        );
        stream.write_all_buf(&mut chunk).await.unwrap();
        let frame = agent.data().await.unwrap().unwrap();
        assert_eq!(
            &frame[..],
            b"5\r\nhello\r\n",
            "one frame, the pieces in order"
        );
        // A single piece still goes as it came.
        stream.write_all(b"0\r\n\r\n").await.unwrap();
        stream.shutdown().await.unwrap();
        // The rest, to END_STREAM (an empty frame carries it).
        let rest = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut rest = Vec::new();
            while let Some(data) = agent.data().await {
                rest.extend_from_slice(&data.unwrap());
            }
            rest
        })
        .await
        .expect("END_STREAM after shutdown");
        assert_eq!(rest, b"0\r\n\r\n");
    }
}
