//! A policy that does not compile is named with the file that holds it, as a bad Cluster is:
//! an operator with a directory of policy files is sent to the right one.

use fleetgate_config_watcher::{load_path, RouteTable};

#[test]
fn a_policy_error_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &rcgen::Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(
        dir.path().join("gateway.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners: [{address: 127.0.0.1:0}]\n  tls: {certFile: tls.crt, keyFile: tls.key, clientCAFile: ca.crt}\n",
    )
    .unwrap();
    let policy = |name: &str, verb: &str| {
        format!("apiVersion: fleetgate.io/v1alpha1\nkind: AccessPolicy\nmetadata: {{name: {name}}}\nspec:\n  subjects: [{{kind: Group, name: devs}}]\n  clusters: {{names: [\"*\"]}}\n  rules: [{{verbs: [{verb}]}}]\n")
    };
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/good.yaml"), policy("good", "get")).unwrap();
    std::fs::write(
        dir.path().join("policies/team-b.yaml"),
        policy("team-b", "gett"),
    )
    .unwrap();
    let error = match load_path(dir.path()).and_then(|c| RouteTable::build(&c)) {
        Ok(_) => panic!("a policy with an unknown verb was accepted"),
        Err(e) => e.to_string(),
    };
    let file = dir.path().join("policies/team-b.yaml");
    assert!(
        error.starts_with(&format!(
            "{}: AccessPolicy team-b: spec.rules",
            file.display()
        )),
        "{error}"
    );
    assert!(error.contains("unknown verb \"gett\""), "{error}");
}
