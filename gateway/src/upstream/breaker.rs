//! A circuit breaker per member endpoint (`spec.circuitBreaker`): after that many connect
//! failures in a row (refused, timed out, a failed TLS handshake, an egress proxy or a pull-mode
//! agent that could not reach the member) the member's breaker opens, and a connect to it is
//! refused at once with a 503 Status naming the member and the last failure, with a
//! `Retry-After`, instead of each request waiting out a connect timeout of its own. After the open
//! period one connect goes through as a probe (half-open): its success closes the breaker, its
//! failure opens it again for twice as long, up to the longest period. An answer of the member,
//! whatever its code or delay, is never a failure here: only connects are counted, so a busy
//! member never trips it.
//!
//! Checked by `upstream::connect` before a dial (a request's, or the pool's line's dial task), so
//! everything that dials a member goes through it: proxied requests, the fleet view, the
//! shared-watch hubs and the member-watch loop, which then skip an open member at once. A pooled
//! connection is used without asking it. Not for a stream to a service of a pull-mode member
//! (another endpoint than the member), and a pull-mode member with no agent connected is not a
//! failure (its requests wait `--tunnel-wait-seconds` for an agent instead).
//!
//! Process-wide, one per cluster route ([`breakers`]): every shard sees the same state. A
//! closed breaker costs a dial one atomic load; the rest are atomics written on failures and
//! transitions, and the cause, kept in an `ArcSwap`. Time is passed in, so the state machine is
//! tested with a scripted clock. Transitions are logged and reported to the configuration crate
//! (`fleetgate_config_watcher::circuits`, for the Cluster's `CircuitOpen` condition); the scrape
//! reads [`BreakerCollector`], `/readyz?verbose` lists open breakers ([`Breakers::open`]).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use arc_swap::{ArcSwap, ArcSwapOption};
use fleetgate_config_watcher::circuits::open_circuits;
use fleetgate_config_watcher::{CircuitBreakerSettings, ClusterRoute, RouteRetirement};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tracing::{info, warn};

use crate::errors::GatewayError;

/// A breaker's state, as `fleetgate_member_circuit_state` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Connects go through.
    Closed = 0,
    /// Connects are refused until the open period ends.
    Open = 1,
    /// One probe connect is in flight; the others are refused until it ends.
    HalfOpen = 2,
}

impl CircuitState {
    fn of(value: u8) -> CircuitState {
        match value {
            1 => CircuitState::Open,
            2 => CircuitState::HalfOpen,
            _ => CircuitState::Closed,
        }
    }
}

/// What a connect the breaker let through is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The breaker is closed.
    Closed,
    /// The one probe of a half-open breaker.
    Probe,
}

/// One member endpoint's breaker, shared by every shard.
#[derive(Debug)]
pub struct Breaker {
    cluster: Arc<str>,
    /// The route's: a breaker of a route no longer served is forgotten.
    retirement: Arc<RouteRetirement>,
    /// What the millisecond fields count from.
    epoch: Instant,
    state: AtomicU8,
    /// Connect failures since the last success.
    failures: AtomicU32,
    /// Open: when the open period ends. Half-open: when the probe in flight is given up on, and
    /// another connect may probe.
    until_ms: AtomicU64,
    /// The open period now (doubled by each failed probe, up to the longest).
    open_ms: AtomicU64,
    /// Times it opened.
    opened: AtomicU64,
    /// The last failure's message.
    cause: ArcSwapOption<String>,
}

impl Breaker {
    /// A closed breaker for `cluster`'s route, its clock counting from `epoch`.
    pub fn new(cluster: &ClusterRoute, epoch: Instant) -> Breaker {
        Breaker {
            cluster: cluster.name.clone(),
            retirement: cluster.retirement.clone(),
            epoch,
            state: AtomicU8::new(CircuitState::Closed as u8),
            failures: AtomicU32::new(0),
            until_ms: AtomicU64::new(0),
            open_ms: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            cause: ArcSwapOption::empty(),
        }
    }

    pub fn state(&self) -> CircuitState {
        CircuitState::of(self.state.load(Ordering::Acquire))
    }

