//! Network namespaces for tests that need a real network boundary (pull mode: a member that only
//! its agent can reach): the machine's `ip netns`, a veth pair from the test's (root) namespace
//! into it with a /30 of 10.213.0.0/16, and commands run inside it (`ip netns exec`).
//!
//! Names and addresses are unique per process and per namespace (the pid and a counter), so
//! tests of one binary, and other processes doing the same, run side by side. A [`Netns`] is a
//! drop guard: dropped, even while a test panics, it kills whatever still runs inside, deletes
//! its veth pair and the namespace, so nothing is left behind; namespaces of a test process
//! that died without its guards (SIGKILL) are swept by the next one.
//!
//! Needs root and iproute2. Where a namespace cannot be made the test fails and says why;
//! `FLEETGATE_NO_NETNS=1` skips these tests knowingly (each says it was skipped). Used by the
//! tunnel_netns binary.

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Set to `1` to skip the network-namespace tests on a machine that cannot run them.
pub const SKIP_VAR: &str = "FLEETGATE_NO_NETNS";

/// The prefix of every namespace and link these tests make (`fgn{pid}-{n}`, `fgh{pid}-{n}`).
const NS_PREFIX: &str = "fgn";
const LINK_PREFIX: &str = "fgh";
/// The veth end inside a namespace (names there are private to it).
pub const INNER_LINK: &str = "veth0";

/// Whether `test` is to be skipped because [`SKIP_VAR`] says so; says so on stderr.
pub fn skipped(test: &str) -> bool {
    let skip = std::env::var(SKIP_VAR).is_ok_and(|v| v == "1");
    if skip {
        eprintln!("{test}: SKIPPED ({SKIP_VAR}=1: no network-namespace tests on this machine)");
    }
    skip
}

/// A network namespace with a veth pair to the test's namespace.
pub struct Netns {
    pub name: String,
    /// The veth end in the test's namespace.
    pub host_link: String,
    /// The address of [`Netns::host_link`] (the test's side of the /30).
    pub host_addr: Ipv4Addr,
    /// The address of [`INNER_LINK`] inside the namespace.
    pub inner_addr: Ipv4Addr,
}

/// Runs `ip ARGS`; its output, whatever the exit code.
fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `ip` ({e}): the network-namespace tests need iproute2 and root; \
                 set {SKIP_VAR}=1 to skip them knowingly"
            )
        })
}

/// Runs `ip ARGS`, failing the test with `what` and the reason when it fails.
fn ip_ok(args: &[&str], what: &str) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "{what}: `ip {}` failed: {}; the network-namespace tests need root and iproute2 \
         (`ip netns`, veth); set {SKIP_VAR}=1 to skip them knowingly",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The /30 networks of 10.213.0.0/16 some interface already has an address in.
fn subnets_in_use() -> Vec<u32> {
    let out = ip(&["-o", "-4", "addr", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| word.split('/').next()?.parse::<Ipv4Addr>().ok())
        .map(u32::from)
        .filter(|a| a >> 16 == u32::from(Ipv4Addr::new(10, 213, 0, 0)) >> 16)
        .map(|a| (a & 0xffff) >> 2)
        .collect()
}

/// How old a namespace of a vanished process must be before it is swept.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Deletes the namespaces and links of test processes that died without dropping their guards.
fn sweep_dead_processes() {
    let listed = ip(&["netns", "list"]);
    for name in String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // Only when its process is gone and it is older than any test: a process this one cannot
        // see (another PID namespace) may still be using a young one.
        let old = std::fs::metadata(format!("/run/netns/{name}"))
            .and_then(|m| m.modified())
            .is_ok_and(|made| made.elapsed().unwrap_or_default() > STALE_AFTER);
        if old && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let link = name.replacen(NS_PREFIX, LINK_PREFIX, 1);
            let _ = ip(&["link", "del", &link]);
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Netns {
    /// Makes a namespace, its loopback up, and a veth pair with a free /30 of 10.213.0.0/16:
    /// `.1` on the test's side, `.2` inside. Fails the test (naming [`SKIP_VAR`]) where it cannot.
    pub fn create() -> Netns {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            sweep_dead_processes();
        }
        let pid = std::process::id();
        let name = format!("{NS_PREFIX}{pid}-{n}");
        let host_link = format!("{LINK_PREFIX}{pid}-{n}");
        // A /30 picked by pid and counter, the next free one if some interface has it.
        let used = subnets_in_use();
        let start = (pid.wrapping_mul(64).wrapping_add(n.wrapping_mul(7919))) % 16384;
        let subnet = (0..16384)
            .map(|i| (start + i) % 16384)
            .find(|s| *s != 0 && !used.contains(s))
            .expect("a free /30 in 10.213.0.0/16");
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + (subnet << 2);
        let netns = Netns {
            name,
            host_link,
            host_addr: Ipv4Addr::from(base + 1),
            inner_addr: Ipv4Addr::from(base + 2),
        };
        // From here on the guard deletes whatever was made, should a step fail.
        ip_ok(
            &["netns", "add", &netns.name],
            "creating a network namespace",
        );
        ip_ok(
            &[
                "link",
                "add",
                &netns.host_link,
                "type",
                "veth",
                "peer",
                "name",
                INNER_LINK,
                "netns",
                &netns.name,
            ],
            "creating a veth pair",
        );
        let host = format!("{}/30", netns.host_addr);
        let inner = format!("{}/30", netns.inner_addr);
        ip_ok(&["addr", "add", &host, "dev", &netns.host_link], "address");
        ip_ok(&["link", "set", &netns.host_link, "up"], "link up");
        let n = &netns.name;
        ip_ok(
            &["-n", n, "addr", "add", &inner, "dev", INNER_LINK],
            "address",
        );
        ip_ok(&["-n", n, "link", "set", INNER_LINK, "up"], "link up");
        ip_ok(&["-n", n, "link", "set", "lo", "up"], "loopback up");
        netns
    }

    /// `program` run inside the namespace (`ip netns exec NAME program`, which execs it: the
    /// child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Adds `delay` each way on the veth pair (`tc ... netem`), so the path between the
    /// namespaces is not a zero-latency one. `Err` says why not (no `tc`, no netem in the
    /// kernel); the caller goes on without it.
    pub fn add_delay(&self, delay: std::time::Duration) -> Result<(), String> {
        let ms = format!("{}ms", delay.as_millis());
        let sides = [
            (Command::new("tc"), self.host_link.as_str()),
            (self.command("tc"), INNER_LINK),
        ];
        for (mut tc, link) in sides {
            let out = tc
                .args(["qdisc", "add", "dev", link, "root", "netem", "delay", &ms])
                .output()
                .map_err(|e| format!("cannot run tc: {e}"))?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
            }
        }
        Ok(())
    }

    /// The pids of the processes running inside the namespace.
    pub fn pids(&self) -> Vec<u32> {
        let out = ip(&["netns", "pids", &self.name]);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Only this test's processes run inside its namespace.
        for pid in self.pids() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        // The link first: deleting it is synchronous, a namespace's end is not.
        let _ = ip(&["link", "del", &self.host_link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
