//! LISTs served from memory (issue 34, docs/cache.md) as users meet them: with `spec.cache` on
//! for configmaps, `kubectl get -o json` through the gateway gives the member's items in the
//! member's order (namespaces that sort differently as keys than as names included); informers'
//! `resourceVersion=0` lists cost the member no LIST once the cache holds the resource; a write
//! on the member is in the very next consistent LIST through the gateway, every time; a user
//! the member does not let list gets its own 403; and a LIST the cache cannot answer as the
//! member would (more items than its limit) is the member's, pages and all.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, PostParams};
use kube::Api;
use serde_json::Value;
use support::cache::{cache_configmaps, member_lists};
use support::fleet::Fleet;
use support::kubectl::{assert_refused_alike, kube_client};

/// kubectl straight to member1 as admin; must succeed.
fn direct(fleet: &Fleet, args: &[&str]) -> String {
    fleet.direct_ok("member1", args)
}

/// One member with configmaps in namespaces `a` and `a-b` (whose keys sort `a-b/` before `a/`,
/// though `a` sorts before `a-b`), one worker caching configmaps.
fn cached_fleet() -> Fleet {
    let mut fleet = Fleet::sim(1, 0);
    cache_configmaps(&fleet);
    fleet.serve(&["--workers", "1"], None);
    for namespace in ["a", "a-b", "default"] {
        if namespace != "default" {
            direct(&fleet, &["create", "namespace", namespace]);
        }
        for name in ["x", "y-1", "y"] {
            direct(
                &fleet,
                &[
                    "create",
                    "configmap",
                    name,
                    "-n",
                    namespace,
                    "--from-literal=k=v",
                ],
            );
        }
    }
    direct(&fleet, &["label", "configmap", "y", "-n", "a", "tier=web"]);
    fleet
}

/// The items of a `kubectl get -o json` list, each without the list's own resourceVersion.
fn items(json: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(json).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// `(namespace, name)` of each item.
fn names(items: &[Value]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|i| {
            let m = &i["metadata"];
            (
                m["namespace"].as_str().unwrap().to_owned(),
                m["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn cached_lists_equal_the_members_and_resource_version_0_costs_it_no_list() {
    let fleet = cached_fleet();
    // kubectl -o json: a consistent read with limit=500, all of it fitting one page.
    for args in [
        &["get", "configmaps", "-A", "-o", "json"][..],
        &["get", "configmaps", "-n", "a", "-o", "json"],
        &["get", "configmaps", "-A", "-l", "tier=web", "-o", "json"],
        &[
            "get",
            "configmaps",
            "-A",
            "--field-selector",
            "metadata.name=y",
            "-o",
            "json",
        ],
    ] {
        let through = items(&fleet.kubectl_ok("member1", args));
        let at_member = items(&direct(&fleet, args));
        assert_eq!(names(&through), names(&at_member), "{args:?}");
        assert_eq!(through, at_member, "{args:?}");
    }
    let all = names(&items(&direct(
        &fleet,
        &["get", "configmaps", "-A", "-o", "json"],
    )));
    let a_b = all.iter().position(|(ns, _)| ns == "a-b").unwrap();
    let a = all.iter().position(|(ns, _)| ns == "a").unwrap();
    assert!(a_b < a, "the member orders by storage key: {all:?}");
    // Informers list at resourceVersion=0: from memory, the member asked nothing.
    let raw = "/clusters/member1/api/v1/configmaps?resourceVersion=0";
    let first: Value =
        serde_json::from_str(&fleet.kubectl_ok("member1", &["get", "--raw", raw])).unwrap();
    assert_eq!(first["kind"], "ConfigMapList");
    assert_eq!(first["apiVersion"], "v1");
    let everything: Value =
        serde_json::from_str(&direct(&fleet, &["get", "--raw", "/api/v1/configmaps"])).unwrap();
    let before = member_lists(&fleet);
    for _ in 0..20 {
        let list: Value =
            serde_json::from_str(&fleet.kubectl_ok("member1", &["get", "--raw", raw])).unwrap();
        assert_eq!(list["items"], everything["items"]);
        assert!(
            list["items"][0].get("kind").is_none(),
            "list items go without kind, as the member's"
        );
    }
    assert_eq!(
        member_lists(&fleet),
        before,
        "20 LISTs at 0 reached the member"
    );
    // More items than the limit: the member's pages, its continue token.
    let paged: Value = serde_json::from_str(&fleet.kubectl_ok(
        "member1",
        &[
            "get",
            "--raw",
            "/clusters/member1/api/v1/configmaps?limit=2",
        ],
    ))
    .unwrap();
    assert_eq!(paged["items"].as_array().unwrap().len(), 2);
    assert!(paged["metadata"]["continue"].is_string(), "{paged}");
    assert_eq!(
        member_lists(&fleet),
        before + 1,
        "the paged LIST is the member's"
    );
}

#[test]
fn a_write_on_the_member_is_in_the_next_consistent_list_through_the_gateway_every_time() {
    let fleet = cached_fleet();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let member: Api<ConfigMap> = Api::namespaced(
            kube_client(&fleet.fleet_path("kubeconfig"), "member1").await,
            "a",
        );
        let gateway: Api<ConfigMap> = Api::namespaced(
            kube_client(&fleet.gateway_kubeconfig(), "member1").await,
            "a",
        );
        let lists_before = member_lists(&fleet);
        for i in 0..1000 {
            let name = format!("write-{i}");
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name.clone());
            member.create(&PostParams::default(), &cm).await.unwrap();
            // No resourceVersion: a consistent read.
            let list = gateway.list(&ListParams::default()).await.unwrap();
            assert!(
                list.items
                    .iter()
                    .any(|c| c.metadata.name.as_deref() == Some(name.as_str())),
                "write {i} missing from the next list"
            );
        }
        // Each consistent read asks the member's resourceVersion (a limit=1 list) and is then
        // served from memory; one the member served would have cost it a second list.
        let lists = member_lists(&fleet) - lists_before;
        // (The first read started the cache: one more list, the hub's own.)
        assert!(
            lists <= 1001,
            "{lists} member lists for 1000 consistent reads"
        );
    });
}

#[test]
fn a_user_the_member_does_not_let_list_gets_its_403() {
    let fleet = cached_fleet();
    let path = "/api/v1/namespaces/default/configmaps";
    let through = format!("/clusters/member1{path}");
    // bob may list configmaps in default: served, the member's items.
    let bob = fleet.kubectl_ok("member1", &["--user", "bob", "get", "--raw", &through]);
    let list: Value = serde_json::from_str(&bob).unwrap();
    let at_member: Value = serde_json::from_str(&direct(&fleet, &["get", "--raw", path])).unwrap();
    assert_eq!(list["items"], at_member["items"]);
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        4,
        "x, y, y-1 and kube-root-ca.crt"
    );
    // alice may list only namespace dev on the member: its own 403, byte for byte.
    assert_refused_alike(
        &fleet.gateway_kubeconfig(),
        &fleet.fleet_path("kubeconfig"),
        path,
        "list",
    );
}
