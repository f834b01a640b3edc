//! Reading configuration objects from a file or a directory: every `*.yaml` / `*.yml` file below
//! the directory (sorted, so the result does not depend on the file system's order), each file
//! any number of `---`-separated documents. Objects are dispatched by `kind`, checked, and resolved
//! (files they name are read relative to the file that names them). Blocking: call it off the data
//! path.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::checks::{
    check_address, check_cluster_name, check_proxy_headers, check_proxy_url, check_token,
};
use crate::error::ConfigError;
use crate::fleet::{FleetSource, ResourceRegistryObject, KARMADA_SEARCH_API_VERSION};
use crate::judge::{LoadedObjects, ObjectRef, Rejection};
use crate::karmada::{
    karmada_cluster_config, KarmadaClusterObject, SecretData, SecretObject, KARMADA_API_VERSION,
    KARMADA_CLUSTER_KIND,
};
use crate::objects::{
    AccessPolicyObject, ClusterObject, FleetResourceObject, GatewayObject, GatewaySpec, Http2Spec,
    API_VERSION,
};
use crate::settings::{
    CircuitBreakerSettings, ClusterConfig, Config, FleetSettings, GatewaySettings, Http2Settings,
    Limits, ListenerSettings, ServingTls,
};

/// Loads and validates every object under `path` (a file or a directory), all or nothing: the
/// first invalid object is the error. For callers that check a configuration; `serve` judges
/// objects one by one ([`load_objects`]).
pub fn load_path(path: &Path) -> Result<Config, ConfigError> {
    let mut texts = Vec::new();
    for file in config_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
            path: file.clone(),
            source: source.into(),
        })?;
        texts.push((file, text));
    }
    load_texts(path, &texts)
}

/// Loads every object under `path` (a file or a directory), judging each on its own: a file
/// that cannot be read or parsed, or an invalid object, is a rejection among the valid objects
/// (see `judge`). Fails only when `path` itself cannot be listed.
pub fn load_objects(path: &Path) -> Result<LoadedObjects, ConfigError> {
    let mut texts = Vec::new();
    let mut unreadable = Vec::new();
    for file in config_files(path)? {
        match std::fs::read_to_string(&file) {
            Ok(text) => texts.push((file, text)),
            Err(source) => unreadable.push(ConfigError::Read {
                path: file,
                source: source.into(),
            }),
        }
    }
    let mut loaded = load_text_objects(path, &texts);
    for error in unreadable {
        let ConfigError::Read { path: file, .. } = &error else {
            continue;
        };
        let origin = file.display().to_string();
        loaded.unsettled.push(origin.clone());
        loaded
            .rejected
            .push(Rejection::new(ObjectRef::new("", "", &origin), error));
    }
    Ok(loaded)
}

/// Loads and validates the objects of `files` (each a path, for messages and relative file
/// references, and its YAML text), all or nothing; `path` names the whole set in messages.
/// Never touches the file system but for the files the objects name (certificates, token files).
pub fn load_texts(path: &Path, files: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    load_text_objects(path, files).into_config()
}

