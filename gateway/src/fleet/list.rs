//! A LIST merged across the members of a fleet request, streamed.
//!
//! 1. **Probe.** Each member is asked for one object (`limit=1`, from the continue token's place
//!    for the member a page resumes in), at most `spec.fleet.membersAtOnce` (16) at a time. A
//!    member that fails, times out or answers with an error is left out and named in a `Warning`
//!    field; a Table whose columns differ from the first member's is left out the same way. The
//!    response head goes out once every probe has answered. A paged list (`limit`) spans at most
//!    one batch of members, and asks its first member for the whole page first: when that fills
//!    the page, no other member is asked.
//! 2. **Stream.** Members in name order: the probe's object, then pages of at most
//!    `spec.fleet.pageSize` (500) objects (or what the client's `limit` leaves) from the member's
//!    continue token, each object stamped with its cluster and written out before the next page
//!    is asked for. Memory is one page plus one probed object per member, whatever the fleet
//!    holds.
//! 3. **Continue.** With a `limit`, the page ends once that many objects are out; its continue
//!    token names the cluster and that member's own continue token (or the next member from its
//!    start). The resourceVersion is composite: each member's, by cluster.
//!
//! A member that fails after the head went out (asked twice) cuts the response: the head can no
//! longer name it, and a list silently short of its objects would tell an informer they were
//! deleted. The client's next list finds it at the probe and names it in a `Warning`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use fleetgate_config_watcher::ClusterRoute;
use futures_channel::mpsc;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::SinkExt;
use serde_json::Value;
use tracing::warn;

use super::page::{cluster_column, stamp, Page};
use super::token::{encode_versions, query_count, query_value, rewrite_query, Continue};
use super::{bad_request, Cached, FleetClient, View};
use crate::auth::Decided;
use crate::errors::GatewayError;
use crate::exchange::Failure;
use crate::member::ask::{ask, Asked, Missed};
use crate::request::FleetRequest;
use crate::runtime::{self, First};

/// Body bytes gathered before they go to the client.
const WRITE_CHUNK: usize = 64 * 1024;
/// Members whose later pages are read ahead of the writer in an unpaged LIST: the one being
/// written (two measured no faster, with 6 MiB more at the peak: docs/benchmarks.md).
pub const READ_AHEAD: usize = 1;

