//! Ending a response stream whose route was retired (its cluster removed from the table, or its
//! spec changed so a new route replaced it) the way a member's own restart would end it: cleanly,
//! so that a watch client re-lists or re-watches and lands on the new route.
//!
//! "Cleanly" depends on the framing: a chunked body gets its last chunk (`0\r\n\r\n`) at a chunk
//! boundary (a kube-apiserver watch event or log line is one chunk, so the client never sees half
//! an event); a close-delimited body ends by closing; a Content-Length body cannot end early and
//! is cut. The pipeline (`handle`) asks [`retired_end`] what to do once it sees the route's
//! retirement, and the front-end writes the ending. Only long-running
//! responses (watch, `logs -f`) are ended this way: an ordinary response finishes by itself and
//! ending it early would truncate a document. Never does I/O.

use std::time::Duration;

use crate::codec::http1::{BodyProgress, ChunkedScanner};

/// The last chunk and the empty trailer section that end a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How long a retired stream caught inside a chunk may take to reach the chunk's end before it
/// is cut instead.
pub const FINISH_CHUNK_WITHIN: Duration = Duration::from_secs(1);

/// What a stream of a retired route can do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetiredEnd {
    /// Between chunks: write [`LAST_CHUNK`] (HTTP/1.1) or end the h2 stream, and stop.
    LastChunk,
    /// A close-delimited body: ending the stream (close, or END_STREAM) is its clean end.
    Close,
    /// Inside a chunk: relay until its end (within [`FINISH_CHUNK_WITHIN`]), then ask again.
    FinishChunk,
    /// A body of declared length: no clean early end exists; abort it.
    Cut,
    /// The body is already complete.
    Done,
}

/// What to do with a body in `progress` (its chunked scanner, for chunked bodies) now that its
/// route is retired.
pub fn retired_end(progress: &BodyProgress) -> RetiredEnd {
    match progress {
        BodyProgress::Done => RetiredEnd::Done,
        BodyProgress::UntilClose => RetiredEnd::Close,
        BodyProgress::Length(_) => RetiredEnd::Cut,
        BodyProgress::Chunked(scanner) => chunked_end(scanner),
    }
}

/// Like [`retired_end`] for a chunked body tracked by its scanner alone (the h2 glue decodes with
/// its own scanner).
pub fn chunked_end(scanner: &ChunkedScanner) -> RetiredEnd {
    if scanner.is_done() {
        RetiredEnd::Done
    } else if at_chunk_boundary(scanner) {
        RetiredEnd::LastChunk
    } else {
        RetiredEnd::FinishChunk
    }
}

/// Whether the scanner stands between two chunks: exactly there, the last chunk ends the body
/// (a copy of the scanner is fed one and must finish on its final byte). Anywhere else (inside a
/// size line, inside data, before a chunk's CRLF) it would not.
fn at_chunk_boundary(scanner: &ChunkedScanner) -> bool {
    let mut probe = scanner.clone();
    matches!(probe.scan(LAST_CHUNK), Ok(n) if n == LAST_CHUNK.len()) && probe.is_done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::BodyKind;

    fn after(bytes: &[u8]) -> BodyProgress {
        let mut progress = BodyProgress::new(BodyKind::Chunked);
        assert_eq!(progress.take(bytes).unwrap(), bytes.len());
        progress
    }

    #[test]
    fn a_chunked_body_ends_only_between_chunks() {
        assert_eq!(retired_end(&after(b"")), RetiredEnd::LastChunk);
        assert_eq!(
            retired_end(&after(b"5\r\nhello\r\n")),
            RetiredEnd::LastChunk
        );
        assert_eq!(
            retired_end(&after(b"5\r\nhello\r\n3;x=y\r\nabc\r\n")),
            RetiredEnd::LastChunk
        );
        // Every cut inside a size line, a chunk's data or its CRLF: all but the chunk's end.
        let body = b"5\r\nhello\r\n1";
        for cut in (1..=body.len()).filter(|&cut| cut != b"5\r\nhello\r\n".len()) {
            let partial = &body[..cut];
            assert_eq!(
                retired_end(&after(partial)),
                RetiredEnd::FinishChunk,
                "{partial:?}"
            );
        }
        assert_eq!(retired_end(&after(b"0\r\n\r\n")), RetiredEnd::Done);
    }

    #[test]
    fn other_framings() {
        assert_eq!(
            retired_end(&BodyProgress::new(BodyKind::CloseDelimited)),
            RetiredEnd::Close
        );
        assert_eq!(
            retired_end(&BodyProgress::new(BodyKind::Length(10))),
            RetiredEnd::Cut
        );
        assert_eq!(
            retired_end(&BodyProgress::new(BodyKind::Empty)),
            RetiredEnd::Done
        );
    }
}
