//! The response body, member to client, for both front-ends: read by read, each read handed to the
//! front-end's [`ResponseSink`] before the next one is made, so a slow client holds at most one
//! read of the member's body and a watch event leaves in the loop turn it arrived in.
//!
//! Chunked bodies: the HTTP/1.1 client gets the bytes as they came (the scanner validates the
//! framing and says where the body ends); an h2 client gets each chunk's data as DATA frames,
//! sliced out of the read buffer without copying. Long-running responses (watch, `logs -f`) also
//! watch the client, so one that goes away releases the member at once, and the route's
//! retirement, ending the stream cleanly between chunks (`retired`); a watch ends so too when the
//! shard drains, so that its client resumes on another replica from its last resourceVersion
//! instead of listing again (a cut stream is an error to client-go, and an error relists). An
//! ordinary response whose
//! client stops reading is cut after [`CLIENT_WRITE_TIMEOUT`] (its member connection is dropped).
//! Called by the front-ends after `exchange::send`; never parses a request.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt as _;
use tokio::io::AsyncReadExt;

use super::retired::{retired_end, RetiredEnd, FINISH_CHUNK_WITHIN};
use super::{Answer, Failure, IDLE_STREAM_BUFFER, READ_CHUNK};
use crate::upstream::UpstreamIo;

#[cfg(test)]
mod tests;

/// Bytes relayed before the stream lets the shard's other connections run (a member and client
/// that are always ready would otherwise keep the shard to themselves for a whole big LIST).
const TURN_BYTES: usize = 256 * 1024;
use crate::codec::http1::BodyProgress;
use crate::runtime::shutdown::{DrainStarted, ShardDrain};
use crate::runtime::{self, First};

/// What a waiting long-running stream saw of its client.
pub(crate) enum ClientEvent {
    /// The client closed, reset the stream, or sent more than it may while a response streams.
    Gone,
    /// The client sent bytes that were kept (a pipelined request, read after this response).
    Sent,
}

/// The client side of a response body.
pub(crate) trait ResponseSink {
    /// Whether a chunked member body goes out decoded (h2 DATA frames) or as it came (HTTP/1.1).
    fn decodes_chunks(&self) -> bool;

    /// Sends one piece of the body (in order), waiting for the client to take it.
    async fn send(&mut self, piece: Bytes) -> Result<(), Failure>;

    /// Makes what was sent go out now (before the relay waits on the member again).
    async fn flush(&mut self) -> Result<(), Failure>;

    /// The body is complete.
    async fn end(&mut self) -> Result<(), Failure>;

    /// Ends the body early and cleanly because its route was retired: `last_chunk` when a chunked
    /// body the client reads as it came needs its last chunk written.
    async fn end_early(&mut self, last_chunk: bool) -> Result<(), Failure>;

    /// Resolves when the client goes away or sends bytes, while a long-running stream waits.
    fn client_event(&mut self) -> impl Future<Output = ClientEvent>;
}

/// How the relay treats a client that does not take the body.
#[derive(Clone, Copy)]
pub(crate) enum Pace<'a> {
    /// A long-running response (`logs -f`, the gateway's own member watches): the client takes
    /// events as it likes.
    LongRunning,
    /// A client's watch: long-running, and ended cleanly between two events once this shard
    /// drains (an `exec` or `logs -f` runs on through the grace period instead).
    Watch(&'a ShardDrain),
    /// An ordinary response: a piece the client has not taken within this time cuts it.
    Ordinary { write_timeout: Duration },
}

