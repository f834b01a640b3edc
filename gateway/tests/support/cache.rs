//! `spec.cache` in tests (docs/cache.md): turning it on for configmaps in the fleet's Gateway,
//! counting the LISTs that reach a simulated member, and reading the items of a list. Used by
//! `cache.rs`, `cache_storm.rs` and `cache_budget.rs`.

use serde_json::Value;

use super::fleet::Fleet;

/// Turns on `spec.cache` for configmaps (and namespaces) in the fleet's Gateway.
pub fn cache_configmaps(fleet: &Fleet) {
    cache_configmaps_in_scope(fleet, None);
}

/// Turns on `spec.cache` for configmaps and namespaces, and with a `scope` also `spec.sharedWatches` for them
/// with that scope (`Gateway`: one hub per key for the whole gateway).
pub fn cache_configmaps_in_scope(fleet: &Fleet, scope: Option<&str>) {
    let configmaps = "resources: [{group: '', version: v1, resource: configmaps}]\n";
    fleet.edit_gateway(|gateway| {
        let spec = gateway["spec"].as_mapping_mut().unwrap();
        let yaml = |text: String| serde_yaml::from_str::<serde_yaml::Value>(&text).unwrap();
        spec.insert(
            "cache".into(),
            yaml(
                "resources: [{group: '', version: v1, resource: configmaps}, {group: '', version: v1, resource: namespaces}]\nmemoryBudget: 64Mi\n".into(),
            ),
        );
        if let Some(scope) = scope {
            spec.insert(
                "sharedWatches".into(),
                yaml(format!("{configmaps}scope: {scope}\n")),
            );
        }
    });
}

/// `fleetgate_sim_requests_total{verb="list",resource="configmaps"}` of member1: the LISTs of
/// configmaps it served (read from its `/metrics` as admin, which is no LIST).
pub fn member_lists(fleet: &Fleet) -> u64 {
    let metrics = fleet.direct_ok("member1", &["get", "--raw", "/metrics"]);
    let series = "fleetgate_sim_requests_total{verb=\"list\",resource=\"configmaps\"} ";
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// The items of a `kubectl get -o json` list.
pub fn items(json: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(json).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// `(namespace, name)` of each item.
pub fn names(items: &[Value]) -> Vec<(String, String)> {
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
