//! Routes: where accepted events go, which events each one takes, and how it is delivered.
//! Plain data; the gateway matches events to routes and the relay sends to them.

use std::time::Duration;

use crate::delivery::RetryPolicy;
use crate::json::{Pointer, Value};
use crate::key::Source;
use crate::signature::Secret;

/// One destination of events.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    /// Sources whose events this route takes.
    pub sources: Vec<Source>,
    /// Only events whose JSON value at the pointer equals this value (e.g. `/type` =
    /// `"payment_intent.succeeded"`); `None` takes every event of the sources.
    pub filter: Option<(Pointer, Value)>,
    pub url: String,
    pub timeout: Duration,
    /// Signs every request with Standard Webhooks headers, so receivers verify with any
    /// Standard Webhooks library.
    pub signing_secret: Option<Secret>,
    /// The receiver honours `Idempotency-Key`: a request without an answer may be retried.
    pub idempotent: bool,
    /// `GET` with `{key}` replaced asks the receiver whether it applied a key.
    pub status_url: Option<String>,
    pub retry: RetryPolicy,
    /// Requests in flight to this route at once.
    pub concurrency: usize,
    /// PEM certificates of authorities an `https` receiver's certificate may come from,
    /// trusted beside the system's (a receiver behind a private authority).
    pub ca_pem: Option<Vec<u8>>,
}

impl Route {
    /// Whether an event of `source` with body `doc` (when it parsed as JSON) goes here.
    pub fn takes(&self, source: &Source, doc: Option<&Value>) -> bool {
        if !self.sources.contains(source) {
            return false;
        }
        match &self.filter {
            None => true,
            Some((pointer, want)) => doc.and_then(|d| d.pointer(pointer)) == Some(want),
        }
    }
}
