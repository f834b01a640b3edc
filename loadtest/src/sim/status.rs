//! Every response a simulated member writes passes through here: the one place that turns an
//! [`ApiError`] into a Kubernetes `Status` (or the plain-text bodies the apiserver uses for a few
//! route-level errors), and that stamps the apiserver's response headers (`Audit-Id`,
//! `Cache-Control`, the `X-Kubernetes-Pf-*` pair, `X-Content-Type-Options` on 403s), and encodes
//! JSON compactly or pretty by User-Agent (fixtures README, Surprises 1, 2, 4, 5).
//!
//! Never decides what happened; handlers do. Called by the router and its handlers.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};

use crate::sim::body::{full, SimBody};

/// The recorded APF object UIDs: `exempt` (system:masters) and `global-default` (everyone else).
const PF_EXEMPT: (&str, &str) = (
    "5a25bea3-8d61-4301-af82-2933a08e0eef",
    "31757394-4787-4088-915c-0515fecbbd1d",
);
const PF_GLOBAL_DEFAULT: (&str, &str) = (
    "0d9cee60-a422-4d66-bec5-8557c48e8056",
    "740090c4-4a1b-4838-bcbb-02815a4d5a07",
);

/// Which API Priority and Fairness headers a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Decided before APF (401, impersonation failures) or long-running non-watch: none.
    None,
    Exempt,
    GlobalDefault,
}

/// Per-request response settings.
#[derive(Debug, Clone, Copy)]
pub struct ResponseCtx {
    pub pretty: bool,
    pub flow: Flow,
}

impl ResponseCtx {
    /// Pretty JSON when the UA looks like a human's tool or `?pretty=true` (Surprise 1).
    pub fn new(user_agent: &str, pretty_param: Option<&str>) -> Self {
        let pretty = match pretty_param {
            Some(p) => p == "true" || p == "1",
            None => {
                user_agent.contains("curl")
                    || user_agent.contains("Wget")
                    || user_agent.starts_with("Mozilla/")
            }
        };
        Self {
            pretty,
            flow: Flow::None,
        }
    }
}

/// An API error, mapped to a response by [`error_response`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// A `Status` object with this code, reason, message and optional details.
    #[error("{message}")]
    Status {
        code: u16,
        reason: Option<&'static str>,
        message: String,
        details: Option<Value>,
        /// Extra `metadata` (the continue token of a 410 Expired).
        metadata: Option<Value>,
    },
    /// `404 page not found` in plain text (unknown group or path, Surprise 5).
    #[error("404 page not found")]
    PageNotFound,
    /// A plain-text 500 (impersonation group without user).
    #[error("{0}")]
    InternalText(String),
    /// 406 from content negotiation: always indented, no details.
    #[error("406: Not Acceptable")]
    NotAcceptable { discovery: bool },
}

impl ApiError {
    pub fn status(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError::Status {
            code,
            reason: Some(reason),
            message: message.into(),
            details: None,
            metadata: None,
        }
    }

    pub fn with_details(mut self, value: Value) -> Self {
        if let ApiError::Status { details, .. } = &mut self {
            *details = Some(value);
        }
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::status(400, "BadRequest", message)
    }

    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::status(404, "NotFound", format!("{resource} {name:?} not found"))
            .with_details(json!({"name": name, "kind": resource}))
    }

    pub fn grouped_not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        let details = object_details(group, resource, name);
        Self::status(404, "NotFound", format!("{qualified} {name:?} not found"))
            .with_details(details)
    }

    /// The route-level 404 inside a known group/version.
    pub fn resource_not_found() -> Self {
        Self::status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn method_not_allowed() -> Self {
        Self::status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        let details = object_details(group, resource, name);
        Self::status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, resource)
            ),
        )
        .with_details(details)
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let details = object_details(group, resource, name);
        Self::status(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", qualified(group, resource)),
        )
        .with_details(details)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::status(422, "Invalid", message).with_details(json!({}))
    }

    pub fn unsupported_media_type_patch() -> Self {
        Self::status(415, "UnsupportedMediaType", "415: Unsupported Media Type")
            .with_details(json!({}))
    }

    pub fn unsupported_media_type_body() -> Self {
        Self::status(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        )
    }

    pub fn unauthorized() -> Self {
        Self::status(401, "Unauthorized", "Unauthorized")
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::status(410, "Expired", message)
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::Status { code, .. } => *code,
            ApiError::PageNotFound => 404,
            ApiError::InternalText(_) => 500,
            ApiError::NotAcceptable { .. } => 406,
        }
    }

    /// The Status object of this error (for watch ERROR events and Status bodies).
    pub fn to_status_value(&self) -> Value {
        match self {
            ApiError::Status {
                code,
                reason,
                message,
                details,
                metadata,
            } => {
                let mut status = serde_json::Map::new();
                status.insert("kind".into(), json!("Status"));
                status.insert("apiVersion".into(), json!("v1"));
                status.insert(
                    "metadata".into(),
                    metadata.clone().unwrap_or_else(|| json!({})),
                );
                status.insert("status".into(), json!("Failure"));
                status.insert("message".into(), json!(message));
                if let Some(reason) = reason {
                    status.insert("reason".into(), json!(reason));
                }
                if let Some(details) = details {
                    status.insert("details".into(), details.clone());
                }
                status.insert("code".into(), json!(code));
                Value::Object(status)
            }
            other => json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": other.to_string(), "code": other.code(),
            }),
        }
    }
}

