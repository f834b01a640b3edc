//! The `fleetgate` commands, apart from the data path: `serve` (run the gateway), `demo` (a
//! simulated fleet and the gateway in front of it), `certs` (the gateway's own CAs) and
//! `kubeconfig` (one-pass kubeconfigs), and `logging` (the flags and format of every command's
//! log, and how a failed command reports its error). Each parses its arguments with clap and calls
//! the library; none touches a request. The `agent` command is the pull-mode agent program's own
//! folder (`agent/`: its flags and `run`), which main.rs calls directly.

pub mod certs;
pub mod demo;
pub mod kubeconfig;
pub mod logging;
pub mod serve;
pub mod signals;
