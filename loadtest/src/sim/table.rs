//! Content negotiation (`Accept`) and the server-side printing kubectl asks for: `Table`
//! (`application/json;as=Table;v=v1;g=meta.k8s.io`) with per-kind columns, and
//! `PartialObjectMetadata(List)`. Shapes follow the recorded server (fixtures README, Surprise 9).
//!
//! Pure functions over objects; never touches the store. Called by the router and by `watch`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::sim::selectors;

/// What the client accepts, in the order it listed, narrowed to what the sim can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Yaml,
    /// `meta.k8s.io/<version>` Table.
    Table(&'static str),
    /// `meta.k8s.io/<version>` PartialObjectMetadata (single) or ...List.
    PartialMetadata(&'static str),
}

/// Picks the first media range of `accept` that the sim serves; None when none (406).
pub fn negotiate(accept: Option<&str>) -> Option<OutputFormat> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(OutputFormat::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut as_kind, mut version, mut group) = (None, None, None);
        for param in parts {
            if let Some((k, v)) = param.split_once('=') {
                match k.trim() {
                    "as" => as_kind = Some(v.trim().to_string()),
                    "v" => version = Some(v.trim().to_string()),
                    "g" => group = Some(v.trim().to_string()),
                    _ => {}
                }
            }
        }
        match (media.as_str(), as_kind.as_deref()) {
            ("application/json", Some(kind)) => {
                if group.as_deref() != Some("meta.k8s.io") {
                    continue;
                }
                let version = match version.as_deref() {
                    Some("v1") => "v1",
                    Some("v1beta1") => "v1beta1",
                    _ => continue,
                };
                match kind {
                    "Table" => return Some(OutputFormat::Table(version)),
                    "PartialObjectMetadata" | "PartialObjectMetadataList" => {
                        return Some(OutputFormat::PartialMetadata(version))
                    }
                    _ => continue,
                }
            }
            ("application/json", None) | ("*/*", _) | ("application/*", _) => {
                return Some(OutputFormat::Json)
            }
            ("application/yaml", None) => return Some(OutputFormat::Yaml),
            _ => continue,
        }
    }
    None
}

/// `includeObject=` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: http://kubernetes.io/docs/user-guide/identifiers#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn column(name: &str, description: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    // Every recorded column says "string", even Data whose cells are numbers (Surprise 9).
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": priority})
}

