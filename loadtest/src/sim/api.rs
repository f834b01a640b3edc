//! The request router of a simulated member: authenticates (bearer token or client certificate),
//! applies impersonation, authorizes against the built-in allow list, parses the Kubernetes path
//! (`/api/v1/...`, `/apis/<g>/<v>/...`, discovery, OpenAPI, reviews) and dispatches to the object
//! handlers (`objects`), `watch`, `logs` or the streaming module (`stream::serve`).
//!
//! Never writes a Status by hand (errors go through `status::error_response`), never holds the
//! store lock across an await. Called by `server` for every HTTP request.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::sim::auth::{self, AuthError, RequestAttributes, UserInfo};
use crate::sim::body::SimBody;
use crate::sim::member::Member;
use crate::sim::resources::{Registry, ResourceInfo};
use crate::sim::status::{error_response, json_response, qualified, ApiError, Flow, ResponseCtx};
use crate::sim::stream::{StreamKind, StreamRequest};
use crate::sim::table::{negotiate, OutputFormat};
use crate::sim::{discovery, logs, objects, openapi, store, watch};

/// Largest request body accepted (the apiserver's limit is 3 MiB too).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The decoded query string, as the apiserver's Go reads it (`url.Query()`): pairs split at `&`,
/// `+` a space, `%XX` a byte; a pair holding a `;`, or a `%` without two hex digits in its key
/// or value, is dropped (Go 1.17 on).
#[derive(Debug, Default, Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let unescape = |text: &str| -> Option<String> {
            let bytes = text.as_bytes();
            let mut out = Vec::with_capacity(bytes.len());
            let mut i = 0;
            while i < bytes.len() {
                match bytes[i] {
                    b'%' => {
                        let hex = bytes.get(i + 1..i + 3)?;
                        let hex = std::str::from_utf8(hex).ok()?;
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
            Some(String::from_utf8_lossy(&out).into_owned())
        };
        let pairs = raw
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty() && !pair.contains(';'))
            .filter_map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                Some((unescape(key)?, unescape(value)?))
            })
            .collect();
        Query(pairs)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn get_all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true") | Some("1"))
    }
}

/// Everything a handler needs to know about the request besides its body.
pub struct RequestInfo<'a> {
    pub member: &'a Arc<Member>,
    pub user: &'a UserInfo,
    pub query: &'a Query,
    pub ctx: ResponseCtx,
    pub format: OutputFormat,
    pub user_agent: &'a str,
}

