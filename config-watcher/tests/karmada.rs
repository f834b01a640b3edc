//! Karmada `cluster.karmada.io/v1alpha1` Cluster objects and `v1` Secrets, written to files as a
//! Karmada control plane holds them (`kubectl get cluster,secret -o yaml`), translated into
//! fleetgate clusters: every translated field checked, and every mistake named precisely.

use std::path::Path;

use base64::Engine;
use fleetgate_config_watcher::{load_path, ConfigError, RouteTable};

const GATEWAY: &str = "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  listeners:\n  - address: 127.0.0.1:0\n    tls: false\n";

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// A Karmada Cluster as `karmadactl join` leaves it, with the fields fleetgate ignores.
fn karmada_cluster(name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: cluster.karmada.io/v1alpha1
kind: Cluster
metadata:
  name: {name}
  labels:
    region: eu
  finalizers:
  - karmada.io/cluster-controller
  resourceVersion: \"1234\"
spec:
  id: 6f0b1c2e-0000-4000-8000-000000000001
  syncMode: Push
  apiEndpoint: https://10.0.0.7:6443
  provider: kind
  region: eu-west
  zones: [a, b]
  taints: []
  resourceModels:
  - grade: 0
    ranges:
    - name: cpu
      min: \"0\"
      max: \"1\"
{spec_extra}status:
  kubernetesVersion: v1.31.0
  conditions:
  - type: Ready
    status: \"True\"
"
    )
}

fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\ntype: Opaque\ndata:\n"
    );
    for (k, v) in data {
        s.push_str(&format!("  {k}: {}\n", b64(v)));
    }
    s
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

fn load(files: &[(&str, String)]) -> Result<fleetgate_config_watcher::Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gateway.yaml", GATEWAY);
    for (name, text) in files {
        write(dir.path(), name, text);
    }
    load_path(dir.path())
}

const REFS: &str = "  secretRef:
    namespace: karmada-cluster
    name: member1
  impersonatorSecretRef:
    namespace: karmada-cluster
    name: member1-impersonator
";

#[test]
fn a_karmada_cluster_becomes_a_fleetgate_cluster() {
    let ca = ca_pem();
    let config = load(&[
        (
            "clusters.yaml",
            karmada_cluster(
                "member1",
                &format!(
                    "{REFS}  proxyURL: http://egress.example:3128\n  proxyHeader:\n    Proxy-Authorization: Basic Zm9vOmJhcg==\n"
                ),
            ),
        ),
        // Secrets in another file, as `kubectl get secret -o yaml` writes them.
        (
            "secrets.yaml",
            format!(
                "{}---\n{}",
                secret(
                    "karmada-cluster",
                    "member1",
                    &[("token", "cluster-token"), ("caBundle", &ca)]
                ),
                secret(
                    "karmada-cluster",
                    "member1-impersonator",
                    &[("token", "impersonator-token")]
                )
            ),
        ),
    ])
    .unwrap();
    let c = &config.clusters[0];
    assert_eq!(c.name, "member1");
    assert_eq!(c.server, "https://10.0.0.7:6443");
    assert_eq!(c.labels["region"], "eu");
    assert_eq!(c.ca_pem.as_deref(), Some(ca.as_bytes()));
    // The impersonator token is the credential, and impersonation is on.
    assert_eq!(c.token.as_deref(), Some("impersonator-token"));
    assert!(c.impersonation);
    assert!(!c.insecure_skip_tls_verify);
    assert_eq!(c.proxy_url.as_deref(), Some("http://egress.example:3128"));
    assert_eq!(c.proxy_headers["Proxy-Authorization"], "Basic Zm9vOmJhcg==");
    assert!(c.origin.ends_with("clusters.yaml"), "{}", c.origin);

    let table = RouteTable::build(&config).unwrap();
    let route = table.cluster("member1").unwrap();
    assert_eq!(route.upstream.authority, "10.0.0.7:6443");
    assert!(route.tls_client.is_some());
    assert_eq!(
        route.authorization.as_deref(),
        Some("Bearer impersonator-token")
    );
}

#[test]
fn without_an_impersonator_secret_the_cluster_secret_token_is_used() {
    let ca = ca_pem();
    let config = load(&[(
        "all.yaml",
        format!(
            "{}---\n{}",
            karmada_cluster(
                "member2",
                "  secretRef:\n    namespace: karmada-cluster\n    name: member2\n"
            ),
            secret(
                "karmada-cluster",
                "member2",
                &[("token", "cluster-token\n"), ("caBundle", &ca)]
            )
        ),
    )])
    .unwrap();
    assert_eq!(config.clusters[0].token.as_deref(), Some("cluster-token"));
}

