//! The audit log: one JSON line per answered request, in kube-apiserver's `audit.k8s.io/v1`
//! `Event` format at level `Metadata` and stage `ResponseComplete`, so tools that read a
//! kube-apiserver audit log read the gateway's.
//!
//! Kept off the hot path: a shard only copies what it knows of the request (method, target, user
//! agent, identity, address, times, code) into a boxed record and `try_send`s it into a bounded
//! channel. When the channel is full the record is dropped and counted
//! (`fleetgate_audit_events_dropped`); a shard never blocks on the log and never does file I/O.
//! One writer thread derives the rest (cluster, verb, objectRef, auditID, timestamps), serializes
//! and writes through a buffered writer, flushing at least once a second. Built by `serve` from
//! the Gateway's `spec.audit`; records come from the pipeline (`handle`, for both front-ends)
//! where a response ends (an upgrade's when its session ends).
//!
//! On SIGHUP (`serve`) the writer reopens the configured path ([`AuditLog::reopen`]): a log
//! rotator renames the file, signals, and the next lines go to a new file at the path, as with
//! nginx or kube-apiserver's own rotation. Lines already queued are flushed to the old file first.
//!
//! The same records make the access log (the Gateway's `spec.accessLog`): the writer thread
//! turns each into one `tracing` event at info, target `fleetgate::access`, with the user, verb,
//! path (without the query), cluster, code, duration and the auditID of the matching audit event,
//! so it comes out wherever and however the process logs (text or JSON). A record holds no
//! credential (the identity is the user's name, groups and extras), so neither log can print one.
//! With the access log on and `spec.audit` off, the queue and writer run with no file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use tracing::{info, warn};

use crate::auth::ClientIdentity;
use crate::codec::http1::Head;
use crate::observe::metrics::Metrics;
use fleetgate_config_watcher::request_info::RequestInfo;

/// The writer flushes at least this often while it has unflushed lines.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// While events arrive, the writer takes them in batches this far apart instead of being woken
/// for each (the queue must hold this long's events: 8192 is 400 ms at 20,000 requests a second).
const BATCH_INTERVAL: Duration = Duration::from_millis(10);
/// Records that may wait for the writer when the Gateway does not say.
pub const DEFAULT_QUEUE: usize = 8192;

/// What a shard knows of a request when its response ends.
#[derive(Debug, Clone)]
pub struct AuditRequest {
    pub method: http::Method,
    /// The request target exactly as the client sent it (path and query).
    pub target: String,
    pub user_agent: Option<String>,
    /// Who the client authenticated as; None when it did not (a 401, or a refusal before
    /// authentication).
    pub user: Option<Arc<ClientIdentity>>,
    /// Who the client acts as, when a policy let it impersonate (client `Impersonate-*`).
    pub impersonated: Option<Arc<ClientIdentity>>,
    pub source_ip: IpAddr,
    /// What the shard classified the request as (its cluster and kube request info), when it
    /// got that far: the writer never parses the target again.
    pub classified: Option<Classified>,
}

/// A request's cluster and kube request info, as the audit log names them: the verb, and the
/// objectRef as spans of [`AuditRequest::target`] (no copies on the shard).
#[derive(Debug, Clone)]
pub struct Classified {
    cluster: std::ops::Range<usize>,
    /// The fleet view's request (several clusters): its cluster is written as `fleet`.
    fleet: bool,
    verb: &'static str,
    object: Option<[std::ops::Range<usize>; 6]>,
}

impl Classified {
    /// From the cluster name and the request info the shard parsed out of `target` (the bytes
    /// both borrow).
    pub fn new(cluster: &str, info: &RequestInfo<'_>, target: &[u8]) -> Classified {
        let span = |field: &str| -> std::ops::Range<usize> {
            let start = (field.as_ptr() as usize).wrapping_sub(target.as_ptr() as usize);
            if field.is_empty() || start + field.len() > target.len() {
                0..0
            } else {
                start..start + field.len()
            }
        };
        let object = (info.is_resource_request && std::str::from_utf8(target).is_ok()).then(|| {
            [
                span(info.resource),
                span(info.namespace),
                span(info.name),
                span(info.api_group),
                span(info.api_version),
                span(info.subresource),
            ]
        });
        Classified {
            cluster: span(cluster),
            fleet: false,
            verb: info.verb.name(),
            object,
        }
    }

