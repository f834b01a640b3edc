//! The world `chaos` breaks, and how: the simulated fleet (in this process), a [`Proxy`] in front
//! of each member that the gateway's Cluster files point at (or, for a pull-mode member, its
//! agent), the gateway (`fleetgate serve`, a child process) behind a front proxy the watchers
//! reach it through, for each pull-mode member an agent (`fleetgate agent`, a child process)
//! dialing the gateway's tunnel listener through a proxy of its own, and the injection of each
//! fault of the schedule, undone before the next. Also reads the members' LIST counters around
//! the faults. `rollout` starts its replicas with [`Gateway`] and shares watches with
//! [`share_configmaps`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tokio::io::AsyncBufReadExt;

use super::proxy::{Mode, Proxy};
use super::watcher::View;
use super::{lock, ChaosArgs, FaultKind, FaultRecord, Planned, Run, REQUEST_TIMEOUT};
use crate::run::client::{Target, TlsOptions};
use crate::run::storm::{cluster_yaml, write_atomically};
use crate::run::RunArgs;
use crate::sim::{self, FleetHandle, FleetOptions, SimTuning};

/// The extra Cluster config churn adds and removes (pointing at nothing).
const EXTRA_CLUSTER: &str = "loadtest-chaos-extra.yaml";
/// The agents' certificates and their CA, under the work directory.
const AGENTS: &str = "agents";

/// The gateway child process (of `chaos`, and each replica of `rollout`).
pub(crate) struct Gateway {
    child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) https: SocketAddr,
    /// Its tunnel listener, when the fleet has pull-mode members.
    tunnel: Option<SocketAddr>,
}

/// The gateway binary `--gateway-bin`, $FLEETGATE_BIN, `fleetgate` beside this program, or on
/// PATH.
pub(crate) fn gateway_binary(args: &ChaosArgs) -> PathBuf {
    if let Some(bin) = &args.gateway_bin {
        return bin.clone();
    }
    if let Some(bin) = std::env::var_os("FLEETGATE_BIN") {
        return bin.into();
    }
    std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name("fleetgate"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("fleetgate"))
}

/// Starts `command` (its stderr appended to `log`) and waits up to 30 s for the line of its
/// stdout that starts with or contains `ready`; its stdout is read on after that, so it never
/// writes into a closed pipe. The child, its pid and the ready line.
async fn spawn_ready(
    mut command: tokio::process::Command,
    log: &Path,
    what: &str,
) -> anyhow::Result<(tokio::process::Child, u32, String)> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {what} (--gateway-bin)"))?;
    let pid = child.id().ok_or_else(|| anyhow!("{what} exited at once"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("ready") {
                return Ok(line);
            }
        }
        bail!(
            "{what} exited before its ready line (its log: {})",
            log.display()
        )
    })
    .await
    .map_err(|_| anyhow!("no ready line from {what} in 30 s"))??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, pid, ready))
}

/// The address the ready line `line` gives `name` (`https=ADDR`, `tunnel=ADDR`), if any.
fn named_address(line: &str, name: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .filter_map(|tok| tok.split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, addr)| addr.parse().ok())
}

impl Gateway {
    /// Starts `fleetgate serve --config DIR` (one worker; with `tunnels`, a tunnel listener
    /// trusting DIR/agents/agent-ca.crt) and waits for its ready line; its log goes to `log`.
    pub(crate) async fn start(
        bin: &Path,
        dir: &Path,
        log: &Path,
        tunnels: bool,
    ) -> anyhow::Result<Gateway> {
        let mut command = tokio::process::Command::new(bin);
        command
            .args(["serve", "--workers", "1", "--config"])
            .arg(dir);
        if tunnels {
            command
                .args(["--tunnel-listen", "127.0.0.1:0", "--agent-ca"])
                .arg(dir.join(AGENTS).join("agent-ca.crt"));
        }
        let (child, pid, ready) = spawn_ready(command, log, "the gateway").await?;
        let https = named_address(&ready, "https")
            .ok_or_else(|| anyhow!("no https listener in {ready:?}"))?;
        let tunnel = named_address(&ready, "tunnel");
        if tunnels && tunnel.is_none() {
            bail!("no tunnel listener in {ready:?}");
        }
        Ok(Gateway {
            child,
            pid,
            https,
            tunnel,
        })
    }

