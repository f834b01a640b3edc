//! The member dial: what the agent carries a tunnel stream to. A stream names its target: the
//! member's apiserver (`--kube-server`, else the in-cluster service account's), dialed in TCP and
//! TLS for each stream, or an in-cluster service the agent allows (`--allow-service
//! NS/NAME:PORT[=HOST:PORT]`, [`AllowedServices`]), dialed in plain TCP; a service not listed has
//! no address here, so it is never dialed. Each dial is bounded by `super::DIAL_TIMEOUT`. Called by
//! `super::serve_stream` for each stream, on the agent's tokio runtime.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use fleetgate_config_watcher::{crypto_provider, parse_server};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::carry::MemberConn;
use super::{AgentArgs, DIAL_TIMEOUT};
use crate::tunnel::wire;

/// The services this agent serves (`--allow-service`), each with the address it dials.
#[derive(Debug, Default)]
pub(super) struct AllowedServices {
    /// `NS/NAME:PORT` (as [`wire::ServiceRef`] prints it) -> `HOST:PORT`.
    by_service: HashMap<String, String>,
}

impl AllowedServices {
    fn from_args(specs: &[String]) -> anyhow::Result<AllowedServices> {
        let mut allowed = AllowedServices::default();
        for spec in specs {
            let (service, address) = match spec.split_once('=') {
                Some((service, address)) => (service, Some(address)),
                None => (spec.as_str(), None),
            };
            let service = wire::ServiceRef::parse(service)
                .map_err(|e| anyhow!("--allow-service {spec:?}: {e}"))?;
            let address = match address {
                Some(address) => {
                    let (host, port) = address.rsplit_once(':').ok_or_else(|| {
                        anyhow!("--allow-service {spec:?}: the address is HOST:PORT")
                    })?;
                    if host.is_empty() || wire::parse_port(port).is_none() {
                        bail!("--allow-service {spec:?}: the address is HOST:PORT");
                    }
                    address.to_owned()
                }
                None => service.in_cluster_address(),
            };
            allowed.by_service.insert(service.to_string(), address);
        }
        Ok(allowed)
    }

    /// The address `service` is dialed at, if it is allowed.
    pub(super) fn address(&self, service: &wire::ServiceRef<'_>) -> Option<&str> {
        self.by_service
            .get(&service.to_string())
            .map(String::as_str)
    }
}

/// Where the in-cluster service account keeps the apiserver's CA.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The member's apiserver as the agent dials it.
pub(super) struct Member {
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// The services streams may name instead of the apiserver.
    pub(super) services: AllowedServices,
}

impl Member {
    pub(super) fn from_args(args: &AgentArgs) -> anyhow::Result<Member> {
        let (server, ca) = match &args.kube_server {
            Some(server) => (server.clone(), args.kube_ca.clone()),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .context("no --kube-server, and not in a cluster (KUBERNETES_SERVICE_HOST)")?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or("443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                (
                    format!("https://{host}:{port}"),
                    Some(args.kube_ca.clone().unwrap_or(IN_CLUSTER_CA.into())),
                )
            }
        };
        let target = parse_server(&server).map_err(|e| anyhow!("--kube-server: {e}"))?;
        if !target.path_prefix.is_empty() {
            bail!("--kube-server {server:?}: a path prefix is not supported");
        }
        let tls = if target.tls {
            let ca = ca.context("--kube-server is https: give its CA with --kube-ca")?;
            let roots = super::roots(&ca)?;
            let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(target.host.clone())
                .map_err(|e| anyhow!("--kube-server host {:?}: {e}", target.host))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        Ok(Member {
            host: target.host,
            port: target.port,
            tls,
            services: AllowedServices::from_args(&args.allow_services)?,
        })
    }

    /// A new connection to the member, within [`DIAL_TIMEOUT`].
    pub(super) async fn dial(&self) -> anyhow::Result<MemberConn> {
        let attempt = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, anyhow::Error>(match &self.tls {
                None => MemberConn::Plain(tcp),
                Some((connector, name)) => {
                    MemberConn::Tls(Box::new(connector.connect(name.clone(), tcp).await?))
                }
            })
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt)
            .await
            .map_err(|_| anyhow!("connecting to {}:{} timed out", self.host, self.port))?
            .with_context(|| format!("connecting to {}:{}", self.host, self.port))
    }

    /// A new plain TCP connection to an allowed service, within [`DIAL_TIMEOUT`].
    pub(super) async fn dial_service(&self, address: &str) -> anyhow::Result<MemberConn> {
        let attempt = async {
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(MemberConn::Plain(tcp))
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt)
            .await
            .map_err(|_| anyhow!("connecting to {address} timed out"))?
            .with_context(|| format!("connecting to {address}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_services_are_parsed_strictly() {
        let specs = [
            "team-a/echo:8080".to_owned(),
            "b/web:80=127.0.0.1:9".to_owned(),
        ];
        let allowed = AllowedServices::from_args(&specs).unwrap();
        let echo = wire::ServiceRef::parse("team-a/echo:8080").unwrap();
        assert_eq!(allowed.address(&echo), Some("echo.team-a.svc:8080"));
        let web = wire::ServiceRef::parse("b/web:80").unwrap();
        assert_eq!(allowed.address(&web), Some("127.0.0.1:9"));
        let other = wire::ServiceRef::parse("b/web:81").unwrap();
        assert_eq!(allowed.address(&other), None);
        for bad in [
            "b/web",
            "b/web:80=",
            "b/web:80=host",
            "b/web:80=:1",
            "b/web:80=h:0",
            "B/web:80",
        ] {
            assert!(
                AllowedServices::from_args(&[bad.to_owned()]).is_err(),
                "{bad} accepted"
            );
        }
    }
}
