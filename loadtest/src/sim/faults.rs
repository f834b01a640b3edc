//! A simulated member's fault switches, for tests and the load driver to make it misbehave as
//! real apiservers do:
//!
//! - **stalled watches**: once on, every watch the member holds open sends nothing more, ever
//!   (no event, no bookmark, no end: its connection is as good as blackholed), and a watch asked
//!   for while it is on gets no answer, ever. Watches asked for after the switch goes off work.
//!   A member whose network or watch cache is stuck: only a client that gives up on a silent
//!   watch and asks again gets its events.
//! - **forbidden after a restart**: for a while after the member's listener restarts, every
//!   request of a user outside `system:masters` is answered 403, as a restarted
//!   kube-apiserver answers until its RBAC informers have synced.
//!
//! Flipped in process ([`Faults`] on `Member::faults`) or over the member's own HTTPS listener,
//! as `system:masters`: `GET /debug/sim/faults` shows them, `POST` (or `PUT`) of a JSON object
//! `{"stallWatches": true, "forbidAfterRestartMs": 3000}` sets the fields it names (see
//! docs/simulated-fleet.md). Read by `api` (each request) and `watch` (each chunk); armed by
//! `server` when the member restarts.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::watch;

/// The switches of one member.
pub struct Faults {
    /// Whether the member's watches are stalled.
    stalled: watch::Sender<bool>,
    /// How long the member forbids non-masters after a restart.
    forbid_after_restart: Mutex<Duration>,
    /// Until when it forbids them (armed by a restart).
    forbid_until: Mutex<Option<Instant>>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            stalled: watch::Sender::new(false),
            forbid_after_restart: Mutex::new(Duration::ZERO),
            forbid_until: Mutex::new(None),
        }
    }
}

impl Faults {
    /// Stalls the member's watches (`true`), or lets them go on (`false`).
    pub fn stall_watches(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// Whether the member's watches are stalled now.
    pub fn watches_stalled(&self) -> bool {
        *self.stalled.borrow()
    }

    /// Resolves once the member's watches are stalled (at once if they are).
    pub async fn stalls(&self) {
        let mut stalled = self.stalled.subscribe();
        // The sender lives as long as `self`: the wait ends only when the switch goes on.
        let _ = stalled.wait_for(|on| *on).await;
    }

    /// After each later restart, the member forbids non-masters for `window` (zero: never).
    pub fn forbid_after_restart(&self, window: Duration) {
        *lock(&self.forbid_after_restart) = window;
    }

    /// The member's listener restarted: the forbidden window, if any, starts now.
    pub fn restarted(&self) {
        let window = *lock(&self.forbid_after_restart);
        *lock(&self.forbid_until) = (!window.is_zero()).then(|| Instant::now() + window);
    }

    /// Whether a request of a user outside `system:masters` is forbidden now.
    pub fn forbids(&self) -> bool {
        lock(&self.forbid_until).is_some_and(|until| Instant::now() < until)
    }

    /// The switches as `GET /debug/sim/faults` shows them.
    pub fn to_json(&self) -> Value {
        json!({
            "stallWatches": self.watches_stalled(),
            "forbidAfterRestartMs": lock(&self.forbid_after_restart).as_millis() as u64,
            "forbidding": self.forbids(),
        })
    }

    /// Sets the switches a JSON object names; unknown fields and wrong types are refused, so a
    /// test's typo fails loudly rather than switching nothing.
    pub fn apply(&self, body: &[u8]) -> Result<(), String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("not a JSON object: {e}"))?;
        let fields = value.as_object().ok_or("not a JSON object")?;
        let mut stall = None;
        let mut forbid = None;
        for (key, field) in fields {
            match key.as_str() {
                "stallWatches" => stall = Some(field.as_bool().ok_or("stallWatches: not a bool")?),
                "forbidAfterRestartMs" => {
                    let ms = field
                        .as_u64()
                        .ok_or("forbidAfterRestartMs: not a whole number")?;
                    forbid = Some(Duration::from_millis(ms));
                }
                other => return Err(format!("unknown fault {other:?}")),
            }
        }
        if let Some(window) = forbid {
            self.forbid_after_restart(window);
        }
        if let Some(on) = stall {
            self.stall_watches(on);
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_are_set_by_name_and_typos_are_refused() {
        let faults = Faults::default();
        faults
            .apply(br#"{"stallWatches": true, "forbidAfterRestartMs": 60000}"#)
            .unwrap();
        assert!(faults.watches_stalled());
        assert!(!faults.forbids(), "only a restart starts the window");
        faults.restarted();
        assert!(faults.forbids());
        assert_eq!(faults.to_json()["forbidAfterRestartMs"], 60000);
        faults.apply(br#"{"stallWatches": false}"#).unwrap();
        assert!(!faults.watches_stalled());
        assert!(faults.apply(br#"{"stallWatch": true}"#).is_err());
        assert!(faults.apply(br#"{"stallWatches": 1}"#).is_err());
        assert!(faults.apply(b"[]").is_err());
        faults.apply(br#"{"forbidAfterRestartMs": 0}"#).unwrap();
        faults.restarted();
        assert!(!faults.forbids());
    }
}
