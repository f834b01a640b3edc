//! konnectivity agents end to end: the simulated fleet's member2 made a `Tunnel` cluster that
//! keeps its CA (the gateway runs TLS to it) with `spec.tunnel.address` naming it as
//! `localhost:PORT`, a real `fleetgate serve` with a tunnel listener, and a konnectivity agent
//! written from the protocol's proto file (`tests/python/konnectivity/agent.py`, Python gRPC
//! with stubs generated at start) calling `AgentService.Connect` with member2's agent
//! certificate. Checked with kubectl as a user would: get and list, a watch, `logs -f`, exec
//! over WebSocket and SPDY. Also: an agent with the wrong certificate or identifiers refused, an
//! agent that refuses dials giving a 503 Status naming the cluster and its reason, a hostile
//! agent (packets for unknown connections, duplicate DIAL_RSPs, unknown types) that still
//! serves, an agent sending a message over the bound ended alone, a dropped agent failing its open watch, and a stalled reader closed alone while small
//! GETs through the same agent keep their latency.
//!
//! The agent needs `grpcio` and `grpcio-tools` (tests/python/requirements.txt) in the venv
//! `scripts/test` makes (`target/pyenv`, or `FLEETGATE_PYTHON`); without them these tests fail
//! saying so. Readiness is the agent's and gateway's `ready` lines, never a sleep; every address
//! is 127.0.0.1:0.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::fleet::{Fleet, KillOnDrop};
use support::pull::{
    assert_small_gets_keep_flowing, gateway_kubectl, issue_agent, kubectl_basics,
    serve_with_tunnel, spawn_lines, stalled_list,
};
use support::wait::{wait_for, LineReader};

/// The venv's Python with grpcio and grpcio-tools.
fn python() -> PathBuf {
    let python = std::env::var_os("FLEETGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/python")
        });
    let check = Command::new(&python)
        .args(["-c", "import grpc, grpc_tools"])
        .output();
    match check {
        Ok(out) if out.status.success() => python,
        _ => panic!(
            "{} cannot import grpc and grpc_tools: run scripts/test once (it installs \
             tests/python/requirements.txt into target/pyenv) or set FLEETGATE_PYTHON",
            python.display()
        ),
    }
}

fn agent_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/konnectivity/agent.py")
}

struct KonnFleet {
    fleet: Fleet,
    tunnel: SocketAddr,
}

