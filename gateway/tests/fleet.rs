//! The fleet view (`/fleet`) with kubectl against a simulated fleet: `get pods -A` shows every
//! member's pods with a CLUSTER column; JSON items carry their cluster's annotations; paging with
//! `--chunk-size` crosses clusters and loses nothing; each user sees only the clusters their
//! AccessPolicies allow; a member that cannot be reached is named in a warning while the others
//! are listed; what the view does not serve is refused with a Status that says so; discovery
//! shows only the merged kinds; a `cluster.fleetgate.io/NAME` hint aims a request at one cluster
//! (and a hint to a cluster the user may not reach reads as one to no cluster); a create goes to
//! `spec.fleet.createIn` when set, and so does a server-side apply of an object no cluster has;
//! `kubectl auth can-i` says yes only where every cluster does, naming those that differ.

mod support;

use std::collections::BTreeSet;

use support::fleet::Fleet;
use support::kubectl::{get_configmap, succeeded};

/// What the simulated fleet's FleetResource merges, as `kubectl api-resources -o name` names it.
const MERGED: [&str; 7] = [
    "configmaps",
    "deployments.apps",
    "events",
    "namespaces",
    "nodes",
    "pods",
    "services",
];

impl Fleet {
    /// kubectl with the `fleet` context's credentials (as `user`, when given) against `path` on
    /// the gateway: a fleet prefix, aimed at a cluster or not.
    fn kubectl_at(&self, path: &str, user: Option<&str>, args: &[&str]) -> std::process::Output {
        let server = format!("--server=https://{}{path}", self.https());
        let mut all = vec![server.as_str()];
        if let Some(user) = user {
            all.extend(["--user", user]);
        }
        all.extend_from_slice(args);
        self.kubectl_output("fleet", &all)
    }

    /// The same, for a run that must succeed; its stdout.
    fn kubectl_at_ok(&self, path: &str, user: Option<&str>, args: &[&str]) -> String {
        let out = self.kubectl_at(path, user, args);
        succeeded(out, &format!("at {path} {args:?}"), &self.log_tail(20))
    }

    /// `metadata.uid` of one object, through `context`.
    fn uid(&self, context: &str, args: &[&str]) -> String {
        let mut all = args.to_vec();
        all.extend(["-o", "jsonpath={.metadata.uid}"]);
        self.kubectl_ok(context, &all)
    }

    /// (cluster, namespace, name) of every item of a `-o json` list through the fleet view.
    fn fleet_items(&self, args: &[&str]) -> Vec<(String, String, String)> {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let list: serde_json::Value =
            serde_json::from_str(&self.kubectl_ok("fleet", &all)).unwrap();
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        list["items"]
            .as_array()
            .unwrap_or_else(|| panic!("no items: {list}"))
            .iter()
            .map(|item| {
                let meta = &item["metadata"];
                assert_eq!(
                    meta["annotations"]["fleetgate.io/cluster"],
                    meta["annotations"]["resource.karmada.io/cached-from-cluster"],
                    "{item}"
                );
                (
                    text(&meta["annotations"]["fleetgate.io/cluster"]),
                    text(&meta["namespace"]),
                    text(&meta["name"]),
                )
            })
            .collect()
    }

    /// The same, asked of each member directly through its own context.
    fn member_items(&self, members: &[&str], args: &[&str]) -> Vec<(String, String, String)> {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let mut out = Vec::new();
        for member in members {
            let list: serde_json::Value =
                serde_json::from_str(&self.kubectl_ok(member, &all)).unwrap();
            for item in list["items"].as_array().unwrap() {
                out.push((
                    member.to_string(),
                    item["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    item["metadata"]["name"].as_str().unwrap().to_owned(),
                ));
            }
        }
        out
    }
}

/// The clusters the items of a list came from.
fn clusters_of(list: &serde_json::Value) -> BTreeSet<&str> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["metadata"]["annotations"]["fleetgate.io/cluster"]
                .as_str()
                .unwrap()
        })
        .collect()
}

fn sorted(mut items: Vec<(String, String, String)>) -> Vec<(String, String, String)> {
    items.sort();
    items
}

