//! Socket-level tests of `fleetgate serve` against a recording member, each run under both monoio
//! drivers (epoll and io_uring): routing and header rewriting, Status errors, keep-alive and
//! pipelining, the smuggling corpus, streaming (watch latency, big bodies in constant memory),
//! client certificates and metrics.

mod support;

use std::time::{Duration, Instant};

use support::{exchange, read_response, setup, DRIVERS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gw\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_form_reaches_the_member_with_the_gateway_identity() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for path in [
            "/clusters/member/api/v1/namespaces/a%3Ab/pods?labelSelector=x%3Dy&limit=5",
            "/apis/cluster.karmada.io/v1alpha1/clusters/member/proxy/api/v1/namespaces/a%3Ab/pods?labelSelector=x%3Dy&limit=5",
            "/apis/cluster.karpor.io/v1beta1/clusters/member/proxy/api/v1/namespaces/a%3Ab/pods?labelSelector=x%3Dy&limit=5",
            "/member/api/v1/namespaces/a%3Ab/pods?labelSelector=x%3Dy&limit=5",
        ] {
            let request = get(
                path,
                "Authorization: Bearer client-secret\r\nX-Forwarded-For: 10.1.2.3\r\nConnection: X-Drop-Me\r\nX-Drop-Me: 1\r\nTE: trailers\r\nAccept: application/json\r\n",
            );
            let response = exchange(gw.tls().await, &request).await.expect("a response");
            assert_eq!(response.code, 200, "{driver} {path}: {response:?}");
            let echo = response.json();
            let head = echo["head"].as_str().unwrap();
            assert!(
                head.starts_with("GET /prefix/api/v1/namespaces/a%3Ab/pods?labelSelector=x%3Dy&limit=5 HTTP/1.1\r\n"),
                "{driver}: {head}"
            );
            let upstream_host = format!("Host: {}\r\n", upstream.address);
            for expected in [
                upstream_host.as_str(),
                "Authorization: Bearer gateway-token\r\n",
                "Impersonate-User: alice\r\n",
                "Impersonate-Group: devs\r\n",
                "X-Forwarded-For: 10.1.2.3, 127.0.0.1\r\n",
                "Accept: application/json\r\n",
            ] {
                assert!(head.contains(expected), "{driver}: {expected:?} missing in {head}");
            }
            for absent in ["client-secret", "X-Drop-Me", "TE:", "Connection:", "Host: gw"] {
                assert!(!head.contains(absent), "{driver}: {absent:?} forwarded in {head}");
            }
            assert_eq!(response.header("x-upstream").as_deref(), Some("yes"));
            assert_eq!(response.header("keep-alive"), None, "hop-by-hop header relayed");
        }
        // The plaintext listener acts as the anonymous user, never as the gateway itself.
        let response = exchange(gw.plain().await, &get("/clusters/member/version", ""))
            .await
            .unwrap();
        let head = response.json()["head"].as_str().unwrap().to_string();
        assert!(
            head.contains("Impersonate-User: system:anonymous\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Impersonate-Group: system:unauthenticated\r\n"),
            "{head}"
        );
        // Health on the main listener.
        let health = exchange(gw.tls().await, &get("/healthz", ""))
            .await
            .unwrap();
        assert_eq!((health.code, health.body.as_slice()), (200, &b"ok"[..]));
    }
}

