//! The standard streams of a simulated process, independent of the wire protocol: stdin is a
//! channel of byte chunks whose closing is EOF, stdout and stderr are sinks (a channel to the
//! client, a file of the pod filesystem, or nowhere).
//!
//! The protocol sessions (`stream::exec` for SPDY and WebSocket) create the channels; the
//! built-in commands (`stream::shell`, `stream::tar`) read and write through these types. Nothing
//! here buffers without bound: channels are bounded, so a client that stops reading stops the
//! process.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::fs::{self, PodFs};

/// Capacity (in chunks) of every channel between a session and a process.
pub(crate) const CHANNEL_CHUNKS: usize = 16;

/// The input of a process.
pub(crate) enum Stdin {
    /// Chunks from the client (or from the previous stage of a pipeline); closed = EOF.
    Channel(mpsc::Receiver<Bytes>),
    /// A fixed content (a `< file` redirection), consumed once.
    Fixed(Option<Bytes>),
}

impl Stdin {
    /// An input that is at EOF from the start (no `-i`).
    pub(crate) fn empty() -> Self {
        Stdin::Fixed(None)
    }

    /// Next chunk, `None` at EOF.
    pub(crate) async fn read(&mut self) -> Option<Bytes> {
        match self {
            Stdin::Channel(rx) => loop {
                match rx.recv().await {
                    Some(chunk) if chunk.is_empty() => continue,
                    other => return other,
                }
            },
            Stdin::Fixed(content) => content.take().filter(|c| !c.is_empty()),
        }
    }

    /// Everything up to EOF.
    pub(crate) async fn read_to_end(&mut self) -> Vec<u8> {
        let mut all = Vec::new();
        while let Some(chunk) = self.read().await {
            all.extend_from_slice(&chunk);
        }
        all
    }
}

/// The reader hung up: the client closed its stream or the next pipeline stage exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("broken pipe")]
pub(crate) struct BrokenPipe;

/// An output of a process.
#[derive(Clone)]
pub(crate) enum Sink {
    /// To the client or the next pipeline stage. With `crlf`, `\n` becomes `\r\n`, as a
    /// terminal's output processing does under `-t`.
    Channel { tx: mpsc::Sender<Bytes>, crlf: bool },
    /// To a file of the pod filesystem (a `>` or `>>` redirection; the file is created or
    /// truncated when the redirection is set up, so every write appends).
    File { fs: PodFs, path: String },
    /// Into memory, for the shell's `$(...)` (bounded by what the inner command writes).
    Buffer(Arc<Mutex<Vec<u8>>>),
    /// Nowhere (`> /dev/null`, or a stream the client did not ask for).
    Discard,
}

impl Sink {
    pub(crate) async fn write(&self, data: &[u8]) -> Result<(), BrokenPipe> {
        if data.is_empty() {
            return Ok(());
        }
        match self {
            Sink::Channel { tx, crlf } => {
                let chunk = if *crlf {
                    let mut out = Vec::with_capacity(data.len() + 8);
                    for &b in data {
                        if b == b'\n' {
                            out.push(b'\r');
                        }
                        out.push(b);
                    }
                    Bytes::from(out)
                } else {
                    Bytes::copy_from_slice(data)
                };
                tx.send(chunk).await.map_err(|_| BrokenPipe)
            }
            Sink::File { fs, path } => {
                // The redirection created the file; a concurrent `rm` may have removed its
                // directory since, which a real process would not notice either.
                let _ = fs::lock(fs).write_file(path, data, true);
                Ok(())
            }
            Sink::Buffer(buffer) => {
                buffer
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .extend_from_slice(data);
                Ok(())
            }
            Sink::Discard => Ok(()),
        }
    }

    pub(crate) async fn write_str(&self, text: &str) -> Result<(), BrokenPipe> {
        self.write(text.as_bytes()).await
    }
}

/// The three standard streams of one process.
pub(crate) struct ProcessIo {
    pub(crate) stdin: Stdin,
    pub(crate) stdout: Sink,
    pub(crate) stderr: Sink,
}

/// Terminal size the client reported on the resize stream (columns, rows).
pub(crate) type TerminalSize = watch::Receiver<Option<(u16, u16)>>;

/// Where a process runs: the pod, its filesystem, whether it has a terminal.
#[derive(Clone)]
pub(crate) struct PodContext {
    pub(crate) pod: String,
    pub(crate) fs: PodFs,
    pub(crate) tty: bool,
    pub(crate) terminal_size: TerminalSize,
}
