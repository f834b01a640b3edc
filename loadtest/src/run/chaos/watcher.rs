//! One informer-style watcher of `chaos`: LIST, WATCH from the list's resourceVersion with
//! bookmarks, resume from the last resourceVersion when a stream ends, LIST again after a 410,
//! over HTTP/1.1 (a connection per request) or as streams of the h2 connection it shares with
//! the other h2 watchers (`h2`);
//! everything it sees of each member recorded as [`Obs`] for the accounting (`check`). On the
//! fleet view each event counts for its cluster's member at that member's part of the composite
//! resourceVersion, and the other parts place the other members as bookmarks do. Started and
//! aborted by `chaos`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::check::{Kind, Obs};
use super::h2::H2Shared;
use super::{lock, Run, COLLECTION, REQUEST_TIMEOUT};
use crate::run::client::{Head, HttpConn, Target};
use crate::run::scenarios::{read_lines, sent_at_nanos, split_lines, unix_nanos, with_query};

/// The annotation the fleet view stamps every object with.
const CLUSTER_ANNOTATION: &str = "fleetgate.io/cluster";

/// An incident of a watcher, for charging to faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incident {
    Break,
    End,
    OpenFailed,
    Expired,
    Relist,
}

/// Which view a watcher follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    Member(usize),
    Fleet,
}

/// What one watcher recorded.
#[derive(Default)]
pub(crate) struct WatcherLog {
    /// Per member: the resourceVersion of the first list, and everything after.
    pub(crate) origin: Vec<Option<u64>>,
    pub(crate) obs: Vec<Vec<Obs>>,
    pub(crate) incidents: Vec<(u64, Incident)>,
}

/// One informer-style watcher and what it recorded.
pub(crate) struct Watcher {
    pub(crate) name: String,
    pub(crate) view: View,
    pub(crate) target: Target,
    /// Speaks h2 on this shared connection (else HTTP/1.1, a connection per request).
    pub(crate) h2: Option<Arc<H2Shared>>,
    /// Per member, the resourceVersion the watcher has reached.
    pub(crate) positions: Vec<AtomicU64>,
    pub(crate) log: Mutex<WatcherLog>,
}

/// A composite resourceVersion of the fleet view: cluster -> the member's resourceVersion.
pub fn decode_composite(token: &str) -> Option<BTreeMap<String, String>> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// An answer's body, still to read.
enum Body {
    H1(HttpConn, Head),
    H2(h2::RecvStream),
}

impl Body {
    /// Reads to the end, handing each complete line to `on_line`; fails when the connection (or
    /// the h2 stream) failed before the body's end.
    async fn lines(self, mut on_line: impl FnMut(&[u8])) -> anyhow::Result<()> {
        match self {
            Body::H1(mut conn, head) => read_lines(&mut conn, &head, |_, l| on_line(l))
                .await
                .map(drop),
            Body::H2(mut body) => {
                let mut line = Vec::with_capacity(4096);
                while let Some(data) = body.data().await {
                    let data = data?;
                    let _ = body.flow_control().release_capacity(data.len());
                    split_lines(&mut line, &data, Instant::now(), &mut |_, l| on_line(l));
                }
                Ok(())
            }
        }
    }

    /// Reads the whole body.
    async fn all(self) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            Body::H1(mut conn, head) => {
                conn.read_body(&head, |d| out.extend_from_slice(d)).await?;
            }
            Body::H2(mut body) => {
                while let Some(data) = body.data().await {
                    let data = data?;
                    let _ = body.flow_control().release_capacity(data.len());
                    out.extend_from_slice(&data);
                }
            }
        }
        Ok(out)
    }
}

/// How a watch stream ended.
enum StreamEnd {
    /// The body ended cleanly (timeoutSeconds, a drained gateway).
    Ended,
    /// The connection failed.
    Broken,
    /// A 410 ERROR event: list again.
    Expired,
    /// Another ERROR event: watch again from the last resourceVersion.
    Error,
}

impl Watcher {
    /// A watcher named `name` of `view` through `target`, in a fleet of `count` members, that
    /// has seen nothing yet; it speaks h2 on `h2` if given, else HTTP/1.1.
    pub(crate) fn new(
        name: String,
        view: View,
        target: Target,
        count: usize,
        h2: Option<Arc<H2Shared>>,
    ) -> Watcher {
        Watcher {
            name,
            view,
            target,
            h2,
            positions: (0..count).map(|_| AtomicU64::new(0)).collect(),
            log: Mutex::new(WatcherLog {
                origin: vec![None; count],
                obs: vec![Vec::new(); count],
                incidents: Vec::new(),
            }),
        }
    }