    /// A request of the fleet view, spanning clusters: its cluster is written as `fleet`.
    pub fn fleet(info: &RequestInfo<'_>, target: &[u8]) -> Classified {
        Classified {
            fleet: true,
            ..Classified::new("", info, target)
        }
    }
}

impl AuditRequest {
    /// From an HTTP/1.1 request head; the identity is added with [`AuditRequest::identity`].
    pub fn from_head(head: &Head, peer: SocketAddr) -> AuditRequest {
        AuditRequest {
            method: http::Method::from_bytes(head.method()).unwrap_or(http::Method::GET),
            target: String::from_utf8_lossy(head.target()).into_owned(),
            user_agent: head
                .value(b"user-agent")
                .map(|v| String::from_utf8_lossy(v).into_owned()),
            user: None,
            impersonated: None,
            source_ip: peer.ip(),
            classified: None,
        }
    }

    /// From an h2 request; the identity is added with [`AuditRequest::identity`].
    pub fn from_parts<B>(request: &http::Request<B>, peer: SocketAddr) -> AuditRequest {
        AuditRequest {
            method: request.method().clone(),
            target: request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string(),
            user_agent: request
                .headers()
                .get(http::header::USER_AGENT)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            user: None,
            impersonated: None,
            source_ip: peer.ip(),
            classified: None,
        }
    }

    /// Who authenticated, and who the member was told about: when they differ, the client
    /// impersonated (a policy allowed it) and the event says so in `impersonatedUser`.
    pub fn identity(
        mut self,
        authenticated: Option<&Arc<ClientIdentity>>,
        acting_as: Option<&Arc<ClientIdentity>>,
    ) -> AuditRequest {
        self.user = authenticated.cloned();
        self.impersonated = match (authenticated, acting_as) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) || a == b => None,
            (_, acting_as) => acting_as.cloned(),
        };
        self
    }
}

/// What the pipeline learns of a request as it goes (over either protocol), for the record at the stream's end: who (once
/// decided), what the request was classified as, and the code of the response head it sent.
#[derive(Debug, Default)]
pub struct StreamAudit {
    pub classified: Option<Classified>,
    pub authenticated: Option<Arc<ClientIdentity>>,
    pub acting_as: Option<Arc<ClientIdentity>>,
    pub code: Option<u16>,
    /// The verb of a fleet-view request, counted at the stream's end as one request of the
    /// fleet view (`fleetgate_fleet_requests_total`); set whether or not the audit log is on.
    pub fleet: Option<&'static str>,
}

/// How the response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response with this code was sent completely (for an upgrade: the session ended).
    Complete(u16),
    /// The exchange was cut short: the code of the response head if one was sent, and why.
    Aborted(Option<u16>, &'static str),
}

impl Outcome {
    /// The code of the response head the client got, if any.
    pub fn code(self) -> Option<u16> {
        self.parts().0
    }

    /// The code the client got, and why the exchange was cut short (if it was).
    fn parts(self) -> (Option<u16>, Option<&'static str>) {
        match self {
            Outcome::Complete(code) => (Some(code), None),
            Outcome::Aborted(code, reason) => (code, Some(reason)),
        }
    }
}

/// One record in the channel: boxed so a slot is a pointer.
struct Record {
    request: AuditRequest,
    received: SystemTime,
    latency: Duration,
    outcome: Outcome,
}

enum Message {
    Record(Box<Record>),
    /// Flush and acknowledge (shutdown, tests).
    Flush(SyncSender<()>),
    /// Flush, then open the path again (SIGHUP), and acknowledge.
    Reopen(SyncSender<()>),
}

/// The shards' handle on the audit log: cheap to clone, never blocks.
#[derive(Clone)]
pub struct AuditLog {
    sender: SyncSender<Message>,
    dropped: Counter,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dropped", &self.dropped.get())
            .finish_non_exhaustive()
    }
}

/// Why the audit log could not start.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("opening the audit log {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("starting the audit writer thread")]
    Thread(#[source] io::Error),
}

