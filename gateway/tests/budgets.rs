//! What a hostile or broken client may hold of the gateway (issue 11, items 7 and 9), through a
//! real `fleetgate serve` against the recording member, under both drivers:
//! - a client that stops reading an ordinary response is cut after `clientWriteTimeoutSeconds`,
//!   and its member connection is freed;
//! - what a client sends while a watch streams is bounded by `maxHeadBytes`;
//! - the member connections one client address holds are capped
//!   (`maxMemberConnectionsPerClient`): past it, a 429 Status with `Retry-After`;
//! - near the process's file-descriptor limit, a request that needs a new member connection gets
//!   a 503 Status, while health checks and streams already open keep working;
//! - the soft open-files limit is raised to the hard one at start.

mod support;

use std::time::Duration;

use support::fleet::admin_get;
use support::wait::wait_for;
use support::{h2_client, h2_get, setup_with, setup_with_config, DRIVERS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A watch of the recording member's ConfigMaps (it streams what `Upstream::emit` sends).
const WATCH: &str = "/clusters/member/api/v1/configmaps?watch=true";
/// An ordinary request that needs a member connection.
const NAMESPACES: &str = "/clusters/member/api/v1/namespaces";

/// Reads a response head (not its body, which for a watch never ends) and returns its code; the
/// bytes read past the head stay in `carry`.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, carry: &mut Vec<u8>) -> u16 {
    loop {
        if let Some(end) = carry.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&carry[..end]).into_owned();
            carry.drain(..end + 4);
            return head.split(' ').nth(1).unwrap().parse().unwrap();
        }
        read_more(stream, carry, "a response head").await;
    }
}

/// Reads what `stream` has next onto `carry`; fails the test if `what` (the bytes awaited) does
/// not come within 10 s or the stream ends first.
async fn read_more<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    carry: &mut Vec<u8>,
    what: &str,
) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
        .await
        .unwrap_or_else(|_| panic!("{what} in time"))
        .unwrap();
    assert!(n > 0, "closed before {what}");
    carry.extend_from_slice(&chunk[..n]);
}

