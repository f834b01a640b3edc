//! Strangers at the tunnel listener cannot keep an agent out (issue 31 item 2: 258 idle
//! connections once delayed every agent's handshake by 9.5 s, and a restarted agent's cluster
//! answered 503 meanwhile).
//!
//! A thousand connections from forty-one loopback addresses (the agent's own, 127.0.0.1, among
//! them, with more than its bound) that send nothing, one byte, or a TLS record header and then
//! nothing, each opened again as soon as the gateway closes it; meanwhile member2's agent is
//! restarted, and its cluster must answer through the gateway within 1 s of the agent's start.
//! The flood's refusals must not flood the gateway's log either.
//!
//! A binary of its own, so that no other test's fleet takes the two cores while it times the
//! agent. Readiness is the `ready` lines and the flood's own count of open connections, never a
//! sleep; every address is 127.0.0.x with port 0.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::fleet::{fleetgate_binary, Fleet};
use support::pull::{
    agent_command, issue_agent, make_pull_mode, serve_with_tunnel, without_ansi, Agent, AgentSetup,
};
use support::wait::wait_for;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one stranger sends before it goes quiet.
#[derive(Debug, Clone, Copy)]
enum Stranger {
    Nothing,
    OneByte,
    /// A TLS handshake record header announcing 512 bytes that never come (a slow-loris
    /// ClientHello).
    RecordHeader,
}

impl Stranger {
    fn bytes(self) -> &'static [u8] {
        match self {
            Stranger::Nothing => b"",
            Stranger::OneByte => b"\x16",
            Stranger::RecordHeader => b"\x16\x03\x01\x02\x00",
        }
    }
}

/// Strangers kept connected to a listener by a thread of their own until dropped: each one
/// connects from its source address, sends its bytes and waits for the gateway to close it, then
/// connects again ([`RECONNECT_EVERY`] at the most, so those cut for one another, beyond the
/// listener's bounds, do not take the machine's two cores from the agent being timed).
struct Flood {
    counts: Arc<Counts>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(target: SocketAddr, strangers: Vec<(Ipv4Addr, Stranger)>) -> Flood {
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let shared = counts.clone();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                for (source, kind) in strangers {
                    tokio::spawn(stranger(source, kind, target, shared.clone()));
                }
                let _ = stopped.await;
            })
        });
        Flood {
            counts,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How often one stranger connects at the most.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Counts {
    /// Strangers that have connected at least once.
    connected: AtomicUsize,
    /// Strangers connected now.
    open: AtomicUsize,
    /// Connections made since the start.
    made: AtomicUsize,
    /// Connections made again by strangers that send nothing.
    silent_again: AtomicUsize,
}

impl Counts {
    fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }
}

