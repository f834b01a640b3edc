//! Running the real kubectl (/usr/bin/kubectl) against the gateway: a command with the
//! kubeconfig and context set, its output captured, the argument lists several tests share, and
//! the checks every kubectl test makes (a run that must succeed, or fail saying why).
//!
//! It never talks to a member directly and never retries. Used by most kubectl-driven test
//! binaries (kubectl, kubectl_streams, reload, drain, identity, egress_proxy, one_pass, audit,
//! demo, tunnel, tunnel_netns, ...) and by the pull-mode harness.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// The two ways kubectl can carry exec, attach and cp: WebSocket (its default) and SPDY/3.1.
pub const REMOTE_COMMAND: [(&str, &[(&str, &str)]); 2] = [
    ("websocket", &[]),
    ("spdy", &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]),
];

/// The two ways kubectl can carry port-forward.
pub const PORT_FORWARD: [(&str, &[(&str, &str)]); 2] = [
    ("websocket", &[]),
    ("spdy", &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")]),
];

/// `kubectl port-forward` of the simulated `hello` pod's echo port 8080 to a free local port
/// (printed on stdout); split on spaces for the argument list.
pub const PORT_FORWARD_HELLO: &str = "port-forward -n default pod/hello :8080 --address 127.0.0.1";

/// The same port-forward with `-v=8`, so that its log says which protocol kubectl switched to.
pub const PORT_FORWARD_HELLO_TRACED: &str =
    "port-forward -n default pod/hello :8080 --address 127.0.0.1 -v=8";

/// kubectl's `-v=8` log shows a 101 of `protocol` (not a silent fallback to the other one) for
/// a path containing `through` (the gateway's `/clusters/NAME/`).
pub fn assert_switched(log: &str, protocol: &str, port_forward: bool, through: &str) {
    if let Err(e) = super::trace::kubectl_switched(log, protocol, port_forward) {
        panic!("{e}");
    }
    assert!(log.contains(through), "not through {through}:\n{log}");
}

/// Sends 200 KB (a pattern of its own per `round`) to a port-forward's local `port` and checks
/// the pod echoes it back unchanged; the connection, for more checks.
pub fn assert_echoed(port: u16, round: u32, what: &str) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect to the forward");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + round) as u8).collect();
    conn.write_all(&payload).unwrap();
    let mut echoed = vec![0u8; payload.len()];
    conn.read_exact(&mut echoed).expect("read the echo");
    assert!(echoed == payload, "echo differs ({what}, round {round})");
    conn
}

/// The arguments of `kubectl get configmap NAME -n default -o OUTPUT` (a `jsonpath=...`, say).
pub fn get_configmap<'a>(name: &'a str, output: &'a str) -> [&'a str; 7] {
    ["get", "configmap", name, "-n", "default", "-o", output]
}

/// `kubectl --kubeconfig KUBECONFIG --context CONTEXT`, to add arguments to. No request
/// timeout: streaming sessions (exec, port-forward, watches) set their own bounds.
pub fn kubectl_command(kubeconfig: &Path, context: &str) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", context]);
    command
}

/// Runs `kubectl ... ARGS` with a 20 s request timeout; its output, whatever the exit code.
pub fn kubectl(kubeconfig: &Path, context: &str, args: &[&str]) -> Output {
    kubectl_command(kubeconfig, context)
        .args(["--request-timeout", "20s"])
        .args(args)
        .output()
        .unwrap()
}

/// The stdout of a kubectl run that must have succeeded; `context` goes into the failure
/// message (the gateway log, usually).
pub fn succeeded(out: Output, what: &str, context: &str) -> String {
    assert!(
        out.status.success(),
        "kubectl {what} failed ({}): {}\n{context}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The output of a command (kubectl, curl, `fleetgate certs`) that must have succeeded; a
/// failure panics with `what`, the exit status and stderr.
#[track_caller]
pub fn ran(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command that must have failed with `needle` in its stderr.
#[track_caller]
pub fn assert_failed_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded, {needle:?} expected");
    assert!(stderr.contains(needle), "{needle:?} expected in: {stderr}");
}

/// `kubectl` with no kubeconfig at all: the server, the CA to trust and a client certificate
/// given as flags (what a user does with a certificate issued to them).
pub fn kubectl_with_cert(server: &str, ca: &Path, cert: &Path, key: &Path) -> Command {
    let mut command = Command::new("kubectl");
    command
        .args(["--kubeconfig", "/dev/null"])
        .arg(format!("--server={server}"))
        .arg(format!("--certificate-authority={}", ca.display()))
        .arg(format!("--client-certificate={}", cert.display()))
        .arg(format!("--client-key={}", key.display()));
    command
}

/// The `groups` of a Kubernetes userInfo (a SelfSubjectReview's `status.userInfo`, an audit
/// event's `user`), empty when absent.
pub fn groups_of(user_info: &serde_json::Value) -> Vec<String> {
    user_info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The local port of a `kubectl port-forward ... :PORT --address 127.0.0.1`, from its
/// `Forwarding from 127.0.0.1:LOCAL -> PORT` line (waited for at most 30 s).
pub fn forwarded_port(stdout: &mut super::wait::LineReader) -> u16 {
    const PREFIX: &str = "Forwarding from 127.0.0.1:";
    let line = stdout.wait_line(
        "the Forwarding line",
        std::time::Duration::from_secs(30),
        |l| l.starts_with(PREFIX),
    );
    line[PREFIX.len()..]
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

/// A kube-rs client of `kubeconfig`'s `context`.
pub async fn kube_client(kubeconfig: &Path, context: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let options = kube::config::KubeConfigOptions {
        context: Some(context.to_owned()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// alice's `get --raw` of `path` on member1 (configmaps), through the gateway
/// (`/clusters/member1{path}`) and at the member itself (impersonated, as the gateway would): the
/// member refuses her `verb`, and kubectl renders the gateway's answer exactly as the member's.
pub fn assert_refused_alike(
    gateway_kubeconfig: &Path,
    member_kubeconfig: &Path,
    path: &str,
    verb: &str,
) {
    let through = format!("/clusters/member1{path}");
    let through_gateway = kubectl(
        gateway_kubeconfig,
        "member1",
        &["--user", "alice", "get", "--raw", &through],
    );
    let at_member = kubectl(
        member_kubeconfig,
        "member1",
        &["--as", "alice", "--as-group", "devs", "get", "--raw", path],
    );
    assert!(!through_gateway.status.success());
    let refused = String::from_utf8_lossy(&through_gateway.stderr);
    assert!(
        refused.contains(&format!(
            "User \"alice\" cannot {verb} resource \"configmaps\""
        )),
        "{refused}"
    );
    assert_eq!(refused, String::from_utf8_lossy(&at_member.stderr));
}
