//! What a request is, in kube-apiserver's terms: the one request-info parser the gateway's
//! routing, AccessPolicy, metrics and audit log all read, run once per request.
//!
//! It follows kube-apiserver's `RequestInfoFactory.NewRequestInfo` for any path depth: the
//! `/api/{version}` and `/apis/{group}/{version}` prefixes, the `watch` and `proxy` verbs in the
//! path, `namespaces/{ns}/...` (with the namespace subresources `status` and `finalize`), the
//! subresource from the third part on (bytes after it are never interpreted: a proxy subresource
//! carries any path), `list` / `watch` / `deletecollection` for collections, and the name from
//! `fieldSelector=metadata.name=X` for lists and watches. Where kube decodes the path first, this
//! parser reads raw bytes and fails closed: a `%` or non-UTF-8 byte in any segment it classifies
//! (prefix, group, version, namespace, resource, name, subresource) makes the request
//! *unclassified*, which no resource rule of an AccessPolicy matches (kube's own
//! `ValidatePathSegmentName` forbids `%` and `/` in names, so no legitimate client sends one there).
//!
//! The query is read as kube reads it, through Go's `url.Query()` ([`param`]): a `watch=%66alse`
//! is a list and a `w%61tch=true` a watch there, so they are here; a pair Go drops (a `;` in it,
//! a broken `%` escape) is not read.
//!
//! Borrows from the path and query; never allocates; never does I/O. Called by the gateway's
//! `request` module (once per request) and by `policy` (the check).

/// kube-apiserver's verb for a request (its `RequestInfo.Verb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KubeVerb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// `/api/v1/proxy/...`, the legacy proxy verb in the path.
    Proxy,
    /// A non-resource request: the method, lower-cased (`get`, `post`, `head`, ...).
    Method(NonResourceMethod),
    /// A method kube gives no verb for (for a resource request).
    Unknown,
}

/// The method of a non-resource request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonResourceMethod {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
    Other,
}

impl NonResourceMethod {
    fn of(method: &[u8]) -> NonResourceMethod {
        match method {
            b"GET" => NonResourceMethod::Get,
            b"HEAD" => NonResourceMethod::Head,
            b"POST" => NonResourceMethod::Post,
            b"PUT" => NonResourceMethod::Put,
            b"PATCH" => NonResourceMethod::Patch,
            b"DELETE" => NonResourceMethod::Delete,
            b"OPTIONS" => NonResourceMethod::Options,
            _ => NonResourceMethod::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NonResourceMethod::Get => "get",
            NonResourceMethod::Head => "head",
            NonResourceMethod::Post => "post",
            NonResourceMethod::Put => "put",
            NonResourceMethod::Patch => "patch",
            NonResourceMethod::Delete => "delete",
            NonResourceMethod::Options => "options",
            NonResourceMethod::Other => "other",
        }
    }
}

impl KubeVerb {
    /// The verb as kube-apiserver names it.
    pub fn name(self) -> &'static str {
        match self {
            KubeVerb::Get => "get",
            KubeVerb::List => "list",
            KubeVerb::Watch => "watch",
            KubeVerb::Create => "create",
            KubeVerb::Update => "update",
            KubeVerb::Patch => "patch",
            KubeVerb::Delete => "delete",
            KubeVerb::DeleteCollection => "deletecollection",
            KubeVerb::Proxy => "proxy",
            KubeVerb::Method(method) => method.name(),
            KubeVerb::Unknown => "",
        }
    }
}

/// What a request is. Borrowed from its path and query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// The path without the cluster prefix and without the query (as the member gets it).
    pub path: &'a [u8],
    /// Whether it names a resource (`/api/v1/...`, `/apis/g/v/...` with a resource part).
    pub is_resource_request: bool,
    /// False when a segment the parser had to read held a `%` or was not UTF-8: such a request
    /// is treated as non-resource, and only a `nonResourceURLs` grant can allow it.
    pub classified: bool,
    pub verb: KubeVerb,
    pub api_prefix: &'a str,
    pub api_group: &'a str,
    pub api_version: &'a str,
    pub namespace: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    /// kube-apiserver's long-running check: a watch, the proxy verb, or an attach, exec, proxy,
    /// log or portforward subresource (and, as it streams, any `follow=true` or `watch=true`).
    pub long_running: bool,
}

