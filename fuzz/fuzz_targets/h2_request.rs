//! The h2 request path: a client's bytes (after the preface) through the control-frame guard and
//! the h2 server with the gateway's settings, and every request it accepts decided as the
//! front-end decides it (route, request info, authentication, policy).
#![no_main]

use std::rc::Rc;

use fleetgate::auth::{ClientIdentity, ConnectionAuth};
use fleetgate::protocol::h2::guard::{Flood, FrameGuard};
use fleetgate::request;
use fleetgate_fuzz::{run, split, table, Wire};
use libfuzzer_sys::fuzz_target;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fuzz_target!(|data: &[u8]| {
    let (chunk, frames) = split(data);
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(frames);
    let table = table();
    let gateway = table.gateway();
    let builder = fleetgate::protocol::h2::server_builder(&gateway.limits, &gateway.http2);
    let flood = Rc::new(Flood::default());
    let io = FrameGuard::new(
        Wire::new(&input, usize::from(chunk) * 7 + 1),
        flood,
        Rc::new(|| 400),
    );
    let anonymous = ClientIdentity::anonymous();
    let conn = ConnectionAuth::new(&anonymous);
    let _ = run(
        async {
            let Ok(mut connection) = builder.handshake::<_, bytes::Bytes>(io).await else {
                return;
            };
            for _ in 0..64 {
                let Some(Ok((request, _respond))) = connection.accept().await else {
                    return;
                };
                let (parts, _body) = request.into_parts();
                let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                let headers = || {
                    parts
                        .headers
                        .iter()
                        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
                };
                let _ = request::decide(
                    table,
                    &conn,
                    parts.method.as_str().as_bytes(),
                    target.as_bytes(),
                    headers,
                );
            }
        },
        4096,
    );
});
