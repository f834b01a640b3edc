//! Writes of a tunnel's h2 connection gathered into one socket write (both ends: the agent's h2
//! server and the gateway's h2 client, each over its TLS stream).
//!
//! The `h2` crate flushes its transport before it buffers each DATA frame longer than 256 bytes
//! (its encoder holds one such frame at a time), so every watch event, every small answer, was a
//! TLS record and a `writev` of its own: 500 watches through one tunnel cost the agent one tunnel
//! write per event, as many as the reads from its member. [`Coalesce`] sits between h2 and the
//! TLS stream: a write of less than [`SMALL`] is copied into its buffer, and a flush with new
//! bytes behind it is put off once: the task is woken and the flush reports done, so the other
//! tasks already woken (more member reads with more events) run and queue their frames before
//! h2's connection is polled again. That poll's flush (h2 ends every poll of its connection with
//! one), or its read, writes the whole buffer: several frames in one TLS record, one system call.
//!
//! A write of [`SMALL`] or more (a body streaming: big LIST chunks, exec output) is not copied and
//! not put off: it goes out at once, in one vectored write with whatever small frames are
//! buffered before it. The buffer is written once it holds [`LIMIT`] bytes, is allocated on first
//! use and kept (one per tunnel, not per stream).
//!
//! What this asks of its owner: poll the stream again after a flush, or read from it. h2's
//! connection does both on every poll; nothing else should wrap its transport in this.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes shorter than this are gathered; longer ones go out at once, uncopied.
pub const SMALL: usize = 8 * 1024;
/// The most bytes held before they are written.
pub const LIMIT: usize = 64 * 1024;
/// The most slices one write hands the transport (the buffer and the caller's parts).
const MAX_PARTS: usize = 8;

/// A transport whose small writes are gathered until the task is polled again (module docs).
pub struct Coalesce<S> {
    inner: S,
    buf: Vec<u8>,
    /// How much of `buf` the transport has taken.
    written: usize,
    /// Bytes were buffered since the last flush: the next flush is put off once.
    fresh: bool,
}

impl<S> Coalesce<S> {
    pub fn new(inner: S) -> Self {
        Coalesce {
            inner,
            buf: Vec::new(),
            written: 0,
            fresh: false,
        }
    }

    fn held(&self) -> &[u8] {
        &self.buf[self.written..]
    }