    /// Whether a connect at `now` may go: closed (one atomic load), or as the probe of an open
    /// breaker whose period has ended; else the 503 to answer with.
    pub fn admit(
        &self,
        now: Instant,
        settings: &CircuitBreakerSettings,
    ) -> Result<Pass, GatewayError> {
        let state = self.state.load(Ordering::Acquire);
        if state == CircuitState::Closed as u8 || settings.consecutive_failures == 0 {
            return Ok(Pass::Closed);
        }
        let now = self.millis(now);
        let until = self.until_ms.load(Ordering::Acquire);
        // The first to see the period over probes; the probe has one open period to finish
        // before another connect may probe in its place.
        let next = now.saturating_add(self.open_ms.load(Ordering::Relaxed));
        if now >= until
            && self
                .until_ms
                .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let _ = self.state.compare_exchange(
                CircuitState::Open as u8,
                CircuitState::HalfOpen as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return Ok(Pass::Probe);
        }
        Err(self.refusal(now))
    }

    /// Records how a connect the breaker let through ended, at `now`: a success closes it, a
    /// connect failure counts (and may open it); anything else is not about reaching the member.
    pub fn record<T>(
        &self,
        outcome: &Result<T, GatewayError>,
        now: Instant,
        settings: &CircuitBreakerSettings,
    ) {
        match outcome {
            Ok(_) => self.succeeded(),
            Err(error @ (GatewayError::Connect { .. } | GatewayError::ConnectTimeout { .. })) => {
                self.failed(error.message(), now, settings)
            }
            Err(_) => {}
        }
    }

    /// A connect reached the member: closed, its count of failures reset.
    fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.state.load(Ordering::Acquire) != CircuitState::Closed as u8
            && self
                .state
                .swap(CircuitState::Closed as u8, Ordering::AcqRel)
                != CircuitState::Closed as u8
        {
            info!(cluster = %self.cluster, "circuit closed: a connect to the member succeeded");
            open_circuits().set(&self.cluster, None);
        }
    }

    /// A connect failed with `cause`: opens a closed breaker at the threshold, and a half-open
    /// one again (for twice as long, up to the longest period).
    fn failed(&self, cause: String, now: Instant, settings: &CircuitBreakerSettings) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        self.cause.store(Some(Arc::new(cause)));
        if settings.consecutive_failures == 0 {
            return;
        }
        let now = self.millis(now);
        let (from, period) = match self.state() {
            CircuitState::HalfOpen => {
                let doubled = self.open_ms.load(Ordering::Relaxed).saturating_mul(2);
                (
                    CircuitState::HalfOpen,
                    doubled.min(millis_of(settings.max_open)),
                )
            }
            CircuitState::Closed if failures >= settings.consecutive_failures => {
                (CircuitState::Closed, millis_of(settings.open))
            }
            // Open already (a connect started before it opened), or below the threshold.
            _ => return,
        };
        // The period first: whoever sees the state open reads this period's end.
        self.open_ms.store(period.max(1), Ordering::Relaxed);
        self.until_ms
            .store(now.saturating_add(period.max(1)), Ordering::Release);
        if self
            .state
            .compare_exchange(
                from as u8,
                CircuitState::Open as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.opened.fetch_add(1, Ordering::Relaxed);
            let message = self.why(failures);
            warn!(cluster = %self.cluster, failures, open_ms = period, "circuit opened: {message}");
            open_circuits().set(&self.cluster, Some(message));
        }
    }

    /// The 503 of an open breaker at `now` (milliseconds from the epoch).
    fn refusal(&self, now: u64) -> GatewayError {
        let left = self
            .until_ms
            .load(Ordering::Acquire)
            .saturating_sub(now)
            .div_ceil(1000)
            .max(1);
        GatewayError::CircuitOpen {
            cluster: self.cluster.to_string(),
            failures: self.failures.load(Ordering::Relaxed),
            cause: self.cause(),
            retry_after: u32::try_from(left).unwrap_or(u32::MAX),
        }
    }

    /// The last failure's message.
    pub fn cause(&self) -> String {
        self.cause
            .load()
            .as_deref()
            .map_or_else(|| "unknown".to_owned(), String::clone)
    }

    /// Why it is open, as `/readyz` and the Cluster's condition say it.
    fn why(&self, failures: u32) -> String {
        format!(
            "{failures} consecutive connect failures, the last: {}",
            self.cause()
        )
    }

    /// Its metrics' labels.
    fn labels(&self) -> CircuitLabels {
        CircuitLabels {
            cluster: self.cluster.clone(),
        }
    }

    /// Times it opened.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn millis(&self, now: Instant) -> u64 {
        millis_of(now.saturating_duration_since(self.epoch))
    }
}

