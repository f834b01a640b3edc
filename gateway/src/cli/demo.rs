//! `fleetgate demo`: a simulated fleet and the gateway in front of it, in one command, so a
//! newcomer can point kubectl at a fleet without any cluster.
//!
//! With `--pull K`, the last K members are pull-mode: their Cluster files get `connectMode: Tunnel` and
//! no server, the gateway gets a tunnel listener, and each of them a `fleetgate agent` child.
//!
//! Two child processes, each the real command an operator or a test would run: the simulated
//! fleet (`fleetgate-loadtest sim`, built on hyper/tokio and sharing no code with the gateway) and
//! the gateway (`fleetgate serve --config DIR`) reading the files the fleet wrote. The gateway crate
//! never links the simulated fleet: the `fleetgate-loadtest` binary is found beside this one
//! (`cargo build --bins` puts it there), else on PATH, or named by `FLEETGATE_LOADTEST`.
//!
//! The `ready` line names the gateway's URL, its admin listener's (`/metrics`, `/readyz`) and the
//! kubeconfig. The children log to the demo's stderr as the demo's own `--log-level` and
//! `--log-format` ask; the user's `RUST_LOG` is meant for fleetgate and does not reach the
//! simulated fleet, which logs warnings only unless `FLEETGATE_SIM_LOG` says otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use fleetgate_config_watcher::Limits;

use crate::cli::logging::LogArgs;
use crate::cli::signals::Signals;

/// Arguments of `fleetgate demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where the fleet's files and the kubeconfig are written.
    #[arg(long)]
    pub dir: PathBuf,
    /// Simulated member clusters.
    #[arg(long, default_value_t = 3)]
    pub clusters: usize,
    /// The gateway's address (port 0 picks a free port; the kubeconfig gets the real one).
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: String,
    /// ConfigMaps created per member (spread over namespaces load-0..load-9).
    #[arg(long, default_value_t = 20)]
    pub objects: usize,
    /// Gateway shards (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Members served in pull mode (the last K): their Cluster objects get `connectMode: Tunnel` and no
    /// server, and each gets a `fleetgate agent` child that dials the gateway's tunnel listener.
    #[arg(long, default_value_t = 0)]
    pub pull: usize,
}

/// Runs the demo until SIGINT or SIGTERM, then stops the gateway gracefully (it drains) and the
/// fleet; a second signal stops the gateway at once.
pub fn run(args: DemoArgs, log: &LogArgs) -> anyhow::Result<()> {
    if args.clusters == 0 {
        bail!("--clusters must be at least 1");
    }
    if args.pull > args.clusters {
        bail!(
            "--pull {} is more than the {} members",
            args.pull,
            args.clusters
        );
    }
    args.listen
        .parse::<SocketAddr>()
        .with_context(|| format!("--listen {:?} is not an IP:port address", args.listen))?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut fleet = start_fleet(&args, log)?;
    if let Err(e) = wait_ready(&mut fleet, "the simulated fleet") {
        stop(&mut fleet);
        return Err(e);
    }
    // The fleet's own kubeconfig goes straight to the members; keep it beside the gateway's.
    std::fs::copy(
        args.dir.join("kubeconfig"),
        args.dir.join("direct.kubeconfig"),
    )?;
    if let Err(e) = share_watches(&args.dir) {
        stop(&mut fleet);
        return Err(e);
    }

    let pulled = match pull_mode_members(&args) {
        Ok(pulled) => pulled,
        Err(e) => {
            stop(&mut fleet);
            return Err(e);
        }
    };

    let mut gateway = start_gateway(&args, log)?;
    let ready = wait_ready(&mut gateway, "the gateway");
    let started = ready.and_then(|line| {
        let tunnel = named_address(&line, "tunnel");
        let admin = named_address(&line, "admin");
        Ok((listener_of(&line)?, tunnel, admin))
    });
    let (bound, tunnel, admin) = match started {
        Ok(addrs) => addrs,
        Err(e) => {
            let _ = gateway.kill();
            stop(&mut fleet);
            return Err(e);
        }
    };
    let mut agents = Vec::new();
    for member in &pulled {
        let started = tunnel
            .ok_or_else(|| anyhow!("the gateway's ready line names no tunnel listener"))
            .and_then(|tunnel| start_agent(&args.dir, member, tunnel, log))
            .and_then(|mut agent| {
                let ready = wait_ready(&mut agent, &format!("the agent of {}", member.name));
                match ready {
                    Ok(_) => Ok(agent),
                    Err(e) => {
                        stop(&mut agent);
                        Err(e)
                    }
                }
            });
        match started {
            Ok(agent) => agents.push(agent),
            Err(e) => {
                agents.iter_mut().for_each(stop);
                let _ = gateway.kill();
                stop(&mut fleet);
                return Err(e);
            }
        }
    }
    let announced = (|| {
        write_kubeconfig(&args.dir, &args.listen, &bound.to_string())?;
        let kubeconfig = args.dir.join("kubeconfig");
        // Caught before `ready` is printed: a stop signal sent as soon as it is read stops the
        // gateway and the fleet cleanly (the default action would leave both running, orphaned).
        let signals = Signals::install()?;
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "{}",
            ready_line(args.clusters, args.pull, bound, admin, &kubeconfig)
        )?;
        stdout.flush()?;
        anyhow::Ok(signals)
    })();
    // Any failure here (a closed stdout, say) stops what was started: never orphans.
    let Signals {
        runtime: rt,
        mut interrupt,
        terminate: mut term,
    } = match announced {
        Ok(signals) => signals,
        Err(e) => {
            agents.iter_mut().for_each(stop);
            let _ = gateway.kill();
            let _ = gateway.wait();
            stop(&mut fleet);
            return Err(e);
        }
    };

    // A thread owns the child and reports its exit; the runtime waits for that or a signal.
    let pid = gateway.id();
    let (exited_tx, exited_rx) = tokio::sync::oneshot::channel();
    let waiter = std::thread::spawn(move || {
        let status = gateway.wait();
        let _ = exited_tx.send(status);
    });
    let outcome = rt.block_on(async {
        let mut exited = exited_rx;
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
            status = &mut exited => {
                return Ok::<_, anyhow::Error>(Some(format!("{:?}", status)));
            }
        }
        // The gateway drains (GOAWAY, in-flight requests finish within its grace period) and
        // exits by itself; a second signal here is passed on, and the gateway then exits at once.
        signal(pid, libc::SIGTERM);
        let drain_bound = Limits::default().shutdown_grace + DRAIN_MARGIN;
        tokio::select! {
            _ = &mut exited => {}
            _ = tokio::time::sleep(drain_bound) => signal(pid, libc::SIGKILL),
            _ = interrupt.recv() => stop_now(pid, &mut exited).await,
            _ = term.recv() => stop_now(pid, &mut exited).await,
        }
        Ok(None)
    })?;
    let _ = waiter.join();
    agents.iter_mut().for_each(stop);
    stop(&mut fleet);
    match outcome {
        Some(status) => Err(anyhow!("the gateway exited unexpectedly ({status})")),
        None => Ok(()),
    }
}

