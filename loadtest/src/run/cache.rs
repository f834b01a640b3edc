//! `cache` (issue 34's benchmark, docs/cache.md): what serving LISTs from the gateway's memory
//! saves the members, and what it costs the gateway, against the same load with the cache off,
//! in the same run.
//!
//! The scenario brings its own world, in a work directory: a simulated fleet as a child process
//! (`fleetgate-loadtest sim`, this program: `--cache-members` members, `--cache-pods` pods each
//! besides `hello`, a history of `--history-window` events per member), so that the members' CPU
//! is theirs alone (`/proc/PID/stat` of that process), and a gateway (`fleetgate serve --config
//! DIR`, one worker, `--gateway-bin`) on the fleet's own files: TLS, authentication,
//! AccessPolicy, impersonation at every member. Before anything, each member gets
//! `--storm-objects` configmaps (about 1 KiB each) in the namespace `chaos`, what the informers
//! list. Then:
//!
//! 1. `direct`: the members' own lists of all pods, one member after the other, at
//!    `resourceVersion=0` and consistent (no resourceVersion), for `--duration` each (`fleet-list`'s
//!    lister): the members' CPU per object, and the objects' JSON size (the lists' body bytes).
//! 2. For the gateway without `spec.cache` (`cache-off`), then with it for pods and configmaps
//!    (`cache-on`), each a fresh gateway:
//!    - `memory`: its resident memory once it opened its connections to every member (a LIST
//!      of nodes, not cached), again after an idle second (the method's floor: what an idle
//!      gateway's RSS moves by itself), then after a LIST of each member's
//!      pods through `/clusters/NAME` (`resourceVersion=0`, a label selector nothing matches: the
//!      cache lists the member in full and keeps every pod, the answer is empty). Memory per
//!      cached object is the growth over that fill divided by the objects, against the JSON
//!      bytes per object; with the cache off the same requests show what they cost without it.
//!    - `list`: the LIST of every pod through `/fleet`, at `resourceVersion=0` and consistent,
//!      for `--duration` each: latency and the gateway's and members' CPU per object.
//!    - `storm` (unless `--informers 0`): `--informers` informers (`chaos`' watchers: LIST, WATCH
//!      from its resourceVersion, resume, LIST again after a 410), round robin over the members'
//!      `/clusters/NAME` configmaps of `chaos`, through a front proxy (`chaos`' [`Proxy`]) that
//!      keeps the gateway's address. Once all of them watch, the gateway is killed (SIGKILL)
//!      and replaced, and while none runs every member is written to past its history (its
//!      writer, `chaos`' [`Writer`]), so every informer's resumed watch gets a 410 and it lists
//!      again: all together, against a gateway that just started. Figures from the new
//!      gateway's start until every informer listed again, watches and has seen the last write
//!      of its member: the members' LISTs of configmaps (their
//!      `fleetgate_sim_requests_total{verb="list",resource="configmaps"}`, and of those the
//!      `limit=1` questions, `fleetgate_sim_short_lists_total`), the members' CPU, the new
//!      gateway's CPU and its peak resident memory (VmHWM). Its informers' first lists (the
//!      informers started in waves of 200) are counted too.
//!
//! Rows: `direct-rv0`, `direct-consistent`, then for `cache-off` and `cache-on` each
//! `-memory`, `-rv0`, `-consistent`, `-storm`; each with a [`CacheReport`]. Called by `run`
//! (`--scenario cache`); needs no `--target`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures_util::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::io::AsyncBufReadExt;

use super::chaos::members::Writer;
use super::chaos::proxy::Proxy;
use super::chaos::watcher::{Incident, View, Watcher};
use super::chaos::world::{gateway_binary, targets_at, Gateway};
use super::chaos::{create_namespace, lock, Run, NAMESPACE};
use super::client::{HttpConn, Target};
use super::fanout::body_request;
use super::fleet::{fleet_list, Charged};
use super::procstat::ProcWatch;
use super::storm::write_atomically;
use super::{RunArgs, TargetResult};

