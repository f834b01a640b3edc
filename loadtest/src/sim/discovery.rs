//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`,
//! built from the resource table so they advertise exactly what the router serves. Aggregated
//! discovery is not supported, as on the recorded 1.24 server: an Accept that lists only
//! `as=APIGroupDiscoveryList` gets 406, and kubectl's list (ending in `application/json`) gets the
//! legacy documents (Surprises 6 and 19).
//!
//! Pure; called by the router.

use serde_json::{json, Value};

use crate::sim::resources::{self, Registry};

/// `/version`: always indented, no trailing newline (Surprise 1).
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "24",
        "gitVersion": "v1.24.0+fleetgate-sim",
        "gitCommit": "2cc6ddc68588debdbb6806e1b57e73207505324f",
        "gitTreeState": "clean",
        "buildDate": "2022-05-06T09:44:28Z",
        "goVersion": "go1.19.8",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_entry(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis`.
pub fn api_groups(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .group_versions()
        .iter()
        .map(|(g, v)| group_entry(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let (g, v) = registry
        .group_versions()
        .into_iter()
        .find(|(g, _)| g == group)?;
    let mut entry = group_entry(&g, &v);
    if let Some(map) = entry.as_object_mut() {
        let mut out = serde_json::Map::new();
        out.insert("kind".into(), json!("APIGroup"));
        out.insert("apiVersion".into(), json!("v1"));
        out.append(map);
        return Some(Value::Object(out));
    }
    None
}

/// `/api/v1` (no apiVersion field) or `/apis/<g>/<v>`.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Value {
    let mut entries: Vec<Value> = registry
        .all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(|r| r.discovery_entries())
        .collect();
    entries.extend(resources::review_entries(group));
    if group.is_empty() {
        json!({"kind": "APIResourceList", "groupVersion": version, "resources": entries})
    } else {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/{version}"), "resources": entries})
    }
}

/// Whether an Accept header asks only for aggregated discovery (which 1.24 refuses with 406).
pub fn only_aggregated(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return false };
    accept
        .split(',')
        .all(|range| range.contains("as=APIGroupDiscoveryList"))
}
