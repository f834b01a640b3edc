//! SPDY/3.1 as client-go and kubelet speak it for exec, attach and port-forward: the frame codec
//! (`frame`) and the server side of a connection (`session`).
//!
//! Used by `stream::exec` and `stream::portforward`; it knows nothing about what the streams carry.

pub(crate) mod frame;
pub(crate) mod session;

pub use frame::SpdyError;
