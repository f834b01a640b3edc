//! docs/deploy.md, as written, on a simulated management cluster: the simulated fleet's member1
//! is the management cluster and member2 the member. The example overlay is applied there with
//! `kubectl apply -k`, the member's credentials go in a Secret, a Cluster and the example's
//! AccessPolicies are applied, and the gateway runs as the Deployment runs it (its ConfigMap's
//! Gateway with the certificates on disk, `--management-kubeconfig`, `--secrets-namespace
//! fleetgate`; the simulated members run no pods). A user with a certificate from the client CA
//! and a kubeconfig built with `kubectl config` then runs `kubectl get ns` through the gateway.
//! The example's pull-mode member (`edge1`, member2 again, through a real `fleetgate agent` on the
//! gateway's tunnel listener) shows its agents in `kubectl get clusters.fleetgate.io`'s AGENTS
//! column, 0 once the agent is gone, and none once the replica has stopped (SIGTERM).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::fleet::{fleetgate_binary, Fleet};
use support::pull::Agent;

fn deploy_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(rel)
}

/// kubectl on the management cluster (member1, directly, as the fleet's admin).
fn management(fleet: &Fleet, args: &[&str]) -> String {
    let kubeconfig = fleet.fleet_path("kubeconfig");
    let out = support::kubectl::kubectl(&kubeconfig, "member1", args);
    succeeded(out, &format!("{args:?}"))
}

fn succeeded(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    succeeded(out, &format!("{} {args:?}", program.display()))
}

/// `sed -n 's/^ *KEY: //p'` of the fleet's Cluster file of member2, as the walk-through does.
fn member_field(fleet: &Fleet, member: &str, key: &str) -> String {
    let text =
        std::fs::read_to_string(fleet.fleet_path(&format!("clusters/{member}.yaml"))).unwrap();
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key} in {member}.yaml"))
        .trim()
        .to_owned()
}

/// Writes `yaml` to the file `name` and `kubectl apply -f`s it in the management cluster.
fn apply_file(fleet: &Fleet, name: &str, yaml: &str) {
    let path = fleet.path(name);
    std::fs::write(&path, yaml).unwrap();
    management(fleet, &["apply", "-f", path.to_str().unwrap()]);
}

/// `kubectl wait` until the CRDs are established in the management cluster.
fn wait_established(fleet: &Fleet, crds: &[&str]) {
    let mut args = vec!["wait", "--for", "condition=established", "--timeout=10s"];
    args.extend_from_slice(crds);
    management(fleet, &args);
}

/// A member's credentials as the walkthrough stores them: a Secret in `fleetgate` with its
/// token and the fleet's CA.
fn credentials_secret(fleet: &Fleet, name: &str, token: &str) {
    credentials_secret_in(fleet, "fleetgate", name, token);
}

/// Such a Secret in `namespace`.
fn credentials_secret_in(fleet: &Fleet, namespace: &str, name: &str, token: &str) {
    let ca = fleet.fleet_path("pki/fleet-ca.crt");
    management(
        fleet,
        &[
            "-n",
            namespace,
            "create",
            "secret",
            "generic",
            name,
            &format!("--from-literal=token={token}"),
            &format!("--from-file=ca.crt={}", ca.display()),
        ],
    );
}

