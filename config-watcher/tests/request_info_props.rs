//! Properties of the request-info parser and the policy check over paths of 1 to 64 segments
//! made of the tokens that matter to classification (`api`, `apis`, `namespaces`, `watch`,
//! `proxy`, `status`, dot and percent forms, empty, non-ASCII) and random ones:
//! - nothing panics;
//! - a deny-by-default policy with a grant only for namespace `default` never allows a resource
//!   request in another namespace, nor anything the parser could not classify;
//! - once a path reaches its subresource, more segments change nothing the policy reads;
//! - an unclassified request is never a resource request.

use fleetgate_config_watcher::auth::Identity;
use fleetgate_config_watcher::policy::CompiledPolicy;
use fleetgate_config_watcher::request_info::RequestInfo;
use proptest::prelude::*;

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("api".to_string()),
        Just("apis".to_string()),
        Just("v1".to_string()),
        Just("apps".to_string()),
        Just("namespaces".to_string()),
        Just("default".to_string()),
        Just("kube-system".to_string()),
        Just("watch".to_string()),
        Just("proxy".to_string()),
        Just("status".to_string()),
        Just("finalize".to_string()),
        Just("pods".to_string()),
        Just("exec".to_string()),
        Just("%2e%2e".to_string()),
        Just("..".to_string()),
        Just("%2F".to_string()),
        Just(String::new()),
        Just("nåme".to_string()),
        "[a-z0-9%:.-]{1,12}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(segment(), 1..=64).prop_map(|s| format!("/{}", s.join("/")))
}

/// A path under `/api/v1` or `/apis/apps/v1`: most of these are resource requests.
fn api_path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["/api/v1", "/apis/apps/v1"]),
        prop::collection::vec(segment(), 1..=60),
    )
        .prop_map(|(prefix, s)| format!("{prefix}/{}", s.join("/")))
}

fn method() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
    ])
}

fn query() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        "watch=1",
        "watch=true&fieldSelector=metadata.name%3Dx",
        "fieldSelector=metadata.name%3Dx,bad",
        "watch=yes",
        "follow=true",
    ])
}

fn default_only_policy() -> CompiledPolicy {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        r#"apiVersion: fleetgate.io/v1alpha1
kind: Gateway
metadata: {name: g}
spec:
  listeners: [{address: '127.0.0.1:0', tls: false}]
---
apiVersion: fleetgate.io/v1alpha1
kind: Cluster
metadata: {name: m}
spec: {server: 'http://127.0.0.1:1'}
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: default-only}
spec:
  subjects: [{kind: User, name: dana}]
  clusters: {names: [m]}
  rules:
    - verbs: ["*"]
      namespaces: [default]
"#,
    )
    .unwrap();
    let config = fleetgate_config_watcher::load_path(dir.path()).unwrap();
    CompiledPolicy::compile(&config).unwrap()
}

fn dana() -> Identity {
    Identity {
        user: "dana".into(),
        ..Identity::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 4000,
        max_global_rejects: 50_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_namespace_grant_never_reaches_another_namespace(
        method in method(), path in prop_oneof![path(), api_path()], query in query()
    ) {
        let policy = default_only_policy();
        let info = RequestInfo::parse(method.as_bytes(), path.as_bytes(), query.as_bytes());
        if !info.classified {
            prop_assert!(!info.is_resource_request);
        }
        if policy.allows(&dana(), "m", &info) {
            // Either a resource request in `default`, or discovery (which every subject with a
            // grant on the cluster may GET).
            let discovery = !info.is_resource_request
                && matches!(method, "GET" | "HEAD")
                && fleetgate_config_watcher::policy::is_basic(&info);
            prop_assert!(
                (info.is_resource_request && info.classified && info.namespace == "default")
                    || discovery,
                "{method} {path}?{query} allowed as {info:?}"
            );
        }
    }

    #[test]
    fn segments_past_the_subresource_change_nothing(
        method in method(), path in api_path(), tail in prop::collection::vec(segment(), 1..=20)
    ) {
        let info = RequestInfo::parse(method.as_bytes(), path.as_bytes(), b"");
        prop_assume!(info.is_resource_request && !info.subresource.is_empty());
        let longer = format!("{path}/{}", tail.join("/"));
        let more = RequestInfo::parse(method.as_bytes(), longer.as_bytes(), b"");
        prop_assert_eq!(
            (more.classified, more.verb, more.api_group, more.namespace, more.resource, more.name, more.subresource, more.long_running),
            (info.classified, info.verb, info.api_group, info.namespace, info.resource, info.name, info.subresource, info.long_running)
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        method in prop::collection::vec(any::<u8>(), 0..8),
        path in prop::collection::vec(any::<u8>(), 0..300),
        query in prop::collection::vec(any::<u8>(), 0..100),
    ) {
        let info = RequestInfo::parse(&method, &path, &query);
        let _ = (info.policy_verb(), info.metrics_verb(), info.path_str());
    }
}
