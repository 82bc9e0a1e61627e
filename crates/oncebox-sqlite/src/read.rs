//! Reads on connections of their own, so they never wait behind the writer's transaction (WAL
//! readers see the last commit).

pub(crate) mod looks;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use oncebox_core::{Fingerprint, Key, Record, RecordState, Response, ResponseKind, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::Error;
use crate::options::Options;
use crate::schema;
use crate::writer::Stats;

pub(crate) use looks::Looks;

/// Two small pools of read connections, opened on demand: one for single-key looks, one for
/// everything else.
///
/// Why two: after any commit, a reader's next transaction empties its page cache, and SQLite
/// does that by walking the cache's whole hash table, which never shrinks. A connection that
/// once served a long scan (an admin listing) kept a table of 16 384 slots, and every duplicate
/// look on it after a commit walked them all: about 60 µs (seen with a debugger and a profile
/// of a gateway under load, before readers mapped the file; mapped pages bypass the cache now,
/// pages read from the WAL still fill it). Connections that only ever look up one key keep a
/// small table.
///
/// Every read either pool serves is counted in [`Stats::reads`], here where all of them pass:
/// the count is how a test proves that a request (a forged one, say) never reached the
/// database. A relaxed increment, beside a read transaction's own cost.
#[derive(Debug)]
pub(crate) struct Readers {
    options: Options,
    idle: Mutex<Vec<Connection>>,
    looks: Arc<Looks>,
    stats: Arc<Stats>,
}

impl Readers {
    /// `looks` is shared with the checkpointer, which releases the snapshots they keep.
    pub fn new(options: Options, looks: Arc<Looks>, stats: Arc<Stats>) -> Readers {
        Readers {
            options,
            idle: Mutex::new(Vec::new()),
            looks,
            stats,
        }
    }

    /// Keeps every connection kept here from copying the log back when it closes
    /// (`checkpoint::keep_log_at_close`).
    pub fn keep_log_at_close(&self) {
        // A poisoned lock still holds connections that must not copy the log back.
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        idle.iter().for_each(crate::checkpoint::keep_log_at_close);
        self.looks.keep_log_at_close();
    }

