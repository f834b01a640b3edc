//! Services through the gateway, as OCM's service-proxy serves them: the simulated fleet with
//! services whose backends are small HTTP servers of this test (each echoes the method, path,
//! query, header fields and body it got, as JSON, and counts the connections it accepted),
//! member2 in pull mode behind a real `fleetgate agent` that allows one of them.
//!
//! Checked as a user would: `kubectl get --raw` of the apiserver's service proxy path on a direct
//! and a pull-mode member; the gateway's direct service path (`/clusters/member2/services/...`)
//! to the allowed service (the backend gets the path, query and body, never the client's
//! credentials, impersonation or `X-Remote-*`; kept streams serve later requests; a WebSocket
//! upgrade spliced both ways, on this path and through the apiserver's proxy); a service the agent does not allow (a 403 naming it, its backend
//! never dialed); a user without `proxy` refused on both paths; the direct path on a direct
//! member (a 404); and hostile paths refused with a 4xx while the gateway keeps serving.
//!
//! Readiness is the `ready` lines of the sim, the gateway and the agent; every address is
//! 127.0.0.1:0; no sleeps.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use support::fleet::{fleetgate_binary, Fleet};
use support::kubectl::kubectl_command;
use support::pull::{
    agent_command, issue_agent, make_pull_mode, serve_with_tunnel, Agent, AgentSetup,
};

/// A backend: an HTTP/1.1 server on 127.0.0.1:0 answering each request with what it got, as
/// JSON; `Upgrade` requests get a 101 and their bytes echoed. Counts its connections.
struct Backend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Backend {
    fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve_backend(conn));
            }
        });
        Backend { addr, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// One backend connection: requests until the peer closes; an upgrade ends HTTP on it.
fn serve_backend(conn: TcpStream) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut headers = Vec::new();
        let mut length = 0usize;
        let mut upgrade = false;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            let (name, value) = (name.to_ascii_lowercase(), value.trim().to_owned());
            if name == "content-length" {
                length = value.parse().unwrap_or(0);
            }
            upgrade |= name == "upgrade";
            headers.push(serde_json::json!([name, value]));
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        if upgrade {
            let _ = writer.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            );
            // Echo whatever comes (what the reader holds first) until the peer closes.
            let held = reader.buffer().to_vec();
            let _ = writer.write_all(&held);
            let mut raw = reader.into_inner();
            let mut buf = [0u8; 4096];
            while let Ok(n) = raw.read(&mut buf) {
                if n == 0 || writer.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            return;
        }
        let answer = serde_json::json!({
            "method": method,
            "path": path,
            "query": query,
            "headers": headers,
            "body": String::from_utf8_lossy(&body),
        })
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if writer.write_all(head.as_bytes()).is_err()
            || writer.write_all(answer.as_bytes()).is_err()
        {
            return;
        }
    }
}

