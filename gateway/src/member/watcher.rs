//! One member watch, kept up: the loop the fleet view's merged watch (`fleet::watch`, one per
//! member of the view) and the shared-watch hub (`watch::hub`, one per resource and scope) both
//! run, in the shape of kube-runtime's `watcher`: a state machine of two states,
//!
//! - **List** (`Start::List`, and after a 410 when the caller asks for it): the collection is
//!   listed; the caller reads the list ([`Handler::listed`]) and says which resourceVersion to
//!   watch from. The fleet view skips it: it watches from the client's resourceVersion (or from
//!   none, and the member sends what it holds as ADDED events).
//! - **Watch**: a watch from the last resourceVersion, asking for bookmarks; each event line is
//!   parsed and handed to the caller ([`Handler::event`]), and its resourceVersion becomes the
//!   place the next watch starts from. A watch the member ends (its own timeout, a closed
//!   connection) is opened again from there, at once.
//!
//! and three ways out of them:
//! - a **410** (an ERROR event with code 410, or a 410 answer) is handed to the caller
//!   ([`Handler::expired`]), which relists (the hub, as client-go's reflector does), watches from
//!   a place of its choosing, or ends the watcher (the fleet view: the client lists again);
//! - a member that **cannot be reached** or answers badly (a 5xx, a 429, an event that is not
//!   JSON or not one the caller reads) is tried again after a [`Backoff`] delay, from the same
//!   place; the caller hears of each failure ([`Handler::failed`], and may give up) and of the
//!   member being back ([`Handler::up`]);
//! - a member that **refuses** (a 4xx other than 410 and 429), a **retired** route, or a caller
//!   that stops, ends it ([`Ended`]).
//!
//! The member side is a [`Member`] (list, open a watch, stream its body), time a [`Clock`]: the
//! gateway's are requests through the exchange and the shard's timers; a test scripts both,
//! bytes in and events out, with no sockets and no sleeps. Never imports `fleet` or `watch`.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::ask::Missed;
use super::backoff::Backoff;
use crate::exchange::lines::{LineSink, Lines};
use crate::exchange::relay::ResponseSink;
use crate::exchange::Failure;

/// The backoff of a member watch: 250 ms doubled up to 30 s, a fifth of each step jittered, the
/// count started again after a watch that stayed up for 10 s.
pub fn member_backoff() -> Backoff {
    Backoff::new(
        Duration::from_millis(250),
        Duration::from_secs(30),
        0.2,
        Duration::from_secs(10),
    )
}

/// Where a watcher starts.
pub(crate) enum Start {
    /// List first, then watch from where the caller's reading of the list says.
    List,
    /// Watch from this resourceVersion straight away (empty: from the member's start).
    Watch(String),
}

/// What the watcher asks of the member.
pub(crate) trait Member {
    /// A watch opened: its head read, its body still to stream.
    type Opened;

    /// Lists the collection: the whole body of a 2xx answer.
    async fn list(&mut self) -> Result<Vec<u8>, Missed>;

    /// Opens a watch from `from` (empty: from the member's start), with bookmarks; `resumed`:
    /// a watch was open before, so initial events are not to be asked for again. Anything but a
    /// 200 is a [`Missed::Answered`].
    async fn open(&mut self, from: &str, resumed: bool) -> Result<Self::Opened, Missed>;

    /// Streams an opened watch's body into `body` until the member ends it (`Ok`) or it breaks
    /// (including when `body` refuses a piece).
    async fn stream(
        &mut self,
        opened: Self::Opened,
        body: &mut impl ResponseSink,
    ) -> Result<(), Missed>;

    /// Whether the member's route was retired (its cluster removed or changed).
    fn retired(&self) -> bool;
}

/// Time, as the watcher needs it.
pub(crate) trait Clock {
    fn now(&self) -> Instant;
    async fn sleep(&self, delay: Duration);
}

/// The shard's clock: `Instant::now` and the runtime's timer.
pub(crate) struct ShardClock;