    /// The members this watcher follows.
    pub(crate) fn members(&self, count: usize) -> Vec<usize> {
        match self.view {
            View::Member(m) => vec![m],
            View::Fleet => (0..count).collect(),
        }
    }

    /// Sends a GET for `path` (HTTP/1.1 on a new connection, or a stream of the shared h2
    /// connection): the status and the body to read.
    async fn open(&self, path: &str) -> anyhow::Result<(u16, Body)> {
        match &self.h2 {
            None => {
                let mut conn = HttpConn::new(self.target.connect().await?);
                let head = conn
                    .send(&self.target.get_request(path, "application/json"))
                    .await?;
                Ok((head.status, Body::H1(conn, head)))
            }
            Some(shared) => {
                let (status, body) = shared.get(&self.target, path).await?;
                Ok((status, Body::H2(body)))
            }
        }
    }

    /// GETs `path` and reads the whole answer: status and body.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            let (status, body) = self.open(path).await?;
            Ok((status, body.all().await?))
        })
        .await
        .unwrap_or_else(|_| Err(anyhow!("timed out")))
    }

    fn incident(&self, run: &Run, what: Incident) {
        lock(&self.log).incidents.push((run.ms(), what));
    }

    fn advance(&self, run: &Run, member: usize, rv: u64) {
        self.positions[member].fetch_max(rv, Ordering::Relaxed);
        run.progress.notify_waiters();
    }

    /// Lists the collection: the list's resourceVersion (a composite one for the fleet view,
    /// which must name every member: a list short of one is asked again). The first list is the
    /// watcher's origin; later ones are relists.
    async fn list(&self, run: &Run) -> anyhow::Result<String> {
        let (status, body) = self.get(COLLECTION).await?;
        if status != 200 {
            bail!("list answered {status}");
        }
        let list: Value = serde_json::from_slice(&body).context("list is not JSON")?;
        let token = list["metadata"]["resourceVersion"]
            .as_str()
            .ok_or_else(|| anyhow!("list without a resourceVersion"))?
            .to_owned();
        let versions: Vec<(usize, u64)> = match self.view {
            View::Member(m) => vec![(m, token.parse().context("list resourceVersion")?)],
            View::Fleet => {
                let composite = decode_composite(&token).ok_or_else(|| {
                    anyhow!("fleet list resourceVersion {token:?} is not composite")
                })?;
                let mut out = Vec::new();
                for (m, name) in run.members.iter().enumerate() {
                    let rv = composite
                        .get(name)
                        .ok_or_else(|| anyhow!("fleet list left {name} out"))?;
                    out.push((m, rv.parse().context("member resourceVersion")?));
                }
                out
            }
        };
        let at_ms = run.ms();
        {
            let mut log = lock(&self.log);
            for &(m, rv) in &versions {
                if log.origin[m].is_none() {
                    log.origin[m] = Some(rv);
                } else {
                    log.obs[m].push(Obs::Relist { rv, at_ms });
                }
            }
        }
        for (m, rv) in versions {
            self.positions[m].store(rv, Ordering::Relaxed);
        }
        run.progress.notify_waiters();
        Ok(token)
    }

    /// Lists until a list succeeds.
    async fn list_until_done(&self, run: &Run, relist: bool) -> String {
        if relist {
            self.incident(run, Incident::Relist);
        }
        loop {
            match self.list(run).await {
                Ok(token) => return token,
                Err(error) => {
                    tracing::debug!(watcher = %self.name, %error, "chaos: list failed; again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// One line of a watch stream: records it, moves `token` on. Some(end) for an ERROR event.
    fn on_line(&self, run: &Run, line: &[u8], token: &mut String) -> Option<StreamEnd> {
        let Ok(event) = serde_json::from_slice::<Value>(line) else {
            if !line.iter().all(u8::is_ascii_whitespace) {
                tracing::warn!(watcher = %self.name, "chaos: a watch line is not JSON");
            }
            return None;
        };
        let kind = event["type"].as_str().unwrap_or_default();
        let object = &event["object"];
        if kind == "ERROR" {
            return Some(if object["code"].as_u64() == Some(410) {
                StreamEnd::Expired
            } else {
                tracing::warn!(watcher = %self.name, status = %object, "chaos: ERROR event");
                StreamEnd::Error
            });
        }
        let rv = object["metadata"]["resourceVersion"].as_str()?;
        let at_ms = run.ms();
        let change = Kind::parse(kind);
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        // (member, its resourceVersion) this line speaks of, and which one the event is of.
        let (versions, own): (Vec<(usize, u64)>, Option<usize>) = match self.view {
            View::Member(m) => (vec![(m, rv.parse().unwrap_or(0))], Some(m)),
            View::Fleet => {
                let Some(composite) = decode_composite(rv) else {
                    tracing::warn!(watcher = %self.name, rv, "chaos: not a composite resourceVersion");
                    return None;
                };
                let cluster = object["metadata"]["annotations"][CLUSTER_ANNOTATION].as_str();
                let versions = composite
                    .iter()
                    .filter_map(|(c, v)| Some((run.member_index(c)?, v.parse().ok()?)))
                    .collect();
                (versions, cluster.and_then(|c| run.member_index(c)))
            }
        };
        *token = rv.to_owned();
        {
            let mut log = lock(&self.log);
            for &(m, member_rv) in &versions {
                let obs = match change {
                    Some(kind) if own == Some(m) => Obs::Event {
                        rv: member_rv,
                        kind,
                        name: name.to_owned(),
                        at_ms,
                    },
                    _ => Obs::Bookmark { rv: member_rv },
                };
                log.obs[m].push(obs);
            }
        }
        if matches!(change, Some(Kind::Added | Kind::Modified)) {
            run.events.fetch_add(1, Ordering::Relaxed);
            if let Some(sent) = sent_at_nanos(line) {
                let us = (unix_nanos().saturating_sub(sent) / 1000) as u64;
                let _ = lock(&run.latency).record(us.max(1));
            }
        } else if change.is_some() {
            run.events.fetch_add(1, Ordering::Relaxed);
        }
        for (m, member_rv) in versions {
            self.advance(run, m, member_rv);
        }
        None
    }

    /// Watches from `token` once: until the stream ends.
    async fn watch_once(
        &self,
        run: &Run,
        token: &mut String,
        timeout_s: u64,
    ) -> anyhow::Result<StreamEnd> {
        let path = with_query(
            COLLECTION,
            &format!(
                "watch=1&allowWatchBookmarks=true&timeoutSeconds={timeout_s}&resourceVersion={token}"
            ),
        );
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, self.open(&path))
            .await
            .unwrap_or_else(|_| Err(anyhow!("timed out")))?;
        match status {
            200 => {}
            410 => return Ok(StreamEnd::Expired),
            status => bail!("watch answered {status}"),
        }
        run.watches_open.fetch_add(1, Ordering::Relaxed);
        let mut end = None;
        let read = body
            .lines(|line| {
                if end.is_none() {
                    end = self.on_line(run, line, token);
                }
            })
            .await;
        run.watches_open.fetch_sub(1, Ordering::Relaxed);
        Ok(match (end, read) {
            (Some(end), _) => end,
            (None, Ok(_)) => StreamEnd::Ended,
            (None, Err(error)) => {
                tracing::debug!(watcher = %self.name, %error, "chaos: watch stream broke");
                StreamEnd::Broken
            }
        })
    }

    /// The informer: list, then watch and resume for ever (the run aborts it).
    pub(crate) async fn follow(self: Arc<Self>, run: Arc<Run>, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut token = self.list_until_done(&run, false).await;
        run.listed.fetch_add(1, Ordering::Relaxed);
        run.progress.notify_waiters();
        let mut backoff = Duration::from_millis(100);
        loop {
            let timeout_s = rng.random_range(run.watch_timeout_s.clone());
            match self.watch_once(&run, &mut token, timeout_s).await {
                Ok(end) => {
                    backoff = Duration::from_millis(100);
                    match end {
                        StreamEnd::Ended => self.incident(&run, Incident::End),
                        StreamEnd::Broken | StreamEnd::Error => {
                            self.incident(&run, Incident::Break)
                        }
                        StreamEnd::Expired => {
                            self.incident(&run, Incident::Expired);
                            token = self.list_until_done(&run, true).await;
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(watcher = %self.name, %error, "chaos: watch not opened");
                    self.incident(&run, Incident::OpenFailed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}
