//! The `fleetgate` commands, apart from the data path: `serve` (run the gateway), `agent` (a
//! pull-mode member's tunnels to the gateways), `demo` (a simulated fleet and the gateway in front
//! of it), `certs` (the gateway's own CAs) and `kubeconfig` (one-pass kubeconfigs), and `logging`
//! (the flags and format of every command's log, and how a failed command reports its error).
//! Each parses its arguments with clap and calls the library; none touches a request.

/// `agent`: the pull-mode agent program has its own folder (`crate::agent`); its flags and `run`
/// are the command.
pub use crate::agent;
pub mod certs;
pub mod demo;
pub mod kubeconfig;
pub mod logging;
pub mod serve;
pub mod signals;
