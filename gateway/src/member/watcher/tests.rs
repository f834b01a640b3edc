//! The watcher against a scripted member: each test writes what the member answers (a list's
//! body, a watch's bytes in the pieces they arrive in, how it ends) and reads what the watcher
//! asked of it, what it told its caller and how long it waited. No sockets, no runtime, no
//! sleeps: the clock is virtual and every future is ready when polled.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use super::*;

/// One answer of the scripted member, in the order the watcher asks.
enum Answer {
    /// A list: its body, or why there is none.
    List(Result<&'static str, Missed>),
    /// A watch: its body's pieces, then how it ends; or why it did not open.
    Watch(Result<(Vec<&'static str>, Result<(), Missed>), Missed>),
    /// A watch that opens, sends its pieces, then nothing more, never ending.
    Stall(Vec<&'static str>),
    /// A watch whose head never comes.
    Unanswered,
}

struct ScriptedMember {
    script: VecDeque<Answer>,
    /// What was asked: `list`, or `watch FROM` (`resumed` when not the first).
    asked: Vec<String>,
    /// Retired once the script is done (or when a test says).
    retire_when_done: bool,
    retired: Rc<Cell<bool>>,
    /// The virtual clock's time, moved on by `watch_lasts` while each watch streams.
    now: Rc<Cell<Instant>>,
    watch_lasts: Duration,
}

impl ScriptedMember {
    fn new(script: Vec<Answer>) -> Self {
        ScriptedMember {
            script: script.into(),
            asked: Vec::new(),
            retire_when_done: true,
            retired: Rc::new(Cell::new(false)),
            now: Rc::new(Cell::new(Instant::now())),
            watch_lasts: Duration::ZERO,
        }
    }

    fn next(&mut self) -> Answer {
        let answer = self
            .script
            .pop_front()
            .expect("the watcher asked past the script");
        if self.script.is_empty() && self.retire_when_done {
            self.retired.set(true);
        }
        answer
    }
}

impl Member for ScriptedMember {
    /// The pieces, then how the watch ends (None: it never does).
    type Opened = (Vec<&'static str>, Option<Result<(), Missed>>);

    async fn list(&mut self) -> Result<Vec<u8>, Missed> {
        self.asked.push("list".into());
        match self.next() {
            Answer::List(answer) => answer.map(|body| body.as_bytes().to_vec()),
            _ => panic!("listed where the script watches"),
        }
    }

    async fn open(&mut self, from: &str, resumed: bool) -> Result<Self::Opened, Missed> {
        let again = if resumed { " resumed" } else { "" };
        self.asked.push(format!("watch {from}{again}"));
        match self.next() {
            Answer::Watch(answer) => answer.map(|(pieces, end)| (pieces, Some(end))),
            Answer::Stall(pieces) => Ok((pieces, None)),
            Answer::Unanswered => std::future::pending().await,
            Answer::List(_) => panic!("watched where the script lists"),
        }
    }

    async fn stream(
        &mut self,
        (pieces, end): Self::Opened,
        body: &mut impl ResponseSink,
    ) -> Result<(), Missed> {
        self.now.set(self.now.get() + self.watch_lasts);
        // As the exchange's relay does: pieces in, then the end.
        for piece in pieces {
            body.send(Bytes::from_static(piece.as_bytes()))
                .await
                .map_err(super::super::ask::failed)?;
        }
        match end {
            Some(end) => end?,
            None => std::future::pending().await,
        }
        body.end().await.map_err(super::super::ask::failed)
    }

    fn retired(&self) -> bool {
        self.retired.get()
    }
}

/// What the caller was told, in order, as text.
#[derive(Default)]
struct Recorder {
    told: Vec<String>,
    /// The reply to a 410.
    on_expiry: Option<fn() -> AfterExpiry>,
    /// Stop after this many events.
    stop_after: Option<usize>,
    events: usize,
    /// Give up on the n-th failure.
    give_up_at: Option<u32>,
    /// Retire the member's route on the first event.
    retire_on_event: Option<Rc<Cell<bool>>>,
}

impl Handler for Recorder {
    async fn listed(&mut self, body: Vec<u8>) -> Result<String, Fault> {
        let list: Value = serde_json::from_slice(&body).map_err(|_| Fault::Bad("not JSON"))?;
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .ok_or(Fault::Bad("no resourceVersion"))?;
        let items = list["items"].as_array().map_or(0, Vec::len);
        self.told.push(format!("listed {items} at {rv}"));
        Ok(rv.to_owned())
    }

    async fn event(&mut self, event: Value) -> Result<(), Fault> {
        if self.stop_after == Some(self.events) {
            return Err(Fault::Stop);
        }
        self.events += 1;
        if let Some(retired) = &self.retire_on_event {
            retired.set(true);
        }
        let name = event["object"]["metadata"]["name"].as_str().unwrap_or("");
        let rv = event_version(&event).unwrap_or("");
        self.told.push(format!(
            "{} {name} {rv}",
            event["type"].as_str().unwrap_or("")
        ));
        Ok(())
    }

    fn expired(&mut self, status: &Value) -> AfterExpiry {
        self.told.push(format!(
            "expired: {}",
            status["message"].as_str().unwrap_or("")
        ));
        self.on_expiry.map_or(AfterExpiry::Relist, |reply| reply())
    }

    fn rewatch(&mut self, from: &str) {
        self.told.push(format!("rewatch from {from}"));
    }

    fn stalled(&mut self, from: &str) {
        self.told.push(format!("stalled from {from}"));
    }

    async fn failed(&mut self, missed: &Missed, backoff: &Backoff) -> Result<(), Fault> {
        self.told.push(format!("failed: {missed:?}"));
        match self.give_up_at {
            Some(n) if backoff.failures() >= n => Err(Fault::Bad("gave up")),
            _ => Ok(()),
        }
    }

    async fn up(&mut self) -> Result<(), Fault> {
        self.told.push("up".into());
        Ok(())
    }
}

/// A virtual clock: sleeping moves it on at once, and is written down.
struct VirtualClock {
    now: Rc<Cell<Instant>>,
    slept: RefCell<Vec<Duration>>,
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.now.get()
    }

    async fn sleep(&self, delay: Duration) {
        self.slept.borrow_mut().push(delay);
        self.now.set(self.now.get() + delay);
    }
}

/// Polls `future` to its end: nothing in these tests waits on anything outside it.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..1000 {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("the watcher waited on something the test did not script");
}

/// A stall deadline of 5 s, the gateway's grace for a restarted member's 403s.
const PATIENCE: Patience = Patience {
    stall_after: Duration::from_secs(5),
    auth_grace: AUTH_GRACE,
};

fn no_jitter() -> Backoff {
    Backoff::new(
        Duration::from_millis(250),
        Duration::from_secs(30),
        0.0,
        Duration::from_secs(10),
    )
}

struct Run {
    ended: Ended,
    asked: Vec<String>,
    told: Vec<String>,
    slept: Vec<Duration>,
}

fn run_script(start: Start, member: &mut ScriptedMember, recorder: &mut Recorder) -> Run {
    let clock = VirtualClock {
        now: Rc::clone(&member.now),
        slept: RefCell::new(Vec::new()),
    };
    let mut backoff = no_jitter();
    let ended = ready(run(start, member, recorder, &clock, &mut backoff, PATIENCE));
    Run {
        ended,
        asked: std::mem::take(&mut member.asked),
        told: std::mem::take(&mut recorder.told),
        slept: clock.slept.take(),
    }
}

/// A run from a watch from `from`, its caller told everything and answering as by default.
fn watch_from(from: &str, member: &mut ScriptedMember) -> Run {
    run_script(Start::Watch(from.into()), member, &mut Recorder::default())
}

const LIST_10: &str = r#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"10"},"items":[{"metadata":{"name":"a","resourceVersion":"9"}}]}"#;

fn added(name: &str, rv: u32) -> String {
    format!(
        "{{\"type\":\"ADDED\",\"object\":{{\"metadata\":{{\"name\":\"{name}\",\"resourceVersion\":\"{rv}\"}}}}}}\n"
    )
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

#[test]
fn a_list_then_events_split_across_pieces_reach_the_caller_in_order() {
    let b = leak(added("b", 11));
    let c = leak(added("c", 12));
    // `c`'s line arrives in two pieces, the second with a bookmark after it.
    let (c1, c2) = c.split_at(20);
    let bookmark = r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13"}}}"#;
    let rest = leak(format!("{c2}{bookmark}\n"));
    let mut member = ScriptedMember::new(vec![
        Answer::List(Ok(LIST_10)),
        Answer::Watch(Ok((vec![b, c1, rest], Ok(())))),
    ]);
    let run = run_script(Start::List, &mut member, &mut Recorder::default());
    assert_eq!(run.asked, ["list", "watch 10"]);
    assert_eq!(
        run.told,
        ["listed 1 at 10", "ADDED b 11", "ADDED c 12", "BOOKMARK  13"]
    );
    assert!(matches!(run.ended, Ended::Retired), "{:?}", run.ended);
    assert!(run.slept.is_empty());
}

/// `b` in a first watch that ends as `first` scripts it, then `c` in the next: each watch opens
/// from the last resourceVersion, the caller told of the first's end as `said`.
fn resumed_after(first: fn(&'static str) -> Answer, said: &str) -> Run {
    let b = leak(added("b", 11));
    let c = leak(added("c", 12));
    let mut member = ScriptedMember::new(vec![
        first(b),
        Answer::Watch(Ok((vec![c], Ok(())))),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    let run = watch_from("7", &mut member);
    assert_eq!(
        run.asked,
        ["watch 7", "watch 11 resumed", "watch 12 resumed"]
    );
    assert_eq!(
        run.told,
        ["ADDED b 11", said, "ADDED c 12", "rewatch from 12"]
    );
    run
}

#[test]
fn a_watch_the_member_ends_is_resumed_from_the_last_resource_version_at_once() {
    // The member's timeout: nothing more, and it is watched again from `b`.
    let run = resumed_after(|b| Answer::Watch(Ok((vec![b], Ok(())))), "rewatch from 11");
    assert!(run.slept.is_empty(), "a clean end is not a failure");
}

#[test]
fn a_410_event_relists_and_watches_from_the_new_list() {
    let b = leak(added("b", 11));
    let gone = r#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version: 11 (20)"}}
"#;
    let mut member = ScriptedMember::new(vec![
        Answer::List(Ok(LIST_10)),
        Answer::Watch(Ok((vec![b, gone], Ok(())))),
        Answer::List(Ok(
            r#"{"metadata":{"resourceVersion":"20"},"items":[{"metadata":{"name":"a","resourceVersion":"9"}},{"metadata":{"name":"b","resourceVersion":"15"}}]}"#,
        )),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    let run = run_script(Start::List, &mut member, &mut Recorder::default());
    assert_eq!(run.asked, ["list", "watch 10", "list", "watch 20 resumed"]);
    assert_eq!(
        run.told,
        [
            "listed 1 at 10",
            "ADDED b 11",
            "expired: too old resource version: 11 (20)",
            "listed 2 at 20"
        ]
    );
    assert!(run.slept.is_empty());
}

/// A 410 head ends the watcher (when the caller says so) with the member's own message, or
/// kube's words for one without a Status.
#[test]
fn a_410_answer_ends_the_watcher_when_the_caller_says_so_with_its_status() {
    for (said, message) in [
        ("", "too old resource version: 5"),
        (
            "too old resource version: 5 (9)",
            "too old resource version: 5 (9)",
        ),
    ] {
        let mut member =
            ScriptedMember::new(vec![Answer::Watch(Err(Missed::Answered(410, said.into())))]);
        let mut recorder = Recorder {
            on_expiry: Some(|| AfterExpiry::End),
            ..Recorder::default()
        };
        let run = run_script(Start::Watch("5".into()), &mut member, &mut recorder);
        assert_eq!(run.asked, ["watch 5"]);
        let Ended::Expired(status) = run.ended else {
            panic!("{:?}", run.ended)
        };
        assert_eq!(status["code"], 410);
        assert_eq!(status["reason"], "Expired");
        assert_eq!(status["message"], message);
    }
}

#[test]
fn a_410_the_caller_answers_with_a_place_is_watched_from_there_without_a_list() {
    let gone = r#"{"type":"ERROR","object":{"code":410,"message":"gone"}}"#;
    let mut member = ScriptedMember::new(vec![
        Answer::Watch(Ok((vec![gone], Ok(())))),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    let mut recorder = Recorder {
        on_expiry: Some(|| AfterExpiry::WatchFrom("30".into())),
        ..Recorder::default()
    };
    let run = run_script(Start::Watch("5".into()), &mut member, &mut recorder);
    assert_eq!(run.asked, ["watch 5", "watch 30 resumed"]);
}

#[test]
fn member_errors_back_off_growing_then_success_says_up_and_resumes() {
    let b = leak(added("b", 11));
    let c = leak(added("c", 12));
    let down = || Missed::Failed("connection refused".into());
    let mut member = ScriptedMember::new(vec![
        Answer::Watch(Ok((vec![b], Err(Missed::Failed("reset".into()))))),
        Answer::Watch(Err(down())),
        Answer::Watch(Err(Missed::Answered(503, String::new()))),
        // A 429 is a member too busy, not a refusal.
        Answer::Watch(Err(Missed::Answered(429, String::new()))),
        Answer::Watch(Ok((vec![c], Ok(())))),
    ]);
    let run = watch_from("", &mut member);
    assert_eq!(
        run.asked,
        [
            "watch ",
            "watch 11 resumed",
            "watch 11 resumed",
            "watch 11 resumed",
            "watch 11 resumed"
        ]
    );
    let ms = Duration::from_millis;
    assert_eq!(run.slept, [ms(250), ms(500), ms(1000), ms(2000)]);
    assert_eq!(run.told[0], "ADDED b 11");
    assert!(
        run.told[1].starts_with("failed: Failed(\"reset\")"),
        "{:?}",
        run.told
    );
    // The route is retired once the script is done: no rewatch after `c`.
    assert_eq!(run.told[5..], ["up", "ADDED c 12"]);
}

#[test]
fn a_watch_healthy_for_a_while_starts_its_backoff_again() {
    let fail = || Answer::Watch(Err(Missed::Failed("refused".into())));
    let broke = || Answer::Watch(Ok((vec![], Err(Missed::Failed("reset".into())))));
    let mut member = ScriptedMember::new(vec![fail(), fail(), fail(), broke(), fail(), fail()]);
    // Each watch that opens stays up for a minute.
    member.watch_lasts = Duration::from_secs(60);
    let run = watch_from("1", &mut member);
    let ms = Duration::from_millis;
    // Three failures grow it; a watch up for a minute, then broken, starts it again.
    assert_eq!(run.slept, [ms(250), ms(500), ms(1000), ms(250), ms(500)]);
}

#[test]
fn a_refusal_ends_the_watcher_with_its_code_and_no_retry() {
    let mut member = ScriptedMember::new(vec![
        Answer::List(Err(Missed::Answered(403, "forbidden".into()))),
        Answer::List(Ok(LIST_10)),
    ]);
    member.retire_when_done = false;
    let run = run_script(Start::List, &mut member, &mut Recorder::default());
    assert!(matches!(run.ended, Ended::Refused(403)), "{:?}", run.ended);
    assert_eq!(run.asked, ["list"]);
}

#[test]
fn an_event_that_is_not_json_or_an_error_event_breaks_the_watch_and_it_is_tried_again() {
    let b = leak(added("b", 11));
    let mut member = ScriptedMember::new(vec![
        Answer::Watch(Ok((vec![b, "not json\n", "never read\n"], Ok(())))),
        Answer::Watch(Ok((
            vec![r#"{"type":"ERROR","object":{"code":500}}"#, "\n"],
            Ok(()),
        ))),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    let run = watch_from("1", &mut member);
    assert_eq!(
        run.asked,
        ["watch 1", "watch 11 resumed", "watch 11 resumed"]
    );
    assert_eq!(run.told[0], "ADDED b 11");
    assert!(run.told[1].contains("is not JSON"), "{:?}", run.told);
    // The next watch opened (the member is up again), then its ERROR event broke it.
    assert_eq!(run.told[2], "up");
    assert!(
        run.told[3].contains("ended with an error"),
        "{:?}",
        run.told
    );
    assert_eq!(run.slept.len(), 2);
}

#[test]
fn the_caller_may_give_up_on_a_member_that_stays_down() {
    let fail = || Answer::List(Err(Missed::Failed("refused".into())));
    let mut member = ScriptedMember::new((0..10).map(|_| fail()).collect());
    member.retire_when_done = false;
    let mut recorder = Recorder {
        give_up_at: Some(3),
        ..Recorder::default()
    };
    let run = run_script(Start::List, &mut member, &mut recorder);
    assert!(matches!(run.ended, Ended::GaveUp), "{:?}", run.ended);
    assert_eq!(run.asked, ["list", "list", "list"]);
    assert_eq!(run.slept.len(), 2);
}

#[test]
fn retirement_stops_it_between_watches_and_instead_of_a_retry() {
    // Retired while a watch is open: when it ends, nothing more is asked.
    let b = leak(added("b", 11));
    let mut member = ScriptedMember::new(vec![
        Answer::Watch(Ok((vec![b], Ok(())))),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    member.retire_when_done = false;
    let mut recorder = Recorder {
        retire_on_event: Some(Rc::clone(&member.retired)),
        ..Recorder::default()
    };
    let run = run_script(Start::Watch("1".into()), &mut member, &mut recorder);
    assert!(matches!(run.ended, Ended::Retired), "{:?}", run.ended);
    assert_eq!(run.asked, ["watch 1"]);
    assert_eq!(run.told, ["ADDED b 11"], "no rewatch once retired");

    // Retired while it cannot be reached: no backoff, no failure told.
    let mut member =
        ScriptedMember::new(vec![Answer::Watch(Err(Missed::Failed("refused".into())))]);
    let run = watch_from("1", &mut member);
    assert!(matches!(run.ended, Ended::Retired), "{:?}", run.ended);
    assert!(
        run.told.is_empty() && run.slept.is_empty(),
        "{:?}",
        run.told
    );
}

#[test]
fn a_caller_that_stops_ends_the_watcher_mid_watch() {
    let b = leak(added("b", 11));
    let c = leak(added("c", 12));
    let mut member = ScriptedMember::new(vec![
        Answer::Watch(Ok((vec![b, c], Ok(())))),
        Answer::Watch(Ok((vec![], Ok(())))),
    ]);
    let mut recorder = Recorder {
        stop_after: Some(1),
        ..Recorder::default()
    };
    let run = run_script(Start::Watch("1".into()), &mut member, &mut recorder);
    assert!(matches!(run.ended, Ended::Stopped), "{:?}", run.ended);
    assert_eq!(run.asked, ["watch 1"]);
    assert_eq!(run.told, ["ADDED b 11"]);
}

#[test]
fn a_watch_silent_past_the_deadline_is_opened_again_from_its_last_version_at_once() {
    // `b`, then nothing: no event, no bookmark, no end.
    let run = resumed_after(|b| Answer::Stall(vec![b]), "stalled from 11");
    // The deadline waited out once; a stall is no failure, so no backoff.
    assert_eq!(run.slept, [PATIENCE.stall_after]);
}

#[test]
fn a_watch_whose_head_never_comes_fails_at_the_deadline_and_is_backed_off() {
    let c = leak(added("c", 12));
    let mut member = ScriptedMember::new(vec![
        Answer::Unanswered,
        Answer::Watch(Ok((vec![c], Ok(())))),
    ]);
    let run = watch_from("7", &mut member);
    assert_eq!(run.asked, ["watch 7", "watch 7"]);
    assert_eq!(run.told.len(), 3, "{:?}", run.told);
    assert!(
        run.told[0].contains("not answered within 5s"),
        "{:?}",
        run.told
    );
    assert_eq!(run.told[1..], ["up", "ADDED c 12"]);
    assert_eq!(
        run.slept,
        [PATIENCE.stall_after, Duration::from_millis(250)]
    );
}

#[test]
fn a_403_right_after_the_member_dropped_is_retried_until_it_lets_the_gateway_in() {
    let b = leak(added("b", 11));
    let c = leak(added("c", 12));
    let forbidden = || Answer::Watch(Err(Missed::Answered(403, "forbidden".into())));
    let mut member = ScriptedMember::new(vec![
        // The member restarts: its connection drops, then its RBAC cache is not synced.
        Answer::Watch(Ok((vec![b], Err(Missed::Failed("reset".into()))))),
        forbidden(),
        Answer::Watch(Err(Missed::Answered(401, "Unauthorized".into()))),
        forbidden(),
        Answer::Watch(Ok((vec![c], Ok(())))),
    ]);
    let run = watch_from("7", &mut member);
    let ms = Duration::from_millis;
    assert_eq!(run.slept, [ms(250), ms(500), ms(1000), ms(2000)]);
    assert!(matches!(run.ended, Ended::Retired), "{:?}", run.ended);
    assert_eq!(run.asked[1..], ["watch 11 resumed"; 4]);
    assert_eq!(run.told[5..], ["up", "ADDED c 12"]);
}

#[test]
fn a_403_that_outlasts_the_grace_is_a_refusal_and_a_list_is_retried_alike() {
    let mut script = vec![
        Answer::List(Ok(LIST_10)),
        Answer::Watch(Ok((vec![], Err(Missed::Failed("reset".into()))))),
        // A relist is refused too: the same grace.
        Answer::Watch(Err(Missed::Answered(410, String::new()))),
    ];
    script.extend((0..20).map(|_| Answer::List(Err(Missed::Answered(403, "forbidden".into())))));
    let mut member = ScriptedMember::new(script);
    member.retire_when_done = false;
    let run = run_script(Start::List, &mut member, &mut Recorder::default());
    assert!(matches!(run.ended, Ended::Refused(403)), "{:?}", run.ended);
    let ms = Duration::from_millis;
    // Backed off from the drop until the grace was over: 250 ms doubled, 31.75 s in all.
    assert_eq!(run.slept, [250, 500, 1000, 2000, 4000, 8000, 16000].map(ms));
    assert!(run.slept.iter().sum::<Duration>() >= AUTH_GRACE);
    assert_eq!(run.asked.iter().filter(|a| *a == "list").count(), 1 + 7);
}
