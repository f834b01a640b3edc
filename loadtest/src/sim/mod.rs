//! The simulated fleet: N member clusters, each a kube-apiserver-compatible HTTPS server on its own
//! 127.0.0.1 port.

pub mod body;
pub mod stream;