fn status_of(response: &support::Response) -> (u16, String, String) {
    let status = response.json();
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["code"], response.code, "{status}");
    (
        response.code,
        status["reason"].as_str().unwrap().to_string(),
        status["message"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_clear_statuses_and_other_members_keep_working() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let ask = |path: &'static str, extra: &'static str| {
            let gw = &gw;
            async move { exchange(gw.tls().await, &get(path, extra)).await.unwrap() }
        };
        let (code, reason, message) = status_of(&ask("/clusters/nope/api/v1/pods", "").await);
        assert_eq!((code, reason.as_str()), (404, "NotFound"));
        assert!(message.contains("\"nope\""), "{message}");
        let (code, reason, message) = status_of(&ask("/clusters/stopped/api", "").await);
        assert_eq!(
            (code, reason.as_str()),
            (503, "ServiceUnavailable"),
            "{message}"
        );
        assert!(message.contains("stopped"), "{message}");
        let started = Instant::now();
        let (code, _, message) = status_of(&ask("/clusters/stalled/api", "").await);
        assert_eq!(code, 503, "{message}");
        assert!(message.contains("timed out"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let (code, reason, _) = status_of(&ask("/clusters/member/slow", "").await);
        assert_eq!((code, reason.as_str()), (504, "Timeout"));
        let (code, _, _) = status_of(&ask("/clusters/member/drop", "").await);
        assert_eq!(code, 502);
        let (code, reason, _) =
            status_of(&ask("/clusters/member/api", "Impersonate-User: root\r\n").await);
        assert_eq!((code, reason.as_str()), (403, "Forbidden"));
        let (code, _, message) = status_of(
            &ask(
                "/clusters/member/api/v1/namespaces/a/pods/p/exec",
                "Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n",
            )
            .await,
        );
        // The gateway carries SPDY/3.1 and WebSocket upgrades only.
        assert_eq!(code, 501, "{message}");
        assert!(message.contains("h2c"), "{message}");
        // A long-running request is not cut by the 0.5 s response-head timeout.
        let late = ask("/clusters/member/late-watch?watch=true", "").await;
        assert_eq!((late.code, late.body.as_slice()), (200, &b"late"[..]));
        // A close-delimited member response is relayed and ends the client connection.
        let closed = ask("/clusters/member/closed", "").await;
        assert_eq!(
            (closed.code, closed.body.as_slice()),
            (200, &b"until close"[..])
        );
        // The healthy member still answers after all of that.
        assert_eq!(ask("/clusters/member/api", "").await.code, 200);
        let forwarded = upstream.requests();
        assert!(
            forwarded.iter().all(|r| !r.head.contains("/exec")),
            "upgrade was forwarded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_and_pipelined_requests_are_answered_in_order_on_one_upstream_connection() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let mut tls = gw.tls().await;
        let mut pipeline = Vec::new();
        for i in 0..5 {
            pipeline.extend_from_slice(
                format!("POST /clusters/member/api/v1/namespaces/n/configmaps?i={i} HTTP/1.1\r\nHost: gw\r\nContent-Length: 7\r\n\r\nbody-{i}\n")
                    .as_bytes(),
            );
        }
        pipeline.extend_from_slice(b"GET /clusters/member/last HTTP/1.1\r\nHost: gw\r\n\r\n");
        tls.write_all(&pipeline).await.unwrap();
        let mut carry = Vec::new();
        for i in 0..5 {
            let response = read_response(&mut tls, &mut carry).await.unwrap();
            let echo = response.json();
            assert!(
                echo["head"].as_str().unwrap().contains(&format!("?i={i} ")),
                "{driver}: out of order: {echo}"
            );
            assert_eq!(echo["body"], format!("body-{i}\n"));
        }
        let last = read_response(&mut tls, &mut carry).await.unwrap();
        assert!(last.json()["head"]
            .as_str()
            .unwrap()
            .starts_with("GET /prefix/last "));
        // Later requests on the same client connection reuse the pooled member connection.
        for _ in 0..3 {
            tls.write_all(b"GET /clusters/member/again HTTP/1.1\r\nHost: gw\r\n\r\n")
                .await
                .unwrap();
            assert_eq!(read_response(&mut tls, &mut carry).await.unwrap().code, 200);
        }
        assert_eq!(
            upstream
                .connections
                .load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{driver}: the member connection was not reused"
        );
    }
}

/// Requests every strict HTTP/1.1 server must refuse, and proxies must never pass on.
const SMUGGLING_CORPUS: &[(&str, &[u8])] = &[
    ("CL and TE", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("TE and CL", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n"),
    ("duplicate CL", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde"),
    ("same CL twice", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd"),
    ("CL list", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 4, 4\r\n\r\nabcd"),
    ("negative CL", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: -4\r\n\r\nabcd"),
    ("hex CL", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 0x4\r\n\r\nabcd"),
    ("TE gzip", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\n\r\nabcd"),
    ("TE chunked not last", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
    ("TE twice", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("TE with space in name", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"),
    ("TE obs-fold", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
    ("TE in HTTP/1.0", b"POST /clusters/member/x HTTP/1.0\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("bad chunk size", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabcd\r\n0\r\n\r\n"),
    ("chunk size overflow", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000001\r\na\r\n0\r\n\r\n"),
    ("chunk bare LF", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n4\nabcd\r\n0\r\n\r\n"),
    ("chunk data too long", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n"),
    ("chunk ext control char", b"POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n4;a\x00b\r\nabcd\r\n0\r\n\r\n"),
    ("obs-fold", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\n 2\r\n\r\n"),
    ("bare LF head", b"GET /clusters/member/x HTTP/1.1\nHost: gw\n\n"),
    ("bare CR", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\rX-A: 1\r\n\r\n"),
    ("space in name", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nX A: 1\r\n\r\n"),
    ("NUL in value", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nX-A: a\x00b\r\n\r\n"),
    ("no Host", b"GET /clusters/member/x HTTP/1.1\r\n\r\n"),
    ("two Hosts", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nHost: evil\r\n\r\n"),
    ("absolute form", b"GET http://evil/clusters/member/x HTTP/1.1\r\nHost: gw\r\n\r\n"),
    ("asterisk form", b"OPTIONS * HTTP/1.1\r\nHost: gw\r\n\r\n"),
    ("bad version", b"GET /clusters/member/x HTTP/1.2\r\nHost: gw\r\n\r\n"),
    ("bad method", b"G(T /clusters/member/x HTTP/1.1\r\nHost: gw\r\n\r\n"),
    ("head too large", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nX-Big: @BIG@\r\n\r\n"),
    ("too many headers", b"GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\n@MANY@\r\n"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_smuggling_requests_are_refused_and_never_forwarded() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for (name, raw) in SMUGGLING_CORPUS {
            let raw = String::from_utf8_lossy(raw)
                .replace("@BIG@", &"a".repeat(9000))
                .replace(
                    "@MANY@",
                    &(0..40).map(|i| format!("X-{i}: v\r\n")).collect::<String>(),
                );
            // Each attack is followed by an innocent request on the same connection: it must
            // never be answered (the connection is closed after the refusal).
            let mut bytes = raw.into_bytes();
            bytes.extend_from_slice(b"GET /clusters/member/smuggled HTTP/1.1\r\nHost: gw\r\n\r\n");
            let mut stream = gw.plain().await;
            stream.write_all(&bytes).await.unwrap();
            let mut carry = Vec::new();
            let response = read_response(&mut stream, &mut carry)
                .await
                .unwrap_or_else(|| panic!("{driver} {name}: no answer"));
            assert!(
                (400..500).contains(&response.code) || response.code == 505,
                "{driver} {name}: got {}",
                response.code
            );
            assert_eq!(response.json()["kind"], "Status", "{driver} {name}");
            let mut rest = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
            assert!(
                rest.is_empty() && carry.is_empty(),
                "{driver} {name}: more was answered: {:?}",
                String::from_utf8_lossy(&rest)
            );
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: forwarded {seen:?}");
        // The gateway still serves.
        let ok = exchange(gw.plain().await, &get("/clusters/member/ok", ""))
            .await
            .unwrap();
        assert_eq!(ok.code, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_reach_the_client_at_once_and_a_closed_client_frees_the_member_stream() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let mut tls = gw
            .tls_get("/clusters/member/api/v1/configmaps?watch=true")
            .await;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tls.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200 OK\r\n"));
        for i in 0..5 {
            let event = format!("{{\"type\":\"MODIFIED\",\"object\":{{\"n\":{i}}}}}");
            let sent = Instant::now();
            upstream.emit(&event);
            let mut got = Vec::new();
            while !String::from_utf8_lossy(&got).contains(&event) {
                let n = tokio::time::timeout(Duration::from_secs(2), tls.read(&mut chunk))
                    .await
                    .expect("event not delivered")
                    .unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            let latency = sent.elapsed();
            assert!(
                latency < Duration::from_millis(100),
                "{driver}: event took {latency:?}"
            );
        }
        assert_eq!(upstream.watchers(), 1);
        drop(tls);
        let deadline = Instant::now() + Duration::from_secs(5);
        while upstream.watchers() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            upstream.watchers(),
            0,
            "{driver}: the member stream outlived the client"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_list_streams_through_in_constant_memory() {
    for driver in DRIVERS {
        let (_upstream, gw) = setup(driver).await;
        // Warm up the shards' buffers and TLS state so the measurement is of the body alone.
        let warm = exchange(
            gw.tls().await,
            &get("/clusters/member/big?bytes=1048576", ""),
        )
        .await
        .unwrap();
        assert_eq!(warm.body.len(), 1 << 20);
        let before = gw.rss_kib();
        let total: usize = 200 * 1024 * 1024;
        let mut tls = gw.tls().await;
        tls.write_all(&get(&format!("/clusters/member/big?bytes={total}"), ""))
            .await
            .unwrap();
        // Count body bytes without keeping them (the chunk framing is passed through).
        let mut received = 0usize;
        let mut peak = before;
        let mut chunk = vec![0u8; 256 * 1024];
        let started = Instant::now();
        loop {
            let n = tls.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            received += n;
            if received % (16 << 20) < n {
                peak = peak.max(gw.rss_kib());
            }
            assert!(started.elapsed() < Duration::from_secs(300), "too slow");
        }
        peak = peak.max(gw.rss_kib());
        assert!(received > total, "{driver}: only {received} bytes");
        let growth_kib = peak.saturating_sub(before);
        assert!(
            growth_kib < 16 * 1024,
            "{driver}: gateway RSS grew by {growth_kib} KiB during a 200 MB response"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_certificate_are_refused_and_metrics_count_requests() {
    for driver in DRIVERS {
        let (_upstream, gw) = setup(driver).await;
        let tcp = tokio::net::TcpStream::connect(gw.https).await.unwrap();
        let anonymous = tokio_rustls::TlsConnector::from(gw.pki.client_config(false))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await;
        // TLS 1.3 reports the refusal on the first read after the handshake.
        let refused = match anonymous {
            Err(_) => true,
            Ok(stream) => exchange(stream, &get("/clusters/member/api", ""))
                .await
                .is_none(),
        };
        assert!(
            refused,
            "{driver}: a client without a certificate was served"
        );

        for _ in 0..3 {
            let r = exchange(gw.tls().await, &get("/clusters/member/api/v1/pods", "")).await;
            assert_eq!(r.unwrap().code, 200);
        }
        let _ = exchange(gw.tls().await, &get("/clusters/stopped/api/v1/pods", "")).await;
        // The gauges settle just after the client has its response: scrape until they do.
        let mut text = String::new();
        for _ in 0..100 {
            let metrics = exchange(
                tokio::net::TcpStream::connect(gw.admin).await.unwrap(),
                b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n",
            )
            .await
            .unwrap();
            text = String::from_utf8(metrics.body).unwrap();
            if text.contains("fleetgate_open_streams 0") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            text.contains(
                "fleetgate_requests_total{cluster=\"member\",verb=\"list\",code=\"200\"} 3"
            ),
            "{driver}: {text}"
        );
        assert!(
            text.contains(
                "fleetgate_requests_total{cluster=\"stopped\",verb=\"list\",code=\"503\"} 1"
            ),
            "{driver}: {text}"
        );
        assert!(text.contains("fleetgate_upstream_connections{cluster=\"member\"}"));
        assert!(text.contains("fleetgate_open_streams 0"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_pass_through_as_framed_and_special_requests_are_handled() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        // A chunked body reaches the member with its framing untouched (extensions included),
        // and the gateway answers `Expect: 100-continue` itself.
        let chunked = b"3;note=\"a b\"\r\nabc\r\n5\r\ndefgh\r\n0\r\nX-Trailer: t\r\n\r\n";
        let mut tls = gw.tls().await;
        tls.write_all(
            b"POST /clusters/member/api/v1/namespaces/n/configmaps HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        let mut interim = vec![0u8; 25];
        tls.read_exact(&mut interim).await.unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n", "{driver}");
        tls.write_all(chunked).await.unwrap();
        let mut carry = Vec::new();
        let response = read_response(&mut tls, &mut carry).await.unwrap();
        assert_eq!(response.code, 200, "{driver}");
        let seen = upstream.requests();
        let last = seen.last().unwrap();
        assert_eq!(
            last.body,
            chunked.to_vec(),
            "{driver}: chunked framing was changed"
        );
        assert!(last.head.contains("Transfer-Encoding: chunked\r\n"));
        assert!(
            !last.head.to_ascii_lowercase().contains("expect:"),
            "{driver}: Expect forwarded"
        );

        // The gateway's own answers to HEAD have no body either: the next response follows.
        tls.write_all(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\nHEAD /clusters/nope/api HTTP/1.1\r\nHost: gw\r\n\r\nGET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        let mut heads = Vec::new();
        while heads.windows(4).filter(|w| w == b"\r\n\r\n").count() < 3 || !heads.ends_with(b"ok") {
            let mut chunk = [0u8; 1];
            tls.read_exact(&mut chunk).await.unwrap();
            heads.push(chunk[0]);
        }
        let text = String::from_utf8_lossy(&heads);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{driver}: {text}");
        assert!(
            text.contains("\r\n\r\nHTTP/1.1 404 Not Found\r\n"),
            "{driver}: {text}"
        );
        assert!(
            !text.contains("\"kind\""),
            "{driver}: a HEAD answer carried a body: {text}"
        );

        // HEAD: no body is expected even though the member announces a length.
        tls.write_all(b"HEAD /clusters/member/api HTTP/1.1\r\nHost: gw\r\n\r\nGET /clusters/member/after-head HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        let mut head_only = Vec::new();
        while !head_only.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 1];
            tls.read_exact(&mut chunk).await.unwrap();
            head_only.push(chunk[0]);
        }
        assert!(String::from_utf8_lossy(&head_only).starts_with("HTTP/1.1 200 OK"));
        let mut carry = Vec::new();
        let after = read_response(&mut tls, &mut carry).await.unwrap();
        assert!(after.json()["head"]
            .as_str()
            .unwrap()
            .starts_with("GET /prefix/after-head "));

        // An HTTP/1.0 client gets a body it can read (no chunked framing) and a close.
        let old = exchange(
            gw.plain().await,
            b"GET /clusters/member/big?bytes=70000 HTTP/1.0\r\n\r\n",
        )
        .await
        .unwrap();
        assert_eq!(old.code, 200);
        assert_eq!(old.header("transfer-encoding"), None, "{driver}");
        assert_eq!(old.body.len(), 70000, "{driver}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_member_closed_is_not_used_for_the_next_request() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let mut tls = gw.tls().await;
        let mut carry = Vec::new();
        tls.write_all(b"GET /clusters/member/close-when-idle HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_response(&mut tls, &mut carry).await.unwrap().code, 200);
        // The member closes that connection after 50 ms; the gateway's pool still holds it.
        tokio::time::sleep(Duration::from_millis(700)).await;
        // A POST with a body cannot be replayed, so it must not go out on the dead connection.
        tls.write_all(b"POST /clusters/member/api/v1/namespaces/n/configmaps HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let response = read_response(&mut tls, &mut carry).await.unwrap();
        assert_eq!(
            response.code,
            200,
            "{driver}: {:?}",
            String::from_utf8_lossy(&response.body)
        );
        assert_eq!(upstream.requests().last().unwrap().body, b"{}");
        assert_eq!(
            upstream
                .connections
                .load(std::sync::atomic::Ordering::SeqCst),
            2,
            "{driver}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_keep_alive_clients_are_all_answered() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..64 {
            let address = gw.http;
            tasks.push(tokio::spawn(async move {
                let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
                let mut carry = Vec::new();
                for i in 0..20 {
                    let request = format!(
                        "GET /clusters/member/api/v1/namespaces/c{client}/configmaps/r{i} HTTP/1.1\r\nHost: gw\r\n\r\n"
                    );
                    stream.write_all(request.as_bytes()).await.unwrap();
                    let response = read_response(&mut stream, &mut carry).await.unwrap();
                    assert_eq!(response.code, 200);
                    let head = response.json()["head"].as_str().unwrap().to_string();
                    // Every answer belongs to the request it answers.
                    assert!(head.contains(&format!("/c{client}/configmaps/r{i} ")), "{head}");
                }
            }));
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("a client hung")
                .unwrap();
        }
        assert_eq!(upstream.requests().len(), 64 * 20, "{driver}");
        // Member connections are reused across requests: at most one per concurrent client.
        let opened = upstream
            .connections
            .load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            opened <= 64,
            "{driver}: {opened} member connections for 64 clients"
        );
        assert!(started.elapsed() < Duration::from_secs(60));
    }
}
