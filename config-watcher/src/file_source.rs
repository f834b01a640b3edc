//! The file source: watches the `--config` path with inotify (the `notify` crate) and reloads it
//! on every change, through a [`TablePublisher`].
//!
//! A directory is watched recursively; a single file is watched through its parent directory, so
//! the atomic replace that editors do (write a temporary file, rename it over the old one) and the
//! symlink swap of a Kubernetes ConfigMap mount (`..data` re-pointed by a rename) are seen as the
//! changes they are, not as the watched inode disappearing. Bursts (an editor's several writes, a
//! `cp -r`) are debounced: the reload starts once the path has been quiet for
//! [`DEBOUNCE_QUIET`], or [`DEBOUNCE_MAX`] after the first event while changes keep coming.
//!
//! Files the objects name (the serving certificate, key and client CA, the token file, a
//! `jwksFile`, a cluster's credentials) often live outside the watched path: a Secret mounted
//! apart from the ConfigMap, which cert-manager rewrites in place and the kubelet swaps in
//! through a `..data` symlink. Rather than one inotify watch per such file (which would follow
//! the old inode of a swapped symlink, and miss a file created later), the path is also loaded
//! again every [`POLL_INTERVAL`] and published only when the result differs from the serving
//! configuration: the comparison is of the files' contents, so a touched but unchanged file does
//! nothing, and a swap is seen whatever inode it leaves behind. A poll that loads just what the
//! last load did is dropped (a broken file is logged and counted once, not every two seconds),
//! and a poll's rejection counts only if a second load 0.4 s later rejects too.
//!
//! Objects are judged one by one (`judge`): a broken file or object is reported and keeps its
//! last good version (or is left out), while every other file's changes are served.
//!
//! Loading, validating and building run on the watcher's own thread, never on a shard. Started
//! by `fleetgate serve` after the first table is built.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecursiveMode, Watcher};
use tracing::{debug, warn};

use crate::judge::LoadedObjects;
use crate::load::load_objects;
use crate::reload::{ReloadOutcome, TablePublisher};

/// A reload starts once no change has been seen for this long.
pub const DEBOUNCE_QUIET: Duration = Duration::from_millis(100);
/// ...or this long after the first change of a burst that does not stop (a reload storm).
pub const DEBOUNCE_MAX: Duration = Duration::from_millis(400);

/// How often the path (and every file its objects name) is loaded again to catch changes no
/// inotify event reports: a rotated certificate or token file outside the watched path. A load
/// reads a few small files; at this pace it costs nothing measurable.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// inotify refused (no such path, or the per-user instance / watch limit is reached).
    #[error("cannot watch {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
    /// The watcher thread could not be spawned.
    #[error("cannot start the config watcher thread")]
    Thread(#[source] std::io::Error),
}

/// A running file watch. Dropping it stops the inotify watch and, with it, the reload thread.
pub struct FileWatcher {
    // Field order matters: the watcher (which owns the event sender) drops first, which ends the
    // reload thread's channel and lets the thread exit.
    _watcher: notify::RecommendedWatcher,
    _thread: JoinHandle<()>,
}

impl std::fmt::Debug for FileWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileWatcher")
    }
}

