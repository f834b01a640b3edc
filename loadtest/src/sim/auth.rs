//! Identity at a simulated member: who is calling (bearer token or verified client certificate),
//! who they act as (`Impersonate-*` headers, honoured only for a credential allowed to
//! impersonate), and the small built-in allow list that makes a 403 real.
//!
//! This module decides; it never writes a response (the router maps its errors to Status objects
//! through `status`). Called by the router (`api`) for every request.

use std::collections::{BTreeMap, HashMap};

use http::HeaderMap;

/// The group every authenticated request carries.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group that may do anything.
pub const MASTERS_GROUP: &str = "system:masters";
/// The user the gateway authenticates as at the members (token in the Cluster objects).
pub const GATEWAY_USER: &str = "fleetgate-gateway";

/// An authenticated (and possibly impersonated) user, as Kubernetes' `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn new(name: &str, uid: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_string());
        }
        Self {
            name: name.to_string(),
            uid: uid.to_string(),
            groups,
            extra: BTreeMap::new(),
        }
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Whether this user's requests are exempt from API Priority and Fairness (decides the
    /// `X-Kubernetes-Pf-*` header values, as the recorded server did for system:masters).
    pub fn is_exempt(&self) -> bool {
        self.in_group(MASTERS_GROUP)
    }
}

/// The bearer tokens a member accepts (the fleet's `users/tokens.csv` plus the gateway's token).
#[derive(Debug, Default, Clone)]
pub struct TokenAuthenticator {
    tokens: HashMap<String, UserInfo>,
}

impl TokenAuthenticator {
    pub fn insert(&mut self, token: String, user: UserInfo) {
        self.tokens.insert(token, user);
    }

    pub fn authenticate(&self, token: &str) -> Option<&UserInfo> {
        self.tokens.get(token)
    }
}

/// Why a request's identity was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No credential, or one the member does not know: 401.
    #[error("Unauthorized")]
    Unauthenticated,
    /// The caller may not impersonate: 403 naming what it tried to impersonate.
    #[error("{kind} {name:?} is forbidden: User {user:?} cannot impersonate resource {kind:?} in API group \"\" at the cluster scope")]
    ImpersonationForbidden {
        user: String,
        kind: &'static str,
        name: String,
    },
    /// Impersonate-Group (or -Uid / -Extra) without Impersonate-User: a 500 in text, as recorded.
    #[error("requested [{requested}] without impersonating a user")]
    ImpersonationWithoutUser { requested: String },
}

/// Applies the `Impersonate-*` headers of `headers` on behalf of `caller`.
///
/// Returns the caller itself when no impersonation header is present.
pub fn impersonate(caller: &UserInfo, headers: &HeaderMap) -> Result<UserInfo, AuthError> {
    let user = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let uid = headers
        .get("impersonate-uid")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
            let key = percent_encoding::percent_decode_str(key)
                .decode_utf8_lossy()
                .into_owned();
            if let Ok(value) = value.to_str() {
                extra.entry(key).or_default().push(value.to_string());
            }
        }
    }
    let Some(user) = user else {
        if groups.is_empty() && uid.is_none() && extra.is_empty() {
            return Ok(caller.clone());
        }
        // Go prints the requested ImpersonationConfigs like `{Group  devs    }`.
        let requested = groups
            .iter()
            .map(|g| format!("{{Group  {g}    }}"))
            .chain(uid.iter().map(|u| format!("{{UID  {u}    }}")))
            .collect::<Vec<_>>()
            .join(" ");
        return Err(AuthError::ImpersonationWithoutUser { requested });
    };
    if !may_impersonate(caller) {
        // The user is checked first, as the real authorizer does.
        return Err(AuthError::ImpersonationForbidden {
            user: caller.name.clone(),
            kind: "users",
            name: user,
        });
    }
    let mut impersonated = UserInfo {
        name: user.clone(),
        uid: uid.unwrap_or_default(),
        groups,
        extra,
    };
    if user != "system:anonymous" && !impersonated.in_group(AUTHENTICATED_GROUP) {
        impersonated.groups.push(AUTHENTICATED_GROUP.to_string());
    }
    Ok(impersonated)
}

fn may_impersonate(caller: &UserInfo) -> bool {
    caller.in_group(MASTERS_GROUP) || caller.name == GATEWAY_USER
}

