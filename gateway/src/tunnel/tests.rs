//! The tunnel registry in process: tunnels registered, picked, found dead, retired and waited
//! for, and streams opened on them to a scripted agent. Each tunnel is a real h2 connection of
//! the wire format's own settings over an in-memory pipe (`tokio::io::duplex`), its agent end a
//! task that answers as the test says: bytes in, bytes out, no socket, no sleep (the one timer,
//! a request's wait for an agent, never fires: an arrival wakes it).

use std::cell::RefCell;
use std::rc::Rc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::runtime::tests::block_on;

/// How long a stream may take to open; never reached here.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// A table with two pull-mode clusters, `edge` and `other`.
fn table() -> RouteTable {
    let cluster = |name: &str| {
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}}}\n\
             spec: {{connectMode: Tunnel}}\n"
        )
    };
    crate::testing::test_table(&format!("{}---\n{}", cluster("edge"), cluster("other")))
}

fn route(name: &str) -> Arc<ClusterRoute> {
    table().cluster(name).unwrap().clone()
}

/// How a scripted agent answers each stream.
#[derive(Clone, Copy)]
enum Agent {
    /// 200, then every byte back as it came.
    Echo,
    /// This status, with this reason in the error header.
    Refuse(http::StatusCode, &'static str),
    /// A reset of the stream (the connection stays up).
    Reset,
}

/// The paths a scripted agent was asked for.
type Asked = Rc<RefCell<Vec<String>>>;

/// A tunnel of `cluster`, from `agent` (an address for the logs), whose agent end answers as
/// `script` says.
async fn tunnel(
    registry: &TunnelRegistry,
    cluster: &str,
    agent: &str,
    script: Agent,
) -> (Arc<Tunnel>, Asked) {
    let (gateway_end, agent_end) = tokio::io::duplex(64 * 1024);
    let asked = Asked::default();
    monoio::spawn(scripted_agent(agent_end, script, asked.clone()));
    let (send, connection) = wire::gateway_h2(gateway_end).await.unwrap();
    monoio::spawn(async move { drop(connection.await) });
    (new_tunnel(registry, cluster, agent, send), asked)
}

/// A tunnel whose connection is already gone (its agent vanished), though nobody noticed yet.
async fn gone_tunnel(registry: &TunnelRegistry, cluster: &str, agent: &str) -> Arc<Tunnel> {
    let (gateway_end, agent_end) = tokio::io::duplex(64 * 1024);
    let (send, connection) = wire::gateway_h2(gateway_end).await.unwrap();
    drop((connection, agent_end));
    new_tunnel(registry, cluster, agent, send)
}

fn new_tunnel(
    registry: &TunnelRegistry,
    cluster: &str,
    agent: &str,
    send: h2::client::SendRequest<Bytes>,
) -> Arc<Tunnel> {
    let cluster: Arc<str> = cluster.into();
    let stats = registry.stats(&cluster);
    Arc::new(Tunnel::new(
        cluster,
        agent.parse().unwrap(),
        Carrier::Fleetgate(send),
        stats,
    ))
}

/// The agent's end of a tunnel, answering each stream as `script` says.
async fn scripted_agent(io: DuplexStream, script: Agent, asked: Asked) {
    let Ok(mut connection) = wire::agent_h2(io).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        asked.borrow_mut().push(request.uri().path().to_owned());
        match script {
            Agent::Echo => {
                let Ok(send) = respond.send_response(http::Response::new(()), false) else {
                    continue;
                };
                monoio::spawn(echo(TunnelStream::new(send, request.into_body())));
            }
            Agent::Refuse(status, reason) => {
                let _ = respond.send_response(wire::refusal(status, reason), true);
            }
            Agent::Reset => respond.send_reset(h2::Reason::REFUSED_STREAM),
        }
    }
}

