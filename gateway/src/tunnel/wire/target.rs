//! What a tunnel stream is for, and how the agent answers it. The gateway opens one stream per
//! member connection ([`stream_request`]); its head names the target: the member's apiserver
//! ([`STREAM_URI`]), or one in-cluster service ([`service_uri`]:
//! `/service/{namespace}/{name}/{port}`), which the agent reads with [`parse_stream_path`] and
//! serves only when its `--allow-service` list has it. The agent answers 200 and carries bytes,
//! or refuses with a status and the reason in [`ERROR_HEADER`] ([`refusal`]); the gateway reads
//! that answer with [`StreamAnswer::read`].
//!
//! A path comes from the gateway and a reason from the agent: both are parsed strictly, the
//! reason kept [`printable`], and neither can panic.

use super::{is_dns_label, parse_port, printable};

/// The path of a stream the gateway opens (one member connection per stream; the request head
/// and body it carries are the member's HTTP/1.1 bytes, written by the exchange).
pub const STREAM_URI: &str = "http://fleetgate-tunnel/member";
/// The path of [`STREAM_URI`], as the agent reads it.
pub(super) const MEMBER_PATH: &str = "/member";
/// The prefix of a stream to a service: `/service/{namespace}/{name}/{port}`.
const SERVICE_PATH: &str = "/service/";

/// One in-cluster service port: what a stream to a service names, what `--allow-service` lists,
/// and what the gateway's direct service path names. Namespace and name are DNS labels (kube's
/// rule for both: 1 to 63 lower-case letters, digits and `-`, starting and ending with a letter or
/// digit), the port a number from 1 to 65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub port: u16,
}

impl<'a> ServiceRef<'a> {
    /// A service from its parts, each checked; or why not.
    pub fn new(namespace: &'a str, name: &'a str, port: &str) -> Result<Self, &'static str> {
        if !is_dns_label(namespace) {
            return Err("the service's namespace is not a valid name");
        }
        if !is_dns_label(name) {
            return Err("the service's name is not a valid name");
        }
        let port = parse_port(port).ok_or("the service's port is not a number from 1 to 65535")?;
        Ok(ServiceRef {
            namespace,
            name,
            port,
        })
    }

    /// `NS/NAME:PORT` (the `--allow-service` form, and how messages name it), strictly.
    pub fn parse(text: &'a str) -> Result<Self, &'static str> {
        let (namespace, rest) = text
            .split_once('/')
            .ok_or("a service is NAMESPACE/NAME:PORT")?;
        let (name, port) = rest
            .split_once(':')
            .ok_or("a service is NAMESPACE/NAME:PORT (the port is required)")?;
        ServiceRef::new(namespace, name, port)
    }

    /// The address a service has inside its cluster (`NAME.NAMESPACE.svc:PORT`).
    pub fn in_cluster_address(&self) -> String {
        format!("{}.{}.svc:{}", self.name, self.namespace, self.port)
    }
}

impl std::fmt::Display for ServiceRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

/// What a stream the gateway opens is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTarget<'a> {
    /// The member's apiserver.
    Member,
    /// One service port, if the agent allows it.
    Service(ServiceRef<'a>),
}

/// The URI of a stream to `service`.
pub fn service_uri(service: &ServiceRef<'_>) -> String {
    format!(
        "http://fleetgate-tunnel{SERVICE_PATH}{}/{}/{}",
        service.namespace, service.name, service.port
    )
}

/// What a stream's path (`:path` of the gateway's request) asks for, or why it is refused. Only
/// the two exact forms the gateway writes are accepted: no query, no extra segment, no encoding.
pub fn parse_stream_path(path: &str) -> Result<StreamTarget<'_>, &'static str> {
    if path == MEMBER_PATH {
        return Ok(StreamTarget::Member);
    }
    let rest = path
        .strip_prefix(SERVICE_PATH)
        .ok_or("the stream names no target this agent serves")?;
    let mut parts = rest.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(namespace), Some(name), Some(port), None) => {
            ServiceRef::new(namespace, name, port).map(StreamTarget::Service)
        }
        _ => Err("a service stream is /service/NAMESPACE/NAME/PORT"),
    }
}

/// The request head of a stream to `uri` ([`STREAM_URI`] or a [`service_uri`]); `None` if `uri`
/// is not one (it always is: the gateway builds it).
pub fn stream_request(uri: &str) -> Option<http::Request<()>> {
    http::Request::post(uri).body(()).ok()
}

/// The header of an agent's non-200 answer to a stream: why it could not reach its member.
pub const ERROR_HEADER: &str = "fleetgate-error";

/// The agent's answer to a stream it does not carry: `status` (403 for a service it does not
/// allow, 400 for a target it cannot read, 502 when its dial failed) and why, kept printable.
pub fn refusal(status: http::StatusCode, reason: &str) -> http::Response<()> {
    let mut answer = http::Response::new(());
    *answer.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(&printable(reason)) {
        answer.headers_mut().insert(ERROR_HEADER, value);
    }
    answer
}

/// What the agent's answer to a stream says, as the gateway reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamAnswer {
    /// 200: the agent reached the target; the stream carries its bytes.
    Open,
    /// 403: the agent does not serve that service (`--allow-service`); it dialed nothing.
    Forbidden,
    /// Any other status: the agent could not reach the target, and why (printable).
    Refused(String),
}

impl StreamAnswer {
    /// Reads an answer's status and [`ERROR_HEADER`].
    pub fn read<B>(response: &http::Response<B>) -> StreamAnswer {
        match response.status() {
            http::StatusCode::OK => StreamAnswer::Open,
            http::StatusCode::FORBIDDEN => StreamAnswer::Forbidden,
            status => StreamAnswer::Refused(
                response
                    .headers()
                    .get(ERROR_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(printable)
                    .unwrap_or_else(|| format!("the agent answered {status}")),
            ),
        }
    }
}
