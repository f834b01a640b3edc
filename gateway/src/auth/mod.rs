//! The client's identity per request, the AccessPolicy decision, and how the identity is carried
//! to a member cluster.
//!
//! Sits between routing and the upstream. [`decide`] authenticates a request (a bearer token from
//! the token file, an OIDC JWT, or else the client certificate of the connection; nothing gives a
//! 401), applies client-sent `Impersonate-*` headers where a policy grants the `impersonate` verb
//! on those identities, and checks the compiled AccessPolicy for the effective identity (deny by
//! default, a 403 naming what was denied). [`push_upstream_identity`] then writes the cluster's
//! credentials and `Impersonate-User` / `-Group` / `-Uid` / `-Extra-*`; on a PassThrough cluster
//! the client's own `Authorization` goes through instead. Never does I/O, never logs a
//! credential, and never trusts a header for identity. The common path (certificate, or a token
//! seen before on the connection) allocates nothing but an `Arc` count. Called by `tls` (at
//! handshake) and the pipeline (`handle`, per request, through `request::decide`).

use std::cell::RefCell;
use std::sync::Arc;

use fleetgate_config_watcher::policy::{grant_verb_name, AccessControl, RequestAttributes};
use fleetgate_config_watcher::ClusterRoute;

pub use fleetgate_config_watcher::auth::{Identity as ClientIdentity, IdentityError};

use crate::errors::GatewayError;

mod impersonation;
mod jwt;
mod upstream;

pub use impersonation::check_request;
use impersonation::{check_impersonation, requested_impersonation};
pub use jwt::verify_jwt;
pub use upstream::{
    check_field_names, drops_client_header, is_identity_header, is_remote_identity,
    push_upstream_identity,
};

/// What one client connection established for all its requests: the verified certificate's
/// identity (if any), and the last bearer JWT verified on it (kubectl sends the same token on
/// every request, so one signature check per connection, until the token expires).
pub struct ConnectionAuth {
    certificate: Option<Arc<ClientIdentity>>,
    /// The plaintext listener's `system:anonymous`: who a request is when it brings no token.
    anonymous: Option<Arc<ClientIdentity>>,
    jwt_cache: RefCell<Option<CachedJwt>>,
}

struct CachedJwt {
    token: Box<[u8]>,
    identity: Arc<ClientIdentity>,
    expires: u64,
}

impl ConnectionAuth {
    /// From the identity `tls` or `shard` established: an empty user means no client
    /// certificate (a bearer token is then required); `system:anonymous` (the plaintext
    /// listener) is who a request is when it brings no bearer token.
    pub fn new(identity: &ClientIdentity) -> ConnectionAuth {
        let shared = (!identity.user.is_empty()).then(|| Arc::new(identity.clone()));
        let anonymous = identity.user == fleetgate_config_watcher::policy::ANONYMOUS_USER;
        ConnectionAuth {
            certificate: shared.clone().filter(|_| !anonymous),
            anonymous: shared.filter(|_| anonymous),
            jwt_cache: RefCell::new(None),
        }
    }
}

/// The identity a request goes to the member with.
pub struct Decided {
    /// Who the member is told about (after honoured client impersonation). None on a
    /// PassThrough cluster with a token the gateway does not know: the member decides.
    pub identity: Option<Arc<ClientIdentity>>,
    /// Who authenticated (differs from `identity` when the client impersonates).
    pub authenticated: Option<Arc<ClientIdentity>>,
    /// The client's `Authorization` and `Impersonate-*` headers go to the member unchanged.
    pub pass_through: bool,
}

/// A request [`decide`] refused: the error to answer with, and who had authenticated by then,
/// so the audit log names the user a 403 was for (both None for a 401).
pub struct Refusal {
    pub error: GatewayError,
    pub authenticated: Option<Arc<ClientIdentity>>,
    /// Who the client asked to act as, when the refusal came after impersonation was honoured.
    pub acting_as: Option<Arc<ClientIdentity>>,
}

impl Refusal {
    fn of(
        error: GatewayError,
        authenticated: &Arc<ClientIdentity>,
        acting_as: &Arc<ClientIdentity>,
    ) -> Self {
        Refusal {
            error,
            authenticated: Some(authenticated.clone()),
            acting_as: Some(acting_as.clone()),
        }
    }
}