/// Serves a merged LIST: the probe, the stream, the page's continue token (the steps above).
pub(crate) async fn list(
    view: &View<'_>,
    request: &FleetRequest<'_>,
    client: &mut impl FleetClient,
) -> Result<(), Failure> {
    let limit = query_count(request.query, "limit", "limit is not a whole number")
        .map_err(bad_request)?
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let start = match query_value(request.query, "continue").as_deref() {
        None | Some("") => None,
        Some(token) => Some(Continue::decode(token).map_err(bad_request)?),
    };
    if !matches!(
        query_value(request.query, "resourceVersion").as_deref(),
        None | Some("") | Some("0")
    ) {
        return Err(bad_request(
            "a fleet LIST takes no resourceVersion but 0 (each member has its own)",
        ));
    }
    // The members from where this page starts: a continue token's cluster (or, if it left the
    // fleet since, the next one by name) resumes at its own continue token.
    let mut members: Vec<&(&Arc<ClusterRoute>, Decided)> = request
        .members
        .iter()
        .filter(|(c, _)| start.as_ref().is_none_or(|s| *c.name >= *s.cluster))
        .collect();
    // A page of a paged list spans at most one batch of members: each page probes a bounded
    // number of members (not every member after the cursor, page after page), and a member of a
    // later batch that fails is named by the page that reaches it. The page may then hold fewer
    // than `limit` objects, with a continue token, as kube allows.
    let mut beyond = None;
    if limit.is_some() && members.len() > request.settings.members_at_once {
        beyond = Some(members[request.settings.members_at_once].0.name.to_string());
        members.truncate(request.settings.members_at_once);
    }
    let resume = |cluster: &ClusterRoute| {
        start
            .as_ref()
            .filter(|s| *s.cluster == *cluster.name)
            .map_or("", |s| s.member.as_str())
    };

    let unsynced = RefCell::new(BTreeSet::new());
    let member_pages = |cluster, identity| MemberPages {
        view,
        request,
        cluster,
        identity,
        unsynced: &unsynced,
    };

    // 1. Probe. A paged list asks its first member for the whole page at once: when that fills
    // the page (the member has more), no other member is asked, so the pages inside one large
    // member cost one request each. Otherwise the others are probed.
    let mut probes = Vec::with_capacity(members.len());
    if let (Some(limit), Some((cluster, identity))) = (limit, members.first()) {
        let ask = limit.min(request.settings.page_size);
        let page = member_pages(cluster, identity)
            .page(ask, resume(cluster))
            .await;
        let fills = page
            .as_ref()
            .is_ok_and(|p| p.entries.len() >= limit && !p.continue_token.is_empty());
        probes.push(page);
        if fills {
            members.truncate(1);
            beyond = None;
        }
    }
    for batch in members[probes.len()..].chunks(request.settings.members_at_once) {
        let asked = batch
            .iter()
            .map(|(cluster, identity)| async move {
                let member = member_pages(cluster, identity);
                member.page(1, resume(cluster)).await
            })
            .collect::<Vec<_>>();
        probes.extend(join_all(asked).await);
    }
    let mut warnings = Vec::new();
    let mut healthy: Vec<(&Arc<ClusterRoute>, &Decided, Page)> = Vec::new();
    for ((cluster, identity), probe) in members.iter().zip(probes) {
        match probe {
            Ok(page) => {
                let columns_differ = healthy
                    .first()
                    .is_some_and(|(_, _, first)| first.columns != page.columns);
                if columns_differ {
                    warnings.push(format!(
                        "cluster {}: its columns differ from cluster {}'s; its objects are missing",
                        cluster.name, healthy[0].0.name
                    ));
                } else {
                    healthy.push((cluster, identity, page));
                }
            }
            // A stale continue token is the client's to restart from, as with one cluster.
            Err(Missed::Answered(410, _)) if !resume(cluster).is_empty() => {
                return Err(Failure::Answer(GatewayError::FleetContinueExpired {
                    cluster: cluster.name.to_string(),
                }));
            }
            Err(missed) => warnings.push(missed.warning(&cluster.name)),
        }
    }
    for cluster in unsynced.borrow().iter() {
        warnings.push(format!(
            "cluster {cluster}: its cache is not synced yet; its objects were listed from the member"
        ));
    }

    // 2. Stream.
    let (kind, api_version, columns) = match healthy.first() {
        Some((_, _, page)) => (
            page.kind.clone(),
            page.api_version.clone(),
            page.columns.clone(),
        ),
        None => (
            format!("{}List", request.kind.kind),
            request.kind.group_version(),
            None,
        ),
    };
    client.head("application/json", &warnings).await?;
    let mut out = Out {
        client,
        buf: Vec::with_capacity(WRITE_CHUNK + 1024),
        first: true,
    };
    out.raw(b"{\"kind\":");
    out.json(&Value::String(kind));
    out.raw(b",\"apiVersion\":");
    out.json(&Value::String(api_version));
    let table = columns.is_some();
    if let Some(columns) = columns {
        let mut all = vec![cluster_column()];
        if let Value::Array(columns) = columns {
            all.extend(columns);
        }
        out.raw(b",\"columnDefinitions\":");
        out.json(&Value::Array(all));
        out.raw(b",\"rows\":[");
    } else {
        out.raw(b",\"items\":[");
    }
    // Unpaged, the member's next pages are read ahead of the writer (`READ_AHEAD` members at
    // a time, one page waiting each); paged, each page is asked for when the writer needs it,
    // sized by what the client's limit leaves.
    let ahead = limit.is_none();
    let (senders, mut receivers): (Vec<_>, Vec<_>) = healthy
        .iter()
        .map(|_| mpsc::channel::<Result<Vec<u8>, Missed>>(0))
        .unzip();
    let written = Cell::new(0usize);
    // Where each member's reader starts: after its probe.
    let starts: Vec<(&Arc<ClusterRoute>, &Decided, String)> = healthy
        .iter()
        .map(|(cluster, identity, probe)| (*cluster, *identity, probe.continue_token.clone()))
        .collect();
    let readers = async {
        if !ahead {
            return std::future::pending::<Infallible>().await;
        }
        let mut running = FuturesUnordered::new();
        let mut members = starts.into_iter().zip(senders);
        let mut started = 0;
        std::future::poll_fn(|cx| {
            // A member's reader starts once the writer is within READ_AHEAD members of it.
            while started < written.get() + READ_AHEAD {
                let Some(((cluster, identity, from), pages)) = members.next() else {
                    break;
                };
                started += 1;
                if !from.is_empty() {
                    running.push(async move {
                        let member = member_pages(cluster, identity);
                        member.read_ahead(from, pages).await;
                    });
                }
            }
            while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {}
            Poll::<Infallible>::Pending
        })
        .await
    };
    let writer = async {
        let mut remaining = limit.unwrap_or(usize::MAX);
        let mut versions = BTreeMap::new();
        let mut next = None;
        for ((cluster, identity, mut page), pages) in healthy.into_iter().zip(&mut receivers) {
            versions.insert(cluster.name.to_string(), page.resource_version.clone());
            loop {
                remaining = remaining.saturating_sub(page.entries.len());
                for mut entry in page.entries.drain(..) {
                    stamp(&mut entry, &cluster.name, table);
                    out.entry(&entry).await?;
                }
                if page.continue_token.is_empty() {
                    break;
                }
                if remaining == 0 {
                    next = Some(Continue {
                        cluster: cluster.name.to_string(),
                        member: std::mem::take(&mut page.continue_token),
                    });
                    break;
                }
                let from = std::mem::take(&mut page.continue_token);
                let got = if ahead {
                    match pages.next().await {
                        Some(Ok(raw)) => parsed(&raw),
                        Some(Err(missed)) => Err(missed),
                        None => Err(Missed::Failed("its reader ended".into())),
                    }
                } else {
                    let ask = remaining.min(request.settings.page_size);
                    let member = member_pages(cluster, identity);
                    member
                        .body_twice(ask, &from)
                        .await
                        .and_then(|body| parsed(&body))
                };
                // The head went out: a list silently short of a member's objects would tell an
                // informer they were deleted, so the response is cut.
                page = got.map_err(|missed| {
                    warn!(warning = %missed.warning(&cluster.name), "fleet list cut: a member failed after the head went out");
                    Failure::Abort("a member failed in the middle of a fleet list")
                })?;
            }
            written.set(written.get() + 1);
            if remaining == 0 {
                if next.is_none() {
                    // This member ended with the page: the next page starts at the next one.
                    next = members_after(&request.members, &cluster.name).map(|name| Continue {
                        cluster: name,
                        member: String::new(),
                    });
                }
                break;
            }
        }
        if next.is_none() {
            // The batch ended before the page was full: the next page starts at the next batch.
            next = beyond.map(|cluster| Continue {
                cluster,
                member: String::new(),
            });
        }
        Ok::<_, Failure>((versions, next))
    };
    let (versions, next) = match runtime::race(writer, readers).await {
        First::Left(written) => written?,
        First::Right(never) => match never {},
    };
    out.raw(b"],\"metadata\":{\"resourceVersion\":");
    out.json(&Value::String(encode_versions(&versions)));
    if let Some(next) = next {
        out.raw(b",\"continue\":");
        out.json(&Value::String(next.encode()));
    }
    out.raw(b"}}\n");
    out.flush().await?;
    out.client.end().await
}