/// At most this many leading segments are ever read; the rest of a path is opaque.
const READ_SEGMENTS: usize = 9;

impl<'a> RequestInfo<'a> {
    /// Classifies a request from its method, path (after the cluster prefix, without the query)
    /// and query (with or without its `?`).
    pub fn parse(method: &[u8], path: &'a [u8], query: &'a [u8]) -> RequestInfo<'a> {
        let query = query.strip_prefix(b"?").unwrap_or(query);
        let mut info = RequestInfo {
            path,
            is_resource_request: false,
            classified: true,
            verb: KubeVerb::Method(NonResourceMethod::of(method)),
            api_prefix: "",
            api_group: "",
            api_version: "",
            namespace: "",
            resource: "",
            subresource: "",
            name: "",
            long_running: false,
        };
        // kube: strings.Split(strings.Trim(path, "/"), "/"): leading and trailing slashes go.
        let trimmed = trim_slashes(path);
        let mut raw: [&'a [u8]; READ_SEGMENTS] = [b""; READ_SEGMENTS];
        let mut count = 0;
        if !trimmed.is_empty() {
            for segment in trimmed.split(|b| *b == b'/') {
                if count == READ_SEGMENTS {
                    // More than anything classification reads: the count only has to say so.
                    count += 1;
                    break;
                }
                raw[count] = segment;
                count += 1;
            }
        }
        let parts = &raw[..count.min(READ_SEGMENTS)];
        // Fewer than three parts, or another prefix: a non-resource request (its verb the method).
        if count < 3 || !matches!(parts[0], b"api" | b"apis") {
            return info.with_streaming_query(query);
        }
        let Some(resource_info) = resource_info(method, parts, count, query) else {
            // A segment it had to read holds a `%` or is not text: unclassified.
            info.classified = false;
            return info.with_streaming_query(query);
        };
        match resource_info {
            Parsed::NonResource { api_prefix } => {
                info.api_prefix = api_prefix;
                info.with_streaming_query(query)
            }
            Parsed::Resource(fields) => RequestInfo {
                is_resource_request: true,
                ..fields.apply(info)
            },
        }
    }

