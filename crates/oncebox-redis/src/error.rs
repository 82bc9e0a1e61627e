//! Errors of the Redis tier and the one place that turns a Redis failure into `Unavailable`:
//! an error, a timeout or an odd reply never says anything about whether a key was processed.

use oncebox_core::Unavailable;

/// Why [`crate::Leases::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not a Redis URL (`redis://host:port/db`, `rediss://…`, `unix://…`).
    #[error("invalid Redis URL: {0}")]
    Url(redis::RedisError),
    /// Redis did not answer within the deadline or refused the connection.
    #[error("cannot reach Redis: {0}")]
    Unavailable(#[from] Unavailable),
    /// The namespace is empty or holds a `:`, which separates the parts of every key: one
    /// namespace's keys could be another's (`a:k:b` + `c:d` is `a` + source `b`, id `k:c:d`).
    #[error("invalid namespace {0:?}: it must be non-empty and hold no ':'")]
    Namespace(String),
    /// The server cannot run the lease scripts: a Redis Cluster, or Redis before 5.
    #[error("unsupported Redis server: {0}")]
    Unsupported(String),
}

/// Refuses a namespace whose keys could be another namespace's.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), ConnectError> {
    if namespace.is_empty() || namespace.contains(':') {
        return Err(ConnectError::Namespace(namespace.to_owned()));
    }
    Ok(())
}

/// Every Redis error is `Unavailable` (G3): a timeout or a broken connection leaves the
/// request's fate unknown, and a server error (OOM, READONLY replica, WRONGTYPE on a foreign
/// key) means this tier cannot answer. `Storage` ("nothing was kept") only where that is
/// known: Redis refused the call with one of its own [`REFUSED_UNRUN`] errors, or no
/// connection was made (refused, the password or the configuration wrong). Any other failure
/// (a connection that dropped, an unreachable host or a TLS error after the call went out, a
/// reply that does not parse, an error a proxy in between made up) may have carried the call
/// to Redis, whose script then ran with its answer lost: `CommitUnknown`, and a holder's
/// `release` repeated after it reads `Fenced`, its key already free.
pub(crate) fn unavailable(e: &redis::RedisError) -> Unavailable {
    use redis::ErrorKind;
    let nothing_sent = refused_unrun(e.code(), e.detail())
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
        );
    if e.is_timeout() {
        Unavailable::Deadline
    } else if nothing_sent {
        Unavailable::Storage(format!("redis: {e}"))
    } else {
        Unavailable::CommitUnknown(format!("redis: {e}"))
    }
}

/// The error codes with which Redis itself refuses a call before running any of it: a replica,
/// a primary that lost its replicas or its disk, memory or permission refused, a script not
/// loaded or one busy, a key of a foreign type read by a script's first command, a cluster
/// redirection. Another code says nothing of whether the call ran: a proxy in between answers
/// one of its own for an upstream connection it lost after forwarding the call (Envoy's
/// `-upstream failure`), and `ERR` is what some send then.
const REFUSED_UNRUN: [&str; 17] = [
    "READONLY",
    "MASTERDOWN",
    "LOADING",
    "OOM",
    "NOPERM",
    "NOAUTH",
    "WRONGPASS",
    "MISCONF",
    "NOREPLICAS",
    "NOSCRIPT",
    "BUSY",
    "WRONGTYPE",
    "EXECABORT",
    "CROSSSLOT",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MOVED",
];

/// Whether an error reply of `code` and `detail` is Redis's own refusal of a call it did not run:
/// one of [`REFUSED_UNRUN`], or a replica's refusal in its pre-7 spelling.
fn refused_unrun(code: Option<&str>, detail: Option<&str>) -> bool {
    code.is_some_and(|c| REFUSED_UNRUN.contains(&c)) || crate::link::replica_refusal(code, detail)
}

/// An error Redis (or something in between) answered in place of a reply, as [`unavailable`]
/// judges it.
pub(crate) fn server_error(e: &redis::ServerError) -> Unavailable {
    if refused_unrun(Some(e.code()), e.details()) {
        Unavailable::Storage(format!("redis: {e:?}"))
    } else {
        Unavailable::CommitUnknown(format!("redis: {e:?}"))
    }
}

