//! The routing table: what the data path reads, once per request, through an `ArcSwap`.
//!
//! Built off the hot path from a validated [`Config`]: each cluster's upstream address, its rustls
//! client configuration (CA, client certificate) and the credentials header are prepared here so a
//! request does nothing but a hash lookup. A table is immutable; a change builds a new one.
//! A cluster's `id` is a digest of its resolved spec: unchanged clusters keep their id across
//! rebuilds, which is how the data path knows which upstream pools to keep.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustls::pki_types::ServerName;

pub use crate::endpoint::{crypto_provider, parse_certs, parse_key, parse_server, UpstreamTarget};
use crate::error::ConfigError;
use crate::judge::{ObjectRef, Rejection};
use crate::objects::ConnectMode;
use crate::retirement::RouteRetirement;
use crate::settings::{ClusterConfig, Config, GatewaySettings};

/// An HTTP proxy the gateway tunnels through (CONNECT) to reach a member, with the CONNECT
/// request prepared at table build so a connect formats nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct EgressProxy {
    /// The proxy URL without its credentials, for logs and error messages.
    pub url: String,
    pub host: String,
    pub port: u16,
    /// `CONNECT member:port HTTP/1.1`, `Host`, the `proxyHeader` fields, and
    /// `Proxy-Authorization: Basic ...` when the URL carries `user:password@`.
    pub connect_request: Vec<u8>,
}

impl std::fmt::Debug for EgressProxy {
    // The CONNECT request may carry credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Prepares the tunnel through `url` to `target` (the URL was validated by the loader).
pub fn egress_proxy(
    url: &str,
    headers: &BTreeMap<String, String>,
    target: &UpstreamTarget,
) -> Result<EgressProxy, String> {
    use base64::Engine as _;
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?}: only http:// egress proxies (HTTP CONNECT) are supported"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?} has no host"))?
        .as_str();
    let (credentials, host_port) = match authority.rsplit_once('@') {
        Some((user_info, host_port)) => (Some(user_info), host_port),
        None => (None, authority),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{url:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let mut connect_request =
        format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n", target.authority).into_bytes();
    for (name, value) in headers {
        connect_request.extend_from_slice(name.as_bytes());
        connect_request.extend_from_slice(b": ");
        connect_request.extend_from_slice(value.as_bytes());
        connect_request.extend_from_slice(b"\r\n");
    }
    let has_authorization = headers
        .keys()
        .any(|k| k.eq_ignore_ascii_case("proxy-authorization"));
    if let (Some(user_info), false) = (credentials, has_authorization) {
        connect_request.extend_from_slice(b"Proxy-Authorization: Basic ");
        connect_request.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(user_info)
                .as_bytes(),
        );
        connect_request.extend_from_slice(b"\r\n");
    }
    connect_request.extend_from_slice(b"\r\n");
    Ok(EgressProxy {
        url: format!("http://{host_port}"),
        host,
        port,
        connect_request,
    })
}

/// One member cluster, ready for the data path.
pub struct ClusterRoute {
    pub name: Arc<str>,
    pub labels: BTreeMap<String, String>,
    pub upstream: UpstreamTarget,
    /// The TLS client configuration for `upstream` (None for a plain `http://` server).
    pub tls_client: Option<Arc<rustls::ClientConfig>>,
    pub server_name: ServerName<'static>,
    /// The `Authorization` value the gateway sends upstream (`Bearer ...`), None with client certs.
    pub authorization: Option<String>,
    pub impersonation: bool,
    /// The client's bearer token goes to the member instead of the gateway's credentials.
    pub pass_through: bool,
    pub mode: ConnectMode,
    pub proxy_url: Option<String>,
    /// Headers for the egress proxy's CONNECT (Karmada's `proxyHeader`).
    pub proxy_headers: BTreeMap<String, String>,
    /// The egress proxy to reach `upstream` through (an HTTP CONNECT tunnel), ready to dial.
    pub egress_proxy: Option<EgressProxy>,
    /// A `Tunnel` cluster's member as an agent that only dials TCP (konnectivity) reaches it:
    /// the gateway runs TLS to it through the agent's connection.
    pub tunnel_member: Option<TunnelMember>,
    /// Digest of the resolved spec; changes whenever anything about this cluster changes.
    pub id: u64,
    /// Fired when a published table no longer carries this route (the cluster was removed or its
    /// `id` changed): streams on it end cleanly and its pooled connections close.
    pub retirement: Arc<RouteRetirement>,
}

impl std::fmt::Debug for ClusterRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRoute")
            .field("name", &self.name)
            .field("upstream", &self.upstream)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("impersonation", &self.impersonation)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The whole routing table.
#[derive(Debug)]
pub struct RouteTable {
    clusters: ahash::AHashMap<Arc<str>, Arc<ClusterRoute>>,
    gateway: GatewaySettings,
    config: Config,
    generation: u64,
    /// Authenticators and the compiled AccessPolicy objects (identity layer).
    access: Arc<crate::policy::AccessControl>,
    /// The kinds `/fleet` merges and the clusters of each.
    fleet: crate::fleet::FleetView,
}

impl RouteTable {
    /// Builds a table from a validated configuration. Fails (naming the cluster and field) when a
    /// certificate or key does not parse.
    pub fn build(config: &Config) -> Result<RouteTable, ConfigError> {
        Self::build_generation(config, 1)
    }

