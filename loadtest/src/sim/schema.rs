//! Custom resources checked against their CRD's structural schema, as kube-apiserver does with
//! `apiextensions.k8s.io/v1` CRDs: once a CRD named `<plural>.<group>` is stored, every object of
//! that resource written to the member (create, update, patch, apply) is
//! - pruned: fields the schema does not declare are dropped (kept under
//!   `x-kubernetes-preserve-unknown-fields: true`), and so are `null`s where the schema is not
//!   `nullable`; with `fieldValidation=Strict` (what kubectl sends by default) an unknown field is
//!   refused instead, with the apiserver's 400 `strict decoding error: unknown field "spec.x"`;
//! - defaulted: an absent property with a `default` gets it;
//! - validated: `type`, `required`, `enum`, `minimum`/`maximum`, `minLength`/`maxLength`,
//!   `minItems`/`maxItems`, map values (`additionalProperties`) and list items; what fails is the
//!   apiserver's 422 `Invalid` Status with one cause per field (`spec.workers: Invalid value:
//!   "string": spec.workers in body must be of type integer: "string"`).
//!
//! `apiVersion`, `kind` and `metadata` are the apiserver's own and are not checked here. Without a
//! stored CRD (the sim's built-in fleetgate.io kinds before `kubectl apply -f deploy/...`) nothing
//! is checked, as before.
//!
//! Pure (no store, no network): the caller looks the schema up before taking the store's write
//! lock (`lookup`) and calls `check` on the object it is about to store. Called by `objects`.

use serde_json::{json, Map, Value};

use crate::sim::resources::ResourceInfo;
use crate::sim::status::ApiError;
use crate::sim::store::Store;

/// How unknown fields are treated (`?fieldValidation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Refused with a 400 (kubectl's default since 1.27).
    Strict,
    /// Dropped (the apiserver also warns; the sim does not).
    Warn,
    /// Dropped silently (the default of clients that do not say).
    Ignore,
}

impl FieldValidation {
    pub fn from_query(value: Option<&str>) -> Self {
        match value {
            Some("Strict") => FieldValidation::Strict,
            Some("Warn") => FieldValidation::Warn,
            _ => FieldValidation::Ignore,
        }
    }
}

/// The `openAPIV3Schema` of `res`'s version, when a CRD for it is stored.
pub fn lookup(store: &Store, res: &ResourceInfo) -> Option<Value> {
    if res.group.is_empty() {
        return None;
    }
    let crd = store.get(
        "customresourcedefinitions",
        "",
        &format!("{}.{}", res.plural, res.group),
    )?;
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(res.version))
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .filter(Value::is_object)
}

/// One failed check: the field, the message after it, the Status cause's reason.
struct Cause {
    field: String,
    message: String,
    reason: &'static str,
}

#[derive(Default)]
struct Walk {
    unknown: Vec<String>,
    causes: Vec<Cause>,
}

/// Prunes, defaults and validates `object` (the whole custom resource) against `schema`.
pub fn check(
    res: &ResourceInfo,
    schema: &Value,
    validation: FieldValidation,
    object: &mut Value,
) -> Result<(), ApiError> {
    let Some(map) = object.as_object_mut() else {
        return Ok(());
    };
    let mut walk = Walk::default();
    let properties = schema["properties"].as_object();
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    // The root: the apiserver owns apiVersion, kind and metadata.
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match properties.and_then(|p| p.get(&key)) {
            Some(sub) => {
                if map[&key].is_null() && sub["nullable"] != true {
                    map.remove(&key);
                    continue;
                }
                if let Some(value) = map.get_mut(&key) {
                    walk.value(sub, value, &key);
                }
            }
            None if preserve => {}
            None => {
                walk.unknown.push(key.clone());
                map.remove(&key);
            }
        }
    }
    walk.defaults_and_required(schema, map, "");
    if validation == FieldValidation::Strict && !walk.unknown.is_empty() {
        let fields: Vec<String> = walk
            .unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            fields.join(", "),
            kind = res.kind,
            version = res.version,
        )));
    }
    if walk.causes.is_empty() {
        return Ok(());
    }
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    let lines: Vec<String> = walk
        .causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let message = if lines.len() == 1 {
        lines[0].clone()
    } else {
        format!("[{}]", lines.join(", "))
    };
    let causes: Vec<Value> = walk
        .causes
        .iter()
        .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
        .collect();
    Err(ApiError::status(
        422,
        "Invalid",
        format!("{}.{} {name:?} is invalid: {message}", res.kind, res.group),
    )
    .with_details(json!({"name": name, "group": res.group, "kind": res.kind, "causes": causes})))
}

