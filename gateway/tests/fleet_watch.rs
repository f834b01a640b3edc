//! The fleet view's merged WATCH (`/fleet`) against a simulated fleet: `kubectl get -A -w`
//! follows every member with a CLUSTER column; a watch resumes from the composite
//! resourceVersion of a list or of any event and loses nothing; a member cut off mid-watch is
//! told about and comes back without losing its events; a cluster that joins the view appears in
//! the open watch as ADDED events and one that leaves ends its part, the watch staying open; a
//! member's expired resourceVersion ends the watch with the member's exact 410 ERROR event;
//! each user's watch spans only the clusters their AccessPolicies allow; a member whose watch
//! stalls (the simulated member's fault switch) holds up no other, and its events made meanwhile
//! arrive once it moves again, each once, in the same client watch. And a LIST whose member dies
//! after the head went out is cut rather than silently short (the next one names it).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::Value;
use support::client::{cluster_file, Sender};
use support::fleet::{Fleet, KillOnDrop, ServeProcess};
use support::kubectl::kubectl_command;

/// How long a test waits for an event it expects (a bound, not a pause).
const WITHIN: Duration = Duration::from_secs(20);

/// A watch's body, line by line as it arrives (read on the fleet's runtime).
struct Watch {
    lines: Receiver<String>,
}

impl Watch {
    /// The next event; `None` once the stream ended.
    fn next(&self) -> Option<Value> {
        match self.lines.recv_timeout(WITHIN) {
            Ok(line) => Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("no event within {WITHIN:?}"),
        }
    }

    /// Events up to and including the first that `done` accepts.
    fn until(&self, what: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let event = self
                .next()
                .unwrap_or_else(|| panic!("the watch ended before {what}: {seen:#?}"));
            let last = done(&event);
            seen.push(event);
            if last {
                return seen;
            }
        }
    }
}

impl Fleet {
    /// Opens a watch through the gateway as the fleet's admin; its status and body.
    fn watch(&self, path: &str) -> (u16, Watch) {
        let addrs = self.addrs();
        let path = path.to_owned();
        let (lines, received) = std::sync::mpsc::channel();
        let (status, head) = std::sync::mpsc::channel();
        self.runtime.spawn(async move {
            let mut sender = Sender::connect(&addrs, false).await.unwrap();
            let response = sender.send("GET", &path, "").await.unwrap();
            let _ = status.send(response.status().as_u16());
            let mut body = response.into_body();
            let mut partial = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                partial.extend_from_slice(data);
                while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line).trim().to_owned();
                    if !line.is_empty() && lines.send(line).is_err() {
                        return;
                    }
                }
            }
        });
        let status = head.recv_timeout(WITHIN).expect("a response head");
        (status, Watch { lines: received })
    }

    /// A fleet LIST as the admin: its composite resourceVersion and items.
    fn fleet_list(&self, path: &str) -> (String, Vec<Value>) {
        let (code, body) = self.request("GET", path, "");
        assert_eq!(code, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        (
            list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_owned(),
            list["items"].as_array().unwrap().clone(),
        )
    }

    fn create_configmap(&self, member: &str, name: &str) {
        self.kubectl_ok(
            member,
            &[
                "create",
                "configmap",
                name,
                "-n",
                "default",
                "--from-literal=k=v",
            ],
        );
    }
}

/// The cluster an event's object is stamped with (both annotations, equal).
fn cluster_of(event: &Value) -> &str {
    let annotations = &event["object"]["metadata"]["annotations"];
    assert_eq!(
        annotations["fleetgate.io/cluster"], annotations["resource.karmada.io/cached-from-cluster"],
        "{event}"
    );
    annotations["fleetgate.io/cluster"].as_str().unwrap_or("")
}

fn name_of(event: &Value) -> &str {
    event["object"]["metadata"]["name"].as_str().unwrap_or("")
}

/// Each member's resourceVersion in a composite one.
fn versions(composite: &str) -> BTreeMap<String, String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(composite)
        .unwrap_or_else(|e| panic!("{e}: {composite}"));
    serde_json::from_slice(&bytes).unwrap()
}

fn is_state(event: &Value, cluster: &str, state: &str) -> bool {
    let annotations = &event["object"]["metadata"]["annotations"];
    event["type"] == "BOOKMARK"
        && annotations["fleetgate.io/cluster"] == cluster
        && annotations["fleetgate.io/cluster-state"] == state
}

