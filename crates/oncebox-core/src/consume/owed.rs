//! Quarantines owed: a message the store answered as a conflict whose quarantined copy the
//! broker did not take, so it came back. Its next delivery goes straight to the quarantine
//! again rather than to the store, which keeps an audit row of the offered payload each time
//! it is asked: with the quarantine unroutable for an hour, one conflicting message retried
//! every 5 s would have written 720 copies of its payload.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::{Reason, Settle};
use crate::fingerprint::Fingerprint;
use crate::key::Key;

/// Keys remembered at most; past this the memory is cleared, and those messages are asked of
/// the store again on their next delivery (one more audit row each, never a lost message).
const MAX_REMEMBERED: usize = 10_000;

/// Per consumer: the conflicts whose quarantine is owed, by key and offered payload.
#[derive(Debug, Default)]
pub struct Owed(Mutex<HashMap<(Key, Fingerprint), Reason>>);

impl Owed {
    /// The reason a delivery of `key` with this payload's `fingerprint` is owed to the
    /// quarantine, if it is; taken out of the memory until [`Owed::note`] puts it back.
    pub fn take(&self, key: &Key, fingerprint: Fingerprint) -> Option<Reason> {
        let mut owed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        owed.remove(&(key.clone(), fingerprint))
    }

    /// Remembers a conflict (`decided` quarantines it as `key-reused`) whose quarantine was
    /// not done (`settled` requeued it instead).
    pub fn note(&self, key: &Key, fingerprint: Fingerprint, decided: &Settle, settled: &Settle) {
        let (Settle::Quarantine(reason @ Reason::KeyReused { .. }), Settle::Requeue { .. }) =
            (decided, settled)
        else {
            return;
        };
        let mut owed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if owed.len() >= MAX_REMEMBERED {
            owed.clear();
        }
        owed.insert((key.clone(), fingerprint), reason.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::Requeue;
    use std::time::Duration;

    #[test]
    fn only_a_conflict_whose_quarantine_was_requeued_is_owed() {
        let owed = Owed::default();
        let key = Key::parse("shop", "evt_1").unwrap();
        let (stored, offered) = (Fingerprint::from([1; 32]), Fingerprint::from([2; 32]));
        let reused = Settle::Quarantine(Reason::KeyReused { stored, offered });
        let requeued = Settle::Requeue {
            why: Requeue::Unavailable,
            after: Duration::from_secs(5),
        };
        // Quarantined as decided: nothing owed.
        owed.note(&key, offered, &reused, &reused);
        assert_eq!(owed.take(&key, offered), None);
        // Another reason's failed quarantine: asked of the store again.
        let invalid = Settle::Quarantine(Reason::InvalidJson("x".into()));
        owed.note(&key, offered, &invalid, &requeued);
        assert_eq!(owed.take(&key, offered), None);
        owed.note(&key, offered, &reused, &requeued);
        assert_eq!(owed.take(&key, stored), None, "another payload is not owed");
        assert!(matches!(
            owed.take(&key, offered),
            Some(Reason::KeyReused { .. })
        ));
        assert_eq!(owed.take(&key, offered), None, "taken");
    }
}
