//! HTTP/1.1 body framing: deciding how a message's body is delimited (RFC 9112 section 6), and a
//! chunked-framing scanner that validates chunk sizes, extensions, line ends and trailers as bytes
//! pass through, without buffering or re-encoding them.
//!
//! The framing decision is where request smuggling is stopped: a request with both Content-Length
//! and Transfer-Encoding, several or invalid Content-Lengths, or a Transfer-Encoding other than a
//! lone final `chunked` is refused, never "repaired". This module never does I/O and never
//! allocates; the HTTP/1.1 front-end (`protocol::h1`) and the exchange call it for every message in both directions.

use super::head::{trim, Head};

/// Room for a chunk-size line: 16 hex digits of a `usize` and CRLF.
pub const CHUNK_SIZE_ROOM: usize = 18;

/// The chunk-size line `{len:x}\r\n` of a chunk of `len` bytes, written into `room`.
pub fn chunk_size_line(room: &mut [u8; CHUNK_SIZE_ROOM], len: usize) -> &[u8] {
    use std::io::Write as _;
    let mut cursor = std::io::Cursor::new(&mut room[..]);
    // Fits: at most 16 digits and CRLF.
    let _ = write!(cursor, "{len:x}\r\n");
    let end = cursor.position() as usize;
    &room[..end]
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked framing, passed through as is.
    Chunked,
    /// Until the sender closes (responses only).
    CloseDelimited,
}

/// Why a framing decision or a chunk failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FramingError(pub &'static str);

/// Parses a Content-Length value: ASCII digits only, no sign, no list, no overflow.
fn parse_content_length(value: &[u8]) -> Result<u64, FramingError> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(FramingError("invalid Content-Length"));
    }
    value.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
            .ok_or(FramingError("invalid Content-Length"))
    })
}

/// Content-Length of a head: `None` when absent; refuses duplicates and invalid values.
fn content_length(head: &Head) -> Result<Option<u64>, FramingError> {
    let mut found = None;
    for value in head.values(b"content-length") {
        if found.is_some() {
            return Err(FramingError("more than one Content-Length"));
        }
        found = Some(parse_content_length(value)?);
    }
    Ok(found)
}

/// Whether Transfer-Encoding is present and, if so, whether it is exactly `chunked` (one coding,
/// in one field). Any other coding list is refused by the callers.
fn transfer_encoding(head: &Head) -> Option<Result<(), FramingError>> {
    let mut codings = head
        .values(b"transfer-encoding")
        .flat_map(|v| v.split(|b| *b == b','))
        .map(trim)
        .peekable();
    codings.peek()?;
    let first = codings.next().unwrap_or_default();
    if first.eq_ignore_ascii_case(b"chunked") && codings.next().is_none() {
        Some(Ok(()))
    } else {
        Some(Err(FramingError(
            "Transfer-Encoding other than a single chunked",
        )))
    }
}

/// The body of a request (RFC 9112 section 6.3, strict).
pub fn request_body(head: &Head) -> Result<BodyKind, FramingError> {
    let length = content_length(head)?;
    match transfer_encoding(head) {
        Some(_) if length.is_some() => {
            Err(FramingError("both Content-Length and Transfer-Encoding"))
        }
        Some(Ok(())) if head.minor_version == 0 => {
            Err(FramingError("Transfer-Encoding in an HTTP/1.0 request"))
        }
        Some(Ok(())) => Ok(BodyKind::Chunked),
        Some(Err(e)) => Err(e),
        None => Ok(match length {
            None | Some(0) => BodyKind::Empty,
            Some(n) => BodyKind::Length(n),
        }),
    }
}

/// The body of a response to a request with `method` (RFC 9112 section 6.3).
pub fn response_body(head: &Head, method: &[u8]) -> Result<BodyKind, FramingError> {
    if method == b"HEAD" || head.code < 200 || head.code == 204 || head.code == 304 {
        return Ok(BodyKind::Empty);
    }
    let length = content_length(head)?;
    match transfer_encoding(head) {
        Some(_) if length.is_some() => {
            Err(FramingError("both Content-Length and Transfer-Encoding"))
        }
        Some(Ok(())) => Ok(BodyKind::Chunked),
        // A response coded otherwise is read until close, as RFC 9112 6.3 item 4 says.
        Some(Err(_)) => Ok(BodyKind::CloseDelimited),
        None => Ok(match length {
            Some(0) => BodyKind::Empty,
            Some(n) => BodyKind::Length(n),
            None => BodyKind::CloseDelimited,
        }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size; `digits` counts them.
    Size,
    /// After the size: optional whitespace, then `;` extensions or CR.
    AfterSize,
    /// Inside extensions (tokens, `=`, whitespace, `;`).
    Extension,
    /// Inside a quoted-string extension value.
    Quoted,
    /// After a backslash inside a quoted string.
    QuotedEscape,
    /// Saw CR ending the size line; LF must follow.
    SizeLf,
    /// Chunk data: `remaining` bytes left.
    Data,
    /// After chunk data: CR must follow.
    DataCr,
    /// After chunk data CR: LF must follow.
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    /// Saw CR ending a trailer line; LF must follow.
    TrailerLf,
    /// Saw CR at the start of a line: the final LF must follow.
    FinalLf,
    /// The whole body has passed.
    Done,
}

/// Validates chunked framing as it streams past. Feed it every body byte in order; it says how
/// many of them belong to the body (the rest is the next message) and when the body ends.
#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: State,
    remaining: u64,
    digits: u8,
    last_chunk: bool,
    line_bytes: usize,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        ChunkedScanner {
            state: State::Size,
            remaining: 0,
            digits: 0,
            last_chunk: false,
            line_bytes: 0,
        }
    }
}

