//! The simulated fleet's PKI: the CAs it generates (rcgen), the certificates they issue, and the
//! reading of a verified client certificate's subject (CN = user, O = group, as Kubernetes does).
//!
//! Everything here is generated in memory at fleet start; `files` writes it to `DIR/pki/` and
//! `DIR/users/`. This module never touches the network and never decides who may do what (that is
//! `auth`). Called by `sim::start_fleet` and by the member's TLS acceptor.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why a certificate could not be generated.
#[derive(Debug, thiserror::Error)]
#[error("generating the {what} certificate")]
pub struct PkiError {
    what: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

fn pki_err(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError {
        what: what.to_owned(),
        source: Box::new(source),
    }
}

/// A certificate and its private key, in the forms the files and rustls need.
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Arc<Vec<u8>>,
}

impl IssuedCert {
    /// The private key as rustls wants it (PKCS#8).
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.as_ref().clone()))
    }
}

/// A self-signed certificate authority that issues serving and client certificates.
pub struct CertAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertAuthority {
    /// Generates a new CA (ECDSA P-256) with the given common name.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(pki_err(common_name))?;
        let key_pem = key.serialize_pem();
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_err(common_name))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(pki_err(common_name))?;
        let cert_pem = issuer.pem();
        Ok(Self {
            issuer,
            cert_pem,
            key_pem,
        })
    }

    /// The CA certificate in DER form (a trust anchor for rustls).
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Issues a serving certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, subject_alt_names: &[&str]) -> Result<IssuedCert, PkiError> {
        let names: Vec<String> = subject_alt_names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).map_err(pki_err("serving"))?;
        params.distinguished_name.push(
            DnType::CommonName,
            subject_alt_names.first().copied().unwrap_or("localhost"),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params, "serving")
    }

    /// Issues a client certificate: CN = `user`, O = `group` (Kubernetes' mapping).
    pub fn issue_client(&self, user: &str, group: Option<&str>) -> Result<IssuedCert, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err(user))?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params, user)
    }

    fn sign(&self, params: CertificateParams, what: &str) -> Result<IssuedCert, PkiError> {
        let key = KeyPair::generate().map_err(pki_err(what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err(what))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: Arc::new(key.serialize_der()),
        })
    }
}

/// The subject of a client certificate as Kubernetes reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
}

/// Reads CN and O out of a DER certificate that rustls has already verified.
///
/// A minimal DER walk (Certificate -> TBSCertificate -> subject): the sim needs nothing else from
/// the certificate, and the crates that parse X.509 fully are not in the workspace. Returns None
/// for anything it does not understand, which the caller treats as "no client identity".
pub fn cert_subject(der: &[u8]) -> Option<CertSubject> {
    let (cert, _) = der_element(der, 0x30)?;
    let (tbs, _) = der_element(cert, 0x30)?;
    let mut rest = tbs;
    // Optional [0] version.
    if rest.first() == Some(&0xa0) {
        rest = der_skip(rest)?;
    }
    rest = der_skip(rest)?; // serialNumber
    rest = der_skip(rest)?; // signature algorithm
    rest = der_skip(rest)?; // issuer
    rest = der_skip(rest)?; // validity
    let (subject, _) = der_element(rest, 0x30)?;
    let mut subject_out = CertSubject {
        common_name: String::new(),
        organizations: Vec::new(),
    };
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (set, after) = der_element(rdns, 0x31)?;
        rdns = after;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (atv, after_atv) = der_element(atvs, 0x30)?;
            atvs = after_atv;
            let (oid, value_rest) = der_element(atv, 0x06)?;
            let (tag, value, _) = der_any(value_rest)?;
            // UTF8String, PrintableString, IA5String, TeletexString.
            if !matches!(tag, 0x0c | 0x13 | 0x16 | 0x14) {
                continue;
            }
            let text = String::from_utf8_lossy(value).into_owned();
            match oid {
                [0x55, 0x04, 0x03] => subject_out.common_name = text,
                [0x55, 0x04, 0x0a] => subject_out.organizations.push(text),
                _ => {}
            }
        }
    }
    Some(subject_out)
}

/// Parses one TLV; returns (tag, content, rest).
fn der_any(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first_len = *input.get(1)?;
    let (len, header) = if first_len < 0x80 {
        (first_len as usize, 2)
    } else {
        let count = (first_len & 0x7f) as usize;
        if count == 0 || count > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..count {
            len = (len << 8) | *input.get(2 + i)? as usize;
        }
        (len, 2 + count)
    };
    let content = input.get(header..header.checked_add(len)?)?;
    Some((tag, content, &input[header + len..]))
}

fn der_element(input: &[u8], expected_tag: u8) -> Option<(&[u8], &[u8])> {
    let (tag, content, rest) = der_any(input)?;
    (tag == expected_tag).then_some((content, rest))
}

fn der_skip(input: &[u8]) -> Option<&[u8]> {
    der_any(input).map(|(_, _, rest)| rest)
}

/// The simulated fleet's OIDC issuer: an ES256 (P-256) signing key, its JWKS, and the minting of
/// ID tokens (compact JWS) for the test users. The gateway verifies what it signs.
pub struct OidcIssuer {
    key: ring::signature::EcdsaKeyPair,
    /// The key's PKCS#8 PEM (written to `pki/oidc-signing.key` so tests can mint more tokens).
    pub key_pem: String,
    pub kid: String,
    pub issuer: String,
    pub client_id: String,
}

impl OidcIssuer {
    /// Generates a new signing key for `issuer`; tokens are for `client_id`.
    pub fn generate(issuer: &str, client_id: &str, kid: &str) -> Result<Self, PkiError> {
        let err = |source: String| PkiError {
            what: "OIDC signing".to_owned(),
            source: source.into(),
        };
        let rng = ring::rand::SystemRandom::new();
        let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng)
            .map_err(|_| err("key generation failed".into()))?;
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng)
            .map_err(|e| err(e.to_string()))?;
        let key_pem = pem_block("PRIVATE KEY", pkcs8.as_ref());
        Ok(OidcIssuer {
            key,
            key_pem,
            kid: kid.to_owned(),
            issuer: issuer.to_owned(),
            client_id: client_id.to_owned(),
        })
    }

    /// The JWKS document (`{"keys": [one EC P-256 key]}`).
    pub fn jwks(&self) -> serde_json::Value {
        use ring::signature::KeyPair as _;
        let b64 = |bytes: &[u8]| {
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes)
        };
        // The public key is the uncompressed point 04 || x || y.
        let point = self.key.public_key().as_ref();
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]})
    }

    /// Signs `claims` (iss and aud are added) as an ES256 compact JWS.
    pub fn mint(&self, mut claims: serde_json::Value) -> Result<String, String> {
        let b64 = |bytes: &[u8]| {
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes)
        };
        if let Some(map) = claims.as_object_mut() {
            map.entry("iss").or_insert(self.issuer.clone().into());
            map.entry("aud").or_insert(self.client_id.clone().into());
        }
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .key
            .sign(&ring::rand::SystemRandom::new(), signed.as_bytes())
            .map_err(|_| "signing a JWT".to_string())?;
        Ok(format!("{signed}.{}", b64(signature.as_ref())))
    }
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let body = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_cert_subject_round_trips() {
        let ca = CertAuthority::generate("test-ca").unwrap();
        let cert = ca.issue_client("alice", Some("devs")).unwrap();
        let subject = cert_subject(cert.cert_der.as_ref()).unwrap();
        assert_eq!(subject.common_name, "alice");
        assert_eq!(subject.organizations, vec!["devs".to_string()]);
    }
}
