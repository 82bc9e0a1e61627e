//! The uncertain and dead delivery queues, and how one delivery is shown everywhere: its state,
//! its attempts (status, latency, error) and the operator's buttons, which call the admin API.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{AttemptRecord, DeliveryFilter, DeliveryStore, DeliveryView};
use oncebox_core::store::EventStore;
use serde::Deserialize;

use super::events::event_href;
use super::layout::{self, Nav, badge, duration, page, time};
use super::{gate_with, unavailable};
use crate::Gateway;

const PAGE: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct QueueQuery {
    after: Option<i64>,
}

pub(crate) async fn queue<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    state: Result<Path<String>, PathRejection>,
    q: Result<Query<QueueQuery>, QueryRejection>,
) -> Response {
    let read = state
        .map_err(|e| e.to_string())
        .and_then(|s| Ok((s, q.map_err(|e| e.to_string())?)));
    let (access, (Path(state), Query(q))) = match gate_with(&gw, &headers, read) {
        Ok(read) => read,
        Err(r) => return r,
    };
    let (state, nav, title) = match state.as_str() {
        "uncertain" => (
            DeliveryState::Uncertain,
            Nav::Uncertain,
            "Uncertain deliveries",
        ),
        "dead" => (DeliveryState::Dead, Nav::Dead, "Dead deliveries"),
        _ => return layout::problem(StatusCode::NOT_FOUND, &access, "No such queue."),
    };
    let filter = DeliveryFilter {
        state: Some(state),
        after: q.after,
        limit: PAGE,
        ..DeliveryFilter::default()
    };
    let page_ = match gw.store.deliveries(filter).await {
        Ok(p) => p,
        Err(e) => return unavailable(&gw, &access, &e),
    };
    let explain = match state {
        DeliveryState::Uncertain => {
            "The request may or may not have reached the receiver. Check with the receiver, then \
             mark the delivery delivered or dead, or retry it with the same idempotency key."
        }
        _ => {
            "Attempts or age ran out, or the receiver refused. Retry sends it again with the \
              same idempotency key."
        }
    };
    let body = html! {
        p.muted { (explain) }
        table.queue {
            thead { tr { th { "#" } th { "route" } th { "event" } th { "attempts" } th { "last status" }
                         th { "last error" } th { "note" } th { "created" } th { "" } } }
            tbody {
                @for d in &page_.items {
                    tr data-delivery=(d.id) {
                        td.num { (d.id) }
                        td { (d.route) }
                        td { a href=(event_href(&d.key)) { (d.key.to_string()) } }
                        td.num { (d.attempts) }
                        td { (d.last_status.map(|s| s.to_string()).unwrap_or_default()) }
                        td.error { (d.last_error.as_deref().unwrap_or("")) }
                        td { (d.note.as_deref().unwrap_or("")) }
                        td { (time(d.created_at)) }
                        td { (actions(d)) }
                    }
                }
            }
        }
        @if page_.items.is_empty() { p.muted { "Nothing here." } }
        @if let Some(n) = page_.next { a.next href={ "?after=" (n) } { "Next page →" } }
    };
    page(title, &access, nav, &body)
}

/// The buttons that apply to a delivery in its state. The script posts them to the admin API
/// (`/v1/deliveries/{id}/retry`, `/v1/deliveries/{id}/resolve`) and reloads.
pub(crate) fn actions(d: &DeliveryView) -> Markup {
    let settleable = matches!(
        d.state,
        DeliveryState::Uncertain | DeliveryState::Dead | DeliveryState::Retrying
    );
    html! {
        @if settleable {
            span.actions {
                button type="button" data-action="retry" data-id=(d.id) { "Retry" }
                button type="button" data-action="delivered" data-id=(d.id) { "Mark delivered" }
                @if d.state != DeliveryState::Dead {
                    button type="button" data-action="dead" data-id=(d.id) { "Mark dead" }
                }
            }
        }
    }
}

/// One delivery of an event with its attempts.
pub(crate) fn delivery(d: &DeliveryView, attempts: &[AttemptRecord]) -> Markup {
    html! {
        section.delivery #{ "delivery-" (d.id) } data-state=(d.state.as_str()) {
            h3 { "#" (d.id) " → " (d.route) " " (badge(d.state.as_str())) " " (actions(d)) }
            p.muted {
                "Idempotency-Key " code { (d.idempotency_key) } " · "
                (d.attempts) " attempt(s)"
                @if let Some(t) = d.next_attempt_at { " · next " (time(t)) }
                @if let Some(n) = &d.note { " · note: " (n) }
            }
            table.attempts {
                thead { tr { th { "started" } th { "latency" } th { "status" } th { "error" } } }
                tbody {
                    @for a in attempts {
                        tr {
                            td { (time(a.started_at)) }
                            td.num { (duration(a.duration)) }
                            td { (a.status.map(|s| s.to_string()).unwrap_or_else(|| "—".to_owned())) }
                            td.error { (a.error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}
