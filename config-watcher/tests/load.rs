//! Loading configuration directories as an operator writes them: real PEM material, objects split
//! over files, and the mistakes an operator makes (each must be named precisely).

use std::path::Path;

use fleetgate_config_watcher::{load_path, ConfigError, RouteTable, SharedWatchScope};

struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

fn write_gateway(dir: &Path, pki: &Pki) {
    std::fs::write(dir.join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &pki.key_pem).unwrap();
    std::fs::write(dir.join("ca.crt"), &pki.ca_pem).unwrap();
    std::fs::write(
        dir.join("gateway.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  listeners:\n  - address: 127.0.0.1:0\n  tls:\n    certFile: tls.crt\n    keyFile: tls.key\n    clientCAFile: ca.crt\n  admin:\n    address: 127.0.0.1:0\n  limits:\n    connectTimeoutSeconds: 2.5\n",
    )
    .unwrap();
}

/// A temporary config directory holding a Gateway (`write_gateway`) and the PKI it names.
fn gateway_dir() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    write_gateway(dir.path(), &pki);
    (dir, pki)
}

/// Writes `text` to the file `name` in the config directory `dir`.
fn put(dir: &Path, name: &str, text: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// The route table of the config in `dir`; loading and building must both succeed.
fn table_in(dir: &Path) -> RouteTable {
    RouteTable::build(&load_path(dir).unwrap()).unwrap()
}

fn cluster_yaml(name: &str, server: &str, pki: &Pki, extra: &str) -> String {
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    env: dev\nspec:\n  server: {server}\n  caData: |\n{}  credentials:\n    token: tok-{name}\n{extra}",
        indent(&pki.ca_pem)
    )
}

#[test]
fn a_tunnel_cluster_needs_no_server_and_a_direct_one_does() {
    let (dir, _) = gateway_dir();
    put(dir.path(), "pulled.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: pulled\nspec:\n  connectMode: Tunnel\n  credentials:\n    token: tok-pulled\n");
    let table = table_in(dir.path());
    let route = table.cluster("pulled").unwrap();
    assert_eq!(route.mode, fleetgate_config_watcher::ConnectMode::Tunnel);
    assert_eq!(route.upstream.path_prefix, "");
    assert!(route.tls_client.is_none());
    put(dir.path(), "pulled.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: pulled\nspec:\n  credentials:\n    token: tok-pulled\n");
    let err = load_path(dir.path()).unwrap_err().to_string();
    assert!(err.contains("spec.server"), "{err}");
}

#[test]
fn a_tunnel_cluster_says_where_a_konnectivity_agent_dials_its_member() {
    let (dir, pki) = gateway_dir();
    let tunnel = |extra: &str| {
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: pulled\nspec:\n  connectMode: Tunnel\n  caData: |\n{}  credentials:\n    token: tok\n{extra}",
            indent(&pki.ca_pem)
        )
    };
    // The default: the API server's service, with the Cluster's CA for the gateway's TLS.
    put(dir.path(), "pulled.yaml", tunnel(""));
    let table = table_in(dir.path());
    let pulled = table.cluster("pulled").unwrap();
    let member = pulled.tunnel_member.as_ref().unwrap();
    assert_eq!(member.address, "kubernetes.default.svc:443");
    assert!(member.tls_client.is_some());
    // Set, and changing it changes the route's id (pooled connections are not reused).
    let id = table.cluster("pulled").unwrap().id;
    put(
        dir.path(),
        "pulled.yaml",
        tunnel("  tunnel:\n    address: 10.96.0.1:443\n"),
    );
    let table = table_in(dir.path());
    let route = table.cluster("pulled").unwrap();
    assert_eq!(
        route.tunnel_member.as_ref().unwrap().address,
        "10.96.0.1:443"
    );
    assert_ne!(route.id, id);
    // Not host:port, or on a Direct cluster: refused, naming the field.
    for bad in [
        tunnel("  tunnel:\n    address: https://10.96.0.1:443\n"),
        tunnel("  tunnel:\n    address: \"evil\\r\\nHost: x:443\"\n"),
        cluster_yaml(
            "pulled",
            "https://127.0.0.1:6443",
            &pki,
            "  tunnel:\n    address: a:443\n",
        ),
    ] {
        put(dir.path(), "pulled.yaml", &bad);
        let err = load_path(dir.path()).unwrap_err().to_string();
        assert!(err.contains("spec.tunnel.address"), "{err}");
    }
    // Without a CA the route has no TLS for konnectivity agents (the listener refuses them).
    put(dir.path(), "pulled.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: pulled\nspec:\n  connectMode: Tunnel\n");
    let table = table_in(dir.path());
    let pulled = table.cluster("pulled").unwrap();
    let member = pulled.tunnel_member.as_ref().unwrap();
    assert!(member.tls_client.is_none());
}

