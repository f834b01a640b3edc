//! One konnectivity agent's session on the tunnel thread: the h2 server connection the agent
//! opened, its one `AgentService.Connect` stream, and every member connection carried on it.
//!
//! The handshake accepts the Connect call (path, content type, the agent's `agentID` and
//! `agentIdentifiers` metadata) and answers with the `serverID` / `serverCount` headers the ANP
//! agent requires. Then one task multiplexes: packets from the agent (DIAL_RSP, DATA, CLOSE_RSP,
//! DIAL_CLS, DRAIN) go to the pending dials and connections they name; commands from the shards
//! (dial, data, close) become packets to the agent; an h2 PING every second notices a half-open
//! agent. Everything the agent sends is a stranger's: a packet that names no pending dial or
//! open connection is dropped (a late DIAL_RSP's connection is closed), a reused connection ID
//! fails only the dial that got it, a connection whose reader falls [`conn::MAX_UNREAD`] behind is
//! closed alone, and a malformed message ends this agent's session only. Nothing here touches a
//! shard: the shards reach a session through [`SessionHandle`] only.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ahash::AHashMap;
use bytes::{Bytes, BytesMut};
use futures_channel::mpsc::{unbounded, UnboundedSender};
use futures_channel::oneshot;
use futures_util::StreamExt;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use tracing::{debug, info};

use super::conn::{self, Command, ConnShared, Inbound, KonnectivityConn};
use super::packet::{self, Packet};
use crate::tunnel::{registry, wire, Carrier, Tunnel};

/// The gRPC method an ANP agent calls (the proto files declare no package).
pub const CONNECT_PATH: &str = "/AgentService/Connect";
/// Member connections one agent may have open, and dials it may have pending.
const MAX_CONNECTIONS: usize = 4096;
const MAX_PENDING_DIALS: usize = 512;
/// Framed packets waiting for the agent's window before the session stops taking commands.
const MAX_QUEUED_OUT: usize = 1024 * 1024;
/// The h2 windows of the agent's connection: the session takes DATA off them as it comes (its
/// bounds are per member connection), so they only need to cover the bandwidth-delay product.
const WINDOW: u32 = 4 * 1024 * 1024;
/// Longest `agentID` / `agentIdentifiers` values accepted.
const MAX_AGENT_ID: usize = 253;
const MAX_IDENTIFIERS: usize = 4096;
/// How often dials the shards gave up on are cancelled at the agent (DIAL_CLS).
const PURGE_EVERY: Duration = Duration::from_secs(1);

type AgentTls = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// A shard's way into a session: dials through the agent.
pub struct SessionHandle {
    commands: UnboundedSender<Command>,
}

/// Why a dial through an agent failed.
pub enum DialError {
    /// The session is gone: try another tunnel, or wait.
    Gone,
    /// The agent answered with an error (its reason, printable), or the session refused.
    Refused(String),
}

impl SessionHandle {
    /// Asks the agent to dial `address`; the connection once it answered.
    pub async fn dial(&self, address: &str) -> Result<KonnectivityConn, DialError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .unbounded_send(Command::Dial {
                address: address.to_owned(),
                reply,
            })
            .map_err(|_| DialError::Gone)?;
        match answer.await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(reason)) => Err(DialError::Refused(reason)),
            Err(_) => Err(DialError::Gone),
        }
    }
}

/// An agent whose Connect call was accepted.
pub struct Accepted {
    connection: h2::server::Connection<AgentTls, Bytes>,
    body: RecvStream,
    send: SendStream<Bytes>,
    agent_id: String,
}

/// This process's `serverID`: an agent keeps one connection per distinct server ID it sees.
fn server_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("fleetgate-{}", uuid::Uuid::new_v4()))
}

/// A gRPC answer without a body: the status in the headers (trailers-only).
fn refuse(mut respond: SendResponse<Bytes>, code: u32, message: &str) {
    let message = wire::printable(message).replace('%', "%25");
    let response = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string())
        .header("grpc-message", message)
        .body(())
        .unwrap_or_default();
    let _ = respond.send_response(response, true);
}

/// gRPC status codes used here.
const UNIMPLEMENTED: u32 = 12;
const PERMISSION_DENIED: u32 = 7;
const RESOURCE_EXHAUSTED: u32 = 8;
const INTERNAL: u32 = 13;

