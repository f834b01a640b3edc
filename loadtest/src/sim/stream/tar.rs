//! `tar` for the simulated container: what `kubectl cp` runs. `tar cf - PATH...` writes an
//! archive of pod files to stdout (member names without the leading `/`, as GNU tar does, which
//! kubectl's untar expects); `tar xmf - [-C DIR]` (and `tar -xmf -`, `--no-same-owner`,
//! `--no-same-permissions`) unpacks stdin into the pod filesystem; `tar tf -` lists.
//!
//! Called by `stream::shell`. Archives are built and read in memory with the `tar` crate; it never
//! touches the host filesystem, and refuses member names that climb out with `..`.

use std::io::Read;

use super::fs::{self, Node};
use super::process::{Sink, Stdin};
use super::shell::ShellState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Create,
    Extract,
    List,
}

/// Runs `tar ARGS` and returns its exit code.
pub(crate) async fn run(
    args: &[String],
    stdin: &mut Stdin,
    out: &Sink,
    err: &Sink,
    st: &ShellState,
) -> i32 {
    let mut mode = None;
    let mut archive: Option<String> = None;
    let mut directory: Option<String> = None;
    let mut members = Vec::new();
    let mut want_archive = false;
    let mut want_directory = false;
    for (index, arg) in args.iter().enumerate() {
        if want_archive {
            archive = Some(arg.clone());
            want_archive = false;
            continue;
        }
        if want_directory {
            directory = Some(arg.clone());
            want_directory = false;
            continue;
        }
        if arg.starts_with("--") {
            match arg.as_str() {
                "--no-same-owner" | "--no-same-permissions" | "--touch" | "--verbose" => {}
                other => {
                    if let Some(dir) = other.strip_prefix("--directory=") {
                        directory = Some(dir.to_string());
                    } else if let Some(file) = other.strip_prefix("--file=") {
                        archive = Some(file.to_string());
                    } else {
                        let _ = err
                            .write_str(&format!("tar: unrecognized option '{other}'\n"))
                            .await;
                        return 2;
                    }
                }
            }
            continue;
        }
        // The first word may be a bundle of letters without a dash (`tar cf - x`).
        let letters = match arg.strip_prefix('-') {
            Some(l) if !l.is_empty() => Some(l),
            _ if index == 0 => Some(arg.as_str()),
            _ => None,
        };
        let Some(letters) = letters else {
            members.push(arg.clone());
            continue;
        };
        for letter in letters.chars() {
            match letter {
                'c' => mode = Some(Mode::Create),
                'x' => mode = Some(Mode::Extract),
                't' => mode = Some(Mode::List),
                'f' => want_archive = true,
                'C' => want_directory = true,
                'm' | 'v' | 'p' | 'o' => {}
                'z' | 'j' | 'J' => {
                    let _ = err
                        .write_str("tar: compression is not supported in this container\n")
                        .await;
                    return 2;
                }
                other => {
                    let _ = err
                        .write_str(&format!("tar: invalid option -- '{other}'\n"))
                        .await;
                    return 2;
                }
            }
        }
    }
    if archive.as_deref().is_some_and(|a| a != "-") {
        let _ = err
            .write_str("tar: only '-' (stdin/stdout) archives are supported\n")
            .await;
        return 2;
    }
    let base = st.ctx.fs.clone();
    let cwd_dir = directory
        .map(|d| st.resolve(&d))
        .unwrap_or_else(|| st.resolve("."));
    match mode {
        Some(Mode::Create) => create(&members, out, err, st, &base).await,
        Some(Mode::Extract) => extract(stdin, err, &cwd_dir, &base).await,
        Some(Mode::List) => list(stdin, out, err).await,
        None => {
            let _ = err
                .write_str("tar: You must specify one of the '-Acdtrux', '--delete' or '--test-label' options\n")
                .await;
            2
        }
    }
}

