//! The overview (live counters per source and outcome, the last hour's arrivals, deliveries
//! per state), the filtered event list and the page of one event.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore};
use oncebox_core::store::{EventFilter, EventStore, StoredEvent};
use oncebox_core::{Key, Source, Timestamp};
use serde::Deserialize;

use super::layout::{self, Nav, badge, page, time};
use super::{gate, gate_with, queues, unavailable};
use crate::Gateway;

/// The outcomes the counters show, in this order; `conflict` counts refused payloads.
pub(crate) const OUTCOMES: &[&str] = &[
    "completed",
    "rejected",
    "stale",
    "processing",
    "uncertain",
    "conflict",
];
/// Events a list page shows.
const PAGE: usize = 50;
/// Filters are applied while reading pages of this size, at most this many pages per request,
/// so a rare match in a large store costs a bounded read; the page then offers to read on.
const SCAN_PAGE: usize = 500;
const SCAN_PAGES: usize = 10;
/// The time ranges the list offers.
pub(crate) const RANGES: &[(&str, &str)] = &[
    ("", "any time"),
    ("15m", "last 15 minutes"),
    ("1h", "last hour"),
    ("24h", "last 24 hours"),
    ("7d", "last 7 days"),
];

pub(crate) async fn overview<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
) -> Response {
    let access = match gate(&gw, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    // Asked together: with the store down, each waits out the deadline, and one after the
    // other the page took twice as long as any other to say so.
    let (activity, gauges) = match tokio::join!(
        gw.store
            .activity(gw.clock.now().minus(super::api::WINDOW), super::api::BUCKET),
        gw.store.gauges(),
    ) {
        (Ok(a), Ok(g)) => (a, g),
        (Err(e), _) | (_, Err(e)) => return unavailable(&gw, &access, &e),
    };
    let mut per_source: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
    for (source, state, n) in &activity.counts {
        *per_source
            .entry(source)
            .or_default()
            .entry(state.as_str())
            .or_default() += n;
    }
    let body = html! {
        section {
            h2 { "Events per source and outcome" }
            table #counters {
                thead { tr { th { "source" } @for o in OUTCOMES { th { (o) } } } }
                tbody {
                    @for (source, counts) in &per_source {
                        tr {
                            td { a href={ "/events?source=" (source) } { (source) } }
                            @for o in OUTCOMES { td.num { (counts.get(o).copied().unwrap_or(0)) } }
                        }
                    }
                    @if per_source.is_empty() { tr.empty { td colspan="7" { "No events yet." } } }
                }
            }
        }
        section {
            h2 { "Arrivals in the last hour, per minute" }
            svg #chart viewBox="0 0 720 160" role="img" aria-label="arrivals per minute" {}
            p.muted #chart-total {}
        }
        section {
            h2 { "Deliveries" }
            table #deliveries {
                thead { tr { th { "state" } th { "count" } } }
                tbody {
                    @for (state, n) in &gauges.by_state {
                        tr {
                            td { @if state == "uncertain" || state == "dead" {
                                a href={ "/deliveries/" (state) } { (badge(state)) }
                            } @else { (badge(state)) } }
                            td.num { (n) }
                        }
                    }
                }
            }
            @if let Some(t) = gauges.oldest_pending { p { "Oldest delivery still owed: " (time(t)) } }
        }
    };
    page("Overview", &access, Nav::Overview, &body)
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    source: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    since: String,
    after: Option<i64>,
}

fn matches(e: &StoredEvent, outcome: &str) -> bool {
    match outcome {
        "" => true,
        "conflict" => e.conflicts > 0,
        state => e.state == state,
    }
}

