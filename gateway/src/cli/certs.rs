//! `fleetgate certs`: the gateway's own small PKI, so a fleet needs no outside CA to start.
//!
//! `certs init` writes a client CA (the Gateway's `spec.tls.clientCAFile`: it signs the
//! certificates users authenticate with, CN = user, O = groups, as Kubernetes reads them) and,
//! unless told otherwise, a serving CA with a serving certificate for the gateway. `certs issue`
//! signs a client certificate with that CA. `certs issue-agent` signs a pull-mode agent's
//! certificate (CN = its cluster) with a separate agent CA. Keys are written 0600 and never printed; existing keys
//! are never overwritten without `--force`, because replacing the client CA silently invalidates
//! every certificate it issued. Called by the binary (`main.rs`) and by `kubeconfig`, which issues
//! the certificate it embeds. Never touches the network.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

/// The client CA's certificate and key in a certs directory.
pub const CLIENT_CA_CERT: &str = "ca.crt";
pub const CLIENT_CA_KEY: &str = "ca.key";
/// The agent CA: it signs pull-mode agents' certificates only (`serve --agent-ca`), apart from
/// the client CA, so no user certificate can ever claim a cluster's tunnel.
pub const AGENT_CA_CERT: &str = "agent-ca.crt";
pub const AGENT_CA_KEY: &str = "agent-ca.key";
/// The serving CA (what clients trust for the gateway's own certificate).
pub const SERVING_CA_CERT: &str = "serving-ca.crt";
pub const SERVING_CA_KEY: &str = "serving-ca.key";
/// The gateway's serving certificate and key (the Gateway's `spec.tls.certFile` / `keyFile`).
pub const SERVING_CERT: &str = "gateway.crt";
pub const SERVING_KEY: &str = "gateway.key";

/// How long a CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long the gateway's serving certificate is valid.
const SERVING_VALIDITY: Duration = Duration::from_secs(2 * 365 * 24 * 3600);
/// Certificates start this far in the past, so a client whose clock is a little behind the
/// issuer's does not reject a certificate issued a second ago.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Arguments of `fleetgate certs`.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    pub command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum CertsCommand {
    /// Create the gateway's client CA and (unless --no-serving) its serving certificate.
    Init(InitArgs),
    /// Issue a client certificate (CN = user, O = each group) signed by the client CA.
    Issue(IssueArgs),
    /// Issue a pull-mode agent's certificate (CN = cluster, O = fleetgate:agents) signed by the
    /// agent CA (agent-ca.crt / agent-ca.key, created on first use).
    IssueAgent(IssueAgentArgs),
}

