//! The two-phase form for effects outside the database: a fenced lease on a key.

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::outcome::{Response, Unavailable};

/// Exclusive right to perform a key's external effect until `expires_at`.
///
/// `token` is a fencing token: it only ever grows for a store, so a holder whose lease expired
/// and was taken over carries a smaller token and every write it attempts is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: Key,
    pub token: i64,
    pub expires_at: Timestamp,
}

/// Whether a two-phase lease begun (or last taken over) at `begun_at` and expiring at
/// `expires_at` still holds at `now`, when another `begin` finds it.
///
/// Its remaining time can never exceed the TTL it was given (`expires_at − begun_at`): a lease
/// that seems begun after `now` shows the wall clock went back, by an unknown amount, and counts
/// as expired so it is taken over (with a new fencing token) rather than held for the length of
/// the jump.
pub fn lease_live(begun_at: Timestamp, expires_at: Timestamp, now: Timestamp) -> bool {
    begun_at <= now && now < expires_at
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
    fn a_lease_begun_in_the_future_is_expired() {
        let (begun, expires) = (Timestamp(1_000), Timestamp(31_000));
        assert!(lease_live(begun, expires, Timestamp(1_000)));
        assert!(lease_live(begun, expires, Timestamp(30_999)));
        assert!(!lease_live(begun, expires, Timestamp(31_000)), "expired");
        assert!(
            !lease_live(begun, expires, Timestamp(999)),
            "clock went back"
        );
        assert!(!lease_live(begun, expires, Timestamp(-3_600_000)));
    }
}
