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
//! Loading, validating and building run on the watcher's own thread, never on a shard. Files
//! referenced from outside the watched path (a `tokenFile` elsewhere) are read on each reload but
//! not watched themselves. Started by `fleetgate serve` after the first table is built.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecursiveMode, Watcher};
use tracing::{debug, warn};

use crate::load::load_path;
use crate::reload::{ReloadOutcome, TablePublisher};

/// A reload starts once no change has been seen for this long.
pub const DEBOUNCE_QUIET: Duration = Duration::from_millis(100);
/// ...or this long after the first change of a burst that does not stop (a reload storm).
pub const DEBOUNCE_MAX: Duration = Duration::from_millis(400);

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
/// every valid change. Checks the path once right after the watch is in place, so a change made
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
            reload(&path, &source, &publisher);
            while let Some(first) = next_relevant(&events_rx, None) {
                debug!(source = %source, event = ?first, "config path changed");
                let burst_start = Instant::now();
                // Debounce: wait for quiet, bounded by DEBOUNCE_MAX from the first event.
                loop {
                    let left = DEBOUNCE_MAX.saturating_sub(burst_start.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    match next_relevant(&events_rx, Some(DEBOUNCE_QUIET.min(left))) {
                        Some(_) => continue,
                        None => break,
                    }
                }
                reload(&path, &source, &publisher);
            }
            debug!(source = %source, "config watch ended");
        })
        .map_err(WatchError::Thread)?;
    Ok(FileWatcher {
        _watcher: watcher,
        _thread: thread,
    })
}

/// The next event that can change what `load_path` reads; `None` when the channel closed or the
/// timeout passed. Reads (our own, on every reload) are not changes.
fn next_relevant(
    events: &mpsc::Receiver<notify::Result<notify::Event>>,
    timeout: Option<Duration>,
) -> Option<notify::Result<notify::Event>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let received = match deadline {
            None => events.recv().ok(),
            Some(deadline) => events
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let event = received?;
        match &event {
            Ok(e) if is_read_only(&e.kind) => continue,
            // An error (e.g. the inotify queue overflowed) may hide changes: reload to be sure.
            Err(error) => {
                warn!(%error, "config watch error; reloading to be safe");
                return Some(event);
            }
            Ok(_) => return Some(event),
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

fn reload(path: &Path, source: &str, publisher: &TablePublisher) -> ReloadOutcome {
    publisher.publish(source, load_path(path))
}
