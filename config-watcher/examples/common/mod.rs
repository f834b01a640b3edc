//! What the table examples (`table_build`, `table-memory`) share: the gateway file they load and
//! a cluster shaped as the simulated fleet writes one, and a fresh CA for it.

use fleetgate_config_watcher::{ClusterConfig, ConnectMode};

/// The smallest gateway file: one plaintext listener.
pub const GATEWAY: &str = "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  listeners:\n  - address: 127.0.0.1:0\n    tls: false\n";

/// A fresh self-signed CA certificate, PEM.
pub fn ca_pem() -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem().into_bytes()
}

/// Cluster `member{i}` as the simulated fleet writes one: https at 10.x.y.z:6443, the CA, the
/// token, one label (`env=dev`), impersonation, read from `origin`.
pub fn cluster(i: usize, ca: Vec<u8>, token: String, origin: String) -> ClusterConfig {
    ClusterConfig {
        name: format!("member{i}"),
        labels: [("env".to_owned(), "dev".to_owned())].into(),
        origin,
        server: format!(
            "https://10.{}.{}.{}:6443",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        ),
        ca_pem: Some(ca),
        insecure_skip_tls_verify: false,
        token: Some(token),
        client_cert_pem: None,
        client_key_pem: None,
        impersonation: true,
        pass_through: false,
        mode: ConnectMode::Direct,
        proxy_url: None,
        proxy_headers: Default::default(),
        tunnel_address: None,
    }
}
