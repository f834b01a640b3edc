//! Pull mode across a real network boundary. The simulated member (`fleetgate-loadtest sim`)
//! and its agent run inside a network namespace of their own ("the agent's"), the member on
//! that namespace's loopback only; a veth pair links it to the test's namespace, where the
//! gateway(s) and kubectl run. The tests prove the gateway's side cannot reach the member, then
//! check as a user would: kubectl through the gateway for every verb (get, list, create, apply,
//! patch, label, delete, a watch, `logs -f`, exec and attach, port-forward and cp over WebSocket
//! and SPDY) giving what kubectl gives straight to the member from inside the namespace; the
//! agent killed during a watch (the watch ends cleanly, a request waits for the agent's return
//! or gets a 503 naming the cluster); two gateway replicas with the agent on both, one restarted
//! and one lost while requests run on the other (not one fails); wrong cluster certificates
//! refused with the reason while the right agent serves; a big body whose client stopped reading
//! leaving the small requests of the same tunnel at their latency.
//!
//! Needs root and iproute2 (`support::netns`); `FLEETGATE_NO_NETNS=1` skips it knowingly.
//! Readiness is `ready` lines, log lines and `/metrics`, never a sleep; the gateway binds
//! 127.0.0.1:0 and the veth address with port 0.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::client::{Load, Sender};
use support::fleet::{
    admin_get, fleetgate_binary, loadtest_binary, spawn_serve, Fleet, KillOnDrop, ReadyLine,
};
use support::kubectl::{
    assert_echoed, assert_switched, kubectl_command, succeeded, PORT_FORWARD,
    PORT_FORWARD_HELLO_TRACED, REMOTE_COMMAND,
};
use support::netns::{skipped, Netns};
use support::pull::{
    admin_get_at, agent_command, exits_within, issue_agent, make_pull_mode, without_ansi, Agent,
    AgentSetup, WATCH_DEV_CONFIGMAPS,
};
use support::wait::{read_on_thread, wait_for, wait_for_or, LineReader};

/// The simulated fleet (one member) inside a network namespace, its member1 pull-mode, and a
/// gateway in the test's namespace whose tunnel listener is on the veth.
struct NetnsPull {
    /// Dropped first: the gateway, then the member.
    fleet: Fleet,
    /// Dropped last: whatever still runs inside is killed, the veth pair and namespace deleted.
    ns: Netns,
    /// member1's URL, on the namespace's loopback.
    member: String,
    agents_started: usize,
}

/// A gateway replica beside the fleet's own gateway, on the same configuration.
struct Replica {
    /// Killed when the replica is dropped.
    _process: KillOnDrop,
    ready: ReadyLine,
}

impl NetnsPull {
    /// [`NetnsPull::start`] for `test`, or None when network-namespace tests are skipped here.
    fn unless_skipped(test: &str, objects: usize, serve: &[&str]) -> Option<NetnsPull> {
        (!skipped(test)).then(|| NetnsPull::start(objects, serve))
    }

    fn start(objects: usize, serve: &[&str]) -> NetnsPull {
        let ns = Netns::create();
        let fleet = Fleet::sim_launched(ns.command(loadtest_binary()), 1, objects, "", &[]);
        let member = make_pull_mode(&fleet, "member1");
        issue_agent(&fleet.fleet_path("agents"), "member1");
        serving_certificate_also_for(&fleet, ns.host_addr);
        let mut pulled = NetnsPull {
            fleet,
            ns,
            member,
            agents_started: 0,
        };
        let args = pulled.serve_args("2", &format!("{}:0", pulled.ns.host_addr), serve);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pulled.fleet.serve(&args, Some("fleetgate=debug"));
        pulled
    }

