//! Rotation without restart, as an operator meets it: a real `fleetgate serve` on the simulated
//! fleet whose serving certificate, client CA and token file live in a directory laid out like a
//! mounted Secret (`tls.crt -> ..data/tls.crt`, `..data -> ..2026_...`) outside the config
//! directory, so only the config-watcher's content poll can see them change.
//!
//! Checked as a client sees it: the certificate a new TLS connection is served (its subject, read
//! with a rustls client) after the files are rewritten in place and after a symlink swap, while a
//! watch opened before keeps delivering events; a broken certificate keeps the old one and is
//! reported (log line naming the file, `fleetgate_reload_failures_total`); a client certificate of
//! a new CA admitted once the CA file changes; a new token accepted and a removed one refused with
//! 401; an agent certified by a new agent CA connecting once that file changes; the audit log
//! reopened at its path on SIGHUP; and OIDC keys fetched again, rate-limited, for an unknown `kid`.
//!
//! Waits are bounded polls of what a client observes (the rotation is a poll of a few seconds:
//! docs/configuration.md), never fixed sleeps standing in for a signal; every address is
//! 127.0.0.1:0.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use std::time::Duration;

use base64::Engine;
use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use support::fleet::{tls_config_as, Fleet};
use support::pull::{
    admin_get_at, agent_command, issue_agent, make_pull_mode, serve_with_tunnel, signal,
    without_ansi, Agent, AgentSetup,
};
use support::wait::wait_for_or;

/// How long a rotation may take to reach new connections: the config-watcher's poll (2 s) plus
/// the TLS reloader's (1 s), with room for a loaded machine.
const ROTATION: Duration = Duration::from_secs(20);

/// A directory laid out as the kubelet mounts a Secret: the files are symlinks through `..data`,
/// which a new version replaces by an atomic rename.
struct SecretMount {
    dir: PathBuf,
    versions: usize,
}

