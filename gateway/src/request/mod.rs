//! What a request is, decided once from its head, for both front-ends: the path rule (`target`),
//! the route to a member cluster (`route`), the kube request info (verb, resource, namespace,
//! name, long-running), and who the client is and whether an AccessPolicy lets it (`auth`).
//!
//! [`decide`] runs with one routing-table snapshot and never awaits, so a request is routed,
//! classified and authorized against the same table. Everything after it (metrics, the member's
//! head, the audit log) reads the [`Proxied`] it returns: nothing parses the path again. Called by
//! `protocol::h1` and `protocol::h2`; never does I/O.

pub mod route;
pub mod target;

use std::sync::Arc;

use fleetgate_config_watcher::policy::RequestAttributes;
use fleetgate_config_watcher::{ClusterRoute, RouteTable};

use crate::auth::{self, ClientIdentity, ConnectionAuth, Decided};
use crate::errors::GatewayError;
use route::Route;

/// What the gateway does with a request.
pub enum Decision<'t> {
    /// `/healthz`, `/readyz` or `/livez`: answered by the gateway itself.
    Health,
    /// Proxied to a member.
    Proxy(Proxied<'t>),
}

/// A request routed to a member cluster, classified and authorized.
pub struct Proxied<'t> {
    pub cluster: &'t Arc<ClusterRoute>,
    /// The kube path after the cluster prefix (possibly empty) and the raw query (with its `?`).
    pub rest: &'t [u8],
    pub query: &'t [u8],
    /// The request info the policy decided on (and the audit log names).
    pub attrs: RequestAttributes<'t>,
    /// The verb metrics count it under (`connect` for exec, attach, port-forward and proxy).
    pub verb: &'static str,
    /// A watch, a followed log or a connect subresource: no head timeout, streamed as it comes.
    pub long_running: bool,
    pub identity: Decided,
}

/// A request [`decide`] refused: the Status to answer with, who had authenticated by then (for
/// the audit log; none for a 401), and the cluster and verb when it got that far (for metrics).
pub struct Refused<'t> {
    pub error: GatewayError,
    pub authenticated: Option<Arc<ClientIdentity>>,
    pub acting_as: Option<Arc<ClientIdentity>>,
    pub counted: Option<(&'t Arc<ClusterRoute>, &'static str)>,
}

impl From<GatewayError> for Refused<'_> {
    fn from(error: GatewayError) -> Self {
        Refused {
            error,
            authenticated: None,
            acting_as: None,
            counted: None,
        }
    }
}

/// Decides a request from its method, target and header fields (`headers` may be called a few
/// times). `method` is the one the member will see (an RFC 8441 WebSocket CONNECT is a GET).
pub fn decide<'t, 'h, F, H>(
    table: &'t RouteTable,
    conn: &ConnectionAuth,
    method: &'t [u8],
    target: &'t [u8],
    headers: F,
) -> Result<Decision<'t>, Refused<'t>>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    target::check(target)?;
    let (name, rest, query) = match route::route(target, table.gateway().ocm_style) {
        Route::Health(_) => return Ok(Decision::Health),
        Route::NotFound => {
            return Err(GatewayError::NoRoute {
                path: String::from_utf8_lossy(target).into_owned(),
            }
            .into())
        }
        Route::Cluster { name, rest, query } => (name, rest, query),
    };
    let Some(cluster) = table.cluster(name) else {
        let unknown = GatewayError::UnknownCluster {
            name: name.to_string(),
        };
        return Err(auth::hide_unknown_cluster(unknown, table.access(), conn, headers).into());
    };
    let attrs = RequestAttributes::parse(method, rest, query);
    let verb = route::kube_verb(method, rest, query);
    let counted = Some((cluster, verb));
    if !cluster.impersonation && !cluster.pass_through {
        // The member would see the gateway itself: nobody may choose another identity there.
        auth::check_request(headers()).map_err(|error| Refused {
            error,
            authenticated: None,
            acting_as: None,
            counted,
        })?;
    }
    let identity =
        auth::decide(table.access(), conn, cluster, &attrs, headers).map_err(|refusal| {
            Refused {
                error: refusal.error,
                authenticated: refusal.authenticated,
                acting_as: refusal.acting_as,
                counted,
            }
        })?;
    Ok(Decision::Proxy(Proxied {
        cluster,
        rest,
        query,
        attrs,
        verb,
        long_running: route::is_long_running(rest, query),
        identity,
    }))
}
