//! The TLS side of the listener: the rustls server configuration built from the Gateway object
//! (serving certificate, client certificates verified against the client CA: required when they
//! are the only way to authenticate, optional when bearer tokens are accepted too; ALPN), and
//! the per-connection handshake that yields the certificate's identity and the protocol to speak.
//!
//! The handshake runs with tokio-rustls on the readiness-based (`poll-io`) socket `shard` hands
//! over (any `AsyncRead + AsyncWrite` stream; this module names no runtime type), so the
//! accepted stream goes to the HTTP/1.1 front-end or, when ALPN says `h2`, to the h2 one:
//! [`accept`] says which, and `server::shard` (the composition root) makes that branch. Never does
//! HTTP itself and imports no front-end. Called by `server::shard` for every connection accepted
//! on a TLS listener. The configuration itself is rebuilt when the
//! certificate, key or client CA change (`reload`): each accept loads the current one.
//!
//! A client certificate refused in the handshake (not signed by the client CA, expired, not for
//! client authentication, or missing where one is required) is logged at info, once per
//! connection, with the peer and the reason in words: it is what a user with a wrong kubeconfig
//! meets, and kubectl only says "remote error: tls: ...". Other handshake failures (scanners,
//! clients that hang up) stay at debug. Nothing of the certificate is logged but why it failed.

pub mod reload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fleetgate_config_watcher::{
    crypto_provider, parse_certs, parse_key, ReloadStatus, RouteTable, ServingTls, SharedTable,
};
use rustls::server::WebPkiClientVerifier;
use rustls::CertificateError;
use rustls::{RootCertStore, ServerConfig};
use tracing::{debug, info};

use crate::auth::ClientIdentity;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the serving TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("the Gateway has a TLS listener but no spec.tls")]
    NoServingTls,
    #[error("spec.tls has no client CA: TLS listeners require client certificates (or spec.auth with a tokenFile or oidc)")]
    NoClientCa,
    #[error("invalid {what}: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("rustls refused the configuration")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("starting the TLS reload thread")]
    Thread(#[source] std::io::Error),
}

/// Whether clients may authenticate with a bearer token (token file, OIDC, or a PassThrough
/// cluster), so that a TLS connection without a client certificate is worth accepting.
pub fn accepts_bearer_tokens(table: &RouteTable) -> bool {
    let auth = &table.gateway().auth;
    !auth.tokens.is_empty() || auth.oidc.is_some() || table.clusters().any(|c| c.pass_through)
}

/// The server configuration for TLS listeners: the Gateway's certificate, client certificates
/// verified against its client CA (optional when bearer tokens are accepted: a request without
/// any credential then gets a 401 Status instead of a failed handshake), ALPN `h2` and
/// `http/1.1`. Rebuilt by [`watch_serving`] when any of these change.
pub fn server_config(table: &RouteTable) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let (tls, bearer) = serving_inputs(table);
    build_server_config(tls.as_ref(), bearer)
}

/// What the serving configuration is built from: the Gateway's TLS material and whether bearer
/// tokens are accepted.
fn serving_inputs(table: &RouteTable) -> (Option<ServingTls>, bool) {
    (table.gateway().tls.clone(), accepts_bearer_tokens(table))
}

/// Builds the serving configuration once now and starts the thread that rebuilds it whenever the
/// published table's certificate, key, client CA (or whether bearer tokens are accepted) change.
pub fn watch_serving(
    table: &SharedTable,
    status: Arc<ReloadStatus>,
) -> Result<reload::LiveServerConfig, TlsSetupError> {
    let first = serving_inputs(&table.load());
    let live = Arc::new(arc_swap::ArcSwap::new(build_server_config(
        first.0.as_ref(),
        first.1,
    )?));
    let table = table.clone();
    reload::watch(
        fleetgate_config_watcher::material::SERVING_CERTIFICATE,
        &live,
        status,
        first,
        move || Ok(serving_inputs(&table.load())),
        |(tls, bearer)| build_server_config(tls.as_ref(), *bearer).map_err(|e| format!("{e}")),
    )
    .map_err(TlsSetupError::Thread)?;
    Ok(live)
}

