//! Request routing: which member cluster a request target names, and the path to send it there.
//!
//! Recognizes the native `/clusters/{name}/...` form, the Karmada and Karpor aggregated-proxy
//! forms, the OCM user-server `/{name}/...` form (when the Gateway enables it), the fleet view
//! (`/fleet/...` and karmada-search's proxying path, either aimed at one cluster by a
//! `/cluster.fleetgate.io/{name}` hint after the prefix), and the gateway's own health paths. The
//! prefix is stripped (an empty rest becomes `/`), the query is passed on raw and
//! percent-encoding is never decoded, so the member sees exactly the bytes the client sent.
//! This module does no lookup in the routing table and never allocates; the connection driver
//! (`handle`, through `request::decide`) calls [`route`] and then asks the table for the cluster.
//!
//! After a cluster prefix, [`service_path`] recognizes the direct service path of a pull-mode
//! cluster, `/services/{namespace}/{name}:{port}/{path}`: `services` is no root segment of a
//! kube-apiserver (its roots are `api`, `apis`, `version`, `openapi`, `healthz`, `livez`,
//! `readyz`, `metrics`, `logs`, `.well-known`, `debug`), so no kube path is taken from a member.

use fleetgate_config_watcher::RESERVED_CLUSTER_NAMES;

use crate::tunnel::wire::ServiceRef;

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
    /// The fleet view: the cluster a `cluster.fleetgate.io/NAME` hint aims it at, the kube path
    /// after the prefix and the hint (possibly empty) and the query.
    Fleet {
        aimed: Option<&'a str>,
        rest: &'a [u8],
        query: &'a [u8],
    },
    /// Nothing the gateway serves.
    NotFound,
}

const KARMADA: &[u8] = b"/apis/cluster.karmada.io/v1alpha1/clusters/";
const KARPOR: &[u8] = b"/apis/cluster.karpor.io/v1beta1/clusters/";
const NATIVE: &[u8] = b"/clusters/";
const FLEET: &[u8] = b"/fleet";
/// karmada-search's global-resource proxy, so a Karmada user's kubeconfig keeps working.
const KARMADA_SEARCH: &[u8] = b"/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy";
/// After a fleet prefix, aims the fleet view at one cluster: `/fleet/cluster.fleetgate.io/NAME/...`.
const FLEET_HINT: &[u8] = b"/cluster.fleetgate.io";

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
    for prefix in [FLEET, KARMADA_SEARCH] {
        if let Some(rest) = path.strip_prefix(prefix) {
            if rest.is_empty() || rest.starts_with(b"/") {
                return fleet(rest, query);
            }
        }
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

/// The fleet view's path after its prefix: a `cluster.fleetgate.io/NAME` hint (a cluster name as
/// `/clusters/NAME` takes it, once) and the kube path. A hint without a valid name, or a second
/// hint, routes nowhere: it never reaches a member as part of a kube path.
fn fleet<'a>(rest: &'a [u8], query: &'a [u8]) -> Route<'a> {
    let Some(after) = hint_at(rest) else {
        return Route::Fleet {
            aimed: None,
            rest,
            query,
        };
    };
    let Some((name, rest)) = after.strip_prefix(b"/").and_then(split_name) else {
        return Route::NotFound;
    };
    if hint_at(rest).is_some() {
        return Route::NotFound;
    }
    Route::Fleet {
        aimed: Some(name),
        rest,
        query,
    }
}

/// What follows a `/cluster.fleetgate.io` segment that `path` starts with.
fn hint_at(path: &[u8]) -> Option<&[u8]> {
    path.strip_prefix(FLEET_HINT)
        .filter(|after| after.is_empty() || after.starts_with(b"/"))
}

/// The direct service path after a cluster prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePath<'a> {
    pub service: ServiceRef<'a>,
    /// `NAME:PORT`, as the apiserver's proxy path names the service (what a policy's
    /// `resourceNames` lists for either path).
    pub name_port: &'a str,
    /// The service's own path (possibly empty: `/`), passed on raw.
    pub path: &'a [u8],
}

const SERVICES: &[u8] = b"/services";

/// The direct service path `rest` (a cluster's path after its prefix) names: None when `rest` is
/// not under `/services`; an error (for a 400) when it is and is not exactly
/// `/services/{namespace}/{name}:{port}[/{path}]` with DNS-label names and a numeric port. Never
/// decodes: a `%` in a name fails it.
pub fn service_path(rest: &[u8]) -> Option<Result<ServicePath<'_>, &'static str>> {
    let after = rest.strip_prefix(SERVICES)?;
    if !(after.is_empty() || after.starts_with(b"/")) {
        return None;
    }
    Some(parse_service_path(after))
}

