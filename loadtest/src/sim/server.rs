//! The listener of one simulated member: TCP accept, TLS (rustls, ALPN `h2` and `http/1.1`, an
//! optional client certificate verified against the fleet CA), then hyper's HTTP/1.1 + h2 server
//! with upgrades enabled (exec / attach / port-forward), each request handed to `api::handle`.
//! A member may also get a second, plain-HTTP listener (`MemberServer::spawn_plaintext`, the
//! sim's `--plaintext`): the same handler without TLS, so proxies whose upstream leg is plain
//! HTTP/1.1 (the benchmark peers) can reach it; identity then comes from bearer tokens only.
//!
//! Owns the connection tasks, so stopping a member closes its listener and every connection it
//! accepted. Never parses a request itself. Called by `sim::start_fleet`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::sim::api;
use crate::sim::auth::UserInfo;
use crate::sim::member::Member;
use crate::sim::pki::{cert_subject, CertAuthority, IssuedCert};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a member's TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerSetupError {
    #[error("building the client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("building the TLS server configuration")]
    Tls(#[from] rustls::Error),
}

/// The TLS configuration shared by every member: the serving certificate, and client
/// certificates optional but verified against the fleet CA when presented.
pub fn tls_config(
    fleet_ca: &CertAuthority,
    serving: &IssuedCert,
) -> Result<Arc<ServerConfig>, ServerSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(fleet_ca.cert_der())?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![serving.cert_der.clone()], serving.private_key())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One running accept loop and the switch that stops it.
struct Running {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A member's listener: running, or stopped and restartable on the same address.
pub struct MemberServer {
    pub addr: SocketAddr,
    member: Arc<Member>,
    /// None: the plain-HTTP listener.
    tls: Option<Arc<ServerConfig>>,
    running: std::sync::Mutex<Option<Running>>,
}

impl MemberServer {
    /// Starts serving `member` on `listener`.
    pub fn spawn(
        member: Arc<Member>,
        listener: TcpListener,
        tls: Arc<ServerConfig>,
    ) -> std::io::Result<Self> {
        Self::spawn_with(member, listener, Some(tls))
    }

    /// Starts serving `member` on `listener` in plain HTTP (HTTP/1.1, h2 with prior knowledge).
    pub fn spawn_plaintext(member: Arc<Member>, listener: TcpListener) -> std::io::Result<Self> {
        Self::spawn_with(member, listener, None)
    }

    fn spawn_with(
        member: Arc<Member>,
        listener: TcpListener,
        tls: Option<Arc<ServerConfig>>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let server = Self {
            addr,
            member,
            tls,
            running: std::sync::Mutex::new(None),
        };
        server.run(listener);
        Ok(server)
    }

    fn run(&self, listener: TcpListener) {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            self.member.clone(),
            listener,
            self.tls.clone().map(TlsAcceptor::from),
            shutdown_rx,
        ));
        let previous = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Running { shutdown, task });
        if let Some(previous) = previous {
            // Not reachable through `restart` (it refuses a running server); stop it anyway.
            let _ = previous.shutdown.send(true);
        }
    }

    /// Closes the listener and every connection; returns once they are closed.
    pub async fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(running) = running {
            let _ = running.shutdown.send(true);
            let _ = running.task.await;
        }
    }

    /// Listens again on the same address after [`MemberServer::stop`], with the same objects.
    /// Fails if the server is running or the port has been taken meanwhile.
    pub async fn restart(&self) -> std::io::Result<()> {
        if self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "the member is running",
            ));
        }
        let listener = TcpListener::bind(self.addr).await?;
        // As a restarted apiserver whose RBAC cache is not synced yet, when the switch says so.
        self.member.faults.restarted();
        self.run(listener);
        Ok(())
    }
}

async fn accept_loop(
    member: Arc<Member>,
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(member = %member.name, %error, "accept failed");
                        // Out of descriptors and the like: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                match &acceptor {
                    Some(acceptor) => {
                        connections.spawn(serve_connection(member.clone(), acceptor.clone(), tcp, peer));
                    }
                    None => {
                        connections.spawn(serve_http(member.clone(), None, tcp, peer));
                    }
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
    tracing::info!(member = %member.name, "member stopped");
}

async fn serve_connection(
    member: Arc<Member>,
    acceptor: TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(member = %member.name, %peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(member = %member.name, %peer, "TLS handshake timed out");
            return;
        }
    };
    let cert_user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| cert_subject(cert.as_ref()))
        .filter(|subject| !subject.common_name.is_empty())
        .map(|subject| {
            let groups: Vec<&str> = subject.organizations.iter().map(String::as_str).collect();
            Arc::new(UserInfo::new(&subject.common_name, "", &groups))
        });
    serve_http(member, cert_user, tls, peer).await;
}

/// Serves HTTP/1.1 and h2 (with upgrades) on an established connection, TLS or plain.
async fn serve_http<Io>(
    member: Arc<Member>,
    cert_user: Option<Arc<UserInfo>>,
    io: Io,
    peer: SocketAddr,
) where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let member = member.clone();
        let cert_user = cert_user.clone();
        // Boxed: hyper keeps the in-flight service future inside the connection's own state, so
        // an unboxed handler would make every idle connection (every idle watch) as large as the
        // largest request state; boxed, it costs a pointer while no request is in flight.
        Box::pin(async move { Ok::<_, Infallible>(api::handle(member, cert_user, req).await) })
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().title_case_headers(true);
    builder.http2().max_concurrent_streams(100_000);
    if let Err(error) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}
