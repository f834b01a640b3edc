//! Shared watches (`spec.sharedWatches`, docs/watches.md): one member watch per (cluster route,
//! resource, namespace scope, form) on each shard, or for the whole gateway, feeds every client
//! watch that asks for it.
//!
//! - [`plan`] says whether a decided, proxied WATCH can be shared: its resource is listed, the
//!   cluster impersonates (the member would otherwise see the gateway, or the client's own
//!   token), and everything the client asked for is something the gateway serves exactly as the
//!   member would: `resourceVersion` (a number, or none), `timeoutSeconds`,
//!   `allowWatchBookmarks`, a label selector and a field selector on `metadata.name` /
//!   `metadata.namespace` (over a resource in `spec.cache`, on any field: `field_filter`), JSON or
//!   kubectl's Table form. Anything else (another field of a resource not cached, a
//!   `sendInitialEvents`, `includeObject`, protobuf, an unreadable selector) is not shared: the
//!   watch goes to the member as it came, and the member's answer (its 400, its watch-list
//!   semantics) reaches the client unchanged.
//! - `access`: the member is asked, as the user, whether the user may watch that resource in
//!   that scope (a SelfSubjectAccessReview, cached per shard for [`access::TTL`]). A user it
//!   refuses is not shared either: the watch goes to the member, which answers its own 403.
//! - `hub`: the member watch, its ring of recent events and the objects it holds now.
//! - `client`: one client's cursor over a hub, filtered by its selectors.
//! - `across`: per gateway (`scope: Gateway`), a key's hubs on other shards than its home are fed
//!   by the home's hub over a lock-free channel.
//! - `list`: a LIST of a resource in `spec.cache` served from its hub's objects (docs/cache.md);
//!   [`plan`] says which, read as a watch's request is ([`Planned::List`]).
//!
//! Without locks: a hub lives on the shard that opened it and serves that shard's clients only
//! (per shard, the member holds one watch per key per shard; per gateway, one). Called by the
//! pipeline (`handle`) for a `Decision::Proxy` whose verb is `watch`, for both front-ends.

pub mod access;
pub mod across;
mod client;
pub mod hub;
pub mod list;
pub mod selector;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate_config_watcher::request_info::{self, KubeVerb, RequestInfo};
use fleetgate_config_watcher::{ClusterRoute, Limits, RouteTable, SharedWatchScope};

use crate::auth::Decided;
use crate::exchange::Failure;
use crate::exchange::ShardExchange;
use crate::fleet::FleetClient;
use crate::request::{Peer, Proxied};
pub(crate) use client::Follower;
use selector::{AnyFields, FieldFilter, LabelSelector, Within};

/// What identifies one shared watch on a shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HubKey {
    pub cluster: Arc<str>,
    /// The route's id: a changed cluster spec (credentials, server) gets a hub of its own.
    pub route: u64,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// Empty: every namespace.
    pub namespace: String,
    pub form: Form,
}

/// How the member encodes the events of a shared watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// `application/json` objects.
    Json,
    /// `meta.k8s.io/v1` Tables, as `kubectl get -w` asks (one row per event).
    Table,
}

/// The Accept kubectl sends for `get -w` (fixtures: kubectl-get-watch.trace.txt).
const KUBECTL_TABLE_ACCEPT: &[u8] = b"application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
/// The Table form as the hub asks the member for it.
pub(crate) const TABLE_ACCEPT: &[u8] = b"application/json;as=Table;v=v1;g=meta.k8s.io";

/// Where a client starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// No resourceVersion, or `0`: the objects the hub holds as ADDED events, then changes.
    Current,
    /// After this resourceVersion.
    After(u64),
}

