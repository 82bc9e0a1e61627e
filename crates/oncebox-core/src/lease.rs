//! The two-phase form for effects outside the database: a fenced lease on a key.

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use std::time::Duration;

use crate::outcome::{Invalid, Response, Unavailable};

/// Exclusive right to perform a key's external effect until `expires_at`.
///
/// `token` is a fencing token: it only ever grows for a store, so a holder whose lease expired
/// and was taken over carries a smaller token and every write it attempts is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a lease ends with complete, release or uncertain; left alone it blocks the key \
              until it expires, and the next holder is told of a takeover"]
pub struct Lease {
    pub key: Key,
    pub token: i64,
    pub expires_at: Timestamp,
    /// This lease replaced an earlier holder's that expired unfinished: that holder may have
    /// performed the effect before it stopped (it crashed, or stalled past its lease, after
    /// the call). Perform it again only if the outside party honours a key or can be asked
    /// whether it happened; otherwise call `uncertain` and leave it to reconciliation. Redis
    /// tells while it keeps the ended lease's record (as long again as the lease); one taken
    /// after that, or after Redis forgot the key, says `false`.
    pub taken_over: bool,
}

/// The shortest lease `begin` grants. The stores keep a lease's expiry in milliseconds.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(1);

/// Refuses a TTL shorter than [`MIN_LEASE_TTL`] (`Duration::ZERO`, typically a setting left at
/// 0): every store's `begin` asks this before it takes anything.
pub fn check_ttl(ttl: Duration) -> Result<(), Invalid> {
    if ttl < MIN_LEASE_TTL {
        Err(Invalid::LeaseTtl(ttl))
    } else {
        Ok(())
    }
}

/// What the SQL stores log when `process` (or the gateway's ingest), holding no lease of its
/// own, finds a two-phase lease expired unfinished and parks the key uncertain instead of
/// running its handler after a call that may have gone out.
pub const PARKED_EXPIRED_LEASE: &str = "a two-phase lease on this key expired unfinished, its \
    outside effect unknown: parked uncertain for resolve, not taken over by process";

/// What another `begin` (or `process`) makes of a two-phase lease it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSeen {
    /// Held: answer in progress.
    Live,
    /// Past its expiry: take it over with a new fencing token.
    Expired,
    /// Begun more than its TTL after `now`, so the wall clock went back since. Held for the
    /// jump's length it would be stuck; taken over at once, two holders could run the outside
    /// effect. It keeps its holder and token and is re-anchored: it now expires one full TTL
    /// after `now` (this instant), which the store writes back.
    Reanchor(Timestamp),
}

/// How a lease begun (or last taken over) at `begun_at` and expiring at `expires_at` stands at
/// `now`. Its remaining time never exceeds twice the TTL it was given (`expires_at − begun_at`).
///
/// A lease begun less than a TTL after `now` is left as it is: on several nodes that is one
/// node's clock running ahead of another's, and re-anchoring it on the slower clock would cut
/// the holder's lease by the skew (SQLite's delivery leases follow the same rule).
pub fn lease_seen(begun_at: Timestamp, expires_at: Timestamp, now: Timestamp) -> LeaseSeen {
    let ttl = expires_at.millis().saturating_sub(begun_at.millis()).max(0);
    if begun_at.millis().saturating_sub(now.millis()) > ttl {
        return LeaseSeen::Reanchor(Timestamp(now.millis().saturating_add(ttl)));
    }
    if now < expires_at {
        LeaseSeen::Live
    } else {
        LeaseSeen::Expired
    }
}

/// What `begin` found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Begun {
    /// The key was free (or its previous lease expired): perform the effect, then complete.
    Leased(Lease),
    /// The key already completed with the same fingerprint: its first response.
    Duplicate(Response),
}

/// Why a lease operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease expired or was taken over by a higher token: this holder may no longer write.
    #[error("lease lost: expired or taken over by a newer holder")]
    Fenced,
    #[error("unavailable: {0}")]
    Unavailable(#[from] Unavailable),
    /// The response is longer than the store keeps with its record (SQLite's
    /// `SQLITE_LIMIT_LENGTH`, `Options::length_limit`; PostgreSQL's `MAX_EVENT_BYTES`; Redis's
    /// `MAX_RESPONSE_BYTES`): every retry would be refused alike.
    /// Nothing was written and the lease is still this holder's: release it, or complete with
    /// a shorter response.
    #[error("response too large for the store: {0}")]
    TooLarge(String),
}

/// How an operator settles a key left `uncertain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The external effect did happen: the key is done and replays this response.
    Completed(Response),
    /// It did not happen: the key is free again and a retry performs it.
    Released,
}

/// A key's record as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Key,
    pub fingerprint: Option<Fingerprint>,
    pub state: RecordState,
    pub payload: Option<Vec<u8>>,
    pub received_at: Timestamp,
    pub completed_at: Option<Timestamp>,
}

/// A record's state (DESIGN §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// Held by a two-phase lease.
    Processing {
        lease_token: Option<i64>,
        lease_expires_at: Option<Timestamp>,
    },
    /// Terminal: its first response, replayed for duplicates.
    Done(Response),
    /// A two-phase effect's outcome is unknown; awaits reconciliation.
    Uncertain,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_begun_in_the_future_is_reanchored_for_one_ttl() {
        let (begun, expires) = (Timestamp(1_000), Timestamp(31_000));
        assert_eq!(
            lease_seen(begun, expires, Timestamp(1_000)),
            LeaseSeen::Live
        );
        assert_eq!(
            lease_seen(begun, expires, Timestamp(30_999)),
            LeaseSeen::Live
        );
        assert_eq!(
            lease_seen(begun, expires, Timestamp(31_000)),
            LeaseSeen::Expired
        );
        // Begun up to a TTL ahead of now (another node's clock, or a short jump back): held as
        // it is, so a skew never cuts the holder's lease.
        assert_eq!(lease_seen(begun, expires, Timestamp(999)), LeaseSeen::Live);
        assert_eq!(
            lease_seen(begun, expires, Timestamp(-29_000)),
            LeaseSeen::Live
        );
        // The clock went back further: one full TTL from now, neither the jump's length nor
        // nothing.
        assert_eq!(
            lease_seen(begun, expires, Timestamp(-29_001)),
            LeaseSeen::Reanchor(Timestamp(-29_001 + 30_000))
        );
        assert_eq!(
            lease_seen(begun, expires, Timestamp(-3_600_000)),
            LeaseSeen::Reanchor(Timestamp(-3_570_000))
        );
        assert_eq!(
            lease_seen(Timestamp(i64::MAX), Timestamp(i64::MIN), Timestamp(0)),
            LeaseSeen::Reanchor(Timestamp(0))
        );
    }
}