/// Relays the body of `answer` to `sink`. Returns whether it ended complete (the member's own
/// end), which is when its connection may be pooled (`exchange::finish`).
pub(crate) async fn relay(
    answer: &mut Answer,
    sink: &mut impl ResponseSink,
    pace: Pace<'_>,
) -> Result<bool, Failure> {
    let long_running = !matches!(pace, Pace::Ordinary { .. });
    let drain = match pace {
        Pace::Watch(drain) => Some(drain),
        _ => None,
    };
    let mut drained = Drained(drain.map(ShardDrain::started));
    let conn = &mut answer.conn;
    let mut progress = BodyProgress::new(answer.body);
    let decode = matches!(progress, BodyProgress::Chunked(_)) && sink.decodes_chunks();
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    // Registered with the route on the first idle wait; afterwards one atomic load per poll.
    // Borrowed, not cloned: no shared reference count touched per response.
    let retirement = &*conn.retirement;
    let mut retired = retirement.listen();
    let mut finish_chunk_by: Option<Instant> = None;
    let mut turn = 0;
    loop {
        if turn >= TURN_BYTES {
            turn = 0;
            runtime::yield_now().await;
        }
        if !conn.buf.is_empty() && !progress.is_done() {
            match &mut progress {
                BodyProgress::Chunked(scanner) if decode => {
                    ranges.clear();
                    let consumed = scanner
                        .scan_data(&conn.buf, |r| ranges.push(r))
                        .map_err(|_| Failure::Abort("invalid chunked framing from member"))?;
                    let read = conn.buf.split_to(consumed).freeze();
                    if scanner.is_done() {
                        progress = BodyProgress::Done;
                    }
                    for range in ranges.drain(..) {
                        send(sink, read.slice(range), pace).await?;
                    }
                }
                progress => {
                    let n = progress
                        .take(&conn.buf)
                        .map_err(|_| Failure::Abort("invalid chunked framing from member"))?;
                    send(sink, conn.buf.split_to(n).freeze(), pace).await?;
                }
            }
        }
        if progress.is_done() {
            paced(pace, sink.end()).await?;
            return Ok(true);
        }
        paced(pace, sink.flush()).await?;
        let ends = retirement.is_retired() || drain.is_some_and(ShardDrain::is_draining);
        if long_running && ends {
            match retired_end(&progress) {
                RetiredEnd::Done => {}
                RetiredEnd::LastChunk => {
                    sink.end_early(!decode).await?;
                    return Ok(false);
                }
                RetiredEnd::Close => {
                    sink.end_early(false).await?;
                    return Ok(false);
                }
                RetiredEnd::Cut => return Err(Failure::Abort("stream ended mid-body")),
                RetiredEnd::FinishChunk => {
                    finish_chunk_by.get_or_insert_with(|| Instant::now() + FINISH_CHUNK_WITHIN);
                }
            }
        }
        // Whatever was split off went to the client. A long-running stream reserves its buffer
        // only once the member has sent something (`idle_read`).
        if !long_running {
            conn.buf.reserve(READ_CHUNK);
        }
        let read = if let Some(deadline) = finish_chunk_by {
            // Retired (or drained) inside a chunk: the rest of it, briefly, then the last chunk.
            let left = deadline.saturating_duration_since(Instant::now());
            match runtime::timeout(left, idle_read(&mut conn.io, &mut conn.buf)).await {
                Ok(read) => read,
                Err(_) => return Err(Failure::Abort("stream ended inside a chunk")),
            }
        } else if long_running {
            let member_or_client =
                runtime::race(idle_read(&mut conn.io, &mut conn.buf), sink.client_event());
            let ends = runtime::race(&mut retired, &mut drained);
            match runtime::race(member_or_client, ends).await {
                First::Left(First::Left(read)) => read,
                First::Left(First::Right(ClientEvent::Gone)) => {
                    return Err(Failure::Abort("client went away during a stream"))
                }
                // Kept for later; checked again at the top of the loop, as are the retirement
                // and the drain.
                First::Left(First::Right(ClientEvent::Sent)) | First::Right(_) => continue,
            }
        } else {
            conn.io.read_buf(&mut conn.buf).await
        };
        match read {
            Ok(0) | Err(_) => {
                if matches!(progress, BodyProgress::UntilClose) {
                    sink.end().await?;
                    return Ok(false);
                }
                // A long-running stream whose member went away between two events (the member
                // restarted, its connection or its agent's tunnel dropped) ends as the member's
                // own end of it would: cleanly, so the client watches again. A client of the
                // member itself sees no error there either (client-go takes a dropped
                // connection as a watch's end), while a reset h2 stream is reported as an
                // undecodable event. Inside an event it is cut.
                if long_running && retired_end(&progress) == RetiredEnd::LastChunk {
                    sink.end_early(!decode).await?;
                    return Ok(false);
                }
                return Err(Failure::Abort("member closed inside the response body"));
            }
            Ok(n) => turn += n,
        }
    }
}

/// A long-running stream's member read. With bytes buffered, it reads behind them as usual.
/// With none, the stream holds no buffer while it waits (a watch may idle for hours): a one-byte
/// read, then whatever else has arrived with it, without waiting, into a buffer reserved now. So
/// an event still leaves whole, in the loop turn it arrived in, at the cost of one more `recv`.
async fn idle_read(io: &mut UpstreamIo, buf: &mut BytesMut) -> std::io::Result<usize> {
    if !buf.is_empty() {
        buf.reserve(IDLE_STREAM_BUFFER);
        return io.read_buf(buf).await;
    }
    *buf = BytesMut::new();
    let mut first = [0u8; 1];
    if io.read(&mut first).await? == 0 {
        return Ok(0);
    }
    buf.reserve(IDLE_STREAM_BUFFER);
    buf.put_u8(first[0]);
    // An error or the end shows on the next read, after this byte went out.
    match io.read_buf(buf).now_or_never() {
        Some(Ok(more)) => Ok(1 + more),
        Some(Err(_)) | None => Ok(1),
    }
}

/// A watch's wait for its shard's drain; never ready for other streams. Ready again on every
/// poll once the drain has begun (the relay's loop looks at the flag itself).
struct Drained<'a>(Option<DrainStarted<'a>>);

impl Future for Drained<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        match &mut self.0 {
            Some(started) => std::pin::Pin::new(started).poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

/// One piece to the sink, paced.
async fn send(sink: &mut impl ResponseSink, piece: Bytes, pace: Pace<'_>) -> Result<(), Failure> {
    paced(pace, sink.send(piece)).await
}

/// A write to the client: for an ordinary response, a client that does not take it within the
/// write timeout is cut (the timer is armed only when the write does not finish at once).
async fn paced(
    pace: Pace<'_>,
    write: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    let Pace::Ordinary { write_timeout } = pace else {
        return write.await;
    };
    match runtime::timeout(write_timeout, write).await {
        Ok(written) => written,
        Err(_) => Err(Failure::Abort("client stopped reading the response")),
    }
}
