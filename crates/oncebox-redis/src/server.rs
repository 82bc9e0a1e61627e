//! What server `connect` reached, refused where the lease scripts cannot run: a Redis Cluster
//! (each script touches the fencing counter and a key, which hash to different slots, so every
//! `begin` would answer CROSSSLOT) and Redis before 5 (its scripts may not write after reading
//! `TIME`). Refused at start, where the operator looks, rather than as every call `Unavailable`.
//! And the eviction policy under which it may drop our keys, warned of at start.

use redis::RedisResult;
use redis::aio::ConnectionManager;

use crate::ConnectError;

/// Refuses a server the scripts cannot run on; one that does not answer `INFO` (a proxy that
/// hides it) is let through, with a debug line: its first script says what it is.
pub(crate) async fn refuse_unsupported(conn: &mut ConnectionManager) -> Result<(), ConnectError> {
    for section in ["server", "cluster"] {
        let info: redis::RedisResult<String> =
            redis::cmd("INFO").arg(section).query_async(conn).await;
        match info {
            Ok(info) => {
                unsupported(&info).map_or(Ok(()), |why| Err(ConnectError::Unsupported(why)))?
            }
            Err(e) => tracing::debug!(section, error = %e, "INFO refused"),
        }
    }
    Ok(())
}

/// Why the server `INFO` describes cannot carry the leases, if it cannot.
fn unsupported(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if field("cluster_enabled") == Some("1") {
        return Some(
            "Redis Cluster: each lease script touches the fencing counter and the key, which \
             hash to different slots; use a single primary (with replicas), reached at an \
             address that follows the primary (a virtual IP, a DNS name)"
                .to_owned(),
        );
    }
    let version = field("redis_version")?;
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < 5).then(|| {
        format!(
            "Redis {version}: the lease scripts write after reading the server's clock, which \
             needs Redis 5 or later"
        )
    })
}

/// The policy under which Redis may evict our keys: asked with `CONFIG GET`, else read from
/// `INFO memory` (managed services rename or refuse `CONFIG`, and their default policies,
/// `volatile-lru` for one, evict exactly the keys with a TTL: every lease and record). `None`
/// when it cannot (no memory limit, `noeviction`), or when neither answers, which is warned of.
pub(crate) async fn eviction(conn: &mut ConnectionManager) -> Option<String> {
    let (limit, policy) = match configured(conn).await {
        Some(found) => found,
        None => match informed(conn).await {
            Some(found) => found,
            None => {
                tracing::warn!(
                    "Redis answers neither CONFIG GET nor INFO memory: whether it may evict \
                     keys is unknown; a lease or a done record evicted is taken again, so run \
                     it with maxmemory-policy noeviction"
                );
                return None;
            }
        },
    };
    (limit > 0 && policy != "noeviction").then_some(policy)
}

/// `maxmemory` and `maxmemory-policy` from `INFO memory`'s `name:value` lines.
async fn informed(conn: &mut ConnectionManager) -> Option<(u64, String)> {
    let info: RedisResult<String> = redis::cmd("INFO").arg("memory").query_async(conn).await;
    let info = info
        .inspect_err(|e| tracing::debug!(error = %e, "INFO memory refused"))
        .ok()?;
    memory_settings(&info)
}

fn memory_settings(info: &str) -> Option<(u64, String)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    Some((
        field("maxmemory")?.parse().ok()?,
        field("maxmemory_policy")?.to_owned(),
    ))
}

/// `maxmemory` and `maxmemory-policy` from `CONFIG GET`.
async fn configured(conn: &mut ConnectionManager) -> Option<(u64, String)> {
    let mut get = async |name: &str| -> Option<String> {
        // A map: RESP3 answers one, RESP2 a flat list of name and value, read as one too.
        let answer: RedisResult<std::collections::HashMap<String, String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(conn)
            .await;
        match answer {
            Ok(mut values) => values.remove(name),
            Err(e) => {
                tracing::debug!(error = %e, "CONFIG GET {name} refused: Redis's eviction policy unknown");
                None
            }
        }
    };
    let limit: u64 = get("maxmemory").await?.parse().ok()?;
    Some((limit, get("maxmemory-policy").await?))
}

#[cfg(test)]
mod tests {
    use super::{memory_settings, unsupported};

    /// `INFO memory` as Redis 7 writes it (CRLF lines), where `CONFIG` is refused.
    #[test]
    fn memory_settings_are_read_from_info() {
        let info = "# Memory\r\nused_memory:1024\r\nmaxmemory:104857600\r\n\
                    maxmemory_human:100.00M\r\nmaxmemory_policy:volatile-lru\r\n";
        assert_eq!(
            memory_settings(info),
            Some((104_857_600, "volatile-lru".to_owned()))
        );
        assert_eq!(memory_settings("# Memory\r\nused_memory:1\r\n"), None);
    }

    #[test]
    fn clusters_and_servers_before_5_are_refused() {
        assert_eq!(
            unsupported("# Server\r\nredis_version:7.2.4\r\nos:Linux\r\n"),
            None
        );
        assert_eq!(unsupported("redis_version:5.0.0\r\n"), None);
        let old = unsupported("redis_version:4.0.14\r\n").unwrap();
        assert!(old.contains("Redis 4.0.14"), "{old}");
        let cluster = unsupported("# Cluster\r\ncluster_enabled:1\r\n").unwrap();
        assert!(cluster.starts_with("Redis Cluster"), "{cluster}");
        assert_eq!(unsupported("# Cluster\r\ncluster_enabled:0\r\n"), None);
        // A server that says nothing readable is let through.
        assert_eq!(unsupported(""), None);
        assert_eq!(unsupported("redis_version:unknown\r\n"), None);
    }
}