/// Runs h2 as the server on an agent's TLS connection and accepts its Connect call, or says why
/// not (and tells the agent in a gRPC status). `cluster` is the one its certificate serves, or
/// why the certificate serves none (then the Connect call is refused with that reason, so the
/// agent can log it). `is_cluster` says whether a name is a cluster of the current table.
pub async fn handshake(
    tls: AgentTls,
    cluster: &Result<Arc<str>, String>,
    is_cluster: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Accepted, String> {
    let mut connection = h2::server::Builder::new()
        .max_concurrent_streams(4)
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_frame_size(wire::MAX_FRAME)
        .max_header_list_size(16 * 1024)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    loop {
        let (request, respond) = match connection.accept().await {
            Some(Ok(accepted)) => accepted,
            Some(Err(e)) => return Err(format!("h2: {e}")),
            None => return Err("the agent closed the connection before Connect".into()),
        };
        let grpc = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "application/grpc" || v.starts_with("application/grpc+"));
        if request.method() != http::Method::POST || request.uri().path() != CONNECT_PATH || !grpc {
            // Not a call this server has: the agent may try another (bounded by the handshake
            // timeout).
            refuse(
                respond,
                UNIMPLEMENTED,
                "only AgentService.Connect is served here",
            );
            continue;
        }
        let decision = match cluster {
            Ok(cluster) => check_metadata(request.headers(), cluster, is_cluster),
            Err(reason) => Err(reason.clone()),
        };
        match decision {
            Ok(agent_id) => {
                let response = http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc")
                    .header("serverid", server_id())
                    .header("servercount", "1")
                    .body(())
                    .map_err(|e| e.to_string())?;
                let mut respond = respond;
                let send = respond
                    .send_response(response, false)
                    .map_err(|e| format!("answering Connect: {e}"))?;
                return Ok(Accepted {
                    connection,
                    body: request.into_body(),
                    send,
                    agent_id,
                });
            }
            Err(reason) => {
                refuse(respond, PERMISSION_DENIED, &reason);
                // Let the refusal reach the agent before the connection is dropped.
                connection.graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(_)) = connection.accept().await {}
                })
                .await;
                return Err(reason);
            }
        }
    }
}

