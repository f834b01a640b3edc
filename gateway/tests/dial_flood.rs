//! A stream-reset flood is not a burst of member dials (issue 31 item 3).
//!
//! One client's MadeYouReset flood (h2 streams the gateway itself resets, about 1,000 per
//! connection before its GOAWAY) used to dial the member once per stream: the burst overflowed the
//! member's accept queue, and another user's request that needed a new member connection waited
//! for SYN retransmits. Here floods run against a member that sets up one connection per
//! millisecond (its TLS handshake), while a canary (another user, his own connection) sends small
//! GETs to the same member. Two kinds of flood: streams reset in the same write as their HEADERS,
//! as the attack is written (they must cost the member nothing), and streams reset a round trip
//! later, once they wait for a member connection (they wait in line: a few dials at a time). The
//! member's accept queue never holds more than the gateway's dials for one endpoint on one shard,
//! every canary request is answered, its p99 under the first kind stays under 50 ms, and no
//! canary request waits as long as a SYN retransmit under the second. Run under both monoio
//! drivers.
//!
//! Against the commit before the dial line (`FLEETGATE_UNDER_TEST=path/to/that/fleetgate`), the
//! member's accept queue filled up to its backlog and a canary request got a 503 after the 5 s
//! connect timeout.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::upstream::MAX_DIALS_PER_ENDPOINT;
use support::{h2raw, read_response, Gateway, Pki, DRIVERS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The member's accept queue (its listen backlog): what a burst of SYNs overflows.
const BACKLOG: u32 = 64;
/// What the member spends setting up each new connection before it accepts the next (a
/// kube-apiserver's TLS handshake, modeled as time): connections arriving meanwhile wait in its
/// accept queue.
const SETUP: Duration = Duration::from_millis(1);
/// Streams the flood opens per write (then a PING, to know the gateway read them, then their
/// resets).
const BATCH: u32 = 50;
/// Canary answers per kind of flood, for a p99 that is not just the slowest.
const CANARY_SAMPLES: usize = 100;
/// Flood connections per kind of flood at most.
const MAX_FLOODS: usize = 8;
/// The first SYN retransmit: what a connection waits when the member's accept queue dropped its
/// SYN.
const SYN_RETRANSMIT: Duration = Duration::from_secs(1);
/// What the issue asks of a well-behaved user's latency while another floods.
const CANARY_P99: Duration = Duration::from_millis(50);
const FLOOD_PATH: &str = "/clusters/member/api/v1/namespaces/default/configmaps/flood";
const CANARY_PATH: &str = "/clusters/member/api/v1/namespaces/default/configmaps/canary";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_flood_costs_the_member_a_few_dials_and_another_users_requests_stay_fast() {
    for driver in DRIVERS {
        let pki = Arc::new(Pki::generate());
        let member = Member::start(&pki).await;
        let gw = gateway(
            driver,
            pki,
            member.address,
            support::silent_listener().await,
        );

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (warm_tx, warm_rx) = tokio::sync::oneshot::channel();
        let answered = Arc::new(AtomicUsize::new(0));
        let canary = tokio::spawn(canary(
            gw.https,
            gw.pki.clone(),
            answered.clone(),
            warm_tx,
            stop_rx,
        ));
        // The canary is a user already at work on the member when the flood starts.
        warm_rx.await.expect("the canary's first answer");
        let mut phases = Vec::new();
        let mut streams = 0;
        for (reset, floods) in [(Reset::AtOnce, MAX_FLOODS), (Reset::Later, 2)] {
            let started = Instant::now();
            let answered_before = answered.load(Ordering::SeqCst);
            // Flood connections one after another, until the canary has enough answers for a
            // p99 that is not just its slowest.
            for _ in 0..floods {
                let (opened, goaway) = flood(&gw, reset).await;
                assert!(
                    goaway,
                    "{driver}: a {reset:?} flood was not ended by the gateway ({opened} streams)"
                );
                streams += opened;
                if answered.load(Ordering::SeqCst) - answered_before >= CANARY_SAMPLES {
                    break;
                }
            }
            phases.push((reset, started, Instant::now()));
        }
        let _ = stop_tx.send(true);
        let latencies = canary.await.unwrap();
        assert!(
            streams >= 3000,
            "{driver}: the floods opened only {streams} streams"
        );

        let deepest = member.deepest_queue.load(Ordering::SeqCst);
        assert!(
            deepest <= MAX_DIALS_PER_ENDPOINT,
            "{driver}: the member's accept queue held {deepest} connections at once (the gateway dials at most {MAX_DIALS_PER_ENDPOINT} at a time per member on a shard); {} accepted in all for {streams} streams",
            member.accepted.load(Ordering::SeqCst)
        );
        let failed: Vec<_> = latencies.iter().filter(|l| l.code != 200).collect();
        assert!(
            failed.is_empty(),
            "{driver}: canary requests failed: {failed:?}"
        );
        for (reset, started, ended) in phases {
            let mut during: Vec<Duration> = latencies
                .iter()
                .filter(|l| l.at >= started && l.at < ended)
                .map(|l| l.took)
                .collect();
            during.sort();
            let slowest = during.last().copied().unwrap_or_default();
            match reset {
                Reset::AtOnce => {
                    assert!(
                        during.len() >= CANARY_SAMPLES / 2,
                        "{driver}: the canary got only {} answers during the {reset:?} floods",
                        during.len()
                    );
                    let p99 = during[(during.len() * 99).div_ceil(100) - 1];
                    assert!(
                        p99 < CANARY_P99,
                        "{driver}: the canary's p99 during the {reset:?} floods was {p99:?} (slowest {slowest:?}, {} requests)",
                        during.len()
                    );
                }
                // Streams that wait in line take their turns before the canary's (first come,
                // first served) and each turn costs a dial: slower, but never a SYN retransmit.
                Reset::Later => assert!(
                    slowest < SYN_RETRANSMIT,
                    "{driver}: a canary request during the {reset:?} floods took {slowest:?}"
                ),
            }
        }
    }
}

/// A member that sets up one connection per [`SETUP`] (then its TLS handshake, as a
/// kube-apiserver's, with the test CA's serving certificate), with an accept queue of
/// [`BACKLOG`], and records how deep that queue got. A dial is done only once the member has
/// accepted it and finished its handshake. It answers every request with a small JSON body.
struct Member {
    address: SocketAddr,
    accepted: Arc<AtomicUsize>,
    deepest_queue: Arc<AtomicUsize>,
}

impl Member {
    async fn start(pki: &Pki) -> Member {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(BACKLOG).unwrap();
        let address = listener.local_addr().unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(server_config(pki));
        let accepted = Arc::new(AtomicUsize::new(0));
        let deepest_queue = Arc::new(AtomicUsize::new(0));
        let (count, deepest) = (accepted.clone(), deepest_queue.clone());
        tokio::spawn(async move {
            loop {
                deepest.fetch_max(accept_queue(address.port()), Ordering::SeqCst);
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let tls = tls.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = tls.accept(stream).await {
                        answer(stream).await;
                    }
                });
                tokio::time::sleep(SETUP).await;
            }
        });
        Member {
            address,
            accepted,
            deepest_queue,
        }
    }
}

