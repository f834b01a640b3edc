//! One event of a shared watch, encoded once, and the objects a hub holds: the memory of the
//! cache (docs/cache.md#memory).
//!
//! An [`Event`] is the line every client gets (`{"type":..,"object":..}\n`, one `Bytes` they all
//! share), the object's storage key (`namespace/name`) and labels packed into one small string
//! beside it, the labels before (a MODIFIED event's, kept only when they changed), and the
//! event's other forms (as ADDED, as DELETED, with a Table's columns) built only when a client
//! needs one. [`Objects`] holds the hub's events by their own keys (a map entry is one pointer).
//! [`Event::held_bytes`] is what one costs, allocations as the allocator rounds them included;
//! a hub's `memory::Meter` counts it from the event's making to its drop.
//!
//! Never panics on what a member sends (labels of any length and content, objects without
//! metadata). Used by the hub (`super`), its clients (`watch::client`) and the cached LIST
//! (`watch::list`).

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::{Deref, RangeBounds};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

use super::memory::Meter;
use crate::watch::selector::LabelValues;

/// An event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
    Bookmark,
}

impl Kind {
    pub(super) fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "ADDED" => Kind::Added,
            "MODIFIED" => Kind::Modified,
            "DELETED" => Kind::Deleted,
            "BOOKMARK" => Kind::Bookmark,
            _ => return None,
        })
    }

    /// `{"type":"KIND","object":`, what a line starts with.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Added => "{\"type\":\"ADDED\",\"object\":",
            Kind::Modified => "{\"type\":\"MODIFIED\",\"object\":",
            Kind::Deleted => "{\"type\":\"DELETED\",\"object\":",
            Kind::Bookmark => "{\"type\":\"BOOKMARK\",\"object\":",
        }
    }
}

/// One event, encoded once.
pub struct Event {
    pub kind: Kind,
    /// Where in the object the fields after `kind` and `apiVersion` start: a LIST's item is `{`
    /// and those (kube-apiserver's list items go without them). 1 when the object has neither.
    item_at: u32,
    /// The length of the storage key at the start of `index`.
    key_len: u32,
    pub rv: u64,
    /// `{"type":KIND,"object":OBJECT}\n`; OBJECT has `{"kind":..,"apiVersion":..,` first, as
    /// kube encodes them.
    line: Bytes,
    /// `namespace/name` (the object's place in [`Objects`]), then its labels, each key and value
    /// as a netstring (`3:app3:web`): one allocation.
    index: Box<str>,
    /// A MODIFIED event's labels before it, as netstrings, when they were not the same (None:
    /// the same labels, or the hub did not hold the object: a selector then sees it as it is).
    previous: Option<Box<str>>,
    /// The event's other forms, built when first needed.
    forms: OnceLock<Box<Forms>>,
    /// The hub's memory this event counts in (None: a hub of a resource not cached).
    meter: Option<Arc<Meter>>,
}

/// The same object as an ADDED and as a DELETED event (a client whose selector it starts or
/// stops matching), and as a Table event with column definitions.
#[derive(Default)]
struct Forms {
    as_added: OnceLock<Bytes>,
    as_deleted: OnceLock<Bytes>,
    with_columns: OnceLock<Bytes>,
}

/// What filtering needs of an object.
pub(super) struct Meta {
    pub namespace: String,
    pub name: String,
    /// Netstrings, as [`Event`] keeps them.
    pub labels: String,
}

impl Meta {
    /// The namespace, name and labels of an object's `metadata`.
    pub(super) fn of(metadata: Option<&Value>) -> Meta {
        let text = |key: &str| -> String {
            metadata
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let mut labels = String::new();
        if let Some(map) = metadata
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
        {
            for (key, value) in map {
                if let Some(value) = value.as_str() {
                    put_netstring(&mut labels, key);
                    put_netstring(&mut labels, value);
                }
            }
        }
        Meta {
            namespace: text("namespace"),
            name: text("name"),
            labels,
        }
    }

    /// The namespace, name and labels of a held event.
    pub(super) fn of_event(event: &Event) -> Meta {
        Meta {
            namespace: event.namespace().to_owned(),
            name: event.name().to_owned(),
            labels: event.labels().0.to_owned(),
        }
    }
}

fn put_netstring(out: &mut String, text: &str) {
    let _ = write!(out, "{}:{text}", text.len());
}

/// The labels of one object: a view of netstrings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Labels<'e>(&'e str);

impl<'e> Labels<'e> {
    /// Every (key, value), in the order the object has them.
    pub fn iter(self) -> impl Iterator<Item = (&'e str, &'e str)> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            let key = next_netstring(&mut rest)?;
            let value = next_netstring(&mut rest)?;
            Some((key, value))
        })
    }

    pub fn get(self, key: &str) -> Option<&'e str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl LabelValues for Labels<'_> {
    fn value(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

/// The first netstring of `rest`, which moves past it; None at the end (or on a malformed one,
/// which [`put_netstring`] never writes).
fn next_netstring<'t>(rest: &mut &'t str) -> Option<&'t str> {
    let (len, after) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let text = after.get(..len)?;
    *rest = after.get(len..)?;
    Some(text)
}

