//! AccessPolicy objects compiled for the data path, checked against a request's
//! [`RequestInfo`](crate::request_info::RequestInfo) (kube-apiserver's request info, parsed once
//! per request by `request_info`).
//!
//! Fail closed: a rule with `resources` (or none: every resource) matches only classified resource
//! requests; a rule with `nonResourceURLs` matches only non-resource requests, by path (exact, or
//! a prefix ending in `*`). A request the parser could not classify is matched by no resource
//! rule, only by a `nonResourceURLs` grant. Any subject with a grant on a cluster may GET the
//! discovery paths (as kube's `system:discovery` and `system:public-info-viewer`) and create the
//! self reviews kubectl asks who it is with (as `system:basic-user`). [`CompiledPolicy`] is built
//! off the hot path with every
//! routing table: per subject (user or group) and per cluster the indices of the rules that apply,
//! each rule a verb bitmask plus optional resource / namespace / name lists. A check is a few hash
//! lookups and slice scans and allocates nothing. Deny by default: only grants exist.
//!
//! Called by `table` (compile), by the gateway's identity layer (check per request), and by
//! whoever needs the clusters a subject may reach ([`reachable_clusters`]). Never does I/O.

use std::sync::Arc;

use crate::auth::{Authenticators, Identity};
use crate::objects::{AuthorizationMode, PolicyRule, SubjectKind};
pub use crate::request_info::Verb;
use crate::request_info::{KubeVerb, NonResourceMethod, RequestInfo};
use crate::settings::Config;

pub use crate::auth::{ANONYMOUS_USER, AUTHENTICATED_GROUP};

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

/// What a request is, as a policy sees it: kube-apiserver's request info.
pub type RequestAttributes<'a> = RequestInfo<'a>;

/// The verb a grant names for `info`, as text ("unknown" for a method no verb stands for).
pub fn grant_verb_name(info: &RequestInfo<'_>) -> &'static str {
    info.policy_verb().map_or("unknown", Verb::name)
}

/// Whether any subject with a grant on the cluster may make this request: GETs of the
/// discovery paths (kube's `system:discovery` and `system:public-info-viewer`), and the self
/// reviews kubectl uses to ask who it is and what it may do (`system:basic-user`).
pub fn is_basic(info: &RequestInfo<'_>) -> bool {
    if !info.is_resource_request {
        let get = matches!(
            info.verb,
            KubeVerb::Method(NonResourceMethod::Get | NonResourceMethod::Head)
        );
        return get && info.classified && is_discovery_path(info.path);
    }
    self_review(info).is_some()
}

/// A review a user makes of themselves: it answers about whoever creates it, so it tells the
/// creator nothing about anyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfReview {
    /// `selfsubjectreviews.authentication.k8s.io` (`kubectl auth whoami`): who the member sees.
    Subject,
    /// `selfsubjectaccessreviews.authorization.k8s.io` (`kubectl auth can-i VERB RESOURCE`).
    Access,
    /// `selfsubjectrulesreviews.authorization.k8s.io` (`kubectl auth can-i --list`).
    Rules,
}

/// Which self review `info` creates, if it is the create of one (cluster-scoped, unnamed, no
/// subresource: the only form kube serves).
pub fn self_review(info: &RequestInfo<'_>) -> Option<SelfReview> {
    let create = info.is_resource_request
        && info.classified
        && info.verb == KubeVerb::Create
        && info.namespace.is_empty()
        && info.name.is_empty()
        && info.subresource.is_empty();
    if !create {
        return None;
    }
    match (info.api_group, info.resource) {
        ("authentication.k8s.io", "selfsubjectreviews") => Some(SelfReview::Subject),
        ("authorization.k8s.io", "selfsubjectaccessreviews") => Some(SelfReview::Access),
        ("authorization.k8s.io", "selfsubjectrulesreviews") => Some(SelfReview::Rules),
        _ => None,
    }
}

/// `/api`, `/api/{v}`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`, `/version`, `/openapi/v2`,
/// `/openapi/v3` and below it, `/healthz`, `/livez`, `/readyz` (a trailing slash allowed; no
/// segment with a `%`).
fn is_discovery_path(path: &[u8]) -> bool {
    let path = path.strip_suffix(b"/").unwrap_or(path);
    let Some(path) = path.strip_prefix(b"/") else {
        return false;
    };
    if path.contains(&b'%') {
        return false;
    }
    let mut segments = path.split(|b| *b == b'/');
    let first = segments.next().unwrap_or_default();
    let rest: usize = segments.clone().count();
    match first {
        b"api" => rest <= 1,
        b"apis" => rest <= 2,
        b"version" | b"healthz" | b"livez" | b"readyz" => rest == 0,
        b"openapi" => match segments.next() {
            Some(b"v2") => rest == 1,
            Some(b"v3") => true,
            _ => false,
        },
        _ => false,
    }
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
    /// Some: a non-resource rule, for these paths (exact, or a prefix ending in `*`).
    non_resource_urls: Option<Vec<String>>,
}

