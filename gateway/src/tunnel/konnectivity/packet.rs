//! konnectivity's packets on the wire: the gRPC message framing of the `AgentService.Connect`
//! stream (a compressed flag byte, a 4-byte big-endian length, the message) and the protobuf
//! encoding of its `Packet` message, field numbers as in apiserver-network-proxy's
//! `konnectivity-client/proto/client/client.proto` (`tests/python/konnectivity.proto` declares
//! the same for the test agent).
//!
//! Hand-written rather than generated (no protoc, no build script, no `prost`): the protocol is
//! seven small messages of strings, int64s and bytes, and the decoder is the part a hostile agent
//! reaches, so it is short, bounded and fuzzed (`fuzz/fuzz_targets/konnectivity_packet.rs`).
//! Decoding never panics and never allocates beyond the message it was handed: a DATA payload is
//! a slice of it. Unknown fields are skipped as protobuf requires; unknown packet types decode
//! as [`Packet::Unknown`] for the session to ignore. Pure functions: no I/O, no runtime.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The longest gRPC message accepted from an agent. An ANP agent sends DATA of at most 4 KiB
/// (it reads its member connections 4 KiB at a time); the bound keeps what a hostile agent can
/// make the gateway hold for one message small.
pub const MAX_MESSAGE: usize = 1024 * 1024;

/// `PacketType` values.
const DIAL_REQ: u64 = 0;
const DIAL_RSP: u64 = 1;
const CLOSE_REQ: u64 = 2;
const CLOSE_RSP: u64 = 3;
const DATA: u64 = 4;
const DIAL_CLS: u64 = 5;
const DRAIN: u64 = 6;

/// One konnectivity packet (the `type` and its `payload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    DialRequest {
        protocol: String,
        address: String,
        random: i64,
    },
    DialResponse {
        error: String,
        connect_id: i64,
        random: i64,
    },
    CloseRequest {
        connect_id: i64,
    },
    CloseResponse {
        error: String,
        connect_id: i64,
    },
    Data {
        connect_id: i64,
        error: String,
        data: Bytes,
    },
    CloseDial {
        random: i64,
    },
    Drain,
    /// A type this gateway does not know (a newer protocol's): ignored.
    Unknown(u64),
}

