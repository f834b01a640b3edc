//! A WATCH merged across the members of a fleet request, in one task.
//!
//! - **Members.** Each member the request spans is watched as the user ([`follow`], on
//!   `member::watcher`): its stream is split into events, each parsed and handed to the merge
//!   through a bounded queue, so a client that reads slowly slows the members down instead of
//!   growing a buffer. A member whose watch ends (its own timeout, a closed connection) is
//!   watched again from the last resourceVersion it sent; one that cannot be reached is tried
//!   again with backoff, from the same place; one that sends nothing (no event, no bookmark)
//!   past the stall deadline (`member::watcher::STALL_AFTER`) is abandoned and watched again from
//!   there, while the other members' events keep flowing. A 401 or 403 right after a member's
//!   failure (a restarted apiserver whose RBAC cache has not synced) is retried for
//!   `member::watcher::AUTH_GRACE` before the member counts as refusing. Members are always
//!   asked for bookmarks, so that place stays recent.
//! - **Merge.** Every event's object is stamped with its cluster (`page::stamp`: annotations, and
//!   for a Table the CLUSTER cell) and its resourceVersion replaced by the composite one (each
//!   member's latest, by cluster: `token::encode_versions`), so a client resumes the whole
//!   watch from any event. A Table watch's column definitions go out once, CLUSTER first.
//!   Bookmarks are forwarded (with the composite resourceVersion) when the client asked for
//!   them; with `sendInitialEvents`, one `k8s.io/initial-events-end` bookmark follows the
//!   initial events of every member.
//! - **Membership.** The routing table is looked at again every [`RECHECK`] and whenever a
//!   member's route is retired: a cluster that joins the merged kind (or that the user's
//!   AccessPolicies now allow) is watched from its start, so its objects arrive as ADDED events
//!   in the open watch; one that leaves ends its part. A member that becomes unreachable, comes
//!   back, leaves or refuses the watch is told to a client that asked for bookmarks as a BOOKMARK
//!   annotated `fleetgate.io/cluster-state` (other clients are not sent event types they did not
//!   ask for; the gateway's log says it either way).
//! - **Expiry.** A member answering 410 Gone (its resourceVersion expired) ends the whole watch
//!   with that ERROR event, as kube-apiserver does: the client lists again.
//!
//! The watch ends at the client's `timeoutSeconds`, when the shard drains, or when the client
//! goes away. Called by the pipeline (`handle`) for a [`FleetRequest`] whose verb is `watch`.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleetgate_config_watcher::ClusterRoute;
use futures_channel::mpsc;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::SinkExt;
use serde_json::{json, Map, Value};
use tracing::{info, warn};

use super::page::{cluster_column, stamp};
use super::token::{decode_versions, encode_versions, query_count, query_value, rewrite_query};
use super::{bad_request, ClientRequest, FleetClient, View};
use crate::auth::Decided;
use crate::exchange::relay::ResponseSink;
use crate::exchange::ShardExchange;
use crate::exchange::{Answer, Failure};
use crate::member::ask::{self, Ask, Asked, Missed, To};
use crate::member::backoff::Backoff;
use crate::member::watcher::{self, event_version, AfterExpiry, Fault, ShardClock};
use crate::request::{fleet_members, FleetRequest};
use crate::runtime::{self, First};

/// How often the routing table is looked at for clusters that joined or left.
pub const RECHECK: Duration = Duration::from_secs(1);
/// Events queued between the members and the client.
const QUEUE: usize = 64;
/// The annotation on a bookmark that tells a cluster's part changed.
pub const CLUSTER_STATE: &str = "fleetgate.io/cluster-state";
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Where the client asked the watch to start.
enum Start {
    /// No resourceVersion: every member's objects as ADDED events, then changes.
    Unset,
    /// `0`: any recent state, as each member likes.
    Any,
    /// A composite resourceVersion: each member from its own (a member not in it, from its
    /// start).
    From(BTreeMap<String, String>),
}

