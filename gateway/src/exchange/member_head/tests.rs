//! The member's request head as the member reads it: the exact bytes the gateway writes for a
//! client's request (path prefix, `Host`, end-to-end fields, framing, `X-Forwarded-For`, the
//! gateway's credential and impersonation), what it drops (hop-by-hop fields and those the
//! client's `Connection` names, a client's `Impersonate-*` and `X-Remote-*`), and a service's
//! head, which carries no credential or identity.
use super::*;

#[test]
fn connection_may_not_name_framing_routing_or_identity_fields() {
    for bad in [
        "content-length",
        "Transfer-Encoding",
        "close, Content-Length",
        "host",
        "Authorization",
        "impersonate-user",
        "Impersonate-Extra-Scopes",
        "X-Remote-User",
        "x-remote-group",
    ] {
        assert!(
            check_connection(std::iter::once(bad.as_bytes())).is_err(),
            "{bad} accepted"
        );
    }
    assert!(matches!(
        check_connection(
            ["keep-alive", "Upgrade, close", "TE"]
                .iter()
                .map(|s| s.as_bytes())
        ),
        Ok(false)
    ));
    assert!(matches!(
        check_connection(std::iter::once(&b"keep-alive, X-Custom"[..])),
        Ok(true)
    ));
}

/// A service's head carries no credential or identity on any kind of cluster, where the
/// member's head of the same cluster carries the gateway's (or, PassThrough, the client's).
#[test]
fn a_service_gets_no_credential_or_identity_on_any_cluster() {
    let table = crate::testing::test_table(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: imp}\n\
         spec: {mode: Tunnel, credentials: {token: gateway-secret}}\n---\n\
         apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: pt}\n\
         spec: {mode: Tunnel, authMode: PassThrough}\n",
    );
    let identity = ClientIdentity {
        user: "alice".into(),
        groups: vec!["devs".into()],
        ..ClientIdentity::default()
    };
    let client: [(&[u8], &[u8]); 5] = [
        (b"Authorization", b"Bearer client-secret"),
        (b"Impersonate-User", b"root"),
        (b"X-Remote-User", b"root"),
        (b"x-remote-group", b"system:masters"),
        (b"X-Custom", b"kept"),
    ];
    let service = crate::tunnel::wire::ServiceRef::parse("team-a/echo:8080").unwrap();
    for name in ["imp", "pt"] {
        let cluster = table.cluster(name).unwrap();
        let head = |service| {
            let mut out = Vec::new();
            write(
                &mut out,
                cluster,
                &MemberRequest {
                    method: b"GET",
                    http10: false,
                    rest: b"/x",
                    query: b"?q=1",
                    body: BodyKind::Empty,
                    peer: b"10.0.0.9",
                    identity: Some(&identity),
                    upgrade: Upgrade::None,
                    service,
                },
                || client.iter().copied(),
                |_| false,
            );
            String::from_utf8(out).unwrap().to_ascii_lowercase()
        };
        let to_service = head(Some(service));
        assert!(
            to_service.starts_with("get /x?q=1 http/1.1\r\n"),
            "{to_service}"
        );
        assert!(
            to_service.contains("host: echo.team-a.svc:8080\r\n"),
            "{to_service}"
        );
        assert!(to_service.contains("x-custom: kept\r\n"), "{to_service}");
        for secret in [
            "authorization",
            "impersonate-",
            "x-remote-",
            "secret",
            "alice",
        ] {
            assert!(
                !to_service.contains(secret),
                "{name}: {secret} in {to_service}"
            );
        }
        // The member's own head, for contrast: its credential is there.
        let to_member = head(None);
        let credential = if name == "pt" {
            "client-secret"
        } else {
            "gateway-secret"
        };
        assert!(to_member.contains(credential), "{name}: {to_member}");
    }
}

/// A direct cluster behind a path prefix, with the gateway's token, impersonating (the default),
/// and a PassThrough one.
fn member_table() -> fleetgate_config_watcher::RouteTable {
    crate::testing::test_table(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: imp}\n\
         spec: {server: \"https://member.example:6443/prefix\", insecureSkipTLSVerify: true, credentials: {token: gw-token}}\n\
         ---\n\
         apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: pt}\n\
         spec: {server: \"https://member.example:6443\", insecureSkipTLSVerify: true, authMode: PassThrough}\n",
    )
}

