//! The gateway's outermost layer: the concurrency limit (past it a request is answered 503 at
//! once instead of queueing, so an overload shows as fast retries rather than as timeouts at
//! the sender), and the framework's own errors rewritten as problem documents
//! (`rejection.rs`).
//!
//! Written as one tower service rather than two axum middlewares: `from_fn` clones the inner
//! service into a box and boxes its future on every request, and `map_response` boxes
//! another; with new events those were about a microsecond of each request's CPU. Here a
//! request that needs no rewriting (every success) costs one permit and no allocation.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::problem::Problem;

/// Permits for requests in flight.
#[derive(Debug, Clone)]
pub(crate) struct Edge {
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

impl Edge {
    pub fn new(concurrency: usize, retry_after: Duration) -> Edge {
        Edge {
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            retry_after,
        }
    }
}

impl<S> Layer<S> for Edge {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            edge: self.clone(),
        }
    }
}

/// The router behind the limit and the rewriting.
#[derive(Debug, Clone)]
pub(crate) struct Guarded<S> {
    inner: S,
    edge: Edge,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Ok(permit) = self.edge.permits.clone().try_acquire_owned() else {
            metrics::counter!("oncebox_shed_total").increment(1);
            let shed = Problem::unavailable("too many requests in flight", self.edge.retry_after);
            return Answering::Ready {
                response: Some(shed.into_response()),
            };
        };
        // The clone that was made ready is the one that serves (tower's rule for `call`).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Answering::Running {
            future: inner.call(request),
            permit: Some(permit),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer through the edge.
    #[project = Step]
    pub(crate) enum Answering<F> {
        /// Shed: the answer is known.
        Ready { response: Option<Response> },
        /// In the router, holding its permit until the answer's head is there.
        Running { #[pin] future: F, permit: Option<OwnedSemaphorePermit> },
        /// A framework error being rewritten (its body is read).
        Rewriting { future: Pin<Box<dyn Future<Output = Response> + Send>> },
    }
}

impl<F> Future for Answering<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                Step::Ready { response } => {
                    // Polled again after it answered, which hyper never does: never a 2xx.
                    let response = response.take().unwrap_or_else(|| {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
                    });
                    return Poll::Ready(Ok(response));
                }
                Step::Running { future, permit } => {
                    let Ok(response) = ready!(future.poll(cx));
                    drop(permit.take());
                    if !crate::rejection::untyped_error(&response) {
                        return Poll::Ready(Ok(response));
                    }
                    let rewrite = Box::pin(crate::rejection::as_problem(response));
                    self.set(Answering::Rewriting { future: rewrite });
                }
                Step::Rewriting { future } => return future.as_mut().poll(cx).map(Ok),
            }
        }
    }
}
