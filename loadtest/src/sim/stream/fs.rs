//! The in-memory filesystem of a simulated pod: directories and regular files, shared by every
//! exec session of that pod (so `kubectl cp` into a pod and back out finds the file), kept for
//! the life of the process, keyed by namespace/pod.
//!
//! Called by the built-in commands (`stream::shell`, `stream::tar`). It never touches the host
//! filesystem and holds no file handles: every operation locks, acts and unlocks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// One node of the tree.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Dir {
        modified: SystemTime,
    },
    File {
        data: Vec<u8>,
        mode: u32,
        modified: SystemTime,
    },
}

/// Why a filesystem operation failed, worded as coreutils would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FsError {
    #[error("No such file or directory")]
    NotFound,
    #[error("Not a directory")]
    NotADirectory,
    #[error("Is a directory")]
    IsADirectory,
    #[error("File exists")]
    Exists,
    #[error("Directory not empty")]
    NotEmpty,
}

/// The tree itself: absolute normalized paths to nodes. `/` always exists.
#[derive(Debug)]
pub(crate) struct FsTree {
    nodes: BTreeMap<String, Node>,
}

/// A pod's filesystem, shared by its sessions.
pub(crate) type PodFs = Arc<Mutex<FsTree>>;

/// The filesystem of `namespace/pod`, created on first use with a small base image.
pub(crate) fn pod_filesystem(namespace: &str, pod: &str) -> PodFs {
    static ALL: OnceLock<Mutex<HashMap<String, PodFs>>> = OnceLock::new();
    let key = format!("{namespace}/{pod}");
    let mut all = ALL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    all.entry(key)
        .or_insert_with(|| Arc::new(Mutex::new(FsTree::base_image(pod))))
        .clone()
}

/// Locks a pod filesystem; a panic in another session cannot leave the tree half-written
/// (every mutation is a single map operation), so poisoning is ignored.
pub(crate) fn lock(fs: &PodFs) -> std::sync::MutexGuard<'_, FsTree> {
    fs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Joins `path` onto `cwd` and removes `.`, `..` and duplicate slashes.
