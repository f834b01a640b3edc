//! The in-memory object store of one simulated member: every object of every resource, one
//! resourceVersion counter, a bounded window of past events (for watch resume and 410 Expired),
//! and a broadcast channel that carries each event once to every open watch.
//!
//! The lock is a plain `RwLock` held only for in-memory work: never across an await, never while
//! writing to a socket. Events are shared (`Arc`), and their JSON encoding is computed once and
//! shared by every watcher that sends plain JSON. Called by the router (`api`), `watch` and `load`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

/// `metadata.<field>` of an object (`name`, `namespace`) as a string, empty when absent.
pub(crate) fn meta_str(object: &Value, field: &str) -> String {
    object["metadata"][field]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// How many events a watcher may fall behind before it is ended with 410 Expired.
const BROADCAST_CAPACITY: usize = 8192;

/// The kind of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object, shared by the history window and every watcher.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub event_type: EventType,
    pub resource: &'static str,
    pub namespace: String,
    pub name: String,
    /// The object after the change (for DELETED: the last state, with the deletion RV).
    pub object: Arc<Value>,
    /// For MODIFIED: the object before the change, so that a filtered watch can turn the event
    /// into ADDED or DELETED when the object starts or stops matching its selectors.
    pub previous: Option<Arc<Value>>,
    json_line: OnceLock<Bytes>,
}

impl StoredEvent {
    pub fn new(rv: u64, event_type: EventType, resource: &'static str, object: Arc<Value>) -> Self {
        let namespace = meta_str(&object, "namespace");
        let name = meta_str(&object, "name");
        Self {
            rv,
            event_type,
            resource,
            namespace,
            name,
            object,
            previous: None,
            json_line: OnceLock::new(),
        }
    }

    /// `{"type":"ADDED","object":{...}}\n`, encoded once and shared by every plain-JSON watcher.
    pub fn json_line(&self) -> Bytes {
        self.json_line
            .get_or_init(|| {
                let mut out = Vec::with_capacity(256);
                out.extend_from_slice(b"{\"type\":\"");
                out.extend_from_slice(self.event_type.as_str().as_bytes());
                out.extend_from_slice(b"\",\"object\":");
                // Serializing a Value into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut out, self.object.as_ref());
                out.extend_from_slice(b"}\n");
                Bytes::from(out)
            })
            .clone()
    }
}

/// A watch start that the history window no longer covers.
#[derive(Debug, Clone, Copy)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

/// Where a new watch starts, and what it receives from then on.
pub struct WatchStart {
    /// Events to send first (history replay, or the current state as synthetic ADDED).
    pub initial: Vec<Arc<StoredEvent>>,
    pub receiver: broadcast::Receiver<Arc<StoredEvent>>,
    pub current_rv: u64,
}

/// What a mutation closure decides.
pub enum Mutation {
    /// Store this object (created or replaced).
    Put(Value),
    /// Remove the object; the given value is its last state.
    Delete(Value),
    /// Change nothing.
    Nothing,
}

/// The result of a list.
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    /// Key of the last item returned when more remain (for the continue token).
    pub next_start: Option<(String, String)>,
    pub remaining: usize,
}

/// An object's place in its resource: (namespace, name), ordered as etcd orders the storage
/// keys (`namespace/name`, byte by byte), so a list comes out in kube-apiserver's order: `a-b/x`
/// before `a/x`, since `-` sorts before `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectKey(String, String);

impl ObjectKey {
    fn storage_key(&self) -> impl Iterator<Item = u8> + '_ {
        self.0
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.1.bytes())
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.storage_key().cmp(other.storage_key())
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

struct State {
    rv: u64,
    objects: HashMap<&'static str, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<Arc<StoredEvent>>,
    history_capacity: usize,
    /// Events with rv > this are all in `history`.
    oldest_replayable: u64,
}

/// One member's objects.
pub struct Store {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<StoredEvent>>,
}

impl Store {
    pub fn new(history_capacity: usize) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        Self {
            state: RwLock::new(State {
                rv: 1,
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_capacity,
                oldest_replayable: 1,
            }),
            events,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.read().rv
    }

    /// The oldest resourceVersion a watch may resume from.
    pub fn oldest_replayable(&self) -> u64 {
        self.read().oldest_replayable
    }

    /// Forgets the history so far: watches must start at or after the current RV. Called once the
    /// seed objects are in, like an apiserver whose watch cache starts at its first list.
    pub fn compact_history(&self) {
        let mut state = self.write();
        state.history.clear();
        state.oldest_replayable = state.rv;
    }

