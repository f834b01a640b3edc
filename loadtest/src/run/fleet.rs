//! `fleet-list`: one LIST of a whole fleet, timed and charged per object. A target is either the
//! gateway's fleet view (`NAME=kubeconfig:gateway.kubeconfig:fleet`, `--path /api/v1/pods`) or
//! the members themselves, listed one after the other (`NAME=kubeconfig:kubeconfig:member*`, every
//! context whose name starts with `member`): the direct baseline, the same lists summed.
//!
//! With `--limit N` every list is paged, following continue tokens to the end; without it each
//! list is one response. The driver never holds a whole list: bodies go through [`ListScan`], a
//! streaming JSON scanner that counts the items and keeps the list's own fields (its continue
//! token), and, with `--check-items`, hands each item to a check that every object is listed
//! exactly once.
//!
//! Figures per target: time to the first response head and to the end of the list (medians over
//! the lists of `--duration`), the objects a list returned, the target's CPU per object
//! (`--pid`), the simulated fleet's (`--upstream-pid`) and the driver's own, and the target's
//! resident memory: sampled during the lists and its high-water mark (VmHWM).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

use super::client::{HttpConn, Target};
use super::procstat::ProcWatch;
use super::scenarios::{cpu_now, RssSampler};
use super::{RunArgs, TargetResult};

/// The most pages one list may take (a guard against a server whose continue tokens never end).
const MAX_PAGES: u64 = 1 << 20;
/// The longest wait for a response head (the fleet view's comes once every member answered its
/// probe), and for a whole body (a million pods through the fleet view take ~40 s).
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const BODY_TIMEOUT: Duration = Duration::from_secs(600);
/// A label selector nothing matches: the warm-up list asks every member, lists nothing.
const WARM_UP_SELECTOR: &str = "labelSelector=fleetgate.io%2Fwarm-up%3Dnothing";

/// The processes charged, besides the target's own.
pub struct Charged<'a> {
    pub target: Option<&'a ProcWatch>,
    pub upstream: Option<&'a ProcWatch>,
}

/// `fleet-list` against one target: `members` is the gateway (one target) or every member.
pub async fn fleet_list(
    args: &RunArgs,
    name: &str,
    members: &[Target],
    charged: Charged<'_>,
) -> anyhow::Result<TargetResult> {
    let mut lister = Lister {
        members,
        conns: members.iter().map(|_| None).collect(),
        conns_opened: vec![false; members.len()],
        retries: 0,
        limit: args.limit,
        path: args.path.clone(),
    };
    // Warm-up: every member connection open (through the gateway: its pool to every member).
    lister
        .list(WARM_UP_SELECTOR, None)
        .await
        .with_context(|| format!("{name}: warm-up list"))?;
    lister.retries = 0;

    let driver = ProcWatch::new(std::process::id())?;
    let rss = RssSampler::start(charged.target, Duration::from_millis(10))?;
    let cpu0 = (
        cpu_now(charged.target)?,
        cpu_now(charged.upstream)?,
        driver.cpu()?,
    );
    let start = Instant::now();
    let mut lists = Vec::new();
    let mut check = args.check_items.then(ItemCheck::default);
    let mut errors = 0u64;
    while lists.is_empty()
        || (start.elapsed() < args.duration && (lists.len() as u64) < args.max_requests)
    {
        if let Some(c) = check.as_mut() {
            *c = ItemCheck::default();
        }
        let stats = lister
            .list("", check.as_mut())
            .await
            .with_context(|| format!("{name}: list {}", lists.len() + 1))?;
        if lists
            .first()
            .is_some_and(|first: &ListStats| first.objects != stats.objects)
        {
            errors += 1;
        }
        lists.push(stats);
    }
    let seconds = start.elapsed().as_secs_f64();
    // A request asked again counts as an error: the run's figures include the wait.
    errors += lister.retries;
    let cpu1 = (
        cpu_now(charged.target)?,
        cpu_now(charged.upstream)?,
        driver.cpu()?,
    );
    let (rss_base_kib, rss_peak_kib) = rss.stop();
    let hwm = charged.target.map(|p| p.rss_high_water()).transpose()?;
    let objects: u64 = lists.iter().map(|l| l.objects).sum();
    let per_object = |a: Option<Duration>, b: Option<Duration>| {
        a.zip(b)
            .filter(|_| objects > 0)
            .map(|(a, b)| (b - a).as_secs_f64() * 1e6 / objects as f64)
    };
    let median = |f: fn(&ListStats) -> Duration| {
        let mut v: Vec<f64> = lists.iter().map(|l| f(l).as_secs_f64() * 1e3).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(TargetResult {
        target: name.to_owned(),
        scenario: "fleet-list".into(),
        requests: lists.len() as u64,
        errors,
        seconds,
        bytes: lists[0].bytes,
        objects: Some(lists[0].objects),
        pages: Some(lists[0].pages),
        members: Some(members.len()),
        limit: Some(args.limit),
        ttfb_ms: Some(median(|l| l.ttfb)),
        total_ms: Some(median(|l| l.total)),
        cpu_us_per_object: per_object(cpu0.0, cpu1.0),
        upstream_cpu_us_per_object: per_object(cpu0.1, cpu1.1),
        driver_cpu_us_per_object: per_object(Some(cpu0.2), Some(cpu1.2)),
        rss_base_kib,
        rss_peak_kib,
        rss_hwm_kib: hwm.map(|r| r as f64 / 1024.0),
        distinct_objects: check.as_ref().map(|c| c.seen.len() as u64),
        duplicate_objects: check.as_ref().map(|c| c.duplicates),
        objects_per_cluster: check.map(|c| c.per_cluster),
        ..Default::default()
    })
}

/// What one list took.
#[derive(Debug, Clone, Copy)]
struct ListStats {
    /// From the first request to its response head.
    ttfb: Duration,
    /// From the first request to the end of the last page (of the last member).
    total: Duration,
    objects: u64,
    pages: u64,
    /// Body bytes of every page.
    bytes: u64,
}

/// Lists a target's members one after the other, each member's connection kept open.
struct Lister<'a> {
    members: &'a [Target],
    conns: Vec<Option<HttpConn>>,
    /// Whether a connection to each member was opened (a later failure to use it is a retry).
    conns_opened: Vec<bool>,
    /// Requests asked again on a new connection.
    retries: u64,
    limit: usize,
    path: String,
}

