//! The simulated members as kubectl sees them: every output format, apply (client-side and
//! server-side), the three patch types, delete, `get -w`, `logs -f`, `auth whoami` with
//! impersonation, real 403s, bad input and paging. Each test starts its own fleet.

mod common;

use std::time::Duration;

use common::{assert_stderr_has, kubectl_stdin, ok_stdout, stderr, LineReader, TestFleet};

const CONFIGMAP_YAML: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  namespace: default
  labels:
    app: demo
data:
  color: blue
";

#[test]
fn get_in_every_output_format() {
    let fleet = TestFleet::start(1);
    // Default table of pods: the seeded Running pod with its columns.
    let table = ok_stdout(&fleet.kubectl(&["get", "pods", "-n", "default"]));
    let header = table.lines().next().unwrap_or("");
    for column in ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] {
        assert!(header.contains(column), "missing {column} in {table}");
    }
    assert!(
        table.contains("hello") && table.contains("1/1") && table.contains("Running"),
        "{table}"
    );

    let wide = ok_stdout(&fleet.kubectl(&["get", "pods", "-n", "default", "-o", "wide"]));
    assert!(
        wide.contains("NODE") && wide.contains("member1-node-1") && wide.contains("10.244."),
        "{wide}"
    );

    let nodes = ok_stdout(&fleet.kubectl(&["get", "nodes"]));
    assert!(
        nodes.contains("member1-node-3") && nodes.contains("Ready"),
        "{nodes}"
    );
    let namespaces = ok_stdout(&fleet.kubectl(&["get", "ns"]));
    for ns in ["default", "kube-system", "kube-public", "Active"] {
        assert!(namespaces.contains(ns), "{namespaces}");
    }

    // A new pod is scheduled and started, with the events a kubelet records.
    ok_stdout(&fleet.kubectl(&["run", "web", "--image=nginx:1.27", "-n", "default"]));
    let described = ok_stdout(&fleet.kubectl(&["describe", "pod", "web", "-n", "default"]));
    assert!(described.contains("Running"), "{described}");
    for reason in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(
            described.contains(reason),
            "missing event {reason}: {described}"
        );
    }
    let events = ok_stdout(&fleet.kubectl(&["get", "events", "-n", "default"]));
    assert!(
        events.contains("pod/web") && events.contains("Started container web"),
        "{events}"
    );

    let json_out =
        ok_stdout(&fleet.kubectl(&["get", "pod", "hello", "-n", "default", "-o", "json"]));
    let pod: serde_json::Value = serde_json::from_str(&json_out).expect("pod JSON");
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["status"]["phase"], "Running");

    let yaml_out =
        ok_stdout(&fleet.kubectl(&["get", "svc", "kubernetes", "-n", "default", "-o", "yaml"]));
    assert!(
        yaml_out.contains("kind: Service") && yaml_out.contains("clusterIP: 10.96.0.1"),
        "{yaml_out}"
    );

    let names = ok_stdout(&fleet.kubectl(&["get", "ns", "-o", "name"]));
    assert!(
        names.lines().any(|l| l == "namespace/kube-system"),
        "{names}"
    );

    let jsonpath = ok_stdout(&fleet.kubectl(&[
        "get",
        "pods",
        "-n",
        "default",
        "-l",
        "app=hello",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]));
    assert_eq!(jsonpath.trim(), "member1-node-1");

    let columns = ok_stdout(&fleet.kubectl(&[
        "get",
        "nodes",
        "-o",
        "custom-columns=N:.metadata.name,IP:.status.addresses[0].address",
    ]));
    assert!(
        columns.starts_with("N") && columns.contains("10.0.0.10"),
        "{columns}"
    );

    // Other kinds with their own columns.
    fleet.apply(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
",
    );
    // kubectl create serviceaccount sends protobuf; every namespace has `default`.
    ok_stdout(&fleet.kubectl(&["create", "serviceaccount", "robot", "-n", "default"]));
    let accounts = ok_stdout(&fleet.kubectl(&["get", "sa", "-n", "default", "-o", "name"]));
    assert_eq!(
        accounts.lines().collect::<Vec<_>>(),
        vec!["serviceaccount/default", "serviceaccount/robot"]
    );
    let deployments = ok_stdout(&fleet.kubectl(&["get", "deploy", "-n", "default"]));
    assert!(
        deployments.contains("UP-TO-DATE") && deployments.contains("2/2"),
        "{deployments}"
    );
}