fn parse_service_path(after: &[u8]) -> Result<ServicePath<'_>, &'static str> {
    const FORM: &str = "the service path is /services/NAMESPACE/NAME:PORT/PATH";
    let after = after.strip_prefix(b"/").ok_or(FORM)?;
    let slash = after.iter().position(|b| *b == b'/').ok_or(FORM)?;
    let (namespace, rest) = after.split_at(slash);
    let rest = &rest[1..];
    let end = rest.iter().position(|b| *b == b'/').unwrap_or(rest.len());
    let (name_port, path) = rest.split_at(end);
    let namespace = std::str::from_utf8(namespace).map_err(|_| FORM)?;
    let name_port = std::str::from_utf8(name_port).map_err(|_| FORM)?;
    let (name, port) = name_port
        .split_once(':')
        .ok_or("the service path names NAME:PORT (the port, a number, is required)")?;
    let service = ServiceRef::new(namespace, name, port)?;
    Ok(ServicePath {
        service,
        name_port,
        path,
    })
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
    fn the_fleet_view_has_two_prefixes() {
        let want = Route::Fleet {
            aimed: None,
            rest: b"/api/v1/pods",
            query: b"?limit=500",
        };
        assert_eq!(route(b"/fleet/api/v1/pods?limit=500", false), want);
        assert_eq!(
            route(
                b"/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy/api/v1/pods?limit=500",
                false
            ),
            want
        );
        assert_eq!(
            route(b"/fleet", true),
            Route::Fleet {
                aimed: None,
                rest: b"",
                query: b""
            }
        );
        // `fleet` is a reserved cluster name, so the OCM form never takes it either.
        assert_eq!(route(b"/fleetx/api", false), Route::NotFound);
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
    fn the_direct_service_path_is_strict() {
        let parsed = service_path(b"/services/team-a/echo:8080/some/path").unwrap();
        let want = ServicePath {
            service: ServiceRef::parse("team-a/echo:8080").unwrap(),
            name_port: "echo:8080",
            path: b"/some/path",
        };
        assert_eq!(parsed, Ok(want));
        assert_eq!(service_path(b"/services/a/b:1").unwrap().unwrap().path, b"");
        assert_eq!(service_path(b"/api/v1/services"), None);
        assert_eq!(service_path(b"/servicesx/a/b:1"), None);
        let long = "a".repeat(64);
        for bad in [
            "/services".to_owned(),
            "/services/".to_owned(),
            "/services/ns".to_owned(),
            "/services/ns/".to_owned(),
            "/services/ns/echo".to_owned(),
            "/services/ns/echo/x".to_owned(),
            "/services/ns/echo:/x".to_owned(),
            "/services/ns/:80/x".to_owned(),
            "/services//echo:80/x".to_owned(),
            "/services/ns/echo:0".to_owned(),
            "/services/ns/echo:65536".to_owned(),
            "/services/ns/echo:http".to_owned(),
            "/services/ns/http:echo:80".to_owned(),
            "/services/ns/echo:80:81".to_owned(),
            "/services/n%73/echo:80".to_owned(),
            "/services/ns/ech%6f:80".to_owned(),
            "/services/ns/echo%3A80".to_owned(),
            "/services/NS/echo:80".to_owned(),
            "/services/ns/e.cho:80".to_owned(),
            "/services/../echo:80".to_owned(),
            format!("/services/{long}/echo:80"),
            format!("/services/ns/{long}:80"),
        ] {
            assert!(
                matches!(service_path(bad.as_bytes()), Some(Err(_))),
                "{bad} accepted"
            );
        }
        assert!(matches!(
            service_path(b"/services/ns/\xff:80"),
            Some(Err(_))
        ));
    }

    #[test]
    fn a_hint_aims_the_fleet_view_at_one_cluster() {
        let aimed = |target: &str| match route(target.as_bytes(), false) {
            Route::Fleet { aimed, rest, query } => Some((
                aimed.map(str::to_owned),
                String::from_utf8([rest, query].concat()).unwrap(),
            )),
            _ => None,
        };
        let want = Some((
            Some("member2".to_owned()),
            "/api/v1/pods?limit=1".to_owned(),
        ));
        assert_eq!(
            aimed("/fleet/cluster.fleetgate.io/member2/api/v1/pods?limit=1"),
            want
        );
        assert_eq!(
            aimed("/apis/search.karmada.io/v1alpha1/proxying/karmada/proxy/cluster.fleetgate.io/member2/api/v1/pods?limit=1"),
            want
        );
        assert_eq!(
            aimed("/fleet/cluster.fleetgate.io/m?x"),
            Some((Some("m".to_owned()), "?x".to_owned()))
        );
        // Hostile hints route nowhere: no name, a name kube would not take, a dot segment,
        // an encoded slash, a name over 63 bytes, upper case, a second hint, a name glued to
        // its path.
        let long = "a".repeat(64);
        for target in [
            "/fleet/cluster.fleetgate.io",
            "/fleet/cluster.fleetgate.io/",
            "/fleet/cluster.fleetgate.io//api",
            "/fleet/cluster.fleetgate.io/../api/v1/pods",
            "/fleet/cluster.fleetgate.io/./api",
            "/fleet/cluster.fleetgate.io/member%2F2/api",
            "/fleet/cluster.fleetgate.io/member2%2Fapi",
            &format!("/fleet/cluster.fleetgate.io/{long}/api"),
            "/fleet/cluster.fleetgate.io/Member2/api",
            "/fleet/cluster.fleetgate.io/member2/cluster.fleetgate.io/member1/api",
            "/fleet/cluster.fleetgate.io/member2/cluster.fleetgate.io",
            "/fleet/cluster.fleetgate.io/member2?/api",
        ] {
            let routed = route(target.as_bytes(), true);
            let refused = routed == Route::NotFound
                || matches!(
                    routed,
                    Route::Fleet {
                        aimed: Some("member2"),
                        rest: b"",
                        ..
                    }
                );
            assert!(refused, "{target}: {routed:?}");
        }
        // Without the hint's own slash, it is an ordinary (non-resource) fleet path.
        assert_eq!(
            aimed("/fleet/cluster.fleetgate.iox/api"),
            Some((None, "/cluster.fleetgate.iox/api".to_owned()))
        );
    }
}