impl Lister<'_> {
    /// One whole list (every member, every page), with `query` added to each request.
    async fn list(
        &mut self,
        query: &str,
        mut check: Option<&mut ItemCheck>,
    ) -> anyhow::Result<ListStats> {
        let start = Instant::now();
        let mut ttfb = None;
        let (mut objects, mut pages, mut bytes) = (0u64, 0u64, 0u64);
        for i in 0..self.members.len() {
            let mut token = String::new();
            loop {
                let mut q = Vec::new();
                if !query.is_empty() {
                    q.push(query.to_owned());
                }
                if self.limit > 0 {
                    q.push(format!("limit={}", self.limit));
                }
                if !token.is_empty() {
                    q.push(format!("continue={}", url_encode(&token)));
                }
                let path = if q.is_empty() {
                    self.path.clone()
                } else {
                    let sep = if self.path.contains('?') { '&' } else { '?' };
                    format!("{}{sep}{}", self.path, q.join("&"))
                };
                let cluster = self.members[i].name.clone();
                let mut scan = ListScan::new(check.is_some());
                let mut on_item = |item: &[u8]| {
                    if let Some(c) = check.as_deref_mut() {
                        c.item(item, &cluster);
                    }
                };
                let (page, n) = self
                    .page(i, &path, &mut scan, &mut on_item, &mut ttfb, start)
                    .await?;
                bytes += n;
                objects += scan.items;
                pages += 1;
                if pages > MAX_PAGES {
                    bail!("more than {MAX_PAGES} pages: the continue tokens do not end");
                }
                match page {
                    Some(next) if self.limit > 0 => token = next,
                    Some(_) => bail!("a continue token in an unpaged list"),
                    None => break,
                }
            }
        }
        Ok(ListStats {
            ttfb: ttfb.unwrap_or_default(),
            total: start.elapsed(),
            objects,
            pages,
            bytes,
        })
    }

    /// One page from member `i`: its items through `scan`; its continue token, if any, and its
    /// body bytes.
    async fn page(
        &mut self,
        i: usize,
        path: &str,
        scan: &mut ListScan,
        on_item: &mut impl FnMut(&[u8]),
        ttfb: &mut Option<Duration>,
        start: Instant,
    ) -> anyhow::Result<(Option<String>, u64)> {
        let target = &self.members[i];
        let request = target.get_request(path, "application/json");
        // A kept-alive connection the server closed meanwhile, or one where the request or its
        // head stalled (seen once, a direct list at 100 x 10,000 pods: the driver and the member
        // both idle, the request not sent; cause not found): once more on a new connection,
        // counted as an error.
        let kept = self.conns[i].take();
        let sent = match kept {
            Some(mut conn) => tokio::time::timeout(HEAD_TIMEOUT, conn.send(&request))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|head| (conn, head)),
            None => None,
        };
        let (mut conn, head) = match sent {
            Some(sent) => sent,
            None => {
                if self.conns_opened[i] {
                    self.retries += 1;
                    tracing::warn!(target = %target.name, "no answer on a kept-alive connection; asking again on a new one");
                }
                self.conns_opened[i] = true;
                tokio::time::timeout(HEAD_TIMEOUT, fresh(target, &request))
                    .await
                    .map_err(|_| {
                        anyhow!("{}: no response head in {HEAD_TIMEOUT:?}", target.name)
                    })??
            }
        };
        ttfb.get_or_insert_with(|| start.elapsed());
        if head.status != 200 {
            let mut body = Vec::new();
            conn.read_body(&head, |d| body.extend_from_slice(d)).await?;
            bail!(
                "{} answered {}: {}",
                target.name,
                head.status,
                String::from_utf8_lossy(&body[..body.len().min(400)])
            );
        }
        let bytes = tokio::time::timeout(
            BODY_TIMEOUT,
            conn.read_body(&head, |d| scan.feed(d, on_item)),
        )
        .await
        .map_err(|_| anyhow!("{}: the body did not end in {BODY_TIMEOUT:?}", target.name))??;
        if !head.close {
            self.conns[i] = Some(conn);
        }
        Ok((scan.continue_token()?, bytes))
    }
}

