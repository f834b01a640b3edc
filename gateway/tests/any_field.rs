//! Field selectors on any field of a cached resource (issue 34, docs/cache.md) as users meet
//! them: with `spec.cache` on for pods, a LIST through the gateway with a selector on
//! `status.phase`, `spec.nodeName`, an annotation (its value escaped as kube escapes it), a
//! container's image or a label gives exactly the items a plain filter of the member's own full
//! list gives, from memory, where the member itself refuses most of them with a 400; a watch
//! with such a selector gets an ADDED when an object changed on the member starts matching and
//! a DELETED when it stops; `kubectl get --field-selector` through the gateway agrees.

mod support;

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::Api;
use serde_json::{json, Value};
use support::fleet::Fleet;
use support::kubectl::{kube_client, kubectl};

/// One member with pods in `default` and `other` that differ in the fields selected on, and a
/// gateway caching pods.
fn cached_pods() -> Fleet {
    let mut fleet = Fleet::sim(1, 0);
    fleet.edit_gateway(|gateway| {
        let cache = serde_yaml::from_str::<serde_yaml::Value>(
            "resources: [{group: '', version: v1, resource: pods}]\nmemoryBudget: 64Mi\n",
        )
        .unwrap();
        gateway["spec"]
            .as_mapping_mut()
            .unwrap()
            .insert("cache".into(), cache);
    });
    fleet.serve(&["--workers", "1"], None);
    fleet.direct_ok("member1", &["create", "namespace", "other"]);
    let pod = |namespace: &str, name: &str, annotations: Value, image: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                         "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": image}]}})
    };
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        pod("default", "p-a", json!({"note": "a,b=c\\d"}), "busybox"),
        pod("default", "p-b", json!({"example.com/owner": "team-x"}), "envoy"),
        pod("default", "p-c", json!({}), "busybox"),
        pod("other", "p-d", json!({"example.com/owner": "team-y"}), "busybox"),
    ]});
    let file = fleet.path("pods.json");
    std::fs::write(&file, list.to_string()).unwrap();
    fleet.direct_ok("member1", &["create", "-f", file.to_str().unwrap()]);
    // p-c is not running (the sim's pods start Running).
    set_phase(&fleet, "default", "p-c", "Pending");
    fleet
}

