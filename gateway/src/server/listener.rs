//! Listening sockets: one SO_REUSEPORT socket per listener per shard, so the kernel spreads
//! connections over the shards and a connection lives and dies on one of them.
//!
//! Binding happens on the main thread before the shards start (so `serve` can print the bound
//! addresses in its `ready` line); a listener with port 0 gets its port from the first bind and
//! the other shards bind that port. The shards turn each socket into a monoio listener. Never
//! accepts or reads.

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

use socket2::{Domain, Socket, Type};

/// Binds `count` SO_REUSEPORT sockets on `address` (all on the same port, even when `address`
/// asks for port 0).
pub fn bind_reuseport(address: &str, count: usize) -> io::Result<Vec<TcpListener>> {
    let first_address = address.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address} resolves to nothing"),
        )
    })?;
    let first = bind_one(first_address)?;
    let bound = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..count.max(1) {
        sockets.push(bind_one(bound)?);
    }
    Ok(sockets)
}

fn bind_one(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_gives_every_shard_the_same_port() {
        let sockets = bind_reuseport("127.0.0.1:0", 3).unwrap();
        let port = sockets[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        assert!(sockets
            .iter()
            .all(|s| s.local_addr().unwrap().port() == port));
    }
}
