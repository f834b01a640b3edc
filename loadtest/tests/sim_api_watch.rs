//! Watch streams and the wire details kubectl does not show, checked with a raw HTTPS client:
//! resume from a resourceVersion, 410 Expired as an ERROR event inside a 200 stream, one chunk
//! per live event, BOOKMARKs, timeoutSeconds, the apiserver's headers, 401 / 500 shapes, and h2.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::raw;
use common::TestFleet;
use fleetgate_loadtest::sim::SimTuning;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

/// Creates ConfigMap `name` in `default`, with `labels` (a JSON object), on the member at `addr`
/// as `token`'s user; the member must answer 201.
async fn create_configmap(addr: SocketAddr, ca: &str, token: &str, name: &str, labels: &str) {
    let body = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{labels}}},"data":{{"k":"v"}}}}"#
    );
    let post = raw::post_json("/api/v1/namespaces/default/configmaps", token, body);
    let (parts, _) = raw::request(addr, ca, post).await;
    assert_eq!(parts.status, 201, "creating {name}");
}

/// Reads the next body frame with a deadline.
async fn next_frame(body: &mut hyper::body::Incoming) -> Option<Bytes> {
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("a frame within 10 s")?;
    frame.ok()?.into_data().ok()
}

#[test]
fn watch_resumes_from_a_resource_version_one_chunk_per_event() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        let (parts, body) = raw::request(
            addr,
            &ca,
            raw::get("/api/v1/namespaces/default/configmaps", &token),
        )
        .await;
        assert_eq!(parts.status, 200);
        for header in [
            "audit-id",
            "cache-control",
            "x-kubernetes-pf-flowschema-uid",
        ] {
            assert!(parts.headers.contains_key(header), "missing {header}");
        }
        let list: Value = serde_json::from_slice(&body).expect("list JSON");
        assert_eq!(list["kind"], "ConfigMapList");
        let list_rv = list["metadata"]["resourceVersion"]
            .as_str()
            .expect("rv")
            .to_string();

        // Two writes after the list; a watch from the list RV replays both, in order.
        for name in ["w1", "w2"] {
            create_configmap(addr, &ca, &token, name, "{}").await;
        }
        let resp = raw::request_streaming(
            addr,
            &ca,
            raw::get(
                &format!(
                    "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={list_rv}"
                ),
                &token,
            ),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let mut body = resp.into_body();
        let mut replayed = String::new();
        while replayed.lines().count() < 2 {
            replayed.push_str(&String::from_utf8_lossy(
                &next_frame(&mut body).await.expect("event"),
            ));
        }
        let names: Vec<String> = replayed
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("event JSON"))
            .map(|e| {
                assert_eq!(e["type"], "ADDED");
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert_eq!(names, vec!["w1", "w2"]);

        // A live change arrives as exactly one chunk holding one event.
        create_configmap(addr, &ca, &token, "w3", "{}").await;
        let chunk = next_frame(&mut body).await.expect("live event");
        let text = String::from_utf8_lossy(&chunk);
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text:?}"
        );
        let event: Value = serde_json::from_str(text.trim()).expect("event");
        assert_eq!(event["object"]["metadata"]["name"], "w3");
        assert_eq!(event["object"]["kind"], "ConfigMap");
    });
}

#[test]
fn too_old_resource_version_is_an_error_event_in_a_200_stream() {
    let tuning = SimTuning {
        history_window: 5,
        ..SimTuning::default()
    };
    let fleet = TestFleet::start_with(1, 0, 0.0, tuning);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        for i in 0..12 {
            create_configmap(addr, &ca, &token, &format!("churn-{i}"), "{}").await;
        }
        let (parts, body) = raw::request(
            addr,
            &ca,
            raw::get(
                "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=2",
                &token,
            ),
        )
        .await;
        assert_eq!(parts.status, 200, "410 travels inside a 200 stream");
        let text = String::from_utf8_lossy(&body);
        let event: Value =
            serde_json::from_str(text.trim()).expect("one ERROR event, then the end");
        assert_eq!(event["type"], "ERROR");
        assert_eq!(event["object"]["code"], 410);
        assert_eq!(event["object"]["reason"], "Expired");
        assert!(event["object"]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("too old resource version: 2 ("));

        // An unparseable resourceVersion is a 500, as recorded.
        let (parts, _) = raw::request(
            addr,
            &ca,
            raw::get(
                "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=abc",
                &token,
            ),
        )
        .await;
        assert_eq!(parts.status, 500);
    });
}

