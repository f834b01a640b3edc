//! The h2 connection `chaos`' h2 watchers share: TLS offering h2 by ALPN to the gateway (through
//! the front proxy), every LIST and WATCH of every h2 watcher a stream of it, as client-go
//! multiplexes one transport's requests. When it ends (the gateway killed, restarted, or
//! draining with a GOAWAY) the next request opens another. Made by `chaos`, used by `watcher`.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::run::client::Target;
use crate::run::h2load::{build_request, connect_h2};

/// One live connection: its number, its request handle, the task driving it.
struct Live {
    number: u64,
    send: h2::client::SendRequest<Bytes>,
    driver: JoinHandle<()>,
}

/// The shared connection, opened on demand.
pub(crate) struct H2Shared {
    /// Where it connects (any h2 watcher's target: they differ only by path prefix).
    target: Target,
    live: tokio::sync::Mutex<Option<Live>>,
    /// Connections opened so far.
    pub(super) opened: AtomicU64,
}

impl H2Shared {
    pub(crate) fn new(target: &Target) -> H2Shared {
        H2Shared {
            target: target.offering_h2(),
            live: tokio::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    /// The live connection's handle, opening one when there is none or it ended.
    async fn sender(&self) -> anyhow::Result<(u64, h2::client::SendRequest<Bytes>)> {
        let mut live = self.live.lock().await;
        if let Some(l) = live.as_ref().filter(|l| !l.driver.is_finished()) {
            return Ok((l.number, l.send.clone()));
        }
        let conn = connect_h2(&self.target).await?;
        let number = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        // The one replaced (if any) has ended: its driver finished.
        *live = Some(Live {
            number,
            send: conn.send.clone(),
            driver: conn.driver,
        });
        Ok((number, conn.send))
    }

    /// Stops opening streams on connection `number` if it is still the live one (a request on
    /// it failed as a whole connection fails: GOAWAY, I/O, closed). Its driver runs on: after a
    /// GOAWAY the streams already open finish on it (a draining gateway ends each watch with its
    /// last bookmark), as client-go's transport lets them; it ends when the connection closes.
    async fn forget(&self, number: u64) {
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| l.number == number) {
            live.take();
        }
    }

    /// GETs `path` of `target` (its prefix and headers) on a stream of the shared connection:
    /// the status and the body to read. A request the connection as a whole refused (it had
    /// ended, or a draining gateway sent GOAWAY) is sent once more on a new one.
    pub(super) async fn get(
        &self,
        target: &Target,
        path: &str,
    ) -> anyhow::Result<(u16, h2::RecvStream)> {
        let mut again = true;
        loop {
            let (number, send) = self.sender().await?;
            let sent = async {
                let request = build_request(target, path)?;
                let mut send = send.ready().await?;
                let (response, _) = send.send_request(request, true)?;
                let response = response.await?;
                anyhow::Ok((response.status().as_u16(), response.into_body()))
            }
            .await;
            let Err(error) = &sent else {
                return sent;
            };
            // A stream of its own refused or reset leaves the connection to the others.
            let stream_only = error
                .downcast_ref::<h2::Error>()
                .is_some_and(|e| e.is_reset() && !e.is_go_away() && !e.is_io());
            if stream_only || !again {
                return sent;
            }
            self.forget(number).await;
            again = false;
        }
    }
}

impl Drop for H2Shared {
    fn drop(&mut self) {
        if let Some(l) = self.live.get_mut().take() {
            l.driver.abort();
        }
    }
}
