//! Sources anyone who reaches the listener can post to, and where their events go: an unsigned
//! source on a listener other machines reach, whose events a route signs. Receivers trust that
//! signature; here it would vouch for whatever anyone posted.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use oncebox_core::Source;
use oncebox_core::route::Route;
use oncebox_core::signature::Scheme;
use oncebox_gateway::policy::SourcePolicy;

/// A warning for each signed route taking events of an unsigned source, when the listener is
/// not loopback-only.
pub(super) fn warn(
    listen: SocketAddr,
    sources: &BTreeMap<Source, SourcePolicy>,
    routes: &[Route],
    warnings: &mut Vec<String>,
) {
    if listen.ip().to_canonical().is_loopback() {
        return;
    }
    for r in routes.iter().filter(|r| r.signing_secret.is_some()) {
        let unsigned = r
            .sources
            .iter()
            .filter(|s| sources.get(*s).is_some_and(|p| p.scheme == Scheme::None));
        for source in unsigned {
            warnings.push(format!(
                "routes.{}: it signs the events of source {source}, which takes unsigned events \
                 on {listen}, a listener other machines reach: anyone there can have an event \
                 signed with the route's key, and its receiver trusts that signature; sign the \
                 source, or listen on 127.0.0.1",
                r.name
            ));
        }
    }
}
