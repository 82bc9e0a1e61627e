//! What a RabbitMQ attempt sends besides its payload: the message id consumers deduplicate on,
//! the headers, and the properties that make it persistent.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use oncebox_core::hops::HOPS_HEADER;
use oncebox_core::relay_store::{Claimed, FENCE_HEADER};
use sha2::{Digest, Sha256};

use crate::target::SHORT_STRING_MAX;

/// The persistent delivery mode: the broker writes the message to disk before confirming it to
/// a durable queue.
const PERSISTENT: u8 = 2;

/// The `message_id` of a key: the key itself, or — when it is longer than an AMQP short string
/// can hold — `sha256:` and the hex SHA-256 of the key. Consumers deduplicate on it: do not
/// change. The full key is in the `idempotency-key` header either way. A key spelled as such
/// an id (a source named `sha256` and an id of 64 hex digits) is hashed too: sent as it is, it
/// was the id of the long key it names, and a consumer dropped one of the two as the other's
/// duplicate.
pub(crate) fn message_id(key: &str) -> String {
    let hashed_spelling = key
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if key.len() <= SHORT_STRING_MAX && !hashed_spelling {
        key.to_owned()
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

/// The properties of attempt `number` of `claimed`: persistent, its message id, and the
/// headers a consumer reads (the key, the attempt, the hop count, the fencing token).
pub(super) fn properties(claimed: &Claimed, number: u32) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "idempotency-key".into(),
        AMQPValue::LongString(claimed.idempotency_key.as_str().into()),
    );
    headers.insert(
        "oncebox-attempt".into(),
        AMQPValue::LongString(number.to_string().into()),
    );
    // The loop guard: a consumer reading this refuses it past the limit (`hops`).
    headers.insert(
        HOPS_HEADER.into(),
        AMQPValue::LongString(claimed.hops.to_string().into()),
    );
    headers.insert(
        FENCE_HEADER.into(),
        AMQPValue::LongString(claimed.token.to_string().into()),
    );
    let mut properties = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(message_id(&claimed.idempotency_key).into())
        .with_headers(headers);
    // An over-long content type cannot be sent as the property; the payload still can.
    if claimed.content_type.len() <= SHORT_STRING_MAX {
        properties = properties.with_content_type(claimed.content_type.as_str().into());
    }
    properties
}
