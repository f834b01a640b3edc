//! Authentication settings, resolved and compiled: the Gateway's `spec.auth` with its token file
//! read and parsed (kube-apiserver's `--token-auth-file` CSV), its OIDC settings defaulted and
//! its JWKS parsed into public keys the data path can verify signatures with.
//!
//! Builds values off the hot path (at load and at every table build); the data path only looks
//! up a token in [`Authenticators::tokens`] and reads the OIDC keys. Never logs a token: the
//! `Debug` impls redact them. Called by `load` (resolve) and `policy` (compile with the table).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::jwks::{parse_jwks, Jwk, JwtAlgorithm, Refetch, REFETCH_MIN_INTERVAL};
use crate::objects::{AuthSpec, AuthorizationMode};

/// The group every authenticated user is in (kube-apiserver adds it; so does the check).
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Kubernetes' anonymous user.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// Who a client is, once authenticated: the user name, groups, and (when the method knows
/// them) uid and extra attributes, as Kubernetes' `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    /// Extra attributes (`Impersonate-Extra-KEY`), in key order.
    pub extra: Vec<(String, Vec<String>)>,
}

/// Why a verified client certificate still gives no identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("client certificate could not be parsed")]
    Unparsable,
    #[error("client certificate has no subject common name (the user name)")]
    NoCommonName,
}

impl Identity {
    /// Whether every name can reach a member in an `Impersonate-*` field exactly as it is: no
    /// control character (a CR or LF would end the field and start another, or a request), and
    /// no space or tab at either end (a member trims them: a group ` system:masters` from an
    /// identity provider would arrive as `system:masters`). kube-apiserver judges such names as
    /// they are; an impersonating gateway writes them into headers, so it refuses them.
    pub fn fits_in_a_header(&self) -> bool {
        let fits = |text: &str| {
            !text.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
                && !text.starts_with([' ', '\t'])
                && !text.ends_with([' ', '\t'])
        };
        fits(&self.user)
            && self.groups.iter().all(|g| fits(g))
            && self.uid.as_deref().is_none_or(fits)
            && self
                .extra
                .iter()
                .all(|(_, values)| values.iter().all(|v| fits(v)))
    }

    /// Kubernetes' anonymous user: the identity of a client on a listener that does not
    /// authenticate (the plaintext benchmark listener).
    pub fn anonymous() -> Self {
        Identity {
            user: ANONYMOUS_USER.to_string(),
            groups: vec!["system:unauthenticated".to_string()],
            ..Identity::default()
        }
    }

    /// Reads CN (user) and O (groups) from a DER certificate that rustls has already verified,
    /// as kube-apiserver does.
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
        Ok(Identity {
            user,
            groups,
            ..Identity::default()
        })
    }
}

/// The Gateway's `spec.auth`, resolved.
#[derive(Clone, PartialEq, Default)]
pub struct AuthSettings {
    /// Entries of the token file (empty without one).
    pub tokens: Vec<StaticToken>,
    pub oidc: Option<OidcSettings>,
    pub authorization_mode: AuthorizationMode,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("tokens", &self.tokens.len())
            .field("oidc", &self.oidc)
            .field("authorization_mode", &self.authorization_mode)
            .finish()
    }
}

/// One line of the token file.
#[derive(Clone, PartialEq)]
pub struct StaticToken {
    pub token: String,
    pub identity: Identity,
}

/// `spec.auth.oidc`, defaulted. `jwks` is the JWKS document read from `jwksFile`.
#[derive(Debug, Clone, PartialEq)]
pub struct OidcSettings {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub jwks: Option<String>,
    pub jwks_url: Option<String>,
    /// PEM of the CA for an https `jwks_url`.
    pub ca_pem: Option<Vec<u8>>,
    pub jwks_refresh: Duration,
    pub username_claim: String,
    pub username_prefix: String,
    pub groups_claim: Option<String>,
    pub groups_prefix: String,
    pub uid_claim: Option<String>,
}

