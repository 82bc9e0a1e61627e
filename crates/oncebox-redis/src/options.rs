//! How a `Leases` handle is set up: the key namespace, how long answers are kept, the
//! per-call deadline, the clock that dates lease expiry and the CA a TLS server is checked
//! against.

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
    pub retention: Retention,
    /// A call not answered within this time is `Unavailable::Deadline`: connecting, waiting for
    /// a reconnect and the round trip all count.
    pub deadline: Duration,
    /// Dates `Lease::expires_at`. Redis expires the lease on its own clock; the holder's
    /// estimate is taken before the request is sent, so it is never later than Redis's.
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