impl SecretMount {
    fn create(dir: PathBuf, files: &[(&str, &[u8])]) -> SecretMount {
        std::fs::create_dir_all(&dir).unwrap();
        let mut mount = SecretMount { dir, versions: 0 };
        mount.swap(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), mount.dir.join(name)).unwrap();
        }
        mount
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A new version of every file, in the kubelet's order: a new timestamped directory, a
    /// `..data_tmp` link to it, renamed over `..data`.
    fn swap(&mut self, files: &[(&str, &[u8])]) {
        self.versions += 1;
        let version = format!("..2026_11_27_13_00_{:02}.{}", self.versions, self.versions);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        for (name, content) in files {
            std::fs::write(self.dir.join(&version).join(name), content).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

/// The fleet's gateway CA (it signs the serving certificate clients trust).
fn gateway_ca(fleet: &Fleet) -> rcgen::Issuer<'static, KeyPair> {
    let read = |p: &str| std::fs::read_to_string(fleet.fleet_path(p)).unwrap();
    let key = KeyPair::from_pem(&read("pki/gateway-ca.key")).unwrap();
    rcgen::Issuer::from_ca_cert_pem(&read("pki/gateway-ca.crt"), key).unwrap()
}

/// A serving certificate for 127.0.0.1 named `cn`, signed by `ca`: (cert PEM, key PEM).
fn serving_cert(ca: &rcgen::Issuer<'_, KeyPair>, cn: &str) -> (String, String) {
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A CA of its own and a client certificate it signed for `user` in `system:masters` (whom the
/// fleet's policies allow everything): (CA PEM, cert PEM, key PEM).
fn new_client_ca(user: &str) -> (String, String, String) {
    let ca = support::test_ca("rotated-client-ca");
    let (cert, key) = support::client_cert(&ca, user, "system:masters");
    (ca.pem(), cert, key)
}

/// Points the Gateway's `spec.tls` (and `spec.auth.tokenFile`, when given) at absolute paths.
fn edit_gateway(fleet: &Fleet, edit: impl FnOnce(&mut serde_yaml::Value)) {
    fleet.edit_gateway(edit);
}

fn set(value: &mut serde_yaml::Value, keys: &[&str], to: &Path) {
    let mut at = value;
    for key in keys {
        at = &mut at[*key];
    }
    *at = serde_yaml::Value::String(to.to_str().unwrap().to_owned());
}

/// A TLS client trusting the fleet's gateway CA, with no client certificate.
fn anonymous_tls(fleet: &Fleet) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(fleet.fleet_path("pki/gateway-ca.crt")).unwrap();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A TLS client trusting the gateway CA and presenting `cert` / `key` (PEM).
fn tls_with_cert(fleet: &Fleet, cert: &str, key: &str) -> Arc<rustls::ClientConfig> {
    std::fs::write(fleet.fleet_path("users/rotated.crt"), cert).unwrap();
    std::fs::write(fleet.fleet_path("users/rotated.key"), key).unwrap();
    tls_config_as(
        fleet.dir(),
        "users/rotated.crt",
        "users/rotated.key",
        b"http/1.1",
    )
}

/// Opens a TLS connection; the connection, or the handshake's error.
fn connect(
    https: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let tcp = TcpStream::connect(https)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let conn = rustls::ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// The subject CN of the certificate a new TLS connection to `https` is served.
fn served_cn(fleet: &Fleet, https: SocketAddr) -> String {
    let tls = connect(https, anonymous_tls(fleet)).expect("TLS handshake");
    let der = tls.conn.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    cn
}

/// A GET of `path` with `headers` on a new connection with `config`; the status code, or the
/// connection's error (a refused handshake).
fn status_of(
    https: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    headers: &str,
) -> std::io::Result<u16> {
    let mut tls = connect(https, config)?;
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: gw\r\n{headers}Connection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    // A refused client certificate shows as an alert on the first read (TLS 1.3).
    tls.read_to_string(&mut answer)?;
    Ok(answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0))
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

#[test]
fn the_serving_certificate_rotates_for_new_connections_while_a_watch_stays_open() {
    let mut fleet = Fleet::sim_in("config", 1, 1);
    let ca = gateway_ca(&fleet);
    let (cert, key) = serving_cert(&ca, "rotation-a");
    let mut secret = SecretMount::create(
        fleet.path("secret"),
        &[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())],
    );
    edit_gateway(&fleet, |g| {
        set(g, &["spec", "tls", "certFile"], &secret.path("tls.crt"));
        set(g, &["spec", "tls", "keyFile"], &secret.path("tls.key"));
    });
    fleet.serve(&["--workers", "2"], None);
    let https = fleet.https();
    assert_eq!(served_cn(&fleet, https), "rotation-a");

    // A watch opened before any rotation, as `admin`.
    let mut watch = support::pull::admin_https(fleet.dir(), TcpStream::connect(https).unwrap());
    write!(
        watch,
        "GET /clusters/member1/api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: gw\r\nAccept: application/json\r\n\r\n"
    )
    .unwrap();
    let mut watched = Vec::new();
    let mut sees = |watch: &mut rustls::StreamOwned<_, _>, name: &str| {
        let needle = format!("\"name\":\"{name}\"");
        while !String::from_utf8_lossy(&watched).contains(&needle) {
            let mut chunk = [0u8; 4096];
            let n = Read::read(watch, &mut chunk).expect("the open watch keeps delivering");
            assert!(n > 0, "the open watch ended");
            watched.extend_from_slice(&chunk[..n]);
        }
    };
    let create = |name: &str| {
        // The fleet's files are in `config/`, its kubeconfig through the gateway too.
        let out = support::kubectl::kubectl(
            &fleet.fleet_path("gateway.kubeconfig"),
            "member1",
            &["create", "configmap", name, "-n", "default"],
        );
        support::kubectl::succeeded(out, name, &fleet.log_tail(20));
    };
    create("before-rotation");
    sees(&mut watch, "before-rotation");
    let served = |cn: &str| {
        wait_for_or(
            &format!("new connections served {cn}"),
            ROTATION,
            || served_cn(&fleet, https) == cn,
            || fleet.log_tail(30),
        );
    };

    // Rewritten in place, the certificate first and then its key, as a careless tool would
    // (a poll between the two writes sees a mismatched pair and keeps the old one).
    let (cert, key) = serving_cert(&ca, "rotation-b");
    std::fs::write(secret.path("tls.crt"), &cert).unwrap();
    std::fs::write(secret.path("tls.key"), &key).unwrap();
    served("rotation-b");
    create("after-in-place");
    sees(&mut watch, "after-in-place");

    // A new version through the `..data` symlink swap, as the kubelet updates a Secret.
    let (cert, key) = serving_cert(&ca, "rotation-c");
    secret.swap(&[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())]);
    served("rotation-c");

    // A broken version: the last good certificate keeps serving, and it is reported.
    let failures = r#"fleetgate_reload_failures_total{what="serving_certificate"}"#;
    let before = fleet.metric(failures).unwrap_or(0);
    secret.swap(&[
        ("tls.crt", b"not a certificate\n"),
        ("tls.key", key.as_bytes()),
    ]);
    wait_for_or(
        "the broken certificate reported",
        ROTATION,
        || fleet.metric(failures).unwrap_or(0) > before,
        || fleet.log_tail(30),
    );
    let log = without_ansi(&fleet.log());
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("configuration rejected"))
        .expect("a log line for the broken file");
    assert!(
        line.contains(&*secret.path("tls.crt").to_string_lossy()) && line.contains("not PEM"),
        "the line names the file and the reason: {line}"
    );
    assert_eq!(served_cn(&fleet, https), "rotation-c");
    create("after-broken");
    sees(&mut watch, "after-broken");
}

#[test]
fn a_new_client_ca_admits_its_clients_and_a_new_token_file_its_tokens() {
    let mut fleet = Fleet::sim_in("config", 1, 1);
    let ca_pem = std::fs::read(fleet.fleet_path("pki/gateway-ca.crt")).unwrap();
    let tokens = std::fs::read_to_string(fleet.fleet_path("users/tokens.csv")).unwrap();
    let mut secret = SecretMount::create(
        fleet.path("secret"),
        &[("ca.crt", &ca_pem), ("tokens.csv", tokens.as_bytes())],
    );
    edit_gateway(&fleet, |g| {
        set(g, &["spec", "tls", "clientCAFile"], &secret.path("ca.crt"));
        set(
            g,
            &["spec", "auth", "tokenFile"],
            &secret.path("tokens.csv"),
        );
    });
    fleet.serve(&["--workers", "2"], None);
    let https = fleet.https();
    let path = "/clusters/member1/api/v1/namespaces";

    // A client of a CA the gateway does not know yet is refused at the handshake.
    let (new_ca, cert, key) = new_client_ca("admin");
    let newcomer = tls_with_cert(&fleet, &cert, &key);
    assert!(!matches!(
        status_of(https, newcomer.clone(), path, ""),
        Ok(200)
    ));
    let alice = std::fs::read_to_string(fleet.fleet_path("users/alice.token")).unwrap();
    let alice = bearer(alice.trim());
    let anonymous = anonymous_tls(&fleet);
    assert_ne!(
        status_of(https, anonymous.clone(), path, &alice).unwrap(),
        401
    );

    // The CA bundle gains the new CA; the token file loses alice and gains a token for admin.
    let mut bundle = ca_pem.clone();
    bundle.extend_from_slice(new_ca.as_bytes());
    let rotated: String = tokens
        .lines()
        .filter(|l| !l.contains(",alice,"))
        .map(|l| format!("{l}\n"))
        .chain(std::iter::once(
            "rotated-admin-token,admin,admin-uid,\"system:masters\"\n".to_owned(),
        ))
        .collect();
    secret.swap(&[("ca.crt", &bundle), ("tokens.csv", rotated.as_bytes())]);

    wait_for_or(
        "a client of the new CA admitted",
        ROTATION,
        || matches!(status_of(https, newcomer.clone(), path, ""), Ok(200)),
        || fleet.log_tail(30),
    );
    assert_eq!(
        status_of(
            https,
            anonymous.clone(),
            path,
            &bearer("rotated-admin-token")
        )
        .unwrap(),
        200
    );
    assert_eq!(
        status_of(https, anonymous.clone(), path, &alice).unwrap(),
        401
    );
    // The clients of the old CA still are.
    let admin = fleet.admin_tls_config(b"http/1.1");
    assert_eq!(status_of(https, admin, path, "").unwrap(), 200);
}

#[test]
fn an_agent_of_a_new_agent_ca_connects_once_the_file_changes() {
    let mut fleet = Fleet::sim(2, 1);
    let member2 = make_pull_mode(&fleet, "member2");
    let agents = fleet.fleet_path("agents");
    issue_agent(&agents, "member2");
    serve_with_tunnel(&mut fleet, &[]);
    let tunnel = fleet.ready().addr("tunnel");
    let failures = r#"fleetgate_reload_failures_total{what="agent_ca"}"#;

    // An empty file, as a writer caught mid-write leaves it: refused, reported, old CA kept.
    std::fs::write(agents.join("agent-ca.crt"), b"").unwrap();
    wait_for_or(
        "the empty agent CA reported",
        ROTATION,
        || fleet.metric(failures) == Some(1),
        || fleet.log_tail(30),
    );
    let log = without_ansi(&fleet.log());
    assert!(
        log.lines().any(|l| l.contains("TLS material refused")
            && l.contains("agent_ca")
            && l.contains("agent-ca.crt")),
        "{log}"
    );

    // A new agent CA (`fleetgate certs issue-agent` in a fresh directory), written in place.
    let next = fleet.fleet_path("agents-next");
    issue_agent(&next, "member2");
    std::fs::copy(next.join("agent-ca.crt"), agents.join("agent-ca.crt")).unwrap();
    wait_for_or(
        "the new agent CA loaded",
        ROTATION,
        || {
            without_ansi(&fleet.log())
                .lines()
                .any(|l| l.contains("TLS material reloaded") && l.contains("agent_ca"))
        },
        || fleet.log_tail(30),
    );
    let log = fleet.path("agent.log");
    let setup = AgentSetup {
        cluster: "member2",
        identity: next.join("agent-member2"),
        kube_server: &member2,
        kube_ca: fleet.fleet_path("agents/member2-kube-ca.crt"),
        log: log.clone(),
    };
    let command = agent_command(
        std::process::Command::new(support::fleet::fleetgate_binary()),
        &fleet,
        &[tunnel],
        &setup,
    );
    let _agent = Agent::start(command, &log, || fleet.log_tail(30));
    let answer = fleet.https_get("/clusters/member2/api/v1/namespaces");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn sighup_reopens_the_audit_log_at_its_path() {
    let mut fleet = Fleet::sim(1, 1);
    let audit = fleet.path("audit.log");
    edit_gateway(&fleet, |g| {
        g["spec"]["audit"] = serde_yaml::from_str("{}").unwrap();
        set(g, &["spec", "audit", "path"], &audit);
    });
    fleet.serve(&["--workers", "2"], None);
    let https = fleet.https();
    let get = |path: &str| {
        let answer = admin_get_at(fleet.dir(), https, path);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    };
    let lines_with = |file: &Path, needle: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    };
    let wait = |what: &str, condition: &dyn Fn() -> bool| {
        wait_for_or(what, Duration::from_secs(10), condition, || {
            fleet.log_tail(20)
        })
    };
    get("/clusters/member1/api/v1/namespaces/default/configmaps?before-rotation");
    wait("the first line", &|| {
        lines_with(&audit, "before-rotation") == 1
    });

    // What logrotate does: rename, then SIGHUP.
    let rotated = fleet.path("audit.log.1");
    std::fs::rename(&audit, &rotated).unwrap();
    signal(&fleet.gateway.as_ref().unwrap().child, libc::SIGHUP);
    wait("the reopen logged", &|| {
        without_ansi(&fleet.log()).contains("audit log reopened")
    });
    get("/clusters/member1/api/v1/namespaces/default/configmaps?after-rotation");
    wait("the next line in a new file at the path", &|| {
        lines_with(&audit, "after-rotation") == 1
    });
    assert_eq!(lines_with(&rotated, "after-rotation"), 0);
    assert_eq!(lines_with(&rotated, "before-rotation"), 1);
    assert_eq!(lines_with(&audit, "before-rotation"), 0);
}

/// An ES256 signing key and its JWK.
struct SigningKey {
    kid: String,
    pair: ring::signature::EcdsaKeyPair,
}

impl SigningKey {
    fn generate(kid: &str) -> SigningKey {
        use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        SigningKey {
            kid: kid.to_owned(),
            pair,
        }
    }

    fn jwk(&self) -> serde_json::Value {
        use ring::signature::KeyPair as _;
        let point = self.pair.public_key().as_ref();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        serde_json::json!({"kty": "EC", "crv": "P-256", "kid": self.kid,
            "x": b64.encode(&point[1..33]), "y": b64.encode(&point[33..65])})
    }

    /// An ID token for `admin` (in `system:masters`) signed by this key, its header naming `kid`.
    fn token(&self, kid: &str) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = serde_json::json!({"alg": "ES256", "kid": kid, "typ": "JWT"});
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let claims = serde_json::json!({"iss": "https://issuer.rotation.test", "aud": "fleetgate",
            "sub": "admin", "groups": ["system:masters"], "exp": exp});
        let signed = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let rng = ring::rand::SystemRandom::new();
        let signature = self.pair.sign(&rng, signed.as_bytes()).unwrap();
        format!("{signed}.{}", b64.encode(signature.as_ref()))
    }
}

