//! The embedded schema migrations and the pragmas every connection gets.

use rusqlite::limits::Limit;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::OpenError;
use crate::options::{Durability, Options};

/// One migration: SQL run as a batch, or a change SQL cannot state as a statement.
enum Step {
    Sql(&'static str),
    Code(fn(&Transaction<'_>) -> rusqlite::Result<()>),
}

/// Migrations in order; `oncebox_schema` records how many ran (`schema/version.rs`). Never
/// edit a released entry: append a new one.
const MIGRATIONS: &[Step] = &[
    Step::Sql(
        r#"
CREATE TABLE oncebox_inbox (
    id               INTEGER PRIMARY KEY,
    source           TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    fingerprint      BLOB NOT NULL,
    state            TEXT NOT NULL
                     CHECK (state IN ('processing', 'completed', 'rejected', 'stale', 'uncertain')),
    response         BLOB,
    payload          BLOB,
    received_at      INTEGER NOT NULL,
    completed_at     INTEGER,
    lease_token      INTEGER,
    lease_expires_at INTEGER,
    -- The key is two columns, never one concatenated string: (a:b, c) and (a, b:c) differ.
    UNIQUE (source, event_id)
);
CREATE TABLE oncebox_conflicts (
    id                  INTEGER PRIMARY KEY,
    source              TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    stored_fingerprint  BLOB NOT NULL,
    offered_fingerprint BLOB NOT NULL,
    payload             BLOB,
    at                  INTEGER NOT NULL
);
CREATE INDEX oncebox_conflicts_key ON oncebox_conflicts (source, event_id);
CREATE TABLE oncebox_actions (
    scope    TEXT NOT NULL,
    key      TEXT NOT NULL,
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    at       INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE TABLE oncebox_versions (
    entity    TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    version   INTEGER NOT NULL,
    source    TEXT NOT NULL,
    event_id  TEXT NOT NULL,
    PRIMARY KEY (entity, entity_id)
) WITHOUT ROWID;
CREATE TABLE oncebox_offsets (
    stream    TEXT NOT NULL,
    partition INTEGER NOT NULL,
    position  INTEGER NOT NULL,
    PRIMARY KEY (stream, partition)
) WITHOUT ROWID;
CREATE TABLE oncebox_outbox (
    id              INTEGER PRIMARY KEY,
    destination     TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    payload         BLOB NOT NULL,
    content_type    TEXT NOT NULL,
    source          TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    UNIQUE (destination, idempotency_key)
);
CREATE TABLE oncebox_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
-- The fencing-token counter only grows; tokens are never reused, even after a key is released.
INSERT INTO oncebox_meta (name, value) VALUES ('fence', 0);
"#,
    ),
    Step::Sql(
        r#"
-- How an event arrived: its content type and request headers ("name: value" lines).
ALTER TABLE oncebox_inbox ADD COLUMN content_type TEXT;
ALTER TABLE oncebox_inbox ADD COLUMN headers TEXT;
"#,
    ),
    Step::Sql(
        r#"
-- The relay's bookkeeping on each delivery (DESIGN §6): the fenced lease of the relay sending
-- it, the last attempt's result, an operator's note.
ALTER TABLE oncebox_outbox ADD COLUMN lease_token INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN last_status INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN last_error TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN note TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN delivered_at INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN updated_at INTEGER;
-- A claim reads each claimable state (pending, retrying, in_flight) as one range in
-- next_attempt_at order and stops at its limit, so it costs the same with a million delivered
-- rows as with none; the few in_flight rows are filtered on lease_expires_at. The counts per
-- state read this index only.
CREATE INDEX oncebox_outbox_due ON oncebox_outbox (state, next_attempt_at);
-- An event's deliveries (event page, operator replay).
CREATE INDEX oncebox_outbox_key ON oncebox_outbox (source, event_id);
CREATE TABLE oncebox_attempts (
    id          INTEGER PRIMARY KEY,
    delivery_id INTEGER NOT NULL REFERENCES oncebox_outbox (id) ON DELETE CASCADE,
    started_at  INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    status      INTEGER,
    error       TEXT
);
CREATE INDEX oncebox_attempts_delivery ON oncebox_attempts (delivery_id);
"#,
    ),
    Step::Code(plain_state_check),
    Step::Sql(
        r#"
-- Retention's record of the first purge on each boot of the machine (oncebox_core::BootAnchor):
-- a later purge on that boot, in any process, uses no later time than that purge's wall time
-- plus the boot time passed since, so a clock jump ahead and a restart purge nothing early.
CREATE TABLE oncebox_purge_anchors (
    boot  INTEGER PRIMARY KEY,
    wall  INTEGER NOT NULL,
    since INTEGER NOT NULL
);
"#,
    ),
    Step::Sql(CLEAR_ORPHANED_DELIVERIES),
    Step::Code(budget_columns),
    Step::Code(hops_column),
    Step::Code(plain_numeric_entities),
    Step::Code(ids_never_reused),
];

pub(crate) const VERSION: i64 = MIGRATIONS.len() as i64;
const _: () = assert!(version::READABLE_FROM <= VERSION);

fn sqlite_err(o: &Options) -> impl Fn(rusqlite::Error) -> OpenError + '_ {
    move |source| OpenError::Sqlite {
        path: o.path.display().to_string(),
        source,
    }
}

/// SQLite's `synchronous` level for a durability.
fn synchronous(d: Durability) -> &'static str {
    match d {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
}

/// Refuses a path SQLite would not open as a file of its own (`NotAFile`).
pub(crate) fn refuse_no_file(o: &Options) -> Result<(), OpenError> {
    let path = o.path.to_string_lossy();
    let why = if path.is_empty() {
        "an empty path is a temporary database, one per connection"
    } else if path == ":memory:" {
        "a database in memory, one per connection, gone at exit"
    } else if path.starts_with("file:") {
        "a URI, which may name a database in memory or open it with other options"
    } else {
        return Ok(());
    };
    Err(OpenError::NotAFile {
        path: path.into_owned(),
        why,
    })
}

/// Refuses a database file that is missing or empty beside a log that is not (`LostDatabase`).
/// A fresh inbox has neither; SQLite itself never leaves a log without its file.
pub(crate) fn refuse_lost_file(o: &Options) -> Result<(), OpenError> {
    let mut log = o.path.clone().into_os_string();
    log.push("-wal");
    let log_bytes = std::fs::metadata(&log).map_or(0, |m| m.len());
    let file_bytes = std::fs::metadata(&o.path).map_or(0, |m| m.len());
    if log_bytes > 0 && file_bytes == 0 {
        return Err(OpenError::LostDatabase {
            path: o.path.display().to_string(),
            log_bytes,
        });
    }
    Ok(())
}

/// Opens the writer connection: WAL, the chosen durability, foreign keys on (SQLite checks them
/// per connection, so every connection sets it), and the busy timeout.
pub(crate) fn open_writer(o: &Options) -> Result<Connection, OpenError> {
    crate::pcache::install();
    let err = sqlite_err(o);
    // The log's appends are gathered per commit only where every commit syncs it (walvfs.rs).
    let conn = if o.durability == Durability::Full && crate::walvfs::register() {
        Connection::open_with_flags_and_vfs(&o.path, OpenFlags::default(), crate::walvfs::NAME)
    } else {
        Connection::open(&o.path)
    }
    .map_err(&err)?;
    // A file this process may not write (its mode, an immutable attribute, a read-only mount)
    // opens read-only without a word, and a store on it would answer every event unavailable
    // while its readiness check, which writes nothing, said ready: refused here, by name.
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(OpenError::ReadOnly {
            path: o.path.display().to_string(),
        });
    }
    conn.busy_timeout(o.busy_timeout).map_err(&err)?;
    let sync = synchronous(o.durability);
    let settings = format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;
         PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = {};",
        crate::checkpoint::writer_fallback(o.wal_restart_frames)
    );
    until_not_busy(o, || conn.execute_batch(&settings)).map_err(&err)?;
    conn.set_prepared_statement_cache_capacity(256);
    if let Some(bytes) = o.length_limit {
        let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, bytes)
            .map_err(&err)?;
    }
    Ok(conn)
}

