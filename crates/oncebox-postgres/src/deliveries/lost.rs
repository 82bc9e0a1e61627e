//! Claims whose answer was lost and whose rows a look by the claim's id did not find: the
//! statement may still commit on the server, later (it waited for a lock while its connection
//! was cut). Left, its rows would sit in flight under tokens nobody holds until their lease ran
//! out, and then be taken over as possibly sent, which parks a delivery on a route that ignores
//! the key `uncertain`. So each later claim of this inbox first gives such rows back.

use std::sync::{Arc, Mutex};

use oncebox_core::Timestamp;

use crate::error::storage;
use crate::inbox::Inbox;

/// At most this many lost claims are remembered; the oldest leave first. Each costs every
/// later claim part of one `UPDATE` while it is remembered, and losing one only brings back
/// the takeover above.
const KEPT: usize = 64;

/// The lost claims of one inbox (and its clones): each claim's id and when to forget it.
#[derive(Debug, Clone, Default)]
pub(crate) struct LostClaims(Arc<Mutex<Vec<(i64, Timestamp)>>>);

impl LostClaims {
    /// Remembers a claim until `until`: past the end of its lease and one more, by when any
    /// node's claim has taken its rows over, had it committed.
    pub(crate) fn remember(&self, claim_id: i64, until: Timestamp) {
        let mut lost = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lost.len() == KEPT {
            lost.remove(0);
        }
        lost.push((claim_id, until));
    }

    /// The ids still worth a look at `now`; the others are forgotten.
    fn due(&self, now: Timestamp) -> Vec<i64> {
        let mut lost = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lost.retain(|(_, until)| *until > now);
        lost.iter().map(|(id, _)| *id).collect()
    }
}

/// Gives back the rows a lost claim leased, as `unclaim` gives back one: nobody sent them. A row
/// that claim took over from an expired lease stays in flight with its lease ended, so the next
/// claim takes it over again and still says it may have been sent. A row claimed since carries
/// another claim id and is left alone.
const GIVE_BACK: &str = "
    UPDATE oncebox_outbox SET
      state = CASE WHEN claim_taken_over THEN 'in_flight'
                   WHEN attempts = 0 THEN 'pending' ELSE 'retrying' END,
      lease_token = CASE WHEN claim_taken_over THEN lease_token END,
      lease_expires_at = CASE WHEN claim_taken_over THEN least(lease_expires_at, $3) END,
      claim_id = NULL, updated_at = $2
    WHERE state = 'in_flight' AND claim_id = ANY($1)";

impl Inbox {
    /// Before a claim: gives back what lost claims leased after all. A failure is logged and
    /// the ids kept for the next claim; the claim itself goes ahead.
    /// `on_server`: `now` on the server's clock, which lease ends are on.
    pub(super) async fn give_back_lost(&self, now: Timestamp, on_server: Timestamp) {
        let ids = self.lost_claims.due(now);
        if ids.is_empty() {
            return;
        }
        let given = sqlx::query(GIVE_BACK)
            .bind(&ids)
            .bind(now.millis())
            .bind(on_server.millis())
            .execute(&self.pool);
        match crate::silent::answered(self.lost_after, given).await {
            // The ids stay even so: the count does not say whose rows came back, and another lost
            // claim may still commit.
            Ok(done) if done.rows_affected() > 0 => tracing::warn!(
                rows = done.rows_affected(),
                "a claim whose answer was lost committed later; its deliveries were given back"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %storage(&e),
                "could not give back the deliveries of a lost claim; the next claim tries again"
            ),
        }
    }
}
