//! What the gateway does per source and as a whole: plain data, validated by whoever builds it
//! (the binary, from configuration) and passed in once.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use oncebox_core::json::{Pointer, Value};
use oncebox_core::signature::{Scheme, Secret};
use oncebox_core::store::{Order, OrderFieldInvalid};
use oncebox_core::{EventId, FingerprintMode, Source};

/// Where a source's event id comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventIdRule {
    /// A request header (lowercase name).
    Header(String),
    /// A JSON pointer into the body; a string or an integer.
    Pointer(Pointer),
    /// SHA-256 of these fields' canonical values, for senders that send no id.
    Derive(Vec<Pointer>),
    /// `Idempotency-Key`, then `webhook-id`, then the body's `/id`.
    Default,
}

/// The ordering guard: an event whose `version` is older than the newest applied one for its
/// entity (its `entity` id, of its `kind` when one is named) is stored as stale and not
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderGuard {
    pub entity: Pointer,
    pub version: Pointer,
    /// The entity's type (`type = "/data/object/object"`), for a sender whose ids are unique
    /// only within a type (customer 7 and order 7); `None`: the id alone names the entity.
    pub kind: Option<Pointer>,
}

impl OrderGuard {
    /// The guard on `entity` by `version`, ids unique across the source's types.
    pub fn new(entity: Pointer, version: Pointer) -> OrderGuard {
        OrderGuard {
            entity,
            version,
            kind: None,
        }
    }

    /// The entity and version `doc` carries: `None` when a field is absent (the event is not
    /// guarded), an error naming the field when one has the wrong type.
    pub fn read(&self, doc: &Value) -> Result<Option<Order>, OrderFieldInvalid> {
        let (Some(entity), Some(version)) = (doc.pointer(&self.entity), doc.pointer(&self.version))
        else {
            return Ok(None);
        };
        let kind = match &self.kind {
            Some(p) => match doc.pointer(p) {
                Some(kind) => Some(Self::name(p, kind)?),
                None => return Ok(None),
            },
            None => None,
        };
        let entity = Self::name(&self.entity, entity)?;
        let invalid = |field: &Pointer, expected| OrderFieldInvalid {
            field: field.to_string(),
            expected,
        };
        let Value::Number(n) = version else {
            return Err(invalid(&self.version, "an integer"));
        };
        let version = n
            .to_i64()
            .ok_or_else(|| invalid(&self.version, "an integer of at most 64 bits"))?;
        // A type and an id are joined by a unit separator, which neither may hold: no two
        // (type, id) pairs join alike, and none joins as an untyped id.
        let entity = match kind {
            Some(kind) => format!("{kind}\u{1f}{entity}"),
            None => entity,
        };
        Ok(Some(Order { entity, version }))
    }

    /// An entity's id or type, read at `field`: a string, or an integer in plain decimal.
    fn name(field: &Pointer, value: &Value) -> Result<String, OrderFieldInvalid> {
        let invalid = |expected| OrderFieldInvalid {
            field: field.to_string(),
            expected,
        };
        let name = match value {
            Value::String(s) => s.clone(),
            // In plain decimal, as an event id is: `1000`, `1e3` and `"1000"` are one entity.
            // (The number's canonical text, `1e3`, set `1000` apart from `"1000"`, and let a
            // fraction through.)
            Value::Number(n) => n
                .integer_text(EventId::MAX_LEN)
                .ok_or_else(|| invalid("a string, or an integer of at most 255 digits"))?,
            _ => return Err(invalid("a string")),
        };
        // Held to an event id's rules: a NUL or a few kilobytes is refused here, as a bad
        // request, rather than by the storage (PostgreSQL refuses both, as an error no retry
        // gets past), and the entity key stays a short, printable one.
        if EventId::new(name.as_str()).is_err() {
            return Err(invalid(
                "a number or a string of 1 to 255 bytes, not blank, without control characters",
            ));
        }
        Ok(name)
    }
}

