//! The object verbs of a simulated member: get, list (selectors, paging, Table), create, update
//! (PUT), patch (four types), delete and deletecollection, with the apiserver's quirks
//! (fixtures README, Surprises 11-15) and the sim's "kubelet" (pods are created Running).
//!
//! Works on the store through `Store::mutate`, whose closures run under the store lock and so
//! never block or await. Errors are `ApiError`s, mapped to Status by `status`. Called by `api`.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::{Response, StatusCode};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::sim::api::RequestInfo;
use crate::sim::body::SimBody;
use crate::sim::member::Member;
use crate::sim::patch::{self, PatchError, PatchType};
use crate::sim::resources::{self, ResourceInfo};
use crate::sim::schema;
use crate::sim::selectors::{self, FieldSelector, LabelSelector};
use crate::sim::status::{bytes_response, json_response, success_status, ApiError, ResponseCtx};
use crate::sim::store::{self, Mutation};
use crate::sim::table::{self, IncludeObject, OutputFormat, TableOptions};

/// Namespaces that may not be deleted.
const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Encodes a document (discovery, Status, object) as JSON or YAML.
pub fn encode(
    status: StatusCode,
    value: &impl Serialize,
    format: OutputFormat,
    ctx: &ResponseCtx,
) -> Response<SimBody> {
    match format {
        OutputFormat::Yaml => {
            let yaml = serde_yaml::to_string(value).unwrap_or_default();
            bytes_response(status, "application/yaml", Bytes::from(yaml), ctx)
        }
        _ => json_response(status, value, ctx),
    }
}

/// A list item without `kind` / `apiVersion` (the apiserver omits them in lists).
struct ListItem<'a>(&'a Value);

impl Serialize for ListItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut out = serializer.serialize_map(None)?;
                for (k, v) in map {
                    if k != "kind" && k != "apiVersion" {
                        out.serialize_entry(k, v)?;
                    }
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

struct ListItems<'a>(&'a [Arc<Value>]);

impl Serialize for ListItems<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&ListItem(item))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct ListBody<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    metadata: Value,
    items: ListItems<'a>,
}

/// Responds with one object in the negotiated format.
pub fn respond_object(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    status: StatusCode,
    object: &Arc<Value>,
) -> Response<SimBody> {
    match info.format {
        OutputFormat::Table(version) => {
            let rv = object["metadata"]["resourceVersion"].clone();
            let doc = table::table(
                std::slice::from_ref(object),
                &TableOptions {
                    resource: res.plural,
                    version,
                    include: IncludeObject::parse(info.query.get("includeObject")),
                    with_columns: true,
                    list_metadata: json!({"resourceVersion": rv}),
                },
            );
            json_response(status, &doc, &info.ctx)
        }
        OutputFormat::PartialMetadata(version) => {
            json_response(status, &table::partial_metadata(object, version), &info.ctx)
        }
        format => encode(status, object.as_ref(), format, &info.ctx),
    }
}

/// The object `name` (404 when missing).
pub fn get_object(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
) -> Result<Arc<Value>, ApiError> {
    info.member
        .store
        .get(res.store_key(), ns.unwrap_or(""), name)
        .ok_or_else(|| ApiError::grouped_not_found(res.group, res.plural, name))
}

/// Selectors of a list, watch or deletecollection.
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn parse(info: &RequestInfo<'_>, res: &ResourceInfo) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(info.query.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.0))?;
        let fields =
            FieldSelector::parse(info.query.get("fieldSelector").unwrap_or(""), res.plural)
                .map_err(|e| ApiError::bad_request(e.0))?;
        Ok(Self { labels, fields })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[derive(Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    start: String,
}

fn decode_continue(token: &str) -> Result<ContinueToken, ApiError> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(token))
        .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid: {e}"
        ))
    })
}

fn encode_continue(rv: u64, start: &str) -> String {
    let token = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv: rv as i64,
        start: format!("{start}\u{0}"),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&token).unwrap_or_default())
}

