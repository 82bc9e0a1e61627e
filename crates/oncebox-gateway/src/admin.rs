//! The admin API (bearer token, or loopback-only without one) and the open health endpoints.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore};
use oncebox_core::store::{EventFilter, EventStore, StoredEvent};
use oncebox_core::{Key, Source};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::problem::Problem;
use crate::{Gateway, rfc3339};

/// Default and largest page of `GET /v1/events`.
const PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// Lets a request through when it carries the admin token, or when no token is configured and
/// the listener is loopback-only. The token is compared in constant time.
pub(crate) async fn guard<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &gw.config.admin_token else {
        if gw.loopback_only {
            return match open_refusal(&request) {
                None => next.run(request).await,
                Some(refused) => refused.into_response(),
            };
        }
        // No credentials can help here: 403, not a 401 asking for a token that does not exist.
        return Problem::new(
            StatusCode::FORBIDDEN,
            "admin-disabled",
            "Admin API disabled",
            "no admin_token is configured and the listener is not loopback-only",
        )
        .into_response();
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    if given.is_some_and(|given| crate::dashboard::session::token_matches(token, given)) {
        return next.run(request).await;
    }
    // RFC 9110 §11.6.1: a 401 names the scheme that would be accepted.
    Problem::unauthorized("the admin API needs `Authorization: Bearer <admin_token>`")
        .challenge("Bearer realm=\"oncebox\"")
        .into_response()
}

/// Why a request to the admin API open without a token is refused, if it is: it comes from a
/// web page rather than from this machine's own clients. Any page the operator opens can send
/// requests to 127.0.0.1: one addressed by another site's name (a DNS answer rebound to
/// loopback) could read events, and a cross-site POST, which needs no preflight as
/// `text/plain`, could settle deliveries.
fn open_refusal(request: &Request) -> Option<Problem> {
    let headers = request.headers();
    if crate::dashboard::session::proxied(headers) {
        return Some(Problem::new(
            StatusCode::FORBIDDEN,
            "proxied",
            "Forwarded by a proxy",
            "without an admin_token the admin API answers only this machine's own clients, and \
             a proxy forwarded this request (Forwarded, X-Forwarded-For, X-Forwarded-Host, \
             X-Real-IP or Via): set admin_token to reach it through one",
        ));
    }
    if !crate::dashboard::session::loopback_host(headers) {
        return Some(Problem::new(
            StatusCode::FORBIDDEN,
            "host-not-loopback",
            "Host not loopback",
            "without an admin_token the admin API answers only requests addressed to a \
             loopback name (localhost, 127.0.0.1, [::1])",
        ));
    }
    let reads = matches!(*request.method(), Method::GET | Method::HEAD);
    if !reads && !crate::dashboard::session::same_origin(headers) {
        return Some(Problem::new(
            StatusCode::FORBIDDEN,
            "cross-origin",
            "Cross-origin request",
            "a browser sent this from another origin; the admin API changes nothing for \
             other sites' pages",
        ));
    }
    None
}

/// The token of an `Authorization` value in the bearer scheme (RFC 6750 §2.1). Scheme names
/// are case-insensitive (RFC 9110 §11.1): `bearer x` is as good as `Bearer x`.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Unknown parameters are refused: `?status=dead` for `?state=dead` listed everything, and a
/// script resolving "every uncertain delivery" that way would have settled them all.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    source: Option<String>,
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    after: Option<i64>,
    #[serde(default, deserialize_with = "crate::rejection::blank")]
    limit: Option<usize>,
}

pub(crate) async fn list<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match crate::rejection::query(q) {
        Ok(q) => q,
        Err(p) => return p.into_response(),
    };
    let source = match q.source.as_deref().map(Source::new).transpose() {
        Ok(s) => s,
        Err(e) => return Problem::invalid_request("invalid-query", e.to_string()).into_response(),
    };
    let filter = EventFilter {
        source,
        after: q.after,
        limit: q.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE),
    };
    match gw.store.events(filter).await {
        Ok(page) => {
            let items: Vec<Value> = page.items.iter().map(|e| summary(e, false)).collect();
            axum::Json(json!({ "items": items, "next": page.next.map(|n| n.to_string()) }))
                .into_response()
        }
        Err(e) => Problem::store_unavailable(&e, gw.config.limits.retry_after).into_response(),
    }
}

/// The key named by an admin URL, or the 400 that says why it is not one.
fn key_from_path(source: &str, event_id: &str) -> Result<Key, Problem> {
    Key::parse(source, event_id).map_err(|e| Problem::invalid_request("invalid-key", e.to_string()))
}

