//! `small-get-h2`: the small GET over TLS + h2, `--connections` connections with `--streams`
//! concurrent streams each (h2load's `-c10 -m10`), on the h2 crate's client over tokio-rustls with
//! ALPN h2. Same figures as `small-get`: req/s, CPU us per request of the target, p50/p99.
//! Every loop is bounded by the deadline and `--max-requests`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;

use super::client::Target;
use super::procstat::ProcWatch;
use super::scenarios::{check_warm_up, measured, new_hist, request_figures};
use super::{RunArgs, TargetResult};

/// Counts of one phase, summed over every stream.
struct Phase {
    hist: Histogram<u64>,
    requests: u64,
    errors: u64,
}

/// One h2 connection: its request handle, the task driving the connection.
pub(super) struct H2Conn {
    pub(super) send: h2::client::SendRequest<Bytes>,
    pub(super) driver: tokio::task::JoinHandle<()>,
}

pub(super) async fn connect_h2(target: &Target) -> anyhow::Result<H2Conn> {
    if target.tls.is_none() {
        bail!(
            "{}: h2 needs an https:// target (it is negotiated by ALPN)",
            target.name
        );
    }
    let io = target.connect().await?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .handshake::<_, Bytes>(io)
        .await
        .with_context(|| {
            format!(
                "{}: h2 handshake (did the server pick h2 by ALPN?)",
                target.name
            )
        })?;
    let name = target.name.clone();
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(target = %name, %error, "h2 connection ended");
        }
    });
    Ok(H2Conn { send, driver })
}

pub(super) fn build_request(target: &Target, path: &str) -> anyhow::Result<http::Request<()>> {
    let mut builder = http::Request::get(target.url(path))
        .header("user-agent", "fleetgate-loadtest/0.1")
        .header("accept", "application/json");
    for (name, value) in &target.headers {
        builder = builder.header(name.to_ascii_lowercase(), value);
    }
    builder.body(()).map_err(|e| anyhow!("request: {e}"))
}

async fn one_request(
    send: &mut h2::client::SendRequest<Bytes>,
    request: &http::Request<()>,
) -> anyhow::Result<u64> {
    let mut send = send.clone().ready().await?;
    let mut req = http::Request::new(());
    *req.method_mut() = request.method().clone();
    *req.uri_mut() = request.uri().clone();
    *req.headers_mut() = request.headers().clone();
    let (response, _) = send.send_request(req, true)?;
    let response = response.await?;
    let status = response.status();
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if !status.is_success() {
        bail!("status {status}");
    }
    Ok(bytes)
}

async fn phase(
    conns: &[H2Conn],
    streams: usize,
    request: Arc<http::Request<()>>,
    deadline: Instant,
    budget: Arc<AtomicU64>,
) -> Phase {
    let mut tasks = Vec::new();
    for conn in conns {
        for _ in 0..streams.max(1) {
            let mut send = conn.send.clone();
            let (request, budget) = (request.clone(), budget.clone());
            tasks.push(tokio::spawn(async move {
                let mut hist = new_hist();
                let (mut requests, mut errors) = (0u64, 0u64);
                while Instant::now() < deadline && budget.fetch_sub(1, Ordering::Relaxed) > 0 {
                    let start = Instant::now();
                    match one_request(&mut send, &request).await {
                        Ok(_) => {
                            requests += 1;
                            let _ = hist.record(start.elapsed().as_micros().max(1) as u64);
                        }
                        Err(error) => {
                            errors += 1;
                            tracing::debug!(%error, "h2 request failed");
                            // A broken connection fails every later request at once: stop this
                            // stream instead of spinning.
                            if send.clone().ready().await.is_err() {
                                break;
                            }
                        }
                    }
                }
                (hist, requests, errors)
            }));
        }
    }
    let mut out = Phase {
        hist: new_hist(),
        requests: 0,
        errors: 0,
    };
    for t in tasks {
        match t.await {
            Ok((h, r, e)) => {
                let _ = out.hist.add(&h);
                out.requests += r;
                out.errors += e;
            }
            Err(_) => out.errors += 1,
        }
    }
    out
}

/// `small-get-h2`: see the module documentation.
pub async fn small_get_h2(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let request = Arc::new(build_request(target, &args.path)?);
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        conns.push(connect_h2(target).await?);
    }
    let warm = phase(
        &conns,
        args.streams,
        request.clone(),
        Instant::now() + args.warmup,
        Arc::new(AtomicU64::new(args.max_requests)),
    )
    .await;
    check_warm_up(target, "h2 request", (warm.requests, warm.errors))?;
    let (out, seconds, cpu) = measured(pw, |start| {
        phase(
            &conns,
            args.streams,
            request,
            start + args.duration,
            Arc::new(AtomicU64::new(args.max_requests)),
        )
    })
    .await?;
    for conn in conns {
        conn.driver.abort();
    }
    Ok(TargetResult {
        streams: Some(args.streams),
        ..request_figures(
            target,
            "small-get-h2",
            (out.requests, out.errors),
            seconds,
            cpu,
            &out.hist,
        )
    })
}
