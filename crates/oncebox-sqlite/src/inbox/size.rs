//! Events too long for the store, refused before they reach the writer: SQLite refuses a
//! string, BLOB or row longer than its connection's `SQLITE_LIMIT_LENGTH` ("string or blob too
//! big"), which as a failure of the batch answered every event beside it `Unavailable` too,
//! and the event itself `Unavailable` on every retry, forever.

use oncebox_core::{Event, Invalid, OutboxMessage, ProcessError};

use super::Inbox;

/// Bytes of an inbox row beside its variable fields, at most: SQLite's record header (a
/// length of up to 9 bytes per column), the integers (8 bytes each), the state and the
/// fingerprint. Counted generously: an event a few hundred bytes under the limit is refused
/// rather than one over it let through to fail its batch.
const ROW_OVERHEAD: usize = 256;

/// The same for an outbox row, with room for the relay's bookkeeping written later (status,
/// an error cut short, a note).
const DELIVERY_OVERHEAD: usize = 1024;

/// The bytes the inbox record of `event` takes at most, before its response.
pub(crate) fn record_bytes(event: &Event) -> usize {
    let key = &event.key;
    [
        key.source.as_str().len(),
        key.event_id.as_str().len(),
        event.payload.len(),
        event.meta.content_type.as_deref().map_or(0, str::len),
        event.meta.header_lines().map_or(0, str::len),
        ROW_OVERHEAD,
    ]
    .iter()
    .fold(0, |sum, n| sum.saturating_add(*n))
}

/// The bytes the outbox row of `message`, queued for `event`, takes at most.
fn delivery_bytes(event: &Event, message: &OutboxMessage) -> usize {
    [
        message.destination.len(),
        message.idempotency_key.len(),
        message.payload.len(),
        message.content_type.len(),
        event.key.source.as_str().len(),
        event.key.event_id.as_str().len(),
        DELIVERY_OVERHEAD,
    ]
    .iter()
    .fold(0, |sum, n| sum.saturating_add(*n))
}

impl Inbox {
    /// `Invalid::TooLarge` for an event whose record the writer could not store.
    pub(crate) fn refuse_too_large(&self, event: &Event) -> Result<(), ProcessError> {
        self.refuse_longer(record_bytes(event))
    }

    /// The same for the gateway's record of `event`, which also keeps its answer, the longer
    /// of `answers` (accepted or stale), in the row: a long event id is in both, and an event
    /// whose record fit only without its answer failed its batch at the insert.
    pub(crate) fn refuse_too_large_answered(
        &self,
        event: &Event,
        answers: &[&[u8]],
    ) -> Result<(), ProcessError> {
        let answer = answers.iter().map(|a| a.len()).max().unwrap_or(0);
        self.refuse_longer(record_bytes(event).saturating_add(answer))
    }

    /// The same for the gateway's deliveries of `event`, each holding its payload again.
    pub(crate) fn refuse_too_large_deliveries(
        &self,
        event: &Event,
        messages: &[OutboxMessage],
    ) -> Result<(), ProcessError> {
        let longest = messages.iter().map(|m| delivery_bytes(event, m)).max();
        self.refuse_longer(longest.unwrap_or(0))
    }

    fn refuse_longer(&self, size: usize) -> Result<(), ProcessError> {
        let limit = self.shared.length_limit;
        if size > limit {
            return Err(ProcessError::Invalid(Invalid::TooLarge { size, limit }));
        }
        Ok(())
    }
}
