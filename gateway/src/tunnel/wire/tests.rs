//! The wire format's round trips and the hostile inputs each end refuses: bytes in, bytes out
//! (scripted readers, an in-memory pipe for h2), no socket, no sleep.

use super::*;
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;

/// Runs `future` on a current-thread tokio runtime without I/O drivers or timers.
fn run<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread().build();
    runtime.expect("runtime").block_on(future)
}

#[test]
fn hello_round_trip_and_hostile_lines() {
    let line = hello("member-1");
    assert_eq!(parse_hello(line.trim_end().as_bytes()), Ok("member-1"));
    for bad in crate::testing::byte_cases("tunnel-hello-refused") {
        assert!(parse_hello(&bad).is_err(), "{bad:?}");
    }
    assert_eq!(printable("a\r\nb\u{7f}c é"), "abc ");
}

#[test]
fn stream_targets_round_trip() {
    assert_eq!(parse_stream_path("/member"), Ok(StreamTarget::Member));
    let service = ServiceRef::parse("team-a/echo:8080").unwrap();
    assert_eq!(service.to_string(), "team-a/echo:8080");
    assert_eq!(service.in_cluster_address(), "echo.team-a.svc:8080");
    let uri: http::Uri = service_uri(&service).parse().unwrap();
    assert_eq!(
        parse_stream_path(uri.path()),
        Ok(StreamTarget::Service(service))
    );
    assert_eq!(
        STREAM_URI.parse::<http::Uri>().unwrap().path(),
        target::MEMBER_PATH
    );
}

#[test]
fn hostile_stream_paths_are_refused() {
    let long = "a".repeat(64);
    let long_path = format!("/service/{long}/echo/80");
    for bad in [
        "",
        "/",
        "/member/",
        "/member?x",
        "/members",
        "/MEMBER",
        "/service",
        "/service/",
        "/service/ns",
        "/service/ns/echo",
        "/service/ns/echo/",
        "/service/ns/echo/80/",
        "/service/ns/echo/80/x",
        "/service/ns/echo/80?x=1",
        "/service//echo/80",
        "/service/ns//80",
        "/service/../echo/80",
        "/service/ns/../80",
        "/service/ns/echo%2F/80",
        "/service/Ns/echo/80",
        "/service/-ns/echo/80",
        "/service/ns-/echo/80",
        "/service/ns/ec.ho/80",
        "/service/ns/echo/0",
        "/service/ns/echo/080",
        "/service/ns/echo/65536",
        "/service/ns/echo/99999",
        "/service/ns/echo/123456",
        "/service/ns/echo/+80",
        "/service/ns/echo/-1",
        "/service/ns/echo/http",
        "/service/ns/echo/8 0",
        "/service/ns/\u{e9}cho/80",
        long_path.as_str(),
    ] {
        assert!(parse_stream_path(bad).is_err(), "{bad:?} accepted");
    }
    assert!(parse_stream_path("/service/ns/echo/65535").is_ok());
    assert!(parse_stream_path(&format!("/service/{}/e/1", "a".repeat(63))).is_ok());
}

