//! AccessPolicy objects compiled for the data path, and the request attributes they are checked
//! against.
//!
//! [`RequestAttributes::parse`] names a request the way kube-apiserver's RequestInfoFactory does
//! (verb from method, path and `?watch=`; API group, resource, subresource, namespace, name),
//! borrowing from the request target. [`CompiledPolicy`] is built off the hot path with every
//! routing table: per subject (user or group) and per cluster the indices of the rules that apply,
//! each rule a verb bitmask plus optional resource / namespace / name lists. A check is a few hash
//! lookups and slice scans and allocates nothing. Deny by default: only grants exist.
//!
//! Called by `table` (compile), by the gateway's identity layer (check per request), and by
//! whoever needs the clusters a subject may reach ([`reachable_clusters`]). Never does I/O.

use std::sync::Arc;

use crate::auth::{Authenticators, Identity};
use crate::objects::{AuthorizationMode, LabelSelector, PolicyRule, SubjectKind};
use crate::settings::Config;

/// The group every authenticated user is in (kube-apiserver adds it; so does the check).
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Kubernetes' anonymous user.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// The verbs a policy grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    Exec,
    Attach,
    PortForward,
    Proxy,
    Impersonate,
}

const ALL_VERBS: [Verb; 13] = [
    Verb::Get,
    Verb::List,
    Verb::Watch,
    Verb::Create,
    Verb::Update,
    Verb::Patch,
    Verb::Delete,
    Verb::DeleteCollection,
    Verb::Exec,
    Verb::Attach,
    Verb::PortForward,
    Verb::Proxy,
    Verb::Impersonate,
];

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Exec => "exec",
            Verb::Attach => "attach",
            Verb::PortForward => "portforward",
            Verb::Proxy => "proxy",
            Verb::Impersonate => "impersonate",
        }
    }

    pub fn from_name(name: &str) -> Option<Verb> {
        ALL_VERBS.into_iter().find(|v| v.name() == name)
    }

    fn bit(self) -> u16 {
        1 << (self as u8)
    }
}

/// What a request is, in kube-apiserver's terms. Borrowed from the request target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAttributes<'a> {
    /// None: a method no verb stands for (OPTIONS, ...), never granted.
    pub verb: Option<Verb>,
    /// False for discovery and other non-resource paths (`/api`, `/apis/apps/v1`, `/version`,
    /// `/openapi/v2`).
    pub resource_request: bool,
    pub api_group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> RequestAttributes<'a> {
    /// Names a request from its method, path (without the cluster prefix) and query, as
    /// kube-apiserver's RequestInfoFactory: `/api/v1/namespaces/NS/RES/NAME/SUB`,
    /// `/apis/GROUP/VERSION/...`, the legacy `/watch/` prefix; a collection GET is `list`, with
    /// `watch=true` `watch`; a connect subresource (exec, attach, portforward, proxy) is its own
    /// verb. A path that is not valid UTF-8 gets no resource and so matches nothing narrow.
    pub fn parse(method: &[u8], path: &'a [u8], query: &[u8]) -> RequestAttributes<'a> {
        let path = std::str::from_utf8(path).unwrap_or("");
        let mut parts: [&'a str; 10] = [""; 10];
        let mut count = 0;
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            if count == parts.len() {
                count += 1;
                break;
            }
            parts[count] = segment;
            count += 1;
        }
        let mut attrs = RequestAttributes {
            verb: method_verb(method),
            resource_request: false,
            api_group: "",
            resource: "",
            subresource: "",
            namespace: "",
            name: "",
        };
        if count > parts.len() {
            return attrs;
        }
        let parts = &parts[..count];
        let rest: &[&'a str] = match parts {
            ["api", _version, rest @ ..] => rest,
            ["apis", group, _version, rest @ ..] => {
                attrs.api_group = group;
                rest
            }
            _ => return attrs,
        };
        let (legacy_watch, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            rest => (false, rest),
        };
        if rest.is_empty() {
            return attrs; // group-version discovery
        }
        attrs.resource_request = true;
        let rest = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                attrs.namespace = namespace;
                rest
            }
            // The namespace object itself: /api/v1/namespaces/NAME[/SUB].
            ["namespaces", namespace, ..] => {
                attrs.namespace = namespace;
                rest
            }
            rest => rest,
        };
        attrs.resource = rest[0];
        attrs.name = rest.get(1).copied().unwrap_or("");
        attrs.subresource = rest.get(2).copied().unwrap_or("");
        let collection = rest.len() == 1;
        attrs.verb = match attrs.verb {
            Some(Verb::Get) if legacy_watch || has_true_flag(query, b"watch") => Some(Verb::Watch),
            Some(Verb::Get) if collection => Some(Verb::List),
            Some(Verb::Delete) if collection => Some(Verb::DeleteCollection),
            verb => verb,
        };
        match attrs.subresource {
            "exec" => attrs.verb = Some(Verb::Exec),
            "attach" => attrs.verb = Some(Verb::Attach),
            "portforward" => attrs.verb = Some(Verb::PortForward),
            "proxy" => attrs.verb = Some(Verb::Proxy),
            _ => {}
        }
        attrs
    }

    /// Whether any subject with a grant on the cluster may make this request: discovery and
    /// other non-resource GETs (as kube's `system:discovery`), and the self reviews kubectl uses
    /// to ask who it is and what it may do (as kube's `system:basic-user`).
    pub fn is_basic(&self) -> bool {
        if !self.resource_request {
            return matches!(self.verb, Some(Verb::Get));
        }
        self.verb == Some(Verb::Create)
            && self.namespace.is_empty()
            && matches!(
                (self.api_group, self.resource),
                ("authentication.k8s.io", "selfsubjectreviews")
                    | (
                        "authorization.k8s.io",
                        "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
                    )
            )
    }
}

