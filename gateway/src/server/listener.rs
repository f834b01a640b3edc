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
///
/// SO_REUSEPORT is for the gateway's own shards only: a port another process listens on is
/// refused with "address already in use", never shared (the kernel would split new connections
/// between two gateways with different certificates). For a given port, a probe socket without
/// SO_REUSEPORT is bound first, which fails if anyone listens there; after binding, the
/// listening sockets on that port are counted in /proc/net/tcp{,6}, which catches a second
/// process that bound in between (or shared a port the kernel picked for port 0).
pub fn bind_reuseport(address: &str, count: usize) -> io::Result<Vec<TcpListener>> {
    let first_address = address.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address} resolves to nothing"),
        )
    })?;
    if first_address.port() != 0 {
        probe(first_address)?;
        return bind_group(first_address, count);
    }
    // Port 0: with SO_REUSEPORT the kernel may pick a port another SO_REUSEPORT listener of the
    // same user already holds (another gateway, a test beside this one). The count after binding
    // tells, and then another port is picked. No probe socket, so no window after one.
    let mut last = None;
    for _ in 0..PORT_ZERO_ATTEMPTS {
        match bind_group(first_address, count) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            bound => return bound,
        }
    }
    Err(last.unwrap_or_else(|| in_use(first_address)))
}

/// How many ports the kernel may pick for a port-0 listener before binding gives up.
const PORT_ZERO_ATTEMPTS: usize = 16;

/// Binds `count` SO_REUSEPORT sockets on `address` (a port-0 address: the port the first one
/// got), refusing the port if more sockets listen on it than these.
fn bind_group(address: SocketAddr, count: usize) -> io::Result<Vec<TcpListener>> {
    let first = bind_shard_socket(address)?;
    let bound = first.local_addr()?;
    let mut sockets = Vec::with_capacity(count.max(1));
    sockets.push(first);
    while sockets.len() < count.max(1) {
        sockets.push(bind_shard_socket(bound)?);
    }
    let ours = sockets.len();
    if let Some(listening) = listening_on(bound) {
        if listening > ours {
            return Err(in_use(bound));
        }
    }
    Ok(sockets)
}

/// Binds `address` without SO_REUSEPORT and releases it: fails if anyone listens there.
fn probe(address: SocketAddr) -> io::Result<()> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&address.into()).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            in_use(address)
        } else {
            e
        }
    })?;
    Ok(())
}

fn in_use(address: SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("address already in use: another process listens on {address}"),
    )
}

/// Listening TCP sockets on this host that would take connections for `address` (its port, on
/// its IP or the wildcard, or anywhere when it is the wildcard), from /proc/net/tcp or tcp6;
/// `None` where that cannot be read.
fn listening_on(address: SocketAddr) -> Option<usize> {
    let (table, ours) = match address.ip() {
        std::net::IpAddr::V4(ip) => ("/proc/net/tcp", proc_hex(&ip.octets())),
        std::net::IpAddr::V6(ip) => ("/proc/net/tcp6", proc_hex(&ip.octets())),
    };
    let wildcard = |hex: &str| hex.bytes().all(|b| b == b'0');
    let text = std::fs::read_to_string(table).ok()?;
    let count = text
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1).unwrap_or("");
            let state = fields.nth(1).unwrap_or("");
            let Some((ip, port)) = local.rsplit_once(':') else {
                return false;
            };
            state == "0A"
                && u16::from_str_radix(port, 16).ok() == Some(address.port())
                && (ip == ours || wildcard(ip) || wildcard(&ours))
        })
        .count();
    Some(count)
}

/// An address as /proc/net/tcp{,6} print it: each 32-bit word in host byte order, as hex.
fn proc_hex(octets: &[u8]) -> String {
    octets
        .chunks(4)
        .map(|word| {
            let word = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
            format!("{word:08X}")
        })
        .collect()
}

/// Binds one more SO_REUSEPORT socket on `address` (a shard restarting binds its own again).
pub fn bind_shard_socket(address: SocketAddr) -> io::Result<TcpListener> {
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

    /// These tests bind port-0 SO_REUSEPORT groups and count the listeners on a port: run side by
    /// side in one process, the kernel may hand one test's port to another's bind for the moment
    /// between its bind and its count. The gateway itself then retries; a test's own count does
    /// not, so they take turns.
    #[allow(
        clippy::disallowed_types,
        reason = "a test-only lock, off the data path"
    )]
    static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        PORTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[test]
    fn a_port_another_process_listens_on_is_refused_not_shared() {
        let _turn = one_at_a_time();
        // Another program's plain listener, and another gateway's SO_REUSEPORT one.
        let plain = TcpListener::bind("127.0.0.1:0").unwrap();
        let error = bind_reuseport(&plain.local_addr().unwrap().to_string(), 2).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);
        assert!(
            error.to_string().contains("address already in use"),
            "{error}"
        );
        let other_gateway = bind_reuseport("127.0.0.1:0", 1).unwrap();
        let taken = other_gateway[0].local_addr().unwrap().to_string();
        let error = bind_reuseport(&taken, 2).unwrap_err();
        assert!(error.to_string().contains(&taken), "{error}");
    }

    #[test]
    fn port_zero_never_shares_a_port_with_another_reuseport_listener() {
        let _turn = one_at_a_time();
        // Other SO_REUSEPORT listeners of this user (another gateway, say): the kernel may pick
        // one of their ports for port 0; the bind must then move on, not share it.
        let others: Vec<_> = (0..64)
            .map(|_| bind_reuseport("127.0.0.1:0", 1).unwrap().remove(0))
            .collect();
        let taken: std::collections::HashSet<_> = others
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        for _ in 0..64 {
            let ours = bind_reuseport("127.0.0.1:0", 2).unwrap();
            let port = ours[0].local_addr().unwrap().port();
            assert!(
                !taken.contains(&port),
                "port {port} shared with another listener"
            );
            assert_eq!(listening_on(ours[0].local_addr().unwrap()), Some(2));
        }
    }

    #[test]
    fn proc_net_tcp_counts_this_process_listeners() {
        let _turn = one_at_a_time();
        let sockets = bind_reuseport("127.0.0.1:0", 3).unwrap();
        assert_eq!(listening_on(sockets[0].local_addr().unwrap()), Some(3));
    }

    #[test]
    fn port_zero_gives_every_shard_the_same_port() {
        let _turn = one_at_a_time();
        let sockets = bind_reuseport("127.0.0.1:0", 3).unwrap();
        let port = sockets[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        assert!(sockets
            .iter()
            .all(|s| s.local_addr().unwrap().port() == port));
    }
}
