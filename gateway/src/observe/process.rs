//! The process's own metrics, named as Prometheus' client libraries name them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), and
//! `fleetgate_build_info`.
//!
//! prometheus-client has no process collector: these are read from `/proc/self` at scrape time,
//! on the admin listener's thread, never on a shard. A file that cannot be read (not Linux, a
//! restricted `/proc`) leaves its metrics out rather than failing the scrape. Registered by
//! `observe::metrics`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// `/proc` counts CPU time and start times in clock ticks of USER_HZ, which Linux fixes at 100
/// for user space on every architecture (Prometheus' procfs assumes the same).
const USER_HZ: f64 = 100.0;

/// What `/proc/self/stat` says (after the command name, which may hold spaces and parentheses).
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    /// Clock ticks after boot.
    start_ticks: u64,
    virtual_bytes: u64,
}

/// Parses `/proc/self/stat`: fields are counted from after the last `)`, where the third field
/// (the state) begins.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / USER_HZ,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
    })
}

/// The value in kB of `key` in `/proc/self/status` (`VmRSS:     1234 kB`), in bytes.
fn status_bytes(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The soft limit on open files, from `/proc/self/limits` (`Max open files  1024  4096  files`).
fn max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The boot time (seconds since the epoch), from `/proc/stat`'s `btime` line.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Reads `/proc/self` when scraped.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat").and_then(|t| parse_stat(&t));
        if let Some(stat) = &stat {
            let family = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(stat.cpu_seconds).encode(family)?;
            let family = encoder.encode_descriptor(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(stat.virtual_bytes as f64).encode(family)?;
        }
        if let Some(rss) = read("/proc/self/status").and_then(|t| status_bytes(&t, "VmRSS")) {
            let family = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(rss as f64).encode(family)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let family = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(fds.count() as f64).encode(family)?;
        }
        if let Some(max) = read("/proc/self/limits").and_then(|t| max_open_files(&t)) {
            let family = encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(max as f64).encode(family)?;
        }
        let boot = read("/proc/stat").and_then(|t| boot_time(&t));
        if let (Some(stat), Some(boot)) = (&stat, boot) {
            let family = encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                MetricType::Gauge,
            )?;
            let start = boot as f64 + stat.start_ticks as f64 / USER_HZ;
            ConstGauge::new(start).encode(family)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// `fleetgate_build_info{version} 1`: which release runs, to join with other series.
#[derive(Debug)]
pub struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let labels = BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
        };
        super::metrics::encode_family(
            &mut encoder,
            (
                "build_info",
                "Always 1; its labels say which fleetgate release runs",
                MetricType::Gauge,
            ),
            [(&labels, ConstGauge::new(1))],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_proc5_describes_them() {
        // A command name with spaces and a parenthesis, as a process may name itself.
        let stat = "4242 (fleet gate) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 125 0 0 20 0 9 0 123456 987654321 2400 18446744073709551615";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                cpu_seconds: 3.75,
                start_ticks: 123456,
                virtual_bytes: 987654321,
            })
        );
        assert_eq!(parse_stat("4242 (cut short) S 1"), None);
        let status = "Name:\tfleetgate\nVmPeak:\t  99 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";
        assert_eq!(status_bytes(status, "VmRSS"), Some(20480 * 1024));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             63422                63422                processes\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1764400000\nprocesses 9\n"),
            Some(1_764_400_000)
        );
    }
}
