//! `spec.fairness` of the Gateway, resolved and checked: what one user, one member cluster and
//! one client address may hold at once (docs/fairness.md). The data path's admission step
//! (`fleetgate::admit`) reads it once per request from the routing table.
//!
//! Named `fairness`, not folded into `spec.limits`: `limits` are wire limits every client has
//! alike (head sizes, timeouts), while these are shares of the members and the gateway between
//! users, as kube-apiserver's API Priority and Fairness shares a server. Every limit left out is
//! no limit, and a Gateway without the block admits everything as before. Never touches the
//! network; called by `load`.

use std::collections::BTreeMap;

use crate::objects::{FairShareSpec, FairnessSpec};

/// Limits on one number above which a value is surely a typo (and would overflow the counters'
/// arithmetic long before it meant anything).
const MAX_COUNT: u32 = 1_000_000;
const MAX_RATE: f64 = 1_000_000.0;

/// One fair share, resolved: None is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FairShare {
    /// Ordinary requests in flight at once.
    pub concurrent: Option<u32>,
    /// The token bucket: requests per second and how many it holds.
    pub rate: Option<Rate>,
    /// Long-running requests open at once.
    pub watches: Option<u32>,
}

/// A token bucket's refill rate (requests per second) and size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

impl FairShare {
    /// Whether the share limits nothing.
    pub fn is_unlimited(&self) -> bool {
        self.concurrent.is_none() && self.rate.is_none() && self.watches.is_none()
    }
}

/// `spec.fairness`, resolved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FairnessSettings {
    /// What each user may hold (over every cluster), unless `users` names them.
    pub per_user: FairShare,
    /// What all users together may hold on one member cluster.
    pub per_cluster: FairShare,
    /// Client connections one address may have open at once.
    pub per_address_connections: Option<u32>,
    /// Users with shares of their own (each `perUser` with the override's fields replaced).
    pub users: BTreeMap<String, FairShare>,
}

impl FairnessSettings {
    /// Whether anything is limited at all (when not, the data path skips admission entirely).
    /// Read per request: a few comparisons.
    pub fn enabled(&self) -> bool {
        !self.per_user.is_unlimited()
            || !self.per_cluster.is_unlimited()
            || self.per_address_connections.is_some()
            || !self.users.is_empty()
    }

    /// The share of `user`.
    pub fn user(&self, user: &str) -> &FairShare {
        self.users.get(user).unwrap_or(&self.per_user)
    }
}

/// `spec.fairness` checked; an error names the field and says what is wrong.
pub(crate) fn resolve_fairness(
    spec: Option<FairnessSpec>,
) -> Result<FairnessSettings, (&'static str, String)> {
    let Some(spec) = spec else {
        return Ok(FairnessSettings::default());
    };
    let per_user_spec = spec.per_user.unwrap_or_default();
    let per_user = share(&per_user_spec).map_err(|(f, m)| (field("perUser", f), m))?;
    let per_cluster = share(&spec.per_cluster.unwrap_or_default())
        .map_err(|(f, m)| (field("perCluster", f), m))?;
    let per_address_connections = match spec.per_address_connections {
        None => None,
        Some(n) => Some(count(n).map_err(|m| ("spec.fairness.perAddressConnections", m))?),
    };
    let mut users = BTreeMap::new();
    for (name, over) in spec.users {
        if name.is_empty() {
            return Err(("spec.fairness.users", "a user name is empty".into()));
        }
        let merged = FairShareSpec {
            concurrent: over.concurrent.or(per_user_spec.concurrent),
            // A rate or burst given replaces both: a burst sized for another rate is not meant.
            rate: over.rate.or(per_user_spec.rate),
            burst: if over.rate.is_some() || over.burst.is_some() {
                over.burst
            } else {
                per_user_spec.burst
            },
            watches: over.watches.or(per_user_spec.watches),
        };
        let resolved =
            share(&merged).map_err(|(f, m)| (field("users", f), format!("user {name:?}: {m}")))?;
        users.insert(name, resolved);
    }
    Ok(FairnessSettings {
        per_user,
        per_cluster,
        per_address_connections,
        users,
    })
}

