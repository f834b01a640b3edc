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
//! and four ways out of them:
//! - a **410** (an ERROR event with code 410, or a 410 answer) is handed to the caller
//!   ([`Handler::expired`]), which relists (the hub, as client-go's reflector does), watches from
//!   a place of its choosing, or ends the watcher (the fleet view: the client lists again);
//! - a watch that **stalls** (no byte from the member, neither event nor bookmark, for
//!   [`Patience::stall_after`], while the caller was not the one holding it up) is abandoned and
//!   opened again from the last resourceVersion at once ([`Handler::stalled`]); a watch whose
//!   head does not come within that time is a failure, as below. Members are always asked for
//!   bookmarks (kube-apiserver sends one about every minute), so a healthy busy watch is never
//!   silent that long; a quiet one costs one reopen per deadline;
//! - a member that **cannot be reached** or answers badly (a 5xx, a 429, an event that is not
//!   JSON or not one the caller reads) is tried again after a [`Backoff`] delay, from the same
//!   place; the caller hears of each failure ([`Handler::failed`], and may give up) and of the
//!   member being back ([`Handler::up`]);
//! - a member that **refuses** (a 4xx other than 410 and 429), a **retired** route, or a caller
//!   that stops, ends it ([`Ended`]). A 401 or 403 within [`Patience::auth_grace`] of the
//!   member's last failure or ended watch is not yet a refusal: a restarted kube-apiserver
//!   answers 403 until its RBAC cache has synced, so it is tried again with backoff like a
//!   failure, and refuses only once the grace is over.
//!
//! The member side is a [`Member`] (list, open a watch, stream its body), time a [`Clock`]: the
//! gateway's are requests through the exchange and the shard's timers; a test scripts both,
//! bytes in and events out, with no sockets and no sleeps. Never imports `fleet` or `watch`.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use super::ask::Missed;
use super::backoff::Backoff;
use crate::exchange::lines::{LineSink, Lines};
use crate::exchange::relay::{ClientEvent, ResponseSink};
use crate::exchange::Failure;
use crate::runtime::{self, First};

/// How long a member watch may send nothing before it is abandoned: two and a half times
/// kube-apiserver's bookmark period (about a minute, jittered), so a member that sends its
/// bookmarks is never taken for stalled. `FLEETGATE_WATCH_STALL_AFTER_MS` overrides it for the
/// whole process (tests, and members whose bookmarks come at another pace).
pub const STALL_AFTER: Duration = Duration::from_secs(150);
/// How long after a member's failure (or an ended watch) a 401 or 403 to the gateway's own list
/// or watch is taken for a restarted apiserver whose RBAC cache has not synced yet.
pub const AUTH_GRACE: Duration = Duration::from_secs(30);

/// How long the watcher waits on a member before it stops believing it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    /// No byte of a watch (its head, an event, a bookmark) for this long: it is abandoned.
    pub stall_after: Duration,
    /// A 401 or 403 this soon after the member's last failure or ended watch is retried.
    pub auth_grace: Duration,
}

impl Patience {
    /// The gateway's: [`STALL_AFTER`] (or `FLEETGATE_WATCH_STALL_AFTER_MS`, read once) and
    /// [`AUTH_GRACE`].
    pub fn of_members() -> Patience {
        static STALL: OnceLock<Duration> = OnceLock::new();
        let stall_after = *STALL.get_or_init(|| {
            std::env::var("FLEETGATE_WATCH_STALL_AFTER_MS")
                .ok()
                .and_then(|ms| ms.trim().parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map_or(STALL_AFTER, Duration::from_millis)
        });
        Patience {
            stall_after,
            auth_grace: AUTH_GRACE,
        }
    }
}

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