impl From<GatewayError> for Refusal {
    /// A refusal before anyone authenticated (a 401).
    fn from(error: GatewayError) -> Self {
        Refusal {
            error,
            authenticated: None,
            acting_as: None,
        }
    }
}

/// A request's header fields, in order, read as often as a decision needs them: any `Fn()` that
/// gives them (a front-end's `|| head.headers()`). What [`decide`] and `request::decide` take.
pub trait HeaderFields<'h> {
    fn fields(&self) -> impl Iterator<Item = (&'h [u8], &'h [u8])>;
}

impl<'h, F, H> HeaderFields<'h> for F
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    fn fields(&self) -> impl Iterator<Item = (&'h [u8], &'h [u8])> {
        self()
    }
}

/// Authenticates and authorizes one request for `cluster`, classified as `attrs` (by
/// `request::decide`); its header fields are read twice at most.
/// Why a request was not authenticated is logged at debug level (never the credential).
pub fn decide<'h>(
    access: &AccessControl,
    conn: &ConnectionAuth,
    cluster: &ClusterRoute,
    attrs: &RequestAttributes<'_>,
    headers: &impl HeaderFields<'h>,
) -> Result<Decided, Refusal> {
    let decided = authenticate(access, conn, cluster, headers.fields())
        .map_err(Refusal::from)
        .and_then(|identity| authorize(access, cluster, attrs, identity, headers.fields()));
    if let Err(Refusal {
        error: GatewayError::Unauthorized { reason },
        ..
    }) = &decided
    {
        tracing::debug!(cluster = %cluster.name, reason, "request not authenticated");
    }
    decided
}

/// Who a request for `cluster` authenticated as, as kube-apiserver's union authenticator says:
/// the client certificate first (a verified one wins, whatever else the request carries), then
/// a bearer token in `Authorization`. A PassThrough cluster needs the token itself, whoever the
/// certificate says the client is. None: the plaintext listener's anonymous user, or on a
/// PassThrough cluster a token only the member can judge.
fn authenticate<'h>(
    access: &AccessControl,
    conn: &ConnectionAuth,
    cluster: &ClusterRoute,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) -> Result<Option<Arc<ClientIdentity>>, GatewayError> {
    if let Some(identity) = conn.certificate.as_ref().filter(|_| !cluster.pass_through) {
        return Ok(Some(identity.clone()));
    }
    let value = match (authorization(headers), &conn.anonymous) {
        (Some(value), _) => value,
        // The plaintext listener without a token: the anonymous user.
        (None, Some(anonymous)) if !cluster.pass_through => return Ok(Some(anonymous.clone())),
        (None, _) => {
            return Err(GatewayError::Unauthorized {
                reason: "no client certificate and no bearer token",
            })
        }
    };
    let Some(token) = bearer_token(value) else {
        return Err(GatewayError::Unauthorized {
            reason: "Authorization is not a bearer token",
        });
    };
    match authenticate_token(access, conn, token) {
        Ok(identity) => Ok(Some(identity)),
        // A token the gateway cannot verify may still be the member's own (OCM style).
        Err(_) if cluster.pass_through => Ok(None),
        Err(reason) => Err(GatewayError::Unauthorized { reason }),
    }
}

