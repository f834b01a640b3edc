//! Pull mode in tests: a simulated member's Cluster made a `Tunnel` one, agent certificates
//! (`fleetgate certs issue-agent`), a real `fleetgate agent` child started and waited for (its
//! `ready` line), signals to it, raw HTTPS requests to a gateway as the fleet's `admin`, and a
//! stalled reader of a big LIST beside which small GETs must keep their latency.
//!
//! Readiness is the agent's `ready` line, never a sleep. Used by the tunnel* binaries, deploy
//! and rotation.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use super::fleet::admin_https;
use super::fleet::{fleetgate_binary, get_closing, Fleet, KillOnDrop};
use super::kubectl::ran;
use super::wait::{wait_for, LineReader};

/// `kubectl get -w` of namespace dev's ConfigMaps, each event with its type; split on spaces
/// for the argument list.
pub const WATCH_DEV_CONFIGMAPS: &str = "get configmaps -n dev -w --output-watch-events";

/// Makes `name`'s Cluster file pull-mode (`connectMode: Tunnel`, no server, no CA) and returns
/// its server URL; its CA goes to `agents/NAME-kube-ca.crt`.
pub fn make_pull_mode(fleet: &Fleet, name: &str) -> String {
    let path = fleet.fleet_path(&format!("clusters/{name}.yaml"));
    let mut cluster: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let spec = cluster["spec"].as_mapping_mut().unwrap();
    let server = spec.remove("server").unwrap().as_str().unwrap().to_owned();
    let ca = spec.remove("caData").unwrap().as_str().unwrap().to_owned();
    spec.remove("connectMode");
    spec.insert("connectMode".into(), "Tunnel".into());
    std::fs::create_dir_all(fleet.fleet_path("agents")).unwrap();
    std::fs::write(fleet.fleet_path(&format!("agents/{name}-kube-ca.crt")), ca).unwrap();
    std::fs::write(&path, serde_yaml::to_string(&cluster).unwrap()).unwrap();
    server
}

