//! The four PATCH types of the Kubernetes API applied to a JSON object: JSON patch (RFC 6902),
//! JSON merge patch (RFC 7396), strategic merge patch (maps merged like merge patch, lists of
//! named items merged by their key, `$patch` / `$setElementOrder` / `$retainKeys` directives
//! honoured or dropped), and server-side apply (create or merge; no field ownership).
//!
//! Pure functions; never touches the store. Called by the router's PATCH handler.

use serde_json::{Map, Value};

/// A PATCH body's type, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The body does not parse.
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation failed (a `test` that did not hold, a missing path).
    #[error("{0}")]
    Failed(String),
}

/// Applies `patch` (the raw body) of type `kind` to `target`.
pub fn apply_patch(kind: PatchType, target: &Value, patch: &[u8]) -> Result<Value, PatchError> {
    match kind {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| PatchError::Malformed(format!("error decoding patch: {e}")))?;
            let mut out = target.clone();
            json_patch::patch(&mut out, &ops).map_err(|e| PatchError::Failed(e.to_string()))?;
            Ok(out)
        }
        PatchType::Merge => {
            let patch: Value = parse_json(patch)?;
            let mut out = target.clone();
            json_patch::merge(&mut out, &patch);
            Ok(out)
        }
        PatchType::Strategic => {
            let patch: Value = parse_json(patch)?;
            let mut out = target.clone();
            strategic_merge(&mut out, &patch);
            Ok(out)
        }
        PatchType::Apply => {
            let patch = parse_apply_body(patch)?;
            let mut out = target.clone();
            apply_merge(&mut out, &patch);
            Ok(out)
        }
    }
}

fn parse_json(body: &[u8]) -> Result<Value, PatchError> {
    serde_json::from_slice(body)
        .map_err(|e| PatchError::Malformed(format!("error decoding patch: {e}")))
}

/// Parses a server-side apply body (YAML, of which JSON is a subset).
pub fn parse_apply_body(body: &[u8]) -> Result<Value, PatchError> {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        return Ok(value);
    }
    serde_yaml::from_slice::<Value>(body)
        .map_err(|e| PatchError::Malformed(format!("error decoding YAML: {e}")))
}

/// Server-side apply without field ownership: the applied configuration is merged into the
/// live object (maps recursively, named lists by key, other lists replaced). Nulls are ignored.
fn apply_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (key, value) in p {
                if value.is_null() {
                    continue;
                }
                match t.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        apply_merge(existing, value)
                    }
                    Some(existing) if existing.is_array() && value.is_array() => {
                        if let Some(merged) = merge_keyed_lists(existing, value, apply_merge) {
                            *existing = merged;
                        } else {
                            *existing = value.clone();
                        }
                    }
                    _ => {
                        t.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The key a list of objects is merged by, if every element of both lists has it.
fn merge_key(a: &[Value], b: &[Value]) -> Option<&'static str> {
    ["name", "containerPort", "port", "mountPath", "ip", "type"]
        .into_iter()
        .find(|key| {
            !b.is_empty()
                && a.iter()
                    .chain(b.iter())
                    .all(|item| item.get(*key).is_some())
        })
}

fn merge_keyed_lists(
    existing: &Value,
    patch: &Value,
    merge_item: fn(&mut Value, &Value),
) -> Option<Value> {
    let (Value::Array(existing), Value::Array(patch)) = (existing, patch) else {
        return None;
    };
    let key = merge_key(existing, patch)?;
    let mut out: Vec<Value> = existing.clone();
    for item in patch {
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        let position = out.iter().position(|e| e.get(key) == item.get(key));
        match (position, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => merge_item(&mut out[i], item),
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                merge_item(&mut fresh, item);
                out.push(fresh);
            }
        }
    }
    Some(Value::Array(out))
}

/// Strategic merge patch, as far as the sim needs it: maps merge like RFC 7396 (null deletes),
/// lists of objects with a merge key merge item by item, other lists are replaced; `$patch:
/// replace|delete` on maps is honoured; ordering and retain-keys directives are dropped.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replacement = patch.clone();
            strip_directives(&mut replacement);
            *target = replacement;
            return;
        }
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (key, value) in p {
        if key.starts_with('$') {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(remove)) = (t.get_mut(field), value) {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if value.is_null() {
            t.remove(key);
            continue;
        }
        match t.get_mut(key) {
            Some(existing) if existing.is_object() && value.is_object() => {
                strategic_merge(existing, value);
                if existing.is_null() {
                    t.remove(key);
                }
            }
            Some(existing) if existing.is_array() && value.is_array() => {
                if let Some(merged) = merge_keyed_lists(existing, value, strategic_merge) {
                    *existing = merged;
                } else {
                    let mut replacement = value.clone();
                    strip_directives(&mut replacement);
                    *existing = replacement;
                }
            }
            _ => {
                let mut fresh = value.clone();
                strip_directives(&mut fresh);
                t.insert(key.clone(), fresh);
            }
        }
    }
}

fn strip_directives(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(strip_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_containers_by_name() {
        let pod = json!({"spec":{"containers":[{"name":"main","image":"a"},{"name":"side","image":"b"}]}});
        let patch = br#"{"spec":{"$setElementOrder/containers":[{"name":"main"}],"containers":[{"name":"main","image":"c"}]}}"#;
        let out = apply_patch(PatchType::Strategic, &pod, patch).unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "c");
        assert_eq!(out["spec"]["containers"][1]["image"], "b");
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn merge_null_removes_key() {
        let cm = json!({"metadata":{"annotations":{"note":"x"}},"data":{"a":"1"}});
        let out = apply_patch(
            PatchType::Merge,
            &cm,
            br#"{"metadata":{"annotations":{"note":null}}}"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn json_patch_test_failure_is_an_error() {
        let cm = json!({"data":{"k1":"v1"}});
        let err = apply_patch(
            PatchType::Json,
            &cm,
            br#"[{"op":"test","path":"/data/k1","value":"WRONG"}]"#,
        );
        assert!(matches!(err, Err(PatchError::Failed(_))));
    }
}
