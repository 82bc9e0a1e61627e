//! A duplicate cache in front of the SQL inbox, for a gateway on several nodes: a committed
//! answer is copied to Redis after the commit, and a redelivery reaching any node is answered
//! from there without a database round trip.
//!
//! It is only ever filled after the SQL inbox committed the key, so a cached answer is a
//! committed fact (G3), and it expires when the inbox may purge that record (its completion
//! plus the source's retention), so it never answers for a key the inbox has forgotten. It is a
//! cache: a miss, an outage or a restarted Redis only sends the request on to the inbox, which
//! decides as it would without Redis.

use std::time::Duration;

use oncebox_core::{Event, Response, ResponseKind, Timestamp, Unavailable};
use redis::Value;

use crate::error::odd_reply;
use crate::leases::{Leases, MAX_MILLIS, array, text};

impl Leases {
    /// The first response of a key Redis holds as done with the same fingerprint. `None` for
    /// everything else — unknown, leased, uncertain, or another payload (the inbox records that
    /// conflict; the cache does not answer it).
    pub async fn recall(&self, event: &Event) -> Result<Option<Response>, Unavailable> {
        let mut conn = self.connection();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.record(&event.key))
            .arg("state")
            .arg("fp")
            .arg("kind")
            .arg("body");
        let reply = self.timed(cmd.query_async(&mut conn)).await?;
        let fields = array(&reply).ok_or_else(|| odd_reply("recall", &reply))?;
        let [state, fp, kind, body] = fields else {
            return Err(odd_reply("recall", &reply));
        };
        if text(state) != Some(b"done") || text(fp) != Some(&event.fingerprint.as_bytes()[..]) {
            return Ok(None);
        }
        let kind = text(kind)
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(ResponseKind::parse)
            .ok_or_else(|| odd_reply("recall", &reply))?;
        let body = text(body).map(<[u8]>::to_vec).unwrap_or_default();
        Ok(Some(Response { kind, body }))
    }

    /// Caches `response` as the key's first answer until `completed_at` plus the source's
    /// retention, when the inbox may purge its record. Call it only after the SQL inbox
    /// committed the key with this response: after an `Applied`, with a time read (on the
    /// inbox's clock) before `process`, never later than the commit's; after a `Duplicate`,
    /// with the record's `completed_at` (`Inbox::record`) — the time of the call would keep the
    /// answer up to a whole retention past the record.
    ///
    /// `Ok(false)`, and nothing changes, where Redis already holds the key — a live lease, an
    /// earlier answer, whose expiry is never pushed back — when the retention has passed on
    /// this handle's clock, or for a response past
    /// [`MAX_RESPONSE_BYTES`](crate::MAX_RESPONSE_BYTES). Clocks that disagree move the expiry
    /// by their difference.
    pub async fn remember(
        &self,
        event: &Event,
        response: &Response,
        completed_at: Timestamp,
    ) -> Result<bool, Unavailable> {
        let retention = self.options().retention.for_source(&event.key.source);
        let now = self.options().clock.now();
        let Some(left) = time_left(completed_at, retention, now) else {
            return Ok(false);
        };
        // Past Redis's limit it would close the connection every call shares: not cached.
        if crate::error::too_large(response).is_some() {
            return Ok(false);
        }
        let mut call = self.scripts().remember.prepare_invoke();
        call.key(self.record(&event.key))
            .arg(&event.fingerprint.as_bytes()[..])
            .arg(response.kind.as_str())
            .arg(&response.body[..])
            .arg(left);
        match self.run(&call).await? {
            Value::Int(n) => Ok(n == 1),
            other => Err(odd_reply("remember", &other)),
        }
    }
}

/// Milliseconds from `now` until the inbox may purge a record completed at `completed_at`, at
/// most the whole retention (a completion dated ahead of `now` is another clock running ahead)
/// and at most what Redis accepts; `None` once that time has come.
fn time_left(completed_at: Timestamp, retention: Duration, now: Timestamp) -> Option<u64> {
    let end = completed_at.plus(retention).millis();
    let left = u64::try_from(end.saturating_sub(now.millis())).ok()?;
    let whole = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    Some(left.min(whole).min(MAX_MILLIS)).filter(|&ms| ms > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_answer_lives_only_what_is_left_of_the_records_retention() {
        let minute = Duration::from_secs(60);
        let now = Timestamp(1_000_000);
        assert_eq!(time_left(now, minute, now), Some(60_000));
        assert_eq!(time_left(Timestamp(960_000), minute, now), Some(20_000));
        assert_eq!(time_left(Timestamp(940_001), minute, now), Some(1));
        assert_eq!(time_left(Timestamp(940_000), minute, now), None);
        assert_eq!(time_left(Timestamp(i64::MIN), minute, now), None);
        assert_eq!(time_left(Timestamp(2_000_000), minute, now), Some(60_000));
        assert_eq!(time_left(now, Duration::ZERO, now), None);
        assert_eq!(time_left(now, Duration::MAX, now), Some(MAX_MILLIS));
        assert_eq!(
            time_left(Timestamp(i64::MAX), minute, Timestamp(i64::MIN)),
            Some(60_000)
        );
    }
}