impl CompiledRule {
    fn matches(&self, info: &RequestInfo<'_>) -> bool {
        let Some(verb) = info.policy_verb() else {
            return false;
        };
        if self.verbs & verb.bit() == 0 {
            return false;
        }
        if let Some(urls) = &self.non_resource_urls {
            // Non-resource rules never match a resource request.
            if info.is_resource_request {
                return false;
            }
            return urls.iter().any(|url| url_matches(url, info.path));
        }
        // Resource rules match only what the parser classified as a resource request.
        if !(info.is_resource_request && info.classified) {
            return false;
        }
        self.matches_resource(info.api_group, info.resource, info.subresource)
            && self
                .namespaces
                .as_ref()
                .is_none_or(|n| n.iter().any(|n| n == info.namespace))
            && self
                .resource_names
                .as_ref()
                .is_none_or(|n| n.iter().any(|n| n == info.name))
    }

    fn matches_resource(&self, group: &str, resource: &str, subresource: &str) -> bool {
        self.resources.as_ref().is_none_or(|resources| {
            resources.iter().any(|r| {
                r.resource == resource
                    && r.group.as_deref().is_none_or(|g| g == group)
                    && r.subresource.as_deref().is_none_or(|s| s == subresource)
            })
        })
    }

    /// Whether the rule lets its subject impersonate `name` of `kind` (`users`, `groups`, `uids`,
    /// `userextras` with the extra key as the subresource).
    fn allows_impersonating(&self, kind: &str, extra_key: &str, name: &str) -> bool {
        self.verbs & Verb::Impersonate.bit() != 0
            && self.non_resource_urls.is_none()
            && self.matches_resource("", kind, extra_key)
            && self
                .resource_names
                .as_ref()
                .is_none_or(|n| n.iter().any(|n| n == name))
    }
}

/// RBAC's non-resource URL match: the path exactly, or any path under a `prefix*`; `*` is every
/// path. A path that is not UTF-8 matches only `*`.
fn url_matches(pattern: &str, path: &[u8]) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix.as_bytes()),
        None => path == pattern.as_bytes(),
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
    /// Where the policy was read (its file, or `api:...`), empty when unknown.
    pub origin: String,
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
                origin: policy.origin.clone(),
                field,
                message,
            };
            let spec = &policy.spec;
            let mut covered: Vec<Arc<str>> = Vec::new();
            let all = spec.clusters.names.iter().any(|n| n == "*");
            for (cluster, shared) in config.clusters.iter().zip(&compiled.all_clusters) {
                let named = all || spec.clusters.names.contains(&cluster.name);
                let selected = match &spec.clusters.selector {
                    Some(selector) => crate::selector::matches(selector, &cluster.labels)
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
        let basic = is_basic(attrs);
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
        if self.mode == AuthorizationMode::AlwaysAllow {
            return true;
        }
        self.grants(identity, cluster).any(|rules| {
            rules
                .iter()
                .any(|i| self.rules[*i as usize].allows_impersonating(kind, extra_key, name))
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
            // The HTTP verbs RBAC uses for nonResourceURLs name the same grants.
            let verb = match verb.as_str() {
                "head" => "get",
                "post" => "create",
                "put" => "update",
                other => other,
            };
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
    if let Some(urls) = &rule.non_resource_urls {
        if rule.resources.is_some() || rule.namespaces.is_some() || rule.resource_names.is_some() {
            return Err(
                "a rule has either nonResourceURLs or resources (with namespaces and resourceNames), not both"
                    .into(),
            );
        }
        if urls.is_empty() {
            return Err("nonResourceURLs needs at least one path".into());
        }
        if let Some(bad) = urls
            .iter()
            .find(|u| !(u.starts_with('/') || u.as_str() == "*") || u[..u.len() - 1].contains('*'))
        {
            return Err(format!(
                "nonResourceURLs entry {bad:?} is not a path starting with / (a trailing * for a prefix) or *"
            ));
        }
    }
    Ok(CompiledRule {
        verbs,
        resources,
        namespaces: star(&rule.namespaces),
        resource_names: star(&rule.resource_names),
        non_resource_urls: rule.non_resource_urls.clone(),
    })
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
        Ok(Self::from_compiled(
            config,
            CompiledPolicy::compile(config)?,
        ))
    }

    /// The access control of `config` with its policies compiled already (`policy`): the table
    /// builder compiles them until every one that does not compile is left out.
    pub(crate) fn from_compiled(config: &Config, policy: CompiledPolicy) -> AccessControl {
        if config.gateway.auth.authorization_mode == AuthorizationMode::AlwaysAllow {
            tracing::warn!(
                "spec.auth.authorizationMode is AlwaysAllow: AccessPolicy objects are not enforced, \
                 every authenticated client may do anything the cluster credentials allow"
            );
        }
        AccessControl {
            authenticators: Authenticators::build(&config.gateway.auth),
            policy,
        }
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

    #[test]
    fn discovery_and_self_reviews_are_basic_and_nothing_else_is() {
        for discovery in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/apis/apps/v1/",
            "/version",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
            "/healthz",
        ] {
            let a = attrs("GET", discovery);
            assert!(!a.is_resource_request, "{discovery}");
            assert!(is_basic(&a), "{discovery}");
        }
        for (path, kind) in [
            (
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                SelfReview::Subject,
            ),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                SelfReview::Access,
            ),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                SelfReview::Rules,
            ),
        ] {
            assert_eq!(self_review(&attrs("POST", path)), Some(kind), "{path}");
            assert!(is_basic(&attrs("POST", path)), "{path}");
        }
        for not_basic in [
            // Only the create of the collection is a self review: kube serves no other form.
            (
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/x",
            ),
            (
                "POST",
                "/apis/authorization.k8s.io/v1/namespaces/a/selfsubjectaccessreviews",
            ),
            (
                "GET",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            ),
            ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews"),
            ("POST", "/api/v1/namespaces/default/pods"),
            ("POST", "/version"),
            ("GET", "/metrics"),
            ("GET", "/logs/kube-apiserver.log"),
            ("GET", "/debug/pprof/heap"),
            ("GET", "/foo/bar/baz/qux/a/b/c/d/e/f/g"),
            ("GET", "/apis/apps/v1/namespaces/kube-system/deployments"),
            ("GET", "/openapi/v2/x"),
            ("GET", "/api/v%31"),
        ] {
            let (method, path) = not_basic;
            assert!(!is_basic(&attrs(method, path)), "{method} {path}");
        }
    }

    const NAMESPACE_GRANT: &str = r#"
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: default-only}
spec:
  subjects: [{kind: User, name: dana}]
  clusters: {names: [dev1]}
  rules:
    - verbs: ["*"]
      namespaces: [default]
