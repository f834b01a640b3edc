//! The client's socket as the h2 crate sees it, closed the way HTTP servers close: after h2 has
//! written its last frame and shut down the write side, the client's last bytes are read and
//! dropped until it closes too. Never parses frames. Used by the h2 front-end only.

use tokio::io::{AsyncRead, AsyncWrite};

/// The client stream as h2 sees it, closed the way HTTP servers close: after h2 has written its
/// last frame and shut down the write side, the client's last bytes (the ack of the GOAWAY's PING,
/// its own close) are read and dropped until it closes too. Closing with those bytes unread would
/// answer them with a TCP reset, and the client would see a broken connection instead of a
/// GOAWAY. Bounded by the caller: the close happens inside `accept`, which the GOAWAY loop runs
/// under a timeout.
pub(super) struct LingeringClose<S> {
    io: S,
    write_shut: bool,
}

impl<S> LingeringClose<S> {
    pub(super) fn new(io: S) -> Self {
        LingeringClose {
            io,
            write_shut: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LingeringClose<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LingeringClose<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        if !this.write_shut {
            std::task::ready!(std::pin::Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.write_shut = true;
        }
        let mut scratch = [0u8; 512];
        loop {
            let mut read = tokio::io::ReadBuf::new(&mut scratch);
            match std::pin::Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                // The client is gone one way or another: the close is done.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