pub(crate) fn normalize(cwd: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{cwd}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl FsTree {
    fn base_image(hostname: &str) -> Self {
        let now = SystemTime::now();
        let mut nodes = BTreeMap::new();
        for dir in [
            "/", "/bin", "/etc", "/home", "/root", "/tmp", "/usr", "/var",
        ] {
            nodes.insert(dir.to_string(), Node::Dir { modified: now });
        }
        let files = [
            ("/etc/hostname", format!("{hostname}\n")),
            (
                "/etc/hosts",
                format!("127.0.0.1\tlocalhost\n10.0.0.1\t{hostname}\n"),
            ),
            (
                "/etc/os-release",
                "NAME=\"fleetgate-sim\"\nID=fleetgate-sim\n".to_string(),
            ),
        ];
        for (path, content) in files {
            nodes.insert(
                path.to_string(),
                Node::File {
                    data: content.into_bytes(),
                    mode: 0o644,
                    modified: now,
                },
            );
        }
        FsTree { nodes }
    }

    pub(crate) fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub(crate) fn is_dir(&self, path: &str) -> bool {
        matches!(self.nodes.get(path), Some(Node::Dir { .. }))
    }

    pub(crate) fn read_file(&self, path: &str) -> Result<Vec<u8>, FsError> {
        match self.nodes.get(path) {
            Some(Node::File { data, .. }) => Ok(data.clone()),
            Some(Node::Dir { .. }) => Err(FsError::IsADirectory),
            None => Err(FsError::NotFound),
        }
    }

    fn check_parent(&self, path: &str) -> Result<(), FsError> {
        match self.nodes.get(parent_of(path)) {
            Some(Node::Dir { .. }) => Ok(()),
            Some(Node::File { .. }) => Err(FsError::NotADirectory),
            None => Err(FsError::NotFound),
        }
    }

    /// Creates or truncates (or appends to) a regular file; the parent must exist.
    pub(crate) fn write_file(
        &mut self,
        path: &str,
        data: &[u8],
        append: bool,
    ) -> Result<(), FsError> {
        self.check_parent(path)?;
        let now = SystemTime::now();
        match self.nodes.get_mut(path) {
            Some(Node::Dir { .. }) => Err(FsError::IsADirectory),
            Some(Node::File {
                data: existing,
                modified,
                ..
            }) => {
                if !append {
                    existing.clear();
                }
                existing.extend_from_slice(data);
                *modified = now;
                Ok(())
            }
            None => {
                self.nodes.insert(
                    path.to_string(),
                    Node::File {
                        data: data.to_vec(),
                        mode: 0o644,
                        modified: now,
                    },
                );
                Ok(())
            }
        }
    }

    /// Sets the permission bits of a file (directories keep theirs).
    pub(crate) fn set_mode(&mut self, path: &str, new_mode: u32) {
        if let Some(Node::File { mode, .. }) = self.nodes.get_mut(path) {
            *mode = new_mode & 0o7777;
        }
    }

    /// `mkdir` (with `parents`, `mkdir -p`).
    pub(crate) fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), FsError> {
        match self.nodes.get(path) {
            Some(Node::Dir { .. }) if parents => return Ok(()),
            Some(_) => return Err(FsError::Exists),
            None => {}
        }
        if parents && path != "/" {
            self.mkdir(parent_of(path), true)?;
        } else {
            self.check_parent(path)?;
        }
        self.nodes.insert(
            path.to_string(),
            Node::Dir {
                modified: SystemTime::now(),
            },
        );
        Ok(())
    }

    /// Names of the direct children of a directory, sorted.
    pub(crate) fn list(&self, dir: &str) -> Result<Vec<String>, FsError> {
        match self.nodes.get(dir) {
            Some(Node::Dir { .. }) => {}
            Some(Node::File { .. }) => return Err(FsError::NotADirectory),
            None => return Err(FsError::NotFound),
        }
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        Ok(self
            .nodes
            .range(prefix.clone()..)
            .take_while(|(path, _)| path.starts_with(&prefix))
            .filter_map(|(path, _)| {
                let rest = &path[prefix.len()..];
                (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
            })
            .collect())
    }

    /// `rm` (with `recursive`, `rm -r`).
    pub(crate) fn remove(&mut self, path: &str, recursive: bool) -> Result<(), FsError> {
        match self.nodes.get(path) {
            None => Err(FsError::NotFound),
            Some(Node::File { .. }) => {
                self.nodes.remove(path);
                Ok(())
            }
            Some(Node::Dir { .. }) => {
                if path == "/" {
                    return Err(FsError::NotEmpty);
                }
                let prefix = format!("{path}/");
                let children: Vec<String> = self
                    .nodes
                    .range(prefix.clone()..)
                    .take_while(|(p, _)| p.starts_with(&prefix))
                    .map(|(p, _)| p.clone())
                    .collect();
                if !children.is_empty() && !recursive {
                    return Err(FsError::NotEmpty);
                }
                for child in children {
                    self.nodes.remove(&child);
                }
                self.nodes.remove(path);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_resolves_dots_and_relative_paths() {
        assert_eq!(normalize("/tmp", "a/../b/./c"), "/tmp/b/c");
        assert_eq!(normalize("/", "../.."), "/");
        assert_eq!(normalize("/x", "/etc//hostname"), "/etc/hostname");
    }

    #[test]
    fn files_and_directories_behave_like_a_tree() {
        let mut fs = FsTree::base_image("p");
        assert_eq!(
            fs.write_file("/nope/x", b"1", false),
            Err(FsError::NotFound)
        );
        fs.mkdir("/a/b/c", true).unwrap();
        fs.write_file("/a/b/c/f", b"hello", false).unwrap();
        fs.write_file("/a/b/c/f", b" world", true).unwrap();
        assert_eq!(fs.read_file("/a/b/c/f").unwrap(), b"hello world");
        assert_eq!(fs.list("/a/b").unwrap(), vec!["c".to_string()]);
        assert_eq!(fs.remove("/a", false), Err(FsError::NotEmpty));
        fs.remove("/a", true).unwrap();
        assert!(fs.get("/a/b/c/f").is_none());
        assert!(fs.list("/").unwrap().contains(&"tmp".to_string()));
    }
}
