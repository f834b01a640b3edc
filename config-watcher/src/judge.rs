//! Judging configuration objects one by one, as Kubernetes controllers reconcile them: an invalid
//! object is not served and says why, and every valid object beside it is served. One team's
//! broken Cluster must not freeze the whole fleet's configuration.
//!
//! A source (the files, the Kubernetes API) loads its objects into [`LoadedObjects`]: the valid
//! ones resolved, each invalid one as a [`Rejection`] naming it (kind, name, where it was read).
//! [`settle`] then turns them into the configuration to serve, against the source's last good
//! configuration:
//! - a rejected object whose last good version exists (same kind and name) keeps serving that
//!   version; one without is left out;
//! - a file whose objects cannot all be told apart (its YAML does not parse, or a document has no
//!   kind or name) keeps the last good version of every object it held that is not read again;
//! - a Cluster name defined twice keeps the copy that serves (same name and origin) and rejects
//!   the other; when neither serves, both are rejected;
//! - the Gateway is used when exactly one is valid; otherwise the last good Gateway keeps serving,
//!   and with none (the first load) the whole load fails: listeners cannot be guessed.
//!
//! What only shows when the routing table is built (a certificate that does not parse, an
//! AccessPolicy that does not compile, a FleetResource that clashes with another) is judged the
//! same way by `RouteTable::build_judged`. Pure functions: no I/O, no logging; called by the
//! loaders and by `reload`'s publisher.

use crate::error::ConfigError;
use crate::fleet::FleetSource;
use crate::objects::AccessPolicyObject;
use crate::settings::{ClusterConfig, Config, GatewaySettings};

/// A configuration object as a reload names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// `Gateway`, `Cluster`, `AccessPolicy`, `FleetResource`, `Secret`, `ResourceRegistry`,
    /// `Cluster.cluster.karmada.io`; empty for a document whose kind could not be read.
    pub kind: String,
    /// `metadata.name`; empty when the document has none.
    pub name: String,
    /// The file it was read from, or `api:<plural>.<group>/<name>` for the Kubernetes API.
    pub origin: String,
}

impl ObjectRef {
    pub(crate) fn new(kind: &str, name: &str, origin: &str) -> ObjectRef {
        ObjectRef {
            kind: kind.to_owned(),
            name: name.to_owned(),
            origin: origin.to_owned(),
        }
    }

    /// Whether this names a member cluster (a fleetgate or a Karmada Cluster: one name space).
    fn is_cluster(&self) -> bool {
        self.kind == "Cluster" || self.kind == crate::karmada::KARMADA_CLUSTER_KIND
    }

    /// Whether this names a fleet view source (`FleetSource::kind` is the object's kind).
    fn is_fleet_source(&self) -> bool {
        self.kind == "FleetResource" || self.kind == "ResourceRegistry"
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (
            self.kind.is_empty(),
            self.name.is_empty(),
            self.origin.is_empty(),
        ) {
            (true, ..) => write!(f, "{}", self.origin),
            (false, true, true) => write!(f, "{}", self.kind),
            (false, true, false) => write!(f, "{} in {}", self.kind, self.origin),
            (false, false, _) => write!(f, "{} {} ({})", self.kind, self.name, self.origin),
        }
    }
}

/// One object a reload did not take as written, and why.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub object: ObjectRef,
    /// Names the file or object and the field.
    pub error: ConfigError,
    /// Whether its last good version (or, for a file, the last good versions of its objects)
    /// keeps serving.
    pub kept: bool,
}

impl Rejection {
    pub(crate) fn new(object: ObjectRef, error: ConfigError) -> Rejection {
        Rejection {
            object,
            error,
            kept: false,
        }
    }
}