    /// Stops it: SIGTERM (it drains) and at most 15 s to exit, or SIGKILL at once.
    pub(crate) async fn stop(mut self, graceful: bool) {
        if graceful {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &self.pid.to_string()])
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// A pull-mode member: its agent (`fleetgate agent`, a child process) dials the gateway's tunnel
/// listener through a proxy of its own (the tunnel's path, which the driver can cut), and its
/// member through the member's proxy.
pub(super) struct Pulled {
    member: usize,
    tunnel: Proxy,
    agent: tokio::sync::Mutex<Option<tokio::process::Child>>,
    command: Vec<std::ffi::OsString>,
    log: PathBuf,
}

impl Pulled {
    /// Starts the agent and waits for its tunnel (its ready line).
    async fn start_agent(&self, bin: &Path) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::new(bin);
        command.args(&self.command);
        let (child, _, _) = spawn_ready(command, &self.log, "the agent").await?;
        *self.agent.lock().await = Some(child);
        Ok(())
    }
}

/// Everything the faults act on.
pub(super) struct World {
    pub(super) run: Arc<Run>,
    pub(super) fleet: FleetHandle,
    proxies: Vec<Proxy>,
    front: Proxy,
    /// The pull-mode members, the last `--pull-members` of the fleet.
    pub(super) pulled: Vec<Pulled>,
    pub(super) gateway: tokio::sync::Mutex<Option<Gateway>>,
    bin: PathBuf,
    dir: PathBuf,
    log: PathBuf,
    /// Each member's Cluster file as the run wrote it (pointing at its proxy).
    clusters: Vec<(PathBuf, serde_yaml::Value)>,
}