#[test]
fn loads_a_directory_into_a_routing_table() {
    let (dir, pki) = gateway_dir();
    std::fs::create_dir(dir.path().join("clusters")).unwrap();
    std::fs::write(
        dir.path().join("clusters/m.yaml"),
        format!(
            "{}---\n{}",
            cluster_yaml("member1", "https://127.0.0.1:6443", &pki, ""),
            cluster_yaml(
                "member2",
                "https://[::1]:7443/prefix/",
                &pki,
                "  impersonation: false\n"
            )
        ),
    )
    .unwrap();
    // Editors' and mounted ConfigMaps' dot files are not configuration.
    put(dir.path(), "clusters/.m.yaml.swp", "garbage: [");

    let config = load_path(dir.path()).unwrap();
    assert_eq!(config.clusters.len(), 2);
    assert_eq!(config.gateway.limits.connect_timeout.as_millis(), 2500);
    let table = RouteTable::build(&config).unwrap();
    let m1 = table.cluster("member1").unwrap();
    assert_eq!(m1.upstream.authority, "127.0.0.1:6443");
    assert_eq!(m1.upstream.path_prefix, "");
    assert_eq!(m1.authorization.as_deref(), Some("Bearer tok-member1"));
    assert!(m1.impersonation && m1.tls_client.is_some());
    let m2 = table.cluster("member2").unwrap();
    assert_eq!(m2.upstream.authority, "[::1]:7443");
    assert_eq!(m2.upstream.host, "::1");
    assert_eq!(m2.upstream.path_prefix, "/prefix");
    assert!(!m2.impersonation);
    assert!(table.cluster("member3").is_none());

    // Rebuilding the same config keeps ids; changing one cluster changes only its id.
    let again = table_in(dir.path());
    assert_eq!(again.cluster("member1").unwrap().id, m1.id);
    std::fs::write(
        dir.path().join("clusters/m.yaml"),
        format!(
            "{}---\n{}",
            cluster_yaml("member1", "https://127.0.0.1:6443", &pki, ""),
            cluster_yaml("member2", "https://[::1]:7444/prefix/", &pki, "")
        ),
    )
    .unwrap();
    let changed = table_in(dir.path());
    assert_eq!(changed.cluster("member1").unwrap().id, m1.id);
    assert_ne!(changed.cluster("member2").unwrap().id, m2.id);
}