/// Sets a pod's `status.phase` on the member (its status subresource, as a kubelet would).
fn set_phase(fleet: &Fleet, namespace: &str, name: &str, phase: &str) {
    let patch = json!({"status": {"phase": phase}}).to_string();
    fleet.direct_ok(
        "member1",
        &[
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    );
}

/// A requirement: a JSON path, `=` (true) or `!=`, a value.
type Term<'a> = (&'a [&'a str], bool, &'a str);

/// The selector's text in kube's grammar: keys joined by dots, values escaped.
fn selector_text(terms: &[Term<'_>]) -> String {
    terms
        .iter()
        .map(|(path, equal, value)| {
            let value = value
                .replace('\\', "\\\\")
                .replace(',', "\\,")
                .replace('=', "\\=");
            format!(
                "{}{}{value}",
                path.join("."),
                if *equal { "=" } else { "!=" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The test's own plain filter: each path read from the item's JSON (a missing field is ""),
/// compared as text.
fn plain_filter(items: &[Value], terms: &[Term<'_>]) -> Vec<Value> {
    items
        .iter()
        .filter(|item| {
            terms.iter().all(|(path, equal, value)| {
                let found = path.iter().try_fold(*item, |node, key| match node {
                    Value::Array(elements) => elements.get(key.parse::<usize>().ok()?),
                    node => node.get(*key),
                });
                let text = match found {
                    None | Some(Value::Null) => "",
                    Some(Value::String(s)) => s,
                    Some(other) => panic!("{other} is no text"),
                };
                (text == *value) == *equal
            })
        })
        .cloned()
        .collect()
}

/// A query value, every byte but ASCII letters and digits percent-encoded.
fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn names(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| format!("{}/{}", i["metadata"]["namespace"], i["metadata"]["name"]))
        .collect()
}

const RUNNING: Term = (&["status", "phase"], true, "Running");
const NOT_RUNNING: Term = (&["status", "phase"], false, "Running");
const ON_A_NODE: Term = (&["spec", "nodeName"], false, "");
const NOTE: Term = (&["metadata", "annotations", "note"], true, "a,b=c\\d");
const OWNER: Term = (
    &["metadata", "annotations", "example.com/owner"],
    true,
    "team-x",
);
const NOT_OWNER: Term = (
    &["metadata", "annotations", "example.com/owner"],
    false,
    "team-x",
);
const BUSYBOX: Term = (&["spec", "containers", "0", "image"], true, "busybox");
const APP_B: Term = (&["metadata", "labels", "app"], true, "p-b");
const NO_NODE: Term = (&["spec", "nodeName"], true, "");
const NAMESPACE: Term = (&["metadata", "namespace"], true, "default");

#[test]
fn lists_select_any_field_as_a_plain_filter_of_the_members_own_list() {
    let fleet = cached_pods();
    let member_list = |query: &str| -> Value {
        let out = fleet.direct_ok(
            "member1",
            &["get", "--raw", &format!("/api/v1/pods{query}")],
        );
        serde_json::from_str(&out).unwrap()
    };
    let everything = member_list("");
    let all = everything["items"].as_array().unwrap();
    // Ours and the sim's own pod `hello`.
    assert_eq!(all.len(), 5, "{everything}");
    let from_memory = || {
        fleet
            .metric("fleetgate_cache_lists_total{served=\"memory\"}")
            .unwrap_or(0)
    };
    let before = from_memory();
    let cases: &[&[Term]] = &[
        &[RUNNING],
        &[NOT_RUNNING],
        &[ON_A_NODE],
        &[NO_NODE],
        &[NOTE],
        &[OWNER],
        &[NOT_OWNER, NAMESPACE],
        &[BUSYBOX],
        &[BUSYBOX, RUNNING],
        &[APP_B, ON_A_NODE],
    ];
    let mut served = 0;
    for terms in cases {
        let selector = selector_text(terms);
        let want = plain_filter(all, terms);
        for (scope, read) in [("", ""), ("", "&resourceVersion=0"), ("default", "")] {
            let path = match scope {
                "" => "/api/v1/pods".to_owned(),
                ns => format!("/api/v1/namespaces/{ns}/pods"),
            };
            let query = format!("?fieldSelector={}{read}", encode(&selector));
            let through: Value = serde_json::from_str(&fleet.kubectl_ok(
                "member1",
                &["get", "--raw", &format!("/clusters/member1{path}{query}")],
            ))
            .unwrap();
            let want: Vec<Value> = want
                .iter()
                .filter(|i| scope.is_empty() || i["metadata"]["namespace"] == scope)
                .cloned()
                .collect();
            let got = through["items"].as_array().unwrap();
            assert_eq!(names(got), names(&want), "{selector} in {scope:?}{read}");
            assert_eq!(*got, want, "{selector} in {scope:?}{read}");
            assert_eq!(through["kind"], "PodList");
            served += 1;
        }
    }
    assert_eq!(from_memory(), before + served, "every LIST from memory");
    // The member itself refuses a selector on an annotation (a 400); the gateway served it.
    let refused = kubectl(
        &fleet.fleet_path("kubeconfig"),
        "member1",
        &[
            "get",
            "--raw",
            &format!(
                "/api/v1/pods?fieldSelector={}",
                encode(&selector_text(&[OWNER]))
            ),
        ],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("field label not supported"));
    // kubectl: `-o json` equals the member's own answer to the field it serves, and a Table on
    // an annotation lists the pods whose annotation it names.
    let json = |out: String| -> Vec<Value> {
        serde_json::from_str::<Value>(&out).unwrap()["items"]
            .as_array()
            .unwrap()
            .clone()
    };
    let args = [
        "get",
        "pods",
        "-A",
        "--field-selector",
        "status.phase=Running",
        "-o",
        "json",
    ];
    let through = json(fleet.kubectl_ok("member1", &args));
    assert_eq!(through, json(fleet.direct_ok("member1", &args)));
    assert_eq!(names(&through), names(&plain_filter(all, &[RUNNING])));
    // kubectl's Tables: the names in the rows of `kubectl get pods -A --field-selector SELECTOR`.
    let rows = |selector: &str| -> Vec<String> {
        let args = [
            "get",
            "pods",
            "-A",
            "--no-headers",
            "--field-selector",
            selector,
        ];
        let table = fleet.kubectl_ok("member1", &args);
        table
            .lines()
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        rows("metadata.annotations.example.com/owner!=team-x,metadata.annotations.note="),
        ["hello", "p-c", "p-d"]
    );
    // A Table on another field: read from the cache's JSON objects beside the Table's rows.
    let want: Vec<String> = plain_filter(all, &[BUSYBOX])
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        rows("spec.containers.0.image=busybox,status.phase!=Failed"),
        want
    );
    // `-o name` asks for JSON: any field.
    let named = fleet.kubectl_ok(
        "member1",
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.containers.0.image!=busybox",
            "-o",
            "name",
        ],
    );
    // The sim's own pod runs busybox:1.37.
    assert_eq!(named.lines().collect::<Vec<_>>(), ["pod/hello", "pod/p-b"]);
    assert_eq!(
        from_memory(),
        before + served + 4,
        "kubectl's LISTs from memory"
    );
    // A consistent read the cache cannot show itself fresh for (the member's resourceVersion
    // moved with a configmap; the pods' watch sees no event to tell): a field the member serves
    // goes to the member; one it does not is answered from memory, with a Warning.
    fleet.direct_ok("member1", &["create", "configmap", "moves-the-version"]);
    let from_member = || {
        fleet
            .metric("fleetgate_cache_lists_total{served=\"member\"}")
            .unwrap_or(0)
    };
    let (memory, member) = (from_memory(), from_member());
    let path = |terms: &[Term]| {
        format!(
            "/clusters/member1/api/v1/pods?fieldSelector={}",
            encode(&selector_text(terms))
        )
    };
    let served = fleet.kubectl_output("member1", &["get", "--raw", &path(&[OWNER])]);
    assert!(served.status.success());
    let warned = String::from_utf8_lossy(&served.stderr);
    assert!(
        warned.contains("Warning: listed from the gateway's cache as of resourceVersion"),
        "{warned}"
    );
    let list: Value = serde_json::from_slice(&served.stdout).unwrap();
    assert_eq!(
        *list["items"].as_array().unwrap(),
        plain_filter(all, &[OWNER])
    );
    fleet.kubectl_ok("member1", &["get", "--raw", &path(&[RUNNING])]);
    assert_eq!((from_memory(), from_member()), (memory + 1, member + 1));
}

#[test]
fn a_watch_gets_objects_that_start_and_stop_matching_as_added_and_deleted() {
    let fleet = cached_pods();
    // The fleet outlives the runtime its clients run on.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let pods = |kubeconfig: std::path::PathBuf| async move {
            Api::<Pod>::namespaced(kube_client(&kubeconfig, "member1").await, "default")
        };
        let through = pods(fleet.gateway_kubeconfig()).await;
        let member = pods(fleet.fleet_path("kubeconfig")).await;
        // An informer's way: a LIST, then a watch from its resourceVersion.
        let running = "status.phase=Running";
        let listed = through
            .list(&ListParams::default().fields(running))
            .await
            .unwrap();
        let listed_names: Vec<String> = listed
            .items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(listed_names, ["hello", "p-a", "p-b"]);
        let rv = listed.metadata.resource_version.unwrap();
        let params = WatchParams::default().fields(running).timeout(60);
        let mut from_list = through.watch(&params, &rv).await.unwrap().boxed();
        // And a watch from the cache's current objects, on an annotation.
        let gold = "metadata.annotations.tier=gold";
        let params = WatchParams::default().fields(gold).timeout(60);
        let mut current = through.watch(&params, "0").await.unwrap().boxed();

        let annotate = |name: &'static str, tier: Option<&'static str>| {
            let member = member.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {"tier": tier}}});
                member
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        };
        let phase = |name: &'static str, phase: &'static str| {
            let member = member.clone();
            async move {
                let patch = json!({"status": {"phase": phase}});
                member
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        };
        phase("p-c", "Running").await; // starts matching: ADDED
        phase("p-a", "Failed").await; // stops: DELETED
        annotate("p-a", Some("gold")).await; // not running: nothing for the first
        annotate("p-b", Some("silver")).await; // still running: MODIFIED
        annotate("p-b", Some("gold")).await;
        annotate("p-a", None).await;
        member.delete("p-b", &Default::default()).await.unwrap();
        let expected = [
            "ADDED p-c",
            "DELETED p-a",
            "MODIFIED p-b",
            "MODIFIED p-b",
            "DELETED p-b",
        ];
        // Both watches are the gateway's: the member holds one watch of pods, the cache's.
        let metrics = kubectl(
            &fleet.fleet_path("kubeconfig"),
            "member1",
            &["get", "--raw", "/metrics"],
        );
        assert_eq!(support::fleet::sim_open_watches(&metrics, "pods"), 1);
        let seen = events(&mut from_list, expected.len()).await;
        assert_eq!(seen, expected);
        let seen = events(&mut current, 4).await;
        assert_eq!(
            seen,
            ["ADDED p-a", "ADDED p-b", "DELETED p-a", "DELETED p-b"]
        );

        // A watch from a LIST's resourceVersion, after objects entered and left the selector
        // since: what the member's own watch from there gets (it serves status.phase).
        let listed = through
            .list(&ListParams::default().fields(running))
            .await
            .unwrap();
        let rv = listed.metadata.resource_version.unwrap();
        phase("p-a", "Running").await; // enters
        phase("p-c", "Succeeded").await; // leaves
        let params = WatchParams::default().fields(running).timeout(60);
        let mut ours = through.watch(&params, &rv).await.unwrap().boxed();
        let mut members = member.watch(&params, &rv).await.unwrap().boxed();
        annotate("hello", Some("gold")).await; // stays
        member.delete("p-c", &Default::default()).await.unwrap(); // was not running
        annotate("p-a", Some("gold")).await;
        let theirs = events(&mut members, 4).await;
        assert_eq!(
            theirs,
            ["ADDED p-a", "DELETED p-c", "MODIFIED hello", "MODIFIED p-a"]
        );
        assert_eq!(events(&mut ours, 4).await, theirs);
    });
}

