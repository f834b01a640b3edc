//! Pull mode end to end: the simulated fleet's member2 made a `Tunnel` cluster (no server in its
//! Cluster object), a real `fleetgate serve` with a tunnel listener, and a real `fleetgate agent`
//! child dialing it and carrying streams to member2's address. Checked with kubectl as a user
//! would: get and list, a watch, `logs -f`, exec and port-forward (WebSocket and SPDY); the
//! agent killed during a watch (the watch ends, a request without an agent gets a 503 naming the
//! cluster, a request made while the agent comes back waits for it; a shared watch instead
//! resumes on the new tunnel, its client seeing no break and every change once) and frozen (a half-open
//! tunnel noticed by PINGs), the gateway frozen (noticed by the agent, which dials again);
//! several agents of a cluster and an agent of several gateways; wrong certificates, no certificate and garbage refused at the tunnel
//! listener without harm to the gateway; and a big LIST whose client stops reading while small
//! GETs on the same tunnel keep their latency.
//!
//! Readiness is the `ready` lines (gateway and agent) and the agent's own log lines, never a
//! sleep; every address is 127.0.0.1:0.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::fleet::{client_tls_config, fleetgate_binary, Fleet, KillOnDrop};
use support::kubectl::PORT_FORWARD_HELLO;
use support::pull::{
    admin_get_at, agent_command, assert_small_gets_keep_flowing, exits_within, gateway_kubectl,
    issue_agent, kubectl_basics, make_pull_mode, serve_with_tunnel, signal, spawn_lines,
    stalled_list, Agent, AgentSetup,
};
use support::wait::{wait_for, LineReader};

/// The simulated fleet with member2 in pull mode and a gateway with a tunnel listener.
struct PullFleet {
    fleet: Fleet,
    /// member2's own address, where its agent carries streams.
    member2: String,
    tunnel: SocketAddr,
    agents_started: usize,
}

impl PullFleet {
    fn start(objects: usize, serve: &[&str]) -> PullFleet {
        PullFleet::start_configured(objects, serve, |_| {})
    }

    /// [`PullFleet::start`], the fleet's files changed by `configure` before the gateway starts.
    fn start_configured(
        objects: usize,
        serve: &[&str],
        configure: impl FnOnce(&Fleet),
    ) -> PullFleet {
        let mut fleet = Fleet::sim(2, objects);
        configure(&fleet);
        let member2 = make_pull_mode(&fleet, "member2");
        issue_agent(&fleet.fleet_path("agents"), "member2");
        issue_agent(&fleet.fleet_path("agents"), "member1");
        let tunnel = serve_with_tunnel(&mut fleet, serve);
        PullFleet {
            fleet,
            member2,
            tunnel,
            agents_started: 0,
        }
    }

    /// `fleetgate agent` for `cluster` with `cert_of`'s certificate, to this fleet's gateway.
    fn agent_command(&mut self, cluster: &str, cert_of: &str) -> (Command, std::path::PathBuf) {
        let tunnel = self.tunnel;
        self.agent_command_to(&[tunnel], cluster, cert_of)
    }

    /// `fleetgate agent` for `cluster` with `cert_of`'s certificate, to every tunnel listener
    /// in `gateways`.
    fn agent_command_to(
        &mut self,
        gateways: &[SocketAddr],
        cluster: &str,
        cert_of: &str,
    ) -> (Command, std::path::PathBuf) {
        self.agent_command_via(Command::new(fleetgate_binary()), gateways, cluster, cert_of)
    }

    /// [`Self::agent_command_to`], run by `launcher` (`fleetgate` or a command that runs it).
    fn agent_command_via(
        &mut self,
        launcher: Command,
        gateways: &[SocketAddr],
        cluster: &str,
        cert_of: &str,
    ) -> (Command, std::path::PathBuf) {
        self.agents_started += 1;
        let setup = AgentSetup {
            cluster,
            identity: self.fleet.fleet_path(&format!("agents/agent-{cert_of}")),
            kube_server: &self.member2,
            kube_ca: self.fleet.fleet_path("agents/member2-kube-ca.crt"),
            log: self
                .fleet
                .path(&format!("agent-{}.log", self.agents_started)),
        };
        let command = agent_command(launcher, &self.fleet, gateways, &setup);
        (command, setup.log)
    }