/// Judges the objects of `files` one by one (see [`load_texts`] for the arguments).
pub fn load_text_objects(path: &Path, files: &[(PathBuf, String)]) -> LoadedObjects {
    let mut loaded = LoadedObjects {
        no_gateway: format!("{}: no Gateway object found", path.display()),
        ..LoadedObjects::default()
    };
    // Karmada clusters and fleetgate Clusters are resolved once every Secret of every file is
    // known (`spec.secretRef`, `spec.credentials.secretRef`).
    let mut karmada_clusters = Vec::new();
    let mut fleetgate_clusters = Vec::new();
    let mut secrets: std::collections::BTreeMap<(String, String), Vec<(SecretData, String)>> =
        std::collections::BTreeMap::new();
    for (file, text) in files {
        let base = file.parent().unwrap_or(Path::new("."));
        let origin = file.display().to_string();
        // A file is taken whole or not at all: YAML that does not parse keeps the last good
        // version of every object the file held.
        let mut documents = Vec::new();
        for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            match serde_yaml::Value::deserialize(doc) {
                Ok(value) => documents.push((index, value)),
                Err(e) => {
                    loaded.unsettled.push(origin.clone());
                    loaded.rejected.push(Rejection::new(
                        ObjectRef::new("", "", &origin),
                        ConfigError::Parse {
                            path: file.clone(),
                            index,
                            message: e.to_string(),
                        },
                    ));
                    documents.clear();
                    break;
                }
            }
        }
        for (index, value) in documents {
            if value.is_null() {
                continue; // an empty document, e.g. a trailing `---`
            }
            let parse_err = |message: String| ConfigError::Parse {
                path: file.clone(),
                index,
                message,
            };
            let text_of =
                |v: Option<&serde_yaml::Value>| v.and_then(|v| v.as_str()).unwrap_or("").to_owned();
            let kind = text_of(value.get("kind"));
            let name = text_of(value.get("metadata").and_then(|m| m.get("name")));
            let name = name.as_str();
            let api_version = value
                .get("apiVersion")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned();
            let object = ObjectRef::new(&kind, name, &origin);
            // A document that cannot be told apart from the others: the file's last good objects
            // that are not read again keep serving.
            let unsettled = |loaded: &mut LoadedObjects, error: ConfigError| {
                loaded.unsettled.push(origin.clone());
                loaded.rejected.push(Rejection::new(object.clone(), error));
            };
            if kind.is_empty() {
                unsettled(&mut loaded, parse_err("no `kind`".into()));
                continue;
            }
            let result = match (api_version.as_str(), kind.as_str()) {
                (API_VERSION, "Gateway") => serde_yaml::from_value::<GatewayObject>(value)
                    .map_err(|e| parse_err(format!("Gateway: {e}")))
                    .and_then(|obj| resolve_gateway(obj, base, &origin))
                    .map(|g| loaded.gateways.push((object.clone(), g))),
                (API_VERSION, "Cluster") => serde_yaml::from_value::<ClusterObject>(value)
                    .map_err(|e| parse_err(format!("Cluster: {e}")))
                    .map(|obj| fleetgate_clusters.push((obj, base.to_path_buf(), object.clone()))),
                (API_VERSION, "AccessPolicy") => {
                    serde_yaml::from_value::<AccessPolicyObject>(value)
                        .map_err(|e| parse_err(format!("AccessPolicy: {e}")))
                        .map(|mut obj| {
                            obj.origin = origin.clone();
                            loaded.policies.push(obj);
                        })
                }
                (API_VERSION, "FleetResource") => {
                    serde_yaml::from_value::<FleetResourceObject>(value)
                        .map_err(|e| parse_err(format!("FleetResource: {e}")))
                        .map(|obj| {
                            loaded.fleet.push(FleetSource::from_fleet_resource(
                                &obj.metadata,
                                &obj.spec,
                                &origin,
                            ))
                        })
                }
                (KARMADA_SEARCH_API_VERSION, "ResourceRegistry") => {
                    serde_yaml::from_value::<ResourceRegistryObject>(value)
                        .map_err(|e| parse_err(format!("ResourceRegistry: {e}")))
                        .and_then(|obj| FleetSource::from_resource_registry(&obj, &origin))
                        .map(|source| loaded.fleet.push(source))
                }
                (KARMADA_API_VERSION, "Cluster") => {
                    serde_yaml::from_value::<KarmadaClusterObject>(value)
                        .map_err(|e| parse_err(format!("{KARMADA_CLUSTER_KIND}: {e}")))
                        .map(|obj| {
                            let object = ObjectRef::new(KARMADA_CLUSTER_KIND, name, &origin);
                            karmada_clusters.push((obj, object))
                        })
                }
                ("v1", "Secret") => serde_yaml::from_value::<SecretObject>(value)
                    .map_err(|e| parse_err(format!("Secret: {e}")))
                    .and_then(|obj| SecretData::from_object(&obj, &origin))
                    .map(|secret| {
                        let key = (secret.namespace.clone(), secret.name.clone());
                        secrets
                            .entry(key)
                            .or_default()
                            .push((secret, origin.clone()));
                    }),
                (API_VERSION, other) => {
                    unsettled(&mut loaded, parse_err(format!("unknown kind {other:?}")));
                    continue;
                }
                (other_version, other_kind) => {
                    unsettled(
                        &mut loaded,
                        parse_err(format!(
                            "{other_kind}: apiVersion {other_version:?} is not {API_VERSION:?} \
                             (nor a {KARMADA_API_VERSION} Cluster, a {KARMADA_SEARCH_API_VERSION} \
                             ResourceRegistry or a v1 Secret)"
                        )),
                    );
                    continue;
                }
            };
            if let Err(error) = result {
                if name.is_empty() {
                    unsettled(&mut loaded, error);
                } else {
                    loaded.rejected.push(Rejection::new(object, error));
                }
            }
        }
    }
    // A Secret defined twice is neither copy: which one is meant cannot be guessed, and the
    // Clusters naming it keep their last good credentials.
    let mut unique_secrets = std::collections::BTreeMap::new();
    for (key, copies) in secrets {
        match <[_; 1]>::try_from(copies) {
            Ok([(secret, _)]) => {
                unique_secrets.insert(key, secret);
            }
            Err(copies) => {
                for (_, origin) in copies {
                    loaded.rejected.push(Rejection::new(
                        ObjectRef::new("Secret", &key.1, &origin),
                        ConfigError::Set(format!(
                            "{origin}: Secret {}/{} is defined twice",
                            key.0, key.1
                        )),
                    ));
                }
            }
        }
    }
    let find_secret = |namespace: &str, name: &str| {
        unique_secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    };
    for (obj, base, object) in fleetgate_clusters {
        match resolve_cluster(obj, &base, &object.origin, &find_secret) {
            Ok(cluster) => loaded.clusters.push(cluster),
            Err(error) => loaded.rejected.push(Rejection::new(object, error)),
        }
    }
    for (obj, object) in &karmada_clusters {
        match karmada_cluster_config(obj, &object.origin, &find_secret) {
            Ok(cluster) => loaded.clusters.push(cluster),
            Err(error) => loaded.rejected.push(Rejection::new(object.clone(), error)),
        }
    }
    loaded
}

