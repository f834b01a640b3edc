//! kube's request-info parser at any depth, and the policy check on what it returns: nothing
//! panics, and what it calls a classified resource request names segments of the path.
#![no_main]

use fleetgate_config_watcher::policy::is_basic;
use fleetgate_config_watcher::request_info::RequestInfo;
use fleetgate_fuzz::split;
use libfuzzer_sys::fuzz_target;

const METHODS: [&[u8]; 8] = [
    b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS", b"LIST",
];

fuzz_target!(|data: &[u8]| {
    let (selector, rest) = split(data);
    let method = METHODS[usize::from(selector & 7)];
    let (path, query) = match rest.iter().position(|b| *b == b'?') {
        Some(q) => rest.split_at(q),
        None => (rest, &b""[..]),
    };
    let info = RequestInfo::parse(method, path, query);
    let _ = info.policy_verb();
    let _ = info.metrics_verb();
    let _ = is_basic(&info);
    if info.is_resource_request && info.classified {
        // The name too, from the path or from a field selector in the query (where it is given
        // only when it needed no unescaping).
        for field in [
            info.namespace,
            info.resource,
            info.subresource,
            info.api_group,
            info.name,
        ] {
            assert!(!field.contains('/'), "a field spans segments: {field:?}");
            assert!(
                !field.contains('%'),
                "an encoded field was classified: {field:?}"
            );
        }
        // As in kube, an empty segment (`/api/v1//pods`) is an empty resource; the gateway's path
        // rule refuses such paths before they are classified.
        assert!(
            !info.resource.is_empty() || path.windows(2).any(|w| w == b"//"),
            "a resource request without a resource"
        );
    }
});