#[test]
fn insecure_skip_tls_verification_needs_no_ca_bundle() {
    let config = load(&[(
        "all.yaml",
        format!(
            "{}---\n{}",
            karmada_cluster(
                "member3",
                "  insecureSkipTLSVerification: true\n  secretRef:\n    namespace: karmada-cluster\n    name: member3\n"
            ),
            // stringData, as a hand-written Secret often has it.
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: member3\n  namespace: karmada-cluster\nstringData:\n  token: plain-token\n"
        ),
    )])
    .unwrap();
    let c = &config.clusters[0];
    assert!(c.insecure_skip_tls_verify);
    assert_eq!(c.ca_pem, None);
    assert_eq!(c.token.as_deref(), Some("plain-token"));
    RouteTable::build(&config).unwrap();
}

fn invalid(result: Result<fleetgate_config_watcher::Config, ConfigError>) -> (String, String) {
    match result {
        Err(ConfigError::Invalid {
            kind,
            name,
            field,
            message,
            ..
        }) => (format!("{kind} {name} {field}"), message),
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

#[test]
fn mistakes_name_the_karmada_object_and_field() {
    let ca = ca_pem();
    // The referenced Secret does not exist.
    let (at, message) = invalid(load(&[("c.yaml", karmada_cluster("member1", REFS))]));
    assert_eq!(at, "Cluster.cluster.karmada.io member1 spec.secretRef");
    assert!(
        message.contains("Secret karmada-cluster/member1 not found"),
        "{message}"
    );

    // The impersonator Secret has no token.
    let (at, message) = invalid(load(&[(
        "c.yaml",
        format!(
            "{}---\n{}---\n{}",
            karmada_cluster("member1", REFS),
            secret("karmada-cluster", "member1", &[("caBundle", &ca)]),
            secret("karmada-cluster", "member1-impersonator", &[("other", "x")])
        ),
    )]));
    assert_eq!(
        at,
        "Cluster.cluster.karmada.io member1 spec.impersonatorSecretRef"
    );
    assert!(message.contains("has no token"), "{message}");

    // https without a caBundle and without insecureSkipTLSVerification.
    let (at, message) = invalid(load(&[(
        "c.yaml",
        format!(
            "{}---\n{}",
            karmada_cluster(
                "member1",
                "  secretRef:\n    namespace: karmada-cluster\n    name: member1\n"
            ),
            secret("karmada-cluster", "member1", &[("token", "t")])
        ),
    )]));
    assert_eq!(at, "Cluster.cluster.karmada.io member1 spec.secretRef");
    assert!(message.contains("caBundle"), "{message}");

    // No apiEndpoint.
    let no_endpoint =
        karmada_cluster("member1", "").replace("  apiEndpoint: https://10.0.0.7:6443\n", "");
    let (at, _) = invalid(load(&[("c.yaml", no_endpoint)]));
    assert_eq!(at, "Cluster.cluster.karmada.io member1 spec.apiEndpoint");

    // A proxy URL that is not one.
    let (at, _) = invalid(load(&[(
        "c.yaml",
        karmada_cluster(
            "member1",
            "  insecureSkipTLSVerification: true\n  proxyURL: ftp://proxy\n",
        ),
    )]));
    assert_eq!(at, "Cluster.cluster.karmada.io member1 spec.proxyURL");

    // A socks5 or https proxy: refused at validation, saying why (only HTTP CONNECT is carried).
    for url in ["socks5://proxy:1080", "https://proxy:3128"] {
        let (at, message) = invalid(load(&[(
            "c.yaml",
            karmada_cluster(
                "member1",
                &format!("  insecureSkipTLSVerification: true\n  proxyURL: {url}\n"),
            ),
        )]));
        assert_eq!(at, "Cluster.cluster.karmada.io member1 spec.proxyURL");
        assert!(message.contains("only http:// egress proxies"), "{message}");
    }

    // Secret data that is not base64.
    let (at, message) = invalid(load(&[(
        "s.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: n\ndata:\n  token: '%%%'\n"
            .to_owned(),
    )]));
    assert_eq!(at, "Secret s data");
    assert!(message.contains("\"token\""), "{message}");

    // A cluster name that is not a DNS-1123 label.
    let (at, _) = invalid(load(&[(
        "c.yaml",
        karmada_cluster("Member_1", "  insecureSkipTLSVerification: true\n"),
    )]));
    assert_eq!(at, "Cluster.cluster.karmada.io Member_1 metadata.name");
}

#[test]
fn a_karmada_and_a_fleetgate_cluster_of_one_name_clash() {
    let fleetgate = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member1\nspec:\n  server: http://127.0.0.1:1\n";
    let result = load(&[
        ("a.yaml", fleetgate.to_owned()),
        (
            "b.yaml",
            karmada_cluster("member1", "  insecureSkipTLSVerification: true\n"),
        ),
    ]);
    match result {
        Err(ConfigError::Set(m)) => assert!(m.contains("member1") && m.contains("twice"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_api_versions_are_refused_by_name() {
    let err = load(&[(
        "x.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n".to_owned(),
    )])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("x.yaml") && err.contains("Deployment") && err.contains("\"apps/v1\""),
        "{err}"
    );
}