    /// `--workers N --tunnel-listen ADDR --agent-ca CA EXTRA...`.
    fn serve_args(&self, workers: &str, tunnel_listen: &str, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--workers".to_string(),
            workers.into(),
            "--tunnel-listen".into(),
            tunnel_listen.into(),
            "--agent-ca".into(),
            self.fleet
                .fleet_path("agents/agent-ca.crt")
                .display()
                .to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// The gateway's tunnel listener (on the veth address).
    fn tunnel(&self) -> SocketAddr {
        self.fleet.ready().addr("tunnel")
    }

    /// Another `fleetgate serve` on the same configuration, its tunnel listener on
    /// `tunnel_listen` (the veth address; port 0, or the port a replica had before).
    fn replica(&self, tunnel_listen: &str, log: &str) -> Replica {
        let mut args = vec![
            "--config".to_string(),
            self.fleet.dir().display().to_string(),
        ];
        args.extend(self.serve_args("1", tunnel_listen, &[]));
        let (child, ready) = spawn_serve(
            &args,
            &[("RUST_LOG", "fleetgate=debug")],
            &self.fleet.path(log),
        );
        Replica {
            _process: KillOnDrop(child),
            ready,
        }
    }

    /// `fleetgate agent` inside the namespace, to `gateways`, presenting `identity`
    /// (`DIR/agent-NAME`, without `.crt`), carrying streams to member1.
    fn agent_command(
        &mut self,
        gateways: &[SocketAddr],
        cluster: &str,
        identity: PathBuf,
    ) -> (Command, PathBuf) {
        self.agents_started += 1;
        let setup = AgentSetup {
            cluster,
            identity,
            kube_server: &self.member,
            kube_ca: self.fleet.fleet_path("agents/member1-kube-ca.crt"),
            log: self
                .fleet
                .path(&format!("agent-{}.log", self.agents_started)),
        };
        let command = agent_command(
            self.ns.command(fleetgate_binary()),
            &self.fleet,
            gateways,
            &setup,
        );
        (command, setup.log)
    }

    /// member1's agent (its own certificate) inside the namespace, to `gateways`; waits for its
    /// `ready` line.
    fn start_agent(&mut self, gateways: &[SocketAddr]) -> Agent {
        let identity = self.fleet.fleet_path("agents/agent-member1");
        let (command, log) = self.agent_command(gateways, "member1", identity);
        Agent::start(command, &log, || self.fleet.log_tail(30))
    }

    /// kubectl through the gateway, in the test's namespace.
    fn kubectl(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = kubectl_command(&self.fleet.gateway_kubeconfig(), "member1");
        cmd.arg("--cache-dir")
            .arg(self.fleet.path("kube-cache"))
            .args(args)
            .envs(env.iter().copied());
        cmd
    }

    /// kubectl through the gateway with `input` on stdin; killed after 60 s.
    fn kubectl_io(&self, args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Output {
        let mut child = self.spawn_piped(args, env, Stdio::piped());
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let read_all = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let _ = pipe.read_to_end(&mut all);
                all
            })
        };
        let (stdout, stderr) = (read_all(Box::new(stdout)), read_all(Box::new(stderr)));
        exits_within(
            &mut child,
            Duration::from_secs(60),
            &format!("kubectl {args:?}"),
        );
        let _ = writer.join();
        Output {
            status: child.try_wait().unwrap().unwrap(),
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    }

