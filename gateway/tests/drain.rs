//! Draining a changed or removed cluster through a real `fleetgate serve` process watching the
//! simulated fleet's directory. While a client keeps sending requests to an unchanged cluster
//! (member2), member1's file is rewritten (a changed token) or removed, and the test checks what
//! a user would see: member1's open watches (HTTP/1.1 chunked and h2) end cleanly (the chunked
//! body's last chunk, the h2 END_STREAM: no error on the client) within one second, its pooled
//! connections close, an exec session on it is closed, and new requests meet the new route (401
//! with the refused token, 404 once removed); member2's watch keeps receiving events and its
//! requests see zero failures.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use support::client::{cluster_file, Load, Sender};
use support::fleet::{with_refused_token, Fleet};
use support::kubectl::{kubectl_command, ran};
use support::wait::wait_for;
use tokio::sync::mpsc;

/// How soon after the file changes a watch of the changed cluster must have ended.
const WITHIN: Duration = Duration::from_secs(1);

fn start() -> Fleet {
    let mut fleet = Fleet::sim(2, 2);
    fleet.serve(&["--workers", "2"], Some("info,fleetgate::upstream=debug"));
    fleet
}

impl Fleet {
    /// A gauge of the gateway's `/metrics` (0 when the series is absent).
    fn gauge(&self, series: &str) -> i64 {
        self.metric(series).unwrap_or(0)
    }

    fn upstream_connections(&self, cluster: &str) -> i64 {
        self.gauge(&format!(
            "fleetgate_upstream_connections{{cluster=\"{cluster}\"}}"
        ))
    }

    fn kubectl(&self, context: &str) -> Command {
        let mut cmd = kubectl_command(&self.fleet_path("gateway.kubeconfig"), context);
        cmd.arg("--cache-dir")
            .arg(self.fleet_path("kube-cache"))
            .args(["--request-timeout", "20s"]);
        cmd
    }
}

/// What a watch task reports.
#[derive(Debug)]
enum WatchEvent {
    /// The response head arrived with this status.
    Head(u16),
    /// A piece of the body.
    Data(String),
    /// The body ended: `Ok` when cleanly (last chunk, END_STREAM), `Err` with hyper's error.
    End(Result<(), String>),
}

/// An open watch, read by a task of the fleet's runtime.
struct Watch {
    events: mpsc::UnboundedReceiver<WatchEvent>,
    seen: String,
}

impl Watch {
    fn open(fleet: &Fleet, path: &str, h2: bool) -> Watch {
        let (tx, events) = mpsc::unbounded_channel();
        let addrs = fleet.addrs();
        let target = path.to_owned();
        fleet.runtime.spawn(async move {
            let mut sender = match Sender::connect(&addrs, h2).await {
                Ok(sender) => sender,
                Err(e) => {
                    let _ = tx.send(WatchEvent::End(Err(e.to_string())));
                    return;
                }
            };
            let response = match sender.send("GET", &target, "").await {
                Ok(response) => response,
                Err(e) => {
                    let _ = tx.send(WatchEvent::End(Err(e)));
                    return;
                }
            };
            let _ = tx.send(WatchEvent::Head(response.status().as_u16()));
            let mut body = response.into_body();
            loop {
                match body.frame().await {
                    None => {
                        let _ = tx.send(WatchEvent::End(Ok(())));
                        return;
                    }
                    Some(Err(e)) => {
                        let _ = tx.send(WatchEvent::End(Err(format!("{e:?}"))));
                        return;
                    }
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            let text = String::from_utf8_lossy(&data).into_owned();
                            let _ = tx.send(WatchEvent::Data(text));
                        }
                    }
                }
            }
        });
        let mut watch = Watch {
            events,
            seen: String::new(),
        };
        match watch.next(Duration::from_secs(10)) {
            Some(WatchEvent::Head(200)) => {}
            other => panic!("watch {path} did not start: {other:?}"),
        }
        watch
    }

    fn next(&mut self, within: Duration) -> Option<WatchEvent> {
        let deadline = Instant::now() + within;
        loop {
            match self.events.try_recv() {
                Ok(WatchEvent::Data(text)) => {
                    self.seen.push_str(&text);
                    return Some(WatchEvent::Data(text));
                }
                Ok(event) => return Some(event),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the end of the body within `within`, returning how it ended.
    fn end(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(WatchEvent::End(how)) => return how,
                Some(_) => continue,
                None => panic!(
                    "the watch did not end within {within:?}; it saw: {}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for a piece of the body containing `needle`, failing if the watch ends first.
    fn saw(&mut self, needle: &str, within: Duration) {
        if self.seen.contains(needle) {
            return;
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(WatchEvent::Data(_)) if self.seen.contains(needle) => return,
                Some(WatchEvent::End(how)) => {
                    panic!("the watch ended ({how:?}) before {needle}: {}", self.seen)
                }
                Some(_) => continue,
                None => panic!(
                    "no {needle} within {within:?}; the watch saw: {}",
                    self.seen
                ),
            }
        }
    }
}

const UNCHANGED: &str = "/clusters/member2/api/v1/namespaces/default";
const CHANGED: &str = "/clusters/member1/api/v1/namespaces/default";

fn configmaps(member: &str) -> String {
    format!("/clusters/{member}/api/v1/namespaces/default/configmaps")
}

fn watch_path(member: &str) -> String {
    format!("{}?watch=true", configmaps(member))
}

/// Creates a ConfigMap on `member` through the gateway.
fn create_configmap(fleet: &Fleet, member: &str, name: &str) {
    let body = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"k":"v"}}}}"#
    );
    let (code, text) = fleet.request("POST", &configmaps(member), &body);
    assert_eq!(code, 201, "{text}");
}

