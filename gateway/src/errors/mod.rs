//! Every error the data path can answer a client with, and the one place that turns such an error
//! into a Kubernetes `Status` response.
//!
//! Each error knows its side (downstream: the client did something wrong; upstream: the member
//! cluster failed us; internal: our own fault) so logs and metrics can tell them apart, and whether
//! the client connection may be reused after the answer (it may not after a framing error, since the
//! gateway can no longer tell where the next request starts). Nothing else in the crate writes a
//! `Status` by hand: the connection driver calls [`GatewayError::to_response`]. This module never does
//! I/O; [`log_answered`] is where an answered error is logged.

use std::cell::RefCell;
use std::io;
use std::mem::Discriminant;
use std::time::{Duration, Instant};

/// Who caused an error: decides log level and the metrics `code` family, never the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something the gateway refuses.
    Downstream,
    /// The member cluster could not be reached or answered badly.
    Upstream,
    /// A bug or resource problem inside the gateway.
    Internal,
}

/// An error the gateway answers with a `Status` of its own.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("request head is larger than {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("request has more than {limit} header fields")]
    TooManyHeaders { limit: usize },
    #[error("malformed request: {reason}")]
    BadRequest { reason: &'static str },
    #[error("HTTP version not supported: only HTTP/1.1 and HTTP/1.0 are served")]
    VersionNotSupported,
    #[error("cluster {name:?} not found")]
    UnknownCluster { name: String },
    #[error("the server could not find the requested resource: {path}")]
    NoRoute { path: String },
    #[error("Impersonate-* headers are not allowed through the gateway: it impersonates the authenticated user itself")]
    ClientImpersonation,
    /// A field name that reads as an identity field once `_` is read as `-`. Framing is sound,
    /// so the connection goes on.
    #[error("the field {name:?} reads as an identity field (Authorization, Impersonate-*, X-Remote-*) where '_' is taken for '-', and is refused")]
    UnderscoredIdentityField { name: String },
    /// No credential, or one that is expired, wrongly signed or unknown. The message is
    /// kube-apiserver's (`Unauthorized`): the reason is logged, never shown, and never the token.
    #[error("Unauthorized")]
    Unauthorized { reason: &'static str },
    /// An AccessPolicy did not grant the request (or the impersonation it asks for). The message
    /// reads like kube-apiserver's Forbidden, plus the cluster.
    #[error("{message}")]
    Forbidden {
        message: String,
        /// `details.kind` / `details.name` of the Status (the resource and its name).
        kind: String,
        name: String,
    },
    /// A fleet-view request for a kind no FleetResource merges.
    #[error("the fleet view does not merge {resource}: FleetResource objects say which kinds it merges; reach one cluster through /clusters/NAME")]
    FleetKindNotMerged { resource: String },
    /// A fleet-view request the view does not serve yet.
    #[error("the fleet view does not serve {what} on {resource} yet: reach the owning cluster through /clusters/NAME")]
    FleetNotServed {
        what: &'static str,
        resource: String,
    },
    /// A fleet continue token whose member page has expired (the member answered 410).
    #[error("the continue token has expired in cluster {cluster:?}: list again from the start")]
    FleetContinueExpired { cluster: String },
    /// A named object no cluster of the fleet view has (for this user).
    #[error("{resource} {name:?} not found in the fleet")]
    FleetObjectNotFound { resource: String, name: String },
    /// A named object several clusters have: the request must say which.
    #[error("{resource} {name:?} exists in clusters {clusters}: aim at one by adding cluster.fleetgate.io/NAME after the fleet prefix (kubectl --server https://GATEWAY/fleet/cluster.fleetgate.io/NAME), or through /clusters/NAME")]
    FleetObjectAmbiguous {
        resource: String,
        name: String,
        clusters: String,
    },
    /// No cluster that answered has the object, and some could not be asked.
    #[error("{resource} {name:?} was not found in the clusters that answered; clusters {clusters} could not be asked")]
    FleetOwnerUnknown {
        resource: String,
        name: String,
        clusters: String,
    },
    /// A create through the fleet view: it would not know which cluster to create in.
    #[error("the fleet view cannot create {resource}: create it in one cluster by adding cluster.fleetgate.io/NAME after the fleet prefix (kubectl --server https://GATEWAY/fleet/cluster.fleetgate.io/NAME), or through /clusters/NAME")]
    FleetCreate { resource: String },
    /// A rules review (`kubectl auth can-i --list`) through the fleet view: what a user may do
    /// differs per cluster, and no one list of rules would be true of the fleet.
    #[error("the fleet view does not merge selfsubjectrulesreviews: what a user may do differs per cluster; ask one cluster by adding cluster.fleetgate.io/NAME after the fleet prefix (kubectl --server https://GATEWAY/fleet/cluster.fleetgate.io/NAME auth can-i --list), or through /clusters/NAME")]
    FleetRulesReview,
    /// No member a fleet access review went to could answer it.
    #[error("no cluster of the fleet view could answer the review: {reasons}")]
    FleetReviewUnavailable { reasons: String },
    /// A fleet discovery request whose `Accept` admits no JSON discovery document (the fleet
    /// view serves no aggregated discovery, as a kube-apiserver 1.24 does not).
    #[error("only the following media types are accepted: application/json")]
    FleetDiscoveryNotAcceptable,
    /// No member the user may reach could answer a fleet discovery request.
    #[error("the fleet view could not read discovery from any cluster: {reasons}")]
    FleetDiscoveryUnavailable { reasons: String },
    #[error("upgrading to {protocol:?} is not supported: the gateway carries SPDY/3.1 and websocket upgrades (exec, attach, port-forward)")]
    UpgradeNotSupported { protocol: String },
    #[error("{protocol:?} cannot be carried over h2: exec, attach and port-forward need an HTTP/1.1 connection")]
    UpgradeOverH2 { protocol: String },
    /// A pull-mode cluster with no agent tunnel up, after waiting `waited_ms` for one.
    #[error("cluster {cluster:?} is unavailable: it is served through its agent's tunnel, and no agent of it is connected (waited {waited_ms} ms for one)")]
    NoTunnel { cluster: String, waited_ms: u64 },
    /// The direct service path (`/clusters/NAME/services/...`) for a cluster the gateway reaches
    /// directly: it serves only pull-mode clusters, whose agents hold the allow list.
    #[error("cluster {cluster:?} is reached directly, and the service path /clusters/NAME/services/... serves only pull-mode (Tunnel) clusters: reach service {service} through {proxy_path}")]
    ServicePathNotTunnelled {
        cluster: String,
        service: String,
        proxy_path: String,
    },
    /// A direct service path that is not `/services/NAMESPACE/NAME:PORT/...` with valid names
    /// and a numeric port. Not a framing error: the connection stays usable.
    #[error("malformed service path: {reason}")]
    BadServicePath { reason: &'static str },
    /// The cluster's agent does not serve this service (not in its `--allow-service` list).
    #[error("service {service} is not reachable through the agent of cluster {cluster:?}: the agent does not allow it (--allow-service)")]
    ServiceNotAllowed { cluster: String, service: String },
    /// The process is within its reserve of file descriptors: no new member connection.
    #[error("cluster {cluster:?} is unavailable: the gateway is out of file descriptors for new member connections; retry shortly")]
    OutOfDescriptors { cluster: String },
    /// The client's address holds `limits.maxMemberConnectionsPerClient` member connections.
    #[error("too many requests: this client address holds as many member connections (watches, streams, requests in flight) as the gateway allows; retry once some have ended")]
    TooManyMemberConnections,
    /// A user or a cluster is over a limit of the Gateway's `spec.fairness` (admission): the
    /// message names whom and which, `retry_after` says when to try again.
    #[error("too many requests: {message}; retry after {retry_after} s")]
    TooManyRequests { message: String, retry_after: u32 },
    #[error("cluster {cluster:?} is unavailable: connecting to {address} timed out")]
    ConnectTimeout { cluster: String, address: String },
    #[error("cluster {cluster:?} is unavailable: connecting to {address} failed")]
    Connect {
        cluster: String,
        address: String,
        #[source]
        source: io::Error,
    },
    /// The member's circuit breaker is open (`upstream::breaker`): its last connects failed, so
    /// the request is refused at once instead of waiting out a connect of its own.
    #[error("cluster {cluster:?} is unavailable: circuit open after {failures} consecutive connect failures (the last: {cause}); retry after {retry_after} s")]
    CircuitOpen {
        cluster: String,
        failures: u32,
        cause: String,
        retry_after: u32,
    },
    #[error("cluster {cluster:?} did not answer within {seconds} s")]
    ResponseHeadTimeout { cluster: String, seconds: u64 },
    #[error("cluster {cluster:?} sent an invalid response: {reason}")]
    UpstreamProtocol {
        cluster: String,
        reason: &'static str,
    },
    #[error("cluster {cluster:?} closed the connection before answering")]
    UpstreamClosed {
        cluster: String,
        #[source]
        source: Option<io::Error>,
    },
}

impl GatewayError {
    /// Which side is to blame.
    pub fn side(&self) -> Side {
        use GatewayError::*;
        match self {
            HeadTooLarge { .. }
            | TooManyHeaders { .. }
            | BadRequest { .. }
            | UnderscoredIdentityField { .. }
            | VersionNotSupported
            | UnknownCluster { .. }
            | NoRoute { .. }
            | ClientImpersonation
            | Unauthorized { .. }
            | Forbidden { .. }
            | UpgradeNotSupported { .. }
            | UpgradeOverH2 { .. }
            | FleetKindNotMerged { .. }
            | FleetNotServed { .. }
            | FleetCreate { .. }
            | FleetRulesReview
            | FleetContinueExpired { .. }
            | FleetObjectNotFound { .. }
            | FleetObjectAmbiguous { .. }
            | FleetDiscoveryNotAcceptable
            | ServicePathNotTunnelled { .. }
            | BadServicePath { .. }
            | ServiceNotAllowed { .. }
            | TooManyMemberConnections
            | TooManyRequests { .. } => Side::Downstream,
            ConnectTimeout { .. }
            | Connect { .. }
            | ResponseHeadTimeout { .. }
            | UpstreamProtocol { .. }
            | UpstreamClosed { .. }
            | NoTunnel { .. }
            | CircuitOpen { .. } => Side::Upstream,
            OutOfDescriptors { .. } => Side::Internal,
            FleetOwnerUnknown { .. }
            | FleetDiscoveryUnavailable { .. }
            | FleetReviewUnavailable { .. } => Side::Upstream,
        }
    }

    /// The HTTP status code and the Kubernetes `reason` of the Status.
    pub fn code_and_reason(&self) -> (u16, &'static str) {
        use GatewayError::*;
        match self {
            HeadTooLarge { .. } | TooManyHeaders { .. } => (431, "RequestHeaderFieldsTooLarge"),
            BadRequest { .. } | BadServicePath { .. } | UnderscoredIdentityField { .. } => {
                (400, "BadRequest")
            }
            ServicePathNotTunnelled { .. } => (404, "NotFound"),
            ServiceNotAllowed { .. } => (403, "Forbidden"),
            VersionNotSupported => (505, "BadRequest"),
            UnknownCluster { .. } | NoRoute { .. } | FleetKindNotMerged { .. } => (404, "NotFound"),
            FleetCreate { .. } | FleetRulesReview => (405, "MethodNotAllowed"),
            FleetContinueExpired { .. } => (410, "Expired"),
            FleetObjectNotFound { .. } => (404, "NotFound"),
            FleetObjectAmbiguous { .. } => (409, "Conflict"),
            FleetOwnerUnknown { .. }
            | FleetDiscoveryUnavailable { .. }
            | FleetReviewUnavailable { .. } => (503, "ServiceUnavailable"),
            FleetDiscoveryNotAcceptable => (406, "NotAcceptable"),
            FleetNotServed { .. } => (501, "NotImplemented"),
            ClientImpersonation | Forbidden { .. } => (403, "Forbidden"),
            Unauthorized { .. } => (401, "Unauthorized"),
            UpgradeNotSupported { .. } | UpgradeOverH2 { .. } => (501, "NotImplemented"),
            NoTunnel { .. }
            | OutOfDescriptors { .. }
            | ConnectTimeout { .. }
            | Connect { .. }
            | CircuitOpen { .. } => (503, "ServiceUnavailable"),
            TooManyMemberConnections | TooManyRequests { .. } => (429, "TooManyRequests"),
            ResponseHeadTimeout { .. } => (504, "Timeout"),
            UpstreamProtocol { .. } | UpstreamClosed { .. } => (502, "BadGateway"),
        }
    }

    /// Seconds after which the client may retry (`Retry-After`, which kubectl and client-go
    /// honour), for refusals that are about load, not about the request.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            GatewayError::OutOfDescriptors { .. } | GatewayError::TooManyMemberConnections => {
                Some(1)
            }
            GatewayError::TooManyRequests { retry_after, .. }
            | GatewayError::CircuitOpen { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether the client connection must be closed after the answer: after a framing error the
    /// gateway cannot know where the next request starts, so keeping the connection would invite
    /// request smuggling.
    pub fn must_close(&self) -> bool {
        matches!(
            self,
            GatewayError::HeadTooLarge { .. }
                | GatewayError::TooManyHeaders { .. }
                | GatewayError::BadRequest { .. }
                | GatewayError::VersionNotSupported
                | GatewayError::UpgradeNotSupported { .. }
        )
    }

    /// The message shown to the client: this error and its causes, one level each (also what a
    /// circuit breaker keeps as the cause it opened on).
    pub fn message(&self) -> String {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        message
    }

    /// The `Status` JSON body (compact, ending in `\n`, as kube-apiserver writes it for kubectl).
    pub fn status_body(&self) -> Vec<u8> {
        let (code, reason) = self.code_and_reason();
        let details = match self {
            GatewayError::UnknownCluster { name } => {
                serde_json::json!({ "name": name, "kind": "clusters" })
            }
            GatewayError::FleetObjectNotFound { resource, name }
            | GatewayError::FleetObjectAmbiguous { resource, name, .. } => {
                serde_json::json!({ "name": name, "kind": resource })
            }
            GatewayError::ServiceNotAllowed { service, .. } => {
                serde_json::json!({ "name": service, "kind": "services" })
            }
            GatewayError::Forbidden { kind, name, .. } => {
                let mut details = serde_json::Map::new();
                if !name.is_empty() {
                    details.insert("name".into(), name.as_str().into());
                }
                if !kind.is_empty() {
                    details.insert("kind".into(), kind.as_str().into());
                }
                serde_json::Value::Object(details)
            }
            _ => match self.retry_after() {
                // As kube-apiserver's 429: `details.retryAfterSeconds` beside the header.
                Some(seconds) if code == 429 => serde_json::json!({ "retryAfterSeconds": seconds }),
                _ => serde_json::json!({}),
            },
        };
        let status = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message(),
            "reason": reason,
            "details": details,
            "code": code,
        });
        let mut body = serde_json::to_vec(&status).unwrap_or_default();
        body.push(b'\n');
        body
    }

    /// A complete HTTP/1.1 response carrying the Status, with `Connection: close` when
    /// `close` is set (or the error demands it).
    pub fn to_response(&self, close: bool) -> Vec<u8> {
        let (code, _) = self.code_and_reason();
        let body = self.status_body();
        let mut out = Vec::with_capacity(body.len() + 192);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(code.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(reason_phrase(code).as_bytes());
        out.extend_from_slice(
            b"\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n",
        );
        if close || self.must_close() {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        if let Some(seconds) = self.retry_after() {
            out.extend_from_slice(format!("Retry-After: {seconds}\r\n").as_bytes());
        }
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&body);
        out
    }
}

/// The Status of a 410 `Expired`: a resourceVersion older than the watch window, as
/// kube-apiserver words it (`too old resource version: {detail}`). Sent inside a watch as an
/// ERROR event (fixtures: configmaps-watch-too-old-rv1-raw.txt).
pub fn expired_status(detail: &str) -> serde_json::Value {
    expired_said(format!("too old resource version: {detail}"))
}

/// The Status of a 410 `Expired` with the member's own `message` (a member's 410 head).
pub fn expired_said(message: String) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410
    })
}

