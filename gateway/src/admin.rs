//! The admin listener: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`, `/livez` over plain
//! HTTP/1.1, one request per connection.
//!
//! It runs on its own blocking thread, off the shards, so a slow scraper never delays the data
//! path. It never proxies anything. Called by `serve`.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use crate::metrics::Metrics;

/// Serves the admin endpoints on `listener` from a new thread.
pub fn spawn_admin(listener: TcpListener, metrics: Arc<Metrics>) -> io::Result<()> {
    listener.set_nonblocking(false)?;
    std::thread::Builder::new()
        .name("fleetgate-admin".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(error) = answer(stream, &metrics) {
                            debug!(%error, "admin request failed");
                        }
                    }
                    Err(error) => debug!(%error, "admin accept failed"),
                }
            }
        })?;
    Ok(())
}

fn answer(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while crate::http1::find_head_end(&buf, 0).is_none() {
        let n = stream.read(&mut chunk)?;
        if n == 0 || buf.len() > 16 * 1024 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let path = match request.parse(&buf) {
        Ok(_) => request.path.unwrap_or("/"),
        Err(_) => "",
    };
    let path = path.split('?').next().unwrap_or_default();
    let (status, content_type, body) = match path {
        "/metrics" => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" | "/readyz" | "/livez" => ("200 OK", "text/plain; charset=utf-8", "ok".into()),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "404 page not found\n".into(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
