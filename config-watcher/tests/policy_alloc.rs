//! The AccessPolicy check on the data path allocates nothing: request attributes parsed from the
//! target, a user with groups, allowed and denied requests, impersonation checks. Counted with a
//! global allocator that tallies this thread's allocations.

// A global allocator cannot be written without `unsafe`; this one only forwards to the system
// allocator and exists in this test binary alone.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fleetgate_config_watcher::auth::Identity;
use fleetgate_config_watcher::policy::{CompiledPolicy, RequestAttributes};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn a_policy_check_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut clusters = String::new();
    for i in 0..50 {
        let env = if i % 2 == 0 { "dev" } else { "prod" };
        clusters.push_str(&format!(
            "---\napiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: m{i}, labels: {{env: {env}}}}}\nspec: {{server: 'http://127.0.0.1:1'}}\n"
        ));
    }
    std::fs::write(
        dir.path().join("g.yaml"),
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {name: g}\nspec:\n  listeners: [{address: '127.0.0.1:0', tls: false}]\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("c.yaml"), clusters).unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        r#"apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: devs}
spec:
  subjects: [{kind: Group, name: devs}, {kind: User, name: alice}]
  clusters: {selector: {matchLabels: {env: dev}}}
  rules:
    - verbs: [get, list, watch]
      resources: [pods, deployments.apps, pods/log]
      namespaces: [default, dev]
    - verbs: [impersonate]
      resources: [users]
      resourceNames: [bob]
"#,
    )
    .unwrap();
    let config = fleetgate_config_watcher::load_path(dir.path()).unwrap();
    let policy = CompiledPolicy::compile(&config).unwrap();
    let alice = Identity {
        user: "alice".into(),
        groups: vec!["devs".into(), "ops".into(), "everyone".into()],
        ..Identity::default()
    };
    // (method, path, query, allowed)
    type Request = (&'static [u8], &'static [u8], &'static [u8], bool);
    let requests: [Request; 7] = [
        (
            b"GET",
            b"/api/v1/namespaces/default/pods",
            b"limit=500",
            true,
        ),
        (
            b"GET",
            b"/apis/apps/v1/namespaces/dev/deployments/web",
            b"",
            true,
        ),
        (
            b"GET",
            b"/api/v1/namespaces/default/pods",
            b"watch=true",
            true,
        ),
        (b"DELETE", b"/api/v1/namespaces/default/pods/p", b"", false),
        (
            b"GET",
            b"/api/v1/namespaces/kube-system/secrets",
            b"",
            false,
        ),
        // Any depth: a proxy subresource with a long tail, outside and inside the granted
        // namespace, and a field selector naming the object.
        (
            b"GET",
            b"/api/v1/namespaces/kube-system/services/s:443/proxy/a/b/c/d/e/f/g/h/i/j/k/l",
            b"",
            false,
        ),
        (
            b"GET",
            b"/api/v1/namespaces/default/pods",
            b"watch=1&fieldSelector=metadata.name%3Dp",
            true,
        ),
    ];
    // Warm up whatever lazily allocates once (hash seeds, thread locals).
    for (method, path, query, _) in requests {
        let attrs = RequestAttributes::parse(method, path, query);
        let _ = policy.allows(&alice, "m0", &attrs);
    }
    let before = allocations();
    let mut allowed = 0;
    for round in 0..1000 {
        let cluster = if round % 2 == 0 { "m0" } else { "m2" };
        for (method, path, query, expected) in requests {
            let attrs = RequestAttributes::parse(method, path, query);
            let ok = policy.allows(&alice, cluster, &attrs);
            assert_eq!(ok, expected);
            allowed += usize::from(ok);
        }
        assert!(!policy.allows(
            &alice,
            "m1",
            &RequestAttributes::parse(b"GET", b"/api", b"")
        ));
        assert!(policy.allows_impersonation(&alice, cluster, "users", "", "bob"));
    }
    assert_eq!(allocations() - before, 0, "the check allocated");
    assert_eq!(allowed, 4000);
}
