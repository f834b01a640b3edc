//! Exec and attach sessions: wires a simulated process (`stream::shell`) to the client's streams,
//! over SPDY (client-go's stream protocol v2 to v4: one SPDY stream per standard stream, named
//! by the `streamtype` header) or over WebSocket (`v4.channel.k8s.io` and `v5.channel.k8s.io`:
//! one binary message per chunk, first byte the channel).
//!
//! Either way the session ends the same: the process exits (or cannot start), stdout and stderr
//! are drained and closed, the exit status goes on the error stream (a v4 `Status`, so kubectl
//! exits with the process's code), then the connection is closed. If the client goes away first,
//! the process is dropped. Called by `stream::serve` after the 101 is sent.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, info};

use super::fs::pod_filesystem;
use super::process::{PodContext, ProcessIo, Sink, Stdin, CHANNEL_CHUNKS};
use super::shell;
use super::spdy::frame::header;
use super::spdy::session::{IncomingStream, Session, StreamWriter};
use super::status::{exit_status_text, exit_status_v4, ProcessExit};
use super::{StreamKind, StreamRequest};

/// How long a client has to open every stream it announced (kubelet's default).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long we wait for the client to close after we said goodbye.
const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// How long an exec'd process takes to start. A kubelet starts it through the container runtime
/// (tens of milliseconds); a simulated process would otherwise write its first bytes within
/// microseconds of the 101. That matters over WebSocket: client-go (kubectl 1.32) starts reading
/// the connection before it has made its stream readers, and drops what arrives for a stream it
/// has not made yet ("Unknown stream id 1, discarding message"), so `kubectl exec -- hostname`
/// lost its output under load. SPDY has no such window (the server waits for the client's streams).
const PROCESS_START: Duration = Duration::from_millis(50);

/// The remote-command protocol version agreed in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChannelVersion {
    /// `channel.k8s.io` and `v2.channel.k8s.io`: text errors, no resize.
    V2,
    /// `v3.channel.k8s.io`: adds the resize stream.
    V3,
    /// `v4.channel.k8s.io`: the error stream carries a `Status` with the exit code.
    V4,
    /// `v5.channel.k8s.io` (WebSocket only): adds the close signal for stdin.
    V5,
}

impl ChannelVersion {
    fn status_bytes(self, exit: &ProcessExit) -> Vec<u8> {
        match self {
            ChannelVersion::V2 | ChannelVersion::V3 => exit_status_text(exit),
            ChannelVersion::V4 | ChannelVersion::V5 => exit_status_v4(exit),
        }
    }
}

/// Starts the process the request asks for, on the given streams.
fn start_process(
    target: &StreamRequest,
    io: ProcessIo,
    terminal_size: watch::Receiver<Option<(u16, u16)>>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ProcessExit> + Send>> {
    let ctx = PodContext {
        pod: target.pod.clone(),
        fs: pod_filesystem(&target.namespace, &target.pod),
        tty: target.tty,
        terminal_size,
    };
    match &target.kind {
        StreamKind::Exec { command } => {
            let command = command.clone();
            Box::pin(async move {
                tokio::time::sleep(PROCESS_START).await;
                shell::run_exec(command, io, ctx).await
            })
        }
        _ => Box::pin(shell::run_attach(io, target.stdin)),
    }
}

/// Forwards everything a process writes on `rx` to `write`, then calls `finish`.
fn pump<W, WF, F, FF>(mut rx: mpsc::Receiver<Bytes>, write: W, finish: F) -> JoinHandle<()>
where
    W: Fn(Bytes) -> WF + Send + 'static,
    WF: std::future::Future<Output = bool> + Send,
    F: FnOnce() -> FF + Send + 'static,
    FF: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        while let Some(chunk) = rx.recv().await {
            if !write(chunk).await {
                // The client is gone; keep draining so the process never blocks on us.
                while rx.recv().await.is_some() {}
                return;
            }
        }
        finish().await;
    })
}

