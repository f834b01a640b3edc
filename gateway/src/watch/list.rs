//! LISTs served from a hub's objects (`spec.cache`, docs/cache.md): the hub of a shared watch
//! holds the member's objects of its collection, each as its encoded JSON, so a LIST of a cached
//! resource is answered by copying bytes, with kube-apiserver's watch-cache semantics:
//!
//! - `resourceVersion=0` (client-go's informers, kube-rs's `any_semantic` watchers): at once, from what the hub holds (a
//!   `limit` is ignored, as kube-apiserver 1.24's watch cache ignores it at 0).
//! - no `resourceVersion` (a consistent read: `kubectl get`, the Python client, kube-rs's
//!   default watcher): the member's
//!   current resourceVersion is asked (a `limit=1` list, one for all the reads waiting:
//!   [`hub::Hub::current_version`]), and the
//!   LIST is served once the hub has seen it, within [`CATCH_UP`]; otherwise by the member.
//! - `resourceVersion=N` (`NotOlderThan`, or no match): once the hub has seen N, within
//!   [`CATCH_UP`]; otherwise by the member, which answers it itself.
//! - `limit` (kubectl sends 500): pages as kube-apiserver's storage pages them (a next page when
//!   any object follows the last one returned; `remainingItemCount` when nothing is filtered),
//!   with kube-apiserver's own continue tokens (`token`): the next page is the cache's while no
//!   object from its start on changed since the token's resourceVersion, else the member's, which
//!   reads the same token (and answers 410 once it expired).
//!
//! A Table (`kubectl get` without `-o`) comes from the hub of Table form, each row's `Age`
//! computed again (`table`). The items are the member's objects in its order (by storage key,
//! `namespace/name`), filtered by the namespace and selectors as the member filters them.
//! A field selector may name any field (`selector::FieldFilter::Any`, read from each object's
//! JSON; a Table's rows carry only metadata, so another field is read from the JSON form's hub
//! of the same key, beside): one the member does not serve is the cache's alone to answer, so a
//! LIST the cache cannot show fresh enough (or a continued page whose objects changed) is
//! answered from what it holds, with a Warning, instead of going to the member.
//! Anything else goes to the member as it came, which answers it exactly:
//! `resourceVersionMatch=Exact`, `includeObject`, a selector kube's grammar refuses, a user the
//! member does not let list (a SelfSubjectAccessReview as the user, `access`, cached as for
//! shared watches), a hub that cannot start.
//! Called by the pipeline (`handle`) for a `Decision::Proxy` whose verb is `list`.

use std::ops::Bound;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};

mod table;
pub mod token;

use super::hub::{Event, Hub, Phase};
use super::selector::{FieldFilter, LabelSelector};
use super::{access, hub_for, plan_list, Asked, Caller, Form, HubKey, ShardWatches, Target};
use crate::auth::Decided;
use crate::exchange::Failure;
use crate::fleet::{Cached, CachedPages, ClientRequest, FleetClient};
use fleetgate_config_watcher::request_info::RequestInfo;
use fleetgate_config_watcher::ClusterRoute;

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
    /// The client's `limit`: at most this many items a page, the next page's continue token
    /// in kube-apiserver's own form.
    pub limit: Option<u64>,
    /// The `limit` as asked, also where the read ignores it (at resourceVersion 0).
    pub asked_limit: Option<u64>,
    /// The page after a continue token's.
    pub resume: Option<token::Continue>,
    /// Whether the LIST waits for its hub's first list (a LIST through `/clusters/{name}`), or
    /// goes to the member meanwhile (a fleet view's member page: its list says so).
    pub patient: bool,
    pub labels: LabelSelector,
    pub fields: FieldFilter,
}

/// A LIST of a cached resource that the hub can serve exactly as the member would; None: the
/// member's.
pub(super) fn plan(asked: Asked<'_>) -> Option<ListPlan> {
    if asked.flag("watch")? {
        return None;
    }
    let asked_limit = asked.number("limit", 19)?.filter(|&n| n > 0);
    let limit = asked_limit;
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
    // A page after another: at its list's resourceVersion, which the request may not name (the
    // member's 400).
    let (read, resume) = match asked.value("continue").filter(|c| !c.is_empty()) {
        None => (read, None),
        Some(_) if read != Read::Consistent => return None,
        // Not waited for: a page of the cache's own list is at a version the hub has seen; a
        // later one is the member's list's (the member's to continue).
        Some(text) => (Read::Any, Some(token::read(&text)?)),
    };
    Some(ListPlan {
        key: asked.key,
        read,
        limit,
        asked_limit,
        resume,
        patient: true,
        labels: asked.labels,
        fields: asked.fields,
    })
}