    /// The transport took `n` bytes of what is held.
    fn taken(&mut self, n: usize) {
        self.written += n;
        if self.written == self.buf.len() {
            self.buf.clear();
            self.written = 0;
        }
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes what is buffered; `Ready(Ok)` once all of it is taken.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held().is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.taken(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Gathers `parts` when they are small, else writes them now, after what is held, in one
    /// vectored write. Returns how many of the caller's bytes were taken.
    fn poll_gather(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        if total < SMALL {
            // `buf.len()`, not what is held: a partly written buffer is never grown past its room.
            if self.buf.len() + total > LIMIT {
                ready!(self.poll_drain(cx))?;
            }
            if self.buf.capacity() == 0 {
                self.buf.reserve_exact(LIMIT);
            }
            for part in parts {
                self.buf.extend_from_slice(part);
            }
            self.fresh = true;
            return Poll::Ready(Ok(total));
        }
        loop {
            if self.held().is_empty() {
                return Pin::new(&mut self.inner).poll_write_vectored(cx, parts);
            }
            let held = self.held().len();
            let mut slices = [IoSlice::new(&[]); MAX_PARTS];
            slices[0] = IoSlice::new(&self.buf[self.written..]);
            let count = 1 + parts.len().min(MAX_PARTS - 1);
            slices[1..count].copy_from_slice(&parts[..count - 1]);
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &slices[..count]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.taken(n.min(held));
            if n > held {
                return Poll::Ready(Ok(n - held));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_gather(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_gather(cx, parts)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.fresh {
            // Put off once: the tasks already woken run before this one is polled again.
            this.fresh = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.fresh = false;
        ready!(this.poll_drain(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A put-off flush is due by the time the owner reads again: write before waiting to read.
        if !this.fresh && !this.held().is_empty() {
            if let Poll::Ready(Err(error)) = this.poll_drain(cx) {
                return Poll::Ready(Err(error));
            }
        }
        Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    /// A transport that records each write it takes, taking at most `room` bytes at a time
    /// (`Pending` when `room` is 0), and has `incoming` to read. `gone`: it answers every write
    /// with 0 bytes taken, as a transport that can take no more does.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        room: Option<usize>,
        gone: bool,
        flushes: usize,
        shut: bool,
        incoming: Vec<u8>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.gone {
                return Poll::Ready(Ok(0));
            }
            let n = self.room.map_or(data.len(), |room| room.min(data.len()));
            if n == 0 {
                return Poll::Pending;
            }
            self.writes.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        /// All parts as one write (as a TLS stream's vectored write seals them together).
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            parts: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            self.poll_write(cx, &all)
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.incoming.len().min(out.remaining());
            out.put_slice(&self.incoming[..n]);
            self.incoming.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn context() -> (Arc<CountingWaker>, Waker) {
        let count = Arc::new(CountingWaker::default());
        (count.clone(), Waker::from(count))
    }

    fn write(c: &mut Coalesce<Recorder>, cx: &mut Context<'_>, data: &[u8]) -> Poll<usize> {
        Pin::new(c).poll_write(cx, data).map(|r| r.unwrap())
    }

    fn flush(c: &mut Coalesce<Recorder>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(c).poll_flush(cx).map(|r| r.unwrap())
    }

    /// Over a slow transport: one that takes at most `room` bytes a write.
    fn over_slow(room: usize) -> Coalesce<Recorder> {
        Coalesce::new(Recorder {
            room: Some(room),
            ..Default::default()
        })
    }

    /// h2's pattern: a flush before each frame and one at the end of the poll, then the next
    /// poll's flush. All frames leave in one write, after the task was woken once.
    #[test]
    fn frames_of_one_poll_leave_in_one_write_on_the_next() {
        let (wakes, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        for frame in [&b"one"[..], b"two", b"three"] {
            assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
            assert_eq!(write(&mut c, &mut cx, frame), Poll::Ready(frame.len()));
        }
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert!(
            c.inner.writes.is_empty(),
            "nothing written before the next poll"
        );
        assert!(
            wakes.0.load(Ordering::Relaxed) >= 1,
            "the task must be polled again"
        );
        // The next poll: no new frame, the flush writes everything at once, then flushes.
        let flushes = c.inner.flushes;
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.inner.writes, vec![b"onetwothree".to_vec()]);
        assert_eq!(c.inner.flushes, flushes + 1);
        // Nothing left: a flush goes straight through.
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.inner.writes.len(), 1);
    }

    #[test]
    fn a_read_writes_what_a_put_off_flush_left() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder {
            incoming: b"ping".to_vec(),
            ..Default::default()
        });
        assert!(write(&mut c, &mut cx, b"frame").is_ready());
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        let mut room = [0u8; 8];
        let mut out = ReadBuf::new(&mut room);
        assert!(Pin::new(&mut c).poll_read(&mut cx, &mut out).is_ready());
        assert_eq!(out.filled(), b"ping");
        assert_eq!(c.inner.writes, vec![b"frame".to_vec()]);
    }

    #[test]
    fn a_read_before_any_flush_keeps_the_frames() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"frame").is_ready());
        let mut room = [0u8; 8];
        let mut out = ReadBuf::new(&mut room);
        assert!(Pin::new(&mut c).poll_read(&mut cx, &mut out).is_ready());
        assert!(c.inner.writes.is_empty());
    }

    #[test]
    fn a_full_buffer_is_written_before_more_is_taken() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder::default());
        let frame = vec![7u8; SMALL - 1];
        let fit = LIMIT / frame.len();
        for _ in 0..fit {
            assert_eq!(write(&mut c, &mut cx, &frame), Poll::Ready(frame.len()));
        }
        assert!(c.inner.writes.is_empty());
        assert_eq!(write(&mut c, &mut cx, &frame), Poll::Ready(frame.len()));
        assert!(
            c.inner.writes == vec![frame.repeat(fit)],
            "the full buffer, in one write"
        );
        assert!(c.held() == &frame[..], "the last frame held");
    }

    /// A streaming body's chunk is neither copied nor put off: it leaves at once, in one write
    /// with the small frames held before it, and the next flush goes straight through.
    #[test]
    fn a_big_write_leaves_at_once_with_what_is_held() {
        let (wakes, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"head").is_ready());
        let body = vec![1u8; SMALL];
        assert_eq!(write(&mut c, &mut cx, &body), Poll::Ready(SMALL));
        assert!(
            c.inner.writes == vec![[&b"head"[..], &body].concat()],
            "one write, in order"
        );
        assert!(c.held().is_empty());
        // Only the small head was fresh, and it left: the flush is not put off.
        c.fresh = false;
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(wakes.0.load(Ordering::Relaxed), 0);
        assert_eq!(c.inner.flushes, 1);
    }