/// `spec.fairness.{scope}.{name}` as a static field name.
fn field(scope: &str, name: &str) -> &'static str {
    macro_rules! fields {
        ($($scope:literal => $($name:literal),*);*) => {
            match (scope, name) {
                $($(($scope, $name) => concat!("spec.fairness.", $scope, ".", $name),)*)*
                _ => "spec.fairness",
            }
        };
    }
    fields! {
        "perUser" => "concurrent", "rate", "burst", "watches";
        "perCluster" => "concurrent", "rate", "burst", "watches";
        "users" => "concurrent", "rate", "burst", "watches"
    }
}

fn count(n: u32) -> Result<u32, String> {
    if (1..=MAX_COUNT).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} is not between 1 and {MAX_COUNT} (leave the field out for no limit)"
        ))
    }
}

/// One share checked; an error names the field within it.
fn share(spec: &FairShareSpec) -> Result<FairShare, (&'static str, String)> {
    let concurrent = match spec.concurrent {
        None => None,
        Some(n) => Some(count(n).map_err(|m| ("concurrent", m))?),
    };
    let watches = match spec.watches {
        None => None,
        Some(n) => Some(count(n).map_err(|m| ("watches", m))?),
    };
    let rate = match (spec.rate, spec.burst) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(("burst", "a burst needs a rate (requests per second)".into()))
        }
        (Some(r), burst) => {
            if !(r.is_finite() && r > 0.0 && r <= MAX_RATE) {
                return Err((
                    "rate",
                    format!(
                        "{r} is not a number of requests per second above 0 and at most {MAX_RATE}"
                    ),
                ));
            }
            let burst = match burst {
                Some(b) => count(b).map_err(|m| ("burst", m))?,
                None => r.ceil() as u32,
            };
            Some(Rate {
                per_second: r,
                burst: burst.max(1),
            })
        }
    };
    Ok(FairShare {
        concurrent,
        rate,
        watches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(yaml: &str) -> Result<FairnessSettings, (&'static str, String)> {
        resolve_fairness(Some(serde_yaml::from_str(yaml).unwrap()))
    }

    #[test]
    fn absent_is_off_and_overrides_replace_only_their_fields() {
        assert!(!resolve_fairness(None).unwrap().enabled());
        let f = resolve(
            "{perUser: {concurrent: 4, rate: 10, watches: 2}, users: {ci: {concurrent: 40}, \
             batch: {rate: 0.5}}}",
        )
        .unwrap();
        assert!(f.enabled());
        assert_eq!(f.user("alice").concurrent, Some(4));
        assert_eq!(
            f.user("alice").rate,
            Some(Rate {
                per_second: 10.0,
                burst: 10
            })
        );
        assert_eq!(f.user("ci").concurrent, Some(40));
        assert_eq!(f.user("ci").watches, Some(2));
        assert_eq!(
            f.user("batch").rate,
            Some(Rate {
                per_second: 0.5,
                burst: 1
            })
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        for (yaml, field, says) in [
            (
                "{perUser: {concurrent: 0}}",
                "spec.fairness.perUser.concurrent",
                "between 1",
            ),
            (
                "{perCluster: {rate: -1}}",
                "spec.fairness.perCluster.rate",
                "above 0",
            ),
            (
                "{perUser: {rate: .nan}}",
                "spec.fairness.perUser.rate",
                "above 0",
            ),
            (
                "{perUser: {burst: 5}}",
                "spec.fairness.perUser.burst",
                "needs a rate",
            ),
            (
                "{perAddressConnections: 0}",
                "spec.fairness.perAddressConnections",
                "between 1",
            ),
            (
                "{users: {bob: {watches: 0}}}",
                "spec.fairness.users.watches",
                "user \"bob\"",
            ),
            (
                "{users: {'': {watches: 1}}}",
                "spec.fairness.users",
                "empty",
            ),
        ] {
            let (f, message) = resolve(yaml).unwrap_err();
            assert_eq!(f, field, "{yaml}");
            assert!(message.contains(says), "{yaml}: {message}");
        }
    }
}