/// The demo's `ready` line: where the members are (and how many are pull-mode, when any are),
/// the admin listener, and the kubeconfig to export.
fn ready_line(
    clusters: usize,
    pull: usize,
    gateway: SocketAddr,
    admin: Option<SocketAddr>,
    kubeconfig: &Path,
) -> String {
    let pulled = match pull {
        0 => String::new(),
        1 => " (1 of them pull-mode, through its agent)".to_owned(),
        k => format!(" ({k} of them pull-mode, through their agents)"),
    };
    let admin = admin
        .map(|admin| format!("; admin (/metrics, /readyz) at http://{admin}"))
        .unwrap_or_default();
    format!(
        "ready: {clusters} simulated member clusters behind \
         https://{gateway}/clusters/{{member1..member{clusters}}}{pulled}{admin}; \
         export KUBECONFIG={}",
        kubeconfig.display()
    )
}

/// How long past the gateway's grace period the demo waits for it before killing it.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// A second signal: the gateway is told again (it exits at once), and killed if it does not.
async fn stop_now(
    pid: u32,
    exited: &mut tokio::sync::oneshot::Receiver<std::io::Result<std::process::ExitStatus>>,
) {
    signal(pid, libc::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(2), exited)
        .await
        .is_err()
    {
        signal(pid, libc::SIGKILL);
    }
}

fn start_gateway(args: &DemoArgs, log: &LogArgs) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the fleetgate binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .args(log.child_args())
        .arg("--config")
        .arg(&args.dir);
    if args.workers > 0 {
        cmd.arg("--workers").arg(args.workers.to_string());
    }
    if args.pull > 0 {
        cmd.arg("--tunnel-listen")
            .arg("127.0.0.1:0")
            .arg("--agent-ca")
            .arg(
                args.dir
                    .join("agents")
                    .join(crate::cli::certs::AGENT_CA_CERT),
            );
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // A process group of its own: Ctrl-C in a terminal signals the demo's group, and the demo
    // passes the stop on once. Had the gateway got the same SIGINT too, the demo's SIGTERM would
    // be its second signal and cut the drain short.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().context("starting `fleetgate serve`")
}

/// A member the demo serves in pull mode: where its agent finds it.
struct PulledMember {
    name: String,
    server: String,
}