    /// Starts member2's agent and waits for its `ready` line.
    fn start_agent(&mut self) -> Agent {
        let tunnel = self.tunnel;
        self.start_agent_to(&[tunnel])
    }

    /// Starts member2's agent to every tunnel listener in `gateways` and waits for its `ready`
    /// line (printed once a tunnel to each is up).
    fn start_agent_to(&mut self, gateways: &[SocketAddr]) -> Agent {
        let (command, log) = self.agent_command_to(gateways, "member2", "member2");
        Agent::start(command, &log, || self.fleet.log_tail(30))
    }

    /// A second gateway (a replica) on the same configuration, its tunnel listener at
    /// `tunnel_listen`; its ready line.
    fn second_gateway(&self, tunnel_listen: &str) -> (KillOnDrop, support::fleet::ReadyLine) {
        let agent_ca = self.fleet.fleet_path("agents/agent-ca.crt");
        let config = self.fleet.dir().to_path_buf();
        let (second, ready) = support::fleet::spawn_serve(
            [
                "--config",
                config.to_str().unwrap(),
                "--workers",
                "1",
                "--tunnel-listen",
                tunnel_listen,
                "--agent-ca",
                agent_ca.to_str().unwrap(),
            ],
            &[],
            &self.fleet.path("gateway-2.log"),
        );
        (KillOnDrop(second), ready)
    }

    fn kubectl(&self, context: &str, args: &[&str]) -> Command {
        gateway_kubectl(&self.fleet, context, args)
    }

    /// A long-running kubectl (watch, follow, port-forward) and its stdout lines.
    fn spawn_lines(&self, args: &[&str], env: &[(&str, &str)]) -> (KillOnDrop, LineReader) {
        spawn_lines(&self.fleet, "member2", args, env)
    }

    fn ok(&self, args: &[&str]) -> String {
        self.fleet.kubectl_ok("member2", args)
    }
}