/// The head `cluster`'s member reads for a client's `POST /api/v1/pods?watch=1` with `headers`,
/// from 10.0.0.9, as `identity`.
fn member_head(
    cluster: &ClusterRoute,
    body: BodyKind,
    identity: Option<&ClientIdentity>,
    headers: &[(&str, &str)],
    upgrade: Upgrade,
) -> String {
    let mut connection_named: Vec<Vec<u8>> = Vec::new();
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("connection") {
            check_connection(std::iter::once(value.as_bytes())).unwrap();
            connection_named.extend(value.split(',').map(|t| t.trim().as_bytes().to_vec()));
        }
    }
    let mut out = b"left over from the last request".to_vec();
    write(
        &mut out,
        cluster,
        &MemberRequest {
            method: b"POST",
            http10: false,
            rest: b"/api/v1/pods",
            query: b"?watch=1",
            body,
            peer: b"10.0.0.9",
            identity,
            upgrade,
            service: None,
        },
        || headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
        |name| {
            connection_named
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name))
        },
    );
    String::from_utf8(out).unwrap()
}

fn alice() -> ClientIdentity {
    ClientIdentity {
        user: "alice".into(),
        groups: vec!["devs".into(), "system:authenticated".into()],
        uid: Some("42".into()),
        extra: vec![("scopes.example/x y".into(), vec!["a".into(), "b".into()])],
    }
}

#[test]
fn the_member_reads_the_gateways_framing_credential_and_impersonation_only() {
    let table = member_table();
    let head = member_head(
        table.cluster("imp").unwrap(),
        BodyKind::Length(5),
        Some(&alice()),
        &[
            ("Host", "gateway.example"),
            ("Content-Type", "application/json"),
            ("Content-Length", "999"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "this hop only"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Authorization", "Basic cHJveHk="),
            ("Expect", "100-continue"),
            ("TE", "trailers"),
            ("Authorization", "Bearer client-token"),
            ("Impersonate-User", "root"),
            ("impersonate-group", "system:masters"),
            ("X-Remote-User", "root"),
            ("X-Forwarded-For", "192.0.2.1"),
            ("Accept", "application/json"),
        ],
        Upgrade::None,
    );
    assert_eq!(
        head,
        "POST /prefix/api/v1/pods?watch=1 HTTP/1.1\r\n\
         Host: member.example:6443\r\n\
         Content-Type: application/json\r\n\
         Accept: application/json\r\n\
         Content-Length: 5\r\n\
         X-Forwarded-For: 192.0.2.1, 10.0.0.9\r\n\
         Authorization: Bearer gw-token\r\n\
         Impersonate-User: alice\r\n\
         Impersonate-Group: devs\r\n\
         Impersonate-Group: system:authenticated\r\n\
         Impersonate-Uid: 42\r\n\
         Impersonate-Extra-scopes.example%2Fx%20y: a\r\n\
         Impersonate-Extra-scopes.example%2Fx%20y: b\r\n\
         \r\n"
    );
}

#[test]
fn a_passthrough_member_reads_the_clients_own_credential_and_impersonation() {
    let table = member_table();
    let head = member_head(
        table.cluster("pt").unwrap(),
        BodyKind::Chunked,
        Some(&alice()),
        &[
            ("Authorization", "Bearer client-token"),
            ("Impersonate-User", "bob"),
            ("X-Remote-User", "root"),
            ("X-Remote-Extra-Scopes", "all"),
        ],
        Upgrade::None,
    );
    assert_eq!(
        head,
        "POST /api/v1/pods?watch=1 HTTP/1.1\r\n\
         Host: member.example:6443\r\n\
         Authorization: Bearer client-token\r\n\
         Impersonate-User: bob\r\n\
         Transfer-Encoding: chunked\r\n\
         X-Forwarded-For: 10.0.0.9\r\n\
         \r\n"
    );
}

#[test]
fn an_upgrade_is_asked_of_the_member_on_this_hop() {
    let table = member_table();
    let cluster = table.cluster("imp").unwrap();
    let spdy = member_head(
        cluster,
        BodyKind::Empty,
        None,
        &[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ],
        Upgrade::FromClient,
    );
    assert_eq!(
        spdy,
        "POST /prefix/api/v1/pods?watch=1 HTTP/1.1\r\n\
         Host: member.example:6443\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
         X-Forwarded-For: 10.0.0.9\r\n\
         Authorization: Bearer gw-token\r\n\
         Connection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\n\
         \r\n"
    );
    // An h2 client's WebSocket (RFC 8441) gets the handshake fields it never sends.
    let websocket = member_head(cluster, BodyKind::Empty, None, &[], Upgrade::WebSocket);
    let (head, key) = websocket.split_once("Sec-WebSocket-Key: ").unwrap();
    assert!(
        head.ends_with(
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        ),
        "{websocket}"
    );
    let key = key.strip_suffix("\r\n\r\n").unwrap();
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    assert_eq!(key.len(), 16);
}