/// A client watch that can be shared, and what it asked for.
#[derive(Debug, Clone)]
pub struct Plan {
    pub key: HubKey,
    pub start: Start,
    pub labels: LabelSelector,
    pub fields: FieldFilter,
    /// The client's selectors as query pairs for a member request (`&labelSelector=..`), each
    /// value percent-encoded again from what was parsed; empty without selectors.
    pub selectors: String,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

/// The query parameters a shared watch serves; any other makes the watch the client's own.
const SERVED_PARAMS: &[&[u8]] = &[
    b"watch",
    b"resourceVersion",
    b"resourceVersionMatch",
    b"timeoutSeconds",
    b"allowWatchBookmarks",
    b"labelSelector",
    b"fieldSelector",
    b"timeout",
];

/// The query parameters a LIST from a hub's objects serves (`list`); any other (`includeObject`,
/// say) sends the LIST to the member.
const LISTED_PARAMS: &[&[u8]] = &[
    b"watch",
    b"continue",
    b"resourceVersion",
    b"resourceVersionMatch",
    b"timeoutSeconds",
    b"limit",
    b"labelSelector",
    b"fieldSelector",
    b"timeout",
];

/// A request the gateway serves from a hub instead of its member.
pub enum Planned {
    /// A watch shared through its hub.
    Watch(Plan),
    /// A LIST from its hub's objects (`spec.cache`).
    List(list::ListPlan),
}

/// What a watch or a LIST served from a hub asked for, read the same way for both.
struct Asked<'q> {
    key: HubKey,
    query: &'q [u8],
    labels: LabelSelector,
    fields: FieldFilter,
    /// The selectors as query pairs for a member request, each value percent-encoded again.
    selectors: String,
}

impl Asked<'_> {
    fn value(&self, key: &str) -> Option<String> {
        crate::fleet::token::query_value(self.query, key)
    }

    /// A boolean parameter as Go's `strconv.ParseBool` reads it (absent: false); None when
    /// it is none of those.
    fn flag(&self, key: &str) -> Option<bool> {
        match self.value(key).as_deref() {
            None => Some(false),
            Some("true" | "1" | "t" | "T" | "TRUE" | "True") => Some(true),
            Some("false" | "0" | "f" | "F" | "FALSE" | "False") => Some(false),
            Some(_) => None,
        }
    }

    /// A whole number of at most `digits` digits (absent or empty: None inside Some).
    fn number(&self, key: &str, digits: usize) -> Option<Option<u64>> {
        match self.value(key).as_deref() {
            None | Some("") => Some(None),
            Some(n) if n.bytes().all(|b| b.is_ascii_digit()) && n.len() <= digits => {
                Some(Some(n.parse().ok()?))
            }
            Some(_) => None,
        }
    }
}

/// Whether `proxied` (a request `decide` routed to a member) is a watch this gateway shares, or
/// a LIST it serves from a hub's objects, and how; None: it goes to the member as it came.
/// `accept` is the client's `Accept` field values.
pub fn plan<'a>(
    table: &RouteTable,
    proxied: &Proxied<'_>,
    accept: impl Iterator<Item = &'a [u8]>,
) -> Option<Planned> {
    let target = Target::of(proxied);
    match target.info.verb {
        KubeVerb::Watch => plan_watch(table, target, accept).map(Planned::Watch),
        KubeVerb::List => plan_list(table, target, accept).map(Planned::List),
        _ => None,
    }
}

/// A LIST of a resource in `spec.cache` that its hub can serve as the member would.
fn plan_list<'a>(
    table: &RouteTable,
    target: Target<'_>,
    accept: impl Iterator<Item = &'a [u8]>,
) -> Option<list::ListPlan> {
    let info = target.info;
    let cache = table.gateway().cache.as_ref()?;
    cache.caches(info.api_group, info.api_version, info.resource)?;
    list::plan(shareable(table, target, accept, LISTED_PARAMS)?)
}

/// What shared watches and the cache read of a request to a member: the cluster, who the member
/// is told about, and the request.
#[derive(Clone, Copy)]
pub(crate) struct Target<'t> {
    pub cluster: &'t Arc<ClusterRoute>,
    pub identity: &'t Decided,
    pub info: &'t RequestInfo<'t>,
    /// The kube path and the raw query (its `?` on or not).
    pub rest: &'t [u8],
    pub query: &'t [u8],
}

impl<'t> Target<'t> {
    pub fn of(proxied: &'t Proxied<'t>) -> Target<'t> {
        Target {
            cluster: proxied.cluster,
            identity: &proxied.identity,
            info: &proxied.info,
            rest: proxied.rest,
            query: proxied.query,
        }
    }
}

