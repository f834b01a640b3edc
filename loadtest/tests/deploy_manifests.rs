//! `deploy/` as an operator uses it: every kustomization renders with `kubectl kustomize`, and the
//! result applies with `kubectl apply` to a simulated member standing in for the management
//! cluster (and for a member, for the agent). Once the CRDs are in, the fleetgate.io objects of
//! the example overlay (and the Gateway of the base's ConfigMap) are checked against the CRD
//! schemas as kube-apiserver checks them: defaults filled, unknown fields refused by kubectl's
//! strict validation (pruned without it), a wrong type refused with a 422.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::{assert_stderr_has, kubectl_stdin, ok_stdout, stderr, TestFleet, KUBECTL};

/// The kustomizations under deploy/ that build on their own (deploy/tunnel is a Component, built
/// through the example overlay).
const KUSTOMIZATIONS: &[&str] = &[
    "base",
    "agent",
    "overlays/example",
    "overlays/example/fleet",
];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `kubectl kustomize deploy/DIR`.
fn render(dir: &str) -> String {
    let output: Output = Command::new(KUBECTL)
        .arg("kustomize")
        .arg(deploy_dir().join(dir))
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/{dir} failed: {}",
        stderr(&output)
    );
    String::from_utf8(output.stdout).expect("utf-8 manifests")
}

