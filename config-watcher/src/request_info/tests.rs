//! The request-info parser against kube-apiserver's own table (`requestinfo_test.go` of
//! k8s.io/apiserver: every case there, as facts), the long-running check, and hostile paths:
//! any depth, percent-encoding and non-UTF-8 where classification reads.

use super::*;

fn parse(method: &str, url: &'static str) -> RequestInfo<'static> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    RequestInfo::parse(method.as_bytes(), path.as_bytes(), query.as_bytes())
}

/// For each `(url, name, verb)`: a GET of `url` names `name` (`""`: none) with kube's `verb`.
#[track_caller]
fn assert_names_and_verbs(cases: &[(&'static str, &str, &str)]) {
    for &(url, name, verb) in cases {
        let info = parse("GET", url);
        assert_eq!((info.name, info.verb.name()), (name, verb), "{url}");
    }
}

/// method, url, verb, api group, version, namespace, resource, subresource, name.
type KubeCase = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

/// kube's TestGetAPIRequestInfo success cases: method, url, verb, api group, version,
/// namespace, resource, subresource, name (kube's expected API prefix is "api" in every row of
/// its table, including the /apis ones, a quirk of the table: the prefix is checked here too).
// One row a case, as in kube's own table (rustfmt would spread each over eleven lines).
#[rustfmt::skip]
const KUBE_CASES: &[KubeCase] = &[
    ("GET",    "/api/v1/namespaces",                                                "list",             "",           "v1",      "",      "namespaces", "",         ""),
    ("GET",    "/api/v1/namespaces/other",                                          "get",              "",           "v1",      "other", "namespaces", "",         "other"),
    ("GET",    "/api/v1/namespaces/other/pods",                                     "list",             "",           "v1",      "other", "pods",       "",         ""),
    ("GET",    "/api/v1/namespaces/other/pods/foo",                                 "get",              "",           "v1",      "other", "pods",       "",         "foo"),
    ("HEAD",   "/api/v1/namespaces/other/pods/foo",                                 "get",              "",           "v1",      "other", "pods",       "",         "foo"),
    ("GET",    "/api/v1/pods",                                                      "list",             "",           "v1",      "",      "pods",       "",         ""),
    ("HEAD",   "/api/v1/pods",                                                      "list",             "",           "v1",      "",      "pods",       "",         ""),
    ("PATCH",  "/api/v1/namespaces/new-namespace",                                  "patch",            "",           "v1",      "",      "namespaces", "",         "new-namespace"),
    // special verbs
    ("GET",    "/api/v1/proxy/namespaces/other/pods/foo",                           "proxy",            "",           "v1",      "other", "pods",       "",         "foo"),
    ("GET",    "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource", "proxy",            "",           "v1",      "other", "pods",       "",         "foo"),
    ("GET",    "/api/v1/watch/pods",                                                "watch",            "",           "v1",      "",      "pods",       "",         ""),
    ("GET",    "/api/v1/pods?watch=true",                                           "watch",            "",           "v1",      "",      "pods",       "",         ""),
    ("GET",    "/api/v1/pods?watch=false",                                          "list",             "",           "v1",      "",      "pods",       "",         ""),
    ("GET",    "/api/v1/watch/namespaces/other/pods",                               "watch",            "",           "v1",      "other", "pods",       "",         ""),
    ("GET",    "/api/v1/namespaces/other/pods?watch=1",                             "watch",            "",           "v1",      "other", "pods",       "",         ""),
    ("GET",    "/api/v1/namespaces/other/pods?watch=0",                             "list",             "",           "v1",      "other", "pods",       "",         ""),
    // subresource identification
    ("GET",    "/api/v1/namespaces/other/pods/foo/status",                          "get",              "",           "v1",      "other", "pods",       "status",   "foo"),
    ("GET",    "/api/v1/namespaces/other/pods/foo/proxy/subpath",                   "get",              "",           "v1",      "other", "pods",       "proxy",    "foo"),
    ("PUT",    "/api/v1/namespaces/other/finalize",                                 "update",           "",           "v1",      "other", "namespaces", "finalize", "other"),
    ("PUT",    "/api/v1/namespaces/other/status",                                   "update",           "",           "v1",      "other", "namespaces", "status",   "other"),
    // verb identification
    ("PATCH",  "/api/v1/namespaces/other/pods/foo",                                 "patch",            "",           "v1",      "other", "pods",       "",         "foo"),
    ("DELETE", "/api/v1/namespaces/other/pods/foo",                                 "delete",           "",           "v1",      "other", "pods",       "",         "foo"),
    ("POST",   "/api/v1/namespaces/other/pods",                                     "create",           "",           "v1",      "other", "pods",       "",         ""),
    // deletecollection verb identification
    ("DELETE", "/api/v1/nodes",                                                     "deletecollection", "",           "v1",      "",      "nodes",      "",         ""),
    ("DELETE", "/api/v1/namespaces",                                                "deletecollection", "",           "v1",      "",      "namespaces", "",         ""),
    ("DELETE", "/api/v1/namespaces/other/pods",                                     "deletecollection", "",           "v1",      "other", "pods",       "",         ""),
    ("DELETE", "/apis/extensions/v1/namespaces/other/pods",                         "deletecollection", "extensions", "v1",      "other", "pods",       "",         ""),
    // api group and version identification
    ("POST",   "/apis/extensions/v1/namespaces/other/pods",                         "create",           "extensions", "v1",      "other", "pods",       "",         ""),
    ("POST",   "/apis/extensions/v1beta3/namespaces/other/pods",                    "create",           "extensions", "v1beta3", "other", "pods",       "",         ""),
];

#[test]
fn kube_apiservers_own_table() {
    for &(method, url, verb, group, version, namespace, resource, subresource, name) in KUBE_CASES {
        let info = parse(method, url);
        assert!(info.is_resource_request, "{method} {url}");
        assert!(info.classified, "{method} {url}");
        let got = (
            info.verb.name(),
            info.api_group,
            info.api_version,
            info.namespace,
            info.resource,
            info.subresource,
            info.name,
        );
        assert_eq!(
            got,
            (verb, group, version, namespace, resource, subresource, name),
            "{method} {url}"
        );
        let prefix = if url.starts_with("/apis/") {
            "apis"
        } else {
            "api"
        };
        assert_eq!(info.api_prefix, prefix, "{url}");
    }
}

#[test]
fn kube_apiservers_non_resource_cases() {
    // TestGetAPIRequestInfo's error cases and TestGetNonAPIRequestInfo.
    for (url, resource) in [
        ("/", false),
        ("/api/version/", false),
        ("/apis/group/version/", false),
        ("/badprefix/version/resource", false),
        ("/apis/version/resource", false),
        ("/api/version/resource", true),
        ("/apis/group/version/resource/name/subresource", true),
        ("/api/version/resource/name/subresource", true),
        ("/apis/batch/v1/job", true),
        ("/apis/batch/v1/job/foo", true),
        ("/apis/batch/v1/job/foo/scale", true),
        ("/not-api/version/resource", false),
        ("/apis/extensions/v1beta1", false),
        ("/apis/extensions/v1beta1/", false),
        ("/api/version", false),
        ("/api", false),
        ("", false),
    ] {
        let info = parse("GET", url);
        assert_eq!(info.is_resource_request, resource, "{url}");
        assert!(info.classified, "{url}");
        if !resource {
            assert_eq!(info.verb, KubeVerb::Method(NonResourceMethod::Get), "{url}");
        }
    }
}

#[test]
fn kube_apiservers_field_selector_cases() {
    // url, name, verb: one row a case.
    #[rustfmt::skip]
    let cases = [
        ("/apis/group/version/resource",                                                      "",      "list"),
        ("/apis/group/version/resource?fieldSelector=metadata.name=name1",                    "name1", "list"),
        ("/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1",         "name1", "watch"),
        ("/apis/group/version/resource?fieldSelector=foo=bar",                                "",      "list"),
        ("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo",                "",      "list"),
        ("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true",     "",      "watch"),
        ("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false",    "",      "list"),
        // As kubectl sends them: percent-encoded `=` and `,`, `==`, among other requirements.
        ("/api/v1/namespaces/ns/configmaps?fieldSelector=metadata.name%3Dcm1&watch=1",        "cm1",   "watch"),
        ("/api/v1/configmaps?fieldSelector=metadata.namespace%3Dns%2Cmetadata.name%3D%3Dcm1", "cm1",   "list"),
        // Not a valid path segment name: no name.
        ("/api/v1/configmaps?fieldSelector=metadata.name%3D..",                               "",      "list"),
        // A watch that is no bool: kube reports a watch, and reads nothing else.
        ("/api/v1/configmaps?watch=yes&fieldSelector=metadata.name%3Dcm1",                    "",      "watch"),
    ];
    assert_names_and_verbs(&cases);
}

#[test]
fn long_running_is_kube_apiservers_check() {
    for (method, url, long) in [
        ("GET", "/api/v1/pods?watch=true", true),
        ("GET", "/api/v1/watch/namespaces/a/pods", true),
        ("GET", "/apis/apps/v1/watch/deployments", true),
        ("GET", "/api/v1/proxy/namespaces/a/pods/p/x", true),
        ("POST", "/api/v1/namespaces/a/pods/p/exec?command=ls", true),
        ("GET", "/api/v1/namespaces/a/pods/p/attach", true),
        ("POST", "/api/v1/namespaces/a/pods/p/portforward", true),
        (
            "GET",
            "/api/v1/namespaces/a/services/s:80/proxy/a/b/c",
            true,
        ),
        ("GET", "/api/v1/namespaces/a/pods/p/log", true),
        ("GET", "/api/v1/namespaces/a/pods/p/log?follow=true", true),
        ("GET", "/api/v1/pods?watch=false", false),
        ("GET", "/api/v1/namespaces/watch/pods", false),
        ("GET", "/api/v1/namespaces/a/pods/p", false),
        ("GET", "/version", false),
        ("GET", "/healthz?watch=true", true),
    ] {
        assert_eq!(parse(method, url).long_running, long, "{method} {url}");
    }
}

#[test]
fn policy_and_metrics_verbs() {
    // One row a case (rustfmt would spread each over six lines).
    #[rustfmt::skip]
    let cases = [
        ("POST",    "/api/v1/namespaces/a/pods/p/exec",        Some(Verb::Exec),               "connect"),
        ("GET",     "/api/v1/namespaces/a/pods/p/exec",        Some(Verb::Exec),               "connect"),
        ("POST",    "/api/v1/namespaces/a/pods/p/attach",      Some(Verb::Attach),             "connect"),
        ("POST",    "/api/v1/namespaces/a/pods/p/portforward", Some(Verb::PortForward),        "connect"),
        ("GET",     "/api/v1/namespaces/a/services/s/proxy/x", Some(Verb::Proxy),              "connect"),
        ("GET",     "/api/v1/proxy/namespaces/a/pods/p",       Some(Verb::Proxy),              "connect"),
        ("GET",     "/api/v1/namespaces/a/pods",               Some(Verb::List),               "list"),
        ("GET",     "/api/v1/pods?watch=1",                    Some(Verb::Watch),              "watch"),
        ("DELETE",  "/api/v1/namespaces/a/pods",               Some(Verb::DeleteCollection),   "deletecollection"),
        ("GET",     "/version",                                Some(Verb::Get),                "get"),
        ("POST",    "/api/v1",                                 Some(Verb::Create),             "post"),
        ("OPTIONS", "/api/v1/pods",                            None,                           "other"),
    ];
    for (method, url, policy, metrics) in cases {
        let info = parse(method, url);
        assert_eq!(
            (info.policy_verb(), info.metrics_verb()),
            (policy, metrics),
            "{method} {url}"
        );
    }
}

#[test]
fn any_depth_is_classified_by_its_leading_segments() {
    // The attack that passed before: a proxy subresource with a deep tail, into kube-system.
    let info = parse(
        "GET",
        "/api/v1/namespaces/kube-system/services/svc:443/proxy/a/b/c/d",
    );
    assert!(info.is_resource_request && info.classified);
    assert_eq!(
        (info.namespace, info.resource, info.name, info.subresource),
        ("kube-system", "services", "svc:443", "proxy")
    );
    let deep: String = (0..60).map(|i| format!("/x{i}")).collect();
    let url: &'static str =
        Box::leak(format!("/api/v1/namespaces/kube-system/pods/p/proxy{deep}").into_boxed_str());
    let info = parse("GET", url);
    assert_eq!((info.namespace, info.subresource), ("kube-system", "proxy"));
}

#[test]
fn percent_or_non_utf8_where_classification_reads_is_unclassified() {
    for url in [
        "/api/v1/namespaces/kube%2Dsystem/configmaps",
        "/api/v1/namespaces/default/config%6Daps",
        "/apis/ap%70s/v1/deployments",
        "/api/v1/namespaces/a/pods/p%2Fq/exec",
        "/api/v1/namespaces/a/pods/p/%65xec",
        "/api/v1/watch",
        "/api/v1/proxy",
    ] {
        let info = parse("GET", url);
        assert!(!info.classified, "{url} classified");
        assert!(!info.is_resource_request, "{url}");
    }
    let info = RequestInfo::parse(b"GET", b"/api/v1/namespaces/\xff/pods", b"");
    assert!(!info.classified);
    // After the subresource, anything goes.
    let info = parse("GET", "/api/v1/namespaces/a/services/s/proxy/%2e%2e/%ff/x");
    assert!(info.classified && info.is_resource_request);
}

#[test]
fn the_direct_service_path_is_classified_as_the_apiserver_proxy_path() {
    for method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        let apiserver = parse(
            method,
            "/api/v1/namespaces/team-a/services/echo:8080/proxy/x/y",
        );
        let direct = RequestInfo::service_proxy(
            method.as_bytes(),
            b"/services/team-a/echo:8080/x/y",
            "team-a",
            "echo:8080",
        );
        assert_eq!(
            RequestInfo {
                path: apiserver.path,
                ..direct
            },
            apiserver,
            "{method}"
        );
        assert_eq!(direct.policy_verb(), Some(Verb::Proxy));
        assert_eq!(direct.metrics_verb(), "connect");
    }
}

/// The query as Go's `url.Query()` reads it, where the raw bytes say otherwise: the verb a
/// policy checks is the one the member serves.
#[test]
fn the_query_is_read_as_gos_url_query_reads_it() {
    // url, name, verb: one row a case.
    #[rustfmt::skip]
    let cases = [
        // Escaped values and keys.
        ("/api/v1/configmaps?watch=%66alse",                                              "",    "list"),
        ("/api/v1/configmaps?watch=%30",                                                  "",    "list"),
        ("/api/v1/configmaps?watch=tr%75e",                                               "",    "watch"),
        ("/api/v1/configmaps?w%61tch=true",                                               "",    "watch"),
        ("/api/v1/configmaps?w%61tch=1&watch=0",                                          "",    "watch"),
        ("/api/v1/configmaps?watch=FAL%53E&fieldSelector=metadata.name%3Dcm1",            "cm1", "list"),
        // A value Go cannot decode: not even a watch of a bool kube could not read.
        ("/api/v1/configmaps?watch=%66alse%",                                             "",    "list"),
        ("/api/v1/configmaps?watch=%zz&watch=true",                                       "",    "watch"),
        // A pair with a `;` is dropped: the next `watch` is the first.
        ("/api/v1/configmaps?watch=true;&watch=false",                                    "",    "list"),
        ("/api/v1/configmaps?watch=false;x",                                              "",    "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Dcm1;",                         "",    "list"),
        // `+` is a space: no bool, so a watch (kube's reading of an undecodable watch).
        ("/api/v1/configmaps?watch=+",                                                    "",    "watch"),
        ("/api/v1/configmaps?watch=+0",                                                   "",    "watch"),
        // The field selector, unescaped first, then by kube's own rules.
        ("/api/v1/configmaps?fieldSelector=metadata%2Ename%3Dcm1",                        "cm1", "list"),
        ("/api/v1/configmaps?fieldS%65lector=metadata.name%3Dcm1",                        "cm1", "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Dcm1%2C%2C",                    "cm1", "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Dcm1%2Cmetadata.name%3D%3Dcm1", "cm1", "list"),
        // Two different names: none (kube takes the first in sorted order; the member selects
        // neither, as both must hold).
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Dcm1%2Cmetadata.name%3Dcm2",    "",    "list"),
        // A name that needed unescaping cannot be borrowed: none, as if unnamed (stricter).
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Dsystem%3Aedit",                "",    "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Da%5C%2Cb",                     "",    "list"),
        // A bare `=` in a value, an unknown escape, a trailing backslash: no selector kube takes.
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Da%3Db",                        "",    "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Da%5Cx",                        "",    "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name%3Da%5C",                         "",    "list"),
        // `!=` is no exact match, and a `!` alone belongs to the field.
        ("/api/v1/configmaps?fieldSelector=metadata.name%21%3Dcm1",                       "",    "list"),
        ("/api/v1/configmaps?fieldSelector=metadata.name!%3Dcm1&watch=1",                 "",    "watch"),
        ("/api/v1/configmaps?fieldSelector=metadata.name!x%3Dcm1",                        "",    "list"),
    ];
    assert_names_and_verbs(&cases);
}

/// Go's `url.ParseQuery` (1.17 on), plainly: the pairs it keeps, unescaped.
fn go_parse_query(query: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    fn unescape(raw: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < raw.len() {
            match raw[i] {
                b'%' => {
                    let hex = std::str::from_utf8(raw.get(i + 1..i + 3)?).ok()?;
                    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return None;
                    }
                    out.push(u8::from_str_radix(hex, 16).ok()?);
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        Some(out)
    }
    let mut pairs = Vec::new();
    for pair in query.split(|b| *b == b'&') {
        if pair.contains(&b';') || pair.is_empty() {
            continue;
        }
        let (key, value) = match pair.iter().position(|b| *b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        if let (Some(key), Some(value)) = (unescape(key), unescape(value)) {
            pairs.push((key, value));
        }
    }
    pairs
}

/// kube's verb and name for a GET of a collection with this (unescaped) `watch` and
/// `fieldSelector`, plainly: `fields.ParseSelector`, sorted terms, `RequiresExactMatch`.
fn kube_list_reading(watch: Option<&[u8]>, selector: Option<&[u8]>) -> (&'static str, String) {
    /// A requirement: field, operator, unescaped value.
    type Term = (Vec<u8>, &'static str, Vec<u8>);
    fn parse_selector(text: &[u8]) -> Option<Vec<Term>> {
        let mut terms: Vec<Vec<u8>> = Vec::new();
        let (mut start, mut in_slash) = (0, false);
        for (i, &c) in text.iter().enumerate() {
            if in_slash {
                in_slash = false;
            } else if c == b'\\' {
                in_slash = true;
            } else if c == b',' {
                terms.push(text[start..i].to_vec());
                start = i + 1;
            }
        }
        terms.push(text[start..].to_vec());
        terms.sort();
        let mut out = Vec::new();
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let (at, op) = (0..term.len()).find_map(|i| {
                ["!=", "==", "="]
                    .into_iter()
                    .find(|op| term[i..].starts_with(op.as_bytes()))
                    .map(|op| (i, op))
            })?;
            let (mut value, mut slash) = (Vec::new(), false);
            for &c in &term[at + op.len()..] {
                match c {
                    b'\\' | b',' | b'=' if slash => {
                        value.push(c);
                        slash = false;
                    }
                    _ if slash => return None,
                    b'\\' => slash = true,
                    b',' | b'=' => return None,
                    c => value.push(c),
                }
            }
            if slash {
                return None;
            }
            out.push((term[..at].to_vec(), op, value));
        }
        Some(out)
    }
    let bool_of = |v: &[u8]| match v {
        b"1" | b"t" | b"T" | b"TRUE" | b"true" | b"True" => Some(true),
        b"0" | b"f" | b"F" | b"FALSE" | b"false" | b"False" => Some(false),
        _ => None,
    };
    let parsed = selector.map(parse_selector);
    let decodes =
        watch.is_none_or(|v| bool_of(v).is_some()) && parsed.as_ref().is_none_or(Option::is_some);
    if !decodes {
        let watching = watch.is_some_and(|v| !(v == b"0" || v.eq_ignore_ascii_case(b"false")));
        return (if watching { "watch" } else { "list" }, String::new());
    }
    let verb = if watch.and_then(bool_of).unwrap_or(false) {
        "watch"
    } else {
        "list"
    };
    let name = parsed
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .find(|(field, op, _)| field == b"metadata.name" && *op != "!=")
        .map(|(_, _, value)| String::from_utf8_lossy(&value).into_owned())
        .filter(|n| !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '%']))
        .unwrap_or_default();
    (verb, name)
}

const KEYS: &[&str] = &[
    "watch",
    "w%61tch",
    "fieldSelector",
    "fieldS%65lector",
    "watch;",
    "limit",
    "%zz",
];
const PIECES: &[&str] = &[
    "=",
    "%3D",
    "&",
    ";",
    "%",
    "%2",
    "%zz",
    "+",
    "true",
    "false",
    "%66alse",
    "FAL%53E",
    "0",
    "1",
    "yes",
    ",",
    "%2C",
    "\\",
    "%5C",
    "!",
    "%21",
    "metadata.name",
    "metadata%2Ename",
    "cm1",
    "cm2",
    "..",
    "%41",
    "%C3%A9",
    "%FF",
    ":",
    "%3A",
    "metadata.name=",
    "metadata.name%3D",
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
    /// Any query of the pieces that matter (escaped or not, `;`, `+`, backslashes, broken
    /// escapes, pairs Go drops): the verb is kube's, and a name is given only when it is kube's.
    #[test]
    fn the_verb_and_name_are_kubes_for_any_query(
        pairs in proptest::collection::vec(
            (
                proptest::sample::select(KEYS),
                proptest::collection::vec(proptest::sample::select(PIECES), 0..5),
            ),
            0..5,
        )
    ) {
        let query = pairs
            .iter()
            .map(|(key, value)| format!("{key}={}", value.concat()))
            .collect::<Vec<_>>()
            .join("&");
        let pairs = go_parse_query(query.as_bytes());
        let first = |key: &[u8]| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_slice());
        let (verb, name) = kube_list_reading(first(b"watch"), first(b"fieldSelector"));
        let info = RequestInfo::parse(b"GET", b"/api/v1/configmaps", query.as_bytes());
        proptest::prop_assert_eq!(info.verb.name(), verb, "{}", query);
        proptest::prop_assert!(info.name.is_empty() || info.name == name, "{} gave {:?}, kube {:?}", query, info.name, name);
    }
}