async fn create(
    members: &[String],
    out: &Sink,
    err: &Sink,
    st: &ShellState,
    pod_fs: &fs::PodFs,
) -> i32 {
    if members.is_empty() {
        let _ = err
            .write_str("tar: Cowardly refusing to create an empty archive\n")
            .await;
        return 2;
    }
    let mut code = 0;
    let mut warned = false;
    let mut messages = Vec::new();
    let archive = {
        let tree = fs::lock(pod_fs);
        let mut builder = tar::Builder::new(Vec::new());
        for member in members {
            let path = st.resolve(member);
            if tree.get(&path).is_none() {
                messages.push(format!(
                    "tar: {member}: Cannot stat: No such file or directory\n"
                ));
                code = 2;
                continue;
            }
            if member.starts_with('/') && !warned {
                messages.insert(
                    0,
                    "tar: Removing leading `/' from member names\n".to_string(),
                );
                warned = true;
            }
            let name = member
                .trim_start_matches('/')
                .trim_end_matches('/')
                .to_string();
            if let Err(e) = append_tree(&mut builder, &tree, &path, &name) {
                messages.push(format!("tar: {member}: {e}\n"));
                code = 2;
            }
        }
        match builder.into_inner() {
            Ok(bytes) => bytes,
            Err(e) => {
                messages.push(format!("tar: {e}\n"));
                return 2;
            }
        }
    };
    if code != 0 {
        messages.push("tar: Exiting with failure status due to previous errors\n".to_string());
    }
    for message in messages {
        let _ = err.write_str(&message).await;
    }
    for chunk in archive.chunks(32 * 1024) {
        if out.write(chunk).await.is_err() {
            return 2;
        }
    }
    code
}

fn append_tree(
    builder: &mut tar::Builder<Vec<u8>>,
    tree: &fs::FsTree,
    path: &str,
    name: &str,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    match tree.get(path) {
        Some(Node::File {
            data,
            mode,
            modified,
        }) => {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(data.len() as u64);
            header.set_mode(*mode);
            header.set_mtime(unix_seconds(*modified));
            builder.append_data(&mut header, name, data.as_slice())?;
        }
        Some(Node::Dir { modified }) => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            header.set_mode(0o755);
            header.set_mtime(unix_seconds(*modified));
            let dir_name = if name.is_empty() {
                "./".to_string()
            } else {
                format!("{name}/")
            };
            builder.append_data(&mut header, &dir_name, std::io::empty())?;
            for child in tree.list(path).unwrap_or_default() {
                let child_path = fs::normalize(path, &child);
                let child_name = if name.is_empty() {
                    child.clone()
                } else {
                    format!("{name}/{child}")
                };
                append_tree(builder, tree, &child_path, &child_name)?;
            }
        }
        None => {}
    }
    Ok(())
}