/// Serves a planned LIST from its hub (how that ended), or says it must be proxied (None:
/// nothing was written).
pub(crate) async fn serve(
    ctx: &ShardWatches,
    target: Target<'_>,
    plan: ListPlan,
    caller: Caller,
    client: &mut impl FleetClient,
) -> Result<Result<(), Failure>, Unserved> {
    let list = prepared(ctx, target, &plan, caller).await;
    ctx.exchange.shard_metrics.cache_list(list.is_ok());
    let list = list?;
    let warnings: Vec<String> = list.warning.iter().cloned().collect();
    Ok(write(client, list, &warnings).await)
}

/// Why a LIST is the member's to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// Not the cache's (the user refused, the hub failed, too fresh a read, a changed page).
    Member,
    /// Its hub is still listing, and the LIST does not wait ([`ListPlan::patient`]).
    NotSynced,
}

/// The LIST as its hub answers it, once the member lets the user list, the hub holds the
/// collection and is as fresh as the LIST asks; None: the member's to answer.
async fn prepared(
    ctx: &ShardWatches,
    target: Target<'_>,
    plan: &ListPlan,
    caller: Caller,
) -> Result<Selected, Unserved> {
    use Unserved::Member;
    let allowed = access::may(
        ctx,
        target.cluster,
        target.identity,
        &plan.key,
        "list",
        caller,
    );
    if !Box::pin(allowed).await {
        return Err(Member);
    }
    let hub = hub_for(ctx, target.cluster, &plan.key, caller, None).ok_or(Member)?;
    let _joined = hub.join();
    // Started (or still listing): for the next LIST, when this one does not wait.
    if !plan.patient && hub.phase() == Phase::Starting {
        return Err(Unserved::NotSynced);
    }
    if !ready(&hub).await {
        return Err(Member);
    }
    let needed = match plan.read {
        Read::Any => None,
        Read::NotOlderThan(rv) => Some(rv),
        Read::Consistent => Some(
            Box::pin(hub.current_version(ctx, caller))
                .await
                .ok_or(Member)?,
        ),
    };
    // A Table's field selector on another field than metadata reads the JSON form's objects:
    // that hub too must hold the collection, as fresh as asked.
    let beside = match plan.fields.reads_beside() {
        false => None,
        true => {
            let key = HubKey {
                form: Form::Json,
                ..plan.key.clone()
            };
            let json = hub_for(ctx, target.cluster, &key, caller, None).ok_or(Member)?;
            let joined = json.join();
            if !ready(&json).await {
                return Err(Member);
            }
            Some((json, joined))
        }
    };
    // A field selector the member does not serve is the cache's alone to answer: when the cache
    // cannot show it is as fresh as asked, it answers with what it holds, and says so.
    let only_here = !plan.fields.member_answers();
    let mut warning = None;
    if let Some(rv) = needed {
        let beside_fresh = match &beside {
            Some((json, _)) => caught_up(json, rv).await,
            None => true,
        };
        if !(caught_up(&hub, rv).await && beside_fresh) {
            if !only_here {
                return Err(Member);
            }
            let held = hub.state.borrow().last_rv;
            warning = Some(format!(
                "listed from the gateway's cache as of resourceVersion {held}, which has not yet \
                 seen resourceVersion {rv}: the member does not serve this field selector"
            ));
        }
    }
    // A page after another is the cache's only while nothing after its start changed since its
    // list's resourceVersion: the objects then are those of the list the page continues.
    let mut current = false;
    if let Some(resume) = &plan.resume {
        if !unchanged_since(&hub, &plan.key.namespace, resume) {
            if !only_here {
                return Err(Member);
            }
            // As kube-apiserver's inconsistent continue: the objects from the page's start on as
            // they are now.
            current = true;
            warning = Some(
                "objects changed since the list this page continues: this page lists them as \
                 they are now (the member does not serve this field selector)"
                    .into(),
            );
        }
    }
    let beside = beside.as_ref().map(|(json, _)| &**json);
    let mut list = selected(&hub, beside, plan, current).ok_or(Member)?;
    list.warning = warning;
    Ok(list)
}

