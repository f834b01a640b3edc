//! The one response-body type of the simulated fleet: boxed, so fixed bodies, streamed watch
//! events and `logs -f` lines all fit the same `Response<SimBody>`.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// Response body of every simulated-member handler.
pub type SimBody = BoxBody<Bytes, std::io::Error>;

/// A body that is sent whole.
pub fn full(bytes: impl Into<Bytes>) -> SimBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> SimBody {
    full(Bytes::new())
}

/// The sending half of a [`channel`] body: each `send` becomes one body frame (one HTTP/1.1
/// chunk, one h2 DATA frame), which is what watch events and `logs -f` lines need.
pub type ChunkSender = tokio::sync::mpsc::Sender<Bytes>;

/// A streamed body fed by a task through a bounded channel. The body ends when the sender is
/// dropped; the sender sees `closed()` when the client went away (the body was dropped).
pub fn channel(capacity: usize) -> (ChunkSender, SimBody) {
    let (tx, rx) = tokio::sync::mpsc::channel(capacity);
    (tx, ChannelBody { rx }.boxed())
}

struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}
