//! Waiting with a deadline: polling a condition, and reading a child's output lines on a thread
//! so a test can wait for one without blocking forever.
//!
//! Every wait here is bounded and fails the test (or returns `None`) at its deadline; none is a
//! fixed sleep standing in for a readiness signal. Used by most process-level test binaries.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Polls `condition` every 20 ms until it holds, failing the test after `deadline`. Returns
/// how long it took.
pub fn wait_for(what: &str, deadline: Duration, condition: impl FnMut() -> bool) -> Duration {
    wait_for_or(what, deadline, condition, String::new)
}

/// Like [`wait_for`]; the failure message ends with `context()` (the logs that say why).
pub fn wait_for_or(
    what: &str,
    deadline: Duration,
    mut condition: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) -> Duration {
    let start = Instant::now();
    wait_for_some(what, deadline, || condition().then_some(()), context);
    start.elapsed()
}

/// Polls `condition` every 20 ms until it returns Some (then its value) or `deadline` passes
/// (then the test fails, its message ending with `context()`).
pub fn wait_for_some<T>(
    what: &str,
    deadline: Duration,
    mut condition: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = condition() {
            return value;
        }
        if start.elapsed() >= deadline {
            panic!(
                "timed out after {deadline:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// All of a child's pipe (its stderr, say), read to the end on a thread; join for the text.
pub fn read_on_thread(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// Lines of a child's pipe, read on a thread and stamped with when they arrived.
pub struct LineReader {
    rx: mpsc::Receiver<(Instant, String)>,
    pub seen: Vec<String>,
}

impl LineReader {
    pub fn new(pipe: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        LineReader {
            rx,
            seen: Vec::new(),
        }
    }

    /// The first line matching `pred` within `deadline` and when it arrived; `None` at the
    /// deadline or when the pipe closed.
    pub fn next_matching(
        &mut self,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<(Instant, String)> {
        let end = Instant::now() + deadline;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let (at, line) = self.rx.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if pred(&line) {
                return Some((at, line));
            }
        }
    }

    /// When the first line containing `needle` arrived, within `deadline`.
    pub fn wait_for_text(&mut self, needle: &str, deadline: Duration) -> Option<Instant> {
        self.next_matching(deadline, |l| l.contains(needle))
            .map(|(at, _)| at)
    }

    /// The first line matching `pred`; fails the test after `deadline` with the lines seen.
    pub fn wait_line(
        &mut self,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        match self.next_matching(deadline, pred) {
            Some((_, line)) => line,
            None => panic!("timed out waiting for {what}; lines: {:#?}", self.seen),
        }
    }
}
