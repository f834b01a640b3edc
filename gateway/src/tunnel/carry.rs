//! The agent's half of a stream: bytes between one h2 stream of the tunnel and one connection to
//! the member (or an allowed service), both ways at once, until both directions are done or
//! either fails (then the stream is reset and the member connection closed).
//!
//! No copy between user-space buffers: what the member sends is read into a buffer whose filled
//! part is handed to h2 as it is (`Bytes`, sent as DATA without a copy), and what the gateway sends
//! arrives as h2's own `Bytes`, written to the member from there. Reads are up to
//! [`READ_CHUNK`], so a big LIST travels in full-size DATA frames. An idle plain connection (a
//! watch between events) holds no read buffer: the buffer is given up before waiting for the
//! socket to become readable. Flow control follows the writer: received bytes are released to
//! the gateway's window only once the member took them. Half-closes pass through (the gateway's
//! END_STREAM shuts the member connection's write side; the member's EOF sends END_STREAM).
//! tokio only (the agent).

use std::future::poll_fn;
use std::io;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::stream::broken;

/// The most one read from the member takes (one DATA frame, [`super::wire::MAX_FRAME`]).
pub const READ_CHUNK: usize = super::wire::MAX_FRAME as usize;

/// A connection the agent carries a stream to.
pub enum MemberConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Carries `send` / `recv` to and from `member` until both directions end (`Ok`) or one fails.
pub async fn carry(
    member: MemberConn,
    mut send: SendStream<Bytes>,
    mut recv: RecvStream,
) -> io::Result<()> {
    match member {
        MemberConn::Plain(tcp) => {
            let (mut read, mut write) = tcp.into_split();
            tokio::try_join!(
                from_plain(&mut read, &mut send),
                to_member(&mut recv, &mut write)
            )?;
        }
        MemberConn::Tls(tls) => {
            let (mut read, mut write) = tokio::io::split(*tls);
            tokio::try_join!(
                from_member(&mut read, &mut send),
                to_member(&mut recv, &mut write)
            )?;
        }
    }
    Ok(())
}

/// A buffer with room for a read: the one given, while it has a quarter chunk left, else a new
/// one (the filled parts split off earlier keep the old allocation alive until h2 sent them).
fn with_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        *buf = BytesMut::with_capacity(READ_CHUNK);
    }
}

/// The gateway's bytes to the member, each of h2's buffers written as it came; the window is
/// released once the member took it. END_STREAM shuts the member's write side.
async fn to_member<W: AsyncWrite + Unpin>(recv: &mut RecvStream, member: &mut W) -> io::Result<()> {
    while let Some(data) = poll_fn(|cx| recv.poll_data(cx)).await {
        let data = data.map_err(broken)?;
        member.write_all(&data).await?;
        let _ = recv.flow_control().release_capacity(data.len());
    }
    member.shutdown().await
}

/// Sends `data` on `send` as window allows, without copying it; `end` with the last of it.
async fn send_all(send: &mut SendStream<Bytes>, mut data: Bytes) -> io::Result<()> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        // What `poll_capacity` returns may be 0 (a window that shrank): only `capacity` counts.
        let granted = loop {
            match send.capacity() {
                0 => match poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(broken(e)),
                    None => return Err(io::ErrorKind::BrokenPipe.into()),
                },
                granted => break granted,
            }
        };
        let chunk = data.split_to(granted.min(data.len()));
        send.send_data(chunk, false).map_err(broken)?;
    }
    Ok(())
}

/// Ends the stream (the member's EOF).
fn finish(send: &mut SendStream<Bytes>) -> io::Result<()> {
    send.send_data(Bytes::new(), true).map_err(broken)
}

/// A plain member connection's bytes to the gateway: waits for readiness holding no buffer, then
/// reads what is there into one and hands its filled part to h2.
async fn from_plain(
    member: &mut tokio::net::tcp::OwnedReadHalf,
    send: &mut SendStream<Bytes>,
) -> io::Result<()> {
    let mut buf = BytesMut::new();
    loop {
        with_room(&mut buf);
        match member.try_read_buf(&mut buf) {
            Ok(0) => return finish(send),
            Ok(_) => send_all(send, buf.split().freeze()).await?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing now: wait without a buffer (an idle watch holds none).
                buf = BytesMut::new();
                member.readable().await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Any member connection's bytes (TLS: rustls decrypts into the buffer) to the gateway.
async fn from_member<R: AsyncRead + Unpin>(
    member: &mut R,
    send: &mut SendStream<Bytes>,
) -> io::Result<()> {
    let mut buf = BytesMut::new();
    loop {
        with_room(&mut buf);
        if member.read_buf(&mut buf).await? == 0 {
            return finish(send);
        }
        send_all(send, buf.split().freeze()).await?;
    }
}