/// The agent's `agentID` (required; only logged: the certificate says which cluster it serves)
/// and `agentIdentifiers`: a `host=NAME` naming another cluster of this gateway means an agent
/// configured for that cluster, which is refused instead of silently serving the certificate's
/// one. Other hosts (OCM's cluster-proxy adds a hashed service-proxy host, its exposed
/// services, and `host=<cluster>` when it proxies the API server) and other identifier kinds
/// route nothing here and are ignored.
fn check_metadata(
    headers: &http::HeaderMap,
    cluster: &str,
    is_cluster: &(dyn Fn(&str) -> bool + Sync),
) -> Result<String, String> {
    let agent_id = headers
        .get("agentid")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= MAX_AGENT_ID)
        .filter(|v| v.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or("the Connect call has no valid agentID metadata")?;
    if let Some(identifiers) = headers.get("agentidentifiers") {
        let identifiers = identifiers
            .to_str()
            .ok()
            .filter(|v| v.len() <= MAX_IDENTIFIERS)
            .ok_or("the agentIdentifiers metadata is too long or not ASCII")?;
        let hosts: Vec<String> = identifiers
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .filter(|(key, _)| *key == "host")
            .map(|(_, value)| {
                percent_encoding::percent_decode_str(value)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        if let Some(other) = hosts.iter().find(|h| *h != cluster && is_cluster(h)) {
            return Err(format!(
                "the agent's identifiers name cluster {other:?}, not the cluster {cluster:?} its certificate is for"
            ));
        }
    }
    Ok(agent_id.to_owned())
}

/// A connection as the session holds it.
struct Open {
    shared: Arc<ConnShared>,
    inbound: UnboundedSender<Inbound>,
}

struct PendingDial {
    reply: oneshot::Sender<Result<KonnectivityConn, String>>,
    address: String,
}

/// The multiplexer's state.
struct Session {
    cluster: Arc<str>,
    peer: SocketAddr,
    tunnel: Arc<Tunnel>,
    /// Framed packets not yet handed to h2 (the agent's window is full).
    out: BytesMut,
    commands: UnboundedSender<Command>,
    open: AHashMap<i64, Open>,
    pending: AHashMap<i64, PendingDial>,
    next_random: i64,
}

/// Serves an accepted agent until its connection ends: registers its tunnel, runs the session,
/// then fails whatever is still open on it.
pub async fn serve(accepted: Accepted, cluster: Arc<str>, peer: SocketAddr) {
    let Accepted {
        mut connection,
        mut body,
        mut send,
        agent_id,
    } = accepted;
    let Some(mut pings) = connection.ping_pong() else {
        return;
    };
    let (commands, mut from_shards) = unbounded();
    let tunnel = Arc::new(Tunnel::new(
        cluster.clone(),
        peer,
        Carrier::Konnectivity(SessionHandle {
            commands: commands.clone(),
        }),
        registry().stats(&cluster),
    ));
    registry().add(tunnel.clone());
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, agent_id = %agent_id, "konnectivity agent up");
    let mut session = Session {
        cluster: cluster.clone(),
        peer,
        tunnel: tunnel.clone(),
        out: BytesMut::new(),
        commands,
        open: AHashMap::new(),
        pending: AHashMap::new(),
        // Any start will do (it is a correlation ID, not a secret); a random one keeps IDs of
        // successive sessions apart in the agent's logs.
        next_random: (uuid::Uuid::new_v4().as_u64_pair().0 >> 2) as i64,
    };
    let mut reader = packet::MessageReader::default();
    let mut purge = tokio::time::interval(PURGE_EVERY);
    let heartbeat = wire::heartbeat::until_unanswered(&mut pings, tokio::time::sleep);
    tokio::pin!(heartbeat);
    let (reason, status) = loop {
        if let Err(e) = flush(&mut send, &mut session.out) {
            break (format!("sending to the agent: {e}"), None);
        }
        let queued_out = session.out.len();
        tokio::select! {
            accepted = connection.accept() => match accepted {
                Some(Ok((_, respond))) => {
                    refuse(respond, RESOURCE_EXHAUSTED, "one Connect call per connection");
                }
                Some(Err(e)) => break (format!("connection error: {e}"), None),
                None => break ("the agent closed the connection".into(), None),
            },
            data = body.data() => match data {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    reader.push(&chunk);
                    if let Err(e) = session.read_packets(&mut reader) {
                        break (format!("a malformed packet: {e}"), Some((INTERNAL, e.to_string())));
                    }
                }
                Some(Err(e)) => break (format!("the Connect stream failed: {e}"), None),
                None => break ("the agent ended its Connect call".into(), Some((0, String::new()))),
            },
            command = from_shards.next(), if queued_out < MAX_QUEUED_OUT => {
                // The session holds a sender itself, so the channel never ends here.
                if let Some(command) = command {
                    session.command(command);
                }
            }
            capacity = std::future::poll_fn(|cx| send.poll_capacity(cx)), if queued_out > 0 => {
                if let Some(Err(e)) = capacity {
                    break (format!("sending to the agent: {e}"), None);
                }
            }
            _ = purge.tick() => session.purge_abandoned_dials(),
            reason = &mut heartbeat => break (reason, None),
        }
    };
    // Out of the registry first, so no new dial picks it.
    registry().remove(&tunnel);
    session.fail_all(&reason);
    if let Some((code, message)) = status {
        let mut trailers = http::HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(&code.to_string()) {
            trailers.insert("grpc-status", v);
        }
        if let Ok(v) = http::HeaderValue::from_str(&wire::printable(&message).replace('%', "%25")) {
            trailers.insert("grpc-message", v);
        }
        let _ = send.send_trailers(trailers);
        connection.graceful_shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(Ok(_)) = connection.accept().await {}
        })
        .await;
    }
    drop(connection);
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, reason = %reason, "konnectivity agent down");
}

/// Hands h2 as much of the queued output as the agent's window takes.
fn flush(send: &mut SendStream<Bytes>, out: &mut BytesMut) -> Result<(), h2::Error> {
    while !out.is_empty() {
        send.reserve_capacity(out.len().min(wire::MAX_FRAME as usize));
        let granted = send.capacity();
        if granted == 0 {
            return Ok(());
        }
        let chunk = out.split_to(granted.min(out.len())).freeze();
        send.send_data(chunk, false)?;
    }
    Ok(())
}

impl Session {
    fn queue(&mut self, p: &Packet) {
        packet::write_message(p, &mut self.out);
    }