    /// Like [`RouteTable::build`], stamping the table with `generation` (the reload counter).
    pub fn build_generation(config: &Config, generation: u64) -> Result<RouteTable, ConfigError> {
        Self::build_reusing(None, config, generation)
    }

    /// Builds the table that follows `previous`: a cluster whose resolved configuration did not
    /// change keeps its route (the same `Arc`, nothing parsed again), so a reload costs in
    /// proportion to what changed, not to the size of the fleet.
    pub fn rebuild(
        previous: &RouteTable,
        config: &Config,
        generation: u64,
    ) -> Result<RouteTable, ConfigError> {
        Self::build_reusing(Some(previous), config, generation)
    }

    fn build_reusing(
        previous: Option<&RouteTable>,
        config: &Config,
        generation: u64,
    ) -> Result<RouteTable, ConfigError> {
        let (table, mut rejected) =
            Self::build_judging(previous, config.clone(), generation, false);
        match rejected.is_empty() {
            true => Ok(table),
            false => Err(rejected.swap_remove(0).error),
        }
    }

    /// Builds the table that follows `previous` (if any), judging objects one by one (see
    /// `judge`): a cluster whose route does not build (a certificate that does not parse), an
    /// AccessPolicy that does not compile and a fleet source that does not resolve are each left
    /// out, or served at their version in `previous` when it has one; every other object is
    /// served. Returns the table (its `config()` is what it serves) and what it did not take.
    pub(crate) fn build_judged(
        previous: Option<&RouteTable>,
        config: Config,
        generation: u64,
    ) -> (RouteTable, Vec<Rejection>) {
        Self::build_judging(previous, config, generation, true)
    }

