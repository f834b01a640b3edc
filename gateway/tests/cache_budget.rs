//! The cache's bounds (issue 34, docs/cache.md#memory) as an operator meets them: a resource
//! whose objects do not fit `memoryBudget`, or that hold more than its `maxObjects` (from the
//! start, or once the member grew past it), is dropped from the cache; its LISTs then go to the
//! member and give the member's items, `fleetgate_cache_evictions_total` counts the drop by
//! reason, `/readyz?verbose` names the resource and why (the gateway stays ready), and the
//! resource is not cached again meanwhile (each later LIST costs the member one LIST, not two).

mod support;

use std::time::Duration;

use support::cache::{items, member_lists, names};
use support::fleet::Fleet;

/// A one-worker gateway over one simulated member with `objects` load ConfigMaps (about 1 KiB
/// each), caching configmaps (with `max_objects`, when given) and namespaces in a cache of
/// `budget`.
fn fleet_caching(objects: usize, budget: &str, max_objects: Option<usize>) -> Fleet {
    let mut fleet = Fleet::sim(1, objects);
    let limit = max_objects.map_or(String::new(), |n| format!(", maxObjects: {n}"));
    let cache = format!(
        "resources: [{{group: '', version: v1, resource: configmaps{limit}}}, {{group: '', version: v1, resource: namespaces}}]\nmemoryBudget: {budget}\n"
    );
    fleet.edit_gateway(|gateway| {
        let spec = gateway["spec"].as_mapping_mut().unwrap();
        spec.insert("cache".into(), serde_yaml::from_str(&cache).unwrap());
    });
    fleet.serve(&["--workers", "1"], None);
    fleet
}

/// An object's `(namespace, name)`.
type Named = (String, String);

/// The `(namespace, name)` of every item of `kubectl get configmaps -A -o json` (one LIST, no
/// pages), through the gateway and straight to the member.
fn configmaps(fleet: &Fleet) -> (Vec<Named>, Vec<Named>) {
    let args = ["get", "configmaps", "-A", "-o", "json", "--chunk-size=0"];
    (
        names(&items(&fleet.kubectl_ok("member1", &args))),
        names(&items(&fleet.direct_ok("member1", &args))),
    )
}

fn served(fleet: &Fleet, by: &str) -> i64 {
    fleet
        .metric(&format!("fleetgate_cache_lists_total{{served=\"{by}\"}}"))
        .unwrap()
}

fn evictions(fleet: &Fleet, reason: &str) -> i64 {
    fleet
        .metric(&format!(
            "fleetgate_cache_evictions_total{{reason=\"{reason}\"}}"
        ))
        .unwrap()
}

#[test]
fn a_resource_past_the_memory_budget_is_listed_by_the_member() {
    // 1,000 ConfigMaps of about 1 KiB hold well past a 1 MiB budget.
    let fleet = fleet_caching(1000, "1Mi", None);
    let (member_before, by_member_before) = (member_lists(&fleet), served(&fleet, "member"));
    let (through, direct) = configmaps(&fleet);
    assert!(through.len() > 1000, "{}", through.len());
    assert_eq!(through, direct, "the member's items, in its order");
    assert_eq!(evictions(&fleet, "budget"), 1);
    assert_eq!(evictions(&fleet, "max_objects"), 0);
    assert_eq!(served(&fleet, "member"), by_member_before + 1);
    // The cache's own list (cut short past the budget), the member's answer, and the direct one.
    assert_eq!(member_lists(&fleet), member_before + 3);
    let bytes = fleet.metric("fleetgate_cache_bytes").unwrap();
    assert!(
        bytes < 1 << 20,
        "what the dropped list held is given back: {bytes}"
    );
    let ready = fleet.admin_get("/readyz?verbose");
    assert!(ready.starts_with("HTTP/1.1 200"), "still ready: {ready}");
    assert!(
        ready.contains("[+]cache: cluster member1 configmaps (all namespaces) dropped")
            && ready.contains("memoryBudget of 1048576 bytes"),
        "{ready}"
    );
    // Not cached again while it would not fit: each LIST costs the member its own, no more.
    let member_before = member_lists(&fleet);
    let (through, direct) = configmaps(&fleet);
    assert_eq!(through, direct);
    assert_eq!(
        evictions(&fleet, "budget"),
        1,
        "not listed, so not dropped again"
    );
    assert_eq!(member_lists(&fleet), member_before + 2);
    // What fits is still cached: namespaces from memory.
    let memory_before = served(&fleet, "memory");
    fleet.kubectl_ok("member1", &["get", "namespaces", "-o", "json"]);
    assert_eq!(served(&fleet, "memory"), memory_before + 1);
    assert!(fleet.metric("fleetgate_cache_objects").unwrap() > 0);
}

#[test]
fn a_member_that_grows_past_max_objects_is_dropped_from_the_cache() {
    // The load ConfigMaps and the member's own (kube-root-ca.crt per namespace).
    let mut fleet = Fleet::sim(1, 20);
    let count = |fleet: &Fleet| {
        items(&fleet.direct_ok("member1", &["get", "configmaps", "-A", "-o", "json"])).len()
    };
    let held = count(&fleet);
    fleet.edit_gateway(|gateway| {
        let spec = gateway["spec"].as_mapping_mut().unwrap();
        let cache = format!(
            "resources: [{{group: '', version: v1, resource: configmaps, maxObjects: {held}}}]\n"
        );
        spec.insert("cache".into(), serde_yaml::from_str(&cache).unwrap());
    });
    fleet.serve(&["--workers", "1"], None);
    // At its limit: cached.
    let by_memory_before = served(&fleet, "memory");
    let (through, direct) = configmaps(&fleet);
    assert_eq!(through, direct);
    assert_eq!(served(&fleet, "memory"), by_memory_before + 1);
    assert_eq!(fleet.metric("fleetgate_cache_objects"), Some(held as i64));
    // One more on the member: the cache's watch sees it and drops the resource.
    fleet.direct_ok(
        "member1",
        &["create", "configmap", "one-more", "-n", "default"],
    );
    fleet.admin_until(
        "/metrics",
        "fleetgate_cache_evictions_total{reason=\"max_objects\"} 1",
        Duration::from_secs(30),
        "the resource is dropped once past its maxObjects",
    );
    let ready = fleet.admin_get("/readyz?verbose");
    assert!(
        ready.contains("[+]cache: cluster member1 configmaps (all namespaces) dropped")
            && ready.contains(&format!(
                "its {} objects passed its maxObjects of {held}",
                held + 1
            )),
        "{ready}"
    );
    fleet.admin_until(
        "/metrics",
        "fleetgate_cache_objects 0\n",
        Duration::from_secs(30),
        "the dropped hub gives its objects back",
    );
    // From then on the member answers, and the cache does not list it again.
    let (member_before, by_member_before) = (member_lists(&fleet), served(&fleet, "member"));
    let (through, direct) = configmaps(&fleet);
    assert_eq!(through, direct);
    assert!(through.contains(&("default".to_owned(), "one-more".to_owned())));
    assert_eq!(served(&fleet, "member"), by_member_before + 1);
    assert_eq!(member_lists(&fleet), member_before + 2);
    assert_eq!(evictions(&fleet, "max_objects"), 1);
}
