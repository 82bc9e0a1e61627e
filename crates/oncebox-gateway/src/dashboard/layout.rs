//! The frame every dashboard page shares: head, navigation, security headers, and the small
//! rendering helpers (times, durations, payloads). All text goes through maud, which escapes it.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use oncebox_core::Timestamp;

use super::session::Access;

/// Scripts and styles come only from the gateway itself, and never inline: even a payload that
/// escaped the escaping could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Events,
    Uncertain,
    Dead,
    Conflicts,
    Config,
}

const NAV: &[(Nav, &str, &str)] = &[
    (Nav::Overview, "/", "Overview"),
    (Nav::Events, "/events", "Events"),
    (Nav::Uncertain, "/deliveries/uncertain", "Uncertain"),
    (Nav::Dead, "/deliveries/dead", "Dead"),
    (Nav::Conflicts, "/conflicts", "Conflicts"),
    (Nav::Config, "/config", "Sources & routes"),
];

/// An HTML answer with the dashboard's headers.
pub(crate) fn respond(status: StatusCode, body: Markup) -> Response {
    let mut r = (status, body.into_string()).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · oncebox" }
            link rel="stylesheet" href="/assets/dashboard.css";
            script src="/assets/dashboard.js" defer {}
        }
    }
}

/// A whole page: navigation, then `body`. The CSRF token rides in a meta tag for the script.
pub(crate) fn page(title: &str, access: &Access, current: Nav, body: &Markup) -> Response {
    let csrf = match access {
        Access::Session { csrf } => csrf.as_str(),
        _ => "",
    };
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                meta name="oncebox-csrf" content=(csrf);
                header.top {
                    a.brand href="/" { "oncebox" }
                    nav {
                        @for (nav, href, label) in NAV {
                            a href=(href) class=[(*nav == current).then_some("current")] { (label) }
                        }
                    }
                    @if let Access::Session { csrf } = access {
                        form.logout method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    };
    respond(StatusCode::OK, markup)
}

/// The login form, with an optional complaint about the last try.
pub(crate) fn login_page(error: Option<&str>) -> Response {
    let status = if error.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (head("Log in"))
            body.login {
                main {
                    h1 { "oncebox" }
                    form method="post" action="/login" {
                        label for="token" { "Admin token" }
                        input #token type="password" name="token" autocomplete="current-password" autofocus;
                        button type="submit" { "Log in" }
                    }
                    @if let Some(e) = error { p.error role="alert" { (e) } }
                }
            }
        }
    };
    respond(status, markup)
}

/// The page shown when the admin API is closed to this listener.
pub(crate) fn closed_page() -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (head("Closed"))
            body.login { main {
                h1 { "The dashboard is closed" }
                p { "Without an admin token the dashboard opens only on a loopback listener, \
                    to requests addressed to localhost, 127.0.0.1 or [::1] that no proxy \
                    forwarded. Set " code { "admin_token" } " to use the dashboard and the \
                    admin API from here." }
            } }
        }
    };
    // No token could open it: 403, as the admin API answers there (`admin-disabled`).
    respond(StatusCode::FORBIDDEN, markup)
}

/// A page for a failure the operator should see (the store is unavailable, a bad query).
pub(crate) fn problem(status: StatusCode, access: &Access, detail: &str) -> Response {
    let body = html! { p.error { (detail) } };
    let mut r = page("Not available", access, Nav::Overview, &body);
    *r.status_mut() = status;
    r
}

/// A time as `2024-05-01T12:00:00.000Z`, in a `<time>` element.
pub(crate) fn time(t: Timestamp) -> Markup {
    let text = crate::rfc3339(t);
    html! { time datetime=(text) { (text) } }
}

pub(crate) fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}

/// The largest payload shown indented. Parsed and indented line by line, a payload takes tens
/// of times its size before `fits` can tell it is too large to show so (a megabyte of `0,`
/// about seventy), for each view of its page.
const INDENTED_MAX: usize = 256 * 1024;

/// A payload for reading: JSON indented, other UTF-8 as is, anything else as hex.
pub(crate) fn payload(bytes: &[u8]) -> Markup {
    let too_large = bytes.len() > INDENTED_MAX;
    if !too_large && let Ok(value) = oncebox_core::json::parse(bytes) {
        let lines = super::diff::pretty(&value, &[]);
        if super::diff::fits(&lines, bytes) {
            return super::diff::render(&lines);
        }
        let text = String::from_utf8_lossy(bytes);
        return html! {
            p.muted { "As sent: indented, this payload would be too large to show." }
            pre.payload { (text) }
        };
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => html! {
            @if too_large {
                p.muted { "As sent: this payload is too large to show indented." }
            }
            pre.payload { (text) }
        },
        Err(_) => html! { pre.payload.hex { (hex::encode(bytes)) } },
    }
}

/// As [`payload`], for a page that shows many: a payload past `max` bytes shows its first
/// `max` (as text where they are, else in hex), with its size, unparsed. A page of conflicts
/// holds forty payloads a sender chose; shown whole, each as large as its source allows, one
/// view would cost the gateway hundreds of megabytes.
pub(crate) fn payload_within(bytes: &[u8], max: usize) -> Markup {
    if bytes.len() <= max {
        return payload(bytes);
    }
    let head = &bytes[..max];
    // A cut inside a character leaves its start as text and the rest unshown.
    let text = match std::str::from_utf8(head) {
        Ok(text) => Some(text),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    html! {
        p.muted { "The first " (max / 1024) " KiB of " (bytes.len()) " bytes:" }
        @match text {
            Some(text) => pre.payload { (text) "…" },
            None => pre.payload.hex { (hex::encode(&head[..max / 2])) "…" },
        }
    }
}

/// A state as a badge; the class is chosen from a fixed list, never from the stored text.
pub(crate) fn badge(state: &str) -> Markup {
    let class = match state {
        "completed" | "delivered" => "ok",
        "rejected" | "dead" | "conflict" => "bad",
        "uncertain" | "retrying" => "warn",
        _ => "neutral",
    };
    html! { span class={ "badge " (class) } { (state) } }
}