    fn read_packets(
        &mut self,
        reader: &mut packet::MessageReader,
    ) -> Result<(), packet::DecodeError> {
        while let Some(message) = reader.next_message()? {
            let p = packet::decode(message)?;
            self.on_packet(p);
        }
        Ok(())
    }

    fn on_packet(&mut self, p: Packet) {
        match p {
            Packet::DialResponse {
                error,
                connect_id,
                random,
            } => self.on_dial_response(error, connect_id, random),
            Packet::Data {
                connect_id,
                error,
                data,
            } => self.on_data(connect_id, error, data),
            Packet::CloseResponse { error, connect_id } => self.on_closed(connect_id, error),
            // An ANP agent never sends CLOSE_REQ; one that does closes the connection.
            Packet::CloseRequest { connect_id } => self.on_closed(connect_id, String::new()),
            Packet::CloseDial { random } => {
                if let Some(dial) = self.pending.remove(&random) {
                    let _ = dial.reply.send(Err("the agent cancelled the dial".into()));
                }
            }
            Packet::Drain => {
                // The agent is shutting down: no new dials; the open connections go on.
                info!(peer = %self.peer, cluster = %self.cluster, tunnel = self.tunnel.id, "konnectivity agent draining");
                self.tunnel.mark_dead();
            }
            Packet::DialRequest { .. } | Packet::Unknown(_) => {
                debug!(peer = %self.peer, packet = ?p, "ignored a packet an agent does not send");
            }
        }
    }

    fn on_dial_response(&mut self, error: String, connect_id: i64, random: i64) {
        let Some(dial) = self.pending.remove(&random) else {
            // No dial waits for it (given up, or never asked): close what the agent opened.
            if error.is_empty() && connect_id != 0 && !self.open.contains_key(&connect_id) {
                self.queue(&Packet::CloseRequest { connect_id });
            }
            debug!(peer = %self.peer, random, connect_id, "a DIAL_RSP no dial waits for");
            return;
        };
        if !error.is_empty() {
            let reason = format!(
                "the agent could not dial {}: {}",
                dial.address,
                wire::printable(&error)
            );
            let _ = dial.reply.send(Err(reason));
            return;
        }
        if connect_id == 0 || self.open.contains_key(&connect_id) {
            // A hostile or broken agent: the connection already open keeps its ID.
            let _ = dial.reply.send(Err(format!(
                "the agent answered the dial with connection ID {connect_id}, which is not free"
            )));
            return;
        }
        if self.open.len() >= MAX_CONNECTIONS {
            self.queue(&Packet::CloseRequest { connect_id });
            let _ = dial.reply.send(Err(format!(
                "{MAX_CONNECTIONS} connections are open through this agent"
            )));
            return;
        }
        let shared = Arc::new(ConnShared::default());
        let (inbound, reader) = unbounded();
        let conn = KonnectivityConn::new(connect_id, self.commands.clone(), shared.clone(), reader);
        self.open.insert(connect_id, Open { shared, inbound });
        // A shard that gave up meanwhile drops the connection, which closes it.
        let _ = dial.reply.send(Ok(conn));
    }

    fn on_data(&mut self, connect_id: i64, error: String, data: Bytes) {
        let Some(open) = self.open.get(&connect_id) else {
            debug!(peer = %self.peer, connect_id, "DATA for no open connection");
            return;
        };
        if !error.is_empty() {
            self.close(
                connect_id,
                Inbound::Failed(format!("the agent: {}", wire::printable(&error))),
            );
            return;
        }
        if data.is_empty() {
            return;
        }
        let unread = open.shared.unread.fetch_add(data.len(), Ordering::AcqRel) + data.len();
        if unread > conn::MAX_UNREAD {
            info!(peer = %self.peer, cluster = %self.cluster, connect_id, "closing a connection whose reader stopped taking data");
            self.close(
                connect_id,
                Inbound::Failed(format!(
                    "its reader fell more than {} bytes behind (konnectivity has no flow control per connection)",
                    conn::MAX_UNREAD
                )),
            );
            return;
        }
        // A reader already gone is closing the connection (its Close is queued).
        let _ = open.inbound.unbounded_send(Inbound::Data(data));
    }