/// The YAML files a path stands for, sorted.
fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source: source.into(),
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ConfigError::Read {
            path: dir.clone(),
            source: source.into(),
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| ConfigError::Read {
                path: dir.clone(),
                source: source.into(),
            })?;
            let p = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue; // editors' swap files, `..data` of mounted ConfigMaps
            }
            if p.is_dir() {
                stack.push(p);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) fn resolve_gateway(
    obj: GatewayObject,
    base: &Path,
    origin: &str,
) -> Result<GatewaySettings, ConfigError> {
    let name = obj.metadata.name.clone();
    let invalid = |field: &'static str, message: String| ConfigError::Invalid {
        origin: origin.to_owned(),
        kind: "Gateway",
        name: name.clone(),
        field,
        message,
    };
    let GatewaySpec {
        workers,
        listeners,
        tls,
        admin,
        routing,
        limits,
        http2,
        fleet,
        shared_watches,
        cache,
        auth,
        audit,
        access_log,
        fairness,
        circuit_breaker,
    } = obj.spec;
    if listeners.is_empty() {
        return Err(invalid(
            "spec.listeners",
            "at least one listener is required".into(),
        ));
    }
    let mut resolved_listeners = Vec::with_capacity(listeners.len());
    for (i, l) in listeners.into_iter().enumerate() {
        check_address(&l.address).map_err(|m| invalid("spec.listeners[].address", m))?;
        resolved_listeners.push(ListenerSettings {
            name: if l.name.is_empty() {
                format!("listener-{i}")
            } else {
                l.name
            },
            address: l.address,
            tls: l.tls,
        });
    }
    let tls = match tls {
        None => None,
        Some(t) => {
            // Named in messages: the files a rotation rewrites.
            let name =
                |file: &Option<String>, data: &str| file.clone().unwrap_or_else(|| data.to_owned());
            let names = (
                name(&t.cert_file, "certData"),
                name(&t.key_file, "keyData"),
                name(&t.client_ca_file, "clientCAData"),
            );
            let cert_pem = pem_field(t.cert_data, t.cert_file, base)
                .map_err(|m| invalid("spec.tls.certData/certFile", m))?
                .ok_or_else(|| {
                    invalid(
                        "spec.tls.certData/certFile",
                        "a serving certificate is required".into(),
                    )
                })?;
            let key_pem = pem_field(t.key_data, t.key_file, base)
                .map_err(|m| invalid("spec.tls.keyData/keyFile", m))?
                .ok_or_else(|| {
                    invalid(
                        "spec.tls.keyData/keyFile",
                        "a serving key is required".into(),
                    )
                })?;
            let client_ca_pem = pem_field(t.client_ca_data, t.client_ca_file, base)
                .map_err(|m| invalid("spec.tls.clientCAData/clientCAFile", m))?;
            let tls = ServingTls {
                cert_pem,
                key_pem,
                client_ca_pem,
            };
            crate::material::check_serving_tls(&tls, &names.0, &names.1, &names.2)
                .map_err(|(field, message)| invalid(field, message))?;
            Some(tls)
        }
    };
    if resolved_listeners.iter().any(|l| l.tls) && tls.is_none() {
        return Err(invalid("spec.tls", "a TLS listener needs spec.tls".into()));
    }
    if let Some(a) = &admin {
        check_address(&a.address).map_err(|m| invalid("spec.admin.address", m))?;
    }
    let defaults = Limits::default();
    let seconds = |v: Option<f64>, field: &'static str, default| match v {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 => Ok(std::time::Duration::from_secs_f64(s)),
        Some(s) => Err(invalid(
            field,
            format!("{s} is not a positive number of seconds"),
        )),
    };
    let limits = Limits {
        max_head_bytes: limits.max_head_bytes.unwrap_or(defaults.max_head_bytes),
        max_headers: limits.max_headers.unwrap_or(defaults.max_headers),
        connect_timeout: seconds(
            limits.connect_timeout_seconds,
            "spec.limits.connectTimeoutSeconds",
            defaults.connect_timeout,
        )?,
        response_head_timeout: seconds(
            limits.response_head_timeout_seconds,
            "spec.limits.responseHeadTimeoutSeconds",
            defaults.response_head_timeout,
        )?,
        idle_timeout: optional_seconds(limits.idle_timeout_seconds, defaults.idle_timeout)
            .map_err(|m| invalid("spec.limits.idleTimeoutSeconds", m))?,
        shutdown_grace: match limits.shutdown_grace_seconds {
            None => defaults.shutdown_grace,
            // 0 is allowed: in-flight requests are cut at once.
            Some(s) if s.is_finite() && s >= 0.0 => std::time::Duration::from_secs_f64(s),
            Some(s) => {
                return Err(invalid(
                    "spec.limits.shutdownGraceSeconds",
                    format!("{s} is not a number of seconds (0 or more)"),
                ))
            }
        },
        client_write_timeout: seconds(
            limits.client_write_timeout_seconds,
            "spec.limits.clientWriteTimeoutSeconds",
            defaults.client_write_timeout,
        )?,
        max_member_connections_per_client: match limits.max_member_connections_per_client {
            None => defaults.max_member_connections_per_client,
            Some(0) => {
                return Err(invalid(
                    "spec.limits.maxMemberConnectionsPerClient",
                    "must be at least 1".into(),
                ))
            }
            Some(n) => n,
        },
    };
    let circuit_breaker = resolve_circuit_breaker(circuit_breaker.unwrap_or_default())
        .map_err(|(field, message)| invalid(field, message))?;
    let http2 = resolve_http2(http2).map_err(|(field, message)| invalid(field, message))?;
    let fleet = {
        let defaults = FleetSettings::default();
        let page_size = fleet.page_size.unwrap_or(defaults.page_size as u32);
        let at_once = fleet
            .members_at_once
            .unwrap_or(defaults.members_at_once as u32);
        FleetSettings {
            page_size: in_range(
                page_size,
                FleetSettings::MAX_PAGE_SIZE,
                "spec.fleet.pageSize",
            )
            .map_err(|(field, message)| invalid(field, message))? as usize,
            members_at_once: in_range(
                at_once,
                FleetSettings::MAX_MEMBERS_AT_ONCE,
                "spec.fleet.membersAtOnce",
            )
            .map_err(|(field, message)| invalid(field, message))?
                as usize,
            create_in: match fleet.create_in {
                None => None,
                Some(name) => {
                    check_cluster_name(&name)
                        .map_err(|message| invalid("spec.fleet.createIn", message))?;
                    Some(Arc::from(name))
                }
            },
        }
    };
    if limits.max_head_bytes < 1024 {
        return Err(invalid(
            "spec.limits.maxHeadBytes",
            "must be at least 1024".into(),
        ));
    }
    if limits.max_headers < 8 {
        return Err(invalid(
            "spec.limits.maxHeaders",
            "must be at least 8".into(),
        ));
    }
    let mut shared_watches = match shared_watches {
        None => None,
        Some(spec) => Some(resolve_shared_watches(spec).map_err(|(field, m)| invalid(field, m))?),
    };
    let cache = match cache {
        None => None,
        Some(spec) => Some(resolve_cache(spec).map_err(|(field, m)| invalid(field, m))?),
    };
    // A cached resource is shared for watches too: its hub is its cache.
    if let Some(cache) = &cache {
        let shared = shared_watches.get_or_insert_with(|| crate::settings::SharedWatchSettings {
            resources: Vec::new(),
            ring_size: crate::settings::SharedWatchSettings::DEFAULT_RING_SIZE as usize,
            lag_limit: crate::settings::SharedWatchSettings::DEFAULT_RING_SIZE as usize / 4,
            scope: Default::default(),
        });
        for (resource, _) in &cache.resources {
            if !shared.resources.contains(resource) {
                shared.resources.push(resource.clone());
            }
        }
    }
    let auth = crate::auth::resolve_auth(auth, base).map_err(|(field, m)| invalid(field, m))?;
    let audit = match audit {
        None => None,
        Some(a) if a.path.is_empty() => {
            return Err(invalid("spec.audit.path", "a path is required".into()))
        }
        Some(a) if a.queue == Some(0) => {
            return Err(invalid("spec.audit.queue", "must be at least 1".into()))
        }
        Some(a) => Some(crate::settings::AuditSettings {
            path: base.join(&a.path),
            queue: a.queue.unwrap_or(8192),
        }),
    };
    let fairness = crate::fairness::resolve_fairness(fairness)
        .map_err(|(field, message)| invalid(field, message))?;
    Ok(GatewaySettings {
        name,
        workers,
        listeners: resolved_listeners,
        tls,
        admin: admin.map(|a| a.address),
        ocm_style: routing.ocm_style,
        limits,
        http2,
        fleet,
        shared_watches,
        cache,
        auth,
        audit,
        access_log,
        fairness,
        circuit_breaker,
    })
}

