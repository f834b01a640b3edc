//! Watch streams (`?watch=true`): a 200 chunked response that carries one JSON event per line
//! (`{"type":...,"object":...}`), one chunk per event when live, BOOKMARKs when asked for, the
//! terminating chunk at `timeoutSeconds`, and a 410 Expired ERROR event inside the 200 stream for a
//! resourceVersion older than the history window (fixtures README, Surprise 10). Table watches
//! (kubectl `get -w`) carry `columnDefinitions` in the first event only.
//!
//! A watch costs one broadcast receiver and the response body's state: no task of its own, no copy
//! of the store; plain-JSON events reuse the bytes encoded once per event. Once the member's
//! watches are stalled (`faults`), an open watch sends nothing more, as over a dead connection.
//! Called by `api`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::sim::api::RequestInfo;
use crate::sim::body::SimBody;
use crate::sim::objects::Selectors;
use crate::sim::resources::ResourceInfo;
use crate::sim::status::{base_response, ApiError};
use crate::sim::store::{EventType, StoredEvent};
use crate::sim::table::{self, IncludeObject, OutputFormat, TableOptions};

/// How a watcher encodes events.
enum Encoding {
    Json,
    Table {
        version: &'static str,
        include: IncludeObject,
        columns_sent: bool,
    },
}

struct WatchState {
    resource: &'static ResourceInfo,
    namespace: Option<String>,
    selectors: Selectors,
    initial: VecDeque<Arc<StoredEvent>>,
    /// A final ERROR event (410) to send, then end.
    error: Option<Bytes>,
    /// `sendInitialEvents=true` (watch-list): a BOOKMARK annotated
    /// `k8s.io/initial-events-end` follows the initial events, at this resourceVersion.
    initial_events_end: Option<u64>,
    receiver: tokio::sync::broadcast::Receiver<Arc<StoredEvent>>,
    encoding: Encoding,
    deadline: Option<Instant>,
    bookmarks: bool,
    bookmark_interval: Duration,
    next_bookmark: Option<Instant>,
    last_sent_rv: u64,
    last_seen_rv: u64,
    done: bool,
}