    /// A transport that takes only part of what is held before a big write: the held bytes
    /// leave first, in order, and the caller is told only of its own bytes taken.
    #[test]
    fn a_big_write_behind_a_slow_transport_keeps_order() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = over_slow(3);
        assert!(write(&mut c, &mut cx, b"abcde").is_ready());
        let body = vec![9u8; SMALL];
        let mut sent = 0;
        while sent < body.len() {
            match write(&mut c, &mut cx, &body[sent..]) {
                Poll::Ready(n) => sent += n,
                Poll::Pending => panic!("the transport always takes something"),
            }
        }
        // The rest of the body was small enough to be gathered: two flushes write it.
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        let out = c.inner.writes.concat();
        assert!(
            out == [&b"abcde"[..], &body].concat(),
            "{} bytes out, in the wrong order",
            out.len()
        );
    }

    #[test]
    fn vectored_parts_are_gathered() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder::default());
        let parts = [io::IoSlice::new(b"header"), io::IoSlice::new(b"payload")];
        let n = Pin::new(&mut c).poll_write_vectored(&mut cx, &parts);
        assert!(matches!(n, Poll::Ready(Ok(13))));
        assert!(c.is_write_vectored());
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.inner.writes, vec![b"headerpayload".to_vec()]);
    }

    /// A transport that takes a little at a time, then nothing: the flush waits, and the
    /// bytes go out in order once it takes again.
    #[test]
    fn a_slow_transport_gets_every_byte_in_order() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = over_slow(3);
        assert!(write(&mut c, &mut cx, b"abcdefgh").is_ready());
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        c.inner.room = Some(0);
        assert_eq!(flush(&mut c, &mut cx), Poll::Pending);
        c.inner.room = Some(3);
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.inner.writes.concat(), b"abcdefgh");
    }

    #[test]
    fn shutdown_writes_what_is_left_first() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"goaway").is_ready());
        assert!(Pin::new(&mut c).poll_shutdown(&mut cx).is_ready());
        assert_eq!(c.inner.writes, vec![b"goaway".to_vec()]);
        assert!(c.inner.shut);
    }

    #[test]
    fn a_transport_that_takes_nothing_is_an_error() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut c = Coalesce::new(Recorder {
            gone: true,
            ..Default::default()
        });
        assert!(matches!(
            Pin::new(&mut c).poll_write(&mut cx, b"x"),
            Poll::Ready(Ok(1))
        ));
        assert!(matches!(
            Pin::new(&mut c).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        match Pin::new(&mut c).poll_flush(&mut cx) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::WriteZero),
            _ => panic!("a transport taking nothing must fail the flush"),
        }
    }
}
