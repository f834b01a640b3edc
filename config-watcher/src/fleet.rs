//! The fleet view's configuration: which kinds `/fleet` merges across clusters, and from which
//! clusters. Two objects say it:
//! - `fleetgate.io/v1alpha1` `FleetResource` (`spec.resourceSelectors`: `{apiVersion, kind}`,
//!   optionally `resource` where kube's plural guess is wrong; `spec.clusters`: names and a label
//!   selector, as an AccessPolicy's, absent for every cluster);
//! - Karmada's `search.karmada.io/v1alpha1` `ResourceRegistry` (`spec.resourceSelectors`,
//!   `spec.targetCluster.clusterNames` / `labelSelector` / `exclude`), read as the same thing so a
//!   karmada-search setup keeps its registries. Its `backendStore` is ignored: fleetgate serves
//!   from the members, never from a cache.
//!
//! Several objects naming one kind merge: the kind spans the union of their clusters. Resolved
//! against the clusters once per load into a [`FleetView`]; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::objects::{FleetResourceSpec, LabelSelector, ObjectMeta, PolicyClusters};

/// The API version of Karmada's ResourceRegistry objects.
pub const KARMADA_SEARCH_API_VERSION: &str = "search.karmada.io/v1alpha1";

/// One kind the fleet view merges, resolved against the clusters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetKind {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The plural resource name requests use (`pods`).
    pub resource: String,
    /// The clusters it is merged from, sorted by name.
    pub clusters: Vec<String>,
}

impl FleetKind {
    /// `v1` or `apps/v1`.
    pub fn group_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Every merged kind, sorted by group and resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    pub kinds: Vec<FleetKind>,
}

impl FleetView {
    /// The merged kind serving `resource` of `group` (any version the registry names).
    pub fn kind(&self, group: &str, resource: &str) -> Option<&FleetKind> {
        self.kinds
            .iter()
            .find(|k| k.group == group && k.resource == resource)
    }
}

/// `search.karmada.io/v1alpha1` `ResourceRegistry`: the fields fleetgate reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRegistryObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ResourceRegistrySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRegistrySpec {
    #[serde(default)]
    pub target_cluster: KarmadaClusterAffinity,
    #[serde(default)]
    pub resource_selectors: Vec<KarmadaResourceSelector>,
}

/// Karmada's `ClusterAffinity` (the fields a registry uses).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KarmadaClusterAffinity {
    #[serde(default)]
    pub label_selector: Option<LabelSelector>,
    #[serde(default)]
    pub cluster_names: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KarmadaResourceSelector {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// A FleetResource or ResourceRegistry, read and not yet resolved against the clusters.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSource {
    /// How messages name it: `FleetResource NAME` or `ResourceRegistry NAME`, and its file.
    pub kind: &'static str,
    pub name: String,
    pub origin: String,
    pub selectors: Vec<(String, String, Option<String>)>,
    /// `None`: every cluster.
    pub clusters: Option<PolicyClusters>,
    pub exclude: Vec<String>,
}

impl FleetSource {
    pub fn from_fleet_resource(meta: &ObjectMeta, spec: &FleetResourceSpec, origin: &str) -> Self {
        FleetSource {
            kind: "FleetResource",
            name: meta.name.clone(),
            origin: origin.to_owned(),
            selectors: spec
                .resource_selectors
                .iter()
                .map(|s| (s.api_version.clone(), s.kind.clone(), s.resource.clone()))
                .collect(),
            clusters: spec.clusters.clone(),
            exclude: Vec::new(),
        }
    }

    pub fn from_resource_registry(
        obj: &ResourceRegistryObject,
        origin: &str,
    ) -> Result<Self, ConfigError> {
        let invalid = |field: &'static str, message: String| ConfigError::Invalid {
            origin: origin.to_owned(),
            kind: "ResourceRegistry",
            name: obj.metadata.name.clone(),
            field,
            message,
        };
        if obj
            .spec
            .resource_selectors
            .iter()
            .any(|s| s.namespace.as_deref().is_some_and(|n| !n.is_empty()))
        {
            return Err(invalid(
                "spec.resourceSelectors[].namespace",
                "fleetgate merges whole kinds; restrict namespaces with an AccessPolicy instead"
                    .into(),
            ));
        }
        let target = &obj.spec.target_cluster;
        // Karmada: an empty affinity selects every cluster.
        let clusters =
            (!target.cluster_names.is_empty() || target.label_selector.is_some()).then(|| {
                PolicyClusters {
                    names: target.cluster_names.clone(),
                    selector: target.label_selector.clone(),
                }
            });
        Ok(FleetSource {
            kind: "ResourceRegistry",
            name: obj.metadata.name.clone(),
            origin: origin.to_owned(),
            selectors: obj
                .spec
                .resource_selectors
                .iter()
                .map(|s| (s.api_version.clone(), s.kind.clone(), None))
                .collect(),
            clusters,
            exclude: target.exclude.clone(),
        })
    }
}

