//! The TCP proxy `chaos` puts between the gateway and each member (and between the watchers and
//! the gateway), so the driver can break the network by its own means: bytes pass as they came,
//! or stop passing (a blackhole: nothing is lost, nothing arrives, connections stay open), or each
//! piece arrives a fixed delay after it was read (a slow member); and every open connection can
//! be cut at once (reset). TLS passes through untouched: the gateway still verifies the member's
//! certificate (issued for 127.0.0.1, whatever the port).
//!
//! Listens on 127.0.0.1:0; the upstream may change (a restarted gateway listens elsewhere).
//! Started and switched by `chaos` only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// What the proxy does with the bytes of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// Nothing passes (held, not dropped) until the mode changes.
    Blackhole,
    /// Each piece passes this long after it was read.
    Slow(Duration),
}

/// One running proxy.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    cuts: watch::Sender<u64>,
    upstream: Arc<Mutex<SocketAddr>>,
    task: JoinHandle<()>,
}

/// Pieces read ahead of the writer, per direction of a connection.
const QUEUE: usize = 64;

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::Forward);
        let (cuts, cuts_rx) = watch::channel(0u64);
        let upstream = Arc::new(Mutex::new(upstream));
        let task = tokio::spawn(accept_loop(listener, upstream.clone(), mode_rx, cuts_rx));
        Ok(Proxy {
            addr,
            mode,
            cuts,
            upstream,
            task,
        })
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Resets every connection open now; new ones are accepted as before.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Where new connections go from now on (open ones stay where they are).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Open connections end with the cut signal's sender.
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Arc<Mutex<SocketAddr>>,
    mode: watch::Receiver<Mode>,
    cuts: watch::Receiver<u64>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let to = *upstream.lock().unwrap_or_else(|e| e.into_inner());
        let (mode, mut cuts) = (mode.clone(), cuts.clone());
        cuts.mark_unchanged();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(to).await else {
                // The upstream is not there: the client sees its connection reset.
                let _ = inbound.set_zero_linger();
                return;
            };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            relay(inbound, outbound, mode, cuts).await;
        });
    }
}

/// Passes bytes both ways until both sides closed, one failed, or a cut.
pub(crate) async fn relay(
    mut a: TcpStream,
    mut b: TcpStream,
    mode: watch::Receiver<Mode>,
    mut cuts: watch::Receiver<u64>,
) {
    let cut = {
        let (ar, aw) = a.split();
        let (br, bw) = b.split();
        let up = pipe(ar, bw, mode.clone());
        let down = pipe(br, aw, mode);
        tokio::pin!(up, down);
        let both = async {
            tokio::select! {
                r = &mut up => if r.is_ok() { let _ = (&mut down).await; },
                r = &mut down => if r.is_ok() { let _ = (&mut up).await; },
            }
        };
        tokio::select! {
            _ = both => false,
            changed = cuts.changed() => changed.is_ok(),
        }
    };
    if cut {
        let _ = (a.set_zero_linger(), b.set_zero_linger());
    }
}

/// One direction: a reader queues what it reads with the time it came, a writer passes each
/// piece on when the mode lets it. A clean end of the reader shuts the writer's side down once
/// the queue is written.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut mode: watch::Receiver<Mode>,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                return Ok::<_, std::io::Error>(());
            }
        }
    };
    let writer = async move {
        while let Some((read_at, data)) = rx.recv().await {
            hold(&mut mode, read_at).await;
            to.write_all(&data).await?;
        }
        to.shutdown().await
    };
    tokio::pin!(reader, writer);
    tokio::select! {
        r = &mut reader => { r?; writer.await }
        w = &mut writer => w,
    }
}

/// Waits until a piece read at `read_at` may pass.
async fn hold(mode: &mut watch::Receiver<Mode>, read_at: Instant) {
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Forward => return,
            Mode::Slow(delay) => {
                tokio::select! {
                    _ = tokio::time::sleep_until((read_at + delay).into()) => return,
                    changed = mode.changed() => if changed.is_err() { return },
                }
            }
            Mode::Blackhole => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on 127.0.0.1:0.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(conn: &mut TcpStream, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        conn.write_all(b"ping").await.ok()?;
        let mut got = [0u8; 4];
        tokio::time::timeout(within, conn.read_exact(&mut got))
            .await
            .ok()?
            .ok()?;
        assert_eq!(&got, b"ping");
        Some(started.elapsed())
    }

    #[tokio::test]
    async fn forwards_holds_delays_and_cuts() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(round_trip(&mut conn, Duration::from_secs(5))
            .await
            .is_some());

        // Blackholed: nothing comes back; once forwarding again, what was held arrives.
        proxy.set_mode(Mode::Blackhole);
        conn.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        let waited =
            tokio::time::timeout(Duration::from_millis(300), conn.read_exact(&mut got)).await;
        assert!(waited.is_err(), "nothing passes a blackhole");
        proxy.set_mode(Mode::Forward);
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"ping");

        // Slow: each way waits the delay.
        proxy.set_mode(Mode::Slow(Duration::from_millis(150)));
        let took = round_trip(&mut conn, Duration::from_secs(5)).await.unwrap();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        proxy.set_mode(Mode::Forward);

        // Cut: the open connection ends; a new one works.
        proxy.cut();
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "the cut connection ends");
        let mut again = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(round_trip(&mut again, Duration::from_secs(5))
            .await
            .is_some());

        // A new upstream takes new connections.
        proxy.set_upstream(echo().await);
        let mut third = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(round_trip(&mut third, Duration::from_secs(5))
            .await
            .is_some());
    }
}