    /// A request of the gateway's direct service path (`/services/{namespace}/{name}/...` of a
    /// pull-mode cluster) as what it is: the `proxy` subresource of service `name` (as the
    /// apiserver path names it, `NAME:PORT`) in `namespace`, long-running, its verb the method's
    /// (as kube's connect verbs). `path` is the path after the cluster prefix. The caller has
    /// checked both names; a policy grants it exactly as it grants
    /// `/api/v1/namespaces/{namespace}/services/{name}/proxy/...`.
    pub fn service_proxy(
        method: &[u8],
        path: &'a [u8],
        namespace: &'a str,
        name: &'a str,
    ) -> RequestInfo<'a> {
        RequestInfo {
            path,
            is_resource_request: true,
            classified: true,
            verb: resource_verb(method),
            api_prefix: "api",
            api_group: "",
            api_version: "v1",
            namespace,
            resource: "services",
            subresource: "proxy",
            name,
            long_running: true,
        }
    }

    /// A request whose query asks to stream (`watch=true`, `follow=true`) is long-running
    /// whatever its path.
    fn with_streaming_query(mut self, query: &[u8]) -> Self {
        self.long_running |= is_true(param(query, b"watch")) || is_true(param(query, b"follow"));
        self
    }

    /// The verb an AccessPolicy grants for this request: kube's verb, except that the connect
    /// subresources `exec`, `attach`, `portforward` and `proxy` are verbs of their own (as the
    /// legacy proxy verb is).
    pub fn policy_verb(&self) -> Option<Verb> {
        if self.is_resource_request {
            match self.subresource {
                "exec" => return Some(Verb::Exec),
                "attach" => return Some(Verb::Attach),
                "portforward" => return Some(Verb::PortForward),
                "proxy" => return Some(Verb::Proxy),
                _ => {}
            }
        }
        Some(match self.verb {
            KubeVerb::Get | KubeVerb::Method(NonResourceMethod::Get | NonResourceMethod::Head) => {
                Verb::Get
            }
            KubeVerb::List => Verb::List,
            KubeVerb::Watch => Verb::Watch,
            KubeVerb::Create | KubeVerb::Method(NonResourceMethod::Post) => Verb::Create,
            KubeVerb::Update | KubeVerb::Method(NonResourceMethod::Put) => Verb::Update,
            KubeVerb::Patch | KubeVerb::Method(NonResourceMethod::Patch) => Verb::Patch,
            KubeVerb::Delete | KubeVerb::Method(NonResourceMethod::Delete) => Verb::Delete,
            KubeVerb::DeleteCollection => Verb::DeleteCollection,
            KubeVerb::Proxy => Verb::Proxy,
            KubeVerb::Method(_) | KubeVerb::Unknown => return None,
        })
    }

    /// The verb metrics count a request under: `connect` for exec, attach, portforward and proxy
    /// (as kube-apiserver's own metrics do), else kube's verb; `other` where kube has none.
    pub fn metrics_verb(&self) -> &'static str {
        match self.policy_verb() {
            Some(Verb::Exec | Verb::Attach | Verb::PortForward | Verb::Proxy) => "connect",
            _ => match self.verb {
                KubeVerb::Unknown | KubeVerb::Method(NonResourceMethod::Other) => "other",
                verb => verb.name(),
            },
        }
    }

    /// The path as text, for `nonResourceURLs` (None when it is not UTF-8: only `*` matches).
    pub fn path_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.path).ok()
    }
}

/// The verbs an AccessPolicy rule grants (kube's, plus the connect subresources as verbs of
/// their own, and `impersonate`).
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

/// The fields of a resource request.
struct ResourceFields<'a> {
    verb: KubeVerb,
    api_prefix: &'a str,
    api_group: &'a str,
    api_version: &'a str,
    namespace: &'a str,
    resource: &'a str,
    subresource: &'a str,
    name: &'a str,
    long_running: bool,
}

