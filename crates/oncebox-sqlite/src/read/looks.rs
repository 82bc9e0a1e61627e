//! The pool of connections for single-key looks, each of which keeps its read transaction
//! from one look to the next while the writer has committed nothing since it began.
//!
//! Why: beginning and ending a read transaction takes and releases a shared lock on a
//! read-mark of the WAL index with `fcntl` (SQLite passes it to the kernel whenever no other
//! connection of the process holds that mark), and reads the index header. Profiled in the
//! gateway benchmark's duplicate phase, where most replays are older than the memory of recent
//! answers, that was a third of each look, the look a quarter of the request threads' time.
//!
//! A kept snapshot is current as long as the writer's commit count has not moved since it
//! began; the next look after a commit begins a new one. Commits of another process on the
//! same file are not counted: a kept snapshot misses them for at most `HOLD`, and a look that
//! misses sends its request to the writer, which sees everything. A snapshot kept open also
//! holds back checkpoints and the log's restart, so none is kept long: a look ends one older
//! than `HOLD`, and the checkpointer ends those of idle connections before each pass and at
//! least every `HOLD` ([`Looks::release_idle`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::error::Error;
use crate::options::Options;
use crate::schema;
use crate::writer::Stats;

/// Longest a look connection keeps one snapshot.
pub(crate) const HOLD: Duration = Duration::from_millis(100);

/// A look connection and the read transaction it keeps open, if any.
struct Held {
    conn: Connection,
    /// When the open transaction began, and the writer's commit count just before.
    open: Option<(Instant, u64)>,
}

impl Held {
    /// Ends the open read transaction. A failure drops nothing: the connection is in
    /// autocommit mode after a failed `COMMIT` of a read transaction too.
    fn end(&mut self) {
        if self.open.take().is_some() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("COMMIT");
        }
    }
}

/// Connections that only ever look up one key (see `Readers` for why they are kept apart).
pub(crate) struct Looks {
    options: Options,
    pool: Mutex<Vec<Held>>,
    stats: Arc<Stats>,
    /// `HOLD`; tests keep snapshots longer, so that a slow machine cannot end one early.
    hold: Duration,
}

impl std::fmt::Debug for Looks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Looks").finish_non_exhaustive()
    }
}

impl Looks {
    pub(crate) fn new(options: Options, stats: Arc<Stats>) -> Looks {
        Looks {
            options,
            pool: Mutex::new(Vec::new()),
            stats,
            hold: HOLD,
        }
    }

    /// Keeps every connection kept here from copying the log back when it closes.
    pub(crate) fn keep_log_at_close(&self) {
        // A poisoned lock still holds connections that must not copy the log back.
        let idle = self
            .pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        idle.iter()
            .for_each(|held| crate::checkpoint::keep_log_at_close(&held.conn));
    }

    /// Runs `f` inside the connection's kept read transaction, or a new one if the writer
    /// committed since that began or it is `HOLD` old.
    pub(crate) fn look<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, Error> {
        // Read before the snapshot is taken: a commit counted later ends it at the next look.
        let commits = self.stats.commits.load(Ordering::Acquire);
        let pooled = self.pool.lock().ok().and_then(|mut idle| idle.pop());
        let mut held = match pooled {
            Some(h) => h,
            None => Held {
                conn: schema::open_reader(&self.options)?,
                open: None,
            },
        };
        if held
            .open
            .is_some_and(|(began, seen)| seen != commits || began.elapsed() >= self.hold)
        {
            held.end();
        }
        let out = match held.open {
            Some(_) => f(&held.conn),
            None => held.conn.execute_batch("BEGIN").and_then(|()| {
                held.open = Some((Instant::now(), commits));
                f(&held.conn)
            }),
        };
        if out.is_err() {
            held.end();
        }
        if let Ok(mut idle) = self.pool.lock() {
            idle.push(held);
        }
        Ok(out?)
    }

    /// Ends the read transactions of the connections not in use now. The checkpointer calls
    /// it before each pass and every `HOLD` while idle.
    pub(crate) fn release_idle(&self) {
        if let Ok(mut idle) = self.pool.lock() {
            idle.iter_mut().for_each(Held::end);
        }
    }

    /// Connections of this pool keeping a read transaction open now.
    #[cfg(test)]
    pub(crate) fn open_snapshots(&self) -> usize {
        self.pool.lock().map_or(0, |idle| {
            idle.iter().filter(|h| !h.conn.is_autocommit()).count()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use rusqlite::OptionalExtension;

    use super::Looks;
    use crate::writer::Stats;

    fn setup() -> (tempfile::TempDir, rusqlite::Connection, Looks, Arc<Stats>) {
        let (dir, options, writer) = crate::scratch::writer();
        let stats = Arc::new(Stats::default());
        let mut looks = Looks::new(options, stats.clone());
        looks.hold = std::time::Duration::from_secs(3600);
        // A checkpoint that finds a reader in its way reports it at once instead of waiting.
        writer.busy_timeout(std::time::Duration::ZERO).unwrap();
        (dir, writer, looks, stats)
    }

    fn find(looks: &Looks, k: &str) -> bool {
        looks
            .look(|c| {
                c.query_row("SELECT 1 FROM t WHERE k = ?1", [k], |_| Ok(()))
                    .optional()
            })
            .unwrap()
            .is_some()
    }

    use crate::scratch::insert;

    /// A look keeps its snapshot while the commit count stands still, and takes a new one
    /// once it moved. The row written without counting (as another process would) stays
    /// unseen until then, which shows that the snapshot really was kept.
    #[test]
    fn a_look_keeps_its_snapshot_until_the_writer_commits() {
        let (_dir, writer, looks, stats) = setup();
        insert(&writer, "a");
        stats.commits.fetch_add(1, Ordering::Release);
        assert!(find(&looks, "a"));
        assert_eq!(looks.open_snapshots(), 1);
        insert(&writer, "b");
        assert!(!find(&looks, "b"), "the kept snapshot predates b");
        assert!(find(&looks, "a"));
        stats.commits.fetch_add(1, Ordering::Release);
        assert!(find(&looks, "b"), "a counted commit ends the kept snapshot");
    }

    /// Releasing idle connections ends their snapshots: the next look sees what was written
    /// meanwhile, and while a snapshot is kept a checkpoint cannot start the log over.
    #[test]
    fn releasing_idle_looks_ends_their_snapshots() {
        let (_dir, writer, looks, _stats) = setup();
        insert(&writer, "a");
        assert!(find(&looks, "a"));
        insert(&writer, "b");
        let truncate = |c: &rusqlite::Connection| -> i64 {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(truncate(&writer), 1, "busy while a look keeps its snapshot");
        looks.release_idle();
        assert_eq!(looks.open_snapshots(), 0);
        assert_eq!(truncate(&writer), 0);
        assert!(find(&looks, "b"));
    }

    /// A failed look leaves no transaction open behind it.
    #[test]
    fn a_failed_look_ends_its_transaction() {
        let (_dir, _writer, looks, _stats) = setup();
        let failed = looks.look(|c| c.query_row("SELECT * FROM missing", [], |_| Ok(())));
        assert!(failed.is_err());
        assert_eq!(looks.open_snapshots(), 0);
    }
}