fn build_server_config(
    tls: Option<&ServingTls>,
    bearer: bool,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let tls = tls.ok_or(TlsSetupError::NoServingTls)?;
    let pem_error = |what| move |reason| TlsSetupError::Pem { what, reason };
    let certs = parse_certs(&tls.cert_pem).map_err(pem_error("serving certificate"))?;
    let key = parse_key(&tls.key_pem).map_err(pem_error("serving key"))?;
    let provider = crypto_provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (&tls.client_ca_pem, bearer) {
        (None, false) => return Err(TlsSetupError::NoClientCa),
        (None, true) => builder.with_no_client_auth(),
        (Some(ca_pem), _) => {
            let mut roots = RootCertStore::empty();
            for ca in parse_certs(ca_pem).map_err(pem_error("client CA"))? {
                roots.add(ca)?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            // Still verified whenever presented; only its absence is left to the HTTP layer.
            let verifier = if bearer {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    // h2 first: kubectl and client-go take it when offered, and switch to HTTP/1.1 themselves
    // for exec, attach and port-forward.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A finished handshake: the stream, the identity its client certificate gives (empty without
/// one), and whether the client chose h2 by ALPN.
pub struct Accepted<S> {
    pub stream: tokio_rustls::server::TlsStream<S>,
    pub identity: ClientIdentity,
    pub h2: bool,
}

/// Runs the handshake on an accepted socket: `None` (logged) when it fails, times out or the
/// certificate gives no identity.
pub async fn accept<S>(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: S,
    peer: SocketAddr,
) -> Option<Accepted<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let tls = match crate::runtime::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            match refused_client_certificate(&error) {
                Some(reason) => info!(%peer, reason, "client certificate refused"),
                None => debug!(%peer, %error, "TLS handshake failed"),
            }
            return None;
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            return None;
        }
    };
    let (_, session) = tls.get_ref();
    // No certificate (allowed when bearer tokens are): an empty identity, so every request must
    // bring a token.
    let identity = match session.peer_certificates().and_then(|c| c.first()) {
        Some(cert) => match ClientIdentity::from_certificate(cert) {
            Ok(identity) => identity,
            Err(error) => {
                info!(%peer, reason = %error, "client certificate refused: it gives no identity");
                return None;
            }
        },
        None => ClientIdentity::default(),
    };
    let h2 = session.alpn_protocol() == Some(b"h2");
    Some(Accepted {
        stream: tls,
        identity,
        h2,
    })
}

/// Why the handshake refused the client's certificate, in words, when that is why it failed
/// (a server-side handshake only verifies a certificate of the client's); `None` for any other
/// failure.
fn refused_client_certificate(error: &std::io::Error) -> Option<String> {
    let error = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    let reason = match error {
        rustls::Error::NoCertificatesPresented => {
            "no client certificate presented, and this gateway accepts no bearer tokens".into()
        }
        rustls::Error::InvalidCertificate(why) => certificate_problem(why),
        _ => return None,
    };
    Some(reason)
}

/// A certificate verification error as a user reads it. rustls words some of them itself (dates,
/// key usage); the others would print as their Rust names (`UnknownIssuer`).
fn certificate_problem(why: &CertificateError) -> String {
    match why {
        CertificateError::UnknownIssuer => {
            "not signed by the gateway's client CA (spec.tls.clientCAFile)".into()
        }
        // Typically another CA of the same name (a second `certs init`), which webpki takes as
        // the issuer and then finds the signature wrong.
        CertificateError::BadSignature => {
            "not signed by the gateway's client CA (spec.tls.clientCAFile): its signature does \
             not verify against the CA of that name"
                .into()
        }
        CertificateError::BadEncoding => "it is not a well-formed certificate".into(),
        CertificateError::Expired => "it has expired".into(),
        CertificateError::NotValidYet => "it is not valid yet".into(),
        CertificateError::Revoked => "it is revoked".into(),
        CertificateError::InvalidPurpose => "it is not for client authentication".into(),
        CertificateError::UnhandledCriticalExtension => {
            "it has a critical extension the gateway does not know".into()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(error: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }

    #[test]
    fn a_refused_client_certificate_is_told_in_words() {
        let unknown = io(CertificateError::UnknownIssuer.into());
        let reason = refused_client_certificate(&unknown).unwrap();
        assert!(reason.contains("client CA"), "{reason}");
        assert!(!reason.contains("UnknownIssuer"), "{reason}");
        assert!(refused_client_certificate(&io(rustls::Error::NoCertificatesPresented)).is_some());
        // Anything else is not about the client's certificate.
        assert_eq!(
            refused_client_certificate(&io(rustls::Error::HandshakeNotComplete)),
            None
        );
        assert_eq!(
            refused_client_certificate(&std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            None
        );
    }
}