/// LIST.
pub fn list(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
) -> Result<Response<SimBody>, ApiError> {
    let selectors = Selectors::parse(info, res)?;
    let limit = info
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let all_namespaces = ns.is_none() && res.namespaced;
    let start_after = match info.query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let token = decode_continue(token)?;
            if token.rv >= 0 && (token.rv as u64) < info.member.store.oldest_replayable() {
                return Err(expired_continue(&token.start));
            }
            let key = token.start.trim_end_matches('\u{0}').to_string();
            Some(if all_namespaces {
                match key.split_once('/') {
                    Some((n, name)) => (n.to_string(), name.to_string()),
                    None => (String::new(), key),
                }
            } else {
                (ns.unwrap_or("").to_string(), key)
            })
        }
        None => None,
    };
    let rv_match = info
        .query
        .get("resourceVersionMatch")
        .filter(|m| !m.is_empty());
    let rv_param = info
        .query
        .get("resourceVersion")
        .filter(|rv| !rv.is_empty());
    if rv_match.is_some() && rv_param.is_none() {
        return Err(ApiError::status(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        )
        .with_details(json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": [{
            "reason": "FieldValueForbidden",
            "message": "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            "field": "resourceVersionMatch",
        }]})));
    }
    if let Some(rv) = rv_param {
        if rv.parse::<u64>().is_err() {
            return Err(ApiError::status(
                500,
                "InternalError",
                format!("resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"),
            ));
        }
        if info.query.get("resourceVersionMatch") == Some("Exact")
            && rv.parse::<u64>().unwrap_or(0) < info.member.store.oldest_replayable()
        {
            return Err(ApiError::expired(
                "The resourceVersion for the provided list is too old.",
            ));
        }
    }
    let page = info
        .member
        .store
        .list(res.store_key(), ns, start_after.as_ref(), limit, |o| {
            selectors.matches(o)
        });
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(page.rv.to_string()));
    if let Some((next_ns, next_name)) = &page.next_start {
        let key = if all_namespaces {
            format!("{next_ns}/{next_name}")
        } else {
            next_name.clone()
        };
        metadata.insert("continue".into(), json!(encode_continue(page.rv, &key)));
        metadata.insert("remainingItemCount".into(), json!(page.remaining));
    }
    match info.format {
        OutputFormat::Table(version) => {
            let doc = table::table(
                &page.items,
                &TableOptions {
                    resource: res.plural,
                    version,
                    include: IncludeObject::parse(info.query.get("includeObject")),
                    with_columns: true,
                    list_metadata: Value::Object(metadata),
                },
            );
            Ok(json_response(StatusCode::OK, &doc, &info.ctx))
        }
        OutputFormat::PartialMetadata(version) => {
            let items: Vec<Value> = page
                .items
                .iter()
                .map(|o| json!({"metadata": o["metadata"]}))
                .collect();
            let doc = json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": format!("meta.k8s.io/{version}"),
                "metadata": Value::Object(metadata),
                "items": items,
            });
            Ok(json_response(StatusCode::OK, &doc, &info.ctx))
        }
        format => {
            let body = ListBody {
                kind: format!("{}List", res.kind),
                api_version: res.api_version(),
                metadata: Value::Object(metadata),
                items: ListItems(&page.items),
            };
            Ok(encode(StatusCode::OK, &body, format, &info.ctx))
        }
    }
}

fn expired_continue(start: &str) -> ApiError {
    let token = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv: -1,
        start: start.to_string(),
    };
    let continue_token = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&token).unwrap_or_default());
    match ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.") {
        ApiError::Status { code, reason, message, details, .. } => ApiError::Status {
            code,
            reason,
            message,
            details,
            metadata: Some(json!({"continue": continue_token})),
        },
        other => other,
    }
}

/// Parses a POST/PUT body (JSON or YAML) into an object.
fn parse_object_body(
    res: &ResourceInfo,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let media = content_type
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|| "application/json".into());
    let value: Value = match media.as_str() {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            let preview: String = String::from_utf8_lossy(&body[..body.len().min(30)]).into_owned();
            let reason = if e.is_eof() {
                "unexpected end of JSON input".to_string()
            } else {
                e.to_string()
            };
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {reason} ({preview} ...)",
                res.kind
            ))
        })?,
        "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        // kubectl's generators (create configmap, run, ...) send built-in kinds as protobuf.
        crate::sim::protobuf::MEDIA_TYPE => match crate::sim::protobuf::decode(body) {
            Ok(v) => v,
            Err(crate::sim::protobuf::DecodeError::UnknownKind(_)) => {
                return Err(ApiError::unsupported_media_type_body())
            }
            Err(e) => return Err(ApiError::bad_request(e.to_string())),
        },
        _ => return Err(ApiError::unsupported_media_type_body()),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {})",
            res.kind
        )));
    }
    check_kind(res, &value)?;
    Ok(value)
}

