//! Streaming subresources of a simulated pod: `pods/exec`, `pods/attach` and `pods/portforward`,
//! over SPDY/3.1 (client-go's stream protocol) and WebSocket (`v5.channel.k8s.io`,
//! `v4.channel.k8s.io`, and SPDY tunnelled in WebSocket for port-forward).
//!
//! The API router (`sim::api`) authenticates and authorizes the request and checks that the pod
//! exists, then hands it here with [`serve`]. This module negotiates the upgrade, answers 101 (or a
//! 400/403 Status when the request cannot be served) and runs the session on the upgraded
//! connection in a task of its own. It never touches the object store. The HTTP/1.1 connection
//! must be served with upgrades enabled (`serve_connection(..).with_upgrades()`).
//!
//! Layout: `spdy` (frames and the connection), `tunnel` (WebSocket as a byte stream), `exec`
//! (exec/attach sessions), `portforward`, and the simulated container: `process` (its streams),
//! `shell` (its programs), `tar`, `fs` (its files), `status` (the Status documents).

mod exec;
mod fs;
mod portforward;
mod process;
mod shell;
mod spdy;
mod status;
mod tar;
pub mod trace;
mod tunnel;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use hyper::header::{
    HeaderMap, HeaderValue, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_PROTOCOL, UPGRADE,
};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use crate::sim::body::SimBody;

/// The close frame that ends a WebSocket session normally (code 1000, no reason).
fn normal_close() -> tokio_tungstenite::tungstenite::Message {
    use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
    tokio_tungstenite::tungstenite::Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}
use exec::ChannelVersion;

pub use spdy::SpdyError;

/// What the client asked for, parsed by the router from the path and query.
#[derive(Debug, Clone)]
pub enum StreamKind {
    /// `pods/exec?command=...`: runs one of the built-in commands.
    Exec { command: Vec<String> },
    /// `pods/attach`: attaches to the container's main process (an echo of stdin).
    Attach,
    /// `pods/portforward?ports=...`: echoes the bytes it receives on every forwarded port.
    PortForward { ports: Vec<u16> },
}

/// A validated streaming request for one container of one pod.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub kind: StreamKind,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The SPDY stream protocols we speak for exec/attach, most preferred first. Like kubelet, v5
/// is not offered over SPDY (its only addition, the stdin close signal, is a WebSocket matter).
const SPDY_EXEC_PROTOCOLS: &[(&str, ChannelVersion)] = &[
    ("v4.channel.k8s.io", ChannelVersion::V4),
    ("v3.channel.k8s.io", ChannelVersion::V3),
    ("v2.channel.k8s.io", ChannelVersion::V2),
    ("channel.k8s.io", ChannelVersion::V2),
];
const SPDY_PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";
const WEBSOCKET_EXEC_PROTOCOLS: &[(&str, ChannelVersion)] = &[
    ("v5.channel.k8s.io", ChannelVersion::V5),
    ("v4.channel.k8s.io", ChannelVersion::V4),
];
const WEBSOCKET_PORT_FORWARD_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The older port-forward over WebSocket: channels per port (kube-rs, the Python client).
const WEBSOCKET_CHANNEL_PORT_FORWARD_PROTOCOL: &str = "v4.channel.k8s.io";