    pub fn get(&self, resource: &'static str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.read()
            .objects
            .get(resource)?
            .get(&ObjectKey(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn count(&self, resource: &'static str) -> usize {
        self.read().objects.get(resource).map_or(0, |m| m.len())
    }

    /// Lists `resource` (in `namespace`, or everywhere), keeping items that `keep` accepts,
    /// starting after `start_after`, returning at most `limit` items.
    pub fn list(
        &self,
        resource: &'static str,
        namespace: Option<&str>,
        start_after: Option<&(String, String)>,
        limit: Option<usize>,
        keep: impl Fn(&Value) -> bool,
    ) -> ListPage {
        let state = self.read();
        let rv = state.rv;
        let Some(objects) = state.objects.get(resource) else {
            return ListPage {
                items: Vec::new(),
                rv,
                next_start: None,
                remaining: 0,
            };
        };
        let lower = match (start_after, namespace) {
            (Some((ns, name)), _) => Bound::Excluded(ObjectKey(ns.clone(), name.clone())),
            // `NAMESPACE/` comes before every key of the namespace, and they sort together.
            (None, Some(ns)) => Bound::Included(ObjectKey(ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut next_start = None;
        let mut remaining = 0;
        for (ObjectKey(ns, name), object) in objects.range((lower, Bound::Unbounded)) {
            if let Some(wanted) = namespace {
                if ns != wanted {
                    break;
                }
            }
            if !keep(object) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                continue;
            }
            items.push(object.clone());
            next_start = Some((ns.clone(), name.clone()));
        }
        if remaining == 0 {
            next_start = None;
        }
        ListPage {
            items,
            rv,
            next_start,
            remaining,
        }
    }

    /// Atomically reads the current object (if any), lets `decide` compute the change, and
    /// applies it: stamps `metadata.resourceVersion`, records and broadcasts the event.
    ///
    /// `decide` runs under the write lock: it must be quick and must not block.
    pub fn mutate<E>(
        &self,
        resource: &'static str,
        namespace: &str,
        name: &str,
        decide: impl FnOnce(Option<&Arc<Value>>) -> Result<Mutation, E>,
    ) -> Result<Option<(EventType, Arc<Value>)>, E> {
        let mut state = self.write();
        let key = ObjectKey(namespace.to_string(), name.to_string());
        let current = state
            .objects
            .get(resource)
            .and_then(|m| m.get(&key))
            .cloned();
        let mutation = decide(current.as_ref())?;
        let (event_type, mut object) = match mutation {
            Mutation::Nothing => return Ok(None),
            Mutation::Put(object) => (
                if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                },
                object,
            ),
            Mutation::Delete(object) => {
                if current.is_none() {
                    return Ok(None);
                }
                (EventType::Deleted, object)
            }
        };
        state.rv += 1;
        let rv = state.rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let object = Arc::new(object);
        let table = state.objects.entry(resource).or_default();
        if event_type == EventType::Deleted {
            table.remove(&key);
        } else {
            table.insert(key, object.clone());
        }
        let mut event = StoredEvent::new(rv, event_type, resource, object.clone());
        if event_type == EventType::Modified {
            event.previous = current;
        }
        let event = Arc::new(event);
        state.history.push_back(event.clone());
        while state.history.len() > state.history_capacity {
            if let Some(dropped) = state.history.pop_front() {
                state.oldest_replayable = dropped.rv;
            }
        }
        // Sent under the lock so that a watch subscribing under the read lock sees every event
        // exactly once: either in its initial snapshot or on its receiver. No receiver is fine.
        let _ = self.events.send(event);
        Ok(Some((event_type, object)))
    }

    /// Starts a watch of `resource`: from `from_rv` (replaying history after it), or, with None,
    /// from the current state sent as synthetic ADDED events (`keep` filters those).
    pub fn watch(
        &self,
        resource: &'static str,
        namespace: Option<&str>,
        from_rv: Option<u64>,
        keep: impl Fn(&Value) -> bool,
    ) -> Result<WatchStart, TooOld> {
        let state = self.read();
        let receiver = self.events.subscribe();
        let initial = match from_rv {
            Some(rv) => {
                if rv < state.oldest_replayable {
                    return Err(TooOld {
                        requested: rv,
                        oldest: state.oldest_replayable,
                    });
                }
                state
                    .history
                    .iter()
                    .filter(|e| e.rv > rv && e.resource == resource)
                    .filter(|e| namespace.is_none_or(|ns| e.namespace == ns))
                    .cloned()
                    .collect()
            }
            None => state
                .objects
                .get(resource)
                .map(|objects| {
                    objects
                        .iter()
                        .filter(|(ObjectKey(ns, _), _)| namespace.is_none_or(|wanted| ns == wanted))
                        .filter(|(_, o)| keep(o))
                        .map(|(_, o)| {
                            let rv = o["metadata"]["resourceVersion"]
                                .as_str()
                                .and_then(|s| s.parse().ok())
                                .unwrap_or(state.rv);
                            Arc::new(StoredEvent::new(rv, EventType::Added, resource, o.clone()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        Ok(WatchStart {
            initial,
            receiver,
            current_rv: state.rv,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(store: &Store, name: &str) {
        store
            .mutate::<()>("configmaps", "ns", name, |_| {
                Ok(Mutation::Put(
                    json!({"metadata":{"name":name,"namespace":"ns"}}),
                ))
            })
            .unwrap();
    }

    #[test]
    fn history_window_expires_old_versions() {
        let store = Store::new(3);
        for i in 0..10 {
            put(&store, &format!("cm-{i}"));
        }
        assert!(store.watch("configmaps", None, Some(2), |_| true).is_err());
        let start = store
            .watch("configmaps", None, Some(store.current_rv() - 2), |_| true)
            .map_err(|_| ())
            .unwrap();
        assert_eq!(start.initial.len(), 2);
    }

    #[test]
    fn list_pages_in_name_order() {
        let store = Store::new(100);
        for name in ["c", "a", "b"] {
            put(&store, name);
        }
        let page = store.list("configmaps", Some("ns"), None, Some(2), |_| true);
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.remaining, 1);
        let next = page.next_start.unwrap();
        let page2 = store.list("configmaps", Some("ns"), Some(&next), Some(2), |_| true);
        assert_eq!(page2.items[0]["metadata"]["name"], "c");
        assert!(page2.next_start.is_none());
    }
}