/// `spec.sharedWatches` checked: at least one resource, each named as kube names them and
/// listed once; the ring between its bounds; the lag limit within the ring.
fn resolve_shared_watches(
    spec: crate::objects::SharedWatchesSpec,
) -> Result<crate::settings::SharedWatchSettings, (&'static str, String)> {
    use crate::settings::SharedWatchSettings as S;
    let named = spec.resources.into_iter();
    let resources = checked_resources(
        named.map(|r| (r.group, r.version, r.resource)),
        Block::SharedWatches,
    )?;
    let ring_size = spec.ring_size.unwrap_or(S::DEFAULT_RING_SIZE);
    if !(S::MIN_RING_SIZE..=S::MAX_RING_SIZE).contains(&ring_size) {
        return Err((
            "spec.sharedWatches.ringSize",
            format!(
                "{ring_size} is not between {} and {}",
                S::MIN_RING_SIZE,
                S::MAX_RING_SIZE
            ),
        ));
    }
    let lag_limit = spec.lag_limit.unwrap_or((ring_size / 4).max(1));
    in_range(lag_limit, ring_size, "spec.sharedWatches.lagLimit")?;
    Ok(S {
        resources,
        ring_size: ring_size as usize,
        lag_limit: lag_limit as usize,
        scope: spec.scope.unwrap_or_default(),
    })
}