/// A parsed resource path.
#[derive(Debug, Clone)]
pub struct ResourcePath {
    pub info: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

enum Route {
    Version,
    ApiVersions,
    ResourceList {
        group: String,
        version: String,
    },
    Groups,
    Group(String),
    OpenApi,
    /// `/metrics`: the member's own gauges, for tests and benchmarks (system:masters only).
    Metrics,
    /// `/debug/sim/faults`: the member's fault switches (`faults`; system:masters only).
    Faults,
    SelfSubjectReview(String),
    SelfSubjectAccessReview,
    SelfSubjectRulesReview,
    Resource(ResourcePath),
}

/// Handles one request on `member`. `cert_user` is the identity of the verified client
/// certificate of the connection, if any.
pub async fn handle(
    member: Arc<Member>,
    cert_user: Option<Arc<UserInfo>>,
    req: Request<Incoming>,
) -> Response<SimBody> {
    let user_agent = header_str(&req, header::USER_AGENT)
        .unwrap_or("")
        .to_string();
    let query = Query::parse(req.uri().query());
    let mut ctx = ResponseCtx::new(&user_agent, query.get("pretty"));
    let path = req.uri().path().to_string();

    // Health endpoints answer anyone (system:public-info-viewer in a real cluster).
    if let Some(resp) = health(&path, &ctx) {
        return resp;
    }
    // Authentication: the verified client certificate, else a known bearer token. Without any
    // credential only /version is public, as system:public-info-viewer allows it.
    let caller = match authenticate(&member, cert_user.as_deref(), &req) {
        Some(user) => user,
        None if path == "/version" && !req.headers().contains_key(header::AUTHORIZATION) => {
            UserInfo {
                name: "system:anonymous".into(),
                uid: String::new(),
                groups: vec!["system:unauthenticated".into()],
                extra: BTreeMap::new(),
            }
        }
        None => return error_response(&ApiError::unauthorized(), &ctx),
    };
    // Right after a restart (when the member's switch says so), RBAC has not synced: every
    // request but a superuser's is forbidden, as a restarted kube-apiserver answers them.
    if member.faults.forbids() && !caller.in_group(auth::MASTERS_GROUP) {
        let verb = req.method().as_str().to_ascii_lowercase();
        return error_response(&forbidden_path(&caller, &verb, &path), &ctx);
    }
    let user = match auth::impersonate(&caller, req.headers()) {
        Ok(user) => user,
        Err(error) => return error_response(&impersonation_error(error, &path), &ctx),
    };
    ctx.flow = if user.is_exempt() {
        Flow::Exempt
    } else {
        Flow::GlobalDefault
    };
    // The query as it came on the wire (percent-encoded): tests read what a member was asked.
    let raw_query = req.uri().query().unwrap_or("");
    tracing::debug!(member = %member.name, user = %user.name, method = %req.method(), path = %path, query = %raw_query, "request");
    match route_and_serve(&member, &user, &user_agent, &query, ctx, req).await {
        Ok(resp) => resp,
        Err(error) => error_response(&error, &ctx),
    }
}

/// A non-resource `path` for system:masters only: the 403 of anyone else.
fn masters_only(user: &UserInfo, verb: &str, path: &str) -> Result<(), ApiError> {
    if user.in_group(auth::MASTERS_GROUP) {
        return Ok(());
    }
    Err(forbidden_path(user, verb, path))
}

fn forbidden_path(user: &UserInfo, verb: &str, path: &str) -> ApiError {
    ApiError::status(
        403,
        "Forbidden",
        format!(
            "forbidden: User {:?} cannot {verb} path {path:?}",
            user.name
        ),
    )
}

/// `/healthz`, `/livez`, `/readyz` (and their `/...` checks): `ok`, for anyone.
fn health(path: &str, ctx: &ResponseCtx) -> Option<Response<SimBody>> {
    let base = path.trim_end_matches('/');
    let healthy = ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| base == *p || base.starts_with(&format!("{p}/")));
    healthy.then(|| {
        crate::sim::status::bytes_response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"ok"),
            ctx,
        )
    })
}

fn header_str<B>(req: &Request<B>, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn authenticate<B>(
    member: &Member,
    cert_user: Option<&UserInfo>,
    req: &Request<B>,
) -> Option<UserInfo> {
    if let Some(user) = cert_user {
        return Some(user.clone());
    }
    let authorization = header_str(req, header::AUTHORIZATION)?;
    let token = authorization
        .strip_prefix("Bearer ")
        .or_else(|| authorization.strip_prefix("bearer "))?
        .trim();
    member.tokens.authenticate(token).cloned()
}

fn impersonation_error(error: AuthError, path: &str) -> ApiError {
    match &error {
        AuthError::Unauthenticated => ApiError::unauthorized(),
        AuthError::ImpersonationForbidden { kind, name, .. } => {
            ApiError::status(403, "Forbidden", error.to_string())
                .with_details(json!({"name": name, "kind": kind}))
        }
        AuthError::ImpersonationWithoutUser { .. } => {
            ApiError::InternalText(format!("Internal Server Error: {path:?}: {error}"))
        }
    }
}

fn parse_route(registry: &Registry, path: &str) -> Result<Route, ApiError> {
    let trimmed = path.trim_end_matches('/');
    let segments: Vec<&str> = trimmed.split('/').skip(1).collect();
    match segments.as_slice() {
        ["version"] => Ok(Route::Version),
        ["openapi", ..] => Ok(Route::OpenApi),
        ["metrics"] => Ok(Route::Metrics),
        ["debug", "sim", "faults"] => Ok(Route::Faults),
        ["api"] => Ok(Route::ApiVersions),
        ["api", "v1"] => Ok(Route::ResourceList {
            group: String::new(),
            version: "v1".into(),
        }),
        ["api", "v1", rest @ ..] => parse_resource_path(registry, "", "v1", rest),
        ["api", ..] => Err(ApiError::PageNotFound),
        ["apis"] => Ok(Route::Groups),
        ["apis", group] => {
            if registry.group_exists(group) {
                Ok(Route::Group(group.to_string()))
            } else {
                Err(ApiError::PageNotFound)
            }
        }
        ["apis", group, version, rest @ ..] => {
            if !registry.group_exists(group) {
                return Err(ApiError::PageNotFound);
            }
            if !registry.group_version_exists(group, version) {
                return Err(ApiError::resource_not_found());
            }
            match (*group, rest) {
                (_, []) => Ok(Route::ResourceList {
                    group: group.to_string(),
                    version: version.to_string(),
                }),
                ("authentication.k8s.io", ["selfsubjectreviews"]) => {
                    Ok(Route::SelfSubjectReview(version.to_string()))
                }
                ("authorization.k8s.io", ["selfsubjectaccessreviews"]) => {
                    Ok(Route::SelfSubjectAccessReview)
                }
                ("authorization.k8s.io", ["selfsubjectrulesreviews"]) => {
                    Ok(Route::SelfSubjectRulesReview)
                }
                _ => parse_resource_path(registry, group, version, rest),
            }
        }
        _ => Err(ApiError::PageNotFound),
    }
}

fn parse_resource_path(
    registry: &Registry,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Route, ApiError> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, more @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*resource];
            v.extend_from_slice(more);
            v
        }),
        _ => (None, rest.to_vec()),
    };
    let (plural, name, subresource) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(ApiError::resource_not_found()),
    };
    let info = registry
        .find(group, version, plural)
        .ok_or_else(ApiError::resource_not_found)?;
    if namespace.is_some() && !info.namespaced {
        return Err(ApiError::resource_not_found());
    }
    if namespace.is_none() && info.namespaced && name.is_some() {
        return Err(ApiError::resource_not_found());
    }
    if let Some(sub) = &subresource {
        if !info.has_subresource(sub) {
            return Err(ApiError::resource_not_found());
        }
    }
    Ok(Route::Resource(ResourcePath {
        info,
        namespace,
        name,
        subresource,
    }))
}