/// What a request does, in the terms the authorizer uses.
#[derive(Debug, Clone)]
pub struct RequestAttributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// `pods`, or `pods/log` for a subresource.
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// The built-in allow list (see docs/simulated-fleet.md for the table of rights).
pub fn authorize(user: &UserInfo, attrs: &RequestAttributes<'_>) -> bool {
    if user.in_group(MASTERS_GROUP) {
        return true;
    }
    // Reviews about oneself are open to every authenticated user.
    if attrs.verb == "create"
        && matches!(
            attrs.resource,
            "selfsubjectreviews" | "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
    {
        return true;
    }
    if user.name == GATEWAY_USER {
        // What a gateway with shared watches needs as itself: one list and one watch per
        // shared resource, which it then hands out only to users the member allows
        // (docs/watches.md). Nothing else, not even a get.
        return matches!(attrs.verb, "list" | "watch");
    }
    let read_only = matches!(attrs.verb, "get" | "list" | "watch");
    if user.name == "bob" && read_only && attrs.group.is_empty() && attrs.resource == "configmaps" {
        return true;
    }
    if (user.name == "alice" || user.in_group("devs"))
        && read_only
        && attrs.namespace == Some("dev")
    {
        return true;
    }
    if user.in_group("ops") && read_only {
        return true;
    }
    false
}

/// The paths every authenticated user may GET (kube's `system:discovery`), as RBAC writes
/// them: exact, or a prefix ending in `*`. [`rules_for`] lists them too.
const DISCOVERY_PATHS: [&str; 8] = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
];

/// Whether `user` may make a request of a non-resource `path` (`kubectl auth can-i get
/// /metrics`): discovery for everyone, anything for system:masters (the member serves its
/// `/metrics` to them only).
pub fn authorize_path(user: &UserInfo, verb: &str, path: &str) -> bool {
    let discovery = || {
        DISCOVERY_PATHS.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == *p,
        })
    };
    user.in_group(MASTERS_GROUP) || (verb == "get" && discovery())
}

/// The allow list of [`authorize`] as RBAC-style rules in `namespace`, for
/// SelfSubjectRulesReview (`kubectl auth can-i --list`). Kept next to `authorize` so both change
/// together.
pub fn rules_for(
    user: &UserInfo,
    namespace: &str,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    use serde_json::json;
    let read = json!(["get", "list", "watch"]);
    let mut resource_rules = vec![
        json!({
            "verbs": ["create"],
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["selfsubjectreviews"],
        }),
        json!({
            "verbs": ["create"],
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        }),
    ];
    let mut non_resource_rules = vec![json!({
        "verbs": ["get"],
        "nonResourceURLs": DISCOVERY_PATHS,
    })];
    if user.in_group(MASTERS_GROUP) {
        resource_rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        non_resource_rules.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
        return (resource_rules, non_resource_rules);
    }
    if user.name == GATEWAY_USER {
        resource_rules
            .push(json!({"verbs": ["list", "watch"], "apiGroups": ["*"], "resources": ["*"]}));
        return (resource_rules, non_resource_rules);
    }
    if user.name == "bob" {
        resource_rules.push(json!({"verbs": read, "apiGroups": [""], "resources": ["configmaps"]}));
    }
    if (user.name == "alice" || user.in_group("devs")) && namespace == "dev" {
        resource_rules.push(json!({"verbs": read, "apiGroups": ["*"], "resources": ["*"]}));
    }
    if user.in_group("ops") {
        resource_rules.push(json!({"verbs": read, "apiGroups": ["*"], "resources": ["*"]}));
    }
    (resource_rules, non_resource_rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alice_reads_only_in_dev() {
        let alice = UserInfo::new("alice", "", &["devs"]);
        let attrs = |ns| RequestAttributes {
            verb: "list",
            group: "",
            resource: "pods",
            namespace: Some(ns),
            name: None,
        };
        assert!(authorize(&alice, &attrs("dev")));
        assert!(!authorize(&alice, &attrs("default")));
    }

    #[test]
    fn every_user_may_get_discovery_and_only_masters_metrics() {
        let alice = UserInfo::new("alice", "", &["devs"]);
        let admin = UserInfo::new("admin", "", &[MASTERS_GROUP]);
        for path in ["/api", "/apis/apps/v1", "/version", "/openapi/v3"] {
            assert!(authorize_path(&alice, "get", path), "{path}");
        }
        assert!(!authorize_path(&alice, "post", "/api"));
        assert!(!authorize_path(&alice, "get", "/metrics"));
        assert!(!authorize_path(&alice, "get", "/apix"));
        assert!(authorize_path(&admin, "get", "/metrics"));
    }

    #[test]
    fn group_without_user_is_refused() {
        let admin = UserInfo::new("admin", "", &[MASTERS_GROUP]);
        let mut headers = HeaderMap::new();
        headers.insert("impersonate-group", "devs".parse().unwrap());
        assert!(matches!(
            impersonate(&admin, &headers),
            Err(AuthError::ImpersonationWithoutUser { .. })
        ));
    }
}