/// The objects of `namespace` (every one when empty) in order, from `start` (one of our keys)
/// on: the keys from `NAMESPACE/` on, which sort together.
fn in_scope<'o>(
    objects: &'o super::hub::Objects,
    namespace: &str,
    start: Option<&str>,
) -> impl Iterator<Item = (&'o str, &'o Arc<Event>)> + 'o {
    let prefix: Box<str> = scope_prefix(namespace).into();
    let from: Box<str> = match start {
        Some(start) if *start > *prefix => start.into(),
        _ => prefix.clone(),
    };
    objects
        .range::<str, _>((Bound::Included(&*from), Bound::Unbounded))
        .take_while(move |(key, _)| key.starts_with(&*prefix))
        .map(|(key, event)| (&**key, event))
}

/// What every key of `namespace`'s objects starts with (`NAMESPACE/`; nothing for every
/// namespace).
fn scope_prefix(namespace: &str) -> String {
    if namespace.is_empty() {
        String::new()
    } else {
        format!("{namespace}/")
    }
}

/// Our key (`namespace/name`, `/name` when cluster-scoped) from a storage key below the list's
/// scope (`name` in a namespace; `namespace/name`, or `name` when cluster-scoped, across them).
fn our_key(scoped: &str, namespace: &str) -> String {
    if !namespace.is_empty() {
        format!("{namespace}/{scoped}")
    } else if scoped.contains('/') {
        scoped.to_owned()
    } else {
        format!("/{scoped}")
    }
}

/// The storage key below the list's scope of one of our keys.
fn scoped_key<'k>(key: &'k str, namespace: &str) -> &'k str {
    if namespace.is_empty() {
        key.strip_prefix('/').unwrap_or(key)
    } else {
        key.split_once('/').map_or(key, |(_, name)| name)
    }
}

/// Whether the hub's objects from `resume`'s start on are still those of its list: the hub holds
/// every event since its resourceVersion, and none of them is of an object from there on.
fn unchanged_since(hub: &Hub, namespace: &str, resume: &token::Continue) -> bool {
    let state = hub.state.borrow();
    if resume.rv < state.floor_rv || resume.rv > state.last_rv {
        return false;
    }
    let start = our_key(&resume.start, namespace);
    let prefix = scope_prefix(namespace);
    let from = state.seek(resume.rv);
    (from..state.next_seq())
        .filter_map(|seq| state.at(seq))
        .filter(|event| event.kind != super::hub::Kind::Bookmark)
        .all(|event| {
            let key = super::hub::object_key(event.namespace(), event.name());
            !(key.starts_with(&prefix) && *key >= *start)
        })
}