---
apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata: {name: metrics-reader}
spec:
  subjects: [{kind: User, name: mo}]
  clusters: {names: [dev1]}
  rules:
    - verbs: [get]
      nonResourceURLs: [/metrics, "/logs/*"]
"#;

    #[test]
    fn deep_unclassified_and_non_resource_paths_get_no_resource_grant() {
        let policy = CompiledPolicy::compile(&config(NAMESPACE_GRANT)).unwrap();
        let dana = who("dana", &[]);
        // The attack that passed: a grant on namespace default, a deep proxy path into
        // kube-system.
        for (method, path) in [
            (
                "GET",
                "/api/v1/namespaces/kube-system/services/svc:443/proxy/a/b/c/d",
            ),
            (
                "GET",
                "/api/v1/namespaces/kube-system/pods/p/proxy/a/b/c/d/e/f/g/h/i/j/k",
            ),
            ("GET", "/api/v1/namespaces/kube%2Dsystem/configmaps"),
            ("GET", "/api/v1/namespaces/default/config%6Daps/x"),
            ("GET", "/api/v1/proxy"),
            ("GET", "/metrics"),
            ("GET", "/logs/x"),
            ("GET", "/some/deep/non/resource/path/a/b/c/d/e/f/g"),
        ] {
            assert!(
                !policy.allows(&dana, "dev1", &attrs(method, path)),
                "{method} {path}"
            );
        }
        // What the grant does give: namespace default at any depth, and discovery.
        for (method, path) in [
            (
                "GET",
                "/api/v1/namespaces/default/services/svc:443/proxy/a/b/c/d/e/f/g/h",
            ),
            ("POST", "/api/v1/namespaces/default/configmaps"),
            ("GET", "/apis"),
        ] {
            assert!(
                policy.allows(&dana, "dev1", &attrs(method, path)),
                "{method} {path}"
            );
        }
        // A nonResourceURLs grant: exactly its paths, and never a resource.
        let mo = who("mo", &[]);
        assert!(policy.allows(&mo, "dev1", &attrs("GET", "/metrics")));
        assert!(policy.allows(&mo, "dev1", &attrs("GET", "/logs/kube-apiserver.log")));
        assert!(!policy.allows(&mo, "dev1", &attrs("POST", "/metrics")));
        assert!(!policy.allows(&mo, "dev1", &attrs("GET", "/metricsx")));
        assert!(!policy.allows(
            &mo,
            "dev1",
            &attrs("GET", "/api/v1/namespaces/default/pods")
        ));
    }

    #[test]
    fn a_rule_with_both_resources_and_non_resource_urls_is_refused() {
        let both = NAMESPACE_GRANT.replace(
            "nonResourceURLs: [/metrics, \"/logs/*\"]",
            "nonResourceURLs: [/metrics]\n      resources: [pods]",
        );
        let err = CompiledPolicy::compile(&config(&both)).unwrap_err();
        assert!(err.to_string().contains("metrics-reader"), "{err}");
        assert!(err.to_string().contains("not both"), "{err}");
        let bad = NAMESPACE_GRANT.replace("/metrics, ", "metrics, ");
        assert!(CompiledPolicy::compile(&config(&bad)).is_err());
    }

    fn config_unchecked(policies: &str) -> Config {
        config(policies)
    }
}