/// The resource the informers list and watch (in [`NAMESPACE`]).
const STORM_RESOURCE: &str = "configmaps";
/// Informers started together; the next ones once these have listed.
const WAVE: usize = 200;
/// Requests to the members (seeding, filling the cache) at once.
const AT_ONCE: usize = 16;
/// How long seeding a million pods may take the simulated fleet.
const SIM_READY: Duration = Duration::from_secs(900);
/// How long a member's `/metrics` may take, and how many times it is asked.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);
const METRICS_TRIES: usize = 3;
/// The idle stretch whose RSS change is the memory figure's floor.
const IDLE: Duration = Duration::from_secs(1);
/// A label selector nothing matches: the answer is empty, the cache still lists in full.
const NOTHING: &str = "labelSelector=fleetgate.io%2Fwarm-up%3Dnothing";
/// `spec.cache` of the cache-on gateway: pods (the lists, the memory) and configmaps (the storm).
const CACHE: &str = "resources:\n- {group: '', version: v1, resource: pods}\n\
                     - {group: '', version: v1, resource: configmaps}\nmemoryBudget: 64Gi\n";

/// `cache`'s own flags (flattened into `run`'s).
#[derive(Debug, Clone, clap::Args)]
pub struct CacheArgs {
    /// cache: members of the simulated fleet it starts.
    #[arg(long, default_value_t = 100)]
    pub cache_members: usize,
    /// cache: pods each member holds (besides `hello`), listed through `/fleet` and cached.
    #[arg(long, default_value_t = 1000)]
    pub cache_pods: usize,
    /// cache: informers of the relist storm, round robin over the members (0: no storm).
    #[arg(long, default_value_t = 1000)]
    pub informers: usize,
    /// cache: configmaps each member holds in the namespace the informers list.
    #[arg(long, default_value_t = 100)]
    pub storm_objects: usize,
}

/// One row's detail.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CacheReport {
    /// `list`, `memory` or `storm`.
    pub part: &'static str,
    /// `direct` (the members, no gateway), `off` or `on` (the gateway without, with `spec.cache`).
    pub cache: &'static str,
    /// list: `0` (resourceVersion=0) or `consistent` (none).
    pub read: Option<&'static str>,
    pub memory: Option<MemoryFigures>,
    pub storm: Option<StormFigures>,
}

/// The gateway's resident memory around filling the cache with every member's pods.
#[derive(Debug, Clone, Serialize, Default)]
pub struct MemoryFigures {
    pub objects: u64,
    /// The objects' JSON as the members list it (their lists' body bytes at resourceVersion=0).
    pub json_bytes: u64,
    /// Resident memory (KiB) once started, after [`IDLE`] of nothing, after the fill.
    pub rss_start_kib: f64,
    pub rss_idle_kib: f64,
    pub rss_filled_kib: f64,
    pub idle_s: f64,
    pub fill_s: f64,
    /// (filled - idle) over the objects, and the JSON's bytes per object; their ratio.
    pub bytes_per_object: f64,
    pub json_bytes_per_object: f64,
    pub ratio_to_json: f64,
    /// The floor: (idle - start) over the objects.
    pub idle_bytes_per_object: f64,
}

/// A relist storm through one gateway mode.
#[derive(Debug, Clone, Serialize, Default)]
pub struct StormFigures {
    pub informers: usize,
    /// Cached keys (member, configmaps, namespace `chaos`): one per member.
    pub keys: usize,
    /// The members' LISTs of configmaps while the informers started (in waves), and of those
    /// the `limit=1` questions.
    pub start_lists: u64,
    pub start_short_lists: u64,
    /// Writes on the members while no gateway ran (past their history).
    pub writes: u64,
    /// The storm: the members' LISTs, their `limit=1` questions, and the other LISTs per key.
    pub lists: u64,
    pub short_lists: u64,
    pub full_lists_per_key: f64,
    /// The informers' 410s and relists during the storm.
    pub expired: u64,
    pub relists: u64,
    /// From the new gateway's start to every informer caught up.
    pub storm_s: f64,
    pub member_cpu_ms: f64,
    /// The new gateway's CPU from its start, and its highest resident memory (VmHWM).
    pub gateway_cpu_ms: f64,
    pub gateway_hwm_kib: f64,
    /// Informers not caught up when `--settle-timeout` passed (0 in a good run).
    pub stalled: usize,
}

