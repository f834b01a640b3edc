//! One-pass credentials end to end: `fleetgate certs init`, `certs issue` and `fleetgate
//! kubeconfig` against a real `fleetgate serve` in front of the simulated fleet, configured with
//! nothing but the generated CA and serving certificate, the fleet's Cluster objects and two
//! AccessPolicies. The generated kubeconfig must work with kubectl as it is (no flags, no
//! insecure TLS) for every context, and hold exactly the contexts the policies allow.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use support::fleet::Fleet as Setup;
use support::kubectl::{groups_of, kubectl, kubectl_with_cert, ran, succeeded};

const FLEETGATE: &str = env!("CARGO_BIN_EXE_fleetgate");

fn fleetgate(args: &[&str]) -> Output {
    Command::new(FLEETGATE)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn fleetgate_ok(args: &[&str]) -> String {
    let out = fleetgate(args);
    assert!(
        out.status.success(),
        "fleetgate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Policies: group `ops` may do anything on the `env: dev` clusters (member1, member3); user
/// `erin` may read member2 only.
const POLICIES: &str = r#"
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata:
  name: ops-on-dev
spec:
  subjects:
    - kind: Group
      name: ops
  clusters:
    selector:
      matchLabels:
        env: dev
  rules:
    - verbs: ["*"]
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata:
  name: erin-reads-member2
spec:
  subjects:
    - kind: User
      name: erin
  clusters:
    names: ["member2"]
  rules:
    - verbs: ["*"]
"#;

/// Starts three simulated members, writes the certs and a config that uses them, and starts
/// `fleetgate serve` on it. Returns the setup and the gateway's https address.
fn start() -> (Setup, String) {
    let mut setup = Setup::sim_in("fleet", 3, 2);
    let fleet_dir = setup.dir().to_path_buf();

    // certs init: every file reported, keys 0600, nothing secret printed.
    let certs = setup.path("certs");
    let out = fleetgate_ok(&["certs", "init", "--dir", certs.to_str().unwrap()]);
    for file in [
        "ca.crt",
        "ca.key",
        "serving-ca.crt",
        "serving-ca.key",
        "gateway.crt",
        "gateway.key",
    ] {
        assert!(out.contains(file), "init did not report {file}: {out}");
        assert!(certs.join(file).exists(), "{file} missing");
    }
    assert!(!out.contains("PRIVATE KEY"), "init printed a key: {out}");
    for key in ["ca.key", "serving-ca.key", "gateway.key"] {
        assert_eq!(mode(&certs.join(key)), 0o600, "{key}");
    }
    // A second init would replace the CA and orphan every certificate it issued.
    let again = fleetgate(&["certs", "init", "--dir", certs.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--force"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // The gateway's configuration: the generated certificates, the fleet's clusters, policies.
    let conf = setup.path("conf");
    std::fs::create_dir_all(conf.join("clusters")).unwrap();
    for entry in std::fs::read_dir(fleet_dir.join("clusters")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), conf.join("clusters").join(entry.file_name())).unwrap();
    }
    let gateway_yaml = format!(
        r#"apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata:
  name: fleetgate
spec:
  workers: 1
  listeners:
    - name: https
      address: 127.0.0.1:0
  tls:
    certFile: {certs}/gateway.crt
    keyFile: {certs}/gateway.key
    clientCAFile: {certs}/ca.crt
"#,
        certs = certs.display()
    );
    std::fs::write(conf.join("gateway.yaml"), gateway_yaml).unwrap();
    std::fs::write(conf.join("policies.yaml"), POLICIES).unwrap();

    setup.serve_config(&conf, &[], None);
    let https = setup.https().to_string();
    (setup, https)
}

fn kubectl_ok(setup: &Setup, kubeconfig: &Path, context: &str, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, context, args);
    succeeded(
        out,
        &format!("--context {context} {args:?}"),
        &setup.log_tail(20),
    )
}

/// The contexts of a kubeconfig, and its current context.
fn contexts(kubeconfig: &Path) -> (Vec<String>, String) {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    let names = doc["contexts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    (names, doc["current-context"].as_str().unwrap().to_string())
}

/// The arguments of `fleetgate kubeconfig --server SERVER --user USER EXTRA... --certs-dir
/// CERTS --config CONFIG --out OUT`, `extra` being the flags of the case (groups, clusters, ttl).
fn kubeconfig_args<'a>(
    server: &'a str,
    user: &'a str,
    extra: &[&'a str],
    certs: &'a Path,
    config: &'a Path,
    out: &'a Path,
) -> Vec<&'a str> {
    let files = [
        "--certs-dir",
        certs.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    [
        &["kubeconfig", "--server", server, "--user", user][..],
        extra,
        &files,
    ]
    .concat()
}

/// `fleetgate kubeconfig` for user dana with `extra` flags (groups, ttl); what it printed.
fn kubeconfig_of_dana(
    server: &str,
    extra: &[&str],
    certs: &Path,
    config: &Path,
    out: &Path,
) -> String {
    fleetgate_ok(&kubeconfig_args(server, "dana", extra, certs, config, out))
}

/// The arguments of `fleetgate certs issue --dir DIR --user USER EXTRA...`.
fn issue_args<'a>(dir: &'a Path, user: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let dir = dir.to_str().unwrap();
    [&["certs", "issue", "--dir", dir, "--user", user][..], extra].concat()
}

/// kubectl `args` with no kubeconfig, through the gateway at `server`'s member1, trusting
/// `ca` and presenting `USER.crt` / `USER.key` of `dir` (as a user given the files would).
fn kubectl_as(server: &str, ca: &Path, dir: &Path, user: &str, args: &[&str]) -> Output {
    kubectl_with_cert(
        &format!("{server}/clusters/member1"),
        ca,
        &dir.join(format!("{user}.crt")),
        &dir.join(format!("{user}.key")),
    )
    .args(args)
    .output()
    .unwrap()
}

#[test]
fn generated_kubeconfig_reaches_exactly_the_allowed_clusters_with_kubectl() {
    let (setup, https) = start();
    let server = format!("https://{https}");
    let certs = setup.path("certs");
    let conf = setup.path("conf");
    let out_file = setup.path("dana.kubeconfig");
    let printed = kubeconfig_of_dana(
        &server,
        &["--group", "ops", "--group", "devs", "--ttl", "1h"],
        &certs,
        &conf,
        &out_file,
    );
    assert!(!printed.contains("PRIVATE KEY"), "{printed}");
    assert_eq!(mode(&out_file), 0o600);
    let text = std::fs::read_to_string(&out_file).unwrap();
    for field in [
        "client-certificate-data",
        "client-key-data",
        "certificate-authority-data",
    ] {
        assert!(text.contains(field), "kubeconfig lacks {field}:\n{text}");
    }
    // Group ops reaches the env=dev clusters only.
    let (names, current) = contexts(&out_file);
    assert_eq!(names, vec!["member1".to_string(), "member3".to_string()]);
    assert_eq!(current, "member1");

    for context in &names {
        let whoami = kubectl_ok(
            &setup,
            &out_file,
            context,
            &["auth", "whoami", "-o", "json"],
        );
        let review: serde_json::Value = serde_json::from_str(&whoami).unwrap();
        let user = &review["status"]["userInfo"];
        assert_eq!(user["username"], "dana", "{context}: {whoami}");
        let groups = groups_of(user);
        assert!(
            groups.iter().any(|g| g == "ops") && groups.iter().any(|g| g == "devs"),
            "{context}: both O attributes must reach the member: {groups:?}"
        );
        let namespaces = kubectl_ok(&setup, &out_file, context, &["get", "ns", "-o", "name"]);
        assert!(
            namespaces.lines().any(|l| l == "namespace/default"),
            "{context}: {namespaces}"
        );
    }
    // The current context is used when none is given.
    let whoami = "auth whoami -o jsonpath={.status.userInfo.username}";
    let plain = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&out_file)
        .args(whoami.split(' '))
        .output()
        .unwrap();
    let plain = ran(plain, whoami);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "dana");

    // A cluster the user may not reach is refused, by name, and no file is written.
    let refused_file = setup.path("refused.kubeconfig");
    let refused = fleetgate(&kubeconfig_args(
        &server,
        "dana",
        &[
            "--group",
            "ops",
            "--cluster",
            "member1",
            "--cluster",
            "member2",
        ],
        &certs,
        &conf,
        &refused_file,
    ));
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("member2"), "{stderr}");
    assert!(!refused_file.exists());

    // --cluster narrows to what was asked; erin (no groups) gets member2 only.
    let erin_file = setup.path("erin.kubeconfig");
    fleetgate_ok(&kubeconfig_args(
        &server,
        "erin",
        &[],
        &certs,
        &conf,
        &erin_file,
    ));
    let (names, current) = contexts(&erin_file);
    assert_eq!(names, vec!["member2".to_string()]);
    assert_eq!(current, "member2");
    let whoami = kubectl_ok(
        &setup,
        &erin_file,
        "member2",
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert_eq!(whoami, "erin");
}