    /// `build_judged`; without `keep_last_good` the first rejection is all the caller needs
    /// (the strict builders), so nothing is put back.
    fn build_judging(
        previous: Option<&RouteTable>,
        mut config: Config,
        generation: u64,
        keep_last_good: bool,
    ) -> (RouteTable, Vec<Rejection>) {
        let mut rejected = Vec::new();
        let last = previous.filter(|_| keep_last_good);
        let clusters = {
            let unchanged: ahash::AHashMap<&str, &ClusterConfig> = previous
                .map(|p| {
                    p.config
                        .clusters
                        .iter()
                        .map(|c| (c.name.as_str(), c))
                        .collect()
                })
                .unwrap_or_default();
            let reused = |c: &ClusterConfig| {
                previous
                    .filter(|_| unchanged.get(c.name.as_str()) == Some(&c))
                    .and_then(|p| p.clusters.get(c.name.as_str()).cloned())
            };
            // Only the clusters built anew share the client configurations built now.
            let mut tls_configs = TlsConfigCache::new(
                config
                    .clusters
                    .iter()
                    .filter(|c| !unchanged.get(c.name.as_str()).is_some_and(|u| *u == *c)),
            );
            let mut clusters = ahash::AHashMap::with_capacity(config.clusters.len());
            // The index of each cluster that does not build, and its last good version if any.
            let mut replaced: Vec<(usize, Option<ClusterConfig>)> = Vec::new();
            for (i, c) in config.clusters.iter().enumerate() {
                let route = match reused(c) {
                    Some(route) => route,
                    None => match build_route(c, &mut tls_configs) {
                        // Same digest, so the same route (only where it came from changed,
                        // say): keep the serving one, whose streams and pooled connections
                        // stay valid.
                        Ok(route) => match previous.and_then(|p| p.clusters.get(c.name.as_str())) {
                            Some(serving) if serving.id == route.id => serving.clone(),
                            _ => Arc::new(route),
                        },
                        Err(error) => {
                            let good = last.and_then(|p| {
                                let config = unchanged.get(c.name.as_str())?;
                                Some(((*config).clone(), p.clusters.get(c.name.as_str())?.clone()))
                            });
                            let mut rejection = Rejection::new(
                                ObjectRef::new("Cluster", &c.name, &c.origin),
                                error,
                            );
                            rejection.kept = good.is_some();
                            rejected.push(rejection);
                            replaced.push((i, good.as_ref().map(|(config, _)| config.clone())));
                            match good {
                                Some((_, route)) => route,
                                None => continue,
                            }
                        }
                    },
                };
                clusters.insert(route.name.clone(), route);
            }
            drop(tls_configs);
            for (i, good) in replaced.into_iter().rev() {
                match good {
                    Some(good) => config.clusters[i] = good,
                    None => {
                        config.clusters.remove(i);
                    }
                }
            }
            clusters
        };
        // Each object that does not compile (resolve) is taken out and its last good version
        // tried once in its place; every round takes one out, so the loops end.
        let mut judging = Judging {
            rejected,
            fell_back: Vec::new(),
        };
        let policy = loop {
            let e = match crate::policy::CompiledPolicy::compile(&config) {
                Ok(policy) => break policy,
                Err(e) => e,
            };
            let object = ObjectRef::new("AccessPolicy", &e.policy, &e.origin);
            let error = ConfigError::Invalid {
                // The file (or API object) that holds it, as every other object's error names it.
                origin: if e.origin.is_empty() {
                    "AccessPolicy".into()
                } else {
                    e.origin
                },
                kind: "AccessPolicy",
                name: e.policy,
                field: e.field,
                message: e.message,
            };
            let good = last.map(|p| p.config.policies.as_slice());
            take_out(
                &mut config.policies,
                good,
                policy_id,
                object,
                error,
                &mut judging,
            );
        };
        let fleet = loop {
            let error = match crate::fleet::resolve(
                &config.fleet,
                config.clusters.iter().map(|c| (c.name.as_str(), &c.labels)),
            ) {
                Ok(fleet) => break fleet,
                Err(error) => error,
            };
            let object = match &error {
                ConfigError::Invalid {
                    origin, kind, name, ..
                } => ObjectRef::new(kind, name, origin),
                // Not reached: `resolve` names the object of every error.
                _ => ObjectRef::new("FleetResource", "", ""),
            };
            let good = last.map(|p| p.config.fleet.as_slice());
            take_out(
                &mut config.fleet,
                good,
                fleet_id,
                object,
                error,
                &mut judging,
            );
        };
        let rejected = judging.rejected;
        if keep_last_good {
            crate::judge::canonical_order(&mut config);
        }
        let access = crate::policy::AccessControl::from_compiled(&config, policy);
        let table = RouteTable {
            access: Arc::new(access),
            fleet,
            clusters,
            gateway: config.gateway.clone(),
            config,
            generation,
        };
        (table, rejected)
    }

    /// The cluster called `name`, if any.
    #[inline]
    pub fn cluster(&self, name: &str) -> Option<&Arc<ClusterRoute>> {
        self.clusters.get(name)
    }