/// A reply of a shape our own scripts never send: someone else's data under our key, or a
/// server we do not understand. Still only "unavailable", never a guess.
pub(crate) fn odd_reply(what: &str, reply: &redis::Value) -> Unavailable {
    // Cut short as it is written: a foreign record may hold a body of hundreds of megabytes,
    // and errors are logged.
    let mut shown = Capped(String::new());
    if std::fmt::Write::write_fmt(&mut shown, format_args!("{reply:?}")).is_err() {
        shown.0.push('…');
    }
    Unavailable::Storage(format!("redis: unexpected reply to {what}: {}", shown.0))
}

/// How much of an unexpected reply an error shows.
const ODD_REPLY_SHOWN: usize = 200;

/// Text that stops taking more past [`ODD_REPLY_SHOWN`] bytes, failing the write.
struct Capped(String);

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = ODD_REPLY_SHOWN.saturating_sub(self.0.len());
        if s.len() <= room {
            self.0.push_str(s);
            return Ok(());
        }
        let end = (0..=room)
            .rev()
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(0);
        self.0.push_str(&s[..end]);
        Err(std::fmt::Error)
    }
}

/// Why `response` is not sent: past [`crate::MAX_RESPONSE_BYTES`], Redis would close the
/// connection every call shares.
pub(crate) fn too_large(response: &oncebox_core::Response) -> Option<String> {
    (response.body.len() > crate::MAX_RESPONSE_BYTES).then(|| {
        format!(
            "a response of {} bytes; Redis takes at most {} in one value",
            response.body.len(),
            crate::MAX_RESPONSE_BYTES
        )
    })
}

/// A failure to connect: nothing of any call was sent.
pub(crate) fn at_connect(e: &redis::RedisError) -> Unavailable {
    if e.is_timeout() {
        Unavailable::Deadline
    } else {
        Unavailable::Storage(format!("redis: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use oncebox_core::Unavailable;
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    use super::unavailable;

    fn io(kind: io::ErrorKind) -> RedisError {
        RedisError::from(io::Error::new(kind, "test"))
    }

    #[test]
    fn only_what_surely_sent_nothing_is_storage() {
        let storage = |e: RedisError| matches!(unavailable(&e), Unavailable::Storage(_));
        let unknown = |e: RedisError| matches!(unavailable(&e), Unavailable::CommitUnknown(_));
        assert!(storage(io(io::ErrorKind::ConnectionRefused)));
        assert!(storage(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "READONLY"
        ))));
        assert!(storage(RedisError::from((
            ErrorKind::AuthenticationFailed,
            "wrong password"
        ))));
        // Refusals a proxy may have made up say nothing of whether the call ran; a replica's,
        // in either spelling, says it did not.
        let wire = |w: &str| {
            redis::parse_redis_value(w.as_bytes())
                .and_then(|v| v.extract_error())
                .unwrap_err()
        };
        assert!(unknown(wire("-upstream failure\r\n")));
        assert!(unknown(wire("-ERR connection lost\r\n")));
        assert!(storage(wire("-NOSCRIPT No matching script.\r\n")));
        assert!(storage(wire(
            "-ERR Error running script (call to f_0123): @user_script:17: @user_script: 17: \
             -READONLY You can't write against a read only replica.\r\n"
        )));
        for broken in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::HostUnreachable,
            io::ErrorKind::NetworkUnreachable,
            io::ErrorKind::InvalidData,
        ] {
            assert!(unknown(io(broken)), "{broken:?}");
        }
        assert!(unknown(RedisError::from((
            ErrorKind::Parse,
            "a garbled reply"
        ))));
        assert!(matches!(
            unavailable(&io(io::ErrorKind::TimedOut)),
            Unavailable::Deadline
        ));
    }

    #[test]
    fn an_odd_reply_is_shown_cut_short() {
        let huge = redis::Value::BulkString(vec![b'x'; 1 << 20]);
        let Unavailable::Storage(why) = super::odd_reply("begin", &huge) else {
            panic!("an odd reply is Storage");
        };
        assert!(why.len() < 300, "{} bytes", why.len());
        assert!(why.ends_with('…'), "{why}");
    }
}
