//! `spec.cache` in tests (docs/cache.md): turning it on for configmaps in the fleet's Gateway,
//! and counting the LISTs that reach a simulated member. Used by `cache.rs` and `cache_storm.rs`.

use super::fleet::Fleet;

/// Turns on `spec.cache` for configmaps in the fleet's Gateway.
pub fn cache_configmaps(fleet: &Fleet) {
    fleet.edit_gateway(|gateway| {
        let cache: serde_yaml::Value = serde_yaml::from_str(
            "resources: [{group: '', version: v1, resource: configmaps}]\nmemoryBudget: 64Mi\n",
        )
        .unwrap();
        gateway["spec"]
            .as_mapping_mut()
            .unwrap()
            .insert("cache".into(), cache);
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