/// The member's TLS: the test CA's serving certificate (which names 127.0.0.1).
fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    let provider = fleetgate_config_watcher::crypto_provider();
    let certs = fleetgate_config_watcher::parse_certs(pki.serving_cert_pem.as_bytes()).unwrap();
    let key = fleetgate_config_watcher::parse_key(pki.serving_key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    Arc::new(config)
}

/// Connections waiting in the accept queue of the listener on 127.0.0.1:`port` now: for a
/// listening socket, `/proc/net/tcp`'s rx_queue is that queue's length.
fn accept_queue(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.len() > 4 && fields[1] == local && fields[3] == "0A")
        .and_then(|fields| fields[4].split_once(':').map(|(_, rx)| rx.to_string()))
        .and_then(|rx| usize::from_str_radix(&rx, 16).ok())
        .unwrap_or(0)
}

/// Answers requests on one member connection until the gateway closes it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        // GETs only: the head is all there is.
        buf.drain(..end);
        let body = r#"{"kind":"ConfigMap","apiVersion":"v1"}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len(),
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads until `buf` holds a whole request head; its length, or None at end of stream.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end + 4);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The gateway on one shard (the flood and the canary share it), its cluster `member` the member
/// at `member` over TLS (`support::write_config`'s clusters otherwise).
fn gateway(driver: &str, pki: Arc<Pki>, member: SocketAddr, stalled: SocketAddr) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &pki, member, stalled);
    let edit = |name: &str, edit: &dyn Fn(String) -> String| {
        let path = dir.path().join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, edit(text)).unwrap();
    };
    edit("gateway.yaml", &|text| {
        text.replace("workers: 2", "workers: 1")
            .replace("connectTimeoutSeconds: 0.5", "connectTimeoutSeconds: 5")
    });
    edit("clusters.yaml", &|text| {
        let plain = format!("server: http://{member}/prefix\n");
        assert!(text.contains(&plain));
        text.replace(
            &plain,
            &format!("server: https://{member}/prefix\n  caFile: ca.crt\n"),
        )
    });
    // Info, not the harness's debug: a debug line per flood stream would be the flood's main cost.
    let quiet = |command: &mut std::process::Command| {
        command.env("RUST_LOG", "fleetgate=info");
    };
    tokio::task::block_in_place(|| Gateway::start_with(&config, driver, dir, pki, quiet))
}

