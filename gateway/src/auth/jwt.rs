//! OIDC ID tokens: a compact JWS (RS256 or ES256, checked with ring against the issuer's keys
//! the config-watcher keeps fresh) and the identity its claims name, as kube-apiserver's OIDC
//! authenticator reads them. Never logs a token; never does I/O. Called by `auth::decide` through
//! the connection's token cache.

use base64::Engine;
use fleetgate_config_watcher::auth::{Jwk, JwtAlgorithm, OidcVerifierConfig};

use super::ClientIdentity;

/// Verifies a compact JWS (RS256 or ES256) against the issuer's keys and reads the identity
/// from its claims. Returns the identity and the token's expiry (seconds since the epoch).
pub fn verify_jwt(
    oidc: &OidcVerifierConfig,
    token: &[u8],
    now: u64,
) -> Result<(ClientIdentity, u64), &'static str> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = std::str::from_utf8(token).map_err(|_| "token is not text")?;
    let mut parts = token.splitn(3, '.');
    let (Some(header), Some(payload), Some(signature)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT");
    };
    let header = json_part(header, "JWT header is not base64url JSON")?;
    let algorithm = header
        .get("alg")
        .and_then(|a| a.as_str())
        .and_then(JwtAlgorithm::from_name)
        .ok_or("JWT algorithm is not RS256 or ES256")?;
    let kid = header.get("kid").and_then(|k| k.as_str());
    let signature = b64
        .decode(signature)
        .map_err(|_| "JWT signature is not base64url")?;
    let signed = &token.as_bytes()[..header_and_payload_len(token)];
    let keys = oidc.keys.load();
    let verified = keys
        .iter()
        .filter(|k| k.algorithm == algorithm && (kid.is_none() || k.kid.as_deref() == kid))
        .any(|key| verify_signature(key, signed, &signature));
    if !verified {
        if let Some(kid) = kid {
            if !keys.iter().any(|k| k.kid.as_deref() == Some(kid)) {
                // Perhaps a key the issuer rotated in since the last fetch.
                oidc.unknown_kid();
                return Err("JWT key id is not among the issuer's keys (asked for them again)");
            }
        }
        return Err("JWT signature does not verify with any issuer key");
    }
    let claims = json_part(payload, "JWT payload is not base64url JSON")?;
    let settings = &oidc.settings;
    if claims.get("iss").and_then(|i| i.as_str()) != Some(settings.issuer.as_str()) {
        return Err("JWT issuer does not match");
    }
    let audience_ok = match claims.get("aud") {
        Some(serde_json::Value::String(aud)) => settings.audiences.iter().any(|a| a == aud),
        Some(serde_json::Value::Array(auds)) => auds
            .iter()
            .filter_map(|a| a.as_str())
            .any(|aud| settings.audiences.iter().any(|a| a == aud)),
        _ => false,
    };
    if !audience_ok {
        return Err("JWT audience does not match the client id");
    }
    let expires = claims
        .get("exp")
        .and_then(|e| e.as_f64())
        .ok_or("JWT has no exp")? as u64;
    if expires <= now {
        return Err("JWT expired");
    }
    if let Some(nbf) = claims.get("nbf").and_then(|n| n.as_f64()) {
        if nbf as u64 > now {
            return Err("JWT not valid yet");
        }
    }
    // As kube-apiserver: an email is a user name only once the issuer has verified it.
    if settings.username_claim == "email"
        && claims.get("email_verified").and_then(|v| v.as_bool()) == Some(false)
    {
        return Err("JWT email is not verified");
    }
    let user = claims
        .get(&settings.username_claim)
        .and_then(|u| u.as_str())
        .filter(|u| !u.is_empty())
        .ok_or("JWT has no username claim")?;
    let groups = match settings.groups_claim.as_deref().and_then(|c| claims.get(c)) {
        Some(serde_json::Value::String(g)) => vec![format!("{}{g}", settings.groups_prefix)],
        Some(serde_json::Value::Array(gs)) => gs
            .iter()
            .filter_map(|g| g.as_str())
            .map(|g| format!("{}{g}", settings.groups_prefix))
            .collect(),
        _ => Vec::new(),
    };
    let uid = settings
        .uid_claim
        .as_deref()
        .and_then(|c| claims.get(c))
        .and_then(|u| u.as_str())
        .map(str::to_owned);
    Ok((
        ClientIdentity {
            user: format!("{}{user}", settings.username_prefix),
            groups,
            uid,
            extra: Vec::new(),
        },
        expires,
    ))
}

/// One JWT part (its header or payload) read: base64url, then JSON; `Err(what)` when either fails.
fn json_part(part: &str, what: &'static str) -> Result<serde_json::Value, &'static str> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or(what)
}

fn header_and_payload_len(token: &str) -> usize {
    token.rfind('.').unwrap_or(token.len())
}

fn verify_signature(key: &Jwk, message: &[u8], signature: &[u8]) -> bool {
    match key.algorithm {
        JwtAlgorithm::Rs256 => ring::signature::RsaPublicKeyComponents {
            n: &key.n_or_point,
            e: &key.e,
        }
        .verify(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            message,
            signature,
        )
        .is_ok(),
        JwtAlgorithm::Es256 => ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            &key.n_or_point,
        )
        .verify(message, signature)
        .is_ok(),
    }
}