/// The column definitions of `resource`.
pub fn columns(resource: &str) -> Vec<Value> {
    let name = column("Name", NAME_DESCRIPTION, 0);
    let age = column("Age", AGE_DESCRIPTION, 0);
    match resource {
        "pods" => vec![
            name,
            column("Ready", "The aggregate readiness state of this pod for accepting traffic.", 0),
            column("Status", "The aggregate status of the containers in this pod.", 0),
            column("Restarts", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.", 0),
            age,
            column("IP", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", 1),
            column("Node", "NodeName is a request to schedule this pod onto a specific node. If it is non-empty, the scheduler simply schedules this pod onto that node, assuming that it fits resource requirements.", 1),
            column("Nominated Node", "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.", 1),
            column("Readiness Gates", "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates", 1),
        ],
        "configmaps" => vec![
            name,
            column("Data", "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.", 0),
            age,
        ],
        "secrets" => vec![
            name,
            column("Type", "Used to facilitate programmatic handling of secret data.", 0),
            column("Data", "Data contains the secret data.", 0),
            age,
        ],
        "namespaces" => vec![name, column("Status", "The status of the namespace", 0), age],
        "nodes" => vec![
            name,
            column("Status", "The status of the node", 0),
            column("Roles", "The roles of the node", 0),
            age,
            column("Version", "Kubelet Version reported by the node.", 0),
            column("Internal-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
            column("External-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
            column("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", 1),
            column("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).", 1),
            column("Container-Runtime", "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).", 1),
        ],
        "services" => vec![
            name,
            column("Type", "type determines how the Service is exposed.", 0),
            column("Cluster-IP", "clusterIP is the IP address of the service and is usually assigned randomly.", 0),
            column("External-IP", "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.", 0),
            column("Port(s)", "The list of ports that are exposed by this service.", 0),
            age,
            column("Selector", "Route service traffic to pods with label keys and values matching this selector.", 1),
        ],
        "deployments" => vec![
            name,
            column("Ready", "Number of the pod with ready state", 0),
            column("Up-to-date", "Total number of non-terminated pods targeted by this deployment that have the desired template spec.", 0),
            column("Available", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.", 0),
            age,
            column("Containers", "Names of each container in the template.", 1),
            column("Images", "Images referenced by each container in the template.", 1),
            column("Selector", "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.", 1),
        ],
        "events" => vec![
            column("Last Seen", "The time at which the most recent occurrence of this event was recorded.", 0),
            column("Type", "Type of this event (Normal, Warning), new types could be added in the future.", 0),
            column("Reason", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.", 0),
            column("Object", "The object that this event is about.", 0),
            column("Message", "A human-readable description of the status of this operation.", 0),
            column("Name", NAME_DESCRIPTION, 1),
        ],
        _ => vec![name, age],
    }
}

/// Go's `duration.HumanDuration`, as kubectl prints ages.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let minutes = s / 60;
    if minutes < 10 {
        let rem = s % 60;
        return if rem == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{rem}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let rem = minutes % 60;
        return if rem == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{rem}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let rem = hours % 24;
        let days = hours / 24;
        return if rem == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{rem}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let years = hours / 24 / 365;
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{days}d")
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age_of(timestamp: &Value) -> String {
    let Some(ts) = timestamp.as_str() else {
        return "<unknown>".into();
    };
    match chrono::DateTime::parse_from_rfc3339(ts) {
        Ok(t) => human_duration((chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

fn str_or<'a>(v: &'a Value, default: &'a str) -> &'a str {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or(default)
}

fn count(v: &Value) -> usize {
    v.as_object().map_or(0, |m| m.len())
}

/// The cells of one object's row.
pub fn cells(resource: &str, object: &Value) -> Vec<Value> {
    let meta = &object["metadata"];
    let name = json!(meta["name"].as_str().unwrap_or(""));
    let age = json!(age_of(&meta["creationTimestamp"]));
    let spec = &object["spec"];
    let status = &object["status"];
    match resource {
        "pods" => {
            let containers = spec["containers"].as_array().map_or(0, |c| c.len());
            let statuses = status["containerStatuses"].as_array();
            let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
            let restarts: i64 = statuses.map_or(0, |s| {
                s.iter()
                    .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                    .sum()
            });
            let phase = if meta.get("deletionTimestamp").is_some() {
                "Terminating"
            } else {
                str_or(&status["phase"], "Pending")
            };
            vec![
                name,
                json!(format!("{ready}/{containers}")),
                json!(phase),
                json!(restarts.to_string()),
                age,
                json!(str_or(&status["podIP"], "<none>")),
                json!(str_or(&spec["nodeName"], "<none>")),
                json!(str_or(&status["nominatedNodeName"], "<none>")),
                json!("<none>"),
            ]
        }
        "configmaps" => {
            let data = count(&object["data"]) + count(&object["binaryData"]);
            vec![name, json!(data), age]
        }
        "secrets" => vec![
            name,
            json!(str_or(&object["type"], "Opaque")),
            json!(count(&object["data"])),
            age,
        ],
        "namespaces" => vec![name, json!(str_or(&status["phase"], "Active")), age],
        "nodes" => {
            let ready = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                })
                .unwrap_or("Unknown");
            let address = |kind: &str| {
                status["addresses"]
                    .as_array()
                    .and_then(|a| a.iter().find(|a| a["type"] == kind))
                    .and_then(|a| a["address"].as_str())
                    .unwrap_or("<none>")
                    .to_string()
            };
            let info = &status["nodeInfo"];
            vec![
                name,
                json!(ready),
                json!("<none>"),
                age,
                json!(str_or(&info["kubeletVersion"], "")),
                json!(address("InternalIP")),
                json!(address("ExternalIP")),
                json!(str_or(&info["osImage"], "<unknown>")),
                json!(str_or(&info["kernelVersion"], "<unknown>")),
                json!(str_or(&info["containerRuntimeVersion"], "<unknown>")),
            ]
        }
        "services" => {
            let ports = spec["ports"]
                .as_array()
                .map(|ports| {
                    ports
                        .iter()
                        .map(|p| {
                            format!(
                                "{}/{}",
                                p["port"].as_i64().unwrap_or(0),
                                p["protocol"].as_str().unwrap_or("TCP")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            let selector = Some(selectors::match_labels_text(&spec["selector"]))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(str_or(&spec["type"], "ClusterIP")),
                json!(str_or(&spec["clusterIP"], "<none>")),
                json!("<none>"),
                json!(ports),
                age,
                json!(selector),
            ]
        }
        "deployments" => {
            let desired = spec["replicas"].as_i64().unwrap_or(1);
            let ready = status["readyReplicas"].as_i64().unwrap_or(0);
            let containers = spec["template"]["spec"]["containers"].as_array();
            let join = |field: &str| {
                containers
                    .map(|c| {
                        c.iter()
                            .map(|c| c[field].as_str().unwrap_or("").to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            };
            let selector = selectors::match_labels_text(&spec["selector"]["matchLabels"]);
            vec![
                name,
                json!(format!("{ready}/{desired}")),
                json!(status["updatedReplicas"].as_i64().unwrap_or(0)),
                json!(status["availableReplicas"].as_i64().unwrap_or(0)),
                age,
                json!(join("name")),
                json!(join("image")),
                json!(selector),
            ]
        }
        "events" => {
            let involved = &object["involvedObject"];
            let last = if object["lastTimestamp"].is_string() {
                age_of(&object["lastTimestamp"])
            } else {
                age_of(&meta["creationTimestamp"])
            };
            vec![
                json!(last),
                json!(str_or(&object["type"], "Normal")),
                json!(str_or(&object["reason"], "")),
                json!(format!(
                    "{}/{}",
                    involved["kind"].as_str().unwrap_or("").to_ascii_lowercase(),
                    involved["name"].as_str().unwrap_or("")
                )),
                json!(str_or(&object["message"], "")),
                name,
            ]
        }
        _ => vec![name, age],
    }
}

/// `PartialObjectMetadata` of an object.
pub fn partial_metadata(object: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": object["metadata"],
    })
}

/// Options of one Table response.
pub struct TableOptions<'a> {
    pub resource: &'a str,
    pub version: &'a str,
    pub include: IncludeObject,
    /// Whether to emit `columnDefinitions` (a Table watch sends them only in the first event).
    pub with_columns: bool,
    pub list_metadata: Value,
}

/// A Table of `objects`.
pub fn table(objects: &[Arc<Value>], opts: &TableOptions<'_>) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match opts.include {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => partial_metadata(o, opts.version),
                IncludeObject::Object => o.as_ref().clone(),
            };
            json!({"cells": cells(opts.resource, o), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{}", opts.version),
        "metadata": opts.list_metadata,
        "columnDefinitions": if opts.with_columns { json!(columns(opts.resource)) } else { Value::Null },
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_accept_list_picks_table() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(Some(accept)), Some(OutputFormat::Table("v1")));
        assert_eq!(
            negotiate(Some("application/json;as=Table;v=v1beta1;g=meta.k8s.io")),
            Some(OutputFormat::Table("v1beta1"))
        );
        assert!(negotiate(Some("application/json;as=Table;v=v2;g=meta.k8s.io")).is_none());
        assert!(negotiate(Some("application/xml")).is_none());
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf,application/json")),
            Some(OutputFormat::Json)
        );
    }

    #[test]
    fn human_durations_match_go() {
        assert_eq!(human_duration(29), "29s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(3600 * 5), "5h");
        assert_eq!(human_duration(3600 * 30), "30h");
    }
}
