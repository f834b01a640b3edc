//! Admission: whether a decided request may go on now, by the Gateway's `spec.fairness` (in the
//! spirit of kube-apiserver's API Priority and Fairness, docs/fairness.md). It runs after
//! `request::decide` (so the user is known and the request classified) and before anything
//! reaches a member, for both front-ends; `server::shard` asks it whether a new connection's
//! address may have one more.
//!
//! - Each user, over every cluster, and each member cluster, over every user, may have so many
//!   ordinary requests in flight (`concurrent`), so many long-running ones open (`watches`:
//!   watches, `logs -f`, exec, attach, port-forward; counted apart, so a user holding its
//!   watches can still list), and a request rate (`rate`, `burst`: a token bucket).
//! - Over a limit, a request gets a 429 Status with `Retry-After` (the seconds until a token is
//!   there, or 1 for a seat), which kubectl and client-go wait for and retry.
//! - A client address over `perAddressConnections` has its new connection closed as soon as it
//!   is accepted, before the TLS handshake (the cost a flood of connections would put on us).
//!
//! The counters are atomics in maps every shard shares (`tally`): a request takes no lock, and a
//! user's limits hold over all shards (a client's one h2 connection lives on one shard, so
//! dividing limits between shards would give it a fraction). Nothing is counted when the Gateway
//! has no `spec.fairness`. The [`Admitted`] guard gives the seats back when the request ends.
//! Never blocks, never does I/O.

pub mod metrics;
pub mod tally;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fleetgate_config_watcher::fairness::{FairShare, FairnessSettings};
use fleetgate_config_watcher::request_info::RequestInfo;
use fleetgate_config_watcher::ClusterRoute;

use crate::auth::ClientIdentity;
use crate::errors::GatewayError;
use tally::{Counters, Tally};

/// Users, clusters and client addresses tracked at once (beyond that, see `tally`).
const USERS: usize = 16_384;
const CLUSTERS: usize = 16_384;
const ADDRESSES: usize = 4_096;

/// Which limit refused, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    UserConcurrent,
    UserWatches,
    UserRate,
    ClusterConcurrent,
    ClusterWatches,
    ClusterRate,
    AddressConnections,
}

impl Limit {
    pub const ALL: [Limit; 7] = [
        Limit::UserConcurrent,
        Limit::UserWatches,
        Limit::UserRate,
        Limit::ClusterConcurrent,
        Limit::ClusterWatches,
        Limit::ClusterRate,
        Limit::AddressConnections,
    ];

    /// The `scope` and `limit` labels.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            Limit::UserConcurrent => ("user", "concurrent"),
            Limit::UserWatches => ("user", "watches"),
            Limit::UserRate => ("user", "rate"),
            Limit::ClusterConcurrent => ("cluster", "concurrent"),
            Limit::ClusterWatches => ("cluster", "watches"),
            Limit::ClusterRate => ("cluster", "rate"),
            Limit::AddressConnections => ("address", "connections"),
        }
    }
}

/// Every counter of admission, shared by the shards (made by `server`, which hands the metrics
/// registry its collector, `metrics`).
pub struct Admission {
    epoch: Instant,
    users: Tally<Arc<str>>,
    clusters: Tally<Arc<str>>,
    addresses: Tally<IpAddr>,
    /// Refusals by limit and kind (`[short, long]`).
    refused: [[AtomicU64; 2]; Limit::ALL.len()],
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("users", &self.users.keys())
            .field("clusters", &self.clusters.keys())
            .field("addresses", &self.addresses.keys())
            .finish()
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            epoch: Instant::now(),
            users: Tally::new(USERS),
            clusters: Tally::new(CLUSTERS),
            addresses: Tally::new(ADDRESSES),
            refused: Default::default(),
        }
    }
}

