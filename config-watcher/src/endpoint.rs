//! What a member's endpoint is made of, as the configuration gives it: its server URL parsed into
//! an upstream target, and PEM certificates and keys, with the one crypto provider every TLS
//! configuration of fleetgate uses. Leaf functions, shared by the routing table, authentication
//! and the JWKS fetcher.

use std::sync::Arc;

use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// Where a member's API server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The `Host` header value (`host:port`, IPv6 in brackets).
    pub authority: String,
    /// A path prefix from the server URL (`https://lb/k8s/m1` -> `/k8s/m1`), `""` when none.
    pub path_prefix: String,
}

/// Parses a cluster's `spec.server` URL into an upstream target.
pub fn parse_server(server: &str) -> Result<UpstreamTarget, String> {
    let uri: http::Uri = server
        .parse()
        .map_err(|e| format!("{server:?} is not a URL: {e}"))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("{server:?}: the scheme must be https or http")),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{server:?} has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    if uri.query().is_some() {
        return Err(format!("{server:?}: a server URL cannot have a query"));
    }
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let path_prefix = uri.path().trim_end_matches('/').to_owned();
    Ok(UpstreamTarget {
        tls,
        host,
        port,
        authority,
        path_prefix,
    })
}

/// Where a `Tunnel` cluster's konnectivity agent dials its member when `spec.tunnel.address` is
/// not set: the API server's service, as any pod of the member resolves it.
pub const DEFAULT_TUNNEL_ADDRESS: &str = "kubernetes.default.svc:443";

/// Checks `spec.tunnel.address`, `host:port` (`[v6]:port`), and gives its host (the TLS server
/// name) and port. The agent dials what it is told, so nothing else gets through: no scheme,
/// path, user, spaces or control bytes, a DNS name or an IP, a port from 1 to 65535.
pub fn parse_tunnel_address(address: &str) -> Result<(String, u16), String> {
    let bad = |why: &str| format!("{address:?} is not host:port: {why}");
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => {
            let (v6, port) = rest.split_once("]:").ok_or_else(|| bad("no ]:port"))?;
            v6.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address in []"))?;
            (v6, port)
        }
        None => address.rsplit_once(':').ok_or_else(|| bad("no port"))?,
    };
    let port = match port.parse::<u16>() {
        Ok(n) if n > 0 && port.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => return Err(bad("the port must be 1 to 65535")),
    };
    if !address.starts_with('[') {
        let name_like = !host.is_empty()
            && host.len() <= 253
            && !host.starts_with(['.', '-'])
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !name_like {
            return Err(bad("the host must be a DNS name or an IP address"));
        }
    }
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| bad(&format!("not a TLS server name: {e}")))?;
    Ok((host.to_owned(), port))
}

/// The crypto provider every TLS configuration of fleetgate uses (explicit, so that a second
/// provider pulled in by a dependency can never make the choice ambiguous). One instance shared
/// by every configuration: a fleet of clusters with their own CAs would otherwise carry a copy
/// of the provider's tables per cluster.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Parses every certificate in a PEM bundle.
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bad PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block in the PEM".into());
    }
    Ok(certs)
}

/// Parses a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("bad PEM private key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_addresses_are_host_and_port_only() {
        assert_eq!(
            parse_tunnel_address(DEFAULT_TUNNEL_ADDRESS),
            Ok(("kubernetes.default.svc".to_owned(), 443))
        );
        assert_eq!(
            parse_tunnel_address("10.0.0.1:6443"),
            Ok(("10.0.0.1".to_owned(), 6443))
        );
        assert_eq!(
            parse_tunnel_address("[fd00::1]:6443"),
            Ok(("fd00::1".to_owned(), 6443))
        );
        for bad in [
            "",
            "kubernetes.default.svc",
            "https://kubernetes.default.svc:443",
            "host:0",
            "host:65536",
            "host:+443",
            "host: 443",
            ":443",
            "user@host:443",
            "host/path:443",
            "host\r\n:443",
            "-host:443",
            "[fd00::1:443",
            "[not-v6]:443",
            "fd00::1:443",
        ] {
            assert!(parse_tunnel_address(bad).is_err(), "{bad:?}");
        }
        assert!(parse_tunnel_address(&format!("{}:1", "a".repeat(254))).is_err());
    }
}
