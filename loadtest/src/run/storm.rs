//! `reload-storm`: small-GET load on one cluster of the gateway while the driver rewrites Cluster
//! files in the gateway's configuration directory (`--config-dir`, the directory `fleetgate serve
//! --config DIR` watches) `--changes-per-sec` times a second: nine of every ten changes toggle a
//! label on one of ten `loadtest-storm-N` clusters, the tenth adds or removes one more cluster
//! file. The same load runs first without the storm, then with it, on the same target.
//!
//! Figures: failed requests during the storm (must be 0), p50/p99 and CPU per request with and
//! without it, changes written, and the reloads the gateway reports (its `/metrics` counter
//! `fleetgate_config_reloads_total`, when `--admin-url` is given).
//!
//! Only ever touches files named `loadtest-storm-*` (and their hidden temporaries) in that
//! directory, writes each atomically (temporary file, then rename), and removes them all at the
//! end, so the gateway's configuration is left as it was found. The storm clusters point at an
//! unused address; no request is routed to them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};

use super::client::{Target, TlsOptions};
use super::procstat::ProcWatch;
use super::scenarios::small_get;
use super::{RunArgs, TargetResult};

/// Clusters whose labels the storm toggles.
const STORM_CLUSTERS: usize = 10;
/// The gateway debounces reloads; after the last write, this long is enough for the last reload.
const SETTLE: Duration = Duration::from_millis(1500);

pub(super) fn cluster_yaml(name: &str, generation: u64) -> String {
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    \
         fleetgate.io/loadtest-storm: \"{generation}\"\nspec:\n  server: http://127.0.0.1:9\n  \
         impersonation: false\n"
    )
}

pub(super) fn write_atomically(dir: &Path, file: &str, content: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, dir.join(file))
}

fn storm_file(i: usize) -> String {
    format!("loadtest-storm-{i}.yaml")
}

const EXTRA_FILE: &str = "loadtest-storm-extra.yaml";

/// Removes every file the storm wrote.
fn clean(dir: &Path) {
    for i in 0..STORM_CLUSTERS {
        let _ = std::fs::remove_file(dir.join(storm_file(i)));
    }
    let _ = std::fs::remove_file(dir.join(EXTRA_FILE));
}

/// The gateway's reload counters (success, failure) from its admin `/metrics`.
pub(super) async fn read_reloads(admin: &Target) -> anyhow::Result<(u64, u64)> {
    let (_, text) = admin.metrics_text().await?;
    let read = |result: &str| -> Option<u64> {
        let key = format!("fleetgate_config_reloads_total{{result=\"{result}\"}}");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    };
    match (read("success"), read("failure")) {
        (Some(s), Some(f)) => Ok((s, f)),
        _ => Err(anyhow!(
            "the admin /metrics has no fleetgate_config_reloads_total (is the gateway serving a \
             --config directory?)"
        )),
    }
}

/// The gateway's admin listener (`--admin-url`) and its reload counters now, if given.
pub(super) async fn admin_reloads(
    args: &RunArgs,
) -> anyhow::Result<(Option<Target>, Option<(u64, u64)>)> {
    let admin = args
        .admin_url
        .as_deref()
        .map(|url| Target::parse(&format!("admin={url}"), &TlsOptions::default()))
        .transpose()?;
    let now = match &admin {
        Some(a) => Some(read_reloads(a).await?),
        None => None,
    };
    Ok((admin, now))
}

/// Writes changes until `stop`, `per_sec` a second; returns how many it wrote.
fn storm(dir: PathBuf, per_sec: f64, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) {
    let interval = Duration::from_secs_f64(1.0 / per_sec.max(0.1));
    let mut next = Instant::now();
    let mut generation = 1_000u64;
    let mut extra_present = false;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        generation += 1;
        let outcome = if i % STORM_CLUSTERS == STORM_CLUSTERS - 1 {
            extra_present = !extra_present;
            if extra_present {
                write_atomically(
                    &dir,
                    EXTRA_FILE,
                    &cluster_yaml("loadtest-storm-extra", generation),
                )
            } else {
                std::fs::remove_file(dir.join(EXTRA_FILE))
            }
        } else {
            let k = i % STORM_CLUSTERS;
            write_atomically(
                &dir,
                &storm_file(k),
                &cluster_yaml(&format!("loadtest-storm-{k}"), generation),
            )
        };
        match outcome {
            Ok(()) => {
                written.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(%error, dir = %dir.display(), "storm write failed"),
        }
        i += 1;
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Behind (a slow disk): do not burst to catch up.
            next = now;
        }
    }
}

/// `reload-storm`: see the module documentation.
pub async fn reload_storm(
    args: &RunArgs,
    target: &Target,
    pw: Option<&ProcWatch>,
) -> anyhow::Result<TargetResult> {
    let dir = args
        .config_dir
        .clone()
        .ok_or_else(|| anyhow!("reload-storm needs --config-dir (the gateway's --config DIR)"))?;
    anyhow::ensure!(
        dir.is_dir(),
        "--config-dir {} is not a directory",
        dir.display()
    );
    let (admin, before) = admin_reloads(args).await?;

    // The storm's clusters exist in both phases, so both serve a table of the same size.
    for i in 0..STORM_CLUSTERS {
        write_atomically(
            &dir,
            &storm_file(i),
            &cluster_yaml(&format!("loadtest-storm-{i}"), 0),
        )
        .with_context(|| format!("writing into {}", dir.display()))?;
    }
    // Wait for the gateway to take them (bounded), so the quiet phase is quiet.
    let settle_until = Instant::now() + SETTLE * 4;
    match (&admin, before) {
        (Some(a), Some((s0, _))) => {
            while Instant::now() < settle_until && read_reloads(a).await?.0 <= s0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        _ => tokio::time::sleep(SETTLE).await,
    }

    let outcome = async {
        let quiet = small_get(args, target, pw).await?;
        let r0 = match &admin {
            Some(a) => Some(read_reloads(a).await?),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let writer = {
            let (dir, stop, written) = (dir.clone(), stop.clone(), written.clone());
            let per_sec = args.changes_per_sec;
            std::thread::Builder::new()
                .name("reload-storm".into())
                .spawn(move || storm(dir, per_sec, stop, written))?
        };
        let stormy = small_get(args, target, pw).await;
        stop.store(true, Ordering::Relaxed);
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        let stormy = stormy?;
        tokio::time::sleep(SETTLE).await;
        let r1 = match &admin {
            Some(a) => Some(read_reloads(a).await?),
            None => None,
        };
        let reloads = r0.zip(r1);
        anyhow::Ok(TargetResult {
            scenario: "reload-storm".into(),
            changes_written: Some(written.load(Ordering::Relaxed)),
            reloads_applied: reloads.map(|((s0, _), (s1, _))| s1 - s0),
            reloads_failed: reloads.map(|((_, f0), (_, f1))| f1 - f0),
            p50_no_storm_us: quiet.p50_us,
            p99_no_storm_us: quiet.p99_us,
            cpu_us_per_request_no_storm: quiet.cpu_us_per_request,
            ..stormy
        })
    }
    .await;
    clean(&dir);
    outcome
}
