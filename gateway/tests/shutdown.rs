//! Graceful shutdown and idle timeouts of a real `fleetgate serve` process, each test under both
//! monoio drivers, with real h2 (`h2` crate) and HTTP/1.1 (raw bytes over TLS) clients:
//! SIGTERM sends GOAWAY to h2 clients, lets in-flight requests (h2 and HTTP/1.1) finish, closes
//! idle keep-alive connections, refuses new connections and exits 0; a watch ends cleanly when
//! the drain starts (its client watches again elsewhere, from its last resourceVersion), while a
//! followed log runs on and is cut at the end of the grace period; a second signal exits at once; `spec.http2.maxConcurrentStreams` is what the
//! client sees in SETTINGS; `spec.http2.idleTimeoutSeconds` closes an idle h2 connection with
//! GOAWAY but not one with an open watch; `spec.limits.idleTimeoutSeconds` closes an idle
//! HTTP/1.1 keep-alive connection; a reload that changes `spec.http2` applies to new connections.

mod support;

use std::future::Future;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use support::{
    h2_answer, h2_send_get, read_h2_body, read_response, setup_with_config, Gateway, Upstream,
    DRIVERS,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{oneshot, watch};

/// Starts a member and a gateway whose Gateway object gets `limits` appended to its
/// `spec.limits` block and `spec_extra` appended to its spec.
async fn start(driver: &str, limits: &str, spec_extra: &str) -> (Upstream, Gateway) {
    setup_with_config(driver, |text| {
        let anchor = "    responseHeadTimeoutSeconds: 0.5\n";
        assert!(text.ends_with(anchor), "the test config changed shape");
        format!("{text}{limits}{spec_extra}")
    })
    .await
}

/// An h2 client connection: the request handle, the connection's end (its result), and the
/// peer's SETTINGS_MAX_CONCURRENT_STREAMS as the client sees it after each poll.
struct H2 {
    client: SendRequest<Bytes>,
    closed: oneshot::Receiver<Result<(), h2::Error>>,
    max_send_streams: watch::Receiver<usize>,
}

async fn h2_connect(gw: &Gateway) -> H2 {
    let tls = gw.tls_h2().await;
    let (client, connection) = h2::client::Builder::new()
        .initial_connection_window_size(16 * 1024 * 1024)
        .handshake::<_, Bytes>(tls)
        .await
        .expect("h2 handshake");
    let (closed_tx, closed) = oneshot::channel();
    let (max_tx, max_send_streams) = watch::channel(0);
    tokio::spawn(async move {
        let mut connection = Box::pin(connection);
        let result = std::future::poll_fn(|cx| {
            let polled = connection.as_mut().poll(cx);
            max_tx.send_replace(connection.max_concurrent_send_streams());
            polled
        })
        .await;
        let _ = closed_tx.send(result);
    });
    H2 {
        client,
        closed,
        max_send_streams,
    }
}

/// Opens a watch of the member's ConfigMaps on `h2` (its head must be 200) and waits until it
/// reached the member; its body, to read or to hold (dropping it resets the stream).
async fn open_watch(h2: &H2, upstream: &Upstream, driver: &str) -> h2::RecvStream {
    open_stream(h2, upstream, WATCH, 1, driver).await
}

/// Opens the long-running GET `path` on `h2` (its head must be 200) and waits until the member
/// streams to `streams` requests; its body.
async fn open_stream(
    h2: &H2,
    upstream: &Upstream,
    path: &str,
    streams: usize,
    driver: &str,
) -> h2::RecvStream {
    let response = h2_send_get(&h2.client, path).await.await.unwrap();
    assert_eq!(response.status(), 200, "{driver}: {path}");
    upstream
        .wait_watchers(streams, "stream reached the member")
        .await;
    response.into_body()
}

const WATCH: &str = "/clusters/member/api/v1/configmaps?watch=true";
/// A followed log: long-running, not a watch (the test member streams any `watch=true` target).
const FOLLOW: &str = "/clusters/member/api/v1/namespaces/default/pods/p/log?follow=true&watch=true";

/// The next piece of `body` within 5 s, its window given back.
async fn next_data(body: &mut h2::RecvStream, what: &str) -> Bytes {
    let data = tokio::time::timeout(Duration::from_secs(5), body.data())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within 5 s"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let _ = body.flow_control().release_capacity(data.len());
    data
}

/// Polls `check` every 10 ms until it is true, for at most `within`.
async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the client has received GOAWAY(NO_ERROR) from the gateway, and returns the error
/// a new request meets.
async fn goaway_seen(client: &SendRequest<Bytes>, within: Duration) -> h2::Error {
    let deadline = Instant::now() + within;
    loop {
        if let Err(error) = client.clone().ready().await {
            return error;
        }
        assert!(Instant::now() < deadline, "no GOAWAY within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether connecting to `address` fails within `within`: a draining gateway refuses new
/// connections rather than leaving them queued with nobody accepting.
async fn refused_within(address: std::net::SocketAddr, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if tokio::net::TcpStream::connect(address).await.is_err() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_graceful_goaway(error: &h2::Error, driver: &str, gw: &Gateway) {
    assert!(
        error.is_go_away() && error.is_remote() && error.reason() == Some(h2::Reason::NO_ERROR),
        "{driver}: not a GOAWAY(NO_ERROR) from the gateway: {error:?}; log: {}",
        gw.log()
    );
}

fn signal(gw: &Gateway, signal: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on the pid of our own child with a valid signal number touches no memory.
    unsafe {
        libc::kill(gw.child.id() as libc::pid_t, signal);
    }
}

/// Waits for the gateway process to exit, for at most `within`.
fn wait_exit(gw: &mut Gateway, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway did not exit within {within:?}: {}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the member has seen a request whose head contains `needle`.
fn member_saw(upstream: &Upstream, needle: &str) -> bool {
    upstream.requests().iter().any(|r| r.head.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_h2_and_http1_lets_in_flight_requests_finish_and_exits_zero() {
    for driver in DRIVERS {
        let (upstream, mut gw) = start(driver, "    shutdownGraceSeconds: 20\n", "").await;
        let h2 = h2_connect(&gw).await;
        let warm = h2_send_get(&h2.client, "/clusters/member/api").await;
        assert_eq!(warm.await.unwrap().status(), 200, "{driver}");

        // In flight at SIGTERM: an h2 request and an HTTP/1.1 request the member answers after
        // 1.5 s, and an HTTP/1.1 keep-alive connection that is idle between requests.
        let h2_in_flight =
            h2_send_get(&h2.client, "/clusters/member/late-watch?watch=true&via=h2").await;
        let mut h1_busy = gw
            .tls_get("/clusters/member/late-watch?watch=true&via=h1")
            .await;
        let mut h1_idle = gw.tls_get("/healthz").await;
        let mut idle_carry = Vec::new();
        let health = read_response(&mut h1_idle, &mut idle_carry).await.unwrap();
        assert_eq!(health.code, 200, "{driver}");
        eventually(
            Duration::from_secs(10),
            "member got both slow requests",
            || member_saw(&upstream, "via=h2") && member_saw(&upstream, "via=h1"),
        )
        .await;

        let signalled = Instant::now();
        signal(&gw, libc::SIGTERM);

        // h2: GOAWAY(NO_ERROR) arrives while the request is still in flight, and new streams
        // are refused from then on.
        let error = goaway_seen(&h2.client, Duration::from_secs(5)).await;
        assert_graceful_goaway(&error, driver, &gw);
        // The in-flight h2 request completes.
        let response = tokio::time::timeout(Duration::from_secs(10), h2_in_flight)
            .await
            .expect("in-flight h2 response in time")
            .expect("in-flight h2 response");
        assert_eq!(
            h2_answer(response).await,
            (200, b"late".to_vec()),
            "{driver}"
        );

        // HTTP/1.1: the idle keep-alive connection is closed at once.
        let mut byte = [0u8; 1];
        let idle_read = tokio::time::timeout(Duration::from_secs(5), h1_idle.read(&mut byte))
            .await
            .expect("idle HTTP/1.1 connection closed in time");
        assert!(
            matches!(idle_read, Ok(0) | Err(_)),
            "{driver}: {idle_read:?}"
        );
        // The busy one gets its response, marked as the last, and is closed after it.
        let mut carry = Vec::new();
        let response = tokio::time::timeout(
            Duration::from_secs(10),
            read_response(&mut h1_busy, &mut carry),
        )
        .await
        .expect("in-flight HTTP/1.1 response in time")
        .expect("in-flight HTTP/1.1 response");
        assert_eq!(response.code, 200, "{driver}");
        assert_eq!(response.body, b"late", "{driver}");
        assert_eq!(
            response.header("connection").as_deref(),
            Some("close"),
            "{driver}"
        );
        let after = tokio::time::timeout(Duration::from_secs(5), h1_busy.read(&mut byte))
            .await
            .expect("busy HTTP/1.1 connection closed after its response");
        assert!(matches!(after, Ok(0) | Err(_)), "{driver}: {after:?}");

        // New connections are refused.
        assert!(
            refused_within(gw.https, Duration::from_secs(5)).await,
            "{driver}: the gateway still accepts connections while draining"
        );

        // The h2 connection ends cleanly once its last stream is done.
        let closed = tokio::time::timeout(Duration::from_secs(10), h2.closed)
            .await
            .expect("h2 connection closed in time")
            .unwrap();
        assert!(closed.is_ok(), "{driver}: {closed:?}");

        // Every connection is gone: the process exits 0 well within the grace period.
        let status = tokio::task::block_in_place(|| wait_exit(&mut gw, Duration::from_secs(20)));
        assert!(status.success(), "{driver}: {status}; log: {}", gw.log());
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "{driver}: drain took {:?}",
            signalled.elapsed()
        );
        let log = gw.log();
        assert!(log.contains("drain started"), "{driver}: {log}");
        assert!(log.contains("every connection closed"), "{driver}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_end_cleanly_when_the_drain_starts_and_a_followed_log_is_cut_at_the_end_of_the_grace_period(
) {
    for driver in DRIVERS {
        let (upstream, mut gw) = start(driver, "    shutdownGraceSeconds: 5\n", "").await;
        let h2 = h2_connect(&gw).await;
        let mut watch = open_watch(&h2, &upstream, driver).await;
        let mut h1_watch = gw.tls_get(WATCH).await;
        upstream
            .wait_watchers(2, "the HTTP/1.1 watch reached the member")
            .await;
        let mut follow = open_stream(&h2, &upstream, FOLLOW, 3, driver).await;
        upstream.emit("{\"type\":\"ADDED\",\"n\":0}");
        let first = b"{\"type\":\"ADDED\",\"n\":0}\n";
        assert_eq!(
            &next_data(&mut watch, "h2 watch").await[..],
            first,
            "{driver}"
        );
        assert_eq!(
            &next_data(&mut follow, "followed log").await[..],
            first,
            "{driver}"
        );
        let mut h1_seen = Vec::new();
        while !String::from_utf8_lossy(&h1_seen).contains("\"n\":0") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), h1_watch.read(&mut buf))
                .await
                .expect("HTTP/1.1 watch event in time")
                .expect("HTTP/1.1 watch read");
            assert!(
                n > 0,
                "{driver}: the HTTP/1.1 watch ended before its first event"
            );
            h1_seen.extend_from_slice(&buf[..n]);
        }

        let ready = admin_readyz(&gw).await;
        assert_eq!(ready.code, 200, "{driver}");
        let signalled = Instant::now();
        signal(&gw, libc::SIGTERM);
        assert_graceful_goaway(
            &goaway_seen(&h2.client, Duration::from_secs(5)).await,
            driver,
            &gw,
        );
        // The watches end as a member's own watch ends: END_STREAM on h2, the last chunk on
        // HTTP/1.1. A client resumes from its last resourceVersion elsewhere, without a LIST
        // (a cut stream, at the end of the grace period, is an error to client-go).
        let end = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                match watch.data().await {
                    // The end may come as an empty DATA frame carrying END_STREAM.
                    Some(Ok(data)) if data.is_empty() => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("the h2 watch ends when the drain starts, not at the grace period's end");
        assert!(
            end.is_none(),
            "{driver}: the h2 watch was not ended cleanly: {end:?}"
        );
        let rest = tokio::time::timeout(Duration::from_secs(3), async {
            let mut rest = Vec::new();
            let _ = h1_watch.read_to_end(&mut rest).await;
            rest
        })
        .await
        .expect("the HTTP/1.1 watch ends when the drain starts");
        h1_seen.extend_from_slice(&rest);
        assert!(
            h1_seen.ends_with(b"0\r\n\r\n"),
            "{driver}: the HTTP/1.1 watch did not end with its last chunk: {}",
            String::from_utf8_lossy(&h1_seen)
        );
        assert!(
            signalled.elapsed() < Duration::from_secs(4),
            "{driver}: the watches ended {:?} after the signal",
            signalled.elapsed()
        );
        // A load balancer asking /readyz learns of the drain.
        let draining = admin_readyz(&gw).await;
        assert_eq!(draining.code, 500, "{driver}");
        assert!(
            String::from_utf8_lossy(&draining.body).contains("[-]shutdown failed: draining"),
            "{driver}: {}",
            String::from_utf8_lossy(&draining.body)
        );
        // New connections are refused while the followed log keeps the process alive (every
        // shard shuts its listening sockets down; none is left queueing connections).
        assert!(
            refused_within(gw.https, Duration::from_millis(1500)).await,
            "{driver}: the gateway still accepts connections during the grace period"
        );
        // The followed log is in flight: its lines still arrive during the drain.
        upstream.emit("{\"type\":\"ADDED\",\"n\":1}");
        assert_eq!(
            &next_data(&mut follow, "followed log during the drain").await[..],
            b"{\"type\":\"ADDED\",\"n\":1}\n",
            "{driver}"
        );

        // At the end of the grace period the process exits 0 and the followed log is cut.
        let status = tokio::task::block_in_place(|| wait_exit(&mut gw, Duration::from_secs(15)));
        let took = signalled.elapsed();
        assert!(status.success(), "{driver}: {status}; log: {}", gw.log());
        assert!(
            took >= Duration::from_millis(4900),
            "{driver}: exited after {took:?}, before the grace period was over"
        );
        assert!(
            took < Duration::from_secs(12),
            "{driver}: exited after {took:?}"
        );
        let end = tokio::time::timeout(Duration::from_secs(5), follow.data())
            .await
            .expect("the cut log ends");
        assert!(!matches!(end, Some(Ok(_))), "{driver}: {end:?}");
        let log = gw.log();
        assert!(log.contains("grace period over"), "{driver}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_drain_exits_at_once() {
    for driver in DRIVERS {
        let (upstream, mut gw) = start(driver, "    shutdownGraceSeconds: 120\n", "").await;
        let h2 = h2_connect(&gw).await;
        // Held open (a followed log runs through the drain; dropping the body would reset the
        // stream).
        let _follow = open_stream(&h2, &upstream, FOLLOW, 1, driver).await;
        signal(&gw, libc::SIGTERM);
        // The drain has begun once the client sees GOAWAY.
        goaway_seen(&h2.client, Duration::from_secs(5)).await;
        let second = Instant::now();
        signal(&gw, libc::SIGINT);
        let status = tokio::task::block_in_place(|| wait_exit(&mut gw, Duration::from_secs(5)));
        assert!(second.elapsed() < Duration::from_secs(5), "{driver}");
        assert_eq!(
            status.code(),
            Some(128 + libc::SIGINT),
            "{driver}: {status}"
        );
        assert!(gw.log().contains("second signal"), "{driver}: {}", gw.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_streams_from_the_gateway_object_is_what_the_client_gets() {
    for driver in DRIVERS {
        let (upstream, gw) = start(driver, "", "  http2:\n    maxConcurrentStreams: 7\n").await;
        let mut h2 = h2_connect(&gw).await;
        tokio::time::timeout(
            Duration::from_secs(5),
            h2.max_send_streams.wait_for(|max| *max == 7),
        )
        .await
        .expect("SETTINGS_MAX_CONCURRENT_STREAMS 7 in time")
        .unwrap();

        // Seven watches are open at once; an eighth waits for a free stream.
        let mut watches = Vec::new();
        for i in 0..7 {
            let response = h2_send_get(
                &h2.client,
                &format!("/clusters/member/api/v1/configmaps?watch=true&w={i}"),
            )
            .await;
            let response = tokio::time::timeout(Duration::from_secs(10), response)
                .await
                .expect("watch head in time")
                .unwrap();
            assert_eq!(response.status(), 200, "{driver}");
            watches.push(response.into_body());
        }
        let eighth = h2_send_get(&h2.client, "/clusters/member/api?eighth=1").await;
        let mut eighth = Box::pin(eighth);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), eighth.as_mut())
                .await
                .is_err(),
            "{driver}: an eighth stream was served while seven were open"
        );
        assert!(!member_saw(&upstream, "eighth=1"), "{driver}");
        // Closing one watch (RST_STREAM) frees a stream for the eighth.
        drop(watches.pop());
        let response = tokio::time::timeout(Duration::from_secs(10), eighth)
            .await
            .expect("the eighth stream is served once one closes")
            .unwrap();
        assert_eq!(response.status(), 200, "{driver}");
        assert!(member_saw(&upstream, "eighth=1"), "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_idle_timeout_sends_goaway_to_an_idle_connection_but_not_to_one_with_an_open_watch() {
    for driver in DRIVERS {
        let (upstream, gw) = start(driver, "", "  http2:\n    idleTimeoutSeconds: 1\n").await;
        // A connection with an open watch.
        let mut busy = h2_connect(&gw).await;
        let mut watch = open_watch(&busy, &upstream, driver).await;

        // An idle connection: one request, then nothing.
        let idle = h2_connect(&gw).await;
        let response = h2_send_get(&idle.client, "/clusters/member/api")
            .await
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{driver}");
        assert!(
            !read_h2_body(response.into_body()).await.is_empty(),
            "{driver}"
        );
        let idle_from = Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(15), idle.closed)
            .await
            .expect("the idle connection is closed")
            .unwrap();
        let idle_for = idle_from.elapsed();
        assert!(closed.is_ok(), "{driver}: {closed:?}");
        assert!(
            idle_for >= Duration::from_millis(900),
            "{driver}: closed after {idle_for:?} idle"
        );
        assert_graceful_goaway(
            &goaway_seen(&idle.client, Duration::from_secs(1)).await,
            driver,
            &gw,
        );

        // The watch has now been open longer than the idle timeout, and twice that is over
        // before it is checked: its connection is still open and serving.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            matches!(
                busy.closed.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "{driver}: the connection with an open watch was closed"
        );
        upstream.emit("{\"type\":\"ADDED\",\"n\":7}");
        let event = tokio::time::timeout(Duration::from_secs(5), watch.data())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        assert_eq!(&event[..], b"{\"type\":\"ADDED\",\"n\":7}\n", "{driver}");
        let response = h2_send_get(&busy.client, "/clusters/member/api")
            .await
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_idle_timeout_closes_an_idle_connection_but_not_a_watch() {
    for driver in DRIVERS {
        let (upstream, gw) = start(driver, "    idleTimeoutSeconds: 1\n", "").await;
        let mut watch = gw.tls_get(WATCH).await;
        upstream.wait_watchers(1, "watch reached the member").await;

        let mut idle = gw.tls_get("/healthz").await;
        let mut carry = Vec::new();
        let response = read_response(&mut idle, &mut carry).await.unwrap();
        assert_eq!(response.code, 200, "{driver}");
        assert_eq!(response.header("connection"), None, "{driver}: kept alive");
        let idle_from = Instant::now();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(15), idle.read(&mut byte))
            .await
            .expect("the idle keep-alive connection is closed");
        assert!(matches!(read, Ok(0) | Err(_)), "{driver}: {read:?}");
        assert!(
            idle_from.elapsed() >= Duration::from_millis(900),
            "{driver}: closed after {:?}",
            idle_from.elapsed()
        );

        // The watch (a response in flight, not an idle connection) still delivers.
        upstream.emit("{\"type\":\"ADDED\",\"n\":3}");
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !String::from_utf8_lossy(&seen).contains("\"n\":3") {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()),
                watch.read(&mut chunk),
            )
            .await
            .expect("watch event in time")
            .unwrap();
            assert!(n > 0, "{driver}: the watch connection was closed");
            seen.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A GET of `path` on the admin listener (`Connection: close`): the response.
async fn admin_get(gw: &Gateway, path: &str) -> support::Response {
    let stream = tokio::net::TcpStream::connect(gw.admin).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    support::exchange(stream, request.as_bytes())
        .await
        .unwrap_or_else(|| panic!("no answer to admin {path}"))
}

/// The admin listener's `/readyz?verbose`.
async fn admin_readyz(gw: &Gateway) -> support::Response {
    admin_get(gw, "/readyz?verbose").await
}

/// The routing table generation the gateway serves, from its admin `/metrics`.
async fn served_generation(gw: &Gateway) -> u64 {
    let response = admin_get(gw, "/metrics").await;
    String::from_utf8_lossy(&response.body)
        .lines()
        .find_map(|l| l.strip_prefix("fleetgate_config_generation "))
        .and_then(|v| v.trim().parse().ok())
        .expect("fleetgate_config_generation in /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_h2_settings_for_new_connections_only() {
    for driver in DRIVERS {
        let (_upstream, gw) = start(driver, "", "  http2:\n    maxConcurrentStreams: 7\n").await;
        let mut before = h2_connect(&gw).await;
        tokio::time::timeout(
            Duration::from_secs(5),
            before.max_send_streams.wait_for(|max| *max == 7),
        )
        .await
        .expect("7 before the reload")
        .unwrap();
        let generation = served_generation(&gw).await;
        let gateway_yaml = gw.dir.path().join("gateway.yaml");
        let text = std::fs::read_to_string(&gateway_yaml).unwrap();
        std::fs::write(
            &gateway_yaml,
            text.replace("maxConcurrentStreams: 7", "maxConcurrentStreams: 3"),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while served_generation(&gw).await == generation {
            assert!(
                Instant::now() < deadline,
                "{driver}: no reload: {}",
                gw.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut after = h2_connect(&gw).await;
        tokio::time::timeout(
            Duration::from_secs(5),
            after.max_send_streams.wait_for(|max| *max == 3),
        )
        .await
        .expect("3 on a connection made after the reload")
        .unwrap();
        // The connection made before keeps the settings it started with.
        let response = h2_send_get(&before.client, "/clusters/member/api").await;
        assert_eq!(response.await.unwrap().status(), 200, "{driver}");
        assert_eq!(*before.max_send_streams.borrow(), 7, "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_right_after_ready_drains_instead_of_killing() {
    // The signal handlers must be in place when `ready` is printed: a supervisor that stops the
    // gateway as soon as it reports ready gets a drain and exit 0, not the default action's kill.
    for driver in DRIVERS {
        for round in 0..5 {
            let (_upstream, mut gw) = start(driver, "", "").await;
            signal(&gw, libc::SIGTERM);
            let status =
                tokio::task::block_in_place(|| wait_exit(&mut gw, Duration::from_secs(15)));
            assert!(
                status.success(),
                "{driver} round {round}: {status}; log: {}",
                gw.log()
            );
        }
    }
}
