//! The hostile-input suite: what an attacker sends, byte for byte, over TCP and TLS, HTTP/1.1 and
//! h2, against a recording member. Each case asserts exactly which requests the member saw (for a
//! refused request: none), and that the gateway keeps serving. Run under both monoio drivers.
//!
//! `FLEETGATE_UNDER_TEST=path/to/an/older/fleetgate` runs these cases against another build:
//! every case here failed against the commit before the fail-closed work (issue 11).

mod support;

use std::time::Duration;

use support::h2raw;
use support::{exchange, h2_answer, h2_client, h2_get, h2_request, read_response, setup, DRIVERS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The request smuggled inside a body in the desync cases.
const SMUGGLED: &str = "GET /clusters/member/SMUGGLED HTTP/1.1\r\nHost: gw\r\n\r\n";

/// Sends `bytes` and reads one response; then whatever else comes before the gateway closes
/// (bounded).
async fn send_raw<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    bytes: &[u8],
) -> (Option<support::Response>, Vec<u8>) {
    stream.write_all(bytes).await.unwrap();
    let mut carry = Vec::new();
    let response = read_response(&mut stream, &mut carry).await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    carry.extend_from_slice(&rest);
    (response, carry)
}

fn assert_refused(response: Option<support::Response>, rest: &[u8], code: u16, what: &str) {
    let response = response.unwrap_or_else(|| panic!("{what}: no answer"));
    assert_eq!(response.code, code, "{what}: {response:?}");
    assert_eq!(response.json()["kind"], "Status", "{what}");
    assert!(
        rest.is_empty(),
        "{what}: more was answered: {:?}",
        String::from_utf8_lossy(rest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_naming_framing_or_identity_fields_is_refused_and_nothing_reaches_the_member() {
    let chunked_smuggle = format!("{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n", SMUGGLED.len());
    let cases: Vec<(&str, String)> = vec![
        (
            "Connection: content-length",
            format!(
                "POST /clusters/member/api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: gw\r\nConnection: content-length\r\nContent-Length: {}\r\n\r\n{SMUGGLED}",
                SMUGGLED.len()
            ),
        ),
        (
            "Connection: close, Content-Length",
            format!(
                "POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: close, Content-Length\r\nContent-Length: {}\r\n\r\n{SMUGGLED}",
                SMUGGLED.len()
            ),
        ),
        (
            "Connection: transfer-encoding",
            format!(
                "POST /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_smuggle}"
            ),
        ),
        (
            "Connection: host",
            "GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: host\r\n\r\n".into(),
        ),
        (
            "Connection: authorization",
            "GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: Authorization\r\nAuthorization: Bearer x\r\n\r\n".into(),
        ),
        (
            "Connection: impersonate-user",
            "GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive, Impersonate-User\r\n\r\n".into(),
        ),
        (
            "Connection: x-remote-user",
            "GET /clusters/member/x HTTP/1.1\r\nHost: gw\r\nConnection: X-Remote-User\r\nX-Remote-User: admin\r\n\r\n".into(),
        ),
    ];
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for (name, raw) in &cases {
            let mut bytes = raw.clone().into_bytes();
            bytes.extend_from_slice(SMUGGLED.as_bytes());
            let (response, rest) = send_raw(gw.plain().await, &bytes).await;
            assert_refused(response, &rest, 400, &format!("{driver} {name} (plain)"));
            let (response, rest) = send_raw(gw.tls().await, &bytes).await;
            assert_refused(response, &rest, 400, &format!("{driver} {name} (TLS)"));
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
    }
}

/// A member head carries none of the client's forged identity fields (nor `more`), and the
/// gateway's own credential with the authenticated user (alice) impersonated.
fn assert_member_saw_the_gateways_identity(driver: &str, head: &str, more: &[&str]) {
    let lower = head.to_ascii_lowercase();
    for forged in ["x-remote-", "forged", "system:masters"].iter().chain(more) {
        assert!(
            !lower.contains(forged),
            "{driver}: {forged} reached the member:\n{head}"
        );
    }
    assert!(head.contains("Impersonate-User: alice\r\n"), "{head}");
    assert!(
        head.contains("Authorization: Bearer gateway-token\r\n"),
        "{head}"
    );
}

/// The member head's fields called `name`.
fn fields<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_member_gets_the_framing_the_gateway_decided_and_exactly_one_request() {
    let body = "hello, member";
    let framings = [
        (
            "Content-Length",
            format!("Content-Length: {}\r\n", body.len()),
            body.to_string(),
        ),
        (
            "chunked",
            "Transfer-Encoding: chunked\r\n".to_string(),
            "5\r\nhello\r\n8\r\n, member\r\n0\r\n\r\n".to_string(),
        ),
        ("no body", String::new(), String::new()),
    ];
    let connections = [
        "",
        "Connection: keep-alive\r\n",
        "Connection: X-Custom\r\nX-Custom: 1\r\n",
        "Connection: TE\r\nTE: trailers\r\n",
    ];
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let mut expected = 0;
        for (framing, framing_field, wire_body) in &framings {
            for connection in connections {
                let raw = format!(
                    "POST /clusters/member/api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: gw\r\n{connection}{framing_field}\r\n{wire_body}"
                );
                let response = exchange(gw.plain().await, raw.as_bytes())
                    .await
                    .unwrap_or_else(|| panic!("{driver} {framing} {connection:?}: no answer"));
                assert_eq!(response.code, 200, "{driver} {framing} {connection:?}");
                expected += 1;
                let seen = upstream.requests();
                assert_eq!(
                    seen.len(),
                    expected,
                    "{driver} {framing} {connection:?}: {seen:#?}"
                );
                let last = seen.last().unwrap();
                let lengths = fields(&last.head, "content-length");
                let encodings = fields(&last.head, "transfer-encoding");
                match *framing {
                    "Content-Length" => {
                        assert_eq!(lengths, [body.len().to_string().as_str()], "{}", last.head);
                        assert!(encodings.is_empty(), "{}", last.head);
                        assert_eq!(last.body, body.as_bytes());
                    }
                    "chunked" => {
                        assert!(lengths.is_empty(), "{}", last.head);
                        assert_eq!(encodings, ["chunked"], "{}", last.head);
                        assert_eq!(last.body, wire_body.as_bytes());
                    }
                    _ => {
                        assert!(lengths.is_empty() && encodings.is_empty(), "{}", last.head);
                        assert!(last.body.is_empty());
                    }
                }
                for hop in ["Connection", "X-Custom", "TE"] {
                    assert!(
                        fields(&last.head, hop).is_empty(),
                        "{hop} forwarded: {}",
                        last.head
                    );
                }
            }
        }
    }
}

/// Paths a member (or a proxy in front of it) could read as another path than the one routed
/// and authorized.
const ESCAPING_PATHS: &[&str] = &[
    "/clusters/member/../stopped/api/v1/namespaces",
    "/clusters/member/%2e%2e/stopped/api/v1/namespaces",
    "/clusters/member/%2E%2E/stopped/api/v1/namespaces",
    "/clusters/member/.%2e/stopped/api/v1/namespaces",
    "/clusters/member/api/v1/namespaces/default/../kube-system/configmaps",
    "/clusters/member/api/v1/namespaces/default/./configmaps",
    "/clusters/member/api/v1/namespaces/default/%2e/configmaps",
    "/clusters/member/api/v1/namespaces/kube-system%2Fconfigmaps",
    "/clusters/member/api/v1/namespaces/kube-system%2fconfigmaps",
    "/clusters/member/api/v1/namespaces/kube-system%5Cconfigmaps",
    "/clusters/member/api/v1/namespaces/kube-system%00/configmaps",
    "/clusters/member//api/v1/namespaces",
    "/apis/cluster.karmada.io/v1alpha1/clusters/member/proxy/../../../clusters/stopped/proxy/api",
    "/member/../stopped/api",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_and_encoded_separators_are_refused_on_every_listener_and_protocol() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let h2 = h2_client(&gw).await;
        for path in ESCAPING_PATHS {
            let raw = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n");
            let (response, rest) = send_raw(gw.plain().await, raw.as_bytes()).await;
            assert_refused(response, &rest, 400, &format!("{driver} {path} (plain)"));
            let (response, rest) = send_raw(gw.tls().await, raw.as_bytes()).await;
            assert_refused(response, &rest, 400, &format!("{driver} {path} (TLS)"));
            let (code, body) = h2_answer(h2_get(&h2, path).await).await;
            assert_eq!(
                code,
                400,
                "{driver} {path} (h2): {}",
                String::from_utf8_lossy(&body)
            );
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
        // The same request without the escape goes through, as it came.
        let ok = gw
            .http_get("/clusters/member/api/v1/namespaces/default/configmaps/a.b")
            .await;
        assert_eq!(ok.code, 200);
        let seen = upstream.requests();
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0]
                .head
                .starts_with("GET /prefix/api/v1/namespaces/default/configmaps/a.b HTTP/1.1\r\n"),
            "{}",
            seen[0].head
        );
    }
}