/// Negotiates the upgrade for `req` and, on success, spawns the session. Returns the response to
/// send: 101 Switching Protocols, or a Kubernetes Status error (400 when no known protocol or no
/// upgrade was offered).
pub fn serve(
    mut req: hyper::Request<hyper::body::Incoming>,
    target: StreamRequest,
) -> hyper::Response<SimBody> {
    if let Some(problem) = invalid_request(&target) {
        return status::bad_request(problem);
    }
    if req.version() != hyper::Version::HTTP_11 {
        // h2 has no Upgrade (and kubectl always streams over HTTP/1.1): what Go's apiserver
        // sees there is a request without upgrade headers.
        return status::bad_request("Upgrade request required");
    }
    let headers = req.headers();
    let wants_upgrade = header_tokens(headers, CONNECTION.as_str())
        .iter()
        .any(|t| t.eq_ignore_ascii_case("upgrade"));
    let upgrade = header_tokens(headers, UPGRADE.as_str());
    if !wants_upgrade || upgrade.is_empty() {
        return status::bad_request("Upgrade request required");
    }
    let plan = if upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
        negotiate_websocket(headers, &target)
    } else if upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1")) {
        negotiate_spdy(headers, &target)
    } else {
        Err(boxed_bad_request(&format!(
            "unable to upgrade: unsupported protocol {:?}",
            upgrade.join(", ")
        )))
    };
    let (plan, response) = match plan {
        Ok(ok) => ok,
        Err(response) => return *response,
    };
    debug!(
        namespace = %target.namespace,
        pod = %target.pod,
        kind = ?target.kind,
        protocol = plan.protocol_name(),
        "streaming session upgrading"
    );
    let on_upgrade = hyper::upgrade::on(&mut req);
    let guard = SessionGuard::enter(&target);
    tokio::spawn(async move {
        let _guard = guard;
        let upgraded = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(error) => {
                debug!(%error, "connection was not upgraded");
                return;
            }
        };
        run_session(plan, upgraded, target).await;
    });
    response
}

/// Streaming sessions running now, by `namespace/pod`, across every member of this process.
static ACTIVE_SESSIONS: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();

fn active_sessions_map() -> std::sync::MutexGuard<'static, HashMap<String, usize>> {
    ACTIVE_SESSIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How many exec / attach / port-forward sessions of `namespace/pod` are open right now in this
/// process (counted from the 101 until the session has closed its connection). Tests use it to
/// see that a client going away, directly or through the gateway, ends the member's session.
pub fn active_sessions(namespace: &str, pod: &str) -> usize {
    active_sessions_map()
        .get(&format!("{namespace}/{pod}"))
        .copied()
        .unwrap_or(0)
}

/// The member's `/metrics` text: `fleetgate_sim_stream_sessions{namespace,pod}`, the exec /
/// attach / port-forward sessions open now (as [`active_sessions`]: per process).
pub fn metrics_text() -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# HELP fleetgate_sim_stream_sessions Exec, attach and port-forward sessions open now\n\
         # TYPE fleetgate_sim_stream_sessions gauge\n",
    );
    let mut sessions: Vec<(String, usize)> = active_sessions_map()
        .iter()
        .map(|(key, count)| (key.clone(), *count))
        .collect();
    sessions.sort();
    for (key, count) in sessions {
        let (namespace, pod) = key.split_once('/').unwrap_or(("", &key));
        let _ = writeln!(
            out,
            "fleetgate_sim_stream_sessions{{namespace=\"{namespace}\",pod=\"{pod}\"}} {count}"
        );
    }
    out
}

/// Counts one session in [`active_sessions`] for as long as it lives.
struct SessionGuard(String);

impl SessionGuard {
    fn enter(target: &StreamRequest) -> Self {
        let key = format!("{}/{}", target.namespace, target.pod);
        *active_sessions_map().entry(key.clone()).or_insert(0) += 1;
        SessionGuard(key)
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut map = active_sessions_map();
        if let Some(count) = map.get_mut(&self.0) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.0);
            }
        }
    }
}

/// What kubelet and the apiserver refuse before any upgrade.
fn invalid_request(target: &StreamRequest) -> Option<&'static str> {
    match &target.kind {
        StreamKind::Exec { command } if command.is_empty() => {
            Some("you must specify at least one command for the container")
        }
        StreamKind::Exec { .. } | StreamKind::Attach
            if !target.stdin && !target.stdout && !target.stderr =>
        {
            Some("you must specify at least 1 of stdin, stdout, stderr")
        }
        _ => None,
    }
}

/// The session to run once the connection is upgraded.
enum SessionPlan {
    SpdyExec(ChannelVersion),
    SpdyPortForward,
    WebSocketExec(ChannelVersion),
    WebSocketPortForward,
    WebSocketChannelPortForward,
}