/// Resolves `spec.auth` (files relative to `base`). Errors name the field.
pub(crate) fn resolve_auth(
    spec: Option<AuthSpec>,
    base: &Path,
) -> Result<AuthSettings, (&'static str, String)> {
    let Some(spec) = spec else {
        return Ok(AuthSettings::default());
    };
    let tokens = match &spec.token_file {
        None => Vec::new(),
        Some(file) => {
            let text = std::fs::read_to_string(base.join(file))
                .map_err(|e| ("spec.auth.tokenFile", format!("{file}: {e}")))?;
            parse_token_csv(&text).map_err(|m| ("spec.auth.tokenFile", format!("{file}: {m}")))?
        }
    };
    let oidc = match spec.oidc {
        None => None,
        Some(o) => {
            if o.issuer_url.is_empty() {
                return Err(("spec.auth.oidc.issuerURL", "is required".into()));
            }
            let mut audiences = o.audiences;
            if let Some(id) = o.client_id {
                audiences.insert(0, id);
            }
            if audiences.is_empty() {
                return Err((
                    "spec.auth.oidc.clientID",
                    "a client id (or audiences) is required".into(),
                ));
            }
            let jwks = match (&o.jwks_file, &o.jwks_url) {
                (Some(_), Some(_)) => {
                    return Err((
                        "spec.auth.oidc.jwksFile",
                        "set jwksFile or jwksURL, not both".into(),
                    ))
                }
                (None, None) => {
                    return Err((
                        "spec.auth.oidc.jwksFile",
                        "jwksFile or jwksURL is required".into(),
                    ))
                }
                (Some(file), None) => {
                    let text = std::fs::read_to_string(base.join(file))
                        .map_err(|e| ("spec.auth.oidc.jwksFile", format!("{file}: {e}")))?;
                    parse_jwks(&text).map_err(|m| ("spec.auth.oidc.jwksFile", m))?;
                    Some(text)
                }
                (None, Some(url)) => {
                    let uri: http::Uri = url
                        .parse()
                        .map_err(|e| ("spec.auth.oidc.jwksURL", format!("{url:?}: {e}")))?;
                    if !matches!(uri.scheme_str(), Some("http" | "https")) {
                        return Err((
                            "spec.auth.oidc.jwksURL",
                            format!("{url:?}: the scheme must be https or http"),
                        ));
                    }
                    None
                }
            };
            let ca_pem = match (o.ca_data, &o.ca_file) {
                (Some(_), Some(_)) => {
                    return Err((
                        "spec.auth.oidc.caFile",
                        "set caFile or caData, not both".into(),
                    ))
                }
                (Some(data), None) => Some(data.into_bytes()),
                (None, Some(file)) => Some(
                    std::fs::read(base.join(file))
                        .map_err(|e| ("spec.auth.oidc.caFile", format!("{file}: {e}")))?,
                ),
                (None, None) => None,
            };
            if let Some(pem) = &ca_pem {
                crate::endpoint::parse_certs(pem).map_err(|m| ("spec.auth.oidc.caFile", m))?;
            }
            Some(OidcSettings {
                issuer: o.issuer_url,
                audiences,
                jwks,
                jwks_url: o.jwks_url,
                ca_pem,
                jwks_refresh: Duration::from_secs(o.jwks_refresh_seconds.unwrap_or(300).max(1)),
                username_claim: o.username_claim.unwrap_or_else(|| "sub".into()),
                username_prefix: o.username_prefix.unwrap_or_default(),
                groups_claim: o.groups_claim,
                groups_prefix: o.groups_prefix.unwrap_or_default(),
                uid_claim: o.uid_claim,
            })
        }
    };
    Ok(AuthSettings {
        tokens,
        oidc,
        authorization_mode: spec.authorization_mode,
    })
}

/// Parses kube-apiserver's token file: `token,user,uid[,"group1,group2"]` per line, with CSV
/// quoting; blank lines and `#` comments are skipped.
pub fn parse_token_csv(text: &str) -> Result<Vec<StaticToken>, String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_csv_line(line).map_err(|m| format!("line {}: {m}", index + 1))?;
        if fields.len() < 3 {
            return Err(format!(
                "line {}: at least token, user and uid are required",
                index + 1
            ));
        }
        let token = fields[0].trim().to_owned();
        if token.is_empty() || fields[1].trim().is_empty() {
            return Err(format!("line {}: empty token or user", index + 1));
        }
        if !seen.insert(token.clone()) {
            return Err(format!("line {}: a token is listed twice", index + 1));
        }
        let groups = fields
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let uid = fields[2].trim();
        out.push(StaticToken {
            token,
            identity: Identity {
                user: fields[1].trim().to_owned(),
                groups,
                uid: (!uid.is_empty()).then(|| uid.to_owned()),
                extra: Vec::new(),
            },
        });
    }
    Ok(out)
}

fn split_csv_line(line: &str) -> Result<Vec<String>, &'static str> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote");
    }
    fields.push(field);
    Ok(fields)
}

/// What the data path authenticates with: the token file as a map, the OIDC settings with
/// their keys. Built with every table.
#[derive(Default)]
pub struct Authenticators {
    pub tokens: ahash::AHashMap<String, Arc<Identity>>,
    pub oidc: Option<OidcVerifierConfig>,
}