/// `kubectl --context fleet ARGS` running (killed when dropped), and its stdout line by line.
fn kubectl_lines(fleet: &Fleet, args: &[&str]) -> (KillOnDrop, Receiver<String>) {
    kubectl_lines_with(&fleet.gateway_kubeconfig(), "fleet", args)
}

fn kubectl_lines_with(
    kubeconfig: &std::path::Path,
    context: &str,
    args: &[&str],
) -> (KillOnDrop, Receiver<String>) {
    let mut child = KillOnDrop(
        kubectl_command(kubeconfig, context)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, lines)
}

#[test]
fn kubectl_get_w_follows_every_member_with_a_cluster_column() {
    let mut fleet = Fleet::sim(10, 1);
    fleet.serve(&["--workers", "2"], None);
    let (_kubectl, rows) = kubectl_lines(&fleet, &["get", "pods", "-A", "-w"]);
    let next_row = || {
        rows.recv_timeout(WITHIN)
            .unwrap_or_else(|_| panic!("kubectl printed nothing within {WITHIN:?}"))
    };
    let header = next_row();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(columns[..3], ["NAMESPACE", "CLUSTER", "NAME"], "{header}");
    // The listed pods of every member, then the watch.
    let mut clusters = BTreeSet::new();
    while clusters.len() < 10 {
        let row = next_row();
        clusters.insert(row.split_whitespace().nth(1).unwrap().to_owned());
    }
    assert_eq!(
        clusters,
        (1..=10)
            .map(|k| format!("member{k}"))
            .collect::<BTreeSet<_>>()
    );
    // A pod created in member2 (through its own context) shows up in the open watch.
    fleet.kubectl_ok(
        "member2",
        &["run", "watched", "--image=busybox", "-n", "default"],
    );
    let deadline = Instant::now() + WITHIN;
    loop {
        assert!(Instant::now() < deadline, "the new pod never showed");
        let row = next_row();
        let cells: Vec<&str> = row.split_whitespace().collect();
        if cells.get(2) == Some(&"watched") {
            assert_eq!(cells[..2], ["default", "member2"], "{row}");
            break;
        }
    }
}

#[test]
fn a_watch_resumes_from_a_composite_resource_version_and_loses_nothing() {
    let mut fleet = Fleet::sim(3, 2);
    fleet.serve(&["--workers", "2"], None);
    let (listed, items) = fleet.fleet_list("/fleet/api/v1/configmaps");
    assert!(!items.is_empty());
    assert_eq!(
        versions(&listed).keys().collect::<Vec<_>>(),
        ["member1", "member2", "member3"]
    );

    // Changes after the list, in two members.
    fleet.create_configmap("member1", "after-1");
    fleet.create_configmap("member3", "after-3");
    let (code, watch) = fleet.watch(&format!(
        "/fleet/api/v1/configmaps?watch=1&resourceVersion={listed}"
    ));
    assert_eq!(code, 200);
    let mut seen = BTreeSet::new();
    let mut last = String::new();
    while seen.len() < 2 {
        let event = watch.next().expect("the watch stays open");
        assert_eq!(
            event["type"], "ADDED",
            "only the changes after the list: {event}"
        );
        seen.insert((cluster_of(&event).to_owned(), name_of(&event).to_owned()));
        last = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
        // Every event's resourceVersion is the whole fleet's.
        assert_eq!(versions(&last).len(), 3, "{event}");
    }
    assert_eq!(
        seen,
        [("member1", "after-1"), ("member3", "after-3")]
            .map(|(c, n)| (c.to_owned(), n.to_owned()))
            .into_iter()
            .collect()
    );
    drop(watch);

    // Resumed from the last event: what happened since, and nothing before.
    fleet.create_configmap("member2", "after-2");
    let (_, resumed) = fleet.watch(&format!(
        "/fleet/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={last}"
    ));
    let event = resumed.next().unwrap();
    assert_eq!(
        (event["type"].as_str(), cluster_of(&event), name_of(&event)),
        (Some("ADDED"), "member2", "after-2"),
        "{event}"
    );

    // A resourceVersion the fleet view did not write is refused before any member is asked.
    for bad in ["12345", "not-base64!", "eyJtZW1iZXIxIjoxfQ"] {
        let (code, body) = fleet.request(
            "GET",
            &format!("/fleet/api/v1/configmaps?watch=1&resourceVersion={bad}"),
            "",
        );
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("\"kind\":\"Status\""), "{body}");
    }
}

