//! Admin API for deliveries: list by state and route, retry, resolve by hand, redeliver an
//! event to its routes with the same key.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, DeliveryView, Resolve};
use oncebox_core::store::EventStore;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::problem::Problem;
use crate::{Gateway, rfc3339};

/// Unknown parameters are refused: `?status=dead` for `?state=dead` listed everything, and a
/// script resolving "every uncertain delivery" that way would have settled them all.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    state: Option<String>,
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    route: Option<String>,
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    after: Option<i64>,
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    limit: Option<usize>,
}

pub(crate) fn view(d: &DeliveryView) -> Value {
    json!({
        "id": d.id,
        "route": d.route,
        "source": d.key.source.as_str(),
        "event_id": d.key.event_id.as_str(),
        "idempotency_key": d.idempotency_key,
        "state": d.state.as_str(),
        "attempts": d.attempts,
        "created_at": rfc3339(d.created_at),
        "next_attempt_at": d.next_attempt_at.map(rfc3339),
        "last_status": d.last_status,
        "last_error": d.last_error,
        "note": d.note,
        "hops": d.hops,
    })
}

fn unavailable(e: &oncebox_core::Unavailable, gw_retry: std::time::Duration) -> Response {
    Problem::action_unavailable(e, gw_retry).into_response()
}

pub(crate) async fn list<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match crate::rejection::query(q) {
        Ok(q) => q,
        Err(p) => return p.into_response(),
    };
    let state = match q
        .state
        .as_deref()
        .map(|s| DeliveryState::parse(s).ok_or(s))
        .transpose()
    {
        Ok(s) => s,
        Err(bad) => {
            return Problem::invalid_request("invalid-query", format!("unknown state {bad:?}"))
                .into_response();
        }
    };
    // No route's name holds one (PostgreSQL cannot even bind a NUL: the store would answer
    // `unavailable`, and the client retry a request that can never work).
    if let Some(bad) = q
        .route
        .as_deref()
        .filter(|r| r.chars().any(char::is_control))
    {
        return Problem::invalid_request(
            "invalid-query",
            format!("no route is named {bad:?}: route names hold no control characters"),
        )
        .into_response();
    }
    let filter = DeliveryFilter {
        state,
        route: q.route,
        key: None,
        after: q.after,
        due_by: None,
        limit: q.limit.unwrap_or(50).clamp(1, 500),
    };
    match gw.store.deliveries(filter).await {
        Ok(page) => Json(json!({
            "items": page.items.iter().map(view).collect::<Vec<_>>(),
            "next": page.next.map(|n| n.to_string()),
        }))
        .into_response(),
        Err(e) => unavailable(&e, gw.config.limits.retry_after),
    }
}

pub(crate) async fn retry<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    Path(id): Path<i64>,
) -> Response {
    match gw.store.retry(id, gw.clock.now()).await {
        Ok(true) => Json(json!({ "id": id, "state": "pending" })).into_response(),
        Ok(false) => {
            refusal(
                &gw,
                id,
                ("not-retryable", "Not retryable"),
                "only dead, uncertain or retrying deliveries can be retried",
            )
            .await
        }
        Err(e) => unavailable(&e, gw.config.limits.retry_after),
    }
}

/// Why `retry` or `resolve` changed nothing: the stores answer `false` both when there is no
/// such delivery (404 `no-delivery`) and when its state refuses the action (409, naming it).
async fn refusal<S: EventStore + DeliveryStore>(
    gw: &Gateway<S>,
    id: i64,
    (slug, title): (&'static str, &'static str),
    rule: &str,
) -> Response {
    match oncebox_core::relay_store::delivery(&gw.store, id).await {
        Ok(Some(d)) => Problem::new(
            axum::http::StatusCode::CONFLICT,
            slug,
            title,
            format!("delivery {id} is {}: {rule}", d.state),
        )
        .into_response(),
        Ok(None) => Problem::new(
            axum::http::StatusCode::NOT_FOUND,
            "no-delivery",
            "No such delivery",
            format!("no delivery {id}"),
        )
        .into_response(),
        Err(e) => unavailable(&e, gw.config.limits.retry_after),
    }
}