impl WatchState {
    /// What this watcher sees of `event`: None (filtered out), or the event type to send. A
    /// MODIFIED event becomes ADDED or DELETED when the object starts or stops matching the
    /// selectors, as the apiserver's watch cache does.
    fn visible_as(&self, event: &StoredEvent) -> Option<EventType> {
        if event.resource != self.resource.store_key()
            || self
                .namespace
                .as_deref()
                .is_some_and(|ns| ns != event.namespace)
        {
            return None;
        }
        let now = self.selectors.matches(&event.object);
        match (&event.previous, event.event_type) {
            (Some(previous), EventType::Modified) => {
                match (self.selectors.matches(previous), now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
            (_, event_type) => now.then_some(event_type),
        }
    }

    fn encode(&mut self, event: &StoredEvent, seen_as: EventType) -> Bytes {
        match &mut self.encoding {
            Encoding::Json if seen_as == event.event_type => event.json_line(),
            Encoding::Json => event_line(seen_as.as_str(), &event.object),
            Encoding::Table {
                version,
                include,
                columns_sent,
            } => {
                let doc = table::table(
                    std::slice::from_ref(&event.object),
                    &TableOptions {
                        resource: self.resource.plural,
                        version,
                        include: *include,
                        with_columns: !*columns_sent,
                        list_metadata: json!({"resourceVersion": event.rv.to_string()}),
                    },
                );
                *columns_sent = true;
                event_line(seen_as.as_str(), &doc)
            }
        }
    }

    fn bookmark(&self) -> Bytes {
        let object = json!({
            "kind": self.resource.kind,
            "apiVersion": self.resource.api_version(),
            "metadata": {"resourceVersion": self.last_seen_rv.to_string(), "creationTimestamp": null},
        });
        event_line("BOOKMARK", &object)
    }

    fn schedule_bookmark(&mut self) {
        if !self.bookmarks {
            self.next_bookmark = None;
            return;
        }
        let heartbeat = Instant::now() + self.bookmark_interval;
        // One more shortly before the deadline, as the apiserver does.
        let before_deadline = self
            .deadline
            .map(|d| d.checked_sub(Duration::from_secs(2)).unwrap_or(d))
            .filter(|t| *t > Instant::now());
        self.next_bookmark = Some(match before_deadline {
            Some(t) if t < heartbeat => t,
            _ => heartbeat,
        });
    }

    /// The next chunk to send, or None at the end of the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Some(error) = self.error.take() {
            self.done = true;
            return Some(error);
        }
        while let Some(event) = self.initial.pop_front() {
            self.last_seen_rv = self.last_seen_rv.max(event.rv);
            if let Some(seen_as) = self.visible_as(&event) {
                self.last_sent_rv = self.last_sent_rv.max(event.rv);
                return Some(self.encode(&event, seen_as));
            }
        }
        if let Some(rv) = self.initial_events_end.take() {
            self.last_sent_rv = self.last_sent_rv.max(rv);
            let object = json!({
                "kind": self.resource.kind,
                "apiVersion": self.resource.api_version(),
                "metadata": {
                    "resourceVersion": rv.to_string(),
                    "creationTimestamp": null,
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            });
            return Some(event_line("BOOKMARK", &object));
        }
        loop {
            let deadline = self.deadline;
            let bookmark_at = self.next_bookmark;
            tokio::select! {
                received = self.receiver.recv() => match received {
                    Ok(event) => {
                        self.last_seen_rv = self.last_seen_rv.max(event.rv);
                        if let Some(seen_as) = self.visible_as(&event) {
                            self.last_sent_rv = event.rv;
                            return Some(self.encode(&event, seen_as));
                        }
                    }
                    Err(RecvError::Lagged(skipped)) => {
                        tracing::debug!(skipped, "watcher fell behind; ending it with 410");
                        self.done = true;
                        return Some(expired_event(self.last_sent_rv, self.last_seen_rv));
                    }
                    Err(RecvError::Closed) => return None,
                },
                _ = sleep_until_opt(deadline) => return None,
                _ = sleep_until_opt(bookmark_at) => {
                    self.schedule_bookmark();
                    if self.last_seen_rv > self.last_sent_rv {
                        self.last_sent_rv = self.last_seen_rv;
                        return Some(self.bookmark());
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut out =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

fn expired_event(requested: u64, oldest: u64) -> Bytes {
    let status = ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
        .to_status_value();
    event_line("ERROR", &status)
}

/// Serves a watch of `resource` in `namespace` (or all namespaces).
pub fn serve(
    info: &RequestInfo<'_>,
    resource: &'static ResourceInfo,
    namespace: Option<&str>,
) -> Result<Response<SimBody>, ApiError> {
    let selectors = Selectors::parse(info, resource)?;
    let from_rv = match info.query.get("resourceVersion").filter(|rv| !rv.is_empty()) {
        None | Some("0") => None,
        Some(rv) => Some(rv.parse::<u64>().map_err(|_| ApiError::Status {
            code: 500,
            reason: None,
            message: format!("resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"),
            details: None,
            metadata: None,
        })?),
    };
    let encoding = match info.format {
        OutputFormat::Table(version) => Encoding::Table {
            version,
            include: IncludeObject::parse(info.query.get("includeObject")),
            columns_sent: false,
        },
        _ => Encoding::Json,
    };
    let deadline = info
        .query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(|secs| Instant::now() + Duration::from_secs(secs));
    // The member's own request timeout ends the watch first when it is shorter.
    let deadline = match (deadline, info.member.tuning.watch_timeout) {
        (Some(asked), Some(own)) => Some(asked.min(Instant::now() + own)),
        (None, Some(own)) => Some(Instant::now() + own),
        (asked, None) => asked,
    };
    let store = &info.member.store;
    let (initial, receiver, error, start_rv) =
        match store.watch(resource.store_key(), namespace, from_rv, |o| {
            selectors.matches(o)
        }) {
            Ok(start) => (
                start.initial,
                start.receiver,
                None,
                from_rv.unwrap_or(start.current_rv),
            ),
            Err(too_old) => {
                let receiver = store.watch(resource.store_key(), namespace, None, |_| false);
                let Ok(start) = receiver else {
                    return Err(ApiError::expired("too old resource version"));
                };
                (
                    Vec::new(),
                    start.receiver,
                    Some(expired_event(too_old.requested, too_old.oldest)),
                    too_old.requested,
                )
            }
        };
    let initial_events_end =
        (info.query.flag("sendInitialEvents") && from_rv.is_none()).then_some(start_rv);
    let mut state = WatchState {
        resource,
        namespace: namespace.map(str::to_string),
        selectors,
        initial: initial.into(),
        error,
        initial_events_end,
        receiver,
        encoding,
        deadline,
        bookmarks: info.query.flag("allowWatchBookmarks"),
        bookmark_interval: info.member.tuning.bookmark_interval,
        next_bookmark: None,
        last_sent_rv: start_rv,
        last_seen_rv: start_rv,
        done: false,
    };
    state.schedule_bookmark();
    let open = info.member.watch_opened(resource.plural);
    let member = Arc::clone(info.member);
    let (sender, body) = crate::sim::body::channel(16);
    // One task per watch: it owns the receiver and the filter, and ends when the stream ends or
    // the client goes away (the body, and with it the channel's receiver, is dropped). Once the
    // member's watches are stalled (`faults`), it sends nothing more until the client leaves.
    tokio::spawn(async move {
        let _open = open;
        loop {
            tokio::select! {
                _ = member.faults.stalls() => {
                    sender.closed().await;
                    break;
                }
                chunk = state.next_chunk() => match chunk {
                    Some(chunk) => {
                        if sender.send(chunk).await.is_err() {
                            break;
                        }
                    }
                    None => break,
                },
                _ = sender.closed() => break,
            }
        }
    });
    base_response(StatusCode::OK, Some("application/json"), &info.ctx)
        .body(body)
        .map_err(|e| ApiError::status(500, "InternalError", e.to_string()))
}
