//! A duplicate cache in front of the SQL inbox, for a gateway on several nodes: a committed
//! answer is copied to Redis after the commit, and a redelivery reaching any node is answered
//! from there without a database round trip.
//!
//! It is only ever filled after the SQL inbox committed the key, so a cached answer is a
//! committed fact (G3). It is a cache: a miss, an outage or a restarted Redis only sends the
//! request on to the inbox, which decides as it would without Redis.

use oncebox_core::{Event, Response, ResponseKind, Unavailable};
use redis::Value;

use crate::error::odd_reply;
use crate::leases::{Leases, array, text};

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

    /// Caches `response` as the key's first answer. Call it only after the SQL inbox committed
    /// the key with this response (an `Applied` or a `Duplicate` outcome). Where Redis already
    /// holds the key — a live lease, an earlier answer — nothing changes; `Ok(false)` then.
    pub async fn remember(&self, event: &Event, response: &Response) -> Result<bool, Unavailable> {
        let mut call = self.scripts().remember.prepare_invoke();
        call.key(self.record(&event.key))
            .arg(&event.fingerprint.as_bytes()[..])
            .arg(response.kind.as_str())
            .arg(&response.body[..])
            .arg(self.retention(&event.key));
        match self.run(&call).await? {
            Value::Int(n) => Ok(n == 1),
            other => Err(odd_reply("remember", &other)),
        }
    }
}