/// Serves a merged WATCH, until the client's timeoutSeconds, the shard's drain, a member's 410
/// or the client leaving.
pub(crate) async fn watch(
    view: &View<'_>,
    request: &FleetRequest<'_>,
    client: &mut impl FleetClient,
) -> Result<(), Failure> {
    let start = match query_value(request.query, "resourceVersion").as_deref() {
        None | Some("") => Start::Unset,
        Some("0") => Start::Any,
        Some(token) => Start::From(decode_versions(token).map_err(bad_request)?),
    };
    let timeout = query_count(
        request.query,
        "timeoutSeconds",
        "timeoutSeconds is not a whole number",
    )
    .map_err(bad_request)?
    .map(|secs| Duration::from_secs(secs.min(u64::from(u32::MAX))));
    let flag = |key| query_value(request.query, key).is_some_and(|v| v == "true" || v == "1");
    let bookmarks = flag("allowWatchBookmarks");
    let initial_events = flag("sendInitialEvents");

    client.head("application/json", &[]).await?;
    let (notes, mut queue) = mpsc::channel::<Note>(QUEUE);
    let mut merge = Merge {
        versions: match &start {
            Start::From(versions) => versions.clone(),
            _ => BTreeMap::new(),
        },
        columns: None,
        columns_sent: false,
        bookmarks,
        kind: request.kind.kind.clone(),
        api_version: request.kind.group_version(),
        initial_pending: None,
    };
    let mut parts = Parts {
        following: BTreeMap::new(),
        refused: BTreeSet::new(),
        next_id: 0,
        running: FuturesUnordered::new(),
    };
    let first_from = |cluster: &str| -> String {
        match &start {
            Start::Unset => String::new(),
            Start::Any => "0".into(),
            Start::From(versions) => versions.get(cluster).cloned().unwrap_or_default(),
        }
    };
    for (cluster, identity) in &request.members {
        let from = first_from(&cluster.name);
        let id = parts.start(
            view,
            request,
            Arc::clone(cluster),
            clone_decided(identity),
            from,
            &notes,
        );
        if initial_events {
            merge
                .initial_pending
                .get_or_insert_with(BTreeSet::new)
                .insert(id);
        }
    }
    let ctx = view.ctx;
    let mut table = ctx.table.load();
    let mut recheck = Box::pin(runtime::sleep(RECHECK));
    let mut ends: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match timeout {
        Some(timeout) => Box::pin(runtime::sleep(timeout)),
        None => Box::pin(std::future::pending()),
    };
    let mut drain = ctx.drain.started();

    loop {
        let running = &mut parts.running;
        let member_ended = async {
            if running.is_empty() {
                std::future::pending().await
            } else {
                running.next().await
            }
        };
        let members = runtime::race(queue.next(), member_ended);
        let timers = runtime::race(&mut recheck, &mut ends);
        let outside = runtime::race(&mut drain, client.gone());
        let woke = runtime::race(runtime::race(members, timers), outside).await;
        let mut look_again = false;
        match woke {
            First::Left(First::Left(First::Left(Some(note)))) => {
                let Some(cluster) = parts.current(note.id) else {
                    // From a part that has since ended.
                    continue;
                };
                let out = match note.what {
                    What::Event(event) => match merge.event(&cluster, event) {
                        Ok(out) => out,
                        Err(reason) => {
                            warn!(cluster = %cluster, reason, "fleet watch: member's part ended");
                            parts.end(&cluster, true);
                            merge.left(note.id);
                            merge.state(&cluster, "Refused")
                        }
                    },
                    What::Down(reason) => {
                        warn!(cluster = %cluster, %reason, "fleet watch: member unreachable; trying again");
                        merge.state(&cluster, "Unreachable")
                    }
                    What::Up => {
                        info!(cluster = %cluster, "fleet watch: member reachable again");
                        merge.state(&cluster, "Reachable")
                    }
                };
                for piece in out {
                    client.body(piece).await?;
                }
                if let Some(piece) = merge.initial_events_end() {
                    client.body(piece).await?;
                }
            }
            // Every sender is held by `notes`: the queue never ends while the watch runs.
            First::Left(First::Left(First::Left(None))) => {}
            First::Left(First::Left(First::Right(ended))) => match ended {
                Some(Ok(Ended::Expired(id, status))) => {
                    if let Some(cluster) = parts.current(id) {
                        info!(cluster = %cluster, "fleet watch: member's resourceVersion expired (410); the watch ends");
                        client.body(merge.expired(status)).await?;
                        break;
                    }
                }
                Some(Ok(Ended::Refused(id, reason))) => {
                    if let Some(cluster) = parts.current(id) {
                        warn!(cluster = %cluster, %reason, "fleet watch: member refused the watch");
                        parts.end(&cluster, true);
                        merge.left(id);
                        for piece in merge.state(&cluster, "Refused") {
                            client.body(piece).await?;
                        }
                    }
                }
                Some(Ok(Ended::Retired(id))) => {
                    // Still followed (by name) until the table is looked at: the cluster left,
                    // or its route changed and its part goes on from where it was. The table
                    // holding the new route is published before the old one is retired.
                    look_again = parts.current(id).is_some();
                }
                Some(Ok(Ended::QueueClosed)) | Some(Err(_)) | None => {}
            },
            First::Left(First::Right(First::Left(()))) => {
                recheck = Box::pin(runtime::sleep(RECHECK));
                look_again = !Rc::ptr_eq(&ctx.table.load(), &table);
            }
            // The client's timeoutSeconds: the watch ends cleanly.
            First::Left(First::Right(First::Right(()))) => break,
            First::Right(First::Left(())) => break,
            First::Right(First::Right(())) => return Err(Failure::Abort("client went away")),
        }
        if look_again {
            table = ctx.table.load();
            let want = wanted(&table, request, &view.client_request);
            // Clusters that left the kind, the user's reach or the table.
            let gone: Vec<String> = parts
                .following
                .keys()
                .filter(|name| !want.iter().any(|(c, _)| *c.name == ***name))
                .cloned()
                .collect();
            for cluster in gone {
                info!(cluster = %cluster, "fleet watch: cluster left the view");
                if let Some(id) = parts.end(&cluster, false) {
                    merge.left(id);
                }
                merge.versions.remove(&cluster);
                for piece in merge.state(&cluster, "Left") {
                    client.body(piece).await?;
                }
            }
            parts.refused.retain(|(name, route)| {
                want.iter()
                    .any(|(c, _)| *c.name == **name && c.id == *route)
            });
            for (cluster, identity) in want {
                let same = parts
                    .following
                    .get(&*cluster.name)
                    .is_some_and(|f| f.route.id == cluster.id);
                if same
                    || parts
                        .refused
                        .contains(&(cluster.name.to_string(), cluster.id))
                {
                    continue;
                }
                // A new cluster from its start; a changed route from where its part was.
                let joined = !parts.following.contains_key(&*cluster.name);
                parts.end(&cluster.name, false);
                let from = merge
                    .versions
                    .get(&*cluster.name)
                    .cloned()
                    .unwrap_or_default();
                let name = cluster.name.to_string();
                parts.start(view, request, cluster, identity, from, &notes);
                if joined {
                    info!(cluster = %name, "fleet watch: cluster joined the view");
                    for piece in merge.state(&name, "Joined") {
                        client.body(piece).await?;
                    }
                }
            }
        }
    }
    drop(parts);
    client.end().await
}

