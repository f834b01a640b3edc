//! The client's side of a response the gateway writes itself instead of relaying a member's:
//! the fleet view's merged answers and a shared watch's events. A 200 head, then the body in
//! pieces, each handed over only when the client took the previous one.
//!
//! Implemented by the front-ends (`protocol::h1`: a chunked HTTP/1.1 body, or one delimited by
//! the connection's close for HTTP/1.0; `protocol::h2`: DATA frames under flow control); written
//! to by `fleet` and `watch` through the pipeline (`handle`). It sits here, beside the exchange's
//! `RequestBody` and `ResponseSink`, so that neither the front-ends nor the stations that write
//! to it import each other.

use bytes::Bytes;

use super::Failure;

/// The client side of a response the gateway writes itself. Anything answered before the head
/// (a refusal, a continue token from elsewhere) is a [`Failure::Answer`].
pub(crate) trait Reply {
    /// Sends the 200 head: `content_type`, and one `Warning` field per entry of `warnings`.
    async fn head(&mut self, content_type: &str, warnings: &[String]) -> Result<(), Failure>;

    /// Sends one piece of the body, waiting for the client to take it.
    async fn body(&mut self, piece: Bytes) -> Result<(), Failure>;

    /// The body is complete.
    async fn end(&mut self) -> Result<(), Failure>;

    /// Resolves when the client has gone away (a merged watch waits on it between events).
    async fn gone(&mut self);

    /// Whether the head went out (after that, a failure can only cut the response).
    fn head_sent(&self) -> bool;

    /// Whether the client's connection carries another request after this response (always
    /// for an h2 stream; for HTTP/1.1, not after a watch, an HTTP/1.0 body or a `close`).
    fn keeps_connection(&self) -> bool;
}

/// A `Warning` value as kube-apiserver writes it (`299 - "text"`), the text made safe for a
/// header: one line, no quotes of its own.
pub fn warning_value(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    format!("299 - \"{clean}\"")
}
