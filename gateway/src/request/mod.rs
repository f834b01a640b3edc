//! What a request is, decided once from its head, for both front-ends: the path rule (`target`),
//! the route to a member cluster (`route`), the kube request info (verb, resource, namespace,
//! name, long-running), and who the client is and whether an AccessPolicy lets it (`auth`). A
//! pull-mode cluster's direct service path (`/services/NS/NAME:PORT/...` after its prefix) is
//! decided here too: classified as the `proxy` subresource of that service, authorized as such,
//! and refused for a cluster reached directly.
//!
//! [`decide`] runs with one routing-table snapshot and never awaits, so a request is routed,
//! classified (config-watcher's `request_info`: kube-apiserver's RequestInfoFactory, any depth,
//! failing closed) and authorized against the same table. Everything after it (metrics, the member's
//! head, the audit log) reads the [`Proxied`] it returns: nothing parses the path again. Called by
//! the pipeline (`handle`) for both front-ends; never does I/O.

pub mod discovery;
pub mod route;
pub mod target;

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use fleetgate_config_watcher::fleet::FleetKind;
use fleetgate_config_watcher::policy::{self_review, SelfReview};
use fleetgate_config_watcher::request_info::{KubeVerb, RequestInfo};
use fleetgate_config_watcher::{ClusterRoute, ConnectMode, FleetSettings, RouteTable};

use crate::auth::{self, ClientIdentity, ConnectionAuth, Decided, HeaderFields};
use crate::errors::GatewayError;
use crate::tunnel::wire::ServiceRef;
use discovery::{Document, MergedKind};
use route::Route;

/// The client's address, with its IP as text (what `X-Forwarded-For` carries), formatted once per
/// connection rather than per request.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub addr: SocketAddr,
    text: [u8; 45],
    len: u8,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Peer {
        let mut text = [0u8; 45];
        let len = {
            let mut cursor = std::io::Cursor::new(&mut text[..]);
            // The longest IPv6 address is 45 characters: this always fits.
            let _ = write!(cursor, "{}", addr.ip());
            cursor.position() as u8
        };
        Peer { addr, text, len }
    }

    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    /// The IP address as text.
    pub fn ip_text(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }
}

/// What the gateway does with a request.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per request and moved into the exchange; boxing would allocate per request"
)]
pub enum Decision<'t> {
    /// `/healthz`, `/readyz` or `/livez`: answered by the gateway itself.
    Health,
    /// Proxied to a member.
    Proxy(Proxied<'t>),
    /// A LIST or WATCH served by the fleet view from the members it spans (`fleet::list`,
    /// `fleet::watch`).
    Fleet(FleetRequest<'t>),
    /// A named object through the fleet view: proxied to the one member that has it, once
    /// `fleet::owner` has found it.
    FleetNamed(FleetRequest<'t>),
    /// A discovery document through the fleet view, filtered to the merged kinds
    /// (`fleet::discovery`).
    FleetDiscovery(FleetDiscovery<'t>),
    /// A self access review through the fleet view, asked of every cluster the user may reach
    /// (`fleet::review`).
    FleetReview(FleetReview<'t>),
}

impl Decision<'_> {
    /// Who sends the request and where it goes, as admission (`admit`) counts it; None for the
    /// gateway's own health answers. A fleet-view request spans several members: it is its
    /// user's alone.
    pub fn subject(&self) -> Option<crate::admit::Subject<'_>> {
        use crate::admit::Subject;
        Some(match self {
            Decision::Health => return None,
            Decision::Proxy(p) => Subject {
                authenticated: p.identity.authenticated.as_ref(),
                acting_as: p.identity.identity.as_ref(),
                cluster: Some(p.cluster),
                verb: p.verb,
                long_running: p.long_running,
                classified: Some((p.name, p.info)),
            },
            Decision::Fleet(f) | Decision::FleetNamed(f) => {
                fleet_subject(&f.members, f.verb, f.info.long_running)
            }
            Decision::FleetDiscovery(d) => fleet_subject(&d.members, d.verb, false),
            Decision::FleetReview(r) => fleet_subject(&r.members, r.verb, false),
        })
    }
}

/// A fleet-view request's subject: its user (every member's decision names the same one).
fn fleet_subject<'a>(
    members: &'a [(&'a Arc<ClusterRoute>, Decided)],
    verb: &'static str,
    long_running: bool,
) -> crate::admit::Subject<'a> {
    let first = members.first().map(|(_, decided)| decided);
    crate::admit::Subject {
        authenticated: first.and_then(|d| d.authenticated.as_ref()),
        acting_as: first.and_then(|d| d.identity.as_ref()),
        cluster: None,
        verb,
        long_running,
        classified: None,
    }
}

