//! A field selector on any field applied to an object kept as its JSON bytes (a hub's event, a
//! cached LIST's item): only the fields the selector names are decoded, every other part of the
//! object is skipped as it is read, so a selector costs one pass over the bytes and a handful of
//! small values, never the whole object as a `serde_json::Value`.
//!
//! [`AnyFields`] is built once per client watch or LIST (`watch::shareable`) from the parsed
//! selector, the resource (a field the member serves reads as the member reads it:
//! [`Reading::Member`]) and the hub's form (a Table event's object is under `rows.0.object`).
//! Its [`AnyFields::matches`] is called per object by `watch::client` and `watch::list`.
//! Never panics on any bytes: unreadable JSON reads as an object without the fields.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::any_field::{AnyFieldSelector, Reading};
use super::member::{member_field, MemberField};

/// The keys a selector's fields walk, as a tree: what a read decodes of an object. A map, so
/// that a selector of thousands of fields costs each key read a lookup, not a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Wanted {
    children: BTreeMap<Box<str>, Wanted>,
}

impl Wanted {
    fn add<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) {
        let mut node = self;
        for key in keys {
            node = node.children.entry(key.into()).or_default();
        }
    }
}

/// Where a hub's objects are: the object itself, or a one-row Table's row object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Within {
    Object,
    TableRow,
}

const TABLE_ROW: [&str; 3] = ["rows", "0", "object"];

/// A field selector on any fields of one resource, ready to read objects' JSON bytes.
#[derive(Debug, Clone)]
pub struct AnyFields {
    selector: AnyFieldSelector,
    group: Box<str>,
    resource: Box<str>,
    within: Within,
    /// Every JSON path the selector reads, under `within`'s prefix.
    wanted: Wanted,
    /// The top-level keys the object's fields are read from (`metadata`, `spec`, ...).
    roots: Vec<Box<str>>,
}

impl AnyFields {
    pub fn new(
        selector: AnyFieldSelector,
        group: &str,
        resource: &str,
        within: Within,
    ) -> AnyFields {
        let mut object = Wanted::default();
        for path in selector.paths() {
            match member_field(group, resource, path.as_str()) {
                Some(field) => {
                    for json_path in member_paths(field) {
                        object.add(json_path.split('.'));
                    }
                }
                None => object.add(path.keys().iter().map(|k| &**k)),
            }
        }
        let roots = object.children.keys().cloned().collect();
        let wanted = match within {
            Within::Object => object,
            Within::TableRow => TABLE_ROW.iter().rev().fold(object, |inner, key| Wanted {
                children: BTreeMap::from([(Box::from(*key), inner)]),
            }),
        };
        AnyFields {
            selector,
            group: group.into(),
            resource: resource.into(),
            within,
            wanted,
            roots,
        }
    }

    pub fn selector(&self) -> &AnyFieldSelector {
        &self.selector
    }

    /// The top-level keys of the object the selector reads.
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.roots.iter().map(|r| &**r)
    }

    /// Whether the object encoded as `json` satisfies every requirement.
    pub fn matches(&self, json: &[u8]) -> bool {
        let read = read_wanted(&self.wanted, json);
        let object = match self.within {
            Within::Object => &read,
            Within::TableRow => TABLE_ROW
                .iter()
                .try_fold(&read, |node, key| node.get(key))
                .unwrap_or(&Value::Null),
        };
        let reading = Reading::Member {
            group: &self.group,
            resource: &self.resource,
        };
        self.selector.matches(reading, object)
    }
}

/// The JSON paths the member reads one of its fields from.
fn member_paths(field: MemberField) -> Vec<&'static str> {
    match field {
        MemberField::Path(p) | MemberField::Count(p) | MemberField::Flag(p) => vec![p],
        MemberField::Either(first, second) => vec![first, second],
        MemberField::Unset => Vec::new(),
    }
}

/// The parts of `json` that `wanted` walks to, as a value that reads as the whole object would
/// at those paths: objects keep only the wanted members, an array becomes an object of its
/// wanted elements by index (`"0"`, `"12"`: a path walks it alike), and a wanted value is whole
/// when it is a string, number, bool or null, an empty object or array otherwise.
fn read_wanted(wanted: &Wanted, json: &[u8]) -> Value {
    let mut reader = serde_json::Deserializer::from_slice(json);
    Pick(wanted).deserialize(&mut reader).unwrap_or(Value::Null)
}

/// Reads one value, keeping what `wanted` walks to.
struct Pick<'w>(&'w Wanted);

impl<'de> DeserializeSeed<'de> for Pick<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pick<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As serde_json's own Value reads a float.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            match key {
                Some((name, wanted)) => {
                    // A key given twice: the last one counts, as in serde_json's Value.
                    let value = map.next_value_seed(Pick(wanted))?;
                    kept.insert(name.into(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(kept))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        let mut index = 0usize;
        loop {
            // Only a canonical index (`0`, `12`) names an element, as `field_text::walk` reads.
            let wanted = match self.0.children.is_empty() {
                true => None,
                false => self.0.children.get_key_value(index.to_string().as_str()),
            };
            let more = match wanted {
                Some((name, wanted)) => match seq.next_element_seed(Pick(wanted))? {
                    Some(value) => {
                        kept.insert(name.to_string(), value);
                        true
                    }
                    None => false,
                },
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                break;
            }
            index += 1;
        }
        Ok(Value::Object(kept))
    }
}

/// Reads an object's key: the wanted child it names, if any, without allocating.
struct Key<'w>(&'w Wanted);

