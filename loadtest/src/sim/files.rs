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
use crate::sim::pki::{CertAuthority, IssuedCert, OidcIssuer, PkiError};

/// The `iss` of the sim's OIDC tokens (never fetched: the gateway reads `pki/oidc-jwks.json`).
pub const OIDC_ISSUER: &str = "https://oidc.fleetgate.test";
/// The client id (`aud`) of the sim's OIDC tokens.
pub const OIDC_CLIENT_ID: &str = "fleetgate";
/// The prefix the gateway puts on OIDC user and group names (`oidc:alice`, `oidc:devs`).
pub const OIDC_PREFIX: &str = "oidc:";

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
    /// Signs the users' ID tokens (`users/NAME.jwt`).
    pub oidc: OidcIssuer,
    /// Another key with the same `kid`: signs `users/wrong-key.jwt`, which must be refused.
    pub oidc_impostor: OidcIssuer,
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
            oidc: OidcIssuer::generate(OIDC_ISSUER, OIDC_CLIENT_ID, "sim-1")?,
            oidc_impostor: OidcIssuer::generate(OIDC_ISSUER, OIDC_CLIENT_ID, "sim-1")?,
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

/// A kubeconfig with one context per server, all as `admin` (`client`), plus `more_users` entries
/// a person can pick with `kubectl --user NAME`.
fn kubeconfig(
    servers: &[(String, String)],
    ca_pem: &str,
    client: &IssuedCert,
    more_users: &[Value],
) -> Value {
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
        "users": std::iter::once(json!({"name": "admin", "user": {
            "client-certificate-data": b64(&client.cert_pem),
            "client-key-data": b64(&client.key_pem),
        }}))
        .chain(more_users.iter().cloned())
        .collect::<Vec<_>>(),
    })
}