    /// The agent closed a connection (its member closed it, or it failed).
    fn on_closed(&mut self, connect_id: i64, error: String) {
        if let Some(open) = self.open.remove(&connect_id) {
            let end = if error.is_empty() {
                Inbound::End
            } else {
                Inbound::Failed(format!("the agent closed it: {}", wire::printable(&error)))
            };
            let _ = open.inbound.unbounded_send(end);
        }
    }

    /// Closes a connection from this side: CLOSE_REQ to the agent, `why` to the reader.
    fn close(&mut self, connect_id: i64, why: Inbound) {
        if let Some(open) = self.open.remove(&connect_id) {
            let _ = open.inbound.unbounded_send(why);
            self.queue(&Packet::CloseRequest { connect_id });
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Dial { address, reply } => {
                if !self.tunnel.is_alive() {
                    let _ = reply.send(Err("the agent is draining".into()));
                    return;
                }
                if self.pending.len() >= MAX_PENDING_DIALS {
                    let _ = reply.send(Err(format!(
                        "{MAX_PENDING_DIALS} dials are waiting for this agent"
                    )));
                    return;
                }
                let random = self.next_random;
                self.next_random = self.next_random.wrapping_add(1);
                self.queue(&Packet::DialRequest {
                    protocol: "tcp".into(),
                    address: address.clone(),
                    random,
                });
                self.pending.insert(random, PendingDial { reply, address });
            }
            Command::Data {
                connect_id,
                data,
                shared,
            } => {
                shared.in_flight.fetch_sub(data.len(), Ordering::AcqRel);
                shared.writer.wake();
                let current = self
                    .open
                    .get(&connect_id)
                    .is_some_and(|o| Arc::ptr_eq(&o.shared, &shared));
                if current {
                    self.queue(&Packet::Data {
                        connect_id,
                        error: String::new(),
                        data,
                    });
                }
            }
            Command::Close { connect_id, shared } => {
                let current = self
                    .open
                    .get(&connect_id)
                    .is_some_and(|o| Arc::ptr_eq(&o.shared, &shared));
                if current {
                    self.open.remove(&connect_id);
                    self.queue(&Packet::CloseRequest { connect_id });
                }
            }
        }
    }

    /// Dials whose shard gave up (its connect timeout): DIAL_CLS tells the agent.
    fn purge_abandoned_dials(&mut self) {
        let abandoned: Vec<i64> = self
            .pending
            .iter()
            .filter(|(_, d)| d.reply.is_canceled())
            .map(|(random, _)| *random)
            .collect();
        for random in abandoned {
            self.pending.remove(&random);
            self.queue(&Packet::CloseDial { random });
        }
    }

