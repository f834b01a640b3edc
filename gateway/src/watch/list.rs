//! LISTs served from a hub's objects (`spec.cache`, docs/cache.md): the hub of a shared watch
//! holds the member's objects of its collection, each as its encoded JSON, so a LIST of a cached
//! resource is answered by copying bytes, with kube-apiserver's watch-cache semantics:
//!
//! - `resourceVersion=0` (informers, `kube-rs` watchers): at once, from what the hub holds (a
//!   `limit` is ignored, as kube-apiserver 1.24's watch cache ignores it at 0).
//! - no `resourceVersion` (a consistent read: `kubectl get`, the Python client): the member's
//!   current resourceVersion is asked (a `limit=1` list, [`hub::Hub::member_version`]), and the
//!   LIST is served once the hub has seen it, within [`CATCH_UP`]; otherwise by the member.
//! - `resourceVersion=N` (`NotOlderThan`, or no match): once the hub has seen N, within
//!   [`CATCH_UP`]; otherwise by the member, which answers it itself.
//!
//! A `limit` (kubectl sends 500) that the selected items fit in changes nothing: the member
//! would answer the same single page. Anything else goes to the member as it came, which
//! answers it exactly: more items than a `limit` with a consistent read or a resourceVersion
//! other than 0 (its pages and continue tokens), `continue`, `resourceVersionMatch=Exact`, another
//! field selector than name and namespace, a user the member does not let list (a
//! SelfSubjectAccessReview as the user, `access`, cached as for shared watches), a hub that
//! cannot start. A Table (`kubectl get` without `-o`) comes from the hub of Table form, each
//! row's `Age` computed again (`table`). The items are the member's objects in its order (by namespace, then name, as
//! its storage keys sort), filtered by the namespace and selectors as the member filters them.
//! Called by the pipeline (`handle`) for a `Decision::Proxy` whose verb is `list`.

use std::ops::Bound;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};

mod table;

use super::hub::{Event, Hub, Phase};
use super::selector::{FieldSelector, LabelSelector};
use super::{access, hub_for, Asked, Caller, Form, HubKey, ShardWatches};
use crate::exchange::Failure;
use crate::fleet::FleetClient;
use crate::request::Proxied;

/// How long a LIST waits for its hub to have seen the resourceVersion it must not be older
/// than; past it, the member answers.
pub const CATCH_UP: Duration = Duration::from_millis(250);
/// How long a LIST waits for a starting hub's first list; past it, the member answers.
pub const START_WAIT: Duration = Duration::from_secs(30);
/// A response body goes out in pieces of about this size.
const PIECE: usize = 64 * 1024;

/// How fresh the items must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// `resourceVersion=0`: whatever the hub holds.
    Any,
    /// No resourceVersion: at least the member's current one.
    Consistent,
    /// At least this resourceVersion.
    NotOlderThan(u64),
}

/// A LIST served from a hub.
#[derive(Debug, Clone)]
pub struct ListPlan {
    pub key: HubKey,
    pub read: Read,
    /// The client's `limit`: a list with more items is the member's to page (its continue
    /// tokens); one that fits is the whole answer, as the member would give it.
    pub limit: Option<u64>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

/// A LIST of a cached resource that the hub can serve exactly as the member would; None: the
/// member's.
pub(super) fn plan(asked: Asked<'_>) -> Option<ListPlan> {
    if asked.flag("watch")? {
        return None;
    }
    let limit = asked.number("limit", 19)?.filter(|&n| n > 0);
    let exact = match asked.value("resourceVersionMatch").as_deref() {
        None | Some("") => false,
        Some("NotOlderThan") => false,
        Some("Exact") => true,
        // The member's 400.
        Some(_) => return None,
    };
    let (read, limit) = match asked.value("resourceVersion").as_deref() {
        // A match needs a resourceVersion (the member's 400).
        None | Some("")
            if asked
                .value("resourceVersionMatch")
                .is_some_and(|m| !m.is_empty()) =>
        {
            return None
        }
        None | Some("") => (Read::Consistent, limit),
        // The watch cache at 0 ignores a limit.
        Some("0") if !exact => (Read::Any, None),
        Some(_) if exact => return None,
        Some(_) => (
            Read::NotOlderThan(asked.number("resourceVersion", 19)??),
            limit,
        ),
    };
    asked.number("timeoutSeconds", 9)?;
    Some(ListPlan {
        key: asked.key,
        read,
        limit,
        labels: asked.labels,
        fields: asked.fields,
    })
}

/// Serves a planned LIST from its hub (how that ended), or says it must be proxied (None:
/// nothing was written).
pub(crate) async fn serve(
    ctx: &ShardWatches,
    proxied: &Proxied<'_>,
    plan: ListPlan,
    caller: Caller,
    client: &mut impl FleetClient,
) -> Option<Result<(), Failure>> {
    if !Box::pin(access::may(ctx, proxied, &plan.key, "list", caller)).await {
        return None;
    }
    let hub = hub_for(ctx, proxied.cluster, &plan.key, caller, None)?;
    let _joined = hub.join();
    if !ready(&hub).await {
        return None;
    }
    // More items than the limit now: the member's to page, without asking it anything first.
    if too_many(&hub, &plan) {
        return None;
    }
    let needed = match plan.read {
        Read::Any => None,
        Read::NotOlderThan(rv) => Some(rv),
        Read::Consistent => match Box::pin(hub.member_version(ctx, caller)).await {
            Some(rv) => Some(rv),
            None => return None,
        },
    };
    if let Some(rv) = needed {
        if !caught_up(&hub, rv).await {
            return None;
        }
    }
    let list = selected(&hub, &plan)?;
    if plan
        .limit
        .is_some_and(|limit| list.objects.len() as u64 > limit)
    {
        return None;
    }
    Some(write(client, list).await)
}

/// Whether the hub holds more items the LIST selects than its limit.
fn too_many(hub: &Hub, plan: &ListPlan) -> bool {
    let Some(limit) = plan.limit else {
        return false;
    };
    let state = hub.state.borrow();
    let selected = in_scope(&state.objects, &plan.key.namespace)
        .filter(|event| plan.selects(event))
        .take(
            usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
        )
        .count();
    selected as u64 > limit
}

/// The objects of `namespace` (every one when empty), in order: the keys from `NAMESPACE/` on,
/// which sort together.
fn in_scope<'o>(
    objects: &'o super::hub::Objects,
    namespace: &str,
) -> impl Iterator<Item = &'o Arc<Event>> + 'o {
    let from: Box<str> = if namespace.is_empty() {
        "".into()
    } else {
        format!("{namespace}/").into()
    };
    objects
        .range::<str, _>((Bound::Included(&*from), Bound::Unbounded))
        .take_while(move |(key, _)| key.starts_with(&*from))
        .map(|(_, event)| event)
}