impl<'de, 'w> DeserializeSeed<'de> for Key<'w> {
    type Value = Option<(&'w str, &'w Wanted)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 'w> Visitor<'de> for Key<'w> {
    type Value = Option<(&'w str, &'w Wanted)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.children.get_key_value(v).map(|(k, w)| (&**k, w)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::watch::selector::parse_any;

    fn pod() -> Value {
        json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "web-1", "namespace": "prod",
                         "labels": {"app.kubernetes.io/name": "web"},
                         "annotations": {"example.com/owner": "a=b,c\\d", "n": "1"}},
            "spec": {"nodeName": "node-1", "replicas": 3, "ratio": 1.5, "unschedulable": true,
                     "containers": [{"name": "main", "image": "busybox"},
                                    {"name": "side", "image": "envoy"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.7"}], "nothing": null},
            "source": {"component": ""}, "reportingComponent": "kubelet"
        })
    }

    fn lazy(selector: &str, resource: &str, object: &Value) -> bool {
        let any = parse_any(selector).unwrap();
        AnyFields::new(any, "", resource, Within::Object)
            .matches(&serde_json::to_vec(object).unwrap())
    }

    fn whole(selector: &str, resource: &str, object: &Value) -> bool {
        parse_any(selector).unwrap().matches(
            Reading::Member {
                group: "",
                resource,
            },
            object,
        )
    }

    #[test]
    fn read_from_bytes_as_from_the_whole_object() {
        let pod = pod();
        for (selector, selected) in [
            ("status.phase=Running", true),
            ("status.phase!=Running", false),
            ("spec.nodeName!=", true),
            ("spec.nodeName=", false),
            ("spec.missing=", true),
            (
                "metadata.annotations.example.com/owner=a\\=b\\,c\\\\d",
                true,
            ),
            ("metadata.labels.app.kubernetes.io/name==web", true),
            ("spec.containers.1.image=envoy", true),
            ("spec.containers.01.image=envoy", false),
            ("spec.containers.2.image=", true),
            ("spec.containers=x", false),
            ("spec.containers!=x", true),
            ("spec.replicas=3", true),
            ("spec.ratio=1.5", true),
            ("spec.unschedulable=true", true),
            ("status.nothing=", true),
            ("status.podIPs.0.ip=10.0.0.7,metadata.name=web-1", true),
            ("status.podIPs.0.ip=10.0.0.7,metadata.name=web-2", false),
            ("spec=x", false),
            ("", true),
        ] {
            assert_eq!(lazy(selector, "pods", &pod), selected, "{selector}");
            assert_eq!(whole(selector, "pods", &pod), selected, "{selector}");
        }
        // The member's own reading of its fields: events' source falls back.
        assert!(lazy("source=kubelet", "events", &pod));
        assert!(lazy("spec.host=node-1", "pods", &pod));
    }

    #[test]
    fn a_table_rows_object_is_read() {
        let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
            "rows": [{"cells": ["web-1"], "object": {"kind": "PartialObjectMetadata",
                "metadata": {"name": "web-1", "annotations": {"x": "y"}}}}]});
        let bytes = serde_json::to_vec(&table).unwrap();
        let fields = |s: &str| AnyFields::new(parse_any(s).unwrap(), "", "pods", Within::TableRow);
        assert!(fields("metadata.annotations.x=y").matches(&bytes));
        assert!(!fields("metadata.annotations.x=z").matches(&bytes));
        assert!(fields("metadata.name=web-1,metadata.namespace=").matches(&bytes));
    }

    #[test]
    fn bytes_that_are_no_json_read_as_missing_fields() {
        let fields = AnyFields::new(parse_any("a=").unwrap(), "", "x", Within::Object);
        for bytes in [&b""[..], b"{", b"[1,", b"\xff", b"{\"a\":\"b\"", b"nul"] {
            assert!(fields.matches(bytes), "{bytes:?}");
        }
        let fields = AnyFields::new(parse_any("a=b").unwrap(), "", "x", Within::Object);
        assert!(!fields.matches(b"{\"a\":\"b\""));
        assert!(
            fields.matches(b"{\"a\":\"c\",\"a\":\"b\"}"),
            "the last key counts"
        );
    }

    #[test]
    fn a_selector_of_thousands_of_fields_reads_each_once() {
        let mut text: Vec<String> = (0..3000).map(|n| format!("status.f{n}=")).collect();
        text.push("status.phase=Running".into());
        text.push("spec.containers.1.image!=busybox".into());
        assert!(lazy(&text.join(","), "pods", &pod()));
        text.push("status.f7=x".into());
        assert!(!lazy(&text.join(","), "pods", &pod()));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[a-c0-2.]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c0-2]{1,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_selector_selects_from_bytes_what_it_selects_from_the_value(
            object in json_value(),
            fields in prop::collection::vec(("[a-c0-2]{1,2}(\\.[a-c0-2]{1,2}){0,3}", any::<bool>(), "[a-c0-2.]{0,3}"), 1..4),
        ) {
            let text = fields
                .iter()
                .map(|(f, eq, v)| format!("{f}{}{v}", if *eq { "=" } else { "!=" }))
                .collect::<Vec<_>>()
                .join(",");
            let any = parse_any(&text).unwrap();
            let bytes = serde_json::to_vec(&object).unwrap();
            // The value as read back from its bytes (a float's last digit may read otherwise).
            let object: Value = serde_json::from_slice(&bytes).unwrap();
            let whole = any.matches(Reading::Member { group: "", resource: "pods" }, &object);
            let lazy = AnyFields::new(any, "", "pods", Within::Object).matches(&bytes);
            prop_assert_eq!(lazy, whole, "{}", text);
        }
    }
}
