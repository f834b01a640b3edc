//! A member's newline-delimited body (a watch stream: one JSON event per line) split into
//! lines as it arrives, whatever its chunking (kube coalesces a burst of events into 2 KiB
//! chunks and splits events across them). Each complete line goes to a [`LineSink`]; a line
//! longer than [`MAX_EVENT_BYTES`] ends the relay. Used by the fleet view's merged watch and by
//! shared watches, as the [`ResponseSink`] given to `relay`.

use bytes::{Bytes, BytesMut};

use super::relay::{ClientEvent, ResponseSink};
use super::Failure;

/// The longest event line read from a member.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// What takes the lines (each without its `\n`; blank lines are skipped).
pub(crate) trait LineSink {
    async fn line(&mut self, line: &[u8]) -> Result<(), Failure>;
}

/// A [`ResponseSink`] that hands `sink` one line at a time.
pub(crate) struct Lines<S> {
    pub sink: S,
    partial: BytesMut,
}

impl<S: LineSink> Lines<S> {
    pub fn new(sink: S) -> Self {
        Lines {
            sink,
            partial: BytesMut::new(),
        }
    }

    async fn one(&mut self, line: &[u8]) -> Result<(), Failure> {
        let line = line.trim_ascii();
        if line.is_empty() {
            return Ok(());
        }
        self.sink.line(line).await
    }
}

impl<S: LineSink> ResponseSink for Lines<S> {
    fn decodes_chunks(&self) -> bool {
        true
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        let mut rest = &piece[..];
        while let Some(end) = memchr::memchr(b'\n', rest) {
            let (line, after) = rest.split_at(end + 1);
            rest = after;
            if self.partial.is_empty() {
                self.one(line).await?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.one(&whole).await?;
            }
        }
        if self.partial.len() + rest.len() > MAX_EVENT_BYTES {
            return Err(Failure::Abort("a member's watch event is too large"));
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        Ok(())
    }

    async fn end(&mut self) -> Result<(), Failure> {
        let last = std::mem::take(&mut self.partial);
        self.one(&last).await
    }

    async fn end_early(&mut self, _last_chunk: bool) -> Result<(), Failure> {
        Ok(())
    }

    async fn client_event(&mut self) -> ClientEvent {
        // The client is the caller's to watch.
        std::future::pending().await
    }
}