#[test]
fn the_deploy_walkthrough_ends_in_kubectl_get_ns_through_the_gateway() {
    let mut fleet = Fleet::sim(2, 0);
    let certs = fleet.path("certs");
    let certs_dir = certs.to_str().unwrap();
    run(&fleetgate_binary(), &["certs", "init", "--dir", certs_dir]);
    // Step 2's agent certificate, for the pull-mode member edge1.
    run(
        &fleetgate_binary(),
        &[
            "certs",
            "issue-agent",
            "--dir",
            certs_dir,
            "--cluster",
            "edge1",
        ],
    );

    // Step 3: the example overlay, as is.
    let overlay = deploy_path("overlays/example");
    let out = management(&fleet, &["apply", "-k", overlay.to_str().unwrap()]);
    assert!(out.contains("deployment.apps/fleetgate created"), "{out}");
    wait_established(
        &fleet,
        &[
            "crd/clusters.fleetgate.io",
            "crd/accesspolicies.fleetgate.io",
        ],
    );

    // Step 4: the member's credentials in a Secret, a Cluster naming it, the policies.
    credentials_secret(
        &fleet,
        "member2-credentials",
        &member_field(&fleet, "member2", "token"),
    );
    let cluster = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: member2}}\nspec:\n  server: {}\n  credentials: {{secretRef: {{name: member2-credentials, namespace: fleetgate}}}}\n",
        member_field(&fleet, "member2", "server")
    );
    let cluster_file = fleet.path("member2-cluster.yaml");
    std::fs::write(&cluster_file, cluster).unwrap();
    management(&fleet, &["apply", "-f", cluster_file.to_str().unwrap()]);
    let policy = deploy_path("overlays/example/fleet/policy.yaml");
    management(&fleet, &["apply", "-f", policy.to_str().unwrap()]);

    // The gateway as the pod runs it: the ConfigMap's Gateway with local files and free ports.
    let gateway = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {{name: fleetgate}}\nspec:\n  listeners: [{{name: https, address: 127.0.0.1:0}}]\n  tls: {{certFile: {certs_dir}/gateway.crt, keyFile: {certs_dir}/gateway.key, clientCAFile: {certs_dir}/ca.crt}}\n  admin: {{address: 127.0.0.1:0}}\n"
    );
    // A directory of its own: `serve` watches the file's directory, and the gateway's log is
    // written beside the fleet's files.
    std::fs::create_dir(fleet.path("gateway")).unwrap();
    let gateway_file = fleet.path("gateway/gateway.yaml");
    std::fs::write(&gateway_file, gateway).unwrap();
    // deploy/tunnel's flags too: the example overlay listens for agents.
    let agent_ca = format!("{certs_dir}/agent-ca.crt");
    fleet.serve_with_management(
        &gateway_file,
        &[
            "--secrets-namespace",
            "fleetgate",
            "--tunnel-listen",
            "127.0.0.1:0",
            "--agent-ca",
            &agent_ca,
            "--replica-name",
            "fleetgate-0",
        ],
        Some("info"),
    );

    // No spec.auth in the Deployment's Gateway: said once at start.
    assert!(
        fleet
            .log()
            .contains("no spec.auth (no tokenFile, no oidc): only client certificates signed by spec.tls.clientCA authenticate, and every anonymous request will be refused"),
        "{}",
        fleet.log_tail(20)
    );

    // Step 5: a user of group platform, a kubeconfig built with kubectl config.
    let alice_dir = fleet.path("alice");
    run(
        &fleetgate_binary(),
        &[
            "certs",
            "issue",
            "--dir",
            certs_dir,
            "--user",
            "alice",
            "--group",
            "platform",
            // The simulated member's own RBAC lets group ops read (docs/simulated-fleet.md).
            "--group",
            "ops",
            "--ttl",
            "1h",
            "--out-dir",
            alice_dir.to_str().unwrap(),
        ],
    );
    let alice = fleet.path("alice.kubeconfig");
    let alice_config = |args: &[&str]| {
        let mut all = vec!["config", "--kubeconfig", alice.to_str().unwrap()];
        all.extend_from_slice(args);
        run(Path::new("kubectl"), &all);
    };
    let server = format!("--server=https://{}/clusters/member2", fleet.https());
    let serving_ca = format!("--certificate-authority={certs_dir}/serving-ca.crt");
    alice_config(&[
        "set-cluster",
        "member2",
        &server,
        &serving_ca,
        "--embed-certs",
    ]);
    let cert = format!("--client-certificate={}/alice.crt", alice_dir.display());
    let key = format!("--client-key={}/alice.key", alice_dir.display());
    alice_config(&["set-credentials", "alice", &cert, &key, "--embed-certs"]);
    alice_config(&[
        "set-context",
        "member2",
        "--cluster=member2",
        "--user=alice",
    ]);
    alice_config(&["use-context", "member2"]);

    let namespaces = succeeded(
        support::kubectl::kubectl(&alice, "member2", &["get", "ns", "-o", "name"]),
        &format!("kubectl get ns through the gateway\n{}", fleet.log_tail(20)),
    );
    assert!(
        namespaces.contains("namespace/default") && namespaces.contains("namespace/kube-system"),
        "{namespaces}"
    );
    let whoami = succeeded(
        support::kubectl::kubectl(
            &alice,
            "member2",
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        ),
        "kubectl auth whoami",
    );
    assert_eq!(whoami, "alice");

    // The Cluster object says it is served.
    wait_for_ready(&fleet, "clusters.fleetgate.io", "member2", "True");
    wait_for_ready(&fleet, "accesspolicies", "platform-admins", "True");
    // The example's pull-mode member edge1 (member2, reached through an agent): its agent's
    // tunnel shows in the Cluster's status.
    credentials_secret(
        &fleet,
        "edge1-credentials",
        &member_field(&fleet, "member2", "token"),
    );
    apply_file(
        &fleet,
        "edge1-cluster.yaml",
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: edge1}\nspec:\n  connectMode: Tunnel\n  credentials: {secretRef: {name: edge1-credentials, namespace: fleetgate}}\n",
    );
    wait_for_ready(&fleet, "clusters.fleetgate.io", "edge1", "True");
    let agent = start_agent(&fleet, certs_dir, "edge1", "member2");
    wait_for_agents(&fleet, "edge1", "1", &[("fleetgate-0", 1)]);

    // ... and `kubectl get clusters.fleetgate.io` shows them, with the columns the CRD gives:
    // AGENTS for the pull-mode one, an empty cell for the direct one.
    let table = printed_columns(&fleet, "clusters.fleetgate.io");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "SERVER", "MODE", "READY", "AGENTS", "AGE"],
        "{table}"
    );
    let row = |name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let member2 = row("member2");
    assert_eq!(
        member2[1],
        member_field(&fleet, "member2", "server"),
        "{table}"
    );
    assert_eq!(member2[3..5], ["True", "<none>"], "{table}");
    assert_eq!(
        row("edge1")[1..5],
        ["<none>", "Tunnel", "True", "1"],
        "{table}"
    );

    // A secretRef without a namespace names a Secret where the gateway reads them (fleetgate).
    credentials_secret(
        &fleet,
        "member1-credentials",
        &member_field(&fleet, "member1", "token"),
    );
    let server1 = std::fs::read_to_string(fleet.fleet_path("clusters/member1.yaml"))
        .unwrap()
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server: ").map(str::to_owned))
        .unwrap();
    let member1 = fleet.path("member1-cluster.yaml");
    std::fs::write(
        &member1,
        format!("apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: member1}}\nspec:\n  server: {server1}\n  credentials: {{secretRef: {{name: member1-credentials}}}}\n"),
    )
    .unwrap();
    management(&fleet, &["apply", "-f", member1.to_str().unwrap()]);
    wait_for_ready(&fleet, "clusters.fleetgate.io", "member1", "True");

    // A policy that does not compile says why in its own status.
    apply_file(
        &fleet,
        "bad-policy.yaml",
        "apiVersion: fleetgate.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: typo}\nspec:\n  subjects: [{kind: User, name: bob}]\n  clusters: {names: [member2]}\n  rules: [{verbs: [gett]}]\n",
    );
    wait_for_ready(&fleet, "accesspolicies", "typo", "False");
    let message = management(
        &fleet,
        &[
            "get",
            "accesspolicies",
            "typo",
            "-o",
            "jsonpath={.status.conditions[0].reason}: {.status.conditions[0].message}",
        ],
    );
    assert!(
        message.starts_with(
            "Invalid: api:accesspolicies.fleetgate.io/typo: AccessPolicy typo: spec.rules"
        ) && message.contains("unknown verb \"gett\""),
        "{message}"
    );
    // Writing the conditions settles: a written status is not a new configuration (it was a
    // publish loop while the policies' resourceVersion was part of it).
    let published = fleet.log().matches("routing table published").count();
    assert!(
        published < 10,
        "{published} tables published\n{}",
        fleet.log_tail(10)
    );

    // The agent gone: AGENTS says 0 at once (the replica answers 503 for edge1).
    drop(agent);
    wait_for_agents(&fleet, "edge1", "0", &[("fleetgate-0", 0)]);
    // The replica stopping (as a pod is, SIGTERM): it removes its report, and nobody reports.
    let gateway = &mut fleet.gateway.as_mut().unwrap().child;
    support::pull::signal(gateway, libc::SIGTERM);
    support::pull::exits_within(gateway, Duration::from_secs(30), "the gateway's stop");
    wait_for_agents(&fleet, "edge1", "", &[]);
}