    /// The session ended: every open connection fails (its relay ends), every pending dial too.
    fn fail_all(&mut self, reason: &str) {
        for (_, open) in self.open.drain() {
            let _ = open.inbound.unbounded_send(Inbound::Failed(format!(
                "the agent's session ended: {reason}"
            )));
        }
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A session without an agent connection: what it would send piles up in `out`.
    fn session() -> (Session, futures_channel::mpsc::UnboundedReceiver<Command>) {
        let (commands, from_shards) = unbounded();
        let tunnel = Arc::new(Tunnel::new(
            "edge".into(),
            "127.0.0.1:1".parse().unwrap(),
            Carrier::Konnectivity(SessionHandle {
                commands: commands.clone(),
            }),
            Default::default(),
        ));
        let session = Session {
            cluster: "edge".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            tunnel,
            out: BytesMut::new(),
            commands,
            open: AHashMap::new(),
            pending: AHashMap::new(),
            next_random: 100,
        };
        (session, from_shards)
    }

    /// The packets the session queued for the agent since the last call.
    fn sent(session: &mut Session) -> Vec<Packet> {
        let mut reader = packet::MessageReader::default();
        reader.push(&session.out.split());
        let mut packets = Vec::new();
        while let Some(m) = reader.next_message().unwrap() {
            packets.push(packet::decode(m).unwrap());
        }
        packets
    }

    /// Dials through the session and answers as the agent with `connect_id`.
    fn dial(session: &mut Session, connect_id: i64) -> KonnectivityConn {
        let (reply, mut answer) = oneshot::channel();
        session.command(Command::Dial {
            address: "kubernetes.default.svc:443".into(),
            reply,
        });
        let random = match sent(session).as_slice() {
            [Packet::DialRequest {
                protocol,
                address,
                random,
            }] => {
                assert_eq!(
                    (protocol.as_str(), address.as_str()),
                    ("tcp", "kubernetes.default.svc:443")
                );
                *random
            }
            other => panic!("{other:?}"),
        };
        session.on_packet(Packet::DialResponse {
            error: String::new(),
            connect_id,
            random,
        });
        match answer.try_recv() {
            Ok(Some(Ok(conn))) => conn,
            _ => panic!("no connection"),
        }
    }

    /// What `conn` reads now, without waiting.
    fn read_now(conn: &mut KonnectivityConn) -> Option<std::io::Result<Vec<u8>>> {
        let mut buf = vec![0u8; 64 * 1024];
        match conn.read(&mut buf).now_or_never()? {
            Ok(n) => Some(Ok(buf[..n].to_vec())),
            Err(e) => Some(Err(e)),
        }
    }

    #[test]
    fn data_close_and_the_pipe_ends() {
        let (mut s, mut from_shards) = session();
        let mut conn = dial(&mut s, 7);
        s.on_packet(Packet::Data {
            connect_id: 7,
            error: String::new(),
            data: Bytes::from_static(b"hello"),
        });
        assert_eq!(read_now(&mut conn).unwrap().unwrap(), b"hello");
        assert!(read_now(&mut conn).is_none(), "nothing more yet");
        // Writes become DATA packets, in order.
        conn.write_all(b"request").now_or_never().unwrap().unwrap();
        while let Some(Some(c)) = from_shards.next().now_or_never() {
            s.command(c);
        }
        assert_eq!(
            sent(&mut s),
            vec![Packet::Data {
                connect_id: 7,
                error: String::new(),
                data: Bytes::from_static(b"request")
            }]
        );
        // The agent closes: end of stream, then EOF for good.
        s.on_packet(Packet::CloseResponse {
            error: String::new(),
            connect_id: 7,
        });
        assert_eq!(read_now(&mut conn).unwrap().unwrap(), b"");
        // Dropping the shard's end after the agent closed sends nothing.
        drop(conn);
        while let Some(Some(c)) = from_shards.next().now_or_never() {
            s.command(c);
        }
        assert_eq!(sent(&mut s), vec![]);
    }

    #[test]
    fn hostile_packets_leave_an_open_connection_alone() {
        let (mut s, mut from_shards) = session();
        let mut conn = dial(&mut s, 7);
        // A duplicate DIAL_RSP for the same dial, one naming connection 7 for another dial,
        // DATA / CLOSE_RSP for unknown IDs, a DIAL_CLS for nothing, unknown types.
        let (reply, mut other) = oneshot::channel();
        s.command(Command::Dial {
            address: "a:1".into(),
            reply,
        });
        let Packet::DialRequest { random, .. } = sent(&mut s).remove(0) else {
            panic!()
        };
        for p in [
            Packet::DialResponse {
                error: String::new(),
                connect_id: 7,
                random: 100,
            },
            Packet::DialResponse {
                error: String::new(),
                connect_id: 7,
                random,
            },
            Packet::Data {
                connect_id: 8,
                error: String::new(),
                data: Bytes::from_static(b"x"),
            },
            Packet::CloseResponse {
                error: String::new(),
                connect_id: 9,
            },
            Packet::CloseDial { random: 12345 },
            Packet::DialRequest {
                protocol: "tcp".into(),
                address: "x:1".into(),
                random: 1,
            },
            Packet::Unknown(99),
        ] {
            s.on_packet(p);
        }
        // The dial that got a used ID failed alone.
        match other.try_recv() {
            Ok(Some(Err(reason))) => assert!(reason.contains("not free"), "{reason}"),
            _ => panic!("the second dial should fail"),
        }
        // Connection 7 still works, and nothing was closed on the agent.
        s.on_packet(Packet::Data {
            connect_id: 7,
            error: String::new(),
            data: Bytes::from_static(b"ok"),
        });
        assert_eq!(read_now(&mut conn).unwrap().unwrap(), b"ok");
        assert_eq!(sent(&mut s), vec![]);
        // A DIAL_RSP for a dial nobody waits for, with a fresh ID: closed on the agent.
        s.on_packet(Packet::DialResponse {
            error: String::new(),
            connect_id: 40,
            random: 5,
        });
        assert_eq!(sent(&mut s), vec![Packet::CloseRequest { connect_id: 40 }]);
        drop(from_shards.next().now_or_never());
    }

    #[test]
    fn a_reader_that_falls_behind_is_closed_alone() {
        let (mut s, _from_shards) = session();
        let mut stalled = dial(&mut s, 1);
        let mut other = dial(&mut s, 2);
        let chunk = Bytes::from(vec![7u8; 4096]);
        for _ in 0..(conn::MAX_UNREAD / 4096) {
            s.on_packet(Packet::Data {
                connect_id: 1,
                error: String::new(),
                data: chunk.clone(),
            });
        }
        assert!(sent(&mut s).is_empty(), "within the bound");
        s.on_packet(Packet::Data {
            connect_id: 1,
            error: String::new(),
            data: chunk.clone(),
        });
        assert_eq!(sent(&mut s), vec![Packet::CloseRequest { connect_id: 1 }]);
        // The stalled reader gets what was buffered, then an error (not a clean end).
        let mut got = 0;
        let failure = loop {
            match read_now(&mut stalled).unwrap() {
                Ok(bytes) => got += bytes.len(),
                Err(e) => break e,
            }
        };
        assert_eq!(got, conn::MAX_UNREAD);
        assert!(failure.to_string().contains("fell more than"), "{failure}");
        // The other connection is untouched.
        s.on_packet(Packet::Data {
            connect_id: 2,
            error: String::new(),
            data: Bytes::from_static(b"fine"),
        });
        assert_eq!(read_now(&mut other).unwrap().unwrap(), b"fine");
    }

    #[test]
    fn a_writer_waits_at_its_in_flight_bound() {
        let (mut s, mut from_shards) = session();
        let mut conn = dial(&mut s, 3);
        let big = vec![1u8; conn::MAX_IN_FLIGHT + 64 * 1024];
        let mut written = 0;
        while let Some(Ok(n)) = conn.write(&big[written..]).now_or_never() {
            written += n;
            if written == big.len() {
                break;
            }
        }
        assert!(
            written >= conn::MAX_IN_FLIGHT && written < big.len(),
            "{written}"
        );
        // The session framing the queue lets it go on.
        while let Some(Some(c)) = from_shards.next().now_or_never() {
            s.command(c);
        }
        assert!(conn.write(&big[written..]).now_or_never().is_some());
    }

    #[test]
    fn the_session_ending_fails_open_connections_and_dials() {
        let (mut s, _from_shards) = session();
        let mut conn = dial(&mut s, 5);
        let (reply, mut waiting) = oneshot::channel();
        s.command(Command::Dial {
            address: "a:1".into(),
            reply,
        });
        s.fail_all("PING unanswered");
        let e = read_now(&mut conn).unwrap().unwrap_err();
        assert!(e.to_string().contains("PING unanswered"), "{e}");
        assert!(waiting.try_recv().is_err(), "the pending dial is cancelled");
    }

    proptest! {
        /// Any sequence of packets from the agent: no panic, and connection 1's bytes arrive
        /// whole and in order unless a packet named connection 1 itself.
        #[test]
        fn arbitrary_packet_sequences(ops in proptest::collection::vec((0u8..7, 0i64..4, any::<i64>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..64)) {
            let (mut s, _from_shards) = session();
            let mut conn = dial(&mut s, 1);
            let mut expected = Vec::new();
            let mut touched = false;
            for (kind, id, random, data) in ops {
                let id = id + 2; // never connection 1
                let p = match kind {
                    0 => Packet::Data { connect_id: id, error: String::new(), data: Bytes::from(data) },
                    1 => Packet::DialResponse { error: String::new(), connect_id: id, random },
                    2 => Packet::DialResponse { error: String::new(), connect_id: 1, random },
                    3 => Packet::CloseResponse { error: "x".into(), connect_id: id },
                    4 => Packet::CloseDial { random },
                    5 => Packet::Unknown(random as u64),
                    _ => {
                        expected.extend_from_slice(&data);
                        Packet::Data { connect_id: 1, error: String::new(), data: Bytes::from(data) }
                    }
                };
                if let Packet::DialResponse { connect_id: 1, random: r, .. } = &p {
                    touched |= s.pending.contains_key(r);
                }
                s.on_packet(p);
            }
            prop_assert!(!touched);
            let mut got = Vec::new();
            while let Some(Ok(bytes)) = read_now(&mut conn) {
                if bytes.is_empty() { break; }
                got.extend(bytes);
            }
            prop_assert_eq!(got, expected);
        }
    }
}