/// The first member after `name` (by name), if any.
fn members_after(members: &[(&Arc<ClusterRoute>, Decided)], name: &str) -> Option<String> {
    members
        .iter()
        .find(|(c, _)| &*c.name > name)
        .map(|(c, _)| c.name.to_string())
}

/// The merged body as it is written: gathered into chunks of about [`WRITE_CHUNK`].
struct Out<'c, C> {
    client: &'c mut C,
    buf: Vec<u8>,
    /// No entry written yet (no comma before the next).
    first: bool,
}

impl<C: FleetClient> Out<'_, C> {
    fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn json(&mut self, value: &Value) {
        // Writing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.buf, value);
    }

    async fn entry(&mut self, value: &Value) -> Result<(), Failure> {
        if !std::mem::take(&mut self.first) {
            self.buf.push(b',');
        }
        self.json(value);
        if self.buf.len() >= WRITE_CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::take(&mut self.buf));
        self.buf.reserve(WRITE_CHUNK + 1024);
        self.client.body(piece).await
    }
}

/// One member's pages, asked as the user.
struct MemberPages<'a, 'r> {
    view: &'a View<'a>,
    request: &'a FleetRequest<'r>,
    cluster: &'a Arc<ClusterRoute>,
    identity: &'a Decided,
    /// The members whose cache was still listing when a page was asked of it.
    unsynced: &'a RefCell<BTreeSet<String>>,
}

