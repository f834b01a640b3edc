//! Checks of the key material a configuration names (the serving certificate and key, the client
//! CA), so that a rotation that writes a broken file is refused at load, where a refusal keeps the
//! last good table (and with it the last good TLS material) serving and is reported naming the
//! file and the reason. Also names, for the reload metrics, what a rejected configuration broke.
//!
//! Pure functions over bytes: no I/O, no logging. Called by `load` (checks) and `reload`
//! (classifying a failure).

use crate::error::ConfigError;
use crate::settings::ServingTls;

/// What a reload failure is about, as `fleetgate_reload_failures_total{what}` names it.
pub const SERVING_CERTIFICATE: &str = "serving_certificate";
pub const CLIENT_CA: &str = "client_ca";
pub const TOKEN_FILE: &str = "token_file";
pub const JWKS: &str = "jwks";
pub const AGENT_CA: &str = "agent_ca";
pub const CONFIG: &str = "config";

/// Checks that the serving certificate and key parse and belong together, and that the client CA
/// (when set) holds at least one certificate. `cert_name` / `key_name` / `ca_name` name the files
/// (or `certData`...) in the message. The error is (field, message), as `load` reports them.
pub(crate) fn check_serving_tls(
    tls: &ServingTls,
    cert_name: &str,
    key_name: &str,
    ca_name: &str,
) -> Result<(), (&'static str, String)> {
    let certs = crate::endpoint::parse_certs(&tls.cert_pem)
        .map_err(|m| ("spec.tls.certData/certFile", format!("{cert_name}: {m}")))?;
    let key = crate::endpoint::parse_key(&tls.key_pem)
        .map_err(|m| ("spec.tls.keyData/keyFile", format!("{key_name}: {m}")))?;
    let provider = crate::endpoint::crypto_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider).map_err(|e| {
        (
            "spec.tls.keyData/keyFile",
            format!("{key_name} does not go with the certificate {cert_name}: {e}"),
        )
    })?;
    if let Some(ca) = &tls.client_ca_pem {
        crate::endpoint::parse_certs(ca).map_err(|m| {
            (
                "spec.tls.clientCAData/clientCAFile",
                format!("{ca_name}: {m}"),
            )
        })?;
    }
    Ok(())
}

/// What a rejected configuration broke: the key material a field names, else `config`.
pub fn what_failed(error: &ConfigError) -> &'static str {
    match error {
        ConfigError::Invalid { field, .. } => match *field {
            "spec.tls.certData/certFile" | "spec.tls.keyData/keyFile" => SERVING_CERTIFICATE,
            "spec.tls.clientCAData/clientCAFile" => CLIENT_CA,
            "spec.auth.tokenFile" => TOKEN_FILE,
            "spec.auth.oidc.jwksFile" => JWKS,
            _ => CONFIG,
        },
        _ => CONFIG,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (Vec<u8>, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let (cert, key) = pair("a");
        let (_, other_key) = pair("b");
        let tls = |cert: &[u8], key: &[u8], ca: Option<&[u8]>| ServingTls {
            cert_pem: cert.to_vec(),
            key_pem: key.to_vec(),
            client_ca_pem: ca.map(<[u8]>::to_vec),
        };
        let check = |t: &ServingTls| check_serving_tls(t, "tls.crt", "tls.key", "ca.crt");
        assert!(check(&tls(&cert, &key, Some(&cert))).is_ok());
        let (field, message) = check(&tls(&cert, &other_key, None)).unwrap_err();
        assert_eq!(field, "spec.tls.keyData/keyFile");
        assert!(message.contains("tls.key does not go with"), "{message}");
        let (field, message) = check(&tls(b"", &key, None)).unwrap_err();
        assert_eq!(field, "spec.tls.certData/certFile");
        assert!(message.starts_with("tls.crt: "), "{message}");
        let (field, _) = check(&tls(&cert, &key, Some(b"-----BEGIN x"))).unwrap_err();
        assert_eq!(field, "spec.tls.clientCAData/clientCAFile");
    }
}