fn millis_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Every member endpoint's breaker, by cluster route id (a changed spec is a new endpoint, with
/// a closed breaker). Read by every dial (one `ArcSwap` load and a lookup); a route's first dial
/// adds its breaker, and forgets those of retired routes.
#[derive(Default)]
pub struct Breakers {
    by_route: ArcSwap<AHashMap<u64, Arc<Breaker>>>,
}

/// The process's breakers.
pub fn breakers() -> &'static Breakers {
    static BREAKERS: OnceLock<Breakers> = OnceLock::new();
    BREAKERS.get_or_init(Breakers::default)
}

/// When the breakers' clocks start.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Breakers {
    /// `cluster`'s breaker, made closed at its first dial.
    pub fn of(&self, cluster: &ClusterRoute) -> Arc<Breaker> {
        if let Some(breaker) = self.by_route.load().get(&cluster.id) {
            return breaker.clone();
        }
        let made = Arc::new(Breaker::new(cluster, epoch()));
        self.by_route.rcu(|routes| {
            let mut routes: AHashMap<u64, Arc<Breaker>> = routes
                .iter()
                .filter(|(_, b)| !b.retirement.is_retired())
                .map(|(id, b)| (*id, b.clone()))
                .collect();
            routes.entry(cluster.id).or_insert_with(|| made.clone());
            routes
        });
        // A new route of the cluster starts closed: an open breaker of its old route is gone.
        open_circuits().set(&cluster.name, None);
        self.by_route
            .load()
            .get(&cluster.id)
            .cloned()
            .unwrap_or(made)
    }

    /// The breakers of the routes served now, by cluster name.
    fn serving(&self) -> Vec<Arc<Breaker>> {
        let mut serving: Vec<Arc<Breaker>> = self
            .by_route
            .load()
            .values()
            .filter(|b| !b.retirement.is_retired())
            .cloned()
            .collect();
        serving.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        serving
    }

    /// The breakers that are not closed: (cluster, state, why), for `/readyz?verbose`.
    pub fn open(&self) -> Vec<(Arc<str>, CircuitState, String)> {
        self.serving()
            .into_iter()
            .filter(|b| b.state() != CircuitState::Closed)
            .map(|b| {
                let why = b.why(b.failures.load(Ordering::Relaxed));
                (b.cluster.clone(), b.state(), why)
            })
            .collect()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CircuitLabels {
    cluster: Arc<str>,
}

/// The breakers' metrics, read at scrape time: `fleetgate_member_circuit_state{cluster}` and
/// `fleetgate_member_circuit_opened_total{cluster}`, for every member dialed since its route
/// was served. Registered by `server`.
#[derive(Debug)]
pub struct BreakerCollector;

impl Collector for BreakerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let serving = breakers().serving();
        let mut family = encoder.encode_descriptor(
            "member_circuit_state",
            "The member's circuit breaker: 0 closed, 1 open (connects refused at once), 2 half-open (one probe connect in flight)",
            None,
            MetricType::Gauge,
        )?;
        for breaker in &serving {
            let gauge = ConstGauge::new(breaker.state() as i64);
            gauge.encode(family.encode_family(&breaker.labels())?)?;
        }
        let mut family = encoder.encode_descriptor(
            "member_circuit_opened",
            "Times the member's circuit breaker opened (consecutive connect failures, or a failed probe)",
            None,
            MetricType::Counter,
        )?;
        for breaker in &serving {
            let counter = ConstCounter::new(breaker.opened());
            counter.encode(family.encode_family(&breaker.labels())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
