//! The runtime shim: what a shard runs on, behind runtime-neutral names, and nothing of any
//! station (it imports none; only `observe`'s panic counter). The services every station awaits:
//! a timeout (and one armed only when the work does not finish at once), a race of two futures,
//! a yield, a sleep and spawning a local task that catches its own panic; the coarse clock
//! deadlines are set from (`clock`) and one timer per connection or stream for all its phases
//! (`deadline`). Beside them, the shard-local primitives below every station: the drain
//! (`shutdown`), the per-shard copy of the routing table (`snapshot`), each shard's inbox for
//! messages from other threads (`inbox`) and test fault injection (`faults`). Today the services
//! run on monoio's timer; swapping the runtime means changing this module, `server::shard`,
//! `server::listener` and `upstream::connect`, not the codec, the front-ends or the stations.
//! The shard's context (what its connections share) is not here: the stations each define their
//! part, `handle::ShardContext` composes them and `server::shard` builds it.
//!
//! Called by the server, the front-ends, the pipeline, the stations below it and `tls`. The
//! services must only be used on a shard thread (monoio's timer is per-runtime).

pub mod clock;
pub mod deadline;
pub mod faults;
pub mod inbox;
pub mod shutdown;
pub mod snapshot;

pub use deadline::Deadline;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

/// The deadline passed before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `future` for at most `duration`: a one-phase [`Deadline`]. The future is polled before a
/// timer is made, so one that is ready at once (a write the socket takes whole, a read with bytes
/// waiting) costs no insertion into the timer wheel, and the timer is boxed: monoio's `Sleep` is
/// 640 bytes aligned to 128, and held inline it would put that room, and its alignment's
/// padding, in every future that awaits this one (a connection's, for its whole life).
pub async fn timeout<F: Future>(duration: Duration, future: F) -> Result<F::Output, Elapsed> {
    Deadline::new().within(duration, future).await
}

/// Lets the shard's other tasks run before this one goes on: wakes itself and returns Pending
/// once (monoio 0.2.4's own `yield_now` can starve, see DESIGN.md).
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Waits for `duration`.
pub async fn sleep(duration: Duration) {
    monoio::time::sleep(duration).await
}

/// Runs `future` as a task of its own on this shard (connections, h2 streams, pool sweeps). It is
/// not `Send`: it stays on the shard that spawned it. A panic in it ends that task only
/// ([`isolated`]).
pub fn spawn<F: Future<Output = ()> + 'static>(future: F) {
    drop(monoio::spawn(isolated(future)));
}

/// Runs `future`, catching a panic in it: the panic ends this task (its connection or stream is
/// dropped, closing it) and is logged and counted, and the shard's other tasks go on. monoio does
/// not catch task panics: without this one bad request would take the shard thread and every
/// connection on it down.
///
/// Not an `async fn`: one would hold `future` twice (as its argument, and inside the
/// catch_unwind it awaits), so every connection's and h2 stream's task would take twice its
/// future's room for its whole life (29.8 KiB for a TLS connection's 14.6, rustc
/// -Zprint-type-sizes).
pub fn isolated<F: Future<Output = ()>>(future: F) -> impl Future<Output = ()> {
    use futures_util::FutureExt as _;
    std::panic::AssertUnwindSafe(future)
        .catch_unwind()
        .map(|caught| {
            if let Err(panic) = caught {
                crate::observe::metrics::TASK_PANICS.fetch_add(1, Ordering::Relaxed);
                let message = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("(no message)");
                tracing::error!(
                    panic = message,
                    "a task panicked; its connection or stream was closed"
                );
            }
        })
}

/// Which of two raced futures finished first.
pub enum First<A, B> {
    Left(A),
    Right(B),
}

/// Polls both futures and returns the first output, dropping the other future (both must be
/// cancel-safe: readiness-based reads are). `left` is polled first, so it wins a tie.
///
/// Not an `async fn`: one would hold both futures twice (as its arguments, and pinned inside),
/// and races nest (a shared watch waits on four things at once: 808 bytes of its 952, rustc
/// -Zprint-type-sizes).
pub fn race<A: Future, B: Future>(left: A, right: B) -> Race<A, B> {
    Race { left, right }
}

pin_project_lite::pin_project! {
    /// The future [`race`] returns.
    pub struct Race<A, B> {
        #[pin]
        left: A,
        #[pin]
        right: B,
    }
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = First<A::Output, B::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.left.poll(cx) {
            return Poll::Ready(First::Left(out));
        }
        if let Poll::Ready(out) = this.right.poll(cx) {
            return Poll::Ready(First::Right(out));
        }
        Poll::Pending
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use super::*;

    /// Runs `future` on a monoio runtime with timers (the runtime's unit tests share it).
    pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(future)
    }

    #[test]
    fn a_future_that_finishes_in_time_gives_its_output() {
        block_on(async {
            assert_eq!(timeout(Duration::from_secs(1), async { 7 }).await, Ok(7));
            let slow = async {
                sleep(Duration::from_millis(20)).await;
                8
            };
            assert_eq!(timeout(Duration::from_secs(5), slow).await, Ok(8));
        })
    }

    #[test]
    fn a_future_that_does_not_finish_is_cut_at_its_limit() {
        block_on(async {
            let started = Instant::now();
            let out = timeout(Duration::from_millis(50), std::future::pending::<()>()).await;
            assert_eq!(out, Err(Elapsed));
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(40), "{took:?}");
        })
    }

    #[test]
    fn waiting_on_a_timeout_keeps_no_timer_inline() {
        // The timer is on the heap while it runs: the future is its inner future's size plus a
        // few words (some more in a debug build), without monoio's 640-byte, 128-aligned Sleep.
        let future = timeout(Duration::from_secs(1), std::future::pending::<()>());
        let size = std::mem::size_of_val(&future);
        assert!(size <= 160, "{size}");
        assert!(std::mem::align_of_val(&future) <= 8);
    }
}