#[test]
fn apply_client_side_then_server_side() {
    let fleet = TestFleet::start(1);
    assert!(fleet
        .apply(CONFIGMAP_YAML)
        .contains("configmap/app-config created"));

    let changed = CONFIGMAP_YAML.replace("color: blue", "color: green");
    assert!(fleet
        .apply(&changed)
        .contains("configmap/app-config configured"));
    let color = ok_stdout(&fleet.kubectl(&[
        "get",
        "cm",
        "app-config",
        "-n",
        "default",
        "-o",
        "jsonpath={.data.color}",
    ]));
    assert_eq!(color, "green");

    let server_side = CONFIGMAP_YAML.replace("app-config", "ssa-config");
    let applied = kubectl_stdin(&fleet, &["apply", "--server-side", "-f", "-"], &server_side);
    assert!(ok_stdout(&applied).contains("configmap/ssa-config serverside-applied"));
    let again = kubectl_stdin(
        &fleet,
        &["apply", "--server-side", "-f", "-"],
        &server_side.replace("color: blue", "color: red"),
    );
    ok_stdout(&again);
    let color = ok_stdout(&fleet.kubectl(&[
        "get",
        "cm",
        "ssa-config",
        "-n",
        "default",
        "-o",
        "jsonpath={.data.color}",
    ]));
    assert_eq!(color, "red");
}

#[test]
fn patch_with_merge_strategic_and_json() {
    let fleet = TestFleet::start(1);
    // `kubectl patch KIND NAME -n default --type TYPE -p PATCH`.
    let patch = |kind: &str, name: &str, patch_type: &str, patch: &str| {
        fleet.kubectl(&[
            "patch", kind, name, "-n", "default", "--type", patch_type, "-p", patch,
        ])
    };
    fleet.apply(CONFIGMAP_YAML);
    ok_stdout(&patch(
        "cm",
        "app-config",
        "merge",
        r#"{"data":{"size":"L"}}"#,
    ));
    ok_stdout(&patch(
        "cm",
        "app-config",
        "strategic",
        r#"{"metadata":{"labels":{"patched":"smp"}}}"#,
    ));
    ok_stdout(&patch(
        "cm",
        "app-config",
        "json",
        r#"[{"op":"replace","path":"/data/color","value":"black"}]"#,
    ));
    let out =
        ok_stdout(&fleet.kubectl(&["get", "cm", "app-config", "-n", "default", "-o", "json"]));
    let cm: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(cm["data"]["size"], "L");
    assert_eq!(cm["data"]["color"], "black");
    assert_eq!(cm["metadata"]["labels"]["patched"], "smp");
    assert_eq!(cm["metadata"]["labels"]["app"], "demo");

    // Strategic merge of a pod's containers merges by name.
    ok_stdout(&patch(
        "pod",
        "hello",
        "strategic",
        r#"{"spec":{"containers":[{"name":"main","image":"busybox:1.38"}]}}"#,
    ));
    let image = ok_stdout(&fleet.kubectl(&[
        "get",
        "pod",
        "hello",
        "-n",
        "default",
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ]));
    assert_eq!(image, "busybox:1.38");

    // A json patch whose test fails is a 422 that kubectl reports.
    let failed = patch(
        "cm",
        "app-config",
        "json",
        r#"[{"op":"test","path":"/data/color","value":"WRONG"}]"#,
    );
    assert!(!failed.status.success());
    assert_stderr_has(&failed, "the server rejected our request");
}