/// The 403 for `user` doing `attrs`.
pub fn forbidden(user: &UserInfo, attrs: &RequestAttributes<'_>) -> ApiError {
    let base = attrs.resource.split('/').next().unwrap_or(attrs.resource);
    let subject = match attrs.name {
        Some(name) => format!("{} {name:?}", qualified(attrs.group, base)),
        None => qualified(attrs.group, base),
    };
    let scope = match attrs.namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_string(),
    };
    let message = format!(
        "{subject} is forbidden: User {:?} cannot {} resource {:?} in API group {:?} {scope}",
        user.name, attrs.verb, attrs.resource, attrs.group
    );
    let mut details = serde_json::Map::new();
    if let Some(name) = attrs.name {
        details.insert("name".into(), json!(name));
    }
    if !attrs.group.is_empty() {
        details.insert("group".into(), json!(attrs.group));
    }
    details.insert("kind".into(), json!(base));
    ApiError::status(403, "Forbidden", message).with_details(Value::Object(details))
}

fn require(user: &UserInfo, attrs: RequestAttributes<'_>) -> Result<(), ApiError> {
    if auth::authorize(user, &attrs) {
        Ok(())
    } else {
        Err(forbidden(user, &attrs))
    }
}

/// Reads the whole request body (bounded).
pub async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(ApiError::status(
            413,
            "RequestEntityTooLarge",
            format!("the request body could not be read: {e}"),
        )),
    }
}

