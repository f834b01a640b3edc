//! The OIDC issuer's keys when they come from a URL (`spec.auth.oidc.jwksURL`): fetched off the
//! hot path by one thread per URL, refreshed every `jwksRefreshSeconds`, and swapped into an
//! `ArcSwap` every table that names the URL shares (so a reload neither loses the keys nor
//! fetches them again).
//!
//! Blocking std I/O (a plain HTTP/1.0 GET, TLS with rustls against the configured CA) on a thread
//! of its own; the data path only loads the current key set. The first fetch happens when the
//! first table naming the URL is built (bounded by a timeout), so tokens verify as soon as the
//! gateway is ready. A fetcher stops once no table holds its keys any more. Called by
//! `auth::Authenticators::build`.
//!
//! An issuer that rotates its signing key publishes the new key before it signs with it, but a
//! token signed by it may arrive before the next scheduled refresh. A token whose `kid` no known
//! key has therefore asks for a fetch now ([`Refetch::request`], from a shard: two atomics and at
//! most one `unpark`, never a lock or I/O). Requests are coalesced and rate-limited: at most one
//! such fetch per [`REFETCH_MIN_INTERVAL`] (counted from the last fetch of any kind), so a flood
//! of made-up `kid`s costs the issuer one request per interval, not one per token.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine;
use tracing::{info, warn};

type Keys = Arc<ArcSwap<Vec<Jwk>>>;
/// The live key set of each URL a fetcher runs for (weak: the tables own the keys), and the
/// handle that asks its fetcher for an early fetch.
type Fetchers = Mutex<HashMap<String, (Weak<ArcSwap<Vec<Jwk>>>, Arc<Refetch>)>>;

/// The least time between two fetches of a URL that unknown `kid`s ask for.
pub const REFETCH_MIN_INTERVAL: Duration = Duration::from_secs(5);

/// Asks a URL's fetcher thread for a fetch before its scheduled refresh (a token named a `kid`
/// no known key has). Shared by the tables (through `OidcVerifierConfig`) and the fetcher.
#[derive(Debug)]
pub struct Refetch {
    /// Set by [`Refetch::request`], cleared by the fetcher when it fetches.
    requested: std::sync::atomic::AtomicBool,
    /// When the last fetch started, in milliseconds since `epoch`.
    last_fetch_ms: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
    min_interval: Duration,
    /// The fetcher thread, woken by a request.
    fetcher: OnceLock<std::thread::Thread>,
}

impl Refetch {
    fn new(min_interval: Duration) -> Refetch {
        Refetch {
            requested: Default::default(),
            last_fetch_ms: Default::default(),
            epoch: std::time::Instant::now(),
            min_interval,
            fetcher: OnceLock::new(),
        }
    }

    /// Asks for a fetch: coalesced with every other request until the fetcher runs it, and run
    /// no sooner than the minimum interval after the last fetch. Never blocks.
    pub fn request(&self) {
        use std::sync::atomic::Ordering;
        if !self.requested.swap(true, Ordering::AcqRel) {
            if let Some(thread) = self.fetcher.get() {
                thread.unpark();
            }
        }
    }

    fn fetched_now(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_fetch_ms
            .store(ms, std::sync::atomic::Ordering::Release);
    }

    /// When an asked-for fetch may run: the last fetch plus the minimum interval.
    fn allowed_at(&self) -> std::time::Instant {
        let last = self
            .last_fetch_ms
            .load(std::sync::atomic::Ordering::Acquire);
        self.epoch + Duration::from_millis(last) + self.min_interval
    }

