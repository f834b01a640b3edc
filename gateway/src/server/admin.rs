//! The admin listener: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`, `/livez` over plain
//! HTTP/1.1, one request per connection.
//!
//! It runs on a thread of its own, off the shards, so a slow scraper never delays the data path,
//! with one task per connection, so idle or slow admin connections never delay a probe. It never
//! proxies anything. `/readyz` also fails while a shard is down (`supervise`). Called by `serve`.
//!
//! With a live configuration source, `/metrics` also carries the reload counters and
//! `/readyz?verbose` shows the serving table's generation and the last rejected change (the
//! gateway stays ready: the last good table keeps serving), and a line per member whose circuit
//! breaker is open (the gateway stays ready: it serves the other members), and, with
//! `spec.cache`, the bytes the cache holds and each resource dropped from it, and why (the
//! gateway stays ready: the member serves those LISTs). A source that cannot
//! watch what it must (a CRD the management cluster does not serve) is a failing check:
//! `/readyz` answers 500 and `?verbose` gives the reason, until the watch works.

use std::io;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use fleetgate_config_watcher::{ReloadStatus, SharedTable};

use crate::observe::metrics::Metrics;

/// What the admin listener reports about the configuration: the serving table and, when a source
/// reloads it, that source's status.
#[derive(Clone)]
pub struct ConfigView {
    pub table: SharedTable,
    pub reload: Option<Arc<ReloadStatus>>,
    /// Once the drain begins `/readyz` fails, so a load balancer stops sending new clients.
    pub shutdown: Arc<crate::runtime::shutdown::Shutdown>,
}

/// How long a connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin connections open at once; beyond it the oldest waiting ones are not read (a new one
/// is accepted only when one closes). Far above what probes and scrapers need.
const MAX_CONNECTIONS: usize = 4096;
const MAX_HEAD: usize = 16 * 1024;

/// Serves the admin endpoints on `listener` from a thread of its own, off the shards. Each
/// connection is a task of an epoll runtime, so a thousand idle connections cost a thousand
/// small tasks and never delay a probe: every one waits for its head on its own, for at most
/// [`HEAD_TIMEOUT`].
pub fn spawn_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    config: Option<ConfigView>,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fleetgate-admin".into())
        .spawn(move || {
            let mut runtime = match monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    return;
                }
            };
            let _ = started_tx.send(Ok(()));
            runtime.block_on(async move {
                let listener = match monoio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(error) => {
                        tracing::error!(%error, "the admin listener could not start");
                        return;
                    }
                };
                let open = std::rc::Rc::new(std::cell::Cell::new(0usize));
                let config = std::rc::Rc::new(config);
                loop {
                    while open.get() >= MAX_CONNECTIONS {
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                    let stream = match listener.accept().await {
                        Ok((stream, _)) => stream,
                        Err(error) => {
                            debug!(%error, "admin accept failed");
                            monoio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let (metrics, config, open) = (metrics.clone(), config.clone(), open.clone());
                    open.set(open.get() + 1);
                    monoio::spawn(async move {
                        if let Err(error) = answer(stream, &metrics, config.as_ref().as_ref()).await
                        {
                            debug!(%error, "admin request failed");
                        }
                        open.set(open.get() - 1);
                    });
                }
            })
        })?;
    started_rx
        .recv()
        .map_err(|_| io::Error::other("the admin thread stopped before it started"))?
}

async fn answer(
    mut stream: monoio::net::TcpStream,
    metrics: &Metrics,
    config: Option<&ConfigView>,
) -> io::Result<()> {
    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk: Vec<u8> = Vec::with_capacity(1024);
    let read_head = async {
        while crate::codec::http1::find_head_end(&buf, 0).is_none() {
            if buf.len() > MAX_HEAD {
                return Ok(false);
            }
            chunk.clear();
            let (result, back) = stream.read(std::mem::take(&mut chunk)).await;
            chunk = back;
            let n = result?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        io::Result::Ok(true)
    };
    match monoio::time::timeout(HEAD_TIMEOUT, read_head).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => return Ok(()),
        Ok(Err(error)) => return Err(error),
    }
    let reply = reply_to(&buf, metrics, config);
    let (result, _) = stream.write_all(reply).await;
    result.map(drop)
}

/// The whole response (head and body) to the request whose head is in `buf`.
fn reply_to(buf: &[u8], metrics: &Metrics, config: Option<&ConfigView>) -> Vec<u8> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let path = match request.parse(buf) {
        Ok(_) => request.path.unwrap_or("/"),
        Err(_) => "",
    };
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let verbose = query
        .split('&')
        .any(|p| p == "verbose" || p.starts_with("verbose="));
    let (status, content_type, body) = match path {
        "/metrics" => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics_text(metrics, config),
        ),
        "/readyz" => {
            // A failing check (a configuration source that cannot watch what it must, a shard
            // down) makes the gateway not ready, as kube-apiserver's /readyz does: 500 and the
            // reasons.
            let (ready, text) = readyz_verbose(metrics, config);
            let status = if ready {
                "200 OK"
            } else {
                "500 Internal Server Error"
            };
            let body = match (verbose, ready) {
                (true, _) => text,
                (false, true) => "ok".into(),
                (false, false) => "readyz check failed\n".into(),
            };
            (status, "text/plain; charset=utf-8", body)
        }
        "/healthz" | "/livez" => ("200 OK", "text/plain; charset=utf-8", "ok".into()),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "404 page not found\n".into(),
        ),
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body.as_bytes());
    reply
}