/// What every request served from a hub needs: a collection whose watches are shared, on a
/// cluster that impersonates the user, in a form the hub keeps, with only `params` in its query,
/// each readable as the member would read it, and selectors the gateway reads as the member.
fn shareable<'q, 'a>(
    table: &RouteTable,
    target: Target<'q>,
    mut accept: impl Iterator<Item = &'a [u8]>,
    params: &[&[u8]],
) -> Option<Asked<'q>> {
    let settings = table.gateway().shared_watches.as_ref()?;
    let info = target.info;
    if !info.is_resource_request
        || !info.classified
        || !info.subresource.is_empty()
        || !info.name.is_empty()
        || !settings.shares(info.api_group, info.api_version, info.resource)
    {
        return None;
    }
    // The legacy `/api/v1/watch/...` paths: not shared.
    if !target.rest.ends_with(info.resource.as_bytes()) {
        return None;
    }
    let cluster = target.cluster;
    // The member must see the user (impersonated), and the gateway must have credentials of
    // its own for the shared watch.
    if !cluster.impersonation || cluster.pass_through || target.identity.pass_through {
        return None;
    }
    target.identity.identity.as_ref()?;
    let form = match (accept.next(), accept.next()) {
        (None, _) => Form::Json,
        (Some(value), None) => match value.trim_ascii() {
            b"application/json" | b"*/*" | b"application/json, */*" => Form::Json,
            KUBECTL_TABLE_ACCEPT => Form::Table,
            _ => return None,
        },
        _ => return None,
    };
    let query = target.query.strip_prefix(b"?").unwrap_or(target.query);
    let mut seen: Vec<&[u8]> = Vec::new();
    for pair in query.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
        let key = pair.split(|b| *b == b'=').next().unwrap_or(pair);
        if !params.contains(&key) || seen.contains(&key) {
            return None;
        }
        // A pair Go's `url.Query()` drops (a `;`, a broken escape) or reads as bytes that are no
        // text: the member's reading of it is the member's own, so the request is too.
        let readable = request_info::go_keeps(pair)
            && String::from_utf8(request_info::Unescaped::new(pair).collect()).is_ok();
        if !readable {
            return None;
        }
        seen.push(key);
    }
    let value = |key: &str| crate::fleet::token::query_value(query, key);
    // Each selector the client gave, parsed, and passed on as it was parsed.
    let mut selectors = String::new();
    let mut selector = |key: &str| {
        let text = value(key)?;
        selectors.push_str(&query_pair(key, &text));
        Some(text)
    };
    let labels = match selector("labelSelector") {
        None => LabelSelector::everything(),
        Some(text) => LabelSelector::parse(&text).ok()?,
    };
    let fields = match selector("fieldSelector") {
        None => FieldFilter::default(),
        Some(text) => field_filter(table, info, form, &text)?,
    };
    Some(Asked {
        key: HubKey {
            cluster: Arc::clone(&cluster.name),
            route: cluster.id,
            group: info.api_group.to_owned(),
            version: info.api_version.to_owned(),
            resource: info.resource.to_owned(),
            namespace: info.namespace.to_owned(),
            form,
        },
        query,
        labels,
        fields,
        selectors,
    })
}

/// How a shared watch or a cached LIST applies the field selector `text` of a request for
/// `info`'s resource in `form`; None: the member's to answer, as it came.
///
/// - On `metadata.name` / `metadata.namespace` where the member serves them: from each event's
///   name and namespace, for every shared resource.
/// - Any other field of a resource in `spec.cache`, whether the member serves it or not
///   (docs/cache.md): read from each object's JSON, a field the member serves as the member reads
///   it. Its hub holds every object of its key, so the watch and the LIST filter them all. A
///   Table (kubectl's form) carries only the objects' metadata: another field of a Table LIST is
///   read from the JSON form's hub beside it (a Table watch with one is the member's).
/// - A selector kube's grammar refuses, or any field elsewhere: the member's (its 400 for a
///   field it does not serve).
fn field_filter(
    table: &RouteTable,
    info: &RequestInfo<'_>,
    form: Form,
    text: &str,
) -> Option<FieldFilter> {
    let any = selector::parse_any(text).ok()?;
    let (group, resource) = (info.api_group, info.resource);
    let member_answers = any
        .paths()
        .all(|path| selector::member::member_supports(group, resource, path.as_str()));
    if member_answers {
        if let Some(metadata) = any.metadata_only() {
            return Some(FieldFilter::Metadata(metadata));
        }
    }
    let cached = table
        .gateway()
        .cache
        .as_ref()
        .is_some_and(|cache| cache.caches(group, info.api_version, resource).is_some());
    if !cached {
        return None;
    }
    let within = match form {
        Form::Json => Within::Object,
        Form::Table => Within::TableRow,
    };
    let fields = AnyFields::new(any.clone(), group, resource, within);
    // A Table's rows carry the objects' metadata only: another field is read from the JSON
    // form's objects beside them.
    let beside = form == Form::Table && fields.roots().any(|root| root != "metadata");
    let fields = match beside {
        true => AnyFields::new(any, group, resource, Within::Object),
        false => fields,
    };
    Some(FieldFilter::Any {
        fields: Box::new(fields),
        member_answers,
        beside,
    })
}

