//! The one response-body type of the simulated fleet: boxed, so fixed bodies, streamed watch
//! events and `logs -f` lines all fit the same `Response<SimBody>`.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// Response body of every simulated-member handler.
pub type SimBody = BoxBody<Bytes, std::io::Error>;

/// A body that is sent whole.
pub fn full(bytes: impl Into<Bytes>) -> SimBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// An empty body.
pub fn empty() -> SimBody {
    full(Bytes::new())
}