#[test]
fn allow_service_specs_are_strict() {
    for bad in [
        "",
        "ns",
        "ns/echo",
        "ns/echo:",
        "/echo:80",
        "ns/:80",
        "ns/echo:0",
        "ns/echo:x",
        "ns/echo:80:81",
        "ns/a/echo:80",
        "NS/echo:80",
        "ns/echo:80 ",
    ] {
        assert!(ServiceRef::parse(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(ServiceRef::parse("a/b:1").unwrap().port, 1);
}

#[test]
fn lines_are_read_up_to_their_newline_and_no_further() {
    let mut script: &[u8] = b"FLEETGATE-TUNNEL/1 edge-1\nPRI * HTTP/2.0";
    let line = run(read_line(&mut script)).unwrap();
    assert_eq!(parse_hello(&line), Ok("edge-1"));
    // The h2 preface after the line is left for h2.
    assert_eq!(script, b"PRI * HTTP/2.0");
    // The longest line accepted, and one byte more.
    let longest = [vec![b'a'; MAX_HELLO], b"\n".to_vec()].concat();
    assert_eq!(run(read_line(&mut &longest[..])).unwrap().len(), MAX_HELLO);
    let longer = [vec![b'a'; MAX_HELLO + 1], b"\n".to_vec()].concat();
    assert!(matches!(
        run(read_line(&mut &longer[..])),
        Err(LineError::TooLong)
    ));
    // A stranger that never sends `\n` is cut at the bound, not read to its end.
    let endless = vec![b'x'; 1 << 20];
    let mut rest = &endless[..];
    assert!(matches!(run(read_line(&mut rest)), Err(LineError::TooLong)));
    assert!(rest.len() >= endless.len() - MAX_HELLO - 1);
    for cut in [&b""[..], b"FLEETGATE-TUNNEL/1 edge"] {
        assert!(matches!(
            run(read_line(&mut &cut[..])),
            Err(LineError::Ended(_))
        ));
    }
}

#[test]
fn hello_answers_round_trip() {
    assert_eq!(HelloAnswer::Ok.line(), HELLO_OK);
    for answer in [
        HelloAnswer::Ok,
        HelloAnswer::Refused("cluster \"edge-2\" is not a Tunnel cluster of this gateway".into()),
    ] {
        let line = answer.line();
        let read = run(read_line(&mut line.as_bytes())).unwrap();
        assert_eq!(HelloAnswer::parse(&read), answer);
    }
    // A reason cannot smuggle a second line or control bytes to the agent's log.
    let sneaky = HelloAnswer::Refused("no\r\nOK\u{1b}[2J".into()).line();
    assert_eq!(sneaky, "REFUSED noOK[2J\n");
    // Whatever else comes back is a refusal that says what it was, printable.
    for (line, reason) in [
        (&b"OK "[..], "OK "),
        (b"ok", "ok"),
        (b"", ""),
        (b"HTTP/1.1 400 Bad Request", "HTTP/1.1 400 Bad Request"),
        (b"REFUSED \xff\x00why", "why"),
    ] {
        assert_eq!(
            HelloAnswer::parse(line),
            HelloAnswer::Refused(reason.into()),
            "{line:?}"
        );
    }
}

#[test]
fn stream_requests_and_answers_round_trip() {
    let service = ServiceRef::parse("team-a/echo:8080").unwrap();
    for (uri, target) in [
        (STREAM_URI.to_owned(), StreamTarget::Member),
        (service_uri(&service), StreamTarget::Service(service)),
    ] {
        let request = stream_request(&uri).unwrap();
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(parse_stream_path(request.uri().path()), Ok(target));
    }
    assert_eq!(
        StreamAnswer::read(&http::Response::new(())),
        StreamAnswer::Open
    );
    let forbidden = refusal(
        http::StatusCode::FORBIDDEN,
        "service b/web:81 is not allowed",
    );
    assert_eq!(StreamAnswer::read(&forbidden), StreamAnswer::Forbidden);
    let failed = refusal(
        http::StatusCode::BAD_GATEWAY,
        "connecting to 10.0.0.1:443: connection refused\r\nx-injected: 1",
    );
    assert_eq!(failed.headers().len(), 1);
    assert_eq!(
        StreamAnswer::read(&failed),
        StreamAnswer::Refused("connecting to 10.0.0.1:443: connection refusedx-injected: 1".into())
    );
    // An answer without a reason (an agent of another version, say) still says its status.
    let mut bare = http::Response::new(());
    *bare.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    assert_eq!(
        StreamAnswer::read(&bare),
        StreamAnswer::Refused("the agent answered 503 Service Unavailable".into())
    );
}

#[test]
fn the_agent_subject_names_one_cluster_and_the_agents_organization() {
    let issue = |names: &[&str], organization: Option<&str>| {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for name in names {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, *name);
        }
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, organization);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    };
    let agent = AgentSubject::parse(&issue(&["edge-1"], Some(AGENT_ORGANIZATION))).unwrap();
    assert_eq!(agent.cluster(), Ok("edge-1"));
    let user = AgentSubject::parse(&issue(&["edge-1"], Some("system:masters"))).unwrap();
    assert!(user.cluster().unwrap_err().contains("not an agent's"));
    let none = AgentSubject::parse(&issue(&[], Some(AGENT_ORGANIZATION))).unwrap();
    assert!(none.cluster().is_err());
    assert_eq!(AgentSubject::parse(b"not a certificate"), None);
    assert_eq!(AgentSubject::parse(&[]), None);
}

/// One end of a pipe whose peer sent `bytes` and then shut its writing side (the peer is
/// returned so that what this end writes still has somewhere to go).
async fn fed(bytes: &[u8]) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
    let (ours, mut peer) = tokio::io::duplex(4096);
    peer.write_all(bytes).await.unwrap();
    peer.shutdown().await.unwrap();
    (ours, peer)
}

#[test]
fn either_end_fed_garbage_instead_of_h2_fails_without_a_panic() {
    run(async {
        for garbage in [
            &b"HTTP/1.1 200 OK\r\n\r\n"[..],
            b"\x00\x00\x12\x04\x00\x00\x00\x00\x00",
            &[0xff; 64],
        ] {
            let (gateway, _agent) = fed(garbage).await;
            let (_send, connection) = gateway_h2(gateway).await.unwrap();
            assert!(connection.await.is_err(), "{garbage:?}");
        }
        for garbage in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff",
        ] {
            let (agent, _gateway) = fed(garbage).await;
            // The preface may pass; no stream does.
            if let Ok(mut connection) = agent_h2(agent).await {
                let stream = connection.accept().await;
                assert!(!matches!(stream, Some(Ok(_))), "{garbage:?}");
            }
        }
    })
}

proptest! {
    #[test]
    fn no_bytes_make_a_parser_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_hello(&bytes);
        let _ = HelloAnswer::parse(&bytes);
        let _ = AgentSubject::parse(&bytes);
        let _ = run(read_line(&mut &bytes[..]));
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = parse_stream_path(text);
            let _ = ServiceRef::parse(text);
            prop_assert!(printable(text).len() <= 200);
        }
    }
}