async fn route_and_serve(
    member: &Arc<Member>,
    user: &UserInfo,
    user_agent: &str,
    query: &Query,
    ctx: ResponseCtx,
    req: Request<Incoming>,
) -> Result<Response<SimBody>, ApiError> {
    let path = req.uri().path().to_string();
    if let Some(target) = crate::sim::services::proxy_path(&path) {
        return crate::sim::services::serve(member, user, target, req).await;
    }
    let route = parse_route(&member.registry, &path)?;
    let method = req.method().clone();
    let accept = header_str(&req, header::ACCEPT).map(str::to_string);
    let get_only = |m: &Method| -> Result<(), ApiError> {
        if m == Method::GET || m == Method::HEAD {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    // A discovery document (`doc`; 404 when it names nothing): GET or HEAD only, in JSON or YAML
    // as asked, never in the aggregated form. The method and the format are checked first.
    let discovery_doc = |doc: &dyn Fn() -> Option<Value>| -> Result<Response<SimBody>, ApiError> {
        get_only(&method)?;
        if discovery::only_aggregated(accept.as_deref()) {
            return Err(ApiError::NotAcceptable { discovery: true });
        }
        let format = match negotiate(accept.as_deref()) {
            Some(OutputFormat::Yaml) => OutputFormat::Yaml,
            _ => OutputFormat::Json,
        };
        let doc = doc().ok_or(ApiError::PageNotFound)?;
        Ok(objects::encode(StatusCode::OK, &doc, format, &ctx))
    };
    match route {
        Route::Version => {
            get_only(&method)?;
            let pretty = ResponseCtx {
                pretty: true,
                ..ctx
            };
            Ok(json_response(
                StatusCode::OK,
                &discovery::version(),
                &pretty,
            ))
        }
        Route::ApiVersions => {
            discovery_doc(&|| Some(discovery::api_versions(&member.server_address)))
        }
        Route::Groups => discovery_doc(&|| Some(discovery::api_groups(&member.registry))),
        Route::Group(group) => discovery_doc(&|| discovery::api_group(&member.registry, &group)),
        Route::ResourceList { group, version } => {
            discovery_doc(&|| Some(discovery::resource_list(&member.registry, &group, &version)))
        }
        Route::Metrics => {
            get_only(&method)?;
            masters_only(user, "get", &path)?;
            Ok(crate::sim::status::bytes_response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(
                    crate::sim::stream::metrics_text()
                        + &member.open_watches_text()
                        + &member.requests_text(),
                ),
                &ctx,
            ))
        }
        Route::Faults => {
            let verb = if method == Method::GET || method == Method::HEAD {
                "get"
            } else if method == Method::POST || method == Method::PUT {
                "update"
            } else {
                return Err(ApiError::method_not_allowed());
            };
            masters_only(user, verb, &path)?;
            if verb == "update" {
                let body = read_body(req.into_body()).await?;
                member
                    .faults
                    .apply(&body)
                    .map_err(|reason| ApiError::status(400, "BadRequest", reason))?;
            }
            Ok(json_response(
                StatusCode::OK,
                &member.faults.to_json(),
                &ctx,
            ))
        }
        Route::OpenApi => {
            get_only(&method)?;
            openapi::serve(
                &path,
                query.get("hash"),
                accept.as_deref(),
                header_str(&req, header::IF_NONE_MATCH),
                &ctx,
            )
        }
        Route::SelfSubjectReview(version) => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            // kubectl may send protobuf; the body carries nothing the answer depends on.
            let _ = read_body(req.into_body()).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &self_subject_review(user, &version),
                &ctx,
            ))
        }
        Route::SelfSubjectAccessReview | Route::SelfSubjectRulesReview => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let rules = matches!(route, Route::SelfSubjectRulesReview);
            let content_type = header_str(&req, header::CONTENT_TYPE)
                .unwrap_or("")
                .to_string();
            let body = read_body(req.into_body()).await?;
            // `kubectl auth can-i` sends the review as protobuf.
            let review: Value = if crate::sim::protobuf::is_protobuf(&content_type) {
                crate::sim::protobuf::decode(&body)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding review: {e}")))?
            };
            let answer = if rules {
                self_subject_rules_review(user, &review)
            } else {
                self_subject_access_review(user, review)
            };
            Ok(json_response(StatusCode::CREATED, &answer, &ctx))
        }
        Route::Resource(rp) => {
            let format = match negotiate(accept.as_deref()) {
                Some(f) => f,
                None => return Err(ApiError::NotAcceptable { discovery: false }),
            };
            let info = RequestInfo {
                member,
                user,
                query,
                ctx,
                format,
                user_agent,
            };
            serve_resource(&info, rp, req).await
        }
    }
}

fn self_subject_review(user: &UserInfo, version: &str) -> Value {
    let mut user_info = serde_json::Map::new();
    user_info.insert("username".into(), json!(user.name));
    if !user.uid.is_empty() {
        user_info.insert("uid".into(), json!(user.uid));
    }
    user_info.insert("groups".into(), json!(user.groups));
    if !user.extra.is_empty() {
        let extra: BTreeMap<_, _> = user.extra.iter().collect();
        user_info.insert("extra".into(), json!(extra));
    }
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": format!("authentication.k8s.io/{version}"),
        "metadata": {"creationTimestamp": objects::now_rfc3339()},
        "status": {"userInfo": Value::Object(user_info)},
    })
}

