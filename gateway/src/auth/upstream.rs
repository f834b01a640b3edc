//! What the member is told about the user: the cluster's own credentials, then
//! `Impersonate-User` / `-Group` / `-Uid` / `-Extra-*` for the identity the gateway decided, and
//! which client headers never reach a member because they are the gateway's to write. Called by
//! the front-ends while they build the member's request head.

use fleetgate_config_watcher::ClusterRoute;

use super::{starts_with_ignore_case, ClientIdentity};
use crate::protocol::http1::push_header;

/// Whether a client header is dropped because identity headers are the gateway's to write
/// (except on a PassThrough cluster, where the client speaks for itself).
pub fn is_identity_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"authorization") || starts_with_ignore_case(name, b"impersonate-")
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