/// The clusters the request spans in `table` now, each with the identity its member is told
/// about.
fn wanted(
    table: &fleetgate_config_watcher::RouteTable,
    request: &FleetRequest<'_>,
    client_request: &ClientRequest<'_>,
) -> Vec<(Arc<ClusterRoute>, Decided)> {
    let info = &request.info;
    let Some(kind) = table.fleet().kind(info.api_group, info.resource) else {
        return Vec::new();
    };
    let (members, _) = fleet_members(
        table,
        client_request.conn,
        info,
        kind.clusters.iter().filter_map(|name| table.cluster(name)),
        usize::MAX,
        &|| client_request.headers.iter().copied(),
    );
    members
        .into_iter()
        .map(|(cluster, identity)| (Arc::clone(cluster), identity))
        .collect()
}

fn clone_decided(decided: &Decided) -> Decided {
    Decided {
        identity: decided.identity.clone(),
        authenticated: decided.authenticated.clone(),
        pass_through: decided.pass_through,
    }
}

/// What a member's part hands the merge.
struct Note {
    /// The part it came from.
    id: u64,
    what: What,
}

enum What {
    /// One event, parsed.
    Event(Value),
    /// The member could not be reached (its part is tried again).
    Down(String),
    /// It can be again.
    Up,
}