/// The simulated fleet, a child process.
struct Sim {
    child: tokio::process::Child,
    proc: ProcWatch,
}

/// Everything the scenario acts on.
struct World {
    dir: PathBuf,
    bin: PathBuf,
    members: Vec<String>,
    /// The members straight (as their admin).
    direct: Vec<Target>,
    sim: Sim,
    front: Proxy,
    /// A writer per member, straight to it (the storms' writes).
    writers: Vec<Writer>,
}

/// `cache`: see the module documentation.
pub async fn cache(args: &RunArgs) -> anyhow::Result<Vec<TargetResult>> {
    let c = &args.chaos;
    let temporary = c.work_dir.is_none();
    let dir = c.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("fleetgate-cache-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sim = start_sim(args, &dir).await?;
    let members: Vec<String> = (1..=args.cache.cache_members.max(1))
        .map(|i| format!("member{i}"))
        .collect();
    let direct = targets_at(&dir, &members, "127.0.0.1:9".parse()?)?.0;
    let writers = direct
        .iter()
        .enumerate()
        .map(|(m, t)| Writer::new(t.clone(), c.seed.wrapping_mul(31) + m as u64))
        .collect();
    let mut world = World {
        writers,
        bin: gateway_binary(c),
        front: Proxy::start("127.0.0.1:9".parse()?).await?,
        dir: dir.clone(),
        members,
        direct,
        sim,
    };
    let outcome = drive(args, &mut world).await;
    let _ = world.sim.child.kill().await;
    if temporary && outcome.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "cache: the fleet's files and the gateways' logs are in {}",
            dir.display()
        );
    }
    outcome
}

/// Starts `fleetgate-loadtest sim` (this program) on `dir` and waits for its ready line.
async fn start_sim(args: &RunArgs, dir: &Path) -> anyhow::Result<Sim> {
    let a = &args.cache;
    let log = std::fs::File::create(dir.join("sim.log"))?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("sim")
        .arg("--dir")
        .arg(dir)
        .args(["--clusters", &a.cache_members.max(1).to_string()])
        .args(["--pods-per-member", &a.cache_pods.to_string()])
        .args(["--history-window", &args.chaos.history_window.to_string()])
        .args(["--gateway-listen", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting the simulated fleet")?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the simulated fleet exited at once"))?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let ready = tokio::time::timeout(SIM_READY, async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("ready") {
                return anyhow::Ok(());
            }
        }
        bail!("the simulated fleet exited before its ready line (see sim.log)")
    });
    ready
        .await
        .map_err(|_| anyhow!("no ready line from the simulated fleet in {SIM_READY:?}"))??;
    // Read on, so it never writes into a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Sim {
        child,
        proc: ProcWatch::new(pid)?,
    })
}

/// The run itself, in a world built.
async fn drive(args: &RunArgs, world: &mut World) -> anyhow::Result<Vec<TargetResult>> {
    seed_storm_objects(&world.direct, args.cache.storm_objects).await?;
    let mut rows = Vec::new();
    for read in ["0", "consistent"] {
        let r = lists(args, world, &world.direct, None, "direct", read).await?;
        rows.push(r);
    }
    let json = (rows[0].objects.unwrap_or(0), rows[0].bytes);
    for cache in [false, true] {
        let mode = if cache { "on" } else { "off" };
        configure(&world.dir, cache)?;
        let log = world.dir.join(format!("gateway-cache-{mode}.log"));
        let gateway = Gateway::start(&world.bin, &world.dir, &log, false).await?;
        world.front.set_upstream(gateway.https);
        let proc = ProcWatch::new(gateway.pid)?;
        let views = targets_at(&world.dir, &world.members, gateway.https)?.1;
        rows.push(memory(world, &views, &proc, mode, json).await?);
        let fleet: Vec<Target> = views.last().map(|(_, t)| t.clone()).into_iter().collect();
        for read in ["0", "consistent"] {
            rows.push(lists(args, world, &fleet, Some(&proc), mode, read).await?);
        }
        let gateway = if args.cache.informers > 0 {
            let (row, replaced) = storm(args, world, gateway, mode).await?;
            rows.push(row);
            replaced
        } else {
            gateway
        };
        gateway.stop(false).await;
    }
    Ok(rows)
}

