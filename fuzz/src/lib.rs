//! What the fuzz targets share: a routing table built from a fixed configuration (two members, a
//! policy with resource, namespace and non-resource rules), and an in-memory connection that
//! hands the fuzzer's bytes to a protocol driver in chunks and swallows what it writes.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use fleetgate_config_watcher::RouteTable;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const CONFIG: &str = r#"
apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: fleetgate}
spec:
  listeners: [{name: http, address: "127.0.0.1:0", tls: false}]
  routing: {ocmStyle: true}
---
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member1, labels: {env: dev}}
spec: {server: "http://127.0.0.1:1", credentials: {token: t}}
---
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: member2}
spec: {server: "https://127.0.0.1:2/prefix", insecureSkipTLSVerify: true, impersonation: false, credentials: {token: t}}
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: dev}
spec:
  subjects: [{kind: Group, name: dev}, {kind: Group, name: system:unauthenticated}]
  clusters: {names: [member2], selector: {matchLabels: {env: dev}}}
  rules:
    - {verbs: [get, list, watch], resources: [pods, pods/log, "deployments.apps"], namespaces: [default]}
    - {verbs: [exec, create], resources: [pods/exec], resourceNames: [web]}
    - {verbs: [get], nonResourceURLs: ["/metrics", "/logs/*"]}
    - {verbs: [impersonate], resources: [users], resourceNames: [bob]}
"#;

/// The table every target decides requests against (built once per process).
pub fn table() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let files = [(PathBuf::from("/fuzz/config.yaml"), CONFIG.to_string())];
        let config = fleetgate_config_watcher::load_texts(Path::new("/fuzz"), &files)
            .expect("the fuzz configuration loads");
        RouteTable::build(&config).expect("the fuzz table builds")
    })
}

/// A connection whose peer sends `input` (in chunks of `chunk` bytes) and then closes.
pub struct Wire {
    input: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl Wire {
    pub fn new(input: &[u8], chunk: usize) -> Wire {
        Wire {
            input: input.to_vec(),
            at: 0,
            chunk: chunk.max(1),
        }
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = (self.input.len() - self.at)
            .min(self.chunk)
            .min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.input[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Polls `future` with a no-op waker until it is ready or has been pending `patience` times in a
/// row (the in-memory wire never wakes anyone: every read is ready at once).
pub fn run<F: std::future::Future>(future: F, patience: usize) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    for _ in 0..patience {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
    }
    None
}

/// Splits fuzz input into a selector byte and the rest.
pub fn split(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (0, data),
    }
}
