//! The API resources a simulated member serves: one static table that both discovery
//! (`/api/v1`, `/apis/<g>/<v>`) and the router read, so that what discovery advertises is exactly
//! what the router serves.
//!
//! Pure data and lookups; never touches the store or the network. Called by `discovery` and `api`.

use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

/// One resource kind (a collection), e.g. core/v1 `pods`.
#[derive(Debug)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// The store's key for this resource's objects (the plural for built-in resources,
    /// `plural.group` for resources registered by a CRD, so they never collide).
    pub key: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources the router serves (`status`, `log`, `exec`, ...).
    pub subresources: &'static [Subresource],
    /// Whether `metadata.generation` is kept (objects with a spec).
    pub has_generation: bool,
    pub storage_version_hash: &'static str,
}

/// A subresource as discovery lists it.
#[derive(Debug)]
pub struct Subresource {
    pub name: &'static str,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

const OBJECT_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const NAMESPACE_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

const fn status(kind: &'static str) -> Subresource {
    Subresource {
        name: "status",
        kind,
        verbs: STATUS_VERBS,
    }
}

/// Every resource served, in discovery order (alphabetical within a group, as the apiserver does).
pub static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        key: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "qFsyl6wFWjQ=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        key: "events",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "r2yiGXH7wu8=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        key: "namespaces",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        subresources: &[status("Namespace")],
        has_generation: false,
        storage_version_hash: "Q3oi5N2YM8M=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        key: "nodes",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        subresources: &[status("Node")],
        has_generation: false,
        storage_version_hash: "XwShjMxG9Fs=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "pods",
        key: "pods",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        categories: &["all"],
        subresources: &[
            Subresource {
                name: "attach",
                kind: "PodAttachOptions",
                verbs: &["create", "get"],
            },
            Subresource {
                name: "exec",
                kind: "PodExecOptions",
                verbs: &["create", "get"],
            },
            Subresource {
                name: "log",
                kind: "Pod",
                verbs: &["get"],
            },
            Subresource {
                name: "portforward",
                kind: "PodPortForwardOptions",
                verbs: &["create", "get"],
            },
            status("Pod"),
        ],
        has_generation: false,
        storage_version_hash: "xPOwRZ+Yhw8=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "secrets",
        key: "secrets",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "S6u1pOWzb84=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "services",
        key: "services",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        categories: &["all"],
        subresources: &[status("Service")],
        has_generation: false,
        storage_version_hash: "0/CO1lhkEBI=",
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        key: "serviceaccounts",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "pbx9ZvyFpBE=",
    },
    ResourceInfo {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        key: "daemonsets",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        categories: &["all"],
        subresources: &[status("DaemonSet")],
        has_generation: true,
        storage_version_hash: "dd7pWHUlMKQ=",
    },
    ResourceInfo {
        group: "apps",
        version: "v1",
        plural: "deployments",
        key: "deployments",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        categories: &["all"],
        subresources: &[
            Subresource {
                name: "scale",
                kind: "Scale",
                verbs: STATUS_VERBS,
            },
            status("Deployment"),
        ],
        has_generation: true,
        storage_version_hash: "8aSe+NMegvE=",
    },
    ResourceInfo {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        key: "replicasets",
        kind: "ReplicaSet",
        namespaced: true,
        short_names: &["rs"],
        categories: &["all"],
        subresources: &[status("ReplicaSet")],
        has_generation: true,
        storage_version_hash: "P1RzHs8/mWQ=",
    },
    ResourceInfo {
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        key: "statefulsets",
        kind: "StatefulSet",
        namespaced: true,
        short_names: &["sts"],
        categories: &["all"],
        subresources: &[status("StatefulSet")],
        has_generation: true,
        storage_version_hash: "H+vl74LkKdo=",
    },
    ResourceInfo {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        key: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short_names: &["pdb"],
        categories: &[],
        subresources: &[status("PodDisruptionBudget")],
        has_generation: true,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        key: "clusterrolebindings",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        key: "clusterroles",
        kind: "ClusterRole",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        key: "rolebindings",
        kind: "RoleBinding",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        key: "roles",
        kind: "Role",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        has_generation: false,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        key: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        subresources: &[status("CustomResourceDefinition")],
        has_generation: true,
        storage_version_hash: "jfWCUB31mvA=",
    },
    ResourceInfo {
        group: "fleetgate.io",
        version: "v1alpha1",
        plural: "accesspolicies",
        key: "accesspolicies",
        kind: "AccessPolicy",
        namespaced: false,
        short_names: &[],
        categories: &["fleetgate"],
        subresources: &[],
        has_generation: true,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "fleetgate.io",
        version: "v1alpha1",
        plural: "clusters",
        key: "clusters",
        kind: "Cluster",
        namespaced: false,
        short_names: &[],
        categories: &["fleetgate"],
        subresources: &[],
        has_generation: true,
        storage_version_hash: "",
    },
    ResourceInfo {
        group: "fleetgate.io",
        version: "v1alpha1",
        plural: "gateways",
        key: "gateways",
        kind: "Gateway",
        namespaced: false,
        short_names: &[],
        categories: &["fleetgate"],
        subresources: &[],
        has_generation: true,
        storage_version_hash: "",
    },
];

