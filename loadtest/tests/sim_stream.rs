//! exec, attach, port-forward and cp as kubectl does them against a simulated member, over
//! WebSocket (kubectl's default) and over SPDY/3.1 (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`,
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`). Each test checks what a user would: the output,
//! the bytes echoed back, kubectl's exit code, a file copied in and out unchanged.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{ok_stdout, stderr, wait_for, LineReader, TestFleet, KUBECTL};
use fleetgate_loadtest::sim;

/// The two ways kubectl can carry exec/attach/cp.
const REMOTE_COMMAND: [(&str, &[(&str, &str)]); 2] = [
    ("websocket", &[]),
    ("spdy", &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]),
];

/// The two ways kubectl can carry port-forward.
const PORT_FORWARD: [(&str, &[(&str, &str)]); 2] = [
    ("websocket", &[]),
    ("spdy", &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")]),
];

/// Starts kubectl with `args`, `env` (the transport it uses) and `[stdin, stdout, stderr]`.
fn spawn_kubectl(
    fleet: &TestFleet,
    args: &[&str],
    env: &[(&str, &str)],
    [stdin, stdout, stderr]: [Stdio; 3],
) -> Child {
    fleet
        .kubectl_command()
        .args(args)
        .envs(env.iter().copied())
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn kubectl")
}

/// Runs kubectl with `input` on stdin, written from another thread so that a large input and a
/// large output cannot deadlock on full pipes. Bounded: kubectl is killed after 60 s.
fn kubectl_io(fleet: &TestFleet, args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Output {
    let piped = [Stdio::piped(), Stdio::piped(), Stdio::piped()];
    let mut child = spawn_kubectl(fleet, args, env, piped);
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        // kubectl may exit before reading everything (e.g. a failed exec); that is not our error.
        let _ = stdin.write_all(&input);
    });
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
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

fn stdout_bytes(output: &Output) -> &[u8] {
    assert!(
        output.status.success(),
        "kubectl failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    &output.stdout
}

fn assert_switched(log: &str, protocol: &str, port_forward: bool) {
    if let Err(e) =
        fleetgate_loadtest::sim::stream::trace::kubectl_switched(log, protocol, port_forward)
    {
        panic!("{e}");
    }
}

/// Starts kubectl with `env` and its stderr as given, its stdout read line by line. Keep the
/// reader as long as kubectl runs: it would die writing to a closed pipe.
fn kubectl_lines(
    fleet: &TestFleet,
    args: &[&str],
    env: &[(&str, &str)],
    stderr: Stdio,
) -> (Child, LineReader) {
    let mut child = spawn_kubectl(fleet, args, env, [Stdio::null(), Stdio::piped(), stderr]);
    let lines = LineReader::new(child.stdout.take().expect("stdout"));
    (child, lines)
}

/// Kills kubectl, then waits (up to 15 s) for the member to end every session with pod `pod` in
/// `default`: `what` names the wait in a timeout.
fn kill_then_session_ends(mut child: Child, pod: &str, what: &str) {
    child.kill().expect("kill kubectl");
    let _ = child.wait();
    wait_for(what, Duration::from_secs(15), || {
        (sim::stream::active_sessions("default", pod) == 0).then_some(())
    });
}

/// The local port of `kubectl port-forward`, from its `Forwarding from 127.0.0.1:PORT` line.
fn forwarded_port(lines: &mut LineReader) -> u16 {
    const FORWARDING: &str = "Forwarding from 127.0.0.1:";
    let line = lines.wait_line("the Forwarding line", Duration::from_secs(30), |l| {
        l.starts_with(FORWARDING)
    });
    line[FORWARDING.len()..]
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

#[test]
fn exec_echo_over_websocket_and_spdy() {
    let fleet = TestFleet::start(1);
    for (protocol, env) in REMOTE_COMMAND {
        let traced = fleet.kubectl_env(
            &[
                "exec", "hello", "-n", "default", "-v=8", "--", "echo", "traced",
            ],
            env,
        );
        assert_eq!(ok_stdout(&traced), "traced\n", "over {protocol}");
        assert_switched(&stderr(&traced), protocol, false);
        let out = fleet.kubectl_env(
            &[
                "exec", "hello", "-n", "default", "--", "echo", "hi", "there",
            ],
            env,
        );
        assert_eq!(ok_stdout(&out), "hi there\n", "over {protocol}");
        let out = fleet.kubectl_env(&["exec", "hello", "-n", "default", "--", "hostname"], env);
        assert_eq!(ok_stdout(&out), "hello\n", "over {protocol}");
    }
}

#[test]
fn exec_stdin_is_echoed_by_cat_and_ends_at_eof() {
    let fleet = TestFleet::start(1);
    // 1 MiB of a pattern that is not all one byte, so reordering or loss would show.
    let big: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for (protocol, env) in REMOTE_COMMAND {
        let small = kubectl_io(
            &fleet,
            &["exec", "-i", "hello", "-n", "default", "--", "cat"],
            env,
            b"hello\nworld\n",
        );
        assert_eq!(stdout_bytes(&small), b"hello\nworld\n", "over {protocol}");
        let large = kubectl_io(
            &fleet,
            &["exec", "-i", "hello", "-n", "default", "--", "cat"],
            env,
            &big,
        );
        let got = stdout_bytes(&large);
        assert_eq!(got.len(), big.len(), "over {protocol}");
        assert!(
            got == big.as_slice(),
            "1 MiB came back different over {protocol}"
        );
        let counted = kubectl_io(
            &fleet,
            &["exec", "-i", "hello", "-n", "default", "--", "wc", "-c"],
            env,
            &big,
        );
        assert_eq!(
            String::from_utf8_lossy(stdout_bytes(&counted)).trim(),
            "1048576",
            "over {protocol}"
        );
    }
}

#[test]
fn exit_codes_and_stderr_reach_kubectl() {
    let fleet = TestFleet::start(1);
    for (protocol, env) in REMOTE_COMMAND {
        let out = fleet.kubectl_env(
            &["exec", "hello", "-n", "default", "--", "sh", "-c", "exit 3"],
            env,
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "over {protocol}: {}",
            stderr(&out)
        );
        let out = fleet.kubectl_env(
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
        assert_eq!(
            out.status.code(),
            Some(5),
            "over {protocol}: {}",
            stderr(&out)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "out\n",
            "over {protocol}"
        );
        assert!(
            stderr(&out).contains("err"),
            "over {protocol}: {}",
            stderr(&out)
        );
        let out = fleet.kubectl_env(&["exec", "hello", "-n", "default", "--", "false"], env);
        assert_eq!(out.status.code(), Some(1), "over {protocol}");
        let out = fleet.kubectl_env(&["exec", "hello", "-n", "default", "--", "foo"], env);
        assert!(!out.status.success(), "over {protocol}");
        assert!(
            stderr(&out).contains(r#"exec: "foo": executable file not found in $PATH"#),
            "over {protocol}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn attach_echoes_stdin() {
    let fleet = TestFleet::start(1);
    for (protocol, env) in REMOTE_COMMAND {
        let out = kubectl_io(
            &fleet,
            &["attach", "-i", "hello", "-n", "default"],
            env,
            b"line one\nline two\n",
        );
        let text = String::from_utf8_lossy(stdout_bytes(&out)).into_owned();
        assert!(
            text.contains("line one\nline two\n"),
            "over {protocol}: {text:?}"
        );
    }
}

#[test]
fn port_forward_echoes_bytes_over_websocket_and_spdy() {
    let fleet = TestFleet::start(1);
    for (protocol, env) in PORT_FORWARD {
        let args = "port-forward -n default pod/hello :8080 --address 127.0.0.1 -v=8";
        let args: Vec<&str> = args.split(' ').collect();
        let (mut child, mut lines) = kubectl_lines(&fleet, &args, env, Stdio::piped());
        // Drained on a thread so kubectl's -v=8 log never fills the pipe.
        let mut log_pipe = child.stderr.take().expect("stderr");
        let log = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = log_pipe.read_to_string(&mut text);
            text
        });
        let port = forwarded_port(&mut lines);
        // Two connections one after the other, and a payload larger than one SPDY frame.
        for round in 0..2 {
            let mut conn =
                TcpStream::connect(("127.0.0.1", port)).expect("connect to the forwarded port");
            conn.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + round) as u8).collect();
            conn.write_all(&payload).unwrap();
            let mut echoed = vec![0u8; payload.len()];
            conn.read_exact(&mut echoed).expect("read the echo");
            assert!(
                echoed == payload,
                "echo differs over {protocol}, round {round}"
            );
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
fn cp_copies_a_file_in_and_back_out() {
    let fleet = TestFleet::start(1);
    let local = fleet.tempdir.path();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(local.join("in.bin"), &content).unwrap();
    for (protocol, env) in REMOTE_COMMAND {
        let remote = format!("default/hello:/tmp/{protocol}.bin");
        let src = local.join("in.bin");
        let back = local.join(format!("back-{protocol}.bin"));
        ok_stdout(&fleet.kubectl_env(&["cp", src.to_str().unwrap(), &remote], env));
        let listed = ok_stdout(
            &fleet.kubectl_env(&["exec", "hello", "-n", "default", "--", "ls", "/tmp"], env),
        );
        assert!(
            listed.contains(&format!("{protocol}.bin")),
            "over {protocol}: {listed}"
        );
        ok_stdout(&fleet.kubectl_env(&["cp", &remote, back.to_str().unwrap()], env));
        let copied = std::fs::read(&back).expect("copied file");
        assert!(
            copied == content,
            "cp round trip changed the file over {protocol}"
        );
        // With retries kubectl runs `sh -c 'tar cf - F | tail -c+N'` in the pod.
        let retried = local.join(format!("retried-{protocol}.bin"));
        ok_stdout(&fleet.kubectl_env(
            &["cp", "--retries=2", &remote, retried.to_str().unwrap()],
            env,
        ));
        let copied = std::fs::read(&retried).expect("copied file (retries)");
        assert!(
            copied == content,
            "cp --retries changed the file over {protocol}"
        );
    }
}

#[test]
fn closing_the_client_mid_exec_ends_the_session() {
    let fleet = TestFleet::start(1);
    ok_stdout(&fleet.kubectl(&["run", "sleeper", "-n", "default", "--image=busybox"]));
    for (protocol, env) in REMOTE_COMMAND {
        assert_eq!(sim::stream::active_sessions("default", "sleeper"), 0);
        let child = spawn_kubectl(
            &fleet,
            &[
                "exec", "sleeper", "-n", "default", "--", "sleep", "infinity",
            ],
            env,
            [Stdio::null(), Stdio::null(), Stdio::null()],
        );
        wait_for("the exec session to open", Duration::from_secs(30), || {
            (sim::stream::active_sessions("default", "sleeper") == 1).then_some(())
        });
        kill_then_session_ends(
            child,
            "sleeper",
            &format!("the {protocol} session to end after kubectl was killed"),
        );
    }
}

#[test]
fn exec_with_a_terminal_runs_an_interactive_shell() {
    let fleet = TestFleet::start(1);
    for (protocol, env) in REMOTE_COMMAND {
        // `script` gives kubectl a pseudo-terminal, so `-t` is honoured.
        let kubectl = format!(
            "{KUBECTL} --kubeconfig {} --cache-dir {} exec -it hello -n default -- sh",
            fleet.kubeconfig().display(),
            fleet.cache_dir().display()
        );
        let mut child = Command::new("script")
            .args(["-qec", &kubectl, "/dev/null"])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn script");
        let mut keyboard = child.stdin.take().expect("stdin");
        keyboard.write_all(b"echo tty-$HOSTNAME\rexit 4\r").unwrap();
        let mut screen = LineReader::new(child.stdout.take().expect("stdout"));
        // `$HOSTNAME` expanded by the pod's shell, not by ours: proof the line ran remotely.
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
        assert!(
            screen.seen.iter().any(|l| l.starts_with("# ")),
            "no prompt over {protocol}: {:#?}",
            screen.seen
        );
    }
}

#[test]
fn exec_without_an_upgrade_is_a_bad_request_status() {
    let fleet = TestFleet::start(1);
    let addr = fleet.handle().member_addrs()[0];
    let token = fleet.token("admin");
    let ca = fleet.fleet_ca_pem();
    let (parts, body) = fleet.runtime.block_on(async {
        let req = http::Request::post(
            "/api/v1/namespaces/default/pods/hello/exec?command=echo&command=hi&stdout=true",
        )
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
        common::raw::request(addr, &ca, req).await
    });
    assert_eq!(parts.status, 400);
    let status: serde_json::Value = serde_json::from_slice(&body).expect("Status JSON");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(status["code"], 400);
    assert_eq!(status["message"], "Upgrade request required");
}

#[test]
fn websocket_v4_client_gets_channels_and_exit_status() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;

    let fleet = TestFleet::start(1);
    let (protocol, stdout, stderr, status) = fleet.runtime.block_on(async {
        let (mut ws, protocol) = websocket_to(
            &fleet,
            "/api/v1/namespaces/default/pods/hello/exec?command=sh&command=-c\
             &command=echo%20hi%3B%20echo%20oops%20%3E%262%3B%20exit%202&stdout=true&stderr=true",
            "v4.channel.k8s.io",
        )
        .await;
        let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), Vec::new());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Ok(Some(message)) = tokio::time::timeout_at(deadline, ws.next()).await {
            match message.expect("websocket message") {
                Message::Binary(data) => match data.split_first() {
                    Some((1, rest)) => stdout.extend_from_slice(rest),
                    Some((2, rest)) => stderr.extend_from_slice(rest),
                    Some((3, rest)) => status.extend_from_slice(rest),
                    other => panic!("unexpected message {other:?}"),
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
        (protocol, stdout, stderr, status)
    });
    assert_eq!(protocol.as_deref(), Some("v4.channel.k8s.io"));
    assert_eq!(stdout, b"hi\n");
    assert_eq!(stderr, b"oops\n");
    let status: serde_json::Value = serde_json::from_slice(&status).expect("Status on channel 3");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "2");
}

#[test]
fn websocket_channel_port_forward_announces_ports_and_echoes() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let fleet = TestFleet::start(1);
    fleet.runtime.block_on(async {
        let (mut ws, protocol) = websocket_to(
            &fleet,
            "/api/v1/namespaces/default/pods/hello/portforward?ports=8080,9090",
            "v4.channel.k8s.io",
        )
        .await;
        assert_eq!(protocol.as_deref(), Some("v4.channel.k8s.io"));
        // Data and error channel of each port, each starting with the port (little-endian).
        let mut greetings = Vec::new();
        for _ in 0..4 {
            greetings.push(next_binary(&mut ws).await);
        }
        greetings.sort();
        assert_eq!(
            greetings,
            vec![
                vec![0, 0x90, 0x1f],
                vec![1, 0x90, 0x1f],
                vec![2, 0x82, 0x23],
                vec![3, 0x82, 0x23]
            ]
        );
        ws.send(Message::Binary(b"\x00first port".to_vec().into()))
            .await
            .unwrap();
        ws.send(Message::Binary(b"\x02second port".to_vec().into()))
            .await
            .unwrap();
        let echoes = vec![next_binary(&mut ws).await, next_binary(&mut ws).await];
        assert_eq!(
            echoes,
            vec![b"\x00first port".to_vec(), b"\x02second port".to_vec()]
        );
        ws.close(None).await.unwrap();
    });
}

/// The next binary message of a WebSocket, within 20 s.
async fn next_binary<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Vec<u8>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::StreamExt;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a message in time")
            .expect("connection open")
            .expect("a message");
        if let tokio_tungstenite::tungstenite::Message::Binary(data) = message {
            return data.to_vec();
        }
    }
}

#[test]
fn stopping_port_forward_ends_the_session() {
    let fleet = TestFleet::start(1);
    ok_stdout(&fleet.kubectl(&["run", "forwarded", "-n", "default", "--image=busybox"]));
    for (protocol, env) in PORT_FORWARD {
        let (child, mut lines) = kubectl_lines(
            &fleet,
            &["port-forward", "-n", "default", "pod/forwarded", ":7000"],
            env,
            Stdio::null(),
        );
        let port = forwarded_port(&mut lines);
        // kubectl dials the member lazily on some paths; a round trip proves the session is up.
        let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        conn.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        conn.read_exact(&mut one).expect("echo");
        assert_eq!(
            sim::stream::active_sessions("default", "forwarded"),
            1,
            "over {protocol}"
        );
        kill_then_session_ends(
            child,
            "forwarded",
            &format!("the {protocol} port-forward session to end"),
        );
    }
}

#[test]
fn upgrades_without_a_protocol_in_common_are_refused_with_a_status() {
    let fleet = TestFleet::start(1);
    let addr = fleet.handle().member_addrs()[0];
    let token = fleet.token("admin");
    let ca = fleet.fleet_ca_pem();
    let exec = "/api/v1/namespaces/default/pods/hello/exec?command=echo&stdout=true";
    let request = |headers: &[(&str, &str)]| {
        let mut req = http::Request::post(exec)
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"))
            .header("connection", "Upgrade");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // SPDY with only unknown stream protocols: 403, and the ones we accept are listed.
    let (parts, body) = fleet.runtime.block_on(common::raw::request(
        addr,
        &ca,
        request(&[
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v9.channel.k8s.io"),
        ]),
    ));
    assert_eq!(parts.status, 403);
    let accepted: Vec<&str> = parts
        .headers
        .get_all("x-accepted-stream-protocol-versions")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(accepted.contains(&"v4.channel.k8s.io"), "{accepted:?}");
    let status: serde_json::Value = serde_json::from_slice(&body).expect("Status JSON");
    assert_eq!(status["reason"], "Forbidden");
    // WebSocket with an unknown subprotocol: 400, no Sec-WebSocket-Accept.
    let (parts, body) = fleet.runtime.block_on(common::raw::request(
        addr,
        &ca,
        request(&[
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-protocol", "base64.channel.k8s.io"),
        ]),
    ));
    assert_eq!(parts.status, 400);
    assert!(parts.headers.get("sec-websocket-accept").is_none());
    let status: serde_json::Value = serde_json::from_slice(&body).expect("Status JSON");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "BadRequest");
}

#[test]
fn websocket_v4_stdin_may_come_in_text_frames() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let fleet = TestFleet::start(1);
    let (stdout, status) = fleet.runtime.block_on(async {
        let (mut ws, _) = websocket_to(
            &fleet,
            "/api/v1/namespaces/default/pods/hello/exec?command=head\
             &command=-c&command=5&stdin=true&stdout=true&stderr=true",
            "v4.channel.k8s.io",
        )
        .await;
        // What the Python client does: `chr(0) + data` sent as a text frame.
        ws.send(Message::Text("\u{0}hello world".into()))
            .await
            .unwrap();
        stdout_until_status(&mut ws).await
    });
    assert_eq!(stdout, b"hello");
    let status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["status"], "Success");
}

/// A WebSocket to a member over TLS.
type MemberSocket =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `path` on member 1 offering `protocol`, as admin; with the subprotocol
/// the member chose.
async fn websocket_to(
    fleet: &TestFleet,
    path: &str,
    protocol: &str,
) -> (MemberSocket, Option<String>) {
    use tokio_tungstenite::tungstenite::handshake::client::generate_key;
    let tls = common::raw::connect(
        fleet.handle().member_addrs()[0],
        &fleet.fleet_ca_pem(),
        false,
    )
    .await;
    let req = http::Request::get(format!("wss://127.0.0.1{path}"))
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {}", fleet.token("admin")))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", generate_key())
        .header("sec-websocket-protocol", protocol)
        .body(())
        .unwrap();
    let (ws, resp) = tokio_tungstenite::client_async(req, tls)
        .await
        .expect("websocket handshake");
    let chosen = resp
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().expect("subprotocol").to_owned());
    (ws, chosen)
}

/// What an exec session over `v4.channel.k8s.io` wrote on stdout (channel 1) until its Status
/// (channel 3), and that Status; any other channel fails the test.
async fn stdout_until_status(ws: &mut MemberSocket) -> (Vec<u8>, Vec<u8>) {
    let mut stdout = Vec::new();
    loop {
        let message = next_binary(ws).await;
        match message.split_first() {
            Some((1, rest)) => stdout.extend_from_slice(rest),
            Some((3, status)) => return (stdout, status.to_vec()),
            other => panic!("unexpected message {other:?}"),
        }
    }
}

#[test]
fn tty_with_stderr_requested_merges_stderr_into_stdout() {
    // The Python client sends tty=true together with stderr=true; kubelet drops stderr then.
    let fleet = TestFleet::start(1);
    let (output, _) = fleet.runtime.block_on(async {
        let (mut ws, _) = websocket_to(
            &fleet,
            "/api/v1/namespaces/default/pods/hello/exec?command=sh&command=-c\
             &command=echo%20out%3B%20echo%20err%20%3E%262&stdout=true&stderr=true&tty=true",
            "v4.channel.k8s.io",
        )
        .await;
        stdout_until_status(&mut ws).await
    });
    assert_eq!(output, b"out\r\nerr\r\n");
}
