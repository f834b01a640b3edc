//! Fairness (issue 16, item 2): what one user may take of a member and of the gateway, through a
//! real `fleetgate serve`:
//! - a user flooding a member past `spec.fairness.perUser.concurrent` gets 429 Statuses with
//!   `Retry-After`, while another user's GETs keep close to their unloaded latency (measured in
//!   the same test, before the flood);
//! - a user holding its `watches` can still list; a watch over the limit gets a 429, on h2 too;
//! - a connection over `perAddressConnections` is closed at once;
//! - kubectl, refused by a rate limit, waits the `Retry-After` and succeeds;
//! - a bad `spec.fairness` is rejected with a message naming the field, and the last good
//!   configuration (its limits included) keeps serving.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::fleet::{admin_get, Fleet};
use support::wait::wait_for;
use support::{h2_client, h2_get, read_response, setup_with_config, Response, DRIVERS};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// An ordinary GET the recording member answers at once.
const GET: &str = "/clusters/member/api/v1/namespaces/default/configmaps";

/// One GET on a kept-alive connection.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    carry: &mut Vec<u8>,
    path: &str,
) -> Response {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_response(stream, carry))
        .await
        .expect("an answer in time")
        .expect("an answer before the connection closed")
}

/// The median of `n` GETs by alice (client certificate) on one connection.
async fn alice_median(gw: &support::Gateway, n: usize) -> Duration {
    let mut tls = gw.tls().await;
    let mut carry = Vec::new();
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let response = get(&mut tls, &mut carry, GET).await;
        took.push(start.elapsed());
        assert_eq!(response.code, 200, "alice: {:?}", response.head);
    }
    took.sort();
    took[n / 2]
}

/// [`alice_median`] on a thread and runtime of its own, so that the flood's client tasks do not
/// delay alice's client (only the gateway is under test).
fn alice_median_apart(gw: &support::Gateway, n: usize) -> Duration {
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(alice_median(gw, n))
                })
                .join()
                .unwrap()
        })
    })
}

