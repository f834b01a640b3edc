//! Port-forward sessions (`portforward.k8s.io` over SPDY, also when the SPDY connection rides a
//! WebSocket): for every connection kubectl accepts locally it opens an error stream and a data
//! stream with the same `requestID` and `port` headers; the simulated pod echoes every byte of
//! the data stream back on it, and when the client half-closes the data stream we finish ours and
//! the error stream (empty: no error), so kubectl tears that connection down cleanly.
//!
//! Called by `stream::serve` after the 101; runs until the client closes the connection.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, info};

use super::spdy::frame::header;
use super::spdy::session::{IncomingStream, Session, StreamWriter};

/// Runs a port-forward session on a SPDY connection (plain or WebSocket-tunnelled).
pub(crate) async fn serve_spdy<IO>(io: IO, pod: String, ports: Vec<u16>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut session = match Session::start(io) {
        Ok(s) => s,
        Err(error) => {
            debug!(%error, "spdy session did not start");
            return;
        }
    };
    // Error streams waiting for their data stream, and the reverse, by request id.
    let mut error_streams: HashMap<String, StreamWriter> = HashMap::new();
    let mut waiting_data: HashMap<String, IncomingStream> = HashMap::new();
    while let Some(stream) = session.streams.recv().await {
        let request_id = header(&stream.headers, "requestid")
            .unwrap_or("")
            .to_string();
        let port = header(&stream.headers, "port").and_then(|p| p.parse::<u16>().ok());
        match header(&stream.headers, "streamtype") {
            Some("error") => {
                if let Some(data) = waiting_data.remove(&request_id) {
                    tokio::spawn(echo(data, stream.writer, port));
                } else {
                    error_streams.insert(request_id, stream.writer);
                }
            }
            Some("data") => {
                if port.is_none() {
                    debug!(?ports, "data stream without a valid port header");
                }
                match error_streams.remove(&request_id) {
                    Some(error) => {
                        tokio::spawn(echo(stream, error, port));
                    }
                    None => {
                        waiting_data.insert(request_id, stream);
                    }
                }
            }
            other => {
                debug!(streamtype = ?other, "unexpected port-forward stream; resetting it");
                let _ = stream.writer.reset().await;
            }
        }
    }
    info!(%pod, "port-forward session ended");
    session.close(Duration::ZERO).await;
}

/// Echoes one forwarded connection until the client half-closes it.
async fn echo(mut data: IncomingStream, error: StreamWriter, port: Option<u16>) {
    let mut bytes = 0usize;
    while let Some(chunk) = data.data.recv().await {
        bytes += chunk.len();
        if data.writer.write(chunk).await.is_err() {
            return;
        }
    }
    debug!(?port, bytes, "forwarded connection closed by the client");
    let _ = data.writer.finish().await;
    let _ = error.finish().await;
}