async fn fresh(target: &Target, request: &[u8]) -> anyhow::Result<(HttpConn, super::client::Head)> {
    let mut conn = HttpConn::new(target.connect().await?);
    let head = conn.send(request).await?;
    Ok((conn, head))
}

/// Percent-encodes everything but unreserved characters.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every object of one list, by cluster, namespace and name (`--check-items`).
#[derive(Default)]
struct ItemCheck {
    seen: HashSet<String>,
    duplicates: u64,
    per_cluster: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct Item {
    metadata: ItemMeta,
}

#[derive(Deserialize)]
struct ItemMeta {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    annotations: BTreeMap<String, serde_json::Value>,
}

impl ItemCheck {
    /// One item of the list from `member`: its cluster is its `fleetgate.io/cluster` annotation
    /// (the fleet view stamps it) or, listed direct, the member's.
    fn item(&mut self, bytes: &[u8], member: &str) {
        let Ok(item) = serde_json::from_slice::<Item>(bytes) else {
            // Not an object with a name: counted as a duplicate so the check fails.
            self.duplicates += 1;
            return;
        };
        let meta = item.metadata;
        let cluster = meta
            .annotations
            .get("fleetgate.io/cluster")
            .and_then(|c| c.as_str())
            .unwrap_or(member);
        *self.per_cluster.entry(cluster.to_owned()).or_default() += 1;
        if !self
            .seen
            .insert(format!("{cluster}/{}/{}", meta.namespace, meta.name))
        {
            self.duplicates += 1;
        }
    }
}

/// A streaming scanner of one LIST response: counts the elements of its top-level `items` array
/// (and hands each one's bytes on, when asked) and keeps everything else (kind, metadata) as a
/// small JSON document, with the items array left empty.
pub struct ListScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    in_items: bool,
    keep_items: bool,
    outline: Vec<u8>,
    item: Vec<u8>,
    /// Elements of `items` seen so far.
    pub items: u64,
}

impl ListScan {
    pub fn new(keep_items: bool) -> ListScan {
        ListScan {
            depth: 0,
            in_string: false,
            escaped: false,
            in_items: false,
            keep_items,
            outline: Vec::with_capacity(512),
            item: Vec::new(),
            items: 0,
        }
    }

    /// Where bytes at the current position go: the outline, the current item, or nowhere
    /// (inside `items` between elements, or items not kept).
    fn sink(&mut self) -> Option<&mut Vec<u8>> {
        if !self.in_items {
            Some(&mut self.outline)
        } else if self.keep_items && self.depth >= 3 {
            Some(&mut self.item)
        } else {
            None
        }
    }