fn method_verb(method: &[u8]) -> Option<Verb> {
    match method {
        b"GET" | b"HEAD" => Some(Verb::Get),
        b"POST" => Some(Verb::Create),
        b"PUT" => Some(Verb::Update),
        b"PATCH" => Some(Verb::Patch),
        b"DELETE" => Some(Verb::Delete),
        _ => None,
    }
}

fn has_true_flag(query: &[u8], name: &[u8]) -> bool {
    let query = query.strip_prefix(b"?").unwrap_or(query);
    query.split(|b| *b == b'&').any(|pair| {
        let mut kv = pair.splitn(2, |b| *b == b'=');
        kv.next() == Some(name) && kv.next().is_some_and(|v| v == b"true" || v == b"1")
    })
}

/// One entry of a rule's `resources`: `pods`, `deployments.apps`, `pods/log`.
#[derive(Debug)]
struct ResourceMatch {
    resource: String,
    /// None: the resource in any API group.
    group: Option<String>,
    /// None: the resource and all its subresources.
    subresource: Option<String>,
}

/// One compiled rule.
#[derive(Debug)]
struct CompiledRule {
    verbs: u16,
    /// None: every resource.
    resources: Option<Vec<ResourceMatch>>,
    namespaces: Option<Vec<String>>,
    resource_names: Option<Vec<String>>,
}

impl CompiledRule {
    fn matches(&self, attrs: &RequestAttributes<'_>) -> bool {
        let Some(verb) = attrs.verb else {
            return false;
        };
        if self.verbs & verb.bit() == 0 {
            return false;
        }
        if let Some(resources) = &self.resources {
            let found = resources.iter().any(|r| {
                r.resource == attrs.resource
                    && r.group.as_deref().is_none_or(|g| g == attrs.api_group)
                    && r.subresource
                        .as_deref()
                        .is_none_or(|s| s == attrs.subresource)
            });
            if !found {
                return false;
            }
        }
        if let Some(namespaces) = &self.namespaces {
            if !namespaces.iter().any(|n| n == attrs.namespace) {
                return false;
            }
        }
        if let Some(names) = &self.resource_names {
            if !names.iter().any(|n| n == attrs.name) {
                return false;
            }
        }
        true
    }
}

/// The rules that apply to one subject, per cluster.
#[derive(Debug, Default)]
struct SubjectGrants {
    clusters: ahash::AHashMap<Arc<str>, Vec<u32>>,
}