impl ListPlan {
    fn selects(&self, event: &Event) -> bool {
        self.labels.matches(&event.labels) && self.fields.matches(&event.namespace, &event.name)
    }
}

/// Waits, within [`START_WAIT`], for a starting hub's first list; whether it is ready.
async fn ready(hub: &Rc<Hub>) -> bool {
    let waited = crate::runtime::timeout(START_WAIT, async {
        loop {
            let seen = hub.signal.epoch();
            match hub.phase() {
                Phase::Starting => hub.signal.after(seen).await,
                phase => return phase == Phase::Ready,
            }
        }
    });
    waited.await.unwrap_or(false)
}

/// Waits, within [`CATCH_UP`], for the hub to have seen resourceVersion `rv`.
async fn caught_up(hub: &Rc<Hub>, rv: u64) -> bool {
    let waited = crate::runtime::timeout(CATCH_UP, async {
        loop {
            let seen = hub.signal.epoch();
            let (phase, last_rv) = {
                let state = hub.state.borrow();
                (state.phase, state.last_rv)
            };
            if phase != Phase::Ready {
                return false;
            }
            if last_rv >= rv {
                return true;
            }
            hub.signal.after(seen).await;
        }
    });
    waited.await.unwrap_or(false)
}

/// What a LIST answers: the list's head (kind, apiVersion, resourceVersion) and the objects
/// that the namespace and selectors select, in the member's order, taken from the hub at once
/// (a reference each: the hub goes on while they are written). None when the hub does not know
/// the list's kind.
struct Selected {
    head: BytesMut,
    objects: Vec<Arc<Event>>,
    /// A Table's: where its `Age` column is (None: it has none), computed again for each row.
    table: Option<Option<usize>>,
}

fn selected(hub: &Hub, plan: &ListPlan) -> Option<Selected> {
    let state = hub.state.borrow();
    let (kind, api_version) = state.list_kind.as_ref()?;
    let mut head = BytesMut::with_capacity(PIECE);
    head.put_slice(b"{\"kind\":");
    put_json(&mut head, kind);
    head.put_slice(b",\"apiVersion\":");
    put_json(&mut head, api_version);
    head.put_slice(b",\"metadata\":{\"resourceVersion\":\"");
    head.put_slice(state.last_rv.to_string().as_bytes());
    let table = match plan.key.form {
        Form::Json => {
            head.put_slice(b"\"},\"items\":[");
            None
        }
        Form::Table => {
            let columns = state.columns.as_ref()?;
            head.put_slice(b"\"},\"columnDefinitions\":");
            head.put_slice(columns);
            head.put_slice(b",\"rows\":[");
            Some(table::age_column(columns))
        }
    };
    let objects = in_scope(&state.objects, &plan.key.namespace)
        .filter(|event| plan.selects(event))
        .cloned()
        .collect();
    Some(Selected {
        head,
        objects,
        table,
    })
}

fn put_json(out: &mut BytesMut, text: &str) {
    let quoted = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
    out.put_slice(quoted.as_bytes());
}

/// Writes the LIST: its head, then its items in pieces of about [`PIECE`] bytes, copied from
/// the objects' encoded JSON.
async fn write(client: &mut impl FleetClient, list: Selected) -> Result<(), Failure> {
    client.head("application/json", &[]).await?;
    let mut out = list.head;
    let now = time::OffsetDateTime::now_utc();
    for (n, event) in list.objects.iter().enumerate() {
        if n > 0 {
            out.put_u8(b',');
        }
        match list.table {
            None => {
                for part in event.item() {
                    out.put_slice(part);
                }
            }
            // A hub's one-row Tables are its own encoding: each has its row.
            Some(age) => match table::row(event.object(), age, now) {
                Some(row) => out.put_slice(&row),
                None => out.put_slice(b"{}"),
            },
        }
        if out.len() >= PIECE {
            client.body(out.split().freeze()).await?;
        }
    }
    out.put_slice(b"]}\n");
    client.body(out.freeze()).await?;
    client.end().await
}
