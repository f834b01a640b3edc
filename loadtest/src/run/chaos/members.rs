//! The members' side of `chaos`: a writer per member that creates, patches and deletes
//! configmaps straight on the member (not through the gateway) and keeps every answer, and a
//! recorder of the member's own history: its event log of the namespace, read from the simulated
//! member in this process (deletes included, whose answers carry no resourceVersion). `chaos`
//! checks every answer against the log, and every watcher against the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::check::{Change, Kind};
use super::{lock, Run, COLLECTION, NAMESPACE, REQUEST_TIMEOUT};
use crate::run::client::{HttpConn, Target};
use crate::run::fanout::body_request;
use crate::run::scenarios::unix_nanos;
use crate::sim::{self, FleetHandle};

/// The member's own history of the namespace, from its event log in this process.
pub(crate) struct Recorder {
    pub(crate) changes: Mutex<Vec<Change>>,
    last: AtomicU64,
    pub(crate) lagged: AtomicU64,
    moved: Notify,
}

impl Recorder {
    pub(crate) fn start(
        fleet: &FleetHandle,
        member: usize,
        run: Arc<Run>,
    ) -> anyhow::Result<Arc<Recorder>> {
        let store = &fleet
            .member(member)
            .ok_or_else(|| anyhow!("no member {member}"))?
            .store;
        let from = store.current_rv();
        let start = store
            .watch("configmaps", Some(NAMESPACE), Some(from), |_| true)
            .map_err(|_| anyhow!("the member's history does not reach its current version"))?;
        let recorder = Arc::new(Recorder {
            changes: Mutex::new(Vec::new()),
            last: AtomicU64::new(from),
            lagged: AtomicU64::new(0),
            moved: Notify::new(),
        });
        let mut receiver = start.receiver;
        let r = recorder.clone();
        let note = move |event: &sim::store::StoredEvent| {
            if event.resource == "configmaps" && event.namespace == NAMESPACE {
                lock(&r.changes).push(Change {
                    rv: event.rv,
                    kind: match event.event_type {
                        sim::store::EventType::Added => Kind::Added,
                        sim::store::EventType::Modified => Kind::Modified,
                        sim::store::EventType::Deleted => Kind::Deleted,
                    },
                    name: event.name.clone(),
                    at_ms: run.ms(),
                });
            }
            r.last.fetch_max(event.rv, Ordering::Relaxed);
            r.moved.notify_waiters();
        };
        for event in &start.initial {
            note(event);
        }
        let r = recorder.clone();
        tokio::spawn(async move {
            loop {
                match receiver.recv().await {
                    Ok(event) => note(&event),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        r.lagged.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(recorder)
    }

    /// Waits (bounded) until the log has reached `rv`.
    pub(crate) async fn reach(&self, rv: u64) -> bool {
        let until = Instant::now() + REQUEST_TIMEOUT;
        while self.last.load(Ordering::Relaxed) < rv {
            let moved = self.moved.notified();
            if self.last.load(Ordering::Relaxed) >= rv {
                break;
            }
            if tokio::time::timeout_at(until.into(), moved).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// One write's answer: its resourceVersion, what the log must hold there.
pub(crate) struct Answer {
    pub(crate) rv: u64,
    pub(crate) kind: Kind,
    pub(crate) name: String,
}

/// Writes to one member straight, and remembers the answers.
pub(crate) struct Writer {
    target: Target,
    conn: Option<HttpConn>,
    live: Vec<String>,
    next: u64,
    rng: StdRng,
    pub(crate) answers: Vec<Answer>,
    pub(crate) writes: u64,
    pub(crate) failed: u64,
}

impl Writer {
    pub(crate) fn new(target: Target, seed: u64) -> Writer {
        Writer {
            target,
            conn: None,
            live: Vec::new(),
            next: 0,
            rng: StdRng::seed_from_u64(seed),
            answers: Vec::new(),
            writes: 0,
            failed: 0,
        }
    }

    async fn send(&mut self, request: Vec<u8>) -> anyhow::Result<(u16, Vec<u8>)> {
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            if self.conn.is_none() {
                self.conn = Some(HttpConn::new(self.target.connect().await?));
            }
            let conn = self.conn.as_mut().expect("connected above");
            let head = conn.send(&request).await?;
            let mut body = Vec::new();
            conn.read_body(&head, |d| body.extend_from_slice(d)).await?;
            if head.close {
                self.conn = None;
            }
            anyhow::Ok((head.status, body))
        })
        .await
        .unwrap_or_else(|_| Err(anyhow!("timed out")));
        if outcome.is_err() {
            self.conn = None;
        }
        outcome
    }

    /// One write: a create, a merge patch or a delete, as the dice say (a create while few
    /// objects live). Returns the resourceVersion a create or patch was answered with.
    pub(crate) async fn write(&mut self, patch_only: bool) -> anyhow::Result<Option<u64>> {
        let roll: f64 = self.rng.random();
        let stamp = unix_nanos().to_string();
        let (kind, name, request) = if !patch_only && (self.live.len() < 3 || roll < 0.35) {
            let name = format!("cm-{}", self.next);
            self.next += 1;
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE,
                    "annotations": {"fleetgate.io/sent-at": stamp}},
                "data": {"n": "0"}});
            let request = body_request(
                &self.target,
                "POST",
                COLLECTION,
                "application/json",
                &serde_json::to_vec(&body)?,
            );
            (Kind::Added, name, request)
        } else if self.live.is_empty() {
            return Ok(None);
        } else {
            let name = self.live[self.rng.random_range(0..self.live.len())].clone();
            let path = format!("{COLLECTION}/{name}");
            if patch_only || roll < 0.8 {
                let body = json!({"metadata": {"annotations": {"fleetgate.io/sent-at": stamp}},
                    "data": {"n": self.next.to_string()}});
                self.next += 1;
                let request = body_request(
                    &self.target,
                    "PATCH",
                    &path,
                    "application/merge-patch+json",
                    &serde_json::to_vec(&body)?,
                );
                (Kind::Modified, name, request)
            } else {
                let request = body_request(&self.target, "DELETE", &path, "application/json", b"");
                (Kind::Deleted, name, request)
            }
        };
        self.writes += 1;
        let (status, body) = match self.send(request).await {
            Ok(answer) => answer,
            Err(error) => {
                self.failed += 1;
                return Err(error);
            }
        };
        // Gone (deleted, or a patch of what is gone): the name is not written again.
        if status == 404 || (kind == Kind::Deleted && status == 200) {
            self.live.retain(|n| *n != name);
        }
        if kind == Kind::Deleted && status == 200 {
            return Ok(None);
        }
        if !(200..300).contains(&status) {
            self.failed += 1;
            bail!("{kind:?} {name} answered {status}");
        }
        let object: Value = serde_json::from_slice(&body).context("write answer is not JSON")?;
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("write answer without a resourceVersion"))?;
        if kind == Kind::Added {
            self.live.push(name.clone());
        }
        self.answers.push(Answer { rv, kind, name });
        Ok(Some(rv))
    }
}