/// What the `authenticated` client may do on `cluster` as `attrs`: the identity the member is
/// told about (after client impersonation, its `Impersonate-*` among `headers`, where a policy
/// grants it), or the refusal.
fn authorize<'h>(
    access: &AccessControl,
    cluster: &ClusterRoute,
    attrs: &RequestAttributes<'_>,
    authenticated: Option<Arc<ClientIdentity>>,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) -> Result<Decided, Refusal> {
    let policy = &access.policy;
    if cluster.pass_through {
        // The member authenticates and authorizes the client's own token (and any
        // Impersonate-* it sends); a token the gateway knows is also held to policy.
        if let Some(identity) = &authenticated {
            if !policy.allows(identity, &cluster.name, attrs) {
                let error = forbidden(identity, &Place::Cluster(&cluster.name), attrs);
                return Err(Refusal::of(error, identity, identity));
            }
        }
        return Ok(Decided {
            identity: authenticated.clone(),
            authenticated,
            pass_through: true,
        });
    }
    let Some(authenticated) = authenticated else {
        return Err(GatewayError::Unauthorized {
            reason: "unknown bearer token",
        }
        .into());
    };
    let refused = |error| Refusal::of(error, &authenticated, &authenticated);
    let identity = match requested_impersonation(headers).map_err(refused)? {
        None => authenticated.clone(),
        Some(wanted) => {
            check_impersonation(access, &authenticated, &cluster.name, &wanted).map_err(refused)?;
            Arc::new(wanted)
        }
    };
    // The identity goes to the member in Impersonate-* fields: a name those cannot carry as it
    // is (a CR LF from a token's claim or a certificate's subject, spaces a member would trim)
    // is refused, never written.
    if !identity.fits_in_a_header() {
        let error = GatewayError::Unauthorized {
            reason: "the user's name, a group, uid or extra value holds a control character or \
                     starts or ends with a space, which an impersonation header cannot carry",
        };
        return Err(Refusal::of(error, &authenticated, &identity));
    }
    let impersonated = !Arc::ptr_eq(&identity, &authenticated);
    let allowed = policy.allows(&identity, &cluster.name, attrs)
        || (impersonated && impersonation::allowed_to_impersonated(attrs));
    if !allowed {
        let error = forbidden(&identity, &Place::Cluster(&cluster.name), attrs);
        return Err(Refusal::of(error, &authenticated, &identity));
    }
    Ok(Decided {
        identity: Some(identity),
        authenticated: Some(authenticated),
        pass_through: false,
    })
}

/// The value of the request's first `Authorization` field.
fn authorization<'h>(mut headers: impl Iterator<Item = (&'h [u8], &'h [u8])>) -> Option<&'h [u8]> {
    headers
        .find(|(name, _)| name.eq_ignore_ascii_case(b"authorization"))
        .map(|(_, value)| value)
}

/// An unknown cluster is named in a 404 only to an authenticated client: anyone else gets the 401
/// it would get on a real cluster, so cluster names cannot be probed without a credential.
pub fn hide_unknown_cluster<'h>(
    err: GatewayError,
    access: &AccessControl,
    conn: &ConnectionAuth,
    headers: &impl HeaderFields<'h>,
) -> GatewayError {
    let listener_identity = conn.certificate.is_some() || conn.anonymous.is_some();
    if !matches!(err, GatewayError::UnknownCluster { .. }) || listener_identity {
        return err;
    }
    let known = authorization(headers.fields())
        .and_then(bearer_token)
        .is_some_and(|token| authenticate_token(access, conn, token).is_ok());
    if known {
        err
    } else {
        GatewayError::Unauthorized {
            reason: "no credential for an unknown cluster",
        }
    }
}

/// `Bearer TOKEN` (scheme case-insensitive), else None.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = crate::codec::http1::head::trim(value);
    if value.len() > 7 && value[..7].eq_ignore_ascii_case(b"bearer ") {
        let token = crate::codec::http1::head::trim(&value[7..]);
        (!token.is_empty()).then_some(token)
    } else {
        None
    }
}

/// The token file first, then OIDC (with the connection's cache).
fn authenticate_token(
    access: &AccessControl,
    conn: &ConnectionAuth,
    token: &[u8],
) -> Result<Arc<ClientIdentity>, &'static str> {
    let authenticators = &access.authenticators;
    if let Some(identity) = std::str::from_utf8(token)
        .ok()
        .and_then(|t| authenticators.tokens.get(t))
    {
        return Ok(identity.clone());
    }
    let Some(oidc) = &authenticators.oidc else {
        return Err("unknown bearer token");
    };
    if token.iter().filter(|b| **b == b'.').count() != 2 {
        return Err("unknown bearer token");
    }
    let now = unix_now();
    if let Some(cached) = conn.jwt_cache.borrow().as_ref() {
        if *cached.token == *token && cached.expires > now {
            return Ok(cached.identity.clone());
        }
    }
    let (identity, expires) = verify_jwt(oidc, token, now)?;
    let identity = Arc::new(identity);
    *conn.jwt_cache.borrow_mut() = Some(CachedJwt {
        token: token.into(),
        identity: identity.clone(),
        expires,
    });
    Ok(identity)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Where a request was refused: on one cluster, or in the fleet view (which names no cluster).
pub enum Place<'a> {
    Cluster(&'a str),
    Fleet,
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Cluster(name) => write!(f, "on cluster {name:?}"),
            Place::Fleet => f.write_str("in any cluster of the fleet view"),
        }
    }
}

