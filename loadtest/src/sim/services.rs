//! Services of a simulated member and the apiserver's service proxy:
//! `/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/proxy/{path}` forwarded to the
//! service's backend, as kube-apiserver forwards it to an endpoint.
//!
//! `sim --service NS/NAME:PORT[=HOST:PORT]` (repeatable) gives every member a Service object
//! with that port, and with `=HOST:PORT` a backend for it (kube's endpoints, here one address).
//! As kube: a service the member does not have is a 404 Status; a port it does not have, or one
//! without a backend, a 503 ("no endpoints available"); `{name}` alone is its first port, and
//! the port may be named or a number; `http:` is the default scheme, and `https:` is refused
//! (the simulator speaks plain HTTP to backends). The request goes to the backend with the
//! path after `proxy` (`/` when empty) and the raw query, its body streamed, and without the
//! caller's credentials and impersonation (kube's authentication and impersonation filters take
//! `Authorization` and `Impersonate-*` off before the proxy); the answer comes back as the
//! backend wrote it, an upgrade (101) spliced both ways. One backend connection per request:
//! no pool.
//!
//! Called by `api` (before its own routing); never holds the store lock across an await.

use std::str::FromStr;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::sim::auth::{RequestAttributes, UserInfo};
use crate::sim::body::SimBody;
use crate::sim::member::Member;
use crate::sim::objects::now_rfc3339;
use crate::sim::status::ApiError;

/// One `--service`: a service port of every member, and its backend if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimService {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    /// `HOST:PORT` requests to this port go to; None: no endpoints (a 503).
    pub backend: Option<String>,
}

impl FromStr for SimService {
    type Err = String;

    /// `NS/NAME:PORT` or `NS/NAME:PORT=HOST:PORT`.
    fn from_str(spec: &str) -> Result<Self, String> {
        let form = || format!("--service {spec:?}: expected NS/NAME:PORT[=HOST:PORT]");
        let (service, backend) = match spec.split_once('=') {
            Some((service, backend)) => (service, Some(backend)),
            None => (spec, None),
        };
        let (namespace, rest) = service.split_once('/').ok_or_else(form)?;
        let (name, port) = rest.split_once(':').ok_or_else(form)?;
        let port: u16 = port.parse().map_err(|_| form())?;
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !label(namespace) || !label(name) || port == 0 {
            return Err(form());
        }
        if let Some(backend) = backend {
            let valid = backend
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return Err(form());
            }
        }
        Ok(SimService {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
            backend: backend.map(str::to_owned),
        })
    }
}

/// Creates the Service objects of `member`'s `--service`s (one per service name, with every
/// port given for it), and their namespaces where missing.
pub fn seed(member: &Member) {
    let mut by_name: Vec<(&str, &str, Vec<u16>)> = Vec::new();
    for service in &member.tuning.services {
        match by_name
            .iter_mut()
            .find(|(ns, name, _)| *ns == service.namespace && *name == service.name)
        {
            Some((_, _, ports)) => ports.push(service.port),
            None => by_name.push((&service.namespace, &service.name, vec![service.port])),
        }
    }
    for (namespace, name, ports) in by_name {
        if member.store.get("namespaces", "", namespace).is_none() {
            crate::sim::load::put(member, "namespaces", crate::sim::load::namespace(namespace));
            crate::sim::load::publish_root_ca(member, namespace);
        }
        let ip = member.allocate_ip("10.96");
        let ports: Vec<Value> = ports
            .iter()
            .map(|port| json!({"name": format!("port-{port}"), "port": port, "protocol": "TCP", "targetPort": port}))
            .collect();
        crate::sim::load::put(
            member,
            "services",
            json!({
                "kind": "Service", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": uuid::Uuid::new_v4().to_string(),
                             "creationTimestamp": now_rfc3339()},
                "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports,
                         "sessionAffinity": "None"},
                "status": {"loadBalancer": {}},
            }),
        );
    }
}

/// A service proxy request's parts, borrowed from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyPath<'a> {
    pub namespace: &'a str,
    /// `[scheme:]name[:port]`, as the path has it (the name RBAC sees).
    pub segment: &'a str,
    /// The backend's path (after `proxy`), possibly empty.
    pub rest: &'a str,
}

/// Whether `path` is a service proxy request (`/api/v1/namespaces/{ns}/services/{s}/proxy...`).
pub fn proxy_path(path: &str) -> Option<ProxyPath<'_>> {
    let after = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, after) = after.split_once('/')?;
    let after = after.strip_prefix("services/")?;
    let (segment, after) = after.split_once('/')?;
    let rest = after.strip_prefix("proxy")?;
    if !(rest.is_empty() || rest.starts_with('/')) || namespace.is_empty() || segment.is_empty() {
        return None;
    }
    Some(ProxyPath {
        namespace,
        segment,
        rest,
    })
}

