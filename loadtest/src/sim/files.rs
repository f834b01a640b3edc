//! The fleet's credentials (CAs, certificates, tokens of the test users) and the files the
//! command-line contract promises under `DIR` (docs/configuration.md, "Files written by the
//! simulated fleet"): `kubeconfig`, `clusters/memberK.yaml`, `gateway.yaml`, `gateway.kubeconfig`,
//! `users/`, `pki/`.
//!
//! Generates and writes; never serves. Called once by `sim::start_fleet`.

use std::net::SocketAddr;
use std::path::Path;

use base64::Engine;
use serde_json::{json, Value};

use crate::sim::auth::{UserInfo, MASTERS_GROUP};
use crate::sim::pki::{CertAuthority, IssuedCert, PkiError};

/// A test user: name, uid, group, token (valid at every member), and a client certificate signed
/// by the gateway's client CA (for going through the gateway).
pub struct TestUser {
    pub name: &'static str,
    pub uid: String,
    pub group: Option<&'static str>,
    pub token: String,
    pub gateway_cert: IssuedCert,
}

impl TestUser {
    pub fn user_info(&self) -> UserInfo {
        let groups: Vec<&str> = self.group.into_iter().collect();
        UserInfo::new(self.name, &self.uid, &groups)
    }
}

/// Every secret of one fleet, generated at start.
pub struct FleetCredentials {
    pub fleet_ca: CertAuthority,
    pub gateway_ca: CertAuthority,
    /// Serving certificate of every member (127.0.0.1, localhost).
    pub member_serving: IssuedCert,
    /// `admin` (system:masters) client certificate for the members, signed by the fleet CA.
    pub member_admin: IssuedCert,
    pub gateway_serving: IssuedCert,
    /// The token of `fleetgate-gateway`, which may impersonate at the members.
    pub gateway_token: String,
    pub users: Vec<TestUser>,
}

fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

impl FleetCredentials {
    pub fn generate() -> Result<Self, PkiError> {
        let fleet_ca = CertAuthority::generate("fleetgate-sim-fleet-ca")?;
        let gateway_ca = CertAuthority::generate("fleetgate-sim-gateway-ca")?;
        let member_serving = fleet_ca.issue_server(&["127.0.0.1", "localhost", "::1"])?;
        let member_admin = fleet_ca.issue_client("admin", Some(MASTERS_GROUP))?;
        let gateway_serving = gateway_ca.issue_server(&["127.0.0.1", "localhost", "::1"])?;
        let mut users = Vec::new();
        for (name, group) in [
            ("admin", Some(MASTERS_GROUP)),
            ("alice", Some("devs")),
            ("bob", None),
            ("carol", Some("ops")),
        ] {
            users.push(TestUser {
                name,
                uid: format!("{name}-uid"),
                group,
                token: random_token(),
                gateway_cert: gateway_ca.issue_client(name, group)?,
            });
        }
        Ok(Self {
            fleet_ca,
            gateway_ca,
            member_serving,
            member_admin,
            gateway_serving,
            gateway_token: random_token(),
            users,
        })
    }
}

/// Where everything listens.
pub struct FleetAddresses<'a> {
    pub members: &'a [SocketAddr],
    pub gateway: &'a str,
    pub gateway_admin: &'a str,
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

fn write(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents)
}

fn write_secret(path: &Path, contents: &str) -> std::io::Result<()> {
    write(path, contents)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn yaml(value: &Value) -> String {
    serde_yaml::to_string(value).unwrap_or_default()
}

fn kubeconfig(servers: &[(String, String)], ca_pem: &str, client: &IssuedCert) -> Value {
    let clusters: Vec<Value> = servers
        .iter()
        .map(|(name, server)| {
            json!({"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}})
        })
        .collect();
    let contexts: Vec<Value> = servers
        .iter()
        .map(|(name, _)| json!({"name": name, "context": {"cluster": name, "user": "admin"}}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": servers.first().map(|(n, _)| n.clone()).unwrap_or_default(),
        "preferences": {},
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64(&client.cert_pem),
            "client-key-data": b64(&client.key_pem),
        }}],
    })
}