/// Watches `path` (a file or a directory, as `load_path` takes it) and publishes a new table on
/// every change, judging its objects one by one. Checks the path once right after the watch is in place, so a change made
/// between the first load and this call is not missed.
pub fn watch_config_path(
    path: &Path,
    publisher: TablePublisher,
) -> Result<FileWatcher, WatchError> {
    let path = path.to_owned();
    let (events_tx, events_rx) = mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher =
        notify::recommended_watcher(events_tx).map_err(|source| WatchError::Watch {
            path: path.clone(),
            source,
        })?;
    let (watched, mode) = if path.is_dir() {
        (path.clone(), RecursiveMode::Recursive)
    } else {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        (parent, RecursiveMode::NonRecursive)
    };
    watcher
        .watch(&watched, mode)
        .map_err(|source| WatchError::Watch {
            path: watched.clone(),
            source,
        })?;
    let thread = std::thread::Builder::new()
        .name("fleetgate-config-watch".into())
        .spawn(move || {
            let source = path.display().to_string();
            let mut reloader = Reloader {
                path: &path,
                source: &source,
                publisher: &publisher,
                last_loaded: None,
            };
            reloader.reload(false);
            loop {
                let first = match next_relevant(&events_rx, Some(POLL_INTERVAL)) {
                    Next::Closed => break,
                    Next::Quiet => {
                        reloader.reload(true);
                        continue;
                    }
                    Next::Event(first) => first,
                };
                debug!(source = %source, event = ?first, "config path changed");
                let burst_start = Instant::now();
                // Debounce: wait for quiet, bounded by DEBOUNCE_MAX from the first event.
                loop {
                    let left = DEBOUNCE_MAX.saturating_sub(burst_start.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    match next_relevant(&events_rx, Some(DEBOUNCE_QUIET.min(left))) {
                        Next::Event(_) => continue,
                        Next::Quiet | Next::Closed => break,
                    }
                }
                reloader.reload(false);
            }
            debug!(source = %source, "config watch ended");
        })
        .map_err(WatchError::Thread)?;
    Ok(FileWatcher {
        _watcher: watcher,
        _thread: thread,
    })
}

/// What waiting for the next event gave.
enum Next {
    /// An event that can change what `load_path` reads.
    Event(notify::Result<notify::Event>),
    /// The timeout passed without one.
    Quiet,
    /// The watch ended.
    Closed,
}

/// The next event that can change what `load_path` reads. Reads (our own, on every reload) are
/// not changes.
fn next_relevant(
    events: &mpsc::Receiver<notify::Result<notify::Event>>,
    timeout: Option<Duration>,
) -> Next {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let received = match deadline {
            None => events.recv().map_err(|_| Next::Closed),
            Some(deadline) => events
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .map_err(|e| match e {
                    mpsc::RecvTimeoutError::Timeout => Next::Quiet,
                    mpsc::RecvTimeoutError::Disconnected => Next::Closed,
                }),
        };
        let event = match received {
            Ok(event) => event,
            Err(next) => return next,
        };
        match &event {
            Ok(e) if is_read_only(&e.kind) => continue,
            // An error (e.g. the inotify queue overflowed) may hide changes: reload to be sure.
            Err(error) => {
                warn!(%error, "config watch error; reloading to be safe");
                return Next::Event(event);
            }
            Ok(_) => return Next::Event(event),
        }
    }
}

fn is_read_only(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => true,
        _ => false,
    }
}

/// The watcher thread's reloads, remembering the last load so a poll does not report it again.
struct Reloader<'a> {
    path: &'a Path,
    source: &'a str,
    publisher: &'a TablePublisher,
    /// What the last published load found (`Err`: the error's message).
    last_loaded: Option<Result<LoadedObjects, String>>,
}

impl Reloader<'_> {
    /// Loads the path and publishes the result. A poll (`polled`) that rejects anything is tried
    /// once more [`DEBOUNCE_MAX`] later (a file caught in the middle of a write, or a certificate
    /// written before its key, is whole by then), and one that loads exactly what the last
    /// attempt did is dropped: it was published and reported then.
    fn reload(&mut self, polled: bool) -> Option<ReloadOutcome> {
        let clean = |l: &Result<LoadedObjects, _>| l.as_ref().is_ok_and(LoadedObjects::is_clean);
        let mut loaded = load_objects(self.path);
        if polled && !clean(&loaded) {
            std::thread::sleep(DEBOUNCE_MAX);
            loaded = load_objects(self.path);
        }
        let seen = loaded.as_ref().map_err(ToString::to_string).cloned();
        if polled && self.last_loaded.as_ref() == Some(&seen) {
            return None;
        }
        let outcome = self.publisher.publish(self.source, loaded);
        self.last_loaded = Some(seen);
        Some(outcome)
    }
}