impl Clock for ShardClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    async fn sleep(&self, delay: Duration) {
        crate::runtime::sleep(delay).await
    }
}

/// Why the caller turned an event (or a list) down.
pub(crate) enum Fault {
    /// It is not one the caller reads: the watch is treated as broken, and tried again.
    Bad(&'static str),
    /// The caller is done: the watcher ends ([`Ended::Stopped`]).
    Stop,
}

/// What to do after a 410.
pub(crate) enum AfterExpiry {
    /// List again, then watch from the new list.
    Relist,
    /// Watch again from this resourceVersion.
    WatchFrom(String),
    /// End the watcher ([`Ended::Expired`]).
    End,
}

/// What the watcher tells its caller, and what it asks of it.
pub(crate) trait Handler {
    /// A list's body (the first one, or a relist): take what the member holds; the
    /// resourceVersion to watch from.
    async fn listed(&mut self, body: Vec<u8>) -> Result<String, Fault>;

    /// One watch event (ADDED, MODIFIED, DELETED or BOOKMARK), parsed.
    async fn event(&mut self, event: Value) -> Result<(), Fault>;

    /// The member's resourceVersion expired: its Status (the ERROR event's, or one written for
    /// a 410 answer).
    fn expired(&mut self, status: &Value) -> AfterExpiry;

    /// The member ended its watch; it is watched again from `from`.
    fn rewatch(&mut self, _from: &str) {}

    /// A list or watch failed (`missed`); the next try is after `backoff`'s last delay. `Err`
    /// ends the watcher (`Fault::Stop`: [`Ended::Stopped`]; `Fault::Bad`: [`Ended::GaveUp`]).
    async fn failed(&mut self, _missed: &Missed, _backoff: &Backoff) -> Result<(), Fault> {
        Ok(())
    }

    /// A watch opened after one or more failures.
    async fn up(&mut self) -> Result<(), Fault> {
        Ok(())
    }
}

/// How a watcher ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// A 410 the caller chose to end on: the Status.
    Expired(Value),
    /// The member refused the list or watch with this code (a 4xx other than 410 and 429).
    Refused(u16),
    /// The member's route was retired.
    Retired,
    /// The caller stopped it.
    Stopped,
    /// The caller gave up on a member that cannot be reached.
    GaveUp,
}

/// The watcher's state between steps.
enum State {
    /// To list (then watch from the list).
    List,
    /// To watch from `from`.
    Watch,
}