impl ResourceInfo {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store's key for this resource's objects.
    pub fn store_key(&self) -> &'static str {
        self.key
    }

    pub fn has_subresource(&self, name: &str) -> bool {
        self.subresources.iter().any(|s| s.name == name)
    }

    /// Whether the object has a `status` that the main resource must not change.
    pub fn has_status_subresource(&self) -> bool {
        self.has_subresource("status")
    }

    /// The discovery entries (the resource, then its subresources).
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": "",
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": if self.plural == "namespaces" { NAMESPACE_VERBS } else { OBJECT_VERBS },
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        if !self.storage_version_hash.is_empty() {
            main["storageVersionHash"] = json!(self.storage_version_hash);
        }
        let mut entries = vec![main];
        for sub in self.subresources {
            let mut entry = json!({
                "name": format!("{}/{}", self.plural, sub.name),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": if sub.kind.is_empty() { self.kind } else { sub.kind },
                "verbs": sub.verbs,
            });
            if sub.name == "scale" {
                // Scale lives in another group, and discovery says so (as apps/v1 does).
                entry["group"] = json!("autoscaling");
                entry["version"] = json!("v1");
            }
            entries.push(entry);
        }
        entries
    }
}

/// The resource `plural` in `group`/`version`, if served.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Groups besides core with the resources the store serves, plus the review-only groups.
/// (group, version) in the order `/apis` lists them.
pub static GROUP_VERSIONS: &[(&str, &str)] = &[
    ("apps", "v1"),
    ("apiextensions.k8s.io", "v1"),
    ("authentication.k8s.io", "v1"),
    ("authorization.k8s.io", "v1"),
    ("fleetgate.io", "v1alpha1"),
    ("policy", "v1"),
    ("rbac.authorization.k8s.io", "v1"),
];

/// Discovery entries of the review-only groups (they have no stored objects).
pub fn review_entries(group: &str) -> Vec<Value> {
    match group {
        "authentication.k8s.io" => vec![
            json!({"name":"selfsubjectreviews","singularName":"","namespaced":false,"kind":"SelfSubjectReview","verbs":["create"]}),
        ],
        "authorization.k8s.io" => vec![
            json!({"name":"selfsubjectaccessreviews","singularName":"","namespaced":false,"kind":"SelfSubjectAccessReview","verbs":["create"]}),
            json!({"name":"selfsubjectrulesreviews","singularName":"","namespaced":false,"kind":"SelfSubjectRulesReview","verbs":["create"]}),
        ],
        _ => Vec::new(),
    }
}

/// The resources one member serves: the built-in table plus those registered by stored CRDs.
///
/// A registered resource's strings are leaked (`&'static`), so that it is used exactly like a
/// built-in one; a sim registers a handful of CRDs in its lifetime, and re-registering the same
/// CRD reuses the existing entry.
#[derive(Default)]
pub struct Registry {
    dynamic: RwLock<Vec<&'static ResourceInfo>>,
}

/// The status subresource of a custom resource.
static CRD_STATUS: &[Subresource] = &[Subresource {
    name: "status",
    kind: "",
    verbs: STATUS_VERBS,
}];

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_list(values: &Value) -> &'static [&'static str] {
    let list: Vec<&'static str> = values
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(leak).collect())
        .unwrap_or_default();
    Box::leak(list.into_boxed_slice())
}

impl Registry {
    fn dynamic(&self) -> Vec<&'static ResourceInfo> {
        self.dynamic
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every resource, built-in first.
    pub fn all(&self) -> Vec<&'static ResourceInfo> {
        RESOURCES.iter().chain(self.dynamic()).collect()
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
        find(group, version, plural).or_else(|| {
            self.dynamic()
                .into_iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
        })
    }

    /// (group, version) pairs of `/apis`, built-in first.
    pub fn group_versions(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = GROUP_VERSIONS
            .iter()
            .map(|(g, v)| (g.to_string(), v.to_string()))
            .collect();
        for r in self.dynamic() {
            let pair = (r.group.to_string(), r.version.to_string());
            if !out.contains(&pair) {
                out.push(pair);
            }
        }
        out
    }

    pub fn group_exists(&self, group: &str) -> bool {
        self.group_versions().iter().any(|(g, _)| g == group)
    }

    pub fn group_version_exists(&self, group: &str, version: &str) -> bool {
        (group.is_empty() && version == "v1")
            || self
                .group_versions()
                .iter()
                .any(|(g, v)| g == group && v == version)
    }

    /// Rebuilds the registered resources from the stored CRDs (after any CRD write).
    pub fn sync_crds(&self, crds: &[Arc<Value>]) {
        let existing = self.dynamic();
        let mut wanted: Vec<&'static ResourceInfo> = Vec::new();
        for crd in crds {
            let spec = &crd["spec"];
            let (Some(group), Some(plural), Some(kind)) = (
                spec["group"].as_str(),
                spec["names"]["plural"].as_str(),
                spec["names"]["kind"].as_str(),
            ) else {
                continue;
            };
            let namespaced = spec["scope"].as_str() == Some("Namespaced");
            for version in spec["versions"].as_array().into_iter().flatten() {
                let Some(name) = version["name"].as_str() else {
                    continue;
                };
                if version["served"] == false || find(group, name, plural).is_some() {
                    continue;
                }
                let has_status = version["subresources"]["status"].is_object();
                let reuse = existing.iter().find(|r| {
                    r.group == group
                        && r.version == name
                        && r.plural == plural
                        && r.kind == kind
                        && r.namespaced == namespaced
                        && r.has_status_subresource() == has_status
                });
                let info = match reuse {
                    Some(info) => *info,
                    None => &*Box::leak(Box::new(ResourceInfo {
                        group: leak(group),
                        version: leak(name),
                        plural: leak(plural),
                        key: leak(&format!("{plural}.{group}")),
                        kind: leak(kind),
                        namespaced,
                        short_names: leak_list(&spec["names"]["shortNames"]),
                        categories: leak_list(&spec["names"]["categories"]),
                        subresources: if has_status { CRD_STATUS } else { &[] },
                        has_generation: true,
                        storage_version_hash: "",
                    })),
                };
                wanted.push(info);
            }
        }
        *self.dynamic.write().unwrap_or_else(|e| e.into_inner()) = wanted;
    }
}