/// A body of the wrong kind for the URL is a 400; a missing kind defaults from the URL.
/// The object's fields have the types the apiserver would decode them into (where the sim reads
/// or writes them), so that a malformed body is a 400 and never reaches code that assumes a map.
fn check_shape(res: &ResourceInfo, value: &Value) -> Result<(), ApiError> {
    let wrong = |path: &str, found: &Value, want: &str| {
        ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: json: cannot unmarshal {found} into Go struct field {path} of type {want}",
            kind = res.kind,
            version = res.version,
            found = json_type(found),
        ))
    };
    let object_or_null = |v: &Value| v.is_null() || v.is_object();
    let meta = &value["metadata"];
    if !object_or_null(meta) {
        return Err(wrong("ObjectMeta.metadata", meta, "v1.ObjectMeta"));
    }
    for field in [
        "name",
        "namespace",
        "generateName",
        "resourceVersion",
        "uid",
    ] {
        let v = &meta[field];
        if !(v.is_null() || v.is_string()) {
            return Err(wrong(&format!("ObjectMeta.metadata.{field}"), v, "string"));
        }
    }
    for field in ["labels", "annotations"] {
        let v = &meta[field];
        if !object_or_null(v) {
            return Err(wrong(
                &format!("ObjectMeta.metadata.{field}"),
                v,
                "map[string]string",
            ));
        }
        if let Some(bad) = v
            .as_object()
            .and_then(|m| m.values().find(|x| !x.is_string()))
        {
            return Err(wrong(
                &format!("ObjectMeta.metadata.{field}"),
                bad,
                "string",
            ));
        }
    }
    let built_in = resources::find(res.group, res.version, res.plural).is_some()
        && !res.group.ends_with("fleetgate.io");
    if built_in {
        for field in ["spec", "status"] {
            if !object_or_null(&value[field]) {
                return Err(wrong(
                    &format!("{}.{field}", res.kind),
                    &value[field],
                    "object",
                ));
            }
        }
        for (path, list) in [
            ("containers", &value["spec"]["containers"]),
            ("ports", &value["spec"]["ports"]),
        ] {
            let ok = list.is_null()
                || list
                    .as_array()
                    .is_some_and(|items| items.iter().all(Value::is_object));
            if !ok {
                return Err(wrong(
                    &format!("{}.spec.{path}", res.kind),
                    list,
                    "[]object",
                ));
            }
        }
    }
    Ok(())
}

fn check_kind(res: &ResourceInfo, value: &Value) -> Result<(), ApiError> {
    check_shape(res, value)?;
    if let Some(kind) = value["kind"].as_str().filter(|k| !k.is_empty()) {
        if kind != res.kind {
            return Err(ApiError::bad_request(format!(
                "{kind} in version {:?} cannot be handled as a {}: converting (v1.{kind}) to (core.{}): unknown conversion",
                res.version, res.kind, res.kind
            )));
        }
    }
    if let Some(av) = value["apiVersion"].as_str().filter(|a| !a.is_empty()) {
        if av != res.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                res.api_version()
            )));
        }
    }
    Ok(())
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn invalid_object(
    res: &ResourceInfo,
    name: &str,
    causes: Vec<(String, String, &'static str)>,
) -> ApiError {
    let message = causes
        .iter()
        .map(|(field, msg, _)| format!("{field}: {msg}"))
        .collect::<Vec<_>>();
    let message = if message.len() == 1 {
        message[0].clone()
    } else {
        format!("[{}]", message.join(", "))
    };
    let cause_values: Vec<Value> = causes
        .iter()
        .map(|(field, msg, reason)| json!({"reason": reason, "message": msg, "field": field}))
        .collect();
    let mut details = json!({"name": name, "kind": res.kind, "causes": cause_values});
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    ApiError::status(
        422,
        "Invalid",
        format!("{} {name:?} is invalid: {message}", res.kind),
    )
    .with_details(details)
}

fn validate(res: &ResourceInfo, object: &Value) -> Result<(), ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    let mut causes = Vec::new();
    if !is_dns_subdomain(name) {
        causes.push((
            "metadata.name".to_string(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
            "FieldValueInvalid",
        ));
    }
    if res.plural == "configmaps" || res.plural == "secrets" {
        if let Some(data) = object["data"].as_object() {
            for (key, value) in data {
                if !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                {
                    causes.push((
                        format!("data[{key}]"),
                        format!("Invalid value: {key:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"),
                        "FieldValueInvalid",
                    ));
                }
                if !value.is_string() {
                    return Err(ApiError::bad_request(format!(
                        "{} in version {:?} cannot be handled as a {}: json: cannot unmarshal {} into Go struct field {}.data of type string",
                        res.kind, res.version, res.kind, json_type(value), res.kind
                    )));
                }
            }
        }
    }
    if res.plural == "pods" {
        match object["spec"]["containers"].as_array() {
            Some(containers) if !containers.is_empty() => {
                for (i, c) in containers.iter().enumerate() {
                    let cname = c["name"].as_str().unwrap_or("");
                    if cname.is_empty() {
                        causes.push((
                            format!("spec.containers[{i}].name"),
                            "Required value".into(),
                            "FieldValueRequired",
                        ));
                    } else if !is_dns_subdomain(cname) || cname.contains('.') {
                        causes.push((
                            format!("spec.containers[{i}].name"),
                            format!("Invalid value: {cname:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
                            "FieldValueInvalid",
                        ));
                    }
                    if c["image"].as_str().unwrap_or("").is_empty() {
                        causes.push((
                            format!("spec.containers[{i}].image"),
                            "Required value".into(),
                            "FieldValueRequired",
                        ));
                    }
                }
            }
            _ => causes.push((
                "spec.containers".into(),
                "Required value".into(),
                "FieldValueRequired",
            )),
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid_object(res, name, causes))
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
        Value::String(_) => "string",
    }
}

fn random_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Fills kind/apiVersion/namespace and drops empty label/annotation maps.
fn normalize(res: &ResourceInfo, ns: Option<&str>, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        // kind and apiVersion first, as the apiserver writes them.
        let mut ordered = Map::new();
        ordered.insert("kind".into(), json!(res.kind));
        ordered.insert("apiVersion".into(), json!(res.api_version()));
        for (k, v) in std::mem::take(map) {
            if k != "kind" && k != "apiVersion" {
                ordered.insert(k, v);
            }
        }
        *map = ordered;
    }
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let meta = &mut object["metadata"];
    if res.namespaced {
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
    } else if let Some(m) = meta.as_object_mut() {
        m.remove("namespace");
    }
    if let Some(m) = meta.as_object_mut() {
        for key in ["labels", "annotations"] {
            if m.get(key)
                .is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()) || v.is_null())
            {
                m.remove(key);
            }
        }
    }
}

