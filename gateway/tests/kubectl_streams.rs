//! kubectl exec, attach, port-forward and cp THROUGH `fleetgate serve` against the simulated
//! fleet, over WebSocket (kubectl's default) and over SPDY/3.1 (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS
//! =false`, `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`). Each test checks what a user would: the
//! output, exit codes, bytes echoed back, a file copied in and out unchanged, the 101 of the
//! intended protocol in kubectl's `-v=8` log (kubectl silently falls back from WebSocket to SPDY),
//! a killed kubectl ending the member's session, and a member's refusal relayed as its Status.
//! Real processes: the fleet runs in this test process (its own tokio runtime), the gateway and
//! kubectl are child processes. Pod names differ per test: the session counter is per process.

mod support;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::fleet::Fleet;
use support::kubectl::{
    assert_echoed, kubectl_command, succeeded, PORT_FORWARD, PORT_FORWARD_HELLO_TRACED,
    REMOTE_COMMAND,
};
use support::wait::{read_on_thread, wait_for, LineReader};

fn start() -> Fleet {
    let mut fleet = Fleet::sim(1, 5);
    fleet.serve(&["--workers", "2"], Some("fleetgate=debug"));
    fleet
}

impl Fleet {
    fn kubectl_command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = kubectl_command(&self.path("gateway.kubeconfig"), "member1");
        cmd.arg("--cache-dir")
            .arg(self.path("kube-cache"))
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs kubectl with `input` on stdin, written from another thread so a large input and a
    /// large output cannot deadlock on full pipes. Bounded: kubectl is killed after 60 s.
    fn kubectl_io(&self, args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Output {
        let mut child = self
            .kubectl_command(args, env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            // kubectl may exit before reading everything (a failed exec); not our error.
            let _ = stdin.write_all(&input);
        });
        let pid = child.id();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if done_rx.recv_timeout(Duration::from_secs(60)).is_err() {
                // A hung session must fail the test, not hang it.
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        });
        let output = child.wait_with_output().expect("kubectl output");
        let _ = done_tx.send(());
        let _ = watchdog.join();
        let _ = writer.join();
        output
    }

    fn kubectl(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.kubectl_io(args, env, b"")
    }

    fn ok(&self, args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
        let out = self.kubectl(args, env);
        self.success(&out, args);
        out.stdout
    }

    fn success(&self, out: &Output, what: &[&str]) {
        let log = format!("gateway log:\n{}", self.log_tail(30));
        succeeded(out.clone(), &format!("{what:?}"), &log);
    }

    /// The gateway's `fleetgate_upgraded_streams` gauge, from its admin listener.
    fn upgraded_streams(&self) -> i64 {
        self.metric("fleetgate_upgraded_streams")
            .expect("no upgraded_streams gauge in /metrics")
    }
}

/// kubectl's log shows a 101 of `protocol` through the gateway (not a fallback).
fn assert_switched(log: &str, protocol: &str, port_forward: bool) {
    support::kubectl::assert_switched(log, protocol, port_forward, "/clusters/member1/");
}

#[test]
fn exec_output_and_exit_codes_come_through_the_gateway_over_websocket_and_spdy() {
    let fleet = start();
    for (protocol, env) in REMOTE_COMMAND {
        let traced = fleet.kubectl(
            &[
                "exec", "hello", "-n", "default", "-v=8", "--", "echo", "traced",
            ],
            env,
        );
        fleet.success(&traced, &["exec", "-v=8"]);
        assert_eq!(traced.stdout, b"traced\n", "over {protocol}");
        assert_switched(&String::from_utf8_lossy(&traced.stderr), protocol, false);
        let out = fleet.ok(&["exec", "hello", "-n", "default", "--", "hostname"], env);
        assert_eq!(out, b"hello\n", "over {protocol}");

        let out = fleet.kubectl(
            &["exec", "hello", "-n", "default", "--", "sh", "-c", "exit 3"],
            env,
        );
        assert_eq!(out.status.code(), Some(3), "over {protocol}: {out:?}");
        let out = fleet.kubectl(
            &[
                "exec",
                "hello",
                "-n",
                "default",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; exit 5",
            ],
            env,
        );
        assert_eq!(out.status.code(), Some(5), "over {protocol}: {out:?}");
        assert_eq!(out.stdout, b"out\n", "over {protocol}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("err"),
            "over {protocol}: {out:?}"
        );
    }
    // Every session ended, and the gauge says so.
    wait_for("upgraded streams to close", Duration::from_secs(10), || {
        fleet.upgraded_streams() == 0
    });
}

