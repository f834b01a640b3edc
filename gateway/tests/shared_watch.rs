//! Shared watches (issue 15, docs/watches.md) as users meet them: many kubectl and kube-rs
//! watches of configmaps through the gateway cost the member one watch per shared key, every
//! client sees every change in order, even as the member keeps ending the gateway's watch; a
//! resourceVersion that left the ring gets the apiserver's 410; and a user the member does not
//! let watch gets the member's own 403. The watch that starts a hub, and the informers that resume
//! on a restarted gateway, are served from a replay of the member's history, not proxied. A
//! member that restarts, and then forbids the gateway for a while as a restarted kube-apiserver
//! does until its RBAC cache has synced, breaks no shared watch and no merged one: each resumes
//! from its last resourceVersion, and every client sees every change once.

// The test's own kube-rs watchers record what they saw under a std Mutex: test code, off the
// gateway's shards.
#![allow(clippy::disallowed_types)]

mod support;

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use support::fleet::Fleet;
use support::front::{gateway_client, Front};
use support::kubectl::{get_configmap, kubectl, kubectl_command};
use support::wait::{wait_for, wait_for_or};

/// Turns on `spec.sharedWatches` for configmaps in the fleet's Gateway.
fn share_configmaps(fleet: &Fleet, ring: u32, lag: u32) {
    share_configmaps_with(fleet, ring, lag, "");
}

/// The same, with more of `spec.sharedWatches` (YAML lines).
fn share_configmaps_with(fleet: &Fleet, ring: u32, lag: u32, more: &str) {
    let path = fleet.fleet_path("gateway.yaml");
    let mut gateway: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let shared: serde_yaml::Value = serde_yaml::from_str(&format!(
        "resources: [{{group: '', version: v1, resource: configmaps}}]\nringSize: {ring}\nlagLimit: {lag}\n{more}"
    ))
    .unwrap();
    gateway["spec"]
        .as_mapping_mut()
        .unwrap()
        .insert("sharedWatches".into(), shared);
    std::fs::write(&path, serde_yaml::to_string(&gateway).unwrap()).unwrap();
}

/// `fleetgate_sim_open_watches{resource=...}` of a member, read from it directly as admin.
fn member_watches(fleet: &Fleet, context: &str, resource: &str) -> usize {
    let out = kubectl(
        &fleet.fleet_path("kubeconfig"),
        context,
        &["get", "--raw", "/metrics"],
    );
    support::fleet::sim_open_watches(&out, resource)
}

/// How often the gateway watched the member again after the member ended its shared watch.
fn rewatches(fleet: &Fleet) -> usize {
    fleet
        .log()
        .matches("the member ended its watch; watching again")
        .count()
}

/// kubectl straight to the member as admin; must succeed.
fn direct(fleet: &Fleet, args: &[&str]) -> String {
    fleet.direct_ok("member1", args)
}

/// One member, one worker sharing configmaps (ring 64, lag limit 16), and the seed created.
fn seeded_fleet() -> Fleet {
    seeded_fleet_of(std::process::Command::new(support::fleet::loadtest_binary()))
}

/// [`seeded_fleet`] with `sim` as the `fleetgate-loadtest` command.
fn seeded_fleet_of(sim: std::process::Command) -> Fleet {
    let mut fleet = Fleet::sim_launched(sim, 1, 0, "", &[]);
    share_configmaps(&fleet, 64, 16);
    fleet.serve(&["--workers", "1"], None);
    create_seed(&fleet);
    fleet
}

/// Creates ConfigMap default/seed with `data.i` 0 on the member itself.
fn create_seed(fleet: &Fleet) {
    direct(
        fleet,
        &[
            "create",
            "configmap",
            "seed",
            "-n",
            "default",
            "--from-literal=i=0",
        ],
    );
}

/// Sets `data.i` of ConfigMap default/seed to `i` on the member itself (one MODIFIED event).
fn patch_seed(fleet: &Fleet, i: u32) {
    let patch = format!("{{\"data\":{{\"i\":\"{i}\"}}}}");
    direct(
        fleet,
        &[
            "patch",
            "configmap",
            "seed",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            &patch,
        ],
    );
}

struct Watcher {
    child: Child,
    out: std::path::PathBuf,
}

