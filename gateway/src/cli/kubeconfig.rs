//! `fleetgate kubeconfig`: one file that takes a user to every cluster they may reach through the
//! gateway, with nothing else to install (Karpor calls it a one-pass).
//!
//! Issues a client certificate for the user from the gateway's client CA (`certs`), asks the
//! access policy which clusters the user may reach, and writes a kubeconfig with one context per
//! cluster (server `URL/clusters/NAME`), a context `fleet` (server `URL/fleet`, the fleet view)
//! when the configuration merges any kind there, one user entry with the certificate and key
//! embedded, and the gateway's serving CA embedded, mode 0600. It refuses a `--cluster` the user may not reach
//! (a context that could only ever answer 403 is a trap). Called by the binary; never touches the
//! network and never prints key material.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use fleetgate_config_watcher::policy::CompiledPolicy;
use fleetgate_config_watcher::{load_path, Config};
use serde::Serialize;

use crate::cli::certs;

/// Arguments of `fleetgate kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// The gateway's URL as clients reach it (https://HOST:PORT); contexts get URL/clusters/NAME.
    #[arg(long)]
    pub server: String,
    /// The user name (the client certificate's CN).
    #[arg(long)]
    pub user: String,
    /// A group of the user (an O of the certificate); repeatable.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Only these clusters (repeatable; each must be reachable by the user). Default: every
    /// cluster the user may reach.
    #[arg(long = "cluster")]
    pub clusters: Vec<String>,
    /// Where the kubeconfig is written (mode 0600).
    #[arg(long)]
    pub out: PathBuf,
    /// The certs directory of `fleetgate certs init`: its client CA issues the certificate, its
    /// serving CA is what the kubeconfig trusts.
    #[arg(long)]
    pub certs_dir: PathBuf,
    /// The gateway's configuration (file or directory): the clusters and access policies.
    #[arg(long)]
    pub config: PathBuf,
    /// The CA the kubeconfig trusts for the gateway (default: CERTS_DIR/serving-ca.crt; absent
    /// both, the system's roots are used).
    #[arg(long)]
    pub server_ca: Option<PathBuf>,
    /// Validity of the embedded client certificate (s, m, h or d: 24h, 30d).
    #[arg(long, default_value = "24h", value_parser = certs::parse_ttl)]
    pub ttl: Duration,
}

/// The clusters `user` (with `groups`) may reach, sorted: the access policy's answer (any verb
/// on the cluster), compiled from the configuration exactly as `serve` compiles it. The one
/// place the kubeconfig asks the policy; a policy that does not compile is an error here, not an
/// empty kubeconfig.
pub fn reachable_clusters(
    config: &Config,
    user: &str,
    groups: &[String],
) -> anyhow::Result<Vec<String>> {
    let policy = CompiledPolicy::compile(config).context("compiling the access policies")?;
    Ok(policy.reachable_clusters(user, groups))
}

/// Which contexts the kubeconfig gets: the requested clusters (each must be reachable), or every
/// reachable one. Errors name the clusters the user may not reach.
pub fn choose_clusters(reachable: &[String], requested: &[String]) -> anyhow::Result<Vec<String>> {
    if requested.is_empty() {
        if reachable.is_empty() {
            bail!("the access policy lets this user reach no cluster");
        }
        return Ok(reachable.to_vec());
    }
    let unreachable: Vec<&str> = requested
        .iter()
        .filter(|c| !reachable.contains(c))
        .map(String::as_str)
        .collect();
    if !unreachable.is_empty() {
        bail!(
            "the user may not reach cluster(s) {} (reachable: {})",
            unreachable.join(", "),
            if reachable.is_empty() {
                "none".to_string()
            } else {
                reachable.join(", ")
            }
        );
    }
    let mut chosen: Vec<String> = Vec::with_capacity(requested.len());
    for c in requested {
        if !chosen.contains(c) {
            chosen.push(c.clone());
        }
    }
    Ok(chosen)
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    api_version: &'static str,
    kind: &'static str,
    clusters: Vec<NamedCluster>,
    contexts: Vec<NamedContext>,
    users: Vec<NamedUser>,
    current_context: String,
    preferences: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize)]
struct NamedCluster {
    name: String,
    cluster: ClusterEntry,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_authority_data: Option<String>,
}

#[derive(Serialize)]
struct NamedContext {
    name: String,
    context: ContextEntry,
}

#[derive(Serialize)]
struct ContextEntry {
    cluster: String,
    user: String,
}

#[derive(Serialize)]
struct NamedUser {
    name: String,
    user: UserEntry,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    client_certificate_data: String,
    client_key_data: String,
}

/// The context (and cluster entry) of the fleet view; no member can be named so
/// (`fleetgate_config_watcher` reserves it), so it never hides a member's context.
pub const FLEET_CONTEXT: &str = "fleet";

