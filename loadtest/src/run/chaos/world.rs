//! The world `chaos` breaks, and how: the simulated fleet (in this process), a [`Proxy`] in front
//! of each member that the gateway's Cluster files point at, the gateway (`fleetgate serve`, a
//! child process) behind a front proxy the watchers reach it through, and the injection of each
//! fault of the schedule, undone before the next.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tokio::io::AsyncBufReadExt;

use super::proxy::{Mode, Proxy};
use super::watcher::View;
use super::{lock, ChaosArgs, FaultKind, FaultRecord, Planned, Run};
use crate::run::client::{Target, TlsOptions};
use crate::run::storm::{cluster_yaml, write_atomically};
use crate::run::RunArgs;
use crate::sim::{self, FleetHandle, FleetOptions, SimTuning};

/// The extra Cluster config churn adds and removes (pointing at nothing).
const EXTRA_CLUSTER: &str = "loadtest-chaos-extra.yaml";

/// The gateway child process (of `chaos`, and each replica of `rollout`).
pub(crate) struct Gateway {
    child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) https: SocketAddr,
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

impl Gateway {
    /// Starts `fleetgate serve --config DIR` (one worker) and waits for its ready line; its log
    /// goes to `log`.
    pub(crate) async fn start(bin: &Path, dir: &Path, log: &Path) -> anyhow::Result<Gateway> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut child = tokio::process::Command::new(bin)
            .args(["serve", "--workers", "1", "--config"])
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} (--gateway-bin)", bin.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the gateway exited at once"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if line.starts_with("ready") {
                    return Ok(line);
                }
            }
            bail!("the gateway exited before its ready line (its log: gateway.log)")
        })
        .await
        .map_err(|_| anyhow!("no ready line from the gateway in 30 s"))??;
        // Keep its stdout read, so it never writes into a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let https = ready
            .split_whitespace()
            .find_map(|f| f.strip_prefix("https="))
            .ok_or_else(|| anyhow!("no https listener in {ready:?}"))?
            .parse()?;
        Ok(Gateway { child, pid, https })
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

/// Everything the faults act on.
pub(super) struct World {
    pub(super) run: Arc<Run>,
    pub(super) fleet: FleetHandle,
    proxies: Vec<Proxy>,
    front: Proxy,
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

    async fn restart_gateway(&self, graceful: bool) -> anyhow::Result<String> {
        let mut slot = self.gateway.lock().await;
        let old = slot.take();
        let started = Instant::now();
        let new = if graceful {
            // A rollout: the old one drains while the new one starts and takes new connections.
            let draining = old.map(|g| tokio::spawn(g.stop(true)));
            let new = Gateway::start(&self.bin, &self.dir, &self.log).await?;
            self.front.set_upstream(new.https);
            if let Some(d) = draining {
                let _ = d.await;
            }
            new
        } else {
            if let Some(g) = old {
                g.stop(false).await;
            }
            let new = Gateway::start(&self.bin, &self.dir, &self.log).await?;
            self.front.set_upstream(new.https);
            new
        };
        self.run.gateway_pid.store(new.pid, Ordering::Relaxed);
        let detail = format!(
            "pid {} at {} after {:.1} s",
            new.pid,
            new.https,
            started.elapsed().as_secs_f64()
        );
        *slot = Some(new);
        Ok(detail)
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

/// Runs the schedule until its end; returns the faults as they happened.
pub(super) async fn run_schedule(world: &World, schedule: Vec<Planned>) -> Vec<FaultRecord> {
    let run = &world.run;
    let mut out = Vec::new();
    for p in schedule {
        tokio::time::sleep_until((run.start + p.at).into()).await;
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
        });
    }
    out
}

/// Sets the fleet up: the namespace on every member, a proxy per member, the Cluster files
/// pointing at them.
pub(super) async fn build_world(args: &RunArgs, dir: &Path) -> anyhow::Result<World> {
    let c = &args.chaos;
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
    let members: Vec<String> = (1..=fleet.member_addrs().len())
        .map(|i| format!("member{i}"))
        .collect();
    let mut proxies = Vec::new();
    let mut clusters = Vec::new();
    for (name, addr) in members.iter().zip(fleet.member_addrs()) {
        let proxy = Proxy::start(addr).await?;
        let path = dir.join(format!("clusters/{name}.yaml"));
        let mut cluster: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
        cluster["spec"]["server"] = format!("https://{}", proxy.addr).into();
        proxies.push(proxy);
        clusters.push((path, cluster));
    }
    let run = Arc::new(Run::new(members));
    let bin = gateway_binary(c);
    let log = dir.join("gateway.log");
    let world = World {
        run,
        fleet,
        proxies,
        // Pointed at the gateway once it runs.
        front: Proxy::start("127.0.0.1:9".parse()?).await?,
        gateway: tokio::sync::Mutex::new(None),
        bin,
        dir: dir.to_path_buf(),
        log,
        clusters,
    };
    for m in 0..world.clusters.len() {
        world.write_cluster(m, None)?;
    }
    let gateway = Gateway::start(&world.bin, &world.dir, &world.log).await?;
    world.front.set_upstream(gateway.https);
    world.run.gateway_pid.store(gateway.pid, Ordering::Relaxed);
    *world.gateway.lock().await = Some(gateway);
    Ok(world)
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
