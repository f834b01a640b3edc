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