impl AuditLog {
    /// Opens `path` (the audit log, when there is one) for appending (created 0600 if missing:
    /// the log names users) and starts the writer thread, which also writes the access log when
    /// `access_log`. `queue` records may wait for it; beyond that they are dropped and counted
    /// (`fleetgate_audit_events_dropped`; `fleetgate_audit_events` counts lines written to the
    /// file).
    pub fn start(
        path: Option<&Path>,
        access_log: bool,
        queue: usize,
        metrics: &Metrics,
    ) -> Result<AuditLog, AuditError> {
        let dropped = metrics.audit_events_dropped.clone();
        let file = match path {
            None => None,
            Some(path) => Some(AuditFile::open(path, metrics.audit_events.clone())?),
        };
        let (sender, receiver) = mpsc::sync_channel(queue.max(1));
        let writer = Writer {
            file,
            access_log,
            line: Vec::with_capacity(1024),
            flush_by: None,
            ids: AuditIds::seeded(),
        };
        std::thread::Builder::new()
            .name("fleetgate-audit".into())
            .spawn(move || writer.run(receiver))
            .map_err(AuditError::Thread)?;
        match path {
            Some(path) => info!(path = %path.display(), queue, access_log, "audit log open"),
            None => info!(queue, "access log on (target fleetgate::access)"),
        }
        Ok(AuditLog { sender, dropped })
    }