/// The longest string, BLOB or row `conn` stores: what SQLite was built with, or lower
/// (`Options::length_limit`). Read back rather than assumed, as SQLite caps what it is set to.
pub(crate) fn length_limit(conn: &Connection) -> usize {
    const BUILT: usize = 1_000_000_000;
    conn.limit(Limit::SQLITE_LIMIT_LENGTH)
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(BUILT)
}

/// How much of the database file a reader maps into memory: SQLite's compiled ceiling for
/// `mmap_size` (just under 2 GiB), the whole file for any inbox below that size.
///
/// Why: a duplicate is answered by a reader looking its key up, and with random keys over a
/// large inbox that look misses the reader's small page cache almost every time; each miss was
/// a `pread` system call, a 4 KiB copy and a cache slot recycled. Mapped, the page is read in
/// place from the OS page cache. Measured with the gateway benchmark (1 000 000 stored events,
/// duplicates only), request threads went from 32–35 to 24–26 µs of CPU per request. Pages
/// still in the WAL are read as before. The writer's reads go through its own 64 MiB cache,
/// and mapping its file did not measurably change its cost.
///
/// What mapping changes: an I/O error while reading a mapped page arrives as SIGBUS, which
/// ends the process, instead of as an error code. No answer is lost by that: nothing is
/// answered before its commit, and a sender's retry after the restart is deduplicated as
/// usual. A mapped file shrinking under a reader would fault the same way; oncebox never
/// shrinks it (no VACUUM, no auto-vacuum: purged rows leave free pages behind).
const READER_MMAP_BYTES: i64 = 0x7fff_0000;

