//! The server side of one SPDY/3.1 connection, over any byte stream (the upgraded HTTP/1.1
//! connection, or a WebSocket carrying SPDY for port-forward): accepts the client's streams,
//! answers each SYN_STREAM with a SYN_REPLY, delivers their data and FIN, sends ours, answers
//! PINGs, and ends with GOAWAY.
//!
//! Two tasks per connection: a reader (frames in, data to per-stream channels) and a writer (the
//! only owner of the write half and of the outgoing header compressor). The reader blocks when a
//! stream's consumer is slow, as Go's spdystream does, so memory per connection stays bounded;
//! it returns window to the peer as data is consumed. Like spdystream, the writer does not wait
//! for send window: client-go never sends WINDOW_UPDATE. Called by `stream::exec` and
//! `stream::portforward`; knows nothing about what the streams carry.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tracing::debug;

use super::frame::{
    Frame, FrameEncoder, FrameReader, HeaderBlock, SpdyError, FLAG_FIN, GOAWAY_OK, RST_CANCEL,
};
use crate::sim::stream::process::CHANNEL_CHUNKS;

/// Largest DATA frame we send; client-go reads frames whole, so keep them moderate.
const MAX_DATA_FRAME: usize = 32 * 1024;

/// A stream the client opened.
pub(crate) struct IncomingStream {
    pub(crate) headers: HeaderBlock,
    /// Data the client sends; closed at its FIN or RST, or when the connection ends.
    pub(crate) data: mpsc::Receiver<Bytes>,
    pub(crate) writer: StreamWriter,
}

/// Our sending side of one stream.
#[derive(Clone)]
pub(crate) struct StreamWriter {
    id: u32,
    tx: mpsc::Sender<Outgoing>,
}

/// The connection is gone; nothing more can be sent.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("spdy connection closed")]
pub(crate) struct ConnectionClosed;

impl StreamWriter {
    /// Sends `data` as one or more DATA frames, slicing it rather than copying.
    pub(crate) async fn write(&self, data: Bytes) -> Result<(), ConnectionClosed> {
        let mut rest = data;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(MAX_DATA_FRAME));
            self.tx
                .send(Outgoing::Frame(Frame::Data {
                    stream_id: self.id,
                    flags: 0,
                    data: chunk,
                }))
                .await
                .map_err(|_| ConnectionClosed)?;
        }
        Ok(())
    }

    /// Half-closes our side (an empty DATA frame with FLAG_FIN).
    pub(crate) async fn finish(&self) -> Result<(), ConnectionClosed> {
        self.tx
            .send(Outgoing::Frame(Frame::Data {
                stream_id: self.id,
                flags: FLAG_FIN,
                data: Bytes::new(),
            }))
            .await
            .map_err(|_| ConnectionClosed)
    }

    /// Aborts the stream (RST_STREAM CANCEL).
    pub(crate) async fn reset(&self) -> Result<(), ConnectionClosed> {
        self.tx
            .send(Outgoing::Frame(Frame::RstStream {
                stream_id: self.id,
                status: RST_CANCEL,
            }))
            .await
            .map_err(|_| ConnectionClosed)
    }
}

enum Outgoing {
    Frame(Frame),
    /// Flush, shut the write half down and stop.
    Close,
}

/// One running SPDY server connection.
pub(crate) struct Session {
    /// Streams the client opens, in order; ends when the client can open no more.
    pub(crate) streams: mpsc::Receiver<IncomingStream>,
    out: mpsc::Sender<Outgoing>,
    /// Becomes `true` when the peer is gone (read EOF or error, or write error).
    peer_gone: watch::Receiver<bool>,
    last_stream_id: watch::Receiver<u32>,
}