    /// Every cluster, in no particular order.
    pub fn clusters(&self) -> impl Iterator<Item = &Arc<ClusterRoute>> {
        self.clusters.values()
    }

    /// Authentication and authorization as compiled with this table.
    pub fn access(&self) -> &Arc<crate::policy::AccessControl> {
        &self.access
    }

    pub fn gateway(&self) -> &GatewaySettings {
        &self.gateway
    }

    /// The kinds the fleet view merges.
    pub fn fleet(&self) -> &crate::fleet::FleetView {
        &self.fleet
    }

    /// The configuration this table was built from (for diffing on reload).
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Retires every route of this table that `next` does not carry over (same `Arc`): its
    /// cluster was removed or its spec changed. Called by the publisher once `next` serves.
    pub fn retire_routes_missing_from(&self, next: &RouteTable) -> usize {
        let mut retired = 0;
        for route in self.clusters.values() {
            let kept = next
                .clusters
                .get(&route.name)
                .is_some_and(|r| Arc::ptr_eq(r, route));
            if !kept {
                route.retirement.retire();
                retired += 1;
            }
        }
        retired
    }
}

/// The objects a table build did not take, and those whose last good version it put back.
struct Judging {
    rejected: Vec<Rejection>,
    fell_back: Vec<ObjectRef>,
}

/// An AccessPolicy as `take_out` names it: kind, name, origin.
fn policy_id(p: &crate::objects::AccessPolicyObject) -> (&str, &str, &str) {
    ("AccessPolicy", &p.metadata.name, &p.origin)
}

/// A fleet source as `take_out` names it: kind, name, origin.
fn fleet_id(f: &crate::fleet::FleetSource) -> (&str, &str, &str) {
    (f.kind, &f.name, &f.origin)
}

/// Takes `object`, which did not compile (resolve) with `error`, out of `objects`. The first
/// time, its version in `last` (the serving table's, when last good versions are kept) goes in
/// its place; when that version fails too, it is taken out as well and the rejection says the
/// object is not served after all.
fn take_out<T: Clone>(
    objects: &mut Vec<T>,
    last: Option<&[T]>,
    id: impl Fn(&T) -> (&str, &str, &str),
    object: ObjectRef,
    error: ConfigError,
    judging: &mut Judging,
) {
    let before = objects.len();
    objects.retain(|t| {
        id(t)
            != (
                object.kind.as_str(),
                object.name.as_str(),
                object.origin.as_str(),
            )
    });
    if objects.len() == before {
        // Not reached (the error names an object of the set); fail closed: none of them.
        objects.clear();
    }
    let same = |o: &ObjectRef| o.kind == object.kind && o.name == object.name;
    if judging.fell_back.iter().any(same) {
        for r in judging.rejected.iter_mut().filter(|r| same(&r.object)) {
            r.kept = false;
        }
        return;
    }
    let good = last
        .and_then(|last| {
            last.iter().find(|t| {
                let (kind, name, _) = id(t);
                kind == object.kind && name == object.name
            })
        })
        .cloned();
    let mut rejection = Rejection::new(object, error);
    rejection.kept = good.is_some();
    if rejection.kept {
        judging.fell_back.push(rejection.object.clone());
    }
    objects.extend(good);
    judging.rejected.push(rejection);
}

/// TLS client configurations already built during one table build, by what they are made of:
/// clusters that share a CA and credentials (a fleet signed by one CA, all with tokens) share one
/// configuration instead of parsing the same PEM thousands of times. Keys borrow the
/// configuration's PEM bytes: nothing is copied to look one up.
struct TlsConfigCache<'a> {
    built: ahash::AHashMap<TlsConfigKey<'a>, Arc<rustls::ClientConfig>>,
    /// How many clusters of the configuration use each key: sizes the session cache.
    sharing: ahash::AHashMap<TlsConfigKey<'a>, usize>,
}

#[derive(PartialEq, Eq, Hash, Clone, Copy)]
struct TlsConfigKey<'a> {
    ca_pem: Option<&'a [u8]>,
    insecure_skip_tls_verify: bool,
    client_cert_pem: Option<&'a [u8]>,
    client_key_pem: Option<&'a [u8]>,
}

