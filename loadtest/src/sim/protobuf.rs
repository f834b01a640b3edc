//! Decoding request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`).
//!
//! kubectl's generators (`kubectl create configmap|secret|namespace|serviceaccount|service|deployment`,
//! `kubectl run`) send built-in objects as protobuf, not JSON, so a member that only read JSON would
//! answer them 415. A real apiserver has the generated schema of every type; the simulated member
//! carries the part of it that those commands fill in (the field numbers of `generated.proto` in
//! k8s.io/api and apimachinery) and turns the message into the JSON object the store keeps.
//! Fields it does not know are skipped, as a protobuf reader must. Responses stay JSON: client-go
//! decodes by the response's Content-Type.
//!
//! Wire format: the 4-byte magic `k8s\0`, then a `runtime.Unknown` message
//! {1: TypeMeta {1: apiVersion, 2: kind}, 2: raw (the object's own message), 3: contentEncoding,
//! 4: contentType}.

use base64::Engine as _;
use serde_json::{Map, Value};

/// The media type of the Kubernetes protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// How one field's value is turned into JSON.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    /// `map<string,string>` (repeated entries {1: key, 2: value}).
    MapStr,
    /// `map<string,bytes>`.
    MapBytes,
    /// `intstr.IntOrString` {1: type, 2: intVal, 3: strVal}.
    IntOrString,
    /// `map<string,resource.Quantity>` (requests and limits; a Quantity is {1: string}).
    MapQuantity,
}

#[derive(Clone, Copy)]
struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
    repeated: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
    }
}

const fn rep(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: true,
    }
}

const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(5, "uid", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(11, "labels", Ty::MapStr),
    f(12, "annotations", Ty::MapStr),
    rep(14, "finalizers", Ty::Str),
];
const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapStr),
    f(3, "binaryData", Ty::MapBytes),
    f(4, "immutable", Ty::Bool),
];
const SECRET: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapBytes),
    f(3, "type", Ty::Str),
    f(4, "stringData", Ty::MapStr),
    f(5, "immutable", Ty::Bool),
];
const NAMESPACE_SPEC: &[Field] = &[rep(1, "finalizers", Ty::Str)];
const NAMESPACE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(NAMESPACE_SPEC)),
];
const SERVICE_ACCOUNT: &[Field] = &[f(1, "metadata", Ty::Msg(OBJECT_META))];
const SERVICE_PORT: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "protocol", Ty::Str),
    f(3, "port", Ty::Int),
    f(4, "targetPort", Ty::IntOrString),
    f(5, "nodePort", Ty::Int),
];
const SERVICE_SPEC: &[Field] = &[
    rep(1, "ports", Ty::Msg(SERVICE_PORT)),
    f(2, "selector", Ty::MapStr),
    f(3, "clusterIP", Ty::Str),
    f(4, "type", Ty::Str),
    f(11, "externalName", Ty::Str),
];
const SERVICE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(SERVICE_SPEC)),
];
const CONTAINER_PORT: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "hostPort", Ty::Int),
    f(3, "containerPort", Ty::Int),
    f(4, "protocol", Ty::Str),
];
const ENV_VAR: &[Field] = &[f(1, "name", Ty::Str), f(2, "value", Ty::Str)];
const RESOURCES: &[Field] = &[
    f(1, "limits", Ty::MapQuantity),
    f(2, "requests", Ty::MapQuantity),
];
const CONTAINER: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "image", Ty::Str),
    rep(3, "command", Ty::Str),
    rep(4, "args", Ty::Str),
    f(5, "workingDir", Ty::Str),
    rep(6, "ports", Ty::Msg(CONTAINER_PORT)),
    rep(7, "env", Ty::Msg(ENV_VAR)),
    f(8, "resources", Ty::Msg(RESOURCES)),
    f(13, "terminationMessagePath", Ty::Str),
    f(14, "imagePullPolicy", Ty::Str),
    f(16, "stdin", Ty::Bool),
    f(17, "stdinOnce", Ty::Bool),
    f(18, "tty", Ty::Bool),
    f(20, "terminationMessagePolicy", Ty::Str),
];
const POD_SPEC: &[Field] = &[
    rep(2, "containers", Ty::Msg(CONTAINER)),
    f(3, "restartPolicy", Ty::Str),
    f(4, "terminationGracePeriodSeconds", Ty::Int),
    f(6, "dnsPolicy", Ty::Str),
    f(7, "nodeSelector", Ty::MapStr),
    f(8, "serviceAccountName", Ty::Str),
    f(10, "nodeName", Ty::Str),
    f(14, "schedulerName", Ty::Str),
];
const POD: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(POD_SPEC)),
];
const POD_TEMPLATE_SPEC: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(POD_SPEC)),
];
const LABEL_SELECTOR_REQUIREMENT: &[Field] = &[
    f(1, "key", Ty::Str),
    f(2, "operator", Ty::Str),
    rep(3, "values", Ty::Str),
];
const LABEL_SELECTOR: &[Field] = &[
    f(1, "matchLabels", Ty::MapStr),
    rep(2, "matchExpressions", Ty::Msg(LABEL_SELECTOR_REQUIREMENT)),
];
const DEPLOYMENT_STRATEGY: &[Field] = &[f(1, "type", Ty::Str)];
const DEPLOYMENT_SPEC: &[Field] = &[
    f(1, "replicas", Ty::Int),
    f(2, "selector", Ty::Msg(LABEL_SELECTOR)),
    f(3, "template", Ty::Msg(POD_TEMPLATE_SPEC)),
    f(4, "strategy", Ty::Msg(DEPLOYMENT_STRATEGY)),
];
const DEPLOYMENT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(DEPLOYMENT_SPEC)),
];