fn error_for(cluster: &str) -> String {
    let (dir, pki) = gateway_dir();
    put(
        dir.path(),
        "c.yaml",
        cluster.replace("CA", &indent(&pki.ca_pem)),
    );
    match load_path(dir.path()).and_then(|c| RouteTable::build(&c)) {
        Ok(_) => panic!("accepted: {cluster}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn mistakes_are_named_by_object_and_field() {
    let head = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name:";
    let e = error_for(&format!("{head} Bad_Name\nspec:\n  server: https://a:1\n"));
    assert!(e.contains("Cluster Bad_Name: metadata.name"), "{e}");
    let e = error_for(&format!("{head} fleet\nspec:\n  server: https://a:1\n"));
    assert!(e.contains("reserved"), "{e}");
    let e = error_for(&format!("{head} m\nspec:\n  server: ftp://a:1\n"));
    assert!(e.contains("Cluster m: spec.server"), "{e}");
    let e = error_for(&format!("{head} m\nspec:\n  server: https://a:1\n"));
    assert!(
        e.contains("spec.caData/caFile") && e.contains("needs a CA"),
        "{e}"
    );
    let e = error_for(&format!(
        "{head} m\nspec:\n  server: https://a:1\n  caData: not a pem\n"
    ));
    assert!(e.contains("not PEM"), "{e}");
    let e = error_for(&format!(
        "{head} m\nspec:\n  server: https://a:1\n  sever: typo\n"
    ));
    assert!(e.contains("unknown field `sever`"), "{e}");
    let e = error_for(&format!(
        "{head} m\nspec:\n  server: https://a:1\n  caData: |\nCA  credentials:\n    clientCertData: '-----BEGIN CERTIFICATE-----'\n"
    ));
    assert!(e.contains("needs its key"), "{e}");
    let dup = format!("{head} m\nspec:\n  server: https://a:1\n  caData: |\nCA");
    let e = error_for(&format!("{dup}---\n{dup}"));
    assert!(e.contains("defined twice"), "{e}");
    let e = error_for("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n");
    assert!(e.contains("is not \"fleetgate.io/v1alpha1\""), "{e}");
    let e = error_for("kind: [broken");
    assert!(e.contains("c.yaml: document 0"), "{e}");
}

#[test]
fn exactly_one_gateway() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "empty.yaml", "---\n");
    let e = load_path(dir.path()).unwrap_err();
    assert!(
        matches!(e, ConfigError::Set(ref m) if m.contains("no Gateway")),
        "{e}"
    );
    let e = load_path(&dir.path().join("missing.yaml")).unwrap_err();
    assert!(e.to_string().contains("missing.yaml: cannot read"), "{e}");
}