impl Event {
    pub(super) fn new(
        kind: Kind,
        rv: u64,
        object: &Value,
        meta: Meta,
        meter: Option<&Arc<Meter>>,
    ) -> Event {
        let (encoded, item_at) = encode_object(object);
        let line = encode(kind, &encoded);
        let mut index = String::with_capacity(meta.namespace.len() + 1 + meta.name.len());
        index.push_str(&meta.namespace);
        index.push('/');
        index.push_str(&meta.name);
        let key_len = index.len() as u32;
        index.push_str(&meta.labels);
        let event = Event {
            kind,
            item_at,
            key_len,
            rv,
            line,
            index: index.into_boxed_str(),
            previous: None,
            forms: OnceLock::new(),
            meter: meter.cloned(),
        };
        if let Some(meter) = &event.meter {
            meter.add(event.held_bytes());
        }
        event
    }

    /// Sets a MODIFIED event's labels before it (those of the object the hub held), kept only
    /// when they differ from its own.
    pub(super) fn set_previous(&mut self, held: Labels<'_>) {
        if held == self.labels() {
            return;
        }
        let previous: Box<str> = held.0.into();
        let bytes = alloc_size(previous.len());
        self.previous = Some(previous);
        if let Some(meter) = &self.meter {
            meter.add(bytes);
        }
    }

    /// The object's storage key: `namespace/name` (`/name` when cluster-scoped).
    pub fn key(&self) -> &str {
        self.index.get(..self.key_len as usize).unwrap_or("")
    }

    pub fn namespace(&self) -> &str {
        self.key().split_once('/').map_or("", |(ns, _)| ns)
    }

    pub fn name(&self) -> &str {
        self.key().split_once('/').map_or("", |(_, name)| name)
    }

    pub fn labels(&self) -> Labels<'_> {
        Labels(self.index.get(self.key_len as usize..).unwrap_or(""))
    }

    /// A MODIFIED event's labels before it, when they changed (None: a selector sees the event
    /// as it is).
    pub fn previous(&self) -> Option<Labels<'_>> {
        self.previous.as_deref().map(Labels)
    }

    /// The object as a LIST's item, in two pieces to write one after the other: `{` and the
    /// object's fields but `kind` and `apiVersion`.
    pub fn item(&self) -> [&[u8]; 2] {
        let object = self.object();
        let at = (self.item_at as usize).min(object.len());
        [b"{", &object[at..]]
    }

    /// The object's whole JSON.
    pub fn object(&self) -> &[u8] {
        let start = self.kind.prefix().len();
        let end = self.line.len().saturating_sub(2);
        self.line.get(start..end).unwrap_or_default()
    }

    /// The event as a client sees it: as `kind` (its own, or ADDED / DELETED when the client's
    /// selector starts or stops matching), with the Table `columns` when given.
    pub fn line(&self, kind: Kind, columns: Option<&Bytes>) -> Bytes {
        match (columns, kind == self.kind) {
            (None, true) => self.line.clone(),
            (None, false) => {
                let forms = self.forms();
                let cell = match kind {
                    Kind::Deleted => &forms.as_deleted,
                    _ => &forms.as_added,
                };
                self.built(cell, || encode(kind, self.object()))
            }
            (Some(columns), true) => {
                let cell = &self.forms().with_columns;
                self.built(cell, || encode(kind, &with_columns(self.object(), columns)))
            }
            (Some(columns), false) => encode(kind, &with_columns(self.object(), columns)),
        }
    }

    fn forms(&self) -> &Forms {
        self.forms.get_or_init(|| {
            if let Some(meter) = &self.meter {
                meter.add(alloc_size(std::mem::size_of::<Forms>()));
            }
            Box::default()
        })
    }

    /// One of the event's other forms, built (and counted) the first time.
    fn built(&self, cell: &OnceLock<Bytes>, build: impl FnOnce() -> Bytes) -> Bytes {
        cell.get_or_init(|| {
            let line = build();
            if let Some(meter) = &self.meter {
                meter.add(bytes_held(line.len()));
            }
            line
        })
        .clone()
    }

    /// The memory this event holds: itself in its `Arc`, its line, its index and labels before,
    /// and the other forms built so far, each allocation as the allocator rounds it.
    pub fn held_bytes(&self) -> u64 {
        let mut bytes = alloc_size(std::mem::size_of::<Event>() + 2 * std::mem::size_of::<usize>())
            + bytes_held(self.line.len())
            + alloc_size(self.index.len());
        if let Some(previous) = &self.previous {
            bytes += alloc_size(previous.len());
        }
        if let Some(forms) = self.forms.get() {
            bytes += alloc_size(std::mem::size_of::<Forms>());
            for cell in [&forms.as_added, &forms.as_deleted, &forms.with_columns] {
                bytes += cell.get().map_or(0, |line| bytes_held(line.len()));
            }
        }
        bytes
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(meter) = &self.meter {
            meter.sub(self.held_bytes());
        }
    }
}