    /// Queues one event; drops (and counts) it when the writer is behind. Never blocks.
    pub fn record(&self, request: AuditRequest, started: Instant, outcome: Outcome) {
        let latency = started.elapsed();
        let received = SystemTime::now()
            .checked_sub(latency)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let record = Box::new(Record {
            request,
            received,
            latency,
            outcome,
        });
        match self.sender.try_send(Message::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Blocks (up to `timeout`) until every event queued before the call is written and flushed.
    /// For shutdown and tests, never for a shard.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.ask(Message::Flush, timeout)
    }

    /// Flushes what is queued to the current file, then opens the configured path again (a file
    /// a rotator renamed keeps what it holds; new lines go to a new file). Blocks up to `timeout`
    /// for the writer to do it: for the signal handler, never for a shard. A path that cannot be
    /// opened is logged and the old file kept.
    pub fn reopen(&self, timeout: Duration) -> bool {
        self.ask(Message::Reopen, timeout)
    }

    fn ask(&self, message: fn(SyncSender<()>) -> Message, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        let deadline = Instant::now() + timeout;
        let mut message = message(ack);
        loop {
            match self.sender.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        done.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

/// Opens the log for appending, created 0600 if missing (the log names users).
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The audit log's file, as the writer thread holds it.
struct AuditFile {
    out: BufWriter<File>,
    path: PathBuf,
    written: Counter,
    /// A write failed (logged once until one succeeds again).
    failing: bool,
}

impl AuditFile {
    fn open(path: &Path, written: Counter) -> Result<AuditFile, AuditError> {
        let error = |source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(error)?;
        }
        let file = open_log(path).map_err(error)?;
        Ok(AuditFile {
            out: BufWriter::with_capacity(64 * 1024, file),
            path: path.to_path_buf(),
            written,
            failing: false,
        })
    }

    fn write(&mut self, line: &[u8]) {
        match self.out.write_all(line) {
            Ok(()) => {
                self.written.inc();
                self.failing = false;
            }
            Err(error) => {
                if !self.failing {
                    warn!(path = %self.path.display(), %error, "audit log write failed");
                }
                self.failing = true;
            }
        }
    }

    fn flush(&mut self) {
        if let Err(error) = self.out.flush() {
            if !self.failing {
                warn!(path = %self.path.display(), %error, "audit log flush failed");
            }
            self.failing = true;
        }
    }

    /// Flushes, then opens the path again (a rotator renamed the file); keeps the old file when
    /// the path cannot be opened.
    fn reopen(&mut self) {
        self.flush();
        match open_log(&self.path) {
            Ok(file) => {
                self.out = BufWriter::with_capacity(64 * 1024, file);
                self.failing = false;
                info!(path = %self.path.display(), "audit log reopened");
            }
            Err(error) => warn!(
                path = %self.path.display(),
                %error,
                "audit log could not be reopened; writing on to the file already open"
            ),
        }
    }
}

/// The writer thread's state.
struct Writer {
    /// The audit log's file (`spec.audit`), if any.
    file: Option<AuditFile>,
    /// Whether each record also becomes an access-log line (`spec.accessLog`).
    access_log: bool,
    line: Vec<u8>,
    /// Set while lines sit in the file's buffer: when they must reach the file at the latest.
    flush_by: Option<Instant>,
    ids: AuditIds,
}

impl Writer {
    /// Blocks on the queue only while idle, so one event wakes the thread; once an event came,
    /// it takes the queue in batches every [`BATCH_INTERVAL`] until the queue stays empty. A busy
    /// gateway's shards so never pay for waking the writer per event (the cost that dominated
    /// before: a futex wake and a context switch per request).
    fn run(mut self, receiver: Receiver<Message>) {
        loop {
            let first = match self.flush_by {
                None => match receiver.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                },
                Some(deadline) => {
                    match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) => {
                            self.flush();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            self.handle(first);
            loop {
                std::thread::sleep(BATCH_INTERVAL);
                let mut taken = 0usize;
                while let Ok(message) = receiver.try_recv() {
                    self.handle(message);
                    taken += 1;
                }
                if self.flush_by.is_some_and(|d| Instant::now() >= d) {
                    self.flush();
                }
                if taken == 0 {
                    break;
                }
            }
        }
        self.flush();
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Record(record) => {
                // One ID for the event and its access-log line, so either finds the other.
                let audit_id = self.ids.next_id();
                if let Some(file) = &mut self.file {
                    self.line.clear();
                    let event = event(&record, audit_id);
                    // Serializing plain strings and numbers cannot fail.
                    let _ = serde_json::to_writer(&mut self.line, &event);
                    self.line.push(b'\n');
                    file.write(&self.line);
                    self.flush_by
                        .get_or_insert_with(|| Instant::now() + FLUSH_INTERVAL);
                }
                if self.access_log {
                    access_line(&record, audit_id);
                }
            }
            Message::Flush(ack) => {
                self.flush();
                let _ = ack.send(());
            }
            Message::Reopen(ack) => {
                self.flush_by = None;
                if let Some(file) = &mut self.file {
                    file.reopen();
                }
                let _ = ack.send(());
            }
        }
    }

    fn flush(&mut self) {
        self.flush_by = None;
        if let Some(file) = &mut self.file {
            file.flush();
        }
    }
}

/// The access-log line of a record: one `tracing` event at info, target `fleetgate::access`,
/// its fields structured (so a JSON log has them as JSON fields). The path is written without
/// its query (which the audit log keeps, as kube-apiserver's does).
fn access_line(record: &Record, audit_id: uuid::Uuid) {
    let request = &record.request;
    let (cluster, verb) = cluster_and_verb(request);
    let (code, aborted) = record.outcome.parts();
    let path = request
        .target
        .split_once('?')
        .map_or(request.target.as_str(), |(path, _)| path);
    let user = request
        .user
        .as_deref()
        .map_or(UserInfo::UNAUTHENTICATED.username, |u| u.user.as_str());
    info!(
        target: "fleetgate::access",
        user,
        impersonated = request.impersonated.as_deref().map(|u| u.user.as_str()),
        verb,
        method = %request.method,
        path,
        cluster,
        code,
        duration_ms = record.latency.as_micros() as f64 / 1000.0,
        source = %request.source_ip,
        audit_id = %audit_id,
        aborted,
        "request"
    );
}

/// Audit IDs: random (version 4) UUIDs from a SplitMix64 stream seeded once from the OS, so an
/// event costs no `getrandom` call. The IDs only need to be unique, not secret.
struct AuditIds {
    state: u64,
}

impl AuditIds {
    fn seeded() -> AuditIds {
        let seed = uuid::Uuid::new_v4().as_u64_pair();
        AuditIds {
            state: seed.0 ^ seed.1.rotate_left(32),
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_id(&mut self) -> uuid::Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

/// `audit.k8s.io/v1` Event, the fields written at level Metadata.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    kind: &'static str,
    api_version: &'static str,
    level: &'static str,
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: &'static str,
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    verb: &'static str,
    user: UserInfo<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    impersonated_user: Option<UserInfo<'a>>,
    #[serde(rename = "sourceIPs")]
    source_ips: [String; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<ObjectRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_status: Option<ResponseStatus>,
    request_received_timestamp: String,
    stage_timestamp: String,
    annotations: Annotations<'a>,
}

#[derive(Serialize)]
struct UserInfo<'a> {
    username: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    groups: &'a [String],
    /// kube's `extra`: a map of string lists.
    #[serde(skip_serializing_if = "Extra::is_empty")]
    extra: Extra<'a>,
}

/// The identity's extra attributes, serialized as kube's `map[string][]string`.
struct Extra<'a>(&'a [(String, Vec<String>)]);

impl Extra<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Extra<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl UserInfo<'_> {
    /// A request refused before (or for lack of) authentication: Kubernetes' anonymous user.
    const UNAUTHENTICATED: UserInfo<'static> = UserInfo {
        username: "system:anonymous",
        uid: None,
        groups: &[],
        extra: Extra(&[]),
    };
}

impl<'a> From<&'a ClientIdentity> for UserInfo<'a> {
    fn from(identity: &'a ClientIdentity) -> Self {
        UserInfo {
            username: &identity.user,
            uid: identity.uid.as_deref(),
            groups: &identity.groups,
            extra: Extra(&identity.extra),
        }
    }
}

/// What the request is about, as kube-apiserver's request info names it.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

#[derive(Serialize)]
struct ResponseStatus {
    metadata: Empty,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Annotations<'a> {
    #[serde(
        rename = "fleetgate.io/cluster",
        skip_serializing_if = "Option::is_none"
    )]
    cluster: Option<&'a str>,
    #[serde(rename = "fleetgate.io/latency-us")]
    latency_us: String,
    #[serde(
        rename = "fleetgate.io/aborted",
        skip_serializing_if = "Option::is_none"
    )]
    aborted: Option<&'static str>,
}