/// A timeout where 0 means "none": `Ok(None)` for 0, `default` when absent.
fn optional_seconds(
    value: Option<f64>,
    default: Option<std::time::Duration>,
) -> Result<Option<std::time::Duration>, String> {
    match value {
        None => Ok(default),
        Some(0.0) => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(std::time::Duration::from_secs_f64(s))),
        Some(s) => Err(format!("{s} is not a number of seconds (0 for none)")),
    }
}

/// `value` if it is between 1 and `max`; else an error naming `field`.
/// (group, version, plural resource).
type Resource = (String, String, String);

/// A Gateway block that lists resources.
#[derive(Clone, Copy)]
enum Block {
    SharedWatches,
    Cache,
}

impl Block {
    /// Its fields an error names: the list, then an entry's group, version and resource.
    fn fields(self) -> [&'static str; 4] {
        match self {
            Block::SharedWatches => [
                "spec.sharedWatches.resources",
                "spec.sharedWatches.resources[].group",
                "spec.sharedWatches.resources[].version",
                "spec.sharedWatches.resources[].resource",
            ],
            Block::Cache => [
                "spec.cache.resources",
                "spec.cache.resources[].group",
                "spec.cache.resources[].version",
                "spec.cache.resources[].resource",
            ],
        }
    }
}

