//! oncebox-gateway: the HTTP face of oncebox. It verifies webhook signatures over the raw bytes,
//! deduplicates and stores each event once through an [`EventStore`], answers the sender only
//! after the commit, and serves the admin API, metrics and health endpoints.

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, Timestamp};

mod admin;
mod body;
pub mod crash;
mod dashboard;
pub use dashboard::Logouts;
mod deliveries;
mod ingress;
mod limit;
mod linger;
pub mod meter;
pub mod openapi;
mod peers;
pub mod policy;
pub mod problem;
mod quiet;
mod rejection;
mod serve;

pub use admin::{response_document, stats_document};
pub use ingress::{MAX_HEADER_BYTES, accepted_body};
pub use serve::serve;

/// Everything a request handler needs, shared by all requests.
#[derive(Debug)]
pub struct Gateway<S> {
    pub store: S,
    pub config: policy::GatewayConfig,
    pub clock: Arc<dyn Clock>,
    /// Renders `/metrics`; `None` when no recorder is installed.
    pub metrics: Option<PrometheusHandle>,
    /// Only loopback peers can connect (the listener is bound to a loopback address): then the
    /// admin API may answer without a token.
    pub loopback_only: bool,
    /// Dashboard sessions logged out before their cookies expire.
    pub logouts: dashboard::Logouts,
}

/// The most a request other than an event may carry.
pub const OTHER_BODY_LIMIT: usize = 64 << 10;

/// The gateway's routes: ingress, admin (events and deliveries), health, OpenAPI, dashboard.
pub fn router<S: EventStore + DeliveryStore>(gw: Arc<Gateway<S>>) -> Router {
    let admin = Router::new()
        .route("/v1/events", get(admin::list::<S>))
        .route(
            "/v1/sources/{source}/events/{event_id}",
            get(admin::show::<S>),
        )
        .route("/v1/stats", get(admin::stats::<S>))
        .route("/v1/deliveries", get(deliveries::list::<S>))
        .route("/v1/deliveries/{id}/retry", post(deliveries::retry::<S>))
        .route(
            "/v1/deliveries/{id}/resolve",
            post(deliveries::resolve::<S>),
        )
        .route(
            "/v1/sources/{source}/events/{event_id}/redeliver",
            post(deliveries::redeliver::<S>),
        )
        .route("/v1/activity", get(dashboard::api::activity::<S>))
        .route("/metrics", get(admin::metrics::<S>))
        .route_layer(axum::middleware::map_response(admin::no_store))
        .route_layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            admin::guard::<S>,
        ))
        // Outside the guard: the dashboard's session stands for the token (with its CSRF token).
        .route_layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            dashboard::session::bridge::<S>,
        ))
        .merge(dashboard::routes::<S>())
        // Every body here (a login form, a resolve note) is small and read whole first, within
        // the body timeout, before any check of who sent it: `/login` is open to anyone, and a
        // body trickled in must neither fill the memory nor hold a permit for long.
        .route_layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            body::bounded::<S>,
        ));
    Router::new()
        // The handler takes the whole `Request` and reads the body itself, within its
        // source's own limit and timeout. (A layer of its own here, lifting a router-wide body
        // limit, measured 129-132 µs of CPU per duplicate against 97-99 without, in two runs
        // each.)
        .route("/v1/sources/{source}/events", post(ingress::receive::<S>))
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::readyz::<S>))
        .route("/openapi.json", get(openapi::document))
        .merge(admin)
        // Outermost, so that its rewriting also sees the router's own 404s and 405s.
        .layer(limit::Edge::new(&gw.config, gw.metrics.is_some()))
        .with_state(gw)
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(t: Timestamp) -> String {
    rfc3339_form(t).to_string()
}

/// [`rfc3339`] appended to `out`, without a string of its own.
pub(crate) fn write_rfc3339(out: &mut Vec<u8>, t: Timestamp) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{}", rfc3339_form(t));
}

/// The last millisecond RFC 3339's four-digit years can spell, 9999-12-31T23:59:59.999Z.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

fn rfc3339_form(t: Timestamp) -> humantime::Rfc3339Timestamp {
    // A later time (a retry put off for millennia by a receiver's `Retry-After`) would fail to
    // format, and `to_string` panics on that: it is shown as the last time the form can spell.
    let ms = u64::try_from(t.millis()).unwrap_or(0).min(LAST_RFC3339_MS);
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use oncebox_core::Timestamp;

    #[test]
    fn times_past_year_9999_are_shown_as_its_last_millisecond_not_a_panic() {
        assert_eq!(super::rfc3339(Timestamp(0)), "1970-01-01T00:00:00.000Z");
        for t in [253_402_300_799_999, 253_402_300_800_000, i64::MAX] {
            assert_eq!(super::rfc3339(Timestamp(t)), "9999-12-31T23:59:59.999Z");
        }
        let mut out = Vec::new();
        super::write_rfc3339(&mut out, Timestamp(i64::MAX));
        assert_eq!(out, b"9999-12-31T23:59:59.999Z");
    }
}