/// The data path's metrics, then the reload and tunnel metrics, then the one `# EOF`.
fn metrics_text(metrics: &Metrics, config: Option<&ConfigView>) -> String {
    let text = metrics.encode();
    let Some(view) = config else {
        return text;
    };
    let table = view.table.load();
    let body = text.strip_suffix("# EOF\n").unwrap_or(&text);
    let reload = view
        .reload
        .as_ref()
        .map(|r| r.openmetrics_lines(table.generation()))
        .unwrap_or_default();
    let tunnels = crate::tunnel::registry().openmetrics_lines(&table);
    format!("{body}{reload}{tunnels}# EOF\n")
}

/// Kubernetes-style verbose readiness: one `[+]` (passing) or `[-]` (failing, with the reason)
/// line per check, then the verdict; and whether every check passed.
fn readyz_verbose(metrics: &Metrics, config: Option<&ConfigView>) -> (bool, String) {
    let mut out = String::from("[+]ping ok\n");
    let mut ready = true;
    let down = metrics.supervision.down();
    if down.is_empty() {
        out.push_str("[+]shards ok\n");
    } else {
        ready = false;
        for shard in down {
            out.push_str(&format!(
                "[-]shards failed: shard {shard} is down (its thread died; restarting)\n"
            ));
        }
    }
    if let Some(view) = config {
        if view.shutdown.is_draining() {
            ready = false;
            out.push_str(
                "[-]shutdown failed: draining (a stop signal arrived): in-flight requests finish, \
                 new connections are refused\n",
            );
        }
        let table = view.table.load();
        out.push_str(&format!(
            "[+]routing-table ok: generation {}, {} clusters\n",
            table.generation(),
            table.clusters().count()
        ));
        // A pull-mode cluster without an agent is served by none (its requests answer 503), but
        // the gateway serves the others: listed, not failing.
        let tunnels = crate::tunnel::registry().tunnel_clusters(&table);
        if !tunnels.is_empty() {
            let without: Vec<&str> = tunnels
                .iter()
                .filter(|(_, agents)| *agents == 0)
                .map(|(name, _)| &**name)
                .collect();
            if without.is_empty() {
                out.push_str(&format!(
                    "[+]tunnels ok: {} pull-mode clusters, each with an agent\n",
                    tunnels.len()
                ));
            } else {
                out.push_str(&format!(
                    "[+]tunnels: {} of {} pull-mode clusters without an agent: {}\n",
                    without.len(),
                    tunnels.len(),
                    without.join(", ")
                ));
            }
        }
        // A member whose circuit breaker is open answers 503 at once, but the gateway serves
        // the others: listed, not failing.
        let open = crate::upstream::breaker::breakers().open();
        if open.is_empty() {
            out.push_str("[+]circuit-breakers ok: none open\n");
        }
        for (cluster, state, why) in open {
            let state = match state {
                crate::upstream::breaker::CircuitState::HalfOpen => {
                    "half-open (a probe connect in flight)"
                }
                _ => "open",
            };
            out.push_str(&format!(
                "[+]circuit-breaker {cluster}: {state}: {}\n",
                why.replace('\n', " ")
            ));
        }
        // A resource dropped from the cache is served by its member: listed, not failing.
        if let Some(cache) = &table.gateway().cache {
            let ledger = crate::watch::hub::memory::ledger();
            let dropped = ledger.dropped();
            if dropped.is_empty() {
                out.push_str(&format!(
                    "[+]cache ok: {} bytes held of a memoryBudget of {}, none dropped\n",
                    ledger.bytes(),
                    cache.memory_budget
                ));
            }
            for dropped in dropped {
                out.push_str(&format!("[+]cache: {}\n", dropped.describe()));
            }
        }
        match view.reload.as_ref().and_then(|r| r.last_error()) {
            Some(failure) => out.push_str(&format!(
                "[+]config-reload: rejected (generation {} serves every valid object, and the last good version of a rejected one): {}\n",
                table.generation(),
                failure.message.replace('\n', " ")
            )),
            None if view.reload.is_some() => out.push_str("[+]config-reload ok\n"),
            None => {}
        }
        for (check, reason) in view
            .reload
            .as_ref()
            .map(|r| r.source_problems())
            .unwrap_or_default()
        {
            ready = false;
            out.push_str(&format!(
                "[-]{check} failed: {}\n",
                reason.replace('\n', " ")
            ));
        }
    }
    if ready {
        out.push_str("readyz check passed\n");
    } else {
        out.push_str("readyz check failed\n");
    }
    (ready, out)
}