/// AccessPolicy objects compiled against the clusters of one configuration.
#[derive(Debug, Default)]
pub struct CompiledPolicy {
    mode: AuthorizationMode,
    rules: Vec<CompiledRule>,
    users: ahash::AHashMap<String, SubjectGrants>,
    groups: ahash::AHashMap<String, SubjectGrants>,
    all_clusters: Vec<Arc<str>>,
}

/// A policy that does not compile (unknown verb, bad selector operator).
#[derive(Debug, thiserror::Error)]
#[error("AccessPolicy {policy}: {field}: {message}")]
pub struct PolicyError {
    pub policy: String,
    pub field: &'static str,
    pub message: String,
}

impl CompiledPolicy {
    /// Compiles the policies of `config` against its clusters.
    pub fn compile(config: &Config) -> Result<CompiledPolicy, PolicyError> {
        let all_clusters: Vec<Arc<str>> = config
            .clusters
            .iter()
            .map(|c| Arc::from(c.name.as_str()))
            .collect();
        let mut compiled = CompiledPolicy {
            mode: config.gateway.auth.authorization_mode,
            all_clusters,
            ..CompiledPolicy::default()
        };
        for policy in &config.policies {
            let name = policy.metadata.name.as_str();
            let err = |field: &'static str, message: String| PolicyError {
                policy: name.to_owned(),
                field,
                message,
            };
            let spec = &policy.spec;
            let mut covered: Vec<Arc<str>> = Vec::new();
            let all = spec.clusters.names.iter().any(|n| n == "*");
            for (cluster, shared) in config.clusters.iter().zip(&compiled.all_clusters) {
                let named = all || spec.clusters.names.contains(&cluster.name);
                let selected = match &spec.clusters.selector {
                    Some(selector) => selector_matches(selector, &cluster.labels)
                        .map_err(|m| err("spec.clusters.selector", m))?,
                    None => false,
                };
                if named || selected {
                    covered.push(shared.clone());
                }
            }
            let first = compiled.rules.len() as u32;
            for rule in &spec.rules {
                compiled
                    .rules
                    .push(compile_rule(rule).map_err(|m| err("spec.rules", m))?);
            }
            let indices: Vec<u32> = (first..compiled.rules.len() as u32).collect();
            if spec.subjects.is_empty() {
                return Err(err(
                    "spec.subjects",
                    "at least one subject is required".into(),
                ));
            }
            for subject in &spec.subjects {
                if subject.name.is_empty() {
                    return Err(err("spec.subjects[].name", "must not be empty".into()));
                }
                let map = match subject.kind {
                    SubjectKind::User => &mut compiled.users,
                    SubjectKind::Group => &mut compiled.groups,
                };
                let grants = map.entry(subject.name.clone()).or_default();
                for cluster in &covered {
                    grants
                        .clusters
                        .entry(cluster.clone())
                        .or_default()
                        .extend_from_slice(&indices);
                }
            }
        }
        Ok(compiled)
    }

    pub fn mode(&self) -> AuthorizationMode {
        self.mode
    }

    /// Every rule set that applies to `identity` on `cluster`: the user's, each group's, and
    /// `system:authenticated`'s for anyone but the anonymous user.
    fn grants<'s>(
        &'s self,
        identity: &'s Identity,
        cluster: &'s str,
    ) -> impl Iterator<Item = &'s [u32]> + 's {
        let authenticated = (identity.user != ANONYMOUS_USER).then_some(AUTHENTICATED_GROUP);
        let user = self.users.get(identity.user.as_str());
        let groups = identity
            .groups
            .iter()
            .map(String::as_str)
            .chain(authenticated)
            .filter_map(|g| self.groups.get(g));
        user.into_iter()
            .chain(groups)
            .filter_map(move |g| g.clusters.get(cluster).map(Vec::as_slice))
    }

    /// Whether `identity` may make the request `attrs` on `cluster`. Allocates nothing.
    pub fn allows(
        &self,
        identity: &Identity,
        cluster: &str,
        attrs: &RequestAttributes<'_>,
    ) -> bool {
        if self.mode == AuthorizationMode::AlwaysAllow {
            return true;
        }
        let basic = attrs.is_basic();
        self.grants(identity, cluster)
            .any(|rules| basic || rules.iter().any(|i| self.rules[*i as usize].matches(attrs)))
    }

    /// Whether `identity` may impersonate `name` of `kind` (`users`, `groups`, `uids`,
    /// `userextras` with the extra key as `subresource`) on `cluster`.
    pub fn allows_impersonation(
        &self,
        identity: &Identity,
        cluster: &str,
        kind: &str,
        extra_key: &str,
        name: &str,
    ) -> bool {
        let attrs = RequestAttributes {
            verb: Some(Verb::Impersonate),
            resource_request: true,
            api_group: "",
            resource: kind,
            subresource: extra_key,
            namespace: "",
            name,
        };
        if self.mode == AuthorizationMode::AlwaysAllow {
            return true;
        }
        self.grants(identity, cluster).any(|rules| {
            rules
                .iter()
                .any(|i| self.rules[*i as usize].matches(&attrs))
        })
    }

    /// The clusters where the subject has any grant, sorted (every cluster under AlwaysAllow).
    pub fn reachable_clusters(&self, user: &str, groups: &[String]) -> Vec<String> {
        if self.mode == AuthorizationMode::AlwaysAllow {
            let mut all: Vec<String> = self.all_clusters.iter().map(|c| c.to_string()).collect();
            all.sort();
            return all;
        }
        let mut out = std::collections::BTreeSet::new();
        let authenticated = (user != ANONYMOUS_USER).then_some(AUTHENTICATED_GROUP);
        let subjects = self.users.get(user).into_iter().chain(
            groups
                .iter()
                .map(String::as_str)
                .chain(authenticated)
                .filter_map(|g| self.groups.get(g)),
        );
        for grants in subjects {
            for (cluster, rules) in &grants.clusters {
                if !rules.is_empty() {
                    out.insert(cluster.to_string());
                }
            }
        }
        out.into_iter().collect()
    }
}