impl std::fmt::Debug for Authenticators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticators")
            .field("tokens", &self.tokens.len())
            .field("oidc", &self.oidc.as_ref().map(|o| &o.settings.issuer))
            .finish()
    }
}

/// OIDC settings plus the keys currently trusted (swapped when `jwksURL` is fetched again).
pub struct OidcVerifierConfig {
    pub settings: OidcSettings,
    pub keys: Arc<arc_swap::ArcSwap<Vec<Jwk>>>,
    /// With a `jwksURL`: asks the fetcher for the keys again (rate-limited).
    pub refetch: Option<Arc<crate::jwks::Refetch>>,
}

impl OidcVerifierConfig {
    /// A token named a `kid` none of the known keys has: the issuer may have rotated its key, so
    /// ask for its keys again (at most once per `jwks::REFETCH_MIN_INTERVAL`; never blocks).
    /// Nothing to do for a `jwksFile`: the file source reloads it when it changes.
    pub fn unknown_kid(&self) {
        if let Some(refetch) = &self.refetch {
            refetch.request();
        }
    }
}

impl Authenticators {
    pub(crate) fn build(settings: &AuthSettings) -> Authenticators {
        let tokens = settings
            .tokens
            .iter()
            .map(|t| (t.token.clone(), Arc::new(t.identity.clone())))
            .collect();
        let oidc = settings.oidc.as_ref().map(|o| {
            let (keys, refetch) = match &o.jwks_url {
                // Shared by every table that names the URL, refreshed by one fetcher thread.
                Some(url) => {
                    let (keys, refetch) =
                        crate::jwks::shared_keys(url, o.jwks_refresh, o.ca_pem.clone());
                    (keys, Some(refetch))
                }
                // Validated at load: a jwksFile document parses.
                None => (
                    Arc::new(arc_swap::ArcSwap::from_pointee(
                        o.jwks
                            .as_deref()
                            .and_then(|text| parse_jwks(text).ok())
                            .unwrap_or_default(),
                    )),
                    None,
                ),
            };
            OidcVerifierConfig {
                settings: o.clone(),
                keys,
                refetch,
            }
        });
        Authenticators { tokens, oidc }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_fits_in_a_header_unless_it_could_end_one_or_be_trimmed() {
        let with = |edit: fn(&mut Identity)| {
            let mut identity = Identity {
                user: "alice smith".into(),
                groups: vec!["dev\tops".into()],
                uid: Some("u-1".into()),
                extra: vec![("scopes".into(), vec!["read write".into()])],
            };
            edit(&mut identity);
            identity.fits_in_a_header()
        };
        assert!(with(|_| {}));
        assert!(Identity::anonymous().fits_in_a_header());
        assert!(!with(|i| i
            .user
            .push_str("\r\nImpersonate-Group: system:masters")));
        assert!(!with(|i| i.groups.push(" system:masters".into())));
        assert!(!with(|i| i.groups[0].push('\t')));
        assert!(!with(|i| i.uid = Some("u-1\n".into())));
        assert!(!with(|i| i.extra[0].1.push("x\u{7f}".into())));
        assert!(!with(|i| i.user.insert(0, '\0')));
    }

    #[test]
    fn token_file_lines_parse_like_kube_apiserver() {
        let tokens = parse_token_csv(
            "# comment\nt1,alice,alice-uid,\"devs,ops\"\n\nt2,bob,bob-uid\nt3,carol,,\"\"\n",
        )
        .unwrap();
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens[0].identity.user, "alice");
        assert_eq!(tokens[0].identity.groups, vec!["devs", "ops"]);
        assert_eq!(tokens[0].identity.uid.as_deref(), Some("alice-uid"));
        assert!(tokens[1].identity.groups.is_empty());
        assert_eq!(tokens[2].identity.uid, None);
        assert!(parse_token_csv("t1,alice,u\nt1,bob,u\n").is_err());
        assert!(parse_token_csv("t1,alice\n").is_err());
        assert!(parse_token_csv("t1,alice,u,\"open\n").is_err());
    }

    #[test]
    fn jwks_keeps_rsa_and_p256_keys() {
        let jwks = r#"{"keys":[
            {"kty":"EC","crv":"P-256","kid":"a","x":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","y":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
            {"kty":"RSA","kid":"b","n":"AQAB","e":"AQAB"},
            {"kty":"oct","k":"AAAA"}]}"#;
        let keys = parse_jwks(jwks).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].algorithm, JwtAlgorithm::Es256);
        assert_eq!(keys[0].n_or_point.len(), 65);
        assert_eq!(keys[1].kid.as_deref(), Some("b"));
        assert!(parse_jwks(r#"{"keys":[]}"#).is_err());
    }
}