/// `fleetgate agent` for `cluster` with its certificate from `certs init`'s directory, trusting
/// the gateway's serving CA, carrying streams to the simulated `member`; waits for its `ready`.
fn start_agent(fleet: &Fleet, certs_dir: &str, cluster: &str, member: &str) -> Agent {
    let log = fleet.path(&format!("agent-{cluster}.log"));
    let mut agent = Command::new(fleetgate_binary());
    agent
        .arg("agent")
        .arg("--gateway")
        .arg(format!("https://{}", fleet.ready().addr("tunnel")))
        .args(["--cluster", cluster])
        .arg(format!("--cert={certs_dir}/agent-{cluster}.crt"))
        .arg(format!("--key={certs_dir}/agent-{cluster}.key"))
        .arg(format!("--ca={certs_dir}/serving-ca.crt"))
        .arg(format!(
            "--kube-server={}",
            member_field(fleet, member, "server")
        ))
        .arg("--kube-ca")
        .arg(fleet.fleet_path("pki/fleet-ca.crt"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    Agent::start(agent, &log, || fleet.log_tail(20))
}

/// Polls `cluster`'s status until `status.agents` prints as `agents` (`""`: none) and
/// `status.tunnels` holds exactly `replicas` (name and agents).
fn wait_for_agents(fleet: &Fleet, cluster: &str, agents: &str, replicas: &[(&str, u64)]) {
    let status = || -> serde_json::Value {
        let object = management(
            fleet,
            &["get", "clusters.fleetgate.io", cluster, "-o", "json"],
        );
        serde_json::from_str::<serde_json::Value>(&object).unwrap()["status"].take()
    };
    support::wait::wait_for_or(
        &format!("{cluster}: agents {agents:?}, entries {replicas:?}"),
        Duration::from_secs(30),
        || {
            let status = status();
            let printed = status["agents"].as_u64().map(|a| a.to_string());
            let entries: Vec<(String, Option<u64>)> = status["tunnels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(r, e)| (r.clone(), e["agents"].as_u64()))
                .collect();
            let wanted: Vec<(String, Option<u64>)> = replicas
                .iter()
                .map(|(r, a)| (r.to_string(), Some(*a)))
                .collect();
            printed.as_deref().unwrap_or("") == agents && entries == wanted
        },
        || format!("{}\n{}", status(), fleet.log_tail(20)),
    );
}

/// What `kubectl get RESOURCE` prints with the CRD's printer columns (the default ones, not
/// `-o wide`'s). The simulated management cluster does not print CRD columns itself, so they are
/// read from the CRD it holds and given to kubectl as `custom-columns`, which evaluates each
/// column's JSONPath on the objects as the API server would.
fn printed_columns(fleet: &Fleet, resource: &str) -> String {
    let crd: serde_json::Value =
        serde_json::from_str(&management(fleet, &["get", "crd", resource, "-o", "json"])).unwrap();
    let columns: Vec<String> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap_or_else(|| panic!("{resource} has no printer columns"))
        .iter()
        .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
        .map(|c| {
            format!(
                "{}:{}",
                c["name"].as_str().unwrap().to_uppercase(),
                c["jsonPath"].as_str().unwrap()
            )
        })
        .collect();
    let spec = format!("custom-columns=NAME:.metadata.name,{}", columns.join(","));
    management(fleet, &["get", resource, "-o", &spec])
}

/// Polls the object's `Ready` condition (in the management cluster) until it is `status`.
fn wait_for_ready(fleet: &Fleet, resource: &str, name: &str, status: &str) {
    support::wait::wait_for_or(
        &format!("{resource} {name}: Ready {status}"),
        Duration::from_secs(30),
        || {
            management(
                fleet,
                &[
                    "get",
                    resource,
                    name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            ) == status
        },
        || {
            let conditions =
                management(fleet, &["get", resource, name, "-o", "jsonpath={.status}"]);
            format!("{conditions}\n{}", fleet.log_tail(20))
        },
    );
}

/// Whether a `.dockerignore` pattern (the forms the file uses: a path, `*` within a name, `**/`
/// for any depth) matches `path` or a directory above it, as the build context is cut.
fn ignored_by(pattern: &str, path: &str) -> bool {
    fn matches(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.first(), path.first()) {
            (None, _) => true, // a directory above the path matched: all of it goes
            (Some(&"**"), _) => (0..=path.len()).any(|skip| matches(&pattern[1..], &path[skip..])),
            (Some(p), Some(name)) => glob(p, name) && matches(&pattern[1..], &path[1..]),
            (Some(_), None) => false,
        }
    }
    fn glob(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head)
                    && (head.len()..=name.len())
                        .any(|i| name.is_char_boundary(i) && glob(tail, &name[i..]))
            }
        }
    }
    let pattern: Vec<&str> = pattern.trim_matches('/').split('/').collect();
    let path: Vec<&str> = path.split('/').collect();
    matches(&pattern, &path)
}

