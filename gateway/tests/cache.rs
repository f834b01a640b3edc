//! LISTs served from memory (issue 34, docs/cache.md) as users meet them: with `spec.cache` on
//! for configmaps and namespaces, `kubectl get` (its Tables, AGE computed again) and
//! `kubectl get -o json` through the gateway give the member's items in the member's order (namespaces that sort differently as keys than as names included); informers'
//! `resourceVersion=0` lists cost the member no LIST once the cache holds the resource; a write
//! on the member is in the very next consistent LIST through the gateway, every time; a user
//! the member does not let list gets its own 403; pages (kubectl's chunks) come from memory with
//! kube-apiserver's own continue tokens, which the member reads too, and a page whose objects
//! changed since its list is the member's.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, PostParams};
use kube::Api;
use serde_json::Value;
use support::cache::{cache_configmaps, items, member_lists, names};
use support::fleet::Fleet;
use support::kubectl::{assert_refused_alike, kube_client, kubectl};

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
    // kubectl get's Tables: the same rows (AGE, the last column, computed again; it may tick
    // between the two runs).
    let from_memory = || fleet.metric("fleetgate_cache_lists_total{served=\"memory\"}");
    let memory_before = from_memory().unwrap();
    for args in [
        &["get", "configmaps", "-A"][..],
        &["get", "configmaps", "-n", "a-b"],
        &["get", "namespaces"],
    ] {
        let without_age = |text: &str| -> Vec<String> {
            text.lines()
                .map(|l| {
                    l.rsplit_once(' ')
                        .map_or(l, |(rest, _)| rest)
                        .trim_end()
                        .to_owned()
                })
                .collect()
        };
        let through = fleet.kubectl_ok("member1", args);
        assert_eq!(
            without_age(&through),
            without_age(&direct(&fleet, args)),
            "{args:?}"
        );
        assert!(
            through.lines().next().unwrap().ends_with("AGE"),
            "{through}"
        );
    }
    assert_eq!(
        from_memory(),
        Some(memory_before + 3),
        "the Tables came from memory"
    );
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
    // Pages: kubectl's chunks through the cache equal the member's whole list, and cost the
    // member one question (the first page's consistent read).
    let unpaged = items(&direct(&fleet, &["get", "configmaps", "-A", "-o", "json"]));
    let before = member_lists(&fleet);
    let chunked = items(&fleet.kubectl_ok(
        "member1",
        &["get", "configmaps", "-A", "--chunk-size", "2", "-o", "json"],
    ));
    assert_eq!(names(&chunked), names(&unpaged));
    assert!(
        chunked == unpaged,
        "the chunks' items differ from the member's"
    );
    assert_eq!(
        member_lists(&fleet),
        before + 1,
        "pages after the first from memory"
    );
    // The cache's continue token is kube-apiserver's: the member itself reads it.
    let first: Value = serde_json::from_str(&fleet.kubectl_ok(
        "member1",
        &[
            "get",
            "--raw",
            "/clusters/member1/api/v1/configmaps?limit=4",
        ],
    ))
    .unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap();
    let total = everything["items"].as_array().unwrap().len();
    assert_eq!(first["metadata"]["remainingItemCount"], total - 4);
    let from_member: Value = serde_json::from_str(&direct(
        &fleet,
        &[
            "get",
            "--raw",
            &format!("/api/v1/configmaps?limit=100&continue={token}"),
        ],
    ))
    .unwrap();
    let mut both = first["items"].as_array().unwrap().clone();
    both.extend(from_member["items"].as_array().unwrap().iter().cloned());
    assert_eq!(names(&both), names(everything["items"].as_array().unwrap()));
    assert!(both == *everything["items"].as_array().unwrap());
    // A page whose objects changed since its token's list: the member's (here its 410, once the
    // token's version left its history, exactly as without the cache).
    direct(&fleet, &["delete", "configmap", "y", "-n", "default"]);
    let at_member = kubectl(
        &fleet.fleet_path("kubeconfig"),
        "member1",
        &[
            "get",
            "--raw",
            &format!("/api/v1/configmaps?limit=2&continue={token}"),
        ],
    );
    let through = fleet.kubectl_output(
        "member1",
        &[
            "get",
            "--raw",
            &format!("/clusters/member1/api/v1/configmaps?limit=2&continue={token}"),
        ],
    );
    assert_eq!(through.status.success(), at_member.status.success());
    assert_eq!(through.stdout, at_member.stdout);
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