    /// Counts one read, as it runs on its connection.
    fn served(&self) {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// A read of one key, on a connection that never serves anything larger and may keep its
    /// snapshot from the last look (`looks.rs`).
    pub fn look<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, Error> {
        self.looks.look(|c| {
            self.served();
            f(c)
        })
    }

    /// Any read.
    pub fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, Error> {
        let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match pooled {
            Some(c) => c,
            None => schema::open_reader(&self.options)?,
        };
        self.served();
        let out = f(&conn);
        // A read that began a transaction and returned without ending it (an early `?`)
        // would leave the connection on that snapshot for good: every later read on it would
        // miss what was committed since, and the log could never start over. Ended here, or
        // the connection is dropped.
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            return Ok(out?);
        }
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
        Ok(out?)
    }
}

pub(crate) fn record(conn: &Connection, key: &Key) -> rusqlite::Result<Option<Record>> {
    conn.prepare_cached(
        "SELECT fingerprint, state, response, payload, received_at, completed_at, lease_token,
           lease_expires_at
         FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2",
    )?
    .query_row(params![key.source.as_str(), key.event_id.as_str()], |r| {
        let fingerprint: Vec<u8> = r.get(0)?;
        let state: String = r.get(1)?;
        let response: Option<Vec<u8>> = r.get(2)?;
        let state = match (ResponseKind::parse(&state), state.as_str()) {
            (Some(kind), _) => RecordState::Done(Response {
                kind,
                body: response.unwrap_or_default(),
            }),
            (None, "uncertain") => RecordState::Uncertain,
            _ => RecordState::Processing {
                lease_token: r.get(6)?,
                lease_expires_at: r.get::<_, Option<i64>>(7)?.map(Timestamp),
            },
        };
        Ok(Record {
            key: key.clone(),
            fingerprint: Fingerprint::from_slice(&fingerprint),
            state,
            payload: r.get(3)?,
            received_at: Timestamp(r.get(4)?),
            completed_at: r.get::<_, Option<i64>>(5)?.map(Timestamp),
        })
    })
    .optional()
}

/// A terminal record's fingerprint and first response; `None` when absent or not terminal.
pub(crate) fn committed(
    conn: &Connection,
    key: &Key,
) -> rusqlite::Result<Option<(Vec<u8>, Response)>> {
    conn.prepare_cached(
        "SELECT fingerprint, state, response FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2",
    )?
    .query_row(params![key.source.as_str(), key.event_id.as_str()], |r| {
        let state: String = r.get(1)?;
        Ok(ResponseKind::parse(&state).map(|kind| -> rusqlite::Result<_> {
            let body: Option<Vec<u8>> = r.get(2)?;
            Ok((r.get(0)?, Response { kind, body: body.unwrap_or_default() }))
        }))
    })
    .optional()?
    .flatten()
    .transpose()
}

/// Refused conflicting payloads in recording order, optionally for one key.
pub(crate) fn conflicts(
    conn: &Connection,
    filter: &oncebox_core::store::ConflictFilter,
) -> rusqlite::Result<oncebox_core::store::Page<oncebox_core::store::ConflictRecord>> {
    let limit = filter.limit.clamp(1, crate::store::MAX_PAGE);
    let mut q = conn.prepare_cached(
        "SELECT id, source, event_id, stored_fingerprint, offered_fingerprint, payload, at
         FROM oncebox_conflicts
         WHERE (?1 IS NULL OR (source = ?1 AND event_id = ?2)) AND id > ?3
         ORDER BY id LIMIT ?4",
    )?;
    let key = filter.key.as_ref();
    let rows = q.query_map(
        params![
            key.map(|k| k.source.as_str()),
            key.map(|k| k.event_id.as_str()),
            filter.after.unwrap_or(0),
            limit as i64 + 1
        ],
        |r| {
            let (source, event_id): (String, String) = (r.get(1)?, r.get(2)?);
            // Written only from validated keys; one that no longer validates is skipped.
            let Ok(key) = Key::parse(&source, &event_id) else {
                return Ok((r.get(0)?, None));
            };
            Ok((
                r.get(0)?,
                Some(oncebox_core::store::ConflictRecord {
                    seq: r.get(0)?,
                    key,
                    stored_fingerprint: Fingerprint::from_slice(&r.get::<_, Vec<u8>>(3)?),
                    offered_fingerprint: Fingerprint::from_slice(&r.get::<_, Vec<u8>>(4)?),
                    payload: r.get::<_, Option<Vec<u8>>>(5)?.unwrap_or_default(),
                    at: Timestamp(r.get(6)?),
                }),
            ))
        },
    )?;
    oncebox_core::store::Page::from_rows(rows, limit)
}

/// Counts per source and state, and arrivals since `since` per bucket of `bucket_ms`.
pub(crate) fn activity(
    conn: &Connection,
    since: Timestamp,
    bucket_ms: i64,
) -> rusqlite::Result<oncebox_core::store::Activity> {
    let counts = conn
        .prepare_cached(
            "SELECT source, state, count(*) FROM oncebox_inbox GROUP BY source, state
             UNION ALL
             SELECT source, 'conflict', count(*) FROM oncebox_conflicts GROUP BY source
             ORDER BY 1, 2",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let bucket_ms = bucket_ms.max(1);
    let buckets = conn
        .prepare_cached(
            "SELECT (received_at / ?2) * ?2 AS b, source, count(*) FROM oncebox_inbox
             WHERE received_at >= ?1 GROUP BY b, source ORDER BY b, source",
        )?
        .query_map(params![since.millis(), bucket_ms], |r| {
            Ok((Timestamp(r.get(0)?), r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    Ok(oncebox_core::store::Activity { counts, buckets })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Looks, Readers};
    use crate::options::Options;
    use crate::writer::Stats;

    /// Looks and other reads are served by different connections: a setting made on one pool's
    /// connection is seen again by that pool only.
    #[test]
    fn looks_never_share_a_connection_with_other_reads() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("pools.db"));
        drop(crate::schema::open_writer(&options).unwrap());
        let stats = Arc::new(Stats::default());
        let looks = Looks::new(options.clone(), stats.clone());
        let readers = Readers::new(options, Arc::new(looks), stats.clone());
        let cache = |c: &rusqlite::Connection| c.query_row("PRAGMA cache_size", [], |r| r.get(0));
        readers
            .with(|c| c.execute_batch("PRAGMA cache_size = 7"))
            .unwrap();
        let seen_by_look: i64 = readers.look(cache).unwrap();
        let seen_by_read: i64 = readers.with(cache).unwrap();
        assert_eq!(seen_by_read, 7, "the pool reuses its connection");
        assert_ne!(seen_by_look, 7);
        assert_eq!(stats.reads(), 3, "every read of either pool is counted");
    }
}
