//! oncebox-core: the vocabulary every backend shares — keys, strict JSON fingerprints, outcomes,
//! leases and retention — with no IO and no database driver.

pub mod chain;
pub mod clock;
pub mod consume;
pub mod crash;
pub mod delivery;
pub mod effect;
pub mod event;
pub mod fingerprint;
pub mod hops;
pub mod json;
pub mod key;
pub mod lease;
pub mod outcome;
pub mod relay_store;
pub mod retention;
pub mod route;
pub mod shown;
pub mod signature;
pub mod store;

pub use clock::{Boot, Clock, LONGEST_WAIT, ManualClock, SystemClock, Timestamp, purge_now};
pub use effect::{Enqueued, NulInName, OffsetMove, Once, check_names};
pub use event::{Event, InvalidMessage, Meta, OutboxMessage, SHORT_STRING_MAX};
pub use fingerprint::{Fingerprint, FingerprintMode, PayloadError};
pub use key::{EventId, InvalidKey, Key, Source};
pub use lease::{
    Begun, Lease, LeaseError, LeaseSeen, MIN_LEASE_TTL, PARKED_EXPIRED_LEASE, Record, RecordState,
    Resolution, check_ttl, lease_seen,
};
pub use outcome::{Invalid, ProcessError, Processed, Response, ResponseKind, Unavailable};
pub use retention::{
    BootAnchor, PURGE_LAG_ADVICE, PURGE_LAG_WARNING, PurgeAnchor, Retention, Stamps, boot_bound,
    purge_lag, purge_time, stamp_floor,
};