/// A field the member does not select on (`metadata.namespace` of namespaces, a cluster-scoped
/// kind) is its 400; over a cached resource the gateway serves it, for a LIST and a watch alike,
/// as any field of the cached objects (docs/cache.md): no namespace has one. A selector kube's
/// grammar refuses is still the member's to answer, in the member's own words.
#[test]
fn a_field_the_member_refuses_is_served_over_a_cached_resource() {
    let fleet = cached_fleet();
    let at_member = |path: &str| {
        kubectl(
            &fleet.fleet_path("kubeconfig"),
            "member1",
            &["get", "--raw", path],
        )
    };
    let through = |path: &str| {
        fleet.kubectl_output(
            "member1",
            &["get", "--raw", &format!("/clusters/member1{path}")],
        )
    };
    for query in [
        "fieldSelector=metadata.namespace%3Da",
        "watch=1&timeoutSeconds=1&fieldSelector=metadata.namespace%3Da",
    ] {
        let path = format!("/api/v1/namespaces?{query}");
        let refused = at_member(&path);
        assert!(!refused.status.success(), "{query}");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains("field label not supported"), "{said}");
        let served = through(&path);
        assert!(
            served.status.success(),
            "{query}: {}",
            String::from_utf8_lossy(&served.stderr)
        );
        let text = String::from_utf8_lossy(&served.stdout);
        if query.starts_with("watch") {
            assert_eq!(text, "", "no namespace has a namespace");
        } else {
            let list: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(list["kind"], "NamespaceList");
            assert_eq!(list["items"], serde_json::json!([]));
        }
    }
    let path = "/api/v1/namespaces?fieldSelector=metadata.name%3Da%3Db";
    let refused = at_member(path);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("unescaped character in value"), "{said}");
    assert_eq!(String::from_utf8_lossy(&through(path).stderr), said);
}

/// The fleet view (`/fleet`, karmada-search's path) serves its merged LISTs from the members'
/// caches: the first list, while they start, from the members with a Warning naming each; then
/// `kubectl --context fleet get` (Table and JSON, all of it and in chunks) gives every member's
/// objects, each member's page from memory.
#[test]
fn the_fleet_view_lists_from_the_members_caches() {
    let mut fleet = Fleet::sim(2, 0);
    cache_configmaps(&fleet);
    fleet.serve(&["--workers", "1"], None);
    for member in ["member1", "member2"] {
        for name in ["p", "q", "r"] {
            fleet.direct_ok(member, &["create", "configmap", name, "-n", "default"]);
        }
    }
    let names_of = |json: &str| -> Vec<(String, String)> {
        let list: Value = serde_json::from_str(json).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let m = &i["metadata"];
                let cluster = m["annotations"]["fleetgate.io/cluster"]
                    .as_str()
                    .or_else(|| m["labels"]["fleetgate.io/cluster"].as_str())
                    .unwrap_or("")
                    .to_owned();
                (cluster, m["name"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    let from_memory = || {
        fleet
            .metric("fleetgate_cache_lists_total{served=\"memory\"}")
            .unwrap()
    };
    let args = ["get", "configmaps", "-n", "default", "-o", "json"];
    // The first list starts the members' caches and does not wait for them: every member's
    // objects from the member, each named in a Warning.
    let cold = fleet.kubectl_output("fleet", &args);
    assert!(cold.status.success());
    let warned = String::from_utf8_lossy(&cold.stderr);
    for member in ["member1", "member2"] {
        assert!(
            warned.contains(&format!("cluster {member}: its cache is not synced yet")),
            "{warned}"
        );
    }
    let merged = names_of(&String::from_utf8_lossy(&cold.stdout));
    // Every member's p, q, r and kube-root-ca.crt.
    assert_eq!(merged.len(), 8, "{merged:?}");
    // Once the caches have listed (no Warning any more), from memory.
    let synced = |args: &[&str]| {
        let started = std::time::Instant::now();
        loop {
            let out = fleet.kubectl_output("fleet", args);
            assert!(out.status.success());
            if out.stderr.is_empty() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "never synced"
            );
        }
    };
    assert_eq!(names_of(&synced(&args)), merged);
    let before = from_memory();
    let warm = names_of(&fleet.kubectl_ok("fleet", &args));
    assert_eq!(warm, merged);
    assert!(
        from_memory() >= before + 2,
        "each member's page from memory"
    );
    let chunked = fleet.kubectl_ok(
        "fleet",
        &[
            "get",
            "configmaps",
            "-n",
            "default",
            "--chunk-size",
            "3",
            "-o",
            "json",
        ],
    );
    assert_eq!(names_of(&chunked), merged);
    // kubectl get's Table, with its CLUSTER column, from memory too (its own cache: the Table
    // form).
    synced(&["get", "configmaps", "-n", "default"]);
    let before = from_memory();
    let table = fleet.kubectl_ok("fleet", &["get", "configmaps", "-n", "default"]);
    assert_eq!(table.lines().count(), 9, "{table}");
    assert!(
        table.lines().next().unwrap().starts_with("CLUSTER"),
        "{table}"
    );
    assert!(
        from_memory() >= before + 2,
        "each member's Table from memory"
    );
}