/// The cluster a request was for (`fleet` for the fleet view's) and its verb.
fn cluster_and_verb(request: &AuditRequest) -> (Option<&str>, &'static str) {
    match &request.classified {
        Some(classified) if classified.fleet => (Some("fleet"), classified.verb),
        Some(classified) => (
            request.target.get(classified.cluster.clone()),
            classified.verb,
        ),
        // Refused before it was routed: kube-apiserver's verb for a non-resource request, the
        // method.
        None => (None, non_resource_verb(&request.method)),
    }
}

fn event(record: &Record, audit_id: uuid::Uuid) -> Event<'_> {
    let request = &record.request;
    let (cluster, verb) = cluster_and_verb(request);
    let object_ref = request.classified.as_ref().and_then(|classified| {
        let text = |span: &std::ops::Range<usize>| {
            request.target.get(span.clone()).unwrap_or("").to_string()
        };
        classified.object.as_ref().map(|spans| ObjectRef {
            resource: text(&spans[0]),
            namespace: text(&spans[1]),
            name: text(&spans[2]),
            api_group: text(&spans[3]),
            api_version: text(&spans[4]),
            subresource: text(&spans[5]),
        })
    });
    let (code, aborted) = record.outcome.parts();
    Event {
        kind: "Event",
        api_version: "audit.k8s.io/v1",
        level: "Metadata",
        audit_id: audit_id.to_string(),
        stage: "ResponseComplete",
        request_uri: &request.target,
        verb,
        user: request
            .user
            .as_deref()
            .map_or(UserInfo::UNAUTHENTICATED, UserInfo::from),
        impersonated_user: request.impersonated.as_deref().map(UserInfo::from),
        source_ips: [request.source_ip.to_string()],
        user_agent: request.user_agent.as_deref(),
        object_ref,
        response_status: code.map(|code| ResponseStatus {
            metadata: Empty {},
            code,
        }),
        request_received_timestamp: rfc3339_micros(record.received),
        stage_timestamp: rfc3339_micros(record.received + record.latency),
        annotations: Annotations {
            cluster,
            latency_us: record.latency.as_micros().to_string(),
            aborted,
        },
    }
}

/// kube-apiserver's verb for a non-resource request: the lower-cased method.
fn non_resource_verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "get",
        http::Method::HEAD => "head",
        http::Method::POST => "post",
        http::Method::PUT => "put",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        http::Method::OPTIONS => "options",
        _ => "other",
    }
}