#[test]
fn the_image_build_context_leaves_out_target_and_keeps_the_sources() {
    // deploy/Containerfile is built with the repository as its context (`podman build -f
    // deploy/Containerfile .`); docker, podman and buildah read `.dockerignore` at its root.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    let patterns: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        patterns.iter().all(|p| !p.starts_with('!')),
        "exceptions are not understood by this test: {patterns:?}"
    );
    let ignored = |path: &str| patterns.iter().any(|p| ignored_by(p, path));
    for heavy in [
        "target/debug/fleetgate",
        "target/release/fleetgate",
        "fuzz/target/x",
        ".git/HEAD",
    ] {
        assert!(ignored(heavy), "{heavy} is sent to the build");
    }
    // What `cargo build --locked -p fleetgate` reads: every member's manifest and sources.
    let mut needed = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned()];
    let mut dirs = vec![
        "gateway".to_owned(),
        "config-watcher".to_owned(),
        "loadtest".to_owned(),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir)).unwrap() {
            let entry = entry.unwrap();
            let path = format!("{dir}/{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else {
                needed.push(path);
            }
        }
    }
    assert!(needed.len() > 100, "{needed:?}");
    for file in &needed {
        assert!(!ignored(file), "{file} is left out of the build context");
    }
}

#[test]
fn agents_outside_the_cluster_reach_each_replica_through_its_node() {
    // An install with deploy/tunnel and deploy/tunnel-nodeport, as docs/deploy.md shows it.
    let install = tempfile::tempdir().unwrap();
    let root = install.path().canonicalize().unwrap();
    let deploy = deploy_path("").canonicalize().unwrap();
    // kustomize takes relative paths only: up to / from the install, then down to deploy/.
    let up = "../".repeat(root.components().count() - 1);
    let deploy = format!("{up}{}", deploy.strip_prefix("/").unwrap().display());
    std::fs::write(
        root.join("kustomization.yaml"),
        format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {deploy}/base\ncomponents:\n- {deploy}/tunnel\n- {deploy}/tunnel-nodeport\n"),
    )
    .unwrap();
    let rendered = run(Path::new("kubectl"), &["kustomize", root.to_str().unwrap()]);
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let find = |kind: &str, name: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in:\n{rendered}"))
    };
    // Each node forwards to the replica it runs, and to no other.
    let service = find("Service", "fleetgate-tunnel-nodes");
    assert_eq!(service["spec"]["type"], "NodePort");
    assert_eq!(service["spec"]["externalTrafficPolicy"], "Local");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "tunnel");
    assert_eq!(service["spec"]["ports"][0]["nodePort"], 30132);
    // One replica per node, and every replica listens for tunnels.
    let deployment = find("Deployment", "fleetgate");
    let pod = &deployment["spec"]["template"]["spec"];
    let required =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        required[0]["topologyKey"], "kubernetes.io/hostname",
        "{deployment}"
    );
    assert_eq!(
        required[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "fleetgate"
    );
    let args = pod["containers"][0]["args"].to_string();
    assert!(args.contains("--tunnel-listen=0.0.0.0:8132"), "{args}");
}