/// kube's verb for a connect request by its method.
fn verb(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD | Method::OPTIONS => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// kube's `SplitSchemeNamePort`: `name`, `name:port`, `scheme:name:port` (`scheme:name:` too).
fn split_scheme_name_port(segment: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = segment.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    if name.is_empty() || !matches!(scheme, "" | "http" | "https") {
        return None;
    }
    Some((scheme, name, port))
}

/// Serves a service proxy request for `user` (authorized here as `services/proxy`).
pub async fn serve(
    member: &Member,
    user: &UserInfo,
    target: ProxyPath<'_>,
    mut req: Request<Incoming>,
) -> Result<Response<SimBody>, ApiError> {
    let verb = verb(req.method()).ok_or_else(ApiError::method_not_allowed)?;
    let attrs = RequestAttributes {
        verb,
        group: "",
        resource: "services/proxy",
        namespace: Some(target.namespace),
        name: Some(target.segment),
    };
    if !crate::sim::auth::authorize(user, &attrs) {
        return Err(crate::sim::api::forbidden(user, &attrs));
    }
    let (scheme, name, port) = split_scheme_name_port(target.segment)
        .ok_or_else(|| ApiError::bad_request("invalid service request"))?;
    let service = member
        .store
        .get("services", target.namespace, name)
        .ok_or_else(|| ApiError::not_found("services", name))?;
    let unavailable = || {
        ApiError::status(
            503,
            "ServiceUnavailable",
            format!("no endpoints available for service {name:?}"),
        )
    };
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let chosen = ports
        .iter()
        .find(|p| {
            port.is_empty()
                || p["name"].as_str() == Some(port)
                || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(port)
        })
        .and_then(|p| p["port"].as_u64())
        .ok_or_else(unavailable)?;
    if scheme == "https" {
        return Err(ApiError::status(
            503,
            "ServiceUnavailable",
            format!(
                "the simulated member does not speak https to the endpoints of service {name:?}"
            ),
        ));
    }
    let backend = member
        .tuning
        .services
        .iter()
        .find(|s| s.namespace == target.namespace && s.name == name && u64::from(s.port) == chosen)
        .and_then(|s| s.backend.clone())
        .ok_or_else(unavailable)?;
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let tcp = tokio::net::TcpStream::connect(&backend)
        .await
        .map_err(|e| backend_error(name, &e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| backend_error(name, &e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let (parts, body) = req.into_parts();
    let path = if target.rest.is_empty() {
        "/"
    } else {
        target.rest
    };
    let uri = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut forward = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(body)
        .map_err(|e| ApiError::bad_request(format!("invalid service request: {e}")))?;
    *forward.headers_mut() = forwarded_headers(&parts.headers, upgrade);
    if let Ok(host) = HeaderValue::from_str(&backend) {
        forward.headers_mut().insert(header::HOST, host);
    }
    let mut answer = sender
        .send_request(forward)
        .await
        .map_err(|e| backend_error(name, &e.to_string()))?;
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(backend_error(
                name,
                "the backend switched protocols unasked",
            ));
        };
        let backend_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            if let (Ok(client), Ok(backend)) = (client_upgrade.await, backend_upgrade.await) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(client),
                    &mut TokioIo::new(backend),
                )
                .await;
            }
        });
        let mut response = Response::new(crate::sim::body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *response.headers_mut() = answer.headers().clone();
        return Ok(response);
    }
    let (parts, body) = answer.into_parts();
    let mut response = Response::new(body.map_err(std::io::Error::other).boxed());
    *response.status_mut() = parts.status;
    *response.headers_mut() = forwarded_headers(&parts.headers, false);
    Ok(response)
}

fn backend_error(name: &str, error: &str) -> ApiError {
    ApiError::status(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service {name:?}: {error}"),
    )
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The end-to-end fields of `headers`: without hop-by-hop fields (kept for an upgrade, which
/// needs `Connection` and `Upgrade` on this hop too), `Host`, and the caller's credentials and
/// impersonation, which kube takes off before proxying.
fn forwarded_headers(headers: &HeaderMap, upgrade: bool) -> HeaderMap {
    const HOP: [&str; 8] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
    ];
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let text = name.as_str();
        let hop = HOP.contains(&text) && !(upgrade && matches!(text, "connection" | "upgrade"));
        if hop
            || text == "host"
            || text == "authorization"
            || text.starts_with("impersonate-")
            || text.starts_with("x-remote-")
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_and_proxy_paths_parse_as_kube_reads_them() {
        let service: SimService = "team-a/echo:8080=127.0.0.1:9".parse().unwrap();
        assert_eq!(service.backend.as_deref(), Some("127.0.0.1:9"));
        assert!("team-a/echo:8080"
            .parse::<SimService>()
            .unwrap()
            .backend
            .is_none());
        for bad in [
            "echo:80",
            "ns/echo",
            "ns/echo:0",
            "ns/Echo:80",
            "ns/echo:80=host",
        ] {
            assert!(bad.parse::<SimService>().is_err(), "{bad}");
        }
        let path = proxy_path("/api/v1/namespaces/a/services/http:echo:80/proxy/x/y").unwrap();
        assert_eq!(
            (path.namespace, path.segment, path.rest),
            ("a", "http:echo:80", "/x/y")
        );
        assert_eq!(
            proxy_path("/api/v1/namespaces/a/services/echo/proxy")
                .unwrap()
                .rest,
            ""
        );
        assert_eq!(
            proxy_path("/api/v1/namespaces/a/services/echo/proxyx"),
            None
        );
        assert_eq!(proxy_path("/api/v1/namespaces/a/services/echo"), None);
        assert_eq!(split_scheme_name_port("echo"), Some(("", "echo", "")));
        assert_eq!(
            split_scheme_name_port("echo:web"),
            Some(("", "echo", "web"))
        );
        assert_eq!(
            split_scheme_name_port("https:echo:443"),
            Some(("https", "echo", "443"))
        );
        assert_eq!(split_scheme_name_port("ftp:echo:21"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }
}
