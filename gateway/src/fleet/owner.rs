//! A named object through the fleet view (GET, UPDATE, PATCH, DELETE and the subresources: log,
//! exec, attach, portforward, status, scale) goes to the one cluster that has it. Each member the
//! request may span is asked for the object itself, as the user (at most
//! `spec.fleet.membersAtOnce` at a time); the one that answers 200 owns it,
//! and the request then goes there as an ordinary proxied request.
//!
//! A member answering 404 or 403 does not have it (for this user). None: kube's 404, but for a
//! server-side apply, which creates a missing object and so is routed as a create is (to
//! `spec.fleet.createIn`, or the 405 of a create). Several: a 409 naming them (all of them
//! clusters the user may reach), to be aimed with `/clusters/NAME/...`. None, with members that
//! could not be asked: a 503 naming those.
//!
//! A plain GET of the object is answered with the owner's answer to the lookup itself (asked
//! with the client's query and `Accept`), stamped with its cluster as list items are: no second
//! request, and the object says where it lives. Anything else (a subresource, a write, an answer
//! that is not JSON) goes to the owner as an ordinary request.

use bytes::Bytes;
use fleetgate_config_watcher::request_info::KubeVerb;
use futures_util::future::join_all;

use super::page::stamp_object;
use super::{FleetClient, View};
use crate::errors::GatewayError;
use crate::exchange::Failure;
use crate::member::ask::{ask, Asked, Missed};
use crate::request::FleetRequest;

/// The one cluster that has the object a fleet request names.
pub(crate) struct Owner {
    /// Its index in `request.members`.
    pub index: usize,
    /// For a plain GET of the object: the object as the owner answered the lookup, stamped
    /// with its cluster (JSON), to answer with.
    pub object: Option<Bytes>,
}