/// Who and what a decided request is, as admission (and a refusal's audit) sees it
/// (`request::Decision::subject`).
pub struct Subject<'t> {
    /// Who sends it (not whom it impersonates): the user whose share it takes. None for a
    /// PassThrough cluster's token the gateway does not know: only the cluster's share applies.
    pub authenticated: Option<&'t Arc<ClientIdentity>>,
    pub acting_as: Option<&'t Arc<ClientIdentity>>,
    /// The one cluster it goes to (None for the fleet view's requests, which span several).
    pub cluster: Option<&'t Arc<ClusterRoute>>,
    pub verb: &'static str,
    pub long_running: bool,
    /// The cluster name its path gave and its request info (for the audit log).
    pub classified: Option<(&'t str, RequestInfo<'t>)>,
}

impl<'t> Subject<'t> {
    /// The cluster and verb a refusal is counted under.
    pub fn counted(&self) -> Option<(&'t Arc<ClusterRoute>, &'static str)> {
        self.cluster.map(|c| (c, self.verb))
    }
}

/// The seats a request holds; given back when dropped (when the request's response has ended).
#[derive(Default)]
pub struct Admitted {
    seats: [Option<(Arc<Counters>, bool)>; 2],
}

impl Drop for Admitted {
    fn drop(&mut self) {
        for (counters, long) in self.seats.iter().flatten() {
            let counter = if *long {
                &counters.long
            } else {
                &counters.short
            };
            counter.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A client connection counted against its address; given back when dropped.
pub struct Connected(Arc<Counters>);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.short.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    /// Nanoseconds since this admission started.
    fn now(&self) -> u64 {
        let elapsed = self.epoch.elapsed();
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    fn count_refusal(&self, limit: Limit, long: bool) {
        let index = Limit::ALL.iter().position(|l| *l == limit).unwrap_or(0);
        self.refused[index][usize::from(long)].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals so far: (limit, kind `short`/`long`, count).
    pub fn refusals(&self) -> impl Iterator<Item = (Limit, &'static str, u64)> + '_ {
        Limit::ALL.iter().enumerate().flat_map(move |(i, limit)| {
            [("short", 0), ("long", 1)]
                .into_iter()
                .map(move |(kind, k)| (*limit, kind, self.refused[i][k].load(Ordering::Relaxed)))
        })
    }

    /// Ordinary and long-running requests in flight per cluster now (counted while
    /// `spec.fairness` is on).
    pub fn in_flight(&self) -> Vec<(Arc<str>, u32, u32)> {
        self.clusters
            .snapshot()
            .into_iter()
            .map(|(name, c)| {
                (
                    name,
                    c.short.load(Ordering::Relaxed),
                    c.long.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Admits the request `subject` describes under `settings`, or the 429 that says why not.
    pub fn admit(
        &self,
        settings: &FairnessSettings,
        subject: &Subject<'_>,
    ) -> Result<Admitted, GatewayError> {
        let mut admitted = Admitted::default();
        if !settings.enabled() {
            return Ok(admitted);
        }
        let long = subject.long_running;
        let now = self.now();
        let user = subject
            .authenticated
            .map(|who| (who.user.as_str(), settings.user(&who.user)))
            .filter(|(_, share)| !share.is_unlimited());
        let user_counters = user.map(|(name, _)| self.users.get(name, || Arc::from(name), now));
        if let (Some((name, share)), Some(counters)) = (user, &user_counters) {
            let (limit, which) = seat_limit(share, long, Limit::UserWatches, Limit::UserConcurrent);
            if !self.seat(counters, limit, long, &mut admitted.seats[0]) {
                self.count_refusal(which, long);
                return Err(too_many(format!("user {name:?}"), which, limit, 1));
            }
        }
        // Every request to one cluster is counted while fairness is on: its in-flight gauge.
        let cluster = subject
            .cluster
            .map(|c| (&c.name, self.clusters.get(&*c.name, || c.name.clone(), now)));
        let share = &settings.per_cluster;
        if let Some((name, counters)) = &cluster {
            let (limit, which) =
                seat_limit(share, long, Limit::ClusterWatches, Limit::ClusterConcurrent);
            if !self.seat(counters, limit, long, &mut admitted.seats[1]) {
                self.count_refusal(which, long);
                return Err(too_many(format!("cluster {name:?}"), which, limit, 1));
            }
        }
        if let (Some((name, share)), Some(counters)) = (user, &user_counters) {
            if let Some(rate) = share.rate {
                if let Err(wait) = counters.take_token(now, rate.per_second, rate.burst) {
                    self.count_refusal(Limit::UserRate, long);
                    let what = format!("user {name:?}");
                    return Err(too_many_rate(what, rate.per_second, wait));
                }
            }
        }
        if let (Some((name, counters)), Some(rate)) = (&cluster, share.rate) {
            if let Err(wait) = counters.take_token(now, rate.per_second, rate.burst) {
                self.count_refusal(Limit::ClusterRate, long);
                let what = format!("cluster {name:?}");
                return Err(too_many_rate(what, rate.per_second, wait));
            }
        }
        Ok(admitted)
    }

    /// Takes a seat of `counters` within `limit` into `slot`.
    fn seat(
        &self,
        counters: &Arc<Counters>,
        limit: Option<u32>,
        long: bool,
        slot: &mut Option<(Arc<Counters>, bool)>,
    ) -> bool {
        let counter = if long {
            &counters.long
        } else {
            &counters.short
        };
        if !Counters::take(counter, limit) {
            return false;
        }
        *slot = Some((counters.clone(), long));
        true
    }

    /// Counts a new client connection from `ip`: None when its address already has
    /// `perAddressConnections` open (the connection is to be closed), else the guard (which
    /// counts nothing when the limit is off).
    pub fn connect(&self, settings: &FairnessSettings, ip: IpAddr) -> Option<Option<Connected>> {
        let Some(limit) = settings.per_address_connections else {
            return Some(None);
        };
        let key = address_key(ip);
        let counters = self.addresses.get(&key, || key, self.now());
        if !Counters::take(&counters.short, Some(limit)) {
            self.count_refusal(Limit::AddressConnections, false);
            return None;
        }
        Some(Some(Connected(counters)))
    }
}

/// The limit on `share`'s seats of this kind, and which limit it is.
fn seat_limit(
    share: &FairShare,
    long: bool,
    watches: Limit,
    concurrent: Limit,
) -> (Option<u32>, Limit) {
    if long {
        (share.watches, watches)
    } else {
        (share.concurrent, concurrent)
    }
}

/// What one client address is counted as: an IPv4 address, or an IPv6 address's /64 (one host
/// is usually given a whole /64, and would otherwise have 2^64 addresses to spread over). The
/// tunnel listener counts its strangers by the same key (`tunnel::pending`).
pub(crate) fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    }
}

fn too_many(who: String, limit: Limit, count: Option<u32>, retry_after: u32) -> GatewayError {
    let what = match limit {
        Limit::UserWatches | Limit::ClusterWatches => {
            "long-running requests open (watches, logs -f, exec, attach, port-forward)"
        }
        _ => "requests in flight",
    };
    GatewayError::TooManyRequests {
        message: format!(
            "{who} has {} {what}, as many as spec.fairness allows",
            count.unwrap_or(0)
        ),
        retry_after,
    }
}

fn too_many_rate(who: String, per_second: f64, wait_ns: u64) -> GatewayError {
    GatewayError::TooManyRequests {
        message: format!(
            "{who} is over its rate of {per_second} requests per second (spec.fairness)"
        ),
        retry_after: u32::try_from(wait_ns.div_ceil(1_000_000_000))
            .unwrap_or(u32::MAX)
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_is_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(
            address_key(a),
            address_key("2001:db8:1:3::1".parse().unwrap())
        );
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(address_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }
}
