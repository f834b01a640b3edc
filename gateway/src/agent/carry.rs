//! The agent's half of a stream: bytes between one h2 stream of the tunnel and one connection to
//! the member (or an allowed service), both ways at once, until both directions are done or
//! either fails (then the stream is reset and the member connection closed).
//!
//! No copy between user-space buffers: what the member sends is read into a buffer whose filled
//! part is handed to h2 as it is (`Bytes`, sent as DATA without a copy), and what the gateway sends
//! arrives as h2's own `Bytes`, written to the member from there. Reads are up to
//! [`READ_CHUNK`] (sized to the traffic: small while reads are small, a whole chunk once one fills
//! its room), so a big LIST travels in full-size DATA frames. An idle plain connection (a
//! watch between events) holds no read buffer: the buffer is given up before waiting for the
//! socket to become readable. Flow control follows the writer: received bytes are released to
//! the gateway's window only once the member took them. Half-closes pass through (the gateway's
//! END_STREAM shuts the member connection's write side; the member's EOF sends END_STREAM).
//! tokio only (the agent: `super::member` hands it each stream it accepted).

use std::future::poll_fn;
use std::io;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tunnel::wire::{broken, MAX_FRAME};

/// The most one read from the member takes (one DATA frame, [`MAX_FRAME`]).
pub const READ_CHUNK: usize = MAX_FRAME as usize;

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

/// The first read after a wait: most are then one watch event or one small answer.
const FIRST_READ: usize = 4 * 1024;

/// How much the next read from the member offers: [`FIRST_READ`] while reads are small (watch
/// events, small answers), [`READ_CHUNK`] once one fills its room (a big LIST). Never a whole chunk per
/// event: a 64 KiB buffer taken and given back for every event of every watch made the allocator
/// hand out fresh pages (zeroed by the kernel, two MiB at a time where it asks for huge pages)
/// at each event, a quarter millisecond of the agent's CPU per event.
struct ReadSize(usize);

impl ReadSize {
    /// A buffer with room for the next read: the one given while it has a quarter of the size
    /// left, else a new one (the filled parts split off earlier keep the old allocation alive
    /// until h2 sent them). Returns the room offered.
    fn room(&self, buf: &mut BytesMut) -> usize {
        if buf.capacity() - buf.len() < self.0 / 4 {
            *buf = BytesMut::with_capacity(self.0);
        }
        buf.capacity() - buf.len()
    }

    /// After a read of `read` bytes into `offered`: a read that filled its room means a body is
    /// streaming (a whole chunk next); one that took less than a quarter of it, small traffic.
    fn after(&mut self, read: usize, offered: usize) {
        if read == offered {
            self.0 = READ_CHUNK;
        } else if read < offered / 4 {
            self.0 = FIRST_READ;
        }
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

/// The buffer a member connection is read into, with room as [`ReadSize`] says.
struct Reads {
    buf: BytesMut,
    size: ReadSize,
    /// The room the last [`Reads::buf`] offered.
    offered: usize,
}

impl Reads {
    fn new() -> Self {
        Reads {
            buf: BytesMut::new(),
            size: ReadSize(FIRST_READ),
            offered: 0,
        }
    }

    /// The buffer to read into next, with room for the read.
    fn buf(&mut self) -> &mut BytesMut {
        self.offered = self.size.room(&mut self.buf);
        &mut self.buf
    }

    /// The `read` bytes the last read put in the buffer, for h2; sizes the next read.
    fn filled(&mut self, read: usize) -> Bytes {
        self.size.after(read, self.offered);
        self.buf.split().freeze()
    }
}

/// A plain member connection's bytes to the gateway: waits for readiness holding no buffer, then
/// reads what is there into one and hands its filled part to h2.
async fn from_plain(
    member: &mut tokio::net::tcp::OwnedReadHalf,
    send: &mut SendStream<Bytes>,
) -> io::Result<()> {
    let mut reads = Reads::new();
    loop {
        match member.try_read_buf(reads.buf()) {
            Ok(0) => return finish(send),
            Ok(read) => send_all(send, reads.filled(read)).await?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing now: wait without a buffer (an idle watch holds none).
                reads.buf = BytesMut::new();
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
    let mut reads = Reads::new();
    loop {
        let read = member.read_buf(reads.buf()).await?;
        if read == 0 {
            return finish(send);
        }
        send_all(send, reads.filled(read)).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_small_for_small_traffic_and_whole_chunks_for_a_streaming_body() {
        let mut size = ReadSize(FIRST_READ);
        let mut buf = BytesMut::new();
        // A watch event: one small allocation, not a chunk.
        let offered = size.room(&mut buf);
        assert_eq!(offered, FIRST_READ);
        size.after(900, offered);
        assert_eq!(size.0, FIRST_READ);
        // A big LIST: the first read fills its room, the next ones offer a whole chunk.
        let mut seen = Vec::new();
        for _ in 0..4 {
            let mut buf = BytesMut::new();
            let offered = size.room(&mut buf);
            seen.push(offered);
            size.after(offered, offered);
        }
        assert_eq!(seen, [FIRST_READ, READ_CHUNK, READ_CHUNK, READ_CHUNK]);
        // A read of half a chunk keeps the size (a body still streaming, the member slower).
        size.after(READ_CHUNK / 2, READ_CHUNK);
        assert_eq!(size.0, READ_CHUNK);
        // The LIST ended: a small read brings the next one back down.
        size.after(100, READ_CHUNK);
        assert_eq!(size.0, FIRST_READ);
        // A buffer with enough room left is kept (no allocation per read).
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        buf.extend_from_slice(&[0; 1000]);
        let before = buf.as_ptr();
        size.room(&mut buf);
        assert_eq!(buf.as_ptr(), before);
    }
}