/// The one cluster that has the object `request` names.
pub(crate) async fn find(view: &View<'_>, request: &FleetRequest<'_>) -> Result<Owner, Failure> {
    let (ctx, client_request) = (view.ctx, &view.client_request);
    let path = object_path(request);
    let plain_get = request.info.verb == KubeVerb::Get && request.info.subresource.is_empty();
    let asked = Asked {
        rest: path.as_bytes(),
        query: if plain_get { request.query } else { b"" },
        verb: "get",
    };
    let mut answers = Vec::with_capacity(request.members.len());
    for batch in request.members.chunks(request.settings.members_at_once) {
        let asking = batch
            .iter()
            .map(|(cluster, identity)| ask(ctx, &asked, client_request, cluster, identity));
        answers.extend(join_all(asking).await);
    }
    let mut owners = Vec::new();
    let mut unknown = Vec::new();
    let mut stamped = None;
    for (index, answer) in answers.into_iter().enumerate() {
        let name = request.members[index].0.name.to_string();
        match answer {
            Ok(body) => {
                if plain_get && owners.is_empty() {
                    stamped = stamp_object(&body, &name).map(Bytes::from);
                }
                owners.push(index);
            }
            Err(Missed::Answered(404 | 403, _)) => {}
            Err(_) => unknown.push(name),
        }
    }
    let resource = request.info.resource.to_owned();
    let object = request.info.name.to_owned();
    match owners.as_slice() {
        [one] => Ok(Owner {
            index: *one,
            object: stamped,
        }),
        // Server-side apply of an object no cluster has creates it: routed as a create is.
        [] if unknown.is_empty() && is_apply(request, client_request.header(b"content-type")) => {
            create_in(request).map(|index| Owner {
                index,
                object: None,
            })
        }
        [] if unknown.is_empty() => Err(Failure::Answer(GatewayError::FleetObjectNotFound {
            resource,
            name: object,
        })),
        [] => Err(Failure::Answer(GatewayError::FleetOwnerUnknown {
            resource,
            name: object,
            clusters: unknown.join(", "),
        })),
        several => Err(Failure::Answer(GatewayError::FleetObjectAmbiguous {
            resource,
            name: object,
            clusters: several
                .iter()
                .map(|i| request.members[*i].0.name.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })),
    }
}

/// Whether the request is a server-side apply of the object itself (`PATCH` with an
/// `application/apply-patch+yaml` body, or `+json` / `+cbor`), which kube answers for a missing
/// object by creating it. Other patches of a missing object are kube's 404.
fn is_apply(request: &FleetRequest<'_>, content_type: Option<&[u8]>) -> bool {
    request.info.verb == KubeVerb::Patch
        && request.info.subresource.is_empty()
        && content_type.is_some_and(is_apply_type)
}

/// Whether a `Content-Type` is server-side apply's (`application/apply-patch+FORMAT`, any case,
/// with or without parameters).
fn is_apply_type(value: &[u8]) -> bool {
    const APPLY: &[u8] = b"application/apply-patch+";
    let media = value.split(|b| *b == b';').next().unwrap_or_default();
    let media = crate::codec::http1::head::trim(media);
    media.len() > APPLY.len() && media[..APPLY.len()].eq_ignore_ascii_case(APPLY)
}

/// Where a create through the fleet view goes: `spec.fleet.createIn`'s cluster, when it is one
/// of the request's members (the kind is merged there and the user may make this request
/// there); else the 405 a POST gets, which does not name the cluster.
fn create_in(request: &FleetRequest<'_>) -> Result<usize, Failure> {
    let create_in = request.settings.create_in.as_deref();
    create_in
        .and_then(|name| request.members.iter().position(|(c, _)| *c.name == *name))
        .ok_or_else(|| {
            Failure::Answer(GatewayError::FleetCreate {
                resource: crate::request::fleet_resource_name(&request.info),
            })
        })
}

/// Answers with the owner's object, stamped ([`Owner::object`]).
pub(crate) async fn answer(client: &mut impl FleetClient, object: Bytes) -> Result<(), Failure> {
    client.head("application/json", &[]).await?;
    client.body(object).await?;
    client.end().await
}

/// The object's own path (its subresource left off): `/api/v1/namespaces/NS/pods/NAME`.
fn object_path(request: &FleetRequest<'_>) -> String {
    let info = &request.info;
    let mut path = format!("/{}/", info.api_prefix);
    if !info.api_group.is_empty() {
        path.push_str(info.api_group);
        path.push('/');
    }
    path.push_str(info.api_version);
    // A namespace is its own name, not a namespace of itself.
    let is_namespace = info.api_group.is_empty() && info.resource == "namespaces";
    if !info.namespace.is_empty() && !is_namespace {
        path.push_str("/namespaces/");
        path.push_str(info.namespace);
    }
    path.push('/');
    path.push_str(info.resource);
    path.push('/');
    path.push_str(info.name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetgate_config_watcher::fleet::FleetKind;
    use fleetgate_config_watcher::request_info::RequestInfo;

    fn path_of(method: &[u8], path: &[u8]) -> String {
        let kind = FleetKind {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            resource: "pods".into(),
            clusters: Vec::new(),
        };
        let request = FleetRequest {
            rest: path,
            query: b"",
            info: RequestInfo::parse(method, path, b""),
            kind: &kind,
            members: Vec::new(),
            verb: "get",
            settings: &Default::default(),
        };
        object_path(&request)
    }

    #[test]
    fn only_server_side_apply_patches_are_applies() {
        for (content_type, apply) in [
            ("application/apply-patch+yaml", true),
            ("Application/Apply-Patch+YAML", true),
            (" application/apply-patch+json ; charset=utf-8", true),
            ("application/apply-patch+cbor", true),
            ("application/merge-patch+json", false),
            ("application/strategic-merge-patch+json", false),
            ("application/json-patch+json", false),
            ("application/apply-patch+", false),
            ("application/apply-patch", false),
            ("", false),
        ] {
            assert_eq!(
                is_apply_type(content_type.as_bytes()),
                apply,
                "{content_type:?}"
            );
        }
    }

    #[test]
    fn the_owner_is_asked_for_the_object_not_its_subresource() {
        assert_eq!(
            path_of(b"GET", b"/api/v1/namespaces/default/pods/hello/log"),
            "/api/v1/namespaces/default/pods/hello"
        );
        assert_eq!(
            path_of(b"POST", b"/api/v1/namespaces/default/pods/hello/exec"),
            "/api/v1/namespaces/default/pods/hello"
        );
        assert_eq!(
            path_of(
                b"PATCH",
                b"/apis/apps/v1/namespaces/x/deployments/web/scale"
            ),
            "/apis/apps/v1/namespaces/x/deployments/web"
        );
        assert_eq!(
            path_of(b"GET", b"/api/v1/namespaces/dev"),
            "/api/v1/namespaces/dev"
        );
        assert_eq!(path_of(b"GET", b"/api/v1/nodes/n1"), "/api/v1/nodes/n1");
    }
}
