//! The load driver's HTTP/1.1 client: raw connections (TCP or TLS) with a request writer and a
//! response reader on httparse, so the driver costs little per request and measures the target,
//! not a client library. Independent of the gateway's codec on purpose.
//!
//! A target is `NAME=URL` (plain or `https`, verified with `--ca` or not at all with
//! `--insecure`) or `NAME=kubeconfig:PATH[:CONTEXT]`, which takes the server, CA and credentials
//! from a kubeconfig as kubectl would.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use bytes::{Buf, BytesMut};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Anything a connection can be.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where and how to reach one target.
#[derive(Clone)]
pub struct Target {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub authority: String,
    pub path_prefix: String,
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    /// Extra request headers sent on every request: the kubeconfig's bearer token, then every
    /// `--header` of the command line.
    pub headers: Vec<(String, String)>,
}

/// TLS material given on the command line for `NAME=URL` targets.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    pub ca: Option<std::path::PathBuf>,
    pub insecure: bool,
    pub alpn_h2: bool,
    /// `Name: value` headers added to every request of every target (`--header`).
    pub headers: Vec<(String, String)>,
}

/// Parses one `--header 'Name: value'`.
pub fn parse_header(spec: &str) -> anyhow::Result<(String, String)> {
    let (name, value) = spec
        .split_once(':')
        .ok_or_else(|| anyhow!("--header {spec:?} is not 'Name: value'"))?;
    let name = name.trim();
    let value = value.trim();
    http::HeaderName::from_bytes(name.as_bytes())
        .with_context(|| format!("--header {spec:?}: bad header name"))?;
    http::HeaderValue::from_str(value)
        .with_context(|| format!("--header {spec:?}: bad header value"))?;
    Ok((name.to_owned(), value.to_owned()))
}