/// The clusters of `config` where `user` (with `groups`) has any verb, sorted. Compiles the
/// policies on every call: for the CLI and other callers off the data path (the data path asks
/// the table's compiled policy). A policy that does not compile gives an empty list.
pub fn reachable_clusters(config: &Config, user: &str, groups: &[String]) -> Vec<String> {
    CompiledPolicy::compile(config)
        .map(|p| p.reachable_clusters(user, groups))
        .unwrap_or_default()
}

fn compile_rule(rule: &PolicyRule) -> Result<CompiledRule, String> {
    let mut verbs = 0u16;
    if rule.verbs.is_empty() {
        return Err("a rule needs at least one verb".into());
    }
    for verb in &rule.verbs {
        if verb == "*" {
            verbs = u16::MAX;
        } else {
            verbs |= Verb::from_name(verb)
                .ok_or_else(|| format!("unknown verb {verb:?}"))?
                .bit();
        }
    }
    let resources = match &rule.resources {
        Some(list) if !list.iter().any(|r| r == "*") => Some(
            list.iter()
                .map(|r| {
                    let (resource, sub) = match r.split_once('/') {
                        Some((res, sub)) => (res, Some(sub.to_owned())),
                        None => (r.as_str(), None),
                    };
                    let (resource, group) = match resource.split_once('.') {
                        Some((res, group)) => (res, Some(group.to_owned())),
                        None => (resource, None),
                    };
                    ResourceMatch {
                        resource: resource.to_owned(),
                        group,
                        subresource: sub,
                    }
                })
                .collect(),
        ),
        _ => None,
    };
    let star = |list: &Option<Vec<String>>| match list {
        Some(l) if !l.iter().any(|n| n == "*") => Some(l.clone()),
        _ => None,
    };
    Ok(CompiledRule {
        verbs,
        resources,
        namespaces: star(&rule.namespaces),
        resource_names: star(&rule.resource_names),
    })
}