impl Watcher {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubectl get cm -n default -w ARGS` through the gateway, its stdout in a file.
fn kubectl_watch(fleet: &Fleet, name: &str, args: &[&str]) -> Watcher {
    let mut command = vec!["get", "cm", "-n", "default", "-w"];
    command.extend_from_slice(args);
    kubectl_watcher(fleet, name, "member1", &command)
}

/// `count` watches of `kubectl get cm -n default -w` printing each ConfigMap's name and `data.i`
/// (JSON events), named columns-N.
fn columns_watchers(fleet: &Fleet, count: usize) -> Vec<Watcher> {
    (0..count)
        .map(|n| {
            kubectl_watch(
                fleet,
                &format!("columns-{n}"),
                &[
                    "--no-headers",
                    "-o",
                    "custom-columns=NAME:.metadata.name,I:.data.i",
                ],
            )
        })
        .collect()
}

/// `kubectl get --raw` of the watch of `default`'s configmaps on `context` through the gateway,
/// with `query` (more query parameters, or none).
fn raw_watch(fleet: &Fleet, name: &str, context: &str, query: &str) -> Watcher {
    let mut path = format!("/clusters/{context}/api/v1/namespaces/default/configmaps?watch=1");
    if !query.is_empty() {
        path.push('&');
        path.push_str(query);
    }
    kubectl_watcher(fleet, name, context, &["get", "--raw", &path])
}

/// Waits until a raw watch has got an event of ConfigMap seed.
fn wait_for_seed(watcher: &Watcher, what: &str) {
    wait_for_or(
        what,
        Duration::from_secs(30),
        || !seed_events(&watcher.output()).is_empty(),
        || watcher.output(),
    );
}

/// kubectl with `args` on the gateway's `context`, its stdout and stderr in NAME.out / NAME.err.
fn kubectl_watcher(fleet: &Fleet, name: &str, context: &str, args: &[&str]) -> Watcher {
    let out = fleet.path(&format!("{name}.out"));
    let child = kubectl_command(&fleet.gateway_kubeconfig(), context)
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(fleet.path(&format!("{name}.err"))).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Watcher { child, out }
}

/// `count` kube-rs watchers of default's configmaps through the gateway (JSON, with bookmarks,
/// resuming from their last resourceVersion as informers do), each recording the `data.i`
/// values it saw.
fn informers(fleet: &Fleet, kube_client: &Client, count: usize) -> Vec<Arc<Mutex<Vec<u32>>>> {
    (0..count)
        .map(|_| {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let api: Api<ConfigMap> = Api::namespaced(kube_client.clone(), "default");
            let record = Arc::clone(&seen);
            fleet.runtime.spawn(async move {
                // With backoff, as informers run: once the gateway is gone at the test's end, a
                // watcher without it retries in a loop that never yields, and the runtime's drop
                // waits for it forever (seen once in CI).
                let mut events =
                    std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
                while let Some(event) = events.next().await {
                    let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event
                    else {
                        continue;
                    };
                    if let Some(value) = cm.data.and_then(|d| d.get("i")?.parse().ok()) {
                        record.lock().unwrap().push(value);
                    }
                }
            });
            seen
        })
        .collect()
}

/// The values of `data.i` of ConfigMap `seed` in the lines a custom-columns watch printed.
fn values_in(output: &str) -> Vec<u32> {
    output
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("seed")).then(|| words.next()?.parse().ok())?
        })
        .collect()
}

const CLIENTS_KUBE_RS: usize = 100;
const CLIENTS_TABLE: usize = 10;
const CLIENTS_COLUMNS: usize = 10;
const CHANGES: u32 = 24;

#[test]
fn many_watches_cost_the_member_one_watch_per_key_and_see_every_change_in_order() {
    let fleet = many_watches_see_every_change_in_order("1", "");
    // No shard feeds another.
    assert_eq!(fleet.metric("fleetgate_shared_watch_feeds"), Some(0));
}

#[test]
fn per_gateway_two_shards_cost_the_member_one_watch_per_key() {
    // `scope: Gateway` on two shards: the clients' connections land on both, and each key's
    // one member watch feeds the other shard's clients too (`scope: Shard` would cost the
    // member four watches here).
    let fleet = many_watches_see_every_change_in_order("2", "scope: Gateway\n");
    // Each key's hub on the shard that is not its home is fed by the home's (both keys have
    // clients on both shards: 11 and 10 connections, spread by the kernel).
    assert_eq!(
        fleet.metric("fleetgate_shared_watch_feeds"),
        Some(2),
        "{}",
        fleet.log_tail(20)
    );
}

/// 100 kube-rs watchers, 10 `kubectl get -w` and 10 with custom columns through a gateway of
/// `workers` shards sharing configmaps (`more` of `spec.sharedWatches`): every client sees every
/// change in order, the member holds one watch per key (JSON and Table), and a resourceVersion
/// that left the ring gets the apiserver's 410.
fn many_watches_see_every_change_in_order(workers: &str, more: &str) -> Fleet {
    // The member ends every watch after 2 s, as a real apiserver ends each after its request
    // timeout: the gateway's shared watch goes on from its last resourceVersion, unseen.
    let mut fleet = Fleet::sim_with("", 1, 0, &["--watch-timeout-seconds", "2"]);
    share_configmaps_with(&fleet, 16, 16, more);
    fleet.serve(&["--workers", workers], Some("fleetgate=info"));
    create_seed(&fleet);

    // 100 kube-rs watchers (JSON, with bookmarks), each recording the values it saw.
    let kube_client = fleet
        .runtime
        .block_on(gateway_client(&fleet, "member1", fleet.https()));
    let seen = informers(&fleet, &kube_client, CLIENTS_KUBE_RS);
    // 10 plain `kubectl get -w` (Table events) and 10 with custom columns (JSON events).
    let tables: Vec<Watcher> = (0..CLIENTS_TABLE)
        .map(|n| kubectl_watch(&fleet, &format!("table-{n}"), &[]))
        .collect();
    let columns: Vec<Watcher> = columns_watchers(&fleet, CLIENTS_COLUMNS);
    // Every client has its list (the initial value) before the changes begin.
    wait_for(
        "every client's initial list",
        Duration::from_secs(60),
        || {
            seen.iter().all(|s| !s.lock().unwrap().is_empty())
                && tables.iter().all(|w| w.output().contains("seed"))
                && columns.iter().all(|w| values_in(&w.output()) == [0])
        },
    );

    for i in 1..=CHANGES {
        patch_seed(&fleet, i);
        // Spread over several of the member's watch timeouts: every sixth change waits until
        // the clients have it and the member has ended the shared watch once more.
        if i % 6 == 0 {
            wait_for("the clients to catch up", Duration::from_secs(30), || {
                columns
                    .iter()
                    .all(|w| values_in(&w.output()).last() == Some(&i))
            });
            let ended = rewatches(&fleet);
            wait_for(
                "the member to end the shared watch",
                Duration::from_secs(10),
                || rewatches(&fleet) > ended,
            );
        }
    }
    let want: Vec<u32> = (0..=CHANGES).collect();
    wait_for(
        "every change at every client",
        Duration::from_secs(60),
        || {
            seen.iter()
                .all(|s| s.lock().unwrap().last() == Some(&CHANGES))
                && columns
                    .iter()
                    .all(|w| values_in(&w.output()).last() == Some(&CHANGES))
                && tables.iter().all(|w| {
                    w.output().lines().filter(|l| l.starts_with("seed")).count() > CHANGES as usize
                })
        },
    );
    for (n, s) in seen.iter().enumerate() {
        assert_eq!(*s.lock().unwrap(), want, "kube-rs watcher {n}");
    }
    for w in &columns {
        assert_eq!(values_in(&w.output()), want, "{}", w.out.display());
    }
    for w in &tables {
        let rows = w.output().lines().filter(|l| l.starts_with("seed")).count();
        assert_eq!(rows, 1 + CHANGES as usize, "{}", w.output());
        // The header once: the column definitions came with the first event only.
        assert_eq!(w.output().matches("NAME").count(), 1, "{}", w.output());
    }
    // 120 client watches, two shared keys (JSON and Table forms): the member holds two
    // watches, whichever of its 2 s timeouts it is in.
    wait_for(
        "the member to hold two watches",
        Duration::from_secs(10),
        || member_watches(&fleet, "member1", "configmaps") == 2,
    );
    // The gateway's own count: two shared watches, serving the 120 clients.
    assert_eq!(fleet.metric("fleetgate_shared_watches"), Some(2));
    assert_eq!(
        fleet.metric("fleetgate_shared_watch_clients"),
        Some((CLIENTS_KUBE_RS + CLIENTS_TABLE + CLIENTS_COLUMNS) as i64)
    );
    // One open stream each, whether it came over HTTP/1.1 (kube-rs) or h2 (kubectl).
    assert_eq!(
        fleet.metric("fleetgate_open_streams"),
        Some((CLIENTS_KUBE_RS + CLIENTS_TABLE + CLIENTS_COLUMNS) as i64)
    );
    assert!(rewatches(&fleet) >= 4, "{}", fleet.log_tail(20));

    // A resourceVersion the ring no longer holds (16 events, 24 changes since): the
    // apiserver's 410 inside a 200 stream.
    let first_rv: u64 = direct(
        &fleet,
        &[
            "get",
            "configmap",
            "seed",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .trim()
    .parse::<u64>()
    .unwrap()
        - (CHANGES as u64 - 2);
    let old = kubectl(
        &fleet.gateway_kubeconfig(),
        "member1",
        &[
            "get",
            "--raw",
            &format!("/clusters/member1/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={first_rv}&timeoutSeconds=5"),
        ],
    );
    let body = String::from_utf8_lossy(&old.stdout);
    assert!(
        body.contains("\"type\":\"ERROR\"")
            && body.contains("\"code\":410")
            && body.contains(&format!("too old resource version: {first_rv} (")),
        "{body}\n{}\n{}",
        String::from_utf8_lossy(&old.stderr),
        fleet.log_tail(30)
    );
    fleet
}

#[test]
fn a_user_the_member_refuses_gets_its_403_and_one_it_allows_shares() {
    let mut fleet = Fleet::sim(1, 0);
    share_configmaps(&fleet, 64, 16);
    fleet.serve(&["--workers", "1"], Some("fleetgate=debug"));
    create_seed(&fleet);
    let path = "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=3";
    // kubectl's --raw path starts at the server's root, not at its `/clusters/member1`.
    let through = format!("/clusters/member1{path}");
    // bob: the gateway's policy and the member's RBAC both let him read configmaps in default.
    let bob = kubectl(
        &fleet.gateway_kubeconfig(),
        "member1",
        &["--user", "bob", "get", "--raw", &through],
    );
    assert!(
        bob.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&bob.stderr),
        fleet.log_tail(30)
    );
    let events = String::from_utf8_lossy(&bob.stdout);
    assert!(
        events.contains("{\"type\":\"ADDED\"") && events.contains("\"name\":\"seed\""),
        "{events}"
    );
    // Shared: the hub's watch outlives bob's (it waits for clients a while); his own would
    // have ended with his timeoutSeconds.
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    // alice: the policy lets her read member1, but the member lets her read only namespace
    // dev. Her watch gets the member's own 403, as when she asks it directly.
    support::kubectl::assert_refused_alike(
        &fleet.gateway_kubeconfig(),
        &fleet.fleet_path("kubeconfig"),
        path,
        "watch",
    );
}

/// A query value percent-encoded (everything but unreserved characters).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The names in the ADDED events of a watch stream, sorted.
fn added_names(stream: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = String::from_utf8_lossy(stream)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["type"] == "ADDED")
        .filter_map(|e| e["object"]["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[test]
fn the_gateways_selectors_select_what_the_members_do() {
    let mut fleet = Fleet::sim(1, 0);
    share_configmaps(&fleet, 64, 16);
    fleet.serve(&["--workers", "1"], None);
    for (name, labels) in [
        ("a", &["app=web", "tier=front", "n=3"][..]),
        ("b", &["app=api", "n=10"]),
        ("c", &[]),
        ("d", &["app=web", "tier=back", "example.com/team=x"]),
        ("e", &["n=07", "empty="]),
    ] {
        direct(&fleet, &["create", "configmap", name, "-n", "default"]);
        if !labels.is_empty() {
            let mut args = vec!["label", "configmap", name, "-n", "default"];
            args.extend(labels);
            direct(&fleet, &args);
        }
    }
    for (param, selector) in [
        ("labelSelector", ""),
        ("labelSelector", "app"),
        ("labelSelector", "!app"),
        ("labelSelector", "app=web"),
        ("labelSelector", "app==web"),
        ("labelSelector", "app!=web"),
        ("labelSelector", "app in (web,api)"),
        ("labelSelector", "app notin (web)"),
        ("labelSelector", "n>5"),
        ("labelSelector", "n<5"),
        ("labelSelector", " app = web , tier in ( front ) "),
        ("labelSelector", "example.com/team"),
        ("labelSelector", "empty="),
        ("labelSelector", "tier!=front,app"),
        ("fieldSelector", "metadata.name=a"),
        ("fieldSelector", "metadata.name!=a"),
        (
            "fieldSelector",
            "metadata.namespace=default,metadata.name=d",
        ),
    ] {
        let path = format!(
            "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1&{param}={}",
            encode(selector)
        );
        let shared = kubectl(
            &fleet.gateway_kubeconfig(),
            "member1",
            &["get", "--raw", &format!("/clusters/member1{path}")],
        );
        let member = kubectl(
            &fleet.fleet_path("kubeconfig"),
            "member1",
            &["get", "--raw", &path],
        );
        assert!(
            member.status.success(),
            "{selector:?}: {}",
            String::from_utf8_lossy(&member.stderr)
        );
        assert!(
            shared.status.success(),
            "{selector:?}: {}",
            String::from_utf8_lossy(&shared.stderr)
        );
        let (ours, theirs) = (added_names(&shared.stdout), added_names(&member.stdout));
        assert_eq!(ours, theirs, "{param}={selector:?}");
    }
    // Every watch above was the shared one: the member holds its watch (and no other).
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
}

#[test]
fn a_member_410_relists_and_a_removed_cluster_ends_its_watches() {
    relists_and_a_removed_cluster_ends_its_watches("1", "", 1);
}

#[test]
fn per_gateway_a_member_410_relists_and_a_removed_cluster_ends_its_watches_on_every_shard() {
    // 12 watchers of each kind on two shards: the shard that is not the key's home serves its
    // clients from the home's feed, relists and the cluster's removal included.
    relists_and_a_removed_cluster_ends_its_watches("2", "scope: Gateway\n", 12);
}

/// A member 410 under a shared watch makes it list again, and `watchers` custom-columns kubectl
/// watchers see the changes in order; member2's removal ends `watchers` raw watches of it and its
/// member watch. `workers` shards, `more` of `spec.sharedWatches`.
fn relists_and_a_removed_cluster_ends_its_watches(workers: &str, more: &str, watchers: usize) {
    // Churn in other namespaces moves the member's 5-event window past the shared watch of
    // `default`, and the member ends every watch after 2 s: each time the gateway watches again
    // its resourceVersion has expired (410), and it lists again.
    let mut fleet = Fleet::sim_with(
        "",
        2,
        10,
        &[
            "--churn",
            "20",
            "--history-window",
            "5",
            "--watch-timeout-seconds",
            "2",
        ],
    );
    share_configmaps_with(&fleet, 64, 16, more);
    fleet.serve(&["--workers", workers], Some("fleetgate=info"));
    create_seed(&fleet);
    // The shared watch first, opened by a watch from now (which the hub always serves). Were
    // kubectl's watch the hub's first client, a change between kubectl's list and the hub's could
    // leave kubectl's resourceVersion older than anything the hub saw: the gateway hands such a
    // watch to the member, which ends it after 2 s here, and `kubectl get -w` exits with it.
    let warm = raw_watch(&fleet, "warm", "member1", "");
    wait_for(
        "the shared watch of default",
        Duration::from_secs(30),
        || member_watches(&fleet, "member1", "configmaps") == 1,
    );
    let columns: Vec<Watcher> = columns_watchers(&fleet, watchers);
    wait_for("the initial list", Duration::from_secs(30), || {
        columns.iter().all(|w| values_in(&w.output()) == [0])
    });
    wait_for(
        "a relist after the member's 410",
        Duration::from_secs(30),
        || {
            fleet
                .log()
                .contains("member's resourceVersion expired; listing again")
        },
    );
    for i in 1..=5 {
        patch_seed(&fleet, i);
    }
    // Changes that fell into a relist come as what changed since (the last of them), as from
    // client-go's reflector: in order, none twice, the last one always.
    wait_for_or(
        "the last change",
        Duration::from_secs(30),
        || {
            columns
                .iter()
                .all(|w| values_in(&w.output()).last() == Some(&5))
        },
        || {
            format!(
                "watchers printed {:?}; kubectl said {:?}\ngateway log:\n{}",
                columns.iter().map(Watcher::output).collect::<Vec<_>>(),
                std::fs::read_to_string(fleet.path("columns-0.err")).unwrap_or_default(),
                fleet.log_tail(60)
            )
        },
    );
    for w in &columns {
        let values = values_in(&w.output());
        assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    }

    // member2 is removed from the configuration: its shared watch ends, and with it every
    // client watch on it, cleanly.
    let mut raws: Vec<Watcher> = (0..watchers)
        .map(|n| raw_watch(&fleet, &format!("raw-{n}"), "member2", ""))
        .collect();
    wait_for("member2's shared watch", Duration::from_secs(30), || {
        member_watches(&fleet, "member2", "configmaps") == 1
    });
    if watchers > 1 {
        // Clients on both shards (the kernel spread 2 x 12 connections): each key's other shard
        // is fed by its home.
        wait_for("the feeds of both keys", Duration::from_secs(30), || {
            fleet.metric("fleetgate_shared_watch_feeds") == Some(2)
        });
    }
    std::fs::remove_file(fleet.fleet_path("clusters/member2.yaml")).unwrap();
    for raw in &mut raws {
        let mut status = None;
        wait_for(
            "the client watches on member2 to end",
            Duration::from_secs(30),
            || {
                status = raw.child.try_wait().unwrap();
                status.is_some()
            },
        );
        assert!(status.unwrap().success(), "{}", fleet.log_tail(20));
    }
    drop(warm);
    wait_for("member2 to hold no watch", Duration::from_secs(30), || {
        member_watches(&fleet, "member2", "configmaps") == 0
    });
}

#[test]
fn a_client_that_falls_behind_the_lag_limit_is_cut_with_410() {
    let mut fleet = Fleet::sim(1, 0);
    share_configmaps(&fleet, 64, 4);
    fleet.serve(&["--workers", "1"], None);
    direct(
        &fleet,
        &[
            "create",
            "configmap",
            "big",
            "-n",
            "default",
            "--from-literal=i=0",
        ],
    );
    let rv = direct(
        &fleet,
        &[
            "get",
            "configmap",
            "big",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    );
    // A client that asks for the watch, reads its head, then stops reading.
    let tls = fleet.admin_tls_config(b"http/1.1");
    let https = fleet.https();
    let mut stream = fleet.runtime.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = support::client::tls_connect(https, tls).await.unwrap();
        let request = format!(
            "GET /clusters/member1/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={} HTTP/1.1\r\nHost: gw\r\n\r\n",
            rv.trim()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        stream
    });
    // 24 changes of 800 KB each: more than the sockets between gateway and client hold, so the
    // gateway's write to this client waits while the ring moves on past the lag limit (4).
    let patch = fleet.path("big.json");
    for i in 1..=24 {
        let value = format!("{i}-{}", "x".repeat(800 * 1024));
        std::fs::write(&patch, format!("{{\"data\":{{\"i\":\"{value}\"}}}}")).unwrap();
        direct(
            &fleet,
            &[
                "patch",
                "configmap",
                "big",
                "-n",
                "default",
                "--type",
                "merge",
                "--patch-file",
                patch.to_str().unwrap(),
            ],
        );
    }
    // Reading again: what was in flight, then the apiserver's 410 and the end of the stream.
    let rest = fleet.runtime.block_on(async {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut rest))
            .await
            .expect("the stream ends")
            .ok();
        rest
    });
    let text = String::from_utf8_lossy(&rest);
    let tail = &text[text.len().saturating_sub(400)..];
    assert!(
        text.contains("\"type\":\"ERROR\"")
            && text.contains("\"code\":410")
            && text.contains("too old resource version"),
        "{tail}"
    );
    assert!(text.ends_with("0\r\n\r\n"), "{tail}");
    // It did not get all 24 changes: it was cut.
    assert!(!text.contains("\"i\":\"24-"), "{tail}");
}

/// The resourceVersion of ConfigMap default/NAME, asked of the member itself.
fn version_of(fleet: &Fleet, name: &str) -> u64 {
    let rv = direct(
        fleet,
        &get_configmap(name, "jsonpath={.metadata.resourceVersion}"),
    );
    rv.trim().parse().unwrap()
}

/// Patches the seed to `i` and waits (30 s at most) until the two watches have seen `counts`
/// seed events each; their seed events then, read anew.
fn patch_seen_by(
    fleet: &Fleet,
    i: u32,
    watches: [&Watcher; 2],
    counts: [usize; 2],
) -> (SeedEvents, SeedEvents) {
    patch_seed(fleet, i);
    let both = || {
        (
            seed_events(&watches[0].output()),
            seed_events(&watches[1].output()),
        )
    };
    wait_for_or(
        "both watches to see the next change",
        Duration::from_secs(30),
        || {
            let (a, b) = both();
            [a.len(), b.len()] == counts
        },
        || format!("{:?}", both()),
    );
    both()
}

/// The seed events of one watch, in order: each event's type and the seed's `data.i`.
type SeedEvents = Vec<(String, String)>;

/// A seed event as [`seed_events`] lists it: its type and the seed's `data.i`.
fn event(kind: &str, i: &str) -> (String, String) {
    (kind.to_owned(), i.to_owned())
}

/// The `data.i` values of ConfigMap `seed` in the events of a raw watch stream, in order, with
/// each event's type.
fn seed_events(output: &str) -> SeedEvents {
    output
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["object"]["metadata"]["name"] == "seed")
        .map(|e| {
            let i = e["object"]["data"]["i"].as_str().unwrap_or("").to_owned();
            (e["type"].as_str().unwrap_or("").to_owned(), i)
        })
        .collect()
}

#[test]
fn a_first_watch_older_than_the_shared_list_is_replayed_not_proxied() {
    let fleet = seeded_fleet();
    // What kubectl get -w does: list (here, the seed's version stands for the list's), then
    // watch from there. Meanwhile the member changes: the watched ConfigMap, and other objects
    // (a busy member's resourceVersion moves with every write), so the hub's own list, made
    // when the watch comes, is newer than the client's.
    let listed = version_of(&fleet, "seed");
    patch_seed(&fleet, 1);
    move_the_version(&fleet);
    let first = raw_watch(
        &fleet,
        "first",
        "member1",
        &format!("resourceVersion={listed}"),
    );
    wait_for_seed(
        &first,
        "the first watch to get the change made after its list",
    );
    // Served from the hub (which replayed from the client's version), not by a member watch of
    // its own.
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    // A client that starts now (no resourceVersion) gets the objects as they are, once.
    let current = raw_watch(&fleet, "current", "member1", "");
    wait_for_seed(&current, "a current watch's initial ADDED");
    let (first_events, current_events) = patch_seen_by(&fleet, 2, [&first, &current], [2, 2]);
    assert_eq!(
        first_events,
        [event("MODIFIED", "1"), event("MODIFIED", "2")]
    );
    assert_eq!(
        current_events,
        [event("ADDED", "1"), event("MODIFIED", "2")]
    );
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    // A first watch of another key from a version the member can no longer replay gets the
    // member's answer, a 410 ERROR event, and the hub goes on from its list.
    let expired = kubectl(
        &fleet.gateway_kubeconfig(),
        "member1",
        &[
            "get",
            "--raw",
            "/clusters/member1/api/v1/namespaces/kube-public/configmaps?watch=1&resourceVersion=1",
        ],
    );
    let text = String::from_utf8_lossy(&expired.stdout);
    assert!(
        text.contains("\"type\":\"ERROR\"") && text.contains("\"code\":410"),
        "{text}\n{}",
        String::from_utf8_lossy(&expired.stderr)
    );
    // (The hub tried the replay, as for the first key; the member refused it.)
    assert!(fleet
        .log()
        .contains("the member cannot replay from the first client's resourceVersion"));
    direct(
        &fleet,
        &["create", "configmap", "later", "-n", "kube-public"],
    );
    let later = kubectl(
        &fleet.gateway_kubeconfig(),
        "member1",
        &[
            "get",
            "--raw",
            "/clusters/member1/api/v1/namespaces/kube-public/configmaps?watch=1&timeoutSeconds=1",
        ],
    );
    assert!(String::from_utf8_lossy(&later.stdout).contains("\"name\":\"later\""));
}

/// A write to another collection of the member: its resourceVersion moves, as on a busy member.
fn move_the_version(fleet: &Fleet) {
    direct(
        fleet,
        &[
            "create",
            "secret",
            "generic",
            "moves-the-version",
            "-n",
            "default",
        ],
    );
}

/// `kubectl label` on the member itself.
fn label_seed(fleet: &Fleet, label: &str) {
    direct(
        fleet,
        &[
            "label",
            "configmap",
            "seed",
            "-n",
            "default",
            "--overwrite",
            label,
        ],
    );
}

/// The requests member1 got for `default`'s configmaps, each query as it came on the wire (the
/// sim's debug log; see [`recording_fleet`]).
fn member_queries(fleet: &Fleet) -> Vec<String> {
    let log = std::fs::read_to_string(fleet.dir.path().join("sim.log")).unwrap();
    log.lines()
        .filter(|l| {
            l.contains(" request ") && l.contains("path=/api/v1/namespaces/default/configmaps ")
        })
        .filter_map(|l| l.split(" query=").nth(1))
        .map(|q| q.split_whitespace().next().unwrap_or("").to_owned())
        .collect()
}

/// A query's pairs as the member's Go reads them (`+` a space, `%XX` a byte).
fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |text: &str| {
        let text = text.replace('+', " ");
        percent_encoding::percent_decode_str(&text)
            .decode_utf8()
            .unwrap()
            .into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Like [`seeded_fleet`], the members logging every request's query.
fn recording_fleet() -> Fleet {
    let mut sim = std::process::Command::new(support::fleet::loadtest_binary());
    sim.env("RUST_LOG", "warn,fleetgate_loadtest::sim::api=debug");
    seeded_fleet_of(sim)
}

/// The client's field selector in the catch-up below: valid to kube, hostile to a query that
/// is not re-encoded (an ampersand and a parameter, escaped `=`, a space, `#`, `%`, `+`, `;`, `?`).
const HOSTILE_FIELDS: &str = r"metadata.name!=x&labelSelector\=app\=db #f%41+;?";

#[test]
fn a_label_selecting_watch_from_before_the_shared_list_catches_up_from_the_member() {
    let fleet = recording_fleet();
    // A client lists with a label selector (nothing matches yet) and will watch from there.
    let listed = version_of(&fleet, "seed");
    // Meanwhile the seed starts matching and changes, and another write moves the version.
    label_seed(&fleet, "app=web");
    patch_seed(&fleet, 1);
    move_the_version(&fleet);
    // A watch of everything starts the hub, whose list is newer than the client's.
    let everything = raw_watch(&fleet, "everything", "member1", "");
    wait_for_seed(&everything, "the hub's initial ADDED of the seed");
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    // The label-selecting watch comes now: the hub's replayed or listed objects cannot say
    // which events started or stopped matching, so the member answers its selector up to the
    // hub's newest event (a short member watch), and the hub serves the rest.
    let query = format!(
        "resourceVersion={listed}&labelSelector={}&fieldSelector={}",
        encode("app in (web, other)"),
        encode(HOSTILE_FIELDS)
    );
    let labelled = raw_watch(&fleet, "labelled", "member1", &query);
    let seen = || seed_events(&labelled.output());
    wait_for_or(
        "the labelled watch to get what happened after its list",
        Duration::from_secs(30),
        || seen().len() == 2,
        || format!("{:?}\n{}", seen(), fleet.log()),
    );
    wait_for_or(
        "the catch-up's member watch to end, the hub's to stay",
        Duration::from_secs(10),
        || member_watches(&fleet, "member1", "configmaps") == 1,
        || fleet.log(),
    );
    // On the wire, the catch-up asked the member exactly the client's selectors, each one
    // value, and nothing the client's text could have added.
    let catch_ups: Vec<Vec<(String, String)>> = member_queries(&fleet)
        .iter()
        .map(|q| query_pairs(q))
        .filter(|pairs| pairs.contains(&("resourceVersion".into(), listed.to_string())))
        .collect();
    let mut keys: Vec<&str> = catch_ups
        .first()
        .unwrap_or_else(|| panic!("no catch-up among {:?}", member_queries(&fleet)))
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    keys.sort();
    assert_eq!(catch_ups.len(), 1, "{catch_ups:?}");
    assert_eq!(
        keys,
        [
            "fieldSelector",
            "labelSelector",
            "resourceVersion",
            "timeoutSeconds",
            "watch"
        ]
    );
    let value = |key: &str| {
        catch_ups[0]
            .iter()
            .find(|(k, _)| k == key)
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(value("labelSelector"), "app in (web, other)");
    assert_eq!(value("fieldSelector"), HOSTILE_FIELDS);
    // Then from the hub: a change while it matches, the change that stops it matching, and one
    // after (not for this client).
    patch_seed(&fleet, 2);
    label_seed(&fleet, "app=db");
    patch_seed(&fleet, 3);
    wait_for_or(
        "the labelled watch to see the seed stop matching",
        Duration::from_secs(30),
        || seen().len() == 4,
        || format!("{:?}", seen()),
    );
    let event = |kind: &str, i: &str| (kind.to_owned(), i.to_owned());
    let expected = [
        event("ADDED", "0"),
        event("MODIFIED", "1"),
        event("MODIFIED", "2"),
        event("DELETED", "2"),
    ];
    assert_eq!(seen(), expected);
    assert_eq!(
        member_watches(&fleet, "member1", "configmaps"),
        1,
        "still served by the hub"
    );
    // The member itself answers the same watch with the same events.
    let at_member = kubectl(
        &fleet.fleet_path("kubeconfig"),
        "member1",
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1&{query}"),
        ],
    );
    assert_eq!(
        seed_events(&String::from_utf8_lossy(&at_member.stdout)),
        expected
    );
}

#[test]
fn after_a_gateway_restart_informers_resume_on_one_member_watch() {
    informers_resume_after_a_restart("1", "");
}

#[test]
fn per_gateway_after_a_restart_informers_resume_on_one_member_watch() {
    // Two shards: the informers' connections land on both, and the first one on the shard that
    // is not the key's home starts the home's hub through its feed, with its version.
    informers_resume_after_a_restart("2", "scope: Gateway\n");
}

/// A gateway of `workers` shards (`more` of `spec.sharedWatches`) replaced under 20 kube-rs
/// informers: they resume on one member watch.
fn informers_resume_after_a_restart(workers: &str, more: &str) {
    let mut fleet = Fleet::sim(1, 0);
    share_configmaps_with(&fleet, 64, 16, more);
    fleet.serve(&["--workers", workers], None);
    // The informers reach the gateway through a front that stays (as a Service stays while its
    // pod is replaced).
    let front = Front::start(&fleet);
    create_seed(&fleet);
    // 20 kube-rs informers of default's configmaps.
    let kube_client = fleet
        .runtime
        .block_on(gateway_client(&fleet, "member1", front.addr));
    let seen = informers(&fleet, &kube_client, 20);
    let all_at = |value: u32| {
        seen.iter()
            .all(|s| s.lock().unwrap().last() == Some(&value))
    };
    wait_for("every informer's list", Duration::from_secs(60), || {
        all_at(0)
    });
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    // The gateway is replaced while the member moves on (a write elsewhere: the new hub's list
    // is newer than the version every informer resumes from).
    direct(
        &fleet,
        &["create", "secret", "generic", "while-away", "-n", "default"],
    );
    fleet.serve(&["--workers", workers], None);
    *front.to.lock().unwrap() = fleet.https();
    patch_seed(&fleet, 1);
    wait_for_or(
        "every informer to resume and see the change",
        Duration::from_secs(60),
        || all_at(1),
        || fleet.log(),
    );
    // Each resumed from its own version on the new gateway's one member watch, none on a member
    // watch of its own.
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
    for s in &seen {
        assert_eq!(*s.lock().unwrap(), [0, 1]);
    }
    if workers == "2" {
        // Both shards hold informers: the key's hub on the other shard is fed by its home's.
        assert_eq!(
            fleet.metric("fleetgate_shared_watch_feeds"),
            Some(1),
            "{}",
            fleet.log_tail(20)
        );
    }
}

#[test]
fn a_watch_from_before_the_hubs_start_is_backfilled_not_proxied() {
    let fleet = seeded_fleet();
    // One client lists, the member changes, a second client lists and watches first: the hub
    // starts at the second one's version.
    let older = version_of(&fleet, "seed");
    patch_seed(&fleet, 1);
    let newer = version_of(&fleet, "seed");
    let from = |rv: u64| format!("resourceVersion={rv}");
    let first = raw_watch(&fleet, "first", "member1", &from(newer));
    wait_for("the hub's member watch", Duration::from_secs(30), || {
        member_watches(&fleet, "member1", "configmaps") == 1
    });
    // The first client's watch comes now, from before the hub's start: the hub fetches what it
    // missed (a short member watch) and serves it too.
    let second = raw_watch(&fleet, "second", "member1", &from(older));
    wait_for_seed(
        &second,
        "the older watch to get the change made after its list",
    );
    let (first_events, second_events) = patch_seen_by(&fleet, 2, [&first, &second], [1, 2]);
    assert_eq!(first_events, [event("MODIFIED", "2")]);
    assert_eq!(
        second_events,
        [event("MODIFIED", "1"), event("MODIFIED", "2")]
    );
    // The backfill's member watch ended; the hub's is the only one.
    wait_for_or(
        "one member watch",
        Duration::from_secs(10),
        || member_watches(&fleet, "member1", "configmaps") == 1,
        || fleet.log(),
    );
}

/// Over h2 (kubectl's), a shared watch goes on in a task of its own once positioned: when its
/// clients go away (their connections dropped mid-watch), nothing of them stays, neither on the
/// gateway's streams nor on the hub's clients.
#[test]
fn h2_shared_watches_whose_clients_vanish_leave_nothing_behind() {
    let fleet = seeded_fleet();
    let watchers: Vec<Watcher> = (0..5)
        .map(|n| kubectl_watch(&fleet, &format!("vanish-{n}"), &[]))
        .collect();
    wait_for("every watcher's first row", Duration::from_secs(30), || {
        watchers.iter().all(|w| w.output().contains("seed"))
    });
    // kubectl prints its list's rows before it opens its watch: wait for the five watches.
    wait_for(
        "every watcher's watch in the hub",
        Duration::from_secs(30),
        || {
            fleet.metric("fleetgate_shared_watch_clients") == Some(5)
                && fleet.metric("fleetgate_open_streams") == Some(5)
        },
    );
    // Killed mid-watch: their TCP connections close without a GOAWAY or a reset.
    drop(watchers);
    wait_for_or(
        "the vanished watches to leave the gateway",
        Duration::from_secs(10),
        || {
            fleet.metric("fleetgate_shared_watch_clients") == Some(0)
                && fleet.metric("fleetgate_open_streams") == Some(0)
        },
        || fleet.admin_get("/metrics"),
    );
    // The shared watch serves the next client as before.
    let next = kubectl_watch(&fleet, "after", &[]);
    wait_for(
        "the next watcher's first row",
        Duration::from_secs(30),
        || next.output().contains("seed"),
    );
    assert_eq!(member_watches(&fleet, "member1", "configmaps"), 1);
}

/// An h2 client whose shared watch waits for the hub's first list (the member answers LISTs
/// 20 s late here) and resets its stream leaves at once: its stream and its place among the
/// hub's clients are freed while the hub still waits, not when the list comes.
#[test]
fn an_h2_watch_reset_while_the_hubs_list_is_pending_leaves_at_once() {
    let mut fleet = Fleet::sim_with("", 1, 0, &["--list-delay-ms", "20000"]);
    share_configmaps(&fleet, 64, 16);
    fleet.serve(&["--workers", "1"], None);
    let (tls, https) = (fleet.admin_tls_config(b"h2"), fleet.https());
    let (_client, mut stream, headed) = fleet.runtime.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(https).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tls = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .unwrap();
        let (mut client, connection) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(connection);
        let request = http::Request::get(
            "https://127.0.0.1/clusters/member1/api/v1/namespaces/default/configmaps?watch=1",
        )
        .body(())
        .unwrap();
        let (response, stream) = client.send_request(request, true).unwrap();
        // Kept polled (the stream stays open); whether a head came is recorded.
        let headed = Arc::new(Mutex::new(false));
        let marked = Arc::clone(&headed);
        tokio::spawn(async move {
            if response.await.is_ok() {
                *marked.lock().unwrap() = true;
            }
        });
        (client, stream, headed)
    });
    wait_for_or(
        "the watch to wait among the hub's clients",
        Duration::from_secs(10),
        || {
            fleet.metric("fleetgate_open_streams") == Some(1)
                && fleet.metric("fleetgate_shared_watches") == Some(1)
        },
        || fleet.log(),
    );
    // Still waiting: the hub's list is 20 s away, so no head yet.
    assert!(
        !*headed.lock().unwrap(),
        "a head came before the hub's list"
    );
    stream.send_reset(h2::Reason::CANCEL);
    wait_for_or(
        "the reset stream to be freed while the hub's list is pending",
        Duration::from_secs(5),
        || fleet.metric("fleetgate_open_streams") == Some(0),
        || fleet.log(),
    );
    assert_eq!(fleet.metric("fleetgate_shared_watch_clients"), Some(0));
}