/// A fleet-view request on a merged kind, classified and authorized per member.
pub struct FleetRequest<'t> {
    /// The kube path after the fleet prefix and the raw query (with its `?`).
    pub rest: &'t [u8],
    pub query: &'t [u8],
    pub info: RequestInfo<'t>,
    /// The merged kind it names.
    pub kind: &'t FleetKind,
    /// The clusters it spans: those of the kind the user's AccessPolicies allow this request on,
    /// sorted by name, each with the identity the member is told about.
    pub members: Vec<(&'t Arc<ClusterRoute>, Decided)>,
    /// The verb metrics count it under.
    pub verb: &'static str,
    /// Page size and members asked at once (`spec.fleet`).
    pub settings: &'t FleetSettings,
}

/// A discovery request through the fleet view (`/api`, `/apis` and below).
pub struct FleetDiscovery<'t> {
    pub rest: &'t [u8],
    pub query: &'t [u8],
    pub info: RequestInfo<'t>,
    pub document: Document<'t>,
    /// The merged kinds it may show (those merged in the aimed cluster, when aimed at one).
    pub kinds: Vec<MergedKind<'t>>,
    /// The clusters that may answer it, in the order they are asked (by name), each with the
    /// identity the member is told about.
    pub members: Vec<(&'t Arc<ClusterRoute>, Decided)>,
    pub verb: &'static str,
}

/// A SelfSubjectAccessReview through the fleet view (`kubectl --context fleet auth can-i`).
pub struct FleetReview<'t> {
    pub rest: &'t [u8],
    pub query: &'t [u8],
    pub info: RequestInfo<'t>,
    /// Every cluster the user may reach, by name, each with the identity the member is told
    /// about.
    pub members: Vec<(&'t Arc<ClusterRoute>, Decided)>,
    pub verb: &'static str,
    /// Members asked at once (`spec.fleet.membersAtOnce`).
    pub settings: &'t FleetSettings,
}

/// A request routed to a member cluster, classified and authorized.
pub struct Proxied<'t> {
    pub cluster: &'t Arc<ClusterRoute>,
    /// The cluster's name as the path gave it.
    pub name: &'t str,
    /// The kube path after the cluster prefix (possibly empty) and the raw query (with its `?`).
    pub rest: &'t [u8],
    pub query: &'t [u8],
    /// The request info (kube-apiserver's), parsed once: the policy decided on it, metrics
    /// and the audit log name it.
    pub info: RequestInfo<'t>,
    /// The verb metrics count it under (`connect` for exec, attach, port-forward and proxy).
    pub verb: &'static str,
    /// A watch, a followed log or a connect subresource: no head timeout, streamed as it comes.
    pub long_running: bool,
    pub identity: Decided,
    /// The direct service path of a pull-mode cluster: the service the request goes to through
    /// the cluster's agent (then `rest` is the service's own path), instead of the member.
    pub service: Option<ServiceRef<'t>>,
}

/// A request [`decide`] refused: the Status to answer with, who had authenticated by then (for
/// the audit log; none for a 401), and the cluster and verb when it got that far (for metrics).
pub struct Refused<'t> {
    pub error: GatewayError,
    pub authenticated: Option<Arc<ClientIdentity>>,
    pub acting_as: Option<Arc<ClientIdentity>>,
    pub counted: Option<(&'t Arc<ClusterRoute>, &'static str)>,
    /// The cluster name its path gave and what it was classified as, when it got that far (the
    /// audit log names them).
    pub classified: Option<(&'t str, RequestInfo<'t>)>,
}

impl<'t> Refused<'t> {
    /// Authentication's or an AccessPolicy's refusal, with what the request was counted and
    /// classified as by then.
    fn by_policy(
        refusal: auth::Refusal,
        counted: Option<(&'t Arc<ClusterRoute>, &'static str)>,
        classified: Option<(&'t str, RequestInfo<'t>)>,
    ) -> Refused<'t> {
        Refused {
            error: refusal.error,
            authenticated: refusal.authenticated,
            acting_as: refusal.acting_as,
            counted,
            classified,
        }
    }
}