#[test]
fn exec_stdin_of_one_mib_comes_back_unchanged_through_the_gateway() {
    let fleet = start();
    // A pattern that is not all one byte, so reordering or loss would show.
    let big: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for (protocol, env) in REMOTE_COMMAND {
        let args = ["exec", "-i", "hello", "-n", "default", "--", "cat"];
        let small = fleet.kubectl_io(&args, env, b"hello\nworld\n");
        fleet.success(&small, &args);
        assert_eq!(small.stdout, b"hello\nworld\n", "over {protocol}");
        let large = fleet.kubectl_io(&args, env, &big);
        fleet.success(&large, &args);
        assert_eq!(large.stdout.len(), big.len(), "over {protocol}");
        assert!(
            large.stdout == big,
            "1 MiB came back different over {protocol}"
        );
        let counted = fleet.kubectl_io(
            &["exec", "-i", "hello", "-n", "default", "--", "wc", "-c"],
            env,
            &big,
        );
        fleet.success(&counted, &["wc -c"]);
        assert_eq!(
            String::from_utf8_lossy(&counted.stdout).trim(),
            "1048576",
            "over {protocol}"
        );
    }
}

#[test]
fn attach_echoes_stdin_through_the_gateway() {
    let fleet = start();
    for (protocol, env) in REMOTE_COMMAND {
        let args = ["attach", "-i", "hello", "-n", "default"];
        let out = fleet.kubectl_io(&args, env, b"line one\nline two\n");
        fleet.success(&out, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("line one\nline two\n"),
            "over {protocol}: {text:?}"
        );
    }
}

#[test]
fn port_forward_round_trips_bytes_through_the_gateway() {
    let fleet = start();
    for (protocol, env) in PORT_FORWARD {
        let forward_args: Vec<&str> = PORT_FORWARD_HELLO_TRACED.split(' ').collect();
        let mut child = fleet
            .kubectl_command(&forward_args, env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl port-forward");
        let mut lines = LineReader::new(child.stdout.take().expect("stdout"));
        let log = read_on_thread(child.stderr.take().expect("stderr"));
        let port = support::kubectl::forwarded_port(&mut lines);
        // Two connections one after the other, each larger than one SPDY frame.
        for round in 0..2u32 {
            let mut conn = assert_echoed(port, round, protocol);
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            let _ = conn.read_to_end(&mut rest);
            assert!(rest.is_empty(), "nothing after the echo over {protocol}");
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_switched(&log.join().expect("log reader"), protocol, true);
    }
}

#[test]
fn cp_copies_a_file_in_and_back_out_through_the_gateway() {
    let fleet = start();
    let local = fleet.path("cp");
    std::fs::create_dir_all(&local).unwrap();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let src: PathBuf = local.join("in.bin");
    std::fs::write(&src, &content).unwrap();
    for (protocol, env) in REMOTE_COMMAND {
        let remote = format!("default/hello:/tmp/{protocol}.bin");
        let back = local.join(format!("back-{protocol}.bin"));
        fleet.ok(&["cp", src.to_str().unwrap(), &remote], env);
        let listed = fleet.ok(&["exec", "hello", "-n", "default", "--", "ls", "/tmp"], env);
        assert!(
            String::from_utf8_lossy(&listed).contains(&format!("{protocol}.bin")),
            "over {protocol}: {listed:?}"
        );
        fleet.ok(&["cp", &remote, back.to_str().unwrap()], env);
        let copied = std::fs::read(&back).expect("copied file");
        assert!(
            copied == content,
            "cp round trip changed the file over {protocol}"
        );
    }
}

#[test]
fn killing_kubectl_mid_exec_ends_the_member_session() {
    let fleet = start();
    fleet.ok(
        &["run", "gw-sleeper", "-n", "default", "--image=busybox"],
        &[],
    );
    for (protocol, env) in REMOTE_COMMAND {
        assert_eq!(
            fleet.member_stream_sessions("member1", "default", "gw-sleeper"),
            0
        );
        let mut child = fleet
            .kubectl_command(
                &[
                    "exec",
                    "gw-sleeper",
                    "-n",
                    "default",
                    "--",
                    "sleep",
                    "infinity",
                ],
                env,
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kubectl exec");
        wait_for("the exec session to open", Duration::from_secs(30), || {
            fleet.member_stream_sessions("member1", "default", "gw-sleeper") == 1
        });
        // The member counts its session at the 101; the gateway's gauge follows once it has
        // relayed that 101, so wait for it rather than read it at once.
        wait_for(
            &format!("the gateway to count the {protocol} stream"),
            Duration::from_secs(10),
            || fleet.upgraded_streams() == 1,
        );
        child.kill().expect("kill kubectl");
        let _ = child.wait();
        wait_for(
            &format!("the {protocol} member session to end after kubectl was killed"),
            Duration::from_secs(15),
            || fleet.member_stream_sessions("member1", "default", "gw-sleeper") == 0,
        );
        wait_for(
            "the gateway to drop the stream",
            Duration::from_secs(10),
            || fleet.upgraded_streams() == 0,
        );
    }
}

#[test]
fn exec_with_a_terminal_runs_an_interactive_shell_through_the_gateway() {
    let fleet = start();
    for (protocol, env) in REMOTE_COMMAND {
        // `script` gives kubectl a pseudo-terminal, so `-t` is honoured.
        let kubectl = format!(
            "kubectl --kubeconfig {} --cache-dir {} --context member1 exec -it hello -n default -- sh",
            fleet.path("gateway.kubeconfig").display(),
            fleet.path("kube-cache").display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &kubectl, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn script");
        let mut keyboard = child.stdin.take().expect("stdin");
        keyboard.write_all(b"echo tty-$HOSTNAME\rexit 4\r").unwrap();
        let mut screen = LineReader::new(child.stdout.take().expect("stdout"));
        // `$HOSTNAME` expanded by the pod's shell: proof the line ran remotely.
        screen.wait_line("the command's output", Duration::from_secs(30), |l| {
            l.trim_end() == "tty-hello"
        });
        screen.wait_line("kubectl's exit report", Duration::from_secs(30), |l| {
            l.contains("command terminated with exit code 4")
        });
        let status = child.wait().expect("script exit");
        drop(keyboard);
        assert_eq!(
            status.code(),
            Some(4),
            "over {protocol}: {:#?}",
            screen.seen
        );
    }
}

#[test]
fn a_member_refusing_an_upgrade_is_relayed_as_its_status() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fleet = start();
    let config = fleet.admin_tls_config(b"http/1.1");
    let exec =
        "/clusters/member1/api/v1/namespaces/default/pods/hello/exec?command=echo&stdout=true";
    let cases: [(&str, u16, &str); 3] = [
        // SPDY without a stream protocol in common: the member's 403.
        (
            "Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v9.channel.k8s.io\r\n",
            403,
            "Forbidden",
        ),
        // WebSocket with an unknown subprotocol: the member's 400.
        (
            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: base64.channel.k8s.io\r\n",
            400,
            "BadRequest",
        ),
        // A pod that does not exist.
        ("Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n", 404, "NotFound"),
    ];
    for (index, (headers, code, reason)) in cases.into_iter().enumerate() {
        let path = if index == 2 {
            exec.replace("/hello/", "/no-such-pod/")
        } else {
            exec.to_string()
        };
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\n{headers}Content-Length: 0\r\n\r\n"
        );
        let answer = fleet.runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(fleet.https()).await.unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(
                    rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                    tcp,
                )
                .await
                .expect("TLS to the gateway");
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            // The gateway closes the connection after relaying a refused upgrade.
            tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut answer))
                .await
                .expect("the gateway closed the connection")
                .ok();
            String::from_utf8_lossy(&answer).into_owned()
        });
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no response head: {answer:?}"));
        assert!(
            head.starts_with(&format!("HTTP/1.1 {code} ")),
            "case {index}: {head}"
        );
        assert!(
            !head.to_ascii_lowercase().contains("sec-websocket-accept"),
            "case {index}: {head}"
        );
        let json_start = body.find('{').unwrap_or(0);
        let json_end = body.rfind('}').map_or(body.len(), |e| e + 1);
        let status: serde_json::Value = serde_json::from_str(&body[json_start..json_end])
            .unwrap_or_else(|e| panic!("case {index}: not a Status ({e}): {body:?}"));
        assert_eq!(status["kind"], "Status", "case {index}");
        assert_eq!(status["reason"], reason, "case {index}: {status}");
    }
    assert_eq!(fleet.upgraded_streams(), 0);
}

