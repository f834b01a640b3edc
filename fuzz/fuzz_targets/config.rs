//! Configuration files: any YAML text as one file of a config directory, loaded, validated and,
//! when valid, built into a routing table. A bad file is an error, never a panic.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Files the objects name are looked up under a directory that does not exist.
    let files = [(PathBuf::from("/nonexistent/fuzz.yaml"), text.to_string())];
    if let Ok(config) = fleetgate_config_watcher::load_texts(Path::new("/nonexistent"), &files) {
        let _ = fleetgate_config_watcher::RouteTable::build(&config);
    }
});
