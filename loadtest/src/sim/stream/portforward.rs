//! Port-forward sessions (`portforward.k8s.io` over SPDY, also when the SPDY connection rides a
//! WebSocket): for every connection kubectl accepts locally it opens an error stream and a data
//! stream with the same `requestID` and `port` headers; the simulated pod echoes every byte of
//! the data stream back on it, and when the client half-closes the data stream we finish ours and
//! the error stream (empty: no error), so kubectl tears that connection down cleanly.
//!
//! The older WebSocket channel protocol (`v4.channel.k8s.io` on `pods/portforward`, used by
//! kube-rs and the Python client) is served here too, by [`serve_websocket_channels`].
//!
//! Called by `stream::serve` after the 101; runs until the client closes the connection.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use super::spdy::frame::header;
use super::spdy::session::{IncomingStream, Session, StreamWriter};

/// Runs a port-forward session on a SPDY connection (plain or WebSocket-tunnelled).
pub(crate) async fn serve_spdy<IO>(io: IO, pod: String, ports: Vec<u16>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let Some(mut session) = Session::start_logged(io) else {
        return;
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
    debug!(%pod, "port-forward session ended");
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

/// Runs a port-forward session in the older WebSocket channel protocol (`v4.channel.k8s.io`, or
/// no subprotocol), which kube-rs and the Python client use: port `i` of the request has data
/// channel `2i` and error channel `2i+1`; the server first sends each channel's port number
/// (two bytes, little-endian), then echoes every payload received on a data channel back on it.
/// There is one connection per port and no half-close: the session ends when the client closes.
pub(crate) async fn serve_websocket_channels<S>(
    ws: WebSocketStream<S>,
    pod: String,
    ports: Vec<u16>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut ws_tx, mut ws_rx) = ws.split();
    let mut greeting = Vec::with_capacity(ports.len() * 2);
    for (index, port) in ports.iter().enumerate() {
        let [lo, hi] = port.to_le_bytes();
        let data_channel = (index * 2) as u8;
        greeting.push(Message::Binary(vec![data_channel, lo, hi].into()));
        greeting.push(Message::Binary(vec![data_channel + 1, lo, hi].into()));
    }
    for message in greeting {
        if ws_tx.send(message).await.is_err() {
            return;
        }
    }
    let mut bytes = 0usize;
    while let Some(message) = ws_rx.next().await {
        let data = match message {
            Ok(Message::Binary(data)) => data,
            // Text frames carry the same bytes (the Python client sends them).
            Ok(Message::Text(text)) => bytes::Bytes::from(text),
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let Some((&channel, payload)) = data.split_first() else {
            continue;
        };
        let is_data_channel = channel % 2 == 0 && usize::from(channel / 2) < ports.len();
        if !is_data_channel || payload.is_empty() {
            continue;
        }
        bytes += payload.len();
        // The echo is the same message: channel byte and payload.
        if ws_tx.send(Message::Binary(data)).await.is_err() {
            break;
        }
    }
    debug!(%pod, ?ports, bytes, "port-forward (websocket channels) session ended");
    let _ = ws_tx.send(super::normal_close()).await;
    let _ = ws_tx.close().await;
}
