//! HTTP/1.1 message heads: request and response heads parsed with httparse into a reused,
//! per-connection [`Head`] (one byte buffer plus offsets), with the RFC 9112 checks httparse leaves
//! to its caller (bare LF line ends, request-target form, the Host header rules).
//!
//! This module only turns bytes into heads. It knows nothing of clusters, routes or identity, never
//! does I/O, and never allocates once a connection's buffers have grown to its largest head. The
//! HTTP/1.1 front-end (`protocol::h1`) and the exchange call [`parse_request`] and [`parse_response`] on its read buffers.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{Buf, BytesMut};

/// Limits on a head, from the Gateway object's `limits`.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
}

/// Why a head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("head larger than {0} bytes")]
    TooLarge(usize),
    #[error("more than {0} header fields")]
    TooManyHeaders(usize),
    #[error("{0}")]
    Invalid(&'static str),
}

/// What a head's `Connection` fields say, read once as the head is parsed (so no later step
/// scans the fields again for a token).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTokens {
    /// A `Connection` field is present.
    pub present: bool,
    pub close: bool,
    pub keep_alive: bool,
    pub upgrade: bool,
    /// It names something else: a field to drop as hop-by-hop (or to refuse).
    pub others: bool,
}

/// A parsed head. The bytes live in `buf`; everything else is offsets into it, so one `Head` per
/// connection is reused for every message without allocating.
#[derive(Debug, Default)]
pub struct Head {
    buf: Vec<u8>,
    /// Request: method, target. Response: reason phrase in `first`, unused `second`.
    first: Range<usize>,
    second: Range<usize>,
    /// The minor version: `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor_version: u8,
    /// The status code of a response; 0 for requests.
    pub code: u16,
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// Its `Connection` tokens.
    pub connection: ConnectionTokens,
    /// How many `Host` fields it has.
    pub hosts: usize,
    /// `Expect: 100-continue` is among its fields.
    pub expect_continue: bool,
}

impl Head {
    /// Gives back the memory of the head's bytes and fields, keeping its status code: for a
    /// stream that may stay open for hours after its head was relayed. The head reads as empty
    /// afterwards, and the next message parsed into it allocates again.
    pub fn shed(&mut self) {
        self.buf = Vec::new();
        self.headers = Vec::new();
        self.first = 0..0;
        self.second = 0..0;
    }

    /// The request method (requests only).
    pub fn method(&self) -> &[u8] {
        &self.buf[self.first.clone()]
    }

    /// The request target, exactly as sent: percent-encoding untouched (requests only).
    pub fn target(&self) -> &[u8] {
        &self.buf[self.second.clone()]
    }

    /// The reason phrase (responses only).
    pub fn reason(&self) -> &[u8] {
        &self.buf[self.first.clone()]
    }

    /// Every header field in order, as (name, value).
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.headers
            .iter()
            .map(|(name, value)| (&self.buf[name.clone()], &self.buf[value.clone()]))
    }

    /// The values of every field called `name` (case-insensitive).
    pub fn values<'a, 'n: 'a>(&'a self, name: &'n [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The first value of `name`, if any.
    pub fn value<'a>(&'a self, name: &[u8]) -> Option<&'a [u8]> {
        self.headers()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// Whether some field `name` lists `token` in its comma-separated value (case-insensitive),
    /// as `Connection: keep-alive, Upgrade` does.
    pub fn has_token(&self, name: &[u8], token: &[u8]) -> bool {
        self.values(name)
            .flat_map(|v| v.split(|b| *b == b','))
            .any(|t| trim(t).eq_ignore_ascii_case(token))
    }

    /// The number of header fields.
    pub fn header_count(&self) -> usize {
        self.headers.len()
    }
}

/// Trims optional whitespace (SP, HTAB) from both ends.
pub fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Where the head ends (the index just past the empty line), if the buffer holds a whole head.
/// Only looks at `buf[from..]` (minus 3 bytes of overlap), so a head arriving byte by byte costs
/// linear, not quadratic, time.
pub fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    let mut at = start;
    while let Some(pos) = memchr::memchr(b'\n', &buf[at..]) {
        let lf = at + pos;
        if buf.get(lf + 1) == Some(&b'\n') {
            return Some(lf + 2);
        }
        if buf.get(lf + 1) == Some(&b'\r') && buf.get(lf + 2) == Some(&b'\n') {
            return Some(lf + 3);
        }
        at = lf + 1;
    }
    None
}

