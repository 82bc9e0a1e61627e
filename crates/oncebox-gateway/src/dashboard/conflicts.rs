//! The conflicts page: each refused payload next to the stored one that won, with the fields
//! that differ marked (compared as exact JSON values, like fingerprints; other payloads shown
//! as they are).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};
use oncebox_core::Key;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::{ConflictFilter, EventStore};
use serde::Deserialize;

use super::diff;
use super::events::{encode, event_href};
use super::layout::{self, Nav, time};
use super::{gate_with, unavailable};
use crate::Gateway;

/// Conflicts a page shows (each one shows two payloads).
const PAGE: usize = 20;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ConflictQuery {
    source: Option<String>,
    event_id: Option<String>,
    after: Option<i64>,
}

/// The most bytes of a payload the page shows: twenty conflicts of two payloads each stay a
/// few megabytes whatever the senders sent.
const SHOWN: usize = 32 * 1024;

/// Both payloads; the differing lines marked when both are JSON and small enough to show.
fn side_by_side(stored: &[u8], offered: &[u8]) -> Markup {
    if stored.len() > SHOWN || offered.len() > SHOWN {
        let (left, right) = (
            layout::payload_within(stored, SHOWN),
            layout::payload_within(offered, SHOWN),
        );
        return sides(&left, &right);
    }
    let parsed = (
        oncebox_core::json::parse(stored),
        oncebox_core::json::parse(offered),
    );
    let (left, right) = match &parsed {
        (Ok(a), Ok(b)) => match diff::differences(a, b) {
            Some(d) => {
                let (a, b) = (diff::pretty(a, &d), diff::pretty(b, &d));
                if diff::fits(&a, stored) && diff::fits(&b, offered) {
                    (diff::render(&a), diff::render(&b))
                } else {
                    (layout::payload(stored), layout::payload(offered))
                }
            }
            None => (
                html! { p.muted { "Too many differences to mark." } (layout::payload(stored)) },
                layout::payload(offered),
            ),
        },
        _ => (layout::payload(stored), layout::payload(offered)),
    };
    sides(&left, &right)
}

fn sides(left: &Markup, right: &Markup) -> Markup {
    html! {
        div.sides {
            div.side.stored { h4 { "stored (kept)" } (left) }
            div.side.offered { h4 { "offered (refused)" } (right) }
        }
    }
}

pub(crate) async fn page<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    q: Result<Query<ConflictQuery>, QueryRejection>,
) -> Response {
    let (access, Query(q)) = match gate_with(&gw, &headers, q) {
        Ok(read) => read,
        Err(r) => return r,
    };
    let key = match (&q.source, &q.event_id) {
        (Some(s), Some(e)) => match Key::parse(s, e) {
            Ok(k) => Some(k),
            Err(e) => {
                return layout::problem(StatusCode::BAD_REQUEST, &access, &e.to_string());
            }
        },
        (None, None) => None,
        // Half a key filters nothing the page could show as asked.
        _ => {
            let detail = "Name a key by both source and event_id, or neither.";
            return layout::problem(StatusCode::BAD_REQUEST, &access, detail);
        }
    };
    // The next page keeps the key it was asked for.
    let more = match &key {
        Some(k) => format!(
            "source={}&event_id={}&",
            encode(k.source.as_str()),
            encode(k.event_id.as_str())
        ),
        None => String::new(),
    };
    let filter = ConflictFilter {
        key,
        after: q.after,
        limit: PAGE,
    };
    let conflicts = match gw.store.conflicts(filter).await {
        Ok(p) => p,
        Err(e) => return unavailable(&gw, &access, &e),
    };
    let mut stored: HashMap<Key, Vec<u8>> = HashMap::new();
    for c in &conflicts.items {
        if stored.contains_key(&c.key) {
            continue;
        }
        match gw.store.event(&c.key).await {
            Ok(e) => {
                // A purged record leaves its conflicts: show an empty side rather than fail.
                stored.insert(c.key.clone(), e.map(|e| e.payload).unwrap_or_default());
            }
            Err(e) => return unavailable(&gw, &access, &e),
        }
    }
    let body = html! {
        p.muted { "The same key arrived with another payload. The first payload won and was \
                   processed; the later one was refused (422) and kept here for audit." }
        @for c in &conflicts.items {
            section.conflict data-conflict=(c.seq) {
                h3 { a href=(event_href(&c.key)) { (c.key.to_string()) } " · " (time(c.at)) }
                p.muted {
                    "stored fingerprint " code { (c.stored_fingerprint.map(|f| f.to_hex()).unwrap_or_default()) }
                    br;
                    "offered fingerprint " code { (c.offered_fingerprint.map(|f| f.to_hex()).unwrap_or_default()) }
                }
                (side_by_side(stored.get(&c.key).map(Vec::as_slice).unwrap_or_default(), &c.payload))
            }
        }
        @if conflicts.items.is_empty() { p.muted { "No conflicts." } }
        @if let Some(n) = conflicts.next { a.next href={ "/conflicts?" (more) "after=" (n) } { "Next page →" } }
    };
    layout::page("Conflicts", &access, Nav::Conflicts, &body)
}
