//! The HTTP/1.1 request head parser and what reads a parsed head (body framing, hop-by-hop
//! tokens), over pipelined heads in one buffer; and the response head parser on the same bytes.
#![no_main]

use bytes::BytesMut;
use fleetgate::codec::http1::{
    body::{request_body, response_body},
    head::{parse_request, parse_response, Head, HeadLimits},
    is_hop_by_hop,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits {
        max_head_bytes: 8192,
        max_headers: 64,
    };
    let mut src = BytesMut::from(data);
    let mut scanned = 0;
    for _ in 0..8 {
        let mut head = Head::default();
        let before = src.len();
        match parse_request(&mut src, &mut scanned, limits, &mut head) {
            Ok(true) => {
                assert!(src.len() < before, "a parsed head consumed nothing");
                scanned = 0;
                let _ = request_body(&head);
                for (name, _) in head.headers() {
                    let _ = is_hop_by_hop(&head, name);
                }
                assert!(head.header_count() <= limits.max_headers);
            }
            Ok(false) | Err(_) => break,
        }
    }
    let mut src = BytesMut::from(data);
    let mut scanned = 0;
    let mut head = Head::default();
    if let Ok(true) = parse_response(&mut src, &mut scanned, limits, &mut head) {
        let _ = response_body(&head, b"GET");
        let _ = response_body(&head, b"HEAD");
    }
});