#[test]
fn issued_certificate_authenticates_with_kubectl_flags() {
    let (setup, https) = start();
    let certs = setup.path("certs");
    let issued = setup.path("issued");
    let out = fleetgate_ok(&issue_args(
        &certs,
        "dana",
        &[
            "--group",
            "ops",
            "--ttl",
            "2h",
            "--out-dir",
            issued.to_str().unwrap(),
        ],
    ));
    assert!(
        out.contains("dana.crt") && out.contains("dana.key"),
        "{out}"
    );
    assert!(!out.contains("PRIVATE KEY"), "{out}");
    assert_eq!(mode(&issued.join("dana.key")), 0o600);
    // Issuing over an existing key needs --force.
    let again = fleetgate(&issue_args(
        &certs,
        "dana",
        &["--out-dir", issued.to_str().unwrap()],
    ));
    assert!(!again.status.success());

    let server = format!("https://{https}");
    let serving_ca = certs.join("serving-ca.crt");
    let whoami = kubectl_as(
        &server,
        &serving_ca,
        &issued,
        "dana",
        &["auth", "whoami", "-o", "json"],
    );
    let whoami = succeeded(whoami, "auth whoami", &setup.log_tail(20));
    let review: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "dana");

    // A certificate from another CA is not accepted by this gateway.
    let other = setup.path("other");
    fleetgate_ok(&[
        "certs",
        "init",
        "--dir",
        other.to_str().unwrap(),
        "--no-serving",
    ]);
    fleetgate_ok(&issue_args(&other, "dana", &["--group", "system:masters"]));
    let forged = kubectl_as(&server, &serving_ca, &other, "dana", &["get", "ns"]);
    assert!(
        !forged.status.success(),
        "a certificate of another CA was accepted"
    );
    // The gateway says why, at info (its default level), naming the peer and nothing secret.
    let log = setup.log();
    let refused = log
        .lines()
        .find(|l| l.contains("client certificate refused"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{}", setup.log_tail(20)));
    assert!(refused.contains("INFO"), "{refused}");
    assert!(refused.contains("peer=127.0.0.1:"), "{refused}");
    assert!(
        refused.contains("not signed by the gateway's client CA"),
        "{refused}"
    );
}

#[test]
fn the_demos_pki_directory_issues_certificates_and_kubeconfigs_as_it_is() {
    // The files `fleetgate demo` writes (the simulated fleet's), served as the demo serves them.
    let mut demo = Setup::sim(2, 0);
    demo.serve(&[], None);
    let server = format!("https://{}", demo.https());
    let pki = demo.fleet_path("pki");
    let pki = pki.to_str().unwrap();
    let config = demo.dir().to_str().unwrap().to_owned();

    // `kubeconfig --certs-dir DIR/pki`: group ops may reach every member (and read there).
    let out_file = demo.path("dana.kubeconfig");
    let printed = kubeconfig_of_dana(
        &server,
        &["--group", "ops"],
        Path::new(pki),
        Path::new(&config),
        &out_file,
    );
    assert!(printed.contains("fleet"), "{printed}");
    let (names, current) = contexts(&out_file);
    assert_eq!(names, ["member1", "member2", "fleet"].map(String::from));
    assert_eq!(current, "member1");
    for context in ["member2", "fleet"] {
        let namespaces = kubectl_ok(&demo, &out_file, context, &["get", "ns", "-o", "name"]);
        assert!(
            namespaces.lines().any(|l| l == "namespace/default"),
            "{context}: {namespaces}"
        );
    }
    // The fleet view: every member's pods, a CLUSTER column first.
    let pods = kubectl_ok(&demo, &out_file, "fleet", &["get", "pods", "-A"]);
    assert!(
        pods.contains("member1") && pods.contains("member2"),
        "{pods}"
    );

    // `certs issue --dir DIR/pki`: a certificate the demo's gateway accepts.
    let issued = demo.path("issued");
    fleetgate_ok(&issue_args(
        Path::new(pki),
        "erin",
        &["--group", "ops", "--out-dir", issued.to_str().unwrap()],
    ));
    let namespaces = kubectl_as(
        &server,
        &demo.fleet_path("pki/serving-ca.crt"),
        &issued,
        "erin",
        &["get", "ns", "-o", "name"],
    );
    let namespaces = succeeded(namespaces, "erin's get ns", &demo.log_tail(20));
    assert!(namespaces.contains("namespace/default"), "{namespaces}");
}

#[test]
fn certs_commands_default_to_the_current_directory() {
    // `fleetgate certs issue-agent --cluster NAME` (the contract's form, no --dir) writes the
    // agent CA and the agent's certificate where it runs.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(FLEETGATE)
        .args(["certs", "issue-agent", "--cluster", "edge-7"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "agent-ca.crt",
        "agent-ca.key",
        "agent-edge-7.crt",
        "agent-edge-7.key",
    ] {
        assert!(dir.path().join(file).is_file(), "{file} not written");
    }
    assert_eq!(mode(&dir.path().join("agent-edge-7.key")), 0o600);
}