    /// The member sent nothing for the stall deadline; its watch is abandoned and opened again
    /// from `from`.
    fn stalled(&mut self, _from: &str) {}

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
    patience: Patience,
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
    // When the member last failed or ended a watch: a 401 or 403 soon after is a restart's.
    let mut disturbed_at: Option<Instant> = None;
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
            State::Watch => match open(member, &from, resumed, clock, patience).await {
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
                    let streamed = stream(member, opened, &mut lines, clock, patience).await;
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
                            Some(Err(missed)) => missed,
                            // Ended by the member, or stalled: watched again from `from`.
                            ended => {
                                disturbed_at = Some(clock.now());
                                if !member.retired() {
                                    if ended.is_some() {
                                        handler.rewatch(&from);
                                    } else {
                                        handler.stalled(&from);
                                    }
                                }
                                continue;
                            }
                        },
                    }
                }
                Err(missed) => missed,
            },
        };
        let transient_auth = |code: u16| {
            matches!(code, 401 | 403)
                && disturbed_at.is_some_and(|at| {
                    clock.now().saturating_duration_since(at) < patience.auth_grace
                })
        };
        match missed {
            Missed::Answered(410, message) => {
                // The member's own words when its 410 head had a Status, else kube's.
                let status = if message.is_empty() {
                    crate::errors::expired_status(&from)
                } else {
                    crate::errors::expired_said(message)
                };
                match handler.expired(&status) {
                    AfterExpiry::Relist => state = State::List,
                    AfterExpiry::WatchFrom(place) => {
                        from = place;
                        state = State::Watch;
                    }
                    AfterExpiry::End => return Ended::Expired(status),
                }
            }
            Missed::Answered(code, _)
                if (400..500).contains(&code) && code != 429 && !transient_auth(code) =>
            {
                return Ended::Refused(code);
            }
            missed => {
                if member.retired() {
                    return Ended::Retired;
                }
                let now = clock.now();
                // The grace runs from the member's last failure, not from its 401s and 403s.
                if !matches!(missed, Missed::Answered(401 | 403, _)) {
                    disturbed_at = Some(now);
                }
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

/// Opens a watch from `from`; a head that does not come within the stall deadline is a failure.
async fn open<M: Member>(
    member: &mut M,
    from: &str,
    resumed: bool,
    clock: &impl Clock,
    patience: Patience,
) -> Result<M::Opened, Missed> {
    match runtime::race(
        member.open(from, resumed),
        clock.sleep(patience.stall_after),
    )
    .await
    {
        First::Left(opened) => opened,
        First::Right(()) => Err(Missed::Failed(format!(
            "its watch was not answered within {:?}",
            patience.stall_after
        ))),
    }
}

/// Streams an opened watch into `lines` until it ends (`Some`), or until the member has sent
/// nothing for the stall deadline while nothing on the gateway's side held it up (`None`).
async fn stream<M: Member>(
    member: &mut M,
    opened: M::Opened,
    lines: &mut impl ResponseSink,
    clock: &impl Clock,
    patience: Patience,
) -> Option<Result<(), Missed>> {
    let heard = Heard {
        last: Cell::new(clock.now()),
        busy: Cell::new(false),
    };
    let mut body = Timed {
        inner: lines,
        heard: &heard,
        clock,
    };
    let silent = heard.silent_for(patience.stall_after, clock);
    match runtime::race(member.stream(opened, &mut body), silent).await {
        First::Left(streamed) => Some(streamed),
        First::Right(()) => None,
    }
}

/// When a watch's member last sent something, and whether the caller is busy with it (a slow
/// client of the fleet view holds the member's stream up: that is no stall of the member's).
struct Heard {
    last: Cell<Instant>,
    busy: Cell<bool>,
}

impl Heard {
    /// Resolves once nothing came for `after` while the caller was idle.
    async fn silent_for(&self, after: Duration, clock: &impl Clock) {
        loop {
            let now = clock.now();
            let due = self.last.get() + after;
            if !self.busy.get() && now >= due {
                return;
            }
            let wait = if self.busy.get() {
                after
            } else {
                due.saturating_duration_since(now)
            };
            clock.sleep(wait).await;
        }
    }
}

/// A watch's body on its way to the lines, each piece marking the member as heard from.
struct Timed<'h, S, C> {
    inner: &'h mut S,
    heard: &'h Heard,
    clock: &'h C,
}

impl<S: ResponseSink, C: Clock> ResponseSink for Timed<'_, S, C> {
    fn decodes_chunks(&self) -> bool {
        self.inner.decodes_chunks()
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        self.heard.last.set(self.clock.now());
        self.heard.busy.set(true);
        let sent = self.inner.send(piece).await;
        self.heard.busy.set(false);
        self.heard.last.set(self.clock.now());
        sent
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        self.inner.flush().await
    }

    /// The member ended its body: its last line may still wait on the caller.
    async fn end(&mut self) -> Result<(), Failure> {
        self.heard.busy.set(true);
        self.inner.end().await
    }

    async fn end_early(&mut self, last_chunk: bool) -> Result<(), Failure> {
        self.inner.end_early(last_chunk).await
    }

    async fn client_event(&mut self) -> ClientEvent {
        self.inner.client_event().await
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