pub(crate) struct ResolveBody {
    outcome: String,
    /// Free text; absent and `null` both mean none.
    note: Option<String>,
}

impl ResolveBody {
    /// Read with the strict parser: an operator's settlement is final, so a body naming
    /// `outcome` twice (`{"outcome":"dead","outcome":"delivered"}`) is refused, not taken by
    /// its last value. Other members are ignored. A note holding a NUL is refused: PostgreSQL
    /// cannot store one.
    fn parse(body: &[u8]) -> Option<ResolveBody> {
        use oncebox_core::json::Value as J;
        let J::Object(members) = oncebox_core::json::parse(body).ok()? else {
            return None;
        };
        let member = |name: &str| members.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let outcome = match member("outcome")? {
            J::String(s) => s.clone(),
            _ => return None,
        };
        let note = match member("note") {
            None | Some(J::Null) => None,
            Some(J::String(s)) if !s.contains('\0') => Some(s.clone()),
            Some(_) => return None,
        };
        Some(ResolveBody { outcome, note })
    }
}

pub(crate) async fn resolve<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    Path(id): Path<i64>,
    body: axum::body::Bytes,
) -> Response {
    let Some(body) = ResolveBody::parse(&body) else {
        return Problem::invalid_request(
            "invalid-json",
            r#"expected {"outcome":"delivered"|"dead","note":"…"} (each once; no NUL in the note)"#,
        )
        .into_response();
    };
    let resolution = match body.outcome.as_str() {
        "delivered" => Resolve::Delivered,
        "dead" => Resolve::Dead,
        other => {
            return Problem::invalid_request(
                "invalid-json",
                format!("outcome must be delivered or dead, not {other:?}"),
            )
            .into_response();
        }
    };
    match gw
        .store
        .resolve(
            id,
            resolution,
            body.note.as_deref().unwrap_or(""),
            gw.clock.now(),
        )
        .await
    {
        Ok(true) => Json(json!({ "id": id, "state": body.outcome })).into_response(),
        Ok(false) => {
            refusal(
                &gw,
                id,
                ("not-resolvable", "Not resolvable"),
                "only pending, retrying, uncertain or dead deliveries, or one in flight past its relay's lease, can be resolved by hand",
            )
            .await
        }
        Err(e) => unavailable(&e, gw.config.limits.retry_after),
    }
}

pub(crate) async fn redeliver<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let key = match crate::admin::key_in_path(path) {
        Ok(k) => k,
        Err(problem) => return problem.into_response(),
    };
    match gw.store.redeliver(&key, gw.clock.now()).await {
        Ok(0) => nothing_redelivered(&gw, &key).await,
        Ok(n) => {
            Json(json!({ "redelivered": n, "idempotency_key": key.to_string() })).into_response()
        }
        Err(e) => unavailable(&e, gw.config.limits.retry_after),
    }
}

/// Why `redeliver` changed nothing: every delivery of the event is being sent right now (409
/// `in-flight`: redeliver once they settle), the event has none because no route took it (404
/// `no-deliveries`, as with every event of a gateway without routes), or there is no such event
/// (404 `event-not-found`).
async fn nothing_redelivered<S: EventStore + DeliveryStore>(
    gw: &Gateway<S>,
    key: &oncebox_core::Key,
) -> Response {
    let of_event = DeliveryFilter {
        key: Some(key.clone()),
        limit: 1,
        ..DeliveryFilter::default()
    };
    let has_deliveries = match gw.store.deliveries(of_event).await {
        Ok(page) => !page.items.is_empty(),
        Err(e) => return unavailable(&e, gw.config.limits.retry_after),
    };
    if has_deliveries {
        return Problem::new(
            axum::http::StatusCode::CONFLICT,
            "in-flight",
            "Being delivered",
            format!("every delivery of {key} is being sent now; redeliver once they settle"),
        )
        .into_response();
    }
    match gw.store.event(key).await {
        Ok(None) => Problem::not_found("event-not-found", format!("no event {key}")),
        Ok(Some(_)) => Problem::not_found(
            "no-deliveries",
            format!("{key} has no deliveries to redeliver: no route took it"),
        ),
        Err(e) => return unavailable(&e, gw.config.limits.retry_after),
    }
    .into_response()
}