pub(crate) async fn list<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let (access, Query(q)) = match gate_with(&gw, &headers, q) {
        Ok(read) => read,
        Err(r) => return r,
    };
    let bad = |detail: String| layout::problem(StatusCode::BAD_REQUEST, &access, &detail);
    let source = match (!q.source.is_empty())
        .then(|| Source::new(&q.source))
        .transpose()
    {
        Ok(s) => s,
        Err(e) => return bad(format!("source: {e}")),
    };
    if !q.outcome.is_empty() && !OUTCOMES.contains(&q.outcome.as_str()) {
        return bad(format!("unknown outcome {:?}", q.outcome));
    }
    let since = match RANGES.iter().find(|(v, _)| *v == q.since) {
        Some(("", _)) => None,
        Some((v, _)) => humantime::parse_duration(v).ok(),
        None => return bad(format!("unknown time range {:?}", q.since)),
    };
    let oldest = since.map(|d: Duration| gw.clock.now().minus(d));
    let mut items = Vec::new();
    let mut cursor = q.after;
    let mut next = None;
    'scan: for _ in 0..SCAN_PAGES {
        let filter = EventFilter {
            source: source.clone(),
            after: cursor,
            limit: SCAN_PAGE,
        };
        let page = match gw.store.events(filter).await {
            Ok(p) => p,
            Err(e) => return unavailable(&gw, &access, &e),
        };
        for e in page.items {
            cursor = Some(e.seq);
            if matches(&e, &q.outcome) && oldest.is_none_or(|t| e.received_at >= t) {
                items.push(e);
                if items.len() == PAGE {
                    next = cursor;
                    break 'scan;
                }
            }
        }
        match page.next {
            // The page's own cursor: past rows it skipped (ones that no longer parse) too.
            Some(n) => {
                cursor = Some(n);
                next = cursor;
            }
            None => {
                next = None;
                break;
            }
        }
    }
    let filters = html! {
        form.filters method="get" action="/events" {
            label { "Source " input type="text" name="source" value=(q.source) list="sources"; }
            datalist #sources { @for s in gw.config.sources.keys() { option value=(s.as_str()) {} } }
            label { "Outcome " select name="outcome" {
                option value="" { "any" }
                @for o in OUTCOMES { option value=(o) selected[q.outcome == *o] { (o) } }
            } }
            label { "Received " select name="since" {
                @for (v, label) in RANGES { option value=(v) selected[q.since == *v] { (label) } }
            } }
            button type="submit" { "Filter" }
        }
    };
    // New arrivals are appended live only on the last page, where they belong: after the
    // page's start, and not older than its time range (events it skipped as too old, or an
    // earlier page's, are not arrivals).
    let live = next.is_none().then(|| cursor.unwrap_or(0));
    let from = q.after.unwrap_or(0);
    let oldest_ms = oldest.map(Timestamp::millis);
    let body = html! {
        (filters)
        table.events {
            thead { tr { th { "#" } th { "received" } th { "source" } th { "event id" } th { "state" } th { "conflicts" } } }
            tbody #events data-live=[live] data-from=(from) data-oldest=[oldest_ms]
                data-source=(q.source) data-outcome=(q.outcome) {
                @for e in &items { (row(e)) }
            }
        }
        @if items.is_empty() { p.muted #no-events { "No events match." } }
        @if let Some(n) = next {
            a.next href={ "/events?source=" (encode(&q.source)) "&outcome=" (encode(&q.outcome)) "&since=" (encode(&q.since)) "&after=" (n) } { "Next page →" }
        }
    };
    page("Events", &access, Nav::Events, &body)
}

/// The link to an event's page: `/events/{source}/{event_id}`, both parts percent-encoded path
/// segments, or `/event?source=…&id=…` for a key with a part that is `.` or `..`. Such a
/// segment is a dot-segment, which a browser removes when it resolves the link
/// (`/events/shop/..` opens `/events/`), percent-encoded or not: the WHATWG URL standard takes
/// `%2E%2E` for `..` too. A query is never resolved so. `dashboard.js` writes its links the
/// same way (`eventHref`).
pub(crate) fn event_href(key: &Key) -> String {
    let (source, id) = (key.source.as_str(), key.event_id.as_str());
    if dot_segment(source) || dot_segment(id) {
        format!("/event?source={}&id={}", encode(source), encode(id))
    } else {
        format!("/events/{}/{}", encode(source), encode(id))
    }
}

fn dot_segment(s: &str) -> bool {
    matches!(s, "." | "..")
}

/// Percent-encodes everything but unreserved characters, so any event id is one segment.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn row(e: &StoredEvent) -> Markup {
    html! {
        tr {
            td.num { (e.seq) }
            td { (time(e.received_at)) }
            td { (e.key.source.as_str()) }
            td { a.event-link href=(event_href(&e.key)) { (e.key.event_id.as_str()) } }
            td { (badge(&e.state)) }
            td.num { (e.conflicts) }
        }
    }
}

/// `/events/{source}/{event_id}`: the page of one event.
pub(crate) async fn show<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    match gate_with(&gw, &headers, path) {
        Ok((_, Path((source, event_id)))) => one(&gw, &headers, &source, &event_id).await,
        Err(r) => r,
    }
}