impl<'a> ResourceFields<'a> {
    fn apply(self, info: RequestInfo<'a>) -> RequestInfo<'a> {
        RequestInfo {
            verb: self.verb,
            api_prefix: self.api_prefix,
            api_group: self.api_group,
            api_version: self.api_version,
            namespace: self.namespace,
            resource: self.resource,
            subresource: self.subresource,
            name: self.name,
            long_running: self.long_running,
            ..info
        }
    }
}

enum Parsed<'a> {
    /// `/apis/{group}` with too few parts: discovery, not a resource.
    NonResource {
        api_prefix: &'a str,
    },
    Resource(ResourceFields<'a>),
}

/// kube's NewRequestInfo past the "fewer than three parts" and prefix checks. `parts` are the
/// first (up to) [`READ_SEGMENTS`] segments of `count` in all. None: a segment it reads is not
/// plain text.
fn resource_info<'a>(
    method: &[u8],
    parts: &[&'a [u8]],
    count: usize,
    query: &'a [u8],
) -> Option<Parsed<'a>> {
    let text = |i: usize| -> Option<&'a str> { segment_text(parts.get(i).copied()?) };
    let api_prefix = text(0)?;
    let mut at = 1;
    let mut api_group = "";
    if api_prefix == "apis" {
        // One part (the prefix) has already been consumed: "do we have four parts?"
        if count - at < 3 {
            return Some(Parsed::NonResource { api_prefix });
        }
        api_group = text(at)?;
        at += 1;
    }
    let api_version = text(at)?;
    at += 1;
    let mut verb = resource_verb(method);
    // `/{watch|proxy}/...`: the verb is in the path.
    let first = text(at)?;
    if first == "watch" || first == "proxy" {
        if count - at < 2 {
            // kube: "unable to determine kind and namespace": no resource request can be made of
            // it; classify it as one that no narrow rule matches.
            return None;
        }
        verb = if first == "watch" {
            KubeVerb::Watch
        } else {
            KubeVerb::Proxy
        };
        at += 1;
    }
    // `/namespaces/{ns}/{kind}/...`: the parts become relative to the kind.
    let mut namespace = "";
    if text(at)? == "namespaces" {
        // Creating a namespace with server-side apply PATCHes /namespaces/{new}: that request
        // is not in the namespace it creates.
        if count - at == 2 && verb == KubeVerb::Patch {
            // No namespace.
        } else if count - at > 1 {
            namespace = text(at + 1)?;
            // Another step after the namespace name that is not a namespace subresource: a
            // resource in its own right.
            if count - at > 2 {
                let next = text(at + 2)?;
                if next != "status" && next != "finalize" {
                    at += 2;
                }
            }
        }
    }
    // Parts now: resource/name/subresource/anything we do not interpret.
    let left = count - at;
    let mut resource = "";
    let mut name = "";
    let mut subresource = "";
    if left >= 3 && verb != KubeVerb::Proxy {
        subresource = text(at + 2)?;
    }
    if left >= 2 {
        name = text(at + 1)?;
    }
    if left >= 1 {
        resource = text(at)?;
    }
    // No name and a get: a list or a watch (and a name from `metadata.name=`). As kube, a query
    // it cannot decode (a `watch` that is no bool, a field selector with a term that is no
    // requirement) gives a list, or a watch unless `watch` says false, and no name.
    if name.is_empty() && verb == KubeVerb::Get {
        let watch = param(query, b"watch");
        let selector = param(query, b"fieldSelector").map(read_field_selector);
        let decodes = watch.is_none_or(|v| parse_bool(v).is_some())
            && selector.as_ref().is_none_or(|s| s.parses);
        let watching = if decodes {
            watch.and_then(parse_bool).unwrap_or(false)
        } else {
            watch.is_some_and(|v| !says_false(v))
        };
        verb = if watching {
            KubeVerb::Watch
        } else {
            KubeVerb::List
        };
        if decodes {
            if let Some(selected) = selector.and_then(|s| s.name) {
                name = selected;
            }
        }
    }
    if name.is_empty() && verb == KubeVerb::Delete {
        verb = KubeVerb::DeleteCollection;
    }
    let long_running = matches!(verb, KubeVerb::Watch | KubeVerb::Proxy)
        || matches!(
            subresource,
            "attach" | "exec" | "proxy" | "log" | "portforward"
        )
        || is_true(param(query, b"follow"))
        || is_true(param(query, b"watch"));
    Some(Parsed::Resource(ResourceFields {
        verb,
        api_prefix,
        api_group,
        api_version,
        namespace,
        resource,
        subresource,
        name,
        long_running,
    }))
}

/// kube's verb for a resource request's method, before the path and query refine it.
fn resource_verb(method: &[u8]) -> KubeVerb {
    match method {
        b"POST" => KubeVerb::Create,
        b"GET" | b"HEAD" => KubeVerb::Get,
        b"PUT" => KubeVerb::Update,
        b"PATCH" => KubeVerb::Patch,
        b"DELETE" => KubeVerb::Delete,
        _ => KubeVerb::Unknown,
    }
}

/// A segment as text, if it has no `%` and is UTF-8.
fn segment_text(segment: &[u8]) -> Option<&str> {
    if segment.contains(&b'%') {
        return None;
    }
    std::str::from_utf8(segment).ok()
}

