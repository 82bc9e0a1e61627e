//! Sessions ended by a logout, remembered until their cookies would have expired: a session
//! cookie is signed, not stored, so without this list a copy taken before the logout (from a
//! shared machine, a proxy's log) would go on working for the rest of its lifetime.

use std::collections::HashMap;
use std::sync::Mutex;

use oncebox_core::Timestamp;

/// The nonces of sessions logged out on this gateway, each with the latest time its cookie
/// could still verify. Held in memory: a gateway that restarts, or another node of a
/// PostgreSQL deployment, does not know them (changing the admin token ends every session
/// everywhere).
#[derive(Debug, Default)]
pub struct Logouts(Mutex<HashMap<String, Timestamp>>);

impl Logouts {
    /// Ends the session `nonce`, whose cookie verifies until `expires` at the latest. Entries
    /// whose cookies have expired by `now` are dropped: the signature check refuses those.
    pub(crate) fn end(&self, nonce: &str, expires: Timestamp, now: Timestamp) {
        let mut ended = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ended.retain(|_, until| *until > now);
        ended.insert(nonce.to_owned(), expires);
    }

    /// Whether the session `nonce` was logged out.
    pub(crate) fn ended(&self, nonce: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_session_is_remembered_until_its_cookie_expires() {
        let logouts = Logouts::default();
        logouts.end("a", Timestamp(100), Timestamp(0));
        assert!(logouts.ended("a") && !logouts.ended("b"));
        logouts.end("b", Timestamp(300), Timestamp(100));
        assert!(!logouts.ended("a"), "expired by the next logout: dropped");
        assert!(logouts.ended("b"));
    }
}
