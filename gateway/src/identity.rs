//! The client's identity and how it is carried to a member cluster.
//!
//! Sits between routing and the upstream: it reads who the client is (today the subject of the
//! client certificate rustls verified: CN is the user, each O a group, as Kubernetes does), refuses
//! client-sent `Impersonate-*` headers (the identity issue will authorize them against policy
//! instead), drops the client's own `Authorization`, and writes the cluster's credentials plus the
//! `Impersonate-User` / `Impersonate-Group` headers onto the upstream request. It never does I/O and
//! never trusts a header for identity. Called by `tls` (at handshake) and `proxy` (per request).

use fleetgate_config_watcher::ClusterRoute;

use crate::error::GatewayError;
use crate::http1::{push_header, Head};

/// Who the client is, as established at connection time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub user: String,
    pub groups: Vec<String>,
}

/// Why a verified certificate still gives no identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("client certificate could not be parsed")]
    Unparsable,
    #[error("client certificate has no subject common name (the user name)")]
    NoCommonName,
}

impl ClientIdentity {
    /// The identity of a client on a listener that does not authenticate (the plaintext
    /// benchmark listener): Kubernetes' anonymous user, so a member never mistakes such a request
    /// for the gateway's own.
    pub fn anonymous() -> Self {
        ClientIdentity {
            user: "system:anonymous".to_string(),
            groups: vec!["system:unauthenticated".to_string()],
        }
    }

    /// Reads CN (user) and O (groups) from a DER certificate that rustls has already verified.
    pub fn from_certificate(der: &[u8]) -> Result<Self, IdentityError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|_| IdentityError::Unparsable)?;
        let subject = cert.subject();
        let user = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .filter(|cn| !cn.is_empty())
            .ok_or(IdentityError::NoCommonName)?
            .to_string();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect();
        Ok(ClientIdentity { user, groups })
    }
}

/// Refuses a request that tries to choose its own identity on the member.
pub fn check_request(head: &Head) -> Result<(), GatewayError> {
    if head
        .headers()
        .any(|(name, _)| starts_with_ignore_case(name, b"impersonate-"))
    {
        return Err(GatewayError::ClientImpersonation);
    }
    Ok(())
}

fn starts_with_ignore_case(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Whether a client header is dropped because identity headers are the gateway's to write.
pub fn is_identity_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"authorization") || starts_with_ignore_case(name, b"impersonate-")
}

/// Appends the cluster's credentials and, when the cluster impersonates, the client's identity.
pub fn push_upstream_identity(
    out: &mut Vec<u8>,
    cluster: &ClusterRoute,
    identity: &ClientIdentity,
) {
    if let Some(authorization) = &cluster.authorization {
        push_header(out, b"Authorization", authorization.as_bytes());
    }
    if cluster.impersonation {
        push_header(out, b"Impersonate-User", identity.user.as_bytes());
        for group in &identity.groups {
            push_header(out, b"Impersonate-Group", group.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_are_recognized_in_any_case() {
        assert!(is_identity_header(b"AUTHORIZATION"));
        assert!(is_identity_header(b"impersonate-user"));
        assert!(is_identity_header(b"Impersonate-Extra-Scopes"));
        assert!(!is_identity_header(b"Impersonator"));
    }

    #[test]
    fn subject_gives_user_and_groups() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "devs");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let identity = ClientIdentity::from_certificate(cert.der()).unwrap();
        assert_eq!(identity.user, "alice");
        assert_eq!(identity.groups, vec!["devs".to_string()]);
    }
}