/// `kubectl auth can-i --list`: the rules of the allow list that apply in the namespace.
fn self_subject_rules_review(user: &UserInfo, review: &Value) -> Value {
    let namespace = review["spec"]["namespace"].as_str().unwrap_or("");
    let (resource_rules, non_resource_rules) = auth::rules_for(user, namespace);
    json!({
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {},
        "status": {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": false,
        },
    })
}

fn self_subject_access_review(user: &UserInfo, mut review: Value) -> Value {
    let attrs = &review["spec"]["resourceAttributes"];
    let allowed = if attrs.is_object() {
        let resource = match attrs["subresource"].as_str().filter(|s| !s.is_empty()) {
            Some(sub) => format!("{}/{sub}", attrs["resource"].as_str().unwrap_or("")),
            None => attrs["resource"].as_str().unwrap_or("").to_string(),
        };
        auth::authorize(
            user,
            &RequestAttributes {
                verb: attrs["verb"].as_str().unwrap_or(""),
                group: attrs["group"].as_str().unwrap_or(""),
                resource: &resource,
                namespace: attrs["namespace"].as_str().filter(|s| !s.is_empty()),
                name: attrs["name"].as_str().filter(|s| !s.is_empty()),
            },
        )
    } else {
        let attrs = &review["spec"]["nonResourceAttributes"];
        auth::authorize_path(
            user,
            attrs["verb"].as_str().unwrap_or(""),
            attrs["path"].as_str().unwrap_or(""),
        )
    };
    review["status"] = json!({"allowed": allowed});
    review["kind"] = json!("SelfSubjectAccessReview");
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review
}

async fn serve_resource(
    info: &RequestInfo<'_>,
    rp: ResourcePath,
    req: Request<Incoming>,
) -> Result<Response<SimBody>, ApiError> {
    let method = req.method().clone();
    let res = rp.info;
    let ns = rp.namespace.as_deref();
    let name = rp.name.as_deref();
    let sub = rp.subresource.as_deref();
    let resource_attr = match sub {
        Some(s) => format!("{}/{s}", res.plural),
        None => res.plural.to_string(),
    };
    let verb = match (&method, name, sub) {
        (&Method::GET, None, _) if info.query.flag("watch") => "watch",
        (&Method::GET, None, _) => "list",
        (&Method::POST, None, _) => "create",
        (&Method::DELETE, None, _) => "deletecollection",
        (&Method::GET, Some(_), Some("exec" | "attach" | "portforward")) => "create",
        (&Method::POST, Some(_), Some("exec" | "attach" | "portforward")) => "create",
        (&Method::GET | &Method::HEAD, Some(_), _) => "get",
        (&Method::PUT, Some(_), _) => "update",
        (&Method::PATCH, Some(_), _) => "patch",
        (&Method::DELETE, Some(_), None) => "delete",
        _ => return Err(ApiError::method_not_allowed()),
    };
    // Namespaces are themselves named by their own name, in their own "namespace".
    let attr_namespace = if res.plural == "namespaces" { name } else { ns };
    require(
        info.user,
        RequestAttributes {
            verb,
            group: res.group,
            resource: &resource_attr,
            namespace: attr_namespace,
            name,
        },
    )?;
    info.member.count_request(verb, &resource_attr);
    if verb == "list" && info.query.get("limit") == Some("1") {
        info.member.count_short_list(&resource_attr);
    }
    let result = dispatch(info, &rp, verb, req).await;
    if res.plural == "customresourcedefinitions" && !matches!(verb, "get" | "list" | "watch") {
        let crds = info
            .member
            .store
            .list(res.store_key(), None, None, None, |_| true)
            .items;
        info.member.registry.sync_crds(&crds);
    }
    result
}

