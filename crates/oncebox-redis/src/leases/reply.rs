//! Reading what Redis answers: a call's reply bounded by the deadline, the values inside it,
//! and the TTLs sent to it.

use std::time::Duration;

use oncebox_core::{Timestamp, Unavailable};
use redis::{RedisResult, Value};

use super::MAX_MILLIS;
use crate::error::unavailable;

/// A call's reply bounded by the deadline, as the tier answers it.
pub(super) fn answer(
    reply: Result<RedisResult<Value>, tokio::time::error::Elapsed>,
) -> Result<Value, Unavailable> {
    match reply {
        Err(_) => Err(Unavailable::Deadline),
        Ok(Err(e)) => Err(unavailable(&e)),
        Ok(Ok(Value::ServerError(e))) => Err(crate::error::server_error(&e)),
        Ok(Ok(v)) => Ok(v),
    }
}

/// Milliseconds for `PEXPIRE`: at least 1 (0 would delete the key at once), at most
/// `MAX_MILLIS`.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_MILLIS)
}

/// The TTL sent to Redis and the `expires_at` the holder is told, both from the clamped value:
/// dated from the unclamped one, a zero TTL (1 ms in Redis) read as already expired and a huge
/// one as never expiring, though Redis ends it after 100 years.
pub(super) fn lease_ttl(now: Timestamp, ttl: Duration) -> (u64, Timestamp) {
    let ms = millis(ttl);
    (ms, now.plus(Duration::from_millis(ms)))
}

pub(crate) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

pub(crate) fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(super) fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => std::str::from_utf8(text(other)?).ok()?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_expiry_is_dated_from_the_ttl_redis_is_sent() {
        let now = Timestamp(1_000);
        let secs = Duration::from_secs(30);
        assert_eq!(lease_ttl(now, secs), (30_000, Timestamp(31_000)));
        assert_eq!(lease_ttl(now, Duration::ZERO), (1, Timestamp(1_001)));
        let forever = i64::try_from(MAX_MILLIS).unwrap();
        assert_eq!(
            lease_ttl(now, Duration::MAX),
            (MAX_MILLIS, Timestamp(1_000 + forever))
        );
        let just_over = Duration::from_millis(MAX_MILLIS + 1);
        assert_eq!(lease_ttl(now, just_over).1, Timestamp(1_000 + forever));
    }
}