impl<'a> TlsConfigKey<'a> {
    fn of(c: &'a ClusterConfig) -> Self {
        TlsConfigKey {
            ca_pem: c.ca_pem.as_deref(),
            insecure_skip_tls_verify: c.insecure_skip_tls_verify,
            client_cert_pem: c.client_cert_pem.as_deref(),
            client_key_pem: c.client_key_pem.as_deref(),
        }
    }
}

/// TLS session tickets kept per member server name (rustls keeps a few per name); a client
/// configuration shared by many clusters keeps room for each of them, up to rustls's default.
const SESSIONS_PER_CLUSTER: usize = 2;
const MAX_SESSIONS: usize = 256;

impl<'a> TlsConfigCache<'a> {
    fn new(built_anew: impl Iterator<Item = &'a ClusterConfig>) -> Self {
        let mut sharing = ahash::AHashMap::new();
        for c in built_anew {
            *sharing.entry(TlsConfigKey::of(c)).or_insert(0) += 1;
        }
        TlsConfigCache {
            built: ahash::AHashMap::new(),
            sharing,
        }
    }

    fn get_or_build(
        &mut self,
        c: &'a ClusterConfig,
    ) -> Result<Arc<rustls::ClientConfig>, (&'static str, String)> {
        let key = TlsConfigKey::of(c);
        if let Some(config) = self.built.get(&key) {
            return Ok(config.clone());
        }
        let mut config = client_config(c)?;
        // rustls's default session cache holds 256 server names, allocated up front (about
        // 16 KiB): per cluster with a CA of its own that was most of its table entry.
        let clusters = self.sharing.get(&key).copied().unwrap_or(1);
        config.resumption = rustls::client::Resumption::in_memory_sessions(
            (clusters * SESSIONS_PER_CLUSTER).min(MAX_SESSIONS),
        );
        let config = Arc::new(config);
        self.built.insert(key, config.clone());
        Ok(config)
    }
}

/// Where a konnectivity agent dials a `Tunnel` cluster's member, and the gateway's TLS to it.
pub struct TunnelMember {
    /// `host:port`, as the agent resolves it (`spec.tunnel.address`).
    pub address: String,
    pub server_name: ServerName<'static>,
    /// The member's CA and the gateway's client certificate, as for a Direct cluster; None
    /// without `caData` (and not `insecureSkipTLSVerify`): konnectivity agents are then refused
    /// for this cluster rather than the gateway sending credentials to an unverified server.
    pub tls_client: Option<Arc<rustls::ClientConfig>>,
}

fn tunnel_member<'a>(
    c: &'a ClusterConfig,
    tls_configs: &mut TlsConfigCache<'a>,
) -> Result<TunnelMember, (&'static str, String)> {
    let address = c
        .tunnel_address
        .as_deref()
        .unwrap_or(crate::endpoint::DEFAULT_TUNNEL_ADDRESS);
    let (host, _) =
        crate::endpoint::parse_tunnel_address(address).map_err(|m| ("spec.tunnel.address", m))?;
    let server_name =
        ServerName::try_from(host).map_err(|e| ("spec.tunnel.address", e.to_string()))?;
    let tls_client = if c.ca_pem.is_some() || c.insecure_skip_tls_verify {
        Some(tls_configs.get_or_build(c)?)
    } else {
        None
    };
    Ok(TunnelMember {
        address: address.to_owned(),
        server_name,
        tls_client,
    })
}

/// The target of a `Tunnel` cluster without a server: never dialed (requests ride its agent's
/// tunnel); the cluster name stands in as the `Host` of the member's request heads, and there
/// is no path prefix. The agent's TLS to its member is its own.
fn tunnel_target(name: &str) -> UpstreamTarget {
    UpstreamTarget {
        tls: false,
        host: name.to_owned(),
        port: 443,
        authority: name.to_owned(),
        path_prefix: String::new(),
    }
}