async fn dispatch(
    info: &RequestInfo<'_>,
    rp: &ResourcePath,
    verb: &str,
    req: Request<Incoming>,
) -> Result<Response<SimBody>, ApiError> {
    let res = rp.info;
    let ns = rp.namespace.as_deref();
    let name = rp.name.as_deref();
    let sub = rp.subresource.as_deref();
    match (verb, sub) {
        ("watch", _) => {
            // A stalled member never answers a watch asked for meanwhile (`faults`).
            if info.member.faults.watches_stalled() {
                std::future::pending::<()>().await;
            }
            watch::serve(info, res, ns)
        }
        ("list", _) => {
            let delay = info.member.tuning.list_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            objects::list(info, res, ns)
        }
        ("create", None) => {
            let content_type = header_str(&req, header::CONTENT_TYPE).map(str::to_string);
            let body = read_body(req.into_body()).await?;
            objects::create(info, res, ns, content_type.as_deref(), &body)
        }
        ("deletecollection", _) => {
            let body = read_body(req.into_body()).await?;
            objects::delete_collection(info, res, ns, &body)
        }
        ("get", Some("log")) => {
            let pod = objects::get_object(info, res, ns, name.unwrap_or(""))?;
            logs::serve(info, &pod)
        }
        ("create", Some(kind @ ("exec" | "attach" | "portforward"))) => {
            let pod = objects::get_object(info, res, ns, name.unwrap_or(""))?;
            let target = stream_request(info.query, &pod, kind)?;
            Ok(crate::sim::stream::serve(req, target))
        }
        ("get", Some("scale")) => {
            let object = objects::get_object(info, res, ns, name.unwrap_or(""))?;
            Ok(objects::respond_scale(info, &object))
        }
        ("update" | "patch", Some("scale")) => {
            let content_type = header_str(&req, header::CONTENT_TYPE).map(str::to_string);
            let body = read_body(req.into_body()).await?;
            objects::change_scale(
                info,
                res,
                ns,
                name.unwrap_or(""),
                verb,
                content_type.as_deref(),
                &body,
            )
        }
        ("get", _) => {
            let object = objects::get_object(info, res, ns, name.unwrap_or(""))?;
            Ok(objects::respond_object(info, res, StatusCode::OK, &object))
        }
        ("update" | "patch", _) => {
            let content_type = header_str(&req, header::CONTENT_TYPE).map(str::to_string);
            let body = read_body(req.into_body()).await?;
            let write = if verb == "update" {
                objects::update
            } else {
                objects::patch
            };
            write(
                info,
                res,
                ns,
                name.unwrap_or(""),
                sub,
                content_type.as_deref(),
                &body,
            )
        }
        ("delete", _) => {
            let body = read_body(req.into_body()).await?;
            objects::delete(info, res, ns, name.unwrap_or(""), &body)
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The containers of a pod, by name.
pub fn container_names(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Resolves `container=` for a pod: the named one (400 if unknown), or the only one (400 if the
/// pod has several and none was named).
pub fn resolve_container(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or("");
    let names = container_names(pod);
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if names.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod_name}"
        ))),
        None if names.len() == 1 => Ok(names[0].clone()),
        None if names.is_empty() => Err(ApiError::bad_request(format!(
            "pod {pod_name} does not have any containers"
        ))),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

fn stream_request(query: &Query, pod: &Value, kind: &str) -> Result<StreamRequest, ApiError> {
    let namespace = store::meta_str(pod, "namespace");
    let pod_name = store::meta_str(pod, "name");
    let stream_kind = match kind {
        "exec" => StreamKind::Exec {
            command: query.get_all("command"),
        },
        "attach" => StreamKind::Attach,
        _ => {
            let mut ports = Vec::new();
            for value in query.get_all("ports") {
                for port in value.split(',').filter(|p| !p.is_empty()) {
                    let parsed: u16 = port
                        .trim()
                        .parse()
                        .map_err(|_| ApiError::bad_request(format!("invalid port {port:?}")))?;
                    ports.push(parsed);
                }
            }
            StreamKind::PortForward { ports }
        }
    };
    let container = if kind == "portforward" {
        container_names(pod).into_iter().next().unwrap_or_default()
    } else {
        resolve_container(pod, query.get("container"))?
    };
    Ok(StreamRequest {
        namespace,
        pod: pod_name,
        container,
        kind: stream_kind,
        stdin: query.flag("stdin"),
        stdout: query.flag("stdout"),
        stderr: query.flag("stderr"),
        tty: query.flag("tty"),
    })
}

#[cfg(test)]
mod tests {
    use super::Query;

    #[test]
    fn the_query_is_read_as_gos_url_query() {
        let query = Query::parse(Some(
            "w%61tch=tr%75e&limit=1;&limit=2&x=%zz&l=a+b%2Bc&fieldSelector=metadata.name%3Dcm1",
        ));
        assert_eq!(query.get("watch"), Some("true"));
        assert_eq!(query.get_all("limit"), ["2"]);
        assert_eq!(query.get("x"), None);
        assert_eq!(query.get("l"), Some("a b+c"));
        assert_eq!(query.get("fieldSelector"), Some("metadata.name=cm1"));
        assert!(query.flag("watch"));
    }
}
