//! Prints fleetgate's CustomResourceDefinitions, generated from the Rust types:
//! `cargo run -p fleetgate-config-watcher --example crds > deploy/base/crds.yaml`.

fn main() {
    print!("{}", fleetgate_config_watcher::crd_manifests());
}