#[test]
fn secrets_never_reach_debug_output() {
    let (dir, pki) = gateway_dir();
    let member1 = cluster_yaml("member1", "https://127.0.0.1:6443", &pki, "");
    put(dir.path(), "c.yaml", member1);
    let config = load_path(dir.path()).unwrap();
    let table = RouteTable::build(&config).unwrap();
    let shown = format!("{config:?} {table:?}");
    assert!(!shown.contains("tok-member1"), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

#[test]
fn fleet_resources_and_karmada_resource_registries_resolve_against_the_clusters() {
    let (dir, pki) = gateway_dir();
    // member-a and member-b are env=dev; member-c is relabelled prod.
    for name in ["member-a", "member-b", "member-c"] {
        let yaml = cluster_yaml(name, "https://127.0.0.1:6443", &pki, "");
        let yaml = if name == "member-c" {
            yaml.replace("env: dev", "env: prod")
        } else {
            yaml
        };
        put(dir.path(), &format!("{name}.yaml"), yaml);
    }
    put(dir.path(), "fleet.yaml", "apiVersion: fleetgate.io/v1alpha1\nkind: FleetResource\nmetadata:\n  name: dev\nspec:\n  resourceSelectors:\n  - {apiVersion: v1, kind: Pod}\n  - {apiVersion: networking.k8s.io/v1, kind: Ingress}\n  clusters:\n    selector: {matchLabels: {env: dev}}\n---\napiVersion: search.karmada.io/v1alpha1\nkind: ResourceRegistry\nmetadata:\n  name: karmada\nspec:\n  targetCluster:\n    clusterNames: [member-c, member-a]\n    exclude: [member-a]\n  resourceSelectors:\n  - {apiVersion: v1, kind: Pod}\n  - {apiVersion: apps/v1, kind: Deployment}\n  backendStore: {openSearch: {addresses: [\"http://x\"]}}\n");
    let table = table_in(dir.path());
    let fleet = table.fleet();
    let pods = fleet.kind("", "pods").unwrap();
    // The union of both objects' clusters; member-a excluded only by the registry.
    assert_eq!(pods.clusters, ["member-a", "member-b", "member-c"]);
    assert_eq!(pods.kind, "Pod");
    let ingresses = fleet.kind("networking.k8s.io", "ingresses").unwrap();
    assert_eq!(ingresses.clusters, ["member-a", "member-b"]);
    assert_eq!(ingresses.group_version(), "networking.k8s.io/v1");
    assert_eq!(
        fleet.kind("apps", "deployments").unwrap().clusters,
        ["member-c"]
    );
    assert!(fleet.kind("", "secrets").is_none());

    // Mistakes are named: a kind in two versions, a bad apiVersion, a registry namespace.
    for (bad, field) in [
        (
            "apiVersion: fleetgate.io/v1alpha1\nkind: FleetResource\nmetadata:\n  name: twice\nspec:\n  resourceSelectors:\n  - {apiVersion: v1, kind: Pod}\n  - {apiVersion: v2, kind: Pod}\n",
            "one version per kind",
        ),
        (
            "apiVersion: fleetgate.io/v1alpha1\nkind: FleetResource\nmetadata:\n  name: bad\nspec:\n  resourceSelectors:\n  - {apiVersion: \"a/b/c\", kind: Pod}\n",
            "spec.resourceSelectors[].apiVersion",
        ),
        (
            "apiVersion: search.karmada.io/v1alpha1\nkind: ResourceRegistry\nmetadata:\n  name: ns\nspec:\n  resourceSelectors:\n  - {apiVersion: v1, kind: Pod, namespace: default}\n",
            "spec.resourceSelectors[].namespace",
        ),
        (
            "apiVersion: fleetgate.io/v1alpha1\nkind: FleetResource\nmetadata:\n  name: empty\nspec:\n  resourceSelectors: []\n",
            "at least one",
        ),
    ] {
        put(dir.path(), "fleet.yaml", bad);
        let err = load_path(dir.path())
            .and_then(|c| RouteTable::build(&c).map(|_| ()))
            .expect_err(bad)
            .to_string();
        assert!(err.contains(field), "{err}");
    }
}

/// `spec.sharedWatches` resolved, or the mistake named by field (a reload keeps the last good
/// table when this fails: see reload.rs).
fn shared_watches(
    block: &str,
) -> Result<Option<fleetgate_config_watcher::SharedWatchSettings>, String> {
    let (dir, _) = gateway_dir();
    let path = dir.path().join("gateway.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}{block}")).unwrap();
    load_path(dir.path())
        .map(|c| c.gateway.shared_watches)
        .map_err(|e| e.to_string())
}

/// `spec.cache` resolved (with the shared watches it implies), or the mistake named by field.
fn cache(
    block: &str,
) -> Result<
    (
        Option<fleetgate_config_watcher::CacheSettings>,
        Option<fleetgate_config_watcher::SharedWatchSettings>,
    ),
    String,
> {
    let (dir, _) = gateway_dir();
    let path = dir.path().join("gateway.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}{block}")).unwrap();
    load_path(dir.path())
        .map(|c| (c.gateway.cache, c.gateway.shared_watches))
        .map_err(|e| e.to_string())
}