#[test]
fn bookmarks_and_timeout_end_the_stream() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        let rv = fleet.handle().member(0).expect("member").store.current_rv();
        let started = std::time::Instant::now();
        let resp = raw::request_streaming(
            addr,
            &ca,
            raw::get(
                &format!(
                    "/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&labelSelector=app%3Dno-match&resourceVersion={rv}&timeoutSeconds=3"
                ),
                &token,
            ),
        )
        .await;
        // A change the selector filters out moves the RV: a BOOKMARK reports it before the end.
        create_configmap(addr, &ca, &token, "unrelated", "{}").await;
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("the stream ends at timeoutSeconds")
            .expect("body")
            .to_bytes();
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(2500) && elapsed < Duration::from_secs(8), "{elapsed:?}");
        let text = String::from_utf8_lossy(&body);
        let event: Value = serde_json::from_str(text.trim()).expect("one BOOKMARK");
        assert_eq!(event["type"], "BOOKMARK");
        assert_eq!(event["object"]["kind"], "ConfigMap");
        let bookmark_rv: u64 = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("rv");
        assert!(bookmark_rv > rv);
    });
}

#[test]
fn identity_errors_have_the_recorded_shapes() {
    let fleet = TestFleet::start(1);
    let addr = fleet.handle().member_addrs()[0];
    let ca = fleet.fleet_ca_pem();
    let admin = fleet.token("admin");
    fleet.runtime.block_on(async {
        // No credential: 401 Status, no APF headers.
        let req = http::Request::get("/api/v1/namespaces/default/configmaps")
            .header("host", "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let (parts, body) = raw::request(addr, &ca, req).await;
        assert_eq!(parts.status, 401);
        assert!(!parts.headers.contains_key("x-kubernetes-pf-flowschema-uid"));
        let status: Value = serde_json::from_slice(&body).expect("Status");
        assert_eq!(status["reason"], "Unauthorized");

        // Health and /version are public; everything else needs a credential.
        for (path, code) in [
            ("/healthz", 200),
            ("/readyz", 200),
            ("/livez", 200),
            ("/version", 200),
            ("/api", 401),
        ] {
            let req = http::Request::get(path)
                .header("host", "127.0.0.1")
                .body(Full::new(Bytes::new()))
                .expect("request");
            let (parts, _) = raw::request(addr, &ca, req).await;
            assert_eq!(parts.status.as_u16(), code, "{path}");
        }

        // Impersonate-Group without Impersonate-User: a text 500.
        let req = http::Request::get("/api/v1/namespaces/default/configmaps")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {admin}"))
            .header("impersonate-group", "devs")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let (parts, body) = raw::request(addr, &ca, req).await;
        assert_eq!(parts.status, 500);
        assert_eq!(parts.headers["content-type"], "text/plain; charset=utf-8");
        assert!(String::from_utf8_lossy(&body).contains("without impersonating a user"));

        // Impersonation with uid and extra reaches selfsubjectreviews.
        let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {admin}"))
            .header("impersonate-user", "carol")
            .header("impersonate-group", "ops")
            .header("impersonate-uid", "carol-uid")
            .header("impersonate-extra-scopes", "view")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
            )))
            .expect("request");
        let (parts, body) = raw::request(addr, &ca, req).await;
        assert_eq!(parts.status, 201);
        let review: Value = serde_json::from_slice(&body).expect("review");
        let info = &review["status"]["userInfo"];
        assert_eq!(info["username"], "carol");
        assert_eq!(info["uid"], "carol-uid");
        assert_eq!(info["extra"]["scopes"][0], "view");
        assert_eq!(
            info["groups"],
            serde_json::json!(["ops", "system:authenticated"])
        );

        // Unknown group: plain-text 404; unknown resource in a known group: JSON Status 404.
        let (parts, body) = raw::request(
            addr,
            &ca,
            raw::get("/apis/nosuch.example.com/v1/widgets", &admin),
        )
        .await;
        assert_eq!(parts.status, 404);
        assert_eq!(&body[..], b"404 page not found\n");
        let (parts, body) = raw::request(
            addr,
            &ca,
            raw::get("/api/v1/namespaces/default/nosuchresources", &admin),
        )
        .await;
        assert_eq!(parts.status, 404);
        let status: Value = serde_json::from_slice(&body).expect("Status");
        assert_eq!(
            status["message"],
            "the server could not find the requested resource"
        );
    });
}