#[test]
fn without_secrets_namespace_secrets_are_read_in_the_namespace_of_the_management_context() {
    let mut fleet = Fleet::sim(2, 0);
    let crds = deploy_path("base/crds.yaml");
    management(&fleet, &["apply", "-f", crds.to_str().unwrap()]);
    wait_established(&fleet, &["crd/clusters.fleetgate.io"]);
    management(&fleet, &["create", "namespace", "team-a"]);
    credentials_secret_in(
        &fleet,
        "team-a",
        "member2-credentials",
        &member_field(&fleet, "member2", "token"),
    );
    // A secretRef without a namespace.
    let cluster = fleet.path("member2-cluster.yaml");
    std::fs::write(
        &cluster,
        format!("apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: member2}}\nspec:\n  server: {}\n  credentials: {{secretRef: {{name: member2-credentials}}}}\n", member_field(&fleet, "member2", "server")),
    )
    .unwrap();
    management(&fleet, &["apply", "-f", cluster.to_str().unwrap()]);

    // The management kubeconfig's context names team-a; no --secrets-namespace.
    let kubeconfig = fleet.path("management.kubeconfig");
    std::fs::copy(fleet.fleet_path("kubeconfig"), &kubeconfig).unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();
    run(
        Path::new("kubectl"),
        &[
            "config",
            "--kubeconfig",
            kubeconfig,
            "set-context",
            "member1",
            "--namespace=team-a",
        ],
    );
    std::fs::create_dir(fleet.path("gateway")).unwrap();
    let gateway = fleet.path("gateway/gateway.yaml");
    std::fs::write(
        &gateway,
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {name: fleetgate}\nspec:\n  listeners: [{name: http, address: 127.0.0.1:0, tls: false}]\n  admin: {address: 127.0.0.1:0}\n",
    )
    .unwrap();
    fleet.serve_config(
        &gateway,
        &[
            "--workers",
            "1",
            "--management-kubeconfig",
            kubeconfig,
            "--management-context",
            "member1",
        ],
        Some("info"),
    );
    wait_for_ready(&fleet, "clusters.fleetgate.io", "member2", "True");
    assert!(
        fleet.log().contains(
            "reading the Secrets that Clusters reference in this namespace only namespace=team-a"
        ),
        "{}",
        fleet.log_tail(20)
    );
}