#[test]
fn the_cache_is_off_by_default_shares_what_it_caches_and_refuses_bad_values() {
    assert_eq!(cache(""), Ok((None, None)));
    let (on, shared) = cache(
        "  cache:\n    resources:\n    - {version: v1, resource: pods, maxObjects: 10}\n    - {version: v1, resource: namespaces}\n    memoryBudget: 256Mi\n    maxObjectsPerResource: 5000\n",
    )
    .unwrap();
    let on = on.unwrap();
    assert_eq!(on.caches("", "v1", "pods"), Some(10));
    assert_eq!(on.caches("", "v1", "namespaces"), Some(5000));
    assert_eq!(on.caches("", "v1", "configmaps"), None);
    assert_eq!(on.memory_budget, 256 << 20);
    let shared = shared.expect("a cached resource is shared for watches");
    assert!(shared.shares("", "v1", "pods") && shared.shares("", "v1", "namespaces"));
    assert_eq!((shared.ring_size, shared.lag_limit), (4096, 1024));
    // With shared watches of its own: the union, their bounds kept.
    let (on, shared) = cache(
        "  sharedWatches:\n    resources: [{version: v1, resource: configmaps}, {version: v1, resource: pods}]\n    ringSize: 64\n  cache:\n    resources: [{version: v1, resource: pods}]\n",
    )
    .unwrap();
    let (on, shared) = (on.unwrap(), shared.unwrap());
    assert_eq!(on.memory_budget, 1 << 30, "1Gi unless said");
    assert_eq!(on.caches("", "v1", "pods"), Some(1_000_000));
    assert_eq!(shared.resources.len(), 2, "pods once");
    assert_eq!(shared.ring_size, 64);
    for (block, named) in [
        ("  cache:\n    resources: []\n", "spec.cache.resources"),
        ("  cache: {}\n", "missing field `resources`"),
        (
            "  cache:\n    resources: [{version: v1, resource: Pods}]\n",
            "spec.cache.resources[].resource",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}, {version: v1, resource: pods}]\n",
            "listed twice",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods, maxObjects: 0}]\n",
            "spec.cache.resources[].maxObjects",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}]\n    maxObjectsPerResource: 0\n",
            "spec.cache.maxObjectsPerResource",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}]\n    memoryBudget: 1Ki\n",
            "spec.cache.memoryBudget",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}]\n    memoryBudget: 2Ei\n",
            "spec.cache.memoryBudget",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}]\n    memoryBudget: 1.5Gi\n",
            "spec.cache.memoryBudget",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods}]\n    memoryBudget: 99999999999999999999999Gi\n",
            "spec.cache.memoryBudget",
        ),
        (
            "  cache:\n    resources: [{version: v1, resource: pods, ttl: 5}]\n",
            "unknown field `ttl`",
        ),
    ] {
        let e = cache(block).expect_err(block);
        assert!(e.contains(named), "{block}: {e}");
    }
}

#[test]
fn shared_watches_are_off_by_default_and_checked_when_on() {
    assert_eq!(shared_watches(""), Ok(None));
    let on = shared_watches(
        "  sharedWatches:\n    resources:\n    - {version: v1, resource: configmaps}\n    - {group: apps, version: v1, resource: deployments}\n",
    )
    .unwrap()
    .unwrap();
    assert!(on.shares("", "v1", "configmaps"));
    assert!(on.shares("apps", "v1", "deployments"));
    assert!(!on.shares("", "v1", "pods"));
    assert_eq!((on.ring_size, on.lag_limit), (4096, 1024));
    let sized = shared_watches(
        "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    ringSize: 100\n    lagLimit: 100\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!((sized.ring_size, sized.lag_limit), (100, 100));
    assert_eq!(
        sized.scope,
        SharedWatchScope::Shard,
        "per shard unless asked"
    );
    let per_gateway = shared_watches(
        "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    scope: Gateway\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(per_gateway.scope, SharedWatchScope::Gateway);
    for (block, named) in [
        ("  sharedWatches:\n    resources: []\n", "spec.sharedWatches.resources"),
        ("  sharedWatches: {}\n", "missing field `resources`"),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: Pods}]\n",
            "spec.sharedWatches.resources[].resource",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: \"pods/log\"}]\n",
            "spec.sharedWatches.resources[].resource",
        ),
        (
            "  sharedWatches:\n    resources: [{version: '', resource: pods}]\n",
            "spec.sharedWatches.resources[].version",
        ),
        (
            "  sharedWatches:\n    resources: [{group: 'a..b', version: v1, resource: pods}]\n",
            "spec.sharedWatches.resources[].group",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}, {version: v1, resource: pods}]\n",
            "listed twice",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    ringSize: 8\n",
            "spec.sharedWatches.ringSize",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    ringSize: 100\n    lagLimit: 101\n",
            "spec.sharedWatches.lagLimit",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    lagLimit: 0\n",
            "spec.sharedWatches.lagLimit",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    ringSize: -1\n",
            "gateway.yaml",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods, verbs: [watch]}]\n",
            "unknown field `verbs`",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    scope: Cluster\n",
            "unknown variant `Cluster`",
        ),
        (
            "  sharedWatches:\n    resources: [{version: v1, resource: pods}]\n    scope: gateway\n",
            "unknown variant `gateway`",
        ),
    ] {
        let e = shared_watches(block).expect_err(block);
        assert!(e.contains(named), "{block}: {e}");
    }
}