/// The sim's controllers and kubelet: defaults and status of a newly created object.
fn apply_create_defaults(member: &Member, res: &ResourceInfo, object: &mut Value) {
    let now = now_rfc3339();
    let name = store::meta_str(object, "name");
    match res.plural {
        "namespaces" => {
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            object["spec"] = json!({"finalizers": ["kubernetes"]});
            object["status"] = json!({"phase": "Active"});
        }
        "pods" => {
            let spec = &mut object["spec"];
            if spec["nodeName"].as_str().unwrap_or("").is_empty() {
                spec["nodeName"] = json!(member.pick_node());
            }
            for (key, value) in [
                ("restartPolicy", json!("Always")),
                ("terminationGracePeriodSeconds", json!(30)),
                ("dnsPolicy", json!("ClusterFirst")),
                ("serviceAccountName", json!("default")),
                ("schedulerName", json!("default-scheduler")),
            ] {
                if spec.get(key).is_none() {
                    spec[key] = value;
                }
            }
            let node = spec["nodeName"].clone();
            let containers = spec["containers"].as_array().cloned().unwrap_or_default();
            let statuses: Vec<Value> = containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c["name"],
                        "state": {"running": {"startedAt": now}},
                        "lastState": {},
                        "ready": true,
                        "restartCount": 0,
                        "image": c["image"],
                        "imageID": format!("sim://{}", c["image"].as_str().unwrap_or("")),
                        "containerID": format!("containerd://{}", uuid::Uuid::new_v4().simple()),
                        "started": true,
                    })
                })
                .collect();
            let pod_ip = member.allocate_ip("10.244");
            let host_ip = node_ip(member, node.as_str().unwrap_or(""));
            let condition = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
            object["status"] = json!({
                "phase": "Running",
                "conditions": [condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
                "hostIP": host_ip,
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "startTime": now,
                "containerStatuses": statuses,
                "qosClass": "BestEffort",
            });
        }
        "services" => {
            let spec = &mut object["spec"];
            if spec["type"].is_null() {
                spec["type"] = json!("ClusterIP");
            }
            if spec["clusterIP"].is_null() {
                let ip = member.allocate_ip("10.96");
                spec["clusterIP"] = json!(ip);
                spec["clusterIPs"] = json!([ip]);
            }
            if let Some(ports) = spec["ports"].as_array_mut() {
                for port in ports {
                    if port["protocol"].is_null() {
                        port["protocol"] = json!("TCP");
                    }
                    if port["targetPort"].is_null() {
                        port["targetPort"] = port["port"].clone();
                    }
                }
            }
            spec["sessionAffinity"] = spec
                .get("sessionAffinity")
                .cloned()
                .unwrap_or(json!("None"));
            object["status"] = json!({"loadBalancer": {}});
        }
        "secrets" if object["type"].is_null() => {
            object["type"] = json!("Opaque");
        }
        "nodes" if object["status"]["conditions"].is_null() => {
            object["status"] = node_status(&now, &member.allocate_ip("10.0"));
        }
        _ => {}
    }
    if res.plural == "deployments" {
        deployment_status(object);
    }
    if res.plural == "customresourcedefinitions" {
        crd_status(object, &now);
    }
}