/// An h2 GET of the member's namespaces on a new connection, carrying `fields` (name, value; the
/// name lowercased, as h2 requires): the status.
async fn h2_status_with(gw: &support::Gateway, fields: &[(&str, &str)]) -> http::StatusCode {
    let mut h2 = h2_client(gw).await.ready().await.unwrap();
    let mut request = h2_request("GET", "/clusters/member/api/v1/namespaces");
    for (name, value) in fields {
        request.headers_mut().append(
            http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let (response, _) = h2.send_request(request, true).unwrap();
    response.await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_identity_headers_never_reach_the_member() {
    let forged = "X-Remote-User: admin\r\nX-Remote-Group: system:masters\r\nX-Remote-Extra-Scopes: all\r\nx-remote-uid: 0\r\nAuthorization: Bearer forged\r\n";
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        let raw = format!(
            "GET /clusters/member/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n{forged}Connection: close\r\n\r\n"
        );
        // With a client certificate (alice), and anonymous on the plaintext listener (whose
        // forged bearer token is refused before anything is forwarded).
        let response = exchange(gw.tls().await, raw.as_bytes()).await.unwrap();
        assert_eq!(response.code, 200, "{driver}: {response:?}");
        let (response, _) = send_raw(gw.plain().await, raw.as_bytes()).await;
        assert_eq!(
            response.unwrap().code,
            401,
            "{driver}: a forged token is not anonymous"
        );
        // Over h2 too.
        let fields: Vec<(&str, &str)> = forged
            .split("\r\n")
            .filter(|l| !l.is_empty())
            .map(|line| line.split_once(": ").unwrap())
            .collect();
        assert_eq!(h2_status_with(&gw, &fields).await, 200, "{driver} (h2)");
        let seen = upstream.requests();
        assert_eq!(seen.len(), 2, "{driver}: {seen:#?}");
        for request in seen {
            assert_member_saw_the_gateways_identity(driver, &request.head, &[]);
        }
    }
}

/// Identity fields spelled with `_` for `-`: a Go apiserver ignores them, but a backend that maps
/// `_` to `-` (CGI, WSGI, some proxies in front of an agent's in-cluster service) would honour
/// them. Refused with a 400 Status over every listener and protocol; nothing reaches the member,
/// and a field with `_` that names no identity still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_fields_spelled_with_underscores_are_refused_and_reach_no_member() {
    let forged = [
        ("Impersonate_User", "admin"),
        ("impersonate_group", "system:masters"),
        ("Impersonate-Extra_Scopes", "all"),
        ("X_Remote_User", "admin"),
        ("x-remote_group", "system:masters"),
    ];
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for (name, value) in forged {
            let raw = format!(
                "GET /clusters/member/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n{name}: {value}\r\n\r\n"
            );
            let what = format!("{driver} {name}");
            refused_then_served(gw.tls().await, &raw, &format!("{what} (TLS)")).await;
            refused_then_served(gw.plain().await, &raw, &format!("{what} (plaintext)")).await;
            assert_eq!(
                h2_status_with(&gw, &[(name, value)]).await,
                400,
                "{driver} (h2) {name}"
            );
        }
        // The member saw only the ordinary requests (one per refused one on the TLS listener,
        // which authenticates alice; the plaintext one's anonymous user reaches the member too).
        let seen = upstream.requests();
        assert_eq!(seen.len(), 2 * forged.len(), "{driver}: {seen:#?}");
        for request in &seen {
            assert_eq!(fields(&request.head, "x_trace_id"), ["7"], "{driver}");
            let lower = request.head.to_ascii_lowercase();
            for forbidden in [
                "impersonate_",
                "x_remote",
                "x-remote",
                "system:masters",
                "admin",
            ] {
                assert!(
                    !lower.contains(forbidden),
                    "{driver}: {forbidden} reached the member:\n{}",
                    request.head
                );
            }
        }
    }
}