/// How a member's part ended.
enum Ended {
    /// Its resourceVersion expired (410): the ERROR event's Status.
    Expired(u64, Value),
    /// It refused the watch with a 4xx other than 410 and 429 (say, its RBAC): not asked again.
    Refused(u64, String),
    /// Its route was retired (its cluster removed or changed): look at the table again.
    Retired(u64),
    /// The merge is gone.
    QueueClosed,
}

type PartFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Ended> + 'a>>;

/// The members being watched.
struct Parts<'a> {
    /// By cluster name: the part's id and route, and how to stop it.
    following: BTreeMap<String, Following>,
    /// Clusters (and the route) whose member refused the watch: not asked again until the route
    /// changes.
    refused: BTreeSet<(String, u64)>,
    next_id: u64,
    running: FuturesUnordered<Abortable<PartFuture<'a>>>,
}

struct Following {
    id: u64,
    route: Arc<ClusterRoute>,
    abort: AbortHandle,
}

impl<'a> Parts<'a> {
    /// The cluster of part `id`, if it is still followed.
    fn current(&self, id: u64) -> Option<String> {
        self.following
            .iter()
            .find(|(_, f)| f.id == id)
            .map(|(name, _)| name.clone())
    }

    /// Stops following `cluster` (`refused`: and does not ask it again on this route); its id.
    fn end(&mut self, cluster: &str, refused: bool) -> Option<u64> {
        let following = self.following.remove(cluster)?;
        following.abort.abort();
        if refused {
            self.refused
                .insert((cluster.to_string(), following.route.id));
        }
        Some(following.id)
    }

    /// Starts following `cluster` from its resourceVersion `from` (empty: from its start); the
    /// part's id.
    fn start(
        &mut self,
        view: &'a View<'a>,
        request: &'a FleetRequest<'a>,
        cluster: Arc<ClusterRoute>,
        identity: Decided,
        from: String,
        notes: &mpsc::Sender<Note>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let (abort, registration) = AbortHandle::new_pair();
        self.following.insert(
            cluster.name.to_string(),
            Following {
                id,
                route: Arc::clone(&cluster),
                abort,
            },
        );
        let part = Part {
            id,
            cluster,
            identity,
            from,
        };
        let future: PartFuture<'a> = Box::pin(follow(view, request, part, notes.clone()));
        self.running.push(Abortable::new(future, registration));
        id
    }
}

/// One member's part of the watch.
struct Part {
    id: u64,
    cluster: Arc<ClusterRoute>,
    identity: Decided,
    /// The resourceVersion to watch from (empty: from its start).
    from: String,
}

/// Watches one member as the user (`member::watcher`, from the part's resourceVersion, with
/// bookmarks), handing its events to the merge, until its resourceVersion expires, it refuses,
/// its route is retired or the merge is gone.
async fn follow(
    view: &View<'_>,
    request: &FleetRequest<'_>,
    part: Part,
    notes: mpsc::Sender<Note>,
) -> Ended {
    let Part {
        id,
        cluster,
        identity,
        from,
    } = part;
    let mut member = PartMember {
        ctx: view.ctx,
        request,
        to: To::new(&cluster, &identity, &view.client_request),
    };
    let mut merge = ToMerge {
        id,
        cluster: &cluster.name,
        notes,
        down: false,
    };
    let mut backoff = watcher::member_backoff();
    let start = watcher::Start::Watch(from);
    let patience = watcher::Patience::of_members();
    match watcher::run(
        start,
        &mut member,
        &mut merge,
        &ShardClock,
        &mut backoff,
        patience,
    )
    .await
    {
        watcher::Ended::Expired(status) => Ended::Expired(id, status),
        watcher::Ended::Refused(code) => Ended::Refused(id, format!("it answered {code}")),
        watcher::Ended::Retired => Ended::Retired(id),
        watcher::Ended::Stopped | watcher::Ended::GaveUp => Ended::QueueClosed,
    }
}

/// A member's side of its part: watches asked of it as the user, through the exchange.
struct PartMember<'a, 'r> {
    ctx: &'a ShardExchange,
    request: &'a FleetRequest<'r>,
    to: To<'a, ClientRequest<'r>>,
}

impl watcher::Member for PartMember<'_, '_> {
    type Opened = Answer;

    /// A part watches from the client's resourceVersion and never relists.
    async fn list(&mut self) -> Result<Vec<u8>, Missed> {
        Err(Missed::Failed("a fleet watch's part does not list".into()))
    }

