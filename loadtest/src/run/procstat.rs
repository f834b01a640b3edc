//! Reading what a target process costs from `/proc`: CPU time (user + system, all threads) and
//! resident memory. The load driver samples the proxy under test, never itself, so the figures are
//! the proxy's own.

use std::path::PathBuf;
use std::time::Duration;

/// A process whose CPU time and memory are sampled.
#[derive(Debug, Clone)]
pub struct ProcWatch {
    pub pid: u32,
    stat: PathBuf,
    status: PathBuf,
    ticks_per_sec: f64,
}

impl ProcWatch {
    pub fn new(pid: u32) -> anyhow::Result<ProcWatch> {
        let w = ProcWatch {
            pid,
            stat: PathBuf::from(format!("/proc/{pid}/stat")),
            status: PathBuf::from(format!("/proc/{pid}/status")),
            ticks_per_sec: clock_ticks_per_sec(),
        };
        w.cpu()?;
        Ok(w)
    }

    /// User + system CPU time used so far (fields 14 and 15 of `/proc/PID/stat`).
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        let text = std::fs::read_to_string(&self.stat)
            .map_err(|e| anyhow::anyhow!("process {} is gone ({e})", self.pid))?;
        // The command name (field 2) is in parentheses and may contain spaces: split after it.
        let after = text
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or_else(|| anyhow::anyhow!("unreadable {}", self.stat.display()))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        // `after` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
        let ticks: f64 = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<f64>().ok()? + s.parse::<f64>().ok()?))
            .ok_or_else(|| anyhow::anyhow!("unreadable {}", self.stat.display()))?;
        Ok(Duration::from_secs_f64(ticks / self.ticks_per_sec))
    }

    /// Resident memory (VmRSS) in bytes.
    pub fn rss(&self) -> anyhow::Result<u64> {
        self.status_kib("VmRSS:").map(|kib| kib * 1024)
    }

    /// The most resident memory the process ever had (VmHWM) in bytes.
    pub fn rss_high_water(&self) -> anyhow::Result<u64> {
        self.status_kib("VmHWM:").map(|kib| kib * 1024)
    }

    /// A `NAME: N kB` line of `/proc/PID/status`.
    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let text = std::fs::read_to_string(&self.status)
            .map_err(|e| anyhow::anyhow!("process {} is gone ({e})", self.pid))?;
        let line = text
            .lines()
            .find(|l| l.starts_with(field))
            .ok_or_else(|| anyhow::anyhow!("no {field} for {}", self.pid))?;
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("bad {field} line {line:?}"))
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
}
