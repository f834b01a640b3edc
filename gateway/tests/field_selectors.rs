//! Field selectors on pods, asked of a simulated member directly (no gateway in between): the
//! member answers exactly the selectors the gateway's reading accepts (`parse_any`, then
//! `member_supports` for each field) and refuses the others with a 400; and what it answers is
//! what the gateway's any-field matcher, reading the member's fields as the member does, selects
//! from the member's own unfiltered list. The sim shares no selector code with the gateway.

mod support;

use std::collections::BTreeSet;

use fleetgate::watch::selector::member::member_supports;
use fleetgate::watch::selector::{parse_any, Reading};
use support::fleet::Fleet;
use support::kubectl::{kubectl, ran};

/// A query value with everything but unreserved characters percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn names(list: &serde_json::Value) -> BTreeSet<String> {
    list["items"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_member_and_the_gateway_agree_on_pod_field_selectors() {
    let fleet = Fleet::sim(1, 2);
    let kubeconfig = fleet.fleet_path("kubeconfig");
    // Pods that differ in the fields selectors read, beside the sim's own running pods.
    let pod = |name: &str, spec: serde_json::Value| {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "main", "image": "busybox"}]);
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": spec})
    };
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        pod("fs-a", serde_json::json!({"nodeName": "node-a", "restartPolicy": "Never"})),
        pod("fs-b", serde_json::json!({"nodeName": "node-b", "serviceAccountName": "robot"})),
        pod("fs-c", serde_json::json!({"schedulerName": "custom"})),
    ]});
    let file = fleet.path("pods.json");
    std::fs::write(&file, list.to_string()).unwrap();
    ran(
        kubectl(
            &kubeconfig,
            "member1",
            &["create", "-f", file.to_str().unwrap()],
        ),
        "kubectl create",
    );
    let get = |path: &str| kubectl(&kubeconfig, "member1", &["get", "--raw", path]);
    let all: serde_json::Value =
        serde_json::from_slice(&ran(get("/api/v1/pods"), "list pods").stdout).unwrap();
    assert!(names(&all).len() >= 4, "{all}");

    let mut answered = 0;
    for selector in [
        "",
        ",",
        "status.phase=Running",
        "status.phase!=Running",
        "status.phase==Pending",
        "spec.nodeName=",
        "spec.nodeName!=",
        "spec.nodeName=node-a,status.phase!=Running",
        "spec.host=node-b",
        "spec.restartPolicy=Never",
        "spec.restartPolicy!=Always,,",
        "spec.schedulerName=custom",
        "spec.serviceAccountName=robot",
        "status.podIP=",
        "status.podIPs=",
        "status.podIPs!=",
        "status.nominatedNodeName=",
        "metadata.name=fs-a",
        "metadata.namespace==default,metadata.name!=fs-b",
        r"metadata.name=fs\,a",
        // Refused by the member, and so by the gateway's reading.
        "status.hostIP=10.0.0.10",
        "spec.hostNetwork=false",
        " status.phase=Running",
        "metadata.labels.app=web",
        "spec.containers.0.image=busybox",
        "status.phase",
        "status.phase===Running",
        r"metadata.name=a\x",
        r"metadata.name=a\",
        "spec.nodeName=a=b",
        "=node-a",
        "status..phase=Running",
    ] {
        let out = get(&format!("/api/v1/pods?fieldSelector={}", encode(selector)));
        let gateway = parse_any(selector)
            .ok()
            .filter(|s| s.paths().all(|p| member_supports("", "pods", p.as_str())));
        let stderr = String::from_utf8_lossy(&out.stderr);
        match gateway {
            Some(parsed) => {
                assert!(out.status.success(), "{selector:?} refused: {stderr}");
                let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let mut want = all.clone();
                want["items"].as_array_mut().unwrap().retain(|item| {
                    parsed.matches(
                        Reading::Member {
                            group: "",
                            resource: "pods",
                        },
                        item,
                    )
                });
                assert_eq!(names(&got), names(&want), "{selector:?}");
                answered += 1;
            }
            None => {
                assert!(!out.status.success(), "{selector:?} answered");
                assert!(stderr.contains("BadRequest"), "{selector:?}: {stderr}");
            }
        }
    }
    assert_eq!(answered, 20);
}
