//! The two-phase form for effects outside the database: a fenced lease on a key.

use crate::clock::Timestamp;
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
