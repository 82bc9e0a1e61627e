//! What a finished record is dated (`completed_at`, which retention reads): the node's clock,
//! never earlier than the node's boot anchor says real time is (`oncebox_core::stamp_floor`).
//! Dated by a wall clock that stepped back and was later set right, a record looked as old as
//! the step, and a purge deleted it while its sender could still send the event again.

use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::{BootAnchor, Clock, Timestamp};

/// This node's boot anchor as it last read or wrote it; clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stamps(Arc<Mutex<Option<BootAnchor>>>);

impl Stamps {
    pub fn set(&self, anchor: Option<BootAnchor>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = anchor;
    }

    /// The date of a record finished at `now` on `clock`.
    pub fn completed(&self, clock: &dyn Clock, now: Timestamp) -> Timestamp {
        let anchor = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        oncebox_core::stamp_floor(anchor, clock.boot()).map_or(now, |floor| now.max(floor))
    }
}