/// A running test agent and its stdout lines.
struct Agent {
    _child: KillOnDrop,
    lines: LineReader,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl KonnFleet {
    fn start(objects: usize) -> KonnFleet {
        let mut fleet = Fleet::sim(2, objects);
        // member2: Tunnel, no server; its CA stays (the gateway's TLS to it), and its agent is
        // told to dial it by name.
        let path = fleet.fleet_path("clusters/member2.yaml");
        let mut cluster: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let spec = cluster["spec"].as_mapping_mut().unwrap();
        let server = spec.remove("server").unwrap().as_str().unwrap().to_owned();
        let port = server.rsplit(':').next().unwrap().trim_end_matches('/');
        spec.remove("connectMode");
        spec.insert("connectMode".into(), "Tunnel".into());
        let mut tunnel = serde_yaml::Mapping::new();
        tunnel.insert("address".into(), format!("localhost:{port}").into());
        spec.insert("tunnel".into(), tunnel.into());
        std::fs::write(&path, serde_yaml::to_string(&cluster).unwrap()).unwrap();
        std::fs::create_dir_all(fleet.fleet_path("agents")).unwrap();
        for name in ["member1", "member2"] {
            issue_agent(&fleet.fleet_path("agents"), name);
        }
        let tunnel = serve_with_tunnel(&mut fleet, &["--tunnel-wait-seconds", "1"]);
        KonnFleet { fleet, tunnel }
    }

    /// Starts the test agent with `cert_of`'s certificate and `extra` flags; returns it once it
    /// printed its first line (`ready ...` or `ended ...`).
    fn agent(&self, cert_of: &str, extra: &[&str]) -> (Agent, String) {
        let agents = self.fleet.fleet_path("agents");
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.fleet.path(&format!("agent-{n}.log"));
        let mut child = KillOnDrop(
            Command::new(python())
                .arg(agent_script())
                .arg("--gateway")
                .arg(self.tunnel.to_string())
                .arg("--ca")
                .arg(self.fleet.fleet_path("pki/gateway-ca.crt"))
                .arg("--cert")
                .arg(agents.join(format!("agent-{cert_of}.crt")))
                .arg("--key")
                .arg(agents.join(format!("agent-{cert_of}.key")))
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let mut lines = LineReader::new(child.stdout.take().unwrap());
        let Some((_, first)) = lines.next_matching(Duration::from_secs(60), |l| {
            l.starts_with("ready") || l.starts_with("ended")
        }) else {
            panic!(
                "the agent printed neither ready nor ended:\n{}\ngateway:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                self.fleet.log_tail(30)
            );
        };
        (
            Agent {
                _child: child,
                lines,
                log,
            },
            first,
        )
    }

    /// member2's agent, connected.
    fn member2_agent(&self, extra: &[&str]) -> Agent {
        let (agent, first) = self.agent("member2", extra);
        assert!(
            first.starts_with("ready") && first.contains("serverCount=1"),
            "{first}\n{}",
            agent.log()
        );
        agent
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        gateway_kubectl(&self.fleet, "member2", args)
    }

    fn spawn_lines(&self, args: &[&str]) -> (KillOnDrop, LineReader) {
        spawn_lines(&self.fleet, "member2", args, &[])
    }

    fn ok(&self, args: &[&str]) -> String {
        self.fleet.kubectl_ok("member2", args)
    }

    /// A GET of `path` as `admin`; the whole response.
    fn admin_get(&self, path: &str) -> String {
        self.fleet.https_get(path)
    }
}

#[test]
fn kubectl_works_through_a_konnectivity_agent() {
    let konn = KonnFleet::start(20);
    let mut agent = konn.member2_agent(&[
        "--agent-id",
        "member2-agent-0",
        "--identifiers",
        "host=member2",
    ]);
    assert_eq!(
        konn.fleet
            .metric("fleetgate_tunnel_agents{cluster=\"member2\"}"),
        Some(1)
    );

    // get and list (the member's own objects), watch, logs -f, exec over WebSocket and SPDY.
    let through = kubectl_basics(&konn.fleet, "member2", "through konnectivity");
    // Its member connections count in the cluster's tunnel metrics, as a fleetgate agent's do.
    let metric = |series: &str| konn.fleet.metric(series).unwrap_or(0);
    assert!(metric("fleetgate_tunnel_streams_opened_total{cluster=\"member2\"}") >= 1);
    assert!(
        metric("fleetgate_tunnel_bytes_total{cluster=\"member2\",direction=\"from_member\"}")
            > through.len() as i64
    );
    // The agent dialed what the Cluster says.
    agent
        .lines
        .wait_line("the agent's dial", Duration::from_secs(5), |l| {
            l.starts_with("dial localhost:")
        });

    // The direct member beside it is untouched.
    assert!(konn
        .fleet
        .kubectl_ok("member1", &["get", "ns"])
        .contains("dev"));

    // The agent dropped during a watch: the watch ends, the tunnel leaves the registry and a
    // request gets the 503 naming the cluster.
    let (mut watch, mut events) = konn.spawn_lines(&["get", "namespaces", "-w"]);
    events.wait_line("the watch's first event", Duration::from_secs(30), |l| {
        l.contains("dev")
    });
    drop(agent);
    wait_for(
        "the watch to end with the agent",
        Duration::from_secs(20),
        || matches!(watch.try_wait(), Ok(Some(_))),
    );
    let answer = konn.admin_get("/clusters/member2/api/v1/namespaces");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("member2") && answer.contains("no agent"),
        "{answer}"
    );
    let log = konn.fleet.log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn wrong_refusing_and_hostile_konnectivity_agents() {
    let konn = KonnFleet::start(5);

    // member1's certificate: member1 is a Direct cluster. The agent is told why.
    let (_a, first) = konn.agent("member1", &[]);
    assert!(
        first.starts_with("ended PERMISSION_DENIED") && first.contains("not a Tunnel cluster"),
        "{first}"
    );
    // member2's certificate, identifiers naming another cluster of the gateway.
    let (_b, first) = konn.agent(
        "member2",
        &["--identifiers", "host=4d2a9c&host=member1&host=member1.ns"],
    );
    assert!(
        first.starts_with("ended PERMISSION_DENIED")
            && first.contains("name cluster \"member1\", not the cluster \"member2\""),
        "{first}"
    );
    // No agentID.
    let (_c, first) = konn.agent("member2", &["--agent-id", ""]);
    assert!(
        first.starts_with("ended PERMISSION_DENIED") && first.contains("agentID"),
        "{first}"
    );
    // A user's certificate (the client CA, not the agent CA): no handshake.
    std::fs::copy(
        konn.fleet.fleet_path("users/admin.crt"),
        konn.fleet.fleet_path("agents/agent-user.crt"),
    )
    .unwrap();
    std::fs::copy(
        konn.fleet.fleet_path("users/admin.key"),
        konn.fleet.fleet_path("agents/agent-user.key"),
    )
    .unwrap();
    let (_d, first) = konn.agent("user", &[]);
    assert!(first.starts_with("ended UNAVAILABLE"), "{first}");
    assert_eq!(
        konn.fleet
            .metric("fleetgate_tunnel_agents{cluster=\"member2\"}"),
        Some(0)
    );

    // An agent that cannot dial: a 503 Status naming the cluster and the agent's reason.
    let refusing = konn.member2_agent(&["--refuse-dials", "dial tcp: connect: no route to host"]);
    let answer = konn.admin_get("/clusters/member2/api/v1/namespaces");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("\\\"member2\\\"") || answer.contains("member2"),
        "{answer}"
    );
    assert!(answer.contains("no route to host"), "{answer}");
    drop(refusing);
    wait_for(
        "the refusing agent to leave",
        Duration::from_secs(10),
        || {
            konn.fleet
                .metric("fleetgate_tunnel_agents{cluster=\"member2\"}")
                == Some(0)
        },
    );

    // A hostile agent: DATA, CLOSE_RSP and DIAL_RSP for connections that do not exist, an
    // unknown packet type, a DIAL_REQ, a duplicate DIAL_RSP for every dial and a DATA for an
    // unknown connection after every real one. It still serves, and kubectl sees nothing.
    // With identifiers as OCM's cluster-proxy sets them (a hashed service-proxy host, the
    // cluster and its namespaced name, an exposed service): accepted.
    let _hostile = konn.member2_agent(&[
        "--hostile",
        "--identifiers",
        "host=cluster-proxy-5f3a&host=member2&host=member2.open-cluster-management-agent-addon&host=svc.ns",
    ]);
    for _ in 0..5 {
        assert!(konn.ok(&["get", "ns", "dev"]).contains("dev"));
    }
    let out = konn
        .kubectl(&["exec", "hello", "-n", "default", "--", "echo", "still"])
        .output()
        .unwrap();
    assert_eq!(
        out.stdout,
        b"still\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A message over the gateway's 1 MiB bound ends that agent's session alone, telling it why.
    let (mut oversized, _) = konn.agent("member2", &["--oversized"]);
    let ended =
        oversized
            .lines
            .wait_line("the oversized agent's end", Duration::from_secs(20), |l| {
                l.starts_with("ended")
            });
    assert!(
        ended.starts_with("ended INTERNAL") && ended.contains("limit is 1048576"),
        "{ended}"
    );
    assert!(konn.ok(&["get", "ns", "dev"]).contains("dev"));

    // Garbage on the h2 ALPN: not gRPC at all.
    let config = support::fleet::tls_config_as(
        &konn.fleet.fleet_path(""),
        "agents/agent-member2.crt",
        "agents/agent-member2.key",
        b"h2",
    );
    let tcp = TcpStream::connect(konn.tunnel).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let conn = rustls::ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
    let mut garbage = rustls::StreamOwned::new(conn, tcp);
    let _ = garbage.write_all(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x08\x00\x00\x00\x00\x00\xff\xff\xff\xff",
    );
    let _ = garbage.read_to_end(&mut Vec::new());

    // None of it hurt the gateway or the hostile agent's tunnel.
    assert!(konn.ok(&["get", "ns"]).contains("dev"));
    assert!(konn
        .fleet
        .kubectl_ok("member1", &["get", "ns"])
        .contains("dev"));
    let log = konn.fleet.log();
    assert!(!log.contains("panicked"), "{log}");
    // The hostile packets did reach the session, which dropped them.
    assert!(log.contains("DATA for no open connection"), "{log}");
    assert!(log.contains("a DIAL_RSP no dial waits for"), "{log}");
}

#[test]
fn a_stalled_reader_is_closed_alone_and_the_others_keep_flowing() {
    // About 15 MB of ConfigMaps in member2: far more than a connection's unread bound and the
    // socket buffers on the way.
    let konn = KonnFleet::start(12000);
    let _agent = konn.member2_agent(&[]);
    konn.ok(&["get", "ns"]);

    // A client that asks for the big LIST, reads its first bytes and stops reading.
    let (mut stalled, mut total) = stalled_list(konn.fleet.dir(), konn.fleet.https(), "member2");

    // Small GETs through the same agent keep their latency while it stalls.
    assert_small_gets_keep_flowing(|args| konn.ok(args));

    // The stalled connection is closed once its reader is 4 MiB behind, and that alone: its
    // client gets a cut body, not a hang.
    wait_for(
        "the stalled connection to be closed",
        Duration::from_secs(30),
        || {
            konn.fleet
                .log()
                .contains("closing a connection whose reader stopped taking data")
        },
    );
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    total += rest.len();
    let whole = konn.admin_get("/clusters/member2/api/v1/configmaps");
    assert!(
        whole.starts_with("HTTP/1.1 200"),
        "{}",
        &whole[..whole.len().min(300)]
    );
    assert!(
        total < whole.len() && whole.len() > 8_000_000,
        "{total} bytes of the stalled body, {} of a whole one",
        whole.len()
    );
    assert!(konn.ok(&["get", "ns", "dev"]).contains("dev"));
}