    fn take_request(&self) -> bool {
        self.requested
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    fn is_requested(&self) -> bool {
        self.requested.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a failed fetch is tried again while no keys are known.
const RETRY_WITHOUT_KEYS: Duration = Duration::from_secs(2);

fn fetchers() -> &'static Fetchers {
    static FETCHERS: OnceLock<Fetchers> = OnceLock::new();
    FETCHERS.get_or_init(Default::default)
}

/// The key set of `url`: the live one when a fetcher already runs for it, otherwise a new one,
/// fetched once now and then refreshed by a new fetcher thread.
pub(crate) fn shared_keys(
    url: &str,
    refresh: Duration,
    ca_pem: Option<Vec<u8>>,
) -> (Keys, Arc<Refetch>) {
    let mut map = fetchers().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((keys, refetch)) = map
        .get(url)
        .and_then(|(keys, refetch)| Some((keys.upgrade()?, refetch.clone())))
    {
        return (keys, refetch);
    }
    let keys: Keys = Arc::new(ArcSwap::from_pointee(Vec::new()));
    let refetch = Arc::new(Refetch::new(REFETCH_MIN_INTERVAL.min(refresh)));
    refetch.fetched_now();
    match fetch_keys(url, ca_pem.as_deref()) {
        Ok(found) => {
            info!(url, keys = found.len(), "OIDC keys fetched");
            keys.store(Arc::new(found));
        }
        Err(error) => warn!(url, %error, "OIDC keys could not be fetched; retrying"),
    }
    map.insert(url.to_owned(), (Arc::downgrade(&keys), refetch.clone()));
    let weak = Arc::downgrade(&keys);
    let url = url.to_owned();
    let thread_refetch = refetch.clone();
    let spawned = std::thread::Builder::new()
        .name("jwks-fetch".into())
        .spawn(move || refresh_loop(&url, refresh, ca_pem.as_deref(), weak, &thread_refetch));
    if let Err(error) = spawned {
        warn!(%error, "cannot start the OIDC key fetcher; keys will not be refreshed");
    }
    (keys, refetch)
}

/// Fetches on schedule (every `refresh`, sooner while no key is known) and when a request asks
/// (no sooner than the refetch's minimum interval after the last fetch).
fn refresh_loop(
    url: &str,
    refresh: Duration,
    ca_pem: Option<&[u8]>,
    keys: Weak<ArcSwap<Vec<Jwk>>>,
    refetch: &Refetch,
) {
    // Set here, before the first look at the request flag: a request made before it is seen
    // by that look, and every later one finds the thread to wake.
    let _ = refetch.fetcher.set(std::thread::current());
    let schedule = |keys: &ArcSwap<Vec<Jwk>>| {
        std::time::Instant::now()
            + if keys.load().is_empty() {
                RETRY_WITHOUT_KEYS.min(refresh)
            } else {
                refresh
            }
    };
    let mut next_refresh = match keys.upgrade() {
        Some(keys) => schedule(&keys),
        None => return,
    };
    loop {
        let now = std::time::Instant::now();
        let wake = if refetch.is_requested() {
            next_refresh.min(refetch.allowed_at())
        } else {
            next_refresh
        };
        if now < wake {
            // Woken early by a request (or spuriously): the loop works out the wait again.
            std::thread::park_timeout(wake - now);
            if keys.strong_count() == 0 {
                return; // no table uses this URL any more
            }
            continue;
        }
        let asked = refetch.take_request();
        let Some(live) = keys.upgrade() else {
            return;
        };
        refetch.fetched_now();
        match fetch_keys(url, ca_pem) {
            Ok(found) => {
                if **live.load() != found {
                    info!(url, keys = found.len(), "OIDC keys changed");
                }
                live.store(Arc::new(found));
            }
            // The last good keys stay in use.
            Err(error) => warn!(url, %error, asked, "OIDC keys could not be refreshed"),
        }
        next_refresh = schedule(&live);
    }
}

/// Why a JWKS could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Url(String),
    #[error("connecting or reading: {0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP status {0}")]
    Status(String),
    #[error("JWKS: {0}")]
    Jwks(String),
}

/// One GET of `url` (HTTP/1.0, so the body ends with the connection) and its keys.
pub fn fetch_keys(url: &str, ca_pem: Option<&[u8]>) -> Result<Vec<Jwk>, FetchError> {
    let target = crate::endpoint::parse_server(url).map_err(FetchError::Url)?;
    let uri: http::Uri = url.parse().map_err(|e| FetchError::Url(format!("{e}")))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let address = std::net::ToSocketAddrs::to_socket_addrs(&(target.host.as_str(), target.port))?
        .next()
        .ok_or_else(|| FetchError::Url(format!("{url}: no address")))?;
    let tcp = std::net::TcpStream::connect_timeout(&address, FETCH_TIMEOUT)?;
    tcp.set_read_timeout(Some(FETCH_TIMEOUT))?;
    tcp.set_write_timeout(Some(FETCH_TIMEOUT))?;
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: fleetgate\r\n\r\n",
        target.authority
    );
    let mut response = Vec::new();
    if target.tls {
        let ca = ca_pem.ok_or_else(|| {
            FetchError::Tls("an https jwksURL needs spec.auth.oidc.caFile or caData".into())
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in crate::endpoint::parse_certs(ca).map_err(FetchError::Tls)? {
            roots
                .add(cert)
                .map_err(|e| FetchError::Tls(e.to_string()))?;
        }
        let config =
            rustls::ClientConfig::builder_with_provider(crate::endpoint::crypto_provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| FetchError::Tls(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| FetchError::Tls(e.to_string()))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| FetchError::Tls(e.to_string()))?;
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        stream.write_all(request.as_bytes())?;
        read_to_end_tolerant(&mut stream, &mut response)?;
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes())?;
        tcp.read_to_end(&mut response)?;
    }
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| FetchError::Status("no complete response head".into()))?;
    let status_line = response[..head_end]
        .split(|b| *b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim().to_owned())
        .unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        return Err(FetchError::Status(status_line));
    }
    let body = String::from_utf8_lossy(&response[head_end + 4..]);
    parse_jwks(&body).map_err(FetchError::Jwks)
}