/// What an allocation of `len` bytes takes (the gateway runs on mimalloc): its size class,
/// words up to 8 words, then four classes per power of two (`mi_bin`: an allocation just past
/// a class takes up to a quarter more, about a tenth more on average).
pub fn alloc_size(len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let words = len.div_ceil(8);
    let words = if words <= 8 {
        words
    } else {
        let w = words - 1;
        let shift = (usize::BITS - 1 - w.leading_zeros()) - 2;
        ((w >> shift) + 1) << shift
    };
    (words * 8) as u64
}

/// A `Bytes` of `len` bytes shared by its clones: the buffer and the shared header its first
/// clone allocates (its pointer, capacity and count).
fn bytes_held(len: usize) -> u64 {
    alloc_size(len) + alloc_size(3 * std::mem::size_of::<usize>())
}

/// An object's JSON with `kind` and `apiVersion` first (when it has them), and where the fields
/// after them start.
fn encode_object(object: &Value) -> (Vec<u8>, u32) {
    let Value::Object(map) = object else {
        return (serde_json::to_vec(object).unwrap_or_default(), 1);
    };
    let (Some(kind @ Value::String(_)), Some(api_version @ Value::String(_))) =
        (map.get("kind"), map.get("apiVersion"))
    else {
        return (serde_json::to_vec(object).unwrap_or_default(), 1);
    };
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"kind\":");
    let _ = serde_json::to_writer(&mut out, kind);
    out.extend_from_slice(b",\"apiVersion\":");
    let _ = serde_json::to_writer(&mut out, api_version);
    let item_at = out.len() + 1;
    let mut rest = map
        .iter()
        .filter(|(k, _)| *k != "kind" && *k != "apiVersion")
        .peekable();
    if rest.peek().is_none() {
        out.push(b'}');
        let at = out.len() - 1;
        return (out, at as u32);
    }
    for (key, value) in rest {
        out.push(b',');
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, value);
    }
    out.push(b'}');
    (out, item_at as u32)
}

