//! The gateway's outermost layer: the concurrency limit (past it a request is answered 503 at
//! once instead of queueing, so an overload shows as fast retries rather than as timeouts at
//! the sender), and the framework's own errors rewritten as problem documents
//! (`rejection.rs`). A shed ingest request is counted under its source as `unavailable`; the
//! health probes are never shed (a busy gateway is alive, and its readiness is the store's).
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

use crate::policy::GatewayConfig;
use crate::problem::Problem;

/// Permits for requests in flight.
#[derive(Debug, Clone)]
pub(crate) struct Edge {
    permits: Arc<Semaphore>,
    retry_after: Duration,
    /// Which source names are counted as themselves.
    config: Arc<GatewayConfig>,
    /// A recorder is installed (see `meter::ingest`).
    installed: bool,
}

impl Edge {
    pub fn new(config: &GatewayConfig, installed: bool) -> Edge {
        Edge {
            permits: Arc::new(Semaphore::new(config.limits.concurrency.max(1))),
            retry_after: config.limits.retry_after,
            config: Arc::new(config.clone()),
            installed,
        }
    }

    /// Counts a shed ingest request under its source, as the handler counts what it answers.
    fn count_shed(&self, request: &Request) {
        metrics::counter!("oncebox_shed_total").increment(1);
        let path = request.uri().path();
        let source = path
            .strip_prefix("/v1/sources/")
            .and_then(|rest| rest.strip_suffix("/events"))
            .filter(|name| !name.contains('/'));
        if let (true, Some(name)) = (request.method() == axum::http::Method::POST, source) {
            let label = match oncebox_core::Source::new(name) {
                Ok(source) if crate::meter::known(&self.config, &source) => name,
                _ => "unknown",
            };
            crate::meter::ingest(self.installed, label, "unavailable", Duration::ZERO);
        }
    }
}

/// The probes, answered past the limit: each is a few microseconds of work.
fn is_probe(request: &Request) -> bool {
    matches!(request.uri().path(), "/healthz" | "/readyz")
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
        let permit = self.edge.permits.clone().try_acquire_owned().ok();
        if permit.is_none() && !is_probe(&request) {
            self.edge.count_shed(&request);
            let shed = Problem::unavailable("too many requests in flight", self.edge.retry_after);
            return Answering::Ready {
                response: Some(shed.into_response()),
            };
        }
        // The clone that was made ready is the one that serves (tower's rule for `call`).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Answering::Running {
            future: inner.call(request),
            permit,
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