/// DIR/gateway.yaml, as the fleet wrote it, with `spec.cache` (pods and configmaps) or without,
/// and room for a member connection per informer.
fn configure(dir: &Path, cache: bool) -> anyhow::Result<()> {
    let path = dir.join("gateway.yaml");
    let mut gateway: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    gateway["spec"]["limits"]["maxMemberConnectionsPerClient"] = 20000.into();
    let spec = gateway["spec"]
        .as_mapping_mut()
        .ok_or_else(|| anyhow!("{} has no spec", path.display()))?;
    if cache {
        spec.insert("cache".into(), serde_yaml::from_str(CACHE)?);
    } else {
        spec.remove("cache");
    }
    write_atomically(dir, "gateway.yaml", &serde_yaml::to_string(&gateway)?)?;
    Ok(())
}

/// Each member's namespace `chaos` with `count` configmaps of about 1 KiB (`storm-N`).
async fn seed_storm_objects(direct: &[Target], count: usize) -> anyhow::Result<()> {
    let data = "x".repeat(900);
    futures_util::stream::iter(direct)
        .map(|target| {
            let data = &data;
            async move {
                create_namespace(target).await?;
                let mut conn = HttpConn::new(target.connect().await?);
                for i in 0..count {
                    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": format!("storm-{i}"), "namespace": NAMESPACE},
                        "data": {"payload": data}});
                    let path = format!("/api/v1/namespaces/{NAMESPACE}/{STORM_RESOURCE}");
                    let request = body_request(
                        target,
                        "POST",
                        &path,
                        "application/json",
                        &serde_json::to_vec(&body)?,
                    );
                    let head = conn.send(&request).await?;
                    conn.read_body(&head, |_| {}).await?;
                    anyhow::ensure!(
                        matches!(head.status, 201 | 409),
                        "{}: creating storm-{i} answered {}",
                        target.name,
                        head.status
                    );
                    if head.close {
                        conn = HttpConn::new(target.connect().await?);
                    }
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(AT_ONCE)
        .try_collect::<()>()
        .await
}

/// The LIST of every pod from `targets` (the members one after the other, or the fleet view),
/// at resourceVersion=0 (`read` "0") or consistent, charged to `gateway` and the members.
async fn lists(
    args: &RunArgs,
    world: &World,
    targets: &[Target],
    gateway: Option<&ProcWatch>,
    mode: &'static str,
    read: &'static str,
) -> anyhow::Result<TargetResult> {
    let mut list_args = args.clone();
    list_args.limit = 0;
    list_args.check_items = false;
    list_args.path = match read {
        "0" => "/api/v1/pods?resourceVersion=0".into(),
        _ => "/api/v1/pods".into(),
    };
    let name = row_name(mode, if read == "0" { "rv0" } else { read });
    let charged = Charged {
        target: gateway,
        upstream: Some(&world.sim.proc),
    };
    let mut r = fleet_list(&list_args, &name, targets, charged).await?;
    r.scenario = "cache".into();
    r.cache = Some(Box::new(CacheReport {
        part: "list",
        cache: mode,
        read: Some(read),
        ..Default::default()
    }));
    Ok(r)
}

fn row_name(mode: &str, part: &str) -> String {
    match mode {
        "direct" => format!("direct-{part}"),
        _ => format!("cache-{mode}-{part}"),
    }
}

/// The gateway's memory around a LIST of each member's pods through `/clusters/NAME` (`views`):
/// with the cache on, every member's pods held.
async fn memory(
    world: &World,
    views: &[(View, Target)],
    proc: &ProcWatch,
    mode: &'static str,
    (objects, json_bytes): (u64, u64),
) -> anyhow::Result<TargetResult> {
    let kib = |b: u64| b as f64 / 1024.0;
    let members = &views[..world.members.len()];
    // The gateway's connections to every member opened first (a resource it does not cache).
    list_each(members, &format!("/api/v1/nodes?{NOTHING}")).await?;
    let rss_start = proc.rss()?;
    let idle = Instant::now();
    tokio::time::sleep(IDLE).await;
    let rss_idle = proc.rss()?;
    let idle_s = idle.elapsed().as_secs_f64();
    let fill = Instant::now();
    list_each(
        members,
        &format!("/api/v1/pods?resourceVersion=0&{NOTHING}"),
    )
    .await?;
    let fill_s = fill.elapsed().as_secs_f64();
    let rss_filled = proc.rss()?;
    let per_object = |b: f64| b / objects.max(1) as f64;
    let grown = per_object(rss_filled as f64 - rss_idle as f64);
    let json_per_object = per_object(json_bytes as f64);
    let figures = MemoryFigures {
        objects,
        json_bytes,
        rss_start_kib: kib(rss_start),
        rss_idle_kib: kib(rss_idle),
        rss_filled_kib: kib(rss_filled),
        idle_s,
        fill_s,
        bytes_per_object: grown,
        json_bytes_per_object: json_per_object,
        ratio_to_json: grown / json_per_object.max(1.0),
        idle_bytes_per_object: per_object(rss_idle as f64 - rss_start as f64),
    };
    Ok(TargetResult {
        target: row_name(mode, "memory"),
        scenario: "cache".into(),
        requests: world.members.len() as u64,
        seconds: fill_s,
        bytes: json_bytes,
        objects: Some(objects),
        rss_base_kib: Some(kib(rss_idle)),
        rss_peak_kib: Some(kib(rss_filled)),
        cache: Some(Box::new(CacheReport {
            part: "memory",
            cache: mode,
            memory: Some(figures),
            ..Default::default()
        })),
        ..Default::default()
    })
}

/// GETs `path` of every target, [`AT_ONCE`] at a time, each answer read and checked for a 200.
async fn list_each(targets: &[(View, Target)], path: &str) -> anyhow::Result<()> {
    futures_util::stream::iter(targets)
        .map(|(_, target)| async move {
            let mut conn = HttpConn::new(target.connect().await?);
            let head = conn
                .send(&target.get_request(path, "application/json"))
                .await?;
            conn.read_body(&head, |_| {}).await?;
            anyhow::ensure!(
                head.status == 200,
                "{}: {path} answered {}",
                target.name,
                head.status
            );
            anyhow::Ok(())
        })
        .buffer_unordered(AT_ONCE)
        .try_collect()
        .await
}

/// Every member's LISTs of the storm's resource, and the `limit=1` ones among them, summed.
async fn member_lists(direct: &[Target]) -> anyhow::Result<(u64, u64)> {
    let lists =
        format!("fleetgate_sim_requests_total{{verb=\"list\",resource=\"{STORM_RESOURCE}\"}} ");
    let short = format!("fleetgate_sim_short_lists_total{{resource=\"{STORM_RESOURCE}\"}} ");
    let texts: Vec<String> = futures_util::stream::iter(direct)
        .map(|member| async move {
            // A member once left a /metrics request unanswered (its TLS handshake done, the
            // request sent): asked again on a new connection.
            for _ in 0..METRICS_TRIES {
                if let Ok(answer) = tokio::time::timeout(METRICS_TIMEOUT, member.metrics_text()).await {
                    let (status, text) = answer?;
                    anyhow::ensure!(status == 200, "{}: /metrics answered {status}", member.name);
                    return anyhow::Ok(text);
                }
                tracing::warn!(member = %member.name, "cache: no /metrics answer in {METRICS_TIMEOUT:?}; asking again");
            }
            bail!("{}: no /metrics answer in {METRICS_TRIES} tries", member.name)
        })
        .buffer_unordered(AT_ONCE)
        .try_collect()
        .await?;
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(texts.iter().fold((0, 0), |(l, s), t| {
        (l + value(t, &lists), s + value(t, &short))
    }))
}

/// Waits, woken by the informers' progress, until `done` holds or `timeout` passed.
async fn settle(run: &Run, timeout: Duration, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done() && tokio::time::Instant::now() < deadline {
        let moved = run.progress.notified();
        let _ = tokio::time::timeout(Duration::from_millis(200), moved).await;
    }
}

/// Writes on every member straight (its writer, kept from one storm to the next so that its
/// names go on), more than its history keeps: the last resourceVersion written on each, and the
/// writes made.
async fn write_past_history(
    history: usize,
    writers: &mut [Writer],
) -> anyhow::Result<(Vec<u64>, u64)> {
    let needed = history as u64 + 10;
    let done: Vec<(u64, u64)> = futures_util::stream::iter(writers.iter_mut())
        .map(|writer| async move {
            let (mut last, from) = (0, writer.writes);
            while writer.writes - from < needed {
                if let Some(rv) = writer.write(false).await? {
                    last = rv;
                }
            }
            anyhow::Ok((last, writer.writes - from))
        })
        .buffered(AT_ONCE)
        .try_collect()
        .await?;
    Ok((
        done.iter().map(|&(last, _)| last).collect(),
        done.iter().map(|&(_, w)| w).sum(),
    ))
}

/// The relist storm through `gateway` (see the module documentation); the row, and the gateway
/// that replaced it.
async fn storm(
    args: &RunArgs,
    world: &mut World,
    gateway: Gateway,
    mode: &'static str,
) -> anyhow::Result<(TargetResult, Gateway)> {
    let c = &args.chaos;
    let count = world.members.len();
    let n = args.cache.informers;
    let run = Arc::new(Run::new(world.members.clone()));
    let views = targets_at(&world.dir, &world.members, world.front.addr)?.1;
    let watchers: Vec<Arc<Watcher>> = (0..n)
        .map(|i| {
            let (view, target) = views[i % count].clone();
            let name = format!("{}#{i}", target.name);
            Arc::new(Watcher::new(name, view, target, count, None))
        })
        .collect();
    let mut figures = StormFigures {
        informers: n,
        keys: count,
        ..Default::default()
    };

    // The informers start, in waves, and all watch.
    let before = member_lists(&world.direct).await?;
    let mut tasks = Vec::new();
    for (i, w) in watchers.iter().enumerate() {
        let seed = c.seed.wrapping_add(1000 + i as u64);
        tasks.push(tokio::spawn(w.clone().follow(run.clone(), seed)));
        if tasks.len() % WAVE != 0 && tasks.len() < n {
            continue;
        }
        // A wave started: all of them listed before the next.
        let spawned = tasks.len();
        settle(&run, c.settle_timeout, || {
            run.listed.load(Ordering::Relaxed) >= spawned
        })
        .await;
        let listed = run.listed.load(Ordering::Relaxed);
        anyhow::ensure!(
            listed >= spawned,
            "only {listed} of {spawned} informers listed through the gateway in {:?}",
            c.settle_timeout
        );
    }
    let all = n as i64;
    settle(&run, c.settle_timeout, || {
        run.watches_open.load(Ordering::Relaxed) >= all
    })
    .await;
    let started = member_lists(&world.direct).await?;
    figures.start_lists = started.0.saturating_sub(before.0);
    figures.start_short_lists = started.1.saturating_sub(before.1);

    // The gateway is replaced; the members move past their history meanwhile.
    let killed_ms = run.ms();
    gateway.stop(false).await;
    let (last, writes) = write_past_history(c.history_window, &mut world.writers).await?;
    figures.writes = writes;
    let before = member_lists(&world.direct).await?;
    let member_cpu = world.sim.proc.cpu()?;
    let t0 = Instant::now();
    let log = world.dir.join(format!("gateway-cache-{mode}-replaced.log"));
    let replaced = Gateway::start(&world.bin, &world.dir, &log, false).await?;
    world.front.set_upstream(replaced.https);
    let proc = ProcWatch::new(replaced.pid)?;
    let caught_up = |w: &Watcher| {
        let m = w.members(count)[0];
        let relisted = lock(&w.log)
            .incidents
            .iter()
            .any(|&(at, what)| at >= killed_ms && what == Incident::Relist);
        relisted && w.positions[m].load(Ordering::Relaxed) >= last[m]
    };
    settle(&run, c.settle_timeout, || {
        run.watches_open.load(Ordering::Relaxed) >= all && watchers.iter().all(|w| caught_up(w))
    })
    .await;
    figures.storm_s = t0.elapsed().as_secs_f64();
    figures.member_cpu_ms = world
        .sim
        .proc
        .cpu()?
        .saturating_sub(member_cpu)
        .as_secs_f64()
        * 1e3;
    figures.gateway_cpu_ms = proc.cpu()?.as_secs_f64() * 1e3;
    figures.gateway_hwm_kib = proc.rss_high_water()? as f64 / 1024.0;
    let after = member_lists(&world.direct).await?;
    for t in &tasks {
        t.abort();
    }
    figures.lists = after.0.saturating_sub(before.0);
    figures.short_lists = after.1.saturating_sub(before.1);
    figures.full_lists_per_key =
        figures.lists.saturating_sub(figures.short_lists) as f64 / count as f64;
    figures.stalled = watchers.iter().filter(|w| !caught_up(w)).count();
    for w in &watchers {
        for &(at, what) in &lock(&w.log).incidents {
            match what {
                Incident::Expired if at >= killed_ms => figures.expired += 1,
                Incident::Relist if at >= killed_ms => figures.relists += 1,
                _ => {}
            }
        }
    }
    let row = TargetResult {
        target: row_name(mode, "storm"),
        scenario: "cache".into(),
        requests: figures.lists,
        errors: figures.stalled as u64,
        seconds: figures.storm_s,
        watches: Some(n),
        rss_hwm_kib: Some(figures.gateway_hwm_kib),
        cache: Some(Box::new(CacheReport {
            part: "storm",
            cache: mode,
            storm: Some(figures),
            ..Default::default()
        })),
        ..Default::default()
    };
    Ok((row, replaced))
}

/// Prints the memory and storm figures after the table.
pub fn print_report(rows: &[TargetResult]) {
    for r in rows {
        let Some(c) = r.cache.as_deref() else {
            continue;
        };
        if let Some(m) = &c.memory {
            println!(
                "{}: {} objects, {:.0} bytes of JSON each; RSS {:.1} MiB idle, {:.1} MiB after the fill ({:.1} s): {:.0} bytes per object, {:.2}x the JSON; floor (idle {:.1} s) {:.1} bytes per object",
                r.target,
                m.objects,
                m.json_bytes_per_object,
                m.rss_idle_kib / 1024.0,
                m.rss_filled_kib / 1024.0,
                m.fill_s,
                m.bytes_per_object,
                m.ratio_to_json,
                m.idle_s,
                m.idle_bytes_per_object
            );
        }
        if let Some(s) = &c.storm {
            println!(
                "{}: {} informers on {} keys; start: member LISTs {} ({} limit=1); storm ({} writes away): {} 410s, {} relists, member LISTs {} ({} limit=1, {:.2} others per key) in {:.1} s; member CPU {:.0} ms, gateway CPU {:.0} ms, peak RSS {:.1} MiB; stalled {}",
                r.target,
                s.informers,
                s.keys,
                s.start_lists,
                s.start_short_lists,
                s.writes,
                s.expired,
                s.relists,
                s.lists,
                s.short_lists,
                s.full_lists_per_key,
                s.storm_s,
                s.member_cpu_ms,
                s.gateway_cpu_ms,
                s.gateway_hwm_kib / 1024.0,
                s.stalled
            );
        }
    }
}