/// A chunk-size line or trailer line longer than this is refused: nothing legitimate needs it and
/// it would let a peer stream an endless line.
const MAX_LINE: usize = 4096;

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl ChunkedScanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the terminating chunk and trailers have passed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Scans `input`, returning how many leading bytes belong to this body. Fewer than
    /// `input.len()` only once the body is done. Chunk data is skipped in bulk.
    pub fn scan(&mut self, input: &[u8]) -> Result<usize, FramingError> {
        self.scan_data(input, |_| {})
    }

    /// Like [`scan`](Self::scan), and also reports where the chunk data (the payload without
    /// framing) lies in `input`, for a consumer that needs the decoded body (an h2 stream fed
    /// from an HTTP/1.1 member). The ranges come in order and never overlap.
    pub fn scan_data(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(std::ops::Range<usize>),
    ) -> Result<usize, FramingError> {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let take =
                    (input.len() - i).min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                on_data(i..i + take);
                i += take;
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            if self.state == State::Done {
                return Ok(i);
            }
            let b = input[i];
            i += 1;
            self.line_bytes += 1;
            if self.line_bytes > MAX_LINE {
                return Err(FramingError("chunk line too long"));
            }
            self.state = match self.state {
                State::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).unwrap_or(0);
                        if self.remaining > (u64::MAX >> 4) {
                            return Err(FramingError("chunk size too large"));
                        }
                        self.remaining = (self.remaining << 4) | u64::from(digit);
                        self.digits = self.digits.saturating_add(1);
                        State::Size
                    }
                    _ if self.digits == 0 => return Err(FramingError("invalid chunk size")),
                    b' ' | b'\t' => State::AfterSize,
                    b';' => State::Extension,
                    b'\r' => State::SizeLf,
                    _ => return Err(FramingError("invalid chunk size")),
                },
                State::AfterSize => match b {
                    b' ' | b'\t' => State::AfterSize,
                    b';' => State::Extension,
                    b'\r' => State::SizeLf,
                    _ => return Err(FramingError("invalid chunk size")),
                },
                State::Extension => match b {
                    b'\r' => State::SizeLf,
                    b'"' => State::Quoted,
                    b';' | b'=' | b' ' | b'\t' => State::Extension,
                    _ if is_tchar(b) => State::Extension,
                    _ => return Err(FramingError("invalid chunk extension")),
                },
                State::Quoted => match b {
                    b'"' => State::Extension,
                    b'\\' => State::QuotedEscape,
                    b'\t' | b' '..=b'~' | 0x80..=0xff => State::Quoted,
                    _ => return Err(FramingError("invalid chunk extension")),
                },
                State::QuotedEscape => match b {
                    b'\t' | b' '..=b'~' | 0x80..=0xff => State::Quoted,
                    _ => return Err(FramingError("invalid chunk extension")),
                },
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(FramingError("chunk size line not ended by CRLF"));
                    }
                    self.line_bytes = 0;
                    self.digits = 0;
                    if self.remaining == 0 {
                        self.last_chunk = true;
                        State::TrailerStart
                    } else {
                        State::Data
                    }
                }
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    _ => return Err(FramingError("chunk data not followed by CRLF")),
                },
                State::DataLf => {
                    self.line_feed(b, State::Size, "chunk data not followed by CRLF")?
                }
                State::TrailerStart => match b {
                    b'\r' => State::FinalLf,
                    b' ' | b'\t' => return Err(FramingError("obs-fold in trailer")),
                    _ if is_tchar(b) => State::Trailer,
                    _ => return Err(FramingError("invalid trailer field")),
                },
                State::Trailer => match b {
                    b'\r' => State::TrailerLf,
                    b'\t' | b' '..=b'~' | 0x80..=0xff => State::Trailer,
                    _ => return Err(FramingError("invalid trailer field")),
                },
                State::TrailerLf => {
                    self.line_feed(b, State::TrailerStart, "trailer line not ended by CRLF")?
                }
                State::FinalLf => match b {
                    b'\n' => State::Done,
                    _ => return Err(FramingError("chunked body not ended by CRLF")),
                },
                State::Data | State::Done => unreachable!("handled above"),
            };
        }
        Ok(i)
    }

    /// `b` after the CR that ends a line: an LF starts a new line in `next`; anything else is
    /// refused as `why`.
    fn line_feed(&mut self, b: u8, next: State, why: &'static str) -> Result<State, FramingError> {
        if b != b'\n' {
            return Err(FramingError(why));
        }
        self.line_bytes = 0;
        Ok(next)
    }
}

