//! The breaker's state machine on a scripted clock: instants are the epoch plus the test's own
//! durations, never a sleep.

use std::io;

use super::*;

/// A breaker of a cluster `name`'s route, and its epoch.
fn breaker(name: &str) -> (Breaker, Instant) {
    let table = crate::testing::test_table(&format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}}}\n\
         spec: {{server: \"http://127.0.0.1:1\"}}\n"
    ));
    let epoch = Instant::now();
    (Breaker::new(table.cluster(name).unwrap(), epoch), epoch)
}

/// A breaker of `name` that three refused connects opened at its epoch.
fn opened(name: &str) -> (Breaker, Instant) {
    let (b, t0) = breaker(name);
    for _ in 0..3 {
        b.record(&refused(), t0, &settings());
    }
    assert_eq!(b.state(), CircuitState::Open);
    (b, t0)
}

/// Three failures open it for 2 s, at most 5 s.
fn settings() -> CircuitBreakerSettings {
    CircuitBreakerSettings {
        consecutive_failures: 3,
        open: Duration::from_secs(2),
        max_open: Duration::from_secs(5),
    }
}

fn refused() -> Result<(), GatewayError> {
    Err(GatewayError::Connect {
        cluster: "m".into(),
        address: "127.0.0.1:1".into(),
        source: io::ErrorKind::ConnectionRefused.into(),
    })
}

fn timed_out() -> Result<(), GatewayError> {
    Err(GatewayError::ConnectTimeout {
        cluster: "m".into(),
        address: "10.0.0.1:443".into(),
    })
}