/// A CRD is Established at once (so `kubectl wait --for condition=established` returns). The
/// sim stores CRDs but serves only its built-in resources: the fleetgate.io kinds exist already.
fn crd_status(object: &mut Value, now: &str) {
    let names = object["spec"]["names"].clone();
    let condition = |t: &str, reason: &str| json!({"type": t, "status": "True", "lastTransitionTime": now, "reason": reason, "message": ""});
    let stored: Vec<Value> = object["spec"]["versions"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    object["status"] = json!({
        "conditions": [condition("NamesAccepted", "NoConflicts"), condition("Established", "InitialNamesAccepted")],
        "acceptedNames": names,
        "storedVersions": stored,
    });
}

/// The events a scheduler and kubelet would record for a new pod (`kubectl describe pod`,
/// `kubectl get events`).
fn record_pod_start_events(member: &Member, pod: &Value) {
    let meta = &pod["metadata"];
    let ns = meta["namespace"].as_str().unwrap_or("default");
    let pod_name = meta["name"].as_str().unwrap_or("");
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    let now = now_rfc3339();
    let mut events = vec![(
        "Scheduled".to_string(),
        format!("Successfully assigned {ns}/{pod_name} to {node}"),
        json!({"component": "default-scheduler"}),
        None,
    )];
    for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let cname = container["name"].as_str().unwrap_or("");
        let image = container["image"].as_str().unwrap_or("");
        let path = Some(format!("spec.containers{{{cname}}}"));
        let kubelet = json!({"component": "kubelet", "host": node});
        events.push((
            "Pulled".into(),
            format!("Container image \"{image}\" already present on machine"),
            kubelet.clone(),
            path.clone(),
        ));
        events.push((
            "Created".into(),
            format!("Created container {cname}"),
            kubelet.clone(),
            path.clone(),
        ));
        events.push((
            "Started".into(),
            format!("Started container {cname}"),
            kubelet,
            path,
        ));
    }
    // Names sort in the order the events happened, as the real ones (hex nanoseconds) do.
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    for (i, (reason, message, source, field_path)) in events.into_iter().enumerate() {
        let name = format!("{pod_name}.{:016x}", base + i as u64);
        let mut involved = json!({
            "kind": "Pod", "namespace": ns, "name": pod_name, "uid": meta["uid"],
            "apiVersion": "v1", "resourceVersion": meta["resourceVersion"],
        });
        if let Some(path) = field_path {
            involved["fieldPath"] = json!(path);
        }
        let event = json!({
            "kind": "Event", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now},
            "involvedObject": involved,
            "reason": reason, "message": message, "source": source,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": "Normal",
            "eventTime": null, "reportingComponent": "", "reportingInstance": "",
        });
        let _ = member
            .store
            .mutate::<()>("events", ns, &name, |_| Ok(Mutation::Put(event)));
    }
}

fn node_ip(member: &Member, node: &str) -> String {
    let index = member
        .node_names
        .iter()
        .position(|n| n == node)
        .unwrap_or(0);
    format!("10.0.0.{}", index + 10)
}

/// A Ready node's status.
pub fn node_status(now: &str, ip: &str) -> Value {
    let machine_id = uuid::Uuid::new_v4().simple().to_string();
    json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": ip}],
        // Every NodeSystemInfo field: clients with strict models (the Python client) require them.
        "nodeInfo": {
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": machine_id,
            "kernelVersion": "6.0.0-sim",
            "osImage": "fleetgate simulated node",
            "containerRuntimeVersion": "sim://1.0",
            "kubeletVersion": "v1.24.0+fleetgate-sim",
            "kubeProxyVersion": "v1.24.0+fleetgate-sim",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
    })
}

/// A deployment whose replicas are all ready (the sim has no ReplicaSets).
fn deployment_status(object: &mut Value) {
    let replicas = object["spec"]["replicas"].as_i64().unwrap_or(1);
    if object["spec"]["replicas"].is_null() {
        object["spec"]["replicas"] = json!(1);
    }
    let generation = object["metadata"]["generation"].clone();
    object["status"] = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."}],
    });
}

