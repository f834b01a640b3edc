//! The client's bytes on their way into the h2 crate, watched frame by frame for what costs the
//! gateway work a client does not pay for, and cut into bounded turns so no connection keeps its
//! shard busy.
//!
//! - Control frames are budgeted per connection (token buckets): SETTINGS cost one plus one per
//!   open stream (a changed initial window size is applied to every stream), PING, PRIORITY,
//!   RST_STREAM and connection-level WINDOW_UPDATE cost one each, each kind with its own rate.
//!   A connection over budget is tripped: nothing more it sends is read, and the front-end sends
//!   GOAWAY(ENHANCE_YOUR_CALM) and closes it.
//! - After [`TURN_BYTES`] read in one go, the read yields (wakes itself and returns Pending) so
//!   the shard's other connections run before this one is read further.
//!
//! Only frame headers are parsed (9 bytes each, plus the 24-byte preface), never payloads; the h2
//! crate still validates everything. Never allocates after construction. Used by the h2
//! front-end, which wraps the client stream in a [`FrameGuard`] before the handshake.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::runtime::clock;

/// Bytes read from one connection before it yields to the shard's other connections.
pub const TURN_BYTES: usize = 64 * 1024;

/// The client connection preface (RFC 9113 section 3.4).
const PREFACE_LEN: usize = 24;

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
}

impl Bucket {
    const fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            tokens: burst,
            rate,
            burst,
        }
    }

    fn refill(&mut self, seconds: f64) {
        self.tokens = (self.tokens + seconds * self.rate).min(self.burst);
    }

    /// Takes `cost` tokens; false when there are not enough.
    fn take(&mut self, cost: f64) -> bool {
        self.tokens -= cost;
        self.tokens >= 0.0
    }
}

/// The budgets of one connection. The rates leave room for every client seen in practice (a
/// SETTINGS at start, PINGs every few seconds, a WINDOW_UPDATE per DATA frame of a big download,
/// a reset per cancelled watch).
#[derive(Debug)]
struct Budgets {
    /// SETTINGS, in stream updates: a frame costs 1 + open streams.
    settings: Bucket,
    ping: Bucket,
    priority: Bucket,
    reset: Bucket,
    /// WINDOW_UPDATE on stream 0 (the connection window: capacity handed to waiting streams).
    connection_window: Bucket,
}

impl Budgets {
    fn new() -> Budgets {
        Budgets {
            settings: Bucket::new(10_000.0, 100_000.0),
            ping: Bucket::new(50.0, 500.0),
            priority: Bucket::new(500.0, 5_000.0),
            reset: Bucket::new(500.0, 5_000.0),
            connection_window: Bucket::new(5_000.0, 50_000.0),
        }
    }

    fn refill(&mut self, seconds: f64) {
        for bucket in [
            &mut self.settings,
            &mut self.ping,
            &mut self.priority,
            &mut self.reset,
            &mut self.connection_window,
        ] {
            bucket.refill(seconds);
        }
    }
}

/// What the front-end shares with its guard: the open stream count (the cost of a SETTINGS) and
/// whether the connection was tripped.
#[derive(Default)]
pub struct Flood {
    tripped: Cell<Option<&'static str>>,
    waker: Cell<Option<Waker>>,
}

impl Flood {
    /// Why the connection was tripped, once it was.
    pub fn tripped(&self) -> Option<&'static str> {
        self.tripped.get()
    }

    /// Resolves once the connection is tripped.
    pub async fn wait(&self) -> &'static str {
        std::future::poll_fn(|cx| match self.tripped.get() {
            Some(why) => Poll::Ready(why),
            None => {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }

    fn trip(&self, why: &'static str) {
        if self.tripped.get().is_none() {
            self.tripped.set(Some(why));
            if let Some(waker) = self.waker.take() {
                waker.wake();
            }
        }
    }
}

/// Where the parser stands in the byte stream.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// Inside the preface: this many bytes of it are still to come.
    Preface(usize),
    /// Inside a frame header: this many of its 9 bytes have been seen.
    Header(usize),
    /// Inside a payload: this many bytes are still to come.
    Payload(usize),
}

/// The client stream, watched. Reads pass through unchanged until the connection is tripped.
pub struct FrameGuard<S> {
    io: S,
    flood: Rc<Flood>,
    open_streams: Rc<dyn Fn() -> usize>,
    budgets: Budgets,
    refilled_at: Instant,
    position: Position,
    header: [u8; 9],
    /// Bytes read since this connection last yielded.
    turn: usize,
}

impl<S> FrameGuard<S> {
    pub fn new(io: S, flood: Rc<Flood>, open_streams: Rc<dyn Fn() -> usize>) -> FrameGuard<S> {
        FrameGuard {
            io,
            flood,
            open_streams,
            budgets: Budgets::new(),
            refilled_at: clock::now(),
            position: Position::Preface(PREFACE_LEN),
            header: [0; 9],
            turn: 0,
        }
    }

    /// Accounts for `bytes`, just read. Trips the connection when a budget runs out.
    fn account(&mut self, mut bytes: &[u8]) {
        let now = clock::now();
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        if elapsed > 0.0 {
            self.budgets.refill(elapsed);
            self.refilled_at = now;
        }
        while !bytes.is_empty() {
            match self.position {
                // Bytes passed over until the next frame header.
                Position::Preface(left) | Position::Payload(left) => {
                    let n = left.min(bytes.len());
                    bytes = &bytes[n..];
                    self.position = match self.position {
                        _ if n == left => Position::Header(0),
                        Position::Preface(_) => Position::Preface(left - n),
                        _ => Position::Payload(left - n),
                    };
                }
                Position::Header(seen) => {
                    let n = (9 - seen).min(bytes.len());
                    self.header[seen..seen + n].copy_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if seen + n < 9 {
                        self.position = Position::Header(seen + n);
                        continue;
                    }
                    let length =
                        u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]);
                    let header = self.header;
                    self.frame(header[3], header[4], &header[5..9]);
                    self.position = if length == 0 {
                        Position::Header(0)
                    } else {
                        Position::Payload(length as usize)
                    };
                }
            }
        }
    }

    /// One frame header: charges its budget, and trips the connection when that runs out.
    fn frame(&mut self, kind: u8, flags: u8, stream: &[u8]) {
        const ACK: u8 = 0x1;
        let stream = u32::from_be_bytes([stream[0], stream[1], stream[2], stream[3]]) & 0x7fff_ffff;
        let budgets = &mut self.budgets;
        let (bucket, cost, why) = match kind {
            // SETTINGS (an ACK costs nothing): a changed initial window touches every stream.
            0x4 if flags & ACK == 0 => (
                &mut budgets.settings,
                1.0 + (self.open_streams)() as f64,
                "SETTINGS flood",
            ),
            // PING (an ACK answers the gateway's own).
            0x6 if flags & ACK == 0 => (&mut budgets.ping, 1.0, "PING flood"),
            0x2 => (&mut budgets.priority, 1.0, "PRIORITY flood"),
            0x3 => (&mut budgets.reset, 1.0, "RST_STREAM flood"),
            0x8 if stream == 0 => (&mut budgets.connection_window, 1.0, "WINDOW_UPDATE flood"),
            _ => return,
        };
        if !bucket.take(cost) {
            self.flood.trip(why);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.flood.tripped().is_some() {
            // Nothing more is read from a tripped connection; the front-end closes it.
            return Poll::Pending;
        }
        if this.turn >= TURN_BYTES {
            // Let the shard's other connections run first.
            this.turn = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                this.turn += read.len();
                this.account(read);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                this.turn = 0;
                Poll::Pending
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