impl From<GatewayError> for Refused<'_> {
    fn from(error: GatewayError) -> Self {
        Refused {
            error,
            authenticated: None,
            acting_as: None,
            counted: None,
            classified: None,
        }
    }
}

/// Decides a request from its method, target and header fields (read a few times). `method` is
/// the one the member will see (an RFC 8441 WebSocket CONNECT is a GET).
#[allow(
    clippy::result_large_err,
    reason = "the Ok side is as large; a Box would allocate for every refusal and every request"
)]
pub fn decide<'t, 'h>(
    table: &'t RouteTable,
    conn: &ConnectionAuth,
    method: &'t [u8],
    target: &'t [u8],
    headers: impl HeaderFields<'h>,
) -> Result<Decision<'t>, Refused<'t>> {
    target::check(target)?;
    auth::check_field_names(headers.fields())?;
    let (name, rest, query) = match route::route(target, table.gateway().ocm_style) {
        Route::Health(_) => return Ok(Decision::Health),
        Route::NotFound => {
            return Err(GatewayError::NoRoute {
                path: String::from_utf8_lossy(target).into_owned(),
            }
            .into())
        }
        Route::Cluster { name, rest, query } => (name, rest, query),
        Route::Fleet { aimed, rest, query } => {
            return decide_fleet(table, conn, method, aimed, rest, query, &headers)
        }
    };
    let service = match route::service_path(rest) {
        None => None,
        Some(Ok(service)) => Some(service),
        Some(Err(reason)) => return Err(GatewayError::BadServicePath { reason }.into()),
    };
    let info = match &service {
        // The direct service path is the service's `proxy` subresource, as the apiserver's
        // `/api/v1/namespaces/NS/services/NAME:PORT/proxy/...` is: one grant serves both.
        Some(s) => RequestInfo::service_proxy(method, rest, s.service.namespace, s.name_port),
        None => RequestInfo::parse(method, rest, query),
    };
    let classified = Some((name, info));
    let Some(cluster) = table.cluster(name) else {
        let unknown = GatewayError::UnknownCluster {
            name: name.to_string(),
        };
        return Err(Refused {
            classified,
            ..Refused::from(auth::hide_unknown_cluster(
                unknown,
                table.access(),
                conn,
                &headers,
            ))
        });
    };
    let verb = info.metrics_verb();
    let counted = Some((cluster, verb));
    if !cluster.impersonation && !cluster.pass_through {
        // The member would see the gateway itself: nobody may choose another identity there.
        auth::check_request(headers.fields()).map_err(|error| Refused {
            error,
            authenticated: None,
            acting_as: None,
            counted,
            classified,
        })?;
    }
    let identity = auth::decide(table.access(), conn, cluster, &info, &headers)
        .map_err(|refusal| Refused::by_policy(refusal, counted, classified))?;
    let Some(service) = service else {
        return Ok(Decision::Proxy(Proxied::new(
            cluster, name, rest, query, info, identity,
        )));
    };
    let refused = |error| Refused {
        error,
        authenticated: identity.authenticated.clone(),
        acting_as: identity.identity.clone(),
        counted,
        classified,
    };
    if cluster.mode != ConnectMode::Tunnel {
        // Decided after the policy, so that only who may reach the service learns more.
        return Err(refused(GatewayError::ServicePathNotTunnelled {
            cluster: cluster.name.to_string(),
            service: service.service.to_string(),
            proxy_path: format!(
                "/clusters/{}/api/v1/namespaces/{}/services/{}/proxy/",
                cluster.name, service.service.namespace, service.name_port
            ),
        }));
    }
    if identity.identity.is_none() {
        // A PassThrough cluster's token the gateway does not know: only the member could judge
        // it, and the member is not asked on this path.
        return Err(refused(GatewayError::Unauthorized {
            reason: "the service path needs a credential the gateway verifies",
        }));
    }
    let mut proxied = Proxied::new(cluster, name, service.path, query, info, identity);
    proxied.service = Some(service.service);
    Ok(Decision::Proxy(proxied))
}