#[test]
fn a_draining_gateway_ends_a_shared_watch_with_a_last_bookmark_at_the_hubs_version() {
    let fleet = seeded_fleet();
    direct(
        &fleet,
        &["create", "configmap", "labelled", "-n", "default"],
    );
    direct(
        &fleet,
        &["label", "configmap", "labelled", "-n", "default", "app=x"],
    );
    // One watch sees only `labelled` and asked for bookmarks, the other sees every change.
    let selected = raw_watch(
        &fleet,
        "drain-selected",
        "member1",
        "allowWatchBookmarks=true&labelSelector=app%3Dx",
    );
    let all = raw_watch(&fleet, "drain-all", "member1", "");
    wait_for_seed(&all, "the unfiltered watch to start");
    wait_for_or(
        "the selected watch to start",
        Duration::from_secs(30),
        || selected.output().contains("\"labelled\""),
        || selected.output(),
    );
    // A change the selected watch does not see moves the hub's version past its last event.
    patch_seed(&fleet, 1);
    let version = version_of(&fleet, "seed");
    wait_for_or(
        "the unfiltered watch to see the change (so the hub has it)",
        Duration::from_secs(30),
        || seed_events(&all.output()).contains(&event("MODIFIED", "1")),
        || all.output(),
    );
    let gateway = fleet.gateway.as_ref().unwrap().child.id();
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on the pid of our own child with a valid signal number touches no memory.
    unsafe {
        libc::kill(gateway as libc::pid_t, libc::SIGTERM);
    }
    // Both watches end cleanly at once (kubectl exits 0, well before the 30 s grace period),
    // the selected one told by a last bookmark that it holds everything up to the change it
    // did not see: it resumes from there on another replica, without listing again.
    for (watcher, name) in [(selected, "selected"), (all, "all")] {
        let mut watcher = watcher;
        let out = watcher.out.clone();
        let status = support::wait::wait_for_some(
            &format!("the {name} watch to end"),
            Duration::from_secs(10),
            || watcher.child.try_wait().unwrap(),
            || std::fs::read_to_string(&out).unwrap_or_default(),
        );
        assert!(status.success(), "{name}: {status}: {}", watcher.output());
        if name == "selected" {
            let output = watcher.output();
            let last: serde_json::Value =
                serde_json::from_str(output.lines().last().unwrap()).unwrap();
            assert_eq!(last["type"], "BOOKMARK", "{output}");
            assert_eq!(
                last["object"]["metadata"]["resourceVersion"],
                version.to_string(),
                "{output}"
            );
        }
    }
}