#[test]
fn an_expired_member_resource_version_ends_the_watch_with_410() {
    let mut fleet = Fleet::sim_with("", 2, 1, &["--history-window", "3"]);
    fleet.serve(&["--workers", "1"], None);
    let (listed, _) = fleet.fleet_list("/fleet/api/v1/configmaps");
    // member1 moves past its history window.
    for k in 0..5 {
        fleet.create_configmap("member1", &format!("churn-{k}"));
    }
    let (code, watch) = fleet.watch(&format!(
        "/fleet/api/v1/configmaps?watch=1&resourceVersion={listed}"
    ));
    assert_eq!(code, 200);
    let events = watch.until("the ERROR event", |e| e["type"] == "ERROR");
    let status = &events.last().unwrap()["object"];
    assert_eq!(status["code"], 410, "{status}");
    assert_eq!(status["reason"], "Expired", "{status}");
    // The member's own event, exactly: its message names member1's part of the version.
    let member1 = &versions(&listed)["member1"];
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("too old resource version: {member1} (")),
        "{status}"
    );
    let fields: Vec<&str> = status
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "apiVersion",
            "code",
            "kind",
            "message",
            "metadata",
            "reason",
            "status"
        ],
        "{status}"
    );
    assert!(watch.next().is_none(), "the watch ends after the 410");
}

/// A TCP relay in front of a member that can be cut (every connection dropped, new ones refused)
/// and restored: the member, as the gateway sees it, dies and comes back.
struct Relay {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    fn start(fleet: &Fleet, member: SocketAddr) -> Relay {
        let listener = fleet
            .runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, is_cut) = tokio::sync::watch::channel(false);
        fleet.runtime.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if *is_cut.borrow() {
                    continue;
                }
                let mut cut_now = is_cut.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(member).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cut_now.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Relay { addr, cut }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn restore(&self) {
        self.cut.send_replace(false);
    }
}

/// The server `member`'s Cluster file names.
fn server_of(fleet: &Fleet, member: &str) -> String {
    let yaml = std::fs::read_to_string(cluster_file(fleet.dir(), member)).unwrap();
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .trim_matches('"')
        .to_owned()
}

/// Points `member`'s Cluster file at `server` instead.
fn repoint(fleet: &Fleet, member: &str, server: &str) {
    let file = cluster_file(fleet.dir(), member);
    let yaml = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, yaml.replace(&server_of(fleet, member), server)).unwrap();
}