/// The kubeconfig text for `clusters` (contexts named after them) through the gateway at
/// `server`, as one user with the given certificate and key PEM; with `fleet`, also the context
/// `fleet` for the fleet view (`URL/fleet`), after the members'.
pub fn render(
    server: &str,
    clusters: &[String],
    fleet: bool,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
    server_ca_pem: Option<&str>,
) -> anyhow::Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let base = server.trim_end_matches('/');
    let ca = server_ca_pem.map(b64);
    // (context name, server path under the gateway)
    let entries: Vec<(String, String)> = clusters
        .iter()
        .map(|name| (name.clone(), format!("clusters/{name}")))
        .chain(fleet.then(|| (FLEET_CONTEXT.to_owned(), FLEET_CONTEXT.to_owned())))
        .collect();
    let config = Kubeconfig {
        api_version: "v1",
        kind: "Config",
        clusters: entries
            .iter()
            .map(|(name, path)| NamedCluster {
                name: name.clone(),
                cluster: ClusterEntry {
                    server: format!("{base}/{path}"),
                    certificate_authority_data: ca.clone(),
                },
            })
            .collect(),
        contexts: entries
            .iter()
            .map(|(name, _)| NamedContext {
                name: name.clone(),
                context: ContextEntry {
                    cluster: name.clone(),
                    user: user.to_string(),
                },
            })
            .collect(),
        users: vec![NamedUser {
            name: user.to_string(),
            user: UserEntry {
                client_certificate_data: b64(cert_pem),
                client_key_data: b64(key_pem),
            },
        }],
        current_context: clusters.first().cloned().unwrap_or_default(),
        preferences: serde_json::Map::new(),
    };
    Ok(serde_yaml::to_string(&config)?)
}

fn check_server_url(server: &str) -> anyhow::Result<()> {
    let rest = server
        .strip_prefix("https://")
        .with_context(|| format!("--server {server:?} must be an https:// URL"))?;
    if rest.trim_end_matches('/').is_empty() || rest.contains(['?', '#']) {
        bail!("--server {server:?} must be https://HOST[:PORT][/PREFIX]");
    }
    Ok(())
}

fn read_server_ca(args: &KubeconfigArgs) -> anyhow::Result<Option<String>> {
    let (path, required): (&Path, bool) = match &args.server_ca {
        Some(path) => (path, true),
        None => (&args.certs_dir, false),
    };
    let path = if required {
        path.to_path_buf()
    } else {
        path.join(certs::SERVING_CA_CERT)
    };
    match std::fs::read_to_string(&path) {
        Ok(pem) => Ok(Some(pem)),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading the server CA {}", path.display())),
    }
}

/// The `kubeconfig` command.
pub fn run(args: KubeconfigArgs) -> anyhow::Result<()> {
    check_server_url(&args.server)?;
    let config = load_path(&args.config)
        .with_context(|| format!("loading the configuration from {}", args.config.display()))?;
    let reachable = reachable_clusters(&config, &args.user, &args.groups)?;
    let clusters = choose_clusters(&reachable, &args.clusters)?;
    let server_ca = read_server_ca(&args)?;
    let issuer = certs::load_issuer(
        &args.certs_dir.join(certs::CLIENT_CA_CERT),
        &args.certs_dir.join(certs::CLIENT_CA_KEY),
    )?;
    let cert = certs::issue_client(&issuer, &args.user, &args.groups, args.ttl)?;
    // A `fleet` context only where the fleet view merges something: otherwise every request
    // there would be a 404.
    let fleet = !config.fleet.is_empty();
    let text = render(
        &args.server,
        &clusters,
        fleet,
        &args.user,
        &cert.cert_pem,
        &cert.key_pem,
        server_ca.as_deref(),
    )?;
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    certs::write_private(&args.out, text.as_bytes())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "wrote {} (0600): user {}{}, contexts {}{} (current {}), certificate valid until {}{}",
        args.out.display(),
        args.user,
        if args.groups.is_empty() {
            String::new()
        } else {
            format!(" groups {}", args.groups.join(","))
        },
        clusters.join(", "),
        if fleet { ", fleet" } else { "" },
        clusters[0],
        certs::format_time(cert.not_after),
        if server_ca.is_none() {
            "; no server CA embedded (system roots)"
        } else {
            ""
        }
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn requested_clusters_must_be_reachable() {
        let reachable = names(&["member1", "member2"]);
        assert_eq!(
            choose_clusters(&reachable, &[]).unwrap(),
            names(&["member1", "member2"])
        );
        assert_eq!(
            choose_clusters(&reachable, &names(&["member2", "member2"])).unwrap(),
            names(&["member2"])
        );
        let err = choose_clusters(&reachable, &names(&["member2", "member3"])).unwrap_err();
        assert!(err.to_string().contains("member3"), "{err}");
        assert!(!err.to_string().contains("cluster(s) member2"), "{err}");
        assert!(choose_clusters(&[], &[]).is_err());
    }

    #[test]
    fn rendered_kubeconfig_has_one_context_per_cluster() {
        let text = render(
            "https://127.0.0.1:8443/",
            &names(&["b", "a"]),
            false,
            "alice",
            "CERT",
            "KEY",
            Some("CA"),
        )
        .unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(doc["current-context"], "b");
        assert_eq!(doc["contexts"].as_sequence().unwrap().len(), 2);
        assert_eq!(
            doc["clusters"][1]["cluster"]["server"],
            "https://127.0.0.1:8443/clusters/a"
        );
        assert_eq!(
            doc["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(doc["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(doc["contexts"][0]["context"]["user"], "alice");
        let with_fleet = render(
            "https://127.0.0.1:8443",
            &names(&["a"]),
            true,
            "alice",
            "CERT",
            "KEY",
            None,
        )
        .unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&with_fleet).unwrap();
        assert_eq!(doc["current-context"], "a");
        assert_eq!(doc["contexts"][1]["name"], "fleet");
        assert_eq!(
            doc["clusters"][1]["cluster"]["server"],
            "https://127.0.0.1:8443/fleet"
        );
    }

    #[test]
    fn server_must_be_https() {
        assert!(check_server_url("https://gw.example:8443").is_ok());
        assert!(check_server_url("http://gw.example").is_err());
        assert!(check_server_url("https://").is_err());
    }
}
