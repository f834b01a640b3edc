//! What the member is told about the user: the cluster's own credentials, then
//! `Impersonate-User` / `-Group` / `-Uid` / `-Extra-*` for the identity the gateway decided, and
//! which client headers never reach a member because they are the gateway's to write. Called by
//! the exchange (`exchange::member_head`) while it builds the member's request head.

use fleetgate_config_watcher::ClusterRoute;

use super::ClientIdentity;
use crate::codec::http1::push_header;
use crate::errors::GatewayError;

/// Whether a client header is dropped because identity headers are the gateway's to write
/// (except on a PassThrough cluster, where the client speaks for itself). `_` reads as `-`
/// (see [`reads_as`]).
pub fn is_identity_header(name: &[u8]) -> bool {
    reads_as(name, b"authorization") || reads_as_prefix(name, b"impersonate-")
}

/// Whether a field name is kube's request-header authentication (`X-Remote-User`, `-Group`,
/// `-Extra-*`), which no client may send to a member; `_` reads as `-`.
pub fn is_remote_identity(name: &[u8]) -> bool {
    reads_as_prefix(name, b"x-remote-")
}

/// Refuses a request with a field name holding `_` that reads as an identity field
/// (`Authorization`, `Impersonate-*`, `X-Remote-*`) once `_` is read as `-`. A Go apiserver
/// ignores `Impersonate_User`, but a backend that maps `_` to `-` (CGI and WSGI do, and so do
/// some proxies: an agent's in-cluster service may sit behind one) would honour it. No client
/// has a reason to send one, so it is refused rather than dropped.
pub fn check_field_names<'h>(
    mut headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) -> Result<(), GatewayError> {
    let underscored_identity = |name: &[u8]| {
        name.contains(&b'_') && (is_identity_header(name) || is_remote_identity(name))
    };
    match headers.find(|(name, _)| underscored_identity(name)) {
        Some((name, _)) => Err(GatewayError::UnderscoredIdentityField {
            name: String::from_utf8_lossy(name).into_owned(),
        }),
        None => Ok(()),
    }
}

/// `name` equals the lower-case `expected`, ignoring ASCII case and reading `_` as `-`.
fn reads_as(name: &[u8], expected: &[u8]) -> bool {
    name.len() == expected.len() && reads_as_prefix(name, expected)
}

/// `name` starts with the lower-case `prefix`, ignoring ASCII case and reading `_` as `-`.
fn reads_as_prefix(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len()
        && name.iter().zip(prefix).all(|(&n, &p)| {
            let n = if n == b'_' {
                b'-'
            } else {
                n.to_ascii_lowercase()
            };
            n == p
        })
}

/// Which client headers to drop on their way to `cluster`.
pub fn drops_client_header(cluster: &ClusterRoute, name: &[u8]) -> bool {
    !cluster.pass_through && is_identity_header(name)
}

/// Appends the cluster's credentials and, when the cluster impersonates, the identity: one
/// `Impersonate-Group` per group, `Impersonate-Uid` when known, `Impersonate-Extra-KEY` per
/// value (the key percent-encoded as client-go does). Nothing on a PassThrough cluster.
pub fn push_upstream_identity(
    out: &mut Vec<u8>,
    cluster: &ClusterRoute,
    identity: Option<&ClientIdentity>,
) {
    if cluster.pass_through {
        return;
    }
    if let Some(authorization) = &cluster.authorization {
        push_header(out, b"Authorization", authorization.as_bytes());
    }
    let Some(identity) = identity.filter(|_| cluster.impersonation) else {
        return;
    };
    push_header(out, b"Impersonate-User", identity.user.as_bytes());
    for group in &identity.groups {
        push_header(out, b"Impersonate-Group", group.as_bytes());
    }
    if let Some(uid) = &identity.uid {
        push_header(out, b"Impersonate-Uid", uid.as_bytes());
    }
    for (key, values) in &identity.extra {
        for value in values {
            out.extend_from_slice(b"Impersonate-Extra-");
            out.extend(
                percent_encoding::utf8_percent_encode(key, EXTRA_KEY_ESCAPES).flat_map(str::bytes),
            );
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Characters client-go escapes in an `Impersonate-Extra-` key (it keeps only the token
/// characters of a header name, RFC 7230, and percent-encodes the rest).
pub(super) const EXTRA_KEY_ESCAPES: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'\'')
        .remove(b'*')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
