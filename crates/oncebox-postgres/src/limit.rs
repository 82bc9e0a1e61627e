//! The largest event PostgreSQL can keep. A field value, a row and a protocol message are each
//! bounded by 1 GiB, and an event past that fails the same way on every try: as a storage
//! error, which callers would retry for ever.

use oncebox_core::store::Ingest;
use oncebox_core::{Event, Invalid, LeaseError, ProcessError};

/// The most bytes of payload and header lines one event may hold. PostgreSQL takes each field
/// value, each row as it is formed (before TOAST moves values out of line) and each protocol
/// message (the `Bind` carrying a statement's parameters, the `DataRow` carrying a row back)
/// in one buffer of at most 1 GiB − 1 byte (`MaxAllocSize`; a larger message resets the
/// connection). The payload and the header lines share all three, so their sum counts; the
/// MiB kept back is for the rest of the row and the messages: key, fingerprint, content type,
/// stored answer, framing. Measured on PostgreSQL 15: an event of exactly this size is stored
/// and read back, on both paths in; a payload of 1 GiB − 100 bytes resets the connection.
pub const MAX_EVENT_BYTES: usize = (1 << 30) - (1 << 20);

/// The bytes of `event` its record stores besides fixed-size fields: payload and header lines.
pub(crate) fn size(event: &Event) -> usize {
    let headers = event.meta.header_lines().map_or(0, str::len);
    event.payload.len().saturating_add(headers)
}

/// Refuses an event past [`MAX_EVENT_BYTES`], before anything is asked of the database.
pub(crate) fn check(event: &Event) -> Result<(), ProcessError> {
    let size = size(event);
    if size > MAX_EVENT_BYTES {
        return Err(ProcessError::Invalid(Invalid::TooLarge {
            size,
            limit: MAX_EVENT_BYTES,
        }));
    }
    Ok(())
}

/// Refuses a two-phase response past [`MAX_EVENT_BYTES`], before anything is asked of the
/// database: the `UPDATE` binding it would fail on every retry (or reset the connection),
/// answered `Unavailable` each time until the lease lapsed. Nothing is written and the lease
/// stays its holder's, as on SQLite.
pub(crate) fn check_response(body: &[u8]) -> Result<(), LeaseError> {
    if body.len() > MAX_EVENT_BYTES {
        return Err(LeaseError::TooLarge(format!(
            "a response of {} bytes; PostgreSQL keeps at most {MAX_EVENT_BYTES} with a record",
            body.len()
        )));
    }
    Ok(())
}

/// Whether a batch could not carry `ingest` although its record fits: a batch binds the
/// payloads of all its deliveries as one array value, one copy per route, which past
/// [`MAX_EVENT_BYTES`] fails. The per-event path queues each delivery with its own statement.
pub(crate) fn too_heavy_for_a_batch(ingest: &Ingest) -> bool {
    let copies = ingest
        .event
        .payload
        .len()
        .saturating_mul(ingest.routes.len());
    copies > MAX_EVENT_BYTES
}

#[cfg(test)]
mod tests {
    use oncebox_core::store::Ingest;
    use oncebox_core::{Event, Key};

    use super::*;

    /// `routes` deliveries of a payload of `bytes` zeros (allocated zeroed: never touched).
    fn ingest(bytes: usize, routes: usize) -> Ingest {
        let mut event = Event::json(Key::parse("shop", "e").unwrap(), "{}").unwrap();
        event.payload = vec![0; bytes];
        Ingest {
            event,
            order: None,
            accepted: Vec::new(),
            stale: Vec::new(),
            routes: (0..routes).map(|r| format!("r{r}")).collect(),
        }
    }

    #[test]
    fn an_event_whose_deliveries_would_pass_the_limit_together_goes_the_per_event_way() {
        let half = MAX_EVENT_BYTES / 2;
        assert!(
            !too_heavy_for_a_batch(&ingest(half, 2)),
            "exactly the limit"
        );
        assert!(too_heavy_for_a_batch(&ingest(half + 1, 2)));
        assert!(check(&ingest(half + 1, 2).event).is_ok(), "its record fits");
        assert!(!too_heavy_for_a_batch(&ingest(MAX_EVENT_BYTES, 1)));
        assert!(!too_heavy_for_a_batch(&ingest(MAX_EVENT_BYTES, 0)));
    }
}