/// Resources named as kube names them (a DNS-1123 label for the resource and version, a
/// subdomain for the group), at least one, each listed once; an error names `block`'s field.
fn checked_resources(
    resources: impl IntoIterator<Item = Resource>,
    block: Block,
) -> Result<Vec<Resource>, (&'static str, String)> {
    let [list, group_field, version_field, resource_field] = block.fields();
    let resources: Vec<Resource> = resources.into_iter().collect();
    if resources.is_empty() {
        return Err((list, "at least one resource is required".into()));
    }
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    let mut checked: Vec<Resource> = Vec::new();
    for key in resources {
        let (group, version, resource) = &key;
        if !group.is_empty() && (group.len() > 253 || !group.split('.').all(label)) {
            return Err((group_field, format!("{group:?} is not an API group name")));
        }
        if !label(version) {
            return Err((version_field, format!("{version:?} is not an API version")));
        }
        if !label(resource) {
            return Err((
                resource_field,
                format!("{resource:?} is not a plural resource name"),
            ));
        }
        if checked.contains(&key) {
            return Err((
                list,
                format!("{group}/{version}/{resource} is listed twice"),
            ));
        }
        checked.push(key);
    }
    Ok(checked)
}

/// `spec.cache` checked: its resources as `spec.sharedWatches`' are, the budget a quantity
/// between 1 MiB and 1 TiB, each limit at least 1.
fn resolve_cache(
    spec: crate::objects::CacheSpec,
) -> Result<crate::settings::CacheSettings, (&'static str, String)> {
    use crate::settings::CacheSettings as C;
    let default_max = spec
        .max_objects_per_resource
        .unwrap_or(C::DEFAULT_MAX_OBJECTS);
    in_range(default_max, u32::MAX, "spec.cache.maxObjectsPerResource")?;
    let mut limits = Vec::new();
    for r in &spec.resources {
        let max = r.max_objects.unwrap_or(default_max);
        in_range(max, u32::MAX, "spec.cache.resources[].maxObjects")?;
        limits.push(max as usize);
    }
    let named = spec.resources.into_iter();
    let names = checked_resources(
        named.map(|r| (r.group, r.version, r.resource)),
        Block::Cache,
    )?;
    let memory_budget = match spec.memory_budget.as_deref() {
        None => C::DEFAULT_MEMORY_BUDGET,
        Some(text) => crate::checks::quantity_bytes(text)
            .filter(|b| (1 << 20..=1 << 40).contains(b))
            .ok_or((
                "spec.cache.memoryBudget",
                format!("{text:?} is not a quantity of bytes between 1Mi and 1Ti (say 512Mi)"),
            ))?,
    };
    Ok(C {
        resources: names.into_iter().zip(limits).collect(),
        memory_budget,
    })
}

fn in_range(value: u32, max: u32, field: &'static str) -> Result<u32, (&'static str, String)> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err((field, format!("{value} is not between 1 and {max}")))
    }
}

/// `spec.circuitBreaker` with defaults applied: an open period between 1 ms and an hour, the
/// longest no shorter than the first; an error names the field.
fn resolve_circuit_breaker(
    spec: crate::objects::CircuitBreakerSpec,
) -> Result<CircuitBreakerSettings, (&'static str, String)> {
    let defaults = CircuitBreakerSettings::default();
    let max = CircuitBreakerSettings::MAX_OPEN;
    let period = |value: Option<f64>, field: &'static str, default: std::time::Duration| match value
    {
        None => Ok(default),
        Some(s) if (0.001..=max.as_secs_f64()).contains(&s) => {
            Ok(std::time::Duration::from_secs_f64(s))
        }
        Some(s) => Err((
            field,
            format!(
                "{s} is not a number of seconds between 0.001 and {}",
                max.as_secs()
            ),
        )),
    };
    let consecutive_failures = spec
        .consecutive_failures
        .unwrap_or(defaults.consecutive_failures);
    if consecutive_failures > CircuitBreakerSettings::MAX_FAILURES {
        return Err((
            "spec.circuitBreaker.consecutiveFailures",
            format!(
                "{consecutive_failures} is more than {} (0 turns the breakers off)",
                CircuitBreakerSettings::MAX_FAILURES
            ),
        ));
    }
    let open = period(
        spec.open_seconds,
        "spec.circuitBreaker.openSeconds",
        defaults.open,
    )?;
    // Absent, the longest period is the default's, or the first period when that is longer.
    let max_open = period(
        spec.max_open_seconds,
        "spec.circuitBreaker.maxOpenSeconds",
        defaults.max_open.max(open),
    )?;
    if max_open < open {
        return Err((
            "spec.circuitBreaker.maxOpenSeconds",
            format!(
                "{} s is shorter than openSeconds ({} s)",
                max_open.as_secs_f64(),
                open.as_secs_f64()
            ),
        ));
    }
    Ok(CircuitBreakerSettings {
        consecutive_failures,
        open,
        max_open,
    })
}

