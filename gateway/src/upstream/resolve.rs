//! Member host names to addresses, off the shard: a shard never calls a blocking `getaddrinfo`.
//!
//! An IP literal is used as it is. A name is looked up on a thread of its own (the system
//! resolver, so /etc/hosts and nsswitch apply) and the answer kept per shard for [`TTL`] (a
//! failure for [`NEGATIVE_TTL`]); concurrent requests for a name being looked up wait for that
//! one lookup. The caller's connect timeout bounds the wait. Called by `connect`.

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use tokio::sync::watch;

use crate::runtime::clock;

/// How long an answer is used (getaddrinfo gives no TTL; kube-apiserver names change rarely).
pub const TTL: Duration = Duration::from_secs(30);
/// How long a failed lookup is remembered before the name is tried again.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);

type Answer = Result<SocketAddr, String>;

enum Entry {
    Ready { answer: Answer, until: Instant },
    Pending(watch::Receiver<Option<Answer>>),
}

thread_local! {
    static CACHE: RefCell<AHashMap<(String, u16), Entry>> = RefCell::new(AHashMap::new());
}

/// The address to dial for `host`:`port`.
pub async fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    let literal = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let mut pending = CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let key = (host.to_string(), port);
        match cache.get(&key) {
            Some(Entry::Ready { answer, until }) if *until > clock::now() => Ok(answer.clone()),
            Some(Entry::Pending(rx)) => Err(rx.clone()),
            _ => {
                let rx = look_up(host.to_string(), port);
                cache.insert(key, Entry::Pending(rx.clone()));
                Err(rx)
            }
        }
    });
    let answer = match &mut pending {
        Ok(answer) => answer.clone(),
        Err(rx) => {
            let answer = match rx.wait_for(Option::is_some).await {
                Ok(answer) => answer.clone().unwrap_or_else(|| Err("no answer".into())),
                Err(_) => Err("the lookup thread stopped".into()),
            };
            let ttl = if answer.is_ok() { TTL } else { NEGATIVE_TTL };
            CACHE.with(|cache| {
                cache.borrow_mut().insert(
                    (host.to_string(), port),
                    Entry::Ready {
                        answer: answer.clone(),
                        until: clock::now() + ttl,
                    },
                )
            });
            answer
        }
    };
    answer.map_err(|reason| io::Error::other(format!("resolving {host}: {reason}")))
}

/// Starts a lookup of `host` on a thread of its own; its answer arrives on the returned channel.
fn look_up(host: String, port: u16) -> watch::Receiver<Option<Answer>> {
    let (tx, rx) = watch::channel(None);
    let spawned = std::thread::Builder::new()
        .name("fleetgate-resolve".into())
        .spawn(move || {
            let name = crate::runtime::faults::slow_lookup(&host).unwrap_or(&host);
            let answer = match (name, port).to_socket_addrs() {
                Ok(mut addrs) => addrs.next().ok_or_else(|| "no addresses".to_string()),
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(Some(answer));
        });
    if let Err(e) = spawned {
        let (tx, rx) = watch::channel(Some(Err(format!("no lookup thread: {e}"))));
        drop(tx);
        return rx;
    }
    rx
}
