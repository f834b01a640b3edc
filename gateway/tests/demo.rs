//! `fleetgate demo` as a newcomer runs it: one command, then kubectl with the kubeconfig it wrote,
//! reaching every simulated member through the gateway, and a clean stop on SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::fleet::KillOnDrop;
use support::kubectl::{assert_failed_with, ran};
use support::wait::LineReader;

fn kubectl(
    kubeconfig: &std::path::Path,
    cache: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .expect("kubectl runs")
}

/// `fleetgate demo` of two members on a free port, one worker, in `dir`, with `extra`; stdout
/// piped.
fn demo_command(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    command
        .args(["demo", "--clusters", "2", "--listen", "127.0.0.1:0"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped());
    command
}

/// `fleetgate demo` in `dir` with `env`, its stderr (and its children's) in `dir/demo.log`, and
/// its ready line once printed (the demo's readiness signal, bounded by the process itself); its
/// later output is drained. Killed when the test ends however it ends: a failed assertion never
/// leaves a fleet and a gateway running.
fn start_demo(dir: &std::path::Path, workers: &str, env: &[(&str, &str)]) -> (KillOnDrop, String) {
    let log = std::fs::File::create(dir.join("demo.log")).unwrap();
    let mut command = demo_command(dir, &["--workers", workers]);
    command.envs(env.iter().copied()).stderr(log);
    let mut demo = KillOnDrop(command.spawn().unwrap());
    let mut lines = BufReader::new(demo.0.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("ready"))
        .expect("demo printed a ready line");
    std::thread::spawn(move || for _ in lines {});
    (demo, ready)
}

#[test]
fn demo_serves_every_member_through_the_gateway_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // A developer's RUST_LOG for fleetgate: it must not reach the simulated fleet (whose crate,
    // fleetgate_loadtest, the directive `fleetgate` covers too) and flood the terminal.
    let (mut demo, ready) = start_demo(dir.path(), "1", &[("RUST_LOG", "fleetgate=debug")]);
    assert!(ready.contains("https://127.0.0.1:"), "{ready}");
    // The admin listener is named, and answers; no pull-mode clause without pull-mode members.
    let admin = ready
        .split_once("admin (/metrics, /readyz) at http://")
        .and_then(|(_, rest)| rest.split(';').next())
        .unwrap_or_else(|| panic!("no admin URL in {ready:?}"));
    let readyz = support::fleet::admin_get(admin.parse().unwrap(), "/readyz");
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    assert!(!ready.contains("pull-mode"), "{ready}");

    let kubeconfig = dir.path().join("kubeconfig");
    let cache = dir.path().join("kube-cache");
    // The kubeconfigs hold the admin (system:masters) key: the owner's only.
    for file in ["kubeconfig", "direct.kubeconfig", "gateway.kubeconfig"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(file))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    let config = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        !config.contains("127.0.0.1:0/"),
        "the kubeconfig names the bound port:\n{config}"
    );
    assert!(config.contains("current-context: member1"), "{config}");

    for context in ["member1", "member2"] {
        let out = kubectl(
            &kubeconfig,
            &cache,
            &["--context", context, "get", "namespaces", "-o", "name"],
        );
        assert!(
            out.status.success(),
            "{context}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let names = String::from_utf8_lossy(&out.stdout);
        assert!(names.contains("namespace/default"), "{context}: {names}");
        let server = kubectl(
            &kubeconfig,
            &cache,
            &[
                "--context",
                context,
                "config",
                "view",
                "--minify",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ],
        );
        let server = String::from_utf8_lossy(&server.stdout);
        assert!(
            server.ends_with(&format!("/clusters/{context}")),
            "{context} goes through the gateway: {server}"
        );
    }
    // The member sees the user the gateway authenticated, not the gateway's own credential
    // (the current context's admin); nor for the kubeconfig's other users, as the README shows
    // them: a bearer token and an OIDC token.
    for (user, expected) in [
        (None, "admin"),
        (Some("alice"), "alice"),
        (Some("alice-oidc"), "oidc:alice"),
    ] {
        let mut args = vec![
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ];
        if let Some(user) = user {
            args.splice(0..0, ["--user", user]);
        }
        let whoami = ran(
            kubectl(&kubeconfig, &cache, &args),
            &format!("whoami as {user:?}"),
        );
        assert_eq!(String::from_utf8_lossy(&whoami.stdout), expected);
    }
    // A write through the gateway lands on that member only.
    let out = kubectl(
        &kubeconfig,
        &cache,
        &[
            "--context",
            "member2",
            "create",
            "configmap",
            "demo-only-on-2",
            "--from-literal=a=b",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let on1 = kubectl(
        &kubeconfig,
        &cache,
        &["--context", "member1", "get", "configmap", "demo-only-on-2"],
    );
    assert_failed_with(&on1, "NotFound");

    // SIGTERM stops the demo, gateway included, promptly and cleanly.
    let pid = demo.0.id() as libc::pid_t;
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid with a valid signal touches no memory.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "demo did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "demo exit: {status}");
    let after = kubectl(
        &kubeconfig,
        &cache,
        &["get", "namespaces", "--request-timeout=2s"],
    );
    assert!(
        !after.status.success(),
        "the gateway is gone after the demo stops"
    );
    // The gateway logged at debug, as asked; the simulated fleet did not (each request it
    // answered would have been a `fleetgate_loadtest::sim::api` debug line).
    let log = std::fs::read_to_string(dir.path().join("demo.log")).unwrap();
    assert!(
        log.contains("DEBUG"),
        "RUST_LOG reached the gateway:\n{log}"
    );
    let sim_debug: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains("fleetgate_loadtest"))
        .collect();
    assert!(sim_debug.is_empty(), "{sim_debug:#?}");
}

/// `fleetgate_sim_open_watches{resource=...}` of a member, read from it directly (the demo's
/// `direct.kubeconfig`, as its admin).
fn member_watches(
    direct: &std::path::Path,
    cache: &std::path::Path,
    context: &str,
    resource: &str,
) -> usize {
    let out = kubectl(
        direct,
        cache,
        &["--context", context, "get", "--raw", "/metrics"],
    );
    support::fleet::sim_open_watches(&out, resource)
}

#[test]
fn the_demos_twenty_kubectl_watches_cost_each_member_one_watch() {
    // Issue 15's done-when: with sharedWatches on (the demo turns it on for configmaps and pods,
    // per gateway), 20 `kubectl get -w` through the gateway, 10 on each member, cost each member
    // one watch of configmaps, however many shards their connections land on.
    const PER_MEMBER: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let (mut demo, _) = start_demo(dir.path(), "2", &[]);
    let kubeconfig = dir.path().join("kubeconfig");
    let direct = dir.path().join("direct.kubeconfig");
    let cache = dir.path().join("kube-cache");
    let gateway = std::fs::read_to_string(dir.path().join("gateway.yaml")).unwrap();
    assert!(
        gateway.contains("sharedWatches") && gateway.contains("configmaps"),
        "the demo shares configmap watches:\n{gateway}"
    );

    let mut watchers = Vec::new();
    for member in ["member1", "member2"] {
        for _ in 0..PER_MEMBER {
            let mut child = KillOnDrop(
                Command::new("/usr/bin/kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .arg("--cache-dir")
                    .arg(&cache)
                    .args(["--context", member, "get", "configmaps", "-w"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let out = LineReader::new(child.0.stdout.take().unwrap());
            watchers.push((member, child, out));
        }
    }
    // Every watcher has listed (kube-root-ca.crt is in every namespace) ...
    for (member, _, out) in &mut watchers {
        out.wait_line(
            &format!("{member}'s kubectl list"),
            Duration::from_secs(60),
            |l| l.starts_with("kube-root-ca.crt"),
        );
    }
    // ... and is watching: a ConfigMap created at the member reaches every one of its watchers.
    for member in ["member1", "member2"] {
        let name = format!("shared-{member}");
        let out = kubectl(
            &direct,
            &cache,
            &["--context", member, "create", "configmap", &name],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (member, _, out) in &mut watchers {
        let name = format!("shared-{member}");
        out.wait_line(
            &format!("{name} at a watcher of {member}"),
            Duration::from_secs(30),
            |l| l.starts_with(name.as_str()),
        );
    }
    for member in ["member1", "member2"] {
        let held = member_watches(&direct, &cache, member, "configmaps");
        assert_eq!(
            held, 1,
            "{member} holds {held} configmap watches for {PER_MEMBER} kubectl watchers on two shards"
        );
    }
    drop(watchers);
    // SIGTERM, so the demo stops its gateway and fleet (a SIGKILL by KillOnDrop would orphan
    // them).
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid with a valid signal touches no memory.
    unsafe {
        libc::kill(demo.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while demo.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "demo did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir_text = dir.path().to_str().unwrap().to_owned();
    let left = processes_naming(&dir_text);
    assert!(left.is_empty(), "left running: {left:#?}");
}

/// The processes whose command line names `needle` (the demo's children all name its --dir).
fn processes_naming(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) {
                found.push(text);
            }
        }
    }
    found
}

#[test]
fn a_demo_whose_stdout_closes_stops_what_it_started() {
    // `fleetgate demo ... | head -1` and the like: the `ready` line cannot be written, so the
    // demo fails, and its fleet, gateway and agent must not be left running, orphaned.
    let dir = tempfile::tempdir().unwrap();
    let dir_text = dir.path().to_str().unwrap().to_owned();
    let mut demo = KillOnDrop(
        demo_command(dir.path(), &["--workers", "1", "--pull", "1"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    drop(demo.0.stdout.take());
    let stderr = demo.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = demo.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the demo did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = log.join().unwrap();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("Broken pipe") || log.contains("os error 32"),
        "{log}"
    );
    let left = processes_naming(&dir_text);
    assert!(left.is_empty(), "left running: {left:#?}");
}
