//! How a `Leases` handle is set up: the key namespace, how long answers are kept, the
//! per-call deadline, the clock that estimates lease expiry (Redis ends leases on its own host's
//! wall clock) and the CA a TLS server is checked against.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Clock, Retention, SystemClock};

/// Options of [`crate::Leases::connect`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Prefix of every key this handle writes (`{namespace}:k:…`, `{namespace}:fence`), so
    /// several applications can share one Redis. Handles that must exclude each other use the
    /// same namespace.
    pub namespace: String,
    /// How long a `done` record (and its first response) is kept, per source. Keep it no longer
    /// than the SQL inbox keeps its records: the cache should never outlive the truth.
    /// `remember` counts it from the record's completion; `complete` from its own call, which
    /// follows the inbox's completion.
    pub retention: Retention,
    /// A call not answered within this time is `Unavailable::Deadline`: connecting, waiting for
    /// a reconnect and the round trip all count.
    pub deadline: Duration,
    /// Dates `Lease::expires_at`, from a reading taken before the request is sent: an
    /// estimate. Redis ends the lease on its host's wall clock, so the estimate is no later
    /// than Redis's only while both clocks keep time. A forward jump of the Redis host's clock
    /// (or a failover to a host whose clock runs ahead) ends the lease before `expires_at`,
    /// and the holder is not told: only a receiver that checks the token stops its late call.
    /// Also the clock `remember` counts the retention left on.
    pub clock: Arc<dyn Clock>,
    /// For a `rediss://` URL: the certificate authority (PEM) the server's certificate must
    /// chain to, for a Redis whose certificate a private CA signed. `None` trusts the system's
    /// roots.
    pub root_certificate: Option<Vec<u8>>,
}

impl Options {
    pub fn new(namespace: impl Into<String>) -> Options {
        Options {
            namespace: namespace.into(),
            retention: Retention::default(),
            deadline: Duration::from_secs(2),
            clock: Arc::new(SystemClock),
            root_certificate: None,
        }
    }

    pub fn retention(mut self, retention: Retention) -> Options {
        self.retention = retention;
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Options {
        self.deadline = deadline;
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Options {
        self.clock = clock;
        self
    }

    pub fn root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Options {
        self.root_certificate = Some(pem.into());
        self
    }
}

impl Default for Options {
    fn default() -> Options {
        Options::new("oncebox")
    }
}