/// kube-apiserver's Forbidden message, naming the cluster too (or the fleet view).
pub fn forbidden(
    identity: &ClientIdentity,
    place: &Place<'_>,
    attrs: &RequestAttributes<'_>,
) -> GatewayError {
    let verb = grant_verb_name(attrs);
    let message = if !attrs.is_resource_request {
        format!(
            "forbidden: User {:?} cannot {verb} path {place}: no AccessPolicy grants it anything there",
            identity.user
        )
    } else {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.to_owned()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let subject = if attrs.name.is_empty() {
            format!("{resource} is forbidden")
        } else {
            format!("{resource} {:?} is forbidden", attrs.name)
        };
        let scope = if attrs.namespace.is_empty() {
            " at the cluster scope".to_owned()
        } else {
            format!(" in the namespace {:?}", attrs.namespace)
        };
        format!(
            "{subject}: User {:?} cannot {verb} resource {resource:?} in API group {:?}{scope} {place}",
            identity.user, attrs.api_group
        )
    };
    GatewayError::Forbidden {
        message,
        kind: attrs.resource.to_owned(),
        name: attrs.name.to_owned(),
    }
}

pub(crate) fn starts_with_ignore_case(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
}

#[cfg(test)]
mod tests {
    use super::upstream::EXTRA_KEY_ESCAPES;
    use super::*;
    use base64::Engine;
    use fleetgate_config_watcher::auth::{Jwk, JwtAlgorithm, OidcVerifierConfig};

    #[test]
    fn identity_headers_are_recognized_in_any_case() {
        assert!(is_identity_header(b"AUTHORIZATION"));
        assert!(is_identity_header(b"impersonate-user"));
        assert!(is_identity_header(b"Impersonate-Extra-Scopes"));
        // `_` reads as `-`, as CGI / WSGI backends read it.
        assert!(is_identity_header(b"Impersonate_User"));
        assert!(is_identity_header(b"AUTHORIZATION"));
        assert!(is_remote_identity(b"X_Remote_Group"));
        assert!(!is_identity_header(b"Impersonate"));
        assert!(!is_remote_identity(b"X_Remote"));
        let fields = [(&b"X_Trace_Id"[..], &b"1"[..]), (b"Impersonate_Uid", b"0")];
        assert!(check_field_names(fields[..1].iter().copied()).is_ok());
        assert!(check_field_names(fields.iter().copied()).is_err());
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

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
    }