    async fn open(&mut self, from: &str, resumed: bool) -> Result<Answer, Missed> {
        let mut extra = vec![("allowWatchBookmarks", "true")];
        if !from.is_empty() {
            extra.push(("resourceVersion", from));
        }
        // Asked again from a resourceVersion: not the initial events once more.
        let mut drop_keys = vec!["resourceVersion", "timeoutSeconds", "allowWatchBookmarks"];
        if resumed {
            drop_keys.extend(["sendInitialEvents", "resourceVersionMatch"]);
        }
        let query = rewrite_query(self.request.query, &drop_keys, &extra);
        let asked = Asked {
            rest: self.request.rest,
            query: &query,
            verb: self.request.verb,
        };
        Ask::get(&asked).open_watch(self.ctx, &self.to).await
    }

    async fn stream(&mut self, answer: Answer, body: &mut impl ResponseSink) -> Result<(), Missed> {
        ask::stream(self.ctx, answer, body).await
    }

    fn retired(&self) -> bool {
        self.to.cluster.retirement.is_retired()
    }
}

/// The merge's side of a part: its events, and the member becoming unreachable and reachable
/// again, queued for the merge.
struct ToMerge<'c> {
    id: u64,
    cluster: &'c str,
    notes: mpsc::Sender<Note>,
    /// The merge was told the member is unreachable.
    down: bool,
}

impl ToMerge<'_> {
    async fn note(&mut self, what: What) -> Result<(), Fault> {
        let note = Note { id: self.id, what };
        self.notes.send(note).await.map_err(|_| Fault::Stop)
    }
}

impl watcher::Handler for ToMerge<'_> {
    /// A part watches from the client's resourceVersion and never relists.
    async fn listed(&mut self, _body: Vec<u8>) -> Result<String, Fault> {
        Err(Fault::Bad("a fleet watch's part does not list"))
    }

    async fn event(&mut self, event: Value) -> Result<(), Fault> {
        self.note(What::Event(event)).await
    }

    /// The whole watch ends with the member's 410, as kube-apiserver's would: the client lists
    /// again.
    fn expired(&mut self, _status: &Value) -> AfterExpiry {
        AfterExpiry::End
    }

    fn stalled(&mut self, from: &str) {
        warn!(cluster = %self.cluster, from, "fleet watch: member sent nothing past the stall deadline; watching again");
    }

    async fn failed(&mut self, missed: &Missed, _backoff: &Backoff) -> Result<(), Fault> {
        if std::mem::replace(&mut self.down, true) {
            return Ok(());
        }
        self.note(What::Down(missed.warning(self.cluster))).await
    }

    async fn up(&mut self) -> Result<(), Fault> {
        if !std::mem::take(&mut self.down) {
            return Ok(());
        }
        self.note(What::Up).await
    }
}

/// The merged stream's state: each member's latest resourceVersion and a Table's columns.
struct Merge {
    versions: BTreeMap<String, String>,
    /// The first member's Table column definitions (without CLUSTER).
    columns: Option<Value>,
    columns_sent: bool,
    /// The client asked for bookmarks.
    bookmarks: bool,
    kind: String,
    api_version: String,
    /// `sendInitialEvents`: the parts whose initial events have not ended yet.
    initial_pending: Option<BTreeSet<u64>>,
}