/// `spec.http2` with defaults applied; an error names the field.
fn resolve_http2(spec: Http2Spec) -> Result<Http2Settings, (&'static str, String)> {
    let defaults = Http2Settings::default();
    let max_concurrent_streams = spec
        .max_concurrent_streams
        .unwrap_or(defaults.max_concurrent_streams);
    in_range(
        max_concurrent_streams,
        Http2Settings::MAX_CONCURRENT_STREAMS_LIMIT,
        "spec.http2.maxConcurrentStreams",
    )?;
    let idle_timeout = optional_seconds(spec.idle_timeout_seconds, defaults.idle_timeout)
        .map_err(|m| ("spec.http2.idleTimeoutSeconds", m))?;
    Ok(Http2Settings {
        max_concurrent_streams,
        idle_timeout,
    })
}

/// Looks a `v1` Secret up by namespace and name (the Secrets of the config files, or those the
/// API source watches).
pub(crate) type FindSecret<'a> = dyn Fn(&str, &str) -> Option<SecretData> + 'a;

/// The credentials a Cluster's `spec.credentials.secretRef` Secret holds, under the keys
/// Kubernetes uses for them.
struct SecretCredentials {
    token: Option<String>,
    ca_pem: Option<Vec<u8>>,
    client_cert_pem: Option<Vec<u8>>,
    client_key_pem: Option<Vec<u8>>,
}

fn secret_credentials(
    reference: &crate::objects::SecretReference,
    find_secret: &FindSecret<'_>,
) -> Result<SecretCredentials, String> {
    let namespace = reference
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or("default");
    if reference.name.is_empty() {
        return Err("a Secret name is required".into());
    }
    let secret = find_secret(namespace, &reference.name)
        .ok_or_else(|| format!("Secret {namespace}/{} not found", reference.name))?;
    let text = |key: &str| -> Result<Option<String>, String> {
        secret
            .values
            .get(key)
            .map(|v| {
                String::from_utf8(v.clone())
                    .map(|t| t.trim().to_owned())
                    .map_err(|_| {
                        format!("Secret {namespace}/{}: {key} is not UTF-8", reference.name)
                    })
            })
            .transpose()
    };
    let pem = |key: &str| -> Result<Option<Vec<u8>>, String> {
        match secret.values.get(key) {
            None => Ok(None),
            Some(v) if v.windows(11).any(|w| w == b"-----BEGIN ") => Ok(Some(v.clone())),
            Some(_) => Err(format!(
                "Secret {namespace}/{}: {key} is not PEM (no -----BEGIN line)",
                reference.name
            )),
        }
    };
    let credentials = SecretCredentials {
        token: text("token")?,
        ca_pem: pem("ca.crt")?,
        client_cert_pem: pem("tls.crt")?,
        client_key_pem: pem("tls.key")?,
    };
    if credentials.token.is_none() && credentials.client_cert_pem.is_none() {
        return Err(format!(
            "Secret {namespace}/{} has neither a token nor tls.crt/tls.key",
            reference.name
        ));
    }
    Ok(credentials)
}

