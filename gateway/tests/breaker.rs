//! A member's circuit breaker, against a simulated fleet with a third member that blackholes:
//! its address is a listener that never accepts, so every connect times out in the TLS handshake
//! (the Gateway's connect timeout is short here). After `consecutiveFailures` of them the breaker
//! opens: a request to that member is answered 503 with `Retry-After` and the cause at once, far
//! sooner than the connect timeout; the metrics show it open, `/readyz` names it and stays 200,
//! and a fleet LIST names it "circuit open" in its Warning while listing the other members'
//! objects. Then the member comes back (the listener starts carrying connections to a live
//! member): after the open period a request goes through as the probe, and the breaker closes.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::fleet::Fleet;

/// The Gateway's connect timeout in this test.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the breaker stays open: long enough for the checks made while it is.
const OPEN_SECONDS: u64 = 6;

const DEAD: &str = "/clusters/member9/api/v1/namespaces/default/configmaps";

/// The status code of a raw response.
fn code(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a response: {response}"))
}

/// A field of a raw response's head.
fn field<'r>(response: &'r str, name: &str) -> Option<&'r str> {
    let head = response.split("\r\n\r\n").next().unwrap_or("");
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Carries every connection `listener` accepts (those queued while it did not accept first) to
/// `member`, both ways, on threads of its own.
fn carry_to(listener: TcpListener, member: SocketAddr) {
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(upstream) = TcpStream::connect(member) else {
                continue;
            };
            let pipe = |mut from: TcpStream, mut to: TcpStream| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            };
            pipe(client.try_clone().unwrap(), upstream.try_clone().unwrap());
            pipe(upstream, client);
        }
    });
}

#[test]
fn an_unreachable_member_fails_fast_once_its_breaker_opens_and_closes_when_it_comes_back() {
    let mut fleet = Fleet::sim(2, 2);
    // member9: member1's cluster file (its CA and token), at an address that never accepts.
    let blackhole = TcpListener::bind("127.0.0.1:0").unwrap();
    let member1 = std::fs::read_to_string(fleet.fleet_path("clusters/member1.yaml")).unwrap();
    let server = fleet.cluster_field("member1", "server");
    let member9 = member1.replace("name: member1", "name: member9").replace(
        &server,
        &format!("https://{}", blackhole.local_addr().unwrap()),
    );
    std::fs::write(fleet.fleet_path("clusters/member9.yaml"), member9).unwrap();
    fleet.edit_gateway(|gateway| {
        gateway["spec"]["limits"]["connectTimeoutSeconds"] = CONNECT_TIMEOUT.as_secs_f64().into();
        gateway["spec"]["circuitBreaker"] = serde_yaml::from_str(&format!(
            "{{consecutiveFailures: 2, openSeconds: {OPEN_SECONDS}, maxOpenSeconds: 30}}"
        ))
        .unwrap();
    });
    fleet.serve(&["--workers", "2"], None);
    let state = "fleetgate_member_circuit_state{cluster=\"member9\"}";

    // Two requests wait out the connect timeout each, at the same time.
    let timed_out: Vec<String> = std::thread::scope(|s| {
        let asks: Vec<_> = (0..2).map(|_| s.spawn(|| fleet.https_get(DEAD))).collect();
        asks.into_iter().map(|a| a.join().unwrap()).collect()
    });
    for response in &timed_out {
        assert_eq!(code(response), 503, "{response}");
        assert!(response.contains("timed out"), "{response}");
    }
    let start = Instant::now();
    while fleet.metric(state) != Some(1) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the breaker did not open: {}",
            fleet.admin_get("/metrics")
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Open: answered at once, with the cause and when to come back.
    let asked = Instant::now();
    let refused = fleet.https_get(DEAD);
    let took = asked.elapsed();
    assert_eq!(code(&refused), 503, "{refused}");
    assert!(
        took < CONNECT_TIMEOUT / 2,
        "took {took:?}, the connect timeout is {CONNECT_TIMEOUT:?}"
    );
    assert!(
        refused.contains("circuit open")
            && refused.contains("member9")
            && refused.contains("timed out"),
        "names the member and the cause: {refused}"
    );
    let retry_after: u64 = field(&refused, "retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {refused}"))
        .parse()
        .unwrap();
    assert!((1..=OPEN_SECONDS).contains(&retry_after), "{refused}");
    assert_eq!(
        fleet.metric("fleetgate_member_circuit_opened_total{cluster=\"member9\"}"),
        Some(1)
    );
    let readyz = fleet.admin_get("/readyz?verbose");
    assert_eq!(
        code(&readyz),
        200,
        "the gateway serves the others: {readyz}"
    );
    assert!(readyz.contains("circuit-breaker member9: open"), "{readyz}");

    // The fleet view skips it at once, naming it, and lists the others.
    let asked = Instant::now();
    let list = fleet.https_get("/fleet/api/v1/configmaps");
    let took = asked.elapsed();
    assert_eq!(code(&list), 200, "{list}");
    assert!(took < CONNECT_TIMEOUT, "took {took:?}");
    let warning = field(&list, "warning").unwrap_or_else(|| panic!("no Warning: {list}"));
    assert!(
        warning.contains("member9") && warning.contains("circuit open"),
        "{warning}"
    );
    for cluster in ["member1", "member2"] {
        assert!(
            list.contains(&format!("\"fleetgate.io/cluster\":\"{cluster}\"")),
            "{cluster}'s objects: {list}"
        );
    }
    assert!(!list.contains("\"fleetgate.io/cluster\":\"member9\""));

    // The member comes back: after the open period, a request probes and gets through.
    let member: SocketAddr = server.trim_start_matches("https://").parse().unwrap();
    carry_to(blackhole, member);
    let start = Instant::now();
    let answered = loop {
        let response = fleet.https_get(DEAD);
        if code(&response) == 200 {
            break response;
        }
        assert_eq!(code(&response), 503, "{response}");
        assert!(
            start.elapsed() < Duration::from_secs(OPEN_SECONDS * 3),
            "still refused: {response}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answered.contains("ConfigMapList"), "{answered}");
    assert_eq!(fleet.metric(state), Some(0), "closed again");
    assert_eq!(
        fleet.metric("fleetgate_member_circuit_opened_total{cluster=\"member9\"}"),
        Some(1)
    );
    let readyz = fleet.admin_get("/readyz?verbose");
    assert!(readyz.contains("circuit-breakers ok"), "{readyz}");
}