/// A JWKS endpoint on 127.0.0.1:0 serving whatever `document` holds, counting its fetches.
fn jwks_server(document: Arc<ArcSwap<String>>, fetches: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            fetches.fetch_add(1, Ordering::SeqCst);
            let body = document.load_full();
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    address
}

#[test]
fn an_unknown_kid_fetches_the_issuers_keys_again_at_most_once_per_interval() {
    let first = SigningKey::generate("key-1");
    let second = SigningKey::generate("key-2");
    let document = Arc::new(ArcSwap::from_pointee(
        serde_json::json!({"keys": [first.jwk()]}).to_string(),
    ));
    let fetches = Arc::new(AtomicUsize::new(0));
    let jwks = jwks_server(document.clone(), fetches.clone());

    let mut fleet = Fleet::sim(1, 1);
    edit_gateway(&fleet, |g| {
        g["spec"]["auth"]["oidc"] = serde_yaml::from_str(&format!(
            "{{issuerURL: 'https://issuer.rotation.test', clientID: fleetgate, \
              jwksURL: 'http://{jwks}/keys', jwksRefreshSeconds: 3600, groupsClaim: groups}}"
        ))
        .unwrap();
    });
    fleet.serve(&["--workers", "2"], None);
    let https = fleet.https();
    let anonymous = anonymous_tls(&fleet);
    let path = "/clusters/member1/api/v1/namespaces";
    let status = |token: &str| status_of(https, anonymous.clone(), path, &bearer(token)).unwrap();
    assert_eq!(status(&first.token("key-1")), 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "fetched once at start");

    // The issuer rotates: its document now has key-2, which signs the new tokens.
    document.store(Arc::new(
        serde_json::json!({"keys": [first.jwk(), second.jwk()]}).to_string(),
    ));
    let token = second.token("key-2");
    wait_for_or(
        "a token of the new key accepted",
        ROTATION,
        || status(&token) == 200,
        || fleet.log_tail(20),
    );
    let after_rotation = fetches.load(Ordering::SeqCst);
    assert_eq!(after_rotation, 2, "one fetch for the new key");

    // A flood of made-up kids: refused, and at most one fetch per interval for all of them.
    for i in 0..40 {
        assert_eq!(status(&second.token(&format!("made-up-{i}"))), 401);
    }
    wait_for_or(
        "the flood's one fetch",
        ROTATION,
        || fetches.load(Ordering::SeqCst) == after_rotation + 1,
        || fleet.log_tail(20),
    );
    for i in 0..40 {
        assert_eq!(status(&second.token(&format!("more-made-up-{i}"))), 401);
    }
    // Inside the interval that began with that fetch, no other fetch.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fetches.load(Ordering::SeqCst), after_rotation + 1);
    assert_eq!(status(&token), 200);
}