fn namespace_check(member: &Member, res: &ResourceInfo, ns: Option<&str>) -> Result<(), ApiError> {
    if let (true, Some(ns)) = (res.namespaced, ns) {
        match member.store.get("namespaces", "", ns) {
            None => return Err(ApiError::not_found("namespaces", ns)),
            Some(namespace) if namespace["status"]["phase"] == "Terminating" => {
                return Err(ApiError::status(
                    403,
                    "Forbidden",
                    format!("{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated", res.plural, ""),
                )
                .with_details(json!({"kind": res.plural, "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]})));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Stores a new object built from `object` (create, and apply-patch / PUT that create).
fn insert_new(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    mut object: Value,
) -> Result<Response<SimBody>, ApiError> {
    let member = info.member;
    if res.namespaced && ns.is_none() {
        return Err(ApiError::resource_not_found());
    }
    if let (Some(url_ns), Some(body_ns)) = (ns, object["metadata"]["namespace"].as_str()) {
        if !body_ns.is_empty() && body_ns != url_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    normalize(res, ns, &mut object);
    let meta = &mut object["metadata"];
    if meta["name"].as_str().unwrap_or("").is_empty() {
        match meta["generateName"].as_str() {
            Some(prefix) if !prefix.is_empty() => meta["name"] = json!(format!("{prefix}{}", random_suffix())),
            _ => {
                return Err(ApiError::status(
                    422,
                    "Invalid",
                    format!("{} \"\" is invalid: metadata.name: Required value: name or generateName is required", res.kind),
                )
                .with_details(json!({"kind": res.kind, "causes": [{"reason": "FieldValueRequired", "message": "Required value: name or generateName is required", "field": "metadata.name"}]})))
            }
        }
    }
    validate(res, &object)?;
    if let Some(schema) = schema::lookup(&member.store, res) {
        schema::check(res, &schema, field_validation(info), &mut object)?;
    }
    namespace_check(member, res, ns)?;
    let meta = &mut object["metadata"];
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(now_rfc3339());
    if let Some(m) = meta.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("deletionTimestamp");
    }
    if res.has_generation {
        object["metadata"]["generation"] = json!(1);
    }
    apply_create_defaults(member, res, &mut object);
    let name = store::meta_str(&object, "name");
    if info.query.get("dryRun") == Some("All") {
        return Ok(respond_object(
            info,
            res,
            StatusCode::CREATED,
            &Arc::new(object),
        ));
    }
    let stored = member
        .store
        .mutate(res.store_key(), ns.unwrap_or(""), &name, |current| {
            if current.is_some() {
                return Err(ApiError::already_exists(res.group, res.plural, &name));
            }
            Ok(Mutation::Put(object))
        })?
        .map(|(_, o)| o)
        .ok_or_else(|| ApiError::already_exists(res.group, res.plural, &name))?;
    if res.plural == "namespaces" {
        crate::sim::load::publish_root_ca(member, &name);
    }
    if res.plural == "pods" {
        record_pod_start_events(member, &stored);
    }
    Ok(respond_object(info, res, StatusCode::CREATED, &stored))
}

/// How unknown fields of a custom resource are treated (`?fieldValidation=`).
fn field_validation(info: &RequestInfo<'_>) -> schema::FieldValidation {
    schema::FieldValidation::from_query(info.query.get("fieldValidation"))
}

/// POST to a collection.
pub fn create(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let object = parse_object_body(res, content_type, body)?;
    insert_new(info, res, ns, object)
}

/// Carries over what a client may not change on update: uid, creation time, status (when the
/// resource has a status subresource), generation (bumped when the spec changed).
fn carry_over(res: &ResourceInfo, current: &Value, next: &mut Value, status_only: bool) {
    if status_only {
        let status = next["status"].clone();
        *next = current.clone();
        next["status"] = status;
        return;
    }
    for key in ["uid", "creationTimestamp"] {
        next["metadata"][key] = current["metadata"][key].clone();
    }
    if res.has_status_subresource() {
        next["status"] = current["status"].clone();
    }
    if res.has_generation {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = current["spec"] != next["spec"];
        next["metadata"]["generation"] = json!(if changed { generation + 1 } else { generation });
        if res.plural == "deployments" {
            deployment_status(next);
        }
    }
    if res.plural == "namespaces" {
        next["metadata"]["labels"]["kubernetes.io/metadata.name"] =
            current["metadata"]["name"].clone();
    }
}

/// PUT.
#[allow(clippy::too_many_arguments)] // the request's parts, kept apart so handlers stay sync
pub fn update(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let mut object = parse_object_body(res, content_type, body)?;
    let body_name = store::meta_str(&object, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(url_ns), Some(body_ns)) = (ns, object["metadata"]["namespace"].as_str()) {
        if !body_ns.is_empty() && body_ns != url_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    object["metadata"]["name"] = json!(name);
    normalize(res, ns, &mut object);
    let wanted_rv = object["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    let wanted_uid = object["metadata"]["uid"].as_str().map(str::to_string);
    let dry_run = info.query.get("dryRun") == Some("All");
    let mut dry_result = None;
    let schema = schema::lookup(&info.member.store, res);
    let result = info.member.store.mutate(res.store_key(), ns.unwrap_or(""), name, |current| {
        let Some(current) = current else {
            if wanted_uid.is_some() {
                return Err(ApiError::status(
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {} {name:?}: StorageError: invalid object, Code: 4, Key: /registry/{}/{}/{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {}, UID in object meta: ", res.plural, res.plural, ns.unwrap_or(""), wanted_uid.as_deref().unwrap_or("")),
                ));
            }
            return Err(ApiError::grouped_not_found(res.group, res.plural, name));
        };
        let current_rv = current["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if wanted_rv.as_deref().is_some_and(|rv| !rv.is_empty() && rv != current_rv) {
            return Err(ApiError::conflict(res.group, res.plural, name));
        }
        if wanted_uid.as_deref().is_some_and(|uid| Some(uid) != current["metadata"]["uid"].as_str()) {
            return Err(ApiError::status(409, "Conflict", format!("Precondition failed: UID in precondition: {}, UID in object meta: {}", wanted_uid.as_deref().unwrap_or(""), current["metadata"]["uid"].as_str().unwrap_or(""))));
        }
        let mut next = object;
        carry_over(res, current, &mut next, sub == Some("status"));
        validate(res, &next)?;
        if let Some(schema) = &schema {
            schema::check(res, schema, field_validation(info), &mut next)?;
        }
        if dry_run {
            dry_result = Some(next);
            return Ok(Mutation::Nothing);
        }
        Ok(Mutation::Put(next))
    })?;
    let stored = match (result, dry_result) {
        (Some((_, stored)), _) => stored,
        (None, Some(dry)) => Arc::new(dry),
        (None, None) => return Err(ApiError::grouped_not_found(res.group, res.plural, name)),
    };
    Ok(respond_object(info, res, StatusCode::OK, &stored))
}

/// PATCH.
#[allow(clippy::too_many_arguments)] // the request's parts, kept apart so handlers stay sync
pub fn patch(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let patch_type = content_type
        .and_then(PatchType::from_content_type)
        .ok_or_else(ApiError::unsupported_media_type_patch)?;
    if patch_type == PatchType::Apply && info.query.get("fieldManager").unwrap_or("").is_empty() {
        return Err(ApiError::status(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        )
        .with_details(json!({"group":"meta.k8s.io","kind":"PatchOptions","causes":[{"reason":"FieldValueRequired","message":"Required value: is required for apply patch","field":"fieldManager"}]})));
    }
    let dry_run = info.query.get("dryRun") == Some("All");
    let mut create_instead: Option<Value> = None;
    let mut dry_result = None;
    let schema = schema::lookup(&info.member.store, res);
    let result = info
        .member
        .store
        .mutate(res.store_key(), ns.unwrap_or(""), name, |current| {
            let Some(current) = current else {
                if patch_type == PatchType::Apply {
                    let applied = patch::parse_apply_body(body).map_err(patch_error)?;
                    create_instead = Some(applied);
                    return Ok(Mutation::Nothing);
                }
                return Err(ApiError::grouped_not_found(res.group, res.plural, name));
            };
            let mut next = patch::apply_patch(patch_type, current, body).map_err(patch_error)?;
            if next["metadata"]["name"].as_str() != Some(name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    next["metadata"]["name"].as_str().unwrap_or("")
                )));
            }
            check_kind(res, &next)?;
            let current_rv = current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("");
            if next["metadata"]["resourceVersion"]
                .as_str()
                .is_some_and(|rv| !rv.is_empty() && rv != current_rv)
            {
                return Err(ApiError::conflict(res.group, res.plural, name));
            }
            normalize(res, ns, &mut next);
            carry_over(res, current, &mut next, sub == Some("status"));
            if sub == Some("status") {
                // carry_over kept everything but status; take the patched status.
                let patched = patch::apply_patch(patch_type, current, body).map_err(patch_error)?;
                next["status"] = patched["status"].clone();
            }
            validate(res, &next)?;
            if let Some(schema) = &schema {
                schema::check(res, schema, field_validation(info), &mut next)?;
            }
            if dry_run {
                dry_result = Some(next);
                return Ok(Mutation::Nothing);
            }
            Ok(Mutation::Put(next))
        })?;
    if let Some(mut applied) = create_instead {
        if !applied.is_object() {
            return Err(ApiError::bad_request(
                "the applied configuration is not an object",
            ));
        }
        check_kind(res, &applied)?;
        applied["metadata"]["name"] = json!(name);
        return insert_new(info, res, ns, applied);
    }
    let stored = match (result, dry_result) {
        (Some((_, stored)), _) => stored,
        (None, Some(dry)) => Arc::new(dry),
        (None, None) => return Err(ApiError::grouped_not_found(res.group, res.plural, name)),
    };
    Ok(respond_object(info, res, StatusCode::OK, &stored))
}

fn patch_error(error: PatchError) -> ApiError {
    match error {
        PatchError::Malformed(message) => ApiError::bad_request(message),
        PatchError::Failed(_) => {
            ApiError::invalid("the server rejected our request due to an error in our request")
        }
    }
}

/// DELETE of one object.
pub fn delete(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    if res.plural == "namespaces" && PROTECTED_NAMESPACES.contains(&name) {
        return Err(ApiError::status(
            403,
            "Forbidden",
            format!("namespaces {name:?} is forbidden: this namespace may not be deleted"),
        )
        .with_details(json!({"name": name, "kind": "namespaces"})));
    }
    let dry_run = info.query.get("dryRun") == Some("All")
        || options["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    let foreground = options["propagationPolicy"] == "Foreground";
    let preconditions = options["preconditions"].clone();
    let mut dry_result = None;
    let result = info.member.store.mutate(res.store_key(), ns.unwrap_or(""), name, |current| {
        let Some(current) = current else {
            return Err(ApiError::grouped_not_found(res.group, res.plural, name));
        };
        if let Some(uid) = preconditions["uid"].as_str() {
            if Some(uid) != current["metadata"]["uid"].as_str() {
                return Err(ApiError::status(409, "Conflict", format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", current["metadata"]["uid"].as_str().unwrap_or(""))));
            }
        }
        if let Some(rv) = preconditions["resourceVersion"].as_str() {
            if Some(rv) != current["metadata"]["resourceVersion"].as_str() {
                return Err(ApiError::conflict(res.group, res.plural, name));
            }
        }
        let mut last = current.as_ref().clone();
        last["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
        last["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if foreground {
            last["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
        }
        if res.plural == "namespaces" {
            last["status"]["phase"] = json!("Terminating");
        }
        if dry_run {
            dry_result = Some(last);
            return Ok(Mutation::Nothing);
        }
        Ok(Mutation::Delete(last))
    })?;
    let deleted = match (result, dry_result) {
        (Some((_, deleted)), _) => deleted,
        (None, Some(dry)) => Arc::new(dry),
        (None, None) => return Err(ApiError::grouped_not_found(res.group, res.plural, name)),
    };
    if res.plural == "namespaces" && !dry_run {
        delete_namespace_contents(info.member, name);
    }
    // Objects with graceful deletion or a status answer with the object; others with a Status.
    if foreground || matches!(res.plural, "pods" | "namespaces") {
        return Ok(respond_object(info, res, StatusCode::OK, &deleted));
    }
    let mut details = json!({"name": name, "kind": res.plural, "uid": deleted["metadata"]["uid"]});
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    Ok(json_response(
        StatusCode::OK,
        &success_status(details),
        &info.ctx,
    ))
}

/// Removes every namespaced object in namespace `ns` (the namespace controller's job).
fn delete_namespace_contents(member: &Member, ns: &str) {
    for res in member.registry.all().into_iter().filter(|r| r.namespaced) {
        let page = member
            .store
            .list(res.store_key(), Some(ns), None, None, |_| true);
        for object in page.items {
            let name = store::meta_str(&object, "name");
            let _ = member
                .store
                .mutate::<()>(res.store_key(), ns, &name, |current| {
                    Ok(match current {
                        Some(c) => Mutation::Delete(c.as_ref().clone()),
                        None => Mutation::Nothing,
                    })
                });
        }
    }
}

/// DELETE of a collection: deletes what the selectors match and returns them as a List.
pub fn delete_collection(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    _body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    if res.plural == "namespaces" {
        return Err(ApiError::method_not_allowed());
    }
    let selectors = Selectors::parse(info, res)?;
    let page = info
        .member
        .store
        .list(res.store_key(), ns, None, None, |o| selectors.matches(o));
    let mut deleted = Vec::new();
    for object in page.items {
        let name = store::meta_str(&object, "name");
        let obj_ns = store::meta_str(&object, "namespace");
        if let Ok(Some((_, last))) =
            info.member
                .store
                .mutate::<()>(res.store_key(), &obj_ns, &name, |current| {
                    Ok(match current {
                        Some(c) => Mutation::Delete(c.as_ref().clone()),
                        None => Mutation::Nothing,
                    })
                })
        {
            deleted.push(last);
        }
    }
    let body = ListBody {
        kind: format!("{}List", res.kind),
        api_version: res.api_version(),
        metadata: json!({"resourceVersion": info.member.store.current_rv().to_string()}),
        items: ListItems(&deleted),
    };
    Ok(json_response(StatusCode::OK, &body, &info.ctx))
}

/// The `autoscaling/v1` Scale of a deployment.
fn scale_of(object: &Value) -> Value {
    let meta = &object["metadata"];
    let selector = selectors::match_labels_text(&object["spec"]["selector"]["matchLabels"]);
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": object["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": object["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

/// GET `deployments/{name}/scale`.
pub fn respond_scale(info: &RequestInfo<'_>, object: &Value) -> Response<SimBody> {
    json_response(StatusCode::OK, &scale_of(object), &info.ctx)
}

/// PUT or PATCH `deployments/{name}/scale` (what `kubectl scale` sends): sets spec.replicas;
/// the sim's controller makes every replica ready at once.
#[allow(clippy::too_many_arguments)] // the request's parts, kept apart so handlers stay sync
pub fn change_scale(
    info: &RequestInfo<'_>,
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    verb: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let patch_type = if verb == "patch" {
        Some(
            content_type
                .and_then(PatchType::from_content_type)
                .ok_or_else(ApiError::unsupported_media_type_patch)?,
        )
    } else {
        None
    };
    let result = info
        .member
        .store
        .mutate(res.store_key(), ns.unwrap_or(""), name, |current| {
            let Some(current) = current else {
                return Err(ApiError::grouped_not_found(res.group, res.plural, name));
            };
            let scale = scale_of(current);
            let next_scale = match patch_type {
                Some(kind) => patch::apply_patch(kind, &scale, body).map_err(patch_error)?,
                None => serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding Scale: {e}")))?,
            };
            let replicas = next_scale["spec"]["replicas"]
                .as_i64()
                .filter(|r| *r >= 0)
                .ok_or_else(|| ApiError::invalid("spec.replicas must be a non-negative integer"))?;
            let mut next = current.as_ref().clone();
            next["spec"]["replicas"] = json!(replicas);
            let generation = next["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(generation + 1);
            deployment_status(&mut next);
            Ok(Mutation::Put(next))
        })?;
    let (_, stored) =
        result.ok_or_else(|| ApiError::grouped_not_found(res.group, res.plural, name))?;
    Ok(json_response(StatusCode::OK, &scale_of(&stored), &info.ctx))
}