/// What loading a source found, object by object. Built by the file loader (`load`) and the API
/// source (`kube_source`); settled into a configuration by [`settle`].
#[derive(Debug, Clone, Default)]
pub struct LoadedObjects {
    /// Valid Gateway objects.
    pub(crate) gateways: Vec<(ObjectRef, GatewaySettings)>,
    /// Valid Clusters (fleetgate and Karmada), resolved; names not yet checked for duplicates.
    pub(crate) clusters: Vec<ClusterConfig>,
    pub(crate) policies: Vec<AccessPolicyObject>,
    pub(crate) fleet: Vec<FleetSource>,
    /// The objects that are invalid on their own, in the order they were read.
    pub(crate) rejected: Vec<Rejection>,
    /// Origins (files) some of whose documents could not be told apart: their last good objects
    /// that are not read again keep serving.
    pub(crate) unsettled: Vec<String>,
    /// The error when no Gateway object was found at all (`{path}: no Gateway object found`).
    pub(crate) no_gateway: String,
}

/// Two loads are the same when they found the same objects and the same errors (the file
/// source's poll skips a load equal to the last one: nothing to publish or report again).
impl PartialEq for LoadedObjects {
    fn eq(&self, other: &Self) -> bool {
        let errors = |l: &LoadedObjects| {
            l.rejected
                .iter()
                .map(|r| (r.object.clone(), r.error.to_string()))
                .collect::<Vec<_>>()
        };
        self.gateways == other.gateways
            && self.clusters == other.clusters
            && self.policies == other.policies
            && self.fleet == other.fleet
            && self.unsettled == other.unsettled
            && errors(self) == errors(other)
    }
}

impl LoadedObjects {
    /// Whether every object was valid and told apart.
    pub fn is_clean(&self) -> bool {
        self.rejected.is_empty() && self.unsettled.is_empty()
    }

    /// All or nothing: the configuration when every object is valid, else the first error (in
    /// the order the objects were read). What `load_path` returns, for callers that validate a
    /// configuration rather than serve it (`fleetgate kubeconfig`, tests, the fuzz target).
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let settled = settle(self, None)?;
        match settled.rejected.into_iter().next() {
            Some(first) => Err(first.error),
            None => Ok(settled.config),
        }
    }
}

/// A configuration to serve and the objects it does not hold as written.
#[derive(Debug)]
pub struct Settled {
    pub config: Config,
    pub rejected: Vec<Rejection>,
}

/// Settles `loaded` against `last`, the source's last good configuration (`None`: there is
/// none, the first load): see the module comment. Fails only when there is no Gateway to serve.
pub fn settle(loaded: LoadedObjects, last: Option<&Config>) -> Result<Settled, ConfigError> {
    let LoadedObjects {
        mut gateways,
        clusters,
        mut policies,
        mut fleet,
        mut rejected,
        unsettled,
        no_gateway,
    } = loaded;
    let gateway_rejected = rejected.iter().any(|r| r.object.kind == "Gateway");
    let gateway = if gateways.len() == 1 {
        gateways.remove(0).1
    } else {
        if gateways.len() > 1 {
            let n = gateways.len();
            let names: Vec<String> = gateways.iter().map(|(o, _)| o.to_string()).collect();
            for (object, _) in gateways {
                rejected.push(Rejection::new(
                    object,
                    ConfigError::Set(format!(
                        "{n} Gateway objects ({}); exactly one is allowed",
                        names.join(", ")
                    )),
                ));
            }
        } else if !gateway_rejected {
            rejected.push(Rejection::new(
                ObjectRef::new("Gateway", "", ""),
                ConfigError::Set(no_gateway.clone()),
            ));
        }
        match last {
            Some(last) => {
                // The serving Gateway keeps serving; another one (a second, new Gateway) is not
                // served at all.
                for r in rejected.iter_mut().filter(|r| r.object.kind == "Gateway") {
                    r.kept = r.object.name.is_empty() || r.object.name == last.gateway.name;
                }
                last.gateway.clone()
            }
            // Listeners cannot be guessed: the first load needs a Gateway.
            None => {
                let first = rejected
                    .into_iter()
                    .find(|r| r.object.kind == "Gateway")
                    .map(|r| r.error);
                return Err(first.unwrap_or(ConfigError::Set(no_gateway)));
            }
        }
    };
    let (mut clusters, duplicates) = one_cluster_per_name(clusters, last, |first, other| {
        format!(
            "Cluster {} is defined twice ({} and {})",
            first.name, first.origin, other.origin
        )
    });
    rejected.extend(duplicates);
    if let Some(last) = last {
        keep_last_good(
            &mut rejected,
            &unsettled,
            last,
            &mut clusters,
            &mut policies,
            &mut fleet,
        );
    }
    let mut config = Config {
        gateway,
        clusters,
        policies,
        fleet,
    };
    canonical_order(&mut config);
    Ok(Settled { config, rejected })
}

