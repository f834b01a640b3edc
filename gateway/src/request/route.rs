//! Request routing: which member cluster a request target names, and the path to send it there.
//!
//! Recognizes the native `/clusters/{name}/...` form, the Karmada and Karpor aggregated-proxy
//! forms, the OCM user-server `/{name}/...` form (when the Gateway enables it), and the gateway's
//! own health paths. The prefix is stripped (an empty rest becomes `/`), the query is passed on
//! raw and percent-encoding is never decoded, so the member sees exactly the bytes the client sent.
//! This module does no lookup in the routing table and never allocates; the connection driver
//! (`proxy`) calls [`route`] and then asks the table for the cluster.

use fleetgate_config_watcher::RESERVED_CLUSTER_NAMES;

/// Where a request target goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/healthz`, `/readyz` or `/livez`, answered by the gateway itself.
    Health(&'a str),
    /// A member cluster: its name, the kube path after the prefix (possibly empty) and the query
    /// including its `?` (possibly empty).
    Cluster {
        name: &'a str,
        rest: &'a [u8],
        query: &'a [u8],
    },
    /// Nothing the gateway serves.
    NotFound,
}

const KARMADA: &[u8] = b"/apis/cluster.karmada.io/v1alpha1/clusters/";
const KARPOR: &[u8] = b"/apis/cluster.karpor.io/v1beta1/clusters/";
const NATIVE: &[u8] = b"/clusters/";

/// Splits `{name}{tail}` where the name ends at `/` or the end of the path.
fn split_name(after: &[u8]) -> Option<(&str, &[u8])> {
    let end = after.iter().position(|b| *b == b'/').unwrap_or(after.len());
    let name = &after[..end];
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !valid {
        return None;
    }
    Some((std::str::from_utf8(name).ok()?, &after[end..]))
}

/// Routes a request target (origin-form: path and optional query).
pub fn route(target: &[u8], ocm_style: bool) -> Route<'_> {
    let (path, query) = match target.iter().position(|b| *b == b'?') {
        Some(q) => target.split_at(q),
        None => (target, &b""[..]),
    };
    match path {
        b"/healthz" => return Route::Health("healthz"),
        b"/readyz" => return Route::Health("readyz"),
        b"/livez" => return Route::Health("livez"),
        _ => {}
    }
    if let Some(after) = path.strip_prefix(NATIVE) {
        return match split_name(after) {
            Some((name, rest)) => Route::Cluster { name, rest, query },
            None => Route::NotFound,
        };
    }
    for prefix in [KARMADA, KARPOR] {
        if let Some(after) = path.strip_prefix(prefix) {
            return match split_name(after) {
                Some((name, tail)) => match tail.strip_prefix(b"/proxy") {
                    Some(rest) if rest.is_empty() || rest.starts_with(b"/") => {
                        Route::Cluster { name, rest, query }
                    }
                    _ => Route::NotFound,
                },
                None => Route::NotFound,
            };
        }
    }
    if ocm_style {
        // A target not starting with `/` (an h2 `:path` of `?x`, say) names no cluster.
        if let Some((name, rest)) = path.strip_prefix(b"/").and_then(split_name) {
            if !RESERVED_CLUSTER_NAMES.contains(&name) {
                return Route::Cluster { name, rest, query };
            }
        }
    }
    Route::NotFound
}

/// Appends the upstream request target: the cluster's server path prefix, the rest (or `/`) and
/// the raw query.
pub fn push_upstream_target(out: &mut Vec<u8>, path_prefix: &str, rest: &[u8], query: &[u8]) {
    out.extend_from_slice(path_prefix.trim_end_matches('/').as_bytes());
    if rest.is_empty() {
        out.push(b'/');
    } else {
        out.extend_from_slice(rest);
    }
    out.extend_from_slice(query);
}

/// Whether a request is long-running (kube-apiserver's own notion): a watch, a followed log, or
/// an exec / attach / port-forward / proxy subresource. Such requests get no response-head timeout
/// beyond the connect timeout and are never timed out while they flow.
pub fn is_long_running(rest: &[u8], query: &[u8]) -> bool {
    if has_flag(query, b"watch") || has_flag(query, b"follow") {
        return true;
    }
    let mut segments = rest.split(|b| *b == b'/').filter(|s| !s.is_empty());
    let is_watch_path = rest == b"/api/v1/watch"
        || rest.starts_with(b"/api/v1/watch/")
        || (rest.starts_with(b"/apis/") && segments.clone().nth(3) == Some(b"watch"));
    is_watch_path || segments.any(is_connect_subresource)
}