#[test]
fn shared_and_merged_watches_outlive_a_member_restart_and_its_passing_403s() {
    // member1 restarts on the sim's SIGUSR1 (down 300 ms), then forbids every user but a
    // superuser, the gateway included, for 2 s.
    let mut fleet = Fleet::sim_with("", 1, 0, &["--restart-down", "300ms"]);
    share_configmaps(&fleet, 64, 16);
    fleet.serve(&["--workers", "1"], Some("fleetgate=info"));
    create_seed(&fleet);
    let file = fleet.path("faults.json");
    std::fs::write(&file, r#"{"forbidAfterRestartMs": 2000}"#).unwrap();
    direct(
        &fleet,
        &[
            "create",
            "--raw",
            "/debug/sim/faults",
            "-f",
            file.to_str().unwrap(),
        ],
    );

    // Shared watches (a raw one, and kubectl's with custom columns), and a merged fleet watch.
    let mut raw = raw_watch(&fleet, "raw", "member1", "");
    let mut columns = columns_watchers(&fleet, 2);
    let mut merged = kubectl_watcher(
        &fleet,
        "merged",
        "fleet",
        &[
            "get",
            "cm",
            "-n",
            "default",
            "-w",
            "--no-headers",
            "-o",
            "custom-columns=NAME:.metadata.name,I:.data.i",
        ],
    );
    let watchers: Vec<&Watcher> = columns.iter().chain([&merged]).collect();
    let all_at = |i: u32| {
        watchers
            .iter()
            .all(|w| values_in(&w.output()).last() == Some(&i))
            && seed_events(&raw.output()).last().map(|(_, v)| v.as_str()) == Some(&*i.to_string())
    };
    wait_for(
        "every watch's initial list",
        Duration::from_secs(30),
        || all_at(0),
    );
    patch_seed(&fleet, 1);
    wait_for("the first change", Duration::from_secs(30), || all_at(1));

    support::pull::signal(fleet.sim.as_ref().unwrap(), libc::SIGUSR1);
    // Back, and forbidding: the gateway's own watch is answered 403, and tried again.
    wait_for_or(
        "the hub to be refused after the restart",
        Duration::from_secs(30),
        || {
            fleet
                .log()
                .lines()
                .any(|l| l.contains("shared watch: member unreachable") && l.contains("403"))
        },
        || fleet.log_tail(20),
    );
    patch_seed(&fleet, 2);
    patch_seed(&fleet, 3);
    wait_for_or(
        "the changes after the restart at every client",
        Duration::from_secs(30),
        || all_at(3),
        || {
            let outputs: Vec<String> = watchers.iter().map(|w| w.output()).collect();
            format!("{outputs:?}\n{}\n{}", raw.output(), fleet.log_tail(40))
        },
    );
    // Each change once, in order, and no break: every client watch is the one it opened.
    for w in &watchers {
        assert_eq!(values_in(&w.output()), [0, 1, 2, 3], "{}", w.out.display());
    }
    drop(watchers);
    for w in columns.iter_mut().chain([&mut merged, &mut raw]) {
        let status = w.child.try_wait().unwrap();
        assert!(status.is_none(), "{} ended: {status:?}", w.out.display());
    }
    let modified = |i: &str| event("MODIFIED", i);
    assert_eq!(
        seed_events(&raw.output()),
        [
            event("ADDED", "0"),
            modified("1"),
            modified("2"),
            modified("3")
        ]
    );
    let log = fleet.log();
    assert!(
        !log.contains("refused the gateway's own list or watch")
            && !log.contains("member refused the watch"),
        "{}",
        fleet.log_tail(40)
    );
}