/// Keeps one Cluster per name: the copy whose origin serves it in `serving` (the others are
/// rejected, `clash` saying why), or none when no copy serves. Order is kept.
pub(crate) fn one_cluster_per_name(
    clusters: Vec<ClusterConfig>,
    serving: Option<&Config>,
    clash: impl Fn(&ClusterConfig, &ClusterConfig) -> String,
) -> (Vec<ClusterConfig>, Vec<Rejection>) {
    let mut copies: ahash::AHashMap<&str, Vec<&ClusterConfig>> = ahash::AHashMap::new();
    for c in &clusters {
        copies.entry(c.name.as_str()).or_default().push(c);
    }
    // (name, origin) of each copy that goes, and the message saying why.
    let mut losers: Vec<(String, String, String)> = Vec::new();
    for (name, copies) in copies.iter().filter(|(_, c)| c.len() > 1) {
        let serving_origin = serving
            .and_then(|s| s.clusters.iter().find(|c| c.name == *name))
            .map(|c| c.origin.as_str());
        let winner = copies
            .iter()
            .position(|c| Some(c.origin.as_str()) == serving_origin)
            // Two copies read from the serving one's file cannot be told apart: both go.
            .filter(|_| {
                copies
                    .iter()
                    .filter(|c| Some(c.origin.as_str()) == serving_origin)
                    .count()
                    == 1
            });
        for (i, copy) in copies.iter().enumerate() {
            if Some(i) == winner {
                continue;
            }
            // The message names the copy that stays (or the first other one), in reading order.
            let j = winner.unwrap_or(usize::from(i == 0));
            let (a, b) = if j < i {
                (copies[j], *copy)
            } else {
                (*copy, copies[j])
            };
            losers.push((copy.name.clone(), copy.origin.clone(), clash(a, b)));
        }
    }
    // In the order the copies were read, so the first error is the first duplicate read.
    let mut rejected = Vec::new();
    let mut kept = Vec::with_capacity(clusters.len());
    for c in clusters {
        match losers
            .iter()
            .position(|(name, origin, _)| *name == c.name && *origin == c.origin)
        {
            Some(i) => {
                let (_, _, message) = losers.swap_remove(i);
                rejected.push(Rejection::new(
                    ObjectRef::new("Cluster", &c.name, &c.origin),
                    ConfigError::Set(message),
                ));
            }
            None => kept.push(c),
        }
    }
    (kept, rejected)
}