/// `spec.circuitBreaker` resolved, or the mistake named by field (a reload keeps the last good
/// table when this fails, as for any invalid Gateway).
fn circuit_breaker(
    block: &str,
) -> Result<fleetgate_config_watcher::CircuitBreakerSettings, String> {
    let (dir, _) = gateway_dir();
    let path = dir.path().join("gateway.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}{block}")).unwrap();
    load_path(dir.path())
        .map(|c| c.gateway.circuit_breaker)
        .map_err(|e| e.to_string())
}

#[test]
fn circuit_breakers_are_on_by_default_and_hostile_values_are_named() {
    use std::time::Duration;
    let defaults = circuit_breaker("").unwrap();
    assert_eq!(
        (
            defaults.consecutive_failures,
            defaults.open,
            defaults.max_open
        ),
        (5, Duration::from_secs(1), Duration::from_secs(60))
    );
    let set = circuit_breaker(
        "  circuitBreaker:\n    consecutiveFailures: 3\n    openSeconds: 0.5\n    maxOpenSeconds: 10\n",
    )
    .unwrap();
    assert_eq!(
        (set.consecutive_failures, set.open, set.max_open),
        (3, Duration::from_millis(500), Duration::from_secs(10))
    );
    let off = circuit_breaker("  circuitBreaker:\n    consecutiveFailures: 0\n").unwrap();
    assert_eq!(off.consecutive_failures, 0, "0 turns the breakers off");
    // A first period longer than the default cap raises the cap with it.
    let long = circuit_breaker("  circuitBreaker:\n    openSeconds: 120\n").unwrap();
    assert_eq!(long.max_open, Duration::from_secs(120));
    for (block, named) in [
        (
            "  circuitBreaker:\n    openSeconds: 0\n",
            "spec.circuitBreaker.openSeconds",
        ),
        (
            "  circuitBreaker:\n    openSeconds: -5\n",
            "spec.circuitBreaker.openSeconds",
        ),
        (
            "  circuitBreaker:\n    openSeconds: .nan\n",
            "spec.circuitBreaker.openSeconds",
        ),
        (
            "  circuitBreaker:\n    openSeconds: .inf\n",
            "spec.circuitBreaker.openSeconds",
        ),
        (
            "  circuitBreaker:\n    maxOpenSeconds: 1e300\n",
            "spec.circuitBreaker.maxOpenSeconds",
        ),
        (
            "  circuitBreaker:\n    openSeconds: 30\n    maxOpenSeconds: 10\n",
            "shorter than openSeconds",
        ),
        (
            "  circuitBreaker:\n    consecutiveFailures: 4000000000\n",
            "spec.circuitBreaker.consecutiveFailures",
        ),
        (
            "  circuitBreaker:\n    consecutiveFailures: -1\n",
            "gateway.yaml",
        ),
        (
            "  circuitBreaker:\n    consecutiveFailures: 99999999999\n",
            "gateway.yaml",
        ),
        (
            "  circuitBreaker:\n    failures: 3\n",
            "unknown field `failures`",
        ),
        ("  circuitBreaker: 5\n", "gateway.yaml"),
    ] {
        let e = circuit_breaker(block).expect_err(block);
        assert!(e.contains(named), "{block}: {e}");
    }
}

