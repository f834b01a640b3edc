//! One table of behaviour, run over HTTP/1.1 and over h2 (issue 32: one pipeline for both
//! front-ends). Each row is a request as a user sends it (who, method, path, header fields, body)
//! and what must come of it: the status, what the member received (its request line and the
//! user it was told to act as, or nothing at all), and what the body says. The rows run in order
//! against a running gateway in front of the simulated fleet (`member1`, `member2`) and a
//! recording member (`recorder`, the harness's raw member that echoes each request), once per
//! protocol, each time on a freshly started gateway, so that both protocols meet the same state
//! (bob's one-request rate budget, the shared watch's hub).
//!
//! Cases: a plain GET, a write with a body, client impersonation allowed and refused by policy,
//! a refusal by path policy, a 401, a 429 by fairness, a fleet LIST, a shared watch's first
//! event, `/readyz`, an unknown path (404) and an identity header spelled to slip past (400).

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::client::tls_connect;
use support::fleet::{tls_config_as, Fleet};
use support::Upstream;

/// Who sends a request.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// A client certificate of the fleet's users (`users/NAME.crt`).
    Cert(&'static str),
    /// No certificate, this bearer token.
    Token(&'static str),
}

/// What the recording member must have received for a row.
#[derive(Debug)]
enum Member {
    /// Nothing: the gateway answered itself, or the row is for the simulated fleet.
    Untouched,
    /// Exactly one request: its request line, and the user its `Impersonate-User` names.
    Saw {
        line: &'static str,
        acting_as: &'static str,
    },
}

/// One row of the table.
struct Case {
    what: &'static str,
    who: Who,
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    status: u16,
    member: Member,
    /// Pieces the response body must contain.
    says: &'static [&'static str],
}

const RECORDED_POD: &str = "/clusters/recorder/api/v1/namespaces/default/pods/web";