async fn echo(mut stream: TunnelStream) {
    let mut buf = [0u8; 1024];
    while let Ok(n @ 1..) = stream.read(&mut buf).await {
        if stream.write_all(&buf[..n]).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
    let _ = stream.shutdown().await;
}

/// Writes `bytes` to a member connection and reads as many back.
async fn round_trip(io: TunnelIo, bytes: &[u8]) -> Vec<u8> {
    let TunnelIo::Stream(mut stream) = io else {
        panic!("a fleetgate agent's tunnel gives a stream");
    };
    stream.write_all(bytes).await.unwrap();
    stream.flush().await.unwrap();
    let mut back = vec![0; bytes.len()];
    stream.read_exact(&mut back).await.unwrap();
    back
}

#[test]
fn tunnels_are_registered_per_cluster_and_retired() {
    block_on(async {
        let registry = TunnelRegistry::new();
        let table = table();
        assert_eq!(registry.count("edge"), 0);
        let (a, _) = tunnel(&registry, "edge", "10.0.0.1:5000", Agent::Echo).await;
        let (b, _) = tunnel(&registry, "edge", "10.0.0.2:5000", Agent::Echo).await;
        registry.add(a.clone());
        registry.add(b.clone());
        assert_eq!(registry.count("edge"), 2);
        assert_eq!(registry.count("other"), 0);
        assert_eq!(
            registry.tunnel_clusters(&table),
            [("edge".into(), 2), ("other".into(), 0)]
        );
        // An agent that reconnects counts again in the connects, not in the live tunnels.
        registry.remove(&a);
        assert!(!a.is_alive());
        let (again, _) = tunnel(&registry, "edge", "10.0.0.1:5001", Agent::Echo).await;
        registry.add(again.clone());
        assert_eq!(registry.count("edge"), 2);
        let metrics = registry.openmetrics_lines(&table);
        for line in [
            "fleetgate_tunnel_agents{cluster=\"edge\"} 2\n",
            "fleetgate_tunnel_agents{cluster=\"other\"} 0\n",
            "fleetgate_tunnel_connects_total{cluster=\"edge\"} 3\n",
        ] {
            assert!(metrics.contains(line), "{line:?} missing:\n{metrics}");
        }
        // Retired: the last ones leave, and a request finds none (the wait is over at once).
        registry.remove(&b);
        registry.remove(&again);
        assert_eq!(registry.count("edge"), 0);
        assert!(registry.pick("edge", None).is_none());
        registry.set_wait(Duration::ZERO);
        let error = registry
            .open(&route("edge"), None, OPEN_TIMEOUT, None)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&error, GatewayError::NoTunnel { cluster, .. } if cluster == "edge"),
            "{error}"
        );
        assert_eq!(error.code_and_reason(), (503, "ServiceUnavailable"));
    })
}

#[test]
fn a_pick_spreads_over_live_tunnels_and_prefers_the_shards_own() {
    block_on(async {
        let registry = TunnelRegistry::new();
        let mut ids = Vec::new();
        for (i, shard) in [Some(0), Some(1), None].into_iter().enumerate() {
            let (send, _connection) = {
                let (gateway_end, _agent_end) = tokio::io::duplex(1024);
                wire::gateway_h2(gateway_end).await.unwrap()
            };
            let mut tunnel = Tunnel::new(
                "edge".into(),
                format!("10.0.0.{i}:5000").parse().unwrap(),
                Carrier::Fleetgate(send),
                registry.stats(&"edge".into()),
            );
            tunnel.shard = shard;
            ids.push(tunnel.id);
            registry.add(Arc::new(tunnel));
        }
        // Off the shards: round robin over all three.
        let picked: Vec<u64> = (0..6)
            .map(|_| registry.pick("edge", None).unwrap().id)
            .collect();
        assert_eq!(picked, [ids[0], ids[1], ids[2], ids[0], ids[1], ids[2]]);
        // On shard 1: its own tunnel, whichever the round robin starts at.
        for _ in 0..3 {
            assert_eq!(registry.pick("edge", Some(1)).unwrap().id, ids[1]);
        }
        // On a shard without one: any.
        assert!(registry.pick("edge", Some(7)).is_some());
        // A tunnel marked dead is neither counted nor picked, though still listed.
        let shard_1 = registry.pick("edge", Some(1)).unwrap();
        shard_1.mark_dead();
        assert_eq!(registry.count("edge"), 2);
        for _ in 0..6 {
            assert_ne!(registry.pick("edge", Some(1)).unwrap().id, ids[1]);
        }
        assert!(registry.pick("other", None).is_none());
    })
}