/// `fleetgate certs issue-agent --cluster CLUSTER --dir DIR`: `DIR/agent-CLUSTER.crt` and
/// `.key`, signed by `DIR/agent-ca.*` (made the first time).
pub fn issue_agent(dir: &Path, cluster: &str) {
    let out = Command::new(fleetgate_binary())
        .args(["certs", "issue-agent", "--cluster", cluster, "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    ran(out, "fleetgate certs issue-agent");
}

/// What an agent is started with, beside its gateways.
pub struct AgentSetup<'a> {
    /// `--cluster`.
    pub cluster: &'a str,
    /// The certificate and key it presents: `IDENTITY.crt` and `IDENTITY.key`.
    pub identity: PathBuf,
    /// `--kube-server` and `--kube-ca`: the member it carries streams to.
    pub kube_server: &'a str,
    pub kube_ca: PathBuf,
    /// Where its stderr (its log, `RUST_LOG=fleetgate=debug`) goes.
    pub log: PathBuf,
}

/// `LAUNCHER agent --gateway https://G ... ` for `fleet`'s gateways (their serving CA is the
/// fleet's `pki/gateway-ca.crt`); `launcher` is the `fleetgate` binary or a command that runs
/// it (inside a network namespace, say).
pub fn agent_command(
    mut launcher: Command,
    fleet: &Fleet,
    gateways: &[SocketAddr],
    setup: &AgentSetup<'_>,
) -> Command {
    let identity = |extension: &str| {
        let mut path = setup.identity.clone().into_os_string();
        path.push(extension);
        path
    };
    launcher.arg("agent");
    for gateway in gateways {
        launcher.arg("--gateway").arg(format!("https://{gateway}"));
    }
    launcher
        .args(["--cluster", setup.cluster])
        .arg("--cert")
        .arg(identity(".crt"))
        .arg("--key")
        .arg(identity(".key"))
        .arg("--ca")
        .arg(fleet.fleet_path("pki/gateway-ca.crt"))
        .args(["--kube-server", setup.kube_server])
        .arg("--kube-ca")
        .arg(&setup.kube_ca)
        .env("RUST_LOG", "fleetgate=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&setup.log).unwrap());
    launcher
}

/// A running agent: its process and its stdout lines.
pub struct Agent {
    pub child: KillOnDrop,
    _stdout: LineReader,
    pub log: PathBuf,
}

impl Agent {
    /// Starts `command` (from [`agent_command`], logging to `log`) and waits for its `ready`
    /// line; the failure message has its log and `context()` (the gateway's log, say).
    pub fn start(mut command: Command, log: &Path, context: impl FnOnce() -> String) -> Agent {
        let mut child = KillOnDrop(command.spawn().unwrap());
        let mut stdout = LineReader::new(child.stdout.take().unwrap());
        if stdout
            .wait_for_text("ready", Duration::from_secs(30))
            .is_none()
        {
            panic!(
                "the agent printed no ready line:\n{}\ngateway:\n{}",
                std::fs::read_to_string(log).unwrap_or_default(),
                context()
            );
        }
        Agent {
            child,
            _stdout: stdout,
            log: log.to_path_buf(),
        }
    }

    /// Its log so far, without colours.
    pub fn log(&self) -> String {
        without_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

/// `text` without its ANSI colour sequences (`ESC [ ... m`): the gateway's and agent's logs
/// colour field names, so `peer=ADDR` is only found in the plain text.
pub fn without_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

pub fn signal(child: &KillOnDrop, sig: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid with a valid signal touches no memory.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Waits at most `within` for `child` to exit.
pub fn exits_within(child: &mut KillOnDrop, within: Duration, what: &str) {
    wait_for(what, within, || matches!(child.try_wait(), Ok(Some(_))));
}

/// A GET of `path` on the gateway at `https` as `admin` (`Connection: close`); the whole
/// response, head included.
pub fn admin_get_at(fleet_dir: &Path, https: SocketAddr, path: &str) -> String {
    let client = admin_https(fleet_dir, TcpStream::connect(https).unwrap());
    get_closing(client, "gw", path, "")
}

/// Ten small GETs (`get ns dev`, run by `kubectl_ok`, which must name `dev`) while a
/// [`stalled_list`] holds its big LIST on the same way to the member: the slowest must answer
/// within 3 s.
#[track_caller]
pub fn assert_small_gets_keep_flowing(mut kubectl_ok: impl FnMut(&[&str]) -> String) {
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        assert!(kubectl_ok(&["get", "ns", "dev"]).contains("dev"));
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(3),
        "slowest small GET took {slowest:?}"
    );
}

/// A client of the gateway at `https` (as `admin`) that asks for `cluster`'s whole ConfigMap
/// LIST on a socket with a 4 KiB receive buffer, reads the first bytes (the head must be 200)
/// and then stops reading: the stalled reader of a flow-control test. Returns it and how many
/// bytes it read.
pub fn stalled_list(
    fleet_dir: &Path,
    https: SocketAddr,
    cluster: &str,
) -> (
    rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    usize,
) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&https.into()).unwrap();
    let mut stalled = admin_https(fleet_dir, socket.into());
    write!(
        stalled,
        "GET /clusters/{cluster}/api/v1/configmaps HTTP/1.1\r\nHost: gw\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut first = [0u8; 1024];
    let read = stalled.read(&mut first).unwrap();
    assert!(
        String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..read])
    );
    (stalled, read)
}

/// Starts the fleet's gateway (two workers, `fleetgate=debug`) with a tunnel listener on
/// 127.0.0.1:0 for agents certified by `agents/agent-ca.crt`, and `extra` arguments; returns
/// the tunnel listener's address.
pub fn serve_with_tunnel(fleet: &mut Fleet, extra: &[&str]) -> SocketAddr {
    let agent_ca = fleet.fleet_path("agents/agent-ca.crt");
    let mut args = vec![
        "--workers",
        "2",
        "--tunnel-listen",
        "127.0.0.1:0",
        "--agent-ca",
        agent_ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    fleet.serve(&args, Some("fleetgate=debug"));
    fleet.ready().addr("tunnel")
}

/// kubectl on `cluster` through the fleet's gateway, with a discovery cache of its own.
pub fn gateway_kubectl(fleet: &Fleet, cluster: &str, args: &[&str]) -> Command {
    let mut cmd = super::kubectl::kubectl_command(&fleet.gateway_kubeconfig(), cluster);
    cmd.arg("--cache-dir")
        .arg(fleet.path(&format!("kube-cache-{cluster}")))
        .args(args);
    cmd
}

/// A long-running [`gateway_kubectl`] (watch, follow, port-forward) with `env`, and its stdout
/// lines.
pub fn spawn_lines(
    fleet: &Fleet,
    cluster: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (KillOnDrop, LineReader) {
    let mut cmd = gateway_kubectl(fleet, cluster, args);
    cmd.envs(env.iter().copied());
    let mut child = KillOnDrop(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let lines = LineReader::new(child.stdout.take().unwrap());
    (child, lines)
}

/// What a kubectl user does first on `cluster` (with the simulated fleet's objects and its
/// `hello` pod), checked as they would through the gateway: the ConfigMap list is the member's
/// own (more than 20), a watch sees a ConfigMap made afterwards, `logs -f` streams, and exec
/// over WebSocket and SPDY prints `said`. Returns the list.
pub fn kubectl_basics(fleet: &Fleet, cluster: &str, said: &str) -> String {
    let list = ["get", "configmaps", "-A", "-o", "name"];
    let through = fleet.kubectl_ok(cluster, &list);
    let direct = super::kubectl::succeeded(
        super::kubectl::kubectl(&fleet.fleet_path("kubeconfig"), cluster, &list),
        "direct list",
        "",
    );
    assert_eq!(through, direct);
    assert!(through.lines().count() > 20, "{through}");

    // A watch sees a change made afterwards.
    let watch_args: Vec<&str> = WATCH_DEV_CONFIGMAPS.split(' ').collect();
    let (watch, mut events) = spawn_lines(fleet, cluster, &watch_args, &[]);
    events.wait_line("the watch's first event", Duration::from_secs(30), |l| {
        l.contains("kube-root-ca.crt")
    });
    fleet.kubectl_ok(
        cluster,
        &["create", "configmap", "-n", "dev", "made-while-watching"],
    );
    events.wait_line("the new ConfigMap's event", Duration::from_secs(30), |l| {
        l.contains("ADDED") && l.contains("made-while-watching")
    });
    drop(watch);

    // logs -f streams lines as they come.
    let follow_args = ["logs", "-f", "hello", "-n", "default"];
    let (follow, mut lines) = spawn_lines(fleet, cluster, &follow_args, &[]);
    lines.wait_line("a followed log line", Duration::from_secs(30), |l| {
        l.contains("log line 1")
    });
    drop(follow);

    // exec, over WebSocket and SPDY.
    for env in [
        ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true"),
        ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
    ] {
        let out = gateway_kubectl(
            fleet,
            cluster,
            &["exec", "hello", "-n", "default", "--", "echo", said],
        )
        .env(env.0, env.1)
        .output()
        .unwrap();
        let out = ran(out, &format!("exec {env:?}"));
        assert_eq!(out.stdout, format!("{said}\n").as_bytes(), "exec {env:?}");
    }
    through
}
