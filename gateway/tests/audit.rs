//! The audit log end to end: `fleetgate serve` on the simulated fleet with the Gateway's
//! `spec.audit` set, requests from kubectl (h2) and curl (HTTP/1.1) as several users, then the log
//! read back as a kube-apiserver audit consumer would: every line a JSON `audit.k8s.io/v1` Event,
//! one per request, with the right user, verb, cluster, URI and code, including a member's 404, the
//! gateway's own 404, a policy 403, a 401 and an honoured impersonation.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use support::fleet::Fleet as Setup;
use support::kubectl::{assert_failed_with, groups_of, kubectl_command, kubectl_with_cert, ran};
use support::wait::wait_for_some;

impl Setup {
    fn audit_path(&self) -> PathBuf {
        self.path("audit/fleetgate-audit.log")
    }

    /// `kubectl` with the fleet's gateway kubeconfig (user admin), or with `user`'s certificate.
    fn kubectl(&self, user: Option<&str>, context: &str, args: &[&str]) -> Output {
        let mut command = match user {
            None => kubectl_command(&self.path("gateway.kubeconfig"), context),
            Some(user) => kubectl_with_cert(
                &format!("https://{}/clusters/{context}", self.https()),
                &self.path("pki/gateway-ca.crt"),
                &self.path(&format!("users/{user}.crt")),
                &self.path(&format!("users/{user}.key")),
            ),
        };
        // A fresh HOME: discovery is not served from another test's cache.
        command
            .env("HOME", self.path("home"))
            .args(["--request-timeout", "20s"])
            .args(args)
            .output()
            .unwrap()
    }

