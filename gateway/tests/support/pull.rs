//! Pull mode in tests: a simulated member's Cluster file made `Tunnel` (its server and CA kept
//! for the agent) and agent certificates issued with `fleetgate certs issue-agent`. Used by the
//! tunnel and tunnel_services test binaries.

use std::net::SocketAddr;
use std::process::Command;

use super::fleet::{fleetgate_binary, Fleet};

/// Makes `name`'s Cluster file pull-mode (`connectMode: Tunnel`, no server, no CA) and returns
/// its server URL; its CA goes to `agents/NAME-kube-ca.crt`.
pub fn make_pull_mode(fleet: &Fleet, name: &str) -> String {
    let path = fleet.fleet_path(&format!("clusters/{name}.yaml"));
    let mut cluster: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let spec = cluster["spec"].as_mapping_mut().unwrap();
    let server = spec.remove("server").unwrap().as_str().unwrap().to_owned();
    let ca = spec.remove("caData").unwrap().as_str().unwrap().to_owned();
    spec.remove("mode");
    spec.insert("connectMode".into(), "Tunnel".into());
    std::fs::create_dir_all(fleet.fleet_path("agents")).unwrap();
    std::fs::write(fleet.fleet_path(&format!("agents/{name}-kube-ca.crt")), ca).unwrap();
    std::fs::write(&path, serde_yaml::to_string(&cluster).unwrap()).unwrap();
    server
}

pub fn issue_agent(fleet: &Fleet, cluster: &str) {
    let out = Command::new(fleetgate_binary())
        .args(["certs", "issue-agent", "--cluster", cluster, "--dir"])
        .arg(fleet.fleet_path("agents"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the fleet's gateway (two workers, `fleetgate=debug`) with a tunnel listener on
/// 127.0.0.1:0 for agents certified by `agents/agent-ca.crt`, and `extra` arguments; returns
/// the tunnel listener's address.
pub fn serve_with_tunnel(fleet: &mut Fleet, extra: &[&str]) -> SocketAddr {
    let agent_ca = fleet.fleet_path("agents/agent-ca.crt");
    let mut args = vec![
        "--workers",
        "2",
        "--tunnel-listen",
        "127.0.0.1:0",
        "--agent-ca",
        agent_ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    fleet.serve(&args, Some("fleetgate=debug"));
    fleet.ready().addr("tunnel")
}
