//! Socket-level tests of HTTP/1.1 upgrades through `fleetgate serve` against a raw member, each
//! run under both monoio drivers (epoll and io_uring): the request forwarded with `Connection:
//! Upgrade`, `Upgrade` and the gateway's identity on a dedicated member connection (not the idle
//! pooled one), the 101 relayed with its headers, bytes sent early on either side delivered
//! first, data both ways, and half-close in each direction; a non-101 answer relayed as an
//! ordinary response that closes the connection.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::{read_response, setup, DRIVERS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Reads until `want` bytes have arrived (within 20 s), returning everything read.
async fn read_at_least<S: AsyncRead + Unpin>(stream: &mut S, carry: &mut Vec<u8>, want: usize) {
    let mut chunk = vec![0u8; 64 * 1024];
    while carry.len() < want {
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut chunk))
            .await
            .expect("bytes in time")
            .expect("read");
        assert!(n > 0, "closed after {} of {want} bytes", carry.len());
        carry.extend_from_slice(&chunk[..n]);
    }
}

/// Reads a response head (up to the empty line) and returns it with the bytes after it.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> (String, Vec<u8>) {
    let mut carry = Vec::new();
    loop {
        if let Some(end) = carry.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&carry[..end + 4]).into_owned();
            return (head, carry.split_off(end + 4));
        }
        let before = carry.len();
        read_at_least(stream, &mut carry, before + 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_spliced_both_ways_on_a_dedicated_member_connection() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        // A plain request first, so an idle pooled member connection exists on this shard.
        let mut tls = gw.tls_get("/clusters/member/api").await;
        let mut carry = Vec::new();
        assert_eq!(read_response(&mut tls, &mut carry).await.unwrap().code, 200);
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 1, "{driver}");

        // The upgrade request with the first bytes of the new protocol in the same write.
        tls.write_all(
            b"GET /clusters/member/api/v1/namespaces/a/pods/p/echo-upgrade?x=1 HTTP/1.1\r\n\
              Host: gw\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\nearly",
        )
        .await
        .unwrap();
        let (head, mut rest) = read_head(&mut tls).await;
        assert!(
            head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
            "{driver}: {head}"
        );
        for relayed in [
            "Upgrade: websocket\r\n",
            "Connection: Upgrade\r\n",
            "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n",
            "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n",
            "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
        ] {
            assert!(
                head.contains(relayed),
                "{driver}: {relayed:?} not in {head}"
            );
        }
        assert!(!head.contains("Keep-Alive"), "{driver}: {head}");
        // The member's bytes sent with its 101, then the client's early bytes echoed.
        read_at_least(&mut tls, &mut rest, b"member-first:early".len()).await;
        assert_eq!(rest, b"member-first:early", "{driver}");

        // Larger than a splice buffer, both ways.
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
        let (mut reader, mut writer) = tokio::io::split(tls);
        let sent = payload.clone();
        let sender = tokio::spawn(async move {
            writer.write_all(&sent).await.unwrap();
            writer.flush().await.unwrap();
            writer
        });
        let mut echoed = Vec::new();
        read_at_least(&mut reader, &mut echoed, payload.len()).await;
        assert!(
            echoed[..payload.len()] == payload[..],
            "{driver}: echo differs"
        );
        // Client half-close: the member sees end of stream and still gets `bye` through.
        let mut writer = sender.await.unwrap();
        writer.shutdown().await.unwrap();
        let mut tail = echoed.split_off(payload.len());
        tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut tail))
            .await
            .expect("the gateway closed after the member")
            .ok();
        assert_eq!(tail, b"bye", "{driver}");

        let seen = upstream.requests();
        let forwarded = seen
            .iter()
            .find(|r| r.head.contains("echo-upgrade"))
            .expect("upgrade forwarded");
        for expected in [
            "GET /prefix/api/v1/namespaces/a/pods/p/echo-upgrade?x=1 HTTP/1.1\r\n",
            "Connection: Upgrade\r\n",
            "Upgrade: websocket\r\n",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
            "Impersonate-User: alice\r\n",
        ] {
            assert!(
                forwarded.head.contains(expected),
                "{driver}: {expected:?} not in {}",
                forwarded.head
            );
        }
        assert!(
            !forwarded.head.contains("keep-alive"),
            "{driver}: {}",
            forwarded.head
        );
        // A dedicated connection, although a pooled one was idle.
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2, "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_half_close_reaches_the_client_and_the_client_may_still_send() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let mut tls = gw
            .tls_sent(
                b"POST /clusters/member/api/v1/namespaces/a/pods/p/upgrade-then-close HTTP/1.1\r\n\
              Host: gw\r\nConnection: Upgrade\r\nUpgrade: spdy/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
            )
            .await;
        let (head, mut rest) = read_head(&mut tls).await;
        assert!(head.starts_with("HTTP/1.1 101 "), "{driver}: {head}");
        assert!(head.contains("Upgrade: spdy/3.1\r\n"), "{driver}: {head}");
        // The member's last bytes, then its end of stream (the client's read ends).
        tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut rest))
            .await
            .expect("end of stream from the member")
            .ok();
        assert_eq!(rest, b"member-first:last", "{driver}");
        // The other direction is still open.
        tls.write_all(b"after-half-close").await.unwrap();
        tls.shutdown().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let seen = upstream.requests();
            if let Some(after) = seen.iter().find(|r| r.head == "after-close") {
                assert_eq!(after.body, b"after-half-close", "{driver}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{driver}: the member never saw the client's bytes after its half-close"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_the_member_does_not_switch_is_relayed_and_closes() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        // The recording member answers this path with an ordinary 200.
        let mut tls = gw
            .tls_sent(
                b"GET /clusters/member/api/v1/namespaces/a/pods/p/exec HTTP/1.1\r\nHost: gw\r\n\
              Connection: Upgrade\r\nUpgrade: WebSocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
            )
            .await;
        let mut carry = Vec::new();
        let response = read_response(&mut tls, &mut carry).await.unwrap();
        assert_eq!(response.code, 200, "{driver}");
        assert_eq!(
            response.header("connection").as_deref(),
            Some("close"),
            "{driver}"
        );
        let echo = response.json();
        let head = echo["head"].as_str().unwrap();
        assert!(
            head.contains("Upgrade: WebSocket\r\n") && head.contains("Connection: Upgrade\r\n"),
            "{driver}: {head}"
        );
        // The client connection ends after the answer.
        let mut more = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut more))
            .await
            .expect("the gateway closed the connection")
            .ok();
        assert!(carry.is_empty() && more.is_empty(), "{driver}");
        // An upgrade with a body is refused before anything reaches the member.
        let before = upstream.requests().len();
        let refused = support::exchange(
            gw.tls().await,
            b"POST /clusters/member/api/v1/namespaces/a/pods/p/exec HTTP/1.1\r\nHost: gw\r\n\
              Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 3\r\n\r\nabc",
        )
        .await
        .unwrap();
        assert_eq!(refused.code, 400, "{driver}");
        assert_eq!(refused.json()["kind"], "Status", "{driver}");
        assert_eq!(upstream.requests().len(), before, "{driver}");
        // An upgrade to a member that cannot be reached: a Status, then the connection closes
        // (bytes of the new protocol may follow the head).
        let mut tls = gw
            .tls_sent(
                b"POST /clusters/stopped/api/v1/namespaces/a/pods/p/exec HTTP/1.1\r\nHost: gw\r\n\
              Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            )
            .await;
        let mut carry = Vec::new();
        let unreachable = read_response(&mut tls, &mut carry).await.unwrap();
        assert_eq!(unreachable.code, 503, "{driver}");
        assert_eq!(unreachable.json()["kind"], "Status", "{driver}");
        let mut more = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut more))
            .await
            .expect("the gateway closed the connection")
            .ok();
        assert!(
            carry.is_empty() && more.is_empty(),
            "{driver}: bytes after a failed upgrade were read as a request"
        );
    }
}
