//! The chunked-body scanner: scanning the input in one piece and in pieces of any size must
//! agree (same bytes taken, same end, same verdict), and the data ranges it reports must lie in
//! order inside the input.
#![no_main]

use fleetgate::codec::http1::body::ChunkedScanner;
use fleetgate_fuzz::split;
use libfuzzer_sys::fuzz_target;

fn scan(input: &[u8], piece: usize) -> (Result<usize, ()>, bool, Vec<u8>) {
    let mut scanner = ChunkedScanner::new();
    let mut taken = 0;
    let mut data = Vec::new();
    for part in input.chunks(piece.max(1)) {
        let mut last_end = 0;
        match scanner.scan_data(part, |range| {
            assert!(range.start >= last_end && range.end <= part.len() && range.start <= range.end);
            last_end = range.end;
            data.extend_from_slice(&part[range]);
        }) {
            Ok(n) => {
                assert!(n <= part.len());
                taken += n;
                if n < part.len() {
                    assert!(scanner.is_done(), "stopped early without being done");
                    return (Ok(taken), true, data);
                }
            }
            Err(_) => return (Err(()), scanner.is_done(), data),
        }
    }
    (Ok(taken), scanner.is_done(), data)
}

fuzz_target!(|data: &[u8]| {
    let (piece, input) = split(data);
    let whole = scan(input, input.len());
    let pieces = scan(input, usize::from(piece % 16) + 1);
    assert_eq!(whole.0.is_err(), pieces.0.is_err(), "verdicts differ");
    if whole.0.is_ok() {
        assert_eq!(whole, pieces, "one piece and many disagree");
    }
});
