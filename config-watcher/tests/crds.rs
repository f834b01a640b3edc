//! `deploy/base/crds.yaml` is generated from the Rust types; this fails when it is out of date, and
//! checks that the manifests are CustomResourceDefinitions the API server would take for the
//! objects fleetgate reads (same group, kinds, cluster scope, a status subresource). And
//! `deploy/base/rbac.yaml` grants what the Kubernetes API source asks of the management cluster.

use fleetgate_config_watcher::crd_manifests;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;

const REGENERATE: &str =
    "cargo run -p fleetgate-config-watcher --example crds > deploy/base/crds.yaml";

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/base/crds.yaml");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}; run `{REGENERATE}`"))
}

#[test]
fn deploy_crds_yaml_is_up_to_date() {
    let generated = crd_manifests();
    let committed = committed();
    if generated != committed {
        let first_difference = generated
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .map_or("(one is a prefix of the other)".to_owned(), |i| {
                format!("line {}", i + 1)
            });
        panic!(
            "deploy/base/crds.yaml is out of date (first difference at {first_difference}); run `{REGENERATE}`"
        );
    }
}

#[test]
fn the_manifests_are_the_crds_of_the_objects_fleetgate_reads() {
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&committed()) {
        let crd = CustomResourceDefinition::deserialize(document).unwrap();
        assert_eq!(crd.spec.group, "fleetgate.io");
        assert_eq!(crd.spec.scope, "Cluster");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        assert!(version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some()));
        let schema = version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap();
        assert!(schema.properties.as_ref().unwrap().contains_key("spec"));
        kinds.push(crd.spec.names.kind.clone());
    }
    assert_eq!(
        kinds,
        ["Cluster", "Gateway", "AccessPolicy", "FleetResource"]
    );
}

#[test]
fn a_cluster_object_as_documented_is_an_instance_of_the_crd_type() {
    // The same YAML the file loader takes parses as the CRD's Rust type.
    let yaml = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member1\n  labels:\n    env: dev\nspec:\n  server: https://10.0.0.1:6443\n  insecureSkipTLSVerify: true\n  credentials:\n    token: abc\n  impersonation: true\n  connectMode: Tunnel\n  proxyURL: http://proxy:3128\n";
    let cluster: fleetgate_config_watcher::objects::Cluster = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(cluster.spec.server, "https://10.0.0.1:6443");
    assert_eq!(
        cluster.spec.connect_mode,
        fleetgate_config_watcher::ConnectMode::Tunnel
    );
    assert_eq!(cluster.spec.credentials.token.as_deref(), Some("abc"));
    // The field's earlier name still reads the same in a file.
    let earlier: fleetgate_config_watcher::objects::Cluster =
        serde_yaml::from_str(&yaml.replace("connectMode:", "mode:")).unwrap();
    assert_eq!(earlier.spec, cluster.spec);
    // A typo is refused, as the loader refuses it.
    assert!(
        serde_yaml::from_str::<fleetgate_config_watcher::objects::Cluster>(
            &yaml.replace("proxyURL", "proxyUrl")
        )
        .is_err()
    );
}

/// The rules of every ClusterRole (namespace `None`) and Role in `deploy/base/rbac.yaml`.
fn rbac_rules() -> Vec<(Option<String>, k8s_openapi::api::rbac::v1::PolicyRule)> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/base/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut rules = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).unwrap();
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_yaml::from_value(value).unwrap();
                rules.extend(role.rules.into_iter().flatten().map(|r| (None, r)));
            }
            Some("Role") => {
                let role: Role = serde_yaml::from_value(value).unwrap();
                let namespace = role.metadata.namespace.clone();
                assert!(namespace.is_some(), "a Role without a namespace");
                rules.extend(
                    role.rules
                        .into_iter()
                        .flatten()
                        .map(|r| (namespace.clone(), r)),
                );
            }
            _ => {}
        }
    }
    rules
}

#[test]
fn deploy_rbac_yaml_grants_what_the_api_source_asks_for() {
    use fleetgate_config_watcher::{api_source_permissions, KubeSourceOptions};
    let options = KubeSourceOptions {
        fleetgate: true,
        karmada: true,
        // What deploy/base/gateway.yaml passes as `serve --secrets-namespace`.
        secrets_namespace: Some("fleetgate".into()),
        fallback_gateway: None,
    };
    let rules = rbac_rules();
    let asked = api_source_permissions(&options);
    for (group, resource, verbs) in &asked {
        // Secrets are granted in their namespace only, never cluster-wide.
        let namespace = (resource == "secrets").then(|| "fleetgate".to_owned());
        let granted = |verb: &str| {
            rules.iter().any(|(ns, rule)| {
                *ns == namespace
                    && rule.api_groups.iter().flatten().any(|g| g == group)
                    && rule.resources.iter().flatten().any(|r| r == resource)
                    && rule.verbs.iter().any(|v| v == verb)
            })
        };
        for verb in *verbs {
            assert!(
                granted(verb),
                "deploy/base/rbac.yaml does not grant {verb} on {resource} of group {group:?} ({namespace:?})"
            );
        }
    }
    // The fleet view's objects are among them.
    for (group, resource) in [
        ("fleetgate.io", "fleetresources"),
        ("search.karmada.io", "resourceregistries"),
    ] {
        assert!(
            asked.iter().any(|(g, r, _)| g == group && r == resource),
            "{asked:?}"
        );
    }
}