impl Target {
    /// Parses `NAME=URL` or `NAME=kubeconfig:PATH[:CONTEXT]`.
    pub fn parse(spec: &str, opts: &TlsOptions) -> anyhow::Result<Target> {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| anyhow!("target {spec:?} is not NAME=URL"))?;
        if let Some(kc) = rest.strip_prefix("kubeconfig:") {
            let (path, context) = match kc.rsplit_once(':') {
                Some((p, c)) if !c.contains('/') => (p, Some(c)),
                _ => (kc, None),
            };
            return from_kubeconfig(name, std::path::Path::new(path), context, opts);
        }
        let ca = match &opts.ca {
            Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
            None => None,
        };
        build_target(name, rest, ca.as_deref(), None, Vec::new(), opts)
    }

    /// Parses a target that may stand for several: `NAME=kubeconfig:PATH:PREFIX*` is every
    /// context of the kubeconfig whose name starts with PREFIX (in the file's order), each a
    /// target named after its context; anything else is one target ([`Target::parse`]).
    pub fn parse_group(spec: &str, opts: &TlsOptions) -> anyhow::Result<(String, Vec<Target>)> {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| anyhow!("target {spec:?} is not NAME=URL"))?;
        let glob = rest
            .strip_prefix("kubeconfig:")
            .and_then(|kc| kc.rsplit_once(':'))
            .and_then(|(path, ctx)| Some((path, ctx.strip_suffix('*')?)));
        let Some((path, prefix)) = glob else {
            return Ok((name.to_owned(), vec![Target::parse(spec, opts)?]));
        };
        let path = std::path::Path::new(path);
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let kc: serde_yaml::Value = serde_yaml::from_str(&text)?;
        let members = kc["contexts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .filter(|c| c.starts_with(prefix))
            .map(|c| from_kubeconfig(c, path, Some(c), opts))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if members.is_empty() {
            bail!(
                "target {name}: no context of {} starts with {prefix:?}",
                path.display()
            );
        }
        Ok((name.to_owned(), members))
    }

    /// The same target, offering h2 by ALPN before HTTP/1.1 (for the h2 crate's client).
    pub fn offering_h2(&self) -> Target {
        let mut target = self.clone();
        if let Some((config, _)) = &mut target.tls {
            let mut h2 = (**config).clone();
            h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            *config = Arc::new(h2);
        }
        target
    }

    /// Opens a connection (TCP, then TLS when the target is https).
    pub async fn connect(&self) -> anyhow::Result<Box<dyn Io>> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("{}: connect {}", self.name, self.authority))?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some((config, server_name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(server_name.clone(), tcp)
                    .await
                    .with_context(|| {
                        format!("{}: TLS handshake with {}", self.name, self.authority)
                    })?;
                Ok(Box::new(tls))
            }
        }
    }

    /// GETs `/metrics` (text) on a connection of its own: the status and the body as text.
    pub async fn metrics_text(&self) -> anyhow::Result<(u16, String)> {
        let mut conn = HttpConn::new(self.connect().await?);
        let head = conn
            .send(&self.get_request("/metrics", "text/plain"))
            .await?;
        let mut body = Vec::new();
        conn.read_body(&head, |d| body.extend_from_slice(d)).await?;
        Ok((head.status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The bytes of a GET request for `path` (relative to the target's base URL).
    pub fn get_request(&self, path: &str, accept: &str) -> Vec<u8> {
        let mut request = format!(
            "GET {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fleetgate-loadtest/0.1\r\nAccept: {}\r\n",
            self.path_prefix, path, self.authority, accept
        );
        for (name, value) in &self.headers {
            request.push_str(name);
            request.push_str(": ");
            request.push_str(value);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        request.into_bytes()
    }

    /// The full URL of `path` on this target (for clients that take a URI: h2, WebSocket).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{}{}", self.authority, self.path_prefix, path)
    }
}

fn build_target(
    name: &str,
    url: &str,
    ca_pem: Option<&[u8]>,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    mut headers: Vec<(String, String)>,
    opts: &TlsOptions,
) -> anyhow::Result<Target> {
    headers.extend(opts.headers.iter().cloned());
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("target {name}: bad URL {url:?}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => bail!("target {name}: {url:?} must be http:// or https://"),
    };
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("target {name}: no host in {url:?}"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let tls = if https {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match (ca_pem, opts.insecure) {
            (Some(ca), false) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(ca) {
                    roots.add(c?)?;
                }
                builder.with_root_certificates(roots)
            }
            _ => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider))),
        };
        let mut config = match client {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = if opts.alpn_h2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Some((Arc::new(config), ServerName::try_from(host.clone())?))
    } else {
        None
    };
    Ok(Target {
        name: name.to_owned(),
        host,
        port,
        authority,
        path_prefix: uri.path().trim_end_matches('/').to_owned(),
        tls,
        headers,
    })
}

/// Reads server, CA and credentials of a context from a kubeconfig, as kubectl does (the fields
/// fleetgate's files use: `*-data` inline, file paths, and bearer tokens).
fn from_kubeconfig(
    name: &str,
    path: &std::path::Path,
    context: Option<&str>,
    opts: &TlsOptions,
) -> anyhow::Result<Target> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    let context = context
        .map(str::to_owned)
        .or_else(|| kc["current-context"].as_str().map(str::to_owned))
        .ok_or_else(|| {
            anyhow!(
                "{}: no context given and no current-context",
                path.display()
            )
        })?;
    let find = |list: &str, wanted: &str| -> anyhow::Result<serde_yaml::Value> {
        kc[list]
            .as_sequence()
            .and_then(|s| s.iter().find(|e| e["name"].as_str() == Some(wanted)))
            .cloned()
            .ok_or_else(|| anyhow!("{}: no {list} entry {wanted:?}", path.display()))
    };
    let ctx = find("contexts", &context)?;
    let cluster = find(
        "clusters",
        ctx["context"]["cluster"].as_str().unwrap_or_default(),
    )?;
    let user = find("users", ctx["context"]["user"].as_str().unwrap_or_default())?;
    let cluster = &cluster["cluster"];
    let user = &user["user"];
    let material = |data_key: &str,
                    file_key: &str,
                    v: &serde_yaml::Value|
     -> anyhow::Result<Option<Vec<u8>>> {
        if let Some(d) = v[data_key].as_str() {
            return Ok(Some(
                base64::engine::general_purpose::STANDARD.decode(d.trim())?,
            ));
        }
        if let Some(f) = v[file_key].as_str() {
            return Ok(Some(std::fs::read(base.join(f))?));
        }
        Ok(None)
    };
    let server = cluster["server"]
        .as_str()
        .ok_or_else(|| anyhow!("{}: cluster has no server", path.display()))?;
    let ca = material(
        "certificate-authority-data",
        "certificate-authority",
        cluster,
    )?;
    let cert = material("client-certificate-data", "client-certificate", user)?;
    let key = material("client-key-data", "client-key", user)?;
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((
            CertificateDer::pem_slice_iter(&c).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(&k)?,
        )),
        _ => None,
    };
    let mut headers = Vec::new();
    if let Some(t) = user["token"].as_str() {
        headers.push(("Authorization".to_owned(), format!("Bearer {t}")));
    } else if let Some(f) = user["tokenFile"].as_str() {
        headers.push((
            "Authorization".to_owned(),
            format!("Bearer {}", std::fs::read_to_string(base.join(f))?.trim()),
        ));
    }
    let insecure = opts.insecure
        || cluster["insecure-skip-tls-verify"]
            .as_bool()
            .unwrap_or(false);
    let opts = TlsOptions {
        insecure,
        ..opts.clone()
    };
    build_target(name, server, ca.as_deref(), client, headers, &opts)
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How a response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// A parsed response head.
#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    framing: Framing,
    pub close: bool,
}

