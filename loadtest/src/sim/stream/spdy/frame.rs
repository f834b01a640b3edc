//! SPDY/3.1 frame codec: turns bytes into [`Frame`]s and back, including the zlib-compressed
//! header blocks (one deflate stream per direction for the whole connection, primed with the
//! SPDY/3 dictionary and sync-flushed after every block, as Go's SPDY framer does).
//!
//! It owns no socket and no stream state: [`FrameReader`] pulls from any `AsyncRead`,
//! [`FrameEncoder`] appends to a buffer the caller writes. Called by `spdy::session`.
//! It never trusts a length from the wire: control frames, data frames and decompressed header
//! blocks are bounded.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1), 1423 bytes.
pub(crate) const HEADER_DICTIONARY: &[u8] = include_bytes!("dictionary.bin");

/// Protocol version carried in every control frame.
pub(crate) const SPDY_VERSION: u16 = 3;
/// FLAG_FIN on DATA, SYN_STREAM, SYN_REPLY and HEADERS: the sender will send no more data.
pub(crate) const FLAG_FIN: u8 = 0x01;

/// RST_STREAM status codes used here.
pub(crate) const RST_PROTOCOL_ERROR: u32 = 1;
pub(crate) const RST_CANCEL: u32 = 5;
/// GOAWAY status OK.
pub(crate) const GOAWAY_OK: u32 = 0;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Largest decompressed header block accepted; kubectl's blocks are a few hundred bytes.
const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// Largest control frame accepted (the header blocks of SYN_STREAM are the only big ones).
const MAX_CONTROL_FRAME: usize = 1024 * 1024;

/// Name/value pairs of a header block, names lower-case. A value holding several values keeps
/// them NUL-separated, as on the wire.
pub(crate) type HeaderBlock = Vec<(String, String)>;

/// One SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: HeaderBlock,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: HeaderBlock,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        entries: Vec<(u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: HeaderBlock,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type this codec does not know; the spec says to ignore it.
    Unknown {
        frame_type: u16,
    },
}

/// Why a SPDY connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy connection i/o failed")]
    Io(#[from] std::io::Error),
    #[error("spdy protocol error: {0}")]
    Protocol(&'static str),
    #[error("spdy header block does not decompress")]
    Inflate(#[from] flate2::DecompressError),
    #[error("spdy header block does not compress")]
    Deflate(#[from] flate2::CompressError),
}

/// Reads frames from one direction of a connection, holding that direction's inflate stream.
pub(crate) struct FrameReader<R> {
    io: R,
    inflater: HeaderInflater,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(io: R) -> Self {
        FrameReader {
            io,
            inflater: HeaderInflater::new(),
        }
    }

    /// Next frame, or `None` when the peer closed cleanly between frames.
    pub(crate) async fn read_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        let mut head = [0u8; 8];
        // A clean EOF is only one that falls on a frame boundary.
        let first = self.io.read(&mut head[..1]).await?;
        if first == 0 {
            return Ok(None);
        }
        self.io.read_exact(&mut head[1..]).await?;
        let word0 = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        if word0 & 0x8000_0000 == 0 {
            let stream_id = word0 & 0x7fff_ffff;
            let mut data = BytesMut::zeroed(length);
            self.io.read_exact(&mut data).await?;
            return Ok(Some(Frame::Data {
                stream_id,
                flags,
                data: data.freeze(),
            }));
        }
        let version = ((word0 >> 16) & 0x7fff) as u16;
        let frame_type = (word0 & 0xffff) as u16;
        if version != SPDY_VERSION {
            return Err(SpdyError::Protocol("unsupported SPDY version"));
        }
        if length > MAX_CONTROL_FRAME {
            return Err(SpdyError::Protocol("control frame too large"));
        }
        let mut payload = vec![0u8; length];
        self.io.read_exact(&mut payload).await?;
        decode_control(frame_type, flags, &payload, &mut self.inflater).map(Some)
    }
}

fn need(payload: &[u8], len: usize) -> Result<(), SpdyError> {
    if payload.len() < len {
        Err(SpdyError::Protocol("control frame too short"))
    } else {
        Ok(())
    }
}

fn decode_control(
    frame_type: u16,
    flags: u8,
    payload: &[u8],
    inflater: &mut HeaderInflater,
) -> Result<Frame, SpdyError> {
    let mut p = payload;
    Ok(match frame_type {
        TYPE_SYN_STREAM => {
            need(p, 10)?;
            let stream_id = p.get_u32() & 0x7fff_ffff;
            let associated_to = p.get_u32() & 0x7fff_ffff;
            let priority = p.get_u8() >> 5;
            let _slot = p.get_u8();
            let headers = inflater.decode(p)?;
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            }
        }
        // SYN_REPLY and HEADERS share one layout: the stream id, then a header block.
        TYPE_SYN_REPLY | TYPE_HEADERS => {
            need(p, 4)?;
            let stream_id = p.get_u32() & 0x7fff_ffff;
            let headers = inflater.decode(p)?;
            if frame_type == TYPE_SYN_REPLY {
                Frame::SynReply {
                    stream_id,
                    flags,
                    headers,
                }
            } else {
                Frame::Headers {
                    stream_id,
                    flags,
                    headers,
                }
            }
        }
        TYPE_RST_STREAM => {
            need(p, 8)?;
            Frame::RstStream {
                stream_id: p.get_u32() & 0x7fff_ffff,
                status: p.get_u32(),
            }
        }
        TYPE_SETTINGS => {
            need(p, 4)?;
            let count = p.get_u32() as usize;
            need(p, count.saturating_mul(8))?;
            let entries = (0..count)
                .map(|_| {
                    let id = p.get_u32() & 0x00ff_ffff;
                    (id, p.get_u32())
                })
                .collect();
            Frame::Settings { entries }
        }
        TYPE_PING => {
            need(p, 4)?;
            Frame::Ping { id: p.get_u32() }
        }
        TYPE_GOAWAY => {
            need(p, 4)?;
            let last_good_stream_id = p.get_u32() & 0x7fff_ffff;
            // SPDY/2 GOAWAY had no status; accept a short frame as OK.
            let status = if p.len() >= 4 { p.get_u32() } else { GOAWAY_OK };
            Frame::GoAway {
                last_good_stream_id,
                status,
            }
        }
        TYPE_WINDOW_UPDATE => {
            need(p, 8)?;
            Frame::WindowUpdate {
                stream_id: p.get_u32() & 0x7fff_ffff,
                delta: p.get_u32() & 0x7fff_ffff,
            }
        }
        other => Frame::Unknown { frame_type: other },
    })
}

/// The receive side's zlib stream. The peer primes its compressor with the dictionary, so the
/// first inflate call reports "needs dictionary"; we supply it then.
struct HeaderInflater {
    inner: Decompress,
}

impl HeaderInflater {
    fn new() -> Self {
        HeaderInflater {
            inner: Decompress::new(true),
        }
    }

    fn decode(&mut self, compressed: &[u8]) -> Result<HeaderBlock, SpdyError> {
        let raw = self.inflate(compressed)?;
        parse_header_block(&raw)
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 512 {
                out.reserve(4096);
            }
            let in_before = self.inner.total_in();
            let out_before = out.len();
            let result = self
                .inner
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            let consumed = (self.inner.total_in() - in_before) as usize;
            pos += consumed;
            match result {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inner.set_dictionary(HEADER_DICTIONARY)?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::Protocol("header block too large"));
            }
            let produced = out.len() - out_before;
            let output_had_room = out.len() < out.capacity();
            if pos >= input.len() && output_had_room {
                return Ok(out);
            }
            if consumed == 0 && produced == 0 && output_had_room {
                return Err(SpdyError::Protocol("truncated header block"));
            }
        }
    }
}