/// Rewrites member1's token to one the member refuses: a spec change of member1 alone.
fn change_token(fleet: &Fleet) {
    let file = cluster_file(fleet.dir(), "member1");
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, with_refused_token(&good)).unwrap();
}

#[test]
fn a_changed_cluster_ends_its_watches_cleanly_and_closes_its_pooled_connections() {
    let fleet = start();
    let (code, body) = fleet.request("GET", CHANGED, "");
    assert_eq!(code, 200, "{body}");
    let load = Load::start(&fleet, UNCHANGED);
    // Pooled connections to member1 on the gateway.
    for _ in 0..4 {
        assert_eq!(fleet.request("GET", CHANGED, "").0, 200);
    }
    assert!(fleet.upstream_connections("member1") >= 1);

    let mut changed_h1 = Watch::open(&fleet, &watch_path("member1"), false);
    let mut changed_h2 = Watch::open(&fleet, &watch_path("member1"), true);
    let mut unchanged_h1 = Watch::open(&fleet, &watch_path("member2"), false);
    let mut unchanged_h2 = Watch::open(&fleet, &watch_path("member2"), true);
    // The watches run: an event reaches each.
    create_configmap(&fleet, "member1", "before-change");
    create_configmap(&fleet, "member2", "before-change");
    for watch in [
        &mut changed_h1,
        &mut changed_h2,
        &mut unchanged_h1,
        &mut unchanged_h2,
    ] {
        watch.saw("before-change", Duration::from_secs(5));
    }

    let changed_at = Instant::now();
    change_token(&fleet);
    assert_eq!(
        changed_h1.end(WITHIN.saturating_sub(changed_at.elapsed())),
        Ok(()),
        "the HTTP/1.1 watch of the changed cluster must end with its last chunk\n{}",
        fleet.log_tail(30)
    );
    assert_eq!(
        changed_h2.end(WITHIN.saturating_sub(changed_at.elapsed()) + Duration::from_millis(50)),
        Ok(()),
        "the h2 watch of the changed cluster must end with END_STREAM\n{}",
        fleet.log_tail(30)
    );
    eprintln!(
        "member1's watches ended {:?} after the change",
        changed_at.elapsed()
    );
    // No connection made with the old token is left, pooled or streaming.
    wait_for(
        "member1's upstream connections to close",
        Duration::from_secs(1),
        || fleet.upstream_connections("member1") == 0,
    );
    // A new request meets the new spec: the member refuses the new token.
    assert_eq!(fleet.request("GET", CHANGED, "").0, 401);

    // member2's watches are the same streams as before and still carry events.
    create_configmap(&fleet, "member2", "after-change");
    unchanged_h1.saw("after-change", Duration::from_secs(5));
    unchanged_h2.saw("after-change", Duration::from_secs(5));
    assert!(fleet.upstream_connections("member2") >= 1);
    load.finish(&fleet);
}

#[test]
fn a_removed_cluster_ends_its_watches_and_exec_sessions() {
    let fleet = start();
    let run = fleet
        .kubectl("member1")
        .args(["run", "drain-sleeper", "-n", "default", "--image=busybox"])
        .output()
        .unwrap();
    ran(run, "kubectl run");
    let load = Load::start(&fleet, UNCHANGED);
    let mut exec = fleet
        .kubectl("member1")
        .args([
            "exec",
            "drain-sleeper",
            "-n",
            "default",
            "--",
            "sleep",
            "infinity",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the exec session to open", Duration::from_secs(30), || {
        fleet.member_stream_sessions("member1", "default", "drain-sleeper") == 1
    });
    wait_for(
        "the gateway to count the exec stream",
        Duration::from_secs(10),
        || fleet.gauge("fleetgate_upgraded_streams") == 1,
    );
    let mut removed = Watch::open(&fleet, &watch_path("member1"), false);
    let mut unchanged = Watch::open(&fleet, &watch_path("member2"), false);

    let removed_at = Instant::now();
    std::fs::remove_file(cluster_file(fleet.dir(), "member1")).unwrap();
    assert_eq!(
        removed.end(WITHIN),
        Ok(()),
        "the watch of the removed cluster must end with its last chunk\n{}",
        fleet.log_tail(30)
    );
    eprintln!(
        "member1's watch ended {:?} after the removal",
        removed_at.elapsed()
    );
    // The exec session is closed: kubectl exits, the member's session ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = exec.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = exec.kill();
            panic!(
                "kubectl exec still runs 10 s after its cluster was removed\n{}",
                fleet.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "kubectl exec exited ({status}) {:?} after the removal",
        removed_at.elapsed()
    );
    wait_for(
        "the member's exec session to end",
        Duration::from_secs(10),
        || fleet.member_stream_sessions("member1", "default", "drain-sleeper") == 0,
    );
    assert_eq!(fleet.gauge("fleetgate_upgraded_streams"), 0);
    wait_for(
        "member1's upstream connections to close",
        Duration::from_secs(1),
        || fleet.upstream_connections("member1") == 0,
    );
    let (code, body) = fleet.request("GET", CHANGED, "");
    assert_eq!(code, 404, "{body}");

    create_configmap(&fleet, "member2", "after-removal");
    unchanged.saw("after-removal", Duration::from_secs(5));
    load.finish(&fleet);
}
