//! Live reload through a real `fleetgate serve` process watching the simulated fleet's directory:
//! clusters are added, changed and removed (files renamed in, rewritten, deleted) while a client
//! keeps sending requests to an unchanged cluster, and a broken file is written. The client must
//! see zero failures; each change must be served within one second (polled with a deadline); a
//! removed cluster answers 404; the broken file keeps the last good table and shows in
//! `/readyz?verbose` and `/metrics`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::client::{cluster_file, Load};
use support::fleet::{with_refused_token, Fleet};

/// Parks a cluster file: the gateway's loader only reads `*.yaml` / `*.yml`.
fn park(dir: &Path, name: &str) {
    std::fs::rename(cluster_file(dir, name), parked_file(dir, name)).unwrap();
}

fn unpark(dir: &Path, name: &str) {
    std::fs::rename(parked_file(dir, name), cluster_file(dir, name)).unwrap();
}

fn parked_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("clusters/{name}.parked"))
}

/// A fleet of `clusters` members; the gateway starts serving only `member1` (the others parked).
fn start(clusters: usize) -> Fleet {
    let mut fleet = Fleet::sim(clusters, 2);
    for k in 2..=clusters {
        park(fleet.dir(), &format!("member{k}"));
    }
    fleet.serve(&["--workers", "2"], Some("info"));
    fleet
}

impl Fleet {
    /// A fresh connection and one GET (as a new kubectl would do).
    fn get_once(&self, path: &str) -> (u16, String) {
        self.request("GET", path, "")
    }

    /// `path` answers `code` now (one GET, no retry); a failure shows the gateway log's tail.
    #[track_caller]
    fn assert_answers(&self, path: &str, code: u16) {
        assert_eq!(self.get_once(path).0, code, "{path}\n{}", self.log_tail(20));
    }