/// Reads to EOF; a TLS peer that closes without close_notify still gave a whole HTTP/1.0 body.
fn read_to_end_tolerant<R: Read>(stream: &mut R, out: &mut Vec<u8>) -> std::io::Result<()> {
    match stream.read_to_end(out) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(()),
        Err(e) => Err(e),
    }
}

/// A JWT signing algorithm the gateway verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlgorithm {
    Rs256,
    Es256,
}

impl JwtAlgorithm {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "RS256" => Some(JwtAlgorithm::Rs256),
            "ES256" => Some(JwtAlgorithm::Es256),
            _ => None,
        }
    }
}

/// One public key of a JWKS, in the form ring verifies with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    pub kid: Option<String>,
    pub algorithm: JwtAlgorithm,
    /// RS256: the modulus; ES256: the uncompressed point (`04 || x || y`).
    pub n_or_point: Vec<u8>,
    /// RS256: the exponent; ES256: empty.
    pub e: Vec<u8>,
}

/// Parses a JWKS document; keys of other types or uses are skipped, none usable is an error.
pub fn parse_jwks(text: &str) -> Result<Vec<Jwk>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("no \"keys\" array")?;
    let b64 = |v: Option<&serde_json::Value>| -> Option<Vec<u8>> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(v?.as_str()?.trim_end_matches('='))
            .ok()
    };
    let mut out = Vec::new();
    for key in keys {
        if key
            .get("use")
            .and_then(|u| u.as_str())
            .is_some_and(|u| u != "sig")
        {
            continue;
        }
        let kid = key.get("kid").and_then(|k| k.as_str()).map(str::to_owned);
        match key.get("kty").and_then(|k| k.as_str()) {
            Some("RSA") => {
                if let (Some(n), Some(e)) = (b64(key.get("n")), b64(key.get("e"))) {
                    out.push(Jwk {
                        kid,
                        algorithm: JwtAlgorithm::Rs256,
                        n_or_point: n,
                        e,
                    });
                }
            }
            Some("EC") if key.get("crv").and_then(|c| c.as_str()) == Some("P-256") => {
                if let (Some(x), Some(y)) = (b64(key.get("x")), b64(key.get("y"))) {
                    if x.len() == 32 && y.len() == 32 {
                        let mut point = Vec::with_capacity(65);
                        point.push(4);
                        point.extend_from_slice(&x);
                        point.extend_from_slice(&y);
                        out.push(Jwk {
                            kid,
                            algorithm: JwtAlgorithm::Es256,
                            n_or_point: point,
                            e: Vec::new(),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    if out.is_empty() {
        return Err("no RSA or P-256 signing key in the JWKS".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot-per-connection HTTP server answering every GET with `body`.
    fn serve(body: String) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = write!(
                    stream,
                    "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}"
                );
            }
        });
        address
    }

    #[test]
    fn keys_are_fetched_from_a_url_and_shared_between_builds() {
        let jwks = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k","x":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","y":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}]}"#;
        let address = serve(jwks.to_owned());
        let url = format!("http://{address}/keys");
        let (keys, refetch) = shared_keys(&url, Duration::from_secs(60), None);
        assert_eq!(keys.load().len(), 1);
        assert_eq!(keys.load()[0].kid.as_deref(), Some("k"));
        let (again, refetch_again) = shared_keys(&url, Duration::from_secs(60), None);
        assert!(
            Arc::ptr_eq(&keys, &again) && Arc::ptr_eq(&refetch, &refetch_again),
            "a second table shares the fetched keys and their fetcher"
        );
        let missing = fetch_keys(&format!("http://{}/", crate_closed_port()), None);
        assert!(missing.is_err());
    }

    fn crate_closed_port() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    }
}
