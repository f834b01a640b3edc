//! Clients of the gateway for the fleet tests: one request over HTTP/1.1 or h2 with hyper as the
//! fleet's `admin` user, and a bounded background load on one cluster that counts every answer
//! that is not 200 (the "unchanged cluster keeps working" check of the reload and drain tests).
//!
//! It never retries a failed request (a failure is what the tests look for) and its load is
//! bounded in count (20 000 requests) and time (60 s). Used by the reload and drain binaries.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::fleet::{admin_tls_config, Fleet};

/// The file of cluster `name` in a fleet directory.
pub fn cluster_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("clusters/{name}.yaml"))
}

pub async fn tls_connect(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
}

/// HTTP/1.1 or h2: the same request either way.
pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    pub async fn connect(fleet: &FleetAddrs, h2: bool) -> std::io::Result<Sender> {
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let stream = tls_connect(fleet.https, admin_tls_config(&fleet.dir, alpn)).await?;
        let io = TokioIo::new(stream);
        if h2 {
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(std::io::Error::other)?;
            tokio::spawn(connection);
            Ok(Sender::H2(sender))
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(connection);
            Ok(Sender::H1(sender))
        }
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        // HTTP/1.1 in origin form with a Host header; h2 with :scheme and :authority.
        let uri = match self {
            Sender::H1(_) => path.to_owned(),
            Sender::H2(_) => format!("https://127.0.0.1{path}"),
        };
        let mut request = http::Request::builder().method(method).uri(uri);
        if let Sender::H1(_) = self {
            request = request.header("host", "127.0.0.1");
        }
        let request = request
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        match self {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(request).await.map_err(|e| e.to_string())
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(request).await.map_err(|e| e.to_string())
            }
        }
    }

    /// A whole request: the status code and the body.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(u16, String), String> {
        let response = self.send(method, path, body).await?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// What the test's tokio tasks need of the fleet.
#[derive(Clone)]
pub struct FleetAddrs {
    pub https: SocketAddr,
    pub dir: PathBuf,
}

impl Fleet {
    pub fn addrs(&self) -> FleetAddrs {
        FleetAddrs {
            https: self.https(),
            dir: self.dir().to_path_buf(),
        }
    }

    /// A fresh connection and one request (as a new kubectl would do).
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let addrs = self.addrs();
        let (method, path, body) = (method.to_owned(), path.to_owned(), body.to_owned());
        self.runtime.block_on(async move {
            let mut sender = Sender::connect(&addrs, false).await.unwrap();
            sender.request(&method, &path, &body).await.unwrap()
        })
    }
}

/// GETs to one cluster in a loop over keep-alive connections, bounded in count and time,
/// counting answers that are not 200.
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub ok: Arc<AtomicU64>,
    pub failures: Arc<Mutex<Vec<String>>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub fn start(fleet: &Fleet, path: &'static str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let addrs = fleet.addrs();
        let (s, o, f) = (stop.clone(), ok.clone(), failures.clone());
        let task = fleet.runtime.spawn(async move {
            let started = Instant::now();
            let mut sent = 0u64;
            while !s.load(Ordering::Relaxed)
                && sent < 20_000
                && started.elapsed() < Duration::from_secs(60)
            {
                let mut sender = match Sender::connect(&addrs, false).await {
                    Ok(sender) => sender,
                    Err(e) => {
                        f.lock().unwrap().push(format!("connect: {e}"));
                        continue;
                    }
                };
                for _ in 0..50 {
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    sent += 1;
                    match sender.request("GET", path, "").await {
                        Ok((200, _)) => {
                            o.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((code, body)) => f.lock().unwrap().push(format!("{code}: {body}")),
                        Err(e) => {
                            f.lock().unwrap().push(e);
                            break;
                        }
                    }
                }
            }
        });
        Load {
            stop,
            ok,
            failures,
            task,
        }
    }

    pub fn finish(self, fleet: &Fleet) {
        self.stop.store(true, Ordering::Relaxed);
        fleet.runtime.block_on(self.task).unwrap();
        let failures = self.failures.lock().unwrap().clone();
        let ok = self.ok.load(Ordering::Relaxed);
        assert!(
            failures.is_empty(),
            "{} failed requests on the unchanged cluster (of {}): {:?}",
            failures.len(),
            ok + failures.len() as u64,
            &failures[..failures.len().min(5)]
        );
        assert!(ok >= 20, "only {ok} requests ran during the changes");
    }
}