/// One HTTP/1.1 connection of the driver, with its read buffer.
pub struct HttpConn {
    io: Box<dyn Io>,
    buf: BytesMut,
}

impl HttpConn {
    pub fn new(io: Box<dyn Io>) -> HttpConn {
        HttpConn {
            io,
            buf: BytesMut::with_capacity(16 * 1024),
        }
    }

    async fn fill(&mut self) -> anyhow::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        let n = self.io.read_buf(&mut self.buf).await?;
        Ok(n)
    }

    /// Sends a request and reads its response head.
    pub async fn send(&mut self, request: &[u8]) -> anyhow::Result<Head> {
        self.io.write_all(request).await?;
        self.read_head().await
    }

    async fn read_head(&mut self) -> anyhow::Result<Head> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf)? {
                httparse::Status::Complete(n) => {
                    let status = resp.code.unwrap_or(0);
                    let mut framing = Framing::UntilClose;
                    let mut close = false;
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            framing =
                                Framing::Length(std::str::from_utf8(h.value)?.trim().parse()?);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                            && h.value.eq_ignore_ascii_case(b"chunked")
                        {
                            framing = Framing::Chunked;
                        } else if h.name.eq_ignore_ascii_case("connection")
                            && h.value.eq_ignore_ascii_case(b"close")
                        {
                            close = true;
                        }
                    }
                    if status == 204 || status == 304 || status == 101 {
                        framing = Framing::Length(0);
                    }
                    self.buf.advance(n);
                    return Ok(Head {
                        status,
                        framing,
                        close,
                    });
                }
                httparse::Status::Partial => {
                    if self.fill().await? == 0 {
                        bail!("connection closed before a response head");
                    }
                }
            }
        }
    }

    /// Hands the next `len` body bytes to `on_data` as they arrive; a close before they all came
    /// is the error `cut(bytes still missing)`.
    async fn pass_on(
        &mut self,
        len: u64,
        on_data: &mut impl FnMut(&[u8]),
        cut: impl Fn(u64) -> String,
    ) -> anyhow::Result<()> {
        let mut left = len;
        while left > 0 {
            if self.buf.is_empty() && self.fill().await? == 0 {
                bail!("{}", cut(left));
            }
            let n = (self.buf.len() as u64).min(left) as usize;
            on_data(&self.buf[..n]);
            self.buf.advance(n);
            left -= n as u64;
        }
        Ok(())
    }

    /// Reads the body of `head` to its end, handing each piece of body data to `on_data`.
    /// Returns the number of body bytes.
    pub async fn read_body(
        &mut self,
        head: &Head,
        mut on_data: impl FnMut(&[u8]),
    ) -> anyhow::Result<u64> {
        let mut total = 0u64;
        match head.framing {
            Framing::Length(len) => {
                self.pass_on(len, &mut on_data, |left| {
                    format!("connection closed with {left} body bytes missing")
                })
                .await?;
                total += len;
            }
            Framing::UntilClose => loop {
                if !self.buf.is_empty() {
                    on_data(&self.buf);
                    total += self.buf.len() as u64;
                    self.buf.clear();
                }
                if self.fill().await? == 0 {
                    break;
                }
            },
            Framing::Chunked => loop {
                // chunk-size line
                let line_end = loop {
                    if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break p;
                    }
                    if self.buf.len() > 4096 {
                        bail!("chunk size line too long");
                    }
                    if self.fill().await? == 0 {
                        bail!("connection closed inside a chunked body");
                    }
                };
                let size_text = std::str::from_utf8(&self.buf[..line_end])?;
                let size_text = size_text.split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(size_text, 16)
                    .with_context(|| format!("bad chunk size {size_text:?}"))?;
                self.buf.advance(line_end + 2);
                if size == 0 {
                    // trailers end with an empty line
                    loop {
                        if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                            self.buf.advance(p + 2);
                            if p == 0 {
                                return Ok(total);
                            }
                            continue;
                        }
                        if self.fill().await? == 0 {
                            bail!("connection closed inside trailers");
                        }
                    }
                }
                self.pass_on(size, &mut on_data, |_| {
                    "connection closed inside a chunk".to_owned()
                })
                .await?;
                total += size;
                while self.buf.len() < 2 {
                    if self.fill().await? == 0 {
                        bail!("connection closed after a chunk");
                    }
                }
                if &self.buf[..2] != b"\r\n" {
                    bail!("chunk not followed by CRLF");
                }
                self.buf.advance(2);
            },
        }
        Ok(total)
    }
}