    /// Scans the next bytes of the body; `on_item` gets each complete element of `items`.
    pub fn feed(&mut self, data: &[u8], on_item: &mut impl FnMut(&[u8])) {
        let mut i = 0;
        while i < data.len() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    if let Some(s) = self.sink() {
                        s.push(data[i]);
                    }
                    i += 1;
                    continue;
                }
                let rest = &data[i..];
                match rest.iter().position(|b| *b == b'"' || *b == b'\\') {
                    Some(p) => {
                        if let Some(s) = self.sink() {
                            s.extend_from_slice(&rest[..=p]);
                        }
                        if rest[p] == b'"' {
                            self.in_string = false;
                        } else {
                            self.escaped = true;
                        }
                        i += p + 1;
                    }
                    None => {
                        if let Some(s) = self.sink() {
                            s.extend_from_slice(rest);
                        }
                        i = data.len();
                    }
                }
                continue;
            }
            let b = data[i];
            i += 1;
            match b {
                b'"' => {
                    self.in_string = true;
                    if let Some(s) = self.sink() {
                        s.push(b);
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.in_items && self.depth == 3 {
                        self.item.clear();
                    }
                    let opens_items = !self.in_items
                        && b == b'['
                        && self.depth == 2
                        && ends_with_key(&self.outline, b"items");
                    if let Some(s) = self.sink() {
                        s.push(b);
                    }
                    self.in_items |= opens_items;
                }
                b'}' | b']' => {
                    if self.in_items && self.depth == 2 {
                        self.in_items = false;
                        self.outline.push(b);
                    } else if let Some(s) = self.sink() {
                        s.push(b);
                    }
                    if self.in_items && self.depth == 3 {
                        self.items += 1;
                        if self.keep_items {
                            on_item(&self.item);
                        }
                    }
                    self.depth = self.depth.saturating_sub(1);
                }
                _ => {
                    if let Some(s) = self.sink() {
                        s.push(b);
                    }
                }
            }
        }
    }

    /// The list's `metadata.continue`, once the whole body went through; None when empty.
    pub fn continue_token(&self) -> anyhow::Result<Option<String>> {
        if self.depth != 0 || self.in_string {
            bail!("the list ended inside a JSON value");
        }
        let outline: serde_json::Value = serde_json::from_slice(&self.outline)
            .map_err(|e| anyhow!("the list is not JSON ({e})"))?;
        if !outline["items"].is_array() {
            bail!("the list has no items array");
        }
        Ok(outline["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_owned))
    }
}

/// Whether `outline` ends with `"key":` (whitespace allowed around the colon).
fn ends_with_key(outline: &[u8], key: &[u8]) -> bool {
    let trimmed = outline.trim_ascii_end();
    let Some(before) = trimmed.strip_suffix(b":") else {
        return false;
    };
    let before = before.trim_ascii_end();
    before.len() >= key.len() + 2
        && before.ends_with(b"\"")
        && before[..before.len() - 1].ends_with(key)
        && before[before.len() - 2 - key.len()] == b'"'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in_pieces(body: &[u8], piece: usize) -> (ListScan, Vec<String>) {
        let mut scan = ListScan::new(true);
        let mut items = Vec::new();
        for chunk in body.chunks(piece) {
            scan.feed(chunk, &mut |item| {
                items.push(String::from_utf8(item.to_vec()).unwrap())
            });
        }
        (scan, items)
    }

    #[test]
    fn counts_items_and_keeps_the_continue_token_in_any_split() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"eyJ2Ijoi\"x"},"items":[{"metadata":{"name":"a]{","namespace":"n","annotations":{"k":"v\\"}},"spec":{"l":[1,{"x":[]}]}},{"metadata":{"name":"b"}}]}"#;
        for piece in 1..body.len() {
            let (scan, items) = scan_in_pieces(body, piece);
            assert_eq!(scan.items, 2, "pieces of {piece}");
            assert_eq!(
                scan.continue_token().unwrap().as_deref(),
                Some("eyJ2Ijoi\"x"),
                "pieces of {piece}"
            );
            assert_eq!(items.len(), 2);
            let first: serde_json::Value = serde_json::from_str(&items[0]).unwrap();
            assert_eq!(first["metadata"]["name"], "a]{");
            assert_eq!(items[1], r#"{"metadata":{"name":"b"}}"#);
        }
    }

    #[test]
    fn the_last_page_has_no_token_and_broken_lists_are_errors() {
        let (scan, _) = scan_in_pieces(
            b"{\"kind\":\"PodList\" , \"items\" : [ ] ,\"metadata\":{\"continue\":\"\"}}\n",
            5,
        );
        assert_eq!(scan.items, 0);
        assert_eq!(scan.continue_token().unwrap(), None);
        let (scan, _) = scan_in_pieces(br#"{"kind":"PodList","items":[{"a":1}"#, 3);
        assert!(scan.continue_token().is_err());
        let (scan, _) = scan_in_pieces(br#"{"kind":"Status","code":500}"#, 3);
        assert!(scan.continue_token().is_err(), "no items array");
    }

    #[test]
    fn every_object_once_by_cluster() {
        let mut check = ItemCheck::default();
        check.item(br#"{"metadata":{"name":"p","namespace":"n"}}"#, "member1");
        check.item(br#"{"metadata":{"name":"p","namespace":"n"}}"#, "member2");
        check.item(
            br#"{"metadata":{"name":"p","namespace":"n","annotations":{"fleetgate.io/cluster":"member2"}}}"#,
            "fleet",
        );
        assert_eq!(check.seen.len(), 2);
        assert_eq!(check.duplicates, 1);
        assert_eq!(check.per_cluster["member2"], 2);
        assert_eq!(url_encode("a+b/c="), "a%2Bb%2Fc%3D");
    }
}