#[test]
fn members_failing_joining_and_leaving_keep_the_watch_open() {
    let mut fleet = Fleet::sim(3, 1);
    // member2 is reached through a relay the test can cut; member3 is not in the view yet.
    let member2 = server_of(&fleet, "member2");
    let relay = Relay::start(
        &fleet,
        member2.trim_start_matches("https://").parse().unwrap(),
    );
    repoint(&fleet, "member2", &format!("https://{}", relay.addr));
    let member3_file = cluster_file(fleet.dir(), "member3");
    let parked = fleet.dir().join("clusters/member3.parked");
    std::fs::rename(&member3_file, &parked).unwrap();
    fleet.serve(&["--workers", "1"], Some("info"));

    let (listed, _) = fleet.fleet_list("/fleet/api/v1/configmaps");
    let (code, watch) = fleet.watch(&format!(
        "/fleet/api/v1/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={listed}"
    ));
    assert_eq!(code, 200);

    // member2 dies: its part is said to be unreachable; member1's events keep coming.
    relay.cut();
    watch.until("member2 unreachable", |e| {
        is_state(e, "member2", "Unreachable")
    });
    fleet.create_configmap("member1", "while-cut");
    watch.until("member1's event", |e| name_of(e) == "while-cut");
    // A change made in member2 while the gateway could not reach it (straight at the member).
    let direct = fleet.fleet_path("kubeconfig");
    let made = support::kubectl::kubectl(
        &direct,
        "member2",
        &["create", "configmap", "missed", "-n", "default"],
    );
    assert!(made.status.success(), "{made:?}");
    // member2 comes back: its part resumes where it was, so the change is not lost.
    relay.restore();
    let back = watch.until("member2's missed change", |e| name_of(e) == "missed");
    assert_eq!(cluster_of(back.last().unwrap()), "member2");
    assert!(
        back.iter().any(|e| is_state(e, "member2", "Reachable")),
        "{back:#?}"
    );

    // member3 joins the view: its objects arrive as ADDED events in the open watch.
    std::fs::rename(&parked, &member3_file).unwrap();
    let joined = watch.until("member3's objects", |e| {
        e["type"] == "ADDED" && cluster_of(e) == "member3"
    });
    assert!(
        joined.iter().any(|e| is_state(e, "member3", "Joined")),
        "{joined:#?}"
    );
    // member1 leaves: its part ends, the watch stays open for the others.
    std::fs::remove_file(cluster_file(fleet.dir(), "member1")).unwrap();
    watch.until("member1 left", |e| is_state(e, "member1", "Left"));
    fleet.create_configmap("member3", "after-leave");
    let after = watch.until("member3's new object", |e| name_of(e) == "after-leave");
    // The composite resourceVersion no longer names member1.
    let last = after.last().unwrap()["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap();
    assert_eq!(
        versions(last).keys().collect::<Vec<_>>(),
        ["member2", "member3"]
    );
}

#[test]
fn each_users_watch_spans_only_the_clusters_their_policies_allow() {
    let mut fleet = Fleet::sim(3, 1);
    fleet.serve(&["--workers", "1"], None);
    // alice may read namespace `dev` in the env=dev clusters, member1 and member3.
    let (_kubectl, lines) = kubectl_lines(
        &fleet,
        &[
            "--user",
            "alice",
            "get",
            "configmaps",
            "-n",
            "dev",
            "-w",
            "-o",
            "json",
        ],
    );
    // (cluster, name) of what kubectl printed next (a List's items, or one object).
    let next = || -> Vec<(String, String)> {
        // `-o json` prints one object after another, each a block ending with `}` at column 0.
        let mut text = String::new();
        loop {
            let line = lines
                .recv_timeout(WITHIN)
                .expect("alice's watch printed nothing");
            text.push_str(&line);
            if line == "}" {
                break;
            }
        }
        let value: Value = serde_json::from_str(&text).unwrap();
        let objects = match value["items"].as_array() {
            Some(items) => items.clone(),
            None => vec![value],
        };
        objects
            .iter()
            .map(|o| {
                let meta = &o["metadata"];
                (
                    meta["annotations"]["fleetgate.io/cluster"]
                        .as_str()
                        .unwrap_or_else(|| panic!("not stamped: {o}"))
                        .to_owned(),
                    meta["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    // What alice could see before: member1's and member3's, never member2's.
    let before = next();
    assert!(!before.is_empty());
    // Each of the three members gets a new ConfigMap in `dev`; alice's open watch shows
    // member1's and member3's, never member2's.
    for member in ["member2", "member1", "member3"] {
        fleet.kubectl_ok(
            member,
            &[
                "create",
                "configmap",
                &format!("new-in-{member}"),
                "-n",
                "dev",
            ],
        );
    }
    let mut seen: Vec<(String, String)> = before;
    while !["member1", "member3"]
        .iter()
        .all(|m| seen.iter().any(|(_, n)| *n == format!("new-in-{m}")))
    {
        seen.extend(next());
    }
    for (cluster, name) in &seen {
        assert_ne!(cluster, "member2", "{name}");
    }
    let seen: BTreeSet<String> = seen.into_iter().map(|(_, n)| n).collect();
    assert!(!seen.contains("new-in-member2"));
}

#[test]
fn a_karmada_style_kubeconfig_lists_and_watches_through_the_karmada_search_path() {
    let mut fleet = Fleet::sim(2, 1);
    fleet.serve(&["--workers", "1"], None);
    // A kubeconfig as a Karmada user has it for karmada-search: one cluster whose server is the
    // proxying path, the fleet's credentials.
    let gateway: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(fleet.gateway_kubeconfig()).unwrap())
            .unwrap();
    let named = |list: &str, name: &str| -> serde_yaml::Value {
        gateway[list]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list}"))
            .clone()
    };
    let context = named("contexts", "fleet");
    let mut cluster = named("clusters", context["context"]["cluster"].as_str().unwrap());
    let user = named("users", context["context"]["user"].as_str().unwrap());
    let server = format!(
        "https://{}/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy",
        fleet.https()
    );
    cluster["cluster"]["server"] = server.into();
    cluster["name"] = "karmada-apiserver".into();
    let karmada = serde_yaml::to_string(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [user],
        "contexts": [{"name": "karmada-apiserver", "context": {
            "cluster": "karmada-apiserver", "user": context["context"]["user"]}}],
        "current-context": "karmada-apiserver",
    }))
    .unwrap();
    let kubeconfig = fleet.path("karmada.kubeconfig");
    std::fs::write(&kubeconfig, karmada).unwrap();

    let listed = support::kubectl::succeeded(
        support::kubectl::kubectl(&kubeconfig, "karmada-apiserver", &["get", "pods", "-A"]),
        "list through karmada-search's path",
        &fleet.log_tail(20),
    );
    let clusters: BTreeSet<&str> = listed
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(clusters, ["member1", "member2"].into_iter().collect());

    let (_kubectl, rows) = kubectl_lines_with(
        &kubeconfig,
        "karmada-apiserver",
        &["get", "pods", "-A", "-w"],
    );
    // Header and the two listed pods, then a new one from member1.
    for _ in 0..3 {
        rows.recv_timeout(WITHIN).expect("the listed pods");
    }
    fleet.kubectl_ok(
        "member1",
        &["run", "karmada-watched", "--image=busybox", "-n", "default"],
    );
    loop {
        let row = rows.recv_timeout(WITHIN).expect("the new pod");
        let cells: Vec<&str> = row.split_whitespace().collect();
        if cells.get(2) == Some(&"karmada-watched") {
            assert_eq!(cells[1], "member1", "{row}");
            break;
        }
    }
}

#[test]
fn a_list_whose_member_dies_after_the_head_is_cut_and_the_next_one_names_it() {
    // Each member has 2000 ConfigMaps, read ten a page: member1's part takes 200 member requests
    // before member2's, which is reached through a relay the test cuts as soon as the head
    // arrived.
    let mut fleet = Fleet::sim(2, 2000);
    fleet.set_fleet_spec("pageSize: 10");
    let member2 = server_of(&fleet, "member2");
    let relay = Relay::start(
        &fleet,
        member2.trim_start_matches("https://").parse().unwrap(),
    );
    repoint(&fleet, "member2", &format!("https://{}", relay.addr));
    fleet.serve(&["--workers", "1"], None);

    let addrs = fleet.addrs();
    let (head, head_seen) = std::sync::mpsc::channel();
    let (cut, cut_done) = tokio::sync::oneshot::channel::<()>();
    let body = fleet.runtime.spawn(async move {
        let mut sender = Sender::connect(&addrs, false).await.unwrap();
        let response = sender
            .send("GET", "/fleet/api/v1/configmaps", "")
            .await
            .unwrap();
        head.send(response.status().as_u16()).unwrap();
        // The body is read only once the member is gone.
        let _ = cut_done.await;
        response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().len())
    });
    assert_eq!(head_seen.recv_timeout(WITHIN).unwrap(), 200);
    relay.cut();
    cut.send(()).unwrap();
    let read = fleet.runtime.block_on(body).unwrap();
    assert!(
        read.is_err(),
        "a list short of member2's objects ended as if complete ({read:?} bytes)"
    );

    // The next list names member2 in a Warning and has member1's objects.
    let out = fleet.kubectl_output("fleet", &["get", "configmaps", "-A", "-o", "name"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}\n{}", fleet.log_tail(20));
    assert!(
        stderr.contains("Warning") && stderr.contains("member2"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).lines().count() >= 2000,
        "member1's objects"
    );
}

#[test]
fn an_unpaged_list_read_ahead_in_small_pages_has_every_object_once() {
    // Three members of 30 ConfigMaps read four a page: the members' later pages are read ahead
    // of the writer; the merged list must still be every object once, in
    // cluster order.
    let mut fleet = Fleet::sim(3, 30);
    fleet.set_fleet_spec("pageSize: 4");
    fleet.serve(&["--workers", "1"], None);
    let (_, items) = fleet.fleet_list("/fleet/api/v1/configmaps");
    let merged: Vec<(String, String, String)> = items
        .iter()
        .map(|item| {
            let meta = &item["metadata"];
            (
                meta["annotations"]["fleetgate.io/cluster"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                meta["namespace"].as_str().unwrap().to_owned(),
                meta["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut want = Vec::new();
    for member in ["member1", "member2", "member3"] {
        let (code, body) =
            fleet.request("GET", &format!("/clusters/{member}/api/v1/configmaps"), "");
        assert_eq!(code, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        for item in list["items"].as_array().unwrap() {
            want.push((
                member.to_owned(),
                item["metadata"]["namespace"].as_str().unwrap().to_owned(),
                item["metadata"]["name"].as_str().unwrap().to_owned(),
            ));
        }
    }
    assert!(want.len() >= 90, "{}", want.len());
    assert_eq!(merged, want, "every object once, in cluster order");
}

/// Sets `member`'s fault switches (`/debug/sim/faults`, a JSON object) on the member itself, as
/// the fleet's admin.
fn set_faults(fleet: &Fleet, member: &str, faults: &str) {
    let file = fleet.path(&format!("faults-{member}.json"));
    std::fs::write(&file, faults).unwrap();
    let args = [
        "create",
        "--raw",
        "/debug/sim/faults",
        "-f",
        file.to_str().unwrap(),
    ];
    let set = support::kubectl::kubectl(&fleet.fleet_path("kubeconfig"), member, &args);
    assert!(set.status.success(), "{set:?}");
}

#[test]
fn a_stalled_member_holds_up_no_other_and_its_events_arrive_once_it_moves_again() {
    let mut fleet = Fleet::sim(2, 1);
    // A stall deadline of a second (the gateway's own is 150 s: kube-apiserver sends a bookmark
    // about every minute).
    let config = fleet.dir().to_owned();
    let args = [
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("--workers"),
        OsStr::new("1"),
    ];
    let env = [
        ("FLEETGATE_WATCH_STALL_AFTER_MS", "1000"),
        ("RUST_LOG", "fleetgate=info"),
    ];
    let (child, ready) = support::fleet::spawn_serve(args, &env, &fleet.path("gateway.log"));
    fleet.gateway = Some(ServeProcess {
        child: KillOnDrop(child),
        ready,
    });
    let create = |member: &str, name: &str| {
        let args = ["create", "configmap", name, "-n", "default"];
        let made = support::kubectl::kubectl(&fleet.fleet_path("kubeconfig"), member, &args);
        assert!(made.status.success(), "{made:?}");
    };

    let (listed, _) = fleet.fleet_list("/fleet/api/v1/configmaps");
    let (code, watch) = fleet.watch(&format!(
        "/fleet/api/v1/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={listed}"
    ));
    assert_eq!(code, 200);
    // member2's watches stall: the open one sends nothing more, new ones get no answer.
    set_faults(&fleet, "member2", r#"{"stallWatches": true}"#);
    create("member2", "stalled-1");
    create("member2", "stalled-2");
    // member1's events keep coming, before and after the gateway gave up on member2's watch.
    create("member1", "flowing-1");
    let mut seen = watch.until("member1's first event", |e| name_of(e) == "flowing-1");
    support::wait::wait_for_or(
        "the gateway to abandon member2's silent watch",
        WITHIN,
        || {
            fleet
                .log()
                .contains("member sent nothing past the stall deadline")
        },
        || fleet.log_tail(20),
    );
    create("member1", "flowing-2");
    seen.extend(watch.until("member1's second event", |e| name_of(e) == "flowing-2"));
    assert!(
        !seen.iter().any(|e| name_of(e).starts_with("stalled")),
        "{seen:#?}"
    );
    // member2 moves again: what it did meanwhile arrives in the same watch, then what follows.
    set_faults(&fleet, "member2", r#"{"stallWatches": false}"#);
    seen.extend(watch.until("member2's events", |e| name_of(e) == "stalled-2"));
    create("member2", "after");
    seen.extend(watch.until("member2's next event", |e| name_of(e) == "after"));
    let objects: Vec<(&str, &str)> = seen
        .iter()
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| (cluster_of(e), name_of(e)))
        .collect();
    for (cluster, name) in [
        ("member1", "flowing-1"),
        ("member1", "flowing-2"),
        ("member2", "stalled-1"),
        ("member2", "stalled-2"),
        ("member2", "after"),
    ] {
        let times = objects.iter().filter(|o| **o == (cluster, name)).count();
        assert_eq!(times, 1, "{name} from {cluster}: {objects:?}");
    }
}