#[test]
fn kubectl_works_on_a_pull_mode_member_as_on_a_direct_one() {
    let mut pulled = PullFleet::start(20, &[]);
    let agent = pulled.start_agent();

    // get and list (the member's own objects), watch, logs -f, exec over WebSocket and SPDY.
    kubectl_basics(&pulled.fleet, "member2", "tunnelled");
    assert!(pulled.ok(&["get", "namespace", "dev"]).contains("dev"));

    // port-forward, over WebSocket and SPDY: 200 KB echoed by the pod.
    for env in [
        ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true"),
        ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
    ] {
        let forward_args: Vec<&str> = PORT_FORWARD_HELLO.split(' ').collect();
        let (_forward, mut out) = pulled.spawn_lines(&forward_args, &[env]);
        let port = support::kubectl::forwarded_port(&mut out);
        support::kubectl::assert_echoed(port, 0, &format!("{env:?}"));
    }

    // No dial per request: twenty GETs, each on a new client connection, reuse the streams
    // (and so the member connections) the gateway's shards pooled; at most one new stream per
    // shard.
    let opened = || agent.log().matches("member connection opened").count();
    let before = opened();
    for _ in 0..20 {
        let answer = pulled
            .fleet
            .https_get("/clusters/member2/api/v1/namespaces/dev");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    assert!(
        opened() - before <= 2,
        "{} member connections for 20 GETs",
        opened() - before
    );

    // The direct member beside it is untouched.
    assert!(pulled
        .fleet
        .kubectl_ok("member1", &["get", "ns"])
        .contains("default"));
}

#[test]
fn a_lost_agent_ends_its_streams_and_a_returning_one_is_waited_for() {
    let mut pulled = PullFleet::start(5, &["--tunnel-wait-seconds", "2"]);
    let mut agent = pulled.start_agent();
    let start_watch = |pulled: &PullFleet| {
        let (watch, mut lines) = pulled.spawn_lines(&["get", "configmaps", "-n", "dev", "-w"], &[]);
        lines.wait_line("the watch's first row", Duration::from_secs(30), |l| {
            l.contains("kube-root-ca.crt")
        });
        (watch, lines)
    };

    // Killed: the watch ends (the tunnel's streams fail), no hang.
    let (mut watch, _lines) = start_watch(&pulled);
    signal(&agent.child, libc::SIGKILL);
    exits_within(
        &mut watch,
        Duration::from_secs(15),
        "the watch to end with its tunnel",
    );

    // No agent: after the wait, a 503 Status naming the cluster.
    let started = Instant::now();
    let answer = pulled
        .fleet
        .https_get("/clusters/member2/api/v1/namespaces");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains(r#""kind":"Status""#)
            && answer.contains(r#"cluster \"member2\""#)
            && answer.contains("no agent"),
        "{answer}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "answered before the wait"
    );
    // The operator sees it: /readyz lists the cluster without an agent (still ready: the others
    // are served), and the agents gauge is 0.
    let verbose = pulled.fleet.admin_until(
        "/readyz?verbose",
        "without an agent: member2",
        Duration::from_secs(10),
        "member2 listed without an agent",
    );
    assert!(verbose.contains("readyz check passed"), "{verbose}");
    pulled.fleet.admin_until(
        "/metrics",
        "fleetgate_tunnel_agents{cluster=\"member2\"} 0",
        Duration::from_secs(10),
        "the agents gauge at 0",
    );

    // A request made while the agent comes back waits for it and succeeds.
    let waiting = pulled
        .kubectl("member2", &["get", "ns", "dev", "--request-timeout", "20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    agent = pulled.start_agent();
    let out = waiting.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
    let metrics = pulled.fleet.admin_until(
        "/metrics",
        "fleetgate_tunnel_agents{cluster=\"member2\"} 1",
        Duration::from_secs(10),
        "the agents gauge back at 1",
    );
    assert!(
        metrics.contains("fleetgate_tunnel_connects_total{cluster=\"member2\"} 2"),
        "{metrics}"
    );
    // The requests so far rode streams of member2's tunnels, each way.
    let sample = |series: &str| {
        pulled
            .fleet
            .metric(series)
            .unwrap_or_else(|| panic!("no {series} in {metrics}"))
    };
    assert!(sample("fleetgate_tunnel_streams_opened_total{cluster=\"member2\"}") >= 1);
    assert!(
        sample("fleetgate_tunnel_streams{cluster=\"member2\"}") >= 1,
        "the pooled stream stays open"
    );
    let to_member =
        sample("fleetgate_tunnel_bytes_total{cluster=\"member2\",direction=\"to_member\"}");
    let from_member =
        sample("fleetgate_tunnel_bytes_total{cluster=\"member2\",direction=\"from_member\"}");
    assert!(
        to_member > 100 && from_member > to_member,
        "{to_member} {from_member}"
    );
    assert!(pulled
        .fleet
        .admin_get("/readyz?verbose")
        .contains("[+]tunnels ok: 1 pull-mode clusters, each with an agent"));

    // Frozen (a half-open tunnel: the TCP connection stays, nothing answers): PINGs notice it
    // within a few seconds and the watch ends.
    let (mut watch, _lines) = start_watch(&pulled);
    let frozen = Instant::now();
    signal(&agent.child, libc::SIGSTOP);
    exits_within(
        &mut watch,
        Duration::from_secs(15),
        "the watch to end on a half-open tunnel",
    );
    assert!(frozen.elapsed() < Duration::from_secs(10));
    assert!(
        pulled.fleet.log().contains("half-open"),
        "{}",
        pulled.fleet.log_tail(20)
    );
    // Thawed, the agent finds its tunnel gone and dials again.
    signal(&agent.child, libc::SIGCONT);
    wait_for("the agent's second tunnel", Duration::from_secs(20), || {
        agent.log().matches("tunnel up").count() >= 2
    });
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
}

#[test]
fn a_shared_watch_resumes_on_the_agents_new_tunnel_without_a_break() {
    let mut pulled = PullFleet::start_configured(0, &["--tunnel-wait-seconds", "5"], |fleet| {
        fleet.edit_gateway(|gateway| {
            gateway["spec"]["sharedWatches"] =
                serde_yaml::from_str("resources: [{group: '', version: v1, resource: configmaps}]")
                    .unwrap();
        });
    });
    let mut agent = pulled.start_agent();
    let (mut watch, mut lines) = pulled.spawn_lines(
        &["get", "configmaps", "-n", "dev", "-w", "--no-headers"],
        &[],
    );
    lines.wait_line("the watch's first row", Duration::from_secs(30), |l| {
        l.contains("kube-root-ca.crt")
    });
    wait_for(
        "kubectl's watch served by a hub",
        Duration::from_secs(10),
        || pulled.fleet.metric("fleetgate_shared_watch_clients") == Some(1),
    );

    // The agent dies; a change is made in member2 meanwhile (straight at it), and the agent
    // comes back with a new tunnel.
    signal(&agent.child, libc::SIGKILL);
    pulled.fleet.admin_until(
        "/metrics",
        "fleetgate_tunnel_agents{cluster=\"member2\"} 0",
        Duration::from_secs(10),
        "the gateway to notice the agent gone",
    );
    let kubeconfig = pulled.fleet.fleet_path("kubeconfig");
    let direct = |name: &str| {
        let args = ["create", "configmap", name, "-n", "dev"];
        let made = support::kubectl::kubectl(&kubeconfig, "member2", &args);
        assert!(made.status.success(), "{made:?}");
    };
    direct("while-away");
    agent = pulled.start_agent();
    lines.wait_line(
        "the change made while the tunnel was down",
        Duration::from_secs(30),
        |l| l.starts_with("while-away "),
    );
    direct("after");
    lines.wait_line("the next change", Duration::from_secs(30), |l| {
        l.starts_with("after ")
    });
    // The same watch all along, each change once.
    assert!(watch.try_wait().unwrap().is_none(), "kubectl's watch ended");
    for name in ["while-away ", "after "] {
        let rows = lines.seen.iter().filter(|l| l.starts_with(name)).count();
        assert_eq!(rows, 1, "{name}: {:#?}", lines.seen);
    }
    drop(agent);
}

#[test]
fn a_frozen_gateway_is_noticed_by_the_agent_which_dials_again() {
    let mut pulled = PullFleet::start(5, &[]);
    let agent = pulled.start_agent();
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
    // The gateway frozen: its TCP connections stay open, nothing answers the agent's PINGs.
    let gateway = &pulled.fleet.gateway.as_ref().unwrap().child;
    let frozen = Instant::now();
    signal(gateway, libc::SIGSTOP);
    wait_for("the agent to notice", Duration::from_secs(15), || {
        agent.log().contains("half-open")
    });
    let noticed = frozen.elapsed();
    signal(gateway, libc::SIGCONT);
    assert!(
        noticed < Duration::from_secs(10),
        "noticed after {noticed:?}"
    );
    wait_for("the agent's second tunnel", Duration::from_secs(40), || {
        agent.log().matches("tunnel up").count() >= 2
    });
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
}

/// A TLS client of the tunnel listener with `identity` (cert and key files, if any).
fn tunnel_client(
    pulled: &PullFleet,
    identity: Option<(&str, &str)>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let read = |p: &str| std::fs::read(pulled.fleet.fleet_path(p)).unwrap();
    let identity = identity.map(|(cert, key)| (read(cert), read(key)));
    let config = client_tls_config(
        &read("pki/gateway-ca.crt"),
        identity.as_ref().map(|(cert, key)| (&cert[..], &key[..])),
        b"fleetgate-tunnel/1",
    );
    let tcp = TcpStream::connect(pulled.tunnel).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let conn = rustls::ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// Sends `hello` and returns the gateway's answer (until it closes), or the I/O error.
fn answer_to(
    mut client: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    hello: &[u8],
) -> std::io::Result<String> {
    client.write_all(hello)?;
    client.flush()?;
    let mut answer = Vec::new();
    client.read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A TLS client of the tunnel listener with agent `cluster`'s certificate
/// (`agents/agent-CLUSTER.crt`).
fn agent_client(
    pulled: &PullFleet,
    cluster: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let cert = format!("agents/agent-{cluster}.crt");
    let key = format!("agents/agent-{cluster}.key");
    tunnel_client(pulled, Some((&cert, &key)))
}

#[test]
fn wrong_certificates_and_garbage_are_refused_at_the_tunnel_listener() {
    let mut pulled = PullFleet::start(5, &[]);

    // The agent itself refuses to start with another cluster's certificate.
    let (mut cmd, log) = pulled.agent_command("member2", "member1");
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let stderr = std::fs::read_to_string(log).unwrap();
    assert!(
        stderr.contains("not an agent certificate for cluster \"member2\""),
        "{stderr}"
    );

    // The gateway refuses it too: member1's certificate claiming member2.
    let claim = answer_to(
        agent_client(&pulled, "member1"),
        b"FLEETGATE-TUNNEL/1 member2\n",
    )
    .unwrap();
    assert!(
        claim.starts_with("REFUSED") && claim.contains("certificate for \"member1\""),
        "{claim:?}"
    );
    // member1's own certificate for member1, a Direct cluster.
    let direct = answer_to(
        agent_client(&pulled, "member1"),
        b"FLEETGATE-TUNNEL/1 member1\n",
    )
    .unwrap();
    assert!(direct.contains("not a Tunnel cluster"), "{direct:?}");
    // A hostile hello: too long, then not a hello at all.
    let long = answer_to(agent_client(&pulled, "member2"), &[b'A'; 4096]).unwrap_or_default();
    assert!(!long.starts_with("OK"), "{long:?}");
    let garbage = answer_to(
        agent_client(&pulled, "member2"),
        b"\x00\xff\r\nGET / HTTP/1.1\r\n\r\n",
    )
    .unwrap_or_default();
    assert!(garbage.starts_with("REFUSED"), "{garbage:?}");
    // A valid hello followed by garbage instead of h2.
    let mut client = agent_client(&pulled, "member2");
    client.write_all(b"FLEETGATE-TUNNEL/1 member2\n").unwrap();
    let mut ok = [0u8; 3];
    client.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"OK\n");
    let _ = client.write_all(&[0x55; 10_000]);
    let _ = client.read_to_end(&mut Vec::new());

    // No certificate, and a user's certificate (the client CA, not the agent CA): no handshake.
    for identity in [None, Some(("users/admin.crt", "users/admin.key"))] {
        let refused = answer_to(
            tunnel_client(&pulled, identity),
            b"FLEETGATE-TUNNEL/1 member2\n",
        );
        assert!(
            !matches!(&refused, Ok(a) if a.starts_with("OK")),
            "{identity:?}: {refused:?}"
        );
    }
    // Not TLS at all.
    let mut raw = TcpStream::connect(pulled.tunnel).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01\xff\xff")
        .unwrap();
    let _ = raw.read_to_end(&mut Vec::new());

    // None of it hurt the gateway: the real agent connects and serves.
    let _agent = pulled.start_agent();
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
    assert!(pulled
        .fleet
        .kubectl_ok("member1", &["get", "ns"])
        .contains("dev"));
    let log = pulled.fleet.log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_stalled_big_body_leaves_the_other_streams_of_the_tunnel_flowing() {
    // About 10 MB of ConfigMaps in member2: far more than a stream's window and the socket
    // buffers on the way.
    let mut pulled = PullFleet::start(8000, &[]);
    let _agent = pulled.start_agent();
    pulled.ok(&["get", "ns"]);

    // A client that asks for the big LIST, reads its first bytes and stops reading.
    let (mut stalled, mut total) =
        stalled_list(pulled.fleet.dir(), pulled.fleet.https(), "member2");

    // Small GETs on the same tunnel keep their latency while it stalls.
    assert_small_gets_keep_flowing(|args| pulled.ok(args));

    // The stalled body is intact once its client reads again.
    let mut rest = Vec::new();
    stalled.read_to_end(&mut rest).unwrap();
    total += rest.len();
    assert!(total > 8_000_000, "only {total} bytes");
    assert!(rest.ends_with(b"0\r\n\r\n") || rest.ends_with(b"}\n") || rest.ends_with(b"}"));
}

#[test]
fn streams_spread_over_agents_and_an_agent_serves_every_gateway() {
    let mut pulled = PullFleet::start(5, &[]);
    let (_second, ready) = pulled.second_gateway("127.0.0.1:0");
    let both = [pulled.tunnel, ready.addr("tunnel")];
    // Two agents of member2, each with a tunnel to both gateways (`ready` once both are up).
    let first = pulled.start_agent_to(&both);
    let other = pulled.start_agent_to(&both);
    for https in [pulled.fleet.https(), ready.addr("https")] {
        let answer = admin_get_at(
            pulled.fleet.dir(),
            https,
            "/clusters/member2/api/v1/namespaces/dev",
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    // Watches each hold a stream of their own, and they reach both agents. A shard prefers a
    // tunnel whose connection runs on it, so when the two agents' tunnels landed on different
    // shards the spread follows the shards kubectl's connections land on (the kernel's choice):
    // open watches until both agents carry one, at most 12 (all on one agent by chance: 1 in 2^11).
    let carries = |agent: &support::pull::Agent| agent.log().contains("member connection opened");
    let mut watches = Vec::new();
    while watches.len() < 12 && !(watches.len() >= 4 && carries(&first) && carries(&other)) {
        let (watch, mut lines) = pulled.spawn_lines(&["get", "configmaps", "-n", "dev", "-w"], &[]);
        lines.wait_line("a watch's first row", Duration::from_secs(30), |l| {
            l.contains("kube-root-ca.crt")
        });
        watches.push((watch, lines));
    }
    for agent in [&first, &other] {
        assert!(carries(agent), "an agent got no stream:\n{}", agent.log());
    }
    drop(watches);
}

#[test]
fn demo_pull_serves_a_pull_mode_member() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = KillOnDrop(
        Command::new(fleetgate_binary())
            .args([
                "demo",
                "--clusters",
                "2",
                "--pull",
                "1",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--workers", "1", "--objects", "3", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = LineReader::new(demo.stdout.take().unwrap());
    lines.wait_line("the demo's ready line", Duration::from_secs(60), |l| {
        l.starts_with("ready: 2 simulated")
    });
    let cluster = std::fs::read_to_string(dir.path().join("clusters/member2.yaml")).unwrap();
    assert!(
        cluster.contains("Tunnel") && !cluster.contains("server:"),
        "{cluster}"
    );
    let kubeconfig = dir.path().join("kubeconfig");
    for context in ["member1", "member2"] {
        let out = support::kubectl::kubectl(&kubeconfig, context, &["get", "ns"]);
        assert!(
            support::kubectl::succeeded(out, context, "").contains("default"),
            "{context}"
        );
    }
    signal(&demo, libc::SIGTERM);
    exits_within(&mut demo, Duration::from_secs(20), "the demo to stop");
}

#[test]
fn gateway_replicas_come_from_dns_and_follow_it() {
    let mut pulled = PullFleet::start(5, &[]);
    let port = pulled.tunnel.port();
    // The agent runs in a mount namespace of its own whose /etc/hosts is this file: `localhost`
    // is the replicas' name (the gateways' certificate names it), at first one address.
    let hosts = pulled.fleet.path("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let mut unshare = Command::new("unshare");
    unshare
        .args([
            "--mount",
            "sh",
            "-c",
            r#"mount --bind "$0" /etc/hosts && exec "$@""#,
        ])
        .arg(&hosts)
        .arg(fleetgate_binary());
    let (mut cmd, log) = pulled.agent_command_via(unshare, &[], "member2", "member2");
    cmd.args(["--gateway-replicas", &format!("https://localhost:{port}")])
        .args(["--resolve-seconds", "1"]);
    let mut agent = KillOnDrop(cmd.spawn().unwrap());
    let mut stdout = LineReader::new(agent.stdout.take().unwrap());
    let ready = stdout.wait_line("the agent's ready line", Duration::from_secs(30), |l| {
        l.contains("ready")
    });
    assert!(ready.contains("1 gateway(s)"), "{ready}");
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // A second replica comes, at a second address of the name, on the same port.
    let (mut second, second_ready) = pulled.second_gateway(&format!("127.0.0.2:{port}"));
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.2 localhost\n").unwrap();
    // The agent resolves the name again and dials the new replica, which then serves member2.
    let second_https = second_ready.addr("https");
    wait_for(
        "the second replica serving member2",
        Duration::from_secs(20),
        || {
            admin_get_at(
                pulled.fleet.dir(),
                second_https,
                "/clusters/member2/api/v1/namespaces/dev",
            )
            .starts_with("HTTP/1.1 200")
        },
    );
    let first = pulled
        .fleet
        .https_get("/clusters/member2/api/v1/namespaces/dev");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");

    // The second address leaves the name, then its replica goes: the agent does not dial it
    // again, and the first replica still serves.
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    wait_for(
        "the agent to see one replica again",
        Duration::from_secs(20),
        || agent_log().matches("gateway replicas resolved").count() >= 3,
    );
    signal(&second, libc::SIGKILL);
    let _ = second.wait();
    wait_for(
        "the retired replica's tunnel to end",
        Duration::from_secs(20),
        || agent_log().contains("no longer resolved: not dialed again"),
    );
    let after = agent_log();
    let dials_after_retire = after
        .lines()
        .skip_while(|l| !l.contains("no longer resolved"))
        .skip(1)
        .filter(|l| l.contains("127.0.0.2"))
        .count();
    assert_eq!(dials_after_retire, 0, "{after}");
    assert!(pulled.ok(&["get", "ns"]).contains("dev"));
}