impl Merge {
    /// One member event as the client gets it (nothing for a bookmark it did not ask for); an
    /// error ends that member's part.
    fn event(&mut self, cluster: &str, mut event: Value) -> Result<Vec<Bytes>, &'static str> {
        if let Some(version) = event_version(&event) {
            self.versions.insert(cluster.to_owned(), version.to_owned());
        }
        let composite = Value::String(encode_versions(&self.versions));
        let bookmark = event.get("type").and_then(Value::as_str) == Some("BOOKMARK");
        let Some(Value::Object(object)) = event.get_mut("object") else {
            return Err("a member's watch event has no object");
        };
        if bookmark {
            let initial_end = object
                .get("metadata")
                .and_then(|m| m.get("annotations"))
                .and_then(|a| a.get(INITIAL_EVENTS_END))
                .is_some();
            if initial_end {
                // One for the merged watch, once every member's initial events are out.
                return Ok(Vec::new());
            }
            if !self.bookmarks {
                return Ok(Vec::new());
            }
            set_version(object, &composite);
            return Ok(vec![line(&event)]);
        }
        if object.get("kind").and_then(Value::as_str) == Some("Table") {
            match object.get_mut("columnDefinitions") {
                Some(Value::Array(columns)) if !columns.is_empty() => {
                    let columns = Value::Array(std::mem::take(columns));
                    match &self.columns {
                        None => self.columns = Some(columns),
                        Some(first) if *first != columns => {
                            return Err("its Table columns differ from the first member's");
                        }
                        Some(_) => {}
                    }
                }
                _ => {}
            }
            let definitions = if std::mem::replace(&mut self.columns_sent, true) {
                Vec::new()
            } else {
                let mut all = vec![cluster_column()];
                if let Some(Value::Array(columns)) = &self.columns {
                    all.extend(columns.iter().cloned());
                }
                all
            };
            object.insert("columnDefinitions".into(), Value::Array(definitions));
            set_version(object, &composite);
            if let Some(Value::Array(rows)) = object.get_mut("rows") {
                for row in rows {
                    stamp(row, cluster, true);
                    if let Some(Value::Object(inner)) = row.get_mut("object") {
                        set_version(inner, &composite);
                    }
                }
            }
        } else {
            let mut stamped = Value::Object(std::mem::take(object));
            stamp(&mut stamped, cluster, false);
            if let Value::Object(stamped) = stamped {
                *object = stamped;
            }
            set_version(object, &composite);
        }
        Ok(vec![line(&event)])
    }

    /// Part `id` ended: its initial events are not waited for.
    fn left(&mut self, id: u64) {
        if let Some(pending) = &mut self.initial_pending {
            pending.remove(&id);
        }
    }

    /// The merged `k8s.io/initial-events-end` bookmark, once every member's initial events are
    /// out (asked with `sendInitialEvents`).
    fn initial_events_end(&mut self) -> Option<Bytes> {
        if !self
            .initial_pending
            .as_ref()
            .is_some_and(BTreeSet::is_empty)
        {
            return None;
        }
        self.initial_pending = None;
        let mut object = self.bookmark_object();
        object["metadata"]["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
        Some(line(&json!({"type": "BOOKMARK", "object": object})))
    }

    /// A BOOKMARK telling a client that asked for bookmarks what became of `cluster`'s part.
    fn state(&self, cluster: &str, state: &str) -> Vec<Bytes> {
        if !self.bookmarks {
            return Vec::new();
        }
        let mut object = self.bookmark_object();
        object["metadata"]["annotations"] = json!({
            super::page::CLUSTER_ANNOTATIONS[0]: cluster,
            CLUSTER_STATE: state,
        });
        vec![line(&json!({"type": "BOOKMARK", "object": object}))]
    }

    fn bookmark_object(&self) -> Value {
        json!({
            "kind": self.kind,
            "apiVersion": self.api_version,
            "metadata": {"resourceVersion": encode_versions(&self.versions)},
        })
    }

    /// The ERROR event that ends the watch when a member's resourceVersion expired: the
    /// member's own, exactly as kube-apiserver sent it (the log names the cluster).
    fn expired(&self, status: Value) -> Bytes {
        line(&json!({"type": "ERROR", "object": status}))
    }
}

fn set_version(object: &mut Map<String, Value>, composite: &Value) {
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(metadata) = metadata {
        metadata.insert("resourceVersion".into(), composite.clone());
    }
}