/// Parses the resize stream (a sequence of `{"Width":W,"Height":H}` objects).
#[derive(serde::Deserialize)]
struct TerminalSizeJson {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

fn feed_resize(buffer: &mut Vec<u8>, chunk: &[u8], size: &watch::Sender<Option<(u16, u16)>>) {
    buffer.extend_from_slice(chunk);
    let mut consumed = 0;
    let mut objects = serde_json::Deserializer::from_slice(buffer).into_iter::<TerminalSizeJson>();
    while let Some(Ok(value)) = objects.next() {
        consumed = objects.byte_offset();
        size.send_replace(Some((value.width, value.height)));
    }
    buffer.drain(..consumed);
}

// ---------------------------------------------------------------------------------------------
// SPDY

#[derive(Default)]
struct SpdyStreams {
    error: Option<IncomingStream>,
    stdin: Option<IncomingStream>,
    stdout: Option<IncomingStream>,
    stderr: Option<IncomingStream>,
    resize: Option<IncomingStream>,
}

/// Runs an exec or attach session over a SPDY connection.
pub(crate) async fn serve_spdy<IO>(io: IO, target: StreamRequest, version: ChannelVersion)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let Some(mut session) = Session::start_logged(io) else {
        return;
    };
    // The client announces one stream per flag it set, plus error (v2+) and resize (v3+, tty).
    // With a terminal stderr is part of stdout; kubelet then ignores a stderr request.
    let want_stderr = target.stderr && !target.tty;
    let want_resize = target.tty && version != ChannelVersion::V2;
    let expected = 1
        + usize::from(target.stdin)
        + usize::from(target.stdout)
        + usize::from(want_stderr)
        + usize::from(want_resize);
    let mut streams = SpdyStreams::default();
    let mut received = 0;
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while received < expected {
        let stream = tokio::select! {
            s = session.streams.recv() => s,
            () = &mut deadline => {
                info!(pod = %target.pod, received, expected, "exec client did not open its streams in time");
                session.close(Duration::ZERO).await;
                return;
            }
        };
        let Some(stream) = stream else {
            debug!(pod = %target.pod, "exec client left before opening its streams");
            return;
        };
        let slot = match header(&stream.headers, "streamtype") {
            Some("error") => &mut streams.error,
            Some("stdin") => &mut streams.stdin,
            Some("stdout") => &mut streams.stdout,
            Some("stderr") => &mut streams.stderr,
            Some("resize") => &mut streams.resize,
            other => {
                debug!(streamtype = ?other, "unexpected stream type; resetting it");
                let _ = stream.writer.reset().await;
                continue;
            }
        };
        if slot.is_none() {
            received += 1;
        }
        *slot = Some(stream);
    }

    let stdin = match streams.stdin.take() {
        Some(s) => Stdin::Channel(s.data),
        None => Stdin::empty(),
    };
    let (size_tx, size_rx) = watch::channel(None);
    if let Some(mut resize) = streams.resize.take() {
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            while let Some(chunk) = resize.data.recv().await {
                feed_resize(&mut buffer, &chunk, &size_tx);
            }
        });
    }
    let mut pumps = Vec::new();
    let mut spdy_sink = |stream: Option<IncomingStream>| -> Sink {
        match stream {
            Some(s) => {
                let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
                let writer = s.writer.clone();
                let finisher = s.writer;
                pumps.push(pump(
                    rx,
                    move |chunk| {
                        let writer = writer.clone();
                        async move { writer.write(chunk).await.is_ok() }
                    },
                    move || async move {
                        let _ = finisher.finish().await;
                    },
                ));
                Sink::Channel {
                    tx,
                    crlf: target.tty,
                }
            }
            None => Sink::Discard,
        }
    };
    let stdout = spdy_sink(streams.stdout.take());
    let stderr = if target.tty {
        stdout.clone()
    } else {
        spdy_sink(streams.stderr.take())
    };
    let io = ProcessIo {
        stdin,
        stdout,
        stderr,
    };
    let process = start_process(&target, io, size_rx);
    let mut peer_gone = session.peer_gone();
    let exit = tokio::select! {
        exit = process => Some(exit),
        _ = peer_gone.wait_for(|gone| *gone) => None,
    };
    let Some(exit) = exit else {
        debug!(pod = %target.pod, "exec client went away; process stopped");
        return;
    };
    for p in pumps {
        let _ = p.await;
    }
    debug!(pod = %target.pod, exit = ?exit, "exec finished");
    if let Some(error) = streams.error.take() {
        write_status(&error.writer, version.status_bytes(&exit)).await;
    }
    session.close(CLOSE_GRACE).await;
}

async fn write_status(writer: &StreamWriter, status: Vec<u8>) {
    if !status.is_empty() {
        let _ = writer.write(Bytes::from(status)).await;
    }
    let _ = writer.finish().await;
}

// ---------------------------------------------------------------------------------------------
// WebSocket

/// Channel numbers of the WebSocket remote-command protocols.
const CHANNEL_STDIN: u8 = 0;
const CHANNEL_STDOUT: u8 = 1;
const CHANNEL_STDERR: u8 = 2;
const CHANNEL_ERROR: u8 = 3;
const CHANNEL_RESIZE: u8 = 4;
/// v5: `[255, N]` means "the sender closed channel N".
const CHANNEL_CLOSE: u8 = 255;