fn build_route<'a>(
    c: &'a ClusterConfig,
    tls_configs: &mut TlsConfigCache<'a>,
) -> Result<ClusterRoute, ConfigError> {
    let invalid = |field: &'static str, message: String| ConfigError::Invalid {
        origin: c.origin.clone(),
        kind: "Cluster",
        name: c.name.clone(),
        field,
        message,
    };
    let upstream = if c.mode == ConnectMode::Tunnel && c.server.is_empty() {
        tunnel_target(&c.name)
    } else {
        parse_server(&c.server).map_err(|m| invalid("spec.server", m))?
    };
    let server_name = ServerName::try_from(upstream.host.clone()).map_err(|e| {
        invalid(
            "spec.server",
            format!("{:?} is not a TLS server name: {e}", upstream.host),
        )
    })?;
    let tls_client = if upstream.tls {
        Some(
            tls_configs
                .get_or_build(c)
                .map_err(|(field, m)| invalid(field, m))?,
        )
    } else {
        None
    };
    let egress_proxy = match c.proxy_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => Some(
            egress_proxy(url, &c.proxy_headers, &upstream)
                .map_err(|m| invalid("spec.proxyURL", m))?,
        ),
        None => None,
    };
    let tunnel_member = match c.mode {
        ConnectMode::Tunnel => {
            Some(tunnel_member(c, tls_configs).map_err(|(field, m)| invalid(field, m))?)
        }
        ConnectMode::Direct => None,
    };
    let authorization = c.token.as_ref().map(|t| format!("Bearer {t}"));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // DefaultHasher::new() uses fixed keys, so the id is stable across rebuilds and processes.
    c.name.hash(&mut h);
    c.labels.hash(&mut h);
    c.server.hash(&mut h);
    c.ca_pem.hash(&mut h);
    c.insecure_skip_tls_verify.hash(&mut h);
    c.token.hash(&mut h);
    c.client_cert_pem.hash(&mut h);
    c.client_key_pem.hash(&mut h);
    c.impersonation.hash(&mut h);
    c.pass_through.hash(&mut h);
    c.proxy_url.hash(&mut h);
    c.proxy_headers.hash(&mut h);
    c.tunnel_address.hash(&mut h);
    format!("{:?}", c.mode).hash(&mut h);
    Ok(ClusterRoute {
        name: Arc::from(c.name.as_str()),
        labels: c.labels.clone(),
        upstream,
        tls_client,
        server_name,
        authorization,
        impersonation: c.impersonation,
        pass_through: c.pass_through,
        mode: c.mode,
        proxy_url: c.proxy_url.clone(),
        proxy_headers: c.proxy_headers.clone(),
        egress_proxy,
        tunnel_member,
        id: h.finish(),
        retirement: Arc::new(RouteRetirement::new()),
    })
}

fn client_config(c: &ClusterConfig) -> Result<rustls::ClientConfig, (&'static str, String)> {
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("spec", e.to_string()))?;
    let builder = if c.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAnyServerCert(
                crypto_provider(),
            )))
    } else {
        let ca = c.ca_pem.as_deref().ok_or((
            "spec.caData/caFile",
            "an https server needs a CA (or insecureSkipTLSVerify)".to_owned(),
        ))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in parse_certs(ca).map_err(|m| ("spec.caData/caFile", m))? {
            roots.add(cert).map_err(|e| {
                (
                    "spec.caData/caFile",
                    format!("unusable CA certificate: {e}"),
                )
            })?;
        }
        builder.with_root_certificates(roots)
    };
    let mut config = match (&c.client_cert_pem, &c.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = parse_certs(cert).map_err(|m| ("spec.credentials.clientCertData", m))?;
            let key = parse_key(key).map_err(|m| ("spec.credentials.clientKeyData", m))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                (
                    "spec.credentials",
                    format!("client certificate and key do not match: {e}"),
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    // Upgrades (exec, port-forward) need HTTP/1.1 upstream; the gateway speaks HTTP/1.1 to members.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

mod insecure {
    //! `insecureSkipTLSVerify: true`: the member's certificate is not checked (as kubectl's flag of
    //! the same name). Signatures are still verified so the handshake itself is sound.
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    pub struct AcceptAnyServerCert(pub Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AcceptAnyServerCert {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}