fn parse_header_block(raw: &[u8]) -> Result<HeaderBlock, SpdyError> {
    let mut p = raw;
    need(p, 4)?;
    let count = p.get_u32() as usize;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = take_string(&mut p)?;
        let value = take_string(&mut p)?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

fn take_string(p: &mut &[u8]) -> Result<String, SpdyError> {
    need(p, 4)?;
    let len = p.get_u32() as usize;
    need(p, len)?;
    let s = String::from_utf8_lossy(&p[..len]).into_owned();
    p.advance(len);
    Ok(s)
}

/// Encodes frames for one direction of a connection, holding that direction's deflate stream.
pub(crate) struct FrameEncoder {
    deflater: Compress,
}

impl FrameEncoder {
    pub(crate) fn new() -> Result<Self, SpdyError> {
        let mut deflater = Compress::new(Compression::default(), true);
        deflater.set_dictionary(HEADER_DICTIONARY)?;
        Ok(FrameEncoder { deflater })
    }

    /// Appends the wire form of `frame` to `out`.
    pub(crate) fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), SpdyError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if data.len() > 0x00ff_ffff {
                    return Err(SpdyError::Protocol("data frame too large"));
                }
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
                out.extend_from_slice(data);
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                let block = self.compress_headers(headers)?;
                let mut body = BytesMut::with_capacity(10 + block.len());
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(associated_to & 0x7fff_ffff);
                body.put_u8((priority & 0x7) << 5);
                body.put_u8(0);
                body.extend_from_slice(&block);
                put_control(out, TYPE_SYN_STREAM, *flags, &body);
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let frame_type = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                let block = self.compress_headers(headers)?;
                let mut body = BytesMut::with_capacity(4 + block.len());
                body.put_u32(stream_id & 0x7fff_ffff);
                body.extend_from_slice(&block);
                put_control(out, frame_type, *flags, &body);
            }
            Frame::RstStream { stream_id, status } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(*status);
                put_control(out, TYPE_RST_STREAM, 0, &body);
            }
            Frame::Settings { entries } => {
                let mut body = BytesMut::with_capacity(4 + entries.len() * 8);
                body.put_u32(entries.len() as u32);
                for (id, value) in entries {
                    body.put_u32(id & 0x00ff_ffff);
                    body.put_u32(*value);
                }
                put_control(out, TYPE_SETTINGS, 0, &body);
            }
            Frame::Ping { id } => put_control(out, TYPE_PING, 0, &id.to_be_bytes()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(last_good_stream_id & 0x7fff_ffff);
                body.put_u32(*status);
                put_control(out, TYPE_GOAWAY, 0, &body);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(delta & 0x7fff_ffff);
                put_control(out, TYPE_WINDOW_UPDATE, 0, &body);
            }
            Frame::Unknown { .. } => {
                return Err(SpdyError::Protocol("cannot encode unknown frame"))
            }
        }
        Ok(())
    }

    fn compress_headers(&mut self, headers: &HeaderBlock) -> Result<Vec<u8>, SpdyError> {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (name, value) in headers {
            // Go's framer rejects header names that are not lower-case.
            let name = name.to_ascii_lowercase();
            raw.put_u32(name.len() as u32);
            raw.extend_from_slice(name.as_bytes());
            raw.put_u32(value.len() as u32);
            raw.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(1024);
            }
            let in_before = self.deflater.total_in();
            self.deflater
                .compress_vec(&raw[pos..], &mut out, FlushCompress::Sync)?;
            pos += (self.deflater.total_in() - in_before) as usize;
            // Sync flush is complete once all input is taken and the output was not full.
            if pos >= raw.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

fn put_control(out: &mut BytesMut, frame_type: u16, flags: u8, body: &[u8]) {
    out.put_u16(0x8000 | SPDY_VERSION);
    out.put_u16(frame_type);
    out.put_u32((u32::from(flags) << 24) | (body.len() as u32 & 0x00ff_ffff));
    out.extend_from_slice(body);
}

/// First value of header `name` (lower-case) in a block.
pub(crate) fn header<'a>(headers: &'a HeaderBlock, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.split('\0').next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut encoder = FrameEncoder::new().unwrap();
        let mut wire = BytesMut::new();
        for f in frames {
            encoder.encode(f, &mut wire).unwrap();
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut reader = FrameReader::new(&wire[..]);
            let mut got = Vec::new();
            while let Some(f) = reader.read_frame().await.unwrap() {
                got.push(f);
            }
            got
        })
    }

    #[test]
    fn dictionary_is_the_spdy3_one() {
        assert_eq!(HEADER_DICTIONARY.len(), 1423);
        assert!(HEADER_DICTIONARY.starts_with(b"\x00\x00\x00\x07options"));
    }

    #[test]
    fn every_frame_kind_survives_a_roundtrip_with_shared_compression_state() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: FLAG_FIN,
                headers: vec![("streamtype".into(), "error".into())],
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 2,
                flags: 0,
                headers: vec![
                    ("streamtype".into(), "data".into()),
                    ("port".into(), "8080".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: vec![],
            },
            Frame::Headers {
                stream_id: 3,
                flags: 0,
                headers: vec![("x".into(), "a\0b".into())],
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hello"),
            },
            Frame::RstStream {
                stream_id: 3,
                status: RST_CANCEL,
            },
            Frame::Settings {
                entries: vec![(7, 65536)],
            },
            Frame::Ping { id: 2 },
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 1000,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: GOAWAY_OK,
            },
        ];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn large_header_values_inflate_whole() {
        let big: String = (0..20_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let frames = vec![Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: vec![("big".into(), big)],
        }];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn garbage_and_mutated_frames_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut encoder = FrameEncoder::new().unwrap();
        let mut valid = BytesMut::new();
        for id in [1u32, 3, 5] {
            encoder
                .encode(
                    &Frame::SynStream {
                        stream_id: id,
                        associated_to: 0,
                        priority: 0,
                        flags: 0,
                        headers: vec![("streamtype".into(), "stdin".into())],
                    },
                    &mut valid,
                )
                .unwrap();
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for round in 0..3000 {
            let input: Vec<u8> = if round % 2 == 0 {
                let len = rng.random_range(0..64);
                (0..len).map(|_| rng.random()).collect()
            } else {
                let mut bytes = valid.to_vec();
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] = rng.random();
                }
                bytes
            };
            rt.block_on(async {
                let mut reader = FrameReader::new(input.as_slice());
                for _ in 0..16 {
                    match reader.read_frame().await {
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
            });
        }
    }

    #[test]
    fn truncated_frame_is_an_error_not_a_clean_eof() {
        let mut encoder = FrameEncoder::new().unwrap();
        let mut wire = BytesMut::new();
        encoder.encode(&Frame::Ping { id: 1 }, &mut wire).unwrap();
        wire.truncate(wire.len() - 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut reader = FrameReader::new(&wire[..]);
            assert!(reader.read_frame().await.is_err());
        });
    }
}
