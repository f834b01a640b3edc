//! fleetgate-loadtest: the simulated fleet and the load driver.
//!
//! The simulated fleet (`sim`) is a set of Kubernetes-API-compatible member clusters that kubectl,
//! kube-rs and the Python client accept as real. It is built on hyper + tokio + rustls and shares no
//! HTTP code with the gateway, so each implementation checks the other. This crate never imports the
//! gateway; only the gateway's `demo` command starts the fleet (through [`sim::start_fleet`]).

pub mod run;
pub mod sim;
