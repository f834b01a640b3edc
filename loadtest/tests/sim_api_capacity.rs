//! Many watches on one member: every one of them receives a change, and the member's memory per
//! open watch stays small. Bounded: `SIM_CAPACITY_WATCHES` watches (default 2000) multiplexed
//! over a few h2 connections, a 60 s deadline. The lead's release-mode figures use 10000.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::raw;
use common::TestFleet;
use http_body_util::BodyExt;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[test]
fn thousands_of_watches_each_see_a_change() {
    let watches: usize = std::env::var("SIM_CAPACITY_WATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        let connections = 8;
        let mut senders = Vec::new();
        for _ in 0..connections {
            let tls = raw::connect(addr, &ca, true).await;
            let (sender, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .max_concurrent_reset_streams(0)
                .handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("h2 handshake");
            tokio::spawn(conn);
            senders.push(sender);
        }
        let rv = fleet_rv(&addr, &ca, &token).await;
        let rss_before = rss_kib();
        let mut bodies = Vec::with_capacity(watches);
        for i in 0..watches {
            let sender = &mut senders[i % connections];
            let url = format!(
                "https://{addr}/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"
            );
            let req = raw::h2_get(url, &token);
            let resp = sender.send_request(req).await.expect("watch");
            assert_eq!(resp.status(), 200);
            bodies.push(resp.into_body());
        }
        let rss_open = rss_kib();
        let create = raw::post_json(
            "/api/v1/namespaces/default/configmaps",
            &token,
            Bytes::from_static(
                br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"broadcast"},"data":{"k":"v"}}"#,
            ),
        );
        let (parts, _) = raw::request(addr, &ca, create).await;
        assert_eq!(parts.status, 201);
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(watches);
        for mut body in bodies {
            tasks.push(tokio::spawn(async move {
                let left = deadline.saturating_duration_since(Instant::now());
                let frame = tokio::time::timeout(left, body.frame()).await;
                matches!(frame, Ok(Some(Ok(f))) if f.data_ref().is_some_and(|d| d.windows(9).any(|w| w == b"broadcast")))
            }));
        }
        let mut received = 0;
        for task in tasks {
            if task.await.unwrap_or(false) {
                received += 1;
            }
        }
        let fan_out = started.elapsed();
        let per_watch = (rss_open.saturating_sub(rss_before) * 1024) / watches as u64;
        eprintln!(
            "{watches} watches: all received in {fan_out:?}; RSS +{} KiB while open (~{per_watch} B per watch, client and server in one process)",
            rss_open.saturating_sub(rss_before)
        );
        assert_eq!(received, watches, "every watch sees the change");
    });
}

async fn fleet_rv(addr: &std::net::SocketAddr, ca: &str, token: &str) -> String {
    let (parts, body) = raw::request(
        *addr,
        ca,
        raw::get("/api/v1/namespaces/default/configmaps", token),
    )
    .await;
    assert_eq!(parts.status, 200);
    let list: serde_json::Value = serde_json::from_slice(&body).expect("list");
    list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string()
}
