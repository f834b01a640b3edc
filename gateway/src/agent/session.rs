//! The tunnel session: one tunnel's life, from the dial to its end. TCP and TLS to the gateway
//! (or one replica's address) with the agent's certificate, the hello naming the cluster and the
//! gateway's answer (`wire::HelloAnswer`), then h2 with roles reversed (the agent is the h2
//! server: the gateway opens a stream per member connection it wants), each stream served as a
//! task of its own (`super::serve_stream`), and the heartbeat (`wire::heartbeat`) beside it. Returns why
//! the tunnel ended; `super::KeptTunnel::keep` dials again. On the agent's tokio runtime.

use anyhow::{anyhow, bail, Context};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::info;

use super::{serve_stream, Event, KeptTunnel, Target};
use crate::tunnel::wire::{self, HelloAnswer};

impl KeptTunnel {
    /// One tunnel's life: dial, hello, h2 (as the server), streams carried, pings; returns why
    /// it ended.
    pub(super) async fn serve_once(&self) -> anyhow::Result<String> {
        let gateway = &self.gateway;
        let dial = async {
            let tcp = match self.target {
                Target::Name => TcpStream::connect((gateway.host.as_str(), gateway.port)).await?,
                Target::Address(address) => TcpStream::connect(address).await?,
            };
            tcp.set_nodelay(true)?;
            let mut tls = self.connector.connect(gateway.name.clone(), tcp).await?;
            tls.write_all(wire::hello(&self.cluster).as_bytes()).await?;
            tls.flush().await?;
            let answer = wire::read_line(&mut tls).await.map_err(|e| match e {
                wire::LineError::Ended(e) => e,
                e => std::io::Error::other(e),
            })?;
            Ok::<_, std::io::Error>((tls, answer))
        };
        let (tls, answer) = tokio::time::timeout(wire::HANDSHAKE_TIMEOUT, dial)
            .await
            .map_err(|_| anyhow!("no TLS handshake and hello answer within the timeout"))?
            .context("dialing the gateway")?;
        if let HelloAnswer::Refused(reason) = HelloAnswer::parse(&answer) {
            bail!("the gateway refused the tunnel: {reason}");
        }
        let mut connection = wire::agent_h2(tls).await.context("the h2 handshake")?;
        let mut pings = connection.ping_pong().context("h2 gave no ping handle")?;
        info!(gateway = %self.describe(), cluster = %self.cluster, "tunnel up");
        let _ = self.events.send(Event::Up(self.index, self.target));
        let heartbeat = wire::heartbeat::until_unanswered(&mut pings, tokio::time::sleep);
        tokio::pin!(heartbeat);
        loop {
            tokio::select! {
                stream = connection.accept() => match stream {
                    Some(Ok((request, respond))) => {
                        tokio::spawn(serve_stream(self.member.clone(), request, respond));
                    }
                    Some(Err(error)) => return Err(anyhow!(error).context("the tunnel failed")),
                    None => return Ok("the gateway closed the tunnel".into()),
                },
                reason = &mut heartbeat => return Ok(reason),
            }
        }
    }
}