#[test]
fn the_first_table_leaves_out_invalid_objects_but_needs_a_valid_gateway() {
    use fleetgate_config_watcher::{first_table, load_objects, ReloadStatus};
    let (dir, pki) = gateway_dir();
    let policy = |name: &str, verbs: &str| {
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: AccessPolicy\nmetadata:\n  name: {name}\nspec:\n  subjects: [{{kind: Group, name: devs}}]\n  clusters: {{names: [good, bad-server]}}\n  rules: [{{verbs: {verbs}}}]\n"
        )
    };
    std::fs::write(
        dir.path().join("c.yaml"),
        [
            cluster_yaml("good", "https://127.0.0.1:1", &pki, ""),
            // Invalid as read.
            cluster_yaml("bad-server", "ftp://127.0.0.1:1", &pki, ""),
            // Invalid once its CA is parsed, when the table is built.
            cluster_yaml("bad-ca", "https://127.0.0.1:1", &pki, "").replace(
                &indent(&pki.ca_pem),
                "    -----BEGIN CERTIFICATE-----\n    bm90IGEgY2VydGlmaWNhdGU=\n    -----END CERTIFICATE-----\n",
            ),
            // Names an invalid cluster among others: it is served, granting on the others.
            policy("reads", "[get, list]"),
            policy("flies", "[get, fly]"),
        ]
        .join("---\n"),
    )
    .unwrap();
    let status = ReloadStatus::new();
    let table = first_table(load_objects(dir.path()), &status).unwrap();
    let mut clusters: Vec<String> = table.clusters().map(|c| c.name.to_string()).collect();
    clusters.sort();
    assert_eq!(clusters, ["good"]);
    let policies: Vec<&str> = table
        .config()
        .policies
        .iter()
        .map(|p| p.metadata.name.as_str())
        .collect();
    assert_eq!(policies, ["reads"]);
    let mut rejected: Vec<(String, String, bool)> = status
        .rejected_objects()
        .into_iter()
        .map(|r| (r.object.kind, r.object.name, r.kept))
        .collect();
    rejected.sort();
    assert_eq!(
        rejected,
        [
            ("AccessPolicy".into(), "flies".into(), false),
            ("Cluster".into(), "bad-ca".into(), false),
            ("Cluster".into(), "bad-server".into(), false),
        ]
    );
    let failure = status.last_error().unwrap().message;
    assert!(
        failure.contains("unknown verb \"fly\"")
            && failure.contains("Cluster bad-server: spec.server")
            && failure.contains("Cluster bad-ca: spec.caData/caFile"),
        "{failure}"
    );
    // The first table is no reload: nothing counts as a failed one.
    assert_eq!(status.failed(), 0);
    // All or nothing for those who check a configuration rather than serve it.
    assert!(load_path(dir.path()).is_err());

    // Without a valid Gateway there is nothing to serve: listeners cannot be guessed.
    let gateway = std::fs::read_to_string(dir.path().join("gateway.yaml")).unwrap();
    let no_listeners = gateway.replace(
        "  listeners:\n  - address: 127.0.0.1:0\n",
        "  listeners: []\n",
    );
    put(dir.path(), "gateway.yaml", no_listeners);
    let e = first_table(load_objects(dir.path()), &ReloadStatus::new())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("Gateway gw: spec.listeners: at least one listener is required"),
        "{e}"
    );
}
