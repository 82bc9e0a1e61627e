//! Sessions ended by a logout, remembered until their cookies would have expired: a session
//! cookie is signed, not stored, so without this list a copy taken before the logout (from a
//! shared machine, a proxy's log) would go on working for the rest of its lifetime. And
//! `POST /logout`, which puts them there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use oncebox_core::Timestamp;
use oncebox_core::store::EventStore;

use super::cookie::set_cookie;
use super::session::{LIFETIME, csrf_ok, live, same_origin};
use crate::Gateway;

/// The nonces of sessions logged out on this gateway, each with the latest time its cookie
/// could still verify. Held in memory: a gateway that restarts, or another node of a
/// PostgreSQL deployment, does not know them (changing the admin token ends every session
/// everywhere).
#[derive(Debug, Default)]
pub struct Logouts(Mutex<HashMap<String, Timestamp>>);

impl Logouts {
    /// Ends the session `nonce`, whose cookie verifies until `expires` at the latest. Entries
    /// whose cookies have expired by `now` are dropped: the signature check refuses those.
    pub(crate) fn end(&self, nonce: &str, expires: Timestamp, now: Timestamp) {
        let mut ended = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ended.retain(|_, until| *until > now);
        ended.insert(nonce.to_owned(), expires);
    }

    /// Whether the session `nonce` was logged out.
    pub(crate) fn ended(&self, nonce: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(nonce)
    }
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: ends every session the request carries (a copy of a cookie no longer
/// works) and clears the cookie. It carries the CSRF token of one of them, so no other site
/// can log the operator out.
pub(crate) async fn logout<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LogoutForm>,
) -> Response {
    let Some(token) = gw.config.admin_token.as_deref() else {
        return StatusCode::FORBIDDEN.into_response();
    };
    // The form's token may be any live session's: the page that showed the form may have had
    // another cookie than this request.
    let live: Vec<(String, &str)> = live(&gw, token, &headers).collect();
    let asked = live
        .iter()
        .any(|(nonce, _)| csrf_ok(token, nonce, &form.csrf));
    if !asked || !same_origin(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let now = gw.clock.now();
    // Every session the request carries ends, not only the one whose form this is: the
    // browser clears the cookie at one path only, and another left valid would outlive it.
    // Each is remembered until its cookie's own signed expiry, when the signature check takes
    // over (not now + its lifetime: after a wall clock stepped back, that would come first).
    for (nonce, value) in live {
        let expires = value
            .split('.')
            .next()
            .and_then(|at| at.parse().ok())
            .map_or(now.plus(LIFETIME), Timestamp);
        gw.logouts.end(&nonce, expires, now);
    }
    (
        [(header::SET_COOKIE, set_cookie("", 0, &headers))],
        Redirect::to("/login"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_session_is_remembered_until_its_cookie_expires() {
        let logouts = Logouts::default();
        logouts.end("a", Timestamp(100), Timestamp(0));
        assert!(logouts.ended("a") && !logouts.ended("b"));
        logouts.end("b", Timestamp(300), Timestamp(100));
        assert!(!logouts.ended("a"), "expired by the next logout: dropped");
        assert!(logouts.ended("b"));
    }
}