/// Keeps one member watch up, handing its events to `handler`, until it ends.
pub(crate) async fn run(
    start: Start,
    member: &mut impl Member,
    handler: &mut impl Handler,
    clock: &impl Clock,
    backoff: &mut Backoff,
) -> Ended {
    let (mut state, mut from) = match start {
        Start::List => (State::List, String::new()),
        Start::Watch(from) => (State::Watch, from),
    };
    let mut resumed = false;
    let mut failing = false;
    // Since when the member has answered well (a list or an opened watch), if it has since the
    // last failure.
    let mut healthy_since: Option<Instant> = None;
    loop {
        if member.retired() {
            return Ended::Retired;
        }
        let missed = match state {
            State::List => match member.list().await {
                Ok(body) => match handler.listed(body).await {
                    Ok(listed_from) => {
                        healthy_since.get_or_insert_with(|| clock.now());
                        from = listed_from;
                        state = State::Watch;
                        continue;
                    }
                    Err(Fault::Stop) => return Ended::Stopped,
                    Err(Fault::Bad(reason)) => Missed::Failed(reason.into()),
                },
                Err(missed) => missed,
            },
            State::Watch => match member.open(&from, resumed).await {
                Ok(opened) => {
                    resumed = true;
                    healthy_since.get_or_insert_with(|| clock.now());
                    if std::mem::take(&mut failing) && handler.up().await.is_err() {
                        return Ended::Stopped;
                    }
                    let mut lines = Lines::new(EventLines {
                        handler: &mut *handler,
                        from: &mut from,
                        cut: None,
                    });
                    let streamed = member.stream(opened, &mut lines).await;
                    match lines.sink.cut.take() {
                        Some(Cut::Expired(status)) => match handler.expired(&status) {
                            AfterExpiry::Relist => {
                                state = State::List;
                                continue;
                            }
                            AfterExpiry::WatchFrom(place) => {
                                from = place;
                                continue;
                            }
                            AfterExpiry::End => return Ended::Expired(status),
                        },
                        Some(Cut::Stop) => return Ended::Stopped,
                        Some(Cut::Bad(reason)) => Missed::Failed(reason.into()),
                        None => match streamed {
                            Ok(()) => {
                                if !member.retired() {
                                    handler.rewatch(&from);
                                }
                                continue;
                            }
                            Err(missed) => missed,
                        },
                    }
                }
                Err(missed) => missed,
            },
        };
        match missed {
            Missed::Answered(410, _) => {
                let status = crate::errors::expired_status(&from);
                match handler.expired(&status) {
                    AfterExpiry::Relist => state = State::List,
                    AfterExpiry::WatchFrom(place) => {
                        from = place;
                        state = State::Watch;
                    }
                    AfterExpiry::End => return Ended::Expired(status),
                }
            }
            Missed::Answered(code, _) if (400..500).contains(&code) && code != 429 => {
                return Ended::Refused(code);
            }
            missed => {
                if member.retired() {
                    return Ended::Retired;
                }
                let now = clock.now();
                let ran_for = healthy_since
                    .take()
                    .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
                let delay = backoff.failed(ran_for);
                failing = true;
                match handler.failed(&missed, backoff).await {
                    Ok(()) => {}
                    Err(Fault::Stop) => return Ended::Stopped,
                    Err(Fault::Bad(_)) => return Ended::GaveUp,
                }
                clock.sleep(delay).await;
            }
        }
    }
}

/// The resourceVersion an event's object carries (a Table's own, for a Table watch).
pub fn event_version(event: &Value) -> Option<&str> {
    event
        .get("object")?
        .get("metadata")?
        .get("resourceVersion")?
        .as_str()
        .filter(|v| !v.is_empty())
}

/// Why a watch's body was cut by the watcher's side.
enum Cut {
    Expired(Value),
    Stop,
    Bad(&'static str),
}

/// A watch's lines (split by `exchange::lines`), each parsed and handed to the caller.
struct EventLines<'w, H> {
    handler: &'w mut H,
    /// Where the next watch starts: the last event's resourceVersion.
    from: &'w mut String,
    cut: Option<Cut>,
}

impl<H: Handler> EventLines<'_, H> {
    fn cut(&mut self, cut: Cut, reason: &'static str) -> Result<(), Failure> {
        self.cut = Some(cut);
        Err(Failure::Abort(reason))
    }
}

impl<H: Handler> LineSink for EventLines<'_, H> {
    async fn line(&mut self, line: &[u8]) -> Result<(), Failure> {
        let Ok(event) = serde_json::from_slice::<Value>(line) else {
            let reason = "a member's watch event is not JSON";
            return self.cut(Cut::Bad(reason), reason);
        };
        if event.get("type").and_then(Value::as_str) == Some("ERROR") {
            let status = event.get("object").cloned().unwrap_or(Value::Null);
            if status.get("code").and_then(Value::as_u64) == Some(410) {
                return self.cut(Cut::Expired(status), "a member's resourceVersion expired");
            }
            let reason = "a member's watch ended with an error";
            return self.cut(Cut::Bad(reason), reason);
        }
        let version = event_version(&event).map(str::to_owned);
        match self.handler.event(event).await {
            Ok(()) => {
                if let Some(version) = version {
                    *self.from = version;
                }
                Ok(())
            }
            Err(Fault::Stop) => self.cut(Cut::Stop, "the member watch's caller is done"),
            Err(Fault::Bad(reason)) => self.cut(Cut::Bad(reason), reason),
        }
    }
}

#[cfg(test)]
mod tests;