/// The header fields an echoed request had, lower-cased names.
fn echoed_headers(echo: &serde_json::Value) -> Vec<(String, String)> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_owned(),
                h[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// No credential, impersonation or request-header identity reached the backend.
fn assert_no_identity(echo: &serde_json::Value) {
    for (name, value) in echoed_headers(echo) {
        assert!(
            name != "authorization"
                && !name.starts_with("impersonate-")
                && !name.starts_with("x-remote-"),
            "the backend got {name}: {value}"
        );
    }
}

/// The fleet: services `team-a/echo:8080` (backend `echo`), `team-a/other:9090` (backend
/// `other`) and `team-a/idle:80` (no backend) in every member; member2 pull-mode behind an
/// agent that allows only `team-a/echo:8080`; bob may read services in team-a on member2, but
/// not proxy to them.
struct ServiceFleet {
    fleet: Fleet,
    echo: Backend,
    other: Backend,
    /// Its log is read for the service streams it opened.
    agent: Agent,
}

impl ServiceFleet {
    fn start() -> ServiceFleet {
        let echo = Backend::start();
        let other = Backend::start();
        let services = [
            format!("team-a/echo:8080={}", echo.addr),
            format!("team-a/other:9090={}", other.addr),
            "team-a/idle:80".to_owned(),
        ];
        let mut extra = Vec::new();
        for service in &services {
            extra.extend(["--service", service.as_str()]);
        }
        let mut fleet = Fleet::sim_with("", 2, 0, &extra);
        let member2 = make_pull_mode(&fleet, "member2");
        issue_agent(&fleet.fleet_path("agents"), "member2");
        let agents = fleet.fleet_path("agents");
        std::fs::write(
            fleet.fleet_path("bob-member2.yaml"),
            "apiVersion: fleetgate.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: bob-member2}\n\
             spec:\n  subjects: [{kind: User, name: bob}]\n  clusters: {names: [member2]}\n\
             \x20 rules: [{verbs: [get, list], resources: [services], namespaces: [team-a]}]\n",
        )
        .unwrap();
        let tunnel = serve_with_tunnel(&mut fleet, &[]);
        let setup = AgentSetup {
            cluster: "member2",
            identity: agents.join("agent-member2"),
            kube_server: &member2,
            kube_ca: agents.join("member2-kube-ca.crt"),
            log: fleet.path("agent.log"),
        };
        let mut command =
            agent_command(Command::new(fleetgate_binary()), &fleet, &[tunnel], &setup);
        command
            .arg("--allow-service")
            .arg(format!("team-a/echo:8080={}", echo.addr));
        let agent = Agent::start(command, &setup.log, || fleet.log_tail(30));
        ServiceFleet {
            fleet,
            echo,
            other,
            agent,
        }
    }

    /// `kubectl get --raw /clusters/CONTEXT/PATH` through the gateway as `user` (None: the
    /// context's admin): its exit status, stdout and stderr. (`--raw` takes an absolute path:
    /// the context server's `/clusters/NAME` is not put before it.)
    fn raw(&self, context: &str, user: Option<&str>, path: &str) -> (bool, String, String) {
        let path = format!("/clusters/{context}{path}");
        let mut cmd = kubectl_command(&self.fleet.gateway_kubeconfig(), context);
        if let Some(user) = user {
            cmd.args(["--user", user]);
        }
        let out = cmd
            .args(["--request-timeout", "20s", "get", "--raw", &path])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// What the backend echoed for `kubectl get --raw PATH` as the admin.
    fn echo(&self, context: &str, path: &str) -> serde_json::Value {
        let (ok, out, err) = self.raw(context, None, path);
        assert!(ok, "{context} {path}: {err}\n{}", self.fleet.log_tail(20));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
    }

    /// A TLS connection to the gateway as the fleet's `admin` (client certificate).
    fn admin_conn(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        self.fleet.admin_connection()
    }

    /// A GET of `path` as the admin on a new connection it closes; the whole response.
    fn get_once(&self, path: &str) -> String {
        let mut conn = self.admin_conn();
        write!(
            conn,
            "GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        answer
    }

    fn service_streams_opened(&self) -> usize {
        std::fs::read_to_string(&self.agent.log)
            .unwrap_or_default()
            .matches("service connection opened")
            .count()
    }
}

/// One response read off a keep-alive connection: its code, head and body (Content-Length
/// framing, as the gateway's Statuses and the echo backend's answers have).
fn read_response(reader: &mut impl BufRead) -> (u16, String, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "closed inside a head: {head}"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let code = head[9..12].parse().unwrap();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).unwrap();
    (code, head, String::from_utf8(body).unwrap())
}

#[test]
fn services_through_the_apiserver_path_and_the_direct_path() {
    let fleet = ServiceFleet::start();

    // The apiserver's own service proxy, on a direct and on a pull-mode member, in each of
    // kube's spellings of the service.
    for context in ["member1", "member2"] {
        for service in ["echo:8080", "echo", "http:echo:8080", "echo:port-8080"] {
            let path = format!("/api/v1/namespaces/team-a/services/{service}/proxy/some/path?x=1");
            let echo = fleet.echo(context, &path);
            assert_eq!(
                (
                    echo["method"].as_str(),
                    echo["path"].as_str(),
                    echo["query"].as_str()
                ),
                // kubectl adds its `timeout` (from --request-timeout) to the query.
                (Some("GET"), Some("/some/path"), Some("timeout=20s&x=1")),
                "{context} {service}: {echo}"
            );
            assert_no_identity(&echo);
        }
        // As kube: an unknown service is a 404, one without endpoints a 503.
        let (ok, _, err) = fleet.raw(
            context,
            None,
            "/api/v1/namespaces/team-a/services/nope:80/proxy/",
        );
        assert!(!ok && err.contains("not found"), "{err}");
        let (ok, _, err) = fleet.raw(
            context,
            None,
            "/api/v1/namespaces/team-a/services/idle:80/proxy/",
        );
        assert!(!ok && err.contains("no endpoints available"), "{err}");
    }

    // The direct service path of the pull-mode member, through its agent.
    let echo = fleet.echo("member2", "/services/team-a/echo:8080/some/path?x=1&y=%2F");
    assert_eq!(
        (
            echo["method"].as_str(),
            echo["path"].as_str(),
            echo["query"].as_str()
        ),
        (
            Some("GET"),
            Some("/some/path"),
            Some("timeout=20s&x=1&y=%2F")
        ),
        "{echo}"
    );
    assert_no_identity(&echo);
    assert!(
        echoed_headers(&echo)
            .iter()
            .any(|(n, v)| n == "host" && v == "echo.team-a.svc:8080"),
        "{echo}"
    );

    // The same path after the Karmada-compatible prefix.
    let answer = fleet.get_once(
        "/apis/cluster.karmada.io/v1alpha1/clusters/member2/proxy/services/team-a/echo:8080/karmada",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"path\":\"/karmada\""), "{answer}");

    // A POST with a body, a bearer token beside the certificate, and identity headers a
    // client may not pass on: the backend gets the body, and none of those.
    let mut conn = fleet.admin_conn();
    let body = "hello, service";
    write!(
        conn,
        "POST /clusters/member2/services/team-a/echo:8080/submit?k=v HTTP/1.1\r\nHost: gw\r\n\
         Authorization: Bearer not-for-the-backend\r\nX-Remote-User: mallory\r\n\
         X-Remote-Group: system:masters\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(conn);
    let (code, _, answer) = read_response(&mut reader);
    assert_eq!(code, 200, "{answer}");
    let echo: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        (
            echo["method"].as_str(),
            echo["path"].as_str(),
            echo["query"].as_str(),
            echo["body"].as_str()
        ),
        (Some("POST"), Some("/submit"), Some("k=v"), Some(body)),
        "{echo}"
    );
    assert_no_identity(&echo);

    // Hostile paths: each refused with a 4xx Status, on the same connection, which then
    // carries a good request again.
    let long = "a".repeat(300);
    let hostile = [
        "/clusters/member2/services".to_owned(),
        "/clusters/member2/services/team-a".to_owned(),
        "/clusters/member2/services/team-a/echo/x".to_owned(),
        "/clusters/member2/services/team-a/echo:/x".to_owned(),
        "/clusters/member2/services/team-a/echo:0/x".to_owned(),
        "/clusters/member2/services/team-a/echo:99999/x".to_owned(),
        "/clusters/member2/services/team-a/echo:http/x".to_owned(),
        "/clusters/member2/services/team-a/http:echo:8080/x".to_owned(),
        "/clusters/member2/services/team-a/:8080/x".to_owned(),
        "/clusters/member2/services/team-a/ec%68o:8080/x".to_owned(),
        "/clusters/member2/services/Team-A/echo:8080/x".to_owned(),
        format!("/clusters/member2/services/team-a/{long}:8080/x"),
        format!("/clusters/member2/services/{long}/echo:8080/x"),
    ];
    for path in &hostile {
        write!(reader.get_mut(), "GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n").unwrap();
        let (code, _, answer) = read_response(&mut reader);
        assert!((400..500).contains(&code), "{path}: {code} {answer}");
        assert!(answer.contains("\"kind\":\"Status\""), "{path}: {answer}");
    }
    write!(
        reader.get_mut(),
        "GET /clusters/member2/services/team-a/echo:8080/after HTTP/1.1\r\nHost: gw\r\n\r\n"
    )
    .unwrap();
    let (code, _, answer) = read_response(&mut reader);
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("\"/after\""), "{answer}");
    drop(reader);
    // Dot segments and encoded separators: refused by the path rule (which ends the
    // connection); the gateway serves the next one.
    for path in [
        "/clusters/member2/services/team-a/echo:8080/../../../api/v1/secrets",
        "/clusters/member2/services/team-a/../kube-system/echo:8080/x",
        "/clusters/member2/services/team-a%2Fecho:8080/x",
        "/clusters/member2/services/team-a/echo:8080/a%2F..%2Fb",
        "/clusters/member2/services//echo:8080/x",
    ] {
        let answer = fleet.get_once(path);
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
    }
    let after = fleet.echo("member2", "/services/team-a/echo:8080/still-serving");
    assert_eq!(after["path"], "/still-serving");

    // A service the agent does not allow: a 403 naming it, and its backend never dialed (its
    // Service exists and the apiserver path would reach it).
    let (ok, _, err) = fleet.raw("member2", None, "/services/team-a/other:9090/x");
    assert!(!ok, "{err}");
    assert!(
        err.contains("team-a/other:9090") && err.contains("--allow-service"),
        "{err}"
    );
    assert_eq!(
        fleet.other.connections(),
        0,
        "the not-allowed backend was dialed"
    );

    // A user whose policy grants `get` on services there but no `proxy` is refused by the
    // gateway on both paths.
    for path in [
        "/api/v1/namespaces/team-a/services/echo:8080/proxy/x",
        "/services/team-a/echo:8080/x",
    ] {
        let (ok, _, err) = fleet.raw("member2", Some("bob"), path);
        assert!(!ok && err.contains("forbidden"), "{path}: {err}");
        assert!(
            err.contains("cannot proxy resource \"services/proxy\""),
            "{path}: {err}"
        );
    }

    // The direct path on a direct member: a 404 saying where to go instead.
    let (ok, _, err) = fleet.raw("member1", None, "/services/team-a/echo:8080/x");
    assert!(!ok, "{err}");
    assert!(
        err.contains("pull-mode")
            && err.contains("/api/v1/namespaces/team-a/services/echo:8080/proxy/"),
        "{err}"
    );

    // Kept streams: twenty requests, each on a new client connection, open at most one stream
    // (and one backend connection) per shard.
    let streams = fleet.service_streams_opened();
    let backend = fleet.echo.connections();
    for i in 0..20 {
        let answer = fleet.get_once(&format!(
            "/clusters/member2/services/team-a/echo:8080/n/{i}"
        ));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(&format!("\"/n/{i}\"")), "{answer}");
    }
    let opened = fleet.service_streams_opened() - streams;
    assert!(opened <= 2, "{opened} service streams for 20 requests");
    assert!(fleet.echo.connections() - backend <= 2);

    // A WebSocket upgrade to the service, on the direct path and through the pull-mode
    // member's apiserver proxy: a 101, then bytes echoed both ways.
    websocket_echo(&fleet, "/clusters/member2/services/team-a/echo:8080/ws");
    websocket_echo(
        &fleet,
        "/clusters/member2/api/v1/namespaces/team-a/services/echo:8080/proxy/ws",
    );
}

/// Upgrades `path` to WebSocket as the admin and checks 100 KB come back as they went.
fn websocket_echo(fleet: &ServiceFleet, path: &str) {
    let mut conn = fleet.admin_conn();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: gw\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(conn);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{path}: {status}");
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
    reader.get_mut().write_all(&payload).unwrap();
    let mut echoed = vec![0u8; payload.len()];
    reader.read_exact(&mut echoed).unwrap();
    assert!(
        echoed == payload,
        "{path}: the upgraded stream's echo differs"
    );
}
