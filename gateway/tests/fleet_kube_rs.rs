//! kube-rs against the fleet view: a typed LIST of every member's ConfigMaps through the `fleet`
//! context, paged with `limit` / `continue` across clusters, equals the members' own lists, each
//! object stamped with its cluster; a named object is read from the member that has it; a
//! kube-rs watcher (an informer's list-then-watch) follows every member.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use support::fleet::Fleet;

async fn client(fleet: &Fleet, context: &str) -> Client {
    support::kubectl::kube_client(&fleet.gateway_kubeconfig(), context).await
}

/// (cluster, namespace, name) of every ConfigMap `api` lists, `page` at a time.
async fn all(
    api: &Api<ConfigMap>,
    page: u32,
    stamp: Option<&str>,
) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(page);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let list = api.list(&params).await.expect("list");
        for cm in list.items {
            let cluster = match stamp {
                Some(member) => member.to_owned(),
                None => stamped_cluster(&cm),
            };
            let fresh = out.insert((
                cluster,
                cm.metadata.namespace.unwrap_or_default(),
                cm.metadata.name.unwrap_or_default(),
            ));
            assert!(fresh, "an object listed twice");
        }
        token = list.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return out;
        }
    }
}

/// The cluster the fleet view stamped `cm` with (its `fleetgate.io/cluster` annotation).
fn stamped_cluster(cm: &ConfigMap) -> String {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("fleetgate.io/cluster"))
        .cloned()
        .expect("stamped with its cluster")
}

/// Creates an empty ConfigMap `name` in namespace `default` of `member`, directly.
async fn create_in(fleet: &Fleet, member: &str, name: &str) {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client(fleet, member).await, "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("create in {member}: {e}"));
}

/// `clusters` simulated members of `objects` objects each behind a one-worker gateway, and
/// `client` run against them. The fleet runs on its own runtime; the client gets another, dropped
/// before the fleet's.
fn with_fleet(clusters: usize, objects: usize, client: impl AsyncFnOnce(&Fleet)) {
    let mut fleet = Fleet::sim(clusters, objects);
    fleet.serve(&["--workers", "1"], None);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(client(&fleet));
}

#[test]
fn kube_rs_lists_and_reads_through_the_fleet_view() {
    with_fleet(10, 3, lists_and_reads);
}

async fn lists_and_reads(fleet: &Fleet) {
    let mut want = BTreeSet::new();
    for k in 1..=10 {
        let member = format!("member{k}");
        let member = member.as_str();
        let api = Api::<ConfigMap>::all(client(fleet, member).await);
        want.extend(all(&api, 500, Some(member)).await);
    }
    let merged = Api::<ConfigMap>::all(client(fleet, "fleet").await);
    assert_eq!(all(&merged, 500, None).await, want);
    assert_eq!(all(&merged, 4, None).await, want, "paging across clusters");

    create_in(fleet, "member1", "kube-rs-only").await;
    let read = Api::<ConfigMap>::namespaced(client(fleet, "fleet").await, "default")
        .get("kube-rs-only")
        .await
        .expect("read through the fleet view");
    assert_eq!(read.metadata.name.as_deref(), Some("kube-rs-only"));
}

#[test]
fn a_kube_rs_watcher_follows_every_member() {
    with_fleet(2, 2, watches);
}

async fn watches(fleet: &Fleet) {
    use futures_util::TryStreamExt as _;
    use kube::runtime::watcher::{self, Event};

    const WITHIN: std::time::Duration = std::time::Duration::from_secs(20);
    let mut want = BTreeSet::new();
    for member in ["member1", "member2"] {
        let api = Api::<ConfigMap>::all(client(fleet, member).await);
        want.extend(all(&api, 500, Some(member)).await);
    }
    let key = |cm: &ConfigMap| {
        (
            stamped_cluster(cm),
            cm.metadata.namespace.clone().unwrap_or_default(),
            cm.metadata.name.clone().unwrap_or_default(),
        )
    };
    let merged = Api::<ConfigMap>::all(client(fleet, "fleet").await);
    let stream = watcher::watcher(merged, watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    let mut next = async || {
        tokio::time::timeout(WITHIN, stream.try_next())
            .await
            .expect("an event in time")
            .expect("no watcher error")
            .expect("the stream goes on")
    };
    // The initial list: every member's objects.
    let mut initial = BTreeSet::new();
    loop {
        match next().await {
            Event::Init => {}
            Event::InitApply(cm) => {
                initial.insert(key(&cm));
            }
            Event::InitDone => break,
            other => panic!("before the initial list ended: {other:?}"),
        }
    }
    assert_eq!(initial, want);
    // Then the changes, from either member.
    create_in(fleet, "member2", "kube-rs-watched").await;
    loop {
        if let Event::Apply(cm) = next().await {
            if cm.metadata.name.as_deref() == Some("kube-rs-watched") {
                assert_eq!(key(&cm).0, "member2");
                break;
            }
        }
    }
}