#[test]
fn kubectl_lists_the_whole_fleet_with_a_cluster_column_and_pages_across_clusters() {
    let mut fleet = Fleet::sim(10, 5);
    fleet.serve(&["--workers", "2"], None);
    let names: Vec<String> = (1..=10).map(|k| format!("member{k}")).collect();
    let members: Vec<&str> = names.iter().map(String::as_str).collect();

    let table = fleet.kubectl_ok("fleet", &["get", "pods", "-A"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[..3], ["NAMESPACE", "CLUSTER", "NAME"], "{table}");
    let clusters: BTreeSet<&str> = lines
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(clusters, members.iter().copied().collect(), "{table}");

    // Every member's pods and ConfigMaps, each once, stamped with their cluster.
    for resource in ["pods", "configmaps"] {
        let want = sorted(fleet.member_items(&members, &["get", resource, "-A"]));
        assert!(want.len() >= 3, "{want:?}");
        assert_eq!(sorted(fleet.fleet_items(&["get", resource, "-A"])), want);
        // Paged: two objects a page, so pages end inside a member and at its end.
        let paged = fleet.fleet_items(&["get", resource, "-A", "--chunk-size", "2"]);
        assert_eq!(sorted(paged), want, "paging lost or repeated objects");
        // Selectors pass through to the members.
        let selected = fleet.fleet_items(&[
            "get",
            resource,
            "-A",
            "--field-selector",
            "metadata.namespace=kube-public",
        ]);
        let want_selected: Vec<_> = want
            .iter()
            .filter(|(_, ns, _)| ns == "kube-public")
            .cloned()
            .collect();
        assert_eq!(sorted(selected), want_selected);
    }
}

#[test]
fn one_object_a_page_one_member_at_a_time_lists_the_same() {
    let mut fleet = Fleet::sim(3, 2);
    let gateway = fleet.fleet_path("gateway.yaml");
    let yaml = std::fs::read_to_string(&gateway).unwrap();
    assert!(yaml.contains("\nspec:\n"), "{yaml}");
    let tight = yaml.replace(
        "\nspec:\n",
        "\nspec:\n  fleet: {pageSize: 1, membersAtOnce: 1}\n",
    );
    std::fs::write(&gateway, tight).unwrap();
    fleet.serve(&["--workers", "1"], None);
    let members = ["member1", "member2", "member3"];
    let want = sorted(fleet.member_items(&members, &["get", "configmaps", "-A"]));
    assert!(want.len() > 3, "{want:?}");
    assert_eq!(
        sorted(fleet.fleet_items(&["get", "configmaps", "-A"])),
        want
    );
    let paged = fleet.fleet_items(&["get", "configmaps", "-A", "--chunk-size", "3"]);
    assert_eq!(sorted(paged), want);
}

#[test]
fn each_user_sees_only_the_clusters_their_policies_allow() {
    let mut fleet = Fleet::sim(3, 2);
    fleet.serve(&["--workers", "1"], None);
    // devs (alice) may read the env=dev clusters, member1 and member3; the members let alice
    // read namespace `dev`.
    let out = fleet.kubectl_output(
        "fleet",
        &[
            "--user",
            "alice",
            "get",
            "configmaps",
            "-n",
            "dev",
            "-o",
            "json",
        ],
    );
    let text = succeeded(out, "alice's fleet list", &fleet.log_tail(20));
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let clusters = clusters_of(&list);
    assert_eq!(clusters, ["member1", "member3"].into_iter().collect());
    assert!(!text.contains("member2"), "{text}");
    // bob may reach namespace default of member1 only: a list of every namespace is refused
    // without naming a cluster, a list of `default` shows member1's.
    let all = fleet.kubectl_output("fleet", &["--user", "bob", "get", "configmaps", "-A"]);
    assert!(!all.status.success());
    let stderr = String::from_utf8_lossy(&all.stderr);
    assert!(
        stderr.contains("Forbidden") || stderr.contains("forbidden"),
        "{stderr}"
    );
    assert!(!stderr.contains("member"), "{stderr}");
    let default = fleet.kubectl_ok(
        "fleet",
        &[
            "--user",
            "bob",
            "get",
            "configmaps",
            "-n",
            "default",
            "-o",
            "json",
        ],
    );
    let list: serde_json::Value = serde_json::from_str(&default).unwrap();
    for item in list["items"].as_array().unwrap() {
        assert_eq!(
            item["metadata"]["annotations"]["fleetgate.io/cluster"],
            "member1"
        );
    }
}

#[test]
fn an_unreachable_member_is_named_in_a_warning_and_the_others_are_listed() {
    let mut fleet = Fleet::sim(2, 2);
    // A third cluster whose server nobody listens on.
    let member1 = std::fs::read_to_string(fleet.fleet_path("clusters/member1.yaml")).unwrap();
    let server = fleet.cluster_field("member1", "server");
    let closed = support::closed_port();
    let dead = member1
        .replace("name: member1", "name: member9")
        .replace(&server, &format!("https://{closed}"));
    std::fs::write(fleet.fleet_path("clusters/member9.yaml"), dead).unwrap();
    fleet.serve(&["--workers", "1"], None);

    let out = fleet.kubectl_output("fleet", &["get", "configmaps", "-A", "-o", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = succeeded(out, "fleet list with a dead member", &fleet.log_tail(20));
    assert!(
        stderr.contains("Warning") && stderr.contains("member9"),
        "{stderr}"
    );
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let clusters = clusters_of(&list);
    assert_eq!(clusters, ["member1", "member2"].into_iter().collect());
}

#[test]
fn what_the_fleet_view_does_not_serve_is_refused_saying_so() {
    let mut fleet = Fleet::sim(2, 1);
    fleet.serve(&["--workers", "1"], None);
    let create = fleet.kubectl_output("fleet", &["create", "configmap", "x", "-n", "default"]);
    assert!(!create.status.success());
    let stderr = String::from_utf8_lossy(&create.stderr);
    assert!(stderr.contains("/clusters/NAME"), "{stderr}");
    assert!(stderr.contains("cluster.fleetgate.io/NAME"), "{stderr}");
    // Discovery does not show secrets: kubectl knows no such resource type here.
    let unmerged = fleet.kubectl_output("fleet", &["get", "secrets", "-A"]);
    assert!(!unmerged.status.success());
    let stderr = String::from_utf8_lossy(&unmerged.stderr);
    assert!(
        stderr.contains(r#"the server doesn't have a resource type "secrets""#),
        "{stderr}"
    );
    // Asked for by path all the same (`--raw` takes the whole path): kube's 404, saying the view
    // does not merge them.
    let raw = fleet.kubectl_output("fleet", &["get", "--raw", "/fleet/api/v1/secrets"]);
    let stderr = String::from_utf8_lossy(&raw.stderr);
    assert!(stderr.contains("does not merge secrets"), "{stderr}");
}

#[test]
fn a_named_object_is_served_by_the_one_cluster_that_has_it() {
    let mut fleet = Fleet::sim(3, 1);
    fleet.serve(&["--workers", "1"], None);
    // A ConfigMap and a pod that only member2 has.
    fleet.kubectl_ok(
        "member2",
        &[
            "create",
            "configmap",
            "only-here",
            "-n",
            "default",
            "--from-literal=k=v",
        ],
    );
    fleet.kubectl_ok(
        "member2",
        &["run", "solo", "--image=busybox", "-n", "default"],
    );

    let value_in = |context: &str| {
        fleet.kubectl_ok(
            context,
            &[
                "get",
                "configmap",
                "only-here",
                "-n",
                "default",
                "-o",
                "jsonpath={.data.k}",
            ],
        )
    };
    let got = value_in("fleet");
    assert_eq!(got, "v");
    // Read through the fleet view, the object says where it lives, as list items do.
    let read: serde_json::Value = serde_json::from_str(&fleet.kubectl_ok(
        "fleet",
        &[
            "get",
            "configmap",
            "only-here",
            "-n",
            "default",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    let annotations = &read["metadata"]["annotations"];
    assert_eq!(annotations["fleetgate.io/cluster"], "member2", "{read}");
    assert_eq!(
        annotations["resource.karmada.io/cached-from-cluster"],
        "member2"
    );
    let table = fleet.kubectl_ok("fleet", &["get", "pod", "solo", "-n", "default"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[..2], ["CLUSTER", "NAME"], "{table}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["member2", "solo"], "{table}");
    fleet.kubectl_ok(
        "fleet",
        &[
            "patch",
            "configmap",
            "only-here",
            "-n",
            "default",
            "-p",
            r#"{"data":{"k":"w"}}"#,
        ],
    );
    let patched = value_in("member2");
    assert_eq!(patched, "w", "the patch reached the owner");
    let logs = fleet.kubectl_ok("fleet", &["logs", "solo", "-n", "default", "--tail", "1"]);
    assert!(!logs.is_empty(), "no log line from the owner");
    // exec: an upgrade (WebSocket over h2, or SPDY) carried to the owner.
    let echoed = fleet.kubectl_ok(
        "fleet",
        &["exec", "solo", "-n", "default", "--", "echo", "hi"],
    );
    assert_eq!(echoed.trim(), "hi");
    fleet.kubectl_ok(
        "fleet",
        &["delete", "configmap", "only-here", "-n", "default"],
    );
    let gone = fleet.kubectl_output(
        "member2",
        &["get", "configmap", "only-here", "-n", "default"],
    );
    assert!(!gone.status.success(), "the delete reached the owner");

    // Not anywhere: kube's 404. In every cluster (the seed pod `hello`): a 409 naming them.
    let missing = fleet.kubectl_output("fleet", &["get", "configmap", "nowhere", "-n", "default"]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("NotFound") && stderr.contains("nowhere"),
        "{stderr}"
    );
    let several = fleet.kubectl_output("fleet", &["get", "pod", "hello", "-n", "default"]);
    let stderr = String::from_utf8_lossy(&several.stderr);
    assert!(
        stderr.contains("member1, member2, member3")
            && stderr.contains("/fleet/cluster.fleetgate.io/NAME")
            && stderr.contains("/clusters/NAME"),
        "{stderr}"
    );
}

#[test]
fn discovery_through_the_fleet_view_shows_only_the_merged_kinds() {
    let mut fleet = Fleet::sim(2, 1);
    fleet.serve(&["--workers", "1"], None);
    let names = |text: String| -> BTreeSet<String> { text.lines().map(str::to_owned).collect() };
    let served = names(fleet.kubectl_ok("member1", &["api-resources", "-o", "name"]));
    assert!(served.contains("secrets"), "{served:?}");
    let want: BTreeSet<String> = MERGED
        .iter()
        .filter(|n| served.contains(**n))
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        want.len(),
        MERGED.len(),
        "the members serve every merged kind"
    );
    // kubectl 1.32 asks for aggregated discovery first and goes on with the legacy documents.
    let karmada_search = "/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy";
    for prefix in ["/fleet", karmada_search] {
        let listed = names(fleet.kubectl_at_ok(prefix, None, &["api-resources", "-o", "name"]));
        assert_eq!(listed, want, "{prefix}");
    }
    // Subresources of merged kinds stay (kubectl logs and exec need them); the rest goes.
    let core: serde_json::Value =
        serde_json::from_str(&fleet.kubectl_ok("fleet", &["get", "--raw", "/fleet/api/v1"]))
            .unwrap();
    let resources: BTreeSet<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for kept in ["pods", "pods/log", "pods/exec", "configmaps"] {
        assert!(resources.contains(kept), "{resources:?}");
    }
    assert!(
        !resources.iter().any(|r| r.starts_with("secrets")),
        "{resources:?}"
    );
    let groups = fleet.kubectl_ok("fleet", &["api-versions"]);
    let groups: BTreeSet<&str> = groups.lines().collect();
    assert_eq!(groups, ["apps/v1", "v1"].into_iter().collect());
    // A group with no merged kind is kube's 404, and the version stays as the member says it.
    let batch = fleet.kubectl_output("fleet", &["get", "--raw", "/fleet/apis/batch/v1"]);
    assert!(!batch.status.success());
    assert!(
        String::from_utf8_lossy(&batch.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&batch.stderr)
    );
    // A discovery path with an empty segment is refused before discovery sees it: a 400 that
    // names the empty segment.
    let hostile = fleet.kubectl_output("fleet", &["get", "--raw", "/fleet/apis//v1"]);
    assert!(!hostile.status.success());
    let said = String::from_utf8_lossy(&hostile.stderr);
    assert!(
        said.contains("BadRequest") && said.contains("empty segment"),
        "{said}"
    );
    let version = fleet.kubectl_ok("fleet", &["get", "--raw", "/fleet/version"]);
    assert!(version.contains("gitVersion"), "{version}");
    // The merged kinds work as kubectl names them.
    for resource in ["pods", "deployments"] {
        fleet.kubectl_ok("fleet", &["get", resource, "-A"]);
    }
}

#[test]
fn a_hint_aims_a_request_at_one_cluster_and_never_reveals_a_cluster_out_of_reach() {
    let mut fleet = Fleet::sim(3, 1);
    fleet.serve(&["--workers", "1"], None);
    // Every member has the seed pod `hello`: by name, the fleet view cannot tell which.
    let ambiguous = fleet.kubectl_output("fleet", &["get", "pod", "hello", "-n", "default"]);
    assert!(!ambiguous.status.success());
    let pod = ["get", "pod", "hello", "-n", "default"];
    let member2 = fleet.uid("member2", &pod);
    assert_ne!(member2, fleet.uid("member1", &pod));
    let aimed = "/fleet/cluster.fleetgate.io/member2";
    let mut args = pod.to_vec();
    args.extend(["-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(fleet.kubectl_at_ok(aimed, None, &args), member2);
    let logs = fleet.kubectl_at_ok(aimed, None, &["logs", "hello", "-n", "default", "--tail=1"]);
    assert!(!logs.is_empty(), "no log line from member2");
    // Aimed, the view is that one cluster's: discovery shows its merged kinds, a list its
    // objects only.
    let listed = fleet.kubectl_at_ok(aimed, None, &["api-resources", "-o", "name"]);
    assert_eq!(listed.lines().count(), MERGED.len(), "{listed}");
    let pods = fleet.kubectl_at_ok(aimed, None, &["get", "pods", "-A", "-o", "name"]);
    let direct = fleet.kubectl_ok("member2", &["get", "pods", "-A", "-o", "name"]);
    assert_eq!(pods, direct);

    // alice reaches member1 and member3 (env=dev). Aimed at member2, which she may not reach,
    // she is answered exactly as when aimed at a cluster that does not exist.
    let at = |cluster: &str| format!("/fleet/cluster.fleetgate.io/{cluster}");
    let list = |cluster: &str| {
        let path = format!("{}/api/v1/namespaces/dev/configmaps", at(cluster));
        fleet.kubectl_output("fleet", &["--user", "alice", "get", "--raw", &path])
    };
    let allowed = list("member3");
    assert!(allowed.status.success(), "{allowed:?}");
    let hidden = list("member2");
    let missing = list("member9");
    assert!(!hidden.status.success());
    let hidden_text = String::from_utf8_lossy(&hidden.stderr).replace("member2", "NAME");
    let missing_text = String::from_utf8_lossy(&missing.stderr).replace("member9", "NAME");
    assert_eq!(hidden_text, missing_text);
    assert!(hidden_text.contains("NotFound"), "{hidden_text}");
    // The same for a named object and for discovery (kubectl's own discovery cache is keyed by
    // server, not user: `--raw` shows what the gateway answers).
    for tail in ["/api/v1/namespaces/dev/pods/hello", "/api", "/version"] {
        let get = |cluster: &str| {
            let path = format!("{}{tail}", at(cluster));
            let out = fleet.kubectl_output("fleet", &["--user", "alice", "get", "--raw", &path]);
            String::from_utf8_lossy(&out.stderr).replace(cluster, "NAME")
        };
        assert_eq!(get("member2"), get("member9"), "{tail}");
    }
}

#[test]
fn a_create_goes_to_create_in_for_whoever_may_reach_it_there() {
    let mut fleet = Fleet::sim(2, 1);
    fleet.serve(&["--workers", "1"], None);
    let exists_in = |fleet: &Fleet, context: &str, name: &str| {
        fleet
            .kubectl_output(context, &["get", "configmap", name, "-n", "default"])
            .status
            .success()
    };
    // Without createIn: refused, saying how to create in one cluster; aimed: created there.
    let refused = fleet.kubectl_output("fleet", &["create", "configmap", "a", "-n", "default"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("cannot create") && stderr.contains("cluster.fleetgate.io/NAME"),
        "{stderr}"
    );
    let aimed = "/fleet/cluster.fleetgate.io/member2";
    fleet.kubectl_at_ok(aimed, None, &["create", "configmap", "a", "-n", "default"]);
    assert!(exists_in(&fleet, "member2", "a") && !exists_in(&fleet, "member1", "a"));

    fleet.set_fleet_spec("createIn: member2");
    fleet.serve(&["--workers", "1"], None);
    fleet.kubectl_ok("fleet", &["create", "configmap", "b", "-n", "default"]);
    assert!(exists_in(&fleet, "member2", "b") && !exists_in(&fleet, "member1", "b"));
    // The new object is found by name through the view, in its one cluster.
    fleet.kubectl_ok("fleet", &["get", "configmap", "b", "-n", "default"]);
    // bob may create in member1's `default` only: createIn is out of his reach, so his create is
    // the 405 it would be without it, and member2 is not named.
    let bob = fleet.kubectl_output(
        "fleet",
        &["--user", "bob", "create", "configmap", "c", "-n", "default"],
    );
    assert!(!bob.status.success());
    let stderr = String::from_utf8_lossy(&bob.stderr);
    assert!(
        stderr.contains("cannot create") && !stderr.contains("member2"),
        "{stderr}"
    );
    assert!(!exists_in(&fleet, "member2", "c") && !exists_in(&fleet, "member1", "c"));
}

#[test]
fn server_side_apply_of_a_new_object_is_routed_as_a_create() {
    let mut fleet = Fleet::sim(2, 1);
    fleet.serve(&["--workers", "1"], None);
    // JSON, which kubectl reads as YAML's subset: the gateway's configuration directory takes
    // every `.yaml` file in it as its own.
    let manifest = |fleet: &Fleet, name: &str, value: &str| {
        let path = fleet.path(&format!("{name}.json"));
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"k": value},
        });
        std::fs::write(&path, object.to_string()).unwrap();
        path.display().to_string()
    };
    let apply = |fleet: &Fleet, user: Option<&str>, file: &str| {
        let mut args = vec!["apply", "--server-side", "-f", file];
        if let Some(user) = user {
            args.splice(0..0, ["--user", user]);
        }
        fleet.kubectl_output("fleet", &args)
    };
    let value_in = |fleet: &Fleet, context: &str, name: &str| {
        let out = fleet.kubectl_output(context, &get_configmap(name, "jsonpath={.data.k}"));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // Without createIn: no cluster to create in, the 405 a create gets (not "not found").
    let file = manifest(&fleet, "applied", "one");
    let refused = apply(&fleet, None, &file);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("cannot create")
            && stderr.contains("cluster.fleetgate.io/NAME"),
        "{stderr}"
    );
    assert_eq!(value_in(&fleet, "member1", "applied"), None);
    assert_eq!(value_in(&fleet, "member2", "applied"), None);

    fleet.set_fleet_spec("createIn: member2");
    fleet.serve(&["--workers", "1"], None);
    // `apply --server-side` of NAME with VALUE (it must succeed), then VALUE is in `context`.
    let applied_in = |context: &str, name: &str, value: &str, what: &str| {
        let file = manifest(&fleet, name, value);
        succeeded(apply(&fleet, None, &file), what, &fleet.log_tail(20));
        assert_eq!(
            value_in(&fleet, context, name).as_deref(),
            Some(value),
            "{what}"
        );
    };
    // With createIn: created there, as a create would be.
    applied_in(
        "member2",
        "applied",
        "one",
        "apply --server-side of a new object",
    );
    assert_eq!(value_in(&fleet, "member1", "applied"), None);
    // Applied again, it exists: it goes to its one owner.
    applied_in("member2", "applied", "two", "apply again");
    // An object only member1 has is applied in member1, not created in createIn's cluster.
    fleet.kubectl_ok(
        "member1",
        &[
            "create",
            "configmap",
            "solo",
            "-n",
            "default",
            "--from-literal=k=zero",
        ],
    );
    applied_in("member1", "solo", "three", "apply to member1's");
    assert_eq!(value_in(&fleet, "member2", "solo"), None);
    // Any other patch of an object no cluster has is kube's 404.
    let patch = fleet.kubectl_output(
        "fleet",
        &[
            "patch",
            "configmap",
            "nowhere",
            "-n",
            "default",
            "-p",
            r#"{"data":{"k":"v"}}"#,
        ],
    );
    let stderr = String::from_utf8_lossy(&patch.stderr);
    assert!(
        !patch.status.success() && stderr.contains("not found"),
        "{stderr}"
    );
    // bob may not reach createIn's cluster: the same 405, which does not name member2.
    let file = manifest(&fleet, "bobs", "four");
    let bob = apply(&fleet, Some("bob"), &file);
    let stderr = String::from_utf8_lossy(&bob.stderr);
    assert!(
        !bob.status.success() && stderr.contains("cannot create") && !stderr.contains("member2"),
        "{stderr}"
    );
    assert_eq!(value_in(&fleet, "member1", "bobs"), None);
    assert_eq!(value_in(&fleet, "member2", "bobs"), None);
}

#[test]
fn kubectl_auth_can_i_through_the_fleet_is_yes_only_where_every_cluster_says_yes() {
    let mut fleet = Fleet::sim(2, 1);
    // member3: member2 again, reached without impersonation, so the member sees the gateway's
    // own identity, which may list and watch but not get: a cluster whose RBAC says otherwise.
    let member2 = std::fs::read_to_string(fleet.fleet_path("clusters/member2.yaml")).unwrap();
    let member3 = member2
        .replace("name: member2", "name: member3")
        .replace("impersonation: true", "impersonation: false");
    assert_ne!(member3, member2);
    std::fs::write(fleet.fleet_path("clusters/member3.yaml"), member3).unwrap();
    fleet.serve(&["--workers", "1"], None);
    let can_i = |fleet: &Fleet, args: &[&str], http1: bool| {
        let mut command = support::kubectl::kubectl_command(&fleet.gateway_kubeconfig(), "fleet");
        if http1 {
            // client-go's switch for HTTP/1.1: the gateway's other front-end.
            command.env("DISABLE_HTTP2", "1");
        }
        let out = command
            .args(["--request-timeout", "20s", "auth", "can-i"])
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), stdout, stderr)
    };
    let differ = "allowed on member1, member2; denied on member3";
    for (round, http1) in [false, true].into_iter().enumerate() {
        // Every cluster allows it: yes, and no warning.
        let (yes, stdout, stderr) = can_i(&fleet, &["list", "configmaps", "-A"], http1);
        assert!(
            yes && stdout == "yes",
            "{stdout} {stderr}\n{}",
            fleet.log_tail(20)
        );
        assert!(!stderr.contains("Warning"), "{stderr}");
        // member3 does not: no, with the clusters named.
        let (yes, stdout, stderr) = can_i(&fleet, &["get", "configmaps", "-n", "default"], http1);
        assert!(
            !yes && stdout == format!("no - {differ}"),
            "{stdout} {stderr}"
        );
        assert!(stderr.contains(&format!("Warning: {differ}")), "{stderr}");
        // Each review is one request of the fleet view, over h2 as over HTTP/1.1.
        let metrics = fleet.admin_get("/metrics");
        let counted = format!(
            "fleetgate_fleet_requests_total{{verb=\"create\",code=\"200\"}} {}",
            2 * (round + 1)
        );
        assert!(
            metrics.lines().any(|line| line == counted),
            "{counted} (http1: {http1}):\n{metrics}"
        );
    }
    // karmada-search's path is the same view.
    let karmada = "/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy";
    let args = ["auth", "can-i", "get", "configmaps", "-n", "default"];
    let out = fleet.kubectl_at(karmada, None, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), format!("no - {differ}"));
    // Who am I: one member's answer. What may I do (rules): per cluster, so aimed at one.
    let whoami = fleet.kubectl_ok("fleet", &["auth", "whoami", "-o", "json"]);
    let review: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(
        review["status"]["userInfo"]["username"], "admin",
        "{review}"
    );
    let (listed, _, stderr) = can_i(&fleet, &["--list"], false);
    assert!(
        !listed && stderr.contains("cluster.fleetgate.io/NAME"),
        "{stderr}"
    );
    let rules = fleet.kubectl_at_ok(
        "/fleet/cluster.fleetgate.io/member1",
        None,
        &["auth", "can-i", "--list"],
    );
    assert!(rules.contains("selfsubjectaccessreviews"), "{rules}");

    // A cluster that cannot answer is a no, and is named.
    let closed = support::closed_port();
    let server = member2
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    let dead = member2
        .replace("name: member2", "name: member9")
        .replace(&server, &format!("https://{closed}"));
    std::fs::write(fleet.fleet_path("clusters/member9.yaml"), dead).unwrap();
    fleet.serve(&["--workers", "1"], None);
    let (yes, stdout, stderr) = can_i(&fleet, &["list", "configmaps", "-A"], false);
    assert!(!yes && stdout.starts_with("no - "), "{stdout} {stderr}");
    assert!(
        stderr.contains("Warning: allowed on member1, member2, member3; no answer from member9"),
        "{stderr}"
    );
}