impl World {
    fn write_cluster(&self, member: usize, label: Option<u64>) -> anyhow::Result<()> {
        let (path, original) = &self.clusters[member];
        let mut cluster = original.clone();
        if let Some(generation) = label {
            cluster["metadata"]["labels"]["fleetgate.io/chaos-churn"] =
                generation.to_string().into();
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        write_atomically(dir, file, &serde_yaml::to_string(&cluster)?)?;
        Ok(())
    }

    /// Starts a gateway and points the watchers' front proxy and the agents' tunnel proxies at
    /// it.
    async fn start_gateway(&self) -> anyhow::Result<Gateway> {
        let tunnels = !self.pulled.is_empty();
        let new = Gateway::start(&self.bin, &self.dir, &self.log, tunnels).await?;
        self.front.set_upstream(new.https);
        for p in &self.pulled {
            p.tunnel.set_upstream(new.tunnel.unwrap_or(new.https));
        }
        self.run.gateway_pid.store(new.pid, Ordering::Relaxed);
        Ok(new)
    }

    async fn restart_gateway(&self, graceful: bool) -> anyhow::Result<String> {
        let mut slot = self.gateway.lock().await;
        let old = slot.take();
        let started = Instant::now();
        let new = if graceful {
            // A rollout: the old one drains while the new one starts and takes new connections.
            let draining = old.map(|g| tokio::spawn(g.stop(true)));
            let new = self.start_gateway().await?;
            if let Some(d) = draining {
                let _ = d.await;
            }
            new
        } else {
            if let Some(g) = old {
                g.stop(false).await;
            }
            self.start_gateway().await?
        };
        let detail = format!(
            "pid {} at {} after {:.1} s",
            new.pid,
            new.https,
            started.elapsed().as_secs_f64()
        );
        *slot = Some(new);
        Ok(detail)
    }

    /// The pull-mode member a tunnel fault drawn for member `member` hits.
    fn pulled_for(&self, member: usize) -> anyhow::Result<&Pulled> {
        if self.pulled.is_empty() {
            bail!("no pull-mode member (--pull-members 0)");
        }
        Ok(&self.pulled[member % self.pulled.len()])
    }

    /// The pull-mode members' names.
    pub(super) fn pulled_names(&self) -> Vec<String> {
        self.pulled
            .iter()
            .map(|p| self.run.members[p.member].clone())
            .collect()
    }

    /// Stops every agent (at the end of the run).
    pub(super) async fn stop_agents(&self) {
        for p in &self.pulled {
            if let Some(mut agent) = p.agent.lock().await.take() {
                let _ = agent.kill().await;
            }
        }
    }

    /// Injects one fault and undoes it; returns what it did.
    async fn inject(&self, p: &Planned) -> anyhow::Result<(String, String)> {
        let member = self.run.members[p.member].clone();
        let proxy = &self.proxies[p.member];
        Ok(match p.kind {
            FaultKind::Blackhole => {
                // A partition: nothing passes, then the connections it outlived are dead.
                proxy.set_mode(Mode::Blackhole);
                tokio::time::sleep(p.hold).await;
                proxy.cut();
                proxy.set_mode(Mode::Forward);
                (member, format!("{:.1} s, then reset", p.hold.as_secs_f64()))
            }
            FaultKind::Slow => {
                proxy.set_mode(Mode::Slow(p.delay));
                tokio::time::sleep(p.hold).await;
                proxy.set_mode(Mode::Forward);
                (
                    member,
                    format!(
                        "{} ms each way for {:.1} s",
                        p.delay.as_millis(),
                        p.hold.as_secs_f64()
                    ),
                )
            }
            FaultKind::Cut => {
                proxy.cut();
                (member, "every connection reset".into())
            }
            FaultKind::MemberRestart => {
                self.fleet.stop_member(p.member).await;
                tokio::time::sleep(p.hold).await;
                self.fleet
                    .restart_member(p.member)
                    .await
                    .with_context(|| format!("restarting {member}"))?;
                (member, format!("down {:.1} s", p.hold.as_secs_f64()))
            }
            FaultKind::TunnelCut => {
                let pulled = self.pulled_for(p.member)?;
                pulled.tunnel.cut();
                (
                    self.run.members[pulled.member].clone(),
                    "the agent's tunnel reset on its way (it dials again)".into(),
                )
            }
            FaultKind::TunnelKill => {
                let pulled = self.pulled_for(p.member)?;
                if let Some(mut agent) = pulled.agent.lock().await.take() {
                    let _ = agent.kill().await;
                }
                tokio::time::sleep(p.hold).await;
                let started = Instant::now();
                pulled.start_agent(&self.bin).await?;
                (
                    self.run.members[pulled.member].clone(),
                    format!(
                        "agent SIGKILLed, down {:.1} s; started again, its tunnel up after {:.1} s",
                        p.hold.as_secs_f64(),
                        started.elapsed().as_secs_f64()
                    ),
                )
            }
            FaultKind::GatewayRestart => ("gateway".into(), self.restart_gateway(true).await?),
            FaultKind::GatewayKill => ("gateway".into(), self.restart_gateway(false).await?),
            FaultKind::ConfigChurn => {
                let until = Instant::now() + p.hold;
                let mut step = 0u64;
                let mut extra = false;
                while Instant::now() < until {
                    if step % 3 == 2 {
                        extra = !extra;
                        if extra {
                            write_atomically(
                                &self.dir,
                                EXTRA_CLUSTER,
                                &cluster_yaml("loadtest-chaos-extra", step),
                            )?;
                        } else {
                            std::fs::remove_file(self.dir.join(EXTRA_CLUSTER))?;
                        }
                    } else {
                        self.write_cluster((step as usize) % self.clusters.len(), Some(step))?;
                    }
                    step += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                for m in 0..self.clusters.len() {
                    self.write_cluster(m, None)?;
                }
                let _ = std::fs::remove_file(self.dir.join(EXTRA_CLUSTER));
                ("config".into(), format!("{step} changes, then restored"))
            }
        })
    }
}

/// Runs the schedule until its end; returns the faults as they happened, each with the LISTs
/// the members had served at its start ([`member_lists`] of `direct`).
pub(super) async fn run_schedule(
    world: &World,
    schedule: Vec<Planned>,
    direct: &[Target],
) -> Vec<FaultRecord> {
    let run = &world.run;
    let mut out = Vec::new();
    for p in schedule {
        tokio::time::sleep_until((run.start + p.at).into()).await;
        let lists_at_start = member_lists(direct).await;
        let start_s = run.start.elapsed().as_secs_f64();
        *lock(&run.fault_now) = Some(p.kind.name().to_owned());
        tracing::info!(fault = p.kind.name(), member = p.member, "chaos: fault");
        let (target, detail) = match world.inject(&p).await {
            Ok(done) => done,
            Err(error) => (String::new(), format!("failed: {error:#}")),
        };
        *lock(&run.fault_now) = None;
        out.push(FaultRecord {
            kind: p.kind.name(),
            target,
            start_s,
            end_s: run.start.elapsed().as_secs_f64(),
            detail,
            lists_at_start,
            member_lists: None,
        });
    }
    out
}

/// The LISTs of configmaps every member has served so far, summed (each member's
/// `fleetgate_sim_requests_total{verb="list",resource="configmaps"}` on its `/metrics`, asked
/// straight), or None when one did not answer.
pub(super) async fn member_lists(direct: &[Target]) -> Option<u64> {
    const SERIES: &str = r#"fleetgate_sim_requests_total{verb="list",resource="configmaps"} "#;
    let mut total = 0;
    for target in direct {
        let (status, text) = tokio::time::timeout(REQUEST_TIMEOUT, target.metrics_text())
            .await
            .ok()?
            .ok()?;
        if status != 200 {
            return None;
        }
        total += text
            .lines()
            .find_map(|l| l.strip_prefix(SERIES))
            .map_or(Some(0), |v| v.trim().parse::<u64>().ok())?;
    }
    Some(total)
}

/// The simulated members of `chaos` and `rollout` (`--chaos-members`, no objects, no churn, a
/// history of `--history-window` events) with their files in `dir`, and their names.
pub(crate) async fn start_members(
    c: &ChaosArgs,
    dir: &Path,
) -> anyhow::Result<(FleetHandle, Vec<String>)> {
    let fleet = sim::start_fleet_with_tuning(
        FleetOptions {
            dir: dir.to_path_buf(),
            clusters: c.chaos_members.max(1),
            objects: 0,
            churn_per_sec: 0.0,
            gateway_listen: Some("127.0.0.1:0".into()),
        },
        SimTuning {
            history_window: c.history_window.max(1),
            ..SimTuning::default()
        },
    )
    .await?;
    let members = (1..=fleet.member_addrs().len())
        .map(|i| format!("member{i}"))
        .collect();
    Ok((fleet, members))
}

/// Sets the fleet up: the namespace on every member, a proxy per member, the Cluster files
/// pointing at them.
pub(super) async fn build_world(args: &RunArgs, dir: &Path) -> anyhow::Result<World> {
    let c = &args.chaos;
    let (fleet, members) = start_members(c, dir).await?;
    let bin = gateway_binary(c);
    let pulls = c.pull_members.min(members.len());
    let mut proxies = Vec::new();
    let mut clusters = Vec::new();
    let mut pulled = Vec::new();
    for (m, (name, addr)) in members.iter().zip(fleet.member_addrs()).enumerate() {
        let proxy = Proxy::start(addr).await?;
        let path = dir.join(format!("clusters/{name}.yaml"));
        let mut cluster: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
        if m >= members.len() - pulls {
            pulled.push(pull_mode(&bin, dir, name, m, proxy.addr, &mut cluster).await?);
        } else {
            cluster["spec"]["server"] = format!("https://{}", proxy.addr).into();
        }
        proxies.push(proxy);
        clusters.push((path, cluster));
    }
    let run = Arc::new(Run::new(members));
    let log = dir.join("gateway.log");
    let world = World {
        run,
        fleet,
        proxies,
        // Pointed at the gateway once it runs.
        front: Proxy::start("127.0.0.1:9".parse()?).await?,
        pulled,
        gateway: tokio::sync::Mutex::new(None),
        bin,
        dir: dir.to_path_buf(),
        log,
        clusters,
    };
    for m in 0..world.clusters.len() {
        world.write_cluster(m, None)?;
    }
    if c.shared_watches {
        share_configmaps(dir, "Gateway")?;
    }
    let gateway = world.start_gateway().await?;
    *world.gateway.lock().await = Some(gateway);
    for p in &world.pulled {
        p.start_agent(&world.bin).await?;
    }
    Ok(world)
}

/// DIR/gateway.yaml, as the fleet wrote it, gets `spec.sharedWatches` for configmaps, scope
/// `scope` (`Gateway` or `Shard`; chaos `--shared-watches`: Gateway, rollout: Shard).
pub(crate) fn share_configmaps(dir: &Path, scope: &str) -> anyhow::Result<()> {
    let path = dir.join("gateway.yaml");
    let mut gateway: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    gateway["spec"]["sharedWatches"] = serde_yaml::from_str(&format!(
        "resources:\n- {{group: '', version: v1, resource: configmaps}}\nscope: {scope}\n"
    ))?;
    write_atomically(dir, "gateway.yaml", &serde_yaml::to_string(&gateway)?)?;
    Ok(())
}

/// Makes member `m` (`name`) pull-mode, as `fleetgate demo --pull` does: its Cluster `cluster`
/// says `connectMode: Tunnel` and loses its server and CA (its credentials stay: the gateway
/// still authenticates to the member, through the tunnel); an agent certificate is issued for it
/// (`fleetgate certs issue-agent`, in DIR/agents beside the agent CA the gateway trusts); its
/// agent will dial a tunnel proxy of its own and reach the member through `member_proxy`.
async fn pull_mode(
    bin: &Path,
    dir: &Path,
    name: &str,
    m: usize,
    member_proxy: SocketAddr,
    cluster: &mut serde_yaml::Value,
) -> anyhow::Result<Pulled> {
    let agents = dir.join(AGENTS);
    let issued = tokio::process::Command::new(bin)
        .args([
            "certs",
            "issue-agent",
            "--force",
            "--cluster",
            name,
            "--dir",
        ])
        .arg(&agents)
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .with_context(|| format!("{} certs issue-agent", bin.display()))?;
    if !issued.success() {
        bail!("`fleetgate certs issue-agent --cluster {name}` failed: {issued}");
    }
    if let Some(spec) = cluster["spec"].as_mapping_mut() {
        spec.remove("server");
        spec.remove("caData");
        spec.insert("connectMode".into(), "Tunnel".into());
    }
    // Pointed at the gateway's tunnel listener once it runs.
    let tunnel = Proxy::start("127.0.0.1:9".parse()?).await?;
    let path = |p: PathBuf| p.into_os_string();
    let command = vec![
        "agent".into(),
        "--gateway".into(),
        format!("https://{}", tunnel.addr).into(),
        "--cluster".into(),
        name.into(),
        "--cert".into(),
        path(agents.join(format!("agent-{name}.crt"))),
        "--key".into(),
        path(agents.join(format!("agent-{name}.key"))),
        "--ca".into(),
        path(dir.join("pki/gateway-ca.crt")),
        "--kube-server".into(),
        format!("https://{member_proxy}").into(),
        "--kube-ca".into(),
        path(dir.join("pki/fleet-ca.crt")),
    ];
    Ok(Pulled {
        member: m,
        tunnel,
        agent: tokio::sync::Mutex::new(None),
        command,
        log: dir.join(format!("agent-{name}.log")),
    })
}

/// The members straight, and each view with its target through the front proxy.
pub(crate) type Targets = (Vec<Target>, Vec<(View, Target)>);

/// The members straight (the writers') and the watchers' targets through the front proxy:
/// `/clusters/NAME` of each member, then `/fleet`.
pub(super) fn targets(world: &World) -> anyhow::Result<Targets> {
    targets_at(&world.dir, &world.run.members, world.front.addr)
}

/// [`targets`] of the fleet in `dir`, through a front proxy at `front`.
pub(crate) fn targets_at(
    dir: &Path,
    members: &[String],
    front: SocketAddr,
) -> anyhow::Result<Targets> {
    let opts = TlsOptions::default();
    let direct = Target::parse_group(
        &format!(
            "direct=kubeconfig:{}:member*",
            dir.join("kubeconfig").display()
        ),
        &opts,
    )?
    .1;
    let through = dir.join("gateway.kubeconfig");
    let mut views = Vec::new();
    for (m, name) in members.iter().enumerate() {
        let t = Target::parse(
            &format!("{name}=kubeconfig:{}:{name}", through.display()),
            &opts,
        )?;
        views.push((View::Member(m), t));
    }
    views.push((
        View::Fleet,
        Target::parse(
            &format!("fleet=kubeconfig:{}:fleet", through.display()),
            &opts,
        )?,
    ));
    for (_, t) in &mut views {
        t.host = "127.0.0.1".into();
        t.port = front.port();
        t.authority = front.to_string();
    }
    Ok((direct, views))
}