/// Writes every file of the contract under `dir`.
pub fn write_fleet_files(
    dir: &Path,
    creds: &FleetCredentials,
    addrs: &FleetAddresses<'_>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // pki/
    write(&dir.join("pki/fleet-ca.crt"), &creds.fleet_ca.cert_pem)?;
    write_secret(&dir.join("pki/fleet-ca.key"), &creds.fleet_ca.key_pem)?;
    write(&dir.join("pki/gateway-ca.crt"), &creds.gateway_ca.cert_pem)?;
    write_secret(&dir.join("pki/gateway-ca.key"), &creds.gateway_ca.key_pem)?;
    write(
        &dir.join("pki/gateway.crt"),
        &creds.gateway_serving.cert_pem,
    )?;
    write_secret(&dir.join("pki/gateway.key"), &creds.gateway_serving.key_pem)?;
    write(
        &dir.join("pki/member-admin.crt"),
        &creds.member_admin.cert_pem,
    )?;
    write_secret(
        &dir.join("pki/member-admin.key"),
        &creds.member_admin.key_pem,
    )?;

    // kubeconfig: straight to the members as admin (fleet-CA client certificate).
    let member_names: Vec<String> = (1..=addrs.members.len())
        .map(|i| format!("member{i}"))
        .collect();
    let direct: Vec<(String, String)> = member_names
        .iter()
        .zip(addrs.members)
        .map(|(name, addr)| (name.clone(), format!("https://{addr}")))
        .collect();
    write_secret(
        &dir.join("kubeconfig"),
        &yaml(&kubeconfig(
            &direct,
            &creds.fleet_ca.cert_pem,
            &creds.member_admin,
        )),
    )?;

    // clusters/memberK.yaml
    for (i, (name, server)) in direct.iter().enumerate() {
        let cluster = json!({
            "apiVersion": "fleetgate.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name, "labels": {
                "fleetgate.io/simulated": "true",
                "env": if i % 2 == 0 { "dev" } else { "prod" },
            }},
            "spec": {
                "server": server,
                "caData": creds.fleet_ca.cert_pem,
                "credentials": {"token": creds.gateway_token},
                "impersonation": true,
                "mode": "Direct",
            },
        });
        write_secret(&dir.join(format!("clusters/{name}.yaml")), &yaml(&cluster))?;
    }

    // gateway.yaml (paths relative to DIR, the directory of the file).
    let gateway = json!({
        "apiVersion": "fleetgate.io/v1alpha1",
        "kind": "Gateway",
        "metadata": {"name": "fleetgate"},
        "spec": {
            "workers": 0,
            "listeners": [{"name": "https", "address": addrs.gateway, "tls": true}],
            "tls": {
                "certFile": "pki/gateway.crt",
                "keyFile": "pki/gateway.key",
                "clientCAFile": "pki/gateway-ca.crt",
            },
            "admin": {"address": addrs.gateway_admin},
        },
    });
    write(&dir.join("gateway.yaml"), &yaml(&gateway))?;

    // gateway.kubeconfig: through the gateway as admin (gateway-CA client certificate).
    let through_gateway: Vec<(String, String)> = member_names
        .iter()
        .map(|name| {
            (
                name.clone(),
                format!("https://{}/clusters/{name}", addrs.gateway),
            )
        })
        .collect();
    let gateway_admin = creds
        .users
        .iter()
        .find(|u| u.name == "admin")
        .map(|u| &u.gateway_cert)
        .unwrap_or(&creds.gateway_serving);
    write_secret(
        &dir.join("gateway.kubeconfig"),
        &yaml(&kubeconfig(
            &through_gateway,
            &creds.gateway_ca.cert_pem,
            gateway_admin,
        )),
    )?;

    // users/
    let mut csv = String::new();
    for user in &creds.users {
        write(
            &dir.join(format!("users/{}.crt", user.name)),
            &user.gateway_cert.cert_pem,
        )?;
        write_secret(
            &dir.join(format!("users/{}.key", user.name)),
            &user.gateway_cert.key_pem,
        )?;
        write_secret(&dir.join(format!("users/{}.token", user.name)), &user.token)?;
        csv.push_str(&format!(
            "{},{},{},\"{}\"\n",
            user.token,
            user.name,
            user.uid,
            user.group.unwrap_or("")
        ));
    }
    write_secret(&dir.join("users/tokens.csv"), &csv)?;
    Ok(())
}