/// The key a `/v1/sources/{source}/events/{event_id}` path names. One whose percent-encoding is
/// not UTF-8 names no valid key either: `invalid-key`, as the document says, not the router's
/// generic `bad-request`.
pub(crate) fn key_in_path(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Key, Problem> {
    match path {
        Ok(Path((source, event_id))) => key_from_path(&source, &event_id),
        Err(e) => Err(Problem::invalid_request("invalid-key", e.body_text())),
    }
}

pub(crate) async fn show<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let key = match key_in_path(path) {
        Ok(k) => k,
        Err(problem) => return problem.into_response(),
    };
    match gw.store.event(&key).await {
        Ok(Some(e)) => {
            let mut body = summary(&e, true);
            match deliveries_of(&gw, &key).await {
                Ok(d) => body["deliveries"] = d,
                Err(e) => {
                    return Problem::store_unavailable(&e, gw.config.limits.retry_after)
                        .into_response();
                }
            }
            axum::Json(body).into_response()
        }
        Ok(None) => {
            Problem::not_found("event-not-found", format!("no event {key}")).into_response()
        }
        Err(e) => Problem::store_unavailable(&e, gw.config.limits.retry_after).into_response(),
    }
}

/// The event's deliveries, each with its attempts.
async fn deliveries_of<S: DeliveryStore>(
    gw: &Gateway<S>,
    key: &Key,
) -> Result<Value, oncebox_core::Unavailable> {
    let filter = DeliveryFilter {
        key: Some(key.clone()),
        limit: 500,
        ..DeliveryFilter::default()
    };
    let mut out = Vec::new();
    for d in gw.store.deliveries(filter).await?.items {
        let mut v = crate::deliveries::view(&d);
        let attempts = gw.store.attempts(d.id).await?;
        v["attempt_log"] = attempts
            .iter()
            .map(|a| {
                json!({
                    "started_at": rfc3339(a.started_at),
                    "duration_ms": a.duration.as_millis() as u64,
                    "status": a.status,
                    "error": a.error,
                })
            })
            .collect();
        out.push(v);
    }
    Ok(Value::Array(out))
}

/// Marks an admin answer not to be stored by any cache: an event's payload and headers, which
/// the dashboard's script fetches, would otherwise be left in the browser's disk cache.
pub(crate) async fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .entry(header::CACHE_CONTROL)
        .or_insert(axum::http::HeaderValue::from_static("no-store"));
    response
}

/// The document of `GET /v1/stats` (and `oncebox stats --output json`): records per state
/// under `events`, conflicts, deliveries, and the rows no purge removes under `kept`.
pub fn stats_document(s: &oncebox_core::store::Stats) -> Value {
    let states: serde_json::Map<String, Value> = s
        .every_state()
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    let k = s.kept;
    json!({
        "events": states, "conflicts": s.conflicts, "outbox": s.outbox,
        "kept": { "actions": k.actions, "versions": k.versions, "offsets": k.offsets },
    })
}

pub(crate) async fn stats<S: EventStore>(State(gw): State<Arc<Gateway<S>>>) -> Response {
    match gw.store.stats().await {
        Ok(s) => axum::Json(stats_document(&s)).into_response(),
        Err(e) => Problem::store_unavailable(&e, gw.config.limits.retry_after).into_response(),
    }
}

pub(crate) async fn metrics<S: EventStore>(State(gw): State<Arc<Gateway<S>>>) -> Response {
    match &gw.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => {
            Problem::not_found("metrics-disabled", "no metrics recorder installed").into_response()
        }
    }
}

pub(crate) async fn healthz() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

/// Ready when the store can take a write now.
pub(crate) async fn readyz<S: EventStore>(State(gw): State<Arc<Gateway<S>>>) -> Response {
    match gw.store.ready().await {
        Ok(()) => axum::Json(json!({ "status": "ready" })).into_response(),
        Err(e) => {
            // Open to anyone who reaches the listener: the kind only, the store's text logged.
            tracing::warn!(cause = %e, "not ready");
            let detail = crate::problem::public_detail(&e);
            Problem::unavailable(detail, gw.config.limits.retry_after).into_response()
        }
    }
}

fn text_or_hex(bytes: &[u8]) -> (&'static str, Value) {
    match std::str::from_utf8(bytes) {
        Ok(s) => ("text", json!(s)),
        Err(_) => (
            "hex",
            json!(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        ),
    }
}

/// An event as the admin API shows it; `full` adds payload, headers and the stored answer.
fn summary(e: &StoredEvent, full: bool) -> Value {
    let mut v = json!({
        "seq": e.seq,
        "source": e.key.source.as_str(),
        "event_id": e.key.event_id.as_str(),
        "state": e.state,
        "received_at": rfc3339(e.received_at),
        "completed_at": e.completed_at.map(rfc3339),
        "fingerprint": e.fingerprint.map(|f| f.to_hex()),
        "content_type": e.meta.content_type,
        "conflicts": e.conflicts,
    });
    if full {
        let (encoding, payload) = text_or_hex(&e.payload);
        v["payload"] = payload;
        v["payload_encoding"] = json!(encoding);
        v["headers"] = e.meta.headers().map(|(n, val)| json!([n, val])).collect();
        v["response"] = e.response.as_ref().map_or(Value::Null, response_document);
    }
    v
}

/// A stored first answer as the admin API and `inspect --output json` show it: every answer
/// the gateway stores was sent with 202, whatever its kind.
pub fn response_document(r: &oncebox_core::Response) -> Value {
    json!({
        "kind": r.kind.as_str(),
        "status": StatusCode::ACCEPTED.as_u16(),
        "body": String::from_utf8_lossy(&r.body),
    })
}
