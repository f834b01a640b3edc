//! The response body in process, member to client, as a client of either front-end gets it: a
//! scripted member connection (`upstream::scripted`) sits in the shard's pool, the request goes
//! through `exchange::send` (the member reads its head off the stream), the member's bytes are
//! relayed to a sink that records what the client is given (as HTTP/1.1's sink, chunked bodies
//! as they came; as h2's, decoded), and `exchange::finish` gives the connection back after a
//! complete body only. Bytes in, bytes out: no socket, no sleep.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use fleetgate_config_watcher::{ClusterRoute, Limits};
use futures_util::future::join;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use super::*;
use crate::codec::http1::Head;
use crate::exchange::retired::LAST_CHUNK;
use crate::exchange::{finish, send, NoBody, Outbound, ShardExchange};
use crate::observe::metrics::Metrics;
use crate::runtime::shutdown::ShardDrain;
use crate::runtime::snapshot::ShardTable;
use crate::runtime::tests::block_on;
use crate::runtime::Deadline;
use crate::upstream::budget::Sockets;
use crate::upstream::scripted::{member_conn, MemberEnd};
use crate::upstream::ShardPool;

/// An ordinary response's pace (nothing here is slow to take a piece).
const ORDINARY: Pace = Pace::Ordinary {
    write_timeout: Duration::from_secs(60),
};

/// The head of a chunked 200.
const CHUNKED_OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                             Transfer-Encoding: chunked\r\n\r\n";

/// A watch event, as a kube-apiserver sends one per chunk.
const EVENT: &[u8] = b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"ConfigMap\"}}\n";

/// What the client was given, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Given {
    Piece(Bytes),
    Flush,
    End,
    EndEarly { last_chunk: bool },
}

/// A front-end's sink that records what it is given.
struct Recorder {
    /// As h2's sink (chunked bodies decoded), else as HTTP/1.1's.
    decodes_chunks: bool,
    given: UnboundedSender<Given>,
    /// Completes (sent or dropped) when the client goes away; None: it stays.
    client_leaves: Option<oneshot::Receiver<()>>,
}

/// A recorder, and what it records.
fn recorder(decodes_chunks: bool) -> (Recorder, UnboundedReceiver<Given>) {
    let (given, record) = unbounded_channel();
    let sink = Recorder {
        decodes_chunks,
        given,
        client_leaves: None,
    };
    (sink, record)
}

impl Recorder {
    fn record(&mut self, given: Given) -> Result<(), Failure> {
        let _ = self.given.send(given);
        Ok(())
    }
}

impl ResponseSink for Recorder {
    fn decodes_chunks(&self) -> bool {
        self.decodes_chunks
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        self.record(Given::Piece(piece))
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        self.record(Given::Flush)
    }

    async fn end(&mut self) -> Result<(), Failure> {
        self.record(Given::End)
    }

    async fn end_early(&mut self, last_chunk: bool) -> Result<(), Failure> {
        self.record(Given::EndEarly { last_chunk })
    }

    async fn client_event(&mut self) -> ClientEvent {
        match &mut self.client_leaves {
            Some(leaves) => {
                let _ = leaves.await;
                ClientEvent::Gone
            }
            None => std::future::pending().await,
        }
    }
}

/// Everything given so far.
fn drained(record: &mut UnboundedReceiver<Given>) -> Vec<Given> {
    std::iter::from_fn(|| record.try_recv().ok()).collect()
}

/// The body bytes among `given`.
fn body(given: &[Given]) -> Vec<u8> {
    let mut body = Vec::new();
    for given in given {
        if let Given::Piece(piece) = given {
            body.extend_from_slice(piece);
        }
    }
    body
}

/// The body bytes the client is given next: the pieces up to the flush that sends them.
async fn next_flushed(record: &mut UnboundedReceiver<Given>) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        match record.recv().await.expect("the relay goes on") {
            Given::Piece(piece) => out.extend_from_slice(&piece),
            Given::Flush if out.is_empty() => {}
            Given::Flush => return out,
            ended => panic!("{ended:?} before the next piece"),
        }
    }
}