/// Why bytes are not a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    VarintTooLong,
    /// A wire type protobuf 3 does not use (groups) or that does not exist.
    WireType(u64),
    /// A known field with the wrong wire type.
    FieldType(u32),
    TooLarge(usize),
    /// The gRPC compressed flag, though no compression was negotiated.
    Compressed,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("a truncated protobuf field"),
            DecodeError::VarintTooLong => f.write_str("a varint longer than 10 bytes"),
            DecodeError::WireType(t) => write!(f, "protobuf wire type {t}"),
            DecodeError::FieldType(n) => write!(f, "field {n} with the wrong wire type"),
            DecodeError::TooLarge(n) => {
                write!(f, "a {n}-byte gRPC message (the limit is {MAX_MESSAGE})")
            }
            DecodeError::Compressed => f.write_str("a compressed gRPC message"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Splits the gRPC messages out of a stream's DATA as they come.
#[derive(Default)]
pub struct MessageReader {
    buf: BytesMut,
}

impl MessageReader {
    /// Appends received bytes. The caller reads messages out before pushing more, so at most
    /// one message (bounded by [`MAX_MESSAGE`]) and one DATA frame are held.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, if one is in.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, DecodeError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(DecodeError::Compressed);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(DecodeError::TooLarge(len));
        }
        if self.buf.len() < 5 + len {
            self.buf.reserve(5 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Bytes of an unfinished message.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Appends `packet` to `out` as one gRPC message.
pub fn write_message(packet: &Packet, out: &mut BytesMut) {
    let body = encode(packet);
    out.reserve(5 + body.len());
    out.put_u8(0);
    out.put_u32(body.len() as u32);
    out.extend_from_slice(&body);
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn put_key(out: &mut BytesMut, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// An int64 field (proto3 leaves zero out).
fn put_int64(out: &mut BytesMut, field: u32, v: i64) {
    if v != 0 {
        put_key(out, field, 0);
        put_varint(out, v as u64);
    }
}

/// A string or bytes field (proto3 leaves empty out).
fn put_bytes(out: &mut BytesMut, field: u32, v: &[u8]) {
    if !v.is_empty() {
        put_key(out, field, 2);
        put_varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }
}

/// The protobuf encoding of `packet`.
pub fn encode(packet: &Packet) -> Bytes {
    let mut payload = BytesMut::new();
    let (kind, field) = match packet {
        Packet::DialRequest {
            protocol,
            address,
            random,
        } => {
            put_bytes(&mut payload, 1, protocol.as_bytes());
            put_bytes(&mut payload, 2, address.as_bytes());
            put_int64(&mut payload, 3, *random);
            (DIAL_REQ, 2)
        }
        Packet::DialResponse {
            error,
            connect_id,
            random,
        } => {
            put_bytes(&mut payload, 1, error.as_bytes());
            put_int64(&mut payload, 2, *connect_id);
            put_int64(&mut payload, 3, *random);
            (DIAL_RSP, 3)
        }
        Packet::Data {
            connect_id,
            error,
            data,
        } => {
            put_int64(&mut payload, 1, *connect_id);
            put_bytes(&mut payload, 2, error.as_bytes());
            put_bytes(&mut payload, 3, data);
            (DATA, 4)
        }
        Packet::CloseRequest { connect_id } => {
            put_int64(&mut payload, 1, *connect_id);
            (CLOSE_REQ, 5)
        }
        Packet::CloseResponse { error, connect_id } => {
            put_bytes(&mut payload, 1, error.as_bytes());
            put_int64(&mut payload, 2, *connect_id);
            (CLOSE_RSP, 6)
        }
        Packet::CloseDial { random } => {
            put_int64(&mut payload, 1, *random);
            (DIAL_CLS, 7)
        }
        Packet::Drain => (DRAIN, 8),
        Packet::Unknown(kind) => {
            let mut out = BytesMut::new();
            put_int64(&mut out, 1, *kind as i64);
            return out.freeze();
        }
    };
    let mut out = BytesMut::with_capacity(payload.len() + 12);
    put_int64(&mut out, 1, kind as i64);
    // The oneof payload is always present, even empty (as the Go implementation sends it).
    put_key(&mut out, field, 2);
    put_varint(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    out.freeze()
}

/// A protobuf field's value as read.
enum Value {
    Varint(u64),
    Bytes(Bytes),
    Fixed,
}

/// Reads the fields of one message.
struct Fields {
    rest: Bytes,
}

impl Fields {
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            if !self.rest.has_remaining() {
                return Err(DecodeError::Truncated);
            }
            let b = self.rest.get_u8();
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    fn next_field(&mut self) -> Result<Option<(u32, Value)>, DecodeError> {
        if !self.rest.has_remaining() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = (key >> 3).min(u64::from(u32::MAX)) as u32;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if self.rest.remaining() < n {
                    return Err(DecodeError::Truncated);
                }
                self.rest.advance(n);
                Value::Fixed
            }
            2 => {
                let len = self.varint()?;
                if len > self.rest.remaining() as u64 {
                    return Err(DecodeError::Truncated);
                }
                Value::Bytes(self.rest.split_to(len as usize))
            }
            other => return Err(DecodeError::WireType(other)),
        };
        Ok(Some((field, value)))
    }
}

/// The payload message's fields by number: int64s and strings/bytes (last one wins, as in
/// protobuf). Fields of other types are skipped; a known field of the wrong type is an error.
#[derive(Default)]
struct Payload {
    ints: [i64; 4],
    bytes: [Bytes; 4],
}

/// Which of fields 1..=3 are int64 (`true`) or string/bytes (`false`) in each payload.
fn read_payload(raw: Bytes, int_fields: [bool; 3]) -> Result<Payload, DecodeError> {
    let mut fields = Fields { rest: raw };
    let mut p = Payload::default();
    while let Some((n, value)) = fields.next_field()? {
        let Some(&is_int) = int_fields.get((n as usize).wrapping_sub(1)) else {
            continue;
        };
        match (is_int, value) {
            (true, Value::Varint(v)) => p.ints[n as usize] = v as i64,
            (false, Value::Bytes(b)) => p.bytes[n as usize] = b,
            _ => return Err(DecodeError::FieldType(n)),
        }
    }
    Ok(p)
}

impl Payload {
    /// Bytes field `n`, taken out.
    fn bytes(&mut self, n: usize) -> Bytes {
        std::mem::take(&mut self.bytes[n])
    }

    /// String field `n`, taken out (bytes that are not UTF-8 become U+FFFD, never an error).
    fn text(&mut self, n: usize) -> String {
        String::from_utf8_lossy(&self.bytes(n)).into_owned()
    }
}

/// Decodes one `Packet` message.
pub fn decode(message: Bytes) -> Result<Packet, DecodeError> {
    if message.len() > MAX_MESSAGE {
        return Err(DecodeError::TooLarge(message.len()));
    }
    let mut fields = Fields { rest: message };
    let mut kind = 0u64;
    // The oneof's payloads by field number (2..=8); the last one seen wins.
    let mut payloads: [Option<Bytes>; 9] = Default::default();
    while let Some((n, value)) = fields.next_field()? {
        match (n, value) {
            (1, Value::Varint(v)) => kind = v,
            (2..=8, Value::Bytes(b)) => {
                // A oneof holds one member: a later one clears the others.
                payloads = Default::default();
                payloads[n as usize] = Some(b);
            }
            (1..=8, _) => return Err(DecodeError::FieldType(n)),
            _ => {}
        }
    }
    let take = |i: usize, payloads: &mut [Option<Bytes>; 9]| payloads[i].take().unwrap_or_default();
    Ok(match kind {
        DIAL_REQ => {
            let mut p = read_payload(take(2, &mut payloads), [false, false, true])?;
            Packet::DialRequest {
                protocol: p.text(1),
                address: p.text(2),
                random: p.ints[3],
            }
        }
        DIAL_RSP => {
            let mut p = read_payload(take(3, &mut payloads), [false, true, true])?;
            Packet::DialResponse {
                error: p.text(1),
                connect_id: p.ints[2],
                random: p.ints[3],
            }
        }
        DATA => {
            let mut p = read_payload(take(4, &mut payloads), [true, false, false])?;
            Packet::Data {
                connect_id: p.ints[1],
                error: p.text(2),
                data: p.bytes(3),
            }
        }
        CLOSE_REQ => {
            let p = read_payload(take(5, &mut payloads), [true, true, true])?;
            Packet::CloseRequest {
                connect_id: p.ints[1],
            }
        }
        CLOSE_RSP => {
            let mut p = read_payload(take(6, &mut payloads), [false, true, true])?;
            Packet::CloseResponse {
                error: p.text(1),
                connect_id: p.ints[2],
            }
        }
        DIAL_CLS => {
            let p = read_payload(take(7, &mut payloads), [true, true, true])?;
            Packet::CloseDial { random: p.ints[1] }
        }
        DRAIN => Packet::Drain,
        other => Packet::Unknown(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_kinds() -> Vec<Packet> {
        vec![
            Packet::DialRequest {
                protocol: "tcp".into(),
                address: "kubernetes.default.svc:443".into(),
                random: -7_000_000_000_123,
            },
            Packet::DialResponse {
                error: String::new(),
                connect_id: 42,
                random: i64::MIN,
            },
            Packet::DialResponse {
                error: "dial tcp: connection refused".into(),
                connect_id: 0,
                random: 5,
            },
            Packet::Data {
                connect_id: 42,
                error: String::new(),
                data: Bytes::from_static(b"\x16\x03\x01 hello"),
            },
            Packet::CloseRequest { connect_id: 42 },
            Packet::CloseResponse {
                error: "Unknown connectID".into(),
                connect_id: i64::MAX,
            },
            Packet::CloseDial { random: 9 },
            Packet::Drain,
        ]
    }

    #[test]
    fn every_packet_round_trips_through_the_grpc_framing() {
        let mut wire = BytesMut::new();
        for p in all_kinds() {
            write_message(&p, &mut wire);
        }
        // Fed a byte at a time, as a hostile peer might split it.
        let mut reader = MessageReader::default();
        let mut got = Vec::new();
        for b in wire.iter() {
            reader.push(&[*b]);
            while let Some(m) = reader.next_message().unwrap() {
                got.push(decode(m).unwrap());
            }
        }
        assert_eq!(got, all_kinds());
        assert_eq!(reader.pending(), 0);
    }

    #[test]
    fn known_bytes_from_the_reference_encoding() {
        // DIAL_RSP {connectID: 1, random: 2}, as a protobuf library writes it.
        let bytes = Bytes::from_static(&[0x08, 0x01, 0x1a, 0x04, 0x10, 0x01, 0x18, 0x02]);
        assert_eq!(
            decode(bytes).unwrap(),
            Packet::DialResponse {
                error: String::new(),
                connect_id: 1,
                random: 2
            }
        );
        // type DIAL_REQ (0) is the default and may be left out entirely.
        assert_eq!(
            decode(Bytes::new()).unwrap(),
            Packet::DialRequest {
                protocol: String::new(),
                address: String::new(),
                random: 0
            }
        );
    }

    #[test]
    fn hostile_messages_are_errors_or_ignored_never_panics() {
        for (bytes, want) in [
            (&[0x08][..], Err(DecodeError::Truncated)),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                ],
                Err(DecodeError::VarintTooLong),
            ),
            (&[0x0b], Err(DecodeError::WireType(3))),
            (&[0x0a, 0x00], Err(DecodeError::FieldType(1))),
            (&[0x22, 0x05, 0x08], Err(DecodeError::Truncated)),
            (
                &[0x08, 0x04, 0x22, 0x02, 0x08, 0x80],
                Err(DecodeError::Truncated),
            ),
            // DATA whose connectID is a string.
            (
                &[0x08, 0x04, 0x22, 0x02, 0x0a, 0x00],
                Err(DecodeError::FieldType(1)),
            ),
            (&[0x08, 0x63], Ok(Packet::Unknown(99))),
            // Unknown fields (numbers 9 and 100, fixed32 and fixed64) are skipped.
            (
                &[
                    0x08, 0x05, 0x4d, 1, 2, 3, 4, 0xa1, 0x06, 1, 2, 3, 4, 5, 6, 7, 8,
                ],
                Ok(Packet::CloseDial { random: 0 }),
            ),
        ] {
            assert_eq!(decode(Bytes::copy_from_slice(bytes)), want, "{bytes:x?}");
        }
        let mut reader = MessageReader::default();
        reader.push(&[1, 0, 0, 0, 0]);
        assert_eq!(reader.next_message(), Err(DecodeError::Compressed));
        let mut reader = MessageReader::default();
        reader.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            reader.next_message(),
            Err(DecodeError::TooLarge(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(Bytes::from(bytes.clone()));
            let mut reader = MessageReader::default();
            reader.push(&bytes);
            while let Ok(Some(m)) = reader.next_message() {
                let _ = decode(m);
            }
        }

        #[test]
        fn data_round_trips(id in any::<i64>(), data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let p = Packet::Data { connect_id: id, error: String::new(), data: Bytes::from(data) };
            prop_assert_eq!(decode(encode(&p)).unwrap(), p);
        }
    }
}