/// The `Retry-After` of a refusal, or None when the connect may go.
fn retry_after(breaker: &Breaker, at: Instant) -> Option<u32> {
    match breaker.admit(at, &settings()) {
        Ok(_) => None,
        Err(error) => error.retry_after(),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn consecutive_connect_failures_open_it_and_a_success_between_them_resets_the_count() {
    let (b, t0) = breaker("m");
    let s = settings();
    b.record(&refused(), t0, &s);
    b.record(&timed_out(), t0, &s);
    b.record(&Ok(()), t0, &s);
    b.record(&refused(), t0, &s);
    b.record(&refused(), t0, &s);
    assert_eq!(
        b.state(),
        CircuitState::Closed,
        "two in a row since the success"
    );
    assert_eq!(b.admit(t0, &s).unwrap(), Pass::Closed);
    b.record(&timed_out(), t0 + ms(10), &s);
    assert_eq!(b.state(), CircuitState::Open);
    assert_eq!(b.opened(), 1);
    let refusal = b.admit(t0 + ms(20), &s).unwrap_err();
    let text = refusal.to_string();
    assert!(
        text.contains("circuit open") && text.contains("\"m\"") && text.contains("timed out"),
        "names the member and the last failure: {text}"
    );
    assert_eq!(refusal.code_and_reason(), (503, "ServiceUnavailable"));
    assert_eq!(refusal.retry_after(), Some(2), "until the period ends");
    assert_eq!(retry_after(&b, t0 + ms(1500)), Some(1));
}

#[test]
fn answers_and_other_errors_never_count() {
    let (b, t0) = breaker("m");
    let s = settings();
    // A late answer, and a pull-mode member with no agent connected (it waits for one).
    let late = || GatewayError::ResponseHeadTimeout {
        cluster: "m".into(),
        seconds: 60,
    };
    let no_agent = || GatewayError::NoTunnel {
        cluster: "m".into(),
        waited_ms: 10,
    };
    for _ in 0..10 {
        b.record::<()>(&Err(late()), t0, &s);
        b.record::<()>(&Err(no_agent()), t0, &s);
    }
    assert_eq!(b.state(), CircuitState::Closed);
}

#[test]
fn after_the_period_one_probe_goes_and_its_success_closes_it() {
    let (b, t0) = opened("m");
    let s = settings();
    assert!(b.admit(t0 + ms(1999), &s).is_err());
    let end = t0 + ms(2000);
    assert_eq!(b.admit(end, &s).unwrap(), Pass::Probe);
    assert_eq!(b.state(), CircuitState::HalfOpen);
    // Others wait for the probe, for one period at most.
    assert_eq!(retry_after(&b, end + ms(1)), Some(2));
    b.record(&Ok(()), end + ms(5), &s);
    assert_eq!(b.state(), CircuitState::Closed);
    assert_eq!(b.admit(end + ms(6), &s).unwrap(), Pass::Closed);
    // Closed afresh: it takes the full count again, and the first period again.
    b.record(&refused(), end + ms(7), &s);
    b.record(&refused(), end + ms(7), &s);
    assert_eq!(b.state(), CircuitState::Closed);
    b.record(&refused(), end + ms(7), &s);
    assert_eq!(retry_after(&b, end + ms(7)), Some(2));
    assert_eq!(b.opened(), 2);
}

#[test]
fn a_failed_probe_opens_it_again_for_longer_up_to_the_longest_period() {
    let (b, t0) = opened("m");
    let s = settings();
    let mut at = t0;
    for expected in [4, 5, 5] {
        // The period is over: the probe goes, and fails.
        at += Duration::from_secs(60);
        assert_eq!(b.admit(at, &s).unwrap(), Pass::Probe);
        b.record(&timed_out(), at, &s);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(
            retry_after(&b, at),
            Some(expected),
            "doubled, capped at 5 s"
        );
    }
    assert_eq!(b.opened(), 4);
}

#[test]
fn a_probe_that_never_ends_lets_another_probe_after_a_period() {
    let (b, t0) = opened("m");
    let s = settings();
    let first = t0 + ms(2000);
    assert_eq!(b.admit(first, &s).unwrap(), Pass::Probe);
    // Its request went away before the connect ended: nothing was recorded.
    assert!(b.admit(first + ms(1999), &s).is_err());
    assert_eq!(b.admit(first + ms(2000), &s).unwrap(), Pass::Probe);
}

#[test]
fn turned_off_it_lets_every_connect_go() {
    let (b, t0) = breaker("m");
    let off = CircuitBreakerSettings {
        consecutive_failures: 0,
        ..settings()
    };
    for _ in 0..100 {
        b.record(&refused(), t0, &off);
    }
    assert_eq!(b.state(), CircuitState::Closed);
    // Turned off while open: connects go, and the first success closes it.
    for _ in 0..3 {
        b.record(&refused(), t0, &settings());
    }
    assert_eq!(b.state(), CircuitState::Open);
    assert_eq!(b.admit(t0, &off).unwrap(), Pass::Closed);
    b.record(&Ok(()), t0, &off);
    assert_eq!(b.state(), CircuitState::Closed);
}

#[test]
fn the_process_keeps_one_breaker_per_route_and_lists_the_open_ones() {
    let table = crate::testing::test_table(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: breaker-list-a}\n\
         spec: {server: \"http://127.0.0.1:1\"}\n---\n\
         apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: breaker-list-b}\n\
         spec: {server: \"http://127.0.0.1:2\"}\n",
    );
    let registry = Breakers::default();
    let a = table.cluster("breaker-list-a").unwrap();
    let b = table.cluster("breaker-list-b").unwrap();
    assert!(Arc::ptr_eq(&registry.of(a), &registry.of(a)));
    let s = settings();
    let now = Instant::now();
    for _ in 0..3 {
        registry.of(b).record(&refused(), now, &s);
    }
    let _ = registry.of(a);
    let open = registry.open();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(&*open[0].0, "breaker-list-b");
    assert_eq!(open[0].1, CircuitState::Open);
    assert!(
        open[0].2.contains("3 consecutive connect failures"),
        "{open:?}"
    );
    assert_eq!(
        open_circuits().get("breaker-list-b").as_deref(),
        Some(open[0].2.as_str()),
        "reported for the Cluster's condition"
    );
    registry.of(b).record(&Ok(()), now, &s);
    assert!(registry.open().is_empty());
    assert_eq!(open_circuits().get("breaker-list-b"), None);
}