/// A watch [`shareable`], and where it starts.
fn plan_watch<'a>(
    table: &RouteTable,
    target: Target<'_>,
    accept: impl Iterator<Item = &'a [u8]>,
) -> Option<Plan> {
    let asked = shareable(table, target, accept, SERVED_PARAMS)?;
    // A Table watch's events carry no other field than metadata: the member's to answer.
    if !asked.flag("watch")? || asked.fields.reads_beside() {
        return None;
    }
    // resourceVersionMatch means nothing to a watch at 1.24 unless it is empty.
    if asked
        .value("resourceVersionMatch")
        .is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    let start = match asked.value("resourceVersion").as_deref() {
        None | Some("") | Some("0") => Start::Current,
        // The member answers an unreadable resourceVersion itself (a 500).
        Some(_) => Start::After(asked.number("resourceVersion", 19)??),
    };
    // A Table's Age cell is the member's at the time it rendered: initial events from the hub's
    // state would show stale ages. kubectl always starts from its list's resourceVersion.
    if asked.key.form == Form::Table && start == Start::Current {
        return None;
    }
    let timeout = asked
        .number("timeoutSeconds", 9)?
        .filter(|&secs| secs > 0)
        .map(Duration::from_secs);
    let bookmarks = asked.flag("allowWatchBookmarks")?;
    Some(Plan {
        key: asked.key,
        start,
        labels: asked.labels,
        fields: asked.fields,
        selectors: asked.selectors,
        bookmarks,
        timeout,
    })
}

/// `&KEY=VALUE` for a member request's query, every byte of `value` (a client's) but ASCII
/// letters and digits percent-encoded: nothing the client wrote can end the pair, add another
/// or leave the query.
fn query_pair(key: &str, value: &str) -> String {
    let encoded = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC);
    format!("&{key}={encoded}")
}

/// The client's side of a request, as the member's review and the hub's requests need it.
#[derive(Clone, Copy)]
pub struct Caller {
    pub peer: Peer,
    pub limits: Limits,
    pub started: Instant,
}

fn no_connection_fields(_: &[u8]) -> bool {
    false
}

/// What the exchange needs of a client, for the requests the gateway makes of a member for a
/// shared watch (the access review as the user, the hub's list and watch as itself).
pub(crate) struct OwnRequests {
    conn: crate::auth::ConnectionAuth,
}

impl OwnRequests {
    pub fn new() -> Self {
        OwnRequests {
            conn: crate::auth::ConnectionAuth::new(&crate::auth::ClientIdentity::anonymous()),
        }
    }

    pub fn request(&self, caller: Caller) -> crate::fleet::ClientRequest<'_> {
        crate::fleet::ClientRequest {
            // The header fields the gateway's own requests carry of a client: none.
            headers: &[],
            conn: &self.conn,
            connection_named: &no_connection_fields,
            peer: caller.peer,
            limits: caller.limits,
            started: caller.started,
        }
    }
}

/// How [`serve`] ended.
// A value of a moment, matched as it returns: boxing the follower would cost every shared watch
// an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Served {
    /// Not shared after all (the member refused the user, the hub could not start, the client's
    /// resourceVersion is older than anything the hub saw): nothing was written; proxy it.
    Proxy,
    /// Served; the client's watch has ended (cleanly, or with this failure) before it followed
    /// its hub (a 410, a client that left).
    Done(Result<(), Failure>),
    /// Positioned in its hub: [`Follower::run`] serves the rest of the watch, and needs nothing
    /// of the request.
    Follow(Follower),
}

/// Admits a planned shared watch and positions it in its hub, or says it must be proxied.
pub(crate) async fn serve(
    ctx: &ShardWatches,
    proxied: &Proxied<'_>,
    plan: Plan,
    caller: Caller,
    client: &mut impl FleetClient,
) -> Served {
    // Boxed: the access review is a whole member request, and a future that held it inline would
    // keep its room for as long as the client watches.
    if !Box::pin(access::may(
        ctx,
        proxied.cluster,
        &proxied.identity,
        &plan.key,
        "watch",
        caller,
    ))
    .await
    {
        return Served::Proxy;
    }
    // Where a hub this watch starts replays from. Not for a label-selecting client: replayed
    // events carry no labels-before, so it would catch up from the member anyway
    // (`client::follow`); nor for a selector on any field, which starts from the hub's list on.
    let from = match plan.start {
        Start::After(rv) if plan.labels.is_everything() && !plan.fields.reads_changing_fields() => {
            Some(rv)
        }
        _ => None,
    };
    let Some(hub) = hub_for(ctx, proxied.cluster, &plan.key, caller, from) else {
        return Served::Proxy;
    };
    client::position(ctx, hub, plan, caller, client).await
}

