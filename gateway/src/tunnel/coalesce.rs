//! Writes of a tunnel's h2 connection gathered into one socket write (both ends: the agent's h2
//! server and the gateway's h2 client, each over its TLS stream).
//!
//! The `h2` crate flushes its transport before it buffers each DATA frame longer than 256 bytes
//! (its encoder holds one such frame at a time), so every watch event, every small answer, is a
//! TLS record and a `writev` of its own: 500 watches through one tunnel cost the agent one tunnel
//! write per event, as many as the reads from its member. [`Coalesce`] sits between h2 and the
//! TLS stream: a write of less than [`LIMIT`] is copied into its buffer, and a flush with new
//! bytes behind it is put off once: the task is woken and the flush reports done, so the other
//! tasks already woken (more member reads with more events) run and queue their frames before
//! h2's connection is polled again. That poll's flush (h2 ends every poll of its connection with
//! one), or its read, writes the whole buffer: several frames in one TLS record, one system call.
//!
//! What this asks of its owner: poll the stream again after a flush, or read from it. h2's
//! connection does both on every poll; nothing else should wrap its transport in this. A buffer
//! reaching [`LIMIT`] is written at once, and a write that large goes through as it is, so bulk
//! bodies (64 KiB DATA frames) are not copied. The buffer is allocated on first use and kept
//! (one per tunnel, not per stream).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes held before they are written; a write of this size or more is not copied.
pub const LIMIT: usize = 64 * 1024;

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

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn copy_in(&mut self, data: &[u8]) {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(LIMIT);
        }
        self.buf.extend_from_slice(data);
        self.fresh = true;
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes what is buffered; `Ready(Ok)` once all of it is taken.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.buf.len() + data.len() > LIMIT {
            ready!(this.poll_drain(cx))?;
        }
        if data.len() >= LIMIT {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        this.copy_in(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        parts: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        if this.buf.len() + total > LIMIT {
            ready!(this.poll_drain(cx))?;
        }
        if total >= LIMIT {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, parts);
        }
        for part in parts {
            this.copy_in(part);
        }
        Poll::Ready(Ok(total))
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
        if !this.fresh && this.written < this.buf.len() {
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
    /// (`Pending` when `room` is 0), and has `incoming` to read.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        room: Option<usize>,
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
            let n = self.room.map_or(data.len(), |room| room.min(data.len()));
            if n == 0 {
                return Poll::Pending;
            }
            self.writes.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
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
            c.get_ref().writes.is_empty(),
            "nothing written before the next poll"
        );
        assert!(
            wakes.0.load(Ordering::Relaxed) >= 1,
            "the task must be polled again"
        );
        // The next poll: no new frame, the flush writes everything at once, then flushes.
        let flushes = c.get_ref().flushes;
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.get_ref().writes, vec![b"onetwothree".to_vec()]);
        assert_eq!(c.get_ref().flushes, flushes + 1);
        // Nothing left: a flush goes straight through.
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.get_ref().writes.len(), 1);
    }

    #[test]
    fn a_read_writes_what_a_put_off_flush_left() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
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
        assert_eq!(c.get_ref().writes, vec![b"frame".to_vec()]);
    }

    #[test]
    fn a_read_before_any_flush_keeps_the_frames() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"frame").is_ready());
        let mut room = [0u8; 8];
        let mut out = ReadBuf::new(&mut room);
        assert!(Pin::new(&mut c).poll_read(&mut cx, &mut out).is_ready());
        assert!(c.get_ref().writes.is_empty());
    }

    #[test]
    fn a_full_buffer_is_written_before_more_is_taken() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        let frame = vec![7u8; LIMIT / 2 + 1];
        assert_eq!(write(&mut c, &mut cx, &frame), Poll::Ready(frame.len()));
        assert!(c.get_ref().writes.is_empty());
        assert_eq!(write(&mut c, &mut cx, &frame), Poll::Ready(frame.len()));
        assert_eq!(c.get_ref().writes, vec![frame.clone()]);
        assert_eq!(c.buf, frame);
    }

    #[test]
    fn a_big_write_goes_through_uncopied() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"head").is_ready());
        let body = vec![1u8; LIMIT];
        assert_eq!(write(&mut c, &mut cx, &body), Poll::Ready(LIMIT));
        assert_eq!(c.get_ref().writes, vec![b"head".to_vec(), body]);
        assert!(c.buf.is_empty());
    }

    #[test]
    fn vectored_parts_are_gathered() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        let parts = [io::IoSlice::new(b"header"), io::IoSlice::new(b"payload")];
        let n = Pin::new(&mut c).poll_write_vectored(&mut cx, &parts);
        assert!(matches!(n, Poll::Ready(Ok(13))));
        assert!(c.is_write_vectored());
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.get_ref().writes, vec![b"headerpayload".to_vec()]);
    }

    /// A transport that takes a little at a time, then nothing: the flush waits, and the
    /// bytes go out in order once it takes again.
    #[test]
    fn a_slow_transport_gets_every_byte_in_order() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder {
            room: Some(3),
            ..Default::default()
        });
        assert!(write(&mut c, &mut cx, b"abcdefgh").is_ready());
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        c.inner.room = Some(0);
        assert_eq!(flush(&mut c, &mut cx), Poll::Pending);
        c.inner.room = Some(3);
        assert_eq!(flush(&mut c, &mut cx), Poll::Ready(()));
        assert_eq!(c.get_ref().writes.concat(), b"abcdefgh");
    }

    #[test]
    fn shutdown_writes_what_is_left_first() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Recorder::default());
        assert!(write(&mut c, &mut cx, b"goaway").is_ready());
        assert!(Pin::new(&mut c).poll_shutdown(&mut cx).is_ready());
        assert_eq!(c.get_ref().writes, vec![b"goaway".to_vec()]);
        assert!(c.get_ref().shut);
    }

    #[test]
    fn a_transport_that_takes_nothing_is_an_error() {
        struct Zero;
        impl AsyncWrite for Zero {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &[u8],
            ) -> Poll<io::Result<usize>> {
                Poll::Ready(Ok(0))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesce::new(Zero);
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