/// A sample of the admin listener's metrics: the value of `series`, 0 when absent.
fn metric(admin: std::net::SocketAddr, series: &str) -> i64 {
    admin_get(admin, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// The test Gateway with `fairness` (YAML under `spec.fairness`, indented by 4) and members
/// that may take their time to answer (`/slow` answers after 10 s).
fn with_fairness(fairness: &'static str) -> impl FnOnce(String) -> String {
    move |text| {
        let text = text.replace(
            "responseHeadTimeoutSeconds: 0.5",
            "responseHeadTimeoutSeconds: 30",
        );
        format!("{text}  fairness:\n{fairness}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_flooding_a_member_gets_429s_while_another_keeps_its_latency() {
    for driver in DRIVERS {
        let (upstream, gw) = setup_with_config(
            driver,
            with_fairness("    perUser: {concurrent: 4, watches: 2}\n"),
        )
        .await;
        // Alice's GETs with nothing else going on.
        let baseline = alice_median_apart(&gw, 40);

        // The plaintext listener's `system:anonymous` takes its 4 seats with requests the
        // member answers only after 10 s...
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(gw.plain_get("/clusters/member/slow").await);
        }
        tokio::task::block_in_place(|| {
            wait_for(
                "the 4 slow requests to reach the member",
                Duration::from_secs(10),
                || {
                    upstream
                        .requests()
                        .iter()
                        .filter(|r| r.head.contains("/slow "))
                        .count()
                        == 4
                },
            )
        });
        // ... and floods: 16 connections each sending a GET every 2 ms (thousands a second: paced
        // so that on a 2-core machine the test's own client does not take the CPU the gateway
        // needs, which would measure the machine, not the gateway).
        let stop = Arc::new(AtomicBool::new(false));
        let (refused, admitted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut flood = Vec::new();
        for _ in 0..16 {
            let mut plain = gw.plain().await;
            let (stop, refused, admitted) = (stop.clone(), refused.clone(), admitted.clone());
            flood.push(tokio::spawn(async move {
                let mut carry = Vec::new();
                let mut first = None;
                while !stop.load(Ordering::Relaxed) {
                    let response = get(&mut plain, &mut carry, GET).await;
                    if response.code == 429 {
                        refused.fetch_add(1, Ordering::Relaxed);
                    } else {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    first.get_or_insert(response);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                first
            }));
        }
        tokio::task::block_in_place(|| {
            wait_for("the flood to be refused", Duration::from_secs(10), || {
                refused.load(Ordering::Relaxed) >= 200
            })
        });
        let loaded = alice_median_apart(&gw, 40);
        stop.store(true, Ordering::Relaxed);
        let mut firsts = Vec::new();
        for task in flood {
            firsts.push(task.await.unwrap().expect("a response"));
        }
        eprintln!(
            "{driver}: alice's median GET {baseline:?} alone, {loaded:?} during the flood; \
             {} flood requests refused",
            refused.load(Ordering::Relaxed)
        );
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            0,
            "{driver}: the flood got past the 4 seats the slow requests hold"
        );
        // As kube-apiserver answers: a Status, 429 TooManyRequests, Retry-After.
        let response = &firsts[0];
        assert_eq!(response.code, 429);
        assert_eq!(response.header("retry-after").as_deref(), Some("1"));
        let status = response.json();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["code"], 429);
        assert_eq!(status["details"]["retryAfterSeconds"], 1);
        let message = status["message"].as_str().unwrap();
        assert!(
            message.contains("\"system:anonymous\"") && message.contains("4 requests in flight"),
            "{message}"
        );
        // Generous: the shards are shared with the flood on a 2-core machine, but alice does
        // not queue behind it.
        assert!(
            loaded <= baseline * 20,
            "{driver}: alice's median GET went from {baseline:?} to {loaded:?} during the flood"
        );
        let admin = gw.admin;
        tokio::task::block_in_place(|| {
            let rejected = metric(
                admin,
                "fleetgate_fairness_rejections_total{scope=\"user\",limit=\"concurrent\",kind=\"short\"}",
            );
            assert!(rejected >= 200, "{rejected}");
            let in_flight = metric(
                admin,
                "fleetgate_fairness_in_flight{cluster=\"member\",kind=\"short\"}",
            );
            assert_eq!(in_flight, 4, "the slow requests hold their seats");
        });
        drop(held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_holding_its_watches_can_still_list() {
    let (upstream, gw) = setup_with_config(
        "epoll",
        with_fairness("    perUser: {concurrent: 4, watches: 2}\n    perAddressConnections: 8\n"),
    )
    .await;
    let watch = "/clusters/member/api/v1/configmaps?watch=true";
    let mut watches = Vec::new();
    for _ in 0..2 {
        watches.push(gw.tls_get(watch).await);
    }
    upstream
        .wait_watchers(2, "both watches at the member")
        .await;
    // A third is over the limit, on HTTP/1.1 and on h2.
    let mut tls = gw.tls().await;
    let mut carry = Vec::new();
    let third = get(&mut tls, &mut carry, watch).await;
    assert_eq!(third.code, 429, "{:?}", third.head);
    assert_eq!(third.header("retry-after").as_deref(), Some("1"));
    let message = third.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("\"alice\"") && message.contains("long-running"),
        "{message}"
    );
    let h2 = h2_client(&gw).await;
    let response = h2_get(&h2, watch).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    // Lists are counted apart: alice holding her watches still lists, on both protocols.
    assert_eq!(get(&mut tls, &mut carry, GET).await.code, 200);
    assert_eq!(h2_get(&h2, GET).await.status(), 200);
    // A watch ended gives its seat back.
    drop(watches.pop());
    upstream
        .wait_watchers(1, "the ended watch to leave the member")
        .await;
    let admin = gw.admin;
    tokio::task::block_in_place(|| {
        wait_for(
            "the ended watch's seat to be given back",
            Duration::from_secs(10),
            || {
                metric(
                    admin,
                    "fleetgate_fairness_in_flight{cluster=\"member\",kind=\"long\"}",
                ) == 1
            },
        )
    });
    let _again = gw.tls_get(watch).await;
    upstream.wait_watchers(2, "a new watch at the member").await;
    tokio::task::block_in_place(|| {
        let refused = metric(
            admin,
            "fleetgate_fairness_rejections_total{scope=\"user\",limit=\"watches\",kind=\"long\"}",
        );
        assert_eq!(refused, 2, "the h1 and the h2 watch over the limit");
    });

    // Four connections from 127.0.0.1 are open (a watch, `tls`, the h2 one, `_again`; the
    // admin listener's are not counted): four more fit under 8, the next is closed before its
    // handshake.
    let mut open = Vec::new();
    let mut closed = false;
    for _ in 0..16 {
        let mut tcp = tokio::net::TcpStream::connect(gw.https).await.unwrap();
        let mut byte = [0u8; 1];
        // A refused connection is closed by the gateway without a byte; an accepted one waits
        // for our ClientHello.
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::io::AsyncReadExt::read(&mut tcp, &mut byte),
        )
        .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(_)) => panic!("the gateway spoke first"),
            Err(_) => open.push(tcp),
        }
    }
    assert!(
        closed,
        "no connection was refused after {} open",
        open.len()
    );
    assert_eq!(open.len(), 4, "connections accepted besides the 4 open");
    tokio::task::block_in_place(|| {
        let refused = metric(
            admin,
            "fleetgate_fairness_rejections_total{scope=\"address\",limit=\"connections\",kind=\"short\"}",
        );
        assert!(refused >= 1, "{refused}");
    });
}

/// Sets `spec.fairness` of the simulated fleet's Gateway (`null` removes it).
fn set_fairness(fleet: &Fleet, fairness: serde_yaml::Value) {
    let path = fleet.fleet_path("gateway.yaml");
    let mut gateway: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let spec = gateway["spec"].as_mapping_mut().unwrap();
    if fairness.is_null() {
        spec.remove("fairness");
    } else {
        spec.insert("fairness".into(), fairness);
    }
    // Written whole and renamed in, as an editor or `kubectl cp` would.
    let tmp = fleet.fleet_path("gateway.yaml.tmp");
    std::fs::write(&tmp, serde_yaml::to_string(&gateway).unwrap()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

#[test]
fn kubectl_waits_out_a_429_and_a_bad_fairness_keeps_the_last_good_one() {
    let mut fleet = Fleet::sim(1, 2);
    // `admin` (the fleet kubeconfig's user): one request per 5 s.
    set_fairness(
        &fleet,
        serde_yaml::from_str("{users: {admin: {rate: 0.2, burst: 1}}}").unwrap(),
    );
    fleet.serve(&["--workers", "2"], Some("info"));
    let path = "/clusters/member1/api/v1/namespaces/default/configmaps";
    assert_eq!(fleet.request("GET", path, "").0, 200);
    let (code, body) = fleet.request("GET", path, "");
    assert_eq!(code, 429, "{body}");
    // kubectl is refused too, waits the Retry-After (up to 5 s) and gets its answer.
    let start = Instant::now();
    let out = fleet.kubectl_ok("member1", &["get", "--raw", path]);
    assert!(out.contains("\"kind\":\"ConfigMapList\""), "{out}");
    let rejected = fleet
        .metric("fleetgate_fairness_rejections_total{scope=\"user\",limit=\"rate\",kind=\"short\"}")
        .unwrap_or(0);
    assert!(
        rejected >= 2,
        "kubectl was never refused ({rejected} refusals; it took {:?})",
        start.elapsed()
    );

    // A bad value: rejected, named, and the last good limits keep serving.
    set_fairness(
        &fleet,
        serde_yaml::from_str("{perUser: {concurrent: 0}}").unwrap(),
    );
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "rejected",
        Duration::from_secs(5),
        "no reload error shown",
    );
    assert!(
        verbose.contains("spec.fairness.perUser.concurrent") && verbose.contains("between 1"),
        "{verbose}"
    );
    let codes: Vec<u16> = (0..3).map(|_| fleet.request("GET", path, "").0).collect();
    assert!(
        codes.contains(&429),
        "admin's rate limit no longer holds: {codes:?}"
    );

    // Fairness off: every request admitted again.
    set_fairness(&fleet, serde_yaml::Value::Null);
    fleet.admin_until(
        "/readyz?verbose",
        "config-reload ok",
        Duration::from_secs(5),
        "the reload error did not clear",
    );
    let codes: Vec<u16> = (0..5).map(|_| fleet.request("GET", path, "").0).collect();
    assert_eq!(codes, [200; 5]);
}