/// One event as a line of the merged stream.
fn line(event: &Value) -> Bytes {
    let mut out = serde_json::to_vec(event).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    //! The merge, in process: member events (as their JSON lines) in, the client's lines out.

    use super::*;

    fn merge(bookmarks: bool) -> Merge {
        Merge {
            versions: BTreeMap::new(),
            columns: None,
            columns_sent: false,
            bookmarks,
            kind: "ConfigMap".into(),
            api_version: "v1".into(),
            initial_pending: None,
        }
    }

    fn member_event(line: &str) -> Value {
        serde_json::from_str(line).unwrap()
    }

    /// The client's lines, each parsed.
    fn out(pieces: Vec<Bytes>) -> Vec<Value> {
        pieces
            .iter()
            .map(|piece| {
                assert!(piece.ends_with(b"\n"), "{piece:?}");
                serde_json::from_slice(piece).unwrap()
            })
            .collect()
    }

    fn composite(event: &Value) -> BTreeMap<String, String> {
        let token = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap();
        decode_versions(token).unwrap()
    }

    #[test]
    fn events_are_stamped_with_their_cluster_and_carry_every_members_version() {
        let mut m = merge(false);
        let a = r#"{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"x","resourceVersion":"5"}}}"#;
        let b = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","metadata":{"name":"y","resourceVersion":"70"}}}"#;
        let first = out(m.event("m1", member_event(a)).unwrap());
        let second = out(m.event("m2", member_event(b)).unwrap());
        assert_eq!(first[0]["type"], "ADDED");
        assert_eq!(
            first[0]["object"]["metadata"]["annotations"]["fleetgate.io/cluster"],
            "m1"
        );
        assert_eq!(
            second[0]["object"]["metadata"]["annotations"]["fleetgate.io/cluster"],
            "m2"
        );
        // A client resuming from the second event resumes both members where they were.
        let both = composite(&second[0]);
        assert_eq!(both.get("m1").map(String::as_str), Some("5"));
        assert_eq!(both.get("m2").map(String::as_str), Some("70"));
        assert!(m
            .event("m1", member_event(r#"{"type":"ADDED","object":1}"#))
            .is_err());
    }

    #[test]
    fn a_table_watch_sends_its_columns_once_cluster_first_and_refuses_other_columns() {
        let mut m = merge(false);
        let row = |cluster_columns: &str, name: &str, rv: u32| {
            format!(
                r#"{{"type":"ADDED","object":{{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{{"resourceVersion":"{rv}"}},"columnDefinitions":{cluster_columns},"rows":[{{"cells":["{name}"],"object":{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}}}]}}}}"#
            )
        };
        let columns = r#"[{"name":"Name","type":"string"}]"#;
        let first = out(m.event("m1", member_event(&row(columns, "x", 3))).unwrap());
        let table = &first[0]["object"];
        assert_eq!(table["columnDefinitions"][0]["name"], "Cluster");
        assert_eq!(table["columnDefinitions"][1]["name"], "Name");
        assert_eq!(table["rows"][0]["cells"], json!(["m1", "x"]));
        let next = out(m.event("m2", member_event(&row(columns, "y", 9))).unwrap());
        assert_eq!(next[0]["object"]["columnDefinitions"], json!([]));
        assert_eq!(next[0]["object"]["rows"][0]["cells"], json!(["m2", "y"]));
        let other = r#"[{"name":"Other","type":"string"}]"#;
        assert!(m.event("m3", member_event(&row(other, "z", 1))).is_err());
    }

    #[test]
    fn bookmarks_go_only_to_clients_that_asked_and_initial_events_end_once_for_all() {
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"8"}}}"#;
        let initial_end = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"8","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        let mut quiet = merge(false);
        assert!(quiet
            .event("m1", member_event(bookmark))
            .unwrap()
            .is_empty());
        assert!(quiet.state("m1", "Unreachable").is_empty());

        let mut m = merge(true);
        m.initial_pending = Some(BTreeSet::from([0, 1]));
        let forwarded = out(m.event("m1", member_event(bookmark)).unwrap());
        assert_eq!(composite(&forwarded[0]).get("m1").unwrap(), "8");
        // Each member's end of initial events is swallowed; one goes out when all are done.
        assert!(m.event("m1", member_event(initial_end)).unwrap().is_empty());
        m.left(0);
        assert!(m.initial_events_end().is_none());
        m.left(1);
        let end = out(vec![m.initial_events_end().unwrap()]);
        assert_eq!(
            end[0]["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
        assert!(m.initial_events_end().is_none(), "only once");
        let state = out(m.state("m2", "Unreachable"));
        assert_eq!(
            state[0]["object"]["metadata"]["annotations"][CLUSTER_STATE],
            "Unreachable"
        );
    }

    #[test]
    fn an_expired_member_ends_the_watch_with_its_exact_status() {
        let status = crate::errors::expired_status("41 (52)");
        let end = out(vec![merge(false).expired(status.clone())]);
        assert_eq!(end[0]["type"], "ERROR");
        assert_eq!(end[0]["object"], status);
        assert_eq!(
            end[0]["object"]["message"],
            "too old resource version: 41 (52)"
        );
    }
}
