//! `exec-stream`: `--streams` concurrent exec sessions over WebSocket (`v5.channel.k8s.io`, with
//! `v4.channel.k8s.io` offered as a fallback) running a `cat`-like command (`--path`, by default
//! the simulated fleet's `cat` in pod default/hello), each pushing `--chunk-bytes` stdin messages
//! as fast as the target takes them while reading the echo back on stdout. Figures: MB/s echoed
//! (each echoed byte crossed the target twice, once each way) and the target's CPU ms per MB
//! echoed. Bounded by `--warmup` + `--duration`.
//!
//! `portforward-stream` is the same over a port-forward WebSocket (`v4.channel.k8s.io`, one port;
//! default `--path`: port 8080 of pod default/hello, which the simulated fleet echoes): data goes
//! out and comes back on the port's data channel, after the port greeting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{handshake::client::generate_key, Message};

use super::client::Target;
use super::procstat::ProcWatch;
use super::scenarios::{cpu_now, cpu_since};
use super::{RunArgs, TargetResult};

/// The exec a scenario uses when `--path` is left at its default.
pub const DEFAULT_EXEC_PATH: &str =
    "/api/v1/namespaces/default/pods/hello/exec?command=cat&stdin=true&stdout=true";

/// The port-forward a scenario uses when `--path` is left at its default.
pub const DEFAULT_PORTFORWARD_PATH: &str =
    "/api/v1/namespaces/default/pods/hello/portforward?ports=8080";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
/// The data channel of the first (only) forwarded port.
const PORT_DATA: u8 = 0;

/// Which stream the scenario pushes bytes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// exec of `cat`: stdin out, stdout back.
    Exec,
    /// port-forward to an echoing port: the port's data channel both ways.
    PortForward,
}

impl StreamKind {
    fn default_path(self) -> &'static str {
        match self {
            StreamKind::Exec => DEFAULT_EXEC_PATH,
            StreamKind::PortForward => DEFAULT_PORTFORWARD_PATH,
        }
    }
    fn protocols(self) -> &'static str {
        match self {
            StreamKind::Exec => "v5.channel.k8s.io, v4.channel.k8s.io",
            StreamKind::PortForward => "v4.channel.k8s.io",
        }
    }
    fn out_channel(self) -> u8 {
        match self {
            StreamKind::Exec => STDIN,
            StreamKind::PortForward => PORT_DATA,
        }
    }
    fn back_channel(self) -> u8 {
        match self {
            StreamKind::Exec => STDOUT,
            StreamKind::PortForward => PORT_DATA,
        }
    }
    fn scenario(self) -> &'static str {
        match self {
            StreamKind::Exec => "exec-stream",
            StreamKind::PortForward => "portforward-stream",
        }
    }
}

/// Opens one exec session and returns the WebSocket.
pub(super) async fn open_session(
    target: &Target,
    path: &str,
    kind: StreamKind,
) -> anyhow::Result<tokio_tungstenite::WebSocketStream<Box<dyn super::client::Io>>> {
    let io = target.connect().await?;
    let url = target.url(path);
    let url = url
        .strip_prefix("https")
        .map(|rest| format!("wss{rest}"))
        .or_else(|| url.strip_prefix("http").map(|rest| format!("ws{rest}")))
        .unwrap_or(url);
    let mut builder = http::Request::get(url)
        .header("host", &target.authority)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", generate_key())
        .header("sec-websocket-protocol", kind.protocols())
        .header("user-agent", "fleetgate-loadtest/0.1");
    for (name, value) in &target.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder.body(())?;
    let (ws, _response) = tokio_tungstenite::client_async(request, io)
        .await
        .with_context(|| format!("{}: WebSocket exec handshake", target.name))?;
    Ok(ws)
}

/// `exec-stream` and `portforward-stream`: see the module documentation.
pub async fn byte_stream(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
    kind: StreamKind,
) -> anyhow::Result<TargetResult> {
    let path = if args.path == "/version" {
        kind.default_path()
    } else {
        args.path.as_str()
    };
    let sessions = args.streams.max(1);
    let mut opened = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        opened.push(open_session(target, path, kind).await?);
    }
    let echoed = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + args.warmup + args.duration;
    let mut chunk = vec![b'x'; args.chunk_bytes.max(1) + 1];
    chunk[0] = kind.out_channel();
    let chunk = Bytes::from(chunk);
    let mut tasks = Vec::new();
    for ws in opened {
        let (mut tx, mut rx) = ws.split();
        let (chunk, sent, echoed) = (chunk.clone(), sent.clone(), echoed.clone());
        let writer = tokio::spawn(async move {
            while Instant::now() < deadline {
                match tokio::time::timeout_at(
                    deadline.into(),
                    tx.send(Message::Binary(chunk.clone())),
                )
                .await
                {
                    Ok(Ok(())) => {
                        sent.fetch_add(chunk.len() as u64 - 1, Ordering::Relaxed);
                    }
                    Ok(Err(error)) => return Err(anyhow::anyhow!("stdin: {error}")),
                    Err(_) => break,
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), tx.close()).await;
            Ok(())
        });
        let back = kind.back_channel();
        let reader = tokio::spawn(async move {
            // A port-forward announces its port first on each channel (channel byte + 2 bytes).
            let mut greeted = kind == StreamKind::Exec;
            loop {
                match tokio::time::timeout_at(deadline.into(), rx.next()).await {
                    Ok(Some(Ok(Message::Binary(data)))) => {
                        if data.first() == Some(&back) {
                            if greeted {
                                echoed.fetch_add(data.len() as u64 - 1, Ordering::Relaxed);
                            } else {
                                greeted = true;
                            }
                        }
                    }
                    Ok(Some(Ok(Message::Close(frame)))) => {
                        return Err(anyhow::anyhow!("the session closed early: {frame:?}"))
                    }
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(error))) => return Err(anyhow::anyhow!("stdout: {error}")),
                    Ok(None) => return Err(anyhow::anyhow!("the session ended early")),
                    Err(_) => return Ok(()),
                }
            }
        });
        tasks.push((writer, reader));
    }
    tokio::time::sleep_until((start + args.warmup).into()).await;
    let cpu0 = cpu_now(pw)?;
    let bytes0 = echoed.load(Ordering::Relaxed);
    let measured = Instant::now();
    tokio::time::sleep_until(deadline.into()).await;
    let cpu = cpu_since(pw, cpu0)?;
    let seconds = measured.elapsed().as_secs_f64();
    let bytes = echoed.load(Ordering::Relaxed) - bytes0;
    let mut errors = 0u64;
    let mut first_error = None;
    for (writer, reader) in tasks {
        for outcome in [writer.await, reader.await] {
            if let Ok(Err(error)) | Err(error) = outcome.map_err(anyhow::Error::from) {
                errors += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    if bytes == 0 {
        bail!(
            "{}: nothing echoed through the {} sessions ({})",
            target.name,
            kind.scenario(),
            first_error.map(|e| e.to_string()).unwrap_or_default()
        );
    }
    let mb = bytes as f64 / 1e6;
    Ok(TargetResult {
        target: target.name.clone(),
        scenario: kind.scenario().into(),
        requests: sessions as u64,
        errors,
        seconds,
        bytes,
        mb_per_sec: Some(mb / seconds),
        cpu_ms_per_mb: cpu.map(|c| c * 1e3 / mb),
        streams: Some(sessions),
        ..Default::default()
    })
}
