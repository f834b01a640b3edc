//! h2 on the wire, frame by frame, for hostile-input tests: what a well-behaved h2 library will
//! not send (a `:path` not starting with `/`, floods of SETTINGS, PING or CONTINUATION, rapid
//! resets). Header blocks are HPACK literals without Huffman coding or indexing, which every
//! decoder must accept. Used by hostile.rs.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// One frame: its 9-byte header and payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A SETTINGS frame with these (identifier, value) pairs.
pub fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, value) in pairs {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &payload)
}

/// An HPACK header block of literal fields ("without indexing, new name", no Huffman).
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        push_string(&mut out, name.as_bytes());
        push_string(&mut out, value.as_bytes());
    }
    out
}

fn push_string(out: &mut Vec<u8>, s: &[u8]) {
    // A 7-bit prefix integer (no Huffman bit).
    let mut len = s.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(s);
}

/// RST_STREAM with error `code` (8 is CANCEL).
pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// A PING (not an ACK).
pub fn ping(data: u64) -> Vec<u8> {
    frame(PING, 0, 0, &data.to_be_bytes())
}

/// A field added to the HPACK dynamic table ("literal with incremental indexing, new name").
pub fn indexed_literal(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0x40);
    push_string(out, name.as_bytes());
    push_string(out, value);
}

/// A reference to entry `index` of the HPACK tables (the first dynamic entry is 62).
pub fn indexed(out: &mut Vec<u8>, index: usize) {
    // A 7-bit prefix integer with the "indexed" bit.
    if index < 127 {
        out.push(0x80 | index as u8);
    } else {
        out.push(0xff);
        let mut rest = index - 127;
        while rest >= 128 {
            out.push((rest % 128) as u8 | 0x80);
            rest /= 128;
        }
        out.push(rest as u8);
    }
}

/// The request fields of a GET of `path`.
pub fn get_fields(path: &str) -> Vec<(&'static str, String)> {
    vec![
        (":method", "GET".into()),
        (":scheme", "https".into()),
        (":authority", "gw".into()),
        (":path", path.into()),
    ]
}

/// A HEADERS frame (END_HEADERS, and END_STREAM when `end`) carrying `fields`.
pub fn headers(stream: u32, fields: &[(&str, String)], end: bool) -> Vec<u8> {
    let borrowed: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let flags = END_HEADERS | if end { END_STREAM } else { 0 };
    frame(HEADERS, flags, stream, &header_block(&borrowed))
}

/// A frame as read back.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's error code.
    pub fn goaway_code(&self) -> Option<u32> {
        (self.kind == GOAWAY && self.payload.len() >= 8)
            .then(|| u32::from_be_bytes(self.payload[4..8].try_into().unwrap()))
    }

    /// The `:status` of a response HEADERS frame, when the server sent it as an indexed field
    /// of the static table (200, 204, 206, 304, 400, 404, 500) or as a literal with an indexed
    /// name.
    pub fn status(&self) -> Option<u16> {
        if self.kind != HEADERS {
            return None;
        }
        let first = *self.payload.first()?;
        let indexed = match first & 0x7f {
            8 => Some(200),
            9 => Some(204),
            10 => Some(206),
            11 => Some(304),
            12 => Some(400),
            13 => Some(404),
            14 => Some(500),
            _ => None,
        };
        if first & 0x80 != 0 {
            return indexed;
        }
        // Literal with the name indexed (any of 8..=14 is `:status`): the value is 3 ASCII digits.
        let value = self.payload.get(2..5)?;
        std::str::from_utf8(value).ok()?.parse().ok()
    }
}

/// Reads one frame; None at end of stream.
pub async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Frame> {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.ok()?;
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: header[3],
        flags: header[4],
        stream: u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff,
        payload,
    })
}

/// The preface and an empty SETTINGS frame, then the server's SETTINGS is acknowledged as it
/// comes (by [`read_until`]).
pub async fn start<S: AsyncWrite + Unpin>(stream: &mut S) {
    let mut out = PREFACE.to_vec();
    out.extend_from_slice(&settings(&[]));
    stream.write_all(&out).await.unwrap();
}

/// Reads frames (acknowledging the server's SETTINGS) until `pred` holds for one, which is
/// returned; None if the connection ends first or nothing matches within 20 s (a gateway that
/// stopped answering fails a test instead of hanging it).
pub async fn read_until<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    pred: impl Fn(&Frame) -> bool,
) -> Option<Frame> {
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        read_until_unbounded(stream, pred),
    )
    .await
    .ok()
    .flatten()
}

async fn read_until_unbounded<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    pred: impl Fn(&Frame) -> bool,
) -> Option<Frame> {
    loop {
        let frame = read_frame(stream).await?;
        if frame.kind == SETTINGS && frame.flags & ACK == 0 {
            stream
                .write_all(&self::frame(SETTINGS, ACK, 0, &[]))
                .await
                .ok()?;
        }
        if pred(&frame) {
            return Some(frame);
        }
    }
}
