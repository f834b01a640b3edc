//! The OpenAPI documents a member serves: the recorded v1.24 documents (`loadtest/assets/openapi`,
//! gzipped, decompressed once on first use) for `/openapi/v2`, `/openapi/v3/api/v1` and
//! `/openapi/v3/apis/apps/v1`, plus the v3 index that points at them with `?hash=`. Headers follow
//! the recording (Surprise 7): `text/plain; charset=utf-8`, `Etag`, `Accept-Ranges`, `Vary`,
//! `Cache-Control: public, immutable` for hashed URLs, 304 on `If-None-Match`.
//!
//! The protobuf form of `/openapi/v2` (what kubectl's client-side validator fetches, and without
//! which `kubectl apply` refuses to run) is a minimal gnostic `Document` holding only `swagger`
//! and `info`: kubectl then finds no model for a kind and skips client-side validation, relying on
//! `fieldValidation=Strict` at the server, while strategic-merge patches use the v3 documents.
//! Called by the router for `/openapi/...` paths.

use std::sync::OnceLock;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use sha2::{Digest, Sha512};

use crate::sim::body::SimBody;
use crate::sim::status::{base_response, finish_with_length, ApiError, ResponseCtx};

static V2_GZ: &[u8] = include_bytes!("../../assets/openapi/openapi-v2.json.gz");
static V3_CORE_GZ: &[u8] = include_bytes!("../../assets/openapi/openapi-v3-api-v1.json.gz");
static V3_APPS_GZ: &[u8] = include_bytes!("../../assets/openapi/openapi-v3-apis-apps-v1.json.gz");

struct Document {
    body: Bytes,
    etag: String,
}

fn load(gz: &[u8]) -> Document {
    use std::io::Read;
    let mut body = Vec::new();
    // The assets are compiled in and were checked when recorded; an unreadable one serves empty.
    let _ = flate2::read::GzDecoder::new(gz).read_to_end(&mut body);
    let etag = hex::encode_upper(Sha512::digest(&body));
    Document {
        body: Bytes::from(body),
        etag,
    }
}

fn v2() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(|| load(V2_GZ))
}

fn v3(path: &str) -> Option<&'static Document> {
    static CORE: OnceLock<Document> = OnceLock::new();
    static APPS: OnceLock<Document> = OnceLock::new();
    match path {
        "api/v1" => Some(CORE.get_or_init(|| load(V3_CORE_GZ))),
        "apis/apps/v1" => Some(APPS.get_or_init(|| load(V3_APPS_GZ))),
        _ => None,
    }
}

fn accepts_json(accept: Option<&str>) -> bool {
    match accept {
        None => true,
        Some(a) => a.split(',').any(|r| {
            let media = r.split(';').next().unwrap_or("").trim();
            matches!(
                media,
                "" | "application/json" | "*/*" | "application/*" | "text/plain"
            )
        }),
    }
}

/// Serves `/openapi/v2`, `/openapi/v3` and `/openapi/v3/<path>`.
pub fn serve(
    path: &str,
    hash: Option<&str>,
    accept: Option<&str>,
    if_none_match: Option<&str>,
    ctx: &ResponseCtx,
) -> Result<Response<SimBody>, ApiError> {
    if path == "/openapi/v3" || path == "/openapi/v3/" {
        let mut paths = serde_json::Map::new();
        for p in ["api/v1", "apis/apps/v1"] {
            if let Some(doc) = v3(p) {
                paths.insert(
                    p.to_string(),
                    serde_json::json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", doc.etag)}),
                );
            }
        }
        let body = serde_json::to_vec(&serde_json::json!({ "paths": paths })).unwrap_or_default();
        return Ok(finish_with_length(
            base_response(StatusCode::OK, Some("text/plain; charset=utf-8"), ctx)
                .header(header::ACCEPT_RANGES, "bytes")
                .header(header::LAST_MODIFIED, httpdate::fmt_http_date(start_time())),
            Bytes::from(body),
        ));
    }
    let (doc, vary) = if path == "/openapi/v2" {
        (v2(), "Accept-Encoding")
    } else if let Some(rest) = path.strip_prefix("/openapi/v3/") {
        match v3(rest) {
            Some(doc) => (doc, ""),
            None => {
                return Ok(finish_with_length(
                    base_response(StatusCode::NOT_FOUND, None, ctx),
                    Bytes::new(),
                ))
            }
        }
    } else {
        return Err(ApiError::PageNotFound);
    };
    if path == "/openapi/v2" && accepts_v2_protobuf(accept) {
        return Ok(finish_with_length(
            base_response(StatusCode::OK, Some("application/octet-stream"), ctx)
                .header(header::ACCEPT_RANGES, "bytes")
                .header(header::VARY, "Accept-Encoding")
                .header(header::VARY, "Accept"),
            minimal_v2_protobuf(),
        ));
    }
    if !accepts_json(accept) {
        return Err(ApiError::NotAcceptable { discovery: false });
    }
    let etag = format!("\"{}\"", doc.etag);
    let mut builder = base_response(StatusCode::OK, Some("text/plain; charset=utf-8"), ctx)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::ETAG, etag.as_str())
        .header(header::LAST_MODIFIED, httpdate::fmt_http_date(start_time()));
    if !vary.is_empty() {
        builder = builder.header(header::VARY, vary);
    }
    builder = builder.header(header::VARY, "Accept");
    if hash.is_some() {
        let expires =
            std::time::SystemTime::now() + std::time::Duration::from_secs(365 * 24 * 3600);
        builder = builder
            .header(header::CACHE_CONTROL, "public, immutable")
            .header(header::EXPIRES, httpdate::fmt_http_date(expires));
    }
    if if_none_match == Some(etag.as_str()) {
        let mut resp = finish_with_length(builder, Bytes::new());
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        return Ok(resp);
    }
    let mut resp = finish_with_length(builder, doc.body.clone());
    if hash.is_some() {
        // `public, immutable` replaces the default no-cache set by base_response.
        let headers = resp.headers_mut();
        let values: Vec<_> = headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .cloned()
            .collect();
        headers.remove(header::CACHE_CONTROL);
        if let Some(last) = values.last() {
            headers.insert(header::CACHE_CONTROL, last.clone());
        }
    }
    Ok(resp)
}

fn accepts_v2_protobuf(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').next().is_some_and(|first| {
            first
                .trim()
                .starts_with("application/com.github.proto-openapi.spec.v2")
        })
    })
}

/// A gnostic `openapi_v2.Document` with `swagger: "2.0"` (field 1) and `info` (field 2:
/// title = 1, version = 2), protobuf-encoded.
fn minimal_v2_protobuf() -> Bytes {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2);
        // Every field here is shorter than 128 bytes: a one-byte varint length.
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"Kubernetes");
    field(&mut info, 2, b"v1.24.0");
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    Bytes::from(doc)
}

fn start_time() -> std::time::SystemTime {
    static START: OnceLock<std::time::SystemTime> = OnceLock::new();
    *START.get_or_init(std::time::SystemTime::now)
}