/// The key of `/event?source=…&id=…`.
#[derive(Deserialize)]
pub(crate) struct KeyQuery {
    source: String,
    id: String,
}

/// `/event?source=…&id=…`: the same page, for a key no path can carry (see [`event_href`]).
pub(crate) async fn show_query<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    q: Result<Query<KeyQuery>, QueryRejection>,
) -> Response {
    match q {
        Ok(Query(k)) => one(&gw, &headers, &k.source, &k.id).await,
        // Gated first: a visitor not signed in goes to /login whatever the query says.
        Err(_) => match gate(&gw, &headers) {
            Ok(access) => layout::problem(
                StatusCode::BAD_REQUEST,
                &access,
                "Name the event by source and id.",
            ),
            Err(r) => r,
        },
    }
}

async fn one<S: EventStore + DeliveryStore>(
    gw: &Arc<Gateway<S>>,
    headers: &HeaderMap,
    source: &str,
    event_id: &str,
) -> Response {
    let access = match gate(gw, headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Ok(key) = Key::parse(source, event_id) else {
        return layout::problem(StatusCode::BAD_REQUEST, &access, "Not an event key.");
    };
    let event = match gw.store.event(&key).await {
        Ok(Some(e)) => e,
        Ok(None) => {
            return layout::problem(StatusCode::NOT_FOUND, &access, &format!("No event {key}."));
        }
        Err(e) => return unavailable(gw, &access, &e),
    };
    let filter = DeliveryFilter {
        key: Some(key.clone()),
        limit: 500,
        ..DeliveryFilter::default()
    };
    let deliveries = match gw.store.deliveries(filter).await {
        Ok(p) => p.items,
        Err(e) => return unavailable(gw, &access, &e),
    };
    let mut attempts = Vec::with_capacity(deliveries.len());
    for d in &deliveries {
        match gw.store.attempts(d.id).await {
            Ok(a) => attempts.push(a),
            Err(e) => return unavailable(gw, &access, &e),
        }
    }
    let body = html! {
        dl.facts {
            dt { "source" } dd #source { (key.source.as_str()) }
            dt { "event id" } dd #event-id { (key.event_id.as_str()) }
            dt { "state" } dd #state { (badge(&event.state)) }
            dt { "fingerprint" } dd { code #fingerprint { (event.fingerprint.map(|f| f.to_hex()).unwrap_or_default()) } }
            dt { "received" } dd { (time(event.received_at)) }
            dt { "completed" } dd { @if let Some(t) = event.completed_at { (time(t)) } @else { "—" } }
            dt { "content type" } dd { (event.meta.content_type.as_deref().unwrap_or("—")) }
            dt { "conflicts" } dd { @if event.conflicts > 0 {
                a href={ "/conflicts?source=" (encode(key.source.as_str())) "&event_id=" (encode(key.event_id.as_str())) } { (event.conflicts) }
            } @else { "0" } }
        }
        h2 { "Headers" }
        table.headers { tbody { @for (name, value) in event.meta.headers() { tr { th { (name) } td { (value) } } } } }
        h2 { "Payload" }
        div #payload { (layout::payload(&event.payload)) }
        @if let Some(r) = &event.response {
            h2 { "Stored answer" }
            (layout::payload(&r.body))
        }
        h2 { "Deliveries" }
        @if deliveries.is_empty() { p.muted { "No route takes this event." } }
        @for (d, tries) in deliveries.iter().zip(&attempts) {
            (queues::delivery(d, tries))
        }
    };
    page(&format!("Event {key}"), &access, Nav::Events, &body)
}

#[cfg(test)]
mod tests {
    use oncebox_core::{EventId, Key, Source};

    use super::event_href;

    /// An id that is a dot-segment is linked by a query: a browser resolving `/events/shop/..`
    /// (or `/events/shop/%2E%2E`) would open `/events/` instead. Other ids keep their path.
    #[test]
    fn an_event_link_is_never_a_dot_segment() {
        for (id, href) in [
            ("..", "/event?source=shop&id=.."),
            (".", "/event?source=shop&id=."),
            ("...", "/events/shop/..."),
            ("a.b", "/events/shop/a.b"),
            ("a/..", "/events/shop/a%2F.."),
        ] {
            let key = Key::new(Source::new("shop").unwrap(), EventId::new(id).unwrap());
            assert_eq!(event_href(&key), href, "{id}");
        }
    }
}
