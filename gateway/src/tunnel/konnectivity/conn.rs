//! One member connection of a konnectivity agent as a byte pipe (`AsyncRead` / `AsyncWrite`), the
//! shard's end of it. The agent's end is a TCP connection it dialed for a DIAL_REQ; between
//! them the session (`super::session`, on the tunnel thread) carries DATA packets.
//!
//! ANP has no flow control per connection (every connection shares one gRPC stream), so
//! fleetgate bounds each direction itself:
//! - towards the agent, a writer may have at most [`MAX_IN_FLIGHT`] bytes queued to the session
//!   and not yet framed; past that its write waits (the session wakes it), so a fast writer
//!   cannot grow the session's queue;
//! - from the agent, the session hands DATA to this connection's queue and counts it; a reader
//!   that falls more than [`MAX_UNREAD`] behind (a watch whose client stopped reading) gets its
//!   connection closed (CLOSE_REQ to the agent, an error to the reader) instead of stopping the
//!   gRPC stream that every other connection of the agent rides.
//!
//! Runtime-agnostic (futures channels and atomic wakers): polled from a shard's monoio runtime,
//! fed by the tunnel thread's tokio runtime. Never blocks; dropping it closes the connection.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures_util::task::AtomicWaker;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tunnel::stream::Unread;

/// Bytes a writer may have queued towards the agent and not yet framed.
pub const MAX_IN_FLIGHT: usize = 256 * 1024;
/// Bytes received for a connection that its reader has not taken yet, at most.
pub const MAX_UNREAD: usize = 4 * 1024 * 1024;
/// The most one write puts into one DATA packet.
const MAX_CHUNK: usize = 32 * 1024;

/// What the shards ask of a session.
pub enum Command {
    Dial {
        address: String,
        reply: futures_channel::oneshot::Sender<Result<KonnectivityConn, String>>,
    },
    Data {
        connect_id: i64,
        data: Bytes,
        shared: Arc<ConnShared>,
    },
    Close {
        connect_id: i64,
        shared: Arc<ConnShared>,
    },
}

/// What the session hands a connection's reader.
pub enum Inbound {
    Data(Bytes),
    /// The agent closed the connection cleanly (its member closed it): end of stream.
    End,
    /// The connection failed: why.
    Failed(String),
}

/// The counters both ends of a connection touch.
#[derive(Default)]
pub struct ConnShared {
    /// Bytes queued towards the agent, not yet framed by the session.
    pub in_flight: AtomicUsize,
    /// The writer waiting for `in_flight` to drop.
    pub writer: AtomicWaker,
    /// Bytes handed to the reader's queue and not taken yet.
    pub unread: AtomicUsize,
}

/// The shard's end of one member connection through a konnectivity agent.
pub struct KonnectivityConn {
    connect_id: i64,
    commands: UnboundedSender<Command>,
    shared: Arc<ConnShared>,
    inbound: UnboundedReceiver<Inbound>,
    /// A received chunk the reader has not finished.
    unread: Unread,
    /// Set once the read side ended (clean or not): later reads repeat it.
    ended: Option<Result<(), String>>,
}

impl KonnectivityConn {
    pub(super) fn new(
        connect_id: i64,
        commands: UnboundedSender<Command>,
        shared: Arc<ConnShared>,
        inbound: UnboundedReceiver<Inbound>,
    ) -> KonnectivityConn {
        KonnectivityConn {
            connect_id,
            commands,
            shared,
            inbound,
            unread: Unread::default(),
            ended: None,
        }
    }

    pub fn connect_id(&self) -> i64 {
        self.connect_id
    }
}

fn reset(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, why.to_owned())
}

impl AsyncRead for KonnectivityConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let KonnectivityConn {
            inbound,
            shared,
            unread,
            ended,
            ..
        } = self.get_mut();
        ready!(unread.poll_read(buf, || loop {
            // Once ended, every later read ends the same way.
            if let Some(end) = ended.as_ref() {
                return Poll::Ready(end.clone().map(|()| None).map_err(|why| reset(&why)));
            }
            *ended = match ready!(Pin::new(&mut *inbound).poll_next(cx)) {
                Some(Inbound::Data(data)) => {
                    shared.unread.fetch_sub(data.len(), Ordering::AcqRel);
                    return Poll::Ready(Ok(Some(data)));
                }
                Some(Inbound::End) => Some(Ok(())),
                Some(Inbound::Failed(why)) => Some(Err(why)),
                // The session ended without a word (it always sends one): not a clean end.
                None => Some(Err("the agent's session ended".to_owned())),
            };
        }))?;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for KonnectivityConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if let Some(Err(why)) = &this.ended {
            return Poll::Ready(Err(reset(why)));
        }
        if this.shared.in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            this.shared.writer.register(cx.waker());
            // The session may have drained in between: look again before sleeping.
            if this.shared.in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
                return Poll::Pending;
            }
        }
        let n = buf.len().min(MAX_CHUNK);
        this.shared.in_flight.fetch_add(n, Ordering::AcqRel);
        let sent = this.commands.unbounded_send(Command::Data {
            connect_id: this.connect_id,
            data: Bytes::copy_from_slice(&buf[..n]),
            shared: this.shared.clone(),
        });
        if sent.is_err() {
            return Poll::Ready(Err(reset("the agent's session ended")));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The session frames what is queued as it comes.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // ANP has no half-close: CLOSE_REQ would end the member's answer too, so the connection
        // closes when it is dropped.
        Poll::Ready(Ok(()))
    }
}

impl Drop for KonnectivityConn {
    fn drop(&mut self) {
        // Queued after this connection's last DATA, so the agent gets them in order.
        let _ = self.commands.unbounded_send(Command::Close {
            connect_id: self.connect_id,
            shared: self.shared.clone(),
        });
    }
}