    /// Polls `path` until it answers `code`; panics after `within`. Returns how long it took.
    fn answers_within(&self, path: &str, code: u16, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let (status, body) = self.get_once(path);
            if status == code {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "{path} still answers {status} (not {code}) after {within:?}: {body}\n{}",
                self.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

const UNCHANGED: &str = "/clusters/member1/api/v1/namespaces/default";
const WITHIN: Duration = Duration::from_secs(1);

fn path_of(member: &str) -> String {
    format!("/clusters/{member}/api/v1/namespaces/default")
}

#[test]
fn clusters_follow_the_watched_directory_while_requests_keep_succeeding() {
    let fleet = start(3);
    fleet.assert_answers(UNCHANGED, 200);
    fleet.assert_answers(&path_of("member2"), 404);
    let load = Load::start(&fleet, UNCHANGED);

    // Added: member2's file appears (renamed in, as `mv` or `kubectl cp` would).
    unpark(fleet.dir(), "member2");
    let took = fleet.answers_within(&path_of("member2"), 200, WITHIN);
    eprintln!("member2 added, served after {took:?}");

    // Changed: member2's token rewritten to one the member refuses, then back.
    let good = std::fs::read_to_string(cluster_file(fleet.dir(), "member2")).unwrap();
    std::fs::write(
        cluster_file(fleet.dir(), "member2"),
        with_refused_token(&good),
    )
    .unwrap();
    fleet.answers_within(&path_of("member2"), 401, WITHIN);
    std::fs::write(cluster_file(fleet.dir(), "member2"), &good).unwrap();
    fleet.answers_within(&path_of("member2"), 200, WITHIN);

    // A second cluster added while the first is served.
    unpark(fleet.dir(), "member3");
    fleet.answers_within(&path_of("member3"), 200, WITHIN);

    // Removed.
    std::fs::remove_file(cluster_file(fleet.dir(), "member2")).unwrap();
    fleet.answers_within(&path_of("member2"), 404, WITHIN);
    let (_, body) = fleet.get_once(&path_of("member2"));
    assert!(body.contains("\"kind\":\"Status\""), "{body}");

    // Broken: the last good table keeps serving; the error is visible to the operator.
    std::fs::write(
        fleet.dir().join("clusters/broken.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member9\nspec:\n  server: https://127.0.0.1:1\n  caFile: does-not-exist.crt\n",
    )
    .unwrap();
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "rejected",
        WITHIN,
        "no reload error shown",
    );
    assert!(verbose.starts_with("HTTP/1.1 200"), "{verbose}");
    assert!(
        verbose.contains("broken.yaml")
            && verbose.contains("Cluster member9")
            && verbose.contains("spec.caData/caFile"),
        "{verbose}"
    );
    fleet.assert_answers(&path_of("member3"), 200);
    fleet.assert_answers(&path_of("member9"), 404);
    let metrics = fleet.admin_get("/metrics");
    assert!(
        metrics.contains("fleetgate_config_reloads_total{result=\"failure\"} 1")
            && metrics.contains("fleetgate_config_last_reload_failed 1")
            && metrics.trim_end().ends_with("# EOF"),
        "{metrics}"
    );
    assert!(
        fleet.log_tail(20).contains("broken.yaml"),
        "the log names the file: {}",
        fleet.log_tail(20)
    );

    // Fixed by removing the broken file: the error clears.
    std::fs::remove_file(fleet.dir().join("clusters/broken.yaml")).unwrap();
    fleet.admin_until(
        "/readyz?verbose",
        "config-reload ok",
        WITHIN,
        "the reload error did not clear",
    );

    load.finish(&fleet);
}

/// One team's mistake does not block everyone else's onboarding: objects are judged one by one.
/// A Cluster that is invalid at start is left out while the gateway starts and serves the others;
/// a bad Cluster written beside a new good one leaves the good one served and the bad one's
/// requests a 404; a served Cluster that turns invalid keeps its last good version while other
/// changes go on; `/readyz?verbose` and `/metrics` name what was rejected.
#[test]
fn a_bad_cluster_is_left_out_and_every_good_one_beside_it_is_served() {
    let mut fleet = Fleet::sim(3, 2);
    for k in 2..=3 {
        park(fleet.dir(), &format!("member{k}"));
    }
    std::fs::write(
        fleet.dir().join("clusters/broken.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member9\nspec:\n  server: https://127.0.0.1:1\n  caFile: does-not-exist.crt\n",
    )
    .unwrap();
    fleet.serve(&["--workers", "2"], Some("info"));
    fleet.assert_answers(UNCHANGED, 200);
    fleet.assert_answers(&path_of("member9"), 404);
    let verbose = fleet.admin_until("/readyz?verbose", "rejected", WITHIN, "member9 not shown");
    assert!(
        verbose.starts_with("HTTP/1.1 200")
            && verbose.contains("Cluster member9")
            && verbose.contains("spec.caData/caFile"),
        "{verbose}"
    );

    // A Cluster naming a Secret nobody created, and a good one beside it.
    std::fs::write(
        fleet.dir().join("clusters/no-secret.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member8\nspec:\n  server: https://127.0.0.1:1\n  credentials:\n    secretRef:\n      name: nobody-made-it\n",
    )
    .unwrap();
    unpark(fleet.dir(), "member2");
    fleet.answers_within(&path_of("member2"), 200, WITHIN);
    let (code, body) = fleet.get_once(&path_of("member8"));
    assert!(
        code == 404 && body.contains("\"kind\":\"Status\""),
        "{code} {body}"
    );
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "Secret default/nobody-made-it not found",
        WITHIN,
        "member8 not shown",
    );
    assert!(verbose.contains("Cluster member9"), "{verbose}");
    let metrics = fleet.admin_get("/metrics");
    assert!(
        metrics.contains("fleetgate_config_rejected_objects 2")
            && metrics
                .contains("fleetgate_config_object_rejected{kind=\"Cluster\",name=\"member8\","),
        "{metrics}"
    );

    // member2 turns invalid: its last good version serves on, and member3 still comes in.
    let member2 = cluster_file(fleet.dir(), "member2");
    let good = std::fs::read_to_string(&member2).unwrap();
    assert!(good.contains("server: https://"), "{good}");
    std::fs::write(&member2, good.replace("server: https://", "server: ftp://")).unwrap();
    unpark(fleet.dir(), "member3");
    fleet.answers_within(&path_of("member3"), 200, WITHIN);
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "its last good version keeps serving",
        WITHIN,
        "member2's rejection not shown",
    );
    assert!(
        verbose.contains("Cluster member2") && verbose.contains("spec.server"),
        "{verbose}"
    );
    fleet.assert_answers(&path_of("member2"), 200);
    fleet.assert_answers(UNCHANGED, 200);
}

/// kubectl on the fleet's own kubeconfig (the members, not the gateway), as `admin`.
fn kubectl(dir: &Path, args: &[&str]) -> String {
    let out = support::kubectl::kubectl(&dir.join("kubeconfig"), "member1", args);
    support::kubectl::succeeded(out, &format!("{args:?}"), "")
}

/// The simulated fleet's member1 as the management cluster: `kubectl apply` of a Cluster object
/// there is what makes member2 reachable through `serve --management-kubeconfig`.
#[test]
fn clusters_follow_the_management_cluster() {
    let mut fleet = Fleet::sim(2, 2);
    let member2 = cluster_file(fleet.dir(), "member2");
    let member2 = member2.to_str().unwrap();
    kubectl(fleet.dir(), &["apply", "-f", member2]);
    // The AccessPolicy objects come from the management cluster too (admin's among them).
    let policies = fleet.dir().join("policies.yaml");
    kubectl(fleet.dir(), &["apply", "-f", policies.to_str().unwrap()]);

    let config = fleet.fleet_path("gateway.yaml");
    fleet.serve_with_management(&config, &[], None);
    // `ready` comes after the first list: member2 is served at once, member1 (not in the
    // management cluster) is not.
    fleet.assert_answers(&path_of("member2"), 200);
    fleet.assert_answers(&path_of("member1"), 404);

    let member1 = cluster_file(fleet.dir(), "member1");
    kubectl(fleet.dir(), &["apply", "-f", member1.to_str().unwrap()]);
    fleet.answers_within(&path_of("member1"), 200, WITHIN);
    kubectl(fleet.dir(), &["delete", "clusters.fleetgate.io", "member2"]);
    fleet.answers_within(&path_of("member2"), 404, WITHIN);
    let verbose = fleet.admin_get("/readyz?verbose");
    assert!(verbose.contains("config-reload ok"), "{verbose}");
}

/// A Cluster whose credentials are a `v1` Secret in the watched directory
/// (`spec.credentials.secretRef`): the token reaches the member, a rotated Secret is used from
/// the next request (the member refuses a bad token, then accepts the good one again), and a
/// Secret that goes missing is a rejected change naming the Cluster and the field.
#[test]
fn a_cluster_follows_the_secret_its_credentials_reference() {
    let fleet = start(1);
    let file = cluster_file(fleet.dir(), "member1");
    let original = std::fs::read_to_string(&file).unwrap();
    let parsed: serde_yaml::Value = serde_yaml::from_str(&original).unwrap();
    let token = parsed["spec"]["credentials"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let ca = parsed["spec"]["caData"].as_str().unwrap().to_owned();
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let secret = |token: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: member1-credentials\n  namespace: fleet\ndata:\n  token: {}\n  ca.crt: {}\n",
            b64(token),
            b64(&ca)
        )
    };
    let secret_file = fleet.dir().join("clusters/member1-credentials.yaml");
    // The Cluster names the Secret instead of holding the token and the CA.
    let server = parsed["spec"]["server"].as_str().unwrap();
    let by_reference = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: member1\nspec:\n  server: {server}\n  impersonation: true\n  credentials:\n    secretRef:\n      name: member1-credentials\n      namespace: fleet\n"
    );
    std::fs::write(&secret_file, secret(&token)).unwrap();
    std::fs::write(&file, by_reference).unwrap();
    let start = Instant::now();
    while !fleet
        .admin_get("/readyz?verbose")
        .contains("config-reload ok")
        || fleet.get_once(UNCHANGED).0 != 200
    {
        assert!(start.elapsed() < WITHIN * 2, "{}", fleet.log_tail(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    fleet.assert_answers(UNCHANGED, 200);

    // Rotated to a token the member refuses, then back.
    std::fs::write(&secret_file, secret("rotated-but-unknown")).unwrap();
    fleet.answers_within(UNCHANGED, 401, WITHIN);
    std::fs::write(&secret_file, secret(&token)).unwrap();
    fleet.answers_within(UNCHANGED, 200, WITHIN);

    // The Secret removed: rejected, the last good table keeps serving.
    std::fs::remove_file(&secret_file).unwrap();
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "rejected",
        WITHIN,
        "no reload error shown",
    );
    assert!(
        verbose.contains("Cluster member1")
            && verbose.contains("spec.credentials.secretRef")
            && verbose.contains("Secret fleet/member1-credentials not found"),
        "{verbose}"
    );
    fleet.assert_answers(UNCHANGED, 200);
}

/// `serve --config DIR --management-kubeconfig ...`: the files stay watched beside the management
/// cluster and both feed one table. member1 comes from a file, member2 from a Cluster object in
/// the management cluster (the simulated fleet's member1); a change in either source is served
/// within a second, and a cluster defined in both is a rejected change that names both places.
#[test]
fn files_and_the_management_cluster_are_merged() {
    let mut fleet = Fleet::sim(3, 2);
    // Files: the Gateway and member1. The management cluster: member2.
    park(fleet.dir(), "member2");
    park(fleet.dir(), "member3");
    let api_copy = |name: &str| {
        let copy = fleet.dir().join(format!("{name}-object.json.txt"));
        std::fs::copy(parked_file(fleet.dir(), name), &copy).unwrap();
        copy
    };
    let member2_object = api_copy("member2");
    kubectl(
        fleet.dir(),
        &["apply", "-f", member2_object.to_str().unwrap()],
    );

    let config = fleet.dir().to_path_buf();
    fleet.serve_with_management(&config, &[], None);
    // `ready` comes after both sources reported: both clusters are served at once.
    fleet.assert_answers(&path_of("member1"), 200);
    fleet.assert_answers(&path_of("member2"), 200);
    fleet.assert_answers(&path_of("member3"), 404);

    // A file change: member3 appears.
    unpark(fleet.dir(), "member3");
    fleet.answers_within(&path_of("member3"), 200, WITHIN);
    // The API's member2 says which table serves it: the files' change made a new one, with no
    // event in the management cluster.
    let verbose = fleet.admin_get("/readyz?verbose");
    let generation = verbose
        .split("routing-table ok: generation ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("{verbose}"))
        .to_owned();
    let ready_message = || {
        kubectl(
            fleet.dir(),
            &[
                "get",
                "clusters.fleetgate.io",
                "member2",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}",
            ],
        )
    };
    let want = format!("served in routing table generation {generation}");
    support::wait::wait_for_or(
        "member2's Ready condition to name the table the files' change made",
        Duration::from_secs(10),
        || ready_message() == want,
        || format!("{} (want {want})", ready_message()),
    );
    // An API change: member2 goes.
    kubectl(fleet.dir(), &["delete", "clusters.fleetgate.io", "member2"]);
    fleet.answers_within(&path_of("member2"), 404, WITHIN);
    fleet.assert_answers(&path_of("member1"), 200);

    // member3 defined in the management cluster too: rejected, naming both places; the files'
    // member3 keeps serving.
    let member3_object = fleet.dir().join("member3-object.json.txt");
    std::fs::copy(cluster_file(fleet.dir(), "member3"), &member3_object).unwrap();
    kubectl(
        fleet.dir(),
        &["apply", "-f", member3_object.to_str().unwrap()],
    );
    let verbose = fleet.admin_until(
        "/readyz?verbose",
        "rejected",
        WITHIN,
        "no merge error shown",
    );
    assert!(
        verbose.contains("\"member3\" is defined both in the files")
            && verbose.contains("member3.yaml")
            && verbose.contains("management cluster"),
        "{verbose}"
    );
    fleet.assert_answers(&path_of("member3"), 200);
    kubectl(fleet.dir(), &["delete", "clusters.fleetgate.io", "member3"]);
    fleet.admin_until(
        "/readyz?verbose",
        "config-reload ok",
        WITHIN,
        "the merge error did not clear",
    );
}

/// `--management-objects both` against a management cluster without Karmada's CRD: the
/// fleetgate Clusters are served anyway, `/readyz` fails (500) and `/readyz?verbose` names the
/// missing resource; once the CRD is installed the watch lists it and readiness recovers.
#[test]
fn a_missing_crd_fails_readiness_until_it_is_installed() {
    let mut fleet = Fleet::sim(2, 2);
    let member2 = cluster_file(fleet.dir(), "member2");
    kubectl(fleet.dir(), &["apply", "-f", member2.to_str().unwrap()]);
    // The fleet's AccessPolicies (admin may do everything) live in the management cluster too.
    let policies = fleet.dir().join("policies.yaml");
    kubectl(fleet.dir(), &["apply", "-f", policies.to_str().unwrap()]);
    let config = fleet.fleet_path("gateway.yaml");
    fleet.serve_with_management(&config, &["--management-objects", "both"], None);
    let (code, body) = fleet.get_once(&path_of("member2"));
    assert_eq!(code, 200, "{body}\n{}", fleet.log_tail(20));
    let readyz = fleet.admin_get("/readyz");
    assert!(readyz.starts_with("HTTP/1.1 500"), "{readyz}");
    let verbose = fleet.admin_get("/readyz?verbose");
    assert!(
        verbose.starts_with("HTTP/1.1 500")
            && verbose.contains("[-]kubernetes-api-watch clusters.cluster.karmada.io failed: the management cluster does not serve clusters.cluster.karmada.io (is its CRD installed?)")
            && verbose.contains("readyz check failed"),
        "{verbose}"
    );

    let crd = fleet.dir().join("karmada-crd.yaml");
    std::fs::write(
        &crd,
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusters.cluster.karmada.io
spec:
  group: cluster.karmada.io
  scope: Cluster
  names: {kind: Cluster, plural: clusters, singular: cluster, listKind: ClusterList}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
    subresources: {status: {}}
",
    )
    .unwrap();
    kubectl(fleet.dir(), &["apply", "-f", crd.to_str().unwrap()]);
    // The watcher retries with kube-rs's backoff (0.8 s doubling, at most 30 s).
    let start = Instant::now();
    loop {
        let readyz = fleet.admin_get("/readyz?verbose");
        if readyz.starts_with("HTTP/1.1 200") {
            assert!(readyz.contains("readyz check passed"), "{readyz}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(45),
            "readiness did not recover: {readyz}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fleet.assert_answers(&path_of("member2"), 200);
}