impl<'t> Proxied<'t> {
    /// A fleet-view request as an ordinary one to `member`, named by its own name.
    fn to_member(
        (cluster, identity): (&'t Arc<ClusterRoute>, Decided),
        rest: &'t [u8],
        query: &'t [u8],
        info: RequestInfo<'t>,
    ) -> Decision<'t> {
        Decision::Proxy(Proxied::new(
            cluster,
            &cluster.name,
            rest,
            query,
            info,
            identity,
        ))
    }

    fn new(
        cluster: &'t Arc<ClusterRoute>,
        name: &'t str,
        rest: &'t [u8],
        query: &'t [u8],
        info: RequestInfo<'t>,
        identity: Decided,
    ) -> Proxied<'t> {
        Proxied {
            cluster,
            name,
            rest,
            query,
            info,
            verb: info.metrics_verb(),
            long_running: info.long_running,
            identity,
            service: None,
        }
    }
}

/// Decides a fleet-view request. Discovery (`/api`, `/apis` and below) is filtered to the merged
/// kinds by the first cluster (by name) the user may reach that answers; other non-resource
/// requests go to the first such cluster as ordinary proxied requests. A LIST or WATCH of a
/// merged kind spans every cluster of the kind the user's AccessPolicies allow it on; a named
/// object goes to the one that has it. A request `aimed` at one cluster (a
/// `cluster.fleetgate.io/NAME` hint), and a CREATE when `spec.fleet.createIn` names a cluster, is
/// that cluster's, proxied as through `/clusters/NAME`. The self reviews kubectl asks with
/// (`auth can-i`, `auth whoami`) are served though no FleetResource merges them. Clusters the
/// user may not reach are left out without a word: no item and no error names them, and a hint
/// naming one is answered as one naming no cluster.
#[allow(
    clippy::result_large_err,
    reason = "as `decide`: the refusal is as large as the decision"
)]
fn decide_fleet<'t, 'h>(
    table: &'t RouteTable,
    conn: &ConnectionAuth,
    method: &'t [u8],
    aimed: Option<&'t str>,
    rest: &'t [u8],
    query: &'t [u8],
    headers: &impl HeaderFields<'h>,
) -> Result<Decision<'t>, Refused<'t>> {
    let info = RequestInfo::parse(method, rest, query);
    let verb = info.metrics_verb();
    // What a hint to a cluster the request may not reach is answered with: exactly what a hint
    // to a cluster that does not exist is.
    let hidden = |name: &str| -> Refused<'t> {
        let unknown = GatewayError::UnknownCluster {
            name: name.to_string(),
        };
        auth::hide_unknown_cluster(unknown, table.access(), conn, headers).into()
    };
    // The aimed cluster, or every cluster by name.
    let candidates = || -> Vec<&'t Arc<ClusterRoute>> {
        match aimed {
            Some(name) => table.cluster(name).into_iter().collect(),
            None => {
                let mut all: Vec<&Arc<ClusterRoute>> = table.clusters().collect();
                all.sort_by(|a, b| a.name.cmp(&b.name));
                all
            }
        }
    };
    if !info.is_resource_request {
        let document = Document::of(rest).filter(|_| method == b"GET");
        let want = if document.is_some() { usize::MAX } else { 1 };
        let (members, refusal) =
            fleet_members(table, conn, &info, candidates().into_iter(), want, headers);
        if members.is_empty() {
            return Err(match aimed {
                Some(name) => hidden(name),
                None => fleet_refusal(refusal, rest, &info),
            });
        }
        if let Some(document) = document {
            let kinds = table
                .fleet()
                .kinds
                .iter()
                .filter(|k| aimed.is_none_or(|name| k.clusters.iter().any(|c| c == name)))
                .map(|k| (k.group.as_str(), k.version.as_str(), k.resource.as_str()))
                .collect();
            return Ok(Decision::FleetDiscovery(FleetDiscovery {
                rest,
                query,
                info,
                document,
                kinds,
                members,
                verb,
            }));
        }
        let member = members.into_iter().next().expect("one member, checked");
        return Ok(Proxied::to_member(member, rest, query, info));
    }
    if let Some(review) = self_review(&info) {
        // A self review answers about its creator, each cluster for itself: an access review
        // is asked of every cluster the user may reach and holds only where all allow it; who
        // the user is, of the first; rules differ per cluster and namespace, and no one list
        // would be true of the fleet. Aimed at one cluster, any of them is that cluster's.
        let want = match (aimed, review) {
            (Some(_), _) | (None, SelfReview::Subject) => 1,
            (None, SelfReview::Access) => usize::MAX,
            (None, SelfReview::Rules) => return Err(GatewayError::FleetRulesReview.into()),
        };
        let (mut members, refusal) =
            fleet_members(table, conn, &info, candidates().into_iter(), want, headers);
        if members.is_empty() {
            return Err(match aimed {
                Some(name) => hidden(name),
                None => fleet_refusal(refusal, rest, &info),
            });
        }
        if want == 1 {
            let member = members.swap_remove(0);
            return Ok(Proxied::to_member(member, rest, query, info));
        }
        return Ok(Decision::FleetReview(FleetReview {
            rest,
            query,
            info,
            members,
            verb,
            settings: &table.gateway().fleet,
        }));
    }
    let Some(kind) = table.fleet().kind(info.api_group, info.resource) else {
        return Err(GatewayError::FleetKindNotMerged {
            resource: fleet_resource_name(&info),
        }
        .into());
    };
    let unsupported = |what: &'static str| -> Refused<'t> {
        GatewayError::FleetNotServed {
            what,
            resource: fleet_resource_name(&info),
        }
        .into()
    };
    let named = match info.verb {
        // A LIST, or a WATCH (of a collection or of one name): merged from every member.
        KubeVerb::List | KubeVerb::Watch if method == b"GET" => false,
        // A named object and its subresources (exec and the like are a create of one).
        KubeVerb::Get
        | KubeVerb::Update
        | KubeVerb::Patch
        | KubeVerb::Delete
        | KubeVerb::Create
            if !info.name.is_empty() =>
        {
            true
        }
        KubeVerb::Create => {
            let create = || -> Refused<'t> {
                GatewayError::FleetCreate {
                    resource: fleet_resource_name(&info),
                }
                .into()
            };
            // Without a hint, `spec.fleet.createIn` says where, for those who may reach it
            // there; for anyone else the create is refused as if it did not say.
            let Some(create_in) = aimed.or(table.gateway().fleet.create_in.as_deref()) else {
                return Err(create());
            };
            return aimed_at(table, conn, kind, create_in, rest, query, info, headers)
                .map_err(|_| aimed.map_or_else(create, hidden));
        }
        _ => return Err(unsupported("this verb")),
    };
    if let Some(name) = aimed {
        return aimed_at(table, conn, kind, name, rest, query, info, headers)
            .map_err(|_| hidden(name));
    }
    let (members, refusal) = fleet_members(
        table,
        conn,
        &info,
        kind.clusters.iter().filter_map(|name| table.cluster(name)),
        usize::MAX,
        headers,
    );
    if members.is_empty() {
        return Err(fleet_refusal(refusal, rest, &info));
    }
    let request = FleetRequest {
        rest,
        query,
        info,
        kind,
        members,
        verb,
        settings: &table.gateway().fleet,
    };
    Ok(if named {
        Decision::FleetNamed(request)
    } else {
        Decision::Fleet(request)
    })
}