    /// The stdout of a kubectl through the gateway that must succeed.
    fn ok(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self.kubectl_io(args, env, b"");
        self.success(&out, args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn success(&self, out: &Output, args: &[&str]) {
        let log = format!("gateway log:\n{}", self.fleet.log_tail(30));
        succeeded(out.clone(), &format!("{args:?} through the gateway"), &log);
    }

    /// kubectl straight to the member from inside the namespace (the fleet's own kubeconfig).
    fn direct(&self, args: &[&str]) -> Output {
        self.ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.fleet.fleet_path("kubeconfig"))
            .args(["--context", "member1", "--request-timeout", "20s"])
            .arg("--cache-dir")
            .arg(self.fleet.path("kube-cache-direct"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn direct_ok(&self, args: &[&str]) -> String {
        let out = self.direct(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} straight to the member failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A long-running kubectl through the gateway (watch, follow, port-forward): the child,
    /// its stdout lines and its stderr (read on a thread; joined once it exits).
    fn spawn_lines(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (KillOnDrop, LineReader, std::thread::JoinHandle<String>) {
        let mut child = self.spawn_piped(args, env, Stdio::null());
        let lines = LineReader::new(child.stdout.take().unwrap());
        let errors = read_on_thread(child.stderr.take().unwrap());
        (child, lines, errors)
    }

    /// kubectl through the gateway, started with `stdin` and its stdout and stderr piped.
    fn spawn_piped(&self, args: &[&str], env: &[(&str, &str)], stdin: Stdio) -> KillOnDrop {
        let mut kubectl = self.kubectl(args, env);
        let piped = kubectl.stdout(Stdio::piped()).stderr(Stdio::piped());
        KillOnDrop(piped.stdin(stdin).spawn().unwrap())
    }

    /// A GET through the gateway at `https` as `admin`; the whole response.
    fn get(&self, https: SocketAddr, path: &str) -> String {
        admin_get_at(self.fleet.dir(), https, path)
    }
}

/// Replaces the fleet's serving certificate with one also valid for `address` (where agents
/// dial the tunnel listener), signed by the same gateway CA: clients trust it as before.
fn serving_certificate_also_for(fleet: &Fleet, address: std::net::Ipv4Addr) {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    let read = |p: &str| std::fs::read_to_string(fleet.fleet_path(p)).unwrap();
    let ca_key = KeyPair::from_pem(&read("pki/gateway-ca.key")).unwrap();
    let ca = rcgen::Issuer::from_ca_cert_pem(&read("pki/gateway-ca.crt"), ca_key).unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    for ip in ["127.0.0.1".parse().unwrap(), std::net::IpAddr::V4(address)] {
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "fleetgate");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    std::fs::write(fleet.fleet_path("pki/gateway.crt"), cert.pem()).unwrap();
    std::fs::write(fleet.fleet_path("pki/gateway.key"), key.serialize_pem()).unwrap();
}

#[test]
fn kubectl_through_the_gateway_is_kubectl_on_a_member_only_its_agent_reaches() {
    let test = "kubectl_through_the_gateway_is_kubectl_on_a_member_only_its_agent_reaches";
    let Some(mut pulled) = NetnsPull::unless_skipped(test, 20, &[]) else {
        return;
    };

    // The boundary is real: the member answers inside the namespace, and neither its address
    // nor the namespace's veth address reaches it from the gateway's side.
    assert!(pulled.direct_ok(&["get", "ns"]).contains("dev"));
    let port: u16 = pulled.member.rsplit(':').next().unwrap().parse().unwrap();
    let from_outside = support::kubectl::kubectl(
        &pulled.fleet.fleet_path("kubeconfig"),
        "member1",
        &["get", "ns", "--request-timeout", "5s"],
    );
    assert!(
        !from_outside.status.success(),
        "the member is reachable from the gateway's side: {}",
        String::from_utf8_lossy(&from_outside.stdout)
    );
    let veth = SocketAddr::from((pulled.ns.inner_addr, port));
    assert!(
        TcpStream::connect_timeout(&veth, Duration::from_secs(2)).is_err(),
        "the member answers on {veth}"
    );

    let tunnel = pulled.tunnel();
    let _agent = pulled.start_agent(&[tunnel]);

    // Reads: the same bytes as straight from the member.
    for args in [
        &["get", "configmaps", "-A", "-o", "name"][..],
        &["get", "pod", "hello", "-n", "default", "-o", "yaml"],
        &["get", "namespaces", "-o", "json"],
    ] {
        let through = pulled.ok(args, &[]);
        assert_eq!(through, pulled.direct_ok(args), "kubectl {args:?}");
    }
    assert!(pulled.ok(&["get", "configmaps", "-A"], &[]).lines().count() > 20);

    // A watch sees every write made through the gateway: create, apply (create and change),
    // patch, label, delete.
    let watch_args: Vec<&str> = WATCH_DEV_CONFIGMAPS.split(' ').collect();
    let (mut watch, mut events, _) = pulled.spawn_lines(&watch_args, &[]);
    events.wait_line("the watch's first event", Duration::from_secs(30), |l| {
        l.contains("kube-root-ca.crt")
    });
    let created = pulled.ok(&["create", "configmap", "netns-made", "-n", "dev"], &[]);
    assert!(
        created.contains("configmap/netns-made created"),
        "{created}"
    );
    let manifest = pulled.fleet.path("netns-cm.yaml");
    let write_manifest = |data: &str| {
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: netns-cm\n  namespace: dev\ndata:\n{data}"
        );
        std::fs::write(&manifest, text).unwrap();
    };
    write_manifest("  a: \"1\"\n");
    let apply = ["apply", "-f", manifest.to_str().unwrap()];
    assert!(pulled
        .ok(&apply, &[])
        .contains("configmap/netns-cm created"));
    write_manifest("  a: \"1\"\n  b: \"2\"\n");
    assert!(pulled
        .ok(&apply, &[])
        .contains("configmap/netns-cm configured"));
    pulled.ok(
        &[
            "patch",
            "configmap",
            "netns-cm",
            "-n",
            "dev",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"c":"3"}}"#,
        ],
        &[],
    );
    pulled.ok(
        &["label", "configmap", "netns-cm", "-n", "dev", "tier=edge"],
        &[],
    );
    let object = ["get", "configmap", "netns-cm", "-n", "dev", "-o", "json"];
    let through: serde_json::Value = serde_json::from_str(&pulled.ok(&object, &[])).unwrap();
    assert_eq!(
        through["data"],
        serde_json::json!({"a": "1", "b": "2", "c": "3"})
    );
    assert_eq!(through["metadata"]["labels"]["tier"], "edge");
    let direct: serde_json::Value = serde_json::from_str(&pulled.direct_ok(&object)).unwrap();
    assert_eq!(through, direct);
    let deleted = pulled.ok(
        &["delete", "configmap", "netns-cm", "netns-made", "-n", "dev"],
        &[],
    );
    assert_eq!(deleted.matches("deleted").count(), 2, "{deleted}");
    events.wait_line("the last delete's event", Duration::from_secs(30), |l| {
        l.starts_with("DELETED") && l.contains("netns-made")
    });
    let changes: Vec<&str> = events
        .seen
        .iter()
        .filter(|l| l.contains("netns-"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        changes,
        ["ADDED", "ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED", "DELETED"],
        "{:#?}",
        events.seen
    );
    assert!(
        !pulled.direct(&object).status.success(),
        "deleted, but there"
    );
    let _ = watch.kill();

    // logs -f: lines written after the request arrive as they are written.
    let (_follow, mut lines, _) =
        pulled.spawn_lines(&["logs", "-f", "hello", "-n", "default"], &[]);
    lines.wait_line(
        "a line written after the request",
        Duration::from_secs(30),
        |l| l.starts_with("log line 7 "),
    );

    for (protocol, env) in REMOTE_COMMAND {
        // exec: output, exit code, and the protocol really used.
        let traced = pulled.kubectl_io(
            &[
                "exec",
                "hello",
                "-n",
                "default",
                "-v=8",
                "--",
                "echo",
                "tunnelled",
            ],
            env,
            b"",
        );
        pulled.success(&traced, &["exec", protocol]);
        assert_eq!(traced.stdout, b"tunnelled\n", "over {protocol}");
        assert_switched(
            &String::from_utf8_lossy(&traced.stderr),
            protocol,
            false,
            "/clusters/member1/",
        );
        let failed = pulled.kubectl_io(
            &["exec", "hello", "-n", "default", "--", "sh", "-c", "exit 3"],
            env,
            b"",
        );
        assert_eq!(failed.status.code(), Some(3), "over {protocol}: {failed:?}");
        // attach: stdin echoed by the container.
        let attached = pulled.kubectl_io(
            &["attach", "-i", "hello", "-n", "default"],
            env,
            b"line one\nline two\n",
        );
        pulled.success(&attached, &["attach", protocol]);
        assert!(
            String::from_utf8_lossy(&attached.stdout).contains("line one\nline two\n"),
            "over {protocol}: {attached:?}"
        );
        // cp in and back out, unchanged.
        let content: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let local = pulled.fleet.path(&format!("cp-{protocol}.bin"));
        std::fs::write(&local, &content).unwrap();
        let remote = format!("default/hello:/tmp/{protocol}.bin");
        pulled.ok(&["cp", local.to_str().unwrap(), &remote], env);
        let back = pulled.fleet.path(&format!("cp-{protocol}-back.bin"));
        pulled.ok(&["cp", &remote, back.to_str().unwrap()], env);
        assert!(
            std::fs::read(&back).unwrap() == content,
            "cp changed the file over {protocol}"
        );
    }

    // port-forward: 200 KB echoed by the pod, twice on one forward, over the protocol asked.
    for (protocol, env) in PORT_FORWARD {
        let forward_args: Vec<&str> = PORT_FORWARD_HELLO_TRACED.split(' ').collect();
        let (mut forward, mut out, log) = pulled.spawn_lines(&forward_args, env);
        let port = support::kubectl::forwarded_port(&mut out);
        for round in 0..2u32 {
            assert_echoed(port, round, protocol);
        }
        let _ = forward.kill();
        let _ = forward.wait();
        assert_switched(&log.join().unwrap(), protocol, true, "/clusters/member1/");
    }
}

/// A 503 Status naming member1 for a GET through the gateway at `https`, answered no sooner
/// than `wait`.
fn assert_unavailable(pulled: &NetnsPull, https: SocketAddr, wait: Duration) {
    let started = Instant::now();
    let answer = pulled.get(https, "/clusters/member1/api/v1/namespaces");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains(r#""kind":"Status""#)
            && answer.contains(r#"cluster \"member1\" is unavailable"#)
            && answer.contains("no agent"),
        "{answer}"
    );
    assert!(started.elapsed() >= wait, "answered before the wait");
}

#[test]
fn the_agent_killed_during_a_watch_ends_it_cleanly_and_its_return_is_waited_for() {
    let test = "the_agent_killed_during_a_watch_ends_it_cleanly_and_its_return_is_waited_for";
    let Some(mut pulled) = NetnsPull::unless_skipped(test, 5, &["--tunnel-wait-seconds", "3"])
    else {
        return;
    };
    let tunnel = pulled.tunnel();
    let agent = pulled.start_agent(&[tunnel]);

    let (mut watch, mut rows, errors) =
        pulled.spawn_lines(&["get", "configmaps", "-n", "dev", "-w"], &[]);
    rows.wait_line("the watch's first row", Duration::from_secs(30), |l| {
        l.contains("kube-root-ca.crt")
    });
    // The watch is live through the tunnel once it shows a change made after the list.
    pulled.ok(&["create", "configmap", "before-kill", "-n", "dev"], &[]);
    rows.wait_line("the watch's event", Duration::from_secs(30), |l| {
        l.starts_with("before-kill")
    });
    // And an HTTP/1.1 watch, its initial events (before-kill among them) read.
    let mut raw = pulled.fleet.admin_connection();
    raw.write_all(
        b"GET /clusters/member1/api/v1/namespaces/dev/configmaps?watch=true HTTP/1.1\r\nHost: gw\r\n\r\n",
    )
    .unwrap();
    let mut raw_body = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&raw_body).contains("before-kill") {
        let n = raw.read(&mut chunk).expect("the HTTP/1.1 watch's events");
        assert!(n > 0, "{}", String::from_utf8_lossy(&raw_body));
        raw_body.extend_from_slice(&chunk[..n]);
    }
    drop(agent); // SIGKILL
    exits_within(
        &mut watch,
        Duration::from_secs(15),
        "the watch to end with its tunnel",
    );
    // The HTTP/1.1 watch ends with its last chunk, between two events, and its connection
    // goes on: the next request on it gets the 503 Status naming the cluster, after the wait.
    while !raw_body.ends_with(b"\r\n0\r\n\r\n") {
        match raw.read(&mut chunk) {
            Ok(n) if n > 0 => raw_body.extend_from_slice(&chunk[..n]),
            end => panic!(
                "the HTTP/1.1 watch ended without its last chunk ({end:?}): {}",
                String::from_utf8_lossy(&raw_body)
            ),
        }
    }
    let started = Instant::now();
    raw.write_all(b"GET /clusters/member1/api/v1/namespaces HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503")
            && answer.contains(r#"cluster \"member1\" is unavailable"#),
        "{answer}"
    );
    // The gateway times the wait with its coarse clock (a scheduler tick behind at most).
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "answered after {:?}, before the wait: {answer}",
        started.elapsed()
    );
    // An end, as when the member ends a watch itself: kubectl exits 0 and quietly, every line
    // it printed is a row (a reset stream would print an InternalError "unable to decode an
    // event from the watch stream" and exit 1).
    let _ = rows.next_matching(Duration::from_secs(2), |_| false);
    for row in &rows.seen {
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert!(
            columns == ["NAME", "DATA", "AGE"]
                || (columns.len() == 3 && columns[1].parse::<u32>().is_ok()),
            "not a row: {row:?} in {:#?}",
            rows.seen
        );
    }
    let errors = errors.join().unwrap();
    let status = watch.try_wait().unwrap().unwrap();
    assert!(
        status.success() && errors.is_empty(),
        "the watch ended with {status}: {errors}"
    );

    // A request sent while the agent is away (before its process even starts) waits for its
    // return, and succeeds.
    let mut waiting = pulled.fleet.admin_connection();
    waiting
        .write_all(b"GET /clusters/member1/api/v1/namespaces/dev HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .unwrap();
    waiting.flush().unwrap();
    let _agent = pulled.start_agent(&[tunnel]);
    let mut answer = String::new();
    waiting.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(r#""name":"dev""#),
        "{answer}"
    );
    assert_eq!(
        pulled.ok(&["get", "namespace", "dev", "-o", "name"], &[]),
        "namespace/dev\n"
    );

    // And a new watch works as before.
    let (_watch, mut rows, _) = pulled.spawn_lines(&["get", "configmaps", "-n", "dev", "-w"], &[]);
    rows.wait_line("the new watch's first row", Duration::from_secs(30), |l| {
        l.contains("kube-root-ca.crt")
    });
    pulled.ok(&["create", "configmap", "after-return", "-n", "dev"], &[]);
    rows.wait_line("the new watch's event", Duration::from_secs(30), |l| {
        l.starts_with("after-return")
    });
}

/// `fleetgate_tunnel_agents{cluster="member1"} N` on the admin listener at `admin`, within 40 s.
fn wait_for_agents(admin: SocketAddr, agents: usize, what: &str) {
    let series = format!("fleetgate_tunnel_agents{{cluster=\"member1\"}} {agents}\n");
    wait_for(what, Duration::from_secs(40), || {
        admin_get(admin, "/metrics").contains(&series)
    });
}

/// The lines of `log` after its first `from` bytes at level WARN or ERROR.
fn alarms_since(log: &str, from: usize) -> Vec<String> {
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn with_two_replicas_one_restarted_or_lost_the_other_serves_every_request() {
    let test = "with_two_replicas_one_restarted_or_lost_the_other_serves_every_request";
    let Some(mut pulled) = NetnsPull::unless_skipped(test, 5, &[]) else {
        return;
    };
    let a = pulled.tunnel();
    let listen_b = format!("{}:0", pulled.ns.host_addr);
    let mut b = pulled.replica(&listen_b, "replica-b.log");
    let b_tunnel = b.ready.addr("tunnel");
    // One agent, a tunnel to each replica (`ready` once both are up).
    let agent = pulled.start_agent(&[a, b_tunnel]);
    let namespace = "/clusters/member1/api/v1/namespaces/default";
    for https in [pulled.fleet.https(), b.ready.addr("https")] {
        let answer = pulled.get(https, namespace);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    wait_for_agents(pulled.fleet.admin(), 1, "replica A's agent");
    wait_for_agents(b.ready.addr("admin"), 1, "replica B's agent");

    // Requests on A run while B is killed and restarted on its address.
    let load = Load::start(&pulled.fleet, namespace);
    wait_for("requests on A", Duration::from_secs(30), || {
        load.ok.load(std::sync::atomic::Ordering::Relaxed) >= 20
    });
    let b_url = format!("https://{b_tunnel}");
    let log_before = agent.log().len();
    drop(b); // SIGKILL
    wait_for("the agent to lose B", Duration::from_secs(15), || {
        agent
            .log()
            .get(log_before..)
            .is_some_and(|new| new.contains(&b_url))
    });
    let ok_while_b_down = load.ok.load(std::sync::atomic::Ordering::Relaxed);
    b = pulled.replica(&b_tunnel.to_string(), "replica-b-again.log");
    wait_for_agents(
        b.ready.addr("admin"),
        1,
        "the agent back on the restarted B",
    );
    let answer = pulled.get(b.ready.addr("https"), namespace);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let ok_after = load.ok.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        ok_after > ok_while_b_down,
        "no request ran on A while B restarted"
    );
    load.finish(&pulled.fleet);
    let restart_alarms = alarms_since(&agent.log(), log_before);
    assert!(
        restart_alarms.iter().all(|l| l.contains(&b_url)),
        "the agent complained about more than B: {restart_alarms:#?}"
    );

    // B lost for good: A serves every request, the agent keeps retrying B (with backoff) and
    // says nothing else alarming.
    let log_before = agent.log().len();
    let load = Load::start(&pulled.fleet, namespace);
    drop(b);
    let lost = Instant::now();
    wait_for_or(
        "attempts to reach B, requests on A",
        Duration::from_secs(30),
        || {
            alarms_since(&agent.log(), log_before).len() >= 4
                && load.ok.load(std::sync::atomic::Ordering::Relaxed) >= 40
        },
        || format!("requests on A: {:?}\nagent:\n{}", load.ok, agent.log()),
    );
    load.finish(&pulled.fleet);
    let alarms = alarms_since(&agent.log(), log_before);
    assert!(
        alarms
            .iter()
            .all(|l| l.contains(&b_url) && l.contains("retry_in_ms")),
        "beyond reconnect attempts: {alarms:#?}"
    );
    // Backoff: 100 ms doubling (with jitter), not a tight loop.
    let seconds = lost.elapsed().as_secs_f64();
    assert!(
        (alarms.len() as f64) < 4.0 + seconds * 4.0,
        "{} attempts in {seconds:.1} s",
        alarms.len()
    );
    let mut agent = agent;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent exited"
    );
    assert_eq!(
        pulled.ok(&["get", "namespace", "dev", "-o", "name"], &[]),
        "namespace/dev\n"
    );
    wait_for_agents(pulled.fleet.admin(), 1, "A's agent still there");
}

#[test]
fn wrong_cluster_certificates_are_refused_and_the_right_agent_still_serves() {
    let test = "wrong_cluster_certificates_are_refused_and_the_right_agent_still_serves";
    let Some(mut pulled) = NetnsPull::unless_skipped(test, 5, &["--tunnel-wait-seconds", "1"])
    else {
        return;
    };
    let tunnel = pulled.tunnel();
    let agents = pulled.fleet.fleet_path("agents");
    // A certificate for another cluster (member2: none this gateway serves), and one for
    // member1 from a CA that is not the gateway's agent CA.
    issue_agent(&agents, "member2");
    let other_ca = pulled.fleet.path("other-agent-ca");
    issue_agent(&other_ca, "member1");

    // The agent refuses to present another cluster's certificate.
    let (mut mismatched, log) =
        pulled.agent_command(&[tunnel], "member1", agents.join("agent-member2"));
    let out = mismatched.output().unwrap();
    assert!(!out.status.success());
    let said = std::fs::read_to_string(log).unwrap();
    assert!(
        said.contains("not an agent certificate for cluster \"member1\""),
        "{said}"
    );

    // Presented anyway (as member2's agent beside member1), and from the other CA: refused by
    // the gateway, which logs why with the agent's address in the namespace; each agent says so.
    let (mut as_member2, member2_log) =
        pulled.agent_command(&[tunnel], "member2", agents.join("agent-member2"));
    let _as_member2 = KillOnDrop(as_member2.spawn().unwrap());
    let (mut foreign, foreign_log) =
        pulled.agent_command(&[tunnel], "member1", other_ca.join("agent-member1"));
    let _foreign = KillOnDrop(foreign.spawn().unwrap());
    let peer = format!("peer={}:", pulled.ns.inner_addr);
    wait_for_or(
        "the gateway to refuse both",
        Duration::from_secs(30),
        || {
            let log = without_ansi(&pulled.fleet.log());
            let refusals: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("agent refused") && l.contains(&peer))
                .collect();
            refusals
                .iter()
                .any(|l| l.contains("this gateway has no cluster \"member2\""))
                && refusals.iter().any(|l| l.contains("TLS handshake failed"))
        },
        || pulled.fleet.log_tail(40),
    );
    wait_for("the agents to say why", Duration::from_secs(30), || {
        let member2 = without_ansi(&std::fs::read_to_string(&member2_log).unwrap_or_default());
        let foreign = without_ansi(&std::fs::read_to_string(&foreign_log).unwrap_or_default());
        member2.contains("the gateway refused the tunnel: this gateway has no cluster")
            && foreign.contains("tunnel failed")
    });
    // member1 is not served through either: no tunnel, a 503 naming it.
    assert_unavailable(&pulled, pulled.fleet.https(), Duration::from_secs(1));
    assert!(pulled
        .fleet
        .admin_get("/metrics")
        .contains("fleetgate_tunnel_connects_total{cluster=\"member1\"} 0"));

    // The gateway's own check of a claim, from the agent's namespace: member2's certificate
    // claiming member1 in the hello (an agent that skipped its own check).
    if Command::new("openssl").arg("version").output().is_ok() {
        let mut claim = pulled
            .ns
            .command("openssl")
            .args([
                "s_client",
                "-quiet",
                "-alpn",
                "fleetgate-tunnel/1",
                "-connect",
            ])
            .arg(tunnel.to_string())
            .arg("-cert")
            .arg(agents.join("agent-member2.crt"))
            .arg("-key")
            .arg(agents.join("agent-member2.key"))
            .arg("-CAfile")
            .arg(pulled.fleet.fleet_path("pki/gateway-ca.crt"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        claim
            .stdin
            .take()
            .unwrap()
            .write_all(b"FLEETGATE-TUNNEL/1 member1\n")
            .unwrap();
        let mut claim = KillOnDrop(claim);
        let mut answer = LineReader::new(claim.stdout.take().unwrap());
        answer.wait_line("the gateway's refusal", Duration::from_secs(20), |l| {
            l.starts_with("REFUSED") && l.contains("certificate for \"member2\"")
        });
    } else {
        eprintln!(
            "no openssl: the claim of a wrong cluster in the hello is checked by tunnel.rs only"
        );
    }

    // The right agent is accepted beside the refused ones, and serves.
    let _agent = pulled.start_agent(&[tunnel]);
    assert_eq!(
        pulled.ok(&["get", "namespace", "dev", "-o", "name"], &[]),
        "namespace/dev\n"
    );
    wait_for_agents(pulled.fleet.admin(), 1, "only the right agent");
    assert!(pulled
        .fleet
        .admin_get("/metrics")
        .contains("fleetgate_tunnel_connects_total{cluster=\"member1\"} 1"));
}

#[test]
fn a_stalled_big_body_leaves_the_small_requests_of_its_tunnel_at_their_latency() {
    // About 10 MB of ConfigMaps: far more than a stream's window and the buffers on the way.
    let test = "a_stalled_big_body_leaves_the_small_requests_of_its_tunnel_at_their_latency";
    let Some(mut pulled) = NetnsPull::unless_skipped(test, 8000, &[]) else {
        return;
    };
    match pulled.ns.add_delay(Duration::from_millis(5)) {
        Ok(()) => eprintln!("5 ms each way on the veth (netem)"),
        Err(why) => eprintln!("no delay on the veth ({why}): the path has the veth's latency"),
    }
    let tunnel = pulled.tunnel();
    let _agent = pulled.start_agent(&[tunnel]);
    let addrs = pulled.fleet.addrs();
    let small = "/clusters/member1/api/v1/namespaces/dev";
    // Small GETs on one keep-alive connection: each one's latency.
    let latencies = |count: usize| -> Vec<Duration> {
        let addrs = addrs.clone();
        pulled.fleet.runtime.block_on(async move {
            let mut sender = Sender::connect(&addrs, false).await.unwrap();
            let mut took = Vec::new();
            for _ in 0..count {
                let started = Instant::now();
                let (code, body) = sender.request("GET", small, "").await.unwrap();
                assert_eq!(code, 200, "{body}");
                took.push(started.elapsed());
            }
            took.sort();
            took
        })
    };
    let before = latencies(30);

    // A client that asks for the whole LIST, reads its first bytes and stops reading.
    let (mut stalled, mut carry) = pulled.fleet.runtime.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let tcp = socket.connect(addrs.https).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(pulled.fleet.admin_tls_config(b"http/1.1"))
            .connect(rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(b"GET /clusters/member1/api/v1/configmaps HTTP/1.1\r\nHost: gw\r\nAccept: application/json\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut first = vec![0u8; 4096];
        let n = tls.read(&mut first).await.unwrap();
        first.truncate(n);
        (tls, first)
    });
    assert!(
        carry.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&carry)
    );

    let during = latencies(30);
    let median = |l: &[Duration]| l[l.len() / 2];
    eprintln!("small GETs before the stall: {before:?}\nduring it: {during:?}");
    assert!(
        median(&during) <= median(&before) * 5 + Duration::from_millis(250)
            && during[during.len() - 1] < Duration::from_secs(3),
        "small GETs before the stall {before:?}, during it {during:?}"
    );

    // The stalled body, read now, is whole: the LIST of every ConfigMap.
    let response = pulled.fleet.runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            support::read_response(&mut stalled, &mut carry),
        )
        .await
        .expect("the rest of the body within 60 s")
        .expect("a response")
    });
    let list = response.json();
    let items = list["items"].as_array().expect("items").len();
    let expected = pulled
        .direct_ok(&["get", "configmaps", "-A", "-o", "name"])
        .lines()
        .count();
    assert!(items >= 8000, "{items} items");
    assert_eq!(items, expected);
}