impl MemberPages<'_, '_> {
    /// A page of at most `limit` objects from the member's continue token `from`, as it came.
    async fn body(&self, limit: usize, from: &str) -> Result<Vec<u8>, Missed> {
        let query = page_query(self.request.query, limit, from);
        if let Some(cache) = self.view.cache {
            let cached = cache.page(
                self.cluster,
                self.identity,
                &self.request.info,
                self.request.rest,
                &query,
                &self.view.client_request,
            );
            match cached.await {
                Cached::Page(page) => return Ok(page),
                Cached::NotSynced => {
                    self.unsynced
                        .borrow_mut()
                        .insert(self.cluster.name.to_string());
                }
                Cached::Member => {}
            }
        }
        let asked = Asked {
            rest: self.request.rest,
            query: &query,
            verb: self.request.verb,
        };
        let view = self.view;
        ask(
            view.ctx,
            &asked,
            &view.client_request,
            self.cluster,
            self.identity,
        )
        .await
    }

    /// [`Self::body`], once more on a failure (a pooled connection may have been closed under
    /// us).
    async fn body_twice(&self, limit: usize, from: &str) -> Result<Vec<u8>, Missed> {
        match self.body(limit, from).await {
            Ok(body) => Ok(body),
            Err(_) => self.body(limit, from).await,
        }
    }

    /// A page, parsed.
    async fn page(&self, limit: usize, from: &str) -> Result<Page, Missed> {
        parsed(&self.body(limit, from).await?)
    }

    /// Reads the member's pages (of `spec.fleet.pageSize`) from its continue token `from` ahead
    /// of the writer, each page as it came (unparsed: a parsed page is several times larger),
    /// one waiting in `pages` at a time. Asks twice, then hands a failure on.
    async fn read_ahead(&self, mut from: String, mut pages: mpsc::Sender<Result<Vec<u8>, Missed>>) {
        let size = self.request.settings.page_size;
        loop {
            let read = self.body_twice(size, &from).await.and_then(|body| {
                let next = Page::continue_token(&body).map_err(|r| Missed::Failed(r.into()))?;
                Ok((body, next))
            });
            let (body, next) = match read {
                Ok(read) => read,
                Err(missed) => {
                    let _ = pages.send(Err(missed)).await;
                    return;
                }
            };
            if pages.send(Ok(body)).await.is_err() || next.is_empty() {
                return;
            }
            from = next;
        }
    }
}

/// A member's page as the fleet view reads it.
fn parsed(body: &[u8]) -> Result<Page, Missed> {
    Page::parse(body).map_err(|reason| Missed::Failed(reason.to_string()))
}

/// The client's query with a member page's `limit` and `continue`. A continued page is read at
/// its token's resourceVersion: the client's `resourceVersion` and `resourceVersionMatch` go
/// (the member refuses a continue with either, as client-go's pager knows).
fn page_query(query: &[u8], limit: usize, from: &str) -> Vec<u8> {
    let limit_text = limit.to_string();
    if from.is_empty() {
        return rewrite_query(query, &["limit", "continue"], &[("limit", &limit_text)]);
    }
    rewrite_query(
        query,
        &[
            "limit",
            "continue",
            "resourceVersion",
            "resourceVersionMatch",
        ],
        &[("limit", &limit_text), ("continue", from)],
    )
}
