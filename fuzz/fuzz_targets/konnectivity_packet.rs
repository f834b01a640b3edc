//! konnectivity agents' packets (the gRPC messages of `AgentService.Connect`, after mTLS): the
//! first byte splits the rest into chunks as a peer's DATA frames might; whatever the bytes,
//! `MessageReader` and `decode` never panic and never yield a message over the bound, and every
//! packet they accept encodes and decodes back to itself.
#![no_main]

use bytes::Bytes;
use fleetgate::tunnel::konnectivity::packet::{decode, encode, MessageReader, MAX_MESSAGE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(split).max(1);
    let mut reader = MessageReader::default();
    'feed: for piece in rest.chunks(chunk) {
        reader.push(piece);
        loop {
            match reader.next_message() {
                Ok(Some(message)) => {
                    assert!(message.len() <= MAX_MESSAGE);
                    if let Ok(packet) = decode(message) {
                        assert_eq!(decode(encode(&packet)), Ok(packet));
                    }
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
    // The bytes as one message too.
    if let Ok(packet) = decode(Bytes::copy_from_slice(rest)) {
        assert_eq!(decode(encode(&packet)), Ok(packet));
    }
});