/// Makes the last `--pull` members pull-mode: each Cluster file loses its server and CA and
/// gets `connectMode: Tunnel` (the member's server and CA go to its agent instead), and each gets an
/// agent certificate in DIR/agents (beside the agent CA the gateway trusts).
fn pull_mode_members(args: &DemoArgs) -> anyhow::Result<Vec<PulledMember>> {
    let agents = args.dir.join("agents");
    let mut pulled = Vec::new();
    for k in (args.clusters - args.pull + 1)..=args.clusters {
        let name = format!("member{k}");
        let path = args.dir.join("clusters").join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut cluster: serde_yaml::Value = serde_yaml::from_str(&text)?;
        let spec = cluster
            .get_mut("spec")
            .and_then(serde_yaml::Value::as_mapping_mut)
            .ok_or_else(|| anyhow!("{} has no spec", path.display()))?;
        let server = spec
            .remove("server")
            .and_then(|s| s.as_str().map(str::to_owned))
            .ok_or_else(|| anyhow!("{} has no spec.server", path.display()))?;
        let ca = spec
            .remove("caData")
            .and_then(|s| s.as_str().map(str::to_owned))
            .ok_or_else(|| anyhow!("{} has no spec.caData", path.display()))?;
        spec.insert("connectMode".into(), "Tunnel".into());
        std::fs::create_dir_all(&agents)?;
        std::fs::write(agents.join(format!("{name}-kube-ca.crt")), ca)?;
        crate::cli::certs::issue_agent(&crate::cli::certs::IssueAgentArgs {
            dir: agents.clone(),
            cluster: name.clone(),
            ttl: Duration::from_secs(30 * 86_400),
            out_dir: None,
            force: true,
        })?;
        // The token stays: it is what the gateway authenticates with, through the tunnel.
        crate::cli::certs::write_private(&path, serde_yaml::to_string(&cluster)?.as_bytes())?;
        pulled.push(PulledMember { name, server });
    }
    Ok(pulled)
}

/// `fleetgate agent` for a pull-mode member, dialing the gateway's tunnel listener, in a process
/// group of its own (stopped by the demo after the gateway).
fn start_agent(
    dir: &Path,
    member: &PulledMember,
    tunnel: SocketAddr,
    log: &LogArgs,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the fleetgate binary")?;
    let agents = dir.join("agents");
    let mut cmd = Command::new(exe);
    cmd.arg("agent")
        .args(log.child_args())
        .arg("--gateway")
        .arg(format!("https://{tunnel}"))
        .arg("--cluster")
        .arg(&member.name)
        .arg("--cert")
        .arg(agents.join(format!("agent-{}.crt", member.name)))
        .arg("--key")
        .arg(agents.join(format!("agent-{}.key", member.name)))
        .arg("--ca")
        .arg(dir.join("pki/gateway-ca.crt"))
        .arg("--kube-server")
        .arg(&member.server)
        .arg("--kube-ca")
        .arg(agents.join(format!("{}-kube-ca.crt", member.name)));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
        .with_context(|| format!("starting the agent of {}", member.name))
}

/// The demo shares the watches of configmaps and pods, one member watch per key for the whole
/// gateway (docs/watches.md), and serves LISTs of configmaps, pods and namespaces from memory
/// (docs/cache.md): DIR/gateway.yaml, as the fleet wrote it, gets `spec.sharedWatches` and
/// `spec.cache`.
fn share_watches(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("gateway.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut gateway: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    let shared: serde_yaml::Value = serde_yaml::from_str(
        "resources:\n- {group: '', version: v1, resource: configmaps}\n- {group: '', version: v1, resource: pods}\nscope: Gateway\n",
    )?;
    let spec = gateway
        .get_mut("spec")
        .and_then(serde_yaml::Value::as_mapping_mut)
        .ok_or_else(|| anyhow!("{} has no spec", path.display()))?;
    spec.insert("sharedWatches".into(), shared);
    let cache: serde_yaml::Value = serde_yaml::from_str(
        "resources:\n- {group: '', version: v1, resource: configmaps}\n- {group: '', version: v1, resource: pods}\n- {group: '', version: v1, resource: namespaces}\nmemoryBudget: 256Mi\n",
    )?;
    spec.insert("cache".into(), cache);
    std::fs::write(&path, serde_yaml::to_string(&gateway)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The address a gateway's `ready` line gives `name` (`tunnel=ADDR`, `admin=ADDR`), if any.
fn named_address(line: &str, name: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .filter_map(|tok| tok.split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, addr)| addr.parse().ok())
}

/// `fleetgate-loadtest sim`, in a process group of its own (as the gateway: a terminal's Ctrl-C
/// reaches the demo, which stops both in order). It logs in the demo's format; its filter is its
/// own (`FLEETGATE_SIM_LOG`, default warnings): a `RUST_LOG=fleetgate=debug` meant for the
/// gateway would otherwise turn on the simulated fleet's debug lines too (its crate is
/// `fleetgate_loadtest`).
fn start_fleet(args: &DemoArgs, log: &LogArgs) -> anyhow::Result<Child> {
    let exe = loadtest_binary()?;
    let mut cmd = Command::new(&exe);
    cmd.env_remove("RUST_LOG")
        .arg("sim")
        .arg(format!("--log-format={}", log.format_name()))
        .arg("--dir")
        .arg(&args.dir)
        .arg("--clusters")
        .arg(args.clusters.to_string())
        .arg("--objects")
        .arg(args.objects.to_string())
        .arg("--gateway-listen")
        .arg(&args.listen);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
        .with_context(|| format!("starting {} sim", exe.display()))
}

/// The `fleetgate-loadtest` binary: `FLEETGATE_LOADTEST`, else beside this executable (where
/// cargo builds every binary of the workspace), else on PATH.
fn loadtest_binary() -> anyhow::Result<PathBuf> {
    const NAME: &str = "fleetgate-loadtest";
    if let Some(path) = std::env::var_os("FLEETGATE_LOADTEST") {
        return Ok(PathBuf::from(path));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(NAME)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(NAME));
    beside
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow!(
                "`fleetgate demo` runs the simulated fleet from the {NAME} binary, which is neither \
                 beside this executable nor on PATH: build it with `cargo build --release --bins` \
                 (or name it with FLEETGATE_LOADTEST)"
            )
        })
}