fn is_connect_subresource(segment: &[u8]) -> bool {
    matches!(segment, b"exec" | b"attach" | b"portforward" | b"proxy")
}

fn has_flag(query: &[u8], name: &[u8]) -> bool {
    let query = query.strip_prefix(b"?").unwrap_or(query);
    query.split(|b| *b == b'&').any(|pair| {
        let mut kv = pair.splitn(2, |b| *b == b'=');
        kv.next() == Some(name) && kv.next().is_some_and(|v| v == b"true" || v == b"1")
    })
}

/// The Kubernetes verb of a request, as kube-apiserver's request-info resolver would name it
/// (for metrics now, for access policy later): a collection GET is `list`, with `watch=true` it is
/// `watch`, a POST to exec / attach / portforward / proxy is `connect`, and so on. Paths outside
/// `/api` and `/apis` (discovery, `/version`, `/openapi`) are `get`.
pub fn kube_verb(method: &[u8], rest: &[u8], query: &[u8]) -> &'static str {
    let segments: [&[u8]; 8] = {
        let mut out: [&[u8]; 8] = [b""; 8];
        for (slot, s) in out
            .iter_mut()
            .zip(rest.split(|b| *b == b'/').filter(|s| !s.is_empty()))
        {
            *slot = s;
        }
        out
    };
    let count = rest.split(|b| *b == b'/').filter(|s| !s.is_empty()).count();
    // Index of the first segment after the group/version: /api/v1/.. -> 2, /apis/g/v/.. -> 3.
    let base = match segments[0] {
        b"api" => 2,
        b"apis" => 3,
        _ => {
            return if method == b"GET" || method == b"HEAD" {
                "get"
            } else {
                "other"
            }
        }
    };
    let mut resource_segments = count.saturating_sub(base);
    let mut legacy_watch = false;
    if segments.get(base) == Some(&&b"watch"[..]) {
        legacy_watch = true;
        resource_segments = resource_segments.saturating_sub(1);
    }
    let namespaced = segments.get(base + usize::from(legacy_watch)) == Some(&&b"namespaces"[..])
        && resource_segments >= 3;
    let after_ns = if namespaced {
        resource_segments - 2
    } else {
        resource_segments
    };
    let collection = after_ns == 1;
    if rest
        .split(|b| *b == b'/')
        .filter(|s| !s.is_empty())
        .skip(base)
        .any(is_connect_subresource)
    {
        return "connect";
    }
    match method {
        b"GET" | b"HEAD" => {
            if legacy_watch || has_flag(query, b"watch") {
                "watch"
            } else if collection || resource_segments == 0 {
                if resource_segments == 0 {
                    "get"
                } else {
                    "list"
                }
            } else {
                "get"
            }
        }
        b"POST" => "create",
        b"PUT" => "update",
        b"PATCH" => "patch",
        b"DELETE" if collection => "deletecollection",
        b"DELETE" => "delete",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(target: &str, ocm: bool) -> Option<(String, String)> {
        match route(target.as_bytes(), ocm) {
            Route::Cluster { name, rest, query } => {
                let mut out = Vec::new();
                push_upstream_target(&mut out, "", rest, query);
                Some((name.to_string(), String::from_utf8(out).unwrap()))
            }
            _ => None,
        }
    }

    #[test]
    fn every_path_form_reaches_the_same_upstream_path() {
        let want = Some((
            "member1".to_string(),
            "/api/v1/namespaces/a%2Fb/pods?watch=1&x=%20".to_string(),
        ));
        let tail = "/api/v1/namespaces/a%2Fb/pods?watch=1&x=%20";
        assert_eq!(cluster(&format!("/clusters/member1{tail}"), false), want);
        assert_eq!(
            cluster(
                &format!("/apis/cluster.karmada.io/v1alpha1/clusters/member1/proxy{tail}"),
                false
            ),
            want
        );
        assert_eq!(
            cluster(
                &format!("/apis/cluster.karpor.io/v1beta1/clusters/member1/proxy{tail}"),
                false
            ),
            want
        );
        assert_eq!(cluster(&format!("/member1{tail}"), true), want);
        assert_eq!(cluster(&format!("/member1{tail}"), false), None);
    }

    #[test]
    fn empty_rest_becomes_slash_and_prefix_is_prepended() {
        assert_eq!(
            cluster("/clusters/m?timeout=32s", false),
            Some(("m".into(), "/?timeout=32s".into()))
        );
        let mut out = Vec::new();
        push_upstream_target(&mut out, "/k8s/", b"/api", b"");
        assert_eq!(out, b"/k8s/api");
    }

    #[test]
    fn reserved_and_malformed_names_do_not_route() {
        assert_eq!(route(b"/healthz", true), Route::Health("healthz"));
        assert_eq!(route(b"/api/v1/pods", true), Route::NotFound);
        assert_eq!(route(b"/clusters/", false), Route::NotFound);
        assert_eq!(route(b"/clusters/UP/api", false), Route::NotFound);
        // Targets that do not start with `/` route nowhere, in every mode (this one panicked).
        for target in [&b"?x"[..], b"", b"*", b"member1/api"] {
            assert_eq!(route(target, true), Route::NotFound, "{target:?}");
            assert_eq!(route(target, false), Route::NotFound, "{target:?}");
        }
        assert_eq!(route(b"/clusters/a%2Fb/api", false), Route::NotFound);
        assert_eq!(
            route(
                b"/apis/cluster.karmada.io/v1alpha1/clusters/m/status",
                false
            ),
            Route::NotFound
        );
        assert_eq!(
            route(
                b"/apis/cluster.karmada.io/v1alpha1/clusters/m/proxyx",
                false
            ),
            Route::NotFound
        );
    }

    #[test]
    fn long_running_requests_are_recognized() {
        assert!(is_long_running(b"/api/v1/pods", b"?watch=true"));
        assert!(is_long_running(b"/api/v1/pods", b"?limit=1&watch=1"));
        assert!(is_long_running(
            b"/api/v1/namespaces/a/pods/p/log",
            b"?follow=true"
        ));
        assert!(is_long_running(
            b"/api/v1/namespaces/a/pods/p/exec",
            b"?command=ls"
        ));
        assert!(is_long_running(b"/api/v1/watch/pods", b""));
        assert!(is_long_running(b"/apis/apps/v1/watch/deployments", b""));
        assert!(!is_long_running(b"/api/v1/pods", b"?watch=false"));
        assert!(!is_long_running(b"/api/v1/namespaces/a/pods/p/log", b""));
        assert!(!is_long_running(b"/api/v1/namespaces/watch/pods", b""));
    }

    #[test]
    fn verbs_follow_kube_request_info() {
        assert_eq!(kube_verb(b"GET", b"/api/v1/pods", b""), "list");
        assert_eq!(kube_verb(b"GET", b"/api/v1/namespaces/a/pods", b""), "list");
        assert_eq!(
            kube_verb(b"GET", b"/api/v1/namespaces/a/pods/p", b""),
            "get"
        );
        assert_eq!(kube_verb(b"GET", b"/api/v1/namespaces/a", b""), "get");
        assert_eq!(kube_verb(b"GET", b"/api/v1/namespaces", b""), "list");
        assert_eq!(
            kube_verb(b"GET", b"/apis/apps/v1/deployments", b"?watch=1"),
            "watch"
        );
        assert_eq!(
            kube_verb(b"GET", b"/api/v1/watch/namespaces/a/pods", b""),
            "watch"
        );
        assert_eq!(kube_verb(b"GET", b"/api/v1", b""), "get");
        assert_eq!(kube_verb(b"GET", b"/version", b""), "get");
        assert_eq!(
            kube_verb(b"POST", b"/api/v1/namespaces/a/pods/p/exec", b""),
            "connect"
        );
        assert_eq!(
            kube_verb(b"POST", b"/api/v1/namespaces/a/configmaps", b""),
            "create"
        );
        assert_eq!(
            kube_verb(b"DELETE", b"/api/v1/namespaces/a/configmaps", b""),
            "deletecollection"
        );
        assert_eq!(
            kube_verb(b"DELETE", b"/api/v1/namespaces/a/configmaps/c", b""),
            "delete"
        );
        assert_eq!(
            kube_verb(b"PATCH", b"/api/v1/namespaces/a/configmaps/c", b""),
            "patch"
        );
    }
}
