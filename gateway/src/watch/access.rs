//! Whether the member lets the user watch (or list) a resource in a scope: a SelfSubjectAccessReview
//! (`authorization.k8s.io/v1`) sent as the user (the same impersonation as the user's own
//! requests), cached per shard for [`TTL`] by (route, user, groups, uid, extra, resource,
//! namespace).
//!
//! The AccessPolicy already allowed the request (`request::decide`); this asks the member's own
//! RBAC, which sharing would otherwise skip (the hub watches as the gateway). Allowed: the
//! client joins the shared watch. Refused, or the review could not be had: the client's watch
//! goes to the member as it came, so a refused user gets the member's own 403, byte for byte, as
//! without sharing. Never writes to the client.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ShardWatches;
use super::{Caller, HubKey, OwnRequests};
use crate::auth::ClientIdentity;
use crate::auth::Decided;
use crate::member::ask::{post, Asked};
use fleetgate_config_watcher::ClusterRoute;

/// How long a review's answer is trusted.
pub const TTL: Duration = Duration::from_secs(10);
/// Answers kept per shard; past it, expired ones are dropped, then all.
const MAX_ENTRIES: usize = 16 * 1024;

/// The shard's cached answers.
#[derive(Default)]
pub struct ReviewCache {
    answers: RefCell<HashMap<String, (bool, Instant)>>,
}

impl ReviewCache {
    fn get(&self, key: &str) -> Option<bool> {
        let answers = self.answers.borrow();
        let (allowed, at) = answers.get(key)?;
        (at.elapsed() < TTL).then_some(*allowed)
    }

    fn put(&self, key: String, allowed: bool) {
        let mut answers = self.answers.borrow_mut();
        if answers.len() >= MAX_ENTRIES {
            answers.retain(|_, (_, at)| at.elapsed() < TTL);
            if answers.len() >= MAX_ENTRIES {
                answers.clear();
            }
        }
        answers.insert(key, (allowed, Instant::now()));
    }
}

/// The cache key: everything the member's answer depends on, unambiguously joined.
fn cache_key(route: u64, who: &ClientIdentity, key: &HubKey, verb: &str) -> String {
    let mut groups = who.groups.clone();
    groups.sort();
    json!([
        route,
        verb,
        who.user,
        groups,
        who.uid,
        who.extra,
        key.group,
        key.resource,
        key.namespace
    ])
    .to_string()
}

/// Whether the member lets the request's user `verb` (`watch`, `list`) `key`'s resource in its
/// scope.
pub(crate) async fn may(
    ctx: &ShardWatches,
    cluster: &ClusterRoute,
    identity: &Decided,
    key: &HubKey,
    verb: &'static str,
    caller: Caller,
) -> bool {
    let Some(who) = identity.identity.as_deref() else {
        return false;
    };
    let cached = cache_key(cluster.id, who, key, verb);
    if let Some(allowed) = ctx.watch_reviews.get(&cached) {
        return allowed;
    }
    let mut attributes = json!({
        "verb": verb,
        "group": key.group,
        "version": key.version,
        "resource": key.resource,
    });
    if !key.namespace.is_empty() {
        attributes["namespace"] = json!(key.namespace);
    }
    let review = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {"resourceAttributes": attributes},
    });
    let body = serde_json::to_vec(&review).unwrap_or_default();
    let own = OwnRequests::new();
    let request = own.request(caller);
    let asked = Asked {
        rest: b"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        query: b"",
        verb: "create",
    };
    let answer = post(&ctx.exchange, &asked, &body, &request, cluster, identity).await;
    let allowed = match answer {
        Ok(body) => serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("status")?.get("allowed")?.as_bool())
            .unwrap_or(false),
        // No answer: not shared this time (the member decides the watch itself); not cached.
        Err(missed) => {
            tracing::debug!(cluster = %cluster.name, reason = %missed.warning(&cluster.name), "shared watch: no access review; proxied");
            return false;
        }
    };
    ctx.watch_reviews.put(cached, allowed);
    allowed
}
