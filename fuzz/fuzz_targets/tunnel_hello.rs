//! The tunnel listener's hello (the first line an agent sends after mTLS): whatever the bytes,
//! `parse_hello` never panics, and a cluster it accepts is a valid cluster name whose own hello
//! is exactly the input; `printable` (what a refusal reason may carry) keeps only visible ASCII
//! and spaces, at most 200 of them.
#![no_main]

use fleetgate::tunnel::wire::{hello, is_cluster_name, parse_hello, printable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cluster) = parse_hello(data) {
        assert!(is_cluster_name(cluster));
        assert_eq!(hello(cluster).trim_end_matches('\n').as_bytes(), data);
    }
    let text = printable(&String::from_utf8_lossy(data));
    assert!(text.len() <= 200);
    assert!(text.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
});