fn table() -> Vec<Case> {
    vec![
        Case {
            what: "a plain GET, proxied as the user",
            who: Who::Cert("admin"),
            method: "GET",
            path: RECORDED_POD,
            headers: &[],
            body: "",
            status: 200,
            member: Member::Saw {
                line: "GET /prefix/api/v1/namespaces/default/pods/web HTTP/1.1",
                acting_as: "admin",
            },
            says: &["\"head\""],
        },
        Case {
            what: "a write with a body, the body passed on",
            who: Who::Cert("admin"),
            method: "POST",
            path: "/clusters/recorder/api/v1/namespaces/default/configmaps",
            headers: &[],
            body: r#"{"kind":"ConfigMap","metadata":{"name":"written"}}"#,
            status: 200,
            member: Member::Saw {
                line: "POST /prefix/api/v1/namespaces/default/configmaps HTTP/1.1",
                acting_as: "admin",
            },
            says: &[r#"\"name\":\"written\""#],
        },
        Case {
            what: "impersonation a policy grants (alice of devs, who may read dev clusters)",
            who: Who::Cert("carol"),
            method: "GET",
            path: RECORDED_POD,
            headers: &[("impersonate-user", "alice"), ("impersonate-group", "devs")],
            body: "",
            status: 200,
            member: Member::Saw {
                line: "GET /prefix/api/v1/namespaces/default/pods/web HTTP/1.1",
                acting_as: "alice",
            },
            says: &["\"head\""],
        },
        Case {
            what: "impersonation no policy grants: 403",
            who: Who::Cert("carol"),
            method: "GET",
            path: RECORDED_POD,
            headers: &[("impersonate-user", "bob")],
            body: "",
            status: 403,
            member: Member::Untouched,
            says: &["\"reason\":\"Forbidden\""],
        },
        Case {
            what: "a namespace the user's policy leaves out: 403",
            who: Who::Cert("bob"),
            method: "GET",
            path: "/clusters/member1/api/v1/namespaces/kube-system/configmaps",
            headers: &[],
            body: "",
            status: 403,
            member: Member::Untouched,
            says: &["\"reason\":\"Forbidden\""],
        },
        Case {
            what: "a bearer token nobody issued: 401",
            who: Who::Token("not-a-token"),
            method: "GET",
            path: RECORDED_POD,
            headers: &[],
            body: "",
            status: 401,
            member: Member::Untouched,
            says: &["\"reason\":\"Unauthorized\""],
        },
        Case {
            what: "bob's one request of his rate",
            who: Who::Cert("bob"),
            method: "GET",
            path: "/clusters/member1/api/v1/namespaces/default/configmaps",
            headers: &[],
            body: "",
            status: 200,
            member: Member::Untouched,
            says: &["\"kind\":\"ConfigMapList\""],
        },
        Case {
            what: "bob past his rate: 429",
            who: Who::Cert("bob"),
            method: "GET",
            path: "/clusters/member1/api/v1/namespaces/default/configmaps",
            headers: &[],
            body: "",
            status: 429,
            member: Member::Untouched,
            says: &["\"reason\":\"TooManyRequests\""],
        },
        Case {
            what: "a fleet LIST, merged from both members",
            who: Who::Cert("admin"),
            method: "GET",
            path: "/fleet/api/v1/namespaces/default/configmaps",
            headers: &[],
            body: "",
            status: 200,
            member: Member::Untouched,
            says: &["\"kind\":\"ConfigMapList\"", "\"name\":\"table-seed\""],
        },
        Case {
            what: "a shared watch: its first event, from the hub",
            who: Who::Cert("admin"),
            method: "GET",
            path:
                "/clusters/member1/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1",
            headers: &[],
            body: "",
            status: 200,
            member: Member::Untouched,
            says: &["{\"type\":\"ADDED\"", "\"name\":\"table-seed\""],
        },
        Case {
            what: "readiness, answered by the gateway",
            who: Who::Cert("admin"),
            method: "GET",
            path: "/readyz",
            headers: &[],
            body: "",
            status: 200,
            member: Member::Untouched,
            says: &["ok"],
        },
        Case {
            what: "a path that routes nowhere: 404",
            who: Who::Cert("admin"),
            method: "GET",
            path: "/nowhere/api/v1/pods",
            headers: &[],
            body: "",
            status: 404,
            member: Member::Untouched,
            says: &["\"reason\":\"NotFound\""],
        },
        Case {
            what: "an identity field spelled with an underscore: 400",
            who: Who::Cert("admin"),
            method: "GET",
            path: RECORDED_POD,
            headers: &[("impersonate_user", "bob")],
            body: "",
            status: 400,
            member: Member::Untouched,
            says: &["\"reason\":\"BadRequest\""],
        },
    ]
}

/// A TLS client trusting the gateway CA, with no certificate of its own (TLS 1.3, as the
/// gateway's clients mostly speak it).
fn anonymous_tls(fleet: &Fleet, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let pem = std::fs::read(fleet.fleet_path("pki/gateway-ca.crt")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(fleetgate_config_watcher::parse_certs(&pem).unwrap());
    let provider = fleetgate_config_watcher::crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider);
    let mut config = builder
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// Sends one request on a new connection over HTTP/1.1 or h2; the status and the whole body.
async fn send(
    tls: Arc<rustls::ClientConfig>,
    https: std::net::SocketAddr,
    h2: bool,
    case: &Case,
) -> (u16, String) {
    let stream = tls_connect(https, tls).await.expect("TLS to the gateway");
    let io = TokioIo::new(stream);
    let uri = if h2 {
        format!("https://127.0.0.1{}", case.path)
    } else {
        case.path.to_owned()
    };
    let mut request = http::Request::builder().method(case.method).uri(uri);
    if !h2 {
        request = request.header("host", "127.0.0.1");
    }
    if let Who::Token(token) = case.who {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    for (name, value) in case.headers {
        request = request.header(*name, *value);
    }
    if !case.body.is_empty() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from_static(case.body.as_bytes())))
        .unwrap();
    let response = if h2 {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2 handshake");
        tokio::spawn(connection);
        sender.send_request(request).await
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(connection);
        sender.send_request(request).await
    };
    let response = response.unwrap_or_else(|e| panic!("{}: {e}", case.what));
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(30), response.into_body().collect())
        .await
        .unwrap_or_else(|_| panic!("{}: the body did not end", case.what))
        .unwrap_or_else(|e| panic!("{}: {e}", case.what))
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The values of header field `name` in a recorded request head.
fn field<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    let mut values = Vec::new();
    for line in head.lines().skip(1) {
        match line.split_once(':') {
            Some((n, value)) if n.eq_ignore_ascii_case(name) => values.push(value.trim()),
            _ => {}
        }
    }
    values
}