impl Session {
    /// [`Session::start`], or `None` with the reason logged at debug level: what a session
    /// handler does when the connection cannot carry SPDY.
    pub(crate) fn start_logged<IO>(io: IO) -> Option<Session>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        Session::start(io)
            .map_err(|error| tracing::debug!(%error, "spdy session did not start"))
            .ok()
    }

    /// Starts the reader and writer tasks on `io`.
    pub(crate) fn start<IO>(io: IO) -> Result<Session, SpdyError>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let encoder = FrameEncoder::new()?;
        let (out_tx, out_rx) = mpsc::channel(64);
        let (streams_tx, streams_rx) = mpsc::channel(16);
        let (gone_tx, gone_rx) = watch::channel(false);
        let (last_tx, last_rx) = watch::channel(0u32);
        let gone_tx = std::sync::Arc::new(gone_tx);
        tokio::spawn(write_loop(write_half, encoder, out_rx, gone_tx.clone()));
        tokio::spawn(read_loop(
            FrameReader::new(read_half),
            out_tx.clone(),
            streams_tx,
            gone_tx,
            last_tx,
        ));
        Ok(Session {
            streams: streams_rx,
            out: out_tx,
            peer_gone: gone_rx,
            last_stream_id: last_rx,
        })
    }

    /// A receiver that turns `true` when the peer is gone.
    pub(crate) fn peer_gone(&self) -> watch::Receiver<bool> {
        self.peer_gone.clone()
    }

    /// Ends the connection politely: GOAWAY, then wait (at most `grace`) for the client to close
    /// its side, which it does once it has read everything, then close ours.
    pub(crate) async fn close(mut self, grace: Duration) {
        let last = *self.last_stream_id.borrow();
        let _ = self
            .out
            .send(Outgoing::Frame(Frame::GoAway {
                last_good_stream_id: last,
                status: GOAWAY_OK,
            }))
            .await;
        let mut gone = self.peer_gone.clone();
        let _ = tokio::time::timeout(grace, gone.wait_for(|g| *g)).await;
        let _ = self.out.send(Outgoing::Close).await;
        self.streams.close();
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut io: W,
    mut encoder: FrameEncoder,
    mut rx: mpsc::Receiver<Outgoing>,
    gone: std::sync::Arc<watch::Sender<bool>>,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'outer: while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Batch whatever is already queued into one write.
        while let Some(item) = next.take() {
            match item {
                Outgoing::Frame(frame) => {
                    if let Err(error) = encoder.encode(&frame, &mut buf) {
                        debug!(%error, "spdy frame not encodable");
                        break 'outer;
                    }
                }
                Outgoing::Close => {
                    let _ = io.write_all(&buf).await;
                    let _ = io.shutdown().await;
                    break 'outer;
                }
            }
            if buf.len() < 256 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        if let Err(error) = io.write_all(&buf).await {
            debug!(%error, "spdy write failed");
            gone.send_replace(true);
            break;
        }
        buf.clear();
        if io.flush().await.is_err() {
            gone.send_replace(true);
            break;
        }
    }
    let _ = io.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    out: mpsc::Sender<Outgoing>,
    streams_tx: mpsc::Sender<IncomingStream>,
    gone: std::sync::Arc<watch::Sender<bool>>,
    last_stream_id: watch::Sender<u32>,
) {
    let mut open: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut accepting = Some(streams_tx);
    loop {
        let frame = match reader.read_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(error) => {
                debug!(%error, "spdy read ended");
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id,
                flags,
                headers,
                ..
            } => {
                last_stream_id.send_replace(stream_id);
                let reply = Frame::SynReply {
                    stream_id,
                    flags: 0,
                    headers: Vec::new(),
                };
                if out.send(Outgoing::Frame(reply)).await.is_err() {
                    break;
                }
                let (data_tx, data_rx) = mpsc::channel(CHANNEL_CHUNKS);
                if flags & FLAG_FIN == 0 {
                    open.insert(stream_id, data_tx);
                }
                let stream = IncomingStream {
                    headers,
                    data: data_rx,
                    writer: StreamWriter {
                        id: stream_id,
                        tx: out.clone(),
                    },
                };
                let delivered = match &accepting {
                    Some(tx) => tx.send(stream).await.is_ok(),
                    None => false,
                };
                if !delivered {
                    open.remove(&stream_id);
                    let _ = out
                        .send(Outgoing::Frame(Frame::RstStream {
                            stream_id,
                            status: super::frame::RST_PROTOCOL_ERROR,
                        }))
                        .await;
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let len = data.len() as u32;
                if !data.is_empty() {
                    if let Some(tx) = open.get(&stream_id) {
                        if tx.send(data).await.is_err() {
                            // The consumer is done with this stream; drop what follows.
                            open.remove(&stream_id);
                        }
                    }
                    // Give the window back once the data is handed over (both the stream's
                    // and, in SPDY/3.1, the connection's).
                    for id in [stream_id, 0] {
                        let _ = out
                            .send(Outgoing::Frame(Frame::WindowUpdate {
                                stream_id: id,
                                delta: len,
                            }))
                            .await;
                    }
                }
                if flags & FLAG_FIN != 0 {
                    open.remove(&stream_id);
                }
            }
            Frame::RstStream { stream_id, .. } => {
                open.remove(&stream_id);
            }
            Frame::Headers {
                stream_id, flags, ..
            } => {
                if flags & FLAG_FIN != 0 {
                    open.remove(&stream_id);
                }
            }
            Frame::Ping { id } => {
                // Client pings have odd ids; even ones would be answers to ours (we send none).
                if id % 2 == 1 && out.send(Outgoing::Frame(Frame::Ping { id })).await.is_err() {
                    break;
                }
            }
            Frame::GoAway { .. } => {
                // The client opens no more streams; the ones open go on until it closes.
                accepting = None;
            }
            Frame::SynReply { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
    }
    // Dropping the senders ends every stream's data (EOF) and the stream acceptor.
    drop(open);
    drop(accepting);
    gone.send_replace(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::stream::spdy::frame::header;

    /// A scripted client on the other end of a duplex pipe.
    struct Client {
        reader: FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        encoder: FrameEncoder,
    }

    impl Client {
        async fn send(&mut self, frame: Frame) {
            let mut buf = BytesMut::new();
            self.encoder.encode(&frame, &mut buf).unwrap();
            self.writer.write_all(&buf).await.unwrap();
        }

        /// Next frame that is not a WINDOW_UPDATE.
        async fn next(&mut self) -> Option<Frame> {
            loop {
                match self.reader.read_frame().await.unwrap() {
                    Some(Frame::WindowUpdate { .. }) => continue,
                    other => return other,
                }
            }
        }
    }

    fn pair() -> (Session, Client) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let session = Session::start(a).unwrap();
        let (r, w) = tokio::io::split(b);
        (
            session,
            Client {
                reader: FrameReader::new(r),
                writer: w,
                encoder: FrameEncoder::new().unwrap(),
            },
        )
    }

    #[tokio::test]
    async fn streams_are_replied_echoed_finished_and_the_session_goes_away() {
        let (mut session, mut client) = pair();
        client
            .send(Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: vec![("streamtype".into(), "data".into())],
            })
            .await;
        assert_eq!(
            client.next().await,
            Some(Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: vec![]
            })
        );
        let mut stream = session.streams.recv().await.unwrap();
        assert_eq!(header(&stream.headers, "streamtype"), Some("data"));
        client
            .send(Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"ping"),
            })
            .await;
        let got = stream.data.recv().await.unwrap();
        assert_eq!(&got[..], b"ping");
        assert!(stream.data.recv().await.is_none(), "FIN must end the data");
        stream.writer.write(got).await.unwrap();
        stream.writer.finish().await.unwrap();
        assert_eq!(
            client.next().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: 0,
                data: Bytes::from_static(b"ping")
            })
        );
        assert_eq!(
            client.next().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::new()
            })
        );
        client.send(Frame::Ping { id: 1 }).await;
        assert_eq!(client.next().await, Some(Frame::Ping { id: 1 }));
        let closing = tokio::spawn(session.close(Duration::from_secs(5)));
        assert_eq!(
            client.next().await,
            Some(Frame::GoAway {
                last_good_stream_id: 1,
                status: GOAWAY_OK
            })
        );
        client.writer.shutdown().await.unwrap();
        drop(client.writer);
        closing.await.unwrap();
        assert_eq!(client.reader.read_frame().await.unwrap(), None);
    }
}
