//! The tier's connection to Redis, and a new one in its place when Redis answers `READONLY`.
//! After a failover behind one address (a virtual IP moved, a DNS name pointed elsewhere), the
//! open connection still reaches the demoted primary, now a replica, and refuses every write
//! for as long as it stays open: the connection manager connects anew only when a connection
//! drops. (Sentinel kills its clients' connections on failover; a virtual IP does not.)

use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisResult, ServerErrorKind, Value};

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
    /// when no new connection was made within `deadline` (the next refusal tries again).
    /// The wait for another caller's replacement counts within `deadline` too.
    pub(crate) async fn replace(&self, seen: u64, deadline: Duration) -> bool {
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
                "Redis answered READONLY (a replica: a failover moved the primary behind this \
                 address): connected anew"
            );
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = (seen + 1, conn);
            true
        };
        tokio::time::timeout(deadline, replacing)
            .await
            .unwrap_or(false)
    }
}

/// Whether Redis refused a call as a read-only replica: nothing of it ran (a replica takes no
/// write, and a script stops at its first), so it may be sent again.
pub(crate) fn read_only(reply: &RedisResult<Value>) -> bool {
    match reply {
        Err(e) => e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly),
        Ok(Value::ServerError(e)) => e.kind() == Some(ServerErrorKind::ReadOnly),
        Ok(_) => false,
    }
}
