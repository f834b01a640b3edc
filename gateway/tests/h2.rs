//! Socket-level tests of h2 clients (ALPN `h2` on the TLS listener) against a recording member,
//! each run under both monoio drivers: requests and bodies proxied with the gateway's identity,
//! watch events delivered at once and a reset watch releasing its member stream, 1000 concurrent
//! streams on one connection, a stalled reader not growing gateway memory while other streams on
//! the same connection keep flowing, client impersonation and CONNECT refused with a Status,
//! and an RFC 8441 WebSocket (extended CONNECT) carried to the member as an HTTP/1.1 upgrade.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use support::{
    h2_answer, h2_client, h2_get, h2_request, h2_send_get, read_h2_body, setup,
    setup_with_connect_timeout, DRIVERS,
};

/// `GET {path}` on `client`: the status and the whole body.
async fn get(client: &SendRequest<Bytes>, path: &str) -> (u16, Vec<u8>) {
    h2_answer(h2_get(client, path).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_requests_bodies_and_watches_are_proxied() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let client = h2_client(&gw).await;
        let (code, body) = get(&client, "/clusters/member/api/v1/pods?limit=1").await;
        assert_eq!(code, 200, "{driver}");
        let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let head = echo["head"].as_str().unwrap();
        assert!(
            head.starts_with("GET /prefix/api/v1/pods?limit=1 HTTP/1.1\r\n"),
            "{driver}: {head}"
        );
        assert!(
            head.contains("Impersonate-User: alice\r\n"),
            "{driver}: {head}"
        );

        // A body without a length goes to the member chunked; one with a length as it is.
        let mut sender = client.clone().ready().await.unwrap();
        let (response, mut stream) = sender
            .send_request(
                h2_request("POST", "/clusters/member/api/v1/namespaces/n/configmaps"),
                false,
            )
            .unwrap();
        stream
            .send_data(Bytes::from_static(b"{\"a\":"), false)
            .unwrap();
        stream.send_data(Bytes::from_static(b"1}"), true).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 200, "{driver}");
        let echo: serde_json::Value =
            serde_json::from_slice(&read_h2_body(response.into_body()).await).unwrap();
        assert_eq!(
            echo["body"], "5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n",
            "{driver}"
        );

        // Health and errors.
        assert_eq!(
            get(&client, "/healthz").await,
            (200, b"ok".to_vec()),
            "{driver}"
        );
        let (code, body) = get(&client, "/clusters/nope/api").await;
        assert_eq!(code, 404, "{driver}");
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status", "{driver}");
        assert_eq!(status["reason"], "NotFound", "{driver}");

        // A watch: each event arrives at once; resetting the stream frees the member stream.
        let response = h2_get(&client, "/clusters/member/api/v1/configmaps?watch=true").await;
        assert_eq!(response.status(), 200, "{driver}");
        let mut body = response.into_body();
        upstream
            .wait_watchers(1, &format!("{driver}: watch never reached the member"))
            .await;
        for i in 0..3 {
            let sent = Instant::now();
            upstream.emit(&format!("{{\"type\":\"ADDED\",\"n\":{i}}}"));
            let data = tokio::time::timeout(Duration::from_secs(5), body.data())
                .await
                .expect("event in time")
                .unwrap()
                .unwrap();
            let _ = body.flow_control().release_capacity(data.len());
            assert_eq!(
                &data[..],
                format!("{{\"type\":\"ADDED\",\"n\":{i}}}\n").as_bytes()
            );
            assert!(
                sent.elapsed() < Duration::from_secs(1),
                "{driver}: event late"
            );
        }
        drop(body); // resets the stream (RST_STREAM CANCEL)
        upstream
            .wait_watchers(
                0,
                &format!("{driver}: the member watch outlived the reset stream"),
            )
            .await;
        // The connection still serves.
        assert_eq!(
            get(&client, "/clusters/member/api").await.0,
            200,
            "{driver}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_streams_on_one_connection_are_all_answered() {
    for driver in DRIVERS {
        // Each stream dials its own member connection at once.
        let (_upstream, gw) = setup_with_connect_timeout(driver, "10").await;
        let client = h2_client(&gw).await;
        // All 1000 are opened before any answer is read.
        let mut pending = Vec::new();
        for i in 0..1000 {
            let path = format!("/clusters/member/late-watch?watch=true&i={i}");
            pending.push(h2_send_get(&client, &path).await);
        }
        let started = Instant::now();
        let mut answered = 0;
        for response in pending {
            let response = tokio::time::timeout(Duration::from_secs(20), response)
                .await
                .unwrap_or_else(|_| panic!("{driver}: stream {answered} unanswered: {}", gw.log()))
                .expect("response");
            assert_eq!(
                h2_answer(response).await,
                (200, b"late".to_vec()),
                "{driver}"
            );
            answered += 1;
        }
        assert_eq!(answered, 1000);
        // The member holds each answer 1.5 s: concurrent streams finish in a few of those, not
        // 1000 of them.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{driver}: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_h2_reader_does_not_grow_gateway_memory_or_stall_other_streams() {
    for driver in DRIVERS {
        let (_upstream, gw) = setup(driver).await;
        let client = h2_client(&gw).await;
        assert_eq!(
            get(&client, "/clusters/member/big?bytes=1048576")
                .await
                .1
                .len(),
            1 << 20
        );
        let before = gw.rss_kib();
        // 200 MB asked for, never read: only the flow-control window may leave the member.
        let stalled = h2_get(&client, "/clusters/member/big?bytes=209715200").await;
        assert_eq!(stalled.status(), 200);
        for _ in 0..20 {
            // Other streams on the same connection keep flowing meanwhile.
            assert_eq!(
                get(&client, "/clusters/member/api").await.0,
                200,
                "{driver}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let growth_kib = gw.rss_kib().saturating_sub(before);
        assert!(
            growth_kib < 16 * 1024,
            "{driver}: gateway RSS grew by {growth_kib} KiB behind a stalled reader"
        );
        drop(stalled);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_and_connect_over_h2_are_refused_with_a_status() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let client = h2_client(&gw).await;
        // Client impersonation headers are refused on h2 as on HTTP/1.1.
        let mut sender = client.clone().ready().await.unwrap();
        let mut impersonating = h2_request("GET", "/clusters/member/api");
        impersonating
            .headers_mut()
            .insert("impersonate-user", "root".parse().unwrap());
        let (response, _) = sender.send_request(impersonating, true).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 403, "{driver}");
        let status: serde_json::Value =
            serde_json::from_slice(&read_h2_body(response.into_body()).await).unwrap();
        assert_eq!(status["reason"], "Forbidden", "{driver}");
        // exec / attach / port-forward cannot ride h2: a CONNECT gets a Status, not a tunnel.
        let mut sender = client.clone().ready().await.unwrap();
        let connect = http::Request::builder()
            .method("CONNECT")
            .uri("gw:443")
            .body(())
            .unwrap();
        let (response, _) = sender.send_request(connect, false).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 501, "{driver}");
        let status: serde_json::Value =
            serde_json::from_slice(&read_h2_body(response.into_body()).await).unwrap();
        assert_eq!(status["kind"], "Status", "{driver}");
        assert!(
            status["message"].as_str().unwrap().contains("HTTP/1.1"),
            "{driver}: {status}"
        );
        assert!(
            upstream.requests().is_empty(),
            "{driver}: a refused request reached the member"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_h2_extended_connect_is_an_upgrade_to_the_member() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let client = h2_client(&gw).await;
        // The gateway's SETTINGS offer RFC 8441 (SETTINGS_ENABLE_CONNECT_PROTOCOL).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut sender = client.clone().ready().await.unwrap();
        while !sender.is_extended_connect_protocol_enabled() {
            assert!(Instant::now() < deadline, "{driver}: no extended CONNECT");
            tokio::time::sleep(Duration::from_millis(10)).await;
            sender = client.clone().ready().await.unwrap();
        }
        let connect = |path: &str, protocol: &'static str| {
            let mut request = http::Request::builder()
                .method("CONNECT")
                .uri(format!("https://gw{path}"))
                .header("sec-websocket-protocol", "v5.channel.k8s.io")
                .header("sec-websocket-version", "13")
                .body(())
                .unwrap();
            request
                .extensions_mut()
                .insert(h2::ext::Protocol::from_static(protocol));
            request
        };
        let (response, mut stream) = sender
            .send_request(connect("/clusters/member/echo-upgrade", "websocket"), false)
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("answer in time")
            .unwrap();
        assert_eq!(response.status(), 200, "{driver}");
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "v5.channel.k8s.io",
            "{driver}"
        );
        assert!(
            !response.headers().contains_key("sec-websocket-accept"),
            "{driver}"
        );
        let mut body = response.into_body();
        let mut received = Vec::new();
        let read_until = async |body: &mut h2::RecvStream, received: &mut Vec<u8>, want: &[u8]| {
            while !received.ends_with(want) {
                let data = tokio::time::timeout(Duration::from_secs(5), body.data())
                    .await
                    .expect("data in time")
                    .expect("stream open")
                    .expect("data");
                let _ = body.flow_control().release_capacity(data.len());
                received.extend_from_slice(&data);
            }
        };
        read_until(&mut body, &mut received, b"member-first:").await;
        stream
            .send_data(Bytes::from_static(b"hello"), false)
            .unwrap();
        read_until(&mut body, &mut received, b"hello").await;
        // The client's END_STREAM reaches the member as a half-close; its last bytes still come.
        stream.send_data(Bytes::new(), true).unwrap();
        read_until(&mut body, &mut received, b"bye").await;
        assert_eq!(received, b"member-first:hellobye", "{driver}");
        // Then the stream ends (END_STREAM) with nothing more.
        let rest = tokio::time::timeout(Duration::from_secs(5), read_h2_body(body))
            .await
            .expect("end in time");
        assert!(rest.is_empty(), "{driver}: {rest:?}");

        let head = upstream
            .requests()
            .into_iter()
            .find(|r| r.head.contains("echo-upgrade"))
            .expect("the member got the upgrade")
            .head;
        assert!(
            head.starts_with("GET /prefix/echo-upgrade HTTP/1.1\r\n"),
            "{driver}: {head}"
        );
        for field in [
            "Connection: Upgrade\r\n",
            "Upgrade: websocket\r\n",
            "Sec-WebSocket-Key: ",
            "sec-websocket-version: 13\r\n",
            "Impersonate-User: alice\r\n",
        ] {
            assert!(
                head.to_ascii_lowercase()
                    .contains(&field.to_ascii_lowercase()),
                "{driver}: {field:?} missing in {head}"
            );
        }

        // A member that answers without switching is not a WebSocket: a 502 Status, not a 200.
        let mut sender = client.clone().ready().await.unwrap();
        let (response, _) = sender
            .send_request(connect("/clusters/member/api", "websocket"), false)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 502, "{driver}");
        let status: serde_json::Value =
            serde_json::from_slice(&read_h2_body(response.into_body()).await).unwrap();
        assert_eq!(status["kind"], "Status", "{driver}");

        // Any other protocol still needs HTTP/1.1.
        let mut sender = client.clone().ready().await.unwrap();
        let (response, _) = sender
            .send_request(connect("/clusters/member/echo-upgrade", "SPDY/3.1"), false)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 501, "{driver}");
    }
}