/// The `details` of a Status about one object, as kube-apiserver writes them: its name, its
/// resource as `kind`, and its group unless it is the core group.
fn object_details(group: &str, resource: &str, name: &str) -> Value {
    let mut details = json!({"name": name, "kind": resource});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    details
}

/// `configmaps` or `deployments.apps`.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A fresh `Audit-Id` in UUID form: a random per-process base plus a counter, so that a small GET
/// costs no random-number syscall.
fn audit_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static BASE: OnceLock<u128> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| uuid::Uuid::new_v4().as_u128());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) as u128;
    uuid::Uuid::from_u128(base ^ n).hyphenated().to_string()
}

/// A new response with the apiserver's common headers, in Go's sorted order.
pub fn base_response(
    status: StatusCode,
    content_type: Option<&str>,
    ctx: &ResponseCtx,
) -> http::response::Builder {
    let mut builder = Response::builder()
        .status(status)
        .header("Audit-Id", audit_id())
        .header(header::CACHE_CONTROL, "no-cache, private");
    if let Some(ct) = content_type {
        builder = builder.header(header::CONTENT_TYPE, ct);
    }
    if status == StatusCode::FORBIDDEN {
        builder = builder.header("X-Content-Type-Options", "nosniff");
    }
    let pf = match ctx.flow {
        Flow::None => None,
        Flow::Exempt => Some(PF_EXEMPT),
        Flow::GlobalDefault => Some(PF_GLOBAL_DEFAULT),
    };
    if let Some((flow_schema, priority_level)) = pf {
        builder = builder
            .header("X-Kubernetes-Pf-Flowschema-Uid", flow_schema)
            .header("X-Kubernetes-Pf-Prioritylevel-Uid", priority_level);
    }
    builder
}

/// Encodes JSON compact with a trailing newline, or indented without one (Surprise 1).
pub fn encode_json<T: Serialize + ?Sized>(value: &T, pretty: bool) -> Bytes {
    let mut out = if pretty {
        serde_json::to_vec_pretty(value).unwrap_or_default()
    } else {
        serde_json::to_vec(value).unwrap_or_default()
    };
    if !pretty {
        out.push(b'\n');
    }
    Bytes::from(out)
}

/// A JSON response.
pub fn json_response<T: Serialize + ?Sized>(
    status: StatusCode,
    value: &T,
    ctx: &ResponseCtx,
) -> Response<SimBody> {
    let body = encode_json(value, ctx.pretty);
    finish(base_response(status, Some("application/json"), ctx), body)
}

/// A response with an already-encoded body.
pub fn bytes_response(
    status: StatusCode,
    content_type: &str,
    body: Bytes,
    ctx: &ResponseCtx,
) -> Response<SimBody> {
    finish(base_response(status, Some(content_type), ctx), body)
}

/// Bodies up to this size go out with `Content-Length`; larger ones chunked, as Go's net/http
/// does behind the apiserver (Surprise 3), so that proxies meet both framings on ordinary GETs.
const CONTENT_LENGTH_LIMIT: usize = 2048;

/// Finishes a response with a whole body: `Content-Length` when small, chunked when large.
pub fn finish(builder: http::response::Builder, body: Bytes) -> Response<SimBody> {
    if body.len() > CONTENT_LENGTH_LIMIT {
        let frame = Ok::<_, std::io::Error>(http_body::Frame::data(body));
        let unsized_body =
            http_body_util::StreamBody::new(futures_util::stream::once(std::future::ready(frame)));
        return builder
            .body(http_body_util::BodyExt::boxed(unsized_body))
            .unwrap_or_else(|_| internal_error());
    }
    finish_with_length(builder, body)
}

/// Finishes a response with `Content-Length` whatever its size (the OpenAPI handlers do).
pub fn finish_with_length(builder: http::response::Builder, body: Bytes) -> Response<SimBody> {
    builder
        .body(full(body))
        .unwrap_or_else(|_| internal_error())
}

fn internal_error() -> Response<SimBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    resp
}

/// The one mapping from an error to the response a client sees.
pub fn error_response(error: &ApiError, ctx: &ResponseCtx) -> Response<SimBody> {
    let status = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match error {
        ApiError::PageNotFound => finish(
            base_response(status, Some("text/plain; charset=utf-8"), ctx)
                .header("X-Content-Type-Options", "nosniff"),
            Bytes::from_static(b"404 page not found\n"),
        ),
        ApiError::InternalText(text) => finish(
            base_response(status, Some("text/plain; charset=utf-8"), ctx)
                .header("X-Content-Type-Options", "nosniff"),
            Bytes::from(format!("{text}\n")),
        ),
        ApiError::NotAcceptable { discovery } => {
            let mut status_value = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "406: Not Acceptable", "reason": "NotAcceptable", "details": {}, "code": 406,
            });
            if *discovery {
                status_value["message"] = json!("only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf");
                if let Some(obj) = status_value.as_object_mut() {
                    obj.remove("details");
                }
            }
            let body = serde_json::to_vec_pretty(&status_value).unwrap_or_default();
            finish(
                base_response(status, Some("application/json"), ctx),
                Bytes::from(body),
            )
        }
        ApiError::Status { .. } => json_response(status, &error.to_status_value(), ctx),
    }
}

/// A Success Status (DELETE of most resources).
pub fn success_status(details: Value) -> Value {
    json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":details})
}