pub(crate) fn resolve_cluster(
    obj: ClusterObject,
    base: &Path,
    origin: &str,
    find_secret: &FindSecret<'_>,
) -> Result<ClusterConfig, ConfigError> {
    let name = obj.metadata.name.clone();
    let invalid = |field: &'static str, message: String| ConfigError::Invalid {
        origin: origin.to_owned(),
        kind: "Cluster",
        name: name.clone(),
        field,
        message,
    };
    check_cluster_name(&name).map_err(|m| invalid("metadata.name", m))?;
    let spec = obj.spec;
    match (spec.connect_mode, spec.server.is_empty()) {
        // A pull-mode member has no address: its agent dials the gateway.
        (crate::objects::ConnectMode::Tunnel, true) => {}
        _ => {
            crate::table::parse_server(&spec.server).map_err(|m| invalid("spec.server", m))?;
        }
    }
    let ca_pem = pem_field(spec.ca_data, spec.ca_file, base)
        .map_err(|m| invalid("spec.caData/caFile", m))?;
    let c = spec.credentials;
    let from_secret = match &c.secret_ref {
        None => None,
        Some(reference) => {
            let inline = c.token.is_some()
                || c.token_file.is_some()
                || c.client_cert_data.is_some()
                || c.client_cert_file.is_some()
                || c.client_key_data.is_some()
                || c.client_key_file.is_some();
            if inline {
                return Err(invalid(
                    "spec.credentials.secretRef",
                    "credentials come from the Secret or from the fields beside it, not both"
                        .into(),
                ));
            }
            let found = secret_credentials(reference, find_secret)
                .map_err(|m| invalid("spec.credentials.secretRef", m))?;
            if found.ca_pem.is_some() && ca_pem.is_some() {
                return Err(invalid(
                    "spec.credentials.secretRef",
                    "the Secret has a ca.crt and spec.caData/caFile is set too; keep one".into(),
                ));
            }
            Some(found)
        }
    };
    let (ca_pem, from_secret) = match from_secret {
        Some(mut found) => (ca_pem.or(found.ca_pem.take()), Some(found)),
        None => (ca_pem, None),
    };
    let token = match (c.token, c.token_file) {
        _ if from_secret.is_some() => from_secret.as_ref().and_then(|f| f.token.clone()),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "spec.credentials",
                "set token or tokenFile, not both".into(),
            ))
        }
        (Some(t), None) => Some(t),
        (None, Some(f)) => Some(
            std::fs::read_to_string(base.join(&f))
                .map_err(|e| invalid("spec.credentials.tokenFile", format!("{f}: {e}")))?
                .trim()
                .to_owned(),
        ),
        (None, None) => None,
    };
    if let Some(t) = &token {
        check_token(t).map_err(|m| invalid("spec.credentials.token", m))?;
    }
    let proxy_url = spec.proxy_url.filter(|u| !u.is_empty());
    if let Some(url) = proxy_url.as_deref() {
        check_proxy_url(url).map_err(|m| invalid("spec.proxyURL", m))?;
    }
    check_proxy_headers(proxy_url.as_deref(), &spec.proxy_header)
        .map_err(|m| invalid("spec.proxyHeader", m))?;
    let tunnel_address = match spec.tunnel.and_then(|t| t.address) {
        Some(_) if spec.connect_mode != crate::objects::ConnectMode::Tunnel => {
            return Err(invalid(
                "spec.tunnel.address",
                "only a Tunnel cluster has an agent to dial it".into(),
            ))
        }
        Some(address) => {
            crate::endpoint::parse_tunnel_address(&address)
                .map_err(|m| invalid("spec.tunnel.address", m))?;
            Some(address)
        }
        None => None,
    };
    let (client_cert_pem, client_key_pem) = match from_secret {
        Some(found) => (found.client_cert_pem, found.client_key_pem),
        None => (
            pem_field(c.client_cert_data, c.client_cert_file, base)
                .map_err(|m| invalid("spec.credentials.clientCertData/clientCertFile", m))?,
            pem_field(c.client_key_data, c.client_key_file, base)
                .map_err(|m| invalid("spec.credentials.clientKeyData/clientKeyFile", m))?,
        ),
    };
    if client_cert_pem.is_some() != client_key_pem.is_some() {
        return Err(invalid(
            "spec.credentials",
            "a client certificate needs its key and the other way round".into(),
        ));
    }
    Ok(ClusterConfig {
        name: name.clone(),
        labels: obj.metadata.labels,
        origin: origin.to_owned(),
        server: spec.server,
        ca_pem,
        insecure_skip_tls_verify: spec.insecure_skip_tls_verify,
        token,
        client_cert_pem,
        client_key_pem,
        impersonation: spec.impersonation,
        pass_through: spec.auth_mode == crate::objects::ClusterAuthMode::PassThrough,
        mode: spec.connect_mode,
        proxy_url,
        proxy_headers: spec.proxy_header,
        tunnel_address,
    })
}

/// A PEM value given inline or as a file relative to `base`; `Ok(None)` when neither is set.
fn pem_field(
    data: Option<String>,
    file: Option<String>,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    let pem = match (data, &file) {
        (Some(_), Some(_)) => return Err("set the Data or the File form, not both".into()),
        (Some(d), None) => d.into_bytes(),
        (None, Some(f)) => std::fs::read(base.join(f)).map_err(|e| format!("{f}: {e}"))?,
        (None, None) => return Ok(None),
    };
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        let name = file.as_deref().unwrap_or("the Data value");
        return Err(format!("{name}: not PEM (no -----BEGIN line)"));
    }
    Ok(Some(pem))
}
