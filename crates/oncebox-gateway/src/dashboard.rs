//! The web dashboard served at `/`: server-rendered pages (maud escapes every value, payloads
//! are attacker-controlled) and one small script, both embedded in the binary. Pages need a
//! session made at `/login` from the admin token, or the admin API's loopback rule; their
//! buttons call the admin API through [`session::bridge`] with the session's CSRF token.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::EventStore;

use crate::Gateway;

pub(crate) mod api;
mod config;
mod conflicts;
mod cookie;
mod diff;
mod events;
mod layout;
mod logouts;
mod queues;
pub(crate) mod session;

/// What the events page filters by, for the OpenAPI document.
pub(crate) use events::{OUTCOMES, RANGES};
pub use logouts::Logouts;

use session::Access;

const SCRIPT: &str = include_str!("../assets/dashboard.js");
const STYLE: &str = include_str!("../assets/dashboard.css");

/// The dashboard's pages, its login and its assets.
pub(crate) fn routes<S: EventStore + DeliveryStore>() -> Router<Arc<Gateway<S>>> {
    Router::new()
        .route("/", get(events::overview::<S>))
        .route("/events", get(events::list::<S>))
        .route("/events/{source}/{event_id}", get(events::show::<S>))
        .route("/event", get(events::show_query::<S>))
        .route("/deliveries/{state}", get(queues::queue::<S>))
        .route("/conflicts", get(conflicts::page::<S>))
        .route("/config", get(config::page::<S>))
        .route("/login", get(login_form::<S>).post(session::login::<S>))
        .route("/logout", post(logouts::logout::<S>))
        .route("/assets/dashboard.js", get(script))
        .route("/assets/dashboard.css", get(style))
}

/// The access of a page request, or the answer that sends it elsewhere.
#[expect(
    clippy::result_large_err,
    reason = "the error is the answer itself, returned at once by the handler"
)]
fn gate<S>(gw: &Gateway<S>, headers: &HeaderMap) -> Result<Access, Response> {
    match session::access(gw, headers) {
        Access::Login => Err(Redirect::to("/login").into_response()),
        Access::Closed => Err(layout::closed_page()),
        a => Ok(a),
    }
}

/// As [`gate`], with what the page's extractor read of the request (its query, its path): the
/// session is checked first, so a visitor not signed in goes to /login whatever the request
/// says, and a request the page cannot read is the page's own 400, naming why (axum's own
/// rejection, before the check, was a JSON problem document to anyone).
#[expect(
    clippy::result_large_err,
    reason = "the error is the answer itself, returned at once by the handler"
)]
fn gate_with<S, T, E: std::fmt::Display>(
    gw: &Gateway<S>,
    headers: &HeaderMap,
    read: Result<T, E>,
) -> Result<(Access, T), Response> {
    let access = gate(gw, headers)?;
    match read {
        Ok(read) => Ok((access, read)),
        Err(e) => Err(layout::problem(
            StatusCode::BAD_REQUEST,
            &access,
            &e.to_string(),
        )),
    }
}

/// The store could not answer: say so, never show a partial page as if it were whole. With
/// the configured `Retry-After`, as every 503 of the gateway's.
fn unavailable<S>(gw: &Gateway<S>, access: &Access, e: &oncebox_core::Unavailable) -> Response {
    tracing::warn!(cause = %e, "store unavailable");
    let mut page = layout::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        access,
        // The kind only, as every 503 of the gateway's: the store's words go to the log.
        &format!(
            "The store is unavailable: {}",
            crate::problem::public_detail(e)
        ),
    );
    let wait = crate::problem::retry_after_value(gw.config.limits.retry_after);
    page.headers_mut()
        .insert(axum::http::header::RETRY_AFTER, wait);
    page
}

async fn login_form<S: EventStore>(
    axum::extract::State(gw): axum::extract::State<Arc<Gateway<S>>>,
    headers: HeaderMap,
) -> Response {
    match session::access(&gw, &headers) {
        Access::Login => layout::login_page(None),
        Access::Closed => layout::closed_page(),
        _ => Redirect::to("/").into_response(),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