/// The JSON type name the apiserver's messages use.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(wanted: &str, value: &Value) -> bool {
    match wanted {
        "number" => value.is_number(),
        "" => true,
        other => type_of(value) == other,
    }
}

/// How a value prints in an `Invalid value:` message (Go's `%#v`-like quoting of strings).
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl Walk {
    fn invalid(&mut self, path: &str, message: String) {
        self.causes.push(Cause {
            field: path.to_string(),
            message,
            reason: "FieldValueInvalid",
        });
    }

    /// Checks `value` at `path` against `schema`, pruning and defaulting beneath it.
    fn value(&mut self, schema: &Value, value: &mut Value, path: &str) {
        let wanted = schema["type"].as_str().unwrap_or("");
        if value.is_null() {
            if schema["nullable"] != true && !wanted.is_empty() {
                self.invalid(
                    path,
                    format!("Invalid value: \"null\": {path} in body must be of type {wanted}: \"null\""),
                );
            }
            return;
        }
        if !type_matches(wanted, value) {
            let found = type_of(value);
            self.invalid(
                path,
                format!(
                    "Invalid value: {found:?}: {path} in body must be of type {wanted}: {found:?}"
                ),
            );
            return;
        }
        if let Some(allowed) = schema["enum"].as_array() {
            if !allowed.contains(value) {
                let list: Vec<String> = allowed.iter().map(shown).collect();
                self.causes.push(Cause {
                    field: path.to_string(),
                    message: format!(
                        "Unsupported value: {}: supported values: {}",
                        shown(value),
                        list.join(", ")
                    ),
                    reason: "FieldValueNotSupported",
                });
            }
        }
        if let Some(n) = value.as_f64() {
            self.bounds(schema, n, value, path);
        }
        match value {
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if schema["minLength"].as_u64().is_some_and(|min| len < min) {
                    let shown = format!("{s:?}");
                    self.invalid(path, format!("Invalid value: {shown}: {path} in body should be at least {} chars long", schema["minLength"]));
                }
                if schema["maxLength"].as_u64().is_some_and(|max| len > max) {
                    self.causes.push(Cause {
                        field: path.to_string(),
                        message: format!(
                            "Too long: may not be longer than {}",
                            schema["maxLength"]
                        ),
                        reason: "FieldValueTooLong",
                    });
                }
            }
            Value::Array(items) => {
                let len = items.len() as u64;
                if schema["minItems"].as_u64().is_some_and(|min| len < min) {
                    self.invalid(
                        path,
                        format!(
                            "Invalid value: {len}: {path} in body should have at least {} items",
                            schema["minItems"]
                        ),
                    );
                }
                if schema["maxItems"].as_u64().is_some_and(|max| len > max) {
                    self.causes.push(Cause {
                        field: path.to_string(),
                        message: format!(
                            "Too many: {len}: must have at most {} items",
                            schema["maxItems"]
                        ),
                        reason: "FieldValueTooMany",
                    });
                }
                if schema["items"].is_object() {
                    for (i, item) in items.iter_mut().enumerate() {
                        self.value(&schema["items"], item, &format!("{path}[{i}]"));
                    }
                }
            }
            Value::Object(map) => self.object(schema, map, path),
            _ => {}
        }
    }

    fn bounds(&mut self, schema: &Value, n: f64, value: &Value, path: &str) {
        if let Some(min) = schema["minimum"].as_f64() {
            let exclusive = schema["exclusiveMinimum"] == true;
            if n < min || (exclusive && n == min) {
                let than = if exclusive {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                self.invalid(
                    path,
                    format!(
                        "Invalid value: {value}: {path} in body should be {than} {}",
                        schema["minimum"]
                    ),
                );
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            let exclusive = schema["exclusiveMaximum"] == true;
            if n > max || (exclusive && n == max) {
                let than = if exclusive {
                    "less than"
                } else {
                    "less than or equal to"
                };
                self.invalid(
                    path,
                    format!(
                        "Invalid value: {value}: {path} in body should be {than} {}",
                        schema["maximum"]
                    ),
                );
            }
        }
    }

    fn object(&mut self, schema: &Value, map: &mut Map<String, Value>, path: &str) {
        let properties = schema["properties"].as_object();
        let additional = &schema["additionalProperties"];
        let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            let child = format!("{path}.{key}");
            let sub = properties
                .and_then(|p| p.get(&key))
                .or(additional.is_object().then_some(additional));
            match sub {
                Some(sub) => {
                    if map[&key].is_null() && sub["nullable"] != true {
                        map.remove(&key);
                        continue;
                    }
                    if let Some(value) = map.get_mut(&key) {
                        self.value(sub, value, &child);
                    }
                }
                // `additionalProperties: true`, or no properties at all with preserve: keep.
                None if preserve || *additional == true => {}
                // An object schema with neither properties nor additionalProperties keeps nothing,
                // as a structural schema says.
                None => {
                    self.unknown.push(child);
                    map.remove(&key);
                }
            }
        }
        self.defaults_and_required(schema, map, path);
    }

    fn defaults_and_required(&mut self, schema: &Value, map: &mut Map<String, Value>, path: &str) {
        if let Some(properties) = schema["properties"].as_object() {
            for (key, sub) in properties {
                if !map.contains_key(key) {
                    if let Some(default) = sub.get("default") {
                        map.insert(key.clone(), default.clone());
                    }
                }
            }
        }
        for key in schema["required"].as_array().into_iter().flatten() {
            let Some(key) = key.as_str() else { continue };
            if !map.contains_key(key) {
                let field = if path.is_empty() {
                    key.to_string()
                } else {
                    format!("{path}.{key}")
                };
                self.causes.push(Cause {
                    field,
                    message: "Required value".into(),
                    reason: "FieldValueRequired",
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster_info() -> &'static ResourceInfo {
        crate::sim::resources::find("fleetgate.io", "v1alpha1", "clusters").unwrap()
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["server"],
                    "properties": {
                        "server": {"type": "string"},
                        "workers": {"type": "integer", "minimum": 0, "nullable": true},
                        "connectMode": {"type": "string", "enum": ["Direct", "Tunnel"], "default": "Direct"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "names": {"type": "array", "items": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }
            }
        })
    }

    fn run(object: &mut Value, validation: FieldValidation) -> Result<(), ApiError> {
        check(cluster_info(), &schema(), validation, object)
    }

    fn message(error: ApiError) -> String {
        format!("{error:?}")
    }

    #[test]
    fn prunes_unknown_fields_and_fills_defaults() {
        let mut object = json!({"apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "a", "labels": {"x": "y"}},
            "spec": {"server": "https://x", "mode": "Tunnel", "free": {"any": {"thing": 1}}, "workers": null},
            "extra": 1});
        run(&mut object, FieldValidation::Ignore).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
                "metadata": {"name": "a", "labels": {"x": "y"}},
                "spec": {"server": "https://x", "connectMode": "Direct", "free": {"any": {"thing": 1}}, "workers": null}})
        );
    }

    #[test]
    fn strict_refuses_unknown_fields() {
        let mut object =
            json!({"metadata": {"name": "a"}, "spec": {"server": "s", "mode": "Tunnel"}});
        let error = message(run(&mut object, FieldValidation::Strict).unwrap_err());
        assert!(
            error.contains(r#"strict decoding error: unknown field \"spec.mode\""#),
            "{error}"
        );
    }

    #[test]
    fn wrong_types_enums_bounds_and_required_fields_are_invalid() {
        let mut object = json!({"metadata": {"name": "a"}, "spec": {
            "workers": "two", "connectMode": "Push", "labels": {"a": 1}, "names": ["ok", 2]}});
        let error = message(run(&mut object, FieldValidation::Ignore).unwrap_err());
        for expected in [
            "422",
            r#"spec.workers: Invalid value: \"string\": spec.workers in body must be of type integer: \"string\""#,
            r#"spec.connectMode: Unsupported value: \"Push\": supported values: \"Direct\", \"Tunnel\""#,
            "spec.labels.a: Invalid value",
            "spec.names[1]: Invalid value",
            "spec.server: Required value",
        ] {
            assert!(error.contains(expected), "{expected} not in {error}");
        }
        let mut negative =
            json!({"metadata": {"name": "a"}, "spec": {"server": "s", "workers": -1}});
        let error = message(run(&mut negative, FieldValidation::Ignore).unwrap_err());
        assert!(
            error.contains("should be greater than or equal to 0"),
            "{error}"
        );
    }
}