#[test]
fn delete_removes_the_object() {
    let fleet = TestFleet::start(1);
    fleet.apply(CONFIGMAP_YAML);
    let out = ok_stdout(&fleet.kubectl(&["delete", "cm", "app-config", "-n", "default"]));
    assert!(out.contains("configmap \"app-config\" deleted"), "{out}");
    let gone = fleet.kubectl(&["get", "cm", "app-config", "-n", "default"]);
    assert!(!gone.status.success());
    assert_stderr_has(&gone, "configmaps \"app-config\" not found");
    // Pods and namespaces go too (the sim deletes at once).
    ok_stdout(&fleet.kubectl(&["delete", "pod", "hello", "-n", "default"]));
    ok_stdout(&fleet.kubectl(&["create", "namespace", "scratch"]));
    // Like kube-controller-manager, the sim publishes the cluster CA in every new namespace.
    let ca = ok_stdout(&fleet.kubectl(&[
        "get",
        "cm",
        "kube-root-ca.crt",
        "-n",
        "scratch",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]));
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    ok_stdout(&fleet.kubectl(&["delete", "namespace", "scratch"]));
    let ns = fleet.kubectl(&["get", "ns", "scratch"]);
    assert!(!ns.status.success());
}

#[test]
fn get_watch_shows_a_change_made_by_another_client() {
    let fleet = TestFleet::start(1);
    fleet.apply(CONFIGMAP_YAML);
    let mut watch = fleet.kubectl_spawn(&["get", "cm", "-n", "default", "-w"]);
    let mut lines = LineReader::new(watch.stdout.take().expect("stdout"));
    lines.wait_line("the initial row", Duration::from_secs(20), |l| {
        l.starts_with("app-config")
    });
    // Another client (a second kubectl) creates an object; the watch prints it.
    ok_stdout(&fleet.kubectl(&[
        "create",
        "cm",
        "from-other-client",
        "-n",
        "default",
        "--from-literal=a=b",
    ]));
    let row = lines.wait_line("the new object's row", Duration::from_secs(20), |l| {
        l.starts_with("from-other-client")
    });
    assert!(row.contains('1'), "DATA column: {row}");
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn logs_and_follow() {
    let fleet = TestFleet::start(1);
    let logs = ok_stdout(&fleet.kubectl(&["logs", "hello", "-n", "default"]));
    assert!(
        logs.contains("log line 1 from default/hello container main"),
        "{logs}"
    );
    let tail = ok_stdout(&fleet.kubectl(&["logs", "hello", "-n", "default", "--tail=2"]));
    assert_eq!(tail.lines().count(), 2, "{tail}");
    let bad = fleet.kubectl(&["logs", "hello", "-n", "default", "-c", "nope"]);
    assert_stderr_has(&bad, "container nope is not valid for pod hello");

    let mut follow = fleet.kubectl_spawn(&["logs", "-f", "hello", "-n", "default"]);
    let mut lines = LineReader::new(follow.stdout.take().expect("stdout"));
    // Lines keep arriving after the initial five.
    lines.wait_line("line 7", Duration::from_secs(20), |l| {
        l.starts_with("log line 7 ")
    });
    lines.wait_line("line 9", Duration::from_secs(20), |l| {
        l.starts_with("log line 9 ")
    });
    let _ = follow.kill();
    let _ = follow.wait();
}

#[test]
fn auth_whoami_and_impersonation() {
    let fleet = TestFleet::start(1);
    let me = ok_stdout(&fleet.kubectl(&["auth", "whoami", "-o", "json"]));
    let review: serde_json::Value = serde_json::from_str(&me).expect("JSON");
    assert_eq!(review["status"]["userInfo"]["username"], "admin");
    let groups = review["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("system:masters") && groups.contains("system:authenticated"),
        "{groups}"
    );

    let as_bob =
        ok_stdout(&fleet.kubectl(&["auth", "whoami", "--as", "bob", "--as-group", "devs"]));
    assert!(
        as_bob.contains("bob") && as_bob.contains("devs"),
        "{as_bob}"
    );

    // can-i (protobuf SelfSubjectAccessReview / RulesReview) agrees with what the member enforces.
    let yes = fleet.kubectl(&[
        "auth",
        "can-i",
        "get",
        "configmaps",
        "-n",
        "default",
        "--as",
        "bob",
    ]);
    assert_eq!(String::from_utf8_lossy(&yes.stdout).trim(), "yes");
    let no = fleet.kubectl(&[
        "auth",
        "can-i",
        "delete",
        "configmaps",
        "-n",
        "default",
        "--as",
        "bob",
    ]);
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    let rules = ok_stdout(&fleet.kubectl(&["auth", "can-i", "--list", "--as", "bob"]));
    assert!(
        rules
            .lines()
            .any(|l| l.starts_with("configmaps ") && l.contains("[get list watch]")),
        "{rules}"
    );

    // bob may read configmaps but not pods.
    ok_stdout(&fleet.kubectl(&["get", "cm", "-n", "default", "--as", "bob"]));
    let pods = fleet.kubectl(&["get", "pods", "-n", "default", "--as", "bob"]);
    assert_stderr_has(&pods, "User \"bob\" cannot list resource \"pods\"");

    // alice (token) may not impersonate anyone.
    let denied = kubectl_as_alice(&fleet, &["get", "cm", "-n", "dev", "--as", "bob"]);
    assert!(!denied.status.success());
    assert_stderr_has(
        &denied,
        "User \"alice\" cannot impersonate resource \"users\"",
    );
    // whoami --as from alice is refused too (kubectl words any 403 of the review its own way);
    // without --as she sees herself.
    let whoami_as = kubectl_as_alice(&fleet, &["auth", "whoami", "--as", "bob"]);
    assert!(!whoami_as.status.success());
    assert_stderr_has(&whoami_as, "do not have permission");
    let herself = kubectl_as_alice(&fleet, &["auth", "whoami"]);
    let out = String::from_utf8_lossy(&herself.stdout);
    assert!(
        out.contains("alice") && out.contains("devs") && out.contains("alice-uid"),
        "{out}"
    );
}

/// Runs kubectl against member1 as alice, with her token.
fn kubectl_as_alice(fleet: &TestFleet, args: &[&str]) -> std::process::Output {
    let path = fleet.tempdir.path().join("alice.kubeconfig");
    let ca = fleet.dir().join("pki/fleet-ca.crt");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: m\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: m\n  context: {{cluster: m, user: alice}}\ncurrent-context: m\nusers:\n- name: alice\n  user:\n    token: {}\n",
        fleet.member_url(0),
        ca.display(),
        fleet.token("alice")
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    common::kubectl_with(&path, &fleet.cache_dir(), args, &[])
}

#[test]
fn alice_is_forbidden_outside_dev() {
    let fleet = TestFleet::start(1);
    let allowed = kubectl_as_alice(&fleet, &["get", "pods", "-n", "dev"]);
    assert!(allowed.status.success(), "{}", stderr(&allowed));
    let denied = kubectl_as_alice(&fleet, &["get", "pods", "-n", "default"]);
    assert!(!denied.status.success());
    assert_stderr_has(&denied, "pods is forbidden: User \"alice\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"");
    let create = kubectl_as_alice(&fleet, &["create", "cm", "x", "-n", "dev"]);
    assert_stderr_has(&create, "cannot create resource \"configmaps\"");
}

#[test]
fn bad_input_gets_kubernetes_errors() {
    let fleet = TestFleet::start(1);
    let malformed = kubectl_stdin(
        &fleet,
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/configmaps",
            "-f",
            "-",
        ],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"broken""#,
    );
    assert!(!malformed.status.success());
    let err = stderr(&malformed);
    assert!(err.contains("BadRequest") || err.contains("400"), "{err}");
    assert!(err.contains("json parse error"), "{err}");

    let unknown = fleet.kubectl(&["get", "widgets"]);
    assert!(!unknown.status.success());
    assert_stderr_has(
        &unknown,
        "the server doesn't have a resource type \"widgets\"",
    );
    let missing_ns = fleet.kubectl(&["create", "cm", "x", "-n", "no-such-namespace"]);
    assert_stderr_has(&missing_ns, "namespaces \"no-such-namespace\" not found");
}

#[test]
fn paging_with_chunk_size() {
    let fleet = TestFleet::start_with(1, 50, 0.0, Default::default());
    let out = ok_stdout(&fleet.kubectl(&[
        "get",
        "cm",
        "-A",
        "--chunk-size=7",
        "-l",
        "fleetgate.io/load=true",
        "-o",
        "name",
    ]));
    assert_eq!(out.lines().count(), 50, "{out}");
    let verbose = fleet.kubectl(&["get", "cm", "-n", "load-3", "--chunk-size=2", "-v=6"]);
    let trace = stderr(&verbose);
    assert!(
        trace.contains("continue="),
        "kubectl followed continue tokens: {trace}"
    );
    assert_eq!(
        ok_stdout(&verbose).lines().count(),
        7,
        "header + 5 load objects + kube-root-ca.crt"
    );
}

#[test]
fn generated_files_follow_the_contract() {
    let fleet = TestFleet::start(2);
    let dir = fleet.dir();
    for file in [
        "kubeconfig",
        "gateway.yaml",
        "gateway.kubeconfig",
        "clusters/member1.yaml",
        "clusters/member2.yaml",
        "users/tokens.csv",
        "users/alice.crt",
        "users/alice.key",
        "users/alice.token",
        "pki/fleet-ca.crt",
        "pki/gateway-ca.crt",
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let contexts = ok_stdout(&fleet.kubectl(&["config", "get-contexts", "-o", "name"]));
    assert_eq!(
        contexts.lines().collect::<Vec<_>>(),
        vec!["member1", "member2"]
    );
    let node = ok_stdout(&fleet.kubectl(&["--context", "member2", "get", "nodes", "-o", "name"]));
    assert!(node.contains("member2-node-1"), "{node}");
    let csv = std::fs::read_to_string(dir.join("users/tokens.csv")).expect("tokens.csv");
    assert!(
        csv.lines().any(|l| l.contains(",alice,alice-uid,\"devs\"")),
        "{csv}"
    );
    let cluster = std::fs::read_to_string(dir.join("clusters/member1.yaml")).expect("cluster");
    assert!(
        cluster.contains("kind: Cluster") && cluster.contains(&fleet.member_url(0)),
        "{cluster}"
    );

    // The Cluster object's token may impersonate (what the gateway does), and list and watch
    // (what its shared watches do), but nothing else: not even a get.
    let token = cluster
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("token")
        .trim_matches('\'')
        .trim_matches('"')
        .to_string();
    let path = fleet.tempdir.path().join("gw.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: m\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: m\n  context: {{cluster: m, user: gw}}\ncurrent-context: m\nusers:\n- name: gw\n  user:\n    token: {token}\n",
            fleet.member_url(0),
            dir.join("pki/fleet-ca.crt").display()
        ),
    )
    .expect("kubeconfig");
    let as_self = common::kubectl_with(
        &path,
        &fleet.cache_dir(),
        &["get", "cm", "kube-root-ca.crt", "-n", "default"],
        &[],
    );
    assert_stderr_has(&as_self, "User \"fleetgate-gateway\" cannot get");
    let as_admin = common::kubectl_with(
        &path,
        &fleet.cache_dir(),
        &[
            "get",
            "cm",
            "-n",
            "default",
            "--as",
            "admin",
            "--as-group",
            "system:masters",
        ],
        &[],
    );
    assert!(as_admin.status.success(), "{}", stderr(&as_admin));
}

#[test]
fn stop_member_closes_only_that_member_and_restart_brings_it_back() {
    let fleet = TestFleet::start(2);
    ok_stdout(&fleet.kubectl(&["--context", "member1", "get", "ns"]));
    let addr = fleet.handle().member_addrs()[0];
    fleet.runtime.block_on(fleet.handle().stop_member(0));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "member1 still accepts connections"
    );
    // Back on the same address, with its objects.
    fleet
        .runtime
        .block_on(fleet.handle().restart_member(0))
        .expect("restart member1");
    let nodes = ok_stdout(&fleet.kubectl(&["--context", "member1", "get", "nodes", "-o", "name"]));
    assert!(nodes.contains("member1-node-1"), "{nodes}");
    ok_stdout(&fleet.kubectl(&["--context", "member2", "get", "ns"]));
}

