//! What server `connect` reached, refused where the lease scripts cannot run: a Redis Cluster
//! (each script touches the fencing counter and a key, which hash to different slots, so every
//! `begin` would answer CROSSSLOT) and Redis before 5 (its scripts may not write after reading
//! `TIME`). Refused at start, where the operator looks, rather than as every call `Unavailable`.

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
             hash to different slots; use a single primary (with replicas or Sentinel)"
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

#[cfg(test)]
mod tests {
    use super::unsupported;

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