/// RFC 3339 in UTC with microseconds, as kube-apiserver writes audit timestamps.
fn rfc3339_micros(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GET of `target` from 127.0.0.1 by no one (not authenticated yet), not classified.
    fn get(target: &str) -> AuditRequest {
        AuditRequest {
            method: http::Method::GET,
            target: target.into(),
            user_agent: None,
            user: None,
            impersonated: None,
            source_ip: "127.0.0.1".parse().unwrap(),
            classified: None,
        }
    }

    /// A client authenticated as `user`, in no group.
    fn named(user: &str) -> ClientIdentity {
        let mut identity = ClientIdentity::anonymous();
        identity.user = user.into();
        identity
    }

    /// The event of a request for `target` on member1, classified as a shard classifies it.
    fn classified_event(method: http::Method, target: &str) -> serde_json::Value {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let rest = path.strip_prefix("/clusters/member1").unwrap();
        let info = RequestInfo::parse(
            method.as_str().as_bytes(),
            rest.as_bytes(),
            query.as_bytes(),
        );
        let request = AuditRequest {
            method,
            classified: Some(Classified::new(&target[10..17], &info, target.as_bytes())),
            ..get(target)
        };
        let record = Record {
            request,
            received: SystemTime::now(),
            latency: Duration::ZERO,
            outcome: Outcome::Complete(200),
        };
        serde_json::to_value(event(&record, uuid::Uuid::nil())).unwrap()
    }

    #[test]
    fn verbs_and_object_refs_are_the_shards_request_info() {
        let pod = classified_event(
            http::Method::GET,
            "/clusters/member1/api/v1/namespaces/default/pods/web-1/log",
        );
        assert_eq!(pod["verb"], "get");
        assert_eq!(
            pod["objectRef"],
            serde_json::json!({"resource": "pods", "namespace": "default", "name": "web-1",
                "apiVersion": "v1", "subresource": "log"})
        );
        let deployments = classified_event(
            http::Method::GET,
            "/clusters/member1/apis/apps/v1/namespaces/ns1/deployments?watch=1",
        );
        assert_eq!(deployments["verb"], "watch");
        assert_eq!(deployments["objectRef"]["apiGroup"], "apps");
        assert!(deployments["objectRef"].get("name").is_none());
        // An exec is kube-apiserver's: the verb of its method, the subresource named.
        let exec = classified_event(
            http::Method::POST,
            "/clusters/member1/api/v1/namespaces/d/pods/p/exec?command=ls",
        );
        assert_eq!(exec["verb"], "create");
        assert_eq!(exec["objectRef"]["subresource"], "exec");
        let collection = classified_event(
            http::Method::DELETE,
            "/clusters/member1/api/v1/namespaces/d/pods",
        );
        assert_eq!(collection["verb"], "deletecollection");
        let discovery = classified_event(http::Method::POST, "/clusters/member1/apis");
        assert_eq!(discovery["verb"], "post");
        assert!(discovery.get("objectRef").is_none());
        assert_eq!(discovery["annotations"]["fleetgate.io/cluster"], "member1");
    }

    const TARGET: &str = "/clusters/member1/api/v1/namespaces/default/pods?limit=500";

    #[test]
    fn event_has_the_audit_k8s_io_shape() {
        let record = Record {
            request: AuditRequest {
                user_agent: Some("kubectl/v1.32.0".into()),
                user: Some(Arc::new({
                    let mut alice = named("alice");
                    alice.groups = vec!["devs".into()];
                    alice.uid = Some("alice-uid".into());
                    alice.extra = vec![("team".into(), vec!["blue".into()])];
                    alice
                })),
                classified: Some(Classified::new(
                    &TARGET[10..17],
                    &RequestInfo::parse(b"GET", &TARGET.as_bytes()[17..48], b"limit=500"),
                    TARGET.as_bytes(),
                )),
                ..get(TARGET)
            },
            received: SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
            latency: Duration::from_micros(1500),
            outcome: Outcome::Complete(200),
        };
        let line = serde_json::to_value(event(&record, uuid::Uuid::nil())).unwrap();
        assert_eq!(line["kind"], "Event");
        assert_eq!(line["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(line["level"], "Metadata");
        assert_eq!(line["stage"], "ResponseComplete");
        assert_eq!(line["verb"], "list");
        assert_eq!(line["user"]["username"], "alice");
        assert_eq!(line["user"]["groups"][0], "devs");
        assert_eq!(line["user"]["uid"], "alice-uid");
        assert_eq!(line["user"]["extra"]["team"][0], "blue");
        assert_eq!(line["sourceIPs"][0], "127.0.0.1");
        assert_eq!(line["objectRef"]["resource"], "pods");
        assert_eq!(line["objectRef"]["namespace"], "default");
        assert_eq!(line["responseStatus"]["code"], 200);
        assert_eq!(
            line["requestReceivedTimestamp"],
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(line["stageTimestamp"], "2023-11-14T22:13:20.124956Z");
        assert_eq!(line["annotations"]["fleetgate.io/cluster"], "member1");
        assert_eq!(line["annotations"]["fleetgate.io/latency-us"], "1500");
        assert!(line.get("impersonatedUser").is_none());
    }

    #[test]
    fn an_honoured_impersonation_is_named() {
        let alice = Arc::new(named("alice"));
        let bob = Arc::new(named("bob"));
        let request = AuditRequest {
            source_ip: "::1".parse().unwrap(),
            ..get("/clusters/m1/api/v1/namespaces")
        };
        let same = request.clone().identity(Some(&alice), Some(&alice));
        assert!(same.impersonated.is_none());
        let record = Record {
            request: request.identity(Some(&alice), Some(&bob)),
            received: SystemTime::now(),
            latency: Duration::ZERO,
            outcome: Outcome::Aborted(None, "client went away"),
        };
        let line = serde_json::to_value(event(&record, uuid::Uuid::new_v4())).unwrap();
        assert_eq!(line["user"]["username"], "alice");
        assert_eq!(line["impersonatedUser"]["username"], "bob");
        assert!(line.get("responseStatus").is_none());
        assert_eq!(
            line["annotations"]["fleetgate.io/aborted"],
            "client went away"
        );
        assert_eq!(line["sourceIPs"][0], "::1");
    }

    #[test]
    fn audit_ids_are_distinct_version_4_uuids() {
        let mut ids = AuditIds::seeded();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = ids.next_id();
            assert_eq!(id.get_version_num(), 4);
            assert!(seen.insert(id));
        }
    }

    /// What `tracing` wrote while `f` ran, as the gateway's text log would have it.
    // A test's capture, not the data path (clippy.toml): the subscriber's writer is shared.
    #[allow(clippy::disallowed_types)]
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_access_line_names_the_request_and_its_audit_id_and_no_query() {
        let target = "/clusters/member1/api/v1/namespaces/default/pods?limit=500&token=secret";
        let request = AuditRequest {
            user_agent: Some("kubectl/v1.32.0".into()),
            user: Some(Arc::new(named("alice"))),
            classified: Some(Classified::new(
                &target[10..17],
                &RequestInfo::parse(b"GET", &target.as_bytes()[17..48], b"limit=500"),
                target.as_bytes(),
            )),
            ..get(target)
        };
        let record = Record {
            request,
            received: SystemTime::now(),
            latency: Duration::from_micros(4231),
            outcome: Outcome::Complete(200),
        };
        let id = uuid::Uuid::new_v4();
        let line = logged(|| access_line(&record, id));
        assert!(line.contains(" INFO fleetgate::access: request"), "{line}");
        for field in [
            "user=\"alice\"",
            "verb=\"list\"",
            "path=\"/clusters/member1/api/v1/namespaces/default/pods\"",
            "cluster=\"member1\"",
            "code=200",
            "duration_ms=4.231",
            "source=127.0.0.1",
        ] {
            assert!(line.contains(field), "{field} missing: {line}");
        }
        assert!(line.contains(&format!("audit_id={id}")), "{line}");
        assert!(!line.contains("secret"), "{line}");
        assert!(!line.contains("aborted"), "{line}");
        // Refused before routing, cut short: no cluster, the anonymous user, why it was cut.
        let record = Record {
            request: AuditRequest {
                classified: None,
                user: None,
                ..record.request
            },
            outcome: Outcome::Aborted(None, "client went away"),
            ..record
        };
        let line = logged(|| access_line(&record, id));
        assert!(line.contains("user=\"system:anonymous\""), "{line}");
        assert!(line.contains("verb=\"get\""), "{line}");
        assert!(line.contains("aborted=\"client went away\""), "{line}");
        assert!(
            !line.contains("cluster=") && !line.contains("code="),
            "{line}"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        // A writer that never reads: a channel nobody drains.
        let (sender, _receiver) = mpsc::sync_channel(2);
        let log = AuditLog {
            sender,
            dropped: Counter::default(),
        };
        let request = get("/healthz");
        for _ in 0..5 {
            log.record(request.clone(), Instant::now(), Outcome::Complete(200));
        }
        assert_eq!(log.dropped.get(), 3);
    }
}