/// When a flood's streams are reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reset {
    /// In the same write as their HEADERS, as the attack is written: most are reset before they
    /// reach the exchange.
    AtOnce,
    /// A round trip later, after a PING whose ACK says the gateway read their HEADERS: they are
    /// in the exchange, waiting for a member connection, when they are reset.
    Later,
}

/// One MadeYouReset flood connection, until the gateway's GOAWAY: batches of GET streams, each
/// made to be reset by the gateway itself with a WINDOW_UPDATE that overflows the stream's
/// window (`reset` says when), a batch sent once the gateway answered the previous one's PING.
/// The streams opened, and whether a GOAWAY came.
async fn flood(gw: &Gateway, reset: Reset) -> (usize, bool) {
    let mut tls = gw.tls_h2().await;
    h2raw::start(&mut tls).await;
    let get = |id: u32| h2raw::headers(id, &h2raw::get_fields(&format!("{FLOOD_PATH}-{id}")), true);
    let overflow =
        |id: u32| h2raw::frame(h2raw::WINDOW_UPDATE, 0, id, &0x7fff_ffffu32.to_be_bytes());
    let mut next_stream = 1u32;
    let mut opened = 0;
    // The gateway resets at most 1024 streams for a client's errors before its GOAWAY: bounded.
    for batch in 0..(4096 / BATCH) {
        let ids: Vec<u32> = (0..BATCH).map(|i| next_stream + 2 * i).collect();
        next_stream += 2 * BATCH;
        let mut out = Vec::new();
        for &id in &ids {
            out.extend_from_slice(&get(id));
            if reset == Reset::AtOnce {
                out.extend_from_slice(&overflow(id));
            }
        }
        out.extend_from_slice(&h2raw::ping(u64::from(batch)));
        if tls.write_all(&out).await.is_err() {
            return (opened, false);
        }
        opened += ids.len();
        let read = h2raw::read_until(&mut tls, |f| {
            (f.kind == h2raw::PING && f.flags & h2raw::ACK != 0) || f.kind == h2raw::GOAWAY
        })
        .await;
        match read {
            Some(frame) if frame.kind == h2raw::GOAWAY => return (opened, true),
            Some(_) => {}
            None => return (opened, false),
        }
        if reset == Reset::Later {
            let resets: Vec<u8> = ids.iter().flat_map(|&id| overflow(id)).collect();
            if tls.write_all(&resets).await.is_err() {
                return (opened, false);
            }
        }
    }
    let goaway = h2raw::read_until(&mut tls, |f| f.kind == h2raw::GOAWAY).await;
    (opened, goaway.is_some())
}

/// One canary request: when it started, how long it took, its status code.
#[derive(Debug)]
struct Answered {
    at: Instant,
    took: Duration,
    code: u16,
}

/// Another user (bob) on an HTTP/1.1 connection of his own: sequential GETs for the canary path
/// (`warm` told after the first answer, `answered` counting them) until `stop`.
async fn canary(
    https: SocketAddr,
    pki: Arc<Pki>,
    answered: Arc<AtomicUsize>,
    warm: tokio::sync::oneshot::Sender<()>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Answered> {
    let tcp = TcpStream::connect(https).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(pki.client_config_as("bob", "canaries"))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let mut carry = Vec::new();
    let first = get(&mut tls, &mut carry).await;
    let _ = warm.send(());
    let mut latencies = vec![Answered {
        at: Instant::now(),
        took: Duration::ZERO,
        code: first,
    }];
    while !*stop.borrow() {
        let started = Instant::now();
        let code = get(&mut tls, &mut carry).await;
        latencies.push(Answered {
            at: started,
            took: started.elapsed(),
            code,
        });
        answered.fetch_add(1, Ordering::SeqCst);
    }
    latencies
}

/// One canary GET on `stream`; the answer's status code.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, carry: &mut Vec<u8>) -> u16 {
    let request = format!("GET {CANARY_PATH} HTTP/1.1\r\nHost: gw\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    read_response(stream, carry)
        .await
        .expect("the canary was answered")
        .code
}