#[test]
fn deployments_scale_and_roll_out() {
    let fleet = TestFleet::start(1);
    ok_stdout(&fleet.kubectl(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1",
        "-n",
        "default",
    ]));
    ok_stdout(&fleet.kubectl(&["scale", "deploy", "web", "--replicas=3", "-n", "default"]));
    let ready = ok_stdout(&fleet.kubectl(&[
        "get",
        "deploy",
        "web",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.readyReplicas}",
    ]));
    assert_eq!(ready, "3");
    ok_stdout(&fleet.kubectl(&[
        "set",
        "image",
        "deploy/web",
        "nginx=nginx:2",
        "-n",
        "default",
    ]));
    let status = ok_stdout(&fleet.kubectl(&[
        "rollout",
        "status",
        "deploy/web",
        "-n",
        "default",
        "--timeout=10s",
    ]));
    assert!(status.contains("successfully rolled out"), "{status}");
}

#[test]
fn fleetgate_objects_apply_and_list() {
    let fleet = TestFleet::start(1);
    let objects = "apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata:
  name: east
  labels: {env: dev}
spec:
  server: https://10.0.0.1:6443
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata:
  name: devs
spec:
  subjects: [{kind: Group, name: devs}]
";
    let out = fleet.apply(objects);
    assert!(out.contains("cluster.fleetgate.io/east created"), "{out}");
    let changed = objects.replace("env: dev", "env: prod");
    fleet.apply(&changed);
    let env = ok_stdout(&fleet.kubectl(&[
        "get",
        "clusters.fleetgate.io",
        "east",
        "-o",
        "jsonpath={.metadata.labels.env}",
    ]));
    assert_eq!(env, "prod");
    let names = ok_stdout(&fleet.kubectl(&["get", "accesspolicies", "-o", "name"]));
    assert_eq!(names.trim(), "accesspolicy.fleetgate.io/devs");
    // CRD manifests (as in deploy/) apply and become Established.
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusters.fleetgate.io
spec:
  group: fleetgate.io
  scope: Cluster
  names: {plural: clusters, singular: cluster, kind: Cluster, listKind: ClusterList}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";
    fleet.apply(crd);
    fleet.wait_established(&["clusters.fleetgate.io"]);
    let can = fleet.kubectl(&[
        "auth",
        "can-i",
        "list",
        "clusters.fleetgate.io",
        "--as",
        "bob",
    ]);
    assert_eq!(String::from_utf8_lossy(&can.stdout).trim(), "no");
}

