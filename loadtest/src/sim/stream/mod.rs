//! Streaming subresources of a simulated pod: `pods/exec`, `pods/attach` and `pods/portforward`,
//! over SPDY/3.1 (client-go's stream protocol) and WebSocket (`v5.channel.k8s.io`,
//! `v4.channel.k8s.io`, and SPDY tunnelled in WebSocket for port-forward).
//!
//! The API router (`sim::api`) authenticates and authorizes the request and checks that the pod
//! exists, then hands it here with [`serve`]. This module negotiates the upgrade, answers 101 (or a
//! 400/403 Status when the request cannot be served) and runs the session on the upgraded
//! connection in a task of its own. It never touches the object store.

use crate::sim::body::SimBody;

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

/// Negotiates the upgrade for `req` and, on success, spawns the session. Returns the response to
/// send: 101 Switching Protocols, or a Kubernetes Status error (400 when no known protocol or no
/// upgrade was offered).
pub fn serve(
    req: hyper::Request<hyper::body::Incoming>,
    target: StreamRequest,
) -> hyper::Response<SimBody> {
    let _ = (req, target);
    let mut resp = hyper::Response::new(crate::sim::body::full(
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"streaming is not implemented yet","reason":"BadRequest","code":400}"#,
    ));
    *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
    resp
}