const RESOURCE_ATTRIBUTES: &[Field] = &[
    f(1, "namespace", Ty::Str),
    f(2, "verb", Ty::Str),
    f(3, "group", Ty::Str),
    f(4, "version", Ty::Str),
    f(5, "resource", Ty::Str),
    f(6, "subresource", Ty::Str),
    f(7, "name", Ty::Str),
];
const NON_RESOURCE_ATTRIBUTES: &[Field] = &[f(1, "path", Ty::Str), f(2, "verb", Ty::Str)];
const SELF_SUBJECT_ACCESS_REVIEW_SPEC: &[Field] = &[
    f(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
    f(2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
];
/// What `kubectl auth can-i` sends.
const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(SELF_SUBJECT_ACCESS_REVIEW_SPEC)),
];

const SELF_SUBJECT_RULES_REVIEW_SPEC: &[Field] = &[f(1, "namespace", Ty::Str)];
/// What `kubectl auth can-i --list` sends.
const SELF_SUBJECT_RULES_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(SELF_SUBJECT_RULES_REVIEW_SPEC)),
];

/// The schema of each kind the simulated members read as protobuf.
fn schema(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Service") => SERVICE,
        ("v1", "Pod") => POD,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        _ => return None,
    })
}

/// Whether a Content-Type names the protobuf encoding.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case(MEDIA_TYPE)
}

/// Decodes a protobuf request body into the JSON object it stands for (with apiVersion and kind).
/// The error says what is wrong, for a 400 (or 415 for a kind the simulator cannot read).
pub fn decode(body: &[u8]) -> Result<Value, DecodeError> {
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| {
        DecodeError::Malformed("protobuf body does not start with the k8s magic".into())
    })?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for field in Reader(envelope) {
        match field.map_err(DecodeError::Malformed)? {
            (1, Wire::Len(type_meta)) => {
                for tm in Reader(type_meta) {
                    match tm.map_err(DecodeError::Malformed)? {
                        (1, Wire::Len(v)) => api_version = utf8(v)?,
                        (2, Wire::Len(v)) => kind = utf8(v)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Len(r)) => raw = Some(r),
            _ => {}
        }
    }
    let raw =
        raw.ok_or_else(|| DecodeError::Malformed("protobuf envelope without a raw object".into()))?;
    let fields = schema(&api_version, &kind)
        .ok_or_else(|| DecodeError::UnknownKind(format!("{api_version} {kind}")))?;
    let mut object = decode_message(raw, fields)?;
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(object))
}