/// `data` as one chunk.
fn chunk(data: &[u8]) -> Vec<u8> {
    [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat()
}

/// One shard's exchange, with one scripted connection to the member of `edge` (a pull-mode
/// cluster) in its pool.
struct Member {
    shard: Rc<ShardExchange>,
    route: Arc<ClusterRoute>,
    /// The member's end of the pooled connection.
    end: MemberEnd,
}

impl Member {
    async fn pooled() -> Member {
        let table = crate::testing::test_table(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: edge}\n\
             spec: {connectMode: Tunnel}\n",
        );
        let route = table.cluster("edge").unwrap().clone();
        let shard = Rc::new_cyclic(|me| ShardExchange {
            shard: 0,
            table: ShardTable::new(Arc::new(arc_swap::ArcSwap::from_pointee(table))),
            pool: ShardPool::new(4, Duration::from_secs(60)),
            shard_metrics: Metrics::new().shard(),
            drain: Default::default(),
            sockets: Sockets::new(1),
            client_holds: Default::default(),
            workers: 1,
            me: me.clone(),
        });
        let (conn, end) = member_conn(&route).await;
        shard.pool.put(conn);
        Member { shard, route, end }
    }

    /// Sends a `method` request for the pods (a watch when `long_running`) through the shard:
    /// the member reads its head, exactly, and answers `response` (a head, and as much of the
    /// body as the test sends at once). The answer, its head read.
    async fn ask(&mut self, method: &str, long_running: bool, response: &[u8]) -> Answer {
        let query = if long_running { "?watch=1" } else { "" };
        let head = format!("{method} /api/v1/pods{query} HTTP/1.1\r\nHost: member\r\n\r\n");
        let out = Outbound {
            cluster: &self.route,
            service: None,
            head: head.as_bytes(),
            replayable: true,
            long_running,
            upgrade: false,
            head_method: method == "HEAD",
            limits: Limits::default(),
            verb: "get",
            started: Instant::now(),
            client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let mut response_head = Head::default();
        let end = &mut self.end;
        let member = async {
            let mut read = vec![0; head.len()];
            end.read_exact(&mut read).await.unwrap();
            assert_eq!(read, head.as_bytes(), "what the member reads");
            end.write_all(response).await.unwrap();
        };
        let (mut deadline, mut body) = (Deadline::new(), NoBody);
        let asked = send(
            &self.shard,
            &out,
            &mut body,
            &mut response_head,
            &mut deadline,
        );
        let (answer, ()) = join(asked, member).await;
        let Ok(answer) = answer else {
            panic!("no answer from the member");
        };
        answer
    }

    /// Asks with `method` for an ordinary response: the member answers `head`, then sends `rest`
    /// while the body is relayed to a recorder (as h2's sink when `decodes_chunks`). What the
    /// client was given: the whole body, then its end, the connection given back.
    async fn respond(
        &mut self,
        method: &str,
        head: &[u8],
        rest: &[u8],
        decodes_chunks: bool,
    ) -> Vec<Given> {
        let answer = self.ask(method, false, head).await;
        let (mut sink, mut record) = recorder(decodes_chunks);
        let end = &mut self.end;
        let rest = async { end.write_all(rest).await.unwrap() };
        let relayed = relay_while(&self.shard, answer, &mut sink, ORDINARY, rest).await;
        assert_eq!(relayed, Ok(true));
        let given = drained(&mut record);
        assert_eq!(given.last(), Some(&Given::End));
        given
    }

    /// Whether the connection went back to the pool and carries the next request: the member
    /// reads it on the same stream, and its answer reaches the client whole.
    async fn serves_another_request(&mut self) {
        assert_eq!(self.shard.pool.idle_count(), 1, "the connection was pooled");
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(
            body(&self.respond("GET", head, b"next", false).await),
            b"next"
        );
    }
}

/// Relays `answer`'s body to `sink` while `member` runs (the member's part, and the test's
/// checks of what the client is given meanwhile), then gives the connection back as the pipeline
/// does. Whether the body ended complete (the connection then pooled), or why it was cut (the
/// client's connection is then closed: the response has started).
async fn relay_while(
    shard: &ShardExchange,
    mut answer: Answer,
    sink: &mut Recorder,
    pace: Pace<'_>,
    member: impl Future<Output = ()>,
) -> Result<bool, &'static str> {
    let relaying = join(relay(&mut answer, sink, pace), member);
    // Bounds a failure only: every case ends as soon as its bytes have moved.
    let (relayed, ()) = runtime::timeout(Duration::from_secs(20), relaying)
        .await
        .unwrap_or_else(|_| panic!("the relay hung"));
    match relayed {
        Ok(complete) => {
            finish(shard, answer, complete);
            Ok(complete)
        }
        Err(Failure::Abort(why)) => Err(why),
        Err(Failure::Answer(_)) => panic!("a Status after the response had started"),
    }
}