fn trim_slashes(mut path: &[u8]) -> &[u8] {
    while let [b'/', rest @ ..] = path {
        path = rest;
    }
    while let [rest @ .., b'/'] = path {
        path = rest;
    }
    path
}

/// The value of the first `name=...` in a query (without its `?`) as kube-apiserver finds it:
/// Go's `url.Query()`, whose first value it reads. A pair holding a `;` is dropped (Go 1.17 on),
/// as is one whose key or value has a `%` not followed by two hex digits; keys are compared
/// unescaped (`w%61tch` is `watch`). The value is returned still escaped: read it with
/// [`Unescaped`].
pub fn param<'q>(query: &'q [u8], name: &[u8]) -> Option<&'q [u8]> {
    query.split(|b| *b == b'&').find_map(|pair| {
        if !go_keeps(pair) {
            return None;
        }
        let (key, value) = match pair.iter().position(|b| *b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        Unescaped::new(key)
            .eq(name.iter().copied())
            .then_some(value)
    })
}

/// Whether Go's `url.Query()` keeps a `key=value` pair: none holding a `;` (dropped from Go 1.17
/// on), none whose key or value has a `%` not followed by two hex digits (`=` is no hex digit,
/// so the whole pair is checked at once).
pub fn go_keeps(pair: &[u8]) -> bool {
    !pair.contains(&b';') && escapes_valid(pair)
}

/// Whether Go's `url.QueryUnescape` accepts `raw`: every `%` begins two hex digits.
pub fn escapes_valid(raw: &[u8]) -> bool {
    let mut at = 0;
    while at < raw.len() {
        if raw[at] == b'%' {
            let hex = |i: usize| raw.get(i).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(at + 1) && hex(at + 2)) {
                return false;
            }
            at += 3;
        } else {
            at += 1;
        }
    }
    true
}

/// The bytes of a query key or value as Go's `url.QueryUnescape` reads them (`+` a space,
/// `%XX` the byte XX), without allocating. For text [`escapes_valid`] accepted; a `%` without
/// its two digits stands for itself.
#[derive(Clone)]
pub struct Unescaped<'q> {
    raw: &'q [u8],
    at: usize,
}

impl<'q> Unescaped<'q> {
    pub fn new(raw: &'q [u8]) -> Unescaped<'q> {
        Unescaped { raw, at: 0 }
    }

    /// Where the next byte comes from in the raw text.
    fn position(&self) -> usize {
        self.at
    }
}

impl Iterator for Unescaped<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let byte = *self.raw.get(self.at)?;
        let digit = |i: usize| self.raw.get(i).and_then(|b| (*b as char).to_digit(16));
        let (byte, width) = match byte {
            b'%' => match (digit(self.at + 1), digit(self.at + 2)) {
                (Some(high), Some(low)) => ((high * 16 + low) as u8, 3),
                _ => (b'%', 1),
            },
            b'+' => (b' ', 1),
            other => (other, 1),
        };
        self.at += width;
        Some(byte)
    }
}

/// Go's strconv.ParseBool, of an escaped query value.
fn parse_bool(value: &[u8]) -> Option<bool> {
    let is = |word: &[u8]| Unescaped::new(value).eq(word.iter().copied());
    if [&b"1"[..], b"t", b"T", b"TRUE", b"true", b"True"]
        .into_iter()
        .any(is)
    {
        Some(true)
    } else if [&b"0"[..], b"f", b"F", b"FALSE", b"false", b"False"]
        .into_iter()
        .any(is)
    {
        Some(false)
    } else {
        None
    }
}

fn is_true(value: Option<&[u8]>) -> bool {
    value.and_then(parse_bool) == Some(true)
}

/// kube's reading of a `watch` it could not decode as a bool: a watch unless it says `false`
/// (any case) or `0`.
fn says_false(value: &[u8]) -> bool {
    let decoded = Unescaped::new(value);
    decoded.clone().eq(*b"0") || decoded.map(|b| b.to_ascii_lowercase()).eq(*b"false")
}

