//! The request target's path rule, applied before routing and policy: a path that a member (or a
//! proxy in front of one) could read as a different path than the gateway routed and authorized
//! is refused, never normalized and never forwarded.
//!
//! Refused (a 400 Status): a `.` or `..` segment, also percent-encoded (`%2e`, `.%2E`, ...); an
//! encoded `/` or `\` (`%2F`, `%5C`); a raw `\`; a NUL, raw or `%00`; an empty segment inside the
//! path (`//`); a `#`; a path that does not start with `/`. The query is not looked at: it is
//! passed on as it came and never decides a route. kubectl, client-go and the Python client never
//! send any of these. Called by `request::decide` for both front-ends; never allocates.

use crate::errors::GatewayError;

/// Checks the path of `target` (the part before `?`), in one pass over its bytes.
pub fn check(target: &[u8]) -> Result<(), GatewayError> {
    let refuse = |reason| Err(GatewayError::BadRequest { reason });
    let path = match memchr::memchr(b'?', target) {
        Some(q) => &target[..q],
        None => target,
    };
    let Some(rest) = path.strip_prefix(b"/") else {
        return refuse("the request path must start with /");
    };
    // A single trailing slash is an empty last segment: allowed (kube trims it).
    let rest = rest.strip_suffix(b"/").unwrap_or(rest);
    if rest.is_empty() {
        return Ok(());
    }
    let mut segment_start = 0;
    let mut i = 0;
    while i <= rest.len() {
        let b = rest.get(i).copied().unwrap_or(b'/');
        match b {
            b'/' => {
                let segment = &rest[segment_start..i];
                if segment.is_empty() {
                    return refuse("the request path has an empty segment (//)");
                }
                if segment.len() <= 6 && is_dot_segment(segment) {
                    return refuse("the request path has a . or .. segment");
                }
                segment_start = i + 1;
            }
            b'\\' | b'\0' | b'#' => {
                return refuse("the request path has a backslash, a NUL or a #")
            }
            b'%' => match decoded(&rest[i..]) {
                Some(b'/' | b'\\') => return refuse("the request path has an encoded / or \\"),
                Some(0) => return refuse("the request path has an encoded NUL"),
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The byte a `%XX` at the start of `bytes` stands for.
fn decoded(bytes: &[u8]) -> Option<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    match bytes {
        [b'%', high, low, ..] => Some((hex(*high)? * 16 + hex(*low)?) as u8),
        _ => None,
    }
}

/// `.` or `..`, each dot raw or as `%2e` / `%2E`.
fn is_dot_segment(segment: &[u8]) -> bool {
    let mut dots = 0;
    let mut rest = segment;
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if decoded(rest) == Some(b'.') {
            rest = &rest[3..];
        } else {
            return false;
        }
        dots += 1;
    }
    (1..=2).contains(&dots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_kube_paths_pass() {
        for ok in [
            "/",
            "/clusters/m/api/v1/namespaces/default/pods?watch=1&x=%2F..%2F",
            "/clusters/m/api/v1/namespaces/default/configmaps/a.b",
            "/clusters/m/apis/apps/v1/",
            "/clusters/m/api/v1/namespaces/default/services/svc:443/proxy/x%20y/...z",
            "/clusters/m/api/v1/namespaces/default/pods/p/log?follow=true",
            "/clusters/m/.well-known/openid-configuration",
            "/clusters/m/api/v1/namespaces/default/configmaps/...",
        ] {
            assert!(check(ok.as_bytes()).is_ok(), "{ok} refused");
        }
    }

    #[test]
    fn paths_a_member_could_read_differently_are_refused() {
        for bad in [
            "/clusters/m/../member2/api/v1/namespaces",
            "/clusters/m/%2e%2e/member2/api",
            "/clusters/m/%2E%2E/member2/api",
            "/clusters/m/.%2e/member2/api",
            "/clusters/m/api/v1/namespaces/default/../kube-system/configmaps",
            "/clusters/m/api/v1/namespaces/default/./configmaps",
            "/clusters/m/api/v1/namespaces/default/%2e/configmaps",
            "/clusters/m/api/v1/namespaces/default/..",
            "/clusters/m/api/v1/namespaces/default/..?x",
            "/clusters/m/api/v1/namespaces/a%2Fb/pods",
            "/clusters/m/api/v1/namespaces/a%2fb/pods",
            "/clusters/m/api/v1/namespaces/a%5Cb/pods",
            "/clusters/m/api/v1/namespaces/a\\b/pods",
            "/clusters/m/api/v1/namespaces/a%00/pods",
            "/clusters/m/api/v1/namespaces/a\0/pods",
            "/clusters/m//api/v1/namespaces",
            "/clusters/m/api/v1/namespaces/default/pods#frag",
            "?x",
            "*",
            "clusters/m/api",
            "",
        ] {
            assert!(check(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dot_segments_are_recognized_in_every_spelling() {
        for dot in [".", "..", "%2e", "%2E", ".%2e", "%2e.", "%2E%2e"] {
            assert!(is_dot_segment(dot.as_bytes()), "{dot}");
        }
        for not in ["...", "a.", ".a", "%2e%2e%2e", "%2", "%2g", ""] {
            assert!(!is_dot_segment(not.as_bytes()), "{not}");
        }
    }
}