#[test]
fn a_content_length_body_reaches_the_client_byte_for_byte_and_the_connection_is_reused() {
    block_on(async {
        let mut member = Member::pooled().await;
        // Larger than a read, the pipe and an h2 frame.
        let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", sent.len());
        let given = member.respond("GET", head.as_bytes(), &sent, false).await;
        assert!(body(&given) == sent, "the body, byte for byte");
        member.serves_another_request().await;
    })
}

#[test]
fn a_chunked_body_goes_to_http1_as_it_came_and_to_h2_decoded_and_the_connection_is_reused() {
    let data: [&[u8]; 2] = [b"hello", &[b'x'; 40_000]];
    let sent = [
        b"5;ext=1\r\nhello\r\n".to_vec(),
        chunk(data[1]),
        b"0\r\nX-Checksum: 1\r\n\r\n".to_vec(),
    ]
    .concat();
    for decodes_chunks in [false, true] {
        block_on(async {
            let mut member = Member::pooled().await;
            let given = member
                .respond("GET", CHUNKED_OK, &sent, decodes_chunks)
                .await;
            let expected = if decodes_chunks {
                data.concat()
            } else {
                sent.clone()
            };
            assert!(body(&given) == expected, "decoded: {decodes_chunks}");
            member.serves_another_request().await;
        })
    }
}

#[test]
fn a_member_that_dies_inside_a_body_cuts_the_response_and_its_connection_is_not_pooled() {
    let cases: [(&[u8], &[u8]); 2] = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"0123"),
        (CHUNKED_OK, b"a\r\n0123"),
    ];
    for (head, sent) in cases {
        // Its end of stream (a FIN), or a reset (a crash).
        for reset in [false, true] {
            block_on(async {
                let mut member = Member::pooled().await;
                let answer = member.ask("GET", false, head).await;
                let (mut sink, mut record) = recorder(false);
                let Member { shard, end, .. } = member;
                let mut end = Some(end);
                let dies = async {
                    let stream = end.as_mut().unwrap();
                    stream.write_all(sent).await.unwrap();
                    assert_eq!(
                        next_flushed(&mut record).await,
                        sent,
                        "given before the end"
                    );
                    if reset {
                        end = None;
                    } else {
                        stream.shutdown().await.unwrap();
                    }
                };
                let relayed = relay_while(&shard, answer, &mut sink, ORDINARY, dies).await;
                assert_eq!(relayed, Err("member closed inside the response body"));
                let given = drained(&mut record);
                assert!(
                    given.iter().all(|g| *g == Given::Flush),
                    "nothing more, and no end of the body: {given:?}"
                );
                assert_eq!(shard.pool.idle_count(), 0);
            })
        }
    }
}