/// Arguments of `fleetgate certs issue-agent`.
#[derive(Debug, clap::Args)]
pub struct IssueAgentArgs {
    /// The certs directory: its agent-ca.crt and agent-ca.key sign (written if missing; default: the
    /// current directory).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The cluster the agent serves (the certificate's CN).
    #[arg(long)]
    pub cluster: String,
    /// Validity: a number with a unit s, m, h or d (24h, 30d).
    #[arg(long, default_value = "30d", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Where agent-CLUSTER.crt and agent-CLUSTER.key go (default: --dir).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Replace an existing agent-CLUSTER.key.
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `fleetgate certs init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Where the CA and certificates are written (created if missing; default: the
    /// current directory).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// A subject alternative name of the serving certificate (DNS name or IP); repeatable.
    /// Default: 127.0.0.1, localhost and ::1.
    #[arg(long = "san")]
    pub sans: Vec<String>,
    /// Only the client CA: the gateway's serving certificate comes from elsewhere.
    #[arg(long)]
    pub no_serving: bool,
    /// Replace existing keys (every certificate the old client CA issued stops working).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `fleetgate certs issue`.
#[derive(Debug, clap::Args)]
pub struct IssueArgs {
    /// The certs directory written by `certs init` (its ca.crt and ca.key sign; default: the
    /// current directory).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The user name (the certificate's CN).
    #[arg(long)]
    pub user: String,
    /// A group (an O of the certificate); repeatable.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Validity: a number with a unit s, m, h or d (24h, 30d).
    #[arg(long, default_value = "24h", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Where USER.crt and USER.key go (default: --dir).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Replace an existing USER.key.
    #[arg(long)]
    pub force: bool,
}

/// Why a certificate could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("{} exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),
    #[error("reading {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

fn generate_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> CertsError {
    let what = what.into();
    move |source| CertsError::Generate { what, source }
}

/// Parses a validity such as `90s`, `30m`, `24h` or `30d`.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (use s, m, h or d, e.g. 24h)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds_per_unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use s, m, h or d)"
            ))
        }
    };
    match number.checked_mul(seconds_per_unit) {
        Some(0) => Err("the validity must be longer than zero".to_string()),
        // Beyond ~100 years is a typo, and far beyond it overflows the certificate's dates.
        Some(s) if s <= 100 * 365 * 86_400 => Ok(Duration::from_secs(s)),
        _ => Err(format!("{text:?} is too long")),
    }
}

/// A certificate and key in PEM, ready to be written or embedded.
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: time::OffsetDateTime,
}

impl std::fmt::Debug for IssuedCert {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Validity from a little before now to `ttl` after now.
fn set_validity(params: &mut CertificateParams, ttl: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + ttl;
}

/// A random serial, so two certificates of one CA never share one (rcgen would derive it from
/// the key otherwise, which is unique too, but a random serial is what CAs do).
fn random_serial() -> SerialNumber {
    let mut bytes = *uuid::Uuid::new_v4().as_bytes();
    // Positive as a DER INTEGER.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn ca_params(common_name: &str) -> Result<CertificateParams, CertsError> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(generate_err(common_name))?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "fleetgate");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial());
    set_validity(&mut params, CA_VALIDITY);
    Ok(params)
}

/// A new self-signed CA (ECDSA P-256): its PEM and the issuer that signs with it.
fn new_ca(common_name: &str) -> Result<(IssuedCert, Issuer<'static, KeyPair>), CertsError> {
    let key = KeyPair::generate().map_err(generate_err(common_name))?;
    let params = ca_params(common_name)?;
    let not_after = params.not_after;
    let cert = params
        .self_signed(&key)
        .map_err(generate_err(common_name))?;
    let pem = IssuedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    };
    Ok((pem, Issuer::new(params, key)))
}

/// Loads the CA `certs init` wrote (certificate and key PEM files) as an issuer.
pub fn load_issuer(cert: &Path, key: &Path) -> Result<Issuer<'static, KeyPair>, CertsError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| CertsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let key = KeyPair::from_pem(&key_pem).map_err(generate_err(format!(
        "reading the CA key {}",
        key.display()
    )))?;
    Issuer::from_ca_cert_pem(&cert_pem, key).map_err(generate_err(format!(
        "reading the CA certificate {}",
        cert.display()
    )))
}

/// Signs a client certificate: CN = `user`, one O per group, client-auth only.
pub fn issue_client(
    issuer: &Issuer<'_, KeyPair>,
    user: &str,
    groups: &[String],
    ttl: Duration,
) -> Result<IssuedCert, CertsError> {
    if user.is_empty() {
        return Err(CertsError::Invalid {
            what: "user",
            reason: "the user name must not be empty".into(),
        });
    }
    if let Some(group) = groups.iter().find(|g| g.is_empty()) {
        return Err(CertsError::Invalid {
            what: "group",
            reason: format!("{group:?}: a group name must not be empty"),
        });
    }
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate_err(user))?;
    // rcgen keeps one value per attribute type, so the subject with every group is written
    // below; this one only holds its place.
    params.distinguished_name.push(DnType::CommonName, user);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(random_serial());
    set_validity(&mut params, ttl);
    let not_after = params.not_after;
    let key = KeyPair::generate().map_err(generate_err(user))?;
    let cert = params.signed_by(&key, issuer).map_err(generate_err(user))?;
    let der = with_subject(cert.der(), &client_subject(user, groups), issuer.key())?;
    Ok(IssuedCert {
        cert_pem: pem_certificate(&der),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// `certs issue-agent`: an agent certificate for `--cluster`, signed by the directory's agent CA,
/// which is created (0600 key) when the directory has none yet.
pub fn issue_agent(args: &IssueAgentArgs) -> Result<Written, CertsError> {
    let cluster = &args.cluster;
    if !crate::tunnel::wire::is_cluster_name(cluster) {
        return Err(CertsError::Invalid {
            what: "--cluster",
            reason: format!("{cluster:?} is not a cluster name"),
        });
    }
    let out_dir = args.out_dir.as_deref().unwrap_or(&args.dir);
    let cert_path = out_dir.join(format!("agent-{cluster}.crt"));
    let key_path = out_dir.join(format!("agent-{cluster}.key"));
    if !args.force && key_path.exists() {
        return Err(CertsError::Exists(key_path));
    }
    let mut written = Written::default();
    create_dir(&args.dir)?;
    let ca_cert = args.dir.join(AGENT_CA_CERT);
    let ca_key = args.dir.join(AGENT_CA_KEY);
    let issuer = if ca_cert.exists() {
        load_issuer(&ca_cert, &ca_key)?
    } else {
        let (ca, issuer) = new_ca("fleetgate-agent-ca")?;
        write_public(&ca_cert, &ca.cert_pem)?;
        written.file(
            &ca_cert,
            "agent CA certificate: `fleetgate serve --agent-ca`",
        );
        write_private(&ca_key, ca.key_pem.as_bytes())?;
        written.file(&ca_key, "agent CA key, 0600");
        issuer
    };
    let groups = [crate::tunnel::wire::AGENT_ORGANIZATION.to_string()];
    let cert = issue_client(&issuer, cluster, &groups, args.ttl)?;
    create_dir(out_dir)?;
    write_public(&cert_path, &cert.cert_pem)?;
    written.file(
        &cert_path,
        &format!(
            "agent certificate for cluster {cluster}, valid until {}",
            format_time(cert.not_after)
        ),
    );
    write_private(&key_path, cert.key_pem.as_bytes())?;
    written.file(&key_path, "agent key, 0600");
    Ok(written)
}

/// The subject Kubernetes reads a client certificate's identity from: CN = user, one O per group.
fn client_subject(user: &str, groups: &[String]) -> Vec<u8> {
    const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
    const ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];
    let attribute = |oid: &[u8], value: &str| {
        let mut pair = der_tlv(0x06, oid);
        pair.extend(der_tlv(0x0c, value.as_bytes())); // UTF8String
        der_tlv(0x31, &der_tlv(0x30, &pair)) // SET { SEQUENCE { type, value } }
    };
    let mut rdns = attribute(&COMMON_NAME, user);
    for group in groups {
        rdns.extend(attribute(&ORGANIZATION, group));
    }
    der_tlv(0x30, &rdns)
}

/// Replaces the subject of a certificate rcgen signed and signs it again with the same key.
///
/// rcgen's `DistinguishedName` holds one value per attribute type, but Kubernetes maps each O
/// of a client certificate to a group, so a user in two groups needs two O attributes. The
/// TBSCertificate is re-encoded with the new subject (everything else byte for byte) and signed
/// with the issuer's key and the certificate's own signature algorithm.
fn with_subject(
    cert: &[u8],
    subject: &[u8],
    signer: &impl rcgen::SigningKey,
) -> Result<Vec<u8>, CertsError> {
    let malformed = || CertsError::Invalid {
        what: "certificate",
        reason: "rcgen produced a certificate this code cannot re-encode".into(),
    };
    let (tag, outer, _) = der_read(cert).ok_or_else(malformed)?;
    if tag != 0x30 {
        return Err(malformed());
    }
    let (tbs_tag, tbs, after_tbs) = der_read(outer).ok_or_else(malformed)?;
    let (_, _, after_algorithm) = der_read(after_tbs).ok_or_else(malformed)?;
    let algorithm = &after_tbs[..after_tbs.len() - after_algorithm.len()];
    if tbs_tag != 0x30 {
        return Err(malformed());
    }
    // version [0], serialNumber, signature, issuer, validity, then the subject.
    let mut rest = tbs;
    for _ in 0..5 {
        rest = der_read(rest).ok_or_else(malformed)?.2;
    }
    let before_subject = &tbs[..tbs.len() - rest.len()];
    let (_, _, after_subject) = der_read(rest).ok_or_else(malformed)?;
    let mut new_tbs_content = before_subject.to_vec();
    new_tbs_content.extend_from_slice(subject);
    new_tbs_content.extend_from_slice(after_subject);
    let new_tbs = der_tlv(0x30, &new_tbs_content);
    let signature = signer
        .sign(&new_tbs)
        .map_err(generate_err("signing the client certificate"))?;
    let mut bits = Vec::with_capacity(signature.len() + 1);
    bits.push(0); // no unused bits
    bits.extend_from_slice(&signature);
    let mut content = new_tbs;
    content.extend_from_slice(algorithm);
    content.extend(der_tlv(0x03, &bits));
    Ok(der_tlv(0x30, &content))
}

/// One DER element: (tag, content, what follows). Single-byte tags and definite lengths only,
/// which is all a certificate uses.
fn der_read(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..count {
            len = (len << 8) | usize::from(*input.get(2 + i)?);
        }
        (len, 2 + count)
    };
    let end = header.checked_add(len)?;
    Some((tag, input.get(header..end)?, input.get(end..)?))
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

fn pem_certificate(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Signs the gateway's serving certificate for the given names and addresses.
fn issue_serving(issuer: &Issuer<'_, KeyPair>, sans: &[String]) -> Result<IssuedCert, CertsError> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(generate_err("serving"))?;
    for san in sans {
        let entry = match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                SanType::DnsName(san.as_str().try_into().map_err(|_| CertsError::Invalid {
                    what: "--san",
                    reason: format!("{san:?} is neither an IP address nor a DNS name"),
                })?)
            }
        };
        params.subject_alt_names.push(entry);
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "fleetgate");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(random_serial());
    set_validity(&mut params, SERVING_VALIDITY);
    let not_after = params.not_after;
    let key = KeyPair::generate().map_err(generate_err("serving"))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(generate_err("serving"))?;
    Ok(IssuedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// Writes a file readable by everyone (certificates).
fn write_public(path: &Path, contents: &str) -> Result<(), CertsError> {
    std::fs::write(path, contents).map_err(|source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a file only its owner may read (keys, kubeconfigs with embedded keys). The mode is
/// set at creation, so the key is never readable by others even for a moment; an existing file
/// is made 0600 before it is truncated.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), CertsError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)
}

fn create_dir(dir: &Path) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_path_buf(),
        source,
    })
}

/// What a command wrote, for the user: paths and subjects, never key material.
#[derive(Debug, Default)]
pub struct Written {
    pub lines: Vec<String>,
}

impl Written {
    fn file(&mut self, path: &Path, what: &str) {
        self.lines
            .push(format!("wrote {} ({what})", path.display()));
    }
}

/// `certs init`: the client CA and, unless `no_serving`, the serving CA and certificate.
pub fn init(args: &InitArgs) -> Result<Written, CertsError> {
    create_dir(&args.dir)?;
    let mut keys = vec![args.dir.join(CLIENT_CA_KEY)];
    if !args.no_serving {
        keys.push(args.dir.join(SERVING_CA_KEY));
        keys.push(args.dir.join(SERVING_KEY));
    }
    // Checked before anything is written, so a refused init leaves the directory as it was.
    if !args.force {
        if let Some(existing) = keys.iter().find(|k| k.exists()) {
            return Err(CertsError::Exists(existing.clone()));
        }
    }
    let mut written = Written::default();
    let (client_ca, _) = new_ca("fleetgate-client-ca")?;
    let path = args.dir.join(CLIENT_CA_CERT);
    write_public(&path, &client_ca.cert_pem)?;
    written.file(
        &path,
        "client CA certificate: the Gateway's spec.tls.clientCAFile",
    );
    let path = args.dir.join(CLIENT_CA_KEY);
    write_private(&path, client_ca.key_pem.as_bytes())?;
    written.file(&path, "client CA key, 0600");
    if args.no_serving {
        return Ok(written);
    }
    let sans = if args.sans.is_empty() {
        vec!["127.0.0.1".into(), "localhost".into(), "::1".into()]
    } else {
        args.sans.clone()
    };
    let (serving_ca, serving_issuer) = new_ca("fleetgate-serving-ca")?;
    let serving = issue_serving(&serving_issuer, &sans)?;
    let path = args.dir.join(SERVING_CA_CERT);
    write_public(&path, &serving_ca.cert_pem)?;
    written.file(&path, "serving CA certificate: what clients trust");
    let path = args.dir.join(SERVING_CA_KEY);
    write_private(&path, serving_ca.key_pem.as_bytes())?;
    written.file(&path, "serving CA key, 0600");
    let path = args.dir.join(SERVING_CERT);
    write_public(&path, &serving.cert_pem)?;
    written.file(
        &path,
        &format!(
            "serving certificate for {}: the Gateway's spec.tls.certFile",
            sans.join(", ")
        ),
    );
    let path = args.dir.join(SERVING_KEY);
    write_private(&path, serving.key_pem.as_bytes())?;
    written.file(&path, "serving key, 0600: the Gateway's spec.tls.keyFile");
    Ok(written)
}

/// `certs issue`: a client certificate signed by the directory's client CA.
pub fn issue(args: &IssueArgs) -> Result<Written, CertsError> {
    check_file_name_safe(&args.user)?;
    let out_dir = args.out_dir.as_deref().unwrap_or(&args.dir);
    let cert_path = out_dir.join(format!("{}.crt", args.user));
    let key_path = out_dir.join(format!("{}.key", args.user));
    if !args.force && key_path.exists() {
        return Err(CertsError::Exists(key_path));
    }
    let issuer = load_issuer(
        &args.dir.join(CLIENT_CA_CERT),
        &args.dir.join(CLIENT_CA_KEY),
    )?;
    let cert = issue_client(&issuer, &args.user, &args.groups, args.ttl)?;
    create_dir(out_dir)?;
    let mut written = Written::default();
    write_public(&cert_path, &cert.cert_pem)?;
    let groups = if args.groups.is_empty() {
        "no groups".to_string()
    } else {
        format!("groups {}", args.groups.join(", "))
    };
    written.file(
        &cert_path,
        &format!(
            "client certificate: user {}, {groups}, valid until {}",
            args.user,
            format_time(cert.not_after)
        ),
    );
    write_private(&key_path, cert.key_pem.as_bytes())?;
    written.file(&key_path, "client key, 0600");
    Ok(written)
}

/// A user name becomes a file name: refuse what would escape the output directory.
fn check_file_name_safe(user: &str) -> Result<(), CertsError> {
    if user.is_empty() || user.contains('/') || user == "." || user == ".." || user.contains('\0') {
        return Err(CertsError::Invalid {
            what: "--user",
            reason: format!(
                "{user:?} cannot be used as a file name (use --out-dir with a plain name)"
            ),
        });
    }
    Ok(())
}

/// RFC 3339 in UTC, to the second.
pub fn format_time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The `certs` command: runs the subcommand and prints what it wrote.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    let written = match &args.command {
        CertsCommand::Init(init_args) => init(init_args)?,
        CertsCommand::Issue(issue_args) => issue(issue_args)?,
        CertsCommand::IssueAgent(agent_args) => issue_agent(agent_args)?,
    };
    let mut stdout = std::io::stdout().lock();
    for line in written.lines {
        writeln!(stdout, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_units() {
        assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_ttl("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_ttl("24").is_err());
        assert!(parse_ttl("0h").is_err());
        assert!(parse_ttl("h").is_err());
        assert!(parse_ttl("3w").is_err());
        assert!(parse_ttl("99999999999999999d").is_err());
    }

    #[test]
    fn issued_client_cert_carries_user_groups_and_validity() {
        let (ca, issuer) = new_ca("test-ca").unwrap();
        let groups = vec!["devs".to_string(), "ops".to_string()];
        let cert = issue_client(&issuer, "alice", &groups, Duration::from_secs(3600)).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(cert.cert_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c)
            .unwrap();
        let identity = crate::auth::ClientIdentity::from_certificate(&der).unwrap();
        assert_eq!(identity.user, "alice");
        assert_eq!(identity.groups, groups);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let lifetime =
            parsed.validity().not_after.timestamp() - parsed.validity().not_before.timestamp();
        assert_eq!(lifetime, 3600 + CLOCK_SKEW.as_secs() as i64);
        // Signed by the CA.
        let ca_der = rustls_pki_types::pem::PemObject::from_pem_slice(ca.cert_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c)
            .unwrap();
        let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        parsed
            .verify_signature(Some(ca_parsed.public_key()))
            .unwrap();
    }

    #[test]
    fn init_refuses_to_overwrite_keys_and_writes_them_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let args = InitArgs {
            dir: dir.path().to_path_buf(),
            sans: vec![],
            no_serving: false,
            force: false,
        };
        init(&args).unwrap();
        let ca_before = std::fs::read(dir.path().join(CLIENT_CA_CERT)).unwrap();
        for key in [CLIENT_CA_KEY, SERVING_CA_KEY, SERVING_KEY] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
        let err = init(&args).unwrap_err();
        assert!(matches!(err, CertsError::Exists(_)), "{err}");
        assert_eq!(
            std::fs::read(dir.path().join(CLIENT_CA_CERT)).unwrap(),
            ca_before
        );
        init(&InitArgs {
            force: true,
            ..args
        })
        .unwrap();
        assert_ne!(
            std::fs::read(dir.path().join(CLIENT_CA_CERT)).unwrap(),
            ca_before
        );
    }

    #[test]
    fn issue_agent_names_the_cluster_with_its_own_ca() {
        let dir = tempfile::tempdir().unwrap();
        let args = |cluster: &str| IssueAgentArgs {
            dir: dir.path().to_path_buf(),
            cluster: cluster.into(),
            ttl: Duration::from_secs(3600),
            out_dir: None,
            force: false,
        };
        issue_agent(&args("member2")).unwrap();
        let pem = std::fs::read(dir.path().join("agent-member2.crt")).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(&pem)
            .map(|c: rustls_pki_types::CertificateDer<'static>| c)
            .unwrap();
        let identity = crate::auth::ClientIdentity::from_certificate(&der).unwrap();
        assert_eq!(identity.user, "member2");
        assert_eq!(identity.groups, vec!["fleetgate:agents".to_string()]);
        assert!(dir.path().join(AGENT_CA_CERT).exists());
        assert!(!dir.path().join(CLIENT_CA_CERT).exists());
        // A second cluster reuses the CA.
        let ca = std::fs::read(dir.path().join(AGENT_CA_CERT)).unwrap();
        issue_agent(&args("member3")).unwrap();
        assert_eq!(std::fs::read(dir.path().join(AGENT_CA_CERT)).unwrap(), ca);
        assert!(matches!(
            issue_agent(&args("../x")),
            Err(CertsError::Invalid { .. })
        ));
    }

    #[test]
    fn issue_uses_the_ca_init_wrote() {
        let dir = tempfile::tempdir().unwrap();
        init(&InitArgs {
            dir: dir.path().to_path_buf(),
            sans: vec![],
            no_serving: true,
            force: false,
        })
        .unwrap();
        let out = dir.path().join("users");
        let args = IssueArgs {
            dir: dir.path().to_path_buf(),
            user: "bob".into(),
            groups: vec!["ops".into()],
            ttl: Duration::from_secs(86_400),
            out_dir: Some(out.clone()),
            force: false,
        };
        let written = issue(&args).unwrap();
        assert!(written.lines.iter().all(|l| !l.contains("PRIVATE KEY")));
        assert!(out.join("bob.crt").exists());
        assert!(matches!(issue(&args), Err(CertsError::Exists(_))));
        let bad = IssueArgs {
            user: "../evil".into(),
            ..args
        };
        assert!(matches!(issue(&bad), Err(CertsError::Invalid { .. })));
    }
}
