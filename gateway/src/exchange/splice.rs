//! Byte splicing for upgraded connections (exec, attach, port-forward over SPDY/3.1 or
//! WebSocket): after the member's 101 the gateway stops speaking HTTP and copies bytes both ways
//! until both sides have closed.
//!
//! One buffer per direction, allocated once and reused for the session's life; bytes are written
//! from the buffer they were read into (DESIGN.md's "zero-copy": no copy between user-space
//! buffers). Bytes that arrived past either head before the switch are written first, straight
//! from the buffer that read them. A side's end of stream becomes `shutdown(write)` on the other
//! side (half-close), and the other direction keeps flowing; an error on either side ends the
//! whole splice, and the caller drops both connections. There is never a timeout here: an exec
//! session may sit idle for hours. The one other end is the route's retirement (its cluster was
//! removed or its credentials changed): the splice stops at once and the caller closes both
//! connections, as a member restart would. Runtime-neutral (tokio's I/O traits on readiness streams);
//! never parses anything. Called by the pipeline (`handle`) once a 101 has been relayed.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[cfg(test)]
mod tests;

/// Size of each direction's buffer: large enough that a 1 MiB stdin takes a few dozen reads,
/// small enough that thousands of idle sessions cost little.
const SPLICE_BUFFER: usize = 16 * 1024;

/// Bytes a direction moves in one go before it lets the shard's other connections run.
const TURN_BYTES: usize = 256 * 1024;

/// How many bytes went each way, for the log line at the end of a session.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpliceTotals {
    pub client_to_member: u64,
    pub member_to_client: u64,
    /// The session was cut because its route was retired, not closed by either side.
    pub retired: bool,
}

/// Why a splice ended early.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    #[error("reading from the client failed")]
    ClientRead(#[source] io::Error),
    #[error("writing to the client failed")]
    ClientWrite(#[source] io::Error),
    #[error("reading from the member failed")]
    MemberRead(#[source] io::Error),
    #[error("writing to the member failed")]
    MemberWrite(#[source] io::Error),
}

/// One direction of the splice: its leftover bytes from before the switch, its buffer, and how
/// far it has got.
struct Direction {
    /// Bytes read with the head (past its end), written before anything else.
    pending: BytesMut,
    /// Allocated on the first read, then reused.
    buf: Vec<u8>,
    /// `buf[start..end]` is read but not yet written.
    start: usize,
    end: usize,
    /// Written since the last flush (TLS streams hold written bytes until flushed).
    unflushed: bool,
    /// The reader reached end of stream.
    read_closed: bool,
    /// The writer was shut down after the reader's end: this direction is finished.
    done: bool,
    total: u64,
    /// Bytes read since this direction last waited or yielded.
    turn: usize,
}

/// Which I/O step failed, so the error names the side.
enum Step {
    Read(io::Error),
    Write(io::Error),
}

impl Direction {
    fn new(pending: BytesMut) -> Self {
        Direction {
            pending,
            buf: Vec::new(),
            start: 0,
            end: 0,
            unflushed: false,
            read_closed: false,
            done: false,
            total: 0,
            turn: 0,
        }
    }

    /// Moves bytes from `reader` to `writer` until the reader has nothing more now (Pending) or
    /// has ended and the writer is shut down (Ready(Ok)).
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<Result<(), Step>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if !self.pending.is_empty() {
                let n =
                    ready!(writer.as_mut().poll_write(cx, &self.pending)).map_err(Step::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(Step::Write(io::ErrorKind::WriteZero.into())));
                }
                self.pending.advance(n);
                self.total += n as u64;
                self.unflushed = true;
                if self.pending.is_empty() {
                    // Give its memory back: it was the head's read buffer.
                    self.pending = BytesMut::new();
                }
                continue;
            }
            if self.start < self.end {
                let n = ready!(writer
                    .as_mut()
                    .poll_write(cx, &self.buf[self.start..self.end]))
                .map_err(Step::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(Step::Write(io::ErrorKind::WriteZero.into())));
                }
                self.start += n;
                self.total += n as u64;
                self.unflushed = true;
                continue;
            }
            if self.read_closed {
                ready!(writer.as_mut().poll_flush(cx)).map_err(Step::Write)?;
                ready!(writer.as_mut().poll_shutdown(cx)).map_err(Step::Write)?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            if self.turn >= TURN_BYTES {
                // Always ready on both sides: let the shard's other connections run first.
                if self.unflushed {
                    ready!(writer.as_mut().poll_flush(cx)).map_err(Step::Write)?;
                    self.unflushed = false;
                }
                self.turn = 0;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if self.buf.is_empty() {
                self.buf = vec![0; SPLICE_BUFFER];
            }
            let mut read = ReadBuf::new(&mut self.buf);
            match reader.as_mut().poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    self.start = 0;
                    self.end = n;
                    self.turn += n;
                    if n == 0 {
                        self.read_closed = true;
                    }
                }
                // A TLS peer that closes its socket without close_notify: for a spliced stream
                // that is just the end (kubelet and kubectl both do it).
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.read_closed = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Step::Read(e))),
                Poll::Pending => {
                    self.turn = 0;
                    // Nothing more to read now: push out what was written so the other side
                    // sees it (a keystroke, a prompt) before the next read completes.
                    if self.unflushed {
                        ready!(writer.as_mut().poll_flush(cx)).map_err(Step::Write)?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Copies bytes between `client` and `member` both ways until both directions have ended,
/// writing `client_pending` to the member and `member_pending` to the client first. End of stream
/// on one side shuts down the other side's write half; an error on either side ends the splice
/// (the caller then drops both connections). `retired` completing (the route's
/// `RetirementListener`) ends the splice too, with [`SpliceTotals::retired`] set.
pub async fn splice<C, M, R>(
    client: &mut C,
    member: &mut M,
    client_pending: BytesMut,
    member_pending: BytesMut,
    retired: R,
) -> Result<SpliceTotals, SpliceError>
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    M: AsyncRead + AsyncWrite + Unpin + ?Sized,
    R: Future<Output = ()>,
{
    let mut upward = Direction::new(client_pending);
    let mut downward = Direction::new(member_pending);
    let mut retired = std::pin::pin!(retired);
    let mut cut = false;
    poll_fn(|cx| {
        let up = upward.poll_copy(cx, Pin::new(&mut *client), Pin::new(&mut *member));
        if let Poll::Ready(Err(step)) = up {
            return Poll::Ready(Err(match step {
                Step::Read(e) => SpliceError::ClientRead(e),
                Step::Write(e) => SpliceError::MemberWrite(e),
            }));
        }
        let down = downward.poll_copy(cx, Pin::new(&mut *member), Pin::new(&mut *client));
        if let Poll::Ready(Err(step)) = down {
            return Poll::Ready(Err(match step {
                Step::Read(e) => SpliceError::MemberRead(e),
                Step::Write(e) => SpliceError::ClientWrite(e),
            }));
        }
        if up.is_ready() && down.is_ready() {
            Poll::Ready(Ok(()))
        } else if retired.as_mut().poll(cx).is_ready() {
            cut = true;
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await?;
    Ok(SpliceTotals {
        client_to_member: upward.total,
        member_to_client: downward.total,
        retired: cut,
    })
}
