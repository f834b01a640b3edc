//! Wire codecs that know nothing of clusters, routes or identity: a leaf any station may use.
//! `http1` reads and writes HTTP/1.1 heads and body framing, for clients' requests and members'
//! responses alike.

pub mod http1;