    #[test]
    fn client_impersonation_headers_are_collected() {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b"Impersonate-User", b"alice"),
            (b"impersonate-group", b"devs"),
            (b"Impersonate-Group", b"ops"),
            (b"Impersonate-Uid", b"u-1"),
            (b"Impersonate-Extra-Acme.com%2Fproject", b"p1"),
            (b"Accept", b"*/*"),
        ];
        let wanted = requested_impersonation(headers.into_iter())
            .unwrap()
            .unwrap();
        assert_eq!(wanted.user, "alice");
        assert_eq!(wanted.groups, vec!["devs", "ops"]);
        assert_eq!(wanted.uid.as_deref(), Some("u-1"));
        assert_eq!(
            wanted.extra,
            vec![("acme.com/project".to_string(), vec!["p1".to_string()])]
        );
        let group_only: Vec<(&[u8], &[u8])> = vec![(b"Impersonate-Group", b"devs")];
        assert!(requested_impersonation(group_only.into_iter()).is_err());
        let none: Vec<(&[u8], &[u8])> = vec![(b"Accept", b"*/*")];
        assert!(requested_impersonation(none.into_iter()).unwrap().is_none());
    }

    /// A 2048-bit RSA key (PKCS#1 DER, base64) for RS256 tests: ring cannot generate RSA keys.
    const TEST_RSA_PKCS1: &str = concat!(
        "MIIEowIBAAKCAQEAz9+X8WNYqMmFB5AQH0HV75OVTzGCl6WwZHH+lyAm1GEVIJZMsUSmJv76OMnrH4l18pOTQKu9ci",
        "i/tKzCBEZoPngnFK3CeePG9Pua+6MmJyVVS1LRej4YKO7ZwtmJws7OHtJb6z6+NwjW07bTVB/Q/HmGL+nMsX5VD6xl",
        "lJQEbnU1HdfullLm3vZoB+Z3/Dzi1YxbTgPHQzxFL07FX5F77YGlXnwM1b51w9JuFQcCyeQWipDDVvmjWlsyQeynlR",
        "SZEdAXPGB8A6OQHKCZMuvukiemXfD/tAhoemY8rWBXXwfK40HpAv2+tUEjbS+7Usy6xulhC3eQH1afPQGRET9QIwID",
        "AQABAoIBAC0OxLMUeyu+3qB4iB4WWaaAAW20iB+R0Q28rdgZJoGDd55kJcSI4lDylM9JaTchRxkpBtKOR1ae4YrqpX",
        "Viw4bC6YmwbkaYalBA12OzBfqXO4lDrtdF7Vu2BiqXl6ZLyF7i7vyrUXTBbDtg1ibWbKjFOKJbFbzlas+maTBO8zTz",
        "u+S5eHOoxPiNKmIDNAAPGBxgprNubf0hPnrE6Mg63e2wtsQIb19tuBxrfD1y8EkVgnd2Q49hL+WE95aVpLNMBrMWPK",
        "XONc2a8uxnlgr24bEIR2pPxwDCEagVonn6YnLgzuOnGOOgjjlShFNYx9ng1uxnL+eKU4vDAMu9KSPSDTECgYEA60UL",
        "7z56r6pKdhSCOymYVHMXRx04IIPGBo2oMUXiatk+HcmVy9MEc2efBw0Dg4WcXEkvicdSaym/waP4fPnnbOm2Y88PRQ",
        "ygC94NPJ4O0/lvu0T/Cblql8PZ0AQzM8rEASPYPvyvzqwBaY52XvhnUHL9bOVd7fJfG/6wr7ArlfMCgYEA4jCSTvVa",
        "1LSFQTtUoYnczmfHIw59ZVImceIrJoUdTvjOUhKA5T199j9WjxWnCQLijkHVzbOlZPW1F1SBFkUzyUyjtkFt4B13Zr",
        "zE0l349js5m9j+VfM+l8W55AyXvFJwEgEeRZIKr2xhEAXUAGNbtunbIme2C/6Wo4PXrAu7+RECgYAGqa3s2Jgg4XG6",
        "ZlpJ0qO9wISoPuuYACNbjCd3PcNrwzs/HLZhT1iQ7B5U1MmEsAP9mRT/keWDo2sK0Nn4sBsduoCv0u1bxz/BFkjJrr",
        "A80JOZehq+68FZCvLgMT5B+TwTzDATmJRiBf0EQESZ6+8BGECVFOnUE0keQdg/IX4agQKBgQCbqW2nJTdjVvC12cz+",
        "dtAcxFLJj3lAt255xXqIwedPp+7lkJJgMRd01lYNlosjqnacDDbFn7JdbrM34RINb4aaLEImdZTWPbEkZRjW5ZEmc8",
        "/Lr2QpZoNXE95AUWJDWkCCQ36/xifQXjfWPQyPT9GYagxC+zjPvF+THHLaliDA4QKBgHbzZyuD6QpzoWT7E59L2yzd",
        "v2SyJBtq4aZJ9LwvMFbvTq+dLJ+kxAKxOYu0arH7h3+53q6eCWEyan7LL8iYLzJvXejNimf/ZPhNW/GEuHmEt0LDWY",
        "wWCKZGUSnlpUTdnj2l+5hIIGNzIjE0z9+DvbaI1pUUz1s+gWrRwxaNZTbp",
    );

    use fleetgate_config_watcher::auth::OidcSettings;

    fn b64url(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    fn settings() -> OidcSettings {
        OidcSettings {
            issuer: "https://issuer.test".into(),
            audiences: vec!["fleetgate".into()],
            jwks: None,
            jwks_url: None,
            ca_pem: None,
            jwks_refresh: std::time::Duration::from_secs(300),
            username_claim: "sub".into(),
            username_prefix: "oidc:".into(),
            groups_claim: Some("groups".into()),
            groups_prefix: "g:".into(),
            uid_claim: Some("uid".into()),
        }
    }

    fn jws(
        alg: &str,
        kid: &str,
        claims: &serde_json::Value,
        sign: impl Fn(&[u8]) -> Vec<u8>,
    ) -> String {
        let header = serde_json::json!({"alg": alg, "kid": kid, "typ": "JWT"});
        let signed = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = sign(signed.as_bytes());
        format!("{signed}.{}", b64url(&signature))
    }

    #[test]
    fn jwts_verify_with_rs256_and_es256_and_every_claim_is_checked() {
        use ring::signature::KeyPair as _;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = base64::engine::general_purpose::STANDARD
            .decode(TEST_RSA_PKCS1)
            .unwrap();
        let rsa = ring::signature::RsaKeyPair::from_der(&pkcs8).unwrap();
        let rsa_public = rsa.public_key();
        let rsa_components: ring::rsa::PublicKeyComponents<Vec<u8>> = rsa_public.into();
        let ec_alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let ec_pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(ec_alg, &rng).unwrap();
        let ec =
            ring::signature::EcdsaKeyPair::from_pkcs8(ec_alg, ec_pkcs8.as_ref(), &rng).unwrap();
        let keys = vec![
            Jwk {
                kid: Some("rsa".into()),
                algorithm: JwtAlgorithm::Rs256,
                n_or_point: rsa_components.n.clone(),
                e: rsa_components.e.clone(),
            },
            Jwk {
                kid: Some("ec".into()),
                algorithm: JwtAlgorithm::Es256,
                n_or_point: ec.public_key().as_ref().to_vec(),
                e: Vec::new(),
            },
        ];
        let oidc = OidcVerifierConfig {
            settings: settings(),
            keys: Arc::new(arc_swap::ArcSwap::from_pointee(keys)),
            refetch: None,
        };
        let sign_rsa = |m: &[u8]| {
            let mut sig = vec![0; rsa.public().modulus_len()];
            rsa.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, m, &mut sig)
                .unwrap();
            sig
        };
        let sign_ec = |m: &[u8]| ec.sign(&rng, m).unwrap().as_ref().to_vec();
        let now = 1_900_000_000u64;
        let claims = serde_json::json!({
            "iss": "https://issuer.test", "aud": ["other", "fleetgate"], "sub": "alice",
            "groups": ["devs", "ops"], "uid": "u-1", "exp": now + 60, "nbf": now - 1,
        });
        let verify = |token: &str| verify_jwt(&oidc, token.as_bytes(), now);

        let (who, expires) = verify(&jws("RS256", "rsa", &claims, sign_rsa)).unwrap();
        assert_eq!(who.user, "oidc:alice");
        assert_eq!(who.groups, vec!["g:devs", "g:ops"]);
        assert_eq!(who.uid.as_deref(), Some("u-1"));
        assert_eq!(expires, now + 60);
        assert!(verify(&jws("ES256", "ec", &claims, sign_ec)).is_ok());

        // Signed by the RSA key but claiming the EC key id, or the other way round: refused.
        assert!(verify(&jws("ES256", "rsa", &claims, sign_ec)).is_err());
        assert!(verify(&jws("RS256", "ec", &claims, sign_rsa)).is_err());
        // A payload changed after signing.
        let good = jws("ES256", "ec", &claims, sign_ec);
        let mut parts: Vec<&str> = good.split('.').collect();
        let mut forged_claims = claims.clone();
        forged_claims["sub"] = "admin".into();
        let forged_payload = b64url(forged_claims.to_string().as_bytes());
        parts[1] = &forged_payload;
        assert!(verify(&parts.join(".")).is_err());
        // alg none and HS256 are never accepted.
        assert!(verify(&jws("none", "ec", &claims, |_| Vec::new())).is_err());
        assert!(verify(&jws("HS256", "ec", &claims, sign_ec)).is_err());
        // Each claim check.
        for (field, value) in [
            ("exp", serde_json::json!(now)),
            ("nbf", serde_json::json!(now + 30)),
            ("aud", serde_json::json!("someone-else")),
            ("iss", serde_json::json!("https://evil.test")),
            ("sub", serde_json::json!("")),
        ] {
            let mut bad = claims.clone();
            bad[field] = value;
            assert!(
                verify(&jws("ES256", "ec", &bad, sign_ec)).is_err(),
                "{field} not checked"
            );
        }
        let mut no_exp = claims.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert!(verify(&jws("ES256", "ec", &no_exp, sign_ec)).is_err());
    }

    #[test]
    fn extra_keys_are_percent_encoded_like_client_go() {
        let encoded: String =
            percent_encoding::utf8_percent_encode("acme.com/project", EXTRA_KEY_ESCAPES).collect();
        assert_eq!(encoded, "acme.com%2Fproject");
    }
}
