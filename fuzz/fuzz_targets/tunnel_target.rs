//! What a tunnel stream names (the agent reads the path the gateway wrote) and the gateway's
//! direct service path (a client's bytes): whatever the bytes, `parse_stream_path`,
//! `ServiceRef::parse` and `route::service_path` never panic; a service any of them accepts has
//! DNS-label names and a port from 1 to 65535, and its stream URI parses back to the same service.
#![no_main]

use fleetgate::request::route::service_path;
use fleetgate::tunnel::wire::{
    is_dns_label, parse_stream_path, service_uri, ServiceRef, StreamTarget,
};
use libfuzzer_sys::fuzz_target;

fn check(service: &ServiceRef<'_>) {
    assert!(is_dns_label(service.namespace) && is_dns_label(service.name));
    assert!(service.port >= 1);
    let uri: http::Uri = service_uri(service).parse().expect("a service URI parses");
    assert_eq!(
        parse_stream_path(uri.path()),
        Ok(StreamTarget::Service(*service))
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(StreamTarget::Service(service)) = parse_stream_path(text) {
            check(&service);
        }
        if let Ok(service) = ServiceRef::parse(text) {
            check(&service);
            assert_eq!(service.to_string(), text);
        }
    }
    if let Some(Ok(path)) = service_path(data) {
        check(&path.service);
        assert!(path.path.is_empty() || path.path.starts_with(b"/"));
    }
});