/// The shared watches' part of the shard context: the shard's hubs and the members' answers on
/// who may watch what, over the exchange's part. Built by `server::shard`; a hub's member watch
/// holds it (an `Rc`) for as long as the hub runs.
pub struct ShardWatches {
    /// What the shard's requests to members share.
    pub exchange: Rc<ShardExchange>,
    /// The shard's shared watches, by key.
    pub shared_watches: SharedWatches,
    /// The members' answers on who may watch what (`access`), for a short while.
    pub watch_reviews: access::ReviewCache,
    /// This part itself, for the hubs a request starts (they outlive it).
    pub me: std::rc::Weak<ShardWatches>,
}

/// The shard's hubs, by key.
#[derive(Default)]
pub struct SharedWatches {
    hubs: RefCell<HashMap<HubKey, Rc<hub::Hub>>>,
}

impl SharedWatches {
    /// Hubs open on this shard (for tests and metrics).
    pub fn open(&self) -> usize {
        self.hubs.borrow().len()
    }

    pub(crate) fn remove(&self, key: &HubKey, hub: &Rc<hub::Hub>) {
        let mut hubs = self.hubs.borrow_mut();
        if hubs.get(key).is_some_and(|h| Rc::ptr_eq(h, hub)) {
            hubs.remove(key);
        }
    }
}

/// The hub for `key` on this shard, started if there is none (replaying from `from`, the
/// resourceVersion its first client starts after, when that is older than the hub's list); None
/// when it failed recently (its member refused the gateway's own list, say).
fn hub_for(
    ctx: &ShardWatches,
    cluster: &Arc<ClusterRoute>,
    key: &HubKey,
    caller: Caller,
    from: Option<u64>,
) -> Option<Rc<hub::Hub>> {
    if let Some(hub) = ctx.shared_watches.hubs.borrow().get(key) {
        return (!hub.failed()).then(|| Rc::clone(hub));
    }
    let shard = ctx.me.upgrade()?;
    // Per gateway, a key's hub on another shard than its home is fed by the home's.
    let scope = ctx
        .exchange
        .table
        .load()
        .gateway()
        .shared_watches
        .as_ref()
        .map(|s| s.scope);
    let fed = match scope {
        Some(SharedWatchScope::Gateway) => {
            let home = across::home(key, ctx.exchange.workers);
            (home != ctx.exchange.shard)
                .then(|| across::subscribe(home, key, cluster, caller, from))
                .flatten()
        }
        Some(SharedWatchScope::Shard) | None => None,
    };
    let hub = hub::Hub::start(shard, Arc::clone(cluster), key.clone(), caller, fed, from);
    ctx.shared_watches
        .hubs
        .borrow_mut()
        .insert(key.clone(), Rc::clone(&hub));
    Some(hub)
}

#[cfg(test)]
mod tests {
    use super::query_pair;
    use proptest::prelude::*;

    #[test]
    fn a_hostile_selector_stays_one_query_value() {
        for hostile in [
            "app=web&resourceVersion=1",
            "app=web#x",
            "app in (a, b)",
            "app=web HTTP/1.1\r\nHost: evil",
            "a%26b=c",
            "app=wéb",
        ] {
            let pair = query_pair("labelSelector", hostile);
            let value = pair.strip_prefix("&labelSelector=").unwrap();
            assert!(
                value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'%'),
                "{pair}"
            );
            let decoded = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .unwrap();
            assert_eq!(decoded, hostile);
        }
    }

    proptest! {
        #[test]
        fn any_value_is_encoded_whole_and_decodes_back(value in any::<String>()) {
            let pair = query_pair("fieldSelector", &value);
            let encoded = pair.strip_prefix("&fieldSelector=").unwrap();
            prop_assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'%'));
            let decoded = percent_encoding::percent_decode_str(encoded).decode_utf8().unwrap();
            prop_assert_eq!(decoded, value.as_str());
        }
    }
}
