//! One timer per connection (or h2 stream), however many phases it times: waiting for the next
//! request, for a head to finish, for the member's response head. Each phase only moves the
//! deadline (a write of the coarse clock plus its limit); the timer in monoio's wheel is armed
//! once and re-armed only when it fires before the deadline it now guards (the phase moved the
//! deadline later meanwhile) or when a phase needs an earlier deadline than the one it holds.
//!
//! In a keep-alive connection that serves requests faster than its shortest limit, that is no
//! wheel insertion or removal per request: the timer fires once per shortest limit, finds the
//! deadline moved, and is armed again. A `runtime::timeout` per phase costs an insertion and a
//! removal each time the phase has to wait.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::{clock, Elapsed};

/// A connection's (or stream's) deadline and the timer that enforces it.
#[derive(Default)]
pub struct Deadline {
    /// Created when a phase first has to wait; armed at or before `at` while a phase waits.
    timer: Option<Pin<Box<monoio::time::Sleep>>>,
}

impl Deadline {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `future` for at most `limit` from now. The future is polled before the timer is
    /// looked at: one that is ready at once never touches the timer.
    pub async fn within<F: Future>(
        &mut self,
        limit: Duration,
        future: F,
    ) -> Result<F::Output, Elapsed> {
        let at = clock::now() + limit;
        let mut future = pin!(future);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = future.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(monoio::time::sleep_until(at.into())));
            if timer.deadline().into_std() > at {
                timer.as_mut().reset(at.into());
            }
            loop {
                match timer.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // Judged on the precise clock: the timer fired by it.
                    Poll::Ready(()) if Instant::now() >= at => return Poll::Ready(Err(Elapsed)),
                    // Armed by an earlier phase: arm it for this one.
                    Poll::Ready(()) => timer.as_mut().reset(at.into()),
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::block_on;

    /// Pending once (so the phase arms the timer), ready on the next poll.
    fn waits_once() -> impl Future<Output = ()> {
        let mut polled = false;
        std::future::poll_fn(move |cx| {
            if polled {
                return Poll::Ready(());
            }
            polled = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    #[test]
    fn a_ready_future_never_creates_the_timer() {
        block_on(async {
            let mut deadline = Deadline::new();
            assert_eq!(
                deadline.within(Duration::from_secs(1), async { 7 }).await,
                Ok(7)
            );
            assert!(deadline.timer.is_none());
        })
    }

    #[test]
    fn a_pending_phase_ends_at_its_limit() {
        block_on(async {
            let mut deadline = Deadline::new();
            let started = Instant::now();
            let out = deadline
                .within(Duration::from_millis(50), std::future::pending::<()>())
                .await;
            assert_eq!(out, Err(Elapsed));
            assert!(
                started.elapsed() >= Duration::from_millis(40),
                "{:?}",
                started.elapsed()
            );
        })
    }

    /// A first phase of `first` that arms the timer, then a second phase of `second` running
    /// the future `make` gives (inside the runtime): the second phase's outcome and how long it
    /// took.
    fn second_phase<F: Future>(
        first: Duration,
        second: Duration,
        make: impl FnOnce() -> F,
    ) -> (Result<F::Output, Elapsed>, Duration) {
        block_on(async {
            let mut deadline = Deadline::new();
            deadline.within(first, waits_once()).await.unwrap();
            let started = Instant::now();
            let out = deadline.within(second, make()).await;
            (out, started.elapsed())
        })
    }

    #[test]
    fn a_later_phase_is_not_cut_by_an_earlier_phases_timer() {
        // The timer still armed for 30 ms fires first and must not end a 200 ms phase.
        let slow = || monoio::time::sleep(Duration::from_millis(120));
        let (out, took) = second_phase(Duration::from_millis(30), Duration::from_millis(200), slow);
        assert_eq!(out, Ok(()));
        assert!(took >= Duration::from_millis(110), "{took:?}");
    }

    #[test]
    fn a_shorter_phase_pulls_the_timer_in() {
        // Armed for an hour, a 50 ms phase must still end at 50 ms.
        let forever = std::future::pending::<()>;
        let (out, took) = second_phase(
            Duration::from_secs(3600),
            Duration::from_millis(50),
            forever,
        );
        assert_eq!(out, Err(Elapsed));
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}