/// Rejects a line feed not preceded by a carriage return: httparse accepts bare LF, and a
/// front-end and a back-end disagreeing on line ends is a classic smuggling vector.
fn reject_bare_lf(head: &[u8]) -> Result<(), HeadError> {
    for lf in memchr::memchr_iter(b'\n', head) {
        if lf == 0 || head[lf - 1] != b'\r' {
            return Err(HeadError::Invalid("line ends with a bare LF"));
        }
    }
    Ok(())
}

const STACK_HEADERS: usize = 1024;

/// The header slots httparse fills for one head: `max` uninitialised slots from the stack array
/// (1024 slots, 32 KiB of stack, never written before httparse writes them), or from the heap for
/// a limit above that. Initialising or allocating slots per head cost 3.6% of the CPU of a small
/// GET (a 1024-slot array filled for every member response) before this.
fn header_slots<'s, 'b>(
    stack: &'s mut [MaybeUninit<httparse::Header<'b>>; STACK_HEADERS],
    heap: &'s mut Vec<MaybeUninit<httparse::Header<'b>>>,
    max: usize,
) -> &'s mut [MaybeUninit<httparse::Header<'b>>] {
    if max <= STACK_HEADERS {
        &mut stack[..max]
    } else {
        heap.resize_with(max, MaybeUninit::uninit);
        heap
    }
}

fn span_of(base: &[u8], part: &[u8]) -> Range<usize> {
    // httparse's slices point into the buffer, so the offset is a plain address difference,
    // except where it hands back a string of its own: a reason phrase with obs-text bytes is
    // returned as a static "" (found by fuzzing). Anything outside the buffer is an empty span.
    let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    if part.is_empty() || start > base.len() || base.len() - start < part.len() {
        return 0..0;
    }
    start..start + part.len()
}

/// Records the fields' spans, and what the later steps ask of them (the `Connection` tokens, the
/// `Host` count, `Expect`), in one pass.
fn fill_headers(head: &mut Head, raw: &[u8], headers: &[httparse::Header<'_>]) {
    head.headers.clear();
    head.connection = ConnectionTokens::default();
    head.hosts = 0;
    head.expect_continue = false;
    for h in headers {
        let name = h.name.as_bytes();
        head.headers
            .push((span_of(raw, name), span_of(raw, h.value)));
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => head.hosts += 1,
            6 if name.eq_ignore_ascii_case(b"expect") => {
                head.expect_continue |= trim(h.value).eq_ignore_ascii_case(b"100-continue");
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                let tokens = &mut head.connection;
                tokens.present = true;
                for token in h.value.split(|b| *b == b',').map(trim) {
                    if token.eq_ignore_ascii_case(b"close") {
                        tokens.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        tokens.keep_alive = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        tokens.upgrade = true;
                    } else if !token.is_empty() {
                        tokens.others = true;
                    }
                }
            }
            _ => {}
        }
    }
}

/// Where the head at the front of `src` ends (the length of the head with its blank line), if
/// it is all there; `None` while more bytes are needed (`scanned` then remembers how far `src`
/// was searched). A head longer than `limits` allows is an error, whole or not.
fn head_end(
    src: &[u8],
    scanned: &mut usize,
    limits: HeadLimits,
) -> Result<Option<usize>, HeadError> {
    let Some(end) = find_head_end(src, *scanned) else {
        if src.len() > limits.max_head_bytes {
            return Err(HeadError::TooLarge(limits.max_head_bytes));
        }
        *scanned = src.len();
        return Ok(None);
    };
    if end > limits.max_head_bytes {
        return Err(HeadError::TooLarge(limits.max_head_bytes));
    }
    Ok(Some(end))
}

/// What a parser read off a head's start line, as spans of the head's bytes.
struct StartLine {
    /// The method, or the reason phrase.
    first: Range<usize>,
    /// The request target (empty in a response).
    second: Range<usize>,
    minor_version: u8,
    /// The status code (0 in a request).
    code: u16,
}

