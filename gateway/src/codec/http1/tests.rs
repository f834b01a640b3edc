//! Property tests over head parsing and chunked framing (the cargo-fuzz substitute: this machine
//! has no nightly toolchain). They check that the parsers never panic on arbitrary input, that a
//! valid message split at any point parses the same as whole, and that re-framing random chunk
//! sequences is always found to end exactly where it does.

use super::*;
use bytes::BytesMut;
use proptest::prelude::*;

const LIMITS: HeadLimits = HeadLimits {
    max_head_bytes: 8192,
    max_headers: 64,
};

/// `input` parsed by `parse` (a request or a response parser) when it is one whole head; `None`
/// when it is cut short or refused.
fn whole_head(
    parse: fn(&mut BytesMut, &mut usize, HeadLimits, &mut Head) -> Result<bool, HeadError>,
    input: &[u8],
) -> Option<Head> {
    let mut head = Head::default();
    let parsed = parse(&mut BytesMut::from(input), &mut 0, LIMITS, &mut head);
    matches!(parsed, Ok(true)).then_some(head)
}

fn chunked_encode(chunks: &[Vec<u8>], ext: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks.iter().filter(|c| !c.is_empty()) {
        out.extend_from_slice(format!("{:x}", c.len()).as_bytes());
        if ext {
            out.extend_from_slice(b";a=\"b\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn request_parser_never_panics(input in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Some(head) = whole_head(parse_request, &input) {
            // Whatever was accepted has a sane framing decision or a clean refusal.
            let _ = request_body(&head);
            prop_assert!(head.target().starts_with(b"/"));
        }
    }

    #[test]
    fn request_parser_never_panics_on_near_valid_heads(
        name in "[A-Za-z-]{1,10}", value in "[ -~\t]{0,20}", junk in proptest::collection::vec(any::<u8>(), 0..8),
        pos in 0usize..60,
    ) {
        let mut bytes = format!("GET /x HTTP/1.1\r\nHost: a\r\n{name}: {value}\r\n\r\n").into_bytes();
        let at = pos.min(bytes.len());
        bytes.splice(at..at, junk);
        let _ = whole_head(parse_request, &bytes);
    }

    #[test]
    fn split_heads_parse_like_whole_ones(split in 0usize..80, value in "[a-z0-9]{0,30}") {
        let text = format!("POST /apis/x?y=%2F HTTP/1.1\r\nHost: gw\r\nX-V: {value}\r\nContent-Length: 3\r\n\r\nabc");
        let bytes = text.as_bytes();
        let at = split.min(bytes.len());
        let mut src = BytesMut::from(&bytes[..at]);
        let mut head = Head::default();
        let mut scanned = 0;
        let mut done = parse_request(&mut src, &mut scanned, LIMITS, &mut head).unwrap();
        src.extend_from_slice(&bytes[at..]);
        if !done {
            done = parse_request(&mut src, &mut scanned, LIMITS, &mut head).unwrap();
        }
        prop_assert!(done);
        prop_assert_eq!(head.target(), &b"/apis/x?y=%2F"[..]);
        prop_assert_eq!(head.value(b"x-v").unwrap(), value.as_bytes());
        prop_assert_eq!(request_body(&head), Ok(BodyKind::Length(3)));
        prop_assert_eq!(&src[..], b"abc");
    }

    #[test]
    fn response_parser_never_panics(input in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Some(head) = whole_head(parse_response, &input) {
            let _ = response_body(&head, b"GET");
        }
    }

    #[test]
    fn chunked_scanner_finds_the_exact_end_at_any_split(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        ext in any::<bool>(),
        cuts in proptest::collection::vec(0usize..4000, 0..6),
    ) {
        let body = chunked_encode(&chunks, ext);
        let mut input = body.clone();
        input.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        points.sort_unstable();
        points.push(input.len());
        let mut scanner = ChunkedScanner::new();
        let mut consumed = 0;
        let mut start = 0;
        for end in points {
            if consumed < start { break; }
            let n = scanner.scan(&input[consumed..end.max(consumed)]).unwrap();
            consumed += n;
            start = end;
        }
        prop_assert!(scanner.is_done());
        prop_assert_eq!(consumed, body.len());
    }

    #[test]
    fn chunked_data_ranges_decode_the_body_at_any_split(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        ext in any::<bool>(),
        cut in 0usize..4000,
    ) {
        let body = chunked_encode(&chunks, ext);
        let at = cut.min(body.len());
        let mut scanner = ChunkedScanner::new();
        let mut decoded = Vec::new();
        let first = &body[..at];
        let n = scanner.scan_data(first, |r| decoded.extend_from_slice(&first[r])).unwrap();
        prop_assert_eq!(n, at);
        let rest = &body[at..];
        let m = scanner.scan_data(rest, |r| decoded.extend_from_slice(&rest[r])).unwrap();
        prop_assert_eq!(n + m, body.len());
        prop_assert!(scanner.is_done());
        prop_assert_eq!(decoded, chunks.concat());
    }

    #[test]
    fn chunked_scanner_never_panics(input in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut scanner = ChunkedScanner::new();
        if let Ok(n) = scanner.scan(&input) {
            prop_assert!(n <= input.len());
            prop_assert!(n == input.len() || scanner.is_done());
        }
    }

    #[test]
    fn corrupting_a_framing_byte_is_caught_or_changes_nothing_dangerous(
        chunks in proptest::collection::vec(proptest::collection::vec(b'a'..=b'z', 1..50), 1..5),
        at in any::<prop::sample::Index>(), byte in any::<u8>(),
    ) {
        // Replacing one byte of a valid chunked body must never make the scanner consume past the
        // input or claim completion at a point other than after a "0\r\n...\r\n" sequence.
        let mut body = chunked_encode(&chunks, false);
        let i = at.index(body.len());
        body[i] = byte;
        let mut scanner = ChunkedScanner::new();
        if let Ok(n) = scanner.scan(&body) {
            prop_assert!(n <= body.len());
            if scanner.is_done() {
                prop_assert!(body[..n].ends_with(b"\r\n\r\n") || body[..n].ends_with(b"0\r\n\r\n"));
            }
        }
    }
}
