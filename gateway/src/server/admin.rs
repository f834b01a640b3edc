//! The admin listener: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`, `/livez` over plain
//! HTTP/1.1, one request per connection.
//!
//! It runs on its own blocking thread, off the shards, so a slow scraper never delays the data
//! path. It never proxies anything. Called by `serve`.
//!
//! With a live configuration source, `/metrics` also carries the reload counters and
//! `/readyz?verbose` shows the serving table's generation and the last rejected change (the
//! gateway stays ready: the last good table keeps serving). A source that cannot watch what it
//! must (a CRD the management cluster does not serve) is a failing check: `/readyz` answers 500
//! and `?verbose` gives the reason, until the watch works.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
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
    pub shutdown: Arc<crate::server::shutdown::Shutdown>,
}

/// Serves the admin endpoints on `listener` from a new thread.
pub fn spawn_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    config: Option<ConfigView>,
) -> io::Result<()> {
    listener.set_nonblocking(false)?;
    std::thread::Builder::new()
        .name("fleetgate-admin".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(error) = answer(stream, &metrics, config.as_ref()) {
                            debug!(%error, "admin request failed");
                        }
                    }
                    Err(error) => debug!(%error, "admin accept failed"),
                }
            }
        })?;
    Ok(())
}

fn answer(mut stream: TcpStream, metrics: &Metrics, config: Option<&ConfigView>) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while crate::protocol::http1::find_head_end(&buf, 0).is_none() {
        let n = stream.read(&mut chunk)?;
        if n == 0 || buf.len() > 16 * 1024 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let path = match request.parse(&buf) {
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
            // A failing check (a configuration source that cannot watch what it must) makes
            // the gateway not ready, as kube-apiserver's /readyz does: 500 and the reasons.
            let (ready, text) = readyz_verbose(config);
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
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// The data path's metrics, then the reload metrics, then the one `# EOF`.
fn metrics_text(metrics: &Metrics, config: Option<&ConfigView>) -> String {
    let text = metrics.encode();
    let Some(ConfigView {
        table,
        reload: Some(reload),
        ..
    }) = config
    else {
        return text;
    };
    let body = text.strip_suffix("# EOF\n").unwrap_or(&text);
    format!(
        "{body}{}# EOF\n",
        reload.openmetrics_lines(table.load().generation())
    )
}

/// Kubernetes-style verbose readiness: one `[+]` (passing) or `[-]` (failing, with the reason)
/// line per check, then the verdict; and whether every check passed.
fn readyz_verbose(config: Option<&ConfigView>) -> (bool, String) {
    let mut out = String::from("[+]ping ok\n");
    let mut ready = true;
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
        match view.reload.as_ref().and_then(|r| r.last_error()) {
            Some(failure) => out.push_str(&format!(
                "[+]config-reload: last change rejected, generation {} keeps serving: {}\n",
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