/// The part [`parse_request`] and [`parse_response`] share: finds the whole head at the front of
/// `src`, hands it to `parse` with the header slots `limits` allows, and on success copies it into
/// `head` and removes it from `src`. `parse` reads the start line (refusing what its kind of head
/// must not be) and returns it with the headers httparse filled.
fn take_head<P>(
    src: &mut BytesMut,
    scanned: &mut usize,
    limits: HeadLimits,
    head: &mut Head,
    parse: P,
) -> Result<bool, HeadError>
where
    P: for<'h, 'b> FnOnce(
        &'b [u8],
        &'h mut [MaybeUninit<httparse::Header<'b>>],
    ) -> Result<(StartLine, &'h [httparse::Header<'b>]), HeadError>,
{
    let Some(end) = head_end(src, scanned, limits)? else {
        return Ok(false);
    };
    let raw = &src[..end];
    let mut stack = [const { MaybeUninit::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new(); // stays empty (no allocation) unless the limit exceeds the stack slots
    let slots = header_slots(&mut stack, &mut heap, limits.max_headers);
    let (line, headers) = parse(raw, slots)?;
    head.buf.clear();
    head.buf.extend_from_slice(raw);
    head.first = line.first;
    head.second = line.second;
    head.minor_version = line.minor_version;
    head.code = line.code;
    fill_headers(head, raw, headers);
    src.advance(end);
    *scanned = 0;
    Ok(true)
}

/// Parses a request head from the front of `src`. On success the head's bytes are copied into
/// `head` and removed from `src` (the body, or a pipelined next request, stays there) and `true`
/// is returned; `false` means more bytes are needed. `scanned` remembers how far `src` has been
/// searched for the end of the head between calls; reset it to 0 after a head is taken.
pub fn parse_request(
    src: &mut BytesMut,
    scanned: &mut usize,
    limits: HeadLimits,
    head: &mut Head,
) -> Result<bool, HeadError> {
    let taken = take_head(src, scanned, limits, head, |raw, slots| {
        reject_bare_lf(raw)?;
        let mut request = httparse::Request::new(&mut []);
        match request.parse_with_uninit_headers(raw, slots) {
            Ok(httparse::Status::Complete(n)) if n == raw.len() => {}
            Ok(_) => return Err(HeadError::Invalid("request head is not well formed")),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(HeadError::TooManyHeaders(limits.max_headers))
            }
            Err(httparse::Error::Version) => return Err(HeadError::Invalid("unsupported version")),
            Err(_) => return Err(HeadError::Invalid("request head is not well formed")),
        }
        let line = StartLine {
            first: span_of(raw, request.method.unwrap_or_default().as_bytes()),
            second: span_of(raw, request.path.unwrap_or_default().as_bytes()),
            minor_version: request.version.unwrap_or(1),
            code: 0,
        };
        Ok((line, request.headers))
    })?;
    if !taken {
        return Ok(false);
    }
    if !head.target().starts_with(b"/") {
        return Err(HeadError::Invalid(
            "request target must be an absolute path (origin-form)",
        ));
    }
    if head.hosts > 1 || (head.hosts == 0 && head.minor_version == 1) {
        return Err(HeadError::Invalid(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    Ok(true)
}

/// Parses a response head from the front of `src`, like [`parse_request`]. Upstreams are
/// semi-trusted (they are the member clusters), but a malformed response still must not be relayed:
/// it is an error and the connection is dropped.
pub fn parse_response(
    src: &mut BytesMut,
    scanned: &mut usize,
    limits: HeadLimits,
    head: &mut Head,
) -> Result<bool, HeadError> {
    take_head(src, scanned, limits, head, |raw, slots| {
        let mut response = httparse::Response::new(&mut []);
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            raw,
            slots,
        ) {
            Ok(httparse::Status::Complete(n)) if n == raw.len() => {}
            Ok(_) => return Err(HeadError::Invalid("response head is not well formed")),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(HeadError::TooManyHeaders(limits.max_headers))
            }
            Err(_) => return Err(HeadError::Invalid("response head is not well formed")),
        }
        let line = StartLine {
            first: span_of(raw, response.reason.unwrap_or_default().as_bytes()),
            second: 0..0,
            minor_version: response.version.unwrap_or(1),
            code: response.code.unwrap_or(0),
        };
        Ok((line, response.headers))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_phrase_with_obs_text_parses_without_panicking() {
        // Found by the http1_head fuzz target: httparse returns such a reason as a static "".
        let mut src = BytesMut::from(&b"HTTP/1.1 200 OK\xff\xff\r\nContent-Length: 0\r\n\r\n"[..]);
        let mut head = Head::default();
        let limits = HeadLimits {
            max_head_bytes: 8192,
            max_headers: 64,
        };
        assert_eq!(
            parse_response(&mut src, &mut 0, limits, &mut head),
            Ok(true)
        );
        assert_eq!(head.code, 200);
        assert_eq!(head.reason(), b"");
        assert_eq!(head.value(b"content-length"), Some(&b"0"[..]));
    }

    const LIMITS: HeadLimits = HeadLimits {
        max_head_bytes: 1024,
        max_headers: 8,
    };

    fn parse(bytes: &[u8]) -> (Result<bool, HeadError>, Head, BytesMut) {
        let mut src = BytesMut::from(bytes);
        let mut head = Head::default();
        let mut scanned = 0;
        let result = parse_request(&mut src, &mut scanned, LIMITS, &mut head);
        (result, head, src)
    }

    #[test]
    fn parses_a_request_and_leaves_the_pipelined_rest() {
        let (result, head, rest) = parse(
            b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: a\r\nX-A: 1, 2\r\n\r\nGET / HTTP/1.1\r\n",
        );
        assert_eq!(result, Ok(true));
        assert_eq!(head.method(), b"GET");
        assert_eq!(head.target(), b"/api/v1/pods?watch=1");
        assert_eq!(head.value(b"x-a"), Some(&b"1, 2"[..]));
        assert!(head.has_token(b"X-A", b"2"));
        assert_eq!(&rest[..], b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn incomplete_head_asks_for_more_then_completes() {
        let mut src = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\n"[..]);
        let mut head = Head::default();
        let mut scanned = 0;
        assert_eq!(
            parse_request(&mut src, &mut scanned, LIMITS, &mut head),
            Ok(false)
        );
        src.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_request(&mut src, &mut scanned, LIMITS, &mut head),
            Ok(true)
        );
        assert!(src.is_empty());
    }

    #[test]
    fn refuses_what_rfc_9112_says_to_refuse() {
        for (input, expected) in [
            (&b"GET / HTTP/1.1\nHost: a\n\n"[..], "bare LF"),
            (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "obs-fold"),
            (b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n", "bad name"),
            (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "space before colon"),
            (
                b"GET http://x/ HTTP/1.1\r\nHost: a\r\n\r\n",
                "absolute form",
            ),
            (b"GET / HTTP/1.1\r\n\r\n", "no host"),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "two hosts"),
            (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", "version"),
        ] {
            let (result, _, _) = parse(input);
            assert!(
                matches!(result, Err(HeadError::Invalid(_))),
                "{expected}: {result:?}"
            );
        }
    }

    #[test]
    fn limits_give_too_large_and_too_many() {
        let big = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(2000));
        assert_eq!(parse(big.as_bytes()).0, Err(HeadError::TooLarge(1024)));
        let partial_big = format!("GET /{}", "a".repeat(2000));
        assert_eq!(
            parse(partial_big.as_bytes()).0,
            Err(HeadError::TooLarge(1024))
        );
        let many: String = (0..9).map(|i| format!("X-{i}: v\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(parse(req.as_bytes()).0, Err(HeadError::TooManyHeaders(8)));
    }

    #[test]
    fn parses_a_response() {
        let mut src = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"[..],
        );
        let mut head = Head::default();
        let mut scanned = 0;
        assert_eq!(
            parse_response(&mut src, &mut scanned, LIMITS, &mut head),
            Ok(true)
        );
        assert_eq!(head.code, 200);
        assert_eq!(head.reason(), b"OK");
        assert_eq!(&src[..], b"5\r\n");
    }
}
