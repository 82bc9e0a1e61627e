//! The concurrency limit: past it a request is answered 503 at once instead of queueing, so an
//! overload shows as fast retries rather than as timeouts at the sender.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use crate::problem::Problem;

/// Permits for requests in flight.
#[derive(Debug)]
pub(crate) struct Limiter {
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

impl Limiter {
    pub fn new(concurrency: usize, retry_after: Duration) -> Arc<Limiter> {
        Arc::new(Limiter {
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            retry_after,
        })
    }
}

pub(crate) async fn shed(
    State(limiter): State<Arc<Limiter>>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = limiter.permits.clone().try_acquire_owned() else {
        metrics::counter!("oncebox_shed_total").increment(1);
        return Problem::unavailable("too many requests in flight", limiter.retry_after)
            .into_response();
    };
    next.run(request).await
}