/// `pki/` under the names `fleetgate certs init` writes, so that `fleetgate kubeconfig --certs-dir
/// DIR/pki` and `fleetgate certs issue --dir DIR/pki` take it as it is: `ca.crt` / `ca.key` (the
/// client CA) and `serving-ca.crt` (what clients trust) are the gateway CA, which signs both the
/// users' certificates and the gateway's serving certificate here (`gateway.crt` / `gateway.key`
/// already have their `certs init` names). Symbolic links, so the CA has one copy.
fn link_certs_init_names(pki: &Path) -> std::io::Result<()> {
    for (name, target) in [
        ("ca.crt", "gateway-ca.crt"),
        ("ca.key", "gateway-ca.key"),
        ("serving-ca.crt", "gateway-ca.crt"),
    ] {
        let link = pki.join(name);
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::os::unix::fs::symlink(target, &link)?;
    }
    Ok(())
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
    link_certs_init_names(&dir.join("pki"))?;

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
            &[],
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
                "connectMode": "Direct",
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
            // A test or demo gateway is stopped by a person or a test waiting on it: let open
            // exec sessions and watches go after 5 s instead of the 30 s default.
            "limits": {"shutdownGraceSeconds": 5},
            "auth": {
                "tokenFile": "users/tokens.csv",
                "oidc": {
                    "issuerURL": OIDC_ISSUER,
                    "clientID": OIDC_CLIENT_ID,
                    "jwksFile": "pki/oidc-jwks.json",
                    "usernamePrefix": OIDC_PREFIX,
                    "groupsClaim": "groups",
                    "groupsPrefix": OIDC_PREFIX,
                    "uidClaim": "uid",
                },
            },
        },
    });
    write(&dir.join("gateway.yaml"), &yaml(&gateway))?;
    write_policies(dir)?;
    // fleet.yaml: the kinds the fleet view (`/fleet`) merges, from every cluster.
    let fleet = json!({
        "apiVersion": "fleetgate.io/v1alpha1",
        "kind": "FleetResource",
        "metadata": {"name": "demo"},
        "spec": {"resourceSelectors": [
            {"apiVersion": "v1", "kind": "Pod"},
            {"apiVersion": "v1", "kind": "ConfigMap"},
            {"apiVersion": "apps/v1", "kind": "Deployment"},
            {"apiVersion": "v1", "kind": "Service"},
            {"apiVersion": "v1", "kind": "Namespace"},
            {"apiVersion": "v1", "kind": "Node"},
            {"apiVersion": "v1", "kind": "Event"},
        ]},
    });
    write(&dir.join("fleet.yaml"), &yaml(&fleet))?;

    // gateway.kubeconfig: through the gateway as admin (gateway-CA client certificate), one
    // context per member and `fleet` for the fleet view.
    let through_gateway: Vec<(String, String)> = member_names
        .iter()
        .map(|name| {
            (
                name.clone(),
                format!("https://{}/clusters/{name}", addrs.gateway),
            )
        })
        .chain(std::iter::once((
            "fleet".to_owned(),
            format!("https://{}/fleet", addrs.gateway),
        )))
        .collect();
    let gateway_admin = creds
        .users
        .iter()
        .find(|u| u.name == "admin")
        .map(|u| &u.gateway_cert)
        .unwrap_or(&creds.gateway_serving);
    // The test users too, by bearer token (`kubectl --user alice`) and OIDC ID token
    // (`--user alice-oidc`); token files are relative to the kubeconfig's directory, DIR.
    let token_users: Vec<Value> = creds
        .users
        .iter()
        .filter(|u| u.name != "admin")
        .flat_map(|u| {
            [
                json!({"name": u.name, "user": {"tokenFile": format!("users/{}.token", u.name)}}),
                json!({"name": format!("{}-oidc", u.name),
                       "user": {"tokenFile": format!("users/{}.jwt", u.name)}}),
            ]
        })
        .collect();
    write_secret(
        &dir.join("gateway.kubeconfig"),
        &yaml(&kubeconfig(
            &through_gateway,
            &creds.gateway_ca.cert_pem,
            gateway_admin,
            &token_users,
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
    write_oidc_files(dir, creds)?;
    Ok(())
}

/// `pki/oidc-jwks.json`, `pki/oidc-signing.key`, `users/NAME.jwt` (valid 24 h), and two tokens
/// for alice that must be refused: `users/expired.jwt` and `users/wrong-key.jwt`.
fn write_oidc_files(dir: &Path, creds: &FleetCredentials) -> std::io::Result<()> {
    let failed = |e: String| std::io::Error::other(e);
    write(
        &dir.join("pki/oidc-jwks.json"),
        &creds.oidc.jwks().to_string(),
    )?;
    write_secret(&dir.join("pki/oidc-signing.key"), &creds.oidc.key_pem)?;
    let now = chrono::Utc::now().timestamp();
    let claims = |user: &TestUser, expires: i64| {
        json!({
            "sub": user.name,
            "uid": user.uid,
            "groups": user.group.into_iter().collect::<Vec<_>>(),
            "iat": now,
            "nbf": now - 60,
            "exp": expires,
        })
    };
    for user in &creds.users {
        let token = creds
            .oidc
            .mint(claims(user, now + 24 * 3600))
            .map_err(failed)?;
        write_secret(&dir.join(format!("users/{}.jwt", user.name)), &token)?;
    }
    if let Some(alice) = creds.users.iter().find(|u| u.name == "alice") {
        let expired = creds.oidc.mint(claims(alice, now - 3600)).map_err(failed)?;
        write_secret(&dir.join("users/expired.jwt"), &expired)?;
        let forged = creds
            .oidc_impostor
            .mint(claims(alice, now + 24 * 3600))
            .map_err(failed)?;
        write_secret(&dir.join("users/wrong-key.jwt"), &forged)?;
    }
    Ok(())
}

/// `policies.yaml`: the AccessPolicy objects of docs/simulated-fleet.md. `admin` (group
/// system:masters, which gateway.kubeconfig's user is in) may do everything everywhere.
fn write_policies(dir: &Path) -> std::io::Result<()> {
    // Each subject by its name and by the name an OIDC token of the same user or group gives.
    let subjects = |kind: &str, names: &[&str]| -> Vec<Value> {
        names
            .iter()
            .flat_map(|n| [n.to_string(), format!("{OIDC_PREFIX}{n}")])
            .map(|n| json!({"kind": kind, "name": n}))
            .collect()
    };
    let policy = |name: &str, subjects: Vec<Value>, clusters: Value, rules: Value| {
        json!({
            "apiVersion": "fleetgate.io/v1alpha1",
            "kind": "AccessPolicy",
            "metadata": {"name": name},
            "spec": {"subjects": subjects, "clusters": clusters, "rules": rules},
        })
    };
    let policies = [
        policy(
            "admin",
            vec![json!({"kind": "Group", "name": MASTERS_GROUP})],
            json!({"names": ["*"]}),
            json!([{"verbs": ["*"]}, {"verbs": ["*"], "nonResourceURLs": ["*"]}]),
        ),
        policy(
            "devs-read-dev",
            subjects("Group", &["devs"]),
            json!({"selector": {"matchLabels": {"env": "dev"}}}),
            json!([{"verbs": ["get", "list", "watch"]}]),
        ),
        policy(
            "bob-default-member1",
            subjects("User", &["bob"]),
            json!({"names": ["member1"]}),
            json!([{
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                "namespaces": ["default"],
            }]),
        ),
        policy(
            "ops-everything-and-impersonate-alice",
            subjects("Group", &["ops"]),
            json!({"names": ["*"]}),
            json!([
                {"verbs": ["get", "list", "watch", "create", "update", "patch", "delete",
                           "deletecollection", "exec", "attach", "portforward", "proxy"]},
                {"verbs": ["impersonate"], "resources": ["users"], "resourceNames": ["alice"]},
                {"verbs": ["impersonate"], "resources": ["groups"], "resourceNames": ["devs"]},
                {"verbs": ["impersonate"], "resources": ["uids"], "resourceNames": ["alice-uid"]},
                {"verbs": ["impersonate"], "resources": ["userextras/team"],
                 "resourceNames": ["blue"]},
            ]),
        ),
    ];
    let text = policies.iter().map(yaml).collect::<Vec<_>>().join("---\n");
    write(&dir.join("policies.yaml"), &text)
}