/// Opens a connection for reads only. Readers are opened whenever the pool has none idle, long
/// after `open`: one must never create the file. Were the database file deleted or emptied
/// under a running store, a reader that created it anew would, at its first read, find an
/// empty database beside a log and delete the log (SQLite does so for an empty file), and the
/// next start would find nothing to refuse (`LostDatabase`) and begin an empty inbox, every
/// remembered key forgotten. So a reader refuses what `open` refuses, and never creates.
pub(crate) fn open_reader(o: &Options) -> Result<Connection, rusqlite::Error> {
    crate::pcache::install();
    if let Err(lost) = refuse_lost_file(o) {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(lost.to_string()),
        ));
    }
    let flags = OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE);
    let conn = Connection::open_with_flags(&o.path, flags)?;
    conn.busy_timeout(o.busy_timeout)?;
    conn.execute_batch("PRAGMA query_only = ON; PRAGMA foreign_keys = ON;")?;
    conn.pragma_update(None, "mmap_size", READER_MMAP_BYTES)?;
    Ok(conn)
}

/// Opens the checkpointer's connection; it syncs the database file as durably as the writer.
pub(crate) fn open_checkpointer(o: &Options) -> Result<Connection, OpenError> {
    crate::pcache::install();
    let err = sqlite_err(o);
    let conn = Connection::open(&o.path).map_err(&err)?;
    conn.busy_timeout(o.busy_timeout).map_err(&err)?;
    let sync = synchronous(o.durability);
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync}; PRAGMA wal_autocheckpoint = 0;"
    ))
    .map_err(&err)?;
    Ok(conn)
}

/// Opened without migrations, a missing file or an older schema is refused before anything
/// touches the path: `open_writer` already writes (it creates the file, sets the journal mode,
/// makes the log beside it). A file that cannot be read this way is left to the checks that
/// follow.
pub(crate) fn refuse_outdated(o: &Options) -> Result<(), OpenError> {
    if o.migrate {
        return Ok(());
    }
    if !o.path.exists() {
        return Err(OpenError::SchemaOutdated {
            found: 0,
            known: VERSION,
        });
    }
    let found = Connection::open_with_flags(&o.path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|c| version::found(&c));
    match found.map(Found::version) {
        Ok(found) if found < VERSION => Err(OpenError::SchemaOutdated {
            found,
            known: VERSION,
        }),
        _ => Ok(()),
    }
}

/// Brings the schema up to date. Runs under `BEGIN IMMEDIATE` and re-reads the version inside
/// it, so several processes opening one file at once apply each migration exactly once; the
/// steps, an earlier build's version adopted and the new version commit together or not at all.
pub(crate) fn migrate(conn: &mut Connection, o: &Options) -> Result<(), OpenError> {
    let err = sqlite_err(o);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&err)?;
    let kept = version::found(&tx).map_err(&err)?;
    let found = kept.version();
    if found > VERSION {
        // Run on unchanged where its build said it stays valid for this one.
        if version::readable_by(&tx, VERSION).map_err(&err)? {
            tracing::info!(
                found,
                known = VERSION,
                "schema of a later build, readable by this one"
            );
            return Ok(());
        }
        return Err(OpenError::SchemaTooNew {
            found,
            known: VERSION,
        });
    }
    if found < VERSION && !o.migrate {
        // Dropping the transaction rolls it back: nothing was written.
        return Err(OpenError::SchemaOutdated {
            found,
            known: VERSION,
        });
    }
    if kept == Found::Kept(VERSION) || !o.migrate {
        // Up to date (an earlier build's file too: adopted by the first open that migrates).
        return Ok(());
    }
    if let Found::Earlier(v) = kept {
        tracing::info!(
            version = v,
            "adopting the schema version an earlier build kept"
        );
    }
    let start = usize::try_from(found).unwrap_or(0);
    for step in &MIGRATIONS[start..] {
        match step {
            Step::Sql(sql) => tx.execute_batch(sql),
            Step::Code(change) => change(&tx),
        }
        .map_err(&err)?;
    }
    version::keep(&tx, VERSION).map_err(&err)?;
    tx.commit().map_err(&err)
}

mod busy;
mod ids;
mod steps;
mod version;
use busy::until_not_busy;
use ids::ids_never_reused;
use steps::{
    CLEAR_ORPHANED_DELIVERIES, STATE_IN, budget_columns, hops_column, plain_numeric_entities,
    plain_state_check,
};
use version::Found;

#[cfg(test)]
mod tests;