fn documents(yaml: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| serde_json::Value::deserialize(doc).expect("a YAML document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

#[test]
fn every_kustomization_renders() {
    for dir in KUSTOMIZATIONS {
        let docs = documents(&render(dir));
        assert!(!docs.is_empty(), "deploy/{dir} renders nothing");
    }
    // The example overlay: the image set, pull mode on, replicas, probes, PDB, Service.
    let docs = documents(&render("overlays/example"));
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the example overlay"))
            .clone()
    };
    let deployment = find("Deployment", "fleetgate");
    let spec = &deployment["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        container["image"],
        "registry.example.com/platform/fleetgate:0.1.0"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args[0], "serve");
    for flag in [
        "--config=",
        "--management-kubeconfig=",
        "--tunnel-listen=",
        "--agent-ca=",
    ] {
        assert!(args.iter().any(|a| a.starts_with(flag)), "{flag}: {args:?}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert!(spec["affinity"]["podAntiAffinity"].is_object());
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert_eq!(find("Service", "fleetgate")["spec"]["type"], "LoadBalancer");
    assert_eq!(
        find("PodDisruptionBudget", "fleetgate")["spec"]["maxUnavailable"],
        1
    );
    // The admin listener the probes reach is the one the Gateway file configures.
    let config = find("ConfigMap", "fleetgate-config");
    let gateway = config["data"]["gateway.yaml"].as_str().unwrap();
    assert!(gateway.contains("address: 0.0.0.0:9090"), "{gateway}");
}

#[test]
fn the_example_install_applies_to_a_simulated_management_cluster() {
    let fleet = TestFleet::start(1);
    let install = render("overlays/example");
    let out = fleet.apply(&install);
    for created in [
        "namespace/fleetgate created",
        "customresourcedefinition.apiextensions.k8s.io/clusters.fleetgate.io created",
        "serviceaccount/fleetgate created",
        "clusterrole.rbac.authorization.k8s.io/fleetgate created",
        "clusterrolebinding.rbac.authorization.k8s.io/fleetgate created",
        "role.rbac.authorization.k8s.io/fleetgate-secrets created",
        "rolebinding.rbac.authorization.k8s.io/fleetgate-secrets created",
        "configmap/fleetgate-config created",
        "service/fleetgate created",
        "service/fleetgate-tunnel created",
        "deployment.apps/fleetgate created",
        "poddisruptionbudget.policy/fleetgate created",
    ] {
        assert!(out.contains(created), "{created} not in:\n{out}");
    }
    // Applying again changes nothing (the patches kubectl computes are empty).
    let again = fleet.apply(&install);
    assert!(
        again.contains("deployment.apps/fleetgate unchanged"),
        "{again}"
    );
    fleet.wait_established(&[
        "clusters.fleetgate.io",
        "accesspolicies.fleetgate.io",
        "gateways.fleetgate.io",
        "fleetresources.fleetgate.io",
    ]);
    let replicas = ok_stdout(&fleet.kubectl(&[
        "get",
        "deployment",
        "fleetgate",
        "-n",
        "fleetgate",
        "-o",
        "jsonpath={.spec.replicas}",
    ]));
    assert_eq!(replicas, "3");
    let verbs = ok_stdout(&fleet.kubectl(&[
        "get",
        "role",
        "fleetgate-secrets",
        "-n",
        "fleetgate",
        "-o",
        "jsonpath={.rules[0].verbs}",
    ]));
    assert_eq!(verbs, r#"["get","list","watch"]"#);

    // The fleet: Clusters and AccessPolicies, checked against the CRDs just applied.
    let out = fleet.apply(&render("overlays/example/fleet"));
    for created in [
        "cluster.fleetgate.io/member1 created",
        "cluster.fleetgate.io/edge1 created",
        "accesspolicy.fleetgate.io/platform-admins created",
        "accesspolicy.fleetgate.io/devs-read-dev created",
    ] {
        assert!(out.contains(created), "{created} not in:\n{out}");
    }
    // The schema's defaults were filled in, as kube-apiserver does.
    let defaults = ok_stdout(&fleet.kubectl(&[
        "get",
        "clusters.fleetgate.io",
        "member1",
        "-o",
        "jsonpath={.spec.authMode} {.spec.connectMode} {.spec.impersonation}",
    ]));
    assert_eq!(defaults, "Impersonate Direct true");

    // The Gateway the pods read from the ConfigMap is a valid Gateway object too.
    let docs = documents(&install);
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "fleetgate-config")
        .expect("the gateway's ConfigMap");
    let out = fleet.apply(config["data"]["gateway.yaml"].as_str().unwrap());
    assert!(
        out.contains("gateway.fleetgate.io/fleetgate created"),
        "{out}"
    );

    // The agent applies to a member.
    let out = fleet.apply(&render("agent"));
    assert!(
        out.contains("deployment.apps/fleetgate-agent created"),
        "{out}"
    );
}

const WRONG_TYPE: &str = "apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata:
  name: broken
spec:
  server: https://10.0.0.9:6443
  impersonation: \"yes\"
  connectMode: Push
";

const UNKNOWN_FIELD: &str = "apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata:
  name: old-style
spec:
  server: https://10.0.0.9:6443
  mode: Tunnel
";

#[test]
fn custom_resources_that_break_their_crd_schema_are_refused() {
    let fleet = TestFleet::start(1);
    // Before the CRDs exist the sim's built-in fleetgate.io kinds take anything.
    fleet.apply(&render("base"));

    let refused = kubectl_stdin(&fleet, &["apply", "-f", "-"], WRONG_TYPE);
    assert!(!refused.status.success(), "a wrong type was accepted");
    let message = stderr(&refused);
    assert!(
        // kubectl prints a 422's causes one per line, as it does for kube-apiserver's.
        message.contains(r#"The Cluster "broken" is invalid"#)
            && message.contains(r#"spec.impersonation: Invalid value: "string": spec.impersonation in body must be of type boolean: "string""#)
            && message.contains(r#"spec.connectMode: Unsupported value: "Push": supported values: "Direct", "Tunnel""#),
        "{message}"
    );
    let absent = fleet.kubectl(&["get", "clusters.fleetgate.io", "broken"]);
    assert!(!absent.status.success(), "the refused Cluster was stored");

    // The status is the apiserver's 422 Invalid, with one cause per field.
    let body = serde_json::to_vec(&documents(WRONG_TYPE)[0]).unwrap();
    let request = http::Request::post("/apis/fleetgate.io/v1alpha1/clusters")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {}", fleet.token("admin")))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let addr = fleet.handle().member_addrs()[0];
    let (head, body) =
        fleet
            .runtime
            .block_on(common::raw::request(addr, &fleet.fleet_ca_pem(), request));
    assert_eq!(head.status, 422);
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["group"], "fleetgate.io");
    let fields: Vec<&str> = status["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert_eq!(
        fields,
        ["spec.connectMode", "spec.impersonation"],
        "{status}"
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"Cluster.fleetgate.io "broken" is invalid: ["#),
        "{status}"
    );

    // kubectl validates strictly by default: an unknown field is refused...
    let strict = kubectl_stdin(&fleet, &["apply", "-f", "-"], UNKNOWN_FIELD);
    assert!(!strict.status.success(), "an unknown field was accepted");
    assert_stderr_has(&strict, r#"unknown field "spec.mode""#);
    // ...and pruned when validation is off, as a structural schema prunes it.
    ok_stdout(&kubectl_stdin(
        &fleet,
        &["apply", "--validate=false", "-f", "-"],
        UNKNOWN_FIELD,
    ));
    let spec = ok_stdout(&fleet.kubectl(&[
        "get",
        "clusters.fleetgate.io",
        "old-style",
        "-o",
        "jsonpath={.spec}",
    ]));
    assert!(!spec.contains("mode\":\"Tunnel"), "{spec}");
    assert!(spec.contains("\"connectMode\":\"Direct\""), "{spec}");
}