impl ListPlan {
    /// Whether the object `event` holds is listed; `object` is the same object in the JSON form
    /// when the fields are read there (`beside`: None when that hub does not hold it).
    fn selects(&self, event: &Event, object: Option<&Event>) -> bool {
        let Some(object) = object else {
            return false;
        };
        self.labels.matches(&event.labels())
            && self
                .fields
                .matches(object.namespace(), object.name(), object.object())
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
    /// A Warning for the client: the list is not as fresh as it asked.
    warning: Option<String>,
}

/// The page `plan` asks for from `hub`'s objects, at its continue token's resourceVersion or,
/// when `current` (or without a token), at the newest the hub saw; its field selector read from
/// the objects of the JSON form's hub `beside` when given (a Table's).
fn selected(hub: &Hub, beside: Option<&Hub>, plan: &ListPlan, current: bool) -> Option<Selected> {
    let state = hub.state.borrow();
    let beside = beside.map(|json| json.state.borrow());
    let (kind, api_version) = state.list_kind.as_ref()?;
    let namespace = &plan.key.namespace;
    // The page: the selected objects from the start on, at most `limit`. As kube-apiserver's
    // storage pages, a next page exists when any object (selected or not) follows the last one
    // returned, and the count of those is told when nothing is filtered.
    let start = plan.resume.as_ref().map(|r| our_key(&r.start, namespace));
    let mut scope = in_scope(&state.objects, namespace, start.as_deref());
    let mut objects: Vec<Arc<Event>> = Vec::new();
    let mut last: Option<&str> = None;
    let mut more = false;
    for (key, event) in scope.by_ref() {
        if plan
            .limit
            .is_some_and(|limit| objects.len() as u64 >= limit)
        {
            more = true;
            break;
        }
        let object = match &beside {
            Some(json) => json.objects.get(key).map(|o| &**o),
            None => Some(&**event),
        };
        if plan.selects(event, object) {
            objects.push(Arc::clone(event));
            last = Some(key);
        }
    }
    let list_rv = match &plan.resume {
        Some(resume) if !current => resume.rv,
        _ => state.last_rv,
    };
    let mut head = BytesMut::with_capacity(PIECE);
    head.put_slice(b"{\"kind\":");
    put_json(&mut head, kind);
    head.put_slice(b",\"apiVersion\":");
    put_json(&mut head, api_version);
    head.put_slice(b",\"metadata\":{\"resourceVersion\":\"");
    head.put_slice(list_rv.to_string().as_bytes());
    head.put_u8(b'"');
    if let (true, Some(last)) = (more, last) {
        head.put_slice(b",\"continue\":");
        put_json(
            &mut head,
            &token::write(list_rv, scoped_key(last, namespace)),
        );
        if plan.labels.is_everything() && plan.fields.is_everything() {
            let remaining = 1 + scope.count();
            head.put_slice(b",\"remainingItemCount\":");
            head.put_slice(remaining.to_string().as_bytes());
        }
    }
    let table = match plan.key.form {
        Form::Json => {
            head.put_slice(b"},\"items\":[");
            None
        }
        Form::Table => {
            let columns = state.columns.as_ref()?;
            head.put_slice(b"},\"columnDefinitions\":");
            head.put_slice(columns);
            head.put_slice(b",\"rows\":[");
            Some(table::age_column(columns))
        }
    };
    Some(Selected {
        head,
        objects,
        table,
        warning: None,
    })
}

fn put_json(out: &mut BytesMut, text: &str) {
    let quoted = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
    out.put_slice(quoted.as_bytes());
}

/// Writes the LIST: its head, then its items in pieces of about [`PIECE`] bytes, copied from
/// the objects' encoded JSON.
async fn write(
    client: &mut impl FleetClient,
    list: Selected,
    warnings: &[String],
) -> Result<(), Failure> {
    client.head("application/json", warnings).await?;
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

/// The cache as the fleet view's source of its members' pages (`fleet::CachedPages`): a member
/// page of a cached resource is served as a LIST through `/clusters/{name}` would be.
pub(crate) struct FleetPages<'a> {
    pub ctx: &'a ShardWatches,
    pub caller: Caller,
}

impl CachedPages for FleetPages<'_> {
    fn page<'f>(
        &'f self,
        cluster: &'f Arc<ClusterRoute>,
        identity: &'f Decided,
        info: &'f RequestInfo<'f>,
        rest: &'f [u8],
        query: &'f [u8],
        client: &'f ClientRequest<'f>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Cached> + 'f>> {
        Box::pin(async move {
            let target = Target {
                cluster,
                identity,
                info,
                rest,
                query,
            };
            let table = self.ctx.exchange.table.load();
            let Some(mut plan) = plan_list(&table, target, client.header_values(b"accept")) else {
                return Cached::Member;
            };
            // A field selector the member does not serve waits for the cache: the member would
            // refuse it.
            plan.patient = !plan.fields.member_answers();
            // The fleet view pages each member itself (a probe of one object, then pages of
            // `spec.fleet.pageSize`): at resourceVersion 0 its limit holds here, where the
            // member's watch cache would ignore it; else the view would hold every member's
            // whole list at once before its first byte.
            plan.limit = plan.limit.or(plan.asked_limit);
            let mut page = Gathered::default();
            match serve(self.ctx, target, plan, self.caller, &mut page).await {
                Ok(Ok(())) => Cached::Page(page.body),
                Ok(Err(_)) | Err(Unserved::Member) => Cached::Member,
                Err(Unserved::NotSynced) => Cached::NotSynced,
            }
        })
    }
}

/// A LIST's body gathered whole (a fleet view's member page).
#[derive(Default)]
struct Gathered {
    body: Vec<u8>,
    head_sent: bool,
}

impl FleetClient for Gathered {
    async fn head(&mut self, _content_type: &str, _warnings: &[String]) -> Result<(), Failure> {
        self.head_sent = true;
        Ok(())
    }

    async fn body(&mut self, piece: bytes::Bytes) -> Result<(), Failure> {
        self.body.extend_from_slice(&piece);
        Ok(())
    }

    async fn end(&mut self) -> Result<(), Failure> {
        Ok(())
    }

    async fn gone(&mut self) {
        std::future::pending().await
    }

    fn head_sent(&self) -> bool {
        self.head_sent
    }

    fn keeps_connection(&self) -> bool {
        true
    }
}