/// What kube-apiserver reads in a field selector (an escaped query value): whether
/// `fields.ParseSelector` takes it, and the name it requires exactly, if any.
struct FieldSelectorReading<'q> {
    parses: bool,
    name: Option<&'q str>,
}

/// kube's `fields.ParseSelector` and `RequiresExactMatch("metadata.name")`, over the selector
/// as Go unescaped it: terms split at commas no backslash escapes (`splitTerms`), empty ones
/// skipped; each cut at its first operator (`splitTerm`: `!=`, `==`, `=`); each value unescaped
/// by kube's rules (`UnescapeValue`). The name is borrowed from the query, so it is given only
/// when its bytes needed no unescaping of either kind and every `metadata.name` requirement
/// names the same; otherwise none (a policy naming resources then refuses, where kube would
/// have checked one name: stricter, never looser).
fn read_field_selector(raw: &[u8]) -> FieldSelectorReading<'_> {
    let mut parses = true;
    let mut name: Option<Option<&str>> = None;
    for term in field_terms(raw).filter(|t| !t.is_empty()) {
        let Some((field, equal, value)) = cut_term(term) else {
            parses = false;
            continue;
        };
        parses &= kube_value_unescapes(value);
        if equal && Unescaped::new(field).eq(*b"metadata.name") {
            let plain = !value.iter().any(|b| matches!(b, b'%' | b'+' | b'\\'));
            let this = plain.then(|| std::str::from_utf8(value).ok()).flatten();
            name = match name {
                None => Some(this),
                Some(seen) if seen == this => Some(seen),
                Some(_) => Some(None),
            };
        }
    }
    FieldSelectorReading {
        parses,
        name: name.flatten().filter(|n| parses && is_path_segment_name(n)),
    }
}

/// kube's `splitTerms` over the unescaped selector: the raw pieces between commas that no
/// backslash escapes.
fn field_terms(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(raw);
    std::iter::from_fn(move || {
        let text = rest?;
        let mut bytes = Unescaped::new(text);
        let mut in_slash = false;
        loop {
            let at = bytes.position();
            match bytes.next() {
                None => {
                    rest = None;
                    return Some(text);
                }
                Some(_) if in_slash => in_slash = false,
                Some(b'\\') => in_slash = true,
                Some(b',') => {
                    rest = Some(&text[bytes.position()..]);
                    return Some(&text[..at]);
                }
                Some(_) => {}
            }
        }
    })
}

/// kube's `splitTerm` over an unescaped term: at the first position where `!=`, `==` or `=`
/// begins (in that order), the raw field, whether the operator is an equality, and the raw value.
fn cut_term(term: &[u8]) -> Option<(&[u8], bool, &[u8])> {
    let mut bytes = Unescaped::new(term);
    loop {
        let here = bytes.position();
        let mut ahead = bytes.clone();
        let first = ahead.next()?;
        let after_first = ahead.position();
        match (first, ahead.next()) {
            (b'!', Some(b'=')) => return Some((&term[..here], false, &term[ahead.position()..])),
            (b'=', Some(b'=')) => return Some((&term[..here], true, &term[ahead.position()..])),
            (b'=', _) => return Some((&term[..here], true, &term[after_first..])),
            _ => {
                bytes.next();
            }
        }
    }
}

/// Whether kube's `UnescapeValue` takes an (unescaped) value: `\\`, `\,` and `\=` only, no
/// trailing backslash, no bare `,` or `=`.
fn kube_value_unescapes(value: &[u8]) -> bool {
    let mut in_slash = false;
    for byte in Unescaped::new(value) {
        match byte {
            b'\\' | b',' | b'=' if in_slash => in_slash = false,
            _ if in_slash => return false,
            b'\\' => in_slash = true,
            b',' | b'=' => return false,
            _ => {}
        }
    }
    !in_slash
}

/// kube's path.IsValidPathSegmentName: not `.` or `..`, and no `/` or `%`.
fn is_path_segment_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

#[cfg(test)]
mod tests;