/// Runs an exec or attach session over a WebSocket (`v4` or `v5.channel.k8s.io`).
pub(crate) async fn serve_websocket<S>(
    ws: WebSocketStream<S>,
    target: StreamRequest,
    version: ChannelVersion,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(CHANNEL_CHUNKS);
    let writer = tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            let closing = matches!(message, Message::Close(_));
            if ws_tx.send(message).await.is_err() || closing {
                break;
            }
        }
        ws_tx
    });

    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    let (size_tx, size_rx) = watch::channel(None);
    let (gone_tx, mut gone_rx) = watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        let mut resize_buffer = Vec::new();
        while let Some(message) = ws_rx.next().await {
            let data = match message {
                Ok(Message::Binary(data)) => data,
                // The Python client sends `chr(channel) + text` as text frames; like Go's
                // wsstream, the binary protocols take a text frame's bytes as they are.
                Ok(Message::Text(text)) => Bytes::from(text),
                Ok(Message::Close(_)) | Err(_) => break,
                // Pings are answered by tungstenite.
                Ok(_) => continue,
            };
            let Some((&channel, payload)) = data.split_first() else {
                continue;
            };
            match channel {
                CHANNEL_STDIN => {
                    if let Some(tx) = &stdin_tx {
                        if tx.send(Bytes::copy_from_slice(payload)).await.is_err() {
                            stdin_tx = None;
                        }
                    }
                }
                CHANNEL_RESIZE => feed_resize(&mut resize_buffer, payload, &size_tx),
                CHANNEL_CLOSE
                    if version == ChannelVersion::V5 && payload.first() == Some(&CHANNEL_STDIN) =>
                {
                    stdin_tx = None;
                }
                _ => {}
            }
        }
        gone_tx.send_replace(true);
    });

    let mut pumps = Vec::new();
    let mut ws_sink = |channel: u8| -> Sink {
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let out = out_tx.clone();
        pumps.push(pump(
            rx,
            move |chunk: Bytes| {
                let out = out.clone();
                async move {
                    let mut message = Vec::with_capacity(chunk.len() + 1);
                    message.push(channel);
                    message.extend_from_slice(&chunk);
                    out.send(Message::Binary(message.into())).await.is_ok()
                }
            },
            || async {},
        ));
        Sink::Channel {
            tx,
            crlf: target.tty,
        }
    };
    let stdout = if target.stdout {
        ws_sink(CHANNEL_STDOUT)
    } else {
        Sink::Discard
    };
    let stderr = if target.tty {
        stdout.clone()
    } else if target.stderr {
        ws_sink(CHANNEL_STDERR)
    } else {
        Sink::Discard
    };
    let stdin = if target.stdin {
        Stdin::Channel(stdin_rx)
    } else {
        drop(stdin_rx);
        Stdin::empty()
    };
    let io = ProcessIo {
        stdin,
        stdout,
        stderr,
    };
    let process = start_process(&target, io, size_rx);
    let exit = tokio::select! {
        exit = process => Some(exit),
        _ = gone_rx.wait_for(|gone| *gone) => None,
    };
    let Some(exit) = exit else {
        debug!(pod = %target.pod, "exec client went away; process stopped");
        drop(out_tx);
        let _ = writer.await;
        return;
    };
    for p in pumps {
        let _ = p.await;
    }
    debug!(pod = %target.pod, exit = ?exit, "exec finished");
    let mut status = vec![CHANNEL_ERROR];
    status.extend_from_slice(&version.status_bytes(&exit));
    let _ = out_tx.send(Message::Binary(status.into())).await;
    let _ = out_tx.send(super::normal_close()).await;
    drop(out_tx);
    // The client answers our close frame and closes the connection; give it a moment.
    let _ = tokio::time::timeout(CLOSE_GRACE, gone_rx.wait_for(|gone| *gone)).await;
    reader.abort();
    if let Ok(mut ws_tx) = writer.await {
        let _ = ws_tx.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_objects_are_parsed_across_chunks() {
        let (tx, rx) = watch::channel(None);
        let mut buffer = Vec::new();
        feed_resize(&mut buffer, br#"{"Width":80,"Hei"#, &tx);
        assert_eq!(*rx.borrow(), None);
        feed_resize(&mut buffer, br#"ght":24}{"Width":100,"Height":40}"#, &tx);
        assert_eq!(*rx.borrow(), Some((100, 40)));
        assert!(buffer.is_empty());
    }
}