/// kube's guess of a kind's plural resource name (`UnsafeGuessKindToResource`): lower-cased,
/// `-s` gets `-es`, `-y` becomes `-ies`, anything else gets `-s`.
pub fn guess_resource(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s') {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

fn is_dns_label_like(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Resolves `sources` against `clusters` (each a name and its labels) into the merged kinds.
pub fn resolve<'c>(
    sources: &[FleetSource],
    clusters: impl Iterator<Item = (&'c str, &'c BTreeMap<String, String>)> + Clone,
) -> Result<FleetView, ConfigError> {
    // (group, resource) -> (version, kind, clusters)
    let mut kinds: BTreeMap<(String, String), (String, String, BTreeSet<String>)> = BTreeMap::new();
    for source in sources {
        let invalid = |field: &'static str, message: String| ConfigError::Invalid {
            origin: source.origin.clone(),
            kind: source.kind,
            name: source.name.clone(),
            field,
            message,
        };
        if source.selectors.is_empty() {
            return Err(invalid(
                "spec.resourceSelectors",
                "at least one {apiVersion, kind} is required".into(),
            ));
        }
        let mut covered = BTreeSet::new();
        for (name, labels) in clusters.clone() {
            let selected = match &source.clusters {
                None => true,
                Some(sel) => {
                    let named = sel.names.iter().any(|n| n == "*" || n == name);
                    let matched = match &sel.selector {
                        Some(selector) => crate::selector::matches(selector, labels)
                            .map_err(|m| invalid("spec.clusters.selector", m))?,
                        None => false,
                    };
                    named || matched
                }
            };
            if selected && !source.exclude.iter().any(|e| e == name) {
                covered.insert(name.to_owned());
            }
        }
        for (api_version, kind, resource) in &source.selectors {
            let (group, version) = match api_version.split_once('/') {
                Some((group, version)) => (group, version),
                None => ("", api_version.as_str()),
            };
            let group_ok = group.is_empty() || is_dns_label_like(group);
            if !group_ok
                || version.is_empty()
                || !version.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                return Err(invalid(
                    "spec.resourceSelectors[].apiVersion",
                    format!("{api_version:?} is not `v1` or `group/version`"),
                ));
            }
            if kind.is_empty()
                || !kind.starts_with(|c: char| c.is_ascii_uppercase())
                || !kind.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                return Err(invalid(
                    "spec.resourceSelectors[].kind",
                    format!("{kind:?} is not a kind (`Pod`, `Deployment`)"),
                ));
            }
            let resource = match resource {
                Some(r)
                    if !r.is_empty()
                        && r.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) =>
                {
                    r.clone()
                }
                Some(r) => {
                    return Err(invalid(
                        "spec.resourceSelectors[].resource",
                        format!("{r:?} is not a plural resource name (`pods`)"),
                    ))
                }
                None => guess_resource(kind),
            };
            let entry = kinds
                .entry((group.to_owned(), resource.clone()))
                .or_insert_with(|| (version.to_owned(), kind.clone(), BTreeSet::new()));
            if entry.0 != version || entry.1 != *kind {
                return Err(invalid(
                    "spec.resourceSelectors",
                    format!(
                        "{resource} of group {group:?} is already merged as {}/{} (one version \
                         per kind)",
                        entry.0, entry.1
                    ),
                ));
            }
            entry.2.extend(covered.iter().cloned());
        }
    }
    Ok(FleetView {
        kinds: kinds
            .into_iter()
            .map(|((group, resource), (version, kind, clusters))| FleetKind {
                group,
                version,
                kind,
                resource,
                clusters: clusters.into_iter().collect(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_plural_guesses() {
        assert_eq!(guess_resource("Pod"), "pods");
        assert_eq!(guess_resource("Ingress"), "ingresses");
        assert_eq!(guess_resource("NetworkPolicy"), "networkpolicies");
        assert_eq!(guess_resource("ConfigMap"), "configmaps");
    }
}