/// A fleet request aimed at cluster `name` (a hint, or `spec.fleet.createIn`) as an ordinary
/// request to it, if the cluster exists, merges `kind` and this request may reach it there;
/// else `Err(())`, which the caller answers without telling which of those failed.
#[allow(
    clippy::too_many_arguments,
    reason = "the parts of one request, as `decide_fleet` took them apart"
)]
fn aimed_at<'t, 'h>(
    table: &'t RouteTable,
    conn: &ConnectionAuth,
    kind: &FleetKind,
    name: &str,
    rest: &'t [u8],
    query: &'t [u8],
    info: RequestInfo<'t>,
    headers: &impl HeaderFields<'h>,
) -> Result<Decision<'t>, ()> {
    let merged_here = kind.clusters.iter().any(|c| c == name);
    let cluster = table.cluster(name).filter(|_| merged_here);
    let (mut members, _) = fleet_members(table, conn, &info, cluster.into_iter(), 1, headers);
    let member = members.pop().ok_or(())?;
    Ok(Proxied::to_member(member, rest, query, info))
}

/// The clusters of `candidates` (in their order) the request may reach, at most `want` of them,
/// each with the identity its member is told about, and the first refusal met (why none may be,
/// if none may). Used when
/// a fleet request is decided, and again by a merged watch when the routing table changes.
#[allow(
    clippy::result_large_err,
    reason = "as `decide`: the refusal is as large as the decision"
)]
pub fn fleet_members<'t, 'h>(
    table: &'t RouteTable,
    conn: &ConnectionAuth,
    info: &RequestInfo<'_>,
    candidates: impl Iterator<Item = &'t Arc<ClusterRoute>>,
    want: usize,
    headers: &impl HeaderFields<'h>,
) -> (Vec<(&'t Arc<ClusterRoute>, Decided)>, Option<Refused<'t>>) {
    let mut refusal = None;
    let mut members = Vec::new();
    for cluster in candidates {
        if members.len() == want {
            break;
        }
        if !cluster.impersonation && !cluster.pass_through {
            if let Err(error) = auth::check_request(headers.fields()) {
                refusal.get_or_insert(Refused::from(error));
                continue;
            }
        }
        match auth::decide(table.access(), conn, cluster, info, headers) {
            Ok(identity) => members.push((cluster, identity)),
            Err(refused) => {
                refusal.get_or_insert(Refused::by_policy(refused, None, None));
            }
        }
    }
    (members, refusal)
}

impl<'t> FleetRequest<'t> {
    /// The request as an ordinary one to `members[owner]`, the cluster that has its object.
    pub fn into_owner(mut self, owner: usize) -> Proxied<'t> {
        let (cluster, identity) = self.members.swap_remove(owner);
        Proxied::new(
            cluster,
            &cluster.name,
            self.rest,
            self.query,
            self.info,
            identity,
        )
    }
}

