//! Client impersonation: the `Impersonate-*` headers a client sends to act as someone else, as
//! kube-apiserver's impersonation filter reads them, each identity checked against the
//! AccessPolicy's `impersonate` grants, and what an impersonated identity may do without a grant
//! of its own. Refused where the member would see the gateway itself. Called by `auth::decide`.

use fleetgate_config_watcher::policy::{is_basic, AccessControl, RequestAttributes};

use super::{starts_with_ignore_case, ClientIdentity};
use crate::errors::GatewayError;

/// The identity a client asks to act as with `Impersonate-*` headers, if it sends any.
pub(super) fn requested_impersonation<'h, H>(
    headers: H,
) -> Result<Option<ClientIdentity>, GatewayError>
where
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    let mut wanted: Option<ClientIdentity> = None;
    let mut user = None;
    for (name, value) in headers {
        if !starts_with_ignore_case(name, b"impersonate-") {
            continue;
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| GatewayError::BadRequest {
                reason: "an Impersonate-* header is not text",
            })?
            .trim();
        let w = wanted.get_or_insert_with(ClientIdentity::default);
        let suffix = &name[b"impersonate-".len()..];
        if suffix.eq_ignore_ascii_case(b"user") {
            user = Some(value.to_owned());
        } else if suffix.eq_ignore_ascii_case(b"group") {
            w.groups.push(value.to_owned());
        } else if suffix.eq_ignore_ascii_case(b"uid") {
            w.uid = Some(value.to_owned());
        } else if starts_with_ignore_case(suffix, b"extra-") {
            let key = percent_encoding::percent_decode(&suffix[b"extra-".len()..])
                .decode_utf8_lossy()
                .to_ascii_lowercase();
            match w.extra.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value.to_owned()),
                None => w.extra.push((key, vec![value.to_owned()])),
            }
        } else {
            return Err(GatewayError::BadRequest {
                reason: "unknown Impersonate-* header",
            });
        }
    }
    match (wanted, user) {
        (None, _) => Ok(None),
        (Some(mut w), Some(user)) if !user.is_empty() => {
            w.user = user;
            w.extra.sort();
            Ok(Some(w))
        }
        (Some(_), _) => Err(GatewayError::BadRequest {
            reason: "Impersonate-Group, -Uid or -Extra without Impersonate-User",
        }),
    }
}

/// Every identity the client asks for must be granted to it with the `impersonate` verb.
pub(super) fn check_impersonation(
    access: &AccessControl,
    client: &ClientIdentity,
    cluster: &str,
    wanted: &ClientIdentity,
) -> Result<(), GatewayError> {
    let policy = &access.policy;
    let deny = |kind: &str, name: &str| {
        GatewayError::Forbidden {
        message: format!(
            "{kind} {name:?} is forbidden: User {:?} cannot impersonate resource {kind:?} in API group \"\" on cluster {cluster:?}",
            client.user
        ),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
    };
    if !policy.allows_impersonation(client, cluster, "users", "", &wanted.user) {
        return Err(deny("users", &wanted.user));
    }
    for group in &wanted.groups {
        if !policy.allows_impersonation(client, cluster, "groups", "", group) {
            return Err(deny("groups", group));
        }
    }
    if let Some(uid) = &wanted.uid {
        if !policy.allows_impersonation(client, cluster, "uids", "", uid) {
            return Err(deny("uids", uid));
        }
    }
    for (key, values) in &wanted.extra {
        for value in values {
            if !policy.allows_impersonation(client, cluster, "userextras", key, value) {
                return Err(deny(&format!("userextras/{key}"), value));
            }
        }
    }
    Ok(())
}

/// What an identity the client was allowed to impersonate may do on a cluster though no
/// AccessPolicy grants it anything there: what kube lets every authenticated user do
/// (`system:basic-user`, `system:discovery`), its self reviews and discovery. So `kubectl auth
/// can-i ... --as USER` gets the member's answer for USER (the impersonator may reach the cluster:
/// its `impersonate` grant is there), and kubectl's discovery beforehand, which carries the same
/// `Impersonate-*` fields, resolves the resource. A self review answers only about whoever the
/// member sees, so the impersonator learns what it could learn by impersonating USER anyway;
/// nothing else of USER's becomes allowed.
pub(super) fn allowed_to_impersonated(attrs: &RequestAttributes<'_>) -> bool {
    is_basic(attrs)
}

/// Refuses a request that tries to choose its own identity on a cluster the gateway does not
/// impersonate on (`impersonation: false`: the member would see the gateway's own identity).
pub fn check_request<'h>(
    mut headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) -> Result<(), GatewayError> {
    if headers.any(|(name, _)| starts_with_ignore_case(name, b"impersonate-")) {
        return Err(GatewayError::ClientImpersonation);
    }
    Ok(())
}