/// The next `count` events of a watch (bookmarks aside), as `TYPE NAME`.
async fn events(
    stream: &mut (impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
    count: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.try_next()).await;
        let event = next
            .unwrap_or_else(|_| panic!("no event after {seen:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the watch ended after {seen:?}"));
        let (kind, pod) = match event {
            WatchEvent::Added(pod) => ("ADDED", pod),
            WatchEvent::Modified(pod) => ("MODIFIED", pod),
            WatchEvent::Deleted(pod) => ("DELETED", pod),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("{e:?} after {seen:?}"),
        };
        seen.push(format!("{kind} {}", pod.metadata.name.unwrap()));
    }
    seen
}

/// What is not served: a selector kube's grammar refuses, or a field that is no path, goes to
/// the member and gets its 400 exactly, and so does any field of a resource that is shared but
/// not cached.
#[test]
fn a_malformed_selector_and_a_resource_not_cached_get_the_members_400() {
    let mut fleet = Fleet::sim(1, 0);
    fleet.edit_gateway(|gateway| {
        let spec = gateway["spec"].as_mapping_mut().unwrap();
        let yaml = |text: &str| serde_yaml::from_str::<serde_yaml::Value>(text).unwrap();
        spec.insert(
            "cache".into(),
            yaml("resources: [{group: '', version: v1, resource: pods}]\nmemoryBudget: 64Mi\n"),
        );
        spec.insert(
            "sharedWatches".into(),
            yaml("resources: [{group: '', version: v1, resource: configmaps}, {group: '', version: v1, resource: pods}]\n"),
        );
    });
    fleet.serve(&["--workers", "1"], None);
    for (path, said) in [
        (
            "/api/v1/pods?fieldSelector=status.phase%3DRun%3Dning",
            "unescaped character in value",
        ),
        (
            "/api/v1/pods?watch=1&fieldSelector=metadata.annotations.x%3Da%5Cb",
            "invalid escape sequence",
        ),
        (
            "/api/v1/pods?fieldSelector=status.phase",
            "can't understand",
        ),
        // A field that is no path (an empty key).
        (
            "/api/v1/pods?fieldSelector=status..phase%3DRunning",
            "field label not supported",
        ),
        (
            "/api/v1/configmaps?fieldSelector=data.k%3Dv",
            "is not a known field selector",
        ),
        (
            "/api/v1/configmaps?watch=1&fieldSelector=data.k%3Dv",
            "is not a known field selector",
        ),
    ] {
        let at_member = kubectl(
            &fleet.fleet_path("kubeconfig"),
            "member1",
            &["get", "--raw", path],
        );
        let through = fleet.kubectl_output(
            "member1",
            &["get", "--raw", &format!("/clusters/member1{path}")],
        );
        let member_said = String::from_utf8_lossy(&at_member.stderr);
        assert!(!at_member.status.success(), "{path}");
        assert!(member_said.contains(said), "{path}: {member_said}");
        assert!(member_said.contains("BadRequest"), "{path}: {member_said}");
        assert_eq!(
            String::from_utf8_lossy(&through.stderr),
            member_said,
            "{path}"
        );
    }
}