#[test]
fn http2_by_alpn_serves_discovery_and_watches() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        let tls = raw::connect(addr, &ca, true).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        let req = raw::h2_get(format!("https://{addr}/api"), &token);
        let resp = sender.send_request(req).await.expect("h2 request");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let doc: Value = serde_json::from_slice(&body).expect("APIVersions");
        assert_eq!(doc["kind"], "APIVersions");

        let url = format!(
            "https://{addr}/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1"
        );
        let req = raw::h2_get(url, &token);
        let resp = sender.send_request(req).await.expect("h2 watch");
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("watch ends")
            .expect("body")
            .to_bytes();
        assert!(body.is_empty() || String::from_utf8_lossy(&body).contains("ADDED"));
    });
}

fn merge_patch(name: &str, token: &str, patch: &'static str) -> http::Request<Full<Bytes>> {
    let path = format!("/api/v1/namespaces/default/configmaps/{name}");
    let merge = Some("application/merge-patch+json");
    raw::with_body(
        "PATCH",
        &path,
        token,
        merge,
        Bytes::from_static(patch.as_bytes()),
    )
}

#[test]
fn selector_watch_sees_objects_enter_and_leave() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        create_configmap(addr, &ca, &token, "mover", r#"{"team":"a"}"#).await;
        let resp = raw::request_streaming(
            addr,
            &ca,
            raw::get(
                "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=team%3Da",
                &token,
            ),
        )
        .await;
        let mut body = resp.into_body();
        let mut events = Vec::new();
        let next_event = |chunk: Bytes| {
            let event: Value = serde_json::from_slice(&chunk).expect("event");
            event["type"].as_str().unwrap_or("").to_string()
        };
        events.push(next_event(next_frame(&mut body).await.expect("initial")));
        for patch in [
            r#"{"data":{"k":"v2"}}"#,
            r#"{"metadata":{"labels":{"team":"b"}}}"#,
            r#"{"data":{"k":"v3"}}"#,
            r#"{"metadata":{"labels":{"team":"a"}}}"#,
        ] {
            let (parts, _) = raw::request(addr, &ca, merge_patch("mover", &token, patch)).await;
            assert_eq!(parts.status, 200);
        }
        while events.len() < 4 {
            events.push(next_event(next_frame(&mut body).await.expect("event")));
        }
        // The change made while the object did not match is not shown.
        assert_eq!(events, vec!["ADDED", "MODIFIED", "DELETED", "ADDED"]);
    });
}

#[test]
fn small_bodies_have_content_length_large_ones_are_chunked() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        let (parts, body) = raw::request(addr, &ca, raw::get("/api", &token)).await;
        assert_eq!(
            parts.headers["content-length"],
            body.len().to_string().as_str()
        );
        assert!(!parts.headers.contains_key("transfer-encoding"));
        // kube-root-ca.crt in every namespace: the list is larger than 2 KiB.
        let (parts, body) = raw::request(addr, &ca, raw::get("/api/v1/configmaps", &token)).await;
        assert!(body.len() > 2048, "{}", body.len());
        assert_eq!(parts.headers["transfer-encoding"], "chunked");
        assert!(!parts.headers.contains_key("content-length"));
        let list: Value = serde_json::from_slice(&body).expect("whole list");
        assert_eq!(list["kind"], "ConfigMapList");
    });
}

/// `fleetgate_sim_requests_total{verb,resource}` on the member's `/metrics`: what a test or a
/// benchmark reads to count the LISTs (and the rest) that reached the member.
#[test]
fn the_member_counts_the_requests_it_serves_by_verb_and_resource() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        let count = |metrics: &str, verb: &str, resource: &str| -> u64 {
            let series =
                format!("fleetgate_sim_requests_total{{verb=\"{verb}\",resource=\"{resource}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .map_or(0, |v| v.trim().parse().unwrap())
        };
        let metrics = || async {
            let (parts, body) = raw::request(addr, &ca, raw::get("/metrics", &token)).await;
            assert_eq!(parts.status, 200);
            String::from_utf8(body.to_vec()).unwrap()
        };
        let before = metrics().await;
        for _ in 0..3 {
            let list = raw::get("/api/v1/namespaces/default/configmaps", &token);
            assert_eq!(raw::request(addr, &ca, list).await.0.status, 200);
        }
        create_configmap(addr, &ca, &token, "counted", "{}").await;
        let get = raw::get("/api/v1/namespaces/default/configmaps/counted", &token);
        assert_eq!(raw::request(addr, &ca, get).await.0.status, 200);
        let after = metrics().await;
        let grew = |verb, resource| count(&after, verb, resource) - count(&before, verb, resource);
        assert_eq!(grew("list", "configmaps"), 3, "{after}");
        assert_eq!(grew("create", "configmaps"), 1, "{after}");
        assert_eq!(grew("get", "configmaps"), 1, "{after}");
        assert_eq!(grew("list", "pods"), 0, "{after}");
    });
}