/// Evaluates a label selector (matchLabels and matchExpressions; an empty selector matches
/// every cluster, as in Kubernetes).
fn selector_matches(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<bool, String> {
    for (key, value) in &selector.match_labels {
        if labels.get(key) != Some(value) {
            return Ok(false);
        }
    }
    for req in &selector.match_expressions {
        let value = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" => value.is_some_and(|v| req.values.contains(v)),
            "NotIn" => value.is_none_or(|v| !req.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(format!(
                    "operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                ))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What the data path reads for identity: the authenticators and the compiled policy, built
/// with every routing table.
#[derive(Debug, Default)]
pub struct AccessControl {
    pub authenticators: Authenticators,
    pub policy: CompiledPolicy,
}

impl AccessControl {
    /// Compiles the access control of `config`.
    pub fn build(config: &Config) -> Result<AccessControl, PolicyError> {
        if config.gateway.auth.authorization_mode == AuthorizationMode::AlwaysAllow {
            tracing::warn!(
                "spec.auth.authorizationMode is AlwaysAllow: AccessPolicy objects are not enforced, \
                 every authenticated client may do anything the cluster credentials allow"
            );
        }
        Ok(AccessControl {
            authenticators: Authenticators::build(&config.gateway.auth),
            policy: CompiledPolicy::compile(config)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, target: &str) -> RequestAttributes<'static> {
        let target: &'static str = Box::leak(target.to_owned().into_boxed_str());
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        RequestAttributes::parse(method.as_bytes(), path.as_bytes(), query.as_bytes())
    }

    #[test]
    fn request_info_names_verbs_resources_and_namespaces_like_kube() {
        let a = attrs("GET", "/api/v1/namespaces/default/pods");
        assert_eq!(
            (a.verb, a.resource, a.namespace, a.name),
            (Some(Verb::List), "pods", "default", "")
        );
        let a = attrs("GET", "/api/v1/namespaces/default/pods?watch=true&rv=1");
        assert_eq!(a.verb, Some(Verb::Watch));
        let a = attrs("GET", "/api/v1/watch/namespaces/default/pods/p1");
        assert_eq!((a.verb, a.name), (Some(Verb::Watch), "p1"));
        let a = attrs(
            "GET",
            "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
        );
        assert_eq!(
            (a.verb, a.api_group, a.resource, a.name),
            (Some(Verb::Get), "apps", "deployments", "coredns")
        );
        let a = attrs("POST", "/api/v1/namespaces/default/pods/p1/exec?command=ls");
        assert_eq!((a.verb, a.subresource), (Some(Verb::Exec), "exec"));
        let a = attrs("GET", "/api/v1/namespaces/default/pods/p1/log");
        assert_eq!((a.verb, a.subresource), (Some(Verb::Get), "log"));
        let a = attrs("DELETE", "/api/v1/namespaces/default/pods");
        assert_eq!(a.verb, Some(Verb::DeleteCollection));
        let a = attrs("GET", "/api/v1/namespaces/kube-system");
        assert_eq!(
            (a.verb, a.resource, a.name, a.namespace),
            (Some(Verb::Get), "namespaces", "kube-system", "kube-system")
        );
        let a = attrs("GET", "/api/v1/nodes");
        assert_eq!(
            (a.verb, a.resource, a.namespace),
            (Some(Verb::List), "nodes", "")
        );
        for discovery in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps/v1",
            "/version",
            "/openapi/v2",
        ] {
            let a = attrs("GET", discovery);
            assert!(!a.resource_request, "{discovery}");
            assert!(a.is_basic(), "{discovery}");
        }
        let review = attrs("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews");
        assert!(review.is_basic());
        assert!(!attrs("POST", "/api/v1/namespaces/default/pods").is_basic());
        assert!(!attrs("POST", "/version").is_basic());
    }

    fn config(yaml_policies: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let gateway = "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {name: g}\nspec:\n  listeners: [{address: '127.0.0.1:0', tls: false}]\n";
        let mut clusters = String::new();
        for (name, env) in [("dev1", "dev"), ("dev2", "dev"), ("prod1", "prod")] {
            clusters.push_str(&format!(
                "---\napiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}, labels: {{env: {env}}}}}\nspec: {{server: 'http://127.0.0.1:1'}}\n"
            ));
        }
        std::fs::write(dir.path().join("g.yaml"), gateway).unwrap();
        std::fs::write(dir.path().join("c.yaml"), clusters).unwrap();
        std::fs::write(dir.path().join("p.yaml"), yaml_policies).unwrap();
        crate::load_path(dir.path()).unwrap()
    }

    fn who(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Identity::default()
        }
    }

    const POLICIES: &str = r#"
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: devs-read-dev}
spec:
  subjects: [{kind: Group, name: devs}]
  clusters:
    selector:
      matchExpressions: [{key: env, operator: In, values: [dev]}]
  rules:
    - verbs: [get, list, watch]
      resources: [pods, deployments.apps, pods/log]
      namespaces: [default]
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: carol-admin-prod}
spec:
  subjects: [{kind: User, name: carol}]
  clusters: {names: [prod1]}
  rules:
    - verbs: [get, list, watch, create, update, patch, delete, exec]
    - verbs: [impersonate]
      resources: [users]
      resourceNames: [alice]
"#;

    #[test]
    fn compiled_policy_grants_only_what_rules_say() {
        let config = config(POLICIES);
        let policy = CompiledPolicy::compile(&config).unwrap();
        let alice = who("alice", &["devs"]);
        let list_pods = attrs("GET", "/api/v1/namespaces/default/pods");
        assert!(policy.allows(&alice, "dev1", &list_pods));
        assert!(policy.allows(&alice, "dev2", &list_pods));
        assert!(
            !policy.allows(&alice, "prod1", &list_pods),
            "selector excludes prod"
        );
        let other_ns = attrs("GET", "/api/v1/namespaces/kube-system/pods");
        assert!(!policy.allows(&alice, "dev1", &other_ns));
        let delete = attrs("DELETE", "/api/v1/namespaces/default/pods/p1");
        assert!(!policy.allows(&alice, "dev1", &delete));
        let deploy = attrs("GET", "/apis/apps/v1/namespaces/default/deployments");
        assert!(policy.allows(&alice, "dev1", &deploy));
        let exec = attrs("POST", "/api/v1/namespaces/default/pods/p1/exec");
        assert!(!policy.allows(&alice, "dev1", &exec));
        let discovery = attrs("GET", "/apis");
        assert!(policy.allows(&alice, "dev1", &discovery));
        assert!(
            !policy.allows(&alice, "prod1", &discovery),
            "no grant on prod1 at all"
        );
        let bob = who("bob", &[]);
        assert!(!policy.allows(&bob, "dev1", &list_pods), "deny by default");
        let carol = who("carol", &["ops"]);
        assert!(policy.allows(&carol, "prod1", &delete));
        assert!(policy.allows(&carol, "prod1", &exec));
        assert!(policy.allows_impersonation(&carol, "prod1", "users", "", "alice"));
        assert!(!policy.allows_impersonation(&carol, "prod1", "users", "", "admin"));
        assert!(!policy.allows_impersonation(&alice, "dev1", "users", "", "alice"));
        let star = POLICIES.replace(
            "[get, list, watch, create, update, patch, delete, exec]",
            "[\"*\"]",
        );
        let star = CompiledPolicy::compile(&config_unchecked(&star)).unwrap();
        assert!(
            star.allows_impersonation(&carol, "prod1", "users", "", "admin"),
            "* includes impersonate"
        );
        assert_eq!(
            policy.reachable_clusters("alice", &["devs".into()]),
            vec!["dev1", "dev2"]
        );
        assert_eq!(policy.reachable_clusters("carol", &[]), vec!["prod1"]);
        assert!(reachable_clusters(&config, "bob", &[]).is_empty());
    }

    #[test]
    fn bad_verbs_and_operators_are_refused() {
        let bad_verb = POLICIES.replace("[get, list, watch]", "[get, fly]");
        let config = config(&bad_verb);
        let err = CompiledPolicy::compile(&config).unwrap_err();
        assert!(err.to_string().contains("fly"), "{err}");
        let bad_op = POLICIES.replace("operator: In", "operator: Near");
        let err = CompiledPolicy::compile(&config_unchecked(&bad_op)).unwrap_err();
        assert!(err.to_string().contains("Near"), "{err}");
    }

    fn config_unchecked(policies: &str) -> Config {
        config(policies)
    }
}
