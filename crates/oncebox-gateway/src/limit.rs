//! The gateway's outermost layer: the concurrency limit (past it a request is answered 503 at
//! once instead of queueing, so an overload shows as fast retries rather than as timeouts at
//! the sender), and the framework's own errors rewritten as problem documents
//! (`rejection.rs`). A shed ingest request is counted under its source as `unavailable`. The
//! probes answer past the limit: `/healthz` always (a busy gateway is alive), `/readyz` within
//! a few permits of its own (its answer is the store's, and asking the store is work). So does
//! `/metrics`, within two of its own: an overload is when its figures (the shed count, the
//! latencies) matter most, and a scrape refused then left them dark for the whole incident.
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

/// Readiness probes answered at once past the limit.
const READY_PROBES: usize = 4;
/// Scrapes of `/metrics` answered at once past the limit (rendered from memory, no store call).
const SCRAPES: usize = 2;

/// Permits for requests in flight.
#[derive(Debug, Clone)]
pub(crate) struct Edge {
    permits: Arc<Semaphore>,
    /// For `/readyz` once `permits` are all taken.
    probes: Arc<Semaphore>,
    /// For `/metrics` once `permits` are all taken.
    scrapes: Arc<Semaphore>,
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
            probes: Arc::new(Semaphore::new(READY_PROBES)),
            scrapes: Arc::new(Semaphore::new(SCRAPES)),
            retry_after: config.limits.retry_after,
            config: Arc::new(config.clone()),
            installed,
        }
    }

    /// A permit for `request`: `Err` sheds it. `/healthz` needs none.
    fn admit(&self, request: &Request) -> Result<Option<OwnedSemaphorePermit>, ()> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(Some(permit));
        }
        match request.uri().path() {
            "/healthz" => Ok(None),
            "/readyz" => self
                .probes
                .clone()
                .try_acquire_owned()
                .map(Some)
                .map_err(drop),
            "/metrics" => self
                .scrapes
                .clone()
                .try_acquire_owned()
                .map(Some)
                .map_err(drop),
            _ => Err(()),
        }
    }

    /// Counts a shed ingest request under its source (its name percent-decoded, as the
    /// router's), as the handler counts what it answers; it has no latency to record.
    fn count_shed(&self, request: &Request) {
        metrics::counter!("oncebox_shed_total").increment(1);
        let path = request.uri().path();
        let source = path
            .strip_prefix("/v1/sources/")
            .and_then(|rest| rest.strip_suffix("/events"))
            .filter(|name| !name.contains('/'))
            .map(|name| percent_encoding::percent_decode_str(name).decode_utf8_lossy());
        if let (true, Some(name)) = (request.method() == axum::http::Method::POST, source) {
            let label = match oncebox_core::Source::new(name.as_ref()) {
                Ok(source) if crate::meter::known(&self.config, &source) => name.as_ref(),
                _ => crate::meter::UNKNOWN,
            };
            crate::meter::ingest(self.installed, label, "unavailable", None);
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
        let Ok(permit) = self.edge.admit(&request) else {
            self.edge.count_shed(&request);
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(path: &str) -> Request {
        Request::post(path).body(Body::empty()).expect("request")
    }

    /// Past the limit `/healthz` needs no permit, `/readyz` and `/metrics` take one of their
    /// own few, and everything else is shed.
    #[test]
    fn past_the_limit_only_the_probes_and_scrapes_are_admitted() {
        let config = GatewayConfig {
            limits: crate::policy::Limits {
                concurrency: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let edge = Edge::new(&config, false);
        let held = edge.admit(&request("/v1/sources/a/events"));
        assert!(matches!(held, Ok(Some(_))), "the one permit");
        assert!(edge.admit(&request("/v1/sources/a/events")).is_err());
        assert!(edge.admit(&request("/v1/stats")).is_err());
        let scrapes: Vec<_> = (0..SCRAPES)
            .map(|_| edge.admit(&request("/metrics")))
            .collect();
        assert!(scrapes.iter().all(|p| matches!(p, Ok(Some(_)))));
        assert!(
            edge.admit(&request("/metrics")).is_err(),
            "its permits taken"
        );
        let probes: Vec<_> = (0..READY_PROBES)
            .map(|_| edge.admit(&request("/readyz")))
            .collect();
        assert!(probes.iter().all(|p| matches!(p, Ok(Some(_)))));
        assert!(
            edge.admit(&request("/readyz")).is_err(),
            "its permits taken"
        );
        assert!(matches!(edge.admit(&request("/healthz")), Ok(None)));
        drop(held);
        assert!(matches!(edge.admit(&request("/readyz")), Ok(Some(_))));
    }
}