impl SessionPlan {
    fn protocol_name(&self) -> &'static str {
        match self {
            SessionPlan::SpdyExec(_) => "spdy",
            SessionPlan::SpdyPortForward => "spdy-portforward",
            SessionPlan::WebSocketExec(ChannelVersion::V5) => "websocket-v5",
            SessionPlan::WebSocketExec(_) => "websocket-v4",
            SessionPlan::WebSocketPortForward => "websocket-spdy-portforward",
            SessionPlan::WebSocketChannelPortForward => "websocket-channel-portforward",
        }
    }
}

async fn run_session(
    plan: SessionPlan,
    io: TokioIo<hyper::upgrade::Upgraded>,
    target: StreamRequest,
) {
    match plan {
        SessionPlan::SpdyExec(version) => exec::serve_spdy(io, target, version).await,
        SessionPlan::SpdyPortForward => {
            let ports = port_list(&target);
            portforward::serve_spdy(io, target.pod, ports).await
        }
        SessionPlan::WebSocketExec(version) => {
            let ws =
                WebSocketStream::from_raw_socket(io, Role::Server, Some(websocket_config())).await;
            exec::serve_websocket(ws, target, version).await
        }
        SessionPlan::WebSocketChannelPortForward => {
            let ws =
                WebSocketStream::from_raw_socket(io, Role::Server, Some(websocket_config())).await;
            let ports = port_list(&target);
            portforward::serve_websocket_channels(ws, target.pod, ports).await
        }
        SessionPlan::WebSocketPortForward => {
            let ws =
                WebSocketStream::from_raw_socket(io, Role::Server, Some(websocket_config())).await;
            let pipe = tunnel::websocket_as_bytes(ws);
            let ports = port_list(&target);
            portforward::serve_spdy(pipe, target.pod, ports).await
        }
    }
}

fn websocket_config() -> WebSocketConfig {
    // client-go writes stdin in 32 KiB chunks; a few MiB per message is plenty.
    WebSocketConfig::default()
        .max_message_size(Some(16 << 20))
        .max_frame_size(Some(16 << 20))
}

fn port_list(target: &StreamRequest) -> Vec<u16> {
    match &target.kind {
        StreamKind::PortForward { ports } => ports.clone(),
        _ => Vec::new(),
    }
}

