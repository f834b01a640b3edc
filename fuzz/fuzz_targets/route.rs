//! The path rule, the route and the whole decision (route, request info, authentication from the
//! headers, policy, impersonation) for any method, target and header fields. A target the path
//! rule passes never holds a dot segment, an encoded separator or a NUL.
#![no_main]

use fleetgate::auth::{ClientIdentity, ConnectionAuth};
use fleetgate::request::{self, route, target};
use fleetgate_fuzz::{split, table};
use libfuzzer_sys::fuzz_target;

const METHODS: [&[u8]; 8] = [
    b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS", b"CONNECT",
];

fuzz_target!(|data: &[u8]| {
    let (selector, rest) = split(data);
    let method = METHODS[usize::from(selector & 7)];
    // The target, then header lines `name: value` separated by newlines.
    let mut parts = rest.split(|b| *b == b'\n');
    let target = parts.next().unwrap_or_default();
    let headers: Vec<(&[u8], &[u8])> = parts
        .filter_map(|line| {
            let colon = line.iter().position(|b| *b == b':')?;
            Some((&line[..colon], line[colon + 1..].trim_ascii()))
        })
        .collect();
    let _ = route::route(target, true);
    let _ = route::route(target, false);
    if target::check(target).is_ok() {
        let path = target.split(|b| *b == b'?').next().unwrap_or_default();
        let lower = path.to_ascii_lowercase();
        for segment in lower.split(|b| *b == b'/').skip(1) {
            // `%2e` is a dot only where it makes the whole segment `.` or `..`.
            let decoded: Vec<u8> = String::from_utf8_lossy(segment)
                .replace("%2e", ".")
                .into_bytes();
            assert!(decoded != b"." && decoded != b"..", "dot segment passed");
        }
        assert!(!path.contains(&0), "NUL passed");
        for bad in [&b"%2f"[..], b"%5c", b"%00"] {
            assert!(
                !lower.windows(3).any(|w| w == bad),
                "encoded separator passed"
            );
        }
    }
    let anonymous = ClientIdentity::anonymous();
    let conn = ConnectionAuth::new(&anonymous);
    let _ = request::decide(table(), &conn, method, target, || headers.iter().copied());
});