/// One source's rules.
#[derive(Debug, Clone)]
pub struct SourcePolicy {
    pub scheme: Scheme,
    /// Several secrets: rotation. Never logged.
    pub secrets: Vec<Secret>,
    /// Allowed clock difference with the sender, both directions.
    pub tolerance: Duration,
    pub event_id: EventIdRule,
    pub fingerprint: FingerprintMode,
    /// For a source whose records may hold fingerprints an earlier version took another way
    /// (its preset's fingerprint changed): `fingerprint`, shared with its events, by which a
    /// record whose fingerprint differs is compared by its stored payload before it is called a
    /// conflict (`Event::recheck`).
    pub recheck: Option<Arc<FingerprintMode>>,
    pub max_body: usize,
    pub retention: Duration,
    pub order: Option<OrderGuard>,
}

impl SourcePolicy {
    /// The zero-configuration source: no signature, the default event id rule, JSON
    /// fingerprints, 1 MiB bodies, seven days of retention.
    pub fn open() -> SourcePolicy {
        SourcePolicy {
            scheme: Scheme::None,
            secrets: Vec::new(),
            tolerance: Duration::from_secs(300),
            event_id: EventIdRule::Default,
            fingerprint: FingerprintMode::Json,
            recheck: None,
            max_body: 1 << 20,
            retention: oncebox_core::retention::DEFAULT_RETENTION,
            order: None,
        }
    }
}

/// Resource limits of the HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests handled at once; past it the gateway answers 503 at once instead of queueing.
    pub concurrency: usize,
    /// Connections open at once; past it new ones wait in the listener's backlog, so that
    /// clients holding connections cannot take the descriptors the store and the relay need.
    pub connections: usize,
    /// Request bodies one peer (an IPv4 address, an IPv6 /64) may have arriving at once, each
    /// holding a permit of `concurrency` while it does; past it such a request is answered 503.
    /// A body that arrives with its head in the server's first read is never counted. 0: no
    /// cap.
    pub bodies_per_peer: usize,
    /// Time allowed to send the request headers (slowloris).
    pub header_timeout: Duration,
    /// Time allowed to send the body once the headers arrived.
    pub body_timeout: Duration,
    /// On shutdown, how long in-flight requests may take to finish; the rest are cut, never
    /// answered 2xx.
    pub shutdown_grace: Duration,
    /// What 503 and 409 answers ask senders to wait.
    pub retry_after: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            concurrency: 1024,
            connections: 10_000,
            bodies_per_peer: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// The gateway's whole configuration.
#[derive(Clone, Default)]
pub struct GatewayConfig {
    pub sources: BTreeMap<Source, SourcePolicy>,
    /// Zero-configuration mode: any source name is accepted with [`SourcePolicy::open`].
    pub open_sources: bool,
    /// Bearer token of the admin API. Without one, admin endpoints answer only to loopback
    /// peers.
    pub admin_token: Option<String>,
    pub limits: Limits,
    /// Where accepted events are delivered; each matching route gets one delivery, committed
    /// with the event.
    pub routes: Vec<oncebox_core::route::Route>,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The admin token is a credential: never printed, not even in debug logs.
        f.debug_struct("GatewayConfig")
            .field("sources", &self.sources)
            .field("open_sources", &self.open_sources)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("limits", &self.limits)
            .field("routes", &self.routes)
            .finish()
    }
}

impl GatewayConfig {
    /// The routes an event of `source` with body `doc` goes to.
    pub fn routes_for(
        &self,
        source: &Source,
        doc: Option<&oncebox_core::json::Value>,
    ) -> Vec<String> {
        self.routes
            .iter()
            .filter(|r| r.takes(source, doc))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Whether routing `source`'s events needs the parsed body.
    pub fn routes_read_body(&self, source: &Source) -> bool {
        self.routes
            .iter()
            .any(|r| r.filter.is_some() && r.sources.contains(source))
    }
}

static OPEN: LazyLock<SourcePolicy> = LazyLock::new(SourcePolicy::open);

impl GatewayConfig {
    /// The policy for a source named in a URL: configured, or open in zero-config mode.
    pub fn source(&self, name: &Source) -> Option<&SourcePolicy> {
        match self.sources.get(name) {
            Some(p) => Some(p),
            None if self.open_sources => Some(&OPEN),
            None => None,
        }
    }
}