#[test]
fn head_204_and_304_answers_have_no_body_and_the_next_answer_is_read_intact() {
    for (method, head) in [
        ("HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
        ("GET", "HTTP/1.1 204 No Content\r\n\r\n"),
        (
            "GET",
            "HTTP/1.1 304 Not Modified\r\nETag: \"7\"\r\nContent-Length: 5\r\n\r\n",
        ),
    ] {
        block_on(async {
            let mut member = Member::pooled().await;
            let given = member.respond(method, head.as_bytes(), b"", false).await;
            assert_eq!(given, [Given::End], "{method}: {head}");
            member.serves_another_request().await;
        })
    }
}

/// A followed log's lines (or a watch's events, the relay cannot tell them apart) reach the
/// client one by one; a drain of the shard does not end a stream that is not a watch.
#[test]
fn a_long_running_streams_lines_reach_the_client_one_by_one_as_the_member_sends_them() {
    let events: [&[u8]; 3] = [
        EVENT,
        b"{\"type\":\"MODIFIED\"}\n",
        b"{\"type\":\"DELETED\"}\n",
    ];
    for decodes_chunks in [false, true] {
        block_on(async {
            let mut member = Member::pooled().await;
            let answer = member.ask("GET", true, CHUNKED_OK).await;
            let (mut sink, mut record) = recorder(decodes_chunks);
            let end = &mut member.end;
            let drain = &member.shard.drain;
            let member_sends = async {
                for event in events {
                    // Only a watch ends with the drain: these lines still reach the client.
                    drain.begin();
                    end.write_all(&chunk(event)).await.unwrap();
                    // Given to the client before the member sends anything more.
                    let given = next_flushed(&mut record).await;
                    let expected = if decodes_chunks {
                        event.to_vec()
                    } else {
                        chunk(event)
                    };
                    assert_eq!(given, expected, "decoded: {decodes_chunks}");
                }
                end.write_all(LAST_CHUNK).await.unwrap();
            };
            let relayed = relay_while(
                &member.shard,
                answer,
                &mut sink,
                Pace::LongRunning,
                member_sends,
            )
            .await;
            assert_eq!(relayed, Ok(true));
            let last = (!decodes_chunks).then(|| Given::Piece(Bytes::from_static(LAST_CHUNK)));
            let expected: Vec<Given> = last.into_iter().chain([Given::End]).collect();
            assert_eq!(drained(&mut record), expected);
            member.serves_another_request().await;
        })
    }
}

/// How a watch stream can end between two events other than by the member's last chunk.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// The route is retired (its cluster removed or changed).
    Retired,
    /// The shard drains (SIGTERM): the client watches again on another replica.
    Drained,
    /// The member goes away (restarted, its connection or tunnel dropped).
    MemberGone,
    /// The client goes away.
    ClientGone,
}

#[test]
fn a_watch_ends_between_events_cleanly_when_its_route_retires_its_shard_drains_or_its_member_goes()
{
    let endings = [
        Ending::Retired,
        Ending::Drained,
        Ending::MemberGone,
        Ending::ClientGone,
    ];
    for ending in endings {
        for decodes_chunks in [false, true] {
            block_on(async {
                let mut member = Member::pooled().await;
                let answer = member.ask("GET", true, CHUNKED_OK).await;
                let (mut sink, mut record) = recorder(decodes_chunks);
                let (client_leaves, leaving) = oneshot::channel();
                sink.client_leaves = Some(leaving);
                let mut client_leaves = Some(client_leaves);
                let Member { shard, route, end } = member;
                let mut end = Some(end);
                let drain = ShardDrain::default();
                let one_event_then_the_end = async {
                    let stream = end.as_mut().unwrap();
                    stream.write_all(&chunk(EVENT)).await.unwrap();
                    next_flushed(&mut record).await;
                    match ending {
                        Ending::Retired => route.retirement.retire(),
                        Ending::Drained => drain.begin(),
                        Ending::MemberGone => end = None,
                        Ending::ClientGone => client_leaves = None,
                    }
                };
                let relayed = relay_while(
                    &shard,
                    answer,
                    &mut sink,
                    Pace::Watch(&drain),
                    one_event_then_the_end,
                )
                .await;
                let given = drained(&mut record);
                if let Ending::ClientGone = ending {
                    assert_eq!(relayed, Err("client went away during a stream"));
                    assert!(given.iter().all(|g| *g == Given::Flush), "{given:?}");
                } else {
                    // As the member's own end of the stream would: the client watches again.
                    assert_eq!(relayed, Ok(false), "{ending:?}");
                    let last_chunk = !decodes_chunks;
                    assert_eq!(given.last(), Some(&Given::EndEarly { last_chunk }));
                    assert!(body(&given).is_empty(), "{ending:?}: {given:?}");
                }
                // Never pooled: the member's connection is released at once.
                assert_eq!(shard.pool.idle_count(), 0);
                if let Some(mut stream) = end {
                    let read = stream.read(&mut [0; 1]).await;
                    assert!(!matches!(read, Ok(1..)), "{ending:?}: {read:?}");
                }
            })
        }
    }
}
