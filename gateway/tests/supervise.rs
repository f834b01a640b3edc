//! No request takes a shard down, and a shard that dies anyway is noticed (issue 11, items 5 and
//! 11), through a real `fleetgate serve` started with `FLEETGATE_FAULT_INJECTION=1`:
//! - a panic while serving one request closes that connection (or h2 stream) only: another
//!   connection on the same shard keeps working, and `fleetgate_task_panics_total` counts it;
//! - a shard whose thread dies makes `/readyz` fail naming it, is restarted, and serves again;
//!   `fleetgate_shard_restarts_total` counts it;
//! - a thousand idle connections to the admin port do not delay `/readyz`;
//! - a member host name is resolved off the shard: a slow lookup delays only its own requests.

mod support;

use std::time::{Duration, Instant};

use support::fleet::admin_get;
use support::wait::wait_for;
use support::{exchange, h2_client, h2_send_get, read_h2_body, setup_with, DRIVERS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One shard, so every connection of a test shares the shard a fault hits.
fn one_shard(text: String) -> String {
    text.replace("workers: 2", "workers: 1")
}

fn faults_on(command: &mut std::process::Command) {
    command.env("FLEETGATE_FAULT_INJECTION", "1");
}

fn metric(admin: std::net::SocketAddr, name: &str) -> i64 {
    let text = admin_get(admin, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

const GET: &[u8] = b"GET /clusters/member/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_serving_a_request_closes_only_its_connection() {
    for driver in DRIVERS {
        let (upstream, gw) = setup_with(driver, one_shard, faults_on).await;
        // A keep-alive connection that has already been served, on the gateway's one shard.
        let mut bystander = gw.plain().await;
        bystander.write_all(GET).await.unwrap();
        let mut carry = Vec::new();
        let first = support::read_response(&mut bystander, &mut carry)
            .await
            .unwrap();
        assert_eq!(first.code, 200, "{driver}");

        // The panicking request gets no answer: its connection is closed.
        let mut victim = gw.plain_get("/debug/fleetgate/panic-task").await;
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), victim.read_to_end(&mut rest))
            .await
            .expect("the panicking connection is closed");
        assert!(read.is_ok_and(|n| n == 0), "{driver}: {rest:?}");

        // The other connection on the same shard is untouched, and so are new ones.
        bystander.write_all(GET).await.unwrap();
        let again = support::read_response(&mut bystander, &mut carry)
            .await
            .expect("the bystander connection still works");
        assert_eq!(again.code, 200, "{driver}");
        let fresh = exchange(gw.plain().await, GET).await.unwrap();
        assert_eq!(fresh.code, 200, "{driver}");

        // Over h2, the panicking stream is reset and the connection's other streams go on.
        let client = h2_client(&gw).await;
        let doomed = h2_send_get(&client, "/debug/fleetgate/panic-task").await;
        let reset = tokio::time::timeout(Duration::from_secs(10), doomed)
            .await
            .expect("the panicking stream ends");
        assert!(reset.is_err(), "{driver}: {reset:?}");
        let response = h2_send_get(&client, "/clusters/member/api/v1/namespaces").await;
        let response = response.await.expect("the same h2 connection still works");
        assert_eq!(response.status(), 200, "{driver}");
        assert!(!read_h2_body(response.into_body()).await.is_empty());

        assert_eq!(
            metric(gw.admin, "fleetgate_task_panics_total"),
            2,
            "{driver}"
        );
        assert_eq!(metric(gw.admin, "fleetgate_shard_restarts_total"), 0);
        assert!(admin_get(gw.admin, "/readyz").starts_with("HTTP/1.1 200"));
        // Only the requests that were not panics reached the member.
        assert_eq!(upstream.requests().len(), 4, "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_dies_fails_readyz_until_it_is_restarted() {
    for driver in DRIVERS {
        let (_upstream, gw) = setup_with(driver, one_shard, faults_on).await;
        let admin = gw.admin;
        // Kills the only shard's thread (the request's own connection dies with it).
        let _killer = gw.plain_get("/debug/fleetgate/kill-shard").await;
        let mut down = String::new();
        tokio::task::block_in_place(|| {
            wait_for("/readyz to fail", Duration::from_secs(10), || {
                down = admin_get(admin, "/readyz?verbose");
                down.starts_with("HTTP/1.1 500")
            });
        });
        assert!(
            down.contains("[-]shards failed: shard 0 is down"),
            "{driver}: {down}"
        );
        assert_eq!(metric(admin, "fleetgate_shards_down"), 1, "{driver}");
        tokio::task::block_in_place(|| {
            wait_for("the shard to be restarted", Duration::from_secs(15), || {
                admin_get(admin, "/readyz").starts_with("HTTP/1.1 200")
            });
        });
        assert_eq!(metric(admin, "fleetgate_shard_restarts_total"), 1);
        assert_eq!(metric(admin, "fleetgate_shards_down"), 0);
        // The restarted shard serves on the same addresses, plaintext and TLS.
        let plain = exchange(gw.plain().await, GET).await.unwrap();
        assert_eq!(plain.code, 200, "{driver}");
        let tls = exchange(gw.tls().await, GET).await.unwrap();
        assert_eq!(tls.code, 200, "{driver}");
        assert!(gw.log().contains("shard thread died"), "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_admin_connections_do_not_delay_readyz() {
    let (_upstream, gw) = setup_with("epoll", |t| t, |_| {}).await;
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(tokio::net::TcpStream::connect(gw.admin).await.unwrap());
    }
    // Half of them have sent part of a head and stopped.
    for stream in idle.iter_mut().step_by(2) {
        stream.write_all(b"GET /readyz HTTP/1.1\r\n").await.unwrap();
    }
    let started = Instant::now();
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(gw.admin).await.unwrap();
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    };
    let answer = tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .expect("/readyz answered within 1 s");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    println!(
        "/readyz with 1000 idle admin connections: {:?}",
        started.elapsed()
    );
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_member_name_lookup_does_not_stall_the_shard() {
    for driver in DRIVERS {
        // A member known by a name whose lookup takes 2 s (fault injection's slow resolver).
        let named = support::Upstream::start().await;
        let cluster = format!(
            "---\napiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: named\nspec:\n  server: http://member.slow.fleetgate.test:{}/prefix\n  credentials:\n    token: gateway-token\n",
            named.address.port()
        );
        // The lookup counts against the connect timeout, as in kube's dialer: give it 5 s.
        let (_upstream, gw) = setup_with(
            driver,
            |text| {
                one_shard(text).replace("connectTimeoutSeconds: 0.5", "connectTimeoutSeconds: 5")
                    + &cluster
            },
            faults_on,
        )
        .await;
        let client = h2_client(&gw).await;
        // In this order on one connection: the named member's stream reaches the lookup first.
        let started = Instant::now();
        let slow = h2_send_get(&client, "/clusters/named/api/v1/namespaces").await;
        let fast = h2_send_get(&client, "/clusters/member/api/v1/namespaces").await;
        let fast = tokio::time::timeout(Duration::from_secs(1), fast)
            .await
            .unwrap_or_else(|_| panic!("{driver}: the shard stalled behind a name lookup"))
            .unwrap();
        assert_eq!(fast.status(), 200, "{driver}");
        let slow = slow.await.unwrap();
        assert_eq!(slow.status(), 200, "{driver}");
        assert!(started.elapsed() >= Duration::from_secs(2), "{driver}");
        // The answer is kept: the next request dials at once.
        let again = Instant::now();
        let cached = h2_send_get(&client, "/clusters/named/api/v1/pods").await;
        assert_eq!(cached.await.unwrap().status(), 200, "{driver}");
        assert!(again.elapsed() < Duration::from_secs(1), "{driver}");
        assert_eq!(named.requests().len(), 2, "{driver}");
    }
}