/// Why a protobuf body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not valid protobuf, or not the Kubernetes envelope.
    Malformed(String),
    /// A kind whose schema the simulator does not carry.
    UnknownKind(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Malformed(m) => write!(f, "{m}"),
            DecodeError::UnknownKind(k) => write!(
                f,
                "the simulated member cannot read {k} as protobuf; send JSON"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

fn utf8(v: &[u8]) -> Result<String, DecodeError> {
    String::from_utf8(v.to_vec())
        .map_err(|_| DecodeError::Malformed("a string field is not UTF-8".into()))
}

fn decode_message(bytes: &[u8], fields: &[Field]) -> Result<Map<String, Value>, DecodeError> {
    let mut out = Map::new();
    for item in Reader(bytes) {
        let (num, wire) = item.map_err(DecodeError::Malformed)?;
        let Some(field) = fields.iter().find(|f| f.num == num) else {
            continue; // a field this schema does not carry: skipped, as protobuf readers do
        };
        let value = match (field.ty, wire) {
            (Ty::Str, Wire::Len(v)) => {
                let s = utf8(v)?;
                if s.is_empty() && !field.repeated {
                    continue; // gogo-protobuf writes empty non-pointer strings; JSON omits them
                }
                Value::String(s)
            }
            (Ty::Int, Wire::Varint(v)) => Value::from(v as i64),
            (Ty::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
            (Ty::Msg(inner), Wire::Len(v)) => Value::Object(decode_message(v, inner)?),
            (Ty::IntOrString, Wire::Len(v)) => int_or_string(v)?,
            (Ty::MapStr | Ty::MapBytes | Ty::MapQuantity, Wire::Len(entry)) => {
                let (key, val) = map_entry(entry, field.ty)?;
                let map = out
                    .entry(field.name)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = map {
                    m.insert(key, val);
                }
                continue;
            }
            _ => {
                return Err(DecodeError::Malformed(format!(
                    "field {} ({}) has an unexpected wire type",
                    field.num, field.name
                )))
            }
        };
        if field.repeated {
            let list = out
                .entry(field.name)
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(items) = list {
                items.push(value);
            }
        } else {
            out.insert(field.name.to_owned(), value);
        }
    }
    Ok(out)
}

fn map_entry(entry: &[u8], ty: Ty) -> Result<(String, Value), DecodeError> {
    let (mut key, mut value) = (String::new(), None);
    for item in Reader(entry) {
        match item.map_err(DecodeError::Malformed)? {
            (1, Wire::Len(k)) => key = utf8(k)?,
            (2, Wire::Len(v)) => {
                value = Some(match ty {
                    Ty::MapBytes => {
                        Value::String(base64::engine::general_purpose::STANDARD.encode(v))
                    }
                    Ty::MapQuantity => quantity(v)?,
                    _ => Value::String(utf8(v)?),
                })
            }
            _ => {}
        }
    }
    let value = value.unwrap_or_else(|| Value::String(String::new()));
    Ok((key, value))
}

fn int_or_string(v: &[u8]) -> Result<Value, DecodeError> {
    let (mut is_string, mut int_val, mut str_val) = (false, 0i64, String::new());
    for item in Reader(v) {
        match item.map_err(DecodeError::Malformed)? {
            (1, Wire::Varint(t)) => is_string = t == 1,
            (2, Wire::Varint(i)) => int_val = i as i32 as i64,
            (3, Wire::Len(s)) => str_val = utf8(s)?,
            _ => {}
        }
    }
    Ok(if is_string {
        Value::String(str_val)
    } else {
        Value::from(int_val)
    })
}

fn quantity(v: &[u8]) -> Result<Value, DecodeError> {
    for item in Reader(v) {
        if let (1, Wire::Len(s)) = item.map_err(DecodeError::Malformed)? {
            return Ok(Value::String(utf8(s)?));
        }
    }
    Ok(Value::String("0".into()))
}

/// One field's payload on the wire.
enum Wire<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Fixed,
}

/// Iterates over the (field number, payload) pairs of one message.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.0.split_first().ok_or("truncated varint")?;
            self.0 = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("length-delimited field runs past the end".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<(u64, Wire<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let item = (|| {
            let key = self.varint()?;
            let num = key >> 3;
            let wire = match key & 7 {
                0 => Wire::Varint(self.varint()?),
                1 => {
                    self.take(8)?;
                    Wire::Fixed
                }
                2 => {
                    let n = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
                    Wire::Len(self.take(n)?)
                }
                5 => {
                    self.take(4)?;
                    Wire::Fixed
                }
                w => return Err(format!("unsupported wire type {w}")),
            };
            Ok((num, wire))
        })();
        if item.is_err() {
            self.0 = &[]; // stop after the first error
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny protobuf writer for the tests, so the expected bytes are built field by field.
    fn len_field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = varint((num << 3) | 2);
        out.extend(varint(payload.len() as u64));
        out.extend_from_slice(payload);
        out
    }
    fn varint_field(num: u64, v: u64) -> Vec<u8> {
        let mut out = varint(num << 3);
        out.extend(varint(v));
        out
    }
    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }
    fn entry(num: u64, k: &str, v: &[u8]) -> Vec<u8> {
        len_field(num, &[len_field(1, k.as_bytes()), len_field(2, v)].concat())
    }
    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [
            len_field(1, api_version.as_bytes()),
            len_field(2, kind.as_bytes()),
        ]
        .concat();
        let unknown = [
            len_field(1, &type_meta),
            len_field(2, raw),
            len_field(3, b""),
            len_field(4, b""),
        ]
        .concat();
        [MAGIC.to_vec(), unknown].concat()
    }

    #[test]
    fn config_map_as_kubectl_create_sends_it() {
        // metadata {name: "hello", namespace: "", creationTimestamp: {}}; data {greeting: hi, a: b}
        let meta = [
            len_field(1, b"hello"),
            len_field(2, b""),
            len_field(3, b""),
            len_field(8, b""),
        ]
        .concat();
        let raw = [
            len_field(1, &meta),
            entry(2, "greeting", b"hi"),
            entry(2, "a", b"b"),
            entry(3, "bin", b"\x00\x01"),
        ]
        .concat();
        let v = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hello"},
                "data": {"greeting": "hi", "a": "b"}, "binaryData": {"bin": "AAE="}})
        );
    }

    #[test]
    fn deployment_with_nested_pod_template() {
        let labels = entry(11, "app", b"web");
        let meta = [len_field(1, b"web"), labels.clone()].concat();
        let container = [
            len_field(1, b"nginx"),
            len_field(2, b"nginx:1.27"),
            len_field(8, b""),
            len_field(6, &[varint_field(3, 80), len_field(4, b"TCP")].concat()),
        ]
        .concat();
        let pod_spec = [len_field(2, &container), len_field(3, b"Always")].concat();
        let template = [len_field(1, &labels), len_field(2, &pod_spec)].concat();
        let selector = entry(1, "app", b"web");
        let spec = [
            varint_field(1, 3),
            len_field(2, &selector),
            len_field(3, &template),
            len_field(4, b""),
        ]
        .concat();
        let raw = [len_field(1, &meta), len_field(2, &spec), len_field(3, b"")].concat();
        let v = decode(&envelope("apps/v1", "Deployment", &raw)).unwrap();
        assert_eq!(v["spec"]["replicas"], 3);
        assert_eq!(v["spec"]["selector"]["matchLabels"]["app"], "web");
        assert_eq!(v["spec"]["template"]["metadata"]["labels"]["app"], "web");
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "nginx:1.27");
        assert_eq!(c["ports"][0]["containerPort"], 80);
        assert_eq!(c["resources"], serde_json::json!({}));
    }

    #[test]
    fn service_target_port_int_or_string() {
        let port = [
            len_field(1, b"http"),
            varint_field(3, 80),
            len_field(4, &[varint_field(1, 0), varint_field(2, 8080)].concat()),
        ]
        .concat();
        let named = [
            varint_field(3, 81),
            len_field(4, &[varint_field(1, 1), len_field(3, b"web")].concat()),
        ]
        .concat();
        let spec = [
            len_field(1, &port),
            len_field(1, &named),
            len_field(4, b"ClusterIP"),
        ]
        .concat();
        let raw = [len_field(1, &len_field(1, b"svc")), len_field(2, &spec)].concat();
        let v = decode(&envelope("v1", "Service", &raw)).unwrap();
        assert_eq!(v["spec"]["ports"][0]["targetPort"], 8080);
        assert_eq!(v["spec"]["ports"][1]["targetPort"], "web");
        assert_eq!(v["spec"]["type"], "ClusterIP");
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(matches!(
            decode(b"{\"kind\":1}"),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode(b"k8s\0\x0a\xff"),
            Err(DecodeError::Malformed(_))
        ));
        let unknown = envelope("batch/v1", "Job", &len_field(1, &len_field(1, b"j")));
        assert!(matches!(decode(&unknown), Err(DecodeError::UnknownKind(_))));
        // Arbitrary bytes after the magic never panic.
        for seed in 0u64..2000 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let bytes: Vec<u8> = (0..(seed % 40))
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&[MAGIC, &bytes].concat());
        }
    }
}
