//! Reading what a target process costs from `/proc`: CPU time (user + system, all threads) and
//! resident memory. The load driver samples the proxy under test, never itself, so the figures are
//! the proxy's own. A target may be served by several processes (a gateway and the pull-mode agent
//! its requests ride through): their figures are summed, and each one's can be read apart.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context};

/// The processes whose CPU time and memory are sampled, summed.
#[derive(Debug, Clone)]
pub struct ProcWatch {
    procs: Vec<Proc>,
    ticks_per_sec: f64,
}

/// One process of a [`ProcWatch`].
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    stat: PathBuf,
    status: PathBuf,
}

impl ProcWatch {
    pub fn new(pid: u32) -> anyhow::Result<ProcWatch> {
        ProcWatch::group(&[pid])
    }

    /// Several processes charged together (at least one; each must exist now).
    pub fn group(pids: &[u32]) -> anyhow::Result<ProcWatch> {
        if pids.is_empty() {
            anyhow::bail!("no process to watch");
        }
        let w = ProcWatch {
            procs: pids
                .iter()
                .map(|&pid| Proc {
                    pid,
                    stat: PathBuf::from(format!("/proc/{pid}/stat")),
                    status: PathBuf::from(format!("/proc/{pid}/status")),
                })
                .collect(),
            ticks_per_sec: clock_ticks_per_sec(),
        };
        w.cpu()?;
        Ok(w)
    }

    /// `PID` or `PID,PID,...` (the `--pid NAME=...` value).
    pub fn parse(spec: &str) -> anyhow::Result<ProcWatch> {
        let pids = spec
            .split(',')
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{spec:?} is not PID or PID,PID,..."))?;
        ProcWatch::group(&pids)
    }

    /// How many processes are summed.
    pub fn count(&self) -> usize {
        self.procs.len()
    }

    /// User + system CPU time used so far by all of them.
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        Ok(self.cpu_each()?.into_iter().sum())
    }

    /// Each process's user + system CPU time so far (fields 14 and 15 of `/proc/PID/stat`), in
    /// the order given.
    pub fn cpu_each(&self) -> anyhow::Result<Vec<Duration>> {
        self.procs
            .iter()
            .map(|p| p.cpu(self.ticks_per_sec))
            .collect()
    }

    /// Resident memory (VmRSS) of all of them, in bytes.
    pub fn rss(&self) -> anyhow::Result<u64> {
        Ok(self.rss_each()?.into_iter().sum())
    }

    /// Each process's resident memory (VmRSS) in bytes, in the order given.
    pub fn rss_each(&self) -> anyhow::Result<Vec<u64>> {
        self.procs
            .iter()
            .map(|p| p.status_kib("VmRSS:").map(|kib| kib * 1024))
            .collect()
    }

    /// Open file descriptors of all of them (entries of `/proc/PID/fd`).
    pub fn open_fds(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for p in &self.procs {
            let dir = format!("/proc/{}/fd", p.pid);
            let entries =
                std::fs::read_dir(&dir).map_err(|e| anyhow!("cannot list {dir} ({e})"))?;
            total += entries.count() as u64;
        }
        Ok(total)
    }

    /// The most resident memory each process ever had (VmHWM), summed, in bytes (an upper
    /// bound of the group's peak: the processes need not have peaked together).
    pub fn rss_high_water(&self) -> anyhow::Result<u64> {
        self.procs
            .iter()
            .map(|p| p.status_kib("VmHWM:").map(|kib| kib * 1024))
            .sum()
    }
}

impl Proc {
    fn cpu(&self, ticks_per_sec: f64) -> anyhow::Result<Duration> {
        let text = std::fs::read_to_string(&self.stat)
            .map_err(|e| anyhow!("process {} is gone ({e})", self.pid))?;
        // The command name (field 2) is in parentheses and may contain spaces: split after it.
        let after = text
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or_else(|| anyhow!("unreadable {}", self.stat.display()))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        // `after` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
        let ticks: f64 = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<f64>().ok()? + s.parse::<f64>().ok()?))
            .ok_or_else(|| anyhow!("unreadable {}", self.stat.display()))?;
        Ok(Duration::from_secs_f64(ticks / ticks_per_sec))
    }

    /// A `NAME: N kB` line of `/proc/PID/status`.
    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let text = std::fs::read_to_string(&self.status)
            .map_err(|e| anyhow!("process {} is gone ({e})", self.pid))?;
        let line = text
            .lines()
            .find(|l| l.starts_with(field))
            .ok_or_else(|| anyhow!("no {field} for {}", self.pid))?;
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("bad {field} line {line:?}"))
    }
}

fn clock_ticks_per_sec() -> f64 {
    #[allow(unsafe_code)]
    // SAFETY: sysconf only reads a system constant; it has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_memory() {
        let me = ProcWatch::new(std::process::id()).unwrap();
        let before = me.cpu().unwrap();
        // Burn a little CPU so the counter has something to show (bounded loop).
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(100) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(me.cpu().unwrap() > before);
        assert!(me.rss().unwrap() > 1024 * 1024);
        assert!(me.rss_high_water().unwrap() >= me.rss().unwrap() / 2);
        assert!(ProcWatch::new(u32::MAX).is_err());
    }

    #[test]
    fn a_group_sums_its_processes_and_reads_each() {
        let me = std::process::id();
        let one = ProcWatch::new(me).unwrap();
        let two = ProcWatch::parse(&format!("{me}, {me}")).unwrap();
        assert_eq!(two.count(), 2);
        let each = two.rss_each().unwrap();
        assert_eq!(each.len(), 2);
        // Read a moment apart, the two readings of one process agree to within a few MiB.
        let (single, double) = (one.rss().unwrap(), two.rss().unwrap());
        assert!(double.abs_diff(2 * single) < 8 << 20, "{single} {double}");
        assert!(two.cpu().unwrap() >= two.cpu_each().unwrap()[0]);
        assert!(two.rss_high_water().unwrap() >= one.rss_high_water().unwrap());
        for bad in ["", "1,", "x", "1;2", &format!("{me},{}", u32::MAX)] {
            assert!(ProcWatch::parse(bad).is_err(), "{bad:?}");
        }
    }
}