#[test]
fn kubectl_get_and_watch_ride_h2_through_the_gateway() {
    let fleet = start();
    let table = String::from_utf8(fleet.ok(&["get", "pods", "-n", "default"], &[])).unwrap();
    assert!(table.contains("hello"), "{table}");
    let mut watch = fleet
        .kubectl_command(
            &["get", "configmaps", "-n", "default", "-w", "-o", "name"],
            &[],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kubectl get -w");
    let mut lines = LineReader::new(watch.stdout.take().expect("stdout"));
    // The watch is open once the initial list is printed; then a change arrives as an event.
    fleet.ok(&["create", "configmap", "h2-before", "-n", "default"], &[]);
    lines.wait_line("the initial list", Duration::from_secs(30), |l| {
        l == "configmap/h2-before"
    });
    fleet.ok(&["create", "configmap", "h2-watched", "-n", "default"], &[]);
    lines.wait_line("the watch event", Duration::from_secs(30), |l| {
        l == "configmap/h2-watched"
    });
    let _ = watch.kill();
    let _ = watch.wait();
    // kubectl negotiated h2 (the gateway logs each h2 connection at debug level).
    let log = fleet.log();
    assert!(
        log.contains("h2 connection"),
        "no h2 connection:\n{}",
        fleet.log_tail(30)
    );
    assert!(
        log.contains("h2 response head relayed"),
        "{}",
        fleet.log_tail(30)
    );
}