#[test]
fn a_stream_carries_bytes_both_ways_and_is_counted() {
    block_on(async {
        let registry = TunnelRegistry::new();
        let (edge, asked) = tunnel(&registry, "edge", "10.0.0.1:5000", Agent::Echo).await;
        registry.add(edge);
        let route = route("edge");
        let io = registry
            .open(&route, None, OPEN_TIMEOUT, None)
            .await
            .unwrap();
        let stats = registry.stats(&route.name);
        assert_eq!(stats.open.load(Ordering::Relaxed), 1);
        let request = b"GET /api HTTP/1.1\r\nHost: edge\r\n\r\n";
        assert_eq!(round_trip(io, request).await, request);
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
        assert_eq!(stats.opened.load(Ordering::Relaxed), 1);
        assert_eq!(stats.written.load(Ordering::Relaxed), request.len() as u64);
        assert_eq!(stats.read.load(Ordering::Relaxed), request.len() as u64);
        // A service is named to the agent as the wire format says.
        let service = wire::ServiceRef::parse("team-a/echo:8080").unwrap();
        let io = registry
            .open(&route, Some(&service), OPEN_TIMEOUT, None)
            .await
            .unwrap();
        assert_eq!(round_trip(io, b"ping").await, b"ping");
        assert_eq!(*asked.borrow(), ["/member", "/service/team-a/echo/8080"]);
    })
}

#[test]
fn a_tunnel_found_gone_is_marked_dead_and_another_carries_the_stream() {
    block_on(async {
        let registry = TunnelRegistry::new();
        let gone = gone_tunnel(&registry, "edge", "10.0.0.1:5000").await;
        let (live, asked) = tunnel(&registry, "edge", "10.0.0.2:5000", Agent::Echo).await;
        // The round robin of a new registry starts at the first added: the gone one.
        registry.add(gone.clone());
        registry.add(live.clone());
        assert_eq!(registry.count("edge"), 2);
        let io = registry
            .open(&route("edge"), None, OPEN_TIMEOUT, None)
            .await
            .unwrap();
        assert!(!gone.is_alive());
        assert!(live.is_alive());
        assert_eq!(registry.count("edge"), 1);
        assert_eq!(
            round_trip(io, b"after a dead tunnel").await,
            b"after a dead tunnel"
        );
        assert_eq!(asked.borrow().len(), 1);
    })
}

#[test]
fn a_request_waits_for_an_agent_and_is_served_when_it_arrives() {
    block_on(async {
        let registry = TunnelRegistry::new();
        registry.set_wait(Duration::from_secs(60));
        let (late, asked) = tunnel(&registry, "edge", "10.0.0.1:5000", Agent::Echo).await;
        let route = route("edge");
        let open = registry.open(&route, None, OPEN_TIMEOUT, None);
        let arrive = async {
            // The request looks first, finds none and waits; then the agent's tunnel comes.
            crate::runtime::yield_now().await;
            assert!(asked.borrow().is_empty());
            registry.add(late.clone());
        };
        let (opened, ()) = futures_util::join!(open, arrive);
        assert_eq!(round_trip(opened.unwrap(), b"late").await, b"late");
        assert_eq!(*asked.borrow(), ["/member"]);
    })
}

#[test]
fn an_agents_refusals_become_the_gateways_errors_and_the_tunnel_stays() {
    block_on(async {
        let route = route("edge");
        let service = wire::ServiceRef::parse("b/web:81").unwrap();
        let cases = [
            (
                Agent::Refuse(http::StatusCode::FORBIDDEN, "not allowed"),
                403,
                "service b/web:81",
            ),
            (
                Agent::Refuse(
                    http::StatusCode::BAD_GATEWAY,
                    "connecting to web.b.svc:81: Connection refused",
                ),
                503,
                "Connection refused",
            ),
            (Agent::Reset, 503, "the agent reset the stream"),
        ];
        for (script, code, says) in cases {
            let registry = TunnelRegistry::new();
            let (edge, _) = tunnel(&registry, "edge", "10.0.0.1:5000", script).await;
            registry.add(edge.clone());
            let error = registry
                .open(&route, Some(&service), OPEN_TIMEOUT, None)
                .await
                .err()
                .unwrap();
            assert_eq!(error.code_and_reason().0, code, "{error}");
            let text = format!(
                "{error} {}",
                std::error::Error::source(&error)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
            assert!(text.contains(says), "{text}");
            assert!(edge.is_alive(), "{text}");
            assert_eq!(registry.count("edge"), 1);
        }
    })
}
