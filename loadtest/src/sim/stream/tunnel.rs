//! A WebSocket seen as a byte stream: what kubectl 1.30+ does for port-forward
//! (`SPDY/3.1+portforward.k8s.io`), carrying the SPDY connection's bytes as the payloads of
//! binary messages, with no channel byte. The SPDY session reads and writes the returned pipe
//! like a socket; two tasks copy between the pipe and the WebSocket.
//!
//! Called by `stream::serve`. A close from either side reaches the other: WebSocket close or
//! error becomes EOF on the pipe, EOF from the session becomes a WebSocket close frame.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Pipe buffer between the WebSocket and the SPDY session.
const PIPE_BYTES: usize = 64 * 1024;

/// Returns the session's end of a pipe whose other end is pumped to and from `ws`.
pub(crate) fn websocket_as_bytes<S>(ws: WebSocketStream<S>) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (session_end, pump_end) = tokio::io::duplex(PIPE_BYTES);
    let (mut pipe_rx, mut pipe_tx) = tokio::io::split(pump_end);
    let (mut ws_tx, mut ws_rx) = ws.split();
    tokio::spawn(async move {
        while let Some(message) = ws_rx.next().await {
            match message {
                Ok(Message::Binary(data)) => {
                    if pipe_tx.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = pipe_tx.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match pipe_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws_tx
                        .send(Message::Binary(buf[..n].to_vec().into()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = ws_tx.send(super::normal_close()).await;
        let _ = ws_tx.close().await;
    });
    session_end
}
