//! A continue token a client forges (`?continue=` on a LIST the cache serves): whatever the
//! bytes, reading it (`watch::list::token::read`) never panics; what it accepts has a positive
//! resourceVersion and a start key that stays below the list's scope (no leading `/`, no `..`
//! segment); and the token the gateway writes for that place reads back the same.
#![no_main]

use fleetgate::watch::list::token::{read, write};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(resume) = read(text) else {
        return;
    };
    assert!(resume.rv > 0);
    assert!(!resume.start.starts_with('/'));
    assert!(!resume.start.split('/').any(|part| part == ".."));
    if let Some(last) = resume.start.strip_suffix('\u{0}') {
        if !last.is_empty() {
            assert_eq!(read(&write(resume.rv, last)), Some(resume.clone()));
        }
    }
});