/// Runs every row over one protocol against the running gateway.
fn run_table(fleet: &Fleet, recorder: &Upstream, h2: bool) {
    let protocol = if h2 { "h2" } else { "HTTP/1.1" };
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    for case in table() {
        let tls = match case.who {
            Who::Cert(user) => tls_config_as(
                fleet.dir(),
                &format!("users/{user}.crt"),
                &format!("users/{user}.key"),
                alpn,
            ),
            Who::Token(_) => anonymous_tls(fleet, alpn),
        };
        let seen_before = recorder.requests().len();
        let (status, body) = fleet.runtime.block_on(send(tls, fleet.https(), h2, &case));
        let what = format!("{protocol}: {} ({} {})", case.what, case.method, case.path);
        assert_eq!(status, case.status, "{what}: {body}");
        for piece in case.says {
            assert!(body.contains(piece), "{what}: {piece:?} not in {body}");
        }
        let seen = recorder.requests()[seen_before..].to_vec();
        match case.member {
            Member::Untouched => assert!(seen.is_empty(), "{what}: the member got {seen:?}"),
            Member::Saw { line, acting_as } => {
                assert_eq!(seen.len(), 1, "{what}: the member got {seen:?}");
                let head = &seen[0].head;
                assert_eq!(head.lines().next(), Some(line), "{what}: {head}");
                assert_eq!(
                    field(head, "impersonate-user"),
                    [acting_as],
                    "{what}: {head}"
                );
                // The member hears the gateway's credentials, never the client's.
                assert_eq!(
                    field(head, "authorization"),
                    ["Bearer gateway-token"],
                    "{what}: {head}"
                );
                if !case.body.is_empty() {
                    let got = String::from_utf8_lossy(&seen[0].body);
                    assert!(got.contains(case.body), "{what}: the member got {got:?}");
                }
            }
        }
    }
}

/// The simulated fleet with the recording member beside it, bob held to one request per
/// 1000 s, configmaps shared, and the fleet view over the two simulated members.
fn fleet_with_recorder() -> (Fleet, Upstream) {
    let fleet = Fleet::sim(2, 1);
    let recorder = fleet.runtime.block_on(Upstream::start());
    std::fs::write(
        fleet.fleet_path("clusters/recorder.yaml"),
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: recorder, labels: {{env: dev}}}}\n\
             spec:\n  server: http://{}/prefix\n  credentials: {{token: gateway-token}}\n  impersonation: true\n",
            recorder.address
        ),
    )
    .unwrap();
    let edit_yaml = |file: &str, edit: &dyn Fn(&mut serde_yaml::Mapping)| {
        let path = fleet.fleet_path(file);
        let mut object: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(object["spec"].as_mapping_mut().unwrap());
        std::fs::write(&path, serde_yaml::to_string(&object).unwrap()).unwrap();
    };
    edit_yaml("gateway.yaml", &|spec| {
        let fairness = "users: {bob: {rate: 0.001, burst: 1}}";
        let shared = "resources: [{group: '', version: v1, resource: configmaps}]";
        spec.insert("fairness".into(), serde_yaml::from_str(fairness).unwrap());
        spec.insert(
            "sharedWatches".into(),
            serde_yaml::from_str(shared).unwrap(),
        );
    });
    edit_yaml("fleet.yaml", &|spec| {
        let members = "names: [member1, member2]";
        spec.insert("clusters".into(), serde_yaml::from_str(members).unwrap());
    });
    (fleet, recorder)
}

#[test]
fn the_same_table_of_behaviour_holds_over_http1_and_h2() {
    let (mut fleet, recorder) = fleet_with_recorder();
    for h2 in [false, true] {
        // A fresh gateway for each protocol: the rows meet the same state.
        fleet.serve(&["--workers", "1"], None);
        if !h2 {
            // What the fleet LIST and the shared watch find on member1.
            let created = fleet.kubectl_ok(
                "member1",
                &["create", "configmap", "table-seed", "-n", "default"],
            );
            assert!(created.contains("table-seed"), "{created}");
        }
        run_table(&fleet, &recorder, h2);
        // The watch row was served from a shared watch, not proxied: its hub is open.
        let hubs = fleet.metric("fleetgate_shared_watches");
        assert_eq!(hubs, Some(1), "h2 {h2}: shared watches open");
    }
}