/// The reason phrase of the status line for the codes this module emits.
pub fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// How often a shard logs a warning for one kind of failure; the ones between are counted into
/// the next line.
const WARN_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// Per shard: each failure kind's last warning and how many were held back since.
    static WARNED: RefCell<Vec<(Discriminant<GatewayError>, Instant, u64)>> =
        const { RefCell::new(Vec::new()) };
}

/// Logs an error the gateway answered a request with (`what`: "request", "h2 request").
/// Refusals of the client's own doing go to debug. Failures upstream or inside warn, at most once a
/// second per shard for each kind: a member away for a few seconds fails every request sent to it,
/// and one line a second says so (with how many like it were not logged) instead of thousands.
pub fn log_answered(err: &GatewayError, what: &'static str) {
    if err.side() == Side::Downstream {
        tracing::debug!(error = %err, "refused {what}");
        return;
    }
    match warn_now(std::mem::discriminant(err), Instant::now()) {
        Some(0) => tracing::warn!(error = %err, "{what} failed"),
        Some(n) => tracing::warn!(error = %err, like_it_not_logged = n, "{what} failed"),
        None => {}
    }
}

/// Whether a failure of `kind` at `now` is logged on this shard: Some(how many like it were held
/// back since the last line), or None to hold it back.
fn warn_now(kind: Discriminant<GatewayError>, now: Instant) -> Option<u64> {
    WARNED.with(|warned| {
        let mut warned = warned.borrow_mut();
        match warned.iter_mut().find(|(k, _, _)| *k == kind) {
            Some((_, last, held)) if now.duration_since(*last) < WARN_EVERY => {
                *held += 1;
                None
            }
            Some((_, last, held)) => {
                *last = now;
                Some(std::mem::take(held))
            }
            None => {
                warned.push((kind, now, 0));
                Some(0)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_warns_once_a_second_per_kind_and_counts_the_rest() {
        let refused = GatewayError::ConnectTimeout {
            cluster: "m1".into(),
            address: "127.0.0.1:1".into(),
        };
        let timeout = std::mem::discriminant(&refused);
        let other = std::mem::discriminant(&GatewayError::OutOfDescriptors {
            cluster: "m1".into(),
        });
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(warn_now(timeout, at(0)), Some(0));
        assert_eq!(warn_now(timeout, at(10)), None);
        assert_eq!(warn_now(timeout, at(500)), None);
        // Another kind is not held back by the first.
        assert_eq!(warn_now(other, at(600)), Some(0));
        assert_eq!(warn_now(timeout, at(999)), None);
        assert_eq!(warn_now(timeout, at(1000)), Some(3));
        assert_eq!(warn_now(timeout, at(1001)), None);
        assert_eq!(warn_now(timeout, at(3000)), Some(1));
    }

    #[test]
    fn unknown_cluster_is_a_404_status_naming_the_cluster() {
        let err = GatewayError::UnknownCluster {
            name: "nope".into(),
        };
        let response = String::from_utf8(err.to_response(false)).unwrap();
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"));
        let body = response.split("\r\n\r\n").nth(1).unwrap();
        let status: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert!(status["message"].as_str().unwrap().contains("\"nope\""));
        assert!(!response.contains("Connection: close"));
    }

    #[test]
    fn too_many_requests_is_kube_apiservers_429() {
        let err = GatewayError::TooManyRequests {
            message: "user \"bob\" has 4 requests in flight".into(),
            retry_after: 3,
        };
        let response = String::from_utf8(err.to_response(false)).unwrap();
        assert!(response.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(response.contains("\r\nRetry-After: 3\r\n"));
        assert!(!response.contains("Connection: close"));
        let body = response.split("\r\n\r\n").nth(1).unwrap();
        let status: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["code"], 429);
        assert_eq!(status["details"]["retryAfterSeconds"], 3);
    }

    #[test]
    fn connect_error_message_carries_its_cause_and_framing_errors_close() {
        let err = GatewayError::Connect {
            cluster: "m1".into(),
            address: "127.0.0.1:1".into(),
            source: io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
        };
        assert_eq!(err.side(), Side::Upstream);
        assert!(err.message().ends_with(": refused"));
        let bad = GatewayError::BadRequest { reason: "x" };
        assert!(String::from_utf8(bad.to_response(false))
            .unwrap()
            .contains("Connection: close\r\n"));
    }
}