/// Sends `raw`, expects a 400 BadRequest Status, then sends [`ORDINARY`] on the same connection
/// and expects it served: the connection stays sound.
async fn refused_then_served<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    raw: &str,
    what: &str,
) {
    let mut carry = Vec::new();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let response = read_response(&mut stream, &mut carry).await;
    let response = response.unwrap_or_else(|| panic!("{what}: no answer"));
    assert_eq!(response.code, 400, "{what}: {response:?}");
    assert_eq!(response.json()["kind"], "Status", "{what}");
    assert_eq!(response.json()["reason"], "BadRequest", "{what}");
    stream.write_all(ORDINARY.as_bytes()).await.unwrap();
    let response = read_response(&mut stream, &mut carry).await.unwrap();
    assert_eq!(response.code, 200, "{what}: {response:?}");
}

/// A request with an ordinary field spelled with `_`.
const ORDINARY: &str =
    "GET /clusters/member/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\nX_Trace_Id: 7\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_fleet_view_forged_fields_never_reach_a_member_and_bad_input_reaches_none() {
    let forged = "X-Remote-User: admin\r\nX-Remote-Group: system:masters\r\nAuthorization: Bearer forged\r\nAccept-Encoding: gzip\r\nConnection: x-custom\r\nX-Custom: hop\r\n";
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        // Malformed fleet requests: a dot segment, a continue token the view did not write, a
        // limit that is not a number, a resourceVersion of one member's. Nothing reaches a member.
        for target in [
            "/fleet/api/v1/namespaces/x/../../pods",
            "/fleet/api/v1/pods?continue=eyJjIjoiLi4vIn0",
            "/fleet/api/v1/pods?continue=%00%ff",
            "/fleet/api/v1/pods?limit=-1",
            "/fleet/api/v1/pods?resourceVersion=12345",
        ] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
            let (response, rest) = send_raw(gw.tls().await, raw.as_bytes()).await;
            assert_refused(response, &rest, 400, target);
        }
        // Hostile `cluster.fleetgate.io` hints: dot segments, encoded slashes, a name over 63
        // bytes, upper case, no name, a second hint, and a cluster that does not exist.
        let long = format!("/fleet/cluster.fleetgate.io/{}/api/v1/pods", "m".repeat(64));
        for (target, code) in [
            ("/fleet/cluster.fleetgate.io/../api/v1/pods", 400),
            (
                "/fleet/cluster.fleetgate.io/member/../nosuch/api/v1/pods",
                400,
            ),
            ("/fleet/cluster.fleetgate.io/%2e%2e/api/v1/pods", 400),
            ("/fleet/cluster.fleetgate.io/mem%2Fber/api/v1/pods", 400),
            ("/fleet/cluster.fleetgate.io/member%2Fapi/v1/pods", 400),
            (long.as_str(), 404),
            ("/fleet/cluster.fleetgate.io/MEMBER/api/v1/pods", 404),
            ("/fleet/cluster.fleetgate.io/api/v1/pods", 404),
            (
                "/fleet/cluster.fleetgate.io/member/cluster.fleetgate.io/member/api",
                404,
            ),
            (
                "/fleet/cluster.fleetgate.io/nosuch/api/v1/namespaces/d/pods/hello",
                404,
            ),
            ("/fleet/cluster.fleetgate.io/nosuch/api", 404),
        ] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
            let (response, rest) = send_raw(gw.tls().await, raw.as_bytes()).await;
            assert_refused(response, &rest, code, target);
        }
        assert!(
            upstream.requests().is_empty(),
            "{driver}: {:#?}",
            upstream.requests()
        );

        // A fleet LIST (the member's echo is no list: it is left out with a warning) and a named
        // object's log (the echo answers 200: the member owns the object, and the GET of its log
        // goes there), with forged identity fields, an encoding the view could not read, and a
        // hop-by-hop field.
        for target in [
            "/fleet/api/v1/pods",
            "/fleet/api/v1/namespaces/default/pods/hello/log",
        ] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: gw\r\n{forged}\r\n");
            let response = exchange(gw.tls().await, raw.as_bytes()).await.unwrap();
            assert_eq!(response.code, 200, "{driver} {target}: {response:?}");
        }
        let seen = upstream.requests();
        // The LIST's probe; the owner lookup, then the GET itself.
        assert_eq!(seen.len(), 3, "{driver}: {seen:#?}");
        for (index, request) in seen.iter().enumerate() {
            assert_member_saw_the_gateways_identity(driver, &request.head, &["x-custom"]);
            // The view reads what it asks for itself: uncompressed. The GET it only routes goes
            // as the client sent it.
            let encoding = fields(&request.head, "accept-encoding");
            if index < 2 {
                assert!(encoding.is_empty(), "{}", request.head);
            } else {
                assert_eq!(encoding, ["gzip"], "{}", request.head);
            }
        }
        assert!(
            seen[0].head.starts_with("GET /prefix/api/v1/pods?limit=1 "),
            "{}",
            seen[0].head
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_head_or_body_reaches_no_member() {
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for partial in [
            "GET /clusters/member/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n",
            "GET /clusters/member/api/v1/names",
        ] {
            let mut stream = gw.plain().await;
            stream.write_all(partial.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
            assert!(
                rest.is_empty(),
                "{driver} {partial:?}: answered {:?}",
                String::from_utf8_lossy(&rest)
            );
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_paths_that_do_not_start_with_a_slash_or_inject_fields_are_refused_and_every_shard_lives(
) {
    // The test Gateway routes OCM-style (`/{name}/...`), the mode whose route panicked on these.
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        // Several connections, so that both shards see one.
        for attempt in 0..6 {
            let mut tls = gw.tls_h2().await;
            h2raw::start(&mut tls).await;
            tls.write_all(&h2raw::headers(1, &h2raw::get_fields("?x"), true))
                .await
                .unwrap();
            let answer = h2raw::read_until(&mut tls, |f| f.stream == 1 || f.kind == h2raw::GOAWAY)
                .await
                .unwrap_or_else(|| panic!("{driver} attempt {attempt}: the connection died"));
            assert_eq!(
                answer.status(),
                Some(400),
                "{driver} attempt {attempt}: {answer:?}"
            );
            // A field value carrying a line break: h2 itself refuses the request (a stream or
            // connection error), and the line never becomes a field of a member request.
            let mut fields = h2raw::get_fields("/clusters/member/api/v1/namespaces");
            fields.push(("x-injected", "a\r\nX-Remote-User: admin".into()));
            tls.write_all(&h2raw::headers(3, &fields, true))
                .await
                .unwrap();
            let answer =
                h2raw::read_until(&mut tls, |f| f.stream == 3 || f.kind == h2raw::GOAWAY).await;
            if let Some(answer) = answer {
                assert!(
                    answer.kind == h2raw::RST_STREAM || answer.kind == h2raw::GOAWAY,
                    "{driver} attempt {attempt}: {answer:?}"
                );
            }
        }
        // Every shard still serves: new connections, spread by the kernel over both.
        for attempt in 0..20 {
            let health = gw.https_get("/healthz").await;
            assert_eq!(health.code, 200, "{driver}: connection {attempt}");
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
    }
}

/// A well-behaved client on the same shard: keep-alive GETs through the gateway every few
/// milliseconds until `stop`, returning the slowest answer it got.
async fn probe_latency(
    gw: &support::Gateway,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Duration {
    let mut stream = gw.tls().await;
    let mut slowest = Duration::ZERO;
    let mut carry = Vec::new();
    while !*stop.borrow() {
        let started = std::time::Instant::now();
        stream
            .write_all(b"GET /clusters/member/probe HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        let response = read_response(&mut stream, &mut carry)
            .await
            .expect("probe answered");
        assert_eq!(response.code, 200);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    slowest
}

/// What an attack on one h2 connection ended with.
struct Attacked {
    /// The GOAWAY's error code, if one came before the connection ended.
    goaway: Option<u32>,
    /// Whether the connection ended (closed, or GOAWAY) within the attack's time.
    ended: bool,
    /// The slowest answer a well-behaved client on the same shard got meanwhile.
    probe: Duration,
}

impl Attacked {
    /// The well-behaved client on the flooded shard kept its latency; `what` names the case.
    #[track_caller]
    fn assert_shard_kept_its_latency(&self, what: &str) {
        assert!(
            self.probe < PROBE_LIMIT,
            "{what}: the shard stalled {:?}",
            self.probe
        );
    }

    /// The gateway answered the flood with GOAWAY(ENHANCE_YOUR_CALM), and the shard kept its
    /// latency meanwhile.
    #[track_caller]
    fn assert_calmed(&self, what: &str) {
        assert_eq!(self.goaway, Some(CALM), "{what}");
        self.assert_shard_kept_its_latency(what);
    }
}

/// Opens an h2 connection, `watches` watch streams on it (waiting until each is answered), then
/// writes `batch(i)` for i = 0, 1, ... for at most 5 s or until the gateway ends the connection,
/// while a well-behaved client on the same shard measures its latency.
async fn attack(gw: &support::Gateway, watches: u32, batch: impl Fn(u32) -> Vec<u8>) -> Attacked {
    let mut tls = gw.tls_h2().await;
    h2raw::start(&mut tls).await;
    let mut open = Vec::new();
    for i in 0..watches {
        open.extend_from_slice(&h2raw::headers(
            2 * i + 1,
            &h2raw::get_fields("/clusters/member/api/v1/configmaps?watch=true"),
            true,
        ));
    }
    tls.write_all(&open).await.unwrap();
    let answered = std::cell::RefCell::new(std::collections::HashSet::new());
    if watches > 0 {
        h2raw::read_until(&mut tls, |f| {
            let mut answered = answered.borrow_mut();
            if f.kind == h2raw::HEADERS {
                answered.insert(f.stream);
            }
            answered.len() == watches as usize
        })
        .await
        .expect("every watch answered");
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let probe = probe_latency(gw, stop_rx);
    let (mut reader, mut writer) = tokio::io::split(tls);
    let watch_goaway = async {
        let frame =
            h2raw::read_until(&mut ReadOnly(&mut reader), |f| f.kind == h2raw::GOAWAY).await;
        frame.and_then(|f| f.goaway_code())
    };
    let flood = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut i = 0;
        while std::time::Instant::now() < deadline {
            if writer.write_all(&batch(i)).await.is_err() {
                return;
            }
            i += 1;
            tokio::task::yield_now().await;
        }
    };
    let (goaway, ended) = tokio::select! {
        goaway = watch_goaway => (goaway, true),
        () = flood => (None, false),
    };
    let _ = stop_tx.send(true);
    let probe = probe.await;
    Attacked {
        goaway,
        ended,
        probe,
    }
}

/// A read half as a stream `h2raw::read_until` can use (its SETTINGS acknowledgements are dropped:
/// the attacker does not care).
struct ReadOnly<'a, R>(&'a mut R);

impl<R: AsyncRead + Unpin> AsyncRead for ReadOnly<'_, R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<R> AsyncWrite for ReadOnly<'_, R> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// ENHANCE_YOUR_CALM.
const CALM: u32 = 0xb;

/// The slowest answer a client on the flooded shard may see: the gateway used to stall the whole
/// shard for seconds under a SETTINGS flood.
const PROBE_LIMIT: Duration = Duration::from_millis(750);

async fn one_shard(driver: &str) -> (support::Upstream, support::Gateway) {
    support::setup_with_config(driver, |text| text.replace("workers: 2", "workers: 1")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settings_flood_on_400_watches_is_calmed_and_the_shard_keeps_its_latency() {
    for driver in DRIVERS {
        let (_upstream, gw) = one_shard(driver).await;
        let attacked = attack(&gw, 400, |i| {
            let mut out = Vec::new();
            for j in 0..200 {
                // SETTINGS_INITIAL_WINDOW_SIZE, changed every time: h2 applies it to every stream.
                out.extend_from_slice(&h2raw::settings(&[(0x4, 65_535 + (i * 200 + j) % 2)]));
            }
            out
        })
        .await;
        assert!(attacked.ended, "{driver}: the flood was never stopped");
        attacked.assert_calmed(driver);
        let metrics =
            tokio::task::block_in_place(|| support::fleet::admin_get(gw.admin, "/metrics"));
        assert!(
            metrics.contains("fleetgate_h2_connections_calmed_total 1"),
            "{driver}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ping_and_rapid_reset_floods_are_calmed_and_the_shard_keeps_its_latency() {
    for driver in DRIVERS {
        let (upstream, gw) = one_shard(driver).await;
        let attacked = attack(&gw, 0, |i| {
            (0..200)
                .flat_map(|j| h2raw::ping(u64::from(i * 200 + j)))
                .collect()
        })
        .await;
        attacked.assert_calmed(&format!("{driver}: PING flood"));

        // Rapid reset (CVE-2023-44487): a request and its cancellation, again and again.
        let attacked = attack(&gw, 0, |i| {
            let mut out = Vec::new();
            for j in 0..50 {
                let stream = 2 * (i * 50 + j) + 1;
                out.extend_from_slice(&h2raw::headers(
                    stream,
                    &h2raw::get_fields("/clusters/member/api/v1/namespaces"),
                    true,
                ));
                out.extend_from_slice(&h2raw::rst_stream(stream, 8));
            }
            out
        })
        .await;
        attacked.assert_calmed(&format!("{driver}: rapid reset"));
        // Resets abandon their member requests: far fewer reach the member than were sent.
        let seen = upstream.requests().len();
        assert!(
            seen < 5_000,
            "{driver}: {seen} reset requests reached the member"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continuation_floods_and_hpack_bombs_reach_no_member() {
    for driver in DRIVERS {
        let (upstream, gw) = one_shard(driver).await;
        // CONTINUATION flood (2024): a header block that never ends.
        let attacked = attack(&gw, 0, |i| {
            let mut out = Vec::new();
            if i == 0 {
                let block = h2raw::header_block(&[
                    (":method", "GET"),
                    (":scheme", "https"),
                    (":authority", "gw"),
                    (":path", "/clusters/member/api/v1/namespaces"),
                ]);
                out.extend_from_slice(&h2raw::frame(h2raw::HEADERS, h2raw::END_STREAM, 1, &block));
            }
            for _ in 0..100 {
                let filler = h2raw::header_block(&[("x-filler", "a")]);
                out.extend_from_slice(&h2raw::frame(h2raw::CONTINUATION, 0, 1, &filler));
            }
            out
        })
        .await;
        assert!(
            attacked.ended,
            "{driver}: the CONTINUATION flood was read forever"
        );
        attacked.assert_shard_kept_its_latency(&format!("{driver}: CONTINUATION flood"));

        // HPACK bomb: one 4 KiB value in the dynamic table, referenced a thousand times (1 byte
        // each), decoding to 4 MB of fields.
        let mut tls = gw.tls_h2().await;
        h2raw::start(&mut tls).await;
        let mut block = h2raw::header_block(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "gw"),
            (":path", "/clusters/member/api/v1/namespaces"),
        ]);
        h2raw::indexed_literal(&mut block, "x-bomb", &[b'a'; 4000]);
        for _ in 0..1000 {
            h2raw::indexed(&mut block, 62);
        }
        tls.write_all(&h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_STREAM | h2raw::END_HEADERS,
            1,
            &block,
        ))
        .await
        .unwrap();
        let answer =
            h2raw::read_until(&mut tls, |f| f.stream == 1 || f.kind == h2raw::GOAWAY).await;
        if let Some(answer) = answer {
            assert!(
                answer.kind != h2raw::HEADERS
                    || answer.status() == Some(431)
                    || answer.status() == Some(400),
                "{driver}: the bomb was answered {answer:?}"
            );
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
    }
}

/// A query is read as the member's Go reads it (`url.Query()`), so an escaped or dropped
/// `watch` cannot make a list look like a watch to AccessPolicy, or a watch like a list. Before
/// this, `watch=%66alse` passed a watch-only grant and the member listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_says_to_the_policy_what_it_says_to_the_member() {
    let configmaps = "/clusters/member/api/v1/namespaces/default/configmaps";
    let ask = |query: &str| {
        format!("GET {configmaps}?{query} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    };
    for (grant, refused, allowed) in [
        (
            "watch",
            // Each a list to the member: an escaped `false` or `0`, a pair with `;` (dropped).
            &[
                "watch=%66alse",
                "watch=%30",
                "watch=true;",
                "watch=1;&limit=1",
            ][..],
            "watch=1",
        ),
        (
            "list",
            // Each a watch to the member: an escaped key, an escaped `true`.
            &["w%61tch=true", "watch=tr%75e", "watch=%zz&w%61tch=1"][..],
            "watch=%66alse",
        ),
    ] {
        let rules = format!("    - verbs: [{grant}]\n      resources: [configmaps]\n");
        for driver in DRIVERS {
            let (upstream, gw) = support::setup_with_rules(driver, &rules).await;
            let mut h2 = h2_client(&gw).await;
            for query in refused {
                let (response, rest) = send_raw(gw.plain().await, ask(query).as_bytes()).await;
                let what = format!("{driver}: {query} under a {grant}-only grant");
                assert_refused(response, &rest, 403, &what);
                // The same over h2 (alice, authenticated, has the same grant).
                let request = h2_request("GET", &format!("{configmaps}?{query}"));
                let (answer, _) = h2.send_request(request, true).unwrap();
                let answer = answer.await.unwrap();
                assert_eq!(answer.status(), 403, "{what} (h2)");
            }
            let seen = upstream.requests();
            assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
            // What the grant allows still goes through, as the client wrote it.
            if grant == "list" {
                let (response, _) = send_raw(gw.plain().await, ask(allowed).as_bytes()).await;
                let response = response.expect("an answer");
                assert_eq!(response.code, 200, "{driver}: {allowed}: {response:?}");
                let seen = upstream.requests();
                assert_eq!(seen.len(), 1, "{driver}: {seen:#?}");
                assert!(
                    seen[0].head.contains(&format!("?{allowed} HTTP/1.1")),
                    "{driver}: {}",
                    seen[0].head
                );
            }
        }
    }
}

/// A fleet LIST's continue token is the client's to send back, so what it holds for a member is
/// the client's too: it must reach the member as one query value, never as framing. A token
/// holding CR LF, a header and a second request is refused or encoded; the member's heads carry
/// nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_continue_token_cannot_frame_a_member_request() {
    use base64::Engine as _;
    let payloads = [
        "x HTTP/1.1\r\nHost: m\r\nX-Injected: yes\r\nContent-Length: 0\r\n\r\nGET /smuggled HTTP/1.1\r\nX-Rest: ",
        "x&limit=100000&labelSelector=injected",
        "x#fragment",
        "x y",
    ];
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for payload in payloads {
            let token = serde_json::json!({"c": "member", "k": payload}).to_string();
            let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
            let target = format!("/fleet/api/v1/pods?limit=1&continue={token}");
            let raw = format!("GET {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
            let _ = send_raw(gw.tls().await, raw.as_bytes()).await;
        }
        let seen = upstream.requests();
        assert_eq!(seen.len(), payloads.len(), "{driver}: {seen:#?}");
        for request in seen {
            let head = &request.head;
            let mut lines = head.lines();
            let line = lines.next().unwrap_or("");
            for field in lines {
                let name = field.split(':').next().unwrap_or("");
                assert!(
                    !["X-Injected", "X-Rest", "Content-Length"].contains(&name)
                        && !field.starts_with("GET "),
                    "{driver}: {head}"
                );
            }
            // One request line, its target one token; the query's pairs are the gateway's.
            let parts: Vec<&str> = line.split(' ').collect();
            assert_eq!(parts.len(), 3, "{driver}: {line}");
            let query = parts[1].split_once('?').map_or("", |q| q.1);
            assert!(!query.contains('#'), "{driver}: {line}");
            let mut keys: Vec<&str> = query
                .split('&')
                .map(|p| p.split('=').next().unwrap())
                .collect();
            keys.sort();
            assert_eq!(keys, ["continue", "limit"], "{driver}: {line}");
        }
    }
}

/// The identity goes to the member in `Impersonate-*` fields the gateway writes, so a name
/// from a certificate (or a token's claim) holding CR LF, or spaces a member would trim, must
/// never be written: the client gets a 401 and the member sees nothing. A certificate the
/// gateway's CA signed is the carrier here (an identity provider's claims are the same bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_an_impersonation_header_cannot_carry_is_refused() {
    let hostile = [
        ("alice\r\nImpersonate-Group: system:masters", "devs"),
        ("alice", "devs\r\nImpersonate-User: system:admin"),
        ("alice", " system:masters"),
        ("alice ", "devs"),
        ("alice\0", "devs"),
        ("\tadmin", "devs"),
    ];
    for driver in DRIVERS {
        let (upstream, gw) = setup(driver).await;
        for (user, group) in hostile {
            let (response, rest) = get_pods_as(&gw, user, group).await;
            assert_refused(
                response,
                &rest,
                401,
                &format!("{driver}: {user:?} in {group:?}"),
            );
        }
        let seen = upstream.requests();
        assert!(seen.is_empty(), "{driver}: the member saw {seen:#?}");
        // A name with inner spaces and tabs is a name like any other.
        let (response, _) = get_pods_as(&gw, "alice smith", "dev\tops").await;
        assert_eq!(response.map(|r| r.code), Some(200), "{driver}");
        let seen = upstream.requests();
        assert_eq!(seen.len(), 1, "{driver}");
        assert!(
            seen[0]
                .head
                .contains("Impersonate-User: alice smith\r\nImpersonate-Group: dev\tops\r\n"),
            "{}",
            seen[0].head
        );
    }
}

/// A GET of member's pods over TLS with a client certificate for `user` in `group`.
async fn get_pods_as(
    gw: &support::Gateway,
    user: &str,
    group: &str,
) -> (Option<support::Response>, Vec<u8>) {
    let config = gw.pki.client_config_as(user, group);
    let tcp = tokio::net::TcpStream::connect(gw.https).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let raw = "GET /clusters/member/api/v1/namespaces/default/pods HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    send_raw(tls, raw.as_bytes()).await
}