#[test]
fn a_stored_crd_registers_its_resource() {
    let fleet = TestFleet::start(1);
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusters.cluster.karmada.io
spec:
  group: cluster.karmada.io
  scope: Cluster
  names: {plural: clusters, singular: cluster, kind: Cluster, listKind: ClusterList}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";
    fleet.apply(crd);
    let karmada_cluster = "apiVersion: cluster.karmada.io/v1alpha1
kind: Cluster
metadata:
  name: member-a
spec:
  apiEndpoint: https://10.0.0.5:6443
  syncMode: Push
";
    let out = fleet.apply(karmada_cluster);
    assert!(
        out.contains("cluster.cluster.karmada.io/member-a created"),
        "{out}"
    );
    let endpoint = ok_stdout(&fleet.kubectl(&[
        "get",
        "clusters.cluster.karmada.io",
        "member-a",
        "-o",
        "jsonpath={.spec.apiEndpoint}",
    ]));
    assert_eq!(endpoint, "https://10.0.0.5:6443");
    // The built-in fleetgate.io clusters are a separate resource.
    let ours = ok_stdout(&fleet.kubectl(&["get", "clusters.fleetgate.io", "-o", "name"]));
    assert!(ours.trim().is_empty(), "{ours}");
    // Deleting the CRD unregisters the resource.
    ok_stdout(&fleet.kubectl(&["delete", "crd", "clusters.cluster.karmada.io"]));
    let gone = fleet.kubectl(&["get", "--raw", "/apis/cluster.karmada.io/v1alpha1/clusters"]);
    assert!(!gone.status.success());
}