/// Stops a child that may still run: SIGTERM, then SIGKILL if it has not exited within 5 s.
fn stop(child: &mut Child) {
    signal(child.id(), libc::SIGTERM);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads a child's stdout up to its `ready` line and returns that line; the lines before it and
/// after it are passed through (the later ones on a thread of their own).
fn wait_ready(child: &mut Child, what: &str) -> anyhow::Result<String> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from {what}"))?;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line?;
        // Passed on as it can be: a closed stdout must not end the demo here (its children
        // would be left running); the `ready` line's write reports it.
        if !line.contains("ready") {
            let _ = writeln!(std::io::stdout(), "{line}");
            continue;
        }
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(std::io::stdout(), "{line}");
            }
        });
        return Ok(line);
    }
    bail!("{what} exited before it was ready (see its log above)")
}

/// The address of the first non-admin, non-tunnel listener a gateway's `ready` line names.
fn listener_of(line: &str) -> anyhow::Result<SocketAddr> {
    line.split_whitespace()
        .filter_map(|tok| tok.split_once('='))
        .filter(|(key, _)| *key != "admin" && *key != "tunnel")
        .find_map(|(_, v)| v.trim_end_matches(',').parse::<SocketAddr>().ok())
        .ok_or_else(|| anyhow!("the gateway's ready line names no listener address: {line:?}"))
}

/// DIR/kubeconfig: the sim's gateway kubeconfig, with the address the gateway really bound.
/// Mode 0600, as the file it is made from: it holds the `admin` (system:masters) client key.
fn write_kubeconfig(dir: &Path, listen: &str, bound: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(dir.join("gateway.kubeconfig"))?;
    let text = text.replace(&format!("https://{listen}/"), &format!("https://{bound}/"));
    let tmp = dir.join(".kubeconfig.tmp");
    crate::cli::certs::write_private(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, dir.join("kubeconfig"))?;
    Ok(())
}

fn signal(pid: u32, sig: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on the pid of our own child with a valid signal number touches no memory.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_the_admin_listener_and_pull_mode_only_when_used() {
        let gateway: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let admin = "127.0.0.1:9090".parse().ok();
        let kubeconfig = Path::new("/tmp/demo/kubeconfig");
        let line = ready_line(3, 0, gateway, admin, kubeconfig);
        assert_eq!(
            line,
            "ready: 3 simulated member clusters behind \
             https://127.0.0.1:8443/clusters/{member1..member3}; admin (/metrics, /readyz) at \
             http://127.0.0.1:9090; export KUBECONFIG=/tmp/demo/kubeconfig"
        );
        assert!(ready_line(3, 1, gateway, admin, kubeconfig)
            .contains("{member1..member3} (1 of them pull-mode, through its agent);"));
        assert!(ready_line(3, 2, gateway, admin, kubeconfig)
            .contains("(2 of them pull-mode, through their agents)"));
    }

    #[test]
    fn named_addresses_of_a_gateway_ready_line() {
        let line = "ready https=127.0.0.1:1 admin=127.0.0.1:2 workers=2 tunnel=127.0.0.1:3";
        assert_eq!(named_address(line, "admin"), "127.0.0.1:2".parse().ok());
        assert_eq!(named_address(line, "tunnel"), "127.0.0.1:3".parse().ok());
        assert_eq!(named_address(line, "http"), None);
        assert_eq!(listener_of(line).unwrap(), "127.0.0.1:1".parse().unwrap());
    }
}
