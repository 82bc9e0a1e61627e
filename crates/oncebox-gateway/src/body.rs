//! Reading a request body whole, within a size limit and the body timeout: an event's body in
//! the ingress, and every admin or dashboard body before its handler runs.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::peers::busy_in;
use crate::policy::Limits;
use crate::problem::Problem;
use crate::{Gateway, OTHER_BODY_LIMIT};

/// Reads at most `limit` bytes within the body timeout: an oversize body is refused by its
/// declared length at once, or as soon as the stream passes the limit, never buffered whole.
/// `who` names the receiver in the 413's detail ("this source"). A body its peer's cap refused
/// (`peers.rs`) is a 503, retried after `limits.retry_after`.
pub(crate) async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    limits: &Limits,
    who: &str,
) -> Result<Bytes, Problem> {
    let too_large = || Problem::body_too_large(format!("{who} accepts at most {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let read = Limited::new(body, limit).collect();
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Body not received in time",
            "the request body did not arrive within the body timeout",
        )),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => match busy_in(e.as_ref()) {
            Some(busy) => {
                metrics::counter!("oncebox_peer_bodies_refused_total").increment(1);
                Err(Problem::unavailable(busy.to_string(), limits.retry_after))
            }
            None => Err(Problem::invalid("body-unreadable", e.to_string())),
        },
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// The admin API's and the dashboard's bodies (a login form, a resolve note) are read here,
/// whole, before their handlers and guards run. Past the body timeout the request is answered
/// 408, as an event's is: every request holds a permit of the concurrency limit until it is
/// answered, and `/login` is open to anyone, so a form trickled in byte by byte must not hold
/// one (and with enough of them, the gateway's intake) for longer than an event's sender can.
pub(crate) async fn bounded<S: Send + Sync + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    match read_bounded(
        &parts.headers,
        body,
        OTHER_BODY_LIMIT,
        &gw.config.limits,
        "this endpoint",
    )
    .await
    {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(problem) => problem.into_response(),
    }
}
