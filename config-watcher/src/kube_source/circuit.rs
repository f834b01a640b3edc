//! A fleetgate Cluster's `CircuitOpen` condition: `True` (reason `ConnectFailures`, the message
//! saying how many connects failed and the last failure) while this replica's circuit breaker of
//! the member is open, `False` (reason `Connected`) once a connect succeeded again. Read from
//! [`open_circuits`], which the gateway's breakers fill; written by `write_conditions` in the
//! same status patch as the `Ready` condition (a merge patch replaces the whole list).
//!
//! Each replica has breakers of its own. So that replicas that see a member differently do not
//! rewrite each other's condition forever, a replica writes the condition only when its own
//! breaker changes since what it last wrote (and once at its start, when the object disagrees
//! with it): the condition is the view of the replica whose breaker changed last. A Cluster
//! whose breaker never opened carries no `CircuitOpen` condition.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::circuits::open_circuits;

/// The condition's type.
pub(super) const CIRCUIT_OPEN: &str = "CircuitOpen";

/// What this replica last wrote as each Cluster's `CircuitOpen` condition.
#[derive(Debug, Default)]
pub(super) struct CircuitConditions {
    written: BTreeMap<String, Value>,
}

impl CircuitConditions {
    /// The `CircuitOpen` condition the Cluster `name` (its object `value`) carries after this
    /// write, and whether it must be written (`now`: the transition time of a new one). None:
    /// its breaker never opened, and it carries none.
    pub(super) fn desired(&self, name: &str, value: &Value, now: &str) -> Option<(Value, bool)> {
        let open = open_circuits().get(name);
        let current = self.written.get(name).cloned().or_else(|| {
            value["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == CIRCUIT_OPEN))
                .cloned()
        });
        let (status, reason, message) = match &open {
            Some(why) => ("True", "ConnectFailures", why.clone()),
            None => (
                "False",
                "Connected",
                "a connect to the member succeeded".to_owned(),
            ),
        };
        let current = match current {
            None if open.is_none() => return None,
            None => None,
            Some(current) => {
                if current["status"] == status && current["message"] == message.as_str() {
                    return Some((current, false));
                }
                Some(current)
            }
        };
        let transition = match &current {
            Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
            _ => Value::String(now.to_owned()),
        };
        Some((
            json!({
                "type": CIRCUIT_OPEN,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": transition,
            }),
            true,
        ))
    }

    /// `condition` was written to the Cluster `name`.
    pub(super) fn wrote(&mut self, name: &str, condition: Value) {
        self.written.insert(name.to_owned(), condition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_when_this_replicas_breaker_changes_and_never_to_correct_another() {
        let mut conditions = CircuitConditions::default();
        let name = "circuit-condition-test";
        let bare = json!({"metadata": {"name": name}});
        assert_eq!(conditions.desired(name, &bare, "t0"), None, "never opened");
        open_circuits().set(name, Some("5 consecutive connect failures".into()));
        let (open, due) = conditions.desired(name, &bare, "t1").unwrap();
        assert!(due);
        assert_eq!(open["status"], "True");
        assert_eq!(open["lastTransitionTime"], "t1");
        conditions.wrote(name, open.clone());
        // Another replica wrote False since; this one's breaker did not change: left alone.
        let elsewhere =
            json!({"status": {"conditions": [{"type": CIRCUIT_OPEN, "status": "False"}]}});
        assert_eq!(
            conditions.desired(name, &elsewhere, "t2"),
            Some((open, false))
        );
        open_circuits().set(name, None);
        let (closed, due) = conditions.desired(name, &elsewhere, "t3").unwrap();
        assert!(due);
        assert_eq!(
            (&closed["status"], &closed["lastTransitionTime"]),
            (&json!("False"), &json!("t3"))
        );
    }
}