/// Tracks a body of known length or a chunked one as it streams.
#[derive(Debug, Clone)]
pub enum BodyProgress {
    Length(u64),
    Chunked(ChunkedScanner),
    UntilClose,
    Done,
}

impl BodyProgress {
    pub fn new(kind: BodyKind) -> Self {
        match kind {
            BodyKind::Empty | BodyKind::Length(0) => BodyProgress::Done,
            BodyKind::Length(n) => BodyProgress::Length(n),
            BodyKind::Chunked => BodyProgress::Chunked(ChunkedScanner::new()),
            BodyKind::CloseDelimited => BodyProgress::UntilClose,
        }
    }

    /// How many leading bytes of `input` belong to this body (validating chunked framing).
    pub fn take(&mut self, input: &[u8]) -> Result<usize, FramingError> {
        match self {
            BodyProgress::Done => Ok(0),
            BodyProgress::UntilClose => Ok(input.len()),
            BodyProgress::Length(left) => {
                let n = (input.len() as u64).min(*left);
                *left -= n;
                if *left == 0 {
                    *self = BodyProgress::Done;
                }
                Ok(n as usize)
            }
            BodyProgress::Chunked(scanner) => {
                let n = scanner.scan(input)?;
                if scanner.is_done() {
                    *self = BodyProgress::Done;
                }
                Ok(n)
            }
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, BodyProgress::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::head::{parse_request, HeadLimits};
    use bytes::BytesMut;

    #[test]
    fn chunk_size_lines_are_lowercase_hex() {
        for len in [0, 1, 9, 10, 15, 16, 255, 4096, 0xdead_beef, usize::MAX] {
            let mut room = [0u8; CHUNK_SIZE_ROOM];
            assert_eq!(
                chunk_size_line(&mut room, len),
                format!("{len:x}\r\n").as_bytes()
            );
        }
    }

    fn head(text: &str) -> Head {
        let mut src = BytesMut::from(text.as_bytes());
        let mut head = Head::default();
        let mut scanned = 0;
        let limits = HeadLimits {
            max_head_bytes: 4096,
            max_headers: 32,
        };
        assert_eq!(
            parse_request(&mut src, &mut scanned, limits, &mut head),
            Ok(true)
        );
        head
    }

    #[test]
    fn request_framing_follows_rfc_9112() {
        let ok = |h: &str| request_body(&head(&format!("POST / HTTP/1.1\r\nHost: a\r\n{h}\r\n")));
        assert_eq!(ok(""), Ok(BodyKind::Empty));
        assert_eq!(ok("Content-Length: 12\r\n"), Ok(BodyKind::Length(12)));
        assert_eq!(ok("Transfer-Encoding: Chunked\r\n"), Ok(BodyKind::Chunked));
        for bad in [
            "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 1\r\nContent-Length: 1\r\n",
            "Content-Length: 1, 1\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: +1\r\n",
            "Content-Length: 0x10\r\n",
            "Content-Length: 99999999999999999999\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: identity\r\n",
            "Transfer-Encoding: xchunked\r\n",
        ] {
            assert!(ok(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn scan_all(input: &[u8]) -> Result<(usize, bool), FramingError> {
        let mut s = ChunkedScanner::new();
        let n = s.scan(input)?;
        Ok((n, s.is_done()))
    }

    #[test]
    fn chunked_scanner_finds_the_end_and_leaves_the_rest() {
        let body = b"5\r\nhello\r\n1a; name=\"v;x\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        assert_eq!(scan_all(body), Ok((body.len() - 4, true)));
        // Byte by byte gives the same answer.
        let mut s = ChunkedScanner::new();
        let mut consumed = 0;
        for b in body.iter() {
            consumed += s.scan(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(consumed, body.len() - 4);
        assert_eq!(scan_all(b"0\r\n\r\n"), Ok((5, true)));
        assert_eq!(scan_all(b"5\r\nhel"), Ok((6, false)));
    }

    #[test]
    fn chunked_scanner_refuses_bad_framing() {
        for bad in crate::testing::byte_cases("chunked-refused") {
            assert!(scan_all(&bad).is_err(), "{bad:?} accepted");
        }
    }
}