/// `pods` or `deployments.apps`, as kube names a resource in messages.
pub(crate) fn fleet_resource_name(info: &RequestInfo<'_>) -> String {
    if info.api_group.is_empty() {
        info.resource.to_owned()
    } else {
        format!("{}.{}", info.resource, info.api_group)
    }
}

/// Why no cluster of the fleet view may serve a request: the first cluster's refusal, made about
/// the fleet view as a whole (a Forbidden names no cluster).
fn fleet_refusal<'t>(
    refusal: Option<Refused<'t>>,
    rest: &[u8],
    info: &RequestInfo<'_>,
) -> Refused<'t> {
    let Some(mut refused) = refusal else {
        return no_fleet_route(rest);
    };
    if let (GatewayError::Forbidden { .. }, Some(who)) = (
        &refused.error,
        refused
            .acting_as
            .as_ref()
            .or(refused.authenticated.as_ref()),
    ) {
        refused.error = auth::forbidden(who, &auth::Place::Fleet, info);
    }
    refused
}

fn no_fleet_route<'t>(rest: &[u8]) -> Refused<'t> {
    GatewayError::NoRoute {
        path: format!("/fleet{}", String::from_utf8_lossy(rest)),
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a PassThrough cluster a token the gateway cannot verify goes to the member, which
    /// judges it; the service path never reaches the member, so such a token is refused there.
    #[test]
    #[allow(
        clippy::result_large_err,
        reason = "the closure returns what `decide` returns"
    )]
    fn the_service_path_needs_an_identity_the_gateway_verified() {
        let table = crate::testing::test_table(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: pt}\n\
             spec: {mode: Tunnel, authMode: PassThrough}\n",
        );
        let conn = ConnectionAuth::new(&ClientIdentity::default());
        let headers: [(&[u8], &[u8]); 1] = [(b"Authorization", b"Bearer member-only")];
        let decide = |target: &'static [u8]| {
            decide(&table, &conn, b"GET", target, || headers.iter().copied())
        };
        assert!(matches!(
            decide(b"/clusters/pt/api/v1/namespaces/a/services/echo:80/proxy/x"),
            Ok(Decision::Proxy(Proxied { service: None, .. }))
        ));
        let refused = |target| match decide(target) {
            Err(refused) => refused.error,
            Ok(_) => panic!("{} decided", String::from_utf8_lossy(target)),
        };
        assert!(matches!(
            refused(b"/clusters/pt/services/a/echo:80/x"),
            GatewayError::Unauthorized { .. }
        ));
        for bad in [
            &b"/clusters/pt/services/a/echo/x"[..],
            b"/clusters/pt/services/a/echo:0/x",
            b"/clusters/pt/services/a",
        ] {
            let error = refused(bad);
            assert!(
                matches!(error, GatewayError::BadServicePath { .. }) && !error.must_close(),
                "{error}"
            );
        }
    }
}