/// All comma-separated values of every occurrence of header `name`, trimmed.
fn header_tokens(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn switching(headers: &[(&'static str, String)]) -> hyper::Response<SimBody> {
    let mut resp = hyper::Response::new(crate::sim::body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            resp.headers_mut().append(*name, v);
        }
    }
    resp
}

/// The first protocol in the client's order of `offered` that is `supported`, with what it
/// selects.
fn first_supported<T: Copy>(
    offered: &[String],
    supported: &[(&'static str, T)],
) -> Option<(&'static str, T)> {
    offered
        .iter()
        .find_map(|p| supported.iter().find(|(name, _)| name == p).copied())
}

/// The plan and its 101, or the refusal to send instead (boxed: a response is large).
type Negotiated = Result<(SessionPlan, hyper::Response<SimBody>), Box<hyper::Response<SimBody>>>;

fn negotiate_spdy(headers: &HeaderMap, target: &StreamRequest) -> Negotiated {
    let offered = header_tokens(headers, "x-stream-protocol-version");
    let (plan, chosen) = match target.kind {
        StreamKind::PortForward { .. } => {
            if !offered.is_empty() && !offered.iter().any(|p| p == SPDY_PORT_FORWARD_PROTOCOL) {
                return Err(Box::new(refuse_protocols(
                    &offered,
                    &[SPDY_PORT_FORWARD_PROTOCOL],
                )));
            }
            (SessionPlan::SpdyPortForward, SPDY_PORT_FORWARD_PROTOCOL)
        }
        _ => {
            if offered.is_empty() {
                // A client that offers nothing gets the first protocol (kubelet does the same).
                (SessionPlan::SpdyExec(ChannelVersion::V2), "")
            } else {
                match first_supported(&offered, SPDY_EXEC_PROTOCOLS) {
                    Some((name, version)) => (SessionPlan::SpdyExec(version), name),
                    None => {
                        let ours: Vec<&str> = SPDY_EXEC_PROTOCOLS.iter().map(|(n, _)| *n).collect();
                        return Err(Box::new(refuse_protocols(&offered, &ours)));
                    }
                }
            }
        }
    };
    let mut reply = vec![
        ("connection", "Upgrade".to_string()),
        ("upgrade", "SPDY/3.1".to_string()),
    ];
    if !chosen.is_empty() {
        reply.push(("x-stream-protocol-version", chosen.to_string()));
    }
    Ok((plan, switching(&reply)))
}

fn boxed_bad_request(message: &str) -> Box<hyper::Response<SimBody>> {
    Box::new(status::bad_request(message))
}

fn refuse_protocols(offered: &[String], ours: &[&str]) -> hyper::Response<SimBody> {
    let mut resp = status::error_response(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {ours:?}"
        ),
    );
    for p in ours {
        if let Ok(v) = HeaderValue::from_str(p) {
            resp.headers_mut()
                .append("x-accepted-stream-protocol-versions", v);
        }
    }
    resp
}

fn negotiate_websocket(headers: &HeaderMap, target: &StreamRequest) -> Negotiated {
    let Some(key) = headers.get(SEC_WEBSOCKET_KEY) else {
        return Err(boxed_bad_request(
            "websocket upgrade without Sec-WebSocket-Key",
        ));
    };
    let version_ok = header_tokens(headers, "sec-websocket-version")
        .iter()
        .any(|v| v == "13");
    if !version_ok {
        return Err(boxed_bad_request(
            "websocket upgrade requires Sec-WebSocket-Version: 13",
        ));
    }
    let offered = header_tokens(headers, SEC_WEBSOCKET_PROTOCOL.as_str());
    let (plan, chosen) = match target.kind {
        StreamKind::PortForward { ref ports } => {
            if offered.iter().any(|p| p == WEBSOCKET_PORT_FORWARD_PROTOCOL) {
                (
                    SessionPlan::WebSocketPortForward,
                    WEBSOCKET_PORT_FORWARD_PROTOCOL,
                )
            } else if offered.is_empty()
                || offered
                    .iter()
                    .any(|p| p == WEBSOCKET_CHANNEL_PORT_FORWARD_PROTOCOL)
            {
                if ports.is_empty() {
                    // kubelet needs the ports up front in this protocol: one channel pair each.
                    return Err(boxed_bad_request("query parameter \"port\" is required"));
                }
                let chosen = if offered.is_empty() {
                    ""
                } else {
                    WEBSOCKET_CHANNEL_PORT_FORWARD_PROTOCOL
                };
                (SessionPlan::WebSocketChannelPortForward, chosen)
            } else {
                return Err(boxed_bad_request(&format!(
                    "unable to upgrade: no supported port-forward subprotocol in {offered:?} (supported: {WEBSOCKET_PORT_FORWARD_PROTOCOL}, {WEBSOCKET_CHANNEL_PORT_FORWARD_PROTOCOL})"
                )));
            }
        }
        _ => {
            match first_supported(&offered, WEBSOCKET_EXEC_PROTOCOLS) {
                Some((name, version)) => (SessionPlan::WebSocketExec(version), name),
                None => {
                    return Err(boxed_bad_request(&format!(
                        "unable to upgrade: no supported WebSocket subprotocol in {offered:?} (supported: v5.channel.k8s.io, v4.channel.k8s.io)"
                    )))
                }
            }
        }
    };
    let accept = derive_accept_key(key.as_bytes());
    let mut reply = vec![
        (CONNECTION.as_str(), "Upgrade".to_string()),
        (UPGRADE.as_str(), "websocket".to_string()),
        (SEC_WEBSOCKET_ACCEPT.as_str(), accept),
    ];
    if !chosen.is_empty() {
        reply.push((SEC_WEBSOCKET_PROTOCOL.as_str(), chosen.to_string()));
    }
    Ok((plan, switching(&reply)))
}