/// The gateway's `fleetgate_upstream_connections` for the test member.
fn upstream_connections(admin: std::net::SocketAddr) -> i64 {
    let metrics = admin_get(admin, "/metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("fleetgate_upstream_connections{cluster=\"member\"} "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_an_ordinary_response_is_cut_and_its_member_freed() {
    for driver in DRIVERS {
        let (_upstream, gw) = setup_with_config(driver, |text| {
            text.replace(
                "maxHeadBytes: 8192",
                "maxHeadBytes: 8192\n    clientWriteTimeoutSeconds: 1",
            )
        })
        .await;
        // 64 MiB the client never reads: far more than the socket buffers hold.
        let mut tls = gw.tls_get("/clusters/member/big?bytes=67108864").await;
        let admin = gw.admin;
        tokio::task::block_in_place(|| {
            wait_for(
                "the member connection to be used",
                Duration::from_secs(10),
                || upstream_connections(admin) == 1,
            );
            wait_for(
                "the stalled response to be cut and its member connection freed",
                Duration::from_secs(15),
                || upstream_connections(admin) == 0,
            );
        });
        // The client sees what was sent, then the end: never the whole body.
        let mut received = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut received)).await;
        assert!(received.len() < 64 << 20, "{driver}: the whole body came");

        // The same over h2: a stream whose window the client never opens again.
        let h2 = h2_client(&gw).await;
        let response = h2_get(&h2, "/clusters/member/big?bytes=67108864").await;
        assert_eq!(response.status(), 200);
        let _unread = response.into_body();
        tokio::task::block_in_place(|| {
            wait_for(
                "the stalled h2 stream to be cut and its member connection freed",
                Duration::from_secs(15),
                || upstream_connections(admin) == 0,
            );
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_client_sends_during_a_watch_is_bounded_by_the_head_limit() {
    for driver in DRIVERS {
        let (upstream, gw) = setup_with_config(driver, |text| text).await;
        let mut tls = gw.tls_get(WATCH).await;
        let mut carry = Vec::new();
        assert_eq!(read_head(&mut tls, &mut carry).await, 200);
        upstream
            .wait_watchers(1, "the watch to reach the member")
            .await;
        // More than maxHeadBytes (8192 in the test Gateway) that is no request at all.
        let garbage = vec![b'x'; 20_000];
        let _ = tls.write_all(&garbage).await;
        upstream.wait_watchers(0, "the watch to be cut").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_holds_at_most_its_member_connections() {
    for driver in DRIVERS {
        let (upstream, gw) = setup_with_config(driver, |text| {
            text.replace("workers: 2", "workers: 1").replace(
                "maxHeadBytes: 8192",
                "maxHeadBytes: 8192\n    maxMemberConnectionsPerClient: 3",
            )
        })
        .await;
        // Three watches hold three member connections.
        let mut watches = Vec::new();
        for _ in 0..3 {
            watches.push(gw.tls_get(WATCH).await);
        }
        upstream.wait_watchers(3, "three watches").await;
        // A fourth request from the same address is refused with a Status kubectl retries.
        let refused = gw.https_get(NAMESPACES).await;
        assert_eq!(refused.code, 429, "{driver}: {refused:?}");
        assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
        assert_eq!(refused.json()["reason"], "TooManyRequests");
        let response = h2_get(&h2_client(&gw).await, NAMESPACES).await;
        assert_eq!(response.status(), 429, "{driver} (h2)");
        assert_eq!(response.headers()["retry-after"], "1");
        // Health checks need no member connection.
        let health = gw.https_get("/healthz").await;
        assert_eq!(health.code, 200);
        // One watch ends: the address may hold another.
        drop(watches.pop());
        upstream.wait_watchers(2, "the watch to end").await;
        let admitted = gw.https_get(NAMESPACES).await;
        assert_eq!(admitted.code, 200, "{driver}: {admitted:?}");
    }
}

/// Limits the child's open files to `n` (soft and hard), as a tight container would.
fn limit_open_files(command: &mut std::process::Command, n: u64) {
    limit_open_files_to(command, n, n)
}

/// Starts the child with a soft limit of `soft` and a hard one of `hard` open files.
fn limit_open_files_to(command: &mut std::process::Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the child between fork and exec and only calls setrlimit,
    // which is async-signal-safe, on a struct it owns.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_files_limit_is_raised_to_the_hard_one_at_start() {
    let (_upstream, gw) = setup_with(
        "epoll",
        |text| text,
        |command| limit_open_files_to(command, 512, 4096),
    )
    .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", gw.child.id())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = open_files.split_whitespace().collect();
    assert_eq!(&fields[3..5], ["4096", "4096"], "{open_files}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_the_descriptor_limit_new_member_connections_get_503_and_health_and_streams_go_on() {
    for driver in DRIVERS {
        // 256 files: the reserve is 64, so about 190 sockets may be open before a new member
        // connection is refused.
        let (upstream, gw) = setup_with(
            driver,
            |text| text.replace("workers: 2", "workers: 1"),
            |command| limit_open_files(command, 256),
        )
        .await;
        // Open watches (a client and a member socket each) until one is refused.
        let mut watches = Vec::new();
        let refused = loop {
            assert!(watches.len() < 200, "{driver}: nothing was ever refused");
            let mut tls = gw.tls_get(WATCH).await;
            let mut carry = Vec::new();
            let code = read_head(&mut tls, &mut carry).await;
            if code != 200 {
                // The Status body (it ends with a line feed).
                while !carry.ends_with(b"\n") {
                    read_more(
                        &mut tls,
                        &mut carry,
                        &format!("{driver}: the refusal's end"),
                    )
                    .await;
                }
                break (code, carry);
            }
            watches.push((tls, carry));
        };
        let (code, body) = refused;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 503, "{driver}: {body}");
        assert!(body.contains("out of file descriptors"), "{driver}: {body}");
        assert!(
            watches.len() > 50,
            "{driver}: refused after only {}",
            watches.len()
        );
        // Health checks still answer, and the open watches still stream.
        let health = gw.https_get("/healthz").await;
        assert_eq!(health.code, 200, "{driver}");
        upstream.emit("{\"type\":\"ADDED\",\"object\":{\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"late\"}}}");
        let (tls, carry) = watches.last_mut().unwrap();
        while !String::from_utf8_lossy(carry).contains("late") {
            read_more(tls, carry, &format!("{driver}: the event")).await;
        }
    }
}