async fn stranger(source: Ipv4Addr, kind: Stranger, target: SocketAddr, counts: Arc<Counts>) {
    let mut pace = tokio::time::interval(RECONNECT_EVERY);
    let mut first = true;
    loop {
        pace.tick().await;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        let Ok(mut tcp) = socket.connect(target).await else {
            // Refused (the gateway gone at the end of the test): nothing more to do.
            return;
        };
        counts.made.fetch_add(1, Ordering::Relaxed);
        if std::mem::take(&mut first) {
            counts.connected.fetch_add(1, Ordering::Relaxed);
        } else if matches!(kind, Stranger::Nothing) {
            counts.silent_again.fetch_add(1, Ordering::Relaxed);
        }
        counts.open.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.write_all(kind.bytes()).await;
        // Until the gateway closes it (or answers with an alert).
        let _ = tcp.read(&mut [0u8; 64]).await;
        counts.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// 1,000 strangers: 40 from 127.0.0.1 (the agent's address; its bound is 32) and 24 from each
/// of 127.0.0.2..=127.0.0.41; six in ten send nothing, one a byte, three a record header (300:
/// more than the 256 handshakes the listener holds).
fn strangers() -> Vec<(Ipv4Addr, Stranger)> {
    let sources = std::iter::repeat_n(Ipv4Addr::new(127, 0, 0, 1), 40)
        .chain((2..=41).flat_map(|last| std::iter::repeat_n(Ipv4Addr::new(127, 0, 0, last), 24)));
    sources
        .enumerate()
        .map(|(i, source)| {
            let kind = match i % 10 {
                0..=5 => Stranger::Nothing,
                6 => Stranger::OneByte,
                _ => Stranger::RecordHeader,
            };
            (source, kind)
        })
        .collect()
}

#[test]
fn a_flood_of_idle_connections_does_not_keep_a_restarted_agent_out() {
    let mut fleet = Fleet::sim(2, 5);
    let member2 = make_pull_mode(&fleet, "member2");
    issue_agent(&fleet.fleet_path("agents"), "member2");
    let tunnel = serve_with_tunnel(&mut fleet, &[]);
    let mut agents = 0;
    let mut agent_command_for = |fleet: &Fleet| {
        agents += 1;
        let setup = AgentSetup {
            cluster: "member2",
            identity: fleet.fleet_path("agents/agent-member2"),
            kube_server: &member2,
            kube_ca: fleet.fleet_path("agents/member2-kube-ca.crt"),
            log: fleet.path(&format!("agent-{agents}.log")),
        };
        let command = agent_command(Command::new(fleetgate_binary()), fleet, &[tunnel], &setup);
        (command, setup.log)
    };
    let answers = |fleet: &Fleet| {
        fleet
            .https_get("/clusters/member2/api/v1/namespaces/dev")
            .starts_with("HTTP/1.1 200")
    };
    let (command, log) = agent_command_for(&fleet);
    let agent = Agent::start(command, &log, || fleet.log_tail(30));
    assert!(answers(&fleet));

    // The flood: every stranger connected, and the silent ones closed by the gateway (after 2 s)
    // and connected again, as the issue's were every 9 s. At most 8 s: on the old listener most
    // of them stayed in the kernel's queue, and the agent's timing below is what fails.
    let flood = Flood::start(tunnel, strangers());
    let flooded = Instant::now();
    let cycled = || {
        Counts::get(&flood.counts.connected) >= 1000
            && Counts::get(&flood.counts.silent_again) >= 600
    };
    while !cycled() && flooded.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(20));
    }

    // The agent dies and comes back in the middle of it: its cluster answers within 1 s.
    drop(agent);
    let (command, log) = agent_command_for(&fleet);
    let started = Instant::now();
    let _agent = Agent::start(command, &log, || fleet.log_tail(30));
    let ready = started.elapsed();
    assert!(answers(&fleet), "{}", fleet.log_tail(30));
    let answered = started.elapsed();
    let open = Counts::get(&flood.counts.open);
    eprintln!(
        "member2 answered {answered:?} after its agent started (ready after {ready:?}), {open} strangers connected, {} connections made",
        Counts::get(&flood.counts.made)
    );
    assert!(
        answered < Duration::from_secs(1),
        "member2 answered {answered:?} after its agent started (ready after {ready:?}), with {open} strangers connected"
    );
    // The strangers were there all along: the gateway closes the silent ones after 2 s, and
    // those beyond its bounds at once, and they connect again.
    assert!(open >= 800, "{open} strangers connected");

    // The log: refusals one by one at most ten a second, the rest summed up.
    let summary = "more connections refused at the tunnel listener";
    wait_for("a summary of refusals", Duration::from_secs(15), || {
        fleet.log().contains(summary)
    });
    let seconds = flooded.elapsed().as_secs() + 2;
    let made = Counts::get(&flood.counts.made);
    drop(flood);
    let log = without_ansi(&fleet.log());
    let one_by_one = log.lines().filter(|l| l.contains("agent refused")).count();
    assert!(
        one_by_one as u64 <= 10 * seconds + 10,
        "{one_by_one} refusal lines in about {seconds} s, for {made} stranger connections"
    );
    let summed_up = log
        .lines()
        .find(|l| l.contains(summary) && l.contains("busiest=127.0.0."));
    assert!(summed_up.is_some(), "{log}");
    eprintln!(
        "{one_by_one} refusal lines in about {seconds} s, for {made} stranger connections; {}",
        summed_up.unwrap_or_default()
    );
    assert!(!log.contains("panicked"));
}
