//! The headers of a NATS attempt: the message id the stream deduplicates on, the key consumers
//! deduplicate on, the attempt, the hop count and the fencing token.

use std::str::FromStr;

use async_nats::header::{self, HeaderMap, HeaderValue};
use oncebox_core::hops::NATS_HOPS_HEADER;
use oncebox_core::relay_store::{Claimed, NATS_FENCE_HEADER};

/// The headers of attempt `number` of `claimed`, or why one of its values cannot be a header.
pub(super) fn headers(claimed: &Claimed, number: u32) -> Result<HeaderMap, String> {
    // Built with `from_str`, never `From`, which panics on a line break.
    let value = |v: &str, what: &str| {
        HeaderValue::from_str(v).map_err(|e| format!("{what} cannot be a NATS header: {e}"))
    };
    let key = value(&claimed.idempotency_key, "the idempotency key")?;
    let mut headers = HeaderMap::new();
    // The stream drops a second message with the same id inside its duplicate window: a
    // retried publish whose PubAck was lost is stored once. The window is the stream's, across
    // all its subjects, so the id names the route too: with the key alone, the second of two
    // routes into one stream was answered "duplicate", recorded delivered, and never stored.
    // Consumers deduplicate on `Idempotency-Key`, since the window is finite.
    let id = format!("{}:{}", claimed.route, claimed.idempotency_key);
    headers.insert(header::NATS_MESSAGE_ID, value(&id, "the message id")?);
    headers.insert("Idempotency-Key", key);
    headers.insert("Oncebox-Attempt", HeaderValue::from(number.to_string()));
    // The loop guard: a consumer reading this refuses it past the limit (`hops`).
    headers.insert(
        NATS_HOPS_HEADER,
        HeaderValue::from(claimed.hops.to_string()),
    );
    headers.insert(
        NATS_FENCE_HEADER,
        HeaderValue::from(claimed.token.to_string()),
    );
    if let Ok(ct) = HeaderValue::from_str(&claimed.content_type) {
        headers.insert("Content-Type", ct);
    }
    Ok(headers)
}