fn unix_seconds(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn extract(stdin: &mut Stdin, err: &Sink, into: &str, pod_fs: &fs::PodFs) -> i32 {
    let data = stdin.read_to_end().await;
    let mut messages = Vec::new();
    let mut code = 0;
    {
        let mut tree = fs::lock(pod_fs);
        if !tree.is_dir(into) {
            let _ = &mut tree;
            messages.push(format!(
                "tar: {into}: Cannot open: No such file or directory\n"
            ));
            code = 2;
        } else {
            let mut archive = tar::Archive::new(data.as_slice());
            match archive.entries() {
                Err(e) => {
                    messages.push(format!("tar: {e}\n"));
                    code = 2;
                }
                Ok(entries) => {
                    for entry in entries {
                        let mut entry = match entry {
                            Ok(e) => e,
                            Err(e) => {
                                messages.push(format!("tar: {e}\n"));
                                code = 2;
                                break;
                            }
                        };
                        let name = match entry.path() {
                            Ok(p) => p.to_string_lossy().into_owned(),
                            Err(e) => {
                                messages.push(format!("tar: {e}\n"));
                                code = 2;
                                continue;
                            }
                        };
                        if name.split('/').any(|part| part == "..") {
                            messages.push(format!("tar: {name}: Member name contains '..'\n"));
                            code = 2;
                            continue;
                        }
                        let target = fs::normalize(into, name.trim_start_matches('/'));
                        let kind = entry.header().entry_type();
                        let result = if kind.is_dir() {
                            tree.mkdir(&target, true)
                        } else if kind.is_file() {
                            let mut content = Vec::new();
                            if let Err(e) = entry.read_to_end(&mut content) {
                                messages.push(format!("tar: {name}: {e}\n"));
                                code = 2;
                                break;
                            }
                            let parent = fs::normalize(&target, "..");
                            let made = tree.mkdir(&parent, true);
                            let written =
                                made.and_then(|()| tree.write_file(&target, &content, false));
                            if written.is_ok() {
                                if let Ok(mode) = entry.header().mode() {
                                    tree.set_mode(&target, mode);
                                }
                            }
                            written
                        } else {
                            // Links and devices have no place in this filesystem.
                            Ok(())
                        };
                        if let Err(e) = result {
                            messages.push(format!("tar: {name}: Cannot open: {e}\n"));
                            code = 2;
                        }
                    }
                }
            }
        }
    }
    for message in messages {
        let _ = err.write_str(&message).await;
    }
    code
}

async fn list(stdin: &mut Stdin, out: &Sink, err: &Sink) -> i32 {
    let data = stdin.read_to_end().await;
    match member_names(&data) {
        Ok(names) => match out.write_str(&names).await {
            Ok(()) => 0,
            Err(_) => 2,
        },
        Err(e) => {
            let _ = err.write_str(&format!("tar: {e}\n")).await;
            2
        }
    }
}

fn member_names(data: &[u8]) -> std::io::Result<String> {
    let mut names = String::new();
    let mut archive = tar::Archive::new(data);
    for entry in archive.entries()? {
        names.push_str(&entry?.path()?.to_string_lossy());
        names.push('\n');
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use crate::sim::stream::shell::tests::{context, run, sh};
    use crate::sim::stream::status::ProcessExit;

    #[tokio::test]
    async fn an_archive_made_in_one_pod_unpacks_in_another() {
        let source = context("tar-src", false);
        let (exit, _, _) = sh(
            "mkdir -p /data/sub && echo one > /data/a && echo two > /data/sub/b",
            source.clone(),
        )
        .await;
        assert_eq!(exit, ProcessExit::Code(0));
        let (out_tx, mut out_rx) = tokio::sync::mpsc::channel(64);
        let (exit, stderr) = {
            let (err_tx, mut err_rx) = tokio::sync::mpsc::channel(8);
            let io = crate::sim::stream::process::ProcessIo {
                stdin: crate::sim::stream::process::Stdin::empty(),
                stdout: crate::sim::stream::process::Sink::Channel {
                    tx: out_tx,
                    crlf: false,
                },
                stderr: crate::sim::stream::process::Sink::Channel {
                    tx: err_tx,
                    crlf: false,
                },
            };
            let exit = crate::sim::stream::shell::run_exec(
                vec!["tar".into(), "cf".into(), "-".into(), "/data".into()],
                io,
                source,
            )
            .await;
            let mut stderr = Vec::new();
            while let Some(c) = err_rx.recv().await {
                stderr.extend_from_slice(&c);
            }
            (exit, String::from_utf8(stderr).unwrap())
        };
        assert_eq!(exit, ProcessExit::Code(0));
        assert!(stderr.contains("Removing leading"));
        let mut archive = Vec::new();
        while let Some(c) = out_rx.recv().await {
            archive.extend_from_slice(&c);
        }
        let dest = context("tar-dst", false);
        let (exit, _, err) = run(&["tar", "-xmf", "-", "-C", "/tmp"], &archive, dest.clone()).await;
        assert_eq!(exit, ProcessExit::Code(0), "{err}");
        let (_, out, _) = sh("cat /tmp/data/a /tmp/data/sub/b", dest).await;
        assert_eq!(out, "one\ntwo\n");
    }
}
