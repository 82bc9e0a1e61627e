//! The tier's connection to Redis, and a new one in its place when Redis answers `READONLY`.
//! After a failover behind one address (a virtual IP moved, a DNS name pointed elsewhere), the
//! open connection still reaches the demoted primary, now a replica, and refuses every write
//! for as long as it stays open: the connection manager connects anew only when a connection
//! drops. The URL names one address: a failover that leaves the demoted node there (Sentinel
//! promoting a replica elsewhere, the URL naming the old primary's own host) is not followed,
//! and every write stays refused until the URL is changed; `redis+sentinel://` is not
//! supported.

use std::sync::{PoisonError, RwLock};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, Value};

pub(crate) struct Link {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The connection in use and how many times it was replaced.
    current: RwLock<(u64, ConnectionManager)>,
    /// One replacement at a time: the callers that met the same refusal wait for it.
    replacing: tokio::sync::Mutex<()>,
}

impl Link {
    pub(crate) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        conn: ConnectionManager,
    ) -> Link {
        Link {
            client,
            config,
            current: RwLock::new((0, conn)),
            replacing: tokio::sync::Mutex::new(()),
        }
    }

    /// The connection in use, with its generation for [`Link::replace`].
    pub(crate) fn get(&self) -> (u64, ConnectionManager) {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connects anew in place of generation `seen`, unless another caller already did; false
    /// when no new connection was made by `cutoff` (the next refusal tries again). The wait
    /// for another caller's replacement counts before `cutoff` too.
    pub(crate) async fn replace(&self, seen: u64, cutoff: tokio::time::Instant) -> bool {
        let replacing = async {
            let _one = self.replacing.lock().await;
            if self.get().0 != seen {
                return true;
            }
            let connecting =
                ConnectionManager::new_with_config(self.client.clone(), self.config.clone());
            let Ok(conn) = connecting.await else {
                return false;
            };
            tracing::warn!(
                "Redis answered as a replica (READONLY or MASTERDOWN: a failover moved the \
                 primary behind this address): connected anew"
            );
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = (seen + 1, conn);
            true
        };
        tokio::time::timeout_at(cutoff, replacing)
            .await
            .unwrap_or(false)
    }
}

/// Whether Redis refused a call as a read-only replica: nothing of it ran (a replica takes no
/// write, and a script stops at its first), so it may be sent again.
pub(crate) fn read_only(reply: &RedisResult<Value>) -> bool {
    match reply {
        Err(e) => replica_refusal(e.code(), e.detail()),
        Ok(Value::ServerError(e)) => replica_refusal(Some(e.code()), e.details()),
        Ok(_) => false,
    }
}

/// `READONLY`, or how Redis before 7 reports a script's write refused by a replica: the
/// refusal wrapped in a plain error (`ERR Error running script (call to f_…): … -READONLY You
/// can't write against a read only replica.`). Missing it left a tier on a demoted primary
/// refusing every write for as long as its connection stayed open. `MASTERDOWN` is a replica's
/// too, one set not to serve stale data whose primary it cannot reach (the demoted server
/// behind an address that now leads elsewhere): it refuses every call, reads included.
pub(crate) fn replica_refusal(code: Option<&str>, detail: Option<&str>) -> bool {
    match code {
        Some("READONLY" | "MASTERDOWN") => true,
        Some("ERR") => detail
            .is_some_and(|d| d.starts_with("Error running script") && d.contains("-READONLY ")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(wire: &str) -> RedisResult<Value> {
        redis::parse_redis_value(wire.as_bytes())
    }

    #[test]
    fn a_replica_refusal_is_recognised_in_either_spelling() {
        let refused = [
            "-READONLY You can't write against a read only replica.\r\n",
            "-ERR Error running script (call to f_0123): @user_script:17: @user_script: 17: \
             -READONLY You can't write against a read only replica.\r\n",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
        ];
        for wire in refused {
            let parsed = reply(wire);
            assert!(read_only(&parsed), "{wire}: {parsed:?}");
            let as_error = parsed.and_then(|v| v.extract_error());
            assert!(read_only(&as_error), "{wire}: {as_error:?}");
        }
        let other = [
            "-ERR Error running script (call to f_0123): @user_script:3: OOM command not \
             allowed\r\n",
            "-ERR value contains -READONLY but is no script's refusal\r\n",
            "-OOM command not allowed when used memory > 'maxmemory'.\r\n",
            "+OK\r\n",
        ];
        for wire in other {
            assert!(!read_only(&reply(wire)), "{wire}");
        }
    }
}