    /// One HTTP/1.1 request with curl; returns the status code. `credential`: a user whose
    /// certificate is presented, or `bearer:TOKEN`.
    fn curl(&self, credential: &str, user_agent: &str, path: &str) -> u16 {
        let mut command = Command::new("curl");
        command
            .args(["-sS", "--http1.1", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg("--cacert")
            .arg(self.path("pki/gateway-ca.crt"))
            .args(["-A", user_agent]);
        match credential.strip_prefix("bearer:") {
            Some(token) => {
                command.args(["-H", &format!("Authorization: Bearer {token}")]);
            }
            None => {
                command
                    .arg("--cert")
                    .arg(self.path(&format!("users/{credential}.crt")))
                    .arg("--key")
                    .arg(self.path(&format!("users/{credential}.key")));
            }
        }
        let url = format!("https://{}{path}", self.https());
        let out = ran(command.arg(url).output().unwrap(), &format!("curl {path}"));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Every line of the audit log, parsed; waits (bounded) until `predicate` holds for them,
    /// since the writer flushes at least once a second.
    fn events_when(&self, predicate: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let read = || std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        let events_now = || {
            let text = read();
            // Only whole lines: the writer may be in the middle of one.
            let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            let events: Vec<Value> = complete
                .lines()
                .map(|line| {
                    serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
                })
                .collect();
            predicate(&events).then_some(events)
        };
        wait_for_some(
            "the expected events in the audit log",
            Duration::from_secs(10),
            events_now,
            || format!("it has:\n{}\ngateway log:\n{}", read(), self.log()),
        )
    }
}

fn start() -> Setup {
    let mut setup = Setup::sim(2, 2);
    // The fleet's Gateway, with the audit log on (a relative path: beside gateway.yaml).
    setup.edit_gateway(|gateway| {
        gateway["spec"]["audit"] =
            serde_yaml::from_str("{path: audit/fleetgate-audit.log}").unwrap();
    });

    setup.serve(&["--workers", "2"], None);
    setup
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The events whose user agent is `agent` (curl requests: one each).
fn by_agent<'a>(events: &'a [Value], agent: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["userAgent"] == agent).collect()
}

fn groups(event: &Value, key: &str) -> Vec<String> {
    groups_of(&event[key])
}

#[test]
fn every_request_gets_one_audit_event_with_user_verb_cluster_uri_and_code() {
    let setup = start();

    // HTTP/1.1, one request each, told apart by their user agents.
    let list = "/clusters/member1/api/v1/namespaces/default/configmaps";
    assert_eq!(setup.curl("admin", "audit-test-list", list), 200);
    let fleet_list = "/fleet/api/v1/namespaces/default/configmaps";
    assert_eq!(setup.curl("admin", "audit-test-fleet", fleet_list), 200);
    let fleet_missing = "/fleet/api/v1/namespaces/default/configmaps/no-such-fleet-map";
    assert_eq!(
        setup.curl("admin", "audit-test-fleet-missing", fleet_missing),
        404
    );
    let unknown = "/clusters/member9/api/v1/namespaces";
    assert_eq!(setup.curl("admin", "audit-test-unknown", unknown), 404);
    // alice (group devs) may read the env=dev clusters only; member2 is prod.
    let denied = "/clusters/member2/api/v1/namespaces";
    assert_eq!(setup.curl("alice", "audit-test-denied", denied), 403);
    // The same refusal for alice's bearer token: the event names her, not the listener's user.
    let alice_token = std::fs::read_to_string(setup.dir().join("users/alice.token")).unwrap();
    let alice_bearer = format!("bearer:{}", alice_token.trim());
    assert_eq!(
        setup.curl(&alice_bearer, "audit-test-denied-token", denied),
        403
    );
    let unauthorized = "/clusters/member1/api/v1/namespaces";
    assert_eq!(
        setup.curl("bearer:not-a-known-token", "audit-test-401", unauthorized),
        401
    );

    // kubectl (h2): a list, a member's 404, and carol (ops) acting as alice, which a policy allows.
    ok(&setup.kubectl(None, "member1", &["get", "ns", "-o", "name"]));
    let missing = setup.kubectl(
        None,
        "member2",
        &["get", "configmap", "no-such-map", "-n", "default"],
    );
    assert_failed_with(&missing, "not found");
    // And over h2 through the fleet view: no member has it.
    let fleet_missing_h2 = setup.kubectl(
        None,
        "fleet",
        &["get", "configmap", "no-such-fleet-map-h2", "-n", "default"],
    );
    assert!(!fleet_missing_h2.status.success());
    let whoami = ok(&setup.kubectl(
        Some("carol"),
        "member1",
        &[
            "auth",
            "whoami",
            "--as",
            "alice",
            "--as-group",
            "devs",
            "--as-uid",
            "alice-uid",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    ));
    assert_eq!(whoami, "alice");
    // An upgraded session (exec over WebSocket or SPDY): audited when it ends.
    let echoed = ok(&setup.kubectl(
        None,
        "member1",
        &["exec", "hello", "-n", "default", "--", "echo", "audited"],
    ));
    assert_eq!(echoed.trim(), "audited");

    let events = setup.events_when(|events| {
        [
            "audit-test-list",
            "audit-test-fleet",
            "audit-test-fleet-missing",
            "audit-test-unknown",
            "audit-test-denied",
            "audit-test-denied-token",
            "audit-test-401",
        ]
        .iter()
        .all(|agent| !by_agent(events, agent).is_empty())
            && [
                ("name", "no-such-map"),
                ("name", "no-such-fleet-map-h2"),
                ("resource", "selfsubjectreviews"),
                ("subresource", "exec"),
            ]
            .iter()
            .all(|(field, value)| events.iter().any(|e| e["objectRef"][*field] == *value))
    });

    // Every line is an audit.k8s.io/v1 Event at level Metadata, stage ResponseComplete, with a
    // unique auditID and ordered timestamps.
    let mut ids = std::collections::HashSet::new();
    for event in &events {
        assert_eq!(event["kind"], "Event", "{event}");
        assert_eq!(event["apiVersion"], "audit.k8s.io/v1", "{event}");
        assert_eq!(event["level"], "Metadata", "{event}");
        assert_eq!(event["stage"], "ResponseComplete", "{event}");
        assert!(ids.insert(event["auditID"].as_str().unwrap().to_string()));
        let received = event["requestReceivedTimestamp"].as_str().unwrap();
        let stage = event["stageTimestamp"].as_str().unwrap();
        assert!(
            received.ends_with('Z') && received.len() == 27,
            "{received}"
        );
        assert!(received <= stage, "{event}");
        assert!(event["annotations"]["fleetgate.io/latency-us"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .is_ok());
        assert_eq!(event["sourceIPs"][0], "127.0.0.1", "{event}");
    }

    // One event per HTTP/1.1 request, each with its user, verb, cluster, URI and code.
    let expect = |agent: &str, user: &str, verb: &str, cluster: &str, uri: &str, code: u16| {
        let found = by_agent(&events, agent);
        assert_eq!(found.len(), 1, "{agent}: {found:?}");
        let event = found[0];
        assert_eq!(event["user"]["username"], user, "{event}");
        assert_eq!(event["verb"], verb, "{event}");
        assert_eq!(
            event["annotations"]["fleetgate.io/cluster"], cluster,
            "{event}"
        );
        assert_eq!(event["requestURI"], uri, "{event}");
        assert_eq!(event["responseStatus"]["code"], code, "{event}");
        event
    };
    let listed = expect("audit-test-list", "admin", "list", "member1", list, 200);
    assert!(groups(listed, "user").contains(&"system:masters".to_string()));
    assert_eq!(listed["objectRef"]["resource"], "configmaps");
    assert_eq!(listed["objectRef"]["namespace"], "default");
    assert!(listed.get("impersonatedUser").is_none());
    // A fleet LIST is one event, its cluster `fleet`.
    let fleet_event = expect(
        "audit-test-fleet",
        "admin",
        "list",
        "fleet",
        fleet_list,
        200,
    );
    assert_eq!(fleet_event["objectRef"]["resource"], "configmaps");
    // A named object no member has: the owner lookup's 404, audited as the fleet view's, over
    // HTTP/1.1 and h2.
    expect(
        "audit-test-fleet-missing",
        "admin",
        "get",
        "fleet",
        fleet_missing,
        404,
    );
    let fleet_h2 = events
        .iter()
        .find(|e| e["objectRef"]["name"] == "no-such-fleet-map-h2")
        .unwrap();
    assert_eq!(fleet_h2["annotations"]["fleetgate.io/cluster"], "fleet");
    assert_eq!(fleet_h2["responseStatus"]["code"], 404);
    expect(
        "audit-test-unknown",
        "admin",
        "list",
        "member9",
        unknown,
        404,
    );
    expect("audit-test-denied", "alice", "list", "member2", denied, 403);
    let denied_token = expect(
        "audit-test-denied-token",
        "alice",
        "list",
        "member2",
        denied,
        403,
    );
    assert!(
        denied_token.get("impersonatedUser").is_none(),
        "{denied_token}"
    );
    expect(
        "audit-test-401",
        "system:anonymous",
        "list",
        "member1",
        unauthorized,
        401,
    );

    // kubectl's requests over h2.
    let ns_list = events
        .iter()
        .find(|e| {
            e["verb"] == "list"
                && e["requestURI"]
                    .as_str()
                    .unwrap()
                    .starts_with("/clusters/member1/api/v1/namespaces?")
                && e["user"]["username"] == "admin"
        })
        .expect("kubectl get ns");
    assert_eq!(ns_list["responseStatus"]["code"], 200);
    assert!(ns_list["userAgent"]
        .as_str()
        .unwrap()
        .starts_with("kubectl"));
    let not_found = events
        .iter()
        .find(|e| e["objectRef"]["name"] == "no-such-map")
        .unwrap();
    assert_eq!(not_found["verb"], "get");
    assert_eq!(not_found["responseStatus"]["code"], 404);
    assert_eq!(not_found["annotations"]["fleetgate.io/cluster"], "member2");
    assert_eq!(
        not_found["requestURI"],
        // kubectl's --request-timeout travels as ?timeout=.
        "/clusters/member2/api/v1/namespaces/default/configmaps/no-such-map?timeout=20s"
    );
    let impersonated = events
        .iter()
        .find(|e| e["objectRef"]["resource"] == "selfsubjectreviews")
        .unwrap();
    assert_eq!(impersonated["verb"], "create");
    assert_eq!(impersonated["user"]["username"], "carol");
    assert_eq!(impersonated["impersonatedUser"]["username"], "alice");
    assert_eq!(groups(impersonated, "impersonatedUser"), vec!["devs"]);
    assert_eq!(impersonated["impersonatedUser"]["uid"], "alice-uid");
    let code = impersonated["responseStatus"]["code"].as_u64().unwrap();
    assert!((200..300).contains(&code), "{impersonated}");

    let exec = events
        .iter()
        .find(|e| e["objectRef"]["subresource"] == "exec")
        .unwrap();
    assert_eq!(exec["responseStatus"]["code"], 101, "{exec}");
    // kube-apiserver's verb: that of the method, the subresource naming the exec (kubectl's
    // WebSocket exec is a GET).
    assert_eq!(exec["verb"], "get", "{exec}");
    assert_eq!(exec["user"]["username"], "admin");
    assert_eq!(exec["objectRef"]["name"], "hello");
    assert_eq!(exec["annotations"]["fleetgate.io/cluster"], "member1");

    // The log names users: only its owner may read it. The events are counted, none dropped.
    let mode = std::fs::metadata(setup.audit_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let metrics = Command::new("curl")
        .args(["-sS", &format!("http://{}/metrics", setup.admin())])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let value = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
    };
    assert!(
        value("fleetgate_audit_events_total").unwrap_or(0.0) >= events.len() as f64,
        "{metrics}"
    );
    assert_eq!(
        value("fleetgate_audit_events_dropped_total"),
        Some(0.0),
        "{metrics}"
    );
}

#[test]
fn audit_log_off_when_absent_and_the_path_is_relative_to_the_gateway_file() {
    // The fleet's own gateway.yaml has no spec.audit: nothing is written anywhere under DIR.
    let fleet = Setup::sim(1, 1);
    let dir = fleet.dir();
    let config = fleetgate_config_watcher::load_path(dir).unwrap();
    assert!(config.gateway.audit.is_none());
    // With a relative path, the log sits beside the file that names it.
    let gateway_yaml = dir.join("gateway.yaml");
    let text = std::fs::read_to_string(&gateway_yaml).unwrap();
    let mut gateway: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    gateway["spec"]["audit"] = serde_yaml::from_str("{path: logs/a.log, queue: 16}").unwrap();
    std::fs::write(&gateway_yaml, serde_yaml::to_string(&gateway).unwrap()).unwrap();
    let config = fleetgate_config_watcher::load_path(dir).unwrap();
    let audit = config.gateway.audit.unwrap();
    assert_eq!(audit.path, dir.join("logs/a.log"));
    assert_eq!(audit.queue, 16);
    // A queue of 0 could hold nothing: refused, naming the field.
    gateway["spec"]["audit"] = serde_yaml::from_str("{path: a.log, queue: 0}").unwrap();
    std::fs::write(&gateway_yaml, serde_yaml::to_string(&gateway).unwrap()).unwrap();
    let err = fleetgate_config_watcher::load_path(dir).unwrap_err();
    assert!(err.to_string().contains("spec.audit.queue"), "{err}");
}