/// `{"type":KIND,"object":OBJECT}\n`, in a buffer of exactly its size (so its `Bytes` needs no
/// second allocation until it is shared).
fn encode(kind: Kind, object: &[u8]) -> Bytes {
    let prefix = kind.prefix();
    let mut out = Vec::with_capacity(prefix.len() + object.len() + 2);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// A Table object (kept without columns) with `columns` as its column definitions.
fn with_columns(object: &[u8], columns: &Bytes) -> Vec<u8> {
    let Ok(mut table) = serde_json::from_slice::<Value>(object) else {
        return object.to_vec();
    };
    if let (Value::Object(map), Ok(columns)) = (&mut table, serde_json::from_slice(columns)) {
        map.insert("columnDefinitions".into(), columns);
    }
    serde_json::to_vec(&table).unwrap_or_else(|_| object.to_vec())
}

/// The objects a hub holds, by their storage keys, so in the order kube-apiserver lists them:
/// their last ADDED or MODIFIED event. Each entry is the event itself, keyed by the key it
/// holds: no second copy of the key.
#[derive(Clone, Default)]
pub struct Objects(BTreeSet<Held>);

/// An entry of [`Objects`]: an event, ordered by its storage key (and read as it).
#[derive(Clone)]
pub struct Held(Arc<Event>);

impl Deref for Held {
    type Target = str;

    fn deref(&self) -> &str {
        self.0.key()
    }
}

impl Borrow<str> for Held {
    fn borrow(&self) -> &str {
        self.0.key()
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key().cmp(other.0.key())
    }
}

/// What one entry of [`Objects`] adds to its B-tree: the pointer, and its node's share of
/// parent links and lengths, at the nodes' usual fill.
pub const OBJECT_ENTRY: u64 = 16;

impl Objects {
    pub fn new() -> Objects {
        Objects::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Event>> {
        self.0.get(key).map(|held| &held.0)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    /// Holds `event` under its key, in place of the one held there.
    pub fn insert(&mut self, event: Arc<Event>) -> Option<Arc<Event>> {
        self.0.replace(Held(event)).map(|held| held.0)
    }

    pub fn remove(&mut self, key: &str) -> Option<Arc<Event>> {
        self.0.take(key).map(|held| held.0)
    }

    /// Every (key, event), in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, &Arc<Event>)> {
        self.0.iter().map(|held| (&**held, &held.0))
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<Event>> {
        self.0.iter().map(|held| &held.0)
    }

    /// The entries whose keys are in `range`, in key order.
    pub fn range<T, R>(&self, range: R) -> HeldRange<'_>
    where
        T: Ord + ?Sized,
        Held: Borrow<T>,
        R: RangeBounds<T>,
    {
        self.0.range(range).map(|held| (held, &held.0))
    }
}

/// The entries of a range of [`Objects`] (a type of its own, not borrowing the range's
/// bounds).
pub type HeldRange<'o> =
    std::iter::Map<std::collections::btree_set::Range<'o, Held>, fn(&Held) -> (&Held, &Arc<Event>)>;

/// An object's place in [`Objects`]: `namespace/name` (`/name` when cluster-scoped), ordered as
/// kube-apiserver orders a list (by its storage key, where `a-b/x` comes before `a/x`).
pub fn object_key(namespace: &str, name: &str) -> Box<str> {
    let mut key = String::with_capacity(namespace.len() + 1 + name.len());
    key.push_str(namespace);
    key.push('/');
    key.push_str(name);
    key.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::hub::memory::Ledger;

    /// A pod as kube-apiserver 1.24 lists it (`tests/fixtures`), with `kind` and `apiVersion`
    /// as a watch event carries them.
    fn fixture_pod() -> Value {
        let list: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/kube-apiserver-v1.24/objects/pod-list.json"
        ))
        .unwrap();
        let mut pod = list["items"][0].clone();
        pod["kind"] = "Pod".into();
        pod["apiVersion"] = "v1".into();
        pod
    }

    /// A small ConfigMap, as kube-apiserver 1.24 answers a GET of one.
    const CONFIGMAP: &str = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"fixture-cm","namespace":"fixtures","uid":"f0a761d7-ea8d-4f1d-a4bc-c6fd44e119d6","resourceVersion":"255","creationTimestamp":"2026-11-22T10:25:11Z","labels":{"app":"fixtures","tier":"config"},"annotations":{"note":"recorded"},"managedFields":[{"manager":"fixtures-recorder","operation":"Update","apiVersion":"v1","time":"2026-11-22T10:25:11Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k1":{}},"f:metadata":{"f:annotations":{".":{},"f:note":{}},"f:labels":{".":{},"f:app":{},"f:tier":{}}}}}]},"data":{"k1":"v1"}}"#;

    /// What one cached object costs (its event and its entry in the hub's objects), as counted
    /// by a meter from the event's making to its drop, and its JSON's length.
    fn cost(object: &Value) -> (u64, usize) {
        let ledger = Ledger::new(Box::leak(Box::default()));
        let meter = ledger.meter(test_key(), true);
        let event = Event::new(
            Kind::Added,
            1,
            object,
            Meta::of(object.get("metadata")),
            Some(&meter),
        );
        assert_eq!(meter.bytes(), event.held_bytes());
        let json = event.object().len();
        let held = event.held_bytes() + OBJECT_ENTRY;
        drop(event);
        assert_eq!(meter.bytes(), 0, "an event gives back what it counted");
        (held, json)
    }

    fn test_key() -> crate::watch::HubKey {
        crate::watch::HubKey {
            cluster: "member1".into(),
            route: 1,
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            namespace: String::new(),
            form: crate::watch::Form::Json,
        }
    }

    #[test]
    fn a_cached_pod_costs_at_most_a_third_more_than_its_json() {
        // The fixture's pod (2 KiB: its line lands just past a size class, the worst case).
        let (held, json) = cost(&fixture_pod());
        let ratio = held as f64 / json as f64;
        println!("fixture pod: {json} B of JSON, {held} B held: {ratio:.3}x");
        assert!(ratio <= 1.3 + 0.1, "{ratio}");
        // Pods of 2 to 4 KiB (the fixture's with a longer annotation), as a member's pods
        // spread over the allocator's size classes.
        let (mut all_held, mut all_json) = (0, 0);
        for extra in (0..2048).step_by(24) {
            let mut pod = fixture_pod();
            pod["metadata"]["annotations"] = serde_json::json!({"note": "x".repeat(extra)});
            let (held, json) = cost(&pod);
            // What the event adds to its JSON's own allocation: about 200 bytes, whatever its
            // size (the event, its key and labels, its entry in the hub's objects).
            let line = alloc_size(json + Kind::Added.prefix().len() + 2);
            assert!(held - line <= 256, "{held} {line} {json}");
            all_held += held;
            all_json += json as u64;
        }
        let ratio = all_held as f64 / all_json as f64;
        println!("pods of 2-4 KiB: {ratio:.3}x their JSON");
        assert!(ratio <= 1.3, "{ratio}");
    }

    #[test]
    fn a_small_configmap_costs_what_its_index_and_allocations_add() {
        let configmap: Value = serde_json::from_str(CONFIGMAP).unwrap();
        let (held, json) = cost(&configmap);
        let ratio = held as f64 / json as f64;
        println!("small configmap: {json} B of JSON, {held} B held: {ratio:.3}x");
        assert!(ratio <= 1.5, "{ratio}");
    }

    /// An event of `object` counted by no meter.
    fn uncounted(kind: Kind, rv: u64, object: &Value) -> Event {
        Event::new(kind, rv, object, Meta::of(object.get("metadata")), None)
    }

    #[test]
    fn labels_and_keys_read_back_as_the_object_has_them() {
        let object = serde_json::json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {
            "name": "a:b", "namespace": "ns", "labels": {"app": "web", "12:x": "", "é": "1:2"}}});
        let event = uncounted(Kind::Added, 5, &object);
        assert_eq!(
            (event.key(), event.namespace(), event.name()),
            ("ns/a:b", "ns", "a:b")
        );
        let labels: Vec<_> = event.labels().iter().collect();
        assert_eq!(labels, [("12:x", ""), ("app", "web"), ("é", "1:2")]);
        assert_eq!(event.labels().get("é"), Some("1:2"));
        assert_eq!(event.labels().get("missing"), None);
        // Cluster-scoped: `/name`.
        let event = uncounted(
            Kind::Added,
            5,
            &serde_json::json!({"metadata": {"name": "n1"}}),
        );
        assert_eq!(
            (event.key(), event.namespace(), event.name()),
            ("/n1", "", "n1")
        );
        assert_eq!(event.labels().iter().count(), 0);
    }

    #[test]
    fn labels_before_are_kept_only_when_they_changed() {
        let v = |app: &str| serde_json::json!({"metadata": {"name": "a", "labels": {"app": app}}});
        let old = uncounted(Kind::Added, 1, &v("web"));
        let mut same = uncounted(Kind::Modified, 2, &v("web"));
        same.set_previous(old.labels());
        assert!(same.previous().is_none());
        let mut moved = uncounted(Kind::Modified, 2, &v("db"));
        moved.set_previous(old.labels());
        assert_eq!(moved.previous().and_then(|l| l.get("app")), Some("web"));
    }
}