/// Puts back the last good version of each rejected object that has one, and of each object of
/// an unsettled file that was not read again.
fn keep_last_good(
    rejected: &mut [Rejection],
    unsettled: &[String],
    last: &Config,
    clusters: &mut Vec<ClusterConfig>,
    policies: &mut Vec<AccessPolicyObject>,
    fleet: &mut Vec<FleetSource>,
) {
    // An object rejected twice (two copies of one name) is put back once; a name served by
    // another, valid copy is not the rejected object's last good version.
    let mut put_back: Vec<ObjectRef> = Vec::new();
    for r in rejected.iter_mut() {
        let o = &r.object;
        let key = ObjectRef::new(
            if o.is_cluster() { "Cluster" } else { &o.kind },
            &o.name,
            "",
        );
        if put_back.contains(&key) {
            r.kept = true;
            continue;
        }
        let kept = if o.is_cluster() {
            let good = last.clusters.iter().find(|c| c.name == o.name);
            match good.filter(|_| !clusters.iter().any(|c| c.name == o.name)) {
                Some(good) => {
                    clusters.push(good.clone());
                    true
                }
                None => false,
            }
        } else if o.kind == "AccessPolicy" {
            let good = last.policies.iter().find(|p| p.metadata.name == o.name);
            match good.filter(|_| !policies.iter().any(|p| p.metadata.name == o.name)) {
                Some(good) => {
                    policies.push(good.clone());
                    true
                }
                None => false,
            }
        } else if o.is_fleet_source() {
            let same = |f: &FleetSource| f.kind == o.kind && f.name == o.name;
            match last
                .fleet
                .iter()
                .find(|f| same(f))
                .filter(|_| !fleet.iter().any(same))
            {
                Some(good) => {
                    fleet.push(good.clone());
                    true
                }
                None => false,
            }
        } else {
            false
        };
        if kept {
            r.kept = true;
            put_back.push(key);
        }
    }
    if unsettled.is_empty() {
        return;
    }
    // A file may hold thousands of clusters: names are looked up in sets, not lists.
    let mut cluster_names: ahash::AHashSet<String> =
        clusters.iter().map(|c| c.name.clone()).collect();
    let mut policy_names: ahash::AHashSet<String> =
        policies.iter().map(|p| p.metadata.name.clone()).collect();
    let mut fleet_names: ahash::AHashSet<(&'static str, String)> =
        fleet.iter().map(|f| (f.kind, f.name.clone())).collect();
    for origin in unsettled {
        let mut kept = false;
        for good in last.clusters.iter().filter(|c| c.origin == *origin) {
            if cluster_names.insert(good.name.clone()) {
                clusters.push(good.clone());
                kept = true;
            }
        }
        for good in last.policies.iter().filter(|p| p.origin == *origin) {
            if policy_names.insert(good.metadata.name.clone()) {
                policies.push(good.clone());
                kept = true;
            }
        }
        for good in last.fleet.iter().filter(|f| f.origin == *origin) {
            if fleet_names.insert((good.kind, good.name.clone())) {
                fleet.push(good.clone());
                kept = true;
            }
        }
        if kept {
            for r in rejected.iter_mut().filter(|r| r.object.origin == *origin) {
                r.kept = true;
            }
        }
    }
}

/// Sorts a configuration's objects by name: the same objects make an equal configuration (and
/// no new table) whatever order they were read, listed or put back in.
pub(crate) fn canonical_order(config: &mut Config) {
    config.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    config
        .policies
        .sort_by(|a, b| (&a.metadata.name, &a.origin).cmp(&(&b.metadata.name, &b.origin)));
    config
        .fleet
        .sort_by(|a, b| (a.kind, &a.name, &a.origin).cmp(&(b.kind, &b.name, &b.origin)));
}

/// A rejected object as operators see it (the reload status, `/readyz`, `/metrics`, the API
/// objects' `Ready` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedObject {
    pub object: ObjectRef,
    /// The error, naming the file or object and the field.
    pub message: String,
    /// Whether its last good version keeps serving.
    pub kept: bool,
    /// What it broke, as `fleetgate_reload_failures_total{what}` names it (`crate::material`).
    pub what: &'static str,
}

impl From<&Rejection> for RejectedObject {
    fn from(r: &Rejection) -> RejectedObject {
        RejectedObject {
            object: r.object.clone(),
            message: r.error.to_string(),
            kept: r.kept,
            what: crate::material::what_failed(&r.error),
        }
    }
}

impl std::fmt::Display for RejectedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let consequence = match (self.object.kind.is_empty(), self.kept) {
            (true, true) => "the objects it held keep their last good versions",
            (true, false) => "nothing in it is served",
            (false, true) => "its last good version keeps serving",
            (false, false) => "not served",
        };
        write!(f, "{} ({consequence})", self.message)
    }
}
